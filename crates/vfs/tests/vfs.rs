//! The `cellfleet` VFS under real SQLite connections: WAL readers and a
//! writer on threads, no `-shm` file, other lock holders kept out, and the
//! WAL index rebuilt after the last connection goes.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rusqlite::{Connection, ErrorCode, OpenFlags, TransactionBehavior};

mod common;

/// A connection of `path`; a read-write one in WAL mode.
fn open(path: &Path, read_only: bool) -> Connection {
    let conn = common::connect(path, read_only);
    if !read_only {
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
    }
    conn
}

/// Opening `path` through this VFS fails with `SQLITE_BUSY`.
fn assert_open_is_busy(path: &Path) {
    cellfleet_vfs::register().unwrap();
    let refused = Connection::open_with_flags_and_vfs(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        cellfleet_vfs::NAME,
    )
    .unwrap_err();
    assert_eq!(refused.sqlite_error_code(), Some(ErrorCode::DatabaseBusy));
}

fn sidecar(path: &Path, suffix: &str) -> std::path::PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(suffix);
    s.into()
}

/// Two rows per transaction whose values always sum to zero: a reader
/// that ever sees a torn transaction, or a count that goes back, fails.
#[test]
fn readers_on_threads_see_whole_transactions_of_a_writer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cell.db");
    let mut writer = open(&path, false);
    writer
        .execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, v INTEGER NOT NULL);")
        .unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let path = path.clone();
            let done = done.clone();
            std::thread::spawn(move || {
                let reader = open(&path, true);
                let (mut reads, mut last) = (0u64, 0i64);
                while !done.load(Ordering::Relaxed) {
                    let (count, sum): (i64, i64) = reader
                        .query_row("SELECT count(*), coalesce(sum(v), 0) FROM t", [], |r| {
                            Ok((r.get(0)?, r.get(1)?))
                        })
                        .unwrap();
                    assert_eq!(sum, 0, "a torn transaction was visible");
                    assert_eq!(count % 2, 0);
                    assert!(count >= last, "the count went back from {last} to {count}");
                    last = count;
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    for i in 0..2_000i64 {
        let tx = writer
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .unwrap();
        tx.execute("INSERT INTO t (v) VALUES (?1)", [i]).unwrap();
        tx.execute("INSERT INTO t (v) VALUES (?1)", [-i]).unwrap();
        tx.commit().unwrap();
        if i % 500 == 499 {
            // A checkpoint while readers hold snapshots: it must wait for
            // them, never pull pages from under them.
            let _: (i64, i64, i64) = writer
                .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })
                .unwrap();
        }
    }
    done.store(true, Ordering::Relaxed);
    for reader in readers {
        assert!(reader.join().unwrap() > 0);
    }
    let count: i64 = writer
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap();
    assert_eq!(count, 4_000);
    assert!(sidecar(&path, "-wal").exists());
    assert!(
        !sidecar(&path, "-shm").exists(),
        "the WAL index became a file"
    );
}

#[test]
fn a_second_writer_waits_for_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cell.db");
    let mut first = open(&path, false);
    first.execute_batch("CREATE TABLE t (v);").unwrap();
    let second = open(&path, false);
    let tx = first
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .unwrap();
    tx.execute("INSERT INTO t VALUES (1)", []).unwrap();
    let refused = second.execute_batch("BEGIN IMMEDIATE").unwrap_err();
    assert_eq!(refused.sqlite_error_code(), Some(ErrorCode::DatabaseBusy));
    tx.commit().unwrap();
    second
        .execute_batch("BEGIN IMMEDIATE; INSERT INTO t VALUES (2); COMMIT;")
        .unwrap();
    let n: i64 = first
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 2);
}

/// SQLite's own unix VFS (what an `sqlite3` shell uses) cannot lock a
/// database a connection of this VFS has open, and can once it closed.
/// Open-file-description locks and the unix VFS's locks exclude each
/// other even inside one process, so this process stands in for another.
#[test]
fn other_lock_holders_are_kept_out_while_a_connection_is_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cell.db");
    let ours = open(&path, false);
    ours.execute_batch("CREATE TABLE t (v); INSERT INTO t VALUES (1);")
        .unwrap();
    let foreign = Connection::open(&path).unwrap();
    let refused = foreign
        .query_row("SELECT count(*) FROM t", [], |r| r.get::<_, i64>(0))
        .unwrap_err();
    assert_eq!(refused.sqlite_error_code(), Some(ErrorCode::DatabaseBusy));
    drop(ours);
    let n: i64 = foreign
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 1);
    // And the other way round: a database the unix VFS holds locked
    // refuses this VFS's open.
    foreign.execute_batch("BEGIN EXCLUSIVE").unwrap();
    assert_open_is_busy(&path);
}

