//! Which groups a lane's segment outcomes acknowledge (pure): the writer's side of DESIGN.md §9 rule 1.
//!
//! A session writes its lane's slots in sequence, several in flight at
//! once. What it has learned of each slot is a [`SlotState`]; [`verdict`]
//! turns that into what may be answered:
//! * a group is **acknowledged** only when its slot and every earlier slot
//!   of the lane, from the session's first, is written by this session (the
//!   contiguous prefix);
//! * the lane **ends at its first seal**: every group in that slot or a
//!   later one is **not committed**, even a group whose own PUT succeeded,
//!   and the session is fenced on the lane;
//! * anything else **waits**: a slot in flight or in doubt may still land,
//!   so it is never called not committed (it is settled by sending the same
//!   bytes again, which either lands or finds the seal).

use std::collections::BTreeMap;

/// What the writing session knows of one of its slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SlotState {
    /// The PUT was sent; no answer yet.
    InFlight,
    /// The key holds this session's bytes (the PUT succeeded, or a resend
    /// or read found them).
    Written,
    /// The key holds a seal.
    Sealed,
    /// An attempt's outcome is unknown: resend the same bytes.
    InDoubt,
}

/// What the slots so far allow the writer to answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// Groups in slots below this are acknowledged.
    pub acked_below: u64,
    /// The lane's first seal, if one was found: groups in it and every later
    /// slot are not committed, and the session must stop writing the lane.
    pub sealed_at: Option<u64>,
}

impl Verdict {
    /// What becomes of a group in slot `seq`.
    pub fn group(&self, seq: u64) -> GroupFate {
        if seq < self.acked_below {
            GroupFate::Acknowledged
        } else if self.sealed_at.is_some_and(|sealed| seq >= sealed) {
            GroupFate::NotCommitted
        } else {
            GroupFate::Waiting
        }
    }
}

/// The answer a group may get now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupFate {
    /// Durable: release the replies.
    Acknowledged,
    /// Provably never counts: answer not committed.
    NotCommitted,
    /// Not decided yet.
    Waiting,
}

/// The verdict over `slots` (what this session knows of each slot it has
/// written or is writing) for a lane whose first slot is `first_seq`.
pub fn verdict(first_seq: u64, slots: &BTreeMap<u64, SlotState>) -> Verdict {
    let mut acked_below = first_seq;
    while slots.get(&acked_below) == Some(&SlotState::Written) {
        acked_below += 1;
    }
    let sealed_at = slots
        .iter()
        .find(|(_, state)| **state == SlotState::Sealed)
        .map(|(seq, _)| *seq);
    Verdict {
        acked_below,
        sealed_at,
    }
}

/// The later of two verdicts over the same slots (pure): verdicts only
/// move forward — the acknowledged prefix grows and a seal, once found,
/// stays — so merging two of them, in whichever order they arrive, keeps
/// the furthest of each.
pub fn later(a: Verdict, b: Verdict) -> Verdict {
    Verdict {
        acked_below: a.acked_below.max(b.acked_below),
        sealed_at: match (a.sealed_at, b.sealed_at) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn state() -> impl Strategy<Value = SlotState> {
        prop_oneof![
            Just(SlotState::InFlight),
            Just(SlotState::Written),
            Just(SlotState::Sealed),
            Just(SlotState::InDoubt),
        ]
    }

    proptest! {
        /// Publishing verdicts out of order never moves one back: merging
        /// the verdicts of every prefix of a run of answers, in any order,
        /// gives the verdict of the whole run.
        #[test]
        fn merged_verdicts_arrive_at_the_final_one_in_any_order(
            states in proptest::collection::vec(state(), 1..16),
            order in proptest::collection::vec(any::<u8>(), 1..16),
        ) {
            let mut slots = BTreeMap::new();
            let mut seen = Vec::new();
            for (seq, state) in states.iter().enumerate() {
                slots.insert(seq as u64, *state);
                seen.push(verdict(0, &slots));
            }
            let last = *seen.last().unwrap();
            // Deliver them shuffled (by the order bytes), merging.
            let mut delivered = seen.clone();
            for (i, o) in order.iter().enumerate() {
                let n = delivered.len();
                delivered.swap(i % n, *o as usize % n);
            }
            let mut published = verdict(0, &BTreeMap::new());
            for v in delivered {
                published = later(published, v);
            }
            prop_assert_eq!(published, last);
            prop_assert_eq!(later(last, seen[0]), later(seen[0], last));
        }

        /// Acknowledged exactly on the contiguous written prefix; not
        /// committed exactly from the first seal on; never both; a slot in
        /// flight or in doubt below the first seal is never not committed.
        #[test]
        fn acknowledgement_is_the_written_prefix_before_the_first_seal(
            first in 0u64..4,
            states in proptest::collection::vec(proptest::option::of(state()), 0..24),
        ) {
            let slots: BTreeMap<u64, SlotState> = states
                .iter()
                .enumerate()
                .filter_map(|(i, s)| s.map(|s| (first + i as u64, s)))
                .collect();
            let verdict = verdict(first, &slots);
            let first_seal = slots.iter().find(|(_, s)| **s == SlotState::Sealed).map(|(q, _)| *q);
            for seq in first..first + states.len() as u64 + 2 {
                let prefix_written = (first..=seq).all(|q| slots.get(&q) == Some(&SlotState::Written));
                let fate = verdict.group(seq);
                prop_assert_eq!(fate == GroupFate::Acknowledged, prefix_written, "slot {}", seq);
                let after_seal = first_seal.is_some_and(|s| seq >= s);
                prop_assert_eq!(fate == GroupFate::NotCommitted, after_seal && !prefix_written, "slot {}", seq);
                if matches!(slots.get(&seq), Some(SlotState::InFlight | SlotState::InDoubt)) && !after_seal {
                    prop_assert_eq!(fate, GroupFate::Waiting);
                }
                // A written prefix can never reach past a seal.
                prop_assert!(!(prefix_written && after_seal));
            }
        }
    }
}
