//! The actor's reads: queries served at once or parked until the txid they wait for is published, and resolves of a command id against the ledger.

use super::*;

impl Actor {
    /// Takes the descriptors of the reader the next read opens (the Cell
    /// has none and nothing is pending), asking the node to passivate an
    /// idle Cell when `fds_max` is spent (and one more each
    /// [`crate::node::ROOM_ASK_AGAIN_AFTER`] it waits).
    pub(super) async fn reserve_reader(&mut self) -> Result<()> {
        let opens = self
            .cell
            .as_ref()
            .is_some_and(|cell| cell.readers_open() == 0 && cell.has_published_view());
        if !opens {
            return Ok(());
        }
        let need = u32::try_from(self.ctx.fds_per_reader).unwrap_or(u32::MAX);
        let permits = self.ctx.fd_permits.clone();
        let more = match permits.clone().try_acquire_many_owned(need) {
            Ok(more) => more,
            Err(_) => {
                let wait = std::time::Duration::from_millis(self.ctx.activation_wait_ms_max);
                let room = &self.ctx.room;
                let cell_id = &self.cell_id;
                let ask = || {
                    let _ = room.try_send(cell_id.clone());
                };
                ask();
                match crate::node::wait_asking_again(wait, permits.acquire_many_owned(need), ask)
                    .await
                {
                    Some(more) => more,
                    None => {
                        return Err(Error::ResourceExhausted {
                            what: "fds_max (descriptors for a Cell's reader)",
                            retry_after_ms: self.ctx.retry_after_ms,
                        })
                    }
                }
            }
        };
        self.charge.fds.merge(more);
        Ok(())
    }

    pub(super) async fn on_query(
        &mut self,
        name: String,
        args: Value,
        min_txid: Option<Txid>,
        reply: Reply<Queried>,
    ) {
        if let Err(error) = self.migrate().await {
            reply.send(Err(error));
            return;
        }
        let min_txid = match (min_txid, self.queries_from_txid) {
            (min, Txid::ZERO) => min,
            (min, ready) => Some(min.unwrap_or(Txid::ZERO).max(ready)),
        };
        match min_txid {
            Some(min) if min > self.published_txid() => {
                let executed = self
                    .cell
                    .as_ref()
                    .map_or(Txid::ZERO, |cell| cell.position().txid);
                if min > executed || self.waiters.len() >= self.ctx.query_waiters_max {
                    reply.send(Err(Error::ReceiptNotReached {
                        txid: min,
                        waited_ms: 0,
                    }));
                    return;
                }
                self.park_query(min, name, args, reply);
            }
            _ if !self.cell.as_ref().is_some_and(Cell::has_published_view) => {
                // No reader holds the published state while a group is
                // pending (readers open on demand): answer once the group
                // is confirmed, and keep a reader from the next group on.
                if let Some(cell) = self.cell.as_mut() {
                    cell.want_view();
                }
                if self.waiters.len() >= self.ctx.query_waiters_max {
                    reply.send(Err(Error::ResourceExhausted {
                        what: "queries waiting on a cell",
                        retry_after_ms: self.ctx.retry_after_ms,
                    }));
                    return;
                }
                let next = self.published_txid() + 1;
                self.park_query(next, name, args, reply);
            }
            _ => {
                let answer = self.run_query(name, args).await;
                reply.send(answer);
            }
        }
    }

    /// The value and its TXID come from one engine call
    /// ([`Cell::query_with_position`]), so they name the same state.
    ///
    /// A query the Cell's recent queries say is short ([`inline`]: the
    /// same bounds as a group of one command) runs on the actor's task,
    /// any other on the blocking pool.
    ///
    /// [`inline`]: super::inline
    pub(super) async fn run_query(&mut self, name: String, args: Value) -> Result<Queried> {
        self.reserve_reader().await?;
        // The engine's own measure of the payload (no JSON written).
        let bytes =
            usize::try_from(cellfleet_cell::payload_bytes(&name, &args)).unwrap_or(usize::MAX);
        // A query that opens the Cell's reader (files, a schema parse)
        // runs on the pool, and its time says nothing of the next one's.
        let opens_reader = self
            .cell
            .as_ref()
            .is_none_or(|cell| cell.readers_open() == 0);
        let inline = !opens_reader && self.ctx.inline.runs_inline(1, bytes, self.query_estimate);
        let answered = match inline.then(|| self.query_inline(&name, &args)) {
            Some(InlineQuery::Answered(out)) => Some(out),
            Some(InlineQuery::Lost) => None,
            Some(InlineQuery::StoppedShort) | None => {
                self.query_on_pool(name, args, !opens_reader).await
            }
        };
        match answered {
            Some(Ok(answer)) => Ok(Queried {
                receipt: self.receipt(answer.position.txid),
                value: answer.value,
            }),
            Some(Err(error)) => Err(Error::from(error)),
            None => Err(Error::Closed("the cell engine was lost".into())),
        }
    }

