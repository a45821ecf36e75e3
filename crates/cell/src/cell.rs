//! The Cell engine: one SQLite database with one writer, executing groups
//! of commands as single transactions and capturing each as one LTX file.
//!
//! Publications are pipelined: up to [`CellConfig::pending_publications_max`]
//! captured groups may wait for the caller to make them durable. Each one
//! builds on the one before it ([`Publication::pre`] is the previous pending
//! publication's `post`), so they are confirmed in TXID order, and aborting
//! voids all of them.
//!
//! Ordering, the rules this file keeps:
//! - Automatic checkpoints are off and connections never checkpoint on
//!   close; the WAL is checkpointed (TRUNCATE) only when nothing is pending,
//!   after the caller [`Cell::confirm`]s the publication of everything in
//!   it. While anything is pending the WAL holds unpublished frames, and
//!   [`Cell::execute`] refuses a new group once the WAL has outgrown
//!   [`CellConfig::checkpoint_wal_bytes`], so the pipeline drains and the
//!   WAL stays bounded.
//! - Queries answer from the published (confirmed) state only, and are
//!   never refused because something is pending. Before a group's
//!   `BEGIN IMMEDIATE`, a read connection opens a read transaction on the
//!   state the group builds on (a *pin*, see [`crate::reader`]): the
//!   published state when nothing is pending, else the newest pending one.
//!   Queries run on the pin of the published state; on confirm the next
//!   pending state's pin takes its place, and when nothing is left pending
//!   the pin is released (the latest state then *is* the published one).
//!   Pins are verified (the TXID read through the pin) when they are taken,
//!   and after every query: a pin that SQLite dropped (an I/O error rolls
//!   a transaction back) makes queries refuse until nothing is pending,
//!   never answer from pending state.
//! - [`Cell::abort`] voids every pending publication and rebuilds the last
//!   published state from local files: every connection is closed, the WAL
//!   is cut back to the end of the last published frame, the shared-memory
//!   index is deleted so SQLite rebuilds it from the WAL, the captured
//!   checksums are restored from the undo records (newest first), and the
//!   TXID read back from the database must equal the published one. If any
//!   step fails the Cell is poisoned and the caller must close it and
//!   [`crate::recover`] from the published chain.
//! - The ledger is exactly-once across the pipeline: a command id whose
//!   first execution is still pending returns the stored outcome together
//!   with [`CommandResult::depends_on_txid`], the pending TXID the answer
//!   rests on; if that publication is aborted the answer is void (and the
//!   id is free again, since the aborted group's ledger rows are gone).
//! - [`Cell::open`] checkpoints whatever the files hold and then refuses to
//!   serve unless the database is exactly at the published position.

use std::cell::OnceCell;
use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cellfleet_ltx::{Compression, Position, Txid};
use rusqlite::Connection;
use serde_json::Value;

use crate::capture::{CaptureState, Files, Publication, Undo};
use crate::command::{Command, CommandId, CommandResult, Outcome, RejectCode, Rejection};
pub use crate::connection::CellConfig;
use crate::connection::{checkpoint, open_connection, open_writer, sidecar};
use crate::guard::{Guard, Mode};
use crate::kind::{Kind, KindError};
use crate::live::{self, Claim};
use crate::reader::{Pin, Reader};
use crate::sql::value_bytes;
use crate::wal::{self, Committed};
use crate::{ledger, Error, Result};

/// A query's value and the published position it was read at.
#[derive(Clone, Debug, PartialEq)]
pub struct QueryAnswer {
    /// What the query returned.
    pub value: Value,
    /// The published state it read (TXID and checksum).
    pub position: Position,
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

/// A freshly opened Cell, with the migration it had to run (pending;
/// `None` when nothing was due or [`CellConfig::defer_migrations`] left it
/// to the next group).
#[derive(Debug)]
pub struct Opened {
    pub cell: Cell,
    pub migration: Option<Publication>,
}

/// One captured group waiting for [`Cell::confirm`] or [`Cell::abort`].
#[derive(Debug)]
struct Pending {
    post: Position,
    undo: Undo,
    /// A reader pinned at `post`, taken before the next group committed;
    /// `None` while this is the newest pending publication (its state is
    /// the latest one, and nothing needs to hold it).
    reader: Option<Reader>,
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
    /// Queries run here: pinned at the published state while anything is
    /// pending, free (and so seeing the published state) otherwise. Opened
    /// with the Cell, or with [`CellConfig::reader_on_demand`] on the first
    /// query or by a group executed after [`Cell::want_view`] (a Cell only
    /// written then holds one connection: descriptors are what bounds the
    /// Cells a node keeps open).
    published_reader: OnceCell<Reader>,
    /// Free readers for the next pins, opened on first need (at most
    /// `pending_publications_max - 1` are ever pinned at once besides the
    /// published one).
    spare_readers: Vec<Reader>,
    /// The next group pins a published reader even if none is open yet:
    /// someone asked for the published state while a group was pending.
    view_wanted: bool,
    capture: CaptureState,
    published: Position,
    /// Oldest first; at most `pending_publications_max`.
    pending: VecDeque<Pending>,
    poisoned: bool,
    stats: CaptureStats,
    /// A lower bound of the expiry at the ledger's front (`i64::MAX` when
    /// it is empty), so groups skip the prune statement when nothing can
    /// have expired; `None` when unknown (after open, unless the file was
    /// just written from its template, or after abort or an error).
    ledger_expiry_floor: Option<i64>,
    /// Where each id's ledger row is, as of the write connection's state
    /// (pending groups included); `None` when it may be out of step (after
    /// open, unless the file was just written from its template, or after
    /// abort or an error), and then read again by the next group.
    ledger_index: Option<ledger::Index>,
    /// The next group runs each command in its own savepoint from the
    /// start: the last group had a rejected command. Otherwise a group
    /// runs without them and starts over with them only when a command is
    /// rejected ([`Cell::run_transaction`]).
    group_savepoints: bool,
    migrations_declared: usize,
    /// Applied migrations as of the published state (a lower bound).
    migrations_published: usize,
    /// The file holds the engine's tables and every declared migration
    /// whatever the groups do (it was written from its kind's template),
    /// so a group that finds the Cell behind has nothing to create.
    schema_in_file: bool,
    /// Keeps other engines of this process (and recovery) off these
    /// files; dropped after the connections.
    claim: Claim,
}

/// How a group's run inside its transaction ended ([`Cell::run_group`]).
enum GroupRun {
    /// Every command has its result; `expiry_floor` is `Some` when the
    /// database changed; `rejected` when a command's kind rejected it.
    Done {
        results: Vec<CommandResult>,
        expiry_floor: Option<i64>,
        rejected: bool,
    },
    /// Roll the transaction back, put the index entries of the `recorded`
    /// ids back as they were before the run, and run the group again with
    /// savepoints: a command was
    /// rejected with no savepoint to roll back to, or (`lost`) a command
    /// lost the whole transaction, and runs again as that rejection
    /// without running.
    Again {
        recorded: Vec<Recorded>,
        lost: Option<([u8; 16], Rejection)>,
    },
    /// A command needed more than the run's step budget, which is below
    /// the configured one: roll the transaction back, put the `recorded`
    /// ids' index entries back, and leave the group for the caller to run
    /// again with the full budget.
    StoppedShort { recorded: Vec<Recorded> },
}

/// How [`Cell::run_group`] runs the commands of a group.
struct RunRules<'a> {
    /// Each command in its own savepoint.
    savepoints: bool,
    /// Commands that lost the whole transaction in an earlier run:
    /// rejected without running.
    lost: &'a [([u8; 16], Rejection)],
    /// VM steps each command's kind code may take (at most the configured
    /// budget; below it, a command past it stops the group short).
    steps: u64,
}

