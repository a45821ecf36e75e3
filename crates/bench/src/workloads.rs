//! The workloads of DESIGN.md §8 on a real cluster: `local_command` (ingress = the Cell's owner), `forwarded_command` (ingress = a non-owner), `local_query`, `forwarded_query`, `serial_query` (one client, back to back), `hot_cell` (one Cell, c64), and the pools of `capacity` and `fleet` (driven by their own modules), on the `log` kind of `dev`'s manifest.
//!
//! Each workload has its own pool of Cells ([`Workload::pool_cells`]): one
//! per worker at the highest concurrency for the four per-level workloads
//! (worker `w` uses Cell `w`), so a worker's commands wait for their own
//! publications, not for another worker's group; a single Cell for
//! `serial_query` and `hot_cell` (whose 64 workers all share its groups). Owners are learnt
//! at set-up from `served_by` (a first command per Cell, which also creates
//! it); a forwarded request enters at the node after the owner. Every
//! response's `served_by` is checked against the owner learnt, and a
//! mismatch (the Cell moved) is counted. Each command appends a unique tag,
//! recorded in the [`AckLog`] when acknowledged, for the exactness check.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use cellfleet_proto::v1;
use clap::ValueEnum;

use crate::client::{describe, retry_safe, BenchClient};
use crate::exactness::{AckLog, APPEND, COUNT, LOG_KIND};
use crate::load::{self, Sample, Timing, Window};

/// How long set-up retries one Cell's first command.
const SETUP_TIMEOUT: Duration = Duration::from_secs(60);

/// Concurrency of `hot_cell` (clients on its one Cell).
pub const HOT_CELL_CONCURRENCY: usize = 64;
/// Cells of the `capacity` pool (spread over the nodes, ingress = owner).
pub const CAPACITY_CELLS: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum Workload {
    LocalCommand,
    ForwardedCommand,
    LocalQuery,
    ForwardedQuery,
    /// Queries through the client library's owner-aware routing on Cells
    /// of every node (the library learns each owner from its first answer).
    RoutedQuery,
    SerialQuery,
    HotCell,
    Capacity,
    Fleet,
}

/// How a workload is driven.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// Closed loop at each `--concurrency` level.
    PerLevel,
    /// Closed loop at one fixed concurrency.
    Fixed(usize),
    /// Its own driver (`capacity`, `fleet`).
    Own,
}

impl Workload {
    /// The default run, in order.
    pub const ALL: [Workload; 9] = [
        Workload::LocalCommand,
        Workload::ForwardedCommand,
        Workload::LocalQuery,
        Workload::ForwardedQuery,
        Workload::RoutedQuery,
        Workload::SerialQuery,
        Workload::HotCell,
        Workload::Capacity,
        Workload::Fleet,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Workload::LocalCommand => "local_command",
            Workload::ForwardedCommand => "forwarded_command",
            Workload::LocalQuery => "local_query",
            Workload::ForwardedQuery => "forwarded_query",
            Workload::RoutedQuery => "routed_query",
            Workload::SerialQuery => "serial_query",
            Workload::HotCell => "hot_cell",
            Workload::Capacity => "capacity",
            Workload::Fleet => "fleet",
        }
    }

    /// Prefix of the workload's Cell keys and command tags.
    pub fn short(self) -> &'static str {
        match self {
            Workload::LocalCommand => "lc",
            Workload::ForwardedCommand => "fc",
            Workload::LocalQuery => "lq",
            Workload::ForwardedQuery => "fq",
            Workload::RoutedQuery => "rq",
            Workload::SerialQuery => "sq",
            Workload::HotCell => "hc",
            Workload::Capacity => "cap",
            Workload::Fleet => "fl",
        }
    }

    pub fn shape(self) -> Shape {
        match self {
            Workload::LocalCommand
            | Workload::ForwardedCommand
            | Workload::LocalQuery
            | Workload::ForwardedQuery
            | Workload::RoutedQuery => Shape::PerLevel,
            Workload::SerialQuery => Shape::Fixed(1),
            Workload::HotCell => Shape::Fixed(HOT_CELL_CONCURRENCY),
            Workload::Capacity | Workload::Fleet => Shape::Own,
        }
    }

    /// Cells set up for the workload before any measurement (`fleet`
    /// creates its own, size by size).
    pub fn pool_cells(self, levels: &[usize]) -> usize {
        match self {
            Workload::SerialQuery | Workload::HotCell => 1,
            Workload::Capacity => CAPACITY_CELLS,
            Workload::Fleet => 0,
            _ => levels.iter().copied().max().unwrap_or(1),
        }
    }

    pub fn forwarded(self) -> bool {
        matches!(self, Workload::ForwardedCommand | Workload::ForwardedQuery)
    }

    pub fn command(self) -> bool {
        !matches!(
            self,
            Workload::LocalQuery
                | Workload::ForwardedQuery
                | Workload::RoutedQuery
                | Workload::SerialQuery
        )
    }
}

