//! Test support: a real SeaweedFS-backed S3 store for tests, started by the repository's own script when needed.
//!
//! If `CELLFLEET_S3_ENDPOINT` is set, tests use that server (with the other
//! `CELLFLEET_S3_*` variables). Otherwise the first test that asks runs
//! `scripts/seaweedfs.sh start` (once per process, and under a file lock so
//! parallel test binaries do not race) and uses the environment it prints.
//! There is no silent skip: if no server can be had, the test panics saying
//! why. Each test gets a unique key prefix in the shared test bucket.

use std::fs::OpenOptions;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, OnceLock};

use crate::config::{S3Config, ENV_ACCESS_KEY, ENV_ENDPOINT, ENV_REGION, ENV_SECRET_KEY};
use crate::S3Store;

/// The bucket every test shares (tests separate themselves by prefix).
pub const TEST_BUCKET: &str = "cellfleet-test";

/// What `scripts/seaweedfs.sh start` printed (its `export` lines).
static SERVER_EXPORTS: OnceLock<String> = OnceLock::new();

fn script_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/seaweedfs.sh")
}

fn start_server() -> String {
    let lock_path = std::env::temp_dir().join("cellfleet-seaweedfs-harness.lock");
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", lock_path.display()));
    lock.lock()
        .unwrap_or_else(|e| panic!("cannot lock {}: {e}", lock_path.display()));
    let script = script_path();
    let output = Command::new("bash")
        .arg(&script)
        .arg("start")
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "S3 tests need a SeaweedFS server and could not run {}: {e}; \
                 start one with `scripts/seaweedfs.sh start` or set {ENV_ENDPOINT}",
                script.display()
            )
        });
    drop(lock);
    if !output.status.success() {
        panic!(
            "S3 tests need a SeaweedFS server, but `{} start` failed ({}):\n{}\n\
             set {ENV_ENDPOINT} (and {ENV_ACCESS_KEY}, {ENV_SECRET_KEY}) to use another server",
            script.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The S3 settings of the test server (starting it if needed), for `bucket`.
pub fn s3_config(bucket: &str) -> S3Config {
    if std::env::var(ENV_ENDPOINT).is_ok_and(|value| !value.is_empty()) {
        return S3Config::from_env(bucket);
    }
    let exports = SERVER_EXPORTS.get_or_init(start_server);
    let config = S3Config::from_shell_exports(bucket, exports);
    for (name, value) in [
        (ENV_ENDPOINT, &config.endpoint),
        (ENV_REGION, &config.region),
        (ENV_ACCESS_KEY, &config.access_key),
        (ENV_SECRET_KEY, &config.secret_key),
    ] {
        assert!(
            value.is_some(),
            "scripts/seaweedfs.sh start did not print {name}; it printed:\n{exports}"
        );
    }
    config
}

/// A connected store on the test server's [`TEST_BUCKET`] (created if
/// missing). Panics with the reason if no server can be reached.
pub async fn s3_store() -> Arc<S3Store> {
    let config = s3_config(TEST_BUCKET);
    let store = S3Store::connect(&config)
        .await
        .unwrap_or_else(|e| panic!("cannot configure the test S3 client: {e}"));
    store.create_bucket_if_missing().await.unwrap_or_else(|e| {
        panic!(
            "cannot create test bucket {TEST_BUCKET} at {:?}: {e}",
            config.endpoint
        )
    });
    Arc::new(store)
}

/// A key prefix no other test (or run) uses: `t/{name}-{random}`.
pub fn unique_prefix(name: &str) -> String {
    format!("t/{name}-{:016x}", rand::random::<u64>())
}

/// The two backends every multi-process test runs on, each with a prefix
/// of its own: the local-directory store under `dir/bucket` (prefix
/// `{name}-local`) and the test SeaweedFS ([`unique_prefix`]).
pub async fn local_and_s3(
    name: &str,
    dir: &std::path::Path,
) -> Vec<(&'static str, Arc<dyn crate::ObjectStore>, String)> {
    let local: Arc<dyn crate::ObjectStore> =
        Arc::new(crate::LocalStore::open(dir.join("bucket")).expect("local store"));
    let s3: Arc<dyn crate::ObjectStore> = s3_store().await;
    vec![
        ("local", local, format!("{name}-local")),
        ("s3", s3, unique_prefix(name)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exports_are_parsed() {
        let config = S3Config::from_shell_exports(
            "b",
            "export CELLFLEET_S3_ENDPOINT=http://127.0.0.1:8333\nnoise\nexport CELLFLEET_S3_REGION=\"us east\"\n",
        );
        assert_eq!(config.endpoint.as_deref(), Some("http://127.0.0.1:8333"));
        assert_eq!(config.region.as_deref(), Some("us east"));
        assert_eq!(config.access_key, None);
        assert!(config.path_style, "on with an endpoint");
    }
}
