//! Per-operation request and failure counters around any store, for a node's metrics: where the bucket's load comes from.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use crate::{ETag, ListPage, Object, ObjectMeta, ObjectStore, Op, OpCounts, PutCondition, Result};

/// Counts every call into `inner` by operation, and the calls that failed.
/// A failed precondition or a missing key is an answer, not a failure.
#[derive(Debug)]
pub struct MeteredStore {
    inner: Arc<dyn ObjectStore>,
    calls: [AtomicU64; Op::ALL.len()],
    failures: [AtomicU64; Op::ALL.len()],
}

impl MeteredStore {
    /// Wraps `inner` with every counter at zero.
    pub fn new(inner: Arc<dyn ObjectStore>) -> Self {
        MeteredStore {
            inner,
            calls: Default::default(),
            failures: Default::default(),
        }
    }

    /// Calls so far, per operation.
    pub fn calls(&self) -> OpCounts {
        OpCounts::load(&self.calls)
    }

    /// Calls that failed (unavailable, throttled, refused by the server),
    /// per operation.
    pub fn failures(&self) -> OpCounts {
        OpCounts::load(&self.failures)
    }

    fn count<T>(&self, op: Op, result: Result<T>) -> Result<T> {
        self.calls[op.index()].fetch_add(1, Ordering::Relaxed);
        if let Err(error) = &result {
            if !matches!(
                error,
                crate::Error::NotFound { .. }
                    | crate::Error::PreconditionFailed { .. }
                    | crate::Error::Conflict { .. }
            ) {
                self.failures[op.index()].fetch_add(1, Ordering::Relaxed);
            }
        }
        result
    }
}

#[async_trait]
impl ObjectStore for MeteredStore {
    async fn get(&self, key: &str) -> Result<Object> {
        self.count(Op::Get, self.inner.get(key).await)
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Object> {
        self.count(Op::GetRange, self.inner.get_range(key, range).await)
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta> {
        self.count(Op::Head, self.inner.head(key).await)
    }

    async fn put(&self, key: &str, body: Bytes, condition: PutCondition) -> Result<ETag> {
        let op = Op::of_put(&condition);
        self.count(op, self.inner.put(key, body, condition).await)
    }

    async fn delete(&self, key: &str) -> Result<()> {
        self.count(Op::Delete, self.inner.delete(key).await)
    }

    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        max_keys: usize,
    ) -> Result<ListPage> {
        self.count(
            Op::List,
            self.inner.list(prefix, start_after, max_keys).await,
        )
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Fault, FaultStore, MemoryStore};

    #[tokio::test]
    async fn every_call_is_counted_by_operation_and_only_real_failures_as_failures() {
        let faults = Arc::new(FaultStore::new(Arc::new(MemoryStore::new())));
        let store = MeteredStore::new(faults.clone());
        store
            .put("a", Bytes::from_static(b"1"), PutCondition::IfNoneMatch)
            .await
            .unwrap();
        // A refused precondition and a missing key are answers.
        assert!(store
            .put("a", Bytes::from_static(b"2"), PutCondition::IfNoneMatch)
            .await
            .is_err());
        assert!(store.get("missing").await.is_err());
        store.get("a").await.unwrap();
        faults.inject(Fault::unavailable(Op::Get));
        assert!(store.get("a").await.is_err());
        assert_eq!(store.calls().get(Op::PutIfNoneMatch), 2);
        assert_eq!(store.calls().get(Op::Get), 3);
        assert_eq!(store.calls().total(), 5);
        assert_eq!(store.failures().get(Op::Get), 1);
        assert_eq!(store.failures().total(), 1);
        assert_eq!(store.describe(), faults.describe());
    }
}
