//! Pipelined publications: groups executing while earlier ones are pending,
//! queries answering from the published state only, in-order confirms,
//! aborts voiding every pending publication, and the exactly-once ledger
//! across all of it.

mod common;

use std::sync::Arc;

use cellfleet_cell::{
    Cell, CellConfig, Command, Error, GroupResult, Kind, Manifest, Outcome, Position, Publication,
    RejectCode, Txid,
};
use common::{id, Harness, NOW};
use serde_json::{json, Value};

const MANIFEST: &str = r#"
[kinds.pipe]
migrations = ["CREATE TABLE items (k INTEGER PRIMARY KEY, v TEXT NOT NULL)",
              "CREATE TABLE blobs (k INTEGER PRIMARY KEY, b BLOB NOT NULL)"]
[kinds.pipe.commands.set]
sql = "INSERT OR REPLACE INTO items VALUES (:k, :v)"
[kinds.pipe.commands.create]
sql = "INSERT INTO items VALUES (:k, :v)"
[kinds.pipe.commands.big]
sql = "INSERT OR REPLACE INTO blobs VALUES (:k, zeroblob(:n))"
[kinds.pipe.queries.items]
sql = "SELECT k, v FROM items ORDER BY k"
[kinds.pipe.queries.count]
sql = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < :n) SELECT count(*) FROM c"
"#;

fn kind() -> Arc<dyn Kind> {
    Manifest::parse(MANIFEST).unwrap().kind("pipe").unwrap()
}

fn set(n: u64, k: i64, v: &str) -> Command {
    Command::new(id(n), "set", json!({"k": k, "v": v}), NOW + 60_000)
}

/// Fails when `k` exists: a second execution would be rejected.
fn create(n: u64, k: i64, v: &str) -> Command {
    Command::new(id(n), "create", json!({"k": k, "v": v}), NOW + 60_000)
}

fn big(n: u64, k: i64, bytes: i64) -> Command {
    Command::new(id(n), "big", json!({"k": k, "n": bytes}), NOW + 60_000)
}

fn items(cell: &Cell) -> Value {
    cell.query("items", &json!({})).unwrap()["rows"].clone()
}

fn exec(h: &mut Harness, group: &[Command]) -> (GroupResult, Publication) {
    let now = h.now;
    let mut r = h.cell().execute(group, now).unwrap();
    let p = r.publication.take().expect("the group changed something");
    (r, p)
}

fn applied(r: &GroupResult) -> Vec<bool> {
    r.results
        .iter()
        .map(|c| matches!(c.outcome, Outcome::Applied { .. }))
        .collect()
}

#[test]
fn queries_see_only_the_published_state_until_each_confirm() {
    let mut h = Harness::new(kind(), CellConfig::default());
    h.run(&[set(1, 1, "one")]);
    let published = h.position();
    let (_, p1) = exec(&mut h, &[set(2, 1, "uno"), set(3, 2, "two")]);
    assert_eq!(
        p1.pre, published,
        "the first delta starts at the published state"
    );
    assert_eq!(items(h.cell()), json!([[1, "one"]]));
    let (_, p2) = exec(&mut h, &[set(4, 1, "eins"), set(5, 3, "three")]);
    assert_eq!(p2.pre, p1.post, "the second delta chains on the first");
    assert_eq!(p2.txid, p1.txid.next().unwrap());
    assert!(!p1.is_snapshot() && !p2.is_snapshot());

    let cell = h.cell();
    assert_eq!(items(cell), json!([[1, "one"]]));
    assert_eq!(cell.published_position(), published);
    assert_eq!(cell.position(), p2.post);
    assert_eq!(cell.pending_txid(), Some(p1.txid));
    assert_eq!(cell.pending_txids(), vec![p1.txid, p2.txid]);
    // The pipeline is full (default: two pending).
    assert!(!cell.can_execute());
    let err = cell.execute(&[set(6, 4, "four")], NOW).unwrap_err();
    assert!(
        matches!(err, Error::PipelineFull { oldest, pending: 2 } if oldest == p1.txid),
        "{err}"
    );
    // Out of order: refused, nothing changes.
    let err = cell.confirm(p2.txid).unwrap_err();
    assert!(
        matches!(err, Error::WrongPublication { got, pending } if got == p2.txid && pending == p1.txid),
        "{err}"
    );
    assert_eq!(cell.pending_txids(), vec![p1.txid, p2.txid]);
    assert_eq!(items(cell), json!([[1, "one"]]));
    // A checkpoint would fold unpublished frames into the file: refused.
    assert!(matches!(
        cell.checkpoint(),
        Err(Error::PublicationPending(t)) if t == p1.txid
    ));

    h.publish(p1.clone());
    assert_eq!(h.position(), p1.post);
    assert_eq!(items(h.cell()), json!([[1, "uno"], [2, "two"]]));
    assert!(h.cell().can_execute(), "one slot is free again");
    h.publish(p2.clone());
    assert_eq!(
        items(h.cell()),
        json!([[1, "eins"], [2, "two"], [3, "three"]])
    );
    assert_eq!(h.cell().pending_txid(), None);
    assert_eq!(h.cell().position(), h.position());
    let (pos, recovered) = h.recover_bytes("r.db");
    assert_eq!(pos, p2.post);
    assert_eq!(recovered, h.live_bytes());
}

