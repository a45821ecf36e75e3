//! The node log in the runtime (DESIGN.md §9), on the local-directory store and real SeaweedFS: replies on durable segments, checkpoints, takeover by sealing and replay, and the same state as the per-Cell mode.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use cellfleet_authority::{CellId, Layout, RootRecord};
use cellfleet_runtime::{Error, NodeConfig};
use cellfleet_store::{Fault, FaultStore, ObjectStore, Op};
use common::*;

const KEY: &[u8] = b"acct-1";

fn logs_prefix(prefix: &str) -> String {
    format!("{}/logs/", Layout::new(prefix).unwrap().prefix())
}

async fn root_of(store: &dyn ObjectStore, prefix: &str, key: &[u8]) -> RootRecord {
    let cell = CellId::for_kind_key(KIND, key);
    let object = store
        .get(&Layout::new(prefix).unwrap().root_key(&cell))
        .await
        .unwrap();
    RootRecord::decode(&object.body).unwrap()
}

/// No checkpoint unless stopping: every record stays in the log.
fn lazy(mut config: NodeConfig) -> NodeConfig {
    config.log.checkpoint_records = 1_000_000;
    config.log.checkpoint_bytes = u64::MAX;
    config.log.checkpoint_idle_ms = 3_600_000;
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_segment_reply_is_settled_by_sending_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, inner, prefix) in backends("log-lost-reply", dir.path()).await {
        let config = node_config("n1", &dir.path().join(backend), &prefix);
        let (store, clock, node, log) = start_with_first_command(config, inner, KEY).await;
        // The segment lands but its reply is lost: the resend finds this
        // session's bytes in the slot, so the group is acknowledged once.
        store.inject(
            Fault::lose_reply(Op::PutIfNoneMatch)
                .key_prefix(logs_prefix(&prefix))
                .times(1),
        );
        let executed = node
            .execute(KIND, KEY, append(clock.as_ref(), 1))
            .await
            .unwrap();
        assert!(!executed.duplicate, "{backend}");
        log.ack(1, executed.outcome.clone());
        let retry = node
            .execute(KIND, KEY, append(clock.as_ref(), 1))
            .await
            .unwrap();
        assert!(retry.duplicate, "{backend}");
        assert_eq!(retry.outcome, executed.outcome);
        log.verify(&node, KEY).await;
        assert_eq!(journal(&node, KEY).await, vec!["t0", "t1"], "{backend}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segment_in_doubt_answers_unknown_and_is_never_lost() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, inner, prefix) in backends("log-in-doubt", dir.path()).await {
        let store = Arc::new(FaultStore::new(inner));
        let clock = manual_clock();
        let mut config = node_config("n1", &dir.path().join(backend), &prefix);
        config.log.reply_wait_ms = 150;
        let node = start(config, store.clone(), clock.clone()).await;
        let log = AckLog::default();
        let first = node
            .execute(KIND, KEY, append(clock.as_ref(), 0))
            .await
            .unwrap();
        log.ack(0, first.outcome);
        // The store refuses segment writes for longer than the reply bound.
        store.inject(
            Fault::unavailable(Op::PutIfNoneMatch)
                .key_prefix(logs_prefix(&prefix))
                .times(5),
        );
        match node.execute(KIND, KEY, append(clock.as_ref(), 1)).await {
            Err(Error::Unknown { .. }) => {}
            other => panic!("{backend}: expected Unknown, got {other:?}"),
        }
        // The writer keeps sending the same bytes; once they land the
        // retry of the same command gets the stored outcome.
        let retry = node
            .execute(KIND, KEY, append(clock.as_ref(), 1))
            .await
            .unwrap();
        assert!(retry.duplicate, "{backend}: the ledger answers the retry");
        log.ack(1, retry.outcome);
        log.verify(&node, KEY).await;
        assert_eq!(journal(&node, KEY).await, vec!["t0", "t1"], "{backend}");
    }
}

/// The dead owner never checkpointed: its records live only in its lane.
/// The successor seals the lane, replays them, checkpoints them into the
/// chain in the takeover, and the paused owner's later writes find the
/// seal and are not committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_seals_the_dead_lane_and_replays_its_records() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, store, prefix) in backends("log-takeover", dir.path()).await {
        let dir = dir.path().join(backend);
        let clock_a = manual_clock();
        let clock_b = manual_clock();
        let a = start(
            lazy(node_config("a", &dir, &prefix)),
            store.clone(),
            clock_a.clone(),
        )
        .await;
        let b = start(
            lazy(node_config("b", &dir, &prefix)),
            store.clone(),
            clock_b.clone(),
        )
        .await;
        let log = AckLog::default();
        for (n, result) in execute_all(&a, &clock_a, KEY, 0..12).await {
            log.ack(n, result.expect("acknowledged").outcome);
        }
        let before = root_of(store.as_ref(), &prefix, KEY).await;
        assert!(
            before.log.is_some(),
            "{backend}: the root points into a's lane"
        );
        let described = a.describe_cell(KIND, KEY).await.unwrap();
        assert!(
            described.txid > before.txid,
            "{backend}: acknowledged {} is past the root's {}",
            described.txid,
            before.txid
        );
        a.lease().pause_renewals(true);
        clock_b.advance(lease_expiry());
        let executed = b
            .execute(KIND, KEY, append(clock_b.as_ref(), 100))
            .await
            .unwrap();
        assert_eq!(executed.receipt.epoch.get(), 2, "{backend}");
        log.ack(100, executed.outcome);
        let metrics = b.metrics();
        assert!(metrics.log_seals_total.load(Ordering::Relaxed) >= 1);
        assert!(
            metrics.log_replayed_records_total.load(Ordering::Relaxed) >= 1,
            "{backend}: records replayed"
        );
        let after = root_of(store.as_ref(), &prefix, KEY).await;
        assert_eq!(
            after.log.as_ref().map(|p| p.lane.node.as_str().to_owned()),
            Some("b".to_owned()),
            "{backend}: the pointer moved to b's lane"
        );
        assert!(
            after.txid >= described.txid,
            "{backend}: replay checkpointed"
        );
        // The paused owner still believes its lease: its lane is sealed.
        match a.execute(KIND, KEY, append(clock_a.as_ref(), 200)).await {
            Err(Error::NotCommitted { .. }) | Err(Error::NotOwner { .. }) => log.not_committed(200),
            other => panic!("{backend}: the old owner acknowledged after the seal: {other:?}"),
        }
        log.verify(&b, KEY).await;
    }
}

