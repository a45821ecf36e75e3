//! A Cell's records past its chain, read from the node log a root points at (DESIGN.md §9, takeover and sealing).
//!
//! * The pointer names **another session** (the previous owner, whose
//!   lease is dead — activation only gets here after winning the takeover
//!   CAS): its lane is sealed first ([`seal_lane`], idempotent under racing
//!   successors), then the slots before the seal that hold this Cell's
//!   records are read with ranged GETs. A zombie of that session can write
//!   nothing that counts after the seal, so what is read is final.
//! * The pointer names **this session** (the Cell's actor stopped with
//!   records not yet checkpointed): every slot reserved so far is waited
//!   for until it is decided, then the lane's written prefix is read. A
//!   slot still in doubt could land later, so activation fails (retryable)
//!   rather than build on a state that may be missing it.
//!
//! [`check_tail`] (pure) keeps the records past the root's TXID and
//! refuses a tail that is not contiguous with the chain.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cellfleet_authority::{Holder, LaneId, Layout, LogPointer, RootRecord};
use cellfleet_nodelog::store::{
    index_slots, read_indexed, read_lane, read_records, seal_lane, Indexed,
};
use cellfleet_nodelog::Entry;
use cellfleet_store::ObjectStore;

use crate::error::{Error, Result};
use crate::log::NodeLog;

/// The records of `root`'s Cell past its chain, oldest first, checked.
pub(crate) async fn records_past_chain(
    store: &Arc<dyn ObjectStore>,
    layout: &Layout,
    me: &Holder,
    log: Option<&NodeLog>,
    root: &RootRecord,
    settle_bound: Duration,
    now_ms: u64,
) -> Result<Tail> {
    let Some(pointer) = &root.log else {
        return Ok(Tail::default());
    };
    let lane = &pointer.lane;
    let own = lane.node == me.node && lane.session == me.session;
    if own {
        return own_records(store, layout, log, root, pointer, settle_bound).await;
    }
    if let Some(log) = log {
        return sealed_records(store, layout, log, root, pointer, now_ms).await;
    }
    // No log of our own (the cell mode) reading a log-mode root.
    seal_and_read_records(store, layout, me, root, pointer, now_ms).await
}

/// The records past the chain in this session's own lane: every slot
/// reserved so far is waited for until it is decided, then the records
/// in the slots from the pointer (or the collected floor) up to the
/// acknowledged end are read. Nothing is sealed: the lane is ours.
async fn own_records(
    store: &Arc<dyn ObjectStore>,
    layout: &Layout,
    log: Option<&NodeLog>,
    root: &RootRecord,
    pointer: &LogPointer,
    settle_bound: Duration,
) -> Result<Tail> {
    let lane = &pointer.lane;
    let acked_below = settle_own_lane(log, lane, settle_bound).await?;
    // Slots below the collected floor hold no record of this Cell
    // past its chain (the collector keeps every held slot).
    let from = pointer.from_seq.max(
        log.and_then(|log| log.lane(lane))
            .map_or(0, |lane| lane.collected_below()),
    );
    let records = index_cell_records(store, layout, lane, from..acked_below, root).await?;
    let records = read_indexed(store, layout, lane, &records)
        .await
        .map_err(log_error)?;
    let records = check_tail(root, records.into_iter().map(|(_, e, b)| (e, b)).collect())?;
    Ok(Tail {
        records,
        sealed: None,
    })
}

/// Waits (up to `settle_bound`) until every slot reserved so far in this
/// session's `lane` is decided, and returns the slot below which all are
/// acknowledged. A slot still in doubt could land later, so it fails
/// (retryable) rather than let activation build on a state that may miss
/// it; a lane a successor sealed means the lease is lost.
async fn settle_own_lane(
    log: Option<&NodeLog>,
    lane: &LaneId,
    settle_bound: Duration,
) -> Result<u64> {
    let writer = log
        .and_then(|log| log.lane(lane))
        .ok_or_else(|| Error::Closed(format!("lane {lane:?} is not one of this session's")))?
        .writer()
        .clone();
    let verdict = writer
        .settled(settle_bound)
        .await
        .ok_or_else(|| Error::Unknown {
            reason: format!(
                "this node's log lane {} still has a segment in doubt; retry once the store answers",
                lane.lane
            ),
        })?;
    if verdict.sealed_at.is_some() {
        return Err(Error::LeaseLost {
            reason: format!(
                "this session's lane {} was sealed by a successor",
                lane.lane
            ),
        });
    }
    Ok(verdict.acked_below)
}

