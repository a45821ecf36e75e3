//! Running a group: taking it from the mailbox, executing it on the blocking pool, handing it to its publication, and releasing replies in commit order.

use super::*;

/// Whether a full-disk warning is due at `now_ms`: at most one every 10 s
/// for the whole node, since every retried command hits the same full disk.
pub(super) fn disk_full_warning_due(now_ms: u64) -> bool {
    use std::sync::atomic::Ordering;
    let last = DISK_FULL_WARNED_MS.load(Ordering::Relaxed);
    now_ms.saturating_sub(last) >= 10_000
        && DISK_FULL_WARNED_MS
            .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
}

impl Actor {
    pub(super) fn take_group(&mut self) -> Vec<Queued> {
        let mut group = Vec::new();
        let mut bytes = 0;
        while let Some(next) = self.batch.front() {
            let over_bytes = !group.is_empty() && bytes + next.bytes > self.ctx.group_bytes_max;
            if group.len() >= self.ctx.group_commands_max || over_bytes {
                break;
            }
            bytes += next.bytes;
            group.push(self.batch.pop_front().expect("front exists"));
        }
        group
    }

    pub(super) async fn try_execute(&mut self) {
        if self.batch.is_empty() || self.failed.is_some() {
            return;
        }
        let can_execute = self.cell.as_ref().is_some_and(Cell::can_execute);
        if !can_execute {
            return;
        }
        let group = self.take_group();
        let commands: Vec<Command> = group.iter().map(|q| q.command.clone()).collect();
        let now_ms = i64::try_from(self.ctx.clock.now_wall_ms()).unwrap_or(i64::MAX);
        let started = Instant::now();
        let count = commands.len();
        let bytes: usize = group.iter().map(|q| q.bytes).sum();
        let inline = self
            .ctx
            .inline
            .runs_inline(count, bytes, self.execute_per_command);
        // On the actor's task each command's kind code gets
        // `inline_steps_max` VM steps; a group stopped there left nothing
        // behind and runs again on the pool with the full budget.
        let ran_inline = if inline {
            let steps = self.ctx.inline_steps_max;
            let ran = self.with_cell_inline(|cell| {
                let engine = Instant::now();
                let out = cell.execute_within(&commands, now_ms, steps);
                (out, engine.elapsed())
            });
            match ran {
                // The engine was lost.
                None => Some(None),
                // Stopped short (`Ok(None)`) goes to the pool; anything
                // else ran here.
                Some((out, engine)) => out.transpose().map(|out| {
                    self.ctx
                        .metrics
                        .groups_inline_total
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    Some((out, engine))
                }),
            }
        } else {
            None
        };
        let executed = match ran_inline {
            Some(executed) => executed,
            None => {
                self.with_cell(move |cell: &mut Cell| {
                    let engine = Instant::now();
                    let out = cell.execute(&commands, now_ms);
                    (out, engine.elapsed())
                })
                .await
            }
        };
        self.ctx
            .metrics
            .publication_execute_seconds
            .observe_duration(started.elapsed());
        let executed = executed.map(|(out, engine)| {
            // A failed group measures nothing: the next may redo what it
            // did not (a migration), so it goes to the pool.
            self.execute_per_command = match out {
                Ok(_) => Some(inline::next_estimate(
                    self.execute_per_command,
                    inline::per_command(engine, count),
                )),
                Err(_) => None,
            };
            out
        });
        let result = match executed {
            None => {
                for queued in group {
                    queued.reply.send(Err(Error::NotCommitted {
                        reason: "the cell engine was lost".into(),
                    }));
                }
                self.fail("the cell engine was lost".into(), FailKind::NotCommitted)
                    .await;
                return;
            }
            Some(Err(error)) => {
                self.refuse_group(group, error).await;
                return;
            }
            Some(Ok(result)) => result,
        };
        let commands = group.len();
        let ids: Vec<CommandId> = group.iter().map(|q| q.command.id).collect();
        self.answer_or_hold(group, result.results);
        if let Some(publication) = result.publication {
            if std::mem::take(&mut self.schema_due) {
                // This group applied the schema first: nothing before it
                // has the kind's tables.
                self.queries_from_txid = publication.txid;
            }
            self.start_publication(publication, commands, ids);
        }
    }

