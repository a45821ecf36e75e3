//! Engine behaviour: groups, exactly-once, abort, recovery, kinds, limits.

mod common;

use std::sync::Arc;

use cellfleet_cell::kv::{KvCommand, KvOutput, KvQuery};
use cellfleet_cell::{
    kind::to_wire, Cell, CellConfig, Checksum, Command, Error, Kind, Kv, Manifest, Outcome,
    Position, RejectCode, Typed,
};
use cellfleet_ltx::HEADER_FLAG_NO_CHECKSUM;
use common::{id, Harness, NOW};
use serde_json::{json, Value};

fn kv() -> Arc<dyn Kind> {
    Arc::new(Typed(Kv))
}

fn kv_cmd(n: u64, c: &KvCommand) -> Command {
    let (name, args) = to_wire(c).unwrap();
    Command::new(id(n), name, args, NOW + 60_000)
}

fn put(n: u64, key: &str, value: Value) -> Command {
    kv_cmd(
        n,
        &KvCommand::Put {
            key: key.into(),
            value,
        },
    )
}

fn get(cell: &Cell, key: &str) -> Option<Value> {
    let (name, args) = to_wire(&KvQuery::Get { key: key.into() }).unwrap();
    match serde_json::from_value(cell.query(&name, &args).unwrap()).unwrap() {
        KvOutput::Value { value } => value,
        other => panic!("{other:?}"),
    }
}

#[test]
fn groups_publish_and_recover_byte_identical() {
    let mut h = Harness::new(kv(), CellConfig::default());
    assert_eq!(h.position().txid.0, 1, "creation publishes txid 1");
    for round in 0..5u64 {
        let group: Vec<_> = (0..10)
            .map(|i| put(round * 100 + i, &format!("k{i}"), json!(round)))
            .collect();
        let r = h.run(&group);
        assert!(r
            .results
            .iter()
            .all(|c| matches!(c.outcome, Outcome::Applied { .. })));
        let p = r.publication.unwrap();
        assert!(!p.is_snapshot());
        assert_eq!(p.txid.0, round + 2);
    }
    assert_eq!(get(h.cell(), "k3"), Some(json!(4)));
    let (pos, recovered) = h.recover_bytes("r.db");
    assert_eq!(pos, h.position());
    assert_eq!(recovered, h.live_bytes());
}

#[test]
fn exactly_once_same_group_later_group_and_after_recovery() {
    let mut h = Harness::new(kv(), CellConfig::default());
    let cmd = kv_cmd(
        7,
        &KvCommand::Cas {
            key: "a".into(),
            expected: None,
            value: Some(json!(1)),
        },
    );
    let r = h.run(&[cmd.clone(), cmd.clone()]);
    assert!(!r.results[0].duplicate && r.results[1].duplicate);
    assert_eq!(r.results[0].outcome, r.results[1].outcome);
    let first = r.results[0].clone();
    // Later group: not re-executed (a second CAS from None would fail).
    let r = h.run(std::slice::from_ref(&cmd));
    assert!(r.publication.is_none(), "a pure duplicate changes nothing");
    assert_eq!(r.results[0].outcome, first.outcome);
    assert_eq!(r.results[0].txid, first.txid);
    // Same id, other payload: refused.
    let other = kv_cmd(
        7,
        &KvCommand::Put {
            key: "a".into(),
            value: json!(2),
        },
    );
    let r = h.run(&[other]);
    assert!(
        matches!(&r.results[0].outcome, Outcome::Rejected { rejection } if rejection.code == RejectCode::IdReused)
    );
    // After recovery into a fresh engine.
    let pos = h.position();
    let fresh = h.dir.path().join("fresh.db");
    assert_eq!(
        cellfleet_cell::recover(h.chain_files(), &fresh).unwrap(),
        pos
    );
    let mut cell = Cell::open(&fresh, kv(), CellConfig::default(), pos, NOW)
        .unwrap()
        .cell;
    let r = cell.execute(&[cmd], NOW).unwrap();
    assert!(r.publication.is_none());
    assert_eq!(r.results[0].outcome, first.outcome);
    assert!(r.results[0].duplicate);
    assert_eq!(get(&cell, "a"), Some(json!(1)));
}

#[test]
fn expired_commands_are_refused_before_running() {
    let mut h = Harness::new(kv(), CellConfig::default());
    let mut c = put(1, "x", json!(1));
    c.expires_at_ms = NOW - 1;
    let r = h.run(&[c]);
    assert!(
        matches!(&r.results[0].outcome, Outcome::Rejected { rejection } if rejection.code == RejectCode::Expired)
    );
    assert!(r.publication.is_none());
    assert_eq!(get(h.cell(), "x"), None);
}

/// Correctness item: the ledger answers before expiry is checked. A retry of
/// a committed command that reaches the Cell after its expiry (a mailbox
/// wait, an extra hop), while its ledger entry is still kept, gets the stored
/// outcome, as `envelope.proto` promises, not "rejected: expired".
#[test]
fn a_committed_command_retried_after_its_expiry_gets_its_stored_outcome() {
    let mut h = Harness::new(kv(), CellConfig::default());
    let mut c = put(1, "x", json!(1));
    c.expires_at_ms = NOW + 1_000;
    let first = h.run(std::slice::from_ref(&c));
    assert!(matches!(first.results[0].outcome, Outcome::Applied { .. }));
    // Past the command's expiry, inside the skew margin: the entry is kept.
    h.now = NOW + 1_001;
    let retry = h.run(&[c]);
    assert!(retry.results[0].duplicate, "{:?}", retry.results[0]);
    assert_eq!(retry.results[0].outcome, first.results[0].outcome);
    assert_eq!(retry.results[0].txid, first.results[0].txid);
    assert!(retry.publication.is_none());
}

#[test]
fn aborted_publication_never_leaks() {
    let mut h = Harness::new(kv(), CellConfig::default());
    h.run(&[put(1, "kept", json!(1))]);
    let before = h.position();
    let r = h
        .cell()
        .execute(&[put(2, "lost", json!(2)), put(3, "kept", json!(99))], NOW)
        .unwrap();
    assert!(r.publication.is_some());
    // Queries answer from the published state while it is pending.
    assert_eq!(get(h.cell(), "kept"), Some(json!(1)));
    assert_eq!(get(h.cell(), "lost"), None);
    assert_eq!(h.cell().abort().unwrap(), vec![before.txid.next().unwrap()]);
    assert_eq!(h.position(), before);
    assert_eq!(get(h.cell(), "lost"), None);
    assert_eq!(get(h.cell(), "kept"), Some(json!(1)));
    // The aborted command ids are not in the ledger: they run afresh.
    let r = h.run(&[put(2, "other", json!(5))]);
    assert!(!r.results[0].duplicate);
    let p = r.publication.unwrap();
    assert_eq!(
        p.pre, before,
        "the next publication starts from the published state"
    );
    let (pos, recovered) = h.recover_bytes("r.db");
    assert_eq!(pos, h.position());
    assert_eq!(recovered, h.live_bytes());
}

