//! The root transitions of DESIGN.md §5 as pure functions: given the current root, decide the proposal or refuse.
//!
//! Nothing here does I/O; [`crate::Roots`] performs the compare-and-swap.
//! Every proposal is the current root with `revision + 1`, so a successful
//! CAS advances the revision exactly once and the bytes never repeat.
//!
//! Fencing rules:
//! * only the owner's session at the root's epoch may publish, compact or
//!   release ([`RootRecord::is_owned_by`]); anyone else gets
//!   [`Error::Fenced`];
//! * every change of owner bumps the epoch (create = 1, takeover = +1);
//! * takeover is refused with [`Error::LeaseLive`] while the owner's session
//!   is live ([`Liveness`]), and allowed once it is dead or the root released.

use cellfleet_ltx::Txid;

use crate::error::{Error, Result};
use crate::ids::{CellId, Epoch, NodeId, SessionId};
use crate::lease::Liveness;
use crate::root::{LogPointer, LtxRef, RootRecord, RootState, CHAIN_LEN_MAX, ROOT_FORMAT_VERSION};

/// The node session proposing a transition.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Holder {
    /// The node.
    pub node: NodeId,
    /// Its current session.
    pub session: SessionId,
}

/// What a Cell's root starts with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewCell {
    /// The Cell.
    pub cell_id: CellId,
    /// Its kind.
    pub kind: String,
    /// Its application key, if worth showing.
    pub key: Option<String>,
    /// SQLite page size.
    pub page_size: u32,
    /// Schema version of the empty database.
    pub schema_version: u32,
}

/// The decision of [`activate`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Activation {
    /// No root yet: create this one (create-only write).
    Create(RootRecord),
    /// Already owned by this very session at the root's epoch: nothing to write.
    Adopt,
    /// Take over with this proposal (CAS, epoch + 1).
    Takeover(RootRecord),
    /// Owned by a live session elsewhere: route there (or, if it is this
    /// node's own earlier session, wait until `until_ms`).
    OwnerLive {
        /// The owner node.
        owner: NodeId,
        /// Wall-clock ms until which the owner counts as live.
        until_ms: u64,
    },
}

/// The first root of a Cell: epoch 1, revision 1, owned by `me`, empty chain.
pub fn create(new: &NewCell, me: &Holder, now_ms: u64) -> RootRecord {
    RootRecord {
        version: ROOT_FORMAT_VERSION,
        cell_id: new.cell_id.clone(),
        kind: new.kind.clone(),
        key: new.key.clone(),
        owner: Some(me.node.clone()),
        owner_session: Some(me.session),
        epoch: Epoch::FIRST,
        revision: 1,
        state: RootState::Active,
        chain: Vec::new(),
        txid: Txid::ZERO,
        checksum: 0,
        page_size: new.page_size,
        schema_version: new.schema_version,
        updated_at_ms: now_ms,
        log: None,
    }
}

/// Decides activation: create if absent, adopt if already ours, take over
/// if the owner is dead or the root released, else report the live owner.
/// `owner_liveness` is the liveness of the root's `owner_session` (ignored
/// when absent, released or ours).
pub fn activate(
    current: Option<&RootRecord>,
    owner_liveness: Liveness,
    me: &Holder,
    new: &NewCell,
    now_ms: u64,
) -> Result<Activation> {
    let Some(current) = current else {
        return Ok(Activation::Create(create(new, me, now_ms)));
    };
    if current.cell_id != new.cell_id {
        return Err(Error::invalid("the root read belongs to another cell"));
    }
    if current.is_owned_by(&me.node, me.session, current.epoch) {
        return Ok(Activation::Adopt);
    }
    match takeover(current, owner_liveness, me, now_ms) {
        Ok(proposal) => Ok(Activation::Takeover(proposal)),
        Err(Error::LeaseLive { owner, until_ms }) => Ok(Activation::OwnerLive { owner, until_ms }),
        Err(other) => Err(other),
    }
}

