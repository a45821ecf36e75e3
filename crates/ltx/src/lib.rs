//! The LTX file format, byte-compatible with Litestream 0.5 and LiteFS
//! (`superfly/ltx`): a synchronous library with no async runtime.
//!
//! A file is `header | page frames | page terminator | page index | trailer`.
//! Each committed group of a Cell becomes one file; a chain of files from a
//! snapshot rebuilds the database byte for byte.
//!
//! - [`Encoder`] writes a file page by page (streaming, bounded memory).
//! - [`Decoder`] reads a file front to back and verifies it;
//!   [`PageReader`] reads single pages through the page index.
//! - [`apply`] applies a file to a database file at the right [`Position`];
//!   [`merge`] compacts a contiguous chain into one file.
//! - [`page_checksum`], [`RollingChecksum`] and [`database_checksum`] are the
//!   CRC-64 (Go ISO) checksums the format uses.
//!
//! Every malformed input is a typed [`Error`]; nothing here panics on bad
//! bytes or allocates by a size read from the input before checking it.
//!
//! Checksum tracking: a file either carries database checksums (flags 0,
//! as LiteFS writes them; [`apply`] then checks the pre-apply position and
//! the post-apply result) or sets [`HEADER_FLAG_NO_CHECKSUM`] (as
//! Litestream writes them). Litestream 0.5.17's `restore` refuses files
//! that carry checksums ("post-apply checksum not allowed"), so files meant
//! for Litestream must set the flag; [`apply`] computes the rolling
//! checksum either way and returns it in the new [`Position`], so a caller
//! that keeps checksums elsewhere (an authority root) can still verify.

mod apply;
mod checksum;
mod decoder;
mod encoder;
mod error;
mod frame;
mod header;
mod index;
mod merge;
mod reader;
mod runs;
mod sequence;
mod varint;

pub use apply::apply;
pub use checksum::{database_checksum, page_checksum, Checksum, RollingChecksum, CHECKSUM_FLAG};
pub use decoder::{decode_all, verify, DecodedFile, Decoder};
pub use encoder::{encode_to_vec, Compression, Encoder};
pub use error::{Error, Result};
pub use frame::{PAGE_FLAG_SIZE_PREFIX, PAGE_HEADER_SIZE};
pub use header::{
    lock_pgno, Header, Position, Trailer, Txid, HEADER_FLAG_NO_CHECKSUM, HEADER_SIZE, MAGIC,
    TRAILER_SIZE,
};
pub use index::IndexEntry;
pub use merge::merge;
pub use reader::PageReader;

/// The file name Litestream gives a file covering `min..=max`:
/// `%016x-%016x.ltx`.
pub fn file_name(min_txid: Txid, max_txid: Txid) -> String {
    format!("{:016x}-{:016x}.ltx", min_txid.0, max_txid.0)
}

/// Parse a Litestream file name back into its TXID range.
pub fn parse_file_name(name: &str) -> Option<(Txid, Txid)> {
    let stem = name.strip_suffix(".ltx")?;
    let (min, max) = stem.split_once('-')?;
    if min.len() != 16 || max.len() != 16 {
        return None;
    }
    let min = u64::from_str_radix(min, 16).ok()?;
    let max = u64::from_str_radix(max, 16).ok()?;
    (min >= 1 && max >= min).then_some((Txid(min), Txid(max)))
}
