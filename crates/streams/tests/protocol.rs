//! Durable Streams protocol behaviour through real HTTP against an in-process node on the local-directory store.

use std::sync::Arc;
use std::time::Duration;

use cellfleet_streams::StreamsConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod common;

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

type Server = common::TestServer;

async fn server() -> Server {
    server_with(StreamsConfig {
        long_poll_timeout: Duration::from_millis(300),
        ..StreamsConfig::default()
    })
    .await
}

async fn server_with(streams_config: StreamsConfig) -> Server {
    common::start("streams-test", streams_config).await
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

/// A body over the limit is refused with 413 after the server has read it,
/// so a client still sending it hears the refusal instead of a reset
/// connection (the conformance suite's 10 MB append saw EPIPE through a
/// non-owner); nothing of it is appended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_append_is_read_then_refused_with_413() {
    let s = server_with(StreamsConfig {
        body_bytes_max: 64 << 10,
        ..StreamsConfig::default()
    })
    .await;
    let created = request(&s, "PUT", "/v1/stream/big", &[TEXT], b"").await;
    assert_eq!(created.status, 201);
    let huge = vec![b'x'; 16 << 20];
    let refused = request(&s, "POST", "/v1/stream/big", &[TEXT], &huge).await;
    assert_eq!(refused.status, 413);
    let read = request(&s, "GET", "/v1/stream/big?offset=-1", &[], b"").await;
    assert_eq!(read.status, 200);
    assert!(read.body.is_empty(), "{} bytes appended", read.body.len());
}

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

/// Correctness item: an append whose publication's fate is unknown (the
/// root CAS landed, its reply and the re-read were lost) is settled by the
/// front end, which owns the command id: it sends the same command again
/// and answers with the stored outcome. The data is there once, and the
/// client never sees the 503 that invited a second append.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_with_an_unknown_outcome_is_settled_before_the_client_hears() {
    use cellfleet_store::{Fault, FaultStore, ObjectStore, Op};
    let mut faults = None;
    let s = common::start_with("settle", StreamsConfig::default(), |inner| {
        let store = Arc::new(FaultStore::new(inner));
        faults = Some(store.clone());
        store as Arc<dyn ObjectStore>
    })
    .await;
    let faults = faults.expect("wrapped");
    let created = request(&s, "PUT", "/v1/stream/settle", &[TEXT], b"a").await;
    assert_eq!(created.status, 201);
    // The next root CAS lands but its reply is lost, and so is the re-read.
    faults.inject(Fault::lose_reply(Op::PutIfMatch).key_prefix("settle/cells/"));
    faults.inject(Fault::unavailable(Op::Get).key_prefix("settle/cells/"));
    let appended = request(&s, "POST", "/v1/stream/settle", &[TEXT], b"b").await;
    assert_eq!(
        appended.status,
        204,
        "{}",
        String::from_utf8_lossy(&appended.body)
    );
    let read = request(&s, "GET", "/v1/stream/settle", &[], b"").await;
    assert_eq!(read.body, b"ab", "appended exactly once");
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

