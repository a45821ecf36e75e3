//! The HTTP/1.1 server: maps Durable Streams requests (PUT, POST, GET, HEAD, DELETE, OPTIONS) to `stream` Cell commands and queries.
//!
//! Ordering: a mutation is answered only after the runtime's `execute`
//! returned, which is after the publication CAS of the group holding it;
//! then waiting readers are woken ([`Notifier`]). Reads are runtime queries,
//! which see only published state.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use bytes::Bytes;
use cellfleet_cell::{Command, Outcome};
use cellfleet_runtime::NodeHandle;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, Semaphore};

use crate::auth::{self, StreamsAuth};
use crate::backend::{BackendError, LocalBackend, StreamBackend};
use crate::clock::now_ms;
use crate::kinds::stream::{
    Lineage, Producer, StreamCommand, StreamConfig, StreamOutput, StreamQuery, StreamState,
    STREAM_KIND,
};
use crate::notify::{self, Notifier};
use crate::offset;
use crate::settle;
use crate::subscriptions::{self, Subscriptions};
use crate::tail::{SharedReads, TailRead};

/// The response body type.
pub type Body = BoxBody<Bytes, Infallible>;

/// Server settings.
#[derive(Clone, Debug)]
pub struct StreamsConfig {
    /// How long a long-poll waits for data before answering 204.
    pub long_poll_timeout: Duration,
    /// Longest an SSE connection stays open (clients reconnect).
    pub sse_lifetime: Duration,
    /// Largest request body accepted.
    pub body_bytes_max: usize,
    /// Connections served at once (long-polls and SSE included); past it a
    /// new connection is answered 503 with Retry-After and closed. Keep it
    /// above `long_polls_max + sse_max` so those bounds answer first.
    pub connections_max: usize,
    /// Long-polls waiting at once on this node; past it a long-poll is
    /// answered 503 with Retry-After.
    pub long_polls_max: usize,
    /// SSE connections open at once on this node; past it 503 with
    /// Retry-After.
    pub sse_max: usize,
    /// Whether subscription webhooks may target loopback addresses (dev and tests only).
    pub allow_loopback_webhooks: bool,
    /// Who may do what ([`StreamsAuth::Anonymous`] unless set; a node
    /// requires tokens unless its TOML says `streams_auth = "none"`).
    pub auth: StreamsAuth,
    /// TLS for the listener (ALPN `h2` and `http/1.1`); plain HTTP when absent.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

impl Default for StreamsConfig {
    fn default() -> Self {
        StreamsConfig {
            long_poll_timeout: Duration::from_secs(20),
            sse_lifetime: Duration::from_secs(60),
            body_bytes_max: 8 << 20,
            connections_max: 24_000,
            long_polls_max: 10_000,
            sse_max: 10_000,
            allow_loopback_webhooks: false,
            auth: StreamsAuth::Anonymous,
            tls: None,
        }
    }
}

/// The streams service of one node.
#[derive(Clone, Debug)]
pub struct Streams {
    backend: Arc<dyn StreamBackend>,
    config: Arc<StreamsConfig>,
    notifier: Arc<Notifier>,
    reads: Arc<SharedReads>,
    live: Arc<LiveLimits>,
    subscriptions: Arc<Subscriptions>,
}

/// Permits for the live modes (per node, in memory: they bound this
/// node's open waits, not anything durable).
#[derive(Debug)]
struct LiveLimits {
    long_polls: Arc<Semaphore>,
    sse: Arc<Semaphore>,
}

impl LiveLimits {
    fn new(config: &StreamsConfig) -> Self {
        LiveLimits {
            long_polls: Arc::new(Semaphore::new(config.long_polls_max)),
            sse: Arc::new(Semaphore::new(config.sse_max)),
        }
    }
}

/// Longest a TLS handshake may take before the connection is dropped.
const TLS_HANDSHAKE: Duration = Duration::from_secs(10);

/// A request without a valid token (401) or not granted (403).
fn refused(refusal: auth::Refusal) -> Response<Body> {
    tracing::debug!(?refusal, "streams request refused");
    let mut response = error(refusal.status(), &refusal.message());
    set(
        response.headers_mut(),
        "www-authenticate",
        refusal.challenge(),
    );
    response
}

/// A live read past its bound: 503, try again in a second.
fn too_many(what: &str) -> Response<Body> {
    let mut response = error(
        StatusCode::SERVICE_UNAVAILABLE,
        &format!("too many open {what} on this node"),
    );
    set(response.headers_mut(), "retry-after", "1");
    response
}

const EXPOSED: &str = "Stream-Next-Offset, Stream-Cursor, Stream-Up-To-Date, Stream-Closed, \
    Stream-TTL, Stream-Expires-At, Stream-Sse-Data-Encoding, Producer-Epoch, Producer-Seq, \
    Producer-Expected-Seq, Producer-Received-Seq, ETag, Location, Content-Type, WWW-Authenticate";

fn full(body: impl Into<Bytes>) -> Body {
    Full::new(body.into()).boxed()
}

fn respond(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    response
}

/// Most bytes of a refused body read (and discarded) before the 413.
const DRAIN_BYTES_MAX: u64 = 64 << 20;
/// Longest a refused body is read before the 413.
const DRAIN_FOR: Duration = Duration::from_secs(5);

/// Reads and discards `body` up to [`DRAIN_BYTES_MAX`] or [`DRAIN_FOR`],
/// so that a client sending a body the server refuses can finish sending
/// and read the refusal.
async fn drain(mut body: Incoming) {
    let read = async {
        let mut seen = 0u64;
        while seen <= DRAIN_BYTES_MAX {
            match body.frame().await {
                Some(Ok(frame)) => {
                    seen += frame.data_ref().map_or(0, |d| d.len() as u64);
                }
                _ => break,
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_FOR, read).await;
}

fn error(status: StatusCode, message: &str) -> Response<Body> {
    let mut response = respond(status, format!("{message}\n"));
    set(response.headers_mut(), "content-type", "text/plain");
    response
}

fn set(headers: &mut HeaderMap, name: &'static str, value: impl AsRef<str>) {
    if let Ok(value) = HeaderValue::from_str(value.as_ref()) {
        headers.insert(name, value);
    }
}

fn header<'a>(request: &'a Request<Incoming>, name: &str) -> Option<&'a str> {
    request.headers().get(name).and_then(|v| v.to_str().ok())
}

fn is_json(content_type: &str) -> bool {
    let media = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    media == "application/json" || media.ends_with("+json")
}

fn is_text(content_type: &str) -> bool {
    let media = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    media.starts_with("text/") || is_json(&media)
}

fn query_params(request: &Request<Incoming>) -> Vec<(String, String)> {
    request
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&text[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Splits a JSON body into messages (a top-level array is flattened).
fn json_messages(body: &[u8], allow_empty: bool) -> Result<Vec<Vec<u8>>, &'static str> {
    let value: Value = serde_json::from_slice(body).map_err(|_| "body is not valid json")?;
    let items = match value {
        Value::Array(items) => {
            if items.is_empty() && !allow_empty {
                return Err("empty json array");
            }
            items
        }
        other => vec![other],
    };
    Ok(items.iter().map(|v| v.to_string().into_bytes()).collect())
}

fn encode(messages: &[Vec<u8>]) -> Vec<String> {
    messages.iter().map(|m| BASE64.encode(m)).collect()
}

/// Joins read messages into the response body for the stream's type.
fn join(state: &StreamState, messages: &[(u64, String)]) -> Vec<u8> {
    let decoded: Vec<Vec<u8>> = messages
        .iter()
        .filter_map(|(_, m)| BASE64.decode(m).ok())
        .collect();
    if is_json(&state.config.content_type) {
        let mut out = b"[".to_vec();
        for (i, m) in decoded.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(m);
        }
        out.push(b']');
        out
    } else {
        decoded.concat()
    }
}

/// The cursor for a live response: the 20 s interval number, moved past
/// the client's so caches never serve the same long-poll twice.
fn cursor(client: Option<&str>) -> String {
    let interval = (now_ms().max(0) as u64) / 20_000;
    match client.and_then(|c| c.parse::<u64>().ok()) {
        Some(c) if c >= interval => (c + 1).to_string(),
        _ => interval.to_string(),
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Control {
    stream_next_offset: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_cursor: Option<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    up_to_date: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream_closed: bool,
}

fn sse_event(kind: &str, data: &str) -> Bytes {
    let mut out = format!("event: {kind}\n");
    // CR, LF and CRLF all end an SSE line: each becomes its own data line,
    // so a payload can never inject an event.
    let normalized = data.replace("\r\n", "\n").replace('\r', "\n");
    for line in normalized.split('\n') {
        out.push_str("data:");
        out.push_str(line);
        out.push('\n');
    }
    out.push('\n');
    Bytes::from(out)
}

enum Mode {
    CatchUp,
    LongPoll,
    Sse,
}

impl Streams {
    /// A service over `node` alone (streams owned elsewhere answer 421).
    pub fn new(node: NodeHandle, config: StreamsConfig) -> Self {
        Self::with_backend(Arc::new(LocalBackend::new(node)), config)
    }

    /// A service whose commands and queries run through `backend` (in a
    /// cluster: routed to each stream's owner).
    pub fn with_backend(backend: Arc<dyn StreamBackend>, config: StreamsConfig) -> Self {
        Streams {
            backend,
            live: Arc::new(LiveLimits::new(&config)),
            config: Arc::new(config),
            notifier: Arc::new(Notifier::default()),
            reads: Arc::new(SharedReads::default()),
            subscriptions: Arc::new(Subscriptions::default()),
        }
    }

    /// Serves `listener` until `shutdown` turns true: HTTP/1.1, and
    /// HTTP/2 (by ALPN over TLS, by prior knowledge over plain TCP).
    pub async fn serve(self, listener: TcpListener, mut shutdown: watch::Receiver<bool>) {
        let permits = Arc::new(Semaphore::new(self.config.connections_max.max(1)));
        let tls = self.config.tls.clone().map(tokio_rustls::TlsAcceptor::from);
        subscriptions::start(&self, shutdown.clone());
        loop {
            let accepted = tokio::select! {
                _ = shutdown.wait_for(|stop| *stop) => return,
                accepted = listener.accept() => accepted,
            };
            let Ok((stream, _)) = accepted else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let Ok(permit) = permits.clone().try_acquire_owned() else {
                if tls.is_none() {
                    tokio::spawn(refuse(stream));
                }
                continue;
            };
            let service = self.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                let _permit = permit;
                let handler = hyper::service::service_fn(move |request| {
                    let service = service.clone();
                    async move { Ok::<_, Infallible>(service.handle(request).await) }
                });
                let builder = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                );
                match tls {
                    None => {
                        let io = hyper_util::rt::TokioIo::new(stream);
                        let _ = builder.serve_connection(io, handler).await;
                    }
                    Some(acceptor) => {
                        // A TLS connection opens with a handshake record
                        // (0x16); anything else is plain HTTP to an HTTPS
                        // port, which gets told so instead of garbage.
                        let mut first = [0u8; 1];
                        let peeked =
                            tokio::time::timeout(TLS_HANDSHAKE, stream.peek(&mut first)).await;
                        if matches!(peeked, Ok(Ok(1))) && first[0] != 0x16 {
                            plain_http_to_tls(stream).await;
                            return;
                        }
                        let handshake =
                            tokio::time::timeout(TLS_HANDSHAKE, acceptor.accept(stream));
                        let Ok(Ok(stream)) = handshake.await else {
                            return;
                        };
                        let io = hyper_util::rt::TokioIo::new(stream);
                        let _ = builder.serve_connection(io, handler).await;
                    }
                }
            });
        }
    }

