//! The outcome ledger and the engine's bookkeeping tables, stored in the
//! Cell's own database so they are captured, published and recovered with
//! the state they describe.
//!
//! - `_cellfleet_meta`: the Cell's TXID (bumped in every captured
//!   transaction, so the database names its own position).
//! - `_cellfleet_migrations`: the digest of each applied migration.
//! - `_cellfleet_entries`: one row per command run, in the order they ran
//!   (a plain rowid table, `seq`): its id, expiry, payload digest, TXID and
//!   the JSON outcome. An entry answers retries until its command's expiry
//!   plus the skew margin; after that a retry is refused as expired, and
//!   the id is free again ([`Entry::answers_at`]). Pruning deletes from the
//!   front of the table, as long as the front has expired, so an entry can
//!   outlive its own window until every entry before it has expired too:
//!   every entry's expiry lies within `validity_ms_max` of when it ran, so
//!   no entry stays longer than that plus the skew margin past its run.
//!
//! Command ids are random, and nothing in the database is keyed by them:
//! a group's rows append to the table's last page. A table or index keyed
//! by the id took each command's write on a page of its own, and each page
//! a group dirties is captured and LTX-encoded (BENCHMARKS.md, "The
//! ledger's layout"); a table keyed by expiry and id cost a record
//! comparison per insert (BENCHMARKS.md, thirty-first measurement). The
//! engine finds an id's row through [`Index`], a map from id to `seq` held
//! in memory and rebuilt from the table ([`load`]) whenever it may be out
//! of step.
//!
//! Cells created before this layout keep their outcomes in
//! `_cellfleet_outcomes`, keyed by expiry and id ([`Layout::ExpiryAndId`]), or,
//! older still, in `_cellfleet_ledger`, keyed by the id ([`Layout::Id`]).
//! The first group that writes to such a Cell moves them over ([`upgrade`])
//! inside its own transaction, so the move is captured and published with
//! it; a reader of a state published before that finds them where they
//! were ([`find_by_id`]).

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

const ENTRIES: &str = "
CREATE TABLE _cellfleet_entries (
    seq INTEGER PRIMARY KEY,
    id BLOB NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    digest BLOB NOT NULL,
    txid INTEGER NOT NULL,
    outcome TEXT NOT NULL
);
";

/// Moves a [`Layout::ExpiryAndId`] ledger's entries into the current table,
/// oldest expiry first, and drops the old table.
const UPGRADE_BY_EXPIRY: &str = "
INSERT INTO _cellfleet_entries (id, expires_at_ms, digest, txid, outcome)
    SELECT id, expires_at_ms, digest, txid, outcome FROM _cellfleet_outcomes
    ORDER BY expires_at_ms, id;
DROP TABLE _cellfleet_outcomes;
";

/// Moves a [`Layout::Id`] ledger's entries into the current table,
/// oldest expiry first, and drops the old table with its index.
const UPGRADE_BY_ID: &str = "
INSERT INTO _cellfleet_entries (id, expires_at_ms, digest, txid, outcome)
    SELECT id, expires_at_ms, digest, txid, outcome FROM _cellfleet_ledger
    ORDER BY expires_at_ms, id;
DROP TABLE _cellfleet_ledger;
";

/// Where a database keeps its outcomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// `_cellfleet_entries`, in the order the commands ran.
    Arrival,
    /// `_cellfleet_outcomes`, keyed by expiry and id (Cells created
    /// before).
    ExpiryAndId,
    /// `_cellfleet_ledger`, keyed by the id (Cells created before that).
    Id,
}

/// Every id in the ledger with the `seq` of its row (of its newest row,
/// when an id whose window ended ran again).
pub(crate) type Index = HashMap<[u8; 16], i64>;

/// Creates the engine tables of a new Cell (inside its first transaction).
pub(crate) fn create(conn: &Connection) -> Result<()> {
    conn.execute_batch(SCHEMA)?;
    conn.execute_batch(ENTRIES)?;
    Ok(())
}

/// The layout of a database whose engine tables exist.
pub(crate) fn layout(conn: &Connection) -> Result<Layout> {
    // Asked of the schema directly, as `exists` is; the current layout
    // first.
    Ok(
        if conn.table_exists(Some(c"main"), c"_cellfleet_entries")? {
            Layout::Arrival
        } else if conn.table_exists(Some(c"main"), c"_cellfleet_ledger")? {
            Layout::Id
        } else {
            Layout::ExpiryAndId
        },
    )
}

/// Inside a write transaction: moves an older ledger to
/// [`Layout::Arrival`]. Returns whether it changed the database.
pub(crate) fn upgrade(conn: &Connection) -> Result<bool> {
    let moves = match layout(conn)? {
        Layout::Arrival => return Ok(false),
        Layout::ExpiryAndId => UPGRADE_BY_EXPIRY,
        Layout::Id => UPGRADE_BY_ID,
    };
    conn.execute_batch(ENTRIES)?;
    conn.execute_batch(moves)?;
    Ok(true)
}

/// The command id in column 0 of a ledger row.
fn stored_id(row: &rusqlite::Row<'_>) -> Result<[u8; 16]> {
    let id: Vec<u8> = row.get(0)?;
    id.try_into()
        .map_err(|_| Error::Recovery("ledger id is not 16 bytes".into()))
}

/// Reads the [`Index`] of a [`Layout::Arrival`] ledger (in `seq` order,
/// so an id's newest row is the one it names).
pub(crate) fn load(conn: &Connection) -> Result<Index> {
    let mut stmt = conn.prepare_cached("SELECT id, seq FROM _cellfleet_entries ORDER BY seq")?;
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
    /// The expiry of the command it is the outcome of.
    pub expires_at_ms: i64,
}

