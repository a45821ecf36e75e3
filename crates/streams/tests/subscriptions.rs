//! Subscriptions end to end on one node (local-directory store): a real webhook receiver on loopback gets a wake whose Ed25519 signature verifies against the served JWKS; the callback acknowledges it, and the same callback again is fenced.

use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD as BASE64URL;
use base64::Engine;
use bytes::Bytes;
use cellfleet_streams::StreamsConfig;
use ed25519_dalek::{Signature, Verifier, VerifyingKey};
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};
use tokio::sync::mpsc;

mod common;

/// One HTTP/1.1 request; returns the status and the body.
async fn call(method: &str, url: &str, headers: &[(&str, &str)], body: &str) -> (u16, Bytes) {
    let uri: hyper::Uri = url.parse().expect("url");
    let authority = uri.authority().expect("authority").to_string();
    let stream = tokio::net::TcpStream::connect(&authority)
        .await
        .expect("connect");
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("handshake");
    tokio::spawn(connection);
    let mut request = hyper::Request::builder()
        .method(method)
        .uri(uri.path_and_query().map(|p| p.as_str()).unwrap_or("/"))
        .header("host", &authority);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(Full::new(Bytes::from(body.to_owned())))
        .expect("request");
    let response = sender.send_request(request).await.expect("response");
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (status, body)
}

fn json_of(body: &Bytes) -> Value {
    serde_json::from_slice(body).unwrap_or_else(|_| panic!("not json: {body:?}"))
}

/// A webhook receiver: every request's signature header and raw body go to the channel; it answers `{}`.
async fn receiver() -> (String, mpsc::UnboundedReceiver<(String, Bytes)>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind receiver");
    let url = format!("http://{}/hook", listener.local_addr().expect("address"));
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request: hyper::Request<_>| {
                    let tx = tx.clone();
                    async move {
                        let signature = request
                            .headers()
                            .get("webhook-signature")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or_default()
                            .to_owned();
                        let body = BodyExt::collect(request.into_body())
                            .await
                            .map(|c| c.to_bytes())
                            .unwrap_or_default();
                        let _ = tx.send((signature, body));
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                            Bytes::from_static(b"{}"),
                        )))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (url, rx)
}

