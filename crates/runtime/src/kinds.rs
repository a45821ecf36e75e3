//! The kinds a node serves: the built-in `kv`, manifest kinds and Rust kinds, by name.

use std::collections::BTreeMap;
use std::sync::Arc;

use cellfleet_cell::{Kind, Kv, Manifest, Typed};

/// Kinds by name. Every node of a cluster must serve the same set. A name
/// is taken once: a second kind of the same name is refused, never a
/// silent replacement (a manifest kind named like a built-in or a Durable
/// Streams kind would otherwise change what its Cells run).
#[derive(Clone, Debug, Default)]
pub struct Kinds {
    kinds: BTreeMap<String, Arc<dyn Kind>>,
}

/// A kind's name was taken already.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "kind {name:?} is defined twice: names are unique across the built-in kv, \
     the Durable Streams kinds (stream, ds_subscription, ds_registry) and the \
     kinds manifest; give the manifest's kind another name"
)]
pub struct DuplicateKind {
    /// The name.
    pub name: String,
}

impl Kinds {
    /// The built-in kinds (`kv`).
    pub fn builtin() -> Self {
        Self::default().with(Arc::new(Typed(Kv)))
    }

    /// The built-in kinds plus every kind of `manifest` (a manifest kind
    /// named like a built-in one is refused).
    pub fn from_manifest(manifest: &Manifest) -> cellfleet_cell::Result<Self> {
        let mut kinds = Self::builtin();
        for name in manifest.kinds.keys() {
            kinds = kinds
                .try_with(manifest.kind(name)?)
                .map_err(|e| cellfleet_cell::Error::Manifest(e.to_string()))?;
        }
        Ok(kinds)
    }

    /// Adds `kind`, or refuses if its name is taken.
    ///
    /// # Panics
    /// If the kind declares a page size SQLite cannot use: only code
    /// declares one (a manifest cannot), so that is a programming error,
    /// caught here rather than at its first Cell's activation.
    pub fn try_with(mut self, kind: Arc<dyn Kind>) -> Result<Self, DuplicateKind> {
        let name = kind.name().to_owned();
        if let Some(size) = kind.page_size() {
            assert!(
                size.is_power_of_two() && (512..=65_536).contains(&size),
                "kind {name} declares page size {size}: give a power of two in 512..=65536"
            );
        }
        if self.kinds.contains_key(&name) {
            return Err(DuplicateKind { name });
        }
        self.kinds.insert(name, kind);
        Ok(self)
    }

    /// Adds a kind registered in code.
    ///
    /// # Panics
    /// If its name is taken: two code-registered kinds of one name are a
    /// programming error. Kinds from input go through [`Kinds::try_with`].
    pub fn with(self, kind: Arc<dyn Kind>) -> Self {
        self.try_with(kind).unwrap_or_else(|e| panic!("{e}"))
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

#[cfg(test)]
mod tests {
    use super::*;

    const NOTES: &str = r#"
[kinds.NAME]
migrations = ["CREATE TABLE notes (text TEXT NOT NULL)"]
"#;

    #[test]
    fn a_name_is_taken_once() {
        let manifest = Manifest::parse(&NOTES.replace("NAME", "notes")).unwrap();
        let kinds = Kinds::from_manifest(&manifest).unwrap();
        assert!(kinds.get("notes").is_some() && kinds.get("kv").is_some());
        // Named like the built-in kv: refused, not a silent replacement.
        let shadowing = Manifest::parse(&NOTES.replace("NAME", "kv")).unwrap();
        let error = Kinds::from_manifest(&shadowing).unwrap_err().to_string();
        assert!(error.contains("kind \"kv\" is defined twice"), "{error}");
        let again = kinds.clone().try_with(manifest.kind("notes").unwrap());
        assert_eq!(
            again.unwrap_err(),
            DuplicateKind {
                name: "notes".into()
            }
        );
    }

    #[derive(Debug)]
    struct OddPages;

    impl Kind for OddPages {
        fn name(&self) -> &str {
            "odd"
        }
        fn migrations(&self) -> Vec<String> {
            Vec::new()
        }
        fn limits(&self) -> cellfleet_cell::Limits {
            cellfleet_cell::Limits::default()
        }
        fn page_size(&self) -> Option<u32> {
            Some(1000)
        }
        fn execute(
            &self,
            _: &rusqlite::Connection,
            _: &str,
            _: &serde_json::Value,
        ) -> Result<serde_json::Value, cellfleet_cell::KindError> {
            Ok(serde_json::Value::Null)
        }
        fn query(
            &self,
            conn: &rusqlite::Connection,
            name: &str,
            args: &serde_json::Value,
        ) -> Result<serde_json::Value, cellfleet_cell::KindError> {
            self.execute(conn, name, args)
        }
    }

    #[test]
    #[should_panic(expected = "kind odd declares page size 1000")]
    fn a_kind_declaring_a_page_size_sqlite_cannot_use_is_refused_when_added() {
        let _ = Kinds::builtin().try_with(Arc::new(OddPages));
    }
}
