//! The thin executor of node leases: acquire at start, renew by CAS, detect replacement, retire on drain.
//!
//! The pure rules live in [`crate::lease`]; this performs the reads and
//! conditional writes. Each write's local deadline counts from the monotonic
//! instant the write was *sent* (taken just before the request).

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use cellfleet_store::{ETag, ObjectStore, PutCondition};

use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::ids::{NodeId, SessionId};
use crate::layout::Layout;
use crate::lease::{
    acquire_record, judge_renewal, local_deadline, renewal, retirement, session_liveness,
    Endpoints, LeaseConfig, LeaseRecord, Liveness, RenewalVerdict,
};
use crate::roots::Versioned;

/// Attempts of one acquire or renew before giving up on contention.
const CAS_ATTEMPTS_MAX: usize = 3;
/// Most lease records [`NodeLeases::live_nodes`] will read.
pub const NODES_MAX: usize = 10_000;

/// A lease this process holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldLease {
    /// The record as last written.
    pub record: LeaseRecord,
    /// Its ETag (precondition of the next renewal).
    pub etag: ETag,
    /// Local monotonic deadline: serve without bucket reads only before it.
    pub deadline: Instant,
}

impl HeldLease {
    /// This session.
    pub fn session(&self) -> SessionId {
        self.record.session_id
    }

    /// Whether the holder may still serve from its lease at `now`.
    pub fn is_valid_at(&self, now: Instant) -> bool {
        now < self.deadline
    }
}

/// Node lease operations for one cluster prefix.
#[derive(Debug, Clone)]
pub struct NodeLeases {
    store: Arc<dyn ObjectStore>,
    layout: Layout,
    clock: Arc<dyn Clock>,
    config: LeaseConfig,
}

impl NodeLeases {
    /// Lease operations with `config` (validated).
    pub fn new(
        store: Arc<dyn ObjectStore>,
        layout: Layout,
        clock: Arc<dyn Clock>,
        config: LeaseConfig,
    ) -> Result<Self> {
        config.validate().map_err(|e| Error::invalid(e.0))?;
        Ok(Self {
            store,
            layout,
            clock,
            config,
        })
    }

    /// The timing in force.
    pub fn config(&self) -> &LeaseConfig {
        &self.config
    }

    /// Whether `held` still lets this process serve without bucket reads.
    pub fn is_serving(&self, held: &HeldLease) -> bool {
        held.is_valid_at(self.clock.now_monotonic())
    }

    /// Reads a node's lease record.
    pub async fn read(&self, node: &NodeId) -> Result<Option<Versioned<LeaseRecord>>> {
        let key = self.layout.node_lease_key(node);
        let object = match self.store.get(&key).await {
            Ok(object) => object,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(Error::store(e)),
        };
        let record = LeaseRecord::decode(&object.body).map_err(|e| Error::Corrupt {
            key: key.clone(),
            reason: e.0,
        })?;
        if record.node_id != *node {
            return Err(Error::Corrupt {
                key,
                reason: format!("the lease names node {}", record.node_id),
            });
        }
        Ok(Some(Versioned {
            record,
            etag: object.etag,
        }))
    }

    /// Starts a new session for `node`: writes a fresh record (replacing an
    /// earlier session's, whose live window is carried forward as
    /// `predecessor_live_until_ms`; the runtime must not serve Cells that
    /// earlier session owned before then).
    pub async fn acquire(&self, node: NodeId, endpoints: Endpoints) -> Result<HeldLease> {
        self.acquire_as(node, endpoints, false).await
    }

    /// [`Self::acquire`], recording whether the node is ingress-only
    /// (serves and forwards, never a placement target).
    pub async fn acquire_as(
        &self,
        node: NodeId,
        endpoints: Endpoints,
        ingress_only: bool,
    ) -> Result<HeldLease> {
        let session = SessionId::random();
        let mut last_error = None;
        for _ in 0..CAS_ATTEMPTS_MAX {
            let current = self.read(&node).await?;
            let mut proposal = acquire_record(
                current.as_ref().map(|c| &c.record),
                node.clone(),
                session,
                endpoints.clone(),
                self.clock.now_wall_ms(),
                &self.config,
            );
            proposal.ingress_only = ingress_only;
            let condition = match &current {
                None => PutCondition::IfNoneMatch,
                Some(current) => PutCondition::IfMatch(current.etag.clone()),
            };
            match self.write(&proposal, condition).await {
                Ok(held) => return Ok(held),
                Err(WriteFailure::Refused(error)) => last_error = Some(error),
                Err(WriteFailure::Ambiguous(sent, error)) => {
                    match self.settle(&proposal, sent).await? {
                        Some(held) => return Ok(held),
                        None => last_error = Some(error),
                    }
                }
                Err(WriteFailure::Failed(error)) => return Err(error),
            }
        }
        Err(last_error.unwrap_or_else(|| Error::Conflict {
            reason: "lease acquisition kept conflicting".to_owned(),
        }))
    }

