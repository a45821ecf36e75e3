//! Model-based property test: random groups of commands (failing ones,
//! duplicates, reused ids, aborted publications, pipelined publications
//! confirmed in order or aborted together, a migration, compactions,
//! reopen), with and without checksums in the LTX files. Queries always
//! answer from the published state, also while publications are pending;
//! after every step, recovering from the published chain gives a
//! byte-identical database and identical query results.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use cellfleet_cell::{
    Cell, CellConfig, Command, Error, GroupResult, Kind, Manifest, Outcome, Position, Publication,
    RejectCode, Txid,
};
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

/// What happens to two pipelined groups.
#[derive(Clone, Copy, Debug)]
enum Fate {
    ConfirmBoth,
    /// The first publication fails: both are void.
    AbortBoth,
    ConfirmFirstAbortSecond,
}

#[derive(Clone, Debug)]
enum Step {
    Group(Vec<Op>),
    Aborted(Vec<Op>),
    /// Execute `first`, then `second` while `first` is pending (queries
    /// checked while one and two are pending), then settle by `fate`.
    Pipelined {
        first: Vec<Op>,
        second: Vec<Op>,
        fate: Fate,
    },
    Migrate,
    Compact {
        suffix: bool,
    },
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
        4 => (
            prop::collection::vec(op(), 0..8),
            prop::collection::vec(op(), 0..8),
            prop_oneof![
                Just(Fate::ConfirmBoth),
                Just(Fate::AbortBoth),
                Just(Fate::ConfirmFirstAbortSecond)
            ],
        )
            .prop_map(|(first, second, fate)| Step::Pipelined { first, second, fate }),
        1 => Just(Step::Migrate),
        2 => any::<bool>().prop_map(|suffix| Step::Compact { suffix }),
        1 => Just(Step::Reopen),
    ]
}

