//! Durable Streams subscriptions under the reserved `__ds` path segment: webhook and pull-wake subscriptions, their stream links and acknowledgements, signed webhook wakes and the JWKS that verifies them.
//!
//! A request `<prefix>/__ds/...` names streams relative to `<prefix>/`.
//! Routes: `PUT|GET|DELETE subscriptions/ID`, `POST subscriptions/ID/streams`,
//! `DELETE subscriptions/ID/streams/ENC`, `POST subscriptions/ID/callback`
//! (webhook holders), `POST subscriptions/ID/claim|ack|release` (pull-wake
//! workers) and `GET jwks.json`.
//!
//! State lives in Cells ([`crate::kinds::subscription`], [`crate::kinds::registry`]): nothing here is
//! lost with a node. Memory holds only caches (the registry snapshot for at
//! most [`REGISTRY_CACHE`], the signing key) and the set of subscriptions
//! whose wake deadline this node watches; every [`FULL_SWEEP`] each
//! registered subscription is also checked by one node (the backend's
//! [`crate::StreamBackend::sweeps`]: rendezvous over the live nodes in a
//! cluster), which picks up wakes a stopped node left behind.
//!
//! Wakes: when a create or append of a linked or matching stream is
//! acknowledged, the subscription's Cell decides (one command) whether a
//! new wake starts; only then is it delivered — a signed POST to the
//! webhook (up to [`DELIVERY_ATTEMPTS`] tries with backoff; an untaken wake
//! is redelivered under a new generation after a deadline that doubles per
//! failure), or a JSON message appended to the pull-wake `wake_stream`.
//! Bearer tokens are random; Cells store only their SHA-256.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::{STANDARD as BASE64, URL_SAFE_NO_PAD as BASE64URL};
use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::HeaderValue;
use hyper::{Method, Request, Response, StatusCode};
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::clock::now_ms;
use crate::kinds::registry::{
    Registered, RegistryCommand, RegistryOutput, RegistryQuery, REGISTRY_KEY, REGISTRY_KIND,
    SUBSCRIPTIONS_MAX,
};
use crate::kinds::stream::{StreamCommand, StreamOutput, StreamQuery, STREAM_KIND};
use crate::kinds::subscription::{
    Ack, Fresh, Subscription, SubscriptionCommand, SubscriptionConfig, SubscriptionOutput,
    SubscriptionQuery, LINKS_MAX, SUBSCRIPTION_KIND,
};
use crate::offset;
use crate::server::{Body, Streams};

use super::http::percent_decode;
use crate::webhook::{self, Signer25519};

mod error;

use error::{json_response, ControlError};

pub use crate::auth::CONTROL_SEGMENT;
/// Longest a registry snapshot is reused for matching appends.
pub const REGISTRY_CACHE: Duration = Duration::from_secs(1);
/// How often watched wake deadlines are checked.
pub const SWEEP: Duration = Duration::from_millis(250);
/// How often every registered subscription is checked.
pub const FULL_SWEEP: Duration = Duration::from_secs(30);
/// Tries of one webhook delivery before waiting for the redelivery deadline.
pub const DELIVERY_ATTEMPTS: u32 = 3;
/// Largest subscription request body.
const BODY_BYTES_MAX: usize = 256 << 10;
/// Streams named in one request.
const STREAMS_PER_REQUEST_MAX: usize = 100;
const LEASE_TTL_DEFAULT_MS: u64 = 30_000;
const LEASE_TTL_MIN_MS: u64 = 1_000;
const LEASE_TTL_MAX_MS: u64 = 600_000;

/// In-memory helpers of the subscription service (caches only).
#[derive(Debug, Default)]
pub struct Subscriptions {
    registry: Mutex<Option<(Instant, Arc<Snapshot>)>>,
    signer: Mutex<Option<Signer25519>>,
    watched: Mutex<HashSet<String>>,
}

#[derive(Debug, Default)]
struct Snapshot {
    subs: Vec<Registered>,
    explicit: Vec<(String, String)>,
}

fn empty(status: StatusCode) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::new()).boxed());
    *response.status_mut() = status;
    response
}

/// Whether `path` has the reserved segment (handled here, never a stream).
pub fn is_control_path(path: &str) -> bool {
    path.split('/').any(|s| s == CONTROL_SEGMENT)
}

/// Matches a relative stream path against a pattern: `*` is one segment, `**` any number (zero included), others literal.
pub fn glob_match(pattern: &str, path: &str) -> bool {
    fn go(p: &[&str], s: &[&str]) -> bool {
        match p.split_first() {
            None => s.is_empty(),
            Some((&"**", rest)) => (0..=s.len()).any(|i| go(rest, &s[i..])),
            Some((first, rest)) => match s.split_first() {
                Some((segment, tail)) => {
                    (*first == "*" || *first == "%2A" || first == segment) && go(rest, tail)
                }
                None => false,
            },
        }
    }
    let p: Vec<&str> = pattern.split('/').collect();
    let s: Vec<&str> = path.split('/').collect();
    // Bounded: patterns have at most 32 segments, checked at creation.
    p.len() <= 32 && go(&p, &s)
}

fn valid_relative(path: &str) -> bool {
    !path.is_empty()
        && path.len() <= 1024
        && !path.starts_with('/')
        && path
            .split('/')
            .all(|s| !s.is_empty() && s != CONTROL_SEGMENT && s != "." && s != "..")
}

fn valid_pattern(pattern: &str) -> bool {
    valid_relative(pattern) && pattern.split('/').count() <= 32
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.~:".contains(&b))
}

fn random_token() -> String {
    BASE64URL.encode(rand::random::<[u8; 32]>())
}

