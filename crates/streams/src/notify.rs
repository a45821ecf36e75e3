//! Wakes long-polls and SSE readers when a stream's published state advances on this node.
//!
//! Appends are acknowledged by the runtime only after their publication
//! CAS, and the server signals here right after that, so a woken reader's
//! next query sees the new data. Readers also re-check on a bounded
//! interval ([`RECHECK`]), which covers appends that reached the Cell
//! through another path (another process's server, the gRPC API). Each
//! signal carries the instant it was sent: a read started after it sees
//! what it announced ([`crate::tail`] shares such reads).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// Longest a waiting reader goes without re-querying the stream.
pub const RECHECK: Duration = Duration::from_millis(100);

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
}

impl Notifier {
    /// Subscribes to changes of `path`; subscribe *before* the last emptiness check.
    pub fn subscribe(&self, path: &str) -> watch::Receiver<Change> {
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
        streams
            .senders
            .entry(path.to_owned())
            .or_insert_with(|| watch::channel((0, Instant::now())).0)
            .subscribe()
    }

    /// `path` changed (published).
    pub fn changed(&self, path: &str) {
        let streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
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
}
