//! Envelope verification: every refusal has its documented status; arbitrary bytes never panic.

use std::sync::Arc;

use cellfleet_authority::ManualClock;
use ed25519_dalek::SigningKey;
use proptest::prelude::*;
use tonic::Code;

use super::*;
use crate::registry::KeyEntry;
use crate::status::to_status;

const NOW_MS: i64 = 1_700_000_000_000;

struct Fixture {
    verifier: Verifier,
    key: SigningKey,
    clock: Arc<ManualClock>,
}

fn fixture() -> Fixture {
    let key = SigningKey::from_bytes(&[3; 32]);
    let entry = KeyEntry::new(
        "app",
        &key.verifying_key(),
        vec!["kv".into()],
        vec!["put".into(), "get".into()],
    );
    let registry = Arc::new(KeyRegistry::from_entries(vec![entry]).expect("registry"));
    let clock = Arc::new(ManualClock::new(NOW_MS as u64));
    let verifier = Verifier::new(registry, EnvelopePolicy::default(), clock.clone());
    Fixture {
        verifier,
        key,
        clock,
    }
}

fn body() -> v1::CommandBody {
    v1::CommandBody {
        kind: "kv".into(),
        key: b"cart-1".to_vec(),
        command: "put".into(),
        args_json: br#"{"key":"a","value":1}"#.to_vec(),
        command_id: vec![9; 16],
        issued_at_ms: NOW_MS - 1_000,
        expires_at_ms: NOW_MS + 60_000,
    }
}

fn sealed(body: &v1::CommandBody, key: &SigningKey) -> v1::SignedEnvelope {
    signing::seal(Domain::Command, body.encode_to_vec(), "app", key)
}

fn refusal(f: &Fixture, envelope: &v1::SignedEnvelope) -> (Error, Code) {
    let error = f
        .verifier
        .verify_command(envelope)
        .expect_err("must be refused");
    let code = to_status(&error).code();
    (error, code)
}

#[test]
fn a_well_signed_command_verifies_with_its_fields() {
    let f = fixture();
    let verified = f
        .verifier
        .verify_command(&sealed(&body(), &f.key))
        .expect("valid");
    assert_eq!(verified.key_id, "app");
    assert_eq!(verified.kind, "kv");
    assert_eq!(verified.key, b"cart-1");
    assert_eq!(verified.command, "put");
    assert_eq!(verified.args, serde_json::json!({"key": "a", "value": 1}));
    assert_eq!(verified.command_id, [9; 16]);
    assert_eq!(verified.expires_at_ms, NOW_MS + 60_000);
}

#[test]
fn unsigned_is_unauthenticated() {
    let f = fixture();
    let mut envelope = sealed(&body(), &f.key);
    envelope.signature.clear();
    let (error, code) = refusal(&f, &envelope);
    assert!(matches!(error, Error::Unsigned(_)), "{error:?}");
    assert_eq!(code, Code::Unauthenticated);
    let mut envelope = sealed(&body(), &f.key);
    envelope.key_id.clear();
    assert!(matches!(
        refusal(&f, &envelope),
        (Error::Unsigned(_), Code::Unauthenticated)
    ));
}

#[test]
fn wrongly_signed_is_unauthenticated() {
    let f = fixture();
    let other = SigningKey::from_bytes(&[4; 32]);
    let (error, code) = refusal(&f, &sealed(&body(), &other));
    assert!(matches!(error, Error::BadSignature { ref key_id, .. } if key_id == "app"));
    assert_eq!(code, Code::Unauthenticated);
}

#[test]
fn a_signature_for_another_call_is_refused() {
    let f = fixture();
    let bytes = body().encode_to_vec();
    let envelope = signing::seal(Domain::Query, bytes, "app", &f.key);
    let (error, code) = refusal(&f, &envelope);
    assert!(matches!(
        error,
        Error::BadSignature {
            domain: "cellfleet.v1.command",
            ..
        }
    ));
    assert_eq!(code, Code::Unauthenticated);
}

#[test]
fn tampered_body_is_unauthenticated() {
    let f = fixture();
    let mut envelope = sealed(&body(), &f.key);
    let last = envelope.body.len() - 1;
    envelope.body[last] ^= 0x01;
    let (error, code) = refusal(&f, &envelope);
    assert!(matches!(error, Error::BadSignature { .. }), "{error:?}");
    assert_eq!(code, Code::Unauthenticated);
}

