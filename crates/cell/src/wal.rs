//! Reading SQLite's write-ahead log: the frames committed since a cursor.
//!
//! Layout (sqlite.org/fileformat2.html#walformat): a 32-byte header (magic
//! `0x377f0682`/`0x377f0683` choosing little/big-endian checksum words,
//! version, page size, checkpoint sequence, salt-1, salt-2, checksum of the
//! first 24 bytes), then frames of a 24-byte header (page number, database
//! size in pages for a commit frame else 0, salt-1, salt-2, cumulative
//! checksum over the first 8 header bytes and the page) and one page.
//!
//! A frame is valid only if its salts equal the header's and its cumulative
//! checksum continues the previous one; reading stops at the first invalid
//! frame, and only frames up to the last valid commit frame count. A header
//! whose salts differ from the cursor's means SQLite restarted the WAL, which
//! it does only after every earlier frame was checkpointed into the database
//! file; reading then starts again at the first frame.

use std::collections::BTreeMap;

use crate::{Error, Result};

pub(crate) const WAL_HEADER_SIZE: u64 = 32;
pub(crate) const FRAME_HEADER_SIZE: u64 = 24;
const MAGIC_LE: u32 = 0x377f_0682;
const MAGIC_BE: u32 = 0x377f_0683;

/// Where capture stopped: just after the last captured commit frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct WalCursor {
    /// Byte offset of the next frame; 0 when no header has been read.
    pub offset: u64,
    pub salt1: u32,
    pub salt2: u32,
    /// Cumulative checksum after the last captured frame.
    pub checksum: (u32, u32),
    pub big_endian: bool,
}

/// The frames of the transactions committed after a cursor. The pages are
/// read in place, from the buffer the frames were read into: no copy and
/// no allocation per page.
#[derive(Debug)]
pub(crate) struct Committed<'a> {
    /// The frames read, from `start_offset` of the WAL.
    bytes: &'a [u8],
    /// Latest version of each page, by page number: where its data starts
    /// in `bytes`.
    at: BTreeMap<u32, usize>,
    page_size: usize,
    /// Database size in pages after the last commit.
    pub commit: u32,
    /// Whether reading restarted at the first frame of a new WAL.
    pub restarted: bool,
    /// Where the frames began (for the LTX header's WAL fields).
    pub start_offset: u64,
    pub cursor: WalCursor,
}

impl Committed<'_> {
    /// The latest version of each page up to page `last`, by page number.
    pub fn pages_through(&self, last: u32) -> impl Iterator<Item = (u32, &[u8])> + '_ {
        self.at
            .range(..=last)
            .map(|(&pgno, &at)| (pgno, &self.bytes[at..at + self.page_size]))
    }

    /// How many pages the frames hold (each once, its latest version).
    pub fn page_count(&self) -> usize {
        self.at.len()
    }

    /// The WAL offset of each page's latest frame's data, by page number.
    pub fn wal_offsets(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.at
            .iter()
            .map(|(&pgno, &at)| (pgno, self.start_offset + at as u64))
    }
}

/// The most bytes a thread keeps for reading frames between captures
/// ([`read_committed`]'s buffer): 63 frames of 4 KiB pages, several times a
/// usual group's; a larger transaction's buffer is freed after it. The
/// blocking pool may run many threads (a streams node used about 85), so
/// this bounds what they keep together.
const BUFFER_KEPT_MAX: usize = 256 << 10;

