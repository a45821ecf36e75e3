//! How a Cell's SQLite database is opened, and the engine's settings: shared by the writer ([`crate::Cell`]) and its readers ([`crate::reader`]).

use std::path::{Path, PathBuf};

use rusqlite::config::DbConfig;
use rusqlite::Connection;

use crate::guard::Guard;
use crate::{Error, Result};

/// Settings of one Cell engine.
#[derive(Clone, Debug)]
pub struct CellConfig {
    /// Page size of a new database (power of two, 512..=65536).
    pub page_size: u32,
    /// `PRAGMA auto_vacuum = FULL` on a new database, so deletes shrink it.
    pub auto_vacuum: bool,
    /// Most commands in one group.
    pub group_commands_max: usize,
    /// A delta with more page bytes than this is published as a snapshot.
    pub snapshot_delta_bytes: u64,
    /// When a confirm leaves nothing pending, checkpoint once the WAL is
    /// this big; while anything is pending, a WAL this big refuses new
    /// groups ([`crate::Error::CheckpointDue`]) until the pipeline drains.
    pub checkpoint_wal_bytes: u64,
    /// Most publications pending at once (at least 1): a group may execute
    /// while this many minus one earlier ones are still being published.
    pub pending_publications_max: usize,
    /// Furthest a command's expiry may lie in the future.
    pub validity_ms_max: i64,
    /// Clock skew margin: ledger entries live until expiry plus this.
    pub skew_margin_ms: i64,
    /// Most expired ledger entries pruned per group.
    pub ledger_prune_max: u32,
    /// SQLite VM instructions one command or query may take.
    pub statement_steps_max: u64,
    /// Write the rolling database checksums into the LTX files (header
    /// flags 0, as LiteFS does). Off by default: files are then written as
    /// Litestream writes them (flag `0x2`, zero checksums), which is the
    /// only form Litestream 0.5's `restore` accepts. Either way the engine
    /// computes the checksums and returns them in each [`crate::Publication`].
    pub ltx_checksums_in_file: bool,
    /// Open the reader of the published state on the first query instead
    /// of with the Cell (two descriptors and a schema parse fewer for a
    /// Cell that is only written). A query or
    /// [`crate::Cell::published_outcome`] while a group is pending and no
    /// reader holds the published state then gets
    /// [`crate::Error::ViewPending`]; [`crate::Cell::want_view`] makes the
    /// next group keep one. Off by default: queries always answer.
    pub reader_on_demand: bool,
    /// A Cell that opens behind its kind's schema (a new Cell, or a kind
    /// with migrations the file has not applied) does not run them as a
    /// group of its own at open: the next group applies them first, so a
    /// new Cell's schema and its first commands are one publication.
    /// [`Opened::migration`] is then `None`; [`Cell::schema_due`] says the
    /// schema is still to be applied, and [`Cell::migrate`] applies it
    /// alone (before a query, which must not read a state without the
    /// kind's tables). Off by default.
    ///
    /// [`Opened::migration`]: crate::Opened::migration
    /// [`Cell::schema_due`]: crate::Cell::schema_due
    /// [`Cell::migrate`]: crate::Cell::migrate
    pub defer_migrations: bool,
    /// Most bytes of pages each of the Cell's connections keeps in its
    /// page cache (SQLite's `cache_size`, in KiB rounded up); 0 keeps
    /// SQLite's default of 2,000 KiB. A page the cache let go is read
    /// again from the file (the kernel's cache) when next needed.
    pub cache_bytes: u64,
}

impl Default for CellConfig {
    fn default() -> Self {
        CellConfig {
            page_size: 4096,
            auto_vacuum: true,
            group_commands_max: 1024,
            snapshot_delta_bytes: 16 << 20,
            checkpoint_wal_bytes: 4 << 20,
            pending_publications_max: 2,
            validity_ms_max: 24 * 3600 * 1000,
            skew_margin_ms: 500,
            ledger_prune_max: 256,
            statement_steps_max: 50_000_000,
            ltx_checksums_in_file: false,
            reader_on_demand: false,
            defer_migrations: false,
            cache_bytes: 0,
        }
    }
}

