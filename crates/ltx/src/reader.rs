//! Random access to single pages through the page index: read the header
//! and the end of the file, then fetch any page by number. This is what an
//! S3 range read needs.

use std::io::{Read, Seek, SeekFrom};

use crate::frame::{
    decode_page_header, eof_as_truncated, max_block_size, read_frame_body, PAGE_HEADER_SIZE,
    SIZE_PREFIX_SIZE,
};
use crate::header::{be64, HEADER_SIZE, TRAILER_SIZE};
use crate::index::{decode_index, IndexEntry};
use crate::{Checksum, Error, Header, Result, Trailer};

/// An LTX file opened for random page access.
///
/// Opening checks the header, the trailer's form and that the index
/// describes contiguous frames inside the file; it does not read the pages,
/// so it cannot check the file checksum: use [`PageReader::verify`] (or
/// [`crate::verify`]) for that.
#[derive(Debug)]
pub struct PageReader<R: Read + Seek> {
    reader: R,
    header: Header,
    trailer: Trailer,
    index: Vec<IndexEntry>,
    compressed: Vec<u8>,
}

impl<R: Read + Seek> PageReader<R> {
    /// Open a file: header, trailer and page index.
    pub fn open(mut reader: R) -> Result<Self> {
        let file_len = reader.seek(SeekFrom::End(0))?;
        let min_len = (HEADER_SIZE + PAGE_HEADER_SIZE + 1 + 8 + TRAILER_SIZE) as u64;
        if file_len < min_len {
            return Err(Error::Truncated("file is shorter than an empty LTX file"));
        }
        reader.seek(SeekFrom::Start(0))?;
        let mut bytes = [0u8; HEADER_SIZE];
        reader.read_exact(&mut bytes).map_err(eof_as_truncated)?;
        let header = Header::decode(&bytes)?;

        let mut end = [0u8; 8 + TRAILER_SIZE];
        reader.seek(SeekFrom::Start(file_len - end.len() as u64))?;
        reader.read_exact(&mut end).map_err(eof_as_truncated)?;
        let index_len = be64(&end[..8]);
        let trailer = Trailer {
            post_apply_checksum: Checksum(be64(&end[8..16])),
            file_checksum: Checksum(be64(&end[16..24])),
        };
        trailer.validate(&header)?;
        if index_len == 0 || index_len > file_len - min_len + 1 {
            return Err(Error::BadIndex("index length outside the file"));
        }
        let index_start = file_len - end.len() as u64 - index_len;
        let mut index_bytes = vec![0u8; index_len as usize];
        reader.seek(SeekFrom::Start(index_start))?;
        reader
            .read_exact(&mut index_bytes)
            .map_err(eof_as_truncated)?;
        let index = decode_index(&index_bytes)?;
        check_index(&header, &index, index_start - PAGE_HEADER_SIZE as u64)?;
        Ok(PageReader {
            reader,
            header,
            trailer,
            index,
            compressed: Vec::new(),
        })
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    pub fn trailer(&self) -> &Trailer {
        &self.trailer
    }

    /// The page index, in ascending page order.
    pub fn index(&self) -> &[IndexEntry] {
        &self.index
    }

    /// Read page `pgno` into `page`; `false` if the file does not hold it.
    pub fn read_page(&mut self, pgno: u32, page: &mut Vec<u8>) -> Result<bool> {
        let Ok(at) = self.index.binary_search_by_key(&pgno, |e| e.pgno) else {
            return Ok(false);
        };
        self.read_entry(at, page)?;
        Ok(true)
    }

    /// Read the page at position `at` of the index into `page`.
    pub fn read_entry(&mut self, at: usize, page: &mut Vec<u8>) -> Result<u32> {
        let entry = self.index[at];
        page.resize(self.header.page_size as usize, 0);
        self.reader.seek(SeekFrom::Start(entry.offset))?;
        let mut page_header = [0u8; PAGE_HEADER_SIZE];
        self.reader
            .read_exact(&mut page_header)
            .map_err(eof_as_truncated)?;
        let (pgno, flags) = decode_page_header(&page_header);
        if pgno != entry.pgno {
            return Err(Error::BadIndex("index entry points at another page"));
        }
        let (_, body) = read_frame_body(&mut self.reader, pgno, flags, page, &mut self.compressed)?;
        if PAGE_HEADER_SIZE as u64 + body != entry.size {
            return Err(Error::BadIndex("frame size differs from the index"));
        }
        Ok(pgno)
    }

    /// Stream the whole file and verify it, including the file checksum.
    pub fn verify(&mut self) -> Result<()> {
        self.reader.seek(SeekFrom::Start(0))?;
        let (_, trailer) = crate::verify(&mut self.reader)?;
        if trailer != self.trailer {
            return Err(Error::BadIndex("trailer changed while reading"));
        }
        Ok(())
    }

    /// Give back the underlying reader.
    pub fn into_inner(self) -> R {
        self.reader
    }
}

/// The index must describe ascending pages in contiguous frames that start
/// right after the header and end at the page terminator.
fn check_index(header: &Header, index: &[IndexEntry], frames_end: u64) -> Result<()> {
    let max_frame =
        u64::from(max_block_size(header.page_size)) + (PAGE_HEADER_SIZE + SIZE_PREFIX_SIZE) as u64;
    let mut expected_offset = HEADER_SIZE as u64;
    let mut last = 0u32;
    for entry in index {
        if entry.pgno <= last || entry.pgno > header.commit {
            return Err(Error::BadIndex("pages out of order or beyond commit"));
        }
        if entry.offset != expected_offset {
            return Err(Error::BadIndex("frames are not contiguous"));
        }
        if entry.size < PAGE_HEADER_SIZE as u64 || entry.size > max_frame * 2 {
            return Err(Error::BadIndex("frame size out of bounds"));
        }
        expected_offset = entry
            .offset
            .checked_add(entry.size)
            .ok_or(Error::BadIndex("frame offset overflows"))?;
        last = entry.pgno;
    }
    if expected_offset != frames_end {
        return Err(Error::BadIndex("index points outside the page frames"));
    }
    Ok(())
}
