//! Owner hints: a bounded LRU cache of "Cell X is owned by node N", and rendezvous hashing to place unowned Cells over the live nodes.
//!
//! A hint is only a belief: the owner's runtime proves ownership (its
//! lease and the authority root) before it serves. The cache prefers newer
//! epochs, so a stale NOT_OWNER answer cannot undo what a takeover taught.

use std::num::NonZeroUsize;
use std::sync::Mutex;

use cellfleet_authority::{CellId, NodeId};
use lru::LruCache;
use sha2::{Digest, Sha256};

/// Default number of Cells whose owner a node remembers.
pub const OWNER_HINTS_MAX: usize = 100_000;

/// Where a Cell is believed to live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedOwner {
    /// The owning node.
    pub node_id: NodeId,
    /// Its gRPC endpoint (peer listener), when known.
    pub endpoint: Option<String>,
    /// The epoch the belief was learned at (0 when unknown).
    pub epoch: u64,
}

/// A bounded, thread-safe LRU of owner hints.
#[derive(Debug)]
pub struct OwnerHintCache {
    entries: Mutex<LruCache<CellId, CachedOwner>>,
}

impl OwnerHintCache {
    /// A cache holding at most `capacity` hints.
    pub fn new(capacity: NonZeroUsize) -> Self {
        OwnerHintCache {
            entries: Mutex::new(LruCache::new(capacity)),
        }
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, LruCache<CellId, CachedOwner>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The hint for `cell` (marks it recently used).
    pub fn get(&self, cell: &CellId) -> Option<CachedOwner> {
        self.entries().get(cell).cloned()
    }

    /// Records a belief; an older epoch than the cached one is ignored
    /// (epoch 0, "unknown", replaces only another unknown). Returns
    /// whether the cache changed.
    pub fn observe(&self, cell: CellId, owner: CachedOwner) -> bool {
        let mut entries = self.entries();
        if let Some(current) = entries.get(&cell) {
            if owner.epoch < current.epoch || (owner.epoch == 0 && current.epoch != 0) {
                return false;
            }
            if *current == owner {
                return false;
            }
        }
        entries.put(cell, owner);
        true
    }

    /// Forgets the hint for `cell` if it still names `node` (after that node
    /// answered NOT_OWNER or was unreachable).
    pub fn invalidate(&self, cell: &CellId, node: &NodeId) -> bool {
        let mut entries = self.entries();
        if entries
            .peek(cell)
            .is_some_and(|owner| owner.node_id == *node)
        {
            entries.pop(cell);
            return true;
        }
        false
    }

    /// Forgets every hint naming `node` (its lease expired or it drained).
    pub fn forget_node(&self, node: &NodeId) -> usize {
        let mut entries = self.entries();
        let stale: Vec<CellId> = entries
            .iter()
            .filter(|(_, owner)| owner.node_id == *node)
            .map(|(cell, _)| cell.clone())
            .collect();
        for cell in &stale {
            entries.pop(cell);
        }
        stale.len()
    }

    /// Number of hints held.
    pub fn len(&self) -> usize {
        self.entries().len()
    }

    /// Whether no hints are held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bound.
    pub fn capacity(&self) -> usize {
        self.entries().cap().get()
    }
}

impl Default for OwnerHintCache {
    fn default() -> Self {
        Self::new(NonZeroUsize::new(OWNER_HINTS_MAX).expect("OWNER_HINTS_MAX is non-zero"))
    }
}

/// The rendezvous (highest random weight) score of `node` for `cell`.
pub fn rendezvous_score(cell: &CellId, node: &NodeId) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(b"cellfleet/placement/v1\0");
    let cell = cell.as_str().as_bytes();
    hasher.update((cell.len() as u64).to_be_bytes());
    hasher.update(cell);
    let node = node.as_str().as_bytes();
    hasher.update((node.len() as u64).to_be_bytes());
    hasher.update(node);
    hasher.finalize().into()
}

/// Where an unowned `cell` should be placed: the live node with the highest
/// rendezvous score (ties, impossible in practice, go to the smaller id).
/// Every node computes the same answer from the same live set, and removing
/// a node moves only the Cells that node would have had.
pub fn rendezvous_owner<'a>(cell: &CellId, live_nodes: &'a [NodeId]) -> Option<&'a NodeId> {
    live_nodes.iter().max_by(|a, b| {
        rendezvous_score(cell, a)
            .cmp(&rendezvous_score(cell, b))
            .then_with(|| b.cmp(a))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str) -> NodeId {
        NodeId::new(id).expect("node id")
    }

    fn cell(i: usize) -> CellId {
        CellId::for_kind_key("kv", format!("key-{i}").as_bytes())
    }

    fn owner(id: &str, epoch: u64) -> CachedOwner {
        CachedOwner {
            node_id: node(id),
            endpoint: Some(format!("{id}:7001")),
            epoch,
        }
    }

    #[test]
    fn cache_is_bounded_and_least_recently_used_goes_first() {
        let cache = OwnerHintCache::new(NonZeroUsize::new(2).expect("2"));
        cache.observe(cell(1), owner("a", 1));
        cache.observe(cell(2), owner("b", 1));
        assert!(cache.get(&cell(1)).is_some()); // 1 is now more recent than 2
        cache.observe(cell(3), owner("c", 1));
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.capacity(), 2);
        assert!(cache.get(&cell(2)).is_none());
        assert_eq!(cache.get(&cell(1)).map(|o| o.node_id), Some(node("a")));
    }

    #[test]
    fn older_epochs_do_not_overwrite_and_invalidation_is_targeted() {
        let cache = OwnerHintCache::default();
        assert!(cache.observe(cell(1), owner("a", 5)));
        assert!(!cache.observe(cell(1), owner("b", 4)));
        assert!(!cache.observe(cell(1), owner("b", 0)));
        assert!(cache.observe(cell(1), owner("b", 6)));
        assert!(!cache.invalidate(&cell(1), &node("a")));
        assert!(cache.invalidate(&cell(1), &node("b")));
        assert!(cache.is_empty());
        cache.observe(cell(1), owner("a", 1));
        cache.observe(cell(2), owner("a", 1));
        cache.observe(cell(3), owner("b", 1));
        assert_eq!(cache.forget_node(&node("a")), 2);
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn rendezvous_is_stable_balanced_and_moves_only_the_lost_nodes_cells() {
        let nodes: Vec<NodeId> = ["n1", "n2", "n3", "n4"].into_iter().map(node).collect();
        assert_eq!(rendezvous_owner(&cell(0), &[]), None);
        let mut counts = [0usize; 4];
        let before: Vec<NodeId> = (0..2000)
            .map(|i| rendezvous_owner(&cell(i), &nodes).expect("owner").clone())
            .collect();
        for owner in &before {
            counts[nodes.iter().position(|n| n == owner).expect("member")] += 1;
        }
        for count in counts {
            assert!((350..650).contains(&count), "unbalanced: {counts:?}");
        }
        // Order of the live set does not matter.
        let mut reversed = nodes.clone();
        reversed.reverse();
        assert_eq!(rendezvous_owner(&cell(7), &reversed), Some(&before[7]));
        // Removing n2 moves exactly n2's Cells.
        let without: Vec<NodeId> = nodes
            .iter()
            .filter(|n| n.as_str() != "n2")
            .cloned()
            .collect();
        for (i, owner) in before.iter().enumerate() {
            let after = rendezvous_owner(&cell(i), &without).expect("owner");
            if owner.as_str() != "n2" {
                assert_eq!(after, owner, "cell {i} moved needlessly");
            }
        }
    }
}
