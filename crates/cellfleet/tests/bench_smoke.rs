//! Smoke test of `cellfleet bench`: a short run on two real nodes and SeaweedFS (every workload, small fleet sizes, two capacity steps) produces a report with every workload and floor, the JSON and the plots, passes the exactness check and deletes its objects (correctness only, never timings).

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_cellfleet");

/// Runs `cellfleet bench` with `args` and `--json`, asserts that it
/// passed, and returns its stdout, stderr and JSON report.
fn bench(args: &[&str]) -> (String, String, serde_json::Value) {
    let dir = tempfile::tempdir().expect("tempdir");
    let json_path = dir.path().join("out.json");
    let output = Command::new(BIN)
        .arg("bench")
        .args(args)
        .arg("--json")
        .arg(&json_path)
        .output()
        .expect("run cellfleet bench");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        output.status.success(),
        "cellfleet bench failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    let report = serde_json::from_slice(&std::fs::read(&json_path).expect("the JSON report"))
        .expect("the report is JSON");
    (stdout, stderr, report)
}

#[test]
fn bench_reports_every_workload_and_floor_and_passes_the_exactness_check() {
    // The bench uses CELLFLEET_S3_ENDPOINT if set, else starts (or finds)
    // SeaweedFS through scripts/seaweedfs.sh, as the other S3 tests do.
    let dir = tempfile::tempdir().expect("tempdir");
    let plots = dir.path().join("plots");
    let (stdout, stderr, report) = bench(&[
        "--nodes",
        "2",
        "--store",
        "s3",
        "--duration",
        "1",
        // No warm-up: every worker's first request is measured, so no
        // row is empty however slow a shared machine is.
        "--warmup",
        "0",
        "--concurrency",
        "1",
        "--fleet-cells",
        "20,40",
        "--fleet-concurrency",
        "4",
        "--fleet-settle-s",
        "0.2",
        "--drain-timeout-s",
        "120",
        "--capacity-rates",
        "20,40",
        "--keep-logs",
        "--plots",
        plots.to_str().expect("a UTF-8 temporary path"),
    ]);
    assert!(stdout.contains("exactness: PASSED"), "{stdout}");
    assert!(
        stdout.contains("drain: 2 of 2 nodes exited cleanly after SIGTERM, the last after "),
        "{stdout}"
    );
    assert!(
        stderr.contains("bench: fleet of 20 cells settling for 0.2 s before the measurement"),
        "{stderr}"
    );
    // --keep-logs: a passing run keeps its nodes' logs too, and says where.
    let kept = stderr
        .lines()
        .find_map(|line| line.strip_prefix("bench: the nodes' logs are kept in "))
        .unwrap_or_else(|| panic!("no kept logs reported:\n{stderr}"));
    for node in ["n1", "n2"] {
        let log = std::fs::read_to_string(std::path::Path::new(kept).join(format!("{node}.log")))
            .unwrap_or_else(|e| panic!("{node}'s kept log in {kept}: {e}"));
        assert!(
            log.contains(&format!("cellfleet node {node} ready")),
            "{log}"
        );
    }
    std::fs::remove_dir_all(kept).expect("remove the kept logs");
    let workloads = report["workloads"].as_array().expect("workloads");
    for (name, concurrency) in [
        ("local_command", 1),
        ("forwarded_command", 1),
        ("local_query", 1),
        ("forwarded_query", 1),
        ("routed_query", 1),
        ("serial_query", 1),
        ("hot_cell", 64),
    ] {
        let row = workloads
            .iter()
            .find(|row| row["name"] == name && row["concurrency"] == concurrency)
            .unwrap_or_else(|| panic!("no {name} row: {report}"));
        assert!(row["count"].as_u64().unwrap_or(0) > 0, "{row}");
        assert_eq!(row["errors"], 0, "{row}");
        assert_eq!(row["owner_mismatches"], 0, "{row}");
        // hot_cell sends commands too.
        let floor = if !name.ends_with("query") {
            "store_publication"
        } else {
            "echo"
        };
        assert_eq!(row["floor"], floor, "{row}");
        assert!(row["floor_p50_ms"].as_f64().unwrap_or(0.0) > 0.0, "{row}");
        if floor == "store_publication" {
            // Commands: compared with SQLite, and their time split by phase.
            assert!(
                row["sqlite"]["sqlite_p50_ms"].as_f64().unwrap_or(0.0) > 0.0,
                "{row}"
            );
            let phases = &row["phases"];
            assert!(
                phases["publications"].as_f64().unwrap_or(0.0) > 0.0,
                "{row}"
            );
            // The nodes run the node log (the default): durable by a
            // segment PUT, several Cells' groups per segment.
            assert!(phases["segments"].as_f64().unwrap_or(0.0) > 0.0, "{row}");
            assert!(phases["segment_ms"].as_f64().unwrap_or(0.0) > 0.0, "{row}");
            assert_eq!(phases["cas_ms"].as_f64(), Some(0.0), "{row}");
        }
    }
    let fleet = report["fleet"].as_array().expect("fleet rows");
    assert_eq!(fleet.len(), 2, "{report}");
    for (row, cells) in fleet.iter().zip([20, 40]) {
        assert_eq!(row["cells"], cells, "{row}");
        assert!(row["count"].as_u64().unwrap_or(0) > 0, "{row}");
        assert_eq!(row["errors"], 0, "{row}");
        let nodes = row["nodes"].as_array().expect("node samples");
        assert_eq!(nodes.len(), 2, "{row}");
        for node in nodes {
            assert!(node["rss_bytes_max"].as_u64().unwrap_or(0) > 0, "{node}");
            assert!(node["open_files_max"].as_u64().unwrap_or(0) > 0, "{node}");
        }
    }
    let steps = report["capacity"]["steps"]
        .as_array()
        .expect("capacity steps");
    assert_eq!(steps.len(), 2, "{report}");
    assert!(
        steps.iter().all(|s| s["count"].as_u64().unwrap_or(0) > 0),
        "{report}"
    );
    let floors = report["floors"].as_array().expect("floors");
    for name in [
        "echo",
        "store_publication",
        "store_create_4k",
        "store_cas_1k",
        "store_get_1k",
        "sqlite_txn",
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
    let local_command = goals
        .iter()
        .find(|g| g["goal"] == "local_command p50 <= 1.2 x store_create_4k p50")
        .unwrap_or_else(|| panic!("the node log's latency goal is listed: {report}"));
    assert_eq!(local_command["concurrency"], 1, "{local_command}");
    assert!(local_command["met"].is_boolean(), "{local_command}");
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
    // How long each node took from SIGTERM to its exit, within the limit.
    assert!(
        drained.iter().all(|n| n["seconds"]
            .as_f64()
            .is_some_and(|s| (0.0..120.0).contains(&s))),
        "{report}"
    );
    assert_eq!(report["config"]["drain_timeout_s"], 120.0, "{report}");
    // The run's objects (Cells' roots and LTX files, the floor's keys) are gone.
    let cleanup = &report["cleanup"];
    assert!(cleanup["note"].is_null(), "{cleanup}");
    assert!(
        cleanup["deleted_objects"].as_u64().unwrap_or(0) > 0,
        "{cleanup}"
    );
    for name in ["latency_cdf.svg", "fleet.svg", "capacity.svg"] {
        let svg = std::fs::read_to_string(plots.join(name))
            .unwrap_or_else(|e| panic!("plot {name}: {e}"));
        assert!(
            svg.starts_with("<svg") && svg.contains("<polyline"),
            "{name}"
        );
    }
}

/// `--publication log,cell` runs the same plan once per mode, each on a
/// cluster of its own, and reports them side by side: every row of one
/// mode against the same row of the other. The node log's throughput goal
/// (log mode's `fleet` per node at 1,000 Cells over cell mode's) is
/// listed; a fleet this small does not evaluate it (the unit tests in
/// `report.rs` do).
#[test]
fn bench_runs_both_publication_modes_side_by_side() {
    let (stdout, stderr, report) = bench(&[
        "local_command",
        "fleet",
        "--publication",
        "log,cell",
        "--store",
        "local",
        "--nodes",
        "2",
        "--duration",
        "1",
        "--warmup",
        "0",
        "--concurrency",
        "1",
        "--fleet-cells",
        "20",
        "--fleet-concurrency",
        "4",
    ]);
    for mode in ["log", "cell"] {
        assert!(
            stderr.contains(&format!(
                "bench: starting 2 nodes on the local store, publication mode {mode}"
            )),
            "{stderr}"
        );
    }
    assert_eq!(
        stdout.matches("exactness: PASSED").count(),
        2,
        "one passed exactness check per mode:\n{stdout}"
    );
    assert!(
        stdout.contains(
            "log against cell: the same plan on a cluster of its own per mode, in this order: log, cell"
        ),
        "{stdout}"
    );
    let runs = report["runs"].as_array().expect("one report per mode");
    assert_eq!(
        runs.iter()
            .map(|run| run["config"]["publication"].as_str())
            .collect::<Vec<_>>(),
        [Some("log"), Some("cell")],
        "{report}"
    );
    let per_node = |run: &serde_json::Value| {
        let row = &run["fleet"][0];
        assert_eq!(row["cells_requested"], 20, "{row}");
        assert_eq!(row["cells"], 20, "every Cell was created: {row}");
        row["per_node_per_s"].as_f64().expect("a rate")
    };
    let (log, cell) = (per_node(&runs[0]), per_node(&runs[1]));
    assert!(log > 0.0 && cell > 0.0, "{report}");
    // Only the log-mode run writes segments.
    assert!(
        runs[0]["fleet"][0]["phases"]["segments"]
            .as_f64()
            .unwrap_or(0.0)
            > 0.0,
        "{report}"
    );
    assert_eq!(runs[1]["fleet"][0]["phases"]["segments"], 0.0, "{report}");
    for run in runs {
        // The local store goes with each cluster's directory, counted.
        let cleanup = &run["cleanup"];
        assert_eq!(
            cleanup["note"], "the local store, deleted with the cluster directory",
            "{cleanup}"
        );
        assert!(
            cleanup["deleted_objects"].as_u64().unwrap_or(0) > 0,
            "{cleanup}"
        );
    }
    let compared = &report["log_against_cell"];
    assert_eq!(compared["order"], serde_json::json!(["log", "cell"]));
    let fleet = &compared["fleet"][0];
    assert_eq!(fleet["log_per_node_per_s"].as_f64(), Some(log), "{fleet}");
    assert_eq!(fleet["cell_per_node_per_s"].as_f64(), Some(cell), "{fleet}");
    let over = fleet["log_over_cell"].as_f64().expect("a ratio");
    assert!((over - log / cell).abs() < 1e-9, "{fleet}");
    let command = &compared["workloads"][0];
    assert_eq!(command["name"], "local_command", "{compared}");
    assert_eq!(command["concurrency"], 1, "{compared}");
    let goal = &compared["goals"][0];
    assert_eq!(
        goal["goal"], "fleet at 1000 cells: log >= 10 x cell per node",
        "{goal}"
    );
    assert!(goal["met"].is_null(), "{goal}");
    assert!(
        stdout.contains("fleet at 1000 cells: log >= 10 x cell per node: not measured in this run"),
        "{stdout}"
    );
}

/// `--keep-objects` on the local store keeps the store: it is moved out of
/// the cluster directory (deleted with the run), and the report names
/// where it went.
#[test]
fn bench_keeps_the_local_store_when_asked() {
    let (stdout, _, report) = bench(&[
        "local_command",
        "--store",
        "local",
        "--nodes",
        "1",
        "--duration",
        "0.5",
        "--warmup",
        "0",
        "--concurrency",
        "1",
        "--keep-objects",
    ]);
    let note = report["cleanup"]["note"].as_str().expect("a note");
    let kept = std::path::PathBuf::from(
        note.strip_prefix("kept: local ")
            .unwrap_or_else(|| panic!("the note names the kept store: {note}")),
    );
    assert!(
        stdout.contains(&format!(
            "clean-up: 0 objects deleted (kept: local {})",
            kept.display()
        )),
        "{stdout}"
    );
    let store = report["config"]["store_detail"]
        .as_str()
        .and_then(|detail| detail.strip_prefix("local "))
        .map(std::path::PathBuf::from)
        .expect("the run's store");
    let cluster_dir = store.parent().expect("the cluster directory");
    assert!(
        !cluster_dir.exists(),
        "the cluster directory went with the run: {}",
        cluster_dir.display()
    );
    // The Cells' objects are there: roots and the node log's segments.
    let mut files = 0;
    let mut stack = vec![kept.clone()];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).expect("the kept store") {
            let entry = entry.expect("an entry");
            if entry.file_type().expect("a type").is_dir() {
                stack.push(entry.path());
            } else {
                files += 1;
            }
        }
    }
    assert!(files > 0, "{}", kept.display());
    std::fs::remove_dir_all(kept.parent().expect("the kept directory"))
        .expect("remove the kept store");
}

