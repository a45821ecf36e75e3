//! The one table mapping every router error to a gRPC status code, a wire `ErrorCode` and whether a retry is safe.
//!
//! | error | wire code | gRPC status | retry safe | hint |
//! | --- | --- | --- | --- | --- |
//! | [`Error::Malformed`] | `MALFORMED` | `INVALID_ARGUMENT` | no | fix the request |
//! | [`Error::Unsigned`] | `UNSIGNED` | `UNAUTHENTICATED` | no | sign it |
//! | [`Error::UnknownKey`] | `UNKNOWN_KEY` | `UNAUTHENTICATED` | no | register the key |
//! | [`Error::BadSignature`] | `BAD_SIGNATURE` | `UNAUTHENTICATED` | no | sign `tag ‖ body` |
//! | [`Error::Unauthorized`] | `UNAUTHORIZED` | `PERMISSION_DENIED` | no | grant the key |
//! | [`Error::Expired`] | `EXPIRED` | `FAILED_PRECONDITION` | no | resolve, then re-sign |
//! | [`Error::FutureDated`] | `FUTURE_DATED` | `FAILED_PRECONDITION` | no | fix the clock |
//! | [`Error::WindowTooLong`] | `WINDOW_TOO_LONG` | `INVALID_ARGUMENT` | no | shorten the window |
//! | [`Error::NotPeer`] | `NOT_PEER` | `PERMISSION_DENIED` | no | use a node certificate |
//! | [`Error::TooLarge`] | `TOO_LARGE` | `RESOURCE_EXHAUSTED` | no | send less |
//! | [`Error::NotOwner`] | `NOT_OWNER` | `UNAVAILABLE` | yes | the owner hint |
//! | [`Error::TooManyHops`] | `TOO_MANY_HOPS` | `UNAVAILABLE` | yes | ownership is moving |
//! | [`Error::ResourceExhausted`] | `RESOURCE_EXHAUSTED` | `RESOURCE_EXHAUSTED` | yes | after `retry_after_ms` |
//! | [`Error::NotCommitted`] | `NOT_COMMITTED` | `ABORTED` | yes | same command id |
//! | [`Error::UnknownOutcome`] | `UNKNOWN_OUTCOME` | `UNKNOWN` | yes | same command id only, or Resolve |
//! | [`Error::Fenced`] | `FENCED` | `UNAVAILABLE` | yes | after [`MOVE_RETRY_AFTER_MS`] |
//! | [`Error::Draining`] | `DRAINING` | `UNAVAILABLE` | yes | another node |
//! | [`Error::LeaseLost`] | `LEASE_LOST` | `UNAVAILABLE` | yes | another node |
//! | [`Error::ReceiptNotReached`] | `RECEIPT_NOT_REACHED` | `UNAVAILABLE` | yes | after [`RECEIPT_RETRY_AFTER_MS`] |
//! | [`Error::DeadlineExceeded`] | `DEADLINE_EXCEEDED` | `DEADLINE_EXCEEDED` | yes | same command id |
//! | [`Error::PeerUnavailable`] | `PEER_UNAVAILABLE` | `UNAVAILABLE` | yes | |
//! | [`Error::BadRequest`] | `BAD_REQUEST` | `INVALID_ARGUMENT` | no | |
//! | [`Error::Internal`] | `INTERNAL` | `INTERNAL` | as the error says | |
//!
//! "Retry safe" means that sending the same request again (for a command:
//! the same command id and payload) cannot apply anything twice and may
//! succeed: the Cell's ledger answers a repeated command id with the stored
//! outcome. The same table is written in `proto/cellfleet/v1/errors.proto`
//! for clients; a test keeps the two in step.
//!
//! Every failed call carries the serialized [`v1::ErrorDetail`] in the
//! trailing metadata entry [`ERROR_DETAIL_METADATA`].
//!
//! **Adapter point:** `cellfleet_runtime::Error` is mapped onto
//! [`Error`] by the `From` impl in this file: `NotOwner → NotOwner(hint)`, `ResourceExhausted`,
//! `NotCommitted`, `Unknown → UnknownOutcome`, `Fenced`, `Draining`,
//! `LeaseLost`, `BadRequest`, `ReceiptNotReached`, and `Store`/`Authority`/
//! `Cell`/`Closed` → `Internal { retryable: e.is_retryable() }`.

use cellfleet_proto::v1;
use prost::Message;
use tonic::metadata::MetadataValue;
use tonic::Code;

use crate::error::{Error, OwnerHint};

