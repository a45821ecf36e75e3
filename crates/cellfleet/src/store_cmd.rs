//! `cellfleet store probe`: does this bucket (or directory) honour
//! conditional writes? A store that fails any check must not hold a
//! cluster's data. `cellfleet store export`: one Cell's database, rebuilt
//! from its authority root and LTX chain in the store, as a SQLite file.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context};
use cellfleet_authority::{CellId, Layout, RootRecord};
use cellfleet_store::probe::{self, Verdict};
use cellfleet_store::{ObjectStore, S3Config, StoreConfig};
use clap::{Args, Subcommand};
use serde::Serialize;

#[derive(Debug, Subcommand)]
pub enum StoreCommand {
    /// Check that a store honours create-only and compare-and-swap writes,
    /// range reads and read-after-write, and that exactly one of N racing
    /// writers wins. Exits 1 naming the first failed check.
    Probe(ProbeArgs),
    /// Write one Cell's published state as a SQLite file: its root and LTX
    /// chain are read from the store (no node needed), replayed, and the
    /// result checked against the root's TXID and checksum.
    Export(ExportArgs),
}

#[derive(Debug, Args)]
pub struct ProbeArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// Key prefix under which the probe writes (and then removes) its objects.
    #[arg(long, default_value = "")]
    prefix: String,
    /// Concurrent writers in the race checks (small: some servers delay the
    /// losers of a contended key by seconds).
    #[arg(long, default_value_t = probe::DEFAULT_RACE_WRITERS)]
    writers: usize,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// The Cell's kind.
    kind: String,
    /// The Cell's key.
    key: String,
    /// The SQLite file to write (must not exist).
    #[arg(long)]
    out: PathBuf,
    /// The cluster's key prefix in the store.
    #[arg(long, default_value = "cellfleet", env = "CELLFLEET_PREFIX")]
    prefix: String,
    #[command(flatten)]
    store: StoreArgs,
}

/// Which store: a local directory, or an S3 bucket.
#[derive(Debug, Args)]
pub struct StoreArgs {
    /// The embedded local-directory store in DIR instead of S3 (it wins
    /// over S3 settings, which may come from CELLFLEET_S3_* in the
    /// environment).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// S3 endpoint URL (for RustFS, MinIO, SeaweedFS); omit for AWS S3.
    #[arg(long, env = "CELLFLEET_S3_ENDPOINT")]
    endpoint: Option<String>,
    /// The bucket to probe.
    #[arg(long, env = "CELLFLEET_S3_BUCKET")]
    bucket: Option<String>,
    /// Region (default: the AWS chain's, else us-east-1).
    #[arg(long, env = "CELLFLEET_S3_REGION")]
    region: Option<String>,
    /// Static access key id (default: the AWS environment/profile chain).
    #[arg(long, env = "CELLFLEET_S3_ACCESS_KEY", hide_env_values = true)]
    access_key: Option<String>,
    /// Static secret key.
    #[arg(long, env = "CELLFLEET_S3_SECRET_KEY", hide_env_values = true)]
    secret_key: Option<String>,
    /// Virtual-host addressing instead of path style (path style is the
    /// default when an endpoint is given).
    #[arg(long)]
    virtual_host: bool,
}

#[derive(Debug, Serialize)]
struct CheckView {
    check: &'static str,
    verdict: &'static str,
    observed: Option<String>,
    meaning: Option<&'static str>,
}

#[derive(Debug, Serialize)]
struct ReportView {
    store: String,
    passed: bool,
    checks: Vec<CheckView>,
}

pub fn run(command: StoreCommand) -> anyhow::Result<ExitCode> {
    match command {
        StoreCommand::Probe(args) => probe_store(&args),
        StoreCommand::Export(args) => export_cell(&args),
    }
}

fn store_config(args: &StoreArgs) -> anyhow::Result<StoreConfig> {
    if let Some(dir) = &args.dir {
        return Ok(StoreConfig::Local { dir: dir.clone() });
    }
    let Some(bucket) = args.bucket.clone() else {
        bail!(
            "say which store: --dir DIR, or --bucket B (with --endpoint URL for a non-AWS server)"
        );
    };
    let mut config = S3Config::new(bucket);
    config.endpoint = args.endpoint.clone();
    config.region = args.region.clone();
    config.access_key = args.access_key.clone();
    config.secret_key = args.secret_key.clone();
    config.path_style = config.endpoint.is_some() && !args.virtual_host;
    Ok(StoreConfig::S3(config))
}

