//! Forks: copying a source's prefix into a new stream, and the source's references to its forks (released when a fork is deleted, swept when forks expired).

use super::error::Error;
use super::http::is_json;
use super::Streams;
use crate::clock::now_ms;
use crate::kinds::stream::{media_type, StreamCommand, StreamOutput, StreamQuery, StreamState};
use crate::offset;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use hyper::StatusCode;

/// What a fork inherits from its source.
pub(super) struct Fork {
    pub(super) state: StreamState,
    pub(super) messages: Vec<Vec<u8>>,
    /// The source offset it is cut at.
    pub(super) offset: u64,
}

impl Streams {
    /// The source's messages before the fork offset (copied into the fork:
    /// a first pass; forks do not share storage with their source yet).
    pub(super) async fn fork_prefix(
        &self,
        source: &str,
        fork_offset: Option<&str>,
        sub_offset: u64,
        explicit_type: Option<&str>,
    ) -> Result<Fork, Error> {
        let (state, _, _, _) = self.read_at(source, None).await.map_err(|e| match e {
            Error::Gone => Error::status(StatusCode::CONFLICT, "the source was deleted"),
            other => other,
        })?;
        if let Some(ct) = explicit_type {
            if media_type(ct) != media_type(&state.config.content_type) {
                return Err(Error::status(
                    StatusCode::CONFLICT,
                    "content type differs from the source's",
                ));
            }
        }
        let end = match fork_offset {
            None => state.tail,
            Some(text) => {
                offset::parse(text).ok_or_else(|| Error::bad("malformed Stream-Fork-Offset"))?
            }
        };
        if end > state.tail {
            return Err(Error::bad("Stream-Fork-Offset is beyond the source's tail"));
        }
        let mut messages = Vec::new();
        let mut position = 0;
        while position < end {
            let (_, chunk, _, next) = self.read_at(source, Some(position)).await?;
            if chunk.is_empty() {
                break;
            }
            for (start, data) in chunk {
                if start >= end {
                    break;
                }
                let data = BASE64.decode(data).map_err(|_| {
                    Error::status(StatusCode::INTERNAL_SERVER_ERROR, "bad stored data")
                })?;
                if start + data.len() as u64 > end {
                    return Err(Error::bad("Stream-Fork-Offset is not a message boundary"));
                }
                messages.push(data);
            }
            position = next;
        }
        if sub_offset > 0 {
            // Part of what was appended at the fork offset: the first
            // `sub_offset` bytes (binary) or messages (JSON).
            let (_, after, _, _) = self.read_at(source, Some(end)).await?;
            let decoded: Vec<Vec<u8>> = after
                .iter()
                .filter_map(|(_, m)| BASE64.decode(m).ok())
                .collect();
            if is_json(&state.config.content_type) {
                if sub_offset as usize > decoded.len() {
                    return Err(Error::bad("Stream-Fork-Sub-Offset overshoots the messages"));
                }
                messages.extend(decoded.into_iter().take(sub_offset as usize));
            } else {
                let Some(first) = decoded.into_iter().next() else {
                    return Err(Error::bad("no message at Stream-Fork-Offset"));
                };
                if sub_offset as usize > first.len() {
                    return Err(Error::bad("Stream-Fork-Sub-Offset overshoots the message"));
                }
                messages.push(first[..sub_offset as usize].to_vec());
            }
        }
        Ok(Fork {
            state,
            messages,
            offset: end,
        })
    }

    pub(super) async fn sweep(&self, path: String) {
        let Ok(StreamOutput::Forks { forks }) = self.query(&path, StreamQuery::Forks {}).await
        else {
            return;
        };
        for fork in forks {
            let lineage = StreamQuery::Lineage { now_ms: now_ms() };
            let ended = match self.query(&fork, lineage).await {
                Ok(StreamOutput::Lineage { lineage, expired }) => {
                    expired || lineage.map(|l| l.source).as_deref() != Some(path.as_str())
                }
                _ => false,
            };
            if ended {
                self.release(path.clone(), fork).await;
            }
        }
    }

    /// Drops fork `fork`'s reference on `source`, then, each time that
    /// removes a soft-deleted source, that source's reference on its own
    /// source (a chain of deleted forks goes bottom-up). A failed step
    /// stops the walk and leaves the rest retained (410), never removed.
    pub(super) async fn release(&self, source: String, fork: String) {
        let (mut source, mut fork) = (source, fork);
        // Bounded: a chain is acyclic, but paths are reused.
        for _ in 0..1_000 {
            let released = self
                .execute(
                    &source,
                    StreamCommand::ReleaseFork {
                        fork,
                        now_ms: now_ms(),
                    },
                )
                .await;
            match released {
                Ok(StreamOutput::Released {
                    collected: true,
                    release,
                }) => {
                    self.notifier.changed(&source);
                    match release {
                        Some(next) => (source, fork) = (next, source),
                        None => return,
                    }
                }
                Ok(_) => return,
                Err(_) => {
                    tracing::warn!(%source, "releasing a fork reference failed; the source is kept");
                    return;
                }
            }
        }
    }
}