fn digest(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Fresh identifiers and the token whose digest they carry.
fn fresh() -> (Fresh, String) {
    let token = random_token();
    let wake_id = format!("w_{}", BASE64URL.encode(rand::random::<[u8; 12]>()));
    (
        Fresh {
            wake_id,
            token_hash: digest(&token),
        },
        token,
    )
}

fn format_acked(acked: Option<u64>) -> String {
    acked.map_or_else(|| "-1".to_owned(), offset::format)
}

fn parse_offset(text: &str) -> Option<u64> {
    if text == "-1" {
        Some(0)
    } else {
        offset::parse(text)
    }
}

/// A request under `<prefix>/__ds/`.
struct Route {
    prefix: String,
    rest: Vec<String>,
}

fn route(path: &str) -> Option<Route> {
    let segments: Vec<&str> = path.split('/').collect();
    let at = segments.iter().position(|s| *s == CONTROL_SEGMENT)?;
    Some(Route {
        prefix: segments[..at].join("/"),
        rest: segments[at + 1..].iter().map(|s| (*s).to_owned()).collect(),
    })
}

fn subscription_key(prefix: &str, id: &str) -> String {
    format!("{prefix}/{CONTROL_SEGMENT}/subscriptions/{id}")
}

fn id_of(key: &str) -> &str {
    key.rsplit('/').next().unwrap_or(key)
}

fn prefix_of(key: &str) -> &str {
    key.split(&format!("/{CONTROL_SEGMENT}/"))
        .next()
        .unwrap_or("")
}

fn base_url(request: &Request<Incoming>, prefix: &str) -> String {
    let host = request
        .headers()
        .get("host")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("localhost");
    let scheme = match request
        .headers()
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
    {
        Some("https") => "https",
        _ => "http",
    };
    format!("{scheme}://{host}{prefix}/")
}

/// Answers a request under the reserved segment.
pub async fn handle(streams: &Streams, request: Request<Incoming>) -> Response<Body> {
    if request.method() == Method::OPTIONS {
        return empty(StatusCode::NO_CONTENT);
    }
    let path = request.uri().path().to_owned();
    let Some(route) = route(&path) else {
        return ControlError::no_subscription().into();
    };
    let rest: Vec<&str> = route.rest.iter().map(String::as_str).collect();
    let method = request.method().clone();
    match (method, rest.as_slice()) {
        (Method::GET, ["jwks.json"]) => match signer(streams).await {
            Ok(signer) => {
                let mut response = json_response(StatusCode::OK, &signer.jwks());
                response.headers_mut().insert(
                    "content-type",
                    HeaderValue::from_static("application/jwk-set+json"),
                );
                response
                    .headers_mut()
                    .insert("cache-control", HeaderValue::from_static("max-age=300"));
                response
            }
            Err(e) => e.into(),
        },
        (method, ["subscriptions", id, tail @ ..]) => {
            if !valid_id(id) {
                return ControlError::invalid("subscription id must be 1-128 of [A-Za-z0-9-_.~:]")
                    .into();
            }
            let key = subscription_key(&route.prefix, id);
            let result = match (method, tail) {
                (Method::PUT, []) => create(streams, request, &route.prefix, &key).await,
                (Method::GET, []) => get(streams, &key).await,
                (Method::DELETE, []) => delete(streams, &key).await,
                (Method::POST, ["streams"]) => add_streams(streams, request, &key).await,
                (Method::DELETE, ["streams", rel @ ..]) if !rel.is_empty() => {
                    let rel = percent_decode(&rel.join("/"), false);
                    remove_stream(streams, &key, &rel).await
                }
                (Method::POST, ["callback"]) => ack(streams, request, &key, "webhook").await,
                (Method::POST, ["ack"]) => ack(streams, request, &key, "pull-wake").await,
                (Method::POST, ["claim"]) => claim(streams, request, &key).await,
                (Method::POST, ["release"]) => release(streams, request, &key).await,
                _ => Err(ControlError::NotFound("no such subscription route")),
            };
            result.unwrap_or_else(Response::from)
        }
        _ => ControlError::NotFound("no such route").into(),
    }
}

async fn body_json(request: Request<Incoming>) -> Result<Value, ControlError> {
    let bytes = Limited::new(request.into_body(), BODY_BYTES_MAX)
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|_| ControlError::BodyTooLarge)?;
    if bytes.is_empty() {
        return Ok(json!({}));
    }
    serde_json::from_slice(&bytes).map_err(|_| ControlError::invalid("body is not valid json"))
}

fn bearer(request: &Request<Incoming>) -> Option<String> {
    let value = request.headers().get("authorization")?.to_str().ok()?;
    let token = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))?;
    Some(token.trim().to_owned())
}

#[derive(Deserialize)]
struct CreateBody {
    #[serde(rename = "type")]
    kind: String,
    pattern: Option<String>,
    #[serde(default)]
    streams: Vec<String>,
    webhook: Option<WebhookBody>,
    wake_stream: Option<String>,
    lease_ttl_ms: Option<u64>,
    description: Option<String>,
}

#[derive(Deserialize)]
struct WebhookBody {
    url: String,
}

fn relative(path: &str) -> String {
    path.trim_start_matches('/').to_owned()
}

/// The streams a new subscription names: its pattern and its explicit
/// paths, relative and checked.
fn targets(body: &CreateBody) -> Result<(Option<String>, Vec<String>), ControlError> {
    let pattern = body.pattern.as_deref().map(relative);
    if let Some(p) = &pattern {
        if !valid_pattern(p) {
            return Err(ControlError::invalid("bad pattern"));
        }
    }
    let explicit: Vec<String> = body.streams.iter().map(|s| relative(s)).collect();
    if explicit.len() > STREAMS_PER_REQUEST_MAX {
        return Err(ControlError::invalid("too many streams"));
    }
    if explicit.iter().any(|s| !valid_relative(s)) {
        return Err(ControlError::invalid("bad stream path"));
    }
    if pattern.is_none() && explicit.is_empty() {
        return Err(ControlError::invalid("give a pattern or streams"));
    }
    Ok((pattern, explicit))
}