/// Descriptors one open Cell may use (writer and readers with their
/// WAL files).
const CELL_FDS: usize = 8;

/// `error` from opening the Cell at `path`, or [`Error::OutOfFiles`] when
/// the process cannot open a Cell's descriptors now. SQLite reports only
/// "unable to open database file" (or an I/O error when the WAL or shared
/// memory file is the one that failed), and by then it has closed what it
/// had opened, so the check opens [`CELL_FDS`] more files (of `/dev/null`) and
/// closes them again.
pub(crate) fn classify_open_error(path: &Path, error: Error) -> Error {
    let cannot_open = match &error {
        Error::Sqlite(rusqlite::Error::SqliteFailure(e, _)) => {
            // A WAL or shared-memory file that cannot open surfaces as an
            // I/O error (SHMOPEN, SHMLOCK), not as CANTOPEN.
            matches!(
                e.code,
                rusqlite::ErrorCode::CannotOpen | rusqlite::ErrorCode::SystemIoFailure
            )
        }
        Error::Io(e) => matches!(e.raw_os_error(), Some(24) | Some(23)),
        _ => false,
    };
    if !cannot_open {
        return error;
    }
    let mut probes = Vec::with_capacity(CELL_FDS);
    for _ in 0..CELL_FDS {
        match std::fs::File::open("/dev/null") {
            Ok(file) => probes.push(file),
            // EMFILE (this process) or ENFILE (the whole system).
            Err(probe) if matches!(probe.raw_os_error(), Some(24) | Some(23)) => {
                return Error::OutOfFiles {
                    path: path.display().to_string(),
                };
            }
            Err(_) => break,
        }
    }
    error
}

pub(crate) fn open_connection(
    path: &Path,
    read_only: bool,
    config: &CellConfig,
) -> Result<(Connection, Guard)> {
    open_writer_or_reader(path, read_only, config, None, None)
}

/// A Cell's write connection; when the database has no page yet and
/// `template` is given, the database starts as those bytes (its kind's
/// template, `template.rs`). Also the file's header as it was before the
/// open, when it had one.
pub(crate) fn open_writer(
    path: &Path,
    config: &CellConfig,
    template: Option<&[u8]>,
) -> Result<(Connection, Guard, Option<FileHeader>)> {
    let header = read_header(path)?;
    let (conn, guard) = open_writer_or_reader(path, false, config, template, header)?;
    Ok((conn, guard, header))
}

/// What a database file's first 100 bytes say: its page size, and whether
/// SQLite opens it in WAL mode by itself (read and write versions 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FileHeader {
    pub(crate) page_size: u32,
    pub(crate) wal: bool,
}

impl FileHeader {
    /// The header of a SQLite database; `None` for bytes that are not one
    /// (too short, another magic string, a page size SQLite would refuse),
    /// which then go to SQLite to judge.
    pub(crate) fn parse(bytes: &[u8]) -> Option<FileHeader> {
        if bytes.len() < 100 || &bytes[..16] != b"SQLite format 3\0" {
            return None;
        }
        let page_size = match u16::from_be_bytes([bytes[16], bytes[17]]) {
            1 => 65_536,
            n => u32::from(n),
        };
        if !page_size.is_power_of_two() || !(512..=65_536).contains(&page_size) {
            return None;
        }
        Some(FileHeader {
            page_size,
            wal: bytes[18] == 2 && bytes[19] == 2,
        })
    }
}

/// The header of the database at `path`; `None` when there is no file,
/// or no valid header in it (an empty file, say).
pub(crate) fn read_header(path: &Path) -> Result<Option<FileHeader>> {
    use std::io::Read;
    let mut file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let mut bytes = [0u8; 100];
    let mut read = 0;
    while read < bytes.len() {
        match file.read(&mut bytes[read..])? {
            0 => break,
            n => read += n,
        }
    }
    Ok(FileHeader::parse(&bytes[..read]))
}

/// Each connection's lookaside pool: slot size and count. SQLite's
/// default (48,000 bytes, all of it resident from the open) was about a
/// quarter of a node's memory per open stream Cell; 16 slots of 128 bytes took a
/// node with 9,247 open Cells from 1,761 to 1,351 MB of RSS for 0.1% more
/// instructions per append (BENCHMARKS.md, twenty-fifth measurement).
const LOOKASIDE: (u16, u16) = (128, 16);

