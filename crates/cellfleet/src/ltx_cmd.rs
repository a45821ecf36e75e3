//! `cellfleet ltx inspect` and `cellfleet ltx restore`.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use cellfleet_ltx::{Header, Position, Trailer, Txid};
use clap::{Args, Subcommand};
use serde::Serialize;

use crate::ltx_cmd::chain::{choose_chain, scan_replica, ReplicaFile};

mod chain;

#[derive(Debug, Subcommand)]
pub enum LtxCommand {
    /// Show an LTX file's header, pages and checksums, and verify it.
    /// Exits with status 2 if the file does not verify.
    Inspect(InspectArgs),
    /// Rebuild a SQLite database from a Litestream file replica
    /// (DIR/ltx/<level>/<min>-<max>.ltx): latest snapshot, then the files
    /// that extend it, each verified before use.
    Restore(RestoreArgs),
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The LTX file.
    file: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// The replica directory (the one that holds `ltx/`).
    dir: PathBuf,
    /// Where to write the database; must not exist.
    #[arg(short = 'o', long = "output")]
    output: PathBuf,
    /// Restore up to this TXID (decimal or 0x-prefixed hex) instead of the latest.
    #[arg(long, value_parser = parse_txid)]
    txid: Option<u64>,
}

fn parse_txid(s: &str) -> Result<u64, String> {
    let parsed = match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    };
    parsed.map_err(|e| format!("not a TXID: {e}"))
}

pub fn run(command: LtxCommand) -> anyhow::Result<ExitCode> {
    match command {
        LtxCommand::Inspect(args) => inspect(&args),
        LtxCommand::Restore(args) => restore(&args),
    }
}

#[derive(Debug, Serialize)]
struct Inspection {
    file: String,
    size_bytes: u64,
    header: HeaderView,
    pages: Vec<PageView>,
    post_apply_checksum: Option<String>,
    file_checksum: Option<String>,
    verified: bool,
    error: Option<String>,
}

#[derive(Debug, Serialize)]
struct HeaderView {
    flags: u32,
    tracks_checksums: bool,
    page_size: u32,
    commit: u32,
    min_txid: u64,
    max_txid: u64,
    snapshot: bool,
    timestamp_ms: i64,
    pre_apply_checksum: String,
    wal_offset: i64,
    wal_size: i64,
    wal_salt1: u32,
    wal_salt2: u32,
    node_id: u64,
}

impl From<&Header> for HeaderView {
    fn from(h: &Header) -> Self {
        HeaderView {
            flags: h.flags,
            tracks_checksums: h.tracks_checksums(),
            page_size: h.page_size,
            commit: h.commit,
            min_txid: h.min_txid.0,
            max_txid: h.max_txid.0,
            snapshot: h.is_snapshot(),
            timestamp_ms: h.timestamp_ms,
            pre_apply_checksum: h.pre_apply_checksum.to_string(),
            wal_offset: h.wal_offset,
            wal_size: h.wal_size,
            wal_salt1: h.wal_salt1,
            wal_salt2: h.wal_salt2,
            node_id: h.node_id,
        }
    }
}

#[derive(Debug, Serialize)]
struct PageView {
    pgno: u32,
    offset: u64,
    frame_size: u64,
}

fn inspect(args: &InspectArgs) -> anyhow::Result<ExitCode> {
    let size_bytes = std::fs::metadata(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?
        .len();
    let file = File::open(&args.file)?;
    let mut decoder = cellfleet_ltx::Decoder::new(BufReader::new(file))
        .with_context(|| format!("{} is not a valid LTX file", args.file.display()))?;
    let header = *decoder.header();
    let mut page = Vec::new();
    let mut error = None;
    loop {
        match decoder.next_page(&mut page) {
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(e) => {
                error = Some(e.to_string());
                break;
            }
        }
    }
    let pages = decoder
        .index()
        .iter()
        .map(|e| PageView {
            pgno: e.pgno,
            offset: e.offset,
            frame_size: e.size,
        })
        .collect();
    let trailer: Option<Trailer> = match error {
        Some(_) => None,
        None => match decoder.finish() {
            Ok(t) => Some(t),
            Err(e) => {
                error = Some(e.to_string());
                None
            }
        },
    };
    let inspection = Inspection {
        file: args.file.display().to_string(),
        size_bytes,
        header: HeaderView::from(&header),
        pages,
        post_apply_checksum: trailer.map(|t| t.post_apply_checksum.to_string()),
        file_checksum: trailer.map(|t| t.file_checksum.to_string()),
        verified: error.is_none(),
        error,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&inspection)?);
    } else {
        print_inspection(&inspection);
    }
    Ok(if inspection.verified {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    })
}

