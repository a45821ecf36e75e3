//! GET and HEAD: catch-up reads, long-polls and the stream's metadata.

use super::error::Error;
use super::http::{header, is_json, names, query_params, respond, set, state_headers};
use super::{Body, Streams};
use crate::clock::now_ms;
use crate::kinds::stream::{StreamOutput, StreamQuery, StreamState};
use crate::notify;
use crate::offset;
use crate::tail::TailRead;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use bytes::Bytes;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use std::sync::Arc;

/// Joins read messages into the response body for the stream's type.
pub(super) fn join(state: &StreamState, messages: &[(u64, String)]) -> Vec<u8> {
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
pub(super) fn cursor(client: Option<&str>) -> String {
    let interval = (now_ms().max(0) as u64) / 20_000;
    match client.and_then(|c| c.parse::<u64>().ok()) {
        Some(c) if c >= interval => (c + 1).to_string(),
        _ => interval.to_string(),
    }
}

pub(super) enum Mode {
    CatchUp,
    LongPoll,
    Sse,
}

impl Streams {
    pub(super) async fn head(&self, request: Request<Incoming>) -> Response<Body> {
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
                set(
                    headers,
                    names::STREAM_NEXT_OFFSET,
                    offset::format(state.tail),
                );
                response
            }
            Ok(StreamOutput::Gone) => self.gone_at(&path).into(),
            Ok(_) => Error::NotFound.into(),
            Err(e) => e.into(),
        }
    }

    pub(super) async fn read(&self, request: Request<Incoming>) -> Result<Response<Body>, Error> {
        let path = request.uri().path().to_owned();
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
            Some(_) => return Err(Error::bad("live must be long-poll or sse")),
        };
        let offset_param = get("offset");
        if !matches!(mode, Mode::CatchUp) && offset_param.is_none() {
            return Err(Error::bad("live reads need an offset"));
        }
        let start = match offset_param.as_deref() {
            None | Some("-1") => Some(0),
            Some("now") => None,
            Some(text) => Some(offset::parse(text).ok_or_else(|| Error::bad("malformed offset"))?),
        };
        let client_cursor = get("cursor");
        let if_none_match = header(&request, "if-none-match").map(str::to_owned);
        match mode {
            Mode::CatchUp => self.catch_up(&path, start, if_none_match.as_deref()).await,
            Mode::LongPoll => self.long_poll(&path, start, client_cursor.as_deref()).await,
            Mode::Sse => self.sse(&path, start, client_cursor).await,
        }
    }

    pub(super) async fn read_at(
        &self,
        path: &str,
        start: Option<u64>,
    ) -> Result<(StreamState, Vec<(u64, String)>, u64, u64), Error> {
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
            StreamOutput::BadOffset => Err(Error::bad("offset is not in this stream")),
            StreamOutput::Gone => Err(self.gone_at(path)),
            _ => Err(Error::NotFound),
        }
    }

    /// A live reader's read at `position` (`None`: the tail), shared with
    /// the other live readers there whose wake came no later than its
    /// start ([`crate::tail`]).
    pub(super) async fn read_live(
        &self,
        path: &str,
        position: Option<u64>,
        woke: tokio::time::Instant,
    ) -> Result<Arc<TailRead>, Error> {
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

    pub(super) async fn catch_up(
        &self,
        path: &str,
        start: Option<u64>,
        if_none_match: Option<&str>,
    ) -> Result<Response<Body>, Error> {
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
            set(response.headers_mut(), names::ETAG, &etag);
            return Ok(response);
        }
        let mut response = respond(StatusCode::OK, join(&state, &messages));
        let headers = response.headers_mut();
        set(headers, names::CONTENT_TYPE, &state.config.content_type);
        set(headers, names::STREAM_NEXT_OFFSET, offset::format(next));
        set(headers, names::ETAG, &etag);
        if up_to_date {
            set(headers, names::STREAM_UP_TO_DATE, "true");
        }
        if closed {
            set(headers, names::STREAM_CLOSED, "true");
        }
        Ok(response)
    }

    pub(super) async fn long_poll(
        &self,
        path: &str,
        start: Option<u64>,
        client_cursor: Option<&str>,
    ) -> Result<Response<Body>, Error> {
        // Held until the answer is ready; never waited for.
        let Ok(_permit) = self.live.long_polls.clone().try_acquire_owned() else {
            return Err(Error::TooMany("long-polls"));
        };
        let deadline = tokio::time::Instant::now() + self.config.long_poll_timeout;
        // Subscribe before the emptiness check, so an append between the
        // check and the wait still wakes this reader.
        let mut changes = self.changes(path);
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
                set(headers, names::CONTENT_TYPE, &state.config.content_type);
                set(headers, names::STREAM_NEXT_OFFSET, offset::format(next));
                set(headers, names::STREAM_CURSOR, cursor(client_cursor));
                if next == state.tail {
                    set(headers, names::STREAM_UP_TO_DATE, "true");
                    if state.closed {
                        set(headers, names::STREAM_CLOSED, "true");
                    }
                }
                return Ok(response);
            }
            if state.closed || tokio::time::Instant::now() >= deadline {
                let mut response = respond(StatusCode::NO_CONTENT, "");
                let headers = response.headers_mut();
                set(headers, names::CONTENT_TYPE, &state.config.content_type);
                set(headers, names::STREAM_NEXT_OFFSET, offset::format(from));
                set(headers, names::STREAM_UP_TO_DATE, "true");
                if state.closed {
                    set(headers, names::STREAM_CLOSED, "true");
                } else {
                    set(headers, names::STREAM_CURSOR, cursor(client_cursor));
                }
                return Ok(response);
            }
            woke = notify::wait(&mut changes, deadline).await;
        }
    }
}