/// The same command sequence leaves the same database, page for page (the
/// rolling checksum covers every page), in either publication mode, and a
/// drained log-mode Cell's released root holds everything in its chain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_modes_recover_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, store, prefix) in backends("log-identical", dir.path()).await {
        let dir = dir.path().join(backend);
        let mut roots = Vec::new();
        for (mode, config) in [
            (
                "cell",
                cell_node_config("c", &dir, &format!("{prefix}-cell")),
            ),
            (
                "log",
                lazy(node_config("l", &dir, &format!("{prefix}-log"))),
            ),
        ] {
            let clock = manual_clock();
            let node = start(config, store.clone(), clock.clone()).await;
            for n in 0..20 {
                node.execute(KIND, KEY, append(clock.as_ref(), n))
                    .await
                    .unwrap();
            }
            node.drain().await.unwrap();
            let root = root_of(store.as_ref(), &format!("{prefix}-{mode}"), KEY).await;
            assert!(
                root.log.is_none(),
                "{backend} {mode}: a released root has no pointer"
            );
            roots.push(root);
        }
        assert_eq!(roots[0].txid, roots[1].txid, "{backend}");
        assert_eq!(
            roots[0].checksum, roots[1].checksum,
            "{backend}: same pages in both modes"
        );
        // And a node of the other mode recovers the log-mode Cell exactly.
        let clock = manual_clock();
        let reader = start(
            cell_node_config("r", &dir, &format!("{prefix}-log")),
            store.clone(),
            clock.clone(),
        )
        .await;
        let tags: Vec<String> = (0..20).map(|n| format!("t{n}")).collect();
        assert_eq!(journal(&reader, KEY).await, tags, "{backend}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_bound_the_records_past_the_root_and_compaction_still_runs() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, store, prefix) in backends("log-checkpoint", dir.path()).await {
        let dir = dir.path().join(backend);
        let clock = manual_clock();
        let mut config = node_config("a", &dir, &prefix);
        config.log.checkpoint_records = 3;
        config.limits.chain_files_max = 4;
        let a = start(config, store.clone(), clock.clone()).await;
        let log = AckLog::default();
        for n in 0..40 {
            let executed = a
                .execute(KIND, KEY, append(clock.as_ref(), n))
                .await
                .unwrap();
            log.ack(n, executed.outcome);
        }
        // Let the last checkpoint finish.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let root = root_of(store.as_ref(), &prefix, KEY).await;
        let acked = a.describe_cell(KIND, KEY).await.unwrap().txid;
        assert!(
            acked.0 - root.txid.0 < 3 + 1,
            "{backend}: root at {} trails the log's {acked} by at most the trigger",
            root.txid
        );
        let metrics = a.metrics();
        assert!(metrics.checkpoints_total.load(Ordering::Relaxed) >= 10);
        assert!(
            metrics.compactions_total.load(Ordering::Relaxed) >= 1,
            "{backend}: compaction rides on checkpoints"
        );
        assert!(
            root.chain.len() <= 8,
            "{backend}: chain {}",
            root.chain.len()
        );
        log.verify(&a, KEY).await;
    }
}

/// The crash/seal race: the owner's segment PUT is still on its way when
/// its lease expires and a successor takes over. The successor's seal goes
/// into that very slot; the late PUT finds it, and the old owner answers
/// not committed — and the command is nowhere in the Cell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segment_that_arrives_after_the_seal_is_never_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, inner, prefix) in backends("log-seal-race", dir.path()).await {
        let dir = dir.path().join(backend);
        let a_store = Arc::new(FaultStore::new(inner.clone()));
        let clock_a = manual_clock();
        let clock_b = manual_clock();
        let a = start(
            lazy(node_config("a", &dir, &prefix)),
            a_store.clone(),
            clock_a.clone(),
        )
        .await;
        let b = start(
            lazy(node_config("b", &dir, &prefix)),
            inner.clone(),
            clock_b.clone(),
        )
        .await;
        let log = AckLog::default();
        for n in 0..3 {
            let executed = a
                .execute(KIND, KEY, append(clock_a.as_ref(), n))
                .await
                .unwrap();
            log.ack(n, executed.outcome);
        }
        a.lease().pause_renewals(true);
        let late = Duration::from_millis(1_500);
        a_store
            .inject(Fault::delay(Some(Op::PutIfNoneMatch), late).key_prefix(logs_prefix(&prefix)));
        let pending = {
            let (a, clock) = (a.clone(), clock_a.clone());
            tokio::spawn(async move { a.execute(KIND, KEY, append(clock.as_ref(), 50)).await })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        clock_b.advance(lease_expiry());
        let executed = b
            .execute(KIND, KEY, append(clock_b.as_ref(), 60))
            .await
            .unwrap();
        log.ack(60, executed.outcome);
        match pending.await.unwrap() {
            Err(Error::NotCommitted { .. }) => log.not_committed(50),
            other => panic!("{backend}: a segment written after the seal was answered {other:?}"),
        }
        assert_eq!(
            journal(&b, KEY).await,
            vec!["t0", "t1", "t2", "t60"],
            "{backend}"
        );
        log.verify(&b, KEY).await;
    }
}

/// Issue 13 (the lane index): a dead owner's lane of more than two chunks
/// of segments is indexed by its successor from the chunk indexes the
/// owner put (a GET per 256 segments) plus the last, partial chunk's own
/// indexes, and every acknowledged record of both of its Cells is
/// replayed: one written at the start of the lane, one all along it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_reads_the_dead_lane_s_chunk_indexes() {
    const OTHER: &[u8] = b"acct-early";
    let dir = tempfile::tempdir().unwrap();
    for (backend, store, prefix) in backends("log-chunks", dir.path()).await {
        let dir = dir.path().join(backend);
        let clock_a = manual_clock();
        let clock_b = manual_clock();
        let mut config = lazy(node_config("a", &dir, &prefix));
        config.log.lanes = 1;
        config.log.replay_segments_max = 1_000_000;
        let a = start(config, store.clone(), clock_a.clone()).await;
        let b = start(
            lazy(node_config("b", &dir, &prefix)),
            store.clone(),
            clock_b.clone(),
        )
        .await;
        let (log, early) = (AckLog::default(), AckLog::default());
        for n in 0..3 {
            let executed = a
                .execute(KIND, OTHER, append(clock_a.as_ref(), n))
                .await
                .unwrap();
            early.ack(n, executed.outcome);
        }
        // One command at a time: a segment each, 2.2 chunks' worth.
        let total = 2 * cellfleet_nodelog::chunk::CHUNK_SLOTS + 60;
        for n in 0..total {
            let executed = a
                .execute(KIND, KEY, append(clock_a.as_ref(), n))
                .await
                .unwrap();
            log.ack(n, executed.outcome);
        }
        // The chunk indexes are put in the background after their acks.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let listed = cellfleet_store::list_all(store.as_ref(), &logs_prefix(&prefix), 100_000)
                .await
                .unwrap();
            if listed.iter().filter(|e| e.key.ends_with(".idx")).count() >= 2 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{backend}: chunk indexes not put"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        a.lease().pause_renewals(true);
        clock_b.advance(lease_expiry());
        for (key, acks, n) in [(KEY, &log, 10_000), (OTHER, &early, 10_001)] {
            let executed = b
                .execute(KIND, key, append(clock_b.as_ref(), n))
                .await
                .unwrap();
            acks.ack(n, executed.outcome);
        }
        let metrics = b.metrics();
        let chunks = metrics.log_chunk_indexes_read_total.load(Ordering::Relaxed);
        let slots = metrics.log_slot_indexes_read_total.load(Ordering::Relaxed);
        assert!(chunks >= 2, "{backend}: {chunks} chunk indexes read");
        assert!(
            slots < cellfleet_nodelog::chunk::CHUNK_SLOTS,
            "{backend}: {slots} segments' own indexes read besides {chunks} chunk indexes"
        );
        log.verify(&b, KEY).await;
        early.verify(&b, OTHER).await;
    }
}

/// A chain whose files cannot be merged from memory (no chain cache),
/// checkpointed on every record while more records are acknowledged: the
/// chain stays bounded and drain completes. (In the bench a hot Cell's
/// chain reached its bound with only a snapshot prepared, which in log mode
/// sits on no chain boundary; its checkpoint was postponed forever and its
/// node never drained. At the bound the checkpoint is now a snapshot of the
/// acknowledged state. This test did not reproduce that stall on the old
/// code; the bench run in BENCHMARKS.md did.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_at_its_bound_checkpoints_by_snapshot_and_drains() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, store, prefix) in backends("log-snapshot", dir.path()).await {
        let dir = dir.path().join(backend);
        let clock = manual_clock();
        let mut config = node_config("a", &dir, &prefix);
        config.log.checkpoint_records = 1;
        config.limits.chain_files_max = 2;
        config.limits.chain_cache_bytes_max = 0;
        // One command per group: many records, acknowledged back to back.
        config.limits.group_commands_max = 1;
        let a = start(config, store.clone(), clock.clone()).await;
        let log = AckLog::default();
        // Concurrent commands: records are acknowledged while checkpoints
        // are in flight, so the engine is past the root when a compaction
        // is prepared.
        for round in 0..6u64 {
            let ns = (0..16).map(|i| round * 100 + i);
            for (n, result) in execute_all(&a, &clock, KEY, ns).await {
                log.ack(n, result.unwrap().outcome);
            }
        }
        tokio::time::timeout(Duration::from_secs(30), a.drain())
            .await
            .unwrap_or_else(|_| panic!("{backend}: drain did not finish"))
            .unwrap();
        let root = root_of(store.as_ref(), &prefix, KEY).await;
        assert!(
            root.chain.len() <= 4,
            "{backend}: chain {}",
            root.chain.len()
        );
        let b = start(
            node_config("b", &dir, &prefix),
            store.clone(),
            clock.clone(),
        )
        .await;
        log.verify(&b, KEY).await;
    }
}

