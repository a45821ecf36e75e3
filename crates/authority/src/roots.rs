//! The thin executor that performs root transitions by compare-and-swap and reconciles ambiguous outcomes.
//!
//! Ordering (the caller's duty, restated where it matters): the root is
//! replaced only after every LTX file it names has been uploaded
//! (create-only) and verified. [`Roots::replace`] validates the proposal
//! before writing and every root after reading.
//!
//! Outcomes of a CAS:
//! * success → the new root and ETag;
//! * 412/409 → re-read; if the exact proposal is there it committed (e.g. an
//!   earlier attempt's reply was lost), else [`Error::Fenced`] when the owner
//!   or epoch moved on, [`Error::Conflict`] otherwise;
//! * unknown outcome (timeout, lost reply) → re-read and [`reconcile`];
//!   the root still at the base (`NotYet`) is never "not committed", since
//!   a timed-out PUT may still be applied by the store: the same bytes are
//!   sent again under the same condition (at most [`RESENDS_MAX`] times),
//!   which either lands them or finds the root moved on (then a late copy
//!   can no longer match either). `Unknown`, a failed re-read, or resends
//!   used up is [`Error::Unavailable`] with `ambiguous: true`: report the
//!   fate as unknown, never replay. A proposal that committed and was then
//!   replaced by a later owner is [`Error::CommittedThenFenced`].
//!
//! Cancellation: a dropped `replace` future may leave the write applied or
//! not; callers that must know (publication) run it in a spawned task.

use std::sync::Arc;

use bytes::Bytes;
use cellfleet_store::{ETag, ObjectStore, PutCondition};

use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::ids::{CellId, NodeId};
use crate::layout::Layout;
use crate::lease::{session_liveness, LeaseRecord, Liveness};
use crate::reconcile::{reconcile, Reconciliation};

/// Times a root write whose outcome was unknown is sent again, unchanged,
/// while the root still shows its base (each resend is a new chance for a
/// store that has come back to answer; the write is idempotent while the
/// base holds).
pub const RESENDS_MAX: usize = 3;

/// What a re-read after an unknown outcome settled.
enum Settled {
    /// Committed: the root as stored.
    Done(Box<Versioned<RootRecord>>),
    /// Still the base: send the same write again (the attempt's error).
    NotYet(cellfleet_store::Error),
}
use crate::root::RootRecord;
use crate::transition::{self, Activation, Holder, NewCell};

/// A record and the ETag it was read or written with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versioned<T> {
    /// The record.
    pub record: T,
    /// Its ETag: the precondition of the next CAS.
    pub etag: ETag,
}

/// How [`Roots::activate`] ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Activated {
    /// This session owns the Cell: `how` says whether it created, adopted or
    /// took over the root.
    Owned {
        /// The root now owned (boxed: roots are large, the other variant small).
        root: Box<Versioned<RootRecord>>,
        /// Create, adopt or takeover.
        how: OwnedHow,
    },
    /// A live session owns it: route to `owner`.
    OwnerLive {
        /// The owner.
        owner: NodeId,
        /// Wall-clock ms until which it counts as live.
        until_ms: u64,
    },
}

/// How ownership was obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OwnedHow {
    /// The root was absent and this session created it (epoch 1).
    Created,
    /// The root already named this session.
    Adopted,
    /// This session took it over (epoch + 1).
    TookOver,
}

/// Reads and replaces authority roots.
#[derive(Debug, Clone)]
pub struct Roots {
    store: Arc<dyn ObjectStore>,
    layout: Layout,
    clock: Arc<dyn Clock>,
    margin_ms: u64,
}

