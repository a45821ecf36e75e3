//! A fault proxy in front of the S3 server (SeaweedFS): real node processes
//! talk to it as their store endpoint, and a test switches what it does to
//! every request: pass it on, delay it, answer 500 or 503 without passing
//! it on, pass a write on and then drop the connection before the reply
//! (the write applied, the node never hears), or refuse to answer at all
//! (the store is down). [`forward`] is also what `log_fence.rs`'s own
//! holding proxy passes requests on with.

// Each test binary uses part of it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

/// What the proxy does to each request from now on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Pass every request on.
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

/// The proxy: its address and the switch.
pub struct FaultProxy {
    pub address: SocketAddr,
    fault: Arc<Mutex<Fault>>,
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
        let fault = Arc::new(Mutex::new(Fault::None));
        let switch = fault.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let fault = switch.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let fault = fault.clone();
                        async move {
                            let now = *fault.lock().unwrap();
                            handle(now, upstream, request).await
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        FaultProxy { address, fault }
    }

    /// The endpoint URL nodes use.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    pub fn set(&self, fault: Fault) {
        *self.fault.lock().unwrap() = fault;
    }
}

type Reply = Result<Response<Full<Bytes>>, std::io::Error>;

/// [`forward`], a failure to reach the server closing the connection.
async fn passed(upstream: SocketAddr, request: Request<Incoming>) -> Reply {
    forward(upstream, request)
        .await
        .map_err(std::io::Error::other)
}

async fn handle(fault: Fault, upstream: SocketAddr, request: Request<Incoming>) -> Reply {
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
pub async fn forward(
    upstream: SocketAddr,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, String> {
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
