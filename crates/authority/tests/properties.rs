//! Property tests of the pure transitions, lease rules and reconciliation, driven through a model compare-and-swap register.

use std::collections::BTreeMap;

use cellfleet_authority::lease::{self, acquire_record, renewal, session_liveness, LeaseConfig};
use cellfleet_authority::transition::{self, Activation, Holder, NewCell};
use cellfleet_authority::{
    reconcile, CellId, Endpoints, Epoch, Error, LeaseRecord, Liveness, LtxRef, NodeId,
    Reconciliation, RootRecord, RootState, SessionId, Txid,
};
use proptest::prelude::*;

const LEASE: LeaseConfig = LeaseConfig {
    lease_ms: 10_000,
    renew_every_ms: 3_000,
    drift_margin_ms: 500,
};

fn cell() -> NewCell {
    NewCell {
        cell_id: CellId::for_kind_key("kv", b"model"),
        kind: "kv".to_owned(),
        key: Some("model".to_owned()),
        page_size: 4096,
        schema_version: 1,
    }
}

/// A delta LTX file continuing `root`, with a key unique to (epoch, txids, tag).
fn delta(root: &RootRecord, files: u64, tag: u64) -> LtxRef {
    let min = root.txid.0 + 1;
    let max = root.txid.0 + files;
    LtxRef {
        key: format!(
            "p/cells/{}/ltx/{:016x}/{min:016x}-{max:016x}-{tag:x}.ltx",
            root.cell_id,
            root.epoch.get()
        ),
        min_txid: Txid(min),
        max_txid: Txid(max),
        size: 100,
        file_checksum: tag,
        post_apply_checksum: tag.wrapping_mul(31).wrapping_add(max),
    }
}

/// A compare-and-swap register standing in for the bucket: the ETag is the
/// write sequence number, so it changes on every write.
#[derive(Debug, Default)]
struct Register {
    current: Option<(RootRecord, u64)>,
    writes: u64,
    history: Vec<RootRecord>,
}

impl Register {
    fn cas(&mut self, expected: Option<u64>, proposal: RootRecord) -> Option<u64> {
        let holds = match (&self.current, expected) {
            (None, None) => true,
            (Some((_, etag)), Some(expected)) => *etag == expected,
            _ => false,
        };
        if !holds {
            return None;
        }
        proposal.validate().expect("every proposal is a valid root");
        self.writes += 1;
        self.current = Some((proposal.clone(), self.writes));
        self.history.push(proposal);
        Some(self.writes)
    }
}

#[derive(Clone, Debug)]
enum Step {
    Advance(u64),
    Renew(usize),
    Restart(usize),
    Read(usize),
    Activate(usize),
    Publish(usize, u64),
    Compact(usize),
    Release(usize),
}

fn step() -> impl Strategy<Value = Step> {
    let node = 0..3_usize;
    prop_oneof![
        (0..8_000_u64).prop_map(Step::Advance),
        node.clone().prop_map(Step::Renew),
        node.clone().prop_map(Step::Restart),
        node.clone().prop_map(Step::Read),
        node.clone().prop_map(Step::Activate),
        (node.clone(), 1..4_u64).prop_map(|(n, f)| Step::Publish(n, f)),
        node.clone().prop_map(Step::Compact),
        node.prop_map(Step::Release),
    ]
}

struct Node {
    id: NodeId,
    session: SessionId,
    view: Option<(RootRecord, u64)>,
}

struct World {
    now_ms: u64,
    nodes: Vec<Node>,
    leases: BTreeMap<NodeId, LeaseRecord>,
    /// Local deadline (ms, same time base: no skew in the model) per session.
    deadlines: BTreeMap<SessionId, u64>,
    register: Register,
    /// Every owner ever accepted per epoch.
    owners: BTreeMap<u64, (NodeId, SessionId)>,
    next_tag: u64,
    sessions: u128,
}

impl World {
    fn new() -> Self {
        let mut world = World {
            now_ms: 1_000_000,
            nodes: Vec::new(),
            leases: BTreeMap::new(),
            deadlines: BTreeMap::new(),
            register: Register::default(),
            owners: BTreeMap::new(),
            next_tag: 1,
            sessions: 0,
        };
        for n in 0..3 {
            let id = NodeId::new(format!("n{n}")).unwrap();
            let session = world.fresh_session();
            world.nodes.push(Node {
                id,
                session,
                view: None,
            });
            world.write_lease(n, true);
        }
        world
    }

