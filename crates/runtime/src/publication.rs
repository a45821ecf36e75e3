//! The publication pipeline's store side: upload an LTX file (create-only), then one fenced CAS of the root.
//!
//! Durability ordering, kept here and nowhere else:
//! 1. every LTX file a proposal names is uploaded (create-only; the key
//!    carries the SHA-256 of the bytes, so a resend of the same bytes is
//!    harmless and a `412` on upload means the identical file is there);
//! 2. only then is the root replaced, by one CAS on the ETag read or
//!    written last — the delta and, when the chain passed its bound, the
//!    privately prepared compaction go into that same CAS;
//! 3. the caller releases replies only after [`Publisher::commit`]
//!    returned the new root.
//!
//! Fates of the CAS: success; `412` by another owner →
//! [`PublishFailure::Fenced`] (the root provably lacks the group); a lost
//! reply is reconciled by re-reading the root (the authority's
//! [`cellfleet_authority::reconcile`]): the exact proposal there →
//! committed; the root still at the base → the same write is sent again
//! (a timed-out PUT may still land, so that is never "not committed");
//! provably absent for good → [`PublishFailure::NotCommitted`]; committed
//! and then replaced by a later owner ([`cellfleet_authority::Error::CommittedThenFenced`])
//! → [`PublishFailure::CommittedThenFenced`]; else [`PublishFailure::Unknown`].
//!
//! [`Publisher`] is the interface the Cell actor sees, so node-level group
//! commit (DESIGN.md §9: one log append for many Cells, roots checkpointed
//! lazily) can replace [`StorePublisher`] without touching the actor.

use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use cellfleet_authority::{
    transition, CellId, Clock, Epoch, Holder, Layout, LogPointer, LtxRef, RootRecord, Roots, Txid,
    Versioned,
};
use cellfleet_store::{ObjectStore, PutCondition};
use sha2::{Digest, Sha256};

/// One LTX file to upload.
#[derive(Clone, Debug)]
pub struct LtxFile {
    /// The encoded file.
    pub bytes: Arc<Vec<u8>>,
    /// First TXID in the file (1 for a snapshot).
    pub min_txid: Txid,
    /// Last TXID in the file.
    pub max_txid: Txid,
    /// The file's own checksum (trailer).
    pub file_checksum: u64,
    /// The database's rolling checksum after applying it.
    pub post_apply_checksum: u64,
}

impl LtxFile {
    /// `ltx` with what a chain records of it: its TXID range (`header`),
    /// its own checksum (`trailer`) and the Cell's checksum after it
    /// (`post`).
    pub fn new(
        ltx: Vec<u8>,
        header: &cellfleet_cell::Header,
        trailer: &cellfleet_cell::Trailer,
        post: cellfleet_cell::Position,
    ) -> Self {
        LtxFile {
            bytes: Arc::new(ltx),
            min_txid: header.min_txid,
            max_txid: header.max_txid,
            file_checksum: trailer.file_checksum.0,
            post_apply_checksum: post.checksum.0,
        }
    }
}

/// Log mode: a record acknowledged in the node log and not yet in its
/// Cell's root chain (an open Cell's, or a parked one's).
#[derive(Clone, Debug)]
pub(crate) struct Unckpt {
    /// The record (one group's LTX delta).
    pub file: LtxFile,
    /// The lane slot of the segment that holds it.
    pub seq: u64,
}

/// An open Cell's [`Unckpt`] records, oldest first, with their bytes
/// summed as records come and go: the checkpoint trigger reads the sum
/// after every record, and summing the list each time cost 2.5% of a
/// node's samples at 1,000 streams.
#[derive(Debug, Default)]
pub(crate) struct UnckptRecords {
    records: Vec<Unckpt>,
    bytes: u64,
}

impl UnckptRecords {
    pub fn new(records: Vec<Unckpt>) -> Self {
        let bytes = records.iter().map(Unckpt::bytes).sum();
        UnckptRecords { records, bytes }
    }

