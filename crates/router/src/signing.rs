//! Ed25519 signatures under domain tags, and the private key file format (PKCS#8 PEM, mode 0600).
//!
//! The rule (documented for other languages in
//! `proto/cellfleet/v1/envelope.proto`): the signed message is
//! `TAG || BODY`, where `TAG` is the call's ASCII domain tag followed by one
//! zero byte and `BODY` the exact serialized body bytes; the signature is
//! pure Ed25519 (RFC 8032). Verification is strict (`verify_strict`: no
//! small-order keys, canonical `S`).

use std::path::Path;

use ed25519_dalek::pkcs8::EncodePrivateKey;
use ed25519_dalek::{Signature, SigningKey, VerifyingKey};

use crate::error::{Error, Result};

pub use cellfleet_client::signing::{
    read_signing_key, seal, sign, signed_message, Domain, SIGNATURE_BYTES,
};

/// Checks `signature` over `TAG || body` with `key` (strict RFC 8032).
pub fn verify(
    domain: Domain,
    body: &[u8],
    signature: &[u8],
    key_id: &str,
    key: &VerifyingKey,
) -> Result<()> {
    let bad = || Error::BadSignature {
        key_id: key_id.to_owned(),
        domain: domain.name(),
    };
    let bytes: [u8; SIGNATURE_BYTES] = signature.try_into().map_err(|_| bad())?;
    let signature = Signature::from_bytes(&bytes);
    key.verify_strict(&signed_message(domain, body), &signature)
        .map_err(|_| bad())
}

/// A fresh signing key from the operating system's randomness.
pub fn generate_signing_key() -> SigningKey {
    let seed: [u8; 32] = rand::random();
    SigningKey::from_bytes(&seed)
}

/// The public key as 64 lowercase hex characters (the registry's form).
pub fn public_key_hex(key: &VerifyingKey) -> String {
    hex(key.as_bytes())
}

/// Parses a registry public key (64 hex characters).
pub fn parse_public_key(text: &str) -> Result<VerifyingKey, String> {
    let text = text.trim();
    if text.len() != 64 || !text.is_ascii() {
        return Err(format!("expected 64 hex characters, got {:?}", text));
    }
    let mut bytes = [0u8; 32];
    for (i, byte) in bytes.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16)
            .map_err(|_| format!("not hex: {text:?}"))?;
    }
    VerifyingKey::from_bytes(&bytes).map_err(|e| format!("not an Ed25519 public key: {e}"))
}

/// Writes `key` as PKCS#8 PEM, readable by its owner only (mode 0600 from
/// creation on Unix, so the key is never briefly world-readable). Refuses
/// to overwrite an existing file.
pub fn write_signing_key(path: &Path, key: &SigningKey) -> std::io::Result<()> {
    // PKCS#8 v1 (no embedded public key): the form OpenSSL writes and every
    // library reads (Python's `cryptography` refuses the v2 form).
    let pem = ed25519_dalek::pkcs8::KeypairBytes {
        secret_key: key.to_bytes(),
        public_key: None,
    }
    .to_pkcs8_pem(Default::default())
    .map_err(|e| std::io::Error::other(format!("encode PKCS#8: {e}")))?;
    crate::certs::write_private_file(path, pem.as_bytes())
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::Signer;

    #[test]
    fn signature_binds_domain_and_exact_body() {
        let key = SigningKey::from_bytes(&[7; 32]);
        let public = key.verifying_key();
        let body = b"\x0a\x02kv".to_vec();
        let signature = sign(Domain::Command, &body, &key);
        verify(Domain::Command, &body, &signature, "k", &public).expect("valid");
        assert!(matches!(
            verify(Domain::Query, &body, &signature, "k", &public),
            Err(Error::BadSignature {
                domain: "cellfleet.v1.query",
                ..
            })
        ));
        let mut tampered = body.clone();
        tampered[2] ^= 1;
        assert!(verify(Domain::Command, &tampered, &signature, "k", &public).is_err());
        assert!(verify(Domain::Command, &body, &signature[..63], "k", &public).is_err());
    }

    /// RFC 8032 test vector 2 (one-byte message): our rule is plain Ed25519
    /// over `tag || body`, so with an empty tag it must match the RFC.
    #[test]
    fn matches_rfc8032_vector() {
        let seed: [u8; 32] = {
            let text = "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb";
            let mut out = [0u8; 32];
            for (i, b) in out.iter_mut().enumerate() {
                *b = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).expect("hex");
            }
            out
        };
        let key = SigningKey::from_bytes(&seed);
        assert_eq!(
            public_key_hex(&key.verifying_key()),
            "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c"
        );
        assert_eq!(
            hex(&key.sign(&[0x72]).to_bytes()),
            "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da\
             085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00"
        );
    }

    #[test]
    fn key_file_round_trip_is_private() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("alice.key");
        let key = generate_signing_key();
        write_signing_key(&path, &key).expect("write");
        assert_eq!(
            read_signing_key(&path).expect("read").to_bytes(),
            key.to_bytes()
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).expect("stat").permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        assert!(write_signing_key(&path, &key).is_err(), "never overwrites");
    }

    #[test]
    fn public_key_hex_round_trip() {
        let key = generate_signing_key().verifying_key();
        assert_eq!(parse_public_key(&public_key_hex(&key)), Ok(key));
        assert!(parse_public_key("zz").is_err());
        assert!(parse_public_key(&"g".repeat(64)).is_err());
    }
}
