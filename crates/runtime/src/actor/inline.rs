//! Where a group or a query executes (pure): on the actor's own task, or on the blocking pool.
//!
//! The blocking pool costs two thread hand-offs per group, there and back.
//! At one command per group they were about half of a command's execute
//! phase (BENCHMARKS.md, thirty-second measurement). So a group whose
//! engine time is sure to be short runs on the actor's task, as a light
//! confirm does, and any other one on the pool. A Cell's SQLite never
//! syncs a file (its state is durable in the bucket), so a group's
//! time is the engine's work and page-cache copies, which the Cell's own
//! recent groups measure.
//!
//! The estimate is the Cell's engine time per command, times the commands
//! of this group. A Cell with no group measured yet (just opened, or its
//! last group failed: the next may migrate or upgrade it) uses the pool,
//! and so does a group over `commands_max` or `bytes_max`. A slow group
//! sets the estimate at once, and a fast one only halves it
//! ([`next_estimate`]): after a group over the budget, a Cell returns to
//! the task only after enough fast groups on the pool, so a client that
//! alternates cheap and heavy commands cannot have every heavy group run
//! on the task.
//!
//! A query follows the same rule as a group of one command, with an
//! estimate of its own: the Cell's last query's engine time. On the task
//! it also runs within a small VM-step budget, and one that needs more
//! runs again on the pool (`actor/query.rs`).

use std::time::Duration;

/// Bounds on the groups that run on the actor's task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct InlineRule {
    /// Most commands in a group run on the task; 0 runs every group on
    /// the blocking pool.
    pub commands_max: usize,
    /// Most payload bytes (names and arguments) of a group run on the task.
    pub bytes_max: usize,
    /// Longest estimated engine time of a group run on the task.
    pub budget: Duration,
}

impl InlineRule {
    /// Whether a group of `commands` carrying `bytes` runs on the actor's
    /// task, given the Cell's estimated engine time per command (`None`:
    /// nothing measured).
    pub(crate) fn runs_inline(
        &self,
        commands: usize,
        bytes: usize,
        per_command: Option<Duration>,
    ) -> bool {
        let Some(per_command) = per_command else {
            return false;
        };
        if commands == 0 || commands > self.commands_max || bytes > self.bytes_max {
            return false;
        }
        u32::try_from(commands)
            .ok()
            .and_then(|n| per_command.checked_mul(n))
            .is_some_and(|estimate| estimate <= self.budget)
    }
}

/// The engine time per command of a group of `commands` that took
/// `engine` (a group of none counts as one).
pub(crate) fn per_command(engine: Duration, commands: usize) -> Duration {
    let n = u32::try_from(commands.max(1)).unwrap_or(u32::MAX);
    engine / n
}

