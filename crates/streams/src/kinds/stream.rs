//! The built-in `stream` kind: one Durable Stream per Cell, its messages, offsets, producers, TTL and closed flag in SQLite.
//!
//! Offsets are byte positions in the stream (for JSON streams: positions in
//! the concatenation of the stored message texts), so they are strictly
//! increasing and only ever name a message boundary. Every mutation runs as
//! one command of the runtime: it is visible to readers (queries) only after
//! the publication holding it was written by the root CAS.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use cellfleet_cell::{KindError, Limits, RejectCode, RustKind};
use rusqlite::{Connection, OptionalExtension};
use serde::{Deserialize, Serialize};

/// The kind's name.
pub const STREAM_KIND: &str = "stream";

/// Most fork paths one [`StreamQuery::Forks`] lists.
pub const FORKS_LISTED_MAX: usize = 100;

/// Largest number of data bytes one read returns (a chunk).
pub const READ_CHUNK_BYTES_MAX: u64 = 1 << 20;

/// The `stream` kind.
#[derive(Clone, Debug, Default)]
pub struct StreamKind;

/// A stream's configuration, as given at creation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamConfig {
    /// Lowercased media type with its parameters as sent.
    pub content_type: String,
    /// `Stream-TTL`, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
    /// `Stream-Expires-At`, as sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// Absolute expiry derived from either, wall ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<i64>,
}

/// Where a fork came from: its source stream's path, the source offset it
/// was cut at, and the sub-offset within what was appended there (bytes for
/// binary streams, messages for JSON). Stored in the fork's Cell and
/// compared when the fork is created again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lineage {
    pub source: String,
    pub offset: u64,
    pub sub_offset: u64,
}

/// An idempotent producer's identity and position.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Producer {
    pub id: String,
    pub epoch: u64,
    pub seq: u64,
}

/// `stream` commands.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "name", content = "args", rename_all = "snake_case")]
pub enum StreamCommand {
    /// PUT: create (idempotent on equal configuration).
    Create {
        config: StreamConfig,
        closed: bool,
        /// Initial messages, base64.
        messages: Vec<String>,
        now_ms: i64,
        /// Set for a fork; compared with a stored lineage on re-create.
        #[serde(default)]
        lineage: Option<Lineage>,
        /// Whether the request named the fork offset (when it did not, an
        /// existing fork's offset is not compared).
        #[serde(default)]
        fork_offset_given: bool,
    },
    /// POST: append messages and/or close.
    Append {
        content_type: Option<String>,
        /// Messages, base64.
        messages: Vec<String>,
        seq: Option<String>,
        producer: Option<Producer>,
        close: bool,
        now_ms: i64,
    },
    /// DELETE: removes the stream, or only marks it deleted (soft delete)
    /// while forks are registered with it.
    Delete { now_ms: i64 },
    /// A read happened: renew a TTL.
    Touch { now_ms: i64 },
    /// On a source, before its fork is created: the fork at path `fork`
    /// holds a reference (idempotent; refused once the source is deleted).
    RegisterFork { fork: String, now_ms: i64 },
    /// On a source, after its fork at `fork` was removed: drop the
    /// reference; a soft-deleted source left without forks is removed.
    ReleaseFork { fork: String, now_ms: i64 },
}

/// `stream` queries.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "name", content = "args", rename_all = "snake_case")]
pub enum StreamQuery {
    /// Messages from `offset` (`None`: the tail), at most a chunk.
    Read { offset: Option<u64>, now_ms: i64 },
    /// The paths of the forks holding a reference on this stream.
    Forks {},
    /// This stream's lineage, whether it expired, whether it exists at all.
    Lineage { now_ms: i64 },
}

/// A stream's state as readers see it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamState {
    pub config: StreamConfig,
    pub tail: u64,
    pub closed: bool,
    /// Set for a fork.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lineage: Option<Lineage>,
}

