//! A fault-injecting, operation-counting store wrapper for tests of failure paths.
//!
//! Rules are matched in the order added; the first matching rule with
//! attempts left acts. Actions: fail before reaching the store, add latency,
//! or perform the call and then lose the reply ("succeeded but the caller
//! never heard": [`Error::Unavailable`] with [`Outcome::Unknown`]), or
//! report that at once and perform the call later ("the client timed out,
//! the server applied it afterwards": [`Fault::land_late`]). Every call
//! reaching the wrapper is counted per [`Op`], so runtime tests can assert
//! e.g. "zero authority GETs while the lease is live".

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use crate::error::{Error, Outcome, Result};
use crate::object::{ETag, ListPage, Object, ObjectMeta, Op, PutCondition};
use crate::ObjectStore;

/// What a matching [`Fault`] does.
#[derive(Clone, Debug)]
enum Action {
    Fail(Error),
    LoseReply,
    Delay(Duration),
    LandLate(Duration),
}

/// One fault rule. Build with [`Fault::fail`], [`Fault::lose_reply`] or
/// [`Fault::delay`], then narrow with [`Fault::key_prefix`], [`Fault::after`]
/// and [`Fault::times`].
#[derive(Clone, Debug)]
pub struct Fault {
    op: Option<Op>,
    key_prefix: String,
    skip: u64,
    times: u64,
    action: Action,
}

impl Fault {
    fn new(op: Option<Op>, action: Action) -> Self {
        Self {
            op,
            key_prefix: String::new(),
            skip: 0,
            times: 1,
            action,
        }
    }

    /// Fail calls of `op` (any op if `None`) with `error`, without reaching the store.
    pub fn fail(op: Option<Op>, error: Error) -> Self {
        Self::new(op, Action::Fail(error))
    }

    /// Fail calls of `op` with a transient [`Error::Unavailable`] that was
    /// not applied.
    pub fn unavailable(op: Op) -> Self {
        Self::fail(
            Some(op),
            Error::Unavailable {
                op,
                key: String::new(),
                outcome: Outcome::NotApplied,
                message: "injected fault".to_owned(),
            },
        )
    }

    /// Perform calls of `op`, then report [`Error::Unavailable`] with
    /// [`Outcome::Unknown`] instead of the real reply.
    pub fn lose_reply(op: Op) -> Self {
        Self::new(Some(op), Action::LoseReply)
    }

    /// Report calls of `op` as [`Error::Unavailable`] with
    /// [`Outcome::Unknown`] at once (a client-side timeout), and perform
    /// each `after` later in a task of its own, as a server that applies a
    /// request whose client gave up does. Its condition is checked then.
    pub fn land_late(op: Op, after: Duration) -> Self {
        Self::new(Some(op), Action::LandLate(after))
    }

    /// Delay calls of `op` (any op if `None`) by `latency`.
    pub fn delay(op: Option<Op>, latency: Duration) -> Self {
        Self::new(op, Action::Delay(latency))
    }

    /// Only calls whose key (or listing prefix) starts with `prefix`.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// Let the first `calls` matching calls through untouched.
    pub fn after(mut self, calls: u64) -> Self {
        self.skip = calls;
        self
    }

    /// Act on this many matching calls (default 1; `u64::MAX` for always).
    pub fn times(mut self, calls: u64) -> Self {
        self.times = calls;
        self
    }

    fn matches(&self, op: Op, key: &str) -> bool {
        self.op.is_none_or(|wanted| wanted == op) && key.starts_with(&self.key_prefix)
    }
}

/// A snapshot of per-operation call counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpCounts([u64; Op::ALL.len()]);

impl OpCounts {
    pub(crate) fn load(counters: &[AtomicU64; Op::ALL.len()]) -> Self {
        let mut counts = OpCounts::default();
        for op in Op::ALL {
            counts.0[op.index()] = counters[op.index()].load(Ordering::Relaxed);
        }
        counts
    }

    /// Calls of `op`.
    pub fn get(&self, op: Op) -> u64 {
        self.0[op.index()]
    }

    /// Calls of any kind.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// Reads of any kind (get, range get, head, list).
    pub fn reads(&self) -> u64 {
        [Op::Get, Op::GetRange, Op::Head, Op::List]
            .into_iter()
            .map(|op| self.get(op))
            .sum()
    }

    /// Writes of any kind (puts and deletes).
    pub fn writes(&self) -> u64 {
        self.total() - self.reads()
    }
}

/// Wraps a store with fault rules and per-operation counters.
#[derive(Debug)]
pub struct FaultStore {
    inner: Arc<dyn ObjectStore>,
    rules: Mutex<Vec<Fault>>,
    counts: [AtomicU64; Op::ALL.len()],
}

