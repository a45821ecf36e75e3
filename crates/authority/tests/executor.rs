//! The CAS executors against real stores and the fault-injecting wrapper: activation, takeover, fencing, lost replies, leases.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cellfleet_authority::transition::{self, Holder, NewCell};
use cellfleet_authority::{
    Activated, CellId, Clock, Endpoints, Error, Layout, LeaseConfig, LtxRef, ManualClock, NodeId,
    NodeLeases, OwnedHow, RootRecord, Roots, SessionId, Versioned,
};
use cellfleet_store::{
    testkit, Fault, FaultStore, LocalStore, MemoryStore, ObjectStore, Op, Outcome, PutCondition,
};

const CONFIG: LeaseConfig = LeaseConfig {
    lease_ms: 10_000,
    renew_every_ms: 3_000,
    drift_margin_ms: 500,
};

struct Fixture {
    faults: Arc<FaultStore>,
    clock: Arc<ManualClock>,
    roots: Roots,
    leases: NodeLeases,
    layout: Layout,
}

fn fixture_on(store: Arc<dyn ObjectStore>, prefix: &str) -> Fixture {
    let faults = Arc::new(FaultStore::new(store));
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let layout = Layout::new(prefix).unwrap();
    let roots = Roots::new(
        faults.clone(),
        layout.clone(),
        clock.clone(),
        CONFIG.drift_margin_ms,
    );
    let leases = NodeLeases::new(faults.clone(), layout.clone(), clock.clone(), CONFIG).unwrap();
    Fixture {
        faults,
        clock,
        roots,
        leases,
        layout,
    }
}

fn fixture() -> Fixture {
    fixture_on(Arc::new(MemoryStore::new()), "cluster")
}

fn new_cell(key: &str) -> NewCell {
    NewCell {
        cell_id: CellId::for_kind_key("kv", key.as_bytes()),
        kind: "kv".into(),
        key: Some(key.into()),
        page_size: 4096,
        schema_version: 1,
    }
}

fn delta(layout: &Layout, root: &RootRecord, tag: &str) -> LtxRef {
    let min = root.txid.next().unwrap();
    LtxRef {
        key: layout.ltx_key(&root.cell_id, root.epoch, min, min, tag),
        min_txid: min,
        max_txid: min,
        size: 64,
        file_checksum: 1,
        post_apply_checksum: min.0 * 1000,
    }
}

async fn start_node(f: &Fixture, name: &str) -> (Holder, cellfleet_authority::HeldLease) {
    let held = f
        .leases
        .acquire(NodeId::new(name).unwrap(), Endpoints::default())
        .await
        .expect("acquire lease");
    let holder = Holder {
        node: held.record.node_id.clone(),
        session: held.session(),
    };
    (holder, held)
}

fn owned(activated: Activated) -> (Versioned<RootRecord>, OwnedHow) {
    match activated {
        Activated::Owned { root, how } => (*root, how),
        other => panic!("expected ownership, got {other:?}"),
    }
}

