//! `cellfleet certs` and `cellfleet keys` end to end: the files they write are what a node loads (roles, modes, registry, signatures).

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;

use cellfleet_authority::SystemClock;
use cellfleet_proto::v1;
use cellfleet_router::certs::Role;
use cellfleet_router::envelope::{EnvelopePolicy, Verifier};
use cellfleet_router::registry::KeyRegistry;
use cellfleet_router::signing::{self, Domain};
use cellfleet_router::tls::{self, Listener, TlsIdentity};
use prost::Message;

fn cellfleet(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cellfleet"))
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("run cellfleet")
}

fn ok_json(output: Output) -> serde_json::Value {
    assert!(
        output.status.success(),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("json output")
}

#[cfg(unix)]
fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).expect("stat").permissions().mode() & 0o777
}

#[test]
fn certs_init_and_issue_write_loadable_identities() {
    let dir = tempfile::tempdir().expect("tempdir");
    let certs = dir.path().join("certs");
    let certs_arg = certs.to_str().expect("utf-8 path");

    let ca = ok_json(cellfleet(
        &["certs", "init", "--dir", certs_arg, "--json"],
        dir.path(),
    ));
    assert_eq!(ca["role"], "ca");
    assert_eq!(
        ca["private_key"],
        certs.join("ca.key").to_str().expect("utf-8")
    );
    let again = cellfleet(&["certs", "init", "--dir", certs_arg], dir.path());
    assert!(
        !again.status.success(),
        "an existing CA is never overwritten"
    );
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"));

    let node = ok_json(cellfleet(
        &["certs", "issue", "node", "n1", "--dir", certs_arg, "--json"],
        dir.path(),
    ));
    assert_eq!(node["role"], "node");
    assert_eq!(
        node["certificate"],
        certs.join("node-n1.pem").to_str().expect("utf-8")
    );
    let human = cellfleet(
        &["certs", "issue", "client", "ops", "--dir", certs_arg],
        dir.path(),
    );
    assert!(human.status.success());
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(text.starts_with("client ops\n"), "{text}");
    assert!(text.contains("client-ops.key (mode 0600)"), "{text}");

    #[cfg(unix)]
    for key in ["ca.key", "node-n1.key", "client-ops.key"] {
        assert_eq!(mode(&certs.join(key)), 0o600, "{key}");
    }
    let node_identity = TlsIdentity::load_dir(&certs, &Role::Node("n1".into())).expect("node");
    assert_eq!(node_identity.role().expect("role"), Role::Node("n1".into()));
    let client_identity =
        TlsIdentity::load_dir(&certs, &Role::Client("ops".into())).expect("client");
    assert_eq!(
        client_identity.role().expect("role"),
        Role::Client("ops".into())
    );
    tls::server_config(&node_identity, Listener::Peer).expect("node serves");
    tls::client_config(&client_identity).expect("client dials");

    let bad = cellfleet(
        &["certs", "issue", "node", "../evil", "--dir", certs_arg],
        dir.path(),
    );
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("invalid name"));
    let missing = cellfleet(
        &["certs", "issue", "client", "x", "--dir", "nowhere"],
        dir.path(),
    );
    assert!(String::from_utf8_lossy(&missing.stderr).contains("cellfleet certs init"));
}

#[test]
fn keys_new_writes_a_private_key_and_a_registry_entry_a_node_accepts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let created = ok_json(cellfleet(
        &[
            "keys",
            "new",
            "app",
            "--kinds",
            "kv",
            "--ops",
            "put,get",
            "--registry",
            "keys.toml",
            "--json",
        ],
        dir.path(),
    ));
    assert_eq!(created["entry"]["id"], "app");
    assert_eq!(created["entry"]["kinds"], serde_json::json!(["kv"]));
    assert_eq!(
        created["entry"]["operations"],
        serde_json::json!(["put", "get"])
    );
    let key_path = dir.path().join("app.ed25519.pem");
    #[cfg(unix)]
    assert_eq!(mode(&key_path), 0o600);

    let second = cellfleet(
        &[
            "keys",
            "new",
            "ops",
            "--kinds",
            "*",
            "--ops",
            "*",
            "--admin",
            "--registry",
            "keys.toml",
        ],
        dir.path(),
    );
    assert!(second.status.success());
    let duplicate = cellfleet(
        &["keys", "new", "app", "--registry", "keys.toml"],
        dir.path(),
    );
    assert!(!duplicate.status.success());
    assert!(String::from_utf8_lossy(&duplicate.stderr).contains("already in the registry"));

    let registry = KeyRegistry::load(&dir.path().join("keys.toml")).expect("registry loads");
    assert_eq!(registry.len(), 2);
    assert!(registry.get("ops").expect("ops").entry.admin);

    // The written key signs envelopes the registry entry verifies.
    let key = signing::read_signing_key(&key_path).expect("key file");
    assert_eq!(
        signing::public_key_hex(&key.verifying_key()),
        created["entry"]["public_key"].as_str().expect("hex")
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64;
    let body = v1::CommandBody {
        kind: "kv".into(),
        key: b"k".to_vec(),
        command: "put".into(),
        args_json: Vec::new(),
        command_id: vec![1; 16],
        issued_at_ms: now,
        expires_at_ms: now + 10_000,
    };
    let envelope = signing::seal(Domain::Command, body.encode_to_vec(), "app", &key);
    let verifier = Verifier::new(
        Arc::new(registry),
        EnvelopePolicy::default(),
        Arc::new(SystemClock),
    );
    assert_eq!(
        verifier
            .verify_command(&envelope)
            .expect("verifies")
            .command,
        "put"
    );

    let human = cellfleet(&["keys", "new", "solo"], dir.path());
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(text.contains("[[keys]]\nid = \"solo\""), "{text}");
    assert!(text.contains("grants nothing"), "{text}");
}

