//! POST: appending to a stream, with idempotent producers and closing.

use super::error::Error;
use super::http::{encode, error, header, is_json, json_messages, names, respond, set};
use super::{Body, Streams};
use crate::clock::now_ms;
use crate::kinds::stream::{Producer, StreamCommand, StreamOutput, StreamState};
use crate::offset;
use hyper::body::Incoming;
use hyper::header::HeaderMap;
use hyper::{Request, Response, StatusCode};

impl Streams {
    pub(super) async fn append(&self, request: Request<Incoming>) -> Result<Response<Body>, Error> {
        let path = request.uri().path().to_owned();
        let content_type = header(&request, "content-type").map(str::to_owned);
        let close =
            header(&request, "stream-closed").is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let seq = header(&request, "stream-seq").map(str::to_owned);
        let producer = producer_headers(request.headers()).map_err(Error::bad)?;
        let body = self.body(request).await?;
        if body.is_empty() && !close {
            return Err(Error::bad("empty append"));
        }
        let messages = if body.is_empty() {
            Vec::new()
        } else {
            let Some(ct) = &content_type else {
                return Err(Error::bad("Content-Type is required"));
            };
            if is_json(ct) {
                json_messages(&body, false).map_err(Error::bad)?
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
        self.appended(output, &path, messages.is_empty())
    }

    /// The answer to an append command's `output` at `path` (`empty`: a
    /// close-only request).
    fn appended(
        &self,
        output: StreamOutput,
        path: &str,
        empty: bool,
    ) -> Result<Response<Body>, Error> {
        match output {
            StreamOutput::Appended { state, producer } => {
                self.published(path, state.tail);
                // Close-only requests answer 204 even for producers.
                let status = if producer.is_some() && !empty {
                    StatusCode::OK
                } else {
                    StatusCode::NO_CONTENT
                };
                Ok(accepted(status, &state, producer.as_ref()))
            }
            StreamOutput::Duplicate { state, producer } => {
                Ok(accepted(StatusCode::NO_CONTENT, &state, Some(&producer)))
            }
            refused => Err(refusal(refused)),
        }
    }
}

/// The answer to an append stored now or before (a producer's retry):
/// `status`, the stream's next offset, whether it is closed, and the
/// producer's position when there is one.
fn accepted(
    status: StatusCode,
    state: &StreamState,
    producer: Option<&Producer>,
) -> Response<Body> {
    let mut response = respond(status, "");
    let headers = response.headers_mut();
    set(
        headers,
        names::STREAM_NEXT_OFFSET,
        offset::format(state.tail),
    );
    if state.closed {
        set(headers, names::STREAM_CLOSED, "true");
    }
    if let Some(p) = producer {
        set(headers, names::PRODUCER_EPOCH, p.epoch.to_string());
        set(headers, names::PRODUCER_SEQ, p.seq.to_string());
    }
    response
}

/// The error answering an append command's `output` that stored nothing,
/// with the headers the protocol asks for (a closed stream's next offset,
/// a producer's current epoch, a sequence gap's expected and received seq).
fn refusal(output: StreamOutput) -> Error {
    match output {
        StreamOutput::NotFound => Error::NotFound,
        StreamOutput::Gone => Error::Gone,
        StreamOutput::ContentTypeMismatch => Error::status(
            StatusCode::CONFLICT,
            "content type does not match the stream's",
        ),
        StreamOutput::Closed { state } => {
            let mut response = error(StatusCode::CONFLICT, "stream is closed");
            set(response.headers_mut(), names::STREAM_CLOSED, "true");
            set(
                response.headers_mut(),
                names::STREAM_NEXT_OFFSET,
                offset::format(state.tail),
            );
            Error::response(response)
        }
        StreamOutput::SeqConflict => Error::status(
            StatusCode::CONFLICT,
            "Stream-Seq is not greater than the last",
        ),
        StreamOutput::StaleEpoch { current_epoch } => {
            let mut response = error(StatusCode::FORBIDDEN, "stale producer epoch");
            set(
                response.headers_mut(),
                names::PRODUCER_EPOCH,
                current_epoch.to_string(),
            );
            Error::response(response)
        }
        StreamOutput::InvalidEpochSeq => Error::bad("a new producer epoch must start at seq 0"),
        StreamOutput::SeqGap { expected, received } => {
            let mut response = error(StatusCode::CONFLICT, "producer sequence gap");
            set(
                response.headers_mut(),
                names::PRODUCER_EXPECTED_SEQ,
                expected.to_string(),
            );
            set(
                response.headers_mut(),
                names::PRODUCER_RECEIVED_SEQ,
                received.to_string(),
            );
            Error::response(response)
        }
        _ => Error::status(StatusCode::INTERNAL_SERVER_ERROR, "unexpected output"),
    }
}

/// The idempotent producer a request names (`Producer-Id`, `-Epoch`,
/// `-Seq`, all three or none), checked.
fn producer_headers(headers: &HeaderMap) -> Result<Option<Producer>, &'static str> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let id = header("producer-id");
    let epoch = header("producer-epoch");
    let seq = header("producer-seq");
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

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;
    use proptest::prelude::*;

    fn text() -> impl Strategy<Value = Option<String>> {
        proptest::option::of(prop_oneof!["[0-9]{1,22}", "[ -~]{0,12}"])
    }

    proptest! {
        /// A producer is all three headers or none; its numbers are
        /// plain decimal digits that fit a u64, read as written.
        #[test]
        fn producer_headers_are_all_or_nothing_and_read_as_written(
            id in text(),
            epoch in text(),
            seq in text(),
        ) {
            let mut map = HeaderMap::new();
            for (name, value) in [("producer-id", &id), ("producer-epoch", &epoch), ("producer-seq", &seq)] {
                if let Some(value) = value {
                    map.insert(name, HeaderValue::from_str(value).unwrap());
                }
            }
            match producer_headers(&map) {
                Ok(None) => prop_assert!(id.is_none() && epoch.is_none() && seq.is_none()),
                Ok(Some(producer)) => {
                    prop_assert_eq!(Some(producer.id), id);
                    prop_assert_eq!(epoch.as_deref().map(|e| e.parse::<u64>().unwrap()), Some(producer.epoch));
                    prop_assert_eq!(seq.as_deref().map(|s| s.parse::<u64>().unwrap()), Some(producer.seq));
                }
                Err(_) => prop_assert!(
                    id.is_some() || epoch.is_some() || seq.is_some(),
                    "no headers refused"
                ),
            }
        }
    }
}
