//! The floors every workload is compared with, measured in the same run: a bare tonic echo over the nodes' own mTLS configuration, the store's publication floor (a create-only 4 KiB PUT then an If-Match CAS of a 1 KiB object), the store's read floor (a GET of a 1 KiB object), and a bare SQLite transaction (the `log` kind's append on a plain rusqlite database with a Cell's settings).
//!
//! The echo server serves the generated `cellfleet.v1.Client` service with
//! a trivial implementation (a query answers with its own envelope body),
//! behind `router::tls::server_config` and `router::transport::tls_incoming`
//! with node n1's certificate, on its own 2-thread runtime (as a node
//! runs), so the floor has every cost of a node's listener except the
//! node's work. The echo client sends the same signed query a workload
//! sends. The store floor opens the store as a node does (S3 with its
//! retry wrapper) and writes what one publication writes, each worker on
//! its own keys (no contention). The SQLite floor runs the same statement a
//! `log` append runs, one `BEGIN IMMEDIATE … COMMIT` per command, on a file
//! in the cluster's directory with the pragmas a Cell's write connection
//! uses (WAL, `synchronous = NORMAL`, `wal_autocheckpoint = 0`, 4 KiB
//! pages), one writer (a Cell has one), so a command's ratio to it is the
//! Cell's whole overhead over SQLite.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use bytes::Bytes;
use cellfleet_proto::v1;
use cellfleet_proto::v1::client_server::ClientServer;
use cellfleet_router::tls::{self, Listener, TlsIdentity};
use cellfleet_store::{ObjectStore, PutCondition};
use tokio::sync::oneshot;
use tonic::{Request, Response, Status};

use crate::client::BenchClient;
use crate::load::{self, Sample, Timing, Window};

pub const ECHO: &str = "echo";
pub const STORE_PUBLICATION: &str = "store_publication";
pub const STORE_CREATE: &str = "store_create_4k";
pub const STORE_CAS: &str = "store_cas_1k";
pub const STORE_GET: &str = "store_get_1k";
pub const SQLITE: &str = "sqlite_txn";

/// Size of the create-only object (an LTX file of one small transaction).
const CREATE_BYTES: usize = 4 * 1024;
/// Size of the CAS-replaced object (an authority root).
const CAS_BYTES: usize = 1024;

#[derive(Debug)]
struct Echo;

#[tonic::async_trait]
impl v1::client_server::Client for Echo {
    async fn execute(
        &self,
        request: Request<v1::ExecuteRequest>,
    ) -> Result<Response<v1::ExecuteResponse>, Status> {
        let body = request
            .into_inner()
            .envelope
            .map(|e| e.body)
            .unwrap_or_default();
        Ok(Response::new(v1::ExecuteResponse {
            outcome: Some(v1::execute_response::Outcome::ResultJson(body)),
            served_by: ECHO.into(),
            ..Default::default()
        }))
    }

    async fn query(
        &self,
        request: Request<v1::QueryRequest>,
    ) -> Result<Response<v1::QueryResponse>, Status> {
        let body = request
            .into_inner()
            .envelope
            .map(|e| e.body)
            .unwrap_or_default();
        Ok(Response::new(v1::QueryResponse {
            result_json: body,
            receipt: None,
            served_by: ECHO.into(),
            served_by_endpoint: String::new(),
        }))
    }

    async fn resolve(
        &self,
        _request: Request<v1::ResolveRequest>,
    ) -> Result<Response<v1::ResolveResponse>, Status> {
        Ok(Response::new(v1::ResolveResponse::default()))
    }
}

/// The echo server, on its own thread and runtime.
#[derive(Debug)]
pub struct EchoServer {
    pub addr: SocketAddr,
    stop: oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl EchoServer {
    pub fn start(identity: &TlsIdentity) -> anyhow::Result<Self> {
        let config = tls::server_config(identity, Listener::Client)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        // Bound here (the caller may be inside another runtime), served on
        // the echo runtime.
        let listener =
            std::net::TcpListener::bind("127.0.0.1:0").context("binding the echo listener")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            runtime.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(listener) {
                    Ok(listener) => listener,
                    Err(error) => {
                        eprintln!("bench: the echo listener failed: {error}");
                        return;
                    }
                };
                let served = tonic::transport::Server::builder()
                    .add_service(ClientServer::new(Echo))
                    .serve_with_incoming_shutdown(
                        cellfleet_router::transport::tls_incoming(listener, config),
                        async {
                            let _ = stopped.await;
                        },
                    )
                    .await;
                if let Err(error) = served {
                    eprintln!("bench: the echo server stopped: {error}");
                }
            });
        });
        Ok(EchoServer { addr, stop, thread })
    }

    pub fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.thread.join();
    }
}

/// The echo floor: the same signed query a workload sends, answered at once.
pub async fn echo(client: &BenchClient, concurrency: usize, window: Window) -> Sample {
    let client = client.clone();
    load::drive_labelled(
        format!("echo floor c={concurrency}"),
        concurrency,
        window,
        0,
        move |worker, _| {
            let client = client.clone();
            async move {
                let request = client.query_request(
                    "log",
                    &format!("echo-{worker}"),
                    "count",
                    &serde_json::json!({}),
                );
                let sent = Instant::now();
                client
                    .query(0, request)
                    .await
                    .map_err(|status| crate::client::describe(&status))?;
                Ok(Timing::total(sent.elapsed()))
            }
        },
    )
    .await
}