/// Takes a Cell over: epoch + 1, owner = `me`, chain and state kept.
/// Refused while the current owner's session is live.
pub fn takeover(
    current: &RootRecord,
    owner_liveness: Liveness,
    me: &Holder,
    now_ms: u64,
) -> Result<RootRecord> {
    if current.is_owned_by(&me.node, me.session, current.epoch) {
        return Err(Error::invalid(
            "takeover of a cell this session already owns",
        ));
    }
    if current.state == RootState::Active {
        if let Liveness::Live { until_ms } = owner_liveness {
            let owner = current
                .owner
                .clone()
                .expect("validated active roots have an owner");
            return Err(Error::LeaseLive { owner, until_ms });
        }
    }
    let epoch = current
        .epoch
        .next()
        .ok_or_else(|| Error::invalid("epoch overflow"))?;
    Ok(RootRecord {
        owner: Some(me.node.clone()),
        owner_session: Some(me.session),
        epoch,
        state: RootState::Active,
        ..successor(current, now_ms)?
    })
}

/// Publishes one delta LTX file: it must start right after the root's TXID;
/// the new checksum is the file's post-apply checksum.
pub fn publish(
    current: &RootRecord,
    me: &Holder,
    epoch: Epoch,
    delta: LtxRef,
    now_ms: u64,
) -> Result<RootRecord> {
    check_owner(current, me, epoch)?;
    let mut next = successor(current, now_ms)?;
    append(&mut next, delta)?;
    Ok(next)
}

/// Replaces the chain's files up to `compacted.max_txid` by `compacted` (a
/// merge or a full snapshot starting at TXID 1, ending on a file boundary,
/// with the same post-apply checksum: the state does not change), then
/// appends `delta` if given — all in one CAS.
pub fn compact_and_publish(
    current: &RootRecord,
    me: &Holder,
    epoch: Epoch,
    compacted: LtxRef,
    delta: Option<LtxRef>,
    now_ms: u64,
) -> Result<RootRecord> {
    check_owner(current, me, epoch)?;
    if compacted.min_txid != Txid::FIRST {
        return Err(Error::invalid("a compacted file must start at txid 1"));
    }
    let Some(boundary) = current
        .chain
        .iter()
        .position(|file| file.max_txid == compacted.max_txid)
    else {
        return Err(Error::invalid(
            "a compacted file must end where a chain file ends",
        ));
    };
    if current.chain[boundary].post_apply_checksum != compacted.post_apply_checksum {
        return Err(Error::invalid(
            "compaction changed the state: post-apply checksums differ",
        ));
    }
    let mut next = successor(current, now_ms)?;
    next.chain = std::iter::once(compacted)
        .chain(current.chain[boundary + 1..].iter().cloned())
        .collect();
    if let Some(delta) = delta {
        append(&mut next, delta)?;
    }
    Ok(next)
}

/// One publication or checkpoint by the owner, decided in one place: the
/// new root for `delta` (a file starting right after the root's TXID, or a
/// snapshot from TXID 1, which replaces the whole chain), an optional
/// `compaction` folded into the same CAS, and the log pointer the root
/// carries afterwards (`None`: the chain is the whole state).
///
/// Rules: only the owner's session at `epoch` proposes; a pointer names
/// the proposer's own session (a checkpoint never points into another
/// session's log; only a takeover keeps the previous owner's pointer until
/// its records are checkpointed); with no delta and no compaction only the
/// pointer changes.
pub fn propose(
    current: &RootRecord,
    me: &Holder,
    epoch: Epoch,
    delta: Option<LtxRef>,
    compaction: Option<LtxRef>,
    log: Option<LogPointer>,
    now_ms: u64,
) -> Result<RootRecord> {
    check_owner(current, me, epoch)?;
    if let Some(pointer) = &log {
        if pointer.lane.node != me.node || pointer.lane.session != me.session {
            return Err(Error::invalid(
                "a log pointer must name the proposing session's own lane",
            ));
        }
    }
    let mut next = match (delta, compaction) {
        (Some(delta), _) if delta.min_txid == Txid::FIRST && current.txid > Txid::ZERO => {
            // A snapshot holds the whole state: it replaces the chain.
            let mut next = successor(current, now_ms)?;
            next.txid = delta.max_txid;
            next.checksum = delta.post_apply_checksum;
            next.chain = vec![delta];
            next
        }
        (delta, Some(compacted)) => {
            compact_and_publish(current, me, epoch, compacted, delta, now_ms)?
        }
        (Some(delta), None) => publish(current, me, epoch, delta, now_ms)?,
        (None, None) => successor(current, now_ms)?,
    };
    next.log = log;
    next.validate().map_err(|e| Error::invalid(e.0))?;
    Ok(next)
}

