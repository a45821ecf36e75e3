//! CRC-64 (Go's `crc64.ISO`) checksums: page, rolling database and file.
//!
//! Every stored checksum has bit 63 set ([`CHECKSUM_FLAG`]), which lets a
//! reader tell "no checksum" (0) from any real value.

use std::fmt;
use std::io::Read;

use crate::{lock_pgno, Error, Result};

/// Bit 63, set on every stored checksum.
pub const CHECKSUM_FLAG: u64 = 1 << 63;

/// A streaming CRC-64/GO-ISO (SIMD-accelerated where the CPU allows).
#[derive(Clone)]
pub(crate) struct Crc64(crc_fast::Digest);

impl Crc64 {
    pub(crate) fn new() -> Self {
        Crc64(crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc64GoIso))
    }

    pub(crate) fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    pub(crate) fn finalize(&self) -> u64 {
        self.0.finalize()
    }
}

/// A CRC-64 checksum as stored in LTX files.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Checksum(pub u64);

impl Checksum {
    /// The rolling checksum of an empty database.
    pub const EMPTY: Checksum = Checksum(CHECKSUM_FLAG);
    /// The value written when checksums are not tracked.
    pub const NONE: Checksum = Checksum(0);

    /// Whether bit 63 is set, as every real stored checksum must have.
    pub fn is_flagged(self) -> bool {
        self.0 & CHECKSUM_FLAG != 0
    }
}

impl fmt::Display for Checksum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl fmt::Debug for Checksum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Checksum({:016x})", self.0)
    }
}

/// `crc64(be32(pgno) || data)` with bit 63 set.
pub fn page_checksum(pgno: u32, data: &[u8]) -> Checksum {
    let mut digest = Crc64::new();
    digest.update(&pgno.to_be_bytes());
    digest.update(data);
    Checksum(digest.finalize() | CHECKSUM_FLAG)
}

/// The database checksum: XOR of every page checksum (lock page excluded),
/// updated incrementally as pages change, grow or are truncated away.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct RollingChecksum {
    value: u64,
}

impl Default for RollingChecksum {
    fn default() -> Self {
        Self::new()
    }
}

impl RollingChecksum {
    /// The checksum of an empty database.
    pub fn new() -> Self {
        Self {
            value: CHECKSUM_FLAG,
        }
    }

    /// Continue from a stored database checksum.
    pub fn from_checksum(checksum: Checksum) -> Self {
        Self { value: checksum.0 }
    }

    /// A page that did not exist before (growth).
    pub fn add_page(&mut self, pgno: u32, data: &[u8]) {
        self.value ^= page_checksum(pgno, data).0;
    }

    /// A page that no longer exists (truncation).
    pub fn remove_page(&mut self, pgno: u32, data: &[u8]) {
        self.value ^= page_checksum(pgno, data).0;
    }

    /// A page whose contents changed from `old` to `new`.
    pub fn replace_page(&mut self, pgno: u32, old: &[u8], new: &[u8]) {
        self.value ^= page_checksum(pgno, old).0 ^ page_checksum(pgno, new).0;
    }

    /// XOR a precomputed page checksum in or out.
    pub fn toggle(&mut self, page: Checksum) {
        self.value ^= page.0;
    }

    /// The current database checksum, with bit 63 set.
    pub fn value(&self) -> Checksum {
        Checksum(self.value | CHECKSUM_FLAG)
    }
}

/// The rolling checksum of a whole database file, read from `reader`.
/// The lock page is skipped; a length that is not a whole number of pages
/// is an error.
pub fn database_checksum(mut reader: impl Read, page_size: u32) -> Result<Checksum> {
    crate::header::validate_page_size(page_size)?;
    let lock = lock_pgno(page_size);
    let mut rolling = RollingChecksum::new();
    let mut page = vec![0u8; page_size as usize];
    let mut pgno: u32 = 0;
    loop {
        let filled = read_full(&mut reader, &mut page)?;
        if filled == 0 {
            break;
        }
        if filled != page.len() {
            return Err(Error::RaggedDatabase {
                len: u64::from(pgno) * u64::from(page_size) + filled as u64,
                page_size,
            });
        }
        pgno = pgno
            .checked_add(1)
            .ok_or(Error::InvalidHeader("database has more than 2^32 pages"))?;
        if pgno != lock {
            rolling.add_page(pgno, &page);
        }
    }
    Ok(rolling.value())
}

/// Read until `buf` is full or the reader ends; returns the bytes read.
pub(crate) fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_matches_go_iso_check_value() {
        // The catalogue check value of CRC-64/GO-ISO for "123456789".
        let mut digest = Crc64::new();
        digest.update(b"1234");
        digest.update(b"56789");
        assert_eq!(digest.finalize(), 0xb909_56c7_75a4_1001);
    }

    #[test]
    fn empty_database_checksum_is_the_flag() {
        assert_eq!(database_checksum(&[][..], 4096).unwrap(), Checksum::EMPTY);
    }

    #[test]
    fn incremental_update_equals_recomputation() {
        let mut db = vec![0u8; 4096 * 3];
        db[10] = 1;
        db[5000] = 2;
        let before = database_checksum(&db[..], 4096).unwrap();
        let old_page2 = db[4096..8192].to_vec();
        db[4100] = 9;
        let mut rolling = RollingChecksum::from_checksum(before);
        rolling.replace_page(2, &old_page2, &db[4096..8192]);
        assert_eq!(rolling.value(), database_checksum(&db[..], 4096).unwrap());
    }

    #[test]
    fn ragged_database_is_rejected() {
        let db = vec![0u8; 4096 + 1];
        assert!(matches!(
            database_checksum(&db[..], 4096),
            Err(Error::RaggedDatabase { .. })
        ));
    }
}