fn probe_store(args: &ProbeArgs) -> anyhow::Result<ExitCode> {
    let config = store_config(&args.store)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let report = runtime.block_on(async {
        let store: Arc<dyn ObjectStore> = cellfleet_store::open(&config)
            .await
            .with_context(|| format!("cannot open the store {config:?}"))?;
        anyhow::Ok(probe::run(store, &args.prefix, args.writers).await)
    })?;
    if args.json {
        let view = ReportView {
            store: report.store.clone(),
            passed: report.passed(),
            checks: report
                .checks
                .iter()
                .map(|(check, verdict)| CheckView {
                    check: check.name(),
                    verdict: match verdict {
                        Verdict::Passed => "passed",
                        Verdict::Failed(_) => "failed",
                        Verdict::Skipped => "skipped",
                    },
                    observed: match verdict {
                        Verdict::Failed(observed) => Some(observed.clone()),
                        _ => None,
                    },
                    meaning: matches!(verdict, Verdict::Failed(_)).then(|| check.meaning()),
                })
                .collect(),
        };
        println!("{}", serde_json::to_string_pretty(&view)?);
    } else {
        println!("{report}");
    }
    Ok(if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn export_cell(args: &ExportArgs) -> anyhow::Result<ExitCode> {
    use cellfleet_cell::{ChainFile, Checksum, Position, Txid};
    if args.out.exists() {
        bail!("{} exists: give --out a new file", args.out.display());
    }
    let config = store_config(&args.store)?;
    let layout = Layout::new(&args.prefix).map_err(|e| anyhow::anyhow!("--prefix: {e}"))?;
    let cell = CellId::for_kind_key(&args.kind, args.key.as_bytes());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (root, files, records) = runtime.block_on(async {
        let store: Arc<dyn ObjectStore> = cellfleet_store::open(&config)
            .await
            .with_context(|| format!("cannot open the store {config:?}"))?;
        let root = read_root(store.as_ref(), &layout, &cell, args).await?;
        let mut files = Vec::with_capacity(root.chain.len());
        for file in &root.chain {
            let bytes = store
                .get(&file.key)
                .await
                .with_context(|| format!("cannot read {}", file.key))?
                .body;
            files.push(bytes);
        }
        let records = read_log_records(store.as_ref(), &layout, &cell, &root).await?;
        anyhow::Ok((root, files, records))
    })?;
    let chain = root
        .chain
        .iter()
        .zip(&files)
        .map(|(entry, bytes)| ChainFile {
            ltx: bytes.as_ref(),
            post: Position {
                txid: entry.max_txid,
                checksum: Checksum(entry.post_apply_checksum),
            },
        })
        .chain(records.iter().map(|(entry, bytes)| ChainFile {
            ltx: bytes.as_ref(),
            post: Position {
                txid: entry.max_txid,
                checksum: Checksum(entry.post_apply_checksum),
            },
        }));
    let position = cellfleet_cell::recover(chain, &args.out)
        .with_context(|| format!("cannot rebuild {}/{}", args.kind, args.key))?;
    let (txid, checksum) = records
        .last()
        .map_or((root.txid, root.checksum), |(entry, _)| {
            (entry.max_txid, entry.post_apply_checksum)
        });
    if position.txid != txid || (txid > Txid::ZERO && position.checksum.0 != checksum) {
        let _ = std::fs::remove_file(&args.out);
        bail!(
            "the rebuilt database is at {position:?}, not at txid {} checksum {checksum:016x} (the root and its log records)",
            txid.0
        );
    }
    println!(
        "exported {}/{} (cell {cell}, epoch {}, txid {}, {} LTX files, {} log records) to {}",
        args.kind,
        args.key,
        root.epoch,
        txid.0,
        root.chain.len(),
        records.len(),
        args.out.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// The Cell's root, or an error naming what to check when it is absent.
async fn read_root(
    store: &dyn ObjectStore,
    layout: &Layout,
    cell: &CellId,
    args: &ExportArgs,
) -> anyhow::Result<RootRecord> {
    let key = layout.root_key(cell);
    let object = match store.get(&key).await {
        Ok(object) => object,
        Err(e) if e.is_not_found() => bail!(
            "no Cell {}/{} under prefix {:?} ({key} is absent): check the kind, key and --prefix",
            args.kind,
            args.key,
            args.prefix
        ),
        Err(e) => return Err(e).with_context(|| format!("cannot read {key}")),
    };
    RootRecord::decode(&object.body).with_context(|| format!("{key} is not a valid root"))
}

/// Log mode: the records past the chain, in the lane the root points at,
/// up to the end of its written run (a sealed lane ends at its seal, a
/// live one at its first missing slot). They must continue the root's
/// TXIDs without a gap; empty in cell mode.
async fn read_log_records(
    store: &dyn ObjectStore,
    layout: &Layout,
    cell: &CellId,
    root: &RootRecord,
) -> anyhow::Result<Vec<(cellfleet_nodelog::Entry, bytes::Bytes)>> {
    use cellfleet_nodelog::store::{read_records, read_written_run};
    let mut records = Vec::new();
    let Some(pointer) = &root.log else {
        return Ok(records);
    };
    let seqs: Vec<u64> = read_written_run(store, layout, &pointer.lane)
        .await
        .context("cannot list the Cell's node log lane")?
        .into_iter()
        .filter(|seq| *seq >= pointer.from_seq)
        .collect();
    let mut next = root.txid + 1;
    for (_, entry, bytes) in read_records(store, layout, &pointer.lane, &seqs, cell)
        .await
        .context("cannot read the Cell's node log records")?
    {
        if entry.max_txid < next {
            continue;
        }
        if entry.min_txid != next {
            bail!(
                "the node log holds txids {}..={} of this Cell where {} was expected: the log is damaged",
                entry.min_txid.0,
                entry.max_txid.0,
                next.0
            );
        }
        next = entry.max_txid + 1;
        records.push((entry, bytes));
    }
    Ok(records)
}
