//! The Cell actor: one task per open Cell that owns the engine, groups its mailbox, and releases replies in commit order.
//!
//! Driving sequence (the engine's pipelined publications):
//! 1. drain the mailbox into a group, bounded by `group_commands_max` and
//!    `group_bytes_max`;
//! 2. execute it on the blocking pool ([`Cell::execute`]) — SQLite never
//!    runs on an async worker thread; the engine moves into
//!    `spawn_blocking` and back, so one Cell is never touched by two
//!    threads at once;
//! 3. start the LTX upload at once (create-only), and queue the group;
//! 4. the oldest queued group's CAS runs in a spawned task (so a dropped
//!    request can never cut a CAS in half) once its upload finished; the
//!    next group may execute meanwhile (up to the engine's
//!    `pending_publications_max`);
//! 5. on success: [`Cell::confirm`], then release every held reply whose
//!    `depends_on_txid` is now published — so replies keep commit order;
//! 6. on a fence: abort, answer the held replies `NotCommitted`, discard the
//!    local files and stop; on an unknown fate: that group's replies are
//!    `Unknown`, later ones `NotCommitted` (their CAS never ran), local
//!    files discarded, stop.
//!
//! Compaction: once the root's chain reaches `chain_files_max` files, a
//! merged file (or, when merging does not shrink or the chain's bytes are
//! not all in memory, a snapshot of the published state) is prepared and
//! uploaded privately; the next CAS carries it together with its delta.
//! The root does not change while it is prepared. It is prepared after a
//! commit, at activation, and whenever the chain is at its hard bound
//! (twice the target): there a CAS never goes without one, and if neither
//! form can be prepared the held groups are not committed and the actor
//! stops, so a failing store can never walk the chain into the root's
//! limit and lock the Cell out.

mod log_mode;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use cellfleet_authority::{CellId, Clock, Epoch, LtxRef, RootRecord, Versioned};
use cellfleet_cell::{
    Cell, ChainFile, Checksum, Command, CommandId, CommandResult, Outcome, Position, Publication,
    Txid,
};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};
use tokio::task::JoinHandle;

use crate::activation::Activator;
use crate::config::LogSettings;
use crate::error::{Error, Result};
use crate::log::{NodeLog, Record};
use crate::metrics::Metrics;
use crate::publication::{
    merge_files, LtxFile, ParkedCell, PublishFailure, PublishRequest, Publisher, Unckpt,
};
use cellfleet_authority::LogPointer;
use cellfleet_nodelog::lane::GroupFate;

/// A committed (or stored) command's proof: read-your-writes fence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Receipt {
    /// The Cell.
    pub cell: CellId,
    /// The epoch that answered.
    pub epoch: Epoch,
    /// The TXID whose publication holds the outcome.
    pub txid: u64,
}

/// The answer to a query: its value and the published state it read.
#[derive(Clone, Debug, PartialEq)]
pub struct Queried {
    /// The published position (cell, epoch, TXID) the value was read at.
    pub receipt: Receipt,
    /// What the query returned.
    pub value: Value,
}

/// The answer to a command.
#[derive(Clone, Debug, PartialEq)]
pub struct Executed {
    /// Where the outcome is durable.
    pub receipt: Receipt,
    /// What the command did (a rejection is an outcome too).
    pub outcome: Outcome,
    /// Whether the outcome came from the ledger (a retry).
    pub duplicate: bool,
}

/// The fate of a command id, as `resolve` reports it.
#[derive(Clone, Debug, PartialEq)]
pub enum Resolution {
    /// Published: the ledger holds this outcome.
    Committed {
        /// The publication holding it.
        receipt: Receipt,
        /// The stored outcome.
        outcome: Outcome,
    },
    /// Not in the published ledger, and its validity window (if given) is open.
    Absent,
    /// Being published right now (or queued): ask again.
    Unknown,
    /// Not in the ledger and its validity window has passed: a retry is refused.
    Expired,
    /// Not in the ledger, and the caller did not say the command's expiry:
    /// the entry may have been pruned after its window passed, so neither
    /// ABSENT nor EXPIRED is provable. Resolve again with the expiry.
    NeedsExpiry,
}

/// What `resolve` answers for a command id found neither in the ledger nor
/// in flight (pure). The ledger keeps an entry until its command's expiry
/// plus the skew margin, so with the expiry: inside that window the command
/// provably never committed (ABSENT); past it, a retry is refused whatever
/// happened (EXPIRED). Without the expiry nothing is provable.
pub fn missing_from_ledger(
    command_expires_at_ms: Option<i64>,
    skew_margin_ms: i64,
    now_ms: i64,
) -> Resolution {
    match command_expires_at_ms {
        None => Resolution::NeedsExpiry,
        Some(expiry) if expiry.saturating_add(skew_margin_ms) < now_ms => Resolution::Expired,
        Some(_) => Resolution::Absent,
    }
}

/// A snapshot of one Cell for operators.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CellDescription {
    /// The Cell.
    pub cell: CellId,
    /// Its kind.
    pub kind: String,
    /// The epoch this node owns.
    pub epoch: Epoch,
    /// The published TXID.
    pub txid: u64,
    /// The root's revision.
    pub revision: u64,
    /// Files in the root's chain.
    pub chain_files: usize,
    /// Whether the Cell is open (else passivated, still owned).
    pub open: bool,
    /// Requests waiting (mailbox, group, held replies).
    pub queued: usize,
}

/// A reply channel that keeps the queue-depth counters true however it ends.
#[derive(Debug)]
pub(crate) struct Reply<T> {
    tx: Option<oneshot::Sender<Result<T>>>,
    load: Arc<AtomicUsize>,
    metrics: Arc<Metrics>,
}

impl<T> Reply<T> {
    pub(crate) fn new(
        tx: oneshot::Sender<Result<T>>,
        load: Arc<AtomicUsize>,
        metrics: Arc<Metrics>,
    ) -> Self {
        load.fetch_add(1, Ordering::Relaxed);
        metrics.queue_depth_commands.fetch_add(1, Ordering::Relaxed);
        Self {
            tx: Some(tx),
            load,
            metrics,
        }
    }

    pub(crate) fn send(mut self, value: Result<T>) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(value);
        }
    }
}

impl<T> Drop for Reply<T> {
    fn drop(&mut self) {
        self.load.fetch_sub(1, Ordering::Relaxed);
        self.metrics
            .queue_depth_commands
            .fetch_sub(1, Ordering::Relaxed);
    }
}

/// Why an actor stops.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum StopHow {
    /// Finish accepted work, close, keep ownership (the root is parked).
    Passivate,
    /// Finish accepted work, close, release the root.
    Drain,
    /// Stop now: another owner exists or the lease is gone.
    Fence(String),
}

/// A request to a Cell actor.
#[derive(Debug)]
pub(crate) enum Msg {
    Execute {
        command: Command,
        bytes: usize,
        reply: Reply<Executed>,
    },
    Query {
        name: String,
        args: Value,
        min_txid: Option<u64>,
        reply: Reply<Queried>,
    },
    Resolve {
        id: CommandId,
        expires_at_ms: Option<i64>,
        reply: Reply<Resolution>,
    },
    Describe {
        reply: oneshot::Sender<CellDescription>,
    },
    Stop {
        how: StopHow,
        done: Option<oneshot::Sender<Result<()>>>,
    },
}

