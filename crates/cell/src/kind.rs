//! The kind interface: what a Cell's schema, commands, queries and limits
//! are, whether declared in the TOML manifest or written in Rust.
//!
//! [`Kind`] is the object-safe form the engine calls with JSON arguments;
//! [`RustKind`] is the typed form for Rust embedders, adapted by [`Typed`].

use std::fmt;

use rusqlite::Connection;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::command::{RejectCode, Rejection};

/// Bounds on what one command or query of a kind may take and return.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Rows one command or query may return.
    pub rows_max: u64,
    /// Bytes (of JSON result) one command or query may return.
    pub bytes_max: u64,
    /// SQL statements in one command or raw batch.
    pub statements_max: u64,
    /// Bytes of one command's or query's encoded arguments.
    pub payload_bytes_max: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            rows_max: 1_000,
            bytes_max: 1 << 20,
            statements_max: 64,
            payload_bytes_max: 64 << 10,
        }
    }
}

impl Limits {
    /// Hard ceilings no manifest may exceed.
    pub const CEILING: Limits = Limits {
        rows_max: 1_000_000,
        bytes_max: 64 << 20,
        statements_max: 4_096,
        payload_bytes_max: 16 << 20,
    };

    pub(crate) fn check_within_ceiling(&self) -> Result<(), String> {
        let pairs = [
            ("rows_max", self.rows_max, Self::CEILING.rows_max),
            ("bytes_max", self.bytes_max, Self::CEILING.bytes_max),
            (
                "statements_max",
                self.statements_max,
                Self::CEILING.statements_max,
            ),
            (
                "payload_bytes_max",
                self.payload_bytes_max,
                Self::CEILING.payload_bytes_max,
            ),
        ];
        for (name, value, ceiling) in pairs {
            if value == 0 || value > ceiling {
                return Err(format!("limit {name} = {value} must be in 1..={ceiling}"));
            }
        }
        Ok(())
    }
}

/// A kind's failure to run a command or query.
#[derive(Debug)]
pub enum KindError {
    /// The command's own fault: recorded as its outcome.
    Rejected(Rejection),
    /// A SQLite error; the engine decides whether it is the command's fault
    /// (constraint, bad SQL: a rejection) or the environment's (I/O, full,
    /// corrupt: the whole group fails).
    Sqlite(rusqlite::Error),
}

impl KindError {
    /// A rejection with `code` and `message`.
    pub fn reject(code: RejectCode, message: impl Into<String>) -> Self {
        KindError::Rejected(Rejection::new(code, message))
    }
}

impl From<rusqlite::Error> for KindError {
    fn from(e: rusqlite::Error) -> Self {
        KindError::Sqlite(e)
    }
}

impl From<Rejection> for KindError {
    fn from(r: Rejection) -> Self {
        KindError::Rejected(r)
    }
}

impl fmt::Display for KindError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KindError::Rejected(r) => write!(f, "{:?}: {}", r.code, r.message),
            KindError::Sqlite(e) => write!(f, "sqlite: {e}"),
        }
    }
}

/// A Cell kind as the engine sees it: JSON in, JSON out.
pub trait Kind: Send + Sync + fmt::Debug {
    /// The kind's name (part of every command digest).
    fn name(&self) -> &str;
    /// Schema migrations, in order; only ever appended to.
    fn migrations(&self) -> Vec<String>;
    /// Bounds on commands and queries.
    fn limits(&self) -> Limits;
    /// Whether [`crate::RAW_SQL`] commands and queries are allowed.
    fn raw_sql(&self) -> bool {
        false
    }
    /// The SQLite page size of this kind's new Cells, or `None` for the
    /// node's ([`crate::CellConfig::page_size`]). A Cell keeps the page
    /// size it was created with (its root records it). Small pages suit
    /// small rows written one at a time: every write copies, checksums
    /// and compresses each page it dirties.
    fn page_size(&self) -> Option<u32> {
        None
    }
    /// Run command `name` inside the engine's savepoint.
    fn execute(&self, conn: &Connection, name: &str, args: &Value) -> Result<Value, KindError>;
    /// Run query `name` on a read-only connection.
    fn query(&self, conn: &Connection, name: &str, args: &Value) -> Result<Value, KindError>;
}

/// A kind written in Rust with typed commands, queries and outputs.
///
/// `Command` and `Query` are adjacently tagged enums,
/// `#[serde(tag = "name", content = "args")]`, so that a command's `name`
/// and `args` on the wire map to a variant and its fields.
pub trait RustKind: Send + Sync + 'static {
    type Command: Serialize + DeserializeOwned;
    type Query: Serialize + DeserializeOwned;
    type Output: Serialize + DeserializeOwned;

    /// The kind's name.
    fn name(&self) -> &str;
    /// Schema migrations, in order.
    fn migrations(&self) -> Vec<String>;
    /// Bounds on commands and queries.
    fn limits(&self) -> Limits {
        Limits::default()
    }
    /// The SQLite page size of new Cells ([`Kind::page_size`]).
    fn page_size(&self) -> Option<u32> {
        None
    }
    /// Run one command inside the engine's savepoint.
    fn execute(&self, conn: &Connection, command: Self::Command)
        -> Result<Self::Output, KindError>;
    /// Run one query on a read-only connection.
    fn query(&self, conn: &Connection, query: Self::Query) -> Result<Self::Output, KindError>;
}

/// Adapts a [`RustKind`] to [`Kind`].
pub struct Typed<K>(pub K);

impl<K: RustKind> fmt::Debug for Typed<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Typed({})", self.0.name())
    }
}

