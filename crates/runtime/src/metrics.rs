//! Node metrics with units in their names; `prometheus-client` encodes them in the OpenMetrics text format.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// The content type of [`Metrics::render`]'s text.
pub const EXPOSITION_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Upper bounds of the latency histograms, in seconds.
const SECONDS_BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024,
];
/// Upper bounds of the lease-renewal histogram, in seconds (a renewal
/// matters against a lease of seconds).
const LEASE_SECONDS_BUCKETS: [f64; 10] = [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0];
/// Upper bounds of the group-size histogram, in commands.
const COMMANDS_BUCKETS: [f64; 10] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];

/// Upper bounds of the segment-size histogram, in bytes.
const BYTES_BUCKETS: [f64; 10] = [
    1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0, 8388608.0, 16777216.0,
    67108864.0,
];

/// A cumulative histogram with fixed buckets.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    sum_micros: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    /// Records one observation.
    pub fn observe(&self, value: f64) {
        if let Some(index) = self.bounds.iter().position(|bound| value <= *bound) {
            self.counts[index].fetch_add(1, Ordering::Relaxed);
        }
        self.sum_micros
            .fetch_add((value * 1e6) as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Records a duration in seconds.
    pub fn observe_duration(&self, duration: Duration) {
        self.observe(duration.as_secs_f64());
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// The buckets now: upper bounds with cumulative counts, and the total.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut cumulative = 0;
        let buckets = self
            .bounds
            .iter()
            .zip(&self.counts)
            .map(|(bound, count)| {
                cumulative += count.load(Ordering::Relaxed);
                (*bound, cumulative)
            })
            .collect();
        HistogramSnapshot {
            buckets,
            count: self.count(),
        }
    }

    /// The histogram for the exposition (per-bucket counts, `+Inf` last).
    fn sample(&self) -> HistogramSample {
        let mut buckets: Vec<(f64, u64)> = self
            .bounds
            .iter()
            .zip(&self.counts)
            .map(|(bound, count)| (*bound, count.load(Ordering::Relaxed)))
            .collect();
        let count = self.count();
        let bounded: u64 = buckets.iter().map(|(_, n)| n).sum();
        buckets.push((f64::INFINITY, count.saturating_sub(bounded)));
        HistogramSample {
            sum: self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6,
            count,
            buckets,
        }
    }
}

/// A histogram read at one instant: `(upper bound, observations <= bound)`
/// in bound order, and every observation (`count` minus the last bucket's
/// are above the largest bound).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HistogramSnapshot {
    /// Upper bounds with cumulative counts.
    pub buckets: Vec<(f64, u64)>,
    /// Observations in total.
    pub count: u64,
}

/// What an operator looks at first, read at one instant: counters
/// (rates come from two snapshots), gauges and the commit latency.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// Commands acknowledged.
    pub commands_total: u64,
    /// Queries answered.
    pub queries_total: u64,
    /// Publications (cell mode: groups; log mode: records) committed.
    pub publications_total: u64,
    /// Node-log segments written.
    pub log_segments_total: u64,
    /// Checkpoints published.
    pub checkpoints_total: u64,
    /// Requests refused over a bound.
    pub refusals_total: u64,
    /// Cells open now.
    pub cells_open: u64,
    /// Requests queued in mailboxes and groups now.
    pub queue_depth_commands: u64,
    /// Records past their roots on open Cells now.
    pub checkpoint_lag_records: u64,
    /// From a group's execution to its released replies.
    pub publication_seconds: HistogramSnapshot,
    /// From a segment's first PUT to its slot being decided (log mode).
    pub log_segment_put_seconds: HistogramSnapshot,
}

