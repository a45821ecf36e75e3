//! The embedded local-directory object store: S3's conditional-write semantics on a shared directory.
//!
//! Layout under the store's directory:
//!
//! ```text
//! objects/{key}        one file per object, the key's `/` as directories
//! .tmp/{pid}-{random}  bodies being written
//! .locks/{nn}.lock     64 lock stripes; a key uses stripe hash(key) % 64
//! ```
//!
//! Write ordering (every put): write the body to a temp file, `fsync` it;
//! take the key's stripe lock (an OS file lock, so it excludes other
//! processes sharing the directory, not just other tasks); check the
//! precondition against the current file; `rename` the temp file over the
//! object (atomic: readers see the old or the new bytes, never a mix);
//! `fsync` the object's directory so the rename survives a crash; release
//! the lock. Newly created directories are fsynced into their parents too.
//! A failure after the rename (the directory fsync) is an unknown outcome:
//! the bytes are visible, so it is never reported as "not applied".
//!
//! Reads take no lock: a rename is atomic, and the ETag is the SHA-256 of
//! the bytes actually read, so it is stable and always matches the body.
//!
//! Limitation: a key cannot be both an object and a "directory" of other
//! keys (`a/b` and `a/b/c`); S3 allows it, Cellfleet's layout never needs it.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use crate::error::{Error, Outcome, Result};
use crate::key::{clamp_range, validate_key, validate_prefix};
use crate::object::{content_etag, ETag, ListEntry, ListPage, Object, Op, PutCondition};
use crate::{ObjectStore, LIST_PAGE_KEYS_MAX};

const LOCK_STRIPES: u64 = 64;

/// An object store in a local directory, safe to share between processes.
#[derive(Debug, Clone)]
pub struct LocalStore {
    inner: Arc<Dirs>,
}

#[derive(Debug)]
struct Dirs {
    root: PathBuf,
    objects: PathBuf,
    tmp: PathBuf,
    locks: PathBuf,
}

impl LocalStore {
    /// Opens (creating if needed) a store in `dir`.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let root = dir.as_ref().to_path_buf();
        let dirs = Dirs {
            objects: root.join("objects"),
            tmp: root.join(".tmp"),
            locks: root.join(".locks"),
            root,
        };
        for dir in [&dirs.objects, &dirs.tmp, &dirs.locks] {
            fs::create_dir_all(dir).map_err(|e| {
                Error::Config(format!(
                    "cannot create store directory {}: {e}",
                    dir.display()
                ))
            })?;
        }
        Ok(Self {
            inner: Arc::new(dirs),
        })
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.inner.root
    }

    async fn blocking<T, F>(&self, op: Op, key: &str, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Dirs) -> Result<T> + Send + 'static,
    {
        let dirs = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || work(&dirs))
            .await
            .map_err(|e| Error::Io {
                op,
                key: key.to_owned(),
                message: format!("blocking task failed: {e}"),
            })?
    }
}

impl Dirs {
    fn path_of(&self, key: &str) -> PathBuf {
        let mut path = self.objects.clone();
        path.extend(key.split('/'));
        path
    }

    fn lock_key(&self, op: Op, key: &str) -> Result<File> {
        // FNV-1a: stable across processes and versions, unlike std's hasher.
        let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        let path = self.locks.join(format!("{:02}.lock", hash % LOCK_STRIPES));
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| Error::io(op, key, &e))?;
        file.lock().map_err(|e| Error::io(op, key, &e))?;
        Ok(file)
    }

    fn read(&self, op: Op, key: &str) -> Result<Option<Vec<u8>>> {
        match fs::read(self.path_of(key)) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if is_missing(&e) => Ok(None),
            Err(e) => Err(Error::io(op, key, &e)),
        }
    }

    fn put(&self, key: &str, body: &[u8], condition: &PutCondition) -> Result<ETag> {
        let op = Op::of_put(condition);
        let target = self.path_of(key);
        let parent = target.parent().expect("object paths are under objects/");
        ensure_dir(parent).map_err(|e| Error::io(op, key, &e))?;
        let tmp = self.tmp.join(format!(
            "{}-{:032x}",
            std::process::id(),
            rand::random::<u128>()
        ));
        let written = write_synced(&tmp, body);
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(Error::io(op, key, &e));
        }
        let result = self.commit(op, key, &tmp, &target, condition);
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result.map(|()| content_etag(body))
    }

    fn commit(
        &self,
        op: Op,
        key: &str,
        tmp: &Path,
        target: &Path,
        condition: &PutCondition,
    ) -> Result<()> {
        let _lock = self.lock_key(op, key)?;
        let holds = match condition {
            PutCondition::Overwrite => true,
            PutCondition::IfNoneMatch => match fs::symlink_metadata(target) {
                Ok(_) => false,
                Err(e) if is_missing(&e) => true,
                Err(e) => return Err(Error::io(op, key, &e)),
            },
            PutCondition::IfMatch(expected) => match self.read(op, key)? {
                Some(current) => content_etag(&current) == *expected,
                None => false,
            },
        };
        if !holds {
            return Err(Error::PreconditionFailed {
                key: key.to_owned(),
            });
        }
        fs::rename(tmp, target).map_err(|e| Error::io(op, key, &e))?;
        let parent = target.parent().expect("object paths are under objects/");
        // Renamed: the new bytes are visible to every reader. A failed
        // directory fsync may still lose them in a crash, so the outcome is
        // unknown (the caller reconciles by reading), never "not applied".
        sync_dir(parent).map_err(|e| Error::Unavailable {
            op,
            key: key.to_owned(),
            outcome: Outcome::Unknown,
            message: format!("written, but the directory fsync failed: {e}"),
        })
    }

    fn delete(&self, key: &str) -> Result<()> {
        let target = self.path_of(key);
        let _lock = self.lock_key(Op::Delete, key)?;
        match fs::remove_file(&target) {
            Ok(()) => {}
            Err(e) if is_missing(&e) => return Ok(()),
            Err(e) => return Err(Error::io(Op::Delete, key, &e)),
        }
        let parent = target.parent().expect("object paths are under objects/");
        sync_dir(parent).map_err(|e| Error::io(Op::Delete, key, &e))
    }

    fn list(&self, prefix: &str, start_after: Option<&str>, max_keys: usize) -> Result<ListPage> {
        // Walk only the deepest directory the prefix names completely.
        let dir_part = match prefix.rfind('/') {
            Some(slash) => &prefix[..slash],
            None => "",
        };
        let start_dir = if dir_part.is_empty() {
            self.objects.clone()
        } else {
            self.path_of(dir_part)
        };
        let mut keys = Vec::new();
        walk(&start_dir, dir_part, &mut keys).map_err(|e| Error::io(Op::List, prefix, &e))?;
        let mut entries: Vec<ListEntry> = keys
            .into_iter()
            .filter(|(key, _)| key.starts_with(prefix))
            .filter(|(key, _)| start_after.is_none_or(|after| key.as_str() > after))
            .map(|(key, size)| ListEntry {
                key,
                size,
                etag: None,
            })
            .collect();
        entries.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(ListPage::first_of(entries, max_keys))
    }
}

