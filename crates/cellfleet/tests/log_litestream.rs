//! A log-mode Cell's chain, after many checkpoints, compactions and the
//! collection of the LTX files they replaced, still restores with the real
//! Litestream 0.5.17 (`litestream restore`) and with `cellfleet ltx
//! restore`, to exactly the rows its commands wrote.
//!
//! A real node process on the local-directory store, checkpointing every 4
//! records (`CELLFLEET_LOG_CHECKPOINT_RECORDS`) and collecting at once
//! (`CELLFLEET_GC_MIN_AGE_MS=0`); the root and its chain are read from the
//! store's directory after the node drained.

mod cluster_common;
mod common;

use std::path::{Path, PathBuf};
use std::process::Command as Process;
use std::time::{Duration, Instant};

use cellfleet_authority::{CellId, RootRecord};
use cellfleet_client::{Command, Outcome};
use cluster_common::{metric, Cluster, Store};
use common::{cellfleet, litestream, run};

const COMMANDS: usize = 150;

/// Every file below `dir` whose path ends with `suffix`.
fn find(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if path.to_string_lossy().ends_with(suffix) {
                found.push(path);
            }
        }
    }
    found
}

fn tags(db: &Path) -> Vec<String> {
    let conn = rusqlite::Connection::open(db).unwrap();
    let mut statement = conn
        .prepare("SELECT tag FROM entries ORDER BY rowid")
        .unwrap();
    statement
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpointed_and_collected_chain_restores_with_litestream() {
    let mut cluster = Cluster::start_with_env(
        1,
        Store::Local,
        2_000,
        &[
            ("CELLFLEET_LOG_CHECKPOINT_RECORDS", "4"),
            ("CELLFLEET_GC_MIN_AGE_MS", "0"),
        ],
    );
    let client = cluster.library_client();
    let expected: Vec<String> = (0..COMMANDS).map(|n| format!("t{n}")).collect();
    for tag in &expected {
        let executed = client
            .execute(
                &Command::new("log", "restore-1", "append").args(serde_json::json!({"tag": tag})),
            )
            .await
            .unwrap();
        assert!(
            matches!(executed.outcome, Outcome::Applied(_)),
            "{executed:?}"
        );
    }
    let node = &cluster.nodes[0];
    let checkpoints = metric(node, "cellfleet_runtime_checkpoints_total");
    assert!(
        checkpoints >= (COMMANDS / 4 / 2) as f64,
        "a checkpoint every 4 records: {checkpoints}"
    );
    assert!(metric(node, "cellfleet_runtime_compactions_total") >= 1.0);
    // The files compaction replaced are collected (after a minimum age of 0).
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(node, "cellfleet_runtime_gc_ltx_deleted_total") < 1.0 {
        assert!(
            Instant::now() < deadline,
            "no replaced LTX file was collected"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(cluster.terminate(0), "the node drains and exits 0");

    // The released root and its chain, from the store's directory.
    let objects = cluster.path("store").join("objects");
    let cell = CellId::for_kind_key("log", b"restore-1");
    let roots = find(&objects, &format!("{cell}/root.json"));
    assert_eq!(roots.len(), 1, "{roots:?}");
    let root = RootRecord::decode(&std::fs::read(&roots[0]).unwrap()).unwrap();
    assert!(root.log.is_none(), "drained: the chain is the whole state");
    let chain: Vec<Vec<u8>> = root
        .chain
        .iter()
        .map(|file| std::fs::read(objects.join(&file.key)).unwrap())
        .collect();
    let ltx_left = find(&objects, ".ltx")
        .into_iter()
        .filter(|path| path.to_string_lossy().contains(&format!("{cell}/ltx/")))
        .count();
    assert_eq!(
        ltx_left,
        chain.len(),
        "only the chain's files are left of the Cell's LTX files"
    );

    let dir = tempfile::tempdir().unwrap();
    let replica = dir.path().join("replica");
    let bytes: Vec<&[u8]> = chain.iter().map(Vec::as_slice).collect();
    cellfleet_cell::replica::write_file_replica(&replica, &bytes).unwrap();

    let by_litestream = dir.path().join("litestream.db");
    let mut restore = Process::new(litestream());
    restore
        .arg("restore")
        .arg("-o")
        .arg(&by_litestream)
        .arg(format!("file://{}", replica.display()));
    run(restore);
    assert_eq!(tags(&by_litestream), expected, "litestream restore");

    let by_cellfleet = dir.path().join("cellfleet.db");
    let mut restore = cellfleet();
    restore
        .args(["ltx", "restore"])
        .arg(&replica)
        .arg("-o")
        .arg(&by_cellfleet);
    run(restore);
    assert!(
        std::fs::read(&by_cellfleet).unwrap() == std::fs::read(&by_litestream).unwrap(),
        "both tools restore the same bytes"
    );
}