impl Entry {
    /// Whether the entry still answers a retry of its id at `now_ms`: until
    /// its command's expiry plus the skew margin. Past that, a retry is
    /// refused as expired and the id may be used again, whether or not
    /// pruning has reached the row yet.
    pub(crate) fn answers_at(&self, now_ms: i64, skew_margin_ms: i64) -> bool {
        self.expires_at_ms >= now_ms.saturating_sub(skew_margin_ms)
    }
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

/// The entry in row `seq`, which the [`Index`] gave for `id`
/// ([`Layout::Arrival`]); `None` when that row is absent or holds another
/// id (a reader of an older state than the index's, where the row may not
/// exist yet or, after the table emptied, have been another command's).
pub(crate) fn get(conn: &Connection, seq: i64, id: &CommandId) -> Result<Option<Entry>> {
    let row = conn
        .prepare_cached(
            "SELECT id, digest, txid, outcome, expires_at_ms FROM _cellfleet_entries \
             WHERE seq = ?1",
        )?
        .query_row([seq], |r| {
            Ok((
                r.get::<_, Vec<u8>>(0)?,
                (r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?),
            ))
        })
        .optional()?;
    row.filter(|(stored, _)| stored[..] == id.0[..])
        .map(|(_, fields)| entry(fields))
        .transpose()
}

/// The entry of `id` in a ledger of an older layout (a reader of a state
/// published before the Cell's move to the current one). A
/// [`Layout::ExpiryAndId`] table has no key on the id alone, so this reads it
/// whole: it happens only between the moving group and its publication.
pub(crate) fn find_by_id(
    conn: &Connection,
    layout: Layout,
    id: &CommandId,
) -> Result<Option<Entry>> {
    let sql = match layout {
        Layout::Id => {
            "SELECT digest, txid, outcome, expires_at_ms FROM _cellfleet_ledger WHERE id = ?1"
        }
        Layout::ExpiryAndId => {
            "SELECT digest, txid, outcome, expires_at_ms FROM _cellfleet_outcomes WHERE id = ?1"
        }
        Layout::Arrival => {
            "SELECT digest, txid, outcome, expires_at_ms FROM _cellfleet_entries \
             WHERE id = ?1 ORDER BY seq DESC LIMIT 1"
        }
    };
    let row = conn
        .prepare_cached(sql)?
        .query_row([&id.0[..]], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })
        .optional()?;
    row.map(entry).transpose()
}

fn entry((digest, txid, outcome, expires_at_ms): (Vec<u8>, i64, String, i64)) -> Result<Entry> {
    let digest: [u8; 32] = digest
        .try_into()
        .map_err(|_| Error::Recovery("ledger digest is not 32 bytes".into()))?;
    let outcome = serde_json::from_str(&outcome)
        .map_err(|e| Error::Recovery(format!("ledger outcome does not decode: {e}")))?;
    Ok(Entry {
        digest,
        txid: Txid(txid as u64),
        outcome,
        expires_at_ms,
    })
}

/// Records an outcome ([`Layout::Arrival`]); returns the `seq` of its
/// row, for the caller's [`Index`].
pub(crate) fn record(
    conn: &Connection,
    id: &CommandId,
    digest: &[u8; 32],
    txid: Txid,
    expires_at_ms: i64,
    outcome: &Outcome,
) -> Result<i64> {
    let text = serde_json::to_string(outcome).expect("an outcome always encodes");
    conn.prepare_cached(
        "INSERT INTO _cellfleet_entries (id, expires_at_ms, digest, txid, outcome) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute((&id.0[..], expires_at_ms, &digest[..], txid.0 as i64, text))?;
    Ok(conn.last_insert_rowid())
}

/// The expiry of the entry at the front of the ledger, the next one
/// pruning can take; `i64::MAX` when the ledger is empty
/// ([`Layout::Arrival`]).
pub(crate) fn front_expiry(conn: &Connection) -> Result<i64> {
    let front: Option<i64> = conn
        .prepare_cached("SELECT expires_at_ms FROM _cellfleet_entries ORDER BY seq LIMIT 1")?
        .query_row([], |r| r.get(0))
        .optional()?;
    Ok(front.unwrap_or(i64::MAX))
}

/// Deletes entries from the front of the table while their validity window
/// ended before `cutoff_ms`, at most `max` ([`Layout::Arrival`]); returns
/// their ids with their `seq`, for the caller's [`Index`].
pub(crate) fn prune(conn: &Connection, cutoff_ms: i64, max: u32) -> Result<Vec<([u8; 16], i64)>> {
    let mut pruned = Vec::new();
    {
        let mut stmt = conn.prepare_cached(
            "SELECT id, seq, expires_at_ms FROM _cellfleet_entries ORDER BY seq LIMIT ?1",
        )?;
        let mut rows = stmt.query([i64::from(max)])?;
        while let Some(row) = rows.next()? {
            if row.get::<_, i64>(2)? >= cutoff_ms {
                break;
            }
            pruned.push((stored_id(row)?, row.get(1)?));
        }
    }
    if let Some(&(_, last)) = pruned.last() {
        conn.prepare_cached("DELETE FROM _cellfleet_entries WHERE seq <= ?1")?
            .execute([last])?;
    }
    Ok(pruned)
}

/// Number of entries (for tests and metrics).
pub(crate) fn len(conn: &Connection) -> Result<u64> {
    if !exists(conn)? {
        return Ok(0);
    }
    let sql = match layout(conn)? {
        Layout::Arrival => "SELECT count(*) FROM _cellfleet_entries",
        Layout::ExpiryAndId => "SELECT count(*) FROM _cellfleet_outcomes",
        Layout::Id => "SELECT count(*) FROM _cellfleet_ledger",
    };
    Ok(conn.query_row(sql, [], |r| r.get::<_, i64>(0))? as u64)
}
