//! Node settings: identity, data directory, bucket prefix, lease timing, endpoints and every named bound.

use std::path::PathBuf;

use cellfleet_authority::{CellId, Endpoints, LeaseConfig, NodeId};

/// Bounds of one node. Every queue, group, wait and retry is bounded by one
/// of these; over a bound a request is refused at once with
/// [`crate::Error::ResourceExhausted`] and a retry hint.
#[derive(Clone, Debug)]
pub struct NodeLimits {
    /// Most Cells open (SQLite files held open) at once; idle ones are
    /// passivated in LRU order to make room. The default is as many as a
    /// node may own, so that descriptors and memory are the bounds
    /// ([`NodeLimits::effective_cells_open_max`]).
    pub cells_open_max: usize,
    /// Most Cells owned (open or passivated) at once.
    pub cells_owned_max: usize,
    /// File descriptors this node may spend on open Cells.
    pub fds_max: usize,
    /// File descriptors one open Cell holds without readers: its database
    /// and `-wal` (the write connection). The `cellfleet` VFS keeps its WAL
    /// index in memory (no `-shm` file) and its lock against other
    /// processes on the connection's own descriptor.
    pub fds_per_cell: usize,
    /// File descriptors each read connection adds (its database and
    /// `-wal`). A Cell opens its published reader on its first query and
    /// one more while a second group is pending; an actor's charge follows
    /// what its Cell holds, and idle readers are closed when the node's
    /// descriptors run short.
    pub fds_per_reader: usize,
    /// Memory this node may spend on open Cells, in bytes: each open Cell
    /// is charged [`NodeLimits::memory_bytes_per_open_cell`]. 4 GiB here;
    /// `cellfleet node` defaults it to half of the machine's memory (or of
    /// its control group's limit, where lower).
    pub memory_bytes_max: u64,
    /// Estimated memory of one open Cell besides its page caches: its
    /// connections, their schemas and statements, the actor. A node at
    /// its open bound measured 0.55-0.65 MiB per Cell with three
    /// connections, the few pages they had cached included
    /// (`BENCHMARKS.md`, fourth measurement): 640 KiB is the top of that,
    /// counting none of it as cache.
    pub memory_bytes_per_cell: u64,
    /// Queued requests per Cell mailbox.
    pub mailbox_commands_max: usize,
    /// Most commands in one group (one publication).
    pub group_commands_max: usize,
    /// Most payload bytes (name + JSON args) in one group.
    pub group_bytes_max: usize,
    /// Chain length that triggers compaction (folded into the next delta's CAS).
    pub chain_files_max: usize,
    /// Most bytes of chain files an actor keeps in memory to merge without
    /// downloading; past it compaction publishes a snapshot of the Cell.
    pub chain_cache_bytes_max: u64,
    /// Most activations running at once on this node.
    pub activations_concurrent_max: usize,
    /// Longest an activation waits for an activation slot or an open-Cell
    /// charge (in ms) before the request is refused.
    pub activation_wait_ms_max: u64,
    /// Longest a query waits for its minimum receipt to be published (ms).
    pub query_wait_ms_max: u64,
    /// Attempts of an LTX upload whose failure left it not applied.
    pub upload_attempts_max: usize,
    /// Attempts of an activation that lost a race (409/412) before giving up.
    pub activation_attempts_max: usize,
    /// Retry hint given with `ResourceExhausted`, in ms.
    pub retry_after_ms: u64,
    /// Most commands in a group that may execute on its actor's task
    /// instead of the blocking pool (saving two thread hand-offs); 0 runs
    /// every group on the pool. Only for a Cell whose last group's engine
    /// time, scaled to this group, is within `inline_execute_us_max`.
    pub inline_commands_max: usize,
    /// Most payload bytes of a group that may execute on its actor's task.
    pub inline_bytes_max: usize,
    /// Longest estimated engine time (µs) of a group run on its actor's
    /// task; runtime workers are held that long.
    pub inline_execute_us_max: u64,
    /// Most SQLite VM instructions a query, or each command of a group,
    /// on its actor's task may take in kind code; one stopped there runs
    /// again on the blocking pool with the full `statement_steps_max` (a
    /// group from its start: nothing of the stopped run is kept), so kind
    /// code that turns out long holds a runtime worker for at most this
    /// per query and `inline_commands_max` times this per group.
    pub inline_steps_max: u64,
    /// Bytes past which one open Cell folds its WAL into its database file
    /// and truncates it (once nothing of it is pending in the store). The
    /// group that crosses the bound is written whole, so a WAL holds at
    /// most this plus one group (or two, with two publications pending).
    /// With `cells_open_max` it bounds the node's local disk beyond the
    /// Cells' own data. Lower costs no instructions per command measured
    /// (BENCHMARKS.md, thirty-fifth measurement) and checkpoints the WAL
    /// more often, each smaller.
    pub cell_wal_bytes_max: u64,
    /// Bytes of pages each connection of an open Cell keeps cached
    /// (SQLite's `cache_size`). SQLite's default, 2,000 KiB, grew a node
    /// by up to that for every connection of an open Cell as its data
    /// grew: 1,000 streams took a node's RSS to 1,758 MiB in 150 s, still
    /// rising (BENCHMARKS.md, thirty-sixth measurement). A page let go is
    /// read again from the file.
    pub cell_cache_bytes_max: u64,
}

