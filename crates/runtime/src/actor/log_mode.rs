//! The Cell actor's log-mode jobs (DESIGN.md §9): waiting for its lane's verdict on each group, then checkpointing the acknowledged records into the root.
//!
//! A group handed to the lane waits for the verdict on its slot
//! ([`Actor::try_wait_log`], [`Actor::on_log`]): acknowledged releases its
//! replies and confirms the engine ([`Actor::committed_log`]); a seal
//! answers not committed and closes the Cell; undecided past the reply
//! bound answers UNKNOWN and keeps waiting. Acknowledged records past the
//! root are merged into one LTX file and CASed into the root with the
//! pointer advanced when a trigger fires ([`Actor::maybe_checkpoint`]); an
//! idle Cell moves only its pointer ([`Actor::move_idle_pointer`]); a
//! landed checkpoint tells the lane's collector what it still holds
//! ([`Actor::update_hold`]).

use super::*;

impl Actor {
    /// Log mode: waits for the oldest in-flight group's slot to be decided
    /// (groups of one Cell go into its lane in order, so their fates come
    /// in order too).
    pub(super) fn try_wait_log(&mut self) {
        if self.logwait.is_some() || self.failed.is_some() {
            return;
        }
        let Some(log) = self.ctx.log.clone() else {
            return;
        };
        let Some(front) = self.inflight.front_mut() else {
            return;
        };
        let writer = log.lane_of(&self.cell_id).writer().clone();
        // Replies wait up to the bound; after it they are answered UNKNOWN
        // and the group is still waited for, as long as it takes.
        let bound = if front.answered {
            std::time::Duration::from_secs(24 * 3600)
        } else {
            std::time::Duration::from_millis(self.ctx.log_settings.reply_wait_ms)
        };
        let known = front.seq;
        let mut slot = front.slot.take();
        self.logwait = Some(tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + bound;
            let seq = match (known, slot.as_mut()) {
                (Some(seq), _) => seq,
                (None, Some(rx)) => match tokio::time::timeout_at(deadline, rx).await {
                    Ok(Ok(Some(seq))) => seq,
                    // The lane was sealed (or the node stopped) before the
                    // group was written: it is in no segment.
                    Ok(Ok(None)) | Ok(Err(_)) => {
                        return LogDone {
                            seq: None,
                            slot: None,
                            fate: Some(GroupFate::NotCommitted),
                        }
                    }
                    Err(_) => {
                        return LogDone {
                            seq: None,
                            slot,
                            fate: None,
                        }
                    }
                },
                (None, None) => {
                    return LogDone {
                        seq: None,
                        slot: None,
                        fate: Some(GroupFate::NotCommitted),
                    }
                }
            };
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let fate = writer.fate(seq, left).await;
            LogDone {
                seq: Some(seq),
                slot: None,
                fate,
            }
        }));
    }

    pub(super) async fn on_log(&mut self, done: LogDone) {
        match done.fate {
            Some(GroupFate::Acknowledged) => {
                let Some(front) = self.inflight.pop_front() else {
                    return;
                };
                let seq = done.seq.expect("an acknowledged group has a slot");
                self.committed_log(front, seq).await;
            }
            Some(GroupFate::NotCommitted) => {
                // The lane ended at a seal at or before this group's slot:
                // this group and every later one never count.
                self.ctx
                    .metrics
                    .fences_total
                    .fetch_add(1, Ordering::Relaxed);
                let reason = "this node's log lane was sealed by a successor".to_owned();
                tracing::warn!(cell = %self.cell_id, epoch = %self.epoch, "log lane sealed");
                self.settle_held(GroupEnd::Stopped { may_land: false }, "", &reason);
                self.fail(reason, FailKind::Fenced).await;
            }
            Some(GroupFate::Waiting) | None => {
                let Some(front) = self.inflight.front_mut() else {
                    return;
                };
                front.seq = front.seq.or(done.seq);
                if front.slot.is_none() {
                    front.slot = done.slot;
                }
                if !front.answered {
                    front.answered = true;
                    let txid = front.txid;
                    self.ctx
                        .metrics
                        .publications_unknown_total
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(cell = %self.cell_id, txid = txid.0, "segment not decided within the reply bound; answering unknown and still waiting");
                    self.answer_unknown(txid, "the node log's segment was not written within the reply bound; resolve the command later");
                }
            }
        }
    }

    pub(super) async fn committed_log(&mut self, front: InFlight, seq: u64) {
        front.count_publication(&self.ctx.metrics);
        let metrics = &self.ctx.metrics;
        metrics
            .checkpoint_lag_records
            .fetch_add(1, Ordering::Relaxed);
        let txid = front.txid;
        let confirmed = self.confirm_engine(txid).await;
        // The log holds the group now: its replies are true whatever the
        // local engine does next.
        self.acked_txid = txid;
        self.unckpt.push(Unckpt {
            file: front.file,
            seq,
        });
        // Idle means no new record for that long: the deadline moves with
        // every record.
        self.ckpt_due =
            Some(tokio::time::Instant::now() + self.ctx.log_settings.idle_of(&self.cell_id));
        self.release_held(txid);
        if !self.confirmed(confirmed).await {
            return;
        }
        self.serve_waiters().await;
    }

    /// Log mode: merges the acknowledged records past the root into one
    /// LTX file and CASes the root (chain + file, pointer advanced), when a
    /// trigger fired or `force` (stopping, idle).
    pub(super) async fn maybe_checkpoint(&mut self, force: bool) {
        if self.ckpt.is_some() || self.failed.is_some() {
            return;
        }
        if self.unckpt.is_empty() {
            self.move_idle_pointer();
            return;
        }
        let Some(log) = self.ctx.log.clone() else {
            return;
        };
        let lane = log.lane_of(&self.cell_id);
        if !force && !self.checkpoint_due(lane) {
            return;
        }
        let last_seq = self.unckpt.last().map_or(0, |u| u.seq);
        // Every record past this checkpoint lands in a later slot than the
        // last one it covers (a Cell's groups go into its lane in order),
        // or, with nothing in flight, at or after the lane's next slot.
        let pointer = if self.inflight.is_empty() {
            lane.pointer_here()
        } else {
            LogPointer {
                lane: lane.writer().lane().clone(),
                from_seq: last_seq,
            }
        };
        let at_bound = self.root.record.chain.len() >= hard_chain_bound(self.ctx.chain_files_max);
        if at_bound && self.compaction.is_none() {
            self.maybe_prepare_compaction().await;
        }
        let compaction = self.ready_compaction().await;
        if self.failed.is_some() {
            return;
        }
        let covered = self.unckpt.len();
        let files: Vec<LtxFile> = if at_bound && compaction.is_none() {
            // No merge of the chain is ready: a snapshot of the acknowledged
            // state is the checkpoint instead, and replaces the whole chain.
            match self.snapshot_at_acked().await {
                Some(snapshot) => vec![snapshot],
                None => return,
            }
        } else {
            self.unckpt.iter().map(|u| u.file.clone()).collect()
        };
        self.ckpt_due = None;
        self.spawn_checkpoint(files, covered, compaction, pointer);
    }

    /// Whether a checkpoint trigger fired: records or bytes past the root,
    /// or the replay budget (a successor reads `lane` from the root's
    /// pointer on, so the pointer may not fall too far behind the lane).
    fn checkpoint_due(&self, lane: &crate::log::Lane) -> bool {
        let settings = &self.ctx.log_settings;
        let bytes = self.unckpt.bytes();
        let behind = self.root.record.log.as_ref().map_or(0, |pointer| {
            lane.writer()
                .verdict()
                .borrow()
                .acked_below
                .saturating_sub(pointer.from_seq)
        });
        self.unckpt.len() >= settings.checkpoint_records.max(1)
            || bytes >= settings.checkpoint_bytes
            || behind > settings.replay_budget_of(&self.cell_id)
    }

    /// A snapshot of the acknowledged state, for a checkpoint that must
    /// replace the whole chain; `None` (the checkpoint postponed by the
    /// idle time, or the actor failed) if there is none to take.
    async fn snapshot_at_acked(&mut self) -> Option<LtxFile> {
        let now_ms = i64::try_from(self.ctx.clock.now_wall_ms()).unwrap_or(i64::MAX);
        let postponed = match self.with_cell(move |cell| cell.snapshot(now_ms)).await {
            Some(Ok(snapshot)) if snapshot.post.txid == self.acked_txid => {
                return Some(LtxFile::new(
                    snapshot.ltx,
                    &snapshot.header,
                    &snapshot.trailer,
                    snapshot.post,
                ));
            }
            Some(Ok(snapshot)) => {
                tracing::warn!(cell = %self.cell_id, snapshot = snapshot.post.txid.0, acked = self.acked_txid.0, "snapshot not at the acknowledged state; checkpoint postponed");
                true
            }
            Some(Err(error)) => {
                tracing::warn!(cell = %self.cell_id, %error, "snapshot for a checkpoint failed; postponed");
                true
            }
            None => false,
        };
        if postponed {
            self.ckpt_due =
                Some(tokio::time::Instant::now() + self.ctx.log_settings.idle_of(&self.cell_id));
        } else {
            self.fail("the cell engine was lost".into(), FailKind::NotCommitted)
                .await;
        }
        None
    }

    /// Starts the checkpoint's task: merge `files` (the `covered` records,
    /// or a snapshot), upload the result and CAS the root with it, the
    /// ready `compaction` and `pointer`, under the node's bound on
    /// checkpoints in flight.
    fn spawn_checkpoint(
        &mut self,
        files: Vec<LtxFile>,
        covered: usize,
        compaction: Option<(LtxRef, Arc<Vec<u8>>)>,
        pointer: LogPointer,
    ) {
        let publisher = self.ctx.publisher.clone();
        let base = self.root.clone();
        let epoch = self.epoch;
        let cell = self.cell_id.clone();
        let permits = self.ctx.checkpoint_permits.clone();
        self.ckpt = Some(tokio::spawn(async move {
            // The node's bound on checkpoints in flight; never closed.
            let _permit = permits.acquire_owned().await;
            let uploaded = async {
                let merged = merge_files(files).await?;
                let bytes = merged.bytes.clone();
                Ok::<_, PublishFailure>((publisher.upload(&cell, epoch, merged).await?, bytes))
            }
            .await;
            let (delta, bytes) = match uploaded {
                Ok(uploaded) => uploaded,
                Err(failure) => {
                    return CkDone {
                        result: Err(failure),
                        covered,
                        merged: None,
                        compaction,
                    }
                }
            };
            let result = publisher
                .commit(PublishRequest {
                    base,
                    epoch,
                    delta: Some(delta.clone()),
                    compaction: compaction.as_ref().map(|(c, _)| c.clone()),
                    log: Some(pointer),
                })
                .await;
            CkDone {
                result,
                covered,
                merged: Some((delta, bytes)),
                compaction,
            }
        }));
    }

    /// Log mode, nothing past the root: every `checkpoint_idle_ms`, if the
    /// lane has grown more than the replay budget past the root's pointer
    /// and nothing of this Cell is in flight, moves the pointer to the
    /// lane's head with a pointer-only CAS, so a successor's replay of an
    /// idle Cell stays bounded too.
    pub(super) fn move_idle_pointer(&mut self) {
        let (Some(log), Some(pointer)) = (self.ctx.log.clone(), self.root.record.log.clone())
        else {
            self.ckpt_due = None;
            return;
        };
        let now = tokio::time::Instant::now();
        if self.ckpt_due.is_some_and(|due| due > now) {
            return;
        }
        let settings = &self.ctx.log_settings;
        let lane = log.lane_of(&self.cell_id);
        let behind = lane
            .writer()
            .verdict()
            .borrow()
            .acked_below
            .saturating_sub(pointer.from_seq);
        if behind <= settings.replay_budget_of(&self.cell_id)
            || !self.inflight.is_empty()
            || self.stopping.is_some()
        {
            self.ckpt_due = Some(now + settings.idle_of(&self.cell_id));
            return;
        }
        self.ckpt_due = None;
        let publisher = self.ctx.publisher.clone();
        let request = PublishRequest {
            base: self.root.clone(),
            epoch: self.epoch,
            delta: None,
            compaction: None,
            log: Some(lane.pointer_here()),
        };
        let permits = self.ctx.checkpoint_permits.clone();
        self.ckpt = Some(tokio::spawn(async move {
            let _permit = permits.acquire_owned().await;
            CkDone {
                result: publisher.commit(request).await,
                covered: 0,
                merged: None,
                compaction: None,
            }
        }));
    }

    pub(super) async fn on_checkpoint(&mut self, done: CkDone) {
        match done.result {
            Ok(root) => {
                let metrics = &self.ctx.metrics;
                if done.covered > 0 {
                    metrics.checkpoints_total.fetch_add(1, Ordering::Relaxed);
                    metrics.checkpoint_records.observe(done.covered as f64);
                }
                metrics
                    .checkpoint_lag_records
                    .fetch_sub(done.covered as i64, Ordering::Relaxed);
                if done.compaction.is_some() {
                    metrics.compactions_total.fetch_add(1, Ordering::Relaxed);
                }
                self.chain_bytes = cache_for(
                    &self.root.record,
                    &self.chain_bytes,
                    &root.record,
                    &[
                        done.merged.as_ref().map(|(_, b)| b.clone()),
                        done.compaction.as_ref().map(|(_, b)| b.clone()),
                    ],
                    &[
                        done.merged.as_ref().map(|(c, _)| c.key.clone()),
                        done.compaction.as_ref().map(|(c, _)| c.key.clone()),
                    ],
                    self.ctx.chain_cache_bytes_max,
                );
                self.root = root;
                self.unckpt.drop_oldest(done.covered);
                self.ckpt_failures = 0;
                self.update_hold();
                if !self.unckpt.is_empty() {
                    self.ckpt_due = Some(
                        tokio::time::Instant::now() + self.ctx.log_settings.idle_of(&self.cell_id),
                    );
                }
                self.maybe_prepare_compaction().await;
            }
            Err(PublishFailure::Fenced(reason) | PublishFailure::CommittedThenFenced(reason)) => {
                self.fenced("checkpoint fenced", reason).await;
            }
            Err(PublishFailure::NotCommitted(reason)) => {
                // The records stay in the log (acknowledged and durable);
                // the checkpoint is tried again.
                self.ckpt_failures += 1;
                tracing::warn!(cell = %self.cell_id, %reason, failures = self.ckpt_failures, "checkpoint not committed; will retry");
                if self.stopping.is_some() && self.ckpt_failures >= CHECKPOINT_ATTEMPTS_AT_STOP {
                    // Stop without it: the next activation replays the
                    // records from this session's lane.
                    self.fail(
                        format!("checkpoint failed {} times: {reason}", self.ckpt_failures),
                        FailKind::NotCommitted,
                    )
                    .await;
                    return;
                }
                let backoff = 50u64 << self.ckpt_failures.min(6);
                self.ckpt_due =
                    Some(tokio::time::Instant::now() + std::time::Duration::from_millis(backoff));
            }
            Err(PublishFailure::Unknown(reason)) => {
                tracing::error!(cell = %self.cell_id, %reason, "checkpoint fate unknown");
                self.fail(reason, FailKind::Unknown).await;
            }
        }
    }

    /// Log mode, after a checkpoint that landed: tells the lane's collector
    /// where this Cell's records still past its root start — nowhere with
    /// none acknowledged past it and none in flight, else at the root's
    /// pointer (every such record lies at or after it).
    pub(super) fn update_hold(&self) {
        let Some(log) = &self.ctx.log else {
            return;
        };
        let lane = log.lane_of(&self.cell_id);
        let from = if self.unckpt.is_empty() && self.inflight.is_empty() {
            None
        } else {
            match &self.root.record.log {
                Some(pointer) if pointer.lane == *lane.writer().lane() => Some(pointer.from_seq),
                // Not this lane's pointer: keep whatever the lane holds.
                _ => return,
            }
        };
        lane.set_hold(&self.cell_id, from);
    }
}
