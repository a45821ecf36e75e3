//! What a node pays per command when nearly every command opens one Cell
//! and closes another (many more Cells owned than kept open): one
//! `Cell::open` at the Cell's position, one command executed and
//! confirmed, one `Cell::close`, over `cells` Cells in turn while `open`
//! other Cells stay open (SQLite's unix VFS looks through every open file
//! on each open). Prints the medians of `rounds` runs, with the same
//! command on a Cell that stays open as the floor.
//!
//! `cargo run --release -p cellfleet-cell --example open_close [cycles] [rounds] [cells] [open] [keep]`
//! e.g. `... 2000 5 500 1024`; a fifth argument `1` closes with
//! [`Cell::close_keeping_sidecars`] (as a parked Cell is closed), `0` (the
//! default) with [`Cell::close`].

use std::path::Path;
use std::time::Instant;

use cellfleet_cell::{Cell, CellConfig, Command, Manifest, Position};
use serde_json::json;

mod shared;

use shared::{MANIFEST, NOW};

fn command(seq: u64) -> Command {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&seq.to_be_bytes());
    Command::new(
        id,
        "insert",
        json!({"v": format!("value-{seq}")}),
        NOW + 60_000,
    )
}

/// Opens (creating) the Cell at `path`, runs one command, confirms it and
/// returns the open Cell and its new position.
fn open_run(path: &Path, at: Position, seq: u64) -> (Cell, Position) {
    let kind = Manifest::parse(MANIFEST)
        .expect("manifest")
        .kind("bench")
        .expect("kind");
    let opened = Cell::open(path, kind, CellConfig::default(), at, NOW).expect("open");
    let mut cell = opened.cell;
    if let Some(migration) = opened.migration {
        cell.confirm(migration.txid).expect("confirm");
    }
    let result = cell.execute(&[command(seq)], NOW).expect("execute");
    let publication = result.publication.expect("a publication");
    cell.confirm(publication.txid).expect("confirm");
    let position = cell.published_position();
    (cell, position)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("a whole number"))
        .collect();
    let cycles = args.first().copied().unwrap_or(2_000);
    let rounds = args.get(1).copied().unwrap_or(5);
    let cells = args.get(2).copied().unwrap_or(500).max(1);
    let open = args.get(3).copied().unwrap_or(1_024);
    let keep = args.get(4).copied().unwrap_or(0) == 1;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut seq = 0u64;
    // The Cells that stay open, as on a node at its open-Cell bound.
    let _kept: Vec<Cell> = (0..open)
        .map(|n| {
            seq += 1;
            open_run(
                &dir.path().join(format!("kept-{n}.db")),
                Position::EMPTY,
                seq,
            )
            .0
        })
        .collect();
    let mut positions: Vec<Position> = (0..cells)
        .map(|n| {
            seq += 1;
            let (cell, at) = open_run(
                &dir.path().join(format!("cycled-{n}.db")),
                Position::EMPTY,
                seq,
            );
            cell.close();
            at
        })
        .collect();
    let (mut floor, _) = open_run(&dir.path().join("floor.db"), Position::EMPTY, 0);
    let (mut cycled_us, mut floor_us) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let start = Instant::now();
        for cycle in 0..cycles {
            seq += 1;
            let n = cycle % cells;
            let (cell, at) = open_run(
                &dir.path().join(format!("cycled-{n}.db")),
                positions[n],
                seq,
            );
            if keep {
                cell.close_keeping_sidecars();
            } else {
                cell.close();
            }
            positions[n] = at;
        }
        cycled_us.push(start.elapsed().as_secs_f64() * 1e6 / cycles as f64);
        let start = Instant::now();
        for _ in 0..cycles {
            seq += 1;
            let result = floor.execute(&[command(seq)], NOW).expect("execute");
            let publication = result.publication.expect("a publication");
            floor.confirm(publication.txid).expect("confirm");
        }
        floor_us.push(start.elapsed().as_secs_f64() * 1e6 / cycles as f64);
    }
    let (cycled, floor) = (median(cycled_us), median(floor_us));
    let how = if keep {
        "keeping -wal/-shm"
    } else {
        "removing -wal/-shm"
    };
    println!("open + command + close ({how}), {cells} Cells in turn, {open} others open: {cycled:.1} us per command (median of {rounds})");
    println!("the same command on a Cell that stays open:                        {floor:.1} us per command");
    println!("ratio: {:.1}x", cycled / floor);
}
