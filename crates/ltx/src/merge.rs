//! Merge (compact) a contiguous chain of LTX files into one.
//!
//! The result applies exactly like the chain applied file by file: page
//! size, min TXID and pre-apply checksum come from the first file; commit,
//! max TXID, timestamp and post-apply checksum from the last; for each page
//! the latest file wins; a page truncated away by a later file is not
//! resurrected (it becomes a zero page when the database grows again, just
//! as applying the files in turn would leave it).
//!
//! Memory: the inputs' page indexes and one page at a time.

use std::io::{Read, Seek, Write};

use crate::encoder::Encoder;
use crate::{lock_pgno, Error, Header, PageReader, Result, Trailer};

/// Merge `inputs` (oldest first) into `out`. Every input is verified in
/// full (file checksum included) before anything is written.
pub fn merge<R: Read + Seek, W: Write>(
    inputs: &mut [PageReader<R>],
    out: W,
) -> Result<(W, Trailer)> {
    let header = merged_header(inputs)?;
    for input in inputs.iter_mut() {
        input.verify()?;
    }
    let final_commit = header.commit;
    // suffix_min[i]: the smallest commit of any file after file i.
    let mut suffix_min = vec![u32::MAX; inputs.len()];
    for i in (0..inputs.len().saturating_sub(1)).rev() {
        suffix_min[i] = suffix_min[i + 1].min(inputs[i + 1].header().commit);
    }
    let min_commit = inputs.iter().map(|r| r.header().commit).min().unwrap_or(0);
    let lock = lock_pgno(header.page_size);
    let post_apply = inputs
        .last()
        .map(|r| r.trailer().post_apply_checksum)
        .ok_or(Error::EmptyChain)?;

    let mut encoder = Encoder::new(out, header)?;
    let mut cursors = vec![0usize; inputs.len()];
    let zero = vec![0u8; header.page_size as usize];
    let mut page = Vec::new();
    // Pages above the smallest commit in the chain must be written out
    // explicitly (as zeros where no surviving file holds them).
    let mut next_gap = min_commit.saturating_add(1);
    loop {
        let from_files = (0..inputs.len())
            .filter_map(|i| inputs[i].index().get(cursors[i]).map(|e| e.pgno))
            .filter(|&pgno| pgno <= final_commit)
            .min();
        let gap = (next_gap <= final_commit).then_some(next_gap);
        let pgno = match (from_files, gap) {
            (None, None) => break,
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) | (None, Some(a)) => a,
        };
        let holders: Vec<usize> = (0..inputs.len())
            .filter(|&i| inputs[i].index().get(cursors[i]).map(|e| e.pgno) == Some(pgno))
            .collect();
        if pgno != lock {
            match holders.last() {
                Some(&latest) if pgno <= suffix_min[latest] => {
                    inputs[latest].read_entry(cursors[latest], &mut page)?;
                    encoder.encode_page(pgno, &page)?;
                }
                _ if pgno > min_commit => encoder.encode_page(pgno, &zero)?,
                _ => {}
            }
        }
        for i in holders {
            cursors[i] += 1;
        }
        if pgno >= next_gap {
            next_gap = pgno.saturating_add(1);
        }
        // Skip cursors parked on pages above the final commit.
        for (i, cursor) in cursors.iter_mut().enumerate() {
            let index = inputs[i].index();
            while index.get(*cursor).is_some_and(|e| e.pgno > final_commit) {
                *cursor = index.len();
            }
        }
    }
    encoder.finish(post_apply)
}

fn merged_header<R: Read + Seek>(inputs: &[PageReader<R>]) -> Result<Header> {
    let (first, last) = match (inputs.first(), inputs.last()) {
        (Some(first), Some(last)) => (first.header(), last.header()),
        _ => return Err(Error::EmptyChain),
    };
    for pair in inputs.windows(2) {
        let (prev, next) = (&pair[0], &pair[1]);
        if prev.header().page_size != next.header().page_size {
            return Err(Error::Incompatible("page size"));
        }
        if prev.header().flags != next.header().flags {
            return Err(Error::Incompatible("header flags"));
        }
        if prev.header().max_txid.next() != Some(next.header().min_txid) {
            return Err(Error::NotContiguous {
                previous_max: prev.header().max_txid,
                next_min: next.header().min_txid,
            });
        }
        if next.header().tracks_checksums()
            && prev.trailer().post_apply_checksum != next.header().pre_apply_checksum
        {
            return Err(Error::Incompatible("checksum at the join"));
        }
    }
    let mut header = Header::new(first.page_size, last.commit, first.min_txid, last.max_txid);
    header.flags = first.flags;
    header.pre_apply_checksum = first.pre_apply_checksum;
    header.timestamp_ms = last.timestamp_ms;
    header.node_id = last.node_id;
    Ok(header)
}
