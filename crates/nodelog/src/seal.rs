//! How a successor ends a dead session's lane, and where a reader's log ends (pure): DESIGN.md §9 rules 1-3.
//!
//! A sealer lists the lane (every key left in it) and decides with [`plan`]:
//! the lane's first seal at or after the lane's floor, if there is one,
//! already ends it; otherwise it creates a seal, create-only, at the first
//! slot missing from the run that starts at the floor — a gap left by a PUT
//! still in flight, or the slot after the highest. A refused create (412)
//! is settled by reading that slot ([`after_refused`]): a seal there means
//! another successor got there first (sealing is idempotent); a segment
//! means the log grew, and the sealer plans again.
//!
//! A reader counts exactly the slots from the floor up to the lane's first
//! seal ([`log_end`]), all of them present: the seal went into the first
//! gap, so nothing below it can land later.
//!
//! The run starts at the **floor**, never at the lowest key listed: a slot
//! below the lowest key may be a PUT still in flight, and a seal above it
//! would let that PUT land, be acknowledged by its writer (the prefix below
//! the seal is contiguous again) and be missed by a reader that listed
//! before it landed. The floor is the session's first slot (0); garbage
//! collection, when it deletes a lane's written prefix, must record the new
//! floor durably before deleting, and never delete a seal — so a zombie
//! writer that wakes after GC still finds the seal in the slot it writes
//! next.

use std::collections::BTreeMap;

/// What a listing shows in a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listed {
    /// A segment.
    Segment,
    /// A seal.
    Seal,
}

/// What a sealer does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// The lane already ends at this seal.
    Sealed {
        /// Its slot.
        at: u64,
    },
    /// Create a seal in this slot (create-only).
    SealAt(u64),
}

/// The plan for a lane whose listing is `listed` and whose run starts at
/// `floor` (see the module docs).
pub fn plan(floor: u64, listed: &BTreeMap<u64, Listed>) -> Plan {
    let mut seq = floor;
    loop {
        match listed.get(&seq) {
            Some(Listed::Seal) => return Plan::Sealed { at: seq },
            Some(Listed::Segment) => seq += 1,
            None => return Plan::SealAt(seq),
        }
    }
}

/// What a sealer does after its create at `seq` was refused and a read of
/// that slot found `found`.
pub fn after_refused(seq: u64, found: Listed) -> AfterRefused {
    match found {
        Listed::Seal => AfterRefused::Sealed { at: seq },
        Listed::Segment => AfterRefused::PlanAgain,
    }
}

/// The next step after a refused seal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterRefused {
    /// Another successor sealed this slot: the lane ends here.
    Sealed {
        /// The slot.
        at: u64,
    },
    /// A segment landed first: record it in the listing and plan again.
    PlanAgain,
}

