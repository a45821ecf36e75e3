//! Real `cellfleet node` processes on loopback: routing to the owner exactly once, the security refusals over the wire, drain under load and kill -9 takeover under load (SeaweedFS and the local-directory store).

mod cluster_common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cellfleet_proto::v1;
use cellfleet_router::certs::{ClusterCa, Role};
use cellfleet_router::signing::{generate_signing_key, seal, Domain};
use cellfleet_router::tls::{self, TlsIdentity};
use cluster_common::{error_code, http_get, metric, now_ms, store_requests, Cluster, Store};
use prost::Message;

fn s3(name: &str) -> Store {
    Store::S3 {
        prefix: cellfleet_store::testkit::unique_prefix(name),
    }
}

/// The first command of the `log` Cell `cell`, sent to `entry`, applied.
async fn first_append(
    client: &mut cluster_common::TestClient,
    entry: &cluster_common::NodeProcess,
    cell: &str,
) -> v1::ExecuteResponse {
    let request = client.command(
        "log",
        cell,
        "append",
        serde_json::json!({"tag": "first"}),
        rand::random(),
    );
    let first = client
        .execute(entry.client, request)
        .await
        .expect("execute");
    assert!(applied(&first), "{first:?}");
    first
}

fn applied(response: &v1::ExecuteResponse) -> bool {
    matches!(
        response.outcome,
        Some(v1::execute_response::Outcome::ResultJson(_))
    )
}

/// Commands sent through every node run once, on one owner; queries and
/// resolves through non-owners return the owner's data.
async fn routes_to_the_owner_exactly_once(cluster: &Cluster) {
    let mut client = cluster.client("dev");
    let addrs: Vec<_> = cluster.nodes.iter().map(|n| n.client).collect();
    let cells: Vec<String> = (0..6).map(|i| format!("cell-{i}")).collect();
    let mut ids = Vec::new();
    for cell in &cells {
        let mut served = HashSet::new();
        let mut last_receipt = None;
        for (i, addr) in addrs.iter().enumerate() {
            let id: [u8; 16] = rand::random();
            let request = client.command(
                "log",
                cell,
                "append",
                serde_json::json!({"tag": format!("t{i}")}),
                id,
            );
            let first = client
                .execute(*addr, request.clone())
                .await
                .expect("execute");
            assert!(applied(&first), "{first:?}");
            assert!(!first.duplicate);
            // The same envelope through another node: the stored outcome.
            let other = addrs[(i + 1) % addrs.len()];
            let again = client.execute(other, request).await.expect("retry");
            assert!(again.duplicate, "a retry must be answered from the ledger");
            assert_eq!(again.receipt, first.receipt);
            served.insert(first.served_by.clone());
            served.insert(again.served_by);
            ids.push((cell.clone(), id));
            last_receipt = first.receipt;
        }
        assert_eq!(served.len(), 1, "cell {cell} was served by {served:?}");
        // A query names the published state it read: at least the last
        // command's, with or without that receipt as its minimum.
        let last = last_receipt.expect("a command receipt");
        for (addr, min) in addrs
            .iter()
            .flat_map(|a| [(a, None), (a, Some(last.clone()))])
        {
            let response = client
                .query_after(
                    *addr,
                    "log",
                    cell,
                    "count",
                    serde_json::json!({}),
                    min.clone(),
                )
                .await
                .expect("query");
            let receipt = response.receipt.expect("a query receipt");
            assert_eq!(
                (&receipt.cell_id, receipt.epoch),
                (&last.cell_id, last.epoch),
                "cell {cell} via {addr} (min {min:?})"
            );
            assert!(
                receipt.txid >= last.txid,
                "cell {cell} via {addr}: read txid {} before the command's {}",
                receipt.txid,
                last.txid
            );
        }
        // Read-your-writes still refuses a receipt that is not published.
        let ahead = v1::Receipt {
            txid: last.txid + 1_000,
            ..last.clone()
        };
        let status = client
            .query_after(
                addrs[0],
                "log",
                cell,
                "count",
                serde_json::json!({}),
                Some(ahead),
            )
            .await
            .expect_err("an unpublished receipt is refused");
        assert_eq!(
            error_code(&status),
            Some(v1::ErrorCode::ReceiptNotReached),
            "{status:?}"
        );
    }
    let mut owners = HashSet::new();
    for cell in &cells {
        for addr in &addrs {
            let counts = client.log_counts(*addr, cell).await;
            let expected: HashMap<String, i64> =
                (0..addrs.len()).map(|i| (format!("t{i}"), 1)).collect();
            assert_eq!(counts, expected, "cell {cell} via {addr}");
            let response = client
                .query(*addr, "log", cell, "count", serde_json::json!({}))
                .await
                .expect("query");
            owners.insert(response.served_by);
        }
    }
    assert!(
        owners.len() > 1,
        "six cells all placed on one node: {owners:?}"
    );
    for (cell, id) in &ids {
        for addr in &addrs {
            let resolved = client
                .resolve(*addr, "log", cell, *id)
                .await
                .expect("resolve");
            assert_eq!(resolved.state, v1::CommandState::Committed as i32);
        }
    }
    let never_sent: [u8; 16] = rand::random();
    // Without the command's expiry, a missing id is not provably absent (its
    // entry may have been pruned).
    let unprovable = client
        .resolve(addrs[0], "log", &cells[0], never_sent)
        .await
        .expect("resolve");
    assert_eq!(unprovable.state, v1::CommandState::NeedsExpiry as i32);
    // With the command's expiry long past, the same id is EXPIRED through
    // every node; a committed command stays COMMITTED, an unexpired absent
    // one stays ABSENT.
    let expired_at = now_ms() - 3_600_000;
    for addr in &addrs {
        let expired = client
            .resolve_expiring(*addr, "log", &cells[0], never_sent, expired_at)
            .await
            .expect("resolve");
        assert_eq!(
            expired.state,
            v1::CommandState::Expired as i32,
            "via {addr}"
        );
        let (cell, id) = &ids[0];
        let committed = client
            .resolve_expiring(*addr, "log", cell, *id, expired_at)
            .await
            .expect("resolve");
        assert_eq!(committed.state, v1::CommandState::Committed as i32);
        let live = client
            .resolve_expiring(*addr, "log", &cells[0], never_sent, now_ms() + 60_000)
            .await
            .expect("resolve");
        assert_eq!(live.state, v1::CommandState::Absent as i32, "via {addr}");
    }
}

/// An owner that took a Cell through a forward serves the first request
/// a client sends it directly without reading the bucket: it holds the
/// Cell, and a held Cell is routed locally with no root or lease read.
async fn an_owner_finds_its_own_cell_without_a_bucket_read(cluster: &Cluster) {
    let mut client = cluster.client("dev");
    let gets = |node| store_requests(node, "get");
    let entry = &cluster.nodes[0];
    let mut checked = 0;
    for i in 0..40 {
        let cell = format!("held-{i}");
        let first = first_append(&mut client, entry, &cell).await;
        let Some(owner) = cluster.nodes.iter().find(|n| n.id == first.served_by) else {
            panic!("served by {:?}, not a node of the cluster", first.served_by);
        };
        if owner.id == entry.id {
            continue;
        }
        let before = gets(owner);
        let response = client
            .query(owner.client, "log", &cell, "count", serde_json::json!({}))
            .await
            .expect("query at the owner");
        assert_eq!(response.served_by, owner.id);
        let after = gets(owner);
        assert_eq!(
            after,
            before,
            "{}: {} store GETs to serve a Cell it holds",
            owner.id,
            after - before
        );
        checked += 1;
        if checked == 3 {
            return;
        }
    }
    panic!("only {checked} of 40 Cells were placed off the entry node");
}

