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

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use cellfleet_client::v1;
use cluster_common::{metric, Cluster, NodeSetup, Store};
use fault_load::Load;

/// The nodes' lease (and the drift margin `cellfleet dev` gives it: 500 ms).
const LEASE_MS: u64 = 5_000;
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
const SKEWS: [(&str, &str, Beyond); 4] = [
    ("+0.4", "ahead-0.4s", Beyond::No),
    ("-0.4", "behind-0.4s", Beyond::No),
    ("+3", "ahead-3s", Beyond::Ahead),
    ("-3", "behind-3s", Beyond::Behind),
];

/// Whether a skew is beyond the margin, and which way.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Beyond {
    No,
    Ahead,
    Behind,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_a_skewed_clock_loses_and_doubles_nothing() {
    let library = match libfaketime() {
        Ok(library) => library,
        Err(why) => {
            available("clock skew", Some(why));
            return;
        }
    };
    for (offset, name, beyond) in SKEWS {
        let mut cluster = skewed_cluster(&library, offset);
        let mut load = Load::start(cluster.library_client(), name);
        tokio::time::sleep(DURING).await;
        // Healing: n3 drained and started again with the true clock.
        assert!(
            cluster.terminate(2),
            "{name}: n3 drains cleanly under its skew"
        );
        cluster.respawn(2, NodeSetup::default());
        let served_again = load.served_again().await;
        let summary = load.finish(&cluster, served_again).await;
        println!(
            "{}",
            summary.line(
                "clock skew",
                &format!("{name} (n3's wall clock {offset} s)")
            )
        );
        match beyond {
            // Within the margin the skew changes nothing a client sees.
            Beyond::No => assert_eq!(
                (summary.refused, summary.unknown),
                (0, 0),
                "{name}: {:?}",
                summary.refusals_seen
            ),
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
    let mut load = Load::start(cluster.library_client(), name);
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