/// The Cell's estimate after a group measured at `measured` per command:
/// a slower group sets it, a faster one halves the old estimate at most.
pub(crate) fn next_estimate(old: Option<Duration>, measured: Duration) -> Duration {
    old.map_or(measured, |old| measured.max(old / 2))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A rule, a group and a cost per command around the rule's budget
    /// (from nothing to twice what fits), so that about half the cases
    /// run inline; `None` a tenth of the time.
    fn cases() -> impl Strategy<Value = (InlineRule, usize, usize, Option<Duration>)> {
        (
            0usize..64,
            0usize..1 << 17,
            0u64..2_000,
            0usize..80,
            0usize..1 << 17,
        )
            .prop_flat_map(|(commands_max, bytes_max, budget_us, commands, bytes)| {
                let rule = InlineRule {
                    commands_max,
                    bytes_max,
                    budget: Duration::from_micros(budget_us),
                };
                let fits_ns = budget_us * 1_000 / commands.max(1) as u64;
                let cost = prop_oneof![
                    1 => Just(None),
                    9 => (0..=2 * fits_ns + 1).prop_map(|ns| Some(Duration::from_nanos(ns))),
                ];
                (Just(rule), Just(commands), Just(bytes), cost)
            })
    }

    fn estimate(cost: Duration, commands: usize) -> Duration {
        cost * u32::try_from(commands).unwrap()
    }

    proptest! {
        /// Inline exactly when the Cell is measured, the group is within
        /// `commands_max` and `bytes_max`, and its estimate within the
        /// budget.
        #[test]
        fn inline_exactly_within_every_bound((rule, commands, bytes, cost) in cases()) {
            let within = cost.is_some_and(|cost| {
                commands >= 1
                    && commands <= rule.commands_max
                    && bytes <= rule.bytes_max
                    && estimate(cost, commands) <= rule.budget
            });
            prop_assert_eq!(rule.runs_inline(commands, bytes, cost), within);
            if rule.commands_max == 0 {
                prop_assert!(!rule.runs_inline(commands, bytes, cost));
            }
        }

        /// Whatever runs inline, a smaller, lighter or cheaper group does too.
        #[test]
        fn smaller_or_cheaper_groups_stay_inline(
            (rule, commands, bytes, cost) in cases(),
            fewer in 1usize..80,
            lighter in 0usize..1 << 17,
            cheaper_ns in 0u64..5_000_000,
        ) {
            if rule.runs_inline(commands, bytes, cost) {
                let cost = cost.expect("a measured Cell");
                let cheaper = cost.min(Duration::from_nanos(cheaper_ns));
                prop_assert!(rule.runs_inline(fewer.min(commands), bytes, Some(cost)));
                prop_assert!(rule.runs_inline(commands, lighter.min(bytes), Some(cost)));
                prop_assert!(rule.runs_inline(commands, bytes, Some(cheaper)));
            }
        }

        /// A group that ran past the budget keeps the Cell's next group of
        /// as many commands off the task (over by at least one nanosecond
        /// per command: the per-command time rounds down), whatever the
        /// estimate was before.
        #[test]
        fn a_long_group_moves_the_next_to_the_pool(
            (rule, commands, bytes, old) in cases(),
            extra_ns in 0u64..1_000_000,
        ) {
            prop_assume!(commands >= 1);
            let over = Duration::from_nanos(commands as u64 + extra_ns);
            let took = per_command(rule.budget + over, commands);
            prop_assert!(!rule.runs_inline(commands, bytes, Some(next_estimate(old, took))));
        }

        /// A fast group at most halves the estimate: after a group over the
        /// budget, a Cell needs about log2(its time over the budget) fast
        /// groups on the pool before it runs on the task again.
        #[test]
        fn fast_groups_bring_a_cell_back_only_by_halves(
            old_ns in 0u64..10_000_000,
            measured_ns in 0u64..10_000_000,
        ) {
            let old = Duration::from_nanos(old_ns);
            let measured = Duration::from_nanos(measured_ns);
            let next = next_estimate(Some(old), measured);
            prop_assert!(next >= measured);
            prop_assert!(next >= old / 2);
            prop_assert!(next == measured || next == old / 2);
            prop_assert_eq!(next_estimate(None, measured), measured);
        }
    }

    #[test]
    fn a_group_of_none_counts_as_one() {
        assert_eq!(
            per_command(Duration::from_micros(90), 0),
            Duration::from_micros(90)
        );
        assert_eq!(
            per_command(Duration::from_micros(90), 3),
            Duration::from_micros(30)
        );
    }

    #[test]
    fn a_heavy_group_keeps_a_cell_on_the_pool_for_several_fast_ones() {
        let rule = InlineRule {
            commands_max: 16,
            bytes_max: 64 << 10,
            budget: Duration::from_micros(250),
        };
        // 10 ms, then fast groups of 50 µs: at estimates of 10, 5, 2.5
        // and 1.25 ms, 625 and 312 µs six groups run on the pool; at
        // 156 µs the Cell is back on the task.
        let mut estimate =
            next_estimate(Some(Duration::from_micros(50)), Duration::from_millis(10));
        let mut on_the_pool = 0;
        while !rule.runs_inline(1, 100, Some(estimate)) {
            on_the_pool += 1;
            estimate = next_estimate(Some(estimate), Duration::from_micros(50));
        }
        assert_eq!(on_the_pool, 6);
    }
}
