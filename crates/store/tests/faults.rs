//! Failure paths through the fault-injecting wrapper: lost replies, bounded retries, and 412s that are never retried.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cellfleet_store::{
    Error, Fault, FaultStore, MemoryStore, ObjectStore, Op, Outcome, PutCondition, RetryPolicy,
    RetryStore,
};

fn quick_retries(attempts_max: u32) -> RetryPolicy {
    RetryPolicy {
        attempts_max,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(4),
    }
}

fn stack(attempts_max: u32) -> (Arc<MemoryStore>, Arc<FaultStore>, RetryStore) {
    let memory = Arc::new(MemoryStore::new());
    let faults = Arc::new(FaultStore::new(memory.clone()));
    let retry = RetryStore::new(faults.clone(), quick_retries(attempts_max));
    (memory, faults, retry)
}

#[tokio::test]
async fn transient_read_errors_are_retried_within_bounds() {
    let (memory, faults, store) = stack(4);
    memory
        .put("k", Bytes::from_static(b"v"), PutCondition::IfNoneMatch)
        .await
        .expect("seed");
    faults.inject(Fault::unavailable(Op::Get).times(3));
    assert_eq!(store.get("k").await.expect("4th attempt").body, "v");
    assert_eq!(faults.counts().get(Op::Get), 4);

    faults.reset_counts();
    faults.inject(Fault::unavailable(Op::Get).times(100));
    let result = store.get("k").await;
    assert!(
        matches!(result, Err(Error::Unavailable { .. })),
        "{result:?}"
    );
    assert_eq!(
        faults.counts().get(Op::Get),
        4,
        "exactly attempts_max attempts"
    );
}

#[tokio::test]
async fn conditional_put_not_applied_is_retried() {
    let (memory, faults, store) = stack(3);
    faults.inject(Fault::unavailable(Op::PutIfNoneMatch).times(2));
    store
        .put("k", Bytes::from_static(b"v"), PutCondition::IfNoneMatch)
        .await
        .expect("third attempt succeeds");
    assert_eq!(faults.counts().get(Op::PutIfNoneMatch), 3);
    assert_eq!(memory.get("k").await.expect("stored").body, "v");
}

#[tokio::test]
async fn lost_reply_is_not_retried_and_reports_unknown_outcome() {
    let (memory, faults, store) = stack(5);
    let etag = memory
        .put("k", Bytes::from_static(b"v1"), PutCondition::IfNoneMatch)
        .await
        .expect("seed");
    faults.inject(Fault::lose_reply(Op::PutIfMatch));
    let result = store
        .put("k", Bytes::from_static(b"v2"), PutCondition::IfMatch(etag))
        .await;
    match &result {
        Err(
            error @ Error::Unavailable {
                outcome: Outcome::Unknown,
                ..
            },
        ) => assert!(error.may_have_applied()),
        other => panic!("expected an unknown outcome, got {other:?}"),
    }
    assert_eq!(faults.counts().get(Op::PutIfMatch), 1, "never resent");
    assert_eq!(
        memory.get("k").await.expect("get").body,
        "v2",
        "the write happened although the reply was lost"
    );
}

#[tokio::test]
async fn precondition_failures_are_never_retried() {
    let (_memory, faults, store) = stack(5);
    store
        .put("k", Bytes::from_static(b"v1"), PutCondition::IfNoneMatch)
        .await
        .expect("create");
    faults.reset_counts();
    let result = store
        .put("k", Bytes::from_static(b"v2"), PutCondition::IfNoneMatch)
        .await;
    assert!(matches!(result, Err(Error::PreconditionFailed { .. })));
    assert_eq!(faults.counts().get(Op::PutIfNoneMatch), 1);

    faults.inject(Fault::fail(
        Some(Op::PutIfMatch),
        Error::Conflict { key: String::new() },
    ));
    let etag = store.head("k").await.expect("head").etag;
    let result = store
        .put("k", Bytes::from_static(b"v3"), PutCondition::IfMatch(etag))
        .await;
    assert!(matches!(result, Err(Error::Conflict { ref key }) if key == "k"));
    assert_eq!(faults.counts().get(Op::PutIfMatch), 1, "409 is not resent");
}

#[tokio::test]
async fn rules_match_by_key_prefix_and_skip_count() {
    let (_memory, faults, store) = stack(1);
    faults.inject(
        Fault::unavailable(Op::PutIfNoneMatch)
            .key_prefix("a/")
            .after(1),
    );
    let put =
        |key: &'static str| store.put(key, Bytes::from_static(b"x"), PutCondition::IfNoneMatch);
    put("a/1").await.expect("first call passes (after 1)");
    put("b/1").await.expect("other prefix passes");
    assert!(put("a/2").await.is_err(), "second matching call fails");
    put("a/3").await.expect("rule used up (times 1)");
    let counts = faults.counts();
    assert_eq!(counts.get(Op::PutIfNoneMatch), 4);
    assert_eq!(counts.writes(), 4);
    assert_eq!(counts.reads(), 0);
}

#[tokio::test(start_paused = true)]
async fn latency_is_added() {
    let (_memory, faults, store) = stack(1);
    faults.inject(Fault::delay(None, Duration::from_millis(250)).times(u64::MAX));
    let start = tokio::time::Instant::now();
    let result = store.get("missing").await;
    assert!(matches!(result, Err(Error::NotFound { .. })));
    assert_eq!(start.elapsed(), Duration::from_millis(250));
}
