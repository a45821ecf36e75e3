//! Capture: turn the WAL frames of one committed transaction into one LTX
//! file, keeping the rolling database checksum exact.
//!
//! The engine keeps a checksum per page of the captured state, so a
//! changed page costs two CRCs and an XOR (`old` out, `new` in) and no read
//! of the old page. Pages above a shrunken commit are XOR-ed out; pages
//! between the old and new commit that no frame wrote read back as zeros
//! and are XOR-ed in as such. Every capture records an [`Undo`] so an
//! aborted publication restores the previous state exactly.
//!
//! A delta whose page bytes exceed the configured bound is written as a
//! snapshot instead (TXIDs `1..=txid`), read from the database file plus the
//! latest WAL frame of each page.
//!
//! Files are written as Litestream writes them by default: header flag
//! [`HEADER_FLAG_NO_CHECKSUM`] and zero database checksums, because
//! Litestream 0.5.17's `restore` refuses files that carry them. The engine
//! still computes the rolling checksum exactly and returns it in
//! [`Publication::pre`]/[`Publication::post`]; the caller keeps it (in the
//! authority root) and hands it back to [`crate::recover`], which checks
//! every step. With `checksums_in_file` the files carry the checksums too
//! (flags 0, as LiteFS writes them).
//!
//! A group's pages are compressed as [`Compression::Runs`]: its file is
//! written on its commands' path, and the merges that outlast it
//! (checkpoints, compaction) compress it fully again. A snapshot that
//! replaces a chain ([`crate::Cell::snapshot`]) stays, so it gets the full
//! search ([`Compression::Lz4`]).

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::os::unix::fs::FileExt;
use std::path::Path;

use cellfleet_ltx::{
    lock_pgno, page_checksum, Checksum, Compression, Encoder, Header, Position, Trailer, Txid,
    HEADER_FLAG_NO_CHECKSUM,
};

use crate::wal::{Committed, WalCursor};
use crate::Result;

/// The captured state: what the last captured transaction left.
#[derive(Debug, Clone)]
pub(crate) struct CaptureState {
    pub page_size: u32,
    pub commit: u32,
    pub checksum: Checksum,
    /// Checksum of each page `1..=commit` (index `pgno - 1`); 0 for the lock page.
    pub page_checksums: Vec<u64>,
    pub cursor: WalCursor,
    /// Offset in the WAL of the latest committed frame of each page not yet
    /// checkpointed into the database file.
    pub wal_offsets: HashMap<u32, u64>,
    /// Write database checksums into the files (flags 0) instead of the
    /// Litestream form (flag `0x2`, zero checksums).
    pub checksums_in_file: bool,
}

/// How to put one capture back (cloned to describe an earlier state
/// without leaving the current one, see [`crate::Cell::snapshot`]).
#[derive(Debug, Clone)]
pub(crate) struct Undo {
    commit: u32,
    checksum: Checksum,
    cursor: WalCursor,
    page_checksums: Vec<(u32, u64)>,
    checksums_len: usize,
    wal_offsets: Vec<(u32, Option<u64>)>,
    wal_offsets_before_restart: Option<HashMap<u32, u64>>,
}

/// One captured transaction as an LTX file.
#[derive(Debug, Clone)]
pub struct Publication {
    /// The TXID this publication brings the Cell to.
    pub txid: Txid,
    /// Where the chain must be for this file to apply.
    pub pre: Position,
    /// Where it leaves the Cell.
    pub post: Position,
    pub header: Header,
    pub trailer: Trailer,
    /// The encoded LTX file.
    pub ltx: Vec<u8>,
}

impl Publication {
    /// Whether the file is a snapshot (replaces the whole chain).
    pub fn is_snapshot(&self) -> bool {
        self.header.is_snapshot()
    }

    /// This file as an entry of a chain to [`crate::recover`] or
    /// [`crate::compact`].
    pub fn chain_file(&self) -> crate::ChainFile<&[u8]> {
        crate::ChainFile {
            ltx: self.ltx.as_slice(),
            post: self.post,
        }
    }
}

