//! `cellfleet keys`: create Ed25519 signing keys for clients and their key-registry entries.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use cellfleet_router::registry::{KeyEntry, KeyRegistry};
use cellfleet_router::signing::{generate_signing_key, write_signing_key};
use clap::{Args, Subcommand};
use serde::Serialize;

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Create a signing key: writes the private key (PKCS#8 PEM, mode 0600)
    /// and prints the registry entry, or appends it to a registry file.
    New(NewArgs),
}

#[derive(Debug, Args)]
pub struct NewArgs {
    /// The key id clients put in their envelopes (at most 128 bytes).
    name: String,
    /// Kinds the key may address, comma-separated ("*" for any).
    #[arg(long, value_delimiter = ',')]
    kinds: Vec<String>,
    /// Command and query names the key may use, comma-separated ("*" for any).
    #[arg(long = "ops", value_delimiter = ',')]
    operations: Vec<String>,
    /// Allow raw SQL batches ("$sql"; never granted by "*").
    #[arg(long)]
    raw_sql: bool,
    /// Allow admin operations (drain).
    #[arg(long)]
    admin: bool,
    /// Where to write the private key (default: ./NAME.ed25519.pem). Never overwritten.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Append the entry to this registry file (keys.toml), created if missing.
    #[arg(long)]
    registry: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct Created<'a> {
    private_key: &'a std::path::Path,
    registry: Option<&'a std::path::Path>,
    entry: &'a KeyEntry,
}

pub fn run(command: KeysCommand) -> anyhow::Result<ExitCode> {
    match command {
        KeysCommand::New(args) => new_key(&args),
    }
}

fn new_key(args: &NewArgs) -> anyhow::Result<ExitCode> {
    let existing = match &args.registry {
        Some(path) if path.exists() => Some(KeyRegistry::load(path)?),
        _ => None,
    };
    if existing.as_ref().is_some_and(|r| r.get(&args.name).is_ok()) {
        bail!(
            "key id {:?} is already in the registry; choose another name",
            args.name
        );
    }
    let key = generate_signing_key();
    let mut entry = KeyEntry::new(
        args.name.clone(),
        &key.verifying_key(),
        args.kinds.clone(),
        args.operations.clone(),
    );
    entry.raw_sql = args.raw_sql;
    entry.admin = args.admin;
    // Validate the entry exactly as a node will before writing anything.
    KeyRegistry::from_entries(vec![entry.clone()])?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("{}.ed25519.pem", args.name)));
    write_signing_key(&out, &key).with_context(|| {
        format!(
            "writing {} (an existing key file is never overwritten)",
            out.display()
        )
    })?;
    if let Some(path) = &args.registry {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        writeln!(file, "\n{}", entry.to_toml().trim_end())
            .with_context(|| format!("appending to {}", path.display()))?;
        KeyRegistry::load(path)?;
    }
    if args.json {
        let created = Created {
            private_key: &out,
            registry: args.registry.as_deref(),
            entry: &entry,
        };
        println!("{}", serde_json::to_string(&created)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("key {}", entry.id);
    println!(
        "  private key  {} (mode 0600; keep it secret)",
        out.display()
    );
    println!("  public key   {}", entry.public_key);
    match &args.registry {
        Some(path) => println!("  appended to  {}", path.display()),
        None => println!(
            "registry entry (add to every node's keys.toml):\n{}",
            entry.to_toml()
        ),
    }
    if entry.kinds.is_empty() || (entry.operations.is_empty() && !entry.raw_sql) {
        println!("note: this key grants nothing until --kinds and --ops (or --raw-sql) are given");
    }
    Ok(ExitCode::SUCCESS)
}
