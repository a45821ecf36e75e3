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
//!   open fail with `SQLITE_BUSY`. The lock sits on that connection's own
//!   descriptor of the database, which this VFS learns by wrapping the
//!   unix VFSes' `open` system call ([`register`]), so it costs no
//!   descriptor of its own. When that connection closes before the others,
//!   a duplicate of its descriptor keeps the lock (the lock belongs to the
//!   open file description, which the duplicate shares) until the last
//!   one closes.
//! - The WAL index is zeroed when the first connection maps it and freed
//!   when the last one unmaps it; SQLite then rebuilds it from the WAL, as
//!   it does for a new `-shm` file.
//! - A WAL file's small writes (a frame's header) wait for the next write
//!   beside them (its page), so a frame is one system call; nothing is held
//!   once a commit returns (see `x_write`).
//! - A plain absolute path whose file is not a symlink is its own full
//!   path: one `lstat`, not one per component (see `x_full_pathname`).
//!
//! Only this crate in the workspace uses `unsafe`: it is SQLite's C
//! interface. Every pointer it dereferences was handed to it by SQLite
//! under the VFS contract (a file's memory of [`sqlite3_vfs::szOsFile`]
//! bytes, live from `xOpen` until `xClose`). For the same reason it
//! holds the one process-wide SQLite setting the node changes,
//! [`memory_statistics_off`].

pub mod locks;

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
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

/// The flags a connection opens a file through this VFS with: read-only,
/// or read-write creating the file; each connection used by one thread at
/// a time (no SQLite mutex).
pub fn open_flags(read_only: bool) -> rusqlite::OpenFlags {
    use rusqlite::OpenFlags;
    if read_only {
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX
    } else {
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
    }
}

/// Why [`register`] failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisterError(pub String);

impl std::fmt::Display for RegisterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "registering the {NAME} SQLite VFS: {}", self.0)
    }
}

impl std::error::Error for RegisterError {}

/// SQLite's unix `open` system call: `open(2)` with a mode.
type OpenFn = unsafe extern "C" fn(*const c_char, c_int, c_int) -> c_int;

/// The `open` the unix VFSes called before [`register`] wrapped it.
static OPEN_BEFORE: OnceLock<OpenFn> = OnceLock::new();

thread_local! {
    /// The descriptor the last `open` of SQLite's unix VFSes on this
    /// thread returned (or -1): [`x_open`] reads it right after the inner
    /// open to learn the database's descriptor.
    static OPENED: Cell<c_int> = const { Cell::new(-1) };
}

/// The unix VFSes' `open` once [`register`] ran: the one before, and a
/// note of what it returned for [`x_open`]. `errno` is left as it set it.
unsafe extern "C" fn open_noting(path: *const c_char, flags: c_int, mode: c_int) -> c_int {
    let Some(open) = OPEN_BEFORE.get() else {
        return -1;
    };
    // SAFETY: SQLite's own `open`, called with SQLite's arguments.
    let fd = unsafe { open(path, flags, mode) };
    OPENED.with(|opened| opened.set(fd));
    fd
}

/// Turns SQLite's memory statistics off for this process, if SQLite has
/// not initialized yet; true if they are off now.
///
/// With the statistics on (SQLite's default), every allocation and free
/// in SQLite takes one process-wide mutex to count it: on a node serving
/// many Cells from many threads that lock was about a quarter of the
/// node's `futex` calls (BENCHMARKS.md, thirty-eighth and thirty-ninth
/// measurements). The statistics feed SQLite's soft heap limit, which
/// the runtime no longer uses: it bounds page caches by charging each
/// open Cell its connections' capped caches instead. Call this first
/// thing in a binary's `main`: before anything opens a connection or
/// registers a VFS, and while no other thread uses SQLite (SQLite's
/// configuration calls are not threadsafe). Once SQLite has initialized,
/// the setting is refused and this returns false, which costs only speed.
pub fn memory_statistics_off() -> bool {
    // SAFETY: `sqlite3_config` sets SQLite's global configuration without
    // a lock, so no other thread may use SQLite meanwhile (the caller's
    // contract above); it returns SQLITE_MISUSE, changing nothing, once
    // SQLite has initialized. SQLITE_CONFIG_MEMSTATUS takes one int.
    let rc =
        unsafe { ffi::sqlite3_config(ffi::SQLITE_CONFIG_MEMSTATUS, std::ffi::c_int::from(0u8)) };
    rc == ffi::SQLITE_OK || !memory_statistics_on()
}

