//! Server-sent events: a live read as an event stream, with its control events and the session that feeds it.

use super::error::Error;
use super::http::{is_text, names, set};
use super::read::{cursor, join};
use super::{Body, Streams};
use crate::notify::{self};
use crate::offset;
use crate::tail::TailRead;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::Response;
use serde::Serialize;
use std::convert::Infallible;
use std::sync::Arc;
use tokio::sync::{mpsc, watch};

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Control {
    stream_next_offset: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_cursor: Option<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    up_to_date: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream_closed: bool,
}

fn write_event(out: &mut String, kind: &str, data: &str) {
    out.push_str("event: ");
    out.push_str(kind);
    out.push('\n');
    // CR, LF and CRLF all end an SSE line: each becomes its own data line,
    // so a payload can never inject an event.
    let normalized = data.replace("\r\n", "\n").replace('\r', "\n");
    for line in normalized.split('\n') {
        out.push_str("data:");
        out.push_str(line);
        out.push('\n');
    }
    out.push('\n');
}

/// What one read sends: its `data` event (when it has messages) and its
/// `control` event, in one buffer, so they leave in one write. Sent as two
/// frames they could reach a client in two reads, and a client that stops
/// reading at the first complete event after the text `event: control`
/// (the conformance suite's SSE helper, when a payload holds that text)
/// saw the data without its control. Returns the bytes and whether the
/// stream is closed (the session's last event).
fn emission(read: &TailRead, binary: bool, client_cursor: Option<&str>) -> (Bytes, bool) {
    let (state, messages, next) = (&read.state, &read.messages, read.next);
    let mut out = String::new();
    if !messages.is_empty() {
        // Built once per shared read, whoever sends it first.
        let payload = read.sse_data.get_or_init(|| {
            if binary {
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
        write_event(&mut out, "data", payload);
    }
    let up_to_date = next == state.tail;
    let closed = up_to_date && state.closed;
    let control = Control {
        stream_next_offset: offset::format(next),
        stream_cursor: (!closed).then(|| cursor(client_cursor)),
        up_to_date,
        stream_closed: closed,
    };
    let text = serde_json::to_string(&control).unwrap_or_default();
    write_event(&mut out, "control", &text);
    (Bytes::from(out), closed)
}

pub(super) struct ReceiverBody(mpsc::Receiver<Result<Frame<Bytes>, Infallible>>);

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
pub(super) struct SseSession {
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

    /// Data event (when any), then a control event, in one frame; `false`
    /// ends the connection.
    async fn emit(&self, read: &TailRead) -> bool {
        let (bytes, closed) = emission(read, self.binary, self.client_cursor.as_deref());
        self.send(bytes).await && !closed
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

impl Streams {
    pub(super) async fn sse(
        &self,
        path: &str,
        start: Option<u64>,
        client_cursor: Option<String>,
    ) -> Result<Response<Body>, Error> {
        // Held by the writer task until the connection ends.
        let Ok(permit) = self.live.sse.clone().try_acquire_owned() else {
            return Err(Error::TooMany("SSE connections"));
        };
        let mut changes = self.changes(path);
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
        set(headers, names::CONTENT_TYPE, "text/event-stream");
        set(headers, names::CACHE_CONTROL, "no-cache");
        if binary {
            set(headers, names::STREAM_SSE_DATA_ENCODING, "base64");
        }
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::stream::{StreamConfig, StreamState};

    fn read(messages: Vec<(u64, String)>, closed: bool) -> TailRead {
        let state = StreamState {
            config: StreamConfig {
                content_type: "application/json".into(),
                ttl_seconds: None,
                expires_at: None,
                expires_at_ms: None,
            },
            tail: 1,
            closed,
            lineage: None,
        };
        TailRead::new((state, messages, 0, 1))
    }

    /// The conformance suite's payload: JSON whose text holds an SSE event.
    #[test]
    fn a_reads_data_and_control_leave_in_one_buffer_in_order() {
        let payload = r#"{"message":"line1\nline2","attack":"try\r\n\r\nevent: control\r\ndata: {\"bad\":true}"}"#;
        let (bytes, closed) =
            emission(&read(vec![(0, BASE64.encode(payload))], false), false, None);
        let text = std::str::from_utf8(&bytes).unwrap();
        let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
        assert_eq!(events.len(), 2, "{text}");
        assert_eq!(events[0], format!("event: data\ndata:[{payload}]"));
        assert!(
            events[1].starts_with("event: control\ndata:{\"streamNextOffset\":"),
            "{text}"
        );
        assert!(events[1].contains("\"upToDate\":true"), "{text}");
        assert!(!closed);
    }

    #[test]
    fn a_read_without_messages_is_its_control_alone_and_a_closed_tail_ends_the_session() {
        let (bytes, closed) = emission(&read(Vec::new(), true), false, None);
        let text = std::str::from_utf8(&bytes).unwrap();
        assert!(text.starts_with("event: control\ndata:{"), "{text}");
        assert!(text.contains("\"streamClosed\":true"), "{text}");
        assert_eq!(text.matches("event:").count(), 1, "{text}");
        assert!(closed);
    }
}