/// What a `stream` command or query returns.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StreamOutput {
    Created {
        state: StreamState,
        /// False when an equal stream already existed.
        created: bool,
        /// The source an expired fork replaced here was forked from (its
        /// reference there is to be released).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        release: Option<String>,
    },
    /// The forks referencing a stream (at most [`FORKS_LISTED_MAX`]).
    Forks {
        forks: Vec<String>,
    },
    /// A stored stream's lineage; `expired` when its TTL or expiry passed.
    Lineage {
        lineage: Option<Lineage>,
        expired: bool,
    },
    /// Exists with another configuration.
    ConfigMismatch,
    NotFound,
    Appended {
        state: StreamState,
        /// Producer position after this append (echoed in headers).
        producer: Option<Producer>,
    },
    /// A producer retry of an already stored append.
    Duplicate {
        state: StreamState,
        producer: Producer,
    },
    ContentTypeMismatch,
    Closed {
        state: StreamState,
    },
    SeqConflict,
    StaleEpoch {
        current_epoch: u64,
    },
    InvalidEpochSeq,
    SeqGap {
        expected: u64,
        received: u64,
    },
    /// Removed or soft-deleted. `release` names the source this stream
    /// was forked from when the stream is gone for good (its reference
    /// there is to be released).
    Deleted {
        #[serde(default)]
        release: Option<String>,
    },
    /// Soft-deleted (it still has forks): HTTP 410.
    Gone,
    /// The fork reference is held.
    Registered,
    /// The fork reference was dropped; `collected` when this (soft-deleted)
    /// stream went with it, `release` then naming its own source.
    Released {
        collected: bool,
        release: Option<String>,
    },
    Read {
        state: StreamState,
        /// First offset of each returned message and its bytes (base64).
        messages: Vec<(u64, String)>,
        /// Offset after the last returned message.
        next: u64,
    },
    /// The offset is not a message boundary of this stream.
    BadOffset,
}

fn kind_error(message: impl Into<String>) -> KindError {
    KindError::reject(RejectCode::BadParameters, message)
}

fn decode(messages: &[String]) -> Result<Vec<Vec<u8>>, KindError> {
    messages
        .iter()
        .map(|m| {
            BASE64
                .decode(m)
                .map_err(|e| kind_error(format!("bad base64: {e}")))
        })
        .collect()
}

/// `meta`'s columns: content type, TTL, expires-at, expiry ms, tail, closed.
type MetaRow = (String, Option<i64>, Option<String>, Option<i64>, i64, i64);

/// `meta`'s fork columns: source, fork offset, sub-offset, soft-deleted.
type ForkRow = (Option<String>, Option<i64>, Option<i64>, i64);

/// The schema a command sees: the engine runs every outstanding migration
/// of the kind before the commands of a group (`Cell::execute`), so a
/// command never looks it up (the lookup scans `sqlite_master`, a few
/// percent of an append's CPU). Queries read the published state, which
/// may be older, and look it up with [`schema`].
const COMMAND_SCHEMA: i64 = 2;

/// Which migrations the state `conn` reads has, from the tables they
/// create: 0 (never written), 1 (no fork columns yet: read as no lineage,
/// not deleted) or 2.
fn schema(conn: &Connection) -> Result<i64, KindError> {
    Ok(conn
        .prepare_cached(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN ('meta', 'forks')",
        )?
        .query_row([], |r| r.get(0))?)
}

/// The stored stream, expired or not, and whether it is soft-deleted.
fn load_any(conn: &Connection, schema: i64) -> Result<Option<(StreamState, bool)>, KindError> {
    if schema == 0 {
        return Ok(None);
    }
    // One read of the row: the fork columns exist from the second
    // migration on.
    let sql = if schema < 2 {
        "SELECT content_type, ttl_seconds, expires_at, expires_at_ms, tail, closed \
         FROM meta WHERE id = 1"
    } else {
        "SELECT content_type, ttl_seconds, expires_at, expires_at_ms, tail, closed, \
         forked_from, fork_offset, fork_sub_offset, deleted FROM meta WHERE id = 1"
    };
    let row: Option<(MetaRow, ForkRow)> = conn
        .prepare_cached(sql)?
        .query_row([], |r| {
            let meta = (
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
            );
            let fork = if schema < 2 {
                (None, None, None, 0)
            } else {
                (r.get(6)?, r.get(7)?, r.get(8)?, r.get(9)?)
            };
            Ok((meta, fork))
        })
        .optional()?;
    let Some(((content_type, ttl, expires_at, expires_at_ms, tail, closed), fork)) = row else {
        return Ok(None);
    };
    let (source, offset, sub_offset, deleted) = fork;
    let lineage = source.map(|source| Lineage {
        source,
        offset: offset.unwrap_or(0) as u64,
        sub_offset: sub_offset.unwrap_or(0) as u64,
    });
    let state = StreamState {
        config: StreamConfig {
            content_type,
            ttl_seconds: ttl.map(|t| t as u64),
            expires_at,
            expires_at_ms,
        },
        tail: tail as u64,
        closed: closed != 0,
        lineage,
    };
    Ok(Some((state, deleted != 0)))
}

