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
//! before it landed. The floor is the session's first slot (0) until
//! garbage collection deletes a written prefix of the lane: it raises the
//! lane's floor marker first and deletes below it afterwards, and a lister
//! reads the marker *after* listing, so a slot missing from its listing
//! because it was collected is always below the floor it uses. Seals are
//! never deleted, so a zombie writer that wakes after GC still finds the
//! seal in the slot it writes next.
//!
//! A sealer slow between reading the floor and creating its seal may find
//! the slot it planned empty because it was collected meanwhile (another
//! successor sealed above it, replayed it, and the lane was collected up
//! to that seal), and create a **stale seal** there, below the floor. It
//! ends nothing: readers and sealers start at the floor. A writer whose
//! resend of that slot meets it must not read it as the end of its lane:
//! only written slots are collected, so its own segment was there and
//! counted; [`crate::store::LaneWriter`] checks the floor before calling a
//! slot sealed. The model check in `tests/model.rs` found this.

use std::collections::BTreeMap;

/// What a listing shows in a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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
        /// A sealer lists the lane, then `n` steps of collection happen, then
        /// it reads the floor marker and performs its plan (a refused
        /// create reads the slot and plans again, as many times as needed).
        Seal(usize),
        /// Every acknowledged slot becomes collectable (its records
        /// checkpointed into their roots).
        Checkpoint,
        /// Collection raises the floor marker to the collectable point and
        /// queues the deletion of every slot below it.
        Collect,
        /// The oldest queued deletion happens.
        Delete,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            3 => Just(Step::Send),
            4 => (0..8usize).prop_map(Step::Land),
            1 => (0..8usize).prop_map(Step::LoseAttempt),
            2 => (0..4usize).prop_map(Step::Seal),
            1 => Just(Step::Checkpoint),
            1 => Just(Step::Collect),
            2 => Just(Step::Delete),
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
        /// The lane's floor marker.
        marker: u64,
        /// Slots below this may be collected.
        collectable: u64,
        /// Deletions queued by collection, oldest first.
        deleting: std::collections::VecDeque<u64>,
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

        fn collect(&mut self) {
            if self.collectable > self.marker {
                let from = self.marker;
                self.marker = self.collectable;
                self.deleting.extend(from..self.collectable);
            }
        }

        /// One step of collection: the next deletion, or else a new round.
        fn collect_step(&mut self) {
            if self.deleting.is_empty() {
                self.collect();
            } else {
                self.delete_one();
            }
        }

        fn delete_one(&mut self) {
            if let Some(seq) = self.deleting.pop_front() {
                assert_ne!(
                    self.store.get(&seq),
                    Some(&Listed::Seal),
                    "a seal was collected"
                );
                self.store.remove(&seq);
            }
        }

        /// A listing, `gc` steps of collection meanwhile, then the marker.
        fn list(&mut self, gc: usize) -> (u64, BTreeMap<u64, Listed>) {
            let listed = self.store.clone();
            for _ in 0..gc {
                self.collect_step();
            }
            (self.marker, listed)
        }

        fn seal(&mut self, deletions: usize) {
            let (floor, mut listed) = self.list(deletions);
            for _ in 0..64 {
                match plan(floor, &listed) {
                    Plan::Sealed { .. } => return,
                    Plan::SealAt(seq) => match self.store.get(&seq).copied() {
                        None => {
                            self.store.insert(seq, Listed::Seal);
                            return;
                        }
                        Some(found) => match after_refused(seq, found) {
                            AfterRefused::Sealed { .. } => return,
                            AfterRefused::PlanAgain => {
                                listed.insert(seq, found);
                            }
                        },
                    },
                }
            }
            panic!("sealing did not end");
        }

        /// What a reader listing now counts: the slots from the floor to
        /// the first seal.
        fn counted(&mut self) -> Option<(u64, u64)> {
            let (floor, listed) = self.list(0);
            log_end(floor, &listed).map(|end| (floor, end))
        }
    }

    proptest! {
        /// No acknowledged group is lost and nothing refused counts: after
        /// any interleaving of pipelined PUTs, lost attempts, racing
        /// sealers and garbage collection of checkpointed slots (deletions
        /// interleaved with the sealers' listings), once the writer has
        /// heard every answer, the slots a reader counts are exactly the
        /// slots the writer acknowledged and nobody collected, every other
        /// slot the writer sent is not committed, and a zombie's next slot
        /// after all that still hits the seal.
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
                    Step::Seal(deletions) => {
                        world.seal(deletions);
                        // A reader that lists right now must already see
                        // every slot that will count: all present from the
                        // floor to the seal, which never moves.
                        let (floor, end) = world.counted().expect("just sealed");
                        for seq in floor..end {
                            prop_assert_eq!(world.store.get(&seq), Some(&Listed::Segment));
                        }
                        ends.push(end);
                    }
                    Step::Checkpoint => {
                        world.collectable = verdict(0, &world.writer).acked_below;
                    }
                    Step::Collect => world.collect(),
                    Step::Delete => world.delete_one(),
                    _ => {}
                }
                // Mid-run: nothing acknowledged is ever outside what a
                // reader would count once the lane is sealed, unless it was
                // collected after its checkpoint.
                let verdict = verdict(0, &world.writer);
                for seq in world.marker..verdict.acked_below {
                    prop_assert_eq!(world.store.get(&seq), Some(&Listed::Segment));
                }
                prop_assert!(world.marker <= world.collectable);
            }
            // The writer resends every open slot (same bytes), then a
            // successor seals the lane.
            for seq in std::mem::take(&mut world.pending) {
                world.land(seq);
            }
            world.seal(1);
            let (floor, end) = world.counted().expect("sealed");
            for earlier in ends {
                prop_assert_eq!(earlier, end, "a reader before the last landing saw another end");
            }
            let verdict = verdict(0, &world.writer);
            for seq in 0..world.next {
                let counted = (floor..end).contains(&seq);
                match verdict.group(seq) {
                    GroupFate::Acknowledged => prop_assert!(
                        counted || seq < world.collectable,
                        "acked slot {} neither counted nor checkpointed", seq
                    ),
                    GroupFate::NotCommitted => prop_assert!(!counted, "refused slot {} counted", seq),
                    GroupFate::Waiting => prop_assert!(false, "slot {} still waiting after every answer", seq),
                }
            }
            // Counted slots are all present: no gap below the seal.
            for seq in floor..end {
                prop_assert_eq!(world.store.get(&seq), Some(&Listed::Segment));
            }
            // A zombie that wakes after all of it (deletions done too)
            // writes its next slot and finds the seal: not committed.
            while !world.deleting.is_empty() {
                world.delete_one();
            }
            let zombie = world.next;
            world.writer.insert(zombie, SlotState::InFlight);
            world.land(zombie);
            let after = crate::lane::verdict(0, &world.writer);
            prop_assert_eq!(after.group(zombie), GroupFate::NotCommitted);
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
