//! What the VFS's test binaries share.

use std::path::Path;

use rusqlite::Connection;

/// A connection of `path` through the `cellfleet` VFS, read-only or
/// read-write (creating the file), in SQLite's default journal mode.
pub fn connect(path: &Path, read_only: bool) -> Connection {
    cellfleet_vfs::register().unwrap();
    let flags = cellfleet_vfs::open_flags(read_only);
    Connection::open_with_flags_and_vfs(path, flags, cellfleet_vfs::NAME).unwrap()
}
