//! The Cell engine: one SQLite database with one writer, executing groups
//! of commands as single transactions and capturing each as one LTX file.
//!
//! Ordering, the rules this file keeps:
//! - Automatic checkpoints are off and connections never checkpoint on
//!   close; the WAL is checkpointed (TRUNCATE) only after the caller
//!   [`Cell::confirm`]s the publication of everything in it.
//! - At most one publication is pending. Until it is confirmed or aborted
//!   the Cell refuses new groups and queries (a query must never see state
//!   that may still be thrown away).
//! - [`Cell::abort`] rebuilds the last published state from local files:
//!   both connections are closed, the WAL is cut back to the end of the last
//!   published frame, the shared-memory index is deleted so SQLite rebuilds
//!   it from the WAL, the captured checksums are restored from the undo
//!   record, and the TXID read back from the database must equal the
//!   published one. If any step fails the Cell is poisoned and the caller
//!   must close it and [`crate::recover`] from the published chain.
//! - [`Cell::open`] checkpoints whatever the files hold and then refuses to
//!   serve unless the database is exactly at the published position.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cellfleet_ltx::{Position, Txid};
use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::capture::{CaptureState, Files, Publication, Undo};
use crate::command::{Command, CommandResult, Outcome, RejectCode, Rejection};
use crate::guard::{Guard, Mode};
use crate::kind::{Kind, KindError};
use crate::sql::value_bytes;
use crate::wal::{self, Committed};
use crate::{ledger, Error, Result};

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
    /// After a confirmed publication, checkpoint once the WAL is this big.
    pub checkpoint_wal_bytes: u64,
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
    /// computes the checksums and returns them in each [`Publication`].
    pub ltx_checksums_in_file: bool,
}

impl Default for CellConfig {
    fn default() -> Self {
        CellConfig {
            page_size: 4096,
            auto_vacuum: true,
            group_commands_max: 1024,
            snapshot_delta_bytes: 16 << 20,
            checkpoint_wal_bytes: 4 << 20,
            validity_ms_max: 24 * 3600 * 1000,
            skew_margin_ms: 500,
            ledger_prune_max: 256,
            statement_steps_max: 50_000_000,
            ltx_checksums_in_file: false,
        }
    }
}

/// The result of one group.
#[derive(Debug)]
pub struct GroupResult {
    /// One per command, in order.
    pub results: Vec<CommandResult>,
    /// The captured transaction, pending until confirmed or aborted; `None`
    /// when no command changed anything (all duplicates or refused).
    pub publication: Option<Publication>,
}

/// Counters of the captures this engine made since it was opened (for
/// metrics and for benchmarks that separate capture from execution).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CaptureStats {
    /// Transactions captured (published or aborted later).
    pub captures_total: u64,
    /// Time spent capturing: reading the WAL, updating the checksums and
    /// encoding the LTX file.
    pub capture_nanos_total: u64,
    /// Bytes of LTX produced.
    pub ltx_bytes_total: u64,
}

/// A freshly opened Cell, with the migration it had to run (pending).
#[derive(Debug)]
pub struct Opened {
    pub cell: Cell,
    pub migration: Option<Publication>,
}

#[derive(Debug)]
struct Pending {
    txid: Txid,
    undo: Undo,
}

/// One open Cell.
#[derive(Debug)]
pub struct Cell {
    path: PathBuf,
    wal_path: PathBuf,
    shm_path: PathBuf,
    kind: Arc<dyn Kind>,
    config: CellConfig,
    write: Connection,
    write_guard: Guard,
    read: Connection,
    read_guard: Guard,
    capture: CaptureState,
    published: Position,
    pending: Option<Pending>,
    poisoned: bool,
    stats: CaptureStats,
    /// A lower bound of the earliest expiry in the ledger (`i64::MAX` when
    /// it is empty), so groups skip the prune statement when nothing can
    /// have expired; `None` when unknown (after open, abort or an error).
    ledger_expiry_floor: Option<i64>,
    migrations_declared: usize,
    /// Applied migrations as of the published state (a lower bound).
    migrations_published: usize,
    /// Keeps other engines (and recovery) off these files.
    _lock: File,
}

fn sidecar(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(suffix);
    PathBuf::from(s)
}

/// Take the exclusive lock that marks a Cell database as live.
pub(crate) fn lock_cell(path: &Path) -> Result<File> {
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(sidecar(path, ".lock"))?;
    match lock.try_lock() {
        Ok(()) => Ok(lock),
        Err(std::fs::TryLockError::WouldBlock) => Err(Error::Live(path.display().to_string())),
        Err(std::fs::TryLockError::Error(e)) => Err(e.into()),
    }
}

