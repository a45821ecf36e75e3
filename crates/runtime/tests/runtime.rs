//! Runtimes sharing one bucket (the local-directory store and real SeaweedFS): takeover, fencing, lost replies, unknown fates, drain, compaction, zero reads.

mod common;

use std::sync::Arc;

use cellfleet_authority::{Clock, Layout, Txid};
use cellfleet_cell::CommandId;
use cellfleet_runtime::{Error, Resolution};
use cellfleet_store::{Fault, FaultStore, ObjectStore, Op};
use common::*;
use serde_json::json;

const KEY: &[u8] = b"acct-1";

fn root_key(prefix: &str) -> String {
    let cell = cellfleet_authority::CellId::for_kind_key(KIND, KEY);
    Layout::new(prefix).unwrap().root_key(&cell)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_queries_receipts_and_retries() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, store, prefix) in backends("basic", dir.path()).await {
        let clock = manual_clock();
        let node = start(
            node_config("n1", &dir.path().join(backend), &prefix),
            store,
            clock.clone(),
        )
        .await;
        let log = AckLog::default();
        let mut last = None;
        for n in 0..5 {
            let executed = node
                .execute(KIND, KEY, append(clock.as_ref(), n))
                .await
                .unwrap();
            assert!(!executed.duplicate);
            log.ack(n, executed.outcome.clone());
            last = Some(executed.receipt);
        }
        let receipt = last.unwrap();
        assert_eq!(
            receipt.txid.0, 5,
            "{backend}: the schema with the first command at txid 1, then one group per command"
        );
        // A retry with the same id returns the stored outcome, applied once.
        let again = node
            .execute(KIND, KEY, append(clock.as_ref(), 4))
            .await
            .unwrap();
        assert!(again.duplicate);
        assert_eq!(again.receipt.txid.0, 5);
        // Read-your-writes: the receipt is published; a future one is refused.
        let queried = node
            .query(KIND, KEY, "all", json!({}), Some(&receipt))
            .await
            .unwrap();
        assert_eq!(queried.value.as_array().unwrap().len(), 5);
        // The query names the published state it read: the last command's.
        assert_eq!(queried.receipt, receipt, "{backend}");
        let plain = node.query(KIND, KEY, "all", json!({}), None).await.unwrap();
        assert_eq!(
            (plain.receipt, plain.value),
            (receipt.clone(), queried.value)
        );
        let mut ahead = receipt.clone();
        ahead.txid = ahead.txid + 10;
        let refused = node.query(KIND, KEY, "all", json!({}), Some(&ahead)).await;
        assert!(
            matches!(
                refused,
                Err(Error::ReceiptNotReached { txid: Txid(15), .. })
            ),
            "{refused:?}"
        );
        // Resolve: absent (inside its window), expired, not provable
        // without the expiry.
        let open = (clock.now_wall_ms() + 60_000) as i64;
        assert_eq!(
            node.resolve(KIND, KEY, CommandId(command_id(99)), Some(open))
                .await
                .unwrap(),
            Resolution::Absent
        );
        assert_eq!(
            node.resolve(KIND, KEY, CommandId(command_id(99)), None)
                .await
                .unwrap(),
            Resolution::NeedsExpiry
        );
        let past = (clock.now_wall_ms() - 10_000) as i64;
        assert_eq!(
            node.resolve(KIND, KEY, CommandId(command_id(99)), Some(past))
                .await
                .unwrap(),
            Resolution::Expired
        );
        log.verify(&node, KEY).await;
        let described = node.describe_cell(KIND, KEY).await.unwrap();
        assert_eq!((described.txid.0, described.open), (5, true));
        // Five publications for five commands: the schema rode the first.
        assert!(node
            .metrics_text()
            .contains("cellfleet_runtime_publications_total{node=\"n1\"} 5"));
        assert!(matches!(
            node.execute("nope", KEY, append(clock.as_ref(), 1)).await,
            Err(Error::BadRequest(_))
        ));
    }
}

