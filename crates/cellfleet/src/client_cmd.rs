//! Client and operator commands: `exec`, `query`, `resolve` (signed with the client key) and `leases`, `cells`, `cell show`, `drain`, over mTLS to any node of the cluster.
//!
//! Settings come from a client config file: `--config`, else
//! `$CELLFLEET_CONFIG`, else `./.cellfleet-dev/client.toml` (what
//! `cellfleet dev` writes), so after `cellfleet dev` no flags are needed.
//!
//! ```toml
//! endpoints = ["127.0.0.1:7001", "127.0.0.1:7002"]   # client listeners, tried in order
//! ca = "certs/ca.pem"
//! cert = "certs/client-dev.pem"
//! key = "certs/client-dev.key"
//! signing_key = "dev.ed25519.pem"
//! key_id = "dev"
//! window_ms = 60000      # validity window of signed requests
//! ```
//!
//! Exit codes, so scripts can tell the cases apart: 0 done (for `exec`: the
//! command was applied); 1 an error (transport, usage, a refused request);
//! 3 the outcome is unknown (retry with the same `--id`, or `resolve`);
//! 4 `exec` only: the command ran to a definite rejection (unknown command,
//! bad parameters, a failing statement), stored under its id — re-sending
//! it returns the same rejection.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use cellfleet_client::{v1, Client, Command, CommandId, Config, Error, Outcome, Query, Receipt};
use clap::{Args, Subcommand};

/// The client config used when neither `--config` nor `CELLFLEET_CONFIG` is given.
pub const DEFAULT_CLIENT_CONFIG: &str = cellfleet_client::config::DEFAULT_CONFIG_PATH;
/// The client config file (the client library's).
pub type ClientFile = Config;

/// The client config a command uses: `--config`, else `$CELLFLEET_CONFIG`,
/// else `./.cellfleet-dev/client.toml`.
pub fn client_config_path(explicit: Option<&Path>) -> PathBuf {
    Config::path(explicit)
}

#[derive(Debug, Args)]
pub struct Common {
    /// Client config file (default: $CELLFLEET_CONFIG, else ./.cellfleet-dev/client.toml).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Talk to this node's client endpoint (host:port) instead of the configured ones.
    #[arg(long, global = true)]
    node: Option<String>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// The Cell's kind (e.g. kv).
    kind: String,
    /// The Cell's key.
    key: String,
    /// The command name (e.g. put).
    command: String,
    /// An argument: NAME=VALUE (VALUE is JSON if it parses, else a string;
    /// NAME=@PATH reads VALUE from a file, NAME=@@... is a value starting
    /// with @). Repeatable.
    #[arg(long = "arg")]
    args: Vec<String>,
    /// All arguments as one JSON object (merged under --arg); `-` reads it
    /// from stdin, `@PATH` from a file (for arguments too large for a
    /// command line).
    #[arg(long)]
    args_json: Option<String>,
    /// The command id (32 hex digits). Reuse it to retry a command safely.
    #[arg(long)]
    id: Option<String>,
    #[command(flatten)]
    common: Common,
}

#[derive(Debug, Args)]
pub struct QueryArgs {
    kind: String,
    key: String,
    /// The query name (e.g. get).
    name: String,
    /// An argument: NAME=VALUE (as for `exec`: JSON if it parses, @PATH
    /// reads a file). Repeatable.
    #[arg(long = "arg")]
    args: Vec<String>,
    /// All arguments as one JSON object; `-` reads it from stdin, `@PATH`
    /// from a file.
    #[arg(long)]
    args_json: Option<String>,
    /// Read-your-writes: only answer from a state at least this TXID (from a receipt).
    #[arg(long)]
    min_txid: Option<u64>,
    #[command(flatten)]
    common: Common,
}