fn is_missing(error: &io::Error) -> bool {
    // ENOTDIR: a path component is a file, so the key cannot exist.
    matches!(
        error.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
    )
}

fn write_synced(path: &Path, body: &[u8]) -> io::Result<()> {
    let mut file = File::create_new(path)?;
    file.write_all(body)?;
    file.sync_all()
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Creates `dir` and missing parents, fsyncing each new entry into its parent.
fn ensure_dir(dir: &Path) -> io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    let parent = dir.parent().ok_or_else(|| io::Error::other("no parent"))?;
    ensure_dir(parent)?;
    match fs::create_dir(dir) {
        Ok(()) => sync_dir(parent),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

fn walk(dir: &Path, key_prefix: &str, out: &mut Vec<(String, u64)>) -> io::Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if is_missing(&e) => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        let key = if key_prefix.is_empty() {
            name
        } else {
            format!("{key_prefix}/{name}")
        };
        let file_type = entry.file_type()?;
        if file_type.is_dir() {
            walk(&entry.path(), &key, out)?;
        } else if file_type.is_file() {
            // A concurrent delete between read_dir and metadata is a miss.
            match entry.metadata() {
                Ok(meta) => out.push((key, meta.len())),
                Err(e) if is_missing(&e) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

#[async_trait]
impl ObjectStore for LocalStore {
    async fn get(&self, key: &str) -> Result<Object> {
        validate_key(key)?;
        let owned = key.to_owned();
        let bytes = self
            .blocking(Op::Get, key, move |dirs| dirs.read(Op::Get, &owned))
            .await?
            .ok_or_else(|| Error::NotFound {
                key: key.to_owned(),
            })?;
        Ok(Object {
            etag: content_etag(&bytes),
            size: bytes.len() as u64,
            body: Bytes::from(bytes),
        })
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Object> {
        // Read the whole file once so the body and the ETag come from the
        // same version even if a writer renames a new one in meanwhile.
        validate_key(key)?;
        let owned = key.to_owned();
        let bytes = self
            .blocking(Op::GetRange, key, move |dirs| {
                dirs.read(Op::GetRange, &owned)
            })
            .await?
            .ok_or_else(|| Error::NotFound {
                key: key.to_owned(),
            })?;
        let size = bytes.len() as u64;
        let slice = clamp_range(key, &range, size)?;
        let etag = content_etag(&bytes);
        Ok(Object {
            body: Bytes::from(bytes).slice(slice),
            etag,
            size,
        })
    }

    async fn put(&self, key: &str, body: Bytes, condition: PutCondition) -> Result<ETag> {
        validate_key(key)?;
        let owned = key.to_owned();
        self.blocking(Op::of_put(&condition), key, move |dirs| {
            dirs.put(&owned, &body, &condition)
        })
        .await
    }

    async fn delete(&self, key: &str) -> Result<()> {
        validate_key(key)?;
        let owned = key.to_owned();
        self.blocking(Op::Delete, key, move |dirs| dirs.delete(&owned))
            .await
    }

    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        max_keys: usize,
    ) -> Result<ListPage> {
        validate_prefix(prefix)?;
        let max_keys = max_keys.clamp(1, LIST_PAGE_KEYS_MAX);
        let owned = prefix.to_owned();
        let after = start_after.map(str::to_owned);
        self.blocking(Op::List, prefix, move |dirs| {
            dirs.list(&owned, after.as_deref(), max_keys)
        })
        .await
    }

    fn describe(&self) -> String {
        format!("local directory {}", self.inner.root.display())
    }
}
