//! [`NodeServer`]: one node's listeners — client and admin services (plus reflection) on one mTLS listener, the peer service on another that admits node certificates only, the HTTP listener, and the web console if configured.

use std::net::SocketAddr;
use std::sync::Arc;

use cellfleet_authority::Layout;
use cellfleet_proto::v1::admin_server::AdminServer;
use cellfleet_proto::v1::client_server::ClientServer;
use cellfleet_proto::v1::peer_server::PeerServer;
use cellfleet_store::ObjectStore;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::Server;

use crate::certs::CertError;
use crate::console::Console;
use crate::forward::Router;
use crate::service_admin::{AdminService, DrainState};
use crate::service_client::ClientService;
use crate::service_peer::PeerService;
use crate::tls::{self, Listener, TlsIdentity};

/// Bound listeners of a node.
#[derive(Debug)]
pub struct Listeners {
    /// Client and admin services (client or node certificates).
    pub client: TcpListener,
    /// Peer service (node certificates only).
    pub peer: TcpListener,
    /// `/metrics`, `/healthz`, `/readyz` (plain HTTP).
    pub http: TcpListener,
    /// The web console, if configured.
    pub console: Option<ConsoleListener>,
}

/// The console's listener and how it is secured.
#[derive(Debug)]
pub struct ConsoleListener {
    /// Where it listens.
    pub listener: TcpListener,
    /// HTTPS with the node's certificate, client certificates from the
    /// cluster CA required (`true`), or plain HTTP (`false`, development).
    pub mtls: bool,
}

/// Why the servers could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// TLS material.
    #[error(transparent)]
    Tls(#[from] CertError),
    /// Reflection descriptors.
    #[error("reflection: {0}")]
    Reflection(String),
    /// A listener's address.
    #[error("listener: {0}")]
    Io(#[from] std::io::Error),
}

/// A node's running servers.
#[derive(Debug)]
pub struct NodeServer {
    /// The client listener's address.
    pub client_addr: SocketAddr,
    /// The peer listener's address.
    pub peer_addr: SocketAddr,
    /// The HTTP listener's address.
    pub http_addr: SocketAddr,
    /// The console listener's address, if any.
    pub console_addr: Option<SocketAddr>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl NodeServer {
    /// Starts serving on `listeners` with the node's TLS `identity`.
    pub fn start(
        listeners: Listeners,
        identity: &TlsIdentity,
        router: Arc<Router>,
        store: Arc<dyn ObjectStore>,
        layout: Layout,
        drain: Arc<DrainState>,
    ) -> Result<Self, ServerError> {
        let client_addr = listeners.client.local_addr()?;
        let peer_addr = listeners.peer.local_addr()?;
        let http_addr = listeners.http.local_addr()?;
        let console_addr = match &listeners.console {
            Some(console) => Some(console.listener.local_addr()?),
            None => None,
        };
        let client_tls = tls::server_config(identity, Listener::Client)?;
        let peer_tls = tls::server_config(identity, Listener::Peer)?;
        let reflection = crate::reflection::reflection_service()
            .map_err(|e| ServerError::Reflection(e.to_string()))?;
        let (shutdown, stop) = watch::channel(false);
        let stopped = |mut stop: watch::Receiver<bool>| async move {
            let _ = stop.wait_for(|stop| *stop).await;
        };
        let admin = AdminService::new(router.clone(), store, layout, drain.clone());
        let console = match listeners.console {
            Some(console) => {
                let tls = if console.mtls {
                    Some(tls::console_server_config(identity)?)
                } else {
                    None
                };
                let served = Console::new(admin.clone(), router.clone());
                Some(served.serve(console.listener, tls, stop.clone()))
            }
            None => None,
        };
        let client = Server::builder()
            .add_service(ClientServer::new(ClientService::new(router.clone())))
            .add_service(AdminServer::new(admin))
            .add_service(reflection)
            .serve_with_incoming_shutdown(
                crate::transport::tls_incoming(listeners.client, client_tls),
                stopped(stop.clone()),
            );
        let peer = Server::builder()
            .add_service(PeerServer::new(PeerService::new(router.clone())))
            .serve_with_incoming_shutdown(
                crate::transport::tls_incoming(listeners.peer, peer_tls),
                stopped(stop.clone()),
            );
        let mut tasks = vec![
            tokio::spawn(async move {
                if let Err(error) = client.await {
                    tracing::error!(%error, "client listener stopped");
                }
            }),
            tokio::spawn(async move {
                if let Err(error) = peer.await {
                    tracing::error!(%error, "peer listener stopped");
                }
            }),
            tokio::spawn(crate::http::serve(
                listeners.http,
                router.node().clone(),
                drain,
                stop,
            )),
        ];
        if let Some(console) = console {
            tasks.push(tokio::spawn(console));
        }
        Ok(NodeServer {
            client_addr,
            peer_addr,
            http_addr,
            console_addr,
            shutdown,
            tasks,
        })
    }

    /// Stops accepting, lets in-flight calls finish, and waits for the
    /// listeners to close.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}