impl FaultStore {
    /// Wraps `inner` with no faults.
    pub fn new(inner: Arc<dyn ObjectStore>) -> Self {
        Self {
            inner,
            rules: Mutex::new(Vec::new()),
            counts: Default::default(),
        }
    }

    /// Adds a rule (after the existing ones).
    pub fn inject(&self, fault: Fault) {
        self.rules().push(fault);
    }

    /// Removes every rule.
    pub fn clear(&self) {
        self.rules().clear();
    }

    /// Calls so far, per operation.
    pub fn counts(&self) -> OpCounts {
        OpCounts::load(&self.counts)
    }

    /// Resets the counters to zero.
    pub fn reset_counts(&self) {
        for count in &self.counts {
            count.store(0, Ordering::Relaxed);
        }
    }

    fn rules(&self) -> std::sync::MutexGuard<'_, Vec<Fault>> {
        self.rules.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts the call and picks the action of the first rule that fires.
    fn arrive(&self, op: Op, key: &str) -> Option<Action> {
        self.counts[op.index()].fetch_add(1, Ordering::Relaxed);
        let mut rules = self.rules();
        for rule in rules.iter_mut() {
            if !rule.matches(op, key) || rule.times == 0 {
                continue;
            }
            if rule.skip > 0 {
                rule.skip -= 1;
                continue;
            }
            rule.times -= 1;
            return Some(rule.action.clone());
        }
        None
    }

    async fn call<T, F>(&self, op: Op, key: &str, call: F) -> Result<T>
    where
        F: std::future::Future<Output = Result<T>> + Send,
    {
        self.act(self.arrive(op, key), op, key, call).await
    }

    async fn act<T, F>(&self, action: Option<Action>, op: Op, key: &str, call: F) -> Result<T>
    where
        F: std::future::Future<Output = Result<T>> + Send,
    {
        match action {
            Some(Action::LandLate(_)) => Err(Error::Unavailable {
                op,
                key: key.to_owned(),
                outcome: Outcome::NotApplied,
                message: "injected fault: land-late applies to puts only".to_owned(),
            }),
            None => call.await,
            Some(Action::Delay(latency)) => {
                tokio::time::sleep(latency).await;
                call.await
            }
            Some(Action::Fail(error)) => Err(with_key(error, op, key)),
            Some(Action::LoseReply) => {
                let _lost = call.await;
                Err(Error::Unavailable {
                    op,
                    key: key.to_owned(),
                    outcome: Outcome::Unknown,
                    message: "injected fault: reply lost".to_owned(),
                })
            }
        }
    }
}

fn with_key(error: Error, op: Op, key: &str) -> Error {
    match error {
        Error::Unavailable {
            outcome, message, ..
        } => Error::Unavailable {
            op,
            key: key.to_owned(),
            outcome,
            message,
        },
        Error::PreconditionFailed { .. } => Error::PreconditionFailed {
            key: key.to_owned(),
        },
        Error::Conflict { .. } => Error::Conflict {
            key: key.to_owned(),
        },
        other => other,
    }
}

#[async_trait]
impl ObjectStore for FaultStore {
    async fn get(&self, key: &str) -> Result<Object> {
        self.call(Op::Get, key, self.inner.get(key)).await
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Object> {
        self.call(Op::GetRange, key, self.inner.get_range(key, range))
            .await
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta> {
        self.call(Op::Head, key, self.inner.head(key)).await
    }

    async fn put(&self, key: &str, body: Bytes, condition: PutCondition) -> Result<ETag> {
        let op = Op::of_put(&condition);
        let action = self.arrive(op, key);
        if let Some(Action::LandLate(after)) = action {
            let inner = self.inner.clone();
            let late_key = key.to_owned();
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                let _ = inner.put(&late_key, body, condition).await;
            });
            return Err(Error::Unavailable {
                op,
                key: key.to_owned(),
                outcome: Outcome::Unknown,
                message: "injected fault: timed out (the write lands later)".to_owned(),
            });
        }
        self.act(action, op, key, self.inner.put(key, body, condition))
            .await
    }

    async fn delete(&self, key: &str) -> Result<()> {
        self.call(Op::Delete, key, self.inner.delete(key)).await
    }

    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        max_keys: usize,
    ) -> Result<ListPage> {
        self.call(
            Op::List,
            prefix,
            self.inner.list(prefix, start_after, max_keys),
        )
        .await
    }

    fn describe(&self) -> String {
        format!("fault-injecting {}", self.inner.describe())
    }
}
