//! Faults of one node's host, with real node processes on SeaweedFS and the
//! fault matrix's workload (`fault_load`): one node's wall clock skewed
//! (libfaketime), within and beyond the lease's drift margin, ahead and
//! behind. After each: every Cell serves a fresh command, every
//! acknowledged command is present exactly once through every node, and
//! nothing the client was told failed is present (RELIABILITY.md keeps the
//! figures; timings are never asserted).
//!
//! Scenarios that need a tool this machine lacks print `SKIPPED` and why;
//! `.ci/run` installs the tools and sets `CELLFLEET_REQUIRE_HOST_FAULTS=1`,
//! so there they cannot skip.

mod cluster_common;
mod fault_load;
mod fault_proxy;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cellfleet_client::v1;
use cluster_common::{metric, Cluster, NodeSetup, Store};
use fault_load::Load;

/// The nodes' lease (and the drift margin `cellfleet dev` gives it: 500 ms).
const LEASE_MS: u64 = 5_000;
/// The scenarios run one at a time: three clusters at once on two cores
/// would measure each other.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How long the workload runs with the fault in place.
const DURING: Duration = Duration::from_secs(8);

/// Says why a scenario cannot run here: a failure where CI requires it,
/// a printed `SKIPPED` elsewhere. Returns false when it must be skipped.
fn available(scenario: &str, missing: Option<String>) -> bool {
    let Some(why) = missing else {
        return true;
    };
    assert!(
        std::env::var_os("CELLFLEET_REQUIRE_HOST_FAULTS").is_none(),
        "{scenario}: {why} (CELLFLEET_REQUIRE_HOST_FAULTS is set, so it may not be skipped)"
    );
    println!("SKIPPED {scenario}: {why}");
    false
}

/// libfaketime's multi-threaded preload library, from Debian's `faketime`
/// package.
fn libfaketime() -> Result<PathBuf, String> {
    for dir in [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib",
    ] {
        let path = Path::new(dir).join("faketime/libfaketimeMT.so.1");
        if path.exists() {
            return Ok(path);
        }
    }
    Err("libfaketime is not installed (apt-get install faketime)".into())
}

/// A three-node cluster whose node n3 reads its wall clock `offset`
/// (libfaketime's relative form: "+0.4", "-3") off the true time; its
/// monotonic clock is left alone, as NTP leaves it.
fn skewed_cluster(library: &Path, offset: &str) -> Cluster {
    let env = vec![
        ("LD_PRELOAD".to_owned(), library.display().to_string()),
        ("FAKETIME".to_owned(), offset.to_owned()),
        ("FAKETIME_DONT_FAKE_MONOTONIC".to_owned(), "1".to_owned()),
        ("FAKETIME_NO_CACHE".to_owned(), "1".to_owned()),
    ];
    Cluster::start_with_setup(
        3,
        Store::S3 {
            prefix: cellfleet_store::testkit::unique_prefix("host-faults-skew"),
        },
        LEASE_MS,
        &[],
        move |_| {
            HashMap::from([(
                "n3".to_owned(),
                NodeSetup {
                    env,
                    wrapper: Vec::new(),
                },
            )])
        },
    )
}

/// Which clock skews are run: the drift margin is 500 ms and the
/// envelope's skew bound 500 ms; 3 s is beyond both, within the lease.
const SKEWS: [(&str, &str, Beyond, bool); 4] = [
    ("+0.4", "ahead-0.4s", Beyond::No, true),
    ("-0.4", "behind-0.4s", Beyond::No, false),
    ("+3", "ahead-3s", Beyond::Ahead, false),
    ("-3", "behind-3s", Beyond::Behind, true),
];