/// A query is the first request a Cell sees: it answers from the kind's
/// (empty) schema, published before any query is served, never from the
/// state before the Cell's migration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_on_a_fresh_cell_waits_for_its_schema() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> =
        Arc::new(cellfleet_store::LocalStore::open(dir.path().join("bucket")).unwrap());
    // The migration's publication is slow, so a query would otherwise
    // reach the Cell before its schema is published.
    let store = Arc::new(FaultStore::new(store));
    store.inject(
        Fault::delay(
            Some(Op::PutIfNoneMatch),
            std::time::Duration::from_millis(200),
        )
        .times(1),
    );
    let clock = manual_clock();
    let node = start(node_config("n1", dir.path(), "fresh"), store, clock).await;
    let queried = node
        .query(KIND, b"never-written", "all", json!({}), None)
        .await
        .unwrap();
    assert_eq!(queried.value, json!([]));
    assert_eq!(queried.receipt.txid.0, 1, "the schema's publication");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_lease_serves_a_warm_cell_with_zero_reads() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, inner, prefix) in backends("zero-read", dir.path()).await {
        let store = Arc::new(FaultStore::new(inner));
        let clock = manual_clock();
        let node = start(
            node_config("n1", &dir.path().join(backend), &prefix),
            store.clone(),
            clock.clone(),
        )
        .await;
        node.execute(KIND, KEY, append(clock.as_ref(), 0))
            .await
            .unwrap();
        store.reset_counts();
        const N: u64 = 20;
        for n in 1..=N {
            node.execute(KIND, KEY, append(clock.as_ref(), n))
                .await
                .unwrap();
            node.query(KIND, KEY, "all", json!({}), None).await.unwrap();
        }
        let counts = store.counts();
        assert_eq!(counts.reads(), 0, "{backend}: {counts:?}");
        assert_eq!(
            counts.get(Op::PutIfNoneMatch),
            N,
            "{backend}: one upload per group"
        );
        // Past the local deadline: one fresh root read per request.
        clock.advance(lease_expiry());
        store.reset_counts();
        node.query(KIND, KEY, "all", json!({}), None).await.unwrap();
        assert_eq!(
            store.counts().get(Op::Get),
            1,
            "{backend}: {:?}",
            store.counts()
        );
        assert_eq!(
            node.metrics()
                .authority_reads_total
                .load(std::sync::atomic::Ordering::Relaxed),
            1
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeover_waits_for_lease_expiry_and_fences_the_paused_owner() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, store, prefix) in backends("takeover", dir.path()).await {
        let dir = dir.path().join(backend);
        // A's clock stands still: a paused process that believes its lease.
        let clock_a = manual_clock();
        let clock_b = manual_clock();
        let a = start(
            node_config("a", &dir, &prefix),
            store.clone(),
            clock_a.clone(),
        )
        .await;
        let b = start(
            node_config("b", &dir, &prefix),
            store.clone(),
            clock_b.clone(),
        )
        .await;
        let log = AckLog::default();
        for n in 0..5 {
            let executed = a
                .execute(KIND, KEY, append(clock_a.as_ref(), n))
                .await
                .unwrap();
            log.ack(n, executed.outcome);
        }
        a.lease().pause_renewals(true);
        // While A's lease is live, B routes to A.
        match b.execute(KIND, KEY, append(clock_b.as_ref(), 100)).await {
            Err(Error::NotOwner {
                owner, endpoint, ..
            }) => {
                assert_eq!(owner.unwrap().as_str(), "a");
                assert_eq!(endpoint.as_deref(), Some("https://a:7000"));
            }
            other => panic!("{backend}: expected NotOwner, got {other:?}"),
        }
        clock_b.advance(lease_expiry());
        for n in 5..8 {
            let executed = b
                .execute(KIND, KEY, append(clock_b.as_ref(), n))
                .await
                .unwrap();
            assert_eq!(
                executed.receipt.epoch.get(),
                2,
                "{backend}: takeover bumps the epoch"
            );
            log.ack(n, executed.outcome);
        }
        // A still believes its lease: its publications are fenced (by the
        // CAS, or by the seal on its log lane, after which A's session
        // ends and it admits nothing).
        for n in 20..23 {
            match a.execute(KIND, KEY, append(clock_a.as_ref(), n)).await {
                Err(Error::NotCommitted { .. })
                | Err(Error::NotOwner { .. })
                | Err(Error::LeaseLost { .. }) => log.not_committed(n),
                other => panic!("{backend}: the old owner published: {other:?}"),
            }
        }
        assert!(
            a.metrics()
                .fences_total
                .load(std::sync::atomic::Ordering::Relaxed)
                >= 1
        );
        // A not-committed command retried on the new owner applies once.
        let retried = b
            .execute(KIND, KEY, append(clock_b.as_ref(), 20))
            .await
            .unwrap();
        assert!(!retried.duplicate);
        log.ack(20, retried.outcome);
        log.verify(&b, KEY).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_cas_reply_commits_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, inner, prefix) in backends("lost-reply", dir.path()).await {
        let config = cell_node_config("n1", &dir.path().join(backend), &prefix);
        let (store, clock, node, log) = start_with_first_command(config, inner, KEY).await;
        store.inject(Fault::lose_reply(Op::PutIfMatch).key_prefix(root_key(&prefix)));
        let executed = node
            .execute(KIND, KEY, append(clock.as_ref(), 1))
            .await
            .unwrap();
        assert!(!executed.duplicate, "{backend}");
        assert_eq!(executed.receipt.txid.0, 2);
        log.ack(1, executed.outcome.clone());
        let retry = node
            .execute(KIND, KEY, append(clock.as_ref(), 1))
            .await
            .unwrap();
        assert!(retry.duplicate);
        assert_eq!(retry.outcome, executed.outcome);
        log.verify(&node, KEY).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_unknown_returns_the_stored_outcome() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, inner, prefix) in backends("unknown", dir.path()).await {
        let store = Arc::new(FaultStore::new(inner));
        let clock = manual_clock();
        let node = start(
            cell_node_config("n1", &dir.path().join(backend), &prefix),
            store.clone(),
            clock.clone(),
        )
        .await;
        let log = AckLog::default();
        let first = node
            .execute(KIND, KEY, append(clock.as_ref(), 0))
            .await
            .unwrap();
        log.ack(0, first.outcome);
        // The CAS lands but its reply is lost, and so is the re-read.
        store.inject(Fault::lose_reply(Op::PutIfMatch).key_prefix(root_key(&prefix)));
        store.inject(Fault::unavailable(Op::Get).key_prefix(root_key(&prefix)));
        match node.execute(KIND, KEY, append(clock.as_ref(), 1)).await {
            Err(Error::Unknown { .. }) => {}
            other => panic!("{backend}: expected Unknown, got {other:?}"),
        }
        let retry = node
            .execute(KIND, KEY, append(clock.as_ref(), 1))
            .await
            .unwrap();
        assert!(retry.duplicate, "{backend}: the ledger answers the retry");
        log.ack(1, retry.outcome);
        log.verify(&node, KEY).await;
        assert_eq!(journal(&node, KEY).await, vec!["t0", "t1"]);
    }
}

/// Nodes `a` and `b` (made by `config`) sharing one fault-injecting store
/// over `inner`, on a manual clock.
async fn two_nodes(
    dir: &std::path::Path,
    inner: Arc<dyn ObjectStore>,
    prefix: &str,
    config: fn(&str, &std::path::Path, &str) -> cellfleet_runtime::NodeConfig,
) -> (
    Arc<FaultStore>,
    Arc<cellfleet_authority::ManualClock>,
    cellfleet_runtime::NodeHandle,
    cellfleet_runtime::NodeHandle,
) {
    let store = Arc::new(FaultStore::new(inner));
    let clock = manual_clock();
    let a = start(config("a", dir, prefix), store.clone(), clock.clone()).await;
    let b = start(config("b", dir, prefix), store.clone(), clock.clone()).await;
    (store, clock, a, b)
}

/// `a`, told that `KEY`'s root is absent while `b` owns it, runs a command:
/// it must end in NotOwner naming `b`, with `b`'s root byte-identical.
async fn a_stale_note_ends_at_b(
    backend: &str,
    store: &FaultStore,
    prefix: &str,
    a: &cellfleet_runtime::NodeHandle,
    clock: &dyn Clock,
    faults: Option<Fault>,
) {
    let before = store.get(&root_key(prefix)).await.unwrap();
    a.note_root_absent(&cellfleet_authority::CellId::for_kind_key(KIND, KEY));
    if let Some(fault) = faults {
        store.inject(fault);
    }
    match a.execute(KIND, KEY, append(clock, 9)).await {
        Err(Error::NotOwner { owner, .. }) => {
            assert_eq!(
                owner.map(|o| o.to_string()),
                Some("b".to_owned()),
                "{backend}"
            )
        }
        other => panic!("{backend}: expected B as the owner, got {other:?}"),
    }
    let after = store.get(&root_key(prefix)).await.unwrap();
    assert_eq!(
        (&after.etag, &after.body),
        (&before.etag, &before.body),
        "{backend}: B's root as it was"
    );
}

