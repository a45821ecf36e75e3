//! The node lease record and the pure rules around it: acquiring, renewing, judging liveness, the local deadline.
//!
//! A node writes `{prefix}/nodes/{node_id}.json` with a fresh session id and
//! `expires_at_ms`, renews it by CAS well before expiry, and retires it on
//! drain. `counter` grows on every write so the bytes never repeat.
//!
//! Two clocks, on purpose:
//! * Others judge a lease by **wall clock**: live while
//!   `now_wall_ms < expires_at_ms + margin_ms` (nodes need synchronized
//!   clocks; skew must stay below the margin).
//! * The holder judges itself by a **local monotonic deadline**:
//!   the instant the renewal was *sent* + lease length − drift margin
//!   ([`local_deadline`]). Sent, not acknowledged: the store may have applied
//!   the write at any point after sending, so counting from the reply would
//!   overstate the lease.
//!
//! A restarted node replaces its own earlier session's record and carries
//! the earlier session's expiry forward as `predecessor_live_until_ms`: other
//! nodes keep treating a Cell owned by that earlier session as live until
//! then plus the margin (the old process may be a zombie still serving reads).

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::ids::{NodeId, SessionId};
use crate::root::InvalidRecord;

/// The lease format version this code writes and reads.
///
/// Version 2 added [`Endpoints::peer`]; version 1 carried the peer address
/// inside the `grpc` URL (`?peer=`) and is no longer read (nothing was
/// deployed with it).
pub const LEASE_FORMAT_VERSION: u32 = 2;
/// Largest encoded lease accepted.
pub const LEASE_BYTES_MAX: usize = 4096;
/// Longest endpoint string.
pub const ENDPOINT_BYTES_MAX: usize = 256;

/// Lease timing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    /// How long a renewal keeps the lease, in ms.
    pub lease_ms: u64,
    /// Renew this often (well below `lease_ms`), in ms.
    pub renew_every_ms: u64,
    /// Allowance for clock skew and drift, in ms (DESIGN.md §5: 500 ms).
    pub drift_margin_ms: u64,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        Self {
            lease_ms: 10_000,
            renew_every_ms: 3_000,
            drift_margin_ms: 500,
        }
    }
}

impl LeaseConfig {
    /// Checks the timing makes sense (margin < renew period < lease).
    pub fn validate(&self) -> Result<(), InvalidRecord> {
        if self.drift_margin_ms >= self.lease_ms || self.renew_every_ms >= self.lease_ms {
            return Err(InvalidRecord(format!(
                "lease timing: need drift_margin_ms ({}) and renew_every_ms ({}) below lease_ms ({})",
                self.drift_margin_ms, self.renew_every_ms, self.lease_ms
            )));
        }
        Ok(())
    }
}

/// Whether a lease is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseState {
    /// Held until `expires_at_ms`.
    Live,
    /// Given up on drain: the node serves nothing and owns nothing.
    Retired,
}

/// How to reach a node. Every field is required in the record; an empty
/// string means "not served" (an embedder without listeners).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Endpoints {
    /// Client-facing gRPC address (`https://host:port`): owner hints name it.
    pub grpc: String,
    /// Node-to-node gRPC address (`https://host:port`) of the peer service,
    /// which other nodes forward to. Empty: peers are served at `grpc`.
    pub peer: String,
    /// HTTP address (Durable Streams, metrics).
    pub http: String,
}

impl Endpoints {
    /// Where other nodes reach the peer service: `peer`, or `grpc` when
    /// the node serves peers on its client listener.
    pub fn peer_or_grpc(&self) -> &str {
        if self.peer.is_empty() {
            &self.grpc
        } else {
            &self.peer
        }
    }
}

/// Only the version, read before the strict decode so an old record gets a
/// precise error instead of "missing field".
#[derive(Deserialize)]
struct VersionProbe {
    version: u32,
}

/// A node's lease record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseRecord {
    /// Format version ([`LEASE_FORMAT_VERSION`]).
    pub version: u32,
    /// The node.
    pub node_id: NodeId,
    /// The node's current session.
    pub session_id: SessionId,
    /// Where to reach it.
    pub endpoints: Endpoints,
    /// +1 on every write of this record (bytes never repeat).
    pub counter: u64,
    /// Wall-clock ms of the last renewal.
    pub renewed_at_ms: u64,
    /// Wall-clock ms at which the lease ends (others add their margin).
    pub expires_at_ms: u64,
    /// Until when an earlier session of this node may still be serving
    /// (wall-clock ms; 0 if none).
    pub predecessor_live_until_ms: u64,
    /// Live or retired.
    pub state: LeaseState,
    /// An ingress-only node: it serves and forwards requests but is never
    /// a placement target, so it activates no Cells. Absent (false) from
    /// the records of ordinary nodes, whose bytes are unchanged.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ingress_only: bool,
}

