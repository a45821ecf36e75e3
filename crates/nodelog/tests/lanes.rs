//! Lanes against real stores (the local-directory store and SeaweedFS): pipelined segments acknowledged on the contiguous prefix, timed-out PUTs settled by resending the same bytes, seals that fence a slot in flight and everything after it, racing sealers, and a zombie writer after garbage collection.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cellfleet_authority::{CellId, Epoch, Holder, LaneId, Layout, NodeId, SessionId, Txid};
use cellfleet_nodelog::lane::GroupFate;
use cellfleet_nodelog::segment::{encode_seal, encode_segment, Part};
use cellfleet_nodelog::store::{
    collect, list_lanes, list_sessions, read_floor, read_lane, read_records, read_written_run,
    seal_lane, LaneWriter, WriterConfig,
};
use cellfleet_nodelog::Seal;
use cellfleet_store::{Fault, FaultStore, ObjectStore, Op, PutCondition};

const BOUND: Duration = Duration::from_secs(20);

async fn backends(
    name: &str,
    dir: &std::path::Path,
) -> Vec<(&'static str, Arc<dyn ObjectStore>, String)> {
    cellfleet_store::testkit::local_and_s3(name, dir).await
}

fn lane(node: &str) -> LaneId {
    LaneId {
        node: NodeId::new(node).unwrap(),
        session: SessionId::random(),
        lane: 0,
    }
}

fn successor() -> Holder {
    Holder {
        node: NodeId::new("successor").unwrap(),
        session: SessionId::random(),
    }
}

fn cell(name: &str) -> CellId {
    CellId::for_kind_key("kv", name.as_bytes())
}

/// A segment for slot `seq` with one record per Cell in `cells`: TXID
/// `seq + 1`, bytes naming the Cell and the slot.
fn segment(writer: &LaneWriter, seq: u64, cells: &[&str]) -> Vec<u8> {
    let bytes: Vec<Vec<u8>> = cells
        .iter()
        .map(|c| format!("{c}@{seq}").into_bytes())
        .collect();
    let parts: Vec<Part<'_>> = cells
        .iter()
        .zip(&bytes)
        .map(|(c, bytes)| Part {
            cell_id: cell(c),
            epoch: Epoch::new(1).unwrap(),
            min_txid: Txid(seq + 1),
            max_txid: Txid(seq + 1),
            file_checksum: seq,
            post_apply_checksum: seq,
            command_ids: vec![[seq as u8; 16]],
            bytes,
        })
        .collect();
    encode_segment(&writer.header(seq, 1_700_000_000_000), &parts).unwrap()
}