/// A Cell of a pool and the index of its owner node.
#[derive(Clone, Debug)]
pub struct BenchCell {
    pub key: String,
    pub owner: usize,
}

/// Each workload's Cells.
#[derive(Debug, Default)]
pub struct Pools {
    cells: HashMap<Workload, Arc<Vec<BenchCell>>>,
}

fn applied(response: &v1::ExecuteResponse) -> bool {
    matches!(
        response.outcome,
        Some(v1::execute_response::Outcome::ResultJson(_))
    )
}

/// Creates one Cell (its first command, retried with the same envelope on
/// retry-safe failures) and returns its owner's index.
pub async fn create_cell(
    client: BenchClient,
    acks: Arc<AckLog>,
    key: String,
    via: usize,
    node_ids: Arc<Vec<String>>,
) -> anyhow::Result<BenchCell> {
    let tag = format!("setup-{key}");
    let request = client.command(LOG_KIND, &key, APPEND, &serde_json::json!({"tag": tag}));
    let deadline = Instant::now() + SETUP_TIMEOUT;
    loop {
        match client.execute(via, request.clone()).await {
            Ok(response) if applied(&response) => {
                acks.acked(&key, tag);
                let Some(owner) = node_ids.iter().position(|id| *id == response.served_by) else {
                    bail!("cell {key} served by unknown node {:?}", response.served_by);
                };
                return Ok(BenchCell { key, owner });
            }
            Ok(response) => bail!("cell {key}: the first command did not apply: {response:?}"),
            Err(status) if retry_safe(&status) && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(status) => {
                acks.unacknowledged(&key, tag);
                bail!("cell {key}: {}", describe(&status));
            }
        }
    }
}

/// Creates each workload's pool of Cells ([`Workload::pool_cells`]),
/// through every node in turn.
pub async fn setup(
    client: &BenchClient,
    acks: &Arc<AckLog>,
    workloads: &[Workload],
    levels: &[usize],
    node_ids: &[String],
) -> anyhow::Result<Pools> {
    let node_ids = Arc::new(node_ids.to_vec());
    let mut tasks = Vec::new();
    for &workload in workloads {
        for i in 0..workload.pool_cells(levels) {
            let key = format!("bench-{}-{i}", workload.short());
            let task = tokio::spawn(create_cell(
                client.clone(),
                acks.clone(),
                key,
                i % node_ids.len(),
                node_ids.clone(),
            ));
            tasks.push((workload, task));
        }
    }
    let mut pools = Pools::default();
    let mut by_workload: HashMap<Workload, Vec<BenchCell>> = HashMap::new();
    for (workload, task) in tasks {
        let cell = task.await??;
        by_workload.entry(workload).or_default().push(cell);
    }
    for (workload, cells) in by_workload {
        pools.cells.insert(workload, Arc::new(cells));
    }
    Ok(pools)
}

/// What one workload at one concurrency measured.
#[derive(Debug)]
pub struct WorkloadResult {
    pub sample: Sample,
    /// Responses served by another node than the owner learnt at set-up.
    pub owner_mismatches: u64,
}

/// Shared by the workers of one measurement.
#[derive(Debug)]
struct Context {
    client: BenchClient,
    acks: Arc<AckLog>,
    cells: Arc<Vec<BenchCell>>,
    node_ids: Vec<String>,
    workload: Workload,
    concurrency: usize,
    mismatches: AtomicU64,
}

impl Context {
    fn target(&self, worker: usize) -> (&BenchCell, usize) {
        let cell = &self.cells[worker % self.cells.len()];
        let ingress = if self.workload.forwarded() {
            (cell.owner + 1) % self.node_ids.len()
        } else {
            cell.owner
        };
        (cell, ingress)
    }

    fn check_owner(&self, cell: &BenchCell, served_by: &str) {
        if self.node_ids[cell.owner] != served_by {
            self.mismatches.fetch_add(1, Ordering::Relaxed);
        }
    }

