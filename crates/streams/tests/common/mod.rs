//! One in-process node on the local-directory store serving Durable
//! Streams (all three streams kinds) on a kernel-chosen loopback port.

use std::net::SocketAddr;
use std::sync::Arc;

use cellfleet_authority::{NodeId, SystemClock};
use cellfleet_runtime::{Kinds, Node, NodeConfig};
use cellfleet_store::{LocalStore, ObjectStore};
use cellfleet_streams::{Streams, StreamsConfig};

/// A running server; dropping it stops the listener and removes its files.
pub struct TestServer {
    pub address: SocketAddr,
    _dir: tempfile::TempDir,
    _stop: tokio::sync::watch::Sender<bool>,
}

/// Starts a node with bucket prefix `prefix` and serves `config` on it.
pub async fn start(prefix: &str, config: StreamsConfig) -> TestServer {
    start_with(prefix, config, |store| store).await
}

/// As [`start`], with the local store wrapped by `wrap` (a fault store).
#[allow(dead_code)]
pub async fn start_with(
    prefix: &str,
    config: StreamsConfig,
    wrap: impl FnOnce(Arc<dyn ObjectStore>) -> Arc<dyn ObjectStore>,
) -> TestServer {
    serve(prefix, wrap, |node| Streams::new(node, config)).await
}

/// A node on a (wrapped) local store in a temporary directory, serving
/// the streams service `streams` builds over it.
async fn serve(
    prefix: &str,
    wrap: impl FnOnce(Arc<dyn ObjectStore>) -> Arc<dyn ObjectStore>,
    streams: impl FnOnce(cellfleet_runtime::NodeHandle) -> Streams,
) -> TestServer {
    let dir = tempfile::tempdir().expect("temp dir");
    let local: Arc<dyn ObjectStore> =
        Arc::new(LocalStore::open(dir.path().join("bucket")).expect("local store"));
    let store = wrap(local);
    let node_config = NodeConfig::new(
        NodeId::new("n1").expect("node id"),
        dir.path().join("n1"),
        prefix,
    );
    let kinds = Arc::new(
        cellfleet_streams::with_kinds(Kinds::builtin())
            .expect("the built-in and streams kinds have distinct names"),
    );
    let node = Node::start(node_config, store, Arc::new(SystemClock), kinds)
        .await
        .expect("node starts");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    tokio::spawn(streams(node).serve(listener, shutdown));
    TestServer {
        address,
        _dir: dir,
        _stop: stop,
    }
}

/// A backend that counts the queries it passes to the node's own.
#[derive(Debug)]
#[allow(dead_code)]
pub struct Counting {
    pub inner: Arc<dyn cellfleet_streams::StreamBackend>,
    pub queries: Arc<std::sync::atomic::AtomicUsize>,
    pub commands: Arc<std::sync::atomic::AtomicUsize>,
}

impl cellfleet_streams::StreamBackend for Counting {
    fn execute<'a>(
        &'a self,
        kind: &'a str,
        key: &'a [u8],
        command: cellfleet_cell::Command,
    ) -> cellfleet_streams::BackendFuture<'a, cellfleet_cell::Outcome> {
        self.commands
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.execute(kind, key, command)
    }

    fn query<'a>(
        &'a self,
        kind: &'a str,
        key: &'a [u8],
        name: &'a str,
        args: serde_json::Value,
    ) -> cellfleet_streams::BackendFuture<'a, serde_json::Value> {
        self.queries
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.query(kind, key, name, args)
    }

    fn watch<'a>(
        &'a self,
        kind: &'a str,
        key: &'a [u8],
        after: u64,
        wait: std::time::Duration,
    ) -> cellfleet_streams::BackendFuture<'a, u64> {
        self.inner.watch(kind, key, after, wait)
    }
}

/// The counters of a counting server.
#[allow(dead_code)]
pub struct Counts {
    pub queries: Arc<std::sync::atomic::AtomicUsize>,
    pub commands: Arc<std::sync::atomic::AtomicUsize>,
}

/// As [`start`], counting the queries and commands the server runs.
#[allow(dead_code)]
pub async fn start_counting(prefix: &str, config: StreamsConfig) -> (TestServer, Counts) {
    let counts = Counts {
        queries: Default::default(),
        commands: Default::default(),
    };
    let (queries, commands) = (counts.queries.clone(), counts.commands.clone());
    let server = serve(
        prefix,
        |store| store,
        move |node| {
            let backend = Arc::new(Counting {
                inner: Arc::new(cellfleet_streams::LocalBackend::new(node)),
                queries,
                commands,
            });
            Streams::with_backend(backend, config)
        },
    )
    .await;
    (server, counts)
}
