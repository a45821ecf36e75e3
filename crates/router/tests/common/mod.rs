//! Test fixtures: a cluster CA with node and client identities, and a stub Client/Peer service that echoes verified envelopes over real mTLS on loopback.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cellfleet_authority::{CellId, SystemClock};
use cellfleet_proto::v1;
use cellfleet_proto::v1::client_server::{Client, ClientServer};
use cellfleet_proto::v1::peer_server::{Peer, PeerServer};
use cellfleet_router::certs::{ClusterCa, Role};
use cellfleet_router::envelope::{EnvelopePolicy, Verifier};
use cellfleet_router::registry::KeyRegistry;
use cellfleet_router::tls::{self, Listener, TlsIdentity};
use cellfleet_router::transport;
use tokio::net::TcpListener;
use tonic::transport::{Channel, Server};
use tonic::{Request, Response, Status};

/// The identity `role` issued by `ca`.
pub fn identity(ca: &ClusterCa, role: &Role) -> TlsIdentity {
    let issued = ca.issue(role, &[]).expect("issue certificate");
    TlsIdentity::from_pem(ca.cert_pem(), &issued.cert_pem, &issued.key_pem).expect("identity")
}

/// Counts requests that passed verification (stands in for "reached a Cell").
#[derive(Debug, Default)]
pub struct Reached(pub AtomicUsize);

impl Reached {
    pub fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// The stub client service: verifies the envelope exactly as the ingress
/// will, and echoes what it verified.
#[derive(Debug, Clone)]
pub struct EchoClient {
    pub verifier: Verifier,
    pub node_id: String,
    pub reached: Arc<Reached>,
}

fn receipt(kind: &str, key: &[u8]) -> v1::Receipt {
    v1::Receipt {
        cell_id: CellId::for_kind_key(kind, key).as_str().to_owned(),
        epoch: 1,
        txid: 1,
    }
}

#[tonic::async_trait]
impl Client for EchoClient {
    async fn execute(
        &self,
        request: Request<v1::ExecuteRequest>,
    ) -> Result<Response<v1::ExecuteResponse>, Status> {
        let envelope = request.into_inner().envelope.unwrap_or_default();
        let command = self.verifier.verify_command(&envelope)?;
        self.reached.0.fetch_add(1, Ordering::SeqCst);
        let echo = serde_json::json!({
            "key_id": command.key_id,
            "kind": command.kind,
            "key": String::from_utf8_lossy(&command.key),
            "command": command.command,
            "args": command.args,
            "expires_at_ms": command.expires_at_ms,
        });
        Ok(Response::new(v1::ExecuteResponse {
            command_id: command.command_id.to_vec(),
            outcome: Some(v1::execute_response::Outcome::ResultJson(
                echo.to_string().into_bytes(),
            )),
            receipt: Some(receipt(&command.kind, &command.key)),
            duplicate: false,
            served_by: self.node_id.clone(),
            served_by_endpoint: String::new(),
        }))
    }

    async fn query(
        &self,
        request: Request<v1::QueryRequest>,
    ) -> Result<Response<v1::QueryResponse>, Status> {
        let envelope = request.into_inner().envelope.unwrap_or_default();
        let query = self.verifier.verify_query(&envelope)?;
        self.reached.0.fetch_add(1, Ordering::SeqCst);
        Ok(Response::new(v1::QueryResponse {
            result_json: serde_json::json!({"query": query.query})
                .to_string()
                .into_bytes(),
            receipt: Some(receipt(&query.kind, &query.key)),
            served_by: self.node_id.clone(),
            served_by_endpoint: String::new(),
        }))
    }

    async fn resolve(
        &self,
        request: Request<v1::ResolveRequest>,
    ) -> Result<Response<v1::ResolveResponse>, Status> {
        let envelope = request.into_inner().envelope.unwrap_or_default();
        let resolve = self.verifier.verify_resolve(&envelope)?;
        self.reached.0.fetch_add(1, Ordering::SeqCst);
        Ok(Response::new(v1::ResolveResponse {
            command_id: resolve.command_id.to_vec(),
            state: v1::CommandState::Absent as i32,
            outcome: None,
            receipt: None,
            served_by: self.node_id.clone(),
            served_by_endpoint: String::new(),
        }))
    }
}

/// The stub peer service: answers with the calling node's id.
#[derive(Debug, Clone)]
pub struct EchoPeer {
    pub node_id: String,
}

#[tonic::async_trait]
impl Peer for EchoPeer {
    async fn forward(
        &self,
        request: Request<v1::ForwardRequest>,
    ) -> Result<Response<v1::ForwardResponse>, Status> {
        let caller = tls::require_node(&request)?;
        Ok(Response::new(v1::ForwardResponse {
            response: Some(v1::forward_response::Response::Query(v1::QueryResponse {
                result_json: serde_json::json!({"caller": caller, "hops": request.get_ref().hops})
                    .to_string()
                    .into_bytes(),
                receipt: None,
                served_by: self.node_id.clone(),
                served_by_endpoint: String::new(),
            })),
        }))
    }
    async fn stats(
        &self,
        request: Request<v1::StatsRequest>,
    ) -> Result<Response<v1::NodeStats>, Status> {
        tls::require_node(&request)?;
        Ok(Response::new(v1::NodeStats {
            node_id: self.node_id.clone(),
            ..Default::default()
        }))
    }
}

/// A running stub node: client listener (client service + reflection) and
/// peer listener (peer service), both mTLS.
#[derive(Debug)]
pub struct StubNode {
    pub client_addr: SocketAddr,
    pub peer_addr: SocketAddr,
    pub reached: Arc<Reached>,
}

pub async fn start_stub_node(ca: &ClusterCa, node_id: &str, registry: KeyRegistry) -> StubNode {
    let node = identity(ca, &Role::Node(node_id.to_owned()));
    let reached = Arc::new(Reached::default());
    let verifier = Verifier::new(
        Arc::new(registry),
        EnvelopePolicy::default(),
        Arc::new(SystemClock),
    );
    let client_service = EchoClient {
        verifier,
        node_id: node_id.to_owned(),
        reached: reached.clone(),
    };
    let client_listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let client_addr = client_listener.local_addr().expect("addr");
    let client_tls = tls::server_config(&node, Listener::Client).expect("client tls");
    let reflection = cellfleet_router::reflection::reflection_service().expect("reflection");
    tokio::spawn(
        Server::builder()
            .add_service(ClientServer::new(client_service))
            .add_service(reflection)
            .serve_with_incoming(transport::tls_incoming(client_listener, client_tls)),
    );
    let peer_listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let peer_addr = peer_listener.local_addr().expect("addr");
    let peer_tls = tls::server_config(&node, Listener::Peer).expect("peer tls");
    tokio::spawn(
        Server::builder()
            .add_service(PeerServer::new(EchoPeer {
                node_id: node_id.to_owned(),
            }))
            .serve_with_incoming(transport::tls_incoming(peer_listener, peer_tls)),
    );
    StubNode {
        client_addr,
        peer_addr,
        reached,
    }
}

/// A channel to `addr` presenting `identity`.
pub fn channel(identity: &TlsIdentity, addr: SocketAddr) -> Channel {
    let config = tls::client_config(identity).expect("client tls");
    transport::channel(addr, "localhost", config, Duration::from_secs(5)).expect("channel")
}

/// Writes the PEM of `identity` material for external clients.
pub fn write_pem(path: &Path, text: &str) {
    std::fs::write(path, text).expect("write pem");
}
