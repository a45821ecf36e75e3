//! Streaming LTX decoder: reads a whole file front to back, verifying every
//! rule as it goes and the file checksum at the end.
//!
//! No allocation is sized by a number read from the input before that
//! number is checked against a bound derived from the page size or from
//! bytes already read.

use std::io::Read;

use crate::checksum::Crc64;
use crate::frame::{decode_page_header, eof_as_truncated, read_frame_body, PAGE_HEADER_SIZE};
use crate::header::{be64, HEADER_SIZE, TRAILER_SIZE};
use crate::index::{decode_index, IndexEntry};
use crate::sequence::PageSequence;
use crate::varint::MAX_VARINT_LEN;
use crate::{Checksum, Error, Header, Result, RollingChecksum, Trailer, CHECKSUM_FLAG};

/// Reads one LTX file as a stream.
pub struct Decoder<R: Read> {
    reader: R,
    header: Header,
    digest: Crc64,
    offset: u64,
    index: Vec<IndexEntry>,
    sequence: PageSequence,
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
            sequence: PageSequence::new(&header),
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
        self.sequence.push(pgno)?;
        page.resize(self.header.page_size as usize, 0);
        let (prefix, body) =
            read_frame_body(&mut self.reader, pgno, flags, page, &mut self.compressed)?;
        self.digest.update(&page_header);
        if let Some(prefix) = prefix {
            self.digest.update(&prefix);
        }
        let frame_size = PAGE_HEADER_SIZE as u64 + body;
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
        Ok(Some(pgno))
    }

    fn end_of_pages(&mut self, terminator: &[u8; PAGE_HEADER_SIZE]) -> Result<()> {
        self.sequence.finish()?;
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
