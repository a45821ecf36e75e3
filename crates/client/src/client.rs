//! [`Client`]: signed commands, queries and resolves with exactly-once retries and owner-aware routing; admin listings; one pooled mTLS channel per node.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cellfleet_proto::v1;
use cellfleet_proto::v1::admin_client::AdminClient;
use cellfleet_proto::v1::client_client::ClientClient;
use ed25519_dalek::SigningKey;
use prost::Message;
use tonic::transport::Channel;

use crate::config::Config;
use crate::retry::{self, Failure, RetryPolicy, Step, Unreachable};
use crate::signing::{seal, Domain};
use crate::transport::{channel_to, host_port, HostPort};
use crate::{CommandId, Error, Receipt};

/// Owner entries kept by default (one per Cell recently used).
pub const OWNER_CACHE_DEFAULT: usize = 10_000;
/// Largest response accepted by default.
pub const RESPONSE_BYTES_DEFAULT: usize = 64 * 1024 * 1024;
/// How long connecting (TCP and TLS) to a node may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Deadline of a drain (it releases every Cell of the node).
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(120);
/// Channels kept at most (one per node endpoint seen).
const CHANNELS_MAX: usize = 1024;

/// A command to run on one Cell, exactly once per [`CommandId`].
///
/// ```
/// use cellfleet_client::{Command, CommandId};
/// let put = Command::new("kv", "user-1", "put")
///     .args(serde_json::json!({"key": "name", "value": "Ada"}));
/// let again = put.clone(); // the same id: a retry, never a second execution
/// assert_eq!(put.id, again.id);
/// let fresh = Command::new("kv", "user-1", "put").id(CommandId::random());
/// assert_ne!(put.id, fresh.id);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Command {
    /// The Cell's kind.
    pub kind: String,
    /// The Cell's key.
    pub key: Vec<u8>,
    /// The command's name in the kind (or `$sql`).
    pub name: String,
    /// Its arguments: a JSON object.
    pub args: serde_json::Value,
    /// The id that makes it exactly-once (random unless set).
    pub id: CommandId,
}

impl Command {
    /// The command `name` on the Cell `kind`/`key`, no arguments, a fresh id.
    pub fn new(kind: impl Into<String>, key: impl AsRef<[u8]>, name: impl Into<String>) -> Self {
        Command {
            kind: kind.into(),
            key: key.as_ref().to_vec(),
            name: name.into(),
            args: serde_json::Value::Object(Default::default()),
            id: CommandId::random(),
        }
    }

    /// With these arguments (a JSON object).
    pub fn args(mut self, args: serde_json::Value) -> Self {
        self.args = args;
        self
    }

    /// With this id (to retry a command sent before, e.g. by another process).
    pub fn id(mut self, id: CommandId) -> Self {
        self.id = id;
        self
    }
}

/// A named read-only query on one Cell.
///
/// ```
/// use cellfleet_client::Query;
/// let get = Query::new("kv", "user-1", "get").args(serde_json::json!({"key": "name"}));
/// assert!(get.min_receipt.is_none());
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Query {
    /// The Cell's kind.
    pub kind: String,
    /// The Cell's key.
    pub key: Vec<u8>,
    /// The query's name in the kind.
    pub name: String,
    /// Its arguments: a JSON object.
    pub args: serde_json::Value,
    /// Read-your-writes: answer only from a state holding this receipt.
    pub min_receipt: Option<Receipt>,
}

impl Query {
    /// The query `name` on the Cell `kind`/`key`, no arguments.
    pub fn new(kind: impl Into<String>, key: impl AsRef<[u8]>, name: impl Into<String>) -> Self {
        Query {
            kind: kind.into(),
            key: key.as_ref().to_vec(),
            name: name.into(),
            args: serde_json::Value::Object(Default::default()),
            min_receipt: None,
        }
    }

    /// With these arguments (a JSON object).
    pub fn args(mut self, args: serde_json::Value) -> Self {
        self.args = args;
        self
    }

    /// Read-your-writes: only answer from a state at least as new as
    /// `receipt` (from [`Executed::receipt`]).
    pub fn after(mut self, receipt: &Receipt) -> Self {
        self.min_receipt = Some(receipt.clone());
        self
    }
}

/// Why a Cell refused a command: a committed, stored outcome (re-sending
/// the same id returns it again).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// The reason.
    pub code: v1::RejectCode,
    /// The Cell's message.
    pub message: String,
}

/// What a command did.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// It applied; its result.
    Applied(serde_json::Value),
    /// It did not apply, for a reason the Cell recorded.
    Rejected(Rejection),
}

/// A command's definite outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct Executed {
    /// The command's id.
    pub command_id: CommandId,
    /// The end of its validity window (Unix ms).
    pub expires_at_ms: i64,
    /// What it did.
    pub outcome: Outcome,
    /// Where the outcome is durable (absent only for refusals that never
    /// reach the ledger).
    pub receipt: Option<Receipt>,
    /// The outcome was stored by an earlier try (or read back by resolve).
    pub duplicate: bool,
    /// The node that owns the Cell and served it.
    pub served_by: String,
    /// Attempts made.
    pub attempts: u32,
}

