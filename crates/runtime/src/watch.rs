//! Waiting for a Cell's acknowledged state to move: [`Watches`] keeps one signal per watched Cell, which its actor raises after each acknowledged group, whatever path the commands came by (this node's own protocols, a peer's forward, the gRPC API).
//!
//! A watcher gives the TXID it has seen and is answered with a later one
//! as soon as that is acknowledged, or with what it gave after its wait
//! bound. The signal of a Cell nobody watches is dropped once the map has
//! doubled (amortized O(1) per subscription), so the map stays bounded by
//! the watched Cells. An actor checks one atomic count of signals before
//! it takes the lock, so a node that never had a watcher pays one atomic
//! load per group (once signals exist, one uncontended lock and lookup).
//!
//! Every way a Cell leaves the node, or closes, drops its signal
//! ([`Watches::closed`]: the actor's exit, when its slot is removed; a
//! failed activation; a parked Cell's release, fence or loss with the
//! lease; and [`Watches::close_all`] at the end of a drain or halt), and a
//! new signal whose TXID was never learned is dropped too ([`Unknown`]),
//! so a signal that existed without a break holds the Cell's acknowledged
//! TXID and its watchers are answered at once when the Cell goes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use cellfleet_authority::CellId;
use cellfleet_cell::Txid;
use tokio::sync::watch;

/// The longest one watch waits before it is answered with no change: below
/// the router's hop timeout (10 s), so a forwarded watch is never taken
/// for an unreachable peer.
pub const WATCH_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// Per-Cell signals of acknowledged TXIDs.
#[derive(Debug, Default)]
pub struct Watches {
    cells: Mutex<Cells>,
    /// Cells in the map: zero means no actor needs the lock.
    watched: AtomicUsize,
}

#[derive(Debug, Default)]
struct Cells {
    senders: HashMap<CellId, watch::Sender<Txid>>,
    /// The map's size after the last sweep.
    swept_at: usize,
}

impl Watches {
    /// Subscribes to `cell`'s acknowledged TXID. The second value is true
    /// when the signal is new: its TXID is not known yet (zero) and the
    /// caller must learn it another way before it waits.
    pub fn subscribe(&self, cell: &CellId) -> (watch::Receiver<Txid>, bool) {
        let mut cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        if cells.senders.len() > 2 * cells.swept_at + 64 {
            cells
                .senders
                .retain(|_, sender| sender.receiver_count() > 0);
            cells.swept_at = cells.senders.len();
        }
        let fresh = !cells.senders.contains_key(cell);
        let receiver = cells
            .senders
            .entry(cell.clone())
            .or_insert_with(|| watch::channel(Txid::ZERO).0)
            .subscribe();
        self.watched.store(cells.senders.len(), Ordering::Release);
        (receiver, fresh)
    }

    /// `cell`'s acknowledged state is at `txid` (it never moves back: a
    /// lower TXID is ignored).
    pub fn acknowledged(&self, cell: &CellId, txid: Txid) {
        if self.watched.load(Ordering::Acquire) == 0 {
            return;
        }
        let cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(sender) = cells.senders.get(cell) {
            sender.send_if_modified(|seen| {
                let newer = txid > *seen;
                if newer {
                    *seen = txid;
                }
                newer
            });
        }
    }

    /// This node no longer holds `cell` (released, fenced, failed): its
    /// watchers are answered now with what they have, so they ask again
    /// and are told it is not here.
    pub fn closed(&self, cell: &CellId) {
        if self.watched.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        cells.senders.remove(cell);
        self.watched.store(cells.senders.len(), Ordering::Release);
    }

    /// Drops `cell`'s signal if it is still the one `receiver` watches (a
    /// signal made since by another watcher stays).
    pub fn closed_if_same(&self, cell: &CellId, receiver: &watch::Receiver<Txid>) {
        let mut cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        let same = cells
            .senders
            .get(cell)
            .is_some_and(|sender| sender.subscribe().same_channel(receiver));
        if same {
            cells.senders.remove(cell);
            self.watched.store(cells.senders.len(), Ordering::Release);
        }
    }

    /// The node holds nothing any more (drained or halted): every watcher
    /// is answered now.
    pub fn close_all(&self) {
        let mut cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        cells.senders.clear();
        self.watched.store(0, Ordering::Release);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.cells
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .senders
            .len()
    }
}

/// A new signal whose TXID is not known yet: dropped before [`Unknown::known`]
/// (its watch cancelled, or the Cell not described), it drops the signal,
/// whose zero would otherwise be trusted by the next watcher.
#[must_use]
pub(crate) struct Unknown<'a> {
    watches: &'a Watches,
    cell: &'a CellId,
    /// The signal this watch made: only it is dropped.
    receiver: &'a watch::Receiver<Txid>,
    known: bool,
}

impl<'a> Unknown<'a> {
    pub(crate) fn new(
        watches: &'a Watches,
        cell: &'a CellId,
        receiver: &'a watch::Receiver<Txid>,
    ) -> Self {
        Self {
            watches,
            cell,
            receiver,
            known: false,
        }
    }

    /// The signal holds the Cell's TXID now.
    pub(crate) fn known(mut self) {
        self.known = true;
    }
}