/// A create or takeover proposal made to point at `log` (the proposing
/// session's own lane) when it points into no log yet: its chain is then
/// the whole state, so any record of the Cell from now on is found from the
/// pointer. A proposal that points into another session's log keeps that
/// pointer (its records are not in the chain yet).
pub fn point_if_unpointed(
    mut proposal: RootRecord,
    me: &Holder,
    log: Option<LogPointer>,
) -> Result<RootRecord> {
    if let Some(pointer) = log {
        if pointer.lane.node != me.node || pointer.lane.session != me.session {
            return Err(Error::invalid(
                "a log pointer must name the proposing session's own lane",
            ));
        }
        if proposal.log.is_none() {
            proposal.log = Some(pointer);
        }
    }
    Ok(proposal)
}

/// Releases the Cell (drain or passivation for good): no owner, same epoch,
/// no log pointer. The caller must have checkpointed every acknowledged
/// record first (a released root's chain is its whole state).
pub fn release(current: &RootRecord, me: &Holder, epoch: Epoch, now_ms: u64) -> Result<RootRecord> {
    check_owner(current, me, epoch)?;
    Ok(RootRecord {
        owner: None,
        owner_session: None,
        state: RootState::Released,
        log: None,
        ..successor(current, now_ms)?
    })
}

/// Sets the schema version (a migration published through the normal path
/// carries its own delta; this records the version reached).
pub fn with_schema_version(mut proposal: RootRecord, schema_version: u32) -> RootRecord {
    proposal.schema_version = schema_version;
    proposal
}

fn check_owner(current: &RootRecord, me: &Holder, epoch: Epoch) -> Result<()> {
    if current.is_owned_by(&me.node, me.session, epoch) {
        return Ok(());
    }
    Err(Error::fenced(format!(
        "cell {} is at epoch {} owned by {:?} (session {:?}, {:?}); {} session {} at epoch {epoch} may not write",
        current.cell_id,
        current.epoch,
        current.owner,
        current.owner_session,
        current.state,
        me.node,
        me.session,
    )))
}

fn successor(current: &RootRecord, now_ms: u64) -> Result<RootRecord> {
    let revision = current
        .revision
        .checked_add(1)
        .ok_or_else(|| Error::invalid("revision overflow"))?;
    Ok(RootRecord {
        revision,
        updated_at_ms: now_ms,
        ..current.clone()
    })
}

fn append(next: &mut RootRecord, delta: LtxRef) -> Result<()> {
    let expected = next
        .txid
        .next()
        .ok_or_else(|| Error::invalid("txid overflow"))?;
    if delta.min_txid != expected || delta.max_txid < delta.min_txid {
        return Err(Error::invalid(format!(
            "delta covers txids {}..={} but the root is at {}",
            delta.min_txid.0, delta.max_txid.0, next.txid.0
        )));
    }
    if next.chain.len() >= CHAIN_LEN_MAX {
        return Err(Error::invalid(format!(
            "chain has {CHAIN_LEN_MAX} files: compact before publishing"
        )));
    }
    next.txid = delta.max_txid;
    next.checksum = delta.post_apply_checksum;
    next.chain.push(delta);
    next.validate()
        .map_err(|e| Error::invalid(format!("proposal breaks the root rules: {e}")))
}