#[derive(Debug, Args)]
pub struct ResolveArgs {
    kind: String,
    key: String,
    /// The command id (32 hex digits).
    id: String,
    /// The command's expires_at_ms (printed by `exec`). Needed for a
    /// definite answer about a command the ledger does not hold: ABSENT
    /// while its window is open, EXPIRED after; without it such a command
    /// is NEEDS_EXPIRY (its entry may have been pruned).
    #[arg(long)]
    expires_at_ms: Option<i64>,
    #[command(flatten)]
    common: Common,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    common: Common,
}

#[derive(Debug, Args)]
pub struct CellsArgs {
    /// Only Cells owned by this node.
    #[arg(long)]
    owner: Option<String>,
    /// At most this many.
    #[arg(long, default_value_t = 100)]
    limit: u32,
    /// Continue a listing from the token the previous page printed.
    #[arg(long)]
    page_token: Option<String>,
    #[command(flatten)]
    common: Common,
}

#[derive(Debug, Subcommand)]
pub enum CellCommand {
    /// The Cell's authority root: owner, epoch, TXID, checksum and LTX chain.
    Show(ShowArgs),
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    kind: String,
    key: String,
    #[command(flatten)]
    common: Common,
}

#[derive(Debug, Args)]
pub struct DrainArgs {
    /// The node to drain (see `cellfleet leases`).
    node_id: String,
    #[command(flatten)]
    common: Common,
}

fn config_path(common: &Common) -> PathBuf {
    client_config_path(common.config.as_deref())
}

/// The client library, configured from the client file (`--node`: that
/// node only). A one-shot command has no later request to route, so owner
/// routing is off; retries follow the library's rule.
fn load_client(common: &Common) -> anyhow::Result<Client> {
    let path = config_path(common);
    let mut file = Config::read(&path)?;
    if let Some(node) = &common.node {
        file.endpoints = vec![node.clone()];
    }
    Ok(Client::builder_from_config(&file)?
        .owner_routing(false)
        .build()?)
}

fn now_ms() -> i64 {
    cellfleet_client::now_ms()
}

fn parse_args(args: &[String], json: Option<&str>) -> anyhow::Result<serde_json::Value> {
    let read_file =
        |path: &str| std::fs::read_to_string(path).with_context(|| format!("cannot read {path}"));
    let read_stdin = || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .context("cannot read --args-json from stdin")?;
        anyhow::Ok(text)
    };
    parse_args_with(args, json, read_file, read_stdin)
}

