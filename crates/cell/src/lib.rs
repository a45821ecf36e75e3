//! One Cell: SQLite engine, WAL capture to LTX, exactly-once outcome ledger,
//! recovery, compaction and kinds.

mod capture;
mod cell;
pub mod command;
mod compaction;
mod connection;
mod error;
mod guard;
pub mod hex;
pub mod kind;
pub mod kv;
mod ledger;
mod live;
pub mod manifest;
mod reader;
mod recovery;
pub mod replica;
mod sql;
mod template;
mod wal;

pub use capture::Publication;
pub use cell::{tidy_closed, CaptureStats, Cell, CellConfig, GroupResult, Opened, QueryAnswer};
pub use cellfleet_ltx::{Checksum, Header, Position, Trailer, Txid};
pub use cellfleet_vfs::{memory_statistics_off, memory_statistics_on};
pub use command::{Command, CommandId, CommandResult, Outcome, RejectCode, Rejection, RAW_SQL};
pub use compaction::{compact, Compaction};
pub use error::{Error, Result};
pub use kind::{Kind, KindError, Limits, RustKind, Typed};
pub use kv::Kv;
pub use manifest::Manifest;
pub use recovery::{recover, ChainFile};
pub use sql::payload_bytes;

/// The website's embedding guide, compiled and run as a doc-test so its
/// Rust snippets stay true.
#[cfg(doctest)]
#[doc = include_str!("../../../website/guide/embedding.md")]
pub struct WebsiteEmbeddingGuide;
