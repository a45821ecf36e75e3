//! Passivated Cells and their parked tails (DESIGN.md §9): a Cell closes without a checkpoint while its records are safe in this session's log, and the node checkpoints them later, off every request's path.
//!
//! In log mode a passivating Cell whose acknowledged records past its root
//! sit in this session's own lane leaves them with the node (the *tail*,
//! in memory, bounded by `checkpoint_bytes` per Cell) instead of paying an
//! upload and a root CAS to close; its local file stays at the last
//! record's position. Reactivating it under the same live lease term
//! opens that file at that position and resumes with the tail: no bucket
//! read and no write. The lane keeps holding the tail's segments (the
//! Cell's hold stays where its actor left it), so a successor after a
//! crash replays them from the root's pointer like any other records.
//!
//! The node checkpoints a parked tail ([`Shared::checkpoint_parked`]: one
//! merged LTX upload and one root CAS that moves the pointer to the lane's
//! head, then the hold is released) when it has had no new record for
//! `checkpoint_idle_ms` (as an open Cell would), when its lane has grown
//! `replay_segments_max` past
//! the root's pointer (the replay budget), when the node's parked tails
//! pass `parked_bytes_max` (oldest pointer first), and always before a
//! drain releases the root. An activation waits for a checkpoint of its
//! Cell in flight ([`Shared::take_parked`]), so the CAS and the Cell's
//! next records never race. A parked Cell's engine closed keeping its
//! empty `-wal` (recreating it is part of a reopen's cost);
//! a successful checkpoint removes it ([`cellfleet_cell::tidy_closed`])
//! before the mark clears. A checkpoint that finds the root moved
//! (fenced) or cannot tell (unknown) drops the entry: the next activation
//! reads the bucket and replays from the lane, which still has every
//! record.

use std::sync::atomic::Ordering;
use std::sync::Weak;
use std::time::Duration;

use tokio::time::Instant;

use cellfleet_authority::{CellId, RootRecord, Txid, Versioned};
use tokio::sync::watch;

use super::{run_bounded, Shared};
use crate::activation::checkpoint_into_root;
use crate::lease::ServingMode;
use crate::publication::{merge_files, ParkedCell, PublishFailure, Unckpt};

/// A passivated Cell still owned: the root last written, the lease term
/// under which it was proven ours and, in log mode, the acknowledged
/// records past that root.
#[derive(Debug)]
pub(super) struct Parked {
    pub root: Versioned<RootRecord>,
    pub proven_term: u64,
    /// Acknowledged records past `root`, oldest first (empty in cell mode
    /// and once checkpointed).
    pub tail: Vec<Unckpt>,
    /// When the tail's checkpoint is due.
    pub due: Instant,
    /// Set while the node checkpoints the tail: activation and drain wait
    /// until it turns true.
    pub checkpointing: Option<watch::Receiver<bool>>,
}

impl Parked {
    /// A Cell its actor left, proven ours under lease term `proven_term`.
    pub fn new(cell: ParkedCell, proven_term: u64) -> Self {
        let ParkedCell { root, tail, due } = cell;
        Parked {
            root,
            proven_term,
            tail,
            due,
            checkpointing: None,
        }
    }

    /// What the Cell's next activation resumes from.
    pub fn into_cell(self) -> ParkedCell {
        ParkedCell {
            root: self.root,
            tail: self.tail,
            due: self.due,
        }
    }

    pub fn tail_bytes(&self) -> i64 {
        self.tail
            .iter()
            .map(|record| record.file.bytes.len() as i64)
            .sum()
    }

    /// The TXID acknowledged: the tail's last, else the root's.
    pub fn txid(&self) -> Txid {
        self.tail
            .last()
            .map_or(self.root.record.txid, |record| record.file.max_txid)
    }
}

/// How often the node looks for parked tails to checkpoint.
const SWEEP_EVERY: Duration = Duration::from_millis(500);

/// Parked-tail checkpoints in flight at once.
const CHECKPOINTS_CONCURRENT: usize = 8;

