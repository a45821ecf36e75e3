//! Typed errors of the Cell engine; a command's own failure is a
//! [`crate::Rejection`] recorded in the ledger, not an `Error`.

use cellfleet_ltx::{Position, Txid};

/// An error opening, executing, capturing, recovering or compacting a Cell.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("sqlite error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}: this build of SQLite cannot open Cells")]
    Vfs(#[from] cellfleet_vfs::RegisterError),
    #[error("ltx error: {0}")]
    Ltx(#[from] cellfleet_ltx::Error),
    #[error("invalid kinds manifest: {0}")]
    Manifest(String),
    #[error("unknown kind {0:?}")]
    UnknownKind(String),
    #[error("unknown query {0:?}")]
    UnknownQuery(String),
    #[error("bad parameters: {0}")]
    BadParameters(String),
    #[error("bad sql: {0}")]
    BadSql(String),
    #[error("{what} of {actual} exceeds the limit of {limit}")]
    LimitExceeded {
        what: &'static str,
        actual: u64,
        limit: u64,
    },
    #[error("raw sql is not enabled for kind {0:?}")]
    RawSqlDisabled(String),
    #[error("a publication (txid {0}) is pending: confirm or abort it first")]
    PublicationPending(Txid),
    #[error("no publication is pending")]
    NoPendingPublication,
    #[error(
        "publications are confirmed in txid order: got txid {got}, but the oldest pending is txid {pending}"
    )]
    WrongPublication { got: Txid, pending: Txid },
    #[error(
        "{pending} publications are pending, the most allowed: confirm txid {oldest} (or abort) first"
    )]
    PipelineFull { oldest: Txid, pending: usize },
    #[error(
        "the wal holds {wal_bytes} bytes and must be checkpointed: confirm the pending \
         publications (oldest txid {oldest}) before executing more"
    )]
    CheckpointDue { oldest: Txid, wal_bytes: u64 },
    #[error(
        "queries are refused until no publication is pending: the read snapshot of the \
         published txid {published} was lost (pending: {pending:?})"
    )]
    PublishedViewLost {
        published: Txid,
        pending: Option<Txid>,
    },
    #[error(
        "the cell has no reader of its published txid {published} while txid {pending} is \
         pending (a cell opens its reader on its first query): ask again once the pending \
         publication is confirmed or aborted"
    )]
    ViewPending { published: Txid, pending: Txid },
    #[error(
        "the local database is at {found:?}, not at the published position {expected:?}: \
         recover it from the published chain"
    )]
    NotAtPosition { found: Position, expected: Position },
    #[error("the local database does not exist and the published position is {0:?}: recover it from the published chain")]
    Missing(Position),
    #[error(
        "the cell database {0} is open in another engine or process; close it first \
         (a node's Cells: stop the node, or read them with `cellfleet store export`)"
    )]
    Live(String),
    #[error("wal is corrupt: {0}")]
    Wal(String),
    #[error(
        "applied migrations disagree with the kind: migration {index} was applied with a different digest; \
         migrations may only be appended"
    )]
    MigrationChanged { index: usize },
    #[error("the cell has {applied} migrations applied but the kind declares only {declared}")]
    MigrationsAhead { applied: usize, declared: usize },
    #[error(
        "recovery: after the file ending at txid {txid} the database is at {found:?}, \
         not at the recorded {expected:?}"
    )]
    ChainMismatch {
        txid: Txid,
        expected: Position,
        found: Position,
    },
    #[error("recovery: {0}")]
    Recovery(String),
    #[error("rejected ({:?}): {}", .0.code, .0.message)]
    Rejected(crate::Rejection),
    #[error("txid overflow")]
    TxidOverflow,
    #[error("the cell is poisoned by an earlier failure and must be reopened or recovered")]
    Poisoned,
    #[error(
        "cannot open {path}: the process is at its open-file limit; retry once other Cells \
         close, or raise the limit (`ulimit -n`) or lower the open-Cell bound"
    )]
    OutOfFiles { path: String },
}

impl Error {
    /// Whether the request itself is at fault (an unknown query, bad
    /// parameters or SQL, a limit, raw SQL not enabled, a rejection): the
    /// caller must change it, and the engine is fine.
    pub fn is_request_error(&self) -> bool {
        matches!(
            self,
            Error::UnknownKind(_)
                | Error::UnknownQuery(_)
                | Error::BadParameters(_)
                | Error::BadSql(_)
                | Error::LimitExceeded { .. }
                | Error::RawSqlDisabled(_)
                | Error::Rejected(_)
        )
    }

    /// Whether the process ran out of file descriptors: the file itself is
    /// fine, so it must not be rebuilt; wait for descriptors instead.
    pub fn is_out_of_files(&self) -> bool {
        matches!(self, Error::OutOfFiles { .. })
    }

    /// Whether the disk holding the Cell's files is full (SQLite's
    /// `SQLITE_FULL`, or `ENOSPC` from a file the engine writes itself):
    /// nothing of the call was committed, and it may succeed once space is
    /// freed.
    pub fn is_disk_full(&self) -> bool {
        match self {
            Error::Sqlite(rusqlite::Error::SqliteFailure(e, _)) => {
                e.code == rusqlite::ErrorCode::DiskFull
            }
            Error::Io(e) => e.kind() == std::io::ErrorKind::StorageFull,
            _ => false,
        }
    }

    /// Whether the same call may succeed if tried again unchanged.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Io(_) | Error::OutOfFiles { .. } | Error::ViewPending { .. } => true,
            Error::Ltx(e) => e.is_retryable(),
            Error::Sqlite(rusqlite::Error::SqliteFailure(e, _)) => matches!(
                e.code,
                rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
            ),
            _ => false,
        }
    }
}

/// Result with the Cell [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::Error;

    #[test]
    fn a_full_disk_is_told_apart_from_other_failures() {
        let full = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
            None,
        );
        assert!(Error::Sqlite(full).is_disk_full());
        assert!(Error::Io(std::io::ErrorKind::StorageFull.into()).is_disk_full());
        let busy = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
            None,
        );
        assert!(!Error::Sqlite(busy).is_disk_full());
        assert!(!Error::Io(std::io::ErrorKind::NotFound.into()).is_disk_full());
        assert!(!Error::Poisoned.is_disk_full());
    }
}
