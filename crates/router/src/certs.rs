//! The cluster CA and the node and client certificates it issues (rcgen), written as PEM files with private keys at mode 0600.
//!
//! A certificate's role is its SAN URI: `cellfleet://node/<node_id>` for a
//! node (extended key usages serverAuth + clientAuth: it serves and it
//! dials peers) and `cellfleet://client/<name>` for a client (clientAuth
//! only). [`crate::tls`] reads the URI back and lets only node certificates
//! onto a peer listener.
//!
//! Files in a certificate directory: `ca.pem`, `ca.key`, and per identity
//! `node-<id>.pem`/`node-<id>.key` or `client-<name>.pem`/`client-<name>.key`.
//! Keys are created with mode 0600 (never briefly readable by others) and
//! never overwritten.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use time::{Duration, OffsetDateTime};

/// The CA certificate file in a certificate directory.
pub const CA_CERT_FILE: &str = "ca.pem";
/// The CA private key file in a certificate directory.
pub const CA_KEY_FILE: &str = "ca.key";
/// The scheme of role URIs.
pub const ROLE_URI_PREFIX: &str = "cellfleet://";
/// How long the CA is valid.
pub const CA_VALIDITY_DAYS: i64 = 3650;
/// How long node and client certificates are valid.
pub const LEAF_VALIDITY_DAYS: i64 = 825;
/// Certificates are valid from this long before issue (clock skew between
/// the issuing machine and the nodes).
pub const NOT_BEFORE_SKEW_HOURS: i64 = 1;
/// Bound on a node id or client name.
pub const NAME_BYTES_MAX: usize = 64;

/// Why certificate material could not be made, read or used.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// A file exists and will not be overwritten.
    #[error("{0} already exists; refusing to overwrite it")]
    Exists(PathBuf),
    /// Generating or parsing a certificate or key failed.
    #[error("certificate: {0}")]
    Certificate(String),
    /// A name is not usable in a certificate.
    #[error("invalid name {0:?}: 1..=64 ASCII letters, digits, '.', '_' or '-'")]
    InvalidName(String),
    /// The certificate carries no (or more than one) cellfleet role URI.
    #[error("certificate role: {0}")]
    Role(String),
    /// Building a rustls configuration failed.
    #[error("tls: {0}")]
    Tls(String),
}

impl CertError {
    /// Certificate problems do not fix themselves.
    pub fn is_retryable(&self) -> bool {
        matches!(self, CertError::Io { source, .. } if source.kind() == std::io::ErrorKind::Interrupted)
    }
}

fn cert_error(e: rcgen::Error) -> CertError {
    CertError::Certificate(e.to_string())
}

/// What a certificate is for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// A cluster node (may serve, and may call peers).
    Node(String),
    /// A client (may call the client and admin services only).
    Client(String),
}

impl Role {
    /// The SAN URI that marks the role.
    pub fn uri(&self) -> String {
        match self {
            Role::Node(id) => format!("{ROLE_URI_PREFIX}node/{id}"),
            Role::Client(name) => format!("{ROLE_URI_PREFIX}client/{name}"),
        }
    }

    /// Parses a role URI; `None` for URIs of other schemes.
    pub fn from_uri(uri: &str) -> Option<Result<Role, CertError>> {
        let rest = uri.strip_prefix(ROLE_URI_PREFIX)?;
        let parsed = match rest.split_once('/') {
            Some(("node", id)) => validate_name(id).map(|()| Role::Node(id.to_owned())),
            Some(("client", name)) => validate_name(name).map(|()| Role::Client(name.to_owned())),
            _ => Err(CertError::Role(format!("unknown role URI {uri:?}"))),
        };
        Some(parsed)
    }

    /// The file stem of this identity's certificate and key.
    pub fn file_stem(&self) -> String {
        match self {
            Role::Node(id) => format!("node-{id}"),
            Role::Client(name) => format!("client-{name}"),
        }
    }

    /// The name inside the role.
    pub fn name(&self) -> &str {
        match self {
            Role::Node(name) | Role::Client(name) => name,
        }
    }
}