/// Whether SQLite counts its allocations (see [`memory_statistics_off`]):
/// with the statistics off, SQLite reports nothing in use however much
/// it holds. It opens a connection, which starts SQLite: called before
/// [`memory_statistics_off`], it leaves the statistics on.
pub fn memory_statistics_on() -> bool {
    let conn = rusqlite::Connection::open_in_memory();
    // SAFETY: a plain read of SQLite's counter.
    let used = unsafe { ffi::sqlite3_memory_used() };
    drop(conn);
    used > 0
}

/// Registers the VFS with SQLite once per process (later calls return the
/// first call's result). It is not made the default.
///
/// It also wraps the `open` system call of SQLite's unix VFSes (their
/// system-call table is one for the process, so the default VFS's opens
/// pass through it too): the wrapper calls the `open` before it and notes
/// the descriptor, nothing else. Register before connections open on
/// other threads; the swap is one pointer store.
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
            let (Some(get), Some(set)) = ((*inner).xGetSystemCall, (*inner).xSetSystemCall) else {
                return Err(RegisterError("unix-none has no system-call table".into()));
            };
            let Some(before) = get(inner, c"open".as_ptr()) else {
                return Err(RegisterError("unix-none has no open system call".into()));
            };
            // SQLite calls its `open` as an `OpenFn` (`osOpen`); the table
            // stores every system call as a `void (*)(void)`.
            let before = std::mem::transmute::<unsafe extern "C" fn(), OpenFn>(before);
            if OPEN_BEFORE.set(before).is_err() {
                return Err(RegisterError(
                    "the open system call was wrapped twice".into(),
                ));
            }
            let noting = std::mem::transmute::<OpenFn, unsafe extern "C" fn()>(open_noting);
            let rc = set(inner, c"open".as_ptr(), Some(noting));
            if rc != ffi::SQLITE_OK {
                return Err(RegisterError(format!(
                    "wrapping the open system call: {rc}"
                )));
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
            vfs.xFullPathname = Some(x_full_pathname);
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
}