fn writer(store: Arc<dyn ObjectStore>, prefix: &str, lane: &LaneId) -> Arc<LaneWriter> {
    LaneWriter::new(
        store,
        Layout::new(prefix).unwrap(),
        lane.clone(),
        0,
        WriterConfig::default(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_segments_are_acknowledged_and_read_back_per_cell() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, store, prefix) in backends("lane-basic", dir.path()).await {
        let layout = Layout::new(&prefix).unwrap();
        let lane = lane("n1");
        let writer = writer(store.clone(), &prefix, &lane);
        let seqs: Vec<u64> = (0..5).map(|_| writer.reserve().unwrap()).collect();
        // Written out of order: several in flight at once.
        for &seq in seqs.iter().rev() {
            writer.write(seq, segment(&writer, seq, &["a", "b"]));
        }
        for &seq in &seqs {
            assert_eq!(
                writer.fate(seq, BOUND).await,
                Some(GroupFate::Acknowledged),
                "{backend}: slot {seq}"
            );
        }
        let sealed = seal_lane(store.as_ref(), &layout, &lane, &successor(), 1)
            .await
            .unwrap();
        assert_eq!(sealed, 5, "{backend}: sealed after the last segment");
        let read = read_lane(store.as_ref(), &layout, &lane).await.unwrap();
        assert_eq!(
            (read.counted.clone(), read.end),
            (seqs.clone(), 5),
            "{backend}"
        );
        let records = read_records(store.as_ref(), &layout, &lane, &read.counted, &cell("b"))
            .await
            .unwrap();
        let found: Vec<(u64, Vec<u8>)> = records
            .iter()
            .map(|(seq, _, bytes)| (*seq, bytes.to_vec()))
            .collect();
        let expected: Vec<(u64, Vec<u8>)> = seqs
            .iter()
            .map(|&s| (s, format!("b@{s}").into_bytes()))
            .collect();
        assert_eq!(found, expected, "{backend}");
        // The lane writer stops once it knows the lane ended.
        let zombie = writer.reserve().unwrap();
        writer.write(zombie, segment(&writer, zombie, &["a"]));
        assert_eq!(
            writer.fate(zombie, BOUND).await,
            Some(GroupFate::NotCommitted),
            "{backend}"
        );
        assert_eq!(
            writer.reserve(),
            None,
            "{backend}: sealed lanes take no more"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_that_times_out_and_lands_later_is_settled_by_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, inner, prefix) in backends("lane-late", dir.path()).await {
        let store = Arc::new(FaultStore::new(inner));
        let layout = Layout::new(&prefix).unwrap();
        let lane = lane("n1");
        let writer = writer(store.clone(), &prefix, &lane);
        let late = Duration::from_millis(300);
        store.inject(
            Fault::land_late(Op::PutIfNoneMatch, late).key_prefix(layout.segment_key(&lane, 0)),
        );
        store
            .inject(Fault::lose_reply(Op::PutIfNoneMatch).key_prefix(layout.segment_key(&lane, 1)));
        for _ in 0..2 {
            let seq = writer.reserve().unwrap();
            writer.write(seq, segment(&writer, seq, &["a"]));
        }
        for seq in 0..2 {
            assert_eq!(
                writer.fate(seq, BOUND).await,
                Some(GroupFate::Acknowledged),
                "{backend}: slot {seq}"
            );
        }
        tokio::time::sleep(late * 3).await;
        let sealed = seal_lane(store.as_ref(), &layout, &lane, &successor(), 1)
            .await
            .unwrap();
        assert_eq!(sealed, 2, "{backend}");
        let read = read_lane(store.as_ref(), &layout, &lane).await.unwrap();
        let records = read_records(store.as_ref(), &layout, &lane, &read.counted, &cell("a"))
            .await
            .unwrap();
        assert_eq!(records.len(), 2, "{backend}: each slot once");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seal_fences_the_slot_in_flight_and_every_later_one() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, inner, prefix) in backends("lane-fence", dir.path()).await {
        let store = Arc::new(FaultStore::new(inner));
        let layout = Layout::new(&prefix).unwrap();
        let lane = lane("n1");
        let writer = writer(store.clone(), &prefix, &lane);
        // Slot 1's PUT is slow: slots 0 and 2 land first.
        store.inject(
            Fault::delay(Some(Op::PutIfNoneMatch), Duration::from_millis(800))
                .key_prefix(layout.segment_key(&lane, 1)),
        );
        for _ in 0..3 {
            let seq = writer.reserve().unwrap();
            writer.write(seq, segment(&writer, seq, &["a"]));
        }
        assert_eq!(
            writer.fate(0, BOUND).await,
            Some(GroupFate::Acknowledged),
            "{backend}"
        );
        // Slot 2 is written but not acknowledged: slot 1 is still open.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            writer.fate(2, Duration::from_millis(1)).await,
            None,
            "{backend}"
        );
        // The session is presumed dead: a successor seals its first gap.
        let sealed = seal_lane(store.as_ref(), &layout, &lane, &successor(), 1)
            .await
            .unwrap();
        assert_eq!(
            sealed, 1,
            "{backend}: the seal takes the slot still in flight"
        );
        // The slow PUT then finds the seal: 1 and 2 are not committed,
        // although 2's own PUT succeeded.
        assert_eq!(
            writer.fate(1, BOUND).await,
            Some(GroupFate::NotCommitted),
            "{backend}"
        );
        assert_eq!(
            writer.fate(2, BOUND).await,
            Some(GroupFate::NotCommitted),
            "{backend}"
        );
        let read = read_lane(store.as_ref(), &layout, &lane).await.unwrap();
        assert_eq!(
            (read.counted, read.end),
            (vec![0], 1),
            "{backend}: readers count what was acknowledged"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_sealers_agree_and_a_zombie_after_gc_still_hits_the_seal() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, store, prefix) in backends("lane-race", dir.path()).await {
        let layout = Layout::new(&prefix).unwrap();
        let lane = lane("n1");
        let writer = writer(store.clone(), &prefix, &lane);
        for _ in 0..3 {
            let seq = writer.reserve().unwrap();
            writer.write(seq, segment(&writer, seq, &["a"]));
        }
        assert_eq!(
            writer.fate(2, BOUND).await,
            Some(GroupFate::Acknowledged),
            "{backend}"
        );
        let sealers: Vec<_> = (0..4)
            .map(|_| {
                let (store, layout, lane) = (store.clone(), layout.clone(), lane.clone());
                tokio::spawn(async move {
                    seal_lane(store.as_ref(), &layout, &lane, &successor(), 1).await
                })
            })
            .collect();
        for sealer in sealers {
            assert_eq!(
                sealer.await.unwrap().unwrap(),
                3,
                "{backend}: every sealer finds one seal"
            );
        }
        let keys = cellfleet_store::list_all(store.as_ref(), &layout.lane_prefix(&lane), 100)
            .await
            .unwrap();
        assert_eq!(keys.len(), 4, "{backend}: three segments and one seal");
        // Collection removes the written prefix below the highest segment
        // and records the lane's new floor (2) for sealers and readers;
        // seals stay. A zombie of the session resumes at its next slot.
        assert_eq!(
            collect(store.as_ref(), &layout, &lane, 0, 2).await.unwrap(),
            2
        );
        assert_eq!(read_floor(store.as_ref(), &layout, &lane).await.unwrap(), 2);
        let read = read_lane(store.as_ref(), &layout, &lane).await.unwrap();
        assert_eq!(
            (read.floor, read.counted, read.end),
            (2, vec![2], 3),
            "{backend}"
        );
        let zombie = writer.reserve().unwrap();
        assert_eq!(zombie, 3);
        writer.write(zombie, segment(&writer, zombie, &["a"]));
        assert_eq!(
            writer.fate(zombie, BOUND).await,
            Some(GroupFate::NotCommitted),
            "{backend}"
        );
        let again = seal_lane(store.as_ref(), &layout, &lane, &successor(), 1)
            .await
            .unwrap();
        assert_eq!(
            again, 3,
            "{backend}: sealing stays idempotent after collection"
        );
    }
}

/// Found by the model check (`tests/model.rs`): a sealer that read the
/// floor before a collection seals the slot the collection emptied. A
/// writer still resending that slot (its first reply was lost) then finds
/// a seal where its own segment was written, counted and collected: that
/// is written, not "not committed", since only written slots are ever
/// collected (the slot lies below the floor).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_seal_in_a_collected_slot_does_not_refuse_what_was_written() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, inner, prefix) in backends("lane-stale-seal", dir.path()).await {
        let store = Arc::new(FaultStore::new(inner));
        let layout = Layout::new(&prefix).unwrap();
        let lane = lane("n1");
        let writer = LaneWriter::new(
            store.clone(),
            layout.clone(),
            lane.clone(),
            0,
            WriterConfig {
                backoff_first: Duration::from_secs(2),
                ..WriterConfig::default()
            },
        );
        store.inject(
            Fault::lose_reply(Op::PutIfNoneMatch)
                .key_prefix(layout.segment_key(&lane, 0))
                .times(1),
        );
        let seq = writer.reserve().unwrap();
        writer.write(seq, segment(&writer, seq, &["a"]));
        // The first PUT applied; its reply was lost, so the writer waits
        // to resend the same bytes. Meanwhile a successor seals after it,
        // reads it, and the dead lane is collected.
        let deadline = std::time::Instant::now() + BOUND;
        while read_written_run(store.as_ref(), &layout, &lane)
            .await
            .unwrap()
            .is_empty()
        {
            assert!(
                std::time::Instant::now() < deadline,
                "{backend}: never landed"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let sealed = seal_lane(store.as_ref(), &layout, &lane, &successor(), 1)
            .await
            .unwrap();
        assert_eq!(sealed, 1, "{backend}");
        let read = read_lane(store.as_ref(), &layout, &lane).await.unwrap();
        assert_eq!(read.counted, vec![0], "{backend}: the record counts");
        assert_eq!(
            collect(store.as_ref(), &layout, &lane, 0, 1).await.unwrap(),
            1
        );
        // A second sealer that listed and read the floor before all that
        // seals the slot it saw empty.
        let stale = Bytes::from(encode_seal(&Seal {
            header: writer.header(0, 1),
            sealed_by: successor(),
        }));
        store
            .put(
                &layout.segment_key(&lane, 0),
                stale,
                PutCondition::IfNoneMatch,
            )
            .await
            .unwrap();
        assert_eq!(
            writer.fate(0, BOUND).await,
            Some(GroupFate::Acknowledged),
            "{backend}: the slot was written and counted"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collected_prefix_is_no_gap_for_a_sealer_and_the_floor_only_rises() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, store, prefix) in backends("lane-gc", dir.path()).await {
        let layout = Layout::new(&prefix).unwrap();
        let lane = lane("n1");
        let writer = writer(store.clone(), &prefix, &lane);
        for _ in 0..6 {
            let seq = writer.reserve().unwrap();
            writer.write(seq, segment(&writer, seq, &["a", "b"]));
        }
        assert_eq!(writer.fate(5, BOUND).await, Some(GroupFate::Acknowledged));
        assert_eq!(read_floor(store.as_ref(), &layout, &lane).await.unwrap(), 0);
        assert_eq!(
            collect(store.as_ref(), &layout, &lane, 0, 4).await.unwrap(),
            4,
            "{backend}"
        );
        // A lower floor never replaces a higher one.
        assert_eq!(
            cellfleet_nodelog::store::raise_floor(store.as_ref(), &layout, &lane, 1)
                .await
                .unwrap(),
            4,
            "{backend}"
        );
        assert_eq!(
            read_written_run(store.as_ref(), &layout, &lane)
                .await
                .unwrap(),
            vec![4, 5],
            "{backend}: the live run starts at the floor"
        );
        // A successor seals after the highest slot, not in the collected
        // prefix, and reads the records left.
        let sealed = seal_lane(store.as_ref(), &layout, &lane, &successor(), 1)
            .await
            .unwrap();
        assert_eq!(sealed, 6, "{backend}");
        let read = read_lane(store.as_ref(), &layout, &lane).await.unwrap();
        assert_eq!(read.counted, vec![4, 5], "{backend}");
        let records = read_records(store.as_ref(), &layout, &lane, &read.counted, &cell("b"))
            .await
            .unwrap();
        let bodies: Vec<&[u8]> = records.iter().map(|(_, _, b)| b.as_ref()).collect();
        assert_eq!(bodies, vec![&b"b@4"[..], &b"b@5"[..]], "{backend}");
        // The index of the sealed lane answers the same, per Cell and from
        // a pointer on, and sealing again through it is idempotent.
        let index =
            cellfleet_nodelog::store::index_sealed_lane(&store, &layout, &lane, &successor(), 1)
                .await
                .unwrap();
        assert_eq!((index.floor, index.end), (4, 6), "{backend}");
        let mut cells: Vec<(String, u64)> = index
            .cells()
            .map(|(c, max)| (c.to_string(), max.0))
            .collect();
        cells.sort();
        let mut expected = vec![(cell("a").to_string(), 6), (cell("b").to_string(), 6)];
        expected.sort();
        assert_eq!(cells, expected, "{backend}");
        let from_five = index.records_of(&cell("b"), 5);
        assert_eq!(from_five.len(), 1, "{backend}");
        let read = cellfleet_nodelog::store::read_indexed(&store, &layout, &lane, from_five)
            .await
            .unwrap();
        assert_eq!(read[0].2.as_ref(), b"b@5", "{backend}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_s_sessions_and_lanes_are_listed_one_call_each() {
    let dir = tempfile::tempdir().unwrap();
    for (backend, store, prefix) in backends("lane-walk", dir.path()).await {
        let layout = Layout::new(&prefix).unwrap();
        let node = NodeId::new("walker").unwrap();
        let mut sessions = vec![SessionId::random(), SessionId::random()];
        sessions.sort_by_key(|s| s.to_string());
        for session in &sessions {
            for number in [0u16, 3] {
                let lane = LaneId {
                    node: node.clone(),
                    session: *session,
                    lane: number,
                };
                let writer = writer(store.clone(), &prefix, &lane);
                for _ in 0..3 {
                    let seq = writer.reserve().unwrap();
                    writer.write(seq, segment(&writer, seq, &["a"]));
                }
                assert_eq!(writer.fate(2, BOUND).await, Some(GroupFate::Acknowledged));
                if number == 3 {
                    // A lane left with its floor marker only.
                    collect(store.as_ref(), &layout, &lane, 0, 3).await.unwrap();
                }
            }
        }
        let found = list_sessions(store.as_ref(), &layout, &node).await.unwrap();
        assert_eq!(found, sessions, "{backend}");
        let lanes = list_lanes(store.as_ref(), &layout, &node, sessions[1])
            .await
            .unwrap();
        let numbers: Vec<u16> = lanes.iter().map(|l| l.lane).collect();
        assert_eq!(numbers, vec![0, 3], "{backend}");
        assert!(lanes
            .iter()
            .all(|l| l.session == sessions[1] && l.node == node));
    }
}

/// One record as [`index_view`] shows it: slot, TXIDs, where its bytes lie.
type RecordView = (u64, u64, u64, u64, u64);

/// A sealed lane's index as a comparable list: every Cell's records.
fn index_view(index: &cellfleet_nodelog::store::SealedIndex) -> Vec<(String, Vec<RecordView>)> {
    let mut view: Vec<_> = index
        .cells()
        .map(|(cell, _)| {
            let records = index
                .records_of(cell, 0)
                .iter()
                .map(|r| {
                    let range = r.entry.object_range(r.index_len);
                    (
                        r.seq,
                        r.entry.min_txid.0,
                        r.entry.max_txid.0,
                        range.start,
                        range.end,
                    )
                })
                .collect();
            (cell.to_string(), records)
        })
        .collect();
    view.sort();
    view
}

/// Issue 13 (the lane index): a writer puts a chunk index once every slot
/// of a chunk is acknowledged; a successor's index of the sealed lane reads
/// those instead of each segment's own index and is the same index; a
/// damaged or missing chunk index falls back to the segments; collection
/// deletes a chunk index with the last slot it covers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_lane_is_indexed_from_its_chunk_indexes_and_the_same_without_them() {
    use cellfleet_nodelog::chunk::CHUNK_SLOTS;
    use cellfleet_nodelog::store::index_sealed_lane;
    let dir = tempfile::tempdir().unwrap();
    for (backend, store, prefix) in backends("lane-chunks", dir.path()).await {
        let layout = Layout::new(&prefix).unwrap();
        let lane = lane("n1");
        let writer = writer(store.clone(), &prefix, &lane);
        let total = 2 * CHUNK_SLOTS + 10;
        let mut seqs = Vec::new();
        for seq in 0..total {
            assert_eq!(writer.reserve(), Some(seq));
            let cells: &[&str] = match seq % 3 {
                0 => &["a", "b"],
                1 => &["c"],
                _ => &["a", "c", "d"],
            };
            writer.write(seq, segment(&writer, seq, cells));
            seqs.push(seq);
            if seqs.len() == 32 {
                for seq in seqs.drain(..) {
                    assert_eq!(writer.fate(seq, BOUND).await, Some(GroupFate::Acknowledged));
                }
            }
        }
        for seq in seqs.drain(..) {
            assert_eq!(writer.fate(seq, BOUND).await, Some(GroupFate::Acknowledged));
        }
        // The two whole chunks' indexes land (put in the background);
        // the last ten slots' chunk is not complete and has none.
        let chunk_keys = [
            layout.chunk_index_key(&lane, 0),
            layout.chunk_index_key(&lane, CHUNK_SLOTS),
        ];
        let deadline = std::time::Instant::now() + BOUND;
        for key in &chunk_keys {
            while store.head(key).await.is_err() {
                assert!(
                    std::time::Instant::now() < deadline,
                    "{backend}: {key} not put"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        assert!(store
            .head(&layout.chunk_index_key(&lane, 2 * CHUNK_SLOTS))
            .await
            .is_err());

        let with_chunks = index_sealed_lane(&store, &layout, &lane, &successor(), 1)
            .await
            .unwrap();
        assert_eq!(
            (with_chunks.floor, with_chunks.end),
            (0, total),
            "{backend}"
        );
        assert_eq!(
            (
                with_chunks.chunk_indexes_read,
                with_chunks.slot_indexes_read
            ),
            (2, 10),
            "{backend}"
        );
        let view = index_view(&with_chunks);
        assert_eq!(view.len(), 4, "{backend}");
        let a = view
            .iter()
            .find(|(c, _)| *c == cell("a").to_string())
            .unwrap();
        assert_eq!(
            a.1.len() as u64,
            (0..total).filter(|s| s % 3 != 1).count() as u64,
            "{backend}"
        );
        // Records read through the chunk-built index are the segments'.
        let records = with_chunks.records_of(&cell("d"), CHUNK_SLOTS);
        let read = cellfleet_nodelog::store::read_indexed(&store, &layout, &lane, records)
            .await
            .unwrap();
        let first_d = (CHUNK_SLOTS..).find(|s| s % 3 == 2).unwrap();
        assert_eq!(read[0].2.as_ref(), format!("d@{first_d}").as_bytes());

        // One chunk index damaged, the other gone: the same index, from
        // the segments' own indexes.
        let body = store.get(&chunk_keys[0]).await.unwrap().body;
        let mut damaged = body.to_vec();
        let middle = damaged.len() / 2;
        damaged[middle] ^= 0x40;
        store.delete(&chunk_keys[0]).await.unwrap();
        store
            .put(
                &chunk_keys[0],
                Bytes::from(damaged),
                PutCondition::IfNoneMatch,
            )
            .await
            .unwrap();
        store.delete(&chunk_keys[1]).await.unwrap();
        let without = index_sealed_lane(&store, &layout, &lane, &successor(), 1)
            .await
            .unwrap();
        assert_eq!(
            (without.chunk_indexes_read, without.slot_indexes_read),
            (0, total),
            "{backend}"
        );
        assert_eq!(index_view(&without), view, "{backend}");

        // Collection of the first chunk's slots takes its index too.
        collect(store.as_ref(), &layout, &lane, 0, CHUNK_SLOTS - 1)
            .await
            .unwrap();
        assert!(
            store.head(&chunk_keys[0]).await.is_ok(),
            "{backend}: a slot of it is left"
        );
        collect(
            store.as_ref(),
            &layout,
            &lane,
            CHUNK_SLOTS - 1,
            CHUNK_SLOTS + 5,
        )
        .await
        .unwrap();
        assert!(
            store.head(&chunk_keys[0]).await.is_err(),
            "{backend}: collected with its slots"
        );
    }
}