/// Bytes that differ per `nonce` (ETags must change on every replace).
fn body(size: usize, nonce: u64) -> Bytes {
    let mut bytes = vec![b'x'; size];
    bytes[..8].copy_from_slice(&nonce.to_be_bytes());
    Bytes::from(bytes)
}

/// The publication floor: per request a create-only PUT of a fresh 4 KiB
/// key, then an If-Match replace of the worker's 1 KiB root. Parts:
/// `[create, cas]`.
pub async fn store(
    store: Arc<dyn ObjectStore>,
    prefix: &str,
    concurrency: usize,
    window: Window,
) -> anyhow::Result<Sample> {
    let prefix = format!("{prefix}/c{concurrency}");
    let mut roots = Vec::with_capacity(concurrency);
    for worker in 0..concurrency {
        let key = format!("{prefix}/w{worker}/root");
        let etag = store
            .put(&key, body(CAS_BYTES, 0), PutCondition::Overwrite)
            .await
            .with_context(|| format!("seeding the floor object {key}"))?;
        roots.push(tokio::sync::Mutex::new(etag));
    }
    let roots = Arc::new(roots);
    let prefix = Arc::new(prefix);
    Ok(load::drive_labelled(
        format!("store floor c={concurrency}"),
        concurrency,
        window,
        2,
        move |worker, sequence| {
            let store = store.clone();
            let roots = roots.clone();
            let prefix = prefix.clone();
            async move {
                let mut etag = roots[worker].lock().await;
                let started = Instant::now();
                store
                    .put(
                        &format!("{prefix}/w{worker}/ltx-{sequence}"),
                        body(CREATE_BYTES, sequence),
                        PutCondition::IfNoneMatch,
                    )
                    .await
                    .map_err(|e| format!("create-only put: {e}"))?;
                let created = started.elapsed();
                let replaced = Instant::now();
                let root = format!("{prefix}/w{worker}/root");
                let put = store
                    .put(
                        &root,
                        body(CAS_BYTES, sequence),
                        PutCondition::IfMatch(etag.clone()),
                    )
                    .await;
                *etag = match put {
                    Ok(new_etag) => new_etag,
                    Err(error) => {
                        // A lost reply may have applied: re-read before the next try.
                        if let Ok(meta) = store.head(&root).await {
                            *etag = meta.etag;
                        }
                        return Err(format!("if-match put: {error}"));
                    }
                };
                Ok(Timing {
                    total: started.elapsed(),
                    parts: vec![created, replaced.elapsed()],
                })
            }
        },
    )
    .await)
}

/// The read floor: per request one GET of a 1 KiB object (what reading an
/// authority root costs), each worker on its own key.
pub async fn store_get(
    store: Arc<dyn ObjectStore>,
    prefix: &str,
    concurrency: usize,
    window: Window,
) -> anyhow::Result<Sample> {
    let prefix = Arc::new(format!("{prefix}/get-c{concurrency}"));
    for worker in 0..concurrency {
        let key = format!("{prefix}/w{worker}");
        store
            .put(&key, body(CAS_BYTES, 0), PutCondition::Overwrite)
            .await
            .with_context(|| format!("seeding the floor object {key}"))?;
    }
    Ok(load::drive_labelled(
        format!("store get floor c={concurrency}"),
        concurrency,
        window,
        1,
        move |worker, _sequence| {
            let store = store.clone();
            let prefix = prefix.clone();
            async move {
                let started = Instant::now();
                let object = store
                    .get(&format!("{prefix}/w{worker}"))
                    .await
                    .map_err(|e| format!("get: {e}"))?;
                if object.body.len() != CAS_BYTES {
                    return Err(format!("get returned {} bytes", object.body.len()));
                }
                let total = started.elapsed();
                Ok(Timing {
                    total,
                    parts: vec![total],
                })
            }
        },
    )
    .await)
}

/// The SQLite floor: back-to-back single-row transactions for `window`
/// on one connection (blocking; run it off the async workers).
pub fn sqlite(dir: &std::path::Path, window: Window) -> anyhow::Result<Sample> {
    let path = dir.join("sqlite-floor.db");
    let _ = std::fs::remove_file(&path);
    let conn =
        rusqlite::Connection::open(&path).with_context(|| format!("opening {}", path.display()))?;
    conn.execute_batch(
        "PRAGMA page_size = 4096; PRAGMA journal_mode = WAL; \
         PRAGMA wal_autocheckpoint = 0; PRAGMA synchronous = NORMAL; \
         CREATE TABLE entries (tag TEXT NOT NULL);",
    )
    .context("setting up the SQLite floor database")?;
    let mut histogram = load::histogram();
    let start = Instant::now() + window.warmup;
    let end = start + window.duration;
    let mut sequence = 0u64;
    let mut last_done = start;
    loop {
        let sent = Instant::now();
        if sent >= end {
            break;
        }
        sequence += 1;
        conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        conn.prepare_cached("INSERT INTO entries (tag) VALUES (:tag)")?
            .execute(rusqlite::named_params! {":tag": format!("floor-{sequence}")})?;
        conn.prepare_cached("COMMIT")?.execute([])?;
        if sent >= start {
            let done = Instant::now();
            histogram
                .saturating_record(u64::try_from((done - sent).as_micros()).unwrap_or(u64::MAX));
            last_done = done;
        }
    }
    drop(conn);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    Ok(Sample {
        total: load::Measured {
            histogram,
            errors: 0,
            wall: last_done
                .saturating_duration_since(start)
                .max(window.duration),
            error_samples: Vec::new(),
        },
        parts: Vec::new(),
    })
}
