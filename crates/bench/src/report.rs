//! The report: floors (before and after the workloads), workloads with their ratio to the relevant floor, where the time goes (per phase, from the nodes' metrics), fleet sizes, the capacity sweep, the goals met or missed, the exactness check, the drain and the clean-up; as a table and as JSON.
//!
//! Commands are compared with the store's publication floor (create-only
//! 4 KiB PUT + If-Match 1 KiB CAS) and with the bare SQLite transaction,
//! queries with the echo floor (one gRPC round trip over the same mTLS);
//! each at the row's floor concurrency (its own, except `hot_cell`, whose
//! one Cell publishes one group at a time: c=1), with the before and after
//! histograms merged. Latencies are client-side, envelope signing excluded.

use std::fmt::Write;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::capacity::CapacityResult;
use crate::exactness::Exactness;
use crate::fleet::FleetRow;
use crate::floors;
use crate::load::{self, Measured, Summary};
use crate::node_stats::Phases;
use crate::workloads::{Workload, WorkloadResult};

/// Goal 1: forwarded query p50 ≤ echo floor p50 + this.
const QUERY_GOAL_SLACK_MS: f64 = 0.2;
/// Goal 2: forwarded command p99 ≤ this × local command p99, at [`COMMAND_GOAL_CONCURRENCY`].
const COMMAND_GOAL_FACTOR: f64 = 1.5;
const COMMAND_GOAL_CONCURRENCY: usize = 16;
/// Goal 3: `hot_cell` durable commands per second at least.
const HOT_CELL_GOAL_PER_S: f64 = 5_000.0;
/// Goal 4: `fleet` at [`FLEET_GOAL_CELLS`] Cells, durable commands/s per node at least.
const FLEET_GOAL_PER_NODE_PER_S: f64 = 10_000.0;
const FLEET_GOAL_CELLS: usize = 1_000;
/// Goal 5: `fleet` at [`FLEET_LARGE_CELLS`] Cells keeps this share of the small figure.
const FLEET_LARGE_CELLS: usize = 100_000;
const FLEET_LARGE_SHARE: f64 = 0.8;
/// Goal 6: `local_query` at c=16, queries per second at least.
const LOCAL_QUERY_GOAL_PER_S: f64 = 50_000.0;
/// The CPU issue's query goal: `local_query` at c=16 at least this share
/// of the echo floor's throughput at c=16.
const LOCAL_QUERY_ECHO_SHARE: f64 = 0.8;
/// The node log's latency goal: `local_command` at c=1, p50 at most this
/// times one create-only PUT's p50 (one store round trip, not two).
const LOCAL_COMMAND_CREATE_FACTOR: f64 = 1.2;
/// The node log's cardinality goal at 10k Cells (the 100k one is goal 5).
const FLEET_MIDDLE_CELLS: usize = 10_000;
/// The node log's throughput goal, from a run of both publication modes:
/// `fleet` at [`FLEET_GOAL_CELLS`] Cells, log mode's per-node rate at
/// least this many times cell mode's.
const FLEET_LOG_OVER_CELL: f64 = 10.0;
/// Goals 7 and 8: `routed_query` (the client library's owner-aware routing,
/// Cells of every node) p50 at most this times `local_query`'s...
const ROUTED_QUERY_P50_FACTOR: f64 = 1.1;
/// ...and its c16 throughput at least this share of `local_query`'s (what
/// the library's signing, routing and retry layer may cost).
const ROUTED_QUERY_THROUGHPUT_SHARE: f64 = 0.95;

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

#[derive(Debug, Serialize)]
pub struct FloorRow {
    pub name: &'static str,
    pub phase: Phase,
    pub concurrency: usize,
    #[serde(flatten)]
    pub summary: Summary,
    #[serde(skip)]
    pub histogram: Histogram<u64>,
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
    /// The floor compared with (before and after merged), at which
    /// concurrency, and the ratios.
    pub floor: &'static str,
    pub floor_concurrency: usize,
    pub floor_p50_ms: f64,
    pub floor_p99_ms: f64,
    pub p50_vs_floor: f64,
    pub p99_vs_floor: f64,
    /// Commands: the bare SQLite transaction (c=1) and the ratios to it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sqlite: Option<SqliteRatio>,
    /// Commands: where the time went, from the nodes' metrics.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phases: Option<Phases>,
    #[serde(skip)]
    pub workload: Workload,
    #[serde(skip)]
    pub histogram: Histogram<u64>,
}

