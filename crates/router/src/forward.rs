//! Routing at the ingress: owner-hint lookup, one authority read on a miss, rendezvous placement of unowned Cells, forwarding over the peer service with the client's deadline, and the one refresh-and-retry.
//!
//! The rules (DESIGN.md §5 Routing):
//! * hint hit → execute locally or forward to the hinted node;
//! * miss → one root read: a live owner is the target; an unowned Cell (or
//!   one whose owner's lease expired) is placed by rendezvous hashing over
//!   the live lease set (ingress-only nodes left out), and the target's
//!   runtime activates it (create or take over by CAS: two ingresses with
//!   different views cannot both win);
//! * a NOT_OWNER, DRAINING, LEASE_LOST, FENCED or unreachable target makes
//!   the ingress refresh (root read, live set) and retry **once**; so does a
//!   forward that failed in transit (a timeout, a closed connection): the
//!   refresh re-reads the owner's lease, and once it has expired plus the
//!   margin the Cell is placed on another node, which takes it over;
//! * a forward never waits on a silent peer for the client's whole deadline:
//!   peer channels send HTTP/2 keep-alive pings
//!   ([`crate::transport::KEEP_ALIVE_INTERVAL`]), and each hop has a timeout
//!   of its own ([`hop_timeout`]) that leaves the retry time to run;
//! * only the ingress forwards: a peer answers locally or NOT_OWNER, so a
//!   request makes at most [`HOPS_MAX`] hops and never loops;
//! * the forwarded call carries the original signed envelope and the
//!   client's deadline; a request the ingress runs itself uses the form it
//!   verified ([`Verified`]), and a forward it verified says so
//!   (`ingress_verified`), so the owner checks everything but the
//!   signature: a client request's signature is checked once;
//! * a node's own unsigned request (a [`Routed::NodeCommand`] or
//!   [`Routed::NodeQuery`], made for a protocol without signatures such as
//!   Durable Streams HTTP) routes the same way, and runs — locally or on a
//!   peer, after the peer's mTLS check — only for the kinds in the
//!   receiving node's [`Router::with_node_kinds`] list.
//!
//! *Invariant:* a command whose forward may have reached the owner is never
//! reported as "not sent": if its fate is unprovable the answer is
//! UNKNOWN_OUTCOME (retry with the same command id, or Resolve). Only a
//! failure of the channel's connector ([`crate::transport::ConnectFailed`],
//! typed) proves a forward was never sent ([`Delivery`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cellfleet_authority::{CellId, Clock, LeaseRecord, Liveness, NodeId, NodeLeases, Roots};
use cellfleet_cell::Command;
use cellfleet_proto::v1;
use cellfleet_proto::v1::peer_client::PeerClient;
use cellfleet_runtime::{Executed, NodeHandle, Queried};
use tonic::transport::Channel;

use crate::envelope::{VerifiedCommand, VerifiedQuery, VerifiedResolve, Verifier};
use crate::error::{Error, OwnerHint};
use crate::hints::{rendezvous_owner, CachedOwner, OwnerHintCache};
use crate::status::{detail_from_status, to_status};

/// Most forwards of one request (the ingress's first try and its one retry).
pub const HOPS_MAX: u32 = 2;
/// How long a read of the live lease set is reused for placement.
pub const LIVE_SET_TTL: Duration = Duration::from_millis(500);
/// Connect timeout of peer channels.
pub const PEER_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Longest a forwarded call may take when the client set no deadline.
pub const FORWARD_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);
/// Longest one hop may take, whatever the client's deadline: an owner that
/// answers keep-alive pings but not the request is given up on after this.
pub const FORWARD_HOP_TIMEOUT_MAX: Duration = Duration::from_secs(10);

/// The timeout of hop `hop` (1-based) when `remaining` is left of the
/// client's deadline (pure): a hop that may be followed by the retry takes
/// at most half, so the retry still has time; none takes more than
/// [`FORWARD_HOP_TIMEOUT_MAX`].
pub fn hop_timeout(remaining: Duration, hop: u32) -> Duration {
    let share = if hop < HOPS_MAX {
        remaining / 2
    } else {
        remaining
    };
    share.min(FORWARD_HOP_TIMEOUT_MAX)
}

/// What a failed attempt's transport says about delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// The target answered with a Cellfleet status: its code tells.
    Answered,
    /// The channel's connector failed: the request was never written.
    NeverSent,
    /// Anything else (a timeout, a closed or reset connection, a protocol
    /// error): the request may have reached the target.
    MaybeDelivered,
}

/// What one failed attempt means for the request (pure).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Judgement {
    /// A command may have run on the target.
    pub maybe_sent: bool,
    /// Refresh (root and lease reads) and try once more.
    pub reroute: bool,
}

/// Judges a failed attempt at a `remote` (or local) target for a command
/// (or another request).
pub fn judge_attempt(
    command: bool,
    remote: bool,
    delivery: Delivery,
    code: Option<v1::ErrorCode>,
) -> Judgement {
    let in_transit = remote && delivery == Delivery::MaybeDelivered;
    let maybe_sent = command
        && remote
        && (in_transit
            || (delivery == Delivery::Answered && code == Some(v1::ErrorCode::UnknownOutcome)));
    let moved = delivery == Delivery::Answered
        && matches!(
            code,
            Some(
                v1::ErrorCode::NotOwner
                    | v1::ErrorCode::Draining
                    | v1::ErrorCode::LeaseLost
                    | v1::ErrorCode::Fenced
                    | v1::ErrorCode::PeerUnavailable
            )
        );
    let unreachable = remote && delivery != Delivery::Answered;
    Judgement {
        maybe_sent,
        reroute: moved || unreachable,
    }
}