#[test]
fn abort_after_checkpoint_and_of_creation() {
    let config = CellConfig {
        checkpoint_wal_bytes: 0,
        ..CellConfig::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.db");
    let opened = Cell::open(&path, kv(), config.clone(), Position::EMPTY, NOW).unwrap();
    let mut cell = opened.cell;
    cell.abort().unwrap();
    assert_eq!(cell.position(), Position::EMPTY);
    // Creation again, as part of the next group.
    let r = cell.execute(&[put(1, "a", json!(1))], NOW).unwrap();
    let p1 = r.publication.unwrap();
    assert!(p1.is_snapshot());
    cell.confirm(p1.txid).unwrap(); // checkpoints: the wal is now empty
    let r = cell.execute(&[put(2, "b", json!(2))], NOW).unwrap();
    assert!(r.publication.is_some());
    cell.abort().unwrap();
    assert_eq!(get(&cell, "b"), None);
    assert_eq!(get(&cell, "a"), Some(json!(1)));
    let r = cell.execute(&[put(3, "c", json!(3))], NOW).unwrap();
    let p2 = r.publication.unwrap();
    cell.confirm(p2.txid).unwrap();
    let target = dir.path().join("r.db");
    let pos = cellfleet_cell::recover([p1.chain_file(), p2.chain_file()], &target).unwrap();
    assert_eq!(pos, cell.position());
}

#[test]
fn open_refuses_a_database_ahead_of_the_published_position() {
    let mut h = Harness::new(kv(), CellConfig::default());
    let published = h.position();
    let r = h.cell().execute(&[put(1, "a", json!(1))], NOW).unwrap();
    assert!(r.publication.is_some());
    h.cell.take().unwrap().close(); // crash with a pending publication
    let err = Cell::open(&h.path, kv(), CellConfig::default(), published, NOW).unwrap_err();
    assert!(matches!(err, Error::NotAtPosition { .. }), "{err}");
    // Recovery puts it back, and a live cell's file is never overwritten.
    let cell = recover_and_open(&h, published);
    let err = cellfleet_cell::recover(h.chain_files(), &h.path).unwrap_err();
    assert!(matches!(err, Error::Live(_)), "{err}");
    assert_eq!(get(&cell, "a"), None);
}

/// A Cell's database that another holder keeps connections off (an
/// engine of another process: its VFS's lock) neither opens, nor is
/// rebuilt or tidied under it; all three work once it lets go.
#[test]
fn a_database_another_process_holds_is_neither_opened_nor_rebuilt_nor_tidied() {
    let mut h = Harness::new(kv(), CellConfig::default());
    h.run(&[put(1, "a", json!(1))]);
    let published = h.position();
    h.cell.take().unwrap().close_keeping_sidecars();
    let held = cellfleet_vfs::exclude_connections(&h.path)
        .unwrap()
        .expect("the database exists");
    let err = Cell::open(&h.path, kv(), CellConfig::default(), published, NOW).unwrap_err();
    assert!(matches!(err, Error::Live(_)), "{err}");
    let err = cellfleet_cell::recover(h.chain_files(), &h.path).unwrap_err();
    assert!(matches!(err, Error::Live(_)), "{err}");
    assert!(!cellfleet_cell::tidy_closed(&h.path).unwrap());
    assert!(
        sidecar_exists(&h.path, "-wal"),
        "the kept WAL was left alone"
    );
    drop(held);
    assert!(cellfleet_cell::tidy_closed(&h.path).unwrap());
    assert!(!sidecar_exists(&h.path, "-wal"));
    let cell = recover_and_open(&h, published);
    assert_eq!(get(&cell, "a"), Some(json!(1)));
}

/// Rebuilds `h`'s database from its chain, which must end at
/// `published`, and opens it there.
fn recover_and_open(h: &Harness, published: Position) -> Cell {
    assert_eq!(
        cellfleet_cell::recover(h.chain_files(), &h.path).unwrap(),
        published
    );
    Cell::open(&h.path, kv(), CellConfig::default(), published, NOW)
        .unwrap()
        .cell
}

fn sidecar_exists(path: &std::path::Path, suffix: &str) -> bool {
    let mut name = path.as_os_str().to_os_string();
    name.push(suffix);
    std::path::PathBuf::from(name).exists()
}

const MANIFEST: &str = r#"
[kinds.account]
raw_sql = true
migrations = ["CREATE TABLE balance (id TEXT PRIMARY KEY, cents INTEGER NOT NULL CHECK (cents >= 0))"]
[kinds.account.commands.deposit]
sql = ["INSERT INTO balance VALUES (:id, 0) ON CONFLICT DO NOTHING",
       "UPDATE balance SET cents = cents + :cents WHERE id = :id"]
[kinds.account.queries.balance]
sql = "SELECT cents FROM balance WHERE id = :id"
[kinds.account.queries.all]
sql = "SELECT id, cents FROM balance ORDER BY id"
[kinds.account.limits]
rows_max = 3

[kinds.locked]
migrations = ["CREATE TABLE t (x)"]
"#;

/// A `deposit` command of the `account` kind.
fn deposit(n: u64, id: &str, cents: i64) -> Command {
    Command::new(
        common::id(n),
        "deposit",
        json!({"id": id, "cents": cents}),
        NOW + 1000,
    )
}

/// Each result's rejection code, `None` for an applied command.
fn reject_codes(r: &cellfleet_cell::GroupResult) -> Vec<Option<RejectCode>> {
    r.results
        .iter()
        .map(|c| match &c.outcome {
            Outcome::Applied { .. } => None,
            Outcome::Rejected { rejection } => Some(rejection.code),
        })
        .collect()
}

#[test]
fn manifest_kind_commands_queries_rejections_and_limits() {
    let manifest = Manifest::parse(MANIFEST).unwrap();
    let mut h = Harness::new(manifest.kind("account").unwrap(), CellConfig::default());
    let r = h.run(&[
        deposit(1, "a", 5),
        deposit(2, "a", -10), // CHECK fails: only this savepoint rolls back
        deposit(3, "b", 1),
        Command::new(id(4), "deposit", json!({"id": "a"}), NOW + 1000),
        Command::new(id(5), "deposit", json!({"id": "a", "cents": 1, "extra": 1}), NOW + 1000),
        Command::new(id(6), "nope", json!({}), NOW + 1000),
        Command::new(id(7), "$sql", json!({"sql": "DELETE FROM _cellfleet_entries"}), NOW + 1000),
        Command::new(id(8), "$sql", json!({"sql": "COMMIT"}), NOW + 1000),
        Command::new(id(9), "$sql", json!({"sql": "INSERT INTO balance VALUES ('c', 1); INSERT INTO balance VALUES ('d', 1)"}), NOW + 1000),
    ]);
    let codes = reject_codes(&r);
    use RejectCode::*;
    assert_eq!(
        codes,
        vec![
            None,
            Some(Sql),
            None,
            Some(BadParameters),
            Some(BadParameters),
            Some(UnknownCommand),
            Some(Sql),
            Some(Sql),
            None
        ]
    );
    let cell = h.cell();
    assert_eq!(
        cell.query("balance", &json!({"id": "a"})).unwrap()["rows"],
        json!([[5]])
    );
    assert_eq!(cell.ledger_len().unwrap(), 9);
    // rows_max = 3, four rows exist
    let err = cell.query("all", &json!({})).unwrap_err();
    assert!(err.to_string().contains("rows returned"), "{err}");
    // queries are read-only
    let err = cell
        .query("$sql", &json!({"sql": "DELETE FROM balance"}))
        .unwrap_err();
    assert!(err.to_string().contains("read-only"), "{err}");
    let (pos, recovered) = h.recover_bytes("r.db");
    assert_eq!(pos, h.position());
    assert_eq!(recovered, h.live_bytes());

    // raw sql only where enabled
    let mut h2 = Harness::new(manifest.kind("locked").unwrap(), CellConfig::default());
    let r = h2.run(&[Command::new(
        id(1),
        "$sql",
        json!({"sql": "INSERT INTO t VALUES (1)"}),
        NOW + 1000,
    )]);
    assert!(
        matches!(&r.results[0].outcome, Outcome::Rejected { rejection } if rejection.code == RawSqlDisabled)
    );
}

/// A group runs without savepoints until a command is rejected; then it
/// runs again from the start with one per command. Either way a rejected
/// command's writes are gone (here its first statement inserts a row, its
/// second fails a CHECK), the others keep theirs, a repeated id in the
/// same group gets the stored outcome, and the groups after it (the next
/// one with savepoints from the start, the one after that without) do the
/// same.
#[test]
fn a_rejected_command_loses_its_writes_and_the_rest_of_its_group_keeps_theirs() {
    let manifest = Manifest::parse(MANIFEST).unwrap();
    let mut h = Harness::new(manifest.kind("account").unwrap(), CellConfig::default());
    let outcomes = |r: &cellfleet_cell::GroupResult| -> Vec<(Option<RejectCode>, bool)> {
        r.results
            .iter()
            .map(|c| match &c.outcome {
                Outcome::Applied { .. } => (None, c.duplicate),
                Outcome::Rejected { rejection } => (Some(rejection.code), c.duplicate),
            })
            .collect()
    };
    let balance = |h: &mut Harness, id: &str| {
        h.cell().query("balance", &json!({ "id": id })).unwrap()["rows"].clone()
    };
    let r = h.run(&[
        deposit(1, "a", 5),
        deposit(2, "z", -1),
        deposit(3, "b", 1),
        deposit(1, "a", 5),
        deposit(4, "a", 2),
    ]);
    use RejectCode::Sql;
    assert_eq!(
        outcomes(&r),
        vec![
            (None, false),
            (Some(Sql), false),
            (None, false),
            (None, true),
            (None, false)
        ]
    );
    assert_eq!(balance(&mut h, "a"), json!([[7]]));
    assert_eq!(balance(&mut h, "b"), json!([[1]]));
    assert_eq!(balance(&mut h, "z"), json!([]));
    assert_eq!(h.cell().ledger_len().unwrap(), 4);

    let r = h.run(&[deposit(5, "b", 1)]);
    assert_eq!(outcomes(&r), vec![(None, false)]);
    let r = h.run(&[deposit(6, "z", -1), deposit(7, "c", 1), deposit(2, "z", -1)]);
    assert_eq!(
        outcomes(&r),
        vec![(Some(Sql), false), (None, false), (Some(Sql), true)]
    );
    assert_eq!(balance(&mut h, "b"), json!([[2]]));
    assert_eq!(balance(&mut h, "c"), json!([[1]]));
    assert_eq!(balance(&mut h, "z"), json!([]));
    assert_eq!(h.cell().ledger_len().unwrap(), 7);
    let (pos, recovered) = h.recover_bytes("r.db");
    assert_eq!(pos, h.position());
    assert_eq!(recovered, h.live_bytes());
}

/// A command stopped by the step budget in the middle of an INSERT, after
/// an earlier statement of its own wrote a row: its writes are gone, the
/// commands around it keep theirs, with or without savepoints at the start
/// of the group, and the Cell goes on.
#[test]
fn a_command_stopped_by_the_step_budget_loses_its_writes() {
    let manifest = Manifest::parse(MANIFEST).unwrap();
    let config = CellConfig {
        statement_steps_max: 100_000,
        ..CellConfig::default()
    };
    let mut h = Harness::new(manifest.kind("account").unwrap(), config);
    let runaway = |n| {
        Command::new(
            common::id(n),
            "$sql",
            json!({"sql": "INSERT INTO balance VALUES ('x', 1); \
                WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c) \
                INSERT INTO balance SELECT 'y' || n, 0 FROM c LIMIT 10000000"}),
            NOW + 1000,
        )
    };
    use RejectCode::LimitExceeded;
    for round in 0..2u64 {
        let base = round * 10;
        let r = h.run(&[
            deposit(base + 1, "a", 1),
            runaway(base + 2),
            deposit(base + 3, "b", 1),
        ]);
        assert_eq!(
            reject_codes(&r),
            vec![None, Some(LimitExceeded), None],
            "round {round}"
        );
    }
    let all = h.cell().query("all", &json!({})).unwrap()["rows"].clone();
    assert_eq!(all, json!([["a", 2], ["b", 2]]));
    let (pos, recovered) = h.recover_bytes("r.db");
    assert_eq!(pos, h.position());
    assert_eq!(recovered, h.live_bytes());
}

#[test]
fn oversized_payloads_and_groups_are_refused() {
    let mut h = Harness::new(
        kv(),
        CellConfig {
            group_commands_max: 2,
            ..CellConfig::default()
        },
    );
    let big = put(1, "k", json!("x".repeat(100_000)));
    let r = h.run(&[big]);
    assert!(
        matches!(&r.results[0].outcome, Outcome::Rejected { rejection } if rejection.code == RejectCode::LimitExceeded)
    );
    let err = h
        .cell()
        .execute(
            &[
                put(2, "a", json!(1)),
                put(3, "a", json!(1)),
                put(4, "a", json!(1)),
            ],
            NOW,
        )
        .unwrap_err();
    assert!(matches!(
        err,
        Error::LimitExceeded {
            what: "group size",
            ..
        }
    ));
}

#[test]
fn migrations_append_on_reopen_and_refuse_edits() {
    let v1 = Manifest::parse(MANIFEST).unwrap();
    let mut h = Harness::new(v1.kind("locked").unwrap(), CellConfig::default());
    let before = h.position();
    let v2 = Manifest::parse(&MANIFEST.replace(
        "migrations = [\"CREATE TABLE t (x)\"]",
        "migrations = [\"CREATE TABLE t (x)\", \"CREATE TABLE u (y)\"]",
    ))
    .unwrap();
    h.reopen_with(v2.kind("locked").unwrap());
    assert_eq!(
        h.position().txid.0,
        before.txid.0 + 1,
        "the migration is one publication"
    );
    let (pos, recovered) = h.recover_bytes("r.db");
    assert_eq!(pos, h.position());
    assert_eq!(recovered, h.live_bytes());
    let pos = h.position();
    h.cell.take();
    let edited = Manifest::parse(&MANIFEST.replace(
        "migrations = [\"CREATE TABLE t (x)\"]",
        "migrations = [\"CREATE TABLE t (z)\", \"CREATE TABLE u (y)\"]",
    ))
    .unwrap();
    let err = Cell::open(
        &h.path,
        edited.kind("locked").unwrap(),
        CellConfig::default(),
        pos,
        NOW,
    )
    .unwrap_err();
    assert!(matches!(err, Error::MigrationChanged { index: 0 }), "{err}");
}

#[test]
fn a_deferred_schema_publishes_with_the_first_group() {
    let deferred = CellConfig {
        defer_migrations: true,
        ..CellConfig::default()
    };
    // A new Cell: nothing runs at open; its first group carries the
    // engine's tables and the command, as one snapshot.
    let mut h = Harness::new(kv(), deferred.clone());
    assert_eq!(h.position(), Position::EMPTY, "nothing published at open");
    assert!(h.cell().schema_due().unwrap());
    let result = h.run(&[put(1, "a", json!(1))]);
    let publication = result.publication.expect("the first group publishes");
    assert_eq!(publication.txid.0, 1);
    assert!(
        publication.is_snapshot(),
        "a new Cell's first file is a snapshot"
    );
    assert!(!h.cell().schema_due().unwrap());
    assert_eq!(get(h.cell.as_ref().unwrap(), "a"), Some(json!(1)));
    let (position, recovered) = h.recover_bytes("r.db");
    assert_eq!(position, h.position());
    assert_eq!(recovered, h.live_bytes());

    // The same command on a Cell that migrates at open: two publications,
    // the same database.
    let mut eager = Harness::new(kv(), CellConfig::default());
    eager.run(&[put(1, "a", json!(1))]);
    assert_eq!(eager.position().txid.0, 2);
    assert!(
        !eager.cell().schema_due().unwrap(),
        "an eager open leaves nothing due"
    );
    assert_eq!(get(eager.cell.as_ref().unwrap(), "a"), Some(json!(1)));

    // Before any command: `migrate` applies the schema alone, so a query
    // has the kind's tables; then nothing is due.
    let mut h = Harness::new(kv(), deferred.clone());
    let schema = h.cell().migrate(NOW).unwrap().expect("the schema was due");
    assert_eq!(schema.txid.0, 1);
    h.publish(schema);
    assert_eq!(get(h.cell.as_ref().unwrap(), "a"), None);
    assert!(h.cell().migrate(NOW).unwrap().is_none());

    // A migration the kind gains later is deferred the same way.
    let v1 = Manifest::parse(MANIFEST).unwrap();
    let mut h = Harness::new(v1.kind("locked").unwrap(), deferred);
    let schema = h.cell().migrate(NOW).unwrap().expect("the schema was due");
    h.publish(schema);
    let v2 = Manifest::parse(&MANIFEST.replace(
        "migrations = [\"CREATE TABLE t (x)\"]",
        "migrations = [\"CREATE TABLE t (x)\", \"CREATE TABLE u (y)\"]",
    ))
    .unwrap();
    h.reopen_with(v2.kind("locked").unwrap());
    assert_eq!(h.position().txid.0, 1, "the new migration waits");
    assert!(h.cell().schema_due().unwrap());
    let publication = h.cell().migrate(NOW).unwrap().expect("one migration due");
    assert_eq!(publication.txid.0, 2);
    h.publish(publication);
    assert!(!h.cell().schema_due().unwrap());
}

fn shrinking_database_and_snapshots_and_compaction(checksums_in_file: bool) {
    let manifest = Manifest::parse(
        r#"
        [kinds.blobs]
        migrations = ["CREATE TABLE b (k INTEGER PRIMARY KEY, v BLOB NOT NULL)"]
        [kinds.blobs.commands.put]
        sql = "INSERT OR REPLACE INTO b VALUES (:k, zeroblob(:n))"
        [kinds.blobs.commands.del]
        sql = "DELETE FROM b WHERE k = :k"
        "#,
    )
    .unwrap();
    let config = CellConfig {
        snapshot_delta_bytes: 64 * 4096,
        ltx_checksums_in_file: checksums_in_file,
        ..CellConfig::default()
    };
    let mut h = Harness::new(manifest.kind("blobs").unwrap(), config);
    let cmd = |n: u64, name: &str, args: Value| Command::new(id(n), name, args, NOW + 1000);
    let group: Vec<_> = (0..100)
        .map(|i| cmd(i, "put", json!({"k": i, "n": 3000})))
        .collect();
    let p = h.run(&group).publication.unwrap();
    assert!(p.is_snapshot(), "a big delta becomes a snapshot");
    let grown = p.header.commit;
    let deletes: Vec<_> = (0..100)
        .map(|i| cmd(1000 + i, "del", json!({"k": i})))
        .collect();
    for chunk in deletes.chunks(10) {
        let p = h.run(chunk).publication.unwrap();
        assert!(!p.is_snapshot());
    }
    let shrunk = h
        .chain
        .last()
        .map(|f| {
            cellfleet_ltx::Decoder::new(f.0.as_slice())
                .unwrap()
                .header()
                .commit
        })
        .unwrap();
    assert!(shrunk < grown, "auto_vacuum shrinks: {shrunk} < {grown}");
    let (pos, recovered) = h.recover_bytes("r.db");
    assert_eq!(pos, h.position());
    let live = h.live_bytes();
    assert_eq!(recovered, live);
    // Compaction of the whole chain and of a suffix.
    let files = h.chain_files();
    let merged = cellfleet_cell::compact(&files).unwrap();
    assert!(merged.header.is_snapshot());
    assert_eq!(merged.post, pos);
    assert_eq!(merged.header.tracks_checksums(), checksums_in_file);
    let in_file = if checksums_in_file {
        pos.checksum
    } else {
        Checksum::NONE
    };
    assert_eq!(merged.trailer.post_apply_checksum, in_file);
    let target = h.dir.path().join("m.db");
    assert_eq!(
        cellfleet_cell::recover([merged.chain_file()], &target).unwrap(),
        pos
    );
    assert_eq!(std::fs::read(&target).unwrap(), live);
    let suffix = cellfleet_cell::compact(&files[1..]).unwrap();
    let target = h.dir.path().join("s.db");
    cellfleet_cell::recover([files[0], suffix.chain_file()], &target).unwrap();
    assert_eq!(std::fs::read(&target).unwrap(), live);
    let snap = h.cell().snapshot(NOW).unwrap();
    assert_eq!(snap.post, pos);
    assert_eq!(snap.header.tracks_checksums(), checksums_in_file);
    let target = h.dir.path().join("snap.db");
    cellfleet_cell::recover([snap.chain_file()], &target).unwrap();
    assert_eq!(std::fs::read(&target).unwrap(), live);
    // A snapshot that replaces a chain stays in the bucket: its pages get
    // the full LZ4 search, as the encoder's default writes them.
    let decoded = cellfleet_ltx::decode_all(&snap.ltx).unwrap();
    let mut pages: Vec<(u32, &[u8])> = decoded
        .pages
        .iter()
        .map(|(pgno, page)| (*pgno, page.as_slice()))
        .collect();
    let (full, _) = cellfleet_ltx::encode_to_vec(
        decoded.header,
        &mut pages,
        decoded.trailer.post_apply_checksum,
    )
    .unwrap();
    assert_eq!(snap.ltx, full);
}

#[test]
fn shrinking_snapshots_and_compaction_litestream_form() {
    shrinking_database_and_snapshots_and_compaction(false);
}

#[test]
fn shrinking_snapshots_and_compaction_checksums_in_file() {
    shrinking_database_and_snapshots_and_compaction(true);
}

/// Each published file's header and trailer in one checksum mode.
fn published_files_have_the_mode(checksums_in_file: bool) {
    let config = CellConfig {
        ltx_checksums_in_file: checksums_in_file,
        ..CellConfig::default()
    };
    let mut h = Harness::new(kv(), config);
    for n in 0..4u64 {
        h.run(&[put(n, &format!("k{n}"), json!(n))]);
    }
    let mut at = Position::EMPTY;
    for (ltx, post) in &h.chain {
        let file = cellfleet_ltx::decode_all(ltx.as_slice()).unwrap();
        let (header, trailer) = (file.header, file.trailer);
        if checksums_in_file {
            assert_eq!(header.flags, 0);
            let pre = if header.is_snapshot() {
                Checksum::NONE
            } else {
                at.checksum
            };
            assert_eq!(header.pre_apply_checksum, pre);
            assert_eq!(trailer.post_apply_checksum, post.checksum);
        } else {
            assert_eq!(header.flags, HEADER_FLAG_NO_CHECKSUM);
            assert_eq!(header.pre_apply_checksum, Checksum::NONE);
            assert_eq!(trailer.post_apply_checksum, Checksum::NONE);
        }
        assert_eq!(header.max_txid, post.txid);
        assert!(post.checksum.is_flagged());
        at = *post;
    }
    assert_eq!(at, h.position());
    let (pos, recovered) = h.recover_bytes("r.db");
    assert_eq!(pos, h.position());
    assert_eq!(recovered, h.live_bytes());
}

#[test]
fn files_are_written_as_litestream_writes_them_by_default() {
    assert!(!CellConfig::default().ltx_checksums_in_file);
    published_files_have_the_mode(false);
}

#[test]
fn files_carry_checksums_when_configured() {
    published_files_have_the_mode(true);
}

/// A file that applies at the right TXID but leaves another state (here:
/// an aborted publication of the same TXID) is caught at its own step, not
/// only at the end; so is a wrong recorded position.
fn recovery_checks_every_step(checksums_in_file: bool) {
    let config = CellConfig {
        ltx_checksums_in_file: checksums_in_file,
        ..CellConfig::default()
    };
    let mut h = Harness::new(kv(), config);
    h.run(&[put(1, "a", json!(1))]);
    let aborted = h
        .cell()
        .execute(&[put(2, "b", json!("aborted"))], NOW)
        .unwrap()
        .publication
        .unwrap();
    h.cell().abort().unwrap();
    let real = h.run(&[put(3, "b", json!("real"))]).publication.unwrap();
    assert_eq!(aborted.txid, real.txid);
    assert_ne!(aborted.post, real.post);
    h.run(&[put(4, "c", json!(1))]);
    let index = h.chain.iter().position(|(_, p)| *p == real.post).unwrap();
    assert!(index + 1 < h.chain.len(), "a file follows the forged one");

    // The aborted file in place of the published one, recorded position kept.
    let mut forged = h.chain_files();
    forged[index].ltx = aborted.ltx.as_slice();
    let err = cellfleet_cell::recover(forged, &h.dir.path().join("f.db")).unwrap_err();
    match err {
        Error::ChainMismatch {
            txid,
            expected,
            found,
        } => {
            assert_eq!(txid, real.txid);
            assert_eq!(expected, real.post);
            assert_eq!(found, aborted.post);
        }
        other => panic!("{other}"),
    }
    // The right file with a wrong recorded checksum.
    let mut wrong = h.chain_files();
    wrong[index].post.checksum = aborted.post.checksum;
    let err = cellfleet_cell::recover(wrong, &h.dir.path().join("w.db")).unwrap_err();
    assert!(
        matches!(err, Error::ChainMismatch { txid, .. } if txid == real.txid),
        "{err}"
    );
    assert!(!h.dir.path().join("w.db").exists());
    // And the honest chain recovers.
    let (pos, recovered) = h.recover_bytes("r.db");
    assert_eq!(pos, h.position());
    assert_eq!(recovered, h.live_bytes());
}

#[test]
fn recovery_checks_every_step_litestream_form() {
    recovery_checks_every_step(false);
}

#[test]
fn recovery_checks_every_step_checksums_in_file() {
    recovery_checks_every_step(true);
}

#[test]
fn compaction_refuses_a_chain_mixing_checksum_modes() {
    let mut h = Harness::new(kv(), CellConfig::default());
    h.run(&[put(1, "a", json!(1))]);
    let pos = h.position();
    h.cell.take();
    h.config.ltx_checksums_in_file = true;
    let mut cell = Cell::open(&h.path, kv(), h.config.clone(), pos, NOW)
        .unwrap()
        .cell;
    let p = cell
        .execute(&[put(2, "b", json!(2))], NOW)
        .unwrap()
        .publication
        .unwrap();
    cell.confirm(p.txid).unwrap();
    assert!(p.header.tracks_checksums());
    let mut files = h.chain_files();
    files.push(p.chain_file());
    // Recovery takes either form ...
    let target = h.dir.path().join("mixed.db");
    assert_eq!(
        cellfleet_cell::recover(files.clone(), &target).unwrap(),
        p.post
    );
    // ... but merging needs one.
    let err = cellfleet_cell::compact(&files).unwrap_err();
    assert!(
        matches!(err, Error::Ltx(cellfleet_ltx::Error::Incompatible(_))),
        "{err}"
    );
}

#[test]
fn expired_ledger_entries_are_pruned_in_bounded_steps() {
    let config = CellConfig {
        ledger_prune_max: 3,
        skew_margin_ms: 500,
        ..CellConfig::default()
    };
    let mut h = Harness::new(kv(), config);
    let with_expiry = |n: u64, expires_at_ms: i64| {
        let mut c = put(n, &format!("k{n}"), json!(n));
        c.expires_at_ms = expires_at_ms;
        c
    };
    let short: Vec<Command> = (1..=5).map(|n| with_expiry(n, NOW + 1_000)).collect();
    h.run(&short);
    h.run(&[with_expiry(6, NOW + 100_000), with_expiry(7, NOW + 100_000)]);
    assert_eq!(h.cell().ledger_len().unwrap(), 7);
    // Expired, but still inside the skew margin: kept.
    h.now = NOW + 1_400;
    h.run(&[with_expiry(8, NOW + 100_000)]);
    assert_eq!(h.cell().ledger_len().unwrap(), 8);
    // Past expiry plus margin: at most three go per group.
    h.now = NOW + 1_501;
    h.run(&[with_expiry(9, NOW + 100_000)]);
    assert_eq!(h.cell().ledger_len().unwrap(), 9 - 3);
    // The group that prunes the last two is aborted: they come back, and
    // the next group prunes them again.
    let now = h.now;
    let pruning = h
        .cell()
        .execute(&[with_expiry(10, NOW + 100_000)], now)
        .unwrap();
    assert!(pruning.publication.is_some());
    assert_eq!(h.cell().ledger_len().unwrap(), 7 - 2);
    h.cell().abort().unwrap();
    assert_eq!(h.cell().ledger_len().unwrap(), 6);
    h.run(&[with_expiry(10, NOW + 100_000)]);
    assert_eq!(h.cell().ledger_len().unwrap(), 7 - 2);
    h.open();
    h.run(&[with_expiry(11, NOW + 100_000)]);
    assert_eq!(h.cell().ledger_len().unwrap(), 6, "nothing left to prune");
    // A retry of a pruned command is refused as expired, never re-run.
    let r = h.run(&[with_expiry(1, NOW + 1_000)]);
    assert!(
        matches!(&r.results[0].outcome, Outcome::Rejected { rejection } if rejection.code == RejectCode::Expired)
    );
    assert!(r.publication.is_none());
    // Past its window an id is free again: sent with a new expiry it runs
    // as a new command and is exactly-once from then on, though its old row
    // waits behind entries that have not expired (pruning takes the front).
    let start = h.now;
    h.run(&[with_expiry(20, start + 1_000)]);
    h.now = start + 1_501;
    let before = h.cell().ledger_len().unwrap();
    h.run(&[with_expiry(21, NOW + 200_000)]);
    assert_eq!(
        h.cell().ledger_len().unwrap(),
        before + 1,
        "20 waits behind 6 to 11, which have not expired"
    );
    let r = h.run(&[
        with_expiry(20, NOW + 200_000),
        with_expiry(20, NOW + 200_000),
    ]);
    assert!(matches!(r.results[0].outcome, Outcome::Applied { .. }));
    assert!(!r.results[0].duplicate);
    assert!(r.results[1].duplicate);
    let again = r.results[0].txid;
    // Reopened, the index is read from the table: the newer row answers.
    h.open();
    let r = h.run(&[with_expiry(20, NOW + 200_000)]);
    assert!(r.results[0].duplicate);
    assert_eq!(r.results[0].txid, again);
    // Once the front expires, pruning goes on, three a group, past the
    // old row of 20 and up to the first entry that has not expired.
    h.now = NOW + 100_501;
    let len = h.cell().ledger_len().unwrap();
    assert_eq!(len, 9, "6 to 11, 20, 21 and 20 again");
    for n in 30..33 {
        h.run(&[with_expiry(n, NOW + 200_000)]);
    }
    assert_eq!(
        h.cell().ledger_len().unwrap(),
        9 + 3 - 7,
        "21, 20 again, 30, 31 and 32 are left"
    );
    // Pruning the old row of 20 left the newer one in the index.
    let r = h.run(&[with_expiry(20, NOW + 200_000)]);
    assert!(r.results[0].duplicate);
    assert_eq!(r.results[0].txid, again);
    let (pos, recovered) = h.recover_bytes("r.db");
    assert_eq!(pos, h.position());
    assert_eq!(recovered, h.live_bytes());
}

#[test]
fn published_outcomes_exclude_pending_groups() {
    let mut h = Harness::new(kv(), CellConfig::default());
    h.run(&[put(1, "a", json!(1))]);
    let now = h.now;
    let pending = h.cell().execute(&[put(2, "b", json!(2))], now).unwrap();
    let txid = pending.publication.as_ref().unwrap().txid;
    let cell = h.cell();
    let (stored_txid, outcome) = cell
        .published_outcome(&cellfleet_cell::CommandId(id(1)))
        .unwrap()
        .expect("published command is found");
    assert_eq!(stored_txid.0, 2);
    assert!(matches!(outcome, Outcome::Applied { .. }));
    assert!(
        cell.published_outcome(&cellfleet_cell::CommandId(id(2)))
            .unwrap()
            .is_none(),
        "a pending command is not published"
    );
    cell.confirm(txid).unwrap();
    assert_eq!(
        cell.published_outcome(&cellfleet_cell::CommandId(id(2)))
            .unwrap()
            .map(|(t, _)| t),
        Some(txid)
    );
    assert!(cell
        .published_outcome(&cellfleet_cell::CommandId(id(99)))
        .unwrap()
        .is_none());
}

/// The names of the harness Cell's files (its database and whatever
/// shares its name's start), sorted.
fn cell_files(h: &Harness) -> Vec<String> {
    let stem = h.path.file_name().unwrap().to_string_lossy().into_owned();
    let mut names: Vec<String> = std::fs::read_dir(h.dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&stem))
        .collect();
    names.sort();
    names
}