#[test]
fn abort_with_two_pending_restores_the_published_files_byte_identically() {
    let mut h = Harness::new(kind(), CellConfig::default());
    h.run(&[set(1, 1, "one")]);
    h.run(&[set(2, 2, "two")]); // the WAL holds published frames
    let published = h.position();
    let wal_path = h.dir.path().join("cell.db-wal");
    let db_before = std::fs::read(&h.path).unwrap();
    let wal_before = std::fs::read(&wal_path).unwrap();
    assert!(!wal_before.is_empty());

    let (r1, p1) = exec(&mut h, &[create(10, 3, "three"), set(11, 1, "uno")]);
    let (r2, p2) = exec(&mut h, &[create(12, 4, "four"), big(13, 1, 50_000)]);
    assert_eq!(applied(&r1), vec![true, true]);
    assert_eq!(applied(&r2), vec![true, true]);
    assert_eq!(h.cell().abort().unwrap(), vec![p1.txid, p2.txid]);

    assert_eq!(h.position(), published);
    assert_eq!(h.cell().position(), published);
    assert_eq!(h.cell().pending_txids(), Vec::<Txid>::new());
    assert_eq!(std::fs::read(&h.path).unwrap(), db_before);
    assert_eq!(std::fs::read(&wal_path).unwrap(), wal_before);
    assert_eq!(items(h.cell()), json!([[1, "one"], [2, "two"]]));
    // Aborted ids are free again: the same commands run afresh (a second
    // `create` of an existing key would be rejected) and chain on the
    // published state.
    let (r, p) = exec(&mut h, &[create(10, 3, "three"), create(12, 4, "four")]);
    assert_eq!(applied(&r), vec![true, true]);
    assert!(r.results.iter().all(|c| !c.duplicate));
    assert_eq!(p.pre, published);
    assert_eq!(p.txid, p1.txid, "the aborted txid is reused");
    h.publish(p);
    assert_eq!(
        items(h.cell()),
        json!([[1, "one"], [2, "two"], [3, "three"], [4, "four"]])
    );
    let (pos, recovered) = h.recover_bytes("r.db");
    assert_eq!(pos, h.position());
    assert_eq!(recovered, h.live_bytes());
}

#[test]
fn abort_after_the_first_of_two_is_confirmed_keeps_the_first() {
    let mut h = Harness::new(kind(), CellConfig::default());
    let (_, p1) = exec(&mut h, &[set(1, 1, "kept")]);
    let (_, p2) = exec(&mut h, &[set(2, 2, "lost")]);
    h.publish(p1.clone());
    assert_eq!(h.cell().abort().unwrap(), vec![p2.txid]);
    assert_eq!(h.position(), p1.post);
    assert_eq!(items(h.cell()), json!([[1, "kept"]]));
    let (pos, recovered) = h.recover_bytes("r.db");
    assert_eq!(pos, p1.post);
    assert_eq!(recovered, h.live_bytes());
}