fn expired(state: &StreamState, now_ms: i64) -> bool {
    state.config.expires_at_ms.is_some_and(|at| now_ms >= at)
}

/// The stream unless absent or expired; `Err(Gone)` when soft-deleted.
fn load_live(
    conn: &Connection,
    schema: i64,
    now_ms: i64,
) -> Result<Result<StreamState, StreamOutput>, KindError> {
    Ok(match load_any(conn, schema)? {
        Some((state, _)) if expired(&state, now_ms) => Err(StreamOutput::NotFound),
        Some((_, true)) => Err(StreamOutput::Gone),
        Some((state, false)) => Ok(state),
        None => Err(StreamOutput::NotFound),
    })
}

fn forks(conn: &Connection, schema: i64) -> Result<i64, KindError> {
    if schema < 2 {
        return Ok(0);
    }
    Ok(conn
        .prepare_cached("SELECT count(*) FROM forks")?
        .query_row([], |r| r.get(0))?)
}

fn wipe(conn: &Connection) -> Result<(), KindError> {
    conn.execute_batch(
        "DELETE FROM meta; DELETE FROM messages; DELETE FROM producers; DELETE FROM forks;",
    )?;
    Ok(())
}

/// Whether an existing fork's lineage answers a create request's: same
/// source and sub-offset, and the same fork offset when the request gave one.
fn same_lineage(stored: Option<&Lineage>, requested: Option<&Lineage>, offset_given: bool) -> bool {
    match (stored, requested) {
        (None, None) => true,
        (Some(s), Some(r)) => {
            s.source == r.source
                && s.sub_offset == r.sub_offset
                && (!offset_given || s.offset == r.offset)
        }
        _ => false,
    }
}

fn insert(conn: &Connection, tail: u64, messages: &[Vec<u8>]) -> Result<u64, KindError> {
    let mut tail = tail;
    let mut statement =
        conn.prepare_cached("INSERT INTO messages (start, data) VALUES (?1, ?2)")?;
    for message in messages {
        statement.execute((tail as i64, message.as_slice()))?;
        tail += message.len() as u64;
    }
    Ok(tail)
}

/// The media type of a `Content-Type` value: before any parameter,
/// trimmed, lowercase (`Application/JSON; charset=utf-8` is
/// `application/json`).
pub(crate) fn media_type(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

fn producer_state(conn: &Connection, id: &str) -> Result<Option<(u64, u64)>, KindError> {
    Ok(conn
        .prepare_cached("SELECT epoch, seq FROM producers WHERE id = ?1")?
        .query_row([id], |r| {
            Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64))
        })
        .optional()?)
}

#[allow(clippy::result_large_err)] // the refusal is an output, built once per append
/// The producer rule: `Ok(true)` accept, `Ok(false)` duplicate, `Err` refusal.
fn check_producer(state: Option<(u64, u64)>, p: &Producer) -> Result<bool, StreamOutput> {
    match state {
        None if p.seq == 0 => Ok(true),
        None => Err(StreamOutput::SeqGap {
            expected: 0,
            received: p.seq,
        }),
        Some((epoch, _)) if p.epoch < epoch => Err(StreamOutput::StaleEpoch {
            current_epoch: epoch,
        }),
        Some((epoch, _)) if p.epoch > epoch => {
            if p.seq == 0 {
                Ok(true)
            } else {
                Err(StreamOutput::InvalidEpochSeq)
            }
        }
        Some((_, seq)) if p.seq <= seq => Ok(false),
        Some((_, seq)) if p.seq == seq + 1 => Ok(true),
        Some((_, seq)) => Err(StreamOutput::SeqGap {
            expected: seq + 1,
            received: p.seq,
        }),
    }
}

