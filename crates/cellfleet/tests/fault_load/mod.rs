//! The fault matrix's workload and its check, shared by `store_faults.rs`,
//! `host_faults.rs` and `crash_points.rs`: clients of the Rust client
//! library send new exactly-once commands (a unique tag appended to one of
//! a few `log` Cells) back to back, each retried by the library with the
//! same command id; beside them, idempotent Durable Streams producers
//! (`Producer-Id`, `-Epoch`, `-Seq`) append numbered messages to streams
//! over HTTP through any node, each append re-sent with the same sequence
//! number until a node acknowledges it. After the fault heals, every Cell
//! and every stream of the scenario must take a fresh write again; then
//! every acknowledged command must be present exactly once, read through
//! every node, nothing the client was told failed may be present, an
//! unknown outcome at most once, and no Cell may hold anything never sent;
//! and each stream, read whole through every node, must be exactly its
//! producer's acknowledged messages in order (plus, at most once, the one
//! still unanswered when the workload stopped).

// Each test binary uses part of it.
#![allow(dead_code)]

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use std::net::SocketAddr;

use bytes::Bytes;
use cellfleet_client::{v1, Client, Command, Error, Executed, Outcome};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

use crate::cluster_common::Cluster;

pub const WORKERS: usize = 4;
pub const CELLS: usize = 6;
/// Durable Streams producers, one stream each.
pub const STREAMS: usize = 2;
/// Longest one HTTP exchange with a node may take.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);
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
    /// The node that last served each Cell.
    owners: HashMap<String, String>,
    /// Commands applied, by the node that served them.
    served: HashMap<String, u64>,
}

