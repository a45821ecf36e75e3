//! Wakes long-polls and SSE readers when a stream's published state advances, whichever node the change came through.
//!
//! Appends are acknowledged by the runtime only after their publication,
//! so a reader woken after the acknowledgement sees the new data. Two
//! sources signal here:
//! - a **pump** per stream with waiting readers on this node ([`pump`]):
//!   it watches the stream's Cell through the backend
//!   ([`StreamBackend::watch`]), which on the owner waits on the runtime
//!   and elsewhere is forwarded to the owner, so appends made through any
//!   node (or the gRPC API) wake readers here when the owner acknowledges
//!   them;
//! - this node's own appends, forks and deletes ([`Notifier::changed`]),
//!   used only while the stream has no healthy pump, so one change wakes
//!   its readers once.
//!
//! Readers also re-check on a bounded interval ([`RECHECK`]), which covers
//! a pump that cannot reach the owner. Each signal carries the instant it
//! was sent: a read started after it sees what it announced
//! ([`crate::tail`] shares such reads).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::backend::StreamBackend;
use crate::kinds::stream::STREAM_KIND;

/// Longest a waiting reader goes without re-querying the stream.
pub const RECHECK: Duration = Duration::from_millis(100);

/// How long one watch of a pump may wait at the owner; a pump whose
/// readers left stops within about this long.
pub const PUMP_WAIT: Duration = Duration::from_secs(4);

/// The longest a pump waits between failed watches (a missing stream, an
/// owner being taken over, an unreachable peer).
pub const PUMP_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// A stream's change count and the instant of its last change.
pub type Change = (u64, Instant);

/// Per-stream change counters.
#[derive(Debug, Default)]
pub struct Notifier {
    streams: Mutex<Streams>,
}

#[derive(Debug, Default)]
struct Streams {
    senders: HashMap<String, watch::Sender<Change>>,
    /// The map's size after the last sweep (sweeps are amortized).
    swept_at: usize,
    /// Streams with a running pump, and whether its last watch answered.
    pumps: HashMap<String, bool>,
}

impl Notifier {
    /// Subscribes to changes of `path`; subscribe *before* the last emptiness check.
    pub fn subscribe(&self, path: &str) -> watch::Receiver<Change> {
        self.subscribe_as(path, false).0
    }

    /// As [`Notifier::subscribe`]; the flag is true when `path` has no
    /// pump and the caller must start one ([`pump`]): it counts as running
    /// from now on.
    pub fn subscribe_pumped(&self, path: &str) -> (watch::Receiver<Change>, bool) {
        self.subscribe_as(path, true)
    }

    fn subscribe_as(&self, path: &str, pumped: bool) -> (watch::Receiver<Change>, bool) {
        let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        // Drop senders nobody listens to once the map has doubled, so it
        // stays bounded by the waiting readers' streams at amortized O(1)
        // per subscription.
        if streams.senders.len() > 2 * streams.swept_at + 64 {
            streams
                .senders
                .retain(|_, sender| sender.receiver_count() > 0);
            streams.swept_at = streams.senders.len();
        }
        let receiver = streams
            .senders
            .entry(path.to_owned())
            .or_insert_with(|| watch::channel((0, Instant::now())).0)
            .subscribe();
        let start = pumped && !streams.pumps.contains_key(path);
        if start {
            streams.pumps.insert(path.to_owned(), false);
        }
        (receiver, start)
    }

    /// `path` changed (published) through this node: wakes its readers
    /// unless a healthy pump will.
    pub fn changed(&self, path: &str) {
        let streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        if streams.pumps.get(path) == Some(&true) {
            return;
        }
        Self::wake(&streams, path);
    }

    /// The pump of `path` saw a change (`Some(true)`), saw none
    /// (`Some(false)`) or could not watch (`None`).
    fn pumped(&self, path: &str, changed: Option<bool>) {
        let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(healthy) = streams.pumps.get_mut(path) {
            *healthy = changed.is_some();
        }
        if changed == Some(true) {
            Self::wake(&streams, path);
        }
    }

