//! The kinds manifest: a TOML file declaring each kind's ordered
//! migrations, named commands, named queries and limits, validated on load
//! and named by a digest that every node of a cluster must agree on.
//!
//! ```toml
//! [kinds.account]
//! raw_sql = false
//! migrations = ["CREATE TABLE balance (id TEXT PRIMARY KEY, cents INTEGER NOT NULL)"]
//!
//! [kinds.account.commands.deposit]
//! sql = ["INSERT INTO balance VALUES (:id, 0) ON CONFLICT DO NOTHING",
//!        "UPDATE balance SET cents = cents + :cents WHERE id = :id"]
//!
//! [kinds.account.queries.balance]
//! sql = "SELECT cents FROM balance WHERE id = :id"
//!
//! [kinds.account.limits]
//! rows_max = 100
//! ```
//!
//! Validation runs every kind's migrations on a scratch in-memory database
//! and prepares every command and query statement against the result, so a
//! manifest with bad SQL is refused at load, not at the first command.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use rusqlite::Connection;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::command::{RejectCode, RAW_SQL};
use crate::kind::{Kind, KindError, Limits};
use crate::sql::{self, Mode};
use crate::{Error, Result};

/// Largest manifest accepted, in bytes.
pub const MANIFEST_BYTES_MAX: usize = 4 << 20;

/// A parsed, validated kinds manifest.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    #[serde(default)]
    pub kinds: BTreeMap<String, KindSpec>,
}

/// One kind declared in the manifest.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KindSpec {
    /// Allow `$sql` raw batches (commands and read-only queries).
    #[serde(default)]
    pub raw_sql: bool,
    /// Schema migrations, in order; append only.
    #[serde(default)]
    pub migrations: Vec<String>,
    #[serde(default)]
    pub commands: BTreeMap<String, CommandSpec>,
    #[serde(default)]
    pub queries: BTreeMap<String, QuerySpec>,
    #[serde(default)]
    pub limits: Limits,
}

/// A named command: one or several statements run as one unit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandSpec {
    pub sql: Statements,
    /// Optional parameter types, checked before anything runs (SQLite
    /// would store `"abc"` or `1.5` in an INTEGER column): `integer`,
    /// `real`, `text`, `boolean` or `any`. Undeclared parameters take any
    /// JSON value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub params: BTreeMap<String, ParamType>,
}

/// The type a declared parameter must have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ParamType {
    /// A JSON integer (no fraction) that fits in 64 bits.
    Integer,
    /// Any JSON number.
    Real,
    /// A JSON string.
    Text,
    /// `true` or `false`.
    Boolean,
    /// Any JSON value.
    Any,
}

impl ParamType {
    fn admits(self, value: &Value) -> bool {
        match self {
            ParamType::Integer => value.is_i64(),
            ParamType::Real => value.is_number(),
            ParamType::Text => value.is_string(),
            ParamType::Boolean => value.is_boolean(),
            ParamType::Any => true,
        }
    }

    fn name(self) -> &'static str {
        match self {
            ParamType::Integer => "an integer",
            ParamType::Real => "a number",
            ParamType::Text => "a string",
            ParamType::Boolean => "true or false",
            ParamType::Any => "any value",
        }
    }
}

/// Checks `args` against the declared `params` (pure).
fn check_types(params: &BTreeMap<String, ParamType>, args: &Value) -> Result<(), KindError> {
    let Value::Object(args) = args else {
        return Ok(());
    };
    for (name, kind) in params {
        if let Some(value) = args.get(name) {
            if !kind.admits(value) {
                return Err(KindError::reject(
                    RejectCode::BadParameters,
                    format!("parameter {name:?} must be {}, got {value}", kind.name()),
                ));
            }
        }
    }
    Ok(())
}

/// A named read-only query: one statement.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuerySpec {
    pub sql: String,
    /// Optional parameter types, as for commands.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub params: BTreeMap<String, ParamType>,
}

/// One statement or a list of them (`sql = "..."` or `sql = ["...", "..."]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(from = "OneOrMany")]
pub struct Statements(pub Vec<String>);

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl From<OneOrMany> for Statements {
    fn from(v: OneOrMany) -> Self {
        match v {
            OneOrMany::One(s) => Statements(vec![s]),
            OneOrMany::Many(v) => Statements(v),
        }
    }
}

impl Manifest {
    /// Parse and validate a TOML manifest.
    pub fn parse(text: &str) -> Result<Manifest> {
        if text.len() > MANIFEST_BYTES_MAX {
            return Err(Error::Manifest(format!(
                "{} bytes exceeds the limit of {MANIFEST_BYTES_MAX}",
                text.len()
            )));
        }
        let manifest: Manifest =
            toml::from_str(text).map_err(|e| Error::Manifest(e.to_string()))?;
        manifest.validate()?;
        Ok(manifest)
    }

