//! Why a request to the subscriptions control API ends without its normal answer: one [`ControlError`] for every handler, turned into its JSON response in one place.

use std::borrow::Cow;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::HeaderValue;
use hyper::{Response, StatusCode};
use serde_json::{json, Value};

use crate::backend::BackendError;
use crate::server::{Body, Error as StreamError};

/// A control request's failure, answered as
/// `{"error": {"code": …, "message": …}}` with its status.
#[derive(Debug)]
pub(crate) enum ControlError {
    /// 400 `INVALID_REQUEST`: the request is malformed; the message says how.
    Invalid(Cow<'static, str>),
    /// 400 `WEBHOOK_URL_REJECTED`: the webhook URL may not be called.
    WebhookRejected(String),
    /// 404 `NOT_FOUND`: no such subscription, or no such route.
    NotFound(&'static str),
    /// 413 `INVALID_REQUEST`: the body is over its bound.
    BodyTooLarge,
    /// 401 `TOKEN_INVALID`: the bearer token is not this wake's.
    Unauthorized,
    /// 409 `FENCED`: the wake generation is not current (the current one
    /// is given).
    Fenced { generation: u64 },
    /// 409 `ALREADY_CLAIMED`: another worker holds the wake (named).
    AlreadyClaimed { holder: String },
    /// 409 with `code`: the request contradicts the subscription's state.
    Conflict {
        code: &'static str,
        message: Cow<'static, str>,
    },
    /// 507 with `code`: a bound of the registry is reached.
    Full {
        code: &'static str,
        message: &'static str,
    },
    /// 500 `INTERNAL`: a Cell answered what this request never expects.
    Unexpected,
    /// The Cell could not answer (here or on its owner), or another
    /// failure of the stream side, answered as the stream handlers do.
    Stream(StreamError),
}

impl ControlError {
    /// 400 `INVALID_REQUEST` with `message`.
    pub(crate) fn invalid(message: impl Into<Cow<'static, str>>) -> Self {
        ControlError::Invalid(message.into())
    }

    /// 404: the subscription this request names does not exist.
    pub(crate) fn no_subscription() -> Self {
        ControlError::NotFound("no such subscription")
    }

    /// The status and JSON body this error is answered with (`None` for
    /// a stream-side error, which answers as the stream handlers do).
    fn status_and_body(&self) -> Option<(StatusCode, Value)> {
        let fail = |status, code: &str, message: &str| {
            Some((status, json!({"error": {"code": code, "message": message}})))
        };
        match self {
            ControlError::Invalid(message) => {
                fail(StatusCode::BAD_REQUEST, "INVALID_REQUEST", message)
            }
            ControlError::WebhookRejected(message) => {
                fail(StatusCode::BAD_REQUEST, "WEBHOOK_URL_REJECTED", message)
            }
            ControlError::NotFound(message) => fail(StatusCode::NOT_FOUND, "NOT_FOUND", message),
            ControlError::BodyTooLarge => fail(
                StatusCode::PAYLOAD_TOO_LARGE,
                "INVALID_REQUEST",
                "body too large",
            ),
            ControlError::Unauthorized => fail(
                StatusCode::UNAUTHORIZED,
                "TOKEN_INVALID",
                "the bearer token is not this wake's",
            ),
            ControlError::Fenced { generation } => Some((
                StatusCode::CONFLICT,
                json!({"error": {
                    "code": "FENCED",
                    "message": "this wake generation is not current",
                    "current_generation": generation,
                }}),
            )),
            ControlError::AlreadyClaimed { holder } => Some((
                StatusCode::CONFLICT,
                json!({"error": {
                    "code": "ALREADY_CLAIMED",
                    "message": "another worker holds this subscription's wake",
                    "current_holder": holder,
                }}),
            )),
            ControlError::Conflict { code, message } => fail(StatusCode::CONFLICT, code, message),
            ControlError::Full { code, message } => {
                fail(StatusCode::INSUFFICIENT_STORAGE, code, message)
            }
            ControlError::Unexpected => fail(
                StatusCode::INTERNAL_SERVER_ERROR,
                "INTERNAL",
                "unexpected output",
            ),
            ControlError::Stream(_) => None,
        }
    }
}

impl From<StreamError> for ControlError {
    fn from(e: StreamError) -> Self {
        ControlError::Stream(e)
    }
}

impl From<BackendError> for ControlError {
    fn from(e: BackendError) -> Self {
        ControlError::Stream(StreamError::Backend(e))
    }
}

impl From<ControlError> for Response<Body> {
    fn from(e: ControlError) -> Self {
        if let ControlError::Stream(e) = e {
            return e.into();
        }
        let (status, body) = e
            .status_and_body()
            .expect("every refusal but a stream-side one has a JSON body");
        json_response(status, &body)
    }
}

/// `value` as an `application/json` response with `status`.
pub(crate) fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(value.to_string())).boxed());
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert("content-type", HeaderValue::from_static("application/json"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each refusal keeps the status, code and extra field the control
    /// API has always answered with.
    #[test]
    fn each_refusal_has_its_status_code_and_fields() {
        let cases = [
            (ControlError::invalid("x"), 400, "INVALID_REQUEST"),
            (
                ControlError::WebhookRejected("loopback".into()),
                400,
                "WEBHOOK_URL_REJECTED",
            ),
            (
                ControlError::NotFound("no such subscription"),
                404,
                "NOT_FOUND",
            ),
            (ControlError::BodyTooLarge, 413, "INVALID_REQUEST"),
            (ControlError::Unauthorized, 401, "TOKEN_INVALID"),
            (ControlError::Fenced { generation: 7 }, 409, "FENCED"),
            (
                ControlError::AlreadyClaimed {
                    holder: "w1".into(),
                },
                409,
                "ALREADY_CLAIMED",
            ),
            (
                ControlError::Conflict {
                    code: "INVALID_OFFSET",
                    message: "past its tail".into(),
                },
                409,
                "INVALID_OFFSET",
            ),
            (
                ControlError::Full {
                    code: "TOO_MANY_LINKS",
                    message: "explicit link limit reached",
                },
                507,
                "TOO_MANY_LINKS",
            ),
            (ControlError::Unexpected, 500, "INTERNAL"),
        ];
        for (error, status, code) in cases {
            let (got, body) = error.status_and_body().expect("a JSON refusal");
            assert_eq!(got.as_u16(), status, "{error:?}");
            assert_eq!(body["error"]["code"], code, "{error:?}");
            assert!(body["error"]["message"].is_string(), "{error:?}");
        }
        let (_, fenced) = ControlError::Fenced { generation: 7 }
            .status_and_body()
            .unwrap();
        assert_eq!(fenced["error"]["current_generation"], 7);
        let (_, claimed) = ControlError::AlreadyClaimed {
            holder: "w1".into(),
        }
        .status_and_body()
        .unwrap();
        assert_eq!(claimed["error"]["current_holder"], "w1");
        // A stream-side failure answers as the stream handlers do.
        let response: Response<Body> =
            ControlError::from(StreamError::TooMany("long-polls")).into();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
}
