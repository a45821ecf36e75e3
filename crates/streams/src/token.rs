//! Bearer tokens for the Durable Streams listener: a compact JWT signed with EdDSA (Ed25519) by a key of the node's key registry, granting operations on stream path prefixes until an expiry.
//!
//! ```text
//! base64url(header) "." base64url(claims) "." base64url(signature)
//! header: {"alg":"EdDSA","typ":"JWT","kid":"<registry key id>"}
//! claims: {"iat":<s>,"exp":<s>,"prefixes":["/v1/stream/app/"],"ops":["read","append"]}
//!         optional "nbf" (seconds) and "sub" (a label for logs)
//! ```
//!
//! [`verify`] is a pure function of the token, the keys and the time: the
//! signature is checked before the claims are parsed, every claim is
//! bounded, and the signing key must itself be allowed to grant each of
//! the token's prefixes (a registry entry's `stream_token_prefixes`), so a
//! token never reaches further than the key that signed it. A token is a
//! bearer credential: whoever holds it may use it until `exp`; remove its
//! key from the registry to revoke every token the key signed.

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};

/// Longest token accepted, in bytes.
pub const TOKEN_BYTES_MAX: usize = 4096;
/// Most path prefixes in one token.
pub const PREFIXES_MAX: usize = 16;
/// Longest path prefix, in bytes.
pub const PREFIX_BYTES_MAX: usize = 1024;
/// Longest key id, in bytes (as the key registry's bound).
pub const KEY_ID_BYTES_MAX: usize = 128;
/// Longest `sub` label, in bytes.
pub const SUBJECT_BYTES_MAX: usize = 256;
/// Longest lifetime (`exp - iat`): 400 days.
pub const LIFETIME_S_MAX: i64 = 400 * 24 * 3600;
/// The algorithm name in the header (RFC 8037).
pub const ALGORITHM: &str = "EdDSA";
/// The query parameter that may carry the token where a header cannot
/// (a browser's `EventSource`); RFC 6750 §2.3's name.
pub const QUERY_PARAMETER: &str = "access_token";

/// What a token may do on the paths it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// GET and HEAD of a stream: catch-up reads, long-poll and SSE.
    Read,
    /// POST to a stream: appends (and closing it).
    Append,
    /// PUT of a stream.
    Create,
    /// DELETE of a stream.
    Delete,
    /// The subscription routes under `<prefix>/__ds/` (create, inspect,
    /// delete, link streams, claim wakes).
    Subscribe,
}

impl Op {
    /// Every operation, in claim order.
    pub const ALL: [Op; 5] = [Op::Read, Op::Append, Op::Create, Op::Delete, Op::Subscribe];

    /// The claim name.
    pub fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Append => "append",
            Op::Create => "create",
            Op::Delete => "delete",
            Op::Subscribe => "subscribe",
        }
    }

    /// The operation named `name`.
    pub fn parse(name: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|op| op.name() == name)
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The claims a token carries (times in seconds since the Unix epoch, as JWT's NumericDate).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Claims {
    /// Issued at.
    pub iat: i64,
    /// Expires at: refused from this second on.
    pub exp: i64,
    /// Not before (optional).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbf: Option<i64>,
    /// A label for logs (optional; not checked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub: Option<String>,
    /// Path prefixes the operations apply to (`/v1/stream/app/`).
    pub prefixes: Vec<String>,
    /// The operations granted.
    pub ops: Vec<Op>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    alg: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    typ: Option<String>,
    kid: String,
}

/// A registry key as a token verifier needs it.
#[derive(Clone, Debug)]
pub struct TokenKey {
    /// The Ed25519 public key.
    pub public_key: VerifyingKey,
    /// The path prefixes this key may grant (none: it signs no tokens).
    pub prefixes: Vec<String>,
}

/// Where a verifier finds signing keys by id.
pub trait TokenKeys: Send + Sync + std::fmt::Debug {
    /// The key `key_id`, if the registry has it.
    fn token_key(&self, key_id: &str) -> Option<TokenKey>;
}

