//! kill -9 at the moments a Cell's durable state changes hands, with real
//! node processes on SeaweedFS and the fault matrix's workload
//! (`fault_load`): the fault proxy (`fault_proxy`) catches the root write
//! that makes one step of a Cell's life — an activation (a new Cell's
//! first root, or a takeover), a checkpoint, a compaction, a drain's
//! release — and holds it, either never passed on (lost) or applied by the
//! store with its reply held back (landed), while the test kills the node
//! that wrote it. Then the survivors must take its Cells over: every Cell
//! serves a fresh command, every acknowledged command is present exactly
//! once through every node (the killed ones started again), and no command
//! fails: the client library rides out each takeover. RELIABILITY.md keeps the
//! figures; timings are never asserted.

mod cluster_common;
mod fault_load;
mod fault_proxy;

use std::time::Duration;

use cluster_common::{Cluster, NodeSetup, Store};
use fault_load::Load;
use fault_proxy::{step, Caught, Fate, FaultProxy, RootStep, Seen};

const LEASE_MS: u64 = 5_000;
/// Records past the root that make an open Cell checkpoint: low, so that
/// the workload's Cells checkpoint several times a second and reach a
/// compaction (a chain of 32 files) within seconds.
const CHECKPOINT_RECORDS: &str = "8";
/// The workload before the catch is armed.
const BEFORE: Duration = Duration::from_millis(1_500);
/// Longest the workload may take to make the caught step.
const CATCH_BOUND: Duration = Duration::from_secs(90);
/// The workload after the Cells served again, before the check.
const AFTER: Duration = Duration::from_secs(1);

/// How a scenario reaches its crash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reach {
    /// Armed while the workload runs: the next such root write, from
    /// whichever node makes it, whose node is killed.
    Running,
    /// Armed before the workload starts: the first root of one of its new
    /// Cells.
    NewCells,
    /// A checkpoint's writer killed first (its write lost); then a
    /// survivor's takeover of one of its Cells is caught and that survivor
    /// killed too: one node is left to take both over.
    Takeover,
    /// The owner of the load's first Cell drains (SIGTERM) and is killed at
    /// its first release of one of the load's Cells.
    Drain,
}

const SCENARIOS: [(&str, RootStep, Fate, Reach); 9] = [
    (
        "checkpoint-lost",
        RootStep::Checkpoint,
        Fate::Lost,
        Reach::Running,
    ),
    (
        "checkpoint-landed",
        RootStep::Checkpoint,
        Fate::Landed,
        Reach::Running,
    ),
    (
        "compaction-lost",
        RootStep::Compaction,
        Fate::Lost,
        Reach::Running,
    ),
    (
        "compaction-landed",
        RootStep::Compaction,
        Fate::Landed,
        Reach::Running,
    ),
    (
        "activation-new-lost",
        RootStep::Activation,
        Fate::Lost,
        Reach::NewCells,
    ),
    (
        "activation-new-landed",
        RootStep::Activation,
        Fate::Landed,
        Reach::NewCells,
    ),
    (
        "activation-takeover-landed",
        RootStep::Activation,
        Fate::Landed,
        Reach::Takeover,
    ),
    (
        "drain-release-lost",
        RootStep::Release,
        Fate::Lost,
        Reach::Drain,
    ),
    (
        "drain-release-landed",
        RootStep::Release,
        Fate::Landed,
        Reach::Drain,
    ),
];

/// Waits for the armed catch; panics naming the scenario when the
/// workload never made the step.
async fn caught(
    name: &str,
    step: RootStep,
    receiver: tokio::sync::oneshot::Receiver<Caught>,
) -> Caught {
    let caught = tokio::time::timeout(CATCH_BOUND, receiver)
        .await
        .unwrap_or_else(|_| panic!("{name}: no {step:?} root write within {CATCH_BOUND:?}"))
        .expect("the proxy keeps the catch");
    assert_eq!(caught.step, step, "{name}");
    caught
}

