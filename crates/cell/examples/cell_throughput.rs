//! Commands per second into one Cell (execute + capture + LTX encode +
//! confirm) for group sizes 1, 16 and 128, next to floors measured in the
//! same run, so the report can say where the time goes:
//!
//! - `sqlite`: the same inserts as bare SQLite transactions (WAL,
//!   synchronous=NORMAL), no ledger, no capture;
//! - `sqlite+ledger`: plus, per command, the ledger lookup (in memory, as
//!   the engine's index of its ledger) and one ledger row (the engine's
//!   schema) and, per group, the TXID bump;
//! - `sqlite+ledger+savepoint`: plus a savepoint around each command;
//! - `cell`: the engine, whose own capture timer (WAL read, checksums, LTX
//!   encode) splits its time into capture and the rest;
//! - `cell-pipelined`: the engine with each group confirmed only after the
//!   next one executed (two pending at a time, as a runtime publishing one
//!   group while executing the next drives it).
//!
//! Runs are interleaved (A B C D, D C B A, ...) and medians printed.
//!
//! `cargo run --release -p cellfleet-cell --example cell_throughput [commands_per_run] [rounds] [groups] [variants]`
//! e.g. `... 4096 7 16 cell,sqlite` (groups and variants are comma lists).
//! `... --once VARIANT GROUP COMMANDS` runs one variant once, untimed, for
//! counting instructions (`scripts/instructions.sh`).
//! `CELL_BENCH_IDS=random` sends random-like command ids (repeatable);
//! `CELL_BENCH_PAGES=1` prints the LTX pages and bytes per command.

use std::time::Instant;

use cellfleet_cell::{Cell, CellConfig, Command, Manifest, Position};
use rusqlite::Connection;
use serde_json::json;

mod shared;

use shared::{MANIFEST, NOW};

/// The engine's ledger, as `crates/cell/src/ledger.rs` declares it.
const LEDGER: &str = "
CREATE TABLE _cellfleet_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
INSERT INTO _cellfleet_meta VALUES ('txid', 0);
CREATE TABLE _cellfleet_entries (
    seq INTEGER PRIMARY KEY,
    id BLOB NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    digest BLOB NOT NULL,
    txid INTEGER NOT NULL,
    outcome TEXT NOT NULL
);
";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Variant {
    Sqlite,
    Ledger,
    Savepoint,
    Cell,
    CellPipelined,
}

