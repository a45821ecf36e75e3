//! `cellfleet certs`: create the cluster CA and issue node and client certificates for mutual TLS.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use cellfleet_router::certs::{CertPaths, ClusterCa, Role};
use clap::{Args, Subcommand};
use serde::Serialize;

#[derive(Debug, Subcommand)]
pub enum CertsCommand {
    /// Create the cluster CA (DIR/ca.pem and DIR/ca.key, the key mode 0600).
    /// Refuses to overwrite an existing CA.
    Init(InitArgs),
    /// Issue a certificate signed by the CA in DIR: a node certificate
    /// (serves clients and peers, dials peers) or a client certificate
    /// (client and admin services only).
    #[command(subcommand)]
    Issue(IssueCommand),
}

#[derive(Debug, Args)]
pub struct InitArgs {
    /// Directory for the CA files (created if missing).
    #[arg(long)]
    dir: PathBuf,
    /// A name for the cluster, written into the CA's subject.
    #[arg(long, default_value = "cellfleet")]
    name: String,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Subcommand)]
pub enum IssueCommand {
    /// A node certificate: DIR/node-ID.pem and DIR/node-ID.key.
    Node(IssueNodeArgs),
    /// A client certificate: DIR/client-NAME.pem and DIR/client-NAME.key.
    Client(IssueClientArgs),
}

#[derive(Debug, Args)]
pub struct IssueNodeArgs {
    /// The node id (letters, digits, '.', '_', '-'; at most 64).
    id: String,
    /// The directory holding the CA; the certificate is written there too.
    #[arg(long)]
    dir: PathBuf,
    /// DNS names or IP addresses clients use to reach the node (repeat the
    /// flag). Default: localhost, 127.0.0.1 and ::1.
    #[arg(long = "host")]
    hosts: Vec<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct IssueClientArgs {
    /// The client's name (letters, digits, '.', '_', '-'; at most 64).
    name: String,
    /// The directory holding the CA; the certificate is written there too.
    #[arg(long)]
    dir: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct Written<'a> {
    role: &'a str,
    name: &'a str,
    certificate: &'a Path,
    private_key: &'a Path,
}

pub fn run(command: CertsCommand) -> anyhow::Result<ExitCode> {
    match command {
        CertsCommand::Init(args) => init(&args),
        CertsCommand::Issue(IssueCommand::Node(args)) => issue(
            &args.dir,
            &Role::Node(args.id.clone()),
            &args.hosts,
            args.json,
        ),
        CertsCommand::Issue(IssueCommand::Client(args)) => {
            issue(&args.dir, &Role::Client(args.name.clone()), &[], args.json)
        }
    }
}

fn init(args: &InitArgs) -> anyhow::Result<ExitCode> {
    let (_, paths) = ClusterCa::init(&args.dir, &args.name).with_context(|| {
        format!(
            "creating the cluster CA in {} (an existing CA is never overwritten)",
            args.dir.display()
        )
    })?;
    report("ca", &args.name, &paths, args.json)?;
    if !args.json {
        println!(
            "next: cellfleet certs issue node <ID> --dir {0}; cellfleet certs issue client <NAME> --dir {0}",
            args.dir.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn issue(dir: &Path, role: &Role, hosts: &[String], json: bool) -> anyhow::Result<ExitCode> {
    let ca = ClusterCa::load(dir).with_context(|| {
        format!(
            "loading the CA from {} (run `cellfleet certs init --dir {}` first)",
            dir.display(),
            dir.display()
        )
    })?;
    let paths = ca
        .issue_to(dir, role, hosts)
        .with_context(|| format!("issuing {}", role.uri()))?;
    let kind = match role {
        Role::Node(_) => "node",
        Role::Client(_) => "client",
    };
    report(kind, role.name(), &paths, json)?;
    Ok(ExitCode::SUCCESS)
}

fn report(role: &str, name: &str, paths: &CertPaths, json: bool) -> anyhow::Result<()> {
    if json {
        let written = Written {
            role,
            name,
            certificate: &paths.cert,
            private_key: &paths.key,
        };
        println!("{}", serde_json::to_string(&written)?);
    } else {
        println!("{role} {name}");
        println!("  certificate  {}", paths.cert.display());
        println!("  private key  {} (mode 0600)", paths.key.display());
    }
    Ok(())
}
