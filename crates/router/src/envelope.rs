//! Ingress verification of signed envelopes: size bounds, key lookup, signature over the exact body bytes, body decoding, validity window, authorization.
//!
//! The order is fixed and documented in `proto/cellfleet/v1/envelope.proto`:
//! nothing is decoded from the body before its signature verified (at this
//! node, or for a forward at the ingress that verified it:
//! [`Signature::VerifiedByIngress`]), and nothing that fails any check
//! reaches a Cell. Time comes from an injected [`Clock`], so window tests
//! need no sleeping.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cellfleet_authority::Clock;
use cellfleet_proto::v1;
use prost::Message;

use crate::error::{Error, Result, Window};
use crate::registry::{KeyRegistry, Operation, KEY_ID_BYTES_MAX};
use crate::signing::{self, Domain, SIGNATURE_BYTES};

/// Bytes in a command id.
pub const COMMAND_ID_BYTES: usize = 16;
/// Bound on a kind name.
pub const KIND_BYTES_MAX: usize = 64;
/// Bound on a Cell key.
pub const CELL_KEY_BYTES_MAX: usize = 1024;
/// Bound on a command or query name.
pub const OPERATION_BYTES_MAX: usize = 128;

/// The validity-window and size policy of a cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EnvelopePolicy {
    /// Clock-skew bound: how far in the future `issued_at_ms` may be.
    pub skew_ms: u64,
    /// The longest allowed `expires_at_ms - issued_at_ms`.
    pub max_window_ms: u64,
    /// The largest body accepted.
    pub body_bytes_max: usize,
}

impl Default for EnvelopePolicy {
    fn default() -> Self {
        EnvelopePolicy {
            skew_ms: 500,
            max_window_ms: 10 * 60 * 1000,
            body_bytes_max: 1024 * 1024,
        }
    }
}

/// A command that passed every ingress check.
#[derive(Clone, Debug, PartialEq)]
pub struct VerifiedCommand {
    /// The signing key.
    pub key_id: String,
    /// The Cell's kind.
    pub kind: String,
    /// The Cell's key.
    pub key: Vec<u8>,
    /// The command name.
    pub command: String,
    /// The arguments (a JSON object).
    pub args: serde_json::Value,
    /// The command id.
    pub command_id: [u8; COMMAND_ID_BYTES],
    /// When it was signed.
    pub issued_at_ms: i64,
    /// When it expires.
    pub expires_at_ms: i64,
}

/// A query that passed every ingress check.
#[derive(Clone, Debug, PartialEq)]
pub struct VerifiedQuery {
    /// The signing key.
    pub key_id: String,
    /// The Cell's kind.
    pub kind: String,
    /// The Cell's key.
    pub key: Vec<u8>,
    /// The query name.
    pub query: String,
    /// The arguments (a JSON object).
    pub args: serde_json::Value,
    /// Read-your-writes fence.
    pub min_receipt: Option<v1::Receipt>,
    /// When it expires.
    pub expires_at_ms: i64,
}

/// A resolve request that passed every ingress check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifiedResolve {
    /// The signing key.
    pub key_id: String,
    /// The Cell's kind.
    pub kind: String,
    /// The Cell's key.
    pub key: Vec<u8>,
    /// The command id to resolve.
    pub command_id: [u8; COMMAND_ID_BYTES],
    /// The command's own expiry, when the client sent it (EXPIRED vs ABSENT).
    pub command_expires_at_ms: Option<i64>,
}

/// An admin request that passed every ingress check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifiedAdmin {
    /// The signing key.
    pub key_id: String,
    /// The operation ("drain").
    pub operation: String,
    /// The target node (empty: the receiving node).
    pub node_id: String,
}

/// Whether [`Verifier`] checks an envelope's signature itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Signature {
    /// Verify it (step c of the rule): every client request at its
    /// ingress, and a forward whose ingress did not say it verified it.
    Verify,
    /// Skip step c only: the ingress that forwarded the request verified
    /// it. Only for a request that came through the peer service, which
    /// only nodes reach; every other check still runs here.
    VerifiedByIngress,
}

/// Verifies envelopes against a key registry, a policy and a clock.
#[derive(Clone, Debug)]
pub struct Verifier {
    registry: Arc<KeyRegistry>,
    policy: EnvelopePolicy,
    clock: Arc<dyn Clock>,
    signatures_verified: Arc<AtomicU64>,
}

impl Verifier {
    /// A verifier.
    pub fn new(registry: Arc<KeyRegistry>, policy: EnvelopePolicy, clock: Arc<dyn Clock>) -> Self {
        Verifier {
            registry,
            policy,
            clock,
            signatures_verified: Arc::default(),
        }
    }

    /// This verifier, counting every signature it checks into `counter`
    /// (a node passes its metrics' counter).
    pub fn counting_into(mut self, counter: Arc<AtomicU64>) -> Self {
        self.signatures_verified = counter;
        self
    }

