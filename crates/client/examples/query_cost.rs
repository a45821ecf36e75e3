//! What the client library adds to a query, for an instruction count
//! (`scripts/client-instructions.sh` runs this under callgrind).
//!
//! Against a running cluster (`--config`, the `client.toml` of `cellfleet
//! dev`), it writes one key, then sends `N` queries for it on one thread:
//!
//! - `raw`: signed by [`Client::seal_query`], sent by the generated tonic
//!   stub straight to the owner, the result left as bytes: the floor an
//!   application without the library pays;
//! - `library`: [`Client::query`]: routing by the owner cache, the retry
//!   rule, the result parsed into a JSON value;
//! - `command`: `N` commands through [`Client::execute`] (`kv` `put`, a new
//!   command id each), for what a node spends per command;
//! - `forwarded`: as `raw`, but sent to a node that does not own the Cell,
//!   which forwards it to the owner (`scripts/forward-instructions.sh`,
//!   two nodes).
//!
//! Both set the same per-call deadline, as an application would. Set-up
//! (process start, TLS handshake, the first write) is the same in both
//! variants and cancels out of `count(2N) - count(N)`.
//!
//! ```text
//! query_cost --config .cellfleet-dev/client.toml raw|library|command|forwarded N
//! ```

use std::time::Duration;

use cellfleet_client::{Client, Command, Config, Error, Query};
use cellfleet_proto::v1;

/// The deadline both variants put on a call.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: query_cost --config PATH raw|library|command|forwarded N";
    let (config, variant, queries) = match args.as_slice() {
        [flag, config, variant, queries] if flag == "--config" => {
            (config.clone(), variant.clone(), queries.parse::<u64>()?)
        }
        _ => return Err(usage.into()),
    };
    if !["raw", "library", "command", "forwarded"].contains(&variant.as_str()) {
        return Err(usage.into());
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run(&config, &variant, queries))?;
    Ok(())
}

async fn run(config: &str, variant: &str, queries: u64) -> Result<(), Error> {
    let client = Client::from_config(&Config::read(std::path::Path::new(config))?)?;
    let put = Command::new("kv", "cost-1", "put")
        .args(serde_json::json!({"key": "name", "value": "Ada"}));
    client.execute(&put).await?;
    let get = Query::new("kv", "cost-1", "get").args(serde_json::json!({"key": "name"}));
    // Learns the owner (the library's cache; the raw variant's target).
    let first = client.query(&get).await?;
    let owner = client
        .cached_owner("kv", b"cost-1")
        .unwrap_or_else(|| client.endpoints()[0].clone());
    let mut bytes = first.value.to_string().len();
    if variant == "raw" || variant == "forwarded" {
        let target = if variant == "raw" {
            owner.clone()
        } else {
            client
                .endpoints()
                .iter()
                .find(|endpoint| **endpoint != owner)
                .cloned()
                .ok_or_else(|| Error::Config("`forwarded` needs a second node".into()))?
        };
        let stub = v1::client_client::ClientClient::new(client.channel(&target)?);
        for _ in 0..queries {
            let mut call = tonic::Request::new(client.seal_query(&get)?);
            call.set_timeout(CALL_TIMEOUT);
            let response = stub
                .clone()
                .query(call)
                .await
                .map_err(|status| Error::from_status(&status))?;
            let response = response.into_inner();
            if variant == "forwarded" && response.served_by_endpoint == target {
                return Err(Error::Config(format!(
                    "{target} served a query it should forward"
                )));
            }
            bytes += response.result_json.len();
        }
    } else if variant == "library" {
        for _ in 0..queries {
            let read = client.query(&get).await?;
            bytes += usize::from(read.value.is_object());
        }
    } else {
        for i in 0..queries {
            let put = Command::new("kv", "cost-1", "put")
                .args(serde_json::json!({"key": "name", "value": format!("Ada {i}")}));
            let executed = client.execute(&put).await?;
            bytes += usize::from(executed.applied().is_some());
        }
    }
    println!("{variant}: {queries} requests to {owner} ({bytes})");
    Ok(())
}
