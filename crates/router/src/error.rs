//! The router's one error type: every way a request can fail at a node's ingress, with whether a retry is safe.
//!
//! The gRPC status, retry hint and wire `ErrorCode` for each variant are
//! decided in one place, [`crate::status`]. Runtime failures get their own
//! variants here (mirroring `cellfleet_runtime::Error`); the conversion from
//! the runtime's type is the adapter point named in `status.rs`.

use std::fmt;

/// Result of router operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Where a Cell is believed to live (carried by [`Error::NotOwner`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnerHint {
    /// The Cell id (hex).
    pub cell_id: String,
    /// The owner's node id, when known.
    pub node_id: Option<String>,
    /// The owner's gRPC endpoint, when known.
    pub endpoint: Option<String>,
    /// The epoch the hint was learned at (0 when unknown).
    pub epoch: u64,
}

/// Which check of the validity window failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// The envelope's `issued_at_ms`.
    pub issued_at_ms: i64,
    /// The envelope's `expires_at_ms`.
    pub expires_at_ms: i64,
    /// The server's wall clock when it checked.
    pub now_ms: i64,
}

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "issued_at_ms {} expires_at_ms {} now_ms {}",
            self.issued_at_ms, self.expires_at_ms, self.now_ms
        )
    }
}

/// A router error.
#[derive(Clone, Debug, thiserror::Error)]
pub enum Error {
    // ---- envelope and key checks (never reach a Cell) ----
    /// The envelope or its body does not decode or has an invalid field.
    #[error("malformed request: {0}")]
    Malformed(String),
    /// The envelope has no signature or no key id.
    #[error("unsigned request: {0}")]
    Unsigned(&'static str),
    /// No registered key has this id.
    #[error("unknown key id {0:?}")]
    UnknownKey(String),
    /// The signature does not verify over the domain tag and the body bytes.
    #[error("bad signature for key {key_id:?} ({domain})")]
    BadSignature {
        /// The claimed key.
        key_id: String,
        /// The domain tag the server checked against.
        domain: &'static str,
    },
    /// The key may not use this kind or operation.
    #[error("key {key_id:?} may not {what}")]
    Unauthorized {
        /// The key.
        key_id: String,
        /// What it tried ("use kind \"kv\"", "run command \"put\"", ...).
        what: String,
    },
    /// The validity window has passed.
    #[error(
        "expired ({0}; now_ms is this node's clock): sign the command again with a later \
         expires_at_ms; if it was signed just now, this node's clock or the signer's is off: \
         keep them synchronized (NTP)"
    )]
    Expired(Window),
    /// Issued further in the future than the clock-skew bound allows.
    #[error(
        "future-dated beyond the {skew_ms} ms skew bound ({window}; now_ms is this node's clock): \
         the signer's clock is {} ms ahead of this node's; if the signer's clock is right, this \
         node's clock is behind: keep nodes' and clients' clocks synchronized (NTP) within the bound",
        window.issued_at_ms.saturating_sub(window.now_ms)
    )]
    FutureDated {
        /// The window.
        window: Window,
        /// The bound.
        skew_ms: u64,
    },
    /// The validity window is longer than the cluster allows.
    #[error("validity window of {window_ms} ms exceeds the {max_window_ms} ms maximum")]
    WindowTooLong {
        /// `expires_at_ms - issued_at_ms`.
        window_ms: i128,
        /// The bound.
        max_window_ms: u64,
    },
    /// A peer call came from a certificate that is not a node's.
    #[error("not a peer: {0}")]
    NotPeer(String),
    /// The request is over a size bound.
    #[error("{what} of {bytes} bytes exceeds the {max_bytes} byte limit")]
    TooLarge {
        /// Which part.
        what: &'static str,
        /// Its size.
        bytes: usize,
        /// The bound.
        max_bytes: usize,
    },

    // ---- routing ----
    /// This node does not own the Cell; the hint says where it is believed to be.
    #[error("not the owner of cell {}", .0.cell_id)]
    NotOwner(OwnerHint),
    /// The request was already forwarded the maximum number of times.
    #[error("request made {hops} hops; at most {max_hops} are allowed")]
    TooManyHops {
        /// Hops so far.
        hops: u32,
        /// The bound.
        max_hops: u32,
    },
    /// The client's deadline passed before the request could be served.
    #[error("deadline exceeded: {0}")]
    DeadlineExceeded(String),
    /// A peer node could not be reached.
    #[error("peer {endpoint} unavailable: {reason}")]
    PeerUnavailable {
        /// The peer's endpoint.
        endpoint: String,
        /// Why.
        reason: String,
    },

    // ---- runtime outcomes (adapter point: see status.rs) ----
    /// A bound was hit; nothing was queued.
    #[error("resource exhausted ({what}); retry after {retry_after_ms} ms")]
    ResourceExhausted {
        /// Which bound.
        what: String,
        /// Retry hint.
        retry_after_ms: u64,
    },
    /// The command provably did not commit.
    #[error("not committed: {0}")]
    NotCommitted(String),
    /// The command's fate could not be proven.
    #[error("outcome unknown: {0}")]
    UnknownOutcome(String),
    /// The serving node lost the Cell to a newer owner.
    #[error("fenced: {0}")]
    Fenced(String),
    /// The node is draining.
    #[error("node is draining")]
    Draining,
    /// The node's lease was replaced or retired.
    #[error("node lease lost: {0}")]
    LeaseLost(String),
    /// A query's minimum receipt was not published in time.
    #[error("receipt txid {txid} not published within {waited_ms} ms")]
    ReceiptNotReached {
        /// The receipt's TXID.
        txid: u64,
        /// How long the query waited.
        waited_ms: u64,
    },
    /// A well-formed request the runtime refused (unknown kind, bad receipt).
    #[error("bad request: {0}")]
    BadRequest(String),
    /// Anything else (store, authority, engine failures).
    #[error("internal: {message}")]
    Internal {
        /// What failed.
        message: String,
        /// Whether the same request may succeed later.
        retryable: bool,
    },
}
