//! The segment codec on arbitrary input: round trips, every damaged or truncated object refused, ranged reads equal to whole reads, and no panic on any bytes.

use cellfleet_authority::{CellId, Epoch, Holder, LaneId, NodeId, SessionId, Txid};
use cellfleet_nodelog::segment;
use cellfleet_nodelog::segment::{
    check_entry_bytes, decode, decode_index, encode_seal, encode_segment, index_range, Index, Part,
    Seal, SegmentHeader, Slot,
};
use proptest::prelude::*;

fn header(node: &str, session: u128, lane: u16, seq: u64) -> SegmentHeader {
    SegmentHeader {
        lane: LaneId {
            node: NodeId::new(node).unwrap(),
            session: SessionId::from_u128(session),
            lane,
        },
        seq,
        written_ms: 1_700_000_000_000 + seq,
    }
}

/// (cell key, epoch, first TXID, TXID count, bytes, command count)
type PartSpec = (Vec<u8>, u64, u64, u64, Vec<u8>, usize);

fn part_spec() -> impl Strategy<Value = PartSpec> {
    (
        proptest::collection::vec(any::<u8>(), 1..12),
        1u64..5,
        1u64..1_000,
        0u64..5,
        proptest::collection::vec(any::<u8>(), 0..300),
        0usize..4,
    )
}

fn parts(specs: &[PartSpec]) -> Vec<Part<'_>> {
    specs
        .iter()
        .enumerate()
        .map(|(i, (key, epoch, min, count, bytes, commands))| Part {
            cell_id: CellId::for_kind_key("kv", key),
            epoch: Epoch::new(*epoch).unwrap(),
            min_txid: Txid(*min),
            max_txid: Txid(min + count),
            file_checksum: 0xf11e_0000 + i as u64,
            post_apply_checksum: 0xc4ec_0000 + i as u64,
            command_ids: (0..*commands).map(|c| [c as u8 ^ i as u8; 16]).collect(),
            bytes,
        })
        .collect()
}

proptest! {
    #[test]
    fn segments_round_trip_and_ranged_reads_match(
        seq in any::<u64>(),
        lane in any::<u16>(),
        session in any::<u128>(),
        specs in proptest::collection::vec(part_spec(), 0..8),
    ) {
        let header = header("node-a", session, lane, seq);
        let parts = parts(&specs);
        let bytes = encode_segment(&header, &parts).unwrap();
        let Slot::Segment(segment) = decode(&bytes).unwrap() else {
            panic!("a segment decodes as a segment");
        };
        prop_assert_eq!(&segment.header, &header);
        prop_assert_eq!(segment.entries.len(), parts.len());
        for (entry, part) in segment.entries.iter().zip(&parts) {
            prop_assert_eq!(&entry.cell_id, &part.cell_id);
            prop_assert_eq!((entry.min_txid, entry.max_txid), (part.min_txid, part.max_txid));
            prop_assert_eq!(&entry.command_ids, &part.command_ids);
            prop_assert_eq!(segment.bytes_of(entry), part.bytes);
        }
        // A ranged reader: the fixed part, then the index, then one entry.
        let range = index_range(&bytes[..16]).unwrap();
        let Index::Segment { entries, index_len, .. } = decode_index(&bytes[..range.end as usize]).unwrap() else {
            panic!("a segment's index");
        };
        prop_assert_eq!(&entries, &segment.entries);
        for (entry, part) in entries.iter().zip(&parts) {
            let within = entry.object_range(index_len);
            let read = &bytes[within.start as usize..within.end as usize];
            prop_assert_eq!(read, part.bytes);
            prop_assert!(check_entry_bytes(entry, read).is_ok());
        }
    }

    /// Any single changed byte, and any truncation, is refused.
    #[test]
    fn damaged_or_truncated_objects_are_refused(
        specs in proptest::collection::vec(part_spec(), 1..4),
        position in any::<prop::sample::Index>(),
        flip in 1u8..=255,
        cut in any::<prop::sample::Index>(),
    ) {
        let bytes = encode_segment(&header("n1", 7, 0, 3), &parts(&specs)).unwrap();
        let mut damaged = bytes.clone();
        let at = position.index(bytes.len());
        damaged[at] ^= flip;
        prop_assert!(decode(&damaged).is_err(), "byte {} changed and accepted", at);
        let short = cut.index(bytes.len());
        prop_assert!(decode(&bytes[..short]).is_err(), "truncated to {} and accepted", short);
    }

    /// Arbitrary bytes, and arbitrary bytes after a valid magic, never
    /// panic the decoders.
    #[test]
    fn arbitrary_bytes_never_panic(noise in proptest::collection::vec(any::<u8>(), 0..600), kind in 0u8..4) {
        let _ = decode(&noise);
        let _ = decode_index(&noise);
        let mut framed = b"CFLOGSG1".to_vec();
        framed.push(kind);
        framed.extend_from_slice(&noise);
        let _ = decode(&framed);
        let _ = decode_index(&framed);
        let _ = index_range(&framed);
    }
}

