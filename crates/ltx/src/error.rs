//! Typed errors for every way an LTX file or its use can be wrong.

use crate::{Checksum, Txid};

/// An error reading, writing, merging or applying LTX files.
///
/// Every malformed input maps to a variant here; the decoder never panics
/// on untrusted bytes.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    #[error("file is truncated: {0}")]
    Truncated(&'static str),
    #[error("bad magic {0:?}: not an LTX file")]
    BadMagic([u8; 4]),
    #[error("unsupported header flags {0:#x}")]
    UnsupportedFlags(u32),
    #[error("invalid page size {0}: must be a power of two in 512..=65536")]
    InvalidPageSize(u32),
    #[error("invalid header: {0}")]
    InvalidHeader(&'static str),
    #[error("page {pgno} out of order: previous page was {previous}")]
    PageOutOfOrder { pgno: u32, previous: u32 },
    #[error("page {pgno} is beyond the commit size of {commit} pages")]
    PageBeyondCommit { pgno: u32, commit: u32 },
    #[error("page {0} is the lock page and must never be stored")]
    LockPage(u32),
    #[error("page number 0 is invalid")]
    ZeroPage,
    #[error("snapshot is missing page {0}")]
    SnapshotMissingPage(u32),
    #[error("page data is {actual} bytes, expected the page size of {expected}")]
    PageSizeMismatch { expected: usize, actual: usize },
    #[error("unknown page frame flags {0:#x}")]
    UnsupportedFrameFlags(u16),
    #[error("compressed frame of {size} bytes exceeds the bound of {max} for this page size")]
    FrameTooLarge { size: u32, max: u32 },
    #[error("page {pgno} does not decompress: {reason}")]
    Decompress { pgno: u32, reason: String },
    #[error("bad page index: {0}")]
    BadIndex(&'static str),
    #[error("file checksum mismatch: stored {stored}, computed {computed}")]
    FileChecksumMismatch {
        stored: Checksum,
        computed: Checksum,
    },
    #[error("database checksum mismatch: expected {expected}, computed {computed}")]
    DatabaseChecksumMismatch {
        expected: Checksum,
        computed: Checksum,
    },
    #[error("invalid checksum {0}: stored checksums must have bit 63 set")]
    InvalidChecksum(Checksum),
    #[error("trailing bytes after the trailer")]
    TrailingBytes,
    #[error(
        "position mismatch: file applies at txid {expected_txid} checksum {expected_checksum}, \
         database is at txid {actual_txid} checksum {actual_checksum}"
    )]
    PositionMismatch {
        expected_txid: Txid,
        expected_checksum: Checksum,
        actual_txid: Txid,
        actual_checksum: Checksum,
    },
    #[error(
        "chain is not contiguous: file ends at txid {previous_max}, next starts at {next_min}"
    )]
    NotContiguous { previous_max: Txid, next_min: Txid },
    #[error("files disagree on {0}")]
    Incompatible(&'static str),
    #[error("nothing to merge")]
    EmptyChain,
    #[error("database file of {len} bytes is not a whole number of {page_size}-byte pages")]
    RaggedDatabase { len: u64, page_size: u32 },
    #[error("encoder misuse: {0}")]
    Usage(&'static str),
}

impl Error {
    /// Whether the same operation may succeed if tried again: only I/O
    /// errors may be transient; a malformed file stays malformed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Io(e) if e.kind() != std::io::ErrorKind::UnexpectedEof)
    }
}

/// Shorthand for results in this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
