//! Channels to nodes for tonic: TLS over TCP through a connector whose own failures are typed ([`ConnectFailed`]), so a caller can tell "never sent" from "may have been delivered".
//!
//! tonic's own TLS settings cannot express the role rule (the server must
//! hold a node certificate, see [`crate::tls`]), so channels dial through a
//! connector that does the TLS handshake with rustls.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tonic::transport::{Channel, Endpoint};

/// `host:port` of a URL or address (scheme, path and query removed).
///
/// ```
/// use cellfleet_client::transport::host_port;
/// assert_eq!(host_port("https://n1.cluster:7001/x?y"), "n1.cluster:7001");
/// assert_eq!(host_port("127.0.0.1:7001"), "127.0.0.1:7001");
/// ```
pub fn host_port(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    &rest[..end]
}

/// HTTP/2 PING interval on every channel, idle or not: a peer that stopped
/// answering (paused, cut off) is noticed within this plus
/// [`KEEP_ALIVE_TIMEOUT`], and the connection's requests fail instead of
/// waiting for their whole deadline.
pub const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(1);
/// How long a PING may go unanswered before the connection is closed.
pub const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(1);

/// The channel connector's own failure (TCP connect, TLS handshake, or
/// either not done within the connect timeout): the request was never
/// written, so it never reached the peer. Carried, typed, in the source
/// chain of the request's status; see [`connect_failed`].
#[derive(Debug, thiserror::Error)]
#[error("no connection to {address}: {source}")]
pub struct ConnectFailed {
    /// Where the connector dialled.
    pub address: SocketAddr,
    /// Why it failed.
    #[source]
    pub source: std::io::Error,
}

/// Whether `status` says the request failed to connect, hence was never
/// sent: its source chain holds the connector's [`ConnectFailed`]. A
/// connection that breaks later ("connection reset", "broken pipe", a
/// keep-alive timeout) is not this: the request may have been delivered.
pub fn connect_failed(status: &tonic::Status) -> bool {
    let mut next: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(error) = next {
        if error.is::<ConnectFailed>() {
            return true;
        }
        // An io::Error's source() skips its own payload: look inside.
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            if io
                .get_ref()
                .is_some_and(|inner| inner.is::<ConnectFailed>())
            {
                return true;
            }
        }
        next = error.source();
    }
    false
}

/// The channel settings every connection shares: no Nagle delay, and
/// keep-alive pings even while idle (see [`KEEP_ALIVE_INTERVAL`]). The
/// scheme is http because TLS is done by the connector, not by tonic.
fn endpoint_for(uri: String) -> Result<Endpoint, tonic::transport::Error> {
    Ok(Endpoint::from_shared(uri)?
        .tcp_nodelay(true)
        .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
        .keep_alive_while_idle(true))
}

/// A `host:port` endpoint: an IP address (`[..]` for IPv6) or a DNS name.
///
/// ```
/// use cellfleet_client::transport::HostPort;
/// let node: HostPort = "https://[::1]:7001".parse().unwrap();
/// assert_eq!((node.host.as_str(), node.port), ("::1", 7001));
/// assert!("no-port".parse::<HostPort>().is_err());
/// assert!("bad host!:7001".parse::<HostPort>().is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPort {
    /// The host: an IP literal (without brackets) or a DNS name.
    pub host: String,
    /// The port.
    pub port: u16,
}

impl std::str::FromStr for HostPort {
    type Err = String;

    /// Parses `host:port`, `[ipv6]:port`, or a URL's `host:port` part.
    fn from_str(text: &str) -> Result<Self, String> {
        let text = host_port(text);
        let bad = || format!("{text:?} is not host:port (a DNS name or IP address, and a port)");
        let (host, port) = match text.strip_prefix('[') {
            Some(rest) => {
                let (host, port) = rest.split_once("]:").ok_or_else(bad)?;
                host.parse::<std::net::Ipv6Addr>().map_err(|_| bad())?;
                (host, port)
            }
            None => text.rsplit_once(':').ok_or_else(bad)?,
        };
        let name_ok = !host.is_empty()
            && host.len() <= 253
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':'));
        if !name_ok {
            return Err(bad());
        }
        Ok(HostPort {
            host: host.to_owned(),
            port: port.parse().map_err(|_| bad())?,
        })
    }
}

