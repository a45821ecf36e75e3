//! When a lane's committer writes its next segment (pure): the group-commit trigger of DESIGN.md §9 ("a time trigger of a few ms, a size trigger").
//!
//! A lane with nothing in flight writes at once, so a lone command costs
//! one PUT and no wait. While segments are in flight, groups arriving meanwhile
//! are held back and batched: another segment joins the pipeline only
//! when the batch is worth a PUT of its own (enough commands or bytes) or
//! its oldest group has waited `linger_ms`. Every PUT costs the store the
//! same work whatever it carries, so on a busy node this keeps commands
//! per segment high; a hot Cell still gets segments in parallel, since
//! one of its groups alone carries enough commands to fill a batch.
//! Nothing ever waits past `linger_ms` once the pipeline has room.

/// The committer's bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchRule {
    /// Segments of the lane in flight at once, at most.
    pub inflight_max: u64,
    /// A batch of this many commands joins a busy pipeline at once.
    pub commands_min: usize,
    /// A batch of this many bytes joins a busy pipeline at once.
    pub bytes_min: usize,
    /// The longest a pending group waits for a batch while the pipeline
    /// has room.
    pub linger_ms: u64,
}

/// What the lane is doing now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaneLoad {
    /// Segments sent and not yet acknowledged.
    pub inflight: u64,
    /// Groups waiting for a segment.
    pub pending_records: usize,
    /// Their commands.
    pub pending_commands: usize,
    /// Their bytes.
    pub pending_bytes: usize,
    /// How long the oldest of them has waited.
    pub waited_ms: u64,
}

/// The committer's next move.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Write a segment with what is pending.
    Send,
    /// The pipeline is full: wait for a segment to land.
    WaitForRoom,
    /// Gather more: wait for a group, a landed segment, or this many
    /// milliseconds (the rest of the linger).
    Gather {
        /// Until the oldest pending group has waited `linger_ms`.
        for_ms: u64,
    },
    /// Nothing is pending.
    Idle,
}

impl BatchRule {
    /// What the committer does next under `load`.
    pub fn next(&self, load: LaneLoad) -> Next {
        if load.pending_records == 0 {
            return Next::Idle;
        }
        if load.inflight >= self.inflight_max.max(1) {
            return Next::WaitForRoom;
        }
        let full = load.pending_commands >= self.commands_min
            || load.pending_bytes >= self.bytes_min
            || load.waited_ms >= self.linger_ms;
        if load.inflight == 0 || full {
            Next::Send
        } else {
            Next::Gather {
                for_ms: self.linger_ms - load.waited_ms,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rules() -> impl Strategy<Value = BatchRule> {
        (1u64..8, 1usize..64, 1usize..1 << 20, 0u64..20).prop_map(
            |(inflight_max, commands_min, bytes_min, linger_ms)| BatchRule {
                inflight_max,
                commands_min,
                bytes_min,
                linger_ms,
            },
        )
    }

    fn loads() -> impl Strategy<Value = LaneLoad> {
        (
            0u64..10,
            0usize..100,
            0usize..100,
            0usize..2 << 20,
            0u64..40,
        )
            .prop_map(
                |(inflight, pending_records, commands, pending_bytes, waited_ms)| LaneLoad {
                    inflight,
                    pending_records,
                    // Every group carries at least one command.
                    pending_commands: pending_records + commands * usize::from(pending_records > 0),
                    pending_bytes,
                    waited_ms,
                },
            )
    }

    proptest! {
        /// Never past the pipeline's bound, never a segment of nothing.
        #[test]
        fn sends_only_with_room_and_something_pending(rule in rules(), load in loads()) {
            if rule.next(load) == Next::Send {
                prop_assert!(load.inflight < rule.inflight_max);
                prop_assert!(load.pending_records > 0);
            }
        }

        /// An idle lane writes at once: a lone command pays no linger.
        #[test]
        fn an_idle_lane_writes_at_once(rule in rules(), load in loads()) {
            let idle = LaneLoad { inflight: 0, ..load };
            if idle.pending_records > 0 {
                prop_assert_eq!(rule.next(idle), Next::Send);
            }
        }

        /// With room in the pipeline, nothing waits past the linger: the
        /// wait asked for ends exactly at it, and at it the batch is sent.
        #[test]
        fn nothing_waits_past_the_linger(rule in rules(), load in loads()) {
            if let Next::Gather { for_ms } = rule.next(load) {
                prop_assert!(for_ms > 0);
                let later = LaneLoad { waited_ms: load.waited_ms + for_ms, ..load };
                prop_assert_eq!(rule.next(later), Next::Send);
            }
        }

        /// More pending, or a longer wait, never turns a send into a wait.
        #[test]
        fn more_pending_never_delays(
            rule in rules(), load in loads(), records in 0usize..50, bytes in 0usize..1 << 20, ms in 0u64..20,
        ) {
            let more = LaneLoad {
                pending_records: load.pending_records + records,
                pending_commands: load.pending_commands + records,
                pending_bytes: load.pending_bytes + bytes,
                waited_ms: load.waited_ms + ms,
                ..load
            };
            if rule.next(load) == Next::Send {
                prop_assert_eq!(rule.next(more), Next::Send);
            }
        }

        /// A full batch joins a busy pipeline that has room.
        #[test]
        fn a_full_batch_joins_a_busy_pipeline(rule in rules(), load in loads()) {
            let full = LaneLoad {
                pending_records: load.pending_records.max(1),
                pending_commands: load.pending_commands.max(rule.commands_min),
                ..load
            };
            if full.inflight < rule.inflight_max {
                prop_assert_eq!(rule.next(full), Next::Send);
            } else {
                prop_assert_eq!(rule.next(full), Next::WaitForRoom);
            }
        }
    }
}