impl CaptureState {
    /// The state of a database file with no WAL frames pending.
    pub(crate) fn from_database(
        db_path: &Path,
        page_size: u32,
        checksums_in_file: bool,
    ) -> Result<CaptureState> {
        let mut state = CaptureState {
            checksums_in_file,
            page_size,
            commit: 0,
            checksum: Checksum::EMPTY,
            page_checksums: Vec::new(),
            cursor: WalCursor::default(),
            wal_offsets: HashMap::new(),
        };
        let file = match File::open(db_path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(state),
            Err(e) => return Err(e.into()),
        };
        let len = file.metadata()?.len();
        if len % u64::from(page_size) != 0 {
            return Err(cellfleet_ltx::Error::RaggedDatabase { len, page_size }.into());
        }
        // Pages are read in order: a buffer makes that a few large reads,
        // not one system call per page.
        let mut file = BufReader::with_capacity(READ_CHUNK_BYTES, file);
        let lock = lock_pgno(page_size);
        let mut page = vec![0u8; page_size as usize];
        let mut rolling = Checksum::EMPTY.0;
        for pgno in 1..=(len / u64::from(page_size)) as u32 {
            file.read_exact(&mut page)?;
            let sum = if pgno == lock {
                0
            } else {
                page_checksum(pgno, &page).0
            };
            rolling ^= sum;
            state.page_checksums.push(sum);
        }
        state.commit = state.page_checksums.len() as u32;
        state.checksum = Checksum(rolling | cellfleet_ltx::CHECKSUM_FLAG);
        Ok(state)
    }

    /// Fold the committed frames into the state; returns the undo record.
    pub(crate) fn apply(&mut self, committed: &Committed<'_>) -> Undo {
        let lock = lock_pgno(self.page_size);
        let mut undo = Undo {
            commit: self.commit,
            checksum: self.checksum,
            cursor: self.cursor,
            page_checksums: Vec::new(),
            checksums_len: self.page_checksums.len(),
            wal_offsets: Vec::new(),
            wal_offsets_before_restart: None,
        };
        if committed.restarted && !self.wal_offsets.is_empty() {
            // A restart means every earlier frame is in the database file.
            undo.wal_offsets_before_restart = Some(std::mem::take(&mut self.wal_offsets));
        }
        let mut rolling = self.checksum.0;
        let new_commit = committed.commit;
        // Shrink: pages above the new commit leave the checksum.
        if new_commit < self.commit {
            for pgno in new_commit + 1..=self.commit {
                let sum = self.page_checksums[pgno as usize - 1];
                rolling ^= sum;
            }
            for pgno in new_commit + 1..=self.commit {
                undo.page_checksums
                    .push((pgno, self.page_checksums[pgno as usize - 1]));
            }
            self.page_checksums.truncate(new_commit as usize);
        }
        // Growth: new pages start as zeros until a frame writes them.
        if new_commit > self.commit {
            let zero = vec![0u8; self.page_size as usize];
            for pgno in self.commit + 1..=new_commit {
                let sum = if pgno == lock {
                    0
                } else {
                    page_checksum(pgno, &zero).0
                };
                rolling ^= sum;
                self.page_checksums.push(sum);
            }
        }
        for (pgno, data) in committed.pages_through(new_commit) {
            if pgno == lock {
                continue;
            }
            let slot = &mut self.page_checksums[pgno as usize - 1];
            let new = page_checksum(pgno, data).0;
            undo.page_checksums.push((pgno, *slot));
            rolling ^= *slot ^ new;
            *slot = new;
        }
        for (pgno, offset) in committed.wal_offsets() {
            undo.wal_offsets
                .push((pgno, self.wal_offsets.insert(pgno, offset)));
        }
        self.commit = new_commit;
        self.checksum = Checksum(rolling | cellfleet_ltx::CHECKSUM_FLAG);
        self.cursor = committed.cursor;
        undo
    }

