//! The benchmark's gRPC client: one mTLS channel per node (HTTP/2, shared by every worker), envelopes signed with the cluster's client key.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use cellfleet_proto::v1;
use cellfleet_proto::v1::client_client::ClientClient;
use cellfleet_router::signing::{seal, Domain};
use cellfleet_router::status::detail_from_status;
use ed25519_dalek::SigningKey;
use prost::Message;
use tonic::transport::Channel;

/// Per-call timeout.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Validity window of the signed envelopes.
const ENVELOPE_WINDOW_MS: i64 = 120_000;
/// Largest response accepted (the exactness check reads whole logs).
const RESPONSE_BYTES_MAX: usize = 256 * 1024 * 1024;

/// The client key: its id in the registry and the private key.
#[derive(Clone)]
pub struct Signer {
    pub key_id: String,
    pub key: Arc<SigningKey>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

/// Cheap to clone: workers each hold one.
#[derive(Clone, Debug)]
pub struct BenchClient {
    channels: Vec<Channel>,
    signer: Signer,
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A status in a few words: the Cellfleet error code if any, else the gRPC code.
pub fn describe(status: &tonic::Status) -> String {
    match detail_from_status(status).and_then(|d| v1::ErrorCode::try_from(d.code).ok()) {
        Some(code) => format!("{}: {}", code.as_str_name(), status.message()),
        None => format!("{:?}: {}", status.code(), status.message()),
    }
}

/// Whether the same request may be sent again (same envelope, same id).
pub fn retry_safe(status: &tonic::Status) -> bool {
    match detail_from_status(status) {
        Some(detail) => detail.retry_safe,
        None => status.code() == tonic::Code::Unavailable,
    }
}

impl BenchClient {
    /// Lazily connecting channels to `addrs` (node `i` is `addrs[i]`).
    pub fn new(
        tls: Arc<rustls::ClientConfig>,
        addrs: &[SocketAddr],
        signer: Signer,
    ) -> anyhow::Result<Self> {
        let channels = addrs
            .iter()
            .map(|addr| {
                cellfleet_router::transport::channel(
                    *addr,
                    &addr.ip().to_string(),
                    tls.clone(),
                    Duration::from_secs(2),
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(BenchClient { channels, signer })
    }

    fn client(&self, node: usize) -> ClientClient<Channel> {
        ClientClient::new(self.channels[node % self.channels.len()].clone())
            .max_decoding_message_size(RESPONSE_BYTES_MAX)
    }

    /// A signed `command` on the Cell `kind`/`key` with a fresh id.
    pub fn command(
        &self,
        kind: &str,
        key: &str,
        command: &str,
        args: &serde_json::Value,
    ) -> v1::ExecuteRequest {
        let now = now_ms();
        let body = v1::CommandBody {
            kind: kind.into(),
            key: key.as_bytes().to_vec(),
            command: command.into(),
            args_json: args.to_string().into_bytes(),
            command_id: rand::random::<[u8; 16]>().to_vec(),
            issued_at_ms: now,
            expires_at_ms: now + ENVELOPE_WINDOW_MS,
        };
        v1::ExecuteRequest {
            envelope: Some(seal(
                Domain::Command,
                body.encode_to_vec(),
                &self.signer.key_id,
                &self.signer.key,
            )),
        }
    }

    /// A signed query.
    pub fn query_request(
        &self,
        kind: &str,
        key: &str,
        query: &str,
        args: &serde_json::Value,
    ) -> v1::QueryRequest {
        let now = now_ms();
        let body = v1::QueryBody {
            kind: kind.into(),
            key: key.as_bytes().to_vec(),
            query: query.into(),
            args_json: args.to_string().into_bytes(),
            min_receipt: None,
            request_id: rand::random::<[u8; 16]>().to_vec(),
            issued_at_ms: now,
            expires_at_ms: now + ENVELOPE_WINDOW_MS,
        };
        v1::QueryRequest {
            envelope: Some(seal(
                Domain::Query,
                body.encode_to_vec(),
                &self.signer.key_id,
                &self.signer.key,
            )),
        }
    }

    pub async fn execute(
        &self,
        node: usize,
        request: v1::ExecuteRequest,
    ) -> Result<v1::ExecuteResponse, tonic::Status> {
        let mut call = tonic::Request::new(request);
        call.set_timeout(CALL_TIMEOUT);
        Ok(self.client(node).execute(call).await?.into_inner())
    }

    pub async fn query(
        &self,
        node: usize,
        request: v1::QueryRequest,
    ) -> Result<v1::QueryResponse, tonic::Status> {
        let mut call = tonic::Request::new(request);
        call.set_timeout(CALL_TIMEOUT);
        Ok(self.client(node).query(call).await?.into_inner())
    }
}
