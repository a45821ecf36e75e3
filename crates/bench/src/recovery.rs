//! `cellfleet bench-recovery`: how long a dead node's Cells take to serve again elsewhere, after kill -9, at 1k and 10k Cells per node.
//!
//! One fresh cluster per size: `--nodes` node processes, `size × nodes`
//! Cells created through every node in turn (each Cell's owner learnt from
//! `served_by`), then `--load-s` seconds of writes at `--concurrency` to the
//! victim's Cells (node 1), so the newest records of many of them are in
//! its log only, not yet checkpointed. Then the victim is killed with
//! SIGKILL and, at once, every one of its Cells is sent a command through a
//! surviving node (round-robin, `--concurrency` in flight), retried every
//! [`RETRY_EVERY`] until it applies. A Cell's *recovery time* is from the
//! kill to that command's success: the lease expiry (`lease_ms` plus the
//! drift margin) and then the takeover — sealing the dead lanes, reading
//! the Cell's records, checkpointing them. The *takeover time* is from the
//! first Cell recovered to each Cell, which removes the lease wait. The
//! survivors' metrics say how many records were replayed and whether the
//! dead session was flushed. Last, the exactness check reads every Cell:
//! each acknowledged command present exactly once.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use serde::Serialize;

use crate::client::{describe, BenchClient};
use crate::cluster::{self, BenchCluster};
use crate::exactness::{self, AckLog};
use crate::exactness::{APPEND, LOG_KIND};
use crate::fleet::SETUP_CONCURRENCY;
use crate::node_stats;
use crate::workloads::{self, BenchCell};
use crate::{Publication, StoreKind};

/// How often a Cell not served yet is tried again.
const RETRY_EVERY: Duration = Duration::from_millis(50);
/// Longest one Cell may take to recover before it counts as not recovered.
const RECOVERY_BOUND: Duration = Duration::from_secs(180);
/// Bound on `--cells-per-node`.
const CELLS_PER_NODE_MAX: usize = 100_000;