/// Where a new subscription delivers: a webhook URL (checked, and its host
/// resolved to an address the server may call) or a wake stream.
async fn delivery(
    streams: &Streams,
    kind: &str,
    webhook: Option<WebhookBody>,
    wake_stream: Option<&str>,
) -> Result<(Option<String>, Option<String>), ControlError> {
    match kind {
        "webhook" => {
            let Some(hook) = webhook else {
                return Err(ControlError::invalid(
                    "a webhook subscription needs webhook.url",
                ));
            };
            let allow = streams.config().allow_loopback_webhooks;
            let target =
                webhook::parse_url(&hook.url, allow).map_err(ControlError::WebhookRejected)?;
            if target.host.parse::<std::net::IpAddr>().is_err() {
                webhook::resolve(&target, allow)
                    .await
                    .map_err(ControlError::WebhookRejected)?;
            }
            Ok((Some(hook.url), None))
        }
        "pull-wake" => {
            let Some(wake) = wake_stream.map(relative) else {
                return Err(ControlError::invalid(
                    "a pull-wake subscription needs wake_stream",
                ));
            };
            if !valid_relative(&wake) {
                return Err(ControlError::invalid("bad wake_stream"));
            }
            Ok((None, Some(wake)))
        }
        _ => Err(ControlError::invalid("type must be webhook or pull-wake")),
    }
}

/// Enters a new subscription in the registry, and links its explicit
/// streams to it.
async fn register(
    streams: &Streams,
    key: &str,
    prefix: &str,
    pattern: Option<String>,
    explicit: &[String],
) -> Result<(), ControlError> {
    // Registered first: a subscription Cell is never left unfindable by
    // appends (a registry entry whose Cell is absent is skipped).
    let registered: RegistryOutput = streams
        .execute_in(
            REGISTRY_KIND,
            REGISTRY_KEY,
            &RegistryCommand::Register {
                sub: Registered {
                    key: key.to_owned(),
                    prefix: prefix.to_owned(),
                    pattern,
                },
            },
        )
        .await?;
    if registered == RegistryOutput::Full {
        return Err(ControlError::Full {
            code: "TOO_MANY_SUBSCRIPTIONS",
            message: "subscription limit reached",
        });
    }
    for rel in explicit {
        registry_link(streams, key, &format!("{prefix}/{rel}"), true).await?;
    }
    Ok(())
}

async fn create(
    streams: &Streams,
    request: Request<Incoming>,
    prefix: &str,
    key: &str,
) -> Result<Response<Body>, ControlError> {
    let base = base_url(&request, prefix);
    let body: CreateBody = serde_json::from_value(body_json(request).await?)
        .map_err(|e| ControlError::invalid(format!("bad subscription: {e}")))?;
    let (pattern, explicit) = targets(&body)?;
    let lease_ttl_ms = body.lease_ttl_ms.unwrap_or(LEASE_TTL_DEFAULT_MS);
    if !(LEASE_TTL_MIN_MS..=LEASE_TTL_MAX_MS).contains(&lease_ttl_ms) {
        return Err(ControlError::invalid(
            "lease_ttl_ms must be between 1000 and 600000",
        ));
    }
    if body.description.as_ref().is_some_and(|d| d.len() > 1024) {
        return Err(ControlError::invalid("description too long"));
    }
    let (webhook_url, wake_stream) = delivery(
        streams,
        &body.kind,
        body.webhook,
        body.wake_stream.as_deref(),
    )
    .await?;
    let config = SubscriptionConfig {
        kind: body.kind,
        pattern: pattern.clone(),
        streams: explicit.clone(),
        webhook_url,
        wake_stream,
        lease_ttl_ms,
        description: body.description,
        base_url: base,
    };
    register(streams, key, prefix, pattern, &explicit).await?;
    streams.subscriptions().invalidate();
    let output: SubscriptionOutput = streams
        .execute_in(
            SUBSCRIPTION_KIND,
            key,
            &SubscriptionCommand::Create { config },
        )
        .await?;
    match output {
        SubscriptionOutput::Created {
            subscription,
            created,
        } => {
            let status = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            let view = view(streams, key, &subscription).await?;
            Ok(json_response(status, &view))
        }
        SubscriptionOutput::Conflict => Err(ControlError::Conflict {
            code: "SUBSCRIPTION_EXISTS",
            message: "subscription exists with another configuration".into(),
        }),
        _ => Err(ControlError::Unexpected),
    }
}

async fn registry_link(
    streams: &Streams,
    key: &str,
    path: &str,
    link: bool,
) -> Result<(), ControlError> {
    let command = if link {
        RegistryCommand::Link {
            key: key.to_owned(),
            path: path.to_owned(),
        }
    } else {
        RegistryCommand::Unlink {
            key: key.to_owned(),
            path: path.to_owned(),
        }
    };
    let output: RegistryOutput = streams
        .execute_in(REGISTRY_KIND, REGISTRY_KEY, &command)
        .await?;
    if output == RegistryOutput::Full {
        return Err(ControlError::Full {
            code: "TOO_MANY_LINKS",
            message: "explicit link limit reached",
        });
    }
    Ok(())
}