impl Executed {
    /// The result, when the command applied.
    pub fn applied(&self) -> Option<&serde_json::Value> {
        match &self.outcome {
            Outcome::Applied(value) => Some(value),
            Outcome::Rejected(_) => None,
        }
    }
}

/// A query's answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Queried {
    /// The result.
    pub value: serde_json::Value,
    /// The published state it read.
    pub receipt: Option<Receipt>,
    /// The node that served it.
    pub served_by: String,
}

/// What became of a command id.
#[derive(Clone, Debug, PartialEq)]
pub struct Resolved {
    /// The id.
    pub command_id: CommandId,
    /// COMMITTED, ABSENT, UNKNOWN, EXPIRED or NEEDS_EXPIRY (see `client.proto`).
    pub state: v1::CommandState,
    /// For COMMITTED: the stored outcome.
    pub outcome: Option<Outcome>,
    /// For COMMITTED: where it is durable.
    pub receipt: Option<Receipt>,
    /// The node that served it.
    pub served_by: String,
}

/// Builds a [`Client`]; [`Client::from_config`] covers the usual case.
///
/// ```
/// use std::time::Duration;
/// use cellfleet_client::{Client, Error, RetryPolicy};
/// use ed25519_dalek::SigningKey;
/// # fn offline_tls() -> std::sync::Arc<rustls::ClientConfig> {
/// #     std::sync::Arc::new(
/// #         rustls::ClientConfig::builder_with_provider(cellfleet_client::tls::provider())
/// #             .with_safe_default_protocol_versions()
/// #             .unwrap()
/// #             .with_root_certificates(rustls::RootCertStore::empty())
/// #             .with_no_client_auth(),
/// #     )
/// # }
/// // Usually: cellfleet_client::tls::client_config_from_files(ca, cert, key)?
/// let tls = offline_tls();
/// let client = Client::builder(["https://n1.cluster:7001", "n2.cluster:7001"])
///     .tls(tls.clone())
///     .signer("app-1", SigningKey::from_bytes(&[7; 32]))
///     .window(Duration::from_secs(30))
///     .retry_policy(RetryPolicy { budget: Duration::from_secs(10), ..Default::default() })
///     .owner_cache_size(50_000)
///     .build()?; // no connection yet
/// assert_eq!(client.endpoints(), ["n1.cluster:7001", "n2.cluster:7001"]);
///
/// // What is missing is named:
/// let unsigned = Client::builder(["127.0.0.1:7001"]).tls(tls).build();
/// assert!(matches!(unsigned, Err(Error::Config(why)) if why.contains("signing key")));
/// # Ok::<(), Error>(())
/// ```
#[derive(Debug)]
pub struct Builder {
    endpoints: Vec<String>,
    tls: Option<Arc<rustls::ClientConfig>>,
    signer: Option<(String, SigningKey)>,
    window: Duration,
    policy: RetryPolicy,
    owner_routing: bool,
    owners_max: usize,
    response_bytes_max: usize,
}

impl Builder {
    /// The nodes' client endpoints (`host:port` or `https://host:port`).
    pub fn new<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> Self {
        Builder {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            tls: None,
            signer: None,
            window: Duration::from_millis(crate::config::DEFAULT_WINDOW_MS),
            policy: RetryPolicy::default(),
            owner_routing: true,
            owners_max: OWNER_CACHE_DEFAULT,
            response_bytes_max: RESPONSE_BYTES_DEFAULT,
        }
    }

    /// The TLS configuration (see [`crate::tls::client_config`]).
    pub fn tls(mut self, config: Arc<rustls::ClientConfig>) -> Self {
        self.tls = Some(config);
        self
    }

    /// The signing key and its id in the registry.
    pub fn signer(mut self, key_id: impl Into<String>, key: SigningKey) -> Self {
        self.signer = Some((key_id.into(), key));
        self
    }

    /// The validity window of signed requests (default 60 s). A command's
    /// retries stop within it.
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// The retry bounds (default [`RetryPolicy::default`]).
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Send a Cell's requests straight to the node that served it last
    /// (default on). Off: always the configured endpoints, in order.
    pub fn owner_routing(mut self, on: bool) -> Self {
        self.owner_routing = on;
        self
    }

    /// How many Cells' owners to remember (default [`OWNER_CACHE_DEFAULT`]).
    pub fn owner_cache_size(mut self, cells: usize) -> Self {
        self.owners_max = cells;
        self
    }

    /// The largest response accepted (default [`RESPONSE_BYTES_DEFAULT`]).
    pub fn max_response_bytes(mut self, bytes: usize) -> Self {
        self.response_bytes_max = bytes;
        self
    }

