//! Activation (DESIGN.md §5): win ownership through the authority, then rebuild and verify the Cell before it serves.
//!
//! Ordering:
//! 1. Read the root and decide (create / adopt / take over / route to the
//!    live owner) — [`cellfleet_authority::Roots::activate`]. A node that
//!    loses the CAS race stops here: it downloads nothing.
//! 2. Open the local file at the root's position; [`Cell::open`] refuses
//!    unless the file's TXID *and* rolling checksum equal the root's.
//! 3. Otherwise download every chain file (size checked against the root),
//!    rebuild with [`cellfleet_cell::recover`] (each file's post-apply
//!    position checked against the root's record), and open again — which
//!    re-verifies the full rolling checksum.
//! 4. When the root points into a node log (DESIGN.md §9), the Cell's
//!    records past its chain are read first ([`crate::replay`]: a dead
//!    session's lane is sealed before it is read) and applied after the
//!    chain; they are then checkpointed into the chain by one CAS that also
//!    moves the pointer to this session's lane (log mode) or clears it
//!    (cell mode). A Cell whose root does not point at this session's lane
//!    gets that pointer before it serves, so no record of it is ever
//!    acknowledged that a successor would not find.
//! 5. Only then does the Cell serve. A migration the kind needs is returned
//!    pending and published by the actor through the normal pipeline before
//!    any command.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cellfleet_authority::{
    Activated, CellId, Epoch, Holder, NewCell, NodeId, OwnedHow, RootRecord, Roots, Versioned,
};
use cellfleet_cell::{Cell, CellConfig, ChainFile, Checksum, Kind, Position, Publication, Txid};
use cellfleet_store::ObjectStore;

use crate::error::{Error, Result};
use crate::log::NodeLog;
use crate::publication::{
    merge_files, LtxFile, ParkedCell, PublishFailure, PublishRequest, Publisher, Unckpt,
};
use crate::replay::{self, Tail};

/// A Cell ready to serve.
#[derive(Debug)]
pub struct Ready {
    /// The open engine.
    pub cell: Cell,
    /// The root this session owns.
    pub root: Versioned<RootRecord>,
    /// The epoch owned.
    pub epoch: Epoch,
    /// A pending migration to publish before serving commands.
    pub migration: Option<Publication>,
    /// The chain's bytes, when small enough to keep for merging.
    pub chain_bytes: Vec<Option<Arc<Vec<u8>>>>,
    /// How ownership was obtained.
    pub how: OwnedHow,
    /// Whether the chain was downloaded and replayed.
    pub recovered: bool,
    /// Whether ownership was won on a root absence noted just before
    /// ([`AbsentRoots`]), without reading the root again.
    pub absence_used: bool,
    /// Records replayed from a node log (then checkpointed).
    pub replayed: usize,
    /// The dead session's lane sealed (or found sealed) first, if any.
    pub sealed: Option<cellfleet_authority::LaneId>,
    /// Acknowledged records past `root` the Cell resumes with (a parked
    /// tail), oldest first, and when their checkpoint is due.
    pub(crate) tail: Vec<Unckpt>,
    pub(crate) tail_due: tokio::time::Instant,
}

/// The result of an activation attempt.
#[derive(Debug)]
pub enum Activation {
    /// Owned and verified.
    Ready(Box<Ready>),
    /// A live node owns it.
    OwnerLive {
        /// The owner.
        owner: NodeId,
    },
}

/// What activation needs from the node.
#[derive(Debug, Clone)]
pub struct Activator {
    /// The bucket.
    pub store: Arc<dyn ObjectStore>,
    /// Root operations.
    pub roots: Roots,
    /// This session.
    pub me: Holder,
    /// `{data_dir}/cells`.
    pub cells_dir: PathBuf,
    /// Engine settings.
    pub cell_config: CellConfig,
    /// Races lost before giving up.
    pub attempts_max: usize,
    /// Most chain bytes kept in memory.
    pub chain_cache_bytes_max: u64,
    /// Wall clock for engine timestamps.
    pub clock: Arc<dyn cellfleet_authority::Clock>,
    /// Uploads and CASes the activation checkpoint.
    pub publisher: Arc<dyn Publisher>,
    /// This session's node log (log mode), else `None`.
    pub log: Option<Arc<NodeLog>>,
    /// Longest activation waits for this session's own lane to settle.
    pub settle_ms: u64,
    /// Roots read absent moments ago on this node (by the router).
    pub absent: Arc<AbsentRoots>,
}

