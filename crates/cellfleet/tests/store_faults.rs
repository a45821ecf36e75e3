//! The store misbehaving under load, with real node processes: three
//! nodes whose S3 endpoint is a fault proxy in front of SeaweedFS
//! (`fault_proxy`), a workload of exactly-once commands through the client
//! library, and one fault at a time for a few seconds — the store slow,
//! answering 503, answering 500, applying writes but dropping their replies,
//! and down (for 3 s, and for 8 s: past the nodes' 5 s lease). After each: every acknowledged command is present exactly
//! once, nothing the client was told failed is present, an unknown outcome
//! is present at most once, and the time from healing until a command is
//! served again is printed (RELIABILITY.md keeps the figures; timings are
//! never asserted).

mod cluster_common;
mod fault_proxy;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cellfleet_client::{Client, Command, Error, Executed, Outcome};
use cluster_common::{Cluster, Store};
use fault_proxy::{Fault, FaultProxy};

const WORKERS: usize = 4;
const CELLS: usize = 6;
const BEFORE: Duration = Duration::from_millis(1_500);
/// How long a fault lasts: a few seconds, within the nodes' 5 s lease.
const DURING: Duration = Duration::from_secs(3);
/// The store down for longer than a lease: every node's lease lapses.
const PAST_THE_LEASE: Duration = Duration::from_secs(8);
const AFTER: Duration = Duration::from_secs(2);

/// What the client was told of each command, by Cell and tag.
#[derive(Default)]
struct Told {
    acked: Vec<(String, String)>,
    refused: Vec<(String, String)>,
    unknown: Vec<(String, String)>,
}

impl Told {
    /// Files `result` of command `tag` on `cell` under what the client was
    /// told; true when it applied.
    fn record(&mut self, cell: String, tag: String, result: Result<Executed, Error>) -> bool {
        match result {
            Ok(executed) => match executed.outcome {
                Outcome::Applied(_) => {
                    self.acked.push((cell, tag));
                    true
                }
                Outcome::Rejected(why) => panic!("{cell} {tag} rejected: {why:?}"),
            },
            Err(error) if error.maybe_applied() => {
                self.unknown.push((cell, tag));
                false
            }
            Err(_) => {
                self.refused.push((cell, tag));
                false
            }
        }
    }
}

fn append(cell: &str, tag: &str) -> Command {
    Command::new("log", cell, "append").args(serde_json::json!({ "tag": tag }))
}

