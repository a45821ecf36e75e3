//! Store configuration (TOML/env friendly) and [`open`], which builds the configured backend.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::retry::{RetryPolicy, RetryStore};
use crate::{LocalStore, MemoryStore, ObjectStore, S3Store};

/// Environment variable naming the S3 endpoint URL (`http://127.0.0.1:8333`).
pub const ENV_ENDPOINT: &str = "CELLFLEET_S3_ENDPOINT";
/// Environment variable naming the S3 region.
pub const ENV_REGION: &str = "CELLFLEET_S3_REGION";
/// Environment variable holding the S3 access key id.
pub const ENV_ACCESS_KEY: &str = "CELLFLEET_S3_ACCESS_KEY";
/// Environment variable holding the S3 secret key.
pub const ENV_SECRET_KEY: &str = "CELLFLEET_S3_SECRET_KEY";
/// Environment variable choosing path-style addressing (`true`/`false`).
pub const ENV_PATH_STYLE: &str = "CELLFLEET_S3_PATH_STYLE";

/// Settings of an S3 (or S3-compatible) bucket.
#[derive(Clone, PartialEq, Eq)]
pub struct S3Config {
    /// The bucket.
    pub bucket: String,
    /// Endpoint URL for S3-compatible servers; `None` for AWS S3.
    pub endpoint: Option<String>,
    /// Region; `None` takes the AWS chain's region, else `us-east-1`.
    pub region: Option<String>,
    /// Path-style addressing (`endpoint/bucket/key`), needed by most
    /// self-hosted servers.
    pub path_style: bool,
    /// Static access key id; `None` (with `secret_key`) uses the standard
    /// AWS environment/profile chain.
    pub access_key: Option<String>,
    /// Static secret key.
    pub secret_key: Option<String>,
    /// TCP connect timeout.
    pub connect_timeout: Duration,
    /// Timeout of one request attempt.
    pub request_timeout: Duration,
    /// Bodies at least this large are uploaded in parts.
    pub multipart_threshold_bytes: usize,
    /// Part size of multipart uploads (at least 5 MiB, S3's minimum).
    pub multipart_part_bytes: usize,
    /// Retries of transient failures.
    pub retry: RetryPolicy,
}

impl S3Config {
    /// Defaults for `bucket`: AWS chain credentials and region, virtual-host
    /// addressing, 3 s connect / 10 s request timeouts, multipart from 16 MiB
    /// in 8 MiB parts, [`RetryPolicy::default`].
    pub fn new(bucket: impl Into<String>) -> Self {
        Self {
            bucket: bucket.into(),
            endpoint: None,
            region: None,
            path_style: false,
            access_key: None,
            secret_key: None,
            connect_timeout: Duration::from_secs(3),
            request_timeout: Duration::from_secs(10),
            multipart_threshold_bytes: 16 * 1024 * 1024,
            multipart_part_bytes: 8 * 1024 * 1024,
            retry: RetryPolicy::default(),
        }
    }

    /// [`S3Config::new`] overridden by `CELLFLEET_S3_ENDPOINT`, `_REGION`,
    /// `_ACCESS_KEY`, `_SECRET_KEY` and `_PATH_STYLE` (path style defaults to
    /// on when an endpoint is set).
    pub fn from_env(bucket: impl Into<String>) -> Self {
        Self::from_vars(bucket, |name| std::env::var(name).ok())
    }

    /// As [`S3Config::from_env`], from the `export NAME=value` lines a
    /// shell script prints (what `scripts/seaweedfs.sh start` prints);
    /// other lines are ignored.
    pub fn from_shell_exports(bucket: impl Into<String>, text: &str) -> Self {
        let exports: std::collections::HashMap<&str, &str> = text
            .lines()
            .filter_map(|line| line.trim().strip_prefix("export "))
            .filter_map(|assignment| assignment.split_once('='))
            .map(|(name, value)| (name, value.trim_matches('"')))
            .collect();
        Self::from_vars(bucket, |name| exports.get(name).map(|v| (*v).to_owned()))
    }

    /// [`S3Config::new`] overridden by the `CELLFLEET_S3_*` values `var`
    /// finds (an empty value counts as unset).
    pub fn from_vars(bucket: impl Into<String>, var: impl Fn(&str) -> Option<String>) -> Self {
        let var = |name: &str| var(name).filter(|value| !value.is_empty());
        let mut config = Self::new(bucket);
        config.endpoint = var(ENV_ENDPOINT);
        config.region = var(ENV_REGION);
        config.access_key = var(ENV_ACCESS_KEY);
        config.secret_key = var(ENV_SECRET_KEY);
        config.path_style = match var(ENV_PATH_STYLE).as_deref() {
            Some("true" | "1") => true,
            Some(_) => false,
            None => config.endpoint.is_some(),
        };
        config
    }
}

impl fmt::Debug for S3Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Config")
            .field("bucket", &self.bucket)
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("path_style", &self.path_style)
            .field("access_key", &self.access_key)
            .field(
                "secret_key",
                &self.secret_key.as_ref().map(|_| "<redacted>"),
            )
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("multipart_threshold_bytes", &self.multipart_threshold_bytes)
            .field("multipart_part_bytes", &self.multipart_part_bytes)
            .field("retry", &self.retry)
            .finish()
    }
}

/// Which object store to use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreConfig {
    /// The embedded local-directory store (the default of `cellfleet dev`).
    Local {
        /// The store's directory; processes sharing it share the store.
        dir: PathBuf,
    },
    /// An S3 bucket.
    S3(S3Config),
    /// In memory, this process only (tests).
    Memory,
}

/// Opens the configured store. S3 stores come wrapped in a [`RetryStore`]
/// with the configured policy; the local and memory stores have no
/// transient failures to retry.
pub async fn open(config: &StoreConfig) -> Result<Arc<dyn ObjectStore>> {
    Ok(match config {
        StoreConfig::Local { dir } => Arc::new(LocalStore::open(dir)?),
        StoreConfig::Memory => Arc::new(MemoryStore::new()),
        StoreConfig::S3(s3) => {
            if s3.bucket.is_empty() {
                return Err(Error::Config("the S3 bucket name is empty".to_owned()));
            }
            let store = S3Store::connect(s3).await?;
            Arc::new(RetryStore::new(Arc::new(store), s3.retry.clone()))
        }
    })
}