pub use cellfleet_client::error::{
    decode_detail, detail_from_status, ERROR_DETAIL_BYTES_MAX, ERROR_DETAIL_METADATA,
};

/// Retry hint after a Cell moved (fenced, draining, lease lost): long
/// enough for a takeover's authority read, short enough not to matter.
pub const MOVE_RETRY_AFTER_MS: u64 = 100;

/// Retry hint for a query whose minimum receipt was not yet published.
pub const RECEIPT_RETRY_AFTER_MS: u64 = 50;

/// How one error is reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatusRule {
    /// The gRPC status code.
    pub code: Code,
    /// The wire error code.
    pub error_code: v1::ErrorCode,
    /// Whether the same request may be sent again.
    pub retry_safe: bool,
}

const fn rule_of(code: Code, error_code: v1::ErrorCode, retry_safe: bool) -> StatusRule {
    StatusRule {
        code,
        error_code,
        retry_safe,
    }
}

// The retry answers of an error come from its status rule, so they live
// with it (error.rs only defines the type: no cycle between the two).
impl Error {
    /// Whether sending the same request again (for a command: the same
    /// command id and payload) cannot apply anything twice and may succeed.
    pub fn is_retryable(&self) -> bool {
        rule(self).retry_safe
    }

    /// How long to wait before a retry, when there is a hint.
    pub fn retry_after_ms(&self) -> Option<u64> {
        match self {
            Error::ResourceExhausted { retry_after_ms, .. } => Some(*retry_after_ms),
            Error::ReceiptNotReached { .. } => Some(RECEIPT_RETRY_AFTER_MS),
            Error::Draining | Error::LeaseLost(_) | Error::Fenced(_) => Some(MOVE_RETRY_AFTER_MS),
            _ => None,
        }
    }
}

/// The table (see the module docs).
pub fn rule(error: &Error) -> StatusRule {
    use v1::ErrorCode as E;
    match error {
        Error::Malformed(_) => rule_of(Code::InvalidArgument, E::Malformed, false),
        Error::Unsigned(_) => rule_of(Code::Unauthenticated, E::Unsigned, false),
        Error::UnknownKey(_) => rule_of(Code::Unauthenticated, E::UnknownKey, false),
        Error::BadSignature { .. } => rule_of(Code::Unauthenticated, E::BadSignature, false),
        Error::Unauthorized { .. } => rule_of(Code::PermissionDenied, E::Unauthorized, false),
        Error::Expired(_) => rule_of(Code::FailedPrecondition, E::Expired, false),
        Error::FutureDated { .. } => rule_of(Code::FailedPrecondition, E::FutureDated, false),
        Error::WindowTooLong { .. } => rule_of(Code::InvalidArgument, E::WindowTooLong, false),
        Error::NotPeer(_) => rule_of(Code::PermissionDenied, E::NotPeer, false),
        Error::TooLarge { .. } => rule_of(Code::ResourceExhausted, E::TooLarge, false),
        Error::NotOwner(_) => rule_of(Code::Unavailable, E::NotOwner, true),
        Error::TooManyHops { .. } => rule_of(Code::Unavailable, E::TooManyHops, true),
        Error::ResourceExhausted { .. } => {
            rule_of(Code::ResourceExhausted, E::ResourceExhausted, true)
        }
        Error::NotCommitted(_) => rule_of(Code::Aborted, E::NotCommitted, true),
        Error::UnknownOutcome(_) => rule_of(Code::Unknown, E::UnknownOutcome, true),
        Error::Fenced(_) => rule_of(Code::Unavailable, E::Fenced, true),
        Error::Draining => rule_of(Code::Unavailable, E::Draining, true),
        Error::LeaseLost(_) => rule_of(Code::Unavailable, E::LeaseLost, true),
        Error::ReceiptNotReached { .. } => rule_of(Code::Unavailable, E::ReceiptNotReached, true),
        Error::DeadlineExceeded(_) => rule_of(Code::DeadlineExceeded, E::DeadlineExceeded, true),
        Error::PeerUnavailable { .. } => rule_of(Code::Unavailable, E::PeerUnavailable, true),
        Error::BadRequest(_) => rule_of(Code::InvalidArgument, E::BadRequest, false),
        Error::Internal { retryable, .. } => rule_of(Code::Internal, E::Internal, *retryable),
    }
}