/// A client request that can run locally or be forwarded.
#[derive(Clone, Debug)]
pub enum Routed {
    /// Client.Execute.
    Execute(v1::ExecuteRequest),
    /// Client.Query.
    Query(v1::QueryRequest),
    /// Client.Resolve.
    Resolve(v1::ResolveRequest),
    /// An unsigned command this node issues for a node-request kind.
    NodeCommand(v1::NodeCommand),
    /// An unsigned query this node issues for a node-request kind.
    NodeQuery(v1::NodeQuery),
    /// A wait for a Cell of a node-request kind to move on (live reads).
    NodeWatch(v1::NodeWatch),
}

/// A client request as the ingress verified it, carried beside its wire
/// form ([`Routed`]): when the ingress owns the Cell it runs this instead
/// of verifying the envelope a second time.
#[derive(Clone, Debug)]
pub enum Verified {
    /// A verified `Execute`.
    Command(VerifiedCommand),
    /// A verified `Query`.
    Query(VerifiedQuery),
    /// A verified `Resolve`.
    Resolve(VerifiedResolve),
}

impl Routed {
    fn is_command(&self) -> bool {
        matches!(self, Routed::Execute(_) | Routed::NodeCommand(_))
    }
}

/// A routed request as [`Router::route_as`] runs it.
enum Request<'a> {
    /// Its wire form, with the ingress's verified form when it has one.
    Wire {
        request: Routed,
        verified: Option<&'a Verified>,
    },
    /// An unsigned command this node issues, kept in memory: run here as
    /// it is, put in its wire form only when it must be forwarded.
    NodeCommand {
        kind: &'a str,
        key: &'a [u8],
        command: &'a Command,
        wire: Option<Routed>,
    },
    /// An unsigned query this node issues, kept in memory likewise.
    NodeQuery {
        kind: &'a str,
        key: &'a [u8],
        name: &'a str,
        args: &'a serde_json::Value,
        wire: Option<Routed>,
    },
}

impl Request<'_> {
    /// True when this node verified the client envelope it carries (so its
    /// owner need not check the signature again).
    fn ingress_verified(&self) -> bool {
        matches!(
            self,
            Request::Wire {
                request: Routed::Execute(_),
                verified: Some(Verified::Command(_)),
            } | Request::Wire {
                request: Routed::Query(_),
                verified: Some(Verified::Query(_)),
            } | Request::Wire {
                request: Routed::Resolve(_),
                verified: Some(Verified::Resolve(_)),
            }
        )
    }

    fn is_command(&self) -> bool {
        match self {
            Request::Wire { request, .. } => request.is_command(),
            Request::NodeCommand { .. } => true,
            Request::NodeQuery { .. } => false,
        }
    }

    /// The wire form, made once.
    fn wire(&mut self) -> &Routed {
        match self {
            Request::Wire { request, .. } => request,
            Request::NodeCommand {
                kind,
                key,
                command,
                wire,
            } => wire.get_or_insert_with(|| {
                Routed::NodeCommand(v1::NodeCommand {
                    kind: (*kind).to_owned(),
                    key: key.to_vec(),
                    command: command.name.clone(),
                    args_json: command.args.to_string().into_bytes(),
                    command_id: command.id.0.to_vec(),
                    expires_at_ms: command.expires_at_ms,
                })
            }),
            Request::NodeQuery {
                kind,
                key,
                name,
                args,
                wire,
            } => wire.get_or_insert_with(|| {
                Routed::NodeQuery(v1::NodeQuery {
                    kind: (*kind).to_owned(),
                    key: key.to_vec(),
                    query: (*name).to_owned(),
                    args_json: args.to_string().into_bytes(),
                })
            }),
        }
    }
}

/// What a routed request returned.
enum Answer {
    /// A peer's answer, or a wire request's run here.
    Wire(v1::forward_response::Response),
    /// A node command run here, as the runtime returned it.
    Executed(Executed),
    /// A node query run here, as the runtime returned it.
    Queried(Queried),
}

/// What [`Router::route_node_command`] returned.
#[derive(Debug)]
pub enum NodeExecuted {
    /// This node ran it: the runtime's own answer.
    Here(Executed),
    /// A peer ran it: its wire answer.
    Forwarded(v1::ExecuteResponse),
}

/// What [`Router::route_node_query`] returned.
#[derive(Debug)]
pub enum NodeQueried {
    /// This node ran it: the runtime's own answer.
    Here(Queried),
    /// A peer ran it: its wire answer.
    Forwarded(v1::QueryResponse),
}

/// What a forward tells the owner besides the request.
#[derive(Clone, Copy, Debug)]
struct ForwardFlags {
    /// The ingress verified the client envelope's signature.
    ingress_verified: bool,
    /// The ingress read the Cell's root just before and found none.
    root_absent: bool,
}