/// A settled Cell closes to one file, its database (the WAL checkpointed,
/// `-wal` gone), and opens again at the same published state.
#[test]
fn a_settled_cell_closes_to_its_database_alone_and_reopens_intact() {
    let mut h = Harness::new(kv(), CellConfig::default());
    h.run(&[put(1, "a", json!(1)), put(2, "b", json!(2))]);
    let pos = h.position();
    let files = |h: &Harness| {
        let stem = h.path.file_name().unwrap().to_string_lossy().into_owned();
        (stem, cell_files(h))
    };
    let (stem, open) = files(&h);
    assert!(open.contains(&format!("{stem}-wal")), "{open:?}");
    h.cell.take().unwrap().close();
    let (stem, closed) = files(&h);
    assert_eq!(closed, [stem]);
    let opened = Cell::open(&h.path, kv(), CellConfig::default(), pos, NOW).unwrap();
    assert_eq!(opened.cell.published_position(), pos);
    assert_eq!(get(&opened.cell, "a"), Some(json!(1)));
    assert_eq!(get(&opened.cell, "b"), Some(json!(2)));
    h.cell = Some(opened.cell);
    let (pos, recovered) = h.recover_bytes("r.db");
    assert_eq!(pos, h.position());
    assert_eq!(recovered, h.live_bytes());
}

