//! The lock against other processes when no descriptor is left to
//! duplicate: a test binary of its own, because it lowers the process's
//! open-file limit and spends every descriptor under it.

mod common;

use common::connect as open;

/// The connection whose descriptor holds the lock closes while a reader
/// stays, with no descriptor free for a duplicate: the reader's
/// descriptor takes the lock again, so the file is still kept from other
/// lock holders until the reader closes.
#[test]
fn the_lock_moves_to_another_connection_when_no_duplicate_can_be_made() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cell.db");
    // A rollback-journal database: the writer holds one descriptor, so
    // when it closes nothing else of it was freed first (a WAL connection
    // closes its `-wal` before its database, and the duplicate would take
    // that descriptor).
    let writer = open(&path, false);
    writer
        .execute_batch("CREATE TABLE t (v); INSERT INTO t VALUES (1);")
        .unwrap();
    let reader = open(&path, true);
    let n: i64 = reader
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 1);
    // SAFETY: reading and lowering this test process's own soft limit.
    unsafe {
        let mut limit: libc::rlimit = std::mem::zeroed();
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        limit.rlim_cur = limit.rlim_cur.min(256);
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
    }
    let mut spent = Vec::new();
    while let Ok(file) = std::fs::File::open("/dev/null") {
        spent.push(file);
    }
    assert!(!spent.is_empty());
    // The writer's close frees its database descriptor, but only after
    // the duplicate was tried.
    drop(writer);
    let refused = cellfleet_vfs::exclude_connections(&path).unwrap_err();
    assert_eq!(
        refused.kind(),
        std::io::ErrorKind::WouldBlock,
        "the reader's descriptor holds the lock now"
    );
    let n: i64 = reader
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 1);
    drop(reader);
    drop(spent);
    let held = cellfleet_vfs::exclude_connections(&path).unwrap();
    assert!(held.is_some(), "free once the last connection closed");
}
