//! SQLite's memory statistics turned off before SQLite initializes (its own
//! process: the setting is process-wide and refused once SQLite has started).

#[test]
fn memory_statistics_turn_off_before_sqlite_starts_and_stay_off() {
    assert!(cellfleet_vfs::memory_statistics_off());
    assert!(!cellfleet_vfs::memory_statistics_on());
    let conn = rusqlite::Connection::open_in_memory().unwrap();
    conn.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (randomblob(100000));")
        .unwrap();
    assert!(
        !cellfleet_vfs::memory_statistics_on(),
        "SQLite holds memory yet counts none"
    );
    assert!(
        cellfleet_vfs::memory_statistics_off(),
        "a second call finds them off"
    );
}