/// A Cell closed keeping its sidecars leaves an empty `-wal` next to its
/// database (and no `-shm`: the WAL index lives in memory), reopens at
/// the same state, and
/// [`cellfleet_cell::tidy_closed`] brings it to its database alone, but
/// never while the Cell is open.
#[test]
fn a_cell_closed_keeping_its_sidecars_reopens_and_tidies_to_one_file() {
    let mut h = Harness::new(kv(), CellConfig::default());
    h.run(&[put(1, "a", json!(1))]);
    let pos = h.position();
    let stem = h.path.file_name().unwrap().to_string_lossy().into_owned();
    let files = cell_files;
    let all = [stem.clone(), format!("{stem}-wal")];
    let one = [stem.clone()];
    h.cell.take().unwrap().close_keeping_sidecars();
    assert_eq!(files(&h), all);
    let wal_len = std::fs::metadata(h.dir.path().join(format!("{stem}-wal")))
        .unwrap()
        .len();
    assert_eq!(wal_len, 0, "the WAL was checkpointed into the database");
    let opened = Cell::open(&h.path, kv(), CellConfig::default(), pos, NOW).unwrap();
    assert_eq!(get(&opened.cell, "a"), Some(json!(1)));
    assert!(
        !cellfleet_cell::tidy_closed(&h.path).unwrap(),
        "an open Cell is left alone"
    );
    assert_eq!(files(&h), all);
    h.cell = Some(opened.cell);
    h.run(&[put(2, "b", json!(2))]);
    let pos = h.position();
    h.cell.take().unwrap().close_keeping_sidecars();
    assert!(cellfleet_cell::tidy_closed(&h.path).unwrap());
    assert_eq!(files(&h), one);
    assert!(
        !cellfleet_cell::tidy_closed(&h.dir.path().join("absent.db")).unwrap(),
        "no Cell there: nothing created"
    );
    assert!(!h.dir.path().join("absent.db").exists());
    let opened = Cell::open(&h.path, kv(), CellConfig::default(), pos, NOW).unwrap();
    assert_eq!(get(&opened.cell, "b"), Some(json!(2)));
    h.cell = Some(opened.cell);
    let (pos, recovered) = h.recover_bytes("r.db");
    assert_eq!(pos, h.position());
    assert_eq!(recovered, h.live_bytes());
}

