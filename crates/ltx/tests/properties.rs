//! Property tests: round trips, merge equals sequential apply, incremental
//! checksums equal recomputation, and corrupted input never panics.

use std::io::{Cursor, Read, Seek, SeekFrom, Write};

use cellfleet_ltx::{
    apply, database_checksum, decode_all, encode_to_vec, merge, Checksum, Error, Header,
    PageReader, Position, RollingChecksum, Txid, HEADER_FLAG_NO_CHECKSUM,
};
use proptest::prelude::*;

/// Page contents that compress a little, a lot, or not at all.
fn page_strategy(page_size: usize) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        any::<u8>().prop_map(move |b| vec![b; page_size]),
        (any::<u64>(), 1u8..16).prop_map(move |(seed, period)| {
            (0..page_size)
                .map(|i| (seed as usize + i / usize::from(period)) as u8)
                .collect()
        }),
        proptest::collection::vec(any::<u8>(), page_size),
    ]
}

/// One step of a database's life: new commit size and the pages written.
#[derive(Debug, Clone)]
struct Step {
    commit: u32,
    pages: Vec<(u32, Vec<u8>)>,
}

fn steps_strategy(page_size: usize) -> impl Strategy<Value = (u32, Vec<Vec<u8>>, Vec<Step>)> {
    (1u32..12).prop_flat_map(move |initial| {
        let snapshot = proptest::collection::vec(page_strategy(page_size), initial as usize);
        let step = (
            1u32..14,
            proptest::collection::btree_map(1u32..14, page_strategy(page_size), 0..6),
        )
            .prop_map(|(commit, pages)| Step {
                commit,
                pages: pages.into_iter().filter(|(p, _)| *p <= commit).collect(),
            });
        (
            Just(initial),
            snapshot,
            proptest::collection::vec(step, 1..6),
        )
    })
}

/// The model: a database as pages, with the rule that pages added by growth
/// and not written read as zeros.
fn model_apply(db: &mut Vec<Vec<u8>>, step: &Step, page_size: usize) {
    db.resize(step.commit as usize, vec![0; page_size]);
    for (pgno, data) in &step.pages {
        db[*pgno as usize - 1] = data.clone();
    }
}

fn model_checksum(db: &[Vec<u8>]) -> Checksum {
    let mut rolling = RollingChecksum::new();
    for (i, page) in db.iter().enumerate() {
        rolling.add_page(i as u32 + 1, page);
    }
    rolling.value()
}

/// Encode the snapshot and steps as a tracked chain; returns the files and
/// the model database after every file.
fn build_chain(
    page_size: usize,
    snapshot: &[Vec<u8>],
    steps: &[Step],
    flags: u32,
) -> (Vec<Vec<u8>>, Vec<Vec<Vec<u8>>>) {
    let tracked = flags & HEADER_FLAG_NO_CHECKSUM == 0;
    let mut db = snapshot.to_vec();
    let mut header = Header::new(page_size as u32, db.len() as u32, Txid(1), Txid(1));
    header.flags = flags;
    let mut pages: Vec<(u32, &[u8])> = db
        .iter()
        .enumerate()
        .map(|(i, p)| (i as u32 + 1, p.as_slice()))
        .collect();
    let post = if tracked {
        model_checksum(&db)
    } else {
        Checksum::NONE
    };
    let (file, _) = encode_to_vec(header, &mut pages, post).unwrap();
    let mut files = vec![file];
    let mut states = vec![db.clone()];
    for (i, step) in steps.iter().enumerate() {
        let pre = model_checksum(&db);
        model_apply(&mut db, step, page_size);
        let txid = Txid(i as u64 + 2);
        let mut header = Header::new(page_size as u32, step.commit, txid, txid);
        header.flags = flags;
        header.timestamp_ms = 1_000 + i as i64;
        if tracked {
            header.pre_apply_checksum = pre;
        }
        let mut pages: Vec<(u32, &[u8])> = step
            .pages
            .iter()
            .rev()
            .map(|(p, d)| (*p, d.as_slice()))
            .collect();
        let post = if tracked {
            model_checksum(&db)
        } else {
            Checksum::NONE
        };
        let (file, _) = encode_to_vec(header, &mut pages, post).unwrap();
        files.push(file);
        states.push(db.clone());
    }
    (files, states)
}

