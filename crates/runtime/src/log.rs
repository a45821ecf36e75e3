//! The node log's runtime side (DESIGN.md §9): one committer per lane that turns every Cell group pending on the lane into one segment PUT.
//!
//! A Cell actor hands its group's LTX delta to its lane ([`NodeLog::submit`])
//! and gets the slot the group went into; it then waits for the lane's
//! verdict on that slot ([`cellfleet_nodelog::store::LaneWriter::fate`]):
//! a reply leaves only once the slot and every earlier slot of the lane,
//! from the session's first, hold this session's bytes.
//!
//! The committer writes whatever is pending on its lane (bounded by
//! `segment_bytes_max`) when [`BatchRule::next`](cellfleet_nodelog::batch::BatchRule::next) says so: at once on an
//! idle lane, so a lone group costs one PUT and no wait; while segments
//! are in flight, only once the batch is worth a PUT of its own (commands
//! or bytes) or its oldest group has waited `linger_ms`, and never past
//! `segments_inflight_max` in flight. Each segment PUT runs in a task of
//! its own and is resent with the same bytes until it lands or finds a
//! seal: a slot is never abandoned while its PUT could still land.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use cellfleet_authority::{CellId, Clock, Epoch, Holder, LaneId, Layout, LogPointer, Txid};
use cellfleet_nodelog::batch::{LaneLoad, Next};
use cellfleet_nodelog::segment::{encode_segment, Part};
use cellfleet_nodelog::store::{index_sealed_lane, LaneWriter, SealedIndex, WriterConfig};
use cellfleet_store::ObjectStore;
use tokio::sync::{mpsc, oneshot};

use crate::config::{GcSettings, LogSettings};
use crate::metrics::Metrics;

/// One Cell group for the log.
#[derive(Clone, Debug)]
pub struct Record {
    /// The Cell.
    pub cell_id: CellId,
    /// The epoch that wrote it.
    pub epoch: Epoch,
    /// First TXID in the delta.
    pub min_txid: Txid,
    /// Last TXID in the delta.
    pub max_txid: Txid,
    /// The delta's own checksum (LTX trailer).
    pub file_checksum: u64,
    /// The Cell's rolling checksum after applying it.
    pub post_apply_checksum: u64,
    /// The group's command ids.
    pub command_ids: Vec<[u8; 16]>,
    /// The encoded LTX delta.
    pub bytes: Arc<Vec<u8>>,
}

struct Submitted {
    record: Record,
    /// The slot the record went into, or `None` once the lane is sealed.
    slot: oneshot::Sender<Option<u64>>,
}

/// Which slots of a lane hold records that some root may still need
/// (pure): per Cell, the lowest slot of a record not yet known to be in its
/// root's chain. Collection deletes only below the lowest of them (and
/// below the lane's acknowledged prefix).
///
/// Holds err on the side of keeping: a slot is held from the moment it is
/// reserved for a record, and released only by the Cell's actor after a
/// checkpoint CAS it knows landed. An ambiguous or failed checkpoint, or a
/// Cell that failed, keeps its hold.
#[derive(Debug, Default)]
pub struct Holds {
    by_cell: HashMap<CellId, u64>,
}

impl Holds {
    /// Slot `seq` holds a record of `cell`.
    pub fn hold(&mut self, cell: &CellId, seq: u64) {
        self.by_cell
            .entry(cell.clone())
            .and_modify(|held| *held = (*held).min(seq))
            .or_insert(seq);
    }

    /// After a checkpoint `cell`'s actor knows landed: its records still
    /// past the root start at `from` (`None`: it has none).
    pub fn set(&mut self, cell: &CellId, from: Option<u64>) {
        match from {
            Some(seq) => {
                self.by_cell.insert(cell.clone(), seq);
            }
            None => {
                self.by_cell.remove(cell);
            }
        }
    }

    /// Below this slot nothing is needed: the lowest hold, at most
    /// `acked_below` (slots past the acknowledged prefix may still be
    /// written).
    pub fn floor(&self, acked_below: u64) -> u64 {
        self.by_cell
            .values()
            .copied()
            .min()
            .map_or(acked_below, |held| held.min(acked_below))
    }
}

/// One lane of this session.
#[derive(Debug)]
pub struct Lane {
    writer: Arc<LaneWriter>,
    tx: mpsc::UnboundedSender<Submitted>,
    holds: Arc<Mutex<Holds>>,
    /// Every slot below was collected (or is being deleted).
    collected_below: Arc<AtomicU64>,
}

impl std::fmt::Debug for Submitted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Submitted")
            .field("cell", &self.record.cell_id)
            .finish_non_exhaustive()
    }
}