/// An idle Cell whose records are all checkpointed still has its pointer
/// moved along a busy lane, so a successor's replay of it stays within the
/// replay budget instead of scanning everything the lane wrote since.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_cell_s_pointer_follows_its_busy_lane() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, store, prefix) in backends("log-idle-pointer", dir.path()).await {
        let dir = dir.path().join(backend);
        let clock = manual_clock();
        let mut config = node_config("a", &dir, &prefix);
        config.log.lanes = 1;
        config.log.checkpoint_records = 1;
        config.log.checkpoint_idle_ms = 50;
        config.log.replay_segments_max = 4;
        let a = start(config, store.clone(), clock.clone()).await;
        a.execute(KIND, b"idle", append(clock.as_ref(), 0))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before = root_of(store.as_ref(), &prefix, b"idle").await;
        let from = before.log.as_ref().expect("a pointer").from_seq;
        for n in 1..40 {
            a.execute(KIND, b"busy", append(clock.as_ref(), n))
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let after = root_of(store.as_ref(), &prefix, b"idle").await;
        let moved = after.log.as_ref().expect("a pointer").from_seq;
        assert!(
            moved > from + 20,
            "{backend}: the idle Cell's pointer stayed at {moved} (was {from}) while its lane grew by 39 segments"
        );
        assert_eq!(after.txid, before.txid, "{backend}: only the pointer moved");
        assert_eq!(journal(&a, b"idle").await, vec!["t0"], "{backend}");
    }
}

/// Objects and bytes under `prefix`.
async fn bucket_size(store: &dyn ObjectStore, prefix: &str) -> (usize, u64) {
    let layout = Layout::new(prefix).unwrap();
    let all = cellfleet_store::list_all(store, &format!("{}/", layout.prefix()), 1_000_000)
        .await
        .unwrap();
    (all.len(), all.iter().map(|o| o.size).sum())
}

/// DESIGN.md §9 rules 4-5: a steady workload over many Cells leaves a
/// bounded bucket. Segments below every Cell's records still past its
/// root, and LTX files a checkpoint or compaction replaced, are deleted
/// once old enough; the object count and bytes level off. With collection
/// off, the same workload keeps growing (so the check can fail). A
/// successor that takes over the collected lanes still recovers every
/// acknowledged command exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collection_keeps_the_bucket_bounded_under_a_steady_workload() {
    const CELLS: u64 = 16;
    const ROUNDS: u64 = 48;
    let dir = tempfile::tempdir().unwrap();
    for (backend, store, prefix) in backends("log-gc", dir.path()).await {
        let mut growth = Vec::new();
        for collect in [true, false] {
            let prefix = format!("{prefix}-{collect}");
            let dir = dir.path().join(format!("{backend}-{collect}"));
            let clock = manual_clock();
            let mut config = node_config("a", &dir, &prefix);
            config.log.checkpoint_records = 4;
            config.limits.chain_files_max = 4;
            config.gc.enabled = collect;
            config.gc.min_age_ms = 100;
            config.gc.interval_ms = 20;
            let a = start(config, store.clone(), clock.clone()).await;
            let logs: Vec<AckLog> = (0..CELLS).map(|_| AckLog::default()).collect();
            let mut sizes = Vec::new();
            for round in 0..ROUNDS {
                let tasks: Vec<_> = (0..CELLS)
                    .map(|cell| {
                        let (a, clock) = (a.clone(), clock.clone());
                        tokio::spawn(async move {
                            let key = format!("gc-{cell}");
                            a.execute(KIND, key.as_bytes(), append(clock.as_ref(), round))
                                .await
                        })
                    })
                    .collect();
                for (cell, task) in tasks.into_iter().enumerate() {
                    let executed = task.await.unwrap().expect("acknowledged");
                    logs[cell].ack(round, executed.outcome);
                }
                // Time for the collector to pass the minimum age.
                tokio::time::sleep(Duration::from_millis(30)).await;
                sizes.push(bucket_size(store.as_ref(), &prefix).await);
            }
            tokio::time::sleep(Duration::from_millis(400)).await;
            let end = bucket_size(store.as_ref(), &prefix).await;
            let third = sizes[ROUNDS as usize / 3];
            let metrics = a.metrics();
            let (segments, ltx) = (
                metrics.gc_segments_deleted_total.load(Ordering::Relaxed),
                metrics.gc_ltx_deleted_total.load(Ordering::Relaxed),
            );
            eprintln!("{backend} collect={collect}: objects/bytes at a third {third:?}, at the end {end:?}; deleted {segments} segments, {ltx} LTX files");
            if collect {
                assert!(segments > 0 && ltx > 0, "{backend}: collection deleted");
                assert!(
                    end.0 <= third.0 + third.0 / 4 && end.1 <= third.1 + third.1 / 2,
                    "{backend}: the bucket levels off: {third:?} at a third, {end:?} at the end"
                );
            } else {
                assert_eq!(segments + ltx, 0, "{backend}");
            }
            growth.push((third, end));
            // A successor takes over every Cell from the collected lanes.
            a.lease().pause_renewals(true);
            let clock_b = manual_clock();
            clock_b.advance(lease_expiry());
            let b = start(
                node_config("b", &dir, &prefix),
                store.clone(),
                clock_b.clone(),
            )
            .await;
            for (cell, log) in logs.iter().enumerate() {
                log.verify(&b, format!("gc-{cell}").as_bytes()).await;
            }
        }
        let (on, off) = (growth[0], growth[1]);
        assert!(
            off.1 .0 >= off.0 .0 * 2,
            "{backend}: without collection the bucket keeps growing: {off:?}"
        );
        assert!(on.1 .0 * 2 <= off.1 .0, "{backend}: {on:?} against {off:?}");
    }
}

/// What is left in `node`'s log under `prefix`: (segments, seals, floor
/// markers), counted by reading each slot's kind.
async fn log_objects(store: &dyn ObjectStore, prefix: &str, node: &str) -> (usize, usize, usize) {
    let layout = Layout::new(prefix).unwrap();
    let node = cellfleet_authority::NodeId::new(node).unwrap();
    let keys = cellfleet_store::list_all(store, &layout.node_logs_prefix(&node), 1_000_000)
        .await
        .unwrap();
    let (mut segments, mut seals, mut floors) = (0, 0, 0);
    for entry in keys {
        if layout.parse_segment_key(&entry.key).is_none() {
            floors += 1;
            continue;
        }
        let body = store.get(&entry.key).await.unwrap().body;
        match cellfleet_nodelog::segment::decode(&body).unwrap() {
            cellfleet_nodelog::Slot::Seal(_) => seals += 1,
            cellfleet_nodelog::Slot::Segment(_) => segments += 1,
        }
    }
    (segments, seals, floors)
}