/// `base`, or `base` with a suffix, so that placement (rendezvous over
/// n1..n3, the same on every node) puts at least one of the load's Cells
/// on `node`: the skewed node must own some, not only pass commands on.
fn placed_on(base: &str, node: &str) -> String {
    let nodes: Vec<cellfleet_authority::NodeId> = ["n1", "n2", "n3"]
        .iter()
        .map(|id| cellfleet_authority::NodeId::new(*id).unwrap())
        .collect();
    std::iter::once(base.to_owned())
        .chain((1..).map(|n| format!("{base}-{n}")))
        .find(|name| {
            (0..fault_load::CELLS).any(|i| {
                let key = format!("{name}-{i}");
                let cell = cellfleet_authority::CellId::for_kind_key("log", key.as_bytes());
                cellfleet_router::hints::rendezvous_owner(&cell, &nodes)
                    .is_some_and(|owner| owner.as_str() == node)
            })
        })
        .expect("some name places a Cell on the node")
}

/// Whether a skew is beyond the margin, and which way.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Beyond {
    No,
    Ahead,
    Behind,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_a_skewed_clock_loses_and_doubles_nothing() {
    let _serial = SERIAL.lock().await;
    let library = match libfaketime() {
        Ok(library) => library,
        Err(why) => {
            available("clock skew", Some(why));
            return;
        }
    };
    for (offset, name, beyond, in_subset) in SKEWS {
        if !fault_load::runs(name, in_subset) {
            continue;
        }
        let mut cluster = skewed_cluster(&library, offset);
        let name = &placed_on(name, "n3");
        let mut load = Load::start(&cluster, name);
        tokio::time::sleep(DURING).await;
        // What n3 served under its skew (placement, not the test, decides
        // which of the load's Cells it owns).
        let n3_served = load.served_by("n3");
        // Healing: n3 drained and started again with the true clock.
        assert!(
            cluster.terminate(2),
            "{name}: n3 drains cleanly under its skew"
        );
        cluster.respawn(2, NodeSetup::default());
        let served_again = load.served_again().await;
        let summary = load.finish(&cluster, served_again).await;
        println!(
            "{} (n3 served {n3_served} of the load's commands under its skew)",
            summary.line(
                "clock skew",
                &format!("{name} (n3's wall clock {offset} s)")
            )
        );
        match beyond {
            // Within the margin the skew changes nothing a client sees.
            Beyond::No => {
                assert_eq!(
                    (summary.refused, summary.unknown),
                    (0, 0),
                    "{name}: {:?}",
                    summary.refusals_seen
                );
                assert!(n3_served > 0, "{name}: n3 served its Cells");
            }
            // A node behind the envelope's skew bound refuses commands
            // signed by a right clock as future-dated (applying nothing)
            // until its clock is right again.
            Beyond::Behind => {
                assert!(summary.refused > 0, "{name}: n3's Cells refused commands");
                assert_eq!(summary.unknown, 0, "{name}");
                assert_eq!(
                    summary.refused_codes,
                    BTreeSet::from([v1::ErrorCode::FutureDated]),
                    "{name}: {:?}",
                    summary.refusals_seen
                );
            }
            // Ahead, n3 judges the others' leases to end 3 s early: nothing
            // may be lost or doubled (checked above); what it refused, if
            // anything, is in the line.
            Beyond::Ahead => {}
        }
    }
}

