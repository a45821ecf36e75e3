//! The `fleet` workload: uniform durable writes over 1k, 10k and 100k Cells (sizes from `--fleet-cells`), with per-node throughput, p99, and the node processes' memory and open files at each size.
//!
//! The Cells are created size by size (the 10k set contains the 1k set),
//! [`SETUP_CONCURRENCY`] at a time through every node in turn, within one
//! time budget for the whole workload (`--fleet-setup-s`): when it runs out
//! the sizes still to come are measured over the Cells created so far and
//! the row says so (`cells` < `cells_requested`). Then `--fleet-concurrency`
//! clients each send a local command (ingress = owner) to a Cell drawn
//! uniformly at random, closed loop. While they run, each node's resident
//! memory and open files are sampled from `/proc` every
//! [`SAMPLE_EVERY`] (the maximum is kept), and the nodes' metrics are read
//! before and after for the per-phase breakdown (activations show Cells
//! reopened after passivation: a node keeps a bounded number open).

use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};
use serde::Serialize;

use crate::client::BenchClient;
use crate::exactness::AckLog;
use crate::load::Summary;
use crate::load::{self, Window};
use crate::node_stats::{self, Phases, ProcessStats};
use crate::workloads::{self, BenchCell, Workload};

/// Cell creations in flight at once during set-up.
pub const SETUP_CONCURRENCY: usize = 64;
/// How often the node processes are sampled during a measurement.
const SAMPLE_EVERY: Duration = Duration::from_millis(500);
/// How often the set-up progress is printed when stderr is not a terminal.
const SETUP_LOG_EVERY: Duration = Duration::from_secs(10);

/// What `fleet` needs to know about the cluster.
#[derive(Clone, Debug)]
pub struct FleetSetup {
    pub sizes: Vec<usize>,
    pub concurrency: usize,
    pub setup_budget: Duration,
    /// Idle time after each size's set-up, before its warm-up.
    pub settle: Duration,
    pub node_ids: Vec<String>,
    pub http_addrs: Vec<std::net::SocketAddr>,
    pub pids: Vec<u32>,
}

/// One node's maximum over a measurement.
#[derive(Clone, Debug, Serialize)]
pub struct NodeSample {
    pub node: String,
    pub rss_bytes_max: u64,
    pub open_files_max: u64,
    /// Cells open at the end (the runtime's gauge).
    pub cells_open: f64,
}

/// One fleet size.
#[derive(Clone, Debug, Serialize)]
pub struct FleetRow {
    pub cells_requested: usize,
    /// Cells the writes went to (fewer than requested if set-up ran out of time).
    pub cells: usize,
    /// Seconds spent creating this size's new Cells, and their rate.
    pub setup_s: f64,
    pub created_per_s: f64,
    pub concurrency: usize,
    #[serde(flatten)]
    pub summary: Summary,
    /// Durable commands per second per node (the cluster's over the node count).
    pub per_node_per_s: f64,
    pub phases: Phases,
    pub nodes: Vec<NodeSample>,
    #[serde(skip)]
    pub histogram: hdrhistogram::Histogram<u64>,
}

/// The set-up's progress: a bar drawn by `indicatif` on a terminal
/// (`bench: fleet set-up N/M cells, R/s`); in a log, that line every
/// [`SETUP_LOG_EVERY`].
struct SetupProgress {
    bar: ProgressBar,
    first: u64,
    last_log: Instant,
}

impl SetupProgress {
    fn new(first: usize, target: usize) -> Self {
        let style = ProgressStyle::with_template("bench: fleet set-up {pos}/{len} cells, {rate}")
            .expect("the progress template is valid")
            .with_key(
                "rate",
                move |state: &ProgressState, w: &mut dyn std::fmt::Write| {
                    let created = state.pos().saturating_sub(first as u64) as f64;
                    let _ = write!(
                        w,
                        "{:.0}/s",
                        created / state.elapsed().as_secs_f64().max(1e-3)
                    );
                },
            );
        let bar = ProgressBar::with_draw_target(Some(target as u64), ProgressDrawTarget::stderr())
            .with_style(style)
            .with_position(first as u64);
        Self {
            bar,
            first: first as u64,
            last_log: Instant::now(),
        }
    }

