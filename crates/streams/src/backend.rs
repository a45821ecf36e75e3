//! Where a stream's commands and queries run: [`LocalBackend`] runs them on this node's runtime (one node, the example server, tests); in a cluster the node binary supplies a backend that routes them to the stream's owner over the peer channel.
//!
//! The server talks to a backend only through [`StreamBackend::execute`]
//! and [`StreamBackend::query`]; errors come back as [`BackendError`],
//! which the server maps to HTTP statuses.

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use cellfleet_cell::{Command, Outcome};
use cellfleet_runtime::{Error as RuntimeError, NodeHandle};
use serde_json::Value;

/// The kinds whose commands and queries the streams server issues without
/// a signature (the Durable Streams protocol has none): streams, and the
/// subscription and registry Cells behind the `__ds` control paths. A
/// cluster node lets peers run unsigned node requests for exactly these
/// kinds; add a kind here only if any node may run any of its commands.
pub const ROUTED_KINDS: &[&str] = &[
    crate::kinds::stream::STREAM_KIND,
    crate::kinds::subscription::SUBSCRIPTION_KIND,
    crate::kinds::registry::REGISTRY_KIND,
];

/// The future a backend call returns.
pub type BackendFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, BackendError>> + Send + 'a>>;

/// Runs stream commands and queries somewhere in the cluster.
pub trait StreamBackend: Debug + Send + Sync + 'static {
    /// Executes `command` on Cell (`kind`, `key`); the outcome is returned
    /// only after the command's publication was acknowledged.
    fn execute<'a>(
        &'a self,
        kind: &'a str,
        key: &'a [u8],
        command: Command,
    ) -> BackendFuture<'a, Outcome>;

    /// Runs query `name` on Cell (`kind`, `key`) against published state.
    fn query<'a>(
        &'a self,
        kind: &'a str,
        key: &'a [u8],
        name: &'a str,
        args: Value,
    ) -> BackendFuture<'a, Value>;

    /// Waits until Cell (`kind`, `key`)'s acknowledged state is past TXID
    /// `after` (at most about `wait`) and returns its TXID then: `after`
    /// when nothing newer came in time. Live readers are woken this way
    /// whatever node the change came through. The default cannot watch
    /// (readers then fall back to their periodic re-check).
    fn watch<'a>(
        &'a self,
        kind: &'a str,
        key: &'a [u8],
        after: u64,
        wait: Duration,
    ) -> BackendFuture<'a, u64> {
        let _ = (kind, key, after, wait);
        Box::pin(async {
            Err(BackendError::Unavailable {
                message: "this backend cannot watch a Cell".into(),
                retry_after_ms: None,
            })
        })
    }

    /// Whether this node is the one that checks Cell (`kind`, `key`) in the
    /// periodic full sweep of subscriptions: one node per subscription in
    /// a cluster (a duplicate is harmless, the Cell decides every wake; a
    /// gap lasts until the live set settles). Alone, always.
    fn sweeps<'a>(&'a self, kind: &'a str, key: &'a [u8]) -> BackendFuture<'a, bool> {
        let _ = (kind, key);
        Box::pin(async { Ok(true) })
    }
}

/// Why a backend call failed.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// This node does not own the stream and cannot reach its owner.
    #[error("not the owner: {0}")]
    NotOwner(String),
    /// Not run; safe to retry (after `retry_after_ms` when given).
    #[error("unavailable: {message}")]
    Unavailable {
        /// What happened.
        message: String,
        /// When to retry, if known.
        retry_after_ms: Option<u64>,
    },
    /// A command may or may not have been applied (its owner stopped
    /// answering after it was sent).
    #[error("outcome unknown: {0}")]
    UnknownOutcome(String),
    /// The request itself is wrong.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// Anything else (a refused node request, a broken reply).
    #[error("internal: {0}")]
    Internal(String),
}

impl From<RuntimeError> for BackendError {
    fn from(error: RuntimeError) -> Self {
        match error {
            RuntimeError::NotOwner { .. } => BackendError::NotOwner(error.to_string()),
            RuntimeError::ResourceExhausted { retry_after_ms, .. } => BackendError::Unavailable {
                message: error.to_string(),
                retry_after_ms: Some(retry_after_ms),
            },
            RuntimeError::BadRequest(message) => BackendError::BadRequest(message),
            RuntimeError::Unknown { .. } => BackendError::UnknownOutcome(error.to_string()),
            other => BackendError::Unavailable {
                message: other.to_string(),
                retry_after_ms: None,
            },
        }
    }
}

/// Runs everything on this node's runtime (a non-owner answers NOT_OWNER).
#[derive(Clone, Debug)]
pub struct LocalBackend {
    node: NodeHandle,
}

impl LocalBackend {
    /// The backend over `node`.
    pub fn new(node: NodeHandle) -> Self {
        LocalBackend { node }
    }
}

impl StreamBackend for LocalBackend {
    fn execute<'a>(
        &'a self,
        kind: &'a str,
        key: &'a [u8],
        command: Command,
    ) -> BackendFuture<'a, Outcome> {
        Box::pin(async move {
            let executed = self.node.execute(kind, key, command).await?;
            Ok(executed.outcome)
        })
    }

    fn query<'a>(
        &'a self,
        kind: &'a str,
        key: &'a [u8],
        name: &'a str,
        args: Value,
    ) -> BackendFuture<'a, Value> {
        Box::pin(async move {
            let queried = self.node.query(kind, key, name, args, None).await?;
            Ok(queried.value)
        })
    }

    fn watch<'a>(
        &'a self,
        kind: &'a str,
        key: &'a [u8],
        after: u64,
        wait: Duration,
    ) -> BackendFuture<'a, u64> {
        Box::pin(async move {
            let seen = self
                .node
                .watch(kind, key, cellfleet_cell::Txid(after), wait)
                .await?;
            Ok(seen.0)
        })
    }
}
