//! Where every object lives in the bucket (DESIGN.md §4): the only place that builds or parses keys.
//!
//! ```text
//! {prefix}/cluster.json
//! {prefix}/nodes/{node_id}.json
//! {prefix}/cells/{cell_id}/root.json
//! {prefix}/cells/{cell_id}/ltx/{epoch:016x}/{min:016x}-{max:016x}-{digest}.ltx
//! {prefix}/logs/{node_id}/{session}/{lane:04x}/{seq:016x}.seg
//! ```
//!
//! Numbers are fixed-width lowercase hex so listings sort numerically.

use cellfleet_ltx::Txid;

use crate::ids::{CellId, Epoch, NodeId, SessionId};

/// One lane of a node session's log (DESIGN.md §9).
#[derive(
    Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(deny_unknown_fields)]
pub struct LaneId {
    /// The node.
    pub node: NodeId,
    /// The node start that owns the lane (never reused).
    pub session: SessionId,
    /// The lane's number within the session.
    pub lane: u16,
}

/// A parsed segment (or seal) key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentKey {
    /// The lane.
    pub lane: LaneId,
    /// The slot's sequence number in the lane.
    pub seq: u64,
}

/// Key builder for one cluster's prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    prefix: String,
}

/// A parsed LTX key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LtxKey {
    /// The Cell.
    pub cell_id: CellId,
    /// The epoch that uploaded it.
    pub epoch: Epoch,
    /// First TXID in the file.
    pub min_txid: Txid,
    /// Last TXID in the file.
    pub max_txid: Txid,
    /// Hex digest of the file's bytes.
    pub digest: String,
}

impl Layout {
    /// A layout under `prefix` (may be empty; surrounding `/` are trimmed).
    /// The prefix must itself be a valid key path.
    pub fn new(prefix: &str) -> Result<Self, cellfleet_store::Error> {
        let prefix = prefix.trim_matches('/');
        if !prefix.is_empty() {
            cellfleet_store::validate_key(prefix)?;
        }
        Ok(Self {
            prefix: prefix.to_owned(),
        })
    }