    /// The client; no connection is made until the first call.
    pub fn build(self) -> Result<Client, Error> {
        let endpoints = self
            .endpoints
            .iter()
            .map(|endpoint| {
                endpoint
                    .parse::<HostPort>()
                    .map(|_| host_port(endpoint).to_owned())
                    .map_err(|reason| Error::Config(format!("endpoint {reason}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if endpoints.is_empty() {
            return Err(Error::Config(
                "no endpoints: list at least one node's client address".into(),
            ));
        }
        let tls = self
            .tls
            .ok_or_else(|| Error::Config("no TLS configuration (Builder::tls)".into()))?;
        let (key_id, key) = self
            .signer
            .ok_or_else(|| Error::Config("no signing key (Builder::signer)".into()))?;
        if self.window.is_zero() || self.policy.attempts == 0 {
            return Err(Error::Config(
                "the window and the attempts must be above 0".into(),
            ));
        }
        let owners = NonZeroUsize::new(self.owners_max.max(1)).expect("at least 1");
        Ok(Client {
            inner: Arc::new(Inner {
                endpoints,
                tls,
                key_id,
                key,
                window: self.window,
                policy: self.policy,
                owner_routing: self.owner_routing,
                response_bytes_max: self.response_bytes_max,
                channels: Mutex::new(HashMap::new()),
                owners: Mutex::new(lru::LruCache::new(owners)),
                cursor: AtomicUsize::new(0),
            }),
        })
    }
}

/// A Cellfleet client. Cheap to clone (clones share channels and the
/// owner cache); use one per application.
///
/// ```no_run
/// # async fn run() -> Result<(), cellfleet_client::Error> {
/// use cellfleet_client::{Client, Command, Config, Query};
/// let client = Client::from_config(&Config::read(".cellfleet-dev/client.toml".as_ref())?)?;
/// let put = client
///     .execute(&Command::new("kv", "user-1", "put")
///         .args(serde_json::json!({"key": "name", "value": "Ada"})))
///     .await?;
/// let receipt = put.receipt.expect("an applied command has a receipt");
/// let got = client
///     .query(&Query::new("kv", "user-1", "get")
///         .args(serde_json::json!({"key": "name"}))
///         .after(&receipt))
///     .await?;
/// println!("{} (served by {})", got.value, got.served_by);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    endpoints: Vec<String>,
    tls: Arc<rustls::ClientConfig>,
    key_id: String,
    key: SigningKey,
    window: Duration,
    policy: RetryPolicy,
    owner_routing: bool,
    response_bytes_max: usize,
    channels: Mutex<HashMap<String, Channel>>,
    owners: Mutex<lru::LruCache<(String, Vec<u8>), String>>,
    cursor: AtomicUsize,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("endpoints", &self.endpoints)
            .field("key_id", &self.key_id)
            .field("policy", &self.policy)
            .field("owner_routing", &self.owner_routing)
            .finish_non_exhaustive()
    }
}

/// Now in Unix milliseconds (the envelopes' clock).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn json_value(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(bytes).into_owned()))
}

fn rejection(r: &v1::Rejection) -> Rejection {
    Rejection {
        code: v1::RejectCode::try_from(r.code).unwrap_or(v1::RejectCode::Unspecified),
        message: r.message.clone(),
    }
}

fn execute_outcome(outcome: &Option<v1::execute_response::Outcome>) -> Result<Outcome, Error> {
    match outcome {
        Some(v1::execute_response::Outcome::ResultJson(json)) => {
            Ok(Outcome::Applied(json_value(json)))
        }
        Some(v1::execute_response::Outcome::Rejected(r)) => Ok(Outcome::Rejected(rejection(r))),
        None => Err(Error::Config(
            "the node answered a command without an outcome".into(),
        )),
    }
}

fn args_bytes(args: &serde_json::Value) -> Result<Vec<u8>, Error> {
    match args {
        serde_json::Value::Object(_) => Ok(args.to_string().into_bytes()),
        other => Err(Error::Config(format!(
            "arguments must be a JSON object, like {{\"key\": \"a\"}}, not {other}"
        ))),
    }
}

impl Client {
    /// A builder for the nodes at `endpoints`.
    pub fn builder<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> Builder {
        Builder::new(endpoints)
    }

    /// A client from a config file's settings (certificates and key read now).
    pub fn from_config(config: &Config) -> Result<Client, Error> {
        Self::builder_from_config(config)?.build()
    }

    /// A builder preset from a config file's settings, to change some.
    pub fn builder_from_config(config: &Config) -> Result<Builder, Error> {
        let tls = crate::tls::client_config_from_files(&config.ca, &config.cert, &config.key)
            .map_err(|e| Error::Config(format!("client certificate: {e}")))?;
        let key = crate::signing::read_signing_key(&config.signing_key).map_err(|e| {
            Error::Config(format!("signing key {}: {e}", config.signing_key.display()))
        })?;
        Ok(Builder::new(config.endpoints.clone())
            .tls(tls)
            .signer(config.key_id.clone(), key)
            .window(Duration::from_millis(config.window_ms)))
    }

    /// The configured endpoints (`host:port`), in order.
    pub fn endpoints(&self) -> &[String] {
        &self.inner.endpoints
    }

    /// The retry bounds in use.
    pub fn retry_policy(&self) -> RetryPolicy {
        self.inner.policy
    }

    /// The owner this client would send the Cell's next request to, if it
    /// learned one.
    pub fn cached_owner(&self, kind: &str, key: &[u8]) -> Option<String> {
        self.owners()
            .peek(&(kind.to_owned(), key.to_vec()))
            .cloned()
    }

