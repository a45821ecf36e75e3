//! The key registry: which Ed25519 public keys may sign, and what each may do (kinds, operations, raw SQL, admin).
//!
//! Loaded from a TOML file (`keys.toml`), identical on every node:
//!
//! ```toml
//! [[keys]]
//! id = "alice"                  # the envelope's key_id
//! public_key = "3d40…660c"      # 32 bytes, 64 lowercase hex characters
//! kinds = ["kv"]                # kinds the key may address; "*" = any
//! operations = ["put", "get"]   # command and query names; "*" = any
//! raw_sql = false               # may run the "$sql" command ("*" never grants it)
//! admin = false                 # may call Admin.Drain
//! stream_token_prefixes = ["/v1/stream/app/"]  # may sign Durable Streams bearer
//!                               # tokens for paths under these (none: signs no tokens)
//! ```

use std::collections::HashMap;
use std::path::Path;

use ed25519_dalek::VerifyingKey;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::signing::{parse_public_key, public_key_hex};

/// Bound on the number of keys in one registry.
pub const REGISTRY_KEYS_MAX: usize = 100_000;
/// Bound on a key id's length in bytes.
pub const KEY_ID_BYTES_MAX: usize = 128;
/// Bound on the registry file's size.
pub const REGISTRY_FILE_BYTES_MAX: u64 = 64 * 1024 * 1024;
/// The wildcard in `kinds` and `operations`.
pub const ANY: &str = "*";
/// Bound on one `stream_token_prefixes` entry (as a token's prefix).
pub const STREAM_PREFIX_BYTES_MAX: usize = 1024;
/// The command name of a raw SQL batch (as `cellfleet_cell::RAW_SQL`).
pub const RAW_SQL_COMMAND: &str = "$sql";

/// One registry entry as written in the file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyEntry {
    /// The key id clients put in `SignedEnvelope.key_id`.
    pub id: String,
    /// The Ed25519 public key, 64 hex characters.
    pub public_key: String,
    /// Kinds the key may address (`"*"` for any).
    #[serde(default)]
    pub kinds: Vec<String>,
    /// Command and query names the key may use (`"*"` for any).
    #[serde(default)]
    pub operations: Vec<String>,
    /// Whether the key may run raw SQL batches.
    #[serde(default)]
    pub raw_sql: bool,
    /// Whether the key may call admin operations (drain).
    #[serde(default)]
    pub admin: bool,
    /// Path prefixes of the Durable Streams listener this key may grant in
    /// bearer tokens (`cellfleet keys token`); none: it signs no tokens.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stream_token_prefixes: Vec<String>,
}

impl KeyEntry {
    /// The entry as a `[[keys]]` TOML table (to append to a registry file).
    pub fn to_toml(&self) -> String {
        #[derive(Serialize)]
        struct File<'a> {
            keys: [&'a KeyEntry; 1],
        }
        toml::to_string(&File { keys: [self] }).expect("a key entry always serializes")
    }

