//! The `ds_registry` Cell: which subscriptions exist and what they match, explicit links by stream, and the webhook signing key.

use cellfleet_cell::{KindError, Limits, RustKind};
use rusqlite::{Connection, OptionalExtension};
use serde::{Deserialize, Serialize};

/// The registry kind's name.
pub const REGISTRY_KIND: &str = "ds_registry";
/// The one registry Cell's key.
pub const REGISTRY_KEY: &str = "subscriptions";
/// Subscriptions the registry holds (the bound of every pattern scan).
pub const SUBSCRIPTIONS_MAX: usize = 1_000;
/// Explicit links the registry holds.
pub const EXPLICIT_MAX: usize = 10_000;

/// The registry kind.
#[derive(Clone, Debug, Default)]
pub struct RegistryKind;

/// A registered subscription: its Cell key, the stream prefix it lives under, its pattern.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registered {
    pub key: String,
    pub prefix: String,
    pub pattern: Option<String>,
}

/// `ds_registry` commands.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "name", content = "args", rename_all = "snake_case")]
pub enum RegistryCommand {
    Register {
        sub: Registered,
    },
    Unregister {
        key: String,
    },
    /// Explicit link of the full stream path `path` to subscription `key`.
    Link {
        key: String,
        path: String,
    },
    Unlink {
        key: String,
        path: String,
    },
    /// Stores `seed` as the signing key unless one is stored; returns the stored one.
    SigningKey {
        seed: String,
    },
}

/// `ds_registry` queries.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "name", content = "args", rename_all = "snake_case")]
pub enum RegistryQuery {
    Snapshot {},
    SigningKey {},
}

/// What a `ds_registry` command or query returns.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RegistryOutput {
    Done,
    Full,
    Snapshot {
        subs: Vec<Registered>,
        /// `(full stream path, subscription key)`.
        explicit: Vec<(String, String)>,
    },
    SigningKey {
        seed: Option<String>,
    },
}

fn registry_tables(conn: &Connection) -> Result<bool, KindError> {
    let n: i64 = conn
        .prepare_cached(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'subs'",
        )?
        .query_row([], |r| r.get(0))?;
    Ok(n > 0)
}

fn stored_seed(conn: &Connection) -> Result<Option<String>, KindError> {
    if !registry_tables(conn)? {
        return Ok(None);
    }
    Ok(conn
        .prepare_cached("SELECT seed FROM signing WHERE id = 1")?
        .query_row([], |r| r.get(0))
        .optional()?)
}

impl RustKind for RegistryKind {
    type Command = RegistryCommand;
    type Query = RegistryQuery;
    type Output = RegistryOutput;

    fn name(&self) -> &str {
        REGISTRY_KIND
    }

    fn migrations(&self) -> Vec<String> {
        vec!["CREATE TABLE subs (key TEXT PRIMARY KEY, prefix TEXT NOT NULL, pattern TEXT); \
              CREATE TABLE explicit (path TEXT NOT NULL, key TEXT NOT NULL, PRIMARY KEY (path, key)); \
              CREATE TABLE signing (id INTEGER PRIMARY KEY CHECK (id = 1), seed TEXT NOT NULL)"
            .into()]
    }

    fn limits(&self) -> Limits {
        Limits {
            rows_max: 100_000,
            bytes_max: 16 << 20,
            statements_max: 64,
            payload_bytes_max: 1 << 20,
        }
    }

    fn execute(
        &self,
        conn: &Connection,
        command: RegistryCommand,
    ) -> Result<RegistryOutput, KindError> {
        let count = |table: &str| -> Result<usize, KindError> {
            let n: i64 = conn
                .prepare(&format!("SELECT count(*) FROM {table}"))?
                .query_row([], |r| r.get(0))?;
            Ok(n as usize)
        };
        match command {
            RegistryCommand::Register { sub } => {
                let known: Option<String> = conn
                    .prepare_cached("SELECT key FROM subs WHERE key = ?1")?
                    .query_row([&sub.key], |r| r.get(0))
                    .optional()?;
                if known.is_none() && count("subs")? >= SUBSCRIPTIONS_MAX {
                    return Ok(RegistryOutput::Full);
                }
                conn.execute(
                    "INSERT INTO subs (key, prefix, pattern) VALUES (?1, ?2, ?3) \
                     ON CONFLICT (key) DO UPDATE SET prefix = excluded.prefix, pattern = excluded.pattern",
                    (&sub.key, &sub.prefix, &sub.pattern),
                )?;
                Ok(RegistryOutput::Done)
            }
            RegistryCommand::Unregister { key } => {
                conn.execute("DELETE FROM subs WHERE key = ?1", [&key])?;
                conn.execute("DELETE FROM explicit WHERE key = ?1", [&key])?;
                Ok(RegistryOutput::Done)
            }
            RegistryCommand::Link { key, path } => {
                if count("explicit")? >= EXPLICIT_MAX {
                    return Ok(RegistryOutput::Full);
                }
                conn.execute(
                    "INSERT OR IGNORE INTO explicit (path, key) VALUES (?1, ?2)",
                    (&path, &key),
                )?;
                Ok(RegistryOutput::Done)
            }
            RegistryCommand::Unlink { key, path } => {
                conn.execute(
                    "DELETE FROM explicit WHERE path = ?1 AND key = ?2",
                    (&path, &key),
                )?;
                Ok(RegistryOutput::Done)
            }
            RegistryCommand::SigningKey { seed } => {
                if let Some(stored) = stored_seed(conn)? {
                    return Ok(RegistryOutput::SigningKey { seed: Some(stored) });
                }
                conn.execute("INSERT INTO signing (id, seed) VALUES (1, ?1)", [&seed])?;
                Ok(RegistryOutput::SigningKey { seed: Some(seed) })
            }
        }
    }

    fn query(&self, conn: &Connection, query: RegistryQuery) -> Result<RegistryOutput, KindError> {
        match query {
            RegistryQuery::SigningKey {} => Ok(RegistryOutput::SigningKey {
                seed: stored_seed(conn)?,
            }),
            RegistryQuery::Snapshot {} => {
                if !registry_tables(conn)? {
                    return Ok(RegistryOutput::Snapshot {
                        subs: Vec::new(),
                        explicit: Vec::new(),
                    });
                }
                let mut subs = Vec::new();
                let mut statement = conn.prepare_cached(&format!(
                    "SELECT key, prefix, pattern FROM subs ORDER BY key LIMIT {SUBSCRIPTIONS_MAX}"
                ))?;
                let mut rows = statement.query([])?;
                while let Some(row) = rows.next()? {
                    subs.push(Registered {
                        key: row.get(0)?,
                        prefix: row.get(1)?,
                        pattern: row.get(2)?,
                    });
                }
                let mut explicit = Vec::new();
                let mut statement = conn.prepare_cached(&format!(
                    "SELECT path, key FROM explicit ORDER BY path LIMIT {EXPLICIT_MAX}"
                ))?;
                let mut rows = statement.query([])?;
                while let Some(row) = rows.next()? {
                    explicit.push((row.get(0)?, row.get(1)?));
                }
                Ok(RegistryOutput::Snapshot { subs, explicit })
            }
        }
    }
}