/// Which descriptor holds the lock that keeps other processes off a file.
enum Guard {
    /// The database descriptor of the open handle with this id.
    Handle(usize),
    /// A duplicate of a closed handle's descriptor (the same open file
    /// description, so the same lock), closed with the last handle.
    Own(#[allow(dead_code)] std::fs::File),
    /// None: a duplicate could not be made and no other descriptor could
    /// take the lock again (descriptors ran out, or another process took
    /// the bytes in between). Connections of this process still exclude
    /// each other.
    Lost,
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
    /// The open handles of the file.
    handles: Vec<Opened>,
    guard: Guard,
}

/// One open handle of a database file: its id (its address), its
/// database descriptor, and whether it opened read-only.
#[derive(Clone, Copy)]
struct Opened {
    id: usize,
    fd: RawFd,
    read_only: bool,
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
    /// The database's descriptor (a main database's handle only).
    fd: RawFd,
    level: c_int,
    shm_mapped: bool,
    shm_held: ShmHeld,
    /// A WAL file's handle (only these hold writes back).
    wal: bool,
    /// WAL files: the first `held_len` bytes are written but held back,
    /// from `held_at`, until the next write extends them (see [`x_write`]).
    /// Inline, so an open Cell's WAL handle keeps no buffer of a page's
    /// size between commits.
    held: [u8; HOLD_BYTES_MAX],
    held_len: usize,
    held_at: i64,
}

/// The largest write a WAL handle holds back: the WAL header (32 bytes)
/// and a frame header (24).
const HOLD_BYTES_MAX: usize = 64;

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
        if flags & ffi::SQLITE_OPEN_NOFOLLOW != 0
            && flags & ffi::SQLITE_OPEN_MAIN_DB != 0
            && !name.is_null()
            && through_symlink(inner_vfs, name)
        {
            // `x_full_pathname` did not walk the path, so SQLite could not
            // refuse a symlink on the way as its unix VFS makes it.
            return ffi::SQLITE_CANTOPEN_SYMLINK;
        }
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
                fd: -1,
                level: locks::NONE,
                shm_mapped: false,
                shm_held: ShmHeld::default(),
                wal: flags & ffi::SQLITE_OPEN_WAL != 0,
                held: [0; HOLD_BYTES_MAX],
                held_len: 0,
                held_at: 0,
            },
        );
        (*inner).pMethods = ptr::null();
        let Some(open) = (*inner_vfs).xOpen else {
            return ffi::SQLITE_CANTOPEN;
        };
        OPENED.with(|opened| opened.set(-1));
        let rc = open(inner_vfs, name, inner, flags, out_flags);
        let fd = OPENED.with(|opened| opened.replace(-1));
        if rc != ffi::SQLITE_OK {
            if !(*inner).pMethods.is_null() {
                if let Some(close) = inner_methods(inner).xClose {
                    close(inner);
                }
            }
            return rc;
        }
        if flags & ffi::SQLITE_OPEN_MAIN_DB != 0 && !name.is_null() {
            let read_only = flags & ffi::SQLITE_OPEN_READONLY != 0
                || (!out_flags.is_null() && *out_flags & ffi::SQLITE_OPEN_READONLY != 0);
            match attach(file as usize, fd, read_only) {
                Ok((key, node)) => {
                    let h = handle(file);
                    h.key = key;
                    h.fd = fd;
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

/// Whether `path` is absolute and already in the form SQLite's unix VFS
/// would give it, symlinks aside: no empty, `.` or `..` component and no
/// trailing `/` (pure).
fn is_plain_absolute(path: &[u8]) -> bool {
    let Some(rest) = path.strip_prefix(b"/") else {
        return false;
    };
    !rest.is_empty()
        && rest
            .split(|&byte| byte == b'/')
            .all(|part| !part.is_empty() && part != b"." && part != b"..")
}

/// The full path of a file SQLite is about to open. SQLite's unix VFS
/// `lstat`s every component of the path in turn to resolve symlinks (seven
/// system calls for `/var/lib/cellfleet/n1/cells/<id>.db`, each walking the
/// path again), on every open of every Cell. A plain absolute path (see
/// [`is_plain_absolute`]) whose last component is not a symlink is its own
/// full path: one `lstat`. Anything else (a relative path, `.` or `..`, a
/// symlinked file) is the inner VFS's to resolve, as before.
///
/// What differs: a path through a symlinked directory is not rewritten to
/// the directory it points at. The database and its `-wal` still sit side
/// by side in that one directory, and this VFS tells files apart by device
/// and inode, not by name. An open with `SQLITE_OPEN_NOFOLLOW` is still
/// refused for a symlink anywhere on the path: `x_open` asks the inner
/// VFS's walk for that flag alone.
unsafe extern "C" fn x_full_pathname(
    vfs: *mut ffi::sqlite3_vfs,
    path: *const c_char,
    n_out: c_int,
    out: *mut c_char,
) -> c_int {
    // SAFETY: SQLite passes a NUL-terminated path and an output buffer of
    // `n_out` bytes; `pAppData` is the inner VFS (set by `register`).
    unsafe {
        let name = CStr::from_ptr(path);
        let bytes = name.to_bytes_with_nul();
        let fits = usize::try_from(n_out).is_ok_and(|n| bytes.len() <= n);
        if fits && is_plain_absolute(name.to_bytes()) && !is_symlink(name) {
            ptr::copy_nonoverlapping(bytes.as_ptr(), out.cast::<u8>(), bytes.len());
            return ffi::SQLITE_OK;
        }
        let inner_vfs = (*vfs).pAppData.cast::<ffi::sqlite3_vfs>();
        match (*inner_vfs).xFullPathname {
            Some(full) => full(inner_vfs, path, n_out, out),
            None => ffi::SQLITE_CANTOPEN,
        }
    }
}

/// Whether SQLite's unix VFS finds a symlink anywhere on `name`'s path
/// (its full-pathname walk answers `SQLITE_OK_SYMLINK`).
///
/// # Safety
/// `inner_vfs` is the registered inner VFS; `name` is NUL-terminated.
unsafe fn through_symlink(inner_vfs: *mut ffi::sqlite3_vfs, name: *const c_char) -> bool {
    // SAFETY: per the function's contract; the buffer holds the longest
    // path the inner VFS writes, and its terminating NUL.
    unsafe {
        let Some(full) = (*inner_vfs).xFullPathname else {
            return false;
        };
        let capacity = usize::try_from((*inner_vfs).mxPathname).unwrap_or(0) + 1;
        let mut out = vec![0 as c_char; capacity];
        let Ok(n_out) = c_int::try_from(capacity) else {
            return false;
        };
        full(inner_vfs, name, n_out, out.as_mut_ptr()) == ffi::SQLITE_OK_SYMLINK
    }
}

/// Whether `path` names a symlink (not following it). A path that cannot
/// be examined counts as one, so the inner VFS decides (and reports).
fn is_symlink(path: &CStr) -> bool {
    // SAFETY: `lstat` with a NUL-terminated path and a zeroed buffer it
    // fills.
    unsafe {
        let mut stat: libc::stat = std::mem::zeroed();
        if libc::lstat(path.as_ptr(), &mut stat) != 0 {
            return std::io::Error::last_os_error().raw_os_error() != Some(libc::ENOENT);
        }
        stat.st_mode & libc::S_IFMT == libc::S_IFLNK
    }
}

/// The shared state of the database file open on `fd` (the handle `id`'s
/// descriptor), made by its first connection, which locks other processes
/// out on that descriptor.
fn attach(id: usize, fd: RawFd, read_only: bool) -> Result<(Key, Arc<Node>), c_int> {
    if fd < 0 {
        // The inner open returned a descriptor `open_noting` did not see.
        return Err(ffi::SQLITE_CANTOPEN);
    }
    let key = key_of(fd)?;
    let mut nodes = registry();
    let opened = Opened { id, fd, read_only };
    if let Some(entry) = nodes.get_mut(&key) {
        entry.handles.push(opened);
        return Ok((key, entry.node.clone()));
    }
    match lock_fd(fd, read_only) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Err(ffi::SQLITE_BUSY),
        Err(_) => return Err(ffi::SQLITE_IOERR_LOCK),
    }
    let node = Arc::new(Node {
        locks: Mutex::new(FileLocks::default()),
        shm: Mutex::new(Shm::default()),
    });
    nodes.insert(
        key,
        Entry {
            node: node.clone(),
            handles: vec![opened],
            guard: Guard::Handle(id),
        },
    );
    Ok((key, node))
}

/// The device and inode of the file open on `fd`.
fn key_of(fd: RawFd) -> Result<Key, c_int> {
    // SAFETY: `fstat` of an open descriptor into a zeroed `stat`.
    unsafe {
        let mut stat: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut stat) != 0 {
            return Err(ffi::SQLITE_IOERR_FSTAT);
        }
        Ok((stat.st_dev, stat.st_ino))
    }
}

/// Locks SQLite's lock bytes on `fd` for this open file description: a
/// write lock, or a read lock when the descriptor is read-only (which
/// still keeps other writers out).
fn lock_fd(fd: RawFd, read_only: bool) -> std::io::Result<()> {
    if !read_only {
        match lock_bytes(fd, libc::F_WRLCK) {
            Err(e) if e.raw_os_error() == Some(libc::EBADF) => {}
            other => return other,
        }
    }
    lock_bytes(fd, libc::F_RDLCK)
}

/// Takes an open-file-description lock of `kind` on SQLite's lock bytes
/// of the file open on `fd`, without waiting: an error of kind `WouldBlock` when another
/// open file description (of this process or another) holds a conflicting
/// one.
fn lock_bytes(fd: RawFd, kind: c_int) -> std::io::Result<()> {
    // SAFETY: a plain `fcntl` on a descriptor we own, with a zeroed
    // `flock` filled in.
    let rc = unsafe {
        let mut lock: libc::flock = std::mem::zeroed();
        lock.l_type = kind as libc::c_short;
        lock.l_whence = libc::SEEK_SET as libc::c_short;
        lock.l_start = LOCK_BYTES.0;
        lock.l_len = LOCK_BYTES.1;
        libc::fcntl(fd, libc::F_OFD_SETLK, &lock)
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
    lock_bytes(file.as_raw_fd(), libc::F_WRLCK)?;
    Ok(Some(file))
}

/// Sets `conn`'s lookaside memory (SQLite's per-connection pool of small
/// allocations) to `slots` slots of `slot_bytes` each; 0 slots turns it
/// off. SQLite allocates the pool at once and writes every slot's link, so
/// each connection holds all of it in resident memory whether it uses it
/// or not (its default here, 40 slots of 1,200 bytes, is 48,000 bytes).
/// Call it before the connection runs a
/// statement; an error when lookaside memory is in use.
pub fn set_lookaside(
    conn: &rusqlite::Connection,
    slot_bytes: u16,
    slots: u16,
) -> Result<(), rusqlite::Error> {
    // SAFETY: the connection's handle, live for the borrow, with the
    // documented arguments of SQLITE_DBCONFIG_LOOKASIDE (a null buffer:
    // SQLite allocates the pool).
    let rc = unsafe {
        ffi::sqlite3_db_config(
            conn.handle(),
            ffi::SQLITE_DBCONFIG_LOOKASIDE,
            ptr::null_mut::<c_void>(),
            c_int::from(slot_bytes),
            c_int::from(slots),
        )
    };
    if rc == ffi::SQLITE_OK {
        Ok(())
    } else {
        Err(rusqlite::Error::SqliteFailure(ffi::Error::new(rc), None))
    }
}

/// SQLite's own open handle of a connection's write-ahead log, to read the
/// frames a commit just wrote without opening the file again: the engine
/// reads them after every group, and an open, a stat and a close of the
/// `-wal` by its path each time were about 2% of a streams node's CPU.
///
/// It borrows the connection mutably, so no statement runs (and nothing
/// closes the WAL, which only a statement can) while it is held.
pub struct WalFile<'c> {
    file: *mut ffi::sqlite3_file,
    _connection: std::marker::PhantomData<&'c mut rusqlite::Connection>,
}

impl std::fmt::Debug for WalFile<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WalFile").finish_non_exhaustive()
    }
}

