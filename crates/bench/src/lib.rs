//! `cellfleet bench`: latency and throughput of a real cluster (N `cellfleet node` processes over mTLS on loopback), with the floors measured in the same run.
//!
//! One run: a temporary cluster directory (CA, certificates, client key and
//! registry, written by `cellfleet dev --no-start`) and N node processes on one store
//! (SeaweedFS by default, started through `scripts/seaweedfs.sh` when
//! `CELLFLEET_S3_ENDPOINT` is unset; or the local-directory store). Then:
//!
//! 1. cells are created and their owners learnt from `served_by` ([`workloads`]);
//! 2. the floors, *before*: a bare tonic echo over the same mTLS, the
//!    store's publication floor (create-only 4 KiB PUT + If-Match 1 KiB CAS)
//!    and a bare SQLite transaction ([`floors`]);
//! 3. the per-level workloads, grouped by concurrency so that the pairs the
//!    goals compare run back to back, then the fixed-concurrency ones
//!    (`serial_query`, `hot_cell`), then those with their own driver
//!    (`capacity`, then `fleet`, which creates up to 100k Cells)
//!    ([`workloads`], driven by [`load`]; [`capacity`], [`fleet`]); around
//!    each command measurement the nodes' metrics are read for the
//!    per-phase breakdown ([`node_stats`]);
//! 4. the floors again, *after* (a noisy machine shows up as a gap);
//! 5. the exactness check: every acknowledged command is in its Cell exactly
//!    once ([`exactness`]);
//! 6. SIGTERM to every node, which drains ([`cluster`]), and the run's
//!    objects are deleted from the bucket (`--keep-objects` keeps them).
//!
//! `--publication log,cell` does all of this once per mode, each with a
//! cluster and a store prefix (or local store) of its own, and the report
//! ends with the two side by side ([`report::log_against_cell`]).
//!
//! The table and the goals are in [`report`]; `--json` and `--plots` keep
//! them ([`plots`]: SVG). Code map: [`cluster`] (the processes and the
//! store), [`client`] (the signing gRPC client), [`load`] (the closed- and
//! open-loop drivers, HDR histograms, the progress line), [`workloads`],
//! [`capacity`], [`fleet`], [`floors`], [`node_stats`], [`exactness`],
//! [`report`], [`plots`].
//!
//! A new workload is a [`Workload`] variant with its [`workloads::Shape`]:
//! closed-loop ones need nothing more; one with its own driver gets an arm
//! in `measure`'s `Shape::Own` dispatch.

mod capacity;
mod client;
mod cluster;
mod exactness;
mod fleet;
mod floors;
mod load;
mod node_stats;
mod plots;
pub mod recovery;
mod report;
pub mod streams;
mod workloads;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};

use crate::client::BenchClient;
use crate::cluster::BenchCluster;
use crate::load::Window;
use crate::report::{Cleanup, FloorRow, Phase, Report, WorkloadRow};
use crate::workloads::{Shape, Workload};

/// Which store the nodes share.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StoreKind {
    /// The local-directory store (in the temporary cluster directory).
    Local,
    /// S3: `CELLFLEET_S3_ENDPOINT` if set, else SeaweedFS via scripts/seaweedfs.sh.
    S3,
}