    async fn command(&self, worker: usize, sequence: u64) -> Result<Timing, String> {
        let (cell, ingress) = self.target(worker);
        let tag = format!(
            "{}-c{}-w{worker}-{sequence}",
            self.workload.short(),
            self.concurrency
        );
        let request = self.client.command(
            LOG_KIND,
            &cell.key,
            APPEND,
            &serde_json::json!({"tag": tag}),
        );
        let sent = Instant::now();
        let result = self.client.execute(ingress, request).await;
        let elapsed = sent.elapsed();
        match result {
            Ok(response) if applied(&response) => {
                self.acks.acked(&cell.key, tag);
                self.check_owner(cell, &response.served_by);
                Ok(Timing::total(elapsed))
            }
            Ok(response) => Err(format!("not applied: {:?}", response.outcome)),
            Err(status) => {
                self.acks.unacknowledged(&cell.key, tag);
                Err(describe(&status))
            }
        }
    }

    async fn query(&self, worker: usize) -> Result<Timing, String> {
        let (cell, ingress) = self.target(worker);
        if self.workload == Workload::RoutedQuery {
            // Signed, routed and retried by the library, as an application does.
            let query = cellfleet_client::Query::new(LOG_KIND, &cell.key, COUNT);
            let sent = Instant::now();
            let response = self
                .client
                .library()
                .query(&query)
                .await
                .map_err(|error| error.to_string())?;
            let elapsed = sent.elapsed();
            self.check_owner(cell, &response.served_by);
            return Ok(Timing::total(elapsed));
        }
        let request = self
            .client
            .query_request(LOG_KIND, &cell.key, COUNT, &serde_json::json!({}));
        let sent = Instant::now();
        let response = self
            .client
            .query(ingress, request)
            .await
            .map_err(|status| describe(&status))?;
        let elapsed = sent.elapsed();
        self.check_owner(cell, &response.served_by);
        Ok(Timing::total(elapsed))
    }
}

impl Pools {
    /// The Cells set up for `workload` (empty if none were).
    pub fn cells(&self, workload: Workload) -> Arc<Vec<BenchCell>> {
        self.cells.get(&workload).cloned().unwrap_or_default()
    }
}

/// One local command on `cell` (ingress = its owner) with a unique `tag`,
/// recorded in `acks`; the outcome as the load drivers want it.
pub async fn local_command(
    client: &BenchClient,
    acks: &AckLog,
    cell: &BenchCell,
    tag: String,
) -> Result<Timing, String> {
    let request = client.command(
        LOG_KIND,
        &cell.key,
        APPEND,
        &serde_json::json!({"tag": tag}),
    );
    let sent = Instant::now();
    let result = client.execute(cell.owner, request).await;
    let elapsed = sent.elapsed();
    match result {
        Ok(response) if applied(&response) => {
            acks.acked(&cell.key, tag);
            Ok(Timing::total(elapsed))
        }
        Ok(response) => {
            // Refused before it ran (the outcome is not a result): never applied.
            Err(format!("not applied: {:?}", response.outcome))
        }
        Err(status) => {
            acks.unacknowledged(&cell.key, tag);
            Err(describe(&status))
        }
    }
}

/// Runs `workload` at `concurrency` for `window`.
pub async fn run(
    client: &BenchClient,
    acks: &Arc<AckLog>,
    pools: &Pools,
    workload: Workload,
    concurrency: usize,
    window: Window,
    node_ids: &[String],
) -> WorkloadResult {
    let cells = pools.cells(workload);
    assert!(
        !cells.is_empty(),
        "set-up created a pool for every closed-loop workload run"
    );
    let context = Arc::new(Context {
        client: client.clone(),
        acks: acks.clone(),
        cells,
        node_ids: node_ids.to_vec(),
        workload,
        concurrency,
        mismatches: AtomicU64::new(0),
    });
    let driver = context.clone();
    let label = format!("{} c={concurrency}", workload.name());
    let sample = load::drive_labelled(label, concurrency, window, 0, move |worker, sequence| {
        let context = driver.clone();
        async move {
            if context.workload.command() {
                context.command(worker, sequence).await
            } else {
                context.query(worker).await
            }
        }
    })
    .await;
    WorkloadResult {
        sample,
        owner_mismatches: context.mismatches.load(Ordering::Relaxed),
    }
}
