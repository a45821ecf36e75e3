//! The node log's crash/seal race with real processes: an owner is paused between its segment PUT and the reply (a proxy in front of the real S3 server holds the PUT), its Cell is taken over by another node (which seals the owner's lane), and when the held PUT is let through it hits the seal; the woken owner never acknowledges and ends its session (`/healthz` says so), and every acknowledged command is present exactly once through the survivors.

mod cluster_common;
mod fault_proxy;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cluster_common::{error_code, Cluster, Store};
use fault_proxy::forward;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use tokio::sync::Notify;

/// Holds the first PUT whose path matches until released; passes
/// everything else through to the S3 server unchanged (the Host header
/// included, so signatures still verify).
#[derive(Default)]
struct Hold {
    /// Path substring and suffix of the PUT to hold (armed when set).
    rule: Mutex<Option<(String, String)>>,
    /// The path of the held PUT, once one is held.
    held: Mutex<Option<String>>,
    holding: Notify,
    release: Notify,
    /// The S3 server's status for the released PUT.
    released_status: Mutex<Option<u16>>,
}

async fn start_proxy(upstream: SocketAddr, hold: Arc<Hold>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let hold = hold.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
                        let hold = hold.clone();
                        async move {
                            let path = request.uri().path().to_owned();
                            let matched = request.method() == hyper::Method::PUT && {
                                let mut rule = hold.rule.lock().unwrap();
                                let hit = rule.as_ref().is_some_and(|(part, suffix)| {
                                    path.contains(part.as_str()) && path.ends_with(suffix.as_str())
                                });
                                if hit {
                                    *rule = None;
                                }
                                hit
                            };
                            if matched {
                                *hold.held.lock().unwrap() = Some(path);
                                hold.holding.notify_one();
                                hold.release.notified().await;
                            }
                            let response = forward(upstream, request).await;
                            if matched {
                                *hold.released_status.lock().unwrap() =
                                    response.as_ref().ok().map(|r| r.status().as_u16());
                            }
                            Ok::<_, std::convert::Infallible>(response.unwrap_or_else(|e| {
                                let mut r = hyper::Response::new(Full::new(Bytes::from(e)));
                                *r.status_mut() = hyper::StatusCode::BAD_GATEWAY;
                                r
                            }))
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

fn applied(response: &cellfleet_proto::v1::ExecuteResponse) -> bool {
    matches!(
        response.outcome,
        Some(cellfleet_proto::v1::execute_response::Outcome::ResultJson(
            _
        ))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_paused_between_segment_put_and_reply_hits_the_seal_and_never_acks() {
    paused_between_put_and_reply(false).await;
}

/// As above, and the survivor flushes the dead session and collects its
/// lane (segments deleted below the floor) before the held PUT goes
/// through: the seal is kept, so the zombie still hits it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_that_wakes_after_its_lane_was_collected_still_hits_the_seal() {
    paused_between_put_and_reply(true).await;
}

/// The slot number of a segment key (`…/{seq:016x}.seg`).
fn slot_of(key: &str) -> Option<u64> {
    let name = key.rsplit('/').next()?.strip_suffix(".seg")?;
    u64::from_str_radix(name, 16).ok()
}

async fn paused_between_put_and_reply(collect_first: bool) {
    const LEASE_MS: u64 = 3_000;
    let config = cellfleet_store::testkit::s3_config(cellfleet_store::testkit::TEST_BUCKET);
    let upstream: SocketAddr = config
        .endpoint
        .as_deref()
        .expect("the test S3 endpoint")
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .expect("the test S3 endpoint is host:port");
    let hold = Arc::new(Hold::default());
    let proxy = start_proxy(upstream, hold.clone()).await;
    let prefix = format!("fence-{}", rand::random::<u32>());
    let endpoint = format!("http://{proxy}");
    let cluster = Cluster::start_with_env(
        3,
        Store::S3 {
            prefix: prefix.clone(),
        },
        LEASE_MS,
        &[
            ("CELLFLEET_S3_ENDPOINT", endpoint.as_str()),
            ("CELLFLEET_PUBLICATION_MODE", "log"),
            // Collection soon after a lane stops (the default waits a minute).
            ("CELLFLEET_GC_MIN_AGE_MS", "300"),
        ],
    );
    let mut client = cluster.client("dev");
    let ingress = cluster.nodes[2].client;
    let cells: Vec<String> = (0..6).map(|i| format!("fenced-{i}")).collect();
    let mut acked: HashMap<String, Vec<String>> = HashMap::new();
    let mut owners: HashMap<String, String> = HashMap::new();
    for cell in &cells {
        let request = client.command(
            "log",
            cell,
            "append",
            serde_json::json!({ "tag": "before" }),
            rand::random(),
        );
        let response = client.execute(ingress, request).await.expect("warm-up");
        assert!(applied(&response));
        owners.insert(cell.clone(), response.served_by.clone());
        acked.entry(cell.clone()).or_default().push("before".into());
    }
    let (cell, owner, victim) = cluster.owned_elsewhere(&owners, 2);

    // The owner's next segment PUT is held; the command waits for it.
    *hold.rule.lock().unwrap() = Some((format!("/{prefix}/logs/{owner}/"), ".seg".into()));
    let request = client.command(
        "log",
        &cell,
        "append",
        serde_json::json!({ "tag": "held" }),
        rand::random(),
    );
    let first_attempt = {
        let mut client = cluster.client("dev");
        let request = request.clone();
        tokio::spawn(async move { client.execute(ingress, request).await })
    };
    tokio::time::timeout(Duration::from_secs(20), hold.holding.notified())
        .await
        .expect("the owner's segment PUT reached the proxy");
    let held = hold.held.lock().unwrap().clone().expect("held path");
    // Paused between the PUT and its reply.
    cluster.signal(victim, "STOP");
    let paused_at = Instant::now();

    // The same command (same id) through the ingress until another node
    // serves it: after the lease, it seals the owner's lane and takes over.
    let (served, answers) = client
        .execute_until_applied(ingress, &request, Duration::from_secs(60), |_| {})
        .await;
    assert_ne!(served.served_by, owner, "served by a survivor");
    acked.get_mut(&cell).expect("warmed").push("held".into());

    let bucket_prefix = format!("/{}/", cellfleet_store::testkit::TEST_BUCKET);
    let held_key = held.strip_prefix(&bucket_prefix).expect("a path-style key");
    let held_slot = slot_of(held_key).expect("a segment key");
    let lane = &held_key[..held_key.rfind('/').expect("a lane") + 1];
    if collect_first {
        // The survivor flushes the dead session and collects its lanes:
        // every segment below the held slot goes; the seal stays.
        let store = cellfleet_store::testkit::s3_store().await;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let keys: Vec<String> = cellfleet_store::list_all(store.as_ref(), lane, 10_000)
                .await
                .expect("list the lane")
                .into_iter()
                .map(|e| e.key)
                .collect();
            let below = keys
                .iter()
                .filter(|k| slot_of(k).is_some_and(|s| s < held_slot))
                .count();
            if below == 0 && keys.iter().any(|k| slot_of(k) == Some(held_slot)) {
                println!("lane after collection: {keys:?}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the dead lane was not collected: {keys:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    // Now the held PUT goes through: the seal is in its slot.
    hold.release.notify_one();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = *hold.released_status.lock().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the held PUT never finished");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        status, 412,
        "the late segment {held} must find its slot taken by the seal"
    );
    cluster.signal(victim, "CONT");

    // The first attempt never heard "applied" from the paused owner.
    match tokio::time::timeout(Duration::from_secs(60), first_attempt)
        .await
        .expect("the first attempt ends")
        .expect("task")
    {
        Ok(response) => assert!(
            !applied(&response) || response.served_by != owner,
            "the sealed owner acknowledged: {response:?}"
        ),
        Err(status) => println!("first attempt: {:?}", error_code(&status)),
    }
    // Every acknowledged command exactly once, through every survivor.
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The woken owner found its session sealed: it ended the session
    // (retired its lease, so its Cells move at once) and serves nothing;
    // its liveness check says why, so a supervisor restarts it.
    let (status, body) =
        cluster_common::wait_unhealthy(cluster.nodes[victim].http, Duration::from_secs(30)).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("sealed this session's log"), "{body}");
    let survivors: Vec<(&str, SocketAddr)> = cluster
        .nodes
        .iter()
        .filter(|node| node.id != owner)
        .map(|node| (node.id.as_str(), node.client))
        .collect();
    client.assert_exactly_once(&survivors, &acked).await;
    println!(
        "held {held}; served by {} after {:?}; answers {answers:?}",
        served.served_by,
        paused_at.elapsed()
    );
}