impl StoreKind {
    fn name(self) -> &'static str {
        match self {
            StoreKind::Local => "local",
            StoreKind::S3 => "s3",
        }
    }
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Workloads to run (default: all of them).
    #[arg(value_enum)]
    workloads: Vec<Workload>,
    /// Number of node processes (forwarded workloads need at least 2).
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// The store the nodes share.
    #[arg(long, value_enum, default_value_t = StoreKind::S3)]
    store: StoreKind,
    /// Measured seconds per workload, concurrency and floor.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Unmeasured seconds before each measurement.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Concurrency levels (requests in flight), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    concurrency: Vec<usize>,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the plots (SVG: latency CDFs, fleet, capacity) into this directory.
    #[arg(long)]
    plots: Option<PathBuf>,
    /// `fleet`: Cell counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000")]
    fleet_cells: Vec<usize>,
    /// `fleet`: clients writing at once.
    #[arg(long, default_value_t = 64)]
    fleet_concurrency: usize,
    /// `fleet`: seconds the Cell creation of all sizes may take; sizes not
    /// reached are measured over the Cells created.
    #[arg(long, default_value_t = 900.0)]
    fleet_setup_s: f64,
    /// `fleet`: seconds to wait after each size's set-up before its
    /// warm-up, writing nothing. A log-mode node checkpoints a Cell that
    /// has gone `checkpoint_idle_ms` (30 s) without a command, so Cells the
    /// set-up created fall due together later; wait past that to measure
    /// without them (a row counts the checkpoints inside its window only).
    #[arg(long, default_value_t = 0.0)]
    fleet_settle_s: f64,
    /// Seconds the nodes may take to drain after SIGTERM at the end of the
    /// run; a node still running then is killed and the run fails. A node
    /// releases every Cell it owns as it drains, so a large fleet needs
    /// more than the default.
    #[arg(long, default_value_t = 60.0)]
    drain_timeout_s: f64,
    /// `capacity`: offered rates (commands/s), comma-separated; default:
    /// doubling from 250/s until one is not served, then two bisections.
    #[arg(long, value_delimiter = ',')]
    capacity_rates: Vec<f64>,
    /// `capacity`: the p99 a served rate stays within, in ms.
    #[arg(long, default_value_t = 100.0)]
    capacity_p99_ms: f64,
    /// Keep the run's objects in the bucket (default: deleted at the end).
    /// The local store, which lives in the cluster directory, is moved to
    /// a `cellfleet-bench-store-*` directory under the temporary directory;
    /// the report says where.
    #[arg(long)]
    keep_objects: bool,
    /// Keep the nodes' logs (copied out of the cluster directory, which
    /// is deleted) even when the run passes; a failed run always keeps them.
    #[arg(long)]
    keep_logs: bool,
    /// How the nodes make groups durable: `log` (the node log, the
    /// default) or `cell` (one root CAS per Cell group, the reference).
    /// `log,cell` runs the whole plan once per mode, in that order, each
    /// on a cluster of its own and the same store, and reports them side
    /// by side with the ratios (the JSON then holds one report per mode).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "log")]
    publication: Vec<Publication>,
}

/// The nodes' publication mode (`[publication] mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Publication {
    /// The node log: one segment PUT per lane group commit, across Cells.
    Log,
    /// One LTX upload and root CAS per Cell group.
    Cell,
}

impl Publication {
    fn name(self) -> &'static str {
        match self {
            Publication::Log => "log",
            Publication::Cell => "cell",
        }
    }
}

/// The clean-up's note for a local store (its objects go with the
/// cluster directory).
const LOCAL_STORE_DELETED: &str = "the local store, deleted with the cluster directory";

/// Bound on `--fleet-cells` (a node owns at most 100k Cells).
const FLEET_CELLS_MAX: usize = 1_000_000;
/// Bound on a `--capacity-rates` entry.
const CAPACITY_RATE_MAX: f64 = 1_000_000.0;

/// Bound on `--concurrency` (each level gets that many Cells per workload).
const CONCURRENCY_MAX: usize = 256;

fn seconds(value: f64, name: &str) -> anyhow::Result<Duration> {
    if !value.is_finite() || !(0.0..=3600.0).contains(&value) {
        bail!("--{name} {value}: give seconds between 0 and 3600");
    }
    Ok(Duration::from_secs_f64(value))
}