/// How an actor ended, for the dispatcher.
#[derive(Debug)]
pub(crate) enum Exit {
    /// Closed, still owned: reopen from this root without reading it.
    Parked(Box<ParkedCell>),
    /// Released or lost: forget it.
    Gone,
}

/// What an open Cell holds of its node's budgets: its place among the open
/// Cells, and the descriptors its connections hold now.
#[derive(Debug)]
pub(crate) struct OpenCharge {
    pub _open: OwnedSemaphorePermit,
    pub fds: OwnedSemaphorePermit,
}

/// What every actor shares with its node.
#[derive(Debug)]
pub(crate) struct ActorContext {
    /// The node's descriptor budget for open Cells (`fds_max`).
    pub fd_permits: Arc<tokio::sync::Semaphore>,
    /// Checkpoints in flight on the node
    /// (`LogSettings::checkpoints_inflight_max`), shared with the parked
    /// Cells' sweep.
    pub checkpoint_permits: Arc<tokio::sync::Semaphore>,
    pub fds_per_reader: usize,
    /// Asks the node to passivate an idle Cell (not this one) when a
    /// reader finds `fds_max` spent.
    pub room: mpsc::Sender<CellId>,
    pub retry_after_ms: u64,
    pub activation_wait_ms_max: u64,
    pub publisher: Arc<dyn Publisher>,
    pub activator: Activator,
    pub clock: Arc<dyn Clock>,
    pub metrics: Arc<Metrics>,
    pub group_commands_max: usize,
    pub group_bytes_max: usize,
    pub chain_files_max: usize,
    pub chain_cache_bytes_max: u64,
    pub query_wait_ms_max: u64,
    pub query_waiters_max: usize,
    pub skew_margin_ms: i64,
    /// The node log (log mode); `None` in cell mode.
    pub log: Option<Arc<NodeLog>>,
    pub log_settings: LogSettings,
}

#[derive(Debug)]
struct Queued {
    command: Command,
    bytes: usize,
    reply: Reply<Executed>,
}

#[derive(Debug)]
struct Held {
    txid: u64,
    result: CommandResult,
    reply: Reply<Executed>,
}

#[derive(Debug)]
struct InFlight {
    txid: u64,
    upload: Option<JoinHandle<std::result::Result<LtxRef, PublishFailure>>>,
    bytes: Arc<Vec<u8>>,
    started: Instant,
    commands: usize,
    /// The group's command ids (resolve answers UNKNOWN for them).
    ids: Vec<CommandId>,
    /// The group's file (log mode: the record, later checkpointed).
    file: LtxFile,
    /// Log mode: the slot the committer assigns, until it is known.
    slot: Option<oneshot::Receiver<Option<u64>>>,
    /// Log mode: the slot, once known.
    seq: Option<u64>,
    /// Log mode: the replies were answered UNKNOWN after the wait bound;
    /// the group is still waited for (its PUT may land).
    answered: bool,
}

impl InFlight {
    /// Counts this group's publication (either mode): one more, its size,
    /// its time from the start of its upload.
    fn count_publication(&self, metrics: &Metrics) {
        metrics.publications_total.fetch_add(1, Ordering::Relaxed);
        metrics
            .commands_total
            .fetch_add(self.commands as u64, Ordering::Relaxed);
        metrics.group_commands.observe(self.commands as f64);
        metrics
            .publication_total_seconds
            .observe_duration(self.started.elapsed());
    }
}

struct LogDone {
    seq: Option<u64>,
    slot: Option<oneshot::Receiver<Option<u64>>>,
    /// `None`: not decided within the bound.
    fate: Option<GroupFate>,
}

struct CkDone {
    result: std::result::Result<Versioned<RootRecord>, PublishFailure>,
    covered: usize,
    merged: Option<(LtxRef, Arc<Vec<u8>>)>,
    compaction: Option<(LtxRef, Arc<Vec<u8>>)>,
}

#[derive(Debug)]
struct QueryWaiter {
    min_txid: u64,
    name: String,
    args: Value,
    reply: Reply<Queried>,
    deadline: tokio::time::Instant,
}

type Prepared = std::result::Result<(LtxRef, Arc<Vec<u8>>), PublishFailure>;

struct CasDone {
    result: std::result::Result<Versioned<RootRecord>, PublishFailure>,
    compaction: Option<(LtxRef, Arc<Vec<u8>>)>,
}

enum Event {
    Cas(std::result::Result<CasDone, tokio::task::JoinError>),
    Log(std::result::Result<LogDone, tokio::task::JoinError>),
    Checkpoint(std::result::Result<CkDone, tokio::task::JoinError>),
    Msg(Option<Msg>),
    Tick,
    Idle,
}

/// One Cell's actor.
pub(crate) struct Actor {
    cell_id: CellId,
    epoch: Epoch,
    cell: Option<Cell>,
    root: Versioned<RootRecord>,
    chain_bytes: Vec<Option<Arc<Vec<u8>>>>,
    ctx: Arc<ActorContext>,
    rx: mpsc::Receiver<Msg>,
    rx_done: bool,
    load: Arc<AtomicUsize>,
    batch: VecDeque<Queued>,
    held: Vec<Held>,
    inflight: VecDeque<InFlight>,
    cas: Option<JoinHandle<CasDone>>,
    compaction: Option<JoinHandle<Prepared>>,
    snapshot_compaction: bool,
    waiters: Vec<QueryWaiter>,
    /// Queries wait until this TXID is published: the migration the Cell
    /// needed when it opened (a fresh Cell's schema), so no query ever
    /// reads a state without the kind's tables.
    queries_from_txid: u64,
    stopping: Option<StopHow>,
    stop_done: Vec<oneshot::Sender<Result<()>>>,
    failed: Option<String>,
    /// Log mode: the TXID acknowledged (durable in the log); the root's
    /// TXID trails it until the next checkpoint.
    acked_txid: u64,
    /// Log mode: acknowledged records past the root, oldest first.
    unckpt: Vec<Unckpt>,
    /// Log mode: the wait for the oldest in-flight group's slot.
    logwait: Option<JoinHandle<LogDone>>,
    /// Log mode: the checkpoint in progress.
    ckpt: Option<JoinHandle<CkDone>>,
    /// Log mode: when records past the root are checkpointed though no
    /// size trigger fired.
    ckpt_due: Option<tokio::time::Instant>,
    ckpt_failures: u32,
    charge: OpenCharge,
}

impl std::fmt::Debug for Actor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Actor")
            .field("cell", &self.cell_id)
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

/// Everything [`Actor::new`] needs.
#[derive(Debug)]
pub(crate) struct ActorStart {
    pub cell_id: CellId,
    pub epoch: Epoch,
    pub cell: Cell,
    pub root: Versioned<RootRecord>,
    pub chain_bytes: Vec<Option<Arc<Vec<u8>>>>,
    pub migration: Option<Publication>,
    pub rx: mpsc::Receiver<Msg>,
    pub load: Arc<AtomicUsize>,
    pub charge: OpenCharge,
    /// Log mode: acknowledged records past `root` (a parked tail) and
    /// when their checkpoint is due.
    pub tail: Vec<Unckpt>,
    pub tail_due: tokio::time::Instant,
}