    /// Whether the pump of `path` stops: it does, and is forgotten, when
    /// no reader waits on `path` any more. Decided under the lock that
    /// [`Notifier::subscribe_pumped`] takes, so a new reader either finds
    /// the pump running or starts another.
    fn pump_stops(&self, path: &str) -> bool {
        let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        let listened = streams
            .senders
            .get(path)
            .is_some_and(|sender| sender.receiver_count() > 0);
        if !listened {
            streams.pumps.remove(path);
        }
        !listened
    }

    fn wake(streams: &Streams, path: &str) {
        if let Some(sender) = streams.senders.get(path) {
            sender.send_modify(|(n, at)| {
                *n += 1;
                *at = Instant::now();
            });
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.streams
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .senders
            .len()
    }
}

/// Waits until `receiver` sees a change, [`RECHECK`] passes, or
/// `deadline`; returns the instant a reader may count itself woken at.
/// After a signal that is the signal's instant: a read started after it
/// sees the append it announced. After a timer (a re-check for appends
/// that are not signalled here) it is half a [`RECHECK`] ago, so the
/// re-checks of many readers of one stream share reads; such an append is
/// then seen within one and a half [`RECHECK`]s.
pub async fn wait(receiver: &mut watch::Receiver<Change>, deadline: Instant) -> Instant {
    let until = deadline.min(Instant::now() + RECHECK);
    match tokio::time::timeout_at(until, receiver.changed()).await {
        Ok(Ok(())) => receiver.borrow_and_update().1,
        _ => {
            let now = Instant::now();
            now.checked_sub(RECHECK / 2).unwrap_or(now)
        }
    }
}

/// Watches the Cell of stream `path` through `backend` while readers wait
/// on it here, and wakes them on each change: the first answer always
/// wakes them (it may be past what they read). After a failed watch it
/// waits one [`RECHECK`], doubling with each failure in a row up to
/// [`PUMP_BACKOFF_MAX`], and tries again; readers re-check meanwhile.
pub async fn pump(notifier: Arc<Notifier>, backend: Arc<dyn StreamBackend>, path: String) {
    let mut after = 0;
    let mut backoff = RECHECK;
    loop {
        match backend
            .watch(STREAM_KIND, path.as_bytes(), after, PUMP_WAIT)
            .await
        {
            Ok(txid) => {
                notifier.pumped(&path, Some(txid != after));
                after = txid;
                backoff = RECHECK;
            }
            Err(_) => {
                notifier.pumped(&path, None);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(PUMP_BACKOFF_MAX);
            }
        }
        if notifier.pump_stops(&path) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_signal_wakes_with_its_instant_and_a_timeout_with_now() {
        let notifier = Notifier::default();
        let mut rx = notifier.subscribe("/s");
        let before = Instant::now();
        notifier.changed("/s");
        let woke = wait(&mut rx, Instant::now() + RECHECK).await;
        assert!(woke >= before && woke <= Instant::now());
        let waited = Instant::now();
        let woke = wait(&mut rx, Instant::now() + Duration::from_millis(5)).await;
        let after = Instant::now();
        assert!(after >= waited + Duration::from_millis(5), "a timeout");
        assert!(woke <= after - RECHECK / 2, "half a re-check back");
    }

    #[test]
    fn streams_nobody_waits_on_are_dropped() {
        let notifier = Notifier::default();
        for i in 0..10_000 {
            drop(notifier.subscribe(&format!("/s{i}")));
        }
        assert!(notifier.len() < 200, "{}", notifier.len());
        let kept: Vec<_> = (0..500)
            .map(|i| notifier.subscribe(&format!("/k{i}")))
            .collect();
        for i in 0..10_000 {
            drop(notifier.subscribe(&format!("/t{i}")));
        }
        assert!(
            notifier.len() >= 500 && notifier.len() < 1_700,
            "{}",
            notifier.len()
        );
        drop(kept);
    }

    /// A backend whose watches are answered by the test, one by one.
    #[derive(Debug)]
    struct Scripted {
        answers: tokio::sync::Mutex<tokio::sync::mpsc::Receiver<Result<u64, ()>>>,
        calls: std::sync::atomic::AtomicUsize,
    }

    impl StreamBackend for Scripted {
        fn execute<'a>(
            &'a self,
            _: &'a str,
            _: &'a [u8],
            _: cellfleet_cell::Command,
        ) -> crate::BackendFuture<'a, cellfleet_cell::Outcome> {
            unreachable!("the pump only watches")
        }

        fn query<'a>(
            &'a self,
            _: &'a str,
            _: &'a [u8],
            _: &'a str,
            _: serde_json::Value,
        ) -> crate::BackendFuture<'a, serde_json::Value> {
            unreachable!("the pump only watches")
        }

        fn watch<'a>(
            &'a self,
            _: &'a str,
            _: &'a [u8],
            _: u64,
            _: Duration,
        ) -> crate::BackendFuture<'a, u64> {
            Box::pin(async move {
                self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                match self.answers.lock().await.recv().await {
                    Some(Ok(txid)) => Ok(txid),
                    _ => Err(crate::BackendError::Unavailable {
                        message: "scripted".into(),
                        retry_after_ms: None,
                    }),
                }
            })
        }
    }

    async fn calls_reach(backend: &Scripted, n: usize) {
        while backend.calls.load(std::sync::atomic::Ordering::SeqCst) < n {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    #[tokio::test]
    async fn a_pump_wakes_readers_on_changes_and_stops_when_they_leave() {
        let notifier = Arc::new(Notifier::default());
        let (answer, answers) = tokio::sync::mpsc::channel(4);
        let backend = Arc::new(Scripted {
            answers: tokio::sync::Mutex::new(answers),
            calls: Default::default(),
        });
        let (mut rx, start) = notifier.subscribe_pumped("/s");
        assert!(start, "the first reader starts the pump");
        let (_rx2, start) = notifier.subscribe_pumped("/s");
        assert!(!start, "a second reader shares it");
        let pump = tokio::spawn(pump(notifier.clone(), backend.clone(), "/s".into()));
        // The first answer wakes (it may be past what the readers read).
        answer.send(Ok(4)).await.unwrap();
        calls_reach(&backend, 2).await;
        assert!(rx.has_changed().unwrap(), "the first answer wakes");
        rx.borrow_and_update();
        // The same TXID again (the wait ran out): no wake.
        answer.send(Ok(4)).await.unwrap();
        calls_reach(&backend, 3).await;
        assert!(!rx.has_changed().unwrap(), "no change, no wake");
        // While the pump is healthy, this node's own signal is left to it.
        notifier.changed("/s");
        assert!(
            !rx.has_changed().unwrap(),
            "the pump signals, not the append"
        );
        answer.send(Ok(5)).await.unwrap();
        calls_reach(&backend, 4).await;
        assert!(rx.has_changed().unwrap(), "a newer TXID wakes");
        rx.borrow_and_update();
        // A failed watch: this node's signals wake readers again.
        answer.send(Err(())).await.unwrap();
        calls_reach(&backend, 5).await;
        notifier.changed("/s");
        assert!(
            rx.has_changed().unwrap(),
            "no healthy pump: the append wakes"
        );
        // The readers leave: the pump's next answer stops it.
        drop((rx, _rx2));
        answer.send(Ok(5)).await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), pump)
            .await
            .expect("the pump stops")
            .unwrap();
        let (_rx, start) = notifier.subscribe_pumped("/s");
        assert!(start, "a new reader starts a new pump");
    }
}
