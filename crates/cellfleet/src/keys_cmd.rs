//! `cellfleet keys`: create Ed25519 signing keys for clients and their key-registry entries, and mint Durable Streams bearer tokens with them.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use cellfleet_router::registry::{KeyEntry, KeyRegistry};
use cellfleet_router::signing::{generate_signing_key, read_signing_key, write_signing_key};
use clap::{Args, Subcommand};
use serde::Serialize;

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Create a signing key: writes the private key (PKCS#8 PEM, mode 0600)
    /// and prints the registry entry, or appends it to a registry file.
    New(NewArgs),
    /// Mint a bearer token for the Durable Streams listener, signed with a
    /// registry key (by default the client config's signing key). Prints
    /// the token alone, for `Authorization: Bearer <token>`.
    Token(TokenArgs),
}

#[derive(Debug, Args)]
pub struct TokenArgs {
    /// A path prefix the token grants (repeatable), e.g. /v1/stream/app/.
    /// The signing key's registry entry must allow it (stream_token_prefixes).
    #[arg(long = "prefix", required = true)]
    prefixes: Vec<String>,
    /// Operations, comma-separated: read, append, create, delete, subscribe.
    #[arg(long = "ops", value_delimiter = ',', required = true)]
    operations: Vec<String>,
    /// Lifetime: a number with s, m, h or d (at most 400d).
    #[arg(long, default_value = "1h")]
    ttl: String,
    /// A label carried in the token (`sub`), for logs.
    #[arg(long)]
    sub: Option<String>,
    /// Client config whose signing_key and key_id sign (default:
    /// $CELLFLEET_CONFIG, else ./.cellfleet-dev/client.toml).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Sign with this private key (PKCS#8 PEM) instead of the client config's; needs --key-id.
    #[arg(long, requires = "key_id")]
    key: Option<PathBuf>,
    /// The registry key id of --key.
    #[arg(long, requires = "key")]
    key_id: Option<String>,
    /// Print JSON (token, key_id, expires_at, prefixes, ops) instead of the token alone.
    #[arg(long)]
    json: bool,
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
    /// Path prefixes this key may grant in Durable Streams bearer tokens
    /// (`cellfleet keys token`), comma-separated, e.g. /v1/stream/app/.
    #[arg(long, value_delimiter = ',')]
    stream_token_prefixes: Vec<String>,
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
        KeysCommand::Token(args) => token(&args),
    }
}

/// Parses a lifetime such as `90s`, `15m`, `1h` or `30d` into seconds.
fn parse_ttl(text: &str) -> anyhow::Result<i64> {
    let (digits, unit) = text.split_at(text.len().saturating_sub(1));
    let scale = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => bail!("--ttl {text:?}: give a number with s, m, h or d (e.g. 1h)"),
    };
    let n: i64 = digits
        .parse()
        .ok()
        .filter(|n| *n > 0)
        .with_context(|| format!("--ttl {text:?}: give a positive number with s, m, h or d"))?;
    n.checked_mul(scale)
        .filter(|s| *s <= cellfleet_streams::token::LIFETIME_S_MAX)
        .with_context(|| format!("--ttl {text:?} is over the longest lifetime, 400d"))
}

fn token(args: &TokenArgs) -> anyhow::Result<ExitCode> {
    use cellfleet_streams::token::{self, Claims, Op};
    let ops = args
        .operations
        .iter()
        .map(|name| {
            Op::parse(name).with_context(|| {
                format!("--ops: {name:?} is not an operation; use read, append, create, delete or subscribe")
            })
        })
        .collect::<anyhow::Result<Vec<Op>>>()?;
    let ttl = parse_ttl(&args.ttl)?;
    let (signing, key_id) = match (&args.key, &args.key_id) {
        (Some(path), Some(id)) => (
            read_signing_key(path).with_context(|| format!("signing key {}", path.display()))?,
            id.clone(),
        ),
        _ => {
            let path = crate::client_cmd::client_config_path(args.config.as_deref());
            let file = crate::client_cmd::ClientFile::read(&path)?;
            let key = read_signing_key(&file.signing_key)
                .with_context(|| format!("signing key {}", file.signing_key.display()))?;
            (key, file.key_id)
        }
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .context("the clock is before 1970")?
        .as_secs();
    let iat = i64::try_from(now).context("the clock is out of range")?;
    let claims = Claims {
        iat,
        exp: iat + ttl,
        nbf: None,
        sub: args.sub.clone(),
        prefixes: args.prefixes.clone(),
        ops,
    };
    let minted = token::mint(&signing, &key_id, &claims).map_err(|e| anyhow::anyhow!("{e}"))?;
    if args.json {
        let out = serde_json::json!({
            "token": minted,
            "key_id": key_id,
            "issued_at": claims.iat,
            "expires_at": claims.exp,
            "prefixes": claims.prefixes,
            "ops": claims.ops,
        });
        println!("{out}");
    } else {
        println!("{minted}");
    }
    Ok(ExitCode::SUCCESS)
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
    entry.stream_token_prefixes = args.stream_token_prefixes.clone();
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
    if (entry.kinds.is_empty() || (entry.operations.is_empty() && !entry.raw_sql))
        && entry.stream_token_prefixes.is_empty()
    {
        println!("note: this key grants nothing until --kinds and --ops (or --raw-sql) are given");
    }
    Ok(ExitCode::SUCCESS)
}