/// Runs the workload until `stop`: each worker sends new commands to the
/// scenario's Cells in turn, each retried by the library (same id) until it
/// has a definite outcome or an unknown one.
async fn workload(
    client: Client,
    scenario: &'static str,
    stop: Arc<AtomicBool>,
    told: Arc<Mutex<Told>>,
    sent: Arc<AtomicU64>,
) {
    let mut tasks = Vec::new();
    for worker in 0..WORKERS {
        let (client, stop, told, sent) = (client.clone(), stop.clone(), told.clone(), sent.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let cell = format!("{scenario}-{}", (worker + n) % CELLS);
                let tag = format!("w{worker}-{n}");
                n += 1;
                sent.fetch_add(1, Ordering::Relaxed);
                let result = client.execute(&append(&cell, &tag)).await;
                told.lock().unwrap().record(cell, tag, result);
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

/// One scenario: the workload before, during and after `fault`; the
/// exactness check; a summary line.
async fn scenario(
    cluster: &Cluster,
    proxy: &FaultProxy,
    name: &'static str,
    fault: Fault,
    during: Duration,
) -> String {
    let client = cluster.library_client();
    let stop = Arc::new(AtomicBool::new(false));
    let told = Arc::new(Mutex::new(Told::default()));
    let sent = Arc::new(AtomicU64::new(0));
    let running = tokio::spawn(workload(
        client.clone(),
        name,
        stop.clone(),
        told.clone(),
        sent.clone(),
    ));
    tokio::time::sleep(BEFORE).await;
    proxy.set(fault);
    tokio::time::sleep(during).await;
    proxy.set(Fault::None);
    // How long until a fresh command is served again.
    let healed = Instant::now();
    let mut probe = 0;
    loop {
        let tag = format!("probe-{probe}");
        probe += 1;
        let cell = format!("{name}-probe");
        let result = client.execute(&append(&cell, &tag)).await;
        if told.lock().unwrap().record(cell, tag, result) {
            break;
        }
        assert!(
            healed.elapsed() < Duration::from_secs(60),
            "{name}: not served 60 s after healing"
        );
    }
    let served_again = healed.elapsed();
    tokio::time::sleep(AFTER).await;
    stop.store(true, Ordering::Relaxed);
    running.await.unwrap();

    // Exactness, read through every node.
    let told = std::mem::take(&mut *told.lock().unwrap());
    let mut by_cell: HashMap<String, Vec<(&str, &str)>> = HashMap::new();
    for (set, list) in [
        ("acked", &told.acked),
        ("refused", &told.refused),
        ("unknown", &told.unknown),
    ] {
        for (cell, tag) in list {
            by_cell.entry(cell.clone()).or_default().push((set, tag));
        }
    }
    let mut checker = cluster.client("dev");
    let mut unknown_applied = 0;
    for node in &cluster.nodes {
        unknown_applied = 0;
        for (cell, tags) in &by_cell {
            let counts = checker.log_counts(node.client, cell).await;
            for (set, tag) in tags {
                let n = counts.get(*tag).copied().unwrap_or(0);
                match *set {
                    "acked" => assert_eq!(
                        n, 1,
                        "{name}: acknowledged {cell} {tag} present {n} times (via {})",
                        node.id
                    ),
                    "refused" => assert_eq!(
                        n, 0,
                        "{name}: failed {cell} {tag} present {n} times (via {})",
                        node.id
                    ),
                    _ => {
                        assert!(
                            n <= 1,
                            "{name}: unknown {cell} {tag} present {n} times (via {})",
                            node.id
                        );
                        unknown_applied += n;
                    }
                }
            }
            let known: std::collections::HashSet<&str> = tags.iter().map(|(_, t)| *t).collect();
            for tag in counts.keys() {
                assert!(
                    known.contains(tag.as_str()),
                    "{name}: {cell} holds {tag}, never sent"
                );
            }
        }
    }
    assert!(!told.acked.is_empty(), "{name}: the workload ran");
    format!(
        "store fault {name}: {} commands, {} acknowledged, {} failed, {} unknown ({unknown_applied} of them applied), \
         0 lost, 0 duplicated; served again {} ms after healing",
        sent.load(Ordering::Relaxed) + probe,
        told.acked.len(),
        told.refused.len(),
        told.unknown.len(),
        served_again.as_millis()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_acknowledged_is_lost_or_doubled_when_the_store_misbehaves() {
    let upstream = cellfleet_store::testkit::s3_config(cellfleet_store::testkit::TEST_BUCKET);
    cellfleet_store::testkit::s3_store().await; // the bucket exists
    let endpoint = upstream
        .endpoint
        .clone()
        .expect("the test server's endpoint");
    let upstream_address: std::net::SocketAddr = endpoint
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .expect("the test server listens on an IP address");
    let proxy = FaultProxy::start(upstream_address).await;
    let url = proxy.url();
    let cluster = Cluster::start_with_env(
        3,
        Store::S3 {
            prefix: cellfleet_store::testkit::unique_prefix("store-faults"),
        },
        5_000,
        &[("CELLFLEET_S3_ENDPOINT", url.as_str())],
    );
    let mut lines = Vec::new();
    for (name, fault, during) in [
        (
            "slow-300ms",
            Fault::Slow(Duration::from_millis(300)),
            DURING,
        ),
        ("503", Fault::Status(503), DURING),
        ("500", Fault::Status(500), DURING),
        ("write-replies-dropped", Fault::DropWriteReplies, DURING),
        ("down", Fault::Down, DURING),
        ("down-past-the-lease", Fault::Down, PAST_THE_LEASE),
    ] {
        lines.push(scenario(&cluster, &proxy, name, fault, during).await);
        println!("{}", lines.last().unwrap());
    }
    // Errors are typed end to end: a client that never reaches a node gets
    // no unknown outcome for it (a sanity check of the classification).
    let nowhere = Client::builder(["127.0.0.1:1"])
        .tls(
            cellfleet_client::tls::client_config_from_files(
                &cluster.path("certs/ca.pem"),
                &cluster.path("certs/client-dev.pem"),
                &cluster.path("certs/client-dev.key"),
            )
            .unwrap(),
        )
        .signer(
            "dev",
            cellfleet_client::signing::read_signing_key(&cluster.path("dev.ed25519.pem")).unwrap(),
        )
        .build()
        .unwrap();
    let error = nowhere.execute(&append("x", "y")).await.unwrap_err();
    assert!(
        matches!(error, Error::Transport { .. }) && !error.maybe_applied(),
        "{error}"
    );
}
