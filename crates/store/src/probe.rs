//! Capability probe: does this store really honour conditional writes? Run at node start and by `cellfleet store probe`.
//!
//! Every check writes under a fresh `{base}/.probe/{random}/` prefix, and the
//! probe deletes what it wrote whatever the outcome (the last check verifies
//! the prefix is empty again). A store failing any check must not hold a
//! cluster's data: the report's [`ProbeReport::failure`] names the check and
//! what the failure means, for the operator.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::Barrier;

use crate::error::Error;
use crate::object::{ETag, PutCondition};
use crate::{list_all, ObjectStore};

/// Default number of concurrent writers in the race checks. Small on
/// purpose: some servers delay the losers of a contended key by seconds.
pub const DEFAULT_RACE_WRITERS: usize = 4;

/// One property the probe checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// The store answers at all (a read of a missing key gets an answer,
    /// even a refusal, rather than no connection or a timeout).
    Reachable,
    /// `If-None-Match: *` creates a missing object.
    CreateIfAbsent,
    /// `If-None-Match: *` is refused (412) on an existing object.
    RejectExisting,
    /// A read right after a write returns the written bytes and ETag.
    ReadAfterWrite,
    /// `If-Match` with the current ETag replaces the object and changes the ETag.
    ConditionalUpdate,
    /// `If-Match` with a stale ETag is refused (412).
    RejectStaleEtag,
    /// A range read returns exactly the requested bytes.
    RangeRead,
    /// Among N concurrent `If-None-Match: *` writers exactly one wins.
    RaceCreate,
    /// Among N concurrent `If-Match` writers with the same ETag exactly one wins.
    RaceUpdate,
    /// The probe's objects can be deleted and no longer list.
    Cleanup,
}

impl Check {
    /// Every check, in the order run.
    pub const ALL: [Check; 10] = [
        Check::Reachable,
        Check::CreateIfAbsent,
        Check::RejectExisting,
        Check::ReadAfterWrite,
        Check::ConditionalUpdate,
        Check::RejectStaleEtag,
        Check::RangeRead,
        Check::RaceCreate,
        Check::RaceUpdate,
        Check::Cleanup,
    ];

    /// A short name (`reject-stale-etag`).
    pub fn name(self) -> &'static str {
        match self {
            Check::Reachable => "reachable",
            Check::CreateIfAbsent => "create-if-absent",
            Check::RejectExisting => "reject-existing",
            Check::ReadAfterWrite => "read-after-write",
            Check::ConditionalUpdate => "conditional-update",
            Check::RejectStaleEtag => "reject-stale-etag",
            Check::RangeRead => "range-read",
            Check::RaceCreate => "race-create",
            Check::RaceUpdate => "race-update",
            Check::Cleanup => "cleanup",
        }
    }

    /// What a failure of this check means for a cluster.
    pub fn meaning(self) -> &'static str {
        match self {
            Check::Reachable => {
                "the store did not answer: check the endpoint (scheme, host and port) and \
                 that the server is running and reachable from here"
            }
            Check::CreateIfAbsent => {
                "this store refuses create-only writes (If-None-Match: *): check the bucket, \
                 credentials and permissions; Cellfleet cannot create roots or leases on it"
            }
            Check::RejectExisting => {
                "this store ignores If-None-Match: *: two nodes could both create the same \
                 root or lease; running a cluster on it can lose data"
            }
            Check::ReadAfterWrite => {
                "this store does not return what was just written: nodes could act on stale \
                 roots; running a cluster on it can lose data"
            }
            Check::ConditionalUpdate => {
                "this store mishandles If-Match updates (refused, or the ETag did not change \
                 with the content): roots and leases cannot be replaced safely"
            }
            Check::RejectStaleEtag => {
                "this store ignores If-Match: running a cluster on it can lose data"
            }
            Check::RangeRead => "this store does not serve byte ranges correctly",
            Check::RaceCreate => {
                "under concurrent create-only writes not exactly one writer won: two nodes \
                 could own the same Cell; running a cluster on it can lose data"
            }
            Check::RaceUpdate => {
                "under concurrent If-Match writes not exactly one writer won: two owners \
                 could publish to the same Cell; running a cluster on it can lose data"
            }
            Check::Cleanup => {
                "the probe could not delete its own objects (check delete/list permissions)"
            }
        }
    }
}

