//! The runtime's one error type: what failed, whether a retry may help, and where to retry.

use cellfleet_authority::{CellId, NodeId, Txid};

/// Result of runtime operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A runtime error. Cloneable: one failure of a group answers every command in it.
#[derive(Clone, Debug, thiserror::Error)]
pub enum Error {
    /// Another node owns the Cell (its lease is live): send the request there.
    #[error("cell {cell} is owned by {owner:?} at {endpoint:?}")]
    NotOwner {
        /// The Cell.
        cell: CellId,
        /// The owner, when known.
        owner: Option<NodeId>,
        /// The owner's gRPC endpoint, when known.
        endpoint: Option<String>,
    },
    /// A bound was hit; nothing was queued. Retry after the hint.
    #[error("resource exhausted ({what}); retry after {retry_after_ms} ms")]
    ResourceExhausted {
        /// Which bound.
        what: &'static str,
        /// Retry hint.
        retry_after_ms: u64,
    },
    /// The command provably did not commit (the root does not contain it):
    /// retrying it (same command id) is safe.
    #[error("not committed: {reason}")]
    NotCommitted {
        /// Why.
        reason: String,
    },
    /// The command's fate could not be proven: it may or may not have
    /// committed. Retry with the same command id (the ledger answers) or
    /// resolve it; never assume either way.
    #[error("outcome unknown: {reason}")]
    Unknown {
        /// Why.
        reason: String,
    },
    /// This node lost the Cell to a newer owner.
    #[error("fenced from cell {cell}: {reason}")]
    Fenced {
        /// The Cell.
        cell: CellId,
        /// Why.
        reason: String,
    },
    /// The node is draining: it admits nothing new.
    #[error("node is draining")]
    Draining,
    /// The node's lease was replaced or retired: it serves nothing.
    #[error("node lease lost: {reason}")]
    LeaseLost {
        /// Why.
        reason: String,
    },
    /// The request is malformed (unknown kind, bad receipt).
    #[error("bad request: {0}")]
    BadRequest(String),
    /// A query's minimum receipt was not published within the wait bound.
    #[error("receipt txid {} not published within {waited_ms} ms", .txid.0)]
    ReceiptNotReached {
        /// The receipt's TXID.
        txid: Txid,
        /// How long the query waited.
        waited_ms: u64,
    },
    /// The object store failed (nothing ambiguous was written).
    #[error("store: {0}")]
    Store(cellfleet_store::Error),
    /// The authority failed.
    #[error("authority: {0}")]
    Authority(cellfleet_authority::Error),
    /// The Cell engine failed (the query or group did not run, or the Cell
    /// could not be opened).
    #[error("cell: {message}")]
    Cell {
        /// The engine's message.
        message: String,
        /// Whether the same call may succeed later.
        retryable: bool,
    },
    /// The Cell's actor stopped before answering (passivated, fenced or
    /// shut down); the request did not reach it or did not run.
    #[error("cell actor stopped: {0}")]
    Closed(String),
}

impl Error {
    /// Whether sending the same request again (same command id) may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::NotOwner { .. }
            | Error::ResourceExhausted { .. }
            | Error::NotCommitted { .. }
            | Error::Unknown { .. }
            | Error::Fenced { .. }
            | Error::ReceiptNotReached { .. }
            | Error::Closed(_) => true,
            Error::Draining | Error::LeaseLost { .. } | Error::BadRequest(_) => false,
            Error::Store(e) => e.is_retryable(),
            Error::Authority(e) => e.is_retryable(),
            Error::Cell { retryable, .. } => *retryable,
        }
    }

    /// How long to wait before retrying, when the runtime has a hint.
    pub fn retry_after_ms(&self) -> Option<u64> {
        match self {
            Error::ResourceExhausted { retry_after_ms, .. } => Some(*retry_after_ms),
            _ => None,
        }
    }

    pub(crate) fn cell(error: &cellfleet_cell::Error) -> Self {
        if error.is_out_of_files() {
            // The node's descriptors, not the Cell: retry once other
            // Cells have closed (passivation frees them within seconds).
            tracing::warn!(%error, "out of file descriptors");
            return Error::ResourceExhausted {
                what: "open files (raise `ulimit -n` or lower [limits] fds_max)",
                retry_after_ms: OUT_OF_FILES_RETRY_MS,
            };
        }
        if error.is_request_error() {
            // Not the engine's failure: the caller's to fix.
            return Error::BadRequest(error.to_string());
        }
        Error::Cell {
            message: error.to_string(),
            retryable: error.is_retryable(),
        }
    }
}

/// The retry hint when the node ran out of file descriptors.
const OUT_OF_FILES_RETRY_MS: u64 = 1_000;

impl From<cellfleet_authority::Error> for Error {
    fn from(error: cellfleet_authority::Error) -> Self {
        if error.is_ambiguous() {
            return Error::Unknown {
                reason: error.to_string(),
            };
        }
        Error::Authority(error)
    }
}

impl From<cellfleet_store::Error> for Error {
    fn from(error: cellfleet_store::Error) -> Self {
        Error::Store(error)
    }
}

impl From<cellfleet_cell::Error> for Error {
    fn from(error: cellfleet_cell::Error) -> Self {
        Error::cell(&error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_hints_and_classes() {
        let exhausted = Error::ResourceExhausted {
            what: "mailbox",
            retry_after_ms: 7,
        };
        assert!(exhausted.is_retryable());
        assert_eq!(exhausted.retry_after_ms(), Some(7));
        assert!(!Error::Draining.is_retryable());
        assert!(!Error::BadRequest("x".into()).is_retryable());
        let ambiguous = cellfleet_authority::Error::Unavailable {
            source: cellfleet_store::Error::Config("x".into()),
            ambiguous: true,
        };
        assert!(matches!(Error::from(ambiguous), Error::Unknown { .. }));
        let out = Error::from(cellfleet_cell::Error::OutOfFiles {
            path: "c.db".into(),
        });
        assert!(
            matches!(out, Error::ResourceExhausted { retry_after_ms, .. } if retry_after_ms > 0),
            "{out:?}"
        );
        assert!(out.is_retryable());
    }
}