/// DESIGN.md §9, takeover: the node that seals a dead session flushes
/// every Cell with records in that session's log into its root — not only
/// the Cell it was asked for, and releasing the others rather than keeping
/// them — and then collects the dead lanes, keeping
/// their seals, so a zombie of the dead session is still fenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sealer_flushes_every_cell_of_the_dead_session_and_collects_its_log() {
    const CELLS: u64 = 6;
    let dir = tempfile::tempdir().unwrap();
    for (backend, store, prefix) in backends("log-flush", dir.path()).await {
        let dir = dir.path().join(backend);
        let clock_a = manual_clock();
        let a = start(
            lazy(node_config("a", &dir, &prefix)),
            store.clone(),
            clock_a.clone(),
        )
        .await;
        let logs: Vec<AckLog> = (0..CELLS).map(|_| AckLog::default()).collect();
        for n in 0..3 {
            for (cell, log) in logs.iter().enumerate() {
                let key = format!("flush-{cell}");
                let executed = a
                    .execute(KIND, key.as_bytes(), append(clock_a.as_ref(), n))
                    .await
                    .unwrap();
                log.ack(n, executed.outcome);
            }
        }
        let (segments, seals, _) = log_objects(store.as_ref(), &prefix, "a").await;
        assert!(
            segments > 0 && seals == 0,
            "{backend}: a's log holds the records"
        );
        a.lease().pause_renewals(true);
        let clock_b = manual_clock();
        clock_b.advance(lease_expiry());
        let mut config = node_config("b", &dir, &prefix);
        config.gc.min_age_ms = 50;
        let b = start(config, store.clone(), clock_b.clone()).await;
        // One request takes one Cell over; the flush does the rest.
        let executed = b
            .execute(KIND, b"flush-0", append(clock_b.as_ref(), 100))
            .await
            .unwrap();
        logs[0].ack(100, executed.outcome);
        let mut waited = 0;
        while b.metrics().log_flushes_total.load(Ordering::Relaxed) == 0 {
            assert!(waited < 200, "{backend}: the flush did not finish");
            tokio::time::sleep(Duration::from_millis(50)).await;
            waited += 1;
        }
        let first = root_of(store.as_ref(), &prefix, b"flush-0").await;
        assert_eq!(first.owner.as_ref().map(|o| o.as_str()), Some("b"));
        assert_eq!(
            first.log.as_ref().map(|p| p.lane.node.as_str().to_owned()),
            Some("b".to_owned()),
            "{backend}: the requested Cell points into b's log"
        );
        for cell in 1..CELLS {
            let root = root_of(store.as_ref(), &prefix, format!("flush-{cell}").as_bytes()).await;
            // Checkpointed and released: placed like any Cell next time,
            // not piled onto the node that sealed.
            assert!(
                root.owner.is_none() && root.log.is_none(),
                "{backend}: flush-{cell} is released with its records in its chain: {root:?}"
            );
            assert!(
                root.txid.0 >= 3,
                "{backend}: flush-{cell} at txid {}",
                root.txid
            );
        }
        let (segments, seals, floors) = log_objects(store.as_ref(), &prefix, "a").await;
        assert_eq!(segments, 0, "{backend}: a's segments are collected");
        assert!(
            seals >= 1 && floors == seals,
            "{backend}: every lane keeps its seal and floor ({seals}, {floors})"
        );
        // The paused owner still believes its lease: the seal fences it.
        match a
            .execute(KIND, b"flush-3", append(clock_a.as_ref(), 200))
            .await
        {
            Err(Error::NotCommitted { .. }) | Err(Error::NotOwner { .. }) => {
                logs[3].not_committed(200)
            }
            other => panic!("{backend}: the old owner acknowledged after the seal: {other:?}"),
        }
        for (cell, log) in logs.iter().enumerate() {
            log.verify(&b, format!("flush-{cell}").as_bytes()).await;
        }
    }
}

/// A node that restarts (a new session) after a crash flushes its own
/// earlier session's log at start, with no request needed: every Cell
/// with records only there is checkpointed and released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_flushes_its_earlier_session() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, store, prefix) in backends("log-restart-flush", dir.path()).await {
        let dir = dir.path().join(backend);
        let clock = manual_clock();
        let crashing = Arc::new(FaultStore::new(store.clone()));
        let a = start(
            lazy(node_config("a", &dir, &prefix)),
            crashing.clone(),
            clock.clone(),
        )
        .await;
        let logs: Vec<AckLog> = (0..3).map(|_| AckLog::default()).collect();
        for (cell, log) in logs.iter().enumerate() {
            let key = format!("restart-{cell}");
            for n in 0..2 {
                let executed = a
                    .execute(KIND, key.as_bytes(), append(clock.as_ref(), n))
                    .await
                    .unwrap();
                log.ack(n, executed.outcome);
            }
        }
        let old = root_of(store.as_ref(), &prefix, b"restart-0")
            .await
            .owner_session;
        // A crash: the records are only in the log, and the old process
        // writes nothing more (a halt would have checkpointed them).
        a.lease().pause_renewals(true);
        for op in [Op::Put, Op::PutIfMatch, Op::PutIfNoneMatch, Op::Delete] {
            crashing.inject(Fault::unavailable(op).times(u64::MAX));
        }
        let clock = manual_clock();
        clock.advance(lease_expiry());
        // The same node id; another data directory, as the crashed
        // process still holds its files open in this test.
        let mut config = node_config("a", &dir.join("restarted"), &prefix);
        config.gc.min_age_ms = 50;
        let again = start(config, store.clone(), clock.clone()).await;
        let mut waited = 0;
        while again.metrics().log_flushes_total.load(Ordering::Relaxed) == 0 {
            assert!(waited < 200, "{backend}: the flush did not finish");
            tokio::time::sleep(Duration::from_millis(50)).await;
            waited += 1;
        }
        let (segments, seals, _) = log_objects(store.as_ref(), &prefix, "a").await;
        assert!(
            seals >= 1,
            "{backend}: the earlier session's lanes are sealed"
        );
        // Only the new session's own segments (none written yet) remain.
        assert_eq!(
            segments, 0,
            "{backend}: the earlier session's segments are collected"
        );
        for (cell, log) in logs.iter().enumerate() {
            let root = root_of(
                store.as_ref(),
                &prefix,
                format!("restart-{cell}").as_bytes(),
            )
            .await;
            assert_ne!(root.owner_session, old, "{backend}: restart-{cell}");
            assert!(
                root.owner.is_none() && root.log.is_none(),
                "{backend}: restart-{cell} is released with its records in its chain: {root:?}"
            );
            log.verify(&again, format!("restart-{cell}").as_bytes())
                .await;
        }
    }
}

/// A busy lane batches: while one segment is in flight, the groups of many
/// Cells arriving meanwhile wait for it and go out together, instead of
/// each taking a slot of the pipeline for itself; an idle lane writes a
/// lone group at once. (Before the batch rule, a lane with 8 free slots
/// wrote the first 8 arrivals as 8 segments of one group each.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_lane_batches_many_cells_into_few_segments() {
    const CELLS: u64 = 40;
    let dir = tempfile::tempdir().unwrap();
    for (backend, inner, prefix) in backends("log-batch", dir.path()).await {
        let store = Arc::new(FaultStore::new(inner));
        let clock = manual_clock();
        let mut config = lazy(node_config("n1", &dir.path().join(backend), &prefix));
        config.log.lanes = 1;
        config.log.segments_inflight_max = 8;
        // Only a landed segment lets the batch go: no size or time trigger.
        config.log.batch_commands_min = 1_000;
        config.log.linger_ms = 3_600_000;
        let node = start(config, store.clone(), clock.clone()).await;
        let logs: Vec<AckLog> = (0..CELLS).map(|_| AckLog::default()).collect();
        let keys: Vec<Vec<u8>> = (0..CELLS).map(|n| format!("k{n}").into_bytes()).collect();
        // Open every Cell first (a new Cell's schema is a group of its own).
        for (n, key) in keys.iter().enumerate() {
            let executed = node
                .execute(KIND, key, append(clock.as_ref(), n as u64))
                .await
                .unwrap();
            logs[n].ack(n as u64, executed.outcome);
        }
        // One command at a time: an idle lane writes each group at once,
        // one segment each.
        for (n, key) in keys.iter().enumerate().take(5) {
            let before = node.metrics().log_segments_total.load(Ordering::Relaxed);
            let id = 2 * CELLS + n as u64;
            let executed = node
                .execute(KIND, key, append(clock.as_ref(), id))
                .await
                .unwrap();
            logs[n].ack(id, executed.outcome);
            let after = node.metrics().log_segments_total.load(Ordering::Relaxed);
            assert_eq!(after, before + 1, "{backend}: a lone group is one segment");
        }
        // Every segment PUT now takes 300 ms: the first of the burst holds
        // the lane busy while the others arrive.
        store.inject(
            Fault::delay(Some(Op::PutIfNoneMatch), Duration::from_millis(300))
                .key_prefix(logs_prefix(&prefix)),
        );
        let before = node.metrics().log_segments_total.load(Ordering::Relaxed);
        let burst: Vec<_> = keys
            .iter()
            .enumerate()
            .map(|(index, key)| {
                let (node, clock, key) = (node.clone(), clock.clone(), key.clone());
                let n = CELLS + index as u64;
                tokio::spawn(async move {
                    let executed = node.execute(KIND, &key, append(clock.as_ref(), n)).await;
                    (index, n, executed)
                })
            })
            .collect();
        for task in burst {
            let (index, n, executed) = task.await.unwrap();
            let executed = executed.expect("every command of the burst applies");
            logs[index].ack(n, executed.outcome);
        }
        let segments = node.metrics().log_segments_total.load(Ordering::Relaxed) - before;
        assert!(
            segments <= 3,
            "{backend}: {CELLS} Cells' groups took {segments} segments; a busy lane must batch them"
        );
        for (key, log) in keys.iter().zip(&logs) {
            log.verify(&node, key).await;
        }
    }
}