/// PUT: creates the stream, or answers an existing one with the same
/// configuration (idempotent) or a mismatch. A fork's expired predecessor
/// at this path gives back its reference.
fn create(
    conn: &Connection,
    config: StreamConfig,
    closed: bool,
    messages: Vec<String>,
    now_ms: i64,
    lineage: Option<Lineage>,
    fork_offset_given: bool,
) -> Result<StreamOutput, KindError> {
    match load_live(conn, COMMAND_SCHEMA, now_ms)? {
        Ok(state) => {
            let same = media_type(&state.config.content_type) == media_type(&config.content_type)
                && state.config.ttl_seconds == config.ttl_seconds
                && state.config.expires_at == config.expires_at
                && state.closed == closed
                && same_lineage(state.lineage.as_ref(), lineage.as_ref(), fork_offset_given);
            return Ok(if same {
                StreamOutput::Created {
                    state,
                    created: false,
                    release: None,
                }
            } else {
                StreamOutput::ConfigMismatch
            });
        }
        // A soft-deleted stream keeps its path until its last
        // fork is gone.
        Err(StreamOutput::Gone) => return Ok(StreamOutput::Gone),
        Err(_) => {}
    }
    // An expired fork stored here gives back its reference
    // (unless the new stream is a fork of the same source: the
    // reference is keyed by this path, so it is the new one's).
    let previous = load_any(conn, COMMAND_SCHEMA)?;
    let had_meta = previous.is_some();
    let release = previous
        .and_then(|(old, _)| old.lineage)
        .map(|old| old.source)
        .filter(|old| lineage.as_ref().map(|l| &l.source) != Some(old));
    // A Cell without a meta row holds nothing else: every path that
    // removes the row removes the other tables' rows with it (`wipe`), and
    // rows are added to them only beside a live row. So a new stream's Cell
    // (the common case) skips four DELETE statements.
    if had_meta {
        wipe(conn)?;
    }
    let decoded = decode(&messages)?;
    let tail = insert(conn, 0, &decoded)?;
    conn.execute(
        "INSERT INTO meta (id, content_type, ttl_seconds, expires_at, expires_at_ms, tail, closed, \
         forked_from, fork_offset, fork_sub_offset) \
         VALUES (1, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        (
            &config.content_type,
            config.ttl_seconds.map(|t| t as i64),
            &config.expires_at,
            config.expires_at_ms,
            tail as i64,
            closed as i64,
            lineage.as_ref().map(|l| &l.source),
            lineage.as_ref().map(|l| l.offset as i64),
            lineage.as_ref().map(|l| l.sub_offset as i64),
        ),
    )?;
    Ok(StreamOutput::Created {
        state: StreamState {
            config,
            tail,
            closed,
            lineage,
        },
        created: true,
        release,
    })
}

/// DELETE: removes the stream, or marks it deleted while forks still
/// reference it (it answers 410 until its last fork is gone).
fn delete(conn: &Connection, now_ms: i64) -> Result<StreamOutput, KindError> {
    let state = match load_live(conn, COMMAND_SCHEMA, now_ms)? {
        Ok(state) => state,
        Err(refusal) => return Ok(refusal),
    };
    if forks(conn, COMMAND_SCHEMA)? > 0 {
        // Forks still reference it: answer 410 from now on,
        // remove it with its last fork.
        conn.execute("UPDATE meta SET deleted = 1 WHERE id = 1", [])?;
        return Ok(StreamOutput::Deleted { release: None });
    }
    wipe(conn)?;
    Ok(StreamOutput::Deleted {
        release: state.lineage.map(|l| l.source),
    })
}

/// A fork at `fork` no longer references this stream; a deleted or
/// expired stream with no fork left is collected.
fn release_fork(conn: &Connection, fork: &str, now_ms: i64) -> Result<StreamOutput, KindError> {
    let Some((state, deleted)) = load_any(conn, COMMAND_SCHEMA)? else {
        return Ok(StreamOutput::NotFound);
    };
    conn.execute("DELETE FROM forks WHERE path = ?1", [fork])?;
    // Soft-deleted (or expired) and no fork left: nothing can
    // reach it any more.
    if forks(conn, COMMAND_SCHEMA)? == 0 && (deleted || expired(&state, now_ms)) {
        wipe(conn)?;
        return Ok(StreamOutput::Released {
            collected: true,
            release: state.lineage.map(|l| l.source),
        });
    }
    Ok(StreamOutput::Released {
        collected: false,
        release: None,
    })
}

