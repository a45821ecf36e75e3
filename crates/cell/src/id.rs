//! `CellId`: the stable name of a Cell, a hash of `(kind, key)`.
//!
//! The encoding is domain-tagged and length-prefixed so that no two
//! `(kind, key)` pairs share an input: `"cellfleet.cell-id.v1\0" ||
//! be32(len(kind)) || kind || be32(len(key)) || key`, hashed with SHA-256
//! and truncated to 16 bytes, printed as 32 lowercase hex digits.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest, Sha256};

const DOMAIN: &[u8] = b"cellfleet.cell-id.v1\0";

/// A Cell's identity: 16 bytes of SHA-256 over `(kind, key)`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CellId(pub [u8; 16]);

impl CellId {
    /// The id of the Cell `key` of kind `kind`.
    pub fn new(kind: &str, key: &[u8]) -> CellId {
        let mut hasher = Sha256::new();
        hasher.update(DOMAIN);
        hasher.update((kind.len() as u32).to_be_bytes());
        hasher.update(kind.as_bytes());
        hasher.update((key.len() as u32).to_be_bytes());
        hasher.update(key);
        let digest = hasher.finalize();
        let mut id = [0u8; 16];
        id.copy_from_slice(&digest[..16]);
        CellId(id)
    }

    /// The 32-digit lowercase hex form used in object keys.
    pub fn to_hex(&self) -> String {
        crate::hex::encode(&self.0)
    }
}

impl fmt::Display for CellId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for CellId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CellId({})", self.to_hex())
    }
}

/// A string that is not 32 hex digits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a cell id is 32 hex digits, got {0:?}")]
pub struct ParseCellIdError(pub String);

impl FromStr for CellId {
    type Err = ParseCellIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bytes = crate::hex::decode(s).ok_or_else(|| ParseCellIdError(s.to_string()))?;
        let id: [u8; 16] = bytes
            .try_into()
            .map_err(|_| ParseCellIdError(s.to_string()))?;
        Ok(CellId(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_and_distinct() {
        let a = CellId::new("kv", b"alice");
        assert_eq!(a, CellId::new("kv", b"alice"));
        assert_ne!(a, CellId::new("kv", b"alicf"));
        // The length prefix keeps ("ab","c") and ("a","bc") apart.
        assert_ne!(CellId::new("ab", b"c"), CellId::new("a", b"bc"));
        assert_eq!(a.to_hex().len(), 32);
        assert_eq!(a.to_hex().parse::<CellId>().unwrap(), a);
        assert!("xyz".parse::<CellId>().is_err());
    }
}