/// Node ids and client names: the authority's node-id alphabet.
pub fn validate_name(name: &str) -> Result<(), CertError> {
    let valid_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if name.is_empty() || name.len() > NAME_BYTES_MAX || !name.chars().all(valid_char) {
        return Err(CertError::InvalidName(name.to_owned()));
    }
    Ok(())
}

/// A certificate and its private key, PEM.
#[derive(Clone)]
pub struct IssuedCert {
    /// The certificate.
    pub cert_pem: String,
    /// The private key (PKCS#8).
    pub key_pem: String,
}

impl std::fmt::Debug for IssuedCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedCert").finish_non_exhaustive()
    }
}

/// Where an issued certificate was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertPaths {
    /// The certificate (mode 0644).
    pub cert: PathBuf,
    /// The private key (mode 0600).
    pub key: PathBuf,
}

impl IssuedCert {
    /// Writes `<dir>/<stem>.pem` and `<dir>/<stem>.key`; refuses to overwrite.
    pub fn write(&self, dir: &Path, stem: &str) -> Result<CertPaths, CertError> {
        let paths = CertPaths {
            cert: dir.join(format!("{stem}.pem")),
            key: dir.join(format!("{stem}.key")),
        };
        for path in [&paths.cert, &paths.key] {
            if path.exists() {
                return Err(CertError::Exists(path.clone()));
            }
        }
        write_private_file(&paths.key, self.key_pem.as_bytes()).map_err(|source| {
            CertError::Io {
                path: paths.key.clone(),
                source,
            }
        })?;
        std::fs::write(&paths.cert, &self.cert_pem).map_err(|source| CertError::Io {
            path: paths.cert.clone(),
            source,
        })?;
        Ok(paths)
    }
}

/// Creates `path` with mode 0600 (Unix) and writes `bytes`, fsynced.
/// Fails if the file exists.
pub fn write_private_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

/// The cluster's certificate authority.
pub struct ClusterCa {
    cert_pem: String,
    key_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for ClusterCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterCa").finish_non_exhaustive()
    }
}

fn validity(days: i64) -> (OffsetDateTime, OffsetDateTime) {
    let now = OffsetDateTime::now_utc();
    (
        now - Duration::hours(NOT_BEFORE_SKEW_HOURS),
        now + Duration::days(days),
    )
}

impl ClusterCa {
    /// A new CA (in memory) named after `cluster_name`.
    pub fn generate(cluster_name: &str) -> Result<Self, CertError> {
        validate_name(cluster_name)?;
        let key = KeyPair::generate().map_err(cert_error)?;
        let mut params = CertificateParams::default();
        params.distinguished_name.push(
            DnType::CommonName,
            format!("cellfleet cluster CA {cluster_name}"),
        );
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        (params.not_before, params.not_after) = validity(CA_VALIDITY_DAYS);
        let cert = params.self_signed(&key).map_err(cert_error)?;
        Self::from_pem(&cert.pem(), &key.serialize_pem())
    }