/// A Cell this node creates reads its root once and nothing of the node
/// log: no lane can hold a record of a Cell that had no root. (Each
/// creation of a burst used to wait for the lane's segments in flight and
/// then read the index of every segment written since its pointer.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creating_cells_reads_nothing_of_the_log() {
    const CELLS: u64 = 24;
    let dir = tempfile::tempdir().unwrap();
    let inner: Arc<dyn ObjectStore> =
        Arc::new(cellfleet_store::LocalStore::open(dir.path().join("bucket")).unwrap());
    let store = Arc::new(FaultStore::new(inner));
    let clock = manual_clock();
    let prefix = "log-create";
    let mut config = lazy(node_config("n1", dir.path(), prefix));
    config.log.lanes = 1;
    let node = start(config, store.clone(), clock.clone()).await;
    // Segments land slowly, so the burst's creations overlap other Cells'
    // segments in flight and landing.
    store.inject(
        Fault::delay(Some(Op::PutIfNoneMatch), Duration::from_millis(40))
            .key_prefix(logs_prefix(prefix)),
    );
    store.reset_counts();
    let burst: Vec<_> = (0..CELLS)
        .map(|n| {
            let (node, clock) = (node.clone(), clock.clone());
            tokio::spawn(async move {
                let key = format!("new-{n}").into_bytes();
                let executed = node.execute(KIND, &key, append(clock.as_ref(), n)).await;
                (key, n, executed)
            })
        })
        .collect();
    let mut logs = Vec::new();
    for task in burst {
        let (key, n, executed) = task.await.unwrap();
        let log = AckLog::default();
        log.ack(
            n,
            executed
                .expect("every new Cell applies its command")
                .outcome,
        );
        logs.push((key, log));
    }
    let counts = store.counts();
    assert_eq!(counts.get(Op::GetRange), 0, "{counts:?}");
    assert_eq!(
        node.metrics()
            .activations_created_total
            .load(Ordering::Relaxed),
        CELLS,
        "{counts:?}"
    );
    for (key, log) in &logs {
        log.verify(&node, key).await;
    }
}

/// A new Cell's schema publishes with its first command, in both modes:
/// the command's receipt is TXID 1 (it was 2 behind a publication of the
/// schema alone). A query that comes first applies the schema alone and
/// reads the kind's tables; the command after it is TXID 2. A node of the
/// other mode then recovers both Cells exactly from the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_cells_schema_publishes_with_its_first_command() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> =
        Arc::new(cellfleet_store::LocalStore::open(dir.path().join("bucket")).unwrap());
    for (mode, config, other) in [
        (
            "log",
            lazy(node_config("l", dir.path(), "schema-log")),
            cell_node_config("lr", dir.path(), "schema-log"),
        ),
        (
            "cell",
            cell_node_config("c", dir.path(), "schema-cell"),
            node_config("cr", dir.path(), "schema-cell"),
        ),
    ] {
        let clock = manual_clock();
        let node = start(config, store.clone(), clock.clone()).await;
        let txid_of = |key: &'static [u8], n: u64| {
            let (node, clock) = (node.clone(), clock.clone());
            async move {
                let executed = node.execute(KIND, key, append(clock.as_ref(), n)).await;
                executed.unwrap().receipt.txid.0
            }
        };
        let first = txid_of(b"command-first", 1).await;
        assert_eq!(first, 1, "{mode}: schema and command are one publication");
        assert!(
            journal(&node, b"query-first").await.is_empty(),
            "{mode}: a new Cell's query reads its (empty) tables"
        );
        let after_query = txid_of(b"query-first", 2).await;
        assert_eq!(after_query, 2, "{mode}: the schema published alone first");
        node.drain().await.unwrap();
        let reader = start(other, store.clone(), manual_clock()).await;
        assert_eq!(journal(&reader, b"command-first").await, ["t1"], "{mode}");
        assert_eq!(journal(&reader, b"query-first").await, ["t2"], "{mode}");
        reader.drain().await.unwrap();
    }
}

/// Commands to `cells` Cells in turn, `rounds` times, on a node that keeps
/// at most two open: nearly every command passivates another Cell.
async fn churn(
    node: &cellfleet_runtime::NodeHandle,
    clock: &Arc<cellfleet_authority::ManualClock>,
    logs: &[AckLog],
    rounds: std::ops::Range<u64>,
) {
    for round in rounds {
        for (cell, log) in logs.iter().enumerate() {
            let key = format!("park-{cell}");
            let executed = node
                .execute(KIND, key.as_bytes(), append(clock.as_ref(), round))
                .await
                .expect("acknowledged");
            log.ack(round, executed.outcome);
        }
    }
}

/// Starts a node on `config`, churns three rounds over `cells` Cells, and
/// waits up to 5 s for its sweep to leave no parked record in memory
/// (the caller asserts that it did).
async fn churn_until_swept(
    config: NodeConfig,
    store: Arc<dyn cellfleet_store::ObjectStore>,
    clock: &Arc<cellfleet_authority::ManualClock>,
    cells: usize,
) -> (cellfleet_runtime::NodeHandle, Vec<AckLog>) {
    let node = start(config, store, clock.clone()).await;
    let logs: Vec<AckLog> = (0..cells).map(|_| AckLog::default()).collect();
    churn(&node, clock, &logs, 0..3).await;
    let metrics = node.metrics();
    let mut waited = 0;
    while metrics.parked_tail_bytes.load(Ordering::Relaxed) > 0 && waited < 100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += 1;
    }
    (node, logs)
}

