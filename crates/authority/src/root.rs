//! The authority root record: the one mutable object per Cell, versioned JSON, validated on read and before write.
//!
//! The root names the Cell's owner (node + session), epoch, revision, state
//! and its LTX chain with TXID and rolling checksum. It is replaced only by
//! compare-and-swap on its ETag, and its `revision` grows by one on every
//! successful replace, so its bytes never repeat (ETags are content hashes;
//! an A→B→A history would let a stale CAS win).
//!
//! Validation rules ([`RootRecord::validate`]): format version known; the
//! encoded record at most [`ROOT_BYTES_MAX`]; revision ≥ 1; an active root
//! has an owner and session, a released one has neither; the chain starts at
//! TXID 1, is contiguous, each file's range is ordered, the last file ends at
//! `txid` and its post-apply checksum is the root's `checksum`; an empty chain
//! means `txid` 0; every LTX key lies under this Cell's `ltx/`; page size is
//! a power of two in 512..=65536; bounded strings and chain length.

use cellfleet_ltx::Txid;
use serde::{Deserialize, Serialize};

use crate::ids::{CellId, Epoch, NodeId, SessionId};
use crate::layout::LaneId;

/// The root format version this code writes and reads.
pub const ROOT_FORMAT_VERSION: u32 = 1;
/// Largest encoded root accepted (DESIGN.md §4).
pub const ROOT_BYTES_MAX: usize = 64 * 1024;
/// Most LTX files a chain may list; past it the owner must compact.
pub const CHAIN_LEN_MAX: usize = 128;
/// Longest kind name.
pub const KIND_BYTES_MAX: usize = 64;
/// Longest application key stored in the root.
pub const APP_KEY_BYTES_MAX: usize = 1024;

/// Whether the Cell is owned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RootState {
    /// Owned by `owner`/`owner_session`, who alone may publish at `epoch`.
    Active,
    /// Released (drained or passivated for good): no owner; the next
    /// activation takes it over at `epoch + 1` without waiting for a lease.
    Released,
}

/// One LTX file of the chain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LtxRef {
    /// Object key of the file (content-addressed, create-only).
    pub key: String,
    /// First TXID in the file.
    pub min_txid: Txid,
    /// Last TXID in the file.
    pub max_txid: Txid,
    /// File size in bytes.
    pub size: u64,
    /// The file's own checksum (LTX trailer).
    #[serde(with = "hex_u64")]
    pub file_checksum: u64,
    /// The database's rolling checksum after applying the file.
    #[serde(with = "hex_u64")]
    pub post_apply_checksum: u64,
}

/// Where a Cell's records beyond its chain live (DESIGN.md §9): the Cell's
/// state is its chain plus its records in `lane` from slot `from_seq` up to
/// the end of that lane's log (its first seal, once the session is dead).
/// Records at or below the root's TXID are already in the chain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogPointer {
    /// The lane (node, session, number).
    pub lane: LaneId,
    /// The first slot that may hold a record of this Cell past the chain.
    pub from_seq: u64,
}

/// The authority root of one Cell.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RootRecord {
    /// Format version ([`ROOT_FORMAT_VERSION`]).
    pub version: u32,
    /// The Cell.
    pub cell_id: CellId,
    /// The Cell's kind.
    pub kind: String,
    /// The application key, when it is text worth showing operators.
    pub key: Option<String>,
    /// The owning node (`None` when released).
    pub owner: Option<NodeId>,
    /// The owning node's session (`None` when released).
    pub owner_session: Option<SessionId>,
    /// Ownership generation (fencing token).
    pub epoch: Epoch,
    /// +1 on every successful replace of the root.
    pub revision: u64,
    /// Active or released.
    pub state: RootState,
    /// LTX files from TXID 1 to `txid`, contiguous.
    pub chain: Vec<LtxRef>,
    /// The Cell's current TXID (0 before any publication).
    pub txid: Txid,
    /// Rolling database checksum at `txid`.
    #[serde(with = "hex_u64")]
    pub checksum: u64,
    /// SQLite page size in bytes.
    pub page_size: u32,
    /// Schema version (migrations applied).
    pub schema_version: u32,
    /// Wall-clock ms of the last write (informational only).
    pub updated_at_ms: u64,
    /// Records past the chain in a node log (log publication mode); absent
    /// when the chain is the whole state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<LogPointer>,
}

