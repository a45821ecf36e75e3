//! The web console: a read-only page on every node (`/ui/`) over the same admin calls as the CLI (ListLeases, NodeStats, ListCells, DescribeCell), its assets compiled into the binary.
//!
//! Served on `listen.console`: HTTPS with the node's certificate and a
//! client certificate from the cluster CA required (the client listener's
//! rule: the same certificates `cellfleet leases` uses), or plain HTTP
//! for local development, where only requests naming the host by an IP
//! address or `localhost` are answered (a page of another site that
//! rebinds its name to this address gets 421). One request per
//! connection, as [`crate::http`]; [`route`] is the pure part.

use std::sync::Arc;
use std::time::Duration;

use cellfleet_proto::v1;
use cellfleet_proto::v1::admin_server::Admin;
use rustls::ServerConfig;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tonic::Request;

use crate::forward::Router;
use crate::http::{accept, read_head, request_line, write_response, REQUEST_TIMEOUT};
use crate::service_admin::{AdminService, CELLS_PAGE_MAX};

/// Cells one search reads (in ListCells pages) before it stops and offers
/// to go on from where it stopped.
pub const CELLS_SCAN_MAX: usize = 10_000;
/// Cells one search answers.
pub const CELLS_SHOWN_MAX: usize = 200;
/// Longest a TLS handshake may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

const INDEX_HTML: &str = include_str!("console/index.html");
const APP_JS: &str = include_str!("console/app.js");
const STYLE_CSS: &str = include_str!("console/style.css");

/// Every answer's security headers: the page loads only its own assets
/// and may not be framed.
const SECURITY_HEADERS: [(&str, &str); 4] = [
    (
        "content-security-policy",
        "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    ),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("cache-control", "no-store"),
];

/// What a request asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// A redirect to this path.
    Redirect(&'static str),
    /// A compiled-in asset: content type and body.
    Asset(&'static str, &'static str),
    /// Leases and every node's stats.
    Cluster,
    /// A search of the Cells.
    Cells(CellsQuery),
    /// One Cell's root, by Cell id.
    Cell(String),
    /// Nothing here.
    NotFound,
    /// Not a GET.
    MethodNotAllowed,
}

/// A search of the Cells: every filter optional.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CellsQuery {
    /// Only this kind.
    pub kind: String,
    /// Key (as UTF-8, lossy, any case) containing this, or Cell id
    /// starting with it.
    pub text: String,
    /// Only Cells this node owns.
    pub owner: String,
    /// Go on after this Cell id (a previous answer's `next`).
    pub after: String,
}

/// What `method` on `target` (path and query) asks for (pure).
pub fn route(method: &str, target: &str) -> Route {
    if method != "GET" {
        return Route::MethodNotAllowed;
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let params = query_pairs(query);
    let param = |name: &str| {
        params
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.clone())
            .unwrap_or_default()
    };
    match path {
        "/" | "/ui" => Route::Redirect("/ui/"),
        "/ui/" | "/ui/index.html" => Route::Asset("text/html; charset=utf-8", INDEX_HTML),
        "/ui/app.js" => Route::Asset("text/javascript; charset=utf-8", APP_JS),
        "/ui/style.css" => Route::Asset("text/css; charset=utf-8", STYLE_CSS),
        "/ui/api/cluster" => Route::Cluster,
        "/ui/api/cells" => Route::Cells(CellsQuery {
            kind: param("kind"),
            text: param("q"),
            owner: param("owner"),
            after: param("after"),
        }),
        "/ui/api/cell" => Route::Cell(param("id")),
        _ => Route::NotFound,
    }
}

/// The `name=value` pairs of a query string, percent-decoded (`+` is a
/// space); a pair that does not decode to UTF-8 is left out.
pub fn query_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .filter_map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            Some((decode_component(name)?, decode_component(value)?))
        })
        .collect()
}

/// One percent-encoded query component, `None` if it is malformed or not
/// UTF-8.
pub fn decode_component(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        match bytes[at] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes.get(at + 1..at + 3)?;
                let hex = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                at += 2;
            }
            byte => out.push(byte),
        }
        at += 1;
    }
    String::from_utf8(out).ok()
}

