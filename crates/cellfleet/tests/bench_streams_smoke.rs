//! Smoke test of `cellfleet bench-streams`: a tiny run against one real node on the local store delivers every long-poll and SSE append exactly once and in order, acknowledges every append, and reports the medians (correctness only, never timings).

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_cellfleet");

fn rows<'a>(report: &'a serde_json::Value, measure: &str) -> Vec<&'a serde_json::Value> {
    report["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .filter(|row| row["measure"] == measure)
        .collect()
}

#[test]
fn bench_streams_measures_a_node_and_every_delivery_is_exact() {
    let dir = tempfile::tempdir().expect("tempdir");
    let json_path = dir.path().join("out.json");
    let output = Command::new(BIN)
        .args([
            "bench-streams",
            "--store",
            "local",
            "--streams",
            "20,40",
            "--writers",
            "4",
            "--duration",
            "0.5",
            "--warmup",
            "0.1",
            "--repeats",
            "2",
            "--long-polls",
            "5",
            "--subscribers",
            "10",
            "--sse-appends",
            "3",
            "--sse-interval-ms",
            "20",
            // Fewer open Cells than streams: appends reopen passivated
            // streams, and every delivery must still be exact.
            "--cells-open-max",
            "16",
            "--json",
        ])
        .arg(&json_path)
        .output()
        .expect("run cellfleet bench-streams");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "cellfleet bench-streams failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    assert!(
        stderr.contains("cells open at most 16 (cells_open_max 16,"),
        "the node's start line shows the bound it applies:\n{stderr}"
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json_path).expect("the JSON report"))
            .expect("the report is JSON");
    assert_eq!(report["targets"][0]["name"], "cellfleet", "{report}");

    let creates = rows(&report, "create");
    assert_eq!(
        creates.iter().map(|r| r["to"].as_u64()).collect::<Vec<_>>(),
        [Some(20), Some(40)],
        "{report}"
    );
    let appends = rows(&report, "appends");
    assert_eq!(appends.len(), 4, "two stream counts, two repeats: {report}");
    for row in &appends {
        assert_eq!(row["errors"], 0, "{row}");
    }
    // An append counts when it is sent inside its 0.5 s window, so one
    // stall of the machine longer than that (a debug build on 2 shared
    // cores, an fsync behind a build's writes) can leave a row empty
    // without anything being wrong: this is a correctness test, so only
    // the whole run must have measured appends.
    let counted: u64 = appends
        .iter()
        .map(|row| row["count"].as_u64().expect("a count"))
        .sum();
    assert!(counted > 0, "no append was measured: {report}");
    let long_polls = rows(&report, "long_poll");
    assert_eq!(long_polls.len(), 2, "{report}");
    for row in long_polls {
        assert_eq!(row["samples"], 5, "{row}");
        assert_eq!(row["wrong"], 0, "{row}");
    }
    let fanouts = rows(&report, "sse_fanout");
    assert_eq!(fanouts.len(), 2, "{report}");
    for row in fanouts {
        assert_eq!(row["expected"], 30, "{row}");
        assert_eq!(
            row["samples"], 30,
            "every subscriber got every append: {row}"
        );
        assert_eq!(row["wrong"], 0, "{row}");
        assert_eq!(row["unconnected"], 0, "{row}");
    }
    // The node's footprint after each stream count: a live process with
    // open files, and on disk its cache and the local store, at least one
    // file per stream Cell somewhere.
    let footprints = rows(&report, "footprint");
    assert_eq!(
        footprints
            .iter()
            .map(|r| r["streams"].as_u64())
            .collect::<Vec<_>>(),
        [Some(20), Some(40)],
        "{report}"
    );
    for row in footprints {
        assert!(row["rss_bytes"].as_u64().unwrap_or(0) > 1 << 20, "{row}");
        assert!(row["open_files"].as_u64().unwrap_or(0) > 10, "{row}");
        let files = row["disk_files"].as_u64().unwrap_or(0);
        assert!(files >= row["streams"].as_u64().unwrap(), "{row}");
        assert!(
            row["disk"]["n1"]["files"].as_u64().unwrap_or(0) > 0,
            "{row}"
        );
        assert!(
            row["disk"]["store"]["files"].as_u64().unwrap_or(0) > 0,
            "{row}"
        );
    }
    assert!(stdout.contains("footprint"), "{stdout}");
    let median = &report["summary"]["median"]["cellfleet"];
    assert!(
        median["rss_bytes_40"].as_f64().unwrap_or(0.0) > 0.0,
        "{median}"
    );
    // A number, though it may be 0 after a stall (see the append rows).
    assert!(median["appends_per_s_40"].is_f64(), "{median}");
    assert!(median["cardinality_ratio"].is_f64(), "{median}");
}

#[test]
fn bench_streams_refuses_a_writer_for_no_target() {
    let output = Command::new(BIN)
        .args([
            "bench-streams",
            "--no-cellfleet",
            "--url",
            "a=http://127.0.0.1:9",
            "--writer",
            "b=http://127.0.0.1:10",
        ])
        .output()
        .expect("run cellfleet bench-streams");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--writer b=http://127.0.0.1:10: no target named b"),
        "{stderr}"
    );
}