#[test]
fn seals_round_trip_and_are_told_from_segments() {
    let seal = Seal {
        header: header("n1", 9, 2, 41),
        sealed_by: Holder {
            node: NodeId::new("n2").unwrap(),
            session: SessionId::from_u128(77),
        },
    };
    let bytes = encode_seal(&seal);
    assert_eq!(decode(&bytes).unwrap(), Slot::Seal(seal.clone()));
    assert_eq!(decode_index(&bytes).unwrap(), Index::Seal(seal));
    for at in 0..bytes.len() {
        let mut damaged = bytes.clone();
        damaged[at] ^= 0x40;
        assert!(decode(&damaged).is_err(), "byte {at} changed and accepted");
    }
}

#[test]
fn bounds_are_refused_before_anything_is_allocated() {
    let mut bytes = encode_segment(&header("n1", 1, 0, 0), &[]).unwrap();
    // An index length past the bound.
    bytes[12..16].copy_from_slice(&u32::MAX.to_be_bytes());
    assert!(matches!(
        decode(&bytes),
        Err(cellfleet_nodelog::Error::TooLarge { what: "index", .. })
    ));
    let bad_txids = Part {
        cell_id: CellId::for_kind_key("kv", b"k"),
        epoch: Epoch::new(1).unwrap(),
        min_txid: Txid(5),
        max_txid: Txid(4),
        file_checksum: 0,
        post_apply_checksum: 0,
        command_ids: vec![],
        bytes: b"x",
    };
    assert!(encode_segment(&header("n1", 1, 0, 0), &[bad_txids]).is_err());
}

proptest! {
    /// A floor marker round-trips; any other bytes, and any single byte
    /// changed, are refused without a panic.
    #[test]
    fn floor_markers_round_trip_and_damage_is_refused(
        floor in any::<u64>(),
        at in 0usize..segment::FLOOR_BYTES,
        flip in 1u8..=255,
        noise in proptest::collection::vec(any::<u8>(), 0..40),
    ) {
        let bytes = segment::encode_floor(floor);
        prop_assert_eq!(segment::decode_floor(&bytes), Ok(floor));
        let mut damaged = bytes.clone();
        damaged[at] ^= flip;
        prop_assert!(segment::decode_floor(&damaged).is_err());
        prop_assert!(segment::decode_floor(&bytes[..at]).is_err());
        if noise != bytes {
            prop_assert!(segment::decode_floor(&noise).is_err());
        }
    }
}

/// `count` segments of lane `lane` from slot `first`, each with the parts
/// of `specs` (whole objects, as a writer holds them).
fn chunk_segments(lane: &LaneId, first: u64, specs: &[Vec<PartSpec>]) -> Vec<Vec<u8>> {
    specs
        .iter()
        .enumerate()
        .map(|(i, specs)| {
            let mut header = header("node-a", 0, 0, first + i as u64);
            header.lane = lane.clone();
            encode_segment(&header, &parts(specs)).unwrap()
        })
        .collect()
}

fn chunk_lane(session: u128, lane: u16) -> LaneId {
    LaneId {
        node: NodeId::new("node-a").unwrap(),
        session: SessionId::from_u128(session),
        lane,
    }
}

