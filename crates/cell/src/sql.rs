//! Running parameterized SQL with JSON arguments under a kind's limits:
//! binding `:name` parameters, converting values both ways, and bounding
//! statements, rows and bytes.
//!
//! Values map as: JSON null/bool/number/string to NULL/INTEGER/INTEGER or
//! REAL/TEXT; `{"$blob": "<hex>"}` to a BLOB; any other array or object to
//! its JSON text (for SQLite's JSON functions). Results map back the same
//! way, BLOBs as `{"$blob": "<hex>"}`.

use std::collections::BTreeSet;

use rusqlite::fallible_iterator::FallibleIterator;
use rusqlite::types::{ToSqlOutput, Value as SqlValue, ValueRef};
use rusqlite::{Connection, Statement};
use serde_json::{Map, Value};

use crate::command::RejectCode;
use crate::kind::{KindError, Limits};

/// Whether the statements are for a command (may write) or a query (must
/// be read-only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Command,
    Query,
}

/// Output under construction, counting rows and bytes against the limits.
struct Output<'l> {
    limits: &'l Limits,
    rows_total: u64,
    bytes_total: u64,
    changes: u64,
    columns: Vec<String>,
    rows: Vec<Value>,
}

impl Output<'_> {
    fn push_row(&mut self, row: Vec<Value>) -> Result<(), KindError> {
        self.rows_total += 1;
        if self.rows_total > self.limits.rows_max {
            return Err(limit(
                "rows returned",
                self.rows_total,
                self.limits.rows_max,
            ));
        }
        self.bytes_total += row.iter().map(value_bytes).sum::<u64>() + 2;
        if self.bytes_total > self.limits.bytes_max {
            return Err(limit(
                "bytes returned",
                self.bytes_total,
                self.limits.bytes_max,
            ));
        }
        self.rows.push(Value::Array(row));
        Ok(())
    }

    fn finish(self, mode: Mode) -> Value {
        let mut out = Map::new();
        if mode == Mode::Command {
            out.insert("changes".into(), Value::from(self.changes));
        }
        if !self.columns.is_empty() {
            out.insert(
                "columns".into(),
                Value::Array(self.columns.into_iter().map(Value::String).collect()),
            );
            out.insert("rows".into(), Value::Array(self.rows));
        }
        Value::Object(out)
    }
}

fn limit(what: &str, actual: u64, limit: u64) -> KindError {
    KindError::reject(
        RejectCode::LimitExceeded,
        format!("{what} ({actual}) exceeds the limit of {limit}"),
    )
}

/// Approximate size of a command's or query's payload (its name and
/// arguments), as the engine counts it against `payload_bytes_max`.
pub fn payload_bytes(name: &str, args: &Value) -> u64 {
    name.len() as u64 + value_bytes(args)
}

/// Approximate encoded size of a JSON value, for the bytes limit.
pub(crate) fn value_bytes(v: &Value) -> u64 {
    match v {
        Value::Null | Value::Bool(_) => 5,
        Value::Number(_) => 20,
        Value::String(s) => s.len() as u64 + 2,
        Value::Array(a) => a.iter().map(value_bytes).sum::<u64>() + 2,
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| k.len() as u64 + 3 + value_bytes(v))
            .sum::<u64>()
            .saturating_add(2),
    }
}

/// The object of arguments, or a rejection.
pub(crate) fn args_object(args: &Value) -> Result<&Map<String, Value>, KindError> {
    match args {
        Value::Object(map) => Ok(map),
        Value::Null => {
            static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
            Ok(EMPTY.get_or_init(Map::new))
        }
        _ => Err(KindError::reject(
            RejectCode::BadParameters,
            "arguments must be a JSON object",
        )),
    }
}

/// Run `statements` (already split, each one statement) binding named
/// parameters from `args`; every key of `args` must be used by some
/// statement and every parameter must be given.
pub(crate) fn run_named(
    conn: &Connection,
    statements: &[String],
    args: &Value,
    limits: &Limits,
    mode: Mode,
) -> Result<Value, KindError> {
    let args = args_object(args)?;
    if statements.len() as u64 > limits.statements_max {
        return Err(limit(
            "statement count",
            statements.len() as u64,
            limits.statements_max,
        ));
    }
    let mut output = Output {
        limits,
        rows_total: 0,
        bytes_total: 0,
        changes: 0,
        columns: Vec::new(),
        rows: Vec::new(),
    };
    // Each statement is prepared once: its parameter names are checked
    // against the arguments before the first one runs.
    let mut prepared = Vec::with_capacity(statements.len());
    for sql in statements {
        prepared.push(conn.prepare_cached(sql)?);
    }
    check_parameters(&prepared, args)?;
    for stmt in &mut prepared {
        run_one(conn, stmt, args, &mut output, mode)?;
    }
    Ok(output.finish(mode))
}

