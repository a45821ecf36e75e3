//! Test support for every later test of the runtime: a journal kind that exposes double application, and the exact recovery check.
//!
//! The check ([`AckLog::verify`]): every acknowledged command resolves to
//! COMMITTED with exactly the outcome the client was given (nothing
//! missing), every command reported not committed (and never acknowledged
//! later) resolves to ABSENT, and the journal holds each acknowledged
//! append exactly once and nothing else (nothing extra, nothing twice).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use cellfleet_cell::{CommandId, KindError, Outcome, RustKind};
use rusqlite::Connection;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::node::{NodeHandle, Resolution};

/// The journal kind's name.
pub const JOURNAL: &str = "journal";

/// A kind whose `append {tag}` inserts a row: a command applied twice
/// shows up twice. `all {}` lists the tags in order.
#[derive(Debug, Clone, Default)]
pub struct Journal;

/// Journal commands.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "name", content = "args", rename_all = "snake_case")]
pub enum JournalCommand {
    /// Append one tag.
    Append {
        /// The tag.
        tag: String,
    },
}

/// Journal queries.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "name", content = "args", rename_all = "snake_case")]
pub enum JournalQuery {
    /// Every tag, in order.
    All {},
}

impl RustKind for Journal {
    type Command = JournalCommand;
    type Query = JournalQuery;
    type Output = Value;

    fn name(&self) -> &str {
        JOURNAL
    }

    fn migrations(&self) -> Vec<String> {
        vec![
            "CREATE TABLE journal (seq INTEGER PRIMARY KEY AUTOINCREMENT, tag TEXT NOT NULL)"
                .into(),
        ]
    }

    fn execute(&self, conn: &Connection, command: JournalCommand) -> Result<Value, KindError> {
        let JournalCommand::Append { tag } = command;
        conn.execute("INSERT INTO journal (tag) VALUES (?1)", [&tag])?;
        Ok(json!({ "seq": conn.last_insert_rowid() }))
    }

    fn query(&self, conn: &Connection, _query: JournalQuery) -> Result<Value, KindError> {
        let mut statement = conn.prepare("SELECT tag FROM journal ORDER BY seq")?;
        let tags = statement
            .query_map([], |row| row.get::<_, String>(0))?
            .collect::<rusqlite::Result<Vec<String>>>()?;
        Ok(json!(tags))
    }
}

/// The tags of the journal Cell `key`, in order.
pub async fn journal_tags(node: &NodeHandle, key: &[u8]) -> crate::Result<Vec<String>> {
    let queried = as_a_client(|| node.query(JOURNAL, key, "all", json!({}), None)).await?;
    serde_json::from_value(queried.value).map_err(|e| crate::Error::BadRequest(e.to_string()))
}

/// Calls `request` again after the node's hint while it answers
/// `ResourceExhausted` (no open-Cell slot free yet), as a client does; at
/// most 200 times.
pub async fn as_a_client<T, F, Fut>(mut request: F) -> crate::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = crate::Result<T>>,
{
    let mut tries = 0;
    loop {
        match request().await {
            Err(crate::Error::ResourceExhausted { retry_after_ms, .. }) if tries < 200 => {
                tries += 1;
                tokio::time::sleep(std::time::Duration::from_millis(retry_after_ms.max(1))).await;
            }
            other => return other,
        }
    }
}

#[derive(Debug, Default)]
struct Entries {
    acked: BTreeMap<[u8; 16], (String, Outcome)>,
    not_committed: BTreeMap<[u8; 16], String>,
}

/// What clients were told, per command id, for one journal Cell.
#[derive(Debug, Default, Clone)]
pub struct AckLog {
    entries: Arc<Mutex<Entries>>,
}

impl AckLog {
    fn entries(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `id` (appending `tag`) was acknowledged with `outcome`.
    pub fn ack(&self, id: [u8; 16], tag: impl Into<String>, outcome: Outcome) {
        let mut entries = self.entries();
        entries.not_committed.remove(&id);
        entries.acked.insert(id, (tag.into(), outcome));
    }

    /// `id` was reported not committed (and not retried yet).
    pub fn not_committed(&self, id: [u8; 16], tag: impl Into<String>) {
        let mut entries = self.entries();
        if !entries.acked.contains_key(&id) {
            entries.not_committed.insert(id, tag.into());
        }
    }

    /// Acknowledged commands so far.
    pub fn acked(&self) -> usize {
        self.entries().acked.len()
    }

    /// The exact recovery check against journal Cell `key` (see the module
    /// docs); returns a description of the first difference.
    pub async fn verify(&self, node: &NodeHandle, key: &[u8]) -> Result<(), String> {
        let (acked, not_committed) = {
            let entries = self.entries();
            (entries.acked.clone(), entries.not_committed.clone())
        };
        let mut found = journal_tags(node, key).await.map_err(|e| e.to_string())?;
        let mut expected: Vec<String> = acked.values().map(|(tag, _)| tag.clone()).collect();
        found.sort();
        expected.sort();
        if found != expected {
            return Err(format!(
                "journal differs from the acknowledged log: found {found:?}, expected {expected:?}"
            ));
        }
        for (id, (tag, outcome)) in &acked {
            match as_a_client(|| node.resolve(JOURNAL, key, CommandId(*id), None)).await {
                Ok(Resolution::Committed {
                    outcome: stored, ..
                }) if stored == *outcome => {}
                other => {
                    return Err(format!(
                        "{tag} acknowledged as {outcome:?} but resolves to {other:?}"
                    ))
                }
            }
        }
        // Absence is provable only inside the command's window; the check
        // runs right after the workload, well inside any test's window.
        let window_open = i64::MAX / 2;
        for (id, tag) in &not_committed {
            match as_a_client(|| node.resolve(JOURNAL, key, CommandId(*id), Some(window_open)))
                .await
            {
                Ok(Resolution::Absent) => {}
                other => {
                    return Err(format!(
                        "{tag} reported not committed but resolves to {other:?}"
                    ))
                }
            }
        }
        Ok(())
    }
}
