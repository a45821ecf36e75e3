//! The streams listener's backend on a cluster node: every stream command or query routes through the node's [`Router`] as an unsigned node request.
//!
//! So a Durable Streams request that reaches a non-owner is served by the
//! owner: owner hints, one authority read on a miss, rendezvous placement,
//! forwarding over the mTLS peer channel, one refresh-and-retry, and
//! UNKNOWN_OUTCOME when a forwarded command may have run — the same path
//! as a signed gRPC request. The receiving node runs a node request only
//! for the kinds in [`cellfleet_streams::ROUTED_KINDS`] (set with
//! [`Router::with_node_kinds`]), and only from a peer with a node
//! certificate.

use std::sync::Arc;

use cellfleet_authority::CellId;
use cellfleet_cell::{Command, Outcome, RejectCode, Rejection};
use cellfleet_proto::v1;
use cellfleet_router::forward::{NodeExecuted, NodeQueried, Routed, Router};
use cellfleet_router::status::detail_from_status;
use cellfleet_streams::{BackendError, BackendFuture, StreamBackend};
use serde_json::Value;

/// Routes stream requests to their owners.
#[derive(Clone, Debug)]
pub struct RoutedBackend {
    router: Arc<Router>,
}

impl RoutedBackend {
    /// The backend over `router`.
    pub fn new(router: Arc<Router>) -> Self {
        RoutedBackend { router }
    }
}

fn reject_code(code: i32) -> RejectCode {
    match v1::RejectCode::try_from(code) {
        Ok(v1::RejectCode::Expired) => RejectCode::Expired,
        Ok(v1::RejectCode::IdReused) => RejectCode::IdReused,
        Ok(v1::RejectCode::UnknownCommand) => RejectCode::UnknownCommand,
        Ok(v1::RejectCode::BadParameters) => RejectCode::BadParameters,
        Ok(v1::RejectCode::Sql) => RejectCode::Sql,
        Ok(v1::RejectCode::LimitExceeded) => RejectCode::LimitExceeded,
        Ok(v1::RejectCode::RawSqlDisabled) => RejectCode::RawSqlDisabled,
        _ => RejectCode::Kind,
    }
}

/// A routed failure as the streams server reports it.
fn status_error(status: tonic::Status) -> BackendError {
    use v1::ErrorCode as C;
    let detail = detail_from_status(&status);
    let code = detail
        .as_ref()
        .and_then(|d| C::try_from(d.code).ok())
        .unwrap_or(C::Unspecified);
    let message = status.message().to_owned();
    match code {
        C::UnknownOutcome => BackendError::UnknownOutcome(message),
        C::NotOwner => BackendError::NotOwner(message),
        C::BadRequest | C::Malformed | C::TooLarge => BackendError::BadRequest(message),
        C::Unauthorized | C::NotPeer | C::Internal
            if !detail.as_ref().is_some_and(|d| d.retry_safe) =>
        {
            BackendError::Internal(message)
        }
        _ => BackendError::Unavailable {
            message,
            retry_after_ms: detail.map(|d| d.retry_after_ms).filter(|&ms| ms > 0),
        },
    }
}

fn parse_json(bytes: &[u8]) -> Result<Value, BackendError> {
    serde_json::from_slice(bytes)
        .map_err(|e| BackendError::Internal(format!("the owner sent bad JSON: {e}")))
}