/// The ledger layouts of Cells created before `_cellfleet_entries`, as the
/// engine declared them then.
#[derive(Clone, Copy, Debug)]
enum Legacy {
    /// `_cellfleet_ledger`, keyed by the command id (the first layout).
    ById,
    /// `_cellfleet_outcomes`, keyed by expiry and id (the second).
    ByExpiry,
}

impl Legacy {
    const ALL: [Legacy; 2] = [Legacy::ById, Legacy::ByExpiry];

    fn table(self) -> &'static str {
        match self {
            Legacy::ById => "_cellfleet_ledger",
            Legacy::ByExpiry => "_cellfleet_outcomes",
        }
    }

    fn schema(self) -> &'static str {
        match self {
            Legacy::ById => {
                "CREATE TABLE _cellfleet_ledger (
                    id BLOB PRIMARY KEY,
                    digest BLOB NOT NULL,
                    txid INTEGER NOT NULL,
                    expires_at_ms INTEGER NOT NULL,
                    outcome TEXT NOT NULL
                ) WITHOUT ROWID;
                CREATE INDEX _cellfleet_ledger_expiry ON _cellfleet_ledger (expires_at_ms);"
            }
            Legacy::ByExpiry => {
                "CREATE TABLE _cellfleet_outcomes (
                    expires_at_ms INTEGER NOT NULL,
                    id BLOB NOT NULL,
                    digest BLOB NOT NULL,
                    txid INTEGER NOT NULL,
                    outcome TEXT NOT NULL,
                    PRIMARY KEY (expires_at_ms, id)
                ) WITHOUT ROWID;"
            }
        }
    }
}

