//! The node's lease at run time: a pure serving-mode rule and the renewal loop that keeps the lease.
//!
//! [`serving_mode`] decides, per request, how the node may serve:
//! * [`ServingMode::Live`] — before the local deadline (monotonic instant
//!   the last renewal was *sent* + lease − drift margin): owned Cells serve
//!   with zero bucket reads;
//! * [`ServingMode::SelfFenced`] — past it: each request first re-proves
//!   ownership with one fresh root read;
//! * [`ServingMode::Stopped`] — the lease was replaced by another session
//!   or retired: serve nothing.
//!
//! The renewal loop ([`LeaseKeeper::run`]) renews every `renew_every_ms`;
//! a renewal that finds another session stops the node at once. A failed
//! renewal (store unavailable) is retried on the next tick; the deadline,
//! not the failure, decides when the node self-fences.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use cellfleet_authority::{Clock, HeldLease, NodeLeases};
use tokio::sync::watch;

use crate::metrics::Metrics;

/// Whether the node holds its lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseStatus {
    /// Held (renewed until it is replaced or retired).
    Held,
    /// Another session replaced the record: stop at once.
    Replaced(String),
    /// Retired on drain.
    Retired,
}

/// How the node may serve a request now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServingMode {
    /// Lease live: serve owned Cells without reading the bucket.
    Live,
    /// Deadline passed: one fresh root read per request before serving.
    SelfFenced,
    /// Serve nothing.
    Stopped(String),
}

/// The serving rule (pure).
pub fn serving_mode(status: &LeaseStatus, deadline: Instant, now: Instant) -> ServingMode {
    match status {
        LeaseStatus::Replaced(reason) => ServingMode::Stopped(reason.clone()),
        LeaseStatus::Retired => ServingMode::Stopped("the lease was retired".to_owned()),
        LeaseStatus::Held if now < deadline => ServingMode::Live,
        LeaseStatus::Held => ServingMode::SelfFenced,
    }
}

#[derive(Debug)]
struct State {
    held: HeldLease,
    status: LeaseStatus,
}

/// The lease this node holds, shared by the renewal loop and admission.
#[derive(Debug)]
pub struct LeaseKeeper {
    leases: NodeLeases,
    clock: Arc<dyn Clock>,
    state: RwLock<State>,
    /// Tests pause renewals to simulate a stalled process.
    paused: AtomicBool,
    stop: watch::Sender<bool>,
    /// True once the lease was replaced (the node must stop serving).
    replaced: watch::Sender<bool>,
    metrics: Arc<Metrics>,
}

impl LeaseKeeper {
    pub(crate) fn new(
        leases: NodeLeases,
        clock: Arc<dyn Clock>,
        held: HeldLease,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            leases,
            clock,
            state: RwLock::new(State {
                held,
                status: LeaseStatus::Held,
            }),
            paused: AtomicBool::new(false),
            stop: watch::channel(false).0,
            replaced: watch::channel(false).0,
            metrics,
        }
    }

    fn state(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn state_mut(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    /// How the node may serve now.
    pub fn mode(&self) -> ServingMode {
        let state = self.state();
        serving_mode(
            &state.status,
            state.held.deadline,
            self.clock.now_monotonic(),
        )
    }

    /// The lease as last written.
    pub fn held(&self) -> HeldLease {
        self.state().held.clone()
    }

    /// Stops (or resumes) renewing, to simulate a paused process in tests.
    pub fn pause_renewals(&self, paused: bool) {
        self.paused.store(paused, Ordering::SeqCst);
    }

    /// Renews once now (unless paused or stopped). Returns the new status.
    pub async fn renew_now(&self) -> LeaseStatus {
        let held = {
            let state = self.state();
            if state.status != LeaseStatus::Held || self.paused.load(Ordering::SeqCst) {
                return state.status.clone();
            }
            state.held.clone()
        };
        match self.leases.renew(&held).await {
            Ok(renewed) => {
                self.metrics
                    .lease_renewals_total
                    .fetch_add(1, Ordering::Relaxed);
                let mut state = self.state_mut();
                if state.status == LeaseStatus::Held {
                    state.held = renewed;
                }
                state.status.clone()
            }
            Err(error) if error.is_fenced() => {
                tracing::error!(%error, "node lease replaced; stopping");
                let mut state = self.state_mut();
                state.status = LeaseStatus::Replaced(error.to_string());
                let _ = self.replaced.send(true);
                state.status.clone()
            }
            Err(error) => {
                // Keep serving only until the local deadline; retry next tick.
                tracing::warn!(%error, "lease renewal failed");
                self.state().status.clone()
            }
        }
    }

    /// Renews every `renew_every_ms` until stopped, replaced or retired.
    /// Spawned by the node (the renewal is a CAS and must not be cut off).
    pub async fn run(self: Arc<Self>) {
        let period = Duration::from_millis(self.leases.config().renew_every_ms);
        let mut stop = self.stop.subscribe();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(period) => {}
                _ = stop.wait_for(|stopped| *stopped) => return,
            }
            if self.renew_now().await != LeaseStatus::Held {
                return;
            }
        }
    }

    /// Resolves once the lease was replaced by another session.
    pub async fn wait_stopped(&self) {
        let mut replaced = self.replaced.subscribe();
        let _ = replaced.wait_for(|replaced| *replaced).await;
    }

    /// Retires the lease (after every Cell was released) and stops renewing.
    pub async fn retire(&self) -> crate::Result<()> {
        let _ = self.stop.send(true);
        let held = self.held();
        self.leases.retire(&held).await?;
        self.state_mut().status = LeaseStatus::Retired;
        Ok(())
    }

    /// Stops renewing without retiring (shutdown of a test node).
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deadline_and_status_decide_the_mode() {
        let now = Instant::now();
        let later = now + Duration::from_millis(10);
        assert_eq!(
            serving_mode(&LeaseStatus::Held, later, now),
            ServingMode::Live
        );
        assert_eq!(
            serving_mode(&LeaseStatus::Held, now, now),
            ServingMode::SelfFenced
        );
        assert_eq!(
            serving_mode(&LeaseStatus::Held, now, later),
            ServingMode::SelfFenced
        );
        assert!(matches!(
            serving_mode(&LeaseStatus::Replaced("x".into()), later, now),
            ServingMode::Stopped(_)
        ));
        assert!(matches!(
            serving_mode(&LeaseStatus::Retired, later, now),
            ServingMode::Stopped(_)
        ));
    }
}
