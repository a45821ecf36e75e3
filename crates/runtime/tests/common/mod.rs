//! Shared test harness: a journal kind, nodes on a shared store, and the exact recovery check (acknowledged log vs recovered state).

#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cellfleet_authority::{Clock, LeaseConfig, ManualClock, NodeId};
use cellfleet_cell::{Command, Outcome, Typed};
use cellfleet_runtime::testkit::{journal_tags, Journal, JOURNAL};
use cellfleet_runtime::{Kinds, Node, NodeConfig, NodeHandle, PublicationMode};
use cellfleet_store::ObjectStore;
use serde_json::json;

pub const START_MS: u64 = 1_700_000_000_000;
pub const KIND: &str = JOURNAL;

pub fn kinds() -> Arc<Kinds> {
    Arc::new(Kinds::builtin().with(Arc::new(Typed(Journal))))
}

pub fn lease_config() -> LeaseConfig {
    LeaseConfig {
        lease_ms: 10_000,
        renew_every_ms: 3_000,
        drift_margin_ms: 500,
    }
}

pub fn node_config(name: &str, dir: &Path, prefix: &str) -> NodeConfig {
    let mut config = NodeConfig::new(NodeId::new(name).unwrap(), dir.join(name), prefix);
    config.lease = lease_config();
    config.endpoints.grpc = format!("https://{name}:7000");
    // Groups of warm Cells execute on their actors' tasks, as a release
    // build's do (a debug build's engine is slower than the default
    // budget), so every test here runs that path too.
    config.limits.inline_execute_us_max = 60_000_000;
    config
}

/// A node that publishes one root CAS per Cell group (the reference mode).
pub fn cell_node_config(name: &str, dir: &Path, prefix: &str) -> NodeConfig {
    let mut config = node_config(name, dir, prefix);
    config.publication = PublicationMode::Cell;
    config
}

pub async fn start(
    config: NodeConfig,
    store: Arc<dyn ObjectStore>,
    clock: Arc<dyn Clock>,
) -> NodeHandle {
    Node::start(config, store, clock, kinds())
        .await
        .expect("node starts")
}

pub fn manual_clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(START_MS))
}

/// The backends every multi-node test runs on: the local-directory store
/// and real SeaweedFS.
pub async fn backends(name: &str, dir: &Path) -> Vec<(&'static str, Arc<dyn ObjectStore>, String)> {
    cellfleet_store::testkit::local_and_s3(name, dir).await
}

pub fn command_id(n: u64) -> [u8; 16] {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&0x5eed_u64.to_be_bytes());
    id[8..].copy_from_slice(&n.to_be_bytes());
    id
}

pub fn append(clock: &dyn Clock, n: u64) -> Command {
    Command::new(
        command_id(n),
        "append",
        json!({ "tag": format!("t{n}") }),
        (clock.now_wall_ms() + 600_000) as i64,
    )
}

/// The exact recovery check over `n`-numbered journal appends.
#[derive(Debug, Default, Clone)]
pub struct AckLog(pub cellfleet_runtime::testkit::AckLog);

impl AckLog {
    pub fn ack(&self, n: u64, outcome: Outcome) {
        self.0.ack(command_id(n), format!("t{n}"), outcome);
    }

    pub fn not_committed(&self, n: u64) {
        self.0.not_committed(command_id(n), format!("t{n}"));
    }

    pub fn len(&self) -> usize {
        self.0.acked()
    }

    pub async fn verify(&self, node: &NodeHandle, key: &[u8]) {
        if let Err(difference) = self.0.verify(node, key).await {
            panic!("exact recovery check failed: {difference}");
        }
    }
}

pub async fn journal(node: &NodeHandle, key: &[u8]) -> Vec<String> {
    journal_tags(node, key).await.expect("journal query")
}

pub fn lease_expiry() -> Duration {
    let lease = lease_config();
    Duration::from_millis(lease.lease_ms + lease.drift_margin_ms + 1)
}

/// Sends `append(n)` for every `n` in `ns` to `key` at once (a task each)
/// and returns each `n` with its result, in the order of `ns`.
pub async fn execute_all(
    node: &NodeHandle,
    clock: &Arc<ManualClock>,
    key: &'static [u8],
    ns: impl IntoIterator<Item = u64>,
) -> Vec<(u64, cellfleet_runtime::Result<cellfleet_runtime::Executed>)> {
    let tasks: Vec<_> = ns
        .into_iter()
        .map(|n| {
            let (node, clock) = (node.clone(), clock.clone());
            tokio::spawn(
                async move { (n, node.execute(KIND, key, append(clock.as_ref(), n)).await) },
            )
        })
        .collect();
    let mut results = Vec::with_capacity(tasks.len());
    for task in tasks {
        results.push(task.await.expect("execute task"));
    }
    results
}

/// A node over a fault-injecting wrapper of `inner`, with command 0
/// executed on `key` and acknowledged in the returned log.
pub async fn start_with_first_command(
    config: NodeConfig,
    inner: Arc<dyn ObjectStore>,
    key: &[u8],
) -> (
    Arc<cellfleet_store::FaultStore>,
    Arc<ManualClock>,
    NodeHandle,
    AckLog,
) {
    let store = Arc::new(cellfleet_store::FaultStore::new(inner));
    let clock = manual_clock();
    let node = start(config, store.clone(), clock.clone()).await;
    let log = AckLog::default();
    let first = node
        .execute(KIND, key, append(clock.as_ref(), 0))
        .await
        .unwrap();
    log.ack(0, first.outcome);
    (store, clock, node, log)
}

/// Groups `node` has executed on its actors' tasks.
pub fn groups_inline(node: &NodeHandle) -> u64 {
    node.metrics()
        .groups_inline_total
        .load(std::sync::atomic::Ordering::Relaxed)
}

/// Queries `node` has answered on its actors' tasks.
pub fn queries_inline(node: &NodeHandle) -> u64 {
    node.metrics()
        .queries_inline_total
        .load(std::sync::atomic::Ordering::Relaxed)
}