    /// Clears the bar and prints the set-up's last line (also in a log).
    fn finish(self, done: usize) {
        self.bar.finish_and_clear();
        eprintln!("{}", self.line(done));
    }

    /// `bench: fleet set-up N/M cells, R/s`, R over this size's new Cells.
    fn line(&self, done: usize) -> String {
        let created = (done as u64).saturating_sub(self.first) as f64;
        format!(
            "bench: fleet set-up {done}/{} cells, {:.0}/s",
            self.bar.length().unwrap_or_default(),
            created / self.bar.elapsed().as_secs_f64().max(1e-3)
        )
    }

    fn set(&mut self, done: usize) {
        self.bar.set_position(done as u64);
        if self.bar.is_hidden() && self.last_log.elapsed() >= SETUP_LOG_EVERY {
            eprintln!("{}", self.line(done));
            self.last_log = Instant::now();
        }
    }
}

/// Creates Cells `cells.len()..target` until `deadline`; returns the
/// first error that is not a timeout.
async fn grow(
    client: &BenchClient,
    acks: &Arc<AckLog>,
    node_ids: &Arc<Vec<String>>,
    cells: &mut Vec<BenchCell>,
    target: usize,
    deadline: Instant,
) -> anyhow::Result<()> {
    let first = cells.len();
    let mut progress = SetupProgress::new(first, target);
    let mut next = first;
    let mut tasks = tokio::task::JoinSet::new();
    let mut created = Vec::new();
    loop {
        while next < target && tasks.len() < SETUP_CONCURRENCY && Instant::now() < deadline {
            let key = format!("bench-{}-{next}", Workload::Fleet.short());
            tasks.spawn(workloads::create_cell(
                client.clone(),
                acks.clone(),
                key,
                next % node_ids.len(),
                node_ids.clone(),
            ));
            next += 1;
        }
        let Some(done) = tasks.join_next().await else {
            break;
        };
        created.push(done??);
        progress.set(first + created.len());
    }
    progress.finish(first + created.len());
    // Keep key order (index i is Cell `bench-fl-i`) for readable reports.
    created.sort_by_key(|cell: &BenchCell| {
        cell.key
            .rsplit('-')
            .next()
            .and_then(|i| i.parse::<usize>().ok())
            .unwrap_or(usize::MAX)
    });
    cells.extend(created);
    Ok(())
}