/// Every metric of one node.
#[derive(Debug)]
pub struct Metrics {
    /// Requests queued in Cell mailboxes and groups, node-wide.
    pub queue_depth_commands: AtomicI64,
    /// Commands per published group.
    pub group_commands: Histogram,
    /// Executing a group in SQLite (including capture).
    pub publication_execute_seconds: Histogram,
    /// Uploading a group's LTX file.
    pub publication_upload_seconds: Histogram,
    /// The root CAS (including reconciliation after a lost reply).
    pub publication_cas_seconds: Histogram,
    /// From execution to released replies.
    pub publication_total_seconds: Histogram,
    /// Publications committed.
    pub publications_total: AtomicU64,
    /// Commands acknowledged (in published groups).
    pub commands_total: AtomicU64,
    /// Queries answered.
    pub queries_total: AtomicU64,
    /// Watches answered ([`crate::node::NodeHandle::watch`]).
    pub watches_total: AtomicU64,
    /// Watches answered with a newer acknowledged TXID (a wake).
    pub watch_wakes_total: AtomicU64,
    /// Publications refused because another owner exists (412).
    pub fences_total: AtomicU64,
    /// Envelope signatures verified by this node's router (shared with its
    /// `Verifier`, which counts them).
    pub signatures_verified_total: Arc<AtomicU64>,
    /// Publications whose fate could not be proven.
    pub publications_unknown_total: AtomicU64,
    /// Compactions published.
    pub compactions_total: AtomicU64,
    /// Activations by how ownership was obtained.
    pub activations_created_total: AtomicU64,
    /// Activations of a root this session already owned.
    pub activations_adopted_total: AtomicU64,
    /// Activations that took a root over.
    pub activations_took_over_total: AtomicU64,
    /// Activations that rebuilt the Cell from its chain.
    pub activations_recovered_total: AtomicU64,
    /// Activations that created a root the router had just read absent,
    /// without reading it again.
    pub activation_root_reads_saved_total: AtomicU64,
    /// Cells passivated.
    pub passivations_total: AtomicU64,
    /// Groups executed on their actor's task instead of the blocking pool.
    pub groups_inline_total: AtomicU64,
    /// Queries run on their Cell's actor task instead of the blocking pool.
    pub queries_inline_total: AtomicU64,
    /// Cells open now.
    pub cells_open: AtomicI64,
    /// Requests refused over a bound.
    pub refusals_total: AtomicU64,
    /// Fresh root reads made because the lease's local deadline had passed.
    pub authority_reads_total: AtomicU64,
    /// Lease renewals that committed.
    pub lease_renewals_total: AtomicU64,
    /// Renewals answered after the deadline they replaced (a new term).
    pub lease_lapses_total: AtomicU64,
    /// A renewal's time from send to answer, whatever the answer (a slow
    /// store or a starved process shows here before a lapse does).
    pub lease_renewal_seconds: Histogram,
    /// Node-log segments written (log mode).
    pub log_segments_total: AtomicU64,
    /// Cell groups per segment.
    pub log_segment_records: Histogram,
    /// Encoded bytes per segment.
    pub log_segment_bytes: Histogram,
    /// From a segment's first PUT to its slot being decided.
    pub log_segment_put_seconds: Histogram,
    /// Cell groups waiting in this node's lanes for a segment (the lanes'
    /// queue depth).
    pub log_lane_pending_records: AtomicI64,
    /// Acknowledged segments of this node's lanes still held for records
    /// some root has not checkpointed (the checkpoint lag in segments: what
    /// a successor's replay and the bucket keep), measured each collection
    /// round.
    pub log_lane_held_segments: AtomicI64,
    /// Checkpoints (a Cell's records merged into its root's chain).
    pub checkpoints_total: AtomicU64,
    /// Records a checkpoint moved into the chain (the lag it cleared).
    pub checkpoint_records: Histogram,
    /// Records past their roots on owned Cells now, open or parked
    /// (checkpoint lag).
    pub checkpoint_lag_records: AtomicI64,
    /// Bytes of acknowledged records that passivated Cells keep in memory
    /// past their roots (parked tails), until the node checkpoints them.
    pub parked_tail_bytes: AtomicI64,
    /// Checkpoints of parked tails (the node's, not an open Cell's).
    pub parked_checkpoints_total: AtomicU64,
    /// Cell records replayed from a node log at activation.
    pub log_replayed_records_total: AtomicU64,
    /// Lanes of dead sessions this node sealed or found sealed.
    pub log_seals_total: AtomicU64,
    /// Dead sessions whose log this node flushed into their Cells' roots.
    pub log_flushes_total: AtomicU64,
    /// Chunk indexes read while indexing dead sessions' lanes (each stands
    /// for 256 segments' own indexes).
    pub log_chunk_indexes_read_total: AtomicU64,
    /// Segments whose own index was read while indexing dead sessions'
    /// lanes (those no chunk index covered).
    pub log_slot_indexes_read_total: AtomicU64,
    /// Segments deleted by garbage collection (this node's lanes, and
    /// dead sessions' lanes it flushed).
    pub gc_segments_deleted_total: AtomicU64,
    /// LTX files deleted after a checkpoint or compaction replaced them.
    pub gc_ltx_deleted_total: AtomicU64,
    /// Garbage-collection deletions that failed (retried later or leaked).
    pub gc_failures_total: AtomicU64,
    /// The node's store, counting its requests by operation (set once at
    /// start).
    pub store: std::sync::OnceLock<std::sync::Arc<cellfleet_store::MeteredStore>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            queue_depth_commands: AtomicI64::new(0),
            group_commands: Histogram::new(&COMMANDS_BUCKETS),
            publication_execute_seconds: Histogram::new(&SECONDS_BUCKETS),
            publication_upload_seconds: Histogram::new(&SECONDS_BUCKETS),
            publication_cas_seconds: Histogram::new(&SECONDS_BUCKETS),
            publication_total_seconds: Histogram::new(&SECONDS_BUCKETS),
            publications_total: AtomicU64::new(0),
            commands_total: AtomicU64::new(0),
            queries_total: AtomicU64::new(0),
            watches_total: AtomicU64::new(0),
            watch_wakes_total: AtomicU64::new(0),
            fences_total: AtomicU64::new(0),
            signatures_verified_total: Arc::new(AtomicU64::new(0)),
            publications_unknown_total: AtomicU64::new(0),
            compactions_total: AtomicU64::new(0),
            activations_created_total: AtomicU64::new(0),
            activations_adopted_total: AtomicU64::new(0),
            activations_took_over_total: AtomicU64::new(0),
            activations_recovered_total: AtomicU64::new(0),
            activation_root_reads_saved_total: AtomicU64::new(0),
            passivations_total: AtomicU64::new(0),
            groups_inline_total: AtomicU64::new(0),
            queries_inline_total: AtomicU64::new(0),
            cells_open: AtomicI64::new(0),
            refusals_total: AtomicU64::new(0),
            authority_reads_total: AtomicU64::new(0),
            lease_renewals_total: AtomicU64::new(0),
            lease_lapses_total: AtomicU64::new(0),
            lease_renewal_seconds: Histogram::new(&LEASE_SECONDS_BUCKETS),
            log_segments_total: AtomicU64::new(0),
            log_segment_records: Histogram::new(&COMMANDS_BUCKETS),
            log_segment_bytes: Histogram::new(&BYTES_BUCKETS),
            log_segment_put_seconds: Histogram::new(&SECONDS_BUCKETS),
            log_lane_pending_records: AtomicI64::new(0),
            log_lane_held_segments: AtomicI64::new(0),
            checkpoints_total: AtomicU64::new(0),
            checkpoint_records: Histogram::new(&COMMANDS_BUCKETS),
            checkpoint_lag_records: AtomicI64::new(0),
            parked_tail_bytes: AtomicI64::new(0),
            parked_checkpoints_total: AtomicU64::new(0),
            log_replayed_records_total: AtomicU64::new(0),
            log_seals_total: AtomicU64::new(0),
            log_flushes_total: AtomicU64::new(0),
            log_chunk_indexes_read_total: AtomicU64::new(0),
            log_slot_indexes_read_total: AtomicU64::new(0),
            gc_segments_deleted_total: AtomicU64::new(0),
            gc_ltx_deleted_total: AtomicU64::new(0),
            gc_failures_total: AtomicU64::new(0),
            store: std::sync::OnceLock::new(),
        }
    }
}

