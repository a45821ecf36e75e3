//! The benchmark's cluster: a temporary directory written by `cellfleet dev --no-start`, the store the nodes share, and N `cellfleet node` child processes on loopback ports chosen by the kernel.
//!
//! Node output goes to `nN.log` in the temporary directory (printed in
//! part if a node fails to start). [`BenchCluster::stop`] sends SIGTERM to
//! every node (they drain) and waits; dropping the cluster kills whatever
//! still runs. On S3 each run writes under a fresh prefix of the bench
//! bucket, which [`BenchCluster::delete_objects`] empties after the run
//! (the local store lives in the temporary directory and goes with it).

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use cellfleet_router::signing::read_signing_key;
use cellfleet_router::tls::{self, TlsIdentity};
use cellfleet_store::{ObjectStore, S3Config, S3Store, StoreConfig};

use crate::client::Signer;
use crate::StoreKind;

/// How long a node may take to print its ready line.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the nodes may take to drain after SIGTERM, unless the run
/// says otherwise (`cellfleet bench --drain-timeout-s`).
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);
/// The bucket benchmark runs use on S3 (each run under its own prefix).
const BENCH_BUCKET: &str = "cellfleet-bench";
/// Lease length of the benchmark's nodes.
pub const LEASE_MS: u64 = 5_000;
/// Appended to the kinds manifest `dev` writes: tag counts after a tag, a page at a time.
const BENCH_QUERIES: &str = r#"
[kinds.log.queries.count_after]
sql = "SELECT tag, COUNT(*) AS n FROM entries WHERE tag > :after GROUP BY tag ORDER BY tag LIMIT 500"
"#;
/// Lines of a failed node's log shown.
const LOG_TAIL_LINES: usize = 30;
/// Keys listed per page while deleting the run's objects.
const DELETE_PAGE_KEYS: usize = 1_000;
/// Deletes in flight at once.
const DELETE_CONCURRENCY: usize = 32;
/// Pages of deletes before giving up (bounds the loop on a store that
/// keeps listing what it was asked to delete).
const DELETE_PAGES_MAX: usize = 10_000;

/// The store, resolved before the nodes start.
#[derive(Debug)]
pub enum StoreSetup {
    Local,
    S3 {
        config: Box<S3Config>,
        prefix: String,
    },
}