proptest! {
    /// A chunk index holds exactly each segment's own index: decoded, it
    /// gives every slot's entries and index length as the segment does.
    #[test]
    fn chunk_indexes_round_trip_to_each_segment_s_own_index(
        session in any::<u128>(),
        lane in any::<u16>(),
        chunk in 0u64..1_000,
        specs in proptest::collection::vec(proptest::collection::vec(part_spec(), 0..4), 0..6),
    ) {
        use cellfleet_nodelog::chunk::{decode_chunk, encode_chunk, CHUNK_SLOTS};
        let lane = chunk_lane(session, lane);
        let first = chunk * CHUNK_SLOTS;
        let segments = chunk_segments(&lane, first, &specs);
        let prefixes: Vec<&[u8]> = segments.iter().map(Vec::as_slice).collect();
        let bytes = encode_chunk(&lane, first, &prefixes).unwrap();
        let slots = decode_chunk(&bytes, &lane, first).unwrap();
        prop_assert_eq!(slots.len(), segments.len());
        for (i, (slot, segment)) in slots.iter().zip(&segments).enumerate() {
            let Index::Segment { entries, index_len, .. } = decode_index(segment).unwrap() else {
                panic!("a segment's index");
            };
            prop_assert_eq!(slot.seq, first + i as u64);
            prop_assert_eq!(&slot.entries, &entries);
            prop_assert_eq!(slot.index_len, index_len);
        }
        // Read as another lane's or another chunk's: refused.
        let other = chunk_lane(session ^ 1, 0);
        prop_assert!(decode_chunk(&bytes, &other, first).is_err());
        prop_assert!(decode_chunk(&bytes, &lane, first + CHUNK_SLOTS).is_err());
    }

    /// Any single changed byte, and any truncation, of a chunk index is
    /// refused; arbitrary bytes (after its magic too) never panic.
    #[test]
    fn damaged_truncated_or_arbitrary_chunk_indexes_are_refused(
        specs in proptest::collection::vec(proptest::collection::vec(part_spec(), 0..3), 1..4),
        position in any::<prop::sample::Index>(),
        flip in 1u8..=255,
        cut in any::<prop::sample::Index>(),
        noise in proptest::collection::vec(any::<u8>(), 0..600),
    ) {
        use cellfleet_nodelog::chunk::{decode_chunk, encode_chunk};
        let lane = chunk_lane(9, 1);
        let segments = chunk_segments(&lane, 0, &specs);
        let prefixes: Vec<&[u8]> = segments.iter().map(Vec::as_slice).collect();
        let bytes = encode_chunk(&lane, 0, &prefixes).unwrap();
        let mut damaged = bytes.clone();
        let at = position.index(bytes.len());
        damaged[at] ^= flip;
        prop_assert!(decode_chunk(&damaged, &lane, 0).is_err(), "byte {} changed and accepted", at);
        let short = cut.index(bytes.len());
        prop_assert!(decode_chunk(&bytes[..short], &lane, 0).is_err(), "truncated to {} and accepted", short);
        let _ = decode_chunk(&noise, &lane, 0);
        let mut framed = b"CFLOGIX1".to_vec();
        framed.extend_from_slice(&noise);
        let _ = decode_chunk(&framed, &lane, 0);
    }
}

#[test]
fn a_chunk_index_refuses_what_a_writer_must_never_put_in_one() {
    use cellfleet_nodelog::chunk::{decode_chunk, encode_chunk, CHUNK_SLOTS};
    let lane = chunk_lane(3, 0);
    let segments = chunk_segments(&lane, 0, &[vec![], vec![]]);
    // Not aligned, or past a chunk's slots.
    assert!(encode_chunk(&lane, 1, &[&segments[0]]).is_err());
    let many: Vec<&[u8]> = (0..=CHUNK_SLOTS).map(|_| segments[0].as_slice()).collect();
    assert!(encode_chunk(&lane, 0, &many).is_err());
    // Slots out of order: slot 0 holds slot 1's index.
    let swapped = encode_chunk(&lane, 0, &[&segments[1], &segments[0]]).unwrap();
    let error = decode_chunk(&swapped, &lane, 0).unwrap_err().to_string();
    assert!(error.contains("holds the index of lane"), "{error}");
    // A seal is never part of a chunk.
    let seal = encode_seal(&Seal {
        header: SegmentHeader {
            lane: lane.clone(),
            seq: 0,
            written_ms: 1,
        },
        sealed_by: Holder {
            node: NodeId::new("n2").unwrap(),
            session: SessionId::from_u128(5),
        },
    });
    let sealed = encode_chunk(&lane, 0, &[&seal]).unwrap();
    let error = decode_chunk(&sealed, &lane, 0).unwrap_err().to_string();
    assert!(error.contains("is a seal"), "{error}");
}
