//! `cellfleet dev`: a local multi-node cluster in seconds — a CA, node and client certificates, a signing key with its registry, a kinds manifest, node configs on loopback, a client config, and N real `cellfleet node` processes on one shared store.
//!
//! Everything lives under DIR (default `./.cellfleet-dev`); existing
//! certificates and keys are reused, so a restart keeps the cluster's data.
//! The client commands (`exec`, `query`, `leases`...) read
//! `DIR/client.toml` by default. Ctrl-C (or SIGTERM) drains every node.
//! DIR is locked (`DIR/dev.lock`, naming the pids) while `dev` runs: a
//! second `dev` on it refuses instead of rewriting the running cluster's
//! files. An edited `DIR/kinds.toml` is accepted on restart.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use cellfleet_router::certs::{ClusterCa, Role, CA_CERT_FILE};
use cellfleet_router::registry::{KeyEntry, KeyRegistry};
use cellfleet_router::signing::{generate_signing_key, write_signing_key};
use clap::Args;

use crate::client_cmd::{ClientFile, DEFAULT_CLIENT_CONFIG};
use crate::node_cmd::{
    EnvelopeFile, KeysFile, KindsFile, LeaseFile, ListenFile, NodeFile, PublicationFile, StoreFile,
    TlsFile,
};

/// How long `dev` waits for every node to report ready.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long `dev` waits for the nodes to drain after Ctrl-C.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);

/// The example kinds manifest written by `dev`.
pub const EXAMPLE_KINDS: &str = r#"# Kinds served by every node (the built-in `kv` kind is always there).
# Try: cellfleet exec counter c1 add --arg by=5 ; cellfleet query counter c1 value

[kinds.counter]
migrations = [
  "CREATE TABLE counter (id INTEGER PRIMARY KEY CHECK (id = 1), n INTEGER NOT NULL)",
  "INSERT INTO counter VALUES (1, 0)",
]

[kinds.counter.commands.add]
sql = ["UPDATE counter SET n = n + :by"]
params = { by = "integer" }   # checked before the command runs

[kinds.counter.queries.value]
sql = "SELECT n FROM counter"

# An append-only log: each command adds one row, so a count per tag shows
# whether any command ran twice.
[kinds.log]
migrations = ["CREATE TABLE entries (tag TEXT NOT NULL)"]

[kinds.log.commands.append]
sql = ["INSERT INTO entries (tag) VALUES (:tag)"]
params = { tag = "text" }

[kinds.log.queries.count]
sql = "SELECT tag, COUNT(*) AS n FROM entries GROUP BY tag ORDER BY tag"
"#;

