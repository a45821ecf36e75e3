//! Durable Streams protocol behaviour through real HTTP against an in-process node on the local-directory store.

use std::sync::Arc;
use std::time::Duration;

use cellfleet_authority::{NodeId, SystemClock};
use cellfleet_cell::Typed;
use cellfleet_runtime::{Kinds, Node, NodeConfig};
use cellfleet_store::LocalStore;
use cellfleet_streams::{StreamKind, Streams, StreamsConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

struct Server {
    address: std::net::SocketAddr,
    _dir: tempfile::TempDir,
    _stop: tokio::sync::watch::Sender<bool>,
}

async fn server() -> Server {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Arc::new(LocalStore::open(dir.path().join("bucket")).expect("local store"));
    let config = NodeConfig::new(
        NodeId::new("n1").expect("node id"),
        dir.path().join("n1"),
        "streams-test",
    );
    let kinds = Arc::new(Kinds::builtin().with(Arc::new(Typed(StreamKind))));
    let node = Node::start(config, store, Arc::new(SystemClock), kinds)
        .await
        .expect("node starts");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    let streams = Streams::new(
        node,
        StreamsConfig {
            long_poll_timeout: Duration::from_millis(300),
            ..StreamsConfig::default()
        },
    );
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    tokio::spawn(streams.serve(listener, shutdown));
    Server {
        address,
        _dir: dir,
        _stop: stop,
    }
}

async fn request(
    server: &Server,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Reply {
    let mut stream = tokio::net::TcpStream::connect(server.address)
        .await
        .expect("connect");
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.expect("write head");
    stream.write_all(body).await.expect("write body");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.expect("read reply");
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("reply head");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines.next().expect("status line")[9..12]
        .parse()
        .expect("status");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_ascii_lowercase(), v.to_owned()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    if headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v == "chunked")
    {
        body = dechunk(&body);
    }
    Reply {
        status,
        headers,
        body,
    }
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(end) = raw.windows(2).position(|w| w == b"\r\n") {
        let size =
            usize::from_str_radix(std::str::from_utf8(&raw[..end]).unwrap_or("0"), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        out.extend_from_slice(&raw[end + 2..end + 2 + size]);
        raw = &raw[end + 4 + size..];
    }
    out
}

const TEXT: (&str, &str) = ("content-type", "text/plain");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_append_read_with_offsets_and_delete() {
    let s = server().await;
    let created = request(&s, "PUT", "/v1/stream/a", &[TEXT], b"hello").await;
    assert_eq!(created.status, 201);
    let again = request(&s, "PUT", "/v1/stream/a", &[TEXT], b"").await;
    assert_eq!(again.status, 200, "equal config is idempotent");
    let other = request(
        &s,
        "PUT",
        "/v1/stream/a",
        &[("content-type", "application/json")],
        b"",
    )
    .await;
    assert_eq!(other.status, 409, "another config conflicts");

    let appended = request(&s, "POST", "/v1/stream/a", &[TEXT], b" world").await;
    assert_eq!(appended.status, 204);
    let wrong_type = request(
        &s,
        "POST",
        "/v1/stream/a",
        &[("content-type", "application/octet-stream")],
        b"x",
    )
    .await;
    assert_eq!(wrong_type.status, 409);

    let read = request(&s, "GET", "/v1/stream/a", &[], b"").await;
    assert_eq!(read.status, 200);
    assert_eq!(read.body, b"hello world");
    assert_eq!(read.header("stream-up-to-date"), Some("true"));
    assert_eq!(read.header("content-type"), Some("text/plain"));
    let first_offset = created.header("stream-next-offset").expect("offset");
    let from = request(
        &s,
        "GET",
        &format!("/v1/stream/a?offset={first_offset}"),
        &[],
        b"",
    )
    .await;
    assert_eq!(from.body, b" world");
    assert_eq!(
        from.header("stream-next-offset"),
        read.header("stream-next-offset")
    );
    let etag = read.header("etag").expect("etag").to_owned();
    let cached = request(&s, "GET", "/v1/stream/a", &[("if-none-match", &etag)], b"").await;
    assert_eq!(cached.status, 304);
    let malformed = request(&s, "GET", "/v1/stream/a?offset=zz", &[], b"").await;
    assert_eq!(malformed.status, 400);

    let head = request(&s, "HEAD", "/v1/stream/a", &[], b"").await;
    assert_eq!(head.status, 200);
    assert_eq!(
        head.header("stream-next-offset"),
        read.header("stream-next-offset")
    );

    assert_eq!(
        request(&s, "DELETE", "/v1/stream/a", &[], b"").await.status,
        204
    );
    assert_eq!(
        request(&s, "GET", "/v1/stream/a", &[], b"").await.status,
        404
    );
    let recreated = request(&s, "PUT", "/v1/stream/a", &[TEXT], b"new").await;
    assert_eq!(recreated.status, 201);
    assert_eq!(
        request(&s, "GET", "/v1/stream/a", &[], b"").await.body,
        b"new"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_producer_and_close() {
    let s = server().await;
    assert_eq!(
        request(&s, "PUT", "/v1/stream/p", &[TEXT], b"")
            .await
            .status,
        201
    );
    let produce = |epoch: &'static str, seq: &'static str| {
        [
            TEXT,
            ("producer-id", "w1"),
            ("producer-epoch", epoch),
            ("producer-seq", seq),
        ]
    };
    let first = request(&s, "POST", "/v1/stream/p", &produce("0", "0"), b"a").await;
    assert_eq!(first.status, 200);
    let retry = request(&s, "POST", "/v1/stream/p", &produce("0", "0"), b"a").await;
    assert_eq!(retry.status, 204, "a retried seq is a duplicate");
    let gap = request(&s, "POST", "/v1/stream/p", &produce("0", "5"), b"c").await;
    assert_eq!(gap.status, 409);
    assert_eq!(gap.header("producer-expected-seq"), Some("1"));
    let next = request(&s, "POST", "/v1/stream/p", &produce("0", "1"), b"b").await;
    assert_eq!(next.status, 200);
    let bumped = request(&s, "POST", "/v1/stream/p", &produce("1", "0"), b"c").await;
    assert_eq!(bumped.status, 200);
    let stale = request(&s, "POST", "/v1/stream/p", &produce("0", "2"), b"d").await;
    assert_eq!(stale.status, 403);
    assert_eq!(stale.header("producer-epoch"), Some("1"));
    assert_eq!(
        request(&s, "GET", "/v1/stream/p", &[], b"").await.body,
        b"abc",
        "the duplicate was stored once"
    );

    let closed = request(
        &s,
        "POST",
        "/v1/stream/p",
        &[("stream-closed", "true")],
        b"",
    )
    .await;
    assert_eq!(closed.status, 204);
    assert_eq!(closed.header("stream-closed"), Some("true"));
    let refused = request(&s, "POST", "/v1/stream/p", &[TEXT], b"late").await;
    assert_eq!(refused.status, 409);
    let tail = request(&s, "GET", "/v1/stream/p", &[], b"").await;
    assert_eq!(tail.header("stream-closed"), Some("true"));
    let offset = tail.header("stream-next-offset").expect("offset");
    let poll = request(
        &s,
        "GET",
        &format!("/v1/stream/p?offset={offset}&live=long-poll"),
        &[],
        b"",
    )
    .await;
    assert_eq!(
        poll.status, 204,
        "a long-poll at the end of a closed stream"
    );
    assert_eq!(poll.header("stream-closed"), Some("true"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_poll_wakes_on_append_and_times_out_without_data() {
    let s = Arc::new(server().await);
    let created = request(&s, "PUT", "/v1/stream/l", &[TEXT], b"").await;
    let offset = created
        .header("stream-next-offset")
        .expect("offset")
        .to_owned();
    let path = format!("/v1/stream/l?offset={offset}&live=long-poll");
    let timed_out = request(&s, "GET", &path, &[], b"").await;
    assert_eq!(timed_out.status, 204);
    assert_eq!(
        timed_out.header("stream-next-offset"),
        Some(offset.as_str())
    );
    let waiter = {
        let s = s.clone();
        let path = path.clone();
        tokio::spawn(async move { request(&s, "GET", &path, &[], b"").await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    request(&s, "POST", "/v1/stream/l", &[TEXT], b"news").await;
    let woken = waiter.await.expect("waiter");
    assert_eq!(woken.status, 200);
    assert_eq!(woken.body, b"news");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_mode_flattens_arrays() {
    let s = server().await;
    let json = ("content-type", "application/json");
    assert_eq!(
        request(&s, "PUT", "/v1/stream/j", &[json], b"")
            .await
            .status,
        201
    );
    assert_eq!(
        request(&s, "POST", "/v1/stream/j", &[json], br#"[{"a":1},2]"#)
            .await
            .status,
        204
    );
    assert_eq!(
        request(&s, "POST", "/v1/stream/j", &[json], b"[]")
            .await
            .status,
        400
    );
    let read = request(&s, "GET", "/v1/stream/j", &[], b"").await;
    assert_eq!(read.body, br#"[{"a":1},2]"#);
}
