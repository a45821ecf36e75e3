//! The HTTP side of the server: the accept loop (TLS and plain, HTTP/1.1 and HTTP/2), the request helpers (headers, query parameters, JSON bodies) and the responses every handler shares (errors, stream headers, backend failures).

use super::error::Error;
use super::subscriptions;
use super::{Body, Streams};
use crate::auth;
use crate::kinds::stream::{media_type, StreamState};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use bytes::Bytes;
use cellfleet_runtime::accept::accept_connections;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use serde::Serialize;
use serde_json::Value;
use std::convert::Infallible;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Longest a TLS handshake may take before the connection is dropped.
pub(super) const TLS_HANDSHAKE: Duration = Duration::from_secs(10);

/// A request without a valid token (401) or not granted (403).
pub(super) fn refused(refusal: auth::Refusal) -> Response<Body> {
    tracing::debug!(?refusal, "streams request refused");
    let mut response = error(refusal.status(), &refusal.message());
    set(
        response.headers_mut(),
        names::WWW_AUTHENTICATE,
        refusal.challenge(),
    );
    response
}

pub(super) const EXPOSED: &str =
    "Stream-Next-Offset, Stream-Cursor, Stream-Up-To-Date, Stream-Closed, \
    Stream-TTL, Stream-Expires-At, Stream-Sse-Data-Encoding, Producer-Epoch, Producer-Seq, \
    Producer-Expected-Seq, Producer-Received-Seq, ETag, Location, Content-Type, WWW-Authenticate";

pub(super) fn full(body: impl Into<Bytes>) -> Body {
    Full::new(body.into()).boxed()
}

pub(super) fn respond(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    response
}

/// Most bytes of a refused body read (and discarded) before the 413.
pub(super) const DRAIN_BYTES_MAX: u64 = 64 << 20;

/// Longest a refused body is read before the 413.
pub(super) const DRAIN_FOR: Duration = Duration::from_secs(5);

/// Reads and discards `body` up to [`DRAIN_BYTES_MAX`] or [`DRAIN_FOR`],
/// so that a client sending a body the server refuses can finish sending
/// and read the refusal.
pub(super) async fn drain(mut body: Incoming) {
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

pub(super) fn error(status: StatusCode, message: &str) -> Response<Body> {
    let mut response = respond(status, format!("{message}\n"));
    set(response.headers_mut(), names::CONTENT_TYPE, "text/plain");
    response
}

/// The response header names the listener sets, made and checked at
/// compile time: a name given as a string was parsed and checked again on
/// every insert (1,300 instructions per stream append, BENCHMARKS.md,
/// thirty-seventh measurement). Standard names are `hyper`'s own; the
/// protocol's are made here.
pub(crate) mod names {
    use hyper::header::HeaderName;

    pub(crate) use hyper::header::{
        ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS, ACCESS_CONTROL_ALLOW_ORIGIN,
        ACCESS_CONTROL_EXPOSE_HEADERS, CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, ETAG, LOCATION,
        RETRY_AFTER, WWW_AUTHENTICATE, X_CONTENT_TYPE_OPTIONS,
    };

    pub(crate) const CROSS_ORIGIN_RESOURCE_POLICY: HeaderName =
        HeaderName::from_static("cross-origin-resource-policy");
    pub(crate) const PRODUCER_EPOCH: HeaderName = HeaderName::from_static("producer-epoch");
    pub(crate) const PRODUCER_EXPECTED_SEQ: HeaderName =
        HeaderName::from_static("producer-expected-seq");
    pub(crate) const PRODUCER_RECEIVED_SEQ: HeaderName =
        HeaderName::from_static("producer-received-seq");
    pub(crate) const PRODUCER_SEQ: HeaderName = HeaderName::from_static("producer-seq");
    pub(crate) const STREAM_CLOSED: HeaderName = HeaderName::from_static("stream-closed");
    pub(crate) const STREAM_CURSOR: HeaderName = HeaderName::from_static("stream-cursor");
    pub(crate) const STREAM_EXPIRES_AT: HeaderName = HeaderName::from_static("stream-expires-at");
    pub(crate) const STREAM_NEXT_OFFSET: HeaderName = HeaderName::from_static("stream-next-offset");
    pub(crate) const STREAM_SSE_DATA_ENCODING: HeaderName =
        HeaderName::from_static("stream-sse-data-encoding");
    pub(crate) const STREAM_TTL: HeaderName = HeaderName::from_static("stream-ttl");
    pub(crate) const STREAM_UP_TO_DATE: HeaderName = HeaderName::from_static("stream-up-to-date");
}

pub(super) fn set(headers: &mut HeaderMap, name: HeaderName, value: impl AsRef<str>) {
    if let Ok(value) = HeaderValue::from_str(value.as_ref()) {
        headers.insert(name, value);
    }
}

pub(super) fn header<'a>(request: &'a Request<Incoming>, name: &str) -> Option<&'a str> {
    request.headers().get(name).and_then(|v| v.to_str().ok())
}