/// Where in `lane`'s slots `seqs` the records of `root`'s Cell are, in
/// order (by slot, then first TXID), from the slots' indexes alone.
async fn index_cell_records(
    store: &Arc<dyn ObjectStore>,
    layout: &Layout,
    lane: &LaneId,
    seqs: std::ops::Range<u64>,
    root: &RootRecord,
) -> Result<Vec<Indexed>> {
    // The lane's chunk indexes, then the rest of its slots' own
    // indexes, in parallel: a replay budget of many segments stays a
    // few hundred GETs.
    let indexed = index_slots(store, layout, lane, seqs, None)
        .await
        .map_err(log_error)?;
    let mut records: Vec<Indexed> = indexed
        .slots
        .into_iter()
        .flat_map(|slot| {
            let (seq, index_len) = (slot.seq, slot.index_len);
            slot.entries
                .into_iter()
                .filter(|entry| entry.cell_id == root.cell_id)
                .map(move |entry| Indexed {
                    seq,
                    entry,
                    index_len,
                })
        })
        .collect();
    records.sort_by_key(|r| (r.seq, r.entry.min_txid));
    Ok(records)
}

/// The records past the chain in another (dead) session's lane, read
/// through this node's log: it seals the lane and indexes it once for
/// every takeover from it.
async fn sealed_records(
    store: &Arc<dyn ObjectStore>,
    layout: &Layout,
    log: &NodeLog,
    root: &RootRecord,
    pointer: &LogPointer,
    now_ms: u64,
) -> Result<Tail> {
    let lane = &pointer.lane;
    // One index of the dead lane serves every takeover from it.
    let index = log.sealed_index(lane, now_ms).await.map_err(log_error)?;
    let records = read_indexed(
        store,
        layout,
        lane,
        index.records_of(&root.cell_id, pointer.from_seq),
    )
    .await
    .map_err(log_error)?;
    let records = check_tail(root, records.into_iter().map(|(_, e, b)| (e, b)).collect())?;
    Ok(Tail {
        records,
        sealed: Some(lane.clone()),
    })
}

/// The records past the chain in another (dead) session's lane when this
/// node keeps no log (the cell mode): seals the lane itself, then reads
/// the counted slots from the pointer on, one at a time.
async fn seal_and_read_records(
    store: &Arc<dyn ObjectStore>,
    layout: &Layout,
    me: &Holder,
    root: &RootRecord,
    pointer: &LogPointer,
    now_ms: u64,
) -> Result<Tail> {
    let lane = &pointer.lane;
    seal_lane(store.as_ref(), layout, lane, me, now_ms)
        .await
        .map_err(log_error)?;
    let read = read_lane(store.as_ref(), layout, lane)
        .await
        .map_err(log_error)?;
    let seqs: Vec<u64> = read
        .counted
        .into_iter()
        .filter(|seq| *seq >= pointer.from_seq)
        .collect();
    let sealed = Some(lane.clone());
    let records = read_records(store.as_ref(), layout, lane, &seqs, &root.cell_id)
        .await
        .map_err(log_error)?;
    let records = check_tail(root, records.into_iter().map(|(_, e, b)| (e, b)).collect())?;
    Ok(Tail { records, sealed })
}

/// What replay found.
#[derive(Debug, Default)]
pub(crate) struct Tail {
    /// The records past the chain, oldest first.
    pub records: Vec<(Entry, Bytes)>,
    /// The dead session's lane that was sealed (or found sealed), if any.
    pub sealed: Option<cellfleet_authority::LaneId>,
}

/// Keeps the records past `root`'s TXID (those at or below it are in the
/// chain already) and checks they continue it without a gap or overlap.
pub(crate) fn check_tail(
    root: &RootRecord,
    records: Vec<(Entry, Bytes)>,
) -> Result<Vec<(Entry, Bytes)>> {
    let mut next = root.txid + 1;
    let mut kept = Vec::new();
    for (entry, bytes) in records {
        if entry.cell_id != root.cell_id || entry.max_txid <= root.txid {
            continue;
        }
        if entry.min_txid != next || entry.max_txid < entry.min_txid {
            return Err(Error::Store(cellfleet_store::Error::Corrupt {
                key: format!("log of cell {}", root.cell_id),
                reason: format!(
                    "a record covers txids {}..={} where {} was expected next",
                    entry.min_txid.0, entry.max_txid.0, next.0
                ),
            }));
        }
        next = entry.max_txid + 1;
        kept.push((entry, bytes));
    }
    Ok(kept)
}

