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
//! The renewal loop ([`LeaseKeeper::run`]) sends a renewal every
//! `renew_every_ms`, counted from the last one's send ([`next_renewal`]);
//! a renewal that finds another session stops the node at once. A failed
//! renewal (store unavailable) is retried after a quarter period; the
//! deadline, not the failure, decides when the node self-fences. Every
//! renewal's time is measured (`cellfleet_runtime_lease_renewal_seconds`)
//! and one taking half a period or more is logged.
//!
//! **A lapse is never forgotten.** A renewal whose reply arrives at or after
//! the deadline it replaces (the node was paused, cut off, or the store was
//! slow) succeeds when nobody touched the record, but for a while the record
//! looked expired and any node may have taken a Cell over. Such a renewal
//! starts a new *term* ([`term_after_renewal`]). Ownership proven under an
//! older term (an open actor, a parked root) is not trusted again until one
//! fresh root read re-proves it under the current term ([`cell_mode`]); a
//! renewal answered before the deadline keeps the term, so the warm path
//! keeps its zero bucket reads.

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

/// The node-wide serving rule (pure).
pub fn serving_mode(status: &LeaseStatus, deadline: Instant, now: Instant) -> ServingMode {
    match status {
        LeaseStatus::Replaced(reason) => ServingMode::Stopped(reason.clone()),
        LeaseStatus::Retired => ServingMode::Stopped("the lease was retired".to_owned()),
        LeaseStatus::Held if now < deadline => ServingMode::Live,
        LeaseStatus::Held => ServingMode::SelfFenced,
    }
}

/// The term after a renewal answered at `answered` replaced a lease whose
/// deadline was `previous_deadline` (pure). Answered before the deadline:
/// the record never looked expired to another node (they judge it by its
/// expiry plus the margin, later than our deadline), so the term holds.
/// Answered at or after it: there was a gap, the next term begins.
pub fn term_after_renewal(term: u64, previous_deadline: Instant, answered: Instant) -> u64 {
    if answered < previous_deadline {
        term
    } else {
        term + 1
    }
}

/// When the next renewal is sent (pure). After a renewal that committed:
/// one period after it was *sent*, so a slow answer does not also delay
/// the next send by its own length (the gap between two sends is the
/// longer of the period and the answer time, not their sum; a lapse needs
/// that gap plus the next answer time to reach the lease). After a failed
/// one: a quarter period after the answer, not a whole period.
pub fn next_renewal(sent: Instant, answered: Instant, renewed: bool, period: Duration) -> Instant {
    if renewed {
        sent + period
    } else {
        answered + period / 4
    }
}

/// How one Cell may serve (pure): the node's mode, narrowed by the term
/// under which this node last proved it owns the Cell. Proven under an
/// older term, a Live node must re-prove first (one root read), as a
/// self-fenced one always does.
pub fn cell_mode(node: ServingMode, term: u64, proven_term: u64) -> ServingMode {
    match node {
        ServingMode::Live if proven_term < term => ServingMode::SelfFenced,
        mode => mode,
    }
}