/// Samples every node's `/proc` until `stop` turns true; the maxima.
async fn sample_nodes(
    pids: Vec<u32>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<ProcessStats> {
    let mut max = vec![ProcessStats::default(); pids.len()];
    loop {
        for (slot, pid) in max.iter_mut().zip(&pids) {
            let now = node_stats::process_stats(*pid);
            slot.rss_bytes = slot.rss_bytes.max(now.rss_bytes);
            slot.open_files = slot.open_files.max(now.open_files);
        }
        tokio::select! {
            _ = tokio::time::sleep(SAMPLE_EVERY) => {}
            _ = stop.wait_for(|stop| *stop) => return max,
        }
    }
}

/// Runs every fleet size.
pub async fn run(
    client: &BenchClient,
    acks: &Arc<AckLog>,
    setup: &FleetSetup,
    window: Window,
) -> anyhow::Result<Vec<FleetRow>> {
    let node_ids = Arc::new(setup.node_ids.clone());
    let deadline = Instant::now() + setup.setup_budget;
    let mut cells: Vec<BenchCell> = Vec::new();
    let mut rows = Vec::new();
    let mut sizes = setup.sizes.clone();
    sizes.sort_unstable();
    sizes.dedup();
    for size in sizes {
        let before = cells.len();
        let started = Instant::now();
        eprintln!("bench: fleet set-up to {size} cells");
        grow(client, acks, &node_ids, &mut cells, size, deadline).await?;
        let setup_s = started.elapsed().as_secs_f64();
        if cells.len() < size {
            eprintln!(
                "bench: fleet set-up budget spent: measuring {} of {size} cells",
                cells.len()
            );
        }
        if cells.is_empty() {
            continue;
        }
        if !setup.settle.is_zero() {
            eprintln!(
                "bench: fleet of {} cells settling for {:.1} s before the measurement",
                cells.len(),
                setup.settle.as_secs_f64()
            );
            tokio::time::sleep(setup.settle).await;
        }
        let created = (cells.len() - before, setup_s);
        rows.push(measure_size(client, acks, setup, &cells, size, created, window).await);
    }
    Ok(rows)
}

/// One fleet size measured: a closed loop of commands to random Cells of
/// `cells`, with the nodes' CPU, peak RSS and open files, and the per-phase
/// breakdown from their metrics. `created` is what the set-up for this size
/// added and how long it took.
async fn measure_size(
    client: &BenchClient,
    acks: &Arc<AckLog>,
    setup: &FleetSetup,
    cells: &[BenchCell],
    size: usize,
    (created, setup_s): (usize, f64),
    window: Window,
) -> FleetRow {
    let shared = Arc::new(cells.to_vec());
    let cpu_of = |pids: &[u32]| -> f64 {
        pids.iter()
            .filter_map(|pid| node_stats::cpu_seconds(*pid))
            .sum()
    };
    let cpu_before = cpu_of(&setup.pids);
    let metrics_before = node_stats::scrape(&setup.http_addrs).await;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let sampler = tokio::spawn(sample_nodes(setup.pids.clone(), stopped));
    let (client_op, acks_op) = (client.clone(), acks.clone());
    let sample = load::drive_labelled(
        format!("fleet {} cells c={}", cells.len(), setup.concurrency),
        setup.concurrency,
        window,
        0,
        move |worker, sequence| {
            let (client, acks, cells) = (client_op.clone(), acks_op.clone(), shared.clone());
            async move {
                let cell = &cells[rand::random_range(0..cells.len())];
                let tag = format!("fl-{size}-w{worker}-{sequence}");
                workloads::local_command(&client, &acks, cell, tag).await
            }
        },
    )
    .await;
    let _ = stop.send(true);
    let maxima = sampler.await.unwrap_or_default();
    let metrics_after = node_stats::scrape(&setup.http_addrs).await;
    let node_cpu_s = cpu_of(&setup.pids) - cpu_before;
    let summary = Summary::of_measured(&sample.total);
    let nodes = node_samples(setup, &maxima, &metrics_after);
    FleetRow {
        cells_requested: size,
        cells: cells.len(),
        setup_s,
        created_per_s: created as f64 / setup_s.max(1e-3),
        concurrency: setup.concurrency,
        per_node_per_s: summary.throughput_per_s / setup.node_ids.len().max(1) as f64,
        phases: {
            let mut phases = Phases::between(&metrics_before, &metrics_after);
            phases.cpu(node_cpu_s);
            phases
        },
        summary,
        nodes,
        histogram: sample.total.histogram,
    }
}

/// Each node's peaks over the run, and its open Cells at the end.
fn node_samples(
    setup: &FleetSetup,
    maxima: &[ProcessStats],
    metrics_after: &node_stats::Snapshot,
) -> Vec<NodeSample> {
    setup
        .node_ids
        .iter()
        .enumerate()
        .map(|(index, node)| {
            let stats = maxima.get(index).copied().unwrap_or_default();
            NodeSample {
                node: node.clone(),
                rss_bytes_max: stats.rss_bytes,
                open_files_max: stats.open_files,
                cells_open: metrics_after.node(index, "cellfleet_runtime_cells_open"),
            }
        })
        .collect()
}