/// A command row against the bare SQLite transaction.
#[derive(Clone, Debug, Serialize)]
pub struct SqliteRatio {
    pub sqlite_p50_ms: f64,
    pub sqlite_per_s: f64,
    pub p50_vs_sqlite: f64,
    /// The row's throughput over SQLite's (one writer, back to back).
    pub throughput_vs_sqlite: f64,
}

impl WorkloadRow {
    pub fn new(
        workload: Workload,
        concurrency: usize,
        result: &WorkloadResult,
        phases: Option<Phases>,
    ) -> Self {
        WorkloadRow {
            name: workload.name(),
            concurrency,
            summary: Summary::of_measured(&result.sample.total),
            owner_mismatches: result.owner_mismatches,
            floor: floor_of(workload),
            floor_concurrency: if workload == Workload::HotCell {
                1
            } else {
                concurrency
            },
            floor_p50_ms: 0.0,
            floor_p99_ms: 0.0,
            p50_vs_floor: 0.0,
            p99_vs_floor: 0.0,
            sqlite: None,
            phases,
            workload,
            histogram: result.sample.total.histogram.clone(),
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
    pub measured: f64,
    pub limit: f64,
    /// "ms" (at most the limit), "/s" (at least the limit) or "x" (a
    /// ratio, at least the limit).
    pub unit: &'static str,
    /// How far inside the limit (negative: missed by that much), in `unit`.
    pub margin: f64,
}

impl Goal {
    /// A latency goal: `measured` ≤ `limit` ms.
    fn at_most(goal: String, concurrency: usize, measured: f64, limit: f64) -> Self {
        Goal {
            goal,
            concurrency,
            met: Some(measured <= limit),
            measured,
            limit,
            unit: "ms",
            margin: limit - measured,
        }
    }

    /// A throughput goal: `measured` ≥ `limit` per second.
    fn at_least(goal: String, concurrency: usize, measured: f64, limit: f64) -> Self {
        Goal {
            goal,
            concurrency,
            met: Some(measured >= limit),
            measured,
            limit,
            unit: "/s",
            margin: measured - limit,
        }
    }

    /// A ratio goal: `measured` ≥ `limit` times.
    fn ratio_at_least(goal: String, concurrency: usize, measured: f64, limit: f64) -> Self {
        Goal {
            unit: "x",
            ..Goal::at_least(goal, concurrency, measured, limit)
        }
    }

    fn unmeasured(goal: String, concurrency: usize, unit: &'static str) -> Self {
        Goal {
            goal,
            concurrency,
            met: None,
            measured: 0.0,
            limit: 0.0,
            unit,
            margin: 0.0,
        }
    }
}

/// What the bench deleted from the store after the run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Cleanup {
    pub deleted_objects: u64,
    /// Why the clean-up failed or was skipped, if it did not run to the end.
    pub note: Option<String>,
}

#[derive(Debug, Default)]
pub struct Report {
    pub config: serde_json::Value,
    pub floors: Vec<FloorRow>,
    pub workloads: Vec<WorkloadRow>,
    pub fleet: Vec<FleetRow>,
    pub capacity: Option<CapacityResult>,
    pub exactness: Exactness,
    pub drained: Vec<crate::cluster::Drained>,
    pub cleanup: Cleanup,
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