/// Where a request should run.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Target {
    Local,
    Remote { node: NodeId, peer: String },
}

#[derive(Debug, Default)]
struct LiveSet {
    read_at: Option<Instant>,
    nodes: Vec<LeaseRecord>,
}

/// The routing state of one node: its runtime, the authority readers, the
/// owner-hint cache, the live set and the peer channels.
#[derive(Debug)]
pub struct Router {
    node: NodeHandle,
    verifier: Verifier,
    roots: Roots,
    leases: NodeLeases,
    clock: Arc<dyn Clock>,
    hints: OwnerHintCache,
    live: tokio::sync::Mutex<LiveSet>,
    peers: Mutex<HashMap<String, Channel>>,
    peer_tls: Arc<rustls::ClientConfig>,
    node_kinds: Vec<String>,
}

/// What a failed attempt means for the retry.
fn code_of(status: &tonic::Status) -> Option<v1::ErrorCode> {
    detail_from_status(status).and_then(|d| v1::ErrorCode::try_from(d.code).ok())
}

impl Router {
    /// A router for `node`.
    pub fn new(
        node: NodeHandle,
        verifier: Verifier,
        roots: Roots,
        leases: NodeLeases,
        clock: Arc<dyn Clock>,
        peer_tls: Arc<rustls::ClientConfig>,
    ) -> Self {
        Router {
            node,
            verifier,
            roots,
            leases,
            clock,
            hints: OwnerHintCache::default(),
            live: tokio::sync::Mutex::new(LiveSet::default()),
            peers: Mutex::new(HashMap::new()),
            peer_tls,
            node_kinds: Vec::new(),
        }
    }

    /// Allows unsigned node requests ([`Routed::NodeCommand`],
    /// [`Routed::NodeQuery`]) for exactly these kinds; none by default.
    /// Only kinds whose commands are safe for any node to issue belong
    /// here (the Durable Streams kinds, whose HTTP protocol has no
    /// signatures).
    pub fn with_node_kinds<I, S>(mut self, kinds: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.node_kinds = kinds.into_iter().map(Into::into).collect();
        self
    }

    /// The kinds unsigned node requests may use.
    pub fn node_kinds(&self) -> &[String] {
        &self.node_kinds
    }

    /// The runtime.
    pub fn node(&self) -> &NodeHandle {
        &self.node
    }

    /// The envelope verifier.
    pub fn verifier(&self) -> &Verifier {
        &self.verifier
    }

    /// The authority's roots.
    pub fn roots(&self) -> &Roots {
        &self.roots
    }

    /// The authority's node leases.
    pub fn leases(&self) -> &NodeLeases {
        &self.leases
    }

    /// Wall-clock now in Unix ms.
    pub fn now_ms(&self) -> i64 {
        i64::try_from(self.clock.now_wall_ms()).unwrap_or(i64::MAX)
    }

    fn me(&self) -> &NodeId {
        self.node.node_id()
    }

    /// Live lease records, re-read when older than [`LIVE_SET_TTL`] or
    /// when `refresh` is set.
    pub async fn live_nodes(&self, refresh: bool) -> Result<Vec<LeaseRecord>, Error> {
        let mut live = self.live.lock().await;
        let fresh = live.read_at.is_some_and(|at| at.elapsed() < LIVE_SET_TTL);
        if refresh || !fresh {
            live.nodes = self.leases.live_nodes().await.map_err(authority)?;
            live.read_at = Some(Instant::now());
        }
        Ok(live.nodes.clone())
    }

    async fn peer_of(&self, node: &NodeId, refresh: bool) -> Result<String, Error> {
        let live = self.live_nodes(refresh).await?;
        if let Some(record) = live.iter().find(|r| r.node_id == *node) {
            return Ok(record.endpoints.peer_or_grpc().to_owned());
        }
        match self.leases.read(node).await.map_err(authority)? {
            Some(lease) => Ok(lease.record.endpoints.peer_or_grpc().to_owned()),
            None => Err(Error::PeerUnavailable {
                endpoint: node.as_str().to_owned(),
                reason: "the node has no lease record".into(),
            }),
        }
    }

    async fn target_for(&self, node: &NodeId, refresh: bool) -> Result<Target, Error> {
        if node == self.me() {
            return Ok(Target::Local);
        }
        Ok(Target::Remote {
            node: node.clone(),
            peer: self.peer_of(node, refresh).await?,
        })
    }

