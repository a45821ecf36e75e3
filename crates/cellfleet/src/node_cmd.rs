//! `cellfleet node --config node.toml`: run one production node — probe the store, load kinds, certificates and keys, take the lease, serve, and drain on SIGTERM or Ctrl-C.
//!
//! The config file (paths are relative to the file's directory):
//!
//! ```toml
//! node_id = "n1"
//! data_dir = "n1"            # SQLite files of open Cells (locked: one node per data_dir)
//! prefix = "cellfleet"       # the cluster's key prefix in the bucket
//!
//! [listen]                   # port 0 picks a free port (printed at start)
//! client = "127.0.0.1:7001"  # client + admin services, mTLS (client or node certs)
//! peer = "127.0.0.1:7101"    # peer service, mTLS (node certs only)
//! http = "127.0.0.1:7201"    # /metrics /healthz /readyz
//! streams = "127.0.0.1:7301" # optional: Durable Streams HTTP (streams_long_poll_ms = 500)
//! streams_allow_loopback_webhooks = false  # subscription webhooks to loopback (dev only)
//! streams_tls = "node"       # "node": HTTPS with [tls] cert (default); "none": plain HTTP
//! streams_cert = "public.pem"  # optional, with streams_key: HTTPS with a certificate for a
//! streams_key = "public.key"   #  public name instead of the node's
//! streams_auth = "token"     # "token": bearer tokens required (default); "none": anyone
//!                            #  who reaches the port may read, append and delete (dev only)
//! console = "127.0.0.1:7401" # optional: the web console at /ui/ (read-only)
//! console_tls = "mtls"       # "mtls": HTTPS, cluster-CA client certificate required (default);
//!                            #  "none": plain HTTP, IP-literal or localhost Host only (dev only)
//! advertise_host = "127.0.0.1"  # optional: the host others dial (default: the listen host)
//!
//! [store]                    # type = "local" (dir) or "s3" (bucket, endpoint, region,
//! type = "local"             #  access_key, secret_key, path_style)
//! dir = "../store"
//!
//! [tls]
//! ca = "certs/ca.pem"
//! cert = "certs/node-n1.pem"
//! key = "certs/node-n1.key"
//!
//! [keys]
//! registry = "keys.toml"
//!
//! [kinds]                    # optional; the built-in kv kind is always served
//! manifest = "kinds.toml"
//!
//! [lease]                    # optional
//! lease_ms = 10000
//! renew_every_ms = 3000
//! drift_margin_ms = 500
//!
//! [envelope]                 # optional
//! skew_ms = 500
//! max_window_ms = 600000     # longest signed window; a Cell runs any expiry the router admits
//!
//! [publication]              # optional
//! mode = "log"               # "log": the node log (default); "cell": one root CAS per group
//! lanes = 1                  # log lanes per node session (each a committer with its own pipeline)
//! checkpoint_records = 256   # a Cell's records past its root before a checkpoint
//! checkpoint_idle_ms = 30000 # ... or this long without a new record (open or passivated)
//! replay_segments_max = 32768 # ... or once its lane grew this many segments past its root (bounds a takeover's replay; at most 50000)
//! segments_inflight_max = 4  # segment PUTs of one lane in flight at once
//! cell_groups_inflight_max = 1  # groups of one Cell executed and not yet in the log at once (1 to 64)
//! batch_commands_min = 16    # while segments are in flight, this many commands start another
//! linger_ms = 5              # ... as does any group that waited this long (an idle lane writes at once)
//! parked_bytes_max = 67108864  # passivated Cells' records kept in memory (parked) at most, in bytes
//! checkpoints_inflight_max = 16  # checkpoints in flight at once on this node (background work; bounded so they never crowd out lease renewals)
//!
//! [limits]                   # optional: what one node may hold open
//! cells_open_max = 100000    # SQLite files open at once (idle ones are passivated, LRU); default: cells_owned_max
//! cells_owned_max = 100000   # Cells owned, open or passivated
//! fds_max = 32768            # file descriptors for open Cells, 2 each and 2 per reader (capped by the open-file limit)
//! memory_bytes_max = 4294967296  # memory for open Cells, each charged 640 KiB plus its connections' page caches (1,152 KiB with one reader); default: half the machine's
//! cell_wal_bytes_max = 1048576   # an open Cell's WAL folds into its database past this (64 KiB to 1 GiB): local disk beyond the data, per open Cell
//! cell_cache_bytes_max = 262144  # pages each connection of an open Cell (its writer, its readers) keeps cached (64 KiB to 1 GiB)
//!
//! [gc]                       # optional: deleting what no root can reach
//! enabled = true             # log segments below every Cell's records, replaced LTX files
//! min_age_ms = 60000         # ... once unreachable this long
//! ```
//!
//! A top-level `ingress_only = true` (or `CELLFLEET_INGRESS_ONLY=1`) makes
//! an ingress-only node: it holds a lease, serves clients and Durable
//! Streams and forwards everything, but routers never place a Cell on it.
//!
//! Environment overrides: `CELLFLEET_NODE_ID`, `CELLFLEET_DATA_DIR`,
//! `CELLFLEET_PREFIX`, `CELLFLEET_LISTEN_CLIENT`, `CELLFLEET_LISTEN_PEER`,
//! `CELLFLEET_LISTEN_HTTP`, `CELLFLEET_LISTEN_STREAMS` (empty: off),
//! `CELLFLEET_STREAMS_TLS` (`node` or `none`), `CELLFLEET_STREAMS_AUTH` (`token` or `none`),
//! `CELLFLEET_ADVERTISE_HOST`, `CELLFLEET_TLS_CERT`, `CELLFLEET_TLS_KEY`,
//! `CELLFLEET_STORE_DIR`,
//! `CELLFLEET_S3_BUCKET` (switches the store to S3) with `CELLFLEET_S3_ENDPOINT`,
//! `_REGION`, `_ACCESS_KEY`, `_SECRET_KEY`, `_PATH_STYLE`,
//! `CELLFLEET_LEASE_MS`, `CELLFLEET_RENEW_EVERY_MS`, and
//! `CELLFLEET_PUBLICATION_MODE` (`log` or `cell`), `CELLFLEET_LOG_LANES`,
//! `CELLFLEET_LOG_SEGMENTS_INFLIGHT`, `CELLFLEET_LOG_CHECKPOINT_RECORDS`,
//! `CELLFLEET_LOG_BATCH_COMMANDS_MIN`, `CELLFLEET_LOG_LINGER_MS`,
//! `CELLFLEET_LOG_CHECKPOINT_IDLE_MS`, `CELLFLEET_LOG_REPLAY_SEGMENTS_MAX`,
//! `CELLFLEET_GC_MIN_AGE_MS`.
//!
//! Cluster record: at start, after the store probe, the node compares its
//! prefix, page size and kinds manifest digest (no manifest: the empty
//! manifest's) with `{prefix}/cluster.json`, creating it if absent, and
//! refuses to start on any difference, naming both values. To change the
//! cluster's kinds, put the new manifest on every node and start one node
//! with `--accept-kinds-change` (it replaces the record by CAS); restart the
//! others with the new manifest. Prefix and page size never change in place.
//!
//! Shutdown order on SIGTERM/Ctrl-C: readiness turns false, the runtime
//! drains (stop admission, publish accepted work, release every root,
//! retire the lease) while the listeners still answer (new requests get
//! DRAINING and go elsewhere), then the listeners close.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use anyhow::{bail, Context};
use cellfleet_authority::cluster::Mismatch;
use cellfleet_authority::{
    check_cluster, Clock, ClusterCheck, ClusterRecord, Layout, LeaseConfig, NodeId, NodeLeases,
    Roots, SystemClock,
};
use cellfleet_router::endpoints::lease_endpoints;
use cellfleet_router::envelope::{EnvelopePolicy, Verifier};
use cellfleet_router::forward::Router;
use cellfleet_router::registry::KeyRegistry;
use cellfleet_router::server::{ConsoleListener, Listeners, NodeServer};
use cellfleet_router::service_admin::DrainState;
use cellfleet_router::tls::{self, TlsIdentity};
use cellfleet_runtime::{Kinds, LogSettings, Node, NodeConfig, NodeLimits, PublicationMode};
use cellfleet_store::{S3Config, StoreConfig};
use clap::Args;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;

