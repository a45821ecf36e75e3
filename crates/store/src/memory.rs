//! An in-process object store with the same conditional-write semantics, for unit tests.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Mutex;

use async_trait::async_trait;
use bytes::Bytes;

use crate::error::{Error, Result};
use crate::key::{clamp_range, validate_key, validate_prefix};
use crate::object::{content_etag, ETag, ListEntry, ListPage, Object, PutCondition};
use crate::{ObjectStore, LIST_PAGE_KEYS_MAX};

/// An object store held in memory (lost when dropped). ETags are SHA-256
/// content hashes, as on [`crate::LocalStore`].
#[derive(Debug, Default)]
pub struct MemoryStore {
    objects: Mutex<BTreeMap<String, (Bytes, ETag)>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn objects(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, (Bytes, ETag)>> {
        // A panic while holding the lock cannot leave the map half-updated
        // (every update is one insert or remove), so poison is harmless.
        self.objects.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl ObjectStore for MemoryStore {
    async fn get(&self, key: &str) -> Result<Object> {
        validate_key(key)?;
        let objects = self.objects();
        let (body, etag) = objects.get(key).ok_or_else(|| Error::NotFound {
            key: key.to_owned(),
        })?;
        Ok(Object {
            size: body.len() as u64,
            body: body.clone(),
            etag: etag.clone(),
        })
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Object> {
        let object = self.get(key).await?;
        let slice = clamp_range(key, &range, object.size)?;
        Ok(Object {
            body: object.body.slice(slice),
            ..object
        })
    }

    async fn put(&self, key: &str, body: Bytes, condition: PutCondition) -> Result<ETag> {
        validate_key(key)?;
        let mut objects = self.objects();
        let current = objects.get(key).map(|(_, etag)| etag);
        let holds = match (&condition, current) {
            (PutCondition::Overwrite, _) => true,
            (PutCondition::IfNoneMatch, current) => current.is_none(),
            (PutCondition::IfMatch(expected), Some(current)) => expected == current,
            (PutCondition::IfMatch(_), None) => false,
        };
        if !holds {
            return Err(Error::PreconditionFailed {
                key: key.to_owned(),
            });
        }
        let etag = content_etag(&body);
        objects.insert(key.to_owned(), (body, etag.clone()));
        Ok(etag)
    }

    async fn delete(&self, key: &str) -> Result<()> {
        validate_key(key)?;
        self.objects().remove(key);
        Ok(())
    }

    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        max_keys: usize,
    ) -> Result<ListPage> {
        validate_prefix(prefix)?;
        let max_keys = max_keys.clamp(1, LIST_PAGE_KEYS_MAX);
        let objects = self.objects();
        let sorted = objects
            .range(prefix.to_owned()..)
            .take_while(|(key, _)| key.starts_with(prefix))
            .filter(|(key, _)| start_after.is_none_or(|after| key.as_str() > after))
            .map(|(key, (body, etag))| ListEntry {
                key: key.clone(),
                size: body.len() as u64,
                etag: Some(etag.clone()),
            });
        Ok(ListPage::first_of(sorted, max_keys))
    }

    fn describe(&self) -> String {
        "memory".to_owned()
    }
}