/// A lazily connecting channel to `endpoint` (`host:port`, a DNS name or
/// an IP address) over TLS with `config`, checking the server's certificate
/// for that host. A name is resolved at each connect, so a peer that moves
/// to a new address (a restarted pod) is found again.
///
/// ```no_run
/// # fn run(tls: std::sync::Arc<rustls::ClientConfig>) -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use cellfleet_client::transport::{channel_to, HostPort};
/// use cellfleet_proto::v1::client_client::ClientClient;
///
/// let channel = channel_to(&"127.0.0.1:7001".parse::<HostPort>()?, tls, Duration::from_secs(2))?;
/// let stub = ClientClient::new(channel); // the generated stub; Client wraps it
/// # let _ = stub; Ok(()) }
/// ```
pub fn channel_to(
    endpoint: &HostPort,
    config: Arc<ClientConfig>,
    connect_timeout: Duration,
) -> Result<Channel, tonic::transport::Error> {
    if let Ok(ip) = endpoint.host.parse::<std::net::IpAddr>() {
        return channel(
            SocketAddr::new(ip, endpoint.port),
            &endpoint.host,
            config,
            connect_timeout,
        );
    }
    let server_name = ServerName::try_from(endpoint.host.clone()).unwrap_or_else(|_| {
        ServerName::try_from("invalid.invalid".to_owned()).expect("a valid name")
    });
    let connector = TlsConnector::from(config);
    let (host, port) = (endpoint.host.clone(), endpoint.port);
    let endpoint = endpoint_for(format!("http://{host}:{port}"))?;
    Ok(
        endpoint.connect_with_connector_lazy(tower::service_fn(move |_uri| {
            let connector = connector.clone();
            let server_name = server_name.clone();
            let host = host.clone();
            async move {
                let connect = async {
                    // Resolves the name and tries each address in turn.
                    let tcp = TcpStream::connect((host.as_str(), port)).await?;
                    tcp.set_nodelay(true)?;
                    let address = tcp.peer_addr()?;
                    let tls = connector.connect(server_name, tcp).await;
                    Ok::<_, std::io::Error>((address, tls))
                };
                let unresolved: SocketAddr = ([0, 0, 0, 0], port).into();
                let failed = |address: SocketAddr, source: std::io::Error| {
                    std::io::Error::new(source.kind(), ConnectFailed { address, source })
                };
                match tokio::time::timeout(connect_timeout, connect).await {
                    Ok(Ok((address, tls))) => {
                        Ok(TokioIo::new(tls.map_err(|e| failed(address, e))?))
                    }
                    Ok(Err(error)) => Err(failed(
                        unresolved,
                        std::io::Error::new(error.kind(), format!("{host}:{port}: {error}")),
                    )),
                    Err(_) => Err(failed(
                        unresolved,
                        std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            format!("{host}:{port}: not connected within {connect_timeout:?}"),
                        ),
                    )),
                }
            }
        })),
    )
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
    let endpoint = endpoint_for(format!("http://{address}"))?;
    Ok(
        endpoint.connect_with_connector_lazy(tower::service_fn(move |_uri| {
            let connector = connector.clone();
            let server_name = server_name.clone();
            async move {
                let failed = |source: std::io::Error| {
                    std::io::Error::new(source.kind(), ConnectFailed { address, source })
                };
                // The timeout is the connector's own (not the endpoint's),
                // so a peer that accepts TCP but never finishes the TLS
                // handshake (a paused process) is known never to have
                // received the request.
                let connect = async {
                    let tcp = TcpStream::connect(address).await?;
                    tcp.set_nodelay(true)?;
                    connector.connect(server_name, tcp).await
                };
                let tls = match tokio::time::timeout(connect_timeout, connect).await {
                    Ok(connected) => connected.map_err(failed)?,
                    Err(_) => {
                        return Err(failed(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            format!("not connected within {connect_timeout:?}"),
                        )))
                    }
                };
                Ok::<_, std::io::Error>(TokioIo::new(tls))
            }
        })),
    )
}