impl Roots {
    /// Roots under `layout` in `store`; `margin_ms` is the lease drift margin
    /// used to judge owners' leases.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        layout: Layout,
        clock: Arc<dyn Clock>,
        margin_ms: u64,
    ) -> Self {
        Self {
            store,
            layout,
            clock,
            margin_ms,
        }
    }

    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Reads and validates a Cell's root; `None` if it has none.
    pub async fn read(&self, cell: &CellId) -> Result<Option<Versioned<RootRecord>>> {
        let key = self.layout.root_key(cell);
        let object = match self.store.get(&key).await {
            Ok(object) => object,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(Error::store(e)),
        };
        let record = RootRecord::decode(&object.body).map_err(|e| Error::Corrupt {
            key: key.clone(),
            reason: e.0,
        })?;
        if record.cell_id != *cell {
            return Err(Error::Corrupt {
                key,
                reason: format!("the root names cell {}", record.cell_id),
            });
        }
        Ok(Some(Versioned {
            record,
            etag: object.etag,
        }))
    }

    /// Creates a Cell's first root (create-only).
    pub async fn create(&self, proposal: RootRecord) -> Result<Versioned<RootRecord>> {
        self.write(None, proposal).await
    }

    /// Replaces `current` by `proposal` (If-Match on `current.etag`).
    /// `proposal.revision` must be `current.revision + 1`.
    pub async fn replace(
        &self,
        current: &Versioned<RootRecord>,
        proposal: RootRecord,
    ) -> Result<Versioned<RootRecord>> {
        if proposal.revision != current.record.revision.wrapping_add(1)
            || proposal.cell_id != current.record.cell_id
        {
            return Err(Error::invalid(
                "a replacement must be the same cell at the next revision",
            ));
        }
        self.write(Some(current), proposal).await
    }

    async fn write(
        &self,
        base: Option<&Versioned<RootRecord>>,
        proposal: RootRecord,
    ) -> Result<Versioned<RootRecord>> {
        if base.is_none() && proposal.revision != 1 {
            return Err(Error::invalid("a new root starts at revision 1"));
        }
        let bytes = Bytes::from(
            proposal
                .encode()
                .map_err(|e| Error::invalid(format!("proposal breaks the root rules: {e}")))?,
        );
        let key = self.layout.root_key(&proposal.cell_id);
        let condition = match base {
            None => PutCondition::IfNoneMatch,
            Some(base) => PutCondition::IfMatch(base.etag.clone()),
        };
        // Set once an attempt's outcome was unknown: from then on no answer
        // proves the proposal absent except a root that moved past the base.
        let mut in_doubt: Option<cellfleet_store::Error> = None;
        for _ in 0..=RESENDS_MAX {
            let error = match self.store.put(&key, bytes.clone(), condition.clone()).await {
                Ok(etag) => {
                    return Ok(Versioned {
                        record: proposal,
                        etag,
                    })
                }
                Err(error) => error,
            };
            let refused = matches!(
                error,
                cellfleet_store::Error::PreconditionFailed { .. }
                    | cellfleet_store::Error::Conflict { .. }
            );
            if refused && in_doubt.is_none() {
                tracing::debug!(cell = %proposal.cell_id, %error, "root cas refused; re-reading");
                return self.after_refusal(base, &proposal).await;
            }
            if !refused && !error.may_have_applied() {
                return match in_doubt {
                    // An earlier attempt may still land: nothing is proven.
                    Some(cause) => Err(Error::Unavailable {
                        source: cause,
                        ambiguous: true,
                    }),
                    None => Err(Error::store(error)),
                };
            }
            tracing::warn!(cell = %proposal.cell_id, %error, "root cas outcome unknown; reconciling");
            let cause = if refused {
                in_doubt.take().expect("refusals reach here only in doubt")
            } else {
                error
            };
            match self.after_ambiguity(base, &proposal, cause).await? {
                Settled::Done(root) => return Ok(*root),
                Settled::NotYet(cause) => in_doubt = Some(cause),
            }
        }
        let cause = in_doubt.expect("the loop ends only in doubt");
        Err(Error::Unavailable {
            source: cause,
            ambiguous: true,
        })
    }

    /// A refused CAS: committed only if the exact proposal is there (an
    /// earlier lost reply); fenced if someone else owns it now.
    async fn after_refusal(
        &self,
        base: Option<&Versioned<RootRecord>>,
        proposal: &RootRecord,
    ) -> Result<Versioned<RootRecord>> {
        let observed = self.read(&proposal.cell_id).await?;
        if let Some(observed) = observed.as_ref().filter(|o| o.record == *proposal) {
            return Ok(observed.clone());
        }
        Err(self.refusal_error(base, proposal, observed.as_ref()))
    }

    /// Re-reads the root after an attempt with an unknown outcome and
    /// settles the proposal's fate, or says the same write must be sent
    /// again (the root is still the base).
    async fn after_ambiguity(
        &self,
        base: Option<&Versioned<RootRecord>>,
        proposal: &RootRecord,
        cause: cellfleet_store::Error,
    ) -> Result<Settled> {
        let observed = match self.read(&proposal.cell_id).await {
            Ok(observed) => observed,
            Err(Error::Unavailable { source, .. }) => {
                return Err(Error::Unavailable {
                    source,
                    ambiguous: true,
                })
            }
            Err(other) => return Err(other),
        };
        let verdict = reconcile(
            base.map(|b| &b.record),
            proposal,
            observed.as_ref().map(|o| &o.record),
        );
        match verdict {
            Reconciliation::Committed => match observed {
                Some(observed) if observed.record == *proposal => {
                    Ok(Settled::Done(Box::new(observed)))
                }
                // Committed, then replaced by a later owner: we are fenced
                // now, but the proposal's content is durable.
                _ => Err(Error::CommittedThenFenced {
                    reason: format!(
                        "cell {} is now at epoch {} owned by {:?}",
                        proposal.cell_id,
                        observed.as_ref().map_or(proposal.epoch, |o| o.record.epoch),
                        observed.as_ref().and_then(|o| o.record.owner.clone())
                    ),
                }),
            },
            Reconciliation::NotYet => Ok(Settled::NotYet(cause)),
            Reconciliation::NotCommitted => {
                Err(self.refusal_error(base, proposal, observed.as_ref()))
            }
            Reconciliation::Unknown => Err(Error::Unavailable {
                source: cause,
                ambiguous: true,
            }),
        }
    }

    fn refusal_error(
        &self,
        base: Option<&Versioned<RootRecord>>,
        proposal: &RootRecord,
        observed: Option<&Versioned<RootRecord>>,
    ) -> Error {
        let Some(observed) = observed else {
            return Error::Conflict {
                reason: "the root vanished".to_owned(),
            };
        };
        let observed = &observed.record;
        let same_owner = observed.epoch == proposal.epoch
            && observed.owner_session == proposal.owner_session
            && observed.owner == proposal.owner;
        let moved_on = base.is_some_and(|base| observed.epoch > base.record.epoch);
        if !same_owner || moved_on {
            Error::fenced(format!(
                "cell {} is now at epoch {} owned by {:?}",
                observed.cell_id, observed.epoch, observed.owner
            ))
        } else {
            Error::Conflict {
                reason: format!(
                    "cell {} root changed to revision {}",
                    observed.cell_id, observed.revision
                ),
            }
        }
    }

    /// Reads the lease of a root's owner and judges the owning session.
    pub async fn owner_liveness(&self, root: &RootRecord) -> Result<Liveness> {
        let (Some(owner), Some(session)) = (&root.owner, root.owner_session) else {
            return Ok(Liveness::Dead);
        };
        let key = self.layout.node_lease_key(owner);
        let lease = match self.store.get(&key).await {
            Ok(object) => Some(
                LeaseRecord::decode(&object.body).map_err(|e| Error::Corrupt {
                    key: key.clone(),
                    reason: e.0,
                })?,
            ),
            Err(e) if e.is_not_found() => None,
            Err(e) => return Err(Error::store(e)),
        };
        Ok(session_liveness(
            lease.as_ref(),
            session,
            self.clock.now_wall_ms(),
            self.margin_ms,
        ))
    }

    /// Activation (DESIGN.md §5): read the root; create it if absent; adopt
    /// it if this session owns it; take it over (epoch + 1) if its owner's
    /// lease expired plus margin or it was released; else report the live
    /// owner. A lost race is [`Error::Conflict`] (re-run) or
    /// [`Error::Fenced`].
    pub async fn activate(&self, new: &NewCell, me: &Holder) -> Result<Activated> {
        self.activate_with_log(new, me, None).await
    }

    /// [`Roots::activate`] for a session that writes a node log: a root
    /// created, or taken over while it points into no log, points at
    /// `log` (this session's lane) from the activation CAS on
    /// ([`transition::point_if_unpointed`]), so the Cell needs no second CAS
    /// before it serves. A root that points into another session's log
    /// keeps its pointer until that log's records are checkpointed.
    pub async fn activate_with_log(
        &self,
        new: &NewCell,
        me: &Holder,
        log: Option<crate::root::LogPointer>,
    ) -> Result<Activated> {
        let current = self.read(&new.cell_id).await?;
        self.activate_on(new, me, log, current).await
    }

    /// [`Roots::activate_with_log`] for a caller that has just read the
    /// Cell's root and found none (the router, placing a new Cell on this
    /// node): it decides on that absence without reading again, so a new
    /// Cell's first command makes one root read, not two.
    ///
    /// A stale absence decides nothing wrongly: the decision on no root is
    /// always a create, written create-only, so a root made since is never
    /// overwritten. The store refuses the write and the refusal re-reads the
    /// root ([`Error::Fenced`] when another holder made it, the root itself
    /// when it is this exact proposal, an earlier reply lost). When the
    /// write's fate is unknown the answer is ambiguous even though a root
    /// already there means it can never land; the caller (the runtime's
    /// activation) then activates again with a read, which decides
    /// correctly in every case.
    pub async fn activate_absent_with_log(
        &self,
        new: &NewCell,
        me: &Holder,
        log: Option<crate::root::LogPointer>,
    ) -> Result<Activated> {
        self.activate_on(new, me, log, None).await
    }

    /// Decides on `current` (the root as last read, `None` for none) and
    /// writes the decision.
    async fn activate_on(
        &self,
        new: &NewCell,
        me: &Holder,
        log: Option<crate::root::LogPointer>,
        current: Option<Versioned<RootRecord>>,
    ) -> Result<Activated> {
        let liveness = match &current {
            Some(current)
                if !current
                    .record
                    .is_owned_by(&me.node, me.session, current.record.epoch) =>
            {
                self.owner_liveness(&current.record).await?
            }
            _ => Liveness::Dead,
        };
        let now_ms = self.clock.now_wall_ms();
        let decision = transition::activate(
            current.as_ref().map(|c| &c.record),
            liveness,
            me,
            new,
            now_ms,
        )?;
        match (decision, current) {
            (Activation::Create(proposal), _) => Ok(Activated::Owned {
                root: Box::new(
                    self.create(transition::point_if_unpointed(proposal, me, log)?)
                        .await?,
                ),
                how: OwnedHow::Created,
            }),
            (Activation::Adopt, Some(current)) => Ok(Activated::Owned {
                root: Box::new(current),
                how: OwnedHow::Adopted,
            }),
            (Activation::Takeover(proposal), Some(current)) => Ok(Activated::Owned {
                root: Box::new(
                    self.replace(&current, transition::point_if_unpointed(proposal, me, log)?)
                        .await?,
                ),
                how: OwnedHow::TookOver,
            }),
            (Activation::OwnerLive { owner, until_ms }, _) => {
                Ok(Activated::OwnerLive { owner, until_ms })
            }
            (_, None) => Err(Error::invalid(
                "activation decided on a root it did not read",
            )),
        }
    }
}
