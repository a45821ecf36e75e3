//! The `cellfleet` SQLite VFS: SQLite's own unix files (its `unix-none`
//! VFS, which reads and writes them), with the locks between connections
//! and the WAL index kept in this process's memory.
//!
//! Why: SQLite's default unix VFS keeps one list entry per open database
//! file in the process and walks the whole list on every open (to share
//! POSIX locks between connections of one file). A node with thousands of
//! Cells open paid that walk, one cache miss per open file, on every Cell
//! it opened (BENCHMARKS.md, twenty-second measurement); and each Cell
//! kept a `-shm` file for its WAL index. Here a file's shared state is
//! found by its device and inode in a hash map, and the WAL index lives in
//! heap memory (as SQLite's `unix-excl` VFS keeps it), so an open Cell is
//! its database and its `-wal`.
//!
//! The rules it keeps:
//! - Connections of one file in this process see each other's locks with
//!   the same answers as the unix VFS gives ([`locks`], property-tested
//!   against those rules).
//! - Other processes are kept out while any connection of the file is
//!   open: the first one takes an open-file-description write lock on
//!   SQLite's lock bytes of the database (`PENDING` to the end of the
//!   `SHARED` range), which every SQLite build honours, and which the
//!   closing of another descriptor of the file cannot drop. A process that
//!   holds them already (an `sqlite3` shell reading a Cell, say) makes the
//!   open fail with `SQLITE_BUSY`.
//! - The WAL index is zeroed when the first connection maps it and freed
//!   when the last one unmaps it; SQLite then rebuilds it from the WAL, as
//!   it does for a new `-shm` file.
//!
//! Only this crate in the workspace uses `unsafe`: it is SQLite's C
//! interface. Every pointer it dereferences was handed to it by SQLite
//! under the VFS contract (a file's memory of [`sqlite3_vfs::szOsFile`]
//! bytes, live from `xOpen` until `xClose`).

pub mod locks;

use std::collections::HashMap;
use std::ffi::{c_int, c_void, CStr};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::ptr;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use rusqlite::ffi;

use locks::{FileLocks, ShmHeld, ShmLocks};

/// The name to open a connection with (`Connection::open_with_flags_and_vfs`).
pub const NAME: &str = "cellfleet";

const NAME_C: &CStr = c"cellfleet";
const INNER: &CStr = c"unix-none";

/// SQLite's lock bytes of a database file (`PENDING_BYTE` and the
/// `RESERVED` and `SHARED` bytes after it), which other processes lock.
const LOCK_BYTES: (i64, i64) = (0x4000_0000, 512);

/// Why [`register`] failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisterError(pub String);

impl std::fmt::Display for RegisterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "registering the {NAME} SQLite VFS: {}", self.0)
    }
}

impl std::error::Error for RegisterError {}

/// Registers the VFS with SQLite once per process (later calls return the
/// first call's result). It is not made the default.
pub fn register() -> Result<(), RegisterError> {
    static DONE: OnceLock<Result<(), RegisterError>> = OnceLock::new();
    DONE.get_or_init(|| {
        // SAFETY: SQLite's documented registration calls; the VFS struct is
        // leaked, so it outlives every connection.
        unsafe {
            let rc = ffi::sqlite3_initialize();
            if rc != ffi::SQLITE_OK {
                return Err(RegisterError(format!("sqlite3_initialize: {rc}")));
            }
            let inner = ffi::sqlite3_vfs_find(INNER.as_ptr());
            if inner.is_null() {
                return Err(RegisterError("SQLite has no unix-none VFS".into()));
            }
            let mut vfs: ffi::sqlite3_vfs = *inner;
            vfs.iVersion = vfs.iVersion.min(2);
            vfs.szOsFile = c_int::try_from(HANDLE_BYTES)
                .ok()
                .and_then(|own| own.checked_add((*inner).szOsFile))
                .ok_or_else(|| RegisterError("file struct too large".into()))?;
            vfs.pNext = ptr::null_mut();
            vfs.zName = NAME_C.as_ptr();
            vfs.pAppData = inner.cast();
            vfs.xOpen = Some(x_open);
            let vfs = Box::leak(Box::new(vfs));
            let rc = ffi::sqlite3_vfs_register(vfs, 0);
            if rc != ffi::SQLITE_OK {
                return Err(RegisterError(format!("sqlite3_vfs_register: {rc}")));
            }
            Ok(())
        }
    })
    .clone()
}

