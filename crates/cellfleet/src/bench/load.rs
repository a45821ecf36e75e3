//! The closed-loop load driver: C workers each keep one request in flight, first for an unmeasured warm-up, then for the measured window; latencies go to HDR histograms (microseconds, 3 significant digits).
//!
//! A request is measured if it *started* inside the window; throughput is
//! the measured count over the time from the window's start to the last
//! measured completion. An operation times itself (so client-side work such
//! as signing an envelope stays out of the figure) and may report parts
//! (the store floor's create and CAS) next to its total.

use std::future::Future;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// Largest latency a histogram holds (longer ones are clamped to it).
const HISTOGRAM_MAX_MICROS: u64 = 120_000_000;
/// Pause after a failed request, so a failing target is not spun on.
const ERROR_BACKOFF: Duration = Duration::from_millis(10);
/// Error messages kept per measurement (the count is kept in full).
const ERROR_SAMPLES_MAX: usize = 3;

/// Warm-up and measured durations of one measurement.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    pub warmup: Duration,
    pub duration: Duration,
}

/// What one operation took: its total and, optionally, its parts.
#[derive(Debug)]
pub struct Timing {
    pub total: Duration,
    pub parts: Vec<Duration>,
}

impl Timing {
    pub fn total(total: Duration) -> Self {
        Timing {
            total,
            parts: Vec::new(),
        }
    }
}

/// Latencies of one series.
#[derive(Debug)]
pub struct Measured {
    pub histogram: Histogram<u64>,
    pub errors: u64,
    pub wall: Duration,
    pub error_samples: Vec<String>,
}

/// The total series and one series per part.
#[derive(Debug)]
pub struct Sample {
    pub total: Measured,
    pub parts: Vec<Measured>,
}

pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HISTOGRAM_MAX_MICROS, 3).expect("constant bounds are valid")
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

struct WorkerResult {
    total: Histogram<u64>,
    parts: Vec<Histogram<u64>>,
    errors: u64,
    error_samples: Vec<String>,
    last_done: Option<Instant>,
}

/// Runs `op(worker, sequence)` on `concurrency` workers for `window`;
/// `parts` is how many parts each successful [`Timing`] carries.
pub async fn drive<F, Fut>(concurrency: usize, window: Window, parts: usize, op: F) -> Sample
where
    F: Fn(usize, u64) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Timing, String>> + Send + 'static,
{
    let start = Instant::now() + window.warmup;
    let end = start + window.duration;
    let tasks: Vec<_> = (0..concurrency)
        .map(|worker| {
            let op = op.clone();
            tokio::spawn(async move {
                let mut result = WorkerResult {
                    total: histogram(),
                    parts: (0..parts).map(|_| histogram()).collect(),
                    errors: 0,
                    error_samples: Vec::new(),
                    last_done: None,
                };
                let mut sequence = 0u64;
                loop {
                    let sent = Instant::now();
                    if sent >= end {
                        break;
                    }
                    sequence += 1;
                    let outcome = op(worker, sequence).await;
                    let measured = sent >= start;
                    match outcome {
                        Ok(timing) if measured => {
                            result.total.saturating_record(micros(timing.total));
                            for (histogram, part) in result.parts.iter_mut().zip(&timing.parts) {
                                histogram.saturating_record(micros(*part));
                            }
                            result.last_done = Some(Instant::now());
                        }
                        Ok(_) => {}
                        Err(error) => {
                            if measured {
                                result.errors += 1;
                            }
                            if result.error_samples.len() < ERROR_SAMPLES_MAX {
                                result.error_samples.push(error);
                            }
                            tokio::time::sleep(ERROR_BACKOFF).await;
                        }
                    }
                }
                result
            })
        })
        .collect();
    let mut total = histogram();
    let mut part_histograms: Vec<_> = (0..parts).map(|_| histogram()).collect();
    let mut errors = 0;
    let mut error_samples = Vec::new();
    let mut last_done = start;
    for task in tasks {
        let result = match task.await {
            Ok(result) => result,
            Err(error) => {
                errors += 1;
                error_samples.push(format!("worker failed: {error}"));
                continue;
            }
        };
        total
            .add(&result.total)
            .expect("histograms of the same bounds add");
        for (sum, part) in part_histograms.iter_mut().zip(&result.parts) {
            sum.add(part).expect("histograms of the same bounds add");
        }
        errors += result.errors;
        for sample in result.error_samples {
            if error_samples.len() < ERROR_SAMPLES_MAX {
                error_samples.push(sample);
            }
        }
        if let Some(done) = result.last_done {
            last_done = last_done.max(done);
        }
    }
    let wall = last_done
        .saturating_duration_since(start)
        .max(window.duration);
    let series = |histogram| Measured {
        histogram,
        errors,
        wall,
        error_samples: error_samples.clone(),
    };
    Sample {
        parts: part_histograms.into_iter().map(series).collect(),
        total: series(total),
    }
}
