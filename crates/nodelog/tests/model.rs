//! A model check of the node log protocol (DESIGN.md §9) with the
//! `stateright` crate: every interleaving, up to the bounds below, of one
//! Cell's writer, its successors (takeover, sealing, replay, the checkpoint
//! that moves the pointer), checkpoints, garbage collection of live and
//! dead lanes, lost replies and zombies.
//!
//! The decisions are the code's own, not a re-implementation: which slots
//! a writer may acknowledge ([`lane::verdict`]), where a successor seals
//! and what it does when a create is refused ([`seal::plan`],
//! [`seal::after_refused`]), where a reader's log ends ([`seal::log_end`]),
//! and every root transition with its fencing
//! ([`transition::create`], [`transition::takeover`], [`transition::propose`],
//! the CAS on the root's revision). What is modelled is the store (one
//! create-only key space for segments and seals, floor markers, LTX
//! files), the order of the steps each actor takes, and the actors'
//! memory.
//!
//! Properties, in every reachable state:
//! * no acknowledged record is lost: recovery from the current root (its
//!   chain, then its log pointer up to where a successor would seal) holds
//!   every acknowledged record;
//! * nothing refused counts: no record whose writer was told "not
//!   committed" is in what recovery finds, nor in the serving owner's state;
//! * the serving owner's state extends what recovery finds (a successor
//!   replayed exactly what is durable);
//! * no two sessions acknowledged records at one epoch;
//! * collection never removes what the root reaches (its chain's files,
//!   its log's records past the chain) and never deletes a seal.
//!
//! And, so the check is not vacuous, each of these happens in some state:
//! a zombie's record refused by a seal, a record acknowledged by the old
//! owner after the takeover CAS and still counted, an acknowledged record
//! replayed by a successor, two successors meeting at one seal slot, a
//! live lane and a dead lane collected.
//!
//! Abstractions (each conservative): a segment holds one record; the
//! minimum age before collection is taken as zero for segments (collection
//! as early as the rules allow) and, for an LTX file, as "longer than it
//! takes its uploader to CAS" (a file is never collected while a CAS that
//! names it is pending); a listing and the floor marker read after it are
//! separate steps; an activation that meets a gap fails (it would be
//! retried from a fresh root).

use std::collections::{BTreeMap, BTreeSet};

use cellfleet_authority::transition::{self, Holder, NewCell};
use cellfleet_authority::{
    CellId, Epoch, LaneId, Layout, Liveness, LogPointer, LtxRef, NodeId, RootRecord, RootState,
    SessionId, Txid,
};
use cellfleet_nodelog::lane::{verdict, GroupFate, SlotState};
use cellfleet_nodelog::seal::{after_refused, log_end, plan, AfterRefused, Listed, Plan};
use stateright::{Checker, Model, Property};

/// A session: 0 is the Cell's first owner, 1 and 2 its would-be successors.
type Sid = u8;
const SESSIONS: usize = 3;

/// What a slot of a lane holds.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
enum Obj {
    Segment { record: u8, txid: u64 },
    Seal,
}

impl Obj {
    fn listed(&self) -> Listed {
        match self {
            Obj::Segment { .. } => Listed::Segment,
            Obj::Seal => Listed::Seal,
        }
    }
}

/// An LTX file: the records of TXIDs `min..=max`, written at `epoch`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
struct File {
    epoch: u64,
    min: u64,
    max: u64,
    records: Vec<u8>,
}

/// The root, abstracted to what the protocol reads; converted to and from
/// the real [`RootRecord`] around every transition.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Root {
    owner: Option<Sid>,
    epoch: u64,
    revision: u64,
    txid: u64,
    chain: Vec<File>,
    log: Option<(Sid, u64)>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
