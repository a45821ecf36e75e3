//! The built-in `kv` kind, written as a [`RustKind`]: get, put, delete,
//! compare-and-set and prefix scan over JSON values keyed by strings.

use rusqlite::{Connection, OptionalExtension};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::command::RejectCode;
use crate::kind::{KindError, Limits, RustKind};

/// Longest key accepted, in bytes.
pub const KEY_BYTES_MAX: usize = 1024;
/// Most entries one scan returns.
pub const SCAN_LIMIT_MAX: u32 = 1000;

/// The `kv` kind.
#[derive(Clone, Debug, Default)]
pub struct Kv;

/// A `kv` command.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", content = "args", rename_all = "snake_case")]
pub enum KvCommand {
    Put {
        key: String,
        value: Value,
    },
    Delete {
        key: String,
    },
    /// Set `key` to `value` (delete when `None`) only if it currently holds
    /// `expected` (absent when `None`).
    Cas {
        key: String,
        expected: Option<Value>,
        value: Option<Value>,
    },
}

/// A `kv` query.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", content = "args", rename_all = "snake_case")]
pub enum KvQuery {
    Get {
        key: String,
    },
    /// Entries whose key starts with `prefix`, in key order, after `after`.
    Scan {
        prefix: String,
        #[serde(default)]
        after: Option<String>,
        #[serde(default)]
        limit: Option<u32>,
    },
}

/// What a `kv` command or query returns.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum KvOutput {
    Value {
        value: Option<Value>,
    },
    Written {
        /// The previous value.
        previous: Option<Value>,
    },
    Cas {
        swapped: bool,
        current: Option<Value>,
    },
    Entries {
        entries: Vec<(String, Value)>,
        /// Pass as `after` to continue; `None` when the scan is complete.
        next: Option<String>,
    },
}

fn check_key(key: &str) -> Result<(), KindError> {
    if key.len() > KEY_BYTES_MAX {
        return Err(KindError::reject(
            RejectCode::LimitExceeded,
            format!("key of {} bytes exceeds {KEY_BYTES_MAX}", key.len()),
        ));
    }
    Ok(())
}

fn get(conn: &Connection, key: &str) -> Result<Option<Value>, KindError> {
    let text: Option<String> = conn
        .prepare_cached("SELECT value FROM kv WHERE key = ?1")?
        .query_row([key], |row| row.get(0))
        .optional()?;
    text.map(|t| {
        serde_json::from_str(&t).map_err(|e| {
            KindError::reject(RejectCode::Kind, format!("stored value is not json: {e}"))
        })
    })
    .transpose()
}

fn set(conn: &Connection, key: &str, value: Option<&Value>) -> Result<(), KindError> {
    match value {
        Some(v) => {
            conn.prepare_cached(
                "INSERT INTO kv (key, value) VALUES (?1, ?2) \
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            )?
            .execute((key, v.to_string()))?;
        }
        None => {
            conn.prepare_cached("DELETE FROM kv WHERE key = ?1")?
                .execute([key])?;
        }
    }
    Ok(())
}

impl RustKind for Kv {
    type Command = KvCommand;
    type Query = KvQuery;
    type Output = KvOutput;

    fn name(&self) -> &str {
        "kv"
    }

    fn migrations(&self) -> Vec<String> {
        vec!["CREATE TABLE kv (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID".into()]
    }

    fn limits(&self) -> Limits {
        Limits::default()
    }

    fn execute(&self, conn: &Connection, command: KvCommand) -> Result<KvOutput, KindError> {
        match command {
            KvCommand::Put { key, value } => {
                check_key(&key)?;
                let previous = get(conn, &key)?;
                set(conn, &key, Some(&value))?;
                Ok(KvOutput::Written { previous })
            }
            KvCommand::Delete { key } => {
                check_key(&key)?;
                let previous = get(conn, &key)?;
                set(conn, &key, None)?;
                Ok(KvOutput::Written { previous })
            }
            KvCommand::Cas {
                key,
                expected,
                value,
            } => {
                check_key(&key)?;
                let current = get(conn, &key)?;
                if current != expected {
                    return Ok(KvOutput::Cas {
                        swapped: false,
                        current,
                    });
                }
                set(conn, &key, value.as_ref())?;
                Ok(KvOutput::Cas {
                    swapped: true,
                    current: value,
                })
            }
        }
    }

    fn query(&self, conn: &Connection, query: KvQuery) -> Result<KvOutput, KindError> {
        match query {
            KvQuery::Get { key } => {
                check_key(&key)?;
                Ok(KvOutput::Value {
                    value: get(conn, &key)?,
                })
            }
            KvQuery::Scan {
                prefix,
                after,
                limit,
            } => {
                check_key(&prefix)?;
                let limit = limit.unwrap_or(100).clamp(1, SCAN_LIMIT_MAX) as usize;
                let start = match &after {
                    Some(a) if a.as_str() >= prefix.as_str() => a.clone(),
                    _ => prefix.clone(),
                };
                let mut stmt = conn.prepare_cached(
                    "SELECT key, value FROM kv WHERE key >= ?1 AND (?2 IS NULL OR key > ?2) ORDER BY key",
                )?;
                let mut rows = stmt.query((start, after))?;
                let mut entries = Vec::new();
                let mut next = None;
                // Rows come in key order: the first key without the prefix
                // ends the range, so the scan reads only what it returns.
                while let Some(row) = rows.next()? {
                    let key: String = row.get(0)?;
                    if !key.starts_with(&prefix) {
                        break;
                    }
                    if entries.len() == limit {
                        next = entries.last().map(|(k, _): &(String, Value)| k.clone());
                        break;
                    }
                    let text: String = row.get(1)?;
                    let value = serde_json::from_str(&text).map_err(|e| {
                        KindError::reject(
                            RejectCode::Kind,
                            format!("stored value is not json: {e}"),
                        )
                    })?;
                    entries.push((key, value));
                }
                Ok(KvOutput::Entries { entries, next })
            }
        }
    }
}
