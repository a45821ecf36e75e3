//! The Cellfleet client library: signed commands and queries over mutual TLS to any node of a cluster, exactly once.
//!
//! ```no_run
//! # async fn run() -> Result<(), cellfleet_client::Error> {
//! use cellfleet_client::{Client, Command, Config, Outcome, Query};
//!
//! // The client.toml that `cellfleet dev` writes (or `Client::builder`).
//! let client = Client::from_config(&Config::read(Config::path(None).as_ref())?)?;
//! let put = Command::new("kv", "user-1", "put")
//!     .args(serde_json::json!({"key": "name", "value": "Ada"}));
//! let executed = client.execute(&put).await?;
//! match &executed.outcome {
//!     Outcome::Applied(result) => println!("applied: {result}"),
//!     Outcome::Rejected(why) => println!("rejected ({:?}): {}", why.code, why.message),
//! }
//! let read = Query::new("kv", "user-1", "get").args(serde_json::json!({"key": "name"}));
//! let read = match &executed.receipt {
//!     Some(receipt) => read.after(receipt), // read-your-writes
//!     None => read,
//! };
//! println!("{}", client.query(&read).await?.value);
//! # Ok(()) }
//! ```
//!
//! What it does for you:
//! - **Signing** ([`signing`]): every request is an Ed25519-signed envelope
//!   under its call's domain tag, valid for the client's window.
//! - **Exactly-once retries** ([`retry`]): a command is retried with the
//!   same signed bytes (the same command id) on every failure that is safe
//!   to retry; if its fate is still in doubt when the budget runs out it is
//!   resolved, and the answer is its outcome or [`Error::UnknownOutcome`],
//!   never a second execution.
//! - **Owner-aware routing**: each response names the node that owns the
//!   Cell; the next request for that Cell goes straight there (a bounded
//!   cache), skipping the forwarding hop, and falls back to the configured
//!   nodes when the owner moves or fails.
//! - **Typed errors** ([`Error`]) mirroring `errors.proto`: the wire code,
//!   whether a retry is safe, how long to wait, where the owner is.
//!
//! Code map: [`config`] the client file; [`tls`] the mTLS client side;
//! [`transport`] channels whose connect failures are typed; [`error`];
//! [`retry`] the pure retry rule; [`Client`] in `client.rs`.

#![warn(missing_docs)]

mod client;
pub mod config;
pub mod error;
pub mod retry;
pub mod signing;
pub mod tls;
pub mod transport;

pub use cellfleet_proto::v1;
pub use client::{
    now_ms, Builder, Client, Command, Executed, Outcome, Queried, Query, Rejection, Resolved,
    CONNECT_TIMEOUT, DRAIN_TIMEOUT, OWNER_CACHE_DEFAULT, RESPONSE_BYTES_DEFAULT,
};
pub use config::Config;
pub use error::{Error, OwnerHint, Transport};
pub use retry::RetryPolicy;

/// Proof of a committed command (Cell, epoch, TXID), usable as a
/// read-your-writes fence ([`Query::after`]).
pub type Receipt = v1::Receipt;

/// The 16 bytes that name a command for exactly-once execution. Printed
/// and parsed as 32 lowercase hex digits.
///
/// ```
/// use cellfleet_client::CommandId;
/// let id: CommandId = "000102030405060708090a0b0c0d0e0f".parse().unwrap();
/// assert_eq!(id.to_string(), "000102030405060708090a0b0c0d0e0f");
/// assert!("xyz".parse::<CommandId>().is_err());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CommandId(pub [u8; 16]);

impl CommandId {
    /// A fresh random id.
    pub fn random() -> Self {
        CommandId(rand::random())
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl std::fmt::Display for CommandId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for CommandId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CommandId({self})")
    }
}

impl std::str::FromStr for CommandId {
    type Err = String;

    /// 32 hex digits.
    fn from_str(text: &str) -> Result<Self, String> {
        let bad = || {
            format!("command id {text:?} must be 32 hex digits (as printed by `cellfleet exec`)")
        };
        if text.len() != 32 || !text.is_ascii() {
            return Err(bad());
        }
        let mut bytes = [0u8; 16];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(CommandId(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Ids print and parse back; any other text is refused, never a panic.
        #[test]
        fn ids_round_trip_and_bad_text_is_refused(bytes in proptest::prelude::any::<[u8; 16]>(), text in ".{0,40}") {
            let id = CommandId(bytes);
            proptest::prop_assert_eq!(id.to_string().parse::<CommandId>(), Ok(id));
            if let Ok(parsed) = text.parse::<CommandId>() {
                proptest::prop_assert_eq!(parsed.to_string(), text.to_ascii_lowercase());
            }
        }
    }
}