    /// Check names, limits and every SQL statement.
    pub fn validate(&self) -> Result<()> {
        for (name, spec) in &self.kinds {
            spec.validate(name)
                .map_err(|e| Error::Manifest(format!("kind {name:?}: {e}")))?;
        }
        Ok(())
    }

    /// SHA-256 of the canonical JSON of the parsed manifest (comments and
    /// formatting do not change it), as 64 hex digits.
    pub fn digest(&self) -> String {
        let value = serde_json::to_value(self).expect("a manifest always encodes as json");
        let mut canonical = String::new();
        crate::command::canonical_json(&value, &mut canonical);
        let mut hasher = Sha256::new();
        hasher.update(b"cellfleet.kinds-manifest.v1\0");
        hasher.update(canonical.as_bytes());
        crate::hex::encode(&hasher.finalize())
    }

    /// The kind `name` as an engine [`Kind`].
    pub fn kind(&self, name: &str) -> Result<Arc<dyn Kind>> {
        let spec = self
            .kinds
            .get(name)
            .ok_or_else(|| Error::UnknownKind(name.to_string()))?;
        Ok(Arc::new(SqlKind {
            name: name.to_string(),
            spec: spec.clone(),
        }))
    }
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some('a'..='z'))
        && name.len() <= 64
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_' | '-'))
}

impl KindSpec {
    fn validate(&self, name: &str) -> std::result::Result<(), String> {
        if !valid_name(name) {
            return Err("a kind name is 1..=64 of [a-z0-9_-], starting with a letter".into());
        }
        self.limits.check_within_ceiling()?;
        let scratch = Connection::open_in_memory().map_err(|e| e.to_string())?;
        for (i, migration) in self.migrations.iter().enumerate() {
            if migration.trim().is_empty() {
                return Err(format!("migration {i} is empty"));
            }
            scratch
                .execute_batch(migration)
                .map_err(|e| format!("migration {i} fails: {e}"))?;
        }
        for (command, spec) in &self.commands {
            if !valid_name(command) {
                return Err(format!("bad command name {command:?}"));
            }
            let statements = &spec.sql.0;
            if statements.is_empty() {
                return Err(format!("command {command:?} has no statements"));
            }
            if statements.len() as u64 > self.limits.statements_max {
                return Err(format!(
                    "command {command:?} has {} statements, over statements_max",
                    statements.len()
                ));
            }
            let mut named = BTreeSet::new();
            for sql in statements {
                check_statement(&scratch, sql, false, &mut named)
                    .map_err(|e| format!("command {command:?}: {e}"))?;
            }
            check_declared(&spec.params, &named)
                .map_err(|e| format!("command {command:?}: {e}"))?;
        }
        for (query, spec) in &self.queries {
            if !valid_name(query) {
                return Err(format!("bad query name {query:?}"));
            }
            let mut named = BTreeSet::new();
            check_statement(&scratch, &spec.sql, true, &mut named)
                .map_err(|e| format!("query {query:?}: {e}"))?;
            check_declared(&spec.params, &named).map_err(|e| format!("query {query:?}: {e}"))?;
        }
        Ok(())
    }
}

/// A declared parameter must be one the statements use.
fn check_declared(
    params: &BTreeMap<String, ParamType>,
    named: &BTreeSet<String>,
) -> std::result::Result<(), String> {
    match params.keys().find(|name| !named.contains(*name)) {
        Some(name) => Err(format!(
            "params declares {name:?}, which no statement uses (they use {named:?})"
        )),
        None => Ok(()),
    }
}

fn check_statement(
    conn: &Connection,
    sql: &str,
    read_only: bool,
    named: &mut BTreeSet<String>,
) -> std::result::Result<(), String> {
    let stmt = conn.prepare(sql).map_err(|e| format!("{e} in {sql:?}"))?;
    for index in 1..=stmt.parameter_count() {
        match stmt.parameter_name(index) {
            Some(p) if p.starts_with(':') || p.starts_with('@') || p.starts_with('$') => {
                named.insert(p[1..].to_owned());
            }
            _ => {
                return Err(format!(
                    "use :name parameters, not positional ones, in {sql:?}"
                ))
            }
        }
    }
    if read_only && !stmt.readonly() {
        return Err(format!("a query must be read-only: {sql:?}"));
    }
    Ok(())
}

/// A manifest kind, executed by binding JSON arguments to its statements.
#[derive(Debug)]
pub struct SqlKind {
    name: String,
    spec: KindSpec,
}

