//! Typed errors that mirror `errors.proto`: what the cluster refused (with its code, retry hint and owner hint), what the transport did, and a command whose outcome stayed unknown.

use std::time::Duration;

use cellfleet_proto::v1;
use prost::Message;

use crate::CommandId;

/// The trailing metadata entry that carries a serialized [`v1::ErrorDetail`].
pub const ERROR_DETAIL_METADATA: &str = "cellfleet-error-bin";
/// Largest error detail decoded (a server's answer is untrusted bytes).
pub const ERROR_DETAIL_BYTES_MAX: usize = 16 * 1024;

/// Reads the Cellfleet detail of a failed call, if it has a valid one.
pub fn detail_from_status(status: &tonic::Status) -> Option<v1::ErrorDetail> {
    let value = status.metadata().get_bin(ERROR_DETAIL_METADATA)?;
    let bytes = value.to_bytes().ok()?;
    decode_detail(&bytes)
}

/// Decodes a serialized [`v1::ErrorDetail`] (bounded; never panics).
pub fn decode_detail(bytes: &[u8]) -> Option<v1::ErrorDetail> {
    if bytes.len() > ERROR_DETAIL_BYTES_MAX {
        return None;
    }
    v1::ErrorDetail::decode(bytes).ok()
}

/// A failure below Cellfleet: no node answered with an error code.
///
/// ```
/// use cellfleet_client::error::Transport;
/// // Nothing listened: the request never left, any retry is safe.
/// assert!(Transport::Unreachable.never_sent());
/// // Broken mid-call: it may have been delivered.
/// assert!(!Transport::Interrupted.never_sent());
/// assert_eq!(Transport::Interrupted.as_str(), "TRANSPORT");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Transport {
    /// No connection was made (refused, unresolvable, timed out while
    /// connecting): the request was never sent.
    Unreachable,
    /// The TLS handshake refused a certificate (this client's or the
    /// node's): never sent.
    Certificate,
    /// The endpoint does not speak TLS (a node's HTTP or streams port?):
    /// never sent.
    NotTls,
    /// The call broke after it may have been delivered (connection reset,
    /// this client's deadline, a status without a Cellfleet detail).
    Interrupted,
    /// The server answered "not found" (an admin call for a Cell the
    /// cluster does not have).
    NotFound,
}

impl Transport {
    /// The category's name, as the CLI prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Unreachable => "UNREACHABLE",
            Transport::Certificate => "CERTIFICATE",
            Transport::NotTls => "NOT_TLS",
            Transport::Interrupted => "TRANSPORT",
            Transport::NotFound => "NOT_FOUND",
        }
    }

    /// Whether the request provably never reached a node.
    pub fn never_sent(self) -> bool {
        matches!(
            self,
            Transport::Unreachable | Transport::Certificate | Transport::NotTls
        )
    }
}

/// The best belief of where a Cell lives (a hint, never a proof).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnerHint {
    /// The owner's node id, when known.
    pub node_id: Option<String>,
    /// The owner's client endpoint (`https://host:port`), when known.
    pub endpoint: Option<String>,
    /// The ownership epoch the hint was learned at (0 when unknown).
    pub epoch: u64,
}