/// Kills the node that made `caught` (or `fallback`, for a release, which
/// names no owner), then lets the held write's request end unanswered.
/// Returns the killed node's index.
fn kill_writer(
    cluster: &mut Cluster,
    proxy: &FaultProxy,
    name: &str,
    fate: Fate,
    caught: &Caught,
    fallback: Option<usize>,
) -> usize {
    let index = match &caught.owner {
        Some(owner) => cluster
            .nodes
            .iter()
            .position(|node| &node.id == owner)
            .unwrap_or_else(|| panic!("{name}: the root names {owner}, no node of the cluster")),
        None => fallback.unwrap_or_else(|| panic!("{name}: a root write without an owner")),
    };
    match fate {
        Fate::Lost => assert_eq!(caught.status, None, "{name}: a lost write never left"),
        Fate::Landed => assert_eq!(
            caught.status,
            Some(200),
            "{name}: the store applied the landed write"
        ),
    }
    cluster.kill9(index);
    proxy.let_go();
    let cell = fault_load::cells(name)
        .into_iter()
        .find(|(_, id)| caught.path.ends_with(&format!("/cells/{id}/root.json")))
        .map_or_else(|| caught.path.clone(), |(label, _)| label);
    println!(
        "{name}: {:?} of {cell} caught ({fate:?}); {} killed",
        caught.step, cluster.nodes[index].id
    );
    index
}

