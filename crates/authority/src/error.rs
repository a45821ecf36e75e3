//! The authority's typed errors: what went wrong and what the caller must do next.

use crate::ids::NodeId;

/// Result of authority operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An authority error.
#[derive(Clone, Debug, thiserror::Error)]
pub enum Error {
    /// Another owner, epoch or session holds the record: this node must stop
    /// serving the Cell (or, for a lease, stop serving at all) at once. The
    /// proposal provably did not commit.
    #[error("fenced: {reason}")]
    Fenced {
        /// Why (who holds it now).
        reason: String,
    },
    /// The proposal committed (its content is durable), but a later owner has
    /// since replaced the root: this node is fenced as for
    /// [`Error::Fenced`], yet what the proposal carried must be reported
    /// committed.
    #[error("committed, then fenced: {reason}")]
    CommittedThenFenced {
        /// Who holds the root now.
        reason: String,
    },
    /// The record changed concurrently (412/409) but not in a way that
    /// fences us: re-read and decide again. The proposal did not commit.
    #[error("conflict: {reason}; re-read and decide again")]
    Conflict {
        /// What changed.
        reason: String,
    },
    /// Takeover refused: the owner's lease is live. Route to the owner.
    #[error("cell owned by {owner} whose lease is live until {until_ms} ms")]
    LeaseLive {
        /// The live owner.
        owner: NodeId,
        /// Wall-clock time (ms since the epoch) after which takeover may succeed.
        until_ms: u64,
    },
    /// A stored record failed validation (or is not the record expected at
    /// its key). Never acted on.
    #[error("corrupt record {key}: {reason}")]
    Corrupt {
        /// The object key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// The store failed. If `ambiguous`, a conditional write may or may not
    /// have committed and re-reading could not settle it: report the fate as
    /// unknown, never retry blindly.
    #[error("object store unavailable (ambiguous: {ambiguous}): {source}")]
    Unavailable {
        /// The store error.
        source: cellfleet_store::Error,
        /// Whether a write's fate is unknown.
        ambiguous: bool,
    },
    /// A proposal broke the record rules (a caller bug, or a TXID gap).
    #[error("invalid proposal: {reason}")]
    Invalid {
        /// Which rule.
        reason: String,
    },
}

impl Error {
    /// Whether trying the whole operation again later (re-read, re-decide)
    /// may succeed: conflicts, unavailability and live leases.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::Conflict { .. } | Error::Unavailable { .. } | Error::LeaseLive { .. }
        )
    }

    /// Whether a write's fate is unknown (report `UNKNOWN`, do not replay).
    pub fn is_ambiguous(&self) -> bool {
        matches!(
            self,
            Error::Unavailable {
                ambiguous: true,
                ..
            }
        )
    }

    /// Whether this node has lost the record to someone else (whether or
    /// not its own proposal got in first: see [`Error::CommittedThenFenced`]).
    pub fn is_fenced(&self) -> bool {
        matches!(
            self,
            Error::Fenced { .. } | Error::CommittedThenFenced { .. }
        )
    }

    pub(crate) fn store(source: cellfleet_store::Error) -> Self {
        match source {
            cellfleet_store::Error::Corrupt { key, reason } => Error::Corrupt { key, reason },
            source => Error::Unavailable {
                source,
                ambiguous: false,
            },
        }
    }

    pub(crate) fn invalid(reason: impl Into<String>) -> Self {
        Error::Invalid {
            reason: reason.into(),
        }
    }

    pub(crate) fn fenced(reason: impl Into<String>) -> Self {
        Error::Fenced {
            reason: reason.into(),
        }
    }
}