impl Lane {
    /// The lane's writer (its verdict, its next slot).
    pub fn writer(&self) -> &Arc<LaneWriter> {
        &self.writer
    }

    /// Records the slot where `cell`'s records still past its root start
    /// (`None`: none), after a checkpoint known to have landed.
    pub fn set_hold(&self, cell: &CellId, from: Option<u64>) {
        self.holds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .set(cell, from);
    }

    /// Slots below this were collected: a reader of this lane starts here.
    pub fn collected_below(&self) -> u64 {
        self.collected_below.load(Ordering::Acquire)
    }

    /// The pointer a root gets for a Cell of this lane with no record in
    /// flight: every record submitted from now on lands at or after it.
    pub fn pointer_here(&self) -> LogPointer {
        LogPointer {
            lane: self.writer.lane().clone(),
            from_seq: self.writer.next_seq(),
        }
    }
}

/// Most dead lanes whose index a node keeps at once.
const SEALED_INDEXES_MAX: usize = 64;

type SealedSlot = Arc<tokio::sync::OnceCell<Arc<SealedIndex>>>;

/// This session's lanes, and the indexes of dead sessions' lanes it sealed.
#[derive(Debug)]
pub struct NodeLog {
    me: Holder,
    lanes: Vec<Lane>,
    store: Arc<dyn ObjectStore>,
    layout: Layout,
    /// One index per dead lane, built once (single flight) and shared by
    /// every takeover of its Cells and by its flush.
    sealed: Mutex<HashMap<LaneId, SealedSlot>>,
    metrics: Arc<Metrics>,
}

impl NodeLog {
    /// Starts one committer per lane for session `me`, and one collector
    /// per lane when `gc` is enabled.
    pub fn start(
        store: Arc<dyn ObjectStore>,
        layout: Layout,
        me: Holder,
        settings: &LogSettings,
        gc: &GcSettings,
        clock: Arc<dyn Clock>,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        let config = WriterConfig {
            // Never give up on a slot while the session lives: its PUT may
            // still land, so it is resent until it does or finds a seal.
            attempts_max: u32::MAX,
            ..WriterConfig::default()
        };
        let lanes = (0..settings.lanes.max(1))
            .map(|number| {
                let lane = LaneId {
                    node: me.node.clone(),
                    session: me.session,
                    lane: number,
                };
                let writer = LaneWriter::new(store.clone(), layout.clone(), lane, 0, config);
                let (tx, rx) = mpsc::unbounded_channel();
                let holds = Arc::new(Mutex::new(Holds::default()));
                let collected_below = Arc::new(AtomicU64::new(0));
                tokio::spawn(commit_lane(
                    writer.clone(),
                    rx,
                    holds.clone(),
                    settings.clone(),
                    clock.clone(),
                    metrics.clone(),
                ));
                if gc.enabled {
                    tokio::spawn(collect_lane(
                        Arc::downgrade(&writer),
                        store.clone(),
                        layout.clone(),
                        holds.clone(),
                        collected_below.clone(),
                        gc.clone(),
                        metrics.clone(),
                    ));
                }
                Lane {
                    writer,
                    tx,
                    holds,
                    collected_below,
                }
            })
            .collect();
        Arc::new(NodeLog {
            me,
            lanes,
            store,
            layout,
            sealed: Mutex::new(HashMap::new()),
            metrics,
        })
    }

    /// Seals the dead session's `lane` (once) and returns its index, built
    /// once for every takeover from it.
    pub async fn sealed_index(
        &self,
        lane: &LaneId,
        now_ms: u64,
    ) -> Result<Arc<SealedIndex>, cellfleet_nodelog::store::Error> {
        let slot = {
            let mut sealed = self.sealed.lock().unwrap_or_else(|e| e.into_inner());
            if !sealed.contains_key(lane) && sealed.len() >= SEALED_INDEXES_MAX {
                // Forget a built one (a later takeover from it rebuilds).
                if let Some(old) = sealed
                    .iter()
                    .find(|(_, slot)| slot.initialized())
                    .map(|(lane, _)| lane.clone())
                {
                    sealed.remove(&old);
                }
            }
            sealed.entry(lane.clone()).or_default().clone()
        };
        slot.get_or_try_init(|| async {
            let index =
                index_sealed_lane(&self.store, &self.layout, lane, &self.me, now_ms).await?;
            self.metrics
                .log_chunk_indexes_read_total
                .fetch_add(index.chunk_indexes_read, Ordering::Relaxed);
            self.metrics
                .log_slot_indexes_read_total
                .fetch_add(index.slot_indexes_read, Ordering::Relaxed);
            Ok(Arc::new(index))
        })
        .await
        .cloned()
    }