    /// Applies a deferred schema as a group of its own, for a query that
    /// came before any command. An engine that cannot run a group now
    /// (one is pending, or it failed) leaves it due; the query then finds
    /// `ResourceExhausted` or the engine's error.
    pub(super) async fn migrate(&mut self) -> Result<()> {
        if !self.schema_due {
            return Ok(());
        }
        if !self.cell.as_ref().is_some_and(Cell::can_execute) {
            return Err(Error::ResourceExhausted {
                what: "a new Cell's schema (its first group is not executed yet)",
                retry_after_ms: self.ctx.retry_after_ms,
            });
        }
        let now_ms = i64::try_from(self.ctx.clock.now_wall_ms()).unwrap_or(i64::MAX);
        match self.with_cell(move |cell| cell.migrate(now_ms)).await {
            None => {
                self.fail("the cell engine was lost".into(), FailKind::NotCommitted)
                    .await;
                Err(Error::Closed("the cell engine was lost".into()))
            }
            Some(Err(error)) => Err(Error::from(error)),
            Some(Ok(publication)) => {
                self.schema_due = false;
                if let Some(publication) = publication {
                    self.queries_from_txid = publication.txid;
                    self.start_publication(publication, 0, Vec::new());
                }
                Ok(())
            }
        }
    }

    /// A group the engine refused before running any of it: every command
    /// is answered NOT_COMMITTED (a full data directory says how to go on),
    /// and the actor fails if the engine is poisoned.
    async fn refuse_group(&mut self, group: Vec<Queued>, error: cellfleet_cell::Error) {
        // Nothing ran: the state is intact unless the engine says
        // it is poisoned.
        let poisoned = matches!(error, cellfleet_cell::Error::Poisoned)
            || self
                .cell
                .as_ref()
                .is_some_and(|c| !c.can_execute() && c.pending_txid().is_none());
        let reason = if error.is_disk_full() {
            if disk_full_warning_due(self.ctx.clock.now_wall_ms()) {
                tracing::warn!(
                    cell = %self.cell_id,
                    %error,
                    "the data directory is full: commands to the Cells here fail \
                     (not committed) until space is freed (logged at most every 10 s)"
                );
            }
            format!(
                "{error}: this node's data directory is out of space; free space \
                 there (nothing of this group was committed: send the command again)"
            )
        } else {
            error.to_string()
        };
        for queued in group {
            queued.reply.send(Err(Error::NotCommitted {
                reason: reason.clone(),
            }));
        }
        if poisoned {
            self.fail(error.to_string(), FailKind::NotCommitted).await;
        }
    }

    /// Answers each command of an executed group whose outcome depends on
    /// nothing unpublished (a duplicate or a refusal); holds the others
    /// until the TXID they depend on is published.
    fn answer_or_hold(&mut self, group: Vec<Queued>, results: Vec<CommandResult>) {
        for (queued, result) in group.into_iter().zip(results) {
            match result.depends_on_txid {
                None => {
                    let txid = result.txid.unwrap_or(self.published_txid());
                    queued.reply.send(Ok(Executed {
                        receipt: self.receipt(txid),
                        outcome: result.outcome,
                        duplicate: result.duplicate,
                    }));
                }
                Some(txid) => self.held.push(Held {
                    txid,
                    result,
                    reply: queued.reply,
                }),
            }
        }
    }