/// The S3 server the bench uses: the one `CELLFLEET_S3_ENDPOINT` (and the
/// other `CELLFLEET_S3_*` variables) names, else a SeaweedFS started by the
/// `scripts/seaweedfs.sh` of the Cellfleet checkout the bench runs in (the
/// current directory or one above it). The shipped binary carries no path
/// of the machine it was built on.
fn bench_s3_config(bucket: &str) -> anyhow::Result<S3Config> {
    if std::env::var(cellfleet_store::ENV_ENDPOINT).is_ok_and(|v| !v.is_empty()) {
        return Ok(S3Config::from_env(bucket));
    }
    let here = std::env::current_dir().context("reading the current directory")?;
    let script = here
        .ancestors()
        .map(|dir| dir.join("scripts/seaweedfs.sh"))
        .find(|script| script.is_file())
        .ok_or_else(|| {
            anyhow::anyhow!(
                "no S3 server: set CELLFLEET_S3_ENDPOINT (and the other CELLFLEET_S3_* \
                 variables), or run the bench inside a Cellfleet checkout, where \
                 scripts/seaweedfs.sh starts SeaweedFS; or use --store local"
            )
        })?;
    let output = std::process::Command::new("bash")
        .arg(&script)
        .arg("start")
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !output.status.success() {
        anyhow::bail!(
            "{} start failed ({}): {}; set CELLFLEET_S3_ENDPOINT to use another server, \
             or use --store local",
            script.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let config = S3Config::from_shell_exports(bucket, &String::from_utf8_lossy(&output.stdout));
    if config.endpoint.is_none() {
        anyhow::bail!(
            "{} start printed no CELLFLEET_S3_ENDPOINT; set it to use another server",
            script.display()
        );
    }
    Ok(config)
}

impl StoreSetup {
    /// For S3: the server's settings (starting SeaweedFS through the
    /// repository's script when `CELLFLEET_S3_ENDPOINT` is unset, as the
    /// tests do), the bench bucket (created if missing) and a fresh prefix
    /// under `label`.
    pub fn resolve(
        kind: StoreKind,
        label: &str,
        runtime: &tokio::runtime::Runtime,
    ) -> anyhow::Result<Self> {
        match kind {
            StoreKind::Local => Ok(StoreSetup::Local),
            StoreKind::S3 => {
                let config = bench_s3_config(BENCH_BUCKET)?;
                runtime.block_on(async {
                    let store = S3Store::connect(&config)
                        .await
                        .context("configuring the S3 client")?;
                    store.create_bucket_if_missing().await.with_context(|| {
                        format!("creating bucket {BENCH_BUCKET} at {:?}", config.endpoint)
                    })?;
                    anyhow::Ok(())
                })?;
                let prefix = format!("{label}/{:016x}", rand::random::<u64>());
                Ok(StoreSetup::S3 {
                    config: Box::new(config),
                    prefix,
                })
            }
        }
    }
}

#[derive(Debug)]
pub struct NodeProcess {
    pub id: String,
    child: Child,
    /// Killed on purpose (`kill9`): not stopped again.
    killed: bool,
    pub client: SocketAddr,
    /// The plain HTTP listener (`/metrics`).
    pub http: SocketAddr,
}

/// Where a node listens, from its ready line.
#[derive(Clone, Copy, Debug)]
struct Ready {
    client: SocketAddr,
    http: SocketAddr,
}

#[derive(Debug)]
pub struct BenchCluster {
    dir: tempfile::TempDir,
    nodes: Vec<NodeProcess>,
    store: StoreSetup,
}

impl BenchCluster {
    /// Writes the cluster files and starts `nodes` nodes; returns once every
    /// node printed its ready line.
    pub fn start(
        exe: &Path,
        nodes: usize,
        store: StoreSetup,
        publication: &str,
    ) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("cellfleet-bench-")
            .tempdir()
            .context("creating the temporary cluster directory")?;
        let configs = write_cluster_files(exe, dir.path(), nodes, LEASE_MS)?;
        // dev's manifest plus a paged read of the log, which the exactness
        // check needs (a query returns at most 1,000 rows).
        let kinds = dir.path().join("kinds.toml");
        let mut manifest = std::fs::read_to_string(&kinds)
            .with_context(|| format!("reading {}", kinds.display()))?;
        manifest.push_str(BENCH_QUERIES);
        std::fs::write(&kinds, manifest).context("writing the kinds manifest")?;
        let mut env = node_env(&store);
        env.push(("CELLFLEET_PUBLICATION_MODE".into(), publication.to_owned()));
        let mut cluster = BenchCluster {
            dir,
            nodes: Vec::new(),
            store,
        };
        let (ready_tx, ready_rx) = mpsc::channel::<(usize, Ready)>();
        let mut children = Vec::new();
        for (index, config) in configs.iter().enumerate() {
            let id = format!("n{}", index + 1);
            let log_path = cluster.dir.path().join(format!("{id}.log"));
            let log = std::fs::File::create(&log_path)
                .with_context(|| format!("creating {}", log_path.display()))?;
            let mut child = Command::new(exe)
                .arg("node")
                .arg("--config")
                .arg(config)
                .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
                .stdout(Stdio::piped())
                .stderr(Stdio::from(log.try_clone()?))
                .spawn()
                .with_context(|| format!("cannot start {} node", exe.display()))?;
            let stdout = child.stdout.take().expect("stdout is piped");
            let ready_tx = ready_tx.clone();
            std::thread::spawn(move || forward_output(index, stdout, log, ready_tx));
            children.push((id, child));
        }
        drop(ready_tx);
        let mut addrs = vec![None; children.len()];
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut ready = 0;
        while ready < children.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            match ready_rx.recv_timeout(left) {
                Ok((index, addr)) => {
                    addrs[index] = Some(addr);
                    ready += 1;
                }
                Err(_) => {
                    let logs = cluster.log_tails(children.len());
                    for (_, child) in &mut children {
                        let _ = child.kill();
                        let _ = child.wait();
                    }
                    bail!(
                        "only {ready} of {} nodes became ready within {READY_TIMEOUT:?}\n{logs}",
                        children.len()
                    );
                }
            }
        }
        for ((id, child), addr) in children.into_iter().zip(addrs) {
            let ready = addr.expect("every node reported ready");
            cluster.nodes.push(NodeProcess {
                id,
                child,
                killed: false,
                client: ready.client,
                http: ready.http,
            });
        }
        Ok(cluster)
    }

    fn log_tails(&self, nodes: usize) -> String {
        (1..=nodes)
            .map(|i| {
                let path = self.dir.path().join(format!("n{i}.log"));
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
                format!("--- {} ---\n{tail}", path.display())
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn node_ids(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.id.clone()).collect()
    }

    pub fn client_addrs(&self) -> Vec<SocketAddr> {
        self.nodes.iter().map(|n| n.client).collect()
    }

    pub fn http_addrs(&self) -> Vec<SocketAddr> {
        self.nodes.iter().map(|n| n.http).collect()
    }

    /// The node processes' ids (for `/proc`).
    pub fn pids(&self) -> Vec<u32> {
        self.nodes.iter().map(|n| n.child.id()).collect()
    }

    /// The temporary cluster directory (the SQLite floor writes there, on
    /// the disk the nodes' Cells use).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Deletes every object of this run (its S3 prefix) and returns how
    /// many; nothing to do on the local store (the directory goes with the
    /// cluster). Call after the nodes stopped.
    pub async fn delete_objects(&self) -> anyhow::Result<u64> {
        let StoreSetup::S3 { prefix, .. } = &self.store else {
            return Ok(0);
        };
        let store = self.floor_store().await?;
        let prefix = format!("{prefix}/");
        let mut deleted = 0u64;
        for _ in 0..DELETE_PAGES_MAX {
            let page = store
                .list(&prefix, None, DELETE_PAGE_KEYS)
                .await
                .with_context(|| format!("listing {prefix}"))?;
            if page.entries.is_empty() {
                return Ok(deleted);
            }
            let mut keys = page.entries.into_iter().map(|entry| entry.key);
            loop {
                let batch: Vec<String> = keys.by_ref().take(DELETE_CONCURRENCY).collect();
                if batch.is_empty() {
                    break;
                }
                let mut tasks = tokio::task::JoinSet::new();
                for key in batch {
                    let store = store.clone();
                    tasks.spawn(async move {
                        store
                            .delete(&key)
                            .await
                            .with_context(|| format!("deleting {key}"))
                    });
                }
                while let Some(done) = tasks.join_next().await {
                    done??;
                    deleted += 1;
                }
            }
        }
        bail!("{prefix} still lists objects after {DELETE_PAGES_MAX} pages of deletes")
    }

    /// The client's mTLS configuration (the `dev` client certificate).
    pub fn client_tls(&self) -> anyhow::Result<Arc<rustls::ClientConfig>> {
        let identity = TlsIdentity::load(
            &self.path("certs/ca.pem"),
            &self.path("certs/client-dev.pem"),
            &self.path("certs/client-dev.key"),
        )
        .context("client certificate")?;
        Ok(tls::client_config(&identity)?)
    }

    /// A node's TLS identity (the echo floor serves with n1's).
    pub fn node_identity(&self, id: &str) -> anyhow::Result<TlsIdentity> {
        Ok(TlsIdentity::load(
            &self.path("certs/ca.pem"),
            &self.path(&format!("certs/node-{id}.pem")),
            &self.path(&format!("certs/node-{id}.key")),
        )?)
    }

    pub fn signing_key(&self) -> anyhow::Result<Signer> {
        let key = read_signing_key(&self.path("dev.ed25519.pem")).context("client signing key")?;
        Ok(Signer {
            key_id: "dev".into(),
            key: Arc::new(key),
        })
    }

    /// The nodes' store, opened as the nodes open it (S3 with retries).
    pub async fn floor_store(&self) -> anyhow::Result<Arc<dyn ObjectStore>> {
        let config = match &self.store {
            StoreSetup::Local => StoreConfig::Local {
                dir: self.path("store"),
            },
            StoreSetup::S3 { config, .. } => StoreConfig::S3((**config).clone()),
        };
        Ok(cellfleet_store::open(&config).await?)
    }

    /// Where the store floor writes (beside the cluster's keys, never in them).
    pub fn floor_prefix(&self) -> String {
        match &self.store {
            StoreSetup::Local => "bench-floor".into(),
            StoreSetup::S3 { prefix, .. } => format!("{prefix}/floor"),
        }
    }

    pub fn store_description(&self) -> String {
        match &self.store {
            StoreSetup::Local => format!("local {}", self.path("store").display()),
            StoreSetup::S3 { config, prefix } => format!(
                "s3 {} bucket {} prefix {prefix}",
                config.endpoint.as_deref().unwrap_or("(aws)"),
                config.bucket
            ),
        }
    }

    /// SIGTERM to every node, then waits for each to exit; returns
    /// (node id, exited successfully) per node.
    /// Kills node `index` with SIGKILL (a crash) and reaps it.
    pub fn kill9(&mut self, index: usize) -> anyhow::Result<()> {
        let node = &mut self.nodes[index];
        node.child
            .kill()
            .with_context(|| format!("killing {}", node.id))?;
        node.child.wait()?;
        node.killed = true;
        Ok(())
    }

    /// The local store's directory, when the nodes share one: it lives in
    /// the cluster directory and is deleted with it.
    pub fn local_store(&self) -> Option<PathBuf> {
        matches!(self.store, StoreSetup::Local).then(|| self.path("store"))
    }

    /// Copies the nodes' logs (`n1.log`, …) out of the cluster directory,
    /// which is deleted with the cluster, into a new directory it returns.
    pub fn keep_logs(&self) -> anyhow::Result<PathBuf> {
        keep_logs(self.dir.path(), &std::env::temp_dir())
    }

    /// SIGTERMs every node still running and waits up to `timeout` for
    /// them to drain and exit; a node still running then is killed.
    pub fn stop(&mut self, timeout: Duration) -> Vec<Drained> {
        for node in self.nodes.iter().filter(|n| !n.killed) {
            terminate(&node.child);
        }
        let started = Instant::now();
        let deadline = started + timeout;
        let mut results = Vec::new();
        let mut unclean = 0;
        for node in self.nodes.iter_mut().filter(|n| !n.killed) {
            let clean = loop {
                match node.child.try_wait() {
                    Ok(Some(status)) => {
                        if !status.success() {
                            eprintln!("bench: node {} exited with {status} after SIGTERM", node.id);
                        }
                        break status.success();
                    }
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    _ => {
                        eprintln!(
                            "bench: node {} still running {:.1} s after SIGTERM; killed",
                            node.id,
                            started.elapsed().as_secs_f64()
                        );
                        let _ = node.child.kill();
                        let _ = node.child.wait();
                        break false;
                    }
                }
            };
            unclean += usize::from(!clean);
            results.push(Drained {
                node: node.id.clone(),
                clean,
                seconds: started.elapsed().as_secs_f64(),
            });
        }
        if unclean > 0 {
            // The directory goes with the cluster: show why now.
            eprintln!("{}", self.log_tails(self.nodes.len()));
        }
        results
    }
}

/// One node's end after SIGTERM.
#[derive(Clone, Debug, PartialEq)]
pub struct Drained {
    pub node: String,
    /// Exited with success within the timeout (else it was killed, or
    /// exited with an error).
    pub clean: bool,
    /// Seconds from SIGTERM to its exit or kill, as far as the bench
    /// could tell (nodes are waited for in turn, polled every 50 ms).
    pub seconds: f64,
}

impl Drop for BenchCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Ok(None) = node.child.try_wait() {
                let _ = node.child.kill();
                let _ = node.child.wait();
            }
        }
    }
}