fn append(
    conn: &Connection,
    content_type: Option<String>,
    messages: Vec<String>,
    seq: Option<String>,
    producer: Option<Producer>,
    close: bool,
    now_ms: i64,
) -> Result<StreamOutput, KindError> {
    let mut state = match load_live(conn, COMMAND_SCHEMA, now_ms)? {
        Ok(state) => state,
        Err(refusal) => return Ok(refusal),
    };
    if let Some(p) = &producer {
        match check_producer(producer_state(conn, &p.id)?, p) {
            Ok(true) => {}
            Ok(false) => {
                let (epoch, seq) = producer_state(conn, &p.id)?.unwrap_or((p.epoch, p.seq));
                return Ok(StreamOutput::Duplicate {
                    state,
                    producer: Producer {
                        id: p.id.clone(),
                        epoch,
                        seq,
                    },
                });
            }
            Err(refusal) => return Ok(refusal),
        }
    }
    if state.closed {
        if close && messages.is_empty() && producer.is_none() {
            return Ok(StreamOutput::Appended {
                state,
                producer: None,
            });
        }
        return Ok(StreamOutput::Closed { state });
    }
    if !messages.is_empty() {
        if let Some(ct) = &content_type {
            if media_type(ct) != media_type(&state.config.content_type) {
                return Ok(StreamOutput::ContentTypeMismatch);
            }
        }
    }
    if let Some(seq) = &seq {
        let last: Option<String> = conn
            .prepare_cached("SELECT last_seq FROM meta WHERE id = 1")?
            .query_row([], |r| r.get(0))?;
        if last.is_some_and(|last| seq.as_str() <= last.as_str()) {
            return Ok(StreamOutput::SeqConflict);
        }
        conn.prepare_cached("UPDATE meta SET last_seq = ?1 WHERE id = 1")?
            .execute([seq])?;
    }
    let decoded = decode(&messages)?;
    state.tail = insert(conn, state.tail, &decoded)?;
    state.closed = close;
    // Cached statements: an append is the hot path (a statement prepared
    // per append was about 2% of a node's append CPU).
    conn.prepare_cached("UPDATE meta SET tail = ?1, closed = ?2 WHERE id = 1")?
        .execute((state.tail as i64, close as i64))?;
    renew(conn, &mut state, now_ms)?;
    if let Some(p) = &producer {
        conn.prepare_cached(
            "INSERT INTO producers (id, epoch, seq) VALUES (?1, ?2, ?3) \
             ON CONFLICT (id) DO UPDATE SET epoch = excluded.epoch, seq = excluded.seq",
        )?
        .execute((&p.id, p.epoch as i64, p.seq as i64))?;
    }
    Ok(StreamOutput::Appended { state, producer })
}

/// Longest a read's slide of a TTL goes unpersisted: a twentieth of the
/// TTL, at most this.
pub const TOUCH_SLACK_MS_MAX: i64 = 1000;

/// Whether a read at `now_ms` must persist the slide of a `ttl_seconds`
/// TTL whose stored expiry is `expires_at_ms`: only when it would move the
/// expiry by more than the slack (a twentieth of the TTL, at most
/// [`TOUCH_SLACK_MS_MAX`]). So a stream that is only read publishes at
/// most one touch per slack, and expires at most a slack before its last
/// read plus its TTL. Nothing is kept in memory: a crash loses nothing.
pub fn touch_due(now_ms: i64, ttl_seconds: u64, expires_at_ms: Option<i64>) -> bool {
    let ttl_ms = i64::try_from(ttl_seconds)
        .unwrap_or(i64::MAX)
        .saturating_mul(1000);
    let slack = (ttl_ms / 20).min(TOUCH_SLACK_MS_MAX);
    let wanted = now_ms.saturating_add(ttl_ms);
    expires_at_ms.is_none_or(|at| wanted.saturating_sub(at) > slack)
}

/// A TTL is a sliding window: every read or write moves the expiry.
fn renew(conn: &Connection, state: &mut StreamState, now_ms: i64) -> Result<(), KindError> {
    if let Some(ttl) = state.config.ttl_seconds {
        let at = now_ms.saturating_add((ttl as i64).saturating_mul(1000));
        conn.prepare_cached("UPDATE meta SET expires_at_ms = ?1 WHERE id = 1")?
            .execute([at])?;
        state.config.expires_at_ms = Some(at);
    }
    Ok(())
}