/// The names of the engine's ledger tables in the Cell's database file,
/// read beside the open Cell (through the VFS it opens with: any other
/// SQLite is kept off a live Cell's file).
fn ledger_tables(h: &Harness) -> Vec<String> {
    let conn = rusqlite::Connection::open_with_flags_and_vfs(
        &h.path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        cellfleet_vfs::NAME,
    )
    .unwrap();
    let mut stmt = conn
        .prepare(
            "SELECT name FROM sqlite_schema WHERE type = 'table' \
             AND name IN ('_cellfleet_ledger', '_cellfleet_outcomes', '_cellfleet_entries') \
             ORDER BY name",
        )
        .unwrap();
    let names = stmt.query_map([], |r| r.get(0)).unwrap();
    names.collect::<rusqlite::Result<_>>().unwrap()
}

/// Turns the harness Cell into one written by an engine of an old ledger
/// layout: its outcomes moved into that layout's table, at the same TXID,
/// and published as one snapshot (what the bucket holds for such a Cell).
fn make_legacy(h: &mut Harness, legacy: Legacy) {
    let cell = h.cell.take().unwrap();
    let txid = cell.published_position().txid;
    cell.close();
    let conn = rusqlite::Connection::open(&h.path).unwrap();
    let (schema, table) = (legacy.schema(), legacy.table());
    conn.execute_batch(&format!(
        "BEGIN; {schema}
         INSERT INTO {table} (id, digest, txid, expires_at_ms, outcome)
             SELECT id, digest, txid, expires_at_ms, outcome FROM _cellfleet_entries;
         DROP TABLE _cellfleet_entries;
         COMMIT; PRAGMA wal_checkpoint(TRUNCATE);"
    ))
    .unwrap();
    drop(conn);
    let bytes = std::fs::read(&h.path).unwrap();
    let page_size = h.config.page_size;
    let checksum = cellfleet_ltx::database_checksum(&bytes[..], page_size).unwrap();
    let mut pages: Vec<(u32, &[u8])> = bytes
        .chunks(page_size as usize)
        .enumerate()
        .map(|(i, page)| (i as u32 + 1, page))
        .collect();
    let header =
        cellfleet_ltx::Header::new(page_size, pages.len() as u32, cellfleet_ltx::Txid(1), txid);
    let (ltx, _) = cellfleet_ltx::encode_to_vec(header, &mut pages, checksum).unwrap();
    h.chain = vec![(ltx, Position { txid, checksum })];
    h.open();
    assert_eq!(ledger_tables(h), [table]);
}