fn migration_digest(sql: &str) -> Vec<u8> {
    Sha256::digest(sql.as_bytes()).to_vec()
}

fn is_fatal(e: &rusqlite::Error) -> bool {
    use rusqlite::ErrorCode::*;
    match e {
        rusqlite::Error::SqliteFailure(f, _) => matches!(
            f.code,
            DiskFull
                | SystemIoFailure
                | DatabaseCorrupt
                | NotADatabase
                | CannotOpen
                | DatabaseBusy
                | DatabaseLocked
                | OutOfMemory
                | FileLockingProtocolFailed
                | PermissionDenied
                | ReadOnly
        ),
        _ => false,
    }
}

fn rejection_of(e: rusqlite::Error, steps_max: u64) -> Rejection {
    if let rusqlite::Error::SqliteFailure(f, _) = &e {
        if f.code == rusqlite::ErrorCode::OperationInterrupted {
            return Rejection::new(
                RejectCode::LimitExceeded,
                format!("statement exceeded the budget of {steps_max} steps"),
            );
        }
        if f.code == rusqlite::ErrorCode::AuthorizationForStatementDenied {
            return Rejection::new(
                RejectCode::Sql,
                format!("not authorized (engine tables, transaction control, pragma, attach): {e}"),
            );
        }
    }
    Rejection::new(RejectCode::Sql, e.to_string())
}

impl Cell {
    /// Open the Cell database at `path` for `kind`, which the caller's
    /// authority says is at `published` (`Position::EMPTY` for a new Cell).
    ///
    /// A missing file with a non-empty position, or a file at any other
    /// position, is an error: recover it from the published chain first.
    /// When the kind declares migrations the Cell has not applied (or the
    /// Cell is new) they run now as one captured transaction, returned as
    /// [`Opened::migration`] and pending like any group.
    pub fn open(
        path: &Path,
        kind: Arc<dyn Kind>,
        config: CellConfig,
        published: Position,
        now_ms: i64,
    ) -> Result<Opened> {
        if !config.page_size.is_power_of_two() || !(512..=65536).contains(&config.page_size) {
            return Err(Error::BadParameters(format!(
                "page size {} is not a power of two in 512..=65536",
                config.page_size
            )));
        }
        let lock = lock_cell(path)?;
        let exists = path.exists();
        if !exists && published != Position::EMPTY {
            return Err(Error::Missing(published));
        }
        let wal_path = sidecar(path, "-wal");
        let shm_path = sidecar(path, "-shm");
        let (write, write_guard) = open_connection(path, false, &config)?;
        // Whatever the WAL holds goes into the file; the position check
        // below decides whether that is the published state.
        checkpoint(&write)?;
        let page_size = if exists {
            write.query_row("PRAGMA page_size", [], |r| r.get::<_, u32>(0))?
        } else {
            config.page_size
        };
        let capture = CaptureState::from_database(path, page_size, config.ltx_checksums_in_file)?;
        let found = Position {
            txid: ledger::txid(&write)?,
            checksum: capture.checksum,
        };
        // A new Cell may hold page 1 already (setting WAL mode writes it);
        // TXID 1 is always a snapshot, so nothing before it is published.
        let fresh = published == Position::EMPTY && found.txid == Txid::ZERO;
        if found != published && !fresh {
            return Err(Error::NotAtPosition {
                found,
                expected: published,
            });
        }
        let (read, read_guard) = open_connection(path, true, &config)?;
        write.set_prepared_statement_cache_capacity(64);
        let mut cell = Cell {
            path: path.to_path_buf(),
            wal_path,
            shm_path,
            kind,
            config,
            write,
            write_guard,
            read,
            read_guard,
            capture,
            published,
            pending: None,
            poisoned: false,
            stats: CaptureStats::default(),
            ledger_expiry_floor: None,
            migrations_declared: 0,
            migrations_published: 0,
            _lock: lock,
        };
        cell.check_migrations()?;
        cell.migrations_declared = cell.kind.migrations().len();
        cell.migrations_published = ledger::applied_migrations(&cell.write)?.len();
        let migration = if cell.behind()? {
            let result = cell.execute(&[], now_ms)?;
            result.publication
        } else {
            None
        };
        Ok(Opened { cell, migration })
    }

