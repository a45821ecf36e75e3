//! The node service: dispatcher (CellId → actor), admission, activation, passivation under limits, drain.
//!
//! Admission order for every request: draining → refuse; lease replaced or
//! retired → refuse; unknown kind → refuse; then find the Cell's actor. If
//! nothing is active or activating the map lookup is skipped (the
//! empty-ingress fast path) — after the same lease and shutdown checks.
//! With a live lease a warm Cell serves with zero bucket reads; once the
//! local deadline passed, every request first re-reads the root (one GET)
//! and serves only if this session still owns it at the actor's epoch.
//! Ownership is proven under a lease term (see [`crate::lease`]): after a
//! lapse, an open actor re-proves once and a parked root is read again,
//! so a node that wakes from a pause never answers from what it held
//! before.
//!
//! Activation reserves an open-Cell charge (one permit of
//! [`NodeLimits::effective_cells_open_max`]: count, file descriptors and
//! memory) *before* it runs and the actor holds it until teardown; without
//! a free charge the least recently used idle Cell is passivated, and if
//! there is none the request is refused at once.
//!
//! [`NodeLimits::effective_cells_open_max`]: crate::NodeLimits::effective_cells_open_max

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use cellfleet_authority::{CellId, Clock, Epoch, Holder, Layout, NodeId, NodeLeases, Roots};
use cellfleet_cell::{Command, CommandId, Txid};
use cellfleet_store::ObjectStore;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch, Semaphore};
use tracing::Instrument;

use crate::activation::{Activation, Activator, Ready};
use crate::actor::{Actor, ActorContext, ActorStart, Exit, Msg, OpenCharge, Reply, StopHow};
pub use crate::actor::{CellDescription, Executed, Queried, Receipt, Resolution};
use crate::config::NodeConfig;
use crate::config::PublicationMode;
use crate::error::{Error, Result};
use crate::kinds::Kinds;
use crate::lease::{cell_mode, LeaseKeeper, ServingMode};
use crate::log::NodeLog;
use crate::metrics::Metrics;
use crate::publication::{Publisher, StorePublisher};

mod flush;
mod lru;
mod parked;

use parked::Parked;

/// Times a request is re-dispatched after finding its actor stopped.
const DISPATCH_ATTEMPTS_MAX: usize = 3;

/// Idle Cells with a full mailbox passed over before one is asked to
/// passivate gives up.
const PASSIVATION_ASKS_MAX: usize = 8;

/// Actors' requests for descriptors waiting at once (one more is dropped:
/// a passivation the asker waits for is already on its way).
const ROOM_REQUESTS_MAX: usize = 64;

/// How long a request waiting for an open-Cell charge (or a reader's
/// descriptors) waits on the Cell it asked to passivate before it asks
/// one more. The permits a passivation frees go to whichever request
/// waits longest, or to one that finds them free before it queues, so
/// the Cell a waiter asked for does not always free its charge; with the
/// budget exactly spent (descriptors the bound, as by default on a machine
/// whose open-file limit is tighter than its memory) a waiter otherwise
/// sat out `activation_wait_ms_max` and was refused now and then
/// (BENCHMARKS.md, twenty-fifth measurement).
pub(crate) const ROOM_ASK_AGAIN_AFTER: Duration = Duration::from_millis(200);

#[derive(Clone, Debug)]
struct ActorHandle {
    tx: mpsc::Sender<Msg>,
    epoch: Epoch,
    generation: u64,
    load: Arc<std::sync::atomic::AtomicUsize>,
    last_used: Arc<AtomicU64>,
    /// The lease term under which this node last proved it owns the Cell.
    proven_term: Arc<AtomicU64>,
    /// Set once a passivation was asked for, so concurrent activations
    /// pick different victims.
    passivating: Arc<AtomicBool>,
    /// Becomes true once the actor has exited and left its slot (and its
    /// root parked): only then may the Cell be activated again.
    exited: watch::Receiver<bool>,
}

impl ActorHandle {
    /// Waits (bounded) until the actor has fully exited.
    async fn wait_exit(&self, bound: Duration) {
        let _ = tokio::time::timeout(bound, self.exited()).await;
    }

    /// Waits until the actor has fully exited; false if its task ended
    /// without saying so (it panicked: its slot stays).
    async fn exited(&self) -> bool {
        let mut exited = self.exited.clone();
        let done = exited.wait_for(|done| *done).await.is_ok();
        done
    }
}

type ActivationResult = Option<Result<ActorHandle>>;

#[derive(Clone, Debug)]
enum Slot {
    Active(ActorHandle),
    Activating(watch::Receiver<ActivationResult>),
}

#[derive(Debug)]
struct Shared {
    config: NodeConfig,
    kinds: Arc<Kinds>,
    metrics: Arc<Metrics>,
    lease: Arc<LeaseKeeper>,
    leases: NodeLeases,
    roots: Roots,
    activator: Activator,
    actor_context: Arc<ActorContext>,
    me: Holder,
    slots: RwLock<HashMap<CellId, Slot>>,
    slots_count: AtomicUsize,
    /// Passivated Cells still owned: the root last written, and the lease
    /// term under which it was proven ours.
    parked: Mutex<HashMap<CellId, Parked>>,
    open_permits: Arc<Semaphore>,
    /// `fds_max` descriptors: an open Cell holds `fds_per_cell` and
    /// `fds_per_reader` per read connection (its actor keeps the count).
    fd_permits: Arc<Semaphore>,
    activation_permits: Arc<Semaphore>,
    draining: AtomicBool,
    tick: AtomicU64,
    generation: AtomicU64,
    /// The least recently used idle Cells the last scan found, oldest
    /// last, each with its actor's generation (`node/lru.rs`).
    lru_candidates: Mutex<Vec<lru::Candidate<(CellId, u64)>>>,
    /// Dead sessions whose log this node has flushed or is flushing.
    flushed: Mutex<std::collections::HashSet<Holder>>,
}

/// The node service. Start it with [`Node::start`]; talk to it through the
/// returned [`NodeHandle`].
#[derive(Debug)]
pub struct Node;

/// A cheap, cloneable handle to a running node.
#[derive(Clone, Debug)]
pub struct NodeHandle {
    shared: Arc<Shared>,
}

