//! The 100-byte LTX header and the 16-byte trailer, with their rules.

use std::fmt;

use crate::{Checksum, Error, Result};

/// Size of the encoded header.
pub const HEADER_SIZE: usize = 100;
/// Size of the encoded trailer.
pub const TRAILER_SIZE: usize = 16;
/// `LTX1`.
pub const MAGIC: [u8; 4] = *b"LTX1";
/// Header flag: the file does not track database checksums (Litestream
/// writes its files this way); both database checksums are then zero.
pub const HEADER_FLAG_NO_CHECKSUM: u32 = 0x2;
const KNOWN_FLAGS: u32 = HEADER_FLAG_NO_CHECKSUM;

/// The page that holds SQLite's file locks (byte offset 2^30); it is never
/// stored in an LTX file and never counted in a checksum.
pub fn lock_pgno(page_size: u32) -> u32 {
    0x4000_0000 / page_size + 1
}

pub(crate) fn validate_page_size(page_size: u32) -> Result<()> {
    if !(512..=65536).contains(&page_size) || !page_size.is_power_of_two() {
        return Err(Error::InvalidPageSize(page_size));
    }
    Ok(())
}

/// A transaction id; one per published group of changes. The one TXID type
/// of the workspace: roots, segments and the runtime carry it too, and its
/// serde form is the bare number, so JSON records read `"txid": 5`.
#[derive(
    Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct Txid(pub u64);

impl Txid {
    /// The position of an empty database.
    pub const ZERO: Txid = Txid(0);
    /// The first TXID: a file starting here holds the whole database.
    pub const FIRST: Txid = Txid(1);

    /// The next TXID, or `None` on overflow.
    pub fn next(self) -> Option<Txid> {
        self.0.checked_add(1).map(Txid)
    }
}

/// `txid + n`: `n` TXIDs later (as `u64` addition: it overflows only past
/// `u64::MAX`, which no Cell reaches).
impl std::ops::Add<u64> for Txid {
    type Output = Txid;

    fn add(self, n: u64) -> Txid {
        Txid(self.0 + n)
    }
}

impl fmt::Display for Txid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl fmt::Debug for Txid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Txid({})", self.0)
    }
}

/// A database position: the TXID it is at and its rolling checksum.
/// A file applies only at `(min_txid - 1, pre_apply_checksum)`.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub struct Position {
    pub txid: Txid,
    pub checksum: Checksum,
}

impl Position {
    /// An empty database, before any file.
    pub const EMPTY: Position = Position {
        txid: Txid::ZERO,
        checksum: Checksum::EMPTY,
    };
}

/// The LTX header.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Header {
    pub flags: u32,
    pub page_size: u32,
    /// Database size in pages after applying this file.
    pub commit: u32,
    pub min_txid: Txid,
    pub max_txid: Txid,
    /// Milliseconds since the Unix epoch.
    pub timestamp_ms: i64,
    pub pre_apply_checksum: Checksum,
    pub wal_offset: i64,
    pub wal_size: i64,
    pub wal_salt1: u32,
    pub wal_salt2: u32,
    pub node_id: u64,
}

impl Header {
    /// A header with the given shape and everything else zero.
    pub fn new(page_size: u32, commit: u32, min_txid: Txid, max_txid: Txid) -> Self {
        Header {
            flags: 0,
            page_size,
            commit,
            min_txid,
            max_txid,
            timestamp_ms: 0,
            pre_apply_checksum: Checksum::NONE,
            wal_offset: 0,
            wal_size: 0,
            wal_salt1: 0,
            wal_salt2: 0,
            node_id: 0,
        }
    }

    /// A snapshot holds every page of the database and starts at TXID 1.
    pub fn is_snapshot(&self) -> bool {
        self.min_txid == Txid(1)
    }

    /// Whether the file carries database checksums.
    pub fn tracks_checksums(&self) -> bool {
        self.flags & HEADER_FLAG_NO_CHECKSUM == 0
    }

    /// The position a database must be at for this file to apply.
    pub fn pre_apply_position(&self) -> Position {
        Position {
            txid: Txid(self.min_txid.0 - 1),
            checksum: if self.is_snapshot() {
                Checksum::EMPTY
            } else {
                self.pre_apply_checksum
            },
        }
    }

    /// Check every rule a header must obey.
    pub fn validate(&self) -> Result<()> {
        if self.flags & !KNOWN_FLAGS != 0 {
            return Err(Error::UnsupportedFlags(self.flags));
        }
        validate_page_size(self.page_size)?;
        if self.min_txid.0 == 0 {
            return Err(Error::InvalidHeader("min txid must be at least 1"));
        }
        if self.max_txid < self.min_txid {
            return Err(Error::InvalidHeader("max txid is below min txid"));
        }
        if self.wal_offset < 0 || self.wal_size < 0 {
            return Err(Error::InvalidHeader("negative WAL offset or size"));
        }
        if self.tracks_checksums() {
            if self.is_snapshot() {
                if self.pre_apply_checksum != Checksum::NONE {
                    return Err(Error::InvalidHeader(
                        "snapshot must have a zero pre-apply checksum",
                    ));
                }
            } else if !self.pre_apply_checksum.is_flagged() {
                return Err(Error::InvalidChecksum(self.pre_apply_checksum));
            }
        } else if self.pre_apply_checksum != Checksum::NONE {
            return Err(Error::InvalidHeader(
                "a file without checksum tracking must have a zero pre-apply checksum",
            ));
        }
        Ok(())
    }