/// A Cell of either old ledger layout keeps every exactly-once answer: its
/// first writing group moves the outcomes to the current layout inside its
/// own transaction, and the chain recovers to the same bytes.
#[test]
fn a_cell_of_the_old_ledger_layout_upgrades_in_its_first_group() {
    for legacy in Legacy::ALL {
        let mut h = Harness::new(kv(), CellConfig::default());
        h.run(&[put(1, "a", json!(1)), put(2, "b", json!(2))]);
        h.run(&[put(3, "c", json!(3))]);
        let first_txid = h.position().txid.0 - 1;
        make_legacy(&mut h, legacy);
        let old = h.position();
        assert_eq!(h.cell().ledger_len().unwrap(), 3);
        let (txid, _) = h
            .cell()
            .published_outcome(&cellfleet_cell::CommandId(id(1)))
            .unwrap()
            .expect("an outcome of the old layout is found");
        assert_eq!(txid.0, first_txid);

        let r = h.run(&[
            put(1, "a", json!(1)),
            put(2, "b", json!(9)),
            put(4, "d", json!(4)),
        ]);
        assert!(r.results[0].duplicate, "a retry gets its stored outcome");
        assert_eq!(r.results[0].txid.map(|t| t.0), Some(first_txid));
        assert!(
            matches!(&r.results[1].outcome, Outcome::Rejected { rejection } if rejection.code == RejectCode::IdReused)
        );
        assert!(matches!(r.results[2].outcome, Outcome::Applied { .. }));
        assert_eq!(h.position().txid.0, old.txid.0 + 1);
        assert_eq!(ledger_tables(&h), ["_cellfleet_entries"]);
        assert_eq!(h.cell().ledger_len().unwrap(), 4);
        assert_eq!(get(h.cell.as_ref().unwrap(), "b"), Some(json!(2)));
        let (txid, _) = h
            .cell()
            .published_outcome(&cellfleet_cell::CommandId(id(3)))
            .unwrap()
            .expect("a moved outcome is found");
        assert_eq!(txid.0, first_txid + 1);
        let (pos, recovered) = h.recover_bytes("r.db");
        assert_eq!(pos, h.position());
        assert_eq!(recovered, h.live_bytes());
        // And a reopened Cell answers from, and goes on in, the current layout.
        h.open();
        let cell = h.cell();
        assert!(cell
            .published_outcome(&cellfleet_cell::CommandId(id(4)))
            .unwrap()
            .is_some());
        assert!(cell
            .published_outcome(&cellfleet_cell::CommandId(id(99)))
            .unwrap()
            .is_none());
        let r = h.run(&[put(3, "c", json!(3)), put(5, "e", json!(5))]);
        assert!(r.results[0].duplicate);
        assert_eq!(h.cell().ledger_len().unwrap(), 5);
    }
}

/// The first group of a Cell of the old ledger layout, with a command that
/// writes and is then rejected: the group runs again after rolling back
/// the layout's upgrade with everything else, and upgrades again.
#[test]
fn an_upgrading_group_with_a_rejected_command_runs_again_and_upgrades() {
    for legacy in Legacy::ALL {
        let manifest = Manifest::parse(MANIFEST).unwrap();
        let mut h = Harness::new(manifest.kind("account").unwrap(), CellConfig::default());
        h.run(&[deposit(1, "a", 5)]);
        make_legacy(&mut h, legacy);
        let r = h.run(&[deposit(1, "a", 5), deposit(2, "z", -1), deposit(3, "b", 1)]);
        assert!(r.results[0].duplicate, "a retry gets its stored outcome");
        assert!(
            matches!(&r.results[1].outcome, Outcome::Rejected { rejection } if rejection.code == RejectCode::Sql)
        );
        assert!(matches!(r.results[2].outcome, Outcome::Applied { .. }));
        assert_eq!(ledger_tables(&h), ["_cellfleet_entries"]);
        assert_eq!(h.cell().ledger_len().unwrap(), 3);
        let all = h.cell().query("all", &json!({})).unwrap()["rows"].clone();
        assert_eq!(all, json!([["a", 5], ["b", 1]]));
        let (pos, recovered) = h.recover_bytes("r.db");
        assert_eq!(pos, h.position());
        assert_eq!(recovered, h.live_bytes());
    }
}

/// An aborted upgrade leaves the old layout, and the next group upgrades
/// again: even a group of retries alone publishes the move.
#[test]
fn an_aborted_upgrade_of_the_ledger_is_done_again() {
    for legacy in Legacy::ALL {
        let mut h = Harness::new(kv(), CellConfig::default());
        h.run(&[put(1, "a", json!(1))]);
        make_legacy(&mut h, legacy);
        let now = h.now;
        let pending = h.cell().execute(&[put(2, "b", json!(2))], now).unwrap();
        assert!(pending.publication.is_some());
        h.cell().abort().unwrap();
        assert_eq!(h.cell().ledger_len().unwrap(), 1);
        h.cell().checkpoint().unwrap();
        assert_eq!(ledger_tables(&h), [legacy.table()]);
        let r = h.run(&[put(1, "a", json!(1))]);
        assert!(r.results[0].duplicate);
        assert!(r.publication.is_some(), "the move is published");
        assert_eq!(h.cell().ledger_len().unwrap(), 1);
        h.cell().checkpoint().unwrap();
        assert_eq!(ledger_tables(&h), ["_cellfleet_entries"]);
        h.run(&[put(2, "b", json!(2))]);
        assert_eq!(h.cell().ledger_len().unwrap(), 2);
        let (pos, recovered) = h.recover_bytes("r.db");
        assert_eq!(pos, h.position());
        assert_eq!(recovered, h.live_bytes());
    }
}

