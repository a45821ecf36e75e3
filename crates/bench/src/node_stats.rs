//! What the node processes say about themselves during a run: their Prometheus metrics (`/metrics` on each node's plain HTTP listener), read before and after a measurement so the difference gives where a command's time went, and their resident memory and open files from `/proc`.
//!
//! The phases come from the runtime's publication histograms (their sums
//! and counts): `execute` (the group in SQLite, capture of the new pages
//! included), `upload` (the LTX file), `cas` (the root replace) and
//! `total` (execution start to released replies). What a client waits on
//! top of its publication's total is the queueing (the mailbox and the
//! group ahead of it, which is still publishing) and the transport and
//! reply; the report splits that remainder using the echo floor as the
//! transport-and-reply estimate.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Longest a metrics read may take.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest metrics response read.
const SCRAPE_BYTES_MAX: u64 = 1 << 20;

/// One node's metric samples: series (name and labels, the `node` label
/// left out) → value.
pub type Samples = HashMap<String, f64>;

/// Every node's samples at one moment (nodes that could not be read are
/// empty, so their differences read as zero).
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    nodes: Vec<Samples>,
}

/// Reads `/metrics` from `addr` (plain HTTP, one request per connection).
async fn scrape_one(addr: SocketAddr) -> std::io::Result<Samples> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nhost: bench\r\nconnection: close\r\n\r\n")
        .await?;
    let mut text = String::new();
    stream
        .take(SCRAPE_BYTES_MAX)
        .read_to_string(&mut text)
        .await?;
    let body = text.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    Ok(parse(body))
}

/// Parses the Prometheus text format: `name{labels} value` lines; the
/// `node="…"` label is dropped so series of different nodes add up.
pub fn parse(text: &str) -> Samples {
    let mut samples = Samples::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        samples.insert(strip_node_label(series), value);
    }
    samples
}

fn strip_node_label(series: &str) -> String {
    let Some((name, labels)) = series.split_once('{') else {
        return series.to_owned();
    };
    let labels = labels.trim_end_matches('}');
    let kept: Vec<&str> = labels
        .split(',')
        .filter(|label| !label.starts_with("node=") && !label.is_empty())
        .collect();
    if kept.is_empty() {
        name.to_owned()
    } else {
        format!("{name}{{{}}}", kept.join(","))
    }
}

/// Every node's metrics now (a node that does not answer reads as empty).
pub async fn scrape(addrs: &[SocketAddr]) -> Snapshot {
    let mut nodes = Vec::with_capacity(addrs.len());
    for addr in addrs {
        let samples = tokio::time::timeout(SCRAPE_TIMEOUT, scrape_one(*addr))
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        nodes.push(samples);
    }
    Snapshot { nodes }
}

impl Snapshot {
    /// `series` summed over the nodes.
    fn sum(&self, series: &str) -> f64 {
        self.nodes
            .iter()
            .filter_map(|samples| samples.get(series))
            .sum()
    }

    /// `series` of node `index`.
    pub fn node(&self, index: usize, series: &str) -> f64 {
        self.nodes
            .get(index)
            .and_then(|samples| samples.get(series))
            .copied()
            .unwrap_or(0.0)
    }
}

/// Where a command's time went over one measurement (cluster-wide means,
/// per publication, in ms), from the difference of two [`Snapshot`]s.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Phases {
    /// Commands published (sum of group sizes).
    pub commands: f64,
    pub publications: f64,
    pub commands_per_publication: f64,
    pub execute_ms: f64,
    /// Groups executed, and those of them on their actor's task rather
    /// than the blocking pool (`cellfleet_runtime_groups_inline_total`).
    pub groups_executed: f64,
    pub groups_inline: f64,
    /// Queries answered on their actor's task
    /// (`cellfleet_runtime_queries_inline_total`).
    pub queries_inline: f64,
    pub upload_ms: f64,
    pub cas_ms: f64,
    /// Log mode: node-log segments written, Cell groups per segment, and a
    /// segment's mean PUT time (first PUT until its slot was decided).
    pub segments: f64,
    pub commands_per_segment: f64,
    pub segment_ms: f64,
    /// Log mode: checkpoints (records merged into roots), and how many of
    /// them were of passivated Cells' parked records.
    pub checkpoints: f64,
    pub parked_checkpoints: f64,
    /// Execution start to released replies (the three above and the rest
    /// of the publication's bookkeeping).
    pub publication_ms: f64,
    pub activations: f64,
    pub passivations: f64,
    /// Lease renewals in the window, those that took over a second from
    /// send to answer, and those answered after the deadline (lapses).
    pub lease_renewals: f64,
    pub lease_renewals_over_1s: f64,
    pub lease_lapses: f64,
    /// Store requests in the window by operation (every node's), in
    /// `cellfleet_store::Op` order; zero-count operations left out.
    pub store_requests: Vec<(String, f64)>,
    /// The node processes' CPU time (user and system, every node) per
    /// command in the window, where measured ([`Phases::cpu`]).
    pub node_cpu_ms_per_command: f64,
    /// Filled by the report: the client's mean latency, the transport and
    /// reply estimate (echo floor p50) and the rest (queueing).
    pub client_mean_ms: f64,
    pub reply_ms: f64,
    pub queueing_ms: f64,
}