/// A new Cell's root is read once, by the entry node's router, wherever
/// the Cell is placed: on the entry node its activation creates the root
/// on that read, and on another node the forward says the root was absent
/// (`root_absent`), so the owner creates it without a read of its own.
/// `cellfleet_runtime_activation_root_reads_saved_total` counts each, on
/// the node that created the root.
async fn a_new_cell_reads_its_root_once_wherever_it_is_placed(cluster: &Cluster) {
    let mut client = cluster.client("dev");
    let saved = |node| metric(node, "cellfleet_runtime_activation_root_reads_saved_total");
    let entry = &cluster.nodes[0];
    let (mut here, mut forwarded) = (0, 0);
    for i in 0..60 {
        let cell = format!("new-{i}");
        let before: Vec<f64> = cluster.nodes.iter().map(saved).collect();
        let first = first_append(&mut client, entry, &cell).await;
        for (node, before) in cluster.nodes.iter().zip(before) {
            let expected = if node.id == first.served_by { 1.0 } else { 0.0 };
            assert_eq!(
                saved(node) - before,
                expected,
                "{cell}: entered at {}, served by {}; node {}",
                entry.id,
                first.served_by,
                node.id
            );
        }
        if first.served_by == entry.id {
            here += 1;
        } else {
            forwarded += 1;
        }
        if here >= 2 && forwarded >= 2 {
            return;
        }
    }
    panic!("of 60 new Cells, {here} were placed on the entry node and {forwarded} elsewhere");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_on_seaweedfs_route_every_command_to_its_owner_once() {
    let cluster = Cluster::start(3, s3("cluster-route"), 5_000);
    routes_to_the_owner_exactly_once(&cluster).await;
    an_owner_finds_its_own_cell_without_a_bucket_read(&cluster).await;
    a_new_cell_reads_its_root_once_wherever_it_is_placed(&cluster).await;
    // The default publication mode is the node log.
    let segments: f64 = cluster
        .nodes
        .iter()
        .map(|node| metric(node, "cellfleet_runtime_log_segments_total"))
        .sum();
    assert!(segments > 0.0, "no node-log segment was written");
    // Every segment is a create-only PUT, and the store counts each one
    // (with the lease's and the roots' conditional writes).
    let creates: f64 = cluster
        .nodes
        .iter()
        .map(|node| store_requests(node, "put_if_none_match"))
        .sum();
    assert!(
        creates >= segments,
        "{creates} create-only PUTs counted for {segments} segments"
    );
    // The lanes' queue depth and held segments are exported (idle now:
    // nothing waits for a segment).
    for node in &cluster.nodes {
        let (status, text) = http_get(node.http, "/metrics");
        assert_eq!(status, 200, "{text}");
        for gauge in [
            "cellfleet_runtime_log_lane_pending_records",
            "cellfleet_runtime_log_lane_held_segments",
            "cellfleet_runtime_parked_tail_bytes",
        ] {
            assert!(
                text.contains(&format!("# TYPE {gauge} gauge")),
                "{gauge}: {text}"
            );
        }
        assert_eq!(
            metric(node, "cellfleet_runtime_log_lane_pending_records"),
            0.0
        );
    }
}

/// `[publication] mode = "cell"` (here via `CELLFLEET_PUBLICATION_MODE`)
/// serves the same way with one root CAS per group and no log; a mode that
/// is neither is refused at start with the two names it accepts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cell_publication_mode_serves_and_an_unknown_mode_is_refused() {
    let mut cluster = Cluster::start_with_env(
        3,
        Store::Local,
        5_000,
        &[("CELLFLEET_PUBLICATION_MODE", "cell")],
    );
    routes_to_the_owner_exactly_once(&cluster).await;
    for node in &cluster.nodes {
        assert_eq!(
            metric(node, "cellfleet_runtime_log_segments_total"),
            0.0,
            "{}: cell mode writes no log",
            node.id
        );
    }
    let publications: f64 = cluster
        .nodes
        .iter()
        .map(|node| metric(node, "cellfleet_runtime_publications_total"))
        .sum();
    assert!(publications > 0.0);
    assert!(cluster.terminate(2), "n3 drains");
    let output = cluster
        .node_command(&cluster.path("n3.toml"), &[])
        .env("CELLFLEET_PUBLICATION_MODE", "fast")
        .output()
        .expect("run node");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("publication mode \"fast\" is neither \"log\" nor \"cell\""),
        "{stderr}"
    );
    // [limits]: an unknown name is refused, a bound is applied and
    // reported at start with the raised open-file limit.
    let base = std::fs::read_to_string(cluster.path("n3.toml")).expect("n3.toml");
    let typo = cluster.path("n3-typo.toml");
    std::fs::write(&typo, format!("{base}\n[limits]\ncells_open = 2\n")).unwrap();
    let output = cluster.node_command(&typo, &[]).output().expect("run node");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("unknown field `cells_open`"), "{stderr}");
    // ... and so is a WAL or page cache bound out of its range, naming
    // the key and the range.
    for (key, bad) in [("cell_wal_bytes_max", 1000), ("cell_cache_bytes_max", 4096)] {
        let tiny = cluster.path(&format!("n3-tiny-{key}.toml"));
        std::fs::write(&tiny, format!("{base}\n[limits]\n{key} = {bad}\n")).unwrap();
        let output = cluster.node_command(&tiny, &[]).output().expect("run node");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains(&format!(
                "limits.{key} {bad}: give bytes between 65536 and 1073741824"
            )),
            "{stderr}"
        );
    }
    // [publication]: a batch of no groups is refused, naming the key.
    let output = cluster
        .node_command(&cluster.path("n3.toml"), &[])
        .env("CELLFLEET_LOG_BATCH_COMMANDS_MIN", "0")
        .output()
        .expect("run node");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("publication.batch_commands_min must be at least 1"),
        "{stderr}"
    );
    // ... and so is a checkpoint delay that is not a number.
    let output = cluster
        .node_command(&cluster.path("n3.toml"), &[])
        .env("CELLFLEET_LOG_CHECKPOINT_IDLE_MS", "soon")
        .output()
        .expect("run node");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "CELLFLEET_LOG_CHECKPOINT_IDLE_MS=\"soon\" is not a whole number of milliseconds"
        ),
        "{stderr}"
    );
    // The replay budget is read from the file and the environment, and
    // --check-config names the checkpoint triggers in force.
    // n3's configuration with `lines` added to its [publication] table.
    let with_publication = |name: &str, lines: &str| {
        let path = cluster.path(name);
        let text = base.replacen("[publication]\n", &format!("[publication]\n{lines}"), 1);
        std::fs::write(&path, text).unwrap();
        path
    };
    let budgeted = with_publication(
        "n3-budget.toml",
        "replay_segments_max = 512\ncheckpoints_inflight_max = 3\ncell_groups_inflight_max = 2\n",
    );
    for (config, env, shown) in [
        (&budgeted, None, "or 512 segments of its lane past its root"),
        (
            &budgeted,
            Some("20000"),
            "or 20000 segments of its lane past its root",
        ),
    ] {
        let mut command = cluster.node_command(config, &["--check-config"]);
        command.env_remove("CELLFLEET_PUBLICATION_MODE");
        if let Some(value) = env {
            command.env("CELLFLEET_LOG_REPLAY_SEGMENTS_MAX", value);
        }
        let output = command.output().expect("check config");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert_eq!(output.status.code(), Some(0), "{stdout}");
        assert!(
            stdout.contains("publication mode log: 1 lane(s)"),
            "{stdout}"
        );
        assert!(stdout.contains(shown), "{stdout}");
        assert!(
            stdout.contains("past its root; at most 3 checkpoints in flight; at most 2 group(s) of a Cell in flight"),
            "{stdout}"
        );
    }
    // In cell mode the same file's log settings are named as ignored.
    let output = cluster
        .node_command(&budgeted, &["--check-config"])
        .env("CELLFLEET_PUBLICATION_MODE", "cell")
        .output()
        .expect("check config");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains(
            "publication mode cell: one root CAS per group; ignored in this mode (they apply to \
             mode = \"log\"): replay_segments_max, cell_groups_inflight_max, checkpoints_inflight_max"
        ),
        "{stdout}"
    );
    // Settings --check-config refuses (exit 1), naming what is wrong: no
    // checkpoint at all in flight, and a replay budget a successor could
    // not list in one go.
    for (name, lines, refusal) in [
        (
            "n3-no-checkpoints.toml",
            "checkpoints_inflight_max = 0\n",
            "publication.checkpoints_inflight_max must be at least 1",
        ),
        (
            "n3-no-groups.toml",
            "cell_groups_inflight_max = 0\n",
            "publication.cell_groups_inflight_max = 0: it must be between 1 and 64",
        ),
        (
            "n3-many-groups.toml",
            "cell_groups_inflight_max = 65\n",
            "publication.cell_groups_inflight_max = 65: it must be between 1 and 64",
        ),
        (
            "n3-wide-budget.toml",
            "replay_segments_max = 60000\n",
            "publication.replay_segments_max = 60000: it must be between 1 and 50000",
        ),
    ] {
        let output = cluster
            .node_command(&with_publication(name, lines), &["--check-config"])
            .output()
            .expect("check config");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(refusal), "{stderr}");
    }
    let limited = cluster.path("n3-limited.toml");
    // (It also carries `[publication] parked_bytes_max`, which a node
    // would refuse as an unknown field if the key were not read.)
    assert!(base.contains("[publication]\n"), "{base}");
    let with_parked = base.replacen(
        "[publication]\n",
        "[publication]\nparked_bytes_max = 1048576\n",
        1,
    );
    std::fs::write(
        &limited,
        format!("{with_parked}\n[limits]\ncells_open_max = 2\ncell_wal_bytes_max = 131072\ncell_cache_bytes_max = 524288\n"),
    )
    .unwrap();
    let log = cluster.path("n3-limited.stderr");
    let child = cluster
        .node_command(&limited, &[])
        .env("CELLFLEET_PUBLICATION_MODE", "cell")
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("spawn node");
    let mut node = cluster.wait_ready("n3", child);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains(
            "publication mode cell ignores [publication] parked_bytes_max (they apply to mode = \"log\")"
        ),
        "{text}"
    );
    assert!(
        text.contains("cells open at most 2 (cells_open_max 2"),
        "{text}"
    );
    assert!(
        text.contains("; a cell's WAL at most 131072 bytes, its page cache at most 524288 bytes per connection"),
        "{text}"
    );
    assert!(text.contains("open files "), "{text}");
    // Each open Cell is charged 640 KiB and its connections' caches: in
    // cell mode a writer and two readers (the published one and a spare).
    assert!(
        text.contains(" / 2228224 per cell with 3 page caches)"),
        "{text}"
    );
    // The binary turned SQLite's memory statistics off before SQLite
    // started, or the node would warn that they slow it.
    assert!(!text.contains("SQLite counts its allocations"), "{text}");
    // Unset, memory_bytes_max is half of the machine's memory, and the
    // line says so.
    assert!(text.contains(", half of the machine's "), "{text}");
    // The default fds_max is fitted to the open-file limit without a word.
    assert!(!text.contains("is over what the open-file limit"), "{text}");
    let _ = node.child.kill();
    let _ = node.child.wait();
    // The collector's minimum age is a number of milliseconds.
    let output = cluster
        .node_command(&cluster.path("n3.toml"), &[])
        .env("CELLFLEET_GC_MIN_AGE_MS", "1m")
        .output()
        .expect("run node");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("CELLFLEET_GC_MIN_AGE_MS=\"1m\" is not a whole number of milliseconds"),
        "{stderr}"
    );
}

fn signed(client: &cluster_common::TestClient, body: v1::CommandBody) -> v1::ExecuteRequest {
    v1::ExecuteRequest {
        envelope: Some(seal(
            Domain::Command,
            body.encode_to_vec(),
            &client.key_id,
            &client.key,
        )),
    }
}