/// The subscription as the API shows it (never a secret).
async fn view(streams: &Streams, key: &str, sub: &Subscription) -> Result<Value, ControlError> {
    let c = &sub.config;
    let mut out = json!({
        "id": id_of(key),
        "type": c.kind,
        "lease_ttl_ms": c.lease_ttl_ms,
        "streams": stream_views(sub),
        "generation": sub.wake.generation,
        "wake": {
            "state": sub.wake.state,
            "wake_id": (!sub.wake.wake_id.is_empty()).then_some(&sub.wake.wake_id),
            "holder": sub.wake.holder,
        },
    });
    if let Some(p) = &c.pattern {
        out["pattern"] = json!(p);
    }
    if let Some(d) = &c.description {
        out["description"] = json!(d);
    }
    if let Some(w) = &c.wake_stream {
        out["wake_stream"] = json!(w);
    }
    if let Some(url) = &c.webhook_url {
        let signer = signer(streams).await?;
        out["webhook"] = json!({
            "url": url,
            "signing": {
                "alg": "ed25519",
                "kid": signer.kid(),
                "jwks_url": format!("{}{CONTROL_SEGMENT}/jwks.json", c.base_url),
            },
        });
    }
    Ok(out)
}

fn stream_views(sub: &Subscription) -> Vec<Value> {
    sub.links
        .iter()
        .map(|l| {
            json!({
                "path": l.path,
                "link_type": l.link_type,
                "acked_offset": format_acked(l.acked),
                "tail_offset": offset::format(l.tail.unwrap_or(0)),
                "has_pending": l.pending(),
            })
        })
        .collect()
}

async fn load(streams: &Streams, key: &str) -> Result<Subscription, ControlError> {
    match streams
        .query_in(SUBSCRIPTION_KIND, key, &SubscriptionQuery::Get {})
        .await?
    {
        SubscriptionOutput::Found { subscription } => Ok(subscription),
        SubscriptionOutput::NotFound => Err(ControlError::no_subscription()),
        _ => Err(ControlError::Unexpected),
    }
}

async fn get(streams: &Streams, key: &str) -> Result<Response<Body>, ControlError> {
    let sub = load(streams, key).await?;
    Ok(json_response(
        StatusCode::OK,
        &view(streams, key, &sub).await?,
    ))
}

async fn delete(streams: &Streams, key: &str) -> Result<Response<Body>, ControlError> {
    let output: SubscriptionOutput = streams
        .execute_in(SUBSCRIPTION_KIND, key, &SubscriptionCommand::Delete {})
        .await?;
    // Unregistered after: an append in between finds no Cell and skips it.
    let _: RegistryOutput = streams
        .execute_in(
            REGISTRY_KIND,
            REGISTRY_KEY,
            &RegistryCommand::Unregister {
                key: key.to_owned(),
            },
        )
        .await?;
    streams.subscriptions().invalidate();
    match output {
        SubscriptionOutput::Deleted => Ok(empty(StatusCode::NO_CONTENT)),
        SubscriptionOutput::NotFound => Err(ControlError::no_subscription()),
        _ => Err(ControlError::Unexpected),
    }
}

async fn add_streams(
    streams: &Streams,
    request: Request<Incoming>,
    key: &str,
) -> Result<Response<Body>, ControlError> {
    let body = body_json(request).await?;
    let paths: Vec<String> = body
        .get("streams")
        .and_then(Value::as_array)
        .ok_or_else(|| ControlError::invalid("give streams: [paths]"))?
        .iter()
        .map(|v| {
            v.as_str()
                .map(relative)
                .ok_or_else(|| ControlError::invalid("paths are strings"))
        })
        .collect::<Result<_, _>>()?;
    if paths.is_empty() || paths.len() > STREAMS_PER_REQUEST_MAX {
        return Err(ControlError::invalid("give 1 to 100 streams"));
    }
    if paths.iter().any(|p| !valid_relative(p)) {
        return Err(ControlError::invalid("bad stream path"));
    }
    let sub = load(streams, key).await?;
    if sub.links.len() + paths.len() > LINKS_MAX {
        return Err(ControlError::Conflict {
            code: "TOO_MANY_LINKS",
            message: "too many linked streams".into(),
        });
    }
    let prefix = prefix_of(key).to_owned();
    for rel in &paths {
        registry_link(streams, key, &format!("{prefix}/{rel}"), true).await?;
    }
    streams.subscriptions().invalidate();
    match streams
        .execute_in(
            SUBSCRIPTION_KIND,
            key,
            &SubscriptionCommand::AddStreams { paths },
        )
        .await?
    {
        SubscriptionOutput::Done => Ok(empty(StatusCode::NO_CONTENT)),
        SubscriptionOutput::NotFound => Err(ControlError::no_subscription()),
        _ => Err(ControlError::Unexpected),
    }
}

async fn remove_stream(
    streams: &Streams,
    key: &str,
    rel: &str,
) -> Result<Response<Body>, ControlError> {
    let rel = relative(rel);
    if !valid_relative(&rel) {
        return Err(ControlError::invalid("bad stream path"));
    }
    let output: SubscriptionOutput = streams
        .execute_in(
            SUBSCRIPTION_KIND,
            key,
            &SubscriptionCommand::RemoveStream { path: rel.clone() },
        )
        .await?;
    registry_link(streams, key, &format!("{}/{rel}", prefix_of(key)), false).await?;
    streams.subscriptions().invalidate();
    match output {
        SubscriptionOutput::Done => Ok(empty(StatusCode::NO_CONTENT)),
        SubscriptionOutput::NotFound => Err(ControlError::no_subscription()),
        _ => Err(ControlError::Unexpected),
    }
}