    /// Answers one request.
    pub async fn handle(&self, request: Request<Incoming>) -> Response<Body> {
        let method = request.method().clone();
        let decided = auth::authorize(
            &self.config.auth,
            &method,
            request.uri().path(),
            header(&request, "authorization"),
            request.uri().query(),
            now_ms(),
        );
        let head = method == Method::HEAD;
        let mut response = match decided {
            Err(refusal) => refused(refusal),
            Ok(_) => self.route(method, request).await,
        };
        if head {
            // A HEAD answer has the GET answer's headers and no body. HTTP/1.1
            // drops the body on the wire; HTTP/2 would send it (and clients
            // reset the stream), so it goes here, keeping its length.
            use hyper::body::Body as _;
            if let Some(length) = response.body().size_hint().exact() {
                if length > 0 && !response.headers().contains_key("content-length") {
                    set(response.headers_mut(), "content-length", length.to_string());
                }
            }
            *response.body_mut() = full(Bytes::new());
        }
        let headers = response.headers_mut();
        set(headers, "x-content-type-options", "nosniff");
        set(headers, "cross-origin-resource-policy", "cross-origin");
        set(headers, "access-control-allow-origin", "*");
        set(
            headers,
            "access-control-allow-methods",
            "GET, POST, PUT, DELETE, HEAD, OPTIONS",
        );
        // "*" does not cover Authorization (Fetch standard): it is named.
        set(headers, "access-control-allow-headers", "*, Authorization");
        set(headers, "access-control-expose-headers", EXPOSED);
        if !headers.contains_key("cache-control") {
            set(headers, "cache-control", "no-store");
        }
        response
    }