/// The run's plan from its arguments, every one checked (a clear error
/// names the flag and what it takes).
fn plan(args: &BenchArgs) -> anyhow::Result<Plan> {
    let workloads = if args.workloads.is_empty() {
        Workload::ALL.to_vec()
    } else {
        let mut chosen = args.workloads.clone();
        chosen.dedup();
        chosen
    };
    if args.nodes == 0 || args.nodes > 99 {
        bail!("--nodes must be 1..=99");
    }
    if args.nodes < 2 && workloads.iter().any(|w| w.forwarded()) {
        bail!("forwarded workloads need --nodes 2 or more (or name only local_* workloads)");
    }
    if args.concurrency.is_empty()
        || args
            .concurrency
            .iter()
            .any(|c| *c == 0 || *c > CONCURRENCY_MAX)
    {
        bail!("--concurrency: give levels 1..={CONCURRENCY_MAX}, like 1,16");
    }
    let duration = seconds(args.duration, "duration")?;
    if duration.is_zero() {
        bail!("--duration must be positive");
    }
    let window = Window {
        warmup: seconds(args.warmup, "warmup")?,
        duration,
    };
    if args.fleet_cells.is_empty()
        || args
            .fleet_cells
            .iter()
            .any(|n| *n == 0 || *n > FLEET_CELLS_MAX)
    {
        bail!("--fleet-cells: give counts 1..={FLEET_CELLS_MAX}, like 1000,10000");
    }
    if args.fleet_concurrency == 0 || args.fleet_concurrency > CONCURRENCY_MAX {
        bail!("--fleet-concurrency must be 1..={CONCURRENCY_MAX}");
    }
    if !args.fleet_setup_s.is_finite() || !(0.0..=86_400.0).contains(&args.fleet_setup_s) {
        bail!("--fleet-setup-s: give seconds between 0 and 86400");
    }
    let fleet_setup = Duration::from_secs_f64(args.fleet_setup_s);
    if !args.fleet_settle_s.is_finite() || !(0.0..=3_600.0).contains(&args.fleet_settle_s) {
        bail!("--fleet-settle-s: give seconds between 0 and 3600");
    }
    let fleet_settle = Duration::from_secs_f64(args.fleet_settle_s);
    if !args.drain_timeout_s.is_finite() || !(1.0..=86_400.0).contains(&args.drain_timeout_s) {
        bail!("--drain-timeout-s: give seconds between 1 and 86400");
    }
    if args
        .capacity_rates
        .iter()
        .any(|r| !r.is_finite() || *r <= 0.0 || *r > CAPACITY_RATE_MAX)
    {
        bail!("--capacity-rates: give rates in (0, {CAPACITY_RATE_MAX}]");
    }
    if !args.capacity_p99_ms.is_finite() || args.capacity_p99_ms <= 0.0 {
        bail!("--capacity-p99-ms must be positive");
    }
    Ok(Plan {
        workloads,
        levels: args.concurrency.clone(),
        window,
        fleet_cells: args.fleet_cells.clone(),
        fleet_concurrency: args.fleet_concurrency,
        fleet_setup,
        fleet_settle,
        capacity_rates: args.capacity_rates.clone(),
        capacity_p99_ms: args.capacity_p99_ms,
    })
}

/// Deletes the run's objects from the store, unless asked to keep them.
/// The local store lives in the cluster directory, deleted with the
/// cluster: its objects are counted, or the directory is moved out to be
/// kept.
fn cleanup(runtime: &tokio::runtime::Runtime, cluster: &BenchCluster, keep: bool) -> Cleanup {
    if let Some(store) = cluster.local_store() {
        let objects = cluster::count_files(&store);
        return if keep {
            match cluster::keep_local_store(&store, &std::env::temp_dir()) {
                Ok(kept) => {
                    eprintln!("bench: kept the local store in {}", kept.display());
                    Cleanup {
                        deleted_objects: 0,
                        note: Some(format!("kept: local {}", kept.display())),
                    }
                }
                Err(error) => Cleanup {
                    deleted_objects: objects,
                    note: Some(format!(
                        "keeping the local store failed ({error:#}): it was deleted with the cluster directory; check the space and permissions of the temporary directory (TMPDIR)"
                    )),
                },
            }
        } else {
            Cleanup {
                deleted_objects: objects,
                note: Some(LOCAL_STORE_DELETED.into()),
            }
        };
    }
    if keep {
        Cleanup {
            deleted_objects: 0,
            note: Some(format!("kept: {}", cluster.store_description())),
        }
    } else {
        eprintln!("bench: deleting the run's objects");
        match runtime.block_on(cluster.delete_objects()) {
            Ok(deleted_objects) => Cleanup {
                deleted_objects,
                note: None,
            },
            Err(error) => Cleanup {
                deleted_objects: 0,
                note: Some(format!("failed: {error:#}")),
            },
        }
    }
}