fn open_writer_or_reader(
    path: &Path,
    read_only: bool,
    config: &CellConfig,
    template: Option<&[u8]>,
    mut header: Option<FileHeader>,
) -> Result<(Connection, Guard)> {
    // A database with no page yet takes the configured page size.
    let mut exists = header.is_some()
        || std::fs::metadata(path)
            .map(|m| m.len() > 0)
            .unwrap_or(false);
    let flags = cellfleet_vfs::open_flags(read_only);
    cellfleet_vfs::register()?;
    let mut conn = match Connection::open_with_flags_and_vfs(path, flags, cellfleet_vfs::NAME) {
        Ok(conn) => conn,
        // The VFS could not lock other processes out: one has the file
        // open (an engine of another process, or an `sqlite3` shell).
        Err(rusqlite::Error::SqliteFailure(e, _))
            if e.code == rusqlite::ErrorCode::DatabaseBusy =>
        {
            return Err(Error::Live(path.display().to_string()));
        }
        Err(e) => return Err(e.into()),
    };
    cellfleet_vfs::set_lookaside(&conn, LOOKASIDE.0, LOOKASIDE.1)?;
    if let (false, false, Some(bytes)) = (exists, read_only, template) {
        // Written only now, into the file SQLite just opened and has not
        // read yet (it reads the header under its first lock).
        write_template(path, bytes)?;
        exists = true;
        // A template is a WAL database (its build switched it), so its
        // header spares the switch below, a statement that would find WAL
        // mode already on.
        header = FileHeader::parse(bytes);
    }
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)?;
    if !read_only {
        // No fsync of the local file, ever: it is a cache of the Cell's
        // state in the bucket, never the proof of it. Every open verifies
        // the file against the authority's position (TXID and the rolling
        // checksum over every page, after merging whatever the WAL holds),
        // and a file that lost writes to a machine crash fails that check
        // and is rebuilt from the bucket. A process crash loses nothing the
        // kernel already has. The fsyncs of each checkpoint were a fifth of
        // a passivate-and-reopen cycle. Set before the switch to WAL, which
        // on a new file is itself a commit (four syncs otherwise).
        conn.execute_batch(&format!(
            "PRAGMA synchronous = OFF;{}",
            cache_pragma(config)
        ))?;
        if !exists {
            // A new file's first writes (setting auto_vacuum, then the
            // switch to WAL) would each create and delete a rollback
            // journal. On ext4 without a journal, each file creation steps
            // over every inode of its group deleted in the last minute or
            // more (BENCHMARKS.md, eighteenth measurement), so a node that
            // creates Cells should not delete files to do it. The journal
            // of these two writes is kept in memory instead: the file is a
            // cache, and one a crash left half written fails the open's
            // position check and is rebuilt.
            conn.execute_batch(&format!(
                "PRAGMA journal_mode = MEMORY; PRAGMA page_size = {}; PRAGMA auto_vacuum = {};",
                config.page_size,
                if config.auto_vacuum { "FULL" } else { "NONE" }
            ))?;
        }
        // A file whose header says WAL opens in WAL mode (SQLite reads
        // the header under its first lock, and no other process can have
        // changed it: the VFS keeps them out); only other files need the
        // switch, and its statement.
        if !header.is_some_and(|h| h.wal) {
            let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
            if !mode.eq_ignore_ascii_case("wal") {
                return Err(Error::Wal(format!("journal mode is {mode}, not wal")));
            }
        }
        conn.execute_batch("PRAGMA wal_autocheckpoint = 0;")?;
    } else {
        conn.execute_batch(&format!("PRAGMA query_only = 1;{}", cache_pragma(config)))?;
    }
    let guard = Guard::install(&mut conn, config.statement_steps_max)?;
    Ok((conn, guard))
}

/// The statement that bounds a connection's page cache to
/// [`CellConfig::cache_bytes`]; empty for SQLite's default.
fn cache_pragma(config: &CellConfig) -> String {
    match config.cache_bytes {
        0 => String::new(),
        bytes => format!(" PRAGMA cache_size = -{};", bytes.div_ceil(1024)),
    }
}