/// The WAL `conn` has open for its main database, or `None` when it has
/// none open (no transaction has run yet). For a connection in WAL mode
/// only: outside it SQLite answers with its rollback journal's handle.
pub fn wal_file(conn: &mut rusqlite::Connection) -> Result<Option<WalFile<'_>>, rusqlite::Error> {
    let mut file: *mut ffi::sqlite3_file = ptr::null_mut();
    // SAFETY: the connection's handle, live for the borrow;
    // SQLITE_FCNTL_JOURNAL_POINTER writes one `sqlite3_file` pointer (the
    // pager's WAL file in WAL mode) to the argument.
    let rc = unsafe {
        ffi::sqlite3_file_control(
            conn.handle(),
            c"main".as_ptr(),
            ffi::SQLITE_FCNTL_JOURNAL_POINTER,
            (&raw mut file).cast::<c_void>(),
        )
    };
    if rc != ffi::SQLITE_OK {
        return Err(rusqlite::Error::SqliteFailure(ffi::Error::new(rc), None));
    }
    // SAFETY: a non-null pointer is the pager's file object, live while
    // the connection keeps its WAL open; a null `pMethods` means closed.
    if file.is_null() || unsafe { (*file).pMethods.is_null() } {
        return Ok(None);
    }
    Ok(Some(WalFile {
        file,
        _connection: std::marker::PhantomData,
    }))
}