fn apply_all(files: &[Vec<u8>], db: &mut std::fs::File, mut at: Position) -> Position {
    for file in files {
        at = apply(db, &file[..], at).unwrap();
    }
    at
}

fn read_db(db: &mut std::fs::File) -> Vec<u8> {
    let mut bytes = Vec::new();
    db.seek(SeekFrom::Start(0)).unwrap();
    db.read_to_end(&mut bytes).unwrap();
    bytes
}

fn readers(files: &[Vec<u8>]) -> Vec<PageReader<Cursor<&[u8]>>> {
    files
        .iter()
        .map(|f| PageReader::open(Cursor::new(f.as_slice())).unwrap())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn encode_decode_round_trip(
        page_size in prop_oneof![Just(512usize), Just(1024), Just(4096)],
        pages in proptest::collection::btree_map(1u32..40, any::<u64>(), 0..20),
        tracked: bool,
        timestamp_ms: i64,
    ) {
        let commit = 40;
        let data: Vec<(u32, Vec<u8>)> = pages
            .iter()
            .map(|(p, seed)| (*p, (0..page_size).map(|i| (seed >> (i % 64)) as u8 ^ (i / 7) as u8).collect()))
            .collect();
        let mut header = Header::new(page_size as u32, commit, Txid(5), Txid(9));
        header.timestamp_ms = timestamp_ms;
        header.node_id = 7;
        let post = if tracked {
            header.pre_apply_checksum = Checksum(0x8000_0000_dead_beef);
            Checksum(0x8000_0000_0bad_f00d)
        } else {
            header.flags = HEADER_FLAG_NO_CHECKSUM;
            Checksum::NONE
        };
        let mut refs: Vec<(u32, &[u8])> = data.iter().rev().map(|(p, d)| (*p, d.as_slice())).collect();
        let (bytes, trailer) = encode_to_vec(header, &mut refs, post).unwrap();
        let decoded = decode_all(&bytes).unwrap();
        prop_assert_eq!(decoded.header, header);
        prop_assert_eq!(&decoded.pages, &data);
        prop_assert_eq!(decoded.trailer, trailer);
        prop_assert_eq!(trailer.post_apply_checksum, post);
        let mut reader = PageReader::open(Cursor::new(&bytes)).unwrap();
        reader.verify().unwrap();
        let mut page = Vec::new();
        for (pgno, expected) in &data {
            prop_assert!(reader.read_page(*pgno, &mut page).unwrap());
            prop_assert_eq!(&page, expected);
        }
        prop_assert!(!reader.read_page(41, &mut page).unwrap());
    }

    #[test]
    fn merge_equals_sequential_apply(
        (page_size, (_initial, snapshot, steps)) in prop_oneof![Just(512usize), Just(1024)]
            .prop_flat_map(|ps| (Just(ps), steps_strategy(ps))),
        tracked: bool,
        split in 0usize..6,
    ) {
        let flags = if tracked { 0 } else { HEADER_FLAG_NO_CHECKSUM };
        let (files, states) = build_chain(page_size, &snapshot, &steps, flags);
        let dir = tempfile::tempdir().unwrap();

        // File by file: every intermediate state matches the model and the
        // incrementally maintained checksum equals a full recomputation.
        let mut sequential = std::fs::File::options().read(true).write(true).create(true)
            .truncate(true).open(dir.path().join("seq.db")).unwrap();
        let mut at = Position::EMPTY;
        for (file, state) in files.iter().zip(&states) {
            at = apply(&mut sequential, &file[..], at).unwrap();
            let bytes = read_db(&mut sequential);
            prop_assert_eq!(&bytes, &state.concat());
            prop_assert_eq!(at.checksum, database_checksum(&bytes[..], page_size as u32).unwrap());
        }

        // The whole chain merged into one snapshot.
        let mut merged_out = Vec::new();
        merge(&mut readers(&files), &mut merged_out).unwrap();
        let merged = decode_all(&merged_out).unwrap();
        prop_assert!(merged.header.is_snapshot());
        prop_assert_eq!(merged.header.max_txid, Txid(files.len() as u64));
        let mut whole = std::fs::File::options().read(true).write(true).create(true)
            .truncate(true).open(dir.path().join("merged.db")).unwrap();
        let merged_at = apply(&mut whole, &merged_out[..], Position::EMPTY).unwrap();
        prop_assert_eq!(read_db(&mut whole), read_db(&mut sequential));
        prop_assert_eq!(merged_at, at);

        // A suffix of deltas merged, applied on the state before it.
        let split = 1 + split % (files.len() - 1);
        let mut tail_out = Vec::new();
        merge(&mut readers(&files[split..]), &mut tail_out).unwrap();
        let mut partial = std::fs::File::options().read(true).write(true).create(true)
            .truncate(true).open(dir.path().join("partial.db")).unwrap();
        let before = apply_all(&files[..split], &mut partial, Position::EMPTY);
        let after = apply(&mut partial, &tail_out[..], before).unwrap();
        prop_assert_eq!(read_db(&mut partial), read_db(&mut sequential));
        prop_assert_eq!(after, at);
    }

    #[test]
    fn corrupted_files_fail_or_decode_identically(
        seed in any::<u64>(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..4),
        cut in any::<prop::sample::Index>(),
    ) {
        let page_size = 1024usize;
        let pages: Vec<Vec<u8>> = (0..4u64)
            .map(|p| (0..page_size).map(|i| ((seed.rotate_left(p as u32) >> (i % 61)) as u8) ^ (i / 3) as u8).collect())
            .collect();
        let (files, _) = build_chain(page_size, &pages, &[], 0);
        let original = decode_all(&files[0]).unwrap();
        let mut bytes = files[0].clone();
        for (at, xor) in &flips {
            let i = at.index(bytes.len());
            bytes[i] ^= xor;
        }
        match decode_all(&bytes) {
            // LZ4 can encode the same page two ways; anything that still
            // decodes must decode to exactly the original.
            Ok(decoded) => prop_assert_eq!(decoded, original.clone()),
            Err(Error::Io(e)) => prop_assert!(false, "corruption reported as i/o: {e}"),
            Err(_) => {}
        }
        if let Ok(mut reader) = PageReader::open(Cursor::new(&bytes)) {
            prop_assert!(reader.verify().is_err() || decode_all(&bytes).is_ok());
        }
        let truncated = &files[0][..cut.index(files[0].len())];
        prop_assert!(decode_all(truncated).is_err());
        prop_assert!(PageReader::open(Cursor::new(truncated)).and_then(|mut r| r.verify()).is_err());
    }

    #[test]
    fn arbitrary_bytes_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..4096),
        with_header: bool,
        page_size_log in 9u32..=16,
    ) {
        let mut input = Vec::new();
        if with_header {
            let header = Header::new(1 << page_size_log, 3, Txid(1), Txid(1));
            input.extend_from_slice(&header.encode());
        }
        input.extend_from_slice(&bytes);
        prop_assert!(decode_all(&input).is_err());
        let _ = PageReader::open(Cursor::new(&input)).map(|mut r| {
            let mut page = Vec::new();
            for at in 0..r.index().len() {
                let _ = r.read_entry(at, &mut page);
            }
            r.verify()
        });
    }
}