    /// The published position.
    pub fn position(&self) -> Position {
        self.published
    }

    /// The TXID of the pending publication, if any.
    pub fn pending_txid(&self) -> Option<Txid> {
        self.pending.as_ref().map(|p| p.txid)
    }

    /// The kind this Cell runs.
    pub fn kind(&self) -> &Arc<dyn Kind> {
        &self.kind
    }

    /// The database file path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What capturing has cost so far.
    pub fn capture_stats(&self) -> CaptureStats {
        self.stats
    }

    /// Number of outcomes in the ledger.
    pub fn ledger_len(&self) -> Result<u64> {
        ledger::len(&self.write)
    }

    fn check_usable(&self) -> Result<()> {
        if self.poisoned {
            return Err(Error::Poisoned);
        }
        if let Some(p) = &self.pending {
            return Err(Error::PublicationPending(p.txid));
        }
        Ok(())
    }

    fn check_migrations(&self) -> Result<()> {
        let applied = ledger::applied_migrations(&self.write)?;
        let declared = self.kind.migrations();
        if applied.len() > declared.len() {
            return Err(Error::MigrationsAhead {
                applied: applied.len(),
                declared: declared.len(),
            });
        }
        for (index, digest) in applied.iter().enumerate() {
            if *digest != migration_digest(&declared[index]) {
                return Err(Error::MigrationChanged { index });
            }
        }
        Ok(())
    }

    fn behind(&self) -> Result<bool> {
        // Migrations only ever run on open (or on the first group after an
        // aborted migration), so the cheap check comes first.
        Ok(self.published.txid == Txid::ZERO
            || self.migrations_declared > self.migrations_published
                && ledger::applied_migrations(&self.write)?.len() < self.migrations_declared)
    }

    /// Inside the group transaction: create the engine tables of a new Cell
    /// and run the kind's outstanding migrations.
    fn prepare_schema(&self) -> Result<()> {
        if !ledger::exists(&self.write)? {
            self.write.execute_batch(ledger::SCHEMA)?;
        }
        let applied = ledger::applied_migrations(&self.write)?.len();
        for (index, sql) in self.kind.migrations().iter().enumerate().skip(applied) {
            self.write_guard
                .run(Mode::Migration, || self.write.execute_batch(sql))
                .map_err(|e| Error::BadSql(format!("migration {index} fails: {e}")))?;
            ledger::record_migration(&self.write, index, &migration_digest(sql))?;
        }
        Ok(())
    }

    /// Checks that need no database: payload size, expiry, validity window.
    fn refuse_early(&self, command: &Command, now_ms: i64) -> Option<Rejection> {
        if command.expires_at_ms < now_ms {
            return Some(Rejection::new(
                RejectCode::Expired,
                format!(
                    "command expired at {} (now {now_ms})",
                    command.expires_at_ms
                ),
            ));
        }
        if command.expires_at_ms.saturating_sub(now_ms) > self.config.validity_ms_max {
            return Some(Rejection::new(
                RejectCode::LimitExceeded,
                format!(
                    "command expiry lies more than {} ms in the future",
                    self.config.validity_ms_max
                ),
            ));
        }
        let limits = self.kind.limits();
        let payload = command.name.len() as u64 + value_bytes(&command.args);
        if payload > limits.payload_bytes_max {
            return Some(Rejection::new(
                RejectCode::LimitExceeded,
                format!(
                    "payload of about {payload} bytes exceeds the limit of {}",
                    limits.payload_bytes_max
                ),
            ));
        }
        None
    }