#[derive(Debug, Args)]
pub struct DevArgs {
    /// Number of nodes.
    #[arg(long, default_value_t = 3)]
    pub(crate) nodes: usize,
    /// Where certificates, keys, configs, node data and the local store live.
    #[arg(long, default_value = ".cellfleet-dev")]
    pub(crate) data: PathBuf,
    /// Use this S3 endpoint URL instead of the local-directory store
    /// (bucket from CELLFLEET_S3_BUCKET, default "cellfleet-dev"; credentials
    /// from CELLFLEET_S3_ACCESS_KEY / CELLFLEET_S3_SECRET_KEY).
    #[arg(long)]
    pub(crate) s3: Option<String>,
    /// Client ports are BASE+1.., peer ports BASE+101.., HTTP ports BASE+201..,
    /// Durable Streams ports BASE+301.., console ports BASE+401...
    #[arg(long, default_value_t = 7000)]
    pub(crate) port_base: u16,
    /// Node lease length (a killed node's Cells move after about this long).
    #[arg(long, default_value_t = 5000)]
    pub(crate) lease_ms: u64,
    /// Write the files and exit without starting nodes.
    #[arg(long)]
    pub(crate) no_start: bool,
    /// Serve Durable Streams as `cellfleet node` does by default: HTTPS
    /// with the node certificates (trust DIR/certs/ca.pem) and bearer
    /// tokens required (`cellfleet keys token`). Without it, a dev cluster
    /// serves them in plain HTTP to anyone on loopback.
    #[arg(long)]
    pub(crate) streams_secure: bool,
    /// Serve the web console as `cellfleet node` does by default: HTTPS
    /// with a cluster-CA client certificate required (import
    /// DIR/certs/client-dev.pem and .key into the browser). Without it, a
    /// dev cluster serves it in plain HTTP on loopback.
    #[arg(long)]
    pub(crate) console_secure: bool,
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// Writes (or reuses) every file of a dev cluster; returns the node config paths.
pub fn prepare(args: &DevArgs) -> anyhow::Result<Vec<PathBuf>> {
    if args.nodes == 0 || args.nodes > 99 {
        bail!("--nodes must be 1..=99");
    }
    let dir = &args.data;
    ensure_certs(&dir.join("certs"), args.nodes)?;
    let registry_path = dir.join("keys.toml");
    ensure_dev_key(&dir.join("dev.ed25519.pem"), &registry_path)?;
    grant_dev_stream_tokens(&registry_path)?;
    KeyRegistry::load(&registry_path)?;
    let kinds_path = dir.join("kinds.toml");
    if !kinds_path.exists() {
        write(&kinds_path, EXAMPLE_KINDS)?;
    }
    let store = dev_store(args.s3.as_deref());
    let mut configs = Vec::new();
    let mut endpoints = Vec::new();
    for i in 1..=args.nodes {
        let file = node_file(args, i, store.clone());
        endpoints.push(file.listen.client.clone());
        let path = dir.join(format!("n{i}.toml"));
        write(&path, &toml::to_string(&file)?)?;
        configs.push(path);
    }
    let client = ClientFile {
        endpoints,
        ca: "certs/ca.pem".into(),
        cert: "certs/client-dev.pem".into(),
        key: "certs/client-dev.key".into(),
        signing_key: "dev.ed25519.pem".into(),
        key_id: "dev".into(),
        window_ms: 60_000,
    };
    write(&dir.join("client.toml"), &toml::to_string(&client)?)?;
    Ok(configs)
}

/// The dev CA and a certificate for every node and for the `dev` client,
/// each made only if missing (a restart keeps what the browser trusts).
fn ensure_certs(certs: &Path, nodes: usize) -> anyhow::Result<()> {
    std::fs::create_dir_all(certs).with_context(|| format!("creating {}", certs.display()))?;
    let ca = if certs.join(CA_CERT_FILE).exists() {
        ClusterCa::load(certs).context("the existing dev CA")?
    } else {
        ClusterCa::init(certs, "cellfleet-dev")?.0
    };
    let roles = (1..=nodes)
        .map(|i| Role::Node(format!("n{i}")))
        .chain([Role::Client("dev".into())]);
    for role in roles {
        if !certs.join(format!("{}.pem", role.file_stem())).exists() {
            ca.issue_to(certs, &role, &[])?;
        }
    }
    Ok(())
}

/// The `dev` signing key and a registry that lets it do everything,
/// written together when either is missing.
fn ensure_dev_key(signing_path: &Path, registry_path: &Path) -> anyhow::Result<()> {
    if signing_path.exists() && registry_path.exists() {
        return Ok(());
    }
    let _ = std::fs::remove_file(signing_path);
    let key = generate_signing_key();
    write_signing_key(signing_path, &key)?;
    let mut entry = KeyEntry::new(
        "dev",
        &key.verifying_key(),
        vec!["*".into()],
        vec!["*".into()],
    );
    entry.raw_sql = true;
    entry.admin = true;
    entry.stream_token_prefixes = vec!["/".into()];
    write(registry_path, &entry.to_toml())
}

/// The embedded local store under the data directory, or the S3 endpoint
/// `--s3` names (bucket, region and keys from `CELLFLEET_S3_*`).
fn dev_store(s3: Option<&str>) -> StoreFile {
    let Some(endpoint) = s3 else {
        return StoreFile {
            kind: "local".into(),
            dir: Some("store".into()),
            ..StoreFile::default()
        };
    };
    let var = |n: &str| std::env::var(n).ok().filter(|v| !v.is_empty());
    StoreFile {
        kind: "s3".into(),
        bucket: Some(var("CELLFLEET_S3_BUCKET").unwrap_or_else(|| "cellfleet-dev".into())),
        endpoint: Some(endpoint.to_owned()),
        region: Some(var("CELLFLEET_S3_REGION").unwrap_or_else(|| "us-east-1".into())),
        access_key: var("CELLFLEET_S3_ACCESS_KEY"),
        secret_key: var("CELLFLEET_S3_SECRET_KEY"),
        path_style: Some(true),
        dir: None,
    }
}

/// Node `n{i}`'s configuration: ports BASE+i (client), +100+i (peer),
/// +200+i (HTTP), +300+i (Durable Streams), +400+i (console).
fn node_file(args: &DevArgs, i: usize, store: StoreFile) -> NodeFile {
    let port = |offset: usize| usize::from(args.port_base) + offset + i;
    NodeFile {
        node_id: format!("n{i}"),
        data_dir: format!("n{i}").into(),
        prefix: "cellfleet".into(),
        listen: ListenFile {
            client: format!("127.0.0.1:{}", port(0)),
            peer: format!("127.0.0.1:{}", port(100)),
            http: format!("127.0.0.1:{}", port(200)),
            advertise_host: None,
            // Durable Streams on by default in dev: BASE+301...
            streams: Some(format!("127.0.0.1:{}", port(300))),
            streams_long_poll_ms: None,
            // Webhook receivers of a dev machine listen on loopback.
            streams_allow_loopback_webhooks: Some(true),
            streams_tls: (!args.streams_secure).then(|| "none".into()),
            streams_cert: None,
            streams_key: None,
            streams_auth: (!args.streams_secure).then(|| "none".into()),
            // The web console: BASE+401...
            console: Some(format!("127.0.0.1:{}", port(400))),
            console_tls: (!args.console_secure).then(|| "none".into()),
        },
        store,
        tls: TlsFile {
            ca: "certs/ca.pem".into(),
            cert: format!("certs/node-n{i}.pem").into(),
            key: format!("certs/node-n{i}.key").into(),
        },
        keys: KeysFile {
            registry: "keys.toml".into(),
        },
        kinds: KindsFile {
            manifest: Some("kinds.toml".into()),
        },
        lease: LeaseFile {
            lease_ms: args.lease_ms,
            renew_every_ms: (args.lease_ms / 3).max(1),
            drift_margin_ms: 500.min(args.lease_ms / 4),
        },
        envelope: EnvelopeFile::default(),
        publication: PublicationFile::default(),
        limits: Default::default(),
        gc: Default::default(),
        ingress_only: false,
    }
}

/// Gives the `dev` key of a registry written before stream tokens existed
/// the right to sign them (`stream_token_prefixes = ["/"]`); other keys
/// and a `dev` entry that already says something are left as they are.
fn grant_dev_stream_tokens(path: &Path) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut file: toml::Table =
        toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let Some(toml::Value::Array(keys)) = file.get_mut("keys") else {
        return Ok(());
    };
    let dev = keys
        .iter_mut()
        .filter_map(toml::Value::as_table_mut)
        .find(|entry| {
            entry.get("id").and_then(toml::Value::as_str) == Some("dev")
                && !entry.contains_key("stream_token_prefixes")
        });
    if let Some(entry) = dev {
        entry.insert(
            "stream_token_prefixes".into(),
            toml::Value::Array(vec!["/".into()]),
        );
        write(path, &toml::to_string(&file)?)?;
    }
    Ok(())
}