/// Which parked tails are due, oldest pointer first: those past their
/// idle deadline or more than `budget` segments behind their lane, then
/// as many more (oldest pointer first) as bring the total bytes under
/// `bytes_max`. `candidates` are (cell, pointer slot, segments behind,
/// past the deadline, bytes); pure, so the rule is tested on its own.
pub(super) fn due_tails(
    mut candidates: Vec<(CellId, u64, u64, bool, i64)>,
    budget: u64,
    bytes_max: u64,
) -> Vec<CellId> {
    candidates.sort_by_key(|(_, from_seq, ..)| *from_seq);
    let mut total: i64 = candidates.iter().map(|c| c.4).sum();
    let limit = i64::try_from(bytes_max).unwrap_or(i64::MAX);
    let mut due = Vec::new();
    for (cell, _, behind, overdue, bytes) in candidates {
        if overdue || behind > budget || total > limit {
            total -= bytes;
            due.push(cell);
        }
    }
    due
}

impl Shared {
    /// Parks a Cell its actor left.
    pub(super) fn park(&self, cell: CellId, parked: Parked) {
        let bytes = parked.tail_bytes();
        let replaced = self.parked().insert(cell, parked);
        let before = replaced.map_or(0, |old| old.tail_bytes());
        self.metrics
            .parked_tail_bytes
            .fetch_add(bytes - before, Ordering::Relaxed);
    }

    /// Takes `cell`'s parked entry, once no checkpoint of its tail is in
    /// flight.
    pub(super) async fn take_parked(&self, cell: &CellId) -> Option<Parked> {
        loop {
            let mut busy = {
                let mut parked = self.parked();
                match parked
                    .get(cell)
                    .and_then(|entry| entry.checkpointing.clone())
                {
                    Some(busy) => busy,
                    None => {
                        let entry = parked.remove(cell)?;
                        self.metrics
                            .parked_tail_bytes
                            .fetch_sub(entry.tail_bytes(), Ordering::Relaxed);
                        return Some(entry);
                    }
                }
            };
            if busy.wait_for(|done| *done).await.is_err() {
                // The checkpoint's task is gone without a word: its mark
                // must not keep the Cell waiting.
                if let Some(entry) = self.parked().get_mut(cell) {
                    if entry
                        .checkpointing
                        .as_ref()
                        .is_some_and(|mark| mark.same_channel(&busy))
                    {
                        entry.checkpointing = None;
                    }
                }
            }
        }
    }

    /// Forgets every parked Cell (the lease is gone).
    pub(super) fn forget_parked(&self) {
        let mut parked = self.parked();
        let (bytes, records) = parked.values().fold((0, 0), |(b, r), entry| {
            (b + entry.tail_bytes(), r + entry.tail.len() as i64)
        });
        let forgotten: Vec<CellId> = parked.drain().map(|(cell, _)| cell).collect();
        drop(parked);
        self.unpark_gauges(bytes, records);
        // Their watchers are answered now, not at their bound.
        for cell in &forgotten {
            self.actor_context.watches.closed(cell);
        }
    }

    /// Takes parked records that leave without a checkpoint out of the
    /// gauges (they stay in this session's lane for whoever replays them).
    fn unpark_gauges(&self, bytes: i64, records: i64) {
        self.metrics
            .parked_tail_bytes
            .fetch_sub(bytes, Ordering::Relaxed);
        self.metrics
            .checkpoint_lag_records
            .fetch_sub(records, Ordering::Relaxed);
    }

    /// The parked tails due for a checkpoint now.
    fn due_parked(&self) -> Vec<CellId> {
        let Some(log) = self.actor_context.log.as_ref() else {
            return Vec::new();
        };
        let settings = &self.config.log;
        let now = Instant::now();
        let candidates = self
            .parked()
            .iter()
            .filter(|(_, entry)| !entry.tail.is_empty() && entry.checkpointing.is_none())
            .map(|(cell, entry)| {
                let from_seq = entry.root.record.log.as_ref().map_or(0, |p| p.from_seq);
                let behind = log
                    .lane_of(cell)
                    .writer()
                    .verdict()
                    .borrow()
                    .acked_below
                    .saturating_sub(from_seq);
                (
                    cell.clone(),
                    from_seq,
                    behind,
                    entry.due <= now,
                    entry.tail_bytes(),
                )
            })
            .collect();
        due_tails(
            candidates,
            settings.replay_segments_max,
            settings.parked_bytes_max,
        )
    }

