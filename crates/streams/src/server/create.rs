//! PUT: creating a stream (or confirming an identical one), its first messages, TTL or expiry, closed state, and a fork's lineage.

use super::error::Error;
use super::http::{encode, is_json, json_messages, names, parse_time, respond, set, state_headers};
use super::{Body, Streams};
use crate::clock::now_ms;
use crate::kinds::stream::{
    Lineage, StreamCommand, StreamConfig, StreamOutput, StreamQuery, StreamState,
};
use crate::offset;
use hyper::body::Incoming;
use hyper::header::HeaderMap;
use hyper::{Request, Response, StatusCode};

impl Streams {
    pub(super) async fn create(&self, request: Request<Incoming>) -> Result<Response<Body>, Error> {
        let path = request.uri().path().to_owned();
        let now = now_ms();
        let asked = CreateHeaders::parse(request.headers(), now).map_err(Error::bad)?;
        let body = self.body(request).await?;
        let mut settings = Settings {
            content_type: asked.content_type(),
            ttl_seconds: asked.ttl_seconds,
            expires_at_ms: asked.expires_at_ms,
        };
        let mut inherited = Vec::new();
        let mut lineage = None;
        // The source this request registered a fork reference with.
        let mut registered = None;
        if let Some(source) = &asked.forked_from {
            let fork = self
                .fork_for_create(&path, source, &asked, &mut settings, now)
                .await?;
            inherited = fork.inherited;
            lineage = Some(fork.lineage);
            registered = fork.registered.then(|| source.clone());
        } else if asked.fork_offset.is_some() {
            return Err(Error::bad("Stream-Fork-Offset needs Stream-Forked-From"));
        }
        let mut messages = if body.is_empty() {
            Vec::new()
        } else if is_json(&settings.content_type) {
            json_messages(&body, true).map_err(Error::bad)?
        } else {
            vec![body.to_vec()]
        };
        inherited.append(&mut messages);
        let messages = inherited;
        let config = StreamConfig {
            content_type: settings.content_type,
            ttl_seconds: settings.ttl_seconds,
            expires_at: asked.expires,
            expires_at_ms: settings.expires_at_ms,
        };
        let output = self
            .execute(
                &path,
                StreamCommand::Create {
                    config,
                    closed: asked.closed,
                    messages: encode(&messages),
                    now_ms: now,
                    lineage,
                    fork_offset_given: asked.fork_offset.is_some(),
                },
            )
            .await?;
        if let Some(source) = registered {
            if !matches!(output, StreamOutput::Created { .. }) {
                self.unregister(source, &path).await;
            }
        }
        self.created(output, &path, asked.host).await
    }

    /// The fork part of a create at `path` from `source`: a fork created
    /// again is compared with the stored one (lineage included) by the
    /// create command, and the source is not read (it may be deleted by
    /// now); a new fork copies the source's prefix ([`Streams::fork_prefix`])
    /// and takes its reference on the source before it exists. Fills the
    /// settings the request left to the source or the stored fork.
    async fn fork_for_create(
        &self,
        path: &str,
        source: &str,
        asked: &CreateHeaders,
        settings: &mut Settings,
        now: i64,
    ) -> Result<ForkPart, Error> {
        if let Some(existing) = self.stored_stream(path, now).await? {
            return fork_again(&existing, source, asked, settings);
        }
        let fork = self
            .fork_prefix(
                source,
                asked.fork_offset.as_deref(),
                asked.sub_offset,
                asked.explicit_type.as_deref(),
            )
            .await?;
        settings.fill_from_source(&fork.state, asked, now);
        // The reference is taken before the fork exists: a crash
        // between the two leaves the source with a reference to no
        // fork, so a later soft delete keeps it (410) instead of a
        // fork ever outliving its source's data.
        self.register_fork(source, path, now).await?;
        Ok(ForkPart {
            inherited: fork.messages,
            lineage: Lineage {
                source: source.to_owned(),
                offset: fork.offset,
                sub_offset: asked.sub_offset,
            },
            registered: true,
        })
    }