/// A record failed validation or decoding.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidRecord(pub String);

fn invalid<T>(reason: impl Into<String>) -> Result<T, InvalidRecord> {
    Err(InvalidRecord(reason.into()))
}

impl RootRecord {
    /// Checks every rule of the module docs except the encoded size (see
    /// [`RootRecord::encode`]).
    pub fn validate(&self) -> Result<(), InvalidRecord> {
        if self.version != ROOT_FORMAT_VERSION {
            return invalid(format!("unknown root format version {}", self.version));
        }
        if self.kind.is_empty() || self.kind.len() > KIND_BYTES_MAX {
            return invalid("kind must be 1..=64 bytes");
        }
        if self.kind.chars().any(|c| c.is_control()) {
            return invalid("kind contains control characters");
        }
        if self
            .key
            .as_ref()
            .is_some_and(|key| key.len() > APP_KEY_BYTES_MAX)
        {
            return invalid("key longer than 1024 bytes");
        }
        if self.revision == 0 {
            return invalid("revision must be at least 1");
        }
        match (self.state, &self.owner, &self.owner_session) {
            (RootState::Active, Some(_), Some(_)) | (RootState::Released, None, None) => {}
            (RootState::Active, _, _) => return invalid("an active root needs owner and session"),
            (RootState::Released, _, _) => {
                return invalid("a released root has no owner or session")
            }
        }
        if self.state == RootState::Released && self.log.is_some() {
            return invalid("a released root has no log pointer (checkpoint first)");
        }
        if !self.page_size.is_power_of_two() || !(512..=65536).contains(&self.page_size) {
            return invalid(format!(
                "page size {} is not a power of two in 512..=65536",
                self.page_size
            ));
        }
        self.validate_chain()
    }

    fn validate_chain(&self) -> Result<(), InvalidRecord> {
        if self.chain.len() > CHAIN_LEN_MAX {
            return invalid(format!("chain longer than {CHAIN_LEN_MAX} files"));
        }
        let Some(last) = self.chain.last() else {
            return if self.txid == Txid::ZERO {
                Ok(())
            } else {
                invalid(format!("empty chain but txid {}", self.txid.0))
            };
        };
        let ltx_dir = crate::layout::Layout::ltx_infix(&self.cell_id);
        let mut next = Txid::FIRST;
        for file in &self.chain {
            if file.min_txid != next {
                return invalid(format!(
                    "chain not contiguous: expected a file starting at txid {}, got {}",
                    next.0, file.min_txid.0
                ));
            }
            if file.max_txid < file.min_txid {
                return invalid("an LTX file ends before it starts");
            }
            if cellfleet_store::validate_key(&file.key).is_err()
                || !file.key.contains(&ltx_dir)
                || !file.key.ends_with(".ltx")
            {
                return invalid(format!("LTX key {:?} is not under {ltx_dir}", file.key));
            }
            next = match file.max_txid.next() {
                Some(next) => next,
                None => return invalid("txid overflow"),
            };
        }
        if last.max_txid != self.txid {
            return invalid(format!(
                "chain ends at txid {} but the root says {}",
                last.max_txid.0, self.txid.0
            ));
        }
        if last.post_apply_checksum != self.checksum {
            return invalid("the last file's post-apply checksum differs from the root's");
        }
        Ok(())
    }

    /// Validates, then encodes as JSON; refuses a record over [`ROOT_BYTES_MAX`].
    pub fn encode(&self) -> Result<Vec<u8>, InvalidRecord> {
        self.validate()?;
        let bytes = serde_json::to_vec(self).map_err(|e| InvalidRecord(e.to_string()))?;
        if bytes.len() > ROOT_BYTES_MAX {
            return invalid(format!(
                "root is {} bytes, over {ROOT_BYTES_MAX}",
                bytes.len()
            ));
        }
        Ok(bytes)
    }

    /// Decodes untrusted bytes: size bound first, strict JSON (unknown fields
    /// refused), then [`RootRecord::validate`]. Never panics.
    pub fn decode(bytes: &[u8]) -> Result<Self, InvalidRecord> {
        if bytes.len() > ROOT_BYTES_MAX {
            return invalid(format!(
                "root is {} bytes, over {ROOT_BYTES_MAX}",
                bytes.len()
            ));
        }
        let record: Self = serde_json::from_slice(bytes)
            .map_err(|e| InvalidRecord(format!("bad root JSON: {e}")))?;
        record.validate()?;
        Ok(record)
    }