#[test]
fn position_mismatch_is_refused_before_writing() {
    let page = vec![3u8; 512];
    let (files, _) = build_chain(
        512,
        &[page.clone(), page.clone()],
        &[Step {
            commit: 2,
            pages: vec![(2, vec![9; 512])],
        }],
        0,
    );
    let dir = tempfile::tempdir().unwrap();
    let mut db = std::fs::File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(dir.path().join("db"))
        .unwrap();
    // The delta cannot apply to an empty database.
    let err = apply(&mut db, &files[1][..], Position::EMPTY).unwrap_err();
    assert!(matches!(err, Error::PositionMismatch { .. }), "{err}");
    assert_eq!(db.metadata().unwrap().len(), 0);
    let at = apply(&mut db, &files[0][..], Position::EMPTY).unwrap();
    // Right TXID, wrong checksum.
    let wrong = Position {
        txid: at.txid,
        checksum: Checksum(at.checksum.0 ^ 1),
    };
    let before = read_db(&mut db);
    let err = apply(&mut db, &files[1][..], wrong).unwrap_err();
    assert!(matches!(err, Error::PositionMismatch { .. }), "{err}");
    assert_eq!(read_db(&mut db), before);
    // And a snapshot refuses to apply over existing data.
    db.write_all(&[]).unwrap();
    let err = apply(&mut db, &files[0][..], Position::EMPTY).unwrap_err();
    assert!(matches!(err, Error::Usage(_)), "{err}");
}

