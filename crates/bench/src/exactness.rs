//! The exactness check after a run: every acknowledged command's tag is in its Cell exactly once, no tag is there twice, and a tag that was never acknowledged is there at most once.
//!
//! The [`AckLog`] is the client's memory of what it sent: acknowledged tags
//! and tags whose call failed (outcome unknown or refused) per Cell. It
//! grows with the run (bounded by duration × throughput, a few MB at most
//! for minutes of load). The check reads each Cell's state with the
//! `count_after` query the bench adds to the `log` kind, a page of tags at
//! a time (a query returns at most 1,000 rows), [`READS_CONCURRENT`] Cells
//! at once through the nodes in turn (a fleet run leaves 100k Cells, most
//! of them passivated: each read reopens one).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::client::{describe, BenchClient};

/// The kind every workload uses (an append-only log; see
/// `dev_cmd::EXAMPLE_KINDS`), its command and its query: what the check
/// counts.
pub const LOG_KIND: &str = "log";
pub const APPEND: &str = "append";
pub const COUNT: &str = "count";

/// The paged read of a log (see `cluster::BENCH_QUERIES`).
const COUNT_AFTER: &str = "count_after";

/// How long the check retries reading one Cell.
const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// Offending tags listed in the report (the counts are complete).
const EXAMPLES_MAX: usize = 5;
/// Cells read at once.
const READS_CONCURRENT: usize = 64;

#[derive(Debug, Default)]
struct Entries {
    acked: HashMap<String, Vec<String>>,
    unacknowledged: HashMap<String, Vec<String>>,
}

/// Tags the client sent, per Cell key.
#[derive(Debug, Default)]
pub struct AckLog {
    entries: Mutex<Entries>,
}

impl AckLog {
    pub fn acked(&self, cell: &str, tag: String) {
        let mut entries = self.entries.lock().expect("ack log lock");
        entries.acked.entry(cell.to_owned()).or_default().push(tag);
    }

    pub fn unacknowledged(&self, cell: &str, tag: String) {
        let mut entries = self.entries.lock().expect("ack log lock");
        entries
            .unacknowledged
            .entry(cell.to_owned())
            .or_default()
            .push(tag);
    }
}

/// The check's result.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Exactness {
    pub passed: bool,
    pub cells: usize,
    /// Acknowledged commands.
    pub acked: usize,
    /// Acknowledged commands found exactly once.
    pub present_once: usize,
    /// Calls that failed without an acknowledgement.
    pub unacknowledged: usize,
    /// Of those, how many applied anyway (allowed: at most once).
    pub unacknowledged_applied: usize,
    pub missing: usize,
    pub duplicated: usize,
    /// Tags in a Cell that the client never sent.
    pub unexpected: usize,
    /// Some offending tags, and Cells that could not be read.
    pub problems: Vec<String>,
}

