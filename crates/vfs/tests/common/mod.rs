//! What the VFS's test binaries share.

use std::path::Path;

use rusqlite::{Connection, OpenFlags};

/// A connection of `path` through the `cellfleet` VFS, read-only or
/// read-write (creating the file), in SQLite's default journal mode.
pub fn connect(path: &Path, read_only: bool) -> Connection {
    cellfleet_vfs::register().unwrap();
    let flags = if read_only {
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX
    } else {
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
    };
    Connection::open_with_flags_and_vfs(path, flags, cellfleet_vfs::NAME).unwrap()
}
