//! Test harness: a cluster of real `cellfleet node` processes on loopback (files written by `cellfleet dev --no-start`), and a signing gRPC client with retries.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cellfleet_proto::v1;
use cellfleet_router::signing::read_signing_key;
use cellfleet_router::tls::{self, TlsIdentity};
use tonic::transport::Channel;

pub const BIN: &str = env!("CARGO_BIN_EXE_cellfleet");
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Which store the nodes share.
pub enum Store {
    Local,
    S3 { prefix: String },
}

pub struct NodeProcess {
    pub id: String,
    pub child: Child,
    pub client: SocketAddr,
    pub peer: SocketAddr,
    /// The plain HTTP listener (`/metrics`, `/healthz`, `/readyz`).
    pub http: SocketAddr,
    /// The Durable Streams HTTP listener, when the node serves one.
    pub streams: Option<SocketAddr>,
    /// The web console, when the node serves one.
    pub console: Option<SocketAddr>,
}

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub nodes: Vec<NodeProcess>,
    env: Vec<(String, String)>,
    setups: HashMap<String, NodeSetup>,
}

/// How one node's process starts, beyond the cluster's settings (the
/// fault matrix runs one node in a network namespace, or under a skewed
/// clock).
#[derive(Clone, Debug, Default)]
pub struct NodeSetup {
    /// More environment for this node only.
    pub env: Vec<(String, String)>,
    /// A command the node runs under (`ip netns exec NS`, say); it must
    /// exec the node, so the child's pid is the node's.
    pub wrapper: Vec<String>,
}