enum Phase {
    /// Has never owned the Cell.
    Idle,
    /// Won the takeover CAS; sealing the previous owner's `lane`.
    Sealing {
        lane: Sid,
        from: u64,
        listed: Option<BTreeMap<u64, Listed>>,
        floor: Option<u64>,
    },
    /// Sealed at `end`; reading the records the root points at.
    Replaying {
        lane: Sid,
        from: u64,
        seqs: Option<Vec<u64>>,
    },
    /// The activation checkpoint: the replayed records into the chain and
    /// the pointer moved to this session's lane, in one CAS.
    Activating {
        records: Vec<(u8, u64)>,
    },
    Serving,
    /// Fenced, or its activation failed: it does nothing more.
    Stopped,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Session {
    phase: Phase,
    /// Its lease expired (it may go on acting: a zombie).
    dead: bool,
    epoch: u64,
    /// The root revision this session last wrote (its CAS expectation).
    known_revision: u64,
    /// The TXID of the root it last wrote.
    root_txid: u64,
    /// Its local database: the records applied, in order.
    local: Vec<u8>,
    txid: u64,
    next_seq: u64,
    slots: BTreeMap<u64, SlotState>,
    pending: BTreeSet<u64>,
    /// Slot -> (record, TXID).
    records: BTreeMap<u64, (u8, u64)>,
    /// The lowest slot holding a record of the Cell past its root.
    hold: Option<u64>,
    /// An uploaded checkpoint file and the pointer its CAS will set.
    checkpoint: Option<(File, u64)>,
    /// The floor was raised; these slots are still to delete.
    deleting: Vec<u64>,
}

impl Session {
    fn idle() -> Self {
        Session {
            phase: Phase::Idle,
            dead: false,
            epoch: 0,
            known_revision: 0,
            root_txid: 0,
            local: Vec::new(),
            txid: 0,
            next_seq: 0,
            slots: BTreeMap::new(),
            pending: BTreeSet::new(),
            records: BTreeMap::new(),
            hold: None,
            checkpoint: None,
            deleting: Vec::new(),
        }
    }
}

/// Things that must happen in some state (the check is not vacuous).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
enum Seen {
    ZombieRefused,
    AckedAfterTakeover,
    AckedRecordReplayed,
    SealRace,
    LiveLaneCollected,
    DeadLaneCollected,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct State {
    root: Root,
    store: BTreeMap<(Sid, u64), Obj>,
    markers: [u64; SESSIONS],
    ltx: BTreeSet<File>,
    sessions: [Session; SESSIONS],
    next_record: u8,
    losses: u8,
    acked: BTreeSet<u8>,
    not_committed: BTreeSet<u8>,
    /// (epoch, session) of every acknowledgement.
    acked_at: BTreeSet<(u64, Sid)>,
    /// Dead lanes a collector found no root needs: lane -> (floor, seal).
    dead_collectable: BTreeMap<Sid, (u64, u64)>,
    seal_deleted: bool,
    seen: BTreeSet<Seen>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
enum Action {
    Write(Sid),
    /// The PUT of slot `seq` reaches the store; `bool`: its reply arrives.
    Land(Sid, u64, bool),
    /// An attempt is lost before it lands.
    Lose(Sid, u64),
    Resend(Sid, u64),
    CheckpointUpload(Sid),
    CheckpointCas(Sid),
    Expire(Sid),
    Takeover(Sid),
    SealList(Sid),
    SealFloor(Sid),
    SealCreate(Sid),
    ReplayList(Sid),
    ReplayRead(Sid),
    ActivateCas(Sid),
    CollectRaise(Sid),
    CollectDelete(Sid),
    DeadLaneCheck(Sid),
    DeadLaneCollect(Sid),
}

struct NodeLogModel {
    /// Records written at most, over every session.
    records_max: u8,
    /// Attempts lost (reply or request) at most.
    losses_max: u8,
    /// PUTs in flight per session at most.
    in_flight_max: usize,
}

fn node(sid: Sid) -> NodeId {
    NodeId::new(format!("n{sid}")).expect("a valid node id")
}

fn holder(sid: Sid) -> Holder {
    Holder {
        node: node(sid),
        session: SessionId::from_u128(u128::from(sid) + 1),
    }
}

fn lane_id(sid: Sid) -> LaneId {
    let me = holder(sid);
    LaneId {
        node: me.node,
        session: me.session,
        lane: 0,
    }
}

fn sid_of(lane: &LaneId) -> Sid {
    u8::try_from(lane.session.as_u128() - 1).expect("a model session")
}

fn cell() -> CellId {
    CellId::for_kind_key("log", b"modelled")
}

fn ltx_ref(file: &File) -> LtxRef {
    let digest: String = file.records.iter().map(|r| format!("{r:02x}")).collect();
    let layout = Layout::new("").expect("an empty prefix");
    LtxRef {
        key: layout.ltx_key(
            &cell(),
            Epoch::new(file.epoch).expect("epochs start at 1"),
            Txid(file.min),
            Txid(file.max),
            &format!("{digest}00"),
        ),
        min_txid: Txid(file.min),
        max_txid: Txid(file.max),
        size: file.records.len() as u64,
        file_checksum: file.max,
        post_apply_checksum: file.max,
    }
}

fn to_record(root: &Root) -> RootRecord {
    let new = NewCell {
        cell_id: cell(),
        kind: "log".into(),
        key: None,
        page_size: 4096,
        schema_version: 1,
    };
    let mut record = transition::create(&new, &holder(0), 0);
    record.owner = root.owner.map(node);
    record.owner_session = root.owner.map(|sid| holder(sid).session);
    record.state = if root.owner.is_some() {
        RootState::Active
    } else {
        RootState::Released
    };
    record.epoch = Epoch::new(root.epoch).expect("epochs start at 1");
    record.revision = root.revision;
    record.txid = Txid(root.txid);
    record.checksum = root.chain.last().map_or(0, |file| file.max);
    record.chain = root.chain.iter().map(ltx_ref).collect();
    record.log = root.log.map(|(sid, from_seq)| LogPointer {
        lane: lane_id(sid),
        from_seq,
    });
    record.validate().expect("the model builds valid roots");
    record
}

/// The abstract root of `record`; its chain's files are among `known`.
fn from_record(record: &RootRecord, known: &[File]) -> Root {
    let chain = record
        .chain
        .iter()
        .map(|reference| {
            known
                .iter()
                .find(|file| ltx_ref(file) == *reference)
                .cloned()
                .expect("every chain file is one the model made")
        })
        .collect();
    Root {
        owner: record
            .owner_session
            .map(|session| u8::try_from(session.as_u128() - 1).expect("a model session")),
        epoch: record.epoch.get(),
        revision: record.revision,
        txid: record.txid.0,
        chain,
        log: record
            .log
            .as_ref()
            .map(|pointer| (sid_of(&pointer.lane), pointer.from_seq)),
    }
}

impl State {
    fn lane_listing(&self, lane: Sid) -> BTreeMap<u64, Listed> {
        self.store
            .range((lane, 0)..=(lane, u64::MAX))
            .map(|((_, seq), obj)| (*seq, obj.listed()))
            .collect()
    }

    /// What a recovery from the current root finds: the chain's records,
    /// then the records past the chain in the slots the root points at, up
    /// to where a successor sealing now would seal. `Err` when the root
    /// reaches something that is gone or does not continue the chain.
    fn recover(&self) -> Result<Vec<u8>, String> {
        let mut records = Vec::new();
        for file in &self.root.chain {
            if !self.ltx.contains(file) {
                return Err(format!("chain file {file:?} is gone"));
            }
            records.extend(&file.records);
        }
        let Some((lane, from)) = self.root.log else {
            return Ok(records);
        };
        let floor = self.markers[usize::from(lane)];
        let listed = self.lane_listing(lane);
        let end = match plan(floor, &listed) {
            Plan::Sealed { at } => at,
            Plan::SealAt(seq) => seq,
        };
        let mut next = self.root.txid + 1;
        for seq in from.max(floor)..end {
            if let Some(Obj::Segment { record, txid }) = self.store.get(&(lane, seq)) {
                if *txid < next {
                    continue;
                }
                if *txid != next {
                    return Err(format!("slot {seq} holds TXID {txid}, {next} expected"));
                }
                records.push(*record);
                next += 1;
            }
        }
        Ok(records)
    }

    /// After session `sid` learned of its slots: the groups its verdict
    /// now acknowledges or refuses.
    fn settle(&mut self, sid: Sid) {
        let session = &self.sessions[usize::from(sid)];
        let verdict = verdict(0, &session.slots);
        let epoch = session.epoch;
        let mut acked = Vec::new();
        let mut refused = Vec::new();
        for (seq, (record, _)) in &session.records {
            match verdict.group(*seq) {
                GroupFate::Acknowledged => acked.push(*record),
                GroupFate::NotCommitted => refused.push(*record),
                GroupFate::Waiting => {}
            }
        }
        let owner_now = self.root.owner == Some(sid) && self.root.epoch == epoch;
        for record in acked {
            if self.acked.insert(record) {
                self.acked_at.insert((epoch, sid));
                if !owner_now {
                    self.seen.insert(Seen::AckedAfterTakeover);
                }
            }
        }
        for record in refused {
            if self.not_committed.insert(record) && !owner_now {
                self.seen.insert(Seen::ZombieRefused);
            }
        }
        if verdict.sealed_at.is_some() {
            self.sessions[usize::from(sid)].phase = Phase::Stopped;
        }
    }

    /// Owner `sid`'s checkpoint: `delta` (if any) into the chain and the
    /// pointer to its own lane at `from_seq`, proposed by the real
    /// `transition::propose` (which refuses a fenced owner) and CASed.
    fn checkpoint_cas(&mut self, sid: Sid, delta: Option<&File>, from_seq: u64) -> bool {
        let epoch = Epoch::new(self.sessions[usize::from(sid)].epoch).expect("an owner's epoch");
        let proposal = transition::propose(
            &to_record(&self.root),
            &holder(sid),
            epoch,
            delta.map(ltx_ref),
            None,
            Some(LogPointer {
                lane: lane_id(sid),
                from_seq,
            }),
            0,
        );
        let mut known = self.root.chain.clone();
        known.extend(delta.cloned());
        match proposal {
            Ok(next) => {
                let next = from_record(&next, &known);
                self.cas(sid, next)
            }
            Err(_) => false,
        }
    }

    /// The CAS of `proposal` against the revision `sid` expects.
    fn cas(&mut self, sid: Sid, proposal: Root) -> bool {
        if self.root.revision != self.sessions[usize::from(sid)].known_revision {
            return false;
        }
        self.sessions[usize::from(sid)].known_revision = proposal.revision;
        self.root = proposal;
        true
    }
}

impl Model for NodeLogModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let new = NewCell {
            cell_id: cell(),
            kind: "log".into(),
            key: None,
            page_size: 4096,
            schema_version: 1,
        };
        let created = transition::point_if_unpointed(
            transition::create(&new, &holder(0), 0),
            &holder(0),
            Some(LogPointer {
                lane: lane_id(0),
                from_seq: 0,
            }),
        )
        .expect("a first root points at its owner's lane");
        let root = from_record(&created, &[]);
        let mut first = Session::idle();
        first.phase = Phase::Serving;
        first.epoch = root.epoch;
        first.known_revision = root.revision;
        vec![State {
            root,
            store: BTreeMap::new(),
            markers: [0; SESSIONS],
            ltx: BTreeSet::new(),
            sessions: [first, Session::idle(), Session::idle()],
            next_record: 0,
            losses: 0,
            acked: BTreeSet::new(),
            not_committed: BTreeSet::new(),
            acked_at: BTreeSet::new(),
            dead_collectable: BTreeMap::new(),
            seal_deleted: false,
            seen: BTreeSet::new(),
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        for sid in 0..SESSIONS as Sid {
            let session = &state.sessions[usize::from(sid)];
            match &session.phase {
                Phase::Serving => {
                    if state.next_record < self.records_max
                        && session.pending.len() < self.in_flight_max
                    {
                        actions.push(Action::Write(sid));
                    }
                    if session.checkpoint.is_none() {
                        actions.push(Action::CheckpointUpload(sid));
                    } else {
                        actions.push(Action::CheckpointCas(sid));
                    }
                }
                Phase::Idle => {
                    if let Some(owner) = state.root.owner {
                        if owner != sid && state.sessions[usize::from(owner)].dead {
                            actions.push(Action::Takeover(sid));
                        }
                    }
                }
                Phase::Sealing { listed, floor, .. } => match (listed, floor) {
                    (None, _) => actions.push(Action::SealList(sid)),
                    (Some(_), None) => actions.push(Action::SealFloor(sid)),
                    (Some(_), Some(_)) => actions.push(Action::SealCreate(sid)),
                },
                Phase::Replaying { seqs, .. } => {
                    if seqs.is_none() {
                        actions.push(Action::ReplayList(sid));
                    } else {
                        actions.push(Action::ReplayRead(sid));
                    }
                }
                Phase::Activating { .. } => actions.push(Action::ActivateCas(sid)),
                Phase::Stopped => {}
            }
            // A session's PUTs still in flight land or get lost whatever
            // its phase (a fenced writer's requests are on the wire).
            for seq in &session.pending {
                actions.push(Action::Land(sid, *seq, true));
                if state.losses < self.losses_max {
                    actions.push(Action::Land(sid, *seq, false));
                    actions.push(Action::Lose(sid, *seq));
                }
            }
            if session.phase == Phase::Serving {
                for (seq, slot) in &session.slots {
                    if *slot == SlotState::InDoubt && !session.pending.contains(seq) {
                        actions.push(Action::Resend(sid, *seq));
                    }
                }
            }
            if state.root.owner == Some(sid) && !session.dead {
                actions.push(Action::Expire(sid));
            }
            // The lane's collector runs while the session has not learnt
            // that its lane is sealed.
            if matches!(session.phase, Phase::Serving) {
                actions.push(Action::CollectRaise(sid));
            }
            if !session.deleting.is_empty() {
                actions.push(Action::CollectDelete(sid));
            }
            if session.dead {
                if let Some(collectable) = state.dead_collectable.get(&sid) {
                    if collectable.0 < collectable.1 {
                        actions.push(Action::DeadLaneCollect(sid));
                    }
                } else {
                    actions.push(Action::DeadLaneCheck(sid));
                }
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        match action {
            Action::Write(sid) => {
                let record = state.next_record;
                state.next_record += 1;
                let session = &mut state.sessions[usize::from(sid)];
                session.txid += 1;
                session.local.push(record);
                let seq = session.next_seq;
                session.next_seq += 1;
                session.slots.insert(seq, SlotState::InFlight);
                session.pending.insert(seq);
                session.records.insert(seq, (record, session.txid));
                session.hold = Some(session.hold.map_or(seq, |held| held.min(seq)));
            }
            Action::Land(sid, seq, reply) => {
                let session = &mut state.sessions[usize::from(sid)];
                session.pending.remove(&seq);
                let (record, txid) = session.records[&seq];
                let key = (sid, seq);
                let found = state
                    .store
                    .entry(key)
                    .or_insert(Obj::Segment { record, txid })
                    .clone();
                let floor = state.markers[usize::from(sid)];
                let session = &mut state.sessions[usize::from(sid)];
                if reply {
                    // `LaneWriter`: a slot that holds ours is written; a
                    // seal there ends the lane, unless the slot is below
                    // the lane's floor: it was written (only written slots
                    // are collected) and a sealer that read the floor
                    // before the collection sealed the emptied slot.
                    let known = match found {
                        Obj::Seal if seq >= floor => SlotState::Sealed,
                        _ => SlotState::Written,
                    };
                    session.slots.insert(seq, known);
                } else {
                    state.losses += 1;
                    session.slots.insert(seq, SlotState::InDoubt);
                }
                state.settle(sid);
            }
            Action::Lose(sid, seq) => {
                state.losses += 1;
                let session = &mut state.sessions[usize::from(sid)];
                session.pending.remove(&seq);
                session.slots.insert(seq, SlotState::InDoubt);
            }
            Action::Resend(sid, seq) => {
                let session = &mut state.sessions[usize::from(sid)];
                session.slots.insert(seq, SlotState::InFlight);
                session.pending.insert(seq);
            }
            Action::CheckpointUpload(sid) => {
                let session = &mut state.sessions[usize::from(sid)];
                let acked_below = verdict(0, &session.slots).acked_below;
                let records: Vec<(u8, u64)> = session
                    .records
                    .range(..acked_below)
                    .map(|(_, r)| *r)
                    .filter(|(_, txid)| *txid > session.root_txid)
                    .collect();
                if records.is_empty() {
                    return None;
                }
                let file = File {
                    epoch: session.epoch,
                    min: records[0].1,
                    max: records[records.len() - 1].1,
                    records: records.iter().map(|(r, _)| *r).collect(),
                };
                session.checkpoint = Some((file.clone(), acked_below));
                state.ltx.insert(file);
            }
            Action::CheckpointCas(sid) => {
                let (file, from) = state.sessions[usize::from(sid)]
                    .checkpoint
                    .clone()
                    .expect("uploaded");
                let landed = state.checkpoint_cas(sid, Some(&file), from);
                let session = &mut state.sessions[usize::from(sid)];
                session.checkpoint = None;
                if landed {
                    session.root_txid = file.max;
                    session.hold = session.records.range(from..).map(|(seq, _)| *seq).next();
                } else {
                    // Fenced: a successor owns the Cell.
                    session.phase = Phase::Stopped;
                }
            }
            Action::Expire(sid) => state.sessions[usize::from(sid)].dead = true,
            Action::Takeover(sid) => {
                let proposal =
                    transition::takeover(&to_record(&state.root), Liveness::Dead, &holder(sid), 0)
                        .ok()?;
                let next = from_record(&proposal, &state.root.chain);
                let chain_records: Vec<u8> =
                    next.chain.iter().flat_map(|f| f.records.clone()).collect();
                let session = &mut state.sessions[usize::from(sid)];
                // Its CAS expectation is the root it read.
                session.known_revision = last.root.revision;
                if !state.cas(sid, next) {
                    return None;
                }
                let root = state.root.clone();
                let session = &mut state.sessions[usize::from(sid)];
                session.epoch = root.epoch;
                session.root_txid = root.txid;
                session.txid = root.txid;
                session.local = chain_records;
                session.phase = match root.log {
                    Some((lane, from)) if lane != sid => Phase::Sealing {
                        lane,
                        from,
                        listed: None,
                        floor: None,
                    },
                    _ => Phase::Activating {
                        records: Vec::new(),
                    },
                };
            }
            Action::SealList(sid) => {
                let Phase::Sealing { lane, .. } = state.sessions[usize::from(sid)].phase else {
                    unreachable!()
                };
                let listing = state.lane_listing(lane);
                if let Phase::Sealing { listed, .. } = &mut state.sessions[usize::from(sid)].phase {
                    *listed = Some(listing);
                }
            }
            Action::SealFloor(sid) => {
                let Phase::Sealing { lane, .. } = state.sessions[usize::from(sid)].phase else {
                    unreachable!()
                };
                let marker = state.markers[usize::from(lane)];
                if let Phase::Sealing { floor, .. } = &mut state.sessions[usize::from(sid)].phase {
                    *floor = Some(marker);
                }
            }
            Action::SealCreate(sid) => {
                let Phase::Sealing {
                    lane,
                    from,
                    listed: Some(listed),
                    floor: Some(floor),
                } = state.sessions[usize::from(sid)].phase.clone()
                else {
                    unreachable!()
                };
                let sealed_at = match plan(floor, &listed) {
                    Plan::Sealed { .. } => true,
                    Plan::SealAt(seq) => match state.store.get(&(lane, seq)).cloned() {
                        None => {
                            state.store.insert((lane, seq), Obj::Seal);
                            true
                        }
                        Some(found) => {
                            state.seen.insert(Seen::SealRace);
                            match after_refused(seq, found.listed()) {
                                AfterRefused::Sealed { .. } => true,
                                AfterRefused::PlanAgain => {
                                    let mut listed = listed;
                                    listed.insert(seq, found.listed());
                                    state.sessions[usize::from(sid)].phase = Phase::Sealing {
                                        lane,
                                        from,
                                        listed: Some(listed),
                                        floor: Some(floor),
                                    };
                                    false
                                }
                            }
                        }
                    },
                };
                if sealed_at {
                    state.sessions[usize::from(sid)].phase = Phase::Replaying {
                        lane,
                        from,
                        seqs: None,
                    };
                }
            }
            Action::ReplayList(sid) => {
                // `read_lane`: a listing, its floor, the run to the seal.
                let Phase::Replaying { lane, from, .. } = state.sessions[usize::from(sid)].phase
                else {
                    unreachable!()
                };
                let listed = state.lane_listing(lane);
                let floor = state.markers[usize::from(lane)];
                let Some(end) = log_end(floor, &listed) else {
                    // Sealed above a collected gap: cannot happen (the
                    // seal goes into the first gap above the floor).
                    panic!("a sealed lane has no end: {listed:?} floor {floor}");
                };
                let seqs = listed
                    .range(floor..end)
                    .map(|(seq, _)| *seq)
                    .filter(|seq| *seq >= from)
                    .collect();
                if let Phase::Replaying { seqs: slot, .. } =
                    &mut state.sessions[usize::from(sid)].phase
                {
                    *slot = Some(seqs);
                }
            }
            Action::ReplayRead(sid) => {
                // `read_records` (a slot gone since the listing is skipped)
                // then `check_tail` (past the root's TXID, contiguous).
                let session = &state.sessions[usize::from(sid)];
                let Phase::Replaying {
                    lane,
                    seqs: Some(seqs),
                    ..
                } = &session.phase
                else {
                    unreachable!()
                };
                let mut next = session.root_txid + 1;
                let mut records = Vec::new();
                let mut failed = false;
                for seq in seqs {
                    if let Some(Obj::Segment { record, txid }) = state.store.get(&(*lane, *seq)) {
                        if *txid < next {
                            continue;
                        }
                        if *txid != next {
                            failed = true;
                            break;
                        }
                        records.push((*record, *txid));
                        next += 1;
                    }
                }
                if records
                    .iter()
                    .any(|(record, _)| state.acked.contains(record))
                {
                    state.seen.insert(Seen::AckedRecordReplayed);
                }
                let session = &mut state.sessions[usize::from(sid)];
                if failed {
                    session.phase = Phase::Stopped;
                } else {
                    for (record, txid) in &records {
                        session.local.push(*record);
                        session.txid = *txid;
                    }
                    session.phase = Phase::Activating { records };
                }
            }
            Action::ActivateCas(sid) => {
                let session = &state.sessions[usize::from(sid)];
                let Phase::Activating { records } = &session.phase else {
                    unreachable!()
                };
                let file = (!records.is_empty()).then(|| File {
                    epoch: session.epoch,
                    min: records[0].1,
                    max: records[records.len() - 1].1,
                    records: records.iter().map(|(r, _)| *r).collect(),
                });
                if let Some(file) = &file {
                    state.ltx.insert(file.clone());
                }
                let from = state.sessions[usize::from(sid)].next_seq;
                let landed = state.checkpoint_cas(sid, file.as_ref(), from);
                let session = &mut state.sessions[usize::from(sid)];
                if landed {
                    session.root_txid = session.txid;
                    session.phase = Phase::Serving;
                } else {
                    session.phase = Phase::Stopped;
                }
            }
            Action::CollectRaise(sid) => {
                let session = &state.sessions[usize::from(sid)];
                let acked_below = verdict(0, &session.slots).acked_below;
                let floor = session
                    .hold
                    .map_or(acked_below, |held| held.min(acked_below));
                let marker = state.markers[usize::from(sid)];
                if floor <= marker {
                    return None;
                }
                state.markers[usize::from(sid)] = floor;
                state.sessions[usize::from(sid)]
                    .deleting
                    .extend(marker..floor);
            }
            Action::CollectDelete(sid) => {
                let seq = state.sessions[usize::from(sid)].deleting.remove(0);
                if let Some(obj) = state.store.remove(&(sid, seq)) {
                    state.seal_deleted |= obj == Obj::Seal;
                    state.seen.insert(Seen::LiveLaneCollected);
                }
            }
            Action::DeadLaneCheck(lane) => {
                // The flusher's check: the lane is sealed, and no root
                // needs its records (`needs_lane`).
                let listed = state.lane_listing(lane);
                let floor = state.markers[usize::from(lane)];
                let end = log_end(floor, &listed)?;
                let max_txid = (floor..end)
                    .filter_map(|seq| match state.store.get(&(lane, seq)) {
                        Some(Obj::Segment { txid, .. }) => Some(*txid),
                        _ => None,
                    })
                    .max()
                    .unwrap_or(0);
                let needed =
                    state.root.log.is_some_and(|(l, _)| l == lane) && state.root.txid < max_txid;
                if needed {
                    return None;
                }
                state.dead_collectable.insert(lane, (floor, end));
            }
            Action::DeadLaneCollect(lane) => {
                let (floor, end) = state.dead_collectable[&lane];
                let marker = &mut state.markers[usize::from(lane)];
                *marker = (*marker).max(end);
                for seq in floor..end {
                    if let Some(obj) = state.store.remove(&(lane, seq)) {
                        state.seal_deleted |= obj == Obj::Seal;
                        state.seen.insert(Seen::DeadLaneCollected);
                    }
                }
                state.dead_collectable.insert(lane, (end, end));
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("no acknowledged record is lost", |_, state: &State| {
                state
                    .recover()
                    .is_ok_and(|found| state.acked.iter().all(|r| found.contains(r)))
            }),
            Property::always("nothing refused counts", |_, state: &State| {
                let found = state.recover().unwrap_or_default();
                let owner_state = serving_owner(state).map(|s| s.local.clone());
                state.not_committed.iter().all(|r| {
                    !found.contains(r) && owner_state.as_ref().is_none_or(|l| !l.contains(r))
                })
            }),
            Property::always(
                "the owner's state extends what recovery finds",
                |_, state: &State| match (serving_owner(state), state.recover()) {
                    (Some(owner), Ok(found)) => owner.local.starts_with(&found),
                    _ => true,
                },
            ),
            Property::always("one session per epoch acknowledges", |_, state: &State| {
                state
                    .acked_at
                    .iter()
                    .zip(state.acked_at.iter().skip(1))
                    .all(|((e1, s1), (e2, s2))| e1 != e2 || s1 == s2)
            }),
            Property::always(
                "collection keeps what the root reaches and every seal",
                |_, state: &State| state.recover().is_ok() && !state.seal_deleted,
            ),
            Property::sometimes(
                "a zombie's record is refused by a seal",
                |_, state: &State| state.seen.contains(&Seen::ZombieRefused),
            ),
            Property::sometimes(
                "a record acknowledged after the takeover CAS counts",
                |_, s: &State| s.seen.contains(&Seen::AckedAfterTakeover),
            ),
            Property::sometimes(
                "a successor replays an acknowledged record",
                |_, state: &State| state.seen.contains(&Seen::AckedRecordReplayed),
            ),
            Property::sometimes(
                "two successors meet at one seal slot",
                |_, state: &State| state.seen.contains(&Seen::SealRace),
            ),
            Property::sometimes("a live lane is collected", |_, state: &State| {
                state.seen.contains(&Seen::LiveLaneCollected)
            }),
            Property::sometimes("a dead lane is collected", |_, state: &State| {
                state.seen.contains(&Seen::DeadLaneCollected)
            }),
        ]
    }
}

/// The session serving as the root's owner, if one is.
fn serving_owner(state: &State) -> Option<&Session> {
    let owner = state.root.owner?;
    let session = &state.sessions[usize::from(owner)];
    (session.phase == Phase::Serving && session.epoch == state.root.epoch).then_some(session)
}

#[test]
fn the_node_log_keeps_every_acknowledged_record_in_every_interleaving() {
    let checker = NodeLogModel {
        records_max: 3,
        losses_max: 1,
        in_flight_max: 2,
    }
    .checker()
    .threads(std::thread::available_parallelism().map_or(1, usize::from))
    .spawn_bfs()
    .join();
    println!(
        "node log model: {} states, {} unique, depth {}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth()
    );
    checker.assert_properties();
}