    fn owners(&self) -> std::sync::MutexGuard<'_, lru::LruCache<(String, Vec<u8>), String>> {
        self.inner
            .owners
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The (pooled) channel to `endpoint`: one HTTP/2 connection per node,
    /// shared by every call and clone; it reconnects by itself.
    pub fn channel(&self, endpoint: &str) -> Result<Channel, Error> {
        let endpoint = host_port(endpoint);
        let mut channels = self
            .inner
            .channels
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(channel) = channels.get(endpoint) {
            return Ok(channel.clone());
        }
        let target: HostPort = endpoint
            .parse()
            .map_err(|reason| Error::Config(format!("endpoint {reason}")))?;
        let channel = channel_to(&target, self.inner.tls.clone(), CONNECT_TIMEOUT)
            .map_err(|e| Error::Config(format!("endpoint {endpoint}: {e}")))?;
        if channels.len() >= CHANNELS_MAX {
            channels.clear();
        }
        channels.insert(endpoint.to_owned(), channel.clone());
        Ok(channel)
    }

    /// A validity window starting now: (issued, expires) in Unix ms.
    pub fn window_from_now(&self) -> (i64, i64) {
        let now = now_ms();
        let window = i64::try_from(self.inner.window.as_millis()).unwrap_or(i64::MAX);
        (now, now.saturating_add(window))
    }

    /// Signs `command` with this client's key, valid from `issued_at_ms`
    /// to `expires_at_ms` (the low-level form; [`Client::execute`] does it).
    ///
    /// ```
    /// use cellfleet_client::{Client, Command};
    /// # fn offline_tls() -> std::sync::Arc<rustls::ClientConfig> {
    /// #     std::sync::Arc::new(
    /// #         rustls::ClientConfig::builder_with_provider(cellfleet_client::tls::provider())
    /// #             .with_safe_default_protocol_versions()
    /// #             .unwrap()
    /// #             .with_root_certificates(rustls::RootCertStore::empty())
    /// #             .with_no_client_auth(),
    /// #     )
    /// # }
    /// # let client = Client::builder(["127.0.0.1:7001"]).tls(offline_tls())
    /// #     .signer("app-1", ed25519_dalek::SigningKey::from_bytes(&[7; 32])).build()?;
    /// let put = Command::new("kv", "user-1", "put").args(serde_json::json!({"key": "a", "value": 1}));
    /// let (issued, expires) = client.window_from_now();
    /// let request = client.seal_command(&put, issued, expires)?;
    /// // Keep `request` (or `put`) to retry later: the same bytes, the same id.
    /// let envelope = request.envelope.as_ref().unwrap();
    /// assert_eq!(envelope.key_id, "app-1");
    /// assert_eq!(envelope.signature.len(), 64);
    /// # Ok::<(), cellfleet_client::Error>(())
    /// ```
    pub fn seal_command(
        &self,
        command: &Command,
        issued_at_ms: i64,
        expires_at_ms: i64,
    ) -> Result<v1::ExecuteRequest, Error> {
        let body = v1::CommandBody {
            kind: command.kind.clone(),
            key: command.key.clone(),
            command: command.name.clone(),
            args_json: args_bytes(&command.args)?,
            command_id: command.id.as_bytes().to_vec(),
            issued_at_ms,
            expires_at_ms,
        };
        Ok(v1::ExecuteRequest {
            envelope: Some(self.seal(Domain::Command, &body)),
        })
    }

    /// Signs `query` (valid for the client's window from now).
    pub fn seal_query(&self, query: &Query) -> Result<v1::QueryRequest, Error> {
        let (issued_at_ms, expires_at_ms) = self.window_from_now();
        let body = v1::QueryBody {
            kind: query.kind.clone(),
            key: query.key.clone(),
            query: query.name.clone(),
            args_json: args_bytes(&query.args)?,
            min_receipt: query.min_receipt.clone(),
            request_id: CommandId::random().as_bytes().to_vec(),
            issued_at_ms,
            expires_at_ms,
        };
        Ok(v1::QueryRequest {
            envelope: Some(self.seal(Domain::Query, &body)),
        })
    }

    /// Signs a resolve of command `id` on `kind`/`key`; `command_expires_at_ms`
    /// is the command's own expiry (0: unknown, see [`v1::CommandState`]).
    pub fn seal_resolve(
        &self,
        kind: &str,
        key: &[u8],
        id: CommandId,
        command_expires_at_ms: i64,
    ) -> v1::ResolveRequest {
        let (issued_at_ms, expires_at_ms) = self.window_from_now();
        let body = v1::ResolveBody {
            kind: kind.to_owned(),
            key: key.to_vec(),
            command_id: id.as_bytes().to_vec(),
            issued_at_ms,
            expires_at_ms,
            command_expires_at_ms,
        };
        v1::ResolveRequest {
            envelope: Some(self.seal(Domain::Resolve, &body)),
        }
    }

    /// Signs `body` under `domain` with this client's key.
    pub fn seal(&self, domain: Domain, body: &impl Message) -> v1::SignedEnvelope {
        seal(
            domain,
            body.encode_to_vec(),
            &self.inner.key_id,
            &self.inner.key,
        )
    }

    fn client(&self, endpoint: &str) -> Result<ClientClient<Channel>, Error> {
        Ok(ClientClient::new(self.channel(endpoint)?)
            .max_decoding_message_size(self.inner.response_bytes_max))
    }

