//! Identifier newtypes that make illegal values unrepresentable: node ids, session ids, Cell ids, epochs.

use std::fmt;
use std::num::NonZeroU64;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Longest node id, in bytes.
pub const NODE_ID_BYTES_MAX: usize = 64;

/// A node's stable name: 1..=64 of `[A-Za-z0-9._-]`, not starting with `.`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct NodeId(String);

impl NodeId {
    /// Validates `id`.
    pub fn new(id: impl Into<String>) -> Result<Self, IdError> {
        let id = id.into();
        let valid_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        if id.is_empty() || id.len() > NODE_ID_BYTES_MAX {
            return Err(IdError(format!(
                "node id must be 1..=64 bytes, got {}",
                id.len()
            )));
        }
        if !id.chars().all(valid_char) || id.starts_with('.') {
            return Err(IdError(format!(
                "node id {id:?} must be [A-Za-z0-9._-] and not start with '.'"
            )));
        }
        Ok(Self(id))
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for NodeId {
    type Error = IdError;
    fn try_from(id: String) -> Result<Self, IdError> {
        Self::new(id)
    }
}

impl From<NodeId> for String {
    fn from(id: NodeId) -> String {
        id.0
    }
}

impl FromStr for NodeId {
    type Err = IdError;
    fn from_str(id: &str) -> Result<Self, IdError> {
        Self::new(id)
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeId({})", self.0)
    }
}

/// One run of a node: random per process start. Written as 32 hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SessionId(u128);

impl SessionId {
    /// A fresh random session id.
    pub fn random() -> Self {
        Self(rand::random())
    }

    /// A session id from its number (tests, decoding).
    pub fn from_u128(id: u128) -> Self {
        Self(id)
    }

    /// The number.
    pub fn as_u128(self) -> u128 {
        self.0
    }
}

impl TryFrom<String> for SessionId {
    type Error = IdError;
    fn try_from(hex: String) -> Result<Self, IdError> {
        hex.parse()
    }
}

impl FromStr for SessionId {
    type Err = IdError;
    fn from_str(hex: &str) -> Result<Self, IdError> {
        if hex.len() != 32 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(IdError(format!(
                "session id must be 32 lowercase hex digits, got {:?}",
                hex.chars().take(40).collect::<String>()
            )));
        }
        u128::from_str_radix(hex, 16)
            .map(Self)
            .map_err(|e| IdError(e.to_string()))
    }
}

impl From<SessionId> for String {
    fn from(id: SessionId) -> String {
        id.to_string()
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SessionId({:032x})", self.0)
    }
}

/// A Cell's id: the first 128 bits of SHA-256 over `(kind, key)` under a
/// domain tag, as 32 lowercase hex digits. Names the Cell's objects.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct CellId(String);

/// `bytes` as lowercase hex, written into one string (every request names
/// its Cell this way, so no string per byte). The same as
/// `cellfleet_cell::hex::encode`, which this crate cannot depend on.
fn hex_lower(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    out
}

impl CellId {
    /// The id of the Cell `(kind, key)`.
    pub fn for_kind_key(kind: &str, key: &[u8]) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(b"cellfleet/cell-id/v1\0");
        hasher.update((kind.len() as u64).to_be_bytes());
        hasher.update(kind.as_bytes());
        hasher.update(key);
        let digest = hasher.finalize();
        Self(hex_lower(&digest[..16]))
    }

    /// The hex id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for CellId {
    type Err = IdError;
    fn from_str(hex: &str) -> Result<Self, IdError> {
        if hex.len() != 32 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(IdError(format!(
                "cell id must be 32 lowercase hex digits, got {:?}",
                hex.chars().take(40).collect::<String>()
            )));
        }
        Ok(Self(hex.to_owned()))
    }
}

impl TryFrom<String> for CellId {
    type Error = IdError;
    fn try_from(hex: String) -> Result<Self, IdError> {
        hex.parse()
    }
}

impl From<CellId> for String {
    fn from(id: CellId) -> String {
        id.0
    }
}

impl fmt::Display for CellId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for CellId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CellId({})", self.0)
    }
}

/// A Cell's ownership generation, the fencing token: 1 at creation, +1 on
/// every change of owner.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "u64", into = "u64")]
pub struct Epoch(NonZeroU64);

impl Epoch {
    /// Epoch 1.
    pub const FIRST: Epoch = Epoch(NonZeroU64::MIN);

    /// `epoch` if non-zero.
    pub fn new(epoch: u64) -> Option<Self> {
        NonZeroU64::new(epoch).map(Self)
    }

    /// The number.
    pub fn get(self) -> u64 {
        self.0.get()
    }

    /// The next epoch, `None` on overflow.
    pub fn next(self) -> Option<Self> {
        self.0.checked_add(1).map(Self)
    }
}

impl TryFrom<u64> for Epoch {
    type Error = IdError;
    fn try_from(epoch: u64) -> Result<Self, IdError> {
        Self::new(epoch).ok_or_else(|| IdError("epoch must be at least 1".to_owned()))
    }
}

impl From<Epoch> for u64 {
    fn from(epoch: Epoch) -> u64 {
        epoch.get()
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Debug for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Epoch({})", self.0)
    }
}

/// An identifier failed validation.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct IdError(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_are_validated() {
        assert!(NodeId::new("node-1.eu_west").is_ok());
        for bad in ["", ".hidden", "a/b", "a b", &"x".repeat(65)] {
            assert!(NodeId::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn session_ids_round_trip_as_hex() {
        let id = SessionId::from_u128(0xabc);
        assert_eq!(id.to_string(), "00000000000000000000000000000abc");
        assert_eq!(id.to_string().parse::<SessionId>().unwrap(), id);
        assert!("ABC".parse::<SessionId>().is_err());
    }

    #[test]
    fn cell_ids_depend_on_kind_and_key() {
        let a = CellId::for_kind_key("kv", b"alice");
        assert_eq!(a, CellId::for_kind_key("kv", b"alice"));
        assert_ne!(a, CellId::for_kind_key("kv", b"bob"));
        assert_ne!(a, CellId::for_kind_key("kva", b"lice"));
        assert_eq!(a.as_str().len(), 32);
        assert_eq!(a.as_str().parse::<CellId>().unwrap(), a);
    }

    /// Cell ids name objects in the bucket: the same (kind, key) must keep
    /// its id across versions.
    #[test]
    fn a_cell_id_is_stable() {
        assert_eq!(
            CellId::for_kind_key("kv", b"alice").as_str(),
            "2c770838fda14349b5fcb7911b518dde"
        );
    }

    proptest::proptest! {
        #[test]
        fn hex_lower_is_two_lowercase_digits_per_byte(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)) {
            let expected: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            proptest::prop_assert_eq!(hex_lower(&bytes), expected);
        }
    }

    #[test]
    fn epochs_start_at_one() {
        assert_eq!(Epoch::FIRST.get(), 1);
        assert_eq!(Epoch::FIRST.next().unwrap().get(), 2);
        assert!(Epoch::new(0).is_none());
        assert!(serde_json::from_str::<Epoch>("0").is_err());
        assert_eq!(serde_json::from_str::<Epoch>("7").unwrap().get(), 7);
    }
}