/// The wire detail of `error`.
pub fn detail(error: &Error) -> v1::ErrorDetail {
    let rule = rule(error);
    let owner_hint = match error {
        Error::NotOwner(hint) => Some(v1::OwnerHint {
            cell_id: hint.cell_id.clone(),
            node_id: hint.node_id.clone().unwrap_or_default(),
            endpoint: hint.endpoint.clone().unwrap_or_default(),
            epoch: hint.epoch,
        }),
        _ => None,
    };
    v1::ErrorDetail {
        code: rule.error_code as i32,
        retry_safe: rule.retry_safe,
        retry_after_ms: error.retry_after_ms().unwrap_or(0),
        owner_hint,
        message: error.to_string(),
    }
}

/// The gRPC status for `error`, with the detail in [`ERROR_DETAIL_METADATA`].
pub fn to_status(error: &Error) -> tonic::Status {
    let rule = rule(error);
    let detail = detail(error);
    let mut status = tonic::Status::new(rule.code, detail.message.clone());
    status.metadata_mut().insert_bin(
        ERROR_DETAIL_METADATA,
        MetadataValue::from_bytes(&detail.encode_to_vec()),
    );
    status
}

impl From<Error> for tonic::Status {
    fn from(error: Error) -> Self {
        to_status(&error)
    }
}

/// The owner hint of a NOT_OWNER detail, for the ingress's one retry.
pub fn owner_hint(detail: &v1::ErrorDetail) -> Option<OwnerHint> {
    if detail.code != v1::ErrorCode::NotOwner as i32 {
        return None;
    }
    let hint = detail.owner_hint.as_ref()?;
    let non_empty = |s: &String| (!s.is_empty()).then(|| s.clone());
    Some(OwnerHint {
        cell_id: hint.cell_id.clone(),
        node_id: non_empty(&hint.node_id),
        endpoint: non_empty(&hint.endpoint),
        epoch: hint.epoch,
    })
}

