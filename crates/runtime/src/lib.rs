//! Per-node actor runtime: dispatcher, admission, activation, group-commit publication with one fenced CAS, leases, passivation, drain.
//!
//! A [`Node`] owns one node lease and a set of Cell actors. Requests enter
//! through a cheap, cloneable [`NodeHandle`]:
//!
//! 1. **Admission** ([`node`]): refused at once while draining or after the
//!    lease was replaced; when nothing is active or activating the Cell map
//!    lookup is skipped (empty-ingress fast path). A live lease lets a warm
//!    Cell serve with zero bucket reads; a self-fenced node (local deadline
//!    passed) re-proves ownership with one root read per request.
//! 2. **Activation** ([`activation`]): create, adopt or take over the root
//!    through the authority, then (winners only) download the chain,
//!    rebuild the SQLite file and verify its rolling checksum before serving.
//! 3. **The Cell actor** ([`actor`]): one bounded mailbox per Cell, drained
//!    into groups, executed, then published through the [`Publisher`]
//!    interface ([`publication`]): upload the LTX (create-only), CAS the
//!    root, and only then release replies, in commit order.
//! 4. **Passivation and drain** close Cells (LRU under limits) and release
//!    roots and the lease.
//!
//! *Invariant:* no reply to a command leaves an actor before the root that
//! contains its outcome was written (or proven written, after a lost reply).
//! *Invariant:* SQLite runs only on the blocking pool, never on async worker
//! threads.

pub mod activation;
pub mod actor;
mod config;
mod error;
mod kinds;
pub mod lease;
mod metrics;
pub mod node;
pub mod publication;
pub mod testkit;

pub use config::{NodeConfig, NodeLimits};
pub use error::{Error, Result};
pub use kinds::Kinds;
pub use metrics::Metrics;
pub use node::{CellDescription, Executed, Node, NodeHandle, Receipt, Resolution};
pub use publication::{PublishFailure, PublishRequest, Publisher, StorePublisher};
