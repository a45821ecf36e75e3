//! Smoke test of `cellfleet bench`: a short run on two real nodes and SeaweedFS produces a report with every workload and floor, and the exactness check passes (correctness only, never timings).

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_cellfleet");

#[test]
fn bench_reports_every_workload_and_floor_and_passes_the_exactness_check() {
    // The bench uses CELLFLEET_S3_ENDPOINT if set, else starts (or finds)
    // SeaweedFS through scripts/seaweedfs.sh, as the other S3 tests do.
    let dir = tempfile::tempdir().expect("tempdir");
    let json_path = dir.path().join("out.json");
    let output = Command::new(BIN)
        .args([
            "bench",
            "--nodes",
            "2",
            "--store",
            "s3",
            "--duration",
            "1",
            "--warmup",
            "0.2",
            "--concurrency",
            "1",
            "--json",
        ])
        .arg(&json_path)
        .output()
        .expect("run cellfleet bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "cellfleet bench failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    assert!(stdout.contains("exactness: PASSED"), "{stdout}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json_path).expect("the JSON report"))
            .expect("the report is JSON");

    let workloads = report["workloads"].as_array().expect("workloads");
    for name in [
        "local_command",
        "forwarded_command",
        "local_query",
        "forwarded_query",
    ] {
        let row = workloads
            .iter()
            .find(|row| row["name"] == name && row["concurrency"] == 1)
            .unwrap_or_else(|| panic!("no {name} row: {report}"));
        assert!(row["count"].as_u64().unwrap_or(0) > 0, "{row}");
        assert_eq!(row["errors"], 0, "{row}");
        assert_eq!(row["owner_mismatches"], 0, "{row}");
        let floor = if name.ends_with("command") {
            "store_publication"
        } else {
            "echo"
        };
        assert_eq!(row["floor"], floor, "{row}");
        assert!(row["floor_p50_ms"].as_f64().unwrap_or(0.0) > 0.0, "{row}");
    }
    let floors = report["floors"].as_array().expect("floors");
    for name in [
        "echo",
        "store_publication",
        "store_create_4k",
        "store_cas_1k",
    ] {
        for phase in ["before", "after"] {
            let row = floors
                .iter()
                .find(|row| row["name"] == name && row["phase"] == phase)
                .unwrap_or_else(|| panic!("no {name} {phase} floor: {report}"));
            assert!(row["count"].as_u64().unwrap_or(0) > 0, "{row}");
        }
    }
    let goals = report["goals"].as_array().expect("goals");
    assert!(
        goals.iter().any(|g| g["goal"]
            .as_str()
            .unwrap_or("")
            .starts_with("forwarded_query")
            && g["met"].is_boolean()),
        "the query goal is evaluated at c=1: {report}"
    );
    let exactness = &report["exactness"];
    assert_eq!(exactness["passed"], true, "{exactness}");
    let acked = exactness["acked"].as_u64().expect("acked");
    assert!(acked > 0, "{exactness}");
    assert_eq!(
        exactness["present_once"].as_u64(),
        Some(acked),
        "{exactness}"
    );
    // Every command row's acknowledgements are part of what was checked.
    let commands: u64 = workloads
        .iter()
        .filter(|row| row["name"].as_str().unwrap_or("").ends_with("command"))
        .map(|row| row["count"].as_u64().unwrap_or(0))
        .sum();
    assert!(acked >= commands, "acked {acked} < measured {commands}");
    let drained = report["drained"].as_array().expect("drained");
    assert_eq!(drained.len(), 2);
    assert!(drained.iter().all(|n| n["clean"] == true), "{report}");
}