fn read(conn: &Connection, offset: Option<u64>, now_ms: i64) -> Result<StreamOutput, KindError> {
    let state = match load_live(conn, schema(conn)?, now_ms)? {
        Ok(state) => state,
        Err(refusal) => return Ok(refusal),
    };
    let offset = offset.unwrap_or(state.tail);
    if offset > state.tail {
        return Ok(StreamOutput::BadOffset);
    }
    let mut statement =
        conn.prepare_cached("SELECT start, data FROM messages WHERE start >= ?1 ORDER BY start")?;
    let mut rows = statement.query([offset as i64])?;
    let mut messages = Vec::new();
    let mut next = offset;
    let mut bytes = 0u64;
    while let Some(row) = rows.next()? {
        let start = row.get::<_, i64>(0)? as u64;
        let data: Vec<u8> = row.get(1)?;
        if start != next {
            // The offset falls inside a message: not a boundary.
            return Ok(StreamOutput::BadOffset);
        }
        if !messages.is_empty() && bytes + data.len() as u64 > READ_CHUNK_BYTES_MAX {
            break;
        }
        bytes += data.len() as u64;
        next = start + data.len() as u64;
        messages.push((start, BASE64.encode(&data)));
    }
    Ok(StreamOutput::Read {
        state,
        messages,
        next,
    })
}

/// A stream Cell's SQLite page size. Streams are small rows written one
/// at a time, and every page an append dirties (its message's leaf, the
/// stream's meta row, the ledger's row, the engine's TXID) is copied into
/// the WAL, checksummed, compressed and written to the node log. Measured
/// against 4 KiB (BENCHMARKS.md, sixteenth measurement): the node's RSS a
/// third lower with 4,096 stream Cells open, an idle stream's local files
/// 59 KiB instead of 104 KiB, appends/s unchanged. Appends larger than a
/// page spill into overflow pages.
pub const STREAM_PAGE_SIZE: u32 = 1024;

impl RustKind for StreamKind {
    type Command = StreamCommand;
    type Query = StreamQuery;
    type Output = StreamOutput;

    fn name(&self) -> &str {
        STREAM_KIND
    }

    fn migrations(&self) -> Vec<String> {
        vec![
            "CREATE TABLE meta (id INTEGER PRIMARY KEY CHECK (id = 1), content_type TEXT NOT NULL, \
              ttl_seconds INTEGER, expires_at TEXT, expires_at_ms INTEGER, tail INTEGER NOT NULL, \
              closed INTEGER NOT NULL, last_seq TEXT); \
              CREATE TABLE messages (start INTEGER PRIMARY KEY, data BLOB NOT NULL); \
              CREATE TABLE producers (id TEXT PRIMARY KEY, epoch INTEGER NOT NULL, seq INTEGER NOT NULL)"
            .into(),
            // Fork lineage, soft delete and the forks holding a reference.
            "ALTER TABLE meta ADD COLUMN forked_from TEXT; \
             ALTER TABLE meta ADD COLUMN fork_offset INTEGER; \
             ALTER TABLE meta ADD COLUMN fork_sub_offset INTEGER; \
             ALTER TABLE meta ADD COLUMN deleted INTEGER NOT NULL DEFAULT 0; \
             CREATE TABLE forks (path TEXT PRIMARY KEY)"
                .into(),
        ]
    }

    fn limits(&self) -> Limits {
        Limits {
            rows_max: 1_000_000,
            bytes_max: 16 << 20,
            statements_max: 64,
            payload_bytes_max: 16 << 20,
        }
    }

    fn page_size(&self) -> Option<u32> {
        Some(STREAM_PAGE_SIZE)
    }

