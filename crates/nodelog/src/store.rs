//! The thin async shells that perform the log's decisions against the object store: a lane writer, a sealer and a reader.
//!
//! * [`LaneWriter`] writes one session's lane: slots are reserved in
//!   sequence and written create-only, several in flight at once, each in a
//!   task of its own (a dropped caller never cuts a PUT in half). A PUT
//!   whose outcome is unknown, or that failed without applying, is sent
//!   again with the *same bytes*; a refused one (412) is settled by reading
//!   the slot: this session's bytes there mean written, a seal means the
//!   lane has ended — except in a slot below the lane's floor, which was
//!   written and collected (see [`crate::seal`] on stale seals). What the
//!   writer knows becomes a [`lane::Verdict`]
//!   ([`lane::verdict`]), published on a watch channel: replies wait on it.
//! * [`seal_lane`] ends a dead session's lane ([`seal::plan`]), idempotent
//!   under racing successors.
//! * [`read_lane`] lists a sealed lane and returns what a reader counts:
//!   the slots from the floor to its first seal ([`seal::log_end`]); [`read_records`]
//!   fetches one Cell's records from them with ranged GETs.
//! * [`collect`] deletes a written prefix of a session's own lane after
//!   raising the lane's floor marker ([`raise_floor`]); every lister reads
//!   the marker after its listing ([`crate::seal`] says why). The chunk
//!   indexes ([`crate::chunk`]) it passed go with it.
//! * [`index_slots`] reads a run of slots' indexes from the lane's chunk
//!   indexes where there are any, and each other slot's own index.
//!
//! A listing tells keys, not what they hold: each listed slot's fixed part
//! (16 bytes, one ranged GET) says whether it is a seal.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use cellfleet_authority::{CellId, Holder, LaneId, Layout, NodeId, Txid};
use cellfleet_store::{ObjectStore, PutCondition};
use tokio::sync::watch;

use crate::chunk;
use crate::lane::{self, GroupFate, SlotState, Verdict};
use crate::seal::{self, AfterRefused, Listed, Plan};
use crate::segment::{self, Entry, Index, Seal, SegmentHeader};

/// Why a log operation against the store failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The store failed (retry later).
    #[error("store: {0}")]
    Store(#[from] cellfleet_store::Error),
    /// An object in the lane is not a valid log object.
    #[error("{key}: {source}")]
    Corrupt {
        /// The object.
        key: String,
        /// What is wrong.
        source: segment::Error,
    },
    /// The lane has no seal: its session may still be writing.
    #[error("lane {0:?} is not sealed")]
    NotSealed(LaneId),
    /// A bound was reached (listing size, attempts).
    #[error("{0}")]
    Bound(String),
}

type Result<T> = std::result::Result<T, Error>;

/// Most slots a lane listing may hold (its retained segments and seals).
pub const LANE_KEYS_MAX: usize = 100_000;
/// Attempts of one chunk index put (it is only an optimisation: a reader
/// without it reads the segments' own indexes).
pub const CHUNK_ATTEMPTS_MAX: u32 = 8;
/// Most plan rounds of one sealing (each refused create re-plans once).
pub const SEAL_ROUNDS_MAX: usize = 1_000;

/// How a [`LaneWriter`] retries one slot.
#[derive(Clone, Copy, Debug)]
pub struct WriterConfig {
    /// Attempts per slot before it is left in doubt (its groups then wait
    /// until the caller gives up on them; the slot is never reused).
    pub attempts_max: u32,
    /// The wait before the second attempt; it doubles up to `backoff_max`.
    pub backoff_first: Duration,
    /// The longest wait between two attempts.
    pub backoff_max: Duration,
    /// Whether the writer puts a chunk index ([`crate::chunk`]) once every
    /// slot of a chunk is acknowledged.
    pub chunk_indexes: bool,
}

impl Default for WriterConfig {
    fn default() -> Self {
        WriterConfig {
            attempts_max: 8,
            backoff_first: Duration::from_millis(20),
            backoff_max: Duration::from_secs(1),
            chunk_indexes: true,
        }
    }
}

#[derive(Debug)]
struct WriterState {
    next_seq: u64,
    /// Every slot below is acknowledged (and forgotten).
    floor: u64,
    /// What is known of the slots from `floor` on.
    slots: BTreeMap<u64, SlotState>,
    /// The index prefixes of written slots whose chunk index is not put
    /// yet (with [`WriterConfig::chunk_indexes`]).
    chunk: BTreeMap<u64, Bytes>,
}

/// One session's writer of one lane.
#[derive(Debug)]
pub struct LaneWriter {
    store: Arc<dyn ObjectStore>,
    layout: Layout,
    lane: LaneId,
    config: WriterConfig,
    state: Mutex<WriterState>,
    verdict: watch::Sender<Verdict>,
}