/// On the local-directory store: routing as above, then every refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_store_cluster_routes_and_refuses_bad_requests_without_touching_state() {
    let cluster = Cluster::start(3, Store::Local, 5_000);
    routes_to_the_owner_exactly_once(&cluster).await;
    each_node_checks_a_signature_once(&cluster).await;

    let mut client = cluster.client("dev");
    let addr = cluster.nodes[1].client;
    let before = client.log_counts(addr, "cell-0").await;
    let body = |issued: i64, expires: i64| v1::CommandBody {
        kind: "log".into(),
        key: b"cell-0".to_vec(),
        command: "append".into(),
        args_json: br#"{"tag":"evil"}"#.to_vec(),
        command_id: rand::random::<[u8; 16]>().to_vec(),
        issued_at_ms: issued,
        expires_at_ms: expires,
    };
    let now = now_ms();
    let mut unsigned = signed(&client, body(now, now + 60_000));
    unsigned
        .envelope
        .as_mut()
        .expect("envelope")
        .signature
        .clear();
    let wrong_key = Arc::new(generate_signing_key());
    let wrongly_signed = v1::ExecuteRequest {
        envelope: Some(seal(
            Domain::Command,
            body(now, now + 60_000).encode_to_vec(),
            "dev",
            &wrong_key,
        )),
    };
    let expired = signed(&client, body(now - 120_000, now - 60_000));
    let future = signed(&client, body(now + 60_000, now + 120_000));
    let limited = cluster.client("limited");
    let unauthorized = signed(&limited, body(now, now + 60_000));
    let cases = [
        (
            unsigned,
            tonic::Code::Unauthenticated,
            v1::ErrorCode::Unsigned,
        ),
        (
            wrongly_signed,
            tonic::Code::Unauthenticated,
            v1::ErrorCode::BadSignature,
        ),
        (
            expired,
            tonic::Code::FailedPrecondition,
            v1::ErrorCode::Expired,
        ),
        (
            future,
            tonic::Code::FailedPrecondition,
            v1::ErrorCode::FutureDated,
        ),
        (
            unauthorized,
            tonic::Code::PermissionDenied,
            v1::ErrorCode::Unauthorized,
        ),
    ];
    for (request, code, error) in cases {
        let status = client.execute(addr, request).await.expect_err("refused");
        assert_eq!(status.code(), code, "{status:?}");
        assert_eq!(error_code(&status), Some(error), "{status:?}");
    }
    assert_eq!(client.log_counts(addr, "cell-0").await, before);

    // A client certificate from another CA never completes a handshake.
    let foreign_ca = ClusterCa::generate("other").expect("ca");
    let issued = foreign_ca
        .issue(&Role::Client("intruder".into()), &[])
        .expect("issue");
    let ca_pem = std::fs::read_to_string(cluster.path("certs/ca.pem")).expect("ca");
    let identity =
        TlsIdentity::from_pem(&ca_pem, &issued.cert_pem, &issued.key_pem).expect("identity");
    let mut intruder = cluster
        .client("dev")
        .with_tls(tls::client_config(&identity).expect("tls"));
    let request = intruder.command(
        "log",
        "cell-0",
        "append",
        serde_json::json!({"tag": "evil"}),
        rand::random(),
    );
    let status = intruder.execute(addr, request).await.expect_err("refused");
    assert_eq!(
        error_code(&status),
        None,
        "refused in the handshake: {status:?}"
    );
    assert_eq!(client.log_counts(addr, "cell-0").await, before);
}

/// Every node's `cellfleet_router_signatures_verified_total`, summed.
fn signatures_verified(cluster: &Cluster) -> f64 {
    cluster
        .nodes
        .iter()
        .map(|node| metric(node, "cellfleet_router_signatures_verified_total"))
        .sum()
}

/// A client request's signature is checked once, by its ingress: the owner
/// of a forwarded request checks everything else but not the signature
/// the forward says its ingress verified. A forward that does not say so
/// is verified by the owner, and a forged signature is refused there.
/// Counted by the nodes' own metric.
async fn each_node_checks_a_signature_once(cluster: &Cluster) {
    let mut client = cluster.client("dev");
    let key = "signature-count";
    let append = |client: &cluster_common::TestClient, tag: &str| {
        client.command(
            "log",
            key,
            "append",
            serde_json::json!({ "tag": tag }),
            rand::random(),
        )
    };
    let first = client
        .execute(cluster.nodes[0].client, append(&client, "placed"))
        .await
        .expect("applied");
    let owner = cluster
        .nodes
        .iter()
        .find(|node| node.id == first.served_by)
        .expect("served by a node of the cluster");
    let other = cluster
        .nodes
        .iter()
        .find(|node| node.id != first.served_by)
        .expect("another node");

    let request = append(&client, "local");
    let (checks, local) = checks_during(cluster, client.execute(owner.client, request)).await;
    assert_eq!(local.expect("applied").served_by, owner.id);
    assert_eq!(checks, 1.0, "a local command");

    let query = client.query(owner.client, "log", key, "count", serde_json::json!({}));
    let (checks, read) = checks_during(cluster, query).await;
    assert_eq!(read.expect("answered").served_by, owner.id);
    assert_eq!(checks, 1.0, "a local query");

    let request = append(&client, "forwarded");
    let (checks, forwarded) = checks_during(cluster, client.execute(other.client, request)).await;
    assert_eq!(forwarded.expect("applied").served_by, owner.id);
    assert_eq!(checks, 1.0, "a forwarded command: its ingress only");

    let query = client.query(other.client, "log", key, "count", serde_json::json!({}));
    let (checks, read) = checks_during(cluster, query).await;
    let read = read.expect("answered");
    assert_eq!(read.served_by, owner.id);
    assert_eq!(checks, 1.0, "a forwarded query: its ingress only");
    let counts: serde_json::Value = serde_json::from_slice(&read.result_json).expect("json");
    assert_eq!(
        counts["rows"].as_array().map(Vec::len),
        Some(3),
        "placed, local, forwarded: {counts}"
    );

    // A forward as another node sends it, but with a forged signature and
    // without the ingress's word that it verified it: the owner verifies,
    // refuses, and nothing runs.
    let mut forged = append(&client, "forged");
    let envelope = forged.envelope.as_mut().expect("signed");
    envelope.signature[0] ^= 0x5a;
    let as_other = tls::client_config(
        &TlsIdentity::load(
            &cluster.path("certs/ca.pem"),
            &cluster.path(&format!("certs/node-{}.pem", other.id)),
            &cluster.path(&format!("certs/node-{}.key", other.id)),
        )
        .expect("identity"),
    )
    .expect("tls");
    let channel = cellfleet_router::transport::channel(
        owner.peer,
        "127.0.0.1",
        as_other,
        Duration::from_secs(2),
    )
    .expect("channel");
    let forward = v1::ForwardRequest {
        request: Some(v1::forward_request::Request::Execute(forged)),
        hops: 1,
        ingress_node_id: other.id.clone(),
        deadline_unix_ms: 0,
        ingress_verified: false,
        root_absent: false,
    };
    let (checks, refused) = checks_during(
        cluster,
        v1::peer_client::PeerClient::new(channel).forward(forward),
    )
    .await;
    let refused = refused.expect_err("a forged signature must be refused");
    assert_eq!(
        error_code(&refused),
        Some(v1::ErrorCode::BadSignature),
        "{refused:?}"
    );
    assert_eq!(checks, 1.0, "the owner verified the unvouched forward");
    let expected: HashMap<String, i64> = ["placed", "local", "forwarded"]
        .into_iter()
        .map(|tag| (tag.to_owned(), 1))
        .collect();
    assert_eq!(
        client.log_counts(owner.client, key).await,
        expected,
        "the forged command did not run"
    );
}

/// The signature checks the cluster made while `request` ran, and its answer.
async fn checks_during<T>(
    cluster: &Cluster,
    request: impl std::future::Future<Output = T>,
) -> (f64, T) {
    let before = signatures_verified(cluster);
    let answer = request.await;
    (signatures_verified(cluster) - before, answer)
}

#[derive(Debug, Default)]
struct LoadLog {
    /// Acknowledged command tags per cell.
    acked: HashMap<String, Vec<String>>,
    /// Tags whose last answer was UNKNOWN_OUTCOME (never acknowledged).
    unknown: HashMap<String, Vec<String>>,
    /// Error codes seen (None: no Cellfleet detail).
    errors: HashMap<String, usize>,
}