    /// Execute `group` as one transaction and capture it.
    ///
    /// Each command runs in its own savepoint; a failing command rolls back
    /// only its savepoint and its rejection is recorded. A command id seen
    /// before with the same payload digest returns the stored outcome; with
    /// another digest it is refused. Expired commands are refused before
    /// anything runs. The returned publication is pending: call
    /// [`Cell::confirm`] once it is durable, or [`Cell::abort`].
    pub fn execute(&mut self, group: &[Command], now_ms: i64) -> Result<GroupResult> {
        self.check_usable()?;
        if group.len() > self.config.group_commands_max {
            return Err(Error::LimitExceeded {
                what: "group size",
                actual: group.len() as u64,
                limit: self.config.group_commands_max as u64,
            });
        }
        let txid = self.published.txid.next().ok_or(Error::TxidOverflow)?;
        self.write.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        let outcome = self.run_group(group, txid, now_ms);
        let (results, expiry_floor) = match outcome {
            Ok(v) => v,
            Err(e) => {
                // Nothing was committed: the published state is intact.
                self.ledger_expiry_floor = None;
                self.rollback()?;
                return Err(e);
            }
        };
        let Some(expiry_floor) = expiry_floor else {
            self.rollback()?;
            return Ok(GroupResult {
                results,
                publication: None,
            });
        };
        if let Err(e) = self.write.prepare_cached("COMMIT")?.execute([]) {
            self.ledger_expiry_floor = None;
            self.rollback()?;
            return Err(e.into());
        }
        // Undone by abort (which forgets the floor).
        self.ledger_expiry_floor = Some(expiry_floor);
        match self.capture(txid, now_ms) {
            Ok(publication) => Ok(GroupResult {
                results,
                publication: Some(publication),
            }),
            Err(e) => {
                // Committed locally but not captured: throw it away now.
                self.ledger_expiry_floor = None;
                if let Err(discard) = self.discard_unpublished(None) {
                    self.poisoned = true;
                    return Err(discard);
                }
                Err(e)
            }
        }
    }

    fn rollback(&self) -> Result<()> {
        if !self.write.is_autocommit() {
            self.write.prepare_cached("ROLLBACK")?.execute([])?;
        }
        Ok(())
    }

    /// Run the commands inside the open transaction; returns the results
    /// and, when the database changed, the new ledger expiry floor.
    fn run_group(
        &self,
        group: &[Command],
        txid: Txid,
        now_ms: i64,
    ) -> Result<(Vec<CommandResult>, Option<i64>)> {
        let behind = self.behind()?;
        let mut changed = behind;
        if behind {
            self.prepare_schema()?;
        }
        let kind_name = self.kind.name().to_string();
        let mut results = Vec::with_capacity(group.len());
        let mut recorded_expiry = i64::MAX;
        for command in group {
            if let Some(rejection) = self.refuse_early(command, now_ms) {
                results.push(CommandResult {
                    id: command.id,
                    outcome: Outcome::Rejected { rejection },
                    txid: None,
                    duplicate: false,
                });
                continue;
            }
            let digest = command.digest(&kind_name);
            if let Some(entry) = ledger::lookup(&self.write, &command.id)? {
                let result = if entry.digest == digest {
                    CommandResult {
                        id: command.id,
                        outcome: entry.outcome,
                        txid: Some(entry.txid),
                        duplicate: true,
                    }
                } else {
                    CommandResult {
                        id: command.id,
                        outcome: Outcome::Rejected {
                            rejection: Rejection::new(
                                RejectCode::IdReused,
                                "command id already used for a different payload",
                            ),
                        },
                        txid: None,
                        duplicate: false,
                    }
                };
                results.push(result);
                continue;
            }
            let outcome = self.run_command(command)?;
            ledger::record(
                &self.write,
                &command.id,
                &digest,
                txid,
                command.expires_at_ms,
                &outcome,
            )?;
            changed = true;
            recorded_expiry = recorded_expiry.min(command.expires_at_ms);
            results.push(CommandResult {
                id: command.id,
                outcome,
                txid: Some(txid),
                duplicate: false,
            });
        }
        if !changed {
            return Ok((results, None));
        }
        ledger::set_txid(&self.write, txid)?;
        let mut floor = match self.ledger_expiry_floor {
            Some(floor) => floor.min(recorded_expiry),
            None => ledger::earliest_expiry(&self.write)?,
        };
        // Pruning prepares anew on every run (SQLite re-plans a range
        // bound on an indexed column), so it runs only when some entry can
        // have expired.
        let cutoff = now_ms.saturating_sub(self.config.skew_margin_ms);
        if floor < cutoff {
            ledger::prune(&self.write, cutoff, self.config.ledger_prune_max)?;
            floor = ledger::earliest_expiry(&self.write)?;
        }
        Ok((results, Some(floor)))
    }

