//! Shared test harness: a Cell whose publications are "uploaded" to an
//! in-memory chain, and recovery of that chain into fresh files.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cellfleet_cell::{
    Cell, CellConfig, ChainFile, Command, GroupResult, Kind, Position, Publication,
};

pub const NOW: i64 = 1_700_000_000_000;

/// The built-in key-value kind.
pub fn kv() -> Arc<dyn Kind> {
    Arc::new(cellfleet_cell::Typed(cellfleet_cell::kv::Kv))
}

/// A `kv` put of key `k{n}` to the value `n`, with command id `n`.
pub fn kv_put(n: u64) -> Command {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&n.to_be_bytes());
    let (name, args) = cellfleet_cell::kind::to_wire(&cellfleet_cell::kv::KvCommand::Put {
        key: format!("k{n}"),
        value: serde_json::json!(n),
    })
    .expect("a kv command is JSON");
    Command::new(id, name, args, NOW + 60_000)
}

pub struct Harness {
    pub dir: tempfile::TempDir,
    pub path: PathBuf,
    pub kind: Arc<dyn Kind>,
    pub config: CellConfig,
    pub cell: Option<Cell>,
    /// The published chain, oldest first: each file and its recorded
    /// post-apply position (what an authority root keeps).
    pub chain: Vec<(Vec<u8>, Position)>,
    pub now: i64,
}

impl Harness {
    pub fn new(kind: Arc<dyn Kind>, config: CellConfig) -> Harness {
        Harness::new_after(kind, config, |_| {})
    }

    /// [`Harness::new`], with `before_open` run on the Cell's path first.
    pub fn new_after(
        kind: Arc<dyn Kind>,
        config: CellConfig,
        before_open: impl FnOnce(&Path),
    ) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cell.db");
        before_open(&path);
        let mut h = Harness {
            dir,
            path,
            kind,
            config,
            cell: None,
            chain: Vec::new(),
            now: NOW,
        };
        h.open();
        h
    }

    /// The published position (what the chain recovers to).
    pub fn position(&self) -> Position {
        self.cell.as_ref().unwrap().published_position()
    }

    pub fn cell(&mut self) -> &mut Cell {
        self.cell.as_mut().unwrap()
    }

    pub fn publish(&mut self, p: Publication) {
        if p.is_snapshot() {
            self.chain.clear();
        }
        self.chain.push((p.ltx.clone(), p.post));
        self.cell().confirm(p.txid).unwrap();
    }

    /// Open (or reopen) at the published position, publishing migrations.
    pub fn open(&mut self) {
        let published = self
            .cell
            .take()
            .map(|c| c.published_position())
            .unwrap_or_else(|| {
                if self.chain.is_empty() {
                    Position::EMPTY
                } else {
                    let probe = self.dir.path().join("probe.db");
                    cellfleet_cell::recover(self.chain_files(), &probe).unwrap()
                }
            });
        let opened = Cell::open(
            &self.path,
            self.kind.clone(),
            self.config.clone(),
            published,
            self.now,
        )
        .unwrap();
        self.cell = Some(opened.cell);
        if let Some(p) = opened.migration {
            self.publish(p);
        }
    }

    pub fn reopen_with(&mut self, kind: Arc<dyn Kind>) {
        self.kind = kind;
        self.open();
    }

    /// Execute and publish.
    pub fn run(&mut self, group: &[Command]) -> GroupResult {
        let now = self.now;
        let mut result = self.cell().execute(group, now).unwrap();
        if let Some(p) = result.publication.take() {
            self.publish(p.clone());
            result.publication = Some(p);
        }
        result
    }

    /// The published chain as recovery and compaction take it.
    pub fn chain_files(&self) -> Vec<ChainFile<&[u8]>> {
        self.chain
            .iter()
            .map(|(ltx, post)| ChainFile::new(ltx, *post))
            .collect()
    }

    /// Recover the published chain into `name` and return its bytes.
    pub fn recover_bytes(&self, name: &str) -> (Position, Vec<u8>) {
        let target = self.dir.path().join(name);
        let pos = cellfleet_cell::recover(self.chain_files(), &target).unwrap();
        (pos, std::fs::read(&target).unwrap())
    }

    /// The live database's bytes after a checkpoint.
    pub fn live_bytes(&mut self) -> Vec<u8> {
        self.cell().checkpoint().unwrap();
        std::fs::read(&self.path).unwrap()
    }
}

pub fn id(n: u64) -> [u8; 16] {
    let mut id = [0u8; 16];
    id[8..].copy_from_slice(&n.to_be_bytes());
    id
}

pub fn path_of(dir: &Path, name: &str) -> PathBuf {
    dir.join(name)
}