    /// The policy.
    pub fn policy(&self) -> EnvelopePolicy {
        self.policy
    }

    /// Checks an `Execute` envelope (domain `cellfleet.v1.command`).
    pub fn verify_command(&self, envelope: &v1::SignedEnvelope) -> Result<VerifiedCommand> {
        self.check_command(envelope, Signature::Verify)
    }

    /// Checks an `Execute` envelope, its signature as `signature` says.
    pub(crate) fn check_command(
        &self,
        envelope: &v1::SignedEnvelope,
        signature: Signature,
    ) -> Result<VerifiedCommand> {
        let (key, body) =
            self.authenticate::<v1::CommandBody>(Domain::Command, envelope, signature)?;
        check_cell(&body.kind, &body.key)?;
        check_name("command", &body.command)?;
        let command_id = command_id(&body.command_id)?;
        let args = args(&body.args_json)?;
        self.check_window(body.issued_at_ms, body.expires_at_ms)?;
        key.authorize(Operation::Command {
            kind: &body.kind,
            name: &body.command,
        })?;
        Ok(VerifiedCommand {
            key_id: envelope.key_id.clone(),
            kind: body.kind,
            key: body.key,
            command: body.command,
            args,
            command_id,
            issued_at_ms: body.issued_at_ms,
            expires_at_ms: body.expires_at_ms,
        })
    }

    /// Checks a `Query` envelope (domain `cellfleet.v1.query`).
    pub fn verify_query(&self, envelope: &v1::SignedEnvelope) -> Result<VerifiedQuery> {
        self.check_query(envelope, Signature::Verify)
    }

    /// Checks a `Query` envelope, its signature as `signature` says.
    pub(crate) fn check_query(
        &self,
        envelope: &v1::SignedEnvelope,
        signature: Signature,
    ) -> Result<VerifiedQuery> {
        let (key, body) = self.authenticate::<v1::QueryBody>(Domain::Query, envelope, signature)?;
        check_cell(&body.kind, &body.key)?;
        check_name("query", &body.query)?;
        if !body.request_id.is_empty() && body.request_id.len() != COMMAND_ID_BYTES {
            return Err(Error::Malformed(format!(
                "request_id must be empty or {COMMAND_ID_BYTES} bytes, got {}",
                body.request_id.len()
            )));
        }
        let args = args(&body.args_json)?;
        self.check_window(body.issued_at_ms, body.expires_at_ms)?;
        key.authorize(Operation::Query {
            kind: &body.kind,
            name: &body.query,
        })?;
        Ok(VerifiedQuery {
            key_id: envelope.key_id.clone(),
            kind: body.kind,
            key: body.key,
            query: body.query,
            args,
            min_receipt: body.min_receipt,
            expires_at_ms: body.expires_at_ms,
        })
    }

    /// Checks a `Resolve` envelope (domain `cellfleet.v1.resolve`).
    pub fn verify_resolve(&self, envelope: &v1::SignedEnvelope) -> Result<VerifiedResolve> {
        self.check_resolve(envelope, Signature::Verify)
    }

    /// Checks a `Resolve` envelope, its signature as `signature` says.
    pub(crate) fn check_resolve(
        &self,
        envelope: &v1::SignedEnvelope,
        signature: Signature,
    ) -> Result<VerifiedResolve> {
        let (key, body) =
            self.authenticate::<v1::ResolveBody>(Domain::Resolve, envelope, signature)?;
        check_cell(&body.kind, &body.key)?;
        let command_id = command_id(&body.command_id)?;
        self.check_window(body.issued_at_ms, body.expires_at_ms)?;
        let command_expires_at_ms = match body.command_expires_at_ms {
            0 => None,
            ms if ms < 0 => {
                return Err(Error::BadRequest(format!(
                    "command_expires_at_ms {ms} is negative (0 means unknown)"
                )))
            }
            ms => Some(ms),
        };
        key.authorize(Operation::Resolve { kind: &body.kind })?;
        Ok(VerifiedResolve {
            key_id: envelope.key_id.clone(),
            kind: body.kind,
            key: body.key,
            command_id,
            command_expires_at_ms,
        })
    }

    /// Checks an admin envelope (domain `cellfleet.v1.admin`).
    pub fn verify_admin(&self, envelope: &v1::SignedEnvelope) -> Result<VerifiedAdmin> {
        let (key, body) =
            self.authenticate::<v1::AdminBody>(Domain::Admin, envelope, Signature::Verify)?;
        check_name("operation", &body.operation)?;
        self.check_window(body.issued_at_ms, body.expires_at_ms)?;
        key.authorize(Operation::Admin {
            operation: &body.operation,
        })?;
        Ok(VerifiedAdmin {
            key_id: envelope.key_id.clone(),
            operation: body.operation,
            node_id: body.node_id,
        })
    }