/// Create → adopt → a second node is routed → expiry → takeover (epoch 2)
/// → the old owner's publication is fenced.
async fn activation_takeover_and_fencing(f: Fixture) {
    let cell = new_cell("alice");
    let (a, _a_lease) = start_node(&f, "node-a").await;
    let (b, b_lease) = start_node(&f, "node-b").await;

    let (root, how) = owned(f.roots.activate(&cell, &a).await.unwrap());
    assert_eq!(
        (how, root.record.epoch.get(), root.record.revision),
        (OwnedHow::Created, 1, 1)
    );
    let (again, how) = owned(f.roots.activate(&cell, &a).await.unwrap());
    assert_eq!((how, &again), (OwnedHow::Adopted, &root));

    match f.roots.activate(&cell, &b).await.unwrap() {
        Activated::OwnerLive { owner, until_ms } => {
            assert_eq!(owner, a.node);
            assert_eq!(
                until_ms,
                f.clock.now_wall_ms() + CONFIG.lease_ms + CONFIG.drift_margin_ms
            );
        }
        other => panic!("expected the live owner, got {other:?}"),
    }

    // A publishes once while it owns the cell.
    let proposal = transition::publish(
        &root.record,
        &a,
        root.record.epoch,
        delta(&f.layout, &root.record, "aa"),
        1,
    )
    .unwrap();
    let published = f.roots.replace(&root, proposal).await.unwrap();
    assert_eq!((published.record.txid.0, published.record.revision), (1, 2));

    // A stops renewing; B keeps its lease and takes over after expiry + margin.
    f.clock.advance(Duration::from_millis(
        CONFIG.lease_ms + CONFIG.drift_margin_ms,
    ));
    let _b_lease = f.leases.renew(&b_lease).await.unwrap();
    let (taken, how) = owned(f.roots.activate(&cell, &b).await.unwrap());
    assert_eq!(how, OwnedHow::TookOver);
    assert_eq!((taken.record.epoch.get(), taken.record.txid.0), (2, 1));
    assert_eq!(taken.record.owner.as_ref(), Some(&b.node));

    // A's next publication, built on its stale view, is fenced by the CAS.
    let stale = transition::publish(
        &published.record,
        &a,
        published.record.epoch,
        delta(&f.layout, &published.record, "ab"),
        2,
    )
    .unwrap();
    let result = f.roots.replace(&published, stale).await;
    assert!(matches!(result, Err(Error::Fenced { .. })), "{result:?}");
    // And the pure function refuses it on a fresh read.
    let fresh = f.roots.read(&cell.cell_id).await.unwrap().unwrap();
    assert!(matches!(
        transition::publish(
            &fresh.record,
            &a,
            published.record.epoch,
            delta(&f.layout, &fresh.record, "ac"),
            3
        ),
        Err(Error::Fenced { .. })
    ));
    assert_eq!(
        fresh, taken,
        "the rejected successor left the root unchanged"
    );
}

#[tokio::test]
async fn activation_takeover_and_fencing_in_memory() {
    activation_takeover_and_fencing(fixture()).await;
}

