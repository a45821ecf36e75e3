//! `cellfleet store probe`: does this bucket (or directory) honour
//! conditional writes? A store that fails any check must not hold a
//! cluster's data.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context};
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
}

#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// Probe the embedded local-directory store in DIR instead of S3.
    #[arg(long, conflicts_with_all = ["endpoint", "bucket"])]
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
    }
}

fn store_config(args: &ProbeArgs) -> anyhow::Result<StoreConfig> {
    if let Some(dir) = &args.dir {
        return Ok(StoreConfig::Local { dir: dir.clone() });
    }
    let Some(bucket) = args.bucket.clone() else {
        bail!("say which store to probe: --dir DIR, or --bucket B (with --endpoint URL for a non-AWS server)");
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
    let config = store_config(args)?;
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