/// Clients append unique tags to `cells` through `ingresses`, retrying
/// retry-safe failures with the same envelope, until `stop`.
async fn load(
    cluster_client: cluster_common::TestClient,
    ingresses: Vec<std::net::SocketAddr>,
    cells: Vec<String>,
    worker: usize,
    stop: Arc<std::sync::atomic::AtomicBool>,
    log: Arc<Mutex<LoadLog>>,
) {
    let mut client = cluster_client;
    let mut n = 0usize;
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        n += 1;
        let cell = &cells[n % cells.len()];
        let tag = format!("w{worker}-{n}");
        let request = client.command(
            "log",
            cell,
            "append",
            serde_json::json!({"tag": tag}),
            rand::random(),
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let addr = ingresses[(n + attempt) % ingresses.len()];
            match client.execute(addr, request.clone()).await {
                Ok(response) => {
                    assert!(applied(&response), "{response:?}");
                    log.lock()
                        .expect("log")
                        .acked
                        .entry(cell.clone())
                        .or_default()
                        .push(tag.clone());
                    break;
                }
                Err(status) => {
                    let code = error_code(&status);
                    let name = code.map_or_else(
                        || format!("transport {:?}", status.code()),
                        |c| c.as_str_name().to_owned(),
                    );
                    *log.lock().expect("log").errors.entry(name).or_default() += 1;
                    let retry_safe = cellfleet_router::status::detail_from_status(&status)
                        .is_some_and(|d| d.retry_safe);
                    if !retry_safe || Instant::now() > deadline {
                        if code == Some(v1::ErrorCode::UnknownOutcome) {
                            log.lock()
                                .expect("log")
                                .unknown
                                .entry(cell.clone())
                                .or_default()
                                .push(tag.clone());
                        }
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

async fn run_load_around(
    cluster: &mut Cluster,
    ingresses: Vec<std::net::SocketAddr>,
    cells: &[String],
    event: impl FnOnce(&mut Cluster),
    after: Duration,
) -> LoadLog {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let log = Arc::new(Mutex::new(LoadLog::default()));
    let mut tasks = Vec::new();
    for worker in 0..4 {
        tasks.push(tokio::spawn(load(
            cluster.client("dev"),
            ingresses.clone(),
            cells.to_vec(),
            worker,
            stop.clone(),
            log.clone(),
        )));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    tokio::task::block_in_place(|| event(cluster));
    tokio::time::sleep(after).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(90), task)
            .await
            .expect("load workers stop")
            .expect("load worker");
    }
    Arc::try_unwrap(log)
        .expect("workers done")
        .into_inner()
        .expect("log")
}

/// Every acknowledged tag is in its Cell exactly once; unknown ones at most once.
async fn check_exactly_once(
    cluster: &Cluster,
    via: std::net::SocketAddr,
    cells: &[String],
    log: &LoadLog,
) {
    let mut client = cluster.client("dev");
    let mut total = 0;
    for cell in cells {
        let counts = client.log_counts(via, cell).await;
        for tag in log.acked.get(cell).into_iter().flatten() {
            assert_eq!(counts.get(tag), Some(&1), "acknowledged {tag} in {cell}");
            total += 1;
        }
        for tag in log.unknown.get(cell).into_iter().flatten() {
            assert!(
                counts.get(tag).copied().unwrap_or(0) <= 1,
                "{tag} applied twice"
            );
        }
        assert!(
            counts.values().all(|n| *n == 1),
            "a command ran twice in {cell}: {counts:?}"
        );
    }
    assert!(total > 0, "no command was acknowledged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drain_under_load_hands_cells_over_with_no_unknown_outcome() {
    let mut cluster = Cluster::start(3, s3("cluster-drain"), 5_000);
    let cells: Vec<String> = (0..6).map(|i| format!("drain-{i}")).collect();
    let ingresses = cluster.nodes.iter().map(|n| n.client).collect();
    let mut drained_cleanly = false;
    let log = run_load_around(
        &mut cluster,
        ingresses,
        &cells,
        |cluster| drained_cleanly = cluster.terminate(0),
        Duration::from_secs(3),
    )
    .await;
    assert!(
        drained_cleanly,
        "node n1 did not exit cleanly after SIGTERM"
    );
    assert!(
        log.unknown.is_empty(),
        "unknown outcomes during a drain: {log:?}"
    );
    assert!(
        !log.errors.contains_key("ERROR_CODE_UNKNOWN_OUTCOME"),
        "{log:?}"
    );
    let via = cluster.nodes[1].client;
    check_exactly_once(&cluster, via, &cells, &log).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_an_owner_under_load_loses_no_acknowledged_command() {
    let mut cluster = Cluster::start(3, s3("cluster-kill"), 2_000);
    let cells: Vec<String> = (0..6).map(|i| format!("kill-{i}")).collect();
    // Place every Cell first, then kill the node that owns the most of
    // them: which node that is depends on which leases the ingress saw
    // live, so the test asks rather than assumes.
    let mut client = cluster.client("dev");
    let first = cluster.nodes[0].client;
    let mut owned: HashMap<String, Vec<String>> = HashMap::new();
    for cell in &cells {
        let response = client
            .query(first, "log", cell, "count", serde_json::json!({}))
            .await
            .expect("placing the cell");
        owned
            .entry(response.served_by)
            .or_default()
            .push(cell.clone());
    }
    let (victim_name, victim_cells) = owned
        .iter()
        .max_by_key(|(_, cells)| cells.len())
        .map(|(name, cells)| (name.clone(), cells.clone()))
        .expect("every cell has an owner");
    let victim = cluster
        .nodes
        .iter()
        .position(|n| n.id == victim_name)
        .expect("the owner is one of the nodes");
    let ingresses: Vec<_> = (0..cluster.nodes.len())
        .filter(|&i| i != victim)
        .map(|i| cluster.nodes[i].client)
        .collect();
    let via = ingresses[0];
    let log = run_load_around(
        &mut cluster,
        ingresses,
        &cells,
        move |cluster| cluster.kill9(victim),
        Duration::from_secs(6),
    )
    .await;
    let documented: HashSet<&str> = [
        "ERROR_CODE_PEER_UNAVAILABLE",
        "ERROR_CODE_NOT_OWNER",
        "ERROR_CODE_UNKNOWN_OUTCOME",
        "ERROR_CODE_FENCED",
        "ERROR_CODE_RESOURCE_EXHAUSTED",
        "ERROR_CODE_NOT_COMMITTED",
        "ERROR_CODE_DEADLINE_EXCEEDED",
    ]
    .into_iter()
    .collect();
    for name in log.errors.keys() {
        assert!(
            documented.contains(name.as_str()),
            "undocumented failure {name}: {log:?}"
        );
    }
    check_exactly_once(&cluster, via, &cells, &log).await;
    // The killed node's Cells were taken over by a survivor at a later
    // epoch; every Cell answers, none from the dead node.
    for cell in &cells {
        let response = client
            .query(via, "log", cell, "count", serde_json::json!({}))
            .await
            .expect("query after takeover");
        assert_ne!(response.served_by, victim_name, "{cell}");
        if victim_cells.contains(cell) {
            let receipt = response.receipt.expect("a query names the state it read");
            assert!(receipt.epoch >= 2, "{cell} was not taken over: {receipt:?}");
        }
    }
}

/// A Python client (stubs generated from proto/, signing by the documented
/// rule alone) sends a signed command to a real node; Rust reads it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_executes_a_signed_command_on_a_real_node() {
    let cluster = Cluster::start(1, Store::Local, 5_000);
    let addr = cluster.nodes[0].client;
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/pyclient.sh");
    let path = |p: &str| cluster.path(p).display().to_string();
    let arguments = vec![
        "--addr".to_owned(),
        addr.to_string(),
        "--ca".into(),
        path("certs/ca.pem"),
        "--cert".into(),
        path("certs/client-dev.pem"),
        "--key".into(),
        path("certs/client-dev.key"),
        "--signing-key".into(),
        path("dev.ed25519.pem"),
        "--key-id".into(),
        "dev".into(),
        "--tamper".into(),
    ];
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("bash")
            .arg(&script)
            .args(&arguments)
            .output()
    })
    .await
    .expect("join")
    .expect("run scripts/pyclient.sh");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "pyclient failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let results: serde_json::Value = serde_json::from_str(stdout.trim()).expect("pyclient JSON");
    assert_eq!(results["execute"]["ok"], true, "{results}");
    assert_eq!(results["execute"]["served_by"], "n1");
    assert_eq!(results["execute"]["command_id_matches"], true);
    assert!(
        results["execute"]["receipt"]["txid"].as_u64().unwrap_or(0) > 0,
        "{results}"
    );
    assert_eq!(results["tampered_signature"]["ok"], false, "{results}");
    assert_eq!(results["cross_domain"]["ok"], false, "{results}");
    let mut client = cluster.client("dev");
    let response = client
        .query(
            addr,
            "kv",
            "py-cell",
            "get",
            serde_json::json!({"key": "greeting"}),
        )
        .await
        .expect("query");
    let value: serde_json::Value = serde_json::from_slice(&response.result_json).expect("json");
    assert_eq!(value["value"], "hello from python", "{value}");
}

/// DESIGN.md §6: the kinds manifest is identical across the cluster. A node
/// whose manifest differs from the digest in `{prefix}/cluster.json` refuses
/// to start, naming both digests; `--accept-kinds-change` replaces the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_another_kinds_manifest_refuses_to_start() {
    let mut cluster = Cluster::start(2, Store::Local, 5_000);
    let record_path = cluster.path("store/objects/cellfleet/cluster.json");
    let record = |path: &std::path::Path| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(path).expect("cluster.json")).expect("json")
    };
    let kinds = std::fs::read_to_string(cluster.path("kinds.toml")).expect("kinds");
    let ours = cellfleet_cell::Manifest::parse(&kinds)
        .expect("manifest")
        .digest();
    assert_eq!(record(&record_path)["kinds_digest"], ours.as_str());
    assert_eq!(record(&record_path)["counter"], 1);
    let changed_text =
        format!("{kinds}\n[kinds.log.queries.tags]\nsql = \"SELECT DISTINCT tag FROM entries\"\n");
    let changed = cellfleet_cell::Manifest::parse(&changed_text)
        .expect("manifest")
        .digest();
    assert_ne!(ours, changed);
    std::fs::write(cluster.path("kinds-changed.toml"), &changed_text).expect("write");
    let n2 = std::fs::read_to_string(cluster.path("n2.toml")).expect("n2.toml");
    let changed_config = cluster.path("n2-changed.toml");
    let replaced = n2.replace(
        "manifest = \"kinds.toml\"",
        "manifest = \"kinds-changed.toml\"",
    );
    assert_ne!(replaced, n2, "n2.toml names kinds.toml");
    std::fs::write(&changed_config, replaced).expect("write");

    assert!(
        cluster.terminate(1),
        "n2 did not drain to a clean exit (its stderr is above)"
    );
    let mut refused = cluster
        .node_command(&changed_config, &[])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run node");
    let deadline = Instant::now() + Duration::from_secs(60);
    while refused.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = refused.kill();
            panic!("a node with another kinds manifest kept running");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let output = refused.wait_with_output().expect("output");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("the cluster's kinds manifest digest is {ours}"))
            && stderr.contains(&format!("this node's is {changed}"))
            && stderr.contains("--accept-kinds-change"),
        "{stderr}"
    );
    assert_eq!(record(&record_path)["kinds_digest"], ours.as_str());

    // The operator's explicit change: the record now names the new digest.
    let child = cluster
        .node_command(&changed_config, &["--accept-kinds-change"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let node = cluster.wait_ready("n2", child);
    cluster.nodes[1] = node;
    let after = record(&record_path);
    assert_eq!(after["kinds_digest"], changed.as_str(), "{after}");
    assert_eq!(after["counter"], 2, "{after}");
}

/// Correctness item: a hung owner must not block its Cells. With warm peer
/// connections, the owner of a Cell is SIGSTOPped; a command for that Cell
/// through another node (retried with the same command id, as a client
/// does on UNKNOWN_OUTCOME or a retry-safe refusal) succeeds within the lease
/// plus the margin plus a few seconds: the ingress stops waiting on the
/// silent peer (keep-alive pings, a per-hop timeout), re-reads the owner's
/// lease and, once it has expired, places the Cell and takes it over. After
/// SIGCONT, every acknowledged command is present exactly once, read
/// through every node, the woken one included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_owner_s_cells_serve_through_other_nodes_once_its_lease_expires() {
    const LEASE_MS: u64 = 3_000;
    const MARGIN_MS: u64 = 500;
    let cluster = Cluster::start(3, Store::Local, LEASE_MS);
    let mut client = cluster.client("dev");
    let ingress = cluster.nodes[2].client;
    let cells: Vec<String> = (0..6).map(|i| format!("paused-{i}")).collect();
    let mut acked: HashMap<String, Vec<String>> = HashMap::new();
    let mut owners: HashMap<String, String> = HashMap::new();
    // Warm every peer connection of the ingress with a few commands.
    for round in 0..2 {
        for cell in &cells {
            let tag = format!("warm-{round}");
            let request = client.command(
                "log",
                cell,
                "append",
                serde_json::json!({ "tag": tag }),
                rand::random(),
            );
            let response = client.execute(ingress, request).await.expect("warm-up");
            assert!(applied(&response));
            owners.insert(cell.clone(), response.served_by.clone());
            acked.entry(cell.clone()).or_default().push(tag);
        }
    }
    let (cell, owner, victim) = cluster.owned_elsewhere(&owners, 2);
    cluster.signal(victim, "STOP");
    let paused_at = Instant::now();
    let request = client.command(
        "log",
        &cell,
        "append",
        serde_json::json!({ "tag": "while-paused" }),
        rand::random(),
    );
    let (served, answers) = client
        .execute_until_applied(ingress, &request, Duration::from_secs(60), |status| {
            assert!(
                error_code(status).is_some(),
                "the ingress gave no answer within the client's deadline \
                 (it waited on the paused owner): {status:?}"
            );
            let retry_safe = cellfleet_router::status::detail_from_status(status)
                .is_some_and(|detail| detail.retry_safe);
            assert!(retry_safe, "a refusal that is not retry-safe: {status:?}");
        })
        .await;
    let took = paused_at.elapsed();
    println!(
        "first success through {} after SIGSTOP of {owner}: {took:?} (served by {}; earlier answers {answers:?})",
        cluster.nodes[2].id, served.served_by
    );
    assert_ne!(served.served_by, owner);
    let bound = Duration::from_millis(LEASE_MS + MARGIN_MS + 5_000);
    assert!(
        took <= bound,
        "{cell} took {took:?} to serve again (bound {bound:?}): {answers:?}"
    );
    acked
        .get_mut(&cell)
        .expect("warmed")
        .push("while-paused".into());
    cluster.signal(victim, "CONT");
    // Through every node, the woken one included: never stale, each
    // acknowledged tag exactly once.
    let via: Vec<(&str, std::net::SocketAddr)> = cluster
        .nodes
        .iter()
        .map(|node| (node.id.as_str(), node.client))
        .collect();
    client.assert_exactly_once(&via, &acked).await;
}