/// Race writers of the start-up probe (small: it runs on every start).
const PROBE_WRITERS: usize = 2;

/// The most groups of one Cell `[publication] cell_groups_inflight_max`
/// accepts.
const CELL_GROUPS_INFLIGHT_CAP: usize = 64;

#[derive(Debug, Args)]
pub struct NodeArgs {
    /// The node's TOML config (see `cellfleet node --help` and the docs of node_cmd.rs).
    #[arg(long, env = "CELLFLEET_NODE_CONFIG")]
    config: PathBuf,
    /// Replace the cluster record's kinds manifest digest with this node's
    /// (after putting the new manifest on every node). Without it, a node
    /// whose manifest differs from the cluster's refuses to start.
    #[arg(long)]
    accept_kinds_change: bool,
    /// Check the config and every file it names (kinds manifest, node
    /// certificate and its role, key registry, streams TLS files) and the
    /// listeners' addresses, print a summary and exit: nothing is bound,
    /// written or contacted (`cellfleet store probe` checks the store).
    #[arg(long)]
    check_config: bool,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ListenFile {
    pub client: String,
    pub peer: String,
    pub http: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advertise_host: Option<String>,
    /// Durable Streams HTTP listener (crates/streams); off when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streams: Option<String>,
    /// Long-poll timeout of the streams listener (default 20 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streams_long_poll_ms: Option<u64>,
    /// Whether subscription webhooks may go to loopback addresses (dev only; default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streams_allow_loopback_webhooks: Option<bool>,
    /// TLS of the streams listener: "node" (default) or "none".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streams_tls: Option<String>,
    /// A certificate (chain, PEM) for the streams listener instead of the node's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streams_cert: Option<PathBuf>,
    /// The private key (PEM) of `streams_cert`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streams_key: Option<PathBuf>,
    /// Authorization of the streams listener: "token" (default) or "none".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streams_auth: Option<String>,
    /// The web console (`/ui/`); off when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub console: Option<String>,
    /// TLS of the console: "mtls" (default) or "none".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub console_tls: Option<String>,
}

/// How the streams listener is secured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamsTls {
    /// Plain HTTP.
    None,
    /// HTTPS with the node's certificate.
    Node,
    /// HTTPS with this certificate and key.
    Files { cert: PathBuf, key: PathBuf },
}

impl ListenFile {
    /// The streams listener's TLS, from `streams_tls`, `streams_cert` and `streams_key`.
    pub fn streams_tls(&self) -> anyhow::Result<StreamsTls> {
        let files = match (&self.streams_cert, &self.streams_key) {
            (Some(cert), Some(key)) => Some(StreamsTls::Files {
                cert: cert.clone(),
                key: key.clone(),
            }),
            (None, None) => None,
            _ => bail!(
                "listen.streams_cert and listen.streams_key go together: give both or neither"
            ),
        };
        match (self.streams_tls.as_deref(), files) {
            (None | Some("node"), None) => Ok(StreamsTls::Node),
            (None, Some(files)) => Ok(files),
            (Some("none"), None) => Ok(StreamsTls::None),
            (Some(tls @ ("node" | "none")), Some(_)) => bail!(
                "listen.streams_tls = {tls:?} conflicts with listen.streams_cert: drop one of them"
            ),
            (Some(other), _) => bail!("listen.streams_tls = {other:?}: use \"node\" or \"none\""),
        }
    }

    /// Whether the console is served over HTTPS with client certificates
    /// required (`console_tls = "mtls"`, the default) or in plain HTTP
    /// (`"none"`).
    pub fn console_mtls(&self) -> anyhow::Result<bool> {
        match self.console_tls.as_deref() {
            None | Some("mtls") => Ok(true),
            Some("none") => Ok(false),
            Some(other) => bail!("listen.console_tls = {other:?}: use \"mtls\" or \"none\""),
        }
    }