    /// The stream already stored at `path`, if any (a soft-deleted one is
    /// refused as a deleted path): a fork create finding one is a create
    /// again, answered by comparing with it.
    async fn stored_stream(&self, path: &str, now: i64) -> Result<Option<StreamState>, Error> {
        let read = StreamQuery::Read {
            offset: None,
            now_ms: now,
        };
        match self.query(path, read).await? {
            StreamOutput::Read { state, .. } => Ok(Some(state)),
            StreamOutput::Gone => Err(Error::DeletedPath),
            _ => Ok(None),
        }
    }

    /// Takes a fork reference for `path` on `source` (its Cell's
    /// `RegisterFork`), so the source's data is kept while the fork lives:
    /// a deleted source is a 409, a missing one a 404.
    async fn register_fork(&self, source: &str, path: &str, now: i64) -> Result<(), Error> {
        let registering = StreamCommand::RegisterFork {
            fork: path.to_owned(),
            now_ms: now,
        };
        match self.execute(source, registering).await? {
            StreamOutput::Registered => Ok(()),
            StreamOutput::Gone => Err(Error::status(
                StatusCode::CONFLICT,
                "the source was deleted",
            )),
            StreamOutput::NotFound => Err(Error::status(
                StatusCode::NOT_FOUND,
                "no such source stream",
            )),
            _ => Err(Error::status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "unexpected output",
            )),
        }
    }

    /// The answer to a create command's `output` at `path`.
    async fn created(
        &self,
        output: StreamOutput,
        path: &str,
        host: Option<String>,
    ) -> Result<Response<Body>, Error> {
        match output {
            StreamOutput::Created {
                state,
                created,
                release,
            } => {
                if let Some(old) = release {
                    self.release(old, path.to_owned()).await;
                }
                let status = if created {
                    StatusCode::CREATED
                } else {
                    StatusCode::OK
                };
                let mut response = respond(status, "");
                let headers = response.headers_mut();
                state_headers(headers, &state);
                set(
                    headers,
                    names::STREAM_NEXT_OFFSET,
                    offset::format(state.tail),
                );
                if let Some(host) = host {
                    set(headers, names::LOCATION, format!("http://{host}{path}"));
                }
                self.published(path, state.tail);
                Ok(response)
            }
            StreamOutput::ConfigMismatch => Err(Error::status(
                StatusCode::CONFLICT,
                "stream exists with another configuration",
            )),
            StreamOutput::Gone => Err(Error::DeletedPath),
            _ => Err(Error::status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "unexpected output",
            )),
        }
    }

    /// A fork create lost to another stream created at `path` meanwhile:
    /// gives back the reference taken on `source`, unless that stream is
    /// itself a fork of `source` (the reference is then its own). When in
    /// doubt the reference stays (the source is retained, not removed).
    pub(super) async fn unregister(&self, source: String, path: &str) {
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
}

/// What a create request's headers ask for, checked (every refusal is a
/// 400 with the message).
struct CreateHeaders {
    forked_from: Option<String>,
    fork_offset: Option<String>,
    sub_offset: u64,
    explicit_type: Option<String>,
    ttl_seconds: Option<u64>,
    expires: Option<String>,
    expires_at_ms: Option<i64>,
    closed: bool,
    host: Option<String>,
}