/// How many Cells of the node whose data directory is `data_dir` have a
/// `-wal` file; panics on any `-shm` (the WAL index lives in memory).
fn sidecars(data_dir: &std::path::Path) -> usize {
    let names: Vec<String> = std::fs::read_dir(data_dir.join("cells"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let count = |suffix: &str| names.iter().filter(|n| n.ends_with(suffix)).count();
    assert_eq!(count(".db-shm"), 0, "{names:?}");
    count(".db-wal")
}

fn churning(mut config: NodeConfig) -> NodeConfig {
    config.limits.cells_open_max = 2;
    config.gc.enabled = false;
    lazy(config)
}

/// A passivated Cell parks its acknowledged records with the node instead
/// of checkpointing them: it closes and reopens without a bucket read or a
/// root write, the node's sweep checkpoints them once they were parked
/// `checkpoint_idle_ms`, and a drain puts every parked record into its root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passivated_cell_parks_its_records_and_reopens_without_the_bucket() {
    const CELLS: usize = 6;
    let dir = tempfile::tempdir().unwrap();
    for (backend, inner, prefix) in backends("log-parked", dir.path()).await {
        let store = Arc::new(FaultStore::new(inner));
        let dir = dir.path().join(backend);
        let clock = manual_clock();
        let node = start(
            churning(node_config("a", &dir, &prefix)),
            store.clone(),
            clock.clone(),
        )
        .await;
        let logs: Vec<AckLog> = (0..CELLS).map(|_| AckLog::default()).collect();
        churn(&node, &clock, &logs, 0..4).await;
        let metrics = node.metrics();
        let passivations = metrics.passivations_total.load(Ordering::Relaxed);
        assert!(
            passivations >= 3 * CELLS as u64,
            "{backend}: {passivations} passivations"
        );
        assert_eq!(
            metrics.checkpoints_total.load(Ordering::Relaxed),
            0,
            "{backend}: no passivation checkpointed"
        );
        assert!(metrics.parked_tail_bytes.load(Ordering::Relaxed) > 0);
        // Parked Cells closed keeping their `-wal` for the reopen.
        let open = metrics.cells_open.load(Ordering::Relaxed) as usize;
        assert!(
            sidecars(&dir.join("a")) > open,
            "{backend}: {} -wal files with {open} Cells open",
            sidecars(&dir.join("a"))
        );
        // Every root is where the Cell's creation left it (TXID 0): the
        // records are in the log and the parked tails only.
        for cell in 0..CELLS {
            let root = root_of(store.as_ref(), &prefix, format!("park-{cell}").as_bytes()).await;
            assert_eq!(
                root.txid.0, 0,
                "{backend}: park-{cell}'s root was not written"
            );
        }
        // Reopening parked Cells (and parking others) reads nothing.
        store.reset_counts();
        for cell in 0..CELLS {
            let tags = journal(&node, format!("park-{cell}").as_bytes()).await;
            assert_eq!(tags, vec!["t0", "t1", "t2", "t3"], "{backend}");
        }
        let counts = store.counts();
        assert_eq!(
            (counts.reads(), counts.writes()),
            (0, 0),
            "{backend}: parked Cells reopened from memory and the local file"
        );
        assert_eq!(
            metrics.activations_recovered_total.load(Ordering::Relaxed)
                + metrics.log_replayed_records_total.load(Ordering::Relaxed),
            0,
            "{backend}"
        );
        for (cell, log) in logs.iter().enumerate() {
            log.verify(&node, format!("park-{cell}").as_bytes()).await;
        }
        // A drain checkpoints every parked tail, then releases the root.
        node.drain().await.unwrap();
        assert_eq!(metrics.parked_tail_bytes.load(Ordering::Relaxed), 0);
        for cell in 0..CELLS {
            let root = root_of(store.as_ref(), &prefix, format!("park-{cell}").as_bytes()).await;
            assert!(root.owner.is_none() && root.log.is_none(), "{backend}");
        }
        let clock = manual_clock();
        let reader = start(
            cell_node_config("r", &dir, &prefix),
            store.clone(),
            clock.clone(),
        )
        .await;
        for (cell, log) in logs.iter().enumerate() {
            log.verify(&reader, format!("park-{cell}").as_bytes()).await;
        }

        // The sweep: tails idle past `checkpoint_idle_ms` reach their roots
        // with no request and no drain.
        let prefix = format!("{prefix}-sweep");
        let clock = manual_clock();
        let mut config = churning(node_config("s", &dir, &prefix));
        config.log.checkpoint_idle_ms = 50;
        let (node, logs) = churn_until_swept(config, store.clone(), &clock, CELLS).await;
        let metrics = node.metrics();
        assert_eq!(
            metrics.parked_tail_bytes.load(Ordering::Relaxed),
            0,
            "{backend}: the sweep checkpointed every parked tail"
        );
        // (An open Cell idle that long checkpoints itself, so not every
        // tail is the sweep's.)
        let swept = metrics.parked_checkpoints_total.load(Ordering::Relaxed);
        assert!(swept >= 1, "{backend}: {swept} swept");
        let mut at_acked = 0;
        for cell in 0..CELLS {
            let key = format!("park-{cell}");
            let root = root_of(store.as_ref(), &prefix, key.as_bytes()).await;
            let described = node.describe_cell(KIND, key.as_bytes()).await.unwrap();
            if !described.open {
                assert_eq!(root.txid, described.txid, "{backend}: {key} swept");
                at_acked += 1;
            }
        }
        assert!(at_acked >= CELLS - 2, "{backend}");
        // A checkpointed parked Cell is as idle as a tidy close leaves it:
        // its database and lock file only.
        let open = metrics.cells_open.load(Ordering::Relaxed) as usize;
        assert_eq!(sidecars(&dir.join("s")), open, "{backend}");
        for (cell, log) in logs.iter().enumerate() {
            log.verify(&node, format!("park-{cell}").as_bytes()).await;
        }

        // The byte budget: with no idle deadline in reach, parked records
        // over `parked_bytes_max` are checkpointed anyway.
        let prefix = format!("{prefix}-bytes");
        let clock = manual_clock();
        let mut config = churning(node_config("b", &dir, &prefix));
        config.log.parked_bytes_max = 1;
        let (node, logs) = churn_until_swept(config, store.clone(), &clock, CELLS).await;
        let metrics = node.metrics();
        assert_eq!(
            metrics.parked_tail_bytes.load(Ordering::Relaxed),
            0,
            "{backend}: parked records over the byte budget were checkpointed"
        );
        assert!(
            metrics.parked_checkpoints_total.load(Ordering::Relaxed) >= 1,
            "{backend}"
        );
        assert_eq!(
            metrics.checkpoints_total.load(Ordering::Relaxed),
            metrics.parked_checkpoints_total.load(Ordering::Relaxed),
            "{backend}: only the node's sweep checkpointed (no idle deadline came)"
        );
        for (cell, log) in logs.iter().enumerate() {
            log.verify(&node, format!("park-{cell}").as_bytes()).await;
        }
    }
}

/// A node that dies with parked tails loses nothing: the successor seals
/// its lane and replays them from the roots' pointers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_records_survive_their_node_s_crash() {
    const CELLS: usize = 6;
    let dir = tempfile::tempdir().unwrap();
    for (backend, store, prefix) in backends("log-parked-crash", dir.path()).await {
        let dir = dir.path().join(backend);
        let clock_a = manual_clock();
        let a = start(
            churning(node_config("a", &dir, &prefix)),
            store.clone(),
            clock_a.clone(),
        )
        .await;
        let logs: Vec<AckLog> = (0..CELLS).map(|_| AckLog::default()).collect();
        churn(&a, &clock_a, &logs, 0..3).await;
        assert!(a.metrics().parked_tail_bytes.load(Ordering::Relaxed) > 0);
        a.halt().await;
        let clock_b = manual_clock();
        clock_b.advance(lease_expiry());
        let b = start(
            node_config("b", &dir, &prefix),
            store.clone(),
            clock_b.clone(),
        )
        .await;
        for (cell, log) in logs.iter().enumerate() {
            log.verify(&b, format!("park-{cell}").as_bytes()).await;
        }
        assert!(
            b.metrics()
                .log_replayed_records_total
                .load(Ordering::Relaxed)
                >= CELLS as u64
        );
    }
}

