//! What the `cell` examples share: one kind with one insert command, and a
//! fixed clock.

/// A kind `bench` whose command `insert` adds one row.
pub const MANIFEST: &str = r#"
[kinds.bench]
migrations = ["CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)"]
[kinds.bench.commands.insert]
sql = "INSERT INTO t (v) VALUES (:v)"
"#;

/// The examples' "now", in Unix milliseconds.
pub const NOW: i64 = 1_700_000_000_000;
