//! Exclusive locks on data directories (an OS file lock, released when the process exits however it exits), so two processes never share one.

use std::fs::{File, OpenOptions};
use std::path::Path;

use anyhow::Context;

/// Takes the lock file at `path` (creating it), or `Ok(None)` if another
/// process holds it. The lock lasts as long as the returned file.
pub fn try_lock(path: &Path) -> anyhow::Result<Option<File>> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(error)) => {
            Err(error).with_context(|| format!("cannot lock {}", path.display()))
        }
    }
}
