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
//! **Blocking SQLite.** Each engine call (execute, confirm, query, snapshot,
//! open, recover) moves the actor's `Cell` into `tokio::task::spawn_blocking`
//! and back, except a light confirm and a warm Cell's short group, which
//! run on the actor's task (`actor/inline.rs`: the hand-offs were half of
//! a lone command's execute phase). Chosen over `block_in_place` (which panics on a current-thread
//! runtime and stalls the worker's other tasks) and over one OS thread per
//! open Cell (1,000 open Cells would be 1,000 threads). The hand-off costs
//! tens of microseconds; `runtime_bench` measured the execute phase at about
//! 1.3 ms mean under fleet load against ~50 ms of upload + CAS, and a single
//! submitter's command p50 at 1.05–1.6× the store's LTX PUT + CAS floor.
//!
//! **Measured** (`cargo run --release -p cellfleet-runtime --example
//! runtime_bench`, SeaweedFS on the same 2 shared cores, numbers vary ±30%
//! between runs): floor (LTX PUT + root CAS, sequential) p50 ≈ 3–5 ms; hot
//! Cell 1 submitter ≈ 170–250 commands/s, p50 1.05–1.6× floor; 16 submitters
//! ≈ 1,100–1,450/s; 64 submitters ≈ 3,600–4,700/s; 1,000 Cells uniform at 16
//! submitters ≈ 310–500/s (p99 68–105 ms) against a store floor of ≈ 830
//! publications/s at that concurrency — one CAS per Cell per publication is
//! the cliff DESIGN.md §9's node-level group commit addresses.
//!
//! *Invariant:* no reply to a command leaves an actor before the root that
//! contains its outcome was written (or proven written, after a lost reply).
//! *Invariant:* SQLite runs only on the blocking pool, never on async worker
//! threads.

pub mod accept;
pub mod activation;
pub mod actor;
mod config;
mod error;
mod kinds;
pub mod lease;
pub mod log;
mod metrics;
pub mod node;
pub mod publication;
mod replay;
/// Test support (feature `testkit`: for this workspace's tests and examples).
#[cfg(feature = "testkit")]
pub mod testkit;
pub mod watch;

pub use config::{GcSettings, LogSettings, NodeConfig, NodeLimits, PublicationMode};
pub use error::{Error, Result};
pub use kinds::{DuplicateKind, Kinds};
pub use metrics::{HistogramSnapshot, Metrics, Snapshot, EXPOSITION_CONTENT_TYPE};
pub use node::{CellDescription, Executed, Node, NodeHandle, Queried, Receipt, Resolution};
pub use publication::{PublishFailure, PublishRequest, Publisher, StorePublisher};
