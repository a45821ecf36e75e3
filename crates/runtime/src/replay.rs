//! A Cell's records past its chain, read from the node log a root points at (DESIGN.md §9, takeover and sealing).
//!
//! * The pointer names **another session** (the previous owner, whose
//!   lease is dead — activation only gets here after winning the takeover
//!   CAS): its lane is sealed first ([`seal_lane`], idempotent under racing
//!   successors), then the slots before the seal that hold this Cell's
//!   records are read with ranged GETs. A zombie of that session can write
//!   nothing that counts after the seal, so what is read is final.
//! * The pointer names **this session** (the Cell's actor stopped with
//!   records not yet checkpointed): every slot reserved so far is waited
//!   for until it is decided, then the lane's written prefix is read. A
//!   slot still in doubt could land later, so activation fails (retryable)
//!   rather than build on a state that may be missing it.
//!
//! [`check_tail`] (pure) keeps the records past the root's TXID and
//! refuses a tail that is not contiguous with the chain.

use std::time::Duration;

use bytes::Bytes;
use cellfleet_authority::{Holder, Layout, RootRecord};
use cellfleet_nodelog::store::{read_lane, read_records, seal_lane};
use cellfleet_nodelog::Entry;
use cellfleet_store::ObjectStore;

use crate::error::{Error, Result};
use crate::log::NodeLog;

/// Where every lane's run starts (nothing below it is ever deleted yet).
pub(crate) const LANE_FLOOR: u64 = 0;

/// The records of `root`'s Cell past its chain, oldest first, checked.
pub(crate) async fn records_past_chain(
    store: &dyn ObjectStore,
    layout: &Layout,
    me: &Holder,
    log: Option<&NodeLog>,
    root: &RootRecord,
    settle_bound: Duration,
    now_ms: u64,
) -> Result<Tail> {
    let Some(pointer) = &root.log else {
        return Ok(Tail::default());
    };
    let lane = &pointer.lane;
    let own = lane.node == me.node && lane.session == me.session;
    let (seqs, sealed) = if own {
        let writer = log
            .and_then(|log| log.lane(lane))
            .ok_or_else(|| Error::Closed(format!("lane {lane:?} is not one of this session's")))?
            .writer()
            .clone();
        let verdict = writer
            .settled(settle_bound)
            .await
            .ok_or_else(|| Error::Unknown {
                reason: format!(
                    "this node's log lane {} still has a segment in doubt; retry once the store answers",
                    lane.lane
                ),
            })?;
        if verdict.sealed_at.is_some() {
            return Err(Error::LeaseLost {
                reason: format!(
                    "this session's lane {} was sealed by a successor",
                    lane.lane
                ),
            });
        }
        (
            (pointer.from_seq..verdict.acked_below).collect::<Vec<_>>(),
            false,
        )
    } else {
        seal_lane(store, layout, lane, LANE_FLOOR, me, now_ms)
            .await
            .map_err(log_error)?;
        let read = read_lane(store, layout, lane, LANE_FLOOR)
            .await
            .map_err(log_error)?;
        let seqs = read
            .counted
            .into_iter()
            .filter(|seq| *seq >= pointer.from_seq)
            .collect();
        (seqs, true)
    };
    let records = read_records(store, layout, lane, &seqs, &root.cell_id)
        .await
        .map_err(log_error)?;
    let records = check_tail(root, records.into_iter().map(|(_, e, b)| (e, b)).collect())?;
    Ok(Tail { records, sealed })
}

/// What replay found.
#[derive(Debug, Default)]
pub(crate) struct Tail {
    /// The records past the chain, oldest first.
    pub records: Vec<(Entry, Bytes)>,
    /// Whether a dead session's lane was sealed (or found sealed).
    pub sealed: bool,
}

/// Keeps the records past `root`'s TXID (those at or below it are in the
/// chain already) and checks they continue it without a gap or overlap.
pub(crate) fn check_tail(
    root: &RootRecord,
    records: Vec<(Entry, Bytes)>,
) -> Result<Vec<(Entry, Bytes)>> {
    let mut next = root.txid + 1;
    let mut kept = Vec::new();
    for (entry, bytes) in records {
        if entry.cell_id != root.cell_id || entry.max_txid <= root.txid {
            continue;
        }
        if entry.min_txid != next || entry.max_txid < entry.min_txid {
            return Err(Error::Store(cellfleet_store::Error::Corrupt {
                key: format!("log of cell {}", root.cell_id),
                reason: format!(
                    "a record covers txids {}..={} where {next} was expected next",
                    entry.min_txid, entry.max_txid
                ),
            }));
        }
        next = entry.max_txid + 1;
        kept.push((entry, bytes));
    }
    Ok(kept)
}

fn log_error(error: cellfleet_nodelog::store::Error) -> Error {
    match error {
        cellfleet_nodelog::store::Error::Store(error) => Error::Store(error),
        cellfleet_nodelog::store::Error::Corrupt { key, source } => {
            Error::Store(cellfleet_store::Error::Corrupt {
                key,
                reason: source.to_string(),
            })
        }
        other => Error::Closed(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellfleet_authority::{transition, CellId, Epoch, NewCell, NodeId, SessionId};
    use proptest::prelude::*;

    fn root_at(txid: u64) -> RootRecord {
        let cell = CellId::for_kind_key("kv", b"k");
        let me = Holder {
            node: NodeId::new("n1").unwrap(),
            session: SessionId::from_u128(1),
        };
        let mut root = transition::create(
            &NewCell {
                cell_id: cell.clone(),
                kind: "kv".into(),
                key: None,
                page_size: 4096,
                schema_version: 0,
            },
            &me,
            1,
        );
        root.txid = txid;
        root
    }

    fn entry(cell: &CellId, min: u64, max: u64) -> (Entry, Bytes) {
        (
            Entry {
                cell_id: cell.clone(),
                epoch: Epoch::FIRST,
                min_txid: min,
                max_txid: max,
                body_range: 0..0,
                bytes_crc: 0,
                file_checksum: 0,
                post_apply_checksum: 0,
                command_ids: Vec::new(),
            },
            Bytes::new(),
        )
    }

    proptest! {
        /// Whatever the log holds, the kept tail starts right after the
        /// root and is contiguous; records already in the chain and other
        /// Cells' records are skipped; a gap or an overlap is refused.
        #[test]
        fn the_tail_continues_the_chain_or_is_refused(
            root_txid in 0u64..6,
            spans in proptest::collection::vec((1u64..10, 0u64..3, any::<bool>()), 0..8),
        ) {
            let root = root_at(root_txid);
            let other = CellId::for_kind_key("kv", b"other");
            let records: Vec<_> = spans
                .iter()
                .map(|(min, len, mine)| entry(if *mine { &root.cell_id } else { &other }, *min, min + len))
                .collect();
            let mut next = root_txid + 1;
            let mut expected_ok = true;
            for (e, _) in &records {
                if e.cell_id != root.cell_id || e.max_txid <= root_txid {
                    continue;
                }
                if e.min_txid != next {
                    expected_ok = false;
                    break;
                }
                next = e.max_txid + 1;
            }
            match check_tail(&root, records) {
                Ok(kept) => {
                    prop_assert!(expected_ok);
                    let mut at = root_txid + 1;
                    for (e, _) in kept {
                        prop_assert_eq!(&e.cell_id, &root.cell_id);
                        prop_assert_eq!(e.min_txid, at);
                        at = e.max_txid + 1;
                    }
                }
                Err(_) => prop_assert!(!expected_ok),
            }
        }
    }
}
