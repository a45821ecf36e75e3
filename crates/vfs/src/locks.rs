//! The two lock tables of one database file, as pure state machines: the
//! database file's lock levels and the WAL index's eight lock slots. They
//! decide for the connections of this process what SQLite's unix VFS
//! decides with `fcntl` locks plus its in-process bookkeeping
//! (`unixLock`, `posixUnlock`, `unixShmLock` in `os_unix.c`), with the
//! same answers for connections in one process.

/// SQLite's lock levels of a database file (`SQLITE_LOCK_*`).
pub const NONE: i32 = 0;
pub const SHARED: i32 = 1;
pub const RESERVED: i32 = 2;
pub const PENDING: i32 = 3;
pub const EXCLUSIVE: i32 = 4;

/// A request refused because another connection holds a lock that
/// precludes it (`SQLITE_BUSY`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Busy;

/// The database file's lock, shared by every connection of the file: the
/// strongest level one of them holds, and how many hold at least SHARED.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileLocks {
    level: i32,
    shared: u32,
}

impl FileLocks {
    /// A connection holding `held` asks for `want` (SHARED, RESERVED or
    /// EXCLUSIVE). Returns the level the connection holds afterwards and
    /// whether it got `want`: a connection refused EXCLUSIVE from RESERVED
    /// keeps PENDING, which lets no new reader in until it gets there.
    pub fn lock(&mut self, held: i32, want: i32) -> (i32, Result<(), Busy>) {
        if held >= want {
            return (held, Ok(()));
        }
        // Another connection's lock precludes this one.
        if held != self.level && (self.level >= PENDING || want > SHARED) {
            return (held, Err(Busy));
        }
        if want == SHARED {
            // Nobody holds more than SHARED (checked above), so readers
            // only add up.
            self.shared += 1;
            self.level = self.level.max(SHARED);
            return (SHARED, Ok(()));
        }
        let mut held = held;
        if want == EXCLUSIVE && held == RESERVED {
            self.level = PENDING;
            held = PENDING;
        }
        if want == EXCLUSIVE && self.shared > 1 {
            return (held, Err(Busy));
        }
        self.level = want;
        (want, Ok(()))
    }

    /// A connection holding `held` drops to `to` (SHARED or NONE); returns
    /// the level it holds afterwards.
    pub fn unlock(&mut self, held: i32, to: i32) -> i32 {
        if held <= to {
            return held;
        }
        if held > SHARED {
            self.level = SHARED;
        }
        if to == NONE {
            self.shared = self.shared.saturating_sub(1);
            if self.shared == 0 {
                self.level = NONE;
            }
        }
        to
    }

    /// Whether some connection holds RESERVED or more.
    pub fn reserved(&self) -> bool {
        self.level > SHARED
    }
}

/// Lock slots of the WAL index (`SQLITE_SHM_NLOCK`).
pub const SHM_SLOTS: usize = 8;

/// One connection's locks of the WAL index: a bit per slot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShmHeld {
    pub shared: u8,
    pub exclusive: u8,
}

/// The WAL index's lock slots: per slot, how many connections hold it
/// shared, or -1 while one holds it exclusively.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShmLocks {
    slots: [i32; SHM_SLOTS],
}

/// Which slots `ofst..ofst + n` are, as a bit mask; `None` when the range
/// is empty or past the last slot.
pub fn shm_mask(ofst: i32, n: i32) -> Option<u8> {
    if ofst < 0 || n < 1 || ofst.checked_add(n)? > SHM_SLOTS as i32 {
        return None;
    }
    Some((((1u32 << (ofst + n)) - (1u32 << ofst)) & 0xff) as u8)
}

impl ShmLocks {
    /// `held` takes slot `ofst` shared.
    pub fn lock_shared(&mut self, held: &mut ShmHeld, ofst: usize) -> Result<(), Busy> {
        let bit = 1u8 << ofst;
        if held.shared & bit != 0 {
            return Ok(());
        }
        if self.slots[ofst] < 0 {
            return Err(Busy);
        }
        self.slots[ofst] += 1;
        held.shared |= bit;
        Ok(())
    }

    /// `held` takes every slot of `mask` exclusively, or none of them.
    pub fn lock_exclusive(&mut self, held: &mut ShmHeld, mask: u8) -> Result<(), Busy> {
        let slots = (0..SHM_SLOTS).filter(|i| mask & (1 << i) != 0);
        // Any lock on a slot, this connection's own shared one too, is in
        // the way (SQLite never asks for one it holds).
        if slots.clone().any(|i| self.slots[i] != 0) {
            return Err(Busy);
        }
        for i in slots {
            self.slots[i] = -1;
        }
        held.exclusive |= mask;
        Ok(())
    }