    fn fresh_session(&mut self) -> SessionId {
        self.sessions += 1;
        SessionId::from_u128(self.sessions)
    }

    fn holder(&self, n: usize) -> Holder {
        Holder {
            node: self.nodes[n].id.clone(),
            session: self.nodes[n].session,
        }
    }

    /// Acquire (fresh) or renew node `n`'s lease, sent at `now_ms`.
    fn write_lease(&mut self, n: usize, fresh: bool) {
        let node = &self.nodes[n];
        let previous = self.leases.get(&node.id);
        let record = match previous {
            Some(previous) if !fresh => renewal(previous, self.now_ms, &LEASE),
            _ => acquire_record(
                previous,
                node.id.clone(),
                node.session,
                Endpoints::default(),
                self.now_ms,
                &LEASE,
            ),
        };
        self.deadlines.insert(
            node.session,
            self.now_ms + LEASE.lease_ms - LEASE.drift_margin_ms,
        );
        self.leases.insert(node.id.clone(), record);
    }

    fn liveness_of_owner(&self, root: &RootRecord) -> Liveness {
        match (&root.owner, root.owner_session) {
            (Some(owner), Some(session)) => session_liveness(
                self.leases.get(owner),
                session,
                self.now_ms,
                LEASE.drift_margin_ms,
            ),
            _ => Liveness::Dead,
        }
    }

    /// Performs a CAS for node `n` from its view and checks the invariants.
    fn commit(
        &mut self,
        n: usize,
        base_etag: Option<u64>,
        proposal: RootRecord,
        takeover_from: Option<&RootRecord>,
    ) {
        let before = self.register.current.clone();
        let Some(etag) = self.register.cas(base_etag, proposal.clone()) else {
            return;
        };
        // Revision advances by exactly one per successful write.
        if let Some((before, _)) = &before {
            assert_eq!(proposal.revision, before.revision + 1);
            assert!(proposal.epoch >= before.epoch, "epochs never go back");
            assert!(proposal.txid >= before.txid, "txids never go back");
        }
        // Never two owners in one epoch.
        if let (Some(owner), Some(session)) = (&proposal.owner, proposal.owner_session) {
            let first = self
                .owners
                .entry(proposal.epoch.get())
                .or_insert_with(|| (owner.clone(), session));
            assert_eq!(
                *first,
                (owner.clone(), session),
                "two owners in epoch {}",
                proposal.epoch
            );
        }
        // A takeover never happens while the old owner may still serve on
        // its local deadline.
        if let Some(previous) = takeover_from {
            if previous.state == RootState::Active {
                let session = previous.owner_session.expect("active roots have a session");
                let deadline = self.deadlines.get(&session).copied().unwrap_or(0);
                assert!(
                    deadline <= self.now_ms,
                    "took over while the owner's local deadline {deadline} > now {}",
                    self.now_ms
                );
            }
        }
        self.nodes[n].view = Some((proposal, etag));
    }

