//! The client config file (`client.toml`, as `cellfleet dev` writes it): where the nodes are, the TLS identity, the signing key.
//!
//! ```toml
//! endpoints = ["127.0.0.1:7001", "127.0.0.1:7002"]   # client listeners, tried in order
//! ca = "certs/ca.pem"
//! cert = "certs/client-dev.pem"
//! key = "certs/client-dev.key"
//! signing_key = "dev.ed25519.pem"
//! key_id = "dev"
//! window_ms = 60000      # validity window of signed requests
//! ```
//!
//! Relative paths are relative to the file's directory.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::Error;

/// The client config used when neither an explicit path nor
/// `CELLFLEET_CONFIG` is given.
pub const DEFAULT_CONFIG_PATH: &str = ".cellfleet-dev/client.toml";
/// The default validity window of signed requests.
pub const DEFAULT_WINDOW_MS: u64 = 60_000;

/// A client config file.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The nodes' client listeners (`host:port` or `https://host:port`),
    /// tried in order.
    pub endpoints: Vec<String>,
    /// The cluster CA certificate (PEM).
    pub ca: PathBuf,
    /// This client's certificate (PEM), issued by the cluster CA.
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// The Ed25519 signing key (PKCS#8 PEM) registered under `key_id`.
    pub signing_key: PathBuf,
    /// The id of the signing key in the nodes' key registry.
    pub key_id: String,
    /// Validity window of signed requests, in milliseconds.
    #[serde(default = "default_window_ms")]
    pub window_ms: u64,
}

fn default_window_ms() -> u64 {
    DEFAULT_WINDOW_MS
}

impl Config {
    /// Reads a client config; its relative paths become relative to its
    /// directory.
    ///
    /// ```no_run
    /// use cellfleet_client::{Client, Config};
    /// // --config, else $CELLFLEET_CONFIG, else .cellfleet-dev/client.toml
    /// let config = Config::read(&Config::path(None))?;
    /// let client = Client::from_config(&config)?;
    /// # let _ = client;
    /// # Ok::<(), cellfleet_client::Error>(())
    /// ```
    pub fn read(path: &Path) -> Result<Config, Error> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::Config(format!(
                "cannot read the client config {}: {e}; start a local cluster with \
                 `cellfleet dev`, or pass --config / set CELLFLEET_CONFIG",
                path.display()
            ))
        })?;
        Config::parse(&text, path.parent().unwrap_or(Path::new(".")))
            .map_err(|e| Error::Config(format!("{}: {e}", path.display())))
    }

    /// Parses config text; relative paths are taken relative to `base`.
    ///
    /// ```
    /// use std::path::Path;
    /// use cellfleet_client::Config;
    /// let text = r#"
    ///     endpoints = ["127.0.0.1:7001", "127.0.0.1:7002"]
    ///     ca = "certs/ca.pem"
    ///     cert = "certs/client-dev.pem"
    ///     key = "certs/client-dev.key"
    ///     signing_key = "dev.ed25519.pem"
    ///     key_id = "dev"
    /// "#;
    /// let config = Config::parse(text, Path::new("/srv/app")).unwrap();
    /// assert_eq!(config.ca, Path::new("/srv/app/certs/ca.pem"));
    /// assert_eq!(config.window_ms, 60_000);
    /// // A typo is an error naming it, not a silently ignored key.
    /// let typo = text.replace("key_id", "keyid");
    /// assert!(Config::parse(&typo, Path::new("/")).unwrap_err().contains("keyid"));
    /// ```
    pub fn parse(text: &str, base: &Path) -> Result<Config, String> {
        let mut config: Config = toml::from_str(text).map_err(|e| e.to_string())?;
        for path in [
            &mut config.ca,
            &mut config.cert,
            &mut config.key,
            &mut config.signing_key,
        ] {
            if path.is_relative() {
                *path = base.join(&*path);
            }
        }
        if config.endpoints.is_empty() {
            return Err("endpoints is empty; list the nodes' client addresses".into());
        }
        if config.window_ms == 0 {
            return Err("window_ms must be above 0".into());
        }
        Ok(config)
    }

    /// The config path to use: `explicit`, else `$CELLFLEET_CONFIG`, else
    /// [`DEFAULT_CONFIG_PATH`].
    pub fn path(explicit: Option<&Path>) -> PathBuf {
        explicit
            .map(Path::to_path_buf)
            .or_else(|| std::env::var_os("CELLFLEET_CONFIG").map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_PATH))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_follow_the_file_and_bad_configs_say_why() {
        let text = r#"
            endpoints = ["127.0.0.1:7001"]
            ca = "certs/ca.pem"
            cert = "/abs/client.pem"
            key = "certs/client.key"
            signing_key = "dev.ed25519.pem"
            key_id = "dev"
        "#;
        let config = Config::parse(text, Path::new("/data")).expect("parses");
        assert_eq!(config.ca, Path::new("/data/certs/ca.pem"));
        assert_eq!(config.cert, Path::new("/abs/client.pem"));
        assert_eq!(config.window_ms, DEFAULT_WINDOW_MS);
        let empty = text.replace(r#"["127.0.0.1:7001"]"#, "[]");
        assert!(Config::parse(&empty, Path::new("/"))
            .unwrap_err()
            .contains("endpoints is empty"));
        let unknown = format!("{text}\nextra = 1\n");
        assert!(Config::parse(&unknown, Path::new("/"))
            .unwrap_err()
            .contains("extra"));
    }
}
