//! The signing rule: Ed25519 over `TAG || BODY`, and the private key file format (PKCS#8 PEM).
//!
//! The rule, documented for other languages in
//! `proto/cellfleet/v1/envelope.proto`: the signed message is `TAG || BODY`,
//! where `TAG` is the call's ASCII domain tag followed by one zero byte and
//! `BODY` the exact serialized body bytes; the signature is pure Ed25519
//! (RFC 8032). Nodes verify it strictly.

use std::path::Path;

use cellfleet_proto::v1;
use ed25519_dalek::pkcs8::DecodePrivateKey;
use ed25519_dalek::{Signer, SigningKey};

/// Bytes in an Ed25519 signature.
pub const SIGNATURE_BYTES: usize = 64;

/// Which call a signature is for. Each has its own tag so a signature for
/// one call can never be replayed as another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Domain {
    /// `Client.Execute`, body `CommandBody`.
    Command,
    /// `Client.Query`, body `QueryBody`.
    Query,
    /// `Client.Resolve`, body `ResolveBody`.
    Resolve,
    /// `Admin.Drain`, body `AdminBody`.
    Admin,
}

impl Domain {
    /// The tag bytes prepended to the body, zero byte included.
    pub fn tag(self) -> &'static [u8] {
        match self {
            Domain::Command => b"cellfleet.v1.command\0",
            Domain::Query => b"cellfleet.v1.query\0",
            Domain::Resolve => b"cellfleet.v1.resolve\0",
            Domain::Admin => b"cellfleet.v1.admin\0",
        }
    }

    /// The tag without its zero byte (for messages).
    pub fn name(self) -> &'static str {
        match self {
            Domain::Command => "cellfleet.v1.command",
            Domain::Query => "cellfleet.v1.query",
            Domain::Resolve => "cellfleet.v1.resolve",
            Domain::Admin => "cellfleet.v1.admin",
        }
    }
}

/// The signed message: `TAG || body`.
pub fn signed_message(domain: Domain, body: &[u8]) -> Vec<u8> {
    let mut message = Vec::with_capacity(domain.tag().len() + body.len());
    message.extend_from_slice(domain.tag());
    message.extend_from_slice(body);
    message
}

/// Signs `body` for `domain`.
pub fn sign(domain: Domain, body: &[u8], key: &SigningKey) -> [u8; SIGNATURE_BYTES] {
    key.sign(&signed_message(domain, body)).to_bytes()
}

/// Wraps already-serialized body bytes into a signed envelope.
///
/// What a node checks, step by step (any language can do the same):
///
/// ```
/// use cellfleet_client::signing::{seal, signed_message, Domain};
/// use ed25519_dalek::{Signature, SigningKey, Verifier};
///
/// let key = SigningKey::from_bytes(&[7; 32]);
/// let body = b"serialized CommandBody bytes".to_vec();
/// let envelope = seal(Domain::Command, body.clone(), "app-1", &key);
/// assert_eq!(envelope.key_id, "app-1");
///
/// let signature = Signature::from_slice(&envelope.signature).unwrap();
/// let message = signed_message(Domain::Command, &envelope.body);
/// assert!(message.starts_with(b"cellfleet.v1.command\0"));
/// assert!(key.verifying_key().verify(&message, &signature).is_ok());
/// // The same bytes under another call's tag do not verify: no replay
/// // of a command's signature as a query.
/// let as_query = signed_message(Domain::Query, &envelope.body);
/// assert!(key.verifying_key().verify(&as_query, &signature).is_err());
/// ```
pub fn seal(domain: Domain, body: Vec<u8>, key_id: &str, key: &SigningKey) -> v1::SignedEnvelope {
    let signature = sign(domain, &body, key).to_vec();
    v1::SignedEnvelope {
        body,
        signature,
        key_id: key_id.to_owned(),
    }
}

/// Reads a PKCS#8 PEM Ed25519 private key (as `cellfleet keys new` writes it).
///
/// ```no_run
/// let key = cellfleet_client::signing::read_signing_key(".cellfleet-dev/dev.ed25519.pem".as_ref())?;
/// println!("public key {:02x?}", key.verifying_key().to_bytes());
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn read_signing_key(path: &Path) -> std::io::Result<SigningKey> {
    let text = std::fs::read_to_string(path)?;
    SigningKey::from_pkcs8_pem(&text).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{}: not a PKCS#8 Ed25519 private key: {e}", path.display()),
        )
    })
}