#[test]
fn duplicates_of_pending_commands_report_their_dependency() {
    let mut h = Harness::new(kind(), CellConfig::default());
    let x = create(7, 1, "x");
    let (r1, p1) = exec(&mut h, std::slice::from_ref(&x));
    assert_eq!(r1.results[0].depends_on_txid, Some(p1.txid));
    let first = r1.results[0].outcome.clone();
    assert!(matches!(first, Outcome::Applied { .. }));

    // Repeated while pending, alone: no publication, but the stored
    // outcome rests on the pending one.
    let now = h.now;
    let r = h.cell().execute(std::slice::from_ref(&x), now).unwrap();
    assert!(r.publication.is_none());
    assert!(r.results[0].duplicate);
    assert_eq!(r.results[0].outcome, first);
    assert_eq!(r.results[0].txid, Some(p1.txid));
    assert_eq!(r.results[0].depends_on_txid, Some(p1.txid));

    // Repeated next to fresh work, and the id reused for another payload.
    let mut reused = x.clone();
    reused.args = json!({"k": 2, "v": "other"}).into();
    let (r2, p2) = exec(&mut h, &[x.clone(), set(8, 3, "y"), reused]);
    assert!(r2.results[0].duplicate);
    assert_eq!(r2.results[0].outcome, first);
    assert_eq!(r2.results[0].depends_on_txid, Some(p1.txid));
    assert!(!r2.results[1].duplicate);
    assert_eq!(r2.results[1].depends_on_txid, Some(p2.txid));
    assert!(matches!(
        &r2.results[2].outcome,
        Outcome::Rejected { rejection } if rejection.code == RejectCode::IdReused
    ));
    assert_eq!(r2.results[2].depends_on_txid, Some(p1.txid));

    // Once the first is published the stored outcome depends on nothing,
    // while the second is still pending.
    h.publish(p1.clone());
    let now = h.now;
    let r = h.cell().execute(std::slice::from_ref(&x), now).unwrap();
    assert!(r.publication.is_none());
    assert!(r.results[0].duplicate);
    assert_eq!(r.results[0].outcome, first);
    assert_eq!(r.results[0].depends_on_txid, None);
    h.publish(p2);
    assert_eq!(items(h.cell()), json!([[1, "x"], [3, "y"]]));
}

#[test]
fn exactly_once_after_abort_reexecutes_and_after_confirm_returns_the_stored_outcome() {
    let mut h = Harness::new(kind(), CellConfig::default());
    let x = create(7, 1, "x");
    let (_, p1) = exec(&mut h, &[set(1, 9, "base")]);
    let (r2, p2) = exec(&mut h, std::slice::from_ref(&x));
    assert_eq!(r2.results[0].depends_on_txid, Some(p2.txid));
    let ledger_pending = h.cell().ledger_len().unwrap();
    assert_eq!(ledger_pending, 2);
    // The earlier publication fails: both are void, x's outcome with them.
    assert_eq!(h.cell().abort().unwrap(), vec![p1.txid, p2.txid]);
    assert_eq!(h.cell().ledger_len().unwrap(), 0);
    let (r, p) = exec(&mut h, std::slice::from_ref(&x));
    assert!(!r.results[0].duplicate, "executed again, not replayed");
    assert!(matches!(r.results[0].outcome, Outcome::Applied { .. }));
    assert_eq!(r.results[0].depends_on_txid, Some(p.txid));
    assert_eq!(p.txid, p1.txid);
    h.publish(p);
    // Confirmed: a retry gets the stored outcome (a second `create` of
    // key 1 would be rejected) and changes nothing.
    let r = h.run(std::slice::from_ref(&x));
    assert!(r.publication.is_none());
    assert!(r.results[0].duplicate);
    assert!(matches!(r.results[0].outcome, Outcome::Applied { .. }));
    assert_eq!(r.results[0].depends_on_txid, None);
    assert_eq!(items(h.cell()), json!([[1, "x"]]));
}

