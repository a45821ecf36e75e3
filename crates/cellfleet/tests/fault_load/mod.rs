//! The fault matrix's workload and its check, shared by `store_faults.rs`
//! and `host_faults.rs`: clients of the Rust client library send new
//! exactly-once commands (a unique tag appended to one of a few `log`
//! Cells) back to back, each retried by the library with the same command
//! id; after the fault heals, every Cell of the scenario must serve a fresh
//! command again, and then every acknowledged command must be present
//! exactly once, read through every node, nothing the client was told
//! failed may be present, an unknown outcome at most once, and no Cell may
//! hold anything never sent.

// Each test binary uses part of it.
#![allow(dead_code)]

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cellfleet_client::{v1, Client, Command, Error, Executed, Outcome};

use crate::cluster_common::Cluster;

pub const WORKERS: usize = 4;
pub const CELLS: usize = 6;
/// How long the Cells have to serve a fresh command after healing.
const SERVE_AGAIN_BOUND: Duration = Duration::from_secs(90);

/// What the client was told of each command, by Cell and tag.
#[derive(Default)]
pub struct Told {
    acked: Vec<(String, String)>,
    refused: Vec<(String, String)>,
    unknown: Vec<(String, String)>,
    /// The first few refusals' messages, to say what the client saw.
    refusals_seen: Vec<String>,
    /// The last failure's message, whatever its kind.
    last_error: Option<String>,
    /// The codes of the refusals (failures with a Cellfleet error code).
    refused_codes: BTreeSet<v1::ErrorCode>,
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
                self.last_error = Some(format!("unknown outcome: {error}"));
                self.unknown.push((cell, tag));
                false
            }
            Err(error) => {
                self.last_error = Some(format!("failed: {error}"));
                if let Error::Refused { code, .. } = &error {
                    self.refused_codes.insert(*code);
                }
                if self.refusals_seen.len() < 3 {
                    self.refusals_seen.push(error.to_string());
                }
                self.refused.push((cell, tag));
                false
            }
        }
    }
}

pub fn append(cell: &str, tag: &str) -> Command {
    Command::new("log", cell, "append").args(serde_json::json!({ "tag": tag }))
}

/// A running workload over the Cells `{name}-0..{CELLS}`.
pub struct Load {
    name: String,
    client: Client,
    stop: Arc<AtomicBool>,
    told: Arc<Mutex<Told>>,
    sent: Arc<AtomicU64>,
    probes: u64,
    running: tokio::task::JoinHandle<()>,
}

/// What one scenario saw.
pub struct Summary {
    pub sent: u64,
    pub acked: usize,
    pub refused: usize,
    pub unknown: usize,
    pub unknown_applied: i64,
    pub served_again: Duration,
    pub refusals_seen: Vec<String>,
    /// The Cellfleet error codes of the failures (empty when every failure
    /// was a transport error, or none failed).
    pub refused_codes: BTreeSet<v1::ErrorCode>,
}

impl Summary {
    /// One line for RELIABILITY.md's table.
    pub fn line(&self, class: &str, name: &str) -> String {
        format!(
            "{class} {name}: {} commands, {} acknowledged, {} failed, {} unknown ({} of them applied), \
             0 lost, 0 duplicated; served again {} ms after healing{}",
            self.sent,
            self.acked,
            self.refused,
            self.unknown,
            self.unknown_applied,
            self.served_again.as_millis(),
            if self.refusals_seen.is_empty() {
                String::new()
            } else {
                format!("; failures seen: {:?}", self.refusals_seen)
            }
        )
    }
}

impl Load {
    /// Starts `WORKERS` clients of `client` on the scenario's Cells.
    pub fn start(client: Client, name: &str) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let told = Arc::new(Mutex::new(Told::default()));
        let sent = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for worker in 0..WORKERS {
            let (client, stop, told, sent) =
                (client.clone(), stop.clone(), told.clone(), sent.clone());
            let name = name.to_owned();
            tasks.push(tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let cell = format!("{name}-{}", (worker + n) % CELLS);
                    let tag = format!("w{worker}-{n}");
                    n += 1;
                    sent.fetch_add(1, Ordering::Relaxed);
                    let result = client.execute(&append(&cell, &tag)).await;
                    told.lock().unwrap().record(cell, tag, result);
                }
            }));
        }
        let running = tokio::spawn(async move {
            for task in tasks {
                task.await.unwrap();
            }
        });
        Load {
            name: name.to_owned(),
            client,
            stop,
            told,
            sent,
            probes: 0,
            running,
        }
    }

    /// After healing: the time until every Cell of the scenario has applied
    /// a fresh command again (each retried until it applies).
    pub async fn served_again(&mut self) -> Duration {
        let healed = Instant::now();
        for cell in 0..CELLS {
            let cell = format!("{}-{cell}", self.name);
            loop {
                let tag = format!("probe-{}", self.probes);
                self.probes += 1;
                let result = self.client.execute(&append(&cell, &tag)).await;
                if self.told.lock().unwrap().record(cell.clone(), tag, result) {
                    break;
                }
                assert!(
                    healed.elapsed() < SERVE_AGAIN_BOUND,
                    "{}: {cell} not served {SERVE_AGAIN_BOUND:?} after healing; the last answer: {:?}",
                    self.name,
                    self.told.lock().unwrap().last_error
                );
            }
        }
        healed.elapsed()
    }

    /// Stops the workload and checks exactness through every node of
    /// `cluster`.
    pub async fn finish(self, cluster: &Cluster, served_again: Duration) -> Summary {
        let name = self.name;
        self.stop.store(true, Ordering::Relaxed);
        self.running.await.unwrap();
        let told = std::mem::take(&mut *self.told.lock().unwrap());
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
                let known: HashSet<&str> = tags.iter().map(|(_, t)| *t).collect();
                for tag in counts.keys() {
                    assert!(
                        known.contains(tag.as_str()),
                        "{name}: {cell} holds {tag}, never sent"
                    );
                }
            }
        }
        assert!(!told.acked.is_empty(), "{name}: the workload ran");
        Summary {
            sent: self.sent.load(Ordering::Relaxed) + self.probes,
            acked: told.acked.len(),
            refused: told.refused.len(),
            unknown: told.unknown.len(),
            unknown_applied,
            served_again,
            refusals_seen: told.refusals_seen,
            refused_codes: told.refused_codes,
        }
    }
}