impl Node {
    /// Acquires the node lease (a new session), starts the renewal loop and
    /// returns the handle. `store` must already have passed the start-up
    /// probe ([`cellfleet_store::probe::run`]).
    pub async fn start(
        config: NodeConfig,
        store: Arc<dyn ObjectStore>,
        clock: Arc<dyn Clock>,
        kinds: Arc<Kinds>,
    ) -> Result<NodeHandle> {
        let layout = Layout::new(&config.prefix)?;
        let metered = Arc::new(cellfleet_store::MeteredStore::new(store));
        let store: Arc<dyn ObjectStore> = metered.clone();
        let leases = NodeLeases::new(store.clone(), layout.clone(), clock.clone(), config.lease)?;
        let (held, me) = acquire_session(&leases, &config).await?;
        let metrics = Arc::new(Metrics::default());
        let _ = metrics.store.set(metered);
        let lease = Arc::new(LeaseKeeper::new(
            leases.clone(),
            clock.clone(),
            held,
            metrics.clone(),
        ));
        let roots = Roots::new(
            store.clone(),
            layout,
            clock.clone(),
            config.lease.drift_margin_ms,
        );
        let activator = node_activator(&config, &store, &roots, &clock, &me, &metrics);
        let limits = &config.limits;
        let fd_permits = Arc::new(Semaphore::new(limits.fds_max.min(Semaphore::MAX_PERMITS)));
        let (room_tx, room_rx) = mpsc::channel(ROOM_REQUESTS_MAX);
        let actor_context = Arc::new(actor_context(
            &config,
            &activator,
            &fd_permits,
            room_tx,
            &metrics,
        ));
        if cellfleet_cell::memory_statistics_on() {
            tracing::warn!(
                "SQLite counts its allocations under one process-wide lock, which slows a busy node; \
                 call cellfleet_cell::memory_statistics_off() before anything opens SQLite"
            );
        }
        let shared = Arc::new(Shared {
            open_permits: Arc::new(Semaphore::new(config.cells_open_max())),
            fd_permits,
            activation_permits: Arc::new(Semaphore::new(limits.activations_concurrent_max.max(1))),
            config,
            kinds,
            metrics,
            lease: lease.clone(),
            leases,
            roots,
            activator,
            actor_context,
            me,
            slots: RwLock::new(HashMap::new()),
            slots_count: AtomicUsize::new(0),
            parked: Mutex::new(HashMap::new()),
            draining: AtomicBool::new(false),
            tick: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            lru_candidates: Mutex::new(Vec::new()),
            flushed: Mutex::new(std::collections::HashSet::new()),
        });
        spawn_node_tasks(&shared, lease, room_rx);
        Ok(NodeHandle { shared })
    }
}

/// Acquires the node lease as a new session of this node (its lease says
/// where to reach it and whether it is ingress-only) and returns the lease
/// with the holder (node and session) this node acts as from now on.
async fn acquire_session(
    leases: &NodeLeases,
    config: &NodeConfig,
) -> Result<(cellfleet_authority::HeldLease, Holder)> {
    let held = leases
        .acquire_as(
            config.node_id.clone(),
            config.endpoints.clone(),
            config.ingress_only,
        )
        .await?;
    let me = Holder {
        node: config.node_id.clone(),
        session: held.session(),
    };
    Ok((held, me))
}

/// What activation needs from the node: the engine settings, the publisher
/// every Cell commits through and, in log mode, this session's node log
/// (started here). The actors share these same parts through the
/// [`ActorContext`], so they are made once.
fn node_activator(
    config: &NodeConfig,
    store: &Arc<dyn ObjectStore>,
    roots: &Roots,
    clock: &Arc<dyn Clock>,
    me: &Holder,
    metrics: &Arc<Metrics>,
) -> Activator {
    let limits = &config.limits;
    let cell_config = cell_config(config);
    let publisher = store_publisher(config, store, roots, clock, me, metrics);
    let log = match config.publication {
        PublicationMode::Log => Some(NodeLog::start(
            store.clone(),
            roots.layout().clone(),
            me.clone(),
            &config.log,
            &config.gc,
            clock.clone(),
            metrics.clone(),
        )),
        PublicationMode::Cell => None,
    };
    Activator {
        store: store.clone(),
        roots: roots.clone(),
        me: me.clone(),
        cells_dir: config.data_dir.join("cells"),
        cell_config,
        attempts_max: limits.activation_attempts_max,
        chain_cache_bytes_max: limits.chain_cache_bytes_max,
        clock: clock.clone(),
        publisher,
        log,
        settle_ms: config.log.reply_wait_ms,
        absent: Arc::default(),
    }
}

/// The engine settings every Cell of the node opens with: `[cell]`, with
/// the group, WAL and page cache bounds from `[limits]` and, in log mode, the bound on
/// pending publications from `[log]` (the node log's groups in flight per
/// Cell).
fn cell_config(config: &NodeConfig) -> cellfleet_cell::CellConfig {
    let mut cell_config = config.cell.clone();
    cell_config.group_commands_max = config.limits.group_commands_max;
    cell_config.checkpoint_wal_bytes = config.limits.cell_wal_bytes_max;
    cell_config.cache_bytes = config.limits.cell_cache_bytes_max;
    // A new Cell's schema publishes with its first commands (the actor
    // applies it alone before a query that comes first).
    cell_config.defer_migrations = true;
    cell_config.pending_publications_max = config.pending_publications_max();
    cell_config
}

/// What every actor of the node shares: the descriptor and checkpoint
/// budgets, the channel asking the node for room, activation (whose
/// publisher, clock and node log the actors use too) and the bounds from
/// `[limits]`, `[lease]` and `[log]`.
fn actor_context(
    config: &NodeConfig,
    activator: &Activator,
    fd_permits: &Arc<Semaphore>,
    room: mpsc::Sender<CellId>,
    metrics: &Arc<Metrics>,
) -> ActorContext {
    let limits = &config.limits;
    ActorContext {
        fd_permits: fd_permits.clone(),
        checkpoint_permits: Arc::new(Semaphore::new(
            config
                .log
                .checkpoints_inflight_max
                .clamp(1, Semaphore::MAX_PERMITS),
        )),
        room,
        retry_after_ms: limits.retry_after_ms,
        activation_wait_ms_max: limits.activation_wait_ms_max,
        fds_per_reader: limits.fds_per_reader,
        publisher: activator.publisher.clone(),
        activator: activator.clone(),
        clock: activator.clock.clone(),
        metrics: metrics.clone(),
        group_commands_max: limits.group_commands_max.max(1),
        group_bytes_max: limits.group_bytes_max.max(1),
        chain_files_max: limits.chain_files_max.max(2),
        chain_cache_bytes_max: limits.chain_cache_bytes_max,
        query_wait_ms_max: limits.query_wait_ms_max,
        query_waiters_max: limits.mailbox_commands_max,
        skew_margin_ms: i64::try_from(config.lease.drift_margin_ms).unwrap_or(i64::MAX),
        log: activator.log.clone(),
        log_settings: config.log.clone(),
        watches: Arc::new(crate::watch::Watches::default()),
        inline: crate::actor::InlineRule {
            commands_max: limits.inline_commands_max,
            bytes_max: limits.inline_bytes_max,
            budget: std::time::Duration::from_micros(limits.inline_execute_us_max),
        },
        inline_steps_max: limits.inline_steps_max,
    }
}

/// The publisher every Cell of the node commits through: uploads with
/// `upload_attempts_max` tries, and deletes replaced LTX files when `[gc]`
/// is on.
fn store_publisher(
    config: &NodeConfig,
    store: &Arc<dyn ObjectStore>,
    roots: &Roots,
    clock: &Arc<dyn Clock>,
    me: &Holder,
    metrics: &Arc<Metrics>,
) -> Arc<dyn Publisher> {
    let mut publisher = StorePublisher::new(
        store.clone(),
        roots.clone(),
        clock.clone(),
        me.clone(),
        config.limits.upload_attempts_max,
    );
    if config.gc.enabled {
        publisher = publisher.with_ltx_gc(
            std::time::Duration::from_millis(config.gc.min_age_ms),
            metrics.clone(),
        );
    }
    Arc::new(publisher)
}

