//! Where a group executes (pure): on the actor's own task, or on the blocking pool.
//!
//! The blocking pool costs two thread hand-offs per group, there and back.
//! At one command per group they were about half of a command's execute
//! phase (BENCHMARKS.md, thirty-second measurement). So a group whose
//! engine time is sure to be short runs on the actor's task, as a light
//! confirm does, and any other one on the pool. A Cell's SQLite never
//! syncs a file (its state is durable in the bucket), so a group's
//! time is the engine's work and page-cache copies, which the Cell's own
//! last group measures.
//!
//! The estimate is the engine time per command of the Cell's last group,
//! times the commands of this one. A Cell with no group measured yet
//! (just opened: its first group may migrate or upgrade it) uses the pool,
//! and so does any group over `commands_max`. A group that ran long on the
//! task makes the next estimate long, so a Cell whose work changes holds a
//! runtime worker for at most one group before it moves to the pool.

use std::time::Duration;

/// Bounds on the groups that run on the actor's task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct InlineRule {
    /// Most commands in a group run on the task; 0 runs every group on
    /// the blocking pool.
    pub commands_max: usize,
    /// Longest estimated engine time of a group run on the task.
    pub budget: Duration,
}

impl InlineRule {
    /// Whether a group of `commands` runs on the actor's task, given the
    /// engine time per command of the Cell's last group (`None`: none
    /// measured yet).
    pub(crate) fn runs_inline(&self, commands: usize, per_command: Option<Duration>) -> bool {
        let Some(per_command) = per_command else {
            return false;
        };
        if commands == 0 || commands > self.commands_max {
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rules() -> impl Strategy<Value = InlineRule> {
        (0usize..64, 0u64..2_000).prop_map(|(commands_max, budget_us)| InlineRule {
            commands_max,
            budget: Duration::from_micros(budget_us),
        })
    }

    fn costs() -> impl Strategy<Value = Option<Duration>> {
        prop::option::of((0u64..5_000_000).prop_map(Duration::from_nanos))
    }

    proptest! {
        /// Inline only with a measured Cell, within `commands_max`, and an
        /// estimate within the budget; a rule of `commands_max = 0` never.
        #[test]
        fn inline_only_within_every_bound(rule in rules(), commands in 0usize..100, cost in costs()) {
            let inline = rule.runs_inline(commands, cost);
            if inline {
                let cost = cost.expect("a measured Cell");
                prop_assert!(commands >= 1 && commands <= rule.commands_max);
                prop_assert!(cost * u32::try_from(commands).unwrap() <= rule.budget);
            }
            if cost.is_none() || rule.commands_max == 0 {
                prop_assert!(!inline);
            }
        }

        /// Whatever runs inline, a smaller group or a cheaper Cell does too.
        #[test]
        fn smaller_or_cheaper_groups_stay_inline(
            rule in rules(),
            commands in 1usize..100,
            fewer in 1usize..100,
            cost in costs(),
            cheaper_ns in 0u64..5_000_000,
        ) {
            if rule.runs_inline(commands, cost) {
                let cost = cost.expect("a measured Cell");
                let fewer = fewer.min(commands);
                let cheaper = cost.min(Duration::from_nanos(cheaper_ns));
                prop_assert!(rule.runs_inline(fewer, Some(cost)));
                prop_assert!(rule.runs_inline(commands, Some(cheaper)));
            }
        }

        /// A group estimated within the budget and bounds runs inline (the
        /// rule refuses nothing it need not).
        #[test]
        fn every_group_within_the_bounds_runs_inline(rule in rules(), commands in 1usize..100, cost in costs()) {
            if let Some(cost) = cost {
                if commands <= rule.commands_max
                    && cost * u32::try_from(commands).unwrap() <= rule.budget
                {
                    prop_assert!(rule.runs_inline(commands, Some(cost)));
                }
            }
        }

        /// A group that ran past the budget keeps the Cell's next group of
        /// as many commands off the task (over by at least one nanosecond
        /// per command: the per-command time rounds down).
        #[test]
        fn a_long_group_moves_the_next_to_the_pool(rule in rules(), commands in 1usize..100, extra_ns in 0u64..1_000_000) {
            let over = Duration::from_nanos(commands as u64 + extra_ns);
            let took = rule.budget + over;
            prop_assert!(!rule.runs_inline(commands, Some(per_command(took, commands))));
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
}
