//! Object store with conditional writes: the one interface through which Cellfleet touches its bucket.
//!
//! Everything durable in Cellfleet lives in an object store, and its
//! correctness rests on two conditional writes (DESIGN.md §5):
//!
//! * create-only, `If-None-Match: *` ([`PutCondition::IfNoneMatch`]), and
//! * replace-if-unchanged, `If-Match: <etag>` ([`PutCondition::IfMatch`]).
//!
//! A failed precondition is [`Error::PreconditionFailed`] (HTTP 412); a
//! concurrent conditional write that the server refused to order is
//! [`Error::Conflict`] (HTTP 409): re-read and decide again. Neither is ever
//! retried by this crate. A write whose reply was lost is
//! [`Error::Unavailable`] with [`Outcome::Unknown`]: the caller must re-read
//! and reconcile, because the write may or may not have happened.
//!
//! Backends, all behind the object-safe [`ObjectStore`] trait:
//!
//! * [`S3Store`] — aws-sdk-s3 against AWS S3, RustFS, MinIO or SeaweedFS;
//! * [`LocalStore`] — an embedded directory with the same semantics across
//!   processes (file locks, temp + fsync + rename + directory fsync);
//! * [`MemoryStore`] — in-process, for unit tests;
//!
//! and wrappers: [`RetryStore`] (bounded retries with jitter, used by
//! [`open`] for S3), [`MeteredStore`] (per-operation calls and failures, for
//! a node's metrics) and [`FaultStore`] (latency, injected errors, lost
//! replies, and per-operation counters for tests).
//!
//! [`probe::run`] checks that a store really honours the preconditions before
//! a node trusts it with data.
//!
//! ETags are content hashes on S3 (and on [`LocalStore`]), so identical bytes
//! give identical ETags: every mutable record written through this crate must
//! carry a counter or nonce so its bytes never repeat (no A→B→A).

mod config;
mod error;
mod fault;
mod key;
mod local;
mod memory;
mod metered;
mod object;
pub mod probe;
mod retry;
mod s3;
/// Test support (feature `testkit`: for this workspace's tests and examples).
#[cfg(feature = "testkit")]
pub mod testkit;

use std::fmt::Debug;
use std::ops::Range;

use async_trait::async_trait;
use bytes::Bytes;

pub use config::{open, S3Config, StoreConfig, ENV_ENDPOINT};
pub use error::{Error, Outcome, Result};
pub use fault::{Fault, FaultStore, OpCounts};
pub use key::validate_key;
pub use local::LocalStore;
pub use memory::MemoryStore;
pub use metered::MeteredStore;
pub use object::{ETag, ListEntry, ListPage, Object, ObjectMeta, Op, PutCondition, KEY_BYTES_MAX};
pub use retry::{RetryPolicy, RetryStore};
pub use s3::S3Store;

/// Maximum keys returned by one [`ObjectStore::list`] page (S3's own limit).
pub const LIST_PAGE_KEYS_MAX: usize = 1000;

/// An object store with conditional writes.
///
/// Object-safe so the runtime can hold an `Arc<dyn ObjectStore>`. Keys are
/// `/`-separated relative paths (see [`validate_key`]). Bodies are in memory:
/// the records and LTX files Cellfleet stores are bounded.
#[async_trait]
pub trait ObjectStore: Send + Sync + Debug {
    /// Reads a whole object and its ETag. [`Error::NotFound`] if absent.
    async fn get(&self, key: &str) -> Result<Object>;

    /// Reads the bytes `range` of an object (end exclusive, clamped to the
    /// object's size, like HTTP `Range`). The ETag is the whole object's.
    /// [`Error::InvalidRange`] if the range is empty or starts past the end.
    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Object>;

    /// Reads an object's ETag and size without its body. The default reads
    /// the whole object, which is right only for stores where a read costs
    /// no more than a stat (memory, local files); remote stores override it.
    async fn head(&self, key: &str) -> Result<ObjectMeta> {
        let object = self.get(key).await?;
        Ok(ObjectMeta {
            etag: object.etag,
            size: object.size,
        })
    }

    /// Writes an object if `condition` holds, atomically, and returns the new
    /// ETag. [`Error::PreconditionFailed`] if it does not hold (for
    /// [`PutCondition::IfMatch`] on a missing key too: some servers answer
    /// 404, some 412; this crate always reports `PreconditionFailed`).
    async fn put(&self, key: &str, body: Bytes, condition: PutCondition) -> Result<ETag>;

    /// Deletes an object. Deleting a missing object succeeds.
    async fn delete(&self, key: &str) -> Result<()>;

    /// Lists keys starting with `prefix` in lexicographic order, at most
    /// `max_keys` (capped at [`LIST_PAGE_KEYS_MAX`]) after `start_after`.
    /// Continue with the returned [`ListPage::next_start_after`].
    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        max_keys: usize,
    ) -> Result<ListPage>;

    /// A short human description ("s3 http://127.0.0.1:8333 bucket b").
    fn describe(&self) -> String;
}

/// Lists every key under `prefix`, paging through [`ObjectStore::list`].
/// Fails with [`Error::TooMany`] rather than growing past `keys_max`.
pub async fn list_all(
    store: &dyn ObjectStore,
    prefix: &str,
    keys_max: usize,
) -> Result<Vec<ListEntry>> {
    let mut entries = Vec::new();
    let mut start_after: Option<String> = None;
    loop {
        let page = store
            .list(prefix, start_after.as_deref(), LIST_PAGE_KEYS_MAX)
            .await?;
        entries.extend(page.entries);
        if entries.len() > keys_max {
            return Err(Error::TooMany {
                prefix: prefix.to_owned(),
                limit: keys_max,
            });
        }
        match page.next_start_after {
            Some(next) => start_after = Some(next),
            None => return Ok(entries),
        }
    }
}