pub(super) fn is_json(content_type: &str) -> bool {
    let media = media_type(content_type);
    media == "application/json" || media.ends_with("+json")
}

pub(super) fn is_text(content_type: &str) -> bool {
    let media = media_type(content_type);
    media.starts_with("text/") || is_json(&media)
}

pub(super) fn query_params(request: &Request<Incoming>) -> Vec<(String, String)> {
    request
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k, true), percent_decode(v, true))
        })
        .collect()
}

/// `text` with its `%XX` escapes decoded (one that is not two hex digits
/// is kept as written; bytes that are not UTF-8 become U+FFFD). In a query
/// string (`plus_is_space`), `+` is a space; in a path it is itself.
pub(super) fn percent_decode(text: &str, plus_is_space: bool) -> String {
    let bytes = text.as_bytes();
    let hex = |b: u8| (b as char).to_digit(16);
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(hi), Some(lo)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((hi * 16 + lo) as u8);
                i += 3;
                continue;
            }
        }
        out.push(if plus_is_space && bytes[i] == b'+' {
            b' '
        } else {
            bytes[i]
        });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Splits a JSON body into messages (a top-level array is flattened).
pub(super) fn json_messages(body: &[u8], allow_empty: bool) -> Result<Vec<Vec<u8>>, &'static str> {
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

pub(super) fn encode(messages: &[Vec<u8>]) -> Vec<String> {
    messages.iter().map(|m| BASE64.encode(m)).collect()
}

/// Answers a plain HTTP request on the HTTPS listener with 400 and the
/// scheme to use, and closes the connection (bounded: one write, one second).
pub(super) async fn plain_http_to_tls(mut stream: tokio::net::TcpStream) {
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
pub(super) async fn refuse(mut stream: tokio::net::TcpStream) {
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

pub(super) fn wire<T: Serialize>(value: &T) -> Result<(String, Value), Error> {
    let fail = || Error::status(StatusCode::INTERNAL_SERVER_ERROR, "command does not encode");
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

pub(super) fn state_headers(headers: &mut HeaderMap, state: &StreamState) {
    set(headers, names::CONTENT_TYPE, &state.config.content_type);
    if let Some(ttl) = state.config.ttl_seconds {
        set(headers, names::STREAM_TTL, ttl.to_string());
    }
    if let Some(at) = &state.config.expires_at {
        set(headers, names::STREAM_EXPIRES_AT, at);
    }
    if state.closed {
        set(headers, names::STREAM_CLOSED, "true");
    }
}

pub(super) fn parse_time(text: &str) -> Option<i64> {
    let at =
        time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).ok()?;
    i64::try_from(at.unix_timestamp_nanos() / 1_000_000).ok()
}

impl Streams {
    /// Serves `listener` until `shutdown` turns true: HTTP/1.1, and
    /// HTTP/2 (by ALPN over TLS, by prior knowledge over plain TCP).
    pub async fn serve(self, listener: TcpListener, shutdown: watch::Receiver<bool>) {
        let tls = self.config.tls.clone().map(tokio_rustls::TlsAcceptor::from);
        subscriptions::start(&self, shutdown.clone());
        let plain = tls.is_none();
        let connections_max = self.config.connections_max;
        let refused = move |stream| {
            if plain {
                tokio::spawn(refuse(stream));
            }
        };
        accept_connections(
            listener,
            shutdown,
            connections_max,
            refused,
            move |stream| {
                let service = self.clone();
                let tls = tls.clone();
                async move {
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
                }
            },
        )
        .await
    }
}
