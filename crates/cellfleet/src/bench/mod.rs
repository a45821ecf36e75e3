//! `cellfleet bench`: latency and throughput of a real cluster (N `cellfleet node` processes over mTLS on loopback), with the floors measured in the same run.
//!
//! One run: a temporary cluster directory (CA, certificates, client key and
//! registry, written by `dev`'s own code) and N node processes on one store
//! (SeaweedFS by default, started through `scripts/seaweedfs.sh` when
//! `CELLFLEET_S3_ENDPOINT` is unset; or the local-directory store). Then:
//!
//! 1. cells are created and their owners learnt from `served_by` ([`workloads`]);
//! 2. the floors, *before*: a bare tonic echo over the same mTLS and the
//!    store's publication floor (create-only 4 KiB PUT + If-Match 1 KiB CAS)
//!    ([`floors`]);
//! 3. the workloads, grouped by concurrency so that the pairs the goals
//!    compare run back to back ([`workloads`], driven by [`load`]);
//! 4. the floors again, *after* (a noisy machine shows up as a gap);
//! 5. the exactness check: every acknowledged command is in its Cell exactly
//!    once ([`exactness`]);
//! 6. SIGTERM to every node, which drains ([`cluster`]).
//!
//! The table and the goals are in [`report`]. Code map: [`cluster`] (the
//! processes and the store), [`client`] (the signing gRPC client),
//! [`load`] (the closed-loop driver and HDR histograms), [`workloads`],
//! [`floors`], [`exactness`], [`report`].

mod client;
mod cluster;
mod exactness;
mod floors;
mod load;
mod report;
mod workloads;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};

use crate::bench::client::BenchClient;
use crate::bench::cluster::BenchCluster;
use crate::bench::load::Window;
use crate::bench::report::{FloorRow, Phase, Report, WorkloadRow};
use crate::bench::workloads::Workload;

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
}

/// Bound on `--concurrency` (each level gets that many Cells per workload).
const CONCURRENCY_MAX: usize = 256;

fn seconds(value: f64, name: &str) -> anyhow::Result<Duration> {
    if !value.is_finite() || !(0.0..=3600.0).contains(&value) {
        bail!("--{name} {value}: give seconds between 0 and 3600");
    }
    Ok(Duration::from_secs_f64(value))
}

pub fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
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
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    eprintln!(
        "bench: starting {} nodes on the {} store",
        args.nodes,
        args.store.name()
    );
    let store = cluster::StoreSetup::resolve(args.store, &runtime)?;
    let mut cluster = BenchCluster::start(args.nodes, store)?;
    let measured = runtime.block_on(measure(&cluster, &workloads, &args.concurrency, window));
    eprintln!("bench: stopping the nodes (SIGTERM, drain)");
    let drained = cluster.stop();
    let mut report = measured?;
    report.drained = drained;
    report.config = serde_json::json!({
        "nodes": args.nodes,
        "store": args.store.name(),
        "store_detail": cluster.store_description(),
        "duration_s": window.duration.as_secs_f64(),
        "warmup_s": window.warmup.as_secs_f64(),
        "concurrency": args.concurrency,
        "workloads": workloads.iter().map(|w| w.name()).collect::<Vec<_>>(),
    });
    print!("{}", report.table());
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report.json())?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("bench: wrote {}", path.display());
    }
    if !report.exactness.passed {
        eprintln!("bench: the exactness check FAILED");
        return Ok(ExitCode::from(1));
    }
    if report.drained.iter().any(|(_, clean)| !clean) {
        eprintln!("bench: a node did not drain cleanly");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// Everything between "nodes ready" and "stop the nodes".
async fn measure(
    cluster: &BenchCluster,
    workloads: &[Workload],
    levels: &[usize],
    window: Window,
) -> anyhow::Result<Report> {
    let client = BenchClient::new(
        cluster.client_tls()?,
        &cluster.client_addrs(),
        cluster.signing_key()?,
    )?;
    let node_ids = cluster.node_ids();
    let acks = Arc::new(exactness::AckLog::default());
    let cells_per_pool = levels.iter().copied().max().unwrap_or(1);
    eprintln!("bench: creating cells and learning their owners");
    let pools = workloads::setup(&client, &acks, workloads, cells_per_pool, &node_ids).await?;
    let echo = floors::EchoServer::start(&cluster.node_identity("n1")?)?;
    let echo_client =
        BenchClient::new(cluster.client_tls()?, &[echo.addr], cluster.signing_key()?)?;
    let store = cluster.floor_store().await?;
    let floor_prefix = cluster.floor_prefix();
    let mut report = Report::default();
    let floors_at = |phase: Phase| {
        let echo_client = echo_client.clone();
        let store = store.clone();
        let floor_prefix = floor_prefix.clone();
        async move {
            let mut rows = Vec::new();
            for &concurrency in levels {
                eprintln!("bench: floors {} c={concurrency}", phase.name());
                let sample = floors::echo(&echo_client, concurrency, window).await;
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
                rows.push(FloorRow::new(
                    floors::STORE_PUBLICATION,
                    phase,
                    concurrency,
                    &sample.total,
                ));
                rows.push(FloorRow::new(
                    floors::STORE_CREATE,
                    phase,
                    concurrency,
                    &sample.parts[0],
                ));
                rows.push(FloorRow::new(
                    floors::STORE_CAS,
                    phase,
                    concurrency,
                    &sample.parts[1],
                ));
            }
            anyhow::Ok(rows)
        }
    };
    report.floors.extend(floors_at(Phase::Before).await?);
    for &concurrency in levels {
        for &workload in workloads {
            eprintln!("bench: {} c={concurrency}", workload.name());
            let result = workloads::run(
                &client,
                &acks,
                &pools,
                workload,
                concurrency,
                window,
                &node_ids,
            )
            .await;
            report
                .workloads
                .push(WorkloadRow::new(workload, concurrency, &result));
        }
    }
    report.floors.extend(floors_at(Phase::After).await?);
    echo.stop();
    eprintln!("bench: exactness check");
    report.exactness = exactness::check(&client, &acks, 0).await;
    Ok(report)
}