    /// One command in its own savepoint.
    fn run_command(&self, command: &Command) -> Result<Outcome> {
        self.write
            .prepare_cached("SAVEPOINT command")?
            .execute([])?;
        let limits = self.kind.limits();
        let ran = self.write_guard.run(Mode::Kind, || {
            self.kind.execute(&self.write, &command.name, &command.args)
        });
        let outcome = match ran {
            Ok(result) => {
                let bytes = value_bytes(&result);
                if bytes > limits.bytes_max {
                    Err(Rejection::new(
                        RejectCode::LimitExceeded,
                        format!(
                            "result of about {bytes} bytes exceeds the limit of {}",
                            limits.bytes_max
                        ),
                    ))
                } else {
                    Ok(result)
                }
            }
            Err(KindError::Rejected(r)) => Err(r),
            Err(KindError::Sqlite(e)) if is_fatal(&e) => {
                return Err(e.into());
            }
            Err(KindError::Sqlite(e)) => Err(rejection_of(e, self.write_guard.steps_max())),
        };
        match outcome {
            Ok(result) => {
                self.write.prepare_cached("RELEASE command")?.execute([])?;
                Ok(Outcome::Applied { result })
            }
            Err(rejection) => {
                self.write
                    .prepare_cached("ROLLBACK TO command")?
                    .execute([])?;
                self.write.prepare_cached("RELEASE command")?.execute([])?;
                Ok(Outcome::Rejected { rejection })
            }
        }
    }

    fn files(&self) -> Files<'_> {
        Files {
            db: &self.path,
            wal: &self.wal_path,
        }
    }

    /// Read the frames the last commit wrote and encode them.
    fn capture(&mut self, txid: Txid, now_ms: i64) -> Result<Publication> {
        let started = std::time::Instant::now();
        let captured = self.capture_inner(txid, now_ms);
        self.stats.captures_total += 1;
        self.stats.capture_nanos_total += started.elapsed().as_nanos() as u64;
        if let Ok(p) = &captured {
            self.stats.ltx_bytes_total += p.ltx.len() as u64;
        }
        captured
    }

    fn capture_inner(&mut self, txid: Txid, now_ms: i64) -> Result<Publication> {
        let committed: Committed =
            wal::read_committed(&self.wal_path, &self.capture.cursor, self.capture.page_size)?
                .ok_or_else(|| Error::Wal("a commit left no frames in the wal".into()))?;
        let pre = self.published;
        let undo = self.capture.apply(&committed);
        let encoded = self.capture.encode(
            &committed,
            pre,
            txid,
            now_ms,
            self.config.snapshot_delta_bytes,
            &self.files(),
        );
        match encoded {
            Ok(publication) => {
                self.pending = Some(Pending { txid, undo });
                Ok(publication)
            }
            Err(e) => {
                self.capture.undo(undo);
                Err(e)
            }
        }
    }

    /// The pending publication is durable: make it the published state.
    pub fn confirm(&mut self, txid: Txid) -> Result<Position> {
        if self.poisoned {
            return Err(Error::Poisoned);
        }
        let pending = self.pending.as_ref().ok_or(Error::NoPendingPublication)?;
        if pending.txid != txid {
            return Err(Error::WrongPublication {
                got: txid,
                pending: pending.txid,
            });
        }
        self.pending = None;
        // Every group applies outstanding migrations first.
        self.migrations_published = self.migrations_declared;
        self.published = Position {
            txid,
            checksum: self.capture.checksum,
        };
        if self.capture.cursor.offset >= self.config.checkpoint_wal_bytes {
            self.checkpoint()?;
        }
        Ok(self.published)
    }

    /// Throw the pending publication away: the Cell returns to its last
    /// published state (see the module docs for how).
    pub fn abort(&mut self) -> Result<()> {
        if self.poisoned {
            return Err(Error::Poisoned);
        }
        let pending = self.pending.take().ok_or(Error::NoPendingPublication)?;
        self.ledger_expiry_floor = None;
        if let Err(e) = self.discard_unpublished(Some(pending.undo)) {
            self.poisoned = true;
            return Err(e);
        }
        Ok(())
    }

    /// Cut the WAL back to the published cursor and reopen.
    fn discard_unpublished(&mut self, undo: Option<Undo>) -> Result<()> {
        let published_cursor = match undo {
            Some(undo) => {
                self.capture.undo(undo);
                self.capture.cursor
            }
            None => self.capture.cursor,
        };
        // Close both connections; neither checkpoints on close.
        let (placeholder_w, placeholder_r) =
            (Connection::open_in_memory()?, Connection::open_in_memory()?);
        drop(std::mem::replace(&mut self.write, placeholder_w));
        drop(std::mem::replace(&mut self.read, placeholder_r));
        if let Ok(wal) = OpenOptions::new().write(true).open(&self.wal_path) {
            if published_cursor.offset > 0 {
                let mut header = [0u8; 32];
                use std::io::Read;
                File::open(&self.wal_path)?.read_exact(&mut header)?;
                let salts = (
                    u32::from_be_bytes(header[16..20].try_into().expect("4 bytes")),
                    u32::from_be_bytes(header[20..24].try_into().expect("4 bytes")),
                );
                if salts != (published_cursor.salt1, published_cursor.salt2) {
                    return Err(Error::Wal(
                        "the wal was restarted by the unpublished transaction; recover the cell"
                            .into(),
                    ));
                }
            }
            wal.set_len(published_cursor.offset)?;
            wal.sync_all()?;
        }
        match std::fs::remove_file(&self.shm_path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
        let (write, write_guard) = open_connection(&self.path, false, &self.config)?;
        let (read, read_guard) = open_connection(&self.path, true, &self.config)?;
        self.write = write;
        self.write_guard = write_guard;
        self.read = read;
        self.read_guard = read_guard;
        let txid = ledger::txid(&self.write)?;
        if txid != self.published.txid {
            return Err(Error::Recovery(format!(
                "after discarding, the database is at txid {} instead of {}",
                txid.0, self.published.txid.0
            )));
        }
        Ok(())
    }

    /// Checkpoint the published WAL into the database file (TRUNCATE).
    pub fn checkpoint(&mut self) -> Result<()> {
        self.check_usable()?;
        checkpoint(&self.write)?;
        self.capture.checkpointed();
        Ok(())
    }

    /// A snapshot of the published state (to replace a chain that merging
    /// would not shrink).
    pub fn snapshot(&self, now_ms: i64) -> Result<Publication> {
        self.check_usable()?;
        if self.published.txid == Txid::ZERO {
            return Err(Error::BadParameters("an empty cell has no snapshot".into()));
        }
        self.capture.snapshot(self.published, now_ms, &self.files())
    }

    /// Run query `name` of the kind on the read-only connection.
    pub fn query(&self, name: &str, args: &Value) -> Result<Value> {
        self.check_usable()?;
        let limits = self.kind.limits();
        let payload = name.len() as u64 + value_bytes(args);
        if payload > limits.payload_bytes_max {
            return Err(Error::LimitExceeded {
                what: "query payload bytes",
                actual: payload,
                limit: limits.payload_bytes_max,
            });
        }
        let ran = self
            .read_guard
            .run(Mode::Kind, || self.kind.query(&self.read, name, args));
        let value = match ran {
            Ok(v) => v,
            Err(KindError::Rejected(r)) => return Err(Error::Rejected(r)),
            Err(KindError::Sqlite(e)) if is_fatal(&e) => return Err(e.into()),
            Err(KindError::Sqlite(e)) => {
                return Err(Error::Rejected(rejection_of(
                    e,
                    self.read_guard.steps_max(),
                )))
            }
        };
        let bytes = value_bytes(&value);
        if bytes > limits.bytes_max {
            return Err(Error::LimitExceeded {
                what: "query result bytes",
                actual: bytes,
                limit: limits.bytes_max,
            });
        }
        Ok(value)
    }

    /// Close the Cell. A pending publication is left in the WAL and makes
    /// the next [`Cell::open`] refuse the file (recover it instead).
    pub fn close(self) {}
}