fn run_ok(args: &[&str]) {
    let output = Command::new(BIN)
        .args(args)
        .output()
        .expect("run cellfleet");
    assert!(
        output.status.success(),
        "cellfleet {args:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

impl Cluster {
    pub fn start(nodes: usize, store: Store, lease_ms: u64) -> Cluster {
        Self::start_with_env(nodes, store, lease_ms, &[])
    }

    /// As [`Cluster::start`], with more `CELLFLEET_*` settings for every node.
    pub fn start_with_env(
        nodes: usize,
        store: Store,
        lease_ms: u64,
        extra: &[(&str, &str)],
    ) -> Cluster {
        Self::start_with_setup(nodes, store, lease_ms, extra, |_| HashMap::new())
    }

    /// As [`Cluster::start_with_env`]; `prepare` runs on the cluster's
    /// directory once its files are written and before any node starts,
    /// and says how each node id (`n1`...) starts.
    pub fn start_with_setup(
        nodes: usize,
        store: Store,
        lease_ms: u64,
        extra: &[(&str, &str)],
        prepare: impl FnOnce(&Path) -> HashMap<String, NodeSetup>,
    ) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().to_str().expect("utf-8 path").to_owned();
        let nodes_text = nodes.to_string();
        let lease_text = lease_ms.to_string();
        run_ok(&[
            "dev",
            "--no-start",
            "--data",
            &data,
            "--nodes",
            &nodes_text,
            "--lease-ms",
            &lease_text,
        ]);
        // A second key that may only read kv (for the authorization test).
        run_ok(&[
            "keys",
            "new",
            "limited",
            "--kinds",
            "kv",
            "--ops",
            "get",
            "--registry",
            &format!("{data}/keys.toml"),
            "--out",
            &format!("{data}/limited.ed25519.pem"),
        ]);
        let mut env = vec![
            (
                "CELLFLEET_LISTEN_CLIENT".to_owned(),
                "127.0.0.1:0".to_owned(),
            ),
            ("CELLFLEET_LISTEN_PEER".to_owned(), "127.0.0.1:0".to_owned()),
            ("CELLFLEET_LISTEN_HTTP".to_owned(), "127.0.0.1:0".to_owned()),
            // dev's configs give the streams listener a fixed port; tests
            // run in parallel, so they take kernel-chosen ports for it too.
            (
                "CELLFLEET_LISTEN_STREAMS".to_owned(),
                "127.0.0.1:0".to_owned(),
            ),
            (
                "CELLFLEET_LISTEN_CONSOLE".to_owned(),
                "127.0.0.1:0".to_owned(),
            ),
        ];
        if let Store::S3 { prefix } = &store {
            let config = cellfleet_store::testkit::s3_config(cellfleet_store::testkit::TEST_BUCKET);
            // Creates the test bucket if missing (on its own thread: tests
            // call this from inside their runtime).
            std::thread::spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime")
                    .block_on(cellfleet_store::testkit::s3_store());
            })
            .join()
            .expect("test bucket");
            env.push(("CELLFLEET_PREFIX".into(), prefix.clone()));
            env.push(("CELLFLEET_S3_BUCKET".into(), config.bucket.clone()));
            for (name, value) in [
                ("CELLFLEET_S3_ENDPOINT", config.endpoint),
                ("CELLFLEET_S3_REGION", config.region),
                ("CELLFLEET_S3_ACCESS_KEY", config.access_key),
                ("CELLFLEET_S3_SECRET_KEY", config.secret_key),
            ] {
                env.push((name.into(), value.unwrap_or_default()));
            }
            env.push(("CELLFLEET_S3_PATH_STYLE".into(), "true".into()));
        }
        env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let setups = prepare(dir.path());
        let mut cluster = Cluster {
            dir,
            nodes: Vec::new(),
            env,
            setups,
        };
        for i in 1..=nodes {
            let node = cluster.spawn(&format!("n{i}"));
            cluster.nodes.push(node);
        }
        cluster
    }

    /// A Cell of `owners` (Cell → owner id) owned by another node than
    /// node `ingress`: (the Cell, its owner, the owner's index).
    pub fn owned_elsewhere(
        &self,
        owners: &HashMap<String, String>,
        ingress: usize,
    ) -> (String, String, usize) {
        let (cell, owner) = owners
            .iter()
            .find(|(_, owner)| owner.as_str() != self.nodes[ingress].id)
            .map(|(cell, owner)| (cell.clone(), owner.clone()))
            .expect("some cell is owned by a node other than the ingress");
        let index = self
            .nodes
            .iter()
            .position(|node| node.id == owner)
            .expect("the owner is a node");
        (cell, owner, index)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn spawn(&self, id: &str) -> NodeProcess {
        let config = self.path(&format!("{id}.toml"));
        let mut command = match self.setups.get(id) {
            Some(setup) if !setup.wrapper.is_empty() => {
                let mut command = Command::new(&setup.wrapper[0]);
                command
                    .args(&setup.wrapper[1..])
                    .arg(BIN)
                    .arg("node")
                    .arg("--config")
                    .arg(&config)
                    .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
                command
            }
            _ => self.node_command(&config, &[]),
        };
        if let Some(setup) = self.setups.get(id) {
            command.envs(setup.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        }
        let child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn cellfleet node");
        self.wait_ready(id, child)
    }

    /// `cellfleet node --config CONFIG ARGS` with the cluster's environment.
    pub fn node_command(&self, config: &Path, args: &[&str]) -> Command {
        let mut command = Command::new(BIN);
        command
            .arg("node")
            .arg("--config")
            .arg(config)
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        command
    }

    /// Waits for a spawned node's (piped stdout) ready line.
    pub fn wait_ready(&self, id: &str, mut child: Child) -> NodeProcess {
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut streams = None;
        let mut console = None;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            // On failure, say whether it exited (and how) or hung; its
            // stderr, above in the test's output, says why.
            let line = match rx.recv_timeout(left) {
                Ok(line) => line,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = child.wait();
                    panic!(
                        "node {id} exited before its ready line ({status:?}); lines seen: {seen:?}"
                    );
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "node {id} did not print its ready line within {READY_TIMEOUT:?}; lines seen: {seen:?}"
                    );
                }
            };
            seen.push(line.clone());
            let field = |name: &str| -> Option<SocketAddr> {
                line.split(name)
                    .nth(1)?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            };
            if let Some(address) = field(" streams=http://").or_else(|| field(" streams=https://"))
            {
                streams = Some(address);
            }
            let console_field = |scheme: &str| -> Option<SocketAddr> {
                line.split(&format!(" console={scheme}://"))
                    .nth(1)?
                    .split('/')
                    .next()?
                    .parse()
                    .ok()
            };
            if let Some(address) = console_field("http").or_else(|| console_field("https")) {
                console = Some(address);
            }
            if let Some(client) = field(" client=") {
                return NodeProcess {
                    id: id.to_owned(),
                    child,
                    client,
                    peer: field(" peer=").expect("peer address in the ready line"),
                    http: field(" http=").expect("http address in the ready line"),
                    streams,
                    console,
                };
            }
        }
    }

    /// SIGTERM, then wait (bounded) for a clean exit.
    pub fn terminate(&mut self, index: usize) -> bool {
        self.terminate_code(index) == Some(0)
    }

    /// SIGTERM, then wait (bounded) for the exit: its status code (none
    /// when it did not exit within 60 s, and was killed, or died of a
    /// signal).
    pub fn terminate_code(&mut self, index: usize) -> Option<i32> {
        let pid = self.nodes[index].child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = self.nodes[index].child.try_wait() {
                return status.code();
            }
            if Instant::now() > deadline {
                let _ = self.nodes[index].child.kill();
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends `signal` (`STOP`, `CONT`, ...) to node `index`.
    pub fn signal(&self, index: usize, signal: &str) {
        let pid = self.nodes[index].child.id().to_string();
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {pid} failed");
    }

    /// Starts node `index` again (after [`Cluster::terminate`] or
    /// [`Cluster::kill9`]), with `setup` from now on (the default: as the
    /// rest of the cluster).
    pub fn respawn(&mut self, index: usize, setup: NodeSetup) {
        let id = self.nodes[index].id.clone();
        self.setups.insert(id.clone(), setup);
        self.nodes[index] = self.spawn(&id);
    }

    pub fn kill9(&mut self, index: usize) {
        let _ = self.nodes[index].child.kill();
        let _ = self.nodes[index].child.wait();
    }

    pub fn client(&self, key_id: &str) -> TestClient {
        let identity = TlsIdentity::load(
            &self.path("certs/ca.pem"),
            &self.path("certs/client-dev.pem"),
            &self.path("certs/client-dev.key"),
        )
        .expect("client identity");
        let key_file = if key_id == "dev" {
            self.path("dev.ed25519.pem")
        } else {
            self.path(&format!("{key_id}.ed25519.pem"))
        };
        TestClient::new(
            self.nodes.iter().map(|n| n.client.to_string()).collect(),
            tls::client_config(&identity).expect("tls"),
            key_id,
            read_signing_key(&key_file).expect("signing key"),
        )
    }

    /// Writes a client config (`client.toml` format) naming every node's
    /// client endpoint and the `dev` key, as `name` in the cluster's
    /// directory; returns its path.
    pub fn write_client_config(&self, name: &str) -> PathBuf {
        let endpoints: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("\"{}\"", n.client))
            .collect();
        let path = self.path(name);
        std::fs::write(
            &path,
            format!(
                "endpoints = [{}]\nca = \"certs/ca.pem\"\ncert = \"certs/client-dev.pem\"\n\
                 key = \"certs/client-dev.key\"\nsigning_key = \"dev.ed25519.pem\"\nkey_id = \"dev\"\n",
                endpoints.join(", ")
            ),
        )
        .expect("write the client config");
        path
    }

    /// The client library configured for this cluster (every node, the
    /// `dev` key), as an application would use it.
    pub fn library_client(&self) -> cellfleet_client::Client {
        self.client("dev").inner
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            let _ = node.child.kill();
            let _ = node.child.wait();
        }
    }
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as i64
}

