//! Model-based property test: random groups of commands (failing ones,
//! duplicates, reused ids, aborted publications, a migration, compactions,
//! reopen), with and without checksums in the LTX files; after every step,
//! recovering from the published chain gives a byte-identical database and
//! identical query results.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use cellfleet_cell::{Cell, CellConfig, Command, Kind, Manifest, Outcome, RejectCode};
use common::{id, Harness, NOW};
use proptest::prelude::*;
use serde_json::{json, Value};

const V1: &str = r#"
[kinds.model]
raw_sql = true
migrations = ["CREATE TABLE items (k INTEGER PRIMARY KEY, v TEXT NOT NULL)",
              "CREATE TABLE blobs (k INTEGER PRIMARY KEY, b BLOB NOT NULL)"]
[kinds.model.commands.upsert]
sql = "INSERT OR REPLACE INTO items VALUES (:k, :v)"
[kinds.model.commands.del]
sql = ["DELETE FROM items WHERE k = :k", "DELETE FROM blobs WHERE k = :k"]
[kinds.model.commands.fail]
sql = ["INSERT OR REPLACE INTO items VALUES (:k, 'doomed')", "INSERT INTO items VALUES (:k, NULL)"]
[kinds.model.commands.big]
sql = "INSERT OR REPLACE INTO blobs VALUES (:k, zeroblob(:n))"
[kinds.model.queries.items]
sql = "SELECT k, v FROM items ORDER BY k"
[kinds.model.queries.blobs]
sql = "SELECT k, length(b) FROM blobs ORDER BY k"
[kinds.model.limits]
rows_max = 10000
"#;

fn kind(v2: bool) -> Arc<dyn Kind> {
    let text = if v2 {
        V1.replace(
            "\"CREATE TABLE blobs (k INTEGER PRIMARY KEY, b BLOB NOT NULL)\"]",
            "\"CREATE TABLE blobs (k INTEGER PRIMARY KEY, b BLOB NOT NULL)\", \"CREATE INDEX items_v ON items (v)\"]",
        )
    } else {
        V1.to_string()
    };
    Manifest::parse(&text).unwrap().kind("model").unwrap()
}

#[derive(Clone, Debug)]
enum Op {
    Upsert(i64, String),
    Delete(i64),
    Fail(i64),
    Big(i64, i64),
    /// Resubmit the n-th command ever submitted (same id, same payload).
    Repeat(usize),
    /// Reuse the n-th id for another payload.
    Reuse(usize, i64),
}

#[derive(Clone, Debug)]
enum Step {
    Group(Vec<Op>),
    Aborted(Vec<Op>),
    Migrate,
    Compact { suffix: bool },
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0i64..30, "[a-z]{0,12}").prop_map(|(k, v)| Op::Upsert(k, v)),
        2 => (0i64..30).prop_map(Op::Delete),
        1 => (0i64..30).prop_map(Op::Fail),
        1 => (0i64..30, 0i64..30_000).prop_map(|(k, n)| Op::Big(k, n)),
        2 => any::<usize>().prop_map(Op::Repeat),
        1 => (any::<usize>(), 0i64..30).prop_map(|(i, k)| Op::Reuse(i, k)),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => prop::collection::vec(op(), 0..12).prop_map(Step::Group),
        2 => prop::collection::vec(op(), 1..6).prop_map(Step::Aborted),
        1 => Just(Step::Migrate),
        2 => any::<bool>().prop_map(|suffix| Step::Compact { suffix }),
        1 => Just(Step::Reopen),
    ]
}

#[derive(Default, Clone)]
struct Model {
    items: BTreeMap<i64, String>,
    blobs: BTreeMap<i64, i64>,
    /// Every published command: its id, payload and outcome.
    published: Vec<(Command, Outcome)>,
    by_id: HashMap<[u8; 16], usize>,
    next_id: u64,
}

impl Model {
    fn command(&mut self, op: &Op) -> (Command, Option<usize>) {
        let fresh = |m: &mut Model, name: &str, args: Value| {
            m.next_id += 1;
            (Command::new(id(m.next_id), name, args, NOW + 60_000), None)
        };
        match op {
            Op::Upsert(k, v) => fresh(self, "upsert", json!({"k": k, "v": v})),
            Op::Delete(k) => fresh(self, "del", json!({"k": k})),
            Op::Fail(k) => fresh(self, "fail", json!({"k": k})),
            Op::Big(k, n) => fresh(self, "big", json!({"k": k, "n": n})),
            Op::Repeat(i) if !self.published.is_empty() => {
                let i = i % self.published.len();
                (self.published[i].0.clone(), Some(i))
            }
            Op::Reuse(i, k) if !self.published.is_empty() => {
                let mut c = self.published[i % self.published.len()].0.clone();
                c.name = "del".into();
                c.args = json!({"k": k, "reused": true});
                (c, None)
            }
            Op::Repeat(_) | Op::Reuse(..) => fresh(self, "del", json!({"k": 0})),
        }
    }

    /// Apply a fresh command to the model; its expected outcome is "applied"
    /// unless it is `fail` (or `del` with an unknown argument).
    fn apply(&mut self, c: &Command) -> bool {
        let k = c.args["k"].as_i64().unwrap();
        match c.name.as_str() {
            "upsert" => {
                self.items
                    .insert(k, c.args["v"].as_str().unwrap().to_string());
            }
            "del" if c.args.get("reused").is_some() => return false,
            "del" => {
                self.items.remove(&k);
                self.blobs.remove(&k);
            }
            "big" => {
                self.blobs.insert(k, c.args["n"].as_i64().unwrap());
            }
            _ => return false,
        }
        true
    }
}

