//! Cell-mode publication: one root CAS per group (run in its own task, oldest first), and compaction of the root's chain so a CAS never walks it past its bound.

use super::*;

impl Actor {
    /// A prepared compaction usable on the current root, if one is ready
    /// (or, when the chain is at its hard bound, once it is).
    pub(super) async fn ready_compaction(&mut self) -> Option<(LtxRef, Arc<Vec<u8>>)> {
        let must_wait = self.root.record.chain.len() >= hard_chain_bound(self.ctx.chain_files_max);
        let ready = self.compaction.as_ref()?.is_finished() || must_wait;
        if !ready {
            return None;
        }
        let handle = self.compaction.take()?;
        let (compacted, bytes) = match handle.await {
            Ok(Ok(prepared)) => prepared,
            Ok(Err(failure)) => {
                tracing::warn!(cell = %self.cell_id, ?failure, "compaction failed; will retry");
                return None;
            }
            Err(error) => {
                tracing::warn!(cell = %self.cell_id, %error, "compaction task failed");
                return None;
            }
        };
        let boundary = self.root.record.chain.iter().any(|file| {
            file.max_txid == compacted.max_txid
                && file.post_apply_checksum == compacted.post_apply_checksum
        });
        boundary.then_some((compacted, bytes))
    }

    pub(super) async fn try_start_cas(&mut self) {
        if self.cas.is_some() || self.failed.is_some() {
            return;
        }
        if self.inflight.front().is_none_or(|f| f.upload.is_none()) {
            return;
        }
        let at_bound = self.root.record.chain.len() >= hard_chain_bound(self.ctx.chain_files_max);
        if at_bound && self.compaction.is_none() {
            self.maybe_prepare_compaction().await;
        }
        let mut compaction = self.ready_compaction().await;
        if at_bound && compaction.is_none() && self.failed.is_none() {
            // The merge did not shrink or an upload failed: one more try,
            // of the other form (a merge is followed by a snapshot).
            self.maybe_prepare_compaction().await;
            compaction = self.ready_compaction().await;
        }
        if self.failed.is_some() {
            return;
        }
        if at_bound && compaction.is_none() {
            // One more delta would walk the chain into the root's hard
            // limit, after which no publication could ever succeed. Nothing
            // was written for the held groups: they are not committed, and
            // the next activation compacts first.
            self.fail(
                "the chain is at its bound and no compaction could be prepared".into(),
                FailKind::NotCommitted,
            )
            .await;
            return;
        }
        let Some(front) = self.inflight.front_mut() else {
            return;
        };
        let upload = front.upload.take().expect("checked above");
        let publisher = self.ctx.publisher.clone();
        let metrics = self.ctx.metrics.clone();
        let base = self.root.clone();
        let epoch = self.epoch;
        // Spawned: a CAS must never be cut off half-way by a dropped future.
        self.cas = Some(tokio::spawn(async move {
            let delta = match upload.await {
                Ok(Ok(delta)) => delta,
                Ok(Err(failure)) => {
                    return CasDone {
                        result: Err(failure),
                        compaction,
                    }
                }
                Err(error) => {
                    return CasDone {
                        result: Err(PublishFailure::NotCommitted(format!(
                            "upload task failed: {error}"
                        ))),
                        compaction,
                    }
                }
            };
            let started = Instant::now();
            let result = publisher
                .commit(PublishRequest {
                    base,
                    epoch,
                    delta: Some(delta),
                    compaction: compaction.as_ref().map(|(c, _)| c.clone()),
                    log: None,
                })
                .await;
            metrics
                .publication_cas_seconds
                .observe_duration(started.elapsed());
            CasDone { result, compaction }
        }));
    }

    pub(super) async fn on_cas(&mut self, done: CasDone) {
        let Some(front) = self.inflight.pop_front() else {
            return;
        };
        match done.result {
            Ok(root) => self.committed(front, root, done.compaction).await,
            Err(PublishFailure::CommittedThenFenced(reason)) => {
                self.release_held(front.txid);
                self.fenced("publication committed, then fenced", reason)
                    .await;
            }
            Err(PublishFailure::Fenced(reason)) => {
                self.fenced("publication fenced", reason).await;
            }
            Err(PublishFailure::NotCommitted(reason)) => {
                tracing::warn!(cell = %self.cell_id, %reason, "publication not committed");
                self.fail(reason, FailKind::NotCommitted).await;
            }
            Err(PublishFailure::Unknown(reason)) => {
                self.ctx
                    .metrics
                    .publications_unknown_total
                    .fetch_add(1, Ordering::Relaxed);
                tracing::error!(cell = %self.cell_id, %reason, "publication fate unknown");
                self.settle_held(
                    GroupEnd::UndecidedThenStopped { txid: front.txid },
                    &reason,
                    &format!("an earlier publication's fate is unknown: {reason}"),
                );
                self.fail(reason, FailKind::Unknown).await;
            }
        }
    }

