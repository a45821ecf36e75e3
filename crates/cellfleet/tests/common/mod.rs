//! Shared helpers for the binary's integration tests: the real Litestream
//! binary and running commands with their output on failure.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The Litestream 0.5.17 binary: `CELLFLEET_LITESTREAM`, or installed by
/// `scripts/litestream.sh` into a cached virtualenv.
pub fn litestream() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Ok(path) = std::env::var("CELLFLEET_LITESTREAM") {
            return PathBuf::from(path);
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/litestream.sh");
        let out = Command::new("bash")
            .arg(&script)
            .output()
            .expect("run scripts/litestream.sh");
        assert!(
            out.status.success(),
            "installing litestream failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    })
}

/// The `cellfleet` binary under test.
pub fn cellfleet() -> Command {
    Command::new(env!("CARGO_BIN_EXE_cellfleet"))
}

/// Run `command`, fail the test with its output unless it succeeds, and
/// return its stdout.
pub fn run(mut command: Command) -> String {
    let out = command.output().expect("spawn");
    assert!(
        out.status.success(),
        "{command:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