/// Before anything runs: every parameter the statements name is given,
/// and every argument is a parameter; one rejection names all that is
/// wrong (a misspelt `byy` is unknown *and* `by` is missing).
fn check_parameters(
    statements: &[rusqlite::CachedStatement<'_>],
    args: &Map<String, Value>,
) -> Result<(), KindError> {
    // Borrowed names: a command checks its parameters without allocating.
    let mut wanted: BTreeSet<&str> = BTreeSet::new();
    for stmt in statements {
        for index in 1..=stmt.parameter_count() {
            if let Some(name) = stmt.parameter_name(index).and_then(|full| full.get(1..)) {
                wanted.insert(name);
            }
        }
    }
    let missing: Vec<&str> = wanted
        .iter()
        .copied()
        .filter(|name| !args.contains_key(*name))
        .collect();
    let unknown: Vec<&str> = args
        .keys()
        .map(String::as_str)
        .filter(|key| !wanted.contains(key))
        .collect();
    if missing.is_empty() && unknown.is_empty() {
        return Ok(());
    }
    let mut problems = Vec::new();
    if !missing.is_empty() {
        problems.push(format!("missing parameter {}", quoted(&missing)));
    }
    if !unknown.is_empty() {
        problems.push(format!("unknown parameter {}", quoted(&unknown)));
    }
    let takes = if wanted.is_empty() {
        "no parameters".to_owned()
    } else {
        quoted(&wanted.iter().copied().collect::<Vec<_>>())
    };
    Err(KindError::reject(
        RejectCode::BadParameters,
        format!("{} (it takes {takes})", problems.join("; ")),
    ))
}

fn quoted(names: &[&str]) -> String {
    names
        .iter()
        .map(|name| format!("{name:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Run a raw SQL batch (several statements separated by `;`), binding
/// named parameters from `params`.
pub(crate) fn run_batch(
    conn: &Connection,
    sql: &str,
    params: &Value,
    limits: &Limits,
    mode: Mode,
) -> Result<Value, KindError> {
    let args = args_object(params)?;
    let mut output = Output {
        limits,
        rows_total: 0,
        bytes_total: 0,
        changes: 0,
        columns: Vec::new(),
        rows: Vec::new(),
    };
    let mut batch = rusqlite::Batch::new(conn, sql);
    let mut count = 0u64;
    while let Some(mut stmt) = batch.next()? {
        count += 1;
        if count > limits.statements_max {
            return Err(limit("statement count", count, limits.statements_max));
        }
        run_one(conn, &mut stmt, args, &mut output, mode)?;
    }
    if count == 0 {
        return Err(KindError::reject(RejectCode::Sql, "empty sql batch"));
    }
    Ok(output.finish(mode))
}

fn run_one(
    conn: &Connection,
    stmt: &mut Statement<'_>,
    args: &Map<String, Value>,
    output: &mut Output<'_>,
    mode: Mode,
) -> Result<(), KindError> {
    if mode == Mode::Query && !stmt.readonly() {
        return Err(KindError::reject(
            RejectCode::Sql,
            "a query may only read: statement is not read-only",
        ));
    }
    bind(stmt, args)?;
    let columns = stmt.column_count();
    if columns == 0 {
        let changes = stmt.raw_execute()?;
        output.changes += changes as u64;
        return Ok(());
    }
    output.columns = stmt.column_names().map(str::to_string).collect();
    output.rows.clear();
    let before = conn.total_changes();
    let mut rows = stmt.raw_query();
    while let Some(row) = rows.next()? {
        let mut values = Vec::with_capacity(columns);
        for i in 0..columns {
            values.push(to_json(row.get_ref(i)?));
        }
        output.push_row(values)?;
    }
    // Writes with RETURNING count as changes too.
    output.changes += conn.total_changes().saturating_sub(before);
    Ok(())
}

fn bind(stmt: &mut Statement<'_>, args: &Map<String, Value>) -> Result<(), KindError> {
    for index in 1..=stmt.parameter_count() {
        // The argument's own key names it from here on, so the statement
        // is free to bind (no copy of the name).
        let (name, value) = match stmt.parameter_name(index) {
            None => {
                return Err(KindError::reject(
                    RejectCode::BadParameters,
                    "positional parameters (?) are not supported: use :name",
                ))
            }
            Some(full) => {
                let name = full.get(1..).unwrap_or_default();
                match args.get_key_value(name) {
                    Some((name, value)) => (name.as_str(), value),
                    None => {
                        return Err(KindError::reject(
                            RejectCode::BadParameters,
                            format!("missing parameter {name:?}"),
                        ))
                    }
                }
            }
        };
        stmt.raw_bind_parameter(index, to_sql(name, value)?)?;
    }
    Ok(())
}

/// A JSON argument as a SQL value (a string is bound from the argument
/// itself, with no copy of ours: SQLite takes its own).
pub(crate) fn to_sql<'a>(name: &str, value: &'a Value) -> Result<ToSqlOutput<'a>, KindError> {
    Ok(match value {
        Value::Null => ToSqlOutput::Owned(SqlValue::Null),
        Value::Bool(b) => ToSqlOutput::Owned(SqlValue::Integer(i64::from(*b))),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                ToSqlOutput::Owned(SqlValue::Integer(i))
            } else if n.is_u64() {
                return Err(KindError::reject(
                    RejectCode::BadParameters,
                    format!("parameter {name:?} is out of the 64-bit signed range"),
                ));
            } else {
                ToSqlOutput::Owned(SqlValue::Real(n.as_f64().unwrap_or(f64::NAN)))
            }
        }
        Value::String(s) => ToSqlOutput::Borrowed(ValueRef::Text(s.as_bytes())),
        Value::Object(map) if map.len() == 1 && map.contains_key("$blob") => {
            let hex = map["$blob"].as_str().unwrap_or("");
            let bytes = crate::hex::decode(hex).ok_or_else(|| {
                KindError::reject(
                    RejectCode::BadParameters,
                    format!("parameter {name:?}: $blob must be hex"),
                )
            })?;
            ToSqlOutput::Owned(SqlValue::Blob(bytes))
        }
        other => ToSqlOutput::Owned(SqlValue::Text(other.to_string())),
    })
}

/// A SQL value as JSON.
pub(crate) fn to_json(value: ValueRef<'_>) -> Value {
    match value {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::from(i),
        ValueRef::Real(f) => serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number),
        ValueRef::Text(t) => Value::String(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => serde_json::json!({"$blob": crate::hex::encode(b)}),
    }
}
