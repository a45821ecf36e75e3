//! The `cellfleet.v1.Client` service: verify the envelope at the ingress, then route the request to the Cell's owner.

use std::sync::Arc;

use cellfleet_authority::CellId;
use cellfleet_proto::v1;
use tonic::{Request, Response, Status};

use crate::error::Error;
use crate::forward::{deadline_from_metadata, Routed, Router, Verified};

/// The client service of one node.
#[derive(Clone, Debug)]
pub struct ClientService {
    router: Arc<Router>,
}

impl ClientService {
    /// The service over `router`.
    pub fn new(router: Arc<Router>) -> Self {
        ClientService { router }
    }

    fn deadline<T>(&self, request: &Request<T>) -> Option<i64> {
        deadline_from_metadata(request.metadata(), self.router.now_ms())
    }
}

fn envelope(envelope: &Option<v1::SignedEnvelope>) -> Result<&v1::SignedEnvelope, Status> {
    envelope
        .as_ref()
        .ok_or_else(|| Error::Unsigned("the request has no envelope").into())
}

fn unexpected() -> Status {
    Error::Internal {
        message: "the owner answered with another call's response".into(),
        retryable: false,
    }
    .into()
}

#[tonic::async_trait]
impl v1::client_server::Client for ClientService {
    async fn execute(
        &self,
        request: Request<v1::ExecuteRequest>,
    ) -> Result<Response<v1::ExecuteResponse>, Status> {
        let deadline = self.deadline(&request);
        let inner = request.into_inner();
        let command = self
            .router
            .verifier()
            .verify_command(envelope(&inner.envelope)?)?;
        let cell = CellId::for_kind_key(&command.kind, &command.key);
        let verified = Verified::Command(command);
        match self
            .router
            .route_verified(&cell, Routed::Execute(inner), &verified, deadline)
            .await?
        {
            v1::forward_response::Response::Execute(response) => Ok(Response::new(response)),
            _ => Err(unexpected()),
        }
    }

    async fn query(
        &self,
        request: Request<v1::QueryRequest>,
    ) -> Result<Response<v1::QueryResponse>, Status> {
        let deadline = self.deadline(&request);
        let inner = request.into_inner();
        let query = self
            .router
            .verifier()
            .verify_query(envelope(&inner.envelope)?)?;
        let cell = CellId::for_kind_key(&query.kind, &query.key);
        let verified = Verified::Query(query);
        match self
            .router
            .route_verified(&cell, Routed::Query(inner), &verified, deadline)
            .await?
        {
            v1::forward_response::Response::Query(response) => Ok(Response::new(response)),
            _ => Err(unexpected()),
        }
    }

    async fn resolve(
        &self,
        request: Request<v1::ResolveRequest>,
    ) -> Result<Response<v1::ResolveResponse>, Status> {
        let deadline = self.deadline(&request);
        let inner = request.into_inner();
        let resolve = self
            .router
            .verifier()
            .verify_resolve(envelope(&inner.envelope)?)?;
        let cell = CellId::for_kind_key(&resolve.kind, &resolve.key);
        let verified = Verified::Resolve(resolve);
        match self
            .router
            .route_verified(&cell, Routed::Resolve(inner), &verified, deadline)
            .await?
        {
            v1::forward_response::Response::Resolve(response) => Ok(Response::new(response)),
            _ => Err(unexpected()),
        }
    }
}