    /// Whether `node`/`session` owns this root at `epoch` and may publish.
    pub fn is_owned_by(&self, node: &NodeId, session: SessionId, epoch: Epoch) -> bool {
        self.state == RootState::Active
            && self.owner.as_ref() == Some(node)
            && self.owner_session == Some(session)
            && self.epoch == epoch
    }
}

/// Serializes a `u64` as 16 lowercase hex digits (checksums exceed what
/// JSON numbers carry exactly in many languages).
pub(crate) mod hex_u64 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &u64, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&format!("{value:016x}"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
        let text = String::deserialize(deserializer)?;
        if text.len() != 16 || !text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(serde::de::Error::custom("expected 16 lowercase hex digits"));
        }
        u64::from_str_radix(&text, 16).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> RootRecord {
        let cell_id = CellId::for_kind_key("kv", b"alice");
        RootRecord {
            version: ROOT_FORMAT_VERSION,
            key: Some("alice".to_owned()),
            kind: "kv".to_owned(),
            owner: Some(NodeId::new("n1").unwrap()),
            owner_session: Some(SessionId::from_u128(7)),
            epoch: Epoch::FIRST,
            revision: 3,
            state: RootState::Active,
            log: None,
            chain: vec![
                LtxRef {
                    key: format!("p/cells/{cell_id}/ltx/0000000000000001/a.ltx"),
                    min_txid: Txid(1),
                    max_txid: Txid(4),
                    size: 100,
                    file_checksum: 1,
                    post_apply_checksum: 0x10,
                },
                LtxRef {
                    key: format!("p/cells/{cell_id}/ltx/0000000000000001/b.ltx"),
                    min_txid: Txid(5),
                    max_txid: Txid(5),
                    size: 50,
                    file_checksum: 2,
                    post_apply_checksum: u64::MAX,
                },
            ],
            cell_id,
            txid: Txid(5),
            checksum: u64::MAX,
            page_size: 4096,
            schema_version: 1,
            updated_at_ms: 1_700_000_000_000,
        }
    }

    #[test]
    fn round_trips_exactly() {
        let root = sample();
        let bytes = root.encode().unwrap();
        assert_eq!(RootRecord::decode(&bytes).unwrap(), root);
        let text = String::from_utf8(bytes).unwrap();
        assert!(text.contains("\"checksum\":\"ffffffffffffffff\""), "{text}");
    }

    #[test]
    fn invalid_roots_are_refused_on_write_and_read() {
        type Breaks = Box<dyn Fn(&mut RootRecord)>;
        let broken: Vec<(&str, Breaks)> = vec![
            ("gap", Box::new(|r| r.chain[1].min_txid = Txid(6))),
            ("txid", Box::new(|r| r.txid = Txid(9))),
            ("checksum", Box::new(|r| r.checksum = 1)),
            ("owner", Box::new(|r| r.owner = None)),
            (
                "released owner",
                Box::new(|r| r.state = RootState::Released),
            ),
            ("page", Box::new(|r| r.page_size = 1000)),
            ("version", Box::new(|r| r.version = 2)),
            ("revision", Box::new(|r| r.revision = 0)),
            (
                "foreign key",
                Box::new(|r| r.chain[0].key = "p/cells/other/ltx/a.ltx".into()),
            ),
            ("empty chain", Box::new(|r| r.chain.clear())),
        ];
        for (name, breaks) in broken {
            let mut root = sample();
            let good = serde_json::to_vec(&root).unwrap();
            assert!(RootRecord::decode(&good).is_ok());
            breaks(&mut root);
            assert!(root.encode().is_err(), "{name} accepted on write");
            let bytes = serde_json::to_vec(&root).unwrap();
            assert!(
                RootRecord::decode(&bytes).is_err(),
                "{name} accepted on read"
            );
        }
    }

    #[test]
    fn unknown_fields_and_oversized_roots_are_refused() {
        let mut value = serde_json::to_value(sample()).unwrap();
        value["extra"] = serde_json::json!(1);
        assert!(RootRecord::decode(&serde_json::to_vec(&value).unwrap()).is_err());
        let mut big = sample();
        big.key = Some("k".repeat(1024));
        assert!(big.encode().is_ok());
        assert!(RootRecord::decode(&vec![b' '; ROOT_BYTES_MAX + 1]).is_err());
    }
}
