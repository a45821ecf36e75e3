//! The client library (`cellfleet-client`) against real node processes: owner-aware routing skips the ingress, and commands in doubt across an owner's kill -9 settle to exactly one execution.

mod cluster_common;

use std::collections::HashMap;
use std::time::Duration;

use cellfleet_client::{Client, Command, Error, Outcome, Query, RetryPolicy, Transport};
use cluster_common::{Cluster, Store};

/// A library client of `cluster` that knows only the nodes at `indices`.
fn client_of(cluster: &Cluster, indices: &[usize], policy: RetryPolicy) -> Client {
    let endpoints: Vec<String> = indices
        .iter()
        .map(|&i| cluster.nodes[i].client.to_string())
        .collect();
    let config = cellfleet_client::Config {
        endpoints,
        ca: cluster.path("certs/ca.pem"),
        cert: cluster.path("certs/client-dev.pem"),
        key: cluster.path("certs/client-dev.key"),
        signing_key: cluster.path("dev.ed25519.pem"),
        key_id: "dev".into(),
        window_ms: 60_000,
    };
    Client::builder_from_config(&config)
        .expect("config")
        .retry_policy(policy)
        .build()
        .expect("client")
}

/// After one answer the library sends a Cell's requests straight to its
/// owner: with the only configured node paused, the owner still answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_learns_the_owner_and_skips_the_configured_node() {
    let cluster = Cluster::start(3, Store::Local, 5_000);
    let client = client_of(&cluster, &[0], RetryPolicy::default());
    // Cells until one is owned by another node than n1 (placement spreads them).
    let mut elsewhere = None;
    for i in 0..64 {
        let key = format!("routed-{i}");
        let executed = client
            .execute(&Command::new("log", &key, "append").args(serde_json::json!({"tag": "t"})))
            .await
            .expect("append");
        assert!(
            matches!(executed.outcome, Outcome::Applied(_)),
            "{executed:?}"
        );
        if executed.served_by != cluster.nodes[0].id {
            elsewhere = Some((key, executed));
            break;
        }
    }
    let (key, executed) = elsewhere.expect("some Cell is placed on n2 or n3");
    let owner = cluster
        .nodes
        .iter()
        .find(|n| n.id == executed.served_by)
        .expect("the owner is a node");
    assert_eq!(
        client.cached_owner("log", key.as_bytes()),
        Some(owner.client.to_string()),
        "the library remembers the owner's endpoint from the answer"
    );
    let receipt = executed.receipt.clone().expect("receipt");

    cluster.signal(0, "STOP");
    let quick = RetryPolicy {
        attempt_timeout: Duration::from_secs(3),
        ..RetryPolicy::once()
    };
    let direct = client_of(&cluster, &[0], quick);
    // A fresh client has not learnt the owner: its only node is paused.
    let error = direct
        .query(&Query::new("log", &key, "count"))
        .await
        .expect_err("the only configured node is paused");
    assert!(error.retry_safe(), "{error:?}");
    // The client that learnt it reads through the owner alone, and the
    // read includes its own write (read-your-writes by receipt).
    let queried = client
        .query(&Query::new("log", &key, "count").after(&receipt))
        .await
        .expect("the owner answers without n1");
    cluster.signal(0, "CONT");
    assert_eq!(queried.served_by, owner.id);
    assert_eq!(
        queried.value["rows"],
        serde_json::json!([["t", 1]]),
        "{}",
        queried.value
    );
}