/// Writes a cluster's files as a user does, with `cellfleet dev --nodes N
/// --no-start` in `dir` (its CA and certificates, the client's signing key
/// and registry, the kinds manifest, the client config); returns the node
/// configs `dir/n1.toml`... that `dev` writes. Their listen addresses are
/// replaced by [`node_env`] when the nodes start.
pub(crate) fn write_cluster_files(
    exe: &Path,
    dir: &Path,
    nodes: usize,
    lease_ms: u64,
) -> anyhow::Result<Vec<PathBuf>> {
    let output = Command::new(exe)
        .arg("dev")
        .arg("--nodes")
        .arg(nodes.to_string())
        .arg("--data")
        .arg(dir)
        .arg("--lease-ms")
        .arg(lease_ms.to_string())
        .arg("--no-start")
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {} dev --no-start", exe.display()))?;
    if !output.status.success() {
        bail!(
            "{} dev --no-start failed ({}): {}",
            exe.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let configs: Vec<PathBuf> = (1..=nodes)
        .map(|i| dir.join(format!("n{i}.toml")))
        .collect();
    if let Some(missing) = configs.iter().find(|c| !c.is_file()) {
        bail!(
            "{} dev --no-start wrote no {}",
            exe.display(),
            missing.display()
        );
    }
    Ok(configs)
}

/// Asks `child` to drain (SIGTERM, through `kill`).
pub(crate) fn terminate(child: &Child) {
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
}

/// The environment that points a node at the store and at kernel-chosen ports.
pub(crate) fn node_env(store: &StoreSetup) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = [
        "CELLFLEET_LISTEN_CLIENT",
        "CELLFLEET_LISTEN_PEER",
        "CELLFLEET_LISTEN_HTTP",
        "CELLFLEET_LISTEN_STREAMS",
        "CELLFLEET_LISTEN_CONSOLE",
    ]
    .into_iter()
    .map(|name| (name.to_owned(), "127.0.0.1:0".to_owned()))
    .collect();
    if let StoreSetup::S3 { config, prefix } = store {
        env.push(("CELLFLEET_PREFIX".into(), prefix.clone()));
        env.push(("CELLFLEET_S3_BUCKET".into(), config.bucket.clone()));
        for (name, value) in [
            ("CELLFLEET_S3_ENDPOINT", &config.endpoint),
            ("CELLFLEET_S3_REGION", &config.region),
            ("CELLFLEET_S3_ACCESS_KEY", &config.access_key),
            ("CELLFLEET_S3_SECRET_KEY", &config.secret_key),
        ] {
            env.push((name.into(), value.clone().unwrap_or_default()));
        }
        env.push((
            "CELLFLEET_S3_PATH_STYLE".into(),
            config.path_style.to_string(),
        ));
    }
    env
}

/// Copies a node's stdout to its log and reports its addresses once it
/// prints `... ready client=ADDR peer=ADDR http=ADDR ...`.
fn forward_output(
    index: usize,
    stdout: std::process::ChildStdout,
    mut log: std::fs::File,
    ready: mpsc::Sender<(usize, Ready)>,
) {
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        let _ = writeln!(log, "{line}");
        if !line.contains(" ready ") {
            continue;
        }
        let field = |name: &str| -> Option<SocketAddr> {
            line.split(&format!(" {name}="))
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|addr| addr.parse().ok())
        };
        if let (Some(client), Some(http)) = (field("client"), field("http")) {
            let _ = ready.send((index, Ready { client, http }));
        }
    }
}

