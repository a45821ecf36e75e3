//! The wall clock of the streams service: the one place it reads the system time (a tidy test below keeps it that way).
//!
//! Wall time here names expiries and TTLs (`Stream-TTL`, `Stream-Expires-At`,
//! command windows, subscription leases), which are wall-clock facts by
//! the protocol; deadlines and waits use tokio's monotonic clock.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    /// No other file of the crate reads the system time.
    #[test]
    fn only_this_module_reads_the_system_time() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut offenders = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "rs") && !path.ends_with("clock.rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                if text.contains("SystemTime") {
                    offenders.push(path.display().to_string());
                }
            }
        }
        assert!(
            offenders.is_empty(),
            "read the time through clock::now_ms: {offenders:?}"
        );
    }

    #[test]
    fn now_is_after_2020() {
        assert!(super::now_ms() > 1_577_836_800_000);
    }
}