impl LeaseRecord {
    /// Checks the record's rules.
    pub fn validate(&self) -> Result<(), InvalidRecord> {
        if self.version != LEASE_FORMAT_VERSION {
            return Err(InvalidRecord(format!(
                "unknown lease format version {}",
                self.version
            )));
        }
        if self.expires_at_ms < self.renewed_at_ms {
            return Err(InvalidRecord("lease expires before it was renewed".into()));
        }
        let endpoint_ok =
            |e: &str| e.len() <= ENDPOINT_BYTES_MAX && !e.chars().any(char::is_control);
        let Endpoints { grpc, peer, http } = &self.endpoints;
        if ![grpc, peer, http].into_iter().all(|e| endpoint_ok(e)) {
            return Err(InvalidRecord(
                "endpoint too long or has control characters".into(),
            ));
        }
        Ok(())
    }

    /// Validates, then encodes as JSON.
    pub fn encode(&self) -> Result<Vec<u8>, InvalidRecord> {
        self.validate()?;
        let bytes = serde_json::to_vec(self).map_err(|e| InvalidRecord(e.to_string()))?;
        if bytes.len() > LEASE_BYTES_MAX {
            return Err(InvalidRecord(format!("lease over {LEASE_BYTES_MAX} bytes")));
        }
        Ok(bytes)
    }

    /// Decodes untrusted bytes strictly. Never panics.
    pub fn decode(bytes: &[u8]) -> Result<Self, InvalidRecord> {
        if bytes.len() > LEASE_BYTES_MAX {
            return Err(InvalidRecord(format!("lease over {LEASE_BYTES_MAX} bytes")));
        }
        if let Ok(VersionProbe { version }) = serde_json::from_slice(bytes) {
            if version != LEASE_FORMAT_VERSION {
                return Err(InvalidRecord(format!(
                    "lease format version {version} is not readable by this build (it reads {LEASE_FORMAT_VERSION})"
                )));
            }
        }
        let record: Self = serde_json::from_slice(bytes)
            .map_err(|e| InvalidRecord(format!("bad lease JSON: {e}")))?;
        record.validate()?;
        Ok(record)
    }
}

/// The record a node writes when it starts a session. `previous` is the
/// record found at its key, if any: its counter is continued (bytes never
/// repeat) and its live window carried forward as the predecessor's.
pub fn acquire_record(
    previous: Option<&LeaseRecord>,
    node_id: NodeId,
    session_id: SessionId,
    endpoints: Endpoints,
    now_wall_ms: u64,
    config: &LeaseConfig,
) -> LeaseRecord {
    let predecessor_live_until_ms = previous.map_or(0, |previous| {
        let own = match previous.state {
            LeaseState::Live => previous.expires_at_ms,
            LeaseState::Retired => 0,
        };
        own.max(previous.predecessor_live_until_ms)
    });
    LeaseRecord {
        version: LEASE_FORMAT_VERSION,
        node_id,
        session_id,
        endpoints,
        counter: previous.map_or(1, |previous| previous.counter.saturating_add(1)),
        renewed_at_ms: now_wall_ms,
        expires_at_ms: now_wall_ms.saturating_add(config.lease_ms),
        predecessor_live_until_ms,
        state: LeaseState::Live,
        ingress_only: false,
    }
}

/// The renewal of `held`: same session, counter + 1, new expiry.
pub fn renewal(held: &LeaseRecord, now_wall_ms: u64, config: &LeaseConfig) -> LeaseRecord {
    LeaseRecord {
        counter: held.counter.saturating_add(1),
        renewed_at_ms: now_wall_ms,
        expires_at_ms: now_wall_ms.saturating_add(config.lease_ms),
        ..held.clone()
    }
}

/// The retirement of `held`: same session, counter + 1, expired now.
pub fn retirement(held: &LeaseRecord, now_wall_ms: u64) -> LeaseRecord {
    LeaseRecord {
        counter: held.counter.saturating_add(1),
        renewed_at_ms: now_wall_ms,
        expires_at_ms: now_wall_ms,
        state: LeaseState::Retired,
        ..held.clone()
    }
}

/// The local deadline of a lease whose write was *sent* at `sent`: the holder
/// may serve without reading the bucket until then.
pub fn local_deadline(sent: Instant, config: &LeaseConfig) -> Instant {
    sent + Duration::from_millis(config.lease_ms.saturating_sub(config.drift_margin_ms))
}

/// Whether a session may still be serving, as other nodes judge it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// Possibly serving until this wall-clock ms (margin included).
    Live {
        /// Wall-clock ms after which it is certainly not.
        until_ms: u64,
    },
    /// Certainly not serving (expired plus margin, or retired).
    Dead,
}