#[test]
fn snapshots_while_pending_describe_the_published_state() {
    let config = CellConfig {
        snapshot_delta_bytes: 8 * 4096,
        ..CellConfig::default()
    };
    let mut h = Harness::new(kind(), config);
    h.run(&[set(1, 1, "one"), big(2, 1, 20_000)]);
    let published = h.position();
    let (_, p1) = exec(&mut h, &[set(3, 2, "two")]);
    // A large delta on top of a pending one is converted to a snapshot of
    // the latest state.
    let (_, p2) = exec(&mut h, &[big(4, 2, 100_000)]);
    assert!(!p1.is_snapshot());
    assert!(p2.is_snapshot());
    assert_eq!(p2.post.txid, p1.txid.next().unwrap());

    // snapshot() describes the published state, pending or not.
    let now = h.now;
    let snapshot = h.cell().snapshot(now).unwrap();
    assert_eq!(snapshot.post, published);
    let (_, published_bytes) = h.recover_bytes("published.db");
    let target = h.dir.path().join("snapshot.db");
    assert_eq!(
        cellfleet_cell::recover([snapshot.chain_file()], &target).unwrap(),
        published
    );
    assert_eq!(std::fs::read(&target).unwrap(), published_bytes);
    // The pending snapshot recovers to the latest state on its own.
    let target = h.dir.path().join("p2.db");
    assert_eq!(
        cellfleet_cell::recover([p2.chain_file()], &target).unwrap(),
        p2.post
    );

    h.publish(p1);
    h.publish(p2.clone());
    assert_eq!(h.chain.len(), 1, "the snapshot replaced the chain");
    let (pos, recovered) = h.recover_bytes("r.db");
    assert_eq!(pos, p2.post);
    assert_eq!(recovered, h.live_bytes());
    assert_eq!(std::fs::read(&target).unwrap(), recovered);
}

#[test]
fn checkpoints_wait_until_nothing_is_pending() {
    let config = CellConfig {
        checkpoint_wal_bytes: 32 * 1024,
        ..CellConfig::default()
    };
    let mut h = Harness::new(kind(), config);
    let wal_path = h.dir.path().join("cell.db-wal");
    let wal_len = || std::fs::metadata(&wal_path).map(|m| m.len()).unwrap_or(0);
    // Start from an empty WAL, whatever size the creation left.
    h.cell().checkpoint().unwrap();
    assert_eq!(wal_len(), 0, "a checkpoint empties the WAL");
    // Two groups pending; together they outgrow the checkpoint bound.
    let (_, p1) = exec(&mut h, &[big(1, 1, 2_000)]);
    assert!(wal_len() < 32 * 1024);
    let (_, p2) = exec(&mut h, &[big(2, 2, 40_000)]);
    assert!(wal_len() >= 32 * 1024);
    // Confirming the first leaves the second pending: no checkpoint, so
    // that confirm is light (the runtime runs it off the blocking pool).
    assert!(h.cell().confirm_is_light());
    h.publish(p1);
    assert!(wal_len() >= 32 * 1024);
    // With the WAL over the bound and something pending, the pipeline
    // drains before another group runs.
    assert!(!h.cell().can_execute());
    let err = h.cell().execute(&[set(3, 1, "x")], NOW).unwrap_err();
    assert!(
        matches!(err, Error::CheckpointDue { oldest, .. } if oldest == p2.txid),
        "{err}"
    );
    // Confirming the last one checkpoints (TRUNCATE, verified: every pin
    // is released by then, or SQLite would report the checkpoint busy):
    // not light.
    assert!(!h.cell().confirm_is_light());
    h.publish(p2);
    assert_eq!(wal_len(), 0);
    assert!(h.cell().can_execute());
    let (_, p3) = exec(&mut h, &[set(3, 1, "x")]);
    // The last one pending, the WAL under the bound: light, and it leaves
    // the WAL as it is.
    assert!(h.cell().confirm_is_light());
    let before = wal_len();
    h.publish(p3);
    assert_eq!(wal_len(), before);
    assert_eq!(items(h.cell()), json!([[1, "x"]]));
    let (pos, recovered) = h.recover_bytes("r.db");
    assert_eq!(pos, h.position());
    assert_eq!(recovered, h.live_bytes());
}

#[test]
fn one_pending_publication_at_most_keeps_groups_serial_but_queries_answer() {
    let config = CellConfig {
        pending_publications_max: 1,
        ..CellConfig::default()
    };
    let mut h = Harness::new(kind(), config);
    let (_, p1) = exec(&mut h, &[set(1, 1, "one")]);
    let err = h.cell().execute(&[set(2, 2, "two")], NOW).unwrap_err();
    assert!(
        matches!(err, Error::PipelineFull { oldest, pending: 1 } if oldest == p1.txid),
        "{err}"
    );
    assert_eq!(items(h.cell()), json!([]));
    h.publish(p1);
    assert_eq!(items(h.cell()), json!([[1, "one"]]));

    let dir = tempfile::tempdir().unwrap();
    let err = Cell::open(
        &dir.path().join("c.db"),
        kind(),
        CellConfig {
            pending_publications_max: 0,
            ..CellConfig::default()
        },
        Position::EMPTY,
        NOW,
    )
    .unwrap_err();
    assert!(matches!(err, Error::BadParameters(_)), "{err}");
}