/// Why a token is not valid (HTTP 401, `error="invalid_token"`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// No token in the request.
    #[error("no bearer token; send `Authorization: Bearer <token>` (mint one with `cellfleet keys token`)")]
    Missing,
    /// Not a well-formed token.
    #[error("malformed token: {0}")]
    Malformed(&'static str),
    /// The header names another algorithm.
    #[error("unsupported token algorithm {0:?}; tokens are signed with EdDSA")]
    Algorithm(String),
    /// No registry key has the header's `kid`.
    #[error("no key {0:?} in this node's key registry")]
    UnknownKey(String),
    /// The signature does not verify with the named key.
    #[error("the token's signature does not verify with key {0:?}")]
    Signature(String),
    /// A claim is out of bounds.
    #[error("bad token claims: {0}")]
    Claims(String),
    /// Past `exp` (beyond the allowed clock skew).
    #[error("the token expired at {exp} (unix seconds); mint a new one")]
    Expired {
        /// Its expiry.
        exp: i64,
    },
    /// Before `nbf` or `iat` (beyond the allowed clock skew).
    #[error("the token is not valid before {at} (unix seconds); check the clocks")]
    NotYetValid {
        /// When it becomes valid.
        at: i64,
    },
    /// The signing key may not grant one of the token's prefixes.
    #[error("key {key_id:?} may not grant the prefix {prefix:?} (its registry entry's stream_token_prefixes)")]
    KeyMayNotGrant {
        /// The key.
        key_id: String,
        /// The prefix outside its grant.
        prefix: String,
    },
}

/// Why a valid token does not allow a request (HTTP 403, `error="insufficient_scope"`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// No prefix of the token covers the path.
    #[error("the token grants no prefix of {path:?}")]
    Path {
        /// The request's path.
        path: String,
    },
    /// The token does not grant the operation.
    #[error("the token does not grant \"{op}\"")]
    Op {
        /// The operation the request needs.
        op: Op,
    },
}

/// What a verified token allows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The key that signed it.
    pub key_id: String,
    /// Its `sub` label, if any.
    pub subject: Option<String>,
    /// The path prefixes.
    pub prefixes: Vec<String>,
    ops: u8,
    /// When it expires (unix seconds).
    pub exp: i64,
}

impl Grant {
    /// Whether the grant has `op`.
    pub fn has(&self, op: Op) -> bool {
        self.ops & op.bit() != 0
    }

    /// Whether `op` on `path` is allowed.
    pub fn allows(&self, path: &str, op: Op) -> Result<(), Denied> {
        if !self.prefixes.iter().any(|p| path.starts_with(p.as_str())) {
            return Err(Denied::Path {
                path: path.to_owned(),
            });
        }
        if !self.has(op) {
            return Err(Denied::Op { op });
        }
        Ok(())
    }
}

fn check_prefix(prefix: &str) -> Result<(), String> {
    if !prefix.starts_with('/') {
        return Err(format!("prefix {prefix:?} must start with '/'"));
    }
    if prefix.len() > PREFIX_BYTES_MAX {
        return Err(format!("a prefix is longer than {PREFIX_BYTES_MAX} bytes"));
    }
    if prefix.chars().any(|c| c.is_control() || c == ' ') {
        return Err(format!(
            "prefix {prefix:?} has a space or a control character"
        ));
    }
    Ok(())
}

/// Checks the claims' own bounds (not the time, not the key).
pub fn check_claims(claims: &Claims) -> Result<(), TokenError> {
    let bad = |m: String| Err(TokenError::Claims(m));
    if claims.prefixes.is_empty() || claims.prefixes.len() > PREFIXES_MAX {
        return bad(format!(
            "1 to {PREFIXES_MAX} prefixes, not {}",
            claims.prefixes.len()
        ));
    }
    for prefix in &claims.prefixes {
        check_prefix(prefix).or_else(bad)?;
    }
    if claims.ops.is_empty() {
        return bad("no operations".into());
    }
    if claims.exp <= claims.iat {
        return bad("exp is not after iat".into());
    }
    if claims.exp - claims.iat > LIFETIME_S_MAX {
        return bad(format!("lifetime over {} days", LIFETIME_S_MAX / 86_400));
    }
    if claims.nbf.is_some_and(|nbf| nbf >= claims.exp) {
        return bad("nbf is not before exp".into());
    }
    if claims
        .sub
        .as_ref()
        .is_some_and(|s| s.len() > SUBJECT_BYTES_MAX)
    {
        return bad(format!("sub is longer than {SUBJECT_BYTES_MAX} bytes"));
    }
    Ok(())
}