impl StreamBackend for RoutedBackend {
    fn execute<'a>(
        &'a self,
        kind: &'a str,
        key: &'a [u8],
        command: Command,
    ) -> BackendFuture<'a, Outcome> {
        Box::pin(async move {
            let cell = CellId::for_kind_key(kind, key);
            let executed = self
                .router
                .route_node_command(&cell, kind, key, &command)
                .await
                .map_err(status_error)?;
            let executed = match executed {
                // Run here: the runtime's outcome as it is.
                NodeExecuted::Here(executed) => return Ok(executed.outcome),
                NodeExecuted::Forwarded(executed) => executed,
            };
            match executed.outcome {
                Some(v1::execute_response::Outcome::ResultJson(json)) => Ok(Outcome::Applied {
                    result: parse_json(&json)?,
                }),
                Some(v1::execute_response::Outcome::Rejected(rejection)) => Ok(Outcome::Rejected {
                    rejection: Rejection {
                        code: reject_code(rejection.code),
                        message: rejection.message,
                    },
                }),
                None => Err(BackendError::Internal("the owner sent no outcome".into())),
            }
        })
    }

    fn query<'a>(
        &'a self,
        kind: &'a str,
        key: &'a [u8],
        name: &'a str,
        args: Value,
    ) -> BackendFuture<'a, Value> {
        Box::pin(async move {
            let cell = CellId::for_kind_key(kind, key);
            let queried = self
                .router
                .route_node_query(&cell, kind, key, name, &args)
                .await
                .map_err(status_error)?;
            match queried {
                // Run here: the runtime's value as it is.
                NodeQueried::Here(queried) => Ok(queried.value),
                NodeQueried::Forwarded(queried) => parse_json(&queried.result_json),
            }
        })
    }

    fn watch<'a>(
        &'a self,
        kind: &'a str,
        key: &'a [u8],
        after: u64,
        wait: std::time::Duration,
    ) -> BackendFuture<'a, u64> {
        Box::pin(async move {
            let cell = CellId::for_kind_key(kind, key);
            let request = Routed::NodeWatch(v1::NodeWatch {
                kind: kind.to_owned(),
                key: key.to_vec(),
                after_txid: after,
                wait_ms: u32::try_from(wait.as_millis()).unwrap_or(u32::MAX),
            });
            let response = self
                .router
                .route(&cell, request, None)
                .await
                .map_err(status_error)?;
            let v1::forward_response::Response::Watch(watched) = response else {
                return Err(BackendError::Internal(
                    "the owner sent no watch response".into(),
                ));
            };
            Ok(watched.txid)
        })
    }

    fn sweeps<'a>(&'a self, kind: &'a str, key: &'a [u8]) -> BackendFuture<'a, bool> {
        Box::pin(async move {
            let live: Vec<cellfleet_authority::NodeId> = self
                .router
                .live_nodes(false)
                .await
                .map_err(|e| BackendError::Unavailable {
                    message: e.to_string(),
                    retry_after_ms: None,
                })?
                .into_iter()
                .filter(|record| !record.ingress_only)
                .map(|record| record.node_id)
                .collect();
            let me = self.router.node().node_id();
            Ok(is_sweeper(&CellId::for_kind_key(kind, key), &live, me))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellfleet_router::status::to_status;
    use cellfleet_router::Error;

    #[test]
    fn routed_failures_map_to_backend_errors() {
        let unknown = status_error(to_status(&Error::UnknownOutcome("lost".into())));
        assert!(matches!(unknown, BackendError::UnknownOutcome(_)));
        let busy = status_error(to_status(&Error::ResourceExhausted {
            what: "cells".into(),
            retry_after_ms: 1_500,
        }));
        assert!(matches!(
            busy,
            BackendError::Unavailable {
                retry_after_ms: Some(1_500),
                ..
            }
        ));
        let refused = status_error(to_status(&Error::Unauthorized {
            key_id: "(unsigned node request)".into(),
            what: "use kind \"kv\"".into(),
        }));
        assert!(matches!(refused, BackendError::Internal(_)));
        let transport = status_error(tonic::Status::unknown("h2 reset"));
        assert!(matches!(transport, BackendError::Unavailable { .. }));
    }

    proptest::proptest! {
        /// Nodes that agree on the live set pick exactly one sweeper for
        /// every subscription; a node outside the set never sweeps.
        #[test]
        fn exactly_one_live_node_sweeps_each_subscription(
            key in "[a-z/]{1,40}",
            nodes in 1usize..8,
        ) {
            use cellfleet_authority::NodeId;
            let live: Vec<NodeId> = (0..nodes).map(|i| NodeId::new(format!("n{i}")).unwrap()).collect();
            let cell = CellId::for_kind_key("ds_subscription", key.as_bytes());
            let sweepers = live.iter().filter(|me| is_sweeper(&cell, &live, me)).count();
            proptest::prop_assert_eq!(sweepers, 1);
            let outsider = NodeId::new("outside").unwrap();
            proptest::prop_assert!(!is_sweeper(&cell, &live, &outsider));
        }
    }
}

/// Whether `me` checks `cell` in the full subscription sweep: the
/// rendezvous choice over the live nodes that take Cells (`live`), so
/// exactly one of them does while they agree on the live set.
pub fn is_sweeper(
    cell: &CellId,
    live: &[cellfleet_authority::NodeId],
    me: &cellfleet_authority::NodeId,
) -> bool {
    cellfleet_router::hints::rendezvous_owner(cell, live) == Some(me)
}

/// The node's key registry as the streams listener's token keys: a key
/// signs tokens for the prefixes in its entry's `stream_token_prefixes`.
#[derive(Clone, Debug)]
pub struct RegistryTokens {
    registry: Arc<cellfleet_router::registry::KeyRegistry>,
}

impl RegistryTokens {
    /// The token keys of `registry`.
    pub fn new(registry: Arc<cellfleet_router::registry::KeyRegistry>) -> Self {
        RegistryTokens { registry }
    }
}

impl cellfleet_streams::token::TokenKeys for RegistryTokens {
    fn token_key(&self, key_id: &str) -> Option<cellfleet_streams::token::TokenKey> {
        let key = self.registry.get(key_id).ok()?;
        Some(cellfleet_streams::token::TokenKey {
            public_key: key.public_key,
            prefixes: key.entry.stream_token_prefixes.clone(),
        })
    }
}
