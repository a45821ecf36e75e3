//! The report: floors (before and after the workloads), workloads with their ratio to the relevant floor, where the time goes, the goals met or missed, the exactness check and the drain; as a table and as JSON.
//!
//! Commands are compared with the store's publication floor (create-only
//! 4 KiB PUT + If-Match 1 KiB CAS), queries with the echo floor (one gRPC
//! round trip over the same mTLS); each at the same concurrency, with the
//! before and after histograms merged. Latencies are client-side, envelope
//! signing excluded.

use std::fmt::Write;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::bench::exactness::Exactness;
use crate::bench::floors;
use crate::bench::load::{self, Measured};
use crate::bench::workloads::{Workload, WorkloadResult};

/// Goal 1: forwarded query p50 ≤ echo floor p50 + this.
const QUERY_GOAL_SLACK_MS: f64 = 0.2;
/// Goal 2: forwarded command p99 ≤ this × local command p99, at [`COMMAND_GOAL_CONCURRENCY`].
const COMMAND_GOAL_FACTOR: f64 = 1.5;
const COMMAND_GOAL_CONCURRENCY: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Before,
    After,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Before => "before",
            Phase::After => "after",
        }
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
    fn of(histogram: &Histogram<u64>, errors: u64, wall_s: f64, samples: &[String]) -> Self {
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

    fn of_measured(measured: &Measured) -> Self {
        Summary::of(
            &measured.histogram,
            measured.errors,
            measured.wall.as_secs_f64(),
            &measured.error_samples,
        )
    }
}

#[derive(Debug, Serialize)]
pub struct FloorRow {
    pub name: &'static str,
    pub phase: Phase,
    pub concurrency: usize,
    #[serde(flatten)]
    pub summary: Summary,
    #[serde(skip)]
    histogram: Histogram<u64>,
}

