//! A fault proxy in front of the S3 server (SeaweedFS): real node processes
//! talk to it as their store endpoint, and a test switches what it does to
//! every request: pass it on, delay it, answer 500 or 503 without passing
//! it on, pass a write on and then drop the connection before the reply
//! (the write applied, the node never hears), or refuse to answer at all
//! (the store is down). It can also catch one step of a Cell's life by the
//! root write that makes it (an activation, a checkpoint, a compaction, a
//! release), hold that write lost or landed while the test kills its
//! sender, then close the connection unanswered ([`FaultProxy::catch`]).
//! [`forward`] is also what `log_fence.rs`'s own holding proxy passes
//! requests on with.

// Each test binary uses part of it.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, Notify};

/// What the proxy does to each request from now on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Fault {
    /// Pass every request on.
    #[default]
    None,
    /// Pass every request on after this delay.
    Slow(Duration),
    /// Answer every request with this status (an S3 error body), without
    /// passing it on.
    Status(u16),
    /// Pass writes (PUT, POST, DELETE) on, then close the connection
    /// without the reply; reads pass.
    DropWriteReplies,
    /// Close every connection without an answer.
    Down,
}

/// A step of a Cell's life, told from the root write that makes it and
/// the last root of that Cell the proxy passed with success.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RootStep {
    /// A new owner session: the root created, adopted or taken over.
    Activation,
    /// The same session, the chain longer: records checkpointed.
    Checkpoint,
    /// The same session, the chain shorter: the chain compacted.
    Compaction,
    /// The root released (a drain, or a Cell passivated for good).
    Release,
    /// Anything else (a pointer moved, say).
    Other,
}

/// What the proxy does with a caught root write while its sender is
/// killed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Never passed on: the store never sees it.
    Lost,
    /// Passed on and applied by the store; its sender never hears so.
    Landed,
}

/// A caught root write.
#[derive(Clone, Debug)]
pub struct Caught {
    pub step: RootStep,
    /// The root's object key (path).
    pub path: String,
    /// The owner the write names (none for a release).
    pub owner: Option<String>,
    /// The store's status for a landed write.
    pub status: Option<u16>,
}

/// What a root write says, as far as [`step`] needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub session: Option<String>,
    pub owner: Option<String>,
    pub chain: usize,
    pub released: bool,
}

impl Seen {
    pub fn parse(body: &[u8]) -> Option<Seen> {
        let root: serde_json::Value = serde_json::from_slice(body).ok()?;
        Some(Seen {
            session: root["owner_session"].as_str().map(str::to_owned),
            owner: root["owner"].as_str().map(str::to_owned),
            chain: root["chain"].as_array()?.len(),
            released: root["state"] == "released",
        })
    }
}

/// Which step `next` makes after `previous` (none: the root is new).
pub fn step(previous: Option<&Seen>, next: &Seen) -> RootStep {
    match previous {
        _ if next.released => RootStep::Release,
        None => RootStep::Activation,
        Some(previous) if previous.session != next.session => RootStep::Activation,
        Some(previous) if next.chain < previous.chain => RootStep::Compaction,
        Some(previous) if next.chain > previous.chain => RootStep::Checkpoint,
        Some(_) => RootStep::Other,
    }
}

/// A catch armed by [`FaultProxy::catch`].
struct Trap {
    step: RootStep,
    fate: Fate,
    /// Only the roots of these Cells (ids).
    cells: Vec<String>,
    caught: oneshot::Sender<Caught>,
}

#[derive(Default)]
struct Shared {
    fault: Mutex<Fault>,
    /// The last root each key was written with, by a write the store took.
    roots: Mutex<HashMap<String, Seen>>,
    trap: Mutex<Option<Trap>>,
    let_go: Notify,
}

/// The test S3 server's address (its bucket created): what a proxy
/// forwards to.
pub async fn s3_upstream() -> SocketAddr {
    let config = cellfleet_store::testkit::s3_config(cellfleet_store::testkit::TEST_BUCKET);
    cellfleet_store::testkit::s3_store().await; // the bucket exists
    config
        .endpoint
        .expect("the test server's endpoint")
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .expect("the test server listens on an IP address")
}

/// The proxy: its address and the switch.
pub struct FaultProxy {
    pub address: SocketAddr,
    shared: Arc<Shared>,
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> FaultProxy {
        Self::start_on("127.0.0.1:0".parse().unwrap(), upstream).await
    }

    /// Listens on `bind` and forwards to `upstream`.
    pub async fn start_on(bind: SocketAddr, upstream: SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind(bind).await.expect("bind proxy");
        let address = listener.local_addr().unwrap();
        let shared = Arc::new(Shared::default());
        let switch = shared.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let shared = switch.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let shared = shared.clone();
                        async move { handle(&shared, upstream, request).await }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        FaultProxy { address, shared }
    }

