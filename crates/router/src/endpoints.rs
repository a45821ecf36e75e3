//! A node's endpoints as its lease record carries them: client and peer gRPC URLs from listener addresses, and `host:port` of a URL.
//!
//! The lease record ([`Endpoints`]) has one field per listener: `grpc` (the
//! client listener, what owner hints name), `peer` (the peer service other
//! nodes forward to) and `http`. An embedder that serves peers on its client
//! listener leaves `peer` empty ([`Endpoints::peer_or_grpc`]).

use cellfleet_authority::Endpoints;

/// The lease endpoints of a node whose listeners are at these `host:port`
/// addresses.
pub fn lease_endpoints(client: &str, peer: &str, http: &str) -> Endpoints {
    Endpoints {
        grpc: format!("https://{}", host_port(client)),
        peer: format!("https://{}", host_port(peer)),
        http: format!("http://{}", host_port(http)),
    }
}

pub use cellfleet_client::transport::host_port;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_listener_has_its_own_url() {
        let endpoints = lease_endpoints("127.0.0.1:7001", "127.0.0.1:7101", "127.0.0.1:7201");
        assert_eq!(endpoints.grpc, "https://127.0.0.1:7001");
        assert_eq!(endpoints.peer, "https://127.0.0.1:7101");
        assert_eq!(endpoints.http, "http://127.0.0.1:7201");
        assert_eq!(host_port(endpoints.peer_or_grpc()), "127.0.0.1:7101");
        assert_eq!(host_port("https://h:1/x?y"), "h:1");
        assert_eq!(host_port("h:2"), "h:2");
    }
}