    pub(super) fn start_publication(
        &mut self,
        publication: Publication,
        commands: usize,
        ids: Vec<CommandId>,
    ) {
        let file = LtxFile::new(
            publication.ltx,
            &publication.header,
            &publication.trailer,
            publication.post,
        );
        let bytes = file.bytes.clone();
        if let Some(log) = &self.ctx.log {
            // Log mode: the group goes into the next segment of its lane.
            let slot = log.submit(Record {
                cell_id: self.cell_id.clone(),
                epoch: self.epoch,
                min_txid: file.min_txid,
                max_txid: file.max_txid,
                file_checksum: file.file_checksum,
                post_apply_checksum: file.post_apply_checksum,
                command_ids: ids.iter().map(|id| id.0).collect(),
                bytes: bytes.clone(),
            });
            self.inflight.push_back(InFlight {
                txid: publication.txid,
                upload: None,
                bytes,
                started: Instant::now(),
                commands,
                ids,
                file,
                slot: Some(slot),
                seq: None,
                answered: false,
            });
            return;
        }
        let publisher = self.ctx.publisher.clone();
        let cell = self.cell_id.clone();
        let epoch = self.epoch;
        let metrics = self.ctx.metrics.clone();
        let upload_file = file.clone();
        let upload = tokio::spawn(async move {
            let started = Instant::now();
            let uploaded = publisher.upload(&cell, epoch, upload_file).await;
            metrics
                .publication_upload_seconds
                .observe_duration(started.elapsed());
            uploaded
        });
        self.inflight.push_back(InFlight {
            txid: publication.txid,
            upload: Some(upload),
            bytes,
            started: Instant::now(),
            commands,
            ids,
            file,
            slot: None,
            seq: None,
            answered: false,
        });
    }

    pub(super) async fn committed(
        &mut self,
        front: InFlight,
        root: Versioned<RootRecord>,
        compaction: Option<(LtxRef, Arc<Vec<u8>>)>,
    ) {
        front.count_publication(&self.ctx.metrics);
        let metrics = &self.ctx.metrics;
        if compaction.is_some() {
            metrics.compactions_total.fetch_add(1, Ordering::Relaxed);
        }
        self.chain_bytes = cache_for(
            &self.root.record,
            &self.chain_bytes,
            &root.record,
            &[
                Some(front.bytes.clone()),
                compaction.as_ref().map(|(_, b)| b.clone()),
            ],
            &[
                root.record.chain.last().map(|f| f.key.clone()),
                compaction.as_ref().map(|(c, _)| c.key.clone()),
            ],
            self.ctx.chain_cache_bytes_max,
        );
        self.root = root;
        let txid = front.txid;
        let confirmed = self.confirm_engine(txid).await;
        // The root holds the group now: its replies are true whatever the
        // local engine does next.
        self.release_held(txid);
        if !self.confirmed(confirmed).await {
            return;
        }
        self.serve_waiters().await;
        self.maybe_prepare_compaction().await;
    }

    /// Whether the engine confirmed a durable group; else the actor fails
    /// (the replies are out already: the group is durable either way).
    pub(super) async fn confirmed<T>(
        &mut self,
        confirmed: Option<cellfleet_cell::Result<T>>,
    ) -> bool {
        match confirmed {
            Some(Ok(_)) => true,
            Some(Err(error)) => {
                self.fail(format!("confirm failed: {error}"), FailKind::NotCommitted)
                    .await;
                false
            }
            None => {
                self.fail("the cell engine was lost".into(), FailKind::NotCommitted)
                    .await;
                false
            }
        }
    }

    /// Answers the held replies `end` decides ([`replies::answer`]):
    /// released ones get their outcome, the others the error it names
    /// (`unknown` or `not_committed` as their reason); the rest stay held.
    pub(super) fn settle_held(&mut self, end: GroupEnd, unknown: &str, not_committed: &str) {
        for held in std::mem::take(&mut self.held) {
            match replies::answer(end, held.txid) {
                Answer::Hold => self.held.push(held),
                Answer::Release => {
                    let receipt = self.receipt(held.result.txid.unwrap_or(held.txid));
                    held.reply.send(Ok(Executed {
                        receipt,
                        outcome: held.result.outcome,
                        duplicate: held.result.duplicate,
                    }));
                }
                Answer::Unknown => held.reply.send(Err(Error::Unknown {
                    reason: unknown.to_owned(),
                })),
                Answer::NotCommitted => held.reply.send(Err(Error::NotCommitted {
                    reason: not_committed.to_owned(),
                })),
            }
        }
    }

    /// Releases held replies published at or before `txid`.
    pub(super) fn release_held(&mut self, txid: Txid) {
        self.settle_held(GroupEnd::Published { txid }, "", "");
    }

    /// Answers UNKNOWN to the held replies of the group at `txid`; later
    /// groups stay held.
    pub(super) fn answer_unknown(&mut self, txid: Txid, reason: &str) {
        self.settle_held(GroupEnd::Undecided { txid }, reason, "");
    }
}