    async fn route(&self, method: Method, request: Request<Incoming>) -> Response<Body> {
        match method {
            _ if subscriptions::is_control_path(request.uri().path()) => {
                subscriptions::handle(self, request).await
            }
            Method::OPTIONS => respond(StatusCode::NO_CONTENT, ""),
            Method::PUT => self.create(request).await,
            Method::POST => self.append(request).await,
            Method::GET => self.read(request).await,
            Method::HEAD => self.head(request).await,
            Method::DELETE => self.delete(request).await,
            _ => error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed"),
        }
    }

    async fn execute(
        &self,
        path: &str,
        command: StreamCommand,
    ) -> Result<StreamOutput, Response<Body>> {
        self.execute_in(STREAM_KIND, path, &command).await
    }

    /// Runs `command` in Cell (`kind`, `key`): streams and the subscription Cells alike.
    pub(crate) async fn execute_in<C: Serialize, O: DeserializeOwned>(
        &self,
        kind: &str,
        key: &str,
        command: &C,
    ) -> Result<O, Response<Body>> {
        let (name, args) = wire(command)?;
        let expires_at_ms = now_ms() + 60_000;
        let command = Command::new(rand::random::<[u8; 16]>(), name, args, expires_at_ms);
        let outcome = self.settled(kind, key, command).await?;
        match outcome {
            Outcome::Applied { result } => serde_json::from_value(result)
                .map_err(|_| error(StatusCode::INTERNAL_SERVER_ERROR, "bad stream output")),
            Outcome::Rejected { rejection } => Err(error(
                StatusCode::BAD_REQUEST,
                &format!("rejected: {}", rejection.message),
            )),
        }
    }

