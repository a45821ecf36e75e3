//! The `cellfleet.v1.Admin` service: node leases, Cells and their roots read from the authority, and drain (signed by an admin key).
//!
//! Reads come from the bucket (the authority is the truth, not any node's
//! memory), bounded by [`SCAN_KEYS_MAX`] keys. Drain runs in its own task:
//! a dropped request cannot stop it half-way.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cellfleet_authority::lease::session_liveness;
use cellfleet_authority::{CellId, Layout, LeaseRecord, LeaseState, Liveness, RootRecord};
use cellfleet_proto::v1;
use cellfleet_store::ObjectStore;
use tokio::sync::Notify;
use tonic::{Request, Response, Status};

use crate::endpoints::host_port;
use crate::error::Error;
use crate::forward::Router;

/// Most keys one listing of the bucket reads.
pub const SCAN_KEYS_MAX: usize = 100_000;
/// Cells per ListCells page when the request says 0.
pub const CELLS_PAGE_DEFAULT: usize = 100;
/// Most Cells per ListCells page.
pub const CELLS_PAGE_MAX: usize = 1_000;

/// Drain state shared by the admin service, the HTTP readiness probe and
/// the process that owns the node.
#[derive(Debug, Default)]
pub struct DrainState {
    /// Set when a drain starts.
    pub draining: AtomicBool,
    /// Notified when a drain requested over Admin.Drain has finished.
    pub drained: Notify,
}

/// The admin service of one node.
#[derive(Clone, Debug)]
pub struct AdminService {
    router: Arc<Router>,
    store: Arc<dyn ObjectStore>,
    layout: Layout,
    drain: Arc<DrainState>,
}

fn internal(error: impl std::fmt::Display) -> Status {
    Error::Internal {
        message: error.to_string(),
        retryable: true,
    }
    .into()
}

impl AdminService {
    /// The service over `router`, reading the bucket through `store`.
    pub fn new(
        router: Arc<Router>,
        store: Arc<dyn ObjectStore>,
        layout: Layout,
        drain: Arc<DrainState>,
    ) -> Self {
        AdminService {
            router,
            store,
            layout,
            drain,
        }
    }

    async fn leases(&self) -> Result<Vec<LeaseRecord>, Status> {
        let entries = cellfleet_store::list_all(
            self.store.as_ref(),
            &self.layout.nodes_prefix(),
            SCAN_KEYS_MAX,
        )
        .await
        .map_err(internal)?;
        let mut leases = Vec::new();
        for entry in entries {
            let Some(node) = self.layout.parse_node_lease_key(&entry.key) else {
                continue;
            };
            if let Ok(Some(lease)) = self.router.leases().read(&node).await {
                leases.push(lease.record);
            }
        }
        Ok(leases)
    }

    /// Every root in the bucket, in Cell id order.
    async fn roots(&self) -> Result<Vec<RootRecord>, Status> {
        let entries = cellfleet_store::list_all(
            self.store.as_ref(),
            &self.layout.cells_prefix(),
            SCAN_KEYS_MAX,
        )
        .await
        .map_err(internal)?;
        let mut roots = Vec::new();
        for entry in entries {
            let Some(cell) = self.layout.parse_root_key(&entry.key) else {
                continue;
            };
            if let Ok(Some(root)) = self.router.roots().read(&cell).await {
                roots.push(root.record);
            }
        }
        roots.sort_by(|a, b| a.cell_id.cmp(&b.cell_id));
        Ok(roots)
    }

    fn summary(&self, root: &RootRecord) -> v1::CellSummary {
        let owner = root.owner.as_ref().map(|o| o.as_str().to_owned());
        let open = root.owner.as_ref() == Some(self.router.node().node_id())
            && self.router.node().owned_cells().contains(&root.cell_id);
        v1::CellSummary {
            cell_id: root.cell_id.as_str().to_owned(),
            kind: root.kind.clone(),
            key: root.key.clone().unwrap_or_default().into_bytes(),
            owner_node_id: owner.unwrap_or_default(),
            epoch: root.epoch.get(),
            txid: root.txid.0,
            open,
        }
    }
}

#[tonic::async_trait]
impl v1::admin_server::Admin for AdminService {
    async fn list_leases(
        &self,
        request: Request<v1::ListLeasesRequest>,
    ) -> Result<Response<v1::ListLeasesResponse>, Status> {
        let leases = self.leases().await?;
        let roots = if request.get_ref().skip_owned_cells {
            Vec::new()
        } else {
            self.roots().await?
        };
        let now_ms = u64::try_from(self.router.now_ms()).unwrap_or(0);
        let margin_ms = self.router.leases().config().drift_margin_ms;
        let leases = leases
            .into_iter()
            .map(|record| {
                let live = matches!(
                    session_liveness(Some(&record), record.session_id, now_ms, margin_ms),
                    Liveness::Live { .. }
                );
                let owned_cells = roots
                    .iter()
                    .filter(|root| root.owner.as_ref() == Some(&record.node_id))
                    .count() as u64;
                let me = record.node_id == *self.router.node().node_id();
                v1::NodeLease {
                    node_id: record.node_id.as_str().to_owned(),
                    session_id: record.session_id.to_string(),
                    endpoint: record.endpoints.grpc.clone(),
                    peer_endpoint: host_port(record.endpoints.peer_or_grpc()).to_owned(),
                    expires_at_ms: i64::try_from(record.expires_at_ms).unwrap_or(i64::MAX),
                    live,
                    draining: record.state == LeaseState::Retired
                        || (me && self.drain.draining.load(Ordering::SeqCst)),
                    owned_cells,
                    renewed_at_ms: i64::try_from(record.renewed_at_ms).unwrap_or(i64::MAX),
                    ingress_only: record.ingress_only,
                }
            })
            .collect();
        Ok(Response::new(v1::ListLeasesResponse { leases }))
    }