/// A new Cell whose root the router has just read absent is created
/// without a second root read; a stale note (another node made the root
/// in between) overwrites nothing and ends in the live owner, as a read
/// would have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_noted_absence_saves_the_activation_its_root_read_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, inner, prefix) in backends("absent", dir.path()).await {
        let (store, clock, a, b) =
            two_nodes(&dir.path().join(backend), inner, &prefix, node_config).await;
        let saved = |node: &cellfleet_runtime::NodeHandle| {
            node.metrics()
                .activation_root_reads_saved_total
                .load(std::sync::atomic::Ordering::Relaxed)
        };

        // The note saves the read; without one the activation reads the
        // root, as before. (key, noted, root GETs, saved so far)
        for (key, noted, gets, saved_total) in
            [(&b"fresh"[..], true, 0, 1), (&b"unnoted"[..], false, 1, 1)]
        {
            if noted {
                a.note_root_absent(&cellfleet_authority::CellId::for_kind_key(KIND, key));
            }
            store.reset_counts();
            a.execute(KIND, key, append(clock.as_ref(), 0))
                .await
                .unwrap();
            let counts = store.counts();
            assert_eq!(counts.get(Op::Get), gets, "{backend}: {counts:?}");
            assert_eq!(saved(&a), saved_total, "{backend}");
        }

        // B creates the Cell; A's note of its absence is stale by then.
        b.execute(KIND, KEY, append(clock.as_ref(), 1))
            .await
            .unwrap();
        a_stale_note_ends_at_b(backend, &store, &prefix, &a, clock.as_ref(), None).await;
        assert_eq!(saved(&a), 1, "{backend}: the stale note won nothing");
        // B still serves it.
        b.execute(KIND, KEY, append(clock.as_ref(), 3))
            .await
            .unwrap();
    }
}

/// A stale note whose create-only write loses its reply (its fate
/// unknown, the root long past its first revision) still ends in the live
/// owner: the activation reads the root and decides on it, instead of
/// calling a command that never ran UNKNOWN.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_note_whose_create_loses_its_reply_still_finds_the_owner() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, inner, prefix) in backends("absent-lost", dir.path()).await {
        let (store, clock, a, b) =
            two_nodes(&dir.path().join(backend), inner, &prefix, cell_node_config).await;
        for n in 0..3 {
            b.execute(KIND, KEY, append(clock.as_ref(), n))
                .await
                .unwrap();
        }
        let lost = Fault::lose_reply(Op::PutIfNoneMatch).key_prefix(root_key(&prefix));
        a_stale_note_ends_at_b(backend, &store, &prefix, &a, clock.as_ref(), Some(lost)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_on_one_node_then_activation_on_another() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, store, prefix) in backends("drain", dir.path()).await {
        let dir = dir.path().join(backend);
        let clock = manual_clock();
        let a = start(
            node_config("a", &dir, &prefix),
            store.clone(),
            clock.clone(),
        )
        .await;
        let b = start(
            node_config("b", &dir, &prefix),
            store.clone(),
            clock.clone(),
        )
        .await;
        let log = AckLog::default();
        for (n, result) in execute_all(&a, &clock, KEY, 0..24).await {
            log.ack(n, result.expect("no Unknown, no loss").outcome);
        }
        a.execute(KIND, b"other", append(clock.as_ref(), 1000))
            .await
            .unwrap();
        assert_eq!(a.drain().await.unwrap(), 2, "{backend}");
        // A released Cell leaves no file behind (its lock file neither:
        // one left per Cell ever held would grow without bound).
        let left: Vec<_> = std::fs::read_dir(dir.join("a").join("cells"))
            .map(|entries| entries.map(|e| e.unwrap().file_name()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "{backend}: {left:?}");
        assert!(matches!(
            a.execute(KIND, KEY, append(clock.as_ref(), 99)).await,
            Err(Error::Draining)
        ));
        // No lease expiry needed: the roots were released.
        log.verify(&b, KEY).await;
        let described = b.describe_cell(KIND, KEY).await.unwrap();
        assert_eq!(described.epoch.get(), 2);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_under_write_load_keeps_the_chain_bounded() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, store, prefix) in backends("compaction", dir.path()).await {
        let dir = dir.path().join(backend);
        let clock = manual_clock();
        let mut config = cell_node_config("a", &dir, &prefix);
        config.limits.chain_files_max = 4;
        let a = start(config, store.clone(), clock.clone()).await;
        let log = AckLog::default();
        let mut longest = 0;
        for round in 0..6u64 {
            let ns = (0..8).map(|i| round * 100 + i);
            for (n, result) in execute_all(&a, &clock, KEY, ns).await {
                log.ack(n, result.unwrap().outcome);
            }
            // Sequential commands too, so the chain grows one file at a time.
            for i in 50..54 {
                let n = round * 100 + i;
                log.ack(
                    n,
                    a.execute(KIND, KEY, append(clock.as_ref(), n))
                        .await
                        .unwrap()
                        .outcome,
                );
            }
            longest = longest.max(a.describe_cell(KIND, KEY).await.unwrap().chain_files);
        }
        assert!(longest <= 8, "{backend}: chain grew to {longest}");
        let compactions = a
            .metrics()
            .compactions_total
            .load(std::sync::atomic::Ordering::Relaxed);
        assert!(compactions >= 2, "{backend}: {compactions} compactions");
        let before = journal(&a, KEY).await;
        a.drain().await.unwrap();
        let b = start(
            cell_node_config("b", &dir, &prefix),
            store.clone(),
            clock.clone(),
        )
        .await;
        assert_eq!(
            journal(&b, KEY).await,
            before,
            "{backend}: state identical after recovery"
        );
        log.verify(&b, KEY).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passivation_keeps_ownership_under_the_open_limit() {
    let dir = tempfile::tempdir().unwrap();
    let inner: Arc<dyn ObjectStore> =
        Arc::new(cellfleet_store::LocalStore::open(dir.path().join("bucket")).unwrap());
    let store = Arc::new(FaultStore::new(inner));
    let clock = manual_clock();
    let mut config = node_config("a", dir.path(), "passivation");
    config.limits.cells_open_max = 2;
    // Parked records are checkpointed soon, so passivated Cells settle.
    config.log.checkpoint_idle_ms = 50;
    let a = start(config, store.clone(), clock.clone()).await;
    for n in 0..6u64 {
        let key = format!("cell-{n}");
        a.execute(KIND, key.as_bytes(), append(clock.as_ref(), n))
            .await
            .unwrap();
        assert!(a.open_cells() <= 2);
    }
    assert_eq!(a.owned_cells().len(), 6);
    assert!(
        a.metrics()
            .passivations_total
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 4
    );
    // A passivated Cell is its database and lock file once nothing of it
    // is parked (a parked one keeps its empty WAL until the node
    // checkpoints its records): only the (at most two) open ones keep one
    // then, and no Cell has a `-shm` (its WAL index lives in memory).
    let cells = dir.path().join("a").join("cells");
    let sidecars = || {
        std::fs::read_dir(&cells)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.ends_with("-wal") || name.ends_with("-shm")
            })
            .count()
    };
    let settled = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while sidecars() > 2 && std::time::Instant::now() < settled {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(
        sidecars() <= 2,
        "{} -wal/-shm files for at most 2 open cells",
        sidecars()
    );
    // Reopened on demand, with its state, and zero reads while the lease lives.
    store.reset_counts();
    assert_eq!(journal(&a, b"cell-0").await, vec!["t0"]);
    assert_eq!(store.counts().reads(), 0, "{:?}", store.counts());
    let described = a.describe_cell(KIND, b"cell-5").await.unwrap();
    assert_eq!(described.txid.0, 1, "the schema and one command, one group");
}

/// An open Cell's WAL stays within the node's `cell_wal_bytes_max`: past
/// it the Cell folds the WAL into its database file and truncates it, so
/// a node's local disk beyond its Cells' data is bounded by what it keeps
/// open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_cells_wal_stays_within_the_nodes_bound() {
    const BOUND: u64 = 64 << 10;
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> =
        Arc::new(cellfleet_store::LocalStore::open(dir.path().join("bucket")).unwrap());
    let clock = manual_clock();
    let mut config = node_config("a", dir.path(), "wal-bound");
    config.limits.cell_wal_bytes_max = BOUND;
    let a = start(config, store, clock.clone()).await;
    let cells = dir.path().join("a").join("cells");
    let wal_bytes = || -> u64 {
        std::fs::read_dir(&cells)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with("-wal"))
            .map(|e| e.metadata().map_or(0, |m| m.len()))
            .sum()
    };
    let (mut written, mut largest) = (0u64, 0u64);
    let mut last = 0u64;
    for n in 0..150u64 {
        a.execute(KIND, b"busy", append(clock.as_ref(), n))
            .await
            .unwrap();
        let now = wal_bytes();
        // What this group added (a truncation starts the WAL again).
        written += now.saturating_sub(last);
        if now < last {
            written += now;
        }
        last = now;
        largest = largest.max(now);
    }
    // The WAL took in many times the bound, and never held more than the
    // bound and the one group that crossed it.
    assert!(written > 4 * BOUND, "{written} bytes through the WAL");
    assert!(
        largest <= BOUND + (32 << 10),
        "the WAL reached {largest} bytes against a bound of {BOUND}"
    );
    assert_eq!(journal(&a, b"busy").await.len(), 150);
}