thread_local! {
    /// The buffer the frames of a capture are read into, kept per thread
    /// (groups run on the blocking pool's threads, and a buffer per Cell
    /// would cost its size times the open Cells).
    static FRAME_BUFFER: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Run `f` with this thread's frame buffer (empty if another caller on
/// this thread holds it), and keep the buffer for the next capture unless
/// it grew past [`BUFFER_KEPT_MAX`].
pub(crate) fn with_frame_buffer<T>(f: impl FnOnce(&mut Vec<u8>) -> T) -> T {
    let mut buffer = FRAME_BUFFER.take();
    let result = f(&mut buffer);
    if buffer.capacity() <= BUFFER_KEPT_MAX {
        FRAME_BUFFER.set(buffer);
    }
    result
}

fn checksum(big_endian: bool, data: &[u8], mut s: (u32, u32)) -> (u32, u32) {
    for pair in data.chunks_exact(8) {
        let word = |b: &[u8]| {
            let b: [u8; 4] = b.try_into().expect("chunks of 8 split into 4 and 4");
            if big_endian {
                u32::from_be_bytes(b)
            } else {
                u32::from_le_bytes(b)
            }
        };
        s.0 = s.0.wrapping_add(word(&pair[..4])).wrapping_add(s.1);
        s.1 = s.1.wrapping_add(word(&pair[4..])).wrapping_add(s.0);
    }
    s
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// Where a WAL's bytes are read from: SQLite's own handle of it (the
/// engine, [`cellfleet_vfs::WalFile`]) or, in the tests, a file opened by
/// its path.
pub(crate) trait WalSource {
    /// The WAL's length in bytes.
    fn wal_len(&self) -> std::io::Result<u64>;
    /// Fills `buf` from byte `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()>;
}

#[cfg(test)]
impl WalSource for std::fs::File {
    fn wal_len(&self) -> std::io::Result<u64> {
        Ok(self.metadata()?.len())
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(self, buf, offset)
    }
}

impl WalSource for cellfleet_vfs::WalFile<'_> {
    fn wal_len(&self) -> std::io::Result<u64> {
        self.len()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.read_exact_at(buf, offset)
    }
}

/// Read the transactions committed in the WAL `source` after `cursor`;
/// `None` when there are none. `page_size` is the database's. The frames
/// are read into `buffer`, which the result borrows; its bytes past what
/// this read needs are left as they are (a reused buffer is not cleared).
pub(crate) fn read_committed<'a>(
    source: &impl WalSource,
    cursor: &WalCursor,
    page_size: u32,
    buffer: &'a mut Vec<u8>,
) -> Result<Option<Committed<'a>>> {
    let len = source.wal_len()?;
    if len < WAL_HEADER_SIZE {
        return Ok(None);
    }
    let header = read_header(source, page_size)?;
    let restarted =
        cursor.offset == 0 || (header.salt1, header.salt2) != (cursor.salt1, cursor.salt2);
    let (start, running) = if restarted {
        (WAL_HEADER_SIZE, header.checksum)
    } else {
        (cursor.offset, cursor.checksum)
    };
    if len <= start {
        return Ok(None);
    }
    // Bounded by what one transaction wrote since the cursor.
    let wanted = (len - start) as usize;
    if buffer.len() < wanted {
        buffer.resize(wanted, 0);
    }
    let bytes = &mut buffer[..wanted];
    source.read_at(bytes, start)?;
    let bytes = &buffer[..wanted];
    let Some(frames) = committed_frames(bytes, start, running, &header, cursor, page_size)? else {
        return Ok(None);
    };
    Ok(Some(Committed {
        bytes,
        at: frames.at,
        page_size: page_size as usize,
        commit: frames.commit,
        restarted,
        start_offset: start,
        cursor: frames.end,
    }))
}

/// The fields of a WAL header that reading frames needs.
#[derive(Clone, Copy, Debug)]
struct WalHeader {
    /// Whether the checksum words are big-endian (from the magic).
    big_endian: bool,
    salt1: u32,
    salt2: u32,
    /// Checksum of the header's first 24 bytes: the first frame's
    /// cumulative checksum continues it.
    checksum: (u32, u32),
}

/// Reads the header at the start of `source` and checks it: a known magic,
/// the database's `page_size`, and a matching checksum.
fn read_header(source: &impl WalSource, page_size: u32) -> Result<WalHeader> {
    let mut header = [0u8; WAL_HEADER_SIZE as usize];
    source.read_at(&mut header, 0)?;
    let magic = be32(&header, 0);
    let big_endian = match magic {
        MAGIC_LE => false,
        MAGIC_BE => true,
        other => return Err(Error::Wal(format!("bad magic {other:#x}"))),
    };
    if be32(&header, 8) != page_size {
        return Err(Error::Wal(format!(
            "page size {} differs from the database's {page_size}",
            be32(&header, 8)
        )));
    }
    let (salt1, salt2) = (be32(&header, 16), be32(&header, 20));
    let header_checksum = checksum(big_endian, &header[..24], (0, 0));
    if header_checksum != (be32(&header, 24), be32(&header, 28)) {
        return Err(Error::Wal("header checksum mismatch".into()));
    }
    Ok(WalHeader {
        big_endian,
        salt1,
        salt2,
        checksum: header_checksum,
    })
}