/// Cells whose root a read on this node found absent moments ago: the
/// router reads a new Cell's root to place it, and when it places the Cell
/// here the activation that follows decides on that absence instead of
/// reading the root a second time
/// ([`cellfleet_authority::Roots::activate_absent_with_log`]). A new
/// Cell's first command then costs one root read, not two.
///
/// Nothing here has to be fresh to be safe: the decision on an absent root
/// is a create-only write, which the store refuses once any root exists;
/// when that write fails in any way a read could settle (refused, or its
/// fate unknown), the activation reads the root and decides on it as if
/// there had been no note (`after_absent_attempt`). Notes are kept
/// [`AbsentRoots::FRESH`] long and at most [`AbsentRoots::NOTES_MAX`] at a
/// time, so a stale one costs at most one failed write, and a router that
/// notes Cells it never activates costs bounded memory.
#[derive(Debug, Default)]
pub struct AbsentRoots {
    noted: std::sync::Mutex<std::collections::HashMap<CellId, std::time::Instant>>,
}

impl AbsentRoots {
    /// How long a note is used.
    pub const FRESH: std::time::Duration = std::time::Duration::from_secs(2);
    /// The most notes kept; past it, stale notes are dropped and, if the
    /// table is still full, new ones are not kept.
    pub const NOTES_MAX: usize = 4096;

    /// Notes that `cell`'s root was just read and found absent.
    pub fn note(&self, cell: &CellId) {
        self.note_at(cell, std::time::Instant::now());
    }

    /// Takes `cell`'s note: whether its root was read absent within
    /// [`AbsentRoots::FRESH`]. A note is used once.
    pub fn take(&self, cell: &CellId) -> bool {
        self.take_at(cell, std::time::Instant::now())
    }

    fn note_at(&self, cell: &CellId, now: std::time::Instant) {
        let mut noted = self.noted.lock().unwrap_or_else(|e| e.into_inner());
        if noted.len() >= Self::NOTES_MAX {
            noted.retain(|_, at| is_fresh(*at, now));
            if noted.len() >= Self::NOTES_MAX {
                return;
            }
        }
        noted.insert(cell.clone(), now);
    }

    fn take_at(&self, cell: &CellId, now: std::time::Instant) -> bool {
        let taken = self
            .noted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(cell);
        taken.is_some_and(|at| is_fresh(at, now))
    }

