//! Stream offsets on the wire: `SSSSSSSSSSSSSSSS_PPPPPPPPPPPPPPPP`, two fixed-width decimal fields (a segment, always 0, and the byte position), so they sort lexicographically.

/// Digits of each field.
pub const DIGITS: usize = 16;

/// The wire form of byte position `position`.
pub fn format(position: u64) -> String {
    format!("{:0DIGITS$}_{position:0DIGITS$}", 0)
}

/// Parses a wire offset; `None` when malformed.
pub fn parse(text: &str) -> Option<u64> {
    let (segment, position) = text.split_once('_')?;
    let digits = |t: &str| t.len() == DIGITS && t.bytes().all(|b| b.is_ascii_digit());
    if !digits(segment) || !digits(position) || segment.bytes().any(|b| b != b'0') {
        return None;
    }
    position.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_round_trip_and_sort() {
        assert_eq!(parse(&format(42)), Some(42));
        assert!(format(9) < format(10));
        assert_eq!(parse("12"), None);
        assert_eq!(parse("0000000000000000_000000000000000x"), None);
        assert_eq!(parse("0000000000000000_0000000000000000"), Some(0));
    }
}