    fn execute(
        &self,
        conn: &Connection,
        command: StreamCommand,
    ) -> Result<StreamOutput, KindError> {
        match command {
            StreamCommand::Create {
                config,
                closed,
                messages,
                now_ms,
                lineage,
                fork_offset_given,
            } => create(
                conn,
                config,
                closed,
                messages,
                now_ms,
                lineage,
                fork_offset_given,
            ),
            StreamCommand::Append {
                content_type,
                messages,
                seq,
                producer,
                close,
                now_ms,
            } => append(conn, content_type, messages, seq, producer, close, now_ms),
            StreamCommand::Touch { now_ms } => match load_live(conn, COMMAND_SCHEMA, now_ms)? {
                Ok(mut state) => {
                    renew(conn, &mut state, now_ms)?;
                    Ok(StreamOutput::Deleted { release: None })
                }
                Err(refusal) => Ok(refusal),
            },
            StreamCommand::Delete { now_ms } => delete(conn, now_ms),
            StreamCommand::RegisterFork { fork, now_ms } => {
                match load_live(conn, COMMAND_SCHEMA, now_ms)? {
                    Ok(_) => {
                        conn.execute("INSERT OR IGNORE INTO forks (path) VALUES (?1)", [&fork])?;
                        Ok(StreamOutput::Registered)
                    }
                    Err(refusal) => Ok(refusal),
                }
            }
            StreamCommand::ReleaseFork { fork, now_ms } => release_fork(conn, &fork, now_ms),
        }
    }