impl WalFile<'_> {
    /// The WAL's length in bytes.
    pub fn len(&self) -> std::io::Result<u64> {
        let mut size: ffi::sqlite3_int64 = 0;
        // SAFETY: `file` is open while `self` borrows its connection
        // (see `wal_file`); xFileSize writes one integer.
        let rc = unsafe {
            match (*(*self.file).pMethods).xFileSize {
                Some(file_size) => file_size(self.file, &raw mut size),
                None => ffi::SQLITE_IOERR_FSTAT,
            }
        };
        if rc != ffi::SQLITE_OK {
            return Err(io_error(rc, "size"));
        }
        u64::try_from(size).map_err(|_| std::io::Error::other("the WAL reports a negative size"))
    }

    /// Whether the WAL is empty.
    pub fn is_empty(&self) -> std::io::Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Fills `buf` from the WAL's byte `offset`; `UnexpectedEof` when the
    /// WAL ends first.
    pub fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        if buf.is_empty() {
            // SQLite's read methods expect at least one byte.
            return Ok(());
        }
        let (Ok(amount), Ok(offset)) = (c_int::try_from(buf.len()), i64::try_from(offset)) else {
            return Err(std::io::Error::other("a WAL read past 2 GiB in one call"));
        };
        // SAFETY: as in `len`; xRead writes at most `amount` bytes to `buf`.
        let rc = unsafe {
            match (*(*self.file).pMethods).xRead {
                Some(read) => read(self.file, buf.as_mut_ptr().cast::<c_void>(), amount, offset),
                None => ffi::SQLITE_IOERR_READ,
            }
        };
        match rc {
            ffi::SQLITE_OK => Ok(()),
            ffi::SQLITE_IOERR_SHORT_READ => Err(std::io::ErrorKind::UnexpectedEof.into()),
            rc => Err(io_error(rc, "read")),
        }
    }
}

