//! Running verified requests on this node's runtime and turning the runtime's answers into `cellfleet.v1` responses.
//!
//! Both the client service (when this node is the owner or the placement
//! target) and the peer service (a forwarded request) end here. The
//! envelope was verified before any of these functions run.

use cellfleet_authority::{CellId, Epoch, Txid};
use cellfleet_cell::{Command, CommandId, Outcome, RejectCode};
use cellfleet_proto::v1;
use cellfleet_runtime::{Executed, NodeHandle, Queried, Receipt, Resolution};

use crate::envelope::{VerifiedCommand, VerifiedQuery, VerifiedResolve};
use crate::error::{Error, Result};

/// The wire form of a receipt.
pub fn receipt_to_proto(receipt: &Receipt) -> v1::Receipt {
    v1::Receipt {
        cell_id: receipt.cell.as_str().to_owned(),
        epoch: receipt.epoch.get(),
        txid: receipt.txid.0,
    }
}

fn reject_code(code: RejectCode) -> v1::RejectCode {
    match code {
        RejectCode::Expired => v1::RejectCode::Expired,
        RejectCode::IdReused => v1::RejectCode::IdReused,
        RejectCode::UnknownCommand => v1::RejectCode::UnknownCommand,
        RejectCode::BadParameters => v1::RejectCode::BadParameters,
        RejectCode::Sql => v1::RejectCode::Sql,
        RejectCode::LimitExceeded => v1::RejectCode::LimitExceeded,
        RejectCode::RawSqlDisabled => v1::RejectCode::RawSqlDisabled,
        RejectCode::Kind => v1::RejectCode::Kind,
    }
}

/// The wire form of an execute outcome.
pub fn outcome_to_proto(outcome: &Outcome) -> v1::execute_response::Outcome {
    match outcome {
        Outcome::Applied { result } => {
            v1::execute_response::Outcome::ResultJson(result.to_string().into_bytes())
        }
        Outcome::Rejected { rejection } => v1::execute_response::Outcome::Rejected(v1::Rejection {
            code: reject_code(rejection.code) as i32,
            message: rejection.message.clone(),
        }),
    }
}

/// The receipt an execute answer carries: none for a command refused
/// before it ran (expired, or its id reused with other content), whose
/// "receipt" proves nothing was stored.
pub(crate) fn stored_receipt(executed: &Executed) -> Option<&Receipt> {
    let stored = !matches!(
        &executed.outcome,
        Outcome::Rejected { rejection }
            if matches!(rejection.code, RejectCode::Expired | RejectCode::IdReused)
    );
    stored.then_some(&executed.receipt)
}

fn executed_to_proto(node: &NodeHandle, id: [u8; 16], executed: &Executed) -> v1::ExecuteResponse {
    v1::ExecuteResponse {
        command_id: id.to_vec(),
        outcome: Some(outcome_to_proto(&executed.outcome)),
        receipt: stored_receipt(executed).map(receipt_to_proto),
        duplicate: executed.duplicate,
        served_by: node.node_id().as_str().to_owned(),
        served_by_endpoint: node.endpoints().grpc.clone(),
    }
}

/// Executes a verified command on this node (activating the Cell if needed).
pub async fn execute(node: &NodeHandle, command: &VerifiedCommand) -> Result<v1::ExecuteResponse> {
    let cell_command = Command::new(
        command.command_id,
        command.command.clone(),
        command.args.clone(),
        command.expires_at_ms,
    );
    let executed = node
        .execute(&command.kind, &command.key, cell_command)
        .await?;
    Ok(executed_to_proto(node, command.command_id, &executed))
}

fn min_receipt(query: &VerifiedQuery) -> Result<Option<Receipt>> {
    let Some(receipt) = &query.min_receipt else {
        return Ok(None);
    };
    let cell: CellId = receipt
        .cell_id
        .parse()
        .map_err(|e| Error::BadRequest(format!("min_receipt.cell_id: {e}")))?;
    Ok(Some(Receipt {
        cell,
        // The runtime fences on the cell and the TXID; the epoch is informational.
        epoch: Epoch::new(receipt.epoch).unwrap_or(Epoch::FIRST),
        txid: Txid(receipt.txid),
    }))
}

/// Runs a verified query on this node.
pub async fn query(node: &NodeHandle, query: &VerifiedQuery) -> Result<v1::QueryResponse> {
    let min = min_receipt(query)?;
    let queried = node
        .query(
            &query.kind,
            &query.key,
            &query.query,
            query.args.clone(),
            min.as_ref(),
        )
        .await?;
    Ok(v1::QueryResponse {
        result_json: queried.value.to_string().into_bytes(),
        receipt: Some(receipt_to_proto(&queried.receipt)),
        served_by: node.node_id().as_str().to_owned(),
        served_by_endpoint: node.endpoints().grpc.clone(),
    })
}

