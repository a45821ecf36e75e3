//! The outcome ledger and the engine's bookkeeping tables, stored in the
//! Cell's own database so they are captured, published and recovered with
//! the state they describe.
//!
//! - `_cellfleet_meta`: the Cell's TXID (bumped in every captured
//!   transaction, so the database names its own position).
//! - `_cellfleet_migrations`: the digest of each applied migration.
//! - `_cellfleet_outcomes`: one row per command run, keyed by its expiry
//!   and id: payload digest, TXID and the JSON outcome. An entry lives
//!   until its command's expiry plus the skew margin; after that a retry is
//!   refused as expired before the ledger is consulted, so pruning it is
//!   safe. Pruning deletes from the front of the table.
//!
//! Command ids are random, and nothing in the database is keyed by them
//! alone: expiries rise with time, so a group's rows land on the table's
//! last pages. A table or index keyed by the id took each command's write
//! on a page of its own, and each page a group dirties is captured and
//! LTX-encoded (BENCHMARKS.md, "The ledger's layout"). The engine finds an
//! id's row through [`Index`], a map from id to expiry held in memory and
//! rebuilt from the table ([`load`]) whenever it may be out of step.
//!
//! Cells created before this layout keep their outcomes in
//! `_cellfleet_ledger`, keyed by the id ([`Layout::ById`]). The first group
//! that writes to such a Cell moves them over ([`upgrade`]) inside its own
//! transaction, so the move is captured and published with it; a reader of
//! a state published before that finds them where they were
//! ([`find_by_id`]).

use std::collections::HashMap;

use rusqlite::{Connection, OptionalExtension};
use sha2::{Digest, Sha256};

use crate::command::{CommandId, Outcome};
use crate::{Error, Result};
use cellfleet_ltx::Txid;

const SCHEMA: &str = "
CREATE TABLE _cellfleet_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
INSERT INTO _cellfleet_meta VALUES ('txid', 0);
CREATE TABLE _cellfleet_migrations (idx INTEGER PRIMARY KEY, digest BLOB NOT NULL);
";

const OUTCOMES: &str = "
CREATE TABLE _cellfleet_outcomes (
    expires_at_ms INTEGER NOT NULL,
    id BLOB NOT NULL,
    digest BLOB NOT NULL,
    txid INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    PRIMARY KEY (expires_at_ms, id)
) WITHOUT ROWID;
";

/// Moves a [`Layout::ById`] ledger's entries into the current table and
/// drops the old table with its index.
const UPGRADE: &str = "
INSERT INTO _cellfleet_outcomes (expires_at_ms, id, digest, txid, outcome)
    SELECT expires_at_ms, id, digest, txid, outcome FROM _cellfleet_ledger
    ORDER BY expires_at_ms, id;
DROP TABLE _cellfleet_ledger;
";

/// Where a database keeps its outcomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// `_cellfleet_outcomes`, keyed by expiry and id.
    ByExpiry,
    /// `_cellfleet_ledger`, keyed by the id (Cells created before).
    ById,
}

/// Every id in the ledger with its expiry: where its row is.
pub(crate) type Index = HashMap<[u8; 16], i64>;

/// Creates the engine tables of a new Cell (inside its first transaction).
pub(crate) fn create(conn: &Connection) -> Result<()> {
    conn.execute_batch(SCHEMA)?;
    conn.execute_batch(OUTCOMES)?;
    Ok(())
}

/// The layout of a database whose engine tables exist.
pub(crate) fn layout(conn: &Connection) -> Result<Layout> {
    // Asked of the schema directly, as `exists` is.
    let by_id = conn.table_exists(Some(c"main"), c"_cellfleet_ledger")?;
    Ok(if by_id {
        Layout::ById
    } else {
        Layout::ByExpiry
    })
}

/// Inside a write transaction: moves a [`Layout::ById`] ledger to
/// [`Layout::ByExpiry`]. Returns whether it changed the database.
pub(crate) fn upgrade(conn: &Connection) -> Result<bool> {
    if layout(conn)? == Layout::ByExpiry {
        return Ok(false);
    }
    conn.execute_batch(OUTCOMES)?;
    conn.execute_batch(UPGRADE)?;
    Ok(true)
}

/// The command id in column 0 of a ledger row.
fn stored_id(row: &rusqlite::Row<'_>) -> Result<[u8; 16]> {
    let id: Vec<u8> = row.get(0)?;
    id.try_into()
        .map_err(|_| Error::Recovery("ledger id is not 16 bytes".into()))
}

/// Reads the [`Index`] of a [`Layout::ByExpiry`] ledger.
pub(crate) fn load(conn: &Connection) -> Result<Index> {
    let mut stmt = conn.prepare_cached("SELECT id, expires_at_ms FROM _cellfleet_outcomes")?;
    let mut rows = stmt.query([])?;
    let mut index = Index::new();
    while let Some(row) = rows.next()? {
        index.insert(stored_id(row)?, row.get(1)?);
    }
    Ok(index)
}

/// A stored outcome.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub digest: [u8; 32],
    pub txid: Txid,
    pub outcome: Outcome,
}

/// Whether the engine tables exist yet (not before TXID 1). Asked of
/// SQLite's schema directly: a Cell's reopen compiles every statement
/// afresh, and this one ran on each (BENCHMARKS.md, twenty-third
/// measurement).
pub(crate) fn exists(conn: &Connection) -> Result<bool> {
    Ok(conn.table_exists(Some(c"main"), c"_cellfleet_meta")?)
}

/// The TXID stored in the database (0 before the engine tables exist).
pub(crate) fn txid(conn: &Connection) -> Result<Txid> {
    if !exists(conn)? {
        return Ok(Txid::ZERO);
    }
    stored_txid(conn)
}