    /// Executes `command`, sending the same command again while its
    /// outcome is unknown (see [`crate::settle`]), so the HTTP client hears
    /// a definite outcome, a definite "not run", or an honest "unknown".
    async fn settled(
        &self,
        kind: &str,
        key: &str,
        command: Command,
    ) -> Result<Outcome, Response<Body>> {
        let started = tokio::time::Instant::now();
        let mut in_doubt = false;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let result = self
                .backend
                .execute(kind, key.as_bytes(), command.clone())
                .await;
            let class = settle::classify(&result);
            in_doubt |= class == settle::Attempt::Unknown;
            match settle::next(attempt, started.elapsed(), class, in_doubt) {
                settle::Next::Answer => return result.map_err(backend_error),
                settle::Next::RetryAfter(wait) => tokio::time::sleep(wait).await,
                settle::Next::GiveUpUnknown => {
                    let reason = match result {
                        Err(error) => error.to_string(),
                        Ok(_) => "settled".to_owned(),
                    };
                    return Err(backend_error(BackendError::UnknownOutcome(format!(
                        "still unknown after {attempt} attempts with the same command id: {reason}"
                    ))));
                }
            }
        }
    }

    /// `path`'s published tail is now `tail`: wakes its readers and its subscriptions.
    pub(crate) fn published(&self, path: &str, tail: u64) {
        self.notifier.changed(path);
        subscriptions::stream_changed(self, path, tail);
    }

    pub(crate) fn config(&self) -> &StreamsConfig {
        &self.config
    }

    pub(crate) fn backend(&self) -> &Arc<dyn StreamBackend> {
        &self.backend
    }

    pub(crate) fn subscriptions(&self) -> &Arc<Subscriptions> {
        &self.subscriptions
    }

    /// Renews a TTL stream's expiry after a read (a TTL slides on access).
    /// Slides a TTL stream's expiry after a read, when it is due (a
    /// bounded touch: at most one publication per slack, see
    /// [`crate::kinds::stream::touch_due`]).
    async fn touch(&self, path: &str, state: &StreamState) {
        let now = now_ms();
        let due = state.config.ttl_seconds.is_some_and(|ttl| {
            crate::kinds::stream::touch_due(now, ttl, state.config.expires_at_ms)
        });
        if due {
            let _ = self
                .execute(path, StreamCommand::Touch { now_ms: now })
                .await;
        }
    }

    async fn query(&self, path: &str, query: StreamQuery) -> Result<StreamOutput, Response<Body>> {
        self.query_in(STREAM_KIND, path, &query).await
    }

    /// Runs `query` on Cell (`kind`, `key`).
    pub(crate) async fn query_in<Q: Serialize, O: DeserializeOwned>(
        &self,
        kind: &str,
        key: &str,
        query: &Q,
    ) -> Result<O, Response<Body>> {
        let (name, args) = wire(query)?;
        let value = self
            .backend
            .query(kind, key.as_bytes(), &name, args)
            .await
            .map_err(backend_error)?;
        serde_json::from_value(value)
            .map_err(|_| error(StatusCode::INTERNAL_SERVER_ERROR, "bad stream output"))
    }

    async fn body(&self, request: Request<Incoming>) -> Result<Bytes, Response<Body>> {
        let limit = self.config.body_bytes_max;
        let declared = request
            .headers()
            .get(hyper::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|n| n > limit as u64) {
            // Read the rest before refusing: a client still sending would
            // otherwise see its connection reset (EPIPE) instead of the 413.
            drain(request.into_body()).await;
            return Err(error(StatusCode::PAYLOAD_TOO_LARGE, "body too large"));
        }
        Limited::new(request.into_body(), limit)
            .collect()
            .await
            .map(|c| c.to_bytes())
            .map_err(|_| error(StatusCode::PAYLOAD_TOO_LARGE, "body too large"))
    }

    async fn create(&self, request: Request<Incoming>) -> Response<Body> {
        match self.try_create(request).await {
            Ok(r) | Err(r) => r,
        }
    }

    async fn try_create(
        &self,
        request: Request<Incoming>,
    ) -> Result<Response<Body>, Response<Body>> {
        let path = request.uri().path().to_owned();
        let forked_from = header(&request, "stream-forked-from").map(str::to_owned);
        let fork_offset = header(&request, "stream-fork-offset").map(str::to_owned);
        let sub_offset = match header(&request, "stream-fork-sub-offset") {
            None => 0,
            Some(_) if forked_from.is_none() => {
                return Err(error(
                    StatusCode::BAD_REQUEST,
                    "Stream-Fork-Sub-Offset needs Stream-Forked-From",
                ))
            }
            Some(text) if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) => text
                .parse::<u64>()
                .map_err(|_| error(StatusCode::BAD_REQUEST, "bad Stream-Fork-Sub-Offset"))?,
            Some(_) => {
                return Err(error(
                    StatusCode::BAD_REQUEST,
                    "Stream-Fork-Sub-Offset must be a non-negative integer",
                ))
            }
        };
        if sub_offset > 0 && fork_offset.is_none() {
            return Err(error(
                StatusCode::BAD_REQUEST,
                "Stream-Fork-Sub-Offset > 0 needs Stream-Fork-Offset",
            ));
        }
        let explicit_type = header(&request, "content-type").map(str::to_owned);
        let content_type = explicit_type
            .clone()
            .unwrap_or_else(|| "application/octet-stream".to_owned());
        let ttl = header(&request, "stream-ttl").map(str::to_owned);
        let expires = header(&request, "stream-expires-at").map(str::to_owned);
        let closed =
            header(&request, "stream-closed").is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let host = header(&request, "host").map(str::to_owned);
        let bad = |m: &str| error(StatusCode::BAD_REQUEST, m);
        if ttl.is_some() && expires.is_some() {
            return Err(bad("give Stream-TTL or Stream-Expires-At, not both"));
        }
        let now = now_ms();
        let ttl_seconds = match &ttl {
            Some(t)
                if !t.is_empty()
                    && t.bytes().all(|b| b.is_ascii_digit())
                    && (t == "0" || !t.starts_with('0')) =>
            {
                Some(t.parse::<u64>().map_err(|_| bad("bad Stream-TTL"))?)
            }
            Some(_) => return Err(bad("Stream-TTL must be a non-negative integer")),
            None => None,
        };
        let expires_at_ms = match (&expires, ttl_seconds) {
            (Some(e), _) => Some(parse_time(e).ok_or_else(|| bad("bad Stream-Expires-At"))?),
            (None, Some(t)) => Some(now.saturating_add((t as i64).saturating_mul(1000))),
            (None, None) => None,
        };
        let body = self.body(request).await?;
        let mut content_type = content_type;
        let mut ttl_seconds = ttl_seconds;
        let mut expires_at_ms = expires_at_ms;
        let mut inherited = Vec::new();
        let mut lineage = None;
        // The source this request registered a fork reference with.
        let mut registered = None;
        if let Some(source) = &forked_from {
            let existing = match self
                .query(
                    &path,
                    StreamQuery::Read {
                        offset: None,
                        now_ms: now,
                    },
                )
                .await?
            {
                StreamOutput::Read { state, .. } => Some(state),
                StreamOutput::Gone => return Err(deleted_path()),
                _ => None,
            };
            if let Some(existing) = existing {
                // Created again: compared with the stored fork (lineage
                // included) by the create command; the source is not read,
                // it may be deleted by now.
                if explicit_type.is_none() {
                    content_type = existing.config.content_type.clone();
                }
                if ttl_seconds.is_none() && expires.is_none() {
                    ttl_seconds = existing.config.ttl_seconds;
                }
                let offset = match fork_offset.as_deref() {
                    Some(text) => {
                        offset::parse(text).ok_or_else(|| bad("malformed Stream-Fork-Offset"))?
                    }
                    None => 0,
                };
                lineage = Some(Lineage {
                    source: source.clone(),
                    offset,
                    sub_offset,
                });
            } else {
                let fork = self
                    .fork_prefix(
                        source,
                        fork_offset.as_deref(),
                        sub_offset,
                        explicit_type.as_deref(),
                    )
                    .await?;
                content_type = fork.state.config.content_type.clone();
                if ttl_seconds.is_none() && expires.is_none() {
                    ttl_seconds = fork.state.config.ttl_seconds;
                    expires_at_ms = ttl_seconds
                        .map(|t| now.saturating_add((t as i64).saturating_mul(1000)))
                        .or(fork.state.config.expires_at_ms);
                }
                inherited = fork.messages;
                // The reference is taken before the fork exists: a crash
                // between the two leaves the source with a reference to no
                // fork, so a later soft delete keeps it (410) instead of a
                // fork ever outliving its source's data.
                let registering = StreamCommand::RegisterFork {
                    fork: path.clone(),
                    now_ms: now,
                };
                match self.execute(source, registering).await? {
                    StreamOutput::Registered => {}
                    StreamOutput::Gone => {
                        return Err(error(StatusCode::CONFLICT, "the source was deleted"))
                    }
                    StreamOutput::NotFound => {
                        return Err(error(StatusCode::NOT_FOUND, "no such source stream"))
                    }
                    _ => {
                        return Err(error(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "unexpected output",
                        ))
                    }
                }
                registered = Some(source.clone());
                lineage = Some(Lineage {
                    source: source.clone(),
                    offset: fork.offset,
                    sub_offset,
                });
            }
        } else if fork_offset.is_some() {
            return Err(bad("Stream-Fork-Offset needs Stream-Forked-From"));
        }
        let mut messages = if body.is_empty() {
            Vec::new()
        } else if is_json(&content_type) {
            json_messages(&body, true).map_err(&bad)?
        } else {
            vec![body.to_vec()]
        };
        inherited.append(&mut messages);
        let messages = inherited;
        let config = StreamConfig {
            content_type: content_type.clone(),
            ttl_seconds,
            expires_at: expires,
            expires_at_ms,
        };
        let output = self
            .execute(
                &path,
                StreamCommand::Create {
                    config,
                    closed,
                    messages: encode(&messages),
                    now_ms: now,
                    lineage,
                    fork_offset_given: fork_offset.is_some(),
                },
            )
            .await?;
        if let Some(source) = registered {
            if !matches!(output, StreamOutput::Created { .. }) {
                self.unregister(source, &path).await;
            }
        }
        match output {
            StreamOutput::Created {
                state,
                created,
                release,
            } => {
                if let Some(old) = release {
                    self.release(old, path.clone()).await;
                }
                let status = if created {
                    StatusCode::CREATED
                } else {
                    StatusCode::OK
                };
                let mut response = respond(status, "");
                let headers = response.headers_mut();
                state_headers(headers, &state);
                set(headers, "stream-next-offset", offset::format(state.tail));
                if let Some(host) = host {
                    set(headers, "location", format!("http://{host}{path}"));
                }
                self.published(&path, state.tail);
                Ok(response)
            }
            StreamOutput::ConfigMismatch => Err(error(
                StatusCode::CONFLICT,
                "stream exists with another configuration",
            )),
            StreamOutput::Gone => Err(deleted_path()),
            _ => Err(error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "unexpected output",
            )),
        }
    }

    /// A fork create lost to another stream created at `path` meanwhile:
    /// gives back the reference taken on `source`, unless that stream is
    /// itself a fork of `source` (the reference is then its own). When in
    /// doubt the reference stays (the source is retained, not removed).
    async fn unregister(&self, source: String, path: &str) {
        let read = StreamQuery::Read {
            offset: None,
            now_ms: now_ms(),
        };
        let other = match self.query(path, read).await {
            Ok(StreamOutput::Read { state, .. }) => state.lineage.map(|l| l.source),
            Ok(StreamOutput::NotFound) => None,
            _ => return,
        };
        if other.as_deref() != Some(source.as_str()) {
            self.release(source, path.to_owned()).await;
        }
    }

    /// The source's messages before the fork offset (copied into the fork:
    /// a first pass; forks do not share storage with their source yet).
    async fn fork_prefix(
        &self,
        source: &str,
        fork_offset: Option<&str>,
        sub_offset: u64,
        explicit_type: Option<&str>,
    ) -> Result<Fork, Response<Body>> {
        let bad = |m: &str| error(StatusCode::BAD_REQUEST, m);
        let (state, _, _, _) = self.read_at(source, None).await.map_err(|r| {
            if r.status() == StatusCode::GONE {
                error(StatusCode::CONFLICT, "the source was deleted")
            } else {
                r
            }
        })?;
        if let Some(ct) = explicit_type {
            if media_type(ct) != media_type(&state.config.content_type) {
                return Err(error(
                    StatusCode::CONFLICT,
                    "content type differs from the source's",
                ));
            }
        }
        let end = match fork_offset {
            None => state.tail,
            Some(text) => offset::parse(text).ok_or_else(|| bad("malformed Stream-Fork-Offset"))?,
        };
        if end > state.tail {
            return Err(bad("Stream-Fork-Offset is beyond the source's tail"));
        }
        let mut messages = Vec::new();
        let mut position = 0;
        while position < end {
            let (_, chunk, _, next) = self.read_at(source, Some(position)).await?;
            if chunk.is_empty() {
                break;
            }
            for (start, data) in chunk {
                if start >= end {
                    break;
                }
                let data = BASE64
                    .decode(data)
                    .map_err(|_| error(StatusCode::INTERNAL_SERVER_ERROR, "bad stored data"))?;
                if start + data.len() as u64 > end {
                    return Err(bad("Stream-Fork-Offset is not a message boundary"));
                }
                messages.push(data);
            }
            position = next;
        }
        if sub_offset > 0 {
            // Part of what was appended at the fork offset: the first
            // `sub_offset` bytes (binary) or messages (JSON).
            let (_, after, _, _) = self.read_at(source, Some(end)).await?;
            let decoded: Vec<Vec<u8>> = after
                .iter()
                .filter_map(|(_, m)| BASE64.decode(m).ok())
                .collect();
            if is_json(&state.config.content_type) {
                if sub_offset as usize > decoded.len() {
                    return Err(bad("Stream-Fork-Sub-Offset overshoots the messages"));
                }
                messages.extend(decoded.into_iter().take(sub_offset as usize));
            } else {
                let Some(first) = decoded.into_iter().next() else {
                    return Err(bad("no message at Stream-Fork-Offset"));
                };
                if sub_offset as usize > first.len() {
                    return Err(bad("Stream-Fork-Sub-Offset overshoots the message"));
                }
                messages.push(first[..sub_offset as usize].to_vec());
            }
        }
        Ok(Fork {
            state,
            messages,
            offset: end,
        })
    }

    async fn append(&self, request: Request<Incoming>) -> Response<Body> {
        match self.try_append(request).await {
            Ok(r) | Err(r) => r,
        }
    }

    async fn try_append(
        &self,
        request: Request<Incoming>,
    ) -> Result<Response<Body>, Response<Body>> {
        let path = request.uri().path().to_owned();
        let bad = |m: &str| error(StatusCode::BAD_REQUEST, m);
        let content_type = header(&request, "content-type").map(str::to_owned);
        let close =
            header(&request, "stream-closed").is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let seq = header(&request, "stream-seq").map(str::to_owned);
        let producer = producer_headers(&request).map_err(&bad)?;
        let body = self.body(request).await?;
        if body.is_empty() && !close {
            return Err(bad("empty append"));
        }
        let messages = if body.is_empty() {
            Vec::new()
        } else {
            let Some(ct) = &content_type else {
                return Err(bad("Content-Type is required"));
            };
            if is_json(ct) {
                json_messages(&body, false).map_err(&bad)?
            } else {
                vec![body.to_vec()]
            }
        };
        let output = self
            .execute(
                &path,
                StreamCommand::Append {
                    content_type,
                    messages: encode(&messages),
                    seq,
                    producer,
                    close,
                    now_ms: now_ms(),
                },
            )
            .await?;
        let response = match output {
            StreamOutput::Appended { state, producer } => {
                self.published(&path, state.tail);
                // Close-only requests answer 204 even for producers.
                let status = if producer.is_some() && !messages.is_empty() {
                    StatusCode::OK
                } else {
                    StatusCode::NO_CONTENT
                };
                let mut response = respond(status, "");
                let headers = response.headers_mut();
                set(headers, "stream-next-offset", offset::format(state.tail));
                if state.closed {
                    set(headers, "stream-closed", "true");
                }
                if let Some(p) = producer {
                    set(headers, "producer-epoch", p.epoch.to_string());
                    set(headers, "producer-seq", p.seq.to_string());
                }
                response
            }
            StreamOutput::Duplicate { state, producer } => {
                let mut response = respond(StatusCode::NO_CONTENT, "");
                let headers = response.headers_mut();
                set(headers, "stream-next-offset", offset::format(state.tail));
                if state.closed {
                    set(headers, "stream-closed", "true");
                }
                set(headers, "producer-epoch", producer.epoch.to_string());
                set(headers, "producer-seq", producer.seq.to_string());
                response
            }
            StreamOutput::NotFound => error(StatusCode::NOT_FOUND, "no such stream"),
            StreamOutput::Gone => gone(),
            StreamOutput::ContentTypeMismatch => error(
                StatusCode::CONFLICT,
                "content type does not match the stream's",
            ),
            StreamOutput::Closed { state } => {
                let mut response = error(StatusCode::CONFLICT, "stream is closed");
                set(response.headers_mut(), "stream-closed", "true");
                set(
                    response.headers_mut(),
                    "stream-next-offset",
                    offset::format(state.tail),
                );
                response
            }
            StreamOutput::SeqConflict => error(
                StatusCode::CONFLICT,
                "Stream-Seq is not greater than the last",
            ),
            StreamOutput::StaleEpoch { current_epoch } => {
                let mut response = error(StatusCode::FORBIDDEN, "stale producer epoch");
                set(
                    response.headers_mut(),
                    "producer-epoch",
                    current_epoch.to_string(),
                );
                response
            }
            StreamOutput::InvalidEpochSeq => bad("a new producer epoch must start at seq 0"),
            StreamOutput::SeqGap { expected, received } => {
                let mut response = error(StatusCode::CONFLICT, "producer sequence gap");
                set(
                    response.headers_mut(),
                    "producer-expected-seq",
                    expected.to_string(),
                );
                set(
                    response.headers_mut(),
                    "producer-received-seq",
                    received.to_string(),
                );
                response
            }
            _ => error(StatusCode::INTERNAL_SERVER_ERROR, "unexpected output"),
        };
        Ok(response)
    }

    /// DELETE. A stream with forks is only marked deleted (410 from then
    /// on) and goes with its last fork. A fork removed for good releases
    /// its reference on its source afterwards: a crash between the two
    /// steps leaves the source holding a reference to a fork that is gone,
    /// so a soft-deleted source is kept (410) rather than removed under a
    /// live fork.
    async fn delete(&self, request: Request<Incoming>) -> Response<Body> {
        let path = request.uri().path().to_owned();
        let response = match self
            .execute(&path, StreamCommand::Delete { now_ms: now_ms() })
            .await
        {
            Ok(StreamOutput::Deleted { release }) => {
                if let Some(source) = release {
                    self.release(source, path.clone()).await;
                }
                respond(StatusCode::NO_CONTENT, "")
            }
            Ok(StreamOutput::NotFound) => error(StatusCode::NOT_FOUND, "no such stream"),
            Ok(StreamOutput::Gone) => self.gone_at(&path),
            Ok(_) => error(StatusCode::INTERNAL_SERVER_ERROR, "unexpected output"),
            Err(r) => r,
        };
        self.notifier.changed(&path);
        response
    }

    /// 410 for soft-deleted `path`, after starting a sweep of its fork
    /// references in the background: a fork that expired (or whose path
    /// now holds another stream) gives its reference back, so a deleted
    /// source does not outlive forks that ended by expiry. A fork path with
    /// no stream at all keeps its reference: it may be a fork being
    /// created, or one whose release was cut short by a crash (the source
    /// is then kept, 410, rather than removed too early).
    fn gone_at(&self, path: &str) -> Response<Body> {
        let service = self.clone();
        let path = path.to_owned();
        tokio::spawn(async move { service.sweep(path).await });
        gone()
    }

    async fn sweep(&self, path: String) {
        let Ok(StreamOutput::Forks { forks }) = self.query(&path, StreamQuery::Forks {}).await
        else {
            return;
        };
        for fork in forks {
            let lineage = StreamQuery::Lineage { now_ms: now_ms() };
            let ended = match self.query(&fork, lineage).await {
                Ok(StreamOutput::Lineage { lineage, expired }) => {
                    expired || lineage.map(|l| l.source).as_deref() != Some(path.as_str())
                }
                _ => false,
            };
            if ended {
                self.release(path.clone(), fork).await;
            }
        }
    }

    /// Drops fork `fork`'s reference on `source`, then, each time that
    /// removes a soft-deleted source, that source's reference on its own
    /// source (a chain of deleted forks goes bottom-up). A failed step
    /// stops the walk and leaves the rest retained (410), never removed.
    async fn release(&self, source: String, fork: String) {
        let (mut source, mut fork) = (source, fork);
        // Bounded: a chain is acyclic, but paths are reused.
        for _ in 0..1_000 {
            let released = self
                .execute(
                    &source,
                    StreamCommand::ReleaseFork {
                        fork,
                        now_ms: now_ms(),
                    },
                )
                .await;
            match released {
                Ok(StreamOutput::Released {
                    collected: true,
                    release,
                }) => {
                    self.notifier.changed(&source);
                    match release {
                        Some(next) => (source, fork) = (next, source),
                        None => return,
                    }
                }
                Ok(_) => return,
                Err(_) => {
                    tracing::warn!(%source, "releasing a fork reference failed; the source is kept");
                    return;
                }
            }
        }
    }

    async fn head(&self, request: Request<Incoming>) -> Response<Body> {
        let path = request.uri().path().to_owned();
        match self
            .query(
                &path,
                StreamQuery::Read {
                    offset: None,
                    now_ms: now_ms(),
                },
            )
            .await
        {
            Ok(StreamOutput::Read { state, .. }) => {
                let mut response = respond(StatusCode::OK, "");
                let headers = response.headers_mut();
                state_headers(headers, &state);
                set(headers, "stream-next-offset", offset::format(state.tail));
                response
            }
            Ok(StreamOutput::Gone) => self.gone_at(&path),
            Ok(_) => error(StatusCode::NOT_FOUND, "no such stream"),
            Err(r) => r,
        }
    }

    async fn read(&self, request: Request<Incoming>) -> Response<Body> {
        match self.try_read(request).await {
            Ok(r) | Err(r) => r,
        }
    }

    async fn try_read(&self, request: Request<Incoming>) -> Result<Response<Body>, Response<Body>> {
        let path = request.uri().path().to_owned();
        let bad = |m: &str| error(StatusCode::BAD_REQUEST, m);
        let params = query_params(&request);
        let get = |name: &str| {
            params
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        let mode = match get("live").as_deref() {
            None => Mode::CatchUp,
            Some("long-poll") => Mode::LongPoll,
            Some("sse") => Mode::Sse,
            Some(_) => return Err(bad("live must be long-poll or sse")),
        };
        let offset_param = get("offset");
        if !matches!(mode, Mode::CatchUp) && offset_param.is_none() {
            return Err(bad("live reads need an offset"));
        }
        let start = match offset_param.as_deref() {
            None | Some("-1") => Some(0),
            Some("now") => None,
            Some(text) => Some(offset::parse(text).ok_or_else(|| bad("malformed offset"))?),
        };
        let client_cursor = get("cursor");
        let if_none_match = header(&request, "if-none-match").map(str::to_owned);
        match mode {
            Mode::CatchUp => self.catch_up(&path, start, if_none_match.as_deref()).await,
            Mode::LongPoll => self.long_poll(&path, start, client_cursor.as_deref()).await,
            Mode::Sse => self.sse(&path, start, client_cursor).await,
        }
    }

    async fn read_at(
        &self,
        path: &str,
        start: Option<u64>,
    ) -> Result<(StreamState, Vec<(u64, String)>, u64, u64), Response<Body>> {
        match self
            .query(
                path,
                StreamQuery::Read {
                    offset: start,
                    now_ms: now_ms(),
                },
            )
            .await?
        {
            StreamOutput::Read {
                state,
                messages,
                next,
            } => {
                let from = start.unwrap_or(state.tail);
                Ok((state, messages, from, next))
            }
            StreamOutput::BadOffset => Err(error(
                StatusCode::BAD_REQUEST,
                "offset is not in this stream",
            )),
            StreamOutput::Gone => Err(self.gone_at(path)),
            _ => Err(error(StatusCode::NOT_FOUND, "no such stream")),
        }
    }

    /// A live reader's read at `position` (`None`: the tail), shared with
    /// the other live readers there whose wake came no later than its
    /// start ([`crate::tail`]).
    async fn read_live(
        &self,
        path: &str,
        position: Option<u64>,
        woke: tokio::time::Instant,
    ) -> Result<Arc<TailRead>, Response<Body>> {
        let own = |read| Arc::new(TailRead::new(read));
        let Some(at) = position else {
            return self.read_at(path, None).await.map(own);
        };
        let shared = self
            .reads
            .get(path, at, woke, || async {
                Some(TailRead::new(self.read_at(path, Some(at)).await.ok()?))
            })
            .await;
        match shared {
            Some(read) => Ok(read),
            // The shared read failed: this reader's own read gives the answer.
            None => self.read_at(path, Some(at)).await.map(own),
        }
    }

    async fn catch_up(
        &self,
        path: &str,
        start: Option<u64>,
        if_none_match: Option<&str>,
    ) -> Result<Response<Body>, Response<Body>> {
        let (state, messages, from, next) = self.read_at(path, start).await?;
        self.touch(path, &state).await;
        let up_to_date = next == state.tail;
        let closed = up_to_date && state.closed;
        let etag = format!(
            "\"{}:{}{}\"",
            offset::format(from),
            offset::format(next),
            if closed { ":c" } else { "" }
        );
        if if_none_match == Some(etag.as_str()) {
            let mut response = respond(StatusCode::NOT_MODIFIED, "");
            set(response.headers_mut(), "etag", &etag);
            return Ok(response);
        }
        let mut response = respond(StatusCode::OK, join(&state, &messages));
        let headers = response.headers_mut();
        set(headers, "content-type", &state.config.content_type);
        set(headers, "stream-next-offset", offset::format(next));
        set(headers, "etag", &etag);
        if up_to_date {
            set(headers, "stream-up-to-date", "true");
        }
        if closed {
            set(headers, "stream-closed", "true");
        }
        Ok(response)
    }

    async fn long_poll(
        &self,
        path: &str,
        start: Option<u64>,
        client_cursor: Option<&str>,
    ) -> Result<Response<Body>, Response<Body>> {
        // Held until the answer is ready; never waited for.
        let Ok(_permit) = self.live.long_polls.clone().try_acquire_owned() else {
            return Err(too_many("long-polls"));
        };
        let deadline = tokio::time::Instant::now() + self.config.long_poll_timeout;
        // Subscribe before the emptiness check, so an append between the
        // check and the wait still wakes this reader.
        let mut changes = self.notifier.subscribe(path);
        let mut woke = tokio::time::Instant::now();
        let mut position = start;
        let mut touched = false;
        loop {
            let read = self.read_live(path, position, woke).await?;
            let (state, from, next) = (&read.state, read.from, read.next);
            if !touched {
                touched = true;
                self.touch(path, state).await;
            }
            position = Some(from);
            if !read.messages.is_empty() {
                let body = read
                    .body
                    .get_or_init(|| Bytes::from(join(state, &read.messages)))
                    .clone();
                let mut response = respond(StatusCode::OK, body);
                let headers = response.headers_mut();
                set(headers, "content-type", &state.config.content_type);
                set(headers, "stream-next-offset", offset::format(next));
                set(headers, "stream-cursor", cursor(client_cursor));
                if next == state.tail {
                    set(headers, "stream-up-to-date", "true");
                    if state.closed {
                        set(headers, "stream-closed", "true");
                    }
                }
                return Ok(response);
            }
            if state.closed || tokio::time::Instant::now() >= deadline {
                let mut response = respond(StatusCode::NO_CONTENT, "");
                let headers = response.headers_mut();
                set(headers, "content-type", &state.config.content_type);
                set(headers, "stream-next-offset", offset::format(from));
                set(headers, "stream-up-to-date", "true");
                if state.closed {
                    set(headers, "stream-closed", "true");
                } else {
                    set(headers, "stream-cursor", cursor(client_cursor));
                }
                return Ok(response);
            }
            woke = notify::wait(&mut changes, deadline).await;
        }
    }

    async fn sse(
        &self,
        path: &str,
        start: Option<u64>,
        client_cursor: Option<String>,
    ) -> Result<Response<Body>, Response<Body>> {
        // Held by the writer task until the connection ends.
        let Ok(permit) = self.live.sse.clone().try_acquire_owned() else {
            return Err(too_many("SSE connections"));
        };
        let mut changes = self.notifier.subscribe(path);
        let first = self
            .read_live(path, start, tokio::time::Instant::now())
            .await?;
        self.touch(path, &first.state).await;
        let binary = !is_text(&first.state.config.content_type);
        let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, Infallible>>(16);
        let service = self.clone();
        let path = path.to_owned();
        let deadline = tokio::time::Instant::now() + self.config.sse_lifetime;
        tokio::spawn(async move {
            let _permit = permit;
            let session = SseSession {
                service,
                path,
                tx,
                deadline,
                binary,
                client_cursor,
            };
            session.run(&mut changes, first).await;
        });
        let body = StreamBody::new(ReceiverBody(rx)).boxed();
        let mut response = Response::new(body);
        let headers = response.headers_mut();
        set(headers, "content-type", "text/event-stream");
        set(headers, "cache-control", "no-cache");
        if binary {
            set(headers, "stream-sse-data-encoding", "base64");
        }
        Ok(response)
    }
}