    /// Runs a query on the actor's task within `inline_steps_max`
    /// VM steps; one that needs more stops short (queries write nothing)
    /// and is left for the pool.
    fn query_inline(&mut self, name: &str, args: &Value) -> InlineQuery {
        let steps = self.ctx.inline_steps_max;
        let ran = self.with_cell_inline(|cell| {
            let engine = std::time::Instant::now();
            let out = cell.query_within(name, args, steps);
            (out, engine.elapsed())
        });
        let Some((out, engine)) = ran else {
            return InlineQuery::Lost;
        };
        let out = match out {
            Ok(None) => return InlineQuery::StoppedShort,
            Ok(Some(answer)) => Ok(answer),
            Err(error) => Err(error),
        };
        self.ctx
            .metrics
            .queries_inline_total
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.query_estimate = Some(super::inline::next_estimate(self.query_estimate, engine));
        InlineQuery::Answered(out)
    }

    /// Runs a query on the blocking pool with the full step budget;
    /// `measure`: its engine time becomes the Cell's query estimate.
    /// `None` if the engine was lost.
    async fn query_on_pool(
        &mut self,
        name: String,
        args: Value,
        measure: bool,
    ) -> Option<cellfleet_cell::Result<cellfleet_cell::QueryAnswer>> {
        let ran = self
            .with_cell(move |cell| {
                let engine = std::time::Instant::now();
                let out = cell.query_with_position(&name, &args);
                (out, engine.elapsed())
            })
            .await;
        ran.map(|(out, engine)| {
            // A query that failed measured what it did before failing
            // (over its step bound, say): it still counts.
            if measure {
                self.query_estimate =
                    Some(super::inline::next_estimate(self.query_estimate, engine));
            }
            out
        })
    }

    /// Keeps a query until `min_txid` is published (or its wait bound
    /// passes).
    pub(super) fn park_query(
        &mut self,
        min_txid: Txid,
        name: String,
        args: Value,
        reply: Reply<Queried>,
    ) {
        let deadline = tokio::time::Instant::now()
            + std::time::Duration::from_millis(self.ctx.query_wait_ms_max);
        self.waiters.push(QueryWaiter {
            min_txid,
            name,
            args,
            reply,
            deadline,
        });
    }

    pub(super) fn expire_waiters(&mut self) {
        let now = tokio::time::Instant::now();
        let wait_ms = self.ctx.query_wait_ms_max;
        let (expired, kept): (Vec<_>, Vec<_>) =
            self.waiters.drain(..).partition(|w| w.deadline <= now);
        self.waiters = kept;
        for waiter in expired {
            waiter.reply.send(Err(Error::ReceiptNotReached {
                txid: waiter.min_txid,
                waited_ms: wait_ms,
            }));
        }
    }

    pub(super) async fn serve_waiters(&mut self) {
        let published = self.published_txid();
        self.ctx.watches.acknowledged(&self.cell_id, published);
        let (ready, kept): (Vec<_>, Vec<_>) = self
            .waiters
            .drain(..)
            .partition(|w| w.min_txid <= published);
        self.waiters = kept;
        for mut waiter in ready {
            if !self.cell.as_ref().is_some_and(Cell::has_published_view) {
                // Confirmed, but the next group (executed before anyone
                // asked) pinned no reader: wait for that one too.
                if let Some(cell) = self.cell.as_mut() {
                    cell.want_view();
                }
                waiter.min_txid = published + 1;
                self.waiters.push(waiter);
                continue;
            }
            let answer = self.run_query(waiter.name, waiter.args).await;
            waiter.reply.send(answer);
        }
    }

    pub(super) async fn resolve(
        &mut self,
        id: CommandId,
        expires_at_ms: Option<i64>,
    ) -> Result<Resolution> {
        if self.held.iter().any(|h| h.result.id == id)
            || self.batch.iter().any(|q| q.command.id == id)
            || self.inflight.iter().any(|f| f.ids.contains(&id))
        {
            return Ok(Resolution::Unknown);
        }
        if let Some(cell) = self.cell.as_mut().filter(|cell| !cell.has_published_view()) {
            // Nothing reads the published ledger while a group is pending:
            // not known yet; the next group keeps a reader for the retry.
            cell.want_view();
            return Ok(Resolution::Unknown);
        }
        self.reserve_reader().await?;
        let found = self
            .with_cell(move |cell| cell.published_outcome(&id))
            .await
            .ok_or_else(|| Error::Closed("the cell engine was lost".into()))??;
        if let Some((txid, outcome)) = found {
            return Ok(Resolution::Committed {
                receipt: self.receipt(txid),
                outcome,
            });
        }
        let now = i64::try_from(self.ctx.clock.now_wall_ms()).unwrap_or(i64::MAX);
        Ok(missing_from_ledger(
            expires_at_ms,
            self.ctx.skew_margin_ms,
            now,
        ))
    }
}

/// What a query on the actor's task came to.
enum InlineQuery {
    /// The engine answered (or refused) it.
    Answered(cellfleet_cell::Result<cellfleet_cell::QueryAnswer>),
    /// It needed more than the task's step budget: run it on the pool.
    StoppedShort,
    /// The engine panicked: the actor must stop.
    Lost,
}