/// The adapter point: a runtime failure as the router reports it.
impl From<cellfleet_runtime::Error> for Error {
    fn from(error: cellfleet_runtime::Error) -> Self {
        use cellfleet_runtime::Error as R;
        match error {
            R::NotOwner {
                cell,
                owner,
                endpoint,
            } => Error::NotOwner(OwnerHint {
                cell_id: cell.as_str().to_owned(),
                node_id: owner.map(|node| node.as_str().to_owned()),
                endpoint,
                epoch: 0,
            }),
            R::ResourceExhausted {
                what,
                retry_after_ms,
            } => Error::ResourceExhausted {
                what: what.to_owned(),
                retry_after_ms,
            },
            R::NotCommitted { reason } => Error::NotCommitted(reason),
            R::Unknown { reason } => Error::UnknownOutcome(reason),
            R::Fenced { cell, reason } => Error::Fenced(format!("cell {cell}: {reason}")),
            R::Draining => Error::Draining,
            R::LeaseLost { reason } => Error::LeaseLost(reason),
            R::BadRequest(message) => Error::BadRequest(message),
            R::ReceiptNotReached { txid, waited_ms } => Error::ReceiptNotReached {
                txid: txid.0,
                waited_ms,
            },
            other @ (R::Store(_) | R::Authority(_) | R::Cell { .. } | R::Closed(_)) => {
                Error::Internal {
                    retryable: other.is_retryable(),
                    message: other.to_string(),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Window;
    use proptest::prelude::*;

    fn every_error() -> Vec<Error> {
        let window = Window {
            issued_at_ms: 1,
            expires_at_ms: 2,
            now_ms: 3,
        };
        vec![
            Error::Malformed("x".into()),
            Error::Unsigned("no signature"),
            Error::UnknownKey("k".into()),
            Error::BadSignature {
                key_id: "k".into(),
                domain: "cellfleet.v1.command",
            },
            Error::Unauthorized {
                key_id: "k".into(),
                what: "w".into(),
            },
            Error::Expired(window),
            Error::FutureDated {
                window,
                skew_ms: 500,
            },
            Error::WindowTooLong {
                window_ms: 10,
                max_window_ms: 5,
            },
            Error::NotPeer("client".into()),
            Error::TooLarge {
                what: "body",
                bytes: 2,
                max_bytes: 1,
            },
            Error::NotOwner(OwnerHint::default()),
            Error::TooManyHops {
                hops: 3,
                max_hops: 2,
            },
            Error::ResourceExhausted {
                what: "mailbox".into(),
                retry_after_ms: 7,
            },
            Error::NotCommitted("x".into()),
            Error::UnknownOutcome("x".into()),
            Error::Fenced("x".into()),
            Error::Draining,
            Error::LeaseLost("x".into()),
            Error::ReceiptNotReached {
                txid: 1,
                waited_ms: 2,
            },
            Error::DeadlineExceeded("x".into()),
            Error::PeerUnavailable {
                endpoint: "e".into(),
                reason: "r".into(),
            },
            Error::BadRequest("x".into()),
            Error::Internal {
                message: "x".into(),
                retryable: false,
            },
        ]
    }

    /// The table in errors.proto, parsed, must say what [`rule`] says.
    #[test]
    fn proto_table_matches_rules() {
        let proto = include_str!("../../../proto/cellfleet/v1/errors.proto");
        let errors = every_error();
        for error in &errors {
            let rule = rule(error);
            let name = rule.error_code.as_str_name();
            let line = proto
                .lines()
                .find(|line| {
                    line.trim_start_matches(['/', ' '])
                        .split_whitespace()
                        .next()
                        == Some(name)
                })
                .unwrap_or_else(|| panic!("{name} missing from the errors.proto table"));
            let mut words = line.trim_start_matches(['/', ' ']).split_whitespace();
            words.next();
            let code = words.next().expect("status column");
            let retry = words.next().expect("retry column");
            let expected_code = format!("{:?}", rule.code);
            assert_eq!(
                code.replace('_', "").to_lowercase(),
                expected_code.to_lowercase(),
                "{name}"
            );
            if !matches!(error, Error::Internal { .. }) {
                assert_eq!(retry == "yes", rule.retry_safe, "{name}");
            }
        }
        // Every wire code except UNSPECIFIED is produced by some error.
        let mut produced: Vec<i32> = errors.iter().map(|e| rule(e).error_code as i32).collect();
        produced.sort_unstable();
        produced.dedup();
        assert_eq!(produced, (1..=23).collect::<Vec<_>>());
    }

    #[test]
    fn security_failures_have_their_documented_codes() {
        let code = |e: Error| to_status(&e).code();
        assert_eq!(code(Error::Unsigned("x")), Code::Unauthenticated);
        assert_eq!(code(Error::UnknownKey("k".into())), Code::Unauthenticated);
        assert_eq!(
            code(Error::Unauthorized {
                key_id: "k".into(),
                what: "w".into()
            }),
            Code::PermissionDenied
        );
        assert_eq!(code(Error::Malformed("m".into())), Code::InvalidArgument);
    }

    #[test]
    fn not_owner_hint_survives_the_status_round_trip() {
        let hint = OwnerHint {
            cell_id: "ab".into(),
            node_id: Some("n2".into()),
            endpoint: Some("https://127.0.0.1:7001".into()),
            epoch: 9,
        };
        let status = to_status(&Error::NotOwner(hint.clone()));
        assert_eq!(status.code(), Code::Unavailable);
        let detail = detail_from_status(&status).expect("detail present");
        assert_eq!(detail.code, v1::ErrorCode::NotOwner as i32);
        assert!(detail.retry_safe);
        assert_eq!(owner_hint(&detail), Some(hint));
    }

    #[test]
    fn retry_hints() {
        let exhausted = Error::ResourceExhausted {
            what: "mailbox".into(),
            retry_after_ms: 7,
        };
        assert_eq!(detail(&exhausted).retry_after_ms, 7);
        assert!(exhausted.is_retryable());
        assert!(!Error::Unsigned("x").is_retryable());
        assert_eq!(detail(&Error::Draining).retry_after_ms, MOVE_RETRY_AFTER_MS);
    }

    proptest! {
        /// A peer's detail bytes: decoding never panics, and whatever
        /// decodes re-encodes to a detail that decodes identically.
        #[test]
        fn arbitrary_detail_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Some(detail) = decode_detail(&bytes) {
                let again = decode_detail(&detail.encode_to_vec());
                prop_assert_eq!(again.as_ref(), Some(&detail));
                if let Some(hint) = owner_hint(&detail) {
                    prop_assert_eq!(detail.code, v1::ErrorCode::NotOwner as i32);
                    prop_assert!(hint.node_id.as_ref().is_none_or(|n| !n.is_empty()));
                }
            }
        }

        #[test]
        fn oversized_details_are_ignored(extra in 0usize..64) {
            let detail = v1::ErrorDetail {
                message: "x".repeat(ERROR_DETAIL_BYTES_MAX + extra),
                ..Default::default()
            };
            prop_assert!(decode_detail(&detail.encode_to_vec()).is_none());
        }
    }
}