    /// Put back the state from before the capture that returned `undo`.
    pub(crate) fn undo(&mut self, undo: Undo) {
        for (pgno, previous) in undo.wal_offsets.into_iter().rev() {
            match previous {
                Some(offset) => self.wal_offsets.insert(pgno, offset),
                None => self.wal_offsets.remove(&pgno),
            };
        }
        if let Some(before) = undo.wal_offsets_before_restart {
            self.wal_offsets = before;
        }
        self.page_checksums.resize(undo.checksums_len, 0);
        for (pgno, sum) in undo.page_checksums.into_iter().rev() {
            // Pages that only existed after the capture are gone already.
            if let Some(slot) = self.page_checksums.get_mut(pgno as usize - 1) {
                *slot = sum;
            }
        }
        self.commit = undo.commit;
        self.checksum = undo.checksum;
        self.cursor = undo.cursor;
    }

    /// After a checkpoint that truncated the WAL.
    pub(crate) fn checkpointed(&mut self) {
        self.cursor = WalCursor::default();
        self.wal_offsets.clear();
    }

    /// A header of the configured checksum mode for the captured state.
    fn header(&self, min_txid: Txid, max_txid: Txid, timestamp_ms: i64) -> Header {
        let mut header = Header::new(self.page_size, self.commit, min_txid, max_txid);
        header.timestamp_ms = timestamp_ms;
        if !self.checksums_in_file {
            header.flags = HEADER_FLAG_NO_CHECKSUM;
        }
        header
    }

    /// Encode the captured transaction: a delta of its pages, or a snapshot
    /// when the delta is bigger than `snapshot_delta_bytes` or starts the
    /// chain (TXID 1).
    pub(crate) fn encode(
        &self,
        committed: &Committed<'_>,
        pre: Position,
        txid: Txid,
        timestamp_ms: i64,
        snapshot_delta_bytes: u64,
        files: &Files<'_>,
    ) -> Result<Publication> {
        let delta_bytes = committed.page_count() as u64 * u64::from(self.page_size);
        let post = Position {
            txid,
            checksum: self.checksum,
        };
        if txid == Txid(1) || delta_bytes > snapshot_delta_bytes {
            return self.snapshot(post, timestamp_ms, files, Compression::Runs);
        }
        let mut header = self.header(txid, txid, timestamp_ms);
        if self.checksums_in_file {
            header.pre_apply_checksum = pre.checksum;
        }
        header.wal_offset = committed.start_offset as i64;
        header.wal_size = (committed.cursor.offset - committed.start_offset) as i64;
        header.wal_salt1 = committed.cursor.salt1;
        header.wal_salt2 = committed.cursor.salt2;
        let lock = lock_pgno(self.page_size);
        let mut encoder = Encoder::with_compression(
            Vec::with_capacity(encoded_bound(committed.page_count(), self.page_size)),
            header,
            Compression::Runs,
        )?;
        for (pgno, data) in committed.pages_through(self.commit) {
            if pgno != lock {
                encoder.encode_page(pgno, data)?;
            }
        }
        let (ltx, trailer) = encoder.finish(self.checksum)?;
        let ltx = fitted(ltx);
        Ok(Publication {
            txid,
            pre,
            post,
            header,
            trailer,
            ltx,
        })
    }

    /// A snapshot of the captured state at `post`.
    pub(crate) fn snapshot(
        &self,
        post: Position,
        timestamp_ms: i64,
        files: &Files<'_>,
        compression: Compression,
    ) -> Result<Publication> {
        let header = self.header(Txid(1), post.txid, timestamp_ms);
        let lock = lock_pgno(self.page_size);
        let db = match File::open(files.db) {
            Ok(f) => Some(f),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e.into()),
        };
        let db_len = match &db {
            Some(f) => f.metadata()?.len(),
            None => 0,
        };
        let wal = if self.wal_offsets.is_empty() {
            None
        } else {
            Some(File::open(files.wal)?)
        };
        let mut encoder = Encoder::with_compression(Vec::new(), header, compression)?;
        let page_size = self.page_size as usize;
        let mut page = vec![0u8; page_size];
        // The database's pages in chunks: a new Cell's whole file is one
        // read (positioned reads, no seek between them).
        let mut chunk = Chunk::default();
        for pgno in 1..=self.commit {
            if pgno == lock {
                continue;
            }
            let offset = u64::from(pgno - 1) * u64::from(self.page_size);
            match (self.wal_offsets.get(&pgno), wal.as_ref(), db.as_ref()) {
                (Some(&at), Some(wal), _) => wal.read_exact_at(&mut page, at)?,
                (None, _, Some(db)) if offset < db_len => {
                    let bytes = chunk.page(db, db_len, offset, page_size)?;
                    page.copy_from_slice(bytes);
                }
                _ => page.fill(0),
            }
            encoder.encode_page(pgno, &page)?;
        }
        let (ltx, trailer) = encoder.finish(self.checksum)?;
        // A new Cell's first record, kept like any other.
        let ltx = fitted(ltx);
        Ok(Publication {
            txid: post.txid,
            pre: Position {
                txid: Txid::ZERO,
                checksum: Checksum::EMPTY,
            },
            post,
            header,
            trailer,
            ltx,
        })
    }
}

