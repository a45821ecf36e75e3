//! The public Durable Streams conformance suite, subscriptions included,
//! against the ingress-only node of a 3-node cluster (real node processes
//! on the embedded store): every stream the suite touches is owned by
//! another node, so each request is served through the owner over the
//! mTLS peer channel. `scripts/conformance-cluster.sh` starts the cluster,
//! runs the suite (via `scripts/conformance.sh`) and fails if the ingress
//! node came to own any stream; the single-node run is
//! `crates/streams/tests/conformance.rs`.

use std::process::Command;

#[test]
fn public_suite_passes_through_a_non_owner_of_a_three_node_cluster() {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/conformance-cluster.sh"
    );
    let output = Command::new("bash")
        .arg(script)
        .env("CELLFLEET_BIN", env!("CARGO_BIN_EXE_cellfleet"))
        .env("DS_SUBSCRIPTIONS", "1")
        .env("NO_COLOR", "1")
        .output()
        .expect("run scripts/conformance-cluster.sh (needs bash)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    // vitest's summary when every one of the suite's 338 tests ran and passed.
    let all_passed = text.lines().any(|line| {
        line.split_whitespace().collect::<Vec<_>>() == ["Tests", "338", "passed", "(338)"]
    });
    assert!(all_passed, "not every conformance test passed:\n{text}");
    assert!(
        text.contains("owned by the ingress node n1: 0"),
        "the ingress node owned streams:\n{text}"
    );
    assert!(
        output.status.success(),
        "the script failed ({}):\n{text}",
        output.status
    );
}
