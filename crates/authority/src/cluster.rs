//! The cluster record `{prefix}/cluster.json`: what every node of one cluster must agree on (prefix, kinds manifest digest, page size), created once and checked at every start.
//!
//! The first node to start under a prefix creates the record with
//! `If-None-Match: *`; every later start reads it and compares
//! ([`compare`]). A node whose configuration differs refuses to start
//! (DESIGN.md §6: the kinds manifest is identical across the cluster; §10: a
//! configuration that would make data invisible is refused at start-up,
//! never silently empty).
//!
//! Changing the kinds is an operator's decision, taken once: put the new
//! manifest on every node, then start one node with
//! `accept_kinds_change` (`cellfleet node --accept-kinds-change`), which
//! replaces the record by CAS (`If-Match`, `counter + 1` so the bytes never
//! repeat). Nodes still running the old manifest are not stopped by it;
//! restart them with the new one (a restart with the old one is refused).
//! The prefix and page size can never be changed in place.

use std::sync::Arc;

use bytes::Bytes;
use cellfleet_store::{ObjectStore, PutCondition};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::root::InvalidRecord;

/// The cluster record format version this code writes and reads.
pub const CLUSTER_FORMAT_VERSION: u32 = 1;
/// Largest encoded cluster record accepted.
pub const CLUSTER_BYTES_MAX: usize = 4096;
/// Longest prefix recorded.
const PREFIX_BYTES_MAX: usize = 1024;
/// Attempts of create-or-read before giving up on contention.
const ATTEMPTS_MAX: usize = 3;

/// What every node of the cluster must agree on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterRecord {
    /// Format version ([`CLUSTER_FORMAT_VERSION`]).
    pub version: u32,
    /// The key prefix the cluster's data was written under (normalized:
    /// no leading or trailing `/`).
    pub prefix: String,
    /// SHA-256 of the kinds manifest (64 lowercase hex digits,
    /// `Manifest::digest` of the cell crate).
    pub kinds_digest: String,
    /// SQLite page size of every Cell, in bytes.
    pub page_size: u32,
    /// Wall-clock ms when the record was created.
    pub created_at_ms: u64,
    /// +1 on every replacement (bytes never repeat).
    pub counter: u64,
}

impl ClusterRecord {
    /// A first record for this configuration.
    pub fn new(layout: &Layout, kinds_digest: &str, page_size: u32, now_ms: u64) -> Self {
        ClusterRecord {
            version: CLUSTER_FORMAT_VERSION,
            prefix: layout.prefix().to_owned(),
            kinds_digest: kinds_digest.to_owned(),
            page_size,
            created_at_ms: now_ms,
            counter: 1,
        }
    }

    /// Checks the record's rules.
    pub fn validate(&self) -> std::result::Result<(), InvalidRecord> {
        let invalid = |reason: String| Err(InvalidRecord(reason));
        if self.version != CLUSTER_FORMAT_VERSION {
            return invalid(format!(
                "cluster record format version {} is not readable by this build (it reads {CLUSTER_FORMAT_VERSION})",
                self.version
            ));
        }
        if self.prefix.len() > PREFIX_BYTES_MAX
            || self.prefix.starts_with('/')
            || self.prefix.ends_with('/')
            || self.prefix.chars().any(char::is_control)
        {
            return invalid(format!("bad prefix {:?}", self.prefix));
        }
        let hex = |c: char| c.is_ascii_digit() || ('a'..='f').contains(&c);
        if self.kinds_digest.len() != 64 || !self.kinds_digest.chars().all(hex) {
            return invalid(format!(
                "kinds_digest {:?} is not 64 lowercase hex digits",
                self.kinds_digest
            ));
        }
        if !self.page_size.is_power_of_two() || !(512..=65_536).contains(&self.page_size) {
            return invalid(format!(
                "page_size {} is not a power of two in 512..=65536",
                self.page_size
            ));
        }
        if self.counter == 0 {
            return invalid("counter starts at 1".into());
        }
        Ok(())
    }