/// An `account` Cell whose statements may take 1,000,000 VM steps, with
/// one deposit of 5 to `a` already applied.
fn account_with_a_million_steps() -> Harness {
    let manifest = Manifest::parse(MANIFEST).unwrap();
    let config = CellConfig {
        statement_steps_max: 1_000_000,
        ..CellConfig::default()
    };
    let mut h = Harness::new(manifest.kind("account").unwrap(), config);
    h.run(&[deposit(1, "a", 5)]);
    h
}

/// A query run within a first, smaller budget is stopped short (`None`)
/// when it needs more, and answers in full within the configured one;
/// over the configured budget it is rejected as before. A short query
/// answers within the small budget, and the Cell's next query has the
/// full budget again.
#[test]
fn a_query_within_a_smaller_budget_is_stopped_short_not_rejected() {
    let mut h = account_with_a_million_steps();
    let counting = |to: u64| {
        json!({"sql": format!(
            "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < {to}) \
             SELECT count(*) FROM c"
        )})
    };
    let cell = h.cell();
    // About 10 steps a row: 20,000 rows need far more than 5,000 steps,
    // far fewer than 1,000,000.
    let stopped = cell.query_within("$sql", &counting(20_000), 5_000).unwrap();
    assert!(stopped.is_none(), "{stopped:?}");
    let full = cell
        .query_within("$sql", &counting(20_000), u64::MAX)
        .unwrap();
    assert_eq!(full.unwrap().value["rows"], json!([[20_000]]));
    assert_eq!(
        cell.query_with_position("$sql", &counting(20_000))
            .unwrap()
            .value["rows"],
        json!([[20_000]])
    );
    let short = cell
        .query_within("balance", &json!({"id": "a"}), 5_000)
        .unwrap();
    assert_eq!(short.unwrap().value["rows"], json!([[5]]));
    // Over the configured budget: rejected, whatever budget was asked for.
    for steps in [5_000, u64::MAX] {
        let over = cell.query_within("$sql", &counting(10_000_000), steps);
        match (steps, over) {
            (5_000, Ok(None)) => {}
            (u64::MAX, Err(cellfleet_cell::Error::Rejected(r))) => {
                assert_eq!(r.code, RejectCode::LimitExceeded)
            }
            (steps, other) => panic!("steps {steps}: {other:?}"),
        }
    }
}

/// A group within a smaller step budget than the configured one: a command
/// that needs more stops the whole group short, and nothing of it happened
/// (no publication, no state, no ledger entry: the same group then runs in
/// full as new commands). Over the configured budget a command is still
/// rejected, as [`Cell::execute`] rejects it.
#[test]
fn a_group_within_a_smaller_budget_is_stopped_short_and_leaves_nothing() {
    let mut h = account_with_a_million_steps();
    let filling = |n: u64, to: u64| {
        Command::new(
            id(n),
            "$sql",
            json!({"sql": format!(
                "INSERT INTO balance SELECT 'row{n}-' || n, 1 FROM \
                 (WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < {to}) \
                  SELECT n FROM c)"
            )}),
            NOW + 1000,
        )
    };
    let count_rows = |h: &mut Harness| {
        h.cell()
            .query_with_position(
                "$sql",
                &json!({"sql": "SELECT count(*), sum(cents) FROM balance"}),
            )
            .unwrap()
            .value["rows"]
            .clone()
    };
    let before = h.position();
    assert_eq!(count_rows(&mut h), json!([[1, 5]]));

    // About ten steps a row: 2,000 rows need far more than 5,000 steps,
    // far fewer than 1,000,000. The INSERT interrupted mid-way makes
    // SQLite roll the whole transaction back, the deposits before it too.
    let group = [deposit(2, "a", 7), filling(3, 2_000), deposit(4, "b", 1)];
    let now = h.now;
    let stopped = h.cell().execute_within(&group, now, 5_000).unwrap();
    assert!(stopped.is_none(), "the group was not stopped short");
    assert_eq!(h.position(), before, "nothing published");
    assert_eq!(count_rows(&mut h), json!([[1, 5]]), "nothing written");

    // Cheap groups fit the small budget and run as usual.
    let cheap = h
        .cell()
        .execute_within(&[deposit(5, "c", 2)], now, 5_000)
        .unwrap()
        .expect("within the budget");
    assert_eq!(reject_codes(&cheap), vec![None]);
    h.publish(cheap.publication.expect("a publication"));

    // The stopped group, in full: every command is new to the ledger.
    let full = h.run(&group);
    assert_eq!(reject_codes(&full), vec![None, None, None]);
    assert!(
        full.results.iter().all(|r| !r.duplicate),
        "{:?}",
        full.results
    );
    assert_eq!(count_rows(&mut h), json!([[2_003, 2_015]]));
    // And now the ledger knows them.
    let again = h.run(&group);
    assert!(
        again.results.iter().all(|r| r.duplicate),
        "{:?}",
        again.results
    );

    // Over the configured budget: stopped short at 5,000, rejected (and
    // only that command) with the full budget.
    let over = [deposit(6, "a", 1), filling(7, 1_000_000)];
    let stopped = h.cell().execute_within(&over, now, 5_000).unwrap();
    assert!(
        stopped.is_none(),
        "the over-budget group was not stopped short"
    );
    let full = h.run(&over);
    assert_eq!(
        reject_codes(&full),
        vec![None, Some(RejectCode::LimitExceeded)]
    );
    assert_eq!(count_rows(&mut h), json!([[2_003, 2_016]]));

    // Stopped short in the rerun with savepoints that a rejection starts
    // (the CHECK fails, then the insert runs out of steps): still nothing.
    let rejected_first = [deposit(8, "a", -1_000_000), filling(9, 2_000)];
    let stopped = h
        .cell()
        .execute_within(&rejected_first, now, 5_000)
        .unwrap();
    assert!(stopped.is_none(), "the rerun was not stopped short");
    assert_eq!(count_rows(&mut h), json!([[2_003, 2_016]]));
    // And in the first group after the Cell opens, when the ledger index
    // is read from the table during the run.
    h.open();
    let now = h.now;
    let stopped = h
        .cell()
        .execute_within(&rejected_first, now, 5_000)
        .unwrap();
    assert!(stopped.is_none(), "the first group was not stopped short");
    let full = h.run(&rejected_first);
    assert_eq!(reject_codes(&full), vec![Some(RejectCode::Sql), None]);
    assert!(
        full.results.iter().all(|r| !r.duplicate),
        "{:?}",
        full.results
    );
    assert_eq!(count_rows(&mut h), json!([[4_003, 4_016]]));
    // Ids recorded before are still answered from the ledger.
    let again = h.run(&[deposit(2, "a", 7), deposit(9, "z", 1)]);
    assert!(again.results[0].duplicate, "{:?}", again.results);
    assert_eq!(reject_codes(&again)[1], Some(RejectCode::IdReused));

    // What was published recovers to the live state.
    let (position, _) = h.recover_bytes("recovered.db");
    assert_eq!(position, h.position());
}