    /// Whether the streams listener requires bearer tokens (`streams_auth`).
    pub fn streams_tokens(&self) -> anyhow::Result<bool> {
        match self.streams_auth.as_deref() {
            None | Some("token") => Ok(true),
            Some("none") => Ok(false),
            Some(other) => bail!("listen.streams_auth = {other:?}: use \"token\" or \"none\""),
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StoreFile {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_style: Option<bool>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFile {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KeysFile {
    pub registry: PathBuf,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KindsFile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseFile {
    pub lease_ms: u64,
    pub renew_every_ms: u64,
    pub drift_margin_ms: u64,
}

impl Default for LeaseFile {
    fn default() -> Self {
        let d = LeaseConfig::default();
        LeaseFile {
            lease_ms: d.lease_ms,
            renew_every_ms: d.renew_every_ms,
            drift_margin_ms: d.drift_margin_ms,
        }
    }
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EnvelopeFile {
    pub skew_ms: u64,
    pub max_window_ms: u64,
}

impl Default for EnvelopeFile {
    fn default() -> Self {
        let d = EnvelopePolicy::default();
        EnvelopeFile {
            skew_ms: d.skew_ms,
            max_window_ms: d.max_window_ms,
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PublicationFile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lanes: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_records: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_idle_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_segments_max: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segments_inflight_max: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cell_groups_inflight_max: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_commands_min: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub linger_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parked_bytes_max: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoints_inflight_max: Option<usize>,
}

impl PublicationFile {
    fn mode(&self) -> anyhow::Result<PublicationMode> {
        self.mode
            .as_deref()
            .map_or(Ok(PublicationMode::default()), str::parse)
            .map_err(|e| anyhow::anyhow!("[publication] {e}"))
    }

    /// The log-only settings given while the mode is `cell`, which does
    /// not read them: said at start and by `--check-config` rather than
    /// ignored in silence.
    fn ignored_in_cell_mode(&self) -> anyhow::Result<Vec<&'static str>> {
        if self.mode()? != PublicationMode::Cell {
            return Ok(Vec::new());
        }
        let given = [
            ("lanes", self.lanes.is_some()),
            ("checkpoint_records", self.checkpoint_records.is_some()),
            ("checkpoint_idle_ms", self.checkpoint_idle_ms.is_some()),
            ("replay_segments_max", self.replay_segments_max.is_some()),
            (
                "segments_inflight_max",
                self.segments_inflight_max.is_some(),
            ),
            (
                "cell_groups_inflight_max",
                self.cell_groups_inflight_max.is_some(),
            ),
            ("batch_commands_min", self.batch_commands_min.is_some()),
            ("linger_ms", self.linger_ms.is_some()),
            ("parked_bytes_max", self.parked_bytes_max.is_some()),
            (
                "checkpoints_inflight_max",
                self.checkpoints_inflight_max.is_some(),
            ),
        ];
        Ok(given
            .into_iter()
            .filter_map(|(name, set)| set.then_some(name))
            .collect())
    }

    /// Refuses settings out of their range, naming the key and the range.
    fn validate(&self) -> anyhow::Result<()> {
        self.mode()?;
        if self.lanes == Some(0) {
            bail!("publication.lanes must be at least 1");
        }
        if self.batch_commands_min == Some(0) {
            bail!("publication.batch_commands_min must be at least 1");
        }
        if self.segments_inflight_max == Some(0) {
            bail!("publication.segments_inflight_max must be at least 1");
        }
        // More than a few groups of one Cell in flight only hold memory
        // (one in flight already gathers what arrives meanwhile).
        if let Some(groups) = self
            .cell_groups_inflight_max
            .filter(|g| *g == 0 || *g > CELL_GROUPS_INFLIGHT_CAP)
        {
            bail!(
                "publication.cell_groups_inflight_max = {groups}: it must be between 1 and \
                 {CELL_GROUPS_INFLIGHT_CAP}"
            );
        }
        if self.checkpoints_inflight_max == Some(0) {
            bail!("publication.checkpoints_inflight_max must be at least 1");
        }
        // A successor lists a dead lane whole: the budget, and the
        // segments collection keeps for its minimum age past it, must fit
        // one listing.
        let listing = cellfleet_nodelog::store::LANE_KEYS_MAX as u64;
        if let Some(segments) = self
            .replay_segments_max
            .filter(|s| *s == 0 || *s > listing / 2)
        {
            bail!(
                "publication.replay_segments_max = {segments}: it must be between 1 and {} \
                 (half of the {listing} keys a successor lists in a dead node's lane)",
                listing / 2
            );
        }
        Ok(())
    }

    fn log_settings(&self) -> LogSettings {
        let mut log = LogSettings::default();
        if let Some(lanes) = self.lanes {
            log.lanes = lanes;
        }
        if let Some(records) = self.checkpoint_records {
            log.checkpoint_records = records;
        }
        if let Some(idle) = self.checkpoint_idle_ms {
            log.checkpoint_idle_ms = idle;
        }
        if let Some(segments) = self.replay_segments_max {
            log.replay_segments_max = segments;
        }
        if let Some(inflight) = self.segments_inflight_max {
            log.segments_inflight_max = inflight;
        }
        if let Some(groups) = self.cell_groups_inflight_max {
            log.cell_groups_inflight_max = groups;
        }
        if let Some(commands) = self.batch_commands_min {
            log.batch_commands_min = commands;
        }
        if let Some(linger) = self.linger_ms {
            log.linger_ms = linger;
        }
        if let Some(bytes) = self.parked_bytes_max {
            log.parked_bytes_max = bytes;
        }
        if let Some(checkpoints) = self.checkpoints_inflight_max {
            log.checkpoints_inflight_max = checkpoints;
        }
        log
    }
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LimitsFile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cells_open_max: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cells_owned_max: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fds_max: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes_max: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cell_wal_bytes_max: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cell_cache_bytes_max: Option<u64>,
}

/// Bounds on `[limits] cell_wal_bytes_max`: below 64 KiB a Cell would fold
/// its WAL into its database after nearly every group; past 1 GiB one Cell
/// could hold that much disk beyond its data.
const CELL_WAL_BYTES_MIN: u64 = 64 << 10;
const CELL_WAL_BYTES_MAX: u64 = 1 << 30;

/// Bounds on `[limits] cell_cache_bytes_max`: below 64 KiB (16 pages of
/// 4 KiB) a Cell would read the pages of a b-tree's upper levels again for
/// nearly every statement; past 1 GiB one Cell could hold that much memory.
const CELL_CACHE_BYTES_MIN: u64 = 64 << 10;
const CELL_CACHE_BYTES_MAX: u64 = 1 << 30;

/// File descriptors kept for everything but open Cells (listeners,
/// connections, the store client, logs), plus a sixteenth of the limit
/// for files a Cell opens for a moment (activation, recovery, a WAL read)
/// and readers pinned past the budget while two groups publish. A node
/// owning 3,344 open Cells nobody read measured 13,686 descriptors: four
/// per Cell and about 350 for the rest.
fn fds_reserved(open_files: u64) -> u64 {
    256 + open_files / 16
}

impl LimitsFile {
    fn is_empty(&self) -> bool {
        *self == LimitsFile::default()
    }

    /// The node's limits: the file's values over the defaults, with
    /// `fds_max` capped by `open_files` (the soft open-file limit) less
    /// what the rest of the process needs. Unset, `cells_open_max` is
    /// `cells_owned_max` (descriptors and memory bound it) and
    /// `memory_bytes_max` half of `memory` (the machine's, where known).
    fn limits(&self, open_files: Option<u64>, memory: Option<u64>) -> (NodeLimits, Option<String>) {
        let mut limits = NodeLimits::default();
        if let Some(n) = self.cells_owned_max {
            limits.cells_owned_max = n;
        }
        limits.cells_open_max = self.cells_open_max.unwrap_or(limits.cells_owned_max);
        if let Some(n) = self.fds_max {
            limits.fds_max = n;
        }
        if let Some(n) = self.cell_wal_bytes_max {
            limits.cell_wal_bytes_max = n;
        }
        if let Some(n) = self.cell_cache_bytes_max {
            limits.cell_cache_bytes_max = n;
        }
        match (self.memory_bytes_max, memory) {
            (Some(n), _) => limits.memory_bytes_max = n,
            (None, Some(memory)) => limits.memory_bytes_max = (memory / 2).max(1),
            (None, None) => {}
        }
        let mut note = None;
        if let Some(open_files) = open_files {
            let usable = usize::try_from(open_files.saturating_sub(fds_reserved(open_files)))
                .unwrap_or(usize::MAX);
            // The default is capped quietly (the start line shows the
            // bounds); a setting the limit cannot cover is worth a word.
            if limits.fds_max > usable {
                if self.fds_max.is_some() {
                    note = Some(format!(
                        "fds_max {} is over what the open-file limit ({open_files}) leaves for Cells; using {usable} (raise `ulimit -n` or the service's LimitNOFILE)",
                        limits.fds_max
                    ));
                }
                limits.fds_max = usable;
            }
        }
        (limits, note)
    }

    fn validate(&self) -> anyhow::Result<()> {
        for (name, value) in [
            ("cells_open_max", self.cells_open_max),
            ("cells_owned_max", self.cells_owned_max),
            ("fds_max", self.fds_max),
        ] {
            if value == Some(0) {
                bail!("limits.{name} must be at least 1");
            }
        }
        if self.memory_bytes_max == Some(0) {
            bail!("limits.memory_bytes_max must be at least 1");
        }
        for (name, value, min, max) in [
            (
                "cell_wal_bytes_max",
                self.cell_wal_bytes_max,
                CELL_WAL_BYTES_MIN,
                CELL_WAL_BYTES_MAX,
            ),
            (
                "cell_cache_bytes_max",
                self.cell_cache_bytes_max,
                CELL_CACHE_BYTES_MIN,
                CELL_CACHE_BYTES_MAX,
            ),
        ] {
            if let Some(n) = value.filter(|n| !(min..=max).contains(n)) {
                bail!("limits.{name} {n}: give bytes between {min} and {max}");
            }
        }
        Ok(())
    }
}

/// The memory this process may use: the machine's (`MemTotal` of
/// `/proc/meminfo`), or its control group's limit where that is lower
/// (cgroup v2 `memory.max`, or v1 `memory.limit_in_bytes`). `None` where
/// neither can be read.
fn machine_memory() -> Option<u64> {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    let total = read("/proc/meminfo").and_then(|text| meminfo_total(&text));
    let group = read("/proc/self/cgroup")
        .and_then(|text| cgroup_v2_path(&text))
        .and_then(|path| read(&format!("/sys/fs/cgroup{path}/memory.max")))
        .or_else(|| read("/sys/fs/cgroup/memory.max"))
        .or_else(|| read("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
        .and_then(|text| cgroup_memory_limit(&text));
    match (total, group) {
        (Some(total), Some(group)) => Some(total.min(group)),
        (total, group) => total.or(group),
    }
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
fn meminfo_total(text: &str) -> Option<u64> {
    let line = text
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))?;
    let kib = line.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()?;
    kib.checked_mul(1024)
}

/// The process's cgroup v2 path (the `0::` line of `/proc/self/cgroup`).
fn cgroup_v2_path(text: &str) -> Option<String> {
    text.lines()
        .find_map(|line| line.strip_prefix("0::"))
        .map(|path| path.trim_end_matches('/').to_owned())
}

/// A control group's memory limit in bytes; `None` for `max` (no limit)
/// or anything else that is not a number.
fn cgroup_memory_limit(text: &str) -> Option<u64> {
    text.trim().parse::<u64>().ok()
}

/// Raises the soft open-file limit to the hard limit; returns the soft
/// limit before and after (`None` where unlimited or unknown).
fn raise_open_files() -> (Option<u64>, Option<u64>) {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let before = getrlimit(Resource::Nofile);
    if before.current != before.maximum {
        let raised = Rlimit {
            current: before.maximum,
            maximum: before.maximum,
        };
        if let Err(error) = setrlimit(Resource::Nofile, raised) {
            say!("cellfleet node: could not raise the open-file limit: {error}");
        }
    }
    (before.current, getrlimit(Resource::Nofile).current)
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GcFile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_age_ms: Option<u64>,
}

impl GcFile {
    fn settings(&self) -> cellfleet_runtime::GcSettings {
        let mut gc = cellfleet_runtime::GcSettings::default();
        if let Some(enabled) = self.enabled {
            gc.enabled = enabled;
        }
        if let Some(age) = self.min_age_ms {
            gc.min_age_ms = age;
        }
        gc
    }
}

/// The node config file.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NodeFile {
    pub node_id: String,
    pub data_dir: PathBuf,
    #[serde(default = "default_prefix")]
    pub prefix: String,
    pub listen: ListenFile,
    pub store: StoreFile,
    pub tls: TlsFile,
    pub keys: KeysFile,
    #[serde(default)]
    pub kinds: KindsFile,
    #[serde(default)]
    pub lease: LeaseFile,
    #[serde(default)]
    pub envelope: EnvelopeFile,
    #[serde(default)]
    pub publication: PublicationFile,
    #[serde(default, skip_serializing_if = "LimitsFile::is_empty")]
    pub limits: LimitsFile,
    #[serde(default, skip_serializing_if = "is_default_gc")]
    pub gc: GcFile,
    /// Serve and forward requests but take no Cells: the lease says so and
    /// every router leaves this node out of placement.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ingress_only: bool,
}

fn is_default_gc(gc: &GcFile) -> bool {
    gc.enabled.is_none() && gc.min_age_ms.is_none()
}

fn default_prefix() -> String {
    "cellfleet".into()
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn env_u64(name: &str) -> anyhow::Result<Option<u64>> {
    env(name)
        .map(|v| {
            v.parse::<u64>()
                .with_context(|| format!("{name}={v:?} is not a whole number of milliseconds"))
        })
        .transpose()
}

impl NodeFile {
    /// Reads `path`, applies the environment, resolves relative paths and validates.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| {
            format!(
                "cannot read the node config {}; create one (see `cellfleet dev` for examples)",
                path.display()
            )
        })?;
        let mut file: NodeFile =
            toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {}", path.display(), e))?;
        file.apply_env()?;
        let base = path.parent().unwrap_or(Path::new("."));
        file.resolve(base);
        file.validate()
            .with_context(|| format!("invalid node config {}", path.display()))?;
        Ok(file)
    }

    fn apply_env(&mut self) -> anyhow::Result<()> {
        let set = |target: &mut String, name: &str| {
            if let Some(v) = env(name) {
                *target = v;
            }
        };
        set(&mut self.node_id, "CELLFLEET_NODE_ID");
        set(&mut self.prefix, "CELLFLEET_PREFIX");
        set(&mut self.listen.client, "CELLFLEET_LISTEN_CLIENT");
        set(&mut self.listen.peer, "CELLFLEET_LISTEN_PEER");
        set(&mut self.listen.http, "CELLFLEET_LISTEN_HTTP");
        // The streams listener is optional: an empty value turns it off.
        if let Ok(v) = std::env::var("CELLFLEET_LISTEN_STREAMS") {
            self.listen.streams = (!v.is_empty()).then_some(v);
        }
        if let Some(v) = env("CELLFLEET_STREAMS_TLS") {
            self.listen.streams_tls = Some(v);
        }
        if let Some(v) = env("CELLFLEET_STREAMS_AUTH") {
            self.listen.streams_auth = Some(v);
        }
        // The console is optional too: an empty value turns it off.
        if let Ok(v) = std::env::var("CELLFLEET_LISTEN_CONSOLE") {
            self.listen.console = (!v.is_empty()).then_some(v);
        }
        if let Some(v) = env("CELLFLEET_CONSOLE_TLS") {
            self.listen.console_tls = Some(v);
        }
        if let Some(v) = env("CELLFLEET_DATA_DIR") {
            self.data_dir = v.into();
        }
        if let Some(v) = env("CELLFLEET_ADVERTISE_HOST") {
            self.listen.advertise_host = Some(v);
        }
        // One config for many nodes (a StatefulSet): each its own certificate.
        if let Some(v) = env("CELLFLEET_TLS_CERT") {
            self.tls.cert = v.into();
        }
        if let Some(v) = env("CELLFLEET_TLS_KEY") {
            self.tls.key = v.into();
        }
        if let Some(v) = env("CELLFLEET_STORE_DIR") {
            self.store = StoreFile {
                kind: "local".into(),
                dir: Some(v.into()),
                ..StoreFile::default()
            };
        }
        if let Some(bucket) = env("CELLFLEET_S3_BUCKET") {
            let from_env = S3Config::from_env(bucket.clone());
            self.store = StoreFile {
                kind: "s3".into(),
                bucket: Some(bucket),
                endpoint: from_env.endpoint,
                region: from_env.region,
                access_key: from_env.access_key,
                secret_key: from_env.secret_key,
                path_style: Some(from_env.path_style),
                dir: None,
            };
        }
        if let Some(v) = env("CELLFLEET_INGRESS_ONLY") {
            self.ingress_only = match v.as_str() {
                "1" | "true" => true,
                "0" | "false" => false,
                _ => bail!("CELLFLEET_INGRESS_ONLY={v:?} is not true/false/1/0"),
            };
        }
        if let Some(v) = env_u64("CELLFLEET_LEASE_MS")? {
            self.lease.lease_ms = v;
        }
        if let Some(v) = env_u64("CELLFLEET_RENEW_EVERY_MS")? {
            self.lease.renew_every_ms = v;
        }
        if let Some(v) = env("CELLFLEET_PUBLICATION_MODE") {
            self.publication.mode = Some(v);
        }
        if let Some(v) = env_u64("CELLFLEET_LOG_LANES")? {
            self.publication.lanes = Some(
                u16::try_from(v)
                    .map_err(|_| anyhow::anyhow!("CELLFLEET_LOG_LANES={v} is over 65535"))?,
            );
        }
        if let Some(v) = env("CELLFLEET_LOG_CHECKPOINT_RECORDS") {
            self.publication.checkpoint_records = Some(v.parse::<usize>().with_context(|| {
                format!("CELLFLEET_LOG_CHECKPOINT_RECORDS={v:?} is not a whole number of records")
            })?);
        }
        if let Some(v) = env_u64("CELLFLEET_LOG_SEGMENTS_INFLIGHT")? {
            self.publication.segments_inflight_max = Some(v);
        }
        if let Some(v) = env("CELLFLEET_LOG_BATCH_COMMANDS_MIN") {
            self.publication.batch_commands_min = Some(v.parse::<usize>().with_context(|| {
                format!("CELLFLEET_LOG_BATCH_COMMANDS_MIN={v:?} is not a whole number of commands")
            })?);
        }
        if let Some(v) = env_u64("CELLFLEET_LOG_LINGER_MS")? {
            self.publication.linger_ms = Some(v);
        }
        if let Some(v) = env_u64("CELLFLEET_LOG_CHECKPOINT_IDLE_MS")? {
            self.publication.checkpoint_idle_ms = Some(v);
        }
        if let Some(v) = env_u64("CELLFLEET_LOG_REPLAY_SEGMENTS_MAX")? {
            self.publication.replay_segments_max = Some(v);
        }
        if let Some(v) = env_u64("CELLFLEET_GC_MIN_AGE_MS")? {
            self.gc.min_age_ms = Some(v);
        }
        Ok(())
    }

    fn resolve(&mut self, base: &Path) {
        let join = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        join(&mut self.data_dir);
        if let Some(dir) = &mut self.store.dir {
            join(dir);
        }
        join(&mut self.tls.ca);
        join(&mut self.tls.cert);
        join(&mut self.tls.key);
        join(&mut self.keys.registry);
        for path in [&mut self.listen.streams_cert, &mut self.listen.streams_key]
            .into_iter()
            .flatten()
        {
            join(path);
        }
        if let Some(manifest) = &mut self.kinds.manifest {
            join(manifest);
        }
    }

    fn validate(&self) -> anyhow::Result<()> {
        NodeId::new(&self.node_id).map_err(|e| {
            anyhow::anyhow!(
                "node_id {:?}: {e} (letters, digits, '.', '_', '-')",
                self.node_id
            )
        })?;
        Layout::new(&self.prefix).map_err(|e| anyhow::anyhow!("prefix {:?}: {e}", self.prefix))?;
        for (name, value) in [
            ("listen.client", &self.listen.client),
            ("listen.peer", &self.listen.peer),
            ("listen.http", &self.listen.http),
        ] {
            value.parse::<SocketAddr>().map_err(|e| {
                anyhow::anyhow!("{name} = {value:?} is not an ip:port address ({e})")
            })?;
        }
        match self.store.kind.as_str() {
            "local" if self.store.dir.is_none() => {
                bail!("store.type = \"local\" needs store.dir (the shared store directory)")
            }
            "s3" if self.store.bucket.as_deref().is_none_or(str::is_empty) => {
                bail!(
                    "store.type = \"s3\" needs store.bucket (and store.endpoint for a non-AWS server)"
                )
            }
            "local" | "s3" => {}
            other => bail!("store.type = {other:?}: use \"local\" or \"s3\""),
        }
        self.lease_config()
            .validate()
            .map_err(|e| anyhow::anyhow!("[lease]: {e}"))?;
        if self.envelope.max_window_ms == 0 {
            bail!("envelope.max_window_ms must be positive");
        }
        self.limits.validate()?;
        if let StreamsTls::Files { cert, key } = self.listen.streams_tls()? {
            for (name, path) in [("listen.streams_cert", cert), ("listen.streams_key", key)] {
                if !path.is_file() {
                    bail!("{name} = {} does not exist", path.display());
                }
            }
        }
        self.listen.streams_tokens()?;
        self.listen.console_mtls()?;
        self.publication.validate()?;
        for (name, path) in [
            ("tls.ca", &self.tls.ca),
            ("tls.cert", &self.tls.cert),
            ("tls.key", &self.tls.key),
            ("keys.registry", &self.keys.registry),
        ] {
            if !path.is_file() {
                bail!(
                    "{name} = {} does not exist; create it with `cellfleet certs`/`cellfleet keys` or `cellfleet dev`",
                    path.display()
                );
            }
        }
        Ok(())
    }

    fn lease_config(&self) -> LeaseConfig {
        LeaseConfig {
            lease_ms: self.lease.lease_ms,
            renew_every_ms: self.lease.renew_every_ms,
            drift_margin_ms: self.lease.drift_margin_ms,
        }
    }

    fn store_config(&self) -> StoreConfig {
        match self.store.kind.as_str() {
            "s3" => {
                let mut config = S3Config::new(self.store.bucket.clone().unwrap_or_default());
                config.endpoint = self.store.endpoint.clone();
                config.region = self.store.region.clone();
                config.access_key = self.store.access_key.clone();
                config.secret_key = self.store.secret_key.clone();
                config.path_style = self.store.path_style.unwrap_or(config.endpoint.is_some());
                StoreConfig::S3(config)
            }
            _ => StoreConfig::Local {
                dir: self.store.dir.clone().unwrap_or_default(),
            },
        }
    }
}

pub fn run(args: NodeArgs) -> anyhow::Result<ExitCode> {
    init_logging();
    let file = NodeFile::load(&args.config)?;
    if args.check_config {
        let summary =
            check_config(&file).with_context(|| format!("config {}", args.config.display()))?;
        println!("config {}: OK", args.config.display());
        for line in summary {
            println!("  {line}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(serve(file, args.accept_kinds_change))
}

/// The default log filter: warnings from everything, and Cellfleet's own
/// events (fenced publications, lease renewals that failed, takeovers,
/// refused handshakes) from `info` up.
const LOG_DEFAULT: &str = "warn,cellfleet=info";

/// Sends the node's `tracing` events to stderr, filtered by `CELLFLEET_LOG`
/// (an env-filter directive list such as `debug` or
/// `warn,cellfleet_runtime=debug`; default [`LOG_DEFAULT`]). A directive
/// that does not parse is reported and the default used.
fn init_logging() {
    use std::io::IsTerminal;
    let filter = match std::env::var("CELLFLEET_LOG") {
        Ok(directives) => tracing_subscriber::EnvFilter::try_new(&directives).unwrap_or_else(|e| {
            say!("CELLFLEET_LOG={directives:?} does not parse ({e}); logging with {LOG_DEFAULT:?}");
            tracing_subscriber::EnvFilter::new(LOG_DEFAULT)
        }),
        Err(_) => tracing_subscriber::EnvFilter::new(LOG_DEFAULT),
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// Creates or checks `{prefix}/cluster.json`; an error (the node must not
/// start) names every difference.
async fn check_cluster_record(
    store: &Arc<dyn cellfleet_store::ObjectStore>,
    file: &NodeFile,
    manifest: Option<&cellfleet_cell::Manifest>,
    page_size: u32,
    accept_kinds_change: bool,
) -> anyhow::Result<()> {
    let layout = Layout::new(&file.prefix)?;
    let digest = match manifest {
        Some(manifest) => manifest.digest(),
        None => cellfleet_cell::Manifest::parse("")
            .context("the empty kinds manifest")?
            .digest(),
    };
    let now_ms = SystemClock.now_wall_ms();
    let ours = ClusterRecord::new(&layout, &digest, page_size, now_ms);
    let key = layout.cluster_key();
    let manifest_path = file
        .kinds
        .manifest
        .as_ref()
        .map_or_else(|| "none".to_owned(), |p| p.display().to_string());
    let check = check_cluster(store, &layout, &ours, accept_kinds_change)
        .await
        .with_context(|| format!("cannot check the cluster record {key}"))?;
    match check {
        ClusterCheck::Created(_) => {
            say!(
                "cellfleet node {}: created the cluster record {key} (kinds digest {digest})",
                file.node_id
            );
        }
        ClusterCheck::Agrees(_) => {}
        ClusterCheck::KindsChanged {
            previous_digest, ..
        } => {
            say!(
                "cellfleet node {}: the cluster's kinds changed from digest {previous_digest} to {digest} \
                 (--accept-kinds-change); restart every other node with the manifest {manifest_path}",
                file.node_id
            );
        }
        ClusterCheck::Refused { mismatches, .. } => {
            let only_kinds = mismatches
                .iter()
                .all(|m| matches!(m, Mismatch::KindsDigest { .. }));
            let reasons: Vec<String> = mismatches.iter().map(ToString::to_string).collect();
            let next = if only_kinds {
                format!(
                    "use the same kinds manifest as the other nodes (this node's: {manifest_path}), \
                     or, to change the cluster's kinds, put the new manifest on every node and \
                     start one node with `cellfleet node --accept-kinds-change`"
                )
            } else {
                "data written under another prefix or page size would be invisible to this node; \
                 check prefix (CELLFLEET_PREFIX) and the store"
                    .to_owned()
            };
            bail!(
                "{key}: {}; this node refuses to start: {next}",
                reasons.join("; ")
            );
        }
    }
    Ok(())
}

/// Holds `data_dir/node.lock` for the life of the process (released by the
/// OS when it exits, however it exits).
fn lock_data_dir(dir: &std::path::Path) -> anyhow::Result<std::fs::File> {
    match crate::dir_lock::try_lock(&dir.join("node.lock"))? {
        Some(file) => Ok(file),
        None => bail!(
            "another cellfleet node is running on data_dir {}; stop it, or give this node \
             its own data_dir (CELLFLEET_DATA_DIR)",
            dir.display()
        ),
    }
}

fn advertised(addr: SocketAddr, host: Option<&str>) -> String {
    match host {
        Some(host) => format!("{host}:{}", addr.port()),
        None => addr.to_string(),
    }
}

/// The kinds manifest (if the config names one) and the kinds it serves,
/// the built-in ones included.
fn load_kinds(file: &NodeFile) -> anyhow::Result<(Option<cellfleet_cell::Manifest>, Kinds)> {
    let manifest = match &file.kinds.manifest {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the kinds manifest {}", path.display()))?;
            Some(
                cellfleet_cell::Manifest::parse(&text)
                    .with_context(|| format!("kinds manifest {}", path.display()))?,
            )
        }
        None => None,
    };
    let kinds = cellfleet_streams::with_kinds(match &manifest {
        Some(manifest) => Kinds::from_manifest(manifest).context("kinds manifest")?,
        None => Kinds::builtin(),
    })
    .context("kinds manifest")?;
    Ok((manifest, kinds))
}

/// The node's TLS identity, refused unless its certificate is this node's.
fn load_identity(file: &NodeFile) -> anyhow::Result<TlsIdentity> {
    let identity = TlsIdentity::load(&file.tls.ca, &file.tls.cert, &file.tls.key)
        .context("node certificate")?;
    match identity.role().context("node certificate")? {
        cellfleet_router::certs::Role::Node(id) if id == file.node_id => Ok(identity),
        role => bail!(
            "the certificate {} is for {}, not node {:?}; issue one with `cellfleet certs issue node {}`",
            file.tls.cert.display(),
            role.uri(),
            file.node_id,
            file.node_id
        ),
    }
}

/// The streams listener's TLS from its own certificate and key files.
fn streams_tls_files(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let (chain, key) = tls::load_chain(cert, key).context("listen.streams_cert/streams_key")?;
    tls::public_server_config(chain, key).context("listen.streams_cert/streams_key")
}

/// What `--check-config` checks (see [`NodeArgs::check_config`]), as
/// summary lines; the first failure is the error.
fn check_config(file: &NodeFile) -> anyhow::Result<Vec<String>> {
    let mut summary = Vec::new();
    NodeId::new(&file.node_id).map_err(|e| anyhow::anyhow!("node_id: {e}"))?;
    summary.push(format!("node {} (prefix {:?})", file.node_id, file.prefix));
    let listeners = [
        ("listen.client", Some(&file.listen.client)),
        ("listen.peer", Some(&file.listen.peer)),
        ("listen.http", Some(&file.listen.http)),
        ("listen.streams", file.listen.streams.as_ref()),
        ("listen.console", file.listen.console.as_ref()),
    ];
    let mut shown = Vec::new();
    for (name, address) in listeners {
        let Some(address) = address else { continue };
        address
            .parse::<cellfleet_client::transport::HostPort>()
            .map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
        shown.push(format!("{} {address}", name.trim_start_matches("listen.")));
    }
    summary.push(format!("listeners: {}", shown.join(", ")));
    summary.push(match file.store_config() {
        StoreConfig::S3(config) => format!(
            "store: S3 bucket {:?} at {} (not contacted: `cellfleet store probe` checks it)",
            config.bucket,
            config
                .endpoint
                .as_deref()
                .unwrap_or("the AWS default endpoint")
        ),
        StoreConfig::Local { dir } => format!("store: local directory {}", dir.display()),
        StoreConfig::Memory => "store: memory".to_owned(),
    });
    let (_, kinds) = load_kinds(file)?;
    let mut names: Vec<&str> = kinds.names().collect();
    names.sort_unstable();
    summary.push(format!(
        "kinds: {} ({})",
        names.join(", "),
        file.kinds
            .manifest
            .as_ref()
            .map_or("built-in only".to_owned(), |p| format!(
                "manifest {}",
                p.display()
            ))
    ));
    load_identity(file)?
        .check_chain()
        .context("node certificate")?;
    summary.push(format!(
        "certificate {} is node {}'s, chained to {}",
        file.tls.cert.display(),
        file.node_id,
        file.tls.ca.display()
    ));
    let registry = KeyRegistry::load(&file.keys.registry)?;
    summary.push(format!(
        "key registry {}: {} key(s)",
        file.keys.registry.display(),
        registry.len()
    ));
    if file.listen.streams.is_some() {
        let tls = match file.listen.streams_tls()? {
            StreamsTls::None => "plain HTTP".to_owned(),
            StreamsTls::Node => "HTTPS with the node certificate".to_owned(),
            StreamsTls::Files { cert, key } => {
                streams_tls_files(&cert, &key)?;
                format!("HTTPS with {}", cert.display())
            }
        };
        let auth = if file.listen.streams_tokens()? {
            "bearer tokens"
        } else {
            "no auth"
        };
        summary.push(format!("streams: {tls}, {auth}"));
    }
    if file.listen.console.is_some() {
        summary.push(if file.listen.console_mtls()? {
            "console: HTTPS with the node certificate, cluster-CA client certificates required"
                .to_owned()
        } else {
            "console: plain HTTP, no client certificates (development only)".to_owned()
        });
    }
    summary.push(match file.publication.mode()? {
        PublicationMode::Log => {
            let log = file.publication.log_settings();
            format!(
                "publication mode log: {} lane(s); a Cell checkpoints after {} records, {} ms without one, or {} segments of its lane past its root; at most {} checkpoints in flight; at most {} group(s) of a Cell in flight",
                log.lanes, log.checkpoint_records, log.checkpoint_idle_ms, log.replay_segments_max, log.checkpoints_inflight_max, log.cell_groups_inflight_max
            )
        }
        PublicationMode::Cell => {
            let ignored = file.publication.ignored_in_cell_mode()?;
            if ignored.is_empty() {
                "publication mode cell: one root CAS per group".to_owned()
            } else {
                format!(
                    "publication mode cell: one root CAS per group; ignored in this mode \
                     (they apply to mode = \"log\"): {}",
                    ignored.join(", ")
                )
            }
        }
    });
    Ok(summary)
}

async fn serve(file: NodeFile, accept_kinds_change: bool) -> anyhow::Result<ExitCode> {
    let node_id = NodeId::new(&file.node_id).map_err(|e| anyhow::anyhow!("{e}"))?;
    // The store first: a bucket that does not honour conditional writes
    // must never hold a lease or a root.
    let (store, report) = open_probed_store(&file).await?;
    let (manifest, kinds) = load_kinds(&file)?;
    // The page size every Cell is created with (NodeConfig::new uses the default).
    let page_size = cellfleet_cell::CellConfig::default().page_size;
    check_cluster_record(
        &store,
        &file,
        manifest.as_ref(),
        page_size,
        accept_kinds_change,
    )
    .await?;
    let identity = load_identity(&file)?;
    let registry = Arc::new(KeyRegistry::load(&file.keys.registry)?);
    let listeners = bind_listeners(&file).await?;
    let host = file.listen.advertise_host.as_deref();
    let endpoints = lease_endpoints(
        &advertised(listeners.client.local_addr()?, host),
        &advertised(listeners.peer.local_addr()?, host),
        &advertised(listeners.http.local_addr()?, host),
    );
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let config = node_config(&file, node_id, endpoints)?;
    std::fs::create_dir_all(&file.data_dir)
        .with_context(|| format!("cannot create data_dir {}", file.data_dir.display()))?;
    // Two processes on one data_dir would write the same SQLite files.
    let _data_dir_lock = lock_data_dir(&file.data_dir)?;
    let node = Node::start(config, store.clone(), clock.clone(), Arc::new(kinds))
        .await
        .context("cannot take the node lease")?;
    // From here on, every bucket request is counted in the node's metrics.
    let store = node.store();
    let layout = Layout::new(&file.prefix)?;
    let router = router(&file, &node, &store, &layout, clock, &registry, &identity)?;
    let drain = Arc::new(DrainState::default());
    let server = NodeServer::start(
        listeners,
        &identity,
        router.clone(),
        store,
        layout,
        drain.clone(),
    )?;
    // Kept alive until this function returns; dropping it stops the listener.
    let (_streams_stop, streams_stopped) = tokio::sync::watch::channel(false);
    if let Some(address) = &file.listen.streams {
        start_streams(
            &file,
            address,
            &identity,
            &registry,
            &router,
            streams_stopped,
        )
        .await?;
    }
    announce_console_and_role(&file, server.console_addr)?;
    // Listening from before the ready line: a SIGTERM sent as soon as a
    // supervisor reads it drains the node (before, the handler was
    // installed after the line, and such a signal killed the process).
    let shutdown = crate::signals::shutdown_signal();
    println!(
        "cellfleet node {} ready client={} peer={} http={} store={}",
        file.node_id, server.client_addr, server.peer_addr, server.http_addr, report.store
    );
    use std::io::Write;
    let _ = std::io::stdout().flush();

    wait_then_drain(&file, &node, server, &drain, shutdown).await
}

/// Binds every listener the file names (the console only if it names one).
async fn bind_listeners(file: &NodeFile) -> anyhow::Result<Listeners> {
    Ok(Listeners {
        client: bind(&file.listen.client, "listen.client").await?,
        peer: bind(&file.listen.peer, "listen.peer").await?,
        http: bind(&file.listen.http, "listen.http").await?,
        console: match &file.listen.console {
            Some(address) => Some(ConsoleListener {
                listener: bind(address, "listen.console").await?,
                mtls: file.listen.console_mtls()?,
            }),
            None => None,
        },
    })
}

/// The runtime's configuration from the file, saying on stderr which
/// `[publication]` settings the mode ignores and the bounds in force.
fn node_config(
    file: &NodeFile,
    node_id: NodeId,
    endpoints: cellfleet_authority::Endpoints,
) -> anyhow::Result<NodeConfig> {
    let mut config = NodeConfig::new(node_id, &file.data_dir, &file.prefix);
    config.lease = file.lease_config();
    config.endpoints = endpoints;
    config.ingress_only = file.ingress_only;
    config.publication = file.publication.mode()?;
    let ignored = file.publication.ignored_in_cell_mode()?;
    if !ignored.is_empty() {
        say!(
            "cellfleet node {}: warning: publication mode cell ignores [publication] {} (they apply to \
             mode = \"log\")",
            file.node_id,
            ignored.join(", ")
        );
    }
    config.log = file.publication.log_settings();
    config.gc = file.gc.settings();
    config.limits = node_limits(file, config.readers_per_cell_max());
    config.cell.validity_ms_max = validity_ms_max(file);
    Ok(config)
}

/// How far in the future a command's expiry may lie when its Cell runs
/// it: the longest window the router admits (`[envelope] max_window_ms`,
/// counted from an `issued_at_ms` up to `skew_ms` ahead of the ingress
/// node's clock), plus `[lease] drift_margin_ms` for the owner's clock
/// running behind the ingress node's. Anything the router admits, the
/// Cell runs; and the ledger keeps an entry no longer than this plus its
/// skew margin past its run.
fn validity_ms_max(file: &NodeFile) -> i64 {
    let ms = file
        .envelope
        .max_window_ms
        .saturating_add(file.envelope.skew_ms)
        .saturating_add(file.lease.drift_margin_ms);
    i64::try_from(ms).unwrap_or(i64::MAX)
}

/// The request router over the started node: roots and leases read from
/// the store, envelopes verified against the key registry, peers reached
/// over mTLS with the node's identity.
fn router(
    file: &NodeFile,
    node: &cellfleet_runtime::NodeHandle,
    store: &Arc<dyn cellfleet_store::ObjectStore>,
    layout: &Layout,
    clock: Arc<dyn Clock>,
    registry: &Arc<KeyRegistry>,
    identity: &TlsIdentity,
) -> anyhow::Result<Arc<Router>> {
    let roots = Roots::new(
        store.clone(),
        layout.clone(),
        clock.clone(),
        file.lease.drift_margin_ms,
    );
    let leases = NodeLeases::new(
        store.clone(),
        layout.clone(),
        clock.clone(),
        file.lease_config(),
    )?;
    let policy = EnvelopePolicy {
        skew_ms: file.envelope.skew_ms,
        max_window_ms: file.envelope.max_window_ms,
        ..EnvelopePolicy::default()
    };
    let verifier = Verifier::new(registry.clone(), policy, clock.clone())
        .counting_into(node.metrics().signatures_verified_total.clone());
    let peer_tls = tls::client_config(identity)?;
    Ok(Arc::new(
        Router::new(node.clone(), verifier, roots, leases, clock, peer_tls)
            .with_node_kinds(cellfleet_streams::ROUTED_KINDS.iter().copied()),
    ))
}

/// Opens the node's store and runs the start-up probe on it: a store that
/// fails a check is refused, naming it.
async fn open_probed_store(
    file: &NodeFile,
) -> anyhow::Result<(
    Arc<dyn cellfleet_store::ObjectStore>,
    cellfleet_store::probe::ProbeReport,
)> {
    let store_config = file.store_config();
    let store = cellfleet_store::open(&store_config)
        .await
        .with_context(|| format!("cannot open the store {store_config:?}"))?;
    let report = cellfleet_store::probe::run(store.clone(), &file.prefix, PROBE_WRITERS).await;
    if let Some((check, observed)) = report.failure() {
        bail!(
            "the store failed the start-up probe at check {:?} ({}): {observed}; \
             this node refuses to start (run `cellfleet store probe` for the full report)",
            check.name(),
            check.meaning()
        );
    }
    Ok((store, report))
}

/// The node's bounds from `[limits]` and the open-file limit (raised to
/// its hard limit first), and a line on stderr that says them, for Cells
/// that each hold up to `readers_per_cell` readers.
fn node_limits(file: &NodeFile, readers_per_cell: usize) -> NodeLimits {
    let (open_files_before, open_files) = raise_open_files();
    let memory = machine_memory();
    let (limits, note) = file.limits.limits(open_files, memory);
    if let Some(note) = note {
        say!("cellfleet node {}: {note}", file.node_id);
    }
    let show = |limit: Option<u64>| limit.map_or("unlimited".to_owned(), |n| n.to_string());
    let raised = if open_files_before == open_files {
        String::new()
    } else {
        format!(" (raised from {})", show(open_files_before))
    };
    let of_memory = match (file.limits.memory_bytes_max, memory) {
        (None, Some(memory)) => format!(", half of the machine's {memory}"),
        _ => String::new(),
    };
    say!(
        "cellfleet node {}: open files {}{raised}; cells open at most {} (cells_open_max {}, fds_max {} / {} per cell and {} per reader, memory_bytes_max {}{of_memory} / {} per cell with {} page caches), owned at most {}; a cell's WAL at most {} bytes, its page cache at most {} bytes per connection",
        file.node_id,
        show(open_files),
        limits.effective_cells_open_max(readers_per_cell),
        limits.cells_open_max,
        limits.fds_max,
        limits.fds_per_cell,
        limits.fds_per_reader,
        limits.memory_bytes_max,
        limits.memory_bytes_per_open_cell(readers_per_cell),
        readers_per_cell + 1,
        limits.cells_owned_max,
        limits.cell_wal_bytes_max,
        limits.cell_cache_bytes_max
    );
    limits
}

/// Starts the Durable Streams listener on `address` (TLS and tokens as
/// `[listen]` says, with a warning for each one turned off); streams owned
/// elsewhere are routed to their owner. It stops when `stopped` changes.
async fn start_streams(
    file: &NodeFile,
    address: &str,
    identity: &TlsIdentity,
    registry: &Arc<KeyRegistry>,
    router: &Arc<Router>,
    streams_stopped: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let listener = bind(address, "listen.streams").await?;
    let mut config = cellfleet_streams::StreamsConfig::default();
    if let Some(ms) = file.listen.streams_long_poll_ms {
        config.long_poll_timeout = std::time::Duration::from_millis(ms);
    }
    config.allow_loopback_webhooks = file.listen.streams_allow_loopback_webhooks.unwrap_or(false);
    let address = listener.local_addr()?;
    let scheme = match file.listen.streams_tls()? {
        StreamsTls::None => {
            say!(
                "cellfleet node {}: warning: the streams listener {address} is plain HTTP \
                 (listen.streams_tls = \"none\"); tokens and data cross the network unencrypted",
                file.node_id
            );
            "http"
        }
        StreamsTls::Node => {
            config.tls = Some(
                tls::public_server_config(identity.chain.clone(), identity.key.clone_key())
                    .context("streams listener certificate")?,
            );
            "https"
        }
        StreamsTls::Files { cert, key } => {
            config.tls = Some(streams_tls_files(&cert, &key)?);
            "https"
        }
    };
    if file.listen.streams_tokens()? {
        config.auth = cellfleet_streams::StreamsAuth::Tokens {
            keys: Arc::new(crate::stream_route::RegistryTokens::new(registry.clone())),
            skew_ms: i64::try_from(file.envelope.skew_ms).unwrap_or(i64::MAX),
        };
    } else {
        say!(
            "cellfleet node {}: warning: streams_auth = \"none\": anyone who reaches {address} \
             may read, append to, create and delete every stream (local development only)",
            file.node_id
        );
    }
    println!(
        "cellfleet node {} streams={scheme}://{address}",
        file.node_id,
    );
    // Requests for streams owned elsewhere are routed to their owner.
    let backend = Arc::new(crate::stream_route::RoutedBackend::new(router.clone()));
    let streams = cellfleet_streams::Streams::with_backend(backend, config);
    tokio::spawn(streams.serve(listener, streams_stopped));
    Ok(())
}

/// Prints the console's address (warning when it is plain HTTP) and
/// whether this node is ingress-only.
fn announce_console_and_role(file: &NodeFile, console: Option<SocketAddr>) -> anyhow::Result<()> {
    if let Some(address) = console {
        let mtls = file.listen.console_mtls()?;
        if !mtls {
            say!(
                "cellfleet node {}: warning: the console {address} is plain HTTP without client \
                 certificates (listen.console_tls = \"none\"): anyone who reaches it sees the \
                 cluster's leases and Cells (local development only)",
                file.node_id
            );
        }
        println!(
            "cellfleet node {} console={}://{address}/ui/",
            file.node_id,
            if mtls { "https" } else { "http" }
        );
    }
    if file.ingress_only {
        println!(
            "cellfleet node {}: ingress-only (serves and forwards; no Cells are placed here)",
            file.node_id
        );
    }
    Ok(())
}

/// Serves until a signal (drain the node, retire its lease; exit 1 if
/// the session had already ended or the drain failed) or an admin drain.
async fn wait_then_drain(
    file: &NodeFile,
    node: &cellfleet_runtime::NodeHandle,
    server: NodeServer,
    drain: &Arc<DrainState>,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<ExitCode> {
    let drained_by_admin = drain.drained.notified();
    tokio::pin!(drained_by_admin);
    tokio::select! {
        _ = shutdown => {
            if let Some(reason) = node.lease().stop_reason() {
                // Nothing is left to drain: the session's Cells have moved,
                // and its lease is no longer its own to retire.
                server.shutdown().await;
                say!(
                    "cellfleet node {}: stopped without draining: this node's session had already ended \
                     ({reason}); its cells moved to other nodes, nothing was lost",
                    file.node_id
                );
                return Ok(ExitCode::from(1));
            }
            say!("cellfleet node {}: draining", file.node_id);
            drain.draining.store(true, Ordering::SeqCst);
            let result = tokio::spawn({
                let node = node.clone();
                async move { node.drain().await }
            })
            .await?;
            server.shutdown().await;
            match result {
                Ok(released) => {
                    say!("cellfleet node {}: drained, {released} cells released, lease retired", file.node_id);
                    Ok(ExitCode::SUCCESS)
                }
                Err(error) => {
                    say!("cellfleet node {}: drain failed: {error}; cells not released move after the lease expires", file.node_id);
                    Ok(ExitCode::from(1))
                }
            }
        }
        _ = &mut drained_by_admin => {
            say!("cellfleet node {}: drained by an admin request", file.node_id);
            server.shutdown().await;
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn bind(address: &str, name: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(address)
        .await
        .with_context(|| format!("cannot listen on {name} = {address}; is the port in use?"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Cell's WAL and page cache bounds: each has its default, takes
    /// a value in its range from the file, and refuses one outside it,
    /// naming the key and the range.
    #[test]
    fn a_cells_bounds_are_taken_from_the_file_within_their_ranges() {
        type Set = fn(&mut LimitsFile, u64);
        type Get = fn(&NodeLimits) -> u64;
        let bounds: [(&str, Set, Get, u64, u64, u64, u64); 2] = [
            (
                "cell_wal_bytes_max",
                |file, n| file.cell_wal_bytes_max = Some(n),
                |limits| limits.cell_wal_bytes_max,
                1 << 20,
                128 << 10,
                CELL_WAL_BYTES_MIN,
                CELL_WAL_BYTES_MAX,
            ),
            (
                "cell_cache_bytes_max",
                |file, n| file.cell_cache_bytes_max = Some(n),
                |limits| limits.cell_cache_bytes_max,
                256 << 10,
                2 << 20,
                CELL_CACHE_BYTES_MIN,
                CELL_CACHE_BYTES_MAX,
            ),
        ];
        for (key, set, get, default, good, min, max) in bounds {
            let (limits, _) = LimitsFile::default().limits(None, None);
            assert_eq!(get(&limits), default, "{key}'s default");
            let mut file = LimitsFile::default();
            set(&mut file, good);
            file.validate().expect("in range");
            assert_eq!(get(&file.limits(None, None).0), good, "{key}");
            for bad in [0, min - 1, max + 1] {
                let mut file = LimitsFile::default();
                set(&mut file, bad);
                let error = file.validate().expect_err("out of range").to_string();
                assert_eq!(
                    error,
                    format!("limits.{key} {bad}: give bytes between 65536 and 1073741824")
                );
            }
        }
    }

    #[test]
    fn limits_take_the_file_over_the_defaults_and_fit_the_open_file_limit() {
        let file = LimitsFile {
            cells_open_max: Some(50_000),
            fds_max: Some(1_000_000),
            ..LimitsFile::default()
        };
        let (limits, note) = file.limits(Some(65_536), None);
        assert_eq!(limits.cells_open_max, 50_000);
        assert_eq!(
            limits.fds_max,
            65_536 - 256 - 4_096,
            "capped by the open-file limit"
        );
        assert!(note.unwrap().contains("fds_max 1000000 is over"));
        assert_eq!(
            limits.effective_cells_open_max(1),
            (4 << 30) / (1_152 << 10),
            "4 GiB of memory (no machine memory known) at 1,152 KiB per Cell is the tightest bound"
        );
        let (limits, note) = LimitsFile::default().limits(None, None);
        assert_eq!(limits.fds_max, NodeLimits::default().fds_max, "unlimited");
        assert_eq!(
            limits.memory_bytes_max,
            NodeLimits::default().memory_bytes_max
        );
        assert_eq!(limits.cells_open_max, limits.cells_owned_max);
        assert!(note.is_none());
        // The default is fitted to a smaller open-file limit without a
        // warning (the start line shows the resulting bounds), and the
        // memory is half of the machine's.
        const GIB: u64 = 1 << 30;
        let (limits, note) = LimitsFile::default().limits(Some(20_000), Some(24 * GIB));
        assert_eq!(limits.fds_max, 20_000 - 256 - 1_250);
        assert_eq!(limits.memory_bytes_max, 12 * GIB);
        assert_eq!(
            limits.effective_cells_open_max(1),
            (20_000 - 256 - 1_250) / 2,
            "descriptors at 2 per Cell are the tightest bound"
        );
        assert!(note.is_none());
        let (limits, _) = LimitsFile::default().limits(Some(1 << 20), Some(2 * GIB));
        assert_eq!(
            limits.effective_cells_open_max(1),
            (1 << 30) / (1_152 << 10),
            "a 2 GiB machine: 1 GiB for Cells at 1,152 KiB each"
        );
        // A file's values win over the machine's, and an unset
        // cells_open_max follows cells_owned_max.
        let file = LimitsFile {
            cells_owned_max: Some(500),
            memory_bytes_max: Some(3 * GIB),
            ..LimitsFile::default()
        };
        let (limits, _) = file.limits(Some(1 << 20), Some(24 * GIB));
        assert_eq!(limits.memory_bytes_max, 3 * GIB);
        assert_eq!(limits.cells_open_max, 500);
        assert_eq!(limits.effective_cells_open_max(1), 500);
        let (limits, _) = LimitsFile::default().limits(Some(8_000), Some(24 * GIB));
        assert_eq!(limits.effective_cells_open_max(1), (8_000 - 256 - 500) / 2);
        assert!(LimitsFile {
            cells_owned_max: Some(0),
            ..LimitsFile::default()
        }
        .validate()
        .is_err());
    }

    #[test]
    fn the_machine_memory_is_read_from_meminfo_and_the_control_group() {
        let meminfo = "MemTotal:       24683524 kB\nMemFree:        21999104 kB\n";
        assert_eq!(meminfo_total(meminfo), Some(24_683_524 * 1024));
        assert_eq!(meminfo_total("MemFree: 1 kB\n"), None);
        assert_eq!(meminfo_total("MemTotal: lots kB\n"), None);
        assert_eq!(meminfo_total("MemTotal: 99999999999999999999 kB\n"), None);
        assert_eq!(
            cgroup_v2_path("12:pids:/x\n0::/system.slice/cellfleet.service\n").as_deref(),
            Some("/system.slice/cellfleet.service")
        );
        assert_eq!(cgroup_v2_path("0::/\n").as_deref(), Some(""));
        assert_eq!(cgroup_v2_path("4:memory:/x\n"), None);
        assert_eq!(cgroup_memory_limit("max\n"), None);
        assert_eq!(cgroup_memory_limit("2147483648\n"), Some(2 << 30));
        assert_eq!(cgroup_memory_limit(""), None);
        // This machine has some memory, and the answer is not more than
        // meminfo says.
        let total = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|text| meminfo_total(&text));
        if let Some(total) = total {
            let memory = machine_memory().expect("meminfo is readable");
            assert!(memory > 0 && memory <= total, "{memory} of {total}");
        }
    }
}