/// The node's own tasks: flushing this node's earlier sessions' logs and
/// sweeping parked tails (log mode), making room for activations, renewing
/// the lease, ending the session when a successor seals its log, and
/// fencing every Cell when the lease is lost.
fn spawn_node_tasks(
    shared: &Arc<Shared>,
    lease: Arc<LeaseKeeper>,
    room_rx: mpsc::Receiver<CellId>,
) {
    if shared.config.publication == PublicationMode::Log {
        // Earlier sessions of this node ended without a drain, or they
        // would have left no log behind that a root needs.
        let flusher = shared.clone();
        tokio::spawn(async move {
            if let Err(error) = flusher.flush_own_earlier_sessions().await {
                tracing::warn!(%error, "listing this node's earlier sessions failed; their logs are flushed when their cells are taken over");
            }
        });
    }
    if shared.config.publication == PublicationMode::Log {
        tokio::spawn(Shared::sweep_parked(Arc::downgrade(shared)));
    }
    tokio::spawn(Shared::make_room(Arc::downgrade(shared), room_rx));
    tokio::spawn(lease.clone().run());
    // A sealed lane means a successor declared this session dead: it
    // ends, so the node cannot keep taking Cells into a log that no
    // longer counts (they would answer nobody until the lease ran out,
    // and a revived lease never runs out).
    if let Some(log) = shared.actor_context.log.clone() {
        let lease = lease.clone();
        tokio::spawn(async move {
            log.wait_sealed().await;
            let reason = "another node sealed this session's log (this node was paused or \
                          cut off past its lease); restart it to join with a new session";
            if !lease.begin_end(reason.into()) {
                return;
            }
            // Groups in flight learn their fate from their lanes first
            // (acknowledged below the seal, not committed at or after
            // it), so their replies are definite, not UNKNOWN.
            log.settle(SESSION_END_SETTLE).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
            lease.end_session().await;
        });
    }
    // A replaced lease stops the node at once: every Cell is fenced.
    let watcher = Arc::downgrade(shared);
    tokio::spawn(async move {
        lease.wait_stopped().await;
        if let Some(shared) = watcher.upgrade() {
            shared.fence_all("the node lease was lost").await;
        }
    });
}

/// Longest a node whose session was sealed waits for its lanes' groups in
/// flight to be decided before it fences every Cell.
const SESSION_END_SETTLE: Duration = Duration::from_secs(5);

/// The bytes a command charges against the mailbox budget: its name and
/// its arguments as JSON, counted without building the text.
fn command_bytes(command: &Command) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    serde_json::to_writer(&mut count, &command.args)
        .expect("a JSON value writes into a counter, which never fails");
    command.name.len() + count.0
}

/// An open Cell with nothing in its mailbox or groups, not already asked
/// to passivate.
fn is_idle(handle: &ActorHandle) -> bool {
    handle.load.load(Ordering::Relaxed) == 0 && !handle.passivating.load(Ordering::Relaxed)
}

