//! A single in-process node on the local-directory store serving Durable Streams: `cargo run -p cellfleet-streams --example streams_server -- 127.0.0.1:4437 500`.

use std::sync::Arc;
use std::time::Duration;

use cellfleet_authority::{NodeId, SystemClock};
use cellfleet_runtime::{Kinds, Node, NodeConfig};
use cellfleet_store::LocalStore;
use cellfleet_streams::{Streams, StreamsConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // As the `cellfleet` binary does: no process-wide lock per SQLite allocation.
    cellfleet_cell::memory_statistics_off();
    let mut args = std::env::args().skip(1);
    let address = args.next().unwrap_or_else(|| "127.0.0.1:4437".into());
    let long_poll_ms: u64 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(500);
    let dir = tempfile::tempdir()?;
    let store = Arc::new(LocalStore::open(dir.path().join("bucket"))?);
    let config = NodeConfig::new(NodeId::new("n1")?, dir.path().join("n1"), "streams");
    let kinds = Arc::new(
        cellfleet_streams::with_kinds(Kinds::builtin())
            .expect("the built-in and streams kinds have distinct names"),
    );
    let node = Node::start(config, store, Arc::new(SystemClock), kinds).await?;
    let listener = tokio::net::TcpListener::bind(&address).await?;
    println!(
        "serving durable streams on http://{}",
        listener.local_addr()?
    );
    let streams = Streams::new(
        node,
        StreamsConfig {
            long_poll_timeout: Duration::from_millis(long_poll_ms),
            // The suite's webhook receivers listen on loopback.
            allow_loopback_webhooks: true,
            ..StreamsConfig::default()
        },
    );
    let (_stop, shutdown) = tokio::sync::watch::channel(false);
    streams.serve(listener, shutdown).await;
    Ok(())
}