/// An I/O error from SQLite's result code `rc` for a WAL `what`.
fn io_error(rc: c_int, what: &str) -> std::io::Error {
    std::io::Error::other(format!(
        "the WAL {what} failed: {} (SQLite code {rc})",
        ffi::Error::new(rc)
    ))
}

/// Closes `h`'s inner file and drops its part of the file's shared state:
/// its locks, its mapping of the WAL index, its descriptor's hold on the
/// lock against other processes, and (the last connection) the state
/// itself. Returns the inner close's code.
fn close_and_detach(h: &mut Handle, close: impl FnOnce() -> c_int) -> c_int {
    let Some(node) = h.node.take() else {
        return close();
    };
    if h.level != locks::NONE {
        h.level = lock(&node.locks).unlock(h.level, locks::NONE);
    }
    unmap(h, &node);
    let id = h as *mut Handle as usize;
    let mut nodes = registry();
    let Some(entry) = nodes.get_mut(&h.key) else {
        return close();
    };
    entry.handles.retain(|opened| opened.id != id);
    if entry.handles.is_empty() {
        // Closing the last descriptor drops the lock while the registry
        // is locked, so a new first connection never meets it.
        let rc = close();
        nodes.remove(&h.key);
        return rc;
    }
    if matches!(entry.guard, Guard::Handle(holder) if holder == id) {
        entry.guard = duplicate(h.fd).map_or(Guard::Lost, Guard::Own);
    }
    let rc = close();
    if matches!(entry.guard, Guard::Lost) {
        // No duplicate: take the lock again on another connection's
        // descriptor. Between the close and this, another process could
        // have taken the bytes; then the file stays without the lock.
        let other = entry.handles[0];
        if lock_fd(other.fd, other.read_only).is_ok() {
            entry.guard = Guard::Handle(other.id);
        }
    }
    rc
}

/// A new descriptor of `fd`'s open file description (close-on-exec).
fn duplicate(fd: RawFd) -> Option<std::fs::File> {
    // SAFETY: `fcntl(F_DUPFD_CLOEXEC)` of an open descriptor; the new
    // descriptor is ours alone.
    unsafe {
        let new = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0);
        (new >= 0).then(|| std::fs::File::from_raw_fd(new))
    }
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
        let written = write_held(h);
        let inner = h.inner;
        (*file).pMethods = ptr::null();
        let closed = close_and_detach(h, || match inner_methods(inner).xClose {
            Some(close) => close(inner),
            None => ffi::SQLITE_OK,
        });
        if written != ffi::SQLITE_OK {
            written
        } else {
            closed
        }
    }
}

/// The inner file's write of `amount` bytes from `buf` at `offset`.
///
/// # Safety
/// `h` is an open file's handle; `buf` holds `amount` bytes.
unsafe fn inner_write(h: &Handle, buf: *const c_void, amount: c_int, offset: i64) -> c_int {
    // SAFETY: per the function's contract.
    unsafe {
        match inner_methods(h.inner).xWrite {
            Some(write) => write(h.inner, buf, amount, offset),
            None => ffi::SQLITE_IOERR_WRITE,
        }
    }
}

/// Writes out what `h` holds back (nothing for files other than WALs).
/// The held bytes are dropped whatever the write answers: SQLite treats a
/// failed WAL write as the end of its transaction.
///
/// # Safety
/// `h` is an open file's handle.
unsafe fn write_held(h: &mut Handle) -> c_int {
    if h.held_len == 0 {
        return ffi::SQLITE_OK;
    }
    let amount = h.held_len as c_int; // at most HOLD_BYTES_MAX
    h.held_len = 0;
    // SAFETY: per the function's contract; `held` holds `amount` bytes.
    unsafe { inner_write(h, h.held.as_ptr().cast::<c_void>(), amount, h.held_at) }
}

