//! Authority roots and node leases: versioned records, pure CAS transitions, fencing rules and lost-reply reconciliation.
//!
//! Two objects decide who may write a Cell (DESIGN.md §4–§5):
//!
//! * the **node lease** (`{prefix}/nodes/{node_id}.json`, [`LeaseRecord`]),
//!   renewed by CAS, which lets a node serve without reading the bucket while
//!   its local deadline holds ([`lease`], executed by [`NodeLeases`]);
//! * the **authority root** (`{prefix}/cells/{cell_id}/root.json`,
//!   [`RootRecord`]), replaced only by CAS, whose epoch fences stale owners
//!   ([`transition`] decides, [`Roots`] executes, [`reconcile`] settles lost
//!   replies).
//!
//! A third, `{prefix}/cluster.json` ([`ClusterRecord`]), is created once and
//! checked at every node start ([`cluster`]).
//!
//! Decisions are pure functions tested by property tests; the executors are
//! thin. Time comes from an injected [`Clock`].
//!
//! *Invariant:* this crate knows nothing about SQLite or the network beyond
//! the object store; it never deletes a root or a lease.

mod clock;
pub mod cluster;
mod error;
mod ids;
pub mod layout;
pub mod lease;
mod node_lease;
pub mod reconcile;
pub mod root;
mod roots;
pub mod transition;

pub use cellfleet_ltx::Txid;
pub use clock::{Clock, ManualClock, SystemClock};
pub use cluster::{check_cluster, ClusterCheck, ClusterRecord};
pub use error::{Error, Result};
pub use ids::{CellId, Epoch, IdError, NodeId, SessionId};
pub use layout::{LaneId, Layout, LtxKey, SegmentKey};
pub use lease::{Endpoints, LeaseConfig, LeaseRecord, LeaseState, Liveness};
pub use node_lease::{HeldLease, NodeLeases};
pub use reconcile::{reconcile, Reconciliation};
pub use root::{InvalidRecord, LogPointer, LtxRef, RootRecord, RootState};
pub use roots::{Activated, OwnedHow, Roots, Versioned, RESENDS_MAX};
pub use transition::{Activation, Holder, NewCell};
