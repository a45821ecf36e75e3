//! The object-store contract, run against every backend: local directory, memory, and a real SeaweedFS server.
//!
//! The S3 runs use `cellfleet_store::testkit`, which uses `CELLFLEET_S3_*`
//! if set and otherwise starts the repository's `scripts/seaweedfs.sh`. They
//! never skip: no server means a failing test with the reason.

use std::collections::BTreeSet;
use std::sync::Arc;

use bytes::Bytes;
use cellfleet_store::{
    list_all, probe, testkit, Error, LocalStore, MemoryStore, ObjectStore, PutCondition,
};
use tokio::sync::Barrier;

/// Runs each contract function against each backend, each in a fresh key space.
macro_rules! contract {
    ($($name:ident),* $(,)?) => {
        mod local {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    let dir = tempfile::tempdir().expect("temp dir");
                    let store = super::LocalStore::open(dir.path()).expect("open local store");
                    super::$name(std::sync::Arc::new(store), "base".to_owned()).await;
                }
            )*
        }
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(std::sync::Arc::new(super::MemoryStore::new()), "base".to_owned()).await;
                }
            )*
        }
        mod s3 {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    let store = super::testkit::s3_store().await;
                    super::$name(store, super::testkit::unique_prefix(stringify!($name))).await;
                }
            )*
        }
    };
}

contract!(
    missing_objects_are_not_found,
    create_only_put_creates_once,
    if_match_replaces_only_the_current_version,
    etags_are_stable_content_versions,
    overwrite_put_replaces,
    range_reads_clamp_like_http,
    delete_is_idempotent_and_frees_the_key,
    list_filters_by_prefix_and_paginates,
    invalid_keys_are_rejected,
    race_create_has_exactly_one_winner,
    race_if_match_has_exactly_one_winner,
    probe_passes_and_leaves_no_objects,
    large_bodies_round_trip,
);

type Store = Arc<dyn ObjectStore>;

fn body(text: &str) -> Bytes {
    Bytes::from(text.to_owned())
}

async fn missing_objects_are_not_found(store: Store, p: String) {
    let key = format!("{p}/missing");
    assert!(matches!(store.get(&key).await, Err(Error::NotFound { .. })));
    assert!(matches!(
        store.head(&key).await,
        Err(Error::NotFound { .. })
    ));
    assert!(matches!(
        store.get_range(&key, 0..4).await,
        Err(Error::NotFound { .. })
    ));
}

async fn create_only_put_creates_once(store: Store, p: String) {
    let key = format!("{p}/root.json");
    let etag = store
        .put(&key, body("first"), PutCondition::IfNoneMatch)
        .await
        .expect("create");
    let object = store.get(&key).await.expect("get");
    assert_eq!(object.body, body("first"));
    assert_eq!(object.etag, etag);
    assert_eq!(object.size, 5);
    let second = store
        .put(&key, body("second"), PutCondition::IfNoneMatch)
        .await;
    assert!(
        matches!(second, Err(Error::PreconditionFailed { .. })),
        "{second:?}"
    );
    assert_eq!(store.get(&key).await.expect("get").body, body("first"));
}

async fn if_match_replaces_only_the_current_version(store: Store, p: String) {
    let key = format!("{p}/lease.json");
    let v1 = store
        .put(&key, body("v1"), PutCondition::IfNoneMatch)
        .await
        .expect("create");
    let v2 = store
        .put(&key, body("v2"), PutCondition::IfMatch(v1.clone()))
        .await
        .expect("replace with current etag");
    assert_ne!(v1, v2, "the etag must change with the content");
    let stale = store
        .put(&key, body("v3"), PutCondition::IfMatch(v1.clone()))
        .await;
    assert!(
        matches!(stale, Err(Error::PreconditionFailed { .. })),
        "{stale:?}"
    );
    let object = store.get(&key).await.expect("get");
    assert_eq!((object.body, object.etag), (body("v2"), v2.clone()));
    let missing = store
        .put(&format!("{p}/absent"), body("x"), PutCondition::IfMatch(v2))
        .await;
    assert!(
        matches!(missing, Err(Error::PreconditionFailed { .. })),
        "If-Match on a missing key: {missing:?}"
    );
    assert!(store.get(&format!("{p}/absent")).await.is_err());
}