/// Past the open limit the least recently used idle Cell is passivated,
/// also when the Cells a scan found were used since (the passivation
/// candidates of `node/lru.rs`: a used one is passed over, not taken).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_least_recently_used_cell_is_the_one_passivated() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> =
        Arc::new(cellfleet_store::LocalStore::open(dir.path().join("bucket")).unwrap());
    let clock = manual_clock();
    let mut config = node_config("a", dir.path(), "lru-order");
    config.limits.cells_open_max = 3;
    let a = start(config, store, clock.clone()).await;
    let mut n = 0u64;
    let mut use_cell = |cell: u32| {
        n += 1;
        let (a, clock) = (a.clone(), clock.clone());
        async move {
            a.execute(
                KIND,
                format!("c{cell}").as_bytes(),
                append(clock.as_ref(), n),
            )
            .await
            .unwrap();
        }
    };
    for cell in [0, 1, 2] {
        use_cell(cell).await;
    }
    use_cell(0).await;
    // c1 is the least recently used now.
    use_cell(3).await;
    assert_open(&a, &[0, 2, 3], &[1]).await;
    // The scan for c3 saw c2 before c0; c2 is used again, so c0 goes.
    use_cell(2).await;
    use_cell(4).await;
    assert_open(&a, &[2, 3, 4], &[0, 1]).await;
}

