//! Unsigned LEB128 varints, as Go's `binary.PutUvarint` writes them.

use crate::{Error, Result};

/// Longest encoding of a u64.
pub(crate) const MAX_VARINT_LEN: usize = 10;

pub(crate) fn put_uvarint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Decode one varint from the front of `input`: (value, bytes used).
pub(crate) fn uvarint(input: &[u8]) -> Result<(u64, usize)> {
    let mut value: u64 = 0;
    for (i, &byte) in input.iter().enumerate().take(MAX_VARINT_LEN) {
        let low = u64::from(byte & 0x7f);
        if i == MAX_VARINT_LEN - 1 && byte > 1 {
            return Err(Error::BadIndex("varint overflows u64"));
        }
        value |= low << (7 * i);
        if byte & 0x80 == 0 {
            return Ok((value, i + 1));
        }
    }
    if input.len() >= MAX_VARINT_LEN {
        Err(Error::BadIndex("varint overflows u64"))
    } else {
        Err(Error::BadIndex("truncated varint"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trips(value: u64) {
            let mut out = Vec::new();
            put_uvarint(&mut out, value);
            prop_assert_eq!(uvarint(&out).unwrap(), (value, out.len()));
        }

        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..16)) {
            let _ = uvarint(&bytes);
        }
    }

    #[test]
    fn rejects_overflow() {
        assert!(uvarint(&[0xff; 10]).is_err());
        assert!(uvarint(&[0x80]).is_err());
    }
}
