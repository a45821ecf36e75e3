//! A new Cell's file, written from a copy of its kind's migrated database.
//!
//! A new Cell used to get its engine tables and its kind's migrations as
//! SQL inside its first group: SQLite parsing the DDL, building each table
//! and, after an `ALTER TABLE`, parsing the whole schema again. That was
//! about half of a stream creation's instructions (BENCHMARKS.md,
//! twenty-first measurement), and it gives every Cell of a kind the same
//! file. So the engine builds that file once per process, for each kind,
//! list of migrations, page size and `auto_vacuum`, and a new Cell's file
//! starts as its bytes (written into the file SQLite has just created,
//! before it reads anything: `connection::open_writer`). The Cell opens at
//! TXID 0 with its schema in place;
//! its first group finds nothing due and captures the whole file as the
//! snapshot of TXID 1, as before.
//!
//! Only migrations whose result cannot depend on the moment, the Cell or
//! the connection qualify. A migration that prepares an SQL function call
//! (`random()`, `datetime('now')`, or any other) or a pragma (which may set
//! state on the connection the Cell's own writer would keep) leaves its
//! kind without a template, and so does one that fails: such kinds run
//! their migrations in each Cell's first group, which also reports a
//! failing migration as it always did.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use crate::connection::{checkpoint, open_connection, sidecar, CellConfig};
use crate::guard::{Guard, Mode};
use crate::{ledger, Error, Result};
use rusqlite::Connection;

/// What a template's bytes depend on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    kind: String,
    migrations: Vec<String>,
    page_size: u32,
    auto_vacuum: bool,
}

/// Built templates; `None` for a kind whose migrations do not qualify.
type Templates = HashMap<Key, Option<Arc<[u8]>>>;

static TEMPLATES: LazyLock<Mutex<Templates>> = LazyLock::new(Mutex::default);

/// Names the files a template is built in, unique within the process.
static BUILDS: AtomicU64 = AtomicU64::new(0);

/// The bytes a new Cell of the kind `name` with `migrations` starts from,
/// building them first if this process has none yet; `None` when the
/// migrations do not qualify or the template could not be built (the Cell
/// is then made as before: an empty database whose first group runs the
/// migrations).
pub(crate) fn of(name: &str, migrations: &[String], config: &CellConfig) -> Option<Arc<[u8]>> {
    let key = Key {
        kind: name.to_owned(),
        migrations: migrations.to_vec(),
        page_size: config.page_size,
        auto_vacuum: config.auto_vacuum,
    };
    let mut templates = TEMPLATES.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(template) = templates.get(&key) {
        return template.clone();
    }
    // A build that failed is not remembered: the next new Cell tries again.
    let template = build(&key.migrations, config).ok()?;
    templates.insert(key, template.clone());
    template
}

/// Inside a write transaction: creates the engine's tables if they are
/// missing and runs the `migrations` not applied yet, each recorded in the
/// ledger. A template's build runs it on an empty database, a Cell's
/// first group (or one after a failed migration) on its own.
pub(crate) fn apply_schema(write: &Connection, guard: &Guard, migrations: &[String]) -> Result<()> {
    if !ledger::exists(write)? {
        ledger::create(write)?;
    }
    let applied = ledger::applied_migrations(write)?.len();
    for (index, sql) in migrations.iter().enumerate().skip(applied) {
        guard
            .run(Mode::Migration, || write.execute_batch(sql))
            .map_err(|e| Error::BadSql(format!("migration {index} fails: {e}")))?;
        ledger::record_migration(write, index, &ledger::migration_digest(sql))?;
    }
    Ok(())
}

/// Builds the template in scratch files in the system's temporary
/// directory (not among the Cells: a node's Cell directory should see no
/// file deleted, see `tests/files.rs`) and removes them again.
fn build(migrations: &[String], config: &CellConfig) -> Result<Option<Arc<[u8]>>> {
    let path = std::env::temp_dir().join(format!(
        "cellfleet-template-{}-{}.db",
        std::process::id(),
        BUILDS.fetch_add(1, Ordering::Relaxed)
    ));
    let remove = || {
        for file in [path.clone(), sidecar(&path, "-wal"), sidecar(&path, "-shm")] {
            let _ = std::fs::remove_file(file);
        }
    };
    remove();
    let built = build_at(&path, migrations, config);
    remove();
    built
}

fn build_at(path: &Path, migrations: &[String], config: &CellConfig) -> Result<Option<Arc<[u8]>>> {
    let (write, guard) = open_connection(path, false, config)?;
    write.execute_batch("BEGIN IMMEDIATE")?;
    match apply_schema(&write, &guard, migrations) {
        // A failing migration: each Cell's first group reports it.
        Err(Error::BadSql(_)) => return Ok(None),
        other => other?,
    }
    if guard.migration_impure() {
        return Ok(None);
    }
    write.execute_batch("COMMIT")?;
    checkpoint(&write, &sidecar(path, "-wal"))?;
    drop(write);
    Ok(Some(std::fs::read(path)?.into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kind::{Kind, KindError, Limits};
    use rusqlite::Connection;
    use serde_json::Value;

    #[derive(Debug)]
    struct Migrations(Vec<String>);

    impl Kind for Migrations {
        fn name(&self) -> &str {
            "migrations"
        }
        fn migrations(&self) -> Vec<String> {
            self.0.clone()
        }
        fn limits(&self) -> Limits {
            Limits::default()
        }
        fn execute(&self, _: &Connection, _: &str, _: &Value) -> Result<Value, KindError> {
            unreachable!("never run")
        }
        fn query(&self, _: &Connection, _: &str, _: &Value) -> Result<Value, KindError> {
            unreachable!("never run")
        }
    }

    #[test]
    fn which_kinds_get_a_template() {
        let cases = [
            // The stream kind's shape: a CHECK, then columns added.
            (
                r#"["CREATE TABLE meta (id INTEGER PRIMARY KEY CHECK (id = 1), tail INTEGER NOT NULL)",
                   "ALTER TABLE meta ADD COLUMN deleted INTEGER NOT NULL DEFAULT 0; CREATE TABLE forks (path TEXT PRIMARY KEY)"]"#,
                true,
            ),
            (
                r#"["CREATE TABLE t (a); INSERT INTO t VALUES (upper('x') || printf('%d', 7))"]"#,
                true,
            ),
            // SQLite checks a default's function when the table is made,
            // though it runs only when a row is inserted: no template
            // (the safe side).
            (
                r#"["CREATE TABLE t (a TEXT DEFAULT CURRENT_TIMESTAMP)"]"#,
                false,
            ),
            (
                r#"["CREATE TABLE t (a); INSERT INTO t VALUES (random())"]"#,
                false,
            ),
            (
                r#"["CREATE TABLE t (a); INSERT INTO t VALUES (datetime('now'))"]"#,
                false,
            ),
            (
                r#"["CREATE TABLE t (a); INSERT INTO t VALUES (CURRENT_TIMESTAMP)"]"#,
                false,
            ),
            (r#"["PRAGMA user_version = 3; CREATE TABLE t (a)"]"#, false),
            // Fails: the first group reports it, as for any Cell.
            (r#"["CREATE TABLE t (a", "CREATE TABLE u (b)"]"#, false),
        ];
        for (migrations, templated) in cases {
            let kind = Migrations(serde_json::from_str(migrations).unwrap());
            for round in 0..2 {
                let template = of(kind.name(), &kind.migrations(), &CellConfig::default());
                assert_eq!(
                    template.is_some(),
                    templated,
                    "{migrations} (round {round})"
                );
            }
        }
    }
}