/// What every connection of one database file shares.
struct Node {
    locks: Mutex<FileLocks>,
    shm: Mutex<Shm>,
    /// Holds the lock that keeps other processes off the file.
    _guard: std::fs::File,
}

/// The WAL index: its regions, the connections that map it, its locks.
#[derive(Default)]
struct Shm {
    regions: Vec<Region>,
    region_bytes: usize,
    mapped: usize,
    locks: ShmLocks,
}

/// One zeroed region of the WAL index. SQLite reads and writes it through
/// the pointer [`x_shm_map`] hands out, from any of its connections'
/// threads, under its own locking; Rust never reads it.
struct Region {
    words: *mut u64,
    len: usize,
}

// SAFETY: the region is plain memory owned by its `Shm`, freed only under
// the `Shm`'s mutex once no connection maps it.
unsafe impl Send for Region {}

impl Region {
    fn zeroed(bytes: usize) -> Region {
        let len = bytes.div_ceil(8);
        let words = Box::into_raw(vec![0u64; len].into_boxed_slice()).cast::<u64>();
        Region { words, len }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: `words` came from `Box::into_raw` of a slice of `len`.
        unsafe {
            drop(Box::from_raw(ptr::slice_from_raw_parts_mut(
                self.words, self.len,
            )));
        }
    }
}

type Key = (u64, u64);

struct Entry {
    node: Arc<Node>,
    handles: usize,
}

fn registry() -> MutexGuard<'static, HashMap<Key, Entry>> {
    static NODES: OnceLock<Mutex<HashMap<Key, Entry>>> = OnceLock::new();
    lock(NODES.get_or_init(Default::default))
}

/// A mutex's guard, poisoned or not: the tables stay consistent because
/// nothing in them can panic halfway.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Our part of an open file; the `unix-none` file follows it in the same
/// allocation.
#[repr(C)]
struct Handle {
    base: ffi::sqlite3_file,
    inner: *mut ffi::sqlite3_file,
    /// Shared state of a main database file (`None` for WAL, journal and
    /// temporary files, which SQLite never locks).
    node: Option<Arc<Node>>,
    key: Key,
    level: c_int,
    shm_mapped: bool,
    shm_held: ShmHeld,
}

const HANDLE_BYTES: usize = std::mem::size_of::<Handle>().next_multiple_of(16);

static METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(x_close),
    xRead: Some(x_read),
    xWrite: Some(x_write),
    xTruncate: Some(x_truncate),
    xSync: Some(x_sync),
    xFileSize: Some(x_file_size),
    xLock: Some(x_lock),
    xUnlock: Some(x_unlock),
    xCheckReservedLock: Some(x_check_reserved_lock),
    xFileControl: Some(x_file_control),
    xSectorSize: Some(x_sector_size),
    xDeviceCharacteristics: Some(x_device_characteristics),
    xShmMap: Some(x_shm_map),
    xShmLock: Some(x_shm_lock),
    xShmBarrier: Some(x_shm_barrier),
    xShmUnmap: Some(x_shm_unmap),
    xFetch: Some(x_fetch),
    xUnfetch: Some(x_unfetch),
};

/// The inner file's methods.
///
/// # Safety
/// `inner` is an open `unix-none` file.
unsafe fn inner_methods(inner: *mut ffi::sqlite3_file) -> &'static ffi::sqlite3_io_methods {
    // SAFETY: an open file's methods are SQLite's static tables.
    unsafe { &*(*inner).pMethods }
}

/// # Safety
/// `file` is one SQLite opened through [`x_open`] and has not closed.
unsafe fn handle<'a>(file: *mut ffi::sqlite3_file) -> &'a mut Handle {
    // SAFETY: per the function's contract, `file` points at our `Handle`,
    // used by one connection at a time.
    unsafe { &mut *file.cast::<Handle>() }
}

