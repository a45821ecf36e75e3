//! Runs the shell snippets of the guides under `website/guide/` for real,
//! in order, against the `cellfleet dev` cluster each guide itself starts,
//! and checks the state the guide promises at the end. Blocks tagged `sh
//! no-run` are only syntax-checked; `sh background` blocks are started in
//! the background (like a second terminal) and stopped with Ctrl-C (SIGINT)
//! at the end. The guide's Rust snippets are doc-tests of `cellfleet-cell`.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, PartialEq)]
enum Mode {
    Run,
    Background,
    SyntaxOnly,
}

fn blocks(markdown: &str) -> Vec<(Mode, String)> {
    let mut out = Vec::new();
    // Inside a fence: its mode (`None` for a block that is not shell) and body.
    let mut current: Option<(Option<Mode>, String)> = None;
    for line in markdown.lines() {
        match (current.as_mut(), line.strip_prefix("```")) {
            (None, Some(info)) => {
                let mode = match info.trim() {
                    "sh" => Some(Mode::Run),
                    "sh background" => Some(Mode::Background),
                    "sh no-run" => Some(Mode::SyntaxOnly),
                    _ => None,
                };
                current = Some((mode, String::new()));
            }
            (Some(_), Some(_)) => {
                if let Some((Some(mode), body)) = current.take() {
                    out.push((mode, body));
                }
            }
            (Some((_, body)), None) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, None) => {}
        }
    }
    out
}

/// The background processes, stopped with SIGINT (and then SIGKILL) even
/// when the test fails half-way.
struct Background(Vec<Child>);

impl Drop for Background {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let group = format!("-{}", child.id());
            let _ = Command::new("kill").args(["-INT", "--", &group]).status();
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        for child in &mut self.0 {
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let group = format!("-{}", child.id());
            let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
            let _ = child.wait();
        }
    }
}

fn shell(dir: &Path, path: &str, script: &str) -> std::process::Output {
    Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(dir)
        .env("PATH", path)
        .env_remove("CELLFLEET_CONFIG")
        .output()
        .expect("run bash")
}

