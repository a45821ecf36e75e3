//! Webhook delivery for subscriptions: URL safety rules, Ed25519 signatures (`Webhook-Signature: t=<unix>,kid=<kid>,ed25519=<base64url>` over `"<t>.<raw body>"`), the JWKS document, and one bounded HTTP/1.1 POST to a checked address.
//!
//! *Invariant:* a webhook request only ever connects to an address that
//! passed [`address_allowed`] after resolution, so a name cannot be
//! re-pointed at a private network between the check and the connection.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD as BASE64URL;
use base64::Engine;
use bytes::Bytes;
use ed25519_dalek::{Signer, SigningKey};
use http_body_util::{BodyExt, Full, Limited};
use hyper::Uri;
use sha2::{Digest, Sha256};

/// Longest one webhook request may take (connect, send, answer).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest webhook answer read.
pub const RESPONSE_BYTES_MAX: usize = 64 << 10;

/// The signing key and its key id.
#[derive(Clone)]
pub struct Signer25519 {
    key: SigningKey,
    kid: String,
}

impl std::fmt::Debug for Signer25519 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Signer25519({})", self.kid)
    }
}

impl Signer25519 {
    /// The key of 32-byte `seed`; its kid is `ds_` and the first 16 bytes of SHA-256 of the public key, base64url.
    pub fn from_seed(seed: &[u8; 32]) -> Self {
        let key = SigningKey::from_bytes(seed);
        let digest = Sha256::digest(key.verifying_key().as_bytes());
        let kid = format!("ds_{}", BASE64URL.encode(&digest[..16]));
        Signer25519 { key, kid }
    }

    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The `Webhook-Signature` value for `body` sent at unix second `t`.
    pub fn signature(&self, t: u64, body: &[u8]) -> String {
        let mut message = format!("{t}.").into_bytes();
        message.extend_from_slice(body);
        let signature = self.key.sign(&message);
        format!(
            "t={t},kid={},ed25519={}",
            self.kid,
            BASE64URL.encode(signature.to_bytes())
        )
    }

    /// The JWKS document (`application/jwk-set+json`).
    pub fn jwks(&self) -> serde_json::Value {
        serde_json::json!({"keys": [{
            "kty": "OKP",
            "crv": "Ed25519",
            "alg": "EdDSA",
            "use": "sig",
            "kid": self.kid,
            "x": BASE64URL.encode(self.key.verifying_key().as_bytes()),
        }]})
    }
}

/// Whether a webhook may be sent to `ip`: never to private, link-local (cloud metadata included), shared, multicast, documentation or unspecified addresses; to loopback only when `allow_loopback`.
pub fn address_allowed(ip: IpAddr, allow_loopback: bool) -> bool {
    match ip {
        IpAddr::V4(v4) => v4_allowed(v4, allow_loopback),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return v4_allowed(v4, allow_loopback);
            }
            if v6.is_loopback() {
                return allow_loopback;
            }
            let s = v6.segments();
            !(v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00 // unique local (fd00:ec2::254 included)
                || (s[0] & 0xffc0) == 0xfe80 // link-local
                || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
                || (s[0] == 0x0064 && s[1] == 0xff9b)) // NAT64 (embeds an IPv4 address)
                && v6 != Ipv6Addr::UNSPECIFIED
        }
    }
}

fn v4_allowed(ip: Ipv4Addr, allow_loopback: bool) -> bool {
    if ip.is_loopback() {
        return allow_loopback;
    }
    let o = ip.octets();
    !(ip.is_private()
        || ip.is_link_local() // 169.254/16: cloud metadata
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || o[0] == 0
        || (o[0] == 100 && (o[1] & 0xc0) == 64) // shared address space
        || (o[0] == 192 && o[1] == 0 && o[2] == 0) // IETF protocol assignments
        || (o[0] == 198 && (o[1] & 0xfe) == 18) // benchmarking
        || o[0] >= 240)
}

/// A webhook target after parsing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub host: String,
    pub port: u16,
    pub uri: Uri,
    /// `https`: TLS with the system's trust roots.
    pub tls: bool,
}

/// Parses and checks a webhook URL (`http` or `https`; IP literals are checked now, names when resolved).
pub fn parse_url(url: &str, allow_loopback: bool) -> Result<Target, String> {
    if url.len() > 2048 {
        return Err("url is too long".into());
    }
    let uri: Uri = url.parse().map_err(|_| "url does not parse".to_string())?;
    let tls = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => return Err("url scheme must be http or https".into()),
    };
    let authority = uri.authority().ok_or("url has no host")?;
    if authority.as_str().contains('@') {
        return Err("url must not carry credentials".into());
    }
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    if host.is_empty() {
        return Err("url has no host".into());
    }
    let lower = host.to_ascii_lowercase();
    if (lower == "localhost" || lower.ends_with(".localhost")) && !allow_loopback {
        return Err("loopback hosts are not allowed".into());
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        if !address_allowed(ip, allow_loopback) {
            return Err(format!("address {ip} is not allowed"));
        }
    }
    Ok(Target {
        host: host.to_owned(),
        port: uri.port_u16().unwrap_or(if tls { 443 } else { 80 }),
        uri,
        tls,
    })
}

/// Resolves `target` and keeps the allowed addresses; `Err` when none is.
pub async fn resolve(target: &Target, allow_loopback: bool) -> Result<Vec<SocketAddr>, String> {
    let found: Vec<SocketAddr> = tokio::net::lookup_host((target.host.as_str(), target.port))
        .await
        .map_err(|e| format!("cannot resolve {}: {e}", target.host))?
        .take(8)
        .collect();
    let allowed: Vec<SocketAddr> = found
        .iter()
        .copied()
        .filter(|a| address_allowed(a.ip(), allow_loopback))
        .collect();
    if allowed.is_empty() {
        return Err(format!("{} resolves to no allowed address", target.host));
    }
    Ok(allowed)
}

