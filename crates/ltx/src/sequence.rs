//! Which pages a file may hold and in what order: ascending, never page 0
//! or the lock page, never above the commit size, and for a snapshot every
//! page from 1 to the commit size. Shared by the encoder and the decoder so
//! both enforce the same rules.

use crate::{lock_pgno, Error, Header, Result};

#[derive(Clone, Copy, Debug)]
pub(crate) struct PageSequence {
    commit: u32,
    lock: u32,
    snapshot: bool,
    last: u32,
}

impl PageSequence {
    pub(crate) fn new(header: &Header) -> Self {
        PageSequence {
            commit: header.commit,
            lock: lock_pgno(header.page_size),
            snapshot: header.is_snapshot(),
            last: 0,
        }
    }

    /// Check that `pgno` may come next, and record it.
    pub(crate) fn push(&mut self, pgno: u32) -> Result<()> {
        if pgno == 0 {
            return Err(Error::ZeroPage);
        }
        if pgno == self.lock {
            return Err(Error::LockPage(pgno));
        }
        if pgno <= self.last {
            return Err(Error::PageOutOfOrder {
                pgno,
                previous: self.last,
            });
        }
        if pgno > self.commit {
            return Err(Error::PageBeyondCommit {
                pgno,
                commit: self.commit,
            });
        }
        if self.snapshot && pgno != self.next_snapshot_pgno() {
            return Err(Error::SnapshotMissingPage(self.next_snapshot_pgno()));
        }
        self.last = pgno;
        Ok(())
    }

    /// Check that nothing is missing now that the pages have ended.
    pub(crate) fn finish(&self) -> Result<()> {
        if self.snapshot && self.next_snapshot_pgno() <= self.commit {
            return Err(Error::SnapshotMissingPage(self.next_snapshot_pgno()));
        }
        Ok(())
    }

    fn next_snapshot_pgno(&self) -> u32 {
        let next = self.last.saturating_add(1);
        if next == self.lock {
            next.saturating_add(1)
        } else {
            next
        }
    }
}
