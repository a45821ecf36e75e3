//! Real mTLS on loopback: who may connect to which listener, signed envelopes over the wire, and server reflection.

mod common;

use std::time::{SystemTime, UNIX_EPOCH};

use cellfleet_proto::v1;
use cellfleet_proto::v1::client_client::ClientClient;
use cellfleet_proto::v1::peer_client::PeerClient;
use cellfleet_router::certs::{ClusterCa, Role};
use cellfleet_router::registry::{KeyEntry, KeyRegistry};
use cellfleet_router::signing::{self, Domain};
use cellfleet_router::status::{detail_from_status, ERROR_DETAIL_METADATA};
use common::{channel, identity, start_stub_node};
use ed25519_dalek::SigningKey;
use prost::Message;
use tonic::Code;

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as i64
}

/// A call refused during the TLS handshake: the error names the alert the
/// server sent (the status code is tonic's choice for transport errors).
fn assert_handshake_refused(error: &tonic::Status, alert: &str) {
    let text = format!("{error:?}");
    assert!(
        text.contains(alert),
        "expected TLS alert {alert}, got {text}"
    );
}

fn app_key() -> SigningKey {
    SigningKey::from_bytes(&[5; 32])
}

fn registry() -> KeyRegistry {
    let entry = KeyEntry::new(
        "app",
        &app_key().verifying_key(),
        vec!["kv".into()],
        vec!["put".into(), "get".into()],
    );
    KeyRegistry::from_entries(vec![entry]).expect("registry")
}

fn command_body(command: &str) -> v1::CommandBody {
    v1::CommandBody {
        kind: "kv".into(),
        key: b"cart-7".to_vec(),
        command: command.into(),
        args_json: br#"{"key":"k","value":"v"}"#.to_vec(),
        command_id: vec![0xab; 16],
        issued_at_ms: now_ms(),
        expires_at_ms: now_ms() + 30_000,
    }
}

fn execute(envelope: v1::SignedEnvelope) -> v1::ExecuteRequest {
    v1::ExecuteRequest {
        envelope: Some(envelope),
    }
}

fn signed(body: &v1::CommandBody, key: &SigningKey) -> v1::SignedEnvelope {
    signing::seal(Domain::Command, body.encode_to_vec(), "app", key)
}

#[tokio::test]
async fn the_right_client_certificate_and_signature_work() {
    let ca = ClusterCa::generate("main").expect("ca");
    let node = start_stub_node(&ca, "n1", registry()).await;
    let client = identity(&ca, &Role::Client("app".into()));
    let mut grpc = ClientClient::new(channel(&client, node.client_addr));
    let response = grpc
        .execute(execute(signed(&command_body("put"), &app_key())))
        .await
        .expect("execute")
        .into_inner();
    assert_eq!(response.served_by, "n1");
    assert_eq!(response.command_id, vec![0xab; 16]);
    let Some(v1::execute_response::Outcome::ResultJson(json)) = response.outcome else {
        panic!("expected a result");
    };
    let echo: serde_json::Value = serde_json::from_slice(&json).expect("json");
    assert_eq!(echo["key_id"], "app");
    assert_eq!(echo["key"], "cart-7");
    assert_eq!(echo["args"], serde_json::json!({"key": "k", "value": "v"}));
    assert_eq!(node.reached.count(), 1);
}

#[tokio::test]
async fn a_client_certificate_from_another_ca_is_refused() {
    let ca = ClusterCa::generate("main").expect("ca");
    let other_ca = ClusterCa::generate("other").expect("other ca");
    let node = start_stub_node(&ca, "n1", registry()).await;
    // Signed by the other CA, but trusting the real CA for the server.
    let stranger = identity(&other_ca, &Role::Client("app".into()));
    let stranger = cellfleet_router::tls::TlsIdentity {
        ca: identity(&ca, &Role::Client("x".into())).ca,
        ..stranger
    };
    let mut grpc = ClientClient::new(channel(&stranger, node.client_addr));
    let error = grpc
        .execute(execute(signed(&command_body("put"), &app_key())))
        .await
        .expect_err("a foreign client certificate must be refused");
    assert_handshake_refused(&error, "UnknownCA");
    // Also a foreign *node* certificate on the peer listener.
    let foreign_node = cellfleet_router::tls::TlsIdentity {
        ca: identity(&ca, &Role::Client("x".into())).ca,
        ..identity(&other_ca, &Role::Node("n9".into()))
    };
    let error = PeerClient::new(channel(&foreign_node, node.peer_addr))
        .forward(v1::ForwardRequest::default())
        .await
        .expect_err("a foreign node certificate must be refused");
    assert_handshake_refused(&error, "UnknownCA");
    assert_eq!(node.reached.count(), 0, "nothing reached the service");
}