/// Current tails of `sub`'s linked streams (absent streams are left out).
async fn tails(streams: &Streams, key: &str, sub: &Subscription) -> Vec<Ack> {
    let prefix = prefix_of(key);
    let mut out = Vec::new();
    for link in sub.links.iter().take(LINKS_MAX) {
        let full = format!("{prefix}/{}", link.path);
        let read: Result<StreamOutput, _> = streams
            .query_in(
                STREAM_KIND,
                &full,
                &StreamQuery::Read {
                    offset: None,
                    now_ms: now_ms(),
                },
            )
            .await;
        if let Ok(StreamOutput::Read { state, .. }) = read {
            out.push(Ack {
                path: link.path.clone(),
                offset: state.tail,
            });
        }
    }
    out
}

fn parse_acks(body: &Value) -> Result<Vec<Ack>, ControlError> {
    let Some(list) = body.get("acks") else {
        return Ok(Vec::new());
    };
    let list = list
        .as_array()
        .ok_or_else(|| ControlError::invalid("acks is a list"))?;
    if list.len() > LINKS_MAX {
        return Err(ControlError::invalid("too many acks"));
    }
    list.iter()
        .map(|a| {
            let path = a
                .get("stream")
                .or_else(|| a.get("path"))
                .and_then(Value::as_str)
                .ok_or_else(|| ControlError::invalid("an ack names its stream"))?;
            let text = a
                .get("offset")
                .and_then(Value::as_str)
                .ok_or_else(|| ControlError::invalid("an ack gives an offset"))?;
            let offset =
                parse_offset(text).ok_or_else(|| ControlError::invalid("malformed ack offset"))?;
            Ok(Ack {
                path: relative(path),
                offset,
            })
        })
        .collect()
}

fn wake_fields(body: &Value) -> Result<(u64, String), ControlError> {
    let generation = body
        .get("generation")
        .and_then(Value::as_u64)
        .ok_or_else(|| ControlError::invalid("give the wake generation"))?;
    let wake_id = body
        .get("wake_id")
        .and_then(Value::as_str)
        .ok_or_else(|| ControlError::invalid("give the wake_id"))?
        .to_owned();
    Ok((generation, wake_id))
}

async fn ack(
    streams: &Streams,
    request: Request<Incoming>,
    key: &str,
    kind: &str,
) -> Result<Response<Body>, ControlError> {
    let token = bearer(&request).ok_or(ControlError::Unauthorized)?;
    let body = body_json(request).await?;
    let (generation, wake_id) = wake_fields(&body)?;
    let acks = parse_acks(&body)?;
    let done = body.get("done").and_then(Value::as_bool).unwrap_or(false);
    let sub = load(streams, key).await?;
    if sub.config.kind != kind {
        return Err(ControlError::invalid(format!("not a {kind} subscription")));
    }
    let tails = tails(streams, key, &sub).await;
    let (next, next_token) = fresh();
    let output: SubscriptionOutput = streams
        .execute_in(
            SUBSCRIPTION_KIND,
            key,
            &SubscriptionCommand::Ack {
                generation,
                wake_id,
                token_hash: digest(&token),
                acks,
                done,
                tails,
                fresh: next,
                now_ms: now_ms(),
            },
        )
        .await?;
    match output {
        SubscriptionOutput::Acked { next_wake, woke } => {
            if let Some(sub) = woke {
                dispatch(streams, key, sub, next_token);
            }
            Ok(json_response(
                StatusCode::OK,
                &json!({"ok": true, "next_wake": next_wake}),
            ))
        }
        SubscriptionOutput::Fenced { generation } => Err(ControlError::Fenced { generation }),
        SubscriptionOutput::Unauthorized => Err(ControlError::Unauthorized),
        SubscriptionOutput::InvalidAck { path } => Err(ControlError::Conflict {
            code: "INVALID_OFFSET",
            message: format!("ack of {path} is past its tail or of a stream not linked").into(),
        }),
        SubscriptionOutput::NotFound => Err(ControlError::no_subscription()),
        _ => Err(ControlError::Unexpected),
    }
}

async fn claim(
    streams: &Streams,
    request: Request<Incoming>,
    key: &str,
) -> Result<Response<Body>, ControlError> {
    let body = body_json(request).await?;
    let worker = body
        .get("worker")
        .and_then(Value::as_str)
        .filter(|w| !w.is_empty() && w.len() <= 256)
        .ok_or_else(|| ControlError::invalid("give worker (1-256 bytes)"))?
        .to_owned();
    let sub = load(streams, key).await?;
    if sub.config.kind != "pull-wake" {
        return Err(ControlError::invalid("not a pull-wake subscription"));
    }
    let tails = tails(streams, key, &sub).await;
    let (next, token) = fresh();
    let output: SubscriptionOutput = streams
        .execute_in(
            SUBSCRIPTION_KIND,
            key,
            &SubscriptionCommand::Claim {
                worker,
                tails,
                fresh: next,
                now_ms: now_ms(),
            },
        )
        .await?;
    match output {
        SubscriptionOutput::Claimed { subscription: sub } => {
            streams.subscriptions().watch(key);
            Ok(json_response(
                StatusCode::OK,
                &json!({
                    "subscription_id": id_of(key),
                    "token": token,
                    "wake_id": sub.wake.wake_id,
                    "generation": sub.wake.generation,
                    "lease_ttl_ms": sub.config.lease_ttl_ms,
                    "lease_expires_at_ms": sub.wake.deadline_ms,
                    "streams": stream_views(&sub),
                }),
            ))
        }
        SubscriptionOutput::AlreadyClaimed { holder } => {
            Err(ControlError::AlreadyClaimed { holder })
        }
        SubscriptionOutput::NothingToClaim => Ok(empty(StatusCode::NO_CONTENT)),
        SubscriptionOutput::NotFound => Err(ControlError::no_subscription()),
        _ => Err(ControlError::Unexpected),
    }
}