impl FloorRow {
    pub fn new(name: &'static str, phase: Phase, concurrency: usize, measured: &Measured) -> Self {
        FloorRow {
            name,
            phase,
            concurrency,
            summary: Summary::of_measured(measured),
            histogram: measured.histogram.clone(),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct WorkloadRow {
    pub name: &'static str,
    pub concurrency: usize,
    #[serde(flatten)]
    pub summary: Summary,
    pub owner_mismatches: u64,
    /// The floor compared with (before and after merged) and the ratios.
    pub floor: &'static str,
    pub floor_p50_ms: f64,
    pub floor_p99_ms: f64,
    pub p50_vs_floor: f64,
    pub p99_vs_floor: f64,
    #[serde(skip)]
    workload: Workload,
}

impl WorkloadRow {
    pub fn new(workload: Workload, concurrency: usize, result: &WorkloadResult) -> Self {
        WorkloadRow {
            name: workload.name(),
            concurrency,
            summary: Summary::of_measured(&result.sample.total),
            owner_mismatches: result.owner_mismatches,
            floor: floor_of(workload),
            floor_p50_ms: 0.0,
            floor_p99_ms: 0.0,
            p50_vs_floor: 0.0,
            p99_vs_floor: 0.0,
            workload,
        }
    }
}

fn floor_of(workload: Workload) -> &'static str {
    if workload.command() {
        floors::STORE_PUBLICATION
    } else {
        floors::ECHO
    }
}

/// One goal of the issue, evaluated.
#[derive(Debug, Serialize)]
pub struct Goal {
    pub goal: String,
    pub concurrency: usize,
    /// `None`: not measured in this run.
    pub met: Option<bool>,
    pub measured_ms: f64,
    pub limit_ms: f64,
    /// limit − measured (negative: missed by that much).
    pub margin_ms: f64,
}

#[derive(Debug, Default)]
pub struct Report {
    pub config: serde_json::Value,
    pub floors: Vec<FloorRow>,
    pub workloads: Vec<WorkloadRow>,
    pub exactness: Exactness,
    pub drained: Vec<(String, bool)>,
}

impl Report {
    /// The floor `name` at `concurrency`, before and after merged.
    fn floor(&self, name: &str, concurrency: usize) -> Option<Summary> {
        let rows: Vec<&FloorRow> = self
            .floors
            .iter()
            .filter(|r| r.name == name && r.concurrency == concurrency)
            .collect();
        if rows.is_empty() {
            return None;
        }
        let mut merged = load::histogram();
        for row in &rows {
            merged
                .add(&row.histogram)
                .expect("histograms of the same bounds add");
        }
        let mut summary = Summary::of(&merged, 0, 1.0, &[]);
        summary.throughput_per_s =
            rows.iter().map(|r| r.summary.throughput_per_s).sum::<f64>() / rows.len() as f64;
        summary.errors = rows.iter().map(|r| r.summary.errors).sum();
        Some(summary)
    }

    fn workload(&self, workload: Workload, concurrency: usize) -> Option<&WorkloadRow> {
        self.workloads
            .iter()
            .find(|r| r.workload == workload && r.concurrency == concurrency)
    }

    /// Fills each workload row's floor columns.
    fn compare(&mut self) {
        let floors: Vec<Option<Summary>> = self
            .workloads
            .iter()
            .map(|row| self.floor(row.floor, row.concurrency))
            .collect();
        for (row, floor) in self.workloads.iter_mut().zip(floors) {
            let Some(floor) = floor else { continue };
            row.floor_p50_ms = floor.p50_ms;
            row.floor_p99_ms = floor.p99_ms;
            row.p50_vs_floor = ratio(row.summary.p50_ms, floor.p50_ms);
            row.p99_vs_floor = ratio(row.summary.p99_ms, floor.p99_ms);
        }
    }

    fn levels(&self) -> Vec<usize> {
        let mut levels: Vec<usize> = self.workloads.iter().map(|r| r.concurrency).collect();
        levels.sort_unstable();
        levels.dedup();
        levels
    }

    fn goals(&self) -> Vec<Goal> {
        let mut goals = Vec::new();
        for concurrency in self.levels() {
            let (Some(forwarded), Some(echo)) = (
                self.workload(Workload::ForwardedQuery, concurrency),
                self.floor(floors::ECHO, concurrency),
            ) else {
                continue;
            };
            let limit = echo.p50_ms + QUERY_GOAL_SLACK_MS;
            goals.push(Goal {
                goal: format!("forwarded_query p50 <= echo p50 + {QUERY_GOAL_SLACK_MS} ms"),
                concurrency,
                met: Some(forwarded.summary.p50_ms <= limit),
                measured_ms: forwarded.summary.p50_ms,
                limit_ms: limit,
                margin_ms: limit - forwarded.summary.p50_ms,
            });
        }
        let concurrency = COMMAND_GOAL_CONCURRENCY;
        let goal = format!("forwarded_command p99 <= {COMMAND_GOAL_FACTOR} x local_command p99");
        goals.push(
            match (
                self.workload(Workload::ForwardedCommand, concurrency),
                self.workload(Workload::LocalCommand, concurrency),
            ) {
                (Some(forwarded), Some(local)) => {
                    let limit = COMMAND_GOAL_FACTOR * local.summary.p99_ms;
                    Goal {
                        goal,
                        concurrency,
                        met: Some(forwarded.summary.p99_ms <= limit),
                        measured_ms: forwarded.summary.p99_ms,
                        limit_ms: limit,
                        margin_ms: limit - forwarded.summary.p99_ms,
                    }
                }
                _ => Goal {
                    goal,
                    concurrency,
                    met: None,
                    measured_ms: 0.0,
                    limit_ms: 0.0,
                    margin_ms: 0.0,
                },
            },
        );
        goals
    }

    pub fn table(&mut self) -> String {
        self.compare();
        let mut out = String::new();
        let config = &self.config;
        let _ = writeln!(
            out,
            "\ncellfleet bench: {} nodes, store {}, {} s measured after {} s warm-up per row",
            config["nodes"], config["store_detail"], config["duration_s"], config["warmup_s"]
        );
        let _ = writeln!(
            out,
            "latencies in ms, client-side, envelope signing excluded; one mTLS HTTP/2 connection per node\n"
        );
        let _ = writeln!(
            out,
            "{:<18} {:>3} {:<7} {:>7} {:>9} {:>8} {:>8} {:>8}",
            "FLOOR", "C", "PHASE", "N", "OPS/S", "P50", "P95", "P99"
        );
        for row in &self.floors {
            let s = &row.summary;
            let _ = writeln!(
                out,
                "{:<18} {:>3} {:<7} {:>7} {:>9.0} {:>8.3} {:>8.3} {:>8.3}{}",
                row.name,
                row.concurrency,
                row.phase.name(),
                s.count,
                s.throughput_per_s,
                s.p50_ms,
                s.p95_ms,
                s.p99_ms,
                errors_note(s.errors)
            );
        }
        let _ = writeln!(
            out,
            "\n{:<18} {:>3} {:>7} {:>9} {:>8} {:>8} {:>8}  {:<18} {:>8} {:>8} {:>9}",
            "WORKLOAD",
            "C",
            "N",
            "OPS/S",
            "P50",
            "P95",
            "P99",
            "VS FLOOR",
            "P50 x",
            "P99 x",
            "P50 +ms"
        );
        for row in &self.workloads {
            let s = &row.summary;
            let _ = writeln!(
                out,
                "{:<18} {:>3} {:>7} {:>9.0} {:>8.3} {:>8.3} {:>8.3}  {:<18} {:>8.2} {:>8.2} {:>+9.3}{}{}",
                row.name,
                row.concurrency,
                s.count,
                s.throughput_per_s,
                s.p50_ms,
                s.p95_ms,
                s.p99_ms,
                row.floor,
                row.p50_vs_floor,
                row.p99_vs_floor,
                s.p50_ms - row.floor_p50_ms,
                errors_note(s.errors),
                if row.owner_mismatches > 0 {
                    format!("  ({} served by another node)", row.owner_mismatches)
                } else {
                    String::new()
                }
            );
        }
        let _ = writeln!(out, "\nwhere the time goes (p50):");
        for concurrency in self.levels() {
            for line in self.breakdown(concurrency) {
                let _ = writeln!(out, "  c={concurrency:<3} {line}");
            }
        }
        let _ = writeln!(out, "\ngoals:");
        for goal in self.goals() {
            let verdict = match goal.met {
                Some(true) => format!(
                    "MET: {:.3} ms <= {:.3} ms (margin {:.3} ms)",
                    goal.measured_ms, goal.limit_ms, goal.margin_ms
                ),
                Some(false) => format!(
                    "MISSED: {:.3} ms > {:.3} ms, by {:.3} ms ({:.2}x the limit)",
                    goal.measured_ms,
                    goal.limit_ms,
                    -goal.margin_ms,
                    ratio(goal.measured_ms, goal.limit_ms)
                ),
                None => "not measured in this run".into(),
            };
            let _ = writeln!(out, "  {} at c={}: {verdict}", goal.goal, goal.concurrency);
        }
        let e = &self.exactness;
        let _ = writeln!(
            out,
            "\nexactness: {} — {} acknowledged commands in {} cells, {} present exactly once, {} missing, {} duplicated, {} unexpected; {} unacknowledged ({} applied once)",
            if e.passed { "PASSED" } else { "FAILED" },
            e.acked,
            e.cells,
            e.present_once,
            e.missing,
            e.duplicated,
            e.unexpected,
            e.unacknowledged,
            e.unacknowledged_applied
        );
        for problem in &e.problems {
            let _ = writeln!(out, "  {problem}");
        }
        let clean = self.drained.iter().filter(|(_, clean)| *clean).count();
        let _ = writeln!(
            out,
            "drain: {clean} of {} nodes exited cleanly after SIGTERM",
            self.drained.len()
        );
        out
    }

    /// Floor → local → forwarded, as p50 increments.
    fn breakdown(&self, concurrency: usize) -> Vec<String> {
        let mut lines = Vec::new();
        for (floor, local, forwarded, what) in [
            (
                floors::ECHO,
                Workload::LocalQuery,
                Workload::ForwardedQuery,
                "query",
            ),
            (
                floors::STORE_PUBLICATION,
                Workload::LocalCommand,
                Workload::ForwardedCommand,
                "command",
            ),
        ] {
            let Some(floor) = self.floor(floor, concurrency) else {
                continue;
            };
            let mut line = format!("{what:<8} floor {:.3}", floor.p50_ms);
            let mut previous = floor.p50_ms;
            for (workload, label) in [(local, "node work"), (forwarded, "peer hop")] {
                if let Some(row) = self.workload(workload, concurrency) {
                    let _ = write!(
                        line,
                        " | {} {:.3} ({:+.3} {label})",
                        workload.name(),
                        row.summary.p50_ms,
                        row.summary.p50_ms - previous
                    );
                    previous = row.summary.p50_ms;
                }
            }
            lines.push(line);
        }
        lines
    }

    pub fn json(&mut self) -> serde_json::Value {
        self.compare();
        serde_json::json!({
            "config": self.config,
            "floors": self.floors,
            "workloads": self.workloads,
            "goals": self.goals(),
            "exactness": self.exactness,
            "drained": self.drained.iter().map(|(node, clean)| serde_json::json!({"node": node, "clean": clean})).collect::<Vec<_>>(),
        })
    }
}

fn ratio(value: f64, floor: f64) -> f64 {
    if floor > 0.0 {
        value / floor
    } else {
        0.0
    }
}

fn errors_note(errors: u64) -> String {
    if errors > 0 {
        format!("  ({errors} errors)")
    } else {
        String::new()
    }
}
