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
//!
//! Code map: this module holds the actor's state, its event loop and its
//! mailbox; its jobs are one module each: [`execute`] (a group from the
//! mailbox to its publication, replies released in commit order),
//! [`cell_mode`] (the root CAS per group and the chain's compaction),
//! [`log_mode`] (the lane's verdicts and checkpoints), [`query`] (queries,
//! parked reads and resolves) and [`close`] (fencing, failure and exit);
//! [`replies`] is the pure rule of which held replies a group's end
//! answers, and how.

mod cell_mode;
mod close;
mod execute;
mod inline;
pub(crate) use inline::InlineRule;
mod log_mode;
mod query;
mod replies;

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
    UnckptRecords,
};
use cellfleet_authority::LogPointer;
use cellfleet_nodelog::lane::GroupFate;
use replies::{Answer, GroupEnd};

/// A committed (or stored) command's proof: read-your-writes fence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Receipt {
    /// The Cell.
    pub cell: CellId,
    /// The epoch that answered.
    pub epoch: Epoch,
    /// The TXID whose publication holds the outcome.
    pub txid: Txid,
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
    pub txid: Txid,
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
        min_txid: Option<Txid>,
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
    /// Raised after each acknowledged group ([`crate::watch`]).
    pub watches: Arc<crate::watch::Watches>,
    /// Which groups execute on the actor's task ([`inline`]).
    pub inline: inline::InlineRule,
    /// A query, or a group's command, on the actor's task stops short
    /// past this many VM steps and runs again on the pool.
    pub inline_steps_max: u64,
}

#[derive(Debug)]
struct Queued {
    command: Command,
    bytes: usize,
    reply: Reply<Executed>,
}

#[derive(Debug)]
struct Held {
    txid: Txid,
    result: CommandResult,
    reply: Reply<Executed>,
}

#[derive(Debug)]
struct InFlight {
    txid: Txid,
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
    min_txid: Txid,
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
    queries_from_txid: Txid,
    /// The Cell opened without its schema (a new Cell: the engine defers
    /// its migrations to the next group, so they publish with its first
    /// commands): the first group's TXID becomes `queries_from_txid`, and
    /// a query before any group applies the schema alone first.
    schema_due: bool,
    stopping: Option<StopHow>,
    stop_done: Vec<oneshot::Sender<Result<()>>>,
    failed: Option<String>,
    /// Log mode: the TXID acknowledged (durable in the log); the root's
    /// TXID trails it until the next checkpoint.
    acked_txid: Txid,
    /// Log mode: acknowledged records past the root, oldest first.
    unckpt: UnckptRecords,
    /// Log mode: the wait for the oldest in-flight group's slot.
    logwait: Option<JoinHandle<LogDone>>,
    /// Log mode: the checkpoint in progress.
    ckpt: Option<JoinHandle<CkDone>>,
    /// Log mode: when records past the root are checkpointed though no
    /// size trigger fired.
    ckpt_due: Option<tokio::time::Instant>,
    ckpt_failures: u32,
    charge: OpenCharge,
    /// The engine time per command of the last group (`None` until one
    /// ran): where the next group executes ([`inline::InlineRule`]).
    execute_per_command: Option<std::time::Duration>,
    /// The engine time of the last query (`None` until one ran, and after
    /// the reader was closed): where the next query runs.
    query_estimate: Option<std::time::Duration>,
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
            queries_from_txid: Txid::ZERO,
            schema_due: false,
            stopping: None,
            stop_done: Vec::new(),
            failed: None,
            acked_txid: Txid::ZERO,
            unckpt: UnckptRecords::default(),
            logwait: None,
            ckpt: None,
            ckpt_due: None,
            ckpt_failures: 0,
            charge: start.charge,
            execute_per_command: None,
            query_estimate: None,
        };
        let mut actor = actor;
        actor.acked_txid = start
            .tail
            .last()
            .map_or(actor.root.record.txid, |record| record.file.max_txid);
        if !start.tail.is_empty() {
            actor.ckpt_due = Some(start.tail_due);
        }
        actor.unckpt = UnckptRecords::new(start.tail);
        (actor, start.migration)
    }

    /// The TXID replies and queries may rely on: the root's in cell mode,
    /// the log's acknowledged one in log mode.
    fn published_txid(&self) -> Txid {
        if self.ctx.log.is_some() {
            self.acked_txid
        } else {
            self.root.record.txid
        }
    }

    fn log_mode(&self) -> bool {
        self.ctx.log.is_some()
    }

    fn receipt(&self, txid: Txid) -> Receipt {
        Receipt {
            cell: self.cell_id.clone(),
            epoch: self.epoch,
            txid,
        }
    }

    /// Runs until stopped; returns how it ended.
    pub(crate) async fn run(mut self, migration: Option<Publication>) -> Exit {
        // A signal that outlived an untrusted parked entry (a lease that
        // lapsed, a Cell written elsewhere since) catches up with the
        // state this actor starts from; it never moves back.
        self.ctx
            .watches
            .acknowledged(&self.cell_id, self.published_txid());
        if let Some(migration) = migration {
            self.queries_from_txid = migration.txid;
            self.start_publication(migration, 0, Vec::new());
        } else {
            // When in doubt, due: applying a schema that is there is a no-op.
            self.schema_due = self
                .cell
                .as_ref()
                .is_some_and(|cell| cell.schema_due().unwrap_or(true));
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
                        self.answer_unknown(
                            front.txid,
                            &format!("publication task failed: {join}"),
                        );
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

    /// Runs `work` on the engine here, on the actor's task, for work known
    /// to be short (a light confirm, a group [`inline`] allows). `None` as
    /// in [`Actor::with_cell`]: a panic loses the engine.
    fn with_cell_inline<T, F>(&mut self, work: F) -> Option<T>
    where
        F: FnOnce(&mut Cell) -> T,
    {
        let mut cell = self.cell.take()?;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(&mut cell))) {
            Ok(out) => {
                self.cell = Some(cell);
                self.settle_fds();
                Some(out)
            }
            Err(_) => {
                tracing::error!(cell = %self.cell_id, "cell engine panicked");
                None
            }
        }
    }

    /// Confirms the engine's oldest pending publication, `txid`. A light
    /// confirm ([`Cell::confirm_is_light`]: no WAL checkpoint, no file read
    /// or written) runs here, saving the blocking pool's two thread
    /// hand-offs once per group; any other runs there. `None` as in
    /// [`Actor::with_cell`]: a panic loses the engine.
    async fn confirm_engine(
        &mut self,
        txid: Txid,
    ) -> Option<cellfleet_cell::Result<cellfleet_cell::Position>> {
        let light = self.cell.as_ref().is_some_and(Cell::confirm_is_light);
        if !light {
            return self.with_cell(move |cell| cell.confirm(txid)).await;
        }
        self.with_cell_inline(|cell| cell.confirm(txid))
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

/// When the node last warned that its data directory is full (wall ms).
static DISK_FULL_WARNED_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

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
