//! The page index at the end of a file: (pgno, offset, frame size) per page
//! as varints, a zero terminator, and the index length as a u64.

use crate::varint::{put_uvarint, uvarint};
use crate::{Error, Result};

/// Where one page's frame lives in the file.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct IndexEntry {
    pub pgno: u32,
    /// Absolute offset of the frame from the start of the file.
    pub offset: u64,
    /// Frame size: page header, size prefix and compressed payload.
    pub size: u64,
}

/// Encode the index including its terminator and length field.
pub(crate) fn encode_index(entries: &[IndexEntry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * 8 + 9);
    for entry in entries {
        put_uvarint(&mut out, u64::from(entry.pgno));
        put_uvarint(&mut out, entry.offset);
        put_uvarint(&mut out, entry.size);
    }
    put_uvarint(&mut out, 0);
    let len = out.len() as u64;
    out.extend_from_slice(&len.to_be_bytes());
    out
}

/// Decode index varints (without the trailing length field) up to and
/// including the terminator, which must end `bytes` exactly.
pub(crate) fn decode_index(bytes: &[u8]) -> Result<Vec<IndexEntry>> {
    let mut entries = Vec::new();
    let mut at = 0;
    loop {
        let (pgno, n) = uvarint(&bytes[at..])?;
        at += n;
        if pgno == 0 {
            break;
        }
        let pgno = u32::try_from(pgno).map_err(|_| Error::BadIndex("page number over u32"))?;
        let (offset, n) = uvarint(&bytes[at..])?;
        at += n;
        let (size, n) = uvarint(&bytes[at..])?;
        at += n;
        entries.push(IndexEntry { pgno, offset, size });
    }
    if at != bytes.len() {
        return Err(Error::BadIndex("bytes after the index terminator"));
    }
    Ok(entries)
}