/// The TXID stored in a database whose engine tables exist (TXID 1 on).
pub(crate) fn stored_txid(conn: &Connection) -> Result<Txid> {
    let v: i64 = conn
        .prepare_cached("SELECT value FROM _cellfleet_meta WHERE key = 'txid'")?
        .query_row([], |r| r.get(0))?;
    Ok(Txid(v as u64))
}

pub(crate) fn set_txid(conn: &Connection, txid: Txid) -> Result<()> {
    conn.prepare_cached("UPDATE _cellfleet_meta SET value = ?1 WHERE key = 'txid'")?
        .execute([txid.0 as i64])?;
    Ok(())
}

/// Digests of the applied migrations, in order.
pub(crate) fn applied_migrations(conn: &Connection) -> Result<Vec<Vec<u8>>> {
    if !exists(conn)? {
        return Ok(Vec::new());
    }
    let mut stmt = conn.prepare_cached("SELECT digest FROM _cellfleet_migrations ORDER BY idx")?;
    let rows = stmt.query_map([], |r| r.get::<_, Vec<u8>>(0))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// The digest a migration is recorded under.
pub(crate) fn migration_digest(sql: &str) -> Vec<u8> {
    Sha256::digest(sql.as_bytes()).to_vec()
}

pub(crate) fn record_migration(conn: &Connection, index: usize, digest: &[u8]) -> Result<()> {
    conn.prepare_cached("INSERT INTO _cellfleet_migrations (idx, digest) VALUES (?1, ?2)")?
        .execute((index as i64, digest))?;
    Ok(())
}

/// The entry of `id`, whose expiry the [`Index`] gave
/// ([`Layout::ByExpiry`]).
pub(crate) fn get(conn: &Connection, expires_at_ms: i64, id: &CommandId) -> Result<Option<Entry>> {
    let row = conn
        .prepare_cached(
            "SELECT digest, txid, outcome FROM _cellfleet_outcomes \
             WHERE expires_at_ms = ?1 AND id = ?2",
        )?
        .query_row((expires_at_ms, &id.0[..]), |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .optional()?;
    row.map(entry).transpose()
}

/// The entry of `id` in a [`Layout::ById`] ledger (a reader of a state
/// published before the Cell's move to the current layout).
pub(crate) fn find_by_id(conn: &Connection, id: &CommandId) -> Result<Option<Entry>> {
    let row = conn
        .prepare_cached("SELECT digest, txid, outcome FROM _cellfleet_ledger WHERE id = ?1")?
        .query_row([&id.0[..]], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    row.map(entry).transpose()
}

fn entry((digest, txid, outcome): (Vec<u8>, i64, String)) -> Result<Entry> {
    let digest: [u8; 32] = digest
        .try_into()
        .map_err(|_| Error::Recovery("ledger digest is not 32 bytes".into()))?;
    let outcome = serde_json::from_str(&outcome)
        .map_err(|e| Error::Recovery(format!("ledger outcome does not decode: {e}")))?;
    Ok(Entry {
        digest,
        txid: Txid(txid as u64),
        outcome,
    })
}

/// Records an outcome ([`Layout::ByExpiry`]; the caller adds it to its
/// [`Index`]).
pub(crate) fn record(
    conn: &Connection,
    id: &CommandId,
    digest: &[u8; 32],
    txid: Txid,
    expires_at_ms: i64,
    outcome: &Outcome,
) -> Result<()> {
    let text = serde_json::to_string(outcome).expect("an outcome always encodes");
    conn.prepare_cached(
        "INSERT INTO _cellfleet_outcomes (id, digest, txid, expires_at_ms, outcome) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute((&id.0[..], &digest[..], txid.0 as i64, expires_at_ms, text))?;
    Ok(())
}

/// The earliest expiry in the ledger; `i64::MAX` when it is empty
/// ([`Layout::ByExpiry`]).
pub(crate) fn earliest_expiry(conn: &Connection) -> Result<i64> {
    let earliest: Option<i64> = conn
        .prepare_cached("SELECT min(expires_at_ms) FROM _cellfleet_outcomes")?
        .query_row([], |r| r.get(0))?;
    Ok(earliest.unwrap_or(i64::MAX))
}

/// Delete at most `max` entries whose validity window ended before
/// `cutoff_ms`, from the front of the table ([`Layout::ByExpiry`]); returns
/// their ids, for the caller's [`Index`].
pub(crate) fn prune(conn: &Connection, cutoff_ms: i64, max: u32) -> Result<Vec<[u8; 16]>> {
    let mut stmt = conn.prepare_cached(
        "DELETE FROM _cellfleet_outcomes WHERE (expires_at_ms, id) IN \
         (SELECT expires_at_ms, id FROM _cellfleet_outcomes WHERE expires_at_ms < ?1 \
          ORDER BY expires_at_ms, id LIMIT ?2) RETURNING id",
    )?;
    let mut rows = stmt.query((cutoff_ms, i64::from(max)))?;
    let mut ids = Vec::new();
    while let Some(row) = rows.next()? {
        ids.push(stored_id(row)?);
    }
    Ok(ids)
}

/// Number of entries (for tests and metrics).
pub(crate) fn len(conn: &Connection) -> Result<u64> {
    if !exists(conn)? {
        return Ok(0);
    }
    let sql = match layout(conn)? {
        Layout::ByExpiry => "SELECT count(*) FROM _cellfleet_outcomes",
        Layout::ById => "SELECT count(*) FROM _cellfleet_ledger",
    };
    Ok(conn.query_row(sql, [], |r| r.get::<_, i64>(0))? as u64)
}