/// Checks `t=<unix>,kid=<kid>,ed25519=<sig>` over `"<t>.<body>"` with the JWKS key named by kid.
fn verifies(jwks: &Value, header: &str, body: &[u8]) -> bool {
    let Some(rest) = header.strip_prefix("t=") else {
        return false;
    };
    let Some((t, rest)) = rest.split_once(",kid=") else {
        return false;
    };
    let Some((kid, signature)) = rest.split_once(",ed25519=") else {
        return false;
    };
    let Some(key) = jwks["keys"]
        .as_array()
        .and_then(|keys| keys.iter().find(|k| k["kid"] == kid))
    else {
        return false;
    };
    let x: [u8; 32] = BASE64URL
        .decode(key["x"].as_str().unwrap_or_default())
        .ok()
        .and_then(|b| b.try_into().ok())
        .expect("32-byte key");
    let key = VerifyingKey::from_bytes(&x).expect("ed25519 key");
    let Ok(signature) = BASE64URL
        .decode(signature)
        .map_err(|_| ())
        .and_then(|b| Signature::from_slice(&b).map_err(|_| ()))
    else {
        return false;
    };
    let mut message = format!("{t}.").into_bytes();
    message.extend_from_slice(body);
    key.verify(&message, &signature).is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_webhook_wake_is_acknowledged_once_then_fenced() {
    let server = common::start(
        "subs",
        StreamsConfig {
            allow_loopback_webhooks: true,
            ..StreamsConfig::default()
        },
    )
    .await;
    let base = format!("http://{}/v1/stream", server.address);
    let (hook, mut wakes) = receiver().await;
    let json_type = [("content-type", "application/json")];

    // A private address is refused whatever the loopback setting.
    let (status, body) = call(
        "PUT",
        &format!("{base}/__ds/subscriptions/bad"),
        &json_type,
        &json!({"type": "webhook", "pattern": "events/*", "webhook": {"url": "http://169.254.169.254/x"}}).to_string(),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(json_of(&body)["error"]["code"], "WEBHOOK_URL_REJECTED");

    let sub = format!("{base}/__ds/subscriptions/s1");
    let create = json!({"type": "webhook", "pattern": "events/*", "webhook": {"url": hook}, "lease_ttl_ms": 60_000});
    let (status, body) = call("PUT", &sub, &json_type, &create.to_string()).await;
    assert_eq!(status, 201, "{body:?}");
    let created = json_of(&body);
    let jwks_url = created["webhook"]["signing"]["jwks_url"]
        .as_str()
        .expect("jwks_url")
        .to_owned();
    assert_eq!(jwks_url, format!("{base}/__ds/jwks.json"));
    let (status, body) = call("GET", &jwks_url, &[], "").await;
    assert_eq!(status, 200);
    let jwks = json_of(&body);

    // A stream outside the pattern wakes nobody; one inside does.
    let (status, _) = call("PUT", &format!("{base}/other/x"), &json_type, "{}").await;
    assert_eq!(status, 201);
    let (status, _) = call("PUT", &format!("{base}/events/a"), &json_type, r#"{"n":1}"#).await;
    assert_eq!(status, 201);
    let (signature, raw) = tokio::time::timeout(Duration::from_secs(30), wakes.recv())
        .await
        .expect("a wake arrives")
        .expect("receiver alive");
    assert!(verifies(&jwks, &signature, &raw), "signature {signature}");
    let mut tampered = raw.to_vec();
    tampered.push(b' ');
    assert!(!verifies(&jwks, &signature, &tampered));
    let wake = json_of(&raw);
    assert_eq!(wake["subscription_id"], "s1");
    let streams_in_wake = wake["streams"].as_array().expect("streams");
    assert_eq!(streams_in_wake.len(), 1, "{wake}");
    assert_eq!(streams_in_wake[0]["path"], "events/a");
    assert_eq!(streams_in_wake[0]["has_pending"], true);
    let tail = streams_in_wake[0]["tail_offset"].as_str().expect("tail");
    let callback = wake["callback_url"].as_str().expect("callback_url");
    assert_eq!(callback, format!("{sub}/callback"));
    let token = wake["callback_token"].as_str().expect("token");
    let ack = json!({
        "wake_id": wake["wake_id"],
        "generation": wake["generation"],
        "acks": [{"stream": "events/a", "offset": tail}],
        "done": true,
    })
    .to_string();

    let wrong = format!("Bearer x{token}");
    let (status, _) = call("POST", callback, &[("authorization", wrong.as_str())], &ack).await;
    assert_eq!(status, 401);
    let bearer = format!("Bearer {token}");
    let (status, body) = call(
        "POST",
        callback,
        &[("authorization", bearer.as_str())],
        &ack,
    )
    .await;
    assert_eq!(status, 200, "{body:?}");
    assert_eq!(json_of(&body), json!({"ok": true, "next_wake": false}));
    let (status, body) = call(
        "POST",
        callback,
        &[("authorization", bearer.as_str())],
        &ack,
    )
    .await;
    assert_eq!(status, 409);
    assert_eq!(json_of(&body)["error"]["code"], "FENCED");

    let (status, body) = call("GET", &sub, &[], "").await;
    assert_eq!(status, 200);
    let state = json_of(&body);
    assert!(state.get("webhook_secret").is_none());
    assert_eq!(state["streams"][0]["acked_offset"], tail);
    assert_eq!(state["streams"][0]["has_pending"], false);
    assert_eq!(state["wake"]["state"], "idle");

    // The next append starts the next generation.
    let (status, _) = call(
        "POST",
        &format!("{base}/events/a"),
        &json_type,
        r#"{"n":2}"#,
    )
    .await;
    assert_eq!(status, 204);
    let (signature, raw) = tokio::time::timeout(Duration::from_secs(30), wakes.recv())
        .await
        .expect("a second wake arrives")
        .expect("receiver alive");
    assert!(verifies(&jwks, &signature, &raw));
    let second = json_of(&raw);
    assert!(second["generation"].as_u64() > wake["generation"].as_u64());
    assert_ne!(second["wake_id"], wake["wake_id"]);

    let (status, _) = call("DELETE", &sub, &[], "").await;
    assert_eq!(status, 204);
    let (status, _) = call("GET", &sub, &[], "").await;
    assert_eq!(status, 404);
}
