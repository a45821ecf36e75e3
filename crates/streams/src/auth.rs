//! Who may do what on the streams listener: the operation and path a request needs ([`required`], pure), the bearer token it carries, and the 401/403 answers with their `WWW-Authenticate` challenge.
//!
//! Checked in [`crate::Streams::handle`] before any Cell is touched. Not
//! checked: `OPTIONS` (CORS preflights carry no credentials), the JWKS
//! (public keys), and the subscription routes that carry the wake's own
//! bearer token (`callback`, `ack`, `release`), which the subscription
//! Cell verifies.

use std::sync::Arc;

use hyper::{Method, StatusCode};

use crate::token::{self, Denied, Grant, Op, TokenError, TokenKeys};

/// The reserved path segment: `<prefix>/__ds/...` is the subscriptions'
/// control API for the streams under `<prefix>/`, never a stream.
pub const CONTROL_SEGMENT: &str = "__ds";
/// The `realm` of the challenge.
pub const REALM: &str = "cellfleet-streams";

/// How the listener authorizes requests.
#[derive(Clone, Debug, Default)]
pub enum StreamsAuth {
    /// Anyone who reaches the listener may read, append, create and
    /// delete every stream (`streams_auth = "none"`: local development and
    /// the conformance suite).
    #[default]
    Anonymous,
    /// Every request needs a bearer token signed by one of these keys
    /// (`streams_auth = "token"`, the node's default).
    Tokens {
        /// The signing keys (the node's key registry).
        keys: Arc<dyn TokenKeys>,
        /// Clock difference allowed with a token's issuer.
        skew_ms: i64,
    },
}

/// What a request needs: an operation on a path (a prefix of the token
/// must cover the path), or nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Needs {
    /// No token checked (preflight, JWKS, a wake's own token, a method
    /// that is refused anyway).
    Nothing,
    /// `op` on `path`.
    Op {
        /// The operation.
        op: Op,
        /// The path the token must cover.
        path: String,
    },
}

/// What `method` on `path` needs. A subscription route under
/// `<prefix>/__ds/` needs `subscribe` on `<prefix>/`, everything the
/// subscription can reach.
pub fn required(method: &Method, path: &str) -> Needs {
    if *method == Method::OPTIONS {
        return Needs::Nothing;
    }
    let segments: Vec<&str> = path.split('/').collect();
    if let Some(at) = segments.iter().position(|s| *s == CONTROL_SEGMENT) {
        let rest = &segments[at + 1..];
        let exempt = matches!(rest, ["jwks.json"])
            || matches!(rest, ["subscriptions", _, "callback" | "ack" | "release"]);
        if exempt {
            return Needs::Nothing;
        }
        return Needs::Op {
            op: Op::Subscribe,
            path: format!("{}/", segments[..at].join("/")),
        };
    }
    let op = match *method {
        Method::GET | Method::HEAD => Op::Read,
        Method::POST => Op::Append,
        Method::PUT => Op::Create,
        Method::DELETE => Op::Delete,
        _ => return Needs::Nothing,
    };
    Needs::Op {
        op,
        path: path.to_owned(),
    }
}

/// The bearer token of a request: the `Authorization: Bearer` header, or
/// else the `access_token` query parameter (for `EventSource`).
pub fn bearer<'a>(authorization: Option<&'a str>, query: Option<&'a str>) -> Option<&'a str> {
    if let Some(value) = authorization {
        let (scheme, token) = value.split_once(' ')?;
        return scheme
            .eq_ignore_ascii_case("bearer")
            .then(|| token.trim())
            .filter(|t| !t.is_empty());
    }
    query?
        .split('&')
        .find_map(|pair| pair.strip_prefix(token::QUERY_PARAMETER)?.strip_prefix('='))
        .filter(|t| !t.is_empty())
}

/// Why a request is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// 401: no valid token.
    Unauthenticated(TokenError),
    /// 403: a valid token that does not grant the request.
    Forbidden(Denied),
}

impl Refusal {
    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            Refusal::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            Refusal::Forbidden(_) => StatusCode::FORBIDDEN,
        }
    }

    /// The `WWW-Authenticate` challenge (RFC 6750 §3).
    pub fn challenge(&self) -> String {
        let quoted = |text: &str| -> String {
            text.chars()
                .map(|c| match c {
                    '"' | '\\' => '\'',
                    c if c.is_ascii_graphic() || c == ' ' => c,
                    _ => '?',
                })
                .collect()
        };
        match self {
            Refusal::Unauthenticated(TokenError::Missing) => format!("Bearer realm=\"{REALM}\""),
            Refusal::Unauthenticated(e) => format!(
                "Bearer realm=\"{REALM}\", error=\"invalid_token\", error_description=\"{}\"",
                quoted(&e.to_string())
            ),
            Refusal::Forbidden(denied) => {
                let scope = match denied {
                    Denied::Op { op } => format!(", scope=\"{op}\""),
                    Denied::Path { .. } => String::new(),
                };
                format!(
                    "Bearer realm=\"{REALM}\", error=\"insufficient_scope\"{scope}, error_description=\"{}\"",
                    quoted(&denied.to_string())
                )
            }
        }
    }

    /// The body's message: what happened and what to do.
    pub fn message(&self) -> String {
        match self {
            Refusal::Unauthenticated(e) => format!("unauthorized: {e}"),
            Refusal::Forbidden(d) => format!(
                "forbidden: {d}; mint a token that grants it (`cellfleet keys token --prefix ... --ops ...`)"
            ),
        }
    }
}