/// [`parse_args`] with its sources given: `read_file` for `@PATH`,
/// `read_stdin` for `--args-json -`.
fn parse_args_with(
    args: &[String],
    json: Option<&str>,
    read_file: impl Fn(&str) -> anyhow::Result<String>,
    read_stdin: impl FnOnce() -> anyhow::Result<String>,
) -> anyhow::Result<serde_json::Value> {
    let mut object = match json {
        Some(source) => {
            let text = match source {
                "-" => read_stdin()?,
                _ => match source.strip_prefix('@') {
                    Some(path) => read_file(path)?,
                    None => source.to_owned(),
                },
            };
            match serde_json::from_str::<serde_json::Value>(&text)
                .context("--args-json is not JSON")?
            {
                serde_json::Value::Object(map) => map,
                _ => bail!("--args-json must be a JSON object, like '{{\"key\": \"a\"}}'"),
            }
        }
        None => serde_json::Map::new(),
    };
    for arg in args {
        let Some((name, value)) = arg.split_once('=') else {
            bail!("--arg {arg:?}: write NAME=VALUE");
        };
        let text = match value.strip_prefix('@') {
            Some(rest) if rest.starts_with('@') => rest.to_owned(),
            Some(path) => read_file(path).with_context(|| format!("--arg {name}=@{path}"))?,
            None => value.to_owned(),
        };
        let value = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
        object.insert(name.to_owned(), value);
    }
    Ok(serde_json::Value::Object(object))
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// `exec`'s exit code when the Cell rejected the command (see the module docs).
pub const EXIT_REJECTED: u8 = 4;
/// The exit code when a command's outcome is unknown.
pub const EXIT_UNKNOWN: u8 = 3;

/// Prints a failed call with what to do next; exit code 1 (3 when the
/// outcome is unknown).
fn report_error(error: &Error, json: bool) -> ExitCode {
    let code = error.name();
    let next = match code {
        "NOT_FOUND" => "check the kind and key (`cellfleet cells` lists the Cells the cluster has)",
        "CERTIFICATE" => {
            "the node refused this client's certificate or this client the node's: check ca, cert and key in the client config (an expired or another cluster's certificate?); reissue with `cellfleet certs issue client NAME`"
        }
        "NOT_TLS" => {
            "the endpoint did not answer TLS: give a node's client port (listen.client), not its HTTP, streams or peer port"
        }
        "UNREACHABLE" => {
            "no node answered TLS there: is the cluster running (`cellfleet dev`), and is this a node's client port (listen.client, not its HTTP or peer port)? check endpoints in the client config"
        }
        "UNKNOWN_OUTCOME" => {
            "the command may or may not have applied: run `cellfleet resolve` with its id, or repeat `cellfleet exec ... --id ID`"
        }
        "UNSIGNED" | "UNKNOWN_KEY" | "BAD_SIGNATURE" => {
            "check key_id and signing_key in the client config and that the key is in every node's keys.toml"
        }
        "UNAUTHORIZED" => {
            "grant the key this kind/operation in keys.toml (`cellfleet keys new --kinds --ops`)"
        }
        "EXPIRED" | "FUTURE_DATED" => "check this machine's clock",
        "TRANSPORT" => {
            "is the cluster running? (`cellfleet dev`, or check endpoints in the client config)"
        }
        "CONFIG" => "fix the client config or the request",
        _ if error.retry_safe() => "retry (a command: with the same --id)",
        _ => "fix the request",
    };
    let grpc = error
        .grpc_code()
        .map_or_else(|| "-".to_owned(), |code| format!("{code:?}"));
    let message = match error {
        Error::Refused { message, .. } | Error::Transport { message, .. } => message.clone(),
        other => other.to_string(),
    };
    if json {
        let view = serde_json::json!({
            "ok": false,
            "grpc_status": grpc,
            "code": code,
            "retry_safe": error.retry_safe(),
            "message": message,
        });
        println!("{view}");
    } else {
        eprintln!("error: {code} ({grpc}): {message}");
        eprintln!("next: {next}");
    }
    ExitCode::from(if code == "UNKNOWN_OUTCOME" {
        EXIT_UNKNOWN
    } else {
        1
    })
}

fn receipt_text(receipt: &Option<v1::Receipt>) -> String {
    match receipt {
        Some(r) => format!("cell={} epoch={} txid={}", r.cell_id, r.epoch, r.txid),
        None => "-".into(),
    }
}

fn receipt_json(receipt: &Option<v1::Receipt>) -> serde_json::Value {
    match receipt {
        Some(r) => serde_json::json!({"cell_id": r.cell_id, "epoch": r.epoch, "txid": r.txid}),
        None => serde_json::Value::Null,
    }
}

fn outcome_json(outcome: &Outcome) -> (&'static str, serde_json::Value) {
    match outcome {
        Outcome::Applied(value) => ("applied", value.clone()),
        Outcome::Rejected(r) => {
            let code = r
                .code
                .as_str_name()
                .trim_start_matches("REJECT_CODE_")
                .to_owned();
            (
                "rejected",
                serde_json::json!({"code": code, "message": r.message}),
            )
        }
    }
}

pub fn exec(args: ExecArgs) -> anyhow::Result<ExitCode> {
    let client = load_client(&args.common)?;
    let command_args = parse_args(&args.args, args.args_json.as_deref())?;
    let id = match &args.id {
        Some(text) => text.parse::<CommandId>().map_err(anyhow::Error::msg)?,
        None => CommandId::random(),
    };
    let command = Command::new(&args.kind, args.key.as_bytes(), &args.command)
        .args(command_args)
        .id(id);
    let (issued, expires) = client.window_from_now();
    let request = client.seal_command(&command, issued, expires)?;
    let result = runtime()?.block_on(client.execute_sealed(&command, request, expires));
    let executed = match result {
        Ok(executed) => executed,
        Err(error) => {
            if !args.common.json {
                eprintln!(
                    "command id {id} expires at {expires} ms (retry with --id {id}, or \
                     `cellfleet resolve {} {} {id} --expires-at-ms {expires}`)",
                    args.kind, args.key,
                );
            }
            return Ok(report_error(&error, args.common.json));
        }
    };
    let (state, outcome) = outcome_json(&executed.outcome);
    if args.common.json {
        let view = serde_json::json!({
            "ok": state == "applied",
            "command_id": executed.command_id.to_string(),
            "expires_at_ms": expires,
            "outcome": state,
            "result": outcome,
            "receipt": receipt_json(&executed.receipt),
            "duplicate": executed.duplicate,
            "served_by": executed.served_by,
        });
        println!("{view}");
    } else {
        println!("{state:<10} {outcome}");
        println!(
            "command    {}{}",
            executed.command_id,
            if executed.duplicate {
                " (duplicate: stored outcome of an earlier try)"
            } else {
                ""
            }
        );
        println!("receipt    {}", receipt_text(&executed.receipt));
        println!("served by  {}", executed.served_by);
    }
    Ok(match state {
        "applied" => ExitCode::SUCCESS,
        _ => ExitCode::from(EXIT_REJECTED),
    })
}

pub fn query(args: QueryArgs) -> anyhow::Result<ExitCode> {
    let client = load_client(&args.common)?;
    let query_args = parse_args(&args.args, args.args_json.as_deref())?;
    let cell_id = cellfleet_authority::CellId::for_kind_key(&args.kind, args.key.as_bytes());
    let mut query = Query::new(&args.kind, args.key.as_bytes(), &args.name).args(query_args);
    if let Some(txid) = args.min_txid {
        query = query.after(&Receipt {
            cell_id: cell_id.as_str().to_owned(),
            epoch: 0,
            txid,
        });
    }
    match runtime()?.block_on(client.query(&query)) {
        Ok(response) => {
            if args.common.json {
                println!(
                    "{}",
                    serde_json::json!({"ok": true, "result": response.value,
                        "receipt": receipt_json(&response.receipt), "served_by": response.served_by})
                );
            } else {
                println!("{}", serde_json::to_string_pretty(&response.value)?);
                println!("receipt    {}", receipt_text(&response.receipt));
                println!("served by  {}", response.served_by);
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(error) => Ok(report_error(&error, args.common.json)),
    }
}

pub fn resolve(args: ResolveArgs) -> anyhow::Result<ExitCode> {
    let client = load_client(&args.common)?;
    let id = args.id.parse::<CommandId>().map_err(anyhow::Error::msg)?;
    let result = runtime()?.block_on(client.resolve(
        &args.kind,
        args.key.as_bytes(),
        id,
        args.expires_at_ms.unwrap_or(0),
    ));
    match result {
        Ok(response) => {
            let state = response
                .state
                .as_str_name()
                .trim_start_matches("COMMAND_STATE_")
                .to_owned();
            let outcome = response
                .outcome
                .as_ref()
                .map_or(serde_json::Value::Null, |o| outcome_json(o).1);
            if args.common.json {
                println!(
                    "{}",
                    serde_json::json!({"ok": true, "state": state, "result": outcome,
                        "receipt": receipt_json(&response.receipt), "served_by": response.served_by})
                );
            } else {
                println!("{state:<10} {outcome}");
                if response.state == v1::CommandState::NeedsExpiry {
                    println!(
                        "           not in the ledger; resolve again with --expires-at-ms \
                         <the command's expires_at_ms> for ABSENT or EXPIRED"
                    );
                }
                println!("receipt    {}", receipt_text(&response.receipt));
                println!("served by  {}", response.served_by);
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(error) => Ok(report_error(&error, args.common.json)),
    }
}

pub fn leases(args: ListArgs) -> anyhow::Result<ExitCode> {
    let client = load_client(&args.common)?;
    let leases = match runtime()?.block_on(client.leases()) {
        Ok(leases) => leases,
        Err(error) => return Ok(report_error(&error, args.common.json)),
    };
    let now = now_ms();
    if args.common.json {
        let leases: Vec<serde_json::Value> = leases
            .iter()
            .map(|l| {
                serde_json::json!({"node_id": l.node_id, "session_id": l.session_id,
                    "endpoint": l.endpoint, "peer_endpoint": l.peer_endpoint,
                    "expires_at_ms": l.expires_at_ms, "renewed_at_ms": l.renewed_at_ms,
                    "live": l.live, "draining": l.draining, "state": lease_state(l, now),
                    "owned_cells": l.owned_cells, "ingress_only": l.ingress_only})
            })
            .collect();
        println!("{}", serde_json::json!({"ok": true, "leases": leases}));
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<12} {:<8} {:<26} {:>9} {:>9} {:>6}  SESSION",
        "NODE", "STATE", "ENDPOINT", "RENEWED", "EXPIRES", "CELLS"
    );
    for l in &leases {
        let renewed = format!("{:.1}s ago", (now - l.renewed_at_ms) as f64 / 1000.0);
        let expires = format!("{:+.1}s", (l.expires_at_ms - now) as f64 / 1000.0);
        println!(
            "{:<12} {:<8} {:<26} {:>9} {:>9} {:>6}  {}",
            l.node_id,
            lease_state(l, now),
            l.endpoint,
            renewed,
            expires,
            l.owned_cells,
            l.session_id
        );
    }
    println!(
        "(live: renewing; late: live but its renewal is overdue, the node may be gone, its \
         Cells move once the lease expires; expired; retired: drained)"
    );
    Ok(ExitCode::SUCCESS)
}

pub fn stats(args: ListArgs) -> anyhow::Result<ExitCode> {
    let client = load_client(&args.common)?;
    let stats = match runtime()?.block_on(client.node_stats()) {
        Ok(stats) => stats,
        Err(error) => return Ok(report_error(&error, args.common.json)),
    };
    let code = if stats.unreachable.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    };
    if args.common.json {
        let nodes: Vec<serde_json::Value> = stats
            .nodes
            .iter()
            .map(|n| {
                serde_json::json!({"node_id": n.node_id, "at_ms": n.at_ms,
                    "commands_total": n.commands_total, "queries_total": n.queries_total,
                    "publications_total": n.publications_total,
                    "log_segments_total": n.log_segments_total,
                    "checkpoints_total": n.checkpoints_total, "refusals_total": n.refusals_total,
                    "cells_open": n.cells_open, "cells_owned": n.cells_owned,
                    "queue_depth_commands": n.queue_depth_commands,
                    "checkpoint_lag_records": n.checkpoint_lag_records,
                    "publication_mode": n.publication_mode, "log_lanes": n.log_lanes,
                    "commit_p50": n.publication_seconds.as_ref().and_then(|h| bucket_quantile(h, 0.5)),
                    "commit_p99": n.publication_seconds.as_ref().and_then(|h| bucket_quantile(h, 0.99))})
            })
            .collect();
        let unreachable: Vec<serde_json::Value> = stats
            .unreachable
            .iter()
            .map(|u| serde_json::json!({"node_id": u.node_id, "reason": u.reason}))
            .collect();
        println!(
            "{}",
            serde_json::json!({"ok": stats.unreachable.is_empty(), "nodes": nodes, "unreachable": unreachable})
        );
        return Ok(code);
    }
    println!(
        "{:<12} {:>10} {:>10} {:>12} {:>9} {:>6} {:>6} {:>6} {:>11} {:>11}",
        "NODE",
        "COMMANDS",
        "QUERIES",
        "PUBLICATIONS",
        "SEGMENTS",
        "OPEN",
        "OWNED",
        "QUEUE",
        "COMMIT P50",
        "COMMIT P99"
    );
    for n in &stats.nodes {
        let quantile = |q| {
            n.publication_seconds
                .as_ref()
                .and_then(|h| bucket_quantile(h, q))
                .unwrap_or_else(|| "-".into())
        };
        println!(
            "{:<12} {:>10} {:>10} {:>12} {:>9} {:>6} {:>6} {:>6} {:>11} {:>11}",
            n.node_id,
            n.commands_total,
            n.queries_total,
            n.publications_total,
            n.log_segments_total,
            n.cells_open,
            n.cells_owned,
            n.queue_depth_commands,
            quantile(0.5),
            quantile(0.99)
        );
    }
    println!(
        "(counters since each node started; commit latency over every group since, as the bound of \
         its histogram bucket; two --json calls give rates, as the web console does)"
    );
    for u in &stats.unreachable {
        eprintln!(
            "error: live node {} did not answer: {} (its lease is still live: it may be paused, \
             cut off or killed; see `cellfleet leases`)",
            u.node_id, u.reason
        );
    }
    Ok(code)
}

/// The `q`-quantile of a cumulative histogram as the bound of its bucket
/// (`<= 4ms`), `> largest` above every bound, `None` when it is empty
/// (pure).
fn bucket_quantile(histogram: &v1::Histogram, q: f64) -> Option<String> {
    if histogram.count == 0 {
        return None;
    }
    let wanted = q * histogram.count as f64;
    let ms = |seconds: f64| {
        let ms = seconds * 1000.0;
        if ms < 1.0 {
            format!("{ms:.1}ms")
        } else {
            format!("{ms:.0}ms")
        }
    };
    for (bound, cumulative) in histogram.bounds.iter().zip(&histogram.cumulative) {
        if *cumulative as f64 >= wanted {
            return Some(format!("<={}", ms(*bound)));
        }
    }
    Some(format!(">{}", ms(*histogram.bounds.last()?)))
}

/// A lease's state for operators (pure): `late` is a live lease past half
/// its length without a renewal (a node renews several times per lease, so
/// it is likely paused, cut off or killed).
fn lease_state(lease: &v1::NodeLease, now_ms: i64) -> &'static str {
    let length = lease.expires_at_ms - lease.renewed_at_ms;
    match (lease.live, lease.draining) {
        (_, true) => "retired",
        (true, false) if lease.renewed_at_ms > 0 && now_ms - lease.renewed_at_ms > length / 2 => {
            "late"
        }
        (true, false) => "live",
        (false, false) => "expired",
    }
}

fn summary_json(c: &v1::CellSummary) -> serde_json::Value {
    serde_json::json!({"cell_id": c.cell_id, "kind": c.kind,
        "key": String::from_utf8_lossy(&c.key), "owner": c.owner_node_id,
        "epoch": c.epoch, "txid": c.txid, "open": c.open})
}

pub fn cells(args: CellsArgs) -> anyhow::Result<ExitCode> {
    let client = load_client(&args.common)?;
    let request = v1::ListCellsRequest {
        owner_node_id: args.owner.clone().unwrap_or_default(),
        limit: args.limit,
        page_token: args.page_token.clone().unwrap_or_default(),
    };
    let runtime = runtime()?;
    let response = match runtime.block_on(client.cells(request)) {
        Ok(response) => response,
        Err(error) => return Ok(report_error(&error, args.common.json)),
    };
    // Owners whose lease is not live are marked: their Cells move to
    // another node at the next request.
    let leases = runtime.block_on(client.leases()).unwrap_or_default();
    let now = now_ms();
    let owner_state = |owner: &str| -> Option<&'static str> {
        leases
            .iter()
            .find(|l| l.node_id == owner)
            .map(|l| lease_state(l, now))
    };
    if args.common.json {
        print_cells_json(&response, &owner_state);
    } else {
        print_cells_table(&response, &owner_state);
    }
    Ok(ExitCode::SUCCESS)
}

/// `cells --json`: each Cell with its owner's lease state (`null` when
/// the owner has no lease record).
fn print_cells_json(
    response: &v1::ListCellsResponse,
    owner_state: &dyn Fn(&str) -> Option<&'static str>,
) {
    let cells: Vec<_> = response
        .cells
        .iter()
        .map(|c| {
            let mut view = summary_json(c);
            view["owner_lease"] =
                owner_state(&c.owner_node_id).map_or(serde_json::Value::Null, Into::into);
            view
        })
        .collect();
    println!(
        "{}",
        serde_json::json!({"ok": true, "cells": cells, "next_page_token": response.next_page_token})
    );
}

/// `cells`: a table with columns as wide as their longest value, owners
/// whose lease is not live marked, and the next page's command.
fn print_cells_table(
    response: &v1::ListCellsResponse,
    owner_state: &dyn Fn(&str) -> Option<&'static str>,
) {
    let keys: Vec<String> = response
        .cells
        .iter()
        .map(|c| String::from_utf8_lossy(&c.key).into_owned())
        .collect();
    let owners: Vec<String> = response
        .cells
        .iter()
        .map(
            |c| match (c.owner_node_id.as_str(), owner_state(&c.owner_node_id)) {
                ("", _) => "-".to_owned(),
                (owner, Some(state @ ("expired" | "late" | "retired"))) => {
                    format!("{owner} ({state})")
                }
                (owner, _) => owner.to_owned(),
            },
        )
        .collect();
    // Columns as wide as their longest value, so long keys stay aligned.
    let width = |values: &[String], header: &str| {
        values
            .iter()
            .map(|v| v.chars().count())
            .max()
            .unwrap_or(0)
            .max(header.len())
    };
    let (key_width, owner_width) = (width(&keys, "KEY"), width(&owners, "OWNER"));
    let kind_width = response
        .cells
        .iter()
        .map(|c| c.kind.len())
        .max()
        .unwrap_or(0)
        .max(4);
    println!(
        "{:<kind_width$} {:<key_width$} {:<owner_width$} {:>6} {:>9}  CELL",
        "KIND", "KEY", "OWNER", "EPOCH", "ROOT TXID"
    );
    for ((c, key), owner) in response.cells.iter().zip(&keys).zip(&owners) {
        println!(
            "{:<kind_width$} {:<key_width$} {:<owner_width$} {:>6} {:>9}  {}",
            c.kind, key, owner, c.epoch, c.txid, c.cell_id
        );
    }
    println!(
        "(OWNER - : released, e.g. by a drain; the next request places it. ROOT TXID: the \
         state the root holds; in publication mode log, newer records wait in the node log \
         until the next checkpoint (`cellfleet cell show` says where). ds_registry and \
         ds_subscription Cells are the Durable Streams service's own)"
    );
    if !response.next_page_token.is_empty() {
        println!(
            "(more: cellfleet cells --page-token {})",
            response.next_page_token
        );
    }
}

pub fn cell(command: CellCommand) -> anyhow::Result<ExitCode> {
    let CellCommand::Show(args) = command;
    let client = load_client(&args.common)?;
    let result = runtime()?.block_on(client.describe_cell(&args.kind, args.key.as_bytes()));
    let response = match result {
        Ok(response) => response,
        Err(error) => return Ok(report_error(&error, args.common.json)),
    };
    let summary = response.summary.unwrap_or_default();
    if args.common.json {
        let chain: Vec<_> = response
            .chain
            .iter()
            .map(|f| serde_json::json!({"min_txid": f.min_txid, "max_txid": f.max_txid, "size_bytes": f.size_bytes, "object_key": f.object_key, "file_checksum": f.file_checksum, "post_apply_checksum": f.post_apply_checksum}))
            .collect();
        println!(
            "{}",
            serde_json::json!({"ok": true, "summary": summary_json(&summary), "revision": response.revision, "checksum": response.checksum, "chain": chain, "log": response.log.as_ref().map(|p| serde_json::json!({"node_id": p.node_id, "session": p.session, "lane": p.lane, "from_seq": p.from_seq}))})
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!("cell      {}", summary.cell_id);
    println!(
        "kind/key  {}/{}",
        summary.kind,
        String::from_utf8_lossy(&summary.key)
    );
    println!(
        "owner     {}",
        if summary.owner_node_id.is_empty() {
            "- (released)"
        } else {
            &summary.owner_node_id
        }
    );
    println!(
        "epoch     {}   txid {}   revision {}",
        summary.epoch, summary.txid, response.revision
    );
    println!("checksum  {}", response.checksum);
    println!("chain     {} file(s)", response.chain.len());
    for f in &response.chain {
        println!(
            "  {:>6}..{:<6} {:>8} B  file {}  db after {}  {}",
            f.min_txid,
            f.max_txid,
            f.size_bytes,
            f.file_checksum,
            f.post_apply_checksum,
            f.object_key
        );
    }
    match &response.log {
        Some(pointer) => println!(
            "log       node {} session {} lane {} from slot {}: records past txid {} are in the node log until the next checkpoint",
            pointer.node_id, pointer.session, pointer.lane, pointer.from_seq, summary.txid
        ),
        None => println!("log       - (the chain is the whole state)"),
    }
    Ok(ExitCode::SUCCESS)
}

pub fn drain(args: DrainArgs) -> anyhow::Result<ExitCode> {
    let client = load_client(&args.common)?;
    match runtime()?.block_on(client.drain(&args.node_id)) {
        Ok(response) => {
            if args.common.json {
                println!(
                    "{}",
                    serde_json::json!({"ok": true, "node_id": response.node_id, "cells_released": response.cells_released})
                );
            } else {
                println!(
                    "drained {}: {} cell(s) released, lease retired",
                    response.node_id, response.cells_released
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        // No lease of that id: a usage error (the message says where to look).
        Err(Error::Config(message)) => bail!(message),
        Err(error) => Ok(report_error(&error, args.common.json)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn files(path: &str) -> anyhow::Result<String> {
        match path {
            "big.txt" => Ok("x".repeat(3 << 20)),
            "obj.json" => Ok(r#"{"a": 1, "b": "two"}"#.to_owned()),
            _ => bail!("no file {path}"),
        }
    }

    #[test]
    fn quantiles_are_bucket_bounds() {
        let histogram = v1::Histogram {
            bounds: vec![0.0005, 0.001, 0.004],
            cumulative: vec![1, 5, 9],
            count: 10,
        };
        assert_eq!(bucket_quantile(&histogram, 0.1).as_deref(), Some("<=0.5ms"));
        assert_eq!(bucket_quantile(&histogram, 0.5).as_deref(), Some("<=1ms"));
        assert_eq!(bucket_quantile(&histogram, 0.9).as_deref(), Some("<=4ms"));
        assert_eq!(bucket_quantile(&histogram, 0.99).as_deref(), Some(">4ms"));
        assert_eq!(bucket_quantile(&v1::Histogram::default(), 0.5), None);
    }

    #[test]
    fn arguments_come_from_the_line_files_and_stdin() {
        let args = |list: &[&str], json: Option<&str>| {
            let list: Vec<String> = list.iter().map(|s| s.to_string()).collect();
            parse_args_with(&list, json, files, || Ok(r#"{"s": [1, 2]}"#.to_owned()))
        };
        assert_eq!(
            args(&["by=5", "name=abc", "at=@@home"], None).unwrap(),
            json!({"by": 5, "name": "abc", "at": "@home"})
        );
        let big = args(&["text=@big.txt"], None).unwrap();
        assert_eq!(big["text"].as_str().map(str::len), Some(3 << 20));
        assert_eq!(
            args(&["b=3"], Some("@obj.json")).unwrap(),
            json!({"a": 1, "b": 3})
        );
        assert_eq!(args(&[], Some("-")).unwrap(), json!({"s": [1, 2]}));
        let missing = args(&["t=@nope"], None).unwrap_err();
        assert!(
            format!("{missing:#}").contains("--arg t=@nope"),
            "{missing:#}"
        );
        assert!(args(&[], Some("[1]")).is_err());
        assert!(args(&["novalue"], None).is_err());
    }
}
