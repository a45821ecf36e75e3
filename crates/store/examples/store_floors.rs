//! Latency floors of the object store: conditional PUTs of a 1 KiB root and a 64 KiB object, and GETs, at concurrency 1 and 16.
//!
//! Every later write benchmark is compared with these floors. Run:
//!
//! ```text
//! eval "$(scripts/seaweedfs.sh start)"
//! cargo run --release -p cellfleet-store --example store_floors
//! ```
//!
//! Backends: the local-directory store (in a temp dir) and S3 at
//! `CELLFLEET_S3_ENDPOINT` (SeaweedFS via the script; skipped with a note if
//! the variable is unset). Operations: create-only PUT (`If-None-Match: *`)
//! of fresh keys, chained `If-Match` replace of one key per worker, GET.
//! Each worker uses its own keys (no contention). Prints p50/p99 and rate.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cellfleet_store::{LocalStore, ObjectStore, PutCondition, S3Config, S3Store};

const OPS_PER_WORKER_C1: usize = 400;
const OPS_PER_WORKER_C16: usize = 100;

#[derive(Clone, Copy, Debug)]
enum Kind {
    Create,
    Replace,
    Get,
}

async fn worker(
    store: Arc<dyn ObjectStore>,
    prefix: String,
    kind: Kind,
    size: usize,
    ops: usize,
) -> Vec<Duration> {
    let mut latencies = Vec::with_capacity(ops);
    let key = format!("{prefix}/fixed");
    let mut etag = store
        .put(&key, body(size, 0), PutCondition::Overwrite)
        .await
        .expect("seed");
    for i in 0..ops {
        let start = Instant::now();
        match kind {
            Kind::Create => {
                store
                    .put(
                        &format!("{prefix}/c{i}"),
                        body(size, i),
                        PutCondition::IfNoneMatch,
                    )
                    .await
                    .expect("create");
            }
            Kind::Replace => {
                etag = store
                    .put(&key, body(size, i + 1), PutCondition::IfMatch(etag.clone()))
                    .await
                    .expect("replace");
            }
            Kind::Get => {
                store.get(&key).await.expect("get");
            }
        }
        latencies.push(start.elapsed());
    }
    latencies
}

/// A body whose bytes differ per `nonce` (ETags must change on replace).
fn body(size: usize, nonce: usize) -> Bytes {
    let mut bytes = vec![b'x'; size];
    let tag = format!("{nonce:016}");
    bytes[..16.min(size)].copy_from_slice(&tag.as_bytes()[..16.min(size)]);
    Bytes::from(bytes)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

async fn measure(store: Arc<dyn ObjectStore>, name: &str, run: &str) {
    for (kind, size, label) in [
        (Kind::Create, 1024, "create-only PUT 1 KiB"),
        (Kind::Replace, 1024, "If-Match PUT 1 KiB root"),
        (Kind::Create, 64 * 1024, "create-only PUT 64 KiB"),
        (Kind::Get, 1024, "GET 1 KiB"),
        (Kind::Get, 64 * 1024, "GET 64 KiB"),
    ] {
        for concurrency in [1_usize, 16] {
            let ops = if concurrency == 1 {
                OPS_PER_WORKER_C1
            } else {
                OPS_PER_WORKER_C16
            };
            let started = Instant::now();
            let tasks: Vec<_> = (0..concurrency)
                .map(|w| {
                    let prefix = format!("{run}/{label}/{concurrency}/{w}").replace(' ', "_");
                    tokio::spawn(worker(Arc::clone(&store), prefix, kind, size, ops))
                })
                .collect();
            let mut all = Vec::new();
            for task in tasks {
                all.extend(task.await.expect("worker"));
            }
            let wall = started.elapsed();
            all.sort();
            println!(
                "{name:<6} {label:<24} c={concurrency:<2} n={:<5} p50={:>8.3} ms  p99={:>8.3} ms  {:>8.0} ops/s",
                all.len(),
                percentile(&all, 0.50).as_secs_f64() * 1e3,
                percentile(&all, 0.99).as_secs_f64() * 1e3,
                all.len() as f64 / wall.as_secs_f64(),
            );
        }
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let run = format!("bench/floors-{:016x}", rand_run_id());
    let dir = tempfile_dir();
    let local: Arc<dyn ObjectStore> = Arc::new(LocalStore::open(&dir).expect("local store"));
    measure(local, "local", &run).await;
    let _ = std::fs::remove_dir_all(&dir);
    if std::env::var("CELLFLEET_S3_ENDPOINT").is_err() {
        println!(
            "s3: CELLFLEET_S3_ENDPOINT unset; run `eval \"$(scripts/seaweedfs.sh start)\"` first"
        );
        return;
    }
    let config = S3Config::from_env("cellfleet-bench");
    let s3 = S3Store::connect(&config).await.expect("s3 client");
    s3.create_bucket_if_missing().await.expect("bucket");
    measure(Arc::new(s3), "s3", &run).await;
}

fn rand_run_id() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
        ^ u64::from(std::process::id())
}

fn tempfile_dir() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("cellfleet-floors-{}", std::process::id()))
}