impl Actor {
    pub(crate) fn new(ctx: Arc<ActorContext>, start: ActorStart) -> (Self, Option<Publication>) {
        let actor = Self {
            cell_id: start.cell_id,
            epoch: start.epoch,
            cell: Some(start.cell),
            root: start.root,
            chain_bytes: start.chain_bytes,
            ctx,
            rx: start.rx,
            rx_done: false,
            load: start.load,
            batch: VecDeque::new(),
            held: Vec::new(),
            inflight: VecDeque::new(),
            cas: None,
            compaction: None,
            snapshot_compaction: false,
            waiters: Vec::new(),
            queries_from_txid: 0,
            stopping: None,
            stop_done: Vec::new(),
            failed: None,
            acked_txid: 0,
            unckpt: Vec::new(),
            logwait: None,
            ckpt: None,
            ckpt_due: None,
            ckpt_failures: 0,
            charge: start.charge,
        };
        let mut actor = actor;
        actor.acked_txid = start
            .tail
            .last()
            .map_or(actor.root.record.txid, |record| record.file.max_txid);
        if !start.tail.is_empty() {
            actor.ckpt_due = Some(start.tail_due);
        }
        actor.unckpt = start.tail;
        (actor, start.migration)
    }

    /// The TXID replies and queries may rely on: the root's in cell mode,
    /// the log's acknowledged one in log mode.
    fn published_txid(&self) -> u64 {
        if self.ctx.log.is_some() {
            self.acked_txid
        } else {
            self.root.record.txid
        }
    }

    fn log_mode(&self) -> bool {
        self.ctx.log.is_some()
    }

    fn receipt(&self, txid: u64) -> Receipt {
        Receipt {
            cell: self.cell_id.clone(),
            epoch: self.epoch,
            txid,
        }
    }

    /// Runs until stopped; returns how it ended.
    pub(crate) async fn run(mut self, migration: Option<Publication>) -> Exit {
        if let Some(migration) = migration {
            self.queries_from_txid = migration.txid.0;
            self.start_publication(migration, 0, Vec::new());
        }
        // A chain left long by an earlier owner (or by compactions that
        // failed) is compacted from the start, not only after a commit.
        self.maybe_prepare_compaction().await;
        loop {
            self.try_execute().await;
            if self.log_mode() {
                self.try_wait_log();
                // A passivating Cell whose tail can be parked does not
                // checkpoint for stopping: only its size triggers apply.
                let stopping = matches!(self.stopping, Some(StopHow::Passivate | StopHow::Drain))
                    && !self.parks_tail();
                let due = self
                    .ckpt_due
                    .is_some_and(|due| due <= tokio::time::Instant::now());
                if (stopping && self.inflight.is_empty() && self.batch.is_empty()) || due {
                    self.maybe_checkpoint(true).await;
                } else {
                    self.maybe_checkpoint(false).await;
                }
            } else {
                self.try_start_cas().await;
            }
            if self.finished() {
                break;
            }
            let event = self.next_event().await;
            match event {
                Event::Cas(Ok(done)) => self.on_cas(done).await,
                Event::Cas(Err(join)) => {
                    if let Some(front) = self.inflight.pop_front() {
                        self.answer_unknown(front.txid, format!("publication task failed: {join}"));
                    }
                    self.fail(
                        format!("publication task failed: {join}"),
                        FailKind::Unknown,
                    )
                    .await;
                }
                Event::Log(Ok(done)) => self.on_log(done).await,
                Event::Log(Err(join)) => {
                    self.fail(format!("log wait failed: {join}"), FailKind::Unknown)
                        .await;
                }
                Event::Checkpoint(Ok(done)) => self.on_checkpoint(done).await,
                Event::Checkpoint(Err(join)) => {
                    self.fail(format!("checkpoint task failed: {join}"), FailKind::Unknown)
                        .await;
                }
                Event::Msg(Some(msg)) => self.on_msg(msg).await,
                Event::Msg(None) => {
                    self.rx_done = true;
                    if self.stopping.is_none() {
                        self.stopping = Some(StopHow::Passivate);
                    }
                }
                Event::Tick => self.expire_waiters(),
                Event::Idle => {
                    // Work is queued but the engine refuses it and nothing
                    // is in flight to unblock it: give up on the Cell.
                    self.fail(
                        "the cell cannot execute and nothing is publishing".into(),
                        FailKind::NotCommitted,
                    )
                    .await;
                }
            }
        }
        self.finish().await
    }

