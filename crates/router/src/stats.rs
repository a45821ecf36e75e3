//! Node stats for operators: one node's metrics as a [`v1::NodeStats`] (pure), and every live node's gathered for `Admin.NodeStats` (the console's and `cellfleet stats`' one source).

use std::sync::Arc;
use std::time::Duration;

use cellfleet_proto::v1;
use cellfleet_runtime::{HistogramSnapshot, PublicationMode, Snapshot};
use tokio::task::JoinSet;

use crate::forward::Router;

/// How long a peer may take to answer Peer.Stats before it is reported
/// unreachable.
pub const PEER_STATS_TIMEOUT: Duration = Duration::from_secs(2);

/// `snapshot` of node `node_id`, read at `at_ms`, owning `cells_owned`
/// Cells.
pub fn node_stats(
    node_id: &str,
    at_ms: i64,
    snapshot: &Snapshot,
    cells_owned: u64,
) -> v1::NodeStats {
    v1::NodeStats {
        node_id: node_id.to_owned(),
        at_ms,
        commands_total: snapshot.commands_total,
        queries_total: snapshot.queries_total,
        publications_total: snapshot.publications_total,
        log_segments_total: snapshot.log_segments_total,
        checkpoints_total: snapshot.checkpoints_total,
        refusals_total: snapshot.refusals_total,
        cells_open: snapshot.cells_open,
        cells_owned,
        queue_depth_commands: snapshot.queue_depth_commands,
        checkpoint_lag_records: snapshot.checkpoint_lag_records,
        publication_seconds: Some(histogram(&snapshot.publication_seconds)),
        log_segment_put_seconds: Some(histogram(&snapshot.log_segment_put_seconds)),
        publication_mode: String::new(),
        log_lanes: 0,
    }
}

fn histogram(snapshot: &HistogramSnapshot) -> v1::Histogram {
    v1::Histogram {
        bounds: snapshot.buckets.iter().map(|(bound, _)| *bound).collect(),
        cumulative: snapshot.buckets.iter().map(|(_, count)| *count).collect(),
        count: snapshot.count,
    }
}

/// This node's own stats now.
pub fn local(router: &Router) -> v1::NodeStats {
    let node = router.node();
    let mut stats = node_stats(
        node.node_id().as_str(),
        router.now_ms(),
        &node.metrics().snapshot(),
        node.owned_cells().len() as u64,
    );
    let (mode, lanes) = node.publication();
    stats.publication_mode = match mode {
        PublicationMode::Log => "log",
        PublicationMode::Cell => "cell",
    }
    .to_owned();
    stats.log_lanes = u32::from(lanes);
    stats
}

/// Every live node's stats: this node's from memory, the others' over
/// Peer.Stats at once, each within [`PEER_STATS_TIMEOUT`]. This node is
/// always included, live or not (it is the one answering).
pub async fn gather(router: &Arc<Router>) -> Result<v1::NodeStatsResponse, crate::Error> {
    let me = router.node().node_id().clone();
    // The router's live set (at most LIVE_SET_TTL old), not a fresh
    // lease listing: the console polls this beside ListLeases, which
    // lists the leases itself.
    let live = router.live_nodes(false).await?;
    let mut nodes = vec![local(router)];
    let mut unreachable = Vec::new();
    let mut asks = JoinSet::new();
    for record in live.into_iter().filter(|record| record.node_id != me) {
        let peer = record.endpoints.peer_or_grpc().to_owned();
        let node_id = record.node_id.as_str().to_owned();
        let router = Arc::clone(router);
        asks.spawn(async move {
            let answer = router.peer_stats(&peer, PEER_STATS_TIMEOUT).await;
            (node_id, answer)
        });
    }
    while let Some(joined) = asks.join_next().await {
        let Ok((node_id, answer)) = joined else {
            continue;
        };
        match answer {
            Ok(stats) if stats.node_id == node_id => nodes.push(stats),
            Ok(stats) => unreachable.push(v1::UnreachableNode {
                reason: format!(
                    "its peer endpoint answered as node {:?}: the lease names an endpoint another node now holds",
                    stats.node_id
                ),
                node_id,
            }),
            Err(status) => unreachable.push(v1::UnreachableNode {
                node_id,
                reason: status.message().to_owned(),
            }),
        }
    }
    nodes.sort_by(|a, b| a.node_id.cmp(&b.node_id));
    unreachable.sort_by(|a, b| a.node_id.cmp(&b.node_id));
    Ok(v1::NodeStatsResponse { nodes, unreachable })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_maps_field_for_field() {
        let snapshot = Snapshot {
            commands_total: 5,
            queries_total: 6,
            publications_total: 2,
            log_segments_total: 1,
            checkpoints_total: 3,
            refusals_total: 4,
            cells_open: 7,
            queue_depth_commands: 8,
            checkpoint_lag_records: 9,
            publication_seconds: HistogramSnapshot {
                buckets: vec![(0.001, 1), (0.002, 3)],
                count: 4,
            },
            log_segment_put_seconds: HistogramSnapshot::default(),
        };
        let stats = node_stats("n2", 1_000, &snapshot, 11);
        assert_eq!(stats.node_id, "n2");
        assert_eq!(stats.at_ms, 1_000);
        assert_eq!(
            (stats.commands_total, stats.queries_total, stats.cells_owned),
            (5, 6, 11)
        );
        let latency = stats.publication_seconds.unwrap();
        assert_eq!(latency.bounds, vec![0.001, 0.002]);
        assert_eq!(latency.cumulative, vec![1, 3]);
        assert_eq!(latency.count, 4);
    }
}
