//! Durable Streams on a cluster of real `cellfleet node` processes: requests that reach a non-owner are served by the owner (routed over the mTLS peer channel), the peer service runs unsigned node requests only for the stream kinds, and `kill -9` of a stream's owner under concurrent appends loses no acknowledged append.

mod cluster_common;

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cellfleet_proto::v1;
use cellfleet_proto::v1::peer_client::PeerClient;
use cellfleet_router::tls::{self, TlsIdentity};
use cluster_common::{error_code, metric, Cluster, Store, BIN};

/// One HTTP/1.1 exchange's answer.
#[derive(Debug)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn next_offset(&self) -> u64 {
        let text = self
            .header("stream-next-offset")
            .expect("Stream-Next-Offset");
        cellfleet_streams::offset::parse(text).expect("a wire offset")
    }
}

/// Why an exchange has no answer.
#[derive(Debug)]
enum Failed {
    /// The connection was refused: the request never left.
    NotSent(String),
    /// The connection broke after the request may have been sent.
    Lost(String),
}

fn decode_chunked(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(end) = body.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size_text = std::str::from_utf8(&body[..end]).unwrap_or("0");
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("0").trim(), 16)
            .unwrap_or(0);
        if size == 0 || body.len() < end + 2 + size {
            return out;
        }
        out.extend_from_slice(&body[end + 2..end + 2 + size]);
        body = &body[(end + 4 + size).min(body.len())..];
    }
}

/// A blocking HTTP/1.1 request on a fresh connection (`Connection: close`).
fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<Reply, Failed> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| Failed::NotSent(e.to_string()))?;
    let lost = |e: std::io::Error| Failed::Lost(e.to_string());
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(lost)?;
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).map_err(lost)?;
    stream.write_all(body).map_err(lost)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).map_err(lost)?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| Failed::Lost(format!("no response head in {} bytes", raw.len())))?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| Failed::Lost(format!("bad status line in {head:?}")))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers.iter().any(|(n, v)| {
        n.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
    });
    if chunked {
        body = decode_chunked(&body);
    }
    Ok(Reply {
        status,
        headers,
        body,
    })
}

fn streams_addr(cluster: &Cluster, index: usize) -> SocketAddr {
    cluster.nodes[index]
        .streams
        .expect("the node serves Durable Streams")
}