/// `cellfleet drain NODE`, run as a user runs it (it used to panic with
/// "there is no reactor running" every time): the named node releases its
/// Cells, retires its lease and exits 0; every acknowledged command reads
/// back exactly through another node, now served by a survivor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cellfleet_drain_drains_the_named_node_which_then_exits() {
    let mut cluster = Cluster::start(3, Store::Local, 3_000);
    let mut client = cluster.client("dev");
    let via = cluster.nodes[0].client;
    let cells: Vec<String> = (0..6).map(|i| format!("drained-{i}")).collect();
    let mut owners = HashMap::new();
    for cell in &cells {
        let request = client.command(
            "log",
            cell,
            "append",
            serde_json::json!({ "tag": "before" }),
            rand::random(),
        );
        let response = client.execute(via, request).await.expect("append");
        owners.insert(cell.clone(), response.served_by);
    }
    let victim = 1;
    let name = cluster.nodes[victim].id.clone();
    let config = cluster.path("client.toml");
    let output = tokio::task::block_in_place(|| {
        std::process::Command::new(cluster_common::BIN)
            .arg("drain")
            .arg(&name)
            .arg("--config")
            .arg(&config)
            .arg("--node")
            .arg(via.to_string())
            .output()
            .expect("run cellfleet drain")
    });
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "cellfleet drain exited {:?}: {stdout}{stderr}",
        output.status
    );
    let owned = owners.values().filter(|owner| **owner == name).count();
    assert!(
        stdout.contains(&format!(
            "drained {name}: {owned} cell(s) released, lease retired"
        )),
        "{stdout}{stderr}"
    );
    // The drained process exits by itself, cleanly.
    let exited = tokio::task::block_in_place(|| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = cluster.nodes[victim].child.try_wait() {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    assert!(
        exited.is_some_and(|status| status.success()),
        "the drained node did not exit cleanly: {exited:?}"
    );
    for cell in &cells {
        let counts = client.log_counts(via, cell).await;
        assert_eq!(counts, HashMap::from([("before".to_owned(), 1)]), "{cell}");
        let response = client
            .query(via, "log", cell, "count", serde_json::json!({}))
            .await
            .expect("query");
        assert_ne!(
            response.served_by, name,
            "{cell} is served by the drained node"
        );
    }
    // Drain of a node that is not in the leases: a clear error, non-zero.
    let missing = tokio::task::block_in_place(|| {
        std::process::Command::new(cluster_common::BIN)
            .args(["drain", "no-such-node", "--config"])
            .arg(&config)
            .arg("--node")
            .arg(via.to_string())
            .output()
            .expect("run cellfleet drain")
    });
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("no node \"no-such-node\" in the leases"),
        "{}",
        String::from_utf8_lossy(&missing.stderr)
    );
}

/// `cellfleet exec` exit codes as scripts see them: 0 applied; 4 (and
/// `"ok": false`) when the Cell rejected the command — an unknown command,
/// a missing parameter — distinct from 1, an error that reached no Cell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_exit_codes_tell_applied_rejected_and_failed_apart() {
    let cluster = Cluster::start(1, Store::Local, 3_000);
    let config = cluster.path("client.toml");
    let node = cluster.nodes[0].client.to_string();
    let exec = |args: &[&str]| {
        let output = std::process::Command::new(cluster_common::BIN)
            .arg("exec")
            .args(args)
            .arg("--config")
            .arg(&config)
            .arg("--node")
            .arg(&node)
            .arg("--json")
            .output()
            .expect("run cellfleet exec");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        (output.status.code(), stdout, stderr)
    };
    let json = |stdout: &str| -> serde_json::Value {
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout:?}"))
    };
    tokio::task::block_in_place(|| {
        let (code, stdout, stderr) = exec(&["log", "codes", "append", "--arg", "tag=\"a\""]);
        assert_eq!(code, Some(0), "{stdout}{stderr}");
        let applied = json(&stdout);
        assert_eq!(
            (applied["ok"].clone(), applied["outcome"].clone()),
            (true.into(), "applied".into())
        );

        let (code, stdout, stderr) = exec(&["log", "codes", "nosuchcmd"]);
        assert_eq!(code, Some(4), "{stdout}{stderr}");
        let rejected = json(&stdout);
        assert_eq!(
            (rejected["ok"].clone(), rejected["outcome"].clone()),
            (false.into(), "rejected".into())
        );

        let (code, stdout, stderr) = exec(&["log", "codes", "append"]);
        assert_eq!(code, Some(4), "a missing parameter: {stdout}{stderr}");
        assert_eq!(json(&stdout)["ok"], false);

        // A misspelt parameter: named as unknown, beside the missing one.
        let (code, stdout, stderr) = exec(&["log", "codes", "append", "--arg", "tagg=\"a\""]);
        assert_eq!(code, Some(4), "{stdout}{stderr}");
        let message = json(&stdout)["result"].to_string();
        assert!(
            message.contains(r#"missing parameter \"tag\""#)
                && message.contains(r#"unknown parameter \"tagg\""#)
                && message.contains(r#"it takes \"tag\""#),
            "{message}"
        );

        // Declared types (the dev manifest's counter takes an integer):
        // "abc" and 1.5 are refused before anything runs.
        for bad in ["by=abc", "by=1.5"] {
            let (code, stdout, stderr) = exec(&["counter", "typed", "add", "--arg", bad]);
            assert_eq!(code, Some(4), "{bad}: {stdout}{stderr}");
            let message = json(&stdout)["result"].to_string();
            assert!(message.contains("must be an integer"), "{bad}: {message}");
        }
        let (code, stdout, stderr) = exec(&["counter", "typed", "add", "--arg", "by=2"]);
        assert_eq!(code, Some(0), "{stdout}{stderr}");

        // A query that does not exist is the request's fault (BAD_REQUEST),
        // not the server's (it was INTERNAL, with a Rust debug dump).
        let query = std::process::Command::new(cluster_common::BIN)
            .args(["query", "log", "codes", "nosuchquery", "--config"])
            .arg(&config)
            .arg("--node")
            .arg(&node)
            .output()
            .expect("run cellfleet query");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&query.stdout),
            String::from_utf8_lossy(&query.stderr)
        );
        assert_eq!(query.status.code(), Some(1), "{text}");
        assert!(
            text.contains("BAD_REQUEST")
                && text.contains("has no query")
                && !text.contains("Rejection {"),
            "{text}"
        );

        // resolve of an id the ledger does not hold: without the command's
        // expiry nothing is provable (NEEDS_EXPIRY, with what to send);
        // with an open window it is ABSENT.
        let resolve = |extra: &[&str]| {
            let output = std::process::Command::new(cluster_common::BIN)
                .args([
                    "resolve",
                    "log",
                    "codes",
                    "0123456789abcdef0123456789abcdef",
                ])
                .args(extra)
                .arg("--config")
                .arg(&config)
                .arg("--node")
                .arg(&node)
                .output()
                .expect("run cellfleet resolve");
            (
                output.status.code(),
                String::from_utf8_lossy(&output.stdout).into_owned(),
            )
        };
        let (code, stdout) = resolve(&[]);
        assert_eq!(code, Some(0), "{stdout}");
        assert!(
            stdout.starts_with("NEEDS_EXPIRY") && stdout.contains("--expires-at-ms"),
            "{stdout}"
        );
        let open = (cluster_common::now_ms() + 60_000).to_string();
        let (code, stdout) = resolve(&["--expires-at-ms", &open]);
        assert_eq!(code, Some(0), "{stdout}");
        assert!(stdout.starts_with("ABSENT"), "{stdout}");

        let (code, stdout, stderr) = exec(&["nosuchkind", "codes", "append"]);
        assert_eq!(
            code,
            Some(1),
            "an unknown kind reaches no Cell: {stdout}{stderr}"
        );
    });
}