/// Bad options are refused before any node starts, each naming
/// its range.
#[test]
fn bench_refuses_out_of_range_seconds_before_starting_nodes() {
    for (option, value, says) in [
        (
            "--drain-timeout-s",
            "0",
            "--drain-timeout-s: give seconds between 1 and 86400",
        ),
        (
            "--fleet-settle-s",
            "-1",
            "--fleet-settle-s: give seconds between 0 and 3600",
        ),
        (
            "--publication",
            "log,log",
            "--publication names log twice; give log, cell or log,cell",
        ),
    ] {
        let output = Command::new(BIN)
            .args(["bench", "fleet", "--store", "local"])
            .arg(format!("{option}={value}"))
            .output()
            .expect("run cellfleet bench");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{option}: {stderr}");
        assert!(stderr.contains(says), "{option}: {stderr}");
        assert!(!stderr.contains("bench: starting"), "{option}: {stderr}");
    }
}

/// The shipped binary carries no path of the machine it was built on:
/// outside a checkout, with no S3 server configured, `bench --store s3`
/// says what to do instead of running a script that is not there.
#[test]
fn bench_outside_a_checkout_without_an_s3_server_says_what_to_do() {
    let dir = tempfile::tempdir().expect("tempdir");
    let output = Command::new(BIN)
        .args(["bench", "local_query", "--store", "s3", "--duration", "1"])
        .current_dir(dir.path())
        .env_remove("CELLFLEET_S3_ENDPOINT")
        .output()
        .expect("run cellfleet bench");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("CELLFLEET_S3_ENDPOINT") && stderr.contains("--store local"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
