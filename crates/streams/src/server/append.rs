//! POST: appending to a stream, with idempotent producers and closing.

use super::error::Error;
use super::http::{encode, error, header, is_json, json_messages, producer_headers, respond, set};
use super::{Body, Streams};
use crate::clock::now_ms;
use crate::kinds::stream::{StreamCommand, StreamOutput};
use crate::offset;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};

impl Streams {
    pub(super) async fn append(&self, request: Request<Incoming>) -> Response<Body> {
        self.try_append(request)
            .await
            .unwrap_or_else(Response::from)
    }

    pub(super) async fn try_append(
        &self,
        request: Request<Incoming>,
    ) -> Result<Response<Body>, Error> {
        let path = request.uri().path().to_owned();
        let bad = |m: &'static str| Error::bad(m);
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
            StreamOutput::NotFound => return Err(Error::NotFound),
            StreamOutput::Gone => return Err(Error::Gone),
            StreamOutput::ContentTypeMismatch => {
                return Err(Error::status(
                    StatusCode::CONFLICT,
                    "content type does not match the stream's",
                ))
            }
            StreamOutput::Closed { state } => {
                let mut response = error(StatusCode::CONFLICT, "stream is closed");
                set(response.headers_mut(), "stream-closed", "true");
                set(
                    response.headers_mut(),
                    "stream-next-offset",
                    offset::format(state.tail),
                );
                return Err(Error::response(response));
            }
            StreamOutput::SeqConflict => {
                return Err(Error::status(
                    StatusCode::CONFLICT,
                    "Stream-Seq is not greater than the last",
                ))
            }
            StreamOutput::StaleEpoch { current_epoch } => {
                let mut response = error(StatusCode::FORBIDDEN, "stale producer epoch");
                set(
                    response.headers_mut(),
                    "producer-epoch",
                    current_epoch.to_string(),
                );
                return Err(Error::response(response));
            }
            StreamOutput::InvalidEpochSeq => {
                return Err(bad("a new producer epoch must start at seq 0"))
            }
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
                return Err(Error::response(response));
            }
            _ => {
                return Err(Error::status(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "unexpected output",
                ))
            }
        };
        Ok(response)
    }
}