/// A webhook's answer: its status and (bounded) body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: Bytes,
}

/// POSTs `body` to `target` (signed), within [`REQUEST_TIMEOUT`].
pub async fn post(
    target: &Target,
    allow_loopback: bool,
    signer: &Signer25519,
    body: Bytes,
    unix_now: u64,
) -> Result<Answer, String> {
    tokio::time::timeout(
        REQUEST_TIMEOUT,
        post_inner(target, allow_loopback, signer, body, unix_now),
    )
    .await
    .map_err(|_| "webhook timed out".to_string())?
}

async fn post_inner(
    target: &Target,
    allow_loopback: bool,
    signer: &Signer25519,
    body: Bytes,
    unix_now: u64,
) -> Result<Answer, String> {
    let addresses = resolve(target, allow_loopback).await?;
    let mut last = String::from("no address");
    let mut stream = None;
    for address in addresses {
        match tokio::net::TcpStream::connect(address).await {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = format!("connect {address}: {e}"),
        }
    }
    let stream = stream.ok_or(last)?;
    if target.tls {
        let name = rustls::pki_types::ServerName::try_from(target.host.clone())
            .map_err(|e| format!("tls name {}: {e}", target.host))?;
        let tls = tokio_rustls::TlsConnector::from(tls_config()?)
            .connect(name, stream)
            .await
            .map_err(|e| format!("tls: {e}"))?;
        exchange(target, signer, body, unix_now, tls).await
    } else {
        exchange(target, signer, body, unix_now, stream).await
    }
}

/// The TLS client settings: the system's trust roots, built once.
fn tls_config() -> Result<std::sync::Arc<rustls::ClientConfig>, String> {
    static CONFIG: std::sync::OnceLock<Result<std::sync::Arc<rustls::ClientConfig>, String>> =
        std::sync::OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let mut roots = rustls::RootCertStore::empty();
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
            if roots.is_empty() {
                return Err("no system trust roots for https webhooks".into());
            }
            let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|e| format!("tls: {e}"))?
                .with_root_certificates(roots)
                .with_no_client_auth();
            Ok(std::sync::Arc::new(config))
        })
        .clone()
}

/// One request and its answer over `io`.
async fn exchange<IO>(
    target: &Target,
    signer: &Signer25519,
    body: Bytes,
    unix_now: u64,
    io: IO,
) -> Result<Answer, String>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let io = hyper_util::rt::TokioIo::new(io);
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let driver = tokio::spawn(connection);
    let path = target
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let host = match target.uri.port_u16() {
        Some(port) => format!("{}:{port}", target.uri.host().unwrap_or_default()),
        None => target.uri.host().unwrap_or_default().to_owned(),
    };
    let request = hyper::Request::post(path)
        .header("host", host)
        .header("content-type", "application/json")
        .header("user-agent", "cellfleet-streams")
        .header("webhook-signature", signer.signature(unix_now, &body))
        .body(Full::new(body))
        .map_err(|e| format!("request: {e}"))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("send: {e}"))?;
    let status = response.status().as_u16();
    let body = Limited::new(response.into_body(), RESPONSE_BYTES_MAX)
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    driver.abort();
    Ok(Answer { status, body })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::{Signature, Verifier};

    #[test]
    fn signature_covers_timestamp_and_body() {
        let signer = Signer25519::from_seed(&[7; 32]);
        let header = signer.signature(1_700_000_000, b"{\"a\":1}");
        let (t, rest) = header.split_once(",kid=").unwrap();
        assert_eq!(t, "t=1700000000");
        let (kid, sig) = rest.split_once(",ed25519=").unwrap();
        assert_eq!(kid, signer.kid());
        assert!(kid.starts_with("ds_"));
        let sig = Signature::from_slice(&BASE64URL.decode(sig).unwrap()).unwrap();
        let key = signer.key.verifying_key();
        assert!(key.verify(b"1700000000.{\"a\":1}", &sig).is_ok());
        assert!(key.verify(b"1700000001.{\"a\":1}", &sig).is_err());
        let jwks = signer.jwks();
        assert_eq!(jwks["keys"][0]["kid"], signer.kid());
        assert_eq!(jwks["keys"][0]["crv"], "Ed25519");
    }

    #[test]
    fn unsafe_urls_are_refused() {
        for url in [
            "http://10.0.0.1/hook",
            "http://172.16.3.4/",
            "http://192.168.1.1/",
            "http://169.254.169.254/latest/meta-data",
            "http://[fd00:ec2::254]/",
            "http://[fe80::1]/",
            "http://[::ffff:10.0.0.1]/",
            "http://100.64.0.1/",
            "http://0.0.0.0/",
            "http://127.0.0.1:8080/",
            "http://localhost/",
            "http://user:pw@example.com/",
            "https://10.1.2.3/",
            "ftp://example.com/",
        ] {
            assert!(parse_url(url, false).is_err(), "{url}");
        }
        assert!(parse_url("http://127.0.0.1:9/x", true).is_ok());
        assert!(parse_url("http://[::1]:9/x", true).is_ok());
        assert!(parse_url("http://10.0.0.1/x", true).is_err());
        let target = parse_url("http://93.184.216.34:8080/hook?x=1", false).unwrap();
        assert_eq!(target.port, 8080);
        assert_eq!(target.host, "93.184.216.34");
        let secure = parse_url("https://93.184.216.34/hook", false).unwrap();
        assert!(secure.tls);
        assert_eq!(secure.port, 443);
    }
}
