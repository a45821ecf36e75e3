//! Lost-reply reconciliation: after an ambiguous CAS, decide from a fresh read whether the exact proposal committed.
//!
//! Sound by construction: it answers `Committed` only when the proposal is
//! provably in the root, `NotCommitted` only when it provably is not and
//! never can be, `NotYet` when the root is still the base (our write has
//! not landed, but a delayed one still could: a client-side timeout does not
//! stop the server), and `Unknown` otherwise (the command's fate is then
//! reported `UNKNOWN`, never retried). The arguments rest on three facts of the root's history: it is
//! linear (each successful CAS names its predecessor's ETag), revisions grow
//! by one per write (so bytes never repeat), and TXIDs never decrease.

use std::collections::BTreeSet;

use crate::root::RootRecord;

/// The fate of a proposal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reconciliation {
    /// The proposal is in the root's history.
    Committed,
    /// The proposal is provably not in the root's history, and can no longer
    /// get there (the root moved past the base it was conditioned on).
    NotCommitted,
    /// The root is still the base (or still absent, for a create): the write
    /// has not landed yet but may still. Only re-sending the same write
    /// settles it: it then either lands, or finds the root moved on.
    NotYet,
    /// Cannot be proven either way.
    Unknown,
}

/// Decides whether `proposal`, written by CAS over `base` (`None` for a
/// create), committed, given the root `observed` by a read made after the
/// write's outcome became ambiguous.
pub fn reconcile(
    base: Option<&RootRecord>,
    proposal: &RootRecord,
    observed: Option<&RootRecord>,
) -> Reconciliation {
    let Some(observed) = observed else {
        // Roots are never deleted: an absent root after a create means the
        // create did not happen; after a replace, something is badly wrong.
        return if base.is_none() {
            Reconciliation::NotYet
        } else {
            Reconciliation::Unknown
        };
    };
    if observed == proposal {
        return Reconciliation::Committed;
    }
    if base == Some(observed) {
        // Still the root we swapped against: our write has not landed, but a
        // delayed one still matches the base's ETag and could.
        return Reconciliation::NotYet;
    }
    if observed.revision == proposal.revision {
        // The successor of the base is someone else's record.
        return Reconciliation::NotCommitted;
    }
    if observed.revision < proposal.revision {
        return Reconciliation::Unknown;
    }
    // History moved past the proposal's revision.
    if observed.txid < proposal.txid {
        // Had the proposal committed, no later root could be behind it.
        return Reconciliation::NotCommitted;
    }
    let base_keys: BTreeSet<&str> = base
        .map(|base| base.chain.iter().map(|file| file.key.as_str()).collect())
        .unwrap_or_default();
    let new_keys: Vec<&str> = proposal
        .chain
        .iter()
        .map(|file| file.key.as_str())
        .filter(|key| !base_keys.contains(key))
        .collect();
    let observed_keys: BTreeSet<&str> = observed
        .chain
        .iter()
        .map(|file| file.key.as_str())
        .collect();
    if observed.epoch > proposal.epoch
        && !new_keys.is_empty()
        && new_keys.iter().all(|key| observed_keys.contains(key))
    {
        // Files uploaded at our epoch are referenced by a later owner only
        // if that owner read a root that contained them: ours.
        return Reconciliation::Committed;
    }
    Reconciliation::Unknown
}