async fn read_counts(
    client: &BenchClient,
    via: usize,
    cell: &str,
) -> Result<HashMap<String, i64>, String> {
    let deadline = Instant::now() + READ_TIMEOUT;
    let mut counts = HashMap::new();
    let mut after = String::new();
    loop {
        let args = serde_json::json!({ "after": after });
        let request = client.query_request(LOG_KIND, cell, COUNT_AFTER, &args);
        match client.query(via, request).await {
            Ok(response) => {
                let page = parse_counts(&response.result_json)?;
                let Some(last) = page.keys().max().cloned() else {
                    return Ok(counts);
                };
                counts.extend(page);
                after = last;
            }
            Err(status) if Instant::now() < deadline => {
                let _ = status;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(status) => return Err(describe(&status)),
        }
    }
}

/// `{"rows": [["tag", n], ...]}` → tag → n.
fn parse_counts(json: &[u8]) -> Result<HashMap<String, i64>, String> {
    let value: serde_json::Value =
        serde_json::from_slice(json).map_err(|e| format!("count result is not JSON: {e}"))?;
    let rows = value["rows"]
        .as_array()
        .ok_or_else(|| format!("count result has no rows: {value}"))?;
    rows.iter()
        .map(|row| match (row[0].as_str(), row[1].as_i64()) {
            (Some(tag), Some(n)) => Ok((tag.to_owned(), n)),
            _ => Err(format!("unexpected count row {row}")),
        })
        .collect()
}

/// Reads every Cell in `log` (through the `nodes` nodes in turn) and compares.
pub async fn check(client: &BenchClient, log: &AckLog, nodes: usize) -> Exactness {
    let entries = std::mem::take(&mut *log.entries.lock().expect("ack log lock"));
    let cells: HashSet<&String> = entries
        .acked
        .keys()
        .chain(entries.unacknowledged.keys())
        .collect();
    let mut result = Exactness {
        cells: cells.len(),
        ..Exactness::default()
    };
    let limit = Arc::new(tokio::sync::Semaphore::new(READS_CONCURRENT));
    let mut reads = tokio::task::JoinSet::new();
    for (index, cell) in cells.into_iter().enumerate() {
        let (client, limit, cell) = (client.clone(), limit.clone(), cell.clone());
        reads.spawn(async move {
            let _permit = limit.acquire_owned().await.expect("never closed");
            let counts = read_counts(&client, index % nodes.max(1), &cell).await;
            (cell, counts)
        });
    }
    while let Some(read) = reads.join_next().await {
        let (cell, counts) = match read {
            Ok(read) => read,
            Err(error) => {
                result.missing += 1;
                result.problem(format!("a read task failed: {error}"));
                continue;
            }
        };
        let acked = entries.acked.get(&cell).map(Vec::as_slice).unwrap_or(&[]);
        let counts = match counts {
            Ok(counts) => counts,
            Err(error) => {
                result.acked += acked.len();
                result.missing += acked.len();
                result.problem(format!("cannot read {cell}: {error}"));
                continue;
            }
        };
        let unacknowledged = entries
            .unacknowledged
            .get(&cell)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        result.tally(&cell, acked, unacknowledged, &counts);
    }
    result.passed = result.acked > 0
        && result.present_once == result.acked
        && result.missing == 0
        && result.duplicated == 0
        && result.unexpected == 0;
    result
}

impl Exactness {
    /// Keeps `text` as an example while there are fewer than
    /// `EXAMPLES_MAX`.
    fn problem(&mut self, text: String) {
        if self.problems.len() < EXAMPLES_MAX {
            self.problems.push(text);
        }
    }

    /// Counts one Cell read: each acknowledged tag must be there once,
    /// each unacknowledged one at most once, and no other tag at all.
    fn tally(
        &mut self,
        cell: &str,
        acked: &[String],
        unacknowledged: &[String],
        counts: &HashMap<String, i64>,
    ) {
        for tag in acked {
            self.acked += 1;
            match counts.get(tag).copied().unwrap_or(0) {
                1 => self.present_once += 1,
                0 => {
                    self.missing += 1;
                    self.problem(format!("{cell}: acknowledged {tag} is missing"));
                }
                n => {
                    self.duplicated += 1;
                    self.problem(format!("{cell}: acknowledged {tag} is there {n} times"));
                }
            }
        }
        for tag in unacknowledged {
            self.unacknowledged += 1;
            match counts.get(tag).copied().unwrap_or(0) {
                0 => {}
                1 => self.unacknowledged_applied += 1,
                n => {
                    self.duplicated += 1;
                    self.problem(format!("{cell}: unacknowledged {tag} is there {n} times"));
                }
            }
        }
        let sent: HashSet<&String> = acked.iter().chain(unacknowledged).collect();
        for tag in counts.keys().filter(|tag| !sent.contains(tag)) {
            self.unexpected += 1;
            self.problem(format!("{cell}: {tag} was never sent"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_read_counts_missing_duplicated_and_unexpected_tags() {
        let mut result = Exactness::default();
        let tags = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
        let counts: HashMap<String, i64> = [("a", 1), ("b", 2), ("u", 1), ("x", 1)]
            .into_iter()
            .map(|(tag, n)| (tag.to_owned(), n))
            .collect();
        result.tally("c", &tags(&["a", "b", "m"]), &tags(&["u", "v"]), &counts);
        assert_eq!(
            (
                result.acked,
                result.present_once,
                result.missing,
                result.duplicated
            ),
            (3, 1, 1, 1)
        );
        assert_eq!(
            (result.unacknowledged, result.unacknowledged_applied),
            (2, 1)
        );
        assert_eq!(result.unexpected, 1);
        assert!(result.problems.contains(&"c: x was never sent".to_owned()));
        assert!(result
            .problems
            .contains(&"c: acknowledged b is there 2 times".to_owned()));
    }

    #[test]
    fn count_rows_are_parsed_and_bad_rows_refused() {
        let counts =
            parse_counts(br#"{"columns":["tag","n"],"rows":[["a",1],["b",2]]}"#).expect("parses");
        assert_eq!(counts.get("a"), Some(&1));
        assert_eq!(counts.get("b"), Some(&2));
        assert!(parse_counts(br#"{"rows":[[1,"a"]]}"#).is_err());
        assert!(parse_counts(b"not json").is_err());
    }
}