impl Shared {
    fn slots(&self) -> std::sync::RwLockReadGuard<'_, HashMap<CellId, Slot>> {
        self.slots.read().unwrap_or_else(|e| e.into_inner())
    }

    fn slots_mut(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<CellId, Slot>> {
        self.slots.write().unwrap_or_else(|e| e.into_inner())
    }

    fn parked(&self) -> std::sync::MutexGuard<'_, HashMap<CellId, Parked>> {
        self.parked.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The node's serving mode and lease term, or why it serves nothing.
    fn admit(&self) -> Result<(ServingMode, u64)> {
        if self.draining.load(Ordering::SeqCst) {
            return Err(Error::Draining);
        }
        match self.lease.mode_and_term() {
            (ServingMode::Stopped(reason), _) => Err(Error::LeaseLost { reason }),
            live_or_fenced => Ok(live_or_fenced),
        }
    }

    fn remove_slot(&self, cell: &CellId, generation: Option<u64>) {
        let mut slots = self.slots_mut();
        let matches = match (slots.get(cell), generation) {
            (Some(Slot::Active(handle)), Some(generation)) => handle.generation == generation,
            (Some(_), None) => true,
            _ => false,
        };
        if matches {
            slots.remove(cell);
            self.slots_count.store(slots.len(), Ordering::SeqCst);
            // Closed (parked or gone): its watchers ask again, so a
            // signal never outlives the actor that raised it. (Every
            // actor's exit comes here, right after `Actor::run` returns.)
            self.actor_context.watches.closed(cell);
        }
    }

    /// The actors running now (Cells still activating have none yet).
    fn active_handles(&self) -> Vec<ActorHandle> {
        self.slots()
            .values()
            .filter_map(|slot| match slot {
                Slot::Active(handle) => Some(handle.clone()),
                Slot::Activating(_) => None,
            })
            .collect()
    }

    /// Stops every actor at once (no further publication is attempted).
    async fn fence_all(&self, reason: &str) {
        for handle in self.active_handles() {
            let _ = handle
                .tx
                .send(Msg::Stop {
                    how: StopHow::Fence(reason.to_owned()),
                    done: None,
                })
                .await;
        }
        self.forget_parked();
    }

    async fn not_owner(&self, cell: &CellId, owner: Option<NodeId>) -> Error {
        let endpoint = match &owner {
            Some(owner) => self
                .leases
                .read(owner)
                .await
                .ok()
                .flatten()
                .map(|lease| lease.record.endpoints.grpc)
                .filter(|grpc| !grpc.is_empty()),
            None => None,
        };
        Error::NotOwner {
            cell: cell.clone(),
            owner,
            endpoint,
        }
    }

    /// Self-fenced: one fresh root read proves (or disproves) ownership.
    async fn reprove(&self, cell: &CellId, handle: &ActorHandle) -> Result<()> {
        self.metrics
            .authority_reads_total
            .fetch_add(1, Ordering::Relaxed);
        let root = self.roots.read(cell).await?;
        let owned = root.as_ref().is_some_and(|root| {
            root.record
                .is_owned_by(&self.me.node, self.me.session, handle.epoch)
        });
        if owned {
            return Ok(());
        }
        let _ = handle.tx.try_send(Msg::Stop {
            how: StopHow::Fence("another owner holds the root".into()),
            done: None,
        });
        let owner = root.and_then(|root| root.record.owner);
        Err(self.not_owner(cell, owner).await)
    }

    /// The descriptor permits an open Cell without readers is charged.
    fn fds_per_cell_permits(&self) -> u32 {
        u32::try_from(self.config.limits.fds_per_cell).unwrap_or(u32::MAX)
    }

    /// An open-Cell charge if both budgets have room now.
    fn try_open_charge(&self) -> Option<OpenCharge> {
        let fds = self.fds_per_cell_permits();
        let open = self.open_permits.clone().try_acquire_owned().ok()?;
        let fds = self.fd_permits.clone().try_acquire_many_owned(fds).ok()?;
        Some(OpenCharge { _open: open, fds })
    }

    /// Passivates the least recently used idle Cell (not `except`) for
    /// each actor that asked for descriptors (a Cell about to open its
    /// reader when `fds_max` is spent).
    async fn make_room(shared: std::sync::Weak<Shared>, mut asks: mpsc::Receiver<CellId>) {
        while let Some(except) = asks.recv().await {
            let Some(shared) = shared.upgrade() else {
                return;
            };
            shared.passivate_lru_idle(Some(&except));
        }
    }

    /// Takes an open-Cell charge (a place among the open Cells and the
    /// descriptors of one without readers), passivating the LRU idle Cell
    /// if needed.
    async fn open_charge(&self) -> Result<OpenCharge> {
        if let Some(charge) = self.try_open_charge() {
            return Ok(charge);
        }
        let exhausted = Error::ResourceExhausted {
            what: "cells_open_max",
            retry_after_ms: self.config.limits.retry_after_ms,
        };
        if !self.passivate_lru_idle(None) {
            self.metrics.refusals_total.fetch_add(1, Ordering::Relaxed);
            return Err(exhausted);
        }
        let wait = Duration::from_millis(self.config.limits.activation_wait_ms_max);
        let fds = self.fds_per_cell_permits();
        let charge = async {
            let open = self.open_permits.clone().acquire_owned().await?;
            let fds = self.fd_permits.clone().acquire_many_owned(fds).await?;
            Ok::<_, tokio::sync::AcquireError>(OpenCharge { _open: open, fds })
        };
        let asked_again = || {
            self.passivate_lru_idle(None);
        };
        match wait_asking_again(wait, charge, asked_again).await {
            Some(charge) => Ok(charge),
            None => {
                self.metrics.refusals_total.fetch_add(1, Ordering::Relaxed);
                Err(exhausted)
            }
        }
    }

    /// Asks the least recently used idle Cell (other than `except`) to
    /// passivate; false if no idle Cell took the request. A Cell whose
    /// mailbox is full is passed over and stays a candidate later.
    fn passivate_lru_idle(&self, except: Option<&CellId>) -> bool {
        let mut passed_over = Vec::new();
        let mut asked = false;
        while let Some(victim) = self.claim_lru_idle(except) {
            let stop = Msg::Stop {
                how: StopHow::Passivate,
                done: None,
            };
            if victim.tx.try_send(stop).is_ok() {
                asked = true;
                break;
            }
            passed_over.push(victim);
            if passed_over.len() >= PASSIVATION_ASKS_MAX {
                break;
            }
        }
        for handle in passed_over {
            handle.passivating.store(false, Ordering::SeqCst);
        }
        asked
    }

    /// Claims the least recently used idle Cell (other than `except`) for
    /// passivation, or `None` if every open Cell is busy.
    fn claim_lru_idle(&self, except: Option<&CellId>) -> Option<ActorHandle> {
        // Candidates from the last scan first, each taken only if nothing
        // used it since; one new scan when they run out (`node/lru.rs`).
        // A victim another activation claimed first fails the check, so
        // concurrent activations each claim a different one.
        let mut candidates = self
            .lru_candidates
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut scanned = false;
        loop {
            let Some(candidate) = candidates.pop() else {
                if scanned {
                    return None;
                }
                *candidates = self.scan_lru_idle();
                scanned = true;
                continue;
            };
            let (cell, generation) = &candidate.what;
            if Some(cell) == except {
                continue;
            }
            let slots = self.slots();
            let Some(Slot::Active(handle)) = slots.get(cell) else {
                continue;
            };
            let claimable = lru::still_the_oldest(
                candidate.last_used,
                *generation,
                handle.generation,
                handle.last_used.load(Ordering::Relaxed),
                is_idle(handle),
            );
            if claimable && !handle.passivating.swap(true, Ordering::SeqCst) {
                return Some(handle.clone());
            }
        }
    }

    /// The least recently used idle Cells: one pass under the read lock
    /// that copies only the ones it keeps. Each last use is read once, so
    /// requests moving it cannot upset the choice.
    fn scan_lru_idle(&self) -> Vec<lru::Candidate<(CellId, u64)>> {
        let slots = self.slots();
        let idle = slots.iter().filter_map(|(cell, slot)| match slot {
            Slot::Active(handle) if is_idle(handle) => Some(lru::Candidate {
                last_used: handle.last_used.load(Ordering::Relaxed),
                what: (cell, handle.generation),
            }),
            _ => None,
        });
        lru::oldest(idle, lru::CANDIDATES_PER_SCAN)
            .into_iter()
            .map(|c| lru::Candidate {
                last_used: c.last_used,
                what: (c.what.0.clone(), c.what.1),
            })
            .collect()
    }

    /// Refuses a new Cell past `cells_owned_max` (a parked one is owned
    /// already and comes back).
    fn check_owned_room(&self, cell_id: &CellId) -> Result<()> {
        let (is_parked, owned) = {
            let parked = self.parked();
            (
                parked.contains_key(cell_id),
                self.slots_count.load(Ordering::SeqCst) + parked.len(),
            )
        };
        if !is_parked && owned >= self.config.limits.cells_owned_max {
            self.metrics.refusals_total.fetch_add(1, Ordering::Relaxed);
            return Err(Error::ResourceExhausted {
                what: "cells_owned_max",
                retry_after_ms: self.config.limits.retry_after_ms,
            });
        }
        Ok(())
    }

    /// One of `activations_concurrent_max` permits, waited for at most
    /// `activation_wait_ms_max`.
    async fn activation_slot(&self) -> Result<tokio::sync::OwnedSemaphorePermit> {
        let wait = Duration::from_millis(self.config.limits.activation_wait_ms_max);
        match tokio::time::timeout(wait, self.activation_permits.clone().acquire_owned()).await {
            Ok(Ok(slot)) => Ok(slot),
            _ => {
                self.metrics.refusals_total.fetch_add(1, Ordering::Relaxed);
                Err(Error::ResourceExhausted {
                    what: "activations_concurrent_max",
                    retry_after_ms: self.config.limits.retry_after_ms,
                })
            }
        }
    }

    /// Counts how an activation went, and starts flushing a lane it sealed.
    fn count_activation(self: &Arc<Self>, ready: &Ready) {
        let metrics = &self.metrics;
        let counter = match ready.how {
            cellfleet_authority::OwnedHow::Created => &metrics.activations_created_total,
            cellfleet_authority::OwnedHow::Adopted => &metrics.activations_adopted_total,
            cellfleet_authority::OwnedHow::TookOver => &metrics.activations_took_over_total,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if ready.recovered {
            metrics
                .activations_recovered_total
                .fetch_add(1, Ordering::Relaxed);
        }
        if ready.absence_used {
            metrics
                .activation_root_reads_saved_total
                .fetch_add(1, Ordering::Relaxed);
        }
        metrics
            .log_replayed_records_total
            .fetch_add(ready.replayed as u64, Ordering::Relaxed);
        if let Some(lane) = &ready.sealed {
            metrics.log_seals_total.fetch_add(1, Ordering::Relaxed);
            self.start_flush(Holder {
                node: lane.node.clone(),
                session: lane.session,
            });
        }
    }

    /// Starts the actor of an activated Cell; it parks or removes its slot
    /// when it exits.
    fn start_actor(
        self: &Arc<Self>,
        cell_id: CellId,
        ready: Ready,
        term: u64,
        charge: OpenCharge,
    ) -> ActorHandle {
        self.metrics.cells_open.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(self.config.limits.mailbox_commands_max.max(1));
        let (exited_tx, exited_rx) = watch::channel(false);
        let generation = self.generation.fetch_add(1, Ordering::Relaxed);
        let handle = ActorHandle {
            tx,
            epoch: ready.epoch,
            generation,
            load: Arc::new(AtomicUsize::new(0)),
            last_used: Arc::new(AtomicU64::new(self.tick.fetch_add(1, Ordering::Relaxed))),
            proven_term: Arc::new(AtomicU64::new(term)),
            passivating: Arc::new(AtomicBool::new(false)),
            exited: exited_rx,
        };
        let (actor, migration) = Actor::new(
            self.actor_context.clone(),
            ActorStart {
                cell_id: cell_id.clone(),
                epoch: ready.epoch,
                cell: ready.cell,
                root: ready.root,
                chain_bytes: ready.chain_bytes,
                migration: ready.migration,
                rx,
                load: handle.load.clone(),
                charge,
                tail: ready.tail,
                tail_due: ready.tail_due,
            },
        );
        let span = tracing::info_span!("cell", cell = %cell_id, epoch = %ready.epoch, node = %self.me.node);
        let shared = self.clone();
        let proven_term = handle.proven_term.clone();
        tokio::spawn(
            async move {
                let exit = actor.run(migration).await;
                shared.metrics.cells_open.fetch_sub(1, Ordering::Relaxed);
                if let Exit::Parked(parked) = exit {
                    shared.park(
                        cell_id.clone(),
                        Parked::new(*parked, proven_term.load(Ordering::SeqCst)),
                    );
                }
                shared.remove_slot(&cell_id, Some(generation));
                let _ = exited_tx.send(true);
            }
            .instrument(span),
        );
        handle
    }

    /// Activates a Cell and starts its actor (runs in a spawned task so a
    /// dropped request cannot cut a root write half-way).
    async fn activate(
        self: Arc<Self>,
        cell_id: CellId,
        kind: String,
        key: Vec<u8>,
    ) -> Result<ActorHandle> {
        let kind = self
            .kinds
            .get(&kind)
            .cloned()
            .ok_or_else(|| Error::BadRequest(format!("unknown kind {kind:?}")))?;
        // The term before anything is read: a lapse during activation makes
        // the first request re-prove.
        let (mode, term) = self.lease.mode_and_term();
        self.check_owned_room(&cell_id)?;
        let charge = self.open_charge().await?;
        let _slot = self.activation_slot().await?;
        let parked = self.take_parked(&cell_id).await;
        // A parked root is trusted only while the lease is live and has not
        // lapsed since it was proven ours: only then can nobody else have
        // written it. An untrusted one is read again, and its tail (if
        // any) replayed from this session's lane.
        let parked = match parked {
            Some(parked) if cell_mode(mode, term, parked.proven_term) == ServingMode::Live => {
                Some(parked.into_cell())
            }
            Some(parked) => {
                self.metrics
                    .checkpoint_lag_records
                    .fetch_sub(parked.tail.len() as i64, Ordering::Relaxed);
                None
            }
            None => None,
        };
        let tail_records = parked.as_ref().map_or(0, |cell| cell.tail.len() as i64);
        let activated = self
            .activator
            .activate(&cell_id, kind, &key, parked)
            .await
            .inspect_err(|_| {
                // A parked tail that did not make it into an actor is in
                // this session's lane still; the next activation replays it.
                self.metrics
                    .checkpoint_lag_records
                    .fetch_sub(tail_records, Ordering::Relaxed);
            });
        let ready = match activated? {
            Activation::Ready(ready) => ready,
            Activation::OwnerLive { owner } => {
                return Err(self.not_owner(&cell_id, Some(owner)).await)
            }
        };
        self.count_activation(&ready);
        let handle = self.start_actor(cell_id, *ready, term, charge);
        Ok(handle)
    }

    /// Whether this node holds a root of `cell`: open, opening or parked.
    fn holds(&self, cell: &CellId) -> bool {
        self.slots().contains_key(cell) || self.parked().contains_key(cell)
    }

    /// The actor serving `cell`, activating it if needed.
    async fn actor_for(self: &Arc<Self>, kind: &str, key: &[u8]) -> Result<(CellId, ActorHandle)> {
        let (mode, term) = self.admit()?;
        if self.kinds.get(kind).is_none() {
            return Err(Error::BadRequest(format!("unknown kind {kind:?}")));
        }
        let cell = CellId::for_kind_key(kind, key);
        // Empty ingress: nothing active or activating, skip the lookup.
        let slot = if self.slots_count.load(Ordering::SeqCst) == 0 {
            None
        } else {
            self.slots().get(&cell).cloned()
        };
        let handle = match slot {
            Some(Slot::Active(handle)) => handle,
            Some(Slot::Activating(rx)) => wait_activation(rx).await?,
            None => self.start_activation(&cell, kind, key).await?,
        };
        handle
            .last_used
            .store(self.tick.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
        let proven_term = handle.proven_term.load(Ordering::SeqCst);
        if cell_mode(mode, term, proven_term) == ServingMode::SelfFenced {
            self.reprove(&cell, &handle).await?;
            // Proven now, under the term read before the root was.
            handle.proven_term.fetch_max(term, Ordering::SeqCst);
        }
        Ok((cell, handle))
    }

    async fn start_activation(
        self: &Arc<Self>,
        cell: &CellId,
        kind: &str,
        key: &[u8],
    ) -> Result<ActorHandle> {
        let (tx, rx) = watch::channel(None);
        let existing = {
            let mut slots = self.slots_mut();
            match slots.get(cell) {
                Some(slot) => Some(slot.clone()),
                None => {
                    slots.insert(cell.clone(), Slot::Activating(rx.clone()));
                    self.slots_count.store(slots.len(), Ordering::SeqCst);
                    None
                }
            }
        };
        match existing {
            Some(Slot::Active(handle)) => return Ok(handle),
            Some(Slot::Activating(rx)) => return wait_activation(rx).await,
            None => {}
        }
        let shared = self.clone();
        let cell_id = cell.clone();
        let (kind, key) = (kind.to_owned(), key.to_vec());
        tokio::spawn(async move {
            let result = shared.clone().activate(cell_id.clone(), kind, key).await;
            {
                let mut slots = shared.slots_mut();
                match &result {
                    Ok(handle) => {
                        slots.insert(cell_id, Slot::Active(handle.clone()));
                    }
                    Err(_) => {
                        slots.remove(&cell_id);
                        shared.actor_context.watches.closed(&cell_id);
                    }
                }
                shared.slots_count.store(slots.len(), Ordering::SeqCst);
            }
            let _ = tx.send(Some(result));
        });
        wait_activation(rx).await
    }
}

async fn wait_activation(mut rx: watch::Receiver<ActivationResult>) -> Result<ActorHandle> {
    let result = rx
        .wait_for(Option::is_some)
        .await
        .map_err(|_| Error::Closed("the activation was abandoned".into()))?;
    result
        .clone()
        .unwrap_or_else(|| Err(Error::Closed("the activation was abandoned".into())))
}

impl NodeHandle {
    /// This node's id.
    pub fn node_id(&self) -> &NodeId {
        &self.shared.me.node
    }

    /// How this node publishes, and its lanes per session in log mode.
    pub fn publication(&self) -> (crate::config::PublicationMode, u16) {
        (self.shared.config.publication, self.shared.config.log.lanes)
    }

    /// How clients and peers reach this node (as written into its lease).
    pub fn endpoints(&self) -> &cellfleet_authority::Endpoints {
        &self.shared.config.endpoints
    }

    /// Resolves, with the reason, once the node stopped serving for good:
    /// its lease was replaced, or another node sealed its session's log.
    /// (Not on drain.)
    pub async fn stopped(&self) -> String {
        self.shared.lease.wait_stopped().await;
        self.shared
            .lease
            .stop_reason()
            .unwrap_or_else(|| "the node lease was lost".into())
    }

    /// Executes one command on Cell `(kind, key)`; answers once the group
    /// holding it is published (or its fate is known not to be).
    pub async fn execute(&self, kind: &str, key: &[u8], command: Command) -> Result<Executed> {
        let bytes = command_bytes(&command);
        // The actor vanished holding the reply: the command may have run.
        // Never assume either way.
        let lost = || Error::Unknown {
            reason: "the cell actor stopped before answering".into(),
        };
        self.dispatch(kind, key, Some(lost), |_, reply| {
            Ok(Msg::Execute {
                command: command.clone(),
                bytes,
                reply,
            })
        })
        .await
    }

    /// Sends the message `message` builds to the actor of `(kind, key)`,
    /// activating it if needed, and waits for the answer. An actor that
    /// stops first (passivation, drain, takeover) is waited out and the
    /// message dispatched again, at most [`DISPATCH_ATTEMPTS_MAX`] times. A
    /// reply dropped unanswered is retried too, unless `lost` says what
    /// it means (a command may have run).
    async fn dispatch<T>(
        &self,
        kind: &str,
        key: &[u8],
        lost: Option<fn() -> Error>,
        mut message: impl FnMut(&CellId, Reply<T>) -> Result<Msg>,
    ) -> Result<T> {
        let mut last = Error::Closed("no attempt made".into());
        for _ in 0..DISPATCH_ATTEMPTS_MAX {
            let (cell, handle) = self.shared.actor_for(kind, key).await?;
            let (tx, rx) = oneshot::channel();
            let reply = Reply::new(tx, handle.load.clone(), self.shared.metrics.clone());
            if !self.send(&handle, message(&cell, reply)?)? {
                handle.wait_exit(self.exit_wait()).await;
                continue;
            }
            match rx.await {
                Ok(Err(Error::Closed(reason))) => {
                    last = Error::Closed(reason);
                    handle.wait_exit(self.exit_wait()).await;
                }
                Ok(answer) => return answer,
                Err(_) => match lost {
                    Some(lost) => return Err(lost()),
                    None => last = Error::Closed("the cell actor stopped".into()),
                },
            }
        }
        Err(last)
    }

    /// How long a request waits for a stopping actor to exit before it is
    /// dispatched again.
    fn exit_wait(&self) -> Duration {
        Duration::from_millis(self.shared.config.limits.activation_wait_ms_max)
    }

    /// Sends to an actor: `Ok(true)` sent, `Ok(false)` the actor is gone
    /// (re-dispatch), `Err` the mailbox is full.
    fn send(&self, handle: &ActorHandle, msg: Msg) -> Result<bool> {
        match handle.tx.try_send(msg) {
            Ok(()) => Ok(true),
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.shared
                    .metrics
                    .refusals_total
                    .fetch_add(1, Ordering::Relaxed);
                Err(Error::ResourceExhausted {
                    what: "mailbox_commands_max",
                    retry_after_ms: self.shared.config.limits.retry_after_ms,
                })
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Ok(false),
        }
    }

    /// Runs query `name` on the owner's published state and returns the
    /// value with the receipt of the state it read (its TXID is at least
    /// `min_receipt`'s). With `min_receipt`, waits (at most
    /// `query_wait_ms_max`) until that TXID is published, or refuses.
    pub async fn query(
        &self,
        kind: &str,
        key: &[u8],
        name: &str,
        args: Value,
        min_receipt: Option<&Receipt>,
    ) -> Result<Queried> {
        let answer = self
            .dispatch(kind, key, None, |cell, reply| {
                if min_receipt.is_some_and(|receipt| receipt.cell != *cell) {
                    return Err(Error::BadRequest("the receipt names another cell".into()));
                }
                Ok(Msg::Query {
                    name: name.to_owned(),
                    args: args.clone(),
                    min_txid: min_receipt.map(|r| r.txid),
                    reply,
                })
            })
            .await;
        if answer.is_ok() {
            self.shared
                .metrics
                .queries_total
                .fetch_add(1, Ordering::Relaxed);
        }
        answer
    }

    /// Waits until Cell `(kind, key)`'s acknowledged state is past `after`
    /// (at most `wait`, capped at [`crate::watch::WATCH_WAIT_MAX`]) and
    /// returns its TXID then: `after` itself when nothing newer was
    /// acknowledged in time, or when the Cell left this node meanwhile
    /// (released or lost: the next watch is `NotOwner`). A query started after the answer reads at
    /// least that state. `NotOwner` when this node holds no root of the
    /// Cell (owned elsewhere, or not activated here yet). Watching never
    /// activates a Cell or keeps one open.
    pub async fn watch(&self, kind: &str, key: &[u8], after: Txid, wait: Duration) -> Result<Txid> {
        let until = tokio::time::Instant::now() + wait.min(crate::watch::WATCH_WAIT_MAX);
        let cell = CellId::for_kind_key(kind, key);
        let watches = &self.shared.actor_context.watches;
        let not_owner = |cell: CellId| Error::NotOwner {
            cell,
            owner: None,
            endpoint: None,
        };
        // A draining or lease-less node answers as every request does, so
        // the caller's router looks for the new owner.
        self.shared.admit()?;
        // Subscribe first: a group acknowledged after the description
        // below is signalled, one before it is in the description.
        let (mut receiver, fresh) = watches.subscribe(&cell);
        let mut known = None;
        if !self.shared.holds(&cell) {
            watches.closed_if_same(&cell, &receiver);
            return Err(not_owner(cell));
        }
        if fresh {
            // A signal that existed without a break already holds the
            // Cell's TXID (every exit of the Cell drops it); a new one
            // learns it from the actor. Until then it holds zero, which
            // later watchers would trust: if this watch is dropped before
            // the TXID is known, the guard drops the signal.
            let unknown = crate::watch::Unknown::new(watches, &cell, &receiver);
            let described = self.describe_for_watch(&cell, until).await?;
            watches.acknowledged(&cell, described.txid);
            unknown.known();
            // Past `after` already: the answer. (An actor that exited
            // while this watch waited for it closed the signal this watch
            // holds, so only the description carries its TXID.)
            known = Some(described.txid);
        }
        let seen = match known {
            Some(txid) if txid > after => txid,
            _ => crate::watch::wait_past(&mut receiver, after, until).await,
        };
        let metrics = &self.shared.metrics;
        metrics.watches_total.fetch_add(1, Ordering::Relaxed);
        if seen > after {
            metrics.watch_wakes_total.fetch_add(1, Ordering::Relaxed);
        }
        Ok(seen)
    }

    /// The description a new watch signal starts from. A Cell this node
    /// is still activating is waited for, and one whose actor is exiting
    /// is asked again until it is parked (described from its root) or gone
    /// (`NotOwner`, so the caller's router looks for the owner); only a
    /// full mailbox, or `until` passing first, is "busy, retry".
    async fn describe_for_watch(
        &self,
        cell: &CellId,
        until: tokio::time::Instant,
    ) -> Result<CellDescription> {
        let busy = |what: &'static str| Error::ResourceExhausted {
            what,
            retry_after_ms: self.shared.config.limits.retry_after_ms,
        };
        loop {
            let slot = self.shared.slots().get(cell).cloned();
            match slot {
                Some(Slot::Active(handle)) => {
                    let (tx, rx) = oneshot::channel();
                    match handle.tx.try_send(Msg::Describe { reply: tx }) {
                        Ok(()) => match tokio::time::timeout_at(until, rx).await {
                            Ok(Ok(described)) => return Ok(described),
                            // The actor exited with the request queued.
                            Ok(Err(_)) => {}
                            Err(_) => {
                                return Err(busy("a watched Cell's actor (a watch's description)"))
                            }
                        },
                        Err(mpsc::error::TrySendError::Full(_)) => {
                            return Err(busy("mailbox_commands_max (a watch's description)"));
                        }
                        Err(mpsc::error::TrySendError::Closed(_)) => {}
                    }
                    // Exiting: its slot goes once it is parked or gone.
                    match tokio::time::timeout_at(until, handle.exited()).await {
                        Ok(true) => {}
                        Ok(false) => return Err(Error::Closed("the Cell's actor failed".into())),
                        Err(_) => return Err(busy("a watched Cell's actor still exiting")),
                    }
                }
                Some(Slot::Activating(rx)) => {
                    // Active next (described then), or failed with the
                    // reason every request to it gets.
                    match tokio::time::timeout_at(until, wait_activation(rx)).await {
                        Ok(Ok(_)) => {}
                        Ok(Err(error)) => return Err(error),
                        Err(_) => return Err(busy("a watched Cell still activating")),
                    }
                }
                None => match self.describe_id(cell).await {
                    Some(described) => return Ok(described),
                    // An activation took the parked root meanwhile.
                    None if self.shared.slots().contains_key(cell) => {}
                    None => {
                        return Err(Error::NotOwner {
                            cell: cell.clone(),
                            owner: None,
                            endpoint: None,
                        })
                    }
                },
            }
        }
    }

    /// The fate of `command_id` on Cell `(kind, key)`: COMMITTED with the
    /// stored outcome, ABSENT, UNKNOWN (being published) or EXPIRED (absent
    /// and `expires_at_ms` plus the skew margin has passed).
    pub async fn resolve(
        &self,
        kind: &str,
        key: &[u8],
        command_id: CommandId,
        expires_at_ms: Option<i64>,
    ) -> Result<Resolution> {
        self.dispatch(kind, key, None, |_, reply| {
            Ok(Msg::Resolve {
                id: command_id,
                expires_at_ms,
                reply,
            })
        })
        .await
    }

    /// Cells this node owns (open or passivated).
    pub fn owned_cells(&self) -> Vec<CellId> {
        let mut cells: Vec<CellId> = self
            .shared
            .slots()
            .iter()
            .filter(|(_, slot)| matches!(slot, Slot::Active(_)))
            .map(|(cell, _)| cell.clone())
            .collect();
        cells.extend(self.shared.parked().keys().cloned());
        cells.sort();
        cells.dedup();
        cells
    }

    /// Notes that the caller has just read `cell`'s root, found none, and
    /// placed the Cell on this node: its activation then creates the root
    /// without reading it again (see [`crate::activation::AbsentRoots`]).
    pub fn note_root_absent(&self, cell: &CellId) {
        self.shared.activator.absent.note(cell);
    }

    /// Whether this node holds `cell` now: open, or passivated with its
    /// root kept. A memory lookup, no store read; the answer can be stale
    /// by the time the caller acts on it, so callers treat it as a hint
    /// (the actor refuses with `NotOwner` if the Cell moved).
    pub fn holds(&self, cell: &CellId) -> bool {
        matches!(self.shared.slots().get(cell), Some(Slot::Active(_)))
            || self.shared.parked().contains_key(cell)
    }

    /// The node's store, counted in its metrics
    /// (`cellfleet_runtime_store_requests_total`). Everything else in the
    /// process that reads or writes the bucket (the router's root and lease
    /// reads, the HTTP side) goes through this one, so the counts are the
    /// node's whole traffic.
    pub fn store(&self) -> Arc<dyn ObjectStore> {
        self.shared.activator.store.clone()
    }

    /// Cells open now.
    pub fn open_cells(&self) -> usize {
        self.shared
            .slots()
            .values()
            .filter(|slot| matches!(slot, Slot::Active(_)))
            .count()
    }

    /// Describes an owned Cell, `None` if this node does not own it.
    pub async fn describe_cell(&self, kind: &str, key: &[u8]) -> Option<CellDescription> {
        let cell = CellId::for_kind_key(kind, key);
        self.describe_id(&cell).await
    }

    /// [`NodeHandle::describe_cell`] by id.
    async fn describe_id(&self, cell: &CellId) -> Option<CellDescription> {
        let slot = self.shared.slots().get(cell).cloned();
        if let Some(Slot::Active(handle)) = slot {
            let (tx, rx) = oneshot::channel();
            if handle.tx.try_send(Msg::Describe { reply: tx }).is_ok() {
                if let Ok(description) = rx.await {
                    return Some(description);
                }
            }
        }
        let (parked, txid) = self
            .shared
            .parked()
            .get(cell)
            .map(|parked| (parked.root.clone(), parked.txid()))?;
        Some(CellDescription {
            cell: cell.clone(),
            kind: parked.record.kind.clone(),
            epoch: parked.record.epoch,
            txid,
            revision: parked.record.revision,
            chain_files: parked.record.chain.len(),
            open: false,
            queued: 0,
        })
    }

    /// This node's metrics in the OpenMetrics text format ([`crate::EXPOSITION_CONTENT_TYPE`]).
    pub fn metrics_text(&self) -> String {
        self.shared.metrics.render(self.shared.me.node.as_str())
    }

    /// File descriptors open Cells are charged for now, of `fds_max`
    /// (each Cell's database, `-wal` and the VFS's lock on the database,
    /// and its readers).
    pub fn cell_descriptors_charged(&self) -> usize {
        self.shared
            .config
            .limits
            .fds_max
            .min(tokio::sync::Semaphore::MAX_PERMITS)
            .saturating_sub(self.shared.fd_permits.available_permits())
    }

    /// The node's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    /// The node's lease keeper (serving mode; tests pause renewals).
    pub fn lease(&self) -> &Arc<LeaseKeeper> {
        &self.shared.lease
    }

    /// Passivates every idle open Cell (ownership kept).
    pub async fn passivate_idle(&self) -> usize {
        let idle: Vec<ActorHandle> = self
            .shared
            .slots()
            .values()
            .filter_map(|slot| match slot {
                Slot::Active(handle) if handle.load.load(Ordering::Relaxed) == 0 => {
                    Some(handle.clone())
                }
                _ => None,
            })
            .collect();
        let mut waits = Vec::new();
        for handle in idle {
            let (tx, rx) = oneshot::channel();
            if handle
                .tx
                .try_send(Msg::Stop {
                    how: StopHow::Passivate,
                    done: Some(tx),
                })
                .is_ok()
            {
                waits.push(rx);
            }
        }
        let count = waits.len();
        for wait in waits {
            let _ = wait.await;
        }
        self.wait_for_exits().await;
        count
    }

    async fn wait_for_exits(&self) {
        // Actors remove their slot right after answering the stop; give
        // them a bounded moment.
        for _ in 0..100 {
            let any_stopping = self
                .shared
                .slots()
                .values()
                .any(|slot| matches!(slot, Slot::Active(h) if h.tx.is_closed()));
            if !any_stopping {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Drains the node: stop admission, finish and publish accepted work,
    /// close every Cell, release every root (owner = none), retire the
    /// lease. Returns the number of Cells released.
    pub async fn drain(&self) -> Result<usize> {
        self.shared.draining.store(true, Ordering::SeqCst);
        let mut released = 0;
        let mut first_error = None;
        // Activations in progress finish into active actors first.
        for _ in 0..DRAIN_ROUNDS_MAX {
            let slots: Vec<Slot> = self.shared.slots().values().cloned().collect();
            if slots.is_empty() {
                break;
            }
            let stops = slots.into_iter().map(stop_for_drain);
            for stopped in run_bounded(stops, DRAIN_CONCURRENCY)
                .await
                .into_iter()
                .flatten()
            {
                match stopped {
                    Ok(()) => released += 1,
                    Err(error) => {
                        first_error.get_or_insert(error);
                    }
                }
            }
            self.wait_for_exits().await;
        }
        let parked: Vec<CellId> = self.shared.parked().keys().cloned().collect();
        let releases = parked
            .into_iter()
            .map(|cell| release_parked(self.shared.clone(), cell));
        for outcome in run_bounded(releases, DRAIN_CONCURRENCY).await {
            match outcome {
                Ok(()) => released += 1,
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        // Nothing is held here any more: every watcher is answered now.
        self.shared.actor_context.watches.close_all();
        if let Some(error) = first_error {
            return Err(error);
        }
        self.shared.lease.retire().await?;
        Ok(released)
    }

    /// Stops serving without writing anything (a crash, as far as the
    /// bucket can tell): renewals stop, every Cell closes, nothing is
    /// released. For tests and abrupt shutdown.
    pub async fn halt(&self) {
        self.shared.draining.store(true, Ordering::SeqCst);
        self.shared.lease.stop();
        for handle in self.shared.active_handles() {
            let (tx, rx) = oneshot::channel();
            if handle
                .tx
                .send(Msg::Stop {
                    how: StopHow::Passivate,
                    done: Some(tx),
                })
                .await
                .is_ok()
            {
                let _ = rx.await;
            }
        }
        self.wait_for_exits().await;
        self.shared.actor_context.watches.close_all();
    }
}

/// Stops one Cell's actor for a drain (waiting first for an activation in
/// progress to finish into an actor) and returns what the actor answered:
/// `None` when the activation failed or the actor was gone, or went away,
/// before answering.
async fn stop_for_drain(slot: Slot) -> Option<Result<()>> {
    let handle = match slot {
        Slot::Active(handle) => handle,
        Slot::Activating(rx) => wait_activation(rx).await.ok()?,
    };
    let (tx, rx) = oneshot::channel();
    handle
        .tx
        .send(Msg::Stop {
            how: StopHow::Drain,
            done: Some(tx),
        })
        .await
        .ok()?;
    rx.await.ok()
}

/// Releases a parked Cell's root for a drain (owner = none), after putting
/// its parked tail into the root: a release that would leave records only
/// in this node's log is refused, so the next owner replays them from it.
async fn release_parked(shared: Arc<Shared>, cell: CellId) -> Result<()> {
    // A parked tail goes into the root first (the lane that
    // holds it is retired with the lease).
    if shared.checkpoint_parked(&cell).await.is_none() {
        return Err(Error::NotCommitted {
            reason: format!(
                "the checkpoint of cell {cell}'s parked records failed; its next owner replays them from this node's log"
            ),
        });
    }
    let Some(parked) = shared.take_parked(&cell).await else {
        return Ok(());
    };
    if !parked.tail.is_empty() {
        let reason = format!(
            "the checkpoint of cell {cell}'s parked records was not committed; drain again, or its next owner replays them from this node's log"
        );
        shared.park(cell, parked);
        return Err(Error::NotCommitted { reason });
    }
    let root = parked.root;
    let epoch = root.record.epoch;
    shared.actor_context.watches.closed(&cell);
    match shared.actor_context.publisher.release(root, epoch).await {
        Ok(_) => {
            shared.activator.discard(&cell);
            Ok(())
        }
        Err(failure) => Err(Error::NotCommitted {
            reason: format!("release of cell {cell} failed: {failure:?}"),
        }),
    }
}

/// Cells a drain stops or releases at once: each is a final publication
/// and a root CAS, so one at a time a node owning thousands of Cells would
/// drain at one store round trip per Cell.
const DRAIN_CONCURRENCY: usize = 32;

/// Waits up to `wait` for `permits` (kept in its place in the
/// semaphores' queues), calling `ask_again` (to passivate one more idle
/// Cell) every [`ROOM_ASK_AGAIN_AFTER`] it waits. `None` when the wait
/// ran out or a semaphore closed.
pub(crate) async fn wait_asking_again<T>(
    wait: Duration,
    permits: impl std::future::Future<Output = std::result::Result<T, tokio::sync::AcquireError>>,
    mut ask_again: impl FnMut(),
) -> Option<T> {
    let deadline = tokio::time::Instant::now() + wait;
    tokio::pin!(permits);
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return None;
        }
        match tokio::time::timeout(left.min(ROOM_ASK_AGAIN_AFTER), &mut permits).await {
            Ok(got) => return got.ok(),
            Err(_) => ask_again(),
        }
    }
}

/// Runs `tasks` on the runtime, at most `limit` at once; returns the
/// outputs of those that finished (in completion order; a task that
/// panicked has none).
async fn run_bounded<T, F>(tasks: impl IntoIterator<Item = F>, limit: usize) -> Vec<T>
where
    T: Send + 'static,
    F: std::future::Future<Output = T> + Send + 'static,
{
    let mut set = tokio::task::JoinSet::new();
    let mut out = Vec::new();
    for task in tasks {
        if set.len() >= limit.max(1) {
            if let Some(Ok(value)) = set.join_next().await {
                out.push(value);
            }
        }
        set.spawn(task);
    }
    while let Some(joined) = set.join_next().await {
        if let Ok(value) = joined {
            out.push(value);
        }
    }
    out
}

/// Rounds of stopping actors during a drain (activations racing the drain
/// may start new ones; each round catches those).
const DRAIN_ROUNDS_MAX: usize = 10;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every Cell opens with the node's `[limits]` bounds on its group,
    /// its WAL and its page cache, whatever the engine's defaults.
    #[test]
    fn cells_open_with_the_nodes_bounds() {
        let mut config = NodeConfig::new(NodeId::new("n1").unwrap(), "/nonexistent", "p");
        config.limits.group_commands_max = 7;
        config.limits.cell_wal_bytes_max = 123 << 10;
        config.limits.cell_cache_bytes_max = 321 << 10;
        let cell = cell_config(&config);
        assert_eq!(cell.group_commands_max, 7);
        assert_eq!(cell.checkpoint_wal_bytes, 123 << 10);
        assert_eq!(cell.cache_bytes, 321 << 10);
    }

    /// Any JSON value: scalars (floats, escapes and non-ASCII text
    /// included) nested in arrays and objects, as command arguments are.
    fn json_values() -> impl Strategy<Value = serde_json::Value> {
        use serde_json::Value;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            "[a-z\"\\\\é\u{0}-\u{1f}\u{2028}😀]{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map("[a-z\"\\\\é]{0,6}", inner, 0..6)
                    .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        })
    }

    proptest! {
        // The mailbox charge is the JSON text's length, counted without
        // building the text.
        #[test]
        fn a_command_is_charged_its_name_and_json_length(
            name in "[a-z_]{0,12}",
            args in json_values(),
        ) {
            let command = Command::new([7; 16], name.clone(), args.clone(), 0);
            prop_assert_eq!(command_bytes(&command), name.len() + args.to_string().len());
        }
    }
}