    /// The stub for `endpoint` and `request` with its deadline.
    #[allow(clippy::result_large_err)]
    fn prepare<R>(
        &self,
        endpoint: &str,
        request: R,
        timeout: Duration,
    ) -> Result<(ClientClient<Channel>, tonic::Request<R>), tonic::Status> {
        let mut call = tonic::Request::new(request);
        call.set_timeout(timeout);
        let client = self
            .client(endpoint)
            .map_err(|e| tonic::Status::invalid_argument(e.to_string()))?;
        Ok((client, call))
    }

    /// One `Execute` call to `endpoint`: no retry, no routing (the
    /// low-level form, for tools that must pick the node).
    ///
    /// ```no_run
    /// # async fn run(client: cellfleet_client::Client) -> Result<(), cellfleet_client::Error> {
    /// use std::time::Duration;
    /// use cellfleet_client::{Command, Error};
    /// let put = Command::new("kv", "user-1", "put").args(serde_json::json!({"key": "a", "value": 1}));
    /// let (issued, expires) = client.window_from_now();
    /// let request = client.seal_command(&put, issued, expires)?;
    /// // Exactly this node, one attempt, no retry: the caller decides what next.
    /// match client.execute_on("127.0.0.1:7002", request, Duration::from_secs(5)).await {
    ///     Ok(response) => println!("served by {}", response.served_by),
    ///     Err(status) => println!("{}", Error::from_status(&status)),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn execute_on(
        &self,
        endpoint: &str,
        request: v1::ExecuteRequest,
        timeout: Duration,
    ) -> Result<v1::ExecuteResponse, tonic::Status> {
        let (mut client, call) = self.prepare(endpoint, request, timeout)?;
        Ok(client.execute(call).await?.into_inner())
    }

    /// One `Query` call to `endpoint` (no retry, no routing).
    ///
    /// ```no_run
    /// # async fn run(client: cellfleet_client::Client) -> Result<(), cellfleet_client::Error> {
    /// use std::time::Duration;
    /// use cellfleet_client::Query;
    /// let request = client.seal_query(&Query::new("kv", "user-1", "get").args(serde_json::json!({"key": "a"})))?;
    /// let response = client
    ///     .query_on("127.0.0.1:7001", request, Duration::from_secs(5))
    ///     .await
    ///     .map_err(|status| cellfleet_client::Error::from_status(&status))?;
    /// println!("{}", String::from_utf8_lossy(&response.result_json));
    /// # Ok(()) }
    /// ```
    pub async fn query_on(
        &self,
        endpoint: &str,
        request: v1::QueryRequest,
        timeout: Duration,
    ) -> Result<v1::QueryResponse, tonic::Status> {
        let (mut client, call) = self.prepare(endpoint, request, timeout)?;
        Ok(client.query(call).await?.into_inner())
    }

    /// One `Resolve` call to `endpoint` (no retry, no routing).
    pub async fn resolve_on(
        &self,
        endpoint: &str,
        request: v1::ResolveRequest,
        timeout: Duration,
    ) -> Result<v1::ResolveResponse, tonic::Status> {
        let (mut client, call) = self.prepare(endpoint, request, timeout)?;
        Ok(client.resolve(call).await?.into_inner())
    }

    /// Where attempt `attempt` (1-based) for a Cell goes: a node's hint
    /// first, then the Cell's learned owner on the first attempt, then the
    /// configured endpoints in turn from this call's starting point.
    fn target(
        &self,
        cell: &(String, Vec<u8>),
        hint: Option<String>,
        start: usize,
        attempt: u32,
    ) -> String {
        if let Some(hint) = hint {
            return hint;
        }
        if attempt == 1 && self.inner.owner_routing {
            if let Some(owner) = self.owners().get(cell) {
                return owner.clone();
            }
        }
        let endpoints = &self.inner.endpoints;
        endpoints[(start + attempt as usize - 1) % endpoints.len()].clone()
    }

    /// The rule's view of a failure, with one addition: once every
    /// configured node was unreachable since a node last answered (nothing
    /// listens: the cluster is down or the config is wrong), retrying is
    /// pointless and the call ends instead of spending its whole budget.
    fn failure(&self, target: &str, error: &Error, unreachable: &mut Unreachable) -> Failure {
        let mut failure = Failure::of(error);
        if unreachable.all_after(&self.inner.endpoints, target, error.unreachable()) {
            failure.retry_safe = false;
        }
        failure
    }

    fn start(&self) -> usize {
        self.inner.cursor.fetch_add(1, Ordering::Relaxed)
    }

    /// Remembers that `endpoint` served the Cell.
    fn learn(&self, cell: &(String, Vec<u8>), endpoint: &str) {
        if !self.inner.owner_routing || endpoint.is_empty() {
            return;
        }
        let endpoint = host_port(endpoint);
        let mut owners = self.owners();
        // The usual answer: the owner already known (no parse, no copy).
        if owners.peek(cell).is_some_and(|known| known == endpoint) {
            return;
        }
        if endpoint.parse::<HostPort>().is_ok() {
            owners.put(cell.clone(), endpoint.to_owned());
        }
    }