impl LaneWriter {
    /// A writer of `lane`, whose first slot is `first_seq`.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        layout: Layout,
        lane: LaneId,
        first_seq: u64,
        config: WriterConfig,
    ) -> Arc<Self> {
        let (verdict, _) = watch::channel(lane::verdict(first_seq, &BTreeMap::new()));
        Arc::new(LaneWriter {
            store,
            layout,
            lane,
            config,
            state: Mutex::new(WriterState {
                next_seq: first_seq,
                floor: first_seq,
                slots: BTreeMap::new(),
                chunk: BTreeMap::new(),
            }),
            verdict,
        })
    }

    /// The lane.
    pub fn lane(&self) -> &LaneId {
        &self.lane
    }

    fn state(&self) -> std::sync::MutexGuard<'_, WriterState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The slot the next segment goes to, or `None` once the lane is sealed.
    pub fn reserve(&self) -> Option<u64> {
        if self.verdict.borrow().sealed_at.is_some() {
            return None;
        }
        let mut state = self.state();
        let seq = state.next_seq;
        state.next_seq += 1;
        state.slots.insert(seq, SlotState::InFlight);
        Some(seq)
    }

    /// The slot the next [`LaneWriter::reserve`] hands out: every segment
    /// reserved from now on goes to this slot or a later one.
    pub fn next_seq(&self) -> u64 {
        self.state().next_seq
    }

    /// Waits until every slot reserved so far is decided (written, or the
    /// lane sealed); the verdict then, or `None` if still undecided after
    /// `bound`.
    pub async fn settled(&self, bound: Duration) -> Option<Verdict> {
        let reserved = self.next_seq();
        let mut verdict = self.verdict();
        tokio::time::timeout(bound, async {
            verdict
                .wait_for(|v| v.acked_below >= reserved || v.sealed_at.is_some())
                .await
                .map(|v| *v)
        })
        .await
        .ok()?
        .ok()
    }

    /// The header of the segment for slot `seq`.
    pub fn header(&self, seq: u64, written_ms: u64) -> SegmentHeader {
        SegmentHeader {
            lane: self.lane.clone(),
            seq,
            written_ms,
        }
    }

    /// What the lane's slots allow so far (updated as PUTs are answered).
    pub fn verdict(&self) -> watch::Receiver<Verdict> {
        self.verdict.subscribe()
    }

    /// Slot `seq` holds `bytes`, this session's segment.
    fn written(self: &Arc<Self>, seq: u64, bytes: &Bytes) {
        if self.config.chunk_indexes {
            if let Ok(range) = segment::index_range(bytes) {
                let end = usize::try_from(range.end).unwrap_or(usize::MAX);
                if let Some(prefix) = bytes.get(..end) {
                    // A copy: a slice would keep the whole segment alive.
                    self.state()
                        .chunk
                        .insert(seq, Bytes::copy_from_slice(prefix));
                }
            }
        }
        self.set(seq, SlotState::Written);
    }

    fn set(self: &Arc<Self>, seq: u64, slot: SlotState) {
        let (verdict, chunks) = {
            let mut state = self.state();
            state.slots.insert(seq, slot);
            let verdict = lane::verdict(state.floor, &state.slots);
            // Acknowledged slots need no more bookkeeping: the verdict of
            // the rest, from the new floor, is the same.
            state.slots = state.slots.split_off(&verdict.acked_below);
            state.floor = verdict.acked_below;
            (
                verdict,
                complete_chunks(&mut state.chunk, verdict.acked_below),
            )
        };
        for (first, prefixes) in chunks {
            let writer = self.clone();
            tokio::spawn(async move { writer.write_chunk(first, prefixes).await });
        }
        // Two answers may publish in either order once the lock is
        // released: only ever move the published verdict forward, or a
        // later, older verdict would hide an acknowledgement until the
        // lane's next write (forever, on a quiet lane).
        self.verdict.send_if_modified(|current| {
            let merged = lane::later(*current, verdict);
            let changed = merged != *current;
            *current = merged;
            changed
        });
    }

    /// Writes `bytes` (a segment encoded for slot `seq`, reserved with
    /// [`LaneWriter::reserve`]) in a task of its own.
    pub fn write(self: &Arc<Self>, seq: u64, bytes: Vec<u8>) {
        let writer = self.clone();
        tokio::spawn(async move { writer.write_slot(seq, Bytes::from(bytes)).await });
    }

    async fn write_slot(self: &Arc<Self>, seq: u64, bytes: Bytes) {
        let key = self.layout.segment_key(&self.lane, seq);
        let mut backoff = self.config.backoff_first;
        for attempt in 1..=self.config.attempts_max.max(1) {
            match self
                .store
                .put(&key, bytes.clone(), PutCondition::IfNoneMatch)
                .await
            {
                Ok(_) => return self.written(seq, &bytes),
                Err(error) if error.is_precondition_failed() => {
                    match self.store.get(&key).await {
                        Ok(found) if found.body == bytes => return self.written(seq, &bytes),
                        // A seal, or anything not ours: the lane has ended
                        // for this session at this slot — unless the slot
                        // is below the lane's floor. Only written slots are
                        // collected, so ours was there, counted and
                        // collected, and a sealer that read the floor
                        // before that collection sealed the emptied slot
                        // (found by the model check, tests/model.rs).
                        Ok(_) => {
                            match read_floor(self.store.as_ref(), &self.layout, &self.lane).await {
                                Ok(floor) if seq < floor => return self.written(seq, &bytes),
                                Ok(_) => return self.set(seq, SlotState::Sealed),
                                Err(read) => {
                                    tracing::warn!(%key, error = %read, "reading the lane's floor failed; retrying");
                                    self.set(seq, SlotState::InDoubt);
                                }
                            }
                        }
                        Err(read) => {
                            tracing::warn!(%key, error = %read, "reading a refused slot failed; retrying");
                            self.set(seq, SlotState::InDoubt);
                        }
                    }
                }
                Err(error) => {
                    // Unknown or not applied: the same bytes again are
                    // harmless (create-only, and a 412 is settled by a read).
                    tracing::warn!(%key, attempt, %error, "segment write failed; sending the same bytes again");
                    self.set(seq, SlotState::InDoubt);
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(self.config.backoff_max);
        }
        tracing::error!(%key, "segment write still in doubt after every attempt");
    }

    /// Puts the chunk index of the slots from `first` (every one
    /// acknowledged). Best effort: without it a reader reads each segment's
    /// own index. A put that lands after collection passed the chunk is
    /// deleted again (collection raises the floor before it deletes).
    async fn write_chunk(&self, first: u64, prefixes: Vec<Bytes>) {
        let refs: Vec<&[u8]> = prefixes.iter().map(Bytes::as_ref).collect();
        let bytes = match chunk::encode_chunk(&self.lane, first, &refs) {
            Ok(bytes) => Bytes::from(bytes),
            Err(error) => {
                tracing::warn!(lane = ?self.lane, first, %error, "chunk index not encoded; readers use the segments' own indexes");
                return;
            }
        };
        let key = self.layout.chunk_index_key(&self.lane, first);
        let attempts = self.config.attempts_max.clamp(1, CHUNK_ATTEMPTS_MAX);
        let mut backoff = self.config.backoff_first;
        for attempt in 1..=attempts {
            match self
                .store
                .put(&key, bytes.clone(), PutCondition::IfNoneMatch)
                .await
            {
                // Ours already (an earlier attempt whose answer was lost).
                Ok(_) => break,
                Err(error) if error.is_precondition_failed() => break,
                Err(error) => {
                    tracing::warn!(%key, attempt, %error, "chunk index write failed; retrying");
                }
            }
            if attempt == attempts {
                return;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(self.config.backoff_max);
        }
        match read_floor(self.store.as_ref(), &self.layout, &self.lane).await {
            Ok(floor) if floor >= first + chunk::CHUNK_SLOTS => {
                let _ = self.store.delete(&key).await;
            }
            _ => {}
        }
    }

    /// Waits until the group in slot `seq` is acknowledged or provably not
    /// committed; `None` if it is still undecided after `bound`.
    pub async fn fate(&self, seq: u64, bound: Duration) -> Option<GroupFate> {
        let mut verdict = self.verdict();
        let decided = tokio::time::timeout(bound, async {
            verdict
                .wait_for(|v| v.group(seq) != GroupFate::Waiting)
                .await
                .map(|v| v.group(seq))
        })
        .await;
        match decided {
            Ok(Ok(fate)) => Some(fate),
            _ => None,
        }
    }
}

/// Takes from `pending` (written slots' index prefixes) every chunk that
/// lies wholly below `acked_below`: those with all their slots are
/// returned (first slot, prefixes in order) to be put; partial ones (a
/// session starting mid-chunk) are dropped.
fn complete_chunks(pending: &mut BTreeMap<u64, Bytes>, acked_below: u64) -> Vec<(u64, Vec<Bytes>)> {
    let mut complete = Vec::new();
    while let Some(&low) = pending.keys().next() {
        let first = chunk::chunk_of(low);
        let end = first + chunk::CHUNK_SLOTS;
        if end > acked_below {
            break;
        }
        let rest = pending.split_off(&end);
        let taken = std::mem::replace(pending, rest);
        if taken.len() as u64 == chunk::CHUNK_SLOTS {
            complete.push((first, taken.into_values().collect()));
        }
    }
    complete
}

/// The first slots of the chunks whose last slot lies in `from..to`: a
/// collection of `from..to` (after one of `..from`) leaves nothing of them.
fn chunks_passed(from: u64, to: u64) -> impl Iterator<Item = u64> {
    let first = chunk::chunk_of(from);
    (first..to)
        .step_by(chunk::CHUNK_SLOTS as usize)
        .filter(move |first| {
            let last = first + chunk::CHUNK_SLOTS - 1;
            last >= from && last < to
        })
}

/// What a slot holds, from its fixed part (one 16-byte ranged GET).
async fn classify(store: &dyn ObjectStore, key: &str) -> Result<Listed> {
    let fixed = store.get_range(key, 0..segment::FIXED_BYTES).await?;
    let seal = segment::is_seal(&fixed.body).map_err(|source| Error::Corrupt {
        key: key.to_owned(),
        source,
    })?;
    Ok(if seal { Listed::Seal } else { Listed::Segment })
}

/// A lane as one listing saw it: its floor and what each slot holds.
struct Listing {
    floor: u64,
    slots: BTreeMap<u64, Listed>,
    /// The first slots of the chunk indexes listed.
    chunks: std::collections::BTreeSet<u64>,
}

/// The floor of `lane` as its marker says (0 with no marker yet).
pub async fn read_floor(store: &dyn ObjectStore, layout: &Layout, lane: &LaneId) -> Result<u64> {
    let key = layout.lane_floor_key(lane);
    match store.get(&key).await {
        Ok(object) => {
            segment::decode_floor(&object.body).map_err(|source| Error::Corrupt { key, source })
        }
        Err(error) if error.is_not_found() => Ok(0),
        Err(error) => Err(error.into()),
    }
}

/// Lists `lane`, tells each slot's kind, then reads its floor.
///
/// The floor is read **after** the listing: collection writes the marker
/// before it deletes anything below it, so any slot this listing misses
/// because it was collected lies below the floor read afterwards. A floor
/// read first could be older than a deletion the listing saw, and a
/// collected slot would look like a gap to seal.
async fn listing(store: &dyn ObjectStore, layout: &Layout, lane: &LaneId) -> Result<Listing> {
    let entries =
        cellfleet_store::list_all(store, &layout.lane_prefix(lane), LANE_KEYS_MAX).await?;
    let mut slots = BTreeMap::new();
    for entry in entries {
        let Some(parsed) = layout.parse_segment_key(&entry.key) else {
            continue;
        };
        if parsed.lane != *lane {
            continue;
        }
        match classify(store, &entry.key).await {
            Ok(kind) => {
                slots.insert(parsed.seq, kind);
            }
            // Collected since the listing: it lies below the floor.
            Err(Error::Store(error)) if error.is_not_found() => {}
            Err(error) => return Err(error),
        }
    }
    let floor = read_floor(store, layout, lane).await?;
    Ok(Listing {
        floor,
        slots,
        chunks: Default::default(),
    })
}

/// Raises the floor marker of `lane` to at least `to` (never lowers it:
/// a conditional write over the marker read, re-read on a race or an
/// ambiguous answer). Returns the floor in effect afterwards.
pub async fn raise_floor(
    store: &dyn ObjectStore,
    layout: &Layout,
    lane: &LaneId,
    to: u64,
) -> Result<u64> {
    let key = layout.lane_floor_key(lane);
    let body = Bytes::from(segment::encode_floor(to));
    let mut last = None;
    for _ in 0..SEAL_ROUNDS_MAX.min(16) {
        let condition = match store.get(&key).await {
            Ok(object) => {
                let current =
                    segment::decode_floor(&object.body).map_err(|source| Error::Corrupt {
                        key: key.clone(),
                        source,
                    })?;
                if current >= to {
                    return Ok(current);
                }
                PutCondition::IfMatch(object.etag)
            }
            Err(error) if error.is_not_found() => PutCondition::IfNoneMatch,
            Err(error) => return Err(error.into()),
        };
        match store.put(&key, body.clone(), condition).await {
            Ok(_) => return Ok(to),
            // Raced, or the answer was lost: the next read decides.
            Err(error)
                if error.is_precondition_failed()
                    || error.may_have_applied()
                    || error.is_retryable() =>
            {
                last = Some(error);
            }
            Err(error) => return Err(error.into()),
        }
    }
    Err(Error::Bound(format!(
        "the floor of lane {lane:?} was not raised to {to}: {}",
        last.map_or_else(String::new, |e| e.to_string())
    )))
}

/// [`listing`] with each slot's kind read [`INDEX_READS_CONCURRENT`] at a
/// time (the floor still read after every slot).
async fn listing_parallel(
    store: &Arc<dyn ObjectStore>,
    layout: &Layout,
    lane: &LaneId,
) -> Result<Listing> {
    let entries =
        cellfleet_store::list_all(store.as_ref(), &layout.lane_prefix(lane), LANE_KEYS_MAX).await?;
    let chunks: std::collections::BTreeSet<u64> = entries
        .iter()
        .filter_map(|entry| layout.parse_chunk_index_key(&entry.key))
        .filter(|parsed| parsed.lane == *lane && parsed.seq.is_multiple_of(chunk::CHUNK_SLOTS))
        .map(|parsed| parsed.seq)
        .collect();
    let mut slots = BTreeMap::new();
    // A slot a chunk index covers holds this session's segment (the
    // writer puts one only over its own acknowledged slots): no read.
    let mut keys = entries
        .into_iter()
        .filter_map(|entry| {
            layout
                .parse_segment_key(&entry.key)
                .filter(|parsed| parsed.lane == *lane)
                .map(|parsed| (parsed.seq, entry.key))
        })
        .filter(|(seq, _)| {
            let covered = chunks.contains(&chunk::chunk_of(*seq));
            if covered {
                slots.insert(*seq, Listed::Segment);
            }
            !covered
        })
        .collect::<Vec<_>>()
        .into_iter();
    let mut set = tokio::task::JoinSet::new();
    loop {
        while set.len() < INDEX_READS_CONCURRENT {
            let Some((seq, key)) = keys.next() else { break };
            let store = store.clone();
            set.spawn(async move { (seq, classify(store.as_ref(), &key).await) });
        }
        let Some(joined) = set.join_next().await else {
            break;
        };
        let (seq, kind) =
            joined.map_err(|e| Error::Bound(format!("a listing task failed: {e}")))?;
        match kind {
            Ok(kind) => {
                slots.insert(seq, kind);
            }
            // Collected since the listing: it lies below the floor.
            Err(Error::Store(error)) if error.is_not_found() => {}
            Err(error) => return Err(error),
        }
    }
    let floor = read_floor(store.as_ref(), layout, lane).await?;
    Ok(Listing {
        floor,
        slots,
        chunks,
    })
}

/// Collects the slots `from..to` of `lane` — a live session's own written
/// prefix, or a sealed lane's counted slots below its seal — when no
/// record in them is needed by any root: first the floor marker is raised
/// to `to`, then the segments are deleted in order. Returns how many were
/// deleted. `to` never passes a seal, so seals are never collected.
pub async fn collect(
    store: &dyn ObjectStore,
    layout: &Layout,
    lane: &LaneId,
    from: u64,
    to: u64,
) -> Result<u64> {
    if to <= from {
        return Ok(0);
    }
    raise_floor(store, layout, lane, to).await?;
    let mut deleted = 0;
    for seq in from..to {
        match store.delete(&layout.segment_key(lane, seq)).await {
            Ok(()) => deleted += 1,
            Err(error) if error.is_not_found() => {}
            Err(error) => return Err(error.into()),
        }
    }
    // The chunk indexes whose last slot this call collected.
    for first in chunks_passed(from, to) {
        match store.delete(&layout.chunk_index_key(lane, first)).await {
            Ok(()) => {}
            Err(error) if error.is_not_found() => {}
            Err(error) => return Err(error.into()),
        }
    }
    Ok(deleted)
}

/// Ends `lane` (of a session whose lease has expired plus the margin),
/// whose run starts at its floor: returns the slot of its first seal,
/// creating one if needed.
pub async fn seal_lane(
    store: &dyn ObjectStore,
    layout: &Layout,
    lane: &LaneId,
    sealer: &Holder,
    now_ms: u64,
) -> Result<u64> {
    let listed = listing(store, layout, lane).await?;
    Ok(seal_listed(store, layout, lane, listed, sealer, now_ms)
        .await?
        .1)
}

/// [`seal_lane`] from a listing already made; returns the listing as
/// sealing left it and the seal's slot. Every slot from the floor up to
/// the seal is a segment in it (the plan walked over them).
async fn seal_listed(
    store: &dyn ObjectStore,
    layout: &Layout,
    lane: &LaneId,
    listing: Listing,
    sealer: &Holder,
    now_ms: u64,
) -> Result<(Listing, u64)> {
    let Listing {
        floor,
        slots: mut listed,
        chunks,
    } = listing;
    let done = |listed: BTreeMap<u64, Listed>, at: u64| {
        Ok((
            Listing {
                floor,
                slots: listed,
                chunks: chunks.clone(),
            },
            at,
        ))
    };
    for _ in 0..SEAL_ROUNDS_MAX {
        let seq = match seal::plan(floor, &listed) {
            Plan::Sealed { at } => return done(listed, at),
            Plan::SealAt(seq) => seq,
        };
        let key = layout.segment_key(lane, seq);
        let bytes = Bytes::from(segment::encode_seal(&Seal {
            header: SegmentHeader {
                lane: lane.clone(),
                seq,
                written_ms: now_ms,
            },
            sealed_by: sealer.clone(),
        }));
        match store.put(&key, bytes, PutCondition::IfNoneMatch).await {
            Ok(_) => {
                listed.insert(seq, Listed::Seal);
                return done(listed, seq);
            }
            Err(error) if error.is_precondition_failed() => {
                let found = classify(store, &key).await?;
                match seal::after_refused(seq, found) {
                    AfterRefused::Sealed { at } => {
                        listed.insert(seq, Listed::Seal);
                        return done(listed, at);
                    }
                    AfterRefused::PlanAgain => {
                        listed.insert(seq, found);
                    }
                }
            }
            // Our seal may or may not be there: the next round reads it
            // (a resend of the same seal is harmless either way).
            Err(error) if error.may_have_applied() || error.is_retryable() => {
                tracing::warn!(%key, %error, "seal write failed; re-reading the slot");
                if let Ok(found) = classify(store, &key).await {
                    listed.insert(seq, found);
                }
            }
            Err(error) => return Err(error.into()),
        }
    }
    Err(Error::Bound(format!(
        "lane {lane:?} not sealed after {SEAL_ROUNDS_MAX} rounds"
    )))
}

/// A sealed lane as a reader sees it: the slots that count, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SealedLane {
    /// The lane's floor: slots below it were collected.
    pub floor: u64,
    /// Slots that count: from the floor up to (not including) `end`.
    pub counted: Vec<u64>,
    /// The slot of the lane's first seal.
    pub end: u64,
}

/// Lists a sealed lane (from its floor on): what counts ([`NotSealed`](Error::NotSealed) if it
/// has no seal yet).
pub async fn read_lane(
    store: &dyn ObjectStore,
    layout: &Layout,
    lane: &LaneId,
) -> Result<SealedLane> {
    let Listing { floor, slots, .. } = listing(store, layout, lane).await?;
    let end = seal::log_end(floor, &slots).ok_or_else(|| Error::NotSealed(lane.clone()))?;
    let counted = slots.range(floor..end).map(|(seq, _)| *seq).collect();
    Ok(SealedLane {
        floor,
        counted,
        end,
    })
}

/// The slots of a lane that may still be written to (its session live),
/// as of one listing: the run of segments from the lane's floor up to the first
/// slot missing or sealed. Each of them is written by the session and,
/// being contiguous from the floor, acknowledged or about to be; the
/// writer may have more in flight past them.
pub async fn read_written_run(
    store: &dyn ObjectStore,
    layout: &Layout,
    lane: &LaneId,
) -> Result<Vec<u64>> {
    let Listing { floor, slots, .. } = listing(store, layout, lane).await?;
    let mut seqs = Vec::new();
    let mut seq = floor;
    while slots.get(&seq) == Some(&Listed::Segment) {
        seqs.push(seq);
        seq += 1;
    }
    Ok(seqs)
}

/// The index entries of the segment in slot `seq` of `lane` (two ranged
/// GETs: the fixed part, then the index); `None` if the slot is gone
/// (collected since it was listed, below the floor now).
pub async fn read_entries(
    store: &dyn ObjectStore,
    layout: &Layout,
    lane: &LaneId,
    seq: u64,
) -> Result<Option<(Vec<Entry>, u32)>> {
    let key = layout.segment_key(lane, seq);
    let corrupt = |source| Error::Corrupt {
        key: key.clone(),
        source,
    };
    let fixed = match store.get_range(&key, 0..segment::FIXED_BYTES).await {
        Ok(fixed) => fixed,
        // Collected since the listing: below the floor now, so it held
        // no record any root needs (collection keeps every held slot).
        Err(error) if error.is_not_found() && seq < read_floor(store, layout, lane).await? => {
            return Ok(None);
        }
        Err(error) => return Err(error.into()),
    };
    let range = segment::index_range(&fixed.body).map_err(corrupt)?;
    let head = store.get_range(&key, range).await?;
    match segment::decode_index(&head.body).map_err(corrupt)? {
        Index::Segment {
            entries, index_len, ..
        } => Ok(Some((entries, index_len))),
        _ => Err(corrupt(segment::Error::Malformed(
            "a seal among the slots that count".into(),
        ))),
    }
}

/// One Cell's records in the slots `seqs` of `lane` (from [`read_lane`]),
/// in order: each entry and its checked bytes, fetched by ranged GETs. A
/// slot collected since it was listed (missing, and below the floor now)
/// is skipped: collection never deletes a slot holding a record some root
/// still needs.
pub async fn read_records(
    store: &dyn ObjectStore,
    layout: &Layout,
    lane: &LaneId,
    seqs: &[u64],
    cell: &CellId,
) -> Result<Vec<(u64, Entry, Bytes)>> {
    let mut records = Vec::new();
    for &seq in seqs {
        let Some((entries, index_len)) = read_entries(store, layout, lane, seq).await? else {
            continue;
        };
        let key = layout.segment_key(lane, seq);
        for entry in entries.into_iter().filter(|entry| entry.cell_id == *cell) {
            let bytes = store
                .get_range(&key, entry.object_range(index_len))
                .await?
                .body;
            segment::check_entry_bytes(&entry, &bytes).map_err(|source| Error::Corrupt {
                key: key.clone(),
                source,
            })?;
            records.push((seq, entry, bytes));
        }
    }
    Ok(records)
}

/// Most sessions or lanes one listing walk returns.
pub const WALK_MAX: usize = 10_000;

/// The distinct lanes (or, with `sessions`, the distinct sessions' first
/// lanes) under `prefix`, one LIST call each: after finding a key, the
/// walk skips past everything under its lane (or session).
async fn walk(
    store: &dyn ObjectStore,
    layout: &Layout,
    prefix: &str,
    sessions: bool,
) -> Result<Vec<LaneId>> {
    let mut found: Vec<LaneId> = Vec::new();
    let mut start_after: Option<String> = None;
    while found.len() < WALK_MAX {
        let page = store.list(prefix, start_after.as_deref(), 1).await?;
        let Some(entry) = page.entries.into_iter().next() else {
            return Ok(found);
        };
        let Some(lane) = layout.parse_lane_of_key(&entry.key) else {
            // Not a log key: step over it alone.
            start_after = Some(entry.key);
            continue;
        };
        // '~' sorts after every character of a log key's rest.
        start_after = Some(if sessions {
            format!("{}~", layout.session_logs_prefix(&lane.node, lane.session))
        } else {
            format!("{}~", layout.lane_prefix(&lane))
        });
        found.push(lane);
    }
    Err(Error::Bound(format!(
        "more than {WALK_MAX} sessions or lanes under {prefix}"
    )))
}

/// The sessions with a log under `node` (any lane left in the bucket).
pub async fn list_sessions(
    store: &dyn ObjectStore,
    layout: &Layout,
    node: &NodeId,
) -> Result<Vec<cellfleet_authority::SessionId>> {
    let lanes = walk(store, layout, &layout.node_logs_prefix(node), true).await?;
    Ok(lanes.into_iter().map(|lane| lane.session).collect())
}

/// The lanes of `session` of `node` left in the bucket.
pub async fn list_lanes(
    store: &dyn ObjectStore,
    layout: &Layout,
    node: &NodeId,
    session: cellfleet_authority::SessionId,
) -> Result<Vec<LaneId>> {
    walk(
        store,
        layout,
        &layout.session_logs_prefix(node, session),
        false,
    )
    .await
}

/// Slot indexes read at once while indexing a sealed lane.
pub const INDEX_READS_CONCURRENT: usize = 16;

/// One record of a sealed lane's index.
#[derive(Clone, Debug)]
pub struct Indexed {
    /// Its slot.
    pub seq: u64,
    /// Its index entry.
    pub entry: Entry,
    /// The index length of its segment (for [`Entry::object_range`]).
    pub index_len: u32,
}

/// A sealed lane's index: every counted slot's entries, by Cell. What is
/// below a seal never changes (only collection deletes it, and only what
/// no root needs), so one index serves every takeover from that lane:
/// each Cell's replay is then its own records' ranged GETs, not a listing
/// and an index read per slot.
#[derive(Debug)]
pub struct SealedIndex {
    /// The lane.
    pub lane: LaneId,
    /// Its floor and seal when indexed.
    pub floor: u64,
    /// The slot of its first seal.
    pub end: u64,
    /// Chunk indexes read to build it (each stands for
    /// [`chunk::CHUNK_SLOTS`] slots).
    pub chunk_indexes_read: u64,
    /// Slots whose own index was read (those no chunk index covered).
    pub slot_indexes_read: u64,
    by_cell: std::collections::HashMap<CellId, Vec<Indexed>>,
}

impl SealedIndex {
    /// Every Cell with records in the lane, with the last TXID there.
    pub fn cells(&self) -> impl Iterator<Item = (&CellId, Txid)> {
        self.by_cell.iter().map(|(cell, records)| {
            (
                cell,
                records
                    .iter()
                    .map(|r| r.entry.max_txid)
                    .max()
                    .unwrap_or(Txid::ZERO),
            )
        })
    }

    /// `cell`'s records in slots at or after `from_seq`, in order.
    pub fn records_of(&self, cell: &CellId, from_seq: u64) -> &[Indexed] {
        let records = self.by_cell.get(cell).map_or(&[][..], Vec::as_slice);
        let start = records.partition_point(|r| r.seq < from_seq);
        &records[start..]
    }
}

/// Seals `lane` (idempotent) and indexes what counts in it.
pub async fn index_sealed_lane(
    store: &Arc<dyn ObjectStore>,
    layout: &Layout,
    lane: &LaneId,
    sealer: &Holder,
    now_ms: u64,
) -> Result<SealedIndex> {
    // One listing (each slot's kind read in parallel), sealed from there:
    // below the seal every slot of the run is a segment already listed.
    let listed = listing_parallel(store, layout, lane).await?;
    let (listed, end) = seal_listed(store.as_ref(), layout, lane, listed, sealer, now_ms).await?;
    let floor = listed.floor;
    let indexed = index_slots(store, layout, lane, floor..end, Some(&listed.chunks)).await?;
    let mut by_cell: std::collections::HashMap<CellId, Vec<Indexed>> =
        std::collections::HashMap::new();
    for slot in indexed.slots {
        for entry in slot.entries {
            by_cell
                .entry(entry.cell_id.clone())
                .or_default()
                .push(Indexed {
                    seq: slot.seq,
                    entry,
                    index_len: slot.index_len,
                });
        }
    }
    for records in by_cell.values_mut() {
        records.sort_by_key(|r| (r.seq, r.entry.min_txid));
    }
    Ok(SealedIndex {
        lane: lane.clone(),
        floor,
        end,
        chunk_indexes_read: indexed.chunk_indexes_read,
        slot_indexes_read: indexed.slot_indexes_read,
        by_cell,
    })
}

/// The indexes of a run of slots, and how they were read.
#[derive(Debug, Default)]
pub struct IndexedSlots {
    /// Every slot's entries (slots collected since are missing), in no
    /// particular order.
    pub slots: Vec<chunk::ChunkSlot>,
    /// Chunk indexes read (each stands for [`chunk::CHUNK_SLOTS`] slots).
    pub chunk_indexes_read: u64,
    /// Slots whose own index was read.
    pub slot_indexes_read: u64,
}

/// The indexes of the slots `seqs` of `lane`, every one a segment of the
/// run (acknowledged, or below a seal): from the chunk indexes of the
/// whole chunks inside `seqs` (those in `chunks` when given, as a listing
/// found them; else every one is tried), and each remaining slot's own
/// index, [`INDEX_READS_CONCURRENT`] reads at a time. A chunk index
/// missing or damaged falls back to its slots; a slot collected since
/// (below the floor now) is skipped.
pub async fn index_slots(
    store: &Arc<dyn ObjectStore>,
    layout: &Layout,
    lane: &LaneId,
    seqs: std::ops::Range<u64>,
    chunks: Option<&std::collections::BTreeSet<u64>>,
) -> Result<IndexedSlots> {
    let mut out = IndexedSlots::default();
    let whole = (chunk::chunk_of(seqs.start)..seqs.end)
        .step_by(chunk::CHUNK_SLOTS as usize)
        .filter(|first| {
            first + chunk::CHUNK_SLOTS > seqs.start
                && first + chunk::CHUNK_SLOTS <= seqs.end
                && chunks.is_none_or(|listed| listed.contains(first))
        });
    let mut covered = std::collections::BTreeSet::new();
    let mut pending = whole;
    let mut set = tokio::task::JoinSet::new();
    loop {
        while set.len() < INDEX_READS_CONCURRENT {
            let Some(first) = pending.next() else { break };
            let (store, layout, lane) = (store.clone(), layout.clone(), lane.clone());
            set.spawn(async move {
                (
                    first,
                    read_chunk(store.as_ref(), &layout, &lane, first).await,
                )
            });
        }
        let Some(joined) = set.join_next().await else {
            break;
        };
        let (first, read) =
            joined.map_err(|e| Error::Bound(format!("a chunk index read task failed: {e}")))?;
        match read {
            Ok(slots) => {
                out.chunk_indexes_read += 1;
                for slot in slots.into_iter().filter(|slot| seqs.contains(&slot.seq)) {
                    covered.insert(slot.seq);
                    out.slots.push(slot);
                }
            }
            // Not put (yet), collected since, or damaged: each slot's own
            // index is read instead.
            Err(Error::Store(error)) if error.is_not_found() => {}
            Err(error) => {
                tracing::warn!(?lane, first, %error, "chunk index unreadable; reading its segments' own indexes");
            }
        }
    }
    let mut pending = seqs.clone().filter(|seq| !covered.contains(seq));
    loop {
        while set.len() < INDEX_READS_CONCURRENT {
            let Some(seq) = pending.next() else { break };
            let (store, layout, lane) = (store.clone(), layout.clone(), lane.clone());
            set.spawn(async move {
                let read = read_entries(store.as_ref(), &layout, &lane, seq).await;
                let slots = read.map(|read| {
                    read.map(|(entries, index_len)| chunk::ChunkSlot {
                        seq,
                        entries,
                        index_len,
                    })
                    .into_iter()
                    .collect::<Vec<_>>()
                });
                (seq, slots)
            });
        }
        let Some(joined) = set.join_next().await else {
            break;
        };
        let (_, read) =
            joined.map_err(|e| Error::Bound(format!("an index read task failed: {e}")))?;
        out.slot_indexes_read += 1;
        out.slots.extend(read?);
    }
    Ok(out)
}

/// The checked chunk index of `lane` from slot `first`.
async fn read_chunk(
    store: &dyn ObjectStore,
    layout: &Layout,
    lane: &LaneId,
    first: u64,
) -> Result<Vec<chunk::ChunkSlot>> {
    let key = layout.chunk_index_key(lane, first);
    let object = store.get(&key).await?;
    chunk::decode_chunk(&object.body, lane, first).map_err(|source| Error::Corrupt { key, source })
}

/// The bytes of `records` (from [`SealedIndex::records_of`]), checked, in
/// order; [`INDEX_READS_CONCURRENT`] ranged GETs at a time. A slot
/// collected since it was indexed is skipped, as in [`read_records`].
pub async fn read_indexed(
    store: &Arc<dyn ObjectStore>,
    layout: &Layout,
    lane: &LaneId,
    records: &[Indexed],
) -> Result<Vec<(u64, Entry, Bytes)>> {
    let mut read: Vec<Option<(u64, Entry, Bytes)>> = vec![None; records.len()];
    let mut pending = records.iter().cloned().enumerate();
    let mut set = tokio::task::JoinSet::new();
    loop {
        while set.len() < INDEX_READS_CONCURRENT {
            let Some((at, record)) = pending.next() else {
                break;
            };
            let (store, layout, lane) = (store.clone(), layout.clone(), lane.clone());
            set.spawn(async move {
                let key = layout.segment_key(&lane, record.seq);
                let got = store
                    .get_range(&key, record.entry.object_range(record.index_len))
                    .await;
                let bytes = match got {
                    Ok(object) => object.body,
                    Err(error)
                        if error.is_not_found()
                            && record.seq < read_floor(store.as_ref(), &layout, &lane).await? =>
                    {
                        return Ok((at, None));
                    }
                    Err(error) => return Err(Error::from(error)),
                };
                segment::check_entry_bytes(&record.entry, &bytes)
                    .map_err(|source| Error::Corrupt { key, source })?;
                Ok((at, Some((record.seq, record.entry, bytes))))
            });
        }
        let Some(joined) = set.join_next().await else {
            break;
        };
        let (at, got) =
            joined.map_err(|e| Error::Bound(format!("a record read task failed: {e}")))??;
        read[at] = got;
    }
    Ok(read.into_iter().flatten().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Collections in consecutive ranges, however cut, delete every
        /// chunk index whose last slot they passed exactly once, and none
        /// whose last slot is still there.
        #[test]
        fn collections_pass_each_chunk_once(cuts in proptest::collection::vec(0u64..700, 0..12), end in 0u64..2_000) {
            let mut cuts: Vec<u64> = cuts.into_iter().filter(|c| *c < end).collect();
            cuts.sort_unstable();
            cuts.dedup();
            let mut bounds = vec![0];
            bounds.extend(cuts);
            bounds.push(end);
            let mut passed: Vec<u64> = bounds
                .windows(2)
                .flat_map(|w| chunks_passed(w[0], w[1]).collect::<Vec<_>>())
                .collect();
            let expected: Vec<u64> = (0..end / chunk::CHUNK_SLOTS).map(|k| k * chunk::CHUNK_SLOTS).collect();
            passed.sort_unstable();
            prop_assert_eq!(passed, expected);
        }

        /// Slots written in any order, acknowledged as a rising prefix:
        /// each whole chunk is handed out once, complete and in order; a
        /// chunk the session started inside is never handed out.
        #[test]
        fn whole_chunks_are_handed_out_once(
            start in 0u64..600,
            count in 0u64..900,
            order in any::<u64>(),
        ) {
            let slots: Vec<u64> = (start..start + count).collect();
            let mut shuffled = slots.clone();
            // A cheap permutation: rotate by a seed.
            let by = if slots.is_empty() { 0 } else { (order % slots.len() as u64) as usize };
            shuffled.rotate_left(by);
            let mut pending = BTreeMap::new();
            let mut written = std::collections::BTreeSet::new();
            let mut handed = Vec::new();
            for seq in shuffled {
                pending.insert(seq, Bytes::from(seq.to_be_bytes().to_vec()));
                written.insert(seq);
                let acked_below = (start..).find(|s| !written.contains(s)).unwrap();
                handed.extend(complete_chunks(&mut pending, acked_below));
            }
            let first_whole = start.div_ceil(chunk::CHUNK_SLOTS) * chunk::CHUNK_SLOTS;
            let expected: Vec<u64> = (first_whole..start + count)
                .step_by(chunk::CHUNK_SLOTS as usize)
                .filter(|first| first + chunk::CHUNK_SLOTS <= start + count)
                .collect();
            prop_assert_eq!(handed.iter().map(|(first, _)| *first).collect::<Vec<_>>(), expected);
            for (first, prefixes) in &handed {
                let seqs: Vec<u64> = prefixes
                    .iter()
                    .map(|b| u64::from_be_bytes(b.as_ref().try_into().unwrap()))
                    .collect();
                prop_assert_eq!(seqs, (*first..first + chunk::CHUNK_SLOTS).collect::<Vec<_>>());
            }
        }
    }
}