/// The run's settings and machine, as the report and its JSON show them.
fn run_config(
    args: &BenchArgs,
    cluster: &BenchCluster,
    plan: &Plan,
    mode: Publication,
    started: std::time::Instant,
) -> serde_json::Value {
    serde_json::json!({
        "nodes": args.nodes,
        "store": args.store.name(),
        "store_detail": cluster.store_description(),
        "publication": mode.name(),
        "duration_s": plan.window.duration.as_secs_f64(),
        "warmup_s": plan.window.warmup.as_secs_f64(),
        "concurrency": args.concurrency,
        "workloads": plan.workloads.iter().map(|w| w.name()).collect::<Vec<_>>(),
        "fleet_cells": args.fleet_cells,
        "fleet_concurrency": args.fleet_concurrency,
        "fleet_setup_s": args.fleet_setup_s,
        "fleet_settle_s": args.fleet_settle_s,
        "drain_timeout_s": args.drain_timeout_s,
        "capacity_p99_ms": args.capacity_p99_ms,
        "run_s": started.elapsed().as_secs_f64(),
        "machine": machine(),
        "profile": if cfg!(debug_assertions) { "debug" } else { "release" },
    })
}

/// Runs `cellfleet bench`; `exe` is the `cellfleet` binary whose nodes it
/// starts. With more than one publication mode the plan runs once per
/// mode, in the order given, and the report ends with them side by side.
pub fn run(exe: &Path, args: BenchArgs) -> anyhow::Result<ExitCode> {
    let plan = plan(&args)?;
    let modes = modes(&args.publication)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let mut runs = Vec::new();
    let mut failed = false;
    let mut error = None;
    for &mode in &modes {
        match run_mode(exe, &args, &plan, &runtime, mode) {
            Ok((report, ok)) => {
                failed |= !ok;
                runs.push((mode.name(), report));
            }
            Err(e) => {
                // What the modes before it measured is still written out.
                error = Some(e.context(format!("publication mode {}", mode.name())));
                break;
            }
        }
    }
    let compared = report::log_against_cell(&mut runs);
    if let Some((text, _)) = &compared {
        print!("{text}");
    }
    if let Some(path) = &args.json {
        let json = match (runs.as_mut_slice(), compared) {
            ([], _) => return Err(error.expect("no run without an error")),
            ([(_, report)], _) if modes.len() == 1 => report.json(),
            (runs, compared) => serde_json::json!({
                "runs": runs.iter_mut().map(|(_, report)| report.json()).collect::<Vec<_>>(),
                "log_against_cell": compared.map(|(_, json)| json),
            }),
        };
        let text = serde_json::to_string_pretty(&json)?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
        eprintln!("bench: wrote {}", path.display());
    }
    if let Some(dir) = &args.plots {
        let single = modes.len() == 1;
        for (mode, report) in &runs {
            // One mode's plots in the directory itself, several in a
            // directory each.
            let dir = if single { dir.clone() } else { dir.join(mode) };
            for path in plots::write(report, &dir)? {
                eprintln!("bench: wrote {}", path.display());
            }
        }
    }
    if let Some(error) = error {
        return Err(error);
    }
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// The publication modes to run, each once, in the order given.
fn modes(given: &[Publication]) -> anyhow::Result<Vec<Publication>> {
    let mut modes: Vec<Publication> = Vec::new();
    for mode in given {
        if modes.contains(mode) {
            bail!(
                "--publication names {} twice; give log, cell or log,cell",
                mode.name()
            );
        }
        modes.push(*mode);
    }
    if modes.is_empty() {
        bail!("--publication: give log, cell or log,cell");
    }
    Ok(modes)
}

/// One mode's run: its cluster, the plan, the drain and the clean-up,
/// and its report printed. Also says whether it passed (exactness and
/// drain); a failed run keeps its nodes' logs.
fn run_mode(
    exe: &Path,
    args: &BenchArgs,
    plan: &Plan,
    runtime: &tokio::runtime::Runtime,
    mode: Publication,
) -> anyhow::Result<(Report, bool)> {
    eprintln!(
        "bench: starting {} nodes on the {} store, publication mode {}",
        args.nodes,
        args.store.name(),
        mode.name()
    );
    let store = cluster::StoreSetup::resolve(args.store, "bench", runtime)?;
    let mut cluster = BenchCluster::start(exe, args.nodes, store, mode.name())?;
    let started = std::time::Instant::now();
    let measured = runtime.block_on(measure(&cluster, plan));
    eprintln!("bench: stopping the nodes (SIGTERM, drain)");
    let drained = cluster.stop(Duration::from_secs_f64(args.drain_timeout_s));
    let cleanup = cleanup(runtime, &cluster, args.keep_objects);
    let mut report = measured?;
    report.drained = drained;
    report.cleanup = cleanup;
    report.config = run_config(args, &cluster, plan, mode, started);
    print!("{}", report.table());
    let failed = if !report.exactness.passed {
        Some("the exactness check FAILED")
    } else if report.drained.iter().any(|node| !node.clean) {
        Some("a node did not drain cleanly")
    } else {
        None
    };
    if let Some(failed) = failed {
        eprintln!("bench: publication mode {}: {failed}", mode.name());
    }
    // The cluster directory goes with the run; its nodes' logs are what
    // explains a failure.
    if failed.is_some() || args.keep_logs {
        match cluster.keep_logs() {
            Ok(kept) => eprintln!("bench: the nodes' logs are kept in {}", kept.display()),
            Err(error) => eprintln!("bench: could not keep the nodes' logs: {error:#}"),
        }
    }
    Ok((report, failed.is_none()))
}

/// The machine the run measured: CPU model and count, memory, kernel.
fn machine() -> serde_json::Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|line| line.starts_with("model name"))
        .and_then(|line| line.split_once(':'))
        .map(|(_, model)| model.trim().to_owned());
    let memory_bytes = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|meminfo| {
            meminfo
                .lines()
                .find(|line| line.starts_with("MemTotal:"))
                .and_then(|line| line.split_whitespace().nth(1))
                .and_then(|kib| kib.parse::<u64>().ok())
        })
        .map(|kib| kib * 1024);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .ok()
        .map(|k| k.trim().to_owned());
    serde_json::json!({
        "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "cpu_model": model,
        "memory_bytes": memory_bytes,
        "kernel": kernel,
        "os": std::env::consts::OS,
        "arch": std::env::consts::ARCH,
    })
}