/// Asserts that the Cells `c{n}` of `open` are open and those of `closed`
/// are passivated (an actor asked to passivate may take a moment to exit).
async fn assert_open(node: &cellfleet_runtime::NodeHandle, open: &[u32], closed: &[u32]) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let mut now_open = Vec::new();
        for cell in open.iter().chain(closed) {
            let described = node
                .describe_cell(KIND, format!("c{cell}").as_bytes())
                .await
                .expect("owned");
            if described.open {
                now_open.push(*cell);
            }
        }
        if now_open == open {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "open: {now_open:?}, expected {open:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_mailbox_refuses_at_once_with_a_retry_hint() {
    let dir = tempfile::tempdir().unwrap();
    let inner: Arc<dyn ObjectStore> =
        Arc::new(cellfleet_store::LocalStore::open(dir.path().join("bucket")).unwrap());
    let store = Arc::new(FaultStore::new(inner));
    let clock = manual_clock();
    let mut config = node_config("a", dir.path(), "mailbox");
    config.limits.mailbox_commands_max = 1;
    config.limits.group_commands_max = 1;
    let a = start(config, store.clone(), clock.clone()).await;
    a.execute(KIND, KEY, append(clock.as_ref(), 0))
        .await
        .unwrap();
    store.inject(
        Fault::delay(
            Some(Op::PutIfNoneMatch),
            std::time::Duration::from_millis(300),
        )
        .times(u64::MAX),
    );
    let spawn = |n: u64| {
        let (a, clock) = (a.clone(), clock.clone());
        tokio::spawn(async move { (n, a.execute(KIND, KEY, append(clock.as_ref(), n)).await) })
    };
    // The first command occupies the actor (its upload is delayed) before
    // the rest arrive, so exactly one more fits the mailbox of one; without
    // waiting, a busy machine can run all twelve sends before the actor
    // takes the first from its mailbox.
    let uploads = store.counts().get(Op::PutIfNoneMatch);
    let mut tasks = vec![spawn(1)];
    while store.counts().get(Op::PutIfNoneMatch) == uploads {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    tasks.extend((2..=12).map(spawn));
    let log = AckLog::default();
    let mut refused = 0;
    for task in tasks {
        match task.await.unwrap() {
            (n, Ok(executed)) => log.ack(n, executed.outcome),
            (_, Err(error @ Error::ResourceExhausted { .. })) => {
                assert_eq!(error.retry_after_ms(), Some(50));
                refused += 1;
            }
            (_, Err(other)) => panic!("{other:?}"),
        }
    }
    assert!(refused >= 1, "nothing was refused");
    store.clear();
    let first = log.len();
    assert!(first >= 2);
    let all = log.clone();
    all.ack(
        0,
        a.resolve(KIND, KEY, CommandId(command_id(0)), None)
            .await
            .map(|r| match r {
                Resolution::Committed { outcome, .. } => outcome,
                other => panic!("{other:?}"),
            })
            .unwrap(),
    );
    all.verify(&a, KEY).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_lease_stops_the_node_even_on_the_empty_ingress_path() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> =
        Arc::new(cellfleet_store::LocalStore::open(dir.path().join("bucket")).unwrap());
    let clock = manual_clock();
    let old = start(
        node_config("a", &dir.path().join("old"), "replaced"),
        store.clone(),
        clock.clone(),
    )
    .await;
    old.execute(KIND, KEY, append(clock.as_ref(), 0))
        .await
        .unwrap();
    // A second process with the same node id starts a new session.
    let new = start(
        node_config("a", &dir.path().join("new"), "replaced"),
        store.clone(),
        clock.clone(),
    )
    .await;
    assert!(matches!(
        old.lease().renew_now().await,
        cellfleet_runtime::lease::LeaseStatus::Replaced(_)
    ));
    for _ in 0..100 {
        if old.open_cells() == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(old.open_cells(), 0, "the replaced node closed its cells");
    // Both the warm cell and a never-seen cell (empty-ingress path) refuse.
    assert!(matches!(
        old.execute(KIND, KEY, append(clock.as_ref(), 1)).await,
        Err(Error::LeaseLost { .. })
    ));
    assert!(matches!(
        old.query(KIND, b"fresh", "all", json!({}), None).await,
        Err(Error::LeaseLost { .. })
    ));
    // The new session must wait out the old session's window before taking the cell.
    assert!(matches!(
        new.execute(KIND, KEY, append(clock.as_ref(), 2)).await,
        Err(Error::NotOwner { .. })
    ));
    clock.advance(lease_expiry());
    new.lease().renew_now().await;
    let executed = new
        .execute(KIND, KEY, append(clock.as_ref(), 2))
        .await
        .unwrap();
    assert_eq!(executed.receipt.epoch.get(), 2);
    assert_eq!(journal(&new, KEY).await, vec!["t0", "t2"]);
}

/// Correctness item: a lease whose local deadline lapsed, then renewed
/// (nobody touched its record), must not bring back what it trusted before
/// the lapse. Another node took both Cells over meanwhile; through the woken
/// node no query answers from the pre-takeover state (an open actor, and a
/// parked root) and `resolve` never says ABSENT for what the new owner
/// committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_lease_renewed_late_never_serves_stale_state() {
    const PARKED: &[u8] = b"acct-parked";
    let dir = tempfile::tempdir().unwrap();
    for (backend, store, prefix) in backends("lapsed", dir.path()).await {
        let dir = dir.path().join(backend);
        let clock_a = manual_clock();
        let clock_b = manual_clock();
        let a = start(
            node_config("a", &dir, &prefix),
            store.clone(),
            clock_a.clone(),
        )
        .await;
        let b = start(
            node_config("b", &dir, &prefix),
            store.clone(),
            clock_b.clone(),
        )
        .await;
        a.execute(KIND, PARKED, append(clock_a.as_ref(), 0))
            .await
            .unwrap();
        // The reply can arrive before the actor counts itself idle.
        for _ in 0..100 {
            if a.open_cells() == 0 {
                break;
            }
            a.passivate_idle().await;
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(a.open_cells(), 0, "{backend}: PARKED is parked");
        assert_eq!(a.owned_cells().len(), 1, "{backend}: and still owned");
        a.execute(KIND, KEY, append(clock_a.as_ref(), 1))
            .await
            .unwrap();
        // A is paused past its lease plus the margin; B takes both over.
        a.lease().pause_renewals(true);
        clock_a.advance(lease_expiry());
        clock_b.advance(lease_expiry());
        b.lease().renew_now().await;
        for key in [KEY, PARKED] {
            let executed = b
                .execute(KIND, key, append(clock_b.as_ref(), 10))
                .await
                .unwrap();
            assert_eq!(executed.receipt.epoch.get(), 2, "{backend}: took over");
        }
        // A wakes and renews its own, untouched record: held again.
        a.lease().pause_renewals(false);
        assert_eq!(
            a.lease().renew_now().await,
            cellfleet_runtime::lease::LeaseStatus::Held
        );
        for key in [KEY, PARKED] {
            match a.query(KIND, key, "all", json!({}), None).await {
                Err(Error::NotOwner { owner, .. }) => {
                    assert_eq!(owner.unwrap().as_str(), "b", "{backend}")
                }
                Ok(queried) => panic!(
                    "{backend}: the woken node answered from its own state {:?} at epoch {}",
                    queried.value,
                    queried.receipt.epoch.get()
                ),
                Err(other) => panic!("{backend}: expected NotOwner, got {other:?}"),
            }
            match a.resolve(KIND, key, CommandId(command_id(10)), None).await {
                Err(Error::NotOwner { .. }) => {}
                other => panic!("{backend}: resolve through the woken node: {other:?}"),
            }
        }
        assert_eq!(journal(&b, KEY).await, vec!["t1", "t10"], "{backend}");
    }
}

/// Correctness item: `resolve` without the command's expiry never answers
/// ABSENT for a committed command whose ledger entry was pruned (a client
/// that then re-signs the same id would run it twice); with the expiry the
/// answer is definite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolve_without_the_expiry_never_calls_a_pruned_command_absent() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> =
        Arc::new(cellfleet_store::LocalStore::open(dir.path().join("bucket")).unwrap());
    let clock = manual_clock();
    let node = start(
        node_config("n1", dir.path(), "pruned"),
        store,
        clock.clone(),
    )
    .await;
    let mut short = append(clock.as_ref(), 0);
    short.expires_at_ms = clock.now_wall_ms() as i64 + 1_000;
    let expiry = short.expires_at_ms;
    node.execute(KIND, KEY, short).await.unwrap();
    // Past its expiry plus the margin: the next group prunes its entry.
    clock.advance(std::time::Duration::from_millis(2_000));
    node.execute(KIND, KEY, append(clock.as_ref(), 1))
        .await
        .unwrap();
    let id = CommandId(command_id(0));
    let without = node.resolve(KIND, KEY, id, None).await.unwrap();
    assert_ne!(
        without,
        Resolution::Absent,
        "a committed command called absent"
    );
    assert_eq!(without, Resolution::NeedsExpiry);
    let with = node.resolve(KIND, KEY, id, Some(expiry)).await.unwrap();
    assert_eq!(with, Resolution::Expired);
    // A command that never ran, with its (open) window: provably absent.
    let open = clock.now_wall_ms() as i64 + 60_000;
    let never = node
        .resolve(KIND, KEY, CommandId(command_id(7)), Some(open))
        .await
        .unwrap();
    assert_eq!(never, Resolution::Absent);
}

/// Correctness item: a root CAS whose attempt timed out at the client but
/// that the store applies afterwards is never judged NOT_COMMITTED (the
/// re-read still shows the base, yet the PUT can still land). Either the
/// command is acknowledged, or its fate is unknown; it is in the journal
/// exactly when it was acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_cas_that_lands_after_its_timeout_is_never_called_not_committed() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, inner, prefix) in backends("lands-late", dir.path()).await {
        let store = Arc::new(FaultStore::new(inner));
        let clock = manual_clock();
        let node = start(
            cell_node_config("n1", &dir.path().join(backend), &prefix),
            store.clone(),
            clock.clone(),
        )
        .await;
        let log = AckLog::default();
        let first = node
            .execute(KIND, KEY, append(clock.as_ref(), 0))
            .await
            .unwrap();
        log.ack(0, first.outcome);
        let late = std::time::Duration::from_millis(300);
        store.inject(Fault::land_late(Op::PutIfMatch, late).key_prefix(root_key(&prefix)));
        let outcome = node.execute(KIND, KEY, append(clock.as_ref(), 1)).await;
        // Let the late write land (or be refused) before looking.
        tokio::time::sleep(late * 3).await;
        match outcome {
            Ok(executed) => log.ack(1, executed.outcome),
            Err(Error::Unknown { .. }) => {
                let retry = node
                    .execute(KIND, KEY, append(clock.as_ref(), 1))
                    .await
                    .unwrap();
                log.ack(1, retry.outcome);
            }
            Err(Error::NotCommitted { reason }) => {
                assert_eq!(
                    journal(&node, KEY).await,
                    vec!["t0"],
                    "{backend}: reported not committed ({reason}), but the write landed"
                );
                log.not_committed(1);
            }
            Err(other) => panic!("{backend}: {other:?}"),
        }
        log.verify(&node, KEY).await;
    }
}

