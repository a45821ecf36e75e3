//! Commands per second into one Cell (execute + capture + LTX encode +
//! confirm) for group sizes 1, 16 and 128, next to the floor measured in
//! the same run: the same inserts as bare SQLite transactions (WAL,
//! synchronous=NORMAL), no ledger, no capture. Runs are interleaved
//! (A B B A ...) and medians printed.
//!
//! `cargo run --release -p cellfleet-cell --example cell_throughput [commands_per_run] [rounds]`

use std::time::Instant;

use cellfleet_cell::{Cell, CellConfig, Command, Manifest, Position};
use serde_json::json;

const MANIFEST: &str = r#"
[kinds.bench]
migrations = ["CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)"]
[kinds.bench.commands.insert]
sql = "INSERT INTO t (v) VALUES (:v)"
"#;

const NOW: i64 = 1_700_000_000_000;

fn engine_run(group: usize, commands: usize, seq: &mut u64) -> f64 {
    let dir = tempfile::tempdir().expect("tempdir");
    let kind = Manifest::parse(MANIFEST)
        .expect("manifest")
        .kind("bench")
        .expect("kind");
    let path = dir.path().join("cell.db");
    let opened =
        Cell::open(&path, kind, CellConfig::default(), Position::EMPTY, NOW).expect("open");
    let mut cell = opened.cell;
    if let Some(p) = opened.migration {
        cell.confirm(p.txid).expect("confirm");
    }
    let mut ltx_bytes = 0usize;
    let start = Instant::now();
    for _ in 0..commands / group {
        let batch: Vec<Command> = (0..group)
            .map(|_| {
                *seq += 1;
                let mut id = [0u8; 16];
                id[8..].copy_from_slice(&seq.to_be_bytes());
                Command::new(
                    id,
                    "insert",
                    json!({"v": format!("value-{seq}")}),
                    NOW + 60_000,
                )
            })
            .collect();
        let result = cell.execute(&batch, NOW).expect("execute");
        let p = result.publication.expect("a publication");
        ltx_bytes += p.ltx.len();
        cell.confirm(p.txid).expect("confirm");
    }
    let secs = start.elapsed().as_secs_f64();
    std::hint::black_box(ltx_bytes);
    (commands / group * group) as f64 / secs
}

fn floor_run(group: usize, commands: usize, seq: &mut u64) -> f64 {
    let dir = tempfile::tempdir().expect("tempdir");
    let conn = rusqlite::Connection::open(dir.path().join("floor.db")).expect("open");
    conn.execute_batch(
        "PRAGMA page_size = 4096; PRAGMA auto_vacuum = FULL; PRAGMA journal_mode = WAL; \
         PRAGMA synchronous = NORMAL; CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL);",
    )
    .expect("schema");
    let start = Instant::now();
    for _ in 0..commands / group {
        conn.execute_batch("BEGIN IMMEDIATE").expect("begin");
        for _ in 0..group {
            *seq += 1;
            conn.prepare_cached("INSERT INTO t (v) VALUES (?1)")
                .expect("prepare")
                .execute([format!("value-{seq}")])
                .expect("insert");
        }
        conn.execute_batch("COMMIT").expect("commit");
    }
    let secs = start.elapsed().as_secs_f64();
    (commands / group * group) as f64 / secs
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let commands: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(4096);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    println!("commands per run: {commands}, rounds: {rounds} (interleaved A B B A)");
    println!(
        "{:>6} {:>14} {:>14} {:>10}",
        "group", "cell cmd/s", "floor cmd/s", "overhead"
    );
    let mut seq = 0u64;
    for group in [1usize, 16, 128] {
        let (mut cell, mut floor) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            if round % 2 == 0 {
                cell.push(engine_run(group, commands, &mut seq));
                floor.push(floor_run(group, commands, &mut seq));
            } else {
                floor.push(floor_run(group, commands, &mut seq));
                cell.push(engine_run(group, commands, &mut seq));
            }
        }
        let (c, f) = (median(cell), median(floor));
        println!(
            "{group:>6} {c:>14.0} {f:>14.0} {:>9.1}%",
            (f / c - 1.0) * 100.0
        );
    }
    println!("overhead = extra time per command relative to the floor (floor/cell - 1)");
}