/// What to measure.
#[derive(Debug)]
struct Plan {
    workloads: Vec<Workload>,
    levels: Vec<usize>,
    window: Window,
    fleet_cells: Vec<usize>,
    fleet_concurrency: usize,
    fleet_setup: Duration,
    fleet_settle: Duration,
    capacity_rates: Vec<f64>,
    capacity_p99_ms: f64,
}

/// The floors at each concurrency in `levels`, and the SQLite floor (c=1).
async fn measure_floors(
    cluster: &BenchCluster,
    echo_client: &BenchClient,
    store: &Arc<dyn cellfleet_store::ObjectStore>,
    phase: Phase,
    levels: &[usize],
    window: Window,
) -> anyhow::Result<Vec<FloorRow>> {
    let floor_prefix = cluster.floor_prefix();
    let mut rows = Vec::new();
    for &concurrency in levels {
        let sample = floors::echo(echo_client, concurrency, window).await;
        rows.push(FloorRow::new(
            floors::ECHO,
            phase,
            concurrency,
            &sample.total,
        ));
        let sample = floors::store(
            store.clone(),
            &format!("{floor_prefix}/{}", phase.name()),
            concurrency,
            window,
        )
        .await?;
        for (name, histogram) in [
            (floors::STORE_PUBLICATION, &sample.total),
            (floors::STORE_CREATE, &sample.parts[0]),
            (floors::STORE_CAS, &sample.parts[1]),
        ] {
            rows.push(FloorRow::new(name, phase, concurrency, histogram));
        }
        let sample = floors::store_get(
            store.clone(),
            &format!("{floor_prefix}/{}", phase.name()),
            concurrency,
            window,
        )
        .await?;
        rows.push(FloorRow::new(
            floors::STORE_GET,
            phase,
            concurrency,
            &sample.total,
        ));
    }
    eprintln!("bench: sqlite floor ({})", phase.name());
    let dir = cluster.dir().to_owned();
    let sample = tokio::task::spawn_blocking(move || floors::sqlite(&dir, window)).await??;
    rows.push(FloorRow::new(floors::SQLITE, phase, 1, &sample.total));
    Ok(rows)
}

