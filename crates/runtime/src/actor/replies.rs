//! Which held replies a group's end answers, and how: the rule the actor applies when a publication ends (cell mode: the group's root CAS; log mode: the lane's verdict on its slot), pure and property-tested.
//!
//! A held reply belongs to a group that executed and waits for its
//! publication; groups publish in txid order (CASes run oldest first, and a
//! lane acknowledges a contiguous prefix of its slots). The rule never
//! releases a reply before its group and every earlier one are published,
//! and never says "not committed" of a group whose publication may still
//! count.

use cellfleet_authority::Txid;

/// How a group's publication ended, as the actor learns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GroupEnd {
    /// The group at `txid` is published (its CAS landed, or its segment
    /// and every earlier one of its lane are written): it and every
    /// earlier group count.
    Published { txid: Txid },
    /// The group at `txid` may or may not count, and the actor keeps
    /// waiting for its fate (log mode past the reply bound): that group is
    /// answered UNKNOWN, later groups stay held.
    Undecided { txid: Txid },
    /// The group at `txid` may or may not count, and the actor stops
    /// (cell mode: an unknown CAS). Later groups' CASes never ran, so they
    /// never count.
    UndecidedThenStopped { txid: Txid },
    /// The actor stops with groups held. `may_land`: their publications
    /// may still count (log mode: a segment already handed to the lane
    /// counts whenever it lands), else none of them can (cell mode: their
    /// CASes never ran; or fenced, or the lane sealed before their slots).
    Stopped { may_land: bool },
}

/// What a held reply gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Its outcome: the group is published.
    Release,
    /// UNKNOWN: the group may or may not count (resolve it later).
    Unknown,
    /// NOT_COMMITTED: the group never counts (safe to retry).
    NotCommitted,
    /// Nothing yet.
    Hold,
}

/// The answer `end` gives the held reply of the group at `held`.
pub(crate) fn answer(end: GroupEnd, held: Txid) -> Answer {
    match end {
        GroupEnd::Published { txid } if held <= txid => Answer::Release,
        GroupEnd::Published { .. } => Answer::Hold,
        GroupEnd::Undecided { txid } if held == txid => Answer::Unknown,
        GroupEnd::Undecided { .. } => Answer::Hold,
        // An earlier group still held would be one whose fate was never
        // learnt: it may count too.
        GroupEnd::UndecidedThenStopped { txid } if held <= txid => Answer::Unknown,
        GroupEnd::UndecidedThenStopped { .. } => Answer::NotCommitted,
        GroupEnd::Stopped { may_land: true } => Answer::Unknown,
        GroupEnd::Stopped { may_land: false } => Answer::NotCommitted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn txid() -> impl Strategy<Value = Txid> {
        (0u64..50).prop_map(Txid)
    }

    fn end() -> impl Strategy<Value = GroupEnd> {
        prop_oneof![
            txid().prop_map(|txid| GroupEnd::Published { txid }),
            txid().prop_map(|txid| GroupEnd::Undecided { txid }),
            txid().prop_map(|txid| GroupEnd::UndecidedThenStopped { txid }),
            any::<bool>().prop_map(|may_land| GroupEnd::Stopped { may_land }),
        ]
    }

    fn stops(end: GroupEnd) -> bool {
        matches!(
            end,
            GroupEnd::UndecidedThenStopped { .. } | GroupEnd::Stopped { .. }
        )
    }

    proptest! {
        /// Replies leave in commit order: when one is released, every
        /// earlier held one is released with it, and none past the
        /// published group.
        #[test]
        fn releases_are_a_prefix_up_to_the_published_group(
            end in end(),
            mut held in proptest::collection::vec(txid(), 0..20),
        ) {
            held.sort_unstable();
            let answers: Vec<Answer> = held.iter().map(|&h| answer(end, h)).collect();
            let released = answers.iter().take_while(|a| **a == Answer::Release).count();
            prop_assert!(answers[released..].iter().all(|a| *a != Answer::Release));
            match end {
                GroupEnd::Published { txid } => {
                    for (h, a) in held.iter().zip(&answers) {
                        prop_assert_eq!(*a == Answer::Release, *h <= txid);
                        prop_assert!(*a == Answer::Release || *a == Answer::Hold);
                    }
                }
                _ => prop_assert_eq!(released, 0),
            }
        }

        /// NOT_COMMITTED (which invites a retry under a new id) is never
        /// said of a group that may still count: not of the undecided one,
        /// nor of any before it, nor of any group whose segment may land.
        #[test]
        fn not_committed_only_where_the_group_can_never_count(end in end(), held in (0u64..60).prop_map(Txid)) {
            if answer(end, held) == Answer::NotCommitted {
                match end {
                    GroupEnd::UndecidedThenStopped { txid } => prop_assert!(held > txid),
                    GroupEnd::Stopped { may_land } => prop_assert!(!may_land),
                    other => prop_assert!(false, "{:?} said NOT_COMMITTED", other),
                }
            }
        }

        /// An end that stops the actor answers every held reply; one that
        /// does not answers UNKNOWN only to its own group and holds the
        /// rest it does not release.
        #[test]
        fn a_stopping_end_leaves_nothing_held(end in end(), held in (0u64..60).prop_map(Txid)) {
            let a = answer(end, held);
            if stops(end) {
                prop_assert_ne!(a, Answer::Hold);
            }
            if let GroupEnd::Undecided { txid } = end {
                prop_assert_eq!(a == Answer::Unknown, held == txid);
                prop_assert_ne!(a, Answer::NotCommitted);
                prop_assert_ne!(a, Answer::Release);
            }
        }
    }
}
