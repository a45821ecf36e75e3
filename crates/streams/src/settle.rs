//! Settling a command whose outcome is unknown before the HTTP client hears of it.
//!
//! The Durable Streams protocol has no command ids: the front end makes one
//! per request, so only the front end can settle an ambiguous outcome. It
//! sends the *same* command again (same id, same expiry) — the Cell's
//! ledger answers a command that already ran with its stored outcome, so a
//! retry never appends twice — and answers the client only once the fate
//! is definite, or, after a bounded number of attempts, says honestly that
//! it is unknown. A "not run" answer after an unknown one proves nothing
//! about the earlier attempt, so it never ends the doubt.

use std::time::Duration;

use crate::backend::BackendError;

/// Attempts of one command in all (the first included).
pub const ATTEMPTS_MAX: u32 = 6;
/// Retries stop once this much time has passed since the first attempt.
pub const WINDOW: Duration = Duration::from_secs(15);
/// The wait before the first retry; it doubles up to [`BACKOFF_MAX`].
pub const BACKOFF_FIRST: Duration = Duration::from_millis(100);
/// The longest wait between two attempts.
pub const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// What one attempt's result says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// An outcome (applied or rejected) came back: definite.
    Done,
    /// The command may or may not have run.
    Unknown,
    /// It did not run this time (or failed some other definite way).
    NotRun,
}

/// What to do after an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Answer the client with this attempt's result.
    Answer,
    /// Send the same command again after this wait.
    RetryAfter(Duration),
    /// Answer that the outcome is unknown.
    GiveUpUnknown,
}

/// Classifies a backend result.
pub fn classify<T>(result: &Result<T, BackendError>) -> Attempt {
    match result {
        Ok(_) => Attempt::Done,
        Err(BackendError::UnknownOutcome(_)) => Attempt::Unknown,
        Err(_) => Attempt::NotRun,
    }
}

/// The decision after attempt number `attempt` (1-based), `elapsed` after
/// the first began, given whether any attempt so far was unknown (pure).
pub fn next(attempt: u32, elapsed: Duration, result: Attempt, in_doubt: bool) -> Next {
    if result == Attempt::Done {
        return Next::Answer;
    }
    if !in_doubt && result == Attempt::NotRun {
        return Next::Answer;
    }
    if attempt >= ATTEMPTS_MAX || elapsed >= WINDOW {
        return Next::GiveUpUnknown;
    }
    let doublings = attempt.saturating_sub(1).min(16);
    Next::RetryAfter((BACKOFF_FIRST * 2u32.pow(doublings)).min(BACKOFF_MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn attempt_strategy() -> impl Strategy<Value = Attempt> {
        prop_oneof![
            Just(Attempt::Done),
            Just(Attempt::Unknown),
            Just(Attempt::NotRun)
        ]
    }

    proptest! {
        /// Over any run of attempt results: the client hears a "not run"
        /// error only if no attempt was unknown; attempts and time are
        /// bounded; a definite outcome is always answered.
        #[test]
        fn doubt_is_only_ended_by_an_outcome(
            results in proptest::collection::vec(attempt_strategy(), 1..20),
            step_ms in 0u64..5_000,
        ) {
            let mut in_doubt = false;
            let mut elapsed = Duration::ZERO;
            for (index, result) in results.into_iter().enumerate() {
                let attempt = index as u32 + 1;
                in_doubt |= result == Attempt::Unknown;
                match next(attempt, elapsed, result, in_doubt) {
                    Next::Answer => {
                        prop_assert!(result == Attempt::Done || (result == Attempt::NotRun && !in_doubt));
                        return Ok(());
                    }
                    Next::GiveUpUnknown => {
                        prop_assert!(in_doubt);
                        prop_assert!(attempt >= ATTEMPTS_MAX || elapsed >= WINDOW);
                        return Ok(());
                    }
                    Next::RetryAfter(wait) => {
                        prop_assert!(in_doubt);
                        prop_assert!(attempt < ATTEMPTS_MAX);
                        prop_assert!(wait <= BACKOFF_MAX);
                        elapsed += wait + Duration::from_millis(step_ms);
                    }
                }
            }
        }
    }
}