fn open_connection(
    path: &Path,
    read_only: bool,
    config: &CellConfig,
) -> Result<(Connection, Guard)> {
    // A database with no page yet takes the configured page size.
    let exists = std::fs::metadata(path)
        .map(|m| m.len() > 0)
        .unwrap_or(false);
    let flags = if read_only {
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX
    } else {
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
    };
    let mut conn = Connection::open_with_flags(path, flags)?;
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)?;
    if !read_only {
        if !exists {
            conn.execute_batch(&format!(
                "PRAGMA page_size = {}; PRAGMA auto_vacuum = {};",
                config.page_size,
                if config.auto_vacuum { "FULL" } else { "NONE" }
            ))?;
        }
        let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(Error::Wal(format!("journal mode is {mode}, not wal")));
        }
        conn.execute_batch("PRAGMA wal_autocheckpoint = 0; PRAGMA synchronous = NORMAL;")?;
    } else {
        conn.execute_batch("PRAGMA query_only = 1;")?;
    }
    let guard = Guard::install(&mut conn, config.statement_steps_max)?;
    Ok((conn, guard))
}

fn checkpoint(conn: &Connection) -> Result<()> {
    let (busy, _log, _done): (i64, i64, i64) =
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })?;
    if busy != 0 {
        return Err(Error::Wal(
            "checkpoint could not complete: a reader holds the wal".into(),
        ));
    }
    Ok(())
}