/// `keys new --stream-token-prefixes` writes the grant a node reads, and
/// `keys token` mints a token that key's registry entry verifies: the
/// token alone on stdout (or JSON), clear refusals with a non-zero exit.
#[test]
fn keys_token_mints_what_the_registry_verifies() {
    use cellfleet_streams::token::{self, Op, TokenKey, TokenKeys};
    let dir = tempfile::tempdir().expect("tempdir");
    let registry_path = dir.path().join("keys.toml");
    let registry_arg = registry_path.to_str().expect("utf-8");
    let created = ok_json(cellfleet(
        &[
            "keys",
            "new",
            "minter",
            "--stream-token-prefixes",
            "/v1/stream/app/,/v1/stream/shared/",
            "--registry",
            registry_arg,
            "--json",
        ],
        dir.path(),
    ));
    assert_eq!(
        created["entry"]["stream_token_prefixes"],
        serde_json::json!(["/v1/stream/app/", "/v1/stream/shared/"])
    );
    let registry = KeyRegistry::load(&registry_path).expect("the registry loads");
    assert_eq!(
        registry.get("minter").unwrap().entry.stream_token_prefixes,
        ["/v1/stream/app/", "/v1/stream/shared/"]
    );

    #[derive(Debug)]
    struct Registry(KeyRegistry);
    impl TokenKeys for Registry {
        fn token_key(&self, id: &str) -> Option<TokenKey> {
            let key = self.0.get(id).ok()?;
            Some(TokenKey {
                public_key: key.public_key,
                prefixes: key.entry.stream_token_prefixes.clone(),
            })
        }
    }
    let keys = Registry(registry);
    let mint = |extra: &[&str]| {
        let mut args = vec![
            "keys",
            "token",
            "--key",
            "minter.ed25519.pem",
            "--key-id",
            "minter",
        ];
        args.extend_from_slice(extra);
        cellfleet(&args, dir.path())
    };
    let out = mint(&[
        "--prefix",
        "/v1/stream/app/rooms/",
        "--ops",
        "read,append",
        "--ttl",
        "15m",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8");
    assert_eq!(text.lines().count(), 1, "the token alone: {text:?}");
    let now_ms = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    let grant = token::verify(text.trim(), &keys, now_ms, 0).expect("verifies");
    assert!(grant
        .allows("/v1/stream/app/rooms/lobby", Op::Append)
        .is_ok());
    assert!(grant
        .allows("/v1/stream/app/rooms/lobby", Op::Delete)
        .is_err());
    assert!(grant.exp - now_ms / 1000 <= 15 * 60 && grant.exp - now_ms / 1000 >= 15 * 60 - 5);
    // Past its lifetime it is refused.
    assert!(matches!(
        token::verify(text.trim(), &keys, now_ms + 16 * 60_000, 0),
        Err(token::TokenError::Expired { .. })
    ));

    let json = ok_json(mint(&[
        "--prefix",
        "/v1/stream/shared/",
        "--ops",
        "subscribe",
        "--sub",
        "worker-1",
        "--json",
    ]));
    assert_eq!(json["key_id"], "minter");
    assert_eq!(json["ops"], serde_json::json!(["subscribe"]));
    let grant = token::verify(json["token"].as_str().unwrap(), &keys, now_ms, 0).unwrap();
    assert_eq!(grant.subject.as_deref(), Some("worker-1"));

    // A prefix outside the key's grant mints (the key file cannot know
    // the registry) but never verifies.
    let wide = mint(&["--prefix", "/v1/stream/", "--ops", "read"]);
    assert!(wide.status.success());
    assert!(matches!(
        token::verify(
            String::from_utf8_lossy(&wide.stdout).trim(),
            &keys,
            now_ms,
            0
        ),
        Err(token::TokenError::KeyMayNotGrant { .. })
    ));

    for (args, says) in [
        (
            vec!["--prefix", "/a/", "--ops", "write"],
            "not an operation",
        ),
        (
            vec!["--prefix", "/a/", "--ops", "read", "--ttl", "5y"],
            "s, m, h or d",
        ),
        (
            vec!["--prefix", "/a/", "--ops", "read", "--ttl", "401d"],
            "400d",
        ),
        (
            vec!["--prefix", "a/", "--ops", "read"],
            "must start with '/'",
        ),
    ] {
        let out = mint(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} minted");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?} printed a token");
    }
    let no_config = cellfleet(
        &[
            "keys",
            "token",
            "--prefix",
            "/a/",
            "--ops",
            "read",
            "--config",
            "missing.toml",
        ],
        dir.path(),
    );
    assert!(!no_config.status.success());
    assert!(String::from_utf8_lossy(&no_config.stderr).contains("cannot read the client config"));
}