/// Writes `amount` bytes at `offset`. A WAL handle holds a write of at most
/// [`HOLD_BYTES_MAX`] bytes back and sends it with the next write when
/// that one follows it in the file, so each WAL frame (SQLite writes its
/// 24-byte header, then its page) is one system call, not two. Every
/// other method of the file writes the held bytes out first.
///
/// Why this is safe: SQLite's last WAL write of a transaction is a page,
/// which sends everything held, before it publishes the new frames in
/// the WAL index; other connections then read only pages (not frame
/// headers) from the WAL, through their own files; and reading a WAL's
/// headers (recovery, a checkpoint, [`WalFile`]) goes through a file's
/// read method, which writes held bytes out first.
unsafe extern "C" fn x_write(
    file: *mut ffi::sqlite3_file,
    buf: *const c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: `file` is open (SQLite's contract), so its inner file is
    // too; `buf` holds `amount` bytes.
    unsafe {
        let h = handle(file);
        if !h.wal {
            return inner_write(h, buf, amount, offset);
        }
        let Ok(len) = usize::try_from(amount) else {
            return ffi::SQLITE_IOERR_WRITE;
        };
        let bytes = std::slice::from_raw_parts(buf.cast::<u8>(), len);
        if h.held_len > 0 {
            let held_end = h.held_at.saturating_add(h.held_len as i64);
            if offset == held_end {
                let joined_len = h.held_len + len;
                if joined_len <= HOLD_BYTES_MAX {
                    h.held[h.held_len..joined_len].copy_from_slice(bytes);
                    h.held_len = joined_len;
                    return ffi::SQLITE_OK;
                }
                // The held header and the page, one write from one buffer.
                let mut joined = Vec::with_capacity(joined_len);
                joined.extend_from_slice(&h.held[..h.held_len]);
                joined.extend_from_slice(bytes);
                h.held_len = 0;
                let Ok(joined_amount) = c_int::try_from(joined_len) else {
                    return ffi::SQLITE_IOERR_WRITE;
                };
                return inner_write(
                    h,
                    joined.as_ptr().cast::<c_void>(),
                    joined_amount,
                    h.held_at,
                );
            }
            let rc = write_held(h);
            if rc != ffi::SQLITE_OK {
                return rc;
            }
        }
        if len <= HOLD_BYTES_MAX {
            h.held[..len].copy_from_slice(bytes);
            h.held_len = len;
            h.held_at = offset;
            return ffi::SQLITE_OK;
        }
        inner_write(h, buf, amount, offset)
    }
}

/// A method that only asks the inner file (no I/O).
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

/// A method that reads, sizes, syncs or changes the file: the bytes a WAL
/// handle holds back (see [`x_write`]) go out first.
macro_rules! forward_after_held {
    ($name:ident, $method:ident, ($($arg:ident: $ty:ty),*), $missing:expr) => {
        unsafe extern "C" fn $name(file: *mut ffi::sqlite3_file $(, $arg: $ty)*) -> c_int {
            // SAFETY: `file` is open (SQLite's contract), so its inner
            // file is too.
            unsafe {
                let h = handle(file);
                let written = write_held(h);
                if written != ffi::SQLITE_OK {
                    return written;
                }
                match inner_methods(h.inner).$method {
                    Some(method) => method(h.inner $(, $arg)*),
                    None => $missing,
                }
            }
        }
    };
}

forward_after_held!(x_read, xRead, (buf: *mut c_void, amount: c_int, offset: ffi::sqlite3_int64), ffi::SQLITE_IOERR_READ);
forward_after_held!(x_truncate, xTruncate, (size: ffi::sqlite3_int64), ffi::SQLITE_IOERR_TRUNCATE);
forward_after_held!(x_sync, xSync, (flags: c_int), ffi::SQLITE_IOERR_FSYNC);
forward_after_held!(x_file_size, xFileSize, (size: *mut ffi::sqlite3_int64), ffi::SQLITE_IOERR_FSTAT);
forward_after_held!(x_file_control, xFileControl, (op: c_int, arg: *mut c_void), ffi::SQLITE_NOTFOUND);
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
    fn only_absolute_paths_without_dot_or_empty_components_are_plain() {
        let cases: [(&[u8], bool); 14] = [
            (b"/var/lib/cellfleet/n1/cells/ab.db", true),
            (b"/a", true),
            (b"/a.db-wal", true),
            (b"/.hidden/..dots../x", true),
            (b"", false),
            (b"/", false),
            (b"a/b.db", false),
            (b"./b.db", false),
            (b"/a//b.db", false),
            (b"/a/./b.db", false),
            (b"/a/../b.db", false),
            (b"/a/b.db/", false),
            (b"/a/.", false),
            (b"/a/..", false),
        ];
        for (path, plain) in cases {
            assert_eq!(
                is_plain_absolute(path),
                plain,
                "{:?}",
                String::from_utf8_lossy(path)
            );
        }
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
