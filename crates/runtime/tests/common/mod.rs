//! Shared test harness: a journal kind, nodes on a shared store, and the exact recovery check (acknowledged log vs recovered state).

#![allow(dead_code)]

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cellfleet_authority::{Clock, LeaseConfig, ManualClock, NodeId};
use cellfleet_cell::{Command, CommandId, KindError, Outcome, RustKind, Typed};
use cellfleet_runtime::{Kinds, Node, NodeConfig, NodeHandle, Resolution};
use cellfleet_store::{LocalStore, ObjectStore};
use rusqlite::Connection;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

pub const START_MS: u64 = 1_700_000_000_000;
pub const KIND: &str = "journal";

/// Appends tags to a journal; a tag applied twice shows up twice.
#[derive(Debug, Clone)]
pub struct Journal;

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "name", content = "args", rename_all = "snake_case")]
pub enum JournalCommand {
    Append { tag: String },
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "name", content = "args", rename_all = "snake_case")]
pub enum JournalQuery {
    All {},
}

impl RustKind for Journal {
    type Command = JournalCommand;
    type Query = JournalQuery;
    type Output = Value;

    fn name(&self) -> &str {
        KIND
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

pub fn kinds() -> Arc<Kinds> {
    Arc::new(Kinds::builtin().with(Arc::new(Typed(Journal))))
}

pub fn lease_config() -> LeaseConfig {
    LeaseConfig {
        lease_ms: 10_000,
        renew_every_ms: 3_000,
        drift_margin_ms: 500,
    }
}

pub fn node_config(name: &str, dir: &Path, prefix: &str) -> NodeConfig {
    let mut config = NodeConfig::new(NodeId::new(name).unwrap(), dir.join(name), prefix);
    config.lease = lease_config();
    config.endpoints.grpc = format!("https://{name}:7000");
    config
}

pub async fn start(
    config: NodeConfig,
    store: Arc<dyn ObjectStore>,
    clock: Arc<dyn Clock>,
) -> NodeHandle {
    Node::start(config, store, clock, kinds())
        .await
        .expect("node starts")
}

pub fn manual_clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(START_MS))
}

/// The backends every multi-node test runs on: the local-directory store
/// and real SeaweedFS.
pub async fn backends(name: &str, dir: &Path) -> Vec<(&'static str, Arc<dyn ObjectStore>, String)> {
    let local: Arc<dyn ObjectStore> =
        Arc::new(LocalStore::open(dir.join("bucket")).expect("local store"));
    let s3: Arc<dyn ObjectStore> = cellfleet_store::testkit::s3_store().await;
    vec![
        ("local", local, format!("{name}-local")),
        ("s3", s3, cellfleet_store::testkit::unique_prefix(name)),
    ]
}

pub fn command_id(n: u64) -> [u8; 16] {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&0x5eed_u64.to_be_bytes());
    id[8..].copy_from_slice(&n.to_be_bytes());
    id
}

pub fn append(clock: &dyn Clock, n: u64) -> Command {
    Command::new(
        command_id(n),
        "append",
        json!({ "tag": format!("t{n}") }),
        (clock.now_wall_ms() + 600_000) as i64,
    )
}

/// Acknowledged commands: id, tag and the outcome the client was given.
#[derive(Debug, Default, Clone)]
pub struct AckLog {
    entries: Arc<Mutex<Vec<(u64, Outcome)>>>,
}

impl AckLog {
    pub fn ack(&self, n: u64, outcome: Outcome) {
        self.entries.lock().unwrap().push((n, outcome));
    }

    pub fn len(&self) -> usize {
        self.entries.lock().unwrap().len()
    }

    /// The exact recovery check: the journal holds every acknowledged
    /// command exactly once and nothing else; the ledger returns the
    /// acknowledged outcome for each.
    pub async fn verify(&self, node: &NodeHandle, key: &[u8]) {
        let tags = journal(node, key).await;
        let mut expected: Vec<String> = self
            .entries
            .lock()
            .unwrap()
            .iter()
            .map(|(n, _)| format!("t{n}"))
            .collect();
        let mut found = tags.clone();
        expected.sort();
        found.sort();
        assert_eq!(
            found, expected,
            "recovered journal differs from the acknowledged log"
        );
        let entries = self.entries.lock().unwrap().clone();
        for (n, outcome) in entries {
            match node
                .resolve(KIND, key, CommandId(command_id(n)), None)
                .await
                .expect("resolve")
            {
                Resolution::Committed {
                    outcome: stored, ..
                } => assert_eq!(stored, outcome, "t{n}"),
                other => panic!("t{n} acknowledged but resolves to {other:?}"),
            }
        }
    }
}

pub async fn journal(node: &NodeHandle, key: &[u8]) -> Vec<String> {
    let value = node
        .query(KIND, key, "all", json!({}), None)
        .await
        .expect("journal query");
    serde_json::from_value(value).expect("tags")
}

pub fn lease_expiry() -> Duration {
    let lease = lease_config();
    Duration::from_millis(lease.lease_ms + lease.drift_margin_ms + 1)
}