    pub(super) async fn maybe_prepare_compaction(&mut self) {
        let chain = &self.root.record.chain;
        if self.compaction.is_some() || chain.len() < self.ctx.chain_files_max.max(2) {
            return;
        }
        let all_cached =
            self.chain_bytes.len() == chain.len() && self.chain_bytes.iter().all(Option::is_some);
        let publisher = self.ctx.publisher.clone();
        let cell_id = self.cell_id.clone();
        let epoch = self.epoch;
        if all_cached && !self.snapshot_compaction {
            let inputs: Vec<(Arc<Vec<u8>>, Position)> = chain
                .iter()
                .zip(&self.chain_bytes)
                .map(|(file, bytes)| {
                    (
                        bytes.clone().expect("all cached"),
                        Position {
                            txid: file.max_txid,
                            checksum: Checksum(file.post_apply_checksum),
                        },
                    )
                })
                .collect();
            self.compaction = Some(tokio::spawn(async move {
                let merged = tokio::task::spawn_blocking(move || {
                    let files: Vec<ChainFile<&[u8]>> = inputs
                        .iter()
                        .map(|(bytes, post)| ChainFile {
                            ltx: bytes.as_slice(),
                            post: *post,
                        })
                        .collect();
                    cellfleet_cell::compact(&files)
                })
                .await
                .map_err(|e| PublishFailure::NotCommitted(e.to_string()))?
                .map_err(|e| PublishFailure::NotCommitted(e.to_string()))?;
                if !merged.shrank {
                    return Err(PublishFailure::NotCommitted("merge does not shrink".into()));
                }
                let file = LtxFile::new(merged.ltx, &merged.header, &merged.trailer, merged.post);
                let bytes = file.bytes.clone();
                Ok((publisher.upload(&cell_id, epoch, file).await?, bytes))
            }));
            // Next time, a merge that did not shrink falls back to a snapshot.
            self.snapshot_compaction = true;
            return;
        }
        self.snapshot_compaction = false;
        if self.log_mode() && self.acked_txid != self.root.record.txid {
            // The engine's state is past the root's chain: its snapshot
            // would sit on no chain boundary. At the bound the checkpoint
            // itself is a snapshot (maybe_checkpoint).
            return;
        }
        let now_ms = i64::try_from(self.ctx.clock.now_wall_ms()).unwrap_or(i64::MAX);
        let snapshot = match self.with_cell(move |cell| cell.snapshot(now_ms)).await {
            Some(Ok(snapshot)) => snapshot,
            Some(Err(error)) => {
                tracing::warn!(cell = %self.cell_id, %error, "snapshot for compaction failed");
                return;
            }
            None => {
                self.fail("the cell engine was lost".into(), FailKind::NotCommitted)
                    .await;
                return;
            }
        };
        let file = LtxFile::new(
            snapshot.ltx,
            &snapshot.header,
            &snapshot.trailer,
            snapshot.post,
        );
        let bytes = file.bytes.clone();
        self.compaction = Some(tokio::spawn(async move {
            Ok((publisher.upload(&cell_id, epoch, file).await?, bytes))
        }));
    }

    /// Waits for a CAS in flight while the actor is failing, and answers
    /// its group by its fate.
    pub(super) async fn settle_abandoned_cas(&mut self, cas: JoinHandle<CasDone>) {
        let Some(front) = self.inflight.pop_front() else {
            return;
        };
        match cas.await {
            Ok(CasDone {
                result: Ok(root), ..
            }) => {
                self.root = root;
                self.release_held(front.txid);
            }
            Ok(CasDone {
                result: Err(PublishFailure::CommittedThenFenced(_)),
                ..
            }) => self.release_held(front.txid),
            Ok(CasDone {
                result: Err(PublishFailure::Unknown(reason)),
                ..
            }) => {
                self.answer_unknown(front.txid, &reason);
            }
            Ok(CasDone { result: Err(_), .. }) => {}
            Err(error) => {
                self.answer_unknown(front.txid, &format!("publication task failed: {error}"));
            }
        }
    }
}