impl SqlKind {
    fn raw(&self, args: &Value, mode: Mode, conn: &Connection) -> Result<Value, KindError> {
        if !self.spec.raw_sql {
            return Err(KindError::reject(
                RejectCode::RawSqlDisabled,
                format!("raw sql is not enabled for kind {:?}", self.name),
            ));
        }
        let args = sql::args_object(args)?;
        let Some(Value::String(text)) = args.get("sql") else {
            return Err(KindError::reject(
                RejectCode::BadParameters,
                "raw sql takes {\"sql\": \"...\", \"params\": {...}}",
            ));
        };
        if let Some(extra) = args.keys().find(|k| *k != "sql" && *k != "params") {
            return Err(KindError::reject(
                RejectCode::BadParameters,
                format!("unknown raw sql argument {extra:?}"),
            ));
        }
        let params = args.get("params").cloned().unwrap_or(Value::Null);
        sql::run_batch(conn, text, &params, &self.spec.limits, mode)
    }
}

impl Kind for SqlKind {
    fn name(&self) -> &str {
        &self.name
    }
    fn migrations(&self) -> Vec<String> {
        self.spec.migrations.clone()
    }
    fn limits(&self) -> Limits {
        self.spec.limits.clone()
    }
    fn raw_sql(&self) -> bool {
        self.spec.raw_sql
    }
    fn execute(&self, conn: &Connection, name: &str, args: &Value) -> Result<Value, KindError> {
        if name == RAW_SQL {
            return self.raw(args, Mode::Command, conn);
        }
        let Some(spec) = self.spec.commands.get(name) else {
            return Err(KindError::reject(
                RejectCode::UnknownCommand,
                format!("kind {:?} has no command {name:?}", self.name),
            ));
        };
        check_types(&spec.params, args)?;
        sql::run_named(conn, &spec.sql.0, args, &self.spec.limits, Mode::Command)
    }
    fn query(&self, conn: &Connection, name: &str, args: &Value) -> Result<Value, KindError> {
        if name == RAW_SQL {
            return self.raw(args, Mode::Query, conn);
        }
        let Some(spec) = self.spec.queries.get(name) else {
            return Err(KindError::reject(
                RejectCode::UnknownCommand,
                format!("kind {:?} has no query {name:?}", self.name),
            ));
        };
        check_types(&spec.params, args)?;
        sql::run_named(
            conn,
            std::slice::from_ref(&spec.sql),
            args,
            &self.spec.limits,
            Mode::Query,
        )
    }
}

#[cfg(test)]
mod typed_tests {
    use super::*;
    use serde_json::json;

    const TYPED: &str = r#"
[kinds.counter]
migrations = ["CREATE TABLE c (n INTEGER NOT NULL)", "INSERT INTO c VALUES (0)"]

[kinds.counter.commands.add]
sql = ["UPDATE c SET n = n + :by"]
params = { by = "integer" }

[kinds.counter.queries.above]
sql = "SELECT n > :floor FROM c"
params = { floor = "real" }
"#;