/// A SIGTERM sent the moment a node prints its ready line drains it (exit
/// 0). The handler used to be installed just after that line: sent from
/// here, as a supervisor would, such a signal killed about one node in
/// twenty (4 of 70 by hand) with no drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_right_after_the_ready_line_drains() {
    use std::io::BufRead;
    let mut cluster = Cluster::start(1, Store::Local, 5_000);
    assert!(cluster.terminate(0), "the first node drains");
    let config = cluster.path("n1.toml");
    for round in 0..40 {
        let mut child = cluster
            .node_command(&config, &[])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn node");
        let stdout = child.stdout.take().expect("piped");
        for line in std::io::BufReader::new(stdout).lines() {
            if line.expect("stdout").contains(" ready ") {
                break;
            }
        }
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
        let status = child.wait().expect("wait");
        assert_eq!(
            status.code(),
            Some(0),
            "round {round}: a node SIGTERMed at its ready line must drain and exit 0 ({status:?})"
        );
    }
}

/// `/healthz` is liveness: it fails once a node has stopped serving for
/// good. A second process with the same node id (and its own data
/// directory) replaces the first one's lease; the first one, which stays
/// up, says so on `/healthz` (503) as on `/readyz`, instead of "ok".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_fails_once_another_session_replaced_the_lease() {
    let mut cluster = Cluster::start(1, Store::Local, 2_000);
    let first = cluster.nodes[0].http;
    assert_eq!(
        cluster_common::http_get(first, "/healthz"),
        (200, "ok\n".to_owned())
    );
    let config = cluster.path("n1.toml");
    let second_dir = cluster.path("n1-second");
    let child = cluster
        .node_command(&config, &[])
        .env("CELLFLEET_DATA_DIR", &second_dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("spawn the second n1");
    let second = tokio::task::block_in_place(|| cluster.wait_ready("n1", child));
    let second_http = second.http;
    // Owned by the cluster from here on, so a failure below still stops it.
    cluster.nodes.push(second);
    // The first process learns at its next renewal (every lease / 3 or so).
    let (status, body) = cluster_common::wait_unhealthy(first, Duration::from_secs(20)).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.starts_with("stopped serving: "), "{body}");
    assert_eq!(cluster_common::http_get(first, "/readyz").0, 503);
    assert_eq!(
        cluster_common::http_get(second_http, "/healthz"),
        (200, "ok\n".to_owned())
    );
}

/// A port base whose five ports for one node (client BASE+1, peer +101,
/// HTTP +201, streams +301, console +401) are free now. Bases lie below
/// Linux's ephemeral range (32768..), so a port the kernel hands another
/// test's listener or outgoing connection never takes one of them between
/// this check and `dev`'s bind.
fn free_port_base() -> u16 {
    for _ in 0..200 {
        let base = 20_000 + rand::random::<u16>() % 12_000;
        let free = [1u16, 101, 201, 301, 401]
            .iter()
            .all(|offset| std::net::TcpListener::bind(("127.0.0.1", base + offset)).is_ok());
        if free {
            return base;
        }
    }
    panic!("no free port base found");
}

/// Everything the `dev` runs on `data` wrote to stderr, for a failed
/// assertion's message.
fn dev_logs(data: &std::path::Path) -> String {
    let name = data.file_name().unwrap().to_string_lossy().into_owned();
    let mut logs = String::new();
    let mut entries: Vec<_> = std::fs::read_dir(data.parent().unwrap())
        .unwrap()
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| {
            let file = path.file_name().unwrap().to_string_lossy();
            file.starts_with(&format!("{name}.")) && file.ends_with(".stderr")
        })
        .collect();
    entries.sort();
    for path in entries {
        logs.push_str(&format!("--- {}\n", path.display()));
        logs.push_str(&std::fs::read_to_string(&path).unwrap_or_default());
    }
    logs
}

/// Runs `cellfleet dev` on `data` until it prints "cluster ready" (or
/// exits), returning the process and what it printed. A start that lost one
/// of its ports to another process between `free_port_base` and the bind
/// is tried again on another base.
fn start_dev(data: &std::path::Path) -> (std::process::Child, String) {
    start_dev_nodes(data, 1)
}

/// [`start_dev`] with `nodes` nodes.
fn start_dev_nodes(data: &std::path::Path, nodes: u16) -> (std::process::Child, String) {
    for _ in 0..3 {
        let (child, printed) = start_dev_on(data, free_port_base(), nodes);
        if printed.contains("cluster ready") || !printed.contains("Address already in use") {
            return (child, printed);
        }
    }
    start_dev_on(data, free_port_base(), nodes)
}

fn start_dev_on(data: &std::path::Path, base: u16, nodes: u16) -> (std::process::Child, String) {
    use std::io::BufRead;
    use std::os::unix::process::CommandExt;
    let mut child = std::process::Command::new(cluster_common::BIN)
        .args([
            "dev",
            "--nodes",
            &nodes.to_string(),
            "--lease-ms",
            "2000",
            "--data",
        ])
        .arg(data)
        .arg("--port-base")
        .arg(base.to_string())
        // Its own process group, so a start that is given up on takes its
        // node with it.
        .process_group(0)
        .stdout(std::process::Stdio::piped())
        // A file, not a pipe nobody reads: the nodes' logs land here too.
        .stderr(
            std::fs::File::create(data.with_extension(format!("{base}.stderr")))
                .expect("stderr file"),
        )
        .spawn()
        .expect("run cellfleet dev");
    let stdout = child.stdout.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let mut printed = String::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while let Ok(line) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        printed.push_str(&line);
        printed.push('\n');
        if line.starts_with("cluster ready") {
            return (child, printed);
        }
    }
    // Not ready: stop `dev` and any node it started (a no-op when they
    // exited), so a retry owns `data` and its nodes' locks.
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &format!("-{}", child.id())])
        .status();
    let _ = child.kill();
    let _ = child.wait();
    let stderr = std::fs::read_to_string(data.with_extension(format!("{base}.stderr")));
    printed.push_str(&stderr.unwrap_or_default());
    (child, printed)
}

fn stop_dev(mut child: std::process::Child) -> std::process::ExitStatus {
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return child.wait().expect("wait");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `dev`'s nodes share its stderr. Each node writes a line in one call,
/// so their start lines (about 400 bytes, written at the same moment)
/// arrive whole; `eprintln!` wrote each formatted piece on its own, and
/// three nodes' start lines were seen interleaved mid-line.
#[test]
fn dev_nodes_lines_arrive_whole_on_the_shared_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("dev");
    let (child, printed) = start_dev_nodes(&data, 3);
    assert!(printed.contains("cluster ready"), "{printed}");
    assert!(stop_dev(child).success(), "{}", dev_logs(&data));
    let logs = dev_logs(&data);
    let starts: Vec<&str> = logs
        .lines()
        .filter(|line| line.contains("cells open at most"))
        .collect();
    assert_eq!(starts.len(), 3, "{logs}");
    for node in ["n1", "n2", "n3"] {
        let prefix = format!("cellfleet node {node}: open files ");
        assert!(
            starts.iter().any(|line| line.starts_with(&prefix)
                && line.ends_with(" bytes per connection")
                && line.matches("cells open at most").count() == 1),
            "{node}'s start line is not whole: {logs}"
        );
    }
}