/// Checks a registry entry's `stream_token_prefixes` (as a token's prefixes).
pub fn check_key_prefixes(prefixes: &[String]) -> Result<(), String> {
    prefixes.iter().try_for_each(|p| check_prefix(p))
}

/// Signs `claims` with `key` under key id `key_id`.
pub fn mint(key: &SigningKey, key_id: &str, claims: &Claims) -> Result<String, TokenError> {
    check_claims(claims)?;
    if key_id.is_empty() || key_id.len() > KEY_ID_BYTES_MAX {
        return Err(TokenError::Malformed("key id must be 1 to 128 bytes"));
    }
    let header = Header {
        alg: ALGORITHM.into(),
        typ: Some("JWT".into()),
        kid: key_id.into(),
    };
    let mut token = B64.encode(serde_json::to_vec(&header).expect("a header serializes"));
    token.push('.');
    token.push_str(&B64.encode(serde_json::to_vec(claims).expect("claims serialize")));
    let signature = key.sign(token.as_bytes());
    token.push('.');
    token.push_str(&B64.encode(signature.to_bytes()));
    if token.len() > TOKEN_BYTES_MAX {
        return Err(TokenError::Malformed("longer than 4096 bytes"));
    }
    Ok(token)
}

fn decode_part(part: &str, max: usize) -> Result<Vec<u8>, TokenError> {
    if part.len() > max.div_ceil(3) * 4 {
        return Err(TokenError::Malformed("a part is too long"));
    }
    B64.decode(part)
        .map_err(|_| TokenError::Malformed("a part is not unpadded base64url"))
}

