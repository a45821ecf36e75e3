//! The Python package (`clients/python`) installed with pip and tested against real node processes: its stubs are current, its calls sign, route and retry like the Rust crate, and commands across an owner's kill -9 apply exactly once (`scripts/python-package.sh`).

mod cluster_common;

use cluster_common::{Cluster, Store};

#[test]
fn the_python_package_passes_its_tests_against_a_real_cluster() {
    let cluster = Cluster::start(3, Store::Local, 2_000);
    let config = cluster.write_client_config("python-client.toml");
    let nodes: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| format!("{}={}={}", n.id, n.child.id(), n.client))
        .collect();
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/python-package.sh");
    let output = std::process::Command::new("bash")
        .arg(&script)
        .env("CELLFLEET_CONFIG", &config)
        .env("CELLFLEET_TEST_NODES", nodes.join(","))
        .output()
        .expect("run scripts/python-package.sh");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the Python package's tests failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    assert!(stdout.contains("stubs are current"), "{stdout}");
    // unittest reports on stderr: every test ran and passed.
    assert!(stderr.contains("Ran 11 tests"), "{stderr}");
    assert!(stderr.trim_end().ends_with("OK"), "{stderr}");
}