async fn release(
    streams: &Streams,
    request: Request<Incoming>,
    key: &str,
) -> Result<Response<Body>, ControlError> {
    let token = bearer(&request).ok_or(ControlError::Unauthorized)?;
    let body = body_json(request).await?;
    let (generation, wake_id) = wake_fields(&body)?;
    let (next, next_token) = fresh();
    let output: SubscriptionOutput = streams
        .execute_in(
            SUBSCRIPTION_KIND,
            key,
            &SubscriptionCommand::Release {
                generation,
                wake_id,
                token_hash: digest(&token),
                fresh: next,
                now_ms: now_ms(),
            },
        )
        .await?;
    match output {
        SubscriptionOutput::Released { woke } => {
            if let Some(sub) = woke {
                dispatch(streams, key, sub, next_token);
            }
            Ok(empty(StatusCode::NO_CONTENT))
        }
        SubscriptionOutput::Fenced { generation } => Err(ControlError::Fenced { generation }),
        SubscriptionOutput::Unauthorized => Err(ControlError::Unauthorized),
        SubscriptionOutput::NotFound => Err(ControlError::no_subscription()),
        _ => Err(ControlError::Unexpected),
    }
}

/// The webhook signing key, created on first use.
///
/// It lives in the registry Cell (so in the bucket), not on a node: every
/// node signs with the same key and serves the same JWKS, and a node that
/// is replaced keeps signing verifiably. The first node to store a key wins
/// (the command keeps an existing one); whoever can read the bucket can
/// read the key, as it can read every stream.
async fn signer(streams: &Streams) -> Result<Signer25519, ControlError> {
    if let Some(signer) = streams.subscriptions().cached_signer() {
        return Ok(signer);
    }
    let stored: RegistryOutput = streams
        .query_in(REGISTRY_KIND, REGISTRY_KEY, &RegistryQuery::SigningKey {})
        .await?;
    let seed = match stored {
        RegistryOutput::SigningKey { seed: Some(seed) } => seed,
        _ => {
            let candidate = BASE64.encode(rand::random::<[u8; 32]>());
            match streams
                .execute_in(
                    REGISTRY_KIND,
                    REGISTRY_KEY,
                    &RegistryCommand::SigningKey { seed: candidate },
                )
                .await?
            {
                RegistryOutput::SigningKey { seed: Some(seed) } => seed,
                _ => return Err(ControlError::Unexpected),
            }
        }
    };
    let bytes: [u8; 32] = BASE64
        .decode(seed)
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or(ControlError::Unexpected)?;
    let signer = Signer25519::from_seed(&bytes);
    streams.subscriptions().keep_signer(&signer);
    Ok(signer)
}