/// The most bytes of a database file read in one system call while its
/// pages are read in order.
const READ_CHUNK_BYTES: usize = 64 * 1024;

/// A window of a database file read at once, for pages read in order.
#[derive(Default)]
struct Chunk {
    bytes: Vec<u8>,
    at: u64,
}

impl Chunk {
    /// The page of `page_size` bytes at `offset` (a page boundary, below
    /// `len`, the file's length), reading the next chunk from `file` when
    /// the window does not hold it.
    fn page(
        &mut self,
        file: &File,
        len: u64,
        offset: u64,
        page_size: usize,
    ) -> std::io::Result<&[u8]> {
        let held =
            offset >= self.at && offset + page_size as u64 <= self.at + self.bytes.len() as u64;
        if !held {
            // At least the page: a file that ends inside it fails the
            // read, as a page read alone would.
            let want = (len - offset)
                .min(READ_CHUNK_BYTES as u64)
                .max(page_size as u64) as usize;
            self.bytes.resize(want, 0);
            file.read_exact_at(&mut self.bytes, offset)?;
            self.at = offset;
        }
        let start = (offset - self.at) as usize;
        Ok(&self.bytes[start..start + page_size])
    }
}

/// The database and WAL paths of a Cell.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Files<'a> {
    pub db: &'a Path,
    pub wal: &'a Path,
}

/// Room for an LTX file of `pages` pages of `page_size` bytes however
/// they compress (header, each page's frame and its worst expansion,
/// index and trailer), so encoding a delta never grows its buffer, a copy
/// each time.
fn encoded_bound(pages: usize, page_size: u32) -> usize {
    let page = page_size as usize;
    100 + pages * (page + page / 255 + 48) + 64
}

/// A record kept no bigger than its bytes: a node holds each of an open
/// Cell's records in memory until its checkpoint, and the slack of a
/// buffer sized for the pages uncompressed (or doubled while it grew) was
/// a third of a stream append's record (BENCHMARKS.md, thirty-sixth
/// measurement).
fn fitted(ltx: Vec<u8>) -> Vec<u8> {
    if ltx.capacity() - ltx.len() > ltx.len() / 8 {
        ltx.as_slice().to_vec()
    } else {
        ltx
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Pages read in order through a chunk are the file's bytes at
        /// their offsets, whatever the pages skipped, the page size and
        /// the file's length (across chunk boundaries too); a page the
        /// file ends inside fails the read.
        #[test]
        fn chunked_pages_are_the_files_bytes(
            page_shift in 9u32..13,
            pages in 1usize..200,
            ragged in 0usize..2,
            keep in proptest::collection::vec(any::<bool>(), 200),
        ) {
            let page_size = 1usize << page_shift;
            let len = pages * page_size - ragged * (page_size / 2);
            let bytes: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("db");
            std::fs::write(&path, &bytes).unwrap();
            let file = File::open(&path).unwrap();
            let mut chunk = Chunk::default();
            for (pgno, _) in keep.iter().enumerate().take(pages).filter(|(_, kept)| **kept) {
                let offset = (pgno * page_size) as u64;
                let read = chunk.page(&file, len as u64, offset, page_size);
                if offset as usize + page_size <= len {
                    let start = pgno * page_size;
                    prop_assert_eq!(read.unwrap(), &bytes[start..start + page_size]);
                } else {
                    let error = read.unwrap_err();
                    prop_assert_eq!(error.kind(), std::io::ErrorKind::UnexpectedEof);
                }
            }
        }
    }
}
