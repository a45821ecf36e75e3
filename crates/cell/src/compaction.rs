//! Compaction: merge a contiguous chain of LTX files into one. State, TXID
//! and checksum do not change; only the representation does.
//!
//! Policy: a merged file that is not smaller than the files it replaces
//! gains nothing, so [`Compaction::shrank`] is false and the caller should
//! publish a fresh snapshot ([`crate::Cell::snapshot`]) in its place when
//! the chain starts at a snapshot, or keep the chain as it is.

use std::io::Cursor;

use cellfleet_ltx::{Header, PageReader, Trailer};

use crate::{Error, Result};

/// A merged chain.
#[derive(Debug, Clone)]
pub struct Compaction {
    pub header: Header,
    pub trailer: Trailer,
    pub ltx: Vec<u8>,
    /// Bytes of the files merged.
    pub input_bytes: u64,
    /// Whether the merged file is smaller than its inputs together.
    pub shrank: bool,
}

/// Merge `chain` (oldest first, contiguous) into one file. Every input is
/// verified in full before anything is written.
pub fn compact(chain: &[&[u8]]) -> Result<Compaction> {
    if chain.is_empty() {
        return Err(Error::Ltx(cellfleet_ltx::Error::EmptyChain));
    }
    let mut readers = chain
        .iter()
        .map(|bytes| PageReader::open(Cursor::new(*bytes)))
        .collect::<cellfleet_ltx::Result<Vec<_>>>()?;
    let (ltx, trailer) = cellfleet_ltx::merge(&mut readers, Vec::new())?;
    let header = *cellfleet_ltx::Decoder::new(ltx.as_slice())?.header();
    let input_bytes: u64 = chain.iter().map(|c| c.len() as u64).sum();
    Ok(Compaction {
        header,
        trailer,
        shrank: (ltx.len() as u64) < input_bytes,
        ltx,
        input_bytes,
    })
}
