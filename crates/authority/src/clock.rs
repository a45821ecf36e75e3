//! Injected time: wall-clock milliseconds for records others judge, a monotonic instant for local deadlines.

use std::fmt::Debug;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A source of time. Production uses [`SystemClock`]; tests use [`ManualClock`]
/// so lease expiry and takeovers are tested without sleeping.
pub trait Clock: Send + Sync + Debug {
    /// Wall-clock milliseconds since the Unix epoch (written into records and
    /// compared across nodes, so nodes need synchronized clocks: skew must
    /// stay below the lease drift margin).
    fn now_wall_ms(&self) -> u64;

    /// A monotonic instant (local deadlines only; never leaves the process).
    fn now_monotonic(&self) -> Instant;
}

/// The operating system's clocks.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_wall_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }

    fn now_monotonic(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that moves only when told to.
#[derive(Debug)]
pub struct ManualClock {
    base: Instant,
    state: Mutex<ManualState>,
}

#[derive(Debug)]
struct ManualState {
    wall_ms: u64,
    elapsed: Duration,
}

impl ManualClock {
    /// A clock reading `wall_ms` on the wall.
    pub fn new(wall_ms: u64) -> Self {
        Self {
            base: Instant::now(),
            state: Mutex::new(ManualState {
                wall_ms,
                elapsed: Duration::ZERO,
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ManualState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Moves both clocks forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut state = self.state();
        state.wall_ms = state
            .wall_ms
            .saturating_add(u64::try_from(by.as_millis()).unwrap_or(u64::MAX));
        state.elapsed += by;
    }

    /// Sets the wall clock alone (simulates skew or an NTP step).
    pub fn set_wall_ms(&self, wall_ms: u64) {
        self.state().wall_ms = wall_ms;
    }
}

impl Clock for ManualClock {
    fn now_wall_ms(&self) -> u64 {
        self.state().wall_ms
    }

    fn now_monotonic(&self) -> Instant {
        self.base + self.state().elapsed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(1_000);
        let start = clock.now_monotonic();
        assert_eq!(clock.now_wall_ms(), 1_000);
        clock.advance(Duration::from_millis(250));
        assert_eq!(clock.now_wall_ms(), 1_250);
        assert_eq!(clock.now_monotonic() - start, Duration::from_millis(250));
        clock.set_wall_ms(5);
        assert_eq!(clock.now_wall_ms(), 5);
        assert_eq!(clock.now_monotonic() - start, Duration::from_millis(250));
    }
}