    /// Validates, then encodes as JSON.
    pub fn encode(&self) -> std::result::Result<Vec<u8>, InvalidRecord> {
        self.validate()?;
        let bytes = serde_json::to_vec(self).map_err(|e| InvalidRecord(e.to_string()))?;
        if bytes.len() > CLUSTER_BYTES_MAX {
            return Err(InvalidRecord(format!(
                "cluster record over {CLUSTER_BYTES_MAX} bytes"
            )));
        }
        Ok(bytes)
    }

    /// Decodes untrusted bytes strictly. Never panics.
    pub fn decode(bytes: &[u8]) -> std::result::Result<Self, InvalidRecord> {
        if bytes.len() > CLUSTER_BYTES_MAX {
            return Err(InvalidRecord(format!(
                "cluster record over {CLUSTER_BYTES_MAX} bytes"
            )));
        }
        let record: Self = serde_json::from_slice(bytes)
            .map_err(|e| InvalidRecord(format!("bad cluster record JSON: {e}")))?;
        record.validate()?;
        Ok(record)
    }
}

/// One way a node's configuration differs from the recorded one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mismatch {
    /// The record names another prefix (the data was copied or the layout
    /// changed): never accepted.
    Prefix {
        /// In the record.
        recorded: String,
        /// This node's.
        ours: String,
    },
    /// Another kinds manifest: accepted only on request.
    KindsDigest {
        /// In the record.
        recorded: String,
        /// This node's.
        ours: String,
    },
    /// Another page size: never accepted.
    PageSize {
        /// In the record.
        recorded: u32,
        /// This node's.
        ours: u32,
    },
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Mismatch::Prefix { recorded, ours } => write!(
                f,
                "the cluster record names prefix {recorded:?} but this node uses {ours:?}"
            ),
            Mismatch::KindsDigest { recorded, ours } => write!(
                f,
                "the cluster's kinds manifest digest is {recorded} but this node's is {ours}"
            ),
            Mismatch::PageSize { recorded, ours } => write!(
                f,
                "the cluster's page size is {recorded} bytes but this node's is {ours}"
            ),
        }
    }
}

/// How `ours` differs from `recorded` (empty: they agree). Pure.
pub fn compare(recorded: &ClusterRecord, ours: &ClusterRecord) -> Vec<Mismatch> {
    let mut mismatches = Vec::new();
    if recorded.prefix != ours.prefix {
        mismatches.push(Mismatch::Prefix {
            recorded: recorded.prefix.clone(),
            ours: ours.prefix.clone(),
        });
    }
    if recorded.kinds_digest != ours.kinds_digest {
        mismatches.push(Mismatch::KindsDigest {
            recorded: recorded.kinds_digest.clone(),
            ours: ours.kinds_digest.clone(),
        });
    }
    if recorded.page_size != ours.page_size {
        mismatches.push(Mismatch::PageSize {
            recorded: recorded.page_size,
            ours: ours.page_size,
        });
    }
    mismatches
}

/// What [`check_cluster`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClusterCheck {
    /// No record existed: this node created it.
    Created(ClusterRecord),
    /// The record agrees with this node.
    Agrees(ClusterRecord),
    /// The kinds differed and the change was accepted: the record now names
    /// this node's digest (the previous one is given).
    KindsChanged {
        /// The record as replaced.
        record: ClusterRecord,
        /// The digest it named before.
        previous_digest: String,
    },
    /// The node must not start.
    Refused {
        /// The record found.
        recorded: ClusterRecord,
        /// Every difference.
        mismatches: Vec<Mismatch>,
    },
}