impl Subscriptions {
    fn invalidate(&self) {
        *self.registry.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    fn cached_signer(&self) -> Option<Signer25519> {
        self.signer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn keep_signer(&self, signer: &Signer25519) {
        *self.signer.lock().unwrap_or_else(|e| e.into_inner()) = Some(signer.clone());
    }

    fn watch(&self, key: &str) {
        let mut watched = self.watched.lock().unwrap_or_else(|e| e.into_inner());
        if watched.len() < SUBSCRIPTIONS_MAX {
            watched.insert(key.to_owned());
        }
    }

    fn unwatch(&self, key: &str) {
        self.watched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }

    fn watched(&self) -> Vec<String> {
        self.watched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect()
    }
}

async fn snapshot(streams: &Streams) -> Option<Arc<Snapshot>> {
    let state = streams.subscriptions();
    if let Some((at, snap)) = state
        .registry
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
    {
        if at.elapsed() < REGISTRY_CACHE {
            return Some(snap.clone());
        }
    }
    // A registry that cannot be read now is retried (bounded): a missed
    // match would delay a wake until the stream's next append.
    let mut found = None;
    for attempt in 0..3u32 {
        if let Ok(RegistryOutput::Snapshot { subs, explicit }) = streams
            .query_in(REGISTRY_KIND, REGISTRY_KEY, &RegistryQuery::Snapshot {})
            .await
        {
            found = Some((subs, explicit));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
    }
    let (subs, explicit) = found?;
    let snap = Arc::new(Snapshot { subs, explicit });
    *state.registry.lock().unwrap_or_else(|e| e.into_inner()) =
        Some((Instant::now(), snap.clone()));
    Some(snap)
}

/// A create or append of `path` was acknowledged with tail `tail`: wakes the subscriptions that link or match it (in the background; the writer is not held).
pub fn stream_changed(streams: &Streams, path: &str, tail: u64) {
    let streams = streams.clone();
    let path = path.to_owned();
    tokio::spawn(async move {
        let Some(snap) = snapshot(&streams).await else {
            return;
        };
        let mut targets: Vec<(String, String, bool)> = Vec::new();
        for sub in &snap.subs {
            let Some(rel) = path.strip_prefix(&format!("{}/", sub.prefix)) else {
                continue;
            };
            let glob = sub.pattern.as_deref().is_some_and(|p| glob_match(p, rel));
            let explicit = snap
                .explicit
                .iter()
                .any(|(p, k)| p == &path && k == &sub.key);
            if glob || explicit {
                targets.push((sub.key.clone(), rel.to_owned(), glob));
            }
        }
        for (key, rel, glob) in targets {
            let (next, token) = fresh();
            let output: Result<SubscriptionOutput, _> = streams
                .execute_in(
                    SUBSCRIPTION_KIND,
                    &key,
                    &SubscriptionCommand::Observe {
                        path: rel,
                        tail,
                        glob,
                        fresh: next,
                        now_ms: now_ms(),
                    },
                )
                .await;
            if let Ok(SubscriptionOutput::Woke { subscription }) = output {
                dispatch(&streams, &key, subscription, token);
            }
        }
    });
}

/// Sends a wake that its Cell started: a webhook POST or a pull-wake event.
fn dispatch(streams: &Streams, key: &str, sub: Subscription, token: String) {
    streams.subscriptions().watch(key);
    let streams = streams.clone();
    let key = key.to_owned();
    tokio::spawn(async move {
        if sub.config.kind == "webhook" {
            deliver(&streams, &key, sub, token).await;
        } else {
            announce(&streams, &key, &sub).await;
        }
    });
}

fn wake_payload(key: &str, sub: &Subscription) -> Value {
    json!({
        "subscription_id": id_of(key),
        "wake_id": sub.wake.wake_id,
        "generation": sub.wake.generation,
        "lease_ttl_ms": sub.config.lease_ttl_ms,
        "streams": stream_views(sub),
        "triggered_by": sub.links.iter().filter(|l| l.pending()).map(|l| &l.path).collect::<Vec<_>>(),
    })
}

/// Appends the wake event to the pull-wake stream (absent: workers find the wake by claiming).
async fn announce(streams: &Streams, key: &str, sub: &Subscription) {
    let Some(wake) = &sub.config.wake_stream else {
        return;
    };
    let mut event = wake_payload(key, sub);
    event["claim_url"] = json!(format!(
        "{}{CONTROL_SEGMENT}/subscriptions/{}/claim",
        sub.config.base_url,
        id_of(key)
    ));
    let full = format!("{}/{wake}", prefix_of(key));
    let appended: Result<StreamOutput, _> = streams
        .execute_in(
            STREAM_KIND,
            &full,
            &StreamCommand::Append {
                content_type: Some("application/json".into()),
                messages: vec![BASE64.encode(event.to_string())],
                seq: None,
                producer: None,
                close: false,
                now_ms: now_ms(),
            },
        )
        .await;
    if let Ok(StreamOutput::Appended { state, .. }) = appended {
        streams.published(&full, state.tail);
    }
}

/// POSTs a webhook wake, then records what the receiver said.
async fn deliver(streams: &Streams, key: &str, mut sub: Subscription, mut token: String) {
    // A `{"done": true}` answer may start the next wake at once: bounded.
    for _ in 0..16 {
        let Some(url) = sub.config.webhook_url.clone() else {
            return;
        };
        let allow = streams.config().allow_loopback_webhooks;
        let Ok(target) = webhook::parse_url(&url, allow) else {
            tracing::warn!(%key, "webhook url no longer allowed");
            return;
        };
        let Ok(signer) = signer(streams).await else {
            return;
        };
        let body = webhook_body(key, &sub, &token);
        // Untaken: the Cell's deadline brings a redelivery (the sweeper).
        let Some(answer) = post_wake(key, &target, allow, &signer, &body).await else {
            return;
        };
        let generation = sub.wake.generation;
        if !answered_done(&answer) {
            let _: Result<SubscriptionOutput, _> = streams
                .execute_in(
                    SUBSCRIPTION_KIND,
                    key,
                    &SubscriptionCommand::Delivered {
                        generation,
                        now_ms: now_ms(),
                    },
                )
                .await;
            return;
        }
        match record_sync_done(streams, key, &sub, generation).await {
            Some((next, next_token)) => {
                sub = next;
                token = next_token;
            }
            None => return,
        }
    }
}

/// The body of a webhook wake: the wake's payload with the callback URL
/// and the bearer `token` the receiver presents there.
fn webhook_body(key: &str, sub: &Subscription, token: &str) -> Bytes {
    let mut payload = wake_payload(key, sub);
    payload["callback_url"] = json!(format!(
        "{}{CONTROL_SEGMENT}/subscriptions/{}/callback",
        sub.config.base_url,
        id_of(key)
    ));
    payload["callback_token"] = json!(token);
    Bytes::from(payload.to_string())
}

/// POSTs `body` to `target`, up to [`DELIVERY_ATTEMPTS`] times with
/// jittered exponential backoff after each failure: the first 2xx answer,
/// or `None` when every attempt failed or was refused.
async fn post_wake(
    key: &str,
    target: &webhook::Target,
    allow: bool,
    signer: &Signer25519,
    body: &Bytes,
) -> Option<webhook::Answer> {
    for attempt in 0..DELIVERY_ATTEMPTS {
        let unix = (now_ms() / 1000) as u64;
        match webhook::post(target, allow, signer, body.clone(), unix).await {
            Ok(a) if (200..300).contains(&a.status) => return Some(a),
            Ok(a) => tracing::debug!(%key, status = a.status, "webhook refused the wake"),
            Err(e) => tracing::debug!(%key, error = %e, "webhook delivery failed"),
        }
        let backoff = 250u64 << attempt;
        let jitter = rand::random::<u64>() % (backoff / 2 + 1);
        tokio::time::sleep(Duration::from_millis(backoff + jitter)).await;
    }
    None
}

/// Whether the receiver's answer is `{"done": true}`: it handled the wake
/// synchronously (anything else, unreadable included, means it holds the
/// wake as a lease).
fn answered_done(answer: &webhook::Answer) -> bool {
    serde_json::from_slice::<Value>(&answer.body)
        .ok()
        .and_then(|v| v.get("done").and_then(Value::as_bool))
        .unwrap_or(false)
}

/// Records a synchronous handler's end for wake `generation` of `sub`:
/// every linked stream acknowledged up to the tail the wake saw. The next
/// wake this starts, with its bearer token, if any.
async fn record_sync_done(
    streams: &Streams,
    key: &str,
    sub: &Subscription,
    generation: u64,
) -> Option<(Subscription, String)> {
    let snapshot: Vec<Ack> = sub
        .links
        .iter()
        .map(|l| Ack {
            path: l.path.clone(),
            offset: l.tail.unwrap_or(0),
        })
        .collect();
    let (next, next_token) = fresh();
    let output: Result<SubscriptionOutput, _> = streams
        .execute_in(
            SUBSCRIPTION_KIND,
            key,
            &SubscriptionCommand::SyncDone {
                generation,
                snapshot,
                fresh: next,
                now_ms: now_ms(),
            },
        )
        .await;
    match output {
        Ok(SubscriptionOutput::Acked {
            woke: Some(next), ..
        }) => Some((next, next_token)),
        _ => None,
    }
}

/// Starts the deadline sweeper of `streams` (until `shutdown`).
pub fn start(streams: &Streams, mut shutdown: watch::Receiver<bool>) {
    let streams = streams.clone();
    tokio::spawn(async move {
        let mut last_full = Instant::now();
        loop {
            tokio::select! {
                _ = shutdown.wait_for(|stop| *stop) => return,
                _ = tokio::time::sleep(SWEEP) => {}
            }
            let mut keys = streams.subscriptions().watched();
            if last_full.elapsed() >= FULL_SWEEP {
                last_full = Instant::now();
                if let Some(snap) = snapshot(&streams).await {
                    for sub in &snap.subs {
                        // One node per subscription, not every node.
                        let mine = streams
                            .backend()
                            .sweeps(SUBSCRIPTION_KIND, sub.key.as_bytes())
                            .await
                            .unwrap_or(true);
                        if mine && !keys.contains(&sub.key) {
                            keys.push(sub.key.clone());
                        }
                    }
                }
            }
            for key in keys {
                sweep(&streams, &key).await;
            }
        }
    });
}

async fn sweep(streams: &Streams, key: &str) {
    let Ok(sub) = load(streams, key).await else {
        streams.subscriptions().unwatch(key);
        return;
    };
    if sub.wake.state == "idle" {
        streams.subscriptions().unwatch(key);
        return;
    }
    streams.subscriptions().watch(key);
    if sub.wake.deadline_ms > now_ms() {
        return;
    }
    let (next, token) = fresh();
    let output: Result<SubscriptionOutput, _> = streams
        .execute_in(
            SUBSCRIPTION_KIND,
            key,
            &SubscriptionCommand::Expire {
                generation: sub.wake.generation,
                fresh: next,
                now_ms: now_ms(),
            },
        )
        .await;
    if let Ok(SubscriptionOutput::Woke { subscription }) = output {
        dispatch(streams, key, subscription, token);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_segments() {
        assert!(glob_match("events/*", "events/x"));
        assert!(!glob_match("events/*", "events/x/y"));
        assert!(!glob_match("events/*", "events"));
        assert!(glob_match("events/**", "events/x/y"));
        assert!(glob_match("a/**/c", "a/c"));
        assert!(glob_match("a/*/c", "a/b/c"));
        assert!(!glob_match("a/*/c", "a/b/d"));
        assert!(glob_match("a/%2A", "a/b"));
    }

    #[test]
    fn routes_split_at_the_reserved_segment() {
        let r = route("/v1/stream/__ds/subscriptions/s1/streams/manual%2Fb").unwrap();
        assert_eq!(r.prefix, "/v1/stream");
        assert_eq!(r.rest, ["subscriptions", "s1", "streams", "manual%2Fb"]);
        assert_eq!(percent_decode("manual%2Fb", false), "manual/b");
        // `+` is a space only in a query string; a broken escape stays.
        assert_eq!(percent_decode("a+b%2B%zz%4", true), "a b+%zz%4");
        assert_eq!(percent_decode("a+b%2B", false), "a+b+");
        assert_eq!(percent_decode("%a\u{e9}", true), "%a\u{e9}");
        assert!(is_control_path("/v1/stream/__ds/jwks.json"));
        assert!(!is_control_path("/v1/stream/__dsx/a"));
        let key = subscription_key("/v1/stream", "s1");
        assert_eq!(id_of(&key), "s1");
        assert_eq!(prefix_of(&key), "/v1/stream");
        assert_eq!(parse_offset("-1"), Some(0));
    }

    proptest::proptest! {
        // Paths, patterns and bodies come from clients: no input panics.
        #[test]
        fn untrusted_text_never_panics(text in "\\PC{0,64}", other in "[a-z*/%2A]{0,24}") {
            let _ = route(&text);
            let _ = is_control_path(&text);
            let _ = percent_decode(&text, false);
            let _ = percent_decode(&text, true);
            let _ = glob_match(&other, &text);
            let _ = glob_match(&text, &other);
            let _ = valid_relative(&text);
            let _ = valid_pattern(&text);
            let _ = parse_offset(&text);
            let _ = webhook::parse_url(&text, false);
            let _ = parse_acks(&json!({"acks": [{"stream": text.clone(), "offset": other.clone()}]}));
        }

        #[test]
        fn percent_decoding_inverts_encoding(text in "\\PC{0,32}") {
            let encoded: String = text
                .bytes()
                .map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") })
                .collect();
            proptest::prop_assert_eq!(percent_decode(&encoded, false), text);
        }

        #[test]
        fn arbitrary_bytes_as_a_body_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
            if let Ok(value) = serde_json::from_slice::<Value>(&bytes) {
                let _ = parse_acks(&value);
                let _ = wake_fields(&value);
                let _ = serde_json::from_value::<CreateBody>(value);
            }
        }
    }
}
