//! Fences around kind code on a connection: an authorizer that keeps kind
//! SQL away from the engine's own tables and from transaction control, and
//! a VM-step budget that interrupts runaway statements.
//!
//! The authorizer runs when a statement is prepared; the engine switches it
//! to [`Mode::Kind`] only while kind code (commands, queries, raw SQL) or
//! migrations run, and prepares its own statements in [`Mode::Engine`].

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use rusqlite::hooks::{AuthAction, AuthContext, Authorization};
use rusqlite::Connection;

/// Prefix of every table the engine owns.
pub(crate) const ENGINE_TABLE_PREFIX: &str = "_cellfleet_";

/// Who is preparing statements on the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Mode {
    Engine = 0,
    Kind = 1,
    Migration = 2,
}

/// Shared switches of one connection's guard.
#[derive(Debug, Clone)]
pub(crate) struct Guard {
    mode: Arc<AtomicU8>,
    steps: Arc<AtomicU64>,
    steps_max: u64,
    /// The current run's budget, in progress callbacks.
    budget: Arc<AtomicU64>,
    /// The progress handler interrupted the current run.
    interrupted: Arc<AtomicBool>,
    /// A migration prepared a call of a function outside [`PURE_FUNCTIONS`]
    /// or a pragma: its outcome may depend on the moment, the Cell or the
    /// connection, so its database is not one every Cell of the kind may
    /// copy ([`crate::template`]).
    migration_impure: Arc<AtomicBool>,
}

/// VM instructions between two progress callbacks.
const STEPS_PER_CALLBACK: u64 = 1_000;

/// Progress callbacks a budget of `steps` VM instructions allows.
fn callbacks(steps: u64) -> u64 {
    steps / STEPS_PER_CALLBACK + 1
}

impl Guard {
    /// Install the authorizer and step budget on `conn`.
    pub(crate) fn install(conn: &mut Connection, steps_max: u64) -> rusqlite::Result<Guard> {
        let guard = Guard {
            mode: Arc::new(AtomicU8::new(Mode::Engine as u8)),
            steps: Arc::new(AtomicU64::new(0)),
            steps_max,
            budget: Arc::new(AtomicU64::new(callbacks(steps_max))),
            interrupted: Arc::new(AtomicBool::new(false)),
            migration_impure: Arc::new(AtomicBool::new(false)),
        };
        let mode = guard.mode.clone();
        let impure = guard.migration_impure.clone();
        conn.authorizer(Some(move |ctx: AuthContext<'_>| {
            let mode = mode.load(Ordering::Relaxed);
            if mode == Mode::Migration as u8 && !pure(&ctx.action) {
                impure.store(true, Ordering::Relaxed);
            }
            authorize(mode, &ctx)
        }))?;
        let steps = guard.steps.clone();
        let mode = guard.mode.clone();
        let budget = guard.budget.clone();
        let interrupted = guard.interrupted.clone();
        // Only kind code and migrations spend the budget: the engine's own
        // statements (ledger lookups, pins of read snapshots) run between
        // budgets and must never be interrupted, however many run in a row.
        conn.progress_handler(
            STEPS_PER_CALLBACK as i32,
            Some(move || {
                let stop = mode.load(Ordering::Relaxed) != Mode::Engine as u8
                    && steps.fetch_add(1, Ordering::Relaxed) >= budget.load(Ordering::Relaxed);
                if stop {
                    interrupted.store(true, Ordering::Relaxed);
                }
                stop
            }),
        )?;
        Ok(guard)
    }

    /// Run `f` with kind code fenced and a fresh step budget.
    pub(crate) fn run<T>(&self, mode: Mode, f: impl FnOnce() -> T) -> T {
        self.run_within(mode, self.steps_max, f).0
    }

    /// [`Guard::run`] with a budget of `steps` (at most the guard's own);
    /// also says whether the budget interrupted a statement of `f`.
    pub(crate) fn run_within<T>(&self, mode: Mode, steps: u64, f: impl FnOnce() -> T) -> (T, bool) {
        self.steps.store(0, Ordering::Relaxed);
        self.interrupted.store(false, Ordering::Relaxed);
        self.budget
            .store(callbacks(steps.min(self.steps_max)), Ordering::Relaxed);
        self.mode.store(mode as u8, Ordering::Relaxed);
        let out = f();
        self.mode.store(Mode::Engine as u8, Ordering::Relaxed);
        // The budget stays as this run left it: it counts only while kind
        // code runs, and every run sets its own first.
        (out, self.interrupted.load(Ordering::Relaxed))
    }

    /// Whether a migration run on this connection prepared a call of a
    /// function outside [`PURE_FUNCTIONS`] or a pragma.
    pub(crate) fn migration_impure(&self) -> bool {
        self.migration_impure.load(Ordering::Relaxed)
    }

    /// The VM-step budget of one command or query.
    pub(crate) fn steps_max(&self) -> u64 {
        self.steps_max
    }
}