/// Judges `session` of the node whose current lease record is `lease`.
///
/// * no record: dead (the node never held a lease under this prefix);
/// * the record's own session: retired → dead; else live until
///   `expires_at_ms + margin`;
/// * an earlier session (the node restarted): live until the carried-forward
///   `predecessor_live_until_ms + margin`.
pub fn session_liveness(
    lease: Option<&LeaseRecord>,
    session: SessionId,
    now_wall_ms: u64,
    margin_ms: u64,
) -> Liveness {
    let Some(lease) = lease else {
        return Liveness::Dead;
    };
    let until_ms = if lease.session_id == session {
        match lease.state {
            LeaseState::Retired => return Liveness::Dead,
            LeaseState::Live => lease.expires_at_ms.saturating_add(margin_ms),
        }
    } else if lease.predecessor_live_until_ms == 0 {
        // The record's predecessors left nothing live (none, or retired):
        // no margin to wait out for an earlier session.
        return Liveness::Dead;
    } else {
        lease.predecessor_live_until_ms.saturating_add(margin_ms)
    };
    if now_wall_ms < until_ms {
        Liveness::Live { until_ms }
    } else {
        Liveness::Dead
    }
}

/// What a failed renewal found in the record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RenewalVerdict {
    /// The record is exactly our proposal: the renewal committed.
    Committed,
    /// Another session (or nobody) holds the record: we were replaced; stop
    /// serving at once.
    Replaced,
    /// Still our session, but not our proposal: it did not commit.
    NotCommitted,
}

