//! The load drivers: closed-loop (C workers each keep one request in flight) and open-loop (requests sent at an offered rate, for the capacity sweep), first for an unmeasured warm-up, then for the measured window; latencies go to HDR histograms (microseconds, 3 significant digits); a progress line on stderr.
//!
//! Closed loop: a request is measured if it *started* inside the window;
//! throughput is the measured count over the time from the window's start
//! to the last measured completion. An operation times itself (so
//! client-side work such as signing an envelope stays out of the figure)
//! and may report parts (the store floor's create and CAS) next to its
//! total.
//!
//! Open loop ([`drive_rate`]): request `i` is due at `start + i / rate`
//! whatever happened to the others, and its latency runs from when it was
//! *due*, not when it was sent, so a stalled system cannot hide its queue
//! (no coordinated omission). At most [`OPEN_LOOP_IN_FLIGHT_MAX`] requests
//! are in flight; a request due while that many are outstanding is not
//! sent and counts as dropped.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};
use serde::Serialize;

/// Largest latency a histogram holds (longer ones are clamped to it).
const HISTOGRAM_MAX_MICROS: u64 = 120_000_000;
/// Pause after a failed request, so a failing target is not spun on.
const ERROR_BACKOFF: Duration = Duration::from_millis(10);
/// Error messages kept per measurement (the count is kept in full).
const ERROR_SAMPLES_MAX: usize = 3;
/// How often the progress line is redrawn.
const PROGRESS_EVERY: Duration = Duration::from_millis(500);
/// Requests in flight at once in the open-loop driver.
pub const OPEN_LOOP_IN_FLIGHT_MAX: usize = 4_096;

/// Counters behind the progress line of one measurement.
#[derive(Debug, Default)]
pub struct Progress {
    done: AtomicU64,
    errors: AtomicU64,
}