    /// This session.
    pub fn holder(&self) -> &Holder {
        &self.me
    }

    /// The lane of `cell` (fixed for this session).
    pub fn lane_of(&self, cell: &CellId) -> &Lane {
        let digest = crate::config::cell_digest(cell);
        &self.lanes[(digest % self.lanes.len() as u64) as usize]
    }

    /// Resolves once any lane of this session is found sealed: a
    /// successor declared the session dead (it was paused or cut off past
    /// its lease), so nothing it writes from now on counts.
    pub async fn wait_sealed(&self) {
        let mut waits = tokio::task::JoinSet::new();
        for lane in &self.lanes {
            let mut verdict = lane.writer.verdict();
            waits.spawn(async move {
                // A writer gone (the log dropped) is no seal: wait forever.
                if verdict.wait_for(|v| v.sealed_at.is_some()).await.is_err() {
                    std::future::pending::<()>().await;
                }
            });
        }
        // The first sealed lane decides; the rest are aborted with the set.
        let _ = waits.join_next().await;
    }

    /// Waits (at most `bound`) until every sealed lane has decided the
    /// groups in flight below its seal (their PUTs answered).
    pub async fn settle(&self, bound: Duration) {
        let waits = self.lanes.iter().map(|lane| {
            let mut verdict = lane.writer.verdict();
            async move {
                let _ = verdict
                    .wait_for(|v| v.sealed_at.is_none_or(|at| v.acked_below >= at))
                    .await;
            }
        });
        let all = async {
            for wait in waits {
                wait.await;
            }
        };
        let _ = tokio::time::timeout(bound, all).await;
    }

    /// The lane named `lane`, if it is one of this session's.
    pub fn lane(&self, lane: &LaneId) -> Option<&Lane> {
        self.lanes.iter().find(|l| l.writer.lane() == lane)
    }

    /// Hands `record` to its lane; the receiver gets its slot (`None` if
    /// the lane is sealed or the node stopped).
    pub fn submit(&self, record: Record) -> oneshot::Receiver<Option<u64>> {
        let (slot, rx) = oneshot::channel();
        let lane = self.lane_of(&record.cell_id);
        if let Err(refused) = lane.tx.send(Submitted { record, slot }) {
            let _ = refused.0.slot.send(None);
        }
        rx
    }
}

/// Deletes the lane's segments that no root can need any more, oldest
/// first, once they have been unneeded for `min_age_ms`: every
/// `interval_ms` the lane's floor of holds is noted, and the newest floor
/// noted at least `min_age_ms` ago is collected up to. Floors only rise
/// (a new hold is always at or past the acknowledged prefix), so a floor
/// noted earlier stays safe later. Stops once the lane is sealed or the
/// session's log is gone.
async fn collect_lane(
    writer: Weak<LaneWriter>,
    store: Arc<dyn ObjectStore>,
    layout: Layout,
    holds: Arc<Mutex<Holds>>,
    collected_below: Arc<AtomicU64>,
    gc: GcSettings,
    metrics: Arc<Metrics>,
) {
    let interval = Duration::from_millis(gc.interval_ms.max(1));
    let min_age = Duration::from_millis(gc.min_age_ms);
    let mut noted: VecDeque<(Instant, u64)> = VecDeque::new();
    let mut held = GaugeShare::new(&metrics.log_lane_held_segments);
    loop {
        tokio::time::sleep(interval).await;
        let Some(writer) = writer.upgrade() else {
            return;
        };
        let verdict = *writer.verdict().borrow();
        if verdict.sealed_at.is_some() {
            return;
        }
        let floor = holds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .floor(verdict.acked_below);
        held.set(i64::try_from(verdict.acked_below - floor).unwrap_or(i64::MAX));
        let now = Instant::now();
        if noted.back().is_none_or(|(_, last)| floor > *last) {
            noted.push_back((now, floor));
        }
        let mut ready = None;
        while noted
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) >= min_age)
        {
            ready = noted.pop_front();
        }
        let from = collected_below.load(Ordering::Acquire);
        let Some((at, target)) = ready.filter(|(_, target)| *target > from) else {
            continue;
        };
        let to = target.min(from.saturating_add(gc.segments_per_round_max.max(1)));
        if to < target {
            // The rest goes next round.
            noted.push_front((at, target));
        }
        match cellfleet_nodelog::store::collect(store.as_ref(), &layout, writer.lane(), from, to)
            .await
        {
            Ok(deleted) => {
                collected_below.store(to, Ordering::Release);
                metrics
                    .gc_segments_deleted_total
                    .fetch_add(deleted, Ordering::Relaxed);
            }
            Err(error) => {
                metrics.gc_failures_total.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(lane = writer.lane().lane, %error, "collecting log segments failed; retrying next round");
            }
        }
    }
}