    /// Fills each workload row's floor columns and splits its phases.
    fn compare(&mut self) {
        let floors: Vec<(Option<Summary>, Option<Summary>)> = self
            .workloads
            .iter()
            .map(|row| {
                (
                    self.floor(row.floor, row.floor_concurrency),
                    self.floor(floors::ECHO, row.floor_concurrency),
                )
            })
            .collect();
        let sqlite = self.floor(floors::SQLITE, 1);
        for (row, (floor, echo)) in self.workloads.iter_mut().zip(floors) {
            if let Some(floor) = floor {
                row.floor_p50_ms = floor.p50_ms;
                row.floor_p99_ms = floor.p99_ms;
                row.p50_vs_floor = ratio(row.summary.p50_ms, floor.p50_ms);
                row.p99_vs_floor = ratio(row.summary.p99_ms, floor.p99_ms);
            }
            if let (true, Some(sqlite)) = (row.workload.command(), &sqlite) {
                row.sqlite = Some(SqliteRatio {
                    sqlite_p50_ms: sqlite.p50_ms,
                    sqlite_per_s: sqlite.throughput_per_s,
                    p50_vs_sqlite: ratio(row.summary.p50_ms, sqlite.p50_ms),
                    throughput_vs_sqlite: ratio(
                        row.summary.throughput_per_s,
                        sqlite.throughput_per_s,
                    ),
                });
            }
            if let Some(phases) = &mut row.phases {
                phases.attribute(row.summary.mean_ms, echo.map_or(0.0, |e| e.p50_ms));
            }
        }
        let echo = self.floor(floors::ECHO, 1).map_or(0.0, |e| e.p50_ms);
        for row in &mut self.fleet {
            row.phases.attribute(row.summary.mean_ms, echo);
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
        self.query_goals(&mut goals);
        self.command_goals(&mut goals);
        self.local_command_goal(&mut goals);
        self.fleet_goals(&mut goals);
        self.local_query_goal(&mut goals);
        goals
    }

    /// The query goals: forwarded against the echo floor, routed against local.
    fn query_goals(&self, goals: &mut Vec<Goal>) {
        for concurrency in self.levels() {
            let (Some(forwarded), Some(echo)) = (
                self.workload(Workload::ForwardedQuery, concurrency),
                self.floor(floors::ECHO, concurrency),
            ) else {
                continue;
            };
            goals.push(Goal::at_most(
                format!("forwarded_query p50 <= echo p50 + {QUERY_GOAL_SLACK_MS} ms"),
                concurrency,
                forwarded.summary.p50_ms,
                echo.p50_ms + QUERY_GOAL_SLACK_MS,
            ));
        }
        for concurrency in self.levels() {
            if let (Some(routed), Some(local)) = (
                self.workload(Workload::RoutedQuery, concurrency),
                self.workload(Workload::LocalQuery, concurrency),
            ) {
                goals.push(Goal::at_most(
                    format!("routed_query p50 <= {ROUTED_QUERY_P50_FACTOR} x local_query p50"),
                    concurrency,
                    routed.summary.p50_ms,
                    ROUTED_QUERY_P50_FACTOR * local.summary.p50_ms,
                ));
            }
        }
        let goal =
            format!("routed_query >= {ROUTED_QUERY_THROUGHPUT_SHARE} x local_query queries/s");
        goals.push(
            match (
                self.workload(Workload::RoutedQuery, 16),
                self.workload(Workload::LocalQuery, 16),
            ) {
                (Some(routed), Some(local)) => Goal::at_least(
                    goal,
                    16,
                    routed.summary.throughput_per_s,
                    ROUTED_QUERY_THROUGHPUT_SHARE * local.summary.throughput_per_s,
                ),
                _ => Goal::unmeasured(goal, 16, "/s"),
            },
        );
    }

    /// The command goals: forwarded against local p99, and `hot_cell`'s rate.
    fn command_goals(&self, goals: &mut Vec<Goal>) {
        let concurrency = COMMAND_GOAL_CONCURRENCY;
        let goal = format!("forwarded_command p99 <= {COMMAND_GOAL_FACTOR} x local_command p99");
        goals.push(
            match (
                self.workload(Workload::ForwardedCommand, concurrency),
                self.workload(Workload::LocalCommand, concurrency),
            ) {
                (Some(forwarded), Some(local)) => Goal::at_most(
                    goal,
                    concurrency,
                    forwarded.summary.p99_ms,
                    COMMAND_GOAL_FACTOR * local.summary.p99_ms,
                ),
                _ => Goal::unmeasured(goal, concurrency, "ms"),
            },
        );
        let goal = format!("hot_cell >= {HOT_CELL_GOAL_PER_S} durable commands/s");
        let concurrency = crate::workloads::HOT_CELL_CONCURRENCY;
        goals.push(match self.workload(Workload::HotCell, concurrency) {
            Some(row) => Goal::at_least(
                goal,
                concurrency,
                row.summary.throughput_per_s,
                HOT_CELL_GOAL_PER_S,
            ),
            None => Goal::unmeasured(goal, concurrency, "/s"),
        });
    }

    /// The fleet goals: the per-node rate at the goal's size, and no cliff at
    /// the large size.
    fn fleet_goals(&self, goals: &mut Vec<Goal>) {
        let small = self
            .fleet
            .iter()
            .find(|r| r.cells_requested == FLEET_GOAL_CELLS);
        let goal = format!(
            "fleet at {FLEET_GOAL_CELLS} cells >= {FLEET_GOAL_PER_NODE_PER_S} durable commands/s per node"
        );
        goals.push(match small {
            Some(row) => Goal::at_least(
                goal,
                row.concurrency,
                row.per_node_per_s,
                FLEET_GOAL_PER_NODE_PER_S,
            ),
            None => Goal::unmeasured(goal, 0, "/s"),
        });
        for cells in [FLEET_MIDDLE_CELLS, FLEET_LARGE_CELLS] {
            let large = self.fleet.iter().find(|r| r.cells_requested == cells);
            let goal = format!(
                "fleet at {cells} cells >= {FLEET_LARGE_SHARE} x the {FLEET_GOAL_CELLS}-cell figure per node"
            );
            goals.push(match (small, large) {
                (Some(small), Some(large)) => Goal::at_least(
                    format!("{goal} ({} cells reached)", large.cells),
                    large.concurrency,
                    large.per_node_per_s,
                    FLEET_LARGE_SHARE * small.per_node_per_s,
                ),
                _ => Goal::unmeasured(goal, 0, "/s"),
            });
        }
    }

    /// `local_command` at c=1 against one create-only PUT (the node log's
    /// round trip): a goal of log mode only, since cell mode makes two.
    fn local_command_goal(&self, goals: &mut Vec<Goal>) {
        if self.config["publication"] == "cell" {
            return;
        }
        let goal = format!(
            "local_command p50 <= {LOCAL_COMMAND_CREATE_FACTOR} x {} p50",
            floors::STORE_CREATE
        );
        goals.push(
            match (
                self.workload(Workload::LocalCommand, 1),
                self.floor(floors::STORE_CREATE, 1),
            ) {
                (Some(row), Some(create)) => Goal::at_most(
                    goal,
                    1,
                    row.summary.p50_ms,
                    LOCAL_COMMAND_CREATE_FACTOR * create.p50_ms,
                ),
                _ => Goal::unmeasured(goal, 1, "ms"),
            },
        );
    }

    /// The local query rate at c16.
    fn local_query_goal(&self, goals: &mut Vec<Goal>) {
        let goal = format!("local_query >= {LOCAL_QUERY_GOAL_PER_S} queries/s");
        goals.push(match self.workload(Workload::LocalQuery, 16) {
            Some(row) => Goal::at_least(
                goal,
                16,
                row.summary.throughput_per_s,
                LOCAL_QUERY_GOAL_PER_S,
            ),
            None => Goal::unmeasured(goal, 16, "/s"),
        });
        let goal = format!("local_query >= {LOCAL_QUERY_ECHO_SHARE} x echo queries/s");
        goals.push(
            match (
                self.workload(Workload::LocalQuery, 16),
                self.floor(floors::ECHO, 16),
            ) {
                (Some(row), Some(echo)) => Goal::at_least(
                    goal,
                    16,
                    row.summary.throughput_per_s,
                    LOCAL_QUERY_ECHO_SHARE * echo.throughput_per_s,
                ),
                _ => Goal::unmeasured(goal, 16, "/s"),
            },
        );
    }

    pub fn table(&mut self) -> String {
        self.compare();
        let mut out = String::new();
        let config = &self.config;
        let _ = writeln!(
            out,
            "\ncellfleet bench: {} nodes, store {}, publication {}, {} s measured after {} s warm-up per row",
            config["nodes"], config["store_detail"], config["publication"].as_str().unwrap_or("log"), config["duration_s"], config["warmup_s"]
        );
        let _ = writeln!(
            out,
            "latencies in ms, client-side, envelope signing excluded; one mTLS HTTP/2 connection per node\n"
        );
        self.write_floors(&mut out);
        self.write_workloads(&mut out);
        self.write_against_sqlite(&mut out);
        self.write_where_time_goes(&mut out);
        self.write_fleet(&mut out);
        self.write_capacity(&mut out);
        self.write_goals(&mut out);
        self.write_outcome(&mut out);
        out
    }

    /// The floors: what the same machine does without Cellfleet.
    fn write_floors(&self, out: &mut String) {
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
    }

    /// The workloads, each against its floor.
    fn write_workloads(&self, out: &mut String) {
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
    }

    /// Commands against the bare SQLite transaction.
    fn write_against_sqlite(&self, out: &mut String) {
        let commands: Vec<&WorkloadRow> = self
            .workloads
            .iter()
            .filter(|row| row.sqlite.is_some())
            .collect();
        if !commands.is_empty() {
            let _ = writeln!(
                out,
                "\ncommands against the bare SQLite transaction (c=1, same pragmas):"
            );
            for row in commands {
                let sqlite = row.sqlite.as_ref().expect("filtered");
                let _ = writeln!(
                    out,
                    "  {:<18} c={:<3} p50 {:.3} ms = {:.1}x sqlite {:.3} ms; {:.0}/s = {:.3}x sqlite {:.0}/s",
                    row.name,
                    row.concurrency,
                    row.summary.p50_ms,
                    sqlite.p50_vs_sqlite,
                    sqlite.sqlite_p50_ms,
                    row.summary.throughput_per_s,
                    sqlite.throughput_vs_sqlite,
                    sqlite.sqlite_per_s
                );
            }
        }
    }

    /// Where the time goes: floor to local to forwarded, and the nodes' phases.
    fn write_where_time_goes(&self, out: &mut String) {
        let _ = writeln!(out, "\nwhere the time goes (p50):");
        for concurrency in self.levels() {
            for line in self.breakdown(concurrency) {
                let _ = writeln!(out, "  c={concurrency:<3} {line}");
            }
        }
        let _ = writeln!(
            out,
            "\nwhere a command's time goes (means, from the nodes' metrics):"
        );
        for row in &self.workloads {
            if let Some(phases) = &row.phases {
                let _ = writeln!(
                    out,
                    "  {:<18} c={:<3} {}",
                    row.name,
                    row.concurrency,
                    phases.line()
                );
            }
        }
        for row in &self.fleet {
            let _ = writeln!(
                out,
                "  fleet {:<12} c={:<3} {}",
                row.cells,
                row.concurrency,
                row.phases.line()
            );
        }
    }

    /// The fleet rows (many Cells), with the nodes' RSS and open files.
    fn write_fleet(&self, out: &mut String) {
        if !self.fleet.is_empty() {
            let _ = writeln!(
                out,
                "\n{:<8} {:>8} {:>9} {:>10} {:>8} {:>8} {:>9} {:>10} {:>9}",
                "FLEET",
                "CELLS",
                "OPS/S",
                "PER NODE",
                "P50",
                "P99",
                "RSS MB",
                "OPEN FDS",
                "CREATE/S"
            );
            for row in &self.fleet {
                let rss = row.nodes.iter().map(|n| n.rss_bytes_max).max().unwrap_or(0);
                let fds = row
                    .nodes
                    .iter()
                    .map(|n| n.open_files_max)
                    .max()
                    .unwrap_or(0);
                let _ = writeln!(
                    out,
                    "{:<8} {:>8} {:>9.0} {:>10.0} {:>8.3} {:>8.3} {:>9.1} {:>10} {:>9.0}{}",
                    row.cells_requested,
                    row.cells,
                    row.summary.throughput_per_s,
                    row.per_node_per_s,
                    row.summary.p50_ms,
                    row.summary.p99_ms,
                    rss as f64 / (1 << 20) as f64,
                    fds,
                    row.created_per_s,
                    errors_note(row.summary.errors)
                );
            }
            let _ = writeln!(
                out,
                "  (RSS and open files: the largest node's maximum during the measurement)"
            );
        }
    }

    /// The open-loop capacity steps.
    fn write_capacity(&self, out: &mut String) {
        if let Some(capacity) = &self.capacity {
            let _ = writeln!(
                out,
                "\ncapacity ({} cells, open loop, p99 bound {} ms):",
                capacity.cells, capacity.p99_bound_ms
            );
            for step in &capacity.steps {
                let _ = writeln!(
                    out,
                    "  offered {:>8.0}/s  achieved {:>8.0}/s  p50 {:>8.3}  p99 {:>9.3}  dropped {:>6}  {}{}",
                    step.offered_per_s,
                    step.achieved_per_s,
                    step.summary.p50_ms,
                    step.summary.p99_ms,
                    step.dropped,
                    if step.served { "served" } else { "NOT served" },
                    errors_note(step.summary.errors)
                );
            }
            let _ = match capacity.capacity_per_s {
                Some(rate) => writeln!(out, "  capacity: {rate:.0} commands/s"),
                None => writeln!(out, "  capacity: below the lowest rate offered"),
            };
        }
    }

    /// Each goal with its verdict.
    fn write_goals(&self, out: &mut String) {
        let _ = writeln!(out, "\ngoals:");
        for goal in self.goals() {
            write_goal(out, &goal);
        }
    }

    /// Exactness, drain and clean-up.
    fn write_outcome(&self, out: &mut String) {
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
        let clean = self.drained.iter().filter(|node| node.clean).count();
        let last = self
            .drained
            .iter()
            .map(|node| node.seconds)
            .fold(0.0, f64::max);
        let _ = writeln!(
            out,
            "drain: {clean} of {} nodes exited cleanly after SIGTERM, the last after {last:.1} s",
            self.drained.len()
        );
        let _ = writeln!(
            out,
            "clean-up: {} objects deleted{}",
            self.cleanup.deleted_objects,
            self.cleanup
                .note
                .as_ref()
                .map_or(String::new(), |note| format!(" ({note})"))
        );
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
            "fleet": self.fleet,
            "capacity": self.capacity,
            "goals": self.goals(),
            "exactness": self.exactness,
            "drained": self.drained.iter().map(|node| serde_json::json!({"node": node.node, "clean": node.clean, "seconds": node.seconds})).collect::<Vec<_>>(),
            "cleanup": self.cleanup,
        })
    }
}

