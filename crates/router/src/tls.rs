//! rustls configurations for mutual TLS: every listener requires a cluster-CA certificate, and a peer listener only a node's.
//!
//! Chain validation is webpki's (via rustls's verifiers, `ring` provider,
//! chosen explicitly because both `ring` and `aws-lc-rs` are in the build);
//! on top of it a role check reads the SAN URI of the end-entity
//! certificate (see [`crate::certs`]) *during the handshake*, so a client
//! certificate never completes a handshake with a peer listener, and a
//! client never talks to a server that is not a node.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Mutex};

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, DistinguishedName, RootCertStore,
    ServerConfig, SignatureScheme,
};

use crate::certs::{CertError, Role, CA_CERT_FILE};
use crate::error::Error;

pub use cellfleet_client::tls::{provider, ALPN_H2};

/// A node's or client's TLS identity: the cluster CA and its own certificate and key.
pub struct TlsIdentity {
    /// The cluster CA certificates (trust anchors).
    pub ca: Vec<CertificateDer<'static>>,
    /// This identity's certificate chain (end entity first).
    pub chain: Vec<CertificateDer<'static>>,
    /// This identity's private key.
    pub key: PrivateKeyDer<'static>,
}

impl std::fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsIdentity")
            .field("ca", &self.ca.len())
            .field("chain", &self.chain.len())
            .finish_non_exhaustive()
    }
}

impl TlsIdentity {
    /// Parses PEM text.
    pub fn from_pem(ca_pem: &str, cert_pem: &str, key_pem: &str) -> Result<Self, CertError> {
        let certs = |pem: &str, what: &str| {
            let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| CertError::Certificate(format!("{what}: {e}")))?;
            if certs.is_empty() {
                return Err(CertError::Certificate(format!("{what}: no certificate")));
            }
            Ok(certs)
        };
        Ok(TlsIdentity {
            ca: certs(ca_pem, "CA")?,
            chain: certs(cert_pem, "certificate")?,
            key: PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
                .map_err(|e| CertError::Certificate(format!("private key: {e}")))?,
        })
    }

    /// Reads PEM files.
    pub fn load(ca: &Path, cert: &Path, key: &Path) -> Result<Self, CertError> {
        let read = |path: &Path| {
            std::fs::read_to_string(path).map_err(|source| CertError::Io {
                path: path.to_owned(),
                source,
            })
        };
        Self::from_pem(&read(ca)?, &read(cert)?, &read(key)?)
    }

    /// Reads `ca.pem` and `<stem>.pem`/`<stem>.key` for `role` from a
    /// certificate directory written by `cellfleet certs`.
    pub fn load_dir(dir: &Path, role: &Role) -> Result<Self, CertError> {
        let stem = role.file_stem();
        Self::load(
            &dir.join(CA_CERT_FILE),
            &dir.join(format!("{stem}.pem")),
            &dir.join(format!("{stem}.key")),
        )
    }

    /// The role of this identity's own certificate.
    pub fn role(&self) -> Result<Role, CertError> {
        role_of(&self.chain)
    }

    /// Checks that the certificate chains to the cluster CA and is valid
    /// now, as a peer's handshake will verify it (the role is [`Self::role`]'s).
    pub fn check_chain(&self) -> Result<(), CertError> {
        let verifier = WebPkiClientVerifier::builder_with_provider(self.roots()?, provider())
            .build()
            .map_err(|e| CertError::Tls(format!("client verifier: {e}")))?;
        let (end_entity, intermediates) = self
            .chain
            .split_first()
            .ok_or_else(|| CertError::Certificate("no certificate".into()))?;
        verifier
            .verify_client_cert(end_entity, intermediates, UnixTime::now())
            .map(|_| ())
            .map_err(|e| {
                CertError::Tls(format!(
                    "the certificate does not verify against the cluster CA: {e}; \
                     issue it from this CA with `cellfleet certs issue`"
                ))
            })
    }

    fn roots(&self) -> Result<Arc<RootCertStore>, CertError> {
        let mut roots = RootCertStore::empty();
        for ca in &self.ca {
            roots
                .add(ca.clone())
                .map_err(|e| CertError::Tls(format!("CA certificate: {e}")))?;
        }
        Ok(Arc::new(roots))
    }
}