    /// Notes kept now.
    pub fn len(&self) -> usize {
        self.noted.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether no note is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What an activation does after its create on a noted absence failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AfterAbsent {
    /// Read the root and decide on it, as if there had been no note; the
    /// failed attempt does not count against the races allowed.
    Read,
    /// The same, counting the failed attempt (the store failed, as it
    /// could have for a read).
    ReadCounted,
    /// Report the error.
    Fail,
}

/// The rule for a failed create on a noted absence (pure). The create was
/// create-only, and roots are never deleted, so whatever it met, a read
/// decides correctly: a root refused it (a stale note: fenced, or
/// a conflict), or its fate is unknown (it may land later, but only while
/// no root exists, so it can never overwrite one; a read that finds it
/// adopts it). The command waiting on the activation has not run either
/// way. Anything else (a corrupt root, an invalid proposal) is reported.
pub(crate) fn after_absent_attempt(error: &cellfleet_authority::Error) -> AfterAbsent {
    use cellfleet_authority::Error as E;
    match error {
        _ if error.is_fenced() || error.is_ambiguous() => AfterAbsent::Read,
        E::Conflict { .. } => AfterAbsent::Read,
        E::Unavailable { .. } | E::LeaseLive { .. } => AfterAbsent::ReadCounted,
        _ => AfterAbsent::Fail,
    }
}

/// Whether a note made at `at` is still used at `now`.
fn is_fresh(at: std::time::Instant, now: std::time::Instant) -> bool {
    now.saturating_duration_since(at) < AbsentRoots::FRESH
}

/// The published position a root names.
pub fn root_position(root: &RootRecord) -> Position {
    if root.txid == Txid::ZERO {
        return Position::EMPTY;
    }
    Position {
        txid: root.txid,
        checksum: Checksum(root.checksum),
    }
}

/// The position after a node-log record.
fn entry_position(entry: &cellfleet_nodelog::Entry) -> Position {
    Position {
        txid: entry.max_txid,
        checksum: Checksum(entry.post_apply_checksum),
    }
}

/// Whether an activation must read the node log for the Cell's records
/// past its root's chain (pure). Not for a parked root: its records past
/// the chain are the parked tail already in memory. Not for a root this
/// activation created: there was no root before it, roots are never
/// deleted, and only an owner activated on a root writes records, so no
/// lane holds a record of the Cell. Reading would wait for this lane's
/// segments in flight to settle and read the index of every segment
/// written since the pointer, for nothing (about three ranged GETs per
/// stream created under load).
pub(crate) fn log_may_hold_records(how: OwnedHow, parked: bool) -> bool {
    !parked && how != OwnedHow::Created
}

/// The position a Cell opens at: after the last record past its chain
/// (replayed from the log, or its parked tail: only one of them is ever
/// non-empty), else the root's.
fn start_position(
    root: &RootRecord,
    replayed: &[(cellfleet_nodelog::Entry, bytes::Bytes)],
    parked: &[Unckpt],
) -> Position {
    match (replayed.last(), parked.last()) {
        (Some((entry, _)), _) => entry_position(entry),
        (None, Some(record)) => Position {
            txid: record.file.max_txid,
            checksum: Checksum(record.file.post_apply_checksum),
        },
        (None, None) => root_position(root),
    }
}

/// The records past a chain, each with the position after it, for a
/// rebuild (the parked tail's bytes are copied only here).
fn past_chain(
    replayed: &[(cellfleet_nodelog::Entry, bytes::Bytes)],
    parked: &[Unckpt],
) -> Vec<(Position, bytes::Bytes)> {
    replayed
        .iter()
        .map(|(entry, bytes)| (entry_position(entry), bytes.clone()))
        .chain(parked.iter().map(|record| {
            (
                Position {
                    txid: record.file.max_txid,
                    checksum: Checksum(record.file.post_apply_checksum),
                },
                bytes::Bytes::from(record.file.bytes.as_ref().clone()),
            )
        }))
        .collect()
}

/// Removes a closed Cell's files, and the `-shm` and `.lock` files earlier
/// builds left (the Cell's engine is gone, and the node runs one actor
/// per Cell, so nobody holds it).
fn remove_local_files(path: &Path) {
    for suffix in ["", "-wal", "-shm", ".recover", ".lock"] {
        let mut name = path.as_os_str().to_os_string();
        name.push(suffix);
        let _ = std::fs::remove_file(PathBuf::from(name));
    }
}

impl Activator {
    /// Where Cell `cell` keeps its database.
    pub fn path(&self, cell: &CellId) -> PathBuf {
        self.cells_dir.join(format!("{cell}.db"))
    }

    /// Discards a Cell's local files (after a fence or an unknown fate).
    pub fn discard(&self, cell: &CellId) {
        remove_local_files(&self.path(cell));
    }

    /// Activates `(kind, key)`; `parked` is the root this session wrote
    /// last for a passivated Cell (trusted only while the lease is live:
    /// nobody else can have written it) with the acknowledged records its
    /// actor left past it (the local file is at the last one's position).
    pub(crate) async fn activate(
        &self,
        cell_id: &CellId,
        kind: Arc<dyn Kind>,
        key: &[u8],
        parked: Option<ParkedCell>,
    ) -> Result<Activation> {
        let parked_root = parked.is_some();
        let (parked, parked_tail, tail_due) = match parked {
            Some(ParkedCell { root, tail, due }) => (Some(root), tail, due),
            None => (None, Vec::new(), tokio::time::Instant::now()),
        };
        let (root, how, absence_used) = match parked {
            Some(root) => (root, OwnedHow::Adopted, false),
            None => match self.win(cell_id, kind.as_ref(), key).await? {
                Ok(won) => won,
                Err(owner) => return Ok(Activation::OwnerLive { owner }),
            },
        };
        let epoch = root.record.epoch;
        let path = self.path(cell_id);
        if how == OwnedHow::Created {
            remove_local_files(&path);
        }
        let tail = if log_may_hold_records(how, parked_root) {
            self.tail(&root.record).await?
        } else {
            Tail::default()
        };
        let position = start_position(&root.record, &tail.records, &parked_tail);
        let now_ms = self.now_ms();
        let first = open_blocking(
            path.clone(),
            kind.clone(),
            self.config_for(&root.record),
            position,
            now_ms,
        )
        .await?;
        let (opened, mut chain_bytes, recovered) = match first {
            Ok(opened) => (opened, vec![None; root.record.chain.len()], false),
            // Out of descriptors: the file is not at fault, and a rebuild
            // would need them too.
            Err(error) if error.is_out_of_files() => return Err(Error::cell(&error)),
            Err(error) => {
                tracing::debug!(cell = %cell_id, %error, "local file not at the cell's position; recovering");
                let past_chain = past_chain(&tail.records, &parked_tail);
                let (opened, cache) = self
                    .rebuild(&root.record, past_chain, &path, kind, position, now_ms)
                    .await?;
                (opened, cache, true)
            }
        };
        let replayed = tail.records.len();
        let root = match self.checkpoint_at_activation(&root, tail.records).await? {
            Some((next, merged)) => {
                if next.record.chain.len() == chain_bytes.len() + 1 {
                    chain_bytes.push(merged);
                } else {
                    chain_bytes = vec![None; next.record.chain.len()];
                }
                next
            }
            None => root,
        };
        if parked_tail.is_empty() {
            self.clear_lane_hold(&root.record);
        }
        Ok(Activation::Ready(Box::new(Ready {
            cell: opened.cell,
            root,
            epoch,
            migration: opened.migration,
            chain_bytes,
            how,
            recovered,
            absence_used,
            replayed,
            sealed: tail.sealed,
            tail: parked_tail,
            tail_due,
        })))
    }

    /// The records the node log holds past `record`'s chain, with the
    /// replay's outcome (a lane it sealed).
    async fn tail(&self, record: &RootRecord) -> Result<Tail> {
        replay::records_past_chain(
            &self.store,
            self.roots.layout(),
            &self.me,
            self.log.as_deref(),
            record,
            std::time::Duration::from_millis(self.settle_ms),
            self.clock.now_wall_ms(),
        )
        .await
    }

    /// Rebuilds the Cell's local file from its chain and the records past
    /// it (`past_chain`, each with the position after it), then opens it at
    /// `position`; returns the engine and the chain's bytes to keep cached
    /// (none past the cache bound).
    async fn rebuild(
        &self,
        record: &RootRecord,
        past_chain: Vec<(Position, bytes::Bytes)>,
        path: &Path,
        kind: Arc<dyn Kind>,
        position: Position,
        now_ms: i64,
    ) -> Result<(cellfleet_cell::Opened, Vec<Option<Arc<Vec<u8>>>>)> {
        let chain = self.download(record).await?;
        let chain_bytes = chain.clone();
        let target = path.to_path_buf();
        let posts: Vec<Position> = record
            .chain
            .iter()
            .map(|entry| Position {
                txid: entry.max_txid,
                checksum: Checksum(entry.post_apply_checksum),
            })
            .collect();
        tokio::task::spawn_blocking(move || {
            let files: Vec<ChainFile<&[u8]>> = posts
                .iter()
                .zip(&chain)
                .map(|(post, bytes)| ChainFile {
                    ltx: bytes.as_slice(),
                    post: *post,
                })
                .chain(past_chain.iter().map(|(post, bytes)| ChainFile {
                    ltx: bytes.as_ref(),
                    post: *post,
                }))
                .collect();
            cellfleet_cell::recover(files, &target)
        })
        .await
        .map_err(|e| Error::Closed(format!("recovery task failed: {e}")))??;
        let opened = open_blocking(
            path.to_path_buf(),
            kind,
            self.config_for(record),
            position,
            now_ms,
        )
        .await?
        .map_err(|e| Error::cell(&e))?;
        let total: u64 = chain_bytes.iter().map(|b| b.len() as u64).sum();
        let cache = if total <= self.chain_cache_bytes_max {
            chain_bytes.into_iter().map(Some).collect()
        } else {
            vec![None; record.chain.len()]
        };
        Ok((opened, cache))
    }

    /// Every record of the Cell is in its chain now (replayed and
    /// checkpointed, or checkpointed at passivation): this session's lane
    /// holds nothing for it until its actor writes again. (A parked tail
    /// keeps the hold its actor left: the caller does not come here.)
    fn clear_lane_hold(&self, record: &RootRecord) {
        if let (Some(log), Some(pointer)) = (&self.log, &record.log) {
            let lane = log.lane_of(&record.cell_id);
            if pointer.lane == *lane.writer().lane() {
                lane.set_hold(&record.cell_id, None);
            }
        }
    }

    /// The pointer this activation leaves in the root, and the CAS that
    /// puts it there with the replayed records checkpointed; `None` when
    /// the root is right as it is.
    async fn checkpoint_at_activation(
        &self,
        root: &Versioned<RootRecord>,
        records: Vec<(cellfleet_nodelog::Entry, bytes::Bytes)>,
    ) -> Result<Option<(Versioned<RootRecord>, Option<Arc<Vec<u8>>>)>> {
        let lane = self
            .log
            .as_ref()
            .map(|log| log.lane_of(&root.record.cell_id));
        let points_here = match (&root.record.log, lane) {
            (Some(pointer), Some(lane)) => pointer.lane == *lane.writer().lane(),
            (None, None) => true,
            _ => false,
        };
        if records.is_empty() && points_here {
            return Ok(None);
        }
        let file = if records.is_empty() {
            None
        } else {
            Some(merge_records(records).await?)
        };
        let checkpointed = checkpoint_into_root(
            self.publisher.as_ref(),
            root,
            file,
            lane.map(|lane| lane.pointer_here()),
        )
        .await
        .map_err(|failure| failure_error(&root.record.cell_id, failure))?;
        Ok(Some(checkpointed))
    }

    fn now_ms(&self) -> i64 {
        i64::try_from(self.clock.now_wall_ms()).unwrap_or(i64::MAX)
    }

    /// The Cell's engine settings: the node's, with the page size its root
    /// records (a kind may create its Cells with another than the node's;
    /// it matters only when the file is created).
    fn config_for(&self, record: &RootRecord) -> CellConfig {
        CellConfig {
            page_size: record.page_size,
            ..self.cell_config.clone()
        }
    }

    /// Wins ownership, or names the live owner. Retries lost races (which
    /// wrote nothing) up to `attempts_max` times. The first attempt decides
    /// on a fresh note of the root's absence when there is one (see
    /// [`AbsentRoots`]); every other attempt reads the root. The flag says
    /// whether the note won.
    async fn win(
        &self,
        cell_id: &CellId,
        kind: &dyn Kind,
        key: &[u8],
    ) -> Result<std::result::Result<(Versioned<RootRecord>, OwnedHow, bool), NodeId>> {
        let new = NewCell {
            cell_id: cell_id.clone(),
            kind: kind.name().to_owned(),
            key: std::str::from_utf8(key)
                .ok()
                .filter(|k| k.len() <= 1024 && !k.chars().any(char::is_control))
                .map(str::to_owned),
            page_size: kind.page_size().unwrap_or(self.cell_config.page_size),
            schema_version: 0,
        };
        let mut last = None;
        let mut attempts = self.attempts_max.max(1);
        // Where this node's log stands for the Cell, at each attempt.
        let pointer = || {
            self.log
                .as_ref()
                .map(|log| log.lane_of(cell_id).pointer_here())
        };
        if self.absent.take(cell_id) {
            match self
                .roots
                .activate_absent_with_log(&new, &self.me, pointer())
                .await
            {
                Ok(Activated::Owned { root, how }) => return Ok(Ok((*root, how, true))),
                Ok(Activated::OwnerLive { owner, .. }) => return Ok(Err(owner)),
                Err(error) => match after_absent_attempt(&error) {
                    AfterAbsent::Read => {}
                    AfterAbsent::ReadCounted => {
                        attempts -= 1;
                        last = Some(error);
                    }
                    AfterAbsent::Fail => return Err(error.into()),
                },
            }
        }
        for _ in 0..attempts {
            match self
                .roots
                .activate_with_log(&new, &self.me, pointer())
                .await
            {
                Ok(Activated::Owned { root, how }) => return Ok(Ok((*root, how, false))),
                Ok(Activated::OwnerLive { owner, .. }) => return Ok(Err(owner)),
                Err(error) if error.is_retryable() && !error.is_ambiguous() => last = Some(error),
                Err(error) if error.is_fenced() => last = Some(error),
                Err(error) => return Err(error.into()),
            }
        }
        Err(last
            .map(Error::from)
            .unwrap_or_else(|| Error::Closed("activation kept losing races".into())))
    }

    async fn download(&self, root: &RootRecord) -> Result<Vec<Arc<Vec<u8>>>> {
        let mut files = Vec::with_capacity(root.chain.len());
        for entry in &root.chain {
            let object = self.store.get(&entry.key).await?;
            if object.body.len() as u64 != entry.size {
                return Err(Error::Store(cellfleet_store::Error::Corrupt {
                    key: entry.key.clone(),
                    reason: format!(
                        "{} bytes, the root records {}",
                        object.body.len(),
                        entry.size
                    ),
                }));
            }
            files.push(Arc::new(object.body.to_vec()));
        }
        Ok(files)
    }
}

/// One LTX file holding `records` (consecutive deltas of one Cell): the
/// record itself when there is one, else their merge.
pub(crate) async fn merge_records(
    records: Vec<(cellfleet_nodelog::Entry, bytes::Bytes)>,
) -> Result<LtxFile> {
    let files = records
        .into_iter()
        .map(|(entry, bytes)| LtxFile {
            bytes: Arc::new(bytes.to_vec()),
            min_txid: entry.min_txid,
            max_txid: entry.max_txid,
            file_checksum: entry.file_checksum,
            post_apply_checksum: entry.post_apply_checksum,
        })
        .collect();
    merge_files(files).await.map_err(|failure| match failure {
        PublishFailure::NotCommitted(reason) => Error::Cell {
            message: reason,
            retryable: false,
        },
        other => Error::Closed(format!("{other:?}")),
    })
}

/// Uploads `file` (records merged into one LTX file, if any) and CASes
/// `root` with it appended to the chain and its pointer set to `pointer`:
/// the checkpoint an activation makes of replayed records and the node
/// makes of a parked tail. Returns the new root and the file's bytes.
pub(crate) async fn checkpoint_into_root(
    publisher: &dyn Publisher,
    root: &Versioned<RootRecord>,
    file: Option<LtxFile>,
    pointer: Option<cellfleet_authority::LogPointer>,
) -> std::result::Result<(Versioned<RootRecord>, Option<Arc<Vec<u8>>>), PublishFailure> {
    let epoch = root.record.epoch;
    let delta = match file {
        Some(file) => {
            let bytes = file.bytes.clone();
            Some((
                publisher.upload(&root.record.cell_id, epoch, file).await?,
                bytes,
            ))
        }
        None => None,
    };
    let next = publisher
        .commit(PublishRequest {
            base: root.clone(),
            epoch,
            delta: delta.as_ref().map(|(file, _)| file.clone()),
            compaction: None,
            log: pointer,
        })
        .await?;
    Ok((next, delta.map(|(_, bytes)| bytes)))
}

/// The runtime error for a publication that failed at activation.
pub(crate) fn failure_error(cell: &CellId, failure: PublishFailure) -> Error {
    match failure {
        PublishFailure::Fenced(reason) | PublishFailure::CommittedThenFenced(reason) => {
            Error::Fenced {
                cell: cell.clone(),
                reason,
            }
        }
        PublishFailure::NotCommitted(reason) => Error::NotCommitted { reason },
        PublishFailure::Unknown(reason) => Error::Unknown { reason },
    }
}

async fn open_blocking(
    path: PathBuf,
    kind: Arc<dyn Kind>,
    config: CellConfig,
    position: Position,
    now_ms: i64,
) -> Result<cellfleet_cell::Result<cellfleet_cell::Opened>> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| Error::Cell {
            message: format!("cannot create {}: {e}", dir.display()),
            retryable: false,
        })?;
    }
    tokio::task::spawn_blocking(move || Cell::open(&path, kind, config, position, now_ms))
        .await
        .map_err(|e| Error::Closed(format!("open task failed: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_root_found_in_the_bucket_sends_an_activation_to_the_log() {
        let cases = [
            (OwnedHow::Created, false, false),
            (OwnedHow::Adopted, false, true),
            (OwnedHow::TookOver, false, true),
            (OwnedHow::Created, true, false),
            (OwnedHow::Adopted, true, false),
            (OwnedHow::TookOver, true, false),
        ];
        for (how, parked, reads) in cases {
            assert_eq!(
                log_may_hold_records(how, parked),
                reads,
                "{how:?}, parked {parked}"
            );
        }
    }

    #[test]
    fn a_failed_create_on_a_noted_absence_reads_unless_the_root_is_broken() {
        use cellfleet_authority::Error as E;
        let store = || cellfleet_store::Error::Unavailable {
            op: cellfleet_store::Op::PutIfNoneMatch,
            key: "root".into(),
            outcome: cellfleet_store::Outcome::NotApplied,
            message: "down".into(),
        };
        let cases = [
            (
                E::Fenced {
                    reason: "another owner".into(),
                },
                AfterAbsent::Read,
            ),
            (
                E::CommittedThenFenced {
                    reason: "replaced".into(),
                },
                AfterAbsent::Read,
            ),
            (
                E::Conflict {
                    reason: "the root vanished".into(),
                },
                AfterAbsent::Read,
            ),
            (
                E::Unavailable {
                    source: store(),
                    ambiguous: true,
                },
                AfterAbsent::Read,
            ),
            (
                E::Unavailable {
                    source: store(),
                    ambiguous: false,
                },
                AfterAbsent::ReadCounted,
            ),
            (
                E::Corrupt {
                    key: "k".into(),
                    reason: "garbage".into(),
                },
                AfterAbsent::Fail,
            ),
            (
                E::Invalid {
                    reason: "bad proposal".into(),
                },
                AfterAbsent::Fail,
            ),
        ];
        for (error, then) in cases {
            assert_eq!(after_absent_attempt(&error), then, "{error:?}");
        }
    }

    fn cell(n: usize) -> CellId {
        CellId::for_kind_key("kv", n.to_string().as_bytes())
    }

    #[test]
    fn a_noted_absence_is_used_once_and_only_while_fresh() {
        let notes = AbsentRoots::default();
        let t0 = std::time::Instant::now();
        assert!(!notes.take_at(&cell(0), t0), "never noted");
        notes.note_at(&cell(0), t0);
        notes.note_at(&cell(1), t0);
        assert!(!notes.take_at(&cell(2), t0), "another Cell's note");
        assert!(notes.take_at(&cell(0), t0 + AbsentRoots::FRESH / 2));
        assert!(!notes.take_at(&cell(0), t0), "used once");
        assert!(
            !notes.take_at(&cell(1), t0 + AbsentRoots::FRESH),
            "stale at FRESH"
        );
        assert!(notes.is_empty(), "taking drops a note, fresh or not");
    }

    #[test]
    fn notes_stay_bounded_and_stale_ones_make_room() {
        let notes = AbsentRoots::default();
        let t0 = std::time::Instant::now();
        for n in 0..AbsentRoots::NOTES_MAX + 10 {
            notes.note_at(&cell(n), t0);
        }
        assert_eq!(notes.len(), AbsentRoots::NOTES_MAX);
        assert!(
            !notes.take_at(&cell(AbsentRoots::NOTES_MAX + 5), t0),
            "a note past the bound is not kept"
        );
        // Once the kept notes are stale, a new one drops them.
        let later = t0 + AbsentRoots::FRESH;
        notes.note_at(&cell(usize::MAX), later);
        assert_eq!(notes.len(), 1);
        assert!(notes.take_at(&cell(usize::MAX), later));
    }
}