/// Decides a request: `Ok(None)` when nothing is needed or the listener is
/// anonymous, `Ok(Some(grant))` when a token allows it.
pub fn authorize(
    auth: &StreamsAuth,
    method: &Method,
    path: &str,
    authorization: Option<&str>,
    query: Option<&str>,
    now_ms: i64,
) -> Result<Option<Grant>, Refusal> {
    let StreamsAuth::Tokens { keys, skew_ms } = auth else {
        return Ok(None);
    };
    let Needs::Op { op, path } = required(method, path) else {
        return Ok(None);
    };
    let token =
        bearer(authorization, query).ok_or(Refusal::Unauthenticated(TokenError::Missing))?;
    let grant =
        token::verify(token, keys.as_ref(), now_ms, *skew_ms).map_err(Refusal::Unauthenticated)?;
    grant.allows(&path, op).map_err(Refusal::Forbidden)?;
    Ok(Some(grant))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_method_needs_its_operation_on_the_path() {
        let on = |m: Method, p: &str| required(&m, p);
        let op = |op, path: &str| Needs::Op {
            op,
            path: path.into(),
        };
        assert_eq!(
            on(Method::GET, "/v1/stream/a"),
            op(Op::Read, "/v1/stream/a")
        );
        assert_eq!(
            on(Method::HEAD, "/v1/stream/a"),
            op(Op::Read, "/v1/stream/a")
        );
        assert_eq!(
            on(Method::POST, "/v1/stream/a"),
            op(Op::Append, "/v1/stream/a")
        );
        assert_eq!(
            on(Method::PUT, "/v1/stream/a"),
            op(Op::Create, "/v1/stream/a")
        );
        assert_eq!(
            on(Method::DELETE, "/v1/stream/a"),
            op(Op::Delete, "/v1/stream/a")
        );
        assert_eq!(on(Method::OPTIONS, "/v1/stream/a"), Needs::Nothing);
        assert_eq!(on(Method::PATCH, "/v1/stream/a"), Needs::Nothing);
    }

    #[test]
    fn subscription_routes_need_subscribe_on_their_prefix_except_wake_token_routes() {
        let sub = |m: Method, p: &str| required(&m, p);
        let prefix = Needs::Op {
            op: Op::Subscribe,
            path: "/v1/stream/app/".into(),
        };
        for (m, p) in [
            (Method::PUT, "/v1/stream/app/__ds/subscriptions/s1"),
            (Method::GET, "/v1/stream/app/__ds/subscriptions/s1"),
            (Method::DELETE, "/v1/stream/app/__ds/subscriptions/s1"),
            (Method::POST, "/v1/stream/app/__ds/subscriptions/s1/streams"),
            (Method::POST, "/v1/stream/app/__ds/subscriptions/s1/claim"),
            (Method::GET, "/v1/stream/app/__ds/nothing"),
        ] {
            assert_eq!(sub(m, p), prefix, "{p}");
        }
        for p in [
            "/v1/stream/app/__ds/jwks.json",
            "/v1/stream/app/__ds/subscriptions/s1/callback",
            "/v1/stream/app/__ds/subscriptions/s1/ack",
            "/v1/stream/app/__ds/subscriptions/s1/release",
        ] {
            assert_eq!(sub(Method::POST, p), Needs::Nothing, "{p}");
        }
    }

    #[test]
    fn the_token_comes_from_the_header_or_else_the_query() {
        assert_eq!(bearer(Some("Bearer abc"), None), Some("abc"));
        assert_eq!(bearer(Some("bearer  abc "), None), Some("abc"));
        assert_eq!(bearer(Some("Basic abc"), Some("access_token=x")), None);
        assert_eq!(bearer(Some("Bearer"), None), None);
        assert_eq!(
            bearer(None, Some("offset=-1&access_token=t.k.s&live=sse")),
            Some("t.k.s")
        );
        assert_eq!(bearer(None, Some("xaccess_token=t")), None);
        assert_eq!(bearer(None, Some("access_token=")), None);
        assert_eq!(bearer(None, None), None);
    }

    #[test]
    fn challenges_quote_safely() {
        let r = Refusal::Unauthenticated(TokenError::UnknownKey("a\"b\n".into()));
        let c = r.challenge();
        assert!(c.starts_with("Bearer realm=\"cellfleet-streams\", error=\"invalid_token\""));
        assert!(!c.contains('\n'));
        assert_eq!(c.matches('"').count(), 6, "{c}");
        assert_eq!(
            Refusal::Unauthenticated(TokenError::Missing).challenge(),
            "Bearer realm=\"cellfleet-streams\""
        );
        let f = Refusal::Forbidden(Denied::Op { op: Op::Delete }).challenge();
        assert!(
            f.contains("error=\"insufficient_scope\", scope=\"delete\""),
            "{f}"
        );
    }
}