    /// Encode into the 100-byte wire form.
    pub fn encode(&self) -> [u8; HEADER_SIZE] {
        let mut b = [0u8; HEADER_SIZE];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..8].copy_from_slice(&self.flags.to_be_bytes());
        b[8..12].copy_from_slice(&self.page_size.to_be_bytes());
        b[12..16].copy_from_slice(&self.commit.to_be_bytes());
        b[16..24].copy_from_slice(&self.min_txid.0.to_be_bytes());
        b[24..32].copy_from_slice(&self.max_txid.0.to_be_bytes());
        b[32..40].copy_from_slice(&self.timestamp_ms.to_be_bytes());
        b[40..48].copy_from_slice(&self.pre_apply_checksum.0.to_be_bytes());
        b[48..56].copy_from_slice(&self.wal_offset.to_be_bytes());
        b[56..64].copy_from_slice(&self.wal_size.to_be_bytes());
        b[64..68].copy_from_slice(&self.wal_salt1.to_be_bytes());
        b[68..72].copy_from_slice(&self.wal_salt2.to_be_bytes());
        b[72..80].copy_from_slice(&self.node_id.to_be_bytes());
        b
    }

    /// Decode and validate the 100-byte wire form.
    pub fn decode(b: &[u8; HEADER_SIZE]) -> Result<Self> {
        let magic = [b[0], b[1], b[2], b[3]];
        if magic != MAGIC {
            return Err(Error::BadMagic(magic));
        }
        let header = Header {
            flags: be32(&b[4..8]),
            page_size: be32(&b[8..12]),
            commit: be32(&b[12..16]),
            min_txid: Txid(be64(&b[16..24])),
            max_txid: Txid(be64(&b[24..32])),
            timestamp_ms: be64(&b[32..40]) as i64,
            pre_apply_checksum: Checksum(be64(&b[40..48])),
            wal_offset: be64(&b[48..56]) as i64,
            wal_size: be64(&b[56..64]) as i64,
            wal_salt1: be32(&b[64..68]),
            wal_salt2: be32(&b[68..72]),
            node_id: be64(&b[72..80]),
        };
        header.validate()?;
        Ok(header)
    }
}

/// The LTX trailer.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Trailer {
    pub post_apply_checksum: Checksum,
    pub file_checksum: Checksum,
}

impl Trailer {
    pub(crate) fn validate(&self, header: &Header) -> Result<()> {
        if header.tracks_checksums() {
            if !self.post_apply_checksum.is_flagged() {
                return Err(Error::InvalidChecksum(self.post_apply_checksum));
            }
        } else if self.post_apply_checksum != Checksum::NONE {
            return Err(Error::InvalidHeader(
                "a file without checksum tracking must have a zero post-apply checksum",
            ));
        }
        if !self.file_checksum.is_flagged() {
            return Err(Error::InvalidChecksum(self.file_checksum));
        }
        Ok(())
    }
}

pub(crate) fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

pub(crate) fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        let mut h = Header::new(4096, 7, Txid(3), Txid(5));
        h.pre_apply_checksum = Checksum(0x8000_0000_0000_1234);
        h.timestamp_ms = 1_700_000_000_000;
        h.node_id = 42;
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
    }

    #[test]
    fn lock_page_for_4k_pages() {
        assert_eq!(lock_pgno(4096), 262_145);
        assert_eq!(lock_pgno(65536), 16_385);
    }

    #[test]
    fn rejects_bad_headers() {
        let h = Header::new(4096, 1, Txid(1), Txid(1));
        let mut b = h.encode();
        b[0] = b'X';
        assert!(matches!(Header::decode(&b), Err(Error::BadMagic(_))));
        let mut b = h.encode();
        b[8..12].copy_from_slice(&1000u32.to_be_bytes());
        assert!(matches!(
            Header::decode(&b),
            Err(Error::InvalidPageSize(1000))
        ));
        let mut b = h.encode();
        b[4..8].copy_from_slice(&1u32.to_be_bytes());
        assert!(matches!(
            Header::decode(&b),
            Err(Error::UnsupportedFlags(1))
        ));
        let delta = Header::new(4096, 1, Txid(2), Txid(2));
        assert!(matches!(
            Header::decode(&delta.encode()),
            Err(Error::InvalidChecksum(_))
        ));
    }
}
