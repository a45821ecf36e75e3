//! Object-store value types: ETags, objects, conditions, listings and operation kinds (key rules: [`crate::key`]).

use std::fmt;

use bytes::Bytes;

/// Longest key accepted, in bytes (S3's limit).
pub const KEY_BYTES_MAX: usize = 1024;

/// An entity tag: the store's version token of one object's bytes.
///
/// Stored without the surrounding quotes S3 puts on the wire. On S3 it is an
/// MD5 content hash (`-N` suffixed for multipart uploads); on
/// [`crate::LocalStore`] and [`crate::MemoryStore`] a SHA-256 content hash. In
/// every backend identical bytes give identical ETags.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ETag(String);

impl ETag {
    /// Wraps a raw ETag, stripping surrounding quotes and a weak prefix.
    pub fn new(raw: impl AsRef<str>) -> Self {
        let raw = raw.as_ref().trim();
        let raw = raw.strip_prefix("W/").unwrap_or(raw);
        Self(raw.trim_matches('"').to_owned())
    }

    /// The unquoted ETag.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The quoted form used in `If-Match` headers.
    pub fn quoted(&self) -> String {
        format!("\"{}\"", self.0)
    }
}

impl fmt::Debug for ETag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ETag({})", self.0)
    }
}

impl fmt::Display for ETag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An object's bytes (all of them, or a range) and the whole object's ETag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Object {
    /// The bytes read.
    pub body: Bytes,
    /// The ETag of the whole object.
    pub etag: ETag,
    /// The whole object's size in bytes.
    pub size: u64,
}

/// An object's metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectMeta {
    /// The object's ETag.
    pub etag: ETag,
    /// The object's size in bytes.
    pub size: u64,
}

/// The precondition of a [`crate::ObjectStore::put`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PutCondition {
    /// Unconditional overwrite. Only for data that is immutable by naming
    /// (content-addressed keys); never for records that fence writers.
    Overwrite,
    /// Create only: fails if the key exists (`If-None-Match: *`).
    IfNoneMatch,
    /// Replace only if the current ETag equals this one (`If-Match`).
    IfMatch(ETag),
}

impl PutCondition {
    /// Whether a resend of this put is harmless whatever happened to the
    /// first attempt (only unconditional puts are).
    pub fn is_idempotent(&self) -> bool {
        matches!(self, PutCondition::Overwrite)
    }
}

/// One key of a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListEntry {
    /// The full key.
    pub key: String,
    /// Size in bytes.
    pub size: u64,
    /// The ETag, where the backend reports it in listings.
    pub etag: Option<ETag>,
}

/// One page of a listing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListPage {
    /// Keys in lexicographic order.
    pub entries: Vec<ListEntry>,
    /// Where the next page starts (pass as `start_after`), `None` at the end.
    pub next_start_after: Option<String>,
}

impl ListPage {
    /// The first `max_keys` of `sorted` (entries in key order, already
    /// past `start_after`), and where the next page starts if more remain:
    /// the page rule of the backends that list themselves.
    pub(crate) fn first_of(sorted: impl IntoIterator<Item = ListEntry>, max_keys: usize) -> Self {
        let mut entries: Vec<ListEntry> = sorted.into_iter().take(max_keys + 1).collect();
        let next_start_after = if entries.len() > max_keys {
            entries.truncate(max_keys);
            entries.last().map(|entry| entry.key.clone())
        } else {
            None
        };
        ListPage {
            entries,
            next_start_after,
        }
    }
}

/// The kinds of store operation, for counters, fault rules and errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// [`crate::ObjectStore::get`]
    Get,
    /// [`crate::ObjectStore::get_range`]
    GetRange,
    /// [`crate::ObjectStore::head`]
    Head,
    /// [`crate::ObjectStore::put`] with [`PutCondition::Overwrite`]
    Put,
    /// [`crate::ObjectStore::put`] with [`PutCondition::IfNoneMatch`]
    PutIfNoneMatch,
    /// [`crate::ObjectStore::put`] with [`PutCondition::IfMatch`]
    PutIfMatch,
    /// [`crate::ObjectStore::delete`]
    Delete,
    /// [`crate::ObjectStore::list`]
    List,
}

impl Op {
    /// Every operation kind.
    pub const ALL: [Op; 8] = [
        Op::Get,
        Op::GetRange,
        Op::Head,
        Op::Put,
        Op::PutIfNoneMatch,
        Op::PutIfMatch,
        Op::Delete,
        Op::List,
    ];

    /// The operation kind of a put with this condition.
    pub fn of_put(condition: &PutCondition) -> Op {
        match condition {
            PutCondition::Overwrite => Op::Put,
            PutCondition::IfNoneMatch => Op::PutIfNoneMatch,
            PutCondition::IfMatch(_) => Op::PutIfMatch,
        }
    }

    /// Whether repeating the operation is harmless whatever happened to an
    /// earlier attempt.
    pub fn is_idempotent(self) -> bool {
        !matches!(self, Op::PutIfNoneMatch | Op::PutIfMatch)
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Op::Get => "get",
            Op::GetRange => "get_range",
            Op::Head => "head",
            Op::Put => "put",
            Op::PutIfNoneMatch => "put_if_none_match",
            Op::PutIfMatch => "put_if_match",
            Op::Delete => "delete",
            Op::List => "list",
        };
        f.write_str(name)
    }
}

/// SHA-256 hex of `bytes`: the ETag of the local and memory backends.
/// (Its hex is `cellfleet_cell::hex::encode`'s, which this crate, the
/// lowest, cannot depend on.)
pub(crate) fn content_etag(bytes: &[u8]) -> ETag {
    use sha2::{Digest, Sha256};
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let digest = Sha256::digest(bytes);
    let mut hex = String::with_capacity(64);
    for byte in digest {
        hex.push(char::from(DIGITS[usize::from(byte >> 4)]));
        hex.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    ETag(hex)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etag_strips_quotes() {
        assert_eq!(ETag::new("\"abc\"").as_str(), "abc");
        assert_eq!(ETag::new("W/\"abc\"").as_str(), "abc");
        assert_eq!(ETag::new("abc").quoted(), "\"abc\"");
    }

    #[test]
    fn content_etag_is_stable() {
        assert_eq!(content_etag(b"a"), content_etag(b"a"));
        assert_ne!(content_etag(b"a"), content_etag(b"b"));
        assert_eq!(content_etag(b"").as_str().len(), 64);
        // The SHA-256 of "a", as every tool prints it (a conditional write
        // compares an ETag a client read earlier).
        assert_eq!(
            content_etag(b"a").as_str(),
            "ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb"
        );
    }
}