    /// One authority read: the live owner, or the rendezvous placement over
    /// the live set minus `excluded`; and whether the read found no root
    /// (a new Cell: the node it is placed on need not read it again).
    async fn locate(
        &self,
        cell: &CellId,
        refresh: bool,
        excluded: &[NodeId],
    ) -> Result<(Target, bool), Error> {
        let root = self.roots.read(cell).await.map_err(authority)?;
        let root_absent = root.is_none();
        if let Some(root) = root {
            if let Some(owner) = root.record.owner.clone() {
                let liveness = self
                    .roots
                    .owner_liveness(&root.record)
                    .await
                    .map_err(authority)?;
                if matches!(liveness, Liveness::Live { .. }) && !excluded.contains(&owner) {
                    let target = self.target_for(&owner, refresh).await?;
                    if let Target::Remote { peer, .. } = &target {
                        self.hints.observe(
                            cell.clone(),
                            CachedOwner {
                                node_id: owner.clone(),
                                endpoint: Some(peer.clone()),
                                epoch: root.record.epoch.get(),
                            },
                        );
                    }
                    return Ok((target, false));
                }
                if matches!(liveness, Liveness::Live { .. }) {
                    return Err(Error::PeerUnavailable {
                        endpoint: owner.as_str().to_owned(),
                        reason: "the owner's lease is live but it does not answer; \
                                 its Cells move once the lease expires"
                            .into(),
                    });
                }
            }
        }
        // Ingress-only nodes hold a live lease but take no Cells.
        let live: Vec<NodeId> = self
            .live_nodes(refresh)
            .await?
            .into_iter()
            .filter(|record| !record.ingress_only)
            .map(|record| record.node_id)
            .filter(|node| !excluded.contains(node))
            .collect();
        let Some(owner) = rendezvous_owner(cell, &live) else {
            return Err(Error::PeerUnavailable {
                endpoint: String::new(),
                reason: "no live node to place the cell on".into(),
            });
        };
        let target = self.target_for(&owner.clone(), false).await?;
        if root_absent && matches!(target, Target::Local) {
            // A new Cell placed here: its activation need not read the
            // root again (a create-only write settles any race).
            self.node.note_root_absent(cell);
        }
        Ok((target, root_absent))
    }

    /// Where a request for `cell` goes first, and whether a read just
    /// found its root absent (see [`Router::locate`]).
    async fn first_target(&self, cell: &CellId) -> Result<(Target, bool), Error> {
        match self.hints.get(cell) {
            Some(hint) if hint.node_id == *self.me() => Ok((Target::Local, false)),
            Some(CachedOwner {
                node_id,
                endpoint: Some(peer),
                ..
            }) => Ok((
                Target::Remote {
                    node: node_id,
                    peer,
                },
                false,
            )),
            // A Cell this node holds needs no bucket read to find: the
            // first request for each owned Cell used to read its root and
            // the owner's lease, and with thousands of Cells those reads
            // were a node's largest cost. If the Cell has moved, the actor
            // answers NotOwner and the loop in `route_as` locates it.
            _ if self.node.holds(cell) => Ok((Target::Local, false)),
            _ => self.locate(cell, false, &[]).await,
        }
    }

    fn channel(&self, peer: &str) -> Result<Channel, Error> {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(channel) = peers.get(peer) {
            return Ok(channel.clone());
        }
        let target: crate::transport::HostPort =
            peer.parse().map_err(|reason| Error::PeerUnavailable {
                endpoint: peer.to_owned(),
                reason,
            })?;
        let channel =
            crate::transport::channel_to(&target, self.peer_tls.clone(), PEER_CONNECT_TIMEOUT)
                .map_err(|e| Error::PeerUnavailable {
                    endpoint: peer.to_owned(),
                    reason: e.to_string(),
                })?;
        peers.insert(peer.to_owned(), channel.clone());
        Ok(channel)
    }

    async fn run_local(&self, request: &Request<'_>) -> Result<Answer, Error> {
        match request {
            Request::Wire { request, verified } => run_local(
                &self.node,
                &self.verifier,
                &self.node_kinds,
                request,
                *verified,
                // A Cell placed here was noted by `locate` already.
                false,
            )
            .await
            .map(Answer::Wire),
            Request::NodeCommand {
                kind, key, command, ..
            } => {
                allow_node_kind(&self.node_kinds, kind)?;
                crate::local::own_node_command(&self.node, kind, key, command)
                    .await
                    .map(Answer::Executed)
            }
            Request::NodeQuery {
                kind,
                key,
                name,
                args,
                ..
            } => {
                allow_node_kind(&self.node_kinds, kind)?;
                crate::local::own_node_query(&self.node, kind, key, name, args)
                    .await
                    .map(Answer::Queried)
            }
        }
    }

    async fn forward(
        &self,
        peer: &str,
        request: &Routed,
        flags: ForwardFlags,
        hops: u32,
        deadline_unix_ms: Option<i64>,
    ) -> Result<v1::forward_response::Response, tonic::Status> {
        let remaining = match deadline_unix_ms {
            Some(deadline) => {
                let left = deadline.saturating_sub(self.now_ms());
                if left <= 0 {
                    return Err(to_status(&Error::DeadlineExceeded(
                        "the client's deadline passed before forwarding".into(),
                    )));
                }
                Duration::from_millis(u64::try_from(left).unwrap_or(0))
            }
            None => FORWARD_TIMEOUT_DEFAULT,
        };
        let forward = v1::ForwardRequest {
            request: Some(match request.clone() {
                Routed::Execute(r) => v1::forward_request::Request::Execute(r),
                Routed::Query(r) => v1::forward_request::Request::Query(r),
                Routed::Resolve(r) => v1::forward_request::Request::Resolve(r),
                Routed::NodeCommand(r) => v1::forward_request::Request::NodeCommand(r),
                Routed::NodeQuery(r) => v1::forward_request::Request::NodeQuery(r),
                Routed::NodeWatch(r) => v1::forward_request::Request::NodeWatch(r),
            }),
            hops,
            ingress_node_id: self.me().as_str().to_owned(),
            deadline_unix_ms: deadline_unix_ms.unwrap_or(0),
            ingress_verified: flags.ingress_verified,
            root_absent: flags.root_absent,
        };
        let channel = self.channel(peer).map_err(|e| to_status(&e))?;
        let mut call = tonic::Request::new(forward);
        call.set_timeout(hop_timeout(remaining, hops));
        let response = PeerClient::new(channel).forward(call).await?;
        response.into_inner().response.ok_or_else(|| {
            to_status(&Error::Internal {
                message: format!("peer {peer} sent an empty forward response"),
                retryable: true,
            })
        })
    }

