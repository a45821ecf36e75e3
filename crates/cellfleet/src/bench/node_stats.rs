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
                "client {:.2} = queueing {:.2} + execute+capture {:.2} + segment PUT {:.2} + other {:.2} + transport/reply {:.2} (ms, means; {:.1} commands per segment, {:.0} segments, {:.0} checkpoints ({:.0} of parked records), {:.0} activations)",
                self.client_mean_ms,
                self.queueing_ms,
                self.execute_ms,
                self.segment_ms,
                other,
                self.reply_ms,
                self.commands_per_segment,
                self.segments,
                self.checkpoints,
                self.parked_checkpoints,
                self.activations
            );
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
        )
    }
}

/// A node process's resident memory and open files (from `/proc`).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct ProcessStats {
    pub rss_bytes: u64,
    pub open_files: u64,
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
    let open_files = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|entries| entries.count() as u64)
        .unwrap_or(0);
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
    fn this_process_has_memory_and_open_files() {
        let stats = process_stats(std::process::id());
        if std::path::Path::new("/proc/self/status").exists() {
            assert!(stats.rss_bytes > 0);
            assert!(stats.open_files > 0);
        }
    }
}