#[test]
fn an_interrupted_query_keeps_the_published_view() {
    let config = CellConfig {
        statement_steps_max: 100_000,
        ..CellConfig::default()
    };
    let mut h = Harness::new(kind(), config);
    h.run(&[set(1, 1, "one")]);
    let (_, p1) = exec(&mut h, &[set(2, 1, "uno")]);
    let err = h
        .cell()
        .query("count", &json!({"n": 10_000_000}))
        .unwrap_err();
    assert!(
        matches!(&err, Error::Rejected(r) if r.code == RejectCode::LimitExceeded),
        "{err}"
    );
    assert_eq!(
        h.cell().query("count", &json!({"n": 10})).unwrap()["rows"],
        json!([[10]])
    );
    assert_eq!(items(h.cell()), json!([[1, "one"]]));
    h.publish(p1);
    assert_eq!(items(h.cell()), json!([[1, "uno"]]));
}

#[test]
fn a_pipelined_migration_on_open_and_groups_behind_it_recover() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.db");
    let opened = Cell::open(&path, kind(), CellConfig::default(), Position::EMPTY, NOW).unwrap();
    let mut cell = opened.cell;
    let migration = opened.migration.unwrap();
    // A group executes while the creation is still being published.
    let r = cell.execute(&[set(1, 1, "one")], NOW).unwrap();
    let p = r.publication.unwrap();
    assert_eq!(p.pre, migration.post);
    assert_eq!(r.results[0].depends_on_txid, Some(Txid(2)));
    // The published state is the new Cell's file before its first group:
    // the kind's schema (from its template) and no row of the pending group.
    assert_eq!(
        items(&cell),
        json!([]),
        "the published state has no row yet"
    );
    cell.confirm(migration.txid).unwrap();
    assert_eq!(items(&cell), json!([]));
    cell.confirm(p.txid).unwrap();
    assert_eq!(items(&cell), json!([[1, "one"]]));
    let target = dir.path().join("r.db");
    let pos = cellfleet_cell::recover([migration.chain_file(), p.chain_file()], &target).unwrap();
    assert_eq!(pos, cell.published_position());
}

#[test]
fn engine_statements_never_spend_the_kind_step_budget() {
    // A budget small enough that a few hundred engine statements would
    // exhaust it if they counted.
    let config = CellConfig {
        statement_steps_max: 2_000,
        ..CellConfig::default()
    };
    let mut h = Harness::new(kind(), config);
    h.run(&[set(1, 1, "one")]);
    for _ in 0..300 {
        let r = h.run(&[set(1, 1, "one")]);
        assert!(r.results[0].duplicate);
    }
    let r = h.run(&[set(2, 2, "two")]);
    assert!(matches!(r.results[0].outcome, Outcome::Applied { .. }));
    assert_eq!(items(h.cell()), json!([[1, "one"], [2, "two"]]));
}

/// Descriptors this process holds on the harness Cell's files.
fn held(h: &Harness) -> usize {
    let name = h.path.file_name().unwrap().to_owned();
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter(|target| {
            target.parent() == h.path.parent()
                && target.file_name().is_some_and(|file| {
                    file.to_string_lossy().starts_with(&*name.to_string_lossy())
                })
        })
        .count()
}

