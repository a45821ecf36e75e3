//! Streaming LTX decoder: reads a whole file front to back, verifying every
//! rule as it goes and the file checksum at the end.
//!
//! No allocation is sized by a number read from the input before that
//! number is checked against a bound derived from the page size or from
//! bytes already read.

use std::io::Read;

use crate::checksum::Crc64;
use crate::encoder::next_snapshot_pgno;
use crate::frame::{
    decode_page_header, decompress_block, eof_as_truncated, max_block_size, read_legacy_frame,
    PAGE_FLAG_SIZE_PREFIX, PAGE_HEADER_SIZE, SIZE_PREFIX_SIZE,
};
use crate::header::{be64, HEADER_SIZE, TRAILER_SIZE};
use crate::index::{decode_index, IndexEntry};
use crate::varint::MAX_VARINT_LEN;
use crate::{lock_pgno, Checksum, Error, Header, Result, RollingChecksum, Trailer, CHECKSUM_FLAG};

/// Reads one LTX file as a stream.
pub struct Decoder<R: Read> {
    reader: R,
    header: Header,
    digest: Crc64,
    offset: u64,
    index: Vec<IndexEntry>,
    last_pgno: u32,
    lock_pgno: u32,
    compressed: Vec<u8>,
    pages_done: bool,
    snapshot_checksum: Option<RollingChecksum>,
}

impl<R: Read> std::fmt::Debug for Decoder<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder")
            .field("header", &self.header)
            .field("pages", &self.index.len())
            .finish()
    }
}

impl<R: Read> Decoder<R> {
    /// Read and validate the header.
    pub fn new(mut reader: R) -> Result<Self> {
        let mut bytes = [0u8; HEADER_SIZE];
        reader.read_exact(&mut bytes).map_err(eof_as_truncated)?;
        let header = Header::decode(&bytes)?;
        let mut digest = Crc64::new();
        digest.update(&bytes);
        let snapshot_checksum =
            (header.is_snapshot() && header.tracks_checksums()).then(RollingChecksum::new);
        Ok(Decoder {
            reader,
            header,
            digest,
            offset: HEADER_SIZE as u64,
            index: Vec::new(),
            last_pgno: 0,
            lock_pgno: lock_pgno(header.page_size),
            compressed: Vec::new(),
            pages_done: false,
            snapshot_checksum,
        })
    }

    /// The file's header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Decode the next page into `page` (resized to the page size) and
    /// return its number, or `None` after the last page.
    pub fn next_page(&mut self, page: &mut Vec<u8>) -> Result<Option<u32>> {
        if self.pages_done {
            return Ok(None);
        }
        let mut page_header = [0u8; PAGE_HEADER_SIZE];
        self.reader
            .read_exact(&mut page_header)
            .map_err(eof_as_truncated)?;
        let (pgno, flags) = decode_page_header(&page_header);
        if pgno == 0 && flags == 0 {
            self.end_of_pages(&page_header)?;
            return Ok(None);
        }
        self.check_page(pgno)?;
        page.resize(self.header.page_size as usize, 0);
        let frame_size = match flags {
            PAGE_FLAG_SIZE_PREFIX => {
                let mut prefix = [0u8; SIZE_PREFIX_SIZE];
                self.reader
                    .read_exact(&mut prefix)
                    .map_err(eof_as_truncated)?;
                let size = u32::from_be_bytes(prefix);
                let max = max_block_size(self.header.page_size);
                if size > max {
                    return Err(Error::FrameTooLarge { size, max });
                }
                self.compressed.resize(size as usize, 0);
                self.reader
                    .read_exact(&mut self.compressed)
                    .map_err(eof_as_truncated)?;
                decompress_block(pgno, &self.compressed, page)?;
                self.digest.update(&page_header);
                self.digest.update(&prefix);
                (PAGE_HEADER_SIZE + SIZE_PREFIX_SIZE) as u64 + u64::from(size)
            }
            0 => {
                let consumed =
                    read_legacy_frame(pgno, &mut self.reader, page, &mut self.compressed)?;
                self.digest.update(&page_header);
                PAGE_HEADER_SIZE as u64 + consumed
            }
            other => return Err(Error::UnsupportedFrameFlags(other)),
        };
        self.digest.update(page);
        if let Some(rolling) = &mut self.snapshot_checksum {
            rolling.add_page(pgno, page);
        }
        self.index.push(IndexEntry {
            pgno,
            offset: self.offset,
            size: frame_size,
        });
        self.offset += frame_size;
        self.last_pgno = pgno;
        Ok(Some(pgno))
    }

