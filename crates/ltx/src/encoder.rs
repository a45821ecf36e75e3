//! Streaming LTX encoder: pages go out as they come, memory stays bounded
//! by one compressed page plus a small index entry per page.

use std::io::Write;

use crate::checksum::Crc64;
use crate::frame::{encode_page_header, max_block_size, PAGE_FLAG_SIZE_PREFIX};
use crate::header::HEADER_SIZE;
use crate::index::IndexEntry;
use crate::sequence::PageSequence;
use crate::{Checksum, Error, Header, Result, RollingChecksum, Trailer, CHECKSUM_FLAG};

/// Writes one LTX file. Pages must arrive in strictly ascending order
/// ([`Error::PageOutOfOrder`] otherwise); use [`encode_to_vec`] to encode
/// pages given in any order.
pub struct Encoder<W: Write> {
    writer: W,
    header: Header,
    digest: Crc64,
    offset: u64,
    index: Vec<IndexEntry>,
    sequence: PageSequence,
    compressed: Vec<u8>,
    compression: Compression,
    /// LZ4's hash table for [`Compression::Lz4`], made on the first page
    /// and reused across pages instead of allocated per page.
    table: Option<lz4_flex::block::CompressTable>,
    /// For snapshots that track checksums: the database checksum of the
    /// pages written, checked against the caller's post-apply checksum.
    snapshot_checksum: Option<RollingChecksum>,
}

impl<W: Write> std::fmt::Debug for Encoder<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoder")
            .field("header", &self.header)
            .field("pages", &self.index.len())
            .finish()
    }
}

/// How an [`Encoder`] compresses pages. Both write ordinary LZ4 blocks that
/// any LTX reader decodes; they trade CPU for bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    /// A full LZ4 search (`lz4_flex`): the smallest files, for files that
    /// stay (merges, compaction, a snapshot that replaces a chain).
    #[default]
    Lz4,
    /// Runs of one byte value only (16 or more), the rest as literals: a
    /// SQLite page's free space shrinks the same, other repeated content
    /// does not, at a fraction of the CPU. For files written on a request's
    /// path that a merge later rewrites.
    Runs,
}

impl<W: Write> Encoder<W> {
    /// Validate `header` and write it; pages get a full LZ4 search
    /// ([`Compression::Lz4`]).
    pub fn new(writer: W, header: Header) -> Result<Self> {
        Self::with_compression(writer, header, Compression::Lz4)
    }

    /// Validate `header` and write it; pages are compressed as `compression`
    /// says.
    pub fn with_compression(
        mut writer: W,
        header: Header,
        compression: Compression,
    ) -> Result<Self> {
        header.validate()?;
        let bytes = header.encode();
        writer.write_all(&bytes)?;
        let mut digest = Crc64::new();
        digest.update(&bytes);
        let snapshot_checksum =
            (header.is_snapshot() && header.tracks_checksums()).then(RollingChecksum::new);
        Ok(Encoder {
            writer,
            header,
            digest,
            offset: HEADER_SIZE as u64,
            index: Vec::new(),
            sequence: PageSequence::new(&header),
            compressed: vec![0; max_block_size(header.page_size) as usize],
            compression,
            table: None,
            snapshot_checksum,
        })
    }

    /// The header being written.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Append one page; `pgno` must be above every page written so far.
    pub fn encode_page(&mut self, pgno: u32, data: &[u8]) -> Result<()> {
        self.check_page(pgno, data)?;
        let size = match self.compression {
            Compression::Lz4 => lz4_flex::block::compress_into_with_table(
                data,
                &mut self.compressed,
                self.table.get_or_insert_with(Default::default),
            )
            .map_err(|_| Error::Usage("compression buffer too small"))?,
            Compression::Runs => crate::runs::compress(data, &mut self.compressed),
        };
        let page_header = encode_page_header(pgno, PAGE_FLAG_SIZE_PREFIX);
        let prefix = (size as u32).to_be_bytes();
        self.writer.write_all(&page_header)?;
        self.writer.write_all(&prefix)?;
        self.writer.write_all(&self.compressed[..size])?;
        self.digest.update(&page_header);
        self.digest.update(&prefix);
        self.digest.update(data);
        if let Some(rolling) = &mut self.snapshot_checksum {
            rolling.add_page(pgno, data);
        }
        let frame_size = (page_header.len() + prefix.len() + size) as u64;
        self.index.push(IndexEntry {
            pgno,
            offset: self.offset,
            size: frame_size,
        });
        self.offset += frame_size;
        Ok(())
    }

    fn check_page(&mut self, pgno: u32, data: &[u8]) -> Result<()> {
        if data.len() != self.header.page_size as usize {
            return Err(Error::PageSizeMismatch {
                expected: self.header.page_size as usize,
                actual: data.len(),
            });
        }
        self.sequence.push(pgno)
    }

    /// Write the end of the pages, the page index and the trailer.
    /// `post_apply_checksum` is the database checksum after applying the
    /// file (ignored, written as zero, when the header opts out of checksum
    /// tracking).
    pub fn finish(mut self, post_apply_checksum: Checksum) -> Result<(W, Trailer)> {
        self.sequence.finish()?;
        let post_apply_checksum = if self.header.tracks_checksums() {
            if !post_apply_checksum.is_flagged() {
                return Err(Error::InvalidChecksum(post_apply_checksum));
            }
            if let Some(rolling) = self.snapshot_checksum {
                if rolling.value() != post_apply_checksum {
                    return Err(Error::DatabaseChecksumMismatch {
                        expected: post_apply_checksum,
                        computed: rolling.value(),
                    });
                }
            }
            post_apply_checksum
        } else {
            Checksum::NONE
        };
        let terminator = [0u8; crate::frame::PAGE_HEADER_SIZE];
        self.writer.write_all(&terminator)?;
        self.digest.update(&terminator);
        let index = crate::index::encode_index(&self.index);
        self.writer.write_all(&index)?;
        self.digest.update(&index);
        let post = post_apply_checksum.0.to_be_bytes();
        self.digest.update(&post);
        let file_checksum = Checksum(self.digest.finalize() | CHECKSUM_FLAG);
        self.writer.write_all(&post)?;
        self.writer.write_all(&file_checksum.0.to_be_bytes())?;
        self.writer.flush()?;
        Ok((
            self.writer,
            Trailer {
                post_apply_checksum,
                file_checksum,
            },
        ))
    }
}

/// Encode a whole file from pages given in any order: they are sorted, and
/// a page given twice is rejected ([`Error::PageOutOfOrder`]).
pub fn encode_to_vec(
    header: Header,
    pages: &mut [(u32, &[u8])],
    post_apply_checksum: Checksum,
) -> Result<(Vec<u8>, Trailer)> {
    pages.sort_unstable_by_key(|(pgno, _)| *pgno);
    let mut encoder = Encoder::new(Vec::new(), header)?;
    for (pgno, data) in pages.iter() {
        encoder.encode_page(*pgno, data)?;
    }
    encoder.finish(post_apply_checksum)
}