    /// Asks the node at `peer` (its peer endpoint) for its own metrics
    /// (Peer.Stats), within `timeout`.
    pub async fn peer_stats(
        &self,
        peer: &str,
        timeout: Duration,
    ) -> Result<v1::NodeStats, tonic::Status> {
        let channel = self.channel(peer).map_err(|e| to_status(&e))?;
        let mut call = tonic::Request::new(v1::StatsRequest {});
        call.set_timeout(timeout);
        Ok(PeerClient::new(channel).stats(call).await?.into_inner())
    }

    /// Routes a node's own request for `cell` (a [`Routed::NodeCommand`] or
    /// [`Routed::NodeQuery`]; a client request run here is verified here):
    /// local or forwarded, with one refresh-and-retry. Errors come back as
    /// statuses (a peer's status is relayed with its detail).
    pub async fn route(
        &self,
        cell: &CellId,
        request: Routed,
        deadline_unix_ms: Option<i64>,
    ) -> Result<v1::forward_response::Response, tonic::Status> {
        let request = Request::Wire {
            request,
            verified: None,
        };
        self.route_wire(cell, request, deadline_unix_ms).await
    }

    /// Routes a client request this node verified as `verified`, as
    /// [`Router::route`] does; run here, it is not verified again, and a
    /// forward tells the owner it was verified. `verified` must be the
    /// verification of `request`'s own envelope (crate-private for that).
    pub(crate) async fn route_verified(
        &self,
        cell: &CellId,
        request: Routed,
        verified: &Verified,
        deadline_unix_ms: Option<i64>,
    ) -> Result<v1::forward_response::Response, tonic::Status> {
        let request = Request::Wire {
            request,
            verified: Some(verified),
        };
        self.route_wire(cell, request, deadline_unix_ms).await
    }

    /// Routes an unsigned command of a node-request kind that this node
    /// issues, as [`Router::route`] routes a [`Routed::NodeCommand`]: the
    /// same targets, retry and UNKNOWN_OUTCOME rules. Run here, the command
    /// goes to the runtime as it is and its outcome comes back as it is,
    /// with no JSON text either way; only a forward makes the wire form.
    pub async fn route_node_command(
        &self,
        cell: &CellId,
        kind: &str,
        key: &[u8],
        command: &Command,
    ) -> Result<NodeExecuted, tonic::Status> {
        let request = Request::NodeCommand {
            kind,
            key,
            command,
            wire: None,
        };
        match self.route_as(cell, request, None).await? {
            Answer::Executed(executed) => Ok(NodeExecuted::Here(executed)),
            Answer::Wire(v1::forward_response::Response::Execute(executed)) => {
                Ok(NodeExecuted::Forwarded(executed))
            }
            Answer::Wire(_) | Answer::Queried(_) => Err(to_status(&Error::Internal {
                message: "the owner sent no execute response".into(),
                retryable: false,
            })),
        }
    }

    /// Routes an unsigned query of a node-request kind that this node
    /// issues, as [`Router::route`] routes a [`Routed::NodeQuery`]. Run
    /// here, its arguments and value stay in memory, as
    /// [`Router::route_node_command`]'s do.
    pub async fn route_node_query(
        &self,
        cell: &CellId,
        kind: &str,
        key: &[u8],
        name: &str,
        args: &serde_json::Value,
    ) -> Result<NodeQueried, tonic::Status> {
        let request = Request::NodeQuery {
            kind,
            key,
            name,
            args,
            wire: None,
        };
        match self.route_as(cell, request, None).await? {
            Answer::Queried(queried) => Ok(NodeQueried::Here(queried)),
            Answer::Wire(v1::forward_response::Response::Query(queried)) => {
                Ok(NodeQueried::Forwarded(queried))
            }
            Answer::Wire(_) | Answer::Executed(_) => Err(to_status(&Error::Internal {
                message: "the owner sent no query response".into(),
                retryable: false,
            })),
        }
    }

    async fn route_wire(
        &self,
        cell: &CellId,
        request: Request<'_>,
        deadline_unix_ms: Option<i64>,
    ) -> Result<v1::forward_response::Response, tonic::Status> {
        match self.route_as(cell, request, deadline_unix_ms).await? {
            Answer::Wire(response) => Ok(response),
            // Only a node request kept in memory is answered in memory.
            Answer::Executed(_) | Answer::Queried(_) => Err(to_status(&Error::Internal {
                message: "a wire request was answered in memory".into(),
                retryable: false,
            })),
        }
    }

