//! The files a Cell creates and deletes, watched with inotify: a new Cell
//! makes its database (from its kind's template) and WAL, and deletes
//! nothing. (Every
//! deleted inode slows each later file creation on ext4 without a journal,
//! so a node that creates Cells must not churn files to do it.)

use std::collections::BTreeSet;
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::path::Path;

mod common;

use cellfleet_cell::{Cell, CellConfig, Position};
use common::{kv, kv_put as put, NOW};
use rustix::fs::inotify;
use rustix::io::Errno;

fn watch(dir: &Path) -> OwnedFd {
    let fd = inotify::init(inotify::CreateFlags::NONBLOCK | inotify::CreateFlags::CLOEXEC)
        .expect("inotify");
    inotify::add_watch(
        &fd,
        dir,
        inotify::WatchFlags::CREATE | inotify::WatchFlags::MOVED_TO | inotify::WatchFlags::DELETE,
    )
    .expect("watch the directory");
    fd
}

/// The names created (or renamed to) and deleted in the watched directory
/// so far.
fn events(fd: &OwnedFd) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut buf = [MaybeUninit::<u8>::uninit(); 8192];
    let mut reader = inotify::Reader::new(fd, &mut buf);
    let (mut created, mut deleted) = (BTreeSet::new(), BTreeSet::new());
    loop {
        match reader.next() {
            Ok(event) => {
                let name = event
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                if event
                    .events()
                    .intersects(inotify::ReadFlags::CREATE | inotify::ReadFlags::MOVED_TO)
                {
                    created.insert(name);
                } else if event.events().contains(inotify::ReadFlags::DELETE) {
                    deleted.insert(name);
                }
            }
            Err(Errno::AGAIN) => return (created, deleted),
            Err(e) => panic!("reading inotify events: {e}"),
        }
    }
}

#[test]
fn a_new_cell_creates_its_two_files_and_deletes_none() {
    for page_size in [1024, 4096] {
        let dir = tempfile::tempdir().unwrap();
        let fd = watch(dir.path());
        let config = CellConfig {
            page_size,
            ..CellConfig::default()
        };
        let path = dir.path().join("new.db");
        let opened = Cell::open(&path, kv(), config, Position::EMPTY, NOW).unwrap();
        let mut cell = opened.cell;
        if let Some(migration) = opened.migration {
            cell.confirm(migration.txid).unwrap();
        }
        let mut group = cell.execute(&[put(1)], NOW).unwrap();
        let publication = group.publication.take().expect("a write");
        cell.confirm(publication.txid).unwrap();
        let (created, deleted) = events(&fd);
        let expected: BTreeSet<String> = ["new.db", "new.db-wal"]
            .into_iter()
            .map(String::from)
            .collect();
        assert_eq!(created, expected, "page size {page_size}");
        assert!(deleted.is_empty(), "page size {page_size}: {deleted:?}");
        assert_eq!(
            cell.query("get", &serde_json::json!({"key": "k1"}))
                .unwrap(),
            serde_json::json!({"type": "value", "value": 1}),
            "page size {page_size}"
        );
    }
}
