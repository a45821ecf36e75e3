//! Recovery: rebuild a Cell's database file from its published chain.
//!
//! Ordering: every file is applied to a scratch file next to the target
//! (each application checks the file's position, checksums and, for files
//! that track them, the post-apply database checksum); the scratch file's
//! full rolling checksum is recomputed and must equal the chain's final
//! position (and the caller's expected position, when given); only then is
//! it synced, the target's stale `-wal`/`-shm` removed, and the scratch file
//! renamed over the target and the directory synced. A target held open by
//! a [`crate::Cell`] (its lock file is locked) is never touched.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::path::{Path, PathBuf};

use cellfleet_ltx::{database_checksum, Position};

use crate::cell::lock_cell;
use crate::{Error, Result};

fn sidecar(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(suffix);
    PathBuf::from(s)
}

fn remove_if_present(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Rebuild the database at `target` from `chain` (a snapshot, then deltas,
/// oldest first). Returns the final position. An empty chain leaves no
/// database (the empty position).
pub fn recover<R: Read>(
    chain: impl IntoIterator<Item = R>,
    target: &Path,
    expected: Option<Position>,
) -> Result<Position> {
    let _lock = lock_cell(target)?;
    let scratch = sidecar(target, ".recover");
    remove_if_present(&scratch)?;
    let result = rebuild(chain, &scratch, expected);
    let position = match result {
        Ok(p) => p,
        Err(e) => {
            let _ = std::fs::remove_file(&scratch);
            return Err(e);
        }
    };
    remove_if_present(&sidecar(target, "-wal"))?;
    remove_if_present(&sidecar(target, "-shm"))?;
    if position == Position::EMPTY {
        remove_if_present(&scratch)?;
        remove_if_present(target)?;
    } else {
        std::fs::rename(&scratch, target)?;
    }
    if let Some(dir) = target.parent().filter(|d| !d.as_os_str().is_empty()) {
        File::open(dir)?.sync_all()?;
    }
    Ok(position)
}

fn rebuild<R: Read>(
    chain: impl IntoIterator<Item = R>,
    scratch: &Path,
    expected: Option<Position>,
) -> Result<Position> {
    let mut file = OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .open(scratch)?;
    let mut position = Position::EMPTY;
    let mut page_size = None;
    for (index, ltx) in chain.into_iter().enumerate() {
        let mut buffered = std::io::BufReader::new(ltx);
        // Peek the page size from the header for the final check.
        let mut header = [0u8; cellfleet_ltx::HEADER_SIZE];
        buffered
            .read_exact(&mut header)
            .map_err(cellfleet_ltx::Error::from)?;
        let parsed = cellfleet_ltx::Header::decode(&header)?;
        if index == 0 && !parsed.is_snapshot() {
            return Err(Error::Recovery("a chain must start with a snapshot".into()));
        }
        page_size = Some(parsed.page_size);
        position = cellfleet_ltx::apply(&mut file, header.as_slice().chain(buffered), position)
            .map_err(|e| Error::Recovery(format!("file {index} of the chain: {e}")))?;
    }
    if let Some(page_size) = page_size {
        use std::io::Seek;
        file.rewind()?;
        let computed = database_checksum(std::io::BufReader::new(&file), page_size)?;
        if computed != position.checksum {
            return Err(Error::Recovery(format!(
                "rebuilt database checksum {computed} differs from the chain's {}",
                position.checksum
            )));
        }
    }
    if let Some(expected) = expected {
        if expected != position {
            return Err(Error::Recovery(format!(
                "the chain ends at {position:?}, not at the expected {expected:?}"
            )));
        }
    }
    file.sync_all()?;
    Ok(position)
}
