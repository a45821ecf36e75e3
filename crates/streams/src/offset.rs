//! Stream offsets on the wire: fixed-width decimal byte positions, so they sort lexicographically.

/// Digits of an offset.
pub const DIGITS: usize = 20;

/// The wire form of byte position `position`.
pub fn format(position: u64) -> String {
    format!("{position:0DIGITS$}")
}

/// Parses a wire offset; `None` when malformed.
pub fn parse(text: &str) -> Option<u64> {
    if text.len() != DIGITS || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_round_trip_and_sort() {
        assert_eq!(parse(&format(42)), Some(42));
        assert!(format(9) < format(10));
        assert_eq!(parse("12"), None);
        assert_eq!(parse("0000000000000000000x"), None);
    }
}