    async fn next_event(&mut self) -> Event {
        let cas_active = self.cas.is_some();
        let log_active = self.logwait.is_some();
        let ckpt_active = self.ckpt.is_some();
        let accept = !self.rx_done && self.batch.len() < self.ctx.group_commands_max;
        let deadline = self
            .waiters
            .iter()
            .map(|w| w.deadline)
            .chain(self.ckpt_due.filter(|_| !ckpt_active))
            .min();
        let cas = &mut self.cas;
        let logwait = &mut self.logwait;
        let ckpt = &mut self.ckpt;
        let rx = &mut self.rx;
        tokio::select! {
            biased;
            done = async { cas.as_mut().expect("guarded by cas_active").await }, if cas_active => {
                *cas = None;
                Event::Cas(done)
            }
            done = async { logwait.as_mut().expect("guarded by log_active").await }, if log_active => {
                *logwait = None;
                Event::Log(done)
            }
            done = async { ckpt.as_mut().expect("guarded by ckpt_active").await }, if ckpt_active => {
                *ckpt = None;
                Event::Checkpoint(done)
            }
            msg = rx.recv(), if accept => Event::Msg(msg),
            _ = tokio::time::sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)), if deadline.is_some() => Event::Tick,
            else => Event::Idle,
        }
    }

    fn finished(&self) -> bool {
        match &self.stopping {
            None => self.failed.is_some(),
            Some(StopHow::Fence(_)) => true,
            Some(_) => {
                self.failed.is_some()
                    || (self.rx_done
                        && self.batch.is_empty()
                        && self.inflight.is_empty()
                        && self.cas.is_none()
                        && self.logwait.is_none()
                        && self.ckpt.is_none()
                        && (self.unckpt.is_empty() || self.parks_tail()))
            }
        }
    }

    /// Log mode, passivating: whether the acknowledged records past the
    /// root leave with the Cell (parked in memory, checkpointed later by
    /// the node) instead of being checkpointed before it closes. They can
    /// when they are safe in this session's own lane (the root points
    /// there), nothing of the Cell is unsettled, and the one file their
    /// checkpoint adds keeps the chain under its bound (the node's
    /// checkpoint of a parked tail cannot compact).
    fn parks_tail(&self) -> bool {
        // Asked on every turn of the actor's loop: the cheap conditions
        // first, the lane's hash only for a Cell that is passivating.
        let (Some(log), Some(pointer)) = (&self.ctx.log, &self.root.record.log) else {
            return false;
        };
        matches!(self.stopping, Some(StopHow::Passivate))
            && self.failed.is_none()
            && self.inflight.is_empty()
            && self.batch.is_empty()
            && self.compaction.is_none()
            && self.root.record.chain.len() + 1 < hard_chain_bound(self.ctx.chain_files_max)
            && pointer.lane == *log.lane_of(&self.cell_id).writer().lane()
    }

    async fn on_msg(&mut self, msg: Msg) {
        match msg {
            Msg::Execute {
                command,
                bytes,
                reply,
            } => {
                self.batch.push_back(Queued {
                    command,
                    bytes,
                    reply,
                });
                // Take whatever else is waiting into the same group.
                while self.batch.len() < self.ctx.group_commands_max {
                    match self.rx.try_recv() {
                        Ok(Msg::Execute {
                            command,
                            bytes,
                            reply,
                        }) => self.batch.push_back(Queued {
                            command,
                            bytes,
                            reply,
                        }),
                        Ok(other) => {
                            Box::pin(self.on_msg(other)).await;
                            break;
                        }
                        Err(_) => break,
                    }
                }
            }
            Msg::Query {
                name,
                args,
                min_txid,
                reply,
            } => self.on_query(name, args, min_txid, reply).await,
            Msg::Resolve {
                id,
                expires_at_ms,
                reply,
            } => {
                let answer = self.resolve(id, expires_at_ms).await;
                reply.send(answer);
            }
            Msg::Describe { reply } => {
                let _ = reply.send(CellDescription {
                    cell: self.cell_id.clone(),
                    kind: self.root.record.kind.clone(),
                    epoch: self.epoch,
                    txid: self.published_txid(),
                    revision: self.root.record.revision,
                    chain_files: self.root.record.chain.len(),
                    open: true,
                    queued: self.load.load(Ordering::Relaxed),
                });
            }
            Msg::Stop { how, done } => {
                if let Some(done) = done {
                    self.stop_done.push(done);
                }
                self.rx.close();
                match how {
                    StopHow::Fence(reason) => {
                        self.fail(reason.clone(), FailKind::Fenced).await;
                        self.stopping = Some(StopHow::Fence(reason));
                    }
                    StopHow::Drain => self.stopping = Some(StopHow::Drain),
                    StopHow::Passivate => {
                        if self.stopping.is_none() {
                            self.stopping = Some(StopHow::Passivate);
                        }
                    }
                }
            }
        }
    }

    /// Runs `work` on the engine on the blocking pool. `None` if the
    /// engine was lost (the task panicked): the actor must stop.
    async fn with_cell<T, F>(&mut self, work: F) -> Option<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Cell) -> T + Send + 'static,
    {
        let mut cell = self.cell.take()?;
        let joined = tokio::task::spawn_blocking(move || {
            let out = work(&mut cell);
            (cell, out)
        })
        .await;
        match joined {
            Ok((cell, out)) => {
                self.cell = Some(cell);
                self.settle_fds();
                Some(out)
            }
            Err(error) => {
                tracing::error!(cell = %self.cell_id, %error, "cell engine task failed");
                None
            }
        }
    }

    /// Brings the charge's descriptors to what the Cell holds
    /// ([`Cell::descriptors`]: its readers come and go). When the node's
    /// budget has none to give, the Cell's idle readers are closed; readers
    /// pinned for a pending publication stay open past the budget until it
    /// is confirmed (the open-file limit keeps a reserve above `fds_max`
    /// for this). A read reserves its reader's descriptors before it opens
    /// one ([`Actor::reserve_reader`]).
    fn settle_fds(&mut self) {
        let Some(cell) = self.cell.as_mut() else {
            return;
        };
        let have = self.charge.fds.num_permits();
        let mut need = cell.descriptors();
        if need > have {
            let more = u32::try_from(need - have).unwrap_or(u32::MAX);
            match self.ctx.fd_permits.clone().try_acquire_many_owned(more) {
                Ok(more) => {
                    self.charge.fds.merge(more);
                    return;
                }
                Err(_) => {
                    cell.close_idle_readers();
                    need = cell.descriptors();
                }
            }
        }
        if need < have {
            drop(self.charge.fds.split(have - need));
        }
    }

    /// Takes the descriptors of the reader the next read opens (the Cell
    /// has none and nothing is pending), asking the node to passivate an
    /// idle Cell when `fds_max` is spent.
    async fn reserve_reader(&mut self) -> Result<()> {
        let opens = self
            .cell
            .as_ref()
            .is_some_and(|cell| cell.readers_open() == 0 && cell.has_published_view());
        if !opens {
            return Ok(());
        }
        let need = u32::try_from(self.ctx.fds_per_reader).unwrap_or(u32::MAX);
        let permits = self.ctx.fd_permits.clone();
        let more = match permits.clone().try_acquire_many_owned(need) {
            Ok(more) => more,
            Err(_) => {
                let _ = self.ctx.room.try_send(self.cell_id.clone());
                let wait = std::time::Duration::from_millis(self.ctx.activation_wait_ms_max);
                match tokio::time::timeout(wait, permits.acquire_many_owned(need)).await {
                    Ok(Ok(more)) => more,
                    _ => {
                        return Err(Error::ResourceExhausted {
                            what: "fds_max (descriptors for a Cell's reader)",
                            retry_after_ms: self.ctx.retry_after_ms,
                        })
                    }
                }
            }
        };
        self.charge.fds.merge(more);
        Ok(())
    }

    async fn on_query(
        &mut self,
        name: String,
        args: Value,
        min_txid: Option<u64>,
        reply: Reply<Queried>,
    ) {
        let min_txid = match (min_txid, self.queries_from_txid) {
            (min, 0) => min,
            (min, ready) => Some(min.unwrap_or(0).max(ready)),
        };
        match min_txid {
            Some(min) if min > self.published_txid() => {
                let executed = self.cell.as_ref().map_or(0, |cell| cell.position().txid.0);
                if min > executed || self.waiters.len() >= self.ctx.query_waiters_max {
                    reply.send(Err(Error::ReceiptNotReached {
                        txid: min,
                        waited_ms: 0,
                    }));
                    return;
                }
                self.park_query(min, name, args, reply);
            }
            _ if !self.cell.as_ref().is_some_and(Cell::has_published_view) => {
                // No reader holds the published state while a group is
                // pending (readers open on demand): answer once the group
                // is confirmed, and keep a reader from the next group on.
                if let Some(cell) = self.cell.as_mut() {
                    cell.want_view();
                }
                if self.waiters.len() >= self.ctx.query_waiters_max {
                    reply.send(Err(Error::ResourceExhausted {
                        what: "queries waiting on a cell",
                        retry_after_ms: self.ctx.retry_after_ms,
                    }));
                    return;
                }
                let next = self.published_txid() + 1;
                self.park_query(next, name, args, reply);
            }
            _ => {
                let answer = self.run_query(name, args).await;
                reply.send(answer);
            }
        }
    }

    /// The value and its TXID come from one engine call
    /// ([`Cell::query_with_position`]), so they name the same state.
    async fn run_query(&mut self, name: String, args: Value) -> Result<Queried> {
        self.reserve_reader().await?;
        match self
            .with_cell(move |cell| cell.query_with_position(&name, &args))
            .await
        {
            Some(Ok(answer)) => Ok(Queried {
                receipt: self.receipt(answer.position.txid.0),
                value: answer.value,
            }),
            Some(Err(error)) => Err(Error::from(error)),
            None => Err(Error::Closed("the cell engine was lost".into())),
        }
    }

    /// Keeps a query until `min_txid` is published (or its wait bound
    /// passes).
    fn park_query(&mut self, min_txid: u64, name: String, args: Value, reply: Reply<Queried>) {
        let deadline = tokio::time::Instant::now()
            + std::time::Duration::from_millis(self.ctx.query_wait_ms_max);
        self.waiters.push(QueryWaiter {
            min_txid,
            name,
            args,
            reply,
            deadline,
        });
    }

    fn expire_waiters(&mut self) {
        let now = tokio::time::Instant::now();
        let wait_ms = self.ctx.query_wait_ms_max;
        let (expired, kept): (Vec<_>, Vec<_>) =
            self.waiters.drain(..).partition(|w| w.deadline <= now);
        self.waiters = kept;
        for waiter in expired {
            waiter.reply.send(Err(Error::ReceiptNotReached {
                txid: waiter.min_txid,
                waited_ms: wait_ms,
            }));
        }
    }

    async fn serve_waiters(&mut self) {
        let published = self.published_txid();
        let (ready, kept): (Vec<_>, Vec<_>) = self
            .waiters
            .drain(..)
            .partition(|w| w.min_txid <= published);
        self.waiters = kept;
        for mut waiter in ready {
            if !self.cell.as_ref().is_some_and(Cell::has_published_view) {
                // Confirmed, but the next group (executed before anyone
                // asked) pinned no reader: wait for that one too.
                if let Some(cell) = self.cell.as_mut() {
                    cell.want_view();
                }
                waiter.min_txid = published + 1;
                self.waiters.push(waiter);
                continue;
            }
            let answer = self.run_query(waiter.name, waiter.args).await;
            waiter.reply.send(answer);
        }
    }

    async fn resolve(&mut self, id: CommandId, expires_at_ms: Option<i64>) -> Result<Resolution> {
        if self.held.iter().any(|h| h.result.id == id)
            || self.batch.iter().any(|q| q.command.id == id)
            || self.inflight.iter().any(|f| f.ids.contains(&id))
        {
            return Ok(Resolution::Unknown);
        }
        if let Some(cell) = self.cell.as_mut().filter(|cell| !cell.has_published_view()) {
            // Nothing reads the published ledger while a group is pending:
            // not known yet; the next group keeps a reader for the retry.
            cell.want_view();
            return Ok(Resolution::Unknown);
        }
        self.reserve_reader().await?;
        let found = self
            .with_cell(move |cell| cell.published_outcome(&id))
            .await
            .ok_or_else(|| Error::Closed("the cell engine was lost".into()))??;
        if let Some((txid, outcome)) = found {
            return Ok(Resolution::Committed {
                receipt: self.receipt(txid.0),
                outcome,
            });
        }
        let now = i64::try_from(self.ctx.clock.now_wall_ms()).unwrap_or(i64::MAX);
        Ok(missing_from_ledger(
            expires_at_ms,
            self.ctx.skew_margin_ms,
            now,
        ))
    }

    fn take_group(&mut self) -> Vec<Queued> {
        let mut group = Vec::new();
        let mut bytes = 0;
        while let Some(next) = self.batch.front() {
            let over_bytes = !group.is_empty() && bytes + next.bytes > self.ctx.group_bytes_max;
            if group.len() >= self.ctx.group_commands_max || over_bytes {
                break;
            }
            bytes += next.bytes;
            group.push(self.batch.pop_front().expect("front exists"));
        }
        group
    }

    async fn try_execute(&mut self) {
        if self.batch.is_empty() || self.failed.is_some() {
            return;
        }
        let can_execute = self.cell.as_ref().is_some_and(Cell::can_execute);
        if !can_execute {
            return;
        }
        let group = self.take_group();
        let commands: Vec<Command> = group.iter().map(|q| q.command.clone()).collect();
        let now_ms = i64::try_from(self.ctx.clock.now_wall_ms()).unwrap_or(i64::MAX);
        let started = Instant::now();
        let executed = self
            .with_cell(move |cell| cell.execute(&commands, now_ms))
            .await;
        self.ctx
            .metrics
            .publication_execute_seconds
            .observe_duration(started.elapsed());
        let result = match executed {
            None => {
                for queued in group {
                    queued.reply.send(Err(Error::NotCommitted {
                        reason: "the cell engine was lost".into(),
                    }));
                }
                self.fail("the cell engine was lost".into(), FailKind::NotCommitted)
                    .await;
                return;
            }
            Some(Err(error)) => {
                // Nothing ran: the state is intact unless the engine says
                // it is poisoned.
                let poisoned = matches!(error, cellfleet_cell::Error::Poisoned)
                    || self
                        .cell
                        .as_ref()
                        .is_some_and(|c| !c.can_execute() && c.pending_txid().is_none());
                let reason = if error.is_disk_full() {
                    if disk_full_warning_due(self.ctx.clock.now_wall_ms()) {
                        tracing::warn!(
                            cell = %self.cell_id,
                            %error,
                            "the data directory is full: commands to the Cells here fail \
                             (not committed) until space is freed (logged at most every 10 s)"
                        );
                    }
                    format!(
                        "{error}: this node's data directory is out of space; free space \
                         there (nothing of this group was committed: send the command again)"
                    )
                } else {
                    error.to_string()
                };
                for queued in group {
                    queued.reply.send(Err(Error::NotCommitted {
                        reason: reason.clone(),
                    }));
                }
                if poisoned {
                    self.fail(error.to_string(), FailKind::NotCommitted).await;
                }
                return;
            }
            Some(Ok(result)) => result,
        };
        let commands = group.len();
        let ids: Vec<CommandId> = group.iter().map(|q| q.command.id).collect();
        for (queued, result) in group.into_iter().zip(result.results) {
            match result.depends_on_txid {
                None => {
                    let txid = result.txid.map_or(self.published_txid(), |t| t.0);
                    queued.reply.send(Ok(Executed {
                        receipt: self.receipt(txid),
                        outcome: result.outcome,
                        duplicate: result.duplicate,
                    }));
                }
                Some(txid) => self.held.push(Held {
                    txid: txid.0,
                    result,
                    reply: queued.reply,
                }),
            }
        }
        if let Some(publication) = result.publication {
            self.start_publication(publication, commands, ids);
        }
    }

    fn start_publication(
        &mut self,
        publication: Publication,
        commands: usize,
        ids: Vec<CommandId>,
    ) {
        let bytes = Arc::new(publication.ltx);
        let file = LtxFile {
            bytes: bytes.clone(),
            min_txid: publication.header.min_txid.0,
            max_txid: publication.header.max_txid.0,
            file_checksum: publication.trailer.file_checksum.0,
            post_apply_checksum: publication.post.checksum.0,
        };
        if let Some(log) = &self.ctx.log {
            // Log mode: the group goes into the next segment of its lane.
            let slot = log.submit(Record {
                cell_id: self.cell_id.clone(),
                epoch: self.epoch,
                min_txid: file.min_txid,
                max_txid: file.max_txid,
                file_checksum: file.file_checksum,
                post_apply_checksum: file.post_apply_checksum,
                command_ids: ids.iter().map(|id| id.0).collect(),
                bytes: bytes.clone(),
            });
            self.inflight.push_back(InFlight {
                txid: publication.txid.0,
                upload: None,
                bytes,
                started: Instant::now(),
                commands,
                ids,
                file,
                slot: Some(slot),
                seq: None,
                answered: false,
            });
            return;
        }
        let publisher = self.ctx.publisher.clone();
        let cell = self.cell_id.clone();
        let epoch = self.epoch;
        let metrics = self.ctx.metrics.clone();
        let upload_file = file.clone();
        let upload = tokio::spawn(async move {
            let started = Instant::now();
            let uploaded = publisher.upload(&cell, epoch, upload_file).await;
            metrics
                .publication_upload_seconds
                .observe_duration(started.elapsed());
            uploaded
        });
        self.inflight.push_back(InFlight {
            txid: publication.txid.0,
            upload: Some(upload),
            bytes,
            started: Instant::now(),
            commands,
            ids,
            file,
            slot: None,
            seq: None,
            answered: false,
        });
    }

    /// A prepared compaction usable on the current root, if one is ready
    /// (or, when the chain is at its hard bound, once it is).
    async fn ready_compaction(&mut self) -> Option<(LtxRef, Arc<Vec<u8>>)> {
        let must_wait = self.root.record.chain.len() >= hard_chain_bound(self.ctx.chain_files_max);
        let ready = self.compaction.as_ref()?.is_finished() || must_wait;
        if !ready {
            return None;
        }
        let handle = self.compaction.take()?;
        let (compacted, bytes) = match handle.await {
            Ok(Ok(prepared)) => prepared,
            Ok(Err(failure)) => {
                tracing::warn!(cell = %self.cell_id, ?failure, "compaction failed; will retry");
                return None;
            }
            Err(error) => {
                tracing::warn!(cell = %self.cell_id, %error, "compaction task failed");
                return None;
            }
        };
        let boundary = self.root.record.chain.iter().any(|file| {
            file.max_txid == compacted.max_txid
                && file.post_apply_checksum == compacted.post_apply_checksum
        });
        boundary.then_some((compacted, bytes))
    }

    async fn try_start_cas(&mut self) {
        if self.cas.is_some() || self.failed.is_some() {
            return;
        }
        if self.inflight.front().is_none_or(|f| f.upload.is_none()) {
            return;
        }
        let at_bound = self.root.record.chain.len() >= hard_chain_bound(self.ctx.chain_files_max);
        if at_bound && self.compaction.is_none() {
            self.maybe_prepare_compaction().await;
        }
        let mut compaction = self.ready_compaction().await;
        if at_bound && compaction.is_none() && self.failed.is_none() {
            // The merge did not shrink or an upload failed: one more try,
            // of the other form (a merge is followed by a snapshot).
            self.maybe_prepare_compaction().await;
            compaction = self.ready_compaction().await;
        }
        if self.failed.is_some() {
            return;
        }
        if at_bound && compaction.is_none() {
            // One more delta would walk the chain into the root's hard
            // limit, after which no publication could ever succeed. Nothing
            // was written for the held groups: they are not committed, and
            // the next activation compacts first.
            self.fail(
                "the chain is at its bound and no compaction could be prepared".into(),
                FailKind::NotCommitted,
            )
            .await;
            return;
        }
        let Some(front) = self.inflight.front_mut() else {
            return;
        };
        let upload = front.upload.take().expect("checked above");
        let publisher = self.ctx.publisher.clone();
        let metrics = self.ctx.metrics.clone();
        let base = self.root.clone();
        let epoch = self.epoch;
        // Spawned: a CAS must never be cut off half-way by a dropped future.
        self.cas = Some(tokio::spawn(async move {
            let delta = match upload.await {
                Ok(Ok(delta)) => delta,
                Ok(Err(failure)) => {
                    return CasDone {
                        result: Err(failure),
                        compaction,
                    }
                }
                Err(error) => {
                    return CasDone {
                        result: Err(PublishFailure::NotCommitted(format!(
                            "upload task failed: {error}"
                        ))),
                        compaction,
                    }
                }
            };
            let started = Instant::now();
            let result = publisher
                .commit(PublishRequest {
                    base,
                    epoch,
                    delta: Some(delta),
                    compaction: compaction.as_ref().map(|(c, _)| c.clone()),
                    log: None,
                })
                .await;
            metrics
                .publication_cas_seconds
                .observe_duration(started.elapsed());
            CasDone { result, compaction }
        }));
    }

    async fn on_cas(&mut self, done: CasDone) {
        let Some(front) = self.inflight.pop_front() else {
            return;
        };
        match done.result {
            Ok(root) => self.committed(front, root, done.compaction).await,
            Err(PublishFailure::CommittedThenFenced(reason)) => {
                self.release_held(front.txid);
                self.fenced("publication committed, then fenced", reason)
                    .await;
            }
            Err(PublishFailure::Fenced(reason)) => {
                self.fenced("publication fenced", reason).await;
            }
            Err(PublishFailure::NotCommitted(reason)) => {
                tracing::warn!(cell = %self.cell_id, %reason, "publication not committed");
                self.fail(reason, FailKind::NotCommitted).await;
            }
            Err(PublishFailure::Unknown(reason)) => {
                self.ctx
                    .metrics
                    .publications_unknown_total
                    .fetch_add(1, Ordering::Relaxed);
                tracing::error!(cell = %self.cell_id, %reason, "publication fate unknown");
                let unknown_txid = front.txid;
                for held in std::mem::take(&mut self.held) {
                    let error = if held.txid == unknown_txid {
                        Error::Unknown {
                            reason: reason.clone(),
                        }
                    } else {
                        Error::NotCommitted {
                            reason: format!("an earlier publication's fate is unknown: {reason}"),
                        }
                    };
                    held.reply.send(Err(error));
                }
                self.fail(reason, FailKind::Unknown).await;
            }
        }
    }

    async fn committed(
        &mut self,
        front: InFlight,
        root: Versioned<RootRecord>,
        compaction: Option<(LtxRef, Arc<Vec<u8>>)>,
    ) {
        front.count_publication(&self.ctx.metrics);
        let metrics = &self.ctx.metrics;
        if compaction.is_some() {
            metrics.compactions_total.fetch_add(1, Ordering::Relaxed);
        }
        self.chain_bytes = cache_for(
            &self.root.record,
            &self.chain_bytes,
            &root.record,
            &[
                Some(front.bytes.clone()),
                compaction.as_ref().map(|(_, b)| b.clone()),
            ],
            &[
                root.record.chain.last().map(|f| f.key.clone()),
                compaction.as_ref().map(|(c, _)| c.key.clone()),
            ],
            self.ctx.chain_cache_bytes_max,
        );
        self.root = root;
        let txid = front.txid;
        let confirmed = self.with_cell(move |cell| cell.confirm(Txid(txid))).await;
        // The root holds the group now: its replies are true whatever the
        // local engine does next.
        self.release_held(txid);
        if !self.confirmed(confirmed).await {
            return;
        }
        self.serve_waiters().await;
        self.maybe_prepare_compaction().await;
    }

    /// Whether the engine confirmed a durable group; else the actor fails
    /// (the replies are out already: the group is durable either way).
    async fn confirmed<T>(&mut self, confirmed: Option<cellfleet_cell::Result<T>>) -> bool {
        match confirmed {
            Some(Ok(_)) => true,
            Some(Err(error)) => {
                self.fail(format!("confirm failed: {error}"), FailKind::NotCommitted)
                    .await;
                false
            }
            None => {
                self.fail("the cell engine was lost".into(), FailKind::NotCommitted)
                    .await;
                false
            }
        }
    }

    /// Answers UNKNOWN to the held replies of the group at `txid`.
    fn answer_unknown(&mut self, txid: u64, reason: impl Into<String>) {
        let reason = reason.into();
        let (unknown, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|h| h.txid == txid);
        self.held = kept;
        for held in unknown {
            held.reply.send(Err(Error::Unknown {
                reason: reason.clone(),
            }));
        }
    }

    /// Releases held replies published at or before `txid`.
    fn release_held(&mut self, txid: u64) {
        let (ready, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|h| h.txid <= txid);
        self.held = kept;
        for held in ready {
            let receipt = self.receipt(held.result.txid.map_or(held.txid, |t| t.0));
            held.reply.send(Ok(Executed {
                receipt,
                outcome: held.result.outcome,
                duplicate: held.result.duplicate,
            }));
        }
    }

    async fn maybe_prepare_compaction(&mut self) {
        let chain = &self.root.record.chain;
        if self.compaction.is_some() || chain.len() < self.ctx.chain_files_max.max(2) {
            return;
        }
        let all_cached =
            self.chain_bytes.len() == chain.len() && self.chain_bytes.iter().all(Option::is_some);
        let publisher = self.ctx.publisher.clone();
        let cell_id = self.cell_id.clone();
        let epoch = self.epoch;
        if all_cached && !self.snapshot_compaction {
            let inputs: Vec<(Arc<Vec<u8>>, Position)> = chain
                .iter()
                .zip(&self.chain_bytes)
                .map(|(file, bytes)| {
                    (
                        bytes.clone().expect("all cached"),
                        Position {
                            txid: Txid(file.max_txid),
                            checksum: Checksum(file.post_apply_checksum),
                        },
                    )
                })
                .collect();
            self.compaction = Some(tokio::spawn(async move {
                let merged = tokio::task::spawn_blocking(move || {
                    let files: Vec<ChainFile<&[u8]>> = inputs
                        .iter()
                        .map(|(bytes, post)| ChainFile {
                            ltx: bytes.as_slice(),
                            post: *post,
                        })
                        .collect();
                    cellfleet_cell::compact(&files)
                })
                .await
                .map_err(|e| PublishFailure::NotCommitted(e.to_string()))?
                .map_err(|e| PublishFailure::NotCommitted(e.to_string()))?;
                if !merged.shrank {
                    return Err(PublishFailure::NotCommitted("merge does not shrink".into()));
                }
                let bytes = Arc::new(merged.ltx);
                let file = LtxFile {
                    bytes: bytes.clone(),
                    min_txid: 1,
                    max_txid: merged.post.txid.0,
                    file_checksum: merged.trailer.file_checksum.0,
                    post_apply_checksum: merged.post.checksum.0,
                };
                Ok((publisher.upload(&cell_id, epoch, file).await?, bytes))
            }));
            // Next time, a merge that did not shrink falls back to a snapshot.
            self.snapshot_compaction = true;
            return;
        }
        self.snapshot_compaction = false;
        if self.log_mode() && self.acked_txid != self.root.record.txid {
            // The engine's state is past the root's chain: its snapshot
            // would sit on no chain boundary. At the bound the checkpoint
            // itself is a snapshot (maybe_checkpoint).
            return;
        }
        let now_ms = i64::try_from(self.ctx.clock.now_wall_ms()).unwrap_or(i64::MAX);
        let snapshot = match self.with_cell(move |cell| cell.snapshot(now_ms)).await {
            Some(Ok(snapshot)) => snapshot,
            Some(Err(error)) => {
                tracing::warn!(cell = %self.cell_id, %error, "snapshot for compaction failed");
                return;
            }
            None => {
                self.fail("the cell engine was lost".into(), FailKind::NotCommitted)
                    .await;
                return;
            }
        };
        let bytes = Arc::new(snapshot.ltx);
        let file = LtxFile {
            bytes: bytes.clone(),
            min_txid: 1,
            max_txid: snapshot.post.txid.0,
            file_checksum: snapshot.trailer.file_checksum.0,
            post_apply_checksum: snapshot.post.checksum.0,
        };
        self.compaction = Some(tokio::spawn(async move {
            Ok((publisher.upload(&cell_id, epoch, file).await?, bytes))
        }));
    }

    /// Another owner holds the root: counts the fence, says `what`, and
    /// fails the actor as fenced.
    async fn fenced(&mut self, what: &'static str, reason: String) {
        self.ctx
            .metrics
            .fences_total
            .fetch_add(1, Ordering::Relaxed);
        tracing::warn!(cell = %self.cell_id, epoch = %self.epoch, %reason, "{what}");
        self.fail(reason, FailKind::Fenced).await;
    }

    /// Ends the actor's work after a failure: every held reply not already
    /// answered gets `NotCommitted`, queued commands get `Closed` (they
    /// never ran), pending publications are aborted.
    async fn fail(&mut self, reason: String, kind: FailKind) {
        if self.failed.is_some() {
            return;
        }
        self.failed = Some(reason.clone());
        if let Some(cas) = self.cas.take() {
            // Never abandoned blind: the CAS in flight decides its own
            // group's replies before the rest are answered.
            self.settle_abandoned_cas(cas).await;
        }
        let log_mode = self.log_mode();
        for held in std::mem::take(&mut self.held) {
            // In log mode a held group's segment may still land (and then
            // counts): never call it not committed.
            held.reply.send(Err(if log_mode {
                Error::Unknown {
                    reason: format!("{reason}; the group's segment may still land"),
                }
            } else {
                Error::NotCommitted {
                    reason: reason.clone(),
                }
            }));
        }
        if let Some(wait) = self.logwait.take() {
            wait.abort();
        }
        if let Some(ckpt) = self.ckpt.take() {
            ckpt.abort();
        }
        if !self.unckpt.is_empty() {
            self.ctx
                .metrics
                .checkpoint_lag_records
                .fetch_sub(self.unckpt.len() as i64, Ordering::Relaxed);
            self.unckpt.clear();
        }
        for queued in std::mem::take(&mut self.batch) {
            queued.reply.send(Err(Error::Closed(reason.clone())));
        }
        for waiter in std::mem::take(&mut self.waiters) {
            waiter.reply.send(Err(Error::Closed(reason.clone())));
        }
        for inflight in std::mem::take(&mut self.inflight) {
            if let Some(upload) = inflight.upload {
                upload.abort();
            }
        }
        if let Some(compaction) = self.compaction.take() {
            compaction.abort();
        }
        let pending = self
            .cell
            .as_ref()
            .is_some_and(|c| c.pending_txid().is_some());
        if pending {
            let _ = self.with_cell(|cell| cell.abort()).await;
        }
        if kind != FailKind::NotCommitted {
            self.close_cell(Close::Drop).await;
            self.ctx.activator.discard(&self.cell_id);
        }
    }

    /// Waits for a CAS in flight while the actor is failing, and answers
    /// its group by its fate.
    async fn settle_abandoned_cas(&mut self, cas: JoinHandle<CasDone>) {
        let Some(front) = self.inflight.pop_front() else {
            return;
        };
        match cas.await {
            Ok(CasDone {
                result: Ok(root), ..
            }) => {
                self.root = root;
                self.release_held(front.txid);
            }
            Ok(CasDone {
                result: Err(PublishFailure::CommittedThenFenced(_)),
                ..
            }) => self.release_held(front.txid),
            Ok(CasDone {
                result: Err(PublishFailure::Unknown(reason)),
                ..
            }) => {
                self.answer_unknown(front.txid, reason);
            }
            Ok(CasDone { result: Err(_), .. }) => {}
            Err(error) => {
                self.answer_unknown(front.txid, format!("publication task failed: {error}"));
            }
        }
    }

    /// Closes the engine as `how` says.
    async fn close_cell(&mut self, how: Close) {
        if let Some(cell) = self.cell.take() {
            let _ = tokio::task::spawn_blocking(move || match how {
                Close::Tidy => cell.close(),
                Close::KeepSidecars => cell.close_keeping_sidecars(),
                Close::Drop => drop(cell),
            })
            .await;
        }
    }

    /// Closes the engine and answers whatever is left; returns how it ended.
    async fn finish(mut self) -> Exit {
        self.rx.close();
        while let Ok(msg) = self.rx.try_recv() {
            answer_closed(msg, "the cell actor stopped");
        }
        // Only a passivated Cell keeps its files (a drained one is
        // released and discarded, a fenced or failed one discarded).
        let passivates = self.failed.is_none()
            && !matches!(self.stopping, Some(StopHow::Drain | StopHow::Fence(_)));
        // A Cell that leaves records with the node is likely reopened
        // soon; the node tidies its sidecars once it checkpoints them.
        let how = match (passivates, self.unckpt.is_empty()) {
            (false, _) => Close::Drop,
            (true, true) => Close::Tidy,
            (true, false) => Close::KeepSidecars,
        };
        self.close_cell(how).await;
        let exit = match (&self.failed, &self.stopping) {
            (Some(_), _) | (None, Some(StopHow::Fence(_))) => (Exit::Gone, Ok(())),
            (None, Some(StopHow::Drain)) => {
                match self
                    .ctx
                    .publisher
                    .release(self.root.clone(), self.epoch)
                    .await
                {
                    Ok(_) => {
                        self.ctx.activator.discard(&self.cell_id);
                        (Exit::Gone, Ok(()))
                    }
                    Err(failure) => (
                        Exit::Gone,
                        Err(Error::NotCommitted {
                            reason: format!("release of cell {} failed: {failure:?}", self.cell_id),
                        }),
                    ),
                }
            }
            (None, _) => {
                self.ctx
                    .metrics
                    .passivations_total
                    .fetch_add(1, Ordering::Relaxed);
                let tail = std::mem::take(&mut self.unckpt);
                let due = self.ckpt_due.unwrap_or_else(|| {
                    tokio::time::Instant::now() + self.ctx.log_settings.idle_of(&self.cell_id)
                });
                (
                    Exit::Parked(Box::new(ParkedCell {
                        root: self.root.clone(),
                        tail,
                        due,
                    })),
                    Ok(()),
                )
            }
        };
        for done in self.stop_done.drain(..) {
            let _ = done.send(exit.1.clone());
        }
        exit.0
    }
}

