//! The node log (DESIGN.md §9): a node session's lanes of create-only segments, each holding many Cells' groups, fenced by seals.
//!
//! This crate is the log's pure core, with no I/O: [`segment`] encodes and
//! decodes the objects (bounded and checksummed, safe on untrusted bytes),
//! [`chunk`] the chunk indexes that let a successor read a lane's index in
//! a few GETs,
//! [`batch`] decides when a lane writes its next segment, [`lane`] decides which groups a lane's segment outcomes acknowledge, and
//! [`seal`] decides how a successor ends a dead session's lane. [`store`]
//! holds the thin async shells that perform those decisions against the
//! object store: a lane writer, a sealer and a reader.

pub mod batch;
pub mod chunk;
pub mod lane;
pub mod seal;
pub mod segment;
pub mod store;

pub use segment::{Entry, Error, Seal, Segment, SegmentHeader, Slot};
