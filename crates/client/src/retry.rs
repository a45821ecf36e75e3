//! The retry rule (pure): after a failed attempt, send the same request again, settle a command by resolving it, or fail.
//!
//! A command is always re-sent with the *same* signed envelope (the same
//! command id), so a retry can never apply it twice: the Cell's ledger
//! answers a second delivery with the stored outcome. What the rule must
//! never do is report a definite failure for a command that may have
//! applied: once any attempt may have been delivered, the command is "in
//! doubt" and the only ways out are an outcome or a resolve.

use std::time::Duration;

/// Bounds on one call's retries.
///
/// ```
/// use std::time::Duration;
/// use cellfleet_client::retry::RetryPolicy;
///
/// // Give up sooner than the default (30 s) in an interactive tool.
/// let policy = RetryPolicy {
///     budget: Duration::from_secs(5),
///     ..RetryPolicy::default()
/// };
/// assert_eq!(policy.backoff(1), Duration::from_millis(25));
/// assert_eq!(policy.backoff(2), Duration::from_millis(50));
/// assert_eq!(policy.backoff(30), policy.backoff_max);
/// assert_eq!(RetryPolicy::once().attempts, 1);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts at most, the first included (at least 1).
    pub attempts: u32,
    /// Time from the first attempt after which no retry starts.
    pub budget: Duration,
    /// The first backoff; it doubles with each attempt.
    pub backoff_min: Duration,
    /// The longest backoff.
    pub backoff_max: Duration,
    /// Deadline of one attempt.
    pub attempt_timeout: Duration,
}

impl Default for RetryPolicy {
    /// Up to 32 attempts within 30 s, backoff 25 ms doubling to 1 s, 10 s
    /// per attempt: the budget, not the count, ends the retries, and it
    /// rides out an owner's lease expiry and takeover (5 s leases in `dev`).
    fn default() -> Self {
        RetryPolicy {
            attempts: 32,
            budget: Duration::from_secs(30),
            backoff_min: Duration::from_millis(25),
            backoff_max: Duration::from_secs(1),
            attempt_timeout: Duration::from_secs(10),
        }
    }
}

impl RetryPolicy {
    /// A single attempt, no retries.
    pub fn once() -> Self {
        RetryPolicy {
            attempts: 1,
            ..RetryPolicy::default()
        }
    }

    /// The pause after attempt number `attempt` (1-based) failed.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(20);
        self.backoff_min
            .saturating_mul(1u32 << doublings)
            .min(self.backoff_max)
    }
}

/// A failed attempt as the rule sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The same request may be sent again.
    pub retry_safe: bool,
    /// The attempt may have applied the command.
    pub maybe_applied: bool,
    /// The node asked to wait this long first.
    pub retry_after: Option<Duration>,
}

impl Failure {
    /// The rule's view of `error`.
    pub fn of(error: &crate::Error) -> Failure {
        Failure {
            retry_safe: error.retry_safe(),
            maybe_applied: error.maybe_applied(),
            retry_after: error.retry_after(),
        }
    }
}

/// What to do after a failed attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Send the same request again after this pause.
    Retry {
        /// The pause.
        after: Duration,
    },
    /// The command may have applied and no retry is left: ask the cluster
    /// what became of it (resolve with its expiry).
    Resolve,
    /// Report this failure: nothing was applied.
    Fail,
}

fn retry_within(
    policy: &RetryPolicy,
    attempt: u32,
    elapsed: Duration,
    failure: Failure,
) -> Option<Step> {
    if !failure.retry_safe {
        return None;
    }
    let after = policy
        .backoff(attempt)
        .max(failure.retry_after.unwrap_or_default());
    (attempt < policy.attempts && elapsed.saturating_add(after) < policy.budget)
        .then_some(Step::Retry { after })
}

/// The rule for a command: `attempt` attempts made (the failed one
/// included), `elapsed` since the first, `in_doubt` when an earlier attempt
/// may have applied.
///
/// ```
/// use std::time::Duration;
/// use cellfleet_client::retry::{after_command_failure, Failure, RetryPolicy, Step};
///
/// let policy = RetryPolicy::default();
/// // The connection broke after the request was sent: it may have applied.
/// let broken = Failure { retry_safe: true, maybe_applied: true, retry_after: None };
/// assert!(matches!(
///     after_command_failure(&policy, 1, Duration::ZERO, false, broken),
///     Step::Retry { .. }
/// ));
/// // Out of budget while in doubt: resolve, never a definite failure.
/// assert_eq!(
///     after_command_failure(&policy, 2, Duration::from_secs(60), true, broken),
///     Step::Resolve
/// );
/// // Refused before anything ran (e.g. a bad signature): fail.
/// let refused = Failure { retry_safe: false, maybe_applied: false, retry_after: None };
/// assert_eq!(
///     after_command_failure(&policy, 1, Duration::ZERO, false, refused),
///     Step::Fail
/// );
/// ```
pub fn after_command_failure(
    policy: &RetryPolicy,
    attempt: u32,
    elapsed: Duration,
    in_doubt: bool,
    failure: Failure,
) -> Step {
    if let Some(retry) = retry_within(policy, attempt, elapsed, failure) {
        return retry;
    }
    if in_doubt || failure.maybe_applied {
        Step::Resolve
    } else {
        Step::Fail
    }
}

/// The rule for read-only calls (queries, resolves, admin listings):
/// anything retry-safe is retried within the bounds; there is nothing to
/// settle.
pub fn after_read_failure(
    policy: &RetryPolicy,
    attempt: u32,
    elapsed: Duration,
    failure: Failure,
) -> Step {
    retry_within(policy, attempt, elapsed, failure).unwrap_or(Step::Fail)
}

