//! Flushing a dead session's log into its Cells' roots, so the log can be collected (DESIGN.md §9, takeover and sealing).
//!
//! A session that ended without draining leaves records in its lanes that
//! only the log holds, and roots that point there. The node that seals one
//! of its lanes (a takeover), and a node at start for its own earlier
//! sessions, runs this one-time job for the whole session, once
//! `gc.min_age_ms` has passed (the Cells clients use are taken over by
//! their requests meanwhile, where the router places them):
//!
//! 1. every lane of the session is sealed (idempotent; a zombie can write
//!    nothing that counts afterwards) and read: which Cells have records
//!    in it, up to which TXID;
//! 2. each Cell whose root still points into the lane and lacks some of
//!    those records ([`needs_lane`], pure) is activated here — the normal
//!    takeover path, which replays and checkpoints them and moves the
//!    pointer to this node's lane — and then released (owner none, as a
//!    drain leaves it), so the next request places it like any other Cell
//!    instead of piling the dead node's Cells onto the sealer; at most
//!    `activations_concurrent_max / 2` at once;
//! 3. after the minimum age, every such root is read again: once none
//!    needs the lane (a pointer never moves back into a dead lane), its
//!    floor is raised to the seal and its segments are deleted. Seals and
//!    floor markers stay (a zombie must still hit the seal).
//!
//! A Cell that cannot be flushed (its kind unknown here, the store
//! failing) leaves its lane uncollected; the job reports it and a later
//! start or takeover tries again.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use cellfleet_authority::{CellId, Holder, LaneId, RootRecord, Txid};
use cellfleet_nodelog::store as logstore;

use super::{run_bounded, Shared};
use crate::actor::{Msg, StopHow};
use crate::error::{Error, Result};

/// Whether `root` still needs records of `lane` up to `max_txid`: it
/// points into that lane and its chain ends before them (pure).
pub(crate) fn needs_lane(root: &RootRecord, lane: &LaneId, max_txid: Txid) -> bool {
    root.log
        .as_ref()
        .is_some_and(|pointer| pointer.lane == *lane)
        && root.txid < max_txid
}

/// What one flush did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct FlushReport {
    /// Lanes of the session found.
    pub lanes: usize,
    /// Cells activated to checkpoint their records.
    pub cells_flushed: usize,
    /// Cells that could not be flushed (their lanes stay).
    pub cells_failed: usize,
    /// Lanes whose segments were deleted.
    pub lanes_collected: usize,
    /// Segments deleted.
    pub segments_deleted: u64,
}

