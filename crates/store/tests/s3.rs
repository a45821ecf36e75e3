//! S3-backend specifics on a real SeaweedFS server: multipart uploads under preconditions and error mapping.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cellfleet_store::{
    open, testkit, Error, ObjectStore, PutCondition, RetryPolicy, S3Store, StoreConfig,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multipart_uploads_honour_preconditions() {
    let mut config = testkit::s3_config(testkit::TEST_BUCKET);
    config.multipart_threshold_bytes = 5 * 1024 * 1024;
    config.multipart_part_bytes = 5 * 1024 * 1024;
    let store = S3Store::connect(&config).await.expect("connect");
    store.create_bucket_if_missing().await.expect("bucket");
    let key = format!("{}/big.ltx", testkit::unique_prefix("multipart"));
    let data = Bytes::from(vec![7_u8; 11 * 1024 * 1024]);
    let first = store
        .put(&key, data.clone(), PutCondition::IfNoneMatch)
        .await
        .expect("multipart create");
    assert!(first.as_str().ends_with("-3"), "3 parts: {first}");
    let again = store
        .put(&key, data.clone(), PutCondition::IfNoneMatch)
        .await;
    assert!(
        matches!(again, Err(Error::PreconditionFailed { .. })),
        "{again:?}"
    );
    let mut changed = data.to_vec();
    changed[0] = 8;
    let second = store
        .put(
            &key,
            Bytes::from(changed.clone()),
            PutCondition::IfMatch(first.clone()),
        )
        .await
        .expect("multipart replace");
    let stale = store.put(&key, data, PutCondition::IfMatch(first)).await;
    assert!(
        matches!(stale, Err(Error::PreconditionFailed { .. })),
        "{stale:?}"
    );
    let object = store.get(&key).await.expect("get");
    assert_eq!(object.etag, second);
    assert!(object.body == changed);
    store.delete(&key).await.expect("delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_wraps_s3_with_retries() {
    let config = testkit::s3_config(testkit::TEST_BUCKET);
    testkit::s3_store().await; // creates the bucket
    let store = open(&StoreConfig::S3(config)).await.expect("open");
    let key = format!("{}/k", testkit::unique_prefix("open"));
    let etag = store
        .put(&key, Bytes::from_static(b"x"), PutCondition::IfNoneMatch)
        .await
        .expect("put");
    assert_eq!(store.head(&key).await.expect("head").etag, etag);
    assert!(store.describe().contains(testkit::TEST_BUCKET));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_credentials_are_rejected_not_retried() {
    testkit::s3_store().await;
    let mut config = testkit::s3_config(testkit::TEST_BUCKET);
    config.secret_key = Some("not-the-secret".to_owned());
    let store = S3Store::connect(&config).await.expect("connect");
    let result = store.get("t/whatever").await;
    match result {
        Err(error @ Error::Rejected { .. }) => assert!(!error.is_retryable()),
        other => panic!("expected Rejected, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_bucket_is_rejected() {
    let bucket = format!("cellfleet-missing-{:016x}", rand_suffix());
    let config = testkit::s3_config(&bucket);
    let store = S3Store::connect(&config).await.expect("connect");
    // A read, because some servers (SeaweedFS) create buckets on first put.
    let result = store.get("k").await;
    assert!(matches!(result, Err(Error::Rejected { .. })), "{result:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_is_unavailable_after_bounded_retries() {
    let mut config = testkit::s3_config(testkit::TEST_BUCKET);
    // Port 9 (discard) on loopback: nothing listens, connections are refused.
    config.endpoint = Some("http://127.0.0.1:9".to_owned());
    config.connect_timeout = Duration::from_millis(500);
    config.retry = RetryPolicy {
        attempts_max: 3,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(5),
    };
    let store: Arc<dyn ObjectStore> = open(&StoreConfig::S3(config)).await.expect("open");
    let read = store.get("k").await;
    assert!(
        matches!(read, Err(ref e @ Error::Unavailable { .. }) if e.is_retryable()),
        "{read:?}"
    );
    let write = store
        .put("k", Bytes::from_static(b"x"), PutCondition::IfNoneMatch)
        .await;
    assert!(
        matches!(write, Err(ref e @ Error::Unavailable { .. }) if e.may_have_applied()),
        "a failed conditional write's outcome is unknown: {write:?}"
    );
}

fn rand_suffix() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    (nanos as u64) ^ u64::from(std::process::id()).rotate_left(32)
}