/// Whether a plain-HTTP request may be answered: its `Host` names the
/// node by an IP address or `localhost` (with or without a port), so a
/// page of another site cannot reach it by rebinding a name (pure).
pub fn host_allowed(head: &[u8]) -> bool {
    let text = String::from_utf8_lossy(head);
    let Some(host) = text.split("\r\n").skip(1).find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("host")
            .then(|| value.trim().to_owned())
    }) else {
        return false;
    };
    let name = if let Some(rest) = host.strip_prefix('[') {
        match rest.split_once(']') {
            Some((inside, _)) => return inside.parse::<std::net::Ipv6Addr>().is_ok(),
            None => return false,
        }
    } else {
        host.rsplit_once(':')
            .map_or(host.as_str(), |(name, _)| name)
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::Ipv4Addr>().is_ok()
}

/// The console of one node.
#[derive(Clone, Debug)]
pub struct Console {
    admin: AdminService,
    router: Arc<Router>,
}

impl Console {
    /// The console of the node whose admin service is `admin`.
    pub fn new(admin: AdminService, router: Arc<Router>) -> Self {
        Console { admin, router }
    }

    /// Serves on `listener` until `shutdown` turns true: HTTPS with `tls`
    /// (client certificates required by it), or plain HTTP without.
    pub async fn serve(
        self,
        listener: TcpListener,
        tls: Option<Arc<ServerConfig>>,
        shutdown: watch::Receiver<bool>,
    ) {
        let acceptor = tls.map(TlsAcceptor::from);
        accept(listener, shutdown, move |stream| {
            let (console, acceptor) = (self.clone(), acceptor.clone());
            async move { console.connection(stream, acceptor).await }
        })
        .await
    }

    async fn connection(&self, stream: TcpStream, acceptor: Option<TlsAcceptor>) {
        match acceptor {
            Some(acceptor) => {
                let Ok(Ok(stream)) =
                    tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await
                else {
                    return;
                };
                let _ = tokio::time::timeout(REQUEST_TIMEOUT, self.answer(stream, false)).await;
            }
            None => {
                let _ = tokio::time::timeout(REQUEST_TIMEOUT, self.answer(stream, true)).await;
            }
        }
    }