    /// Steps a–d of the rule: bounds, key, signature (unless the ingress
    /// verified it), then decoding.
    fn authenticate<B: Message + Default>(
        &self,
        domain: Domain,
        envelope: &v1::SignedEnvelope,
        signature: Signature,
    ) -> Result<(&crate::registry::RegisteredKey, B)> {
        if envelope.body.len() > self.policy.body_bytes_max {
            return Err(Error::Malformed(format!(
                "body of {} bytes exceeds the {} byte limit",
                envelope.body.len(),
                self.policy.body_bytes_max
            )));
        }
        if envelope.signature.is_empty() {
            return Err(Error::Unsigned("the envelope has no signature"));
        }
        if envelope.key_id.is_empty() {
            return Err(Error::Unsigned("the envelope has no key id"));
        }
        if envelope.key_id.len() > KEY_ID_BYTES_MAX {
            return Err(Error::Malformed(format!(
                "key id of {} bytes exceeds {KEY_ID_BYTES_MAX}",
                envelope.key_id.len()
            )));
        }
        if envelope.signature.len() != SIGNATURE_BYTES {
            return Err(Error::Malformed(format!(
                "signature must be {SIGNATURE_BYTES} bytes, got {}",
                envelope.signature.len()
            )));
        }
        let key = self.registry.get(&envelope.key_id)?;
        if signature == Signature::Verify {
            self.signatures_verified.fetch_add(1, Ordering::Relaxed);
            signing::verify(
                domain,
                &envelope.body,
                &envelope.signature,
                &envelope.key_id,
                &key.public_key,
            )?;
        }
        let body = B::decode(envelope.body.as_slice())
            .map_err(|e| Error::Malformed(format!("body does not decode: {e}")))?;
        Ok((key, body))
    }

    /// Step e of the rule.
    fn check_window(&self, issued_at_ms: i64, expires_at_ms: i64) -> Result<()> {
        let now_ms = i64::try_from(self.clock.now_wall_ms()).unwrap_or(i64::MAX);
        check_window(self.policy, issued_at_ms, expires_at_ms, now_ms)
    }
}

/// The validity-window rule as a pure function (wide arithmetic: no
/// overflow for any input).
pub fn check_window(
    policy: EnvelopePolicy,
    issued_at_ms: i64,
    expires_at_ms: i64,
    now_ms: i64,
) -> Result<()> {
    let window = Window {
        issued_at_ms,
        expires_at_ms,
        now_ms,
    };
    let (issued, expires, now) = (
        i128::from(issued_at_ms),
        i128::from(expires_at_ms),
        i128::from(now_ms),
    );
    if issued >= expires {
        return Err(Error::Malformed(format!(
            "issued_at_ms must be before expires_at_ms ({window})"
        )));
    }
    if expires - issued > i128::from(policy.max_window_ms) {
        return Err(Error::WindowTooLong {
            window_ms: expires - issued,
            max_window_ms: policy.max_window_ms,
        });
    }
    if issued > now + i128::from(policy.skew_ms) {
        return Err(Error::FutureDated {
            window,
            skew_ms: policy.skew_ms,
        });
    }
    if now > expires {
        return Err(Error::Expired(window));
    }
    Ok(())
}

fn check_cell(kind: &str, key: &[u8]) -> Result<()> {
    if kind.is_empty() || kind.len() > KIND_BYTES_MAX {
        return Err(Error::Malformed(format!(
            "kind must be 1..={KIND_BYTES_MAX} bytes, got {}",
            kind.len()
        )));
    }
    if key.is_empty() || key.len() > CELL_KEY_BYTES_MAX {
        return Err(Error::Malformed(format!(
            "key must be 1..={CELL_KEY_BYTES_MAX} bytes, got {}",
            key.len()
        )));
    }
    Ok(())
}

fn check_name(what: &str, name: &str) -> Result<()> {
    if name.is_empty() || name.len() > OPERATION_BYTES_MAX {
        return Err(Error::Malformed(format!(
            "{what} name must be 1..={OPERATION_BYTES_MAX} bytes, got {}",
            name.len()
        )));
    }
    Ok(())
}

fn command_id(bytes: &[u8]) -> Result<[u8; COMMAND_ID_BYTES]> {
    bytes.try_into().map_err(|_| {
        Error::Malformed(format!(
            "command_id must be {COMMAND_ID_BYTES} bytes, got {}",
            bytes.len()
        ))
    })
}

fn args(json: &[u8]) -> Result<serde_json::Value> {
    if json.is_empty() {
        return Ok(serde_json::Value::Object(Default::default()));
    }
    match serde_json::from_slice::<serde_json::Value>(json) {
        Ok(value @ serde_json::Value::Object(_)) => Ok(value),
        Ok(_) => Err(Error::Malformed("args_json must be a JSON object".into())),
        Err(e) => Err(Error::Malformed(format!("args_json is not JSON: {e}"))),
    }
}

#[cfg(test)]
mod tests;