    #[test]
    fn declared_parameter_types_are_checked_before_anything_runs() {
        let manifest = Manifest::parse(TYPED).unwrap();
        let spec = &manifest.kinds["counter"];
        let add = &spec.commands["add"].params;
        assert!(check_types(add, &json!({"by": 5})).is_ok());
        for bad in [json!("abc"), json!(1.5), json!(true), json!(null)] {
            let error = check_types(add, &json!({ "by": bad })).unwrap_err();
            assert!(
                format!("{error:?}").contains(r#"parameter \"by\" must be an integer"#),
                "{error:?}"
            );
        }
        let above = &spec.queries["above"].params;
        assert!(check_types(above, &json!({"floor": 1.5})).is_ok());
        assert!(check_types(above, &json!({"floor": "x"})).is_err());
        // A declared parameter no statement uses is a manifest error.
        let unused = TYPED.replace("by = \"integer\"", "bye = \"integer\"");
        let error = Manifest::parse(&unused).unwrap_err().to_string();
        assert!(error.contains("params declares \"bye\""), "{error}");
        // Declaring no types leaves the digest as it was.
        let untyped = TYPED
            .replace("params = { by = \"integer\" }\n", "")
            .replace("params = { floor = \"real\" }\n", "");
        let plain = Manifest::parse(&untyped).unwrap();
        assert!(!serde_json::to_string(&plain).unwrap().contains("params"));
        assert_ne!(plain.digest(), manifest.digest());
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    fn sql_fragment() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("CREATE TABLE t (x)".to_string()),
            Just("SELECT :a".to_string()),
            Just("INSERT INTO t VALUES (:x)".to_string()),
            Just("DROP TABLE t".to_string()),
            Just("PRAGMA user_version = 1".to_string()),
            Just("ATTACH 'x' AS y".to_string()),
            "[ -~]{0,40}",
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
        /// Arbitrary text is refused with a typed error, never a panic.
        #[test]
        fn arbitrary_text_never_panics(text in "\\PC{0,400}") {
            if let Err(e) = Manifest::parse(&text) {
                prop_assert!(matches!(e, Error::Manifest(_)), "{e}");
            }
        }

        /// Manifests of the right shape with arbitrary SQL, names and
        /// limits: accepted only when every statement prepares, refused
        /// with a typed error otherwise.
        #[test]
        fn arbitrary_kinds_never_panic(
            name in "[a-z_$]{0,8}",
            migrations in prop::collection::vec(sql_fragment(), 0..3),
            command in sql_fragment(),
            query in sql_fragment(),
            rows_max in any::<i64>(),
            raw_sql in any::<bool>(),
        ) {
            let quote = |s: &str| toml::Value::String(s.to_string()).to_string();
            let text = format!(
                "[kinds.{k}]\nraw_sql = {raw_sql}\nmigrations = [{m}]\n\
                 [kinds.{k}.commands.c]\nsql = {c}\n[kinds.{k}.queries.q]\nsql = {q}\n\
                 [kinds.{k}.limits]\nrows_max = {rows_max}\n",
                k = quote(&name),
                m = migrations.iter().map(|s| quote(s)).collect::<Vec<_>>().join(", "),
                c = quote(&command),
                q = quote(&query),
            );
            match Manifest::parse(&text) {
                Ok(manifest) => {
                    let kind = manifest.kind(&name);
                    prop_assert!(kind.is_ok());
                    prop_assert!(rows_max >= 0);
                }
                Err(e) => prop_assert!(
                    matches!(e, Error::Manifest(_) | Error::BadSql(_)),
                    "{e}"
                ),
            }
        }
    }

    use super::*;

    const GOOD: &str = r#"
        # a comment
        [kinds.account]
        migrations = ["CREATE TABLE balance (id TEXT PRIMARY KEY, cents INTEGER NOT NULL)"]
        [kinds.account.commands.deposit]
        sql = ["INSERT INTO balance VALUES (:id, 0) ON CONFLICT DO NOTHING",
               "UPDATE balance SET cents = cents + :cents WHERE id = :id"]
        [kinds.account.queries.balance]
        sql = "SELECT cents FROM balance WHERE id = :id"
        [kinds.account.limits]
        rows_max = 10
    "#;

    #[test]
    fn parses_validates_and_digests() {
        let m = Manifest::parse(GOOD).unwrap();
        let spec = &m.kinds["account"];
        assert_eq!(spec.commands["deposit"].sql.0.len(), 2);
        assert_eq!(spec.limits.rows_max, 10);
        assert_eq!(spec.limits.bytes_max, Limits::default().bytes_max);
        let reformatted = GOOD
            .replace("# a comment", "")
            .replace("rows_max = 10", "rows_max=10");
        assert_eq!(Manifest::parse(&reformatted).unwrap().digest(), m.digest());
        let changed = GOOD.replace("rows_max = 10", "rows_max = 11");
        assert_ne!(Manifest::parse(&changed).unwrap().digest(), m.digest());
        assert_eq!(m.digest().len(), 64);
    }

    #[test]
    fn refuses_bad_manifests() {
        let cases = [
            (
                GOOD.replace("SELECT cents", "SELEKT cents"),
                "query \"balance\"",
            ),
            (
                GOOD.replace(
                    "SELECT cents FROM balance WHERE id = :id",
                    "DELETE FROM balance",
                ),
                "read-only",
            ),
            (GOOD.replace("= :id\"", "= ?\""), "positional"),
            (GOOD.replace("rows_max = 10", "rows_max = 0"), "rows_max"),
            (
                GOOD.replace("rows_max = 10", "rowz_max = 10"),
                "unknown field",
            ),
            (
                GOOD.replace(
                    "CREATE TABLE balance",
                    "CREATE TABLE balance (x); CREATE TABLE balance",
                ),
                "migration 0",
            ),
            (
                GOOD.replace("balance VALUES", "nope VALUES"),
                "command \"deposit\"",
            ),
        ];
        for (text, needle) in cases {
            let err = Manifest::parse(&text).unwrap_err().to_string();
            assert!(err.contains(needle), "{err:?} should mention {needle:?}");
        }
    }
}
