//! Page frames: a 6-byte page header, a u32 size prefix and an LZ4 block;
//! legacy frames (no size prefix) hold an LZ4 frame instead.

use std::io::Read;

use crate::header::be32;
use crate::{Error, Result};

/// Size of a page header: pgno (u32) and flags (u16).
pub const PAGE_HEADER_SIZE: usize = 6;
/// Size of the compressed-size prefix that follows a page header.
pub const SIZE_PREFIX_SIZE: usize = 4;
/// Page header flag: a u32 size prefix and an LZ4 block follow.
pub const PAGE_FLAG_SIZE_PREFIX: u16 = 0x0001;

/// The largest compressed block any LZ4 encoder may produce for a page.
pub(crate) fn max_block_size(page_size: u32) -> u32 {
    // The LZ4 worst case is n + n/255 + 16; allow the looser bound used by
    // lz4_flex's encoder so our own output always fits.
    lz4_flex::block::get_maximum_output_size(page_size as usize) as u32
}

pub(crate) fn encode_page_header(pgno: u32, flags: u16) -> [u8; PAGE_HEADER_SIZE] {
    let mut b = [0u8; PAGE_HEADER_SIZE];
    b[0..4].copy_from_slice(&pgno.to_be_bytes());
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b
}

pub(crate) fn decode_page_header(b: &[u8; PAGE_HEADER_SIZE]) -> (u32, u16) {
    (be32(&b[0..4]), u16::from_be_bytes([b[4], b[5]]))
}

/// Decompress one LZ4 block into `out`, which must come out exactly full.
fn decompress_block(pgno: u32, block: &[u8], out: &mut [u8]) -> Result<()> {
    let n = lz4_flex::block::decompress_into(block, out).map_err(|e| Error::Decompress {
        pgno,
        reason: e.to_string(),
    })?;
    if n != out.len() {
        return Err(Error::PageSizeMismatch {
            expected: out.len(),
            actual: n,
        });
    }
    Ok(())
}

/// Read the rest of a page frame whose 6-byte page header was read: a size
/// prefix and an LZ4 block, or a legacy LZ4 frame. `page` must be one page
/// long and comes out holding the page. Returns the size prefix (if the
/// frame has one) and how many bytes followed the page header.
pub(crate) fn read_frame_body(
    reader: &mut impl Read,
    pgno: u32,
    flags: u16,
    page: &mut [u8],
    compressed: &mut Vec<u8>,
) -> Result<(Option<[u8; SIZE_PREFIX_SIZE]>, u64)> {
    match flags {
        PAGE_FLAG_SIZE_PREFIX => {
            let mut prefix = [0u8; SIZE_PREFIX_SIZE];
            reader.read_exact(&mut prefix).map_err(eof_as_truncated)?;
            let size = u32::from_be_bytes(prefix);
            let max = max_block_size(page.len() as u32);
            if size > max {
                return Err(Error::FrameTooLarge { size, max });
            }
            compressed.resize(size as usize, 0);
            reader.read_exact(compressed).map_err(eof_as_truncated)?;
            decompress_block(pgno, compressed, page)?;
            Ok((Some(prefix), SIZE_PREFIX_SIZE as u64 + u64::from(size)))
        }
        0 => Ok((None, read_legacy_frame(pgno, reader, page, compressed)?)),
        other => Err(Error::UnsupportedFrameFlags(other)),
    }
}