    /// The endpoint URL nodes use.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    pub fn set(&self, fault: Fault) {
        *self.shared.fault.lock().unwrap() = fault;
    }

    /// Arms a catch of the next root write of one of `cells` (Cell ids)
    /// that makes `step`: it is held with `fate` (the receiver hears of
    /// it) until [`FaultProxy::let_go`].
    pub fn catch(
        &self,
        step: RootStep,
        fate: Fate,
        cells: Vec<String>,
    ) -> oneshot::Receiver<Caught> {
        let (caught, receiver) = oneshot::channel();
        *self.shared.trap.lock().unwrap() = Some(Trap {
            step,
            fate,
            cells,
            caught,
        });
        receiver
    }

    /// Ends the caught write's request without an answer (the connection
    /// closes).
    pub fn let_go(&self) {
        self.shared.let_go.notify_one();
    }
}

type Reply = Result<Response<Full<Bytes>>, std::io::Error>;

/// [`forward`], a failure to reach the server closing the connection.
async fn passed<B>(upstream: SocketAddr, request: Request<B>) -> Reply
where
    B: hyper::body::Body,
    B::Error: std::fmt::Display,
{
    forward(upstream, request)
        .await
        .map_err(std::io::Error::other)
}

async fn handle(shared: &Shared, upstream: SocketAddr, request: Request<Incoming>) -> Reply {
    let fault = *shared.fault.lock().unwrap();
    let path = request.uri().path().to_owned();
    if request.method() != hyper::Method::PUT || !path.ends_with("/root.json") {
        return by_fault(fault, upstream, request).await;
    }
    // A root write: told apart, maybe caught, remembered once taken.
    let (parts, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map_err(std::io::Error::other)?
        .to_bytes();
    let request = Request::from_parts(parts, Full::new(body.clone()));
    let Some(next) = Seen::parse(&body) else {
        return by_fault(fault, upstream, request).await;
    };
    let made = step(shared.roots.lock().unwrap().get(&path), &next);
    let trap = {
        let mut trap = shared.trap.lock().unwrap();
        match trap.take() {
            Some(armed)
                if armed.step == made
                    && armed
                        .cells
                        .iter()
                        .any(|cell| path.ends_with(&format!("/cells/{cell}/root.json"))) =>
            {
                Some(armed)
            }
            other => {
                *trap = other;
                None
            }
        }
    };
    if let Some(trap) = trap {
        let status = match trap.fate {
            Fate::Lost => None,
            Fate::Landed => Some(
                forward(upstream, request)
                    .await
                    .map_or(0, |reply| reply.status().as_u16()),
            ),
        };
        let _ = trap.caught.send(Caught {
            step: made,
            path,
            owner: next.owner.clone(),
            status,
        });
        shared.let_go.notified().await;
        return Err(std::io::Error::other("caught by the fault proxy"));
    }
    let reply = by_fault(fault, upstream, request).await;
    if reply.as_ref().is_ok_and(|r| r.status().is_success()) {
        shared.roots.lock().unwrap().insert(path, next);
    }
    reply
}

async fn by_fault<B>(fault: Fault, upstream: SocketAddr, request: Request<B>) -> Reply
where
    B: hyper::body::Body,
    B::Error: std::fmt::Display,
{
    let write = !matches!(*request.method(), hyper::Method::GET | hyper::Method::HEAD);
    match fault {
        Fault::None => passed(upstream, request).await,
        Fault::Slow(delay) => {
            tokio::time::sleep(delay).await;
            passed(upstream, request).await
        }
        Fault::Status(code) => {
            let status = StatusCode::from_u16(code).unwrap();
            let body = format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{}</Code>\
                 <Message>injected by the fault proxy</Message></Error>",
                if code == 503 {
                    "SlowDown"
                } else {
                    "InternalError"
                }
            );
            Ok(Response::builder()
                .status(status)
                .header("content-type", "application/xml")
                .body(Full::new(Bytes::from(body)))
                .unwrap())
        }
        Fault::DropWriteReplies if write => {
            let _ = forward(upstream, request).await;
            Err(std::io::Error::other("reply dropped by the fault proxy"))
        }
        Fault::DropWriteReplies => passed(upstream, request).await,
        Fault::Down => Err(std::io::Error::other("the store is down (fault proxy)")),
    }
}

/// One request to `upstream` on a connection of its own, its body whole
/// (so no transfer coding and no 100-continue are passed on); the reply
/// whole. The Host header is kept, so S3 signatures still verify.
pub async fn forward<B>(
    upstream: SocketAddr,
    request: Request<B>,
) -> Result<Response<Full<Bytes>>, String>
where
    B: hyper::body::Body,
    B::Error: std::fmt::Display,
{
    let (parts, body) = request.into_parts();
    let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    let mut out = Request::builder()
        .method(parts.method.clone())
        .uri(parts.uri.path_and_query().map_or("/", |p| p.as_str()));
    for (name, value) in &parts.headers {
        if name != "transfer-encoding" && name != "expect" {
            out = out.header(name, value);
        }
    }
    let out = out.body(Full::new(body)).map_err(|e| e.to_string())?;
    let tcp = TcpStream::connect(upstream)
        .await
        .map_err(|e| e.to_string())?;
    let (mut send, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let response = send.send_request(out).await.map_err(|e| e.to_string())?;
    let (parts, body) = response.into_parts();
    let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok(Response::from_parts(parts, Full::new(body)))
}