    fn query(&self, conn: &Connection, query: StreamQuery) -> Result<StreamOutput, KindError> {
        match query {
            StreamQuery::Read { offset, now_ms } => read(conn, offset, now_ms),
            StreamQuery::Forks {} => {
                if schema(conn)? < 2 {
                    return Ok(StreamOutput::Forks { forks: Vec::new() });
                }
                let mut statement =
                    conn.prepare_cached("SELECT path FROM forks ORDER BY path LIMIT ?1")?;
                let forks = statement
                    .query_map([FORKS_LISTED_MAX as i64], |r| r.get(0))?
                    .collect::<Result<Vec<String>, _>>()?;
                Ok(StreamOutput::Forks { forks })
            }
            StreamQuery::Lineage { now_ms } => Ok(match load_any(conn, schema(conn)?)? {
                Some((state, _)) => StreamOutput::Lineage {
                    expired: expired(&state, now_ms),
                    lineage: state.lineage,
                },
                None => StreamOutput::NotFound,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn commands_assume_every_migration_and_the_lookup_agrees_once_applied() {
        let migrations = StreamKind.migrations();
        assert_eq!(COMMAND_SCHEMA, migrations.len() as i64);
        let conn = Connection::open_in_memory().unwrap();
        assert_eq!(schema(&conn).unwrap(), 0);
        for (applied, migration) in migrations.iter().enumerate() {
            conn.execute_batch(migration).unwrap();
            assert_eq!(schema(&conn).unwrap(), applied as i64 + 1);
        }
    }

    #[test]
    fn an_append_outcome_leaves_unset_expiries_out_and_old_outcomes_still_read() {
        let appended = StreamOutput::Appended {
            state: StreamState {
                config: StreamConfig {
                    content_type: "application/octet-stream".into(),
                    ttl_seconds: None,
                    expires_at: None,
                    expires_at_ms: None,
                },
                tail: 256,
                closed: false,
                lineage: None,
            },
            producer: None,
        };
        let json = serde_json::to_string(&appended).unwrap();
        assert_eq!(
            json,
            r#"{"type":"appended","state":{"config":{"content_type":"application/octet-stream"},"tail":256,"closed":false},"producer":null}"#
        );
        // The ledger keeps this text for every append: without the three
        // nulls the whole row (key, digest, outcome) stays under the
        // 230-byte inline limit of a `WITHOUT ROWID` row on a 1 KiB page,
        // so a plain append writes no overflow page (BENCHMARKS.md,
        // seventeenth measurement). The exact text above is the guard.
        // Outcomes stored before wrote the unset fields as null.
        let stored = r#"{"type":"appended","state":{"config":{"content_type":"application/octet-stream","expires_at":null,"expires_at_ms":null,"ttl_seconds":null},"tail":256,"closed":false},"producer":null}"#;
        assert_eq!(
            serde_json::from_str::<StreamOutput>(stored).unwrap(),
            appended
        );
        let set = StreamConfig {
            content_type: "text/plain".into(),
            ttl_seconds: Some(60),
            expires_at: Some("2030-01-01T00:00:00Z".into()),
            expires_at_ms: Some(1_893_456_000_000),
        };
        let round = serde_json::to_string(&set).unwrap();
        assert_eq!(serde_json::from_str::<StreamConfig>(&round).unwrap(), set);
    }

    #[test]
    fn a_read_touches_only_past_the_slack() {
        // TTL 2 s: slack 100 ms.
        assert!(!touch_due(1_000, 2, Some(3_000)));
        assert!(!touch_due(1_100, 2, Some(3_000)));
        assert!(touch_due(1_101, 2, Some(3_000)));
        // TTL 1 h: slack capped at 1 s.
        assert!(!touch_due(1_000, 3600, Some(3_600_000)));
        assert!(touch_due(1_001, 3600, Some(3_600_000)));
        assert!(touch_due(0, 2, None), "no stored expiry yet");
    }

    /// One step of a random command history for the meta-row rule.
    fn command_for(op: u8, n: u64, now_ms: i64) -> StreamCommand {
        let config = StreamConfig {
            content_type: "application/octet-stream".into(),
            ttl_seconds: n.is_multiple_of(2).then_some(1),
            expires_at: None,
            expires_at_ms: None,
        };
        let fork = format!("f{}", n % 2);
        match op % 6 {
            0 => StreamCommand::Create {
                config,
                closed: false,
                messages: vec!["aGk=".into(); (n % 3) as usize],
                now_ms,
                lineage: None,
                fork_offset_given: false,
            },
            1 => StreamCommand::Append {
                content_type: None,
                messages: vec!["aGk=".into()],
                seq: None,
                producer: (op / 6).is_multiple_of(2).then(|| Producer {
                    id: "p".into(),
                    epoch: 0,
                    seq: n,
                }),
                close: false,
                now_ms,
            },
            2 => StreamCommand::Delete { now_ms },
            3 => StreamCommand::RegisterFork { fork, now_ms },
            4 => StreamCommand::ReleaseFork { fork, now_ms },
            _ => StreamCommand::Touch { now_ms },
        }
    }

    fn rows(conn: &Connection, table: &str) -> i64 {
        conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
            .unwrap()
    }

    proptest! {
        /// The rule `create` relies on to skip its wipe: a stream Cell with
        /// no meta row holds no message, producer or fork, after any
        /// history of valid commands (each answered, none failing), TTLs
        /// lapsing in between. And a stream created anew holds only the
        /// messages it was created with.
        #[test]
        fn without_a_meta_row_a_stream_cell_holds_nothing(
            steps in proptest::collection::vec((0u8..12, 0u64..8, 0i64..1500), 1..40),
        ) {
            let mut conn = Connection::open_in_memory().unwrap();
            for migration in StreamKind.migrations() {
                conn.execute_batch(&migration).unwrap();
            }
            let mut now_ms = 1_000_000;
            for (op, n, advance) in steps {
                now_ms += advance;
                let command = command_for(op, n, now_ms);
                let created_with = match &command {
                    StreamCommand::Create { messages, .. } => Some(messages.len() as i64),
                    _ => None,
                };
                let tx = conn.transaction().unwrap();
                let output = StreamKind.execute(&tx, command);
                // Valid commands refuse with an output, never an error.
                prop_assert!(output.is_ok(), "{:?}", output);
                tx.commit().unwrap();
                if rows(&conn, "meta") == 0 {
                    let held = (rows(&conn, "messages"), rows(&conn, "producers"), rows(&conn, "forks"));
                    prop_assert_eq!(held, (0, 0, 0), "{:?}", output);
                }
                if let (Some(count), Ok(StreamOutput::Created { created: true, .. })) =
                    (created_with, &output)
                {
                    prop_assert_eq!(rows(&conn, "messages"), count);
                    prop_assert_eq!(rows(&conn, "producers"), 0);
                }
            }
        }

        /// Skipping a touch never lets the stored expiry fall more than the
        /// slack short of `now + ttl`, the slack is at most a twentieth of
        /// the TTL and at most 1 s, and a touch is due whenever the slide
        /// would move the expiry further than that.
        #[test]
        fn skipped_touches_stay_within_the_slack(
            now in 0i64..10_000_000_000_000,
            ttl in 1u64..100_000_000,
            behind in -10_000_000i64..10_000_000,
        ) {
            let wanted = now + (ttl as i64) * 1000;
            let stored = wanted - behind;
            let slack = ((ttl as i64) * 1000 / 20).min(TOUCH_SLACK_MS_MAX);
            let due = touch_due(now, ttl, Some(stored));
            prop_assert_eq!(due, behind > slack);
            if !due {
                prop_assert!(stored >= wanted - slack);
            }
            prop_assert!(slack <= TOUCH_SLACK_MS_MAX && slack * 20 <= (ttl as i64) * 1000);
        }
    }
}
