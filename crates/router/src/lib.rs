//! Ingress of a Cellfleet node: mutual TLS, cluster certificates, signed envelopes, the key registry, the error-to-status table, owner hints and placement.
//!
//! Code map (one file per concept):
//! - [`certs`]: the cluster CA; issuing node and client certificates (role in the SAN URI).
//! - [`tls`]: rustls server/client configurations with the role rule; [`transport`]: TLS listeners and channels for tonic.
//! - [`signing`]: Ed25519 under domain tags, key files; [`registry`]: key id → public key and grants.
//! - [`envelope`]: the ingress checks of a signed envelope (signature, window, authorization).
//! - [`status`]: the one table from [`Error`] to gRPC status, wire code and retry hint.
//! - [`hints`]: the bounded owner-hint cache and rendezvous placement.
//! - [`reflection`]: gRPC server reflection.
//! - [`endpoints`]: a node's client, peer and HTTP URLs for its lease record.
//! - [`forward`]: routing at the ingress (hints, placement, forwarding, one retry); [`local`]: running on this node's runtime.
//! - [`service_client`], [`service_peer`], [`service_admin`]: the gRPC services; [`server`]: the listeners; [`http`]: metrics and health; [`stats`]: every node's metrics for operators; [`console`]: the web console.
//!
//! *Invariant:* nothing in this crate decodes a request body before its
//! signature verified over the exact received bytes, and nothing that
//! fails a check reaches a Cell. The one unsigned path, a node's own
//! NodeCommand/NodeQuery, is accepted from node certificates only and only
//! for the router's node kinds ([`forward::Router::with_node_kinds`]).

pub mod certs;
pub mod console;
pub mod endpoints;
pub mod envelope;
pub mod error;
pub mod forward;
pub mod hints;
pub mod http;
pub mod local;
pub mod reflection;
pub mod registry;
pub mod server;
pub mod service_admin;
pub mod service_client;
pub mod service_peer;
pub mod signing;
pub mod stats;
pub mod status;
pub mod tls;
pub mod transport;

pub use error::{Error, OwnerHint, Result};