    async fn route_as(
        &self,
        cell: &CellId,
        mut request: Request<'_>,
        deadline_unix_ms: Option<i64>,
    ) -> Result<Answer, tonic::Status> {
        let command = request.is_command();
        let mut excluded: Vec<NodeId> = Vec::new();
        let mut hint: Option<OwnerHint> = None;
        let mut maybe_sent = false;
        let mut hops = 0;
        let (mut target, mut root_absent) =
            self.first_target(cell).await.map_err(|e| to_status(&e))?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let result = match &target {
                Target::Local => self
                    .run_local(&request)
                    .await
                    .map_err(|e| (to_status(&e), Delivery::Answered)),
                Target::Remote { peer, .. } => {
                    hops += 1;
                    let verified = request.ingress_verified();
                    let flags = ForwardFlags {
                        ingress_verified: verified,
                        root_absent,
                    };
                    self.forward(peer, request.wire(), flags, hops, deadline_unix_ms)
                        .await
                        .map(Answer::Wire)
                        .map_err(|status| classify_transport(status, peer))
                }
            };
            let (status, delivery) = match result {
                Ok(answer) => {
                    self.learn(cell, &target, &answer);
                    return Ok(answer);
                }
                Err(failed) => failed,
            };
            let code = code_of(&status);
            let judged = judge_attempt(
                command,
                matches!(target, Target::Remote { .. }),
                delivery,
                code,
            );
            maybe_sent |= judged.maybe_sent;
            if !judged.reroute || attempt >= 2 || hops >= HOPS_MAX {
                return Err(self.final_status(status, maybe_sent, command));
            }
            // Forget what this target taught us and refresh once.
            let tried = match &target {
                Target::Local => self.me().clone(),
                Target::Remote { node, .. } => node.clone(),
            };
            self.hints.invalidate(cell, &tried);
            if code != Some(v1::ErrorCode::NotOwner) {
                excluded.push(tried.clone());
            }
            if let Some(detail) = detail_from_status(&status) {
                hint = crate::status::owner_hint(&detail).or(hint);
            }
            let hinted = hint
                .as_ref()
                .and_then(|h| h.node_id.as_deref())
                .and_then(|n| NodeId::new(n).ok())
                .filter(|n| *n != tried && !excluded.contains(n));
            (target, root_absent) = match hinted {
                Some(node) => self.target_for(&node, true).await.map(|t| (t, false)),
                None => self.locate(cell, true, &excluded).await,
            }
            .map_err(|e| self.final_status(to_status(&e), maybe_sent, command))?;
            if target == Target::Local && tried == *self.me() {
                return Err(self.final_status(status, maybe_sent, command));
            }
        }
    }

    fn final_status(
        &self,
        status: tonic::Status,
        maybe_sent: bool,
        command: bool,
    ) -> tonic::Status {
        let code = code_of(&status);
        if maybe_sent && command && code != Some(v1::ErrorCode::UnknownOutcome) {
            let provable = matches!(
                code,
                Some(v1::ErrorCode::ResourceExhausted | v1::ErrorCode::NotCommitted)
            ) || code.is_some_and(|c| (c as i32) < v1::ErrorCode::NotOwner as i32);
            if !provable {
                return to_status(&Error::UnknownOutcome(format!(
                    "an earlier forward of this command may have reached its owner ({}); \
                     retry with the same command id or resolve it",
                    status.message()
                )));
            }
        }
        status
    }

    fn learn(&self, cell: &CellId, target: &Target, answer: &Answer) {
        let epoch = match answer {
            Answer::Wire(response) => match response {
                v1::forward_response::Response::Execute(r) => r.receipt.as_ref().map(|r| r.epoch),
                v1::forward_response::Response::Resolve(r) => r.receipt.as_ref().map(|r| r.epoch),
                v1::forward_response::Response::Query(r) => r.receipt.as_ref().map(|r| r.epoch),
                v1::forward_response::Response::Watch(_) => None,
            },
            Answer::Executed(executed) => {
                crate::local::stored_receipt(executed).map(|r| r.epoch.get())
            }
            Answer::Queried(queried) => Some(queried.receipt.epoch.get()),
        }
        .unwrap_or(0);
        let (node_id, endpoint) = match target {
            Target::Local => (self.me().clone(), None),
            Target::Remote { node, peer } => (node.clone(), Some(peer.clone())),
        };
        self.hints.observe(
            cell.clone(),
            CachedOwner {
                node_id,
                endpoint,
                epoch,
            },
        );
    }
}

/// Classifies a failed forward: a status with a Cellfleet detail is the
/// peer's answer; one without came from the transport: a failed connect
/// was never sent ([`Error::PeerUnavailable`]); anything else — a timeout
/// included — may have been delivered.
fn classify_transport(status: tonic::Status, peer: &str) -> (tonic::Status, Delivery) {
    if detail_from_status(&status).is_some() {
        return (status, Delivery::Answered);
    }
    if crate::transport::connect_failed(&status) {
        let never_sent = to_status(&Error::PeerUnavailable {
            endpoint: peer.to_owned(),
            reason: status.message().to_owned(),
        });
        return (never_sent, Delivery::NeverSent);
    }
    let in_transit = if status.code() == tonic::Code::DeadlineExceeded
        || status.code() == tonic::Code::Cancelled
    {
        // The code a query gets; a command that may have been delivered
        // ends as UNKNOWN_OUTCOME (see `final_status`).
        to_status(&Error::DeadlineExceeded(format!(
            "forward to {peer} timed out: {}",
            status.message()
        )))
    } else {
        status
    };
    (in_transit, Delivery::MaybeDelivered)
}

