//! Commands, their outcomes and payload digests.
//!
//! A command is `{id, name, args, expires_at_ms}`. Its digest is SHA-256 of
//! a canonical encoding of `(kind, name, args)` (JSON with sorted object keys
//! and no whitespace, each part length-prefixed under a domain tag), so the
//! ledger can tell a retry (same id, same digest) from a reuse of an id for
//! a different payload (same id, other digest).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::sync::Arc;

use cellfleet_ltx::Txid;

/// Name of the command that runs a raw SQL batch (`args: {"sql": "..."}`),
/// accepted only by kinds that enable raw SQL.
pub const RAW_SQL: &str = "$sql";

/// A 16-byte client-chosen command id.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CommandId(pub [u8; 16]);

impl std::fmt::Debug for CommandId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CommandId({})", crate::hex::encode(&self.0))
    }
}

/// One command for one Cell.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Command {
    pub id: CommandId,
    /// A named command of the Cell's kind, or [`RAW_SQL`].
    pub name: String,
    /// A JSON object of arguments, shared: a command is cloned on its way
    /// to the engine (a retry, a dispatch attempt, the group the engine
    /// runs), and a clone must not copy the arguments.
    pub args: Arc<Value>,
    /// After this instant (plus nothing: the engine is strict) the command is
    /// refused without running; the ledger keeps its outcome until then plus
    /// the skew margin.
    pub expires_at_ms: i64,
}

impl Command {
    /// A command from its parts.
    pub fn new(id: [u8; 16], name: impl Into<String>, args: Value, expires_at_ms: i64) -> Self {
        Command {
            id: CommandId(id),
            name: name.into(),
            args: Arc::new(args),
            expires_at_ms,
        }
    }

    /// The payload digest of this command for kind `kind`.
    pub fn digest(&self, kind: &str) -> [u8; 32] {
        payload_digest(kind, &self.name, &self.args)
    }
}

/// Why a command did not apply. Stored in the ledger like a success.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejection {
    pub code: RejectCode,
    pub message: String,
}

/// The class of a [`Rejection`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectCode {
    /// The command's validity window has passed (never stored).
    Expired,
    /// The id was already used for a different payload (never stored).
    IdReused,
    /// The kind has no command of that name.
    UnknownCommand,
    /// Arguments missing, extra or of the wrong type.
    BadParameters,
    /// SQL that does not prepare or violates a constraint.
    Sql,
    /// Payload or result over a limit.
    LimitExceeded,
    /// Raw SQL on a kind that does not allow it.
    RawSqlDisabled,
    /// Refused by a kind's own logic.
    Kind,
}

impl Rejection {
    /// A rejection with a code and message.
    pub fn new(code: RejectCode, message: impl Into<String>) -> Self {
        Rejection {
            code,
            message: message.into(),
        }
    }
}

/// What a command did.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Outcome {
    Applied { result: Value },
    Rejected { rejection: Rejection },
}

/// The answer for one command of a group.
#[derive(Clone, Debug, PartialEq)]
pub struct CommandResult {
    pub id: CommandId,
    pub outcome: Outcome,
    /// The TXID whose publication holds this outcome; `None` for a command
    /// refused before it reached the ledger (expired, id reused).
    pub txid: Option<Txid>,
    /// True when the outcome comes from the ledger (an earlier execution).
    pub duplicate: bool,
    /// The publication that must be confirmed before this result may be
    /// released: the command's own group for a fresh outcome, the earlier
    /// group for a duplicate (or a reused id) whose first execution is
    /// still pending. `None` when the result rests on published state only
    /// (a duplicate of a published outcome, a refusal before the ledger).
    /// If that publication is aborted the result is void: the command did
    /// not commit, and its id is free again.
    pub depends_on_txid: Option<Txid>,
}

/// SHA-256 over the canonical encoding of `(kind, name, args)`.
pub fn payload_digest(kind: &str, name: &str, args: &Value) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(b"cellfleet.command.v1\0");
    for part in [kind.as_bytes(), name.as_bytes()] {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part);
    }
    let mut canonical = Vec::with_capacity(64);
    canonical_bytes(args, &mut canonical);
    hasher.update((canonical.len() as u64).to_be_bytes());
    hasher.update(&canonical);
    hasher.finalize().into()
}

/// JSON with object keys sorted bytewise and no whitespace, independent of
/// how `serde_json` was configured (`preserve_order`).
pub fn canonical_json(value: &Value, out: &mut String) {
    let mut bytes = Vec::new();
    canonical_bytes(value, &mut bytes);
    out.push_str(std::str::from_utf8(&bytes).expect("serde_json writes UTF-8"));
}

/// [`canonical_json`] written straight into `out`: strings and scalars are
/// encoded by `serde_json`'s compact writer in place (as its `Display`
/// does), with no string per key or value.
fn canonical_bytes(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push(b'{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_compact(out, key);
                out.push(b':');
                canonical_bytes(&map[key], out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical_bytes(item, out);
            }
            out.push(b']');
        }
        scalar => write_compact(out, scalar),
    }
}

fn write_compact<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    // Writing a string or a scalar into memory cannot fail.
    serde_json::to_writer(&mut *out, value).expect("a JSON scalar encodes");
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The encoding before it wrote in place: one string per key and
    /// scalar through `Display`. Digests stored in ledgers were made by it.
    fn canonical_reference(value: &Value, out: &mut String) {
        match value {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                out.push('{');
                for (i, key) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String(key.clone()).to_string());
                    out.push(':');
                    canonical_reference(&map[key], out);
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    canonical_reference(item, out);
                }
                out.push(']');
            }
            scalar => out.push_str(&scalar.to_string()),
        }
    }

    /// Strings heavy in what JSON escapes.
    const ESCAPES: &str = r#"[\\"\x{0}-\x{1f}\x{7f}-\x{a0}\x{2028}a-z]{0,8}"#;

    fn arb_json() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            any::<String>().prop_map(Value::String),
            ESCAPES.prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map(prop_oneof![any::<String>(), ESCAPES], inner, 0..6)
                    .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        /// Ledgers hold digests of the old encoding: the in-place one is
        /// byte for byte the same, so a retried command still matches.
        #[test]
        fn the_in_place_encoding_is_the_reference_one(value in arb_json()) {
            let mut reference = String::new();
            canonical_reference(&value, &mut reference);
            let mut fast = String::new();
            canonical_json(&value, &mut fast);
            proptest::prop_assert_eq!(fast, reference);
        }
    }

    #[test]
    fn digest_ignores_key_order_but_not_values() {
        let a = json!({"a": 1, "b": [1, {"y": 2, "x": 1}]});
        let b: Value = serde_json::from_str(r#"{"b":[1,{"x":1,"y":2}],"a":1}"#).unwrap();
        assert_eq!(payload_digest("k", "n", &a), payload_digest("k", "n", &b));
        assert_ne!(
            payload_digest("k", "n", &a),
            payload_digest("k", "n", &json!({"a": 2}))
        );
        assert_ne!(payload_digest("k", "n", &a), payload_digest("k", "m", &a));
        assert_ne!(payload_digest("kn", "", &a), payload_digest("k", "n", &a));
    }

    #[test]
    fn outcome_round_trips() {
        let o = Outcome::Rejected {
            rejection: Rejection::new(RejectCode::Sql, "boom"),
        };
        let s = serde_json::to_string(&o).unwrap();
        assert_eq!(serde_json::from_str::<Outcome>(&s).unwrap(), o);
    }
}