/// SQLite's built-in functions whose result depends on their arguments
/// alone, so a migration may call them and still give every Cell of its
/// kind the same database. `ALTER TABLE ... ADD COLUMN` itself calls
/// `printf`, `substr` and `length` (SQLite rewrites the table's SQL with
/// them), and the `sqlite_` ones are what other `ALTER TABLE` forms call.
/// Anything else (`random()`, `datetime('now')`, `changes()`, functions
/// a program registered) counts as impure: this is the safe direction.
const PURE_FUNCTIONS: &[&str] = &[
    "abs",
    "avg",
    "char",
    "coalesce",
    "concat",
    "concat_ws",
    "count",
    "format",
    "glob",
    "group_concat",
    "hex",
    "ifnull",
    "iif",
    "instr",
    "length",
    "like",
    "lower",
    "ltrim",
    "max",
    "min",
    "nullif",
    "octet_length",
    "printf",
    "quote",
    "replace",
    "round",
    "rtrim",
    "sign",
    "sqlite_drop_column",
    "sqlite_rename_column",
    "sqlite_rename_quotefix",
    "sqlite_rename_table",
    "sqlite_rename_test",
    "string_agg",
    "substr",
    "substring",
    "sum",
    "total",
    "trim",
    "typeof",
    "unhex",
    "unicode",
    "upper",
    "zeroblob",
];

/// Whether `action`, prepared by a migration, leaves the migration's
/// result the same for every Cell.
fn pure(action: &AuthAction<'_>) -> bool {
    match action {
        AuthAction::Function { function_name } => PURE_FUNCTIONS
            .iter()
            .any(|pure| pure.eq_ignore_ascii_case(function_name)),
        AuthAction::Pragma { .. } => false,
        _ => true,
    }
}

fn engine_table(name: &str) -> bool {
    name.len() >= ENGINE_TABLE_PREFIX.len()
        && name[..ENGINE_TABLE_PREFIX.len()].eq_ignore_ascii_case(ENGINE_TABLE_PREFIX)
}

fn authorize(mode: u8, ctx: &AuthContext<'_>) -> Authorization {
    if mode == Mode::Engine as u8 {
        return Authorization::Allow;
    }
    let denied = match &ctx.action {
        AuthAction::Transaction { .. } | AuthAction::Savepoint { .. } => true,
        AuthAction::Attach { .. } | AuthAction::Detach { .. } => true,
        AuthAction::Pragma { .. } => mode != Mode::Migration as u8,
        AuthAction::CreateTable { table_name }
        | AuthAction::DropTable { table_name }
        | AuthAction::Insert { table_name }
        | AuthAction::Delete { table_name }
        | AuthAction::Read { table_name, .. }
        | AuthAction::Update { table_name, .. }
        | AuthAction::AlterTable { table_name, .. }
        | AuthAction::CreateIndex { table_name, .. }
        | AuthAction::DropIndex { table_name, .. }
        | AuthAction::CreateTrigger { table_name, .. }
        | AuthAction::DropTrigger { table_name, .. } => engine_table(table_name),
        _ => false,
    };
    if denied {
        Authorization::Deny
    } else {
        Authorization::Allow
    }
}