/// The configured endpoints found unreachable (nothing listens) since a
/// node last answered. Once that is every one of them, the cluster is
/// down or the config is wrong and a retry is pointless. Counting
/// attempts instead would give up while a node still answers: with two of
/// three nodes dead, an owner hint naming a dead node and the round robin
/// land on dead nodes three times in a row while the third node is live.
#[derive(Debug, Default)]
pub(crate) struct Unreachable {
    seen: Vec<usize>,
}

impl Unreachable {
    /// Notes an attempt on `target` and whether it was unreachable; true
    /// when every one of `endpoints` has been unreachable since the last
    /// answer. A target outside `endpoints` (an owner hint) counts towards
    /// nothing.
    pub(crate) fn all_after(
        &mut self,
        endpoints: &[String],
        target: &str,
        unreachable: bool,
    ) -> bool {
        if !unreachable {
            self.seen.clear();
            return false;
        }
        if let Some(index) = endpoints.iter().position(|e| e == target) {
            if !self.seen.contains(&index) {
                self.seen.push(index);
            }
        }
        !endpoints.is_empty() && self.seen.len() == endpoints.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Giving up on unreachable nodes happens exactly when every
        /// configured endpoint was unreachable since the last answer.
        #[test]
        fn unreachable_ends_retries_only_when_every_endpoint_is(
            endpoints in 1usize..5,
            attempts in proptest::collection::vec((0usize..6, any::<bool>()), 1..40),
        ) {
            let names: Vec<String> = (0..endpoints).map(|i| format!("n{i}:1")).collect();
            let mut tracker = Unreachable::default();
            let mut since_answer = std::collections::BTreeSet::new();
            for (target, unreachable) in attempts {
                // Targets past the configured ones stand for owner hints.
                let name = format!("n{target}:1");
                let all = tracker.all_after(&names, &name, unreachable);
                if unreachable {
                    if target < endpoints {
                        since_answer.insert(target);
                    }
                } else {
                    since_answer.clear();
                }
                prop_assert_eq!(all, since_answer.len() == endpoints);
            }
        }
    }

    #[test]
    fn two_dead_nodes_of_three_do_not_end_the_retries() {
        let names: Vec<String> = ["a:1", "b:1", "c:1"].map(String::from).to_vec();
        let mut tracker = Unreachable::default();
        // The live c hints at the dead a; a, then b, then a again by turn.
        assert!(!tracker.all_after(&names, "c:1", false));
        for target in ["a:1", "b:1", "a:1", "b:1"] {
            assert!(!tracker.all_after(&names, target, true));
        }
        assert!(tracker.all_after(&names, "c:1", true));
    }

    fn policy() -> impl Strategy<Value = RetryPolicy> {
        (1u32..12, 0u64..60_000, 1u64..200, 1u64..5_000).prop_map(|(attempts, budget, min, max)| {
            RetryPolicy {
                attempts,
                budget: Duration::from_millis(budget),
                backoff_min: Duration::from_millis(min),
                backoff_max: Duration::from_millis(max.max(min)),
                attempt_timeout: Duration::from_secs(1),
            }
        })
    }

    fn failure() -> impl Strategy<Value = Failure> {
        (
            any::<bool>(),
            any::<bool>(),
            proptest::option::of(0u64..3_000),
        )
            .prop_map(|(retry_safe, maybe_applied, after)| Failure {
                retry_safe,
                maybe_applied,
                retry_after: after.map(Duration::from_millis),
            })
    }

    proptest! {
        /// The exactly-once promise: a command that may have applied is
        /// never reported as failed; it is retried (same id) or resolved.
        #[test]
        fn a_command_in_doubt_is_never_a_definite_failure(
            policy in policy(), attempt in 1u32..20, elapsed in 0u64..90_000,
            in_doubt in any::<bool>(), failure in failure(),
        ) {
            let step = after_command_failure(
                &policy, attempt, Duration::from_millis(elapsed), in_doubt, failure);
            if in_doubt || failure.maybe_applied {
                prop_assert_ne!(step, Step::Fail);
            } else {
                prop_assert_ne!(step, Step::Resolve);
            }
        }

        /// Only retry-safe failures are retried, within the attempts and the
        /// budget, never sooner than the node asked.
        #[test]
        fn retries_are_safe_bounded_and_respect_retry_after(
            policy in policy(), attempt in 1u32..20, elapsed in 0u64..90_000,
            in_doubt in any::<bool>(), failure in failure(),
        ) {
            let elapsed = Duration::from_millis(elapsed);
            for step in [
                after_command_failure(&policy, attempt, elapsed, in_doubt, failure),
                after_read_failure(&policy, attempt, elapsed, failure),
            ] {
                if let Step::Retry { after } = step {
                    prop_assert!(failure.retry_safe);
                    prop_assert!(attempt < policy.attempts);
                    prop_assert!(elapsed + after < policy.budget);
                    prop_assert!(after >= failure.retry_after.unwrap_or_default());
                    prop_assert!(after <= policy.backoff_max.max(failure.retry_after.unwrap_or_default()));
                }
            }
            prop_assert_ne!(after_read_failure(&policy, attempt, elapsed, failure), Step::Resolve);
        }
    }

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let policy = RetryPolicy::default();
        assert_eq!(policy.backoff(1), Duration::from_millis(25));
        assert_eq!(policy.backoff(2), Duration::from_millis(50));
        assert_eq!(policy.backoff(7), Duration::from_secs(1));
        assert_eq!(policy.backoff(u32::MAX), Duration::from_secs(1));
    }
}
