//! Read connections pinned to one state of the Cell: in WAL mode an open
//! read transaction keeps seeing the database as of its first read, however
//! many transactions commit after it, so a connection pinned right after a
//! group's COMMIT (before the next group commits) keeps that state for as
//! long as the engine needs it. rusqlite has no safe binding of SQLite's
//! snapshot API, and this crate forbids `unsafe`, so the pin is a plain
//! `BEGIN` plus one read.
//!
//! A pin holds a WAL read mark, which keeps checkpoints from going past it;
//! the engine checkpoints only when nothing is pinned.

use std::path::Path;

use cellfleet_ltx::Txid;
use rusqlite::Connection;

use crate::connection::{open_connection, CellConfig};
use crate::guard::Guard;
use crate::{ledger, Error, Result};

/// What a reader sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pin {
    /// No read transaction: every read sees the latest committed state.
    Free,
    /// A read transaction that started at this TXID.
    Pinned(Txid),
    /// The read transaction ended underneath (SQLite rolls a transaction
    /// back on some I/O and memory errors): the connection no longer sees
    /// the state it was pinned to, and no later pin can go back to it.
    Lost,
}

/// One read-only connection and what it is pinned to.
#[derive(Debug)]
pub(crate) struct Reader {
    pub conn: Connection,
    pub guard: Guard,
    pin: Pin,
}

impl Reader {
    /// A free read-only connection to the database at `path`.
    pub(crate) fn open(path: &Path, config: &CellConfig) -> Result<Reader> {
        let (conn, guard) = open_connection(path, true, config)
            .map_err(|error| crate::connection::classify_open_error(path, error))?;
        Ok(Reader {
            conn,
            guard,
            pin: Pin::Free,
        })
    }

    /// What the reader sees now: a pin whose transaction SQLite ended is
    /// reported [`Pin::Lost`] (kind code cannot open a transaction again:
    /// the authorizer denies transaction control, so once lost it stays
    /// lost until [`Reader::unpin`]).
    pub(crate) fn pin(&self) -> Pin {
        match self.pin {
            Pin::Pinned(_) if self.conn.is_autocommit() => Pin::Lost,
            pin => pin,
        }
    }

    /// Open a read transaction on the latest committed state, which must be
    /// at `expected` (read back from the database, so a pin can never
    /// silently hold another state).
    pub(crate) fn pin_at(&mut self, expected: Txid) -> Result<()> {
        debug_assert_eq!(self.pin, Pin::Free, "pinning a pinned reader");
        self.conn.prepare_cached("BEGIN")?.execute([])?;
        // One read starts the transaction; past TXID 0 the engine tables
        // exist, and one statement both starts it and checks the state.
        let seen = if expected == Txid::ZERO {
            ledger::txid(&self.conn)
        } else {
            ledger::stored_txid(&self.conn)
        };
        match seen {
            Ok(seen) if seen == expected => {
                self.pin = Pin::Pinned(expected);
                Ok(())
            }
            other => {
                self.end_transaction()?;
                match other {
                    Ok(seen) => Err(Error::Recovery(format!(
                        "a reader pinned after txid {} sees txid {}",
                        expected.0, seen.0
                    ))),
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// End the read transaction (if any): reads see the latest state again.
    pub(crate) fn unpin(&mut self) -> Result<()> {
        self.end_transaction()?;
        self.pin = Pin::Free;
        Ok(())
    }

    fn end_transaction(&mut self) -> Result<()> {
        if !self.conn.is_autocommit() {
            self.conn.prepare_cached("COMMIT")?.execute([])?;
        }
        Ok(())
    }
}