    async fn answer<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        mut stream: S,
        plain: bool,
    ) -> std::io::Result<()> {
        let head = read_head(&mut stream).await?;
        let (method, target) = request_line(&head).unwrap_or_default();
        if plain && !host_allowed(&head) {
            let body = b"plain-HTTP console: name the node by IP address or localhost\n";
            return write_response(
                &mut stream,
                "421 Misdirected Request",
                "text/plain",
                &SECURITY_HEADERS,
                body,
            )
            .await;
        }
        let (status, content_type, body) = match route(&method, &target) {
            Route::Redirect(to) => {
                let mut headers = SECURITY_HEADERS.to_vec();
                headers.push(("location", to));
                return write_response(&mut stream, "302 Found", "text/plain", &headers, b"").await;
            }
            Route::Asset(content_type, body) => ("200 OK", content_type, body.as_bytes().to_vec()),
            Route::MethodNotAllowed => (
                "405 Method Not Allowed",
                "text/plain",
                b"the console is read-only: GET only\n".to_vec(),
            ),
            Route::NotFound => (
                "404 Not Found",
                "text/plain",
                b"not found: the console is at /ui/\n".to_vec(),
            ),
            Route::Cluster => json_answer(self.cluster().await),
            Route::Cells(query) => json_answer(self.cells(query).await),
            Route::Cell(id) => json_answer(self.cell(&id).await),
        };
        write_response(&mut stream, status, content_type, &SECURITY_HEADERS, &body).await
    }

    /// Leases (Admin.ListLeases) and every live node's stats
    /// (Admin.NodeStats).
    async fn cluster(&self) -> Result<Value, tonic::Status> {
        let leases = self
            .admin
            .list_leases(Request::new(v1::ListLeasesRequest {
                // Polled every second: each node's own count (NodeStats)
                // instead of a read of every root in the bucket.
                skip_owned_cells: true,
            }))
            .await?
            .into_inner()
            .leases;
        let stats = self
            .admin
            .node_stats(Request::new(v1::NodeStatsRequest {}))
            .await?
            .into_inner();
        Ok(json!({
            "node_id": self.router.node().node_id().as_str(),
            "now_ms": self.router.now_ms(),
            "leases": leases.iter().map(lease_json).collect::<Vec<_>>(),
            "stats": stats.nodes.iter().map(stats_json).collect::<Vec<_>>(),
            "unreachable": stats.unreachable.iter()
                .map(|u| json!({"node_id": u.node_id, "reason": u.reason}))
                .collect::<Vec<_>>(),
        }))
    }

    /// Cells matching `query` (Admin.ListCells pages), at most
    /// [`CELLS_SHOWN_MAX`] of them, reading at most [`CELLS_SCAN_MAX`].
    async fn cells(&self, query: CellsQuery) -> Result<Value, tonic::Status> {
        let mut shown = Vec::new();
        let mut scanned = 0;
        let mut token = query.after.clone();
        let text = query.text.to_lowercase();
        let next = loop {
            let page = self
                .admin
                .list_cells(Request::new(v1::ListCellsRequest {
                    owner_node_id: query.owner.clone(),
                    limit: CELLS_PAGE_MAX as u32,
                    page_token: token.clone(),
                }))
                .await?
                .into_inner();
            scanned += page.cells.len();
            for cell in &page.cells {
                let key = String::from_utf8_lossy(&cell.key).to_lowercase();
                let matches = (query.kind.is_empty() || cell.kind == query.kind)
                    && (text.is_empty() || key.contains(&text) || cell.cell_id.starts_with(&text));
                if matches {
                    shown.push(summary_json(cell));
                    if shown.len() == CELLS_SHOWN_MAX {
                        break;
                    }
                }
            }
            if shown.len() == CELLS_SHOWN_MAX {
                break shown
                    .last()
                    .and_then(|c| c["cell_id"].as_str())
                    .map(str::to_owned);
            }
            if page.next_page_token.is_empty() {
                break None;
            }
            if scanned >= CELLS_SCAN_MAX {
                break Some(page.next_page_token);
            }
            token = page.next_page_token;
        };
        Ok(json!({"cells": shown, "scanned": scanned, "next": next}))
    }

    /// One Cell's root (Admin.DescribeCell).
    async fn cell(&self, id: &str) -> Result<Value, tonic::Status> {
        let cell = self
            .admin
            .describe_cell(Request::new(v1::DescribeCellRequest {
                cell: Some(v1::describe_cell_request::Cell::CellId(id.to_owned())),
            }))
            .await?
            .into_inner();
        Ok(json!({
            "summary": cell.summary.as_ref().map(summary_json),
            "revision": cell.revision,
            "checksum": cell.checksum,
            "chain": cell.chain.iter().map(|file| json!({
                "min_txid": file.min_txid, "max_txid": file.max_txid,
                "size_bytes": file.size_bytes, "object_key": file.object_key,
                "file_checksum": file.file_checksum,
                "post_apply_checksum": file.post_apply_checksum,
            })).collect::<Vec<_>>(),
            "log": cell.log.as_ref().map(|log| json!({
                "node_id": log.node_id, "session": log.session,
                "lane": log.lane, "from_seq": log.from_seq,
            })),
        }))
    }
}

fn json_answer(result: Result<Value, tonic::Status>) -> (&'static str, &'static str, Vec<u8>) {
    match result {
        Ok(value) => ("200 OK", "application/json", value.to_string().into_bytes()),
        Err(status) => {
            let http = match status.code() {
                tonic::Code::NotFound => "404 Not Found",
                tonic::Code::InvalidArgument => "400 Bad Request",
                _ => "503 Service Unavailable",
            };
            let body = json!({"error": status.message(), "code": format!("{:?}", status.code())});
            (http, "application/json", body.to_string().into_bytes())
        }
    }
}

fn lease_json(lease: &v1::NodeLease) -> Value {
    json!({
        "node_id": lease.node_id, "session_id": lease.session_id,
        "endpoint": lease.endpoint, "peer_endpoint": lease.peer_endpoint,
        "expires_at_ms": lease.expires_at_ms, "renewed_at_ms": lease.renewed_at_ms,
        "live": lease.live, "draining": lease.draining,
        "owned_cells": lease.owned_cells, "ingress_only": lease.ingress_only,
    })
}

fn histogram_json(histogram: Option<&v1::Histogram>) -> Value {
    let Some(histogram) = histogram else {
        return Value::Null;
    };
    json!({
        "bounds": histogram.bounds, "cumulative": histogram.cumulative,
        "count": histogram.count,
    })
}