/// Runs a routed request on `node`: a client request in its `verified`
/// form when this node verified it already, else after verifying its
/// envelope; an unsigned node request after checking its kind is in
/// `node_kinds`. `root_absent`: the forwarding node read the Cell's root
/// just before and found none, so a command's activation here creates it
/// without reading it again ([`NodeHandle::note_root_absent`]).
pub async fn run_local(
    node: &NodeHandle,
    verifier: &Verifier,
    node_kinds: &[String],
    request: &Routed,
    verified: Option<&Verified>,
    root_absent: bool,
) -> Result<v1::forward_response::Response, Error> {
    use v1::forward_response::Response;
    let missing = || Error::Malformed("the request has no envelope".into());
    let note_absent = |kind: &str, key: &[u8]| {
        if root_absent {
            node.note_root_absent(&CellId::for_kind_key(kind, key));
        }
    };
    Ok(match (request, verified) {
        (Routed::Execute(_), Some(Verified::Command(command))) => {
            note_absent(&command.kind, &command.key);
            Response::Execute(crate::local::execute(node, command).await?)
        }
        (Routed::Execute(r), _) => {
            let command = verifier.verify_command(r.envelope.as_ref().ok_or_else(missing)?)?;
            note_absent(&command.kind, &command.key);
            Response::Execute(crate::local::execute(node, &command).await?)
        }
        (Routed::Query(_), Some(Verified::Query(query))) => {
            Response::Query(crate::local::query(node, query).await?)
        }
        (Routed::Query(r), _) => {
            let query = verifier.verify_query(r.envelope.as_ref().ok_or_else(missing)?)?;
            Response::Query(crate::local::query(node, &query).await?)
        }
        (Routed::Resolve(_), Some(Verified::Resolve(resolve))) => {
            Response::Resolve(crate::local::resolve(node, resolve).await?)
        }
        (Routed::Resolve(r), _) => {
            let resolve = verifier.verify_resolve(r.envelope.as_ref().ok_or_else(missing)?)?;
            Response::Resolve(crate::local::resolve(node, &resolve).await?)
        }
        (Routed::NodeCommand(r), _) => {
            allow_node_kind(node_kinds, &r.kind)?;
            note_absent(&r.kind, &r.key);
            Response::Execute(crate::local::node_command(node, r).await?)
        }
        (Routed::NodeQuery(r), _) => {
            allow_node_kind(node_kinds, &r.kind)?;
            Response::Query(crate::local::node_query(node, r).await?)
        }
        (Routed::NodeWatch(r), _) => {
            allow_node_kind(node_kinds, &r.kind)?;
            Response::Watch(crate::local::node_watch(node, r).await?)
        }
    })
}

/// An unsigned node request may only use the node-request kinds.
fn allow_node_kind(node_kinds: &[String], kind: &str) -> Result<(), Error> {
    if node_kinds.iter().any(|k| k == kind) {
        return Ok(());
    }
    Err(Error::Unauthorized {
        key_id: "(unsigned node request)".into(),
        what: format!("use kind {kind:?} (node requests may use {node_kinds:?})"),
    })
}

fn authority(error: cellfleet_authority::Error) -> Error {
    Error::Internal {
        retryable: error.is_retryable(),
        message: format!("authority: {error}"),
    }
}