/// [`cellfleet_vfs::exclude_connections`] is refused while a connection
/// has the file open, and while it holds, no connection opens the file;
/// once it closes, one does. A missing file is nothing to exclude.
#[test]
fn excluding_connections_waits_for_none_and_keeps_them_out() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cell.db");
    assert!(cellfleet_vfs::exclude_connections(&path).unwrap().is_none());
    assert!(!path.exists(), "nothing created");
    let conn = open(&path, false);
    conn.execute_batch("CREATE TABLE t (v); INSERT INTO t VALUES (1);")
        .unwrap();
    let refused = cellfleet_vfs::exclude_connections(&path).unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::WouldBlock);
    drop(conn);
    let held = cellfleet_vfs::exclude_connections(&path)
        .unwrap()
        .expect("the file exists");
    assert_open_is_busy(&path);
    drop(held);
    let conn = open(&path, false);
    let n: i64 = conn
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 1);
}

/// Committed frames left in the WAL by connections that closed without a
/// checkpoint are read back by the next one: the WAL index is rebuilt
/// from the WAL, as SQLite does for a new `-shm` file.
#[test]
fn the_next_open_rebuilds_the_wal_index_from_the_wal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cell.db");
    {
        let conn = open(&path, false);
        conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            true,
        )
        .unwrap();
        conn.execute_batch(
            "PRAGMA wal_autocheckpoint = 0; CREATE TABLE t (v); INSERT INTO t VALUES (7);",
        )
        .unwrap();
    }
    assert!(std::fs::metadata(sidecar(&path, "-wal")).unwrap().len() > 0);
    let conn = open(&path, false);
    let v: i64 = conn.query_row("SELECT v FROM t", [], |r| r.get(0)).unwrap();
    assert_eq!(v, 7);
}

/// Descriptors of this process open on `path` (from `/proc/self/fd`).
/// Other tests run in the same process, on files of their own.
fn descriptors_of(path: &Path) -> usize {
    let path = path.canonicalize().unwrap();
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter(|target| *target == path)
        .count()
}

/// The lock against other processes costs no descriptor: a connection
/// holds its database once. When the connection whose descriptor holds
/// the lock closes first, the lock stays (on a duplicate) until the last
/// connection of the file closes, and connections of this process still
/// open the file meanwhile.
#[test]
fn the_lock_rides_the_first_connections_descriptor_and_outlives_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cell.db");
    let writer = open(&path, false);
    writer
        .execute_batch("CREATE TABLE t (v); INSERT INTO t VALUES (1);")
        .unwrap();
    assert_eq!(descriptors_of(&path), 1, "one descriptor, lock included");
    let reader = open(&path, true);
    assert_eq!(descriptors_of(&path), 2);
    drop(writer);
    assert_eq!(
        descriptors_of(&path),
        2,
        "the reader's, and the closed writer's duplicate that keeps the lock"
    );
    let refused = cellfleet_vfs::exclude_connections(&path).unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::WouldBlock);
    let foreign = Connection::open(&path).unwrap();
    let refused = foreign
        .query_row("SELECT count(*) FROM t", [], |r| r.get::<_, i64>(0))
        .unwrap_err();
    assert_eq!(refused.sqlite_error_code(), Some(ErrorCode::DatabaseBusy));
    // A connection of this process still joins the open file.
    let writer = open(&path, false);
    writer.execute_batch("INSERT INTO t VALUES (2);").unwrap();
    let n: i64 = reader
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 2);
    drop(reader);
    drop(writer);
    assert_eq!(
        descriptors_of(&path),
        1,
        "the duplicate closed with the last; the unix VFS's connection holds one"
    );
    let held = cellfleet_vfs::exclude_connections(&path)
        .unwrap()
        .expect("the file exists");
    drop(held);
    let n: i64 = foreign
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 2);
}

/// A fresh connection takes a smaller lookaside pool (or none) and works
/// as before with it.
#[test]
fn a_fresh_connection_takes_a_smaller_lookaside_pool() {
    let dir = tempfile::tempdir().unwrap();
    for (slot_bytes, slots) in [(128, 16), (0, 0)] {
        let path = dir.path().join(format!("cell-{slots}.db"));
        let conn = common::connect(&path, false);
        cellfleet_vfs::set_lookaside(&conn, slot_bytes, slots).unwrap();
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; CREATE TABLE t (v); INSERT INTO t VALUES (1), (2);",
        )
        .unwrap();
        let n: i64 = conn
            .query_row("SELECT sum(v) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 3);
    }
}

