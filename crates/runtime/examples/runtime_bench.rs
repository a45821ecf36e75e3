//! Runtime throughput and latency against SeaweedFS, with the store floor (create-only LTX PUT + root CAS) measured in the same run.
//!
//! ```text
//! cargo run --release -p cellfleet-runtime --example runtime_bench
//! ```
//!
//! Uses `CELLFLEET_S3_ENDPOINT` if set, else starts `scripts/seaweedfs.sh`.
//! Workloads: (a) one hot Cell with 1, 16 and 64 concurrent submitters;
//! (b) 1,000 Cells chosen uniformly by 16 submitters (warmed first, and
//! with fewer Cells open than owned, so passivation and reopening are in
//! the measurement). The floor is measured before and after the workloads
//! (A … A), and every acknowledged command is checked afterwards.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cellfleet_authority::{NodeId, SystemClock};
use cellfleet_cell::{kv::KvCommand, Command};
use cellfleet_runtime::{Kinds, Node, NodeConfig, NodeHandle};
use cellfleet_store::{ObjectStore, PutCondition};
use serde_json::json;

const FLOOR_SAMPLES: usize = 300;
const FLEET_CELLS: u64 = 1_000;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len().saturating_sub(1))]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// One create-only PUT of an LTX-sized object plus one If-Match replace of
/// a root-sized object, sequentially: what one publication must wait for.
async fn floor(store: &Arc<dyn ObjectStore>, run: &str, label: &str) -> Duration {
    let root_key = format!("{run}/floor-{label}/root.json");
    let mut etag = store
        .put(
            &root_key,
            Bytes::from(vec![b'r'; 900]),
            PutCondition::Overwrite,
        )
        .await
        .expect("seed root");
    let mut samples = Vec::with_capacity(FLOOR_SAMPLES);
    for i in 0..FLOOR_SAMPLES {
        let mut ltx = vec![b'l'; 4 * 1024 + 200];
        ltx[..8].copy_from_slice(&(i as u64).to_be_bytes());
        let mut root = vec![b'r'; 900];
        root[..8].copy_from_slice(&(i as u64).to_be_bytes());
        let started = Instant::now();
        store
            .put(
                &format!("{run}/floor-{label}/ltx-{i}"),
                Bytes::from(ltx),
                PutCondition::IfNoneMatch,
            )
            .await
            .expect("ltx put");
        etag = store
            .put(&root_key, Bytes::from(root), PutCondition::IfMatch(etag))
            .await
            .expect("root cas");
        samples.push(started.elapsed());
    }
    samples.sort();
    let p50 = percentile(&samples, 0.5);
    println!(
        "floor[{label}]  LTX PUT (If-None-Match) + root CAS (If-Match), sequential: p50={:.3} ms p99={:.3} ms",
        ms(p50),
        ms(percentile(&samples, 0.99))
    );
    p50
}