#[derive(Debug, Args)]
pub struct RecoveryArgs {
    /// Number of node processes (at least 2: one dies).
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// The store the nodes share.
    #[arg(long, value_enum, default_value_t = StoreKind::S3)]
    store: StoreKind,
    /// Cells the victim owns, per measurement (comma-separated); each size
    /// creates about this many Cells per node.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    cells_per_node: Vec<usize>,
    /// Requests in flight, for the writes before the kill and the
    /// recovery after it.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Seconds of writes to the victim's Cells right before the kill.
    #[arg(long, default_value_t = 5.0)]
    load_s: f64,
    /// How the nodes make groups durable.
    #[arg(long, value_enum, default_value_t = Publication::Log)]
    publication: Publication,
    /// Also write the rows as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// One size's result.
#[derive(Clone, Debug, Serialize)]
pub struct RecoveryRow {
    pub cells_per_node: usize,
    /// Cells the victim owned at the kill.
    pub victim_cells: usize,
    pub recovered: usize,
    /// Commands acknowledged by the victim in the `load_s` before the kill.
    pub load_commands: usize,
    pub lease_ms: u64,
    /// From the kill to each Cell's first applied command (ms).
    pub from_kill_p50_ms: f64,
    pub from_kill_p99_ms: f64,
    pub from_kill_max_ms: f64,
    /// From the first Cell recovered to each Cell (ms).
    pub takeover_p50_ms: f64,
    pub takeover_p99_ms: f64,
    pub takeover_max_ms: f64,
    /// Survivors' counters over the recovery.
    pub records_replayed: f64,
    pub lanes_sealed: f64,
    pub sessions_flushed: f64,
    /// Chunk indexes the survivors read to index the dead lanes (each
    /// stands for 256 segments), and segments whose own index they read.
    pub chunk_indexes_read: f64,
    pub segment_indexes_read: f64,
    pub exactness_passed: bool,
    pub exactness_problems: Vec<String>,
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Runs `cellfleet bench-recovery`; `exe` is the `cellfleet` binary whose
/// nodes it starts.
pub fn run(exe: &Path, args: RecoveryArgs) -> anyhow::Result<ExitCode> {
    if args.nodes < 2 || args.nodes > 99 {
        bail!("--nodes must be 2..=99 (one of them is killed)");
    }
    if args.cells_per_node.is_empty()
        || args
            .cells_per_node
            .iter()
            .any(|n| *n == 0 || *n > CELLS_PER_NODE_MAX)
    {
        bail!("--cells-per-node: give counts 1..={CELLS_PER_NODE_MAX}, like 1000,10000");
    }
    if args.concurrency == 0 || args.concurrency > 256 {
        bail!("--concurrency must be 1..=256");
    }
    if !args.load_s.is_finite() || !(0.0..=600.0).contains(&args.load_s) {
        bail!("--load-s: give seconds between 0 and 600");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let mut rows = Vec::new();
    for &size in &args.cells_per_node {
        eprintln!(
            "bench-recovery: {} nodes on the {} store, {size} cells per node, publication {}",
            args.nodes,
            args.store.name(),
            args.publication.name()
        );
        let store = cluster::StoreSetup::resolve(args.store, "bench-recovery", &runtime)?;
        let mut cluster = BenchCluster::start(exe, args.nodes, store, args.publication.name())?;
        let row = runtime.block_on(measure(&mut cluster, &args, size));
        eprintln!("bench-recovery: stopping the survivors");
        cluster.stop(crate::cluster::DRAIN_TIMEOUT);
        if let Err(error) = runtime.block_on(cluster.delete_objects()) {
            eprintln!("bench-recovery: deleting the run's objects failed: {error:#}");
        }
        let row = row?;
        // Each size's row as soon as it is measured (a later size may take long).
        eprint!("{}", table(std::slice::from_ref(&row)));
        rows.push(row);
    }
    println!("{}", table(&rows));
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&rows)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let passed = rows
        .iter()
        .all(|r| r.exactness_passed && r.recovered == r.victim_cells);
    Ok(if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn table(rows: &[RecoveryRow]) -> String {
    let mut out = String::from(
        "Cells/node  victim  recovered  load cmds  lease ms  first ms  from kill p50/p99/max ms  takeover p50/p99/max ms  replayed  sealed  flushed  index reads (chunks + segments)  exact\n",
    );
    for r in rows {
        out.push_str(&format!(
            "{:>10}  {:>6}  {:>9}  {:>9}  {:>8}  {:>8.0}  {:>8.0} / {:>6.0} / {:>6.0}  {:>7.0} / {:>6.0} / {:>6.0}  {:>8.0}  {:>6.0}  {:>7.0}  {:>15.0} + {:<15.0}  {}\n",
            r.cells_per_node,
            r.victim_cells,
            r.recovered,
            r.load_commands,
            r.lease_ms,
            // The kill to the first Cell recovered (takeover times count
            // from it).
            r.from_kill_p50_ms - r.takeover_p50_ms,
            r.from_kill_p50_ms,
            r.from_kill_p99_ms,
            r.from_kill_max_ms,
            r.takeover_p50_ms,
            r.takeover_p99_ms,
            r.takeover_max_ms,
            r.records_replayed,
            r.lanes_sealed,
            r.sessions_flushed,
            r.chunk_indexes_read,
            r.segment_indexes_read,
            if r.exactness_passed { "ok" } else { "FAILED" },
        ));
        for problem in &r.exactness_problems {
            out.push_str(&format!("  {problem}\n"));
        }
    }
    out
}

async fn measure(
    cluster: &mut BenchCluster,
    args: &RecoveryArgs,
    size: usize,
) -> anyhow::Result<RecoveryRow> {
    let node_ids = Arc::new(cluster.node_ids());
    let client = BenchClient::new(
        cluster.client_tls()?,
        &cluster.client_addrs(),
        cluster.signing_key()?,
    )?;
    let acks = Arc::new(AckLog::default());
    let total = size * args.nodes;
    let started = Instant::now();
    let cells = create_cells(&client, &acks, &node_ids, total).await?;
    let victim: Vec<BenchCell> = cells.into_iter().filter(|c| c.owner == 0).collect();
    eprintln!(
        "bench-recovery: created {total} cells in {:.1} s; {} owned by {}",
        started.elapsed().as_secs_f64(),
        victim.len(),
        node_ids[0]
    );
    if victim.is_empty() {
        bail!("the victim owns no cell");
    }
    let victim = Arc::new(victim);
    // Writes right before the kill, so recent records are in the log only.
    let load_commands = load(&client, &acks, &victim, args).await;
    let survivors: Vec<usize> = (1..args.nodes).collect();
    let survivor_http: Vec<std::net::SocketAddr> = cluster.http_addrs()[1..].to_vec();
    let before = node_stats::scrape(&survivor_http).await;
    cluster.kill9(0)?;
    let killed = Instant::now();
    eprintln!(
        "bench-recovery: killed {} (SIGKILL); recovering {} cells",
        node_ids[0],
        victim.len()
    );
    let recovered = recover_all(
        &client,
        &acks,
        &victim,
        &survivors,
        args.concurrency,
        killed,
    )
    .await;
    let after = node_stats::scrape(&survivor_http).await;
    let counter = |series: &str| -> f64 {
        (0..survivors.len())
            .map(|n| after.node(n, series) - before.node(n, series))
            .sum()
    };
    let mut from_kill: Vec<f64> = recovered.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    from_kill.sort_by(f64::total_cmp);
    let first = from_kill.first().copied().unwrap_or(f64::NAN);
    let takeover: Vec<f64> = from_kill.iter().map(|ms| ms - first).collect();
    // Exactness through the survivors only.
    let survivor_client = BenchClient::new(
        cluster.client_tls()?,
        &cluster.client_addrs()[1..],
        cluster.signing_key()?,
    )?;
    let exact = exactness::check(&survivor_client, &acks, survivors.len()).await;
    Ok(RecoveryRow {
        cells_per_node: size,
        victim_cells: victim.len(),
        recovered: recovered.len(),
        load_commands,
        lease_ms: cluster::LEASE_MS,
        from_kill_p50_ms: percentile(&from_kill, 0.50),
        from_kill_p99_ms: percentile(&from_kill, 0.99),
        from_kill_max_ms: percentile(&from_kill, 1.0),
        takeover_p50_ms: percentile(&takeover, 0.50),
        takeover_p99_ms: percentile(&takeover, 0.99),
        takeover_max_ms: percentile(&takeover, 1.0),
        records_replayed: counter("cellfleet_runtime_log_replayed_records_total"),
        lanes_sealed: counter("cellfleet_runtime_log_seals_total"),
        sessions_flushed: counter("cellfleet_runtime_log_flushes_total"),
        chunk_indexes_read: counter("cellfleet_runtime_log_chunk_indexes_read_total"),
        segment_indexes_read: counter("cellfleet_runtime_log_slot_indexes_read_total"),
        exactness_passed: exact.passed,
        exactness_problems: exact.problems.clone(),
    })
}

/// Set-up: `total` Cells created through every node in turn,
/// `SETUP_CONCURRENCY` at a time.
async fn create_cells(
    client: &BenchClient,
    acks: &Arc<AckLog>,
    node_ids: &Arc<Vec<String>>,
    total: usize,
) -> anyhow::Result<Vec<BenchCell>> {
    let mut cells: Vec<BenchCell> = Vec::with_capacity(total);
    let mut set = tokio::task::JoinSet::new();
    for i in 0..total {
        if set.len() >= SETUP_CONCURRENCY {
            if let Some(joined) = set.join_next().await {
                cells.push(joined??);
            }
        }
        set.spawn(workloads::create_cell(
            client.clone(),
            acks.clone(),
            format!("recovery-{i}"),
            i % node_ids.len(),
            node_ids.clone(),
        ));
    }
    while let Some(joined) = set.join_next().await {
        cells.push(joined??);
    }
    Ok(cells)
}

/// Each of the dead owner's Cells reached again through a survivor,
/// `concurrency` at a time: the times (from the kill) at which they
/// answered; a Cell that never did is left out.
async fn recover_all(
    client: &BenchClient,
    acks: &Arc<AckLog>,
    victim: &[BenchCell],
    survivors: &[usize],
    concurrency: usize,
    killed: Instant,
) -> Vec<Duration> {
    let mut set = tokio::task::JoinSet::new();
    let mut recovered: Vec<Duration> = Vec::with_capacity(victim.len());
    for (i, cell) in victim.iter().enumerate() {
        if set.len() >= concurrency {
            if let Some(Ok(Some(at))) = set.join_next().await {
                recovered.push(at);
            }
        }
        let (client, acks, key) = (client.clone(), acks.clone(), cell.key.clone());
        let via = survivors[i % survivors.len()];
        set.spawn(async move { recover(&client, &acks, &key, via, killed).await });
    }
    while let Some(joined) = set.join_next().await {
        if let Ok(Some(at)) = joined {
            recovered.push(at);
        }
    }
    recovered
}

/// `--load-s` of writes to the victim's Cells through their owner.
async fn load(
    client: &BenchClient,
    acks: &Arc<AckLog>,
    victim: &Arc<Vec<BenchCell>>,
    args: &RecoveryArgs,
) -> usize {
    let stop = Arc::new(AtomicBool::new(false));
    let mut set = tokio::task::JoinSet::new();
    for worker in 0..args.concurrency {
        let (client, acks, victim, stop) =
            (client.clone(), acks.clone(), victim.clone(), stop.clone());
        set.spawn(async move {
            let mut done = 0usize;
            let mut n = worker;
            while !stop.load(Ordering::Relaxed) {
                let cell = &victim[n % victim.len()];
                n += 7919;
                let tag = format!("load-{worker}-{done}");
                if workloads::local_command(&client, &acks, cell, tag)
                    .await
                    .is_ok()
                {
                    done += 1;
                }
            }
            done
        });
    }
    tokio::time::sleep(Duration::from_secs_f64(args.load_s)).await;
    stop.store(true, Ordering::Relaxed);
    let mut total = 0;
    while let Some(joined) = set.join_next().await {
        total += joined.unwrap_or(0);
    }
    total
}

/// Sends `key` one command through node `via` until it applies; the time
/// from `killed` then, or `None` past [`RECOVERY_BOUND`].
async fn recover(
    client: &BenchClient,
    acks: &AckLog,
    key: &str,
    via: usize,
    killed: Instant,
) -> Option<Duration> {
    let tag = format!("recovered-{key}");
    // One envelope, resent as is: a retry of an applied command is answered
    // from the ledger, never applied twice.
    let request = client.command(LOG_KIND, key, APPEND, &serde_json::json!({"tag": tag}));
    let mut last = String::new();
    while killed.elapsed() < RECOVERY_BOUND {
        match client.execute(via, request.clone()).await {
            Ok(response)
                if matches!(
                    response.outcome,
                    Some(cellfleet_proto::v1::execute_response::Outcome::ResultJson(
                        _
                    ))
                ) =>
            {
                acks.acked(key, tag);
                return Some(killed.elapsed());
            }
            Ok(response) => {
                last = format!("not applied: {:?}", response.outcome);
            }
            Err(status) => last = describe(&status),
        }
        tokio::time::sleep(RETRY_EVERY).await;
    }
    eprintln!("bench-recovery: {key} not served within {RECOVERY_BOUND:?}: {last}");
    acks.unacknowledged(key, tag);
    None
}