/// Every way a call can fail. Act on the variants and their fields, never
/// on the message text.
///
/// ```
/// use cellfleet_client::error::{Error, ERROR_DETAIL_METADATA};
/// use cellfleet_proto::v1;
/// use prost::Message;
///
/// // What a node answers when it does not own the Cell: a status whose
/// // trailing metadata carries the detail (here built by hand).
/// let detail = v1::ErrorDetail {
///     code: v1::ErrorCode::NotOwner as i32,
///     retry_safe: true,
///     owner_hint: Some(v1::OwnerHint {
///         endpoint: "https://127.0.0.1:7002".into(),
///         ..Default::default()
///     }),
///     ..Default::default()
/// };
/// let mut status = tonic::Status::unavailable("not the owner");
/// status.metadata_mut().insert_bin(
///     ERROR_DETAIL_METADATA,
///     tonic::metadata::MetadataValue::from_bytes(&detail.encode_to_vec()),
/// );
///
/// let error = Error::from_status(&status);
/// assert_eq!(error.name(), "NOT_OWNER");
/// assert!(error.retry_safe()); // the same request, to another node
/// assert!(!error.maybe_applied()); // refused before it ran
/// let hint = error.owner_hint().and_then(|hint| hint.endpoint.as_deref());
/// assert_eq!(hint, Some("https://127.0.0.1:7002"));
///
/// // Act on the variants, never the text:
/// match error {
///     Error::Refused { code: v1::ErrorCode::NotOwner, .. } => { /* retry elsewhere */ }
///     Error::UnknownOutcome { command_id, .. } => println!("resolve {command_id} later"),
///     other => println!("failed: {other}"),
/// }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A node refused the request with a Cellfleet error code (see
    /// `proto/cellfleet/v1/errors.proto` for the table).
    #[error("{} ({grpc:?}): {message}", code_name(*.code))]
    Refused {
        /// The wire code.
        code: v1::ErrorCode,
        /// The gRPC status code.
        grpc: tonic::Code,
        /// The node's message.
        message: String,
        /// Whether the same request may be sent again.
        retry_safe: bool,
        /// Wait at least this long before retrying.
        retry_after: Option<Duration>,
        /// Where the Cell lives (NOT_OWNER, sometimes FENCED).
        owner_hint: Option<OwnerHint>,
    },
    /// No Cellfleet answer (see [`Transport`]).
    #[error("{} ({grpc:?}): {message}", category.as_str())]
    Transport {
        /// What happened.
        category: Transport,
        /// The gRPC status code.
        grpc: tonic::Code,
        /// The transport's message.
        message: String,
    },
    /// A command may or may not have applied, and the retry budget ran out
    /// before its fate was proven. It never applies twice: retry it with the
    /// same id ([`crate::Command::id`]) or [`crate::Client::resolve`] it with
    /// `expires_at_ms` later.
    #[error(
        "the outcome of command {command_id} is unknown after {attempts} attempt(s) \
         (last: {last}); retry with the same id or resolve it with its expiry {expires_at_ms}"
    )]
    UnknownOutcome {
        /// The command's id.
        command_id: CommandId,
        /// The command's expiry (Unix ms), for [`crate::Client::resolve`].
        expires_at_ms: i64,
        /// Attempts made.
        attempts: u32,
        /// The last resolve's answer, if one was made.
        resolved: Option<v1::CommandState>,
        /// The last failure.
        last: Box<Error>,
    },
    /// The client config, a certificate or a key could not be loaded, or a
    /// request could not be built.
    #[error("{0}")]
    Config(String),
}

fn code_name(code: v1::ErrorCode) -> &'static str {
    code.as_str_name()
        .strip_prefix("ERROR_CODE_")
        .unwrap_or("UNSPECIFIED")
}

impl Error {
    /// The error of a failed gRPC call: the Cellfleet detail if the status
    /// carries one, else the transport category read from its source chain
    /// (typed errors only, never the text).
    pub fn from_status(status: &tonic::Status) -> Error {
        if let Some(detail) = detail_from_status(status) {
            let code = v1::ErrorCode::try_from(detail.code).unwrap_or(v1::ErrorCode::Unspecified);
            let owner_hint = detail.owner_hint.as_ref().map(|hint| {
                let some = |s: &String| (!s.is_empty()).then(|| s.clone());
                OwnerHint {
                    node_id: some(&hint.node_id),
                    endpoint: some(&hint.endpoint),
                    epoch: hint.epoch,
                }
            });
            return Error::Refused {
                code,
                grpc: status.code(),
                message: status.message().to_owned(),
                retry_safe: detail.retry_safe,
                retry_after: (detail.retry_after_ms > 0)
                    .then(|| Duration::from_millis(detail.retry_after_ms)),
                owner_hint,
            };
        }
        Error::Transport {
            category: transport_category(status),
            grpc: status.code(),
            message: status.message().to_owned(),
        }
    }

    /// The wire code, for refusals (and [`Error::UnknownOutcome`]).
    pub fn code(&self) -> Option<v1::ErrorCode> {
        match self {
            Error::Refused { code, .. } => Some(*code),
            Error::UnknownOutcome { .. } => Some(v1::ErrorCode::UnknownOutcome),
            _ => None,
        }
    }

    /// A short name for the failure: the wire code without its prefix
    /// (`NOT_OWNER`), or the transport category (`UNREACHABLE`).
    pub fn name(&self) -> &'static str {
        match self {
            Error::Refused { code, .. } => code_name(*code),
            Error::Transport { category, .. } => category.as_str(),
            Error::UnknownOutcome { .. } => "UNKNOWN_OUTCOME",
            Error::Config(_) => "CONFIG",
        }
    }

    /// Whether sending the same request again (a command: the same id and
    /// payload) cannot apply anything twice and may succeed.
    pub fn retry_safe(&self) -> bool {
        match self {
            Error::Refused { retry_safe, .. } => *retry_safe,
            // A refused certificate or a port that is not TLS does not fix
            // itself: retrying cannot help.
            Error::Transport { category, .. } => {
                matches!(category, Transport::Unreachable | Transport::Interrupted)
            }
            Error::UnknownOutcome { .. } => true,
            Error::Config(_) => false,
        }
    }

    /// Whether no node was reached at all (nothing listens there).
    pub fn unreachable(&self) -> bool {
        matches!(
            self,
            Error::Transport {
                category: Transport::Unreachable,
                ..
            }
        )
    }

    /// How long to wait before retrying, when the node said.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::Refused { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// The gRPC status code, when the error came from a call.
    pub fn grpc_code(&self) -> Option<tonic::Code> {
        match self {
            Error::Refused { grpc, .. } | Error::Transport { grpc, .. } => Some(*grpc),
            Error::UnknownOutcome { last, .. } => last.grpc_code(),
            Error::Config(_) => None,
        }
    }

    /// Whether a command that failed this way may have been applied (so it
    /// must be settled by the same id, never re-signed with a new one).
    pub fn maybe_applied(&self) -> bool {
        match self {
            Error::Refused { code, .. } => matches!(
                code,
                v1::ErrorCode::UnknownOutcome | v1::ErrorCode::Internal
            ),
            Error::Transport { category, .. } => *category == Transport::Interrupted,
            Error::UnknownOutcome { .. } => true,
            Error::Config(_) => false,
        }
    }

    /// The owner hint, when the node gave one.
    pub fn owner_hint(&self) -> Option<&OwnerHint> {
        match self {
            Error::Refused { owner_hint, .. } => owner_hint.as_ref(),
            _ => None,
        }
    }
}