impl Told {
    /// Files `result` of command `tag` on `cell` under what the client was
    /// told; true when it applied.
    fn record(&mut self, cell: String, tag: String, result: Result<Executed, Error>) -> bool {
        match result {
            Ok(executed) => match executed.outcome {
                Outcome::Applied(_) => {
                    *self.served.entry(executed.served_by.clone()).or_default() += 1;
                    self.owners.insert(cell.clone(), executed.served_by);
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

/// Whether a row of the fault matrix runs. By default only the fast
/// subset CI runs (`in_subset`: about one row per class of fault);
/// `CELLFLEET_FAULT_MATRIX=full` runs every row, and
/// `CELLFLEET_FAULT_ROWS=text` only the rows whose name contains `text`.
/// A row left out says so.
pub fn runs(name: &str, in_subset: bool) -> bool {
    let run = match std::env::var("CELLFLEET_FAULT_ROWS") {
        Ok(only) => name.contains(&only),
        Err(_) => in_subset || std::env::var("CELLFLEET_FAULT_MATRIX").as_deref() == Ok("full"),
    };
    if !run {
        println!(
            "NOT RUN {name}: outside the fast subset (CELLFLEET_FAULT_MATRIX=full runs every row)"
        );
    }
    run
}

/// The Cells of the load named `name`, as (what the test calls it, its Cell
/// id): the `log` Cells and the streams (kind `stream`, keyed by path; both
/// spellings of the path, with and without its slash, are listed).
pub fn cells(name: &str) -> Vec<(String, String)> {
    let id = |kind: &str, key: &str| {
        cellfleet_authority::CellId::for_kind_key(kind, key.as_bytes()).to_string()
    };
    let mut cells: Vec<(String, String)> = (0..CELLS)
        .map(|i| format!("{name}-{i}"))
        .map(|key| (format!("log {key}"), id("log", &key)))
        .collect();
    for k in 0..STREAMS {
        let path = format!("/{name}-s{k}");
        cells.push((format!("stream {path}"), id("stream", &path)));
        cells.push((format!("stream {path}"), id("stream", &path[1..])));
    }
    cells
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
    producers: Vec<Arc<Producer>>,
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
    /// Stream appends acknowledged, over every producer.
    pub appends: u64,
}

impl Summary {
    /// One line for RELIABILITY.md's table.
    pub fn line(&self, class: &str, name: &str) -> String {
        format!(
            "{class} {name}: {} commands, {} acknowledged, {} failed, {} unknown ({} of them applied), \
             {} stream appends acknowledged, 0 lost, 0 duplicated; served again {} ms after healing{}",
            self.sent,
            self.acked,
            self.refused,
            self.unknown,
            self.unknown_applied,
            self.appends,
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
    /// Starts `WORKERS` clients of the library on the scenario's Cells
    /// and `STREAMS` producers, each on a stream of its own, through every
    /// node of `cluster`.
    pub fn start(cluster: &Cluster, name: &str) -> Load {
        let client = cluster.library_client();
        let streams: Vec<SocketAddr> = cluster
            .nodes
            .iter()
            .map(|node| node.streams.expect("the nodes serve Durable Streams"))
            .collect();
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
        let producers: Vec<Arc<Producer>> = (0..STREAMS)
            .map(|k| {
                Arc::new(Producer {
                    path: format!("/{name}-s{k}"),
                    id: format!("{name}-p{k}"),
                    k,
                    nodes: streams.clone(),
                    acked: AtomicU64::new(0),
                    pending: AtomicBool::new(false),
                })
            })
            .collect();
        for producer in &producers {
            let (producer, stop) = (producer.clone(), stop.clone());
            tasks.push(tokio::spawn(async move { producer.run(&stop).await }));
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
            producers,
            running,
        }
    }

    /// The node that last served Cell `index` of the scenario, once one has.
    pub fn owner(&self, index: usize) -> Option<String> {
        let cell = format!("{}-{index}", self.name);
        self.told.lock().unwrap().owners.get(&cell).cloned()
    }

    /// The node that last served the load's first Cell (so it owns one of
    /// the load's Cells): its id and its index in `cluster`.
    pub fn first_owner(&self, cluster: &Cluster) -> (String, usize) {
        let owner = self
            .owner(0)
            .unwrap_or_else(|| panic!("{}: the load's first Cell served nothing", self.name));
        let index = cluster
            .nodes
            .iter()
            .position(|node| node.id == owner)
            .expect("the owner is a node");
        (owner, index)
    }

    /// How many of the load's commands node `id` has served so far.
    pub fn served_by(&self, id: &str) -> u64 {
        self.told
            .lock()
            .unwrap()
            .served
            .get(id)
            .copied()
            .unwrap_or(0)
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
        // Every stream acknowledges an append sent after healing (one
        // past the one that may have been in flight then).
        for producer in &self.producers {
            let fresh = producer.acked.load(Ordering::SeqCst) + 2;
            while producer.acked.load(Ordering::SeqCst) < fresh {
                assert!(
                    healed.elapsed() < SERVE_AGAIN_BOUND,
                    "{}: stream {} took no append {SERVE_AGAIN_BOUND:?} after healing",
                    self.name,
                    producer.path
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
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
        let mut appends = 0;
        for producer in &self.producers {
            appends += producer.check(cluster, &name).await;
        }
        Summary {
            sent: self.sent.load(Ordering::Relaxed) + self.probes,
            acked: told.acked.len(),
            refused: told.refused.len(),
            unknown: told.unknown.len(),
            unknown_applied,
            served_again,
            refusals_seen: told.refusals_seen,
            refused_codes: told.refused_codes,
            appends,
        }
    }
}

/// One idempotent producer of the Durable Streams protocol on a stream of
/// its own: message `seq` is `p{k}-{seq:06};`, sent with `Producer-Seq:
/// seq` and re-sent (to the next node on a failure) until a node
/// acknowledges it, so the stream must hold messages 0..acked in order.
pub struct Producer {
    path: String,
    id: String,
    k: usize,
    nodes: Vec<SocketAddr>,
    /// Messages acknowledged: 0..acked.
    acked: AtomicU64,
    /// Message `acked` was sent and is unanswered (the workload stopped).
    pending: AtomicBool,
}

/// One HTTP/1.1 exchange with a node's Durable Streams listener; why it
/// has no answer, otherwise (a producer re-sends the same bytes either
/// way, so whether the request left does not matter).
async fn http(
    node: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: Bytes,
) -> Result<(u16, hyper::HeaderMap, Bytes), String> {
    let exchange = async {
        let tcp = tokio::net::TcpStream::connect(node)
            .await
            .map_err(|e| e.to_string())?;
        let lost = |e: hyper::Error| e.to_string();
        let (mut send, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(lost)?;
        tokio::spawn(connection);
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", node.to_string());
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        let request = request.body(Full::new(body)).expect("a valid request");
        let reply = send.send_request(request).await.map_err(lost)?;
        let (parts, body) = reply.into_parts();
        let body = body.collect().await.map_err(lost)?.to_bytes();
        Ok((parts.status.as_u16(), parts.headers, body))
    };
    tokio::time::timeout(HTTP_TIMEOUT, exchange)
        .await
        .unwrap_or_else(|_| Err("no answer within 10 s".into()))
}

impl Producer {
    fn message(&self, seq: u64) -> String {
        format!("p{}-{seq:06};", self.k)
    }

    /// Creates the stream, then appends until `stop`.
    async fn run(&self, stop: &AtomicBool) {
        let text = [("content-type", "text/plain".to_owned())];
        let mut attempt = 0;
        loop {
            let node = self.nodes[(self.k + attempt) % self.nodes.len()];
            attempt += 1;
            match http(node, "PUT", &self.path, &text, Bytes::new()).await {
                Ok((201 | 200, _, _)) => break,
                Ok((status, _, body)) if status < 500 => {
                    panic!("creating {}: {status} {body:?}", self.path)
                }
                _ if stop.load(Ordering::Relaxed) => return,
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        let mut seq = 0;
        while !stop.load(Ordering::Relaxed) {
            let headers = [
                ("content-type", "text/plain".to_owned()),
                ("producer-id", self.id.clone()),
                ("producer-epoch", "0".to_owned()),
                ("producer-seq", seq.to_string()),
            ];
            let body = Bytes::from(self.message(seq));
            self.pending.store(true, Ordering::SeqCst);
            loop {
                let node = self.nodes[(self.k + attempt) % self.nodes.len()];
                match http(node, "POST", &self.path, &headers, body.clone()).await {
                    // Appended, or a duplicate of an earlier attempt that applied.
                    Ok((200 | 204, _, _)) => break,
                    // A gap or a refusal: an acknowledged append is
                    // missing, or the protocol was broken.
                    Ok((status, headers, body)) if status < 500 => panic!(
                        "{}: append {seq} refused {status} {headers:?} {body:?}",
                        self.path
                    ),
                    // Unavailable, or unanswered: the same bytes again,
                    // through the next node.
                    _ => {
                        attempt += 1;
                        if stop.load(Ordering::Relaxed) {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
            self.pending.store(false, Ordering::SeqCst);
            seq += 1;
            self.acked.store(seq, Ordering::SeqCst);
        }
    }

    /// Reads the stream whole through every node and checks it is exactly
    /// the acknowledged messages in order, plus at most the pending one;
    /// returns how many were acknowledged.
    async fn check(&self, cluster: &Cluster, scenario: &str) -> u64 {
        let acked = self.acked.load(Ordering::SeqCst);
        let mut expected: String = (0..acked).map(|seq| self.message(seq)).collect();
        let with_pending = format!("{expected}{}", self.message(acked));
        for node in &cluster.nodes {
            let node_address = node.streams.expect("the nodes serve Durable Streams");
            let data = read_stream(node_address, &self.path).await;
            let data = String::from_utf8(data).expect("utf-8 messages");
            let pending = self.pending.load(Ordering::SeqCst);
            if data != expected && !(pending && data == with_pending) {
                let torn = data.len() % 10;
                panic!(
                    "{scenario}: stream {} via {} holds {} messages (torn: {torn} bytes), \
                     {acked} acknowledged{}; the first difference at byte {}",
                    self.path,
                    node.id,
                    data.len() / 10,
                    if pending { " and one pending" } else { "" },
                    data.bytes()
                        .zip(expected.bytes())
                        .position(|(a, b)| a != b)
                        .unwrap_or(data.len().min(expected.len()))
                );
            }
            if data == with_pending {
                expected = with_pending.clone();
            }
        }
        acked
    }
}

/// Reads the stream at `path` whole through `node` (catch-up pages),
/// retrying failed answers for a bounded time.
async fn read_stream(node: SocketAddr, path: &str) -> Vec<u8> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut data = Vec::new();
    let mut offset = "-1".to_owned();
    loop {
        match http(
            node,
            "GET",
            &format!("{path}?offset={offset}"),
            &[],
            Bytes::new(),
        )
        .await
        {
            Ok((200, headers, body)) => {
                data.extend_from_slice(&body);
                let next = headers
                    .get("stream-next-offset")
                    .and_then(|v| v.to_str().ok())
                    .expect("Stream-Next-Offset")
                    .to_owned();
                if headers
                    .get("stream-up-to-date")
                    .is_some_and(|v| v == "true")
                {
                    return data;
                }
                offset = next;
            }
            other => {
                assert!(
                    Instant::now() < deadline,
                    "reading {path} via {node}: {other:?}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}