async fn etags_are_stable_content_versions(store: Store, p: String) {
    let a = store
        .put(&format!("{p}/a"), body("same"), PutCondition::IfNoneMatch)
        .await
        .expect("put a");
    let b = store
        .put(&format!("{p}/b"), body("same"), PutCondition::IfNoneMatch)
        .await
        .expect("put b");
    assert_eq!(
        a, b,
        "identical bytes give identical etags: records need nonces"
    );
    let head = store.head(&format!("{p}/a")).await.expect("head");
    assert_eq!(head.etag, a);
    assert_eq!(head.size, 4);
    let again = store.get(&format!("{p}/a")).await.expect("get");
    assert_eq!(again.etag, a);
}

async fn overwrite_put_replaces(store: Store, p: String) {
    let key = format!("{p}/blob");
    store
        .put(&key, body("one"), PutCondition::Overwrite)
        .await
        .expect("first");
    let etag = store
        .put(&key, body("two"), PutCondition::Overwrite)
        .await
        .expect("second");
    let object = store.get(&key).await.expect("get");
    assert_eq!((object.body, object.etag), (body("two"), etag));
}

async fn range_reads_clamp_like_http(store: Store, p: String) {
    let key = format!("{p}/ranged");
    let etag = store
        .put(&key, body("0123456789"), PutCondition::IfNoneMatch)
        .await
        .expect("put");
    let middle = store.get_range(&key, 2..5).await.expect("2..5");
    assert_eq!(middle.body, body("234"));
    assert_eq!(middle.etag, etag);
    assert_eq!(middle.size, 10);
    let tail = store.get_range(&key, 7..100).await.expect("7..100");
    assert_eq!(tail.body, body("789"));
    let past = store.get_range(&key, 10..12).await;
    assert!(matches!(past, Err(Error::InvalidRange { .. })), "{past:?}");
    let empty = store.get_range(&key, 3..3).await;
    assert!(
        matches!(empty, Err(Error::InvalidRange { .. })),
        "{empty:?}"
    );
}

async fn delete_is_idempotent_and_frees_the_key(store: Store, p: String) {
    let key = format!("{p}/gone");
    store
        .put(&key, body("x"), PutCondition::IfNoneMatch)
        .await
        .expect("put");
    store.delete(&key).await.expect("delete");
    assert!(matches!(store.get(&key).await, Err(Error::NotFound { .. })));
    store.delete(&key).await.expect("delete again");
    store
        .put(&key, body("y"), PutCondition::IfNoneMatch)
        .await
        .expect("create after delete");
}

async fn list_filters_by_prefix_and_paginates(store: Store, p: String) {
    let mut expected = BTreeSet::new();
    for i in 0..23 {
        let key = format!("{p}/list/k{i:02}");
        store
            .put(&key, body(&format!("{i}")), PutCondition::IfNoneMatch)
            .await
            .expect("put");
        expected.insert(key);
    }
    for other in ["listing/x", "lis/y", "other/z"] {
        store
            .put(
                &format!("{p}/{other}"),
                body("o"),
                PutCondition::IfNoneMatch,
            )
            .await
            .expect("put other");
    }
    let prefix = format!("{p}/list/");
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let page = store
            .list(&prefix, after.as_deref(), 10)
            .await
            .expect("list");
        assert!(page.entries.len() <= 10);
        pages += 1;
        seen.extend(page.entries.into_iter().map(|entry| entry.key));
        match page.next_start_after {
            Some(next) => after = Some(next),
            None => break,
        }
        assert!(pages < 10, "pagination does not end");
    }
    assert_eq!(pages, 3);
    let sorted: Vec<String> = expected.iter().cloned().collect();
    assert_eq!(seen, sorted, "keys in order, each once, prefix only");
    // A prefix that ends mid-segment matches like S3's string prefix.
    let k1 = list_all(store.as_ref(), &format!("{p}/list/k1"), 100)
        .await
        .expect("list k1");
    assert_eq!(k1.len(), 10);
    let lis = list_all(store.as_ref(), &format!("{p}/lis"), 100)
        .await
        .expect("list lis");
    assert_eq!(lis.len(), 23 + 2);
    let too_many = list_all(store.as_ref(), &prefix, 5).await;
    assert!(matches!(too_many, Err(Error::TooMany { .. })));
    let entry = store
        .list(&prefix, None, 1)
        .await
        .expect("list one")
        .entries
        .remove(0);
    assert_eq!((entry.key.as_str(), entry.size), (sorted[0].as_str(), 1));
}