/// What a fork inherits from its source.
struct Fork {
    state: StreamState,
    messages: Vec<Vec<u8>>,
    /// The source offset it is cut at.
    offset: u64,
}

fn media_type(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

struct ReceiverBody(mpsc::Receiver<Result<Frame<Bytes>, Infallible>>);

impl tokio_stream::Stream for ReceiverBody {
    type Item = Result<Frame<Bytes>, Infallible>;
    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}

/// One SSE connection's writer task.
struct SseSession {
    service: Streams,
    path: String,
    tx: mpsc::Sender<Result<Frame<Bytes>, Infallible>>,
    deadline: tokio::time::Instant,
    binary: bool,
    client_cursor: Option<String>,
}

impl SseSession {
    async fn send(&self, bytes: Bytes) -> bool {
        self.tx.send(Ok(Frame::data(bytes))).await.is_ok()
    }

    /// Data event (when any), then a control event; `false` ends the connection.
    async fn emit(&self, read: &TailRead) -> bool {
        let (state, messages, next) = (&read.state, &read.messages, read.next);
        if !messages.is_empty() {
            // Built once per shared read, whoever sends it first.
            let payload = read.sse_data.get_or_init(|| {
                if self.binary {
                    let raw: Vec<u8> = messages
                        .iter()
                        .filter_map(|(_, m)| BASE64.decode(m).ok())
                        .flatten()
                        .collect();
                    BASE64.encode(raw)
                } else {
                    String::from_utf8_lossy(&join(state, messages)).into_owned()
                }
            });
            if !self.send(sse_event("data", payload)).await {
                return false;
            }
        }
        let up_to_date = next == state.tail;
        let closed = up_to_date && state.closed;
        let control = Control {
            stream_next_offset: offset::format(next),
            stream_cursor: (!closed).then(|| cursor(self.client_cursor.as_deref())),
            up_to_date,
            stream_closed: closed,
        };
        let text = serde_json::to_string(&control).unwrap_or_default();
        self.send(sse_event("control", &text)).await && !closed
    }

    async fn run(self, changes: &mut watch::Receiver<notify::Change>, first: Arc<TailRead>) {
        if !self.emit(&first).await {
            return;
        }
        let mut next = first.next;
        let mut idle = next == first.state.tail;
        while tokio::time::Instant::now() < self.deadline {
            // Catching up, a read is good if it starts from now on; idle,
            // one started after the wake's signal is.
            let mut woke = tokio::time::Instant::now();
            if idle {
                // A client that went away frees its SSE permit now, not at
                // the next event.
                tokio::select! {
                    at = notify::wait(changes, self.deadline) => woke = at,
                    _ = self.tx.closed() => return,
                }
            }
            let Ok(read) = self.service.read_live(&self.path, Some(next), woke).await else {
                return;
            };
            idle = read.next == read.state.tail;
            if read.messages.is_empty() && !read.state.closed {
                continue;
            }
            if !self.emit(&read).await {
                return;
            }
            next = read.next;
        }
    }
}

/// Answers a plain HTTP request on the HTTPS listener with 400 and the
/// scheme to use, and closes the connection (bounded: one write, one second).
async fn plain_http_to_tls(mut stream: tokio::net::TcpStream) {
    use tokio::io::AsyncWriteExt;
    const BODY: &str = "this port serves HTTPS: use https:// (the listener has TLS; \
        listen.streams_tls = \"none\" turns it off)\n";
    let reply = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{BODY}",
        BODY.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = stream.write_all(reply.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

/// Answers a connection over `connections_max` with 503 and closes it,
/// without reading its request (bounded: one write, one second).
async fn refuse(mut stream: tokio::net::TcpStream) {
    use tokio::io::AsyncWriteExt;
    const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 1\r\n\
        content-type: text/plain\r\ncontent-length: 32\r\nconnection: close\r\n\r\n\
        too many connections; try again\n";
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = stream.write_all(BUSY).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

fn wire<T: Serialize>(value: &T) -> Result<(String, Value), Response<Body>> {
    let fail = || error(StatusCode::INTERNAL_SERVER_ERROR, "command does not encode");
    let Ok(Value::Object(mut map)) = serde_json::to_value(value) else {
        return Err(fail());
    };
    let Some(Value::String(name)) = map.remove("name") else {
        return Err(fail());
    };
    let args = map
        .remove("args")
        .unwrap_or(Value::Object(Default::default()));
    Ok((name, args))
}

fn backend_error(e: BackendError) -> Response<Body> {
    let (status, message) = match &e {
        BackendError::NotOwner(_) => (StatusCode::MISDIRECTED_REQUEST, e.to_string()),
        BackendError::BadRequest(_) => (StatusCode::BAD_REQUEST, e.to_string()),
        BackendError::UnknownOutcome(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "outcome unknown: the request may or may not have been applied \
                 (the stream's owner stopped answering after it was sent: {reason}); \
                 read the stream (or use an idempotent producer) before retrying"
            ),
        ),
        BackendError::Unavailable { .. } => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
        BackendError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let mut response = error(status, &message);
    if let BackendError::Unavailable {
        retry_after_ms: Some(retry_after_ms),
        ..
    } = e
    {
        set(
            response.headers_mut(),
            "retry-after",
            retry_after_ms.div_ceil(1000).max(1).to_string(),
        );
    }
    response
}

/// A soft-deleted stream (deleted while forks of it exist).
fn gone() -> Response<Body> {
    error(StatusCode::GONE, "stream was deleted")
}

/// Creating at the path of a soft-deleted stream: taken until its forks
/// are gone.
fn deleted_path() -> Response<Body> {
    error(
        StatusCode::CONFLICT,
        "a deleted stream keeps this path until its forks are deleted",
    )
}

fn state_headers(headers: &mut HeaderMap, state: &StreamState) {
    set(headers, "content-type", &state.config.content_type);
    if let Some(ttl) = state.config.ttl_seconds {
        set(headers, "stream-ttl", ttl.to_string());
    }
    if let Some(at) = &state.config.expires_at {
        set(headers, "stream-expires-at", at);
    }
    if state.closed {
        set(headers, "stream-closed", "true");
    }
}

fn producer_headers(request: &Request<Incoming>) -> Result<Option<Producer>, &'static str> {
    let id = header(request, "producer-id");
    let epoch = header(request, "producer-epoch");
    let seq = header(request, "producer-seq");
    match (id, epoch, seq) {
        (None, None, None) => Ok(None),
        (Some(id), Some(epoch), Some(seq)) => {
            let number = |t: &str| {
                if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
                    return Err("producer epoch and seq must be non-negative integers");
                }
                t.parse::<u64>().map_err(|_| "producer number too large")
            };
            if id.is_empty() {
                return Err("empty Producer-Id");
            }
            Ok(Some(Producer {
                id: id.to_owned(),
                epoch: number(epoch)?,
                seq: number(seq)?,
            }))
        }
        _ => Err("Producer-Id, Producer-Epoch and Producer-Seq go together"),
    }
}

fn parse_time(text: &str) -> Option<i64> {
    let at =
        time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).ok()?;
    i64::try_from(at.unix_timestamp_nanos() / 1_000_000).ok()
}
