//! Recovery: rebuild a Cell's database file from its published chain.
//!
//! Each chain file comes with the position the publisher recorded for it
//! (its post-apply TXID and rolling checksum, kept in the authority root),
//! because files written in the Litestream form carry no database
//! checksums and [`cellfleet_ltx::apply`] then checks only the TXID.
//!
//! Ordering: every file is applied to a scratch file next to the target;
//! after each one the position [`cellfleet_ltx::apply`] computed
//! incrementally must equal the file's recorded position (a mismatch names
//! the TXID: [`Error::ChainMismatch`]); files that carry checksums are also
//! checked by `apply` itself. The scratch file's full rolling checksum is
//! then recomputed from its bytes and must equal the final position; only
//! then is it synced, the target's stale `-wal`/`-shm` removed, and the
//! scratch file renamed over the target and the directory synced. A target
//! held open by a [`crate::Cell`] (of this process: its claim, `live.rs`;
//! of another: the VFS's lock on the database) is never touched.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::path::Path;

use cellfleet_ltx::{database_checksum, Position};

use crate::connection::sidecar;
use crate::{Error, Result};

/// One file of a published chain and the position it leaves the Cell at.
#[derive(Debug, Clone, Copy)]
pub struct ChainFile<R> {
    /// The encoded LTX file (anything readable: a byte slice, a file).
    pub ltx: R,
    /// The position after applying it, as recorded when it was published
    /// ([`crate::Publication::post`]).
    pub post: Position,
}

impl<'a> ChainFile<&'a [u8]> {
    /// A chain entry over bytes.
    pub fn new(ltx: &'a [u8], post: Position) -> Self {
        ChainFile { ltx, post }
    }
}

fn remove_if_present(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Rebuild the database at `target` from `chain` (a snapshot, then deltas,
/// oldest first), checking every file against its recorded position.
/// Returns the final position (the last file's). An empty chain leaves no
/// database (the empty position).
pub fn recover<R: Read>(
    chain: impl IntoIterator<Item = ChainFile<R>>,
    target: &Path,
) -> Result<Position> {
    // This process's engines stay off the file, and so do other
    // processes' connections, until the rebuilt file is in place.
    let claim = crate::live::claim(target)?;
    let _excluded = claim.exclude_connections(target)?;
    let scratch = sidecar(target, ".recover");
    remove_if_present(&scratch)?;
    let result = rebuild(chain, &scratch);
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
    chain: impl IntoIterator<Item = ChainFile<R>>,
    scratch: &Path,
) -> Result<Position> {
    let mut file = OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .open(scratch)?;
    let mut position = Position::EMPTY;
    let mut page_size = None;
    for (index, entry) in chain.into_iter().enumerate() {
        let mut buffered = std::io::BufReader::new(entry.ltx);
        // Peek the header: the chain must start with a snapshot, and the
        // page size is needed for the final check.
        let mut header = [0u8; cellfleet_ltx::HEADER_SIZE];
        buffered
            .read_exact(&mut header)
            .map_err(cellfleet_ltx::Error::from)?;
        let parsed = cellfleet_ltx::Header::decode(&header)?;
        if index == 0 && !parsed.is_snapshot() {
            return Err(Error::Recovery("a chain must start with a snapshot".into()));
        }
        page_size = Some(parsed.page_size);
        let found = cellfleet_ltx::apply(&mut file, header.as_slice().chain(buffered), position)
            .map_err(|e| {
                Error::Recovery(format!(
                    "file {index} of the chain (txid {}): {e}",
                    parsed.max_txid
                ))
            })?;
        if found != entry.post {
            return Err(Error::ChainMismatch {
                txid: parsed.max_txid,
                expected: entry.post,
                found,
            });
        }
        position = found;
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
    file.sync_all()?;
    Ok(position)
}