/// Split a typed command or query into the wire `(name, args)`.
pub fn to_wire<T: Serialize>(value: &T) -> Result<(String, Value), serde_json::Error> {
    use serde::ser::Error;
    let Value::Object(mut map) = serde_json::to_value(value)? else {
        return Err(serde_json::Error::custom(
            "expected an adjacently tagged enum",
        ));
    };
    let Some(Value::String(name)) = map.remove("name") else {
        return Err(serde_json::Error::custom("expected a \"name\" tag"));
    };
    let args = map
        .remove("args")
        .unwrap_or(Value::Object(Default::default()));
    Ok((name, args))
}

fn from_wire<T: DeserializeOwned>(name: &str, args: &Value) -> Result<T, KindError> {
    // The tagged form `{"name": .., "args": ..}` read from where the
    // arguments lie: no copy of them, and the tag comes first, so serde
    // need not buffer the arguments until it knows the variant.
    let name_value = Value::String(name.to_owned());
    let tagged = serde::de::value::MapDeserializer::<_, serde_json::Error>::new(
        [("name", &name_value), ("args", args)].into_iter(),
    );
    T::deserialize(tagged).map_err(|e| {
        let code = if names_a_variant::<T>(name) {
            RejectCode::BadParameters
        } else {
            RejectCode::UnknownCommand
        };
        KindError::reject(code, e.to_string())
    })
}

/// The error of [`names_a_variant`]'s probe: whether serde reported an
/// unknown variant (a typed answer, where serde_json's error has only text).
#[derive(Debug)]
struct VariantProbe {
    unknown_variant: bool,
}

impl fmt::Display for VariantProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.unknown_variant {
            "unknown variant"
        } else {
            "another error"
        })
    }
}

impl std::error::Error for VariantProbe {}

impl serde::de::Error for VariantProbe {
    fn custom<M: fmt::Display>(_: M) -> Self {
        VariantProbe {
            unknown_variant: false,
        }
    }

    fn unknown_variant(_: &str, _: &'static [&'static str]) -> Self {
        VariantProbe {
            unknown_variant: true,
        }
    }
}

/// Whether `name` is one of the adjacently tagged enum `T`'s variants:
/// deserializes `{"name": name, "args": ""}` with an error type that
/// records serde's own "unknown variant" call (the args are never valid,
/// so a known name fails later, on them).
fn names_a_variant<T: DeserializeOwned>(name: &str) -> bool {
    use serde::de::value::MapDeserializer;
    let probe: MapDeserializer<'_, _, VariantProbe> =
        MapDeserializer::new([("name", name), ("args", "")].into_iter());
    match T::deserialize(probe) {
        Ok(_) => true,
        Err(error) => !error.unknown_variant,
    }
}

fn output_json<T: Serialize>(output: T) -> Result<Value, KindError> {
    serde_json::to_value(output)
        .map_err(|e| KindError::reject(RejectCode::Kind, format!("output does not encode: {e}")))
}

impl<K: RustKind> Kind for Typed<K> {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn migrations(&self) -> Vec<String> {
        self.0.migrations()
    }
    fn limits(&self) -> Limits {
        self.0.limits()
    }
    fn page_size(&self) -> Option<u32> {
        self.0.page_size()
    }
    fn execute(&self, conn: &Connection, name: &str, args: &Value) -> Result<Value, KindError> {
        let command = from_wire::<K::Command>(name, args)?;
        output_json(self.0.execute(conn, command)?)
    }
    fn query(&self, conn: &Connection, name: &str, args: &Value) -> Result<Value, KindError> {
        let query = from_wire::<K::Query>(name, args)?;
        output_json(self.0.query(conn, query)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::KvCommand;
    use proptest::prelude::*;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(tag = "name", content = "args", rename_all = "snake_case")]
    enum Mixed {
        Ping,
        Echo { text: String },
    }

    fn code(error: KindError) -> RejectCode {
        match error {
            KindError::Rejected(rejection) => rejection.code,
            other => panic!("not a rejection: {other:?}"),
        }
    }

    #[test]
    fn an_unknown_name_and_bad_arguments_are_told_apart_by_type() {
        let bad = from_wire::<KvCommand>("put", &serde_json::json!({"key": 1}));
        assert_eq!(code(bad.unwrap_err()), RejectCode::BadParameters);
        let unknown = from_wire::<KvCommand>("nope", &serde_json::json!({"key": "a"}));
        assert_eq!(code(unknown.unwrap_err()), RejectCode::UnknownCommand);
        let good = from_wire::<KvCommand>("delete", &serde_json::json!({"key": "a"})).unwrap();
        assert_eq!(good, KvCommand::Delete { key: "a".into() });
        // A variant without arguments, and one with.
        assert!(names_a_variant::<Mixed>("ping"));
        assert!(names_a_variant::<Mixed>("echo"));
        assert!(!names_a_variant::<Mixed>("Ping"));
        let wrong = from_wire::<Mixed>("echo", &serde_json::json!({}));
        assert_eq!(code(wrong.unwrap_err()), RejectCode::BadParameters);
        let echo = from_wire::<Mixed>("echo", &serde_json::json!({"text": "hi"})).unwrap();
        assert_eq!(echo, Mixed::Echo { text: "hi".into() });
    }

    proptest! {
        /// Any name a client sends is classified exactly: a variant of the
        /// kind's enum or not.
        #[test]
        fn a_name_is_a_variant_exactly_when_the_enum_has_it(name in "\\PC{0,12}") {
            let known = ["put", "delete", "cas"].contains(&name.as_str());
            prop_assert_eq!(names_a_variant::<KvCommand>(&name), known);
        }
    }
}