pub fn error_code(status: &tonic::Status) -> Option<v1::ErrorCode> {
    cellfleet_client::Error::from_status(status).code()
}

/// Low-level calls for tests that must pick the node, the id or the
/// envelope: built on the client library's sealing and channels.
pub struct TestClient {
    pub inner: cellfleet_client::Client,
    pub key: Arc<ed25519_dalek::SigningKey>,
    pub key_id: String,
    endpoints: Vec<String>,
}

impl TestClient {
    fn new(
        endpoints: Vec<String>,
        tls: Arc<rustls::ClientConfig>,
        key_id: &str,
        key: ed25519_dalek::SigningKey,
    ) -> TestClient {
        let inner = cellfleet_client::Client::builder(endpoints.clone())
            .tls(tls)
            .signer(key_id, key.clone())
            .build()
            .expect("client");
        TestClient {
            inner,
            key: Arc::new(key),
            key_id: key_id.to_owned(),
            endpoints,
        }
    }

    /// The same client with another TLS configuration.
    pub fn with_tls(self, tls: Arc<rustls::ClientConfig>) -> TestClient {
        TestClient::new(self.endpoints, tls, &self.key_id, (*self.key).clone())
    }

    pub fn channel(&mut self, addr: SocketAddr) -> Channel {
        self.inner.channel(&addr.to_string()).expect("channel")
    }