/// Correctness item: the chain-full trap. Every compaction upload fails for
/// a while; the chain must not grow into the root's hard limit (where every
/// publication fails and a re-activated actor, which used to prepare no
/// compaction, stays locked out for good). Once uploads work again the Cell
/// serves again, compacted, and every acknowledged command is there once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_whose_compactions_failed_recovers_once_uploads_work() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> =
        Arc::new(cellfleet_store::LocalStore::open(dir.path().join("bucket")).unwrap());
    let store = Arc::new(FaultStore::new(store));
    let clock = manual_clock();
    let mut config = cell_node_config("a", dir.path(), "chain-full");
    config.limits.chain_files_max = 2;
    let node = start(config, store.clone(), clock.clone()).await;
    let log = AckLog::default();
    let first = node
        .execute(KIND, KEY, append(clock.as_ref(), 0))
        .await
        .unwrap();
    log.ack(0, first.outcome.clone());
    // Compactions and snapshots start at TXID 1; the Cell's own first file
    // (TXID 1..1) is uploaded already.
    let cell = cellfleet_authority::CellId::for_kind_key(KIND, KEY);
    let compacted = format!(
        "{}{:016x}/{:016x}-",
        Layout::new("chain-full").unwrap().ltx_prefix(&cell),
        first.receipt.epoch.get(),
        1
    );
    store.inject(
        Fault::unavailable(Op::PutIfNoneMatch)
            .key_prefix(compacted)
            .times(u64::MAX),
    );
    let limit = cellfleet_authority::root::CHAIN_LEN_MAX as u64 + 10;
    let mut refused = 0;
    for n in 1..limit {
        match node.execute(KIND, KEY, append(clock.as_ref(), n)).await {
            Ok(executed) => log.ack(n, executed.outcome),
            Err(Error::NotCommitted { .. }) => {
                log.not_committed(n);
                refused += 1;
            }
            Err(other) => panic!("command {n}: {other:?}"),
        }
        if refused >= 3 {
            break;
        }
    }
    store.clear();
    for n in limit..limit + 5 {
        let executed = node
            .execute(KIND, KEY, append(clock.as_ref(), n))
            .await
            .unwrap_or_else(|e| {
                panic!("the cell stayed locked out after uploads recovered: {e:?}")
            });
        log.ack(n, executed.outcome);
    }
    let described = node.describe_cell(KIND, KEY).await.unwrap();
    assert!(
        described.chain_files <= 4,
        "the chain was not compacted: {} files",
        described.chain_files
    );
    log.verify(&node, KEY).await;
}

/// Descriptors this process holds open on files of `cells` (a node's Cell
/// directory): databases, WALs, shared memory and lock files.
fn descriptors_under(cells: &std::path::Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter(|target| target.starts_with(cells))
        .count()
}

/// The descriptor budget covers what Cells really hold: a Cell is charged
/// for its files, each reader a query opens, and the descriptors SQLite
/// keeps of closed readers. With room for a few Cells and readers, reading
/// many Cells over and over passivates idle ones to make room, every query
/// answers, and the descriptors open never exceed the charge or `fds_max`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_are_charged_against_fds_max_and_every_query_answers() {
    const CELLS: u64 = 12;
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> =
        Arc::new(cellfleet_store::LocalStore::open(dir.path().join("bucket")).unwrap());
    let clock = manual_clock();
    let mut config = node_config("a", dir.path(), "fds");
    config.limits.fds_max = 4 * 5 + 2 * 2;
    config.log.checkpoint_idle_ms = 50;
    let fds_max = config.limits.fds_max;
    let a = start(config, store, clock.clone()).await;
    let cells = dir.path().join("a").join("cells");
    let check = |what: &str| {
        let open = descriptors_under(&cells);
        let charged = a.cell_descriptors_charged();
        assert!(
            open <= charged && charged <= fds_max,
            "{what}: {open} descriptors open, {charged} charged, fds_max {fds_max}"
        );
    };
    for n in 0..CELLS {
        let key = format!("cell-{n}");
        a.execute(KIND, key.as_bytes(), append(clock.as_ref(), n))
            .await
            .unwrap();
        check(&format!("after creating {key}"));
    }
    for round in 0..3 {
        for n in 0..CELLS {
            let key = format!("cell-{n}");
            assert_eq!(
                journal(&a, key.as_bytes()).await,
                vec![format!("t{n}")],
                "round {round}"
            );
            check(&format!("round {round}, after reading {key}"));
        }
    }
    assert!(
        a.metrics()
            .passivations_total
            .load(std::sync::atomic::Ordering::Relaxed)
            >= CELLS - 5
    );
}