/// The WAL's bytes on disk, copied with the database next to a fresh name
/// and opened through SQLite's own VFS (which recovers the WAL from its
/// frame headers and checksums): the rows `t` holds there.
fn rows_recovered_from_disk(path: &Path, copy: &Path) -> i64 {
    let _ = std::fs::remove_file(sidecar(copy, "-wal"));
    std::fs::copy(path, copy).unwrap();
    std::fs::copy(sidecar(path, "-wal"), sidecar(copy, "-wal")).unwrap();
    let recovered = Connection::open(copy).unwrap();
    let rows = recovered
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap();
    drop(recovered);
    std::fs::remove_file(copy).unwrap();
    rows
}

/// A WAL handle holds a frame's header back until its page is written (one
/// system call per frame): when a commit returns, every byte of it must
/// be in the file, header and checksums included, through a restart of
/// the WAL too, with small and large pages, and without a sync at commit
/// (Cells run with `synchronous = OFF`; a sync would write held bytes).
#[test]
fn every_commit_is_whole_on_disk_when_it_returns() {
    for (page_size, synchronous) in [
        (1024, "OFF"),
        (4096, "OFF"),
        (65536, "OFF"),
        (4096, "NORMAL"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cell.db");
        let copy = dir.path().join("copy.db");
        let conn = open(&path, false);
        conn.execute_batch(&format!(
            "PRAGMA wal_autocheckpoint = 0; PRAGMA synchronous = {synchronous}; \
             PRAGMA page_size = {page_size}; VACUUM;"
        ))
        .unwrap();
        conn.execute_batch("CREATE TABLE t (v)").unwrap();
        let mut rows = 0;
        for round in 0..3 {
            for n in 1..=4 {
                // One row, then a few, then one past a page.
                let tx = conn.unchecked_transaction().unwrap();
                for _ in 0..n {
                    tx.execute("INSERT INTO t VALUES (randomblob(?1))", [n * 700])
                        .unwrap();
                }
                tx.commit().unwrap();
                rows += n;
                assert_eq!(
                    rows_recovered_from_disk(&path, &copy),
                    rows,
                    "page size {page_size}, round {round}, after {rows} rows"
                );
            }
            // The next commit writes a new WAL header, then its frames.
            conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                .unwrap();
            assert_eq!(std::fs::metadata(sidecar(&path, "-wal")).unwrap().len(), 0);
        }
    }
}

/// A plain absolute path is the database's name as given; a symlinked
/// file is resolved as SQLite's unix VFS resolves it (the database and
/// its WAL beside the link's target); a path through a symlinked
/// directory keeps its name and the WAL beside the database in that
/// directory; `SQLITE_OPEN_NOFOLLOW` refuses a symlink anywhere on the
/// path.
#[test]
fn full_paths_are_the_names_given_and_symlinked_files_are_resolved() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().canonicalize().unwrap();
    let create = |conn: &Connection| {
        conn.execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1);")
            .unwrap();
    };

    let plain = real.join("plain.db");
    let conn = open(&plain, false);
    create(&conn);
    assert_eq!(conn.path(), plain.to_str());
    assert!(sidecar(&plain, "-wal").exists());
    drop(conn);

    let target = real.join("target.db");
    let link = real.join("link.db");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let conn = open(&link, false);
    create(&conn);
    assert_eq!(conn.path(), target.to_str());
    assert!(sidecar(&target, "-wal").exists());
    assert!(!sidecar(&link, "-wal").exists());
    drop(conn);

    let sub = real.join("sub");
    std::fs::create_dir(&sub).unwrap();
    let via = real.join("via");
    std::os::unix::fs::symlink(&sub, &via).unwrap();
    let conn = open(&via.join("d.db"), false);
    create(&conn);
    // The name as given: SQLite's own walk would have resolved it to
    // `sub/d.db`.
    assert_eq!(conn.path(), via.join("d.db").to_str());
    assert!(sub.join("d.db").exists());
    assert!(sub.join("d.db-wal").exists());
    let count: i64 = open(&sub.join("d.db"), true)
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap();
    assert_eq!(count, 1, "the same database through either path");

    // SQLITE_OPEN_NOFOLLOW refuses a symlink anywhere on the path, as the
    // unix VFS does; a plain path opens.
    let nofollow = |path: &Path| {
        Connection::open_with_flags_and_vfs(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX
                | OpenFlags::SQLITE_OPEN_NOFOLLOW,
            cellfleet_vfs::NAME,
        )
    };
    for refused in [via.join("d.db"), link.clone()] {
        let error = nofollow(&refused).unwrap_err();
        assert_eq!(
            error.sqlite_error().map(|e| e.extended_code),
            Some(rusqlite::ffi::SQLITE_CANTOPEN_SYMLINK),
            "{refused:?}: {error}"
        );
    }
    drop(conn);
    nofollow(&plain).unwrap();
}
