//! Which Cell databases this process is working on: open in an engine
//! ([`crate::Cell`]), being rebuilt ([`crate::recover`]) or tidied
//! ([`crate::tidy_closed`]). One at a time per database file.
//!
//! A claim is an entry in a process-wide set, keyed by the database's
//! directory (device and inode, so two spellings of one directory meet)
//! and file name. It used to be an advisory lock on a `.lock` file next
//! to each database: a file and a descriptor per open Cell, and three
//! system calls per open, for what a set in memory answers.
//!
//! Other processes are kept out by other means:
//! - a node's whole directory by its `node.lock`;
//! - an open Cell's database by the `cellfleet` VFS, whose first
//!   connection locks SQLite's lock bytes of it (an engine of another
//!   process then fails to open it: [`crate::Error::Live`]);
//! - recovery and tidying take that same lock for as long as they work
//!   ([`Claim::exclude_connections`]), so they never run under a
//!   connection of another process.

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::{Error, Result};

type Key = (u64, u64, OsString);

fn claimed() -> std::sync::MutexGuard<'static, HashSet<Key>> {
    static CLAIMED: OnceLock<Mutex<HashSet<Key>>> = OnceLock::new();
    CLAIMED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// This process's claim on one Cell database; released when the last
/// clone drops.
#[derive(Clone, Debug)]
pub(crate) struct Claim {
    _held: Arc<Held>,
}

#[derive(Debug)]
struct Held {
    key: Key,
}

impl Drop for Held {
    fn drop(&mut self) {
        claimed().remove(&self.key);
    }
}

/// Claims the Cell database at `path`: [`Error::Live`] when this process
/// has claimed it already. The database need not exist; its directory
/// must.
pub(crate) fn claim(path: &Path) -> Result<Claim> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let Some(name) = path.file_name() else {
        return Err(Error::BadParameters(format!(
            "{} names no file for a Cell database",
            path.display()
        )));
    };
    let meta = std::fs::metadata(dir)?;
    let key = (meta.dev(), meta.ino(), name.to_os_string());
    if !claimed().insert(key.clone()) {
        return Err(Error::Live(path.display().to_string()));
    }
    Ok(Claim {
        _held: Arc::new(Held { key }),
    })
}

impl Claim {
    /// Keeps connections of other processes off the database at `path`
    /// (this claim's) until the returned file closes; `None` when there
    /// is no database. [`Error::Live`] when one is open.
    pub(crate) fn exclude_connections(&self, path: &Path) -> Result<Option<File>> {
        match cellfleet_vfs::exclude_connections(path) {
            Ok(file) => Ok(file),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                Err(Error::Live(path.display().to_string()))
            }
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_is_claimed_once_until_its_last_clone_drops() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.db");
        let first = claim(&path).unwrap();
        assert!(matches!(claim(&path), Err(Error::Live(_))));
        // Another spelling of the same directory is the same database.
        let other = dir.path().join(".").join("a.db");
        assert!(matches!(claim(&other), Err(Error::Live(_))));
        let _b = claim(&dir.path().join("b.db")).unwrap();
        let clone = first.clone();
        drop(first);
        assert!(matches!(claim(&path), Err(Error::Live(_))));
        drop(clone);
        drop(claim(&path).unwrap());
        assert!(matches!(
            claim(&dir.path().join("missing").join("c.db")),
            Err(Error::Io(_))
        ));
    }
}
