//! The kinds a node serves: the built-in `kv`, manifest kinds and Rust kinds, by name.

use std::collections::BTreeMap;
use std::sync::Arc;

use cellfleet_cell::{Kind, Kv, Manifest, Typed};

/// Kinds by name. Every node of a cluster must serve the same set.
#[derive(Clone, Debug, Default)]
pub struct Kinds {
    kinds: BTreeMap<String, Arc<dyn Kind>>,
}

impl Kinds {
    /// The built-in kinds (`kv`).
    pub fn builtin() -> Self {
        Self::default().with(Arc::new(Typed(Kv)))
    }

    /// The built-in kinds plus every kind of `manifest`.
    pub fn from_manifest(manifest: &Manifest) -> cellfleet_cell::Result<Self> {
        let mut kinds = Self::builtin();
        for name in manifest.kinds.keys() {
            kinds = kinds.with(manifest.kind(name)?);
        }
        Ok(kinds)
    }

    /// Adds (or replaces) a kind under its own name.
    pub fn with(mut self, kind: Arc<dyn Kind>) -> Self {
        self.kinds.insert(kind.name().to_owned(), kind);
        self
    }

    /// The kind named `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Kind>> {
        self.kinds.get(name)
    }

    /// The names served.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.kinds.keys().map(String::as_str)
    }
}
