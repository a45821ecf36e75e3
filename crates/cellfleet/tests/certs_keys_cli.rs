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