unsafe extern "C" fn x_open(
    vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    // SAFETY: SQLite gives `file` as `szOsFile` bytes, 8-aligned, which
    // hold our `Handle` and then the inner file; `pAppData` is the inner
    // VFS (set by `register`).
    unsafe {
        let inner_vfs = (*vfs).pAppData.cast::<ffi::sqlite3_vfs>();
        let inner = file
            .cast::<u8>()
            .add(HANDLE_BYTES)
            .cast::<ffi::sqlite3_file>();
        ptr::write(
            file.cast::<Handle>(),
            Handle {
                base: ffi::sqlite3_file {
                    pMethods: ptr::null(),
                },
                inner,
                node: None,
                key: (0, 0),
                level: locks::NONE,
                shm_mapped: false,
                shm_held: ShmHeld::default(),
            },
        );
        (*inner).pMethods = ptr::null();
        let Some(open) = (*inner_vfs).xOpen else {
            return ffi::SQLITE_CANTOPEN;
        };
        let rc = open(inner_vfs, name, inner, flags, out_flags);
        if rc != ffi::SQLITE_OK {
            if !(*inner).pMethods.is_null() {
                if let Some(close) = inner_methods(inner).xClose {
                    close(inner);
                }
            }
            return rc;
        }
        if flags & ffi::SQLITE_OPEN_MAIN_DB != 0 && !name.is_null() {
            let path = Path::new(std::ffi::OsStr::from_bytes(CStr::from_ptr(name).to_bytes()));
            let read_only = flags & ffi::SQLITE_OPEN_READONLY != 0;
            match attach(path, read_only) {
                Ok((key, node)) => {
                    let h = handle(file);
                    h.key = key;
                    h.node = Some(node);
                }
                Err(rc) => {
                    if let Some(close) = inner_methods(inner).xClose {
                        close(inner);
                    }
                    return rc;
                }
            }
        }
        (*file).pMethods = &METHODS;
        ffi::SQLITE_OK
    }
}

/// The shared state of the database file at `path`, made (and other
/// processes locked out) by its first connection.
fn attach(path: &Path, read_only: bool) -> Result<(Key, Arc<Node>), c_int> {
    let meta = std::fs::metadata(path).map_err(|_| ffi::SQLITE_CANTOPEN)?;
    let key = (meta.dev(), meta.ino());
    let mut nodes = registry();
    if let Some(entry) = nodes.get_mut(&key) {
        entry.handles += 1;
        return Ok((key, entry.node.clone()));
    }
    let guard = guard(path, read_only)?;
    let node = Arc::new(Node {
        locks: Mutex::new(FileLocks::default()),
        shm: Mutex::new(Shm::default()),
        _guard: guard,
    });
    nodes.insert(
        key,
        Entry {
            node: node.clone(),
            handles: 1,
        },
    );
    Ok((key, node))
}

/// A descriptor of `path` holding an open-file-description lock on
/// SQLite's lock bytes: a write lock, or a read lock when the file cannot
/// be opened for writing (which still keeps other writers out).
fn guard(path: &Path, read_only: bool) -> Result<std::fs::File, c_int> {
    let writable = if read_only {
        None
    } else {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .ok()
    };
    let (file, kind) = match writable {
        Some(file) => (file, libc::F_WRLCK),
        None => (
            std::fs::File::open(path).map_err(|_| ffi::SQLITE_CANTOPEN)?,
            libc::F_RDLCK,
        ),
    };
    match lock_bytes(&file, kind) {
        Ok(()) => Ok(file),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Err(ffi::SQLITE_BUSY),
        Err(_) => Err(ffi::SQLITE_IOERR_LOCK),
    }
}

/// Takes an open-file-description lock of `kind` on SQLite's lock bytes
/// of `file`, without waiting: an error of kind `WouldBlock` when another
/// open file description (of this process or another) holds a conflicting
/// one.
fn lock_bytes(file: &std::fs::File, kind: c_int) -> std::io::Result<()> {
    // SAFETY: a plain `fcntl` on a descriptor we own, with a zeroed
    // `flock` filled in.
    let rc = unsafe {
        let mut lock: libc::flock = std::mem::zeroed();
        lock.l_type = kind as libc::c_short;
        lock.l_whence = libc::SEEK_SET as libc::c_short;
        lock.l_start = LOCK_BYTES.0;
        lock.l_len = LOCK_BYTES.1;
        libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &lock)
    };
    if rc == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EACCES) => Err(std::io::ErrorKind::WouldBlock.into()),
        _ => Err(e),
    }
}