    async fn list_cells(
        &self,
        request: Request<v1::ListCellsRequest>,
    ) -> Result<Response<v1::ListCellsResponse>, Status> {
        let request = request.into_inner();
        let limit = match request.limit as usize {
            0 => CELLS_PAGE_DEFAULT,
            n => n.min(CELLS_PAGE_MAX),
        };
        let roots = self.roots().await?;
        let mut cells: Vec<v1::CellSummary> = roots
            .iter()
            .filter(|root| root.cell_id.as_str() > request.page_token.as_str())
            .filter(|root| {
                request.owner_node_id.is_empty()
                    || root.owner.as_ref().map(|o| o.as_str()) == Some(&request.owner_node_id)
            })
            .take(limit + 1)
            .map(|root| self.summary(root))
            .collect();
        let next_page_token = if cells.len() > limit {
            cells.truncate(limit);
            cells.last().map(|c| c.cell_id.clone()).unwrap_or_default()
        } else {
            String::new()
        };
        Ok(Response::new(v1::ListCellsResponse {
            cells,
            next_page_token,
        }))
    }

    async fn describe_cell(
        &self,
        request: Request<v1::DescribeCellRequest>,
    ) -> Result<Response<v1::DescribeCellResponse>, Status> {
        let cell = match request.into_inner().cell {
            Some(v1::describe_cell_request::Cell::Address(address)) => {
                CellId::for_kind_key(&address.kind, &address.key)
            }
            Some(v1::describe_cell_request::Cell::CellId(id)) => id
                .parse::<CellId>()
                .map_err(|e| Status::from(Error::BadRequest(format!("cell_id: {e}"))))?,
            None => {
                return Err(Error::BadRequest("say which cell: address or cell_id".into()).into())
            }
        };
        let Some(root) = self.router.roots().read(&cell).await.map_err(internal)? else {
            return Err(Status::not_found(format!(
                "cell {cell} has no root: it was never written to"
            )));
        };
        let root = root.record;
        Ok(Response::new(v1::DescribeCellResponse {
            summary: Some(self.summary(&root)),
            revision: root.revision,
            checksum: format!("{:016x}", root.checksum),
            chain: root
                .chain
                .iter()
                .map(|file| v1::LtxFile {
                    min_txid: file.min_txid.0,
                    max_txid: file.max_txid.0,
                    size_bytes: file.size,
                    object_key: file.key.clone(),
                    file_checksum: format!("{:016x}", file.file_checksum),
                    post_apply_checksum: format!("{:016x}", file.post_apply_checksum),
                })
                .collect(),
            log: root.log.as_ref().map(|pointer| v1::LogPointer {
                node_id: pointer.lane.node.as_str().to_owned(),
                session: pointer.lane.session.to_string(),
                lane: u32::from(pointer.lane.lane),
                from_seq: pointer.from_seq,
            }),
        }))
    }

    async fn drain(
        &self,
        request: Request<v1::DrainRequest>,
    ) -> Result<Response<v1::DrainResponse>, Status> {
        let envelope = request
            .into_inner()
            .envelope
            .ok_or(Error::Unsigned("the request has no envelope"))?;
        let admin = self.router.verifier().verify_admin(&envelope)?;
        if admin.operation != "drain" {
            return Err(
                Error::BadRequest(format!("unknown operation {:?}", admin.operation)).into(),
            );
        }
        let me = self.router.node().node_id().as_str().to_owned();
        if !admin.node_id.is_empty() && admin.node_id != me {
            return Err(Error::BadRequest(format!(
                "this is node {me}; send the drain of {} to that node's endpoint (see `cellfleet leases`)",
                admin.node_id
            ))
            .into());
        }
        self.drain.draining.store(true, Ordering::SeqCst);
        let node = self.router.node().clone();
        let drain = self.drain.clone();
        let released = tokio::spawn(async move {
            let result = node.drain().await;
            drain.drained.notify_waiters();
            drain.drained.notify_one();
            result
        })
        .await
        .map_err(internal)?
        .map_err(Error::from)?;
        Ok(Response::new(v1::DrainResponse {
            node_id: me,
            cells_released: released as u64,
        }))
    }

    async fn node_stats(
        &self,
        _request: Request<v1::NodeStatsRequest>,
    ) -> Result<Response<v1::NodeStatsResponse>, Status> {
        let gathered = crate::stats::gather(&self.router).await?;
        Ok(Response::new(gathered))
    }
}