/// `path` with `suffix` appended: a database's `-wal` (and the `-shm`
/// and `.lock` files of earlier builds), and scratch files beside it.
pub(crate) fn sidecar(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(suffix);
    PathBuf::from(s)
}

/// TRUNCATE checkpoint, verified: SQLite reports no reader in the way and
/// the WAL file is empty afterwards.
pub(crate) fn checkpoint(conn: &Connection, wal_path: &Path) -> Result<()> {
    let (busy, _log, _done): (i64, i64, i64) =
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })?;
    if busy != 0 {
        return Err(Error::Wal(
            "checkpoint could not complete: a reader holds the wal".into(),
        ));
    }
    let wal_bytes = match std::fs::metadata(wal_path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(e) => return Err(e.into()),
    };
    if wal_bytes != 0 {
        return Err(Error::Wal(format!(
            "a truncating checkpoint left {wal_bytes} bytes in the wal"
        )));
    }
    Ok(())
}

/// Writes a template into the empty file at `path` with one write, so
/// that a process killed meanwhile leaves it empty or whole; on an error
/// the file is emptied again, so the next open starts over.
fn write_template(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new().write(true).open(path)?;
    let written = file.write_all(bytes);
    if written.is_err() {
        let _ = file.set_len(0);
    }
    Ok(written?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any bytes parse to nothing or to a page size SQLite accepts,
        /// without panicking; a real header's fields are read back.
        #[test]
        fn headers_parse_to_a_valid_page_size_or_nothing(
            bytes in proptest::collection::vec(any::<u8>(), 0..140),
            exp in 9u32..=16,
            wal in any::<bool>(),
        ) {
            if let Some(h) = FileHeader::parse(&bytes) {
                prop_assert!(h.page_size.is_power_of_two());
                prop_assert!((512..=65_536).contains(&h.page_size));
            }
            let mut real = vec![0u8; 100];
            real[..16].copy_from_slice(b"SQLite format 3\0");
            let page_size = 1u32 << exp;
            let field = if page_size == 65_536 { 1 } else { page_size as u16 };
            real[16..18].copy_from_slice(&field.to_be_bytes());
            let version = if wal { 2 } else { 1 };
            real[18] = version;
            real[19] = version;
            prop_assert_eq!(FileHeader::parse(&real), Some(FileHeader { page_size, wal }));
            prop_assert_eq!(FileHeader::parse(&real[..99]), None);
        }
    }

    /// What SQLite writes is what the parser reads: a WAL database's page
    /// size and mode, and nothing for a file without a page.
    #[test]
    fn a_wal_database_header_is_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.db");
        assert_eq!(read_header(&path).unwrap(), None);
        std::fs::write(&path, b"").unwrap();
        assert_eq!(read_header(&path).unwrap(), None);
        std::fs::remove_file(&path).unwrap();
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch("PRAGMA page_size = 1024; CREATE TABLE t (v);")
            .unwrap();
        assert_eq!(
            read_header(&path).unwrap(),
            Some(FileHeader {
                page_size: 1024,
                wal: false
            })
        );
        let _: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .unwrap();
        assert_eq!(
            read_header(&path).unwrap(),
            Some(FileHeader {
                page_size: 1024,
                wal: true
            })
        );
    }

    /// Both of a Cell's kinds of connection take the configured cache
    /// bound, and none is set without one.
    #[test]
    fn a_connections_page_cache_is_bounded_as_configured() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        let cache = |conn: &Connection| -> i64 {
            conn.query_row("PRAGMA cache_size", [], |r| r.get(0))
                .unwrap()
        };
        let bounded = CellConfig {
            cache_bytes: 100_000,
            ..CellConfig::default()
        };
        let (write, _guard) = open_connection(&path, false, &bounded).unwrap();
        assert_eq!(cache(&write), -98, "KiB, rounded up");
        let (read, _guard) = open_connection(&path, true, &bounded).unwrap();
        assert_eq!(cache(&read), -98);
        drop((write, read));
        let (write, _guard) = open_connection(&path, false, &CellConfig::default()).unwrap();
        assert_eq!(cache(&write), -2000, "SQLite's default");
    }
}