/// Asks `child` to drain (SIGTERM, through `kill`: no libc in this crate).
pub(crate) fn terminate(child: &Child) {
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
}

/// The lock file of a dev data directory, held while `dev` runs.
const LOCK_FILE: &str = "dev.lock";

/// Takes the data directory's lock, or says which `dev` holds it: a second
/// `dev` on the same directory would rewrite the running cluster's files and
/// replace its nodes' leases.
fn lock_data_dir(dir: &Path) -> anyhow::Result<std::fs::File> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(LOCK_FILE);
    if let Some(file) = crate::dir_lock::try_lock(&path)? {
        return Ok(file);
    }
    let holder = std::fs::read_to_string(&path).unwrap_or_default();
    let holder = holder.trim();
    bail!(
        "another `cellfleet dev` is running on {} ({}); stop it with Ctrl-C (or SIGTERM \
         to its pid), or give this one another --data directory",
        dir.display(),
        if holder.is_empty() {
            "pid unknown"
        } else {
            holder
        }
    )
}

/// Records who holds the lock, for the message a second `dev` prints.
fn describe_holder(lock: &mut std::fs::File, nodes: &str) {
    use std::io::{Seek, Write};
    let _ = lock.set_len(0);
    let _ = lock.seek(std::io::SeekFrom::Start(0));
    let _ = write!(lock, "dev pid {}; node pids {nodes}", std::process::id());
}