fn wait_for(file: &Path, text: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let mut seen = String::new();
        if let Ok(mut f) = std::fs::File::open(file) {
            let _ = f.read_to_string(&mut seen);
        }
        if seen.contains(text) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no {text:?} within {limit:?}; output so far:\n{seen}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A guide's shell blocks, run in a fresh directory; returns that
/// directory, the `PATH` the blocks ran with and the background processes
/// (stopped when dropped).
struct Ran {
    // Fields drop in order: the cluster stops first, then its directory
    // goes, then the next guide may start.
    _background: Background,
    dir: tempfile::TempDir,
    path: String,
    port_base: u32,
    _turn: std::sync::MutexGuard<'static, ()>,
}

/// One guide at a time: each runs a dev cluster and kills or stops its
/// nodes, and two at once would only compete for the machine.
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Ran {
    fn shell(&self, script: &str) -> std::process::Output {
        shell(self.dir.path(), &self.path, script)
    }
}

/// `slot` separates the port ranges of guides run at the same time.
fn run_guide(name: &str, slot: u32, runs_min: usize) -> Ran {
    let turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let guide = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../website/guide")
        .join(name);
    let markdown = std::fs::read_to_string(&guide).unwrap();
    let blocks = blocks(&markdown);
    assert!(blocks.iter().filter(|(m, _)| *m == Mode::Run).count() >= runs_min);
    assert_eq!(
        blocks
            .iter()
            .filter(|(m, _)| *m == Mode::Background)
            .count(),
        1
    );

    let dir = tempfile::tempdir().unwrap();
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_cellfleet"));
    let path = format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // Ports below the kernel's ephemeral range (which the other tests'
    // port-0 listeners draw from), so the guide's dev cluster collides
    // with nothing running in parallel. The guides name dev's default
    // ports (base 7000: client 7001.., streams 7301..); they move with it.
    // Each cluster spans base+1 ..= base+403; slots are 500 apart and
    // everything stays below 32768.
    let port_base = 20_000 + (std::process::id() % 12) * 1000 + slot * 500;
    let localize = |script: &str| {
        let mut script = script.replace(
            "cellfleet dev",
            &format!("cellfleet dev --port-base {port_base}"),
        );
        for port in 7001..7500 {
            script = script.replace(
                &format!("127.0.0.1:{port}"),
                &format!("127.0.0.1:{}", port_base + port - 7000),
            );
        }
        script
    };

    let mut background = Background(Vec::new());
    for (i, (mode, body)) in blocks.iter().enumerate() {
        match mode {
            Mode::SyntaxOnly => {
                let out = Command::new("bash")
                    .args(["-n", "-c", body])
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "block {i} is not valid shell:\n{body}"
                );
            }
            Mode::Background => {
                let log = dir.path().join(format!("background-{i}.log"));
                let child = Command::new("bash")
                    .args(["-c", &format!("exec {}", localize(body).trim())])
                    .current_dir(dir.path())
                    .env("PATH", &path)
                    .stdout(std::fs::File::create(&log).unwrap())
                    .stderr(Stdio::null())
                    .process_group(0)
                    .spawn()
                    .unwrap();
                background.0.push(child);
                wait_for(&log, "cluster ready", Duration::from_secs(90));
            }
            Mode::Run => {
                let out = shell(dir.path(), &path, &localize(body));
                assert!(
                    out.status.success(),
                    "{name} block {i} failed ({}):\n{body}\nstdout:\n{}\nstderr:\n{}",
                    out.status,
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
    Ran {
        dir,
        path,
        port_base,
        _background: background,
        _turn: turn,
    }
}

#[test]
fn quickstart_runs_as_written() {
    let ran = run_guide("quickstart.md", 0, 6);

    // What the guide promises at the end: the list survived the kill, the
    // duplicate did not add a second "eggs", and the Cell moved to another
    // node at the next epoch.
    let out = ran.shell("cellfleet query todo groceries open --json");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = serde_json::to_string(&answer).unwrap();
    assert!(rows.contains(r#"[2,"bread"]"#), "{rows}");
    assert!(rows.contains(r#"[3,"eggs"]"#), "{rows}");
    assert_eq!(rows.matches("eggs").count(), 1, "{rows}");
    assert!(!rows.contains("milk"), "{rows}");
    // The answer names the state it read: after the takeover, epoch 2.
    assert_eq!(answer["receipt"]["epoch"], 2, "{answer}");
    assert!(answer["receipt"]["txid"].as_u64() > Some(0), "{answer}");
    let out = ran.shell("cellfleet cell show todo groceries --json");
    let root: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(root["summary"]["epoch"], 2, "{root}");
    // The takeover replayed the dead owner's log and moved the root's
    // pointer to the new owner's own lane.
    assert_eq!(root["log"]["node_id"], root["summary"]["owner"], "{root}");
}

#[test]
fn streams_guide_runs_as_written() {
    let ran = run_guide("streams.md", 1, 5);
    // The long-poll answered with exactly the message appended while it
    // waited, through a node that need not own the stream.
    let waited = std::fs::read_to_string(ran.dir.path().join("waited.json")).unwrap();
    let waited: serde_json::Value = serde_json::from_str(&waited).unwrap();
    assert_eq!(
        waited,
        serde_json::json!([{"from": "cy", "text": "late, sorry"}]),
        "{waited}"
    );
    // All four messages, in append order, whichever node answers (over
    // HTTPS, with the guide's token); without the token, or with it for
    // what it does not grant, nothing.
    for node in 1..=3 {
        let url = format!(
            "https://127.0.0.1:{}/v1/stream/rooms/lobby",
            ran.port_base + 300 + node
        );
        let status = |options: &str| {
            let out = ran.shell(&format!(
                "curl -sS -o /dev/null -w '%{{http_code}}' {options} '{url}'"
            ));
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        assert_eq!(status("--cacert .cellfleet-dev/certs/ca.pem"), "401");
        assert_eq!(status("-K curlrc -X DELETE"), "403");
        let out = ran.shell(&format!("curl -sS --fail -K curlrc '{url}?offset=-1'"));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let messages: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let texts: Vec<&str> = messages
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["text"].as_str().unwrap())
            .collect();
        assert_eq!(
            texts,
            ["hello", "hi ann", "hi bob", "late, sorry"],
            "node {node}"
        );
    }
}