/// Keeps every connection off the database file at `path`, as a
/// connection's first open keeps other processes off it: a write lock on
/// SQLite's lock bytes, held until the returned file closes. For work on
/// a database's files outside SQLite (rebuilding it, removing its WAL)
/// that must not meet a connection of another process.
///
/// `Ok(None)` when there is no file at `path`. An error of kind
/// `WouldBlock` when a connection (of this process or another) or another
/// holder has it.
pub fn exclude_connections(path: &Path) -> std::io::Result<Option<std::fs::File>> {
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    lock_bytes(&file, libc::F_WRLCK)?;
    Ok(Some(file))
}

/// Drops `h`'s part of its file's shared state: its locks, its mapping of
/// the WAL index, and (the last connection) the state itself.
fn detach(h: &mut Handle) {
    let Some(node) = h.node.take() else {
        return;
    };
    if h.level != locks::NONE {
        h.level = lock(&node.locks).unlock(h.level, locks::NONE);
    }
    unmap(h, &node);
    let mut nodes = registry();
    if let Some(entry) = nodes.get_mut(&h.key) {
        entry.handles -= 1;
        if entry.handles == 0 {
            nodes.remove(&h.key);
        }
    }
    // The last `Arc` goes while the registry is locked, so a new first
    // connection never meets this one's guard lock.
    drop(node);
    drop(nodes);
}

fn unmap(h: &mut Handle, node: &Node) {
    if !h.shm_mapped {
        return;
    }
    let mut shm = lock(&node.shm);
    shm.locks.unlock(&mut h.shm_held, 0xff);
    h.shm_mapped = false;
    shm.mapped -= 1;
    if shm.mapped == 0 {
        shm.regions.clear();
        shm.region_bytes = 0;
    }
}

unsafe extern "C" fn x_close(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: SQLite closes a file it opened through `x_open` once.
    unsafe {
        let h = handle(file);
        detach(h);
        let inner = h.inner;
        (*file).pMethods = ptr::null();
        match inner_methods(inner).xClose {
            Some(close) => close(inner),
            None => ffi::SQLITE_OK,
        }
    }
}

macro_rules! forward {
    ($name:ident, $method:ident, ($($arg:ident: $ty:ty),*) -> $ret:ty, $missing:expr) => {
        unsafe extern "C" fn $name(file: *mut ffi::sqlite3_file $(, $arg: $ty)*) -> $ret {
            // SAFETY: `file` is open (SQLite's contract), so its inner
            // file is too.
            unsafe {
                let inner = handle(file).inner;
                match inner_methods(inner).$method {
                    Some(method) => method(inner $(, $arg)*),
                    None => $missing,
                }
            }
        }
    };
}

forward!(x_read, xRead, (buf: *mut c_void, amount: c_int, offset: ffi::sqlite3_int64) -> c_int, ffi::SQLITE_IOERR_READ);
forward!(x_write, xWrite, (buf: *const c_void, amount: c_int, offset: ffi::sqlite3_int64) -> c_int, ffi::SQLITE_IOERR_WRITE);
forward!(x_truncate, xTruncate, (size: ffi::sqlite3_int64) -> c_int, ffi::SQLITE_IOERR_TRUNCATE);
forward!(x_sync, xSync, (flags: c_int) -> c_int, ffi::SQLITE_IOERR_FSYNC);
forward!(x_file_size, xFileSize, (size: *mut ffi::sqlite3_int64) -> c_int, ffi::SQLITE_IOERR_FSTAT);
forward!(x_file_control, xFileControl, (op: c_int, arg: *mut c_void) -> c_int, ffi::SQLITE_NOTFOUND);
forward!(x_sector_size, xSectorSize, () -> c_int, 4096);
forward!(x_device_characteristics, xDeviceCharacteristics, () -> c_int, 0);
forward!(x_fetch, xFetch, (offset: ffi::sqlite3_int64, amount: c_int, out: *mut *mut c_void) -> c_int, {
    // No mapping to hand out: SQLite reads the page instead.
    *out = ptr::null_mut();
    ffi::SQLITE_OK
});
forward!(x_unfetch, xUnfetch, (offset: ffi::sqlite3_int64, page: *mut c_void) -> c_int, ffi::SQLITE_OK);

