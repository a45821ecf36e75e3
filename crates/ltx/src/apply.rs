//! Apply an LTX file to a database file at the right position.
//!
//! Ordering: the position check happens before any byte of the database is
//! written; pages are then written as they are decoded and the file
//! checksum is verified at the end. A file that fails verification half-way
//! leaves the database undefined, so callers apply to a scratch copy and
//! rename it into place only after success (as `ltx restore` does).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};

use crate::{lock_pgno, Decoder, Error, Position, Result, RollingChecksum, Txid};

/// Apply the LTX file read from `ltx` to the database in `db`, which must be
/// at position `at`. Returns the new position; the checksum in it is
/// computed incrementally, and checked against the file's post-apply
/// checksum when the file tracks checksums.
pub fn apply(db: &mut File, ltx: impl Read, at: Position) -> Result<Position> {
    let mut decoder = Decoder::new(ltx)?;
    let header = *decoder.header();
    let expected = header.pre_apply_position();
    let checksum_ok = !header.tracks_checksums() || expected.checksum == at.checksum;
    if expected.txid != at.txid || !checksum_ok {
        return Err(Error::PositionMismatch {
            expected_txid: expected.txid,
            expected_checksum: expected.checksum,
            actual_txid: at.txid,
            actual_checksum: at.checksum,
        });
    }
    let page_size = u64::from(header.page_size);
    let len = db.metadata()?.len();
    if len % page_size != 0 {
        return Err(Error::RaggedDatabase {
            len,
            page_size: header.page_size,
        });
    }
    let old_commit = u32::try_from(len / page_size)
        .map_err(|_| Error::InvalidHeader("database has more than 2^32 pages"))?;
    if header.is_snapshot() && old_commit != 0 {
        return Err(Error::Usage(
            "a snapshot applies only to an empty database file",
        ));
    }
    let lock = lock_pgno(header.page_size);
    let mut rolling = RollingChecksum::from_checksum(at.checksum);
    let mut page = Vec::new();
    let mut old = vec![0u8; header.page_size as usize];
    let zero = vec![0u8; header.page_size as usize];
    let mut next_growth = old_commit.saturating_add(1);
    while let Some(pgno) = decoder.next_page(&mut page)? {
        let offset = u64::from(pgno - 1) * page_size;
        if pgno <= old_commit {
            db.seek(SeekFrom::Start(offset))?;
            db.read_exact(&mut old)?;
            rolling.remove_page(pgno, &old);
        } else {
            // Pages skipped while growing read back as zeros.
            for gap in next_growth..pgno {
                if gap != lock {
                    rolling.add_page(gap, &zero);
                }
            }
            next_growth = pgno + 1;
        }
        db.seek(SeekFrom::Start(offset))?;
        db.write_all(&page)?;
        rolling.add_page(pgno, &page);
    }
    let trailer = decoder.finish()?;
    let commit = header.commit;
    if commit < old_commit {
        for pgno in commit + 1..=old_commit {
            if pgno == lock {
                continue;
            }
            db.seek(SeekFrom::Start(u64::from(pgno - 1) * page_size))?;
            db.read_exact(&mut old)?;
            rolling.remove_page(pgno, &old);
        }
    } else {
        for gap in next_growth..=commit {
            if gap != lock {
                rolling.add_page(gap, &zero);
            }
        }
    }
    db.set_len(u64::from(commit) * page_size)?;
    if header.tracks_checksums() && rolling.value() != trailer.post_apply_checksum {
        return Err(Error::DatabaseChecksumMismatch {
            expected: trailer.post_apply_checksum,
            computed: rolling.value(),
        });
    }
    Ok(Position {
        txid: Txid(header.max_txid.0),
        checksum: rolling.value(),
    })
}
