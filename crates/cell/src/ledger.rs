//! The outcome ledger and the engine's bookkeeping tables, stored in the
//! Cell's own database so they are captured, published and recovered with
//! the state they describe.
//!
//! - `_cellfleet_meta`: the Cell's TXID (bumped in every captured
//!   transaction, so the database names its own position).
//! - `_cellfleet_migrations`: the digest of each applied migration.
//! - `_cellfleet_ledger`: command id (16 bytes) → payload digest, TXID,
//!   expiry and the JSON outcome. An entry lives until its command's expiry
//!   plus the skew margin; after that a retry is refused as expired before
//!   the ledger is consulted, so pruning it is safe.

use rusqlite::{Connection, OptionalExtension};

use crate::command::{CommandId, Outcome};
use crate::{Error, Result};
use cellfleet_ltx::Txid;

pub(crate) const SCHEMA: &str = "
CREATE TABLE _cellfleet_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
INSERT INTO _cellfleet_meta VALUES ('txid', 0);
CREATE TABLE _cellfleet_migrations (idx INTEGER PRIMARY KEY, digest BLOB NOT NULL);
CREATE TABLE _cellfleet_ledger (
    id BLOB PRIMARY KEY,
    digest BLOB NOT NULL,
    txid INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    outcome TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX _cellfleet_ledger_expiry ON _cellfleet_ledger (expires_at_ms);
";

/// A stored outcome.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub digest: [u8; 32],
    pub txid: Txid,
    pub outcome: Outcome,
}

/// Whether the engine tables exist yet (not before TXID 1).
pub(crate) fn exists(conn: &Connection) -> Result<bool> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM sqlite_schema WHERE name = '_cellfleet_meta'")?
        .exists([])?)
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

pub(crate) fn record_migration(conn: &Connection, index: usize, digest: &[u8]) -> Result<()> {
    conn.prepare_cached("INSERT INTO _cellfleet_migrations (idx, digest) VALUES (?1, ?2)")?
        .execute((index as i64, digest))?;
    Ok(())
}

pub(crate) fn lookup(conn: &Connection, id: &CommandId) -> Result<Option<Entry>> {
    let row: Option<(Vec<u8>, i64, String)> = conn
        .prepare_cached("SELECT digest, txid, outcome FROM _cellfleet_ledger WHERE id = ?1")?
        .query_row([&id.0[..]], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    let Some((digest, txid, outcome)) = row else {
        return Ok(None);
    };
    let digest: [u8; 32] = digest
        .try_into()
        .map_err(|_| Error::Recovery("ledger digest is not 32 bytes".into()))?;
    let outcome = serde_json::from_str(&outcome)
        .map_err(|e| Error::Recovery(format!("ledger outcome does not decode: {e}")))?;
    Ok(Some(Entry {
        digest,
        txid: Txid(txid as u64),
        outcome,
    }))
}

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
        "INSERT INTO _cellfleet_ledger (id, digest, txid, expires_at_ms, outcome) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute((&id.0[..], &digest[..], txid.0 as i64, expires_at_ms, text))?;
    Ok(())
}

/// The earliest expiry in the ledger; `i64::MAX` when it is empty.
pub(crate) fn earliest_expiry(conn: &Connection) -> Result<i64> {
    let earliest: Option<i64> = conn
        .prepare_cached("SELECT min(expires_at_ms) FROM _cellfleet_ledger")?
        .query_row([], |r| r.get(0))?;
    Ok(earliest.unwrap_or(i64::MAX))
}

/// Delete at most `max` entries whose validity window ended before
/// `cutoff_ms`; returns how many went.
pub(crate) fn prune(conn: &Connection, cutoff_ms: i64, max: u32) -> Result<usize> {
    Ok(conn
        .prepare_cached(
            "DELETE FROM _cellfleet_ledger WHERE id IN \
             (SELECT id FROM _cellfleet_ledger WHERE expires_at_ms < ?1 ORDER BY expires_at_ms LIMIT ?2)",
        )?
        .execute((cutoff_ms, i64::from(max)))?)
}

/// Number of entries (for tests and metrics).
pub(crate) fn len(conn: &Connection) -> Result<u64> {
    if !exists(conn)? {
        return Ok(0);
    }
    Ok(
        conn.query_row("SELECT count(*) FROM _cellfleet_ledger", [], |r| {
            r.get::<_, i64>(0)
        })? as u64,
    )
}
