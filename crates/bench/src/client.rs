//! The benchmark's gRPC client: the client library (`cellfleet-client`) with one pooled mTLS channel per node, shared by every worker; the workloads pick the ingress node themselves, except `routed_query`, which lets the library route.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use cellfleet_client::{Client, Command, Error, Query};
use cellfleet_proto::v1;
use ed25519_dalek::SigningKey;

/// Per-call timeout.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Validity window of the signed envelopes.
const ENVELOPE_WINDOW: Duration = Duration::from_secs(120);
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
    library: Client,
    endpoints: Arc<Vec<String>>,
}

/// A status in a few words: the Cellfleet error code if any, else the transport's.
pub fn describe(status: &tonic::Status) -> String {
    Error::from_status(status).to_string()
}

/// Whether the same request may be sent again (same envelope, same id).
pub fn retry_safe(status: &tonic::Status) -> bool {
    Error::from_status(status).retry_safe()
}

impl BenchClient {
    /// Lazily connecting channels to `addrs` (node `i` is `addrs[i]`).
    pub fn new(
        tls: Arc<rustls::ClientConfig>,
        addrs: &[SocketAddr],
        signer: Signer,
    ) -> anyhow::Result<Self> {
        let endpoints: Vec<String> = addrs.iter().map(SocketAddr::to_string).collect();
        let library = Client::builder(endpoints.clone())
            .tls(tls)
            .signer(signer.key_id.clone(), (*signer.key).clone())
            .window(ENVELOPE_WINDOW)
            .max_response_bytes(RESPONSE_BYTES_MAX)
            .build()?;
        Ok(BenchClient {
            library,
            endpoints: Arc::new(endpoints),
        })
    }

    /// The library client (owner-aware routing, retries) over the same channels.
    pub fn library(&self) -> &Client {
        &self.library
    }

    fn endpoint(&self, node: usize) -> &str {
        &self.endpoints[node % self.endpoints.len()]
    }

    /// A signed `command` on the Cell `kind`/`key` with a fresh id.
    pub fn command(
        &self,
        kind: &str,
        key: &str,
        command: &str,
        args: &serde_json::Value,
    ) -> v1::ExecuteRequest {
        let (issued, expires) = self.library.window_from_now();
        let command = Command::new(kind, key, command).args(args.clone());
        self.library
            .seal_command(&command, issued, expires)
            .expect("the bench's arguments are JSON objects")
    }

    /// A signed query.
    pub fn query_request(
        &self,
        kind: &str,
        key: &str,
        query: &str,
        args: &serde_json::Value,
    ) -> v1::QueryRequest {
        self.library
            .seal_query(&Query::new(kind, key, query).args(args.clone()))
            .expect("the bench's arguments are JSON objects")
    }

    pub async fn execute(
        &self,
        node: usize,
        request: v1::ExecuteRequest,
    ) -> Result<v1::ExecuteResponse, tonic::Status> {
        self.library
            .execute_on(self.endpoint(node), request, CALL_TIMEOUT)
            .await
    }

    pub async fn query(
        &self,
        node: usize,
        request: v1::QueryRequest,
    ) -> Result<v1::QueryResponse, tonic::Status> {
        self.library
            .query_on(self.endpoint(node), request, CALL_TIMEOUT)
            .await
    }
}