    fn run(&mut self, step: Step) {
        match step {
            Step::Advance(ms) => self.now_ms += ms,
            Step::Renew(n) => self.write_lease(n, false),
            Step::Restart(n) => {
                self.nodes[n].session = self.fresh_session();
                self.nodes[n].view = None;
                self.write_lease(n, true);
            }
            Step::Read(n) => self.nodes[n].view = self.register.current.clone(),
            Step::Activate(n) => {
                let current = self.register.current.clone();
                let liveness = current
                    .as_ref()
                    .map_or(Liveness::Dead, |(root, _)| self.liveness_of_owner(root));
                let me = self.holder(n);
                let decision = transition::activate(
                    current.as_ref().map(|(root, _)| root),
                    liveness,
                    &me,
                    &cell(),
                    self.now_ms,
                )
                .expect("activation decides");
                match decision {
                    Activation::Create(proposal) => self.commit(n, None, proposal, None),
                    Activation::Takeover(proposal) => {
                        let (root, etag) = current.expect("takeover needs a root");
                        assert_eq!(proposal.epoch.get(), root.epoch.get() + 1);
                        self.commit(n, Some(etag), proposal, Some(&root));
                    }
                    Activation::Adopt => self.nodes[n].view = current,
                    Activation::OwnerLive { until_ms, .. } => {
                        assert!(until_ms > self.now_ms);
                        assert!(matches!(liveness, Liveness::Live { .. }));
                    }
                }
            }
            Step::Publish(n, files) => {
                let Some((view, etag)) = self.nodes[n].view.clone() else {
                    return;
                };
                let tag = self.next_tag;
                self.next_tag += 1;
                let me = self.holder(n);
                match transition::publish(
                    &view,
                    &me,
                    view.epoch,
                    delta(&view, files, tag),
                    self.now_ms,
                ) {
                    Ok(proposal) => self.commit(n, Some(etag), proposal, None),
                    Err(Error::Fenced { .. }) => {
                        assert!(!view.is_owned_by(&me.node, me.session, view.epoch))
                    }
                    Err(other) => panic!("unexpected publish refusal: {other}"),
                }
            }
            Step::Compact(n) => {
                let Some((view, etag)) = self.nodes[n].view.clone() else {
                    return;
                };
                let Some(last) = view.chain.last() else {
                    return;
                };
                let tag = self.next_tag;
                self.next_tag += 1;
                let compacted = LtxRef {
                    key: format!(
                        "p/cells/{}/ltx/{:016x}/snapshot-{tag:x}.ltx",
                        view.cell_id,
                        view.epoch.get()
                    ),
                    min_txid: Txid(1),
                    max_txid: last.max_txid,
                    size: 1,
                    file_checksum: tag,
                    post_apply_checksum: last.post_apply_checksum,
                };
                let me = self.holder(n);
                let next_delta = delta(&view, 1, tag + 1_000_000);
                match transition::compact_and_publish(
                    &view,
                    &me,
                    view.epoch,
                    compacted,
                    Some(next_delta),
                    self.now_ms,
                ) {
                    Ok(proposal) => {
                        assert_eq!(proposal.chain.len(), 2);
                        assert_eq!(proposal.txid, Txid(view.txid.0 + 1));
                        self.commit(n, Some(etag), proposal, None);
                    }
                    Err(Error::Fenced { .. }) => {}
                    Err(other) => panic!("unexpected compaction refusal: {other}"),
                }
            }
            Step::Release(n) => {
                let Some((view, etag)) = self.nodes[n].view.clone() else {
                    return;
                };
                let me = self.holder(n);
                if let Ok(proposal) = transition::release(&view, &me, view.epoch, self.now_ms) {
                    assert_eq!(proposal.state, RootState::Released);
                    self.commit(n, Some(etag), proposal, None);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// Random interleavings of activations, publications, compactions,
    /// releases, renewals, restarts and time: never two owners in one epoch,
    /// revisions +1, epochs and TXIDs monotone, no takeover while the owner's
    /// local deadline holds.
    #[test]
    fn fencing_holds_under_any_interleaving(steps in proptest::collection::vec(step(), 1..80)) {
        let mut world = World::new();
        for step in steps {
            world.run(step);
        }
        for pair in world.register.history.windows(2) {
            prop_assert_eq!(pair[1].revision, pair[0].revision + 1);
        }
    }

    /// A publish (or release, or compaction) from a stale epoch or by a
    /// non-owner is refused by the pure function itself, before any CAS.
    #[test]
    fn stale_epochs_and_non_owners_are_fenced(
        owner_epoch in 1..50_u64,
        claimed_epoch in 1..50_u64,
        same_node in any::<bool>(),
        same_session in any::<bool>(),
    ) {
        let owner = Holder { node: NodeId::new("owner").unwrap(), session: SessionId::from_u128(1) };
        let mut root = transition::create(&cell(), &owner, 0);
        root.epoch = Epoch::new(owner_epoch).unwrap();
        let claimant = Holder {
            node: if same_node { owner.node.clone() } else { NodeId::new("other").unwrap() },
            session: if same_session { owner.session } else { SessionId::from_u128(2) },
        };
        let epoch = Epoch::new(claimed_epoch).unwrap();
        let legit = same_node && same_session && owner_epoch == claimed_epoch;
        let published = transition::publish(&root, &claimant, epoch, delta(&root, 1, 9), 1);
        prop_assert_eq!(published.is_ok(), legit);
        if !legit {
            let fenced = matches!(published, Err(Error::Fenced { .. }));
            prop_assert!(fenced, "expected fenced");
            prop_assert!(transition::release(&root, &claimant, epoch, 1).is_err());
        }
    }

    /// Takeover is refused while the owner's session is live and allowed
    /// once its lease expired plus the margin (or it retired).
    #[test]
    fn takeover_waits_for_expiry_plus_margin(
        renewed_at in 0..1_000_000_u64,
        elapsed in 0..30_000_u64,
        retired in any::<bool>(),
        restarted in any::<bool>(),
    ) {
        let owner = Holder { node: NodeId::new("owner").unwrap(), session: SessionId::from_u128(1) };
        let root = transition::create(&cell(), &owner, renewed_at);
        let mut lease = acquire_record(None, owner.node.clone(), owner.session, Endpoints::default(), renewed_at, &LEASE);
        if retired {
            lease = lease::retirement(&lease, renewed_at);
        }
        if restarted {
            // The owner restarted at the same instant: a new session replaced the record.
            lease = acquire_record(Some(&lease), owner.node.clone(), SessionId::from_u128(3), Endpoints::default(), renewed_at, &LEASE);
        }
        let now = renewed_at + elapsed;
        let liveness = session_liveness(Some(&lease), owner.session, now, LEASE.drift_margin_ms);
        let me = Holder { node: NodeId::new("me").unwrap(), session: SessionId::from_u128(2) };
        let result = transition::takeover(&root, liveness, &me, now);
        let live_until = renewed_at + LEASE.lease_ms + LEASE.drift_margin_ms;
        if !retired && now < live_until {
            let refused = matches!(result, Err(Error::LeaseLive { until_ms, .. }) if until_ms == live_until);
            prop_assert!(refused, "{:?}", result);
        } else {
            let proposal = result.expect("takeover allowed");
            prop_assert_eq!(proposal.epoch.get(), 2);
            prop_assert_eq!(proposal.owner, Some(me.node));
            // The owner's own local deadline passed before any takeover.
            prop_assert!(renewed_at + LEASE.lease_ms - LEASE.drift_margin_ms <= now || retired);
        }
    }

    /// Reconciliation is sound: it never says Committed for a proposal that
    /// is not in the root's history, nor NotCommitted for one that is.
    #[test]
    fn reconciliation_is_sound(
        before in proptest::collection::vec(step(), 0..30),
        proposer in 0..3_usize,
        apply in any::<bool>(),
        after in proptest::collection::vec(step(), 0..30),
    ) {
        let mut world = World::new();
        // Make sure someone owns the cell, then play a random prefix.
        world.run(Step::Activate(0));
        for step in before {
            world.run(step);
        }
        let Some((base, base_etag)) = world.register.current.clone() else {
            return Ok(());
        };
        // The proposer builds a publication (or takeover) on the current root.
        let me = world.holder(proposer);
        let tag = 77_777;
        let proposal = if base.is_owned_by(&me.node, me.session, base.epoch) {
            transition::publish(&base, &me, base.epoch, delta(&base, 1, tag), world.now_ms).unwrap()
        } else {
            match transition::takeover(&base, Liveness::Dead, &me, world.now_ms) {
                Ok(proposal) => proposal,
                Err(_) => return Ok(()),
            }
        };
        let committed = apply && world.register.cas(Some(base_etag), proposal.clone()).is_some();
        if committed {
            world.nodes[proposer].view = world.register.current.clone();
        }
        for step in after {
            world.run(step);
        }
        let observed = world.register.current.as_ref().map(|(root, _)| root);
        // Ground truth: the exact proposal is in the history (it may also get
        // there later through an identical decision by the same session).
        let in_history = world.register.history.contains(&proposal);
        prop_assert!(in_history || !committed);
        match reconcile(Some(&base), &proposal, observed) {
            Reconciliation::Committed => prop_assert!(in_history, "reported committed but not in history"),
            Reconciliation::NotCommitted => prop_assert!(!in_history, "reported not committed but in history"),
            // Not in it yet, and the root is the base a late write could
            // still match: only a resend may settle it.
            Reconciliation::NotYet => {
                prop_assert!(!in_history, "reported not yet but in history");
                prop_assert_eq!(observed, Some(&base));
            }
            Reconciliation::Unknown => {}
        }
        // The plain lost-reply case is always decided.
        if observed == Some(&proposal) {
            prop_assert_eq!(reconcile(Some(&base), &proposal, observed), Reconciliation::Committed);
        }
        // The root still at the base is never "not committed": a PUT that
        // timed out at the client may still be applied by the store.
        if observed == Some(&base) {
            prop_assert_eq!(reconcile(Some(&base), &proposal, observed), Reconciliation::NotYet);
        }
    }
}