/// A watch that reaches a Cell while this node is still activating it
/// waits for the activation and is answered by the Cell's first group,
/// not refused as busy (it used to answer `ResourceExhausted`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_on_a_cell_being_activated_waits_for_it() {
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let inner: Arc<dyn ObjectStore> =
        Arc::new(cellfleet_store::LocalStore::open(dir.path().join("bucket")).unwrap());
    let store = Arc::new(FaultStore::new(inner));
    let clock = manual_clock();
    let node = start(
        node_config("n1", dir.path(), "watch-activating"),
        store.clone(),
        clock.clone(),
    )
    .await;
    // Every store call is slow for now: the activation takes a while.
    store.inject(Fault::delay(None, Duration::from_millis(300)).times(u64::MAX));
    let executing = {
        let (node, clock) = (node.clone(), clock.clone());
        tokio::spawn(async move { node.execute(KIND, KEY, append(clock.as_ref(), 1)).await })
    };
    // Until the slot exists the node holds nothing of the Cell.
    let watched = loop {
        let answer = node
            .watch(KIND, KEY, Txid::ZERO, Duration::from_secs(20))
            .await;
        match answer {
            Err(Error::NotOwner { .. }) if !executing.is_finished() => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            other => break other,
        }
    };
    store.clear();
    let executed = executing.await.unwrap().unwrap();
    // The first group past zero: the new Cell's migrations (TXID 1), or
    // the command's own group.
    let watched = watched.expect("answered, not refused as busy");
    assert!(
        watched >= Txid(1) && watched <= executed.receipt.txid,
        "{watched:?} of {:?}",
        executed.receipt.txid
    );
}