#[cfg(test)]
mod connect_tests {
    use super::*;

    /// A client configuration that trusts no server (handshakes fail).
    fn untrusting_config() -> Arc<ClientConfig> {
        Arc::new(
            ClientConfig::builder_with_provider(crate::tls::provider())
                .with_safe_default_protocol_versions()
                .expect("protocol versions")
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth(),
        )
    }

    #[test]
    fn endpoints_are_names_or_addresses_with_a_port() {
        let parse = |text: &str| text.parse::<HostPort>();
        let ok = |host: &str, port| {
            Ok(HostPort {
                host: host.into(),
                port,
            })
        };
        assert_eq!(parse("localhost:7001"), ok("localhost", 7001));
        assert_eq!(
            parse("https://node-1.cellfleet.svc:7101/x"),
            ok("node-1.cellfleet.svc", 7101)
        );
        assert_eq!(parse("127.0.0.1:80"), ok("127.0.0.1", 80));
        assert_eq!(parse("[::1]:8101"), ok("::1", 8101));
        for bad in [
            "localhost",
            "localhost:",
            ":80",
            "host:99999",
            "[::1]80",
            "bad host:1",
            "[nope]:1",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    /// A DNS name resolves at connect time; its failure is a connect
    /// failure (never sent).
    #[tokio::test]
    async fn a_name_that_does_not_resolve_is_a_connect_failure() {
        let config = untrusting_config();
        let target: HostPort = "no-such-host.invalid:7001".parse().unwrap();
        let channel = channel_to(&target, config, Duration::from_secs(2)).unwrap();
        let status = cellfleet_proto::v1::peer_client::PeerClient::new(channel)
            .forward(cellfleet_proto::v1::ForwardRequest::default())
            .await
            .expect_err("nothing answers there");
        assert!(connect_failed(&status), "{status:?}");
    }

    /// The status of a request to a port nobody listens on names the
    /// connect failure, so the router can tell it was never sent.
    #[tokio::test]
    async fn a_refused_connection_is_told_apart() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let address = listener.local_addr().expect("address");
        drop(listener);
        let config = untrusting_config();
        let channel =
            channel(address, "127.0.0.1", config, Duration::from_secs(2)).expect("channel");
        let status = cellfleet_proto::v1::peer_client::PeerClient::new(channel)
            .forward(cellfleet_proto::v1::ForwardRequest::default())
            .await
            .expect_err("nothing listens there");
        assert!(connect_failed(&status), "{status:?}");
        // Only the type counts, not the text.
        let reset = tonic::Status::unavailable(format!(
            "no connection to {address}: error reading a body from connection: connection reset"
        ));
        assert!(!connect_failed(&reset));
    }

    /// A peer that accepts TCP but never answers the TLS handshake (a
    /// paused process: the kernel still accepts) is a connect failure too,
    /// within the connect timeout.
    #[tokio::test]
    async fn a_handshake_that_never_completes_is_a_connect_failure() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let address = listener.local_addr().expect("address");
        let config = untrusting_config();
        let channel =
            channel(address, "127.0.0.1", config, Duration::from_millis(300)).expect("channel");
        let status = cellfleet_proto::v1::peer_client::PeerClient::new(channel)
            .forward(cellfleet_proto::v1::ForwardRequest::default())
            .await
            .expect_err("the listener never answers");
        assert!(connect_failed(&status), "{status:?}");
        drop(listener);
    }
}