/// The node log against per-Cell publication: the same plan run once in
/// each mode (`--publication log,cell`), each on a cluster of its own
/// and the same store, row by row, with the node-log issue's throughput
/// goal. `runs` pairs each mode's name with its report; without both
/// modes there is nothing to compare (`None`).
pub fn log_against_cell(
    runs: &mut [(&'static str, Report)],
) -> Option<(String, serde_json::Value)> {
    for (_, report) in runs.iter_mut() {
        report.compare();
    }
    let log = &runs.iter().find(|(mode, _)| *mode == "log")?.1;
    let cell = &runs.iter().find(|(mode, _)| *mode == "cell")?.1;
    let order = runs
        .iter()
        .map(|(mode, _)| *mode)
        .collect::<Vec<_>>()
        .join(", ");
    let mut out = String::new();
    let mut workloads = Vec::new();
    let _ = writeln!(
        out,
        "\nlog against cell: the same plan on a cluster of its own per mode, in this order: {order}"
    );
    let _ = writeln!(
        out,
        "{:<18} {:>3} {:>10} {:>10} {:>8} {:>9} {:>9} {:>8}",
        "WORKLOAD", "C", "LOG OPS/S", "CELL OPS/S", "LOG/CELL", "LOG P50", "CELL P50", "LOG/CELL"
    );
    for row in &log.workloads {
        let Some(other) = cell.workload(row.workload, row.concurrency) else {
            continue;
        };
        let (a, b) = (&row.summary, &other.summary);
        let _ = writeln!(
            out,
            "{:<18} {:>3} {:>10.0} {:>10.0} {:>7.2}x {:>9.3} {:>9.3} {:>7.2}x",
            row.name,
            row.concurrency,
            a.throughput_per_s,
            b.throughput_per_s,
            ratio(a.throughput_per_s, b.throughput_per_s),
            a.p50_ms,
            b.p50_ms,
            ratio(a.p50_ms, b.p50_ms)
        );
        workloads.push(serde_json::json!({
            "name": row.name,
            "concurrency": row.concurrency,
            "log_per_s": a.throughput_per_s,
            "cell_per_s": b.throughput_per_s,
            "throughput_log_over_cell": ratio(a.throughput_per_s, b.throughput_per_s),
            "log_p50_ms": a.p50_ms,
            "cell_p50_ms": b.p50_ms,
            "p50_log_over_cell": ratio(a.p50_ms, b.p50_ms),
        }));
    }
    let mut fleet = Vec::new();
    let mut fleet_goal = None;
    for row in &log.fleet {
        let Some(other) = cell
            .fleet
            .iter()
            .find(|r| r.cells_requested == row.cells_requested)
        else {
            continue;
        };
        if fleet.is_empty() {
            let _ = writeln!(
                out,
                "\n{:<8} {:>13} {:>14} {:>8} {:>21}",
                "FLEET", "LOG PER NODE", "CELL PER NODE", "LOG/CELL", "LOG COMMANDS/SEGMENT"
            );
        }
        let over = ratio(row.per_node_per_s, other.per_node_per_s);
        let _ = writeln!(
            out,
            "{:<8} {:>13.0} {:>14.0} {:>7.2}x {:>21.1}",
            row.cells_requested,
            row.per_node_per_s,
            other.per_node_per_s,
            over,
            row.phases.commands_per_segment
        );
        fleet.push(serde_json::json!({
            "cells_requested": row.cells_requested,
            "log_cells": row.cells,
            "cell_cells": other.cells,
            "log_per_node_per_s": row.per_node_per_s,
            "cell_per_node_per_s": other.per_node_per_s,
            "log_over_cell": over,
            "log_commands_per_segment": row.phases.commands_per_segment,
        }));
        // Without a cell-mode figure there is nothing to be 10 times.
        if row.cells_requested == FLEET_GOAL_CELLS && other.per_node_per_s > 0.0 {
            fleet_goal = Some((row.concurrency, over));
        }
    }
    let goal =
        format!("fleet at {FLEET_GOAL_CELLS} cells: log >= {FLEET_LOG_OVER_CELL} x cell per node");
    let goal = match fleet_goal {
        Some((concurrency, over)) => {
            Goal::ratio_at_least(goal, concurrency, over, FLEET_LOG_OVER_CELL)
        }
        None => Goal::unmeasured(goal, 0, "x"),
    };
    let _ = writeln!(out, "\ngoals (log against cell):");
    write_goal(&mut out, &goal);
    let json = serde_json::json!({
        "order": runs.iter().map(|(mode, _)| *mode).collect::<Vec<_>>(),
        "workloads": workloads,
        "fleet": fleet,
        "goals": [goal],
    });
    Some((out, json))
}

/// One goal's line: what it asks, at which concurrency, and its verdict.
fn write_goal(out: &mut String, goal: &Goal) {
    let show = |value: f64| match goal.unit {
        "ms" => format!("{value:.3} ms"),
        "x" => format!("{value:.2}x"),
        _ => format!("{value:.0}/s"),
    };
    let (measured, limit, margin) = (
        show(goal.measured),
        show(goal.limit),
        show(goal.margin.abs()),
    );
    let verdict = match goal.met {
        Some(true) => format!("MET: {measured} vs {limit} (margin {margin})"),
        Some(false) => format!(
            "MISSED: {measured} vs {limit}, by {margin} ({:.2}x the limit)",
            ratio(goal.measured, goal.limit)
        ),
        None => "not measured in this run".into(),
    };
    // Fleet goals name no level when their size was not measured.
    let at = if goal.concurrency > 0 {
        format!(" at c={}", goal.concurrency)
    } else {
        String::new()
    };
    let _ = writeln!(out, "  {}{at}: {verdict}", goal.goal);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn fleet_row(cells: usize, per_node_per_s: f64, commands_per_segment: f64) -> FleetRow {
        FleetRow {
            cells_requested: cells,
            cells,
            setup_s: 1.0,
            created_per_s: 1.0,
            concurrency: 64,
            summary: Summary::default(),
            per_node_per_s,
            phases: Phases {
                commands_per_segment,
                ..Phases::default()
            },
            nodes: Vec::new(),
            histogram: load::histogram(),
        }
    }

    fn report(fleet: Vec<FleetRow>) -> Report {
        Report {
            fleet,
            ..Report::default()
        }
    }

    /// The goal is log mode's per-node rate over cell mode's at 1,000
    /// Cells, whichever order the modes ran in; sizes only one mode
    /// measured are left out.
    #[test]
    fn the_fleet_goal_is_log_over_cell_at_a_thousand_cells() {
        let mut runs = [
            (
                "cell",
                report(vec![
                    fleet_row(1_000, 100.0, 0.0),
                    fleet_row(10_000, 90.0, 0.0),
                ]),
            ),
            ("log", report(vec![fleet_row(1_000, 1_100.0, 7.5)])),
        ];
        let (text, json) = log_against_cell(&mut runs).expect("both modes ran");
        assert!(text.contains("in this order: cell, log"), "{text}");
        assert_eq!(json["fleet"].as_array().map(Vec::len), Some(1), "{json}");
        assert_eq!(json["fleet"][0]["log_over_cell"], 11.0, "{json}");
        assert_eq!(json["fleet"][0]["log_commands_per_segment"], 7.5, "{json}");
        let goal = &json["goals"][0];
        assert_eq!(goal["met"], true, "{goal}");
        assert_eq!(goal["measured"], 11.0, "{goal}");
        assert_eq!(goal["concurrency"], 64, "{goal}");
        assert!(
            text.contains(
                "fleet at 1000 cells: log >= 10 x cell per node at c=64: MET: 11.00x vs 10.00x"
            ),
            "{text}"
        );

        runs[1].1.fleet[0].per_node_per_s = 500.0;
        let (text, json) = log_against_cell(&mut runs).expect("both modes ran");
        assert_eq!(json["goals"][0]["met"], false, "{json}");
        assert!(
            text.contains("MISSED: 5.00x vs 10.00x, by 5.00x (0.50x the limit)"),
            "{text}"
        );
    }

    /// A cell mode that served nothing at 1,000 Cells leaves the goal
    /// unmeasured, not missed.
    #[test]
    fn no_cell_figure_leaves_the_fleet_goal_unmeasured() {
        let mut runs = [
            ("log", report(vec![fleet_row(1_000, 900.0, 7.0)])),
            ("cell", report(vec![fleet_row(1_000, 0.0, 0.0)])),
        ];
        let (_, json) = log_against_cell(&mut runs).expect("both modes ran");
        assert!(json["goals"][0]["met"].is_null(), "{json}");
    }

    /// The node log's round-trip goal is listed for log mode only.
    #[test]
    fn the_local_command_goal_is_log_modes() {
        for (mode, listed) in [("log", true), ("cell", false)] {
            let report = Report {
                config: serde_json::json!({ "publication": mode }),
                ..Report::default()
            };
            assert_eq!(
                report
                    .goals()
                    .iter()
                    .any(|g| g.goal.starts_with("local_command p50")),
                listed,
                "{mode}"
            );
        }
    }

    /// One mode alone has nothing to compare; without the 1,000-Cell size
    /// the goal is listed, not measured.
    #[test]
    fn a_single_mode_or_no_thousand_cells_evaluates_nothing() {
        let mut one = [("log", report(vec![fleet_row(1_000, 1.0, 1.0)]))];
        assert!(log_against_cell(&mut one).is_none());
        let mut small = [
            ("log", report(vec![fleet_row(20, 50.0, 2.0)])),
            ("cell", report(vec![fleet_row(20, 10.0, 0.0)])),
        ];
        let (text, json) = log_against_cell(&mut small).expect("both modes ran");
        assert_eq!(json["fleet"][0]["log_over_cell"], 5.0, "{json}");
        assert!(json["goals"][0]["met"].is_null(), "{json}");
        assert!(
            text.contains(
                "fleet at 1000 cells: log >= 10 x cell per node: not measured in this run"
            ),
            "{text}"
        );
    }
}
