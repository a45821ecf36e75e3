//! TLS over TCP for tonic: a bounded accept-and-handshake stream for servers; channels (the client side) are `cellfleet_client::transport`'s, re-exported here.
//!
//! tonic's own TLS settings cannot express the role rule, so the server
//! side feeds `Server::serve_with_incoming` with streams rustls already
//! verified, and the client side dials through [`channel`]. Handshakes run
//! in their own tasks (a slow client cannot stall accepting), at most
//! [`PENDING_HANDSHAKES_MAX`] at once, each bounded by [`HANDSHAKE_TIMEOUT`].

use std::sync::Arc;
use std::time::Duration;

use rustls::ServerConfig;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;

/// Longest a TLS handshake may take before the connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once; further connections wait to be accepted.
pub const PENDING_HANDSHAKES_MAX: usize = 256;

/// Accepts TCP connections on `listener` and yields those whose TLS
/// handshake (and so the certificate and role checks) succeeded. Refused
/// handshakes are logged and dropped. The accept loop stops when the
/// returned stream is dropped.
pub fn tls_incoming(
    listener: TcpListener,
    config: Arc<ServerConfig>,
) -> ReceiverStream<std::io::Result<TlsStream<TcpStream>>> {
    let (sender, receiver) = mpsc::channel(PENDING_HANDSHAKES_MAX);
    let acceptor = TlsAcceptor::from(config);
    let permits = Arc::new(Semaphore::new(PENDING_HANDSHAKES_MAX));
    tokio::spawn(async move {
        loop {
            let Ok(permit) = permits.clone().acquire_owned().await else {
                return;
            };
            let accepted = tokio::select! {
                _ = sender.closed() => return,
                accepted = listener.accept() => accepted,
            };
            let (tcp, remote) = match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            let sender = sender.clone();
            tokio::spawn(async move {
                let _permit = permit;
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let _ = sender.send(Ok(stream)).await;
                    }
                    Ok(Err(error)) => tracing::info!(%remote, %error, "tls handshake refused"),
                    Err(_) => tracing::info!(%remote, "tls handshake timed out"),
                }
            });
        }
    });
    ReceiverStream::new(receiver)
}

pub use cellfleet_client::transport::{
    channel, channel_to, connect_failed, ConnectFailed, HostPort, KEEP_ALIVE_INTERVAL,
    KEEP_ALIVE_TIMEOUT,
};
