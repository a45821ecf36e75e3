//! Which keys, prefixes and byte ranges the stores accept: one rule for every backend, so a layout that works locally works on S3.

use crate::error::{Error, Result};
use crate::object::KEY_BYTES_MAX;

/// Checks a key: 1..=[`KEY_BYTES_MAX`] bytes, `/`-separated non-empty
/// segments, no `.` or `..` segment, no leading or trailing `/`, no control
/// characters or backslashes. The same rule for every backend, so a layout
/// that works locally works on S3.
pub fn validate_key(key: &str) -> Result<()> {
    let invalid = |reason: &str| {
        Err(Error::InvalidKey {
            key: key.chars().take(200).collect(),
            reason: reason.to_owned(),
        })
    };
    if key.is_empty() {
        return invalid("empty");
    }
    if key.len() > KEY_BYTES_MAX {
        return invalid("longer than 1024 bytes");
    }
    if key.chars().any(|c| c.is_control() || c == '\\') {
        return invalid("control character or backslash");
    }
    for segment in key.split('/') {
        if segment.is_empty() {
            return invalid("empty path segment (leading, trailing or double '/')");
        }
        if segment == "." || segment == ".." {
            return invalid("'.' or '..' segment");
        }
    }
    Ok(())
}

/// Checks a listing prefix: empty, or a key prefix without `.`/`..` segments.
pub(crate) fn validate_prefix(prefix: &str) -> Result<()> {
    if prefix.is_empty() {
        return Ok(());
    }
    let trimmed = prefix.strip_suffix('/').unwrap_or(prefix);
    if trimmed.is_empty() {
        return Err(Error::InvalidKey {
            key: prefix.to_owned(),
            reason: "prefix '/'".to_owned(),
        });
    }
    validate_key(trimmed)
}

/// Clamps `range` to an object of `size` bytes, HTTP style.
pub(crate) fn clamp_range(
    key: &str,
    range: &std::ops::Range<u64>,
    size: u64,
) -> Result<std::ops::Range<usize>> {
    if range.start >= range.end || range.start >= size {
        return Err(Error::InvalidRange {
            key: key.to_owned(),
            start: range.start,
            end: range.end,
            size,
        });
    }
    let end = range.end.min(size);
    let start = usize::try_from(range.start).map_err(|_| Error::InvalidRange {
        key: key.to_owned(),
        start: range.start,
        end: range.end,
        size,
    })?;
    let end = usize::try_from(end).unwrap_or(usize::MAX);
    Ok(start..end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_validated() {
        assert!(validate_key("a/b/c.json").is_ok());
        for bad in ["", "/a", "a/", "a//b", "a/../b", "./a", "a\\b", "a\nb"] {
            assert!(
                matches!(validate_key(bad), Err(Error::InvalidKey { .. })),
                "{bad:?}"
            );
        }
        assert!(validate_key(&"x".repeat(1025)).is_err());
    }

    #[test]
    fn ranges_clamp_like_http() {
        assert_eq!(clamp_range("k", &(2..100), 10).unwrap(), 2..10);
        assert!(clamp_range("k", &(10..11), 10).is_err());
        assert!(clamp_range("k", &(3..3), 10).is_err());
    }
}