/// Everything between "nodes ready" and "stop the nodes".
async fn measure(cluster: &BenchCluster, plan: &Plan) -> anyhow::Result<Report> {
    let window = plan.window;
    let client = BenchClient::new(
        cluster.client_tls()?,
        &cluster.client_addrs(),
        cluster.signing_key()?,
    )?;
    let node_ids = cluster.node_ids();
    let http_addrs = cluster.http_addrs();
    let acks = Arc::new(exactness::AckLog::default());
    eprintln!("bench: creating cells and learning their owners");
    let pools = workloads::setup(&client, &acks, &plan.workloads, &plan.levels, &node_ids).await?;
    let echo = floors::EchoServer::start(&cluster.node_identity("n1")?)?;
    let echo_client =
        BenchClient::new(cluster.client_tls()?, &[echo.addr], cluster.signing_key()?)?;
    let store = cluster.floor_store().await?;
    let floor_levels = plan.floor_levels();
    let mut report = Report::default();
    report.floors.extend(
        measure_floors(
            cluster,
            &echo_client,
            &store,
            Phase::Before,
            &floor_levels,
            window,
        )
        .await?,
    );
    for run in plan.closed_loop() {
        let row =
            closed_loop_row(&client, &acks, &pools, &node_ids, &http_addrs, run, window).await;
        report.workloads.push(row);
    }
    run_own_drivers(cluster, plan, &client, &acks, &pools, &mut report).await?;
    report.floors.extend(
        measure_floors(
            cluster,
            &echo_client,
            &store,
            Phase::After,
            &floor_levels,
            window,
        )
        .await?,
    );
    echo.stop();
    eprintln!("bench: exactness check");
    report.exactness = exactness::check(&client, &acks, node_ids.len()).await;
    Ok(report)
}

impl Plan {
    /// The floors' levels: every level, and c=1 (one Cell's publications
    /// follow one another: the floor `hot_cell` is compared with).
    fn floor_levels(&self) -> Vec<usize> {
        let mut levels = self.levels.clone();
        levels.push(1);
        levels.sort_unstable();
        levels.dedup();
        levels
    }

    /// The closed-loop runs in order: each per-level workload at every
    /// level, then the workloads with a fixed concurrency.
    fn closed_loop(&self) -> Vec<(Workload, usize)> {
        let mut runs: Vec<(Workload, usize)> = Vec::new();
        for &concurrency in &self.levels {
            for &workload in &self.workloads {
                if workload.shape() == Shape::PerLevel {
                    runs.push((workload, concurrency));
                }
            }
        }
        for &workload in &self.workloads {
            if let Shape::Fixed(concurrency) = workload.shape() {
                runs.push((workload, concurrency));
            }
        }
        runs
    }
}

/// One closed-loop run of `workload` at `concurrency`, with the nodes'
/// per-phase breakdown (scraped before and after) for a command workload.
async fn closed_loop_row(
    client: &BenchClient,
    acks: &Arc<exactness::AckLog>,
    pools: &workloads::Pools,
    node_ids: &[String],
    http_addrs: &[std::net::SocketAddr],
    (workload, concurrency): (Workload, usize),
    window: Window,
) -> WorkloadRow {
    let before = node_stats::scrape(http_addrs).await;
    let result = workloads::run(client, acks, pools, workload, concurrency, window, node_ids).await;
    let phases = if workload.command() {
        let after = node_stats::scrape(http_addrs).await;
        Some(node_stats::Phases::between(&before, &after))
    } else {
        None
    };
    WorkloadRow::new(workload, concurrency, &result, phases)
}

/// The workloads with a driver of their own (`capacity`, `fleet`), into
/// `report`.
async fn run_own_drivers(
    cluster: &BenchCluster,
    plan: &Plan,
    client: &BenchClient,
    acks: &Arc<exactness::AckLog>,
    pools: &workloads::Pools,
    report: &mut Report,
) -> anyhow::Result<()> {
    for &workload in &plan.workloads {
        if workload.shape() != Shape::Own {
            continue;
        }
        match workload {
            Workload::Capacity => {
                report.capacity = Some(
                    capacity::run(
                        client,
                        acks,
                        pools.cells(Workload::Capacity),
                        &plan.capacity_rates,
                        plan.capacity_p99_ms,
                        plan.window,
                    )
                    .await,
                );
            }
            Workload::Fleet => {
                let setup = fleet::FleetSetup {
                    sizes: plan.fleet_cells.clone(),
                    concurrency: plan.fleet_concurrency,
                    setup_budget: plan.fleet_setup,
                    settle: plan.fleet_settle,
                    node_ids: cluster.node_ids(),
                    http_addrs: cluster.http_addrs(),
                    pids: cluster.pids(),
                };
                report.fleet = fleet::run(client, acks, &setup, plan.window).await?;
            }
            other => bail!("{} has no driver of its own", other.name()),
        }
    }
    Ok(())
}