impl Default for NodeLimits {
    fn default() -> Self {
        Self {
            cells_open_max: 100_000,
            cells_owned_max: 100_000,
            fds_max: 32_768,
            fds_per_cell: 2,
            fds_per_reader: 2,
            memory_bytes_max: 4 << 30,
            memory_bytes_per_cell: 640 << 10,
            mailbox_commands_max: 1_024,
            group_commands_max: 512,
            group_bytes_max: 4 << 20,
            chain_files_max: 32,
            chain_cache_bytes_max: 8 << 20,
            activations_concurrent_max: 16,
            activation_wait_ms_max: 5_000,
            query_wait_ms_max: 5_000,
            upload_attempts_max: 3,
            activation_attempts_max: 3,
            retry_after_ms: 50,
            inline_commands_max: 16,
            inline_bytes_max: 64 << 10,
            inline_execute_us_max: 250,
            inline_steps_max: 100_000,
            cell_wal_bytes_max: 1 << 20,
            cell_cache_bytes_max: 256 << 10,
        }
    }
}

impl NodeLimits {
    /// Cells that may be open at once under all three limits (count, file
    /// descriptors, memory) when each may hold `readers_per_cell` readers
    /// besides its writer ([`NodeConfig::readers_per_cell_max`]); at
    /// least 1.
    pub fn effective_cells_open_max(&self, readers_per_cell: usize) -> usize {
        let by_fds = self.fds_max / self.fds_per_cell.max(1);
        let per_cell = self.memory_bytes_per_open_cell(readers_per_cell).max(1);
        let by_memory = usize::try_from(self.memory_bytes_max / per_cell).unwrap_or(usize::MAX);
        self.cells_open_max.min(by_fds).min(by_memory).max(1)
    }

    /// What one open Cell is charged against `memory_bytes_max`:
    /// `memory_bytes_per_cell` and the page caches of its writer and of
    /// the `readers_per_cell` readers it may hold, each at
    /// `cell_cache_bytes_max` (SQLite sizes a connection's cache to about
    /// that many bytes, page headers included, and goes past it only for
    /// the pages of a transaction in progress). 1,152 KiB by default in
    /// log mode (one reader).
    pub fn memory_bytes_per_open_cell(&self, readers_per_cell: usize) -> u64 {
        let connections = u64::try_from(readers_per_cell.saturating_add(1)).unwrap_or(u64::MAX);
        self.memory_bytes_per_cell
            .saturating_add(self.cell_cache_bytes_max.saturating_mul(connections))
    }
}

/// How a node makes a group of commands durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PublicationMode {
    /// The node log (DESIGN.md §9): one segment PUT per lane group commit,
    /// across Cells; roots are checkpointed lazily.
    #[default]
    Log,
    /// One publication per Cell group: LTX upload, then a fenced root CAS.
    Cell,
}

impl std::str::FromStr for PublicationMode {
    type Err = String;

    fn from_str(text: &str) -> std::result::Result<Self, String> {
        match text {
            "log" => Ok(PublicationMode::Log),
            "cell" => Ok(PublicationMode::Cell),
            other => Err(format!(
                "publication mode {other:?} is neither \"log\" nor \"cell\""
            )),
        }
    }
}