#[test]
fn unknown_key_is_unauthenticated() {
    let f = fixture();
    let mut envelope = sealed(&body(), &f.key);
    envelope.key_id = "mallory".into();
    let (error, code) = refusal(&f, &envelope);
    assert!(matches!(error, Error::UnknownKey(ref id) if id == "mallory"));
    assert_eq!(code, Code::Unauthenticated);
}

#[test]
fn expired_is_failed_precondition() {
    let f = fixture();
    let envelope = sealed(&body(), &f.key);
    f.clock.set_wall_ms((NOW_MS + 60_000) as u64);
    f.verifier
        .verify_command(&envelope)
        .expect("valid at its last millisecond");
    f.clock.set_wall_ms((NOW_MS + 60_001) as u64);
    let (error, code) = refusal(&f, &envelope);
    assert!(matches!(error, Error::Expired(w) if w.now_ms == NOW_MS + 60_001));
    assert_eq!(code, Code::FailedPrecondition);
}

#[test]
fn future_dated_beyond_skew_is_failed_precondition() {
    let f = fixture();
    let mut within = body();
    within.issued_at_ms = NOW_MS + 500;
    f.verifier
        .verify_command(&sealed(&within, &f.key))
        .expect("inside the skew bound");
    let mut beyond = body();
    beyond.issued_at_ms = NOW_MS + 501;
    let (error, code) = refusal(&f, &sealed(&beyond, &f.key));
    assert!(
        matches!(error, Error::FutureDated { skew_ms: 500, .. }),
        "{error:?}"
    );
    assert_eq!(code, Code::FailedPrecondition);
}

#[test]
fn overlong_and_inverted_windows_are_invalid() {
    let f = fixture();
    let mut long = body();
    long.expires_at_ms = long.issued_at_ms + 10 * 60 * 1000 + 1;
    let (error, code) = refusal(&f, &sealed(&long, &f.key));
    assert!(matches!(error, Error::WindowTooLong { .. }));
    assert_eq!(code, Code::InvalidArgument);
    let mut inverted = body();
    inverted.expires_at_ms = inverted.issued_at_ms;
    let (error, code) = refusal(&f, &sealed(&inverted, &f.key));
    assert!(matches!(error, Error::Malformed(_)));
    assert_eq!(code, Code::InvalidArgument);
}

#[test]
fn unauthorized_kind_or_operation_is_permission_denied() {
    let f = fixture();
    let mut kind = body();
    kind.kind = "bank".into();
    let (error, code) = refusal(&f, &sealed(&kind, &f.key));
    assert!(matches!(error, Error::Unauthorized { ref what, .. } if what == "use kind \"bank\""));
    assert_eq!(code, Code::PermissionDenied);
    let mut op = body();
    op.command = "delete".into();
    let (error, code) = refusal(&f, &sealed(&op, &f.key));
    assert!(matches!(error, Error::Unauthorized { .. }));
    assert_eq!(code, Code::PermissionDenied);
    let mut sql = body();
    sql.command = "$sql".into();
    assert_eq!(refusal(&f, &sealed(&sql, &f.key)).1, Code::PermissionDenied);
}

#[test]
fn malformed_fields_are_invalid_argument() {
    let f = fixture();
    let cases: Vec<fn(&mut v1::CommandBody)> = vec![
        |b| b.command_id = vec![1; 15],
        |b| b.kind.clear(),
        |b| b.key.clear(),
        |b| b.command.clear(),
        |b| b.args_json = b"[1,2]".to_vec(),
        |b| b.args_json = b"{".to_vec(),
    ];
    for (i, case) in cases.into_iter().enumerate() {
        let mut b = body();
        case(&mut b);
        let (error, code) = refusal(&f, &sealed(&b, &f.key));
        assert!(matches!(error, Error::Malformed(_)), "case {i}: {error:?}");
        assert_eq!(code, Code::InvalidArgument, "case {i}");
    }
    // A signed body that is not a CommandBody at all.
    let envelope = signing::seal(Domain::Command, vec![0xff, 0xff, 0xff], "app", &f.key);
    assert!(matches!(refusal(&f, &envelope).0, Error::Malformed(_)));
    // An oversized body is refused before any signature work.
    let mut envelope = sealed(&body(), &f.key);
    envelope.body = vec![0; EnvelopePolicy::default().body_bytes_max + 1];
    assert!(matches!(refusal(&f, &envelope).0, Error::Malformed(_)));
}