/// One lane's share of a node-wide gauge: `set` moves the gauge by the
/// change of the share, and dropping the share takes it back out, so every
/// way a lane's task ends leaves the gauge true.
struct GaugeShare<'a> {
    gauge: &'a AtomicI64,
    share: i64,
}

impl<'a> GaugeShare<'a> {
    fn new(gauge: &'a AtomicI64) -> Self {
        GaugeShare { gauge, share: 0 }
    }

    fn set(&mut self, share: i64) {
        if share != self.share {
            self.gauge.fetch_add(share - self.share, Ordering::Relaxed);
            self.share = share;
        }
    }
}

impl Drop for GaugeShare<'_> {
    fn drop(&mut self) {
        self.set(0);
    }
}

/// The groups waiting on a lane for a segment, oldest first, with what
/// the batch rule counts of them.
#[derive(Default)]
struct Pending {
    groups: VecDeque<(tokio::time::Instant, Submitted)>,
    bytes: usize,
    commands: usize,
}

impl Pending {
    fn push(&mut self, submitted: Submitted) {
        self.bytes += submitted.record.bytes.len();
        self.commands += commands_of(&submitted);
        self.groups
            .push_back((tokio::time::Instant::now(), submitted));
    }

    /// What the batch rule sees, with `inflight` segments of the lane in
    /// flight.
    fn load(&self, inflight: u64) -> LaneLoad {
        LaneLoad {
            inflight,
            pending_records: self.groups.len(),
            pending_commands: self.commands,
            pending_bytes: self.bytes,
            waited_ms: self
                .groups
                .front()
                .map_or(0, |(at, _)| at.elapsed().as_millis() as u64),
        }
    }

    /// The oldest groups up to `bytes_max` (at least one).
    fn take_batch(&mut self, bytes_max: usize) -> Vec<Submitted> {
        let mut batch = Vec::new();
        let mut bytes = 0usize;
        while let Some((_, next)) = self.groups.front() {
            let size = next.record.bytes.len();
            if !batch.is_empty() && bytes + size > bytes_max {
                break;
            }
            bytes += size;
            let (_, next) = self.groups.pop_front().expect("a front was seen");
            self.commands -= commands_of(&next);
            batch.push(next);
        }
        self.bytes -= bytes;
        batch
    }

    /// Tells every waiting group it got no slot (the lane is sealed, or
    /// its writer gone).
    fn refuse_all(&mut self) {
        for (_, submitted) in self.groups.drain(..) {
            let _ = submitted.slot.send(None);
        }
        self.bytes = 0;
        self.commands = 0;
    }
}

fn commands_of(submitted: &Submitted) -> usize {
    submitted.record.command_ids.len().max(1)
}