async fn status(s: &Server, method: &str, path: &str, headers: &[(&str, &str)]) -> u16 {
    request(s, method, path, headers, b"").await.status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_forked_source_is_soft_until_its_last_fork_goes() {
    let s = server().await;
    assert_eq!(
        request(&s, "PUT", "/v1/stream/s", &[TEXT], b"base")
            .await
            .status,
        201
    );
    let from_s = [TEXT, ("stream-forked-from", "/v1/stream/s")];
    assert_eq!(status(&s, "PUT", "/v1/stream/f", &from_s).await, 201);
    let from_f = [TEXT, ("stream-forked-from", "/v1/stream/f")];
    assert_eq!(status(&s, "PUT", "/v1/stream/g", &from_f).await, 201);
    assert_eq!(
        request(&s, "POST", "/v1/stream/g", &[TEXT], b"+g")
            .await
            .status,
        204
    );

    // The source has a fork: deleting it only marks it deleted.
    assert_eq!(status(&s, "DELETE", "/v1/stream/s", &[]).await, 204);
    assert_eq!(status(&s, "HEAD", "/v1/stream/s", &[]).await, 410);
    assert_eq!(status(&s, "GET", "/v1/stream/s?offset=-1", &[]).await, 410);
    let post = request(&s, "POST", "/v1/stream/s", &[TEXT], b"late").await;
    assert_eq!(post.status, 410);
    assert_eq!(status(&s, "DELETE", "/v1/stream/s", &[]).await, 410);
    assert_eq!(
        status(&s, "PUT", "/v1/stream/s", &[TEXT]).await,
        409,
        "the path stays taken while forks exist"
    );
    assert_eq!(
        status(&s, "PUT", "/v1/stream/f2", &from_s).await,
        409,
        "no new fork of a deleted source"
    );
    let fork = request(&s, "GET", "/v1/stream/f?offset=-1", &[], b"").await;
    assert_eq!(fork.status, 200);
    assert_eq!(fork.body, b"base");

    // The middle of the chain, deleted, stays for its own fork.
    assert_eq!(status(&s, "DELETE", "/v1/stream/f", &[]).await, 204);
    assert_eq!(status(&s, "HEAD", "/v1/stream/f", &[]).await, 410);
    assert_eq!(status(&s, "HEAD", "/v1/stream/s", &[]).await, 410);
    let leaf = request(&s, "GET", "/v1/stream/g?offset=-1", &[], b"").await;
    assert_eq!(leaf.body, b"base+g");

    // The last fork goes: the deleted chain above it goes with it.
    assert_eq!(status(&s, "DELETE", "/v1/stream/g", &[]).await, 204);
    for path in ["/v1/stream/g", "/v1/stream/f", "/v1/stream/s"] {
        assert_eq!(status(&s, "HEAD", path, &[]).await, 404, "{path}");
    }
    assert_eq!(
        request(&s, "PUT", "/v1/stream/s", &[TEXT], b"new")
            .await
            .status,
        201,
        "the path is free again"
    );
    assert_eq!(
        request(&s, "GET", "/v1/stream/s", &[], b"").await.body,
        b"new"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_whose_forks_are_gone_is_deleted_at_once() {
    let s = server().await;
    request(&s, "PUT", "/v1/stream/s", &[TEXT], b"x").await;
    let from_s = [TEXT, ("stream-forked-from", "/v1/stream/s")];
    assert_eq!(status(&s, "PUT", "/v1/stream/f1", &from_s).await, 201);
    assert_eq!(status(&s, "PUT", "/v1/stream/f2", &from_s).await, 201);
    assert_eq!(status(&s, "DELETE", "/v1/stream/f1", &[]).await, 204);
    assert_eq!(status(&s, "DELETE", "/v1/stream/f2", &[]).await, 204);
    assert_eq!(status(&s, "HEAD", "/v1/stream/s", &[]).await, 200);
    assert_eq!(status(&s, "DELETE", "/v1/stream/s", &[]).await, 204);
    assert_eq!(status(&s, "HEAD", "/v1/stream/s", &[]).await, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recreating_a_fork_compares_its_lineage() {
    let s = server().await;
    request(&s, "PUT", "/v1/stream/s", &[TEXT], b"hello").await;
    request(&s, "PUT", "/v1/stream/t", &[TEXT], b"hello").await;
    let zero = "0000000000000000_0000000000000000";
    let fork = |source: &'static str, sub: &'static str| {
        [
            TEXT,
            ("stream-forked-from", source),
            ("stream-fork-offset", zero),
            ("stream-fork-sub-offset", sub),
        ]
    };
    assert_eq!(
        status(&s, "PUT", "/v1/stream/f", &fork("/v1/stream/s", "2")).await,
        201
    );
    assert_eq!(
        request(&s, "GET", "/v1/stream/f", &[], b"").await.body,
        b"he"
    );
    assert_eq!(
        status(&s, "PUT", "/v1/stream/f", &fork("/v1/stream/s", "2")).await,
        200,
        "the same fork again"
    );
    assert_eq!(
        status(&s, "PUT", "/v1/stream/f", &fork("/v1/stream/s", "3")).await,
        409,
        "another sub-offset"
    );
    assert_eq!(
        status(&s, "PUT", "/v1/stream/f", &fork("/v1/stream/t", "2")).await,
        409,
        "another source"
    );
    assert_eq!(
        status(&s, "PUT", "/v1/stream/f", &[TEXT]).await,
        409,
        "not a fork"
    );

    // The same fork again once its source is deleted: still the same fork.
    assert_eq!(status(&s, "DELETE", "/v1/stream/s", &[]).await, 204);
    assert_eq!(
        status(&s, "PUT", "/v1/stream/f", &fork("/v1/stream/s", "2")).await,
        200
    );

    // A fork refused at an occupied path leaves no reference behind.
    request(&s, "PUT", "/v1/stream/u", &[TEXT], b"u").await;
    request(
        &s,
        "PUT",
        "/v1/stream/busy",
        &[("content-type", "application/json")],
        b"",
    )
    .await;
    let from_u = [("stream-forked-from", "/v1/stream/u")];
    assert_eq!(status(&s, "PUT", "/v1/stream/busy", &from_u).await, 409);
    assert_eq!(status(&s, "DELETE", "/v1/stream/u", &[]).await, 204);
    assert_eq!(status(&s, "HEAD", "/v1/stream/u", &[]).await, 404);
}

/// Sends `GET path` and returns the open connection once the response
/// head and first bytes of the body arrived.
async fn open(s: &Server, path: &str) -> (tokio::net::TcpStream, String) {
    let mut stream = tokio::net::TcpStream::connect(s.address)
        .await
        .expect("connect");
    let head = format!("GET {path} HTTP/1.1\r\nhost: test\r\n\r\n");
    stream.write_all(head.as_bytes()).await.expect("write");
    let mut seen = Vec::new();
    let mut buffer = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("event: control") {
        let n = stream.read(&mut buffer).await.expect("read");
        assert!(n > 0, "connection closed early");
        seen.extend_from_slice(&buffer[..n]);
    }
    (stream, String::from_utf8_lossy(&seen).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_reads_past_the_node_bound_get_503_with_retry_after() {
    let s = Arc::new(
        server_with(StreamsConfig {
            long_poll_timeout: Duration::from_secs(60),
            long_polls_max: 1,
            sse_max: 1,
            ..StreamsConfig::default()
        })
        .await,
    );
    let created = request(&s, "PUT", "/v1/stream/w", &[TEXT], b"").await;
    let tail = created
        .header("stream-next-offset")
        .expect("offset")
        .to_owned();
    // A long-poll at the end of a closed stream answers at once: a probe
    // that needs a permit but never waits.
    let closed = request(
        &s,
        "PUT",
        "/v1/stream/c",
        &[TEXT, ("stream-closed", "true")],
        b"",
    )
    .await;
    let probe = format!(
        "/v1/stream/c?offset={}&live=long-poll",
        closed.header("stream-next-offset").expect("offset")
    );
    assert_eq!(status(&s, "GET", &probe, &[]).await, 204);

    let wait = || {
        let s = s.clone();
        let path = format!("/v1/stream/w?offset={tail}&live=long-poll");
        tokio::spawn(async move { request(&s, "GET", &path, &[], b"").await })
    };
    let mut waiter = wait();
    // Once the waiter holds the only permit, the probe is refused (the
    // waiter itself is refused when it comes while a probe holds it).
    let mut refused = None;
    for _ in 0..1_000 {
        if waiter.is_finished() {
            let early = waiter.await.expect("waiter");
            assert_eq!(early.status, 503, "a waiter ends early only when refused");
            waiter = wait();
        }
        let reply = request(&s, "GET", &probe, &[], b"").await;
        if reply.status == 503 {
            refused = Some(reply);
            break;
        }
        assert_eq!(reply.status, 204);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let refused = refused.expect("a second long-poll is refused");
    assert_eq!(refused.header("retry-after"), Some("1"));
    request(&s, "POST", "/v1/stream/w", &[TEXT], b"go").await;
    let woken = waiter.await.expect("waiter");
    assert_eq!(woken.status, 200);
    assert_eq!(woken.body, b"go");
    assert_eq!(
        status(&s, "GET", &probe, &[]).await,
        204,
        "the permit came back"
    );

    let sse = "/v1/stream/w?offset=-1&live=sse";
    let (first, events) = open(&s, sse).await;
    assert!(events.contains("go"), "{events}");
    let second = request(&s, "GET", sse, &[], b"").await;
    assert_eq!(second.status, 503);
    assert_eq!(second.header("retry-after"), Some("1"));
    drop(first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_source_goes_once_its_last_fork_expired() {
    let s = server().await;
    request(&s, "PUT", "/v1/stream/s", &[TEXT], b"x").await;
    let short_fork = [
        TEXT,
        ("stream-forked-from", "/v1/stream/s"),
        ("stream-ttl", "1"),
    ];
    assert_eq!(status(&s, "PUT", "/v1/stream/f", &short_fork).await, 201);
    assert_eq!(status(&s, "DELETE", "/v1/stream/s", &[]).await, 204);
    // Each 410 starts a sweep of the source's fork references; once the
    // fork has expired, a sweep gives its reference back and the source goes.
    let mut last = 0;
    for _ in 0..200 {
        last = status(&s, "HEAD", "/v1/stream/s", &[]).await;
        if last == 404 {
            break;
        }
        assert_eq!(last, 410);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(last, 404, "the source outlived its expired fork");
    assert_eq!(status(&s, "HEAD", "/v1/stream/f", &[]).await, 404);
    assert_eq!(
        status(&s, "PUT", "/v1/stream/s", &[TEXT]).await,
        201,
        "the path is free again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_over_the_bound_is_answered_503_not_dropped() {
    let s = server_with(StreamsConfig {
        connections_max: 1,
        ..StreamsConfig::default()
    })
    .await;
    // Hold the only permit: a connection that has not sent its request.
    let held = tokio::net::TcpStream::connect(s.address)
        .await
        .expect("connect");
    // The accept loop takes connections in order; give it the first one.
    let mut refused = None;
    for _ in 0..50 {
        let reply = request(&s, "HEAD", "/v1/stream/none", &[], b"").await;
        if reply.status == 503 {
            refused = Some(reply);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let refused = refused.expect("a second connection is refused with 503");
    assert_eq!(refused.header("retry-after"), Some("1"));
    drop(held);
    // Once the held connection is gone, requests are served again.
    let mut last = 503;
    for _ in 0..100 {
        last = request(&s, "HEAD", "/v1/stream/none", &[], b"")
            .await
            .status;
        if last != 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(last, 404);
}

/// A hundred long-polls waiting at a stream's tail are all answered by one
/// append, and share the read that follows it: the server runs a few
/// queries for them, not one each (it used to run one per reader per
/// append, plus one per reader per re-check).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_polls_at_one_tail_share_the_read_after_a_wake() {
    use std::sync::atomic::Ordering;
    let (s, counts) = common::start_counting(
        "streams-test",
        StreamsConfig {
            long_poll_timeout: Duration::from_secs(5),
            ..StreamsConfig::default()
        },
    )
    .await;
    let queries = counts.queries;
    let s = Arc::new(s);
    let created = request(&s, "PUT", "/v1/stream/fan", &[TEXT], b"").await;
    let offset = created
        .header("stream-next-offset")
        .expect("offset")
        .to_owned();
    let path = format!("/v1/stream/fan?offset={offset}&live=long-poll");
    const READERS: usize = 100;
    let waiters: Vec<_> = (0..READERS)
        .map(|_| {
            let (s, path) = (s.clone(), path.clone());
            tokio::spawn(async move { request(&s, "GET", &path, &[], b"").await })
        })
        .collect();
    // Every reader has read once and waits.
    let settled = tokio::time::Instant::now() + Duration::from_secs(10);
    while queries.load(Ordering::SeqCst) < READERS && tokio::time::Instant::now() < settled {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = queries.load(Ordering::SeqCst);
    request(&s, "POST", "/v1/stream/fan", &[TEXT], b"news").await;
    for waiter in waiters {
        let woken = waiter.await.expect("waiter");
        assert_eq!((woken.status, woken.body.as_slice()), (200, &b"news"[..]));
    }
    let after = queries.load(Ordering::SeqCst);
    assert!(
        after - before < READERS / 3,
        "{} queries answered {READERS} woken long-polls",
        after - before
    );
}

/// Reads of a TTL stream slide its TTL without a publication per read: a
/// touch is published only once the slide would move the stored expiry
/// past the slack (a twentieth of the TTL, at most 1 s). The TTL is long
/// enough for the widest slack, so the 20 reads fall inside it even on a
/// loaded machine (with a 2 s TTL they had 100 ms, and a busy CI run once
/// took longer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_of_a_ttl_stream_publish_a_touch_only_past_the_slack() {
    use std::sync::atomic::Ordering;
    let (s, counts) = common::start_counting("streams-test", StreamsConfig::default()).await;
    let ttl = ("stream-ttl", "20");
    assert_eq!(
        request(&s, "PUT", "/v1/stream/ttl", &[TEXT, ttl], b"a")
            .await
            .status,
        201
    );
    let before = counts.commands.load(Ordering::SeqCst);
    for _ in 0..20 {
        assert_eq!(
            request(&s, "GET", "/v1/stream/ttl?offset=-1", &[], b"")
                .await
                .status,
            200
        );
    }
    let quick = counts.commands.load(Ordering::SeqCst) - before;
    assert!(quick <= 1, "{quick} touches for 20 reads within the slack");
    // Past the slack (1 s for a 20 s TTL) the next read touches.
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    let before = counts.commands.load(Ordering::SeqCst);
    assert_eq!(
        request(&s, "GET", "/v1/stream/ttl?offset=-1", &[], b"")
            .await
            .status,
        200
    );
    assert_eq!(
        counts.commands.load(Ordering::SeqCst) - before,
        1,
        "one touch"
    );
}