impl Shared {
    /// Starts the flush of `dead`'s log once per session on this node.
    pub(crate) fn start_flush(self: &Arc<Self>, dead: Holder) {
        if dead == self.me || self.config.publication != crate::PublicationMode::Log {
            return;
        }
        if !self
            .flushed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(dead.clone())
        {
            return;
        }
        let shared = self.clone();
        tokio::spawn(async move {
            // Cells in use are taken over by their own requests first (and
            // placed where the router puts them); the flush waits the
            // minimum age and then takes only what is left.
            tokio::time::sleep(Duration::from_millis(shared.config.gc.min_age_ms)).await;
            match shared.flush_session(&dead).await {
                Ok(report) => {
                    shared
                        .metrics
                        .log_flushes_total
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::info!(node = %dead.node, session = %dead.session, ?report, "dead session's log flushed");
                }
                Err(error) => {
                    shared
                        .metrics
                        .gc_failures_total
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(node = %dead.node, session = %dead.session, %error, "flushing a dead session's log failed; a later takeover or start tries again");
                    shared
                        .flushed
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&dead);
                }
            }
        });
    }

    /// Flushes this node's own earlier sessions (found in the bucket).
    pub(crate) async fn flush_own_earlier_sessions(self: &Arc<Self>) -> Result<()> {
        let store = self.activator.store.clone();
        let sessions = logstore::list_sessions(store.as_ref(), self.roots.layout(), &self.me.node)
            .await
            .map_err(crate::replay::log_error)?;
        for session in sessions {
            self.start_flush(Holder {
                node: self.me.node.clone(),
                session,
            });
        }
        Ok(())
    }

    async fn flush_session(self: &Arc<Self>, dead: &Holder) -> Result<FlushReport> {
        let store = self.activator.store.clone();
        let layout = self.roots.layout().clone();
        let lanes = logstore::list_lanes(store.as_ref(), &layout, &dead.node, dead.session)
            .await
            .map_err(crate::replay::log_error)?;
        let mut report = FlushReport {
            lanes: lanes.len(),
            ..FlushReport::default()
        };
        let Some(log) = self.actor_context.log.clone() else {
            return Ok(report);
        };
        for lane in lanes {
            let now_ms = self.actor_context.clock.now_wall_ms();
            let index = log
                .sealed_index(&lane, now_ms)
                .await
                .map_err(crate::replay::log_error)?;
            // Each Cell found, with the last TXID the lane holds of it.
            let found: HashMap<CellId, Txid> = index
                .cells()
                .map(|(cell, max_txid)| (cell.clone(), max_txid))
                .collect();
            let limit = (self.config.limits.activations_concurrent_max / 2).max(1);
            let mut tasks = Vec::with_capacity(found.len());
            for (cell, max_txid) in &found {
                let (shared, lane, cell, max_txid) =
                    (self.clone(), lane.clone(), cell.clone(), *max_txid);
                tasks.push(Box::pin(async move {
                    shared.flush_cell(&lane, &cell, max_txid).await
                }));
            }
            let mut failed = 0;
            for outcome in run_bounded(tasks, limit).await {
                match outcome {
                    Ok(true) => report.cells_flushed += 1,
                    Ok(false) => {}
                    Err(error) => {
                        failed += 1;
                        tracing::warn!(lane = ?lane, %error, "a cell of a dead lane was not flushed");
                    }
                }
            }
            report.cells_failed += failed;
            if failed > 0 || !self.config.gc.enabled || index.end <= index.floor {
                continue;
            }
            // A replay elsewhere may still be reading the lane: collect only
            // after the minimum age, once no root found there needs it.
            tokio::time::sleep(Duration::from_millis(self.config.gc.min_age_ms)).await;
            let mut needed = false;
            for (cell, max_txid) in &found {
                match self.roots.read(cell).await? {
                    Some(root) if needs_lane(&root.record, &lane, *max_txid) => {
                        needed = true;
                        break;
                    }
                    _ => {}
                }
            }
            if needed {
                continue;
            }
            let deleted = logstore::collect(store.as_ref(), &layout, &lane, index.floor, index.end)
                .await
                .map_err(crate::replay::log_error)?;
            self.metrics
                .gc_segments_deleted_total
                .fetch_add(deleted, Ordering::Relaxed);
            report.lanes_collected += 1;
            report.segments_deleted += deleted;
        }
        Ok(report)
    }

    /// Brings `cell`'s root past its records in the dead `lane` (up to
    /// `max_txid`) by activating it here and releasing it; `false` if
    /// nothing was needed.
    async fn flush_cell(
        self: &Arc<Self>,
        lane: &LaneId,
        cell: &CellId,
        max_txid: Txid,
    ) -> Result<bool> {
        let Some(root) = self.roots.read(cell).await? else {
            return Ok(false);
        };
        if !needs_lane(&root.record, lane, max_txid) {
            return Ok(false);
        }
        let kind = root.record.kind.clone();
        let key = root.record.key.clone().unwrap_or_default();
        if CellId::for_kind_key(&kind, key.as_bytes()) != *cell {
            return Err(Error::Closed(format!(
                "cell {cell} has a key that is not text; it is flushed when a request activates it"
            )));
        }
        if self.slots().contains_key(cell) {
            // Open or opening here for a request: its activation replays.
            return Ok(true);
        }
        let handle = match self.start_activation(cell, &kind, key.as_bytes()).await {
            Ok(handle) => handle,
            // Another node took it over (and replays it itself).
            Err(Error::NotOwner { .. }) => return Ok(true),
            Err(error) => return Err(error),
        };
        if handle.load.load(Ordering::Relaxed) == 0 {
            let (done, wait) = tokio::sync::oneshot::channel();
            if handle
                .tx
                .try_send(Msg::Stop {
                    how: StopHow::Drain,
                    done: Some(done),
                })
                .is_ok()
            {
                let _ = wait.await;
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellfleet_authority::{transition, LogPointer, NewCell, NodeId, SessionId};

    #[test]
    fn a_root_needs_a_lane_only_while_it_points_there_and_lacks_records() {
        let me = Holder {
            node: NodeId::new("n1").unwrap(),
            session: SessionId::from_u128(1),
        };
        let lane = LaneId {
            node: me.node.clone(),
            session: me.session,
            lane: 0,
        };
        let other = LaneId {
            lane: 1,
            ..lane.clone()
        };
        let mut root = transition::create(
            &NewCell {
                cell_id: CellId::for_kind_key("kv", b"k"),
                kind: "kv".into(),
                key: Some("k".into()),
                page_size: 4096,
                schema_version: 0,
            },
            &me,
            1,
        );
        root.txid = Txid(5);
        assert!(!needs_lane(&root, &lane, Txid(9)), "no pointer");
        root.log = Some(LogPointer {
            lane: lane.clone(),
            from_seq: 3,
        });
        assert!(needs_lane(&root, &lane, Txid(9)));
        assert!(!needs_lane(&root, &lane, Txid(5)), "the chain has them");
        assert!(!needs_lane(&root, &other, Txid(9)), "points elsewhere");
    }
}