/// Starts one `cellfleet node` per config and waits until each prints its
/// ready line (their output is passed through); stops them all if one is
/// not ready in time.
fn start_nodes(exe: &Path, configs: &[PathBuf]) -> anyhow::Result<Vec<Child>> {
    let (ready_tx, ready_rx) = mpsc::channel::<String>();
    let mut children = Vec::new();
    for config in configs {
        // A dev cluster takes an edited kinds.toml on restart: every node
        // starts with the same new manifest, so the cluster record's digest
        // is replaced (production nodes need the flag said out loud).
        let mut child = Command::new(exe)
            .arg("node")
            .arg("--config")
            .arg(config)
            .arg("--accept-kinds-change")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("cannot start {} node", exe.display()))?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let ready_tx = ready_tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.contains(" ready ") {
                    let _ = ready_tx.send(line.clone());
                }
                println!("{line}");
            }
        });
        children.push(child);
    }
    drop(ready_tx);
    let deadline = Instant::now() + READY_TIMEOUT;
    let mut ready = 0;
    while ready < children.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        match ready_rx.recv_timeout(left) {
            Ok(_) => ready += 1,
            Err(_) => {
                for child in &children {
                    terminate(child);
                }
                bail!("only {ready} of {} nodes became ready within {READY_TIMEOUT:?}; see their messages above", children.len());
            }
        }
    }
    Ok(children)
}

/// What `cellfleet dev` prints once every node is ready.
fn banner(args: &DevArgs, nodes: usize, pids: &str) -> String {
    let client_config = args.data.join("client.toml");
    let default_config = Path::new(DEFAULT_CLIENT_CONFIG);
    let hint = if args.data == Path::new(".cellfleet-dev") || default_config.exists() {
        String::new()
    } else {
        format!("export CELLFLEET_CONFIG={}\n  ", client_config.display())
    };
    let streams = if args.streams_secure {
        format!(
            "Durable Streams: https://127.0.0.1:{}.. (trust {}; tokens: `cellfleet keys token --prefix /v1/stream/ --ops read,append,create`)",
            usize::from(args.port_base) + 301,
            args.data.join("certs/ca.pem").display()
        )
    } else {
        format!(
            "Durable Streams: http://127.0.0.1:{}.. in plain HTTP, open to anyone on this machine (dev; --streams-secure for HTTPS and tokens)",
            usize::from(args.port_base) + 301
        )
    };
    let console = if args.console_secure {
        format!(
            "Web console: https://127.0.0.1:{}/ui/ (trust {}; the browser presents {})",
            usize::from(args.port_base) + 401,
            args.data.join("certs/ca.pem").display(),
            args.data.join("certs/client-dev.pem").display()
        )
    } else {
        format!(
            "Web console: http://127.0.0.1:{}/ui/ (every node serves it: ports {}..; plain HTTP on loopback, dev; --console-secure for HTTPS and client certificates)",
            usize::from(args.port_base) + 401,
            usize::from(args.port_base) + 401
        )
    };
    format!(
        "\ncluster ready: {} nodes; client config {}\n{streams}\n{console}\n\ntry (in another terminal):\n  {hint}cellfleet exec kv hello put --arg key=greeting --arg value='\"hi\"'\n  cellfleet query kv hello get --arg key=greeting\n  cellfleet leases\n  cellfleet cells\n  cellfleet cell show kv hello\n  kill -9 <pid of a node>   # its Cells move after the {} ms lease\n\nnode pids: {}\nCtrl-C drains every node.",
        nodes,
        client_config.display(),
        args.lease_ms,
        pids
    )
}

