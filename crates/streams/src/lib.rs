//! The Durable Streams HTTP protocol served from Cells of kind `stream`.
//!
//! Each stream (addressed by its URL path) is one Cell of the built-in
//! [`StreamKind`]; its bytes, offsets, producers, TTL and closed flag live
//! in the Cell's SQLite tables and become durable through the runtime's
//! publication path. An append is acknowledged only after `execute`
//! returned (after the root CAS); reads are runtime queries and therefore
//! only ever see published data.
//!
//! *Invariant:* the server never answers a mutation before the runtime did.

pub mod auth;
pub mod backend;
pub mod clock;
pub mod kinds;
pub mod notify;
pub mod offset;
pub mod server;
pub mod settle;
mod tail;
pub mod token;
pub mod webhook;

pub use auth::StreamsAuth;
pub use backend::{BackendError, BackendFuture, LocalBackend, StreamBackend, ROUTED_KINDS};
pub use kinds::registry::{RegistryKind, REGISTRY_KIND};
pub use kinds::stream::{StreamKind, STREAM_KIND};
pub use kinds::subscription::{SubscriptionKind, SUBSCRIPTION_KIND};
pub use server::{Streams, StreamsConfig};

/// `kinds` plus the kinds the streams service runs on: `stream`,
/// `ds_subscription` and `ds_registry` (every node serving streams
/// registers all three; [`ROUTED_KINDS`] names the same set). Refused if
/// `kinds` (a manifest) already uses one of those names.
pub fn with_kinds(
    kinds: cellfleet_runtime::Kinds,
) -> Result<cellfleet_runtime::Kinds, cellfleet_runtime::DuplicateKind> {
    use std::sync::Arc;
    kinds
        .try_with(Arc::new(cellfleet_cell::Typed(StreamKind)))?
        .try_with(Arc::new(cellfleet_cell::Typed(SubscriptionKind)))?
        .try_with(Arc::new(cellfleet_cell::Typed(RegistryKind)))
}

#[cfg(test)]
mod tests {
    /// A manifest kind named like a streams kind is refused, whichever it is.
    #[test]
    fn a_manifest_kind_cannot_take_a_streams_kind_s_name() {
        for name in crate::ROUTED_KINDS {
            let text = format!("[kinds.{name}]\nmigrations = [\"CREATE TABLE t (x)\"]\n");
            let manifest = cellfleet_cell::Manifest::parse(&text).unwrap();
            let kinds = cellfleet_runtime::Kinds::from_manifest(&manifest).unwrap();
            let error = super::with_kinds(kinds).unwrap_err();
            assert_eq!(error.name, *name);
        }
        assert!(super::with_kinds(cellfleet_runtime::Kinds::builtin()).is_ok());
    }
}