/// Settings of the node log (used in [`PublicationMode::Log`]).
#[derive(Clone, Debug)]
pub struct LogSettings {
    /// Lanes per session (a Cell's lane is fixed by its id).
    pub lanes: u16,
    /// Largest segment body; a lane's group commit splits past it.
    pub segment_bytes_max: usize,
    /// Segment PUTs of one lane in flight at once (the pipeline).
    pub segments_inflight_max: u64,
    /// Groups of one Cell executed and not yet durable at once (the
    /// engine's pending publications). 1: a Cell's next group executes
    /// once the segment holding the previous one is written, so a hot
    /// Cell's groups grow instead of multiplying; on two shared cores that
    /// measured about 1.10x `hot_cell`'s commands/s against 2 (six
    /// interleaved pairs, BENCHMARKS.md). Many Cells still fill a lane's
    /// pipeline together.
    pub cell_groups_inflight_max: usize,
    /// While a lane's segments are in flight, a batch of this many
    /// commands (from any number of Cell groups) starts another at once.
    pub batch_commands_min: usize,
    /// ... and so does a batch of this many bytes.
    pub batch_bytes_min: usize,
    /// ... and so does any batch whose oldest group has waited this long.
    /// An idle lane writes at once.
    pub linger_ms: u64,
    /// A Cell checkpoints once this many records are past its root.
    pub checkpoint_records: usize,
    /// A Cell checkpoints once this many record bytes are past its root.
    pub checkpoint_bytes: u64,
    /// A Cell with records past its root checkpoints after this long
    /// without a new record, open or passivated (parked).
    pub checkpoint_idle_ms: u64,
    /// A Cell with records past its root checkpoints once its lane has
    /// grown this many segments past the root's pointer (a successor's
    /// replay reads at most about this many segments per Cell).
    pub replay_segments_max: u64,
    /// Longest a reply waits for its segment before it is answered
    /// UNKNOWN (the PUT goes on until it lands or finds a seal).
    pub reply_wait_ms: u64,
    /// Most bytes of acknowledged records passivated Cells keep in memory
    /// past their roots (parked tails); past it the node checkpoints the
    /// oldest ones.
    pub parked_bytes_max: u64,
    /// Checkpoints (open and parked Cells', pointer moves included) in
    /// flight at once on this node. Checkpoints are background work: Cells
    /// written together fall idle together, and unbounded they would queue
    /// the store's every request (lease renewals too) behind theirs.
    pub checkpoints_inflight_max: usize,
}

/// A Cell's own share of a checkpoint trigger (pure): `base` less up to a
/// quarter of it, fixed by the Cell's id. Cells written together fall idle
/// together, and Cells whose pointers sit together cross the replay budget
/// together; staggered, their checkpoints spread over a quarter of the
/// trigger instead of all falling due at once.
pub fn staggered(base: u64, cell: &CellId) -> u64 {
    let spread = base / 4;
    if spread == 0 {
        return base;
    }
    base - cell_digest(cell) % (spread + 1)
}

/// A Cell's id folded to a u64 (FNV-1a; the id is already a digest): what
/// picks its lane and its share of a staggered trigger.
pub(crate) fn cell_digest(cell: &CellId) -> u64 {
    cell.as_str()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        })
}

impl LogSettings {
    /// How long `cell` waits without a new record before its checkpoint:
    /// `checkpoint_idle_ms`, [`staggered`].
    pub fn idle_of(&self, cell: &CellId) -> std::time::Duration {
        std::time::Duration::from_millis(staggered(self.checkpoint_idle_ms, cell))
    }

    /// How far `cell`'s lane may grow past its root's pointer before an
    /// open Cell checkpoints (or moves its pointer): `replay_segments_max`,
    /// [`staggered`].
    pub fn replay_budget_of(&self, cell: &CellId) -> u64 {
        staggered(self.replay_segments_max, cell)
    }

    /// When a lane's committer writes its next segment.
    pub fn batch_rule(&self) -> cellfleet_nodelog::batch::BatchRule {
        cellfleet_nodelog::batch::BatchRule {
            inflight_max: self.segments_inflight_max.max(1),
            commands_min: self.batch_commands_min.max(1),
            bytes_min: self.batch_bytes_min.max(1),
            linger_ms: self.linger_ms,
        }
    }
}

