//! The `capacity` workload: an offered-rate sweep of durable local commands over a pool of Cells, open loop; the capacity is the highest offered rate fully served within the p99 bound.
//!
//! A step is *served* when no request failed or was dropped (the open-loop
//! driver's in-flight bound), the achieved rate is at least
//! [`SERVED_FRACTION`] of the offered rate, and p99 (measured from each
//! request's due time, so queueing counts) is within `--capacity-p99-ms`.
//! Rates come from `--capacity-rates`, or: [`START_PER_S`] doubled until a
//! step is not served (halved down to [`LOWEST_PER_S`] until one is, when
//! the first is not), then [`REFINE_STEPS`] bisections between the highest
//! served and the lowest unserved rate. Requests go round-robin over the
//! pool's Cells, each to its owner.

use std::sync::Arc;

use serde::Serialize;

use crate::client::BenchClient;
use crate::exactness::AckLog;
use crate::load::Summary;
use crate::load::{self, Window};
use crate::workloads::{self, BenchCell};

/// Fraction of the offered rate a served step must achieve.
pub const SERVED_FRACTION: f64 = 0.95;
/// First offered rate of the automatic sweep (requests per second).
const START_PER_S: f64 = 250.0;
/// Doublings of the automatic sweep at most.
const DOUBLINGS_MAX: usize = 12;
/// The automatic sweep halves no lower than this.
const LOWEST_PER_S: f64 = 10.0;
/// Bisections after the first unserved step.
const REFINE_STEPS: usize = 2;

/// One offered rate.
#[derive(Clone, Debug, Serialize)]
pub struct CapacityStep {
    pub offered_per_s: f64,
    pub achieved_per_s: f64,
    /// Requests due in the window / not sent (in-flight bound).
    pub offered: u64,
    pub dropped: u64,
    pub served: bool,
    #[serde(flatten)]
    pub summary: Summary,
}

#[derive(Clone, Debug, Serialize)]
pub struct CapacityResult {
    pub p99_bound_ms: f64,
    pub cells: usize,
    pub steps: Vec<CapacityStep>,
    /// Highest offered rate served (`None`: not even the first).
    pub capacity_per_s: Option<f64>,
}

async fn step(
    client: &BenchClient,
    acks: &Arc<AckLog>,
    cells: &Arc<Vec<BenchCell>>,
    rate: f64,
    p99_bound_ms: f64,
    window: Window,
) -> CapacityStep {
    let (client, acks, cells) = (client.clone(), acks.clone(), cells.clone());
    let sample = load::drive_rate(
        format!("capacity {rate:.0}/s"),
        rate,
        window,
        move |sequence| {
            let (client, acks, cells) = (client.clone(), acks.clone(), cells.clone());
            async move {
                let cell = &cells[usize::try_from(sequence).unwrap_or(0) % cells.len()];
                let tag = format!("cap-r{rate:.0}-{sequence}");
                workloads::local_command(&client, &acks, cell, tag).await
            }
        },
    )
    .await;
    let summary = Summary::of_measured(&sample.total);
    let achieved = summary.throughput_per_s;
    CapacityStep {
        offered_per_s: rate,
        achieved_per_s: achieved,
        offered: sample.offered,
        dropped: sample.dropped,
        served: summary.errors == 0
            && sample.dropped == 0
            && summary.count > 0
            && achieved >= SERVED_FRACTION * rate
            && summary.p99_ms <= p99_bound_ms,
        summary,
    }
}

/// Runs the sweep over `cells`.
pub async fn run(
    client: &BenchClient,
    acks: &Arc<AckLog>,
    cells: Arc<Vec<BenchCell>>,
    rates: &[f64],
    p99_bound_ms: f64,
    window: Window,
) -> CapacityResult {
    let mut steps = Vec::new();
    if rates.is_empty() {
        let mut rate = START_PER_S;
        let mut served = None;
        let mut unserved = None;
        for _ in 0..=DOUBLINGS_MAX {
            let result = step(client, acks, &cells, rate, p99_bound_ms, window).await;
            let ok = result.served;
            steps.push(result);
            if ok {
                served = Some(rate);
                if unserved.is_some() {
                    break;
                }
                rate *= 2.0;
            } else {
                unserved = Some(rate);
                if served.is_some() || rate / 2.0 < LOWEST_PER_S {
                    break;
                }
                rate /= 2.0;
            }
        }
        if let (Some(mut low), Some(mut high)) = (served, unserved) {
            for _ in 0..REFINE_STEPS {
                let middle = ((low + high) / 2.0).round();
                let result = step(client, acks, &cells, middle, p99_bound_ms, window).await;
                if result.served {
                    low = middle;
                } else {
                    high = middle;
                }
                steps.push(result);
            }
        }
    } else {
        for &rate in rates {
            steps.push(step(client, acks, &cells, rate, p99_bound_ms, window).await);
        }
    }
    steps.sort_by(|a, b| a.offered_per_s.total_cmp(&b.offered_per_s));
    let capacity_per_s = steps
        .iter()
        .filter(|s| s.served)
        .map(|s| s.offered_per_s)
        .reduce(f64::max);
    CapacityResult {
        p99_bound_ms,
        cells: cells.len(),
        steps,
        capacity_per_s,
    }
}