/// The owner of each stream Cell, asked through `via`'s admin service.
fn stream_owners(cluster: &Cluster, via: SocketAddr) -> HashMap<String, (String, u64)> {
    let output = std::process::Command::new(BIN)
        .arg("cells")
        .arg("--config")
        .arg(cluster.path("client.toml"))
        .arg("--node")
        .arg(via.to_string())
        .arg("--json")
        .output()
        .expect("run cellfleet cells");
    assert!(
        output.status.success(),
        "cellfleet cells: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let value: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
    value["cells"]
        .as_array()
        .expect("cells")
        .iter()
        .filter(|c| c["kind"] == "stream")
        .map(|c| {
            (
                c["key"].as_str().expect("key").to_owned(),
                (
                    c["owner"].as_str().unwrap_or("").to_owned(),
                    c["epoch"].as_u64().unwrap_or(0),
                ),
            )
        })
        .collect()
}

/// Reads the whole stream at `path` through `addr` (catch-up pages),
/// retrying unavailable answers for a bounded time.
fn read_all(addr: SocketAddr, path: &str) -> Vec<u8> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut data = Vec::new();
    let mut offset = "-1".to_owned();
    loop {
        match http(addr, "GET", &format!("{path}?offset={offset}"), &[], b"") {
            Ok(reply) if reply.status == 200 => {
                data.extend_from_slice(&reply.body);
                let next = reply.header("stream-next-offset").expect("next offset");
                assert_eq!(
                    cellfleet_streams::offset::parse(next),
                    Some(data.len() as u64),
                    "a catch-up page ends where its bytes end"
                );
                if reply.header("stream-up-to-date") == Some("true") {
                    return data;
                }
                offset = next.to_owned();
            }
            other if Instant::now() < deadline => {
                let _ = other;
                std::thread::sleep(Duration::from_millis(200));
            }
            other => panic!("reading {path} via {addr}: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_requests_reach_the_owner_through_any_node() {
    let cluster = Cluster::start(3, Store::Local, 5_000);
    let nodes = cluster.nodes.len();
    let paths: Vec<String> = (0..6).map(|i| format!("/route-{i}")).collect();
    let text = [("content-type", "text/plain")];
    tokio::task::block_in_place(|| {
        for path in &paths {
            let reply = http(streams_addr(&cluster, 0), "PUT", path, &text, b"").expect("create");
            assert_eq!(reply.status, 201, "{path}: {reply:?}");
        }
        // Every node appends to every stream and reads it back whole.
        for round in 0..nodes {
            for path in &paths {
                let message = format!("{round};");
                let reply = http(
                    streams_addr(&cluster, round),
                    "POST",
                    path,
                    &text,
                    message.as_bytes(),
                )
                .expect("append");
                assert!(
                    reply.status / 100 == 2,
                    "{path} via node {round}: {reply:?}"
                );
                assert_eq!(reply.next_offset(), 2 * (round as u64 + 1), "{path}");
            }
        }
        for index in 0..nodes {
            for path in &paths {
                assert_eq!(read_all(streams_addr(&cluster, index), path), b"0;1;2;");
            }
        }
    });
    // The streams were spread over the cluster, so most requests above
    // reached a non-owner and were routed.
    let owners = stream_owners(&cluster, cluster.nodes[1].client);
    assert_eq!(owners.len(), paths.len(), "{owners:?}");
    let distinct: HashSet<&str> = owners.values().map(|(o, _)| o.as_str()).collect();
    assert!(distinct.len() >= 2, "every stream on one node: {owners:?}");
    let (owned_path, (owner, _)) = owners.iter().next().expect("an owned stream");
    let owner_index = cluster
        .nodes
        .iter()
        .position(|n| n.id == *owner)
        .expect("owner is a node");
    let other = (owner_index + 1) % nodes;
    let third = (owner_index + 2) % nodes;
    // A long-poll on a non-owner sees an append made on the owner, then
    // one made through the third node: the reader's node watches the
    // stream's Cell at its owner, which answers when it acknowledges an
    // append, whichever node it came through.
    let owner_wakes = || {
        tokio::task::block_in_place(|| {
            metric(
                &cluster.nodes[owner_index],
                "cellfleet_runtime_watch_wakes_total",
            )
        })
    };
    let reader = streams_addr(&cluster, other);
    let mut tail = 6;
    for (writer, message) in [(owner_index, "late;"), (third, "later;")] {
        let path = owned_path.clone();
        let at = cellfleet_streams::offset::format(tail);
        let poll = std::thread::spawn(move || {
            http(
                reader,
                "GET",
                &format!("{path}?offset={at}&live=long-poll"),
                &[],
                b"",
            )
        });
        // The reader's node has its watch open at the owner by now (its
        // first answer, which wakes no append, came at once).
        tokio::task::block_in_place(|| std::thread::sleep(Duration::from_millis(300)));
        let wakes_before = owner_wakes();
        tokio::task::block_in_place(|| {
            let writer = streams_addr(&cluster, writer);
            let reply =
                http(writer, "POST", owned_path, &text, message.as_bytes()).expect("append");
            assert!(reply.status / 100 == 2, "{reply:?}");
        });
        let polled = poll.join().expect("long-poll thread").expect("long-poll");
        assert!(
            polled.status == 200 && polled.body == message.as_bytes(),
            "long-poll through a non-owner: {polled:?}"
        );
        // The owner answered the reader's node's open watch with the append.
        let wakes = owner_wakes();
        assert!(
            wakes > wakes_before,
            "the owner woke no watch for the append through node {writer}"
        );
        tail += message.len() as u64;
    }

    // The peer service runs unsigned node requests for the stream kinds
    // only, and only for node certificates.
    let identity = |cert: &str, key: &str| {
        TlsIdentity::load(
            &cluster.path("certs/ca.pem"),
            &cluster.path(cert),
            &cluster.path(key),
        )
        .expect("identity")
    };
    let as_node =
        tls::client_config(&identity("certs/node-n2.pem", "certs/node-n2.key")).expect("tls");
    let peer = cluster.nodes[0].peer;
    let channel =
        cellfleet_router::transport::channel(peer, "127.0.0.1", as_node, Duration::from_secs(2))
            .expect("channel");
    let node_command =
        |kind: &str, key: &str, command: &str, args: serde_json::Value| v1::ForwardRequest {
            request: Some(v1::forward_request::Request::NodeCommand(v1::NodeCommand {
                kind: kind.into(),
                key: key.as_bytes().to_vec(),
                command: command.into(),
                args_json: args.to_string().into_bytes(),
                command_id: rand::random::<[u8; 16]>().to_vec(),
                expires_at_ms: cluster_common::now_ms() + 60_000,
            })),
            hops: 1,
            ingress_node_id: "n2".into(),
            deadline_unix_ms: 0,
            ingress_verified: false,
            root_absent: false,
        };
    let refused = PeerClient::new(channel.clone())
        .forward(node_command(
            "kv",
            "k",
            "put",
            serde_json::json!({"key": "a", "value": "b"}),
        ))
        .await
        .expect_err("an unsigned kv command must be refused");
    assert_eq!(
        error_code(&refused),
        Some(v1::ErrorCode::Unauthorized),
        "{refused:?}"
    );
    let as_client =
        tls::client_config(&identity("certs/client-dev.pem", "certs/client-dev.key")).expect("tls");
    let client_channel =
        cellfleet_router::transport::channel(peer, "127.0.0.1", as_client, Duration::from_secs(2))
            .expect("channel");
    let stream_query = v1::ForwardRequest {
        request: Some(v1::forward_request::Request::NodeQuery(v1::NodeQuery {
            kind: "stream".into(),
            key: paths[0].as_bytes().to_vec(),
            query: "read".into(),
            args_json: serde_json::json!({"offset": 0, "now_ms": cluster_common::now_ms()})
                .to_string()
                .into_bytes(),
        })),
        hops: 1,
        ingress_node_id: "n2".into(),
        deadline_unix_ms: 0,
        ingress_verified: false,
        root_absent: false,
    };
    // The same node request for a stream runs (on the owner) or answers
    // NOT_OWNER: it is never refused for its kind.
    match PeerClient::new(channel.clone())
        .forward(stream_query.clone())
        .await
    {
        Ok(response) => assert!(response.into_inner().response.is_some()),
        Err(status) => assert_eq!(
            error_code(&status),
            Some(v1::ErrorCode::NotOwner),
            "{status:?}"
        ),
    }
    // A watch is a node request too: refused for any other kind.
    let watch = |kind: &str| v1::ForwardRequest {
        request: Some(v1::forward_request::Request::NodeWatch(v1::NodeWatch {
            kind: kind.into(),
            key: paths[0].as_bytes().to_vec(),
            after_txid: 0,
            wait_ms: 100,
        })),
        hops: 1,
        ingress_node_id: "n2".into(),
        deadline_unix_ms: 0,
        ingress_verified: false,
        root_absent: false,
    };
    let refused = PeerClient::new(channel.clone())
        .forward(watch("kv"))
        .await
        .expect_err("an unsigned kv watch must be refused");
    assert_eq!(
        error_code(&refused),
        Some(v1::ErrorCode::Unauthorized),
        "{refused:?}"
    );
    match PeerClient::new(channel.clone())
        .forward(watch("stream"))
        .await
    {
        Ok(response) => assert!(matches!(
            response.into_inner().response,
            Some(v1::forward_response::Response::Watch(v1::NodeWatchResponse { txid })) if txid > 0
        )),
        Err(status) => assert_eq!(
            error_code(&status),
            Some(v1::ErrorCode::NotOwner),
            "{status:?}"
        ),
    }
    let not_a_node = PeerClient::new(client_channel.clone())
        .forward(watch("stream"))
        .await;
    assert!(
        not_a_node.is_err(),
        "a client certificate reached the peer service: {not_a_node:?}"
    );
    let not_a_node = PeerClient::new(client_channel)
        .forward(stream_query.clone())
        .await;
    assert!(
        not_a_node.is_err(),
        "a client certificate reached the peer service: {not_a_node:?}"
    );
}

/// What one append's request got.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Fate {
    /// 2xx with this Stream-Next-Offset.
    Acked(u64),
    /// Refused before it was sent, or answered with a definite failure.
    Failed(String),
    /// Maybe applied: a broken connection after sending, or 503 "outcome unknown".
    Maybe(String),
}

const MESSAGE_BYTES: usize = 10;

fn message(writer: usize, seq: usize) -> String {
    let text = format!("w{writer}-{seq:06};");
    assert_eq!(text.len(), MESSAGE_BYTES);
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_a_stream_owner_under_appends_loses_no_acknowledged_append() {
    let mut cluster = Cluster::start(3, Store::Local, 2_000);
    let path = "/crash";
    let text = [("content-type", "text/plain")];
    let created = tokio::task::block_in_place(|| {
        http(streams_addr(&cluster, 0), "PUT", path, &text, b"").expect("create")
    });
    assert_eq!(created.status, 201, "{created:?}");
    let owners = tokio::task::block_in_place(|| stream_owners(&cluster, cluster.nodes[0].client));
    let owner_name = owners.get(path).expect("the stream has an owner").0.clone();
    let victim = cluster
        .nodes
        .iter()
        .position(|n| n.id == owner_name)
        .expect("the owner is a node");
    let survivors: Vec<usize> = (0..cluster.nodes.len()).filter(|&i| i != victim).collect();
    let survivor_addrs: Vec<SocketAddr> = survivors
        .iter()
        .map(|&i| streams_addr(&cluster, i))
        .collect();

    // Four writers: two through the owner, two through a non-owner. A
    // writer whose node is gone moves to a survivor.
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicUsize::new(0));
    let log: Arc<Mutex<Vec<(usize, usize, Fate)>>> = Arc::new(Mutex::new(Vec::new()));
    let mut writers = Vec::new();
    for writer in 0..4 {
        let first = if writer < 2 {
            streams_addr(&cluster, victim)
        } else {
            survivor_addrs[0]
        };
        let fallback = survivor_addrs[writer % survivor_addrs.len()];
        let (stop, acked, log) = (stop.clone(), acked.clone(), log.clone());
        writers.push(std::thread::spawn(move || {
            let mut target = first;
            let mut seq = 0;
            while !stop.load(Ordering::SeqCst) {
                let body = message(writer, seq);
                let fate = match http(target, "POST", path, &text, body.as_bytes()) {
                    Ok(reply) if reply.status / 100 == 2 => {
                        acked.fetch_add(1, Ordering::SeqCst);
                        Fate::Acked(reply.next_offset())
                    }
                    Ok(reply) => {
                        let why = String::from_utf8_lossy(&reply.body).into_owned();
                        if reply.status == 503 && why.starts_with("outcome unknown") {
                            Fate::Maybe(why)
                        } else {
                            Fate::Failed(format!("{}: {why}", reply.status))
                        }
                    }
                    Err(Failed::NotSent(why)) => {
                        target = fallback;
                        Fate::Failed(why)
                    }
                    Err(Failed::Lost(why)) => {
                        target = fallback;
                        Fate::Maybe(why)
                    }
                };
                if matches!(fate, Fate::Failed(_) | Fate::Maybe(_)) {
                    std::thread::sleep(Duration::from_millis(50));
                }
                log.lock().expect("log").push((writer, seq, fate));
                seq += 1;
            }
        }));
    }
    let wait_for = |count: usize, what: &str| {
        let deadline = Instant::now() + Duration::from_secs(40);
        while acked.load(Ordering::SeqCst) < count {
            assert!(
                Instant::now() < deadline,
                "{what}: only {} appends acknowledged",
                acked.load(Ordering::SeqCst)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let before_kill = tokio::task::block_in_place(|| {
        wait_for(40, "before the kill");
        cluster.kill9(victim);
        acked.load(Ordering::SeqCst)
    });
    // Appends resume once the lease expired and a survivor took the stream over.
    tokio::task::block_in_place(|| wait_for(before_kill + 40, "after the takeover"));
    stop.store(true, Ordering::SeqCst);
    for writer in writers {
        writer.join().expect("writer");
    }
    let log = log.lock().expect("log").clone();
    let data = tokio::task::block_in_place(|| read_all(survivor_addrs[1], path));

    // The stream is whole messages, each sent by a writer, none twice.
    assert_eq!(data.len() % MESSAGE_BYTES, 0, "torn data: {data:?}");
    let fates: HashMap<String, &Fate> = log
        .iter()
        .map(|(w, s, fate)| (message(*w, *s), fate))
        .collect();
    let mut seen: HashSet<&[u8]> = HashSet::new();
    let mut last_seq: HashMap<usize, usize> = HashMap::new();
    for (index, chunk) in data.chunks(MESSAGE_BYTES).enumerate() {
        let text = std::str::from_utf8(chunk).expect("utf-8");
        let fate = fates
            .get(text)
            .unwrap_or_else(|| panic!("{text:?} at {index} was never sent"));
        assert!(seen.insert(chunk), "{text:?} appears twice");
        // Only an acknowledged or possibly-applied append may appear.
        assert!(
            !matches!(fate, Fate::Failed(_)),
            "{text:?} appears although its append failed: {fate:?}"
        );
        let (writer, seq) = log
            .iter()
            .find(|(w, s, _)| message(*w, *s) == text)
            .map(|(w, s, _)| (*w, *s))
            .expect("logged");
        if let Some(previous) = last_seq.insert(writer, seq) {
            assert!(previous < seq, "writer {writer}: {seq} after {previous}");
        }
    }
    // Every acknowledged append sits at its acknowledged offset, and no
    // two acknowledgements name the same offset.
    let mut offsets = HashSet::new();
    let mut acked_total = 0;
    let mut maybe_total = 0;
    let mut failed_total = 0;
    for (writer, seq, fate) in &log {
        match fate {
            Fate::Acked(next) => {
                acked_total += 1;
                assert!(offsets.insert(*next), "offset {next} acknowledged twice");
                let end = usize::try_from(*next).expect("offset");
                assert!(end >= MESSAGE_BYTES && end <= data.len(), "offset {end}");
                assert_eq!(
                    &data[end - MESSAGE_BYTES..end],
                    message(*writer, *seq).as_bytes(),
                    "acknowledged append of writer {writer} seq {seq} is not at {end}"
                );
            }
            Fate::Maybe(_) => maybe_total += 1,
            Fate::Failed(_) => failed_total += 1,
        }
    }
    eprintln!(
        "kill -9 of {owner_name}: {acked_total} acknowledged ({before_kill} before the kill), \
         {maybe_total} unknown, {failed_total} failed; {} messages in the stream",
        data.len() / MESSAGE_BYTES
    );
    // The stream moved to a survivor at a later epoch.
    let owners =
        tokio::task::block_in_place(|| stream_owners(&cluster, cluster.nodes[survivors[0]].client));
    let (owner, epoch) = owners.get(path).expect("owned after the takeover");
    assert_ne!(*owner, owner_name, "the dead node still owns the stream");
    assert!(*epoch >= 2, "the stream was not taken over: epoch {epoch}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ingress_only_node_serves_streams_it_never_owns() {
    let mut cluster = Cluster::start(3, Store::Local, 5_000);
    // Restart n1 as an ingress-only node (a clean drain first, so its
    // old lease is retired).
    assert!(cluster.terminate(0), "n1 did not drain");
    let child = cluster
        .node_command(&cluster.path("n1.toml"), &[])
        .env("CELLFLEET_INGRESS_ONLY", "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn n1");
    cluster.nodes[0] = cluster.wait_ready("n1", child);
    let ingress = streams_addr(&cluster, 0);
    let text = [("content-type", "text/plain")];
    let paths: Vec<String> = (0..12).map(|i| format!("/ingress-{i}")).collect();
    tokio::task::block_in_place(|| {
        for path in &paths {
            let created = http(ingress, "PUT", path, &text, b"").expect("create");
            assert_eq!(created.status, 201, "{path}: {created:?}");
            let appended = http(ingress, "POST", path, &text, b"x;").expect("append");
            assert!(appended.status / 100 == 2, "{path}: {appended:?}");
            assert_eq!(read_all(ingress, path), b"x;");
        }
    });
    let owners = stream_owners(&cluster, cluster.nodes[1].client);
    assert_eq!(owners.len(), paths.len(), "{owners:?}");
    for (path, (owner, _)) in &owners {
        assert!(
            owner == "n2" || owner == "n3",
            "{path} is owned by {owner:?}, not by a placement node"
        );
    }
}