const PUBLICATION: &str = "cellfleet_runtime_publication_seconds";

impl Phases {
    pub fn between(before: &Snapshot, after: &Snapshot) -> Self {
        let delta = |series: &str| (after.sum(series) - before.sum(series)).max(0.0);
        let mean_ms = |phase: &str| {
            let count = delta(&format!("{PUBLICATION}_count{{phase=\"{phase}\"}}"));
            let sum = delta(&format!("{PUBLICATION}_sum{{phase=\"{phase}\"}}"));
            if count > 0.0 {
                sum / count * 1e3
            } else {
                0.0
            }
        };
        let commands = delta("cellfleet_runtime_group_commands_sum");
        let publications = delta("cellfleet_runtime_publications_total");
        let segments = delta("cellfleet_runtime_log_segments_total");
        let segment_count = delta("cellfleet_runtime_log_segment_put_seconds_count");
        let segment_ms = if segment_count > 0.0 {
            delta("cellfleet_runtime_log_segment_put_seconds_sum") / segment_count * 1e3
        } else {
            0.0
        };
        let activations = ["created", "adopted", "took_over", "recovered"]
            .iter()
            .map(|how| {
                delta(&format!(
                    "cellfleet_runtime_activations_total{{how=\"{how}\"}}"
                ))
            })
            .sum();
        Phases {
            commands,
            publications,
            commands_per_publication: if publications > 0.0 {
                commands / publications
            } else {
                0.0
            },
            execute_ms: mean_ms("execute"),
            groups_executed: delta(&format!("{PUBLICATION}_count{{phase=\"execute\"}}")),
            groups_inline: delta("cellfleet_runtime_groups_inline_total"),
            queries_inline: delta("cellfleet_runtime_queries_inline_total"),
            upload_ms: mean_ms("upload"),
            cas_ms: mean_ms("cas"),
            segments,
            commands_per_segment: if segments > 0.0 {
                commands / segments
            } else {
                0.0
            },
            segment_ms,
            checkpoints: delta("cellfleet_runtime_checkpoints_total"),
            parked_checkpoints: delta("cellfleet_runtime_parked_checkpoints_total"),
            publication_ms: mean_ms("total"),
            activations,
            passivations: delta("cellfleet_runtime_passivations_total"),
            lease_renewals: delta("cellfleet_runtime_lease_renewal_seconds_count"),
            lease_renewals_over_1s: (delta("cellfleet_runtime_lease_renewal_seconds_count")
                - delta("cellfleet_runtime_lease_renewal_seconds_bucket{le=\"1.0\"}"))
            .max(0.0),
            lease_lapses: delta("cellfleet_runtime_lease_lapses_total"),
            store_requests: cellfleet_store::Op::ALL
                .iter()
                .map(|op| {
                    (
                        op.to_string(),
                        delta(&format!(
                            "cellfleet_runtime_store_requests_total{{op=\"{op}\"}}"
                        )),
                    )
                })
                .filter(|(_, n)| *n > 0.0)
                .collect(),
            node_cpu_ms_per_command: 0.0,
            client_mean_ms: 0.0,
            reply_ms: 0.0,
            queueing_ms: 0.0,
        }
    }

    /// Splits the client's mean latency: what is not the publication is
    /// transport and reply (≈ `reply_ms`) and queueing.
    pub fn attribute(&mut self, client_mean_ms: f64, reply_ms: f64) {
        self.client_mean_ms = client_mean_ms;
        self.reply_ms = reply_ms;
        self.queueing_ms = (client_mean_ms - self.publication_ms - reply_ms).max(0.0);
    }