async fn scenario(
    cluster: &mut Cluster,
    proxy: &FaultProxy,
    (name, step, fate, reach): (&str, RootStep, Fate, Reach),
) -> String {
    // Only this load's Cells are caught (an earlier scenario's Cell falling
    // idle checkpoints too, and this check would not read it).
    let cells = fault_load::cells(name);
    let ids: Vec<String> = cells.iter().map(|(_, id)| id.clone()).collect();
    let armed = (reach == Reach::NewCells).then(|| proxy.catch(step, fate, ids.clone()));
    let mut load = Load::start(cluster, name);
    let mut killed = Vec::new();
    match reach {
        Reach::NewCells => {
            let caught = caught(name, step, armed.expect("armed")).await;
            killed.push(kill_writer(cluster, proxy, name, fate, &caught, None));
        }
        Reach::Running => {
            tokio::time::sleep(BEFORE).await;
            let receiver = proxy.catch(step, fate, ids.clone());
            let caught = caught(name, step, receiver).await;
            killed.push(kill_writer(cluster, proxy, name, fate, &caught, None));
        }
        Reach::Takeover => {
            tokio::time::sleep(BEFORE).await;
            let receiver = proxy.catch(RootStep::Checkpoint, Fate::Lost, ids.clone());
            let first = caught(name, RootStep::Checkpoint, receiver).await;
            // Armed before the first kill: the next activation is a
            // survivor taking one of the dead node's Cells over.
            let receiver = proxy.catch(step, fate, ids.clone());
            killed.push(kill_writer(cluster, proxy, name, Fate::Lost, &first, None));
            let caught = caught(name, step, receiver).await;
            killed.push(kill_writer(cluster, proxy, name, fate, &caught, None));
        }
        Reach::Drain => {
            tokio::time::sleep(BEFORE).await;
            // The node drained owns the load's first Cell, so its drain
            // releases one of the load's Cells.
            let (_, index) = load.first_owner(cluster);
            let receiver = proxy.catch(step, fate, ids.clone());
            cluster.signal(index, "TERM");
            let caught = caught(name, step, receiver).await;
            killed.push(kill_writer(
                cluster,
                proxy,
                name,
                fate,
                &caught,
                Some(index),
            ));
        }
    }
    let served_again = load.served_again().await;
    for index in killed {
        cluster.respawn(index, NodeSetup::default());
    }
    checked(load, cluster, name, served_again)
        .await
        .line("kill -9 at", name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_mid_step_loses_and_doubles_nothing() {
    let proxy = FaultProxy::start(fault_proxy::s3_upstream().await).await;
    let url = proxy.url();
    let mut cluster = Cluster::start_with_env(
        3,
        Store::S3 {
            prefix: cellfleet_store::testkit::unique_prefix("crash-points"),
        },
        LEASE_MS,
        &[
            ("CELLFLEET_S3_ENDPOINT", url.as_str()),
            ("CELLFLEET_LOG_CHECKPOINT_RECORDS", CHECKPOINT_RECORDS),
        ],
    );
    for crash in SCENARIOS {
        let in_subset = matches!(
            crash.0,
            "checkpoint-landed"
                | "compaction-lost"
                | "activation-takeover-landed"
                | "drain-release-lost"
        );
        if !fault_load::runs(crash.0, in_subset) {
            continue;
        }
        let line = scenario(&mut cluster, &proxy, crash).await;
        println!("{line}");
    }
    if fault_load::runs("sigstop-past-the-lease", true) {
        let line = paused(&mut cluster).await;
        println!("{line}");
    }
}

/// The load's check after a short while more, and that nothing was
/// refused: the survivors took every Cell over within the client's retry
/// budget (two nodes of three dead once made the library give up while
/// the third still answered).
async fn checked(
    load: Load,
    cluster: &Cluster,
    name: &str,
    served_again: Duration,
) -> fault_load::Summary {
    tokio::time::sleep(AFTER).await;
    let summary = load.finish(cluster, served_again).await;
    assert_eq!(
        summary.refused, 0,
        "{name}: failures seen: {:?}",
        summary.refusals_seen
    );
    summary
}

/// The owner of the load's first Cell stopped (SIGSTOP) for longer than
/// its lease, then woken (SIGCONT): its Cells are taken over while it
/// sleeps; once woken it must not serve what it held (the check reads
/// every acknowledged command through every node, the woken one too).
async fn paused(cluster: &mut Cluster) -> String {
    let name = "sigstop-past-the-lease";
    let mut load = Load::start(cluster, name);
    tokio::time::sleep(BEFORE).await;
    let (owner, index) = load.first_owner(cluster);
    cluster.signal(index, "STOP");
    tokio::time::sleep(Duration::from_millis(2 * LEASE_MS)).await;
    cluster.signal(index, "CONT");
    println!(
        "{name}: {owner} stopped for {} ms, then woken",
        2 * LEASE_MS
    );
    let served_again = load.served_again().await;
    let summary = checked(load, cluster, name, served_again).await;
    let http = cluster.nodes[index].http;
    let (health, body) = tokio::task::block_in_place(|| cluster_common::http_get(http, "/healthz"));
    format!(
        "{} (the woken {owner}'s /healthz: {health} {})",
        summary.line("paused owner", name),
        body.trim()
    )
}

/// The proxy's reading of root writes, on which every catch rests.
#[test]
fn root_writes_are_told_apart_by_session_chain_and_state() {
    let seen = |session: Option<&str>, chain: usize, released: bool| Seen {
        session: session.map(str::to_owned),
        owner: session.map(|_| "n1".to_owned()),
        chain,
        released,
    };
    let live = seen(Some("s1"), 3, false);
    assert_eq!(step(None, &live), RootStep::Activation);
    assert_eq!(
        step(Some(&live), &seen(Some("s2"), 3, false)),
        RootStep::Activation
    );
    assert_eq!(
        step(Some(&seen(None, 3, true)), &live),
        RootStep::Activation
    );
    assert_eq!(
        step(Some(&live), &seen(Some("s1"), 4, false)),
        RootStep::Checkpoint
    );
    assert_eq!(
        step(Some(&live), &seen(Some("s1"), 1, false)),
        RootStep::Compaction
    );
    assert_eq!(step(Some(&live), &live), RootStep::Other);
    assert_eq!(step(Some(&live), &seen(None, 3, true)), RootStep::Release);
    let root = br#"{"owner":"n2","owner_session":"abc","state":"active","chain":[{},{}]}"#;
    assert_eq!(
        Seen::parse(root),
        Some(Seen {
            session: Some("abc".into()),
            owner: Some("n2".into()),
            chain: 2,
            released: false
        })
    );
    assert_eq!(Seen::parse(b"not json"), None);
}
