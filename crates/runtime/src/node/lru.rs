//! Which open Cell to passivate: the least recently used idle ones, found by one scan and handed out oldest first.
//!
//! Every activation past `cells_open_max` passivates one idle Cell. Finding
//! the least recently used one scanned every open Cell, so at 4,096 open
//! Cells each creation of a new Cell visited 4,096 slots (a tenth of a
//! node's samples while it created streams; BENCHMARKS.md, twenty-second
//! measurement). A scan now keeps the [`CANDIDATES_PER_SCAN`] oldest idle
//! Cells, each with the last use it saw, and the next claims take them in
//! order until they run out.
//!
//! A candidate is taken only while it still has that last use, is idle
//! and is the same actor ([`still_the_oldest`]). Every Cell left out of
//! the scan was used later than every candidate, and last uses only grow,
//! so a candidate that passes is the one a full scan would pick, but for
//! one case: a Cell that was busy during the scan and went idle since is
//! not seen until the next scan, though its last use may be older. It was
//! serving a moment ago, so it is the better one to keep open.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// Candidates one scan keeps: a scan visits every open Cell, so this many
/// claims share its cost.
pub(super) const CANDIDATES_PER_SCAN: usize = 64;

/// One idle Cell a scan found: its last use then, and what it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Candidate<T> {
    pub last_used: u64,
    pub what: T,
}

/// Orders candidates by last use alone, for the heap.
struct ByLastUse<T>(Candidate<T>);

impl<T> PartialEq for ByLastUse<T> {
    fn eq(&self, other: &Self) -> bool {
        self.0.last_used == other.0.last_used
    }
}

impl<T> Eq for ByLastUse<T> {}

impl<T> PartialOrd for ByLastUse<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<T> Ord for ByLastUse<T> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.last_used.cmp(&other.0.last_used)
    }
}

/// The `keep` least recently used of `idle`, the oldest last (so `pop`
/// takes it first). One pass, at most `keep + 1` held at once.
pub(super) fn oldest<T>(
    idle: impl Iterator<Item = Candidate<T>>,
    keep: usize,
) -> Vec<Candidate<T>> {
    if keep == 0 {
        return Vec::new();
    }
    // A max-heap of the oldest so far: its top is the newest of them,
    // the one a still older Cell replaces.
    let mut heap = BinaryHeap::with_capacity(keep + 1);
    for candidate in idle {
        if heap.len() < keep {
            heap.push(ByLastUse(candidate));
        } else if heap
            .peek()
            .is_some_and(|newest: &ByLastUse<T>| candidate.last_used < newest.0.last_used)
        {
            heap.pop();
            heap.push(ByLastUse(candidate));
        }
    }
    // Ascending, then reversed: newest first, oldest last.
    let mut kept: Vec<Candidate<T>> = heap.into_sorted_vec().into_iter().map(|c| c.0).collect();
    kept.reverse();
    kept
}

/// Whether a candidate may be claimed now: the slot holds the same actor
/// (`generation`), it is idle and not already passivating, and nothing
/// used it since the scan (its last use is unchanged).
pub(super) fn still_the_oldest(
    candidate_last_used: u64,
    candidate_generation: u64,
    generation: u64,
    last_used: u64,
    idle: bool,
) -> bool {
    generation == candidate_generation && idle && last_used == candidate_last_used
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The kept candidates are exactly the `keep` least recently used,
        /// and `pop` takes them from the oldest.
        #[test]
        fn keeps_the_least_recently_used_oldest_last(
            uses in proptest::collection::hash_set(0u64..10_000, 0..300),
            keep in 0usize..80,
        ) {
            let uses: Vec<u64> = uses.into_iter().collect();
            let candidates = uses.iter().enumerate().map(|(i, &last_used)| Candidate {
                last_used,
                what: i,
            });
            let mut kept = oldest(candidates, keep);
            let mut expected = uses.clone();
            expected.sort_unstable();
            expected.truncate(keep);
            let mut popped = Vec::new();
            while let Some(candidate) = kept.pop() {
                prop_assert_eq!(uses[candidate.what], candidate.last_used);
                popped.push(candidate.last_used);
            }
            prop_assert_eq!(popped, expected);
        }
    }

    #[test]
    fn a_candidate_used_replaced_or_busy_since_the_scan_is_not_taken() {
        assert!(still_the_oldest(7, 3, 3, 7, true));
        assert!(!still_the_oldest(7, 3, 3, 8, true), "used since");
        assert!(!still_the_oldest(7, 3, 4, 7, true), "another actor");
        assert!(!still_the_oldest(7, 3, 3, 7, false), "busy");
    }
}
