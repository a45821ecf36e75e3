//! Property test of the ledger's window: commands with random expiries, ids
//! used again within and past their windows, time moving on, reopens. An
//! entry answers its id (the stored outcome for the same payload, a
//! refusal for another) until its expiry plus the skew margin, and never
//! after, whether or not pruning has reached its row; a command past its
//! own expiry is refused as expired; and once every entry's window has
//! ended, pruning empties the ledger of them, however they were ordered.

mod common;

use std::collections::HashMap;

use cellfleet_cell::{CellConfig, Command, Outcome, RejectCode, Txid};
use common::{id, kv, Harness};
use proptest::prelude::*;
use serde_json::json;

const VALIDITY_MAX: i64 = 10_000;
const SKEW: i64 = 500;
const PRUNE_MAX: u32 = 2;

#[derive(Clone, Debug)]
enum Step {
    /// One group: (id, payload, validity in ms) per command.
    Group(Vec<(u64, u8, i64)>),
    /// Time moves on by this many ms.
    Advance(i64),
    Reopen,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let command = (0u64..6, 0u8..2, 1i64..=VALIDITY_MAX);
    let step = prop_oneof![
        4 => proptest::collection::vec(command, 1..4).prop_map(Step::Group),
        2 => (0i64..2 * VALIDITY_MAX).prop_map(Step::Advance),
        1 => Just(Step::Reopen),
    ];
    proptest::collection::vec(step, 1..40)
}

/// What the ledger should hold for an id: its newest entry.
#[derive(Clone, Copy, Debug)]
struct Entry {
    expires_at_ms: i64,
    payload: u8,
    txid: Txid,
}

fn command(n: u64, payload: u8, expires_at_ms: i64) -> Command {
    let (name, args) = cellfleet_cell::kind::to_wire(&cellfleet_cell::kv::KvCommand::Put {
        key: format!("k{n}"),
        value: json!(payload),
    })
    .unwrap();
    Command::new(id(n), name, args, expires_at_ms)
}

fn code(outcome: &Outcome) -> Option<RejectCode> {
    match outcome {
        Outcome::Applied { .. } => None,
        Outcome::Rejected { rejection } => Some(rejection.code),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn an_entry_answers_within_its_window_and_is_pruned_after(steps in steps()) {
        let config = CellConfig {
            validity_ms_max: VALIDITY_MAX,
            skew_margin_ms: SKEW,
            ledger_prune_max: PRUNE_MAX,
            ..CellConfig::default()
        };
        let mut h = Harness::new(kv(), config);
        let mut model: HashMap<u64, Entry> = HashMap::new();
        for step in steps {
            match step {
                Step::Advance(ms) => h.now += ms,
                Step::Reopen => h.open(),
                Step::Group(commands) => {
                    let now = h.now;
                    let group: Vec<Command> = commands
                        .iter()
                        .map(|&(n, payload, validity)| command(n, payload, now + validity))
                        .collect();
                    let r = h.run(&group);
                    let txid = h.position().txid;
                    for (&(n, payload, validity), result) in commands.iter().zip(&r.results) {
                        let live = model
                            .get(&n)
                            .copied()
                            .filter(|e| e.expires_at_ms >= now - SKEW);
                        match live {
                            Some(e) if e.payload == payload => {
                                prop_assert!(result.duplicate, "a retry of {n} in its window");
                                prop_assert_eq!(result.txid, Some(e.txid));
                            }
                            Some(_) => {
                                prop_assert_eq!(code(&result.outcome), Some(RejectCode::IdReused));
                            }
                            None => {
                                // Generated validities are at least 1 ms:
                                // never expired on arrival.
                                prop_assert!(!result.duplicate, "{n} past its window runs anew");
                                prop_assert_eq!(code(&result.outcome), None);
                                prop_assert_eq!(result.txid, Some(txid));
                                model.insert(n, Entry {
                                    expires_at_ms: now + validity,
                                    payload,
                                    txid,
                                });
                            }
                        }
                    }
                    let answering = model
                        .values()
                        .filter(|e| e.expires_at_ms >= now - SKEW)
                        .count() as u64;
                    prop_assert!(h.cell().ledger_len().unwrap() >= answering);
                }
            }
        }
        // Every window ends; fresh commands then prune everything before
        // them, at most `PRUNE_MAX` a group.
        let before = h.cell().ledger_len().unwrap();
        h.now += VALIDITY_MAX + SKEW + 1;
        let stale = h.run(&[command(0, 9, h.now - 1)]);
        prop_assert_eq!(code(&stale.results[0].outcome), Some(RejectCode::Expired));
        let groups = before / u64::from(PRUNE_MAX) + 1;
        for n in 0..groups {
            let now = h.now;
            h.run(&[command(100 + n, 0, now + VALIDITY_MAX)]);
        }
        prop_assert_eq!(h.cell().ledger_len().unwrap(), groups);
        let (pos, recovered) = h.recover_bytes("r.db");
        prop_assert_eq!(pos, h.position());
        prop_assert_eq!(recovered, h.live_bytes());
    }
}
