//! Wakes long-polls and SSE readers when a stream's published state advances on this node.
//!
//! Appends are acknowledged by the runtime only after their publication
//! CAS, and the server signals here right after that, so a woken reader's
//! next query sees the new data. Readers also re-check on a bounded
//! interval ([`RECHECK`]), which covers appends that reached the Cell
//! through another path (another process's server, the gRPC API).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;

/// Longest a waiting reader goes without re-querying the stream.
pub const RECHECK: Duration = Duration::from_millis(100);

/// Per-stream change counters.
#[derive(Debug, Default)]
pub struct Notifier {
    streams: Mutex<HashMap<String, watch::Sender<u64>>>,
}

impl Notifier {
    /// Subscribes to changes of `path`; subscribe *before* the last emptiness check.
    pub fn subscribe(&self, path: &str) -> watch::Receiver<u64> {
        let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        // Drop senders nobody listens to, so the map stays bounded by the
        // number of waiting readers.
        streams.retain(|_, sender| sender.receiver_count() > 0);
        streams
            .entry(path.to_owned())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe()
    }

    /// `path` changed (published).
    pub fn changed(&self, path: &str) {
        let streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(sender) = streams.get(path) {
            sender.send_modify(|n| *n += 1);
        }
    }
}

/// Waits until `receiver` sees a change, [`RECHECK`] passes, or `deadline`.
pub async fn wait(receiver: &mut watch::Receiver<u64>, deadline: tokio::time::Instant) {
    let until = deadline.min(tokio::time::Instant::now() + RECHECK);
    let _ = tokio::time::timeout_at(until, receiver.changed()).await;
}