    /// After a failure at `target`: forget it as the Cell's owner, and
    /// return where the node says the Cell lives, if it said.
    fn after_failure(
        &self,
        cell: &(String, Vec<u8>),
        target: &str,
        error: &Error,
    ) -> Option<String> {
        if self.inner.owner_routing {
            let mut owners = self.owners();
            if owners.peek(cell).is_some_and(|owner| owner == target) {
                owners.pop(cell);
            }
        }
        error
            .owner_hint()
            .and_then(|hint| hint.endpoint.as_deref())
            .filter(|endpoint| endpoint.parse::<HostPort>().is_ok())
            .map(|endpoint| host_port(endpoint).to_owned())
    }

    fn attempt_timeout(&self, started: Instant, until_ms: i64) -> Duration {
        let policy = &self.inner.policy;
        let left = policy.budget.saturating_sub(started.elapsed());
        let until =
            Duration::from_millis(u64::try_from(until_ms.saturating_sub(now_ms())).unwrap_or(0));
        policy
            .attempt_timeout
            .min(left.max(Duration::from_millis(100)))
            .min(until.max(Duration::from_millis(100)))
    }

    /// Runs `command` exactly once and returns its definite outcome.
    ///
    /// Failures that are safe to retry (the owner moved, a node is
    /// draining, an outcome in doubt, a broken connection) are retried with
    /// the same signed request, so the same command id, within the
    /// [`RetryPolicy`]; the Cell's ledger answers a second delivery with the
    /// stored outcome. If the budget runs out while an attempt may have
    /// applied, the command is resolved; when even that cannot prove its
    /// fate the error is [`Error::UnknownOutcome`], never a definite failure.
    /// A rejection by the Cell (unknown command, bad arguments, a failing
    /// statement) is an outcome, [`Outcome::Rejected`], not an error.
    pub async fn execute(&self, command: &Command) -> Result<Executed, Error> {
        let (issued, expires) = self.window_from_now();
        let request = self.seal_command(command, issued, expires)?;
        self.execute_sealed(command, request, expires).await
    }