#[test]
fn encoder_rejects_out_of_order_and_lock_pages() {
    let page = vec![0u8; 512];
    let mut header = Header::new(512, 10, Txid(2), Txid(2));
    header.pre_apply_checksum = Checksum::EMPTY;
    let mut encoder = cellfleet_ltx::Encoder::new(Vec::new(), header).unwrap();
    encoder.encode_page(3, &page).unwrap();
    assert!(matches!(
        encoder.encode_page(3, &page),
        Err(Error::PageOutOfOrder {
            pgno: 3,
            previous: 3
        })
    ));
    assert!(matches!(
        encoder.encode_page(2, &page),
        Err(Error::PageOutOfOrder { .. })
    ));
    assert!(matches!(
        encoder.encode_page(11, &page),
        Err(Error::PageBeyondCommit { .. })
    ));
    assert!(matches!(
        encoder.encode_page(4, &page[..100]),
        Err(Error::PageSizeMismatch { .. })
    ));
    let lock = cellfleet_ltx::lock_pgno(512);
    let big = Header {
        commit: lock + 5,
        ..header
    };
    let mut encoder = cellfleet_ltx::Encoder::new(Vec::new(), big).unwrap();
    assert!(matches!(
        encoder.encode_page(lock, &page),
        Err(Error::LockPage(_))
    ));
    // A snapshot must hold every page.
    let snap = Header::new(512, 3, Txid(1), Txid(1));
    let mut encoder = cellfleet_ltx::Encoder::new(Vec::new(), snap).unwrap();
    encoder.encode_page(1, &page).unwrap();
    assert!(matches!(
        encoder.encode_page(3, &page),
        Err(Error::SnapshotMissingPage(2))
    ));
}

#[test]
fn huge_declared_frame_size_is_rejected_without_allocating() {
    let header = Header::new(65536, 3, Txid(1), Txid(1));
    let mut bytes = header.encode().to_vec();
    bytes.extend_from_slice(&1u32.to_be_bytes());
    bytes.extend_from_slice(&1u16.to_be_bytes());
    bytes.extend_from_slice(&u32::MAX.to_be_bytes());
    let err = decode_all(&bytes).unwrap_err();
    assert!(
        matches!(err, Error::FrameTooLarge { size: u32::MAX, .. }),
        "{err}"
    );
}