/// A watch is answered by the next acknowledged group, whatever sent it,
/// and at its bound with what it gave; a Cell this node holds no root of
/// is NotOwner. In both publication modes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_is_answered_by_the_next_acknowledged_group() {
    use std::time::Duration;
    for cell_mode in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn ObjectStore> =
            Arc::new(cellfleet_store::LocalStore::open(dir.path().join("bucket")).unwrap());
        let config = if cell_mode {
            cell_node_config("n1", dir.path(), "watch")
        } else {
            node_config("n1", dir.path(), "watch")
        };
        let clock = manual_clock();
        let node = start(config, store, clock.clone()).await;
        let missing = node
            .watch(KIND, KEY, Txid::ZERO, Duration::from_secs(1))
            .await;
        assert!(
            matches!(missing, Err(Error::NotOwner { .. })),
            "no root here yet: {missing:?}"
        );
        let first = node
            .execute(KIND, KEY, append(clock.as_ref(), 1))
            .await
            .unwrap();
        let at = first.receipt.txid;
        // Behind the Cell: answered at once with where it is.
        let seen = node
            .watch(KIND, KEY, Txid::ZERO, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(seen, at, "cell mode {cell_mode}");
        // At the Cell: nothing newer within the bound.
        let seen = node
            .watch(KIND, KEY, at, Duration::from_millis(50))
            .await
            .unwrap();
        assert_eq!(seen, at, "cell mode {cell_mode}");
        // At the Cell, then a command: the watch wakes with its TXID.
        let waiting = {
            let node = node.clone();
            tokio::spawn(async move { node.watch(KIND, KEY, at, Duration::from_secs(10)).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "nothing new yet");
        let second = node
            .execute(KIND, KEY, append(clock.as_ref(), 2))
            .await
            .unwrap();
        let woke = waiting.await.unwrap().unwrap();
        assert_eq!(woke, second.receipt.txid, "cell mode {cell_mode}");
        let metrics = node.metrics_text();
        assert!(
            metrics.contains("cellfleet_runtime_watches_total{node=\"n1\"} 3"),
            "{metrics}"
        );
        assert!(
            metrics.contains("cellfleet_runtime_watch_wakes_total{node=\"n1\"} 2"),
            "{metrics}"
        );
        // A drain releases the Cell: its watcher is answered at once, with
        // no change, instead of at its bound.
        let last = second.receipt.txid;
        let waiting = {
            let node = node.clone();
            tokio::spawn(async move { node.watch(KIND, KEY, last, Duration::from_secs(10)).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        node.drain().await.unwrap();
        let answered = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("answered when the Cell was released, not at its bound")
            .unwrap();
        assert_eq!(answered.unwrap(), last, "cell mode {cell_mode}");
        // A drained node answers like every request, so a router looks
        // for the new owner instead of watching here again.
        let refused = node.watch(KIND, KEY, last, Duration::from_secs(1)).await;
        assert!(
            matches!(refused, Err(Error::Draining)),
            "cell mode {cell_mode}: {refused:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_cells_execute_small_groups_on_their_actor_task() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, inner, prefix) in backends("inline", dir.path()).await {
        for commands_max in [16, 0] {
            let prefix = format!("{prefix}/max{commands_max}");
            let clock = manual_clock();
            let mut config = node_config("n1", &dir.path().join(backend).join(&prefix), &prefix);
            config.limits.inline_commands_max = commands_max;
            let node = start(config, inner.clone(), clock.clone()).await;
            let acks = AckLog::default();
            const N: u64 = 12;
            for n in 0..N {
                let executed = node
                    .execute(KIND, KEY, append(clock.as_ref(), n))
                    .await
                    .unwrap();
                acks.ack(n, executed.outcome);
            }
            // A duplicate on the task answers the stored outcome, once.
            let again = node
                .execute(KIND, KEY, append(clock.as_ref(), 3))
                .await
                .unwrap();
            assert!(again.duplicate, "{backend}: {again:?}");
            let inline = groups_inline(&node);
            // The Cell's first group runs on the pool (nothing measured
            // yet), the other N - 1 and the duplicate's on the task; none
            // with the rule off.
            let expected = if commands_max == 0 { 0 } else { N };
            assert_eq!(inline, expected, "{backend}, commands_max {commands_max}");
            let tags = journal(&node, KEY).await;
            assert_eq!(tags.len(), N as usize, "{backend}: {tags:?}");
            acks.verify(&node, KEY).await;
            node.drain().await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_over_the_inline_byte_bound_runs_on_the_pool() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, inner, prefix) in backends("inline-bytes", dir.path()).await {
        let clock = manual_clock();
        let mut config = node_config("n1", &dir.path().join(backend).join(&prefix), &prefix);
        config.limits.inline_bytes_max = 512;
        let node = start(config, inner.clone(), clock.clone()).await;
        let inline = || groups_inline(&node);
        let tagged = |n: u64, tag: String| {
            cellfleet_cell::Command::new(
                command_id(n),
                "append",
                json!({ "tag": tag }),
                (clock.now_wall_ms() + 600_000) as i64,
            )
        };
        let mut expected = Vec::new();
        // Small, large, small: the Cell's first group runs on the pool
        // (nothing measured yet), a group over 512 payload bytes on the
        // pool, every other one on the actor's task.
        let plan: Vec<(u64, usize)> = vec![(0, 8), (1, 8), (2, 2048), (3, 2048), (4, 8), (5, 8)];
        let mut counts = Vec::new();
        for (n, len) in plan {
            let tag = format!("{n:0>len$}");
            node.execute(KIND, KEY, tagged(n, tag.clone()))
                .await
                .unwrap();
            expected.push(tag);
            counts.push(inline());
        }
        assert_eq!(counts, vec![0, 1, 1, 1, 2, 3], "{backend}");
        assert_eq!(journal(&node, KEY).await, expected, "{backend}");
        node.drain().await.unwrap();
    }
}

/// A `$sql` kind, for commands of a chosen cost.
const SQLBOX: &str = r#"
[kinds.sqlbox]
raw_sql = true
migrations = ["CREATE TABLE t (x INTEGER NOT NULL)"]
[kinds.sqlbox.queries.rows]
sql = "SELECT count(*) FROM t"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_over_the_inline_step_budget_runs_again_on_the_pool() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = cellfleet_cell::Manifest::parse(SQLBOX).unwrap();
    let kinds = Arc::new(
        cellfleet_runtime::Kinds::builtin()
            .with(Arc::new(cellfleet_cell::Typed(
                cellfleet_runtime::testkit::Journal,
            )))
            .with(manifest.kind("sqlbox").unwrap()),
    );
    for (backend, inner, prefix) in backends("inline-command-steps", dir.path()).await {
        for steps_max in [20_000, u64::MAX] {
            let prefix = format!("{prefix}/steps{steps_max}");
            let clock = manual_clock();
            let mut config = node_config("n1", &dir.path().join(backend).join(&prefix), &prefix);
            config.limits.inline_steps_max = steps_max;
            let node =
                cellfleet_runtime::Node::start(config, inner.clone(), clock.clone(), kinds.clone())
                    .await
                    .expect("node starts");
            let inline = || groups_inline(&node);
            // Inserts `rows` rows: about ten VM steps a row.
            let inserting = |n: u64, rows: u64| {
                cellfleet_cell::Command::new(
                    command_id(n),
                    "$sql",
                    json!({"sql": format!(
                        "INSERT INTO t SELECT n FROM (WITH RECURSIVE c(n) AS \
                         (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < {rows}) SELECT n FROM c)"
                    )}),
                    (clock.now_wall_ms() + 600_000) as i64,
                )
            };
            // Cheap, cheap, 5,000 rows, cheap: the first on the pool
            // (nothing measured yet), the cheap ones after it on the task.
            // The large one starts on the task; past 20,000 steps it stops
            // short there and runs in full on the pool, so it is not
            // counted. With no step bound it runs on the task to the end.
            let mut counts = Vec::new();
            for (n, rows) in [(0, 1), (1, 1), (2, 5_000), (3, 1)] {
                let executed = node
                    .execute("sqlbox", KEY, inserting(n, rows))
                    .await
                    .unwrap();
                assert!(!executed.duplicate, "{backend}: command {n} ran before");
                match &executed.outcome {
                    cellfleet_cell::Outcome::Applied { result } => {
                        assert_eq!(result["changes"], json!(rows), "{backend}: command {n}")
                    }
                    other => panic!("{backend}: command {n}: {other:?}"),
                }
                counts.push(inline());
            }
            let expected = if steps_max == u64::MAX {
                vec![0, 1, 2, 3]
            } else {
                vec![0, 1, 1, 2]
            };
            assert_eq!(counts, expected, "{backend}, inline_steps_max {steps_max}");
            let rows = node
                .query("sqlbox", KEY, "rows", json!({}), None)
                .await
                .unwrap();
            assert_eq!(
                rows.value["rows"],
                json!([[5_003]]),
                "{backend}: each command once"
            );
            node.drain().await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_cells_answer_short_queries_on_their_actor_task() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, inner, prefix) in backends("inline-queries", dir.path()).await {
        for commands_max in [16, 0] {
            let prefix = format!("{prefix}/max{commands_max}");
            let clock = manual_clock();
            let mut config = node_config("n1", &dir.path().join(backend).join(&prefix), &prefix);
            config.limits.inline_commands_max = commands_max;
            let node = start(config, inner.clone(), clock.clone()).await;
            node.execute(KIND, KEY, append(clock.as_ref(), 0))
                .await
                .unwrap();
            let mut counts = Vec::new();
            for _ in 0..5 {
                assert_eq!(journal(&node, KEY).await, vec!["t0"], "{backend}");
                counts.push(queries_inline(&node));
            }
            // The first query opens the Cell's reader (on the pool, and
            // not measured), the second has nothing measured yet (on the
            // pool), the rest run on the task; none with the rule off.
            let expected = if commands_max == 0 {
                vec![0; 5]
            } else {
                vec![0, 0, 1, 2, 3]
            };
            assert_eq!(counts, expected, "{backend}, commands_max {commands_max}");
            node.drain().await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_over_the_inline_step_budget_answers_from_the_pool() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, inner, prefix) in backends("inline-query-steps", dir.path()).await {
        let clock = manual_clock();
        let mut config = node_config("n1", &dir.path().join(backend).join(&prefix), &prefix);
        // The smallest budget: a query stops short past about 2,000 VM
        // steps on the task.
        config.limits.inline_steps_max = 0;
        let node = start(config, inner.clone(), clock.clone()).await;
        let inline = || queries_inline(&node);
        node.execute(KIND, KEY, append(clock.as_ref(), 0))
            .await
            .unwrap();
        for _ in 0..3 {
            assert_eq!(journal(&node, KEY).await, vec!["t0"], "{backend}");
        }
        // Reader opened, then measured, then one on the task.
        assert_eq!(inline(), 1, "{backend}");
        // 3,000 rows take the query well past the task's budget: it stops
        // there and answers in full from the pool, each time.
        for first in (1..3000).step_by(200) {
            for (n, result) in execute_all(&node, &clock, KEY, first..(first + 200).min(3000)).await
            {
                result.unwrap_or_else(|e| panic!("{backend}: append {n}: {e:?}"));
            }
        }
        for _ in 0..2 {
            let tags = journal(&node, KEY).await;
            assert_eq!(tags.len(), 3000, "{backend}");
            assert_eq!(tags.first().map(String::as_str), Some("t0"), "{backend}");
        }
        assert_eq!(inline(), 1, "{backend}");
        node.drain().await.unwrap();
    }
}