    /// Checkpoints parked tails as they fall due, until the node goes.
    pub(super) async fn sweep_parked(shared: Weak<Shared>) {
        loop {
            tokio::time::sleep(SWEEP_EVERY).await;
            let Some(shared) = shared.upgrade() else {
                return;
            };
            if shared.draining.load(Ordering::SeqCst) {
                return;
            }
            if matches!(shared.lease.mode_and_term().0, ServingMode::Stopped(_)) {
                return;
            }
            let due = shared.due_parked();
            if due.is_empty() {
                continue;
            }
            let checkpoints = due.into_iter().map(|cell| {
                let shared = shared.clone();
                async move { shared.checkpoint_parked(&cell).await }
            });
            run_bounded(checkpoints, CHECKPOINTS_CONCURRENT).await;
        }
    }

    /// Checkpoints `cell`'s parked tail into its root (nothing to do
    /// without one); returns the root the entry holds afterwards, `None`
    /// if the entry was dropped (the root moved, or its fate is unknown).
    pub(super) async fn checkpoint_parked(&self, cell: &CellId) -> Option<Versioned<RootRecord>> {
        let (done, root, tail) = {
            let mut parked = self.parked();
            let entry = parked.get_mut(cell)?;
            if entry.tail.is_empty() || entry.checkpointing.is_some() {
                return Some(entry.root.clone());
            }
            let (done, busy) = watch::channel(false);
            entry.checkpointing = Some(busy);
            (done, entry.root.clone(), entry.tail.clone())
        };
        let outcome = self.checkpoint_tail(cell, &root, &tail).await;
        if outcome.is_ok() && !self.draining.load(Ordering::SeqCst) {
            // The Cell closed keeping its `-wal` for a reopen
            // soon; now it is as idle as a tidy close leaves it. Its
            // activation waits for this (the mark is still set). A drain
            // discards every file of the Cell right after, so it skips this.
            let path = self.activator.path(cell);
            match tokio::task::spawn_blocking(move || cellfleet_cell::tidy_closed(&path)).await {
                Ok(Ok(_)) => {}
                Ok(Err(error)) => {
                    tracing::debug!(cell = %cell, %error, "could not remove a parked cell's -wal; its next open reuses it");
                }
                Err(error) => {
                    tracing::debug!(cell = %cell, %error, "tidy task failed");
                }
            }
        }
        let kept = {
            let mut parked = self.parked();
            let records = tail.len() as i64;
            let bytes: i64 = tail.iter().map(|r| r.file.bytes.len() as i64).sum();
            match outcome {
                Ok(next) => {
                    let metrics = &self.metrics;
                    metrics.checkpoints_total.fetch_add(1, Ordering::Relaxed);
                    metrics
                        .parked_checkpoints_total
                        .fetch_add(1, Ordering::Relaxed);
                    metrics.checkpoint_records.observe(tail.len() as f64);
                    metrics
                        .checkpoint_lag_records
                        .fetch_sub(records, Ordering::Relaxed);
                    self.release_hold(cell);
                    parked.get_mut(cell).map(|entry| {
                        metrics
                            .parked_tail_bytes
                            .fetch_sub(entry.tail_bytes(), Ordering::Relaxed);
                        entry.tail.clear();
                        entry.root = next;
                        entry.checkpointing = None;
                        entry.root.clone()
                    })
                }
                Err(PublishFailure::NotCommitted(reason)) => {
                    // Nothing changed: the tail stays and is tried again.
                    tracing::warn!(cell = %cell, %reason, "checkpoint of a parked tail not committed; will retry");
                    parked.get_mut(cell).map(|entry| {
                        entry.checkpointing = None;
                        entry.root.clone()
                    })
                }
                Err(failure) => {
                    // Another owner, or a CAS whose fate is unknown: the
                    // bucket decides from here. The records stay in this
                    // session's lane for whoever replays them.
                    tracing::warn!(cell = %cell, ?failure, "checkpoint of a parked tail failed; the cell's next activation reads its root");
                    if matches!(
                        failure,
                        PublishFailure::Fenced(_) | PublishFailure::CommittedThenFenced(_)
                    ) {
                        self.activator.discard(cell);
                        self.release_hold(cell);
                    }
                    if parked.remove(cell).is_some() {
                        self.unpark_gauges(bytes, records);
                    }
                    self.actor_context.watches.closed(cell);
                    None
                }
            }
        };
        let _ = done.send(true);
        kept
    }