    /// One line: `queueing 3.1 | execute 0.4 | upload 2.0 | cas 2.2 | other 0.1 | reply 0.3 (ms, mean)`.
    pub fn line(&self) -> String {
        if self.segments > 0.0 {
            let other = (self.publication_ms - self.execute_ms - self.segment_ms).max(0.0);
            return format!(
                "client {:.2} = queueing {:.2} + execute+capture {:.2} + segment PUT {:.2} + other {:.2} + transport/reply {:.2} (ms, means; {:.1} commands per segment, {:.0} segments, {:.0} of {:.0} groups on the actor's task, {:.0} checkpoints ({:.0} of parked records), {:.0} activations)",
                self.client_mean_ms,
                self.queueing_ms,
                self.execute_ms,
                self.segment_ms,
                other,
                self.reply_ms,
                self.commands_per_segment,
                self.segments,
                self.groups_inline,
                self.groups_executed,
                self.checkpoints,
                self.parked_checkpoints,
                self.activations
            ) + &self.measured_line();
        }
        let other = (self.publication_ms - self.execute_ms - self.upload_ms - self.cas_ms).max(0.0);
        format!(
            "client {:.2} = queueing {:.2} + execute+capture {:.2} + upload {:.2} + cas {:.2} + other {:.2} + transport/reply {:.2} (ms, means; {:.1} commands per publication, {:.0} activations)",
            self.client_mean_ms,
            self.queueing_ms,
            self.execute_ms,
            self.upload_ms,
            self.cas_ms,
            other,
            self.reply_ms,
            self.commands_per_publication,
            self.activations
        ) + &self.measured_line()
    }

    /// Records the nodes' CPU seconds spent in the window (the sum over
    /// every node process) as milliseconds per command.
    pub fn cpu(&mut self, node_cpu_s: f64) {
        if self.commands > 0.0 {
            self.node_cpu_ms_per_command = node_cpu_s / self.commands * 1e3;
        }
    }

    /// `; nodes' CPU 0.45 ms per command; store requests: put_if_none_match
    /// 812, get 3` (each part only where measured).
    fn measured_line(&self) -> String {
        let mut line = String::new();
        if self.node_cpu_ms_per_command > 0.0 {
            line += &format!(
                "; nodes' CPU {:.2} ms per command",
                self.node_cpu_ms_per_command
            );
        }
        if !self.store_requests.is_empty() {
            let ops: Vec<String> = self
                .store_requests
                .iter()
                .map(|(op, n)| format!("{op} {n:.0}"))
                .collect();
            line += &format!("; store requests: {}", ops.join(", "));
        }
        if self.lease_renewals > 0.0 {
            line += &format!(
                "; lease renewals {:.0} ({:.0} took over 1 s, {:.0} lapsed)",
                self.lease_renewals, self.lease_renewals_over_1s, self.lease_lapses
            );
        }
        line
    }
}

/// A node process's resident memory and open files (from `/proc`).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct ProcessStats {
    pub rss_bytes: u64,
    pub open_files: u64,
}

/// CPU seconds (user and system, every thread) process `pid` has used,
/// from `/proc/PID/stat`; `None` where `/proc` is not there.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces, in parentheses):
    // state is field 3, utime field 14, stime field 15.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    let ticks = rustix::param::clock_ticks_per_second().max(1);
    Some((utime + stime) as f64 / ticks as f64)
}

