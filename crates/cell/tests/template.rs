//! New Cells written from their kind's template (`src/template.rs`): the
//! same pages as a Cell that runs its migrations in its first group (but
//! for the header's count of writes), and
//! kinds whose migrations could give each Cell something different keep
//! running them in each Cell.

mod common;

use std::sync::Arc;

use cellfleet_cell::{CellConfig, Command, Kind, Manifest};
use common::{id, kv, kv_put, Harness, NOW};
use serde_json::json;

const MANIFEST: &str = r#"
[kinds.pipe]
migrations = ["CREATE TABLE items (k INTEGER PRIMARY KEY, v TEXT NOT NULL)",
              "ALTER TABLE items ADD COLUMN n INTEGER NOT NULL DEFAULT 0; CREATE INDEX items_v ON items (v)"]
[kinds.pipe.commands.set]
sql = "INSERT OR REPLACE INTO items (k, v) VALUES (:k, :v)"
[kinds.pipe.queries.items]
sql = "SELECT k, v FROM items ORDER BY k"

[kinds.salted]
migrations = ["CREATE TABLE salt (v TEXT NOT NULL); INSERT INTO salt VALUES (hex(randomblob(16)))"]
[kinds.salted.queries.salt]
sql = "SELECT v FROM salt"
"#;

fn kind(name: &str) -> Arc<dyn Kind> {
    Manifest::parse(MANIFEST).unwrap().kind(name).unwrap()
}

/// A Cell whose file exists, empty, before its first open: the engine then
/// makes the database itself and runs the migrations in the first group,
/// as it did for every new Cell before templates.
fn without_template(kind: Arc<dyn Kind>, config: CellConfig) -> Harness {
    Harness::new_after(kind, config, |path| std::fs::write(path, b"").unwrap())
}

/// Checks that two database files are equal but for page 1's file change
/// counter (bytes 24..28) and its copy, the version-valid-for number
/// (92..96), and returns how many writes more `a` counts: the template's own
/// commit is one write a Cell that ran its migrations never made.
fn same_but_the_change_counter(mut a: Vec<u8>, mut b: Vec<u8>) -> u32 {
    let counter = |file: &[u8], at: usize| u32::from_be_bytes(file[at..at + 4].try_into().unwrap());
    let more = counter(&a, 24).wrapping_sub(counter(&b, 24));
    assert_eq!(counter(&a, 92).wrapping_sub(counter(&b, 92)), more);
    for file in [&mut a, &mut b] {
        file[24..28].fill(0);
        file[92..96].fill(0);
    }
    assert!(a == b, "the files differ beyond the change counter");
    more
}

#[test]
fn a_cell_from_the_template_has_the_pages_of_one_that_ran_its_migrations() {
    let set = |n: u64| {
        Command::new(
            id(n),
            "set",
            json!({"k": n, "v": format!("v{n}")}),
            NOW + 60_000,
        )
    };
    let cases: [(Arc<dyn Kind>, Vec<Command>); 2] = [
        (kv(), (1..=40).map(kv_put).collect()),
        (kind("pipe"), (1..=40).map(set).collect()),
    ];
    for (kind, commands) in cases {
        for page_size in [1024, 4096] {
            let config = CellConfig {
                page_size,
                ..CellConfig::default()
            };
            let mut from_template = Harness::new(kind.clone(), config.clone());
            let mut migrated = without_template(kind.clone(), config);
            for group in commands.chunks(7) {
                from_template.run(group);
                migrated.run(group);
            }
            let what = format!("kind {}, page size {page_size}", kind.name());
            assert_eq!(from_template.position().txid, migrated.position().txid);
            let (_, recovered) = from_template.recover_bytes("r.db");
            let live = from_template.live_bytes();
            assert_eq!(recovered, live, "{what}");
            assert_eq!(
                same_but_the_change_counter(recovered, migrated.recover_bytes("r.db").1),
                1,
                "{what}"
            );
            assert_eq!(
                same_but_the_change_counter(live, migrated.live_bytes()),
                1,
                "{what}"
            );
        }
    }
}

#[test]
fn migrations_that_call_functions_run_in_each_cell() {
    let salt = |h: &mut Harness| h.cell().query("salt", &json!({})).unwrap()["rows"].clone();
    let mut a = Harness::new(kind("salted"), CellConfig::default());
    let mut b = Harness::new(kind("salted"), CellConfig::default());
    let (a, b) = (salt(&mut a), salt(&mut b));
    assert_eq!(a.as_array().map(Vec::len), Some(1), "{a}");
    assert_ne!(a, b, "each Cell drew its own random salt");
}