/// Creates `{prefix}/cluster.json` from `ours` if absent, else compares.
/// With `accept_kinds_change`, a record that differs *only* in its kinds
/// digest is replaced by CAS; any other difference is refused.
pub async fn check_cluster(
    store: &Arc<dyn ObjectStore>,
    layout: &Layout,
    ours: &ClusterRecord,
    accept_kinds_change: bool,
) -> Result<ClusterCheck> {
    let key = layout.cluster_key();
    let encoded = ours.encode().map_err(|e| Error::invalid(e.0))?;
    for _ in 0..ATTEMPTS_MAX {
        let object = match store.get(&key).await {
            Ok(object) => object,
            Err(e) if e.is_not_found() => {
                match store
                    .put(
                        &key,
                        Bytes::from(encoded.clone()),
                        PutCondition::IfNoneMatch,
                    )
                    .await
                {
                    Ok(_) => return Ok(ClusterCheck::Created(ours.clone())),
                    // Another node created it first: read theirs.
                    Err(cellfleet_store::Error::PreconditionFailed { .. })
                    | Err(cellfleet_store::Error::Conflict { .. }) => continue,
                    Err(e) => return Err(Error::store(e)),
                }
            }
            Err(e) => return Err(Error::store(e)),
        };
        let recorded = ClusterRecord::decode(&object.body).map_err(|e| Error::Corrupt {
            key: key.clone(),
            reason: e.0,
        })?;
        let mismatches = compare(&recorded, ours);
        let only_kinds = mismatches
            .iter()
            .all(|m| matches!(m, Mismatch::KindsDigest { .. }));
        if mismatches.is_empty() {
            return Ok(ClusterCheck::Agrees(recorded));
        }
        if !(accept_kinds_change && only_kinds) {
            return Ok(ClusterCheck::Refused {
                recorded,
                mismatches,
            });
        }
        let replaced = ClusterRecord {
            kinds_digest: ours.kinds_digest.clone(),
            counter: recorded.counter.saturating_add(1),
            ..recorded.clone()
        };
        let bytes = replaced.encode().map_err(|e| Error::invalid(e.0))?;
        match store
            .put(&key, Bytes::from(bytes), PutCondition::IfMatch(object.etag))
            .await
        {
            Ok(_) => {
                return Ok(ClusterCheck::KindsChanged {
                    record: replaced,
                    previous_digest: recorded.kinds_digest,
                })
            }
            Err(cellfleet_store::Error::PreconditionFailed { .. })
            | Err(cellfleet_store::Error::Conflict { .. }) => continue,
            Err(e) => return Err(Error::store(e)),
        }
    }
    Err(Error::Conflict {
        reason: format!("{key} kept changing during {ATTEMPTS_MAX} attempts"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const DIGEST_B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    fn record(prefix: &str, digest: &str, page_size: u32) -> ClusterRecord {
        ClusterRecord::new(&Layout::new(prefix).unwrap(), digest, page_size, 7)
    }

    #[test]
    fn records_round_trip_and_reject_junk() {
        let ours = record("/prod/eu/", DIGEST_A, 4096);
        assert_eq!(ours.prefix, "prod/eu");
        assert_eq!(
            ClusterRecord::decode(&ours.encode().unwrap()).unwrap(),
            ours
        );
        assert!(ClusterRecord::decode(b"{}").is_err());
        assert!(ClusterRecord::decode(&vec![b' '; CLUSTER_BYTES_MAX + 1]).is_err());
        let value = serde_json::to_value(&ours).unwrap();
        for (field, bad) in [
            ("version", serde_json::json!(2)),
            ("kinds_digest", serde_json::json!("ABC")),
            ("page_size", serde_json::json!(1000)),
            ("counter", serde_json::json!(0)),
            ("prefix", serde_json::json!("a/")),
        ] {
            let mut bad_value = value.clone();
            bad_value[field] = bad;
            assert!(
                ClusterRecord::decode(&serde_json::to_vec(&bad_value).unwrap()).is_err(),
                "{field}"
            );
        }
        let mut extra = value;
        extra["lanes"] = serde_json::json!(4);
        assert!(ClusterRecord::decode(&serde_json::to_vec(&extra).unwrap()).is_err());
    }

    #[test]
    fn compare_names_every_difference() {
        let recorded = record("p", DIGEST_A, 4096);
        assert!(compare(&recorded, &record("p", DIGEST_A, 4096)).is_empty());
        assert_eq!(
            compare(&recorded, &record("q", DIGEST_B, 8192)),
            vec![
                Mismatch::Prefix {
                    recorded: "p".into(),
                    ours: "q".into()
                },
                Mismatch::KindsDigest {
                    recorded: DIGEST_A.into(),
                    ours: DIGEST_B.into()
                },
                Mismatch::PageSize {
                    recorded: 4096,
                    ours: 8192
                },
            ]
        );
    }
}