impl Drop for Unknown<'_> {
    fn drop(&mut self) {
        if !self.known {
            self.watches.closed_if_same(self.cell, self.receiver);
        }
    }
}

/// Waits until `receiver` holds a TXID above `after`, or `until`; returns
/// the TXID it holds then (`after` when nothing newer came).
pub async fn wait_past(
    receiver: &mut watch::Receiver<Txid>,
    after: Txid,
    until: tokio::time::Instant,
) -> Txid {
    let newer = tokio::time::timeout_at(until, receiver.wait_for(|seen| *seen > after))
        .await
        .ok()
        .and_then(|seen| seen.ok().map(|seen| *seen));
    newer.unwrap_or_else(|| (*receiver.borrow()).max(after))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn cell(key: &str) -> CellId {
        CellId::for_kind_key("kv", key.as_bytes())
    }

    #[tokio::test]
    async fn a_new_signal_left_unknown_is_dropped_and_answers_its_watchers() {
        let watches = Watches::default();
        let a = cell("a");
        let (first, fresh) = watches.subscribe(&a);
        assert!(fresh);
        // A second watcher joins while the first learns the TXID...
        let (mut second, fresh) = watches.subscribe(&a);
        assert!(!fresh);
        // ...and the first is cancelled before it knew it.
        drop(Unknown::new(&watches, &a, &first));
        let until = tokio::time::Instant::now() + Duration::from_secs(5);
        let answered = tokio::time::timeout(
            Duration::from_secs(1),
            wait_past(&mut second, Txid(4), until),
        )
        .await
        .expect("answered at once, not at its bound");
        assert_eq!(answered, Txid(4));
        // The next watcher makes a new signal and learns the TXID itself.
        let (third, fresh) = watches.subscribe(&a);
        assert!(fresh, "the zero of an unknown signal is never trusted");
        // A guard of the first signal, dropped late, leaves the new one.
        drop(Unknown::new(&watches, &a, &first));
        watches.acknowledged(&a, Txid(6));
        assert_eq!(*third.borrow(), Txid(6), "the new signal is still there");
        assert!(!watches.subscribe(&a).1);
        // A signal whose TXID became known stays.
        let b = cell("b");
        let (rx, fresh) = watches.subscribe(&b);
        assert!(fresh);
        watches.acknowledged(&b, Txid(2));
        Unknown::new(&watches, &b, &rx).known();
        assert!(!watches.subscribe(&b).1);
    }

    #[tokio::test]
    async fn a_watcher_is_answered_with_the_next_acknowledged_txid() {
        let watches = Watches::default();
        let (mut rx, fresh) = watches.subscribe(&cell("a"));
        assert!(fresh, "the first subscription makes the signal");
        let (_rx2, fresh) = watches.subscribe(&cell("a"));
        assert!(!fresh, "a second one shares it");
        watches.acknowledged(&cell("a"), Txid(3));
        watches.acknowledged(&cell("b"), Txid(9));
        let until = tokio::time::Instant::now() + Duration::from_secs(5);
        assert_eq!(wait_past(&mut rx, Txid(2), until).await, Txid(3));
        // A lower TXID never moves it back.
        watches.acknowledged(&cell("a"), Txid(1));
        assert_eq!(*rx.borrow(), Txid(3));
    }

    #[tokio::test]
    async fn a_watcher_past_the_latest_txid_gets_what_it_gave_at_its_bound() {
        let watches = Watches::default();
        let (mut rx, _) = watches.subscribe(&cell("a"));
        watches.acknowledged(&cell("a"), Txid(3));
        let until = tokio::time::Instant::now() + Duration::from_millis(20);
        assert_eq!(wait_past(&mut rx, Txid(5), until).await, Txid(5));
        let until = tokio::time::Instant::now() + Duration::from_millis(20);
        assert_eq!(wait_past(&mut rx, Txid(3), until).await, Txid(3));
    }

    #[tokio::test]
    async fn a_closed_cell_answers_its_watchers_at_once() {
        let watches = Watches::default();
        let (mut rx, _) = watches.subscribe(&cell("a"));
        watches.acknowledged(&cell("a"), Txid(3));
        watches.closed(&cell("a"));
        let until = tokio::time::Instant::now() + Duration::from_secs(60);
        let answered =
            tokio::time::timeout(Duration::from_secs(5), wait_past(&mut rx, Txid(3), until))
                .await
                .expect("answered before its bound");
        assert_eq!(answered, Txid(3), "no change");
        let (_, fresh) = watches.subscribe(&cell("a"));
        assert!(fresh, "the next watcher learns the TXID again");
    }

    #[test]
    fn signals_nobody_watches_are_dropped() {
        let watches = Watches::default();
        for i in 0..10_000 {
            drop(watches.subscribe(&cell(&i.to_string())));
        }
        assert!(watches.len() < 200, "{} signals kept", watches.len());
        let (_kept, _) = watches.subscribe(&cell("kept"));
        for i in 0..1_000 {
            drop(watches.subscribe(&cell(&format!("x{i}"))));
        }
        let (_, fresh) = watches.subscribe(&cell("kept"));
        assert!(!fresh, "a watched Cell's signal survives the sweeps");
    }
}