unsafe extern "C" fn x_lock(file: *mut ffi::sqlite3_file, want: c_int) -> c_int {
    // SAFETY: `file` is open.
    let h = unsafe { handle(file) };
    let Some(node) = &h.node else {
        return ffi::SQLITE_OK;
    };
    let (level, result) = lock(&node.locks).lock(h.level, want);
    h.level = level;
    match result {
        Ok(()) => ffi::SQLITE_OK,
        Err(locks::Busy) => ffi::SQLITE_BUSY,
    }
}

unsafe extern "C" fn x_unlock(file: *mut ffi::sqlite3_file, to: c_int) -> c_int {
    // SAFETY: `file` is open.
    let h = unsafe { handle(file) };
    if let Some(node) = &h.node {
        h.level = lock(&node.locks).unlock(h.level, to);
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_check_reserved_lock(file: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    // SAFETY: `file` is open and `out` valid (SQLite's contract).
    unsafe {
        let h = handle(file);
        *out = match &h.node {
            Some(node) => c_int::from(lock(&node.locks).reserved()),
            None => 0,
        };
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_shm_map(
    file: *mut ffi::sqlite3_file,
    region: c_int,
    region_bytes: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    // SAFETY: `file` is open and `out` valid (SQLite's contract).
    unsafe {
        *out = ptr::null_mut();
        let h = handle(file);
        let Some(node) = &h.node else {
            return ffi::SQLITE_IOERR_SHMOPEN;
        };
        let (Ok(region), Ok(bytes)) = (usize::try_from(region), usize::try_from(region_bytes))
        else {
            return ffi::SQLITE_IOERR_SHMMAP;
        };
        let mut shm = lock(&node.shm);
        if !h.shm_mapped {
            h.shm_mapped = true;
            shm.mapped += 1;
        }
        if shm.regions.is_empty() {
            shm.region_bytes = bytes;
        } else if shm.region_bytes != bytes {
            return ffi::SQLITE_IOERR_SHMSIZE;
        }
        while shm.regions.len() <= region {
            if extend == 0 {
                return ffi::SQLITE_OK;
            }
            shm.regions.push(Region::zeroed(bytes));
        }
        *out = shm.regions[region].words.cast();
        ffi::SQLITE_OK
    }
}

unsafe extern "C" fn x_shm_lock(
    file: *mut ffi::sqlite3_file,
    ofst: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    // SAFETY: `file` is open.
    let h = unsafe { handle(file) };
    // Borrowed, not cloned: every transaction takes several of these.
    let Some(node) = &h.node else {
        return ffi::SQLITE_IOERR_SHMLOCK;
    };
    let Some(mask) = locks::shm_mask(ofst, n) else {
        return ffi::SQLITE_IOERR_SHMLOCK;
    };
    if !h.shm_mapped {
        return ffi::SQLITE_IOERR_SHMLOCK;
    }
    let mut shm = lock(&node.shm);
    let result = if flags & ffi::SQLITE_SHM_UNLOCK != 0 {
        shm.locks.unlock(&mut h.shm_held, mask);
        Ok(())
    } else if flags & ffi::SQLITE_SHM_SHARED != 0 {
        if n != 1 {
            return ffi::SQLITE_IOERR_SHMLOCK;
        }
        shm.locks.lock_shared(&mut h.shm_held, ofst as usize)
    } else {
        shm.locks.lock_exclusive(&mut h.shm_held, mask)
    };
    match result {
        Ok(()) => ffi::SQLITE_OK,
        Err(locks::Busy) => ffi::SQLITE_BUSY,
    }
}

unsafe extern "C" fn x_shm_barrier(_file: *mut ffi::sqlite3_file) {
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

unsafe extern "C" fn x_shm_unmap(file: *mut ffi::sqlite3_file, _delete: c_int) -> c_int {
    // SAFETY: `file` is open.
    let h = unsafe { handle(file) };
    if let Some(node) = h.node.clone() {
        unmap(h, &node);
    }
    ffi::SQLITE_OK
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_handle_leaves_the_inner_file_aligned() {
        assert_eq!(HANDLE_BYTES % 8, 0);
        assert!(HANDLE_BYTES >= std::mem::size_of::<Handle>());
    }

    #[test]
    fn registering_twice_is_one_registration() {
        register().unwrap();
        register().unwrap();
        // SAFETY: looking a VFS up by name.
        let found = unsafe { ffi::sqlite3_vfs_find(NAME_C.as_ptr()) };
        assert!(!found.is_null());
    }
}