#[derive(Default, Clone)]
struct Model {
    items: BTreeMap<i64, String>,
    blobs: BTreeMap<i64, i64>,
    /// Every executed command (published, or pending in a scratch model):
    /// its id, payload, outcome and the TXID of its group.
    published: Vec<(Command, Outcome, Txid)>,
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
                c.args = json!({"k": k, "reused": true}).into();
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

/// The commands of a group built from `ops`, each with the index of the
/// command it repeats.
fn build(model: &mut Model, ops: &[Op]) -> (Vec<Command>, Vec<(Command, Option<usize>)>) {
    let mut expected = Vec::new();
    let mut group = Vec::new();
    for op in ops {
        let (c, repeat) = model.command(op);
        group.push(c.clone());
        expected.push((c, repeat));
    }
    (group, expected)
}

/// Check a group's results against `model` and fold its fresh commands
/// in. `published` is the published TXID: an outcome stored by a later
/// (pending) group must name that group as its dependency.
fn expect(
    model: &mut Model,
    expected: &[(Command, Option<usize>)],
    result: &GroupResult,
    published: Txid,
) -> Result<(), TestCaseError> {
    let pending = |txid: Txid| (txid > published).then_some(txid);
    let group_txid = result.publication.as_ref().map(|p| p.txid);
    let mut fresh_in_group: HashMap<[u8; 16], usize> = HashMap::new();
    for ((c, repeat), got) in expected.iter().zip(&result.results) {
        if let Some(i) = repeat {
            prop_assert!(got.duplicate);
            prop_assert_eq!(&got.outcome, &model.published[*i].1);
            prop_assert_eq!(got.depends_on_txid, pending(model.published[*i].2));
        } else if let Some(&i) = model.by_id.get(&c.id.0).or(fresh_in_group.get(&c.id.0)) {
            let same = model.published.get(i).map(|p| p.0 == *c).unwrap_or(false);
            if same {
                prop_assert!(got.duplicate);
            } else {
                let reused = matches!(&got.outcome, Outcome::Rejected { rejection } if rejection.code == RejectCode::IdReused);
                prop_assert!(reused);
            }
            prop_assert_eq!(got.depends_on_txid, pending(model.published[i].2));
        } else {
            let applied = model.apply(c);
            prop_assert_eq!(
                matches!(got.outcome, Outcome::Applied { .. }),
                applied,
                "{:?} -> {:?}",
                c,
                got
            );
            prop_assert!(group_txid.is_some());
            prop_assert_eq!(got.depends_on_txid, group_txid);
            let txid = group_txid.unwrap();
            model.published.push((c.clone(), got.outcome.clone(), txid));
            model.by_id.insert(c.id.0, model.published.len() - 1);
            fresh_in_group.insert(c.id.0, model.published.len() - 1);
        }
    }
    Ok(())
}

/// Queries answer exactly `model` (the published state).
fn check_queries(h: &mut Harness, model: &Model) -> Result<(Value, Value), TestCaseError> {
    let items = h.cell().query("items", &json!({})).unwrap();
    let expected: Vec<Value> = model.items.iter().map(|(k, v)| json!([k, v])).collect();
    prop_assert_eq!(&items["rows"], &Value::Array(expected));
    let blobs = h.cell().query("blobs", &json!({})).unwrap();
    let expected: Vec<Value> = model.blobs.iter().map(|(k, n)| json!([k, n])).collect();
    prop_assert_eq!(&blobs["rows"], &Value::Array(expected));
    Ok((items, blobs))
}

fn check(h: &mut Harness, model: &Model, cfg: &CellConfig) -> Result<(), TestCaseError> {
    prop_assert!(h.cell().pending_txids().is_empty());
    let (items, blobs) = check_queries(h, model)?;
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
        checkpoint_wal_bytes: 128 * 1024,
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
                let published = h.position().txid;
                let (group, expected) = build(&mut model, &ops);
                let result = h.run(&group);
                expect(&mut model, &expected, &result, published)?;
            }
            Step::Pipelined {
                first,
                second,
                fate,
            } => pipelined(&mut h, &mut model, &first, &second, fate)?,
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

/// What a publication following `before` must name as its `pre`: a delta
/// chains on it, a snapshot (a large delta converted) applies to nothing.
fn chained_pre(p: &Publication, before: Position) -> Position {
    if p.is_snapshot() {
        Position::EMPTY
    } else {
        before
    }
}

fn pipelined(
    h: &mut Harness,
    model: &mut Model,
    first: &[Op],
    second: &[Op],
    fate: Fate,
) -> Result<(), TestCaseError> {
    let published = h.position();
    let now = h.now;
    let mut first_model = model.clone();
    let (group, expected) = build(&mut first_model, first);
    let r1 = h.cell().execute(&group, now).unwrap();
    expect(&mut first_model, &expected, &r1, published.txid)?;
    let p1: Option<Publication> = r1.publication;
    if let Some(p1) = &p1 {
        prop_assert_eq!(p1.pre, chained_pre(p1, published));
    }
    check_queries(h, model)?;

    let mut second_model = first_model.clone();
    let (group, expected) = build(&mut second_model, second);
    let p2 = match h.cell().execute(&group, now) {
        Ok(r2) => {
            expect(&mut second_model, &expected, &r2, published.txid)?;
            r2.publication
        }
        // The WAL outgrew the checkpoint bound while the first is
        // pending: the pipeline must drain first, and nothing ran.
        Err(Error::CheckpointDue { oldest, .. }) => {
            prop_assert_eq!(Some(oldest), p1.as_ref().map(|p| p.txid));
            second_model = first_model.clone();
            None
        }
        Err(e) => return Err(TestCaseError::fail(format!("second group: {e}"))),
    };
    if let Some(p2) = &p2 {
        let before = p1.as_ref().map_or(published, |p1| p1.post);
        prop_assert_eq!(p2.pre, chained_pre(p2, before));
    }
    let pending: Vec<Txid> = p1.iter().chain(&p2).map(|p| p.txid).collect();
    prop_assert_eq!(h.cell().pending_txids(), pending.clone());
    check_queries(h, model)?;
    prop_assert_eq!(h.position(), published);
    // A snapshot taken now describes the published state.
    if published.txid != Txid::ZERO {
        let snapshot = h.cell().snapshot(now).unwrap();
        prop_assert_eq!(snapshot.post, published);
        let target = h.dir.path().join(format!("snap-{}.db", published.txid.0));
        let at = cellfleet_cell::recover([snapshot.chain_file()], &target).unwrap();
        prop_assert_eq!(at, published);
        let (_, chain_bytes) = h.recover_bytes(&format!("chain-{}.db", published.txid.0));
        prop_assert_eq!(std::fs::read(&target).unwrap(), chain_bytes);
    }

    match fate {
        Fate::ConfirmBoth => {
            if let Some(p1) = p1 {
                h.publish(p1);
            }
            check_queries(h, &first_model)?;
            if let Some(p2) = p2 {
                h.publish(p2);
            }
            *model = second_model;
        }
        Fate::AbortBoth => {
            if !pending.is_empty() {
                prop_assert_eq!(h.cell().abort().unwrap(), pending);
            }
            prop_assert_eq!(h.position(), published);
            // The model is unchanged: the voided ids come back fresh.
        }
        Fate::ConfirmFirstAbortSecond => {
            if let Some(p1) = p1 {
                h.publish(p1);
            }
            if let Some(p2) = p2 {
                prop_assert_eq!(h.cell().abort().unwrap(), vec![p2.txid]);
            }
            *model = first_model;
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    fn recovery_matches_the_live_cell(
        steps in prop::collection::vec(step(), 1..12),
        checksums_in_file in any::<bool>(),
    ) {
        run_steps(steps, checksums_in_file)?;
    }
}
