//! The public Durable Streams conformance suite (npm
//! `@durable-streams/server-conformance-tests`, pinned by
//! `conformance/package-lock.json`) against an in-process node on the
//! local-directory store, subscriptions included.
//!
//! `scripts/conformance.sh` installs Node (when the system one is too old)
//! and the suite into `~/.cache` on first use, then runs vitest against the
//! URL given here. Every test of the suite must pass.

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

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/conformance.sh");
    let output = tokio::process::Command::new("bash")
        .arg(script)
        .arg(&url)
        .env("DS_SUBSCRIPTIONS", "1")
        .env("NO_COLOR", "1")
        .output()
        .await
        .expect("run scripts/conformance.sh (needs bash)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
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