/// The same publication floor with 16 concurrent writers spread over
/// 1,000 Cell-like prefixes (what workload (b) asks of the store): one
/// LTX create plus one root CAS per publication. Returns publications/s.
async fn floor_fleet(store: &Arc<dyn ObjectStore>, run: &str) -> f64 {
    const WRITERS: u64 = 16;
    const PER_WRITER: u64 = 125;
    let started = Instant::now();
    let tasks: Vec<_> = (0..WRITERS)
        .map(|w| {
            let store = store.clone();
            let run = run.to_owned();
            tokio::spawn(async move {
                let mut etags = std::collections::HashMap::new();
                let mut latencies = Vec::new();
                for i in 0..PER_WRITER {
                    let cell = w * (FLEET_CELLS / WRITERS) + i % (FLEET_CELLS / WRITERS);
                    let root_key = format!("{run}/floor-fleet/cells/{cell}/root.json");
                    let mut root = vec![b'r'; 900];
                    root[..8].copy_from_slice(&i.to_be_bytes());
                    let sent = Instant::now();
                    store
                        .put(
                            &format!("{run}/floor-fleet/cells/{cell}/ltx/{i}"),
                            Bytes::from(vec![b'l'; 4 * 1024 + 200]),
                            PutCondition::IfNoneMatch,
                        )
                        .await
                        .expect("ltx put");
                    let condition = match etags.get(&cell) {
                        Some(etag) => PutCondition::IfMatch(Clone::clone(etag)),
                        None => PutCondition::IfNoneMatch,
                    };
                    let etag = store
                        .put(&root_key, Bytes::from(root), condition)
                        .await
                        .expect("root cas");
                    etags.insert(cell, etag);
                    latencies.push(sent.elapsed());
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("writer"));
    }
    let rate = latencies.len() as f64 / started.elapsed().as_secs_f64();
    latencies.sort();
    println!(
        "floor[fleet]   LTX PUT + root CAS, 16 writers over 1,000 prefixes: {rate:.0} publications/s p50={:.3} ms p99={:.3} ms",
        ms(percentile(&latencies, 0.5)),
        ms(percentile(&latencies, 0.99)),
    );
    rate
}

fn put_command(n: u64, key: &str) -> Command {
    let (name, args) = cellfleet_cell::kind::to_wire(&KvCommand::Put {
        key: key.to_owned(),
        value: json!(n),
    })
    .expect("kv command encodes");
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&rand_u64().to_be_bytes());
    id[8..].copy_from_slice(&n.to_be_bytes());
    let expires = now_ms() + 600_000;
    Command::new(id, name, args, expires)
}

fn now_ms() -> i64 {
    use cellfleet_authority::Clock;
    SystemClock.now_wall_ms() as i64
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(Instant::now().elapsed().as_nanos() as u64);
    hasher.finish()
}

struct Report {
    label: String,
    commands: usize,
    wall: Duration,
    latencies: Vec<Duration>,
}

impl Report {
    fn print(&mut self, floor_p50: Duration) {
        self.latencies.sort();
        let p50 = percentile(&self.latencies, 0.5);
        println!(
            "{:<32} n={:<5} {:>8.0} commands/s  p50={:>7.3} ms ({:.2}x floor)  p99={:>7.3} ms",
            self.label,
            self.commands,
            self.commands as f64 / self.wall.as_secs_f64(),
            ms(p50),
            p50.as_secs_f64() / floor_p50.as_secs_f64(),
            ms(percentile(&self.latencies, 0.99)),
        );
    }
}

/// `submitters` tasks each run `per_submitter` commands on keys picked by `pick`.
async fn workload(
    node: &NodeHandle,
    label: &str,
    submitters: usize,
    per_submitter: usize,
    keys: Arc<dyn Fn(u64) -> String + Send + Sync>,
) -> Report {
    let started = Instant::now();
    let tasks: Vec<_> = (0..submitters)
        .map(|s| {
            let node = node.clone();
            let keys = keys.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(per_submitter);
                for i in 0..per_submitter {
                    let n = (s * per_submitter + i) as u64;
                    let key = keys(n);
                    let sent = Instant::now();
                    loop {
                        match node
                            .execute("kv", key.as_bytes(), put_command(n, "v"))
                            .await
                        {
                            Ok(_) => break,
                            Err(error) if error.retry_after_ms().is_some() => {
                                tokio::time::sleep(Duration::from_millis(
                                    error.retry_after_ms().unwrap_or(10),
                                ))
                                .await;
                            }
                            Err(error) => panic!("command failed: {error}"),
                        }
                    }
                    latencies.push(sent.elapsed());
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("submitter"));
    }
    Report {
        label: label.to_owned(),
        commands: latencies.len(),
        wall: started.elapsed(),
        latencies,
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    // As the `cellfleet` binary does: no process-wide lock per SQLite allocation.
    cellfleet_cell::memory_statistics_off();
    let store: Arc<dyn ObjectStore> = cellfleet_store::testkit::s3_store().await;
    let run = cellfleet_store::testkit::unique_prefix("runtime-bench");
    let dir = std::env::temp_dir().join(format!("cellfleet-runtime-bench-{}", std::process::id()));
    let config = NodeConfig::new(
        NodeId::new("bench").expect("node id"),
        dir.join("bench"),
        format!("{run}/cluster"),
    );
    let node = Node::start(
        config,
        store.clone(),
        Arc::new(SystemClock),
        Arc::new(Kinds::builtin()),
    )
    .await
    .expect("node starts");

    let floor_before = floor(&store, &run, "before").await;
    // Warm the hot Cell.
    node.execute("kv", b"hot", put_command(0, "v"))
        .await
        .expect("warm");
    let hot: Arc<dyn Fn(u64) -> String + Send + Sync> = Arc::new(|_| "hot".to_owned());
    let mut reports = vec![
        workload(&node, "hot cell, 1 submitter", 1, 300, hot.clone()).await,
        workload(&node, "hot cell, 16 submitters", 16, 100, hot.clone()).await,
        workload(&node, "hot cell, 64 submitters", 64, 60, hot.clone()).await,
    ];
    // Fleet: warm every Cell (creation + migration), then measure. First
    // with every Cell open, then on a second node that may keep only 256
    // of its 1,000 Cells open (passivation and reopening in the path).
    let fleet: Arc<dyn Fn(u64) -> String + Send + Sync> = Arc::new(|n| {
        format!(
            "cell-{}",
            n.wrapping_mul(0x9e37_79b9_7f4a_7c15) % FLEET_CELLS
        )
    });
    let warm: Arc<dyn Fn(u64) -> String + Send + Sync> = Arc::new(|n| format!("cell-{n}"));
    let per_submitter = (FLEET_CELLS / 16 + 1) as usize;
    let warmup = workload(&node, "fleet warm-up", 16, per_submitter, warm.clone()).await;
    println!(
        "fleet warm-up: {} commands (activations) in {:.1} s",
        warmup.commands,
        warmup.wall.as_secs_f64()
    );
    reports.push(
        workload(
            &node,
            "1,000 cells uniform, 16 subm.",
            16,
            250,
            fleet.clone(),
        )
        .await,
    );
    let mut churn_config = NodeConfig::new(
        NodeId::new("churn").expect("node id"),
        dir.join("churn"),
        format!("{run}/churn"),
    );
    churn_config.limits.cells_open_max = 256;
    let churn = Node::start(
        churn_config,
        store.clone(),
        Arc::new(SystemClock),
        Arc::new(Kinds::builtin()),
    )
    .await
    .expect("node starts");
    workload(&churn, "churn warm-up", 16, per_submitter, warm).await;
    reports.push(workload(&churn, "1,000 cells, 256 open, 16 subm.", 16, 250, fleet).await);
    let floor_after = floor(&store, &run, "after").await;
    floor_fleet(&store, &run).await;
    let floor_p50 = (floor_before + floor_after) / 2;
    println!("floor p50 (mean of before/after) = {:.3} ms", ms(floor_p50));
    for report in &mut reports {
        report.print(floor_p50);
    }
    let text = node.metrics_text();
    for line in text.lines().filter(|l| {
        l.starts_with("cellfleet_runtime_publications_total")
            || l.starts_with("cellfleet_runtime_compactions_total")
            || l.starts_with("cellfleet_runtime_passivations_total")
            || l.starts_with("cellfleet_runtime_group_commands_sum")
            || l.starts_with("cellfleet_runtime_group_commands_count")
            || l.starts_with("cellfleet_runtime_publication_seconds_sum")
            || l.starts_with("cellfleet_runtime_publication_seconds_count")
    }) {
        println!("{line}");
    }
    println!(
        "churn node passivations: {}",
        churn
            .metrics()
            .passivations_total
            .load(std::sync::atomic::Ordering::Relaxed)
    );
    let released = node.drain().await.expect("drain") + churn.drain().await.expect("drain");
    println!("drained: released {released} cells");
    let _ = std::fs::remove_dir_all(&dir);
}