/// Which certificates a listener admits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listener {
    /// The client listener (client and admin services): node or client certificates.
    Client,
    /// The peer listener (peer service): node certificates only.
    Peer,
}

impl Listener {
    fn admits(self, role: &Role) -> bool {
        match self {
            Listener::Client => true,
            Listener::Peer => matches!(role, Role::Node(_)),
        }
    }
}

/// The role of the end-entity certificate of `chain` (its one
/// `cellfleet://` SAN URI).
pub fn role_of(chain: &[CertificateDer<'_>]) -> Result<Role, CertError> {
    let end_entity = chain
        .first()
        .ok_or_else(|| CertError::Role("no certificate".into()))?;
    role_of_der(end_entity)
}

fn role_of_der(der: &[u8]) -> Result<Role, CertError> {
    let uris = cellfleet_client::tls::san_uris(der).map_err(CertError::Role)?;
    let mut roles = uris.iter().filter_map(|uri| Role::from_uri(uri));
    let role = roles
        .next()
        .ok_or_else(|| CertError::Role("no cellfleet:// role URI".into()))??;
    if roles.next().is_some() {
        return Err(CertError::Role(
            "more than one cellfleet:// role URI".into(),
        ));
    }
    Ok(role)
}

/// The verified role of the caller of a request on a TLS listener.
pub fn request_role<T>(request: &tonic::Request<T>) -> Result<Role, Error> {
    let certs = request
        .peer_certs()
        .ok_or_else(|| Error::NotPeer("no client certificate".into()))?;
    role_of(&certs).map_err(|e| Error::NotPeer(e.to_string()))
}

/// Checks, on a peer-service request, that the caller is a node (defence
/// in depth: the peer listener's handshake already refuses other roles).
pub fn require_node<T>(request: &tonic::Request<T>) -> Result<String, Error> {
    node_only(request_role(request)?)
}

/// Certificates a [`RoleCache`] remembers (a cluster's nodes, with room).
pub const ROLE_CACHE_ENTRIES: usize = 64;

/// The roles of the caller certificates a listener saw last, so a call
/// does not parse its caller's certificate again (every call of a
/// connection carries the same one; parsing costs about 20,000
/// instructions). Keyed by the certificate's exact bytes, so a hit is the
/// same certificate the parse would read; least recently used goes first.
#[derive(Debug, Default)]
pub struct RoleCache {
    recent: Mutex<VecDeque<(CertificateDer<'static>, Role)>>,
}

impl RoleCache {
    /// The verified role of `request`'s caller, as [`request_role`].
    pub fn request_role<T>(&self, request: &tonic::Request<T>) -> Result<Role, Error> {
        let certs = request
            .peer_certs()
            .ok_or_else(|| Error::NotPeer("no client certificate".into()))?;
        let end_entity = certs
            .first()
            .ok_or_else(|| Error::NotPeer("no certificate".into()))?;
        self.role_of_der(end_entity)
            .map_err(|e| Error::NotPeer(e.to_string()))
    }

    /// Checks that `request`'s caller is a node, as [`require_node`].
    pub fn require_node<T>(&self, request: &tonic::Request<T>) -> Result<String, Error> {
        node_only(self.request_role(request)?)
    }

    fn role_of_der(&self, der: &CertificateDer<'_>) -> Result<Role, CertError> {
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = recent
            .iter()
            .position(|(known, _)| known.as_ref() == der.as_ref())
        {
            let hit = recent.remove(at).expect("found just now");
            let role = hit.1.clone();
            recent.push_front(hit);
            return Ok(role);
        }
        drop(recent);
        let role = role_of_der(der)?;
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        recent.push_front((der.clone().into_owned(), role.clone()));
        recent.truncate(ROLE_CACHE_ENTRIES);
        Ok(role)
    }

    /// Certificates remembered now.
    pub fn len(&self) -> usize {
        self.recent.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// True when none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn node_only(role: Role) -> Result<String, Error> {
    match role {
        Role::Node(id) => Ok(id),
        Role::Client(name) => Err(Error::NotPeer(format!("client {name:?} is not a node"))),
    }
}

fn role_failure(error: CertError) -> rustls::Error {
    rustls::Error::InvalidCertificate(CertificateError::Other(rustls::OtherError(Arc::new(error))))
}

/// webpki client verification plus the listener's role rule.
#[derive(Debug)]
struct RoleClientVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    listener: Listener,
}

impl ClientCertVerifier for RoleClientVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        let role = role_of_der(end_entity).map_err(role_failure)?;
        if !self.listener.admits(&role) {
            return Err(role_failure(CertError::Role(format!(
                "{} may not connect to the {:?} listener",
                role.uri(),
                self.listener
            ))));
        }
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// A server configuration for `listener`: the identity's certificate,
/// client certificates required, chained to the cluster CA and admitted by
/// the listener's role rule; ALPN `h2`.
pub fn server_config(
    identity: &TlsIdentity,
    listener: Listener,
) -> Result<Arc<ServerConfig>, CertError> {
    let provider = provider();
    let inner = WebPkiClientVerifier::builder_with_provider(identity.roots()?, provider.clone())
        .build()
        .map_err(|e| CertError::Tls(format!("client verifier: {e}")))?;
    let verifier = Arc::new(RoleClientVerifier { inner, listener });
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| CertError::Tls(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(identity.chain.clone(), identity.key.clone_key())
        .map_err(|e| CertError::Tls(format!("server certificate: {e}")))?;
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(Arc::new(config))
}

/// The web console's server configuration: the client listener's (the
/// identity's certificate, client certificates from the cluster CA
/// required, node or client role) with ALPN `http/1.1`, the console's one
/// protocol.
pub fn console_server_config(identity: &TlsIdentity) -> Result<Arc<ServerConfig>, CertError> {
    let mut config = Arc::unwrap_or_clone(server_config(identity, Listener::Client)?);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A server configuration for a listener that browsers and plain HTTP
/// clients reach (Durable Streams): `chain` and `key` (the node's
/// certificate, or one for a public name), no client certificates (requests
/// carry bearer tokens instead); ALPN `h2` and `http/1.1`.
pub fn public_server_config(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<ServerConfig>, CertError> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| CertError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| CertError::Tls(format!("server certificate: {e}")))?;
    config.alpn_protocols = vec![ALPN_H2.to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Reads a certificate chain (end entity first) and its private key from
/// PEM files, without a CA (a certificate for a public name).
pub fn load_chain(
    cert: &Path,
    key: &Path,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), CertError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| CertError::Io {
            path: path.to_owned(),
            source,
        })
    };
    let chain = CertificateDer::pem_slice_iter(&read(cert)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CertError::Certificate(format!("{}: {e}", cert.display())))?;
    if chain.is_empty() {
        return Err(CertError::Certificate(format!(
            "{}: no certificate",
            cert.display()
        )));
    }
    let key = PrivateKeyDer::from_pem_slice(&read(key)?)
        .map_err(|e| CertError::Certificate(format!("{}: {e}", key.display())))?;
    Ok((chain, key))
}

/// A client configuration: presents the identity's certificate and accepts
/// only servers with a node certificate chained to the cluster CA; ALPN `h2`
/// (the client library's, see `cellfleet_client::tls`).
pub fn client_config(identity: &TlsIdentity) -> Result<Arc<ClientConfig>, CertError> {
    cellfleet_client::tls::client_config(
        &identity.ca,
        identity.chain.clone(),
        identity.key.clone_key(),
    )
    .map_err(|e| CertError::Tls(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certs::ClusterCa;

    fn identity(ca: &ClusterCa, role: &Role) -> TlsIdentity {
        let issued = ca.issue(role, &[]).expect("issue");
        TlsIdentity::from_pem(ca.cert_pem(), &issued.cert_pem, &issued.key_pem).expect("identity")
    }

    #[test]
    fn roles_are_read_back_from_issued_certificates() {
        let ca = ClusterCa::generate("t").expect("ca");
        for role in [Role::Node("n1".into()), Role::Client("app".into())] {
            assert_eq!(identity(&ca, &role).role().expect("role"), role);
        }
        assert!(role_of(&[]).is_err());
        assert!(role_of(&[CertificateDer::from(vec![0x30, 0x00])]).is_err());
    }

    proptest::proptest! {
        /// Certificates from the network: arbitrary bytes are refused with a
        /// typed error, never a panic; a real certificate with a byte flipped
        /// never yields a role other than its own.
        #[test]
        fn arbitrary_certificate_bytes_never_panic(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512),
        ) {
            proptest::prop_assert!(role_of_der(&bytes).is_err());
        }
    }

    #[test]
    fn the_role_cache_answers_what_a_parse_answers_within_its_bound() {
        let ca = ClusterCa::generate("t").expect("ca");
        let roles: Vec<Role> = (0..ROLE_CACHE_ENTRIES + 6)
            .map(|i| {
                if i % 3 == 0 {
                    Role::Client(format!("app{i}"))
                } else {
                    Role::Node(format!("n{i}"))
                }
            })
            .collect();
        let certs: Vec<CertificateDer<'static>> = roles
            .iter()
            .map(|role| identity(&ca, role).chain[0].clone())
            .collect();
        let cache = RoleCache::default();
        // Every certificate in turn, twice over (the second pass after
        // the first overflowed the bound), then a few again: each answer is
        // the parse's, and the cache never holds more than its bound.
        let order = (0..certs.len())
            .chain(0..certs.len())
            .chain([3, 3, 69, 0, 1]);
        for i in order {
            assert_eq!(
                cache.role_of_der(&certs[i]).expect("role"),
                roles[i],
                "certificate {i}"
            );
            assert!(cache.len() <= ROLE_CACHE_ENTRIES);
        }
        assert_eq!(cache.len(), ROLE_CACHE_ENTRIES);
        // Bytes that do not parse are refused and not remembered.
        let held = cache.len();
        assert!(cache
            .role_of_der(&CertificateDer::from(vec![0x30, 0x00]))
            .is_err());
        assert_eq!(cache.len(), held);
    }

    #[test]
    fn flipped_certificate_bytes_never_change_the_role() {
        let ca = ClusterCa::generate("t").expect("ca");
        let node = identity(&ca, &Role::Node("n1".into()));
        let der = node.chain[0].to_vec();
        for i in 0..der.len() {
            let mut flipped = der.clone();
            flipped[i] ^= 0x01;
            if let Ok(role) = role_of_der(&flipped) {
                // Parsing alone may succeed (the signature is checked by
                // webpki first); the URI can only differ if it was hit.
                assert!(
                    matches!(&role, Role::Node(id) if id.len() == 2),
                    "byte {i}: {role:?}"
                );
            }
        }
    }

    #[test]
    fn configs_build_for_both_listeners_and_the_public_one() {
        let ca = ClusterCa::generate("t").expect("ca");
        let node = identity(&ca, &Role::Node("n1".into()));
        for listener in [Listener::Client, Listener::Peer] {
            let config = server_config(&node, listener).expect("server config");
            assert_eq!(config.alpn_protocols, vec![ALPN_H2.to_vec()]);
        }
        client_config(&node).expect("client config");
        assert!(TlsIdentity::from_pem("", "", "").is_err());
        let public =
            public_server_config(node.chain.clone(), node.key.clone_key()).expect("public");
        assert_eq!(
            public.alpn_protocols,
            vec![ALPN_H2.to_vec(), b"http/1.1".to_vec()]
        );
    }
}
