//! `cellfleet store probe` against the embedded local-directory store and a
//! real S3-compatible server (SeaweedFS, started by the repository's script
//! when no server is configured).

use std::process::{Command, Output};

use cellfleet_store::testkit;

fn probe(args: &[&str], env: &[(&str, String)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cellfleet"));
    command.args(["store", "probe"]).args(args);
    for name in [
        "CELLFLEET_S3_ENDPOINT",
        "CELLFLEET_S3_BUCKET",
        "CELLFLEET_S3_REGION",
        "CELLFLEET_S3_ACCESS_KEY",
        "CELLFLEET_S3_SECRET_KEY",
    ] {
        command.env_remove(name);
    }
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().expect("run cellfleet")
}

fn checks(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn assert_all_passed(report: &serde_json::Value) {
    assert_eq!(report["passed"], true, "{report:#}");
    let checks = report["checks"].as_array().unwrap();
    let names: Vec<&str> = checks
        .iter()
        .map(|c| c["check"].as_str().unwrap())
        .collect();
    for expected in [
        "reachable",
        "create-if-absent",
        "reject-existing",
        "read-after-write",
        "conditional-update",
        "reject-stale-etag",
        "range-read",
        "race-create",
        "race-update",
        "cleanup",
    ] {
        assert!(
            names.contains(&expected),
            "{expected} missing from {names:?}"
        );
    }
    assert!(
        checks.iter().all(|c| c["verdict"] == "passed"),
        "{report:#}"
    );
}

#[test]
fn local_directory_store_passes_and_is_left_clean() {
    let dir = tempfile::tempdir().unwrap();
    let out = probe(&["--dir", dir.path().to_str().unwrap(), "--json"], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_all_passed(&checks(&out));
    // The probe removes every object it wrote.
    let leftovers: Vec<_> = walk(dir.path())
        .into_iter()
        .filter(|p| p.to_string_lossy().contains(".probe") && p.is_file())
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        }
        out.push(path);
    }
    out
}

#[test]
fn seaweedfs_passes() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    // Starts the server if needed and creates the test bucket.
    runtime.block_on(testkit::s3_store());
    let config = testkit::s3_config(testkit::TEST_BUCKET);
    let env = [
        ("CELLFLEET_S3_ENDPOINT", config.endpoint.clone().unwrap()),
        ("CELLFLEET_S3_BUCKET", config.bucket.clone()),
        ("CELLFLEET_S3_REGION", config.region.clone().unwrap()),
        (
            "CELLFLEET_S3_ACCESS_KEY",
            config.access_key.clone().unwrap(),
        ),
        (
            "CELLFLEET_S3_SECRET_KEY",
            config.secret_key.clone().unwrap(),
        ),
    ];
    let prefix = testkit::unique_prefix("cli-probe");
    let out = probe(&["--json", "--prefix", &prefix], &env);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_all_passed(&checks(&out));
}

#[test]
fn unreachable_store_fails_naming_the_check() {
    let env = [
        ("CELLFLEET_S3_ENDPOINT", "http://127.0.0.1:9".to_string()),
        ("CELLFLEET_S3_BUCKET", "nowhere".to_string()),
        ("CELLFLEET_S3_ACCESS_KEY", "x".to_string()),
        ("CELLFLEET_S3_SECRET_KEY", "y".to_string()),
        ("CELLFLEET_S3_REGION", "us-east-1".to_string()),
    ];
    let out = probe(&[], &env);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("FAILED  reachable"), "{text}");
    assert!(text.contains("the store did not answer"), "{text}");
    assert!(
        text.contains("do not run a cluster on this store"),
        "{text}"
    );
}

#[test]
fn no_store_named_is_a_clear_error() {
    let out = probe(&[], &[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--dir DIR, or --bucket B"));
}
