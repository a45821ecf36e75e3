//! The Durable Streams listener as `cellfleet node` serves it by default, on real node processes: HTTPS with the node certificate over HTTP/1.1 and HTTP/2, bearer tokens signed by a registry key, every refusal (no token, expired, wrong key, wrong prefix, wrong operation) answered 401/403 with nothing changed, and a granted token working through nodes that do not own the stream.

mod cluster_common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use cellfleet_streams::token::{self, Claims, Op};
use cluster_common::{now_ms, Cluster, Store, BIN};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};

#[derive(Debug)]
struct Reply {
    status: u16,
    version: hyper::Version,
    challenge: Option<String>,
    body: String,
}

/// One request on a fresh TLS connection that trusts only the cluster CA;
/// `h2` picks the protocol by ALPN (and checks the server agreed).
async fn https(
    ca: &Path,
    addr: SocketAddr,
    h2: bool,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> Reply {
    let pem = std::fs::read(ca).expect("ca.pem");
    let mut roots = rustls::RootCertStore::empty();
    use rustls::pki_types::pem::PemObject;
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
        roots.add(cert.expect("CA pem")).expect("CA cert");
    }
    let mut config = rustls::ClientConfig::builder_with_provider(cellfleet_router::tls::provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let alpn: &[u8] = if h2 { b"h2" } else { b"http/1.1" };
    config.alpn_protocols = vec![alpn.to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("TLS handshake with the node certificate");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(alpn), "ALPN");
    let io = TokioIo::new(tls);
    let mut request = hyper::Request::builder()
        .method(method)
        .uri(format!("https://{addr}{path}"))
        .header("content-type", "application/json");
    if !h2 {
        request = request.header("host", addr.to_string());
    }
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let request = request
        .body(Full::new(Bytes::from(body.to_owned())))
        .expect("request");
    // The senders live until the body is read: dropping one closes its
    // connection, and HTTP/2 then resets the open stream.
    let (response, _h2, _h1);
    if h2 {
        let (mut send, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .expect("h2 handshake");
        tokio::spawn(connection);
        response = send.send_request(request).await.expect("h2 response");
        (_h2, _h1) = (Some(send), None);
    } else {
        let (mut send, connection) = hyper::client::conn::http1::handshake(io)
            .await
            .expect("http/1.1 handshake");
        tokio::spawn(connection);
        response = send.send_request(request).await.expect("http/1.1 response");
        (_h2, _h1) = (None, Some(send));
    }
    let status = response.status().as_u16();
    let version = response.version();
    let challenge = response
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().expect("ascii").to_owned());
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    Reply {
        status,
        version,
        challenge,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// `cellfleet keys token` with the cluster's client config (the dev key).
fn mint(cluster: &Cluster, prefix: &str, ops: &str) -> String {
    let out = Command::new(BIN)
        .args([
            "keys", "token", "--prefix", prefix, "--ops", ops, "--config",
        ])
        .arg(cluster.path("client.toml"))
        .output()
        .expect("run cellfleet keys token");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .trim()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_over_tls_allow_what_they_grant_and_nothing_else() {
    let cluster = Cluster::start_with_env(
        3,
        Store::Local,
        5000,
        &[
            ("CELLFLEET_STREAMS_TLS", "node"),
            ("CELLFLEET_STREAMS_AUTH", "token"),
        ],
    );
    let ca = cluster.path("certs/ca.pem");
    let nodes: Vec<SocketAddr> = cluster
        .nodes
        .iter()
        .map(|n| n.streams.expect("every node serves streams"))
        .collect();
    let stream = "/v1/stream/sec/room";
    let writer = mint(&cluster, "/v1/stream/sec/", "create,append,read");
    let reader = mint(&cluster, "/v1/stream/", "read");
    let read = |at: SocketAddr| {
        let ca = ca.clone();
        let reader = reader.clone();
        async move {
            https(
                &ca,
                at,
                true,
                "GET",
                &format!("{stream}?offset=-1"),
                Some(&reader),
                "",
            )
            .await
        }
    };

    // Without a token nothing is created.
    let r = https(&ca, nodes[0], true, "PUT", stream, None, "").await;
    assert_eq!(r.status, 401, "{r:?}");
    assert_eq!(
        r.challenge.as_deref(),
        Some("Bearer realm=\"cellfleet-streams\"")
    );
    assert!(r.body.contains("cellfleet keys token"), "{}", r.body);
    assert_eq!(
        read(nodes[1]).await.status,
        404,
        "a refused PUT created nothing"
    );

    // Granted: create and append over HTTP/2 through n1, over HTTP/1.1
    // through n2 and n3; at least two of the three do not own the stream.
    let r = https(&ca, nodes[0], true, "PUT", stream, Some(&writer), "").await;
    assert_eq!(
        (r.status, r.version),
        (201, hyper::Version::HTTP_2),
        "{r:?}"
    );
    for (i, at) in nodes.iter().enumerate() {
        let body = format!("{{\"n\":{i}}}");
        let r = https(&ca, *at, i == 0, "POST", stream, Some(&writer), &body).await;
        assert_eq!(r.status, 204, "append through node {i}: {r:?}");
        assert_eq!(
            r.version,
            if i == 0 {
                hyper::Version::HTTP_2
            } else {
                hyper::Version::HTTP_11
            }
        );
    }
    let expected = r#"[{"n":0},{"n":1},{"n":2}]"#;
    for at in &nodes {
        let r = read(*at).await;
        assert_eq!(
            (r.status, r.body.as_str()),
            (200, expected),
            "read through {at}"
        );
    }

    // Expired, forged and unentitled tokens: 401, nothing appended.
    let dev_key =
        cellfleet_router::signing::read_signing_key(&cluster.path("dev.ed25519.pem")).unwrap();
    let now = now_ms() / 1000;
    let claims = |iat: i64, exp: i64| Claims {
        iat,
        exp,
        nbf: None,
        sub: None,
        prefixes: vec!["/v1/stream/sec/".into()],
        ops: Op::ALL.to_vec(),
    };
    let expired = token::mint(&dev_key, "dev", &claims(now - 7200, now - 3600)).unwrap();
    let forged = token::mint(
        &ed25519_dalek::SigningKey::from_bytes(&[7; 32]),
        "dev",
        &claims(now, now + 600),
    )
    .unwrap();
    let limited_key =
        cellfleet_router::signing::read_signing_key(&cluster.path("limited.ed25519.pem")).unwrap();
    let unentitled = token::mint(&limited_key, "limited", &claims(now, now + 600)).unwrap();
    let unknown = token::mint(&dev_key, "nobody", &claims(now, now + 600)).unwrap();
    for (name, bad, says) in [
        ("expired", &expired, "expired"),
        ("forged", &forged, "signature does not verify"),
        ("unentitled key", &unentitled, "may not grant"),
        ("unknown key", &unknown, "no key \"nobody\""),
        ("garbage", &"x.y.z".to_owned(), "malformed"),
    ] {
        for (method, path) in [
            ("POST", stream),
            ("DELETE", stream),
            ("PUT", "/v1/stream/sec/new"),
        ] {
            let r = https(&ca, nodes[1], false, method, path, Some(bad), "{\"bad\":1}").await;
            assert_eq!(r.status, 401, "{name} {method}: {r:?}");
            let challenge = r.challenge.unwrap_or_default();
            assert!(
                challenge.contains("error=\"invalid_token\""),
                "{name}: {challenge}"
            );
            assert!(r.body.contains(says), "{name}: {}", r.body);
        }
    }

    // Valid tokens outside their grant: 403, nothing changed.
    for (name, method, path, with) in [
        ("read-only token appends", "POST", stream, &reader),
        ("writer deletes", "DELETE", stream, &writer),
        (
            "writer creates elsewhere",
            "PUT",
            "/v1/stream/other",
            &writer,
        ),
        (
            "writer subscribes",
            "PUT",
            "/v1/stream/sec/__ds/subscriptions/s1",
            &writer,
        ),
    ] {
        let r = https(&ca, nodes[2], true, method, path, Some(with), "{\"bad\":1}").await;
        assert_eq!(r.status, 403, "{name}: {r:?}");
        let challenge = r.challenge.unwrap_or_default();
        assert!(
            challenge.contains("error=\"insufficient_scope\""),
            "{name}: {challenge}"
        );
    }
    for at in &nodes {
        let r = read(*at).await;
        assert_eq!(
            (r.status, r.body.as_str()),
            (200, expected),
            "unchanged through {at}"
        );
    }
    let other = https(
        &ca,
        nodes[0],
        true,
        "HEAD",
        "/v1/stream/other",
        Some(&reader),
        "",
    )
    .await;
    assert_eq!(
        other.status, 404,
        "the refused PUT elsewhere created nothing"
    );

    // The token may also ride in the query (for EventSource).
    let r = https(
        &ca,
        nodes[1],
        false,
        "GET",
        &format!("{stream}?offset=-1&access_token={reader}"),
        None,
        "",
    )
    .await;
    assert_eq!((r.status, r.body.as_str()), (200, expected));
    // Subscriptions need "subscribe" on their prefix; the JWKS is public.
    let subscriber = mint(&cluster, "/v1/stream/sec/", "subscribe");
    let subscription = "/v1/stream/sec/__ds/subscriptions/s1";
    let create = r#"{"type":"pull-wake","pattern":"**","wake_stream":"wakes"}"#;
    let r = https(
        &ca,
        nodes[1],
        true,
        "PUT",
        subscription,
        Some(&subscriber),
        create,
    )
    .await;
    assert!(matches!(r.status, 200 | 201), "{r:?}");
    let r = https(&ca, nodes[2], false, "GET", subscription, Some(&writer), "").await;
    assert_eq!(
        r.status, 403,
        "a writer may not look at subscriptions: {r:?}"
    );
    let r = https(
        &ca,
        nodes[2],
        false,
        "GET",
        subscription,
        Some(&subscriber),
        "",
    )
    .await;
    assert_eq!(r.status, 200, "{r:?}");
    let r = https(
        &ca,
        nodes[0],
        false,
        "GET",
        "/v1/stream/sec/__ds/jwks.json",
        None,
        "",
    )
    .await;
    assert_eq!(r.status, 200, "{r:?}");
    // Plain HTTP to the HTTPS port is told which scheme to use.
    let plain = tokio::task::block_in_place(|| {
        use std::io::{Read, Write};
        let mut tcp = std::net::TcpStream::connect(nodes[0]).expect("connect");
        tcp.write_all(b"GET /v1/stream/sec/room HTTP/1.1\r\nhost: x\r\n\r\n")
            .expect("write");
        let mut reply = String::new();
        let _ = tcp.read_to_string(&mut reply);
        reply
    });
    assert!(plain.starts_with("HTTP/1.1 400 "), "{plain}");
    assert!(plain.contains("use https://"), "{plain}");
    // CORS preflights need no token.
    let r = https(&ca, nodes[0], false, "OPTIONS", stream, None, "").await;
    assert_eq!(r.status, 204);
}

/// The streams settings of a node TOML through the binary: a bad value
/// exits 1 naming the setting and the choices; a node started with dev's
/// anonymous plain-HTTP settings says so on stderr and prints an http://
/// address, and one with the defaults an https:// one.
#[test]
fn node_streams_settings_are_checked_and_insecure_ones_announced() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().to_str().expect("utf-8");
    let out = Command::new(BIN)
        .args(["dev", "--no-start", "--nodes", "1", "--data", data])
        .output()
        .expect("dev --no-start");
    assert!(out.status.success());
    let config = std::fs::read_to_string(dir.path().join("n1.toml")).expect("n1.toml");
    assert!(config.contains("streams_tls = \"none\""), "{config}");
    assert!(config.contains("streams_auth = \"none\""), "{config}");
    let node = |toml: &str, env: &[(&str, &str)]| {
        let path = dir.path().join("edited.toml");
        std::fs::write(&path, toml).expect("write");
        Command::new(BIN)
            .args(["node", "--config"])
            .arg(&path)
            .envs(env.iter().copied())
            .envs([
                ("CELLFLEET_LISTEN_CLIENT", "127.0.0.1:0"),
                ("CELLFLEET_LISTEN_PEER", "127.0.0.1:0"),
                ("CELLFLEET_LISTEN_HTTP", "127.0.0.1:0"),
                ("CELLFLEET_LISTEN_STREAMS", "127.0.0.1:0"),
                ("CELLFLEET_LISTEN_CONSOLE", "127.0.0.1:0"),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn node")
    };
    let dropped = |line: &str| {
        config
            .lines()
            .filter(|l| !l.starts_with(line))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let with =
        |extra: &str| dropped("streams_tls").replacen("[listen]", &format!("[listen]\n{extra}"), 1);
    for (toml, says) in [
        (with("streams_tls = \"tls\""), "listen.streams_tls = \"tls\": use \"node\" or \"none\""),
        (config.replace("streams_auth = \"none\"", "streams_auth = \"jwt\""), "listen.streams_auth = \"jwt\": use \"token\" or \"none\""),
        (with("streams_cert = \"public.pem\""), "listen.streams_cert and listen.streams_key go together"),
        (
            with("streams_cert = \"public.pem\"\nstreams_key = \"public.key\""),
            "listen.streams_cert = ",
        ),
        (
            with("streams_tls = \"none\"\nstreams_cert = \"certs/node-n1.pem\"\nstreams_key = \"certs/node-n1.key\""),
            "conflicts with listen.streams_cert",
        ),
    ] {
        let output = node(&toml, &[]).wait_with_output().expect("node exits");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{toml}\n{stderr}");
        assert!(stderr.contains(says), "{says}: {stderr}");
    }

    let started = |toml: &str, env: &[(&str, &str)]| {
        let mut child = node(toml, env);
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut streams = String::new();
        for line in stdout.lines().map_while(Result::ok) {
            if let Some(url) = line.split(" streams=").nth(1) {
                streams = url.to_owned();
            }
            if line.contains(" ready ") {
                break;
            }
        }
        let _ = child.kill();
        let output = child.wait_with_output().expect("node output");
        (
            streams,
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (url, stderr) = started(&config, &[]);
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    assert!(
        stderr.contains("is plain HTTP (listen.streams_tls = \"none\")"),
        "{stderr}"
    );
    assert!(
        stderr.contains("streams_auth = \"none\": anyone who reaches"),
        "{stderr}"
    );
    let secure = dropped("streams_tls");
    let secure = secure
        .lines()
        // dev's console is plain too; a secure node warns of nothing.
        .filter(|l| !l.starts_with("streams_auth") && !l.starts_with("console_tls"))
        .collect::<Vec<_>>()
        .join("\n");
    let (url, stderr) = started(&secure, &[]);
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    assert!(!stderr.contains("warning"), "{stderr}");
    // The environment overrides the file.
    let (url, stderr) = started(&secure, &[("CELLFLEET_STREAMS_TLS", "none")]);
    assert!(url.starts_with("http://"), "{url}");
    assert!(stderr.contains("is plain HTTP"), "{stderr}");
}