    /// An entry for `key` with the given grants.
    pub fn new(
        id: impl Into<String>,
        key: &VerifyingKey,
        kinds: Vec<String>,
        operations: Vec<String>,
    ) -> Self {
        KeyEntry {
            id: id.into(),
            public_key: public_key_hex(key),
            kinds,
            operations,
            raw_sql: false,
            admin: false,
            stream_token_prefixes: Vec::new(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RegistryFile {
    #[serde(default)]
    keys: Vec<KeyEntry>,
}

/// What a verified request wants to do, for authorization.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation<'a> {
    /// Run command `name` on a Cell of `kind`.
    Command {
        /// The kind.
        kind: &'a str,
        /// The command name.
        name: &'a str,
    },
    /// Run query `name` on a Cell of `kind`.
    Query {
        /// The kind.
        kind: &'a str,
        /// The query name.
        name: &'a str,
    },
    /// Resolve a command id on a Cell of `kind`.
    Resolve {
        /// The kind.
        kind: &'a str,
    },
    /// An admin operation.
    Admin {
        /// Its name ("drain").
        operation: &'a str,
    },
}

/// A loaded key with its grants.
#[derive(Clone, Debug)]
pub struct RegisteredKey {
    /// The entry as written.
    pub entry: KeyEntry,
    /// The parsed public key.
    pub public_key: VerifyingKey,
}

impl RegisteredKey {
    fn allows_kind(&self, kind: &str) -> bool {
        self.entry.kinds.iter().any(|k| k == ANY || k == kind)
    }

    fn allows_operation(&self, name: &str) -> bool {
        self.entry.operations.iter().any(|o| o == ANY || o == name)
    }

    /// Whether this key may do `operation`.
    pub fn authorize(&self, operation: Operation<'_>) -> Result<()> {
        let deny = |what: String| {
            Err(Error::Unauthorized {
                key_id: self.entry.id.clone(),
                what,
            })
        };
        match operation {
            Operation::Admin { operation } => {
                if !self.entry.admin {
                    return deny(format!("run admin operation {operation:?}"));
                }
                Ok(())
            }
            Operation::Resolve { kind } => {
                if !self.allows_kind(kind) {
                    return deny(format!("use kind {kind:?}"));
                }
                Ok(())
            }
            Operation::Command { kind, name } | Operation::Query { kind, name } => {
                if !self.allows_kind(kind) {
                    return deny(format!("use kind {kind:?}"));
                }
                if name == RAW_SQL_COMMAND {
                    if matches!(operation, Operation::Command { .. }) && self.entry.raw_sql {
                        return Ok(());
                    }
                    return deny("run raw SQL".to_owned());
                }
                if !self.allows_operation(name) {
                    return deny(format!("run {name:?}"));
                }
                Ok(())
            }
        }
    }
}

fn valid_stream_prefix(prefix: &str) -> bool {
    prefix.starts_with('/')
        && prefix.len() <= STREAM_PREFIX_BYTES_MAX
        && !prefix.chars().any(|c| c.is_control() || c == ' ')
}

/// Key id → key and grants.
#[derive(Clone, Debug, Default)]
pub struct KeyRegistry {
    keys: HashMap<String, RegisteredKey>,
}

/// Why a registry file was refused (operator input, so a plain message).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("key registry: {0}")]
pub struct RegistryError(pub String);

impl RegistryError {
    /// A bad registry file does not get better by retrying.
    pub fn is_retryable(&self) -> bool {
        false
    }
}

impl KeyRegistry {
    /// Reads and validates a TOML registry file.
    pub fn load(path: &Path) -> Result<Self, RegistryError> {
        let io = |e: std::io::Error| RegistryError(format!("{}: {e}", path.display()));
        let size = std::fs::metadata(path).map_err(io)?.len();
        if size > REGISTRY_FILE_BYTES_MAX {
            return Err(RegistryError(format!(
                "{}: {size} bytes exceeds {REGISTRY_FILE_BYTES_MAX}",
                path.display()
            )));
        }
        let text = std::fs::read_to_string(path).map_err(io)?;
        Self::from_toml_str(&text)
            .map_err(|e| RegistryError(format!("{}: {}", path.display(), e.0)))
    }

    /// Parses and validates registry TOML.
    pub fn from_toml_str(text: &str) -> Result<Self, RegistryError> {
        let file: RegistryFile =
            toml::from_str(text).map_err(|e| RegistryError(e.message().to_owned()))?;
        Self::from_entries(file.keys)
    }

    /// Validates entries: unique bounded ids, valid public keys.
    pub fn from_entries(entries: Vec<KeyEntry>) -> Result<Self, RegistryError> {
        if entries.len() > REGISTRY_KEYS_MAX {
            return Err(RegistryError(format!(
                "{} keys exceed the maximum of {REGISTRY_KEYS_MAX}",
                entries.len()
            )));
        }
        let mut keys = HashMap::with_capacity(entries.len());
        for entry in entries {
            if entry.id.is_empty() || entry.id.len() > KEY_ID_BYTES_MAX {
                return Err(RegistryError(format!(
                    "key id {:?} must be 1..={KEY_ID_BYTES_MAX} bytes",
                    entry.id
                )));
            }
            let public_key = parse_public_key(&entry.public_key)
                .map_err(|e| RegistryError(format!("key {:?}: {e}", entry.id)))?;
            if let Some(bad) = entry
                .stream_token_prefixes
                .iter()
                .find(|p| !valid_stream_prefix(p))
            {
                return Err(RegistryError(format!(
                    "key {:?}: stream_token_prefixes entry {bad:?} must start with '/', \
                     be at most {STREAM_PREFIX_BYTES_MAX} bytes and have no spaces or control characters",
                    entry.id
                )));
            }
            let id = entry.id.clone();
            if keys
                .insert(id.clone(), RegisteredKey { entry, public_key })
                .is_some()
            {
                return Err(RegistryError(format!("key id {id:?} appears twice")));
            }
        }
        Ok(KeyRegistry { keys })
    }

    /// The key registered under `key_id`.
    pub fn get(&self, key_id: &str) -> Result<&RegisteredKey> {
        self.keys
            .get(key_id)
            .ok_or_else(|| Error::UnknownKey(key_id.to_owned()))
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether there are no keys.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signing::generate_signing_key;

    fn registry() -> KeyRegistry {
        let mut writer = KeyEntry::new(
            "writer",
            &generate_signing_key().verifying_key(),
            vec!["kv".into()],
            vec!["put".into(), "get".into()],
        );
        writer.raw_sql = true;
        let mut reader = KeyEntry::new(
            "reader",
            &generate_signing_key().verifying_key(),
            vec![ANY.into()],
            vec![ANY.into()],
        );
        reader.admin = true;
        let text = format!("{}\n{}", writer.to_toml(), reader.to_toml());
        KeyRegistry::from_toml_str(&text).expect("valid registry")
    }

    #[test]
    fn grants_are_per_kind_and_operation() {
        let registry = registry();
        let writer = registry.get("writer").expect("writer");
        writer
            .authorize(Operation::Command {
                kind: "kv",
                name: "put",
            })
            .expect("put on kv");
        writer
            .authorize(Operation::Command {
                kind: "kv",
                name: RAW_SQL_COMMAND,
            })
            .expect("raw sql granted");
        assert!(matches!(
            writer.authorize(Operation::Command { kind: "kv", name: "delete" }),
            Err(Error::Unauthorized { ref what, .. }) if what == "run \"delete\""
        ));
        assert!(writer
            .authorize(Operation::Query {
                kind: "chat",
                name: "get"
            })
            .is_err());
        assert!(writer
            .authorize(Operation::Admin { operation: "drain" })
            .is_err());
        let reader = registry.get("reader").expect("reader");
        reader
            .authorize(Operation::Query {
                kind: "chat",
                name: "anything",
            })
            .expect("wildcards");
        assert!(
            reader
                .authorize(Operation::Command {
                    kind: "kv",
                    name: RAW_SQL_COMMAND
                })
                .is_err(),
            "a wildcard never grants raw SQL"
        );
        reader
            .authorize(Operation::Admin { operation: "drain" })
            .expect("admin");
        assert!(matches!(registry.get("nobody"), Err(Error::UnknownKey(id)) if id == "nobody"));
    }

    #[test]
    fn bad_files_are_refused_with_a_reason() {
        let key = generate_signing_key().verifying_key();
        let entry = KeyEntry::new("a", &key, vec![], vec![]);
        let twice = format!("{}{}", entry.to_toml(), entry.to_toml());
        assert!(KeyRegistry::from_toml_str(&twice)
            .unwrap_err()
            .0
            .contains("twice"));
        let bad_key = entry.to_toml().replace(&entry.public_key, "00");
        assert!(KeyRegistry::from_toml_str(&bad_key)
            .unwrap_err()
            .0
            .contains("64 hex"));
        assert!(KeyRegistry::from_toml_str("[[keys]]\nid = \"x\"\n").is_err());
        assert!(
            KeyRegistry::from_toml_str("[[keys]]\nid=\"\"\npublic_key=\"\"\nextra=1\n").is_err()
        );
        assert_eq!(KeyRegistry::from_toml_str("").expect("empty").len(), 0);
        let mut tokens = entry.clone();
        tokens.stream_token_prefixes = vec!["/v1/stream/app/".into()];
        let loaded = KeyRegistry::from_toml_str(&tokens.to_toml()).expect("prefixes");
        assert_eq!(loaded.get("a").unwrap().entry, tokens);
        tokens.stream_token_prefixes = vec!["v1/stream/".into()];
        assert!(KeyRegistry::from_toml_str(&tokens.to_toml())
            .unwrap_err()
            .0
            .contains("stream_token_prefixes"));
    }
}
