//! Compaction: merge a contiguous chain of LTX files into one. State, TXID
//! and checksum do not change; only the representation does.
//!
//! The merged file keeps the inputs' checksum mode: a chain in the
//! Litestream form (flag `0x2`, no database checksums) merges into a file
//! of that form, and its position is the last input's recorded one. A chain
//! mixing both forms (the configuration changed between publications)
//! cannot be merged ([`cellfleet_ltx::Error::Incompatible`]); publish a
//! fresh snapshot ([`crate::Cell::snapshot`]) instead.
//!
//! Policy: a merged file that is not smaller than the files it replaces
//! gains nothing, so [`Compaction::shrank`] is false and the caller should
//! publish a fresh snapshot in its place when the chain starts at a
//! snapshot, or keep the chain as it is.

use std::io::Cursor;

use cellfleet_ltx::{Header, PageReader, Position, Trailer};

use crate::{ChainFile, Error, Result};

/// A merged chain.
#[derive(Debug, Clone)]
pub struct Compaction {
    pub header: Header,
    pub trailer: Trailer,
    pub ltx: Vec<u8>,
    /// The position the merged file leaves the Cell at (the last input's).
    pub post: Position,
    /// Bytes of the files merged.
    pub input_bytes: u64,
    /// Whether the merged file is smaller than its inputs together.
    pub shrank: bool,
}

impl Compaction {
    /// The merged file as an entry of a chain.
    pub fn chain_file(&self) -> ChainFile<&[u8]> {
        ChainFile {
            ltx: self.ltx.as_slice(),
            post: self.post,
        }
    }
}

/// Merge `chain` (oldest first, contiguous) into one file. Every input is
/// verified in full before anything is written, and each input's recorded
/// TXID must be the one its header names.
pub fn compact(chain: &[ChainFile<&[u8]>]) -> Result<Compaction> {
    let last = chain
        .last()
        .ok_or(Error::Ltx(cellfleet_ltx::Error::EmptyChain))?;
    let mut readers = Vec::with_capacity(chain.len());
    for entry in chain {
        let reader = PageReader::open(Cursor::new(entry.ltx))?;
        let max_txid = reader.header().max_txid;
        if max_txid != entry.post.txid {
            return Err(Error::Recovery(format!(
                "a chain file ends at txid {max_txid} but is recorded at {:?}",
                entry.post
            )));
        }
        readers.push(reader);
    }
    let (ltx, trailer) = cellfleet_ltx::merge(&mut readers, Vec::new())?;
    let header = *cellfleet_ltx::Decoder::new(ltx.as_slice())?.header();
    if header.tracks_checksums() && trailer.post_apply_checksum != last.post.checksum {
        return Err(Error::ChainMismatch {
            txid: header.max_txid,
            expected: last.post,
            found: Position {
                txid: header.max_txid,
                checksum: trailer.post_apply_checksum,
            },
        });
    }
    let input_bytes: u64 = chain.iter().map(|c| c.ltx.len() as u64).sum();
    Ok(Compaction {
        header,
        trailer,
        shrank: (ltx.len() as u64) < input_bytes,
        ltx,
        post: last.post,
        input_bytes,
    })
}
