//! The `cellfleet` command-line tool.

mod certs_cmd;
mod keys_cmd;
mod ltx_cmd;
mod store_cmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Ltx(command) => ltx_cmd::run(command),
        Command::Store(command) => store_cmd::run(command),
        Command::Certs(command) => certs_cmd::run(command),
        Command::Keys(command) => keys_cmd::run(command),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(1)
        }
    }
}
