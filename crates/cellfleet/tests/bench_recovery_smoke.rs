//! Smoke test of `cellfleet bench-recovery`: a small run on three real nodes and SeaweedFS kills one node with SIGKILL, every Cell it owned serves again through the others, the exactness check passes, and the JSON has the row (correctness only, never timings); bad arguments are refused.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_cellfleet");

#[test]
fn bench_recovery_recovers_every_cell_of_the_killed_node_exactly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let json_path = dir.path().join("recovery.json");
    let output = Command::new(BIN)
        .args([
            "bench-recovery",
            "--store",
            "s3",
            "--cells-per-node",
            "12",
            "--concurrency",
            "4",
            "--load-s",
            "1",
            "--json",
        ])
        .arg(&json_path)
        .output()
        .expect("run cellfleet bench-recovery");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "bench-recovery failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    assert!(stderr.contains("killed n1 (SIGKILL)"), "{stderr}");
    let rows: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json_path).expect("the JSON")).expect("JSON");
    let row = &rows[0];
    let victim = row["victim_cells"].as_u64().expect("victim_cells");
    assert!(victim > 0, "{row}");
    assert_eq!(row["recovered"].as_u64(), Some(victim), "{row}");
    assert_eq!(row["exactness_passed"].as_bool(), Some(true), "{row}");
    assert!(row["load_commands"].as_u64().unwrap() > 0, "{row}");
    assert!(row["lanes_sealed"].as_f64().unwrap() >= 1.0, "{row}");
    // Nothing serves before the lease has expired.
    assert!(
        row["from_kill_p50_ms"].as_f64().unwrap() >= row["lease_ms"].as_f64().unwrap() * 0.5,
        "{row}"
    );
    assert!(stdout.contains("Cells/node"), "{stdout}");

    let refused = Command::new(BIN)
        .args(["bench-recovery", "--nodes", "1"])
        .output()
        .expect("run cellfleet bench-recovery");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--nodes must be 2..=99"), "{stderr}");
}