/// A tmpfs mounted over a node's data directory, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `megabytes` at `path`; why it cannot, otherwise.
    fn mount(path: &Path, megabytes: u32) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(path).map_err(|e| format!("create {}: {e}", path.display()))?;
        let output = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={megabytes}m"), "tmpfs"])
            .arg(path)
            .output()
            .map_err(|e| format!("run mount: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "mounting a tmpfs needs root here: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        Ok(Tmpfs(path.to_owned()))
    }

    /// Fills the file system with one file until it is full; its size.
    fn fill(&self) -> u64 {
        use std::io::Write;
        let mut file = std::fs::File::create(self.0.join("filler")).expect("create the filler");
        let block = vec![0u8; 64 * 1024];
        let mut written = 0u64;
        loop {
            match file.write(&block) {
                Ok(0) => break,
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(28) => break, // ENOSPC
                Err(e) => panic!("fill {}: {e}", self.0.display()),
            }
        }
        let _ = file.sync_all();
        written
    }

    /// Frees what [`Tmpfs::fill`] took.
    fn free(&self) {
        std::fs::remove_file(self.0.join("filler")).expect("remove the filler");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_data_directory_loses_and_doubles_nothing() {
    let _serial = SERIAL.lock().await;
    let mounted = std::sync::Mutex::new(None);
    let cluster = Cluster::start_with_setup(
        3,
        Store::S3 {
            prefix: cellfleet_store::testkit::unique_prefix("host-faults-disk"),
        },
        LEASE_MS,
        &[],
        |dir| {
            *mounted.lock().unwrap() = Some(Tmpfs::mount(&dir.join("n3"), 64));
            HashMap::new()
        },
    );
    let tmpfs = match mounted.into_inner().unwrap().expect("prepared") {
        Ok(tmpfs) => tmpfs,
        Err(why) => {
            available("full data directory", Some(why));
            return;
        }
    };
    let name = "disk-full";
    let mut load = Load::start(&cluster, name);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let commands =
        |cluster: &Cluster| metric(&cluster.nodes[2], "cellfleet_runtime_commands_total");
    let before = commands(&cluster);
    // Placement is rendezvous hashing over the node ids, so which of the
    // scenario's Cells n3 owns is the same every run: some of them.
    assert!(before > 0.0, "n3 owns some of the scenario's Cells");
    let filled = tmpfs.fill();
    tokio::time::sleep(DURING).await;
    let during = commands(&cluster) - before;
    tmpfs.free();
    let served_again = load.served_again().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let summary = load.finish(&cluster, served_again).await;
    println!(
        "{} (the filler took {} KiB; n3 ran {during} commands while full)",
        summary.line("host fault", "n3's data directory full for 8 s"),
        filled / 1024
    );
    drop(cluster);
    drop(tmpfs);
}

/// A small network for partition scenarios: a bridge in the test's own
/// namespace, and one network namespace per node joined to it by a veth
/// pair. The test (the clients) reaches node `i` (0-based) at
/// `10.213.0.{i+2}` from `10.213.0.1`; the store (the fault proxy) listens
/// on `10.213.0.100`, so a node can be cut from the store, its peers or
/// everything with a route or a link of its own namespace.
struct Net {
    tag: String,
    nodes: usize,
    /// The link delay in place, if any.
    delayer: std::sync::Mutex<Option<Delayer>>,
}

/// Holds every packet a namespace's iptables rules send to NFQUEUE 0 for
/// `DELAY`, then lets it go, in order: a one-way link delay without netem
/// (which this kernel lacks). A thread of the test process enters the
/// namespace (setns applies to the calling thread only) and owns the
/// queue there.
struct Delayer {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Result<u64, String>>>,
}

/// The delay a delayed link adds to each packet.
const DELAY: Duration = Duration::from_millis(200);

impl Delayer {
    /// Starts holding the packets of namespace `ns`'s queue 0; returns
    /// once the queue is bound (so no packet meets an unbound queue).
    fn start(ns: &str) -> Result<Delayer, String> {
        let path = format!("/var/run/netns/{ns}");
        let stop = Arc::new(AtomicBool::new(false));
        let (bound, ready) = std::sync::mpsc::channel();
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || -> Result<u64, String> {
            let bind = || -> Result<nfq::Queue, String> {
                let file = std::fs::File::open(&path).map_err(|e| format!("{path}: {e}"))?;
                // Moves this thread only into the namespace.
                nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(|e| format!("setns {path}: {e}"))?;
                let mut queue = nfq::Queue::open().map_err(|e| format!("nfqueue: {e}"))?;
                queue.bind(0).map_err(|e| format!("bind queue 0: {e}"))?;
                queue
                    .set_queue_max_len(0, 16_384)
                    .map_err(|e| format!("queue length: {e}"))?;
                queue
                    .set_fail_open(0, true)
                    .map_err(|e| format!("fail open: {e}"))?;
                queue.set_nonblocking(true);
                Ok(queue)
            };
            let mut queue = match bind() {
                Ok(queue) => {
                    let _ = bound.send(Ok(()));
                    queue
                }
                Err(why) => {
                    let _ = bound.send(Err(why.clone()));
                    return Err(why);
                }
            };
            let mut held: std::collections::VecDeque<(std::time::Instant, nfq::Message)> =
                std::collections::VecDeque::new();
            let mut delayed = 0;
            loop {
                let stopping = stopping.load(Ordering::SeqCst);
                loop {
                    match queue.recv() {
                        Ok(message) => held.push_back((std::time::Instant::now() + DELAY, message)),
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                        Err(e) => return Err(format!("recv: {e}")),
                    }
                }
                while held
                    .front()
                    .is_some_and(|(due, _)| stopping || *due <= std::time::Instant::now())
                {
                    let (_, mut message) = held.pop_front().expect("a held packet");
                    message.set_verdict(nfq::Verdict::Accept);
                    queue
                        .verdict(message)
                        .map_err(|e| format!("verdict: {e}"))?;
                    delayed += 1;
                }
                if stopping {
                    let _ = queue.unbind(0);
                    return Ok(delayed);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        ready
            .recv()
            .map_err(|_| "the delay thread ended".to_owned())??;
        Ok(Delayer {
            stop,
            thread: Some(thread),
        })
    }

    /// Lets every held packet go; returns how many packets were delayed.
    fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        self.thread
            .take()
            .expect("running")
            .join()
            .expect("the delay thread")
            .unwrap_or_else(|why| panic!("link delay: {why}"))
    }
}

impl Drop for Delayer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The bridge's own address, which the clients' connections come from.
const NET_GATEWAY: &str = "10.213.0.1";
/// The store's address on the bridge.
const NET_STORE: &str = "10.213.0.100";

fn ip(args: &[&str]) -> Result<(), String> {
    let output = std::process::Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("run ip: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

impl Net {
    /// Builds the network for `nodes` nodes; why it cannot, otherwise.
    fn build(nodes: usize) -> Result<Net, String> {
        let net = Net {
            tag: format!("cf{}", std::process::id() % 10_000),
            nodes,
            delayer: std::sync::Mutex::new(None),
        };
        // What a killed earlier run left behind (the same addresses).
        Net::remove_leftovers();
        ip(&["link", "add", &net.bridge(), "type", "bridge"])?;
        ip(&[
            "addr",
            "add",
            &format!("{NET_GATEWAY}/24"),
            "dev",
            &net.bridge(),
        ])?;
        ip(&[
            "addr",
            "add",
            &format!("{NET_STORE}/24"),
            "dev",
            &net.bridge(),
        ])?;
        ip(&["link", "set", &net.bridge(), "up"])?;
        for i in 0..nodes {
            let (ns, host, inside) = (net.namespace(i), net.host_end(i), net.node_end(i));
            ip(&["netns", "add", &ns])?;
            ip(&[
                "link", "add", &host, "type", "veth", "peer", "name", &inside,
            ])?;
            ip(&["link", "set", &inside, "netns", &ns])?;
            ip(&["link", "set", &host, "master", &net.bridge(), "up"])?;
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}/24", net.address(i)),
                "dev",
                &inside,
            ])?;
            ip(&["-n", &ns, "link", "set", &inside, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    fn remove_leftovers() {
        let listed = std::process::Command::new("ip")
            .args(["-o", "link", "show", "type", "bridge"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        for line in listed.lines() {
            if let Some(name) = line.split(": ").nth(1) {
                if name.starts_with("cf") && name.ends_with("br") {
                    let _ = ip(&["link", "del", name]);
                }
            }
        }
        let namespaces = std::process::Command::new("ip")
            .args(["netns", "list"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        for line in namespaces.lines() {
            if let Some(name) = line.split_whitespace().next() {
                if name.starts_with("cf") && name.contains("-ns") {
                    let _ = ip(&["netns", "del", name]);
                }
            }
        }
    }

    fn bridge(&self) -> String {
        format!("{}br", self.tag)
    }
    fn namespace(&self, i: usize) -> String {
        format!("{}-ns{}", self.tag, i + 1)
    }
    fn host_end(&self, i: usize) -> String {
        format!("{}h{}", self.tag, i + 1)
    }
    fn node_end(&self, i: usize) -> String {
        format!("{}n{}", self.tag, i + 1)
    }
    fn address(&self, i: usize) -> String {
        format!("10.213.0.{}", i + 2)
    }

    /// How node `i` starts: inside its namespace, listening on its address.
    fn setup(&self, i: usize) -> NodeSetup {
        let address = self.address(i);
        NodeSetup {
            env: [
                "CELLFLEET_LISTEN_CLIENT",
                "CELLFLEET_LISTEN_PEER",
                "CELLFLEET_LISTEN_HTTP",
                "CELLFLEET_LISTEN_STREAMS",
                "CELLFLEET_LISTEN_CONSOLE",
            ]
            .iter()
            .map(|name| (name.to_string(), format!("{address}:0")))
            .collect(),
            wrapper: ["ip", "netns", "exec", &self.namespace(i)]
                .iter()
                .map(|s| s.to_string())
                .collect(),
        }
    }

    /// Cuts node `i` off as `cut` says.
    fn cut(&self, i: usize, cut: Cut) {
        let ns = self.namespace(i);
        match cut {
            Cut::Store => ip(&["-n", &ns, "route", "add", "blackhole", NET_STORE]),
            Cut::Peers => (0..self.nodes)
                .filter(|j| *j != i)
                .try_for_each(|j| ip(&["-n", &ns, "route", "add", "blackhole", &self.address(j)])),
            Cut::Everything => ip(&["-n", &ns, "link", "set", &self.node_end(i), "down"]),
            Cut::Throttled => {
                let dev = self.node_end(i);
                ip(&[
                    "netns", "exec", &ns, "tc", "qdisc", "add", "dev", &dev, "root", "tbf",
                ]
                .into_iter()
                .chain(["rate", "256kbit", "burst", "16kbit", "latency", "200ms"])
                .collect::<Vec<_>>())
            }
            Cut::LossOut => self.drop_randomly(i, &["OUTPUT"]),
            Cut::Loss => self.drop_randomly(i, &["OUTPUT", "INPUT"]),
            Cut::DelayOut => Delayer::start(&ns).and_then(|delayer| {
                *self.delayer.lock().unwrap() = Some(delayer);
                self.iptables(
                    i,
                    &[
                        "-A",
                        "OUTPUT",
                        "-o",
                        &self.node_end(i),
                        "-j",
                        "NFQUEUE",
                        "--queue-num",
                        "0",
                        "--queue-bypass",
                    ],
                )
            }),
        }
        .unwrap_or_else(|e| panic!("cut node {i} ({cut:?}): {e}"));
    }

    /// Undoes [`Net::cut`].
    /// Undoes [`Net::cut`]; returns how many packets a lossy link dropped
    /// or a delayed link held (0 for the other cuts).
    fn heal(&self, i: usize, cut: Cut) -> u64 {
        let ns = self.namespace(i);
        let mut touched = 0;
        match cut {
            Cut::Store => ip(&["-n", &ns, "route", "del", "blackhole", NET_STORE]),
            Cut::Peers => (0..self.nodes)
                .filter(|j| *j != i)
                .try_for_each(|j| ip(&["-n", &ns, "route", "del", "blackhole", &self.address(j)])),
            Cut::Everything => ip(&["-n", &ns, "link", "set", &self.node_end(i), "up"]),
            Cut::Throttled => {
                let dev = self.node_end(i);
                ip(&[
                    "netns", "exec", &ns, "tc", "qdisc", "del", "dev", &dev, "root",
                ])
            }
            Cut::LossOut | Cut::Loss => {
                touched = self.dropped(i);
                self.iptables(i, &["-F"])
            }
            Cut::DelayOut => self.iptables(i, &["-F"]).map(|()| {
                let delayer = self.delayer.lock().unwrap().take();
                touched = delayer.expect("a delay in place").stop();
            }),
        }
        .unwrap_or_else(|e| panic!("heal node {i} ({cut:?}): {e}"));
        touched
    }

    /// The packets node `i`'s iptables rules dropped so far.
    fn dropped(&self, i: usize) -> u64 {
        let output = std::process::Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.namespace(i),
                "iptables",
                "-L",
                "-v",
                "-n",
                "-x",
            ])
            .output()
            .expect("run iptables");
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                (fields.get(2) == Some(&"DROP")).then(|| fields[0].parse::<u64>().ok())?
            })
            .sum()
    }

    /// Drops `LOSS` of the packets on node `i`'s link, at random, in the
    /// given directions (`OUTPUT`, `INPUT`): iptables' `statistic` match,
    /// since this kernel has no netem.
    fn drop_randomly(&self, i: usize, chains: &[&str]) -> Result<(), String> {
        let dev = self.node_end(i);
        chains.iter().try_for_each(|chain| {
            let side = if *chain == "OUTPUT" { "-o" } else { "-i" };
            self.iptables(
                i,
                &[
                    "-A",
                    chain,
                    side,
                    &dev,
                    "-m",
                    "statistic",
                    "--mode",
                    "random",
                    "--probability",
                    LOSS,
                    "-j",
                    "DROP",
                ],
            )
        })
    }

    /// Runs iptables with `args` in node `i`'s namespace.
    fn iptables(&self, i: usize, args: &[&str]) -> Result<(), String> {
        let ns = self.namespace(i);
        let mut command = vec!["netns", "exec", &ns, "iptables"];
        command.extend_from_slice(args);
        ip(&command)
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for i in 0..self.nodes {
            let _ = ip(&["netns", "del", &self.namespace(i)]);
            let _ = ip(&["link", "del", &self.host_end(i)]);
        }
        let _ = ip(&["link", "del", &self.bridge()]);
    }
}

/// How a node is cut off.
#[derive(Clone, Copy, Debug)]
enum Cut {
    /// From the store only (its peers and clients still reach it).
    Store,
    /// From its peers only (the store and clients still reach it).
    Peers,
    /// From everything (its link down).
    Everything,
    /// Its outgoing traffic throttled to 256 kbit/s, packets queued over
    /// 200 ms dropped (`tc tbf`; what comes in is untouched: asymmetric).
    /// This machine's kernel has no `netem` qdisc for random loss and delay.
    Throttled,
    /// `LOSS` of its outgoing packets dropped at random (asymmetric).
    LossOut,
    /// `LOSS` of its packets dropped at random, each way.
    Loss,
    /// Each packet it sends held `DELAY` (asymmetric).
    DelayOut,
}

/// The share of packets a lossy link drops.
const LOSS: &str = "0.2";

/// The partition scenarios, each `DURING` (past the 5 s lease).
const CUTS: [(Cut, &str); 7] = [
    (Cut::Store, "an owner cut from the store only"),
    (Cut::Peers, "an owner cut from its peers only"),
    (Cut::Everything, "an owner cut from everything"),
    (
        Cut::Throttled,
        "an owner's outgoing traffic throttled to 256 kbit/s",
    ),
    (
        Cut::LossOut,
        "20% of an owner's outgoing packets dropped at random",
    ),
    (
        Cut::Loss,
        "20% of an owner's packets dropped at random, each way",
    ),
    (Cut::DelayOut, "every packet an owner sends delayed 200 ms"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_node_loses_and_doubles_nothing() {
    let _serial = SERIAL.lock().await;
    let net = match Net::build(3)
        .map_err(|why| format!("network namespaces need root here: {why}"))
        .and_then(|net| {
            let iptables = std::process::Command::new("iptables")
                .arg("--version")
                .output();
            match iptables {
                Ok(output) if output.status.success() => Ok(net),
                _ => Err("iptables is not installed (apt-get install iptables)".to_owned()),
            }
        }) {
        Ok(net) => net,
        Err(why) => {
            available("partitions", Some(why));
            return;
        }
    };
    // The store, as the nodes see it: the fault proxy on the bridge, in
    // front of SeaweedFS (it passes everything on here).
    let proxy = fault_proxy::FaultProxy::start_on(
        format!("{NET_STORE}:0").parse().unwrap(),
        fault_proxy::s3_upstream().await,
    )
    .await;
    let url = proxy.url();
    let mut cluster = Cluster::start_with_setup(
        3,
        Store::S3 {
            prefix: cellfleet_store::testkit::unique_prefix("host-faults-partition"),
        },
        LEASE_MS,
        &[("CELLFLEET_S3_ENDPOINT", url.as_str())],
        |dir| {
            // Node certificates for the nodes' addresses on the bridge.
            let certs = dir.join("certs");
            (0..3)
                .map(|i| {
                    let id = format!("n{}", i + 1);
                    for ext in ["pem", "key"] {
                        std::fs::remove_file(certs.join(format!("node-{id}.{ext}")))
                            .expect("remove dev's certificate");
                    }
                    let output = std::process::Command::new(cluster_common::BIN)
                        .args(["certs", "issue", "node", &id, "--dir"])
                        .arg(&certs)
                        .args(["--host", &net.address(i)])
                        .output()
                        .expect("run cellfleet certs");
                    assert!(output.status.success(), "{output:?}");
                    (id, net.setup(i))
                })
                .collect()
        },
    );
    for (cut, name) in CUTS {
        let scenario = format!("partition-{cut:?}").to_lowercase();
        let in_subset = matches!(cut, Cut::Everything | Cut::DelayOut);
        if !fault_load::runs(&scenario, in_subset) {
            continue;
        }
        let mut load = Load::start(&cluster, &scenario);
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        // The node cut is the owner of one of the load's Cells.
        let (owner, victim) = load.first_owner(&cluster);
        net.cut(victim, cut);
        tokio::time::sleep(DURING / 2).await;
        // What a client sees of the cut node: the time to connect to it
        // (its SYN-ACK goes out through the fault).
        let address = cluster.nodes[victim].client;
        let connect = tokio::task::block_in_place(|| {
            let started = std::time::Instant::now();
            std::net::TcpStream::connect_timeout(&address, Duration::from_secs(2))
                .map(|_| format!("{} ms", started.elapsed().as_millis()))
                .unwrap_or_else(|e| format!("failed ({e})"))
        });
        tokio::time::sleep(DURING / 2).await;
        let touched = net.heal(victim, cut);
        if matches!(cut, Cut::Loss | Cut::LossOut | Cut::DelayOut) {
            assert!(touched > 0, "{scenario}: no packet was dropped or delayed");
        }
        let served_again = load.served_again().await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let summary = load.finish(&cluster, served_again).await;
        // A node cut off past its lease whose lanes were sealed meanwhile
        // ends its session and says so on /healthz; as an operator would,
        // the test restarts it so that the next row has three nodes.
        let http = cluster.nodes[victim].http;
        let (health, _) =
            tokio::task::block_in_place(|| cluster_common::http_get(http, "/healthz"));
        let after = if health == 200 {
            "it stayed healthy".to_owned()
        } else {
            let code = tokio::task::block_in_place(|| cluster.terminate_code(victim));
            // It stops at once without draining (nothing is left to
            // drain) and says so with exit status 1.
            assert_eq!(
                code,
                Some(1),
                "{scenario}: a node whose session ended exits 1 on SIGTERM"
            );
            cluster.respawn(victim, net.setup(victim));
            format!("its session had ended (/healthz {health}); stopped (exit 1) and restarted")
        };
        println!(
            "{} (the node cut: {owner}; a connection to it during the cut: {connect}; packets dropped or delayed: {touched}; after: {after})",
            summary.line("partition", &format!("{name}, 8 s"))
        );
    }
    drop(cluster);
    drop(net);
}
