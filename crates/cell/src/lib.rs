//! One Cell: SQLite engine, WAL capture to LTX, exactly-once outcome ledger,
//! recovery, compaction and kinds.

pub mod command;
mod error;
pub mod hex;
pub mod id;
pub mod kind;
pub mod kv;
pub mod manifest;
mod sql;
mod wal;

pub use command::{Command, CommandId, CommandResult, Outcome, RejectCode, Rejection, RAW_SQL};
pub use error::{Error, Result};
pub use id::CellId;
pub use kind::{Kind, KindError, Limits, RustKind, Typed};
pub use kv::Kv;
pub use manifest::Manifest;