    /// One merged upload of `tail` and one CAS of `root` with it, the
    /// pointer moved to the lane's head (nothing of the Cell is in flight:
    /// it is parked, and activation waits for this).
    async fn checkpoint_tail(
        &self,
        cell: &CellId,
        root: &Versioned<RootRecord>,
        tail: &[Unckpt],
    ) -> Result<Versioned<RootRecord>, PublishFailure> {
        let log = self.actor_context.log.as_ref().ok_or_else(|| {
            PublishFailure::NotCommitted("a parked tail needs the node log".into())
        })?;
        // The node's bound on checkpoints in flight (never closed).
        let _permit = self.actor_context.checkpoint_permits.acquire().await;
        let merged = merge_files(tail.iter().map(|record| record.file.clone()).collect()).await?;
        let pointer = log.lane_of(cell).pointer_here();
        checkpoint_into_root(
            self.actor_context.publisher.as_ref(),
            root,
            Some(merged),
            Some(pointer),
        )
        .await
        .map(|(next, _)| next)
    }

    fn release_hold(&self, cell: &CellId) {
        if let Some(log) = self.actor_context.log.as_ref() {
            log.lane_of(cell).set_hold(cell, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cell(n: u64) -> CellId {
        CellId::for_kind_key("k", n.to_string().as_bytes())
    }

    proptest! {
        /// Due tails: every one past its deadline or the replay budget,
        /// and enough more, oldest pointer first, that what stays parked
        /// fits the byte budget; nothing else.
        #[test]
        fn due_tails_keep_the_rest_within_every_bound(
            tails in proptest::collection::vec((0u64..1000, 0u64..50, any::<bool>(), 1i64..1000), 0..40),
            budget in 0u64..50,
            bytes_max in 0u64..20_000,
        ) {
            let candidates: Vec<_> = tails
                .iter()
                .enumerate()
                .map(|(n, (from, behind, overdue, bytes))| {
                    (cell(n as u64), *from, *behind, *overdue, *bytes)
                })
                .collect();
            let due = due_tails(candidates.clone(), budget, bytes_max);
            let kept: Vec<_> = candidates.iter().filter(|c| !due.contains(&c.0)).collect();
            for c in &kept {
                prop_assert!(!c.3 && c.2 <= budget, "kept a tail past a bound");
            }
            let kept_bytes: i64 = kept.iter().map(|c| c.4).sum();
            prop_assert!(kept_bytes <= bytes_max as i64, "kept {kept_bytes} bytes");
            // The byte budget takes the oldest pointers first: every
            // tail kept has a pointer at least as new as every tail taken
            // for bytes alone.
            let for_bytes: Vec<_> = candidates
                .iter()
                .filter(|c| due.contains(&c.0) && !c.3 && c.2 <= budget)
                .collect();
            for taken in &for_bytes {
                for k in &kept {
                    prop_assert!(taken.1 <= k.1, "a newer tail was checkpointed for bytes before an older one");
                }
            }
        }
    }

    #[test]
    fn nothing_is_due_within_every_bound() {
        let due = due_tails(vec![(cell(1), 5, 3, false, 100)], 4_096, 1 << 20);
        assert!(due.is_empty());
    }
}