fn stats_json(stats: &v1::NodeStats) -> Value {
    json!({
        "node_id": stats.node_id, "at_ms": stats.at_ms,
        "commands_total": stats.commands_total, "queries_total": stats.queries_total,
        "publications_total": stats.publications_total,
        "log_segments_total": stats.log_segments_total,
        "checkpoints_total": stats.checkpoints_total,
        "refusals_total": stats.refusals_total,
        "cells_open": stats.cells_open, "cells_owned": stats.cells_owned,
        "queue_depth_commands": stats.queue_depth_commands,
        "checkpoint_lag_records": stats.checkpoint_lag_records,
        "publication_seconds": histogram_json(stats.publication_seconds.as_ref()),
        "log_segment_put_seconds": histogram_json(stats.log_segment_put_seconds.as_ref()),
        "publication_mode": stats.publication_mode, "log_lanes": stats.log_lanes,
    })
}

fn summary_json(cell: &v1::CellSummary) -> Value {
    let hex: String = cell.key.iter().map(|b| format!("{b:02x}")).collect();
    json!({
        "cell_id": cell.cell_id, "kind": cell.kind,
        "key": String::from_utf8_lossy(&cell.key), "key_hex": hex,
        "owner": cell.owner_node_id, "epoch": cell.epoch, "txid": cell.txid,
        "open": cell.open,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn routes() {
        assert_eq!(route("GET", "/"), Route::Redirect("/ui/"));
        assert_eq!(route("GET", "/ui"), Route::Redirect("/ui/"));
        assert!(matches!(route("GET", "/ui/"), Route::Asset(t, _) if t.starts_with("text/html")));
        assert!(
            matches!(route("GET", "/ui/app.js"), Route::Asset(t, _) if t.starts_with("text/javascript"))
        );
        assert_eq!(route("GET", "/ui/api/cluster?x=1"), Route::Cluster);
        assert_eq!(
            route("GET", "/ui/api/cells?kind=kv&q=a+b%2Fc&owner=n2&after=x"),
            Route::Cells(CellsQuery {
                kind: "kv".into(),
                text: "a b/c".into(),
                owner: "n2".into(),
                after: "x".into(),
            })
        );
        assert_eq!(
            route("GET", "/ui/api/cell?id=abc"),
            Route::Cell("abc".into())
        );
        assert_eq!(route("POST", "/ui/api/cluster"), Route::MethodNotAllowed);
        assert_eq!(route("GET", "/ui/../etc/passwd"), Route::NotFound);
        assert_eq!(route("GET", "/metrics"), Route::NotFound);
    }

    #[test]
    fn malformed_components_are_left_out() {
        assert_eq!(decode_component("%zz"), None);
        assert_eq!(decode_component("%4"), None);
        assert_eq!(decode_component("%ff"), None, "not UTF-8");
        assert_eq!(decode_component("%C3%A9"), Some("é".into()));
        assert_eq!(
            query_pairs("a=1&b=%zz&&c"),
            vec![("a".into(), "1".into()), ("c".into(), String::new())]
        );
    }

    #[test]
    fn plain_http_answers_ip_literals_and_localhost_only() {
        let head = |host: &str| format!("GET /ui/ HTTP/1.1\r\nHost: {host}\r\n\r\n").into_bytes();
        for ok in [
            "127.0.0.1:7401",
            "127.0.0.1",
            "localhost:7401",
            "LOCALHOST",
            "[::1]:7401",
            "10.0.0.5:80",
        ] {
            assert!(host_allowed(&head(ok)), "{ok}");
        }
        for refused in [
            "evil.example:7401",
            "evil.example",
            "127.0.0.1.nip.io:7401",
            "[evil]:1",
            "",
        ] {
            assert!(!host_allowed(&head(refused)), "{refused}");
        }
        assert!(
            !host_allowed(b"GET /ui/ HTTP/1.1\r\n\r\n"),
            "no Host header"
        );
    }

    fn encode(text: &str) -> String {
        text.bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect()
    }

    proptest! {
        #[test]
        fn encoded_components_decode_to_themselves(text in "\\PC*") {
            prop_assert_eq!(decode_component(&encode(&text)), Some(text));
        }

        #[test]
        fn any_target_routes_without_panicking(target in "\\PC{0,200}", bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = route("GET", &target);
            let _ = query_pairs(&target);
            let _ = host_allowed(&bytes);
            let lossy = String::from_utf8_lossy(&bytes);
            let _ = decode_component(&lossy);
        }
    }
}