/// An id a group's run recorded, with the row its index entry named
/// before (an id whose window ended can run again).
type Recorded = ([u8; 16], Option<i64>);

/// How one command ran ([`Cell::run_command`]).
enum Ran {
    /// Its outcome; a rejected command's writes are rolled back.
    Done(Outcome),
    /// Rejected with no savepoint: its writes are still in the transaction.
    Undo,
    /// Rejected, and the transaction is gone: SQLite rolled it back.
    Lost(Rejection),
    /// Interrupted by a step budget below the configured one (whatever
    /// the kind made of the interruption).
    StoppedShort,
}

/// The ledger index as it was before a group's run that is rolled back:
/// each id the run `recorded` named no row, or (its window ended) an older
/// one. An index the run read from the table (`was_known` false) goes: it
/// may describe a layout upgrade the rollback undid.
fn index_before(
    mut index: Option<ledger::Index>,
    recorded: &[Recorded],
    was_known: bool,
) -> Option<ledger::Index> {
    if let Some(index) = index.as_mut() {
        for (id, before) in recorded.iter().rev() {
            match before {
                Some(seq) => index.insert(*id, *seq),
                None => index.remove(id),
            };
        }
    }
    index.filter(|_| was_known)
}

/// Whether the WAL at `path` holds no byte (or does not exist).
fn wal_is_empty(path: &Path) -> Result<bool> {
    match std::fs::metadata(path) {
        Ok(meta) => Ok(meta.len() == 0),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(e.into()),
    }
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

fn over_budget(steps_max: u64) -> Rejection {
    Rejection::new(
        RejectCode::LimitExceeded,
        format!("statement exceeded the budget of {steps_max} steps"),
    )
}

fn rejection_of(e: rusqlite::Error, steps_max: u64) -> Rejection {
    if let rusqlite::Error::SqliteFailure(f, _) = &e {
        if f.code == rusqlite::ErrorCode::OperationInterrupted {
            return over_budget(steps_max);
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
    /// A new Cell's file is written from its kind's template, the database
    /// its migrations make, when the kind has one (`template.rs`).
    /// When the kind declares migrations the Cell has not applied (or the
    /// Cell is new) they run now as one captured transaction, returned as
    /// [`Opened::migration`] and pending like any group; with
    /// [`CellConfig::defer_migrations`] the next group runs them instead.
    ///
    /// [`Error::OutOfFiles`] when the process could open no more files: the
    /// file is not at fault then, and must not be rebuilt.
    pub fn open(
        path: &Path,
        kind: Arc<dyn Kind>,
        config: CellConfig,
        published: Position,
        now_ms: i64,
    ) -> Result<Opened> {
        Self::open_unclassified(path, kind, config, published, now_ms)
            .map_err(|error| crate::connection::classify_open_error(path, error))
    }

    fn open_unclassified(
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
        if config.pending_publications_max == 0 {
            return Err(Error::BadParameters(
                "pending_publications_max must be at least 1".into(),
            ));
        }
        let claim = live::claim(path)?;
        let exists = path.exists();
        if !exists && published != Position::EMPTY {
            return Err(Error::Missing(published));
        }
        let wal_path = sidecar(path, "-wal");
        let shm_path = sidecar(path, "-shm");
        // The kind's migrations, asked for once: a template made from them
        // is what this Cell then counts as applied.
        let migrations = kind.migrations();
        // A new Cell, and no WAL of an earlier one at this path: its file
        // starts as its kind's template, when the kind has one.
        let template = if !exists && !wal_path.exists() {
            crate::template::of(kind.name(), &migrations, &config)
        } else {
            None
        };
        let (write, write_guard, header) = open_writer(path, &config, template.as_deref())?;
        // A file just written from its kind's template holds what the
        // template build made in this process: the configured page size,
        // an empty WAL, TXID 0 and every declared migration. Reading those
        // back would only repeat SQL each new Cell parses afresh.
        let from_template = template.is_some();
        if !from_template && !wal_is_empty(&wal_path)? {
            // Whatever the WAL holds goes into the file; the position check
            // below decides whether that is the published state. An empty
            // or missing WAL (a parked Cell's, or a closed one's) holds
            // nothing: the checkpoint would only compile its pragma.
            checkpoint(&write, &wal_path)?;
        }
        // A WAL database's page size never changes, so its header (read
        // before the open) holds it; a file without one takes the
        // configured size, as SQLite gave it.
        let page_size = match header {
            Some(header) => header.page_size,
            None if exists => write.query_row("PRAGMA page_size", [], |r| r.get::<_, u32>(0))?,
            None => config.page_size,
        };
        let capture = CaptureState::from_database(path, page_size, config.ltx_checksums_in_file)?;
        let found = Position {
            txid: if from_template {
                Txid::ZERO
            } else {
                ledger::txid(&write)?
            },
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
        let published_reader = OnceCell::new();
        if !config.reader_on_demand {
            let _ = published_reader.set(Reader::open(path, &config)?);
        }
        write.set_prepared_statement_cache_capacity(64);
        let mut cell = Cell {
            path: path.to_path_buf(),
            wal_path,
            shm_path,
            kind,
            config,
            write,
            write_guard,
            published_reader,
            view_wanted: false,
            spare_readers: Vec::new(),
            capture,
            published,
            pending: VecDeque::new(),
            poisoned: false,
            stats: CaptureStats::default(),
            ledger_expiry_floor: None,
            ledger_index: None,
            group_savepoints: false,
            migrations_declared: 0,
            migrations_published: 0,
            schema_in_file: from_template,
            claim,
        };
        if from_template {
            // The template's ledger is empty: no row to index, nothing to
            // prune, and the current layout.
            cell.ledger_index = Some(ledger::Index::default());
            cell.ledger_expiry_floor = Some(i64::MAX);
        }
        cell.migrations_declared = migrations.len();
        cell.migrations_published = if from_template {
            cell.migrations_declared
        } else {
            cell.check_migrations()?
        };
        let migration = if cell.config.defer_migrations {
            None
        } else {
            cell.migrate(now_ms)?
        };
        Ok(Opened { cell, migration })
    }

    /// The published position: the state the caller last
    /// [`Cell::confirm`]ed (or opened at), which queries answer from and
    /// the authority root names.
    pub fn published_position(&self) -> Position {
        self.published
    }

    /// The position of the latest executed state, which the next group
    /// builds on: the newest pending publication's `post`, or the published
    /// position when nothing is pending.
    pub fn position(&self) -> Position {
        self.pending.back().map_or(self.published, |p| p.post)
    }

    /// The TXID of the oldest pending publication (the one to confirm
    /// next), if any.
    pub fn pending_txid(&self) -> Option<Txid> {
        self.pending.front().map(|p| p.post.txid)
    }

    /// The TXIDs of all pending publications, oldest first.
    pub fn pending_txids(&self) -> Vec<Txid> {
        self.pending.iter().map(|p| p.post.txid).collect()
    }

    /// Whether [`Cell::execute`] would take a group now: the Cell is not
    /// poisoned, fewer than [`CellConfig::pending_publications_max`]
    /// publications are pending, and the WAL is not waiting for the
    /// pipeline to drain so it can be checkpointed. A caller that drains a
    /// mailbox into a group asks this first and otherwise waits for a
    /// confirm.
    pub fn can_execute(&self) -> bool {
        self.check_executable().is_ok()
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

    /// Number of outcomes in the ledger, pending ones included.
    pub fn ledger_len(&self) -> Result<u64> {
        ledger::len(&self.write)
    }

    fn check_not_poisoned(&self) -> Result<()> {
        if self.poisoned {
            return Err(Error::Poisoned);
        }
        Ok(())
    }

    /// Usable, and nothing pending.
    fn check_settled(&self) -> Result<()> {
        self.check_not_poisoned()?;
        if let Some(txid) = self.pending_txid() {
            return Err(Error::PublicationPending(txid));
        }
        Ok(())
    }

    fn check_executable(&self) -> Result<()> {
        self.check_not_poisoned()?;
        let Some(oldest) = self.pending_txid() else {
            return Ok(());
        };
        if self.pending.len() >= self.config.pending_publications_max {
            return Err(Error::PipelineFull {
                oldest,
                pending: self.pending.len(),
            });
        }
        if self.capture.cursor.offset >= self.config.checkpoint_wal_bytes {
            return Err(Error::CheckpointDue {
                oldest,
                wal_bytes: self.capture.cursor.offset,
            });
        }
        Ok(())
    }

    /// Checks the applied migrations against the declared ones and returns
    /// how many are applied.
    fn check_migrations(&self) -> Result<usize> {
        let applied = ledger::applied_migrations(&self.write)?;
        let declared = self.kind.migrations();
        if applied.len() > declared.len() {
            return Err(Error::MigrationsAhead {
                applied: applied.len(),
                declared: declared.len(),
            });
        }
        for (index, digest) in applied.iter().enumerate() {
            if *digest != ledger::migration_digest(&declared[index]) {
                return Err(Error::MigrationChanged { index });
            }
        }
        Ok(applied.len())
    }

    /// Whether the Cell's state, pending groups included, lacks the engine's
    /// tables or one of the kind's migrations: the next group applies them
    /// first. Only true after an open with
    /// [`CellConfig::defer_migrations`], or after a group that failed to
    /// apply them.
    pub fn schema_due(&self) -> Result<bool> {
        self.check_not_poisoned()?;
        self.behind()
    }

    /// Applies what [`Cell::schema_due`] reports as one group without
    /// commands, pending like any group; `None` when nothing was due.
    pub fn migrate(&mut self, now_ms: i64) -> Result<Option<Publication>> {
        if !self.behind()? {
            return Ok(None);
        }
        Ok(self.execute(&[], now_ms)?.publication)
    }

    fn behind(&self) -> Result<bool> {
        // Migrations only ever run on open (or on the first group after an
        // aborted migration), so the cheap check comes first.
        Ok(self.position().txid == Txid::ZERO
            || self.migrations_declared > self.migrations_published
                && ledger::applied_migrations(&self.write)?.len() < self.migrations_declared)
    }

    /// Inside the group transaction: create the engine tables of a new Cell
    /// and run the kind's outstanding migrations.
    fn prepare_schema(&self) -> Result<()> {
        if self.schema_in_file {
            return Ok(());
        }
        crate::template::apply_schema(&self.write, &self.write_guard, &self.kind.migrations())
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
        let payload = crate::sql::payload_bytes(&command.name, &command.args);
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
    /// A failing command's writes are rolled back and its rejection is
    /// recorded; the group's other commands keep theirs (see
    /// [`Cell::run_transaction`] for how). A command id seen
    /// before with the same payload digest returns the stored outcome; with
    /// another digest it is refused (the ledger answers first, even past the
    /// command's expiry). Other expired commands are refused before
    /// anything runs. The returned publication is pending: call
    /// [`Cell::confirm`] once it is durable, or [`Cell::abort`].
    ///
    /// Earlier publications may still be pending (up to
    /// [`CellConfig::pending_publications_max`]); the group then builds on
    /// the newest of them, and each result's
    /// [`CommandResult::depends_on_txid`] says which publication must be
    /// confirmed before it may be released. Refused with
    /// [`Error::PipelineFull`] or [`Error::CheckpointDue`] (nothing ran)
    /// when [`Cell::can_execute`] is false.
    pub fn execute(&mut self, group: &[Command], now_ms: i64) -> Result<GroupResult> {
        // The full budget never stops a command short: over it, the
        // command is rejected as over its limit.
        self.execute_within(group, now_ms, u64::MAX)?
            .ok_or_else(|| Error::Rejected(over_budget(self.config.statement_steps_max)))
    }

    /// [`Cell::execute`] with each command's kind code within `steps` VM
    /// instructions: `None` when a budget below the configured
    /// `statement_steps_max` stopped a command short, whatever the kind
    /// made of the interruption. Then nothing of the group happened (its
    /// transaction is rolled back, the ledger index as it was), and the
    /// caller may run it again with the full budget.
    pub fn execute_within(
        &mut self,
        group: &[Command],
        now_ms: i64,
        steps: u64,
    ) -> Result<Option<GroupResult>> {
        self.check_executable()?;
        if group.len() > self.config.group_commands_max {
            return Err(Error::LimitExceeded {
                what: "group size",
                actual: group.len() as u64,
                limit: self.config.group_commands_max as u64,
            });
        }
        let head = self.position();
        let txid = head.txid.next().ok_or(Error::TxidOverflow)?;
        // Hold the state this group builds on before it can change (which
        // answers a wish for a reader: kept for the run again if this one
        // stops short).
        let view_wanted = self.view_wanted;
        self.pin_head(head.txid)?;
        let (results, expiry_floor) = match self.run_transaction(group, txid, now_ms, steps) {
            Ok(Some(v)) => v,
            Ok(None) => {
                self.unpin_head()?;
                self.view_wanted |= view_wanted;
                return Ok(None);
            }
            Err(e) => {
                // Nothing was committed: the state is intact.
                self.forget_ledger();
                self.unpin_head()?;
                return Err(e);
            }
        };
        let results = match expiry_floor {
            Some(floor) => {
                // Undone by abort (which forgets the floor).
                self.ledger_expiry_floor = Some(floor);
                results
            }
            None => {
                self.unpin_head()?;
                return Ok(Some(GroupResult {
                    results,
                    publication: None,
                }));
            }
        };
        match self.capture(txid, now_ms) {
            Ok(publication) => Ok(Some(GroupResult {
                results,
                publication: Some(publication),
            })),
            Err(e) => {
                // Committed locally but not captured: throw it away now.
                self.forget_ledger();
                if !self.pending.is_empty() {
                    // Cutting the WAL back would drop the pins of the
                    // pending states, which cannot be taken again.
                    self.poisoned = true;
                    return Err(e);
                }
                if let Err(discard) = self.discard_unpublished() {
                    self.poisoned = true;
                    return Err(discard);
                }
                Err(e)
            }
        }
    }

    /// BEGIN, run the group, and COMMIT when it changed anything (the new
    /// ledger expiry floor is then `Some`) or roll back when not.
    ///
    /// A savepoint per command (`SAVEPOINT`, `RELEASE`) was about a ninth
    /// of a command's instructions at group 16 (BENCHMARKS.md), and only a
    /// command its kind rejects needs one, to roll back its own writes. So
    /// a group first runs without them; when a command is rejected, the
    /// whole transaction is rolled back and the group runs again from the
    /// start, each command in its own savepoint. Nothing of the first run
    /// was seen by anyone, so the second run's outcomes are the group's.
    /// The Cell's next group starts with savepoints when this one had a
    /// rejection, so a workload that keeps being rejected runs each group
    /// once.
    ///
    /// `None` when a command stopped short at `steps` ([`GroupRun::StoppedShort`]):
    /// rolled back, nothing of the run left in the index.
    fn run_transaction(
        &mut self,
        group: &[Command],
        txid: Txid,
        now_ms: i64,
        steps: u64,
    ) -> Result<Option<(Vec<CommandResult>, Option<i64>)>> {
        let mut savepoints = self.group_savepoints;
        // Commands that lost the whole transaction: rejected without
        // running when the group runs again.
        let mut lost: Vec<([u8; 16], Rejection)> = Vec::new();
        loop {
            self.write.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
            // Taken out while the group runs: an error leaves it `None`.
            let mut index = self.ledger_index.take();
            let index_was_known = index.is_some();
            let rules = RunRules {
                savepoints,
                lost: &lost,
                steps,
            };
            let run = self.run_group(group, txid, now_ms, &mut index, &rules);
            let (results, expiry_floor, rejected) = match run {
                Ok(GroupRun::Done {
                    results,
                    expiry_floor,
                    rejected,
                }) => (results, expiry_floor, rejected),
                Ok(GroupRun::Again {
                    recorded,
                    lost: lost_now,
                }) => {
                    self.rollback()?;
                    lost.extend(lost_now);
                    self.ledger_index = index_before(index, &recorded, index_was_known);
                    savepoints = true;
                    continue;
                }
                Ok(GroupRun::StoppedShort { recorded }) => {
                    self.rollback()?;
                    self.ledger_index = index_before(index, &recorded, index_was_known);
                    return Ok(None);
                }
                Err(e) => {
                    self.rollback()?;
                    return Err(e);
                }
            };
            self.group_savepoints = rejected;
            if expiry_floor.is_none() {
                // Nothing changed: the index still matches the database.
                self.rollback()?;
                self.ledger_index = index;
                return Ok(Some((results, None)));
            }
            if let Err(e) = self.write.prepare_cached("COMMIT")?.execute([]) {
                self.rollback()?;
                return Err(e.into());
            }
            self.ledger_index = index;
            return Ok(Some((results, expiry_floor)));
        }
    }

    /// Pin a reader at the latest state (`head`) before a group changes
    /// it: the published reader when nothing is pending, else a spare one
    /// kept by the newest pending publication. With
    /// [`CellConfig::reader_on_demand`] nothing is pinned while the Cell
    /// has no reader and nobody asked for one ([`Cell::want_view`]): a
    /// read during this group's publication then waits for its confirm.
    fn pin_head(&mut self, head: Txid) -> Result<()> {
        let keep_view = !self.config.reader_on_demand
            || self.published_reader.get().is_some()
            || self.view_wanted;
        if !keep_view {
            return Ok(());
        }
        self.view_wanted = false;
        if self.pending.is_empty() {
            if self.published_reader.get().is_none() {
                let _ = self.published_reader.set(self.open_reader()?);
            }
            let reader = self.published_reader.get_mut().expect("opened above");
            return reader.pin_at(head);
        }
        let mut reader = match self.spare_readers.pop() {
            Some(reader) => reader,
            None => self.open_reader()?,
        };
        if let Err(e) = reader.pin_at(head) {
            self.spare_readers.push(reader);
            return Err(e);
        }
        let newest = self.pending.back_mut().expect("something is pending");
        debug_assert!(newest.reader.is_none());
        newest.reader = Some(reader);
        Ok(())
    }

    /// Undo [`Cell::pin_head`] after a group that left the state alone.
    fn unpin_head(&mut self) -> Result<()> {
        let Some(newest) = self.pending.back_mut() else {
            return match self.published_reader.get_mut() {
                Some(reader) => reader.unpin(),
                None => Ok(()),
            };
        };
        if let Some(mut reader) = newest.reader.take() {
            reader.unpin()?;
            self.spare_readers.push(reader);
        }
        Ok(())
    }

    /// Drops what the Cell keeps in memory about its ledger (the expiry
    /// floor and the index): the next group reads them again.
    fn forget_ledger(&mut self) {
        self.ledger_expiry_floor = None;
        self.ledger_index = None;
    }

    fn rollback(&self) -> Result<()> {
        if !self.write.is_autocommit() {
            self.write.prepare_cached("ROLLBACK")?.execute([])?;
        }
        Ok(())
    }

    /// Run the commands inside the open transaction as `rules` say (each
    /// in its own savepoint, the lost ones rejected without running, within
    /// a step budget); returns the results and, when the database changed,
    /// the new ledger expiry floor, or [`GroupRun::Again`] when a command
    /// was rejected with no savepoint to roll back to, or lost the
    /// transaction, or [`GroupRun::StoppedShort`] when one needed more
    /// steps than the budget.
    fn run_group(
        &self,
        group: &[Command],
        txid: Txid,
        now_ms: i64,
        index: &mut Option<ledger::Index>,
        rules: &RunRules<'_>,
    ) -> Result<GroupRun> {
        let behind = self.behind()?;
        let mut changed = behind;
        if behind {
            self.prepare_schema()?;
        }
        let (index, upgraded) = self.load_ledger_index(index)?;
        changed |= upgraded;
        let kind_name = self.kind.name().to_string();
        let mut results = Vec::with_capacity(group.len());
        let mut recorded_expiry = i64::MAX;
        let mut recorded = Vec::new();
        let mut rejected = false;
        for command in group {
            // The ledger first: a retry of a committed command gets its
            // stored outcome even when it arrives after its expiry (its
            // entry is kept until expiry plus the skew margin).
            let digest = command.digest(&kind_name);
            if let Some(result) = self.stored_result(index, command, &digest, now_ms)? {
                results.push(result);
                continue;
            }
            if let Some(rejection) = self.refuse_early(command, now_ms) {
                results.push(CommandResult {
                    id: command.id,
                    outcome: Outcome::Rejected { rejection },
                    txid: None,
                    duplicate: false,
                    depends_on_txid: None,
                });
                continue;
            }
            let decided = rules
                .lost
                .iter()
                .find(|(id, _)| *id == command.id.0)
                .map(|(_, rejection)| rejection.clone());
            let outcome = match decided {
                Some(rejection) => Outcome::Rejected { rejection },
                None => match self.run_command(command, rules.savepoints, rules.steps)? {
                    Ran::Done(outcome) => outcome,
                    Ran::Undo => {
                        return Ok(GroupRun::Again {
                            recorded,
                            lost: None,
                        })
                    }
                    Ran::Lost(rejection) => {
                        return Ok(GroupRun::Again {
                            recorded,
                            lost: Some((command.id.0, rejection)),
                        })
                    }
                    Ran::StoppedShort => return Ok(GroupRun::StoppedShort { recorded }),
                },
            };
            let (result, before) = self.record(command, &digest, txid, index, outcome)?;
            rejected |= matches!(result.outcome, Outcome::Rejected { .. });
            recorded.push((command.id.0, before));
            results.push(result);
            changed = true;
            recorded_expiry = recorded_expiry.min(command.expires_at_ms);
        }
        if !changed {
            return Ok(GroupRun::Done {
                results,
                expiry_floor: None,
                rejected,
            });
        }
        let floor = self.stamp_and_prune_ledger(txid, now_ms, recorded_expiry, index)?;
        Ok(GroupRun::Done {
            results,
            expiry_floor: Some(floor),
            rejected,
        })
    }

    /// The ledger index the group works with: the one kept in memory, or,
    /// when it is unknown, loaded from the ledger after upgrading the
    /// ledger's layout (it may be an older one). The flag says whether the
    /// upgrade changed the database, so the group must commit.
    fn load_ledger_index<'a>(
        &self,
        index: &'a mut Option<ledger::Index>,
    ) -> Result<(&'a mut ledger::Index, bool)> {
        match index {
            Some(index) => Ok((index, false)),
            None => {
                // Unknown: the layout may be an older one too.
                let upgraded = ledger::upgrade(&self.write)?;
                Ok((index.insert(ledger::load(&self.write)?), upgraded))
            }
        }
    }

    /// The answer the ledger already holds for `command`, if `index` names
    /// its id and the entry's window has not ended at `now_ms`: the stored
    /// outcome when the payload `digest` matches (a retry), else a refusal
    /// (the id was reused for another payload). Either answer depends on
    /// the publication of the group that stored the entry while that group
    /// is not confirmed.
    fn stored_result(
        &self,
        index: &ledger::Index,
        command: &Command,
        digest: &[u8; 32],
        now_ms: i64,
    ) -> Result<Option<CommandResult>> {
        let Some(&seq) = index.get(&command.id.0) else {
            return Ok(None);
        };
        let entry = ledger::get(&self.write, seq, &command.id)?.ok_or_else(|| {
            Error::Recovery("the ledger index names a row the table lacks".into())
        })?;
        if !entry.answers_at(now_ms, self.config.skew_margin_ms) {
            // Past its window, waiting for the front of the ledger to be
            // pruned: the id is free, as if the row were gone.
            return Ok(None);
        }
        // An entry of a pending group (or of this one) stands only
        // if that group's publication is confirmed.
        let depends_on_txid = (entry.txid > self.published.txid).then_some(entry.txid);
        let result = if entry.digest == *digest {
            CommandResult {
                id: command.id,
                outcome: entry.outcome,
                txid: Some(entry.txid),
                duplicate: true,
                depends_on_txid,
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
                depends_on_txid,
            }
        };
        Ok(Some(result))
    }

    /// Records the outcome of a command the ledger did not know (in the
    /// ledger table and `index`) under the group's `txid`, so a retry gets
    /// the same answer; the result depends on this group's publication.
    /// Also returns the row `index` named for the id before, if any.
    fn record(
        &self,
        command: &Command,
        digest: &[u8; 32],
        txid: Txid,
        index: &mut ledger::Index,
        outcome: Outcome,
    ) -> Result<(CommandResult, Option<i64>)> {
        let seq = ledger::record(
            &self.write,
            &command.id,
            digest,
            txid,
            command.expires_at_ms,
            &outcome,
        )?;
        let before = index.insert(command.id.0, seq);
        let result = CommandResult {
            id: command.id,
            outcome,
            txid: Some(txid),
            duplicate: false,
            depends_on_txid: Some(txid),
        };
        Ok((result, before))
    }

    /// After a group that changed the database: stamps its `txid` into the
    /// ledger and, when the front entry's expiry is past (expiry plus the
    /// skew margin), prunes at most `ledger_prune_max` such entries from the
    /// front (from the table and `index`); returns the new ledger expiry
    /// floor.
    /// `recorded_expiry` is the earliest expiry the group recorded
    /// (`i64::MAX` when it recorded none).
    fn stamp_and_prune_ledger(
        &self,
        txid: Txid,
        now_ms: i64,
        recorded_expiry: i64,
        index: &mut ledger::Index,
    ) -> Result<i64> {
        ledger::set_txid(&self.write, txid)?;
        let mut floor = match self.ledger_expiry_floor {
            Some(floor) => floor.min(recorded_expiry),
            None => ledger::front_expiry(&self.write)?,
        };
        // A group's own entries expire in the future, so this holds on
        // every group only when the front has expired.
        let cutoff = now_ms.saturating_sub(self.config.skew_margin_ms);
        if floor < cutoff {
            for (id, seq) in ledger::prune(&self.write, cutoff, self.config.ledger_prune_max)? {
                // The id may have run again since, in a newer row.
                if index.get(&id) == Some(&seq) {
                    index.remove(&id);
                }
            }
            floor = ledger::front_expiry(&self.write)?;
        }
        Ok(floor)
    }

    /// One command, in its own savepoint when `savepoint`, its kind code
    /// within `steps` VM instructions (at most the configured budget).
    fn run_command(&self, command: &Command, savepoint: bool, steps: u64) -> Result<Ran> {
        if savepoint {
            self.write
                .prepare_cached("SAVEPOINT command")?
                .execute([])?;
        }
        let limits = self.kind.limits();
        let (ran, interrupted) = self.write_guard.run_within(Mode::Kind, steps, || {
            self.kind.execute(&self.write, &command.name, &command.args)
        });
        if interrupted && steps < self.write_guard.steps_max() {
            // The group's transaction is rolled back by the caller.
            return Ok(Ran::StoppedShort);
        }
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
        if self.write.is_autocommit() {
            // SQLite rolled the whole transaction back (an INSERT, UPDATE
            // or DELETE interrupted by the step budget does), or the kind
            // ended it: the group's earlier work is gone with it.
            let rejection = outcome.err().unwrap_or_else(|| {
                Rejection::new(RejectCode::Sql, "the command ended the group's transaction")
            });
            return Ok(Ran::Lost(rejection));
        }
        match outcome {
            Ok(result) => {
                if savepoint {
                    self.write.prepare_cached("RELEASE command")?.execute([])?;
                }
                Ok(Ran::Done(Outcome::Applied { result }))
            }
            Err(_) if !savepoint => Ok(Ran::Undo),
            Err(rejection) => {
                self.write
                    .prepare_cached("ROLLBACK TO command")?
                    .execute([])?;
                self.write.prepare_cached("RELEASE command")?.execute([])?;
                Ok(Ran::Done(Outcome::Rejected { rejection }))
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
        // The frames are read into this thread's kept buffer: no zeroed
        // allocation per group.
        wal::with_frame_buffer(|buffer| self.capture_from(buffer, txid, now_ms))
    }

    fn capture_from(
        &mut self,
        buffer: &mut Vec<u8>,
        txid: Txid,
        now_ms: i64,
    ) -> Result<Publication> {
        // Through the write connection's own WAL handle: no open, stat and
        // close of the `-wal` by path per group.
        let committed: Committed<'_> = {
            let wal = cellfleet_vfs::wal_file(&mut self.write)?.ok_or_else(|| {
                Error::Wal("a commit left the write connection without a WAL".into())
            })?;
            wal::read_committed(&wal, &self.capture.cursor, self.capture.page_size, buffer)?
                .ok_or_else(|| Error::Wal("a commit left no frames in the wal".into()))?
        };
        let pre = self.position();
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
                self.pending.push_back(Pending {
                    post: publication.post,
                    undo,
                    reader: None,
                });
                Ok(publication)
            }
            Err(e) => {
                self.capture.undo(undo);
                Err(e)
            }
        }
    }

    /// Whether [`Cell::confirm`] of the oldest pending publication is
    /// light: it ends read transactions at most and checkpoints no WAL (it
    /// does when it confirms the last pending publication and the WAL has
    /// grown to `checkpoint_wal_bytes`). A light confirm reads and writes
    /// no file, so a caller may run it where it must not block for long.
    pub fn confirm_is_light(&self) -> bool {
        self.pending.len() != 1 || self.capture.cursor.offset < self.config.checkpoint_wal_bytes
    }

    /// The oldest pending publication, `txid`, is durable: make it the
    /// published state. Publications are confirmed in TXID order; any other
    /// TXID is refused with [`Error::WrongPublication`] and changes nothing.
    /// Queries see the new state from now on. When nothing is left pending
    /// and the WAL has outgrown [`CellConfig::checkpoint_wal_bytes`] it is
    /// checkpointed (TRUNCATE).
    pub fn confirm(&mut self, txid: Txid) -> Result<Position> {
        self.check_not_poisoned()?;
        let oldest = self.pending_txid().ok_or(Error::NoPendingPublication)?;
        if oldest != txid {
            return Err(Error::WrongPublication {
                got: txid,
                pending: oldest,
            });
        }
        let confirmed = self.pending.pop_front().expect("something is pending");
        // Every group applies outstanding migrations first.
        self.migrations_published = self.migrations_declared;
        self.published = confirmed.post;
        if let Err(e) = self.rotate_published_reader(confirmed.reader) {
            self.poisoned = true;
            return Err(e);
        }
        if self.pending.is_empty() && self.capture.cursor.offset >= self.config.checkpoint_wal_bytes
        {
            self.checkpoint()?;
        }
        Ok(self.published)
    }

    /// Queries move to the newly published state: to the reader pinned at
    /// it when later publications are pending, else to the latest state.
    fn rotate_published_reader(&mut self, pinned: Option<Reader>) -> Result<()> {
        match pinned {
            Some(next) => {
                debug_assert!(!self.pending.is_empty());
                let previous = std::mem::replace(&mut self.published_reader, OnceCell::from(next));
                if let Some(mut previous) = previous.into_inner() {
                    previous.unpin()?;
                    self.spare_readers.push(previous);
                }
            }
            None if self.pending.is_empty() => {
                if let Some(reader) = self.published_reader.get_mut() {
                    reader.unpin()?;
                }
            }
            None => {
                // Nothing pinned the newly published state (a reader on
                // demand nobody had asked for yet): no view until the next
                // confirm, and a reader still pinned at the old state must
                // never answer.
                drop(self.published_reader.take());
            }
        }
        Ok(())
    }

    /// Throw every pending publication away (a later one builds on an
    /// earlier one, so none survives the first): the Cell returns to its
    /// last published state (see the module docs for how). Returns the
    /// discarded TXIDs, oldest first.
    pub fn abort(&mut self) -> Result<Vec<Txid>> {
        self.check_not_poisoned()?;
        if self.pending.is_empty() {
            return Err(Error::NoPendingPublication);
        }
        let discarded = self.pending_txids();
        while let Some(pending) = self.pending.pop_back() {
            self.capture.undo(pending.undo);
        }
        self.forget_ledger();
        if let Err(e) = self.discard_unpublished() {
            self.poisoned = true;
            return Err(e);
        }
        Ok(discarded)
    }

    /// Cut the WAL back to the captured cursor (the published one: nothing
    /// is pending) and reopen every connection.
    fn discard_unpublished(&mut self) -> Result<()> {
        debug_assert!(self.pending.is_empty());
        let published_cursor = self.capture.cursor;
        // Close every connection; none checkpoints on close.
        let placeholder_write = Connection::open_in_memory()?;
        drop(std::mem::replace(&mut self.write, placeholder_write));
        drop(self.published_reader.take());
        self.spare_readers.clear();
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
        self.write = write;
        self.write_guard = write_guard;
        if !self.config.reader_on_demand {
            let _ = self.published_reader.set(self.open_reader()?);
        }
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
    /// Refused while anything is pending (the WAL then holds unpublished
    /// frames, and pinned readers hold it).
    pub fn checkpoint(&mut self) -> Result<()> {
        self.check_settled()?;
        checkpoint(&self.write, &self.wal_path)?;
        self.capture.checkpointed();
        Ok(())
    }

    /// A snapshot of the published state (to replace a chain that merging
    /// would not shrink), also while publications are pending: nothing is
    /// checkpointed while they are, so the published pages are still where
    /// the published state left them (database file and WAL frames), and
    /// the pending captures are undone on a copy of the capture state.
    pub fn snapshot(&self, now_ms: i64) -> Result<Publication> {
        self.check_not_poisoned()?;
        if self.published.txid == Txid::ZERO {
            return Err(Error::BadParameters("an empty cell has no snapshot".into()));
        }
        if self.pending.is_empty() {
            return self
                .capture
                .snapshot(self.published, now_ms, &self.files(), Compression::Lz4);
        }
        let mut published = self.capture.clone();
        for pending in self.pending.iter().rev() {
            published.undo(pending.undo.clone());
        }
        debug_assert_eq!(published.checksum, self.published.checksum);
        published.snapshot(self.published, now_ms, &self.files(), Compression::Lz4)
    }

    /// Run query `name` of the kind on the published state (never on
    /// pending state, and never refused because something is pending).
    pub fn query(&self, name: &str, args: &Value) -> Result<Value> {
        self.query_with_position(name, args)
            .map(|answer| answer.value)
    }

    /// [`Cell::query`], together with the published position the value was
    /// read at. Both come from this one call on `&self`, so no publication
    /// can be confirmed between reading the value and naming its position.
    pub fn query_with_position(&self, name: &str, args: &Value) -> Result<QueryAnswer> {
        // The full budget never stops a query short: over it, the query
        // is rejected as over its limit.
        self.query_within(name, args, u64::MAX)?
            .ok_or_else(|| Error::Rejected(over_budget(self.config.statement_steps_max)))
    }

    /// [`Cell::query_with_position`] within a budget of `steps` VM
    /// instructions: `None` when a budget below the configured
    /// `statement_steps_max` stopped the query short, whatever the kind
    /// made of the interruption. Queries write nothing, so the caller may
    /// run it again with the full budget.
    pub fn query_within(
        &self,
        name: &str,
        args: &Value,
        steps: u64,
    ) -> Result<Option<QueryAnswer>> {
        let position = self.published;
        self.check_not_poisoned()?;
        let limits = self.kind.limits();
        let payload = crate::sql::payload_bytes(name, args);
        if payload > limits.payload_bytes_max {
            return Err(Error::LimitExceeded {
                what: "query payload bytes",
                actual: payload,
                limit: limits.payload_bytes_max,
            });
        }
        let reader = self.view()?;
        let (ran, interrupted) = reader.guard.run_within(Mode::Kind, steps, || {
            self.kind.query(&reader.conn, name, args)
        });
        if interrupted && steps < reader.guard.steps_max() {
            return Ok(None);
        }
        // A pin lost while the query ran may have let it read pending
        // state: whatever it returned is discarded.
        self.check_published_view()?;
        let value = match ran {
            Ok(v) => v,
            Err(KindError::Rejected(r)) => return Err(Error::Rejected(r)),
            Err(KindError::Sqlite(e)) if is_fatal(&e) => return Err(e.into()),
            Err(KindError::Sqlite(e)) => {
                return Err(Error::Rejected(rejection_of(e, reader.guard.steps_max())))
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
        Ok(Some(QueryAnswer { value, position }))
    }

    /// The stored outcome of command `id` in the published state (never in
    /// pending state): its TXID and outcome, or `None` if the published
    /// ledger has no entry. The runtime's `resolve` answers from this.
    pub fn published_outcome(&mut self, id: &CommandId) -> Result<Option<(Txid, Outcome)>> {
        self.check_not_poisoned()?;
        if self.published.txid == Txid::ZERO {
            return Ok(None);
        }
        if self.ledger_index.is_none() && ledger::layout(&self.write)? == ledger::Layout::Arrival {
            // Between groups: the write connection's state, pending included.
            self.ledger_index = Some(ledger::load(&self.write)?);
        }
        let conn = &self.view()?.conn;
        let entry = match (ledger::layout(conn)?, self.ledger_index.as_ref()) {
            // The index holds every id of the write connection's state. One
            // it lacks is not in the published state either, unless a
            // pending group pruned it, which only happens past its window.
            // One it holds may be pending (the runtime answers those from
            // what it has in flight), or recorded again past its window in
            // a newer row, whose `seq` the published state may lack or
            // give to another id (`get` then finds nothing).
            (ledger::Layout::Arrival, Some(index)) => match index.get(&id.0) {
                Some(&seq) => ledger::get(conn, seq, id)?,
                None => None,
            },
            // A state published before the Cell's move to the current
            // layout, or a writer that has not moved yet.
            (layout, _) => ledger::find_by_id(conn, layout, id)?,
        };
        // As for queries: an answer read through a lost pin is void.
        self.check_published_view()?;
        Ok(entry
            .filter(|entry| entry.txid <= self.published.txid)
            .map(|entry| (entry.txid, entry.outcome)))
    }

    /// The reader of the published state, opened now if nothing is pending
    /// ([`Error::ViewPending`] if something is and no reader holds the
    /// published state; the next group pins one, see [`Cell::want_view`]).
    fn view(&self) -> Result<&Reader> {
        if self.published_reader.get().is_none() {
            if let Some(pending) = self.pending_txid() {
                return Err(Error::ViewPending {
                    published: self.published.txid,
                    pending,
                });
            }
            let _ = self.published_reader.set(self.open_reader()?);
        }
        self.check_published_view()?;
        Ok(self.published_reader.get().expect("opened above"))
    }

    /// Whether a query or [`Cell::published_outcome`] can read the
    /// published state now (else it gets [`Error::ViewPending`]).
    pub fn has_published_view(&self) -> bool {
        self.published_reader.get().is_some() || self.pending.is_empty()
    }

    /// Asks the next group to keep a reader of the published state, so
    /// queries during its publication answer at once (call it when one
    /// got [`Error::ViewPending`]).
    pub fn want_view(&mut self) {
        self.view_wanted = true;
    }

    /// Read connections open now (the write connection aside): each holds
    /// the database and its WAL open, two descriptors.
    pub fn readers_open(&self) -> usize {
        usize::from(self.published_reader.get().is_some())
            + self.spare_readers.len()
            + self.pending.iter().filter(|p| p.reader.is_some()).count()
    }

    /// Descriptors the Cell holds now: its database and `-wal`, and two
    /// per reader ([`Cell::readers_open`]). A reader's descriptors close
    /// with it. (The `cellfleet` VFS's lock against other processes rides
    /// the first connection's database descriptor.)
    pub fn descriptors(&self) -> usize {
        2 + 2 * self.readers_open()
    }

    /// A new read connection.
    fn open_reader(&self) -> Result<Reader> {
        Reader::open(&self.path, &self.config)
    }

    /// Closes the readers nothing needs now: the spare ones, and (with
    /// [`CellConfig::reader_on_demand`]) the published one when nothing is
    /// pending (the next query reopens it). Returns how many it closed.
    pub fn close_idle_readers(&mut self) -> usize {
        let mut closed = self.spare_readers.len();
        self.spare_readers.clear();
        if self.config.reader_on_demand
            && self.pending.is_empty()
            && self.published_reader.take().is_some()
        {
            closed += 1;
        }
        closed
    }

    /// The published reader sees exactly the published state.
    fn check_published_view(&self) -> Result<()> {
        let Some(reader) = self.published_reader.get() else {
            return Ok(());
        };
        match (reader.pin(), self.pending_txid()) {
            (Pin::Free, None) => Ok(()),
            (Pin::Pinned(txid), Some(_)) if txid == self.published.txid => Ok(()),
            (_, pending) => Err(Error::PublishedViewLost {
                published: self.published.txid,
                pending,
            }),
        }
    }

    /// Close the Cell. Settled (nothing pending), its WAL is checkpointed
    /// into the database file and the empty `-wal` is removed, so a closed
    /// Cell is its database file alone ([`Cell::open`] checkpoints
    /// whatever a WAL holds anyway). A
    /// pending publication is left in the WAL and makes the next
    /// [`Cell::open`] refuse the file (recover it instead).
    pub fn close(self) {
        self.close_as(true);
    }

    /// Close the Cell like [`Cell::close`] but keep the empty `-wal` for a
    /// reopen expected soon: creating and deleting it is part of a
    /// passivate-and-reopen cycle's cost on ext4, whose inode allocator
    /// slows down under churn of recently deleted files. [`tidy_closed`]
    /// removes it later.
    pub fn close_keeping_sidecars(self) {
        self.close_as(false);
    }

    fn close_as(mut self, remove_sidecars: bool) {
        let settled = self.checkpoint().is_ok();
        if !remove_sidecars {
            return;
        }
        // The claim outlives the connections, so nobody in this process
        // opens the Cell while its files go (and the node's directory lock
        // keeps other processes out).
        let claim = self.claim.clone();
        let wal = self.wal_path.clone();
        drop(self);
        if settled {
            let _ = std::fs::remove_file(wal);
        }
        drop(claim);
    }
}

/// Removes the empty `-wal` a closed Cell at `path` kept
/// ([`Cell::close_keeping_sidecars`]), and the `-shm` and `.lock` files
/// earlier builds left, leaving its database alone.
/// Returns false, touching nothing, when the Cell is open (in this process
/// or another) or its WAL still holds frames (the next [`Cell::open`]
/// merges them).
pub fn tidy_closed(path: &Path) -> Result<bool> {
    if !path.exists() {
        return Ok(false);
    }
    let claim = match live::claim(path) {
        Ok(claim) => claim,
        Err(Error::Live(_)) => return Ok(false),
        Err(e) => return Err(e),
    };
    let excluded = match claim.exclude_connections(path) {
        Ok(Some(file)) => file,
        Ok(None) | Err(Error::Live(_)) => return Ok(false),
        Err(e) => return Err(e),
    };
    let wal = sidecar(path, "-wal");
    match std::fs::metadata(&wal) {
        Ok(meta) if meta.len() > 0 => return Ok(false),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    for file in [wal, sidecar(path, "-shm"), sidecar(path, ".lock")] {
        match std::fs::remove_file(&file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
    }
    drop(excluded);
    drop(claim);
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kind::Typed;
    use crate::Kv;

    /// A Cell's own connections, the writer and the reader of its
    /// published state, open with the configured page cache bound; a new
    /// Cell (from its kind's template) and a reopened one alike.
    #[test]
    fn a_cells_connections_take_the_page_cache_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kv.db");
        let config = CellConfig {
            cache_bytes: 300 << 10,
            ..CellConfig::default()
        };
        let cache = |conn: &Connection| -> i64 {
            conn.query_row("PRAGMA cache_size", [], |r| r.get(0))
                .unwrap()
        };
        let kind: Arc<dyn Kind> = Arc::new(Typed(Kv));
        let opened = Cell::open(&path, kind.clone(), config.clone(), Position::EMPTY, 1).unwrap();
        let mut cell = opened.cell;
        assert!(
            cell.schema_in_file,
            "a new kv Cell starts from its template"
        );
        assert_eq!(cache(&cell.write), -300);
        assert_eq!(cache(&cell.published_reader.get().unwrap().conn), -300);
        let schema = opened
            .migration
            .expect("a new Cell's schema is its first group");
        let position = cell.confirm(schema.txid).unwrap();
        assert_ne!(position, Position::EMPTY);
        drop(cell);
        let reopened = Cell::open(&path, kind, config, position, 3).unwrap().cell;
        assert_eq!(cache(&reopened.write), -300);
        assert_eq!(cache(&reopened.published_reader.get().unwrap().conn), -300);
    }
}