    pub fn command(
        &self,
        kind: &str,
        key: &str,
        command: &str,
        args: serde_json::Value,
        id: [u8; 16],
    ) -> v1::ExecuteRequest {
        let now = now_ms();
        let command = cellfleet_client::Command::new(kind, key, command)
            .args(args)
            .id(cellfleet_client::CommandId(id));
        self.inner
            .seal_command(&command, now, now + 120_000)
            .expect("seal")
    }

    pub async fn execute(
        &mut self,
        addr: SocketAddr,
        request: v1::ExecuteRequest,
    ) -> Result<v1::ExecuteResponse, tonic::Status> {
        self.inner
            .execute_on(&addr.to_string(), request, Duration::from_secs(30))
            .await
    }

    pub async fn query(
        &mut self,
        addr: SocketAddr,
        kind: &str,
        key: &str,
        name: &str,
        args: serde_json::Value,
    ) -> Result<v1::QueryResponse, tonic::Status> {
        self.query_after(addr, kind, key, name, args, None).await
    }

    /// A query that must read a state at least as new as `min_receipt`.
    pub async fn query_after(
        &mut self,
        addr: SocketAddr,
        kind: &str,
        key: &str,
        name: &str,
        args: serde_json::Value,
        min_receipt: Option<v1::Receipt>,
    ) -> Result<v1::QueryResponse, tonic::Status> {
        let mut query = cellfleet_client::Query::new(kind, key, name).args(args);
        query.min_receipt = min_receipt;
        let request = self.inner.seal_query(&query).expect("seal");
        self.inner
            .query_on(&addr.to_string(), request, Duration::from_secs(30))
            .await
    }

    pub async fn resolve(
        &mut self,
        addr: SocketAddr,
        kind: &str,
        key: &str,
        id: [u8; 16],
    ) -> Result<v1::ResolveResponse, tonic::Status> {
        self.resolve_expiring(addr, kind, key, id, 0).await
    }

    /// A resolve that names the command's own expiry (0: unknown).
    pub async fn resolve_expiring(
        &mut self,
        addr: SocketAddr,
        kind: &str,
        key: &str,
        id: [u8; 16],
        command_expires_at_ms: i64,
    ) -> Result<v1::ResolveResponse, tonic::Status> {
        let request = self.inner.seal_resolve(
            kind,
            key.as_bytes(),
            cellfleet_client::CommandId(id),
            command_expires_at_ms,
        );
        self.inner
            .resolve_on(&addr.to_string(), request, Duration::from_secs(30))
            .await
    }