    fn check_page(&self, pgno: u32) -> Result<()> {
        if pgno == 0 {
            return Err(Error::ZeroPage);
        }
        if pgno == self.lock_pgno {
            return Err(Error::LockPage(pgno));
        }
        if pgno <= self.last_pgno {
            return Err(Error::PageOutOfOrder {
                pgno,
                previous: self.last_pgno,
            });
        }
        if pgno > self.header.commit {
            return Err(Error::PageBeyondCommit {
                pgno,
                commit: self.header.commit,
            });
        }
        if self.header.is_snapshot() {
            let expected = next_snapshot_pgno(self.last_pgno, self.lock_pgno);
            if pgno != expected {
                return Err(Error::SnapshotMissingPage(expected));
            }
        }
        Ok(())
    }

    fn end_of_pages(&mut self, terminator: &[u8; PAGE_HEADER_SIZE]) -> Result<()> {
        if self.header.is_snapshot() {
            let expected = next_snapshot_pgno(self.last_pgno, self.lock_pgno);
            if expected <= self.header.commit {
                return Err(Error::SnapshotMissingPage(expected));
            }
        }
        self.digest.update(terminator);
        self.pages_done = true;
        Ok(())
    }

    /// Read the rest of the file (skipping any pages not yet read), check
    /// the index against the frames, and verify the trailer and the file
    /// checksum. Returns the trailer.
    pub fn finish(mut self) -> Result<Trailer> {
        let mut page = Vec::new();
        while self.next_page(&mut page)?.is_some() {}
        // The index can be no longer than its entries at their widest
        // encoding; anything more is malformed, so read at most that much
        // (plus one byte to detect trailing data).
        let max_index = self.index.len() * 3 * MAX_VARINT_LEN + 1;
        let limit = (max_index + 8 + TRAILER_SIZE + 1) as u64;
        let mut tail = Vec::new();
        (&mut self.reader).take(limit).read_to_end(&mut tail)?;
        if tail.len() < 1 + 8 + TRAILER_SIZE {
            return Err(Error::Truncated("missing page index or trailer"));
        }
        let trailer_at = tail.len() - TRAILER_SIZE;
        let index_len = be64(&tail[trailer_at - 8..trailer_at]);
        if index_len != (trailer_at - 8) as u64 {
            if tail.len() as u64 == limit {
                return Err(Error::TrailingBytes);
            }
            return Err(Error::BadIndex("index length does not match the file"));
        }
        let entries = decode_index(&tail[..trailer_at - 8])?;
        if entries != self.index {
            return Err(Error::BadIndex("index does not match the page frames"));
        }
        self.digest.update(&tail[..trailer_at + 8]);
        let trailer = Trailer {
            post_apply_checksum: Checksum(be64(&tail[trailer_at..trailer_at + 8])),
            file_checksum: Checksum(be64(&tail[trailer_at + 8..])),
        };
        trailer.validate(&self.header)?;
        let computed = Checksum(self.digest.finalize() | CHECKSUM_FLAG);
        if computed != trailer.file_checksum {
            return Err(Error::FileChecksumMismatch {
                stored: trailer.file_checksum,
                computed,
            });
        }
        if let Some(rolling) = self.snapshot_checksum {
            if rolling.value() != trailer.post_apply_checksum {
                return Err(Error::DatabaseChecksumMismatch {
                    expected: trailer.post_apply_checksum,
                    computed: rolling.value(),
                });
            }
        }
        Ok(trailer)
    }

    /// The page index built from the frames read so far.
    pub fn index(&self) -> &[IndexEntry] {
        &self.index
    }
}

/// A fully decoded file, for tests and small files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodedFile {
    pub header: Header,
    pub pages: Vec<(u32, Vec<u8>)>,
    pub trailer: Trailer,
}

/// Decode and verify a whole file held in memory.
pub fn decode_all(bytes: &[u8]) -> Result<DecodedFile> {
    let mut decoder = Decoder::new(bytes)?;
    let header = *decoder.header();
    let mut pages = Vec::new();
    let mut page = Vec::new();
    while let Some(pgno) = decoder.next_page(&mut page)? {
        pages.push((pgno, std::mem::take(&mut page)));
    }
    let trailer = decoder.finish()?;
    Ok(DecodedFile {
        header,
        pages,
        trailer,
    })
}

/// Read and verify a whole file from a stream without keeping its pages.
pub fn verify(reader: impl Read) -> Result<(Header, Trailer)> {
    let decoder = Decoder::new(reader)?;
    let header = *decoder.header();
    Ok((header, decoder.finish()?))
}