/// The client's deadline from the `grpc-timeout` header, as Unix ms.
pub fn deadline_from_metadata(metadata: &tonic::metadata::MetadataMap, now_ms: i64) -> Option<i64> {
    let value = metadata.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    let amount: u64 = digits.parse().ok()?;
    let millis = match unit {
        "H" => amount.checked_mul(3_600_000)?,
        "M" => amount.checked_mul(60_000)?,
        "S" => amount.checked_mul(1_000)?,
        "m" => amount,
        "u" => amount / 1_000,
        "n" => amount / 1_000_000,
        _ => return None,
    };
    Some(now_ms.saturating_add(i64::try_from(millis).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn json_objects() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::Bool),
            any::<i64>().prop_map(serde_json::Value::from),
            any::<f64>().prop_map(serde_json::Value::from),
            "[a-z\"\\\\é+/=]{0,12}".prop_map(serde_json::Value::String),
        ];
        let value = leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
                proptest::collection::btree_map("[a-z_]{1,6}", inner, 0..4)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        });
        proptest::collection::btree_map("[a-z_]{1,8}", value, 0..5)
            .prop_map(|m| serde_json::Value::Object(m.into_iter().collect()))
    }

    proptest! {
        /// A node request kept in memory is forwarded as the wire form a
        /// peer reads back to the same command (same digest, so the same
        /// ledger entry) or the same query.
        #[test]
        fn a_node_request_kept_in_memory_forwards_as_itself(
            id in any::<[u8; 16]>(),
            name in "[a-z_]{1,12}",
            args in json_objects(),
            expires_at_ms in any::<i64>(),
            kind in "[a-z_]{1,10}",
            key in proptest::collection::vec(any::<u8>(), 0..24),
        ) {
            let command = Command::new(id, name.clone(), args.clone(), expires_at_ms);
            let mut request = Request::NodeCommand { kind: &kind, key: &key, command: &command, wire: None };
            prop_assert!(request.is_command());
            let Routed::NodeCommand(wire) = request.wire().clone() else {
                return Err(TestCaseError::fail("not a node command"));
            };
            prop_assert_eq!(&wire.kind, &kind);
            prop_assert_eq!(&wire.key, &key);
            let read = crate::local::node_command_of(&wire).expect("a peer reads it");
            prop_assert_eq!(read.digest(&kind), command.digest(&kind));
            prop_assert_eq!(read, command);

            let mut request = Request::NodeQuery { kind: &kind, key: &key, name: &name, args: &args, wire: None };
            prop_assert!(!request.is_command());
            let Routed::NodeQuery(wire) = request.wire().clone() else {
                return Err(TestCaseError::fail("not a node query"));
            };
            prop_assert_eq!(&wire.kind, &kind);
            prop_assert_eq!(&wire.key, &key);
            prop_assert_eq!(&wire.query, &name);
            prop_assert_eq!(crate::local::node_args(&wire.args_json).expect("an object"), args);
        }
    }

    #[test]
    fn grpc_timeouts_become_deadlines() {
        let mut metadata = tonic::metadata::MetadataMap::new();
        assert_eq!(deadline_from_metadata(&metadata, 1_000), None);
        metadata.insert("grpc-timeout", "1500m".parse().expect("ascii"));
        assert_eq!(deadline_from_metadata(&metadata, 1_000), Some(2_500));
        metadata.insert("grpc-timeout", "2S".parse().expect("ascii"));
        assert_eq!(deadline_from_metadata(&metadata, 0), Some(2_000));
        metadata.insert("grpc-timeout", "x".parse().expect("ascii"));
        assert_eq!(deadline_from_metadata(&metadata, 0), None);
    }

    #[test]
    fn transport_failures_are_classified() {
        // The connector's own failure, typed in the source chain: never sent.
        let connect = std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            crate::transport::ConnectFailed {
                address: "127.0.0.1:1".parse().expect("address"),
                source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
            },
        );
        let (refused, delivery) =
            classify_transport(tonic::Status::from_error(Box::new(connect)), "p:1");
        assert_eq!(delivery, Delivery::NeverSent);
        assert_eq!(code_of(&refused), Some(v1::ErrorCode::PeerUnavailable));
        // A connection that broke after the request was written may have
        // delivered it, whatever its text says.
        let (reset, delivery) = classify_transport(
            tonic::Status::unavailable("no connection to 127.0.0.1:1: connection reset"),
            "p:1",
        );
        assert_eq!(
            (code_of(&reset), delivery),
            (None, Delivery::MaybeDelivered)
        );
        // A hop that timed out may have been delivered too.
        let (timed_out, delivery) =
            classify_transport(tonic::Status::cancelled("Timeout expired"), "p:1");
        assert_eq!(delivery, Delivery::MaybeDelivered);
        assert_eq!(code_of(&timed_out), Some(v1::ErrorCode::DeadlineExceeded));
        // A peer's own answer is the peer's.
        let answered = to_status(&Error::NotCommitted("x".into()));
        assert_eq!(classify_transport(answered, "p:1").1, Delivery::Answered);
    }

    fn delivery_strategy() -> impl Strategy<Value = Delivery> {
        prop_oneof![
            Just(Delivery::Answered),
            Just(Delivery::NeverSent),
            Just(Delivery::MaybeDelivered),
        ]
    }

    proptest! {
        /// A command is "maybe sent" exactly when a remote attempt may have
        /// delivered it (in transit, or the peer itself said UNKNOWN); a
        /// connect failure never is, so only then may the ingress say a
        /// command did not run. Every remote attempt that did not get an
        /// answer is retried after a refresh.
        #[test]
        fn an_attempt_is_maybe_sent_only_if_it_may_have_reached_the_peer(
            command in any::<bool>(),
            remote in any::<bool>(),
            delivery in delivery_strategy(),
            code in proptest::option::of(0i32..24),
        ) {
            let code = code.and_then(|c| v1::ErrorCode::try_from(c).ok());
            let judged = judge_attempt(command, remote, delivery, code);
            let may_have_reached = remote
                && (delivery == Delivery::MaybeDelivered
                    || (delivery == Delivery::Answered && code == Some(v1::ErrorCode::UnknownOutcome)));
            prop_assert_eq!(judged.maybe_sent, command && may_have_reached);
            if remote && delivery != Delivery::Answered {
                prop_assert!(judged.reroute);
            }
            if delivery == Delivery::NeverSent {
                prop_assert!(!judged.maybe_sent);
            }
        }

        /// A hop never outlasts the client's deadline nor the hop bound, and
        /// a first hop leaves at least half for the retry.
        #[test]
        fn a_hop_leaves_the_retry_time(remaining_ms in 0u64..120_000, hop in 1u32..=HOPS_MAX) {
            let remaining = Duration::from_millis(remaining_ms);
            let timeout = hop_timeout(remaining, hop);
            prop_assert!(timeout <= remaining);
            prop_assert!(timeout <= FORWARD_HOP_TIMEOUT_MAX);
            if hop < HOPS_MAX {
                prop_assert!(timeout <= remaining / 2);
            }
        }
    }
}