#[test]
fn queries_resolves_and_admin_use_their_own_domains() {
    let f = fixture();
    let query = v1::QueryBody {
        kind: "kv".into(),
        key: b"cart-1".to_vec(),
        query: "get".into(),
        args_json: Vec::new(),
        min_receipt: None,
        request_id: Vec::new(),
        issued_at_ms: NOW_MS,
        expires_at_ms: NOW_MS + 1_000,
    };
    let envelope = signing::seal(Domain::Query, query.encode_to_vec(), "app", &f.key);
    let verified = f.verifier.verify_query(&envelope).expect("query");
    assert_eq!(verified.args, serde_json::json!({}));
    assert!(f.verifier.verify_command(&envelope).is_err());
    let resolve = v1::ResolveBody {
        kind: "kv".into(),
        key: b"cart-1".to_vec(),
        command_id: vec![2; 16],
        issued_at_ms: NOW_MS,
        expires_at_ms: NOW_MS + 1_000,
        command_expires_at_ms: 0,
    };
    let envelope = signing::seal(Domain::Resolve, resolve.encode_to_vec(), "app", &f.key);
    let verified = f.verifier.verify_resolve(&envelope).expect("resolve");
    assert_eq!(
        (verified.command_id, verified.command_expires_at_ms),
        ([2; 16], None)
    );
    // The command's own expiry travels to the runtime; negative is refused.
    for (sent, expected) in [(NOW_MS - 5, Some(NOW_MS - 5)), (-1, None)] {
        let body = v1::ResolveBody {
            command_expires_at_ms: sent,
            ..resolve.clone()
        };
        let envelope = signing::seal(Domain::Resolve, body.encode_to_vec(), "app", &f.key);
        match expected {
            Some(ms) => assert_eq!(
                f.verifier
                    .verify_resolve(&envelope)
                    .expect("resolve")
                    .command_expires_at_ms,
                Some(ms)
            ),
            None => assert!(matches!(
                f.verifier.verify_resolve(&envelope),
                Err(Error::BadRequest(_))
            )),
        }
    }
    let admin = v1::AdminBody {
        operation: "drain".into(),
        node_id: String::new(),
        issued_at_ms: NOW_MS,
        expires_at_ms: NOW_MS + 1_000,
    };
    let envelope = signing::seal(Domain::Admin, admin.encode_to_vec(), "app", &f.key);
    let (error, _) = (
        f.verifier.verify_admin(&envelope).expect_err("not admin"),
        (),
    );
    assert_eq!(to_status(&error).code(), Code::PermissionDenied);
}

proptest! {
    /// Arbitrary bytes as a whole envelope, or as a signed body, are refused
    /// with a typed error (never a panic, never accepted).
    #[test]
    fn arbitrary_envelope_bytes_are_refused(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let f = fixture();
        if let Ok(envelope) = v1::SignedEnvelope::decode(bytes.as_slice()) {
            prop_assert!(f.verifier.verify_command(&envelope).is_err());
            prop_assert!(f.verifier.verify_query(&envelope).is_err());
            prop_assert!(f.verifier.verify_resolve(&envelope).is_err());
            prop_assert!(f.verifier.verify_admin(&envelope).is_err());
        }
    }

    #[test]
    fn arbitrary_signed_bodies_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let f = fixture();
        for domain in [Domain::Command, Domain::Query, Domain::Resolve, Domain::Admin] {
            let envelope = signing::seal(domain, bytes.clone(), "app", &f.key);
            let result = match domain {
                Domain::Command => f.verifier.verify_command(&envelope).map(|_| ()),
                Domain::Query => f.verifier.verify_query(&envelope).map(|_| ()),
                Domain::Resolve => f.verifier.verify_resolve(&envelope).map(|_| ()),
                Domain::Admin => f.verifier.verify_admin(&envelope).map(|_| ()),
            };
            // Signed but arbitrary: whatever decodes still fails a field or
            // window check, and the error is one of the documented classes.
            if let Err(error) = result {
                let authentic = !matches!(error, Error::BadSignature { .. } | Error::UnknownKey(_));
                prop_assert!(authentic, "a signed body failed authentication: {:?}", error);
            }
        }
    }

    /// The window rule never overflows and agrees with its definition.
    #[test]
    fn window_rule_matches_definition(issued in any::<i64>(), expires in any::<i64>(), now in any::<i64>()) {
        let policy = EnvelopePolicy::default();
        let ok = check_window(policy, issued, expires, now).is_ok();
        let (i, e, n) = (i128::from(issued), i128::from(expires), i128::from(now));
        let expected = i < e && e - i <= 600_000 && i <= n + 500 && n <= e;
        prop_assert_eq!(ok, expected);
    }
}

