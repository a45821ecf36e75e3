//! Why a request ends without its normal answer: one [`Error`] for every handler, turned into its response in one place ([`From<Error> for Response`]).

use std::borrow::Cow;

use hyper::{Response, StatusCode};

use super::http::{error, names, set};
use super::Body;
use crate::backend::BackendError;

/// A handler's failure.
#[derive(Debug)]
pub(crate) enum Error {
    /// 400: the request is malformed; the message says how.
    BadRequest(Cow<'static, str>),
    /// 404: no such stream.
    NotFound,
    /// 410: the stream was deleted while forks of it exist.
    Gone,
    /// 409: a create at the path of a deleted stream whose forks remain.
    DeletedPath,
    /// 503, try again in a second: too many open live reads of this kind
    /// on the node ("long-polls", "SSE connections").
    TooMany(&'static str),
    /// Another status, with its plain-text message.
    Status(StatusCode, Cow<'static, str>),
    /// The stream's Cell could not answer, here or on its owner.
    Backend(BackendError),
    /// A refusal that carries headers of its own (a closed stream's tail,
    /// a producer's expected sequence...), sent as built.
    Response(Box<Response<Body>>),
}

impl Error {
    /// 400 with `message`.
    pub(crate) fn bad(message: impl Into<Cow<'static, str>>) -> Self {
        Error::BadRequest(message.into())
    }

    /// `status` with `message`.
    pub(crate) fn status(status: StatusCode, message: impl Into<Cow<'static, str>>) -> Self {
        Error::Status(status, message.into())
    }

    /// A refusal built with its headers.
    pub(crate) fn response(response: Response<Body>) -> Self {
        Error::Response(Box::new(response))
    }
}

impl From<BackendError> for Error {
    fn from(e: BackendError) -> Self {
        Error::Backend(e)
    }
}

impl From<Error> for Response<Body> {
    fn from(e: Error) -> Self {
        match e {
            Error::BadRequest(message) => error(StatusCode::BAD_REQUEST, &message),
            Error::NotFound => error(StatusCode::NOT_FOUND, "no such stream"),
            Error::Gone => error(StatusCode::GONE, "stream was deleted"),
            Error::DeletedPath => error(
                StatusCode::CONFLICT,
                "a deleted stream keeps this path until its forks are deleted",
            ),
            Error::TooMany(what) => {
                let mut response = error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &format!("too many open {what} on this node"),
                );
                set(response.headers_mut(), names::RETRY_AFTER, "1");
                response
            }
            Error::Status(status, message) => error(status, &message),
            Error::Backend(e) => backend_error(e),
            Error::Response(response) => *response,
        }
    }
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
            names::RETRY_AFTER,
            retry_after_ms.div_ceil(1000).max(1).to_string(),
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(response: &Response<Body>, name: &str) -> Option<String> {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    }

    /// Each error answers its status, a plain-text body, and the retry
    /// hint a client acts on.
    #[test]
    fn errors_answer_their_status_and_retry_hint() {
        let cases: Vec<(Error, StatusCode, Option<&str>)> = vec![
            (Error::bad("no"), StatusCode::BAD_REQUEST, None),
            (Error::NotFound, StatusCode::NOT_FOUND, None),
            (Error::Gone, StatusCode::GONE, None),
            (Error::DeletedPath, StatusCode::CONFLICT, None),
            (
                Error::TooMany("long-polls"),
                StatusCode::SERVICE_UNAVAILABLE,
                Some("1"),
            ),
            (
                Error::Backend(BackendError::Unavailable {
                    message: "busy".into(),
                    retry_after_ms: Some(1_500),
                }),
                StatusCode::SERVICE_UNAVAILABLE,
                Some("2"),
            ),
            (
                Error::Backend(BackendError::UnknownOutcome("cut".into())),
                StatusCode::SERVICE_UNAVAILABLE,
                None,
            ),
            (
                Error::status(StatusCode::PAYLOAD_TOO_LARGE, "body too large"),
                StatusCode::PAYLOAD_TOO_LARGE,
                None,
            ),
        ];
        for (error, status, retry_after) in cases {
            let text = format!("{error:?}");
            let response = Response::from(error);
            assert_eq!(response.status(), status, "{text}");
            assert_eq!(
                header(&response, "retry-after").as_deref(),
                retry_after,
                "{text}"
            );
            assert_eq!(
                header(&response, "content-type").as_deref(),
                Some("text/plain"),
                "{text}"
            );
        }
        let built = error(StatusCode::CONFLICT, "stream is closed");
        let sent = Response::from(Error::response(built));
        assert_eq!(sent.status(), StatusCode::CONFLICT);
    }
}