impl Default for LogSettings {
    fn default() -> Self {
        LogSettings {
            lanes: 1,
            segment_bytes_max: 8 << 20,
            segments_inflight_max: 4,
            cell_groups_inflight_max: 1,
            batch_commands_min: 16,
            batch_bytes_min: 1 << 20,
            linger_ms: 5,
            checkpoint_records: 256,
            // Records wait for their checkpoint in memory: 512 KiB per
            // open Cell at most.
            checkpoint_bytes: 512 << 10,
            // Lazy: a node owning many more Cells than it keeps open would
            // otherwise checkpoint nearly every Cell it touched (a root
            // CAS per command, the cell mode's cost); the replay budget
            // and the byte bounds still apply.
            checkpoint_idle_ms: 30_000,
            // A successor reads a dead lane's index in a GET per 256
            // segments (chunk indexes), so the budget can be wide: at 100
            // segments a second a Cell checkpoints for it every 5 minutes.
            replay_segments_max: 32_768,
            reply_wait_ms: 10_000,
            parked_bytes_max: 64 << 20,
            checkpoints_inflight_max: 16,
        }
    }
}

/// Garbage collection of what no root can reach any more (DESIGN.md §9
/// rules 4-5): the node log's segments below every record a root still
/// needs, and LTX files a checkpoint or compaction replaced.
#[derive(Clone, Debug)]
pub struct GcSettings {
    /// Whether anything is deleted at all.
    pub enabled: bool,
    /// Nothing is deleted until it has been unreachable this long (a
    /// recovery or an export may still be reading it).
    pub min_age_ms: u64,
    /// How often each lane's collector looks for segments to delete.
    pub interval_ms: u64,
    /// Most segments one lane deletes per round.
    pub segments_per_round_max: u64,
}

impl Default for GcSettings {
    fn default() -> Self {
        GcSettings {
            enabled: true,
            min_age_ms: 60_000,
            interval_ms: 1_000,
            segments_per_round_max: 1_000,
        }
    }
}

/// Settings of one node.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// The node's stable name.
    pub node_id: NodeId,
    /// Where open Cells keep their SQLite files (`{data_dir}/cells/`).
    pub data_dir: PathBuf,
    /// The cluster's key prefix in the bucket.
    pub prefix: String,
    /// Lease timing.
    pub lease: LeaseConfig,
    /// How peers and clients reach this node (written into the lease).
    pub endpoints: Endpoints,
    /// Ingress-only: the lease says so and routers never place a Cell
    /// here; the node serves and forwards requests only.
    pub ingress_only: bool,
    /// Bounds.
    pub limits: NodeLimits,
    /// Settings of each Cell engine (group size and `checkpoint_wal_bytes`
    /// are taken from `limits`, the latter from
    /// [`NodeLimits::cell_wal_bytes_max`]; in log mode,
    /// `pending_publications_max` from
    /// [`LogSettings::cell_groups_inflight_max`]).
    pub cell: cellfleet_cell::CellConfig,
    /// The node log or one publication per Cell group.
    pub publication: PublicationMode,
    /// Settings of the node log.
    pub log: LogSettings,
    /// Garbage collection.
    pub gc: GcSettings,
}

impl NodeConfig {
    /// Most publications a Cell of this node has pending at once: in log
    /// mode [`LogSettings::cell_groups_inflight_max`], else the engine's
    /// own setting.
    pub fn pending_publications_max(&self) -> usize {
        match self.publication {
            PublicationMode::Log => self.log.cell_groups_inflight_max.max(1),
            PublicationMode::Cell => self.cell.pending_publications_max,
        }
    }

    /// Most readers an open Cell holds: its published reader, and one
    /// pinned for each further publication pending, which stays open
    /// (a spare) until the node's descriptors run short.
    pub fn readers_per_cell_max(&self) -> usize {
        self.pending_publications_max().max(1)
    }

    /// Cells this node keeps open at once
    /// ([`NodeLimits::effective_cells_open_max`] with
    /// [`NodeConfig::readers_per_cell_max`]).
    pub fn cells_open_max(&self) -> usize {
        self.limits
            .effective_cells_open_max(self.readers_per_cell_max())
    }