    /// `held` releases whatever it holds of `mask`.
    pub fn unlock(&mut self, held: &mut ShmHeld, mask: u8) {
        for i in 0..SHM_SLOTS {
            let bit = 1u8 << i;
            if mask & bit == 0 {
                continue;
            }
            if held.exclusive & bit != 0 {
                self.slots[i] = 0;
            } else if held.shared & bit != 0 {
                self.slots[i] = (self.slots[i] - 1).max(0);
            }
        }
        held.shared &= !mask;
        held.exclusive &= !mask;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum FileOp {
        Lock(usize, i32),
        Unlock(usize, i32),
    }

    fn file_op(handles: usize) -> impl Strategy<Value = FileOp> {
        prop_oneof![
            (
                0..handles,
                prop_oneof![Just(SHARED), Just(RESERVED), Just(EXCLUSIVE)]
            )
                .prop_map(|(h, l)| FileOp::Lock(h, l)),
            (0..handles, prop_oneof![Just(NONE), Just(SHARED)])
                .prop_map(|(h, l)| FileOp::Unlock(h, l)),
        ]
    }

    /// A request SQLite can make from `held` (`unixLock`'s asserts).
    fn legal(held: i32, want: i32) -> bool {
        (held != NONE || want == SHARED) && (want != RESERVED || held >= SHARED)
    }

    proptest! {
        /// Whatever the connections ask, in any order: at most one holds
        /// more than SHARED, one holding EXCLUSIVE is alone, a PENDING one
        /// lets no reader in, and the file's table agrees with the
        /// connections' levels.
        #[test]
        fn file_locks_exclude_as_sqlite_expects(ops in proptest::collection::vec(file_op(4), 1..200)) {
            let mut table = FileLocks::default();
            let mut held = [NONE; 4];
            for op in ops {
                match op {
                    FileOp::Lock(h, want) => {
                        if !legal(held[h], want) {
                            continue;
                        }
                        let before = held;
                        let (now, result) = table.lock(held[h], want);
                        held[h] = now;
                        if result.is_ok() {
                            prop_assert!(held[h] >= want);
                        } else {
                            prop_assert!(held[h] == before[h] || (before[h] == RESERVED && now == PENDING));
                        }
                        if want == SHARED && before[h] == NONE && result.is_ok() {
                            prop_assert!(before.iter().enumerate().all(|(i, &l)| i == h || l < PENDING));
                        }
                    }
                    FileOp::Unlock(h, to) => {
                        held[h] = table.unlock(held[h], to);
                        prop_assert!(held[h] <= to);
                    }
                }
                let strong = held.iter().filter(|&&l| l > SHARED).count();
                prop_assert!(strong <= 1, "two connections above SHARED: {held:?}");
                if held.contains(&EXCLUSIVE) {
                    prop_assert_eq!(held.iter().filter(|&&l| l >= SHARED).count(), 1, "EXCLUSIVE not alone: {:?}", held);
                }
                prop_assert_eq!(table.shared as usize, held.iter().filter(|&&l| l >= SHARED).count());
                prop_assert_eq!(table.level, held.iter().copied().max().unwrap_or(NONE));
                prop_assert_eq!(table.reserved(), strong == 1);
            }
        }

        /// Whatever the connections ask: a slot held exclusively is held by
        /// that connection alone, and each slot's count is the connections
        /// holding it shared.
        #[test]
        fn shm_slots_exclude_as_sqlite_expects(
            ops in proptest::collection::vec((0..3usize, 0..3u8, 0..8i32, 1..4i32), 1..300)
        ) {
            let mut table = ShmLocks::default();
            let mut held = [ShmHeld::default(); 3];
            for (h, kind, ofst, n) in ops {
                match kind {
                    0 => {
                        let ofst = ofst as usize;
                        let was_excl_elsewhere = held.iter().enumerate()
                            .any(|(i, x)| i != h && x.exclusive & (1 << ofst) != 0);
                        if held[h].exclusive & (1 << ofst) != 0 {
                            continue; // SQLite never asks for a lock it holds.
                        }
                        let got = table.lock_shared(&mut held[h], ofst);
                        prop_assert_eq!(got.is_err(), was_excl_elsewhere);
                    }
                    1 => {
                        let Some(mask) = shm_mask(ofst, n) else { continue };
                        if (held[h].exclusive | held[h].shared) & mask != 0 {
                            continue; // SQLite never asks for a lock it holds.
                        }
                        let taken = held.iter().fold(0u8, |m, x| m | x.shared | x.exclusive);
                        let got = table.lock_exclusive(&mut held[h], mask);
                        prop_assert_eq!(got.is_ok(), taken & mask == 0);
                    }
                    _ => {
                        let Some(mask) = shm_mask(ofst, n) else { continue };
                        table.unlock(&mut held[h], mask);
                        prop_assert_eq!((held[h].shared | held[h].exclusive) & mask, 0);
                    }
                }
                for slot in 0..SHM_SLOTS {
                    let bit = 1u8 << slot;
                    let excl = held.iter().filter(|x| x.exclusive & bit != 0).count();
                    let shared = held.iter().filter(|x| x.shared & bit != 0).count();
                    prop_assert!(excl <= 1);
                    if excl == 1 {
                        prop_assert_eq!(shared, 0);
                        prop_assert_eq!(table.slots[slot], -1);
                    } else {
                        prop_assert_eq!(table.slots[slot], shared as i32);
                    }
                }
            }
        }
    }

    #[test]
    fn a_writer_refused_exclusive_keeps_readers_out() {
        let mut table = FileLocks::default();
        let (a, _) = table.lock(NONE, SHARED);
        let (b, _) = table.lock(NONE, SHARED);
        let (a, ok) = table.lock(a, RESERVED);
        assert_eq!((a, ok), (RESERVED, Ok(())));
        let (a, refused) = table.lock(a, EXCLUSIVE);
        assert_eq!((a, refused), (PENDING, Err(Busy)));
        assert_eq!(table.lock(NONE, SHARED), (NONE, Err(Busy)));
        let _ = table.unlock(b, NONE);
        assert_eq!(table.lock(a, EXCLUSIVE), (EXCLUSIVE, Ok(())));
    }

    #[test]
    fn masks_cover_their_slots_and_nothing_past_the_last() {
        assert_eq!(shm_mask(0, 1), Some(0b1));
        assert_eq!(shm_mask(3, 5), Some(0b1111_1000));
        assert_eq!(shm_mask(7, 2), None);
        assert_eq!(shm_mask(0, 0), None);
        assert_eq!(shm_mask(-1, 1), None);
    }
}
