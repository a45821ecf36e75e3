//! The local-directory store keeps its conditional-write semantics across processes sharing the directory.
//!
//! The test re-runs this test binary as child processes (selecting the
//! `child_worker` test, which does nothing unless `CELLFLEET_LOCAL_CHILD_DIR`
//! is set). Each child increments a shared counter object by compare-and-swap
//! and races create-only writes; lost updates or double creates would show
//! in the totals.

use std::process::Command;

use bytes::Bytes;
use cellfleet_store::{Error, LocalStore, ObjectStore, PutCondition};

const CHILDREN: usize = 3;
const INCREMENTS: u64 = 15;
const CREATES: usize = 10;

#[tokio::test]
async fn child_worker() {
    let Ok(dir) = std::env::var("CELLFLEET_LOCAL_CHILD_DIR") else {
        return;
    };
    let child: usize = std::env::var("CELLFLEET_LOCAL_CHILD")
        .unwrap()
        .parse()
        .unwrap();
    let store = LocalStore::open(&dir).expect("open");
    for _ in 0..INCREMENTS {
        loop {
            let current = store.get("counter").await.expect("get counter");
            let value: u64 = std::str::from_utf8(&current.body).unwrap().parse().unwrap();
            match store
                .put(
                    "counter",
                    Bytes::from((value + 1).to_string()),
                    PutCondition::IfMatch(current.etag),
                )
                .await
            {
                Ok(_) => break,
                Err(Error::PreconditionFailed { .. }) => continue,
                Err(other) => panic!("cas failed: {other}"),
            }
        }
    }
    for i in 0..CREATES {
        let won = store
            .put(
                &format!("created/{i}"),
                Bytes::from(format!("{child}")),
                PutCondition::IfNoneMatch,
            )
            .await;
        match won {
            Ok(_) => {
                store
                    .put(
                        &format!("wins/{i}-{child}"),
                        Bytes::new(),
                        PutCondition::IfNoneMatch,
                    )
                    .await
                    .expect("record win");
            }
            Err(Error::PreconditionFailed { .. }) => {}
            Err(other) => panic!("create failed: {other}"),
        }
    }
}

#[tokio::test]
async fn compare_and_swap_holds_across_processes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = LocalStore::open(dir.path()).expect("open");
    store
        .put(
            "counter",
            Bytes::from_static(b"0"),
            PutCondition::IfNoneMatch,
        )
        .await
        .expect("seed");
    let exe = std::env::current_exe().expect("test binary");
    let children: Vec<_> = (0..CHILDREN)
        .map(|child| {
            Command::new(&exe)
                .args(["child_worker", "--exact", "--test-threads=1"])
                .env("CELLFLEET_LOCAL_CHILD_DIR", dir.path())
                .env("CELLFLEET_LOCAL_CHILD", child.to_string())
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("spawn child")
        })
        .collect();
    for mut child in children {
        assert!(child.wait().expect("wait").success(), "a child failed");
    }
    let counter = store.get("counter").await.expect("counter");
    assert_eq!(
        std::str::from_utf8(&counter.body).unwrap(),
        (CHILDREN as u64 * INCREMENTS).to_string(),
        "no lost updates"
    );
    let wins = cellfleet_store::list_all(&store, "wins/", 1000)
        .await
        .expect("list wins");
    assert_eq!(wins.len(), CREATES, "exactly one creator per key");
    let temp_left = std::fs::read_dir(dir.path().join(".tmp")).unwrap().count();
    assert_eq!(temp_left, 0, "no temp files left behind");
}