    /// Renews `held`. [`Error::Fenced`] if another session replaced it (stop
    /// serving at once); [`Error::Unavailable`] if the store failed (keep
    /// serving only until `held.deadline`, and retry).
    pub async fn renew(&self, held: &HeldLease) -> Result<HeldLease> {
        let mut base = held.clone();
        for _ in 0..CAS_ATTEMPTS_MAX {
            let proposal = renewal(&base.record, self.clock.now_wall_ms(), &self.config);
            let condition = PutCondition::IfMatch(base.etag.clone());
            let sent = match self.write(&proposal, condition).await {
                Ok(renewed) => return Ok(renewed),
                Err(WriteFailure::Failed(error)) => return Err(error),
                Err(WriteFailure::Refused(_)) => None,
                Err(WriteFailure::Ambiguous(sent, _)) => Some(sent),
            };
            let observed = self.read_for_reconcile(&proposal.node_id).await?;
            match judge_renewal(&proposal, observed.as_ref().map(|o| &o.record)) {
                RenewalVerdict::Committed => {
                    let observed = observed.expect("committed means present");
                    return Ok(HeldLease {
                        record: observed.record,
                        etag: observed.etag,
                        deadline: local_deadline(
                            sent.unwrap_or_else(|| self.clock.now_monotonic()),
                            &self.config,
                        ),
                    });
                }
                RenewalVerdict::Replaced => {
                    return Err(Error::fenced(format!(
                        "node {} lease was replaced by session {:?}",
                        proposal.node_id,
                        observed.map(|o| o.record.session_id)
                    )))
                }
                RenewalVerdict::NotCommitted => {
                    // Our session, other bytes: an earlier ambiguous write of
                    // ours landed. Renew on top of it.
                    let observed = observed.expect("not committed means present");
                    base = HeldLease {
                        record: observed.record,
                        etag: observed.etag,
                        deadline: base.deadline,
                    };
                }
            }
        }
        Err(Error::Conflict {
            reason: "lease renewal kept conflicting".to_owned(),
        })
    }

    /// Retires `held` on drain (after every Cell was released). Others may
    /// take this node's Cells at once afterwards.
    pub async fn retire(&self, held: &HeldLease) -> Result<()> {
        let proposal = retirement(&held.record, self.clock.now_wall_ms());
        match self
            .write(&proposal, PutCondition::IfMatch(held.etag.clone()))
            .await
        {
            Ok(_) => Ok(()),
            Err(WriteFailure::Failed(error)) => Err(error),
            Err(WriteFailure::Refused(_) | WriteFailure::Ambiguous(..)) => {
                let observed = self.read_for_reconcile(&proposal.node_id).await?;
                match judge_renewal(&proposal, observed.as_ref().map(|o| &o.record)) {
                    RenewalVerdict::Committed => Ok(()),
                    RenewalVerdict::Replaced => Err(Error::fenced(
                        "the lease was replaced by another session before retiring",
                    )),
                    RenewalVerdict::NotCommitted => Err(Error::Conflict {
                        reason: "the lease changed before retiring".to_owned(),
                    }),
                }
            }
        }
    }

    /// Lease records of nodes whose current session is live now, by node id
    /// (for placement). Unreadable or corrupt records count as not live.
    pub async fn live_nodes(&self) -> Result<Vec<LeaseRecord>> {
        let entries =
            cellfleet_store::list_all(self.store.as_ref(), &self.layout.nodes_prefix(), NODES_MAX)
                .await
                .map_err(Error::store)?;
        let now_ms = self.clock.now_wall_ms();
        let mut live = Vec::new();
        for entry in entries {
            let Some(node) = self.layout.parse_node_lease_key(&entry.key) else {
                continue;
            };
            match self.read(&node).await {
                Ok(Some(lease)) => {
                    let liveness = session_liveness(
                        Some(&lease.record),
                        lease.record.session_id,
                        now_ms,
                        self.config.drift_margin_ms,
                    );
                    if matches!(liveness, Liveness::Live { .. }) {
                        live.push(lease.record);
                    }
                }
                Ok(None) => {}
                Err(Error::Corrupt { key, reason }) => {
                    tracing::warn!(%key, %reason, "skipping corrupt lease record");
                }
                Err(error) => return Err(error),
            }
        }
        Ok(live)
    }

    async fn read_for_reconcile(&self, node: &NodeId) -> Result<Option<Versioned<LeaseRecord>>> {
        self.read(node).await.map_err(|error| match error {
            Error::Unavailable { source, .. } => Error::Unavailable {
                source,
                ambiguous: true,
            },
            other => other,
        })
    }

    /// After an ambiguous acquire: committed if the record is our proposal.
    async fn settle(&self, proposal: &LeaseRecord, sent: Instant) -> Result<Option<HeldLease>> {
        let observed = self.read_for_reconcile(&proposal.node_id).await?;
        Ok(observed
            .filter(|observed| observed.record == *proposal)
            .map(|observed| HeldLease {
                record: observed.record,
                etag: observed.etag,
                deadline: local_deadline(sent, &self.config),
            }))
    }

    async fn write(
        &self,
        proposal: &LeaseRecord,
        condition: PutCondition,
    ) -> Result<HeldLease, WriteFailure> {
        let bytes = proposal
            .encode()
            .map_err(|e| WriteFailure::Failed(Error::invalid(e.0)))?;
        let key = self.layout.node_lease_key(&proposal.node_id);
        let sent = self.clock.now_monotonic();
        match self.store.put(&key, Bytes::from(bytes), condition).await {
            Ok(etag) => Ok(HeldLease {
                record: proposal.clone(),
                etag,
                deadline: local_deadline(sent, &self.config),
            }),
            Err(
                e @ (cellfleet_store::Error::PreconditionFailed { .. }
                | cellfleet_store::Error::Conflict { .. }),
            ) => Err(WriteFailure::Refused(Error::Conflict {
                reason: e.to_string(),
            })),
            Err(e) if e.may_have_applied() => Err(WriteFailure::Ambiguous(
                sent,
                Error::Unavailable {
                    source: e,
                    ambiguous: true,
                },
            )),
            Err(e) => Err(WriteFailure::Failed(Error::store(e))),
        }
    }
}

enum WriteFailure {
    /// 412/409: not applied; someone else wrote.
    Refused(Error),
    /// May have been applied; sent at this instant.
    Ambiguous(Instant, Error),
    /// Failed for good (or transiently, not applied).
    Failed(Error),
}