async fn invalid_keys_are_rejected(store: Store, p: String) {
    for key in [
        String::new(),
        format!("/{p}/a"),
        format!("{p}/a/"),
        format!("{p}//a"),
        format!("{p}/../a"),
    ] {
        let result = store.put(&key, body("x"), PutCondition::Overwrite).await;
        assert!(
            matches!(result, Err(Error::InvalidKey { .. })),
            "{key:?}: {result:?}"
        );
    }
}

/// N writers race with `condition` on `key`; returns how many succeeded.
/// Every body is unique (a nonce): a writer that rewrote the current bytes
/// would keep the ETag and let a second If-Match writer win too (A→B→A).
async fn race(store: &Store, key: &str, condition: PutCondition, writers: usize) -> usize {
    let nonce: u64 = rand::random();
    let barrier = Arc::new(Barrier::new(writers));
    let tasks: Vec<_> = (0..writers)
        .map(|writer| {
            let store = Arc::clone(store);
            let barrier = Arc::clone(&barrier);
            let key = key.to_owned();
            let condition = condition.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                store
                    .put(&key, body(&format!("writer {writer} {nonce}")), condition)
                    .await
            })
        })
        .collect();
    let mut winners = 0;
    for task in tasks {
        match task.await.expect("writer task") {
            Ok(_) => winners += 1,
            Err(Error::PreconditionFailed { .. } | Error::Conflict { .. }) => {}
            Err(other) => panic!("unexpected race error: {other}"),
        }
    }
    winners
}

async fn race_create_has_exactly_one_winner(store: Store, p: String) {
    for round in 0..2 {
        let key = format!("{p}/race-create-{round}");
        assert_eq!(race(&store, &key, PutCondition::IfNoneMatch, 4).await, 1);
    }
}

async fn race_if_match_has_exactly_one_winner(store: Store, p: String) {
    let key = format!("{p}/race-cas");
    let mut etag = store
        .put(&key, body("start"), PutCondition::IfNoneMatch)
        .await
        .expect("create");
    for _round in 0..2 {
        assert_eq!(
            race(&store, &key, PutCondition::IfMatch(etag.clone()), 4).await,
            1
        );
        let next = store.get(&key).await.expect("get").etag;
        assert_ne!(next, etag);
        etag = next;
    }
}

async fn probe_passes_and_leaves_no_objects(store: Store, p: String) {
    let report = probe::run(Arc::clone(&store), &p, 3).await;
    assert!(report.passed(), "{report}");
    assert_eq!(report.checks.len(), probe::Check::ALL.len());
    let left = list_all(store.as_ref(), &format!("{p}/"), 100)
        .await
        .expect("list");
    assert!(left.is_empty(), "probe left {left:?}");
}

async fn large_bodies_round_trip(store: Store, p: String) {
    let key = format!("{p}/large.ltx");
    let data: Vec<u8> = (0..(3 * 1024 * 1024 + 17))
        .map(|i: u32| (i % 251) as u8)
        .collect();
    let data = Bytes::from(data);
    let etag = store
        .put(&key, data.clone(), PutCondition::IfNoneMatch)
        .await
        .expect("put large");
    let object = store.get(&key).await.expect("get large");
    assert_eq!(object.etag, etag);
    assert!(object.body == data, "large body differs");
    let again = store.put(&key, data, PutCondition::IfNoneMatch).await;
    assert!(matches!(again, Err(Error::PreconditionFailed { .. })));
}