/// The result of one check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// It held.
    Passed,
    /// It did not hold; what was observed.
    Failed(String),
    /// Not run because an earlier check failed.
    Skipped,
}

/// The probe's findings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeReport {
    /// The store probed.
    pub store: String,
    /// Each check and its verdict, in order.
    pub checks: Vec<(Check, Verdict)>,
}

impl ProbeReport {
    /// Whether every check passed.
    pub fn passed(&self) -> bool {
        self.checks
            .iter()
            .all(|(_, verdict)| *verdict == Verdict::Passed)
    }

    /// The first failed check and what was observed.
    pub fn failure(&self) -> Option<(Check, &str)> {
        self.checks
            .iter()
            .find_map(|(check, verdict)| match verdict {
                Verdict::Failed(observed) => Some((*check, observed.as_str())),
                _ => None,
            })
    }

    /// The verdict of `check`.
    pub fn verdict(&self, check: Check) -> Option<&Verdict> {
        self.checks
            .iter()
            .find(|(c, _)| *c == check)
            .map(|(_, verdict)| verdict)
    }
}

impl fmt::Display for ProbeReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "store probe of {}", self.store)?;
        for (check, verdict) in &self.checks {
            match verdict {
                Verdict::Passed => writeln!(f, "  ok      {}", check.name())?,
                Verdict::Skipped => writeln!(f, "  skipped {}", check.name())?,
                Verdict::Failed(observed) => writeln!(
                    f,
                    "  FAILED  {}: {observed}\n          {}",
                    check.name(),
                    check.meaning()
                )?,
            }
        }
        if self.passed() {
            write!(
                f,
                "all checks passed: this store honours conditional writes"
            )
        } else {
            write!(f, "do not run a cluster on this store")
        }
    }
}

/// Runs every check under `{base}/.probe/{random}/` (`base` may be empty)
/// with `race_writers` concurrent writers in the race checks, then removes
/// the probe's objects.
pub async fn run(store: Arc<dyn ObjectStore>, base: &str, race_writers: usize) -> ProbeReport {
    let base = base.trim_matches('/');
    let root = if base.is_empty() {
        format!(".probe/{:016x}/", rand::random::<u64>())
    } else {
        format!("{base}/.probe/{:016x}/", rand::random::<u64>())
    };
    let mut probe = Probe {
        store,
        root,
        race_writers: race_writers.max(2),
        checks: Vec::new(),
    };
    probe.run_checks().await;
    probe.cleanup().await;
    ProbeReport {
        store: probe.store.describe(),
        checks: probe.checks,
    }
}

struct Probe {
    store: Arc<dyn ObjectStore>,
    root: String,
    race_writers: usize,
    checks: Vec<(Check, Verdict)>,
}

type Step<T> = std::result::Result<T, String>;

impl Probe {
    fn record<T>(&mut self, check: Check, step: Step<T>) -> Option<T> {
        match step {
            Ok(value) => {
                self.checks.push((check, Verdict::Passed));
                Some(value)
            }
            Err(observed) => {
                self.checks.push((check, Verdict::Failed(observed)));
                None
            }
        }
    }

