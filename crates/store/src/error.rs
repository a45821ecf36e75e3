//! The store's typed errors and what a caller may do about each.

use crate::object::Op;

/// Result of store operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Whether a failed operation may nevertheless have taken effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The store provably did not apply the request (refused before acting,
    /// e.g. throttled, or the connection was never made).
    NotApplied,
    /// The request may have been applied (timeout, connection lost after
    /// sending, server error mid-write): re-read before deciding anything.
    Unknown,
}

/// An object-store error.
#[derive(Clone, Debug, thiserror::Error)]
pub enum Error {
    /// The object does not exist.
    #[error("object {key} not found")]
    NotFound {
        /// The key.
        key: String,
    },
    /// A conditional write's precondition did not hold (HTTP 412): the object
    /// exists (`If-None-Match: *`) or changed since it was read (`If-Match`).
    /// Never retried: someone else wrote.
    #[error("precondition failed writing {key}: it exists or changed since it was read")]
    PreconditionFailed {
        /// The key.
        key: String,
    },
    /// The server refused a conditional write that raced another one on the
    /// same key (HTTP 409 `ConditionalRequestConflict`). Not applied; re-read
    /// and decide again.
    #[error("conditional write to {key} conflicted with a concurrent write (409); re-read")]
    Conflict {
        /// The key.
        key: String,
    },
    /// The store could not be reached or failed transiently.
    #[error("store unavailable during {op} of {key} ({outcome:?}): {message}")]
    Unavailable {
        /// The operation.
        op: Op,
        /// The key or prefix.
        key: String,
        /// Whether the request may have been applied.
        outcome: Outcome,
        /// What went wrong.
        message: String,
    },
    /// The store refused the request for a reason retries do not fix
    /// (credentials, permissions, missing bucket, malformed request).
    #[error("store rejected {op} of {key} (status {status:?}): {message}")]
    Rejected {
        /// The operation.
        op: Op,
        /// The key or prefix.
        key: String,
        /// HTTP status, when there was one.
        status: Option<u16>,
        /// The server's error code and message.
        message: String,
    },
    /// A range read's range is empty or starts at or past the end.
    #[error("invalid range {start}..{end} of {key} ({size} bytes)")]
    InvalidRange {
        /// The key.
        key: String,
        /// Requested start.
        start: u64,
        /// Requested end (exclusive).
        end: u64,
        /// The object's size.
        size: u64,
    },
    /// The key (or prefix) is not acceptable.
    #[error("invalid key {key:?}: {reason}")]
    InvalidKey {
        /// The key, truncated.
        key: String,
        /// Why.
        reason: String,
    },
    /// Stored data is inconsistent (e.g. a reply without an ETag, a torn file).
    #[error("corrupt object {key}: {reason}")]
    Corrupt {
        /// The key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A listing exceeded the caller's bound.
    #[error("more than {limit} keys under {prefix}")]
    TooMany {
        /// The prefix listed.
        prefix: String,
        /// The bound.
        limit: usize,
    },
    /// The store's configuration is unusable.
    #[error("store configuration: {0}")]
    Config(String),
    /// A local I/O error.
    #[error("i/o error during {op} of {key}: {message}")]
    Io {
        /// The operation.
        op: Op,
        /// The key.
        key: String,
        /// The error.
        message: String,
    },
}

impl Error {
    /// Whether resending the identical request later may succeed without
    /// harm. True only for [`Error::Unavailable`]; callers must still not
    /// resend a *conditional* write whose outcome is [`Outcome::Unknown`]
    /// (see [`Error::may_have_applied`]): reconcile by re-reading instead.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Unavailable { .. })
    }

    /// Whether the failed request may nevertheless have been applied.
    pub fn may_have_applied(&self) -> bool {
        matches!(
            self,
            Error::Unavailable {
                outcome: Outcome::Unknown,
                ..
            }
        )
    }

    /// Whether this is a precondition failure (412).
    pub fn is_precondition_failed(&self) -> bool {
        matches!(self, Error::PreconditionFailed { .. })
    }

    /// Whether the object was missing.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::NotFound { .. })
    }

    pub(crate) fn io(op: Op, key: &str, error: &std::io::Error) -> Self {
        Error::Io {
            op,
            key: key.to_owned(),
            message: error.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unavailable_is_retryable() {
        let unavailable = Error::Unavailable {
            op: Op::Get,
            key: "k".into(),
            outcome: Outcome::NotApplied,
            message: "x".into(),
        };
        assert!(unavailable.is_retryable());
        assert!(!unavailable.may_have_applied());
        assert!(!Error::PreconditionFailed { key: "k".into() }.is_retryable());
        assert!(!Error::Conflict { key: "k".into() }.is_retryable());
        assert!(!Error::NotFound { key: "k".into() }.is_retryable());
    }
}