/// Many requests to open Cells while activations passivate others: the
/// least recently used idle Cell is picked from a list sorted by a key
/// requests keep moving. It was read during the sort, which then panicked
/// ("does not correctly implement a total order") inside the activation
/// task, and its Cell answered "the activation was abandoned" from then on
/// (found by the bench's exactness check at 10,000 Cells; with the key
/// read during the sort this test failed in about half of its runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passivating_under_concurrent_requests_loses_nothing() {
    const CELLS: u64 = 400;
    const HOT: u64 = 48;
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> =
        Arc::new(cellfleet_store::LocalStore::open(dir.path().join("store")).unwrap());
    let clock = manual_clock();
    let mut config = node_config("a", dir.path(), "lru");
    config.limits.cells_open_max = 64;
    config.limits.activations_concurrent_max = 64;
    let node = start(config, store.clone(), clock.clone()).await;
    let logs: Arc<Vec<AckLog>> = Arc::new((0..CELLS).map(|_| AckLog::default()).collect());
    let tasks: Vec<_> = (0..56u64)
        .map(|task| {
            let (node, clock, logs) = (node.clone(), clock.clone(), logs.clone());
            tokio::spawn(async move {
                let mut refused = 0;
                for i in 0..60u64 {
                    // Every other command to a Cell that stays open, the
                    // rest spread over Cells that must be activated.
                    let cell = if i % 2 == 0 {
                        task % HOT
                    } else {
                        (task * 7_919 + i * 104_729) % CELLS
                    };
                    let n = task * 1_000 + i;
                    let key = format!("lru-{cell}");
                    match node
                        .execute(KIND, key.as_bytes(), append(clock.as_ref(), n))
                        .await
                    {
                        Ok(executed) => logs[cell as usize].ack(n, executed.outcome),
                        Err(Error::ResourceExhausted { .. }) => refused += 1,
                        Err(other) => panic!("{key}: {other:?}"),
                    }
                }
                refused
            })
        })
        .collect();
    let mut refused = 0;
    for task in tasks {
        refused += task.await.unwrap();
    }
    let acked: usize = logs.iter().map(AckLog::len).sum();
    assert!(
        acked >= 56 * 60 * 9 / 10,
        "{acked} acknowledged, {refused} refused"
    );
    for (cell, log) in logs.iter().enumerate() {
        log.verify(&node, format!("lru-{cell}").as_bytes()).await;
    }
}

/// Executes `command` on `key`, retrying after the node's hint while it
/// refuses for want of an open-Cell slot (its one open Cell may still be
/// settling), as a client does; panics on any other error.
async fn execute_as_a_client(
    node: &cellfleet_runtime::NodeHandle,
    key: &[u8],
    command: cellfleet_cell::Command,
) -> cellfleet_runtime::Executed {
    cellfleet_runtime::testkit::as_a_client(|| node.execute(KIND, key, command.clone()))
        .await
        .expect("acknowledged")
}

/// The local file is a cache the bucket proves, so the engine never
/// fsyncs it: a file that lost its last writes (as after a machine crash)
/// or holds a torn page fails the position check at the next activation
/// and is rebuilt from the chain and the log, losing nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_file_that_lost_writes_is_rebuilt_from_the_bucket() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, store, prefix) in backends("log-lost-writes", dir.path()).await {
        let dir = dir.path().join(backend);
        let clock = manual_clock();
        let mut config = node_config("a", &dir, &prefix);
        config.limits.cells_open_max = 1;
        let node = start(config, store.clone(), clock.clone()).await;
        let cell = cellfleet_authority::CellId::for_kind_key(KIND, KEY);
        let db = dir.join("a").join("cells").join(format!("{cell}.db"));
        let log = AckLog::default();
        let mut n = 0;
        let passivate = |n: u64| {
            let (node, clock) = (&node, &clock);
            async move {
                execute_as_a_client(node, b"other", append(clock.as_ref(), 1000 + n)).await;
            }
        };
        for damage in ["older copy", "torn page"] {
            for _ in 0..3 {
                let executed = execute_as_a_client(&node, KEY, append(clock.as_ref(), n)).await;
                log.ack(n, executed.outcome);
                n += 1;
            }
            passivate(n).await;
            let older = std::fs::read(&db).unwrap();
            for _ in 0..3 {
                let executed = execute_as_a_client(&node, KEY, append(clock.as_ref(), n)).await;
                log.ack(n, executed.outcome);
                n += 1;
            }
            passivate(n).await;
            let recovered = node
                .metrics()
                .activations_recovered_total
                .load(Ordering::Relaxed);
            match damage {
                "older copy" => std::fs::write(&db, &older).unwrap(),
                _ => {
                    let mut bytes = std::fs::read(&db).unwrap();
                    let at = bytes.len() - 100;
                    bytes[at..].fill(0x5a);
                    std::fs::write(&db, &bytes).unwrap();
                }
            }
            log.verify(&node, KEY).await;
            assert_eq!(
                node.metrics()
                    .activations_recovered_total
                    .load(Ordering::Relaxed),
                recovered + 1,
                "{backend}: the {damage} was caught and rebuilt"
            );
        }
    }
}

/// A Cell opens its reader of the published state on its first read. A
/// query that reaches a Cell never read while one of its groups publishes
/// waits for that group (and sees it); from then on the Cell keeps a
/// reader, so a query during the next publication answers at once from
/// the published state, never from the pending group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_on_a_cell_never_read_waits_for_its_publishing_group() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, inner, prefix) in backends("log-view", dir.path()).await {
        let config = node_config("n1", &dir.path().join(backend), &prefix);
        let (store, clock, node, log) = start_with_first_command(config, inner, KEY).await;
        let slow = Duration::from_millis(400);
        let publishing = |n: u64| {
            store.inject(
                Fault::delay(Some(Op::PutIfNoneMatch), slow)
                    .key_prefix(logs_prefix(&prefix))
                    .times(1),
            );
            let (node, clock) = (node.clone(), clock.clone());
            tokio::spawn(async move { node.execute(KIND, KEY, append(clock.as_ref(), n)).await })
        };

        let second = publishing(1);
        tokio::time::sleep(slow / 4).await;
        // Nothing reads the published ledger yet: not known, never absent.
        let resolved = node
            .resolve(KIND, KEY, cellfleet_cell::CommandId(command_id(0)), None)
            .await
            .unwrap();
        assert!(
            matches!(
                resolved,
                cellfleet_runtime::Resolution::Unknown
                    | cellfleet_runtime::Resolution::Committed { .. }
            ),
            "{backend}: {resolved:?}"
        );
        let queried = node
            .query(KIND, KEY, "all", serde_json::json!({}), None)
            .await
            .unwrap();
        let executed = second.await.unwrap().unwrap();
        log.ack(1, executed.outcome);
        assert_eq!(
            queried.receipt.txid, executed.receipt.txid,
            "{backend}: the query waited for the publishing group"
        );

        // The Cell keeps a reader now: the next query during a publication
        // answers from the published state, without the pending group.
        let third = publishing(2);
        tokio::time::sleep(slow / 4).await;
        let queried = node
            .query(KIND, KEY, "all", serde_json::json!({}), None)
            .await
            .unwrap();
        assert_eq!(
            queried.receipt.txid, executed.receipt.txid,
            "{backend}: answered from the published state"
        );
        let executed = third.await.unwrap().unwrap();
        assert!(executed.receipt.txid > queried.receipt.txid, "{backend}");
        log.ack(2, executed.outcome);
        match node
            .resolve(KIND, KEY, cellfleet_cell::CommandId(command_id(0)), None)
            .await
            .unwrap()
        {
            cellfleet_runtime::Resolution::Committed { .. } => {}
            other => panic!("{backend}: {other:?}"),
        }
        log.verify(&node, KEY).await;
        assert_eq!(
            journal(&node, KEY).await,
            vec!["t0", "t1", "t2"],
            "{backend}"
        );
    }
}

/// A store that holds every root CAS (a checkpoint's last write) for a
/// while and records how many were in flight at once.
#[derive(Debug)]
struct RootCasGauge {
    inner: Arc<dyn ObjectStore>,
    layout: Layout,
    hold: Duration,
    in_flight: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl ObjectStore for RootCasGauge {
    async fn get(&self, key: &str) -> cellfleet_store::Result<cellfleet_store::Object> {
        self.inner.get(key).await
    }

    async fn get_range(
        &self,
        key: &str,
        range: std::ops::Range<u64>,
    ) -> cellfleet_store::Result<cellfleet_store::Object> {
        self.inner.get_range(key, range).await
    }

    async fn put(
        &self,
        key: &str,
        body: bytes::Bytes,
        condition: cellfleet_store::PutCondition,
    ) -> cellfleet_store::Result<cellfleet_store::ETag> {
        let cas = matches!(condition, cellfleet_store::PutCondition::IfMatch(_))
            && self.layout.parse_root_key(key).is_some();
        if !cas {
            return self.inner.put(key, body, condition).await;
        }
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(self.hold).await;
        let result = self.inner.put(key, body, condition).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        result
    }

    async fn delete(&self, key: &str) -> cellfleet_store::Result<()> {
        self.inner.delete(key).await
    }

    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        max_keys: usize,
    ) -> cellfleet_store::Result<cellfleet_store::ListPage> {
        self.inner.list(prefix, start_after, max_keys).await
    }