    async fn run_checks(&mut self) {
        let key = format!("{}record", self.root);
        let first = Bytes::from_static(b"cellfleet probe record, version 1");
        let second = Bytes::from_static(b"cellfleet probe record, version 2");
        let step = self.reachable(&key).await;
        if self.record(Check::Reachable, step).is_none() {
            return;
        }
        let step = self.create_if_absent(&key, &first).await;
        let Some(first_etag) = self.record(Check::CreateIfAbsent, step) else {
            return;
        };
        let step = self.reject_existing(&key).await;
        self.record(Check::RejectExisting, step);
        let step = self.read_after_write(&key, &first, &first_etag).await;
        self.record(Check::ReadAfterWrite, step);
        let step = self.conditional_update(&key, &second, &first_etag).await;
        let Some(second_etag) = self.record(Check::ConditionalUpdate, step) else {
            return;
        };
        let step = self.reject_stale(&key, &first_etag).await;
        self.record(Check::RejectStaleEtag, step);
        let step = self.range_read(&key, &second, &second_etag).await;
        self.record(Check::RangeRead, step);
        let race_key = format!("{}race", self.root);
        let step = self.race(&race_key, None).await;
        let Some(race_etag) = self.record(Check::RaceCreate, step) else {
            return;
        };
        let step = self.race(&race_key, Some(race_etag)).await;
        self.record(Check::RaceUpdate, step);
    }

    /// Any answer of the server counts (a missing key's 404, or a refusal
    /// that the next checks explain); only no answer fails.
    async fn reachable(&self, key: &str) -> Step<()> {
        match self.store.head(key).await {
            Err(e @ Error::Unavailable { .. }) => Err(format!("no answer: {e}")),
            _ => Ok(()),
        }
    }

    async fn create_if_absent(&self, key: &str, body: &Bytes) -> Step<ETag> {
        self.store
            .put(key, body.clone(), PutCondition::IfNoneMatch)
            .await
            .map_err(|e| format!("creating a new object failed: {e}"))
    }

    async fn reject_existing(&self, key: &str) -> Step<()> {
        let body = Bytes::from_static(b"cellfleet probe: this write must be refused");
        match self.store.put(key, body, PutCondition::IfNoneMatch).await {
            Err(Error::PreconditionFailed { .. }) => Ok(()),
            Ok(_) => Err("a create-only write over an existing object succeeded".to_owned()),
            Err(e) => Err(format!("expected 412 Precondition Failed, got: {e}")),
        }
    }

    async fn read_after_write(&self, key: &str, body: &Bytes, etag: &ETag) -> Step<()> {
        let object = self
            .store
            .get(key)
            .await
            .map_err(|e| format!("reading the object just written failed: {e}"))?;
        if object.body != *body {
            return Err("the bytes read differ from the bytes written".to_owned());
        }
        if object.etag != *etag {
            return Err(format!(
                "the ETag read ({}) differs from the one the write returned ({etag})",
                object.etag
            ));
        }
        Ok(())
    }

    async fn conditional_update(&self, key: &str, body: &Bytes, etag: &ETag) -> Step<ETag> {
        let new_etag = self
            .store
            .put(key, body.clone(), PutCondition::IfMatch(etag.clone()))
            .await
            .map_err(|e| format!("a replace with the current ETag failed: {e}"))?;
        if new_etag == *etag {
            return Err(format!("the ETag stayed {etag} although the bytes changed"));
        }
        let read = self
            .store
            .get(key)
            .await
            .map_err(|e| format!("reading the replaced object failed: {e}"))?;
        if read.body != *body || read.etag != new_etag {
            return Err("a read after the replace did not return the new version".to_owned());
        }
        Ok(new_etag)
    }

    async fn reject_stale(&self, key: &str, stale: &ETag) -> Step<()> {
        let body = Bytes::from_static(b"cellfleet probe: this stale write must be refused");
        match self
            .store
            .put(key, body, PutCondition::IfMatch(stale.clone()))
            .await
        {
            Err(Error::PreconditionFailed { .. }) => Ok(()),
            Ok(_) => Err("a replace with a stale ETag succeeded".to_owned()),
            Err(e) => Err(format!("expected 412 Precondition Failed, got: {e}")),
        }
    }