impl Progress {
    fn record(&self, ok: bool) {
        if ok {
            self.done.fetch_add(1, Ordering::Relaxed);
        } else {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Draws `label: elapsed/total s, N done, E errors, R/s` on stderr,
/// redrawn every [`PROGRESS_EVERY`] by `indicatif` while the measurement
/// runs (only when stderr is a terminal; a log gets the final line alone).
/// The workers only count in `progress`; the bar reads the counts.
fn progress_line(label: String, window: Window, progress: Arc<Progress>) -> ProgressTask {
    let total = (window.warmup + window.duration).as_secs_f64();
    let done = progress.clone();
    let errors = progress.clone();
    let rate = progress.clone();
    let style = ProgressStyle::with_template(
        "bench: {prefix}: {seconds}, {done} done, {errors} errors, {rate}",
    )
    .expect("the progress template is valid")
    .with_key(
        "seconds",
        move |state: &ProgressState, w: &mut dyn std::fmt::Write| {
            let _ = write!(w, "{:.1}/{total:.1} s", state.elapsed().as_secs_f64());
        },
    )
    .with_key(
        "done",
        move |_: &ProgressState, w: &mut dyn std::fmt::Write| {
            let _ = write!(w, "{}", done.done.load(Ordering::Relaxed));
        },
    )
    .with_key(
        "errors",
        move |_: &ProgressState, w: &mut dyn std::fmt::Write| {
            let _ = write!(w, "{}", errors.errors.load(Ordering::Relaxed));
        },
    )
    .with_key(
        "rate",
        move |state: &ProgressState, w: &mut dyn std::fmt::Write| {
            let done = rate.done.load(Ordering::Relaxed) as f64;
            let _ = write!(w, "{:.0}/s", done / state.elapsed().as_secs_f64().max(1e-3));
        },
    );
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())
        .with_style(style)
        .with_prefix(label.clone());
    bar.enable_steady_tick(PROGRESS_EVERY);
    ProgressTask {
        label,
        started: Instant::now(),
        progress,
        bar,
    }
}

struct ProgressTask {
    label: String,
    started: Instant,
    progress: Arc<Progress>,
    bar: ProgressBar,
}

impl ProgressTask {
    fn finish(self) {
        self.bar.finish_and_clear();
        let elapsed = self.started.elapsed().as_secs_f64();
        let done = self.progress.done.load(Ordering::Relaxed);
        eprintln!(
            "bench: {}: {done} done, {} errors in {elapsed:.1} s (warm-up included)",
            self.label,
            self.progress.errors.load(Ordering::Relaxed),
        );
    }
}

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

impl WorkerResult {
    fn new(parts: usize) -> Self {
        WorkerResult {
            total: histogram(),
            parts: (0..parts).map(|_| histogram()).collect(),
            errors: 0,
            error_samples: Vec::new(),
            last_done: None,
        }
    }

    /// One call's outcome: a success sent in the measured window is timed;
    /// an error is counted if measured and kept as a sample while there
    /// are few.
    fn record(&mut self, outcome: Result<Timing, String>, measured: bool) {
        match outcome {
            Ok(timing) if measured => {
                self.total.saturating_record(micros(timing.total));
                for (histogram, part) in self.parts.iter_mut().zip(&timing.parts) {
                    histogram.saturating_record(micros(*part));
                }
                self.last_done = Some(Instant::now());
            }
            Ok(_) => {}
            Err(error) => {
                if measured {
                    self.errors += 1;
                }
                if self.error_samples.len() < ERROR_SAMPLES_MAX {
                    self.error_samples.push(error);
                }
            }
        }
    }

    /// Adds a worker's result to this sum of them.
    fn add(&mut self, result: WorkerResult) {
        self.total
            .add(&result.total)
            .expect("histograms of the same bounds add");
        for (sum, part) in self.parts.iter_mut().zip(&result.parts) {
            sum.add(part).expect("histograms of the same bounds add");
        }
        self.errors += result.errors;
        for sample in result.error_samples {
            if self.error_samples.len() < ERROR_SAMPLES_MAX {
                self.error_samples.push(sample);
            }
        }
        self.last_done = self.last_done.max(result.last_done);
    }
}

/// Runs `op(worker, sequence)` on `concurrency` workers for `window`;
/// `parts` is how many parts each successful [`Timing`] carries. (The
/// stream benchmark's entry point; this suite names its lines.)
#[allow(dead_code)]
pub async fn drive<F, Fut>(concurrency: usize, window: Window, parts: usize, op: F) -> Sample
where
    F: Fn(usize, u64) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Timing, String>> + Send + 'static,
{
    drive_labelled(format!("c={concurrency}"), concurrency, window, parts, op).await
}

/// [`drive`] with `label` naming the progress line.
pub async fn drive_labelled<F, Fut>(
    label: String,
    concurrency: usize,
    window: Window,
    parts: usize,
    op: F,
) -> Sample
where
    F: Fn(usize, u64) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Timing, String>> + Send + 'static,
{
    let progress = Arc::new(Progress::default());
    let line = progress_line(label, window, progress.clone());
    let start = Instant::now() + window.warmup;
    let end = start + window.duration;
    let tasks: Vec<_> = (0..concurrency)
        .map(|worker| {
            let (op, progress) = (op.clone(), progress.clone());
            tokio::spawn(closed_loop_worker(
                op,
                worker,
                parts,
                (start, end),
                progress,
            ))
        })
        .collect();
    let mut sum = WorkerResult::new(parts);
    for task in tasks {
        match task.await {
            Ok(result) => sum.add(result),
            Err(error) => {
                sum.errors += 1;
                sum.error_samples.push(format!("worker failed: {error}"));
            }
        }
    }
    line.finish();
    let last_done = sum.last_done.map_or(start, |done| done.max(start));
    let wall = last_done
        .saturating_duration_since(start)
        .max(window.duration);
    let (errors, error_samples) = (sum.errors, sum.error_samples);
    let series = |histogram| Measured {
        histogram,
        errors,
        wall,
        error_samples: error_samples.clone(),
    };
    Sample {
        parts: sum.parts.into_iter().map(series).collect(),
        total: series(sum.total),
    }
}

/// One closed-loop worker: `op` again and again until `end`, timing what
/// was sent from `start` on, with a pause after each error.
async fn closed_loop_worker<F, Fut>(
    op: F,
    worker: usize,
    parts: usize,
    (start, end): (Instant, Instant),
    progress: Arc<Progress>,
) -> WorkerResult
where
    F: Fn(usize, u64) -> Fut,
    Fut: Future<Output = Result<Timing, String>>,
{
    let mut result = WorkerResult::new(parts);
    let mut sequence = 0u64;
    loop {
        let sent = Instant::now();
        if sent >= end {
            break;
        }
        sequence += 1;
        let outcome = op(worker, sequence).await;
        progress.record(outcome.is_ok());
        let failed = outcome.is_err();
        result.record(outcome, sent >= start);
        if failed {
            tokio::time::sleep(ERROR_BACKOFF).await;
        }
    }
    result
}

/// What the open-loop driver measured at one offered rate.
#[derive(Debug)]
pub struct RateSample {
    /// Latencies from each request's due time, successful requests only.
    pub total: Measured,
    /// Requests due in the measured window.
    pub offered: u64,
    /// Of those, not sent because [`OPEN_LOOP_IN_FLIGHT_MAX`] were in flight.
    pub dropped: u64,
}

#[derive(Debug)]
struct RateAccumulator {
    histogram: Histogram<u64>,
    errors: u64,
    error_samples: Vec<String>,
    last_done: Option<Instant>,
}

/// Sends `op(sequence)` at `rate` per second for `window` (open loop, see
/// the module doc) and waits for every request sent.
pub async fn drive_rate<F, Fut>(label: String, rate: f64, window: Window, op: F) -> RateSample
where
    F: Fn(u64) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Timing, String>> + Send + 'static,
{
    let progress = Arc::new(Progress::default());
    let line = progress_line(label, window, progress.clone());
    let begin = Instant::now();
    let start = begin + window.warmup;
    let end = start + window.duration;
    let interval = Duration::from_secs_f64(1.0 / rate.max(1e-3));
    let accumulator = Arc::new(Mutex::new(RateAccumulator {
        histogram: histogram(),
        errors: 0,
        error_samples: Vec::new(),
        last_done: None,
    }));
    let in_flight = Arc::new(tokio::sync::Semaphore::new(OPEN_LOOP_IN_FLIGHT_MAX));
    let mut tasks = tokio::task::JoinSet::new();
    let (mut offered, mut dropped) = (0u64, 0u64);
    let mut sequence = 0u64;
    loop {
        let due = begin + interval.mul_f64(sequence as f64);
        if due >= end {
            break;
        }
        tokio::time::sleep_until(due.into()).await;
        sequence += 1;
        let measured = due >= start;
        offered += u64::from(measured);
        let Ok(permit) = in_flight.clone().try_acquire_owned() else {
            dropped += u64::from(measured);
            continue;
        };
        let (op, accumulator, progress) = (op.clone(), accumulator.clone(), progress.clone());
        tasks.spawn(async move {
            let _permit = permit;
            let outcome = op(sequence).await;
            progress.record(outcome.is_ok());
            if !measured {
                return;
            }
            let done = Instant::now();
            let mut accumulator = accumulator.lock().expect("rate accumulator lock");
            match outcome {
                Ok(_) => {
                    accumulator
                        .histogram
                        .saturating_record(micros(done.saturating_duration_since(due)));
                    accumulator.last_done = Some(done);
                }
                Err(error) => {
                    accumulator.errors += 1;
                    if accumulator.error_samples.len() < ERROR_SAMPLES_MAX {
                        accumulator.error_samples.push(error);
                    }
                }
            }
        });
        // Reap finished requests so the set stays as small as what is in flight.
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    line.finish();
    let accumulator = std::mem::replace(
        &mut *accumulator.lock().expect("rate accumulator lock"),
        RateAccumulator {
            histogram: histogram(),
            errors: 0,
            error_samples: Vec::new(),
            last_done: None,
        },
    );
    let wall = accumulator
        .last_done
        .map_or(window.duration, |done| {
            done.saturating_duration_since(start)
        })
        .max(window.duration);
    RateSample {
        total: Measured {
            histogram: accumulator.histogram,
            errors: accumulator.errors,
            wall,
            error_samples: accumulator.error_samples,
        },
        offered,
        dropped,
    }
}

/// Percentiles, count and rate of one series.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    pub count: u64,
    pub errors: u64,
    pub throughput_per_s: f64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub error_samples: Vec<String>,
}

fn ms(micros: u64) -> f64 {
    micros as f64 / 1e3
}

impl Summary {
    pub fn of(histogram: &Histogram<u64>, errors: u64, wall_s: f64, samples: &[String]) -> Self {
        let count = histogram.len();
        let at = |q: f64| {
            if count == 0 {
                0.0
            } else {
                ms(histogram.value_at_quantile(q))
            }
        };
        Summary {
            count,
            errors,
            throughput_per_s: if wall_s > 0.0 {
                count as f64 / wall_s
            } else {
                0.0
            },
            p50_ms: at(0.50),
            p95_ms: at(0.95),
            p99_ms: at(0.99),
            max_ms: if count == 0 { 0.0 } else { ms(histogram.max()) },
            mean_ms: if count == 0 {
                0.0
            } else {
                histogram.mean() / 1e3
            },
            error_samples: samples.to_vec(),
        }
    }

    pub fn of_measured(measured: &Measured) -> Self {
        Summary::of(
            &measured.histogram,
            measured.errors,
            measured.wall.as_secs_f64(),
            &measured.error_samples,
        )
    }
}
