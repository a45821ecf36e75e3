//! The public Durable Streams conformance suite (npm
//! `@durable-streams/server-conformance-tests`, pinned by
//! `conformance/package-lock.json`) against an in-process node on the
//! local-directory store, subscriptions included.
//!
//! `scripts/conformance.sh` installs the pinned Node (from PyPI) and the
//! suite into `~/.cache` on first use, then runs vitest against the URL
//! given here. Every test of the suite must pass. The install step has
//! tests of its own, so a lock file that npm refuses fails there, naming
//! the Node and npm, instead of as a suite that ran 0 tests.

use std::time::Duration;

use cellfleet_streams::StreamsConfig;

mod common;

/// The suite's test count at the pinned version (subscriptions included).
const SUITE_TESTS: u32 = 338;

/// `(passed, failed, skipped)` from vitest's "Tests" summary line.
fn summary(output: &str) -> Option<(u32, u32, u32)> {
    let line = output
        .lines()
        .map(strip_ansi)
        .find(|line| line.trim_start().starts_with("Tests "))?;
    let count = |word: &str| -> u32 {
        line.split('|')
            .filter_map(|part| {
                let part = part.trim().trim_start_matches("Tests").trim();
                let (n, rest) = part.split_once(' ')?;
                rest.starts_with(word)
                    .then(|| n.parse::<u32>().ok())
                    .flatten()
            })
            .sum()
    };
    Some((count("passed"), count("failed"), count("skipped")))
}

fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[test]
fn summary_parses_vitest_lines() {
    let line = "      Tests  11 failed | 321 passed | 6 skipped (338)";
    assert_eq!(summary(line), Some((321, 11, 6)));
    let colored = "\u{1b}[2m      Tests \u{1b}[22m \u{1b}[1m\u{1b}[32m338 passed\u{1b}[39m\u{1b}[22m\u{1b}[90m (338)\u{1b}[39m";
    assert_eq!(summary(colored), Some((338, 0, 0)));
    assert_eq!(summary("no summary here"), None);
}

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/conformance.sh");

/// The exit code `scripts/conformance.sh` gives a failed install.
const INSTALL_FAILED: i32 = 3;

fn output_text(output: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn install_step_accepts_the_committed_lock_with_the_pinned_node() {
    let output = std::process::Command::new("bash")
        .arg(SCRIPT)
        .arg("--install-only")
        // What CI and a new user get: the script's own choice of Node.
        .env_remove("CELLFLEET_NODE_SYSTEM")
        .output()
        .expect("run scripts/conformance.sh (needs bash)");
    let text = output_text(&output);
    assert!(
        output.status.success(),
        "the conformance install failed ({}):\n{text}",
        output.status
    );
    // The pinned pair from scripts/node.sh, whatever Node the system has.
    assert!(
        text.contains("conformance suite installed: node v22.20.0, npm 10.9.3 from ")
            && text.contains("vitest vitest/4."),
        "the install did not report the pinned Node, npm and vitest:\n{text}"
    );
}

#[test]
fn install_step_fails_loudly_naming_node_and_npm_when_npm_refuses_the_lock() {
    // A package.json that asks for a dependency its lock file lacks: every
    // npm's `npm ci` refuses it before fetching anything.
    let src = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    std::fs::write(
        src.path().join("package.json"),
        r#"{"name":"refused","private":true,"dependencies":{"is-number":"7.0.0"}}"#,
    )
    .unwrap();
    std::fs::write(
        src.path().join("package-lock.json"),
        r#"{"name":"refused","lockfileVersion":3,"requires":true,"packages":{"":{"name":"refused"}}}"#,
    )
    .unwrap();
    std::fs::write(src.path().join("conformance.test.mjs"), "").unwrap();
    let output = std::process::Command::new("bash")
        .arg(SCRIPT)
        // A server that is not there: the script must stop before it.
        .arg("http://127.0.0.1:9")
        .env_remove("CELLFLEET_NODE_SYSTEM")
        .env("DS_CONFORMANCE_SRC", src.path())
        .env("DS_CONFORMANCE_DIR", work.path().join("suite"))
        .output()
        .expect("run scripts/conformance.sh (needs bash)");
    let text = output_text(&output);
    assert_eq!(
        output.status.code(),
        Some(INSTALL_FAILED),
        "a refused lock must end the script as a failed install:\n{text}"
    );
    assert!(
        text.contains("conformance install FAILED with node v22.20.0, npm 10.9.3")
            && text.contains("npm ci refused or failed")
            && text.contains("is-number"),
        "the failure does not name Node, npm and npm's reason:\n{text}"
    );
    assert!(
        summary(&text).is_none(),
        "no suite may run after a failed install:\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn public_suite_passes_on_one_node() {
    let server = common::start(
        "conformance",
        StreamsConfig {
            long_poll_timeout: Duration::from_millis(500),
            // The suite's webhook receivers listen on loopback.
            allow_loopback_webhooks: true,
            ..StreamsConfig::default()
        },
    )
    .await;
    let url = format!("http://{}", server.address);

    let output = tokio::process::Command::new("bash")
        .arg(SCRIPT)
        .arg(&url)
        .env("DS_SUBSCRIPTIONS", "1")
        .env("NO_COLOR", "1")
        .output()
        .await
        .expect("run scripts/conformance.sh (needs bash)");
    let text = output_text(&output);
    assert_ne!(
        output.status.code(),
        Some(INSTALL_FAILED),
        "the conformance suite did not install:\n{text}"
    );
    let Some((passed, failed, skipped)) = summary(&text) else {
        panic!("no vitest summary in the conformance output:\n{text}");
    };
    assert!(
        failed == 0 && skipped == 0 && passed == SUITE_TESTS,
        "conformance: {passed} passed, {failed} failed, {skipped} skipped of {SUITE_TESTS}\n{text}"
    );
    assert!(output.status.success(), "vitest exited {:?}", output.status);
}