    /// Per-tag counts of a `log` Cell, read through `addr`, retrying
    /// retry-safe failures for a bounded time.
    pub async fn log_counts(&mut self, addr: SocketAddr, key: &str) -> HashMap<String, i64> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self
                .query(addr, "log", key, "count", serde_json::json!({}))
                .await
            {
                Ok(response) => {
                    let value: serde_json::Value =
                        serde_json::from_slice(&response.result_json).expect("json");
                    let rows = value["rows"].as_array().expect("rows").clone();
                    return rows
                        .iter()
                        .map(|row| {
                            (
                                row[0].as_str().expect("tag").to_owned(),
                                row[1].as_i64().expect("count"),
                            )
                        })
                        .collect();
                }
                Err(status) if Instant::now() < deadline => {
                    let _ = status;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(status) => panic!("query log {key} via {addr}: {status:?}"),
            }
        }
    }

    /// Sends `request` (one command id every time, as a client retrying
    /// an ambiguous answer does) through `via` until a node applies it;
    /// `refused` checks each answer before that. Returns the applying
    /// answer and, in order, what was heard before it (with the time since
    /// the first try). Panics after `bound`.
    pub async fn execute_until_applied(
        &mut self,
        via: SocketAddr,
        request: &v1::ExecuteRequest,
        bound: Duration,
        refused: impl Fn(&tonic::Status),
    ) -> (v1::ExecuteResponse, Vec<String>) {
        let started = Instant::now();
        let mut answers = Vec::new();
        loop {
            assert!(
                started.elapsed() < bound,
                "no node applied the command through {via} in {bound:?}: {answers:?}"
            );
            match self.execute(via, request.clone()).await {
                Ok(response) => {
                    assert!(
                        matches!(
                            response.outcome,
                            Some(v1::execute_response::Outcome::ResultJson(_))
                        ),
                        "{response:?}"
                    );
                    return (response, answers);
                }
                Err(status) => {
                    refused(&status);
                    answers.push(format!(
                        "{:?} after {:?}",
                        error_code(&status),
                        started.elapsed()
                    ));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// Every tag acknowledged for each `log` Cell of `acked` is present
    /// exactly once (and nothing else is), read through each of `via`.
    pub async fn assert_exactly_once(
        &mut self,
        via: &[(&str, SocketAddr)],
        acked: &HashMap<String, Vec<String>>,
    ) {
        for (node, addr) in via {
            for (cell, tags) in acked {
                let counts = self.log_counts(*addr, cell).await;
                let mut expected: HashMap<String, i64> = HashMap::new();
                for tag in tags {
                    *expected.entry(tag.clone()).or_default() += 1;
                }
                assert_eq!(counts, expected, "{cell} read through {node}");
            }
        }
    }
}

/// Polls `/healthz` on `address` until it is not 200, or `bound` passes;
/// returns the last answer.
pub async fn wait_unhealthy(address: SocketAddr, bound: Duration) -> (u16, String) {
    let deadline = Instant::now() + bound;
    loop {
        let answer = http_get(address, "/healthz");
        if answer.0 != 200 || Instant::now() > deadline {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `GET path` on a plain HTTP listener: (status code, body).
/// A node's counter from its `/metrics`, summed over its label sets.
pub fn metric(node: &NodeProcess, name: &str) -> f64 {
    let (status, text) = http_get(node.http, "/metrics");
    assert_eq!(status, 200, "{text}");
    text.lines()
        .filter(|line| {
            line.starts_with(&format!("{name}{{")) || line.starts_with(&format!("{name} "))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `node`'s store requests of one operation so far
/// (`cellfleet_runtime_store_requests_total{op="…"}`).
pub fn store_requests(node: &NodeProcess, op: &str) -> f64 {
    let (status, text) = http_get(node.http, "/metrics");
    assert_eq!(status, 200, "{text}");
    text.lines()
        .filter(|line| {
            line.starts_with("cellfleet_runtime_store_requests_total{")
                && line.contains(&format!("op=\"{op}\""))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

pub fn http_get(address: SocketAddr, path: &str) -> (u16, String) {
    let (status, _, body) = http_request(address, "GET", path, "test");
    (status, body)
}

/// One plain HTTP/1.1 request with this `Host`: (status code, head in
/// lower case, body).
pub fn http_request(
    address: SocketAddr,
    method: &str,
    path: &str,
    host: &str,
) -> (u16, String, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n"
    )
    .expect("write");
    let mut reply = String::new();
    stream.read_to_string(&mut reply).expect("read");
    parse_response(&reply)
}

/// A raw HTTP/1.1 response: (status code, head in lower case, body).
pub fn parse_response(reply: &str) -> (u16, String, String) {
    let status = reply
        .get(9..12)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {reply:?}"));
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((reply, ""));
    (status, head.to_lowercase(), body.to_owned())
}

pub fn path_exists(path: &Path) -> bool {
    path.exists()
}