pub(crate) fn log_error(error: cellfleet_nodelog::store::Error) -> Error {
    match error {
        cellfleet_nodelog::store::Error::Store(error) => Error::Store(error),
        cellfleet_nodelog::store::Error::Corrupt { key, source } => {
            Error::Store(cellfleet_store::Error::Corrupt {
                key,
                reason: source.to_string(),
            })
        }
        other => Error::Closed(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellfleet_authority::{
        transition, CellId, Epoch, Liveness, NewCell, NodeId, SessionId, Txid,
    };
    use proptest::prelude::*;

    fn root_at(txid: u64) -> RootRecord {
        let cell = CellId::for_kind_key("kv", b"k");
        let me = Holder {
            node: NodeId::new("n1").unwrap(),
            session: SessionId::from_u128(1),
        };
        let mut root = transition::create(
            &NewCell {
                cell_id: cell.clone(),
                kind: "kv".into(),
                key: None,
                page_size: 4096,
                schema_version: 0,
            },
            &me,
            1,
        );
        root.txid = Txid(txid);
        root
    }

    fn entry(cell: &CellId, min: u64, max: u64) -> (Entry, Bytes) {
        (
            Entry {
                cell_id: cell.clone(),
                epoch: Epoch::FIRST,
                min_txid: Txid(min),
                max_txid: Txid(max),
                body_range: 0..0,
                bytes_crc: 0,
                file_checksum: 0,
                post_apply_checksum: 0,
                command_ids: Vec::new(),
            },
            Bytes::new(),
        )
    }

    mod model {
        //! A model of one Cell across node sessions over a create-only key
        //! space (DESIGN.md §9): writers with pipelined, possibly lost
        //! segment PUTs, other Cells' segments in the same lane, lazy
        //! checkpoints with the actor's pointer rule, crashes (also between
        //! the takeover CAS and its checkpoint), successors that seal and
        //! replay with [`check_tail`], zombies whose PUTs land late, and
        //! every session's collector (zombies' too) deleting below its
        //! lane's holds.
        use super::*;
        use cellfleet_authority::{LaneId, LogPointer, LtxRef};
        use cellfleet_nodelog::lane::{verdict, SlotState};
        use cellfleet_nodelog::seal::{log_end, plan, Listed, Plan};
        use std::collections::{BTreeMap, BTreeSet};

        #[derive(Clone, Copy, Debug)]
        enum Slot {
            /// A segment, with this Cell's record (txids) if it holds one.
            Segment(Option<(u64, u64)>),
            Seal,
        }

        #[derive(Clone, Debug)]
        enum Step {
            /// The owner executes a group of the Cell (1-2 TXIDs).
            Write(u64),
            /// Another Cell's group goes into the owner's lane.
            Other,
            /// A PUT in flight (any session's) lands, its reply heard or lost.
            Land(usize, bool),
            /// The owner checkpoints what its writer acknowledged.
            Checkpoint,
            /// The owner dies; a successor takes over (crashing before its
            /// checkpoint when the flag says so).
            Takeover(bool),
            /// A session's collector (the owner's, or a zombie's) raises its
            /// lane's floor to the lowest held slot and deletes below it.
            Collect(usize),
        }

        fn step() -> impl Strategy<Value = Step> {
            prop_oneof![
                4 => (1u64..3).prop_map(Step::Write),
                2 => Just(Step::Other),
                5 => (0..16usize, any::<bool>()).prop_map(|(i, heard)| Step::Land(i, heard)),
                2 => Just(Step::Checkpoint),
                1 => any::<bool>().prop_map(Step::Takeover),
                2 => (0..4usize).prop_map(Step::Collect),
            ]
        }

        struct Session {
            me: Holder,
            lane: LaneId,
            next_seq: u64,
            /// What the writer knows of its slots.
            known: BTreeMap<u64, SlotState>,
            /// The Cell's groups it wrote: (slot, min, max).
            groups: Vec<(u64, u64, u64)>,
            /// PUTs not landed yet: (slot, content).
            inflight: Vec<(u64, Option<(u64, u64)>)>,
            /// The next TXID its engine assigns.
            exec: u64,
            /// The collector's hold for the Cell (`Holds` in `log.rs`).
            hold: Option<u64>,
        }

        impl Session {
            fn new(n: u128, exec: u64) -> Self {
                let me = Holder {
                    node: NodeId::new(format!("n{n}")).unwrap(),
                    session: SessionId::from_u128(n + 1),
                };
                let lane = LaneId {
                    node: me.node.clone(),
                    session: me.session,
                    lane: 0,
                };
                Session {
                    me,
                    lane,
                    next_seq: 0,
                    known: BTreeMap::new(),
                    groups: Vec::new(),
                    inflight: Vec::new(),
                    exec,
                    hold: None,
                }
            }

            fn acked_below(&self) -> u64 {
                verdict(0, &self.known).acked_below
            }

            /// The highest TXID this writer acknowledged.
            fn acked_txid(&self) -> u64 {
                let below = self.acked_below();
                self.groups
                    .iter()
                    .filter(|g| g.0 < below)
                    .map(|g| g.2)
                    .max()
                    .unwrap_or(0)
            }
        }

        fn file(root: &RootRecord, min: u64, max: u64) -> LtxRef {
            LtxRef {
                key: format!(
                    "p/cells/{}/ltx/{:016x}/{min:016x}-{max:016x}-ab.ltx",
                    root.cell_id,
                    root.epoch.get()
                ),
                min_txid: Txid(min),
                max_txid: Txid(max),
                size: 1,
                file_checksum: max,
                post_apply_checksum: 0x1000 + max,
            }
        }

        /// A PUT of `content` reaching slot `seq`: create-only.
        fn land(
            lane: &mut BTreeMap<u64, Slot>,
            seq: u64,
            content: Option<(u64, u64)>,
        ) -> SlotState {
            match lane.get(&seq) {
                None => {
                    lane.insert(seq, Slot::Segment(content));
                    SlotState::Written
                }
                Some(Slot::Seal) => SlotState::Sealed,
                Some(Slot::Segment(_)) => SlotState::Written,
            }
        }

        /// What a listing of `lane` shows.
        fn listing(lane: &BTreeMap<u64, Slot>) -> BTreeMap<u64, Listed> {
            lane.iter()
                .map(|(q, s)| {
                    let listed = match s {
                        Slot::Seal => Listed::Seal,
                        Slot::Segment(_) => Listed::Segment,
                    };
                    (*q, listed)
                })
                .collect()
        }

        fn entry_of(cell: &CellId, (min, max): (u64, u64)) -> (Entry, Bytes) {
            let (mut entry, bytes) = super::entry(cell, min, max);
            entry.post_apply_checksum = 0x1000 + max;
            (entry, bytes)
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]
            /// No acknowledged record is ever lost, nothing written after a
            /// seal counts, every replay continues the chain, and a root's
            /// pointer never skips a record it does not cover.
            #[test]
            fn acknowledged_records_survive_every_takeover(steps in proptest::collection::vec(step(), 1..80)) {
                let cell = CellId::for_kind_key("kv", b"k");
                let mut lanes: BTreeMap<u128, BTreeMap<u64, Slot>> = BTreeMap::new();
                // Each lane's floor marker.
                let mut floors: BTreeMap<u128, u64> = BTreeMap::new();
                let mut sessions = vec![Session::new(0, 1)];
                lanes.insert(0, BTreeMap::new());
                let mut root = transition::create(
                    &NewCell { cell_id: cell.clone(), kind: "kv".into(), key: None, page_size: 4096, schema_version: 0 },
                    &sessions[0].me,
                    1,
                );
                root.log = Some(LogPointer { lane: sessions[0].lane.clone(), from_seq: 0 });
                // The highest TXID any writer acknowledged so far.
                let mut acked_ever = 0u64;
                // Whether the current owner may serve (its pointer is in place).
                let mut serving = true;
                // Groups (session, min, max) in a root's chain: checkpointed
                // by their writer or replayed by a successor.
                let mut durable: BTreeSet<(usize, u64, u64)> = BTreeSet::new();
                for step in steps {
                    let cur = sessions.len() - 1;
                    match step {
                        Step::Write(n) if serving => {
                            let s = &mut sessions[cur];
                            let (min, max) = (s.exec, s.exec + n - 1);
                            s.exec = max + 1;
                            let seq = s.next_seq;
                            s.next_seq += 1;
                            s.known.insert(seq, SlotState::InFlight);
                            s.groups.push((seq, min, max));
                            s.inflight.push((seq, Some((min, max))));
                            // Held from the reservation on (commit_lane).
                            s.hold = Some(s.hold.map_or(seq, |held| held.min(seq)));
                        }
                        Step::Other if serving => {
                            let s = &mut sessions[cur];
                            let seq = s.next_seq;
                            s.next_seq += 1;
                            s.known.insert(seq, SlotState::InFlight);
                            s.inflight.push((seq, None));
                        }
                        Step::Land(i, heard) => {
                            let candidates: Vec<(usize, usize)> = sessions
                                .iter()
                                .enumerate()
                                .flat_map(|(si, s)| (0..s.inflight.len()).map(move |pi| (si, pi)))
                                .collect();
                            if candidates.is_empty() {
                                continue;
                            }
                            let (si, pi) = candidates[i % candidates.len()];
                            let (seq, content) = sessions[si].inflight.remove(pi);
                            let state = land(lanes.get_mut(&(si as u128)).unwrap(), seq, content);
                            if heard {
                                sessions[si].known.insert(seq, state);
                            } else {
                                // Lost reply: the writer resends later
                                // (same bytes); model the resend's answer.
                                sessions[si].known.insert(seq, SlotState::InDoubt);
                                sessions[si].inflight.push((seq, content));
                            }
                        }
                        Step::Checkpoint if serving => {
                            let s = &sessions[cur];
                            let below = s.acked_below();
                            let covered: Vec<(u64, u64, u64)> = s.groups.iter().filter(|g| g.0 < below && g.2 > root.txid.0).copied().collect();
                            let Some(last) = covered.last().copied() else { continue };
                            for g in &covered {
                                durable.insert((cur, g.1, g.2));
                            }
                            let nothing_after = s.groups.iter().all(|g| g.0 < below);
                            // The actor's rule (maybe_checkpoint).
                            let from_seq = if nothing_after { s.next_seq } else { last.0 };
                            // The landed checkpoint sets the hold (update_hold).
                            let hold = if nothing_after { None } else { Some(from_seq) };
                            sessions[cur].hold = hold;
                            let s = &sessions[cur];
                            let delta = file(&root, root.txid.0 + 1, last.2);
                            root = transition::propose(&root, &s.me, root.epoch, Some(delta), None,
                                Some(LogPointer { lane: s.lane.clone(), from_seq }), 2).unwrap();
                        }
                        Step::Collect(i) => {
                            let si = i % sessions.len();
                            let s = &sessions[si];
                            let floor = s.hold.map_or(s.acked_below(), |held| held.min(s.acked_below()));
                            let marker = floors.entry(si as u128).or_insert(0);
                            if floor > *marker {
                                *marker = floor;
                                let lane = lanes.get_mut(&(si as u128)).unwrap();
                                let doomed: Vec<u64> = lane.range(..floor).map(|(q, _)| *q).collect();
                                for q in doomed {
                                    prop_assert!(!matches!(lane.get(&q), Some(Slot::Seal)), "a seal was collected");
                                    lane.remove(&q);
                                }
                            }
                        }
                        Step::Takeover(crash_between) => {
                            acked_ever = acked_ever.max(sessions[cur].acked_txid());
                            let n = sessions.len() as u128;
                            let mut next = Session::new(n, 0);
                            lanes.insert(n, BTreeMap::new());
                            root = transition::takeover(&root, Liveness::Dead, &next.me, 3).unwrap();
                            root = transition::point_if_unpointed(root, &next.me, Some(LogPointer { lane: next.lane.clone(), from_seq: 0 })).unwrap();
                            let pointer = root.log.clone().unwrap();
                            let pointed = lanes.keys().copied().find(|k| {
                                sessions.get(*k as usize).is_some_and(|s| s.lane == pointer.lane) || (*k == n && next.lane == pointer.lane)
                            }).unwrap();
                            // Seal the pointed lane (idempotent), then read it
                            // from its floor on.
                            let floor = floors.get(&pointed).copied().unwrap_or(0);
                            let lane = lanes.get_mut(&pointed).unwrap();
                            if pointed != n {
                                if let Plan::SealAt(seq) = plan(floor, &listing(lane)) {
                                    lane.insert(seq, Slot::Seal);
                                }
                            }
                            let listed = listing(lane);
                            let end = if pointed == n { 0 } else { log_end(floor, &listed).unwrap() };
                            let records: Vec<_> = (pointer.from_seq.max(floor)..end)
                                .filter_map(|q| match lane.get(&q) { Some(Slot::Segment(Some(r))) => Some(entry_of(&cell, *r)), _ => None })
                                .collect();
                            let writer = pointed as usize;
                            let tail = check_tail(&root, records);
                            prop_assert!(tail.is_ok(), "replay refused: {:?}", tail.err());
                            let tail = tail.unwrap();
                            let recovered = tail.last().map_or(root.txid, |(e, _)| e.max_txid).0;
                            for (e, _) in &tail {
                                durable.insert((writer, e.min_txid.0, e.max_txid.0));
                            }
                            prop_assert!(recovered >= acked_ever,
                                "acknowledged txid {} lost: recovered {}", acked_ever, recovered);
                            next.exec = recovered + 1;
                            if crash_between {
                                // Died after the takeover CAS, before its
                                // checkpoint: it served nothing.
                                sessions.push(next);
                                serving = false;
                                continue;
                            }
                            if recovered > root.txid.0 {
                                let delta = file(&root, root.txid.0 + 1, recovered);
                                root = transition::propose(&root, &next.me, root.epoch, Some(delta), None,
                                    Some(LogPointer { lane: next.lane.clone(), from_seq: next.next_seq }), 4).unwrap();
                            } else {
                                root = transition::propose(&root, &next.me, root.epoch, None, None,
                                    Some(LogPointer { lane: next.lane.clone(), from_seq: next.next_seq }), 4).unwrap();
                            }
                            acked_ever = recovered.max(acked_ever);
                            sessions.push(next);
                            serving = true;
                        }
                        _ => {}
                    }
                }
                // Every zombie's PUTs land at last, every reply heard: what
                // any replaced session acknowledged is in a chain.
                let last = sessions.len() - 1;
                for (si, s) in sessions.iter_mut().enumerate().take(last) {
                    let lane = lanes.get_mut(&(si as u128)).unwrap();
                    for (seq, content) in std::mem::take(&mut s.inflight) {
                        let state = land(lane, seq, content);
                        s.known.insert(seq, state);
                    }
                    let below = s.acked_below();
                    for g in s.groups.iter().filter(|g| g.0 < below) {
                        // Replaced sessions only count once a successor
                        // served (a crash before any checkpoint leaves the
                        // last owner's records to the next takeover).
                        if si + 1 < last || serving {
                            prop_assert!(durable.contains(&(si, g.1, g.2)),
                                "session {} acknowledged txids {}..={} that no chain holds", si, g.1, g.2);
                        }
                    }
                }
            }
        }
    }

    proptest! {
        /// Whatever the log holds, the kept tail starts right after the
        /// root and is contiguous; records already in the chain and other
        /// Cells' records are skipped; a gap or an overlap is refused.
        #[test]
        fn the_tail_continues_the_chain_or_is_refused(
            root_txid in 0u64..6,
            spans in proptest::collection::vec((1u64..10, 0u64..3, any::<bool>()), 0..8),
        ) {
            let root = root_at(root_txid);
            let other = CellId::for_kind_key("kv", b"other");
            let records: Vec<_> = spans
                .iter()
                .map(|(min, len, mine)| entry(if *mine { &root.cell_id } else { &other }, *min, min + len))
                .collect();
            let mut next = root_txid + 1;
            let mut expected_ok = true;
            for (e, _) in &records {
                if e.cell_id != root.cell_id || e.max_txid.0 <= root_txid {
                    continue;
                }
                if e.min_txid.0 != next {
                    expected_ok = false;
                    break;
                }
                next = e.max_txid.0 + 1;
            }
            match check_tail(&root, records) {
                Ok(kept) => {
                    prop_assert!(expected_ok);
                    let mut at = root_txid + 1;
                    for (e, _) in kept {
                        prop_assert_eq!(&e.cell_id, &root.cell_id);
                        prop_assert_eq!(e.min_txid.0, at);
                        at = e.max_txid.0 + 1;
                    }
                }
                Err(_) => prop_assert!(!expected_ok),
            }
        }
    }
}