    fn describe(&self) -> String {
        format!("root-CAS gauge over {}", self.inner.describe())
    }
}

/// Cells written together fall due for their checkpoints together; the
/// node keeps at most `checkpoints_inflight_max` in flight, so a burst of
/// them never queues the store's other requests (lease renewals) behind
/// it. With a large bound the same burst does overlap (the check can fail),
/// and every acknowledged command is in its root either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_in_flight_stay_within_the_node_s_bound() {
    const CELLS: u64 = 24;
    let dir = tempfile::tempdir().unwrap();
    let mut most_seen = Vec::new();
    for bound in [2usize, 64] {
        let prefix = format!("ckpt-bound-{bound}");
        let gauge = Arc::new(RootCasGauge {
            inner: Arc::new(
                cellfleet_store::LocalStore::open(dir.path().join(format!("store-{bound}")))
                    .unwrap(),
            ),
            layout: Layout::new(&prefix).unwrap(),
            hold: Duration::from_millis(40),
            in_flight: Default::default(),
            most: Default::default(),
        });
        let clock = manual_clock();
        let mut config = node_config("a", &dir.path().join(format!("node-{bound}")), &prefix);
        // Every record is a checkpoint's worth.
        config.log.checkpoint_records = 1;
        config.log.checkpoints_inflight_max = bound;
        let a = start(config, gauge.clone(), clock.clone()).await;
        let tasks: Vec<_> = (0..CELLS)
            .map(|n| {
                let (a, clock) = (a.clone(), clock.clone());
                tokio::spawn(async move {
                    a.execute(KIND, format!("c{n}").as_bytes(), append(clock.as_ref(), n))
                        .await
                        .unwrap()
                })
            })
            .collect();
        let mut txids = Vec::new();
        for task in tasks {
            txids.push(task.await.unwrap().receipt.txid);
        }
        // Every acknowledged record reaches its root by a checkpoint.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        for (n, txid) in txids.into_iter().enumerate() {
            let key = format!("c{n}");
            loop {
                let root = root_of(gauge.as_ref(), &prefix, key.as_bytes()).await;
                if root.txid >= txid {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "bound {bound}: {key}'s root is at TXID {} after 30 s, its command at {txid}",
                    root.txid
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert_eq!(journal(&a, key.as_bytes()).await, vec![format!("t{n}")]);
        }
        most_seen.push(gauge.most.load(Ordering::SeqCst));
    }
    assert!(
        most_seen[0] <= 2,
        "{} checkpoints in flight at once with a bound of 2",
        most_seen[0]
    );
    assert!(
        most_seen[1] > 2,
        "the unbounded burst overlapped only {} checkpoints (the check could not fail)",
        most_seen[1]
    );
}

/// The journal with 1 KiB pages, as a kind that declares its own page size.
#[derive(Debug)]
struct SmallPages(cellfleet_cell::Typed<cellfleet_runtime::testkit::Journal>);

const SMALL: &str = "small-journal";

impl cellfleet_cell::Kind for SmallPages {
    fn name(&self) -> &str {
        SMALL
    }
    fn migrations(&self) -> Vec<String> {
        self.0.migrations()
    }
    fn limits(&self) -> cellfleet_cell::Limits {
        self.0.limits()
    }
    fn page_size(&self) -> Option<u32> {
        Some(1024)
    }
    fn execute(
        &self,
        conn: &rusqlite::Connection,
        name: &str,
        args: &serde_json::Value,
    ) -> Result<serde_json::Value, cellfleet_cell::KindError> {
        self.0.execute(conn, name, args)
    }
    fn query(
        &self,
        conn: &rusqlite::Connection,
        name: &str,
        args: &serde_json::Value,
    ) -> Result<serde_json::Value, cellfleet_cell::KindError> {
        self.0.query(conn, name, args)
    }
}

/// The page size in a SQLite file's header.
fn file_page_size(path: &std::path::Path) -> u32 {
    let bytes = std::fs::read(path).unwrap();
    match u16::from_be_bytes([bytes[16], bytes[17]]) {
        1 => 65_536,
        n => u32::from(n),
    }
}

/// A kind may create its Cells with other SQLite pages than the node's:
/// the root records the kind's page size and the file has it; another
/// kind's Cells keep the node's; and a successor that rebuilds the Cell
/// from the dead owner's lane alone (no checkpoint yet) keeps the Cell's
/// (the lane's first record is a snapshot in the Cell's page size).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kind_creates_its_cells_with_its_own_page_size() {
    use cellfleet_runtime::testkit::{as_a_client, Journal};
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> =
        Arc::new(cellfleet_store::LocalStore::open(dir.path().join("bucket")).unwrap());
    let prefix = "small-pages";
    let kinds = || {
        Arc::new(
            cellfleet_runtime::Kinds::builtin()
                .with(Arc::new(cellfleet_cell::Typed(Journal)))
                .with(Arc::new(SmallPages(cellfleet_cell::Typed(Journal)))),
        )
    };
    let root = |kind: &'static str| {
        let store = store.clone();
        async move {
            let cell = CellId::for_kind_key(kind, KEY);
            let object = store
                .get(&Layout::new(prefix).unwrap().root_key(&cell))
                .await
                .unwrap();
            RootRecord::decode(&object.body).unwrap()
        }
    };
    let db = |node: &str, kind: &str| {
        let cell = CellId::for_kind_key(kind, KEY);
        dir.path()
            .join(node)
            .join("cells")
            .join(format!("{cell}.db"))
    };
    let clock = manual_clock();
    let a = cellfleet_runtime::Node::start(
        lazy(node_config("a", dir.path(), prefix)),
        store.clone(),
        clock.clone(),
        kinds(),
    )
    .await
    .unwrap();
    for n in 0..3 {
        a.execute(SMALL, KEY, append(clock.as_ref(), n))
            .await
            .unwrap();
    }
    a.execute(KIND, KEY, append(clock.as_ref(), 100))
        .await
        .unwrap();
    assert_eq!(root(SMALL).await.page_size, 1024);
    assert_eq!(file_page_size(&db("a", SMALL)), 1024);
    assert_eq!(root(KIND).await.page_size, 4096);
    assert_eq!(file_page_size(&db("a", KIND)), 4096);
    assert!(
        root(SMALL).await.chain.is_empty(),
        "no checkpoint: the successor rebuilds from the lane alone"
    );
    // a stops renewing (as if paused); b takes the Cell once its lease is gone.
    a.lease().pause_renewals(true);
    let clock_b = manual_clock();
    clock_b.advance(lease_expiry());
    let clock = clock_b;
    let b = cellfleet_runtime::Node::start(
        lazy(node_config("b", dir.path(), prefix)),
        store.clone(),
        clock.clone(),
        kinds(),
    )
    .await
    .unwrap();
    let tags = as_a_client(|| b.query(SMALL, KEY, "all", serde_json::json!({}), None))
        .await
        .unwrap();
    assert_eq!(tags.value, serde_json::json!(["t0", "t1", "t2"]));
    b.execute(SMALL, KEY, append(clock.as_ref(), 3))
        .await
        .unwrap();
    assert_eq!(file_page_size(&db("b", SMALL)), 1024);
    assert_eq!(root(SMALL).await.page_size, 1024);
}
