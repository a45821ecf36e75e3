//! The `cellfleet` command-line tool.

/// Like `eprintln!`, but the line goes out in one `write` call: `dev`'s
/// nodes share its stderr, and `eprintln!` writes each formatted piece
/// on its own, so two nodes' start lines could interleave mid-line. A
/// failed write is ignored (`eprintln!` would panic).
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::say_line(format!($($arg)*))
    };
}

mod certs_cmd;
mod client_cmd;
mod dev_cmd;
mod dir_lock;
mod keys_cmd;
mod ltx_cmd;
mod node_cmd;
mod signals;
mod store_cmd;
mod stream_route;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// mimalloc instead of the C library's allocator for Rust's allocations:
/// a node allocates small, short-lived buffers on many threads (HTTP,
/// JSON, the engine's groups), and glibc's malloc was about a fifth of a
/// streams node's CPU samples. It does not replace `malloc` itself (SQLite
/// keeps glibc's): built that way the binary crashed at start under an
/// `LD_PRELOAD` library (libfaketime, which the clock-skew tests use).
/// Built without asking for transparent huge pages (`no_thp`): they bought
/// no measurable speed for twice the resident memory (BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Cellfleet: a cluster runtime for stateful entities (Cells) made durable
/// in S3-compatible object storage.
#[derive(Debug, Parser)]
#[command(name = "cellfleet", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Inspect, verify and restore LTX files (Litestream compatible).
    #[command(subcommand)]
    Ltx(ltx_cmd::LtxCommand),
    /// Check an object store before trusting it with a cluster's data.
    #[command(subcommand)]
    Store(store_cmd::StoreCommand),
    /// Create the cluster CA and issue node and client certificates (mTLS).
    #[command(subcommand)]
    Certs(certs_cmd::CertsCommand),
    /// Create Ed25519 signing keys and their key-registry entries.
    #[command(subcommand)]
    Keys(keys_cmd::KeysCommand),
    /// Run one node from a TOML config (env CELLFLEET_* overrides); SIGTERM drains.
    Node(node_cmd::NodeArgs),
    /// Start a local multi-node cluster (certificates, keys, configs and N node processes).
    Dev(dev_cmd::DevArgs),
    /// Execute a signed command on a Cell (exactly once per --id). Exit 0 applied, 4 rejected by the Cell, 3 outcome unknown, 1 error.
    Exec(client_cmd::ExecArgs),
    /// Run a named query on a Cell's owner.
    Query(client_cmd::QueryArgs),
    /// Tell what became of a command id: COMMITTED, ABSENT, UNKNOWN or EXPIRED.
    Resolve(client_cmd::ResolveArgs),
    /// List node leases: endpoint, expiry, live or expired, Cells owned.
    Leases(client_cmd::ListArgs),
    /// Every live node's counters (commands, queries, publications, segments), open and owned Cells, queue depth and commit latency. Exit 0, or 1 when a live node did not answer.
    Stats(client_cmd::ListArgs),
    /// List Cells with their owner (marked when its lease is late, expired or retired; - when released), epoch and TXID; ds_registry and ds_subscription Cells belong to the Durable Streams service.
    Cells(client_cmd::CellsArgs),
    /// Show one Cell.
    #[command(subcommand)]
    Cell(client_cmd::CellCommand),
    /// Drain a node: publish its accepted work, release its Cells, retire its lease.
    Drain(client_cmd::DrainArgs),
    /// Measure a real cluster: local and forwarded commands and queries, with the floors (mTLS echo, conditional PUT) in the same run.
    Bench(cellfleet_bench::BenchArgs),
    /// Measure the Durable Streams listener: appends/s at 1k-100k streams, long-poll and SSE fan-out latency, beside a reference server.
    BenchStreams(cellfleet_bench::streams::StreamsBenchArgs),
    /// Measure recovery: kill -9 one node and time until each of its Cells serves again through the others (1k and 10k Cells per node).
    BenchRecovery(cellfleet_bench::recovery::RecoveryArgs),
}

/// This binary's path: the bench starts its nodes (and `dev --no-start`)
/// from it.
fn current_exe() -> anyhow::Result<std::path::PathBuf> {
    use anyhow::Context;
    std::env::current_exe().context("cannot find the cellfleet executable")
}

/// Writes `line` and a newline to stderr in one call (see `say!`).
fn say_line(mut line: String) {
    use std::io::Write;
    line.push('\n');
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

fn main() -> ExitCode {
    // Before anything opens SQLite: its allocations then take no
    // process-wide lock (the node bounds page caches by its own charge).
    cellfleet_cell::memory_statistics_off();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Ltx(command) => ltx_cmd::run(command),
        Command::Store(command) => store_cmd::run(command),
        Command::Certs(command) => certs_cmd::run(command),
        Command::Keys(command) => keys_cmd::run(command),
        Command::Node(args) => node_cmd::run(args),
        Command::Dev(args) => dev_cmd::run(args),
        Command::Exec(args) => client_cmd::exec(args),
        Command::Query(args) => client_cmd::query(args),
        Command::Resolve(args) => client_cmd::resolve(args),
        Command::Leases(args) => client_cmd::leases(args),
        Command::Stats(args) => client_cmd::stats(args),
        Command::Cells(args) => client_cmd::cells(args),
        Command::Cell(command) => client_cmd::cell(command),
        Command::Drain(args) => client_cmd::drain(args),
        Command::Bench(args) => current_exe().and_then(|exe| cellfleet_bench::run(&exe, args)),
        Command::BenchStreams(args) => {
            current_exe().and_then(|exe| cellfleet_bench::streams::run(&exe, args))
        }
        Command::BenchRecovery(args) => {
            current_exe().and_then(|exe| cellfleet_bench::recovery::run(&exe, args))
        }
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            say!("error: {err:#}");
            ExitCode::from(1)
        }
    }
}