/// Where a reader's log ends: the slots that count are the run from
/// `floor` up to (not including) the returned seal. `None` while the lane
/// is not sealed (its session may still be writing).
pub fn log_end(floor: u64, listed: &BTreeMap<u64, Listed>) -> Option<u64> {
    let mut seq = floor;
    loop {
        match listed.get(&seq)? {
            Listed::Seal => return Some(seq),
            Listed::Segment => seq += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lane::{verdict, GroupFate, SlotState};
    use proptest::prelude::*;

    /// One step of a world with one writer (its slots 0.. pipelined) and
    /// racing sealers over a create-only key space.
    #[derive(Clone, Debug)]
    enum Step {
        /// The writer sends the PUT of its next slot.
        Send,
        /// The PUT of the writer's `n`-th pending slot reaches the store.
        Land(usize),
        /// The writer's `n`-th pending PUT is answered "unknown" without
        /// landing; the writer will send the same bytes again.
        LoseAttempt(usize),
        /// A sealer lists the lane and performs its plan (a refused create
        /// reads the slot and plans again, as many times as needed).
        Seal,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            3 => Just(Step::Send),
            4 => (0..8usize).prop_map(Step::Land),
            1 => (0..8usize).prop_map(Step::LoseAttempt),
            1 => Just(Step::Seal),
        ]
    }

    #[derive(Default)]
    struct World {
        /// The bucket: slot -> what it holds (create-only).
        store: BTreeMap<u64, Listed>,
        /// What the writer knows.
        writer: BTreeMap<u64, SlotState>,
        /// Slots sent and not answered yet.
        pending: Vec<u64>,
        next: u64,
    }

    impl World {
        /// A PUT reaching the store: create-only.
        fn land(&mut self, seq: u64) {
            let state = match self.store.get(&seq) {
                None => {
                    self.store.insert(seq, Listed::Segment);
                    SlotState::Written
                }
                Some(Listed::Seal) => SlotState::Sealed,
                Some(Listed::Segment) => SlotState::Written,
            };
            self.writer.insert(seq, state);
        }

        fn seal(&mut self) {
            for _ in 0..64 {
                match plan(0, &self.store) {
                    Plan::Sealed { .. } => return,
                    Plan::SealAt(seq) => match self.store.get(&seq).copied() {
                        None => {
                            self.store.insert(seq, Listed::Seal);
                            return;
                        }
                        Some(found) => match after_refused(seq, found) {
                            AfterRefused::Sealed { .. } => return,
                            AfterRefused::PlanAgain => continue,
                        },
                    },
                }
            }
            panic!("sealing did not end");
        }
    }

    proptest! {
        /// No acknowledged group is lost and nothing refused counts: after
        /// any interleaving of pipelined PUTs, lost attempts and racing
        /// sealers, once the writer has heard every answer, the slots a
        /// reader counts are exactly the slots the writer acknowledged, and
        /// every other slot the writer sent is not committed.
        #[test]
        fn readers_count_exactly_what_the_writer_acknowledged(
            steps in proptest::collection::vec(step(), 1..60),
        ) {
            let mut world = World::default();
            let mut ends = Vec::new();
            for step in steps {
                match step {
                    Step::Send => {
                        let seq = world.next;
                        world.next += 1;
                        world.writer.insert(seq, SlotState::InFlight);
                        world.pending.push(seq);
                    }
                    Step::Land(n) if !world.pending.is_empty() => {
                        let seq = world.pending.remove(n % world.pending.len());
                        world.land(seq);
                    }
                    Step::LoseAttempt(n) if !world.pending.is_empty() => {
                        let seq = world.pending[n % world.pending.len()];
                        world.writer.insert(seq, SlotState::InDoubt);
                    }
                    Step::Seal => {
                        world.seal();
                        // A reader that lists right now must already see
                        // every slot that will count: all present below
                        // the seal, which never moves.
                        let end = log_end(0, &world.store).expect("just sealed");
                        for seq in 0..end {
                            prop_assert_eq!(world.store.get(&seq), Some(&Listed::Segment));
                        }
                        ends.push(end);
                    }
                    _ => {}
                }
                // Mid-run: nothing acknowledged is ever outside what a
                // reader would count once the lane is sealed.
                let verdict = verdict(0, &world.writer);
                for seq in 0..verdict.acked_below {
                    prop_assert_eq!(world.store.get(&seq), Some(&Listed::Segment));
                }
            }
            // The writer resends every open slot (same bytes), then a
            // successor seals the lane.
            for seq in std::mem::take(&mut world.pending) {
                world.land(seq);
            }
            world.seal();
            let end = log_end(0, &world.store).expect("sealed");
            for earlier in ends {
                prop_assert_eq!(earlier, end, "a reader before the last landing saw another end");
            }
            let verdict = verdict(0, &world.writer);
            for seq in 0..world.next {
                let counted = seq < end;
                match verdict.group(seq) {
                    GroupFate::Acknowledged => prop_assert!(counted, "acked slot {} not counted", seq),
                    GroupFate::NotCommitted => prop_assert!(!counted, "refused slot {} counted", seq),
                    GroupFate::Waiting => prop_assert!(false, "slot {} still waiting after every answer", seq),
                }
            }
            // Counted slots are all present: no gap below the seal.
            for seq in 0..end {
                prop_assert_eq!(world.store.get(&seq), Some(&Listed::Segment));
            }
        }
    }

    #[test]
    fn a_plan_seals_the_first_gap_or_finds_the_seal() {
        let listed = |slots: &[(u64, Listed)]| slots.iter().copied().collect::<BTreeMap<_, _>>();
        assert_eq!(plan(0, &listed(&[])), Plan::SealAt(0));
        assert_eq!(
            plan(0, &listed(&[(3, Listed::Segment), (4, Listed::Segment)])),
            Plan::SealAt(0),
            "slots 0..3 may still be in flight"
        );
        assert_eq!(
            plan(3, &listed(&[(3, Listed::Segment), (4, Listed::Segment)])),
            Plan::SealAt(5),
            "above a floor of 3"
        );
        assert_eq!(
            log_end(0, &listed(&[(1, Listed::Segment), (2, Listed::Seal)])),
            None,
            "a seal above a gap does not end the lane"
        );
        assert_eq!(
            plan(0, &listed(&[(0, Listed::Segment), (2, Listed::Segment)])),
            Plan::SealAt(1)
        );
        assert_eq!(
            plan(
                0,
                &listed(&[
                    (0, Listed::Segment),
                    (1, Listed::Seal),
                    (2, Listed::Segment)
                ])
            ),
            Plan::Sealed { at: 1 }
        );
        assert_eq!(
            log_end(0, &listed(&[(0, Listed::Segment), (1, Listed::Seal)])),
            Some(1)
        );
        assert_eq!(log_end(0, &listed(&[(0, Listed::Segment)])), None);
        assert_eq!(
            after_refused(4, Listed::Seal),
            AfterRefused::Sealed { at: 4 }
        );
        assert_eq!(after_refused(4, Listed::Segment), AfterRefused::PlanAgain);
    }
}