fn print_inspection(i: &Inspection) {
    let h = &i.header;
    println!("file           {} ({} bytes)", i.file, i.size_bytes);
    println!(
        "txid           {}..={}{}",
        h.min_txid,
        h.max_txid,
        if h.snapshot { " (snapshot)" } else { "" }
    );
    println!("page size      {}", h.page_size);
    println!("commit         {} pages", h.commit);
    println!("timestamp_ms   {}", h.timestamp_ms);
    println!(
        "flags          {:#x}{}",
        h.flags,
        if h.tracks_checksums {
            ""
        } else {
            " (no checksum tracking)"
        }
    );
    println!("pre-apply      {}", h.pre_apply_checksum);
    println!(
        "post-apply     {}",
        i.post_apply_checksum.as_deref().unwrap_or("-")
    );
    println!(
        "file checksum  {}",
        i.file_checksum.as_deref().unwrap_or("-")
    );
    if h.wal_offset != 0 || h.wal_size != 0 {
        println!(
            "wal            offset {} size {} salts {:08x}/{:08x}",
            h.wal_offset, h.wal_size, h.wal_salt1, h.wal_salt2
        );
    }
    if h.node_id != 0 {
        println!("node id        {}", h.node_id);
    }
    println!("pages          {}", i.pages.len());
    println!("  {:>10}  {:>12}  {:>10}", "pgno", "offset", "frame");
    for p in &i.pages {
        println!("  {:>10}  {:>12}  {:>10}", p.pgno, p.offset, p.frame_size);
    }
    match &i.error {
        None => println!("verified       ok"),
        Some(e) => println!("verified       FAILED: {e}"),
    }
}

fn restore(args: &RestoreArgs) -> anyhow::Result<ExitCode> {
    if args.output.exists() {
        bail!(
            "{} already exists; restore never overwrites a database (choose another -o path)",
            args.output.display()
        );
    }
    let files = scan_replica(&args.dir)?;
    if files.is_empty() {
        bail!(
            "no LTX files under {}/ltx/<level>/: is this a Litestream file replica?", // tidy: not a bucket key
            args.dir.display()
        );
    }
    let target = args.txid.map(Txid);
    let (chain, position) = restore_into_scratch(&files, target, &args.output)?;
    eprintln!(
        "restored {} at txid {} (checksum {}) from {} file(s)",
        args.output.display(),
        position.txid.0,
        position.checksum,
        chain.len()
    );
    for file in &chain {
        eprintln!("  {}", file.path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// Apply the chosen chain to a scratch file next to `output`, verify the
/// result, and link it into place without ever replacing an existing file.
fn restore_into_scratch(
    files: &[ReplicaFile],
    target: Option<Txid>,
    output: &Path,
) -> anyhow::Result<(Vec<ReplicaFile>, Position)> {
    let parent = match output.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let scratch = tempfile::Builder::new()
        .prefix(".cellfleet-restore-")
        .tempfile_in(&parent)
        .with_context(|| format!("cannot create a scratch file in {}", parent.display()))?;
    let mut db = scratch.reopen()?;
    let (chain, position, page_size) = choose_chain(files, target, &mut db)?;
    // The incrementally tracked checksum must equal a full recomputation of
    // what was written.
    let recomputed =
        cellfleet_ltx::database_checksum(BufReader::new(File::open(scratch.path())?), page_size)?;
    if recomputed != position.checksum {
        bail!(
            "restored database checksum {recomputed} differs from the chain's {}",
            position.checksum
        );
    }
    db.sync_all()?;
    std::fs::hard_link(scratch.path(), output).with_context(|| {
        format!(
            "cannot create {} (it must not exist already)",
            output.display()
        )
    })?;
    if let Ok(dir) = File::open(&parent) {
        let _ = dir.sync_all();
    }
    drop(scratch);
    Ok((chain, position))
}

#[cfg(test)]
mod tests {
    use super::parse_txid;

    #[test]
    fn txid_parses_decimal_and_hex() {
        assert_eq!(parse_txid("42"), Ok(42));
        assert_eq!(parse_txid("0x2a"), Ok(42));
        assert!(parse_txid("x").is_err());
    }
}