impl Variant {
    fn parse(name: &str) -> Option<Variant> {
        Some(match name {
            "sqlite" => Variant::Sqlite,
            "sqlite+ledger" => Variant::Ledger,
            "sqlite+ledger+savepoint" => Variant::Savepoint,
            "cell" => Variant::Cell,
            "cell-pipelined" => Variant::CellPipelined,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Variant::Sqlite => "sqlite",
            Variant::Ledger => "sqlite+ledger",
            Variant::Savepoint => "sqlite+ledger+savepoint",
            Variant::Cell => "cell",
            Variant::CellPipelined => "cell-pipelined",
        }
    }
}

/// One run: commands per second and, for the engine, the capture share.
struct Sample {
    commands_per_second: f64,
    capture_fraction: f64,
}

/// Command ids: sequential by default; with `CELL_BENCH_IDS=random`,
/// spread like the random ids real clients send (`CommandId::random`), from
/// a fixed mix of the sequence number so instruction counts stay
/// repeatable. Sequential ids append to the ledger's index; random ones
/// land on any of its pages.
fn command_id(seq: u64) -> [u8; 16] {
    let mut id = [0u8; 16];
    if random_ids() {
        id[..8].copy_from_slice(&splitmix(seq).to_be_bytes());
        id[8..].copy_from_slice(&splitmix(!seq).to_be_bytes());
    } else {
        id[8..].copy_from_slice(&seq.to_be_bytes());
    }
    id
}

/// A minute's validity from when the command was sent, one command a
/// millisecond: expiries rise with arrival as a live node's do (the clock
/// the engine is given stays at `NOW`, so nothing is pruned).
fn expires_at_ms(seq: u64) -> i64 {
    NOW + 60_000 + seq as i64
}

fn random_ids() -> bool {
    static RANDOM: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *RANDOM.get_or_init(|| std::env::var("CELL_BENCH_IDS").is_ok_and(|v| v == "random"))
}

/// SplitMix64's finaliser: a bijection of `u64` that scatters neighbours.
fn splitmix(seq: u64) -> u64 {
    let mut z = seq.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn engine_run(group: usize, commands: usize, pipelined: bool, seq: &mut u64) -> Sample {
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
    let before = cell.capture_stats();
    let mut ltx_bytes = 0usize;
    let count_pages = std::env::var_os("CELL_BENCH_PAGES").is_some();
    let mut pages = 0usize;
    let mut previous = None;
    let start = Instant::now();
    for _ in 0..commands / group {
        let batch: Vec<Command> = (0..group)
            .map(|_| {
                *seq += 1;
                Command::new(
                    command_id(*seq),
                    "insert",
                    json!({"v": format!("value-{seq}")}),
                    expires_at_ms(*seq),
                )
            })
            .collect();
        if !cell.can_execute() {
            // The WAL waits for a checkpoint: drain the pipeline.
            if let Some(txid) = previous.take() {
                cell.confirm(txid).expect("confirm");
            }
        }
        let result = cell.execute(&batch, NOW).expect("execute");
        let p = result.publication.expect("a publication");
        ltx_bytes += p.ltx.len();
        if count_pages {
            pages += cellfleet_ltx::decode_all(&p.ltx)
                .expect("decode")
                .pages
                .len();
        }
        if pipelined {
            if let Some(txid) = previous.replace(p.txid) {
                cell.confirm(txid).expect("confirm");
            }
        } else {
            cell.confirm(p.txid).expect("confirm");
        }
    }
    if let Some(txid) = previous {
        cell.confirm(txid).expect("confirm");
    }
    let secs = start.elapsed().as_secs_f64();
    std::hint::black_box(ltx_bytes);
    if count_pages {
        let done = commands / group * group;
        eprintln!(
            "pages per command {:.3}, LTX bytes per command {:.0}",
            pages as f64 / done as f64,
            ltx_bytes as f64 / done as f64
        );
    }
    let capture = cell.capture_stats().capture_nanos_total - before.capture_nanos_total;
    Sample {
        commands_per_second: (commands / group * group) as f64 / secs,
        capture_fraction: capture as f64 / 1e9 / secs,
    }
}

fn floor_run(variant: Variant, group: usize, commands: usize, seq: &mut u64) -> Sample {
    let dir = tempfile::tempdir().expect("tempdir");
    let conn = Connection::open(dir.path().join("floor.db")).expect("open");
    conn.execute_batch(
        "PRAGMA page_size = 4096; PRAGMA auto_vacuum = FULL; PRAGMA journal_mode = WAL; \
         PRAGMA synchronous = NORMAL; CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL);",
    )
    .expect("schema");
    let ledger = variant != Variant::Sqlite;
    let savepoint = variant == Variant::Savepoint;
    if ledger {
        conn.execute_batch(LEDGER).expect("ledger schema");
    }
    let outcome = r#"{"status":"applied","result":{"changes":1}}"#;
    let mut txid = 1i64;
    let mut seen = std::collections::HashMap::new();
    let start = Instant::now();
    for _ in 0..commands / group {
        conn.prepare_cached("BEGIN IMMEDIATE")
            .and_then(|mut s| s.execute([]))
            .expect("begin");
        for _ in 0..group {
            *seq += 1;
            let id = command_id(*seq);
            if ledger {
                // The engine finds ids in its in-memory index of the ledger.
                assert!(!seen.contains_key(&id));
            }
            if savepoint {
                conn.prepare_cached("SAVEPOINT command")
                    .and_then(|mut s| s.execute([]))
                    .expect("savepoint");
            }
            conn.prepare_cached("INSERT INTO t (v) VALUES (?1)")
                .expect("prepare")
                .execute([format!("value-{seq}")])
                .expect("insert");
            if savepoint {
                conn.prepare_cached("RELEASE command")
                    .and_then(|mut s| s.execute([]))
                    .expect("release");
            }
            if ledger {
                let mut digest = [0u8; 32];
                digest[..16].copy_from_slice(&id);
                digest[16..].copy_from_slice(&id);
                conn.prepare_cached(
                    "INSERT INTO _cellfleet_entries (id, expires_at_ms, digest, txid, outcome) \
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )
                .and_then(|mut s| {
                    s.execute((&id[..], expires_at_ms(*seq), &digest[..], txid, outcome))
                })
                .expect("record");
                seen.insert(id, conn.last_insert_rowid());
            }
        }
        if ledger {
            txid += 1;
            conn.prepare_cached("UPDATE _cellfleet_meta SET value = ?1 WHERE key = 'txid'")
                .and_then(|mut s| s.execute([txid]))
                .expect("txid");
        }
        conn.prepare_cached("COMMIT")
            .and_then(|mut s| s.execute([]))
            .expect("commit");
    }
    let secs = start.elapsed().as_secs_f64();
    Sample {
        commands_per_second: (commands / group * group) as f64 / secs,
        capture_fraction: 0.0,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Runs `variant` once over `commands` commands in groups of `group`,
/// untimed: the unit `scripts/instructions.sh` counts under callgrind.
fn run_once(variant: Variant, group: usize, commands: usize) {
    let mut seq = 0u64;
    match variant {
        Variant::Cell => drop(engine_run(group, commands, false, &mut seq)),
        Variant::CellPipelined => drop(engine_run(group, commands, true, &mut seq)),
        floor => drop(floor_run(floor, group, commands, &mut seq)),
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    if std::env::args().nth(1).as_deref() == Some("--once") {
        // --once VARIANT GROUP COMMANDS
        let mut once = std::env::args().skip(2);
        let variant = once
            .next()
            .and_then(|v| Variant::parse(&v))
            .expect("--once VARIANT GROUP COMMANDS: variant sqlite, sqlite+ledger, sqlite+ledger+savepoint, cell or cell-pipelined");
        let group: usize = once.next().and_then(|g| g.parse().ok()).expect("GROUP");
        let commands: usize = once.next().and_then(|c| c.parse().ok()).expect("COMMANDS");
        run_once(variant, group.max(1), commands);
        return;
    }
    let commands: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(4096);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    let groups: Vec<usize> = args
        .next()
        .map(|a| a.split(',').filter_map(|g| g.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 16, 128]);
    let variants: Vec<Variant> = args
        .next()
        .map(|a| a.split(',').filter_map(Variant::parse).collect())
        .unwrap_or_else(|| {
            vec![
                Variant::Sqlite,
                Variant::Ledger,
                Variant::Savepoint,
                Variant::Cell,
                Variant::CellPipelined,
            ]
        });
    println!("commands per run: {commands}, rounds: {rounds} (interleaved, order reversed every other round)");
    println!(
        "{:>6} {:<26} {:>12} {:>12} {:>12}",
        "group", "variant", "cmd/s", "us/command", "vs sqlite"
    );
    let mut seq = 0u64;
    for &group in &groups {
        let mut samples: Vec<Vec<Sample>> = variants.iter().map(|_| Vec::new()).collect();
        for round in 0..rounds {
            let mut order: Vec<usize> = (0..variants.len()).collect();
            if round % 2 == 1 {
                order.reverse();
            }
            for i in order {
                let sample = match variants[i] {
                    Variant::Cell => engine_run(group, commands, false, &mut seq),
                    Variant::CellPipelined => engine_run(group, commands, true, &mut seq),
                    floor => floor_run(floor, group, commands, &mut seq),
                };
                samples[i].push(sample);
            }
        }
        let rates: Vec<f64> = samples
            .iter()
            .map(|s| median(s.iter().map(|x| x.commands_per_second).collect()))
            .collect();
        let sqlite = variants
            .iter()
            .position(|v| *v == Variant::Sqlite)
            .map(|i| rates[i]);
        for (i, variant) in variants.iter().enumerate() {
            let overhead = sqlite
                .map(|f| format!("{:>+11.1}%", (f / rates[i] - 1.0) * 100.0))
                .unwrap_or_default();
            println!(
                "{group:>6} {:<26} {:>12.0} {:>12.2} {overhead}",
                variant.name(),
                rates[i],
                1e6 / rates[i],
            );
            if matches!(variant, Variant::Cell | Variant::CellPipelined) {
                let fraction = median(samples[i].iter().map(|x| x.capture_fraction).collect());
                println!(
                    "{group:>6} {:<26} {:>12} {:>12.2} {:>11.1}% of cell time",
                    "  of which capture",
                    "",
                    fraction * 1e6 / rates[i],
                    fraction * 100.0
                );
            }
        }
    }
    println!(
        "vs sqlite = extra time per command relative to the bare SQLite floor (floor/variant - 1)"
    );
}