/// What the valid commit frames among the frames read cover.
#[derive(Debug)]
struct CommittedFrames {
    /// Where the data of each page's latest frame starts in the bytes
    /// read, by page number.
    at: BTreeMap<u32, usize>,
    /// Database size in pages after the last commit.
    commit: u32,
    /// Just after the last commit frame.
    end: WalCursor,
}

/// Walks the frames in `bytes` (read from offset `start` of the WAL, whose
/// cumulative checksum there is `running`) while their salts match the
/// header's and the checksum continues, and keeps the pages of the frames
/// up to the last valid commit frame; `None` when there is no such frame.
fn committed_frames(
    bytes: &[u8],
    start: u64,
    mut running: (u32, u32),
    header: &WalHeader,
    cursor: &WalCursor,
    page_size: u32,
) -> Result<Option<CommittedFrames>> {
    let WalHeader {
        big_endian,
        salt1,
        salt2,
        ..
    } = *header;
    let frame_size = FRAME_HEADER_SIZE + u64::from(page_size);
    let mut pending: Vec<(u32, usize)> = Vec::new();
    let mut at = BTreeMap::new();
    let mut commit = None;
    let mut end = cursor.clone_at(start, running, salt1, salt2, big_endian);
    for (i, frame) in bytes.chunks_exact(frame_size as usize).enumerate() {
        if (be32(frame, 8), be32(frame, 12)) != (salt1, salt2) {
            break;
        }
        running = checksum(big_endian, &frame[..8], running);
        running = checksum(big_endian, &frame[FRAME_HEADER_SIZE as usize..], running);
        if running != (be32(frame, 16), be32(frame, 20)) {
            break;
        }
        let pgno = be32(frame, 0);
        if pgno == 0 {
            return Err(Error::Wal("frame for page 0".into()));
        }
        pending.push((pgno, i));
        let db_size = be32(frame, 4);
        if db_size != 0 {
            for (pgno, index) in pending.drain(..) {
                at.insert(
                    pgno,
                    index * frame_size as usize + FRAME_HEADER_SIZE as usize,
                );
            }
            commit = Some(db_size);
            end = cursor.clone_at(
                start + (i as u64 + 1) * frame_size,
                running,
                salt1,
                salt2,
                big_endian,
            );
        }
    }
    Ok(commit.map(|commit| CommittedFrames { at, commit, end }))
}