#[tokio::test]
async fn the_peer_listener_admits_nodes_only() {
    let ca = ClusterCa::generate("main").expect("ca");
    let node = start_stub_node(&ca, "n1", registry()).await;
    let client = identity(&ca, &Role::Client("app".into()));
    let error = PeerClient::new(channel(&client, node.peer_addr))
        .forward(v1::ForwardRequest::default())
        .await
        .expect_err("a client certificate must not reach the peer service");
    // The role check fails the handshake (rustls sends certificate_unknown
    // for an application verification failure).
    assert_handshake_refused(&error, "CertificateUnknown");

    let peer = identity(&ca, &Role::Node("n2".into()));
    let response = PeerClient::new(channel(&peer, node.peer_addr))
        .forward(v1::ForwardRequest {
            hops: 1,
            ..Default::default()
        })
        .await
        .expect("a node certificate works")
        .into_inner();
    let Some(v1::forward_response::Response::Query(answer)) = response.response else {
        panic!("expected the echo");
    };
    let echo: serde_json::Value = serde_json::from_slice(&answer.result_json).expect("json");
    assert_eq!(echo, serde_json::json!({"caller": "n2", "hops": 1}));
    assert_eq!(answer.served_by, "n1");
}

#[tokio::test]
async fn a_client_refuses_a_server_that_is_not_a_node() {
    // A server holding a *client* certificate of the right CA: the client's
    // verifier refuses it (webpki: no serverAuth usage; and the role rule).
    let ca = ClusterCa::generate("main").expect("ca");
    let impostor = identity(&ca, &Role::Client("impostor".into()));
    assert!(
        cellfleet_router::tls::server_config(&impostor, cellfleet_router::tls::Listener::Client)
            .is_ok(),
        "building is allowed; connecting is not"
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let config =
        cellfleet_router::tls::server_config(&impostor, cellfleet_router::tls::Listener::Client)
            .expect("config");
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(v1::client_server::ClientServer::new(common::EchoClient {
                verifier: cellfleet_router::envelope::Verifier::new(
                    std::sync::Arc::new(registry()),
                    Default::default(),
                    std::sync::Arc::new(cellfleet_authority::SystemClock),
                ),
                node_id: "impostor".into(),
                reached: Default::default(),
            }))
            .serve_with_incoming(cellfleet_router::transport::tls_incoming(listener, config)),
    );
    let client = identity(&ca, &Role::Client("app".into()));
    let error = ClientClient::new(channel(&client, addr))
        .execute(execute(signed(&command_body("put"), &app_key())))
        .await
        .expect_err("must not talk to a non-node server");
    assert_eq!(error.code(), Code::Unavailable, "{error:?}");
}

/// Over the wire: each bad envelope is refused with its documented status
/// and wire code, and nothing reaches the service.
#[tokio::test]
async fn bad_envelopes_get_their_documented_status_over_the_wire() {
    let ca = ClusterCa::generate("main").expect("ca");
    let node = start_stub_node(&ca, "n1", registry()).await;
    let client = identity(&ca, &Role::Client("app".into()));
    let mut grpc = ClientClient::new(channel(&client, node.client_addr));

    let mut unsigned = signed(&command_body("put"), &app_key());
    unsigned.signature.clear();
    let wrong = signed(&command_body("put"), &SigningKey::from_bytes(&[6; 32]));
    let mut expired_body = command_body("put");
    expired_body.issued_at_ms = now_ms() - 60_000;
    expired_body.expires_at_ms = now_ms() - 30_000;
    let mut future_body = command_body("put");
    future_body.issued_at_ms = now_ms() + 60_000;
    future_body.expires_at_ms = now_ms() + 90_000;
    let mut tampered = signed(&command_body("put"), &app_key());
    let last = tampered.body.len() - 1;
    tampered.body[last] ^= 1;
    let cases = [
        (unsigned, Code::Unauthenticated, v1::ErrorCode::Unsigned),
        (wrong, Code::Unauthenticated, v1::ErrorCode::BadSignature),
        (
            signed(&expired_body, &app_key()),
            Code::FailedPrecondition,
            v1::ErrorCode::Expired,
        ),
        (
            signed(&future_body, &app_key()),
            Code::FailedPrecondition,
            v1::ErrorCode::FutureDated,
        ),
        (
            signed(&command_body("delete"), &app_key()),
            Code::PermissionDenied,
            v1::ErrorCode::Unauthorized,
        ),
        (tampered, Code::Unauthenticated, v1::ErrorCode::BadSignature),
    ];
    for (i, (envelope, code, wire)) in cases.into_iter().enumerate() {
        let status = grpc.execute(execute(envelope)).await.expect_err("refused");
        assert_eq!(status.code(), code, "case {i}: {status:?}");
        assert!(status.metadata().get_bin(ERROR_DETAIL_METADATA).is_some());
        let detail = detail_from_status(&status).expect("detail");
        assert_eq!(detail.code, wire as i32, "case {i}");
        assert!(!detail.retry_safe, "case {i}");
    }
    assert_eq!(
        node.reached.count(),
        0,
        "no refused envelope reached the service"
    );
}

#[tokio::test]
async fn reflection_lists_the_cellfleet_services() {
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;

    let ca = ClusterCa::generate("main").expect("ca");
    let node = start_stub_node(&ca, "n1", registry()).await;
    let client = identity(&ca, &Role::Client("app".into()));
    let mut reflection = ServerReflectionClient::new(channel(&client, node.client_addr));
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = reflection
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect("reflection")
        .into_inner();
    let response = responses
        .message()
        .await
        .expect("stream")
        .expect("one answer");
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("expected a service list");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for name in [
        "cellfleet.v1.Client",
        "cellfleet.v1.Peer",
        "cellfleet.v1.Admin",
    ] {
        assert!(
            names.contains(&name.to_owned()),
            "{name} missing from {names:?}"
        );
    }
}