/// Commands sent while their owner is killed: every one ends with a
/// definite outcome (retried with the same id, or settled by resolve), and
/// each is applied exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_across_an_owner_kill_9_apply_exactly_once() {
    let mut cluster = Cluster::start(3, Store::Local, 2_000);
    let policy = RetryPolicy {
        attempt_timeout: Duration::from_secs(2),
        budget: Duration::from_secs(40),
        attempts: 40,
        ..RetryPolicy::default()
    };
    let client = client_of(&cluster, &[0, 1, 2], policy);
    let cells: Vec<String> = (0..6).map(|i| format!("kill-{i}")).collect();
    let mut owners = HashMap::new();
    for cell in &cells {
        let executed = client
            .execute(&Command::new("log", cell, "append").args(serde_json::json!({"tag": "first"})))
            .await
            .expect("first append");
        owners.insert(cell.clone(), executed.served_by);
    }
    // The victim owns at least one Cell and is not n1.
    let victim = (1..3)
        .find(|&i| owners.values().any(|o| *o == cluster.nodes[i].id))
        .unwrap_or(1);
    let writers: Vec<_> = cells
        .iter()
        .map(|cell| {
            let client = client.clone();
            let cell = cell.clone();
            tokio::spawn(async move {
                let mut acked = vec!["first".to_owned()];
                let mut retried = 0;
                for n in 0..25 {
                    let tag = format!("{cell}-{n}");
                    let command =
                        Command::new("log", &cell, "append").args(serde_json::json!({"tag": tag}));
                    match client.execute(&command).await {
                        Ok(executed) => {
                            assert!(
                                matches!(executed.outcome, Outcome::Applied(_)),
                                "{executed:?}"
                            );
                            acked.push(tag);
                            retried += u32::from(executed.attempts > 1);
                        }
                        Err(error) => panic!("{cell} #{n}: no definite outcome: {error}"),
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                (cell, acked, retried)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(400)).await;
    cluster.kill9(victim);
    let mut acked = HashMap::new();
    let mut retried = 0;
    for writer in writers {
        let (cell, tags, retries) = writer.await.expect("writer");
        acked.insert(cell, tags);
        retried += retries;
    }
    // The kill happened under load: some commands needed more than one try.
    assert!(
        retried > 0,
        "no command was retried: the kill missed the load"
    );
    let mut check = cluster.client("dev");
    let survivors: Vec<(&str, std::net::SocketAddr)> = (0..3)
        .filter(|&i| i != victim)
        .map(|i| (cluster.nodes[i].id.as_str(), cluster.nodes[i].client))
        .collect();
    check.assert_exactly_once(&survivors, &acked).await;
}

/// Refusals are typed: an unknown node endpoint is a transport failure
/// that never reached a node, an unauthorized key a non-retryable refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_typed() {
    let cluster = Cluster::start(1, Store::Local, 5_000);
    let unused = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let dead = unused.local_addr().expect("addr").to_string();
    drop(unused);
    let config = cellfleet_client::Config {
        endpoints: vec![dead],
        ca: cluster.path("certs/ca.pem"),
        cert: cluster.path("certs/client-dev.pem"),
        key: cluster.path("certs/client-dev.key"),
        signing_key: cluster.path("dev.ed25519.pem"),
        key_id: "dev".into(),
        window_ms: 60_000,
    };
    let nowhere = Client::builder_from_config(&config)
        .expect("config")
        .retry_policy(RetryPolicy::once())
        .build()
        .expect("client");
    let error = nowhere
        .execute(&Command::new("kv", "a", "put").args(serde_json::json!({"key": "k", "value": 1})))
        .await
        .expect_err("nothing listens there");
    assert!(
        matches!(
            error,
            Error::Transport {
                category: Transport::Unreachable,
                ..
            }
        ),
        "{error:?}"
    );
    assert!(!error.maybe_applied());

    let limited = cellfleet_client::Config {
        endpoints: vec![cluster.nodes[0].client.to_string()],
        signing_key: cluster.path("limited.ed25519.pem"),
        key_id: "limited".into(),
        ..config
    };
    let limited = Client::from_config(&limited).expect("client");
    let error = limited
        .execute(&Command::new("kv", "a", "put").args(serde_json::json!({"key": "k", "value": 1})))
        .await
        .expect_err("the limited key may only read");
    assert_eq!(
        error.code(),
        Some(cellfleet_client::v1::ErrorCode::Unauthorized)
    );
    assert!(!error.retry_safe());
}

/// `cellfleet exec` (built on the library) rides out its owner's kill -9:
/// it retries with the same id until a survivor takes the Cell over, and
/// exits 0 with the new owner's answer.
#[test]
fn cli_exec_rides_out_an_owner_kill_9() {
    let mut cluster = Cluster::start(3, Store::Local, 2_000);
    let config = cluster.write_client_config("cli-client.toml");
    let exec = |value: &str| {
        std::process::Command::new(cluster_common::BIN)
            .args(["exec", "kv", "cli-kill", "put", "--json", "--config"])
            .arg(&config)
            .args(["--arg", "key=k", "--arg", &format!("value={value}")])
            .output()
            .expect("run cellfleet exec")
    };
    let first = exec("1");
    assert!(first.status.success(), "{first:?}");
    let first: serde_json::Value = serde_json::from_slice(&first.stdout).expect("json");
    let owner = first["served_by"].as_str().expect("served_by").to_owned();
    let victim = cluster
        .nodes
        .iter()
        .position(|n| n.id == owner)
        .expect("the owner is a node");
    cluster.kill9(victim);
    let second = exec("2");
    assert_eq!(
        second.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&second.stdout),
        String::from_utf8_lossy(&second.stderr)
    );
    let second: serde_json::Value = serde_json::from_slice(&second.stdout).expect("json");
    assert_eq!(second["outcome"], "applied", "{second}");
    assert_ne!(second["served_by"], owner, "{second}");
    assert_eq!(second["result"]["previous"], 1, "{second}");
}