impl CreateHeaders {
    /// Checks the headers of a create (PUT) at time `now`: fork source,
    /// offset and sub-offset, content type, TTL or expiry, closed, host.
    fn parse(headers: &HeaderMap, now: i64) -> Result<Self, &'static str> {
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let forked_from = header("stream-forked-from").map(str::to_owned);
        let fork_offset = header("stream-fork-offset").map(str::to_owned);
        let sub_offset = match header("stream-fork-sub-offset") {
            None => 0,
            Some(_) if forked_from.is_none() => {
                return Err("Stream-Fork-Sub-Offset needs Stream-Forked-From")
            }
            Some(text) if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) => text
                .parse::<u64>()
                .map_err(|_| "bad Stream-Fork-Sub-Offset")?,
            Some(_) => return Err("Stream-Fork-Sub-Offset must be a non-negative integer"),
        };
        if sub_offset > 0 && fork_offset.is_none() {
            return Err("Stream-Fork-Sub-Offset > 0 needs Stream-Fork-Offset");
        }
        let explicit_type = header("content-type").map(str::to_owned);
        let ttl = header("stream-ttl");
        let expires = header("stream-expires-at").map(str::to_owned);
        let closed = header("stream-closed").is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let host = header("host").map(str::to_owned);
        if ttl.is_some() && expires.is_some() {
            return Err("give Stream-TTL or Stream-Expires-At, not both");
        }
        let ttl_seconds = match ttl {
            Some(t)
                if !t.is_empty()
                    && t.bytes().all(|b| b.is_ascii_digit())
                    && (t == "0" || !t.starts_with('0')) =>
            {
                Some(t.parse::<u64>().map_err(|_| "bad Stream-TTL")?)
            }
            Some(_) => return Err("Stream-TTL must be a non-negative integer"),
            None => None,
        };
        let expires_at_ms = match (&expires, ttl_seconds) {
            (Some(e), _) => Some(parse_time(e).ok_or("bad Stream-Expires-At")?),
            (None, Some(t)) => Some(now.saturating_add((t as i64).saturating_mul(1000))),
            (None, None) => None,
        };
        Ok(CreateHeaders {
            forked_from,
            fork_offset,
            sub_offset,
            explicit_type,
            ttl_seconds,
            expires,
            expires_at_ms,
            closed,
            host,
        })
    }

    /// The stream's content type: as given, else binary.
    fn content_type(&self) -> String {
        self.explicit_type
            .clone()
            .unwrap_or_else(|| "application/octet-stream".to_owned())
    }
}

/// The settings a fork may fill from its source or the stored fork.
struct Settings {
    content_type: String,
    ttl_seconds: Option<u64>,
    expires_at_ms: Option<i64>,
}

impl Settings {
    /// Fills what the request left open from the source a new fork copies:
    /// the source's content type always (an explicit one of another media
    /// type was refused by [`Streams::fork_prefix`]), and its TTL (with the expiry it implies from `now`, else
    /// the source's expiry) unless the request set a TTL or an expiry.
    fn fill_from_source(&mut self, source: &StreamState, asked: &CreateHeaders, now: i64) {
        self.content_type = source.config.content_type.clone();
        if self.ttl_seconds.is_none() && asked.expires.is_none() {
            self.ttl_seconds = source.config.ttl_seconds;
            self.expires_at_ms = self
                .ttl_seconds
                .map(|t| now.saturating_add((t as i64).saturating_mul(1000)))
                .or(source.config.expires_at_ms);
        }
    }
}

/// The fork part of a fork created again over the `existing` stream at its
/// path: the settings the request left open come from the stored stream
/// (content type, and TTL unless a TTL or expiry was given), the lineage
/// is the asked one (the create command compares it with the stored one),
/// nothing is inherited and no reference is taken, since the source is not
/// read (it may be deleted by now).
fn fork_again(
    existing: &StreamState,
    source: &str,
    asked: &CreateHeaders,
    settings: &mut Settings,
) -> Result<ForkPart, Error> {
    if asked.explicit_type.is_none() {
        settings.content_type = existing.config.content_type.clone();
    }
    if settings.ttl_seconds.is_none() && asked.expires.is_none() {
        settings.ttl_seconds = existing.config.ttl_seconds;
    }
    let offset = match asked.fork_offset.as_deref() {
        Some(text) => {
            offset::parse(text).ok_or_else(|| Error::bad("malformed Stream-Fork-Offset"))?
        }
        None => 0,
    };
    Ok(ForkPart {
        inherited: Vec::new(),
        lineage: Lineage {
            source: source.to_owned(),
            offset,
            sub_offset: asked.sub_offset,
        },
        registered: false,
    })
}