/// What a status without a Cellfleet detail says: the server's own "not
/// found", a TLS refusal (certificates) or a peer that does not speak TLS,
/// no connection at all, or a call broken on the way.
fn transport_category(status: &tonic::Status) -> Transport {
    if status.code() == tonic::Code::NotFound {
        return Transport::NotFound;
    }
    let mut next: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(error) = next {
        let tls = error.downcast_ref::<rustls::Error>().or_else(|| {
            error
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if let Some(tls) = tls {
            return match tls {
                rustls::Error::InvalidMessage(_)
                | rustls::Error::InappropriateMessage { .. }
                | rustls::Error::InappropriateHandshakeMessage { .. } => Transport::NotTls,
                _ => Transport::Certificate,
            };
        }
        // io::Error's source() skips its payload: look inside it too.
        next = error
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .map(|inner| inner as &(dyn std::error::Error + 'static))
            .filter(|inner| !std::ptr::eq(*inner, error))
            .or_else(|| error.source());
    }
    if crate::transport::connect_failed(status) {
        return Transport::Unreachable;
    }
    Transport::Interrupted
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status_with(detail: &v1::ErrorDetail) -> tonic::Status {
        let mut status = tonic::Status::unavailable("moved");
        status.metadata_mut().insert_bin(
            ERROR_DETAIL_METADATA,
            tonic::metadata::MetadataValue::from_bytes(&detail.encode_to_vec()),
        );
        status
    }

    #[test]
    fn a_detail_becomes_a_typed_refusal() {
        let error = Error::from_status(&status_with(&v1::ErrorDetail {
            code: v1::ErrorCode::NotOwner as i32,
            retry_safe: true,
            retry_after_ms: 25,
            owner_hint: Some(v1::OwnerHint {
                cell_id: "c".into(),
                node_id: "n2".into(),
                endpoint: "https://127.0.0.1:7002".into(),
                epoch: 3,
            }),
            message: "moved".into(),
        }));
        assert_eq!(error.code(), Some(v1::ErrorCode::NotOwner));
        assert_eq!(error.name(), "NOT_OWNER");
        assert!(error.retry_safe());
        assert!(!error.maybe_applied());
        assert_eq!(error.retry_after(), Some(Duration::from_millis(25)));
        assert_eq!(
            error.owner_hint().and_then(|h| h.endpoint.as_deref()),
            Some("https://127.0.0.1:7002")
        );
        let unknown = Error::from_status(&status_with(&v1::ErrorDetail {
            code: v1::ErrorCode::UnknownOutcome as i32,
            retry_safe: true,
            ..Default::default()
        }));
        assert!(unknown.maybe_applied());
    }

    #[test]
    fn a_status_without_detail_is_a_transport_failure_that_may_have_been_delivered() {
        let error = Error::from_status(&tonic::Status::unavailable("connection reset"));
        assert!(matches!(
            error,
            Error::Transport {
                category: Transport::Interrupted,
                ..
            }
        ));
        assert!(error.maybe_applied());
        assert!(error.retry_safe());
        let missing = Error::from_status(&tonic::Status::not_found("no such cell"));
        assert_eq!(missing.name(), "NOT_FOUND");
        assert!(!missing.retry_safe());
    }

    proptest::proptest! {
        /// A server's error detail is untrusted bytes: decoding never panics.
        #[test]
        fn arbitrary_detail_bytes_never_panic(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256),
        ) {
            let mut status = tonic::Status::internal("x");
            status.metadata_mut().insert_bin(
                ERROR_DETAIL_METADATA,
                tonic::metadata::MetadataValue::from_bytes(&bytes),
            );
            let _ = Error::from_status(&status);
        }
    }
}
