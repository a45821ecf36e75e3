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
    pub ttl_seconds: Option<u64>,
    /// `Stream-Expires-At`, as sent.
    pub expires_at: Option<String>,
    /// Absolute expiry derived from either, wall ms.
    pub expires_at_ms: Option<i64>,
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
    /// DELETE.
    Delete { now_ms: i64 },
    /// A read happened: renew a TTL.
    Touch { now_ms: i64 },
}

/// `stream` queries.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "name", content = "args", rename_all = "snake_case")]
pub enum StreamQuery {
    /// Messages from `offset` (`None`: the tail), at most a chunk.
    Read { offset: Option<u64>, now_ms: i64 },
}

/// A stream's state as readers see it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamState {
    pub config: StreamConfig,
    pub tail: u64,
    pub closed: bool,
}

/// What a `stream` command or query returns.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StreamOutput {
    Created {
        state: StreamState,
        /// False when an equal stream already existed.
        created: bool,
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
    Deleted,
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

fn load(conn: &Connection, now_ms: i64) -> Result<Option<StreamState>, KindError> {
    // A Cell never written to has not run its migrations yet: no stream.
    let tables: i64 = conn
        .prepare_cached(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'meta'",
        )?
        .query_row([], |r| r.get(0))?;
    if tables == 0 {
        return Ok(None);
    }
    let row: Option<MetaRow> = conn
        .prepare_cached(
            "SELECT content_type, ttl_seconds, expires_at, expires_at_ms, tail, closed FROM meta WHERE id = 1",
        )?
        .query_row([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?))
        })
        .optional()?;
    let Some((content_type, ttl, expires_at, expires_at_ms, tail, closed)) = row else {
        return Ok(None);
    };
    if expires_at_ms.is_some_and(|at| now_ms >= at) {
        return Ok(None);
    }
    Ok(Some(StreamState {
        config: StreamConfig {
            content_type,
            ttl_seconds: ttl.map(|t| t as u64),
            expires_at,
            expires_at_ms,
        },
        tail: tail as u64,
        closed: closed != 0,
    }))
}

fn wipe(conn: &Connection) -> Result<(), KindError> {
    conn.execute_batch("DELETE FROM meta; DELETE FROM messages; DELETE FROM producers;")?;
    Ok(())
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

fn media_type(content_type: &str) -> String {
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

fn append(
    conn: &Connection,
    content_type: Option<String>,
    messages: Vec<String>,
    seq: Option<String>,
    producer: Option<Producer>,
    close: bool,
    now_ms: i64,
) -> Result<StreamOutput, KindError> {
    let Some(mut state) = load(conn, now_ms)? else {
        return Ok(StreamOutput::NotFound);
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
        conn.execute("UPDATE meta SET last_seq = ?1 WHERE id = 1", [seq])?;
    }
    let decoded = decode(&messages)?;
    state.tail = insert(conn, state.tail, &decoded)?;
    state.closed = close;
    conn.execute(
        "UPDATE meta SET tail = ?1, closed = ?2 WHERE id = 1",
        (state.tail as i64, close as i64),
    )?;
    renew(conn, &mut state, now_ms)?;
    if let Some(p) = &producer {
        conn.execute(
            "INSERT INTO producers (id, epoch, seq) VALUES (?1, ?2, ?3) \
             ON CONFLICT (id) DO UPDATE SET epoch = excluded.epoch, seq = excluded.seq",
            (&p.id, p.epoch as i64, p.seq as i64),
        )?;
    }
    Ok(StreamOutput::Appended { state, producer })
}

/// A TTL is a sliding window: every read or write moves the expiry.
fn renew(conn: &Connection, state: &mut StreamState, now_ms: i64) -> Result<(), KindError> {
    if let Some(ttl) = state.config.ttl_seconds {
        let at = now_ms.saturating_add((ttl as i64).saturating_mul(1000));
        conn.execute("UPDATE meta SET expires_at_ms = ?1 WHERE id = 1", [at])?;
        state.config.expires_at_ms = Some(at);
    }
    Ok(())
}

fn read(conn: &Connection, offset: Option<u64>, now_ms: i64) -> Result<StreamOutput, KindError> {
    let Some(state) = load(conn, now_ms)? else {
        return Ok(StreamOutput::NotFound);
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

impl RustKind for StreamKind {
    type Command = StreamCommand;
    type Query = StreamQuery;
    type Output = StreamOutput;

    fn name(&self) -> &str {
        STREAM_KIND
    }

    fn migrations(&self) -> Vec<String> {
        vec!["CREATE TABLE meta (id INTEGER PRIMARY KEY CHECK (id = 1), content_type TEXT NOT NULL, \
              ttl_seconds INTEGER, expires_at TEXT, expires_at_ms INTEGER, tail INTEGER NOT NULL, \
              closed INTEGER NOT NULL, last_seq TEXT); \
              CREATE TABLE messages (start INTEGER PRIMARY KEY, data BLOB NOT NULL); \
              CREATE TABLE producers (id TEXT PRIMARY KEY, epoch INTEGER NOT NULL, seq INTEGER NOT NULL)"
            .into()]
    }

    fn limits(&self) -> Limits {
        Limits {
            rows_max: 1_000_000,
            bytes_max: 16 << 20,
            statements_max: 64,
            payload_bytes_max: 16 << 20,
        }
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
            } => {
                if let Some(state) = load(conn, now_ms)? {
                    let same = media_type(&state.config.content_type)
                        == media_type(&config.content_type)
                        && state.config.ttl_seconds == config.ttl_seconds
                        && state.config.expires_at == config.expires_at
                        && state.closed == closed;
                    return Ok(if same {
                        StreamOutput::Created {
                            state,
                            created: false,
                        }
                    } else {
                        StreamOutput::ConfigMismatch
                    });
                }
                wipe(conn)?;
                let decoded = decode(&messages)?;
                let tail = insert(conn, 0, &decoded)?;
                conn.execute(
                    "INSERT INTO meta (id, content_type, ttl_seconds, expires_at, expires_at_ms, tail, closed) \
                     VALUES (1, ?1, ?2, ?3, ?4, ?5, ?6)",
                    (
                        &config.content_type,
                        config.ttl_seconds.map(|t| t as i64),
                        &config.expires_at,
                        config.expires_at_ms,
                        tail as i64,
                        closed as i64,
                    ),
                )?;
                Ok(StreamOutput::Created {
                    state: StreamState {
                        config,
                        tail,
                        closed,
                    },
                    created: true,
                })
            }
            StreamCommand::Append {
                content_type,
                messages,
                seq,
                producer,
                close,
                now_ms,
            } => append(conn, content_type, messages, seq, producer, close, now_ms),
            StreamCommand::Touch { now_ms } => match load(conn, now_ms)? {
                Some(mut state) => {
                    renew(conn, &mut state, now_ms)?;
                    Ok(StreamOutput::Deleted)
                }
                None => Ok(StreamOutput::NotFound),
            },
            StreamCommand::Delete { now_ms } => {
                let existed = load(conn, now_ms)?.is_some();
                wipe(conn)?;
                Ok(if existed {
                    StreamOutput::Deleted
                } else {
                    StreamOutput::NotFound
                })
            }
        }
    }

    fn query(&self, conn: &Connection, query: StreamQuery) -> Result<StreamOutput, KindError> {
        match query {
            StreamQuery::Read { offset, now_ms } => read(conn, offset, now_ms),
        }
    }
}