/// Verifies `token` at `now_ms`, allowing `skew_ms` of clock difference
/// with its issuer: the header (EdDSA, a known `kid`), the signature over
/// `header.claims`, then the claims (bounds, `iat`/`nbf`/`exp`) and the
/// key's right to grant each prefix.
pub fn verify(
    token: &str,
    keys: &dyn TokenKeys,
    now_ms: i64,
    skew_ms: i64,
) -> Result<Grant, TokenError> {
    if token.is_empty() {
        return Err(TokenError::Missing);
    }
    if token.len() > TOKEN_BYTES_MAX {
        return Err(TokenError::Malformed("longer than 4096 bytes"));
    }
    let mut parts = token.split('.');
    let (Some(header_b64), Some(claims_b64), Some(signature_b64), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(TokenError::Malformed("not three dot-separated parts"));
    };
    let header: Header = serde_json::from_slice(&decode_part(header_b64, 1024)?)
        .map_err(|_| TokenError::Malformed("the header is not the expected JSON"))?;
    if header.alg != ALGORITHM {
        return Err(TokenError::Algorithm(header.alg));
    }
    if header.typ.as_deref().is_some_and(|t| t != "JWT") {
        return Err(TokenError::Malformed("typ is not JWT"));
    }
    if header.kid.is_empty() || header.kid.len() > KEY_ID_BYTES_MAX {
        return Err(TokenError::Malformed("kid must be 1 to 128 bytes"));
    }
    let key = keys
        .token_key(&header.kid)
        .ok_or_else(|| TokenError::UnknownKey(header.kid.clone()))?;
    let signature_bytes: [u8; 64] = decode_part(signature_b64, 64)?
        .try_into()
        .map_err(|_| TokenError::Malformed("the signature is not 64 bytes"))?;
    let signed = &token[..header_b64.len() + 1 + claims_b64.len()];
    key.public_key
        .verify_strict(signed.as_bytes(), &Signature::from_bytes(&signature_bytes))
        .map_err(|_| TokenError::Signature(header.kid.clone()))?;
    let claims: Claims = serde_json::from_slice(&decode_part(claims_b64, TOKEN_BYTES_MAX)?)
        .map_err(|e| TokenError::Claims(format!("not the expected JSON: {e}")))?;
    check_claims(&claims)?;
    let now = now_ms.div_euclid(1000);
    let skew = skew_ms.max(0).div_euclid(1000) + 1;
    if now >= claims.exp.saturating_add(skew) {
        return Err(TokenError::Expired { exp: claims.exp });
    }
    let valid_from = claims.nbf.unwrap_or(claims.iat).max(claims.iat);
    if valid_from > now.saturating_add(skew) {
        return Err(TokenError::NotYetValid { at: valid_from });
    }
    for prefix in &claims.prefixes {
        if !key.prefixes.iter().any(|k| prefix.starts_with(k.as_str())) {
            return Err(TokenError::KeyMayNotGrant {
                key_id: header.kid,
                prefix: prefix.clone(),
            });
        }
    }
    Ok(Grant {
        key_id: header.kid,
        subject: claims.sub,
        prefixes: claims.prefixes,
        ops: claims.ops.iter().fold(0, |bits, op| bits | op.bit()),
        exp: claims.exp,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[derive(Debug, Default)]
    struct Keys(HashMap<String, TokenKey>);

    impl TokenKeys for Keys {
        fn token_key(&self, key_id: &str) -> Option<TokenKey> {
            self.0.get(key_id).cloned()
        }
    }

    const NOW_MS: i64 = 1_800_000_000_000;
    const NOW: i64 = NOW_MS / 1000;

    fn signing(seed: u8) -> SigningKey {
        SigningKey::from_bytes(&[seed; 32])
    }

    fn keys() -> Keys {
        let mut map = HashMap::new();
        map.insert(
            "app".to_owned(),
            TokenKey {
                public_key: signing(1).verifying_key(),
                prefixes: vec!["/v1/stream/app/".into()],
            },
        );
        map.insert(
            "none".to_owned(),
            TokenKey {
                public_key: signing(2).verifying_key(),
                prefixes: vec![],
            },
        );
        Keys(map)
    }

    fn claims() -> Claims {
        Claims {
            iat: NOW - 10,
            exp: NOW + 3600,
            nbf: None,
            sub: Some("worker-7".into()),
            prefixes: vec!["/v1/stream/app/rooms/".into()],
            ops: vec![Op::Read, Op::Append],
        }
    }

    fn token(claims: &Claims) -> String {
        mint(&signing(1), "app", claims).unwrap()
    }

    #[test]
    fn a_minted_token_verifies_and_grants_exactly_its_claims() {
        let grant = verify(&token(&claims()), &keys(), NOW_MS, 500).unwrap();
        assert_eq!(grant.key_id, "app");
        assert_eq!(grant.subject.as_deref(), Some("worker-7"));
        assert!(grant.allows("/v1/stream/app/rooms/lobby", Op::Read).is_ok());
        assert!(grant
            .allows("/v1/stream/app/rooms/lobby", Op::Append)
            .is_ok());
        assert_eq!(
            grant.allows("/v1/stream/app/rooms/lobby", Op::Delete),
            Err(Denied::Op { op: Op::Delete })
        );
        assert!(matches!(
            grant.allows("/v1/stream/app/other", Op::Read),
            Err(Denied::Path { .. })
        ));
    }

    #[test]
    fn every_time_bound_is_checked_with_the_skew() {
        let t = token(&claims());
        let exp_ms = (NOW + 3600) * 1000;
        assert!(verify(&t, &keys(), exp_ms - 1, 0).is_ok());
        assert_eq!(
            verify(&t, &keys(), exp_ms + 1000, 0),
            Err(TokenError::Expired { exp: NOW + 3600 })
        );
        assert!(verify(&t, &keys(), exp_ms + 1000, 1500).is_ok());
        let mut future = claims();
        future.iat = NOW + 60;
        future.exp = NOW + 120;
        assert_eq!(
            verify(&token(&future), &keys(), NOW_MS, 500),
            Err(TokenError::NotYetValid { at: NOW + 60 })
        );
        let mut later = claims();
        later.nbf = Some(NOW + 30);
        assert_eq!(
            verify(&token(&later), &keys(), NOW_MS, 500),
            Err(TokenError::NotYetValid { at: NOW + 30 })
        );
        assert!(verify(&token(&later), &keys(), (NOW + 30) * 1000, 0).is_ok());
    }

    #[test]
    fn keys_and_signatures_are_checked() {
        let t = token(&claims());
        assert_eq!(
            verify(&t, &Keys::default(), NOW_MS, 0),
            Err(TokenError::UnknownKey("app".into()))
        );
        let forged = mint(&signing(9), "app", &claims()).unwrap();
        assert_eq!(
            verify(&forged, &keys(), NOW_MS, 0),
            Err(TokenError::Signature("app".into()))
        );
        let by_none = mint(&signing(2), "none", &claims()).unwrap();
        assert!(matches!(
            verify(&by_none, &keys(), NOW_MS, 0),
            Err(TokenError::KeyMayNotGrant { .. })
        ));
        let mut wide = claims();
        wide.prefixes = vec!["/v1/stream/".into()];
        assert!(matches!(
            verify(&token(&wide), &keys(), NOW_MS, 0),
            Err(TokenError::KeyMayNotGrant { .. })
        ));
    }

    #[test]
    fn other_algorithms_and_swapped_claims_are_refused() {
        let t = token(&claims());
        let (_, rest) = t.split_once('.').unwrap();
        let none = format!("{}.{rest}", B64.encode(br#"{"alg":"none","kid":"app"}"#));
        assert_eq!(
            verify(&none, &keys(), NOW_MS, 0),
            Err(TokenError::Algorithm("none".into()))
        );
        // The claims of another token under this one's signature.
        let mut wider = claims();
        wider.ops = Op::ALL.to_vec();
        let other = token(&wider);
        let parts: Vec<&str> = t.split('.').collect();
        let other_parts: Vec<&str> = other.split('.').collect();
        let spliced = format!("{}.{}.{}", parts[0], other_parts[1], parts[2]);
        assert_eq!(
            verify(&spliced, &keys(), NOW_MS, 0),
            Err(TokenError::Signature("app".into()))
        );
    }

    #[test]
    fn claim_bounds_are_enforced_at_mint_and_at_verify() {
        type Change = Box<dyn Fn(&mut Claims)>;
        let cases: Vec<(&str, Change)> = vec![
            ("no prefixes", Box::new(|c| c.prefixes.clear())),
            (
                "too many prefixes",
                Box::new(|c| c.prefixes = vec!["/a".into(); 17]),
            ),
            (
                "relative prefix",
                Box::new(|c| c.prefixes = vec!["v1/".into()]),
            ),
            (
                "long prefix",
                Box::new(|c| c.prefixes = vec![format!("/{}", "a".repeat(1024))]),
            ),
            (
                "control char",
                Box::new(|c| c.prefixes = vec!["/a\n".into()]),
            ),
            ("no ops", Box::new(|c| c.ops.clear())),
            ("exp before iat", Box::new(|c| c.exp = c.iat)),
            (
                "too long a life",
                Box::new(|c| c.exp = c.iat + LIFETIME_S_MAX + 1),
            ),
            ("nbf after exp", Box::new(|c| c.nbf = Some(c.exp))),
            ("long sub", Box::new(|c| c.sub = Some("s".repeat(257)))),
        ];
        for (name, change) in cases {
            let mut c = claims();
            change(&mut c);
            assert!(
                matches!(mint(&signing(1), "app", &c), Err(TokenError::Claims(_))),
                "{name}: minted"
            );
            // The same claims signed by hand are refused by the verifier.
            let header = B64.encode(br#"{"alg":"EdDSA","typ":"JWT","kid":"app"}"#);
            let body = B64.encode(serde_json::to_vec(&c).unwrap());
            let signed = format!("{header}.{body}");
            let sig = B64.encode(signing(1).sign(signed.as_bytes()).to_bytes());
            assert!(
                matches!(
                    verify(&format!("{signed}.{sig}"), &keys(), NOW_MS, 0),
                    Err(TokenError::Claims(_))
                ),
                "{name}: verified"
            );
        }
    }

    #[test]
    fn unknown_operations_and_fields_are_refused() {
        let header = B64.encode(br#"{"alg":"EdDSA","kid":"app"}"#);
        for body in [
            format!(
                r#"{{"iat":{NOW},"exp":{},"prefixes":["/v1/stream/app/"],"ops":["admin"]}}"#,
                NOW + 60
            ),
            format!(
                r#"{{"iat":{NOW},"exp":{},"prefixes":["/v1/stream/app/"],"ops":["read"],"x":1}}"#,
                NOW + 60
            ),
            format!(
                r#"{{"exp":{},"prefixes":["/v1/stream/app/"],"ops":["read"]}}"#,
                NOW + 60
            ),
        ] {
            let signed = format!("{header}.{}", B64.encode(body.as_bytes()));
            let sig = B64.encode(signing(1).sign(signed.as_bytes()).to_bytes());
            assert!(
                matches!(
                    verify(&format!("{signed}.{sig}"), &keys(), NOW_MS, 0),
                    Err(TokenError::Claims(_))
                ),
                "{body}"
            );
        }
    }

    proptest! {
        /// Arbitrary bytes never panic and never verify.
        #[test]
        fn arbitrary_input_never_panics_or_verifies(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let text = String::from_utf8_lossy(&bytes);
            prop_assert!(verify(&text, &keys(), NOW_MS, 500).is_err());
        }

        /// Three base64url parts of arbitrary bytes never panic and never verify.
        #[test]
        fn arbitrary_parts_never_verify(
            a in proptest::collection::vec(any::<u8>(), 0..200),
            b in proptest::collection::vec(any::<u8>(), 0..400),
            c in proptest::collection::vec(any::<u8>(), 0..80),
        ) {
            let text = format!("{}.{}.{}", B64.encode(&a), B64.encode(&b), B64.encode(&c));
            prop_assert!(verify(&text, &keys(), NOW_MS, 500).is_err());
        }

        /// Changing any one byte of a valid token makes it refused (or,
        /// where base64url has slack in its last character, leaves the
        /// decoded token identical).
        #[test]
        fn any_one_byte_changed_is_refused(at in 0usize..1000, to in any::<u8>()) {
            let t = token(&claims());
            let mut bytes = t.clone().into_bytes();
            let at = at % bytes.len();
            prop_assume!(bytes[at] != to);
            bytes[at] = to;
            let changed = String::from_utf8_lossy(&bytes).into_owned();
            if let Ok(grant) = verify(&changed, &keys(), NOW_MS, 500) {
                let decode = |s: &str| s.split('.').map(|p| B64.decode(p).ok()).collect::<Vec<_>>();
                prop_assert_eq!(decode(&changed), decode(&t));
                prop_assert_eq!(grant, verify(&t, &keys(), NOW_MS, 500).unwrap());
            }
        }

        /// Whatever the claims, a token verifies exactly when they are in
        /// bounds, its time has come and its key may grant the prefixes;
        /// and then it grants exactly the operations it names.
        #[test]
        fn verification_matches_the_claims(
            iat_off in -1000i64..1000,
            life in 1i64..5000,
            ops in proptest::collection::vec(0usize..5, 1..6),
            tail in "[a-z/]{0,12}",
            inside in any::<bool>(),
        ) {
            let prefix = if inside { format!("/v1/stream/app/{tail}") } else { format!("/v1/other/{tail}") };
            let c = Claims {
                iat: NOW + iat_off,
                exp: NOW + iat_off + life,
                nbf: None,
                sub: None,
                prefixes: vec![prefix.clone()],
                ops: ops.iter().map(|&i| Op::ALL[i]).collect(),
            };
            let result = verify(&token(&c), &keys(), NOW_MS, 0);
            let timely = NOW < c.exp + 1 && c.iat <= NOW + 1;
            prop_assert_eq!(result.is_ok(), timely && inside, "{:?}", result);
            if let Ok(grant) = result {
                for op in Op::ALL {
                    prop_assert_eq!(grant.has(op), c.ops.contains(&op));
                    prop_assert_eq!(grant.allows(&format!("{prefix}x"), op).is_ok(), c.ops.contains(&op));
                }
            }
        }
    }
}