/// A lane's committer: gathers the groups submitted to it and writes them
/// as segments when [`BatchRule::next`](cellfleet_nodelog::batch::BatchRule::next) says so (pipelined, at most
/// `segments_inflight_max` in flight).
async fn commit_lane(
    writer: Arc<LaneWriter>,
    mut rx: mpsc::UnboundedReceiver<Submitted>,
    holds: Arc<Mutex<Holds>>,
    settings: LogSettings,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
) {
    let rule = settings.batch_rule();
    let mut verdict = writer.verdict();
    let mut pending = Pending::default();
    let mut open = true;
    let mut depth = GaugeShare::new(&metrics.log_lane_pending_records);
    loop {
        while let Ok(next) = rx.try_recv() {
            pending.push(next);
        }
        let now = *verdict.borrow_and_update();
        if now.sealed_at.is_some() {
            // Nothing written from now on counts: no slot for anyone.
            pending.refuse_all();
        }
        depth.set(pending.groups.len() as i64);
        let inflight = writer.next_seq().saturating_sub(now.acked_below);
        let linger = match rule.next(pending.load(inflight)) {
            Next::Send => {
                let batch = pending.take_batch(settings.segment_bytes_max);
                write_segment(&writer, batch, &holds, clock.as_ref(), &metrics);
                continue;
            }
            Next::Idle if !open => return,
            Next::Idle | Next::WaitForRoom => None,
            Next::Gather { for_ms } => Some(Duration::from_millis(for_ms)),
        };
        // Wait for a new group, a change of the lane's verdict (a segment
        // landed, or a seal) or the end of the linger.
        let arrival = async {
            if open {
                rx.recv().await
            } else {
                std::future::pending().await
            }
        };
        let lingered = async {
            match linger {
                Some(linger) => tokio::time::sleep(linger).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            arrived = arrival => match arrived {
                Some(next) => pending.push(next),
                None => open = false,
            },
            changed = verdict.changed() => {
                if changed.is_err() {
                    // The writer is gone: nothing can be written any more.
                    pending.refuse_all();
                    return;
                }
            }
            () = lingered => {}
        }
    }
}

/// Reserves the lane's next slot for `batch`, holds it for every Cell in
/// it, and starts the segment's PUT; tells each group its slot.
fn write_segment(
    writer: &Arc<LaneWriter>,
    batch: Vec<Submitted>,
    holds: &Mutex<Holds>,
    clock: &dyn Clock,
    metrics: &Arc<Metrics>,
) {
    let Some(seq) = writer.reserve() else {
        for submitted in batch {
            let _ = submitted.slot.send(None);
        }
        return;
    };
    {
        // Held before the PUT is sent: the slot may be acknowledged
        // (and pass the collector's floor) as soon as it lands.
        let mut holds = holds.lock().unwrap_or_else(|e| e.into_inner());
        for submitted in &batch {
            holds.hold(&submitted.record.cell_id, seq);
        }
    }
    let header = writer.header(seq, clock.now_wall_ms());
    let parts: Vec<Part<'_>> = batch
        .iter()
        .map(|s| Part {
            cell_id: s.record.cell_id.clone(),
            epoch: s.record.epoch,
            min_txid: s.record.min_txid,
            max_txid: s.record.max_txid,
            file_checksum: s.record.file_checksum,
            post_apply_checksum: s.record.post_apply_checksum,
            command_ids: s.record.command_ids.clone(),
            bytes: s.record.bytes.as_slice(),
        })
        .collect();
    let encoded = match encode_segment(&header, &parts) {
        Ok(encoded) => encoded,
        Err(error) => {
            // Only a bound can refuse (checked by the batch): the slot
            // stays reserved and is written empty so the lane has no gap.
            tracing::error!(%error, seq, "segment encoding failed; writing it empty");
            drop(parts);
            for submitted in batch {
                let _ = submitted.slot.send(None);
            }
            let empty = encode_segment(&header, &[]).expect("an empty segment encodes");
            writer.write(seq, empty);
            return;
        }
    };
    drop(parts);
    metrics.log_segments_total.fetch_add(1, Ordering::Relaxed);
    metrics.log_segment_records.observe(batch.len() as f64);
    metrics.log_segment_bytes.observe(encoded.len() as f64);
    let started = Instant::now();
    writer.write(seq, encoded);
    for submitted in batch {
        let _ = submitted.slot.send(Some(seq));
    }
    let writer_for_timing = writer.clone();
    let metrics = metrics.clone();
    tokio::spawn(async move {
        if writer_for_timing
            .fate(seq, Duration::from_secs(3600))
            .await
            .is_some()
        {
            metrics
                .log_segment_put_seconds
                .observe_duration(started.elapsed());
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The collectable floor never passes a slot some Cell still holds
        /// nor the acknowledged prefix, and a Cell released by a landed
        /// checkpoint stops holding the floor back.
        #[test]
        fn the_floor_keeps_every_held_slot(
            ops in proptest::collection::vec((0u8..4, 0u64..64, proptest::option::of(0u64..64)), 0..40),
            acked in 0u64..80,
        ) {
            let cells: Vec<CellId> = (0..4u8).map(|n| CellId::for_kind_key("kv", &[n])).collect();
            let mut holds = Holds::default();
            let mut model: HashMap<u8, u64> = HashMap::new();
            for (cell, seq, set) in ops {
                match set {
                    // A reservation holds its slot.
                    None => {
                        holds.hold(&cells[cell as usize], seq);
                        let held = model.entry(cell).or_insert(seq);
                        *held = (*held).min(seq);
                    }
                    // A landed checkpoint sets the Cell's hold exactly.
                    Some(from) if from % 3 == 0 => {
                        holds.set(&cells[cell as usize], None);
                        model.remove(&cell);
                    }
                    Some(from) => {
                        holds.set(&cells[cell as usize], Some(from));
                        model.insert(cell, from);
                    }
                }
                let floor = holds.floor(acked);
                prop_assert!(floor <= acked);
                prop_assert!(model.values().all(|held| floor <= *held));
                prop_assert_eq!(floor, model.values().copied().chain([acked]).min().unwrap());
            }
        }
    }
}
