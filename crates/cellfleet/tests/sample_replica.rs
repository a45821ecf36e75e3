//! The sample replica in `examples/litestream-replica` (three files written
//! by Litestream 0.5.17) restores with the commands the README shows.

use std::path::Path;
use std::process::Command;

#[test]
fn readme_restore_of_the_sample_replica_gives_the_notes() {
    let replica = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/litestream-replica");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("notes.db");
    let status = Command::new(env!("CARGO_BIN_EXE_cellfleet"))
        .args(["ltx", "restore"])
        .arg(&replica)
        .arg("-o")
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success());
    let db = rusqlite::Connection::open(&out).unwrap();
    let rows: Vec<(i64, String)> = db
        .prepare("SELECT id, body FROM notes ORDER BY id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        rows,
        vec![
            (
                2,
                "note 2: written by sqlite, replicated by litestream (edited)".to_string()
            ),
            (
                3,
                "note 3: written by sqlite, replicated by litestream".to_string()
            ),
            (4, "note 4: added after the first sync".to_string()),
        ]
    );
    let integrity: String = db
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(integrity, "ok");
}

#[test]
fn inspect_reports_a_damaged_file_and_exits_2() {
    let replica = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/litestream-replica");
    let dir = tempfile::tempdir().unwrap();
    let mut bytes =
        std::fs::read(replica.join("ltx/0/0000000000000002-0000000000000002.ltx")).unwrap();
    let n = bytes.len();
    bytes[n - 1] ^= 0x55;
    let damaged = dir.path().join("damaged.ltx");
    std::fs::write(&damaged, bytes).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_cellfleet"))
        .args(["ltx", "inspect", "--json"])
        .arg(&damaged)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["verified"], false);
    assert!(json["error"]
        .as_str()
        .unwrap()
        .contains("file checksum mismatch"));
}