/// Asks every node to drain and waits up to the drain bound; returns how
/// many did not exit cleanly (those still running are killed).
fn drain_nodes(children: &mut [Child]) -> anyhow::Result<usize> {
    for child in children.iter() {
        terminate(child);
    }
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    let mut failed = 0;
    for child in children.iter_mut() {
        loop {
            match child.try_wait()? {
                Some(status) => {
                    if !status.success() {
                        failed += 1;
                    }
                    break;
                }
                None if Instant::now() > deadline => {
                    let _ = child.kill();
                    failed += 1;
                    break;
                }
                None => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }
    Ok(failed)
}

pub fn run(args: DevArgs) -> anyhow::Result<ExitCode> {
    let mut lock = lock_data_dir(&args.data)?;
    describe_holder(&mut lock, "not started yet");
    let configs = prepare(&args)?;
    if args.no_start {
        println!("wrote {}", args.data.display());
        return Ok(ExitCode::SUCCESS);
    }
    let exe = std::env::current_exe().context("cannot find the cellfleet executable")?;
    println!(
        "starting {} nodes; a changed {} is accepted (a dev cluster: production nodes refuse \
         one unless started with `cellfleet node --accept-kinds-change`)",
        configs.len(),
        args.data.join("kinds.toml").display()
    );
    let mut children = start_nodes(&exe, &configs)?;
    let pids = children
        .iter()
        .enumerate()
        .map(|(i, c)| format!("n{}={}", i + 1, c.id()))
        .collect::<Vec<_>>()
        .join(" ");
    describe_holder(&mut lock, &pids);
    // Listening from before the ready line (see `signals`).
    let signal = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let shutdown = {
        let _runtime = signal.enter();
        crate::signals::shutdown_signal()
    };
    println!("{}", banner(&args, children.len(), &pids));
    signal.block_on(shutdown);
    say!("draining {} nodes...", children.len());
    let failed = drain_nodes(&mut children)?;
    if failed > 0 {
        say!("{failed} node(s) did not drain cleanly; their Cells move after lease expiry");
        return Ok(ExitCode::from(1));
    }
    say!("all nodes drained");
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dev registry from before stream tokens gets the grant for its
    /// `dev` key only; other keys and a second run change nothing.
    #[test]
    fn an_old_dev_registry_gets_stream_tokens_for_the_dev_key_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.toml");
        let key = generate_signing_key().verifying_key();
        let dev = KeyEntry::new("dev", &key, vec!["*".into()], vec!["*".into()]);
        let other = KeyEntry::new("other", &key, vec!["kv".into()], vec!["get".into()]);
        write(&path, &format!("{}\n{}", dev.to_toml(), other.to_toml())).unwrap();
        grant_dev_stream_tokens(&path).unwrap();
        let registry = KeyRegistry::load(&path).unwrap();
        assert_eq!(
            registry.get("dev").unwrap().entry.stream_token_prefixes,
            ["/"]
        );
        assert!(registry
            .get("other")
            .unwrap()
            .entry
            .stream_token_prefixes
            .is_empty());
        assert_eq!(registry.get("other").unwrap().entry, other);
        let once = std::fs::read_to_string(&path).unwrap();
        grant_dev_stream_tokens(&path).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), once);
    }
}