#[test]
fn snapshot_with_wrong_post_apply_checksum_is_rejected() {
    let page = vec![1u8; 512];
    let (files, _) = build_chain(512, &[page], &[], 0);
    let mut bytes = files[0].clone();
    // Rewrite the post-apply checksum and fix up the file checksum, so only
    // the database checksum is wrong.
    let n = bytes.len();
    bytes[n - 16..n - 8].copy_from_slice(&0x8000_0000_0000_0001u64.to_be_bytes());
    let crc = crc::Crc::<u64>::new(&crc::CRC_64_GO_ISO);
    let decoded_page = vec![1u8; 512];
    let mut digest = crc.digest();
    digest.update(&bytes[..100]);
    digest.update(&bytes[100..110]);
    digest.update(&decoded_page);
    let frames_end =
        n - 16 - 8 - u64::from_be_bytes(bytes[n - 24..n - 16].try_into().unwrap()) as usize;
    digest.update(&bytes[frames_end - 6..n - 8]);
    let file_checksum = digest.finalize() | (1 << 63);
    bytes[n - 8..].copy_from_slice(&file_checksum.to_be_bytes());
    let err = decode_all(&bytes).unwrap_err();
    assert!(
        matches!(err, Error::DatabaseChecksumMismatch { .. }),
        "{err}"
    );
}

/// Build a file whose pages use legacy frames (an LZ4 *frame*, no size
/// prefix), as early LTX writers did, with a correct index and checksum.
fn legacy_file(pages: &[Vec<u8>]) -> Vec<u8> {
    let page_size = pages[0].len() as u32;
    let mut header = Header::new(page_size, pages.len() as u32, Txid(1), Txid(1));
    header.flags = HEADER_FLAG_NO_CHECKSUM;
    let mut out = header.encode().to_vec();
    let crc = crc::Crc::<u64>::new(&crc::CRC_64_GO_ISO);
    let mut digest = crc.digest();
    digest.update(&out);
    let mut index = Vec::new();
    for (i, page) in pages.iter().enumerate() {
        let pgno = i as u32 + 1;
        let offset = out.len();
        let mut page_header = pgno.to_be_bytes().to_vec();
        page_header.extend_from_slice(&0u16.to_be_bytes());
        let mut enc = lz4_flex::frame::FrameEncoder::new(Vec::new());
        enc.write_all(page).unwrap();
        let frame = enc.finish().unwrap();
        out.extend_from_slice(&page_header);
        out.extend_from_slice(&frame);
        digest.update(&page_header);
        digest.update(page);
        index.push((pgno, offset, out.len() - offset));
    }
    out.extend_from_slice(&[0; 6]);
    digest.update(&[0; 6]);
    let mut index_bytes = Vec::new();
    for (pgno, offset, size) in index {
        for mut v in [pgno as u64, offset as u64, size as u64] {
            while v >= 0x80 {
                index_bytes.push(v as u8 | 0x80);
                v >>= 7;
            }
            index_bytes.push(v as u8);
        }
    }
    index_bytes.push(0);
    let len = index_bytes.len() as u64;
    index_bytes.extend_from_slice(&len.to_be_bytes());
    index_bytes.extend_from_slice(&0u64.to_be_bytes());
    digest.update(&index_bytes);
    out.extend_from_slice(&index_bytes);
    out.extend_from_slice(&(digest.finalize() | (1 << 63)).to_be_bytes());
    out
}

#[test]
fn legacy_frames_decode_and_read_randomly() {
    let pages: Vec<Vec<u8>> = (0..3u8)
        .map(|p| {
            (0..1024u32)
                .map(|i| (i as u8).wrapping_mul(p + 1))
                .collect()
        })
        .collect();
    let bytes = legacy_file(&pages);
    let decoded = decode_all(&bytes).unwrap();
    let got: Vec<Vec<u8>> = decoded.pages.into_iter().map(|(_, d)| d).collect();
    assert_eq!(got, pages);
    let mut reader = PageReader::open(Cursor::new(&bytes)).unwrap();
    let mut page = Vec::new();
    assert!(reader.read_page(2, &mut page).unwrap());
    assert_eq!(page, pages[1]);
    reader.verify().unwrap();
    // The legacy chain applies like any other.
    let dir = tempfile::tempdir().unwrap();
    let mut db = std::fs::File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(dir.path().join("legacy.db"))
        .unwrap();
    apply(&mut db, &bytes[..], Position::EMPTY).unwrap();
    assert_eq!(read_db(&mut db), pages.concat());
}
