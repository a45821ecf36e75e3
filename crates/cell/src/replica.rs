//! Writing a published chain as a Litestream file replica, so the real
//! `litestream restore` (and `cellfleet ltx restore`) can rebuild a Cell.
//!
//! Layout: `DIR/ltx/0/{min:016x}-{max:016x}.ltx`, one file per chain entry.

use std::path::{Path, PathBuf};

use crate::Result;

/// Write `chain` (encoded LTX files, oldest first) under `dir` as a
/// Litestream file replica at level 0; returns the paths written.
pub fn write_file_replica(dir: &Path, chain: &[&[u8]]) -> Result<Vec<PathBuf>> {
    let level = dir.join("ltx").join("0");
    std::fs::create_dir_all(&level)?;
    let mut paths = Vec::with_capacity(chain.len());
    for bytes in chain {
        let header = cellfleet_ltx::Decoder::new(*bytes)?;
        let header = header.header();
        let path = level.join(cellfleet_ltx::file_name(header.min_txid, header.max_txid));
        std::fs::write(&path, bytes)?;
        paths.push(path);
    }
    Ok(paths)
}