#[tokio::test]
async fn activation_takeover_and_fencing_on_local_directory() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(LocalStore::open(dir.path()).unwrap());
    activation_takeover_and_fencing(fixture_on(store, "cluster")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn activation_takeover_and_fencing_on_seaweedfs() {
    let store = testkit::s3_store().await;
    activation_takeover_and_fencing(fixture_on(store, &testkit::unique_prefix("authority"))).await;
}

/// An activation decided on an absence the caller read earlier makes no
/// read of its own when the root is still absent, and a stale absence
/// (another node created the root since) overwrites nothing: the
/// create-only write is refused and the refusal names the live holder.
/// The same session's own earlier create (a lost reply) is the root.
#[tokio::test]
async fn an_activation_on_a_known_absence_reads_nothing_and_overwrites_nothing() {
    let f = fixture();
    let (a, _a_lease) = start_node(&f, "node-a").await;
    let (b, _b_lease) = start_node(&f, "node-b").await;

    let fresh = new_cell("fresh");
    f.faults.reset_counts();
    let (created, how) = owned(
        f.roots
            .activate_absent_with_log(&fresh, &a, None)
            .await
            .unwrap(),
    );
    assert_eq!(how, OwnedHow::Created);
    let counts = f.faults.counts();
    assert_eq!(counts.reads(), 0, "{counts:?}");
    assert_eq!(counts.get(Op::PutIfNoneMatch), 1, "{counts:?}");
    // The same decision by the same session again is its own root (as
    // after a create whose reply was lost).
    let (again, _) = owned(
        f.roots
            .activate_absent_with_log(&fresh, &a, None)
            .await
            .unwrap(),
    );
    assert_eq!(again, created);

    // B read the root absent, then A created it: B's stale absence is
    // refused, and A's root is untouched.
    let raced = new_cell("raced");
    let (a_root, _) = owned(f.roots.activate(&raced, &a).await.unwrap());
    let stale = f.roots.activate_absent_with_log(&raced, &b, None).await;
    assert!(matches!(stale, Err(Error::Fenced { .. })), "{stale:?}");
    assert_eq!(
        f.roots.read(&raced.cell_id).await.unwrap().unwrap(),
        a_root,
        "the refused create left the root as A wrote it"
    );
    // Activating again with a read finds A live.
    match f.roots.activate(&raced, &b).await.unwrap() {
        Activated::OwnerLive { owner, .. } => assert_eq!(owner, a.node),
        other => panic!("expected A as the live owner, got {other:?}"),
    }
}

#[tokio::test]
async fn lost_cas_reply_is_resolved_as_committed() {
    let f = fixture();
    let (a, _lease) = start_node(&f, "node-a").await;
    let cell = new_cell("lost");
    let (root, _) = owned(f.roots.activate(&cell, &a).await.unwrap());
    f.faults.inject(Fault::lose_reply(Op::PutIfMatch));
    let proposal = transition::publish(
        &root.record,
        &a,
        root.record.epoch,
        delta(&f.layout, &root.record, "01"),
        5,
    )
    .unwrap();
    let committed = f
        .roots
        .replace(&root, proposal.clone())
        .await
        .expect("reconciled as committed");
    assert_eq!(committed.record, proposal);
    let read = f.roots.read(&cell.cell_id).await.unwrap().unwrap();
    assert_eq!(read, committed, "the ETag returned is the stored one");
}

/// A write whose outcome is unknown and that did not apply (the re-read
/// still shows the base) is never "not committed": a late copy could still
/// land. The same bytes are sent again, and land.
#[tokio::test]
async fn an_unknown_outcome_still_at_the_base_is_settled_by_resending_the_same_write() {
    let f = fixture();
    let (a, _lease) = start_node(&f, "node-a").await;
    let cell = new_cell("not-applied");
    let (root, _) = owned(f.roots.activate(&cell, &a).await.unwrap());
    // The write never reaches the store but the caller cannot know that.
    f.faults.inject(Fault::fail(
        Some(Op::PutIfMatch),
        cellfleet_store::Error::Unavailable {
            op: Op::PutIfMatch,
            key: String::new(),
            outcome: Outcome::Unknown,
            message: "timeout".into(),
        },
    ));
    let proposal = transition::publish(
        &root.record,
        &a,
        root.record.epoch,
        delta(&f.layout, &root.record, "02"),
        5,
    )
    .unwrap();
    let committed = f.roots.replace(&root, proposal.clone()).await.unwrap();
    assert_eq!(committed.record, proposal);
    assert_eq!(
        f.roots.read(&cell.cell_id).await.unwrap().unwrap(),
        committed
    );
}

/// Every attempt times out and the root stays at the base: the fate is
/// unknown (ambiguous), never a definite "not committed".
#[tokio::test]
async fn a_write_that_never_answers_is_ambiguous_not_refused() {
    let f = fixture();
    let (a, _lease) = start_node(&f, "node-a").await;
    let cell = new_cell("never-answers");
    let (root, _) = owned(f.roots.activate(&cell, &a).await.unwrap());
    f.faults.inject(
        Fault::fail(
            Some(Op::PutIfMatch),
            cellfleet_store::Error::Unavailable {
                op: Op::PutIfMatch,
                key: String::new(),
                outcome: Outcome::Unknown,
                message: "timeout".into(),
            },
        )
        .times(u64::MAX),
    );
    let proposal = transition::publish(
        &root.record,
        &a,
        root.record.epoch,
        delta(&f.layout, &root.record, "05"),
        5,
    )
    .unwrap();
    let error = f.roots.replace(&root, proposal).await.unwrap_err();
    assert!(error.is_ambiguous(), "{error:?}");
    assert_eq!(
        f.faults.counts().get(Op::PutIfMatch),
        1 + cellfleet_authority::RESENDS_MAX as u64,
        "bounded resends"
    );
}

/// A PUT that timed out at the client and that the store applies later:
/// the resend lands first, the late copy is refused, and the proposal is
/// committed exactly once.
#[tokio::test]
async fn a_write_that_lands_after_its_timeout_commits_once() {
    let f = fixture();
    let (a, _lease) = start_node(&f, "node-a").await;
    let cell = new_cell("lands-late");
    let (root, _) = owned(f.roots.activate(&cell, &a).await.unwrap());
    let late = std::time::Duration::from_millis(200);
    f.faults.inject(Fault::land_late(Op::PutIfMatch, late));
    let proposal = transition::publish(
        &root.record,
        &a,
        root.record.epoch,
        delta(&f.layout, &root.record, "06"),
        5,
    )
    .unwrap();
    let committed = f.roots.replace(&root, proposal.clone()).await.unwrap();
    assert_eq!(committed.record, proposal);
    tokio::time::sleep(late * 3).await;
    assert_eq!(
        f.roots.read(&cell.cell_id).await.unwrap().unwrap(),
        committed
    );
}

#[tokio::test]
async fn unknown_outcome_with_failed_reread_is_ambiguous() {
    let f = fixture();
    let (a, _lease) = start_node(&f, "node-a").await;
    let cell = new_cell("ambiguous");
    let (root, _) = owned(f.roots.activate(&cell, &a).await.unwrap());
    f.faults.inject(Fault::lose_reply(Op::PutIfMatch));
    f.faults
        .inject(Fault::unavailable(Op::Get).key_prefix("cluster/cells/"));
    let proposal = transition::publish(
        &root.record,
        &a,
        root.record.epoch,
        delta(&f.layout, &root.record, "03"),
        5,
    )
    .unwrap();
    let error = f.roots.replace(&root, proposal).await.unwrap_err();
    assert!(error.is_ambiguous() && error.is_retryable(), "{error:?}");
}

#[tokio::test]
async fn precondition_failures_surface_as_conflict_or_fenced() {
    let f = fixture();
    let (a, _lease) = start_node(&f, "node-a").await;
    let cell = new_cell("412");
    let (root, _) = owned(f.roots.activate(&cell, &a).await.unwrap());
    // Same owner wrote concurrently (e.g. a compaction racing a publish): conflict.
    let first = transition::publish(
        &root.record,
        &a,
        root.record.epoch,
        delta(&f.layout, &root.record, "04"),
        5,
    )
    .unwrap();
    f.roots.replace(&root, first).await.unwrap();
    let second = transition::publish(
        &root.record,
        &a,
        root.record.epoch,
        delta(&f.layout, &root.record, "05"),
        6,
    )
    .unwrap();
    let error = f.roots.replace(&root, second).await.unwrap_err();
    assert!(
        matches!(error, Error::Conflict { .. }) && error.is_retryable(),
        "{error:?}"
    );
    // Creating a root that exists: conflict (re-run activation).
    let duplicate = transition::create(&cell, &a, 0);
    assert!(matches!(
        f.roots.create(duplicate).await,
        Err(Error::Conflict { .. })
    ));
    // A 409 from the store is handled like a 412.
    let current = f.roots.read(&cell.cell_id).await.unwrap().unwrap();
    f.faults.inject(Fault::fail(
        Some(Op::PutIfMatch),
        cellfleet_store::Error::Conflict { key: String::new() },
    ));
    let third = transition::publish(
        &current.record,
        &a,
        current.record.epoch,
        delta(&f.layout, &current.record, "06"),
        7,
    )
    .unwrap();
    assert!(matches!(
        f.roots.replace(&current, third).await,
        Err(Error::Conflict { .. })
    ));
}

#[tokio::test]
async fn corrupt_roots_are_refused() {
    let f = fixture();
    let cell = new_cell("corrupt");
    let key = f.layout.root_key(&cell.cell_id);
    f.faults
        .put(
            &key,
            Bytes::from_static(b"{\"version\":1}"),
            PutCondition::Overwrite,
        )
        .await
        .unwrap();
    let error = f.roots.read(&cell.cell_id).await.unwrap_err();
    assert!(matches!(error, Error::Corrupt { .. }) && !error.is_retryable());
    // A valid root stored under another cell's key is corrupt too.
    let other = new_cell("other");
    let me = Holder {
        node: NodeId::new("n").unwrap(),
        session: SessionId::from_u128(1),
    };
    let bytes = transition::create(&other, &me, 0).encode().unwrap();
    f.faults
        .put(&key, Bytes::from(bytes), PutCondition::Overwrite)
        .await
        .unwrap();
    assert!(matches!(
        f.roots.read(&cell.cell_id).await,
        Err(Error::Corrupt { .. })
    ));
}

#[tokio::test]
async fn release_lets_the_next_node_take_over_at_once() {
    let f = fixture();
    let cell = new_cell("released");
    let (a, _) = start_node(&f, "node-a").await;
    let (b, _) = start_node(&f, "node-b").await;
    let (root, _) = owned(f.roots.activate(&cell, &a).await.unwrap());
    let released = transition::release(&root.record, &a, root.record.epoch, 1).unwrap();
    f.roots.replace(&root, released).await.unwrap();
    let (taken, how) = owned(f.roots.activate(&cell, &b).await.unwrap());
    assert_eq!((how, taken.record.epoch.get()), (OwnedHow::TookOver, 2));
}

#[tokio::test]
async fn lease_renewal_deadline_and_zero_reads_while_live() {
    let f = fixture();
    let (_, held) = start_node(&f, "node-a").await;
    let sent = f.clock.now_monotonic();
    assert_eq!(
        held.deadline - sent,
        Duration::from_millis(CONFIG.lease_ms - CONFIG.drift_margin_ms)
    );
    f.faults.reset_counts();
    f.clock.advance(Duration::from_millis(3_000));
    assert!(f.leases.is_serving(&held));
    assert_eq!(
        f.faults.counts().total(),
        0,
        "serving on the lease reads nothing"
    );
    let renewed = f.leases.renew(&held).await.unwrap();
    assert_eq!(renewed.record.counter, held.record.counter + 1);
    assert_eq!(
        renewed.deadline - f.clock.now_monotonic(),
        Duration::from_millis(9_500)
    );
    f.clock.advance(Duration::from_millis(9_500));
    assert!(
        !f.leases.is_serving(&renewed),
        "self-fenced past the local deadline"
    );
}

#[tokio::test]
async fn lease_renewal_with_lost_reply_is_committed() {
    let f = fixture();
    let (_, held) = start_node(&f, "node-a").await;
    f.faults.inject(Fault::lose_reply(Op::PutIfMatch));
    let renewed = f.leases.renew(&held).await.expect("reconciled");
    let stored = f.leases.read(&held.record.node_id).await.unwrap().unwrap();
    assert_eq!(
        (stored.record, stored.etag),
        (renewed.record.clone(), renewed.etag.clone())
    );
    // Renewing again later from the stale handle still works (the record is ours).
    f.clock.advance(Duration::from_millis(1_000));
    let again = f
        .leases
        .renew(&held)
        .await
        .expect("renew on top of our own write");
    assert!(again.record.counter > renewed.record.counter);
}

#[tokio::test]
async fn a_replaced_lease_fences_the_old_session_and_keeps_it_live_until_expiry() {
    let f = fixture();
    let cell = new_cell("restart");
    let (old, old_lease) = start_node(&f, "node-a").await;
    let (b, _b_lease) = start_node(&f, "node-b").await;
    owned(f.roots.activate(&cell, &old).await.unwrap());
    f.clock.advance(Duration::from_millis(1_000));
    // node-a restarts: a new session replaces the record.
    let (new, new_lease) = start_node(&f, "node-a").await;
    assert_ne!(new.session, old.session);
    assert_eq!(
        new_lease.record.predecessor_live_until_ms,
        old_lease.record.expires_at_ms
    );
    // The zombie's renewal finds another session: fenced.
    let error = f.leases.renew(&old_lease).await.unwrap_err();
    assert!(error.is_fenced(), "{error:?}");
    // Nobody (not even node-a's new session) takes the old session's cell
    // before its expiry plus margin.
    for who in [&new, &b] {
        assert!(matches!(
            f.roots.activate(&cell, who).await.unwrap(),
            Activated::OwnerLive { .. }
        ));
    }
    f.clock.advance(Duration::from_millis(
        CONFIG.lease_ms - 1_000 + CONFIG.drift_margin_ms,
    ));
    let (root, how) = owned(f.roots.activate(&cell, &new).await.unwrap());
    assert_eq!((how, root.record.epoch.get()), (OwnedHow::TookOver, 2));
}

#[tokio::test]
async fn retired_leases_free_cells_and_drop_out_of_the_live_set() {
    let f = fixture();
    let (a, a_lease) = start_node(&f, "node-a").await;
    let (b, _b_lease) = start_node(&f, "node-b").await;
    let cell = new_cell("drained");
    owned(f.roots.activate(&cell, &a).await.unwrap());
    let live: Vec<_> = f
        .leases
        .live_nodes()
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.node_id)
        .collect();
    assert_eq!(live, vec![a.node.clone(), b.node.clone()]);
    f.leases.retire(&a_lease).await.unwrap();
    let live: Vec<_> = f
        .leases
        .live_nodes()
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.node_id)
        .collect();
    assert_eq!(live, vec![b.node.clone()]);
    let (_, how) = owned(f.roots.activate(&cell, &b).await.unwrap());
    assert_eq!(
        how,
        OwnedHow::TookOver,
        "a retired owner's cells are taken at once"
    );
}

