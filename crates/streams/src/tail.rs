//! One read of a stream's tail shared by every live reader that needs it: long-polls and SSE connections at the same position, woken by the same append, run one runtime query between them instead of one each.
//!
//! *Rule:* a reader that woke at instant `w` may use a read only if that
//! read started at or after `w`. A read started after the wake sees
//! everything published before the wake (the server signals a wake only
//! after the append's publication), so the reader gets what its own query
//! would have returned, or more. A reader woken by a timer (the re-check
//! that covers a stream whose pump cannot reach the owner) follows the
//! same rule, so it never reuses a read from before its re-check.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use tokio::sync::OnceCell;
use tokio::time::Instant;

use crate::kinds::stream::StreamState;

/// What one read returned, and the bodies built from it (built once,
/// by whichever reader needs them first).
#[derive(Debug)]
pub(crate) struct TailRead {
    pub state: StreamState,
    pub messages: Vec<(u64, String)>,
    /// The position the read started at.
    pub from: u64,
    pub next: u64,
    /// The joined messages (a long-poll's body).
    pub body: OnceLock<Bytes>,
    /// The SSE `data` event's payload.
    pub sse_data: OnceLock<String>,
}

impl TailRead {
    /// A read's result: state, messages, the position it started at, the next one.
    pub fn new((state, messages, from, next): (StreamState, Vec<(u64, String)>, u64, u64)) -> Self {
        TailRead {
            state,
            messages,
            from,
            next,
            body: OnceLock::new(),
            sse_data: OnceLock::new(),
        }
    }
}

type Slot = Arc<OnceCell<Option<Arc<TailRead>>>>;

#[derive(Debug)]
struct Entry {
    started: Instant,
    slot: Slot,
}

/// Reads in flight or just done, by (stream path, position).
#[derive(Debug, Default)]
pub(crate) struct SharedReads {
    entries: Mutex<Entries>,
}

#[derive(Debug, Default)]
struct Entries {
    map: HashMap<(String, u64), Entry>,
    /// The map's size after the last sweep (sweeps are amortized).
    swept_at: usize,
}

/// How long a finished read stays available to later joiners.
const KEEP: std::time::Duration = std::time::Duration::from_secs(1);

/// Whether `started` may serve a reader that woke at `woke` (the rule above).
pub(crate) fn usable(started: Instant, woke: Instant) -> bool {
    started >= woke
}

impl SharedReads {
    /// The read of `path` at `position` for a reader that woke at `woke`:
    /// joins one that started at or after `woke`, or runs `read` (at most
    /// once across everyone who joins it). `None` when the read failed;
    /// the caller then reads on its own to get the error answer.
    pub(crate) async fn get<F, Fut>(
        &self,
        path: &str,
        position: u64,
        woke: Instant,
        read: F,
    ) -> Option<Arc<TailRead>>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Option<TailRead>>,
    {
        let slot = {
            let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            let key = (path.to_owned(), position);
            match entries.map.get(&key) {
                Some(entry) if usable(entry.started, woke) => entry.slot.clone(),
                _ => {
                    let slot = Slot::default();
                    entries.map.insert(
                        key,
                        Entry {
                            started: Instant::now(),
                            slot: slot.clone(),
                        },
                    );
                    entries.sweep(Instant::now());
                    slot
                }
            }
        };
        slot.get_or_init(|| async { read().await.map(Arc::new) })
            .await
            .clone()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map
            .len()
    }
}

impl Entries {
    /// Drops entries older than [`KEEP`] once the map has doubled since
    /// the last sweep, so it stays bounded by the reads of the last second.
    fn sweep(&mut self, now: Instant) {
        if self.map.len() <= 2 * self.swept_at + 64 {
            return;
        }
        self.map
            .retain(|_, entry| now.saturating_duration_since(entry.started) < KEEP);
        self.swept_at = self.map.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn state() -> StreamState {
        StreamState {
            config: crate::kinds::stream::StreamConfig {
                content_type: "application/json".into(),
                ttl_seconds: None,
                expires_at: None,
                expires_at_ms: None,
            },
            tail: 3,
            closed: false,
            lineage: None,
        }
    }

    async fn read(n: &AtomicUsize, next: u64) -> Option<TailRead> {
        n.fetch_add(1, Ordering::SeqCst);
        tokio::task::yield_now().await;
        Some(TailRead::new((state(), vec![(0, "e30=".into())], 0, next)))
    }

    #[tokio::test]
    async fn readers_woken_before_a_read_started_share_it() {
        let reads = Arc::new(SharedReads::default());
        let n = Arc::new(AtomicUsize::new(0));
        let woke = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..100 {
            let (reads, n) = (reads.clone(), n.clone());
            tasks.push(tokio::spawn(async move {
                reads.get("/s", 0, woke, || read(&n, 3)).await.unwrap().next
            }));
        }
        for task in tasks {
            assert_eq!(task.await.unwrap(), 3);
        }
        assert_eq!(n.load(Ordering::SeqCst), 1, "one read for all");
    }

    #[tokio::test]
    async fn a_reader_woken_after_a_read_started_reads_again() {
        let reads = SharedReads::default();
        let n = AtomicUsize::new(0);
        let first = reads.get("/s", 0, Instant::now(), || read(&n, 3)).await;
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        let later = reads.get("/s", 0, Instant::now(), || read(&n, 4)).await;
        assert_eq!((first.unwrap().next, later.unwrap().next), (3, 4));
        assert_eq!(n.load(Ordering::SeqCst), 2);
        // Another position or stream is another read.
        reads.get("/s", 1, Instant::now(), || read(&n, 5)).await;
        reads.get("/t", 0, Instant::now(), || read(&n, 5)).await;
        assert_eq!(n.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn a_failed_read_is_none_and_old_reads_are_swept() {
        let reads = SharedReads::default();
        let failed = reads.get("/s", 0, Instant::now(), || async { None }).await;
        assert!(failed.is_none());
        let n = AtomicUsize::new(0);
        for i in 0..1_000 {
            reads
                .get(&format!("/s{i}"), 0, Instant::now(), || read(&n, 1))
                .await;
        }
        // Young entries survive the sweeps that ran on the way.
        assert_eq!(reads.len(), 1_001);
        let mut entries = reads.entries.lock().unwrap();
        entries.swept_at = 0;
        entries.sweep(Instant::now() + KEEP);
        assert!(entries.map.is_empty(), "{}", entries.map.len());
    }
}