/// `/proc/PID/status` VmRSS and the entries of `/proc/PID/fd`; zeros where
/// `/proc` is not there (not Linux, or the process is gone).
pub fn process_stats(pid: u32) -> ProcessStats {
    let rss_bytes = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|line| line.starts_with("VmRSS:"))
                .and_then(|line| line.split_whitespace().nth(1))
                .and_then(|kib| kib.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024);
    // Linux 6.2 and later give the count as the directory's size; reading
    // thousands of entries twice a second per node was a twentieth of the
    // machine's CPU during a 10,000-Cell fleet run.
    let fd_dir = format!("/proc/{pid}/fd");
    let open_files = match std::fs::metadata(&fd_dir) {
        Ok(meta) if meta.len() > 0 => meta.len(),
        _ => std::fs::read_dir(&fd_dir)
            .map(|entries| entries.count() as u64)
            .unwrap_or(0),
    };
    ProcessStats {
        rss_bytes,
        open_files,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_parsed_without_the_node_label_and_phases_come_from_differences() {
        let before = Snapshot {
            nodes: vec![parse(
                "# HELP x\ncellfleet_runtime_publications_total{node=\"n1\"} 10\n\
                 cellfleet_runtime_group_commands_sum{node=\"n1\"} 20\n\
                 cellfleet_runtime_publication_seconds_sum{node=\"n1\",phase=\"cas\"} 1.0\n\
                 cellfleet_runtime_publication_seconds_count{node=\"n1\",phase=\"cas\"} 10\n",
            )],
        };
        let after = Snapshot {
            nodes: vec![parse(
                "cellfleet_runtime_publications_total{node=\"n1\"} 20\n\
                 cellfleet_runtime_group_commands_sum{node=\"n1\"} 60\n\
                 cellfleet_runtime_publication_seconds_sum{node=\"n1\",phase=\"cas\"} 1.05\n\
                 cellfleet_runtime_publication_seconds_count{node=\"n1\",phase=\"cas\"} 20\n\
                 garbage line\n",
            )],
        };
        let phases = Phases::between(&before, &after);
        assert_eq!(phases.publications, 10.0);
        assert_eq!(phases.commands, 40.0);
        assert_eq!(phases.commands_per_publication, 4.0);
        assert!((phases.cas_ms - 5.0).abs() < 1e-9, "{phases:?}");
        assert_eq!(phases.upload_ms, 0.0);
        assert_eq!(after.node(0, "cellfleet_runtime_publications_total"), 20.0);
    }

    #[test]
    fn slow_renewals_and_lapses_are_read_from_a_nodes_own_exposition() {
        use std::sync::atomic::Ordering;
        let metrics = cellfleet_runtime::Metrics::default();
        let before = Snapshot {
            nodes: vec![parse(&metrics.render("n1"))],
        };
        for ms in [40, 900, 1_500, 4_000] {
            metrics
                .lease_renewal_seconds
                .observe_duration(std::time::Duration::from_millis(ms));
        }
        metrics.lease_lapses_total.fetch_add(1, Ordering::Relaxed);
        metrics.groups_inline_total.fetch_add(3, Ordering::Relaxed);
        metrics.queries_inline_total.fetch_add(5, Ordering::Relaxed);
        for _ in 0..4 {
            metrics
                .publication_execute_seconds
                .observe_duration(std::time::Duration::from_micros(80));
        }
        let after = Snapshot {
            nodes: vec![parse(&metrics.render("n1"))],
        };
        let phases = Phases::between(&before, &after);
        assert_eq!(phases.lease_renewals, 4.0);
        assert_eq!(phases.lease_renewals_over_1s, 2.0);
        assert_eq!(phases.lease_lapses, 1.0);
        assert_eq!(phases.groups_inline, 3.0);
        assert_eq!(phases.groups_executed, 4.0);
        assert_eq!(phases.queries_inline, 5.0);
        assert!(
            phases
                .measured_line()
                .contains("lease renewals 4 (2 took over 1 s, 1 lapsed)"),
            "{}",
            phases.measured_line()
        );
    }

    #[test]
    fn this_process_has_memory_and_open_files() {
        let stats = process_stats(std::process::id());
        if std::path::Path::new("/proc/self/status").exists() {
            assert!(stats.rss_bytes > 0);
            assert!(stats.open_files > 0);
            let listed = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
            // The listing holds one descriptor of its own while it runs.
            assert!(
                stats.open_files.abs_diff(listed) <= 2,
                "{} vs {listed}",
                stats.open_files
            );
        }
    }

    #[test]
    fn this_process_cpu_time_grows_while_it_computes() {
        let Some(before) = cpu_seconds(std::process::id()) else {
            assert!(!std::path::Path::new("/proc/self/stat").exists());
            return;
        };
        // Computes until the counter moves (ticks are 10 ms), however
        // loaded the machine; a counter that never moves fails.
        let started = std::time::Instant::now();
        let mut x = 0u64;
        let mut after = before;
        while after - before < 0.05 && started.elapsed() < std::time::Duration::from_secs(30) {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
            after = cpu_seconds(std::process::id()).unwrap();
        }
        assert!(after - before >= 0.05, "{before} -> {after}");
    }
}