    pub fn push(&mut self, record: Unckpt) {
        self.bytes += record.bytes();
        self.records.push(record);
    }

    /// Drops the oldest `n` (a checkpoint covered them).
    pub fn drop_oldest(&mut self, n: usize) {
        let n = n.min(self.records.len());
        self.bytes -= self.records[..n].iter().map(Unckpt::bytes).sum::<u64>();
        self.records.drain(..n);
    }

    /// Takes every record, leaving none.
    pub fn take(&mut self) -> Vec<Unckpt> {
        self.bytes = 0;
        std::mem::take(&mut self.records)
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    pub fn last(&self) -> Option<&Unckpt> {
        self.records.last()
    }

    pub fn iter(&self) -> std::slice::Iter<'_, Unckpt> {
        self.records.iter()
    }
}

impl Unckpt {
    fn bytes(&self) -> u64 {
        self.file.bytes.len() as u64
    }
}

/// A passivated Cell as its actor left it: the root it wrote last and, in
/// log mode, the acknowledged records past that root (safe in this
/// session's lane; the local file is at the last one's position). The one
/// shape a parked Cell takes from its actor, through the node, into its
/// next activation.
#[derive(Debug)]
pub(crate) struct ParkedCell {
    pub root: Versioned<RootRecord>,
    pub tail: Vec<Unckpt>,
    /// When the tail is due for its checkpoint (`checkpoint_idle_ms` after
    /// its last record, as if the Cell had stayed open).
    pub due: tokio::time::Instant,
}

/// A root replacement: `delta` (uploaded) on top of `base`, with an
/// optional `compaction` (uploaded) of `base`'s chain up to a file boundary.
#[derive(Clone, Debug)]
pub struct PublishRequest {
    /// The root the actor last wrote or read (precondition of the CAS).
    pub base: Versioned<RootRecord>,
    /// The actor's epoch.
    pub epoch: Epoch,
    /// The group's file (or, in log mode, a checkpoint's merged records);
    /// `None` when only the log pointer moves.
    pub delta: Option<LtxRef>,
    /// A compaction to publish in the same CAS.
    pub compaction: Option<LtxRef>,
    /// The log pointer the root carries afterwards (always `None` in cell
    /// mode).
    pub log: Option<LogPointer>,
}

/// Why a publication did not (provably) commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PublishFailure {
    /// Another owner holds the root: the group is not in it. Close the Cell.
    Fenced(String),
    /// The group is provably not in the root (store refused, upload failed,
    /// root changed).
    NotCommitted(String),
    /// The group may or may not be in the root.
    Unknown(String),
    /// The group committed, but a later owner has replaced the root since:
    /// the outcomes are durable, the Cell must close.
    CommittedThenFenced(String),
}

/// The store side of publication.
#[async_trait]
pub trait Publisher: Send + Sync + Debug {
    /// Uploads one LTX file create-only; returns the chain entry naming it.
    async fn upload(
        &self,
        cell: &CellId,
        epoch: Epoch,
        file: LtxFile,
    ) -> Result<LtxRef, PublishFailure>;

    /// Replaces the root by one CAS (see the module docs for the fates).
    async fn commit(
        &self,
        request: PublishRequest,
    ) -> Result<Versioned<RootRecord>, PublishFailure>;

    /// Releases the root (owner = none) on drain.
    async fn release(
        &self,
        base: Versioned<RootRecord>,
        epoch: Epoch,
    ) -> Result<Versioned<RootRecord>, PublishFailure>;
}

/// Publishes to the object store through the authority's [`Roots`].
#[derive(Debug)]
pub struct StorePublisher {
    store: Arc<dyn ObjectStore>,
    roots: Roots,
    layout: Layout,
    clock: Arc<dyn Clock>,
    me: Holder,
    upload_attempts_max: usize,
    /// Deletes LTX files a landed CAS dropped from the chain, after the
    /// minimum age (DESIGN.md §9 rule 5).
    ltx_gc: Option<(std::time::Duration, Arc<crate::metrics::Metrics>)>,
}