impl WalCursor {
    fn clone_at(
        &self,
        offset: u64,
        checksum: (u32, u32),
        salt1: u32,
        salt2: u32,
        big_endian: bool,
    ) -> WalCursor {
        WalCursor {
            offset,
            salt1,
            salt2,
            checksum,
            big_endian,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::Connection;
    use std::path::Path;

    /// What a read found, copied out of the buffer the engine's result
    /// borrows.
    #[derive(Debug, PartialEq)]
    struct Read {
        pages: BTreeMap<u32, Vec<u8>>,
        offsets: BTreeMap<u32, u64>,
        commit: u32,
        restarted: bool,
        start_offset: u64,
        cursor: WalCursor,
    }

    fn owned(c: Committed<'_>) -> Read {
        Read {
            pages: c
                .pages_through(u32::MAX)
                .map(|(p, d)| (p, d.to_vec()))
                .collect(),
            offsets: c.wal_offsets().collect(),
            commit: c.commit,
            restarted: c.restarted,
            start_offset: c.start_offset,
            cursor: c.cursor,
        }
    }

    /// Reads `source` into `buffer` and copies the result out.
    fn read_with(
        source: &impl WalSource,
        cursor: &WalCursor,
        page_size: u32,
        buffer: &mut Vec<u8>,
    ) -> Result<Option<Read>> {
        Ok(super::read_committed(source, cursor, page_size, buffer)?.map(owned))
    }

    /// The frames committed after `cursor` in the WAL file at `wal`, read
    /// by its path (the engine reads through SQLite's handle instead).
    fn read_committed(wal: &Path, cursor: &WalCursor, page_size: u32) -> Result<Option<Read>> {
        match std::fs::File::open(wal) {
            Ok(file) => read_with(&file, cursor, page_size, &mut Vec::new()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    fn open(path: &Path) -> Connection {
        let conn = Connection::open(path).unwrap();
        conn.execute_batch("PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=0;")
            .unwrap();
        conn
    }

    /// A database in WAL mode with one table created, and the read of that
    /// first commit: the directory, the database's and the WAL's paths, the
    /// connection and the read.
    fn wal_with_table() -> (
        tempfile::TempDir,
        std::path::PathBuf,
        std::path::PathBuf,
        Connection,
        Read,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("t.db");
        let wal = dir.path().join("t.db-wal");
        let conn = open(&db);
        conn.execute_batch("CREATE TABLE t (x)").unwrap();
        let first = read_committed(&wal, &WalCursor::default(), 4096)
            .unwrap()
            .unwrap();
        (dir, db, wal, conn, first)
    }

    #[test]
    fn reads_each_commit_once_and_detects_restart() {
        let (_dir, db, wal, conn, first) = wal_with_table();
        assert!(first.restarted);
        assert_eq!(first.commit, 2);
        assert!(first.pages.contains_key(&1) && first.pages.contains_key(&2));
        assert!(read_committed(&wal, &first.cursor, 4096).unwrap().is_none());

        conn.execute_batch("INSERT INTO t VALUES (randomblob(5000))")
            .unwrap();
        let second = read_committed(&wal, &first.cursor, 4096).unwrap().unwrap();
        assert!(!second.restarted);
        assert!(second.commit >= 3);
        assert_eq!(second.start_offset, first.cursor.offset);

        // The page images equal what SQLite checkpoints into the file.
        conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
            .unwrap();
        let file = std::fs::read(&db).unwrap();
        for (pgno, data) in &second.pages {
            let at = (*pgno as usize - 1) * 4096;
            assert_eq!(&file[at..at + 4096], &data[..], "page {pgno}");
        }
        assert_eq!(std::fs::metadata(&wal).unwrap().len(), 0);
        conn.execute_batch("INSERT INTO t VALUES (1)").unwrap();
        let third = read_committed(&wal, &second.cursor, 4096).unwrap().unwrap();
        assert!(
            third.restarted,
            "a truncated wal starts over with new salts"
        );
    }

    /// A buffer kept from a longer read of the same WAL holds valid frames
    /// past the end of a shorter one (same salts, a checksum chain that
    /// continues): a read must stop where its file ends, not at the end of
    /// the buffer.
    #[test]
    fn a_kept_buffer_never_adds_frames_past_the_file() {
        let (dir, _db, wal, conn, first) = wal_with_table();
        conn.execute_batch("INSERT INTO t VALUES (randomblob(9000))")
            .unwrap();
        // The same WAL, cut after the first commit.
        let short = dir.path().join("short-wal");
        std::fs::copy(&wal, &short).unwrap();
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&short)
            .unwrap();
        file.set_len(first.cursor.offset).unwrap();

        let mut buffer = Vec::new();
        let long = std::fs::File::open(&wal).unwrap();
        let all = read_with(&long, &WalCursor::default(), 4096, &mut buffer)
            .unwrap()
            .unwrap();
        assert!(all.cursor.offset > first.cursor.offset);
        let cut = std::fs::File::open(&short).unwrap();
        let again = read_with(&cut, &WalCursor::default(), 4096, &mut buffer)
            .unwrap()
            .unwrap();
        assert_eq!(again, first);
    }

    /// SQLite's own WAL handle reads what the file by its path reads, and
    /// follows the WAL through a checkpoint that truncates it.
    #[test]
    fn sqlite_handle_reads_what_the_path_reads() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("t.db");
        let wal = dir.path().join("t.db-wal");
        let mut conn = open(&db);
        conn.execute_batch("CREATE TABLE t (x)").unwrap();
        let mut cursor = WalCursor::default();
        for round in 0..3 {
            conn.execute_batch("INSERT INTO t VALUES (randomblob(6000))")
                .unwrap();
            let by_path = read_committed(&wal, &cursor, 4096).unwrap().unwrap();
            let by_handle = {
                let handle = cellfleet_vfs::wal_file(&mut conn).unwrap().unwrap();
                assert_eq!(
                    handle.len().unwrap(),
                    std::fs::metadata(&wal).unwrap().len()
                );
                read_with(&handle, &cursor, 4096, &mut Vec::new())
                    .unwrap()
                    .unwrap()
            };
            assert_eq!(by_handle.pages, by_path.pages, "round {round}");
            assert_eq!(by_handle.offsets, by_path.offsets);
            assert_eq!(by_handle.commit, by_path.commit);
            assert_eq!(by_handle.restarted, by_path.restarted);
            assert_eq!(by_handle.cursor, by_path.cursor);
            cursor = by_handle.cursor;
            if round == 1 {
                conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
                    .unwrap();
                let handle = cellfleet_vfs::wal_file(&mut conn).unwrap().unwrap();
                assert_eq!(handle.len().unwrap(), 0);
                let mut byte = [0u8; 1];
                assert_eq!(
                    handle.read_exact_at(&mut byte, 0).unwrap_err().kind(),
                    std::io::ErrorKind::UnexpectedEof
                );
            }
        }
        assert!(cursor.offset > 0);
    }

    /// A valid WAL header for `page_size` (little-endian checksums).
    fn header(page_size: u32, salts: (u32, u32)) -> Vec<u8> {
        let mut h = Vec::new();
        h.extend_from_slice(&MAGIC_LE.to_be_bytes());
        h.extend_from_slice(&3_007_000u32.to_be_bytes());
        h.extend_from_slice(&page_size.to_be_bytes());
        h.extend_from_slice(&0u32.to_be_bytes());
        h.extend_from_slice(&salts.0.to_be_bytes());
        h.extend_from_slice(&salts.1.to_be_bytes());
        let sum = checksum(false, &h, (0, 0));
        h.extend_from_slice(&sum.0.to_be_bytes());
        h.extend_from_slice(&sum.1.to_be_bytes());
        h
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 256, ..Default::default() })]
        /// Untrusted WAL bytes (garbage, or a valid header followed by
        /// garbage frames), read from any cursor: a typed result, never a
        /// panic, and only whole frames up to a commit are ever returned.
        #[test]
        fn arbitrary_wal_bytes_never_panic(
            valid_header in proptest::bool::ANY,
            body in proptest::collection::vec(proptest::num::u8::ANY, 0..3000),
            offset in 0u64..4000,
            salts in (proptest::num::u32::ANY, proptest::num::u32::ANY),
            same_salts in proptest::bool::ANY,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let wal = dir.path().join("x-wal");
            let mut bytes = if valid_header { header(512, salts) } else { Vec::new() };
            bytes.extend_from_slice(&body);
            std::fs::write(&wal, &bytes).unwrap();
            let cursor = WalCursor {
                offset,
                salt1: if same_salts { salts.0 } else { salts.0.wrapping_add(1) },
                salt2: salts.1,
                checksum: (1, 2),
                big_endian: false,
            };
            let fresh = read_committed(&wal, &cursor, 512);
            // A reused buffer, longer than the read and full of other
            // bytes, reads the same as a fresh one.
            let mut stale = vec![0xa5u8; bytes.len() + 700];
            let file = std::fs::File::open(&wal).unwrap();
            let reused = read_with(&file, &cursor, 512, &mut stale);
            proptest::prop_assert_eq!(fresh.as_ref().ok(), reused.as_ref().ok());
            proptest::prop_assert_eq!(fresh.is_err(), reused.is_err());
            if let Ok(Some(committed)) = fresh {
                let frame = FRAME_HEADER_SIZE + 512;
                proptest::prop_assert!(committed.cursor.offset <= bytes.len() as u64);
                proptest::prop_assert_eq!((committed.cursor.offset - committed.start_offset) % frame, 0);
                proptest::prop_assert!(committed.pages.values().all(|p| p.len() == 512));
                proptest::prop_assert!(committed.commit > 0);
            }
        }
    }
}
