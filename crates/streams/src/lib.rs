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

// Handlers return a ready HTTP response as their error value; it is built
// once per request, so its size does not matter.
#![allow(clippy::result_large_err)]

pub mod backend;
pub mod kind;
pub mod notify;
pub mod offset;
pub mod server;
pub mod settle;
pub mod subscription_kind;
pub mod subscriptions;
pub mod webhook;

pub use backend::{BackendError, BackendFuture, LocalBackend, StreamBackend, ROUTED_KINDS};
pub use kind::{StreamKind, STREAM_KIND};
pub use server::{Streams, StreamsConfig};
pub use subscription_kind::{RegistryKind, SubscriptionKind, REGISTRY_KIND, SUBSCRIPTION_KIND};

/// `kinds` plus the kinds the streams service runs on: `stream`,
/// `ds_subscription` and `ds_registry` (every node serving streams
/// registers all three; [`ROUTED_KINDS`] names the same set).
pub fn with_kinds(kinds: cellfleet_runtime::Kinds) -> cellfleet_runtime::Kinds {
    use std::sync::Arc;
    kinds
        .with(Arc::new(cellfleet_cell::Typed(StreamKind)))
        .with(Arc::new(cellfleet_cell::Typed(SubscriptionKind)))
        .with(Arc::new(cellfleet_cell::Typed(RegistryKind)))
}