#[derive(Debug)]
struct State {
    held: HeldLease,
    status: LeaseStatus,
    /// Continuity term: one more after every lapse (see the module doc).
    term: u64,
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
    /// Held across a renewal's write and across retirement, so a retire
    /// never writes against an ETag that a renewal in flight replaces.
    writing: tokio::sync::Mutex<()>,
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
                term: 0,
            }),
            paused: AtomicBool::new(false),
            stop: watch::channel(false).0,
            replaced: watch::channel(false).0,
            metrics,
            writing: tokio::sync::Mutex::new(()),
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
        self.mode_and_term().0
    }

    /// How the node may serve now, and the current term, read together.
    pub fn mode_and_term(&self) -> (ServingMode, u64) {
        let state = self.state();
        let mode = serving_mode(
            &state.status,
            state.held.deadline,
            self.clock.now_monotonic(),
        );
        (mode, state.term)
    }

    /// The current continuity term (0 at start; one more after each lapse).
    pub fn term(&self) -> u64 {
        self.state().term
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
        self.renew_once().await.0
    }

    /// Renews once now; the new status, and whether the record was renewed.
    async fn renew_once(&self) -> (LeaseStatus, bool) {
        let _writing = self.writing.lock().await;
        let held = {
            let state = self.state();
            if state.status != LeaseStatus::Held || self.paused.load(Ordering::SeqCst) {
                return (state.status.clone(), false);
            }
            state.held.clone()
        };
        let sent = self.clock.now_monotonic();
        let outcome = self.leases.renew(&held).await;
        let took = self.clock.now_monotonic().saturating_duration_since(sent);
        self.metrics.lease_renewal_seconds.observe_duration(took);
        let config = self.leases.config();
        if took >= Duration::from_millis(config.renew_every_ms / 2) {
            tracing::warn!(
                took_ms = took.as_millis() as u64,
                renew_every_ms = config.renew_every_ms,
                lease_ms = config.lease_ms,
                ok = outcome.is_ok(),
                "lease renewal was slow (the store or this process is overloaded); the lease lapses if renewals keep taking this long"
            );
        }
        match outcome {
            Ok(renewed) => {
                self.metrics
                    .lease_renewals_total
                    .fetch_add(1, Ordering::Relaxed);
                let answered = self.clock.now_monotonic();
                let mut state = self.state_mut();
                if state.status == LeaseStatus::Held {
                    let term = term_after_renewal(state.term, state.held.deadline, answered);
                    if term != state.term {
                        self.metrics
                            .lease_lapses_total
                            .fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(
                            term,
                            "lease renewed after its deadline lapsed; every owned cell re-proves ownership before it serves again"
                        );
                    }
                    state.term = term;
                    state.held = renewed;
                }
                (state.status.clone(), true)
            }
            Err(error) if error.is_fenced() => {
                tracing::error!(%error, "node lease replaced; stopping");
                let mut state = self.state_mut();
                state.status = LeaseStatus::Replaced(error.to_string());
                let _ = self.replaced.send(true);
                (state.status.clone(), false)
            }
            Err(error) => {
                // Keep serving only until the local deadline; retry soon.
                tracing::warn!(%error, "lease renewal failed");
                (self.state().status.clone(), false)
            }
        }
    }

    /// Renews every `renew_every_ms` (timed by [`next_renewal`]) until
    /// stopped, replaced or retired. Spawned by the node (the renewal is a
    /// CAS and must not be cut off).
    pub async fn run(self: Arc<Self>) {
        let period = Duration::from_millis(self.leases.config().renew_every_ms);
        let mut stop = self.stop.subscribe();
        let mut next = tokio::time::Instant::now() + period;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(next) => {}
                _ = stop.wait_for(|stopped| *stopped) => return,
            }
            let sent = tokio::time::Instant::now();
            let (status, renewed) = self.renew_once().await;
            if status != LeaseStatus::Held {
                return;
            }
            let answered = tokio::time::Instant::now();
            next = next_renewal(sent.into_std(), answered.into_std(), renewed, period).into();
        }
    }

    /// Begins ending this session because a successor sealed its log
    /// (the node was paused or cut off past its lease): from now on
    /// nothing is admitted. `false` when the lease was already replaced or
    /// retired. [`LeaseKeeper::end_session`] finishes.
    pub fn begin_end(&self, reason: String) -> bool {
        let mut state = self.state_mut();
        if state.status != LeaseStatus::Held {
            return false;
        }
        tracing::error!(%reason, "this node's session ended; stopping");
        state.status = LeaseStatus::Replaced(reason);
        true
    }

    /// Finishes ending the session: every Cell is fenced (through
    /// [`LeaseKeeper::wait_stopped`]), renewals stop, and the lease record
    /// is retired so the session's Cells move at once instead of after the
    /// lease.
    pub async fn end_session(&self) {
        let _ = self.replaced.send(true);
        let _ = self.stop.send(true);
        let _writing = self.writing.lock().await;
        let held = self.held();
        if let Err(error) = self.leases.retire(&held).await {
            tracing::warn!(%error, "retiring the ended session's lease failed; its cells move once it expires");
        }
    }

    /// Why the node stopped serving, once it did (its lease replaced or
    /// its session ended).
    pub fn stop_reason(&self) -> Option<String> {
        match &self.state().status {
            LeaseStatus::Replaced(reason) => Some(reason.clone()),
            _ => None,
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
        // A renewal in flight finishes first: its new ETag is the one to
        // retire.
        let _writing = self.writing.lock().await;
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
    use proptest::prelude::*;

    const LEASE_MS: u64 = 1_000;
    const MARGIN_MS: u64 = 100;

    #[derive(Clone, Debug)]
    enum Step {
        /// Time passes.
        Advance(u64),
        /// A renewal is sent now, lands `land` ms later and is answered
        /// `answer` ms after that.
        Renew { land: u64, answer: u64 },
        /// A root read proves the Cell ours now.
        Prove,
        /// A request for the Cell arrives now.
        Serve,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0..1_500u64).prop_map(Step::Advance),
            (0..800u64, 0..800u64).prop_map(|(land, answer)| Step::Renew { land, answer }),
            Just(Step::Prove),
            Just(Step::Serve),
        ]
    }

    proptest! {
        /// Against a model of what other nodes see (the record's expiry, as
        /// it was replaced at each renewal's landing): whenever the rules say
        /// a Cell serves Live at `t`, no other node could have taken it over
        /// since the root read that proved it ours, however renewals are
        /// delayed, lost in flight or answered after a pause.
        #[test]
        fn live_serving_never_spans_a_moment_another_node_could_take_over(
            steps in proptest::collection::vec(step(), 1..60)
        ) {
            let base = Instant::now();
            let at = |ms: u64| base + Duration::from_millis(ms);
            let mut now = 0u64;
            // What others judge by: (from, expiry) pieces of the record.
            let mut record: Vec<(u64, u64)> = vec![(0, LEASE_MS)];
            // The keeper: deadline from the send time, and the term.
            let mut deadline = LEASE_MS - MARGIN_MS;
            let mut term = 0u64;
            let (mut proven_at, mut proven_term) = (0u64, 0u64);
            for step in steps {
                match step {
                    Step::Advance(ms) => now += ms,
                    Step::Renew { land, answer } => {
                        let sent = now;
                        record.push((sent + land, sent + LEASE_MS));
                        now = sent + land + answer;
                        term = term_after_renewal(term, at(deadline), at(now));
                        deadline = sent + LEASE_MS - MARGIN_MS;
                    }
                    Step::Prove => {
                        proven_at = now;
                        proven_term = proven_term.max(term);
                    }
                    Step::Serve => {
                        let node = serving_mode(&LeaseStatus::Held, at(deadline), at(now));
                        if cell_mode(node, term, proven_term) != ServingMode::Live {
                            continue;
                        }
                        // Could another node's wall clock (up to the margin
                        // ahead) have passed the record's expiry plus the
                        // margin at some moment in [proven_at, now]?
                        for (index, &(from, expiry)) in record.iter().enumerate() {
                            // The piece holds over [from, until).
                            let until = record.get(index + 1).map_or(u64::MAX, |next| next.0);
                            let (low, high) = (from.max(proven_at), until.saturating_sub(1).min(now));
                            prop_assert!(
                                low > high || high <= expiry,
                                "served live at {now} (proven at {proven_at}) although the \
                                 record expired at {expiry} during [{low}, {high}]"
                            );
                        }
                    }
                }
            }
        }
    }

    proptest! {
        /// For any sequence of answer times, renewals timed by
        /// [`next_renewal`] lapse at none of the renewals where the old
        /// timing (a whole period after each answer) did not: the gap
        /// between two sends is never longer, and a lapse is a gap plus
        /// an answer time reaching the lease minus the margin.
        #[test]
        fn renewals_timed_from_their_send_lapse_no_more_than_from_their_answer(
            answers in proptest::collection::vec((0..4_000u64, proptest::bool::weighted(0.8)), 1..40)
        ) {
            const PERIOD_MS: u64 = 333;
            let base = Instant::now();
            let at = |ms: u64| base + Duration::from_millis(ms);
            let period = Duration::from_millis(PERIOD_MS);
            // (next send, deadline) under each timing; both start alike.
            let mut new = (PERIOD_MS, LEASE_MS - MARGIN_MS);
            let mut old = new;
            for (index, &(answer_ms, renewed)) in answers.iter().enumerate() {
                let mut lapses = [false; 2];
                for (which, (send, deadline)) in [&mut new, &mut old].into_iter().enumerate() {
                    let answered = *send + answer_ms;
                    lapses[which] = renewed && answered >= *deadline;
                    if renewed {
                        *deadline = *send + LEASE_MS - MARGIN_MS;
                    }
                    *send = if which == 0 {
                        let next = next_renewal(at(*send), at(answered), renewed, period);
                        // A send time already past is sent at once.
                        (next.duration_since(base).as_millis() as u64).max(answered)
                    } else {
                        answered + PERIOD_MS
                    };
                }
                prop_assert!(
                    !lapses[0] || lapses[1],
                    "renewal {index} lapsed timed from its send but not from its answer"
                );
                prop_assert!(new.0 <= old.0, "renewal {index}: the next send is later");
            }
        }
    }

    #[test]
    fn the_next_renewal_follows_the_send_when_renewed_and_the_answer_soon_when_not() {
        let sent = Instant::now();
        let period = Duration::from_millis(3_000);
        let slow = sent + Duration::from_millis(2_000);
        assert_eq!(
            next_renewal(sent, slow, true, period),
            sent + Duration::from_millis(3_000)
        );
        assert_eq!(
            next_renewal(sent, slow, false, period),
            slow + Duration::from_millis(750)
        );
    }

    #[test]
    fn a_renewal_answered_at_or_after_the_deadline_starts_a_new_term() {
        let now = Instant::now();
        let later = now + Duration::from_millis(1);
        assert_eq!(term_after_renewal(4, later, now), 4);
        assert_eq!(term_after_renewal(4, now, now), 5);
        assert_eq!(term_after_renewal(4, now, later), 5);
        assert_eq!(cell_mode(ServingMode::Live, 5, 4), ServingMode::SelfFenced);
        assert_eq!(cell_mode(ServingMode::Live, 5, 5), ServingMode::Live);
        assert_eq!(
            cell_mode(ServingMode::SelfFenced, 5, 5),
            ServingMode::SelfFenced
        );
    }

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