/// A fork's part of its create: the source's messages it starts with, its
/// lineage, and whether this request took a reference on the source.
struct ForkPart {
    inherited: Vec<Vec<u8>>,
    lineage: Lineage,
    registered: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;
    use proptest::prelude::*;

    /// A header's text: digits (to reach the accepted paths) or any
    /// visible ASCII.
    fn text() -> impl Strategy<Value = Option<String>> {
        proptest::option::of(prop_oneof!["[0-9]{1,22}", "[ -~]{0,12}"])
    }

    fn headers(pairs: &[(&'static str, &Option<String>)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            if let Some(value) = value {
                map.insert(*name, HeaderValue::from_str(value).unwrap());
            }
        }
        map
    }

    proptest! {
        /// Any create headers are either refused with a message or
        /// accepted as the protocol reads them: a TTL only in canonical
        /// digits and then the expiry it implies, never TTL and expiry
        /// together, a sub-offset only with a source, a sub-offset past
        /// zero only with an offset.
        #[test]
        fn create_headers_are_refused_or_read_as_the_protocol_says(
            forked_from in text(),
            fork_offset in text(),
            sub_offset in text(),
            ttl in text(),
            expires in text(),
            closed in text(),
            now in 0i64..4_000_000_000_000,
        ) {
            let map = headers(&[
                ("stream-forked-from", &forked_from),
                ("stream-fork-offset", &fork_offset),
                ("stream-fork-sub-offset", &sub_offset),
                ("stream-ttl", &ttl),
                ("stream-expires-at", &expires),
                ("stream-closed", &closed),
            ]);
            let Ok(asked) = CreateHeaders::parse(&map, now) else {
                return Ok(());
            };
            prop_assert!(ttl.is_none() || expires.is_none());
            prop_assert_eq!(asked.ttl_seconds.map(|t| t.to_string()), ttl.clone());
            if let Some(t) = asked.ttl_seconds {
                prop_assert_eq!(
                    asked.expires_at_ms,
                    Some(now.saturating_add((t as i64).saturating_mul(1000)))
                );
            }
            if expires.is_none() && ttl.is_none() {
                prop_assert_eq!(asked.expires_at_ms, None);
            }
            if sub_offset.is_some() {
                prop_assert!(forked_from.is_some());
                prop_assert!(asked.sub_offset == 0 || fork_offset.is_some());
            }
            prop_assert_eq!(
                asked.closed,
                closed.is_some_and(|c| c.eq_ignore_ascii_case("true"))
            );
            prop_assert_eq!(asked.forked_from, forked_from);
        }
    }

    #[test]
    fn create_headers_refuse_what_the_protocol_forbids() {
        let some = |t: &str| Some(t.to_owned());
        let refused = |pairs: &[(&'static str, &Option<String>)]| {
            CreateHeaders::parse(&headers(pairs), 0).err()
        };
        assert_eq!(
            refused(&[
                ("stream-ttl", &some("60")),
                ("stream-expires-at", &some("2030-01-01T00:00:00Z"))
            ]),
            Some("give Stream-TTL or Stream-Expires-At, not both")
        );
        assert_eq!(
            refused(&[("stream-ttl", &some("060"))]),
            Some("Stream-TTL must be a non-negative integer")
        );
        assert_eq!(
            refused(&[("stream-fork-sub-offset", &some("1"))]),
            Some("Stream-Fork-Sub-Offset needs Stream-Forked-From")
        );
        assert_eq!(
            refused(&[
                ("stream-forked-from", &some("/s")),
                ("stream-fork-sub-offset", &some("2"))
            ]),
            Some("Stream-Fork-Sub-Offset > 0 needs Stream-Fork-Offset")
        );
        assert_eq!(
            refused(&[("stream-expires-at", &some("tomorrow"))]),
            Some("bad Stream-Expires-At")
        );
        let asked = CreateHeaders::parse(&headers(&[("stream-ttl", &some("0"))]), 5).unwrap();
        assert_eq!((asked.ttl_seconds, asked.expires_at_ms), (Some(0), Some(5)));
    }
}
