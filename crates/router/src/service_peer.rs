//! The `cellfleet.v1.Peer` service: a node runs a request another node's ingress routed here, after checking the caller is a node and checking the envelope again.
//!
//! The signature is checked once per request, at its ingress: when the
//! forward says the ingress verified it (`ingress_verified`), the owner
//! checks the key, the body and its fields, the window and the key's
//! authorization but not the signature. Only nodes reach this service
//! (mTLS, node certificates), and a node already holds the bucket's
//! credentials, so a second signature check would guard against nothing a
//! node could not do anyway. A forward without the flag (an older ingress)
//! is verified in full.
//!
//! A peer never forwards: it answers from its own runtime or with
//! NOT_OWNER and its best hint, so requests cannot loop. An unsigned node
//! request (NodeCommand, NodeQuery, NodeWatch) is accepted only here — from an
//! mTLS-authenticated node — and only for the router's node kinds.

use std::sync::Arc;

use cellfleet_proto::v1;
use tonic::{Request, Response, Status};

use crate::envelope::{Signature, Verifier};
use crate::error::Error;
use crate::forward::{run_local, Routed, Router, Verified, HOPS_MAX};
use crate::tls::RoleCache;

/// The peer service of one node.
#[derive(Clone, Debug)]
pub struct PeerService {
    router: Arc<Router>,
    callers: Arc<RoleCache>,
}

impl PeerService {
    /// The service over `router`.
    pub fn new(router: Arc<Router>) -> Self {
        PeerService {
            router,
            callers: Arc::default(),
        }
    }
}

/// A client request its ingress verified, checked here in every other
/// respect (key, body, window, authorization); `None` for a node request.
fn checked_after_ingress(verifier: &Verifier, routed: &Routed) -> Result<Option<Verified>, Error> {
    let missing = || Error::Malformed("the request has no envelope".into());
    let by_ingress = Signature::VerifiedByIngress;
    Ok(match routed {
        Routed::Execute(r) => Some(Verified::Command(
            verifier.check_command(r.envelope.as_ref().ok_or_else(missing)?, by_ingress)?,
        )),
        Routed::Query(r) => Some(Verified::Query(
            verifier.check_query(r.envelope.as_ref().ok_or_else(missing)?, by_ingress)?,
        )),
        Routed::Resolve(r) => Some(Verified::Resolve(
            verifier.check_resolve(r.envelope.as_ref().ok_or_else(missing)?, by_ingress)?,
        )),
        Routed::NodeCommand(_) | Routed::NodeQuery(_) | Routed::NodeWatch(_) => None,
    })
}

#[tonic::async_trait]
impl v1::peer_server::Peer for PeerService {
    async fn forward(
        &self,
        request: Request<v1::ForwardRequest>,
    ) -> Result<Response<v1::ForwardResponse>, Status> {
        let caller = self.callers.require_node(&request)?;
        let forward = request.into_inner();
        if forward.hops > HOPS_MAX {
            return Err(Error::TooManyHops {
                hops: forward.hops,
                max_hops: HOPS_MAX,
            }
            .into());
        }
        if forward.deadline_unix_ms != 0 && forward.deadline_unix_ms < self.router.now_ms() {
            return Err(Error::DeadlineExceeded(format!(
                "forwarded by {caller} after the client's deadline"
            ))
            .into());
        }
        let routed = match forward.request {
            Some(v1::forward_request::Request::Execute(r)) => Routed::Execute(r),
            Some(v1::forward_request::Request::Query(r)) => Routed::Query(r),
            Some(v1::forward_request::Request::Resolve(r)) => Routed::Resolve(r),
            Some(v1::forward_request::Request::NodeCommand(r)) => Routed::NodeCommand(r),
            Some(v1::forward_request::Request::NodeQuery(r)) => Routed::NodeQuery(r),
            Some(v1::forward_request::Request::NodeWatch(r)) => Routed::NodeWatch(r),
            None => return Err(Error::Malformed("the forward carries no request".into()).into()),
        };
        let verified = if forward.ingress_verified {
            checked_after_ingress(self.router.verifier(), &routed)?
        } else {
            None
        };
        // Unsigned node requests arrive only here, behind require_node
        // (mTLS, node certificates), and run only for the node kinds.
        let response = run_local(
            self.router.node(),
            self.router.verifier(),
            self.router.node_kinds(),
            &routed,
            verified.as_ref(),
            forward.root_absent,
        )
        .await?;
        Ok(Response::new(v1::ForwardResponse {
            response: Some(response),
        }))
    }

    async fn stats(
        &self,
        request: Request<v1::StatsRequest>,
    ) -> Result<Response<v1::NodeStats>, Status> {
        self.callers.require_node(&request)?;
        Ok(Response::new(crate::stats::local(&self.router)))
    }
}