/// How an actor closes its engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Close {
    /// WAL checkpointed into the file, `-wal` and `-shm` removed: the Cell
    /// is its database and lock file (a passivation with nothing parked).
    Tidy,
    /// WAL checkpointed, `-wal` and `-shm` kept for a reopen soon (a
    /// passivation that parks records; [`cellfleet_cell::tidy_closed`]
    /// removes them after the node's checkpoint).
    KeepSidecars,
    /// Just dropped: the files are about to be discarded, or the Cell
    /// failed and its next activation verifies them anyway.
    Drop,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FailKind {
    /// The root provably lacks the pending groups; local files are sound.
    NotCommitted,
    /// Another owner: local files are discarded.
    Fenced,
    /// The root's content is uncertain: local files are discarded.
    Unknown,
}

/// Checkpoint attempts while stopping before the actor stops without one.
const CHECKPOINT_ATTEMPTS_AT_STOP: u32 = 3;

/// The chain length at which a CAS waits for the compaction in progress
/// instead of appending one more file (well below the root's hard limit).
fn hard_chain_bound(chain_files_max: usize) -> usize {
    (chain_files_max.saturating_mul(2)).clamp(2, cellfleet_authority::root::CHAIN_LEN_MAX - 1)
}

/// The chain bytes kept for `next`'s chain: those of `previous` by key,
/// plus newly uploaded files; `None` for unknown ones, and none at all past
/// `bytes_max`.
fn cache_for(
    previous: &RootRecord,
    previous_bytes: &[Option<Arc<Vec<u8>>>],
    next: &RootRecord,
    new_bytes: &[Option<Arc<Vec<u8>>>],
    new_keys: &[Option<String>],
    bytes_max: u64,
) -> Vec<Option<Arc<Vec<u8>>>> {
    let lookup = |key: &str| -> Option<Arc<Vec<u8>>> {
        for (file, bytes) in previous.chain.iter().zip(previous_bytes) {
            if file.key == key {
                return bytes.clone();
            }
        }
        for (candidate, bytes) in new_keys.iter().zip(new_bytes) {
            if candidate.as_deref() == Some(key) {
                return bytes.clone();
            }
        }
        None
    };
    let cache: Vec<Option<Arc<Vec<u8>>>> = next.chain.iter().map(|f| lookup(&f.key)).collect();
    let total: u64 = cache.iter().flatten().map(|b| b.len() as u64).sum();
    if total > bytes_max {
        return vec![None; next.chain.len()];
    }
    cache
}