    /// A CA from its certificate and key PEM.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, CertError> {
        let key = KeyPair::from_pem(key_pem).map_err(cert_error)?;
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key).map_err(cert_error)?;
        Ok(ClusterCa {
            cert_pem: cert_pem.to_owned(),
            key_pem: key_pem.to_owned(),
            issuer,
        })
    }

    /// Creates a CA and writes `ca.pem` and `ca.key` into `dir` (created if
    /// missing). Refuses if either file exists.
    pub fn init(dir: &Path, cluster_name: &str) -> Result<(Self, CertPaths), CertError> {
        std::fs::create_dir_all(dir).map_err(|source| CertError::Io {
            path: dir.to_owned(),
            source,
        })?;
        let ca = Self::generate(cluster_name)?;
        let paths = IssuedCert {
            cert_pem: ca.cert_pem.clone(),
            key_pem: ca.key_pem.clone(),
        }
        .write(dir, "ca")?;
        Ok((ca, paths))
    }

    /// Reads `ca.pem` and `ca.key` from `dir`.
    pub fn load(dir: &Path) -> Result<Self, CertError> {
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read_to_string(&path).map_err(|source| CertError::Io { path, source })
        };
        Self::from_pem(&read(CA_CERT_FILE)?, &read(CA_KEY_FILE)?)
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// Issues a certificate for `role`. Node certificates name `hosts`
    /// (DNS names or IP addresses) as well; with no hosts, `localhost`,
    /// `127.0.0.1` and `::1`.
    pub fn issue(&self, role: &Role, hosts: &[String]) -> Result<IssuedCert, CertError> {
        validate_name(role.name())?;
        let key = KeyPair::generate().map_err(cert_error)?;
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, role.uri());
        let uri = role
            .uri()
            .try_into()
            .map_err(|e: rcgen::Error| cert_error(e))?;
        params.subject_alt_names.push(SanType::URI(uri));
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        (params.not_before, params.not_after) = validity(LEAF_VALIDITY_DAYS);
        match role {
            Role::Node(_) => {
                params.extended_key_usages = vec![
                    ExtendedKeyUsagePurpose::ServerAuth,
                    ExtendedKeyUsagePurpose::ClientAuth,
                ];
                for san in node_sans(hosts)? {
                    params.subject_alt_names.push(san);
                }
            }
            Role::Client(_) => {
                params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            }
        }
        let cert = params.signed_by(&key, &self.issuer).map_err(cert_error)?;
        Ok(IssuedCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// Issues a certificate for `role` and writes it into `dir`.
    pub fn issue_to(
        &self,
        dir: &Path,
        role: &Role,
        hosts: &[String],
    ) -> Result<CertPaths, CertError> {
        self.issue(role, hosts)?.write(dir, &role.file_stem())
    }
}

fn node_sans(hosts: &[String]) -> Result<Vec<SanType>, CertError> {
    if hosts.is_empty() {
        return Ok(vec![
            SanType::DnsName("localhost".try_into().map_err(cert_error)?),
            SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            SanType::IpAddress(IpAddr::V6(Ipv6Addr::LOCALHOST)),
        ]);
    }
    hosts
        .iter()
        .map(|host| match host.parse::<IpAddr>() {
            Ok(ip) => Ok(SanType::IpAddress(ip)),
            Err(_) => Ok(SanType::DnsName(
                host.clone().try_into().map_err(cert_error)?,
            )),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_issue_and_load_round_trip() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (ca, paths) = ClusterCa::init(dir.path(), "test").expect("init");
        assert_eq!(paths.cert, dir.path().join(CA_CERT_FILE));
        assert!(matches!(
            ClusterCa::init(dir.path(), "test"),
            Err(CertError::Exists(_))
        ));
        let loaded = ClusterCa::load(dir.path()).expect("load");
        assert_eq!(loaded.cert_pem(), ca.cert_pem());
        let node = loaded
            .issue_to(dir.path(), &Role::Node("n1".into()), &[])
            .expect("issue");
        assert_eq!(node.key, dir.path().join("node-n1.key"));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            for key in [&paths.key, &node.key] {
                let mode = std::fs::metadata(key).expect("stat").permissions().mode();
                assert_eq!(mode & 0o777, 0o600, "{}", key.display());
            }
        }
        let pem = std::fs::read_to_string(&node.cert).expect("read");
        assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"));
    }

    #[test]
    fn roles_round_trip_through_uris_and_names_are_checked() {
        for role in [Role::Node("n-1".into()), Role::Client("ci.bot".into())] {
            assert_eq!(
                Role::from_uri(&role.uri()).expect("ours").expect("valid"),
                role
            );
        }
        assert!(Role::from_uri("spiffe://x").is_none());
        assert!(Role::from_uri("cellfleet://admin/x")
            .expect("ours")
            .is_err());
        assert!(Role::from_uri("cellfleet://node/a/b")
            .expect("ours")
            .is_err());
        assert!(validate_name("../x").is_err());
        assert!(validate_name("").is_err());
        let ca = ClusterCa::generate("c").expect("ca");
        assert!(ca.issue(&Role::Client("bad name".into()), &[]).is_err());
    }
}