/// The guide's workflow: run `cellfleet dev`, stop it, add a kind to
/// `kinds.toml`, run `dev` again. The second start used to refuse (the
/// cluster record's kinds digest differed, and `dev` had no way to accept
/// it); now it says it accepts the change, and the new kind serves next to
/// the data written before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_restarts_with_an_edited_kinds_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("dev");
    tokio::task::block_in_place(|| {
        let (child, printed) = start_dev(&data);
        assert!(printed.contains("cluster ready"), "{printed}");
        assert!(printed.contains("a changed"), "{printed}");
        let exec = |args: &[&str]| {
            std::process::Command::new(cluster_common::BIN)
                .arg("exec")
                .args(args)
                .arg("--config")
                .arg(data.join("client.toml"))
                .output()
                .expect("run cellfleet exec")
        };
        let before = exec(&["counter", "c1", "add", "--arg", "by=5"]);
        assert!(before.status.success(), "{before:?}\n{}", dev_logs(&data));
        assert!(
            stop_dev(child).success(),
            "the first dev did not drain cleanly\n{}",
            dev_logs(&data)
        );

        let mut kinds = std::fs::read_to_string(data.join("kinds.toml")).unwrap();
        kinds.push_str(
            "\n[kinds.notes]\nmigrations = [\"CREATE TABLE notes (text TEXT NOT NULL)\"]\n\n\
             [kinds.notes.commands.add]\nsql = [\"INSERT INTO notes (text) VALUES (:text)\"]\n",
        );
        std::fs::write(data.join("kinds.toml"), kinds).unwrap();
        let (child, printed) = start_dev(&data);
        assert!(
            printed.contains("cluster ready"),
            "dev refused the edited manifest: {printed}"
        );
        let added = exec(&["notes", "n1", "add", "--arg", "text=\"hi\""]);
        assert!(
            added.status.success(),
            "the new kind: {added:?}\n{}",
            dev_logs(&data)
        );
        let query = std::process::Command::new(cluster_common::BIN)
            .args(["query", "counter", "c1", "value", "--json", "--config"])
            .arg(data.join("client.toml"))
            .output()
            .expect("run cellfleet query");
        let text = String::from_utf8_lossy(&query.stdout);
        assert!(
            query.status.success() && text.contains('5'),
            "the old data: {text}\n{}",
            dev_logs(&data)
        );
        assert!(
            stop_dev(child).success(),
            "the second dev did not drain cleanly\n{}",
            dev_logs(&data)
        );
    });
}

/// A second `cellfleet dev` on a running one's data directory refuses at
/// once, naming the running cluster's pids, and touches nothing: the first
/// cluster keeps serving and its client config is unchanged (the second
/// used to rewrite it and replace the running nodes' leases).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_dev_on_a_running_data_directory_refuses_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("dev");
    tokio::task::block_in_place(|| {
        let (first, printed) = start_dev(&data);
        assert!(printed.contains("cluster ready"), "{printed}");
        let pid = first.id();
        let client_config = std::fs::read(data.join("client.toml")).unwrap();
        let second = std::process::Command::new(cluster_common::BIN)
            .args(["dev", "--nodes", "1", "--data"])
            .arg(&data)
            .arg("--port-base")
            .arg(free_port_base().to_string())
            .output()
            .expect("run the second dev");
        let stderr = String::from_utf8_lossy(&second.stderr);
        assert_eq!(second.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains("another `cellfleet dev` is running on")
                && stderr.contains(&format!("dev pid {pid}"))
                && stderr.contains("node pids n1="),
            "{stderr}"
        );
        assert_eq!(
            std::fs::read(data.join("client.toml")).unwrap(),
            client_config
        );
        let exec = std::process::Command::new(cluster_common::BIN)
            .args(["exec", "counter", "c1", "add", "--arg", "by=1", "--config"])
            .arg(data.join("client.toml"))
            .output()
            .expect("run cellfleet exec");
        assert!(
            exec.status.success(),
            "the first cluster stopped serving: {exec:?}"
        );
        assert!(stop_dev(first).success());
    });
}

/// Two `cellfleet node` processes never share a data directory (they would
/// write the same SQLite files): the second refuses to start and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_node_on_the_same_data_directory_refuses_to_start() {
    let cluster = Cluster::start(1, Store::Local, 3_000);
    let output = tokio::task::block_in_place(|| {
        cluster
            .node_command(&cluster.path("n1.toml"), &[])
            .output()
            .expect("run the second node")
    });
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("another cellfleet node is running on data_dir"),
        "{stderr}"
    );
    // The first one serves on.
    assert_eq!(
        cluster_common::http_get(cluster.nodes[0].http, "/healthz"),
        (200, "ok\n".to_owned())
    );
}

/// A kinds manifest that declares a kind named like a built-in or Durable
/// Streams one (here `ds_registry`) is refused at start, naming the kind:
/// it used to replace (or be replaced by) the built-in one silently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_kind_named_like_a_streams_kind_is_refused_at_start() {
    let cluster = Cluster::start(1, Store::Local, 3_000);
    let kinds = std::fs::read_to_string(cluster.path("kinds.toml")).expect("kinds");
    std::fs::write(
        cluster.path("kinds-shadowing.toml"),
        format!("{kinds}\n[kinds.ds_registry]\nmigrations = [\"CREATE TABLE t (x)\"]\n"),
    )
    .expect("write");
    let config = std::fs::read_to_string(cluster.path("n1.toml"))
        .expect("n1.toml")
        .replace(
            "manifest = \"kinds.toml\"",
            "manifest = \"kinds-shadowing.toml\"",
        );
    std::fs::write(cluster.path("n1-shadowing.toml"), config).expect("write");
    let output = tokio::task::block_in_place(|| {
        cluster
            .node_command(&cluster.path("n1-shadowing.toml"), &[])
            .env("CELLFLEET_DATA_DIR", cluster.path("n1-shadowing"))
            .output()
            .expect("run node")
    });
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("kinds manifest")
            && stderr.contains("kind \"ds_registry\" is defined twice"),
        "{stderr}"
    );
}

/// Arguments too large for a command line: `--arg NAME=@FILE` and
/// `--args-json -` (stdin), through the binary. A 200 KB value (past
/// Linux's 128 KiB bound on one argument) reaches the Cell whole, which
/// measures it against the kind's 64 KiB payload bound; 60 KB applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_reads_large_arguments_from_a_file_and_from_stdin() {
    use std::io::Write;
    let cluster = Cluster::start(1, Store::Local, 3_000);
    let config = cluster.path("client.toml");
    let node = cluster.nodes[0].client.to_string();
    let exec_file = |tag: &str| {
        std::fs::write(cluster.path("tag.txt"), tag).unwrap();
        std::process::Command::new(cluster_common::BIN)
            .args(["exec", "log", "big", "append", "--arg"])
            .arg(format!("tag=@{}", cluster.path("tag.txt").display()))
            .arg("--config")
            .arg(&config)
            .arg("--node")
            .arg(&node)
            .output()
            .expect("run exec")
    };
    let fits = "t".repeat(60_000);
    tokio::task::block_in_place(|| {
        let too_big = exec_file(&"t".repeat(200_000));
        let stdout = String::from_utf8_lossy(&too_big.stdout);
        assert_eq!(too_big.status.code(), Some(4), "{too_big:?}");
        assert!(stdout.contains("payload of about 200016 bytes"), "{stdout}");
        let applied = exec_file(&fits);
        assert!(applied.status.success(), "{applied:?}");
        let mut from_stdin = std::process::Command::new(cluster_common::BIN)
            .args([
                "exec",
                "log",
                "big",
                "append",
                "--args-json",
                "-",
                "--config",
            ])
            .arg(&config)
            .arg("--node")
            .arg(&node)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run exec");
        from_stdin
            .stdin
            .take()
            .unwrap()
            .write_all(br#"{"tag": "from-stdin"}"#)
            .unwrap();
        let output = from_stdin.wait_with_output().unwrap();
        assert!(output.status.success(), "{output:?}");
    });
    let mut client = cluster.client("dev");
    let counts = client.log_counts(cluster.nodes[0].client, "big").await;
    assert_eq!(counts.get(&fits), Some(&1));
    assert_eq!(counts.get("from-stdin"), Some(&1));
    assert_eq!(counts.len(), 2, "the rejected one is not there");
}

/// Host names work wherever an endpoint goes (what a DNS or Kubernetes
/// deployment needs): nodes advertise `localhost` in their leases, so peers
/// forward to each other by name, and the CLI's `--node localhost:PORT`
/// connects by name; the certificates' names are checked (dev certificates
/// name `localhost`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_may_be_host_names() {
    let cluster = Cluster::start_with_env(
        3,
        Store::Local,
        3_000,
        &[("CELLFLEET_ADVERTISE_HOST", "localhost")],
    );
    let config = cluster.path("client.toml");
    let first_port = cluster.nodes[0].client.port();
    let exec = |key: &str| {
        std::process::Command::new(cluster_common::BIN)
            .args([
                "exec",
                "log",
                key,
                "append",
                "--arg",
                "tag=\"named\"",
                "--json",
                "--config",
            ])
            .arg(&config)
            .arg("--node")
            .arg(format!("localhost:{first_port}"))
            .output()
            .expect("run cellfleet exec")
    };
    let mut served_elsewhere = false;
    for i in 0..8 {
        let output = tokio::task::block_in_place(|| exec(&format!("named-{i}")));
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{output:?}");
        let view: serde_json::Value = serde_json::from_str(stdout.trim()).expect("json");
        served_elsewhere |= view["served_by"] != cluster.nodes[0].id.as_str();
    }
    assert!(
        served_elsewhere,
        "no command was forwarded to a peer by name"
    );
    let leases = tokio::task::block_in_place(|| {
        std::process::Command::new(cluster_common::BIN)
            .args(["leases", "--json", "--config"])
            .arg(&config)
            .arg("--node")
            .arg(format!("localhost:{first_port}"))
            .output()
            .expect("run cellfleet leases")
    });
    let text = String::from_utf8_lossy(&leases.stdout);
    assert!(
        leases.status.success() && text.contains("localhost:"),
        "{text}"
    );
}