/// Decides a renewal (or retirement) whose CAS failed or whose reply was lost,
/// from the record re-read afterwards.
pub fn judge_renewal(proposal: &LeaseRecord, observed: Option<&LeaseRecord>) -> RenewalVerdict {
    match observed {
        Some(observed) if observed == proposal => RenewalVerdict::Committed,
        Some(observed) if observed.session_id == proposal.session_id => {
            RenewalVerdict::NotCommitted
        }
        _ => RenewalVerdict::Replaced,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> LeaseConfig {
        LeaseConfig {
            lease_ms: 10_000,
            renew_every_ms: 3_000,
            drift_margin_ms: 500,
        }
    }

    fn node() -> NodeId {
        NodeId::new("n1").unwrap()
    }

    /// Found by `takeover_waits_for_expiry_plus_margin`: a session that
    /// retired and whose node started again at once is dead at any time,
    /// even within the first margin of the clock (the successor's record
    /// says no predecessor is live: 0, which once read as live until the
    /// margin).
    #[test]
    fn a_retired_predecessor_is_dead_even_at_time_zero() {
        let old = SessionId::from_u128(1);
        let held = acquire_record(None, node(), old, Endpoints::default(), 0, &config());
        let retired = retirement(&held, 0);
        let next = acquire_record(
            Some(&retired),
            node(),
            SessionId::from_u128(2),
            Endpoints::default(),
            0,
            &config(),
        );
        assert_eq!(next.predecessor_live_until_ms, 0);
        assert_eq!(session_liveness(Some(&next), old, 0, 500), Liveness::Dead);
        assert_eq!(session_liveness(Some(&next), old, 499, 500), Liveness::Dead);
    }

    #[test]
    fn liveness_uses_expiry_plus_margin() {
        let lease = acquire_record(
            None,
            node(),
            SessionId::from_u128(1),
            Endpoints::default(),
            1_000,
            &config(),
        );
        assert_eq!(lease.expires_at_ms, 11_000);
        let me = lease.session_id;
        assert_eq!(
            session_liveness(Some(&lease), me, 11_499, 500),
            Liveness::Live { until_ms: 11_500 }
        );
        assert_eq!(
            session_liveness(Some(&lease), me, 11_500, 500),
            Liveness::Dead
        );
        assert_eq!(session_liveness(None, me, 0, 500), Liveness::Dead);
        let retired = retirement(&lease, 2_000);
        assert_eq!(
            session_liveness(Some(&retired), me, 2_000, 500),
            Liveness::Dead
        );
    }

    #[test]
    fn a_restart_keeps_the_old_session_live_until_its_expiry() {
        let old = acquire_record(
            None,
            node(),
            SessionId::from_u128(1),
            Endpoints::default(),
            1_000,
            &config(),
        );
        let new = acquire_record(
            Some(&old),
            node(),
            SessionId::from_u128(2),
            Endpoints::default(),
            3_000,
            &config(),
        );
        assert_eq!(new.counter, old.counter + 1);
        assert_eq!(new.predecessor_live_until_ms, 11_000);
        let old_session = old.session_id;
        assert_eq!(
            session_liveness(Some(&new), old_session, 11_000, 500),
            Liveness::Live { until_ms: 11_500 }
        );
        assert_eq!(
            session_liveness(Some(&new), old_session, 11_500, 500),
            Liveness::Dead
        );
        // A retired predecessor leaves no window.
        let retired = retirement(&old, 2_000);
        let after = acquire_record(
            Some(&retired),
            node(),
            SessionId::from_u128(3),
            Endpoints::default(),
            3_000,
            &config(),
        );
        assert_eq!(after.predecessor_live_until_ms, 0);
    }

    #[test]
    fn the_local_deadline_counts_from_sending() {
        let sent = Instant::now();
        assert_eq!(
            local_deadline(sent, &config()) - sent,
            Duration::from_millis(9_500)
        );
    }

    #[test]
    fn renewals_never_repeat_bytes_and_are_judged_exactly() {
        let lease = acquire_record(
            None,
            node(),
            SessionId::from_u128(1),
            Endpoints::default(),
            1_000,
            &config(),
        );
        let renewed = renewal(&lease, 1_000, &config());
        assert_ne!(renewed.encode().unwrap(), lease.encode().unwrap());
        assert_eq!(
            judge_renewal(&renewed, Some(&renewed)),
            RenewalVerdict::Committed
        );
        assert_eq!(
            judge_renewal(&renewed, Some(&lease)),
            RenewalVerdict::NotCommitted
        );
        let other = acquire_record(
            Some(&lease),
            node(),
            SessionId::from_u128(9),
            Endpoints::default(),
            1_000,
            &config(),
        );
        assert_eq!(
            judge_renewal(&renewed, Some(&other)),
            RenewalVerdict::Replaced
        );
        assert_eq!(judge_renewal(&renewed, None), RenewalVerdict::Replaced);
    }

    #[test]
    fn lease_records_round_trip_and_reject_junk() {
        let lease = acquire_record(
            None,
            node(),
            SessionId::random(),
            Endpoints {
                grpc: "https://a:1".into(),
                peer: "https://a:3".into(),
                http: "http://a:2".into(),
            },
            5,
            &config(),
        );
        let bytes = lease.encode().unwrap();
        assert_eq!(LeaseRecord::decode(&bytes).unwrap(), lease);
        assert_eq!(lease.endpoints.peer_or_grpc(), "https://a:3");
        assert!(LeaseRecord::decode(b"{}").is_err());
        // The peer endpoint is a field of its own, required and checked.
        let value = serde_json::to_value(&lease).unwrap();
        assert_eq!(value["endpoints"]["peer"], "https://a:3");
        let mut missing = value.clone();
        missing["endpoints"].as_object_mut().unwrap().remove("peer");
        assert!(LeaseRecord::decode(&serde_json::to_vec(&missing).unwrap()).is_err());
        let mut control = value.clone();
        control["endpoints"]["peer"] = serde_json::json!("https://a:3\n");
        assert!(LeaseRecord::decode(&serde_json::to_vec(&control).unwrap()).is_err());
        // A version-1 record (peer inside the grpc URL) is refused by name.
        let mut old = missing;
        old["version"] = serde_json::json!(1);
        old["endpoints"]["grpc"] = serde_json::json!("https://a:1?peer=a:3");
        let error = LeaseRecord::decode(&serde_json::to_vec(&old).unwrap()).unwrap_err();
        assert!(error.to_string().contains("version 1"), "{error}");
        // An embedder serving peers on its client listener leaves it empty.
        let shared = Endpoints {
            grpc: "https://b:1".into(),
            ..Endpoints::default()
        };
        assert_eq!(shared.peer_or_grpc(), "https://b:1");
        let mut value = serde_json::to_value(&lease).unwrap();
        value["expires_at_ms"] = serde_json::json!(1);
        assert!(LeaseRecord::decode(&serde_json::to_vec(&value).unwrap()).is_err());
        assert!(LeaseConfig {
            lease_ms: 100,
            renew_every_ms: 200,
            drift_margin_ms: 1
        }
        .validate()
        .is_err());
    }

    #[test]
    fn the_ingress_only_flag_round_trips_and_is_absent_from_ordinary_leases() {
        let ordinary = acquire_record(
            None,
            node(),
            SessionId::from_u128(1),
            Endpoints::default(),
            1_000,
            &config(),
        );
        let bytes = ordinary.encode().unwrap();
        assert!(!String::from_utf8_lossy(&bytes).contains("ingress_only"));
        assert!(!LeaseRecord::decode(&bytes).unwrap().ingress_only);
        let ingress = LeaseRecord {
            ingress_only: true,
            ..ordinary
        };
        let decoded = LeaseRecord::decode(&ingress.encode().unwrap()).unwrap();
        assert!(decoded.ingress_only);
        // Renewals keep it.
        assert!(renewal(&decoded, 2_000, &config()).ingress_only);
    }
}