/// A histogram read for the exposition: its sum, count and per-bucket
/// counts (the last bucket is `+Inf`), encoded by `prometheus-client`.
#[derive(Debug)]
struct HistogramSample {
    sum: f64,
    count: u64,
    buckets: Vec<(f64, u64)>,
}

impl EncodeMetric for HistogramSample {
    fn encode(&self, mut encoder: MetricEncoder) -> std::fmt::Result {
        encoder.encode_histogram::<NoLabelSet>(self.sum, self.count, &self.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// One metric's series told apart by one label (`phase`, `how`, `op`).
#[derive(Debug)]
struct ByLabel<M> {
    label: &'static str,
    metric_type: MetricType,
    series: Vec<(String, M)>,
}

impl<M: EncodeMetric> EncodeMetric for ByLabel<M> {
    fn encode(&self, mut encoder: MetricEncoder) -> std::fmt::Result {
        for (value, metric) in &self.series {
            let labels = [(self.label, value.as_str())];
            metric.encode(encoder.encode_family(&labels)?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        self.metric_type
    }
}

/// The exposition being built: every metric read once, registered under
/// its name (`prometheus-client` adds `_total` to counters and the final
/// period of each help text).
struct Exposition(Registry);

impl Exposition {
    fn counter(&mut self, name: &str, help: &str, value: u64) {
        self.0.register(name, help, ConstCounter::new(value));
    }

    fn gauge(&mut self, name: &str, help: &str, value: &AtomicI64) {
        // A gauge that went below zero (a bug elsewhere) reads as zero.
        let value = value.load(Ordering::Relaxed).max(0);
        self.0.register(name, help, ConstGauge::new(value));
    }

    fn histogram(&mut self, name: &str, help: &str, histogram: &Histogram) {
        self.0.register(name, help, histogram.sample());
    }

    fn by_label<M: EncodeMetric + std::fmt::Debug + Send + Sync + 'static>(
        &mut self,
        name: &str,
        help: &str,
        label: &'static str,
        metric_type: MetricType,
        series: Vec<(String, M)>,
    ) {
        let metric = ByLabel {
            label,
            metric_type,
            series,
        };
        self.0.register(name, help, metric);
    }
}

impl Metrics {
    /// The operator's summary of these metrics now.
    pub fn snapshot(&self) -> Snapshot {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let gauge = |a: &AtomicI64| u64::try_from(a.load(Ordering::Relaxed)).unwrap_or(0);
        Snapshot {
            commands_total: load(&self.commands_total),
            queries_total: load(&self.queries_total),
            publications_total: load(&self.publications_total),
            log_segments_total: load(&self.log_segments_total),
            checkpoints_total: load(&self.checkpoints_total),
            refusals_total: load(&self.refusals_total),
            cells_open: gauge(&self.cells_open),
            queue_depth_commands: gauge(&self.queue_depth_commands),
            checkpoint_lag_records: gauge(&self.checkpoint_lag_records),
            publication_seconds: self.publication_total_seconds.snapshot(),
            log_segment_put_seconds: self.log_segment_put_seconds.snapshot(),
        }
    }

    /// The exposition of every metric in the OpenMetrics text format
    /// (served as [`EXPOSITION_CONTENT_TYPE`]), each series labelled with
    /// `node`.
    pub fn render(&self, node: &str) -> String {
        let registry = Registry::with_labels(
            [(
                std::borrow::Cow::Borrowed("node"),
                std::borrow::Cow::Owned(node.to_owned()),
            )]
            .into_iter(),
        );
        let mut out = Exposition(registry);
        self.register_runtime(&mut out);
        self.register_log(&mut out);
        self.register_cells_and_lease(&mut out);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &out.0)
            .expect("writing to a String cannot fail");
        text
    }

    /// Requests, publications and the store.
    fn register_runtime(&self, out: &mut Exposition) {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        out.gauge(
            "cellfleet_runtime_queue_depth_commands",
            "Requests waiting in cell mailboxes and groups",
            &self.queue_depth_commands,
        );
        out.gauge(
            "cellfleet_runtime_cells_open",
            "Cells open on this node",
            &self.cells_open,
        );
        out.histogram(
            "cellfleet_runtime_group_commands",
            "Commands per published group",
            &self.group_commands,
        );
        let phases = [
            ("execute", &self.publication_execute_seconds),
            ("upload", &self.publication_upload_seconds),
            ("cas", &self.publication_cas_seconds),
            ("total", &self.publication_total_seconds),
        ];
        out.by_label(
            "cellfleet_runtime_publication_seconds",
            "Publication latency by phase",
            "phase",
            MetricType::Histogram,
            phases
                .into_iter()
                .map(|(phase, histogram)| (phase.to_owned(), histogram.sample()))
                .collect(),
        );
        for (name, help, value) in [
            ("cellfleet_runtime_publications", "Publications committed", &self.publications_total),
            ("cellfleet_runtime_commands", "Commands acknowledged", &self.commands_total),
            ("cellfleet_runtime_queries", "Queries answered", &self.queries_total),
            ("cellfleet_runtime_watches", "Watches of a Cell's acknowledged state answered (a peer's or this node's live reads)", &self.watches_total),
            ("cellfleet_runtime_watch_wakes", "Watches answered with a newer acknowledged state", &self.watch_wakes_total),
            (
                "cellfleet_router_signatures_verified",
                "Ed25519 envelope signatures verified: one per signed client request this node receives from a client, and one per request a peer forwards without having verified it (an older ingress)",
                &self.signatures_verified_total,
            ),
            ("cellfleet_runtime_fences", "Publications refused because another owner exists", &self.fences_total),
            (
                "cellfleet_runtime_publications_unknown",
                "Publications whose fate could not be proven",
                &self.publications_unknown_total,
            ),
            ("cellfleet_runtime_compactions", "Compactions published with a delta", &self.compactions_total),
            (
                "cellfleet_runtime_activation_root_reads_saved",
                "Activations that created a Cell's root on the router's read of its absence, without a second read",
                &self.activation_root_reads_saved_total,
            ),
        ] {
            out.counter(name, help, load(value));
        }
        if let Some(store) = self.store.get() {
            let (calls, failures) = (store.calls(), store.failures());
            for (name, help, counts) in [
                (
                    "cellfleet_runtime_store_requests",
                    "Requests to the object store by operation",
                    &calls,
                ),
                (
                    "cellfleet_runtime_store_failures",
                    "Store requests that failed (not a refused precondition or a missing key), by operation",
                    &failures,
                ),
            ] {
                let series = cellfleet_store::Op::ALL
                    .iter()
                    .map(|op| (op.to_string(), ConstCounter::new(counts.get(*op))))
                    .collect();
                out.by_label(name, help, "op", MetricType::Counter, series);
            }
        }
        let activations = [
            ("created", &self.activations_created_total),
            ("adopted", &self.activations_adopted_total),
            ("took_over", &self.activations_took_over_total),
            ("recovered", &self.activations_recovered_total),
        ];
        out.by_label(
            "cellfleet_runtime_activations",
            "Cell activations by how ownership was obtained",
            "how",
            MetricType::Counter,
            activations
                .into_iter()
                .map(|(how, value)| (how.to_owned(), ConstCounter::new(load(value))))
                .collect(),
        );
    }

    /// The node log, checkpoints and garbage collection.
    fn register_log(&self, out: &mut Exposition) {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        out.counter(
            "cellfleet_runtime_log_segments",
            "Node-log segments written",
            load(&self.log_segments_total),
        );
        out.histogram(
            "cellfleet_runtime_log_segment_records",
            "Cell groups per node-log segment",
            &self.log_segment_records,
        );
        out.histogram(
            "cellfleet_runtime_log_segment_bytes",
            "Encoded bytes per node-log segment",
            &self.log_segment_bytes,
        );
        out.histogram(
            "cellfleet_runtime_log_segment_put_seconds",
            "From a segment's first PUT until its slot is decided",
            &self.log_segment_put_seconds,
        );
        out.counter(
            "cellfleet_runtime_checkpoints",
            "Checkpoints: a Cell's log records merged into its root's chain",
            load(&self.checkpoints_total),
        );
        out.histogram(
            "cellfleet_runtime_checkpoint_records",
            "Records one checkpoint moved into the chain",
            &self.checkpoint_records,
        );
        out.gauge(
            "cellfleet_runtime_log_lane_pending_records",
            "Cell groups waiting in the node log's lanes for a segment",
            &self.log_lane_pending_records,
        );
        out.gauge(
            "cellfleet_runtime_log_lane_held_segments",
            "Acknowledged node-log segments still held for records not yet checkpointed into their roots",
            &self.log_lane_held_segments,
        );
        out.gauge(
            "cellfleet_runtime_checkpoint_lag_records",
            "Records past their roots on owned cells (open or parked)",
            &self.checkpoint_lag_records,
        );
        out.gauge(
            "cellfleet_runtime_parked_tail_bytes",
            "Bytes of acknowledged records passivated cells keep in memory past their roots",
            &self.parked_tail_bytes,
        );
        for (name, help, value) in [
            (
                "cellfleet_runtime_parked_checkpoints",
                "Checkpoints of passivated cells' parked records (a subset of cellfleet_runtime_checkpoints_total)",
                &self.parked_checkpoints_total,
            ),
            (
                "cellfleet_runtime_log_replayed_records",
                "Cell records replayed from a node log at activation",
                &self.log_replayed_records_total,
            ),
            (
                "cellfleet_runtime_log_seals",
                "Lanes of dead sessions sealed (or found sealed) before a takeover",
                &self.log_seals_total,
            ),
            (
                "cellfleet_runtime_log_flushes",
                "Dead sessions whose log this node flushed into their cells' roots",
                &self.log_flushes_total,
            ),
            (
                "cellfleet_runtime_log_chunk_indexes_read",
                "Chunk indexes read while indexing dead sessions' lanes (each stands for 256 segments)",
                &self.log_chunk_indexes_read_total,
            ),
            (
                "cellfleet_runtime_log_slot_indexes_read",
                "Segments whose own index was read while indexing dead sessions' lanes",
                &self.log_slot_indexes_read_total,
            ),
            (
                "cellfleet_runtime_gc_segments_deleted",
                "Log segments deleted by garbage collection",
                &self.gc_segments_deleted_total,
            ),
            (
                "cellfleet_runtime_gc_ltx_deleted",
                "LTX files deleted after a checkpoint or compaction replaced them",
                &self.gc_ltx_deleted_total,
            ),
            (
                "cellfleet_runtime_gc_failures",
                "Garbage-collection deletions that failed",
                &self.gc_failures_total,
            ),
        ] {
            out.counter(name, help, load(value));
        }
    }

    /// Passivation, refusals and the lease.
    fn register_cells_and_lease(&self, out: &mut Exposition) {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        for (name, help, value) in [
            ("cellfleet_runtime_passivations", "Cells passivated", &self.passivations_total),
            (
                "cellfleet_runtime_groups_inline",
                "Groups executed on their actor's task, not the blocking pool",
                &self.groups_inline_total,
            ),
            (
                "cellfleet_runtime_queries_inline",
                "Queries run on their Cell's actor task, not the blocking pool",
                &self.queries_inline_total,
            ),
            ("cellfleet_runtime_refusals", "Requests refused over a bound", &self.refusals_total),
            (
                "cellfleet_runtime_authority_reads",
                "Root reads made while self-fenced",
                &self.authority_reads_total,
            ),
            ("cellfleet_runtime_lease_renewals", "Lease renewals committed", &self.lease_renewals_total),
            (
                "cellfleet_runtime_lease_lapses",
                "Lease renewals answered after the deadline lapsed (owned cells re-prove ownership)",
                &self.lease_lapses_total,
            ),
        ] {
            out.counter(name, help, load(value));
        }
        out.histogram(
            "cellfleet_runtime_lease_renewal_seconds",
            "Lease renewal time from send to answer",
            &self.lease_renewal_seconds,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative() {
        let metrics = Metrics::default();
        metrics.group_commands.observe(3.0);
        metrics.group_commands.observe(600.0);
        let text = metrics.render("n1");
        assert!(
            text.contains("cellfleet_runtime_group_commands_bucket{node=\"n1\",le=\"4.0\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("cellfleet_runtime_group_commands_bucket{node=\"n1\",le=\"+Inf\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("cellfleet_runtime_group_commands_count{node=\"n1\"} 2"),
            "{text}"
        );
    }

    #[test]
    fn snapshots_are_cumulative_and_agree_with_the_text() {
        let metrics = Metrics::default();
        for seconds in [0.0004, 0.003, 0.003, 5.0] {
            metrics.publication_total_seconds.observe(seconds);
        }
        metrics.commands_total.fetch_add(7, Ordering::Relaxed);
        metrics.cells_open.fetch_sub(1, Ordering::Relaxed);
        let snapshot = metrics.snapshot();
        let buckets = &snapshot.publication_seconds.buckets;
        assert_eq!(buckets.len(), SECONDS_BUCKETS.len());
        assert_eq!(buckets[0], (0.0005, 1));
        assert_eq!(buckets[2], (0.002, 1));
        assert_eq!(buckets[3], (0.004, 3));
        assert_eq!(buckets.last(), Some(&(1.024, 3)));
        assert_eq!(snapshot.publication_seconds.count, 4);
        assert_eq!(snapshot.commands_total, 7);
        // A gauge that went below zero reads as zero, as in the text.
        assert_eq!(snapshot.cells_open, 0);
        let text = metrics.render("n1");
        assert!(
            text.contains("cellfleet_runtime_commands_total{node=\"n1\"} 7"),
            "{text}"
        );
        assert!(
            text.contains("cellfleet_runtime_queries_total{node=\"n1\"} 0"),
            "{text}"
        );
    }

    /// The exposition is well-formed OpenMetrics: one HELP and TYPE per
    /// family (the help with one final period), every sample a name, its
    /// labels and a number, `# EOF` last; an observation above the
    /// largest bound counts in `+Inf` alone; the series operators read
    /// keep their names.
    #[test]
    fn the_exposition_is_well_formed_and_keeps_its_names() {
        let metrics = Metrics::default();
        metrics.lease_renewal_seconds.observe(20.0);
        metrics.lease_renewal_seconds.observe(0.2);
        metrics.passivations_total.fetch_add(2, Ordering::Relaxed);
        let text = metrics.render("n2");
        assert!(text.ends_with("# EOF\n"), "{text}");
        let mut helps = std::collections::HashSet::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (family, help) = rest.split_once(' ').expect("a help text");
                assert!(helps.insert(family.to_owned()), "{family} twice");
                assert!(help.ends_with('.') && !help.ends_with(".."), "{line}");
            } else if !line.starts_with('#') {
                let (series, value) = line.rsplit_once(' ').expect("a value");
                assert!(value.parse::<f64>().is_ok(), "{line}");
                assert!(series.contains("{node=\"n2\""), "{line}");
            }
        }
        for sample in [
            "cellfleet_runtime_lease_renewal_seconds_bucket{node=\"n2\",le=\"0.25\"} 1",
            "cellfleet_runtime_lease_renewal_seconds_bucket{node=\"n2\",le=\"10.0\"} 1",
            "cellfleet_runtime_lease_renewal_seconds_bucket{node=\"n2\",le=\"+Inf\"} 2",
            "cellfleet_runtime_lease_renewal_seconds_count{node=\"n2\"} 2",
            "cellfleet_runtime_passivations_total{node=\"n2\"} 2",
            "cellfleet_runtime_activations_total{node=\"n2\",how=\"took_over\"} 0",
            "cellfleet_runtime_publication_seconds_count{node=\"n2\",phase=\"cas\"} 0",
            "cellfleet_router_signatures_verified_total{node=\"n2\"} 0",
            "cellfleet_runtime_gc_failures_total{node=\"n2\"} 0",
            "cellfleet_runtime_log_lane_held_segments{node=\"n2\"} 0",
        ] {
            assert!(text.contains(&format!("{sample}\n")), "{sample}: {text}");
        }
        // Every family of the exposition before it moved to prometheus-client
        // (the two store families need a store), the two of watches and
        // the inline groups and queries, and the activation root reads saved.
        assert_eq!(helps.len(), 42, "{helps:?}");
        assert!(
            helps.contains("cellfleet_runtime_groups_inline"),
            "{helps:?}"
        );
        assert!(
            helps.contains("cellfleet_runtime_queries_inline"),
            "{helps:?}"
        );
        assert!(helps.contains("cellfleet_runtime_watches"), "{helps:?}");
        assert!(helps.contains("cellfleet_runtime_watch_wakes"), "{helps:?}");
    }
}
