//! A client in another language: `scripts/pyclient.sh` generates Python stubs from `proto/` with grpcio-tools, signs a command by the documented rule alone, and a Rust node verifies it.
//!
//! The script builds a cached venv from PyPI on first use; if that is not
//! possible this test fails, naming why (it is never skipped).

mod common;

use std::path::PathBuf;
use std::process::Command;

use cellfleet_router::certs::{ClusterCa, Role};
use cellfleet_router::registry::{KeyEntry, KeyRegistry};
use cellfleet_router::signing::{generate_signing_key, write_signing_key};
use common::start_stub_node;

fn repository_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_signs_by_the_documented_rule() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, _) = ClusterCa::init(dir.path(), "py").expect("ca");
    let client = ca
        .issue_to(dir.path(), &Role::Client("python".into()), &[])
        .expect("client certificate");
    let signing_key = generate_signing_key();
    let signing_key_path = dir.path().join("python.ed25519.pem");
    write_signing_key(&signing_key_path, &signing_key).expect("signing key");
    let entry = KeyEntry::new(
        "python",
        &signing_key.verifying_key(),
        vec!["kv".into()],
        vec!["put".into()],
    );
    let registry = KeyRegistry::from_entries(vec![entry]).expect("registry");
    let node = start_stub_node(&ca, "n1", registry).await;

    let script = repository_root().join("scripts/pyclient.sh");
    let arguments = [
        "--addr".to_owned(),
        node.client_addr.to_string(),
        "--ca".into(),
        dir.path().join("ca.pem").display().to_string(),
        "--cert".into(),
        client.cert.display().to_string(),
        "--key".into(),
        client.key.display().to_string(),
        "--signing-key".into(),
        signing_key_path.display().to_string(),
        "--key-id".into(),
        "python".into(),
        "--tamper".into(),
    ];
    let output = tokio::task::spawn_blocking(move || {
        Command::new("bash").arg(&script).args(&arguments).output()
    })
    .await
    .expect("join")
    .expect("run scripts/pyclient.sh");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "scripts/pyclient.sh failed ({}):\nstdout: {stdout}\nstderr: {stderr}",
        output.status
    );
    let results: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!("pyclient output is not JSON ({e}): {stdout}\nstderr: {stderr}")
    });
    let execute = &results["execute"];
    assert_eq!(execute["ok"], true, "{results}");
    assert_eq!(execute["command_id_matches"], true);
    assert_eq!(execute["served_by"], "n1");
    assert_eq!(execute["result"]["key_id"], "python");
    assert_eq!(execute["result"]["kind"], "kv");
    assert_eq!(execute["result"]["key"], "py-cell");
    assert_eq!(execute["result"]["command"], "put");
    assert_eq!(
        execute["result"]["args"],
        serde_json::json!({"key": "greeting", "value": "hello from python"})
    );
    assert_eq!(
        execute["receipt"]["cell_id"],
        cellfleet_authority::CellId::for_kind_key("kv", b"py-cell").as_str()
    );
    let tampered = &results["tampered_signature"];
    assert_eq!(tampered["ok"], false);
    assert_eq!(tampered["status"], "UNAUTHENTICATED");
    assert_eq!(tampered["error_code"], "ERROR_CODE_BAD_SIGNATURE");
    assert_eq!(tampered["retry_safe"], false);
    let cross = &results["cross_domain"];
    assert_eq!(cross["status"], "UNAUTHENTICATED");
    assert_eq!(cross["error_code"], "ERROR_CODE_BAD_SIGNATURE");
    assert_eq!(node.reached.count(), 1, "only the good command got through");
}