    async fn range_read(&self, key: &str, body: &Bytes, etag: &ETag) -> Step<()> {
        let object = self
            .store
            .get_range(key, 3..11)
            .await
            .map_err(|e| format!("a range read failed: {e}"))?;
        if object.body != body.slice(3..11) {
            return Err(format!(
                "bytes 3..11 read as {:?}, expected {:?}",
                object.body,
                body.slice(3..11)
            ));
        }
        if object.etag != *etag || object.size != body.len() as u64 {
            return Err("a range read reported another version or size".to_owned());
        }
        Ok(())
    }

    /// N writers race on `key`: create-only if `etag` is `None`, else
    /// replace-if-match. Exactly one must win, the rest see 412 or 409, and
    /// the object must then hold the winner's bytes.
    async fn race(&self, key: &str, etag: Option<ETag>) -> Step<ETag> {
        let barrier = Arc::new(Barrier::new(self.race_writers));
        let mut tasks = Vec::with_capacity(self.race_writers);
        for writer in 0..self.race_writers {
            let store = Arc::clone(&self.store);
            let barrier = Arc::clone(&barrier);
            let key = key.to_owned();
            let condition = match &etag {
                None => PutCondition::IfNoneMatch,
                Some(etag) => PutCondition::IfMatch(etag.clone()),
            };
            let body = Bytes::from(format!(
                "cellfleet probe race writer {writer} of {:?}",
                etag
            ));
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                let result = store.put(&key, body.clone(), condition).await;
                (body, result)
            }));
        }
        let mut winners = Vec::new();
        for task in tasks {
            let (body, result) = task.await.map_err(|e| format!("writer task failed: {e}"))?;
            match result {
                Ok(etag) => winners.push((body, etag)),
                Err(Error::PreconditionFailed { .. } | Error::Conflict { .. }) => {}
                Err(e) => return Err(format!("a racing writer failed unexpectedly: {e}")),
            }
        }
        let [(body, winner_etag)] = winners.as_slice() else {
            return Err(format!(
                "{} of {} writers succeeded",
                winners.len(),
                self.race_writers
            ));
        };
        let read = self
            .store
            .get(key)
            .await
            .map_err(|e| format!("reading the raced object failed: {e}"))?;
        if read.body != *body || read.etag != *winner_etag {
            return Err("the raced object does not hold the winner's bytes".to_owned());
        }
        Ok(winner_etag.clone())
    }

    async fn cleanup(&mut self) {
        let step = self.delete_all().await;
        let ran_all = self.checks.len() == Check::ALL.len() - 1;
        if !ran_all {
            for check in Check::ALL {
                if check != Check::Cleanup && self.checks.iter().all(|(c, _)| *c != check) {
                    self.checks.push((check, Verdict::Skipped));
                }
            }
        }
        self.record(Check::Cleanup, step);
        self.checks
            .sort_by_key(|(check, _)| Check::ALL.iter().position(|c| c == check));
    }

    async fn delete_all(&self) -> Step<()> {
        let store = self.store.as_ref();
        let entries = list_all(store, &self.root, 1000)
            .await
            .map_err(|e| format!("listing the probe's objects failed: {e}"))?;
        for entry in &entries {
            store
                .delete(&entry.key)
                .await
                .map_err(|e| format!("deleting {} failed: {e}", entry.key))?;
        }
        // Delete the known keys too, in case listing lags behind writes.
        for name in ["record", "race"] {
            let key = format!("{}{name}", self.root);
            store
                .delete(&key)
                .await
                .map_err(|e| format!("deleting {key} failed: {e}"))?;
        }
        let left = list_all(store, &self.root, 1000)
            .await
            .map_err(|e| format!("listing after cleanup failed: {e}"))?;
        if !left.is_empty() {
            return Err(format!(
                "{} probe objects remain after deleting",
                left.len()
            ));
        }
        Ok(())
    }
}