fn check(h: &mut Harness, model: &Model, cfg: &CellConfig) -> Result<(), TestCaseError> {
    let items = h.cell().query("items", &json!({})).unwrap();
    let expected: Vec<Value> = model.items.iter().map(|(k, v)| json!([k, v])).collect();
    prop_assert_eq!(&items["rows"], &Value::Array(expected));
    let blobs = h.cell().query("blobs", &json!({})).unwrap();
    let expected: Vec<Value> = model.blobs.iter().map(|(k, n)| json!([k, n])).collect();
    prop_assert_eq!(&blobs["rows"], &Value::Array(expected));
    let name = format!("rec-{}.db", h.position().txid.0);
    let (pos, recovered) = h.recover_bytes(&name);
    prop_assert_eq!(pos, h.position());
    prop_assert_eq!(&recovered, &h.live_bytes());
    let opened = Cell::open(
        &h.dir.path().join(&name),
        h.kind.clone(),
        cfg.clone(),
        pos,
        NOW,
    )
    .unwrap();
    prop_assert!(opened.migration.is_none());
    prop_assert_eq!(opened.cell.query("items", &json!({})).unwrap(), items);
    prop_assert_eq!(opened.cell.query("blobs", &json!({})).unwrap(), blobs);
    Ok(())
}

fn run_steps(steps: Vec<Step>, checksums_in_file: bool) -> Result<(), TestCaseError> {
    let cfg = CellConfig {
        snapshot_delta_bytes: 24 * 4096,
        checkpoint_wal_bytes: 64 * 1024,
        ltx_checksums_in_file: checksums_in_file,
        ..CellConfig::default()
    };
    let mut h = Harness::new(kind(false), cfg.clone());
    let mut model = Model::default();
    let mut migrated = false;
    for step in steps {
        match step {
            Step::Group(ops) | Step::Aborted(ops) if ops.is_empty() => {}
            Step::Group(ops) => {
                let before = model.clone();
                let mut expected = Vec::new();
                let mut group = Vec::new();
                let mut fresh_in_group: HashMap<[u8; 16], usize> = HashMap::new();
                for op in &ops {
                    let (c, repeat) = model.command(op);
                    group.push(c.clone());
                    expected.push((c, repeat));
                }
                let result = h.run(&group);
                for ((c, repeat), got) in expected.iter().zip(&result.results) {
                    if let Some(i) = repeat {
                        prop_assert!(got.duplicate);
                        prop_assert_eq!(&got.outcome, &model.published[*i].1);
                    } else if let Some(&i) =
                        model.by_id.get(&c.id.0).or(fresh_in_group.get(&c.id.0))
                    {
                        let same = model.published.get(i).map(|p| p.0 == *c).unwrap_or(false);
                        if same {
                            prop_assert!(got.duplicate);
                        } else {
                            let reused = matches!(&got.outcome, Outcome::Rejected { rejection } if rejection.code == RejectCode::IdReused);
                            prop_assert!(reused);
                        }
                    } else {
                        let applied = model.apply(c);
                        prop_assert_eq!(
                            matches!(got.outcome, Outcome::Applied { .. }),
                            applied,
                            "{:?} -> {:?}",
                            c,
                            got
                        );
                        model.published.push((c.clone(), got.outcome.clone()));
                        model.by_id.insert(c.id.0, model.published.len() - 1);
                        fresh_in_group.insert(c.id.0, model.published.len() - 1);
                    }
                }
                let _ = before;
            }
            Step::Aborted(ops) => {
                let before_pos = h.position();
                let mut scratch = model.clone();
                let group: Vec<Command> = ops.iter().map(|op| scratch.command(op).0).collect();
                let now = h.now;
                let r = h.cell().execute(&group, now).unwrap();
                if r.publication.is_some() {
                    h.cell().abort().unwrap();
                }
                prop_assert_eq!(h.position(), before_pos);
                // Ids of the aborted group stay unused in the model: they may
                // come back fresh later (next_id was not advanced).
            }
            Step::Migrate => {
                if !migrated {
                    migrated = true;
                    let txid = h.position().txid;
                    h.reopen_with(kind(true));
                    prop_assert_eq!(h.position().txid.0, txid.0 + 1);
                }
            }
            Step::Compact { suffix } => {
                let files = h.chain_files();
                if suffix && files.len() > 2 {
                    let merged = cellfleet_cell::compact(&files[1..]).unwrap();
                    prop_assert_eq!(merged.post, h.position());
                    let first = h.chain[0].clone();
                    h.chain = vec![first, (merged.ltx, merged.post)];
                } else {
                    let merged = cellfleet_cell::compact(&files).unwrap();
                    prop_assert_eq!(merged.post, h.position());
                    let file = if merged.shrank {
                        (merged.ltx, merged.post)
                    } else {
                        let now = h.now;
                        let snapshot = h.cell().snapshot(now).unwrap();
                        (snapshot.ltx, snapshot.post)
                    };
                    h.chain = vec![file];
                }
            }
            Step::Reopen => h.open(),
        }
        check(&mut h, &model, &cfg)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn recovery_matches_the_live_cell(
        steps in prop::collection::vec(step(), 1..12),
        checksums_in_file in any::<bool>(),
    ) {
        run_steps(steps, checksums_in_file)?;
    }
}
