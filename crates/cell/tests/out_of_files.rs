//! A process out of file descriptors gets [`Error::OutOfFiles`] from
//! [`Cell::open`] (retryable, and not a reason to rebuild the file), and
//! the same file opens at its position once descriptors are free again.
//!
//! Its own test binary: it lowers this process's open-file limit.

mod common;

use cellfleet_cell::{Cell, CellConfig, Error, Position};
use common::{kv, kv_put as put, NOW};
use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

#[test]
fn opening_past_the_open_file_limit_is_out_of_files_and_harms_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = CellConfig::default();
    // One Cell with a published write, closed: the file that must survive.
    let kept = dir.path().join("kept.db");
    let opened = Cell::open(&kept, kv(), config.clone(), Position::EMPTY, NOW).unwrap();
    let mut cell = opened.cell;
    if let Some(migration) = opened.migration {
        cell.confirm(migration.txid).unwrap();
    }
    let result = cell.execute(&[put(1)], NOW).unwrap();
    let position = cell.confirm(result.publication.unwrap().txid).unwrap();
    cell.close();

    let limit = getrlimit(Resource::Nofile);
    let open_now = std::fs::read_dir("/proc/self/fd").map_or(16, |d| d.count() as u64);
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(open_now + 24),
            maximum: limit.maximum,
        },
    )
    .unwrap();
    let mut open = Vec::new();
    let error = loop {
        let path = dir.path().join(format!("c{}.db", open.len()));
        match Cell::open(&path, kv(), config.clone(), Position::EMPTY, NOW) {
            Ok(opened) => open.push(opened.cell),
            Err(error) => break error,
        }
        assert!(open.len() < 100, "the lowered limit was never reached");
    };
    assert!(matches!(error, Error::OutOfFiles { .. }), "{error:?}");
    assert!(error.is_out_of_files());
    assert!(error.is_retryable());
    assert!(error.to_string().contains("ulimit -n"), "{error}");
    // Creating a Cell needs a descriptor more at its peak than reopening
    // one, so the loop's failure can leave a few free: take the rest, so
    // that the kept Cell cannot open now either. It must be refused the
    // same way (not as a file at the wrong position).
    let mut filler = Vec::new();
    while let Ok(file) = std::fs::File::open("/dev/null") {
        filler.push(file);
        assert!(filler.len() < 100, "the lowered limit was never reached");
    }
    let refused = Cell::open(&kept, kv(), config.clone(), position, NOW).unwrap_err();
    assert!(refused.is_out_of_files(), "{refused:?}");

    drop(filler);
    drop(open);
    setrlimit(Resource::Nofile, limit).unwrap();
    let reopened = Cell::open(&kept, kv(), config, position, NOW).unwrap();
    assert_eq!(reopened.cell.position(), position);
}