impl StorePublisher {
    /// A publisher for session `me`.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        roots: Roots,
        clock: Arc<dyn Clock>,
        me: Holder,
        upload_attempts_max: usize,
    ) -> Self {
        let layout = roots.layout().clone();
        Self {
            store,
            roots,
            layout,
            clock,
            me,
            upload_attempts_max: upload_attempts_max.max(1),
            ltx_gc: None,
        }
    }

    /// Deletes the LTX files a landed CAS drops from a chain (a checkpoint
    /// or compaction replaced them) once `min_age` has passed.
    pub fn with_ltx_gc(
        mut self,
        min_age: std::time::Duration,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> Self {
        self.ltx_gc = Some((min_age, metrics));
        self
    }

    /// After `base` was replaced by `next` (the CAS landed): the files of
    /// `base`'s chain that `next`'s chain no longer names are reachable
    /// from no root (a Cell's files are named by its own root only, and a
    /// replaced range never comes back: the chain only moves forward), so
    /// they are deleted after the minimum age. A crash before then leaves
    /// them behind (nothing reads them; a sweep is not built yet).
    fn collect_dropped(&self, base: &RootRecord, next: &RootRecord) {
        let Some((min_age, metrics)) = &self.ltx_gc else {
            return;
        };
        let dropped: Vec<String> = base
            .chain
            .iter()
            .filter(|old| next.chain.iter().all(|new| new.key != old.key))
            .map(|old| old.key.clone())
            .collect();
        if dropped.is_empty() {
            return;
        }
        let (store, min_age, metrics) = (self.store.clone(), *min_age, metrics.clone());
        tokio::spawn(async move {
            tokio::time::sleep(min_age).await;
            for key in dropped {
                match store.delete(&key).await {
                    Ok(()) => {
                        metrics
                            .gc_ltx_deleted_total
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    Err(error) if error.is_not_found() => {}
                    Err(error) => {
                        metrics
                            .gc_failures_total
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        tracing::warn!(%key, %error, "deleting a replaced LTX file failed; left behind");
                    }
                }
            }
        });
    }

    fn settle(
        &self,
        result: cellfleet_authority::Result<Versioned<RootRecord>>,
    ) -> Result<Versioned<RootRecord>, PublishFailure> {
        result.map_err(|error| {
            if let cellfleet_authority::Error::CommittedThenFenced { .. } = error {
                return PublishFailure::CommittedThenFenced(error.to_string());
            }
            if error.is_fenced() {
                return PublishFailure::Fenced(error.to_string());
            }
            if error.is_ambiguous() {
                return PublishFailure::Unknown(error.to_string());
            }
            PublishFailure::NotCommitted(error.to_string())
        })
    }
}

/// One LTX file for consecutive deltas of one Cell: the file itself when
/// there is one, else their merge.
pub(crate) async fn merge_files(
    files: Vec<LtxFile>,
) -> std::result::Result<LtxFile, PublishFailure> {
    if files.len() == 1 {
        return Ok(files.into_iter().next().expect("one file"));
    }
    tokio::task::spawn_blocking(move || {
        let chain: Vec<cellfleet_cell::ChainFile<&[u8]>> = files
            .iter()
            .map(|f| cellfleet_cell::ChainFile {
                ltx: f.bytes.as_slice(),
                post: cellfleet_cell::Position {
                    txid: f.max_txid,
                    checksum: cellfleet_cell::Checksum(f.post_apply_checksum),
                },
            })
            .collect();
        let merged = cellfleet_cell::compact(&chain)
            .map_err(|e| PublishFailure::NotCommitted(format!("merging records: {e}")))?;
        Ok(LtxFile::new(
            merged.ltx,
            &merged.header,
            &merged.trailer,
            merged.post,
        ))
    })
    .await
    .map_err(|e| PublishFailure::NotCommitted(format!("merge task failed: {e}")))?
}

/// Lowercase hex SHA-256 of `bytes` (the digest in LTX keys).
pub fn content_digest(bytes: &[u8]) -> String {
    cellfleet_cell::hex::encode(&Sha256::digest(bytes))
}

#[async_trait]
impl Publisher for StorePublisher {
    async fn upload(
        &self,
        cell: &CellId,
        epoch: Epoch,
        file: LtxFile,
    ) -> Result<LtxRef, PublishFailure> {
        let digest = content_digest(&file.bytes);
        let key = self
            .layout
            .ltx_key(cell, epoch, file.min_txid, file.max_txid, &digest);
        let body = Bytes::from(file.bytes.as_ref().clone());
        let mut last = String::new();
        for _ in 0..self.upload_attempts_max {
            match self
                .store
                .put(&key, body.clone(), PutCondition::IfNoneMatch)
                .await
            {
                // A 412 on a content-addressed key: the identical bytes are
                // there already (an earlier attempt whose reply was lost).
                Ok(_) | Err(cellfleet_store::Error::PreconditionFailed { .. }) => {
                    return Ok(LtxRef {
                        key,
                        min_txid: file.min_txid,
                        max_txid: file.max_txid,
                        size: file.bytes.len() as u64,
                        file_checksum: file.file_checksum,
                        post_apply_checksum: file.post_apply_checksum,
                    });
                }
                // Resending the same bytes to the same key is harmless.
                Err(e)
                    if e.is_retryable() || matches!(e, cellfleet_store::Error::Conflict { .. }) =>
                {
                    last = e.to_string();
                }
                Err(e) => {
                    return Err(PublishFailure::NotCommitted(format!(
                        "upload of {key}: {e}"
                    )))
                }
            }
        }
        Err(PublishFailure::NotCommitted(format!(
            "upload of {key} failed {} times: {last}",
            self.upload_attempts_max
        )))
    }

    async fn commit(
        &self,
        request: PublishRequest,
    ) -> Result<Versioned<RootRecord>, PublishFailure> {
        let proposal = transition::propose(
            &request.base.record,
            &self.me,
            request.epoch,
            request.delta,
            request.compaction,
            request.log,
            self.clock.now_wall_ms(),
        )
        .map_err(|e| {
            if e.is_fenced() {
                PublishFailure::Fenced(e.to_string())
            } else {
                PublishFailure::NotCommitted(e.to_string())
            }
        })?;
        let next = self.settle(self.roots.replace(&request.base, proposal).await)?;
        self.collect_dropped(&request.base.record, &next.record);
        Ok(next)
    }

    async fn release(
        &self,
        base: Versioned<RootRecord>,
        epoch: Epoch,
    ) -> Result<Versioned<RootRecord>, PublishFailure> {
        let proposal = transition::release(&base.record, &self.me, epoch, self.clock.now_wall_ms())
            .map_err(|e| PublishFailure::Fenced(e.to_string()))?;
        self.settle(self.roots.replace(&base, proposal).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellfleet_authority::{NewCell, NodeId, SessionId};
    use proptest::prelude::*;

    proptest! {
        /// The running sum is the sum of the records held, whatever
        /// pushes, checkpoints and takes come in whatever order.
        #[test]
        fn unckpt_records_keep_their_bytes_summed(
            ops in proptest::collection::vec((0..3u8, 0..400usize), 1..60)
        ) {
            let mut records = UnckptRecords::new(Vec::new());
            for (op, n) in ops {
                match op {
                    0 => records.push(Unckpt {
                        file: LtxFile {
                            bytes: Arc::new(vec![0; n]),
                            min_txid: Txid(1),
                            max_txid: Txid(1),
                            file_checksum: 0,
                            post_apply_checksum: 0,
                        },
                        seq: 0,
                    }),
                    1 => records.drop_oldest(n % 5),
                    _ => {
                        let before = records.bytes();
                        let taken = records.take();
                        prop_assert_eq!(records.bytes(), 0);
                        prop_assert_eq!(UnckptRecords::new(taken).bytes(), before);
                    }
                }
                let sum: u64 = records.iter().map(|u| u.file.bytes.len() as u64).sum();
                prop_assert_eq!(records.bytes(), sum);
            }
        }
    }

    fn propose(
        base: &RootRecord,
        me: &Holder,
        epoch: Epoch,
        delta: LtxRef,
        compaction: Option<LtxRef>,
        now_ms: u64,
    ) -> cellfleet_authority::Result<RootRecord> {
        transition::propose(base, me, epoch, Some(delta), compaction, None, now_ms)
    }

    fn me() -> Holder {
        Holder {
            node: NodeId::new("n1").unwrap(),
            session: SessionId::from_u128(1),
        }
    }

    fn file(cell: &CellId, min: u64, max: u64, post: u64) -> LtxRef {
        LtxRef {
            key: format!("p/cells/{cell}/ltx/0000000000000001/{min:016x}-{max:016x}-ab.ltx"),
            min_txid: Txid(min),
            max_txid: Txid(max),
            size: 10,
            file_checksum: 1,
            post_apply_checksum: post,
        }
    }

    fn root_with_chain(len: u64) -> RootRecord {
        let cell = CellId::for_kind_key("kv", b"k");
        let new = NewCell {
            cell_id: cell.clone(),
            kind: "kv".into(),
            key: None,
            page_size: 4096,
            schema_version: 0,
        };
        let mut root = transition::create(&new, &me(), 1);
        for txid in 1..=len {
            root = propose(
                &root,
                &me(),
                Epoch::FIRST,
                file(&cell, txid, txid, 0x8000 + txid),
                None,
                1,
            )
            .unwrap();
        }
        root
    }

    #[test]
    fn deltas_append_and_advance_the_revision_once() {
        let root = root_with_chain(3);
        assert_eq!((root.txid.0, root.chain.len(), root.revision), (3, 3, 4));
        assert_eq!(root.checksum, 0x8003);
    }

    #[test]
    fn a_snapshot_replaces_the_chain() {
        let root = root_with_chain(3);
        let snapshot = file(&root.cell_id, 1, 4, 0x9004);
        let next = propose(&root, &me(), Epoch::FIRST, snapshot, None, 2).unwrap();
        assert_eq!((next.txid.0, next.chain.len(), next.revision), (4, 1, 5));
    }

    #[test]
    fn a_compaction_rides_with_the_next_delta() {
        let root = root_with_chain(3);
        let compacted = file(&root.cell_id, 1, 3, 0x8003);
        let delta = file(&root.cell_id, 4, 4, 0x8004);
        let next = propose(&root, &me(), Epoch::FIRST, delta, Some(compacted), 2).unwrap();
        assert_eq!(next.chain.len(), 2);
        assert_eq!((next.chain[0].min_txid.0, next.chain[0].max_txid.0), (1, 3));
        assert_eq!((next.txid.0, next.revision), (4, root.revision + 1));
        // A compaction that changed the state is refused.
        let wrong = file(&root.cell_id, 1, 3, 0x1);
        assert!(propose(
            &root,
            &me(),
            Epoch::FIRST,
            file(&root.cell_id, 4, 4, 5),
            Some(wrong),
            2
        )
        .is_err());
    }

    #[test]
    fn another_session_is_fenced() {
        let root = root_with_chain(1);
        let other = Holder {
            node: NodeId::new("n2").unwrap(),
            session: SessionId::from_u128(2),
        };
        let error = propose(
            &root,
            &other,
            Epoch::FIRST,
            file(&root.cell_id, 2, 2, 9),
            None,
            1,
        )
        .unwrap_err();
        assert!(error.is_fenced());
        let error = propose(
            &root,
            &other,
            Epoch::FIRST,
            file(&root.cell_id, 1, 2, 9),
            None,
            1,
        )
        .unwrap_err();
        assert!(error.is_fenced());
    }
}
