//! `website/guide/clients.md` runs as written: its Rust block is the code between the markers below (checked byte for byte) and runs here against a real three-node cluster; its Python blocks run with the package from `clients/python`.

mod cluster_common;

use cluster_common::{Cluster, Store};

// guide:begin
use cellfleet_client::{Client, Command, Config, Error, Outcome, Query};

async fn guide_example() -> Result<(), Error> {
    // $CELLFLEET_CONFIG, else the .cellfleet-dev/client.toml `cellfleet dev` wrote.
    let client = Client::from_config(&Config::read(&Config::path(None))?)?;

    let put = Command::new("kv", "user-1", "put")
        .args(serde_json::json!({"key": "name", "value": "Ada"}));
    let executed = match client.execute(&put).await {
        Ok(executed) => executed,
        Err(Error::UnknownOutcome {
            command_id,
            expires_at_ms,
            ..
        }) => {
            // Not proven either way: retry `put` later (it keeps its id),
            // or ask what became of it. Never re-create it with a new id.
            let resolved = client
                .resolve("kv", b"user-1", command_id, expires_at_ms)
                .await?;
            println!("command {command_id}: {:?}", resolved.state);
            return Ok(());
        }
        Err(other) => return Err(other),
    };
    match &executed.outcome {
        Outcome::Applied(result) => println!("applied {result} on {}", executed.served_by),
        Outcome::Rejected(why) => println!("rejected: {:?} {}", why.code, why.message),
    }

    // Read your own write: the query waits for a state holding the receipt.
    let receipt = executed
        .receipt
        .clone()
        .expect("an applied command has a receipt");
    let get = Query::new("kv", "user-1", "get")
        .args(serde_json::json!({"key": "name"}))
        .after(&receipt);
    let read = client.query(&get).await?;
    assert_eq!(read.value["value"], "Ada");
    println!("read {} from {}", read.value, read.served_by);
    Ok(())
}
// guide:end

const GUIDE: &str = include_str!("../../../website/guide/clients.md");
const THIS_FILE: &str = include_str!("client_guide.rs");

/// The guide's fenced blocks of `language`.
fn blocks(language: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in GUIDE.lines() {
        match (&mut current, line.strip_prefix("```")) {
            (None, Some(info)) if info.trim() == language => current = Some(String::new()),
            (None, Some(_)) => current = Some("\u{0}".into()),
            (Some(body), Some(_)) => {
                if !body.starts_with('\u{0}') {
                    out.push(std::mem::take(body));
                }
                current = None;
            }
            (Some(body), None) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, None) => {}
        }
    }
    out
}

#[test]
fn the_guide_rust_block_is_the_code_that_runs() {
    let begin = THIS_FILE.find("// guide:begin\n").expect("begin marker") + 15;
    let end = THIS_FILE.find("// guide:end").expect("end marker");
    let code = &THIS_FILE[begin..end];
    let rust = blocks("rust");
    assert_eq!(rust.len(), 1, "one Rust block in the guide");
    assert_eq!(
        rust[0].trim(),
        code.trim(),
        "website/guide/clients.md's Rust block differs from the code this test runs"
    );
}

#[test]
fn the_guide_examples_run_against_a_real_cluster() {
    let cluster = Cluster::start(3, Store::Local, 5_000);
    let config = cluster.write_client_config("guide-client.toml");
    // The examples read $CELLFLEET_CONFIG, as an application would.
    std::env::set_var("CELLFLEET_CONFIG", &config);
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(guide_example())
        .expect("the guide's Rust example");

    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let venv = std::process::Command::new("bash")
        .arg(root.join("scripts/pyvenv.sh"))
        .output()
        .expect("run scripts/pyvenv.sh");
    assert!(
        venv.status.success(),
        "no Python venv: {}",
        String::from_utf8_lossy(&venv.stderr)
    );
    let python =
        std::path::PathBuf::from(String::from_utf8_lossy(&venv.stdout).trim()).join("bin/python");
    let python_blocks = blocks("python");
    assert_eq!(python_blocks.len(), 2, "the guide's Python blocks");
    for block in python_blocks {
        let output = std::process::Command::new(&python)
            .arg("-c")
            .arg(&block)
            .env("CELLFLEET_CONFIG", &config)
            .env("PYTHONPATH", root.join("clients/python"))
            .output()
            .expect("run python");
        assert!(
            output.status.success(),
            "the guide's Python block failed:\n{block}\n{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
