//! How the actor ends: fenced, failed (answering what it held), closing its Cell, and its exit with the mailbox's last messages answered.

use super::*;

/// How an actor closes its engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Close {
    /// WAL checkpointed into the file, `-wal` removed: the Cell
    /// is its database file alone (a passivation with nothing parked).
    Tidy,
    /// WAL checkpointed, the empty `-wal` kept for a reopen soon (a
    /// passivation that parks records; [`cellfleet_cell::tidy_closed`]
    /// removes it after the node's checkpoint).
    KeepSidecars,
    /// Just dropped: the files are about to be discarded, or the Cell
    /// failed and its next activation verifies them anyway.
    Drop,
}

pub(super) fn answer_closed(msg: Msg, reason: &str) {
    match msg {
        Msg::Execute { reply, .. } => reply.send(Err(Error::Closed(reason.into()))),
        Msg::Query { reply, .. } => reply.send(Err(Error::Closed(reason.into()))),
        Msg::Resolve { reply, .. } => reply.send(Err(Error::Closed(reason.into()))),
        Msg::Describe { .. } => {}
        Msg::Stop { done, .. } => {
            if let Some(done) = done {
                let _ = done.send(Ok(()));
            }
        }
    }
}

impl Actor {
    /// Another owner holds the root: counts the fence, says `what`, and
    /// fails the actor as fenced.
    pub(super) async fn fenced(&mut self, what: &'static str, reason: String) {
        self.ctx
            .metrics
            .fences_total
            .fetch_add(1, Ordering::Relaxed);
        tracing::warn!(cell = %self.cell_id, epoch = %self.epoch, %reason, "{what}");
        self.fail(reason, FailKind::Fenced).await;
    }

    /// Ends the actor's work after a failure: every held reply not already
    /// answered gets `NotCommitted`, queued commands get `Closed` (they
    /// never ran), pending publications are aborted.
    pub(super) async fn fail(&mut self, reason: String, kind: FailKind) {
        if self.failed.is_some() {
            return;
        }
        self.failed = Some(reason.clone());
        if let Some(cas) = self.cas.take() {
            // Never abandoned blind: the CAS in flight decides its own
            // group's replies before the rest are answered.
            self.settle_abandoned_cas(cas).await;
        }
        // In log mode a held group's segment may still land (and then
        // counts): never call it not committed.
        let may_land = self.log_mode();
        self.settle_held(
            GroupEnd::Stopped { may_land },
            &format!("{reason}; the group's segment may still land"),
            &reason,
        );
        if let Some(wait) = self.logwait.take() {
            wait.abort();
        }
        if let Some(ckpt) = self.ckpt.take() {
            ckpt.abort();
        }
        if !self.unckpt.is_empty() {
            self.ctx
                .metrics
                .checkpoint_lag_records
                .fetch_sub(self.unckpt.len() as i64, Ordering::Relaxed);
            self.unckpt.take();
        }
        for queued in std::mem::take(&mut self.batch) {
            queued.reply.send(Err(Error::Closed(reason.clone())));
        }
        for waiter in std::mem::take(&mut self.waiters) {
            waiter.reply.send(Err(Error::Closed(reason.clone())));
        }
        for inflight in std::mem::take(&mut self.inflight) {
            if let Some(upload) = inflight.upload {
                upload.abort();
            }
        }
        if let Some(compaction) = self.compaction.take() {
            compaction.abort();
        }
        let pending = self
            .cell
            .as_ref()
            .is_some_and(|c| c.pending_txid().is_some());
        if pending {
            let _ = self.with_cell(|cell| cell.abort()).await;
        }
        if kind != FailKind::NotCommitted {
            self.close_cell(Close::Drop).await;
            self.ctx.activator.discard(&self.cell_id);
        }
    }

    /// Closes the engine as `how` says.
    pub(super) async fn close_cell(&mut self, how: Close) {
        if let Some(cell) = self.cell.take() {
            let _ = tokio::task::spawn_blocking(move || match how {
                Close::Tidy => cell.close(),
                Close::KeepSidecars => cell.close_keeping_sidecars(),
                Close::Drop => drop(cell),
            })
            .await;
        }
    }

    /// Closes the engine and answers whatever is left; returns how it ended.
    pub(super) async fn finish(mut self) -> Exit {
        self.rx.close();
        while let Ok(msg) = self.rx.try_recv() {
            answer_closed(msg, "the cell actor stopped");
        }
        // Only a passivated Cell keeps its files (a drained one is
        // released and discarded, a fenced or failed one discarded).
        let passivates = self.failed.is_none()
            && !matches!(self.stopping, Some(StopHow::Drain | StopHow::Fence(_)));
        // A Cell that leaves records with the node is likely reopened
        // soon; the node tidies its sidecars once it checkpoints them.
        let how = match (passivates, self.unckpt.is_empty()) {
            (false, _) => Close::Drop,
            (true, true) => Close::Tidy,
            (true, false) => Close::KeepSidecars,
        };
        self.close_cell(how).await;
        let exit = match (&self.failed, &self.stopping) {
            (Some(_), _) | (None, Some(StopHow::Fence(_))) => (Exit::Gone, Ok(())),
            (None, Some(StopHow::Drain)) => {
                match self
                    .ctx
                    .publisher
                    .release(self.root.clone(), self.epoch)
                    .await
                {
                    Ok(_) => {
                        self.ctx.activator.discard(&self.cell_id);
                        (Exit::Gone, Ok(()))
                    }
                    Err(failure) => (
                        Exit::Gone,
                        Err(Error::NotCommitted {
                            reason: format!("release of cell {} failed: {failure:?}", self.cell_id),
                        }),
                    ),
                }
            }
            (None, _) => {
                self.ctx
                    .metrics
                    .passivations_total
                    .fetch_add(1, Ordering::Relaxed);
                let tail = self.unckpt.take();
                let due = self.ckpt_due.unwrap_or_else(|| {
                    tokio::time::Instant::now() + self.ctx.log_settings.idle_of(&self.cell_id)
                });
                (
                    Exit::Parked(Box::new(ParkedCell {
                        root: self.root.clone(),
                        tail,
                        due,
                    })),
                    Ok(()),
                )
            }
        };
        for done in self.stop_done.drain(..) {
            let _ = done.send(exit.1.clone());
        }
        exit.0
    }
}