/// Failures that reach no Cell say what they are and what to do: a Cell
/// that does not exist (NOT_FOUND, not "is the cluster running?"), a port
/// that does not speak TLS (NOT_TLS), a port nobody listens on
/// (UNREACHABLE), and another cluster's client certificate (CERTIFICATE).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_errors_name_their_category() {
    let cluster = Cluster::start(1, Store::Local, 3_000);
    let config = cluster.path("client.toml");
    let client_port = cluster.nodes[0].client.to_string();
    let run = |args: &[&str], config: &std::path::Path, node: &str| {
        let output = std::process::Command::new(cluster_common::BIN)
            .args(args)
            .arg("--config")
            .arg(config)
            .arg("--node")
            .arg(node)
            .output()
            .expect("run cellfleet");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        (output.status.code(), text)
    };
    // Another cluster's CA and client certificate, with this cluster's key.
    let other = cluster.path("other");
    let status = std::process::Command::new(cluster_common::BIN)
        .args(["dev", "--no-start", "--nodes", "1", "--data"])
        .arg(&other)
        .status()
        .expect("run dev --no-start");
    assert!(status.success());
    let foreign = std::fs::read_to_string(&config)
        .unwrap()
        .replace("certs/", &format!("{}/certs/", other.display()));
    std::fs::write(cluster.path("foreign.toml"), foreign).unwrap();
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().to_string()
    };
    let http = cluster.nodes[0].http.to_string();
    let streams = cluster.nodes[0]
        .streams
        .expect("a streams listener")
        .to_string();
    tokio::task::block_in_place(|| {
        let cases: [(&[&str], std::path::PathBuf, &str, &str); 5] = [
            (
                &["cell", "show", "kv", "nosuchcell"],
                config.clone(),
                &client_port,
                "NOT_FOUND",
            ),
            // An HTTP server answers the TLS hello with plain HTTP.
            (&["leases"], config.clone(), &streams, "NOT_TLS"),
            (&["leases"], config.clone(), &closed, "UNREACHABLE"),
            // The metrics port waits for a request head: no TLS answer.
            (&["leases"], config.clone(), &http, "UNREACHABLE"),
            (
                &["leases"],
                cluster.path("foreign.toml"),
                &client_port,
                "CERTIFICATE",
            ),
        ];
        for (args, config, node, category) in cases {
            let (code, text) = run(args, &config, node);
            assert_eq!(code, Some(1), "{args:?}: {text}");
            assert!(
                text.contains(&format!("error: {category} ")),
                "{args:?} at {node}: {text}"
            );
            assert!(text.contains("next: "), "{text}");
        }
    });
}

/// The operator tables as a user reads them: `leases` shows when each node
/// last renewed and marks a killed node `late` while its lease still
/// runs; `cells` marks that owner, keeps long keys aligned, and pages with
/// `--page-token`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_and_cells_tell_a_dead_owner_and_page() {
    let mut cluster = Cluster::start(2, Store::Local, 6_000);
    let mut client = cluster.client("dev");
    let via = cluster.nodes[0].client;
    let long_key = "k".repeat(40);
    let mut owners = HashMap::new();
    for key in ["a", "b", "c", "d", long_key.as_str()] {
        let request = client.command(
            "log",
            key,
            "append",
            serde_json::json!({ "tag": "x" }),
            rand::random(),
        );
        let response = client.execute(via, request).await.expect("append");
        owners.insert(key.to_owned(), response.served_by);
    }
    let victim_name = cluster.nodes[1].id.clone();
    let victim_owns = owners.values().any(|owner| *owner == victim_name);
    let config = cluster.path("client.toml");
    let run = |args: &[&str]| {
        let output = std::process::Command::new(cluster_common::BIN)
            .args(args)
            .arg("--config")
            .arg(&config)
            .arg("--node")
            .arg(via.to_string())
            .output()
            .expect("run cellfleet");
        assert!(output.status.success(), "{args:?}: {output:?}");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let table = tokio::task::block_in_place(|| run(&["cells"]));
    // The TXID column is the root's, and the table says newer records
    // wait in the node log (a Cell just written shows its root's TXID).
    assert!(
        table.contains(" ROOT TXID  CELL")
            && table.contains("newer records wait in the node log until the next checkpoint"),
        "{table}"
    );
    // The rows of kind `log` (KIND is the first column).
    let lines: Vec<&str> = table.lines().filter(|l| l.starts_with("log ")).collect();
    assert_eq!(lines.len(), 5, "{table}");
    let cell_column = |line: &str| line.rfind("  ").expect("CELL column");
    assert!(
        lines
            .iter()
            .all(|l| cell_column(l) == cell_column(lines[0])),
        "columns not aligned:\n{table}"
    );
    // Pages of two, followed by their tokens, list each Cell once.
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    for _ in 0..10 {
        let mut args = vec!["cells", "--limit", "2", "--json"];
        if let Some(token) = &token {
            args.extend(["--page-token", token.as_str()]);
        }
        let page: serde_json::Value =
            serde_json::from_str(tokio::task::block_in_place(|| run(&args)).trim()).expect("json");
        for cell in page["cells"].as_array().unwrap() {
            seen.push(cell["cell_id"].as_str().unwrap().to_owned());
        }
        match page["next_page_token"].as_str() {
            Some(next) if !next.is_empty() => token = Some(next.to_owned()),
            _ => break,
        }
    }
    let unique: std::collections::HashSet<_> = seen.iter().collect();
    assert_eq!((seen.len(), unique.len()), (5, 5), "{seen:?}");

    // Kill the other node: while its lease runs it shows late, and so do
    // the Cells it owns.
    cluster.kill9(1);
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    let leases = tokio::task::block_in_place(|| run(&["leases"]));
    let row = leases
        .lines()
        .find(|l| l.starts_with(&victim_name))
        .expect("victim row");
    assert!(row.contains(" late "), "{leases}");
    assert!(
        leases.lines().next().unwrap().contains("RENEWED"),
        "{leases}"
    );
    if victim_owns {
        let cells = tokio::task::block_in_place(|| run(&["cells"]));
        assert!(cells.contains(&format!("{victim_name} (late)")), "{cells}");
    }
}

/// `cellfleet store export`: one Cell's published state out of the bucket
/// as a SQLite file any tool opens, with no node involved; a Cell that is
/// not there is a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_export_writes_a_cell_s_database_from_the_bucket() {
    let cluster = Cluster::start(1, Store::Local, 3_000);
    let mut client = cluster.client("dev");
    for (n, value) in ["dark", "light"].iter().enumerate() {
        let request = client.command(
            "kv",
            "settings",
            "put",
            serde_json::json!({ "key": format!("k{n}"), "value": value }),
            rand::random(),
        );
        let response = client
            .execute(cluster.nodes[0].client, request)
            .await
            .expect("put");
        assert!(applied(&response), "{response:?}");
    }
    let out = cluster.path("settings.db");
    let export = |kind: &str, key: &str, out: &std::path::Path| {
        std::process::Command::new(cluster_common::BIN)
            .args(["store", "export", kind, key, "--dir"])
            .arg(cluster.path("store"))
            .arg("--out")
            .arg(out)
            .output()
            .expect("run store export")
    };
    let output = tokio::task::block_in_place(|| export("kv", "settings", &out));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    assert!(stdout.contains("exported kv/settings"), "{stdout}");
    let db = rusqlite::Connection::open(&out).unwrap();
    let rows: Vec<(String, String)> = db
        .prepare("SELECT key, value FROM kv ORDER BY key")
        .unwrap()
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        rows,
        vec![
            ("k0".into(), "\"dark\"".into()),
            ("k1".into(), "\"light\"".into())
        ]
    );
    let missing = tokio::task::block_in_place(|| export("kv", "nosuch", &cluster.path("n.db")));
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("no Cell kv/nosuch"),
        "{missing:?}"
    );
}

/// A cluster configured for long signed windows (`[envelope]
/// max_window_ms` of two days) runs a command whose window is 30 hours,
/// sent by `cellfleet exec` with `window_ms` in its client config: the
/// Cell's own bound on an expiry follows the router's, so what the router
/// admits is not refused inside the Cell. A window past the configured
/// maximum is still refused, before it reaches any Cell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_the_router_admits_runs_in_the_cell() {
    const TWO_DAYS_MS: u64 = 2 * 24 * 3600 * 1000;
    let cluster = Cluster::start_with_setup(1, Store::Local, 3_000, &[], |dir| {
        let path = dir.join("n1.toml");
        let text = std::fs::read_to_string(&path).expect("n1.toml");
        let wide = text.replace(
            "max_window_ms = 600000",
            &format!("max_window_ms = {TWO_DAYS_MS}"),
        );
        assert_ne!(wide, text, "n1.toml sets max_window_ms");
        std::fs::write(&path, wide).expect("write n1.toml");
        HashMap::new()
    });
    let base = std::fs::read_to_string(cluster.write_client_config("client-base.toml"))
        .expect("client config");
    let exec = |name: &str, window_ms: u64, tag: &str| {
        let config = cluster.path(name);
        std::fs::write(&config, format!("{base}window_ms = {window_ms}\n")).expect("write");
        tokio::task::block_in_place(|| {
            std::process::Command::new(cluster_common::BIN)
                .args(["exec", "log", "long-window", "append", "--arg"])
                .arg(format!("tag=\"{tag}\""))
                .arg("--config")
                .arg(&config)
                .output()
                .expect("run cellfleet exec")
        })
    };
    let thirty_hours = exec("client-30h.toml", 30 * 3600 * 1000, "thirty-hours");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&thirty_hours.stdout),
        String::from_utf8_lossy(&thirty_hours.stderr),
    );
    assert!(
        thirty_hours.status.success(),
        "a 30 h window under a 2 day maximum: exit {:?}: {stdout}{stderr}",
        thirty_hours.status
    );
    let three_days = exec("client-3d.toml", 3 * 24 * 3600 * 1000, "three-days");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&three_days.stdout),
        String::from_utf8_lossy(&three_days.stderr),
    );
    assert!(
        !three_days.status.success(),
        "a 3 day window over a 2 day maximum must be refused: {stdout}{stderr}"
    );
    assert!(stderr.contains("window"), "{stdout}{stderr}");
    // Exactly the first one ran.
    let mut client = cluster.client("dev");
    let counts = client
        .log_counts(cluster.nodes[0].client, "long-window")
        .await;
    assert_eq!(counts.get("thirty-hours"), Some(&1), "{counts:?}");
    assert_eq!(counts.get("three-days"), None, "{counts:?}");
}