    /// Defaults for `node_id` under `data_dir` and `prefix`.
    pub fn new(node_id: NodeId, data_dir: impl Into<PathBuf>, prefix: impl Into<String>) -> Self {
        Self {
            node_id,
            data_dir: data_dir.into(),
            prefix: prefix.into(),
            lease: LeaseConfig::default(),
            endpoints: Endpoints::default(),
            ingress_only: false,
            limits: NodeLimits::default(),
            cell: cellfleet_cell::CellConfig {
                reader_on_demand: true,
                ..cellfleet_cell::CellConfig::default()
            },
            publication: PublicationMode::default(),
            log: LogSettings::default(),
            gc: GcSettings::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tightest_limit_bounds_open_cells() {
        let mut limits = NodeLimits {
            cells_open_max: 100,
            fds_max: 80,
            fds_per_cell: 8,
            ..NodeLimits::default()
        };
        assert_eq!(limits.effective_cells_open_max(1), 10);
        limits.memory_bytes_max = 3 * limits.memory_bytes_per_open_cell(1);
        assert_eq!(limits.memory_bytes_per_open_cell(1), 1_152 << 10);
        assert_eq!(limits.effective_cells_open_max(1), 3);
        assert_eq!(
            limits.effective_cells_open_max(2),
            2,
            "a spare reader's cache is charged too"
        );
        limits.cell_cache_bytes_max *= 4;
        assert_eq!(
            limits.effective_cells_open_max(1),
            1,
            "the writer's and the reader's caches are charged per open Cell"
        );
        limits.memory_bytes_max = 0;
        assert_eq!(limits.effective_cells_open_max(1), 1);
    }

    #[test]
    fn a_cell_holds_a_reader_per_pending_publication() {
        let mut config = NodeConfig::new(NodeId::new("n1").unwrap(), "/tmp/unused", "p");
        assert_eq!(config.publication, PublicationMode::Log);
        assert_eq!(config.readers_per_cell_max(), 1);
        config.log.cell_groups_inflight_max = 4;
        assert_eq!(config.readers_per_cell_max(), 4);
        config.publication = PublicationMode::Cell;
        assert_eq!(
            config.readers_per_cell_max(),
            cellfleet_cell::CellConfig::default().pending_publications_max
        );
        assert_eq!(
            config.cells_open_max(),
            config
                .limits
                .effective_cells_open_max(config.readers_per_cell_max())
        );
    }

    proptest::proptest! {
        /// A Cell's share of a trigger is the trigger less at most a
        /// quarter, and always the same for the same Cell.
        #[test]
        fn a_staggered_trigger_stays_within_a_quarter_below_the_setting(
            base in 0u64..10_000_000,
            key in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..32),
        ) {
            let cell = CellId::for_kind_key("k", &key);
            let share = staggered(base, &cell);
            proptest::prop_assert!(share <= base && share >= base - base / 4, "{share} of {base}");
            proptest::prop_assert_eq!(share, staggered(base, &cell));
        }
    }

    #[test]
    fn cells_written_together_fall_due_over_a_quarter_of_the_idle_delay() {
        let settings = LogSettings::default();
        let shares: Vec<u64> = (0..1_000u32)
            .map(|n| {
                settings
                    .idle_of(&CellId::for_kind_key("acct", &n.to_be_bytes()))
                    .as_millis() as u64
            })
            .collect();
        let (low, high) = (*shares.iter().min().unwrap(), *shares.iter().max().unwrap());
        // 30 s less up to 7.5 s: spread over nearly all of it.
        assert!(low >= 22_500 && high <= 30_000, "{low}..{high}");
        assert!(high - low > 7_000, "{low}..{high}");
        let distinct: std::collections::HashSet<_> = shares.iter().collect();
        assert!(distinct.len() > 900, "{} distinct delays", distinct.len());
        let budgets: std::collections::HashSet<_> = (0..1_000u32)
            .map(|n| settings.replay_budget_of(&CellId::for_kind_key("acct", &n.to_be_bytes())))
            .collect();
        assert!(budgets.len() > 500, "{} distinct budgets", budgets.len());
        assert!(budgets.iter().all(|b| (24_576..=32_768).contains(b)));
    }
}