#[tokio::test]
async fn transient_lease_errors_are_retryable_and_not_fencing() {
    let f = fixture();
    let (_, held) = start_node(&f, "node-a").await;
    f.faults.inject(Fault::unavailable(Op::PutIfMatch));
    let error = f.leases.renew(&held).await.unwrap_err();
    assert!(
        error.is_retryable() && !error.is_fenced() && !error.is_ambiguous(),
        "{error:?}"
    );
    assert!(f.leases.is_serving(&held), "the old deadline still holds");
    f.leases.renew(&held).await.expect("next attempt succeeds");
}

#[tokio::test]
async fn the_cluster_record_is_created_once_and_refuses_another_configuration() {
    use cellfleet_authority::cluster::{check_cluster, ClusterCheck, ClusterRecord, Mismatch};
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let layout = Layout::new("c").unwrap();
    let (a, b) = ("a".repeat(64), "b".repeat(64));
    let ours = ClusterRecord::new(&layout, &a, 4096, 5);
    assert_eq!(
        check_cluster(&store, &layout, &ours, false).await.unwrap(),
        ClusterCheck::Created(ours.clone())
    );
    // A later node with the same configuration agrees; created_at is the first's.
    let later = ClusterRecord::new(&layout, &a, 4096, 99);
    assert_eq!(
        check_cluster(&store, &layout, &later, false).await.unwrap(),
        ClusterCheck::Agrees(ours.clone())
    );
    // Another manifest is refused, naming both digests, and changes nothing.
    let other_kinds = ClusterRecord::new(&layout, &b, 4096, 99);
    let ClusterCheck::Refused { mismatches, .. } =
        check_cluster(&store, &layout, &other_kinds, false)
            .await
            .unwrap()
    else {
        panic!("another manifest must be refused");
    };
    assert_eq!(
        mismatches,
        vec![Mismatch::KindsDigest {
            recorded: a.clone(),
            ours: b.clone()
        }]
    );
    // A page-size change is refused even when kinds changes are accepted.
    let other_pages = ClusterRecord::new(&layout, &b, 8192, 99);
    assert!(matches!(
        check_cluster(&store, &layout, &other_pages, true)
            .await
            .unwrap(),
        ClusterCheck::Refused { .. }
    ));
    // An accepted kinds change replaces the record by CAS (counter + 1).
    let ClusterCheck::KindsChanged {
        record,
        previous_digest,
    } = check_cluster(&store, &layout, &other_kinds, true)
        .await
        .unwrap()
    else {
        panic!("an accepted kinds change");
    };
    assert_eq!((previous_digest, record.counter), (a.clone(), 2));
    assert_eq!(
        (record.kinds_digest.as_str(), record.created_at_ms),
        (b.as_str(), 5)
    );
    assert!(matches!(
        check_cluster(&store, &layout, &ours, false).await.unwrap(),
        ClusterCheck::Refused { .. }
    ));
    let stored = store.get(&layout.cluster_key()).await.unwrap();
    assert_eq!(ClusterRecord::decode(&stored.body).unwrap(), record);
}
