//! How a node's client and peer gRPC endpoints travel in its lease record (whose one `grpc` field holds both).
//!
//! The authority's lease record has a single `grpc` string. A node writes
//! its client endpoint there as a URL and appends its peer endpoint as a
//! query parameter: `https://127.0.0.1:7001?peer=127.0.0.1:7101`. A record
//! without `?peer=` (written by an embedder that serves peers on the client
//! port) means both are the same address. Owner hints sent to clients carry
//! only the client URL.

/// Both gRPC endpoints of a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeEndpoints {
    /// The client listener, `https://host:port`.
    pub client: String,
    /// The peer listener, `host:port`.
    pub peer: String,
}

impl NodeEndpoints {
    /// Endpoints from `host:port` addresses.
    pub fn new(client: &str, peer: &str) -> Self {
        NodeEndpoints {
            client: format!("https://{}", host_port(client)),
            peer: host_port(peer).to_owned(),
        }
    }

    /// The lease record's `grpc` string.
    pub fn encode(&self) -> String {
        format!("{}?peer={}", self.client, self.peer)
    }

    /// Reads a lease record's `grpc` string (never fails: a bare URL means
    /// the peer listens at the client address).
    pub fn parse(grpc: &str) -> Self {
        match grpc.split_once("?peer=") {
            Some((client, peer)) => NodeEndpoints {
                client: client.to_owned(),
                peer: host_port(peer).to_owned(),
            },
            None => NodeEndpoints {
                client: grpc.to_owned(),
                peer: host_port(grpc).to_owned(),
            },
        }
    }
}

/// `host:port` of a URL or address (scheme, path and query removed).
pub fn host_port(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    &rest[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_round_trip_through_the_lease_string() {
        let endpoints = NodeEndpoints::new("127.0.0.1:7001", "127.0.0.1:7101");
        assert_eq!(endpoints.client, "https://127.0.0.1:7001");
        let encoded = endpoints.encode();
        assert_eq!(encoded, "https://127.0.0.1:7001?peer=127.0.0.1:7101");
        assert_eq!(NodeEndpoints::parse(&encoded), endpoints);
        let bare = NodeEndpoints::parse("https://h:1");
        assert_eq!(bare.peer, "h:1");
        assert_eq!(host_port("https://h:1/x?y"), "h:1");
        assert_eq!(host_port("h:2"), "h:2");
    }
}
