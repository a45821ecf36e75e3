//! TLS over TCP for tonic: a bounded accept-and-handshake stream for servers and a connector for channels.
//!
//! tonic's own TLS settings cannot express the role rule, so the server
//! side feeds `Server::serve_with_incoming` with streams rustls already
//! verified, and the client side dials through [`connect`]. Handshakes run
//! in their own tasks (a slow client cannot stall accepting), at most
//! [`PENDING_HANDSHAKES_MAX`] at once, each bounded by [`HANDSHAKE_TIMEOUT`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ServerConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_rustls::server::TlsStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};

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

/// Starts the message of every error the channel's connector returns: a
/// status carrying it failed before the request was written (TCP connect
/// or TLS handshake), so the request never reached the peer.
pub const CONNECT_FAILED: &str = "cellfleet: no connection to";

/// Whether `status` says the request failed to connect, hence was never
/// sent. A connection that breaks later ("connection reset", "broken
/// pipe") is not this: the request may have been delivered.
pub fn connect_failed(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::Unavailable && status.message().contains(CONNECT_FAILED)
}

/// A lazily connecting channel to `address` over TLS with `config`,
/// checking the server's certificate for `server_name` (a DNS name or IP
/// address in its SAN).
pub fn channel(
    address: SocketAddr,
    server_name: &str,
    config: Arc<ClientConfig>,
    connect_timeout: Duration,
) -> Result<Channel, tonic::transport::Error> {
    let server_name = ServerName::try_from(server_name.to_owned())
        .unwrap_or_else(|_| ServerName::IpAddress(address.ip().into()));
    let connector = TlsConnector::from(config);
    // The scheme is http because TLS is done by the connector below, not
    // by tonic (which refuses https without its own TLS settings).
    let endpoint = Endpoint::from_shared(format!("http://{address}"))?
        .connect_timeout(connect_timeout)
        .tcp_nodelay(true);
    Ok(
        endpoint.connect_with_connector_lazy(tower::service_fn(move |_uri| {
            let connector = connector.clone();
            let server_name = server_name.clone();
            async move {
                let failed = |e: std::io::Error| {
                    std::io::Error::new(e.kind(), format!("{CONNECT_FAILED} {address}: {e}"))
                };
                let tcp = TcpStream::connect(address).await.map_err(failed)?;
                tcp.set_nodelay(true).map_err(failed)?;
                let tls = connector.connect(server_name, tcp).await.map_err(failed)?;
                Ok::<_, std::io::Error>(TokioIo::new(tls))
            }
        })),
    )
}

#[cfg(test)]
mod connect_tests {
    use super::*;

    /// The status of a request to a port nobody listens on names the
    /// connect failure, so the router can tell it was never sent.
    #[tokio::test]
    async fn a_refused_connection_is_told_apart() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let address = listener.local_addr().expect("address");
        drop(listener);
        let config = ClientConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        let channel = channel(
            address,
            "127.0.0.1",
            Arc::new(config),
            Duration::from_secs(2),
        )
        .expect("channel");
        let status = cellfleet_proto::v1::peer_client::PeerClient::new(channel)
            .forward(cellfleet_proto::v1::ForwardRequest::default())
            .await
            .expect_err("nothing listens there");
        assert!(connect_failed(&status), "{status:?}");
        let reset =
            tonic::Status::unavailable("error reading a body from connection: connection reset");
        assert!(!connect_failed(&reset));
    }
}
