//! The client side of mutual TLS: present a cluster-CA client certificate, accept only servers holding a node certificate of the same CA.
//!
//! Chain validation is webpki's (via rustls, `ring` provider); on top of it
//! the server's end-entity certificate must carry exactly one `cellfleet://`
//! SAN URI and it must be a node's (`cellfleet://node/<id>`), so a client
//! never talks to something holding only a client certificate.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

/// ALPN protocol of gRPC (HTTP/2).
pub const ALPN_H2: &[u8] = b"h2";
/// The scheme of the SAN URIs that carry a certificate's role.
pub const ROLE_URI_PREFIX: &str = "cellfleet://";
/// The role URI prefix of node certificates.
const NODE_URI_PREFIX: &str = "cellfleet://node/";

/// The crypto provider every configuration uses.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Why a TLS identity could not be loaded or a configuration built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A PEM file holds no usable certificate or key.
    #[error("{0}")]
    Pem(String),
    /// rustls refused the certificates or key.
    #[error("tls: {0}")]
    Config(String),
}

/// Parses PEM certificates (at least one).
pub fn certificates_from_pem(
    pem: &[u8],
    what: &str,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem(format!("{what}: {e}")))?;
    if certs.is_empty() {
        return Err(TlsError::Pem(format!("{what}: no certificate")));
    }
    Ok(certs)
}

/// Parses a PEM private key.
pub fn key_from_pem(pem: &[u8], what: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| TlsError::Pem(format!("{what}: {e}")))
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Io {
        path: path.to_owned(),
        source,
    })
}

/// A client configuration from PEM files: the cluster CA, this client's
/// certificate and its key (as `cellfleet certs issue client NAME` writes
/// them).
///
/// ```no_run
/// use cellfleet_client::tls::client_config_from_files;
/// let tls = client_config_from_files(
///     ".cellfleet-dev/certs/ca.pem".as_ref(),
///     ".cellfleet-dev/certs/client-dev.pem".as_ref(),
///     ".cellfleet-dev/certs/client-dev.key".as_ref(),
/// )?;
/// let builder = cellfleet_client::Client::builder(["127.0.0.1:7001"]).tls(tls);
/// # let _ = builder;
/// # Ok::<(), cellfleet_client::tls::TlsError>(())
/// ```
pub fn client_config_from_files(
    ca: &Path,
    cert: &Path,
    key: &Path,
) -> Result<Arc<ClientConfig>, TlsError> {
    let ca_certs = certificates_from_pem(&read(ca)?, &ca.display().to_string())?;
    let chain = certificates_from_pem(&read(cert)?, &cert.display().to_string())?;
    let key = key_from_pem(&read(key)?, &key.display().to_string())?;
    client_config(&ca_certs, chain, key)
}

/// A client configuration: presents `chain`/`key` and accepts only servers
/// with a node certificate chained to one of `ca`; ALPN `h2`.
pub fn client_config(
    ca: &[CertificateDer<'static>],
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<ClientConfig>, TlsError> {
    let provider = provider();
    let mut roots = RootCertStore::empty();
    for certificate in ca {
        roots
            .add(certificate.clone())
            .map_err(|e| TlsError::Config(format!("CA certificate: {e}")))?;
    }
    let inner = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| TlsError::Config(format!("server verifier: {e}")))?;
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(NodeServerVerifier { inner }))
        .with_client_auth_cert(chain, key)
        .map_err(|e| TlsError::Config(format!("client certificate: {e}")))?;
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(Arc::new(config))
}

/// The URIs in a DER certificate's subjectAltName (untrusted bytes: an
/// error, never a panic, for anything unparseable).
pub fn san_uris(der: &[u8]) -> Result<Vec<String>, String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| format!("unparseable certificate: {e}"))?;
    let san = cert
        .subject_alternative_name()
        .map_err(|e| format!("bad subjectAltName: {e}"))?
        .ok_or_else(|| "no subjectAltName".to_owned())?;
    Ok(san
        .value
        .general_names
        .iter()
        .filter_map(|name| match name {
            x509_parser::extensions::GeneralName::URI(uri) => Some((*uri).to_owned()),
            _ => None,
        })
        .collect())
}

/// The node id of a node certificate: its one `cellfleet://` URI must be
/// `cellfleet://node/<id>`.
pub fn node_id_of(der: &[u8]) -> Result<String, String> {
    let uris = san_uris(der)?;
    let mut roles = uris.iter().filter(|uri| uri.starts_with(ROLE_URI_PREFIX));
    let role = roles
        .next()
        .ok_or_else(|| "no cellfleet:// role URI".to_owned())?;
    if roles.next().is_some() {
        return Err("more than one cellfleet:// role URI".into());
    }
    match role.strip_prefix(NODE_URI_PREFIX) {
        Some(id) if !id.is_empty() && !id.contains('/') => Ok(id.to_owned()),
        _ => Err(format!("server presented {role}, not a node certificate")),
    }
}

fn role_failure(reason: String) -> rustls::Error {
    #[derive(Debug, thiserror::Error)]
    #[error("certificate role: {0}")]
    struct RoleError(String);
    rustls::Error::InvalidCertificate(CertificateError::Other(rustls::OtherError(Arc::new(
        RoleError(reason),
    ))))
}

/// webpki server verification plus "the server is a node".
#[derive(Debug)]
struct NodeServerVerifier {
    inner: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for NodeServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verified = self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )?;
        node_id_of(end_entity).map_err(role_failure)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Certificates from the network: arbitrary bytes are an error,
        /// never a panic.
        #[test]
        fn arbitrary_certificate_bytes_never_panic(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512),
        ) {
            proptest::prop_assert!(node_id_of(&bytes).is_err());
        }
    }
}