/// With `reader_on_demand` a Cell holds no reader until something reads
/// it; while a group is pending and no reader holds the published state,
/// reads are refused with the retryable `ViewPending` (never answered
/// from pending state), and answer again once the group is confirmed.
#[test]
fn a_reader_on_demand_is_opened_by_the_first_read_and_never_shows_pending_state() {
    let config = CellConfig {
        reader_on_demand: true,
        ..CellConfig::default()
    };
    let mut h = Harness::new(kind(), config);
    assert_eq!(h.cell().readers_open(), 0, "opening reads nothing");
    assert_eq!(held(&h), h.cell().descriptors());
    h.run(&[set(1, 1, "one")]);
    assert_eq!(h.cell().readers_open(), 0, "writing reads nothing");
    // Overlapping groups of a Cell nobody reads pin nothing: after the
    // first confirm there is no view until the second.
    let (_, a) = exec(&mut h, &[set(20, 9, "a")]);
    let (_, b) = exec(&mut h, &[set(21, 9, "b")]);
    assert_eq!(h.cell().readers_open(), 0);
    h.publish(a);
    assert!(!h.cell().has_published_view());
    assert!(matches!(
        h.cell().query("items", &json!({})),
        Err(Error::ViewPending { .. })
    ));
    h.publish(b);
    assert_eq!(h.cell().readers_open(), 0, "settled and never read");

    // Pending, never read: refused, with a hint to ask again.
    let published = h.position();
    let (_, p2) = exec(&mut h, &[set(2, 1, "uno")]);
    assert!(!h.cell().has_published_view());
    let err = h.cell().query("items", &json!({})).unwrap_err();
    assert!(
        matches!(err, Error::ViewPending { published: p, pending } if p == published.txid && pending == p2.txid),
        "{err}"
    );
    assert!(err.is_retryable());
    let err = h
        .cell()
        .published_outcome(&cellfleet_cell::CommandId(id(1)))
        .unwrap_err();
    assert!(matches!(err, Error::ViewPending { .. }), "{err}");
    h.publish(p2);
    // Settled: the first read opens the reader, which then keeps the
    // published state while the next group is pending.
    assert!(h.cell().has_published_view());
    assert_eq!(items(h.cell())[0], json!([1, "uno"]));
    assert_eq!(h.cell().readers_open(), 1);
    let (_, p3) = exec(&mut h, &[set(3, 2, "two")]);
    assert_eq!(items(h.cell()), json!([[1, "uno"], [9, "b"]]));
    assert!(h
        .cell()
        .published_outcome(&cellfleet_cell::CommandId(id(3)))
        .unwrap()
        .is_none());
    h.publish(p3);
    assert_eq!(items(h.cell()), json!([[1, "uno"], [2, "two"], [9, "b"]]));

    assert_eq!(held(&h), h.cell().descriptors(), "with a reader");
    // Closed while idle (SQLite keeps the database descriptor of a reader
    // closed while the writer holds its lock, and the next reader reuses
    // it); `want_view` makes the next group keep one.
    assert_eq!(h.cell().close_idle_readers(), 1);
    assert_eq!(h.cell().readers_open(), 0);
    assert_eq!(held(&h), h.cell().descriptors(), "a reader closed");
    let (_, p4) = exec(&mut h, &[set(4, 3, "three")]);
    assert!(matches!(
        h.cell().query("items", &json!({})),
        Err(Error::ViewPending { .. })
    ));
    h.cell().want_view();
    h.publish(p4);
    assert_eq!(h.cell().readers_open(), 0);
    let (_, p5) = exec(&mut h, &[set(5, 4, "four")]);
    assert!(h.cell().has_published_view(), "wanted: pinned by the group");
    assert_eq!(held(&h), h.cell().descriptors(), "reopened");
    assert_eq!(
        items(h.cell()),
        json!([[1, "uno"], [2, "two"], [3, "three"], [9, "b"]])
    );
    h.publish(p5);

    // Pipelined with no reader: once a view is wanted, the second group
    // pins one at the first group's state, the published view on its
    // confirm.
    assert_eq!(h.cell().close_idle_readers(), 1);
    let (_, p6) = exec(&mut h, &[set(6, 1, "eins")]);
    assert!(!h.cell().has_published_view());
    h.cell().want_view();
    let (_, p7) = exec(&mut h, &[set(7, 1, "ein")]);
    assert_eq!(h.cell().readers_open(), 1);
    assert!(!h.cell().has_published_view());
    h.publish(p6);
    assert!(h.cell().has_published_view());
    assert_eq!(items(h.cell())[0], json!([1, "eins"]));
    h.publish(p7);
    assert_eq!(items(h.cell())[0], json!([1, "ein"]));

    // An abort with no reader leaves the published state readable.
    assert_eq!(h.cell().close_idle_readers(), 1);
    exec(&mut h, &[set(8, 1, "lost")]);
    h.cell().abort().unwrap();
    assert_eq!(h.cell().readers_open(), 0);
    assert_eq!(items(h.cell())[0], json!([1, "ein"]));
    let (pos, recovered) = h.recover_bytes("r.db");
    assert_eq!(pos, h.position());
    assert_eq!(recovered, h.live_bytes());
}
