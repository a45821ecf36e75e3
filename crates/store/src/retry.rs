//! Bounded retries with full jitter, for transient errors only.
//!
//! What is retried: [`Error::Unavailable`] on idempotent operations (reads,
//! listings, deletes, unconditional puts), and on conditional puts only when
//! the store provably did not apply the request ([`Outcome::NotApplied`]).
//! What is never retried: a 412 ([`Error::PreconditionFailed`]), a 409
//! ([`Error::Conflict`]: re-read instead), and a conditional put whose outcome
//! is unknown — resending it could report a 412 for our own write, so the
//! caller must reconcile by re-reading (see `cellfleet-authority`).

use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use rand::Rng;

use crate::error::{Error, Outcome, Result};
use crate::object::{ETag, ListPage, Object, ObjectMeta, Op, PutCondition};
use crate::ObjectStore;

/// How many times and how patiently to retry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Total attempts including the first (1 = no retries).
    pub attempts_max: u32,
    /// Delay cap of the first retry; doubles per retry.
    pub base_delay: Duration,
    /// Upper bound of any single delay.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts_max: 4,
            base_delay: Duration::from_millis(50),
            max_delay: Duration::from_secs(2),
        }
    }
}

impl RetryPolicy {
    /// No retries.
    pub fn none() -> Self {
        Self {
            attempts_max: 1,
            ..Self::default()
        }
    }

    /// The delay before retry number `retry` (0-based): uniform in
    /// `0..=min(max_delay, base_delay * 2^retry)` ("full jitter", so
    /// contending clients spread out).
    pub fn delay(&self, retry: u32) -> Duration {
        let cap = self
            .base_delay
            .saturating_mul(1_u32.checked_shl(retry.min(31)).unwrap_or(u32::MAX))
            .min(self.max_delay);
        let cap_micros = u64::try_from(cap.as_micros()).unwrap_or(u64::MAX);
        Duration::from_micros(rand::rng().random_range(0..=cap_micros))
    }

    /// Whether `error` from an `op` may be retried.
    pub fn should_retry(op: Op, error: &Error) -> bool {
        match error {
            Error::Unavailable { outcome, .. } => {
                op.is_idempotent() || *outcome == Outcome::NotApplied
            }
            _ => false,
        }
    }

    /// Runs `attempt` until it succeeds, fails for good, or attempts run out.
    pub async fn run<T, F, Fut>(&self, op: Op, mut attempt: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let mut retry = 0;
        loop {
            match attempt().await {
                Ok(value) => return Ok(value),
                Err(error) if retry + 1 < self.attempts_max && Self::should_retry(op, &error) => {
                    let delay = self.delay(retry);
                    tracing::debug!(%op, retry, ?delay, %error, "retrying store operation");
                    tokio::time::sleep(delay).await;
                    retry += 1;
                }
                Err(error) => return Err(error),
            }
        }
    }
}

/// Wraps a store with a [`RetryPolicy`].
#[derive(Debug, Clone)]
pub struct RetryStore {
    inner: Arc<dyn ObjectStore>,
    policy: RetryPolicy,
}

impl RetryStore {
    /// Retries `inner`'s transient failures under `policy`.
    pub fn new(inner: Arc<dyn ObjectStore>, policy: RetryPolicy) -> Self {
        Self { inner, policy }
    }
}

#[async_trait]
impl ObjectStore for RetryStore {
    async fn get(&self, key: &str) -> Result<Object> {
        self.policy.run(Op::Get, || self.inner.get(key)).await
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Object> {
        self.policy
            .run(Op::GetRange, || self.inner.get_range(key, range.clone()))
            .await
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta> {
        self.policy.run(Op::Head, || self.inner.head(key)).await
    }

    async fn put(&self, key: &str, body: Bytes, condition: PutCondition) -> Result<ETag> {
        self.policy
            .run(Op::of_put(&condition), || {
                self.inner.put(key, body.clone(), condition.clone())
            })
            .await
    }

    async fn delete(&self, key: &str) -> Result<()> {
        self.policy.run(Op::Delete, || self.inner.delete(key)).await
    }

    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        max_keys: usize,
    ) -> Result<ListPage> {
        self.policy
            .run(Op::List, || self.inner.list(prefix, start_after, max_keys))
            .await
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_are_bounded() {
        let policy = RetryPolicy {
            attempts_max: 10,
            base_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(100),
        };
        for retry in 0..40 {
            let delay = policy.delay(retry);
            assert!(delay <= Duration::from_millis(100), "{retry}: {delay:?}");
            if retry == 0 {
                assert!(delay <= Duration::from_millis(10));
            }
        }
    }

    #[test]
    fn conditional_puts_with_unknown_outcome_are_not_retried() {
        let unknown = Error::Unavailable {
            op: Op::PutIfMatch,
            key: "k".into(),
            outcome: Outcome::Unknown,
            message: "timeout".into(),
        };
        let not_applied = Error::Unavailable {
            op: Op::PutIfMatch,
            key: "k".into(),
            outcome: Outcome::NotApplied,
            message: "throttled".into(),
        };
        assert!(!RetryPolicy::should_retry(Op::PutIfMatch, &unknown));
        assert!(RetryPolicy::should_retry(Op::PutIfMatch, &not_applied));
        assert!(RetryPolicy::should_retry(Op::Get, &unknown));
        assert!(!RetryPolicy::should_retry(
            Op::PutIfMatch,
            &Error::PreconditionFailed { key: "k".into() }
        ));
        assert!(!RetryPolicy::should_retry(
            Op::PutIfNoneMatch,
            &Error::Conflict { key: "k".into() }
        ));
    }
}
