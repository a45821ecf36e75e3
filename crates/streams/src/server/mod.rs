//! The HTTP/1.1 server: maps Durable Streams requests (PUT, POST, GET, HEAD, DELETE, OPTIONS) to `stream` Cell commands and queries.
//!
//! Ordering: a mutation is answered only after the runtime's `execute`
//! returned, which is after the publication CAS of the group holding it;
//! then waiting readers are woken ([`Notifier`]). Reads are runtime queries,
//! which see only published state.
//!
//! Code map: this module holds the service ([`Streams`]: settings, the
//! request's authorization and routing, and the command and query helpers
//! every handler uses); one module per concern: [`http`] (the accept
//! loop, request helpers and shared responses), [`error`] (the handlers'
//! one error type and its responses), [`create`] (PUT),
//! [`fork`] (copying a prefix and the references between a source and its
//! forks), [`append`] (POST), [`delete`] (DELETE), [`read`] (GET, HEAD,
//! long-polls) and [`sse`] (server-sent events).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cellfleet_cell::{Command, Outcome};
use cellfleet_runtime::NodeHandle;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::Semaphore;

use crate::auth::{self, StreamsAuth};
use crate::backend::{BackendError, LocalBackend, StreamBackend};
use crate::clock::now_ms;
use crate::kinds::stream::{StreamCommand, StreamOutput, StreamQuery, StreamState, STREAM_KIND};
use crate::notify::Notifier;
use crate::settle;
use crate::tail::SharedReads;

mod append;
mod create;
mod delete;
mod error;
mod fork;
mod http;
mod read;
mod sse;
pub mod subscriptions;

pub(crate) use error::Error;
use http::{drain, error, full, header, names, refused, respond, set, wire, EXPOSED};
use subscriptions::Subscriptions;

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
                    set(
                        response.headers_mut(),
                        names::CONTENT_LENGTH,
                        length.to_string(),
                    );
                }
            }
            *response.body_mut() = full(Bytes::new());
        }
        let headers = response.headers_mut();
        set(headers, names::X_CONTENT_TYPE_OPTIONS, "nosniff");
        set(headers, names::CROSS_ORIGIN_RESOURCE_POLICY, "cross-origin");
        set(headers, names::ACCESS_CONTROL_ALLOW_ORIGIN, "*");
        set(
            headers,
            names::ACCESS_CONTROL_ALLOW_METHODS,
            "GET, POST, PUT, DELETE, HEAD, OPTIONS",
        );
        // "*" does not cover Authorization (Fetch standard): it is named.
        set(
            headers,
            names::ACCESS_CONTROL_ALLOW_HEADERS,
            "*, Authorization",
        );
        set(headers, names::ACCESS_CONTROL_EXPOSE_HEADERS, EXPOSED);
        if !headers.contains_key("cache-control") {
            set(headers, names::CACHE_CONTROL, "no-store");
        }
        response
    }

    async fn route(&self, method: Method, request: Request<Incoming>) -> Response<Body> {
        match method {
            _ if subscriptions::is_control_path(request.uri().path()) => {
                subscriptions::handle(self, request).await
            }
            Method::OPTIONS => respond(StatusCode::NO_CONTENT, ""),
            // The handlers that can refuse return an `Error`, answered here.
            Method::PUT => self.create(request).await.unwrap_or_else(Response::from),
            Method::POST => self.append(request).await.unwrap_or_else(Response::from),
            Method::GET => self.read(request).await.unwrap_or_else(Response::from),
            Method::HEAD => self.head(request).await,
            Method::DELETE => self.delete(request).await,
            _ => error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed"),
        }
    }

    async fn execute(&self, path: &str, command: StreamCommand) -> Result<StreamOutput, Error> {
        self.execute_in(STREAM_KIND, path, &command).await
    }

    /// Runs `command` in Cell (`kind`, `key`): streams and the subscription Cells alike.
    pub(crate) async fn execute_in<C: Serialize, O: DeserializeOwned>(
        &self,
        kind: &str,
        key: &str,
        command: &C,
    ) -> Result<O, Error> {
        let (name, args) = wire(command)?;
        let expires_at_ms = now_ms() + 60_000;
        let command = Command::new(rand::random::<[u8; 16]>(), name, args, expires_at_ms);
        let outcome = self.settled(kind, key, command).await?;
        match outcome {
            Outcome::Applied { result } => serde_json::from_value(result)
                .map_err(|_| Error::status(StatusCode::INTERNAL_SERVER_ERROR, "bad stream output")),
            Outcome::Rejected { rejection } => {
                Err(Error::bad(format!("rejected: {}", rejection.message)))
            }
        }
    }

    /// Executes `command`, sending the same command again while its
    /// outcome is unknown (see [`crate::settle`]), so the HTTP client hears
    /// a definite outcome, a definite "not run", or an honest "unknown".
    async fn settled(&self, kind: &str, key: &str, command: Command) -> Result<Outcome, Error> {
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
                settle::Next::Answer => return result.map_err(Error::Backend),
                settle::Next::RetryAfter(wait) => tokio::time::sleep(wait).await,
                settle::Next::GiveUpUnknown => {
                    let reason = match result {
                        Err(error) => error.to_string(),
                        Ok(_) => "settled".to_owned(),
                    };
                    return Err(Error::Backend(BackendError::UnknownOutcome(format!(
                        "still unknown after {attempt} attempts with the same command id: {reason}"
                    ))));
                }
            }
        }
    }

    /// Subscribes a live reader to `path`'s changes (subscribe *before* the
    /// last emptiness check), starting the stream's pump if it has none.
    pub(crate) fn changes(
        &self,
        path: &str,
    ) -> tokio::sync::watch::Receiver<crate::notify::Change> {
        let (changes, start) = self.notifier.subscribe_pumped(path);
        if start {
            tokio::spawn(crate::notify::pump(
                self.notifier.clone(),
                self.backend.clone(),
                path.to_owned(),
            ));
        }
        changes
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

    async fn query(&self, path: &str, query: StreamQuery) -> Result<StreamOutput, Error> {
        self.query_in(STREAM_KIND, path, &query).await
    }

    /// Runs `query` on Cell (`kind`, `key`).
    pub(crate) async fn query_in<Q: Serialize, O: DeserializeOwned>(
        &self,
        kind: &str,
        key: &str,
        query: &Q,
    ) -> Result<O, Error> {
        let (name, args) = wire(query)?;
        let value = self
            .backend
            .query(kind, key.as_bytes(), &name, args)
            .await?;
        serde_json::from_value(value)
            .map_err(|_| Error::status(StatusCode::INTERNAL_SERVER_ERROR, "bad stream output"))
    }

    async fn body(&self, request: Request<Incoming>) -> Result<Bytes, Error> {
        let limit = self.config.body_bytes_max;
        let declared = request
            .headers()
            .get(hyper::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|n| n > limit as u64) {
            // Read the rest before refusing: a client still sending would
            // otherwise see its connection reset (EPIPE) instead of the 413.
            drain(request.into_body()).await;
            return Err(Error::status(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body too large",
            ));
        }
        Limited::new(request.into_body(), limit)
            .collect()
            .await
            .map(|c| c.to_bytes())
            .map_err(|_| Error::status(StatusCode::PAYLOAD_TOO_LARGE, "body too large"))
    }
}