fn answer_closed(msg: Msg, reason: &str) {
    match msg {
        Msg::Execute { reply, .. } => reply.send(Err(Error::Closed(reason.into()))),
        Msg::Query { reply, .. } => reply.send(Err(Error::Closed(reason.into()))),
        Msg::Resolve { reply, .. } => reply.send(Err(Error::Closed(reason.into()))),
        Msg::Describe { .. } => {}
        Msg::Stop { done, .. } => {
            if let Some(done) = done {
                let _ = done.send(Ok(()));
            }
        }
    }
}

/// When the node last warned that its data directory is full (wall ms).
static DISK_FULL_WARNED_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Whether a full-disk warning is due at `now_ms`: at most one every 10 s
/// for the whole node, since every retried command hits the same full disk.
fn disk_full_warning_due(now_ms: u64) -> bool {
    use std::sync::atomic::Ordering;
    let last = DISK_FULL_WARNED_MS.load(Ordering::Relaxed);
    now_ms.saturating_sub(last) >= 10_000
        && DISK_FULL_WARNED_MS
            .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// ABSENT only when the ledger would still hold the entry had the
        /// command committed (the cell prunes an entry once its expiry is
        /// below `now - skew`), and never without the expiry.
        #[test]
        fn absent_only_while_the_ledger_would_still_keep_the_entry(
            expiry in proptest::option::of(-10_000i64..10_000),
            skew in 0i64..2_000,
            now in -10_000i64..10_000,
        ) {
            let verdict = missing_from_ledger(expiry, skew, now);
            let kept = expiry.map(|expiry| expiry >= now.saturating_sub(skew));
            match verdict {
                Resolution::Absent => prop_assert_eq!(kept, Some(true)),
                Resolution::Expired => prop_assert_eq!(kept, Some(false)),
                Resolution::NeedsExpiry => prop_assert_eq!(kept, None),
                other => prop_assert!(false, "unexpected {:?}", other),
            }
        }
    }
}