    /// [`Client::execute`] for a request already signed by
    /// [`Client::seal_command`] (with `expires_at_ms` its expiry): retries
    /// send exactly these bytes.
    ///
    /// ```no_run
    /// # async fn run(client: cellfleet_client::Client) -> Result<(), cellfleet_client::Error> {
    /// use cellfleet_client::Command;
    /// let put = Command::new("kv", "user-1", "put").args(serde_json::json!({"key": "a", "value": 1}));
    /// let (issued, expires) = client.window_from_now();
    /// let request = client.seal_command(&put, issued, expires)?;
    /// // e.g. stored in an outbox before sending, re-sent after a restart:
    /// let executed = client.execute_sealed(&put, request, expires).await?;
    /// println!("{:?} after {} attempt(s)", executed.outcome, executed.attempts);
    /// # Ok(()) }
    /// ```
    pub async fn execute_sealed(
        &self,
        command: &Command,
        request: v1::ExecuteRequest,
        expires_at_ms: i64,
    ) -> Result<Executed, Error> {
        let cell = (command.kind.clone(), command.key.clone());
        let policy = self.inner.policy;
        let started = Instant::now();
        let start = self.start();
        let mut hint = None;
        let mut in_doubt = false;
        let mut unreachable = Unreachable::default();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let target = self.target(&cell, hint.take(), start, attempt);
            let timeout = self.attempt_timeout(started, expires_at_ms);
            let error = match self.execute_on(&target, request.clone(), timeout).await {
                Ok(response) => {
                    self.learn(&cell, &response.served_by_endpoint);
                    return Ok(Executed {
                        command_id: command.id,
                        expires_at_ms,
                        outcome: execute_outcome(&response.outcome)?,
                        receipt: response.receipt,
                        duplicate: response.duplicate,
                        served_by: response.served_by,
                        attempts: attempt,
                    });
                }
                Err(status) => Error::from_status(&status),
            };
            hint = self.after_failure(&cell, &target, &error);
            tracing::debug!(%target, attempt, error = %error, "command attempt failed");
            let failure = self.failure(&target, &error, &mut unreachable);
            let step = retry::after_command_failure(
                &policy,
                attempt,
                started.elapsed(),
                in_doubt,
                failure,
            );
            in_doubt |= failure.maybe_applied;
            match step {
                Step::Retry { after } => tokio::time::sleep(after).await,
                Step::Fail => return Err(error),
                Step::Resolve => return self.settle(command, expires_at_ms, attempt, error).await,
            }
        }
    }

    /// The fate of a command in doubt, by resolve: its stored outcome if it
    /// committed, else [`Error::UnknownOutcome`].
    async fn settle(
        &self,
        command: &Command,
        expires_at_ms: i64,
        attempts: u32,
        last: Error,
    ) -> Result<Executed, Error> {
        let resolved = self
            .resolve(&command.kind, &command.key, command.id, expires_at_ms)
            .await;
        match resolved {
            Ok(Resolved {
                state: v1::CommandState::Committed,
                outcome: Some(outcome),
                receipt,
                served_by,
                ..
            }) => Ok(Executed {
                command_id: command.id,
                expires_at_ms,
                outcome,
                receipt,
                duplicate: true,
                served_by,
                attempts,
            }),
            other => Err(Error::UnknownOutcome {
                command_id: command.id,
                expires_at_ms,
                attempts,
                resolved: other.ok().map(|r| r.state),
                last: Box::new(last),
            }),
        }
    }

    /// Runs a read-only query on the Cell's owner, retrying retry-safe
    /// failures within the [`RetryPolicy`].
    pub async fn query(&self, query: &Query) -> Result<Queried, Error> {
        let request = self.seal_query(query)?;
        let cell = (query.kind.clone(), query.key.clone());
        let response = self
            .read(&cell, |client, target, timeout| {
                let request = request.clone();
                async move { client.query_on(&target, request, timeout).await }
            })
            .await?;
        self.learn(&cell, &response.served_by_endpoint);
        Ok(Queried {
            value: json_value(&response.result_json),
            receipt: response.receipt,
            served_by: response.served_by,
        })
    }

    /// What became of command `id` on `kind`/`key`. Give the command's
    /// `expires_at_ms` ([`Executed::expires_at_ms`], or
    /// [`Error::UnknownOutcome`]'s) for a definite answer about a command
    /// the ledger does not hold; 0 means unknown.
    ///
    /// ```no_run
    /// # async fn run(client: cellfleet_client::Client) -> Result<(), cellfleet_client::Error> {
    /// use cellfleet_client::{CommandId, Outcome};
    /// use cellfleet_client::v1::CommandState;
    /// // An id and expiry kept from an earlier Error::UnknownOutcome:
    /// let id: CommandId = "000102030405060708090a0b0c0d0e0f".parse().unwrap();
    /// let resolved = client.resolve("kv", b"user-1", id, 1_767_225_600_000).await?;
    /// match (resolved.state, resolved.outcome) {
    ///     (CommandState::Committed, Some(Outcome::Applied(result))) => println!("it ran: {result}"),
    ///     (CommandState::Absent | CommandState::Expired, _) => println!("it never ran and never will"),
    ///     (state, _) => println!("not settled yet: {state:?}"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn resolve(
        &self,
        kind: &str,
        key: &[u8],
        id: CommandId,
        command_expires_at_ms: i64,
    ) -> Result<Resolved, Error> {
        let request = self.seal_resolve(kind, key, id, command_expires_at_ms);
        let cell = (kind.to_owned(), key.to_vec());
        let response = self
            .read(&cell, |client, target, timeout| {
                let request = request.clone();
                async move { client.resolve_on(&target, request, timeout).await }
            })
            .await?;
        self.learn(&cell, &response.served_by_endpoint);
        let state =
            v1::CommandState::try_from(response.state).unwrap_or(v1::CommandState::Unspecified);
        let outcome = match &response.outcome {
            Some(v1::resolve_response::Outcome::ResultJson(json)) => {
                Some(Outcome::Applied(json_value(json)))
            }
            Some(v1::resolve_response::Outcome::Rejected(r)) => {
                Some(Outcome::Rejected(rejection(r)))
            }
            None => None,
        };
        Ok(Resolved {
            command_id: id,
            state,
            outcome,
            receipt: response.receipt,
            served_by: response.served_by,
        })
    }

    /// A read-only call with the read rule and the Cell's routing.
    async fn read<T, F, Fut>(&self, cell: &(String, Vec<u8>), mut call: F) -> Result<T, Error>
    where
        F: FnMut(Client, String, Duration) -> Fut,
        Fut: std::future::Future<Output = Result<T, tonic::Status>>,
    {
        let policy = self.inner.policy;
        let started = Instant::now();
        let start = self.start();
        let mut hint = None;
        let mut unreachable = Unreachable::default();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let target = self.target(cell, hint.take(), start, attempt);
            let timeout = self.attempt_timeout(started, i64::MAX);
            let error = match call(self.clone(), target.clone(), timeout).await {
                Ok(value) => return Ok(value),
                Err(status) => Error::from_status(&status),
            };
            hint = self.after_failure(cell, &target, &error);
            match retry::after_read_failure(
                &policy,
                attempt,
                started.elapsed(),
                self.failure(&target, &error, &mut unreachable),
            ) {
                Step::Retry { after } => tokio::time::sleep(after).await,
                Step::Fail | Step::Resolve => return Err(error),
            }
        }
    }

    /// An admin call on any node (the configured endpoints in turn),
    /// retrying retry-safe failures.
    async fn admin<T, F, Fut>(&self, mut call: F) -> Result<T, Error>
    where
        F: FnMut(AdminClient<Channel>, Duration) -> Fut,
        Fut: std::future::Future<Output = Result<T, tonic::Status>>,
    {
        let policy = self.inner.policy;
        let started = Instant::now();
        let start = self.start();
        let mut unreachable = Unreachable::default();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let endpoints = &self.inner.endpoints;
            let target = &endpoints[(start + attempt as usize - 1) % endpoints.len()];
            let timeout = self.attempt_timeout(started, i64::MAX);
            let admin = AdminClient::new(self.channel(target)?)
                .max_decoding_message_size(self.inner.response_bytes_max);
            let error = match call(admin, timeout).await {
                Ok(value) => return Ok(value),
                Err(status) => Error::from_status(&status),
            };
            match retry::after_read_failure(
                &policy,
                attempt,
                started.elapsed(),
                self.failure(target, &error, &mut unreachable),
            ) {
                Step::Retry { after } => tokio::time::sleep(after).await,
                Step::Fail | Step::Resolve => return Err(error),
            }
        }
    }

    /// Every node's lease: id, session, endpoints, liveness, owned Cells.
    ///
    /// ```no_run
    /// # async fn run(client: cellfleet_client::Client) -> Result<(), cellfleet_client::Error> {
    /// for lease in client.leases().await? {
    ///     println!("{} live={} endpoint={}", lease.node_id, lease.live, lease.endpoint);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn leases(&self) -> Result<Vec<v1::NodeLease>, Error> {
        self.admin(|mut admin, timeout| async move {
            let mut request = tonic::Request::new(v1::ListLeasesRequest::default());
            request.set_timeout(timeout);
            Ok(admin.list_leases(request).await?.into_inner().leases)
        })
        .await
    }

    /// Every live node's counters, gauges and commit latency (see
    /// `admin.proto`): rates come from two calls.
    ///
    /// ```no_run
    /// # async fn run(client: cellfleet_client::Client) -> Result<(), cellfleet_client::Error> {
    /// let stats = client.node_stats().await?;
    /// for node in &stats.nodes {
    ///     println!("{} commands={} queries={}", node.node_id, node.commands_total, node.queries_total);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn node_stats(&self) -> Result<v1::NodeStatsResponse, Error> {
        self.admin(|mut admin, timeout| async move {
            let mut request = tonic::Request::new(v1::NodeStatsRequest {});
            request.set_timeout(timeout);
            Ok(admin.node_stats(request).await?.into_inner())
        })
        .await
    }

    /// One page of the cluster's Cells (see `admin.proto`).
    ///
    /// ```no_run
    /// # async fn run(client: cellfleet_client::Client) -> Result<(), cellfleet_client::Error> {
    /// let page = client
    ///     .cells(cellfleet_client::v1::ListCellsRequest { owner_node_id: "n1".into(), limit: 100, ..Default::default() })
    ///     .await?;
    /// for cell in &page.cells {
    ///     println!("{cell:?}");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn cells(
        &self,
        request: v1::ListCellsRequest,
    ) -> Result<v1::ListCellsResponse, Error> {
        self.admin(|mut admin, timeout| {
            let mut call = tonic::Request::new(request.clone());
            call.set_timeout(timeout);
            async move { Ok(admin.list_cells(call).await?.into_inner()) }
        })
        .await
    }

    /// A Cell's authority root: owner, epoch, TXID, checksum, LTX chain and
    /// log pointer. [`crate::Transport::NotFound`] when the cluster has no
    /// such Cell.
    ///
    /// ```no_run
    /// # async fn run(client: cellfleet_client::Client) -> Result<(), cellfleet_client::Error> {
    /// use cellfleet_client::{Error, Transport};
    /// match client.describe_cell("kv", b"user-1").await {
    ///     Ok(cell) => println!("{cell:?}"),
    ///     Err(Error::Transport { category: Transport::NotFound, .. }) => println!("no such Cell"),
    ///     Err(other) => return Err(other),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn describe_cell(
        &self,
        kind: &str,
        key: &[u8],
    ) -> Result<v1::DescribeCellResponse, Error> {
        let request = v1::DescribeCellRequest {
            cell: Some(v1::describe_cell_request::Cell::Address(v1::CellAddress {
                kind: kind.to_owned(),
                key: key.to_vec(),
            })),
        };
        self.admin(|mut admin, timeout| {
            let mut call = tonic::Request::new(request.clone());
            call.set_timeout(timeout);
            async move { Ok(admin.describe_cell(call).await?.into_inner()) }
        })
        .await
    }

    /// Drains node `node_id`: it releases its Cells and retires its lease.
    /// Sent to that node's own endpoint (from its lease); needs a key with
    /// `admin = true`. [`Error::Config`] when no lease has that id.
    ///
    /// ```no_run
    /// # async fn run(client: cellfleet_client::Client) -> Result<(), cellfleet_client::Error> {
    /// let drained = client.drain("n2").await?; // the key needs admin = true
    /// println!("{drained:?}");
    /// # Ok(()) }
    /// ```
    pub async fn drain(&self, node_id: &str) -> Result<v1::DrainResponse, Error> {
        let leases = self.leases().await?;
        let lease = leases
            .iter()
            .find(|lease| lease.node_id == node_id)
            .ok_or_else(|| {
                Error::Config(format!(
                    "no node {node_id:?} in the leases; `cellfleet leases` lists them"
                ))
            })?;
        let (issued_at_ms, expires_at_ms) = self.window_from_now();
        let body = v1::AdminBody {
            operation: "drain".into(),
            node_id: node_id.to_owned(),
            issued_at_ms,
            expires_at_ms,
        };
        let mut request = tonic::Request::new(v1::DrainRequest {
            envelope: Some(self.seal(Domain::Admin, &body)),
        });
        request.set_timeout(DRAIN_TIMEOUT);
        AdminClient::new(self.channel(&lease.endpoint)?)
            .drain(request)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| Error::from_status(&status))
    }
}