    /// The prefix, without trailing `/`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn join(&self, rest: &str) -> String {
        if self.prefix.is_empty() {
            rest.to_owned()
        } else {
            format!("{}/{rest}", self.prefix)
        }
    }

    /// `{prefix}/cluster.json`.
    pub fn cluster_key(&self) -> String {
        self.join("cluster.json")
    }

    /// `{prefix}/nodes/`: list this to find node leases.
    pub fn nodes_prefix(&self) -> String {
        self.join("nodes/")
    }

    /// `{prefix}/nodes/{node_id}.json`.
    pub fn node_lease_key(&self, node: &NodeId) -> String {
        self.join(&format!("nodes/{node}.json"))
    }

    /// The node id of a lease key, if it is one.
    pub fn parse_node_lease_key(&self, key: &str) -> Option<NodeId> {
        let name = key
            .strip_prefix(&self.nodes_prefix())?
            .strip_suffix(".json")?;
        NodeId::new(name).ok()
    }

    /// `{prefix}/cells/`.
    pub fn cells_prefix(&self) -> String {
        self.join("cells/")
    }

    /// `{prefix}/cells/{cell_id}/root.json`.
    pub fn root_key(&self, cell: &CellId) -> String {
        self.join(&format!("cells/{cell}/root.json"))
    }

    /// Parses a key made by [`Layout::root_key`].
    pub fn parse_root_key(&self, key: &str) -> Option<CellId> {
        key.strip_prefix(&self.cells_prefix())?
            .strip_suffix("/root.json")?
            .parse()
            .ok()
    }

    /// `cells/{cell_id}/ltx/`: where a Cell's LTX keys lie below any prefix
    /// (what a root checks its chain's keys against).
    pub fn ltx_infix(cell: &CellId) -> String {
        format!("cells/{cell}/ltx/")
    }

    /// `{prefix}/cells/{cell_id}/ltx/`.
    pub fn ltx_prefix(&self, cell: &CellId) -> String {
        self.join(&Self::ltx_infix(cell))
    }

    /// `{prefix}/cells/{cell_id}/ltx/{epoch:016x}/{min:016x}-{max:016x}-{digest}.ltx`.
    /// `digest` must be lowercase hex (a hash of the file's bytes).
    pub fn ltx_key(
        &self,
        cell: &CellId,
        epoch: Epoch,
        min_txid: Txid,
        max_txid: Txid,
        digest: &str,
    ) -> String {
        format!(
            "{}{:016x}/{:016x}-{:016x}-{digest}.ltx",
            self.ltx_prefix(cell),
            epoch.get(),
            min_txid.0,
            max_txid.0
        )
    }

    /// `{prefix}/logs/{node}/`: every session's log of one node.
    pub fn node_logs_prefix(&self, node: &NodeId) -> String {
        self.join(&format!("logs/{node}/"))
    }

    /// `{prefix}/logs/{node}/{session}/`: every lane of one session.
    pub fn session_logs_prefix(&self, node: &NodeId, session: SessionId) -> String {
        self.join(&format!("logs/{node}/{session}/"))
    }

    /// The lane any key under a lane's prefix belongs to (a slot, the
    /// floor marker).
    pub fn parse_lane_of_key(&self, key: &str) -> Option<LaneId> {
        let rest = key.strip_prefix(&self.join("logs/"))?;
        let mut parts = rest.split('/');
        let (node, session, lane, file) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || file.is_empty() {
            return None;
        }
        let lane = (lane.len() == 4
            && lane.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
        .then(|| u16::from_str_radix(lane, 16).ok())
        .flatten()?;
        Some(LaneId {
            node: node.parse().ok()?,
            session: session.parse().ok()?,
            lane,
        })
    }

    /// `{prefix}/logs/{node}/{session}/{lane:04x}/`: every slot of a lane,
    /// listed in sequence order.
    pub fn lane_prefix(&self, lane: &LaneId) -> String {
        self.join(&format!(
            "logs/{}/{}/{:04x}/",
            lane.node, lane.session, lane.lane
        ))
    }

    /// `{prefix}/logs/{node}/{session}/{lane:04x}/{seq:016x}.seg`: one
    /// segment or seal (create-only, never replaced).
    pub fn segment_key(&self, lane: &LaneId, seq: u64) -> String {
        format!("{}{seq:016x}.seg", self.lane_prefix(lane))
    }

    /// `{prefix}/logs/{node}/{session}/{lane:04x}/floor`: the lane's floor
    /// marker (slots below it were collected); never parsed as a slot.
    pub fn lane_floor_key(&self, lane: &LaneId) -> String {
        format!("{}floor", self.lane_prefix(lane))
    }

    /// `{prefix}/logs/{node}/{session}/{lane:04x}/{first:016x}.idx`: the
    /// index of a lane's chunk of slots starting at `first` (create-only,
    /// written by the lane's session once every slot of the chunk is
    /// acknowledged; derived data, never needed for correctness).
    pub fn chunk_index_key(&self, lane: &LaneId, first: u64) -> String {
        format!("{}{first:016x}.idx", self.lane_prefix(lane))
    }

    /// Parses a key made by [`Layout::segment_key`].
    pub fn parse_segment_key(&self, key: &str) -> Option<SegmentKey> {
        self.parse_lane_file(key, ".seg")
    }

    /// Parses a key made by [`Layout::chunk_index_key`]: the lane and the
    /// chunk's first slot (in `seq`).
    pub fn parse_chunk_index_key(&self, key: &str) -> Option<SegmentKey> {
        self.parse_lane_file(key, ".idx")
    }

    /// `{prefix}/logs/{node}/{session}/{lane:04x}/{seq:016x}{suffix}`.
    fn parse_lane_file(&self, key: &str, suffix: &str) -> Option<SegmentKey> {
        let rest = key.strip_prefix(&self.join("logs/"))?;
        let mut parts = rest.split('/');
        let (node, session, lane, file) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let seq = file.strip_suffix(suffix)?;
        let hex = |s: &str, width: usize| {
            (s.len() == width && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
                .then(|| u64::from_str_radix(s, 16).ok())
                .flatten()
        };
        Some(SegmentKey {
            lane: LaneId {
                node: node.parse().ok()?,
                session: session.parse().ok()?,
                lane: u16::try_from(hex(lane, 4)?).ok()?,
            },
            seq: hex(seq, 16)?,
        })
    }

    /// Parses a key made by [`Layout::ltx_key`].
    pub fn parse_ltx_key(&self, key: &str) -> Option<LtxKey> {
        let rest = key.strip_prefix(&self.cells_prefix())?;
        let (cell, rest) = rest.split_once("/ltx/")?;
        let (epoch, file) = rest.split_once('/')?;
        let stem = file.strip_suffix(".ltx")?;
        let mut parts = stem.splitn(3, '-');
        let (min, max, digest) = (parts.next()?, parts.next()?, parts.next()?);
        let hex16 = |s: &str| {
            (s.len() == 16)
                .then(|| u64::from_str_radix(s, 16).ok())
                .flatten()
        };
        let digest_ok = !digest.is_empty()
            && digest
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if !digest_ok {
            return None;
        }
        Some(LtxKey {
            cell_id: cell.parse().ok()?,
            epoch: Epoch::new(hex16(epoch)?)?,
            min_txid: Txid(hex16(min)?),
            max_txid: Txid(hex16(max)?),
            digest: digest.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_design_layout() {
        let layout = Layout::new("/prod/eu/").unwrap();
        let cell = CellId::for_kind_key("kv", b"k");
        let node = NodeId::new("n1").unwrap();
        assert_eq!(layout.cluster_key(), "prod/eu/cluster.json");
        assert_eq!(layout.node_lease_key(&node), "prod/eu/nodes/n1.json");
        assert_eq!(
            layout.parse_node_lease_key("prod/eu/nodes/n1.json"),
            Some(node.clone())
        );
        assert_eq!(
            layout.root_key(&cell),
            format!("prod/eu/cells/{cell}/root.json")
        );
        assert_eq!(
            layout.parse_root_key(&layout.root_key(&cell)),
            Some(cell.clone())
        );
        assert_eq!(layout.parse_root_key("prod/eu/cells/x/root.json"), None);
        assert_eq!(layout.parse_root_key(&layout.ltx_prefix(&cell)), None);
        let epoch = Epoch::new(2).unwrap();
        let key = layout.ltx_key(&cell, epoch, Txid(1), Txid(0x1f), "ab12");
        assert_eq!(
            key,
            format!("prod/eu/cells/{cell}/ltx/0000000000000002/0000000000000001-000000000000001f-ab12.ltx")
        );
        let parsed = layout.parse_ltx_key(&key).unwrap();
        assert_eq!(
            (
                parsed.cell_id,
                parsed.epoch,
                parsed.min_txid,
                parsed.max_txid
            ),
            (cell, epoch, Txid(1), Txid(0x1f))
        );
        assert!(layout
            .parse_ltx_key("prod/eu/cells/x/ltx/1/2-3-z.ltx")
            .is_none());
        let lane = LaneId {
            node: node.clone(),
            session: SessionId::from_u128(0xabc),
            lane: 3,
        };
        let segment = layout.segment_key(&lane, 0x2a);
        assert_eq!(
            segment,
            "prod/eu/logs/n1/00000000000000000000000000000abc/0003/000000000000002a.seg"
        );
        assert!(segment.starts_with(&layout.lane_prefix(&lane)));
        let floor = layout.lane_floor_key(&lane);
        assert_eq!(
            floor,
            "prod/eu/logs/n1/00000000000000000000000000000abc/0003/floor"
        );
        assert!(layout.parse_segment_key(&floor).is_none());
        assert_eq!(layout.parse_lane_of_key(&floor).as_ref(), Some(&lane));
        assert_eq!(layout.parse_lane_of_key(&segment).as_ref(), Some(&lane));
        assert!(floor.starts_with(&layout.session_logs_prefix(&lane.node, lane.session)));
        assert!(layout
            .session_logs_prefix(&lane.node, lane.session)
            .starts_with(&layout.node_logs_prefix(&lane.node)));
        assert!(layout
            .parse_lane_of_key("prod/eu/logs/n1/00000000000000000000000000000abc/0003/")
            .is_none());
        let chunk = layout.chunk_index_key(&lane, 0x100);
        assert_eq!(
            chunk,
            "prod/eu/logs/n1/00000000000000000000000000000abc/0003/0000000000000100.idx"
        );
        assert!(layout.parse_segment_key(&chunk).is_none());
        assert!(layout.parse_chunk_index_key(&segment).is_none());
        assert!(layout.parse_chunk_index_key(&floor).is_none());
        assert_eq!(layout.parse_lane_of_key(&chunk).as_ref(), Some(&lane));
        assert_eq!(
            layout.parse_chunk_index_key(&chunk),
            Some(SegmentKey {
                lane: lane.clone(),
                seq: 0x100
            })
        );
        assert_eq!(
            layout.parse_segment_key(&segment),
            Some(SegmentKey { lane, seq: 0x2a })
        );
        for bad in [
            "prod/eu/logs/n1/abc/0003/000000000000002a.seg",
            "prod/eu/logs/n1/00000000000000000000000000000abc/3/000000000000002a.seg",
            "prod/eu/logs/n1/00000000000000000000000000000abc/0003/2a.seg",
            "prod/eu/logs/n1/00000000000000000000000000000abc/0003/000000000000002a.ltx",
            "prod/eu/logs/n1/00000000000000000000000000000abc/0003/x/000000000000002a.seg",
        ] {
            assert!(layout.parse_segment_key(bad).is_none(), "{bad}");
        }
        assert_eq!(Layout::new("").unwrap().cluster_key(), "cluster.json");
        assert!(Layout::new("a//b").is_err());
    }
}