proptest! {
    /// A request its ingress verified is checked at the owner in every
    /// respect but the signature: whatever the body, the owner's verdict
    /// on it with any signature is the full check's verdict on it signed
    /// well, and only the full check counts a signature.
    #[test]
    fn the_owner_skips_only_the_signature(
        kind in prop_oneof![Just("kv"), Just("other"), Just("")],
        command in prop_oneof![Just("put"), Just("drop")],
        id_bytes in prop_oneof![Just(16usize), Just(15)],
        issued_offset_ms in -700_000i64..2_000,
        window_ms in -1_000i64..700_000,
        key_id in prop_oneof![Just("app"), Just("gone")],
        damage in any::<Option<prop::sample::Index>>(),
    ) {
        let f = fixture();
        let issued_at_ms = NOW_MS + issued_offset_ms;
        let body = v1::CommandBody {
            kind: kind.into(),
            command: command.into(),
            command_id: vec![9; id_bytes],
            issued_at_ms,
            expires_at_ms: issued_at_ms.saturating_add(window_ms),
            ..body()
        };
        let well_signed = signing::seal(Domain::Command, body.encode_to_vec(), key_id, &f.key);
        let mut carried = well_signed.clone();
        if let Some(byte) = damage {
            carried.signature[byte.index(SIGNATURE_BYTES)] ^= 0x5a;
        }
        let counted = Arc::new(AtomicU64::new(0));
        let verifier = f.verifier.clone().counting_into(counted.clone());
        let full = verifier.verify_command(&well_signed);
        let after_full = counted.load(Ordering::Relaxed);
        prop_assert_eq!(after_full, u64::from(key_id == "app"), "the full check counts a known key's signature");
        let by_owner = verifier.check_command(&carried, Signature::VerifiedByIngress);
        prop_assert_eq!(format!("{by_owner:?}"), format!("{full:?}"));
        prop_assert_eq!(counted.load(Ordering::Relaxed), after_full);
        if damage.is_some() && key_id == "app" {
            let refused = verifier.verify_command(&carried);
            prop_assert!(
                matches!(refused, Err(Error::BadSignature { .. })),
                "a damaged signature passed the full check: {:?}",
                refused
            );
        }
    }
}

#[test]
fn the_owner_skips_the_signature_of_queries_and_resolves_only() {
    let f = fixture();
    let other = SigningKey::from_bytes(&[4; 32]);
    let query = v1::QueryBody {
        kind: "kv".into(),
        key: b"cart-1".to_vec(),
        query: "get".into(),
        issued_at_ms: NOW_MS - 1_000,
        expires_at_ms: NOW_MS + 60_000,
        ..Default::default()
    };
    let forged = signing::seal(Domain::Query, query.encode_to_vec(), "app", &other);
    assert!(matches!(
        f.verifier.verify_query(&forged),
        Err(Error::BadSignature { .. })
    ));
    let checked = f
        .verifier
        .check_query(&forged, Signature::VerifiedByIngress)
        .expect("its ingress verified it");
    assert_eq!(checked.query, "get");
    let expired = v1::QueryBody {
        expires_at_ms: NOW_MS - 1,
        ..query
    };
    let forged = signing::seal(Domain::Query, expired.encode_to_vec(), "app", &other);
    assert!(matches!(
        f.verifier
            .check_query(&forged, Signature::VerifiedByIngress),
        Err(Error::Expired(_))
    ));
    let resolve = v1::ResolveBody {
        kind: "other".into(),
        key: b"cart-1".to_vec(),
        command_id: vec![9; 16],
        issued_at_ms: NOW_MS - 1_000,
        expires_at_ms: NOW_MS + 60_000,
        ..Default::default()
    };
    let forged = signing::seal(Domain::Resolve, resolve.encode_to_vec(), "app", &other);
    assert!(matches!(
        f.verifier
            .check_resolve(&forged, Signature::VerifiedByIngress),
        Err(Error::Unauthorized { .. })
    ));
}