/// Read a legacy LZ4 *frame* (no size prefix) that must decompress to
/// exactly `out.len()` bytes, consuming exactly the frame's bytes. Every
/// size read from the input is checked before anything is allocated.
/// Returns how many input bytes the frame took.
fn read_legacy_frame(
    pgno: u32,
    reader: &mut impl Read,
    out: &mut [u8],
    scratch: &mut Vec<u8>,
) -> Result<u64> {
    let bad = |reason: &str| Error::Decompress {
        pgno,
        reason: format!("legacy lz4 frame: {reason}"),
    };
    let mut consumed = 0u64;
    let mut fixed = [0u8; 6];
    read_exact(reader, &mut fixed, &mut consumed)?;
    if u32::from_le_bytes([fixed[0], fixed[1], fixed[2], fixed[3]]) != 0x184D_2204 {
        return Err(bad("bad magic"));
    }
    let flg = fixed[4];
    if flg >> 6 != 0b01 {
        return Err(bad("unsupported version"));
    }
    let independent = flg & 0x20 != 0;
    let block_checksum = flg & 0x10 != 0;
    let content_size = flg & 0x08 != 0;
    let content_checksum = flg & 0x04 != 0;
    let dict_id = flg & 0x01 != 0;
    let mut rest = [0u8; 13];
    let rest_len = 8 * usize::from(content_size) + 4 * usize::from(dict_id) + 1;
    read_exact(reader, &mut rest[..rest_len], &mut consumed)?;
    let max_block = max_block_size(out.len() as u32) as usize;
    let mut filled = 0usize;
    loop {
        let mut size = [0u8; 4];
        read_exact(reader, &mut size, &mut consumed)?;
        let raw = u32::from_le_bytes(size);
        if raw == 0 {
            break;
        }
        let uncompressed = raw & 0x8000_0000 != 0;
        let len = (raw & 0x7fff_ffff) as usize;
        if len > max_block {
            return Err(bad("block larger than a page allows"));
        }
        scratch.resize(len, 0);
        read_exact(reader, scratch, &mut consumed)?;
        if block_checksum {
            read_exact(reader, &mut [0u8; 4], &mut consumed)?;
        }
        let remaining = out.len() - filled;
        let n = if uncompressed {
            if len > remaining {
                return Err(bad("data longer than a page"));
            }
            out[filled..filled + len].copy_from_slice(scratch);
            len
        } else if independent || filled == 0 {
            lz4_flex::block::decompress_into(scratch, &mut out[filled..])
                .map_err(|e| bad(&e.to_string()))?
        } else {
            let (dict, tail) = out.split_at_mut(filled);
            lz4_flex::block::decompress_into_with_dict(scratch, tail, dict)
                .map_err(|e| bad(&e.to_string()))?
        };
        filled += n;
    }
    if content_checksum {
        read_exact(reader, &mut [0u8; 4], &mut consumed)?;
    }
    if filled != out.len() {
        return Err(Error::PageSizeMismatch {
            expected: out.len(),
            actual: filled,
        });
    }
    Ok(consumed)
}

fn read_exact(reader: &mut impl Read, buf: &mut [u8], consumed: &mut u64) -> Result<()> {
    reader.read_exact(buf).map_err(eof_as_truncated)?;
    *consumed += buf.len() as u64;
    Ok(())
}

/// Map an unexpected end of input to [`Error::Truncated`].
pub(crate) fn eof_as_truncated(e: std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        Error::Truncated("unexpected end of file")
    } else {
        Error::Io(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn legacy_frame_decodes_and_consumes_exactly() {
        let page: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
        let mut enc = lz4_flex::frame::FrameEncoder::new(Vec::new());
        enc.write_all(&page).unwrap();
        let mut framed = enc.finish().unwrap();
        let frame_len = framed.len() as u64;
        framed.extend_from_slice(b"after");
        let mut reader = &framed[..];
        let mut out = vec![0u8; 4096];
        let consumed = read_legacy_frame(1, &mut reader, &mut out, &mut Vec::new()).unwrap();
        assert_eq!(consumed, frame_len);
        assert_eq!(out, page);
        assert_eq!(reader, b"after");
    }

    #[test]
    fn legacy_frame_of_wrong_size_is_rejected() {
        let mut enc = lz4_flex::frame::FrameEncoder::new(Vec::new());
        enc.write_all(&[7u8; 1000]).unwrap();
        let framed = enc.finish().unwrap();
        let mut out = vec![0u8; 4096];
        let err = read_legacy_frame(1, &mut &framed[..], &mut out, &mut Vec::new()).unwrap_err();
        assert!(matches!(err, Error::PageSizeMismatch { .. }), "{err}");
    }
}