/// Resolves a verified command id on this node.
pub async fn resolve(node: &NodeHandle, resolve: &VerifiedResolve) -> Result<v1::ResolveResponse> {
    let resolution = node
        .resolve(
            &resolve.kind,
            &resolve.key,
            CommandId(resolve.command_id),
            resolve.command_expires_at_ms,
        )
        .await?;
    let mut response = v1::ResolveResponse {
        command_id: resolve.command_id.to_vec(),
        served_by: node.node_id().as_str().to_owned(),
        served_by_endpoint: node.endpoints().grpc.clone(),
        ..Default::default()
    };
    let state = match resolution {
        Resolution::Committed { receipt, outcome } => {
            response.receipt = Some(receipt_to_proto(&receipt));
            response.outcome = Some(match outcome_to_proto(&outcome) {
                v1::execute_response::Outcome::ResultJson(json) => {
                    v1::resolve_response::Outcome::ResultJson(json)
                }
                v1::execute_response::Outcome::Rejected(rejection) => {
                    v1::resolve_response::Outcome::Rejected(rejection)
                }
            });
            v1::CommandState::Committed
        }
        Resolution::Absent => v1::CommandState::Absent,
        Resolution::Unknown => v1::CommandState::Unknown,
        Resolution::Expired => v1::CommandState::Expired,
        Resolution::NeedsExpiry => v1::CommandState::NeedsExpiry,
    };
    response.state = state as i32;
    Ok(response)
}

pub(crate) fn node_args(args_json: &[u8]) -> Result<serde_json::Value> {
    let args: serde_json::Value = serde_json::from_slice(args_json)
        .map_err(|e| Error::Malformed(format!("args_json: {e}")))?;
    object_args(&args)?;
    Ok(args)
}

/// A node request's arguments are a JSON object, whichever form they came in.
fn object_args(args: &serde_json::Value) -> Result<()> {
    if !args.is_object() {
        return Err(Error::Malformed("args_json is not a JSON object".into()));
    }
    Ok(())
}

/// Executes a node command this node issued itself, as it is in memory
/// (the caller checked its kind): the same run as [`node_command`] without
/// the wire form's JSON text either way.
pub(crate) async fn own_node_command(
    node: &NodeHandle,
    kind: &str,
    key: &[u8],
    command: &Command,
) -> Result<Executed> {
    object_args(&command.args)?;
    Ok(node.execute(kind, key, command.clone()).await?)
}

/// Runs a node query this node issued itself, as it is in memory (the
/// caller checked its kind): [`node_query`] without the JSON text.
pub(crate) async fn own_node_query(
    node: &NodeHandle,
    kind: &str,
    key: &[u8],
    name: &str,
    args: &serde_json::Value,
) -> Result<Queried> {
    object_args(args)?;
    Ok(node.query(kind, key, name, args.clone(), None).await?)
}

/// Executes an unsigned node command on this node (the caller checked its kind).
pub async fn node_command(
    node: &NodeHandle,
    request: &v1::NodeCommand,
) -> Result<v1::ExecuteResponse> {
    let command = node_command_of(request)?;
    let id = command.id.0;
    let executed = node.execute(&request.kind, &request.key, command).await?;
    Ok(executed_to_proto(node, id, &executed))
}

/// The command a node command's wire form carries.
pub(crate) fn node_command_of(request: &v1::NodeCommand) -> Result<Command> {
    let id: [u8; 16] = request
        .command_id
        .as_slice()
        .try_into()
        .map_err(|_| Error::Malformed("command_id must be 16 bytes".into()))?;
    Ok(Command::new(
        id,
        request.command.clone(),
        node_args(&request.args_json)?,
        request.expires_at_ms,
    ))
}

/// Runs an unsigned node query on this node (the caller checked its kind).
pub async fn node_query(node: &NodeHandle, request: &v1::NodeQuery) -> Result<v1::QueryResponse> {
    let queried = node
        .query(
            &request.kind,
            &request.key,
            &request.query,
            node_args(&request.args_json)?,
            None,
        )
        .await?;
    Ok(v1::QueryResponse {
        result_json: queried.value.to_string().into_bytes(),
        receipt: Some(receipt_to_proto(&queried.receipt)),
        served_by: node.node_id().as_str().to_owned(),
        served_by_endpoint: node.endpoints().grpc.clone(),
    })
}

/// Waits on this node for a Cell of a node-request kind to move past
/// `after_txid` (the caller checked its kind): the owner answers a peer's
/// live reads this way.
pub async fn node_watch(
    node: &NodeHandle,
    request: &v1::NodeWatch,
) -> Result<v1::NodeWatchResponse> {
    let seen = node
        .watch(
            &request.kind,
            &request.key,
            cellfleet_authority::Txid(request.after_txid),
            std::time::Duration::from_millis(u64::from(request.wait_ms)),
        )
        .await?;
    Ok(v1::NodeWatchResponse { txid: seen.0 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        // args_json of a node request comes from a peer: any bytes decode
        // to a JSON object or a MALFORMED error, never a panic.
        #[test]
        fn node_args_accept_only_json_objects(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            match node_args(&bytes) {
                Ok(value) => prop_assert!(value.is_object()),
                Err(error) => prop_assert!(matches!(error, Error::Malformed(_))),
            }
        }

        #[test]
        fn node_args_round_trip_objects(map in proptest::collection::btree_map("[a-z]{1,8}", any::<i64>(), 0..8)) {
            let value = serde_json::to_value(&map).expect("a map is JSON");
            prop_assert_eq!(node_args(value.to_string().as_bytes()).expect("an object"), value);
        }
    }

    #[test]
    fn node_args_refuse_non_objects() {
        assert!(node_args(b"[1,2]").is_err());
        assert!(node_args(b"\"x\"").is_err());
        assert!(node_args(b"{\"a\":1}").is_ok());
    }
}