/// Copies every `*.log` file of `from` into a new `cellfleet-bench-logs-*`
/// directory under `under` and returns it.
fn keep_logs(from: &Path, under: &Path) -> anyhow::Result<PathBuf> {
    let kept = tempfile::Builder::new()
        .prefix("cellfleet-bench-logs-")
        .tempdir_in(under)
        .context("creating the directory for the nodes' logs")?
        .keep();
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|ext| ext == "log") {
            let name = path.file_name().expect("a file in a directory");
            std::fs::copy(&path, kept.join(name))
                .with_context(|| format!("copying {}", path.display()))?;
        }
    }
    Ok(kept)
}

/// Moves the local store's directory `store` (the nodes stopped) out of
/// the cluster directory, which is deleted with the cluster, into a new
/// `cellfleet-bench-store-*` directory under `under`; returns where it
/// went.
pub fn keep_local_store(store: &Path, under: &Path) -> anyhow::Result<PathBuf> {
    let holder = tempfile::Builder::new()
        .prefix("cellfleet-bench-store-")
        .tempdir_in(under)
        .context("creating the directory for the local store")?;
    let kept = holder.path().join("store");
    // On failure the holder goes (it is still a TempDir); kept, it stays.
    std::fs::rename(store, &kept)
        .with_context(|| format!("moving {} to {}", store.display(), kept.display()))?;
    let _ = holder.keep();
    Ok(kept)
}

/// Files under `dir`, at any depth (the local store's objects).
pub fn count_files(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|entry| match entry.file_type() {
            Ok(kind) if kind.is_dir() => count_files(&entry.path()),
            Ok(kind) if kind.is_file() => 1,
            _ => 0,
        })
        .sum()
}

#[cfg(test)]
mod keep_logs_tests {
    use super::*;

    #[test]
    fn the_nodes_logs_are_copied_and_nothing_else() {
        let cluster = tempfile::tempdir().unwrap();
        std::fs::write(cluster.path().join("n1.log"), "n1 ready\n").unwrap();
        std::fs::write(cluster.path().join("n2.log"), "n2 drained\n").unwrap();
        std::fs::write(cluster.path().join("n1.toml"), "node_id = 'n1'\n").unwrap();
        let under = tempfile::tempdir().unwrap();
        let kept = keep_logs(cluster.path(), under.path()).unwrap();
        assert!(kept.starts_with(under.path()));
        let mut names: Vec<_> = std::fs::read_dir(&kept)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["n1.log", "n2.log"]);
        assert_eq!(
            std::fs::read_to_string(kept.join("n2.log")).unwrap(),
            "n2 drained\n"
        );
    }
}
