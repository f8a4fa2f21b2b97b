//! File operations relative to an open directory that never follow a
//! symbolic link: both trees are attacker-shaped (the parent unit and the
//! child unit may be running while box forks or merges), so a path is never
//! resolved by name from `/`. A path below a root is opened with `openat2`
//! (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`), or component by component with
//! `O_NOFOLLOW` where the kernel lacks it; a directory is read through its
//! descriptor and its entries are stat'ed with `AT_SYMLINK_NOFOLLOW`.
//!
//! Contents are copied by reflink (`FICLONE`) where the filesystem shares
//! blocks, else by `copy_file_range`, else read and write; a copy that must
//! also be hashed reads the data once (read, hash, write) unless it was
//! reflinked.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};
use nix::sys::time::TimeSpec;
use nix::unistd::{Gid, Uid};
use sha2::{Digest, Sha256};

use crate::manifest::ContentHash;

/// What an entry is, from `lstat`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FileType {
    File,
    Dir,
    Symlink,
    Other,
}

/// The part of `lstat` the fork and the merge use.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Stat {
    pub file_type: FileType,
    /// Permission bits (`0o7777`).
    pub mode: u32,
    pub size: u64,
    pub ino: u64,
    pub atime: (i64, i64),
    pub mtime: (i64, i64),
    pub ctime: (i64, i64),
}

impl Stat {
    pub fn from_raw(raw: &FileStat) -> Self {
        let kind = SFlag::from_bits_truncate(raw.st_mode & SFlag::S_IFMT.bits());
        let file_type = if kind == SFlag::S_IFREG {
            FileType::File
        } else if kind == SFlag::S_IFDIR {
            FileType::Dir
        } else if kind == SFlag::S_IFLNK {
            FileType::Symlink
        } else {
            FileType::Other
        };
        Self {
            file_type,
            mode: raw.st_mode & 0o7777,
            size: u64::try_from(raw.st_size).unwrap_or(0),
            ino: raw.st_ino,
            atime: (raw.st_atime, raw.st_atime_nsec),
            mtime: (raw.st_mtime, raw.st_mtime_nsec),
            ctime: (raw.st_ctime, raw.st_ctime_nsec),
        }
    }

    pub fn is_executable(&self) -> bool {
        self.mode & 0o111 != 0
    }
}

/// Nanoseconds since the epoch.
pub(crate) fn nanos((seconds, nanoseconds): (i64, i64)) -> i64 {
    seconds
        .saturating_mul(1_000_000_000)
        .saturating_add(nanoseconds)
}

/// `lstat` of `name` in `dir`.
pub(crate) fn lstat_at(dir: BorrowedFd<'_>, name: &[u8]) -> nix::Result<Stat> {
    nix::sys::stat::fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW).map(|raw| Stat::from_raw(&raw))
}

/// `fstat`.
pub(crate) fn fstat(fd: BorrowedFd<'_>) -> nix::Result<Stat> {
    nix::sys::stat::fstat(fd).map(|raw| Stat::from_raw(&raw))
}

/// Open the directory at `path` (a path the caller chose, so it is resolved
/// normally).
pub(crate) fn open_root(path: &Path) -> nix::Result<OwnedFd> {
    nix::fcntl::open(
        path,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

/// Set when `openat2` is missing (or refused by a seccomp filter), so every
/// later open walks component by component.
static NO_OPENAT2: AtomicBool = AtomicBool::new(false);

/// `a/b/c` → (`Some(a/b)`, `c`).
pub(crate) fn split_last(path: &[u8]) -> (Option<&[u8]>, &[u8]) {
    match path.iter().rposition(|byte| *byte == b'/') {
        Some(slash) => (Some(&path[..slash]), &path[slash + 1..]),
        None => (None, path),
    }
}

/// Open `rel` (relative, `/`-separated, checked by the caller) below `root`
/// with `flags`, refusing any symbolic link on the way or at the end
/// (`ELOOP`, or `EXDEV`/`ENOTDIR` for an escape).
pub(crate) fn open_beneath(
    root: BorrowedFd<'_>,
    rel: &[u8],
    flags: OFlag,
    mode: Mode,
) -> nix::Result<OwnedFd> {
    let flags = flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW;
    if !NO_OPENAT2.load(Ordering::Relaxed) {
        let mut how = OpenHow::new().flags(flags).resolve(
            ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_MAGICLINKS,
        );
        if flags.intersects(OFlag::O_CREAT | OFlag::O_TMPFILE) {
            how = how.mode(mode);
        }
        match nix::fcntl::openat2(root, rel, how) {
            Err(Errno::ENOSYS | Errno::EPERM) => NO_OPENAT2.store(true, Ordering::Relaxed),
            // RESOLVE_NO_SYMLINKS may be retried by the kernel on a rename race.
            Err(Errno::EAGAIN) => {}
            other => return other,
        }
    }
    let (dir, name) = split_last(rel);
    match dir {
        None => nix::fcntl::openat(root, name, flags, mode),
        Some(dir) => {
            let dir = open_path_dir_beneath(root, dir)?;
            nix::fcntl::openat(&dir, name, flags, mode)
        }
    }
}

/// Walk `rel` one component at a time with `O_NOFOLLOW`, for kernels without
/// `openat2`.
fn open_path_dir_beneath(root: BorrowedFd<'_>, rel: &[u8]) -> nix::Result<OwnedFd> {
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut current: Option<OwnedFd> = None;
    for component in rel.split(|byte| *byte == b'/') {
        let next = match &current {
            None => nix::fcntl::openat(root, component, flags, Mode::empty())?,
            Some(dir) => nix::fcntl::openat(dir, component, flags, Mode::empty())?,
        };
        current = Some(next);
    }
    match current {
        Some(dir) => Ok(dir),
        None => Err(Errno::EINVAL),
    }
}

/// Open the directory `rel` below `root` for reading (`None`: `root` itself).
pub(crate) fn open_dir_beneath(root: BorrowedFd<'_>, rel: Option<&[u8]>) -> nix::Result<OwnedFd> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY;
    match rel {
        None => nix::fcntl::openat(root, ".", flags | OFlag::O_CLOEXEC, Mode::empty()),
        Some(rel) => open_beneath(root, rel, flags, Mode::empty()),
    }
}

/// Whether an error from [`open_beneath`] means the path runs through a
/// symbolic link or a non-directory.
pub(crate) fn is_link_refusal(errno: Errno) -> bool {
    matches!(errno, Errno::ELOOP | Errno::EXDEV | Errno::ENOTDIR)
}

/// One directory entry's name and, when the filesystem reports it, type.
pub(crate) struct DirEntry {
    pub name: Vec<u8>,
    pub file_type: Option<FileType>,
}

/// The entries of the directory `dir` (without `.` and `..`), consuming it;
/// returns a descriptor for the same directory for `*at` calls.
pub(crate) fn read_dir(dir: OwnedFd) -> nix::Result<(Vec<DirEntry>, OwnedFd)> {
    let again = nix::unistd::dup(&dir)?;
    let mut stream = nix::dir::Dir::from_fd(dir)?;
    let mut entries = Vec::new();
    for entry in stream.iter() {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        let file_type = entry.file_type().map(|kind| match kind {
            nix::dir::Type::File => FileType::File,
            nix::dir::Type::Directory => FileType::Dir,
            nix::dir::Type::Symlink => FileType::Symlink,
            _ => FileType::Other,
        });
        entries.push(DirEntry {
            name: name.to_vec(),
            file_type,
        });
    }
    Ok((entries, again))
}

/// Open `name` in `dir` for reading if it is a regular file (`None` when it
/// is anything else): stat'ed first so no device or FIFO is ever opened,
/// then opened as [`open_checked_at`] does.
pub(crate) fn open_regular_at(
    dir: BorrowedFd<'_>,
    name: &[u8],
) -> nix::Result<Option<(File, Stat)>> {
    if lstat_at(dir, name)?.file_type != FileType::File {
        return Ok(None);
    }
    open_checked_at(dir, name)
}

/// Open `name` in `dir`, which an `lstat` just showed to be a regular file,
/// for reading: without following a link and without blocking (in case a
/// FIFO was swapped in since), then checked again (`None`: not regular now).
pub(crate) fn open_checked_at(
    dir: BorrowedFd<'_>,
    name: &[u8],
) -> nix::Result<Option<(File, Stat)>> {
    let fd = nix::fcntl::openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let stat = fstat(fd.as_fd())?;
    if stat.file_type != FileType::File {
        return Ok(None);
    }
    Ok(Some((File::from(fd), stat)))
}

/// Open the directory holding `rel` below `root` (without reading rights:
/// for `*at` calls) and return it with `rel`'s last component.
pub(crate) fn open_parent_beneath<'a>(
    root: BorrowedFd<'_>,
    rel: &'a [u8],
) -> nix::Result<(OwnedFd, &'a [u8])> {
    let (dir, name) = split_last(rel);
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY;
    let dir = match dir {
        None => nix::fcntl::openat(root, ".", flags | OFlag::O_CLOEXEC, Mode::empty())?,
        Some(dir) => open_beneath(root, dir, flags, Mode::empty())?,
    };
    Ok((dir, name))
}

/// Like [`open_regular_at`] for a path below `root`.
pub(crate) fn open_regular_beneath(
    root: BorrowedFd<'_>,
    rel: &[u8],
) -> nix::Result<Option<(File, Stat)>> {
    let (dir, name) = open_parent_beneath(root, rel)?;
    open_regular_at(dir.as_fd(), name)
}

/// Create `name` in `dir`, which must not exist, for writing (and reading
/// back, to hash a reflinked copy).
pub(crate) fn create_at(dir: BorrowedFd<'_>, name: &[u8]) -> nix::Result<File> {
    nix::fcntl::openat(
        dir,
        name,
        OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )
    .map(File::from)
}

/// The owner to give what is made in `dir`: `dir`'s, when this process is
/// root and that is another user (a root host merging into a user's
/// checkout leaves that user's files, not root's); `None` otherwise (not
/// root, what this process makes is already the checkout owner's).
pub(crate) fn owner_for(dir: BorrowedFd<'_>) -> nix::Result<Option<(Uid, Gid)>> {
    let me = nix::unistd::geteuid();
    if !me.is_root() {
        return Ok(None);
    }
    let dir = nix::sys::stat::fstat(dir)?;
    let owner = (Uid::from_raw(dir.st_uid), Gid::from_raw(dir.st_gid));
    Ok((owner != (me, nix::unistd::getegid())).then_some(owner))
}

/// [`owner_for`] `dir` given to `name` in it (not following a link).
pub(crate) fn own_like_dir(dir: BorrowedFd<'_>, name: &[u8]) -> nix::Result<()> {
    match owner_for(dir)? {
        Some((uid, gid)) => nix::unistd::fchownat(
            dir,
            name,
            Some(uid),
            Some(gid),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        ),
        None => Ok(()),
    }
}

/// Set the permission bits and the access and modification times of `file`.
pub(crate) fn set_mode_and_times(
    file: BorrowedFd<'_>,
    mode: u32,
    stat: Option<&Stat>,
) -> nix::Result<()> {
    nix::sys::stat::fchmod(file, Mode::from_bits_truncate(mode))?;
    if let Some(stat) = stat {
        nix::sys::stat::futimens(
            file,
            &TimeSpec::new(stat.atime.0, stat.atime.1),
            &TimeSpec::new(stat.mtime.0, stat.mtime.1),
        )?;
    }
    Ok(())
}

/// The realtime coarse clock, which stamps file times, in nanoseconds.
pub(crate) fn coarse_now() -> i64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_REALTIME_COARSE) {
        Ok(now) => nanos((now.tv_sec(), now.tv_nsec())),
        Err(_) => i64::MAX,
    }
}

/// `_IOW(0x94, 9, int)`: clone `src`'s blocks into `dst` (linux/fs.h).
const FICLONE: libc::c_ulong = 0x4004_9409;

/// How contents were copied, as bits in [`Copier::used`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CopyMethod {
    Reflink = 1,
    CopyFileRange = 2,
    ReadWrite = 4,
}

/// Copies file contents the cheapest way the filesystem allows, learning
/// once which ways it does not.
#[derive(Default)]
pub(crate) struct Copier {
    no_reflink: AtomicBool,
    no_copy_file_range: AtomicBool,
    used: AtomicU8,
}

/// Read and write in chunks of this size.
const CHUNK: usize = 256 * 1024;

impl Copier {
    /// Copy all of `src` into the empty `dst` (opened read-write when
    /// `want_hash`), returning the SHA-256 of what was written when asked.
    pub fn copy(
        &self,
        src: &File,
        dst: &File,
        want_hash: bool,
        buffer: &mut Vec<u8>,
    ) -> io::Result<Option<ContentHash>> {
        if !self.no_reflink.load(Ordering::Relaxed) {
            // SAFETY: FICLONE takes the source descriptor as its integer
            // argument; both descriptors are open for the duration of the call.
            let result = unsafe { libc::ioctl(dst.as_raw_fd(), FICLONE, src.as_raw_fd()) };
            if result == 0 {
                self.used
                    .fetch_or(CopyMethod::Reflink as u8, Ordering::Relaxed);
                return if want_hash {
                    hash_file(dst, buffer).map(|(hash, _)| Some(hash))
                } else {
                    Ok(None)
                };
            }
            match Errno::last() {
                Errno::EOPNOTSUPP
                | Errno::ENOTTY
                | Errno::EINVAL
                | Errno::EXDEV
                | Errno::ENOSYS
                | Errno::EPERM => {
                    self.no_reflink.store(true, Ordering::Relaxed);
                }
                errno => return Err(errno.into()),
            }
        }
        if !want_hash && !self.no_copy_file_range.load(Ordering::Relaxed) {
            match copy_range(src, dst) {
                Ok(()) => {
                    self.used
                        .fetch_or(CopyMethod::CopyFileRange as u8, Ordering::Relaxed);
                    return Ok(None);
                }
                Err(
                    Errno::EXDEV | Errno::EOPNOTSUPP | Errno::ENOSYS | Errno::EINVAL | Errno::EPERM,
                ) => {
                    self.no_copy_file_range.store(true, Ordering::Relaxed);
                    // Nothing was written: copy_range fails on its first call.
                }
                Err(errno) => return Err(errno.into()),
            }
        }
        self.used
            .fetch_or(CopyMethod::ReadWrite as u8, Ordering::Relaxed);
        read_write(src, dst, want_hash, buffer)
    }

    /// The methods used so far.
    pub fn used(&self) -> Vec<CopyMethod> {
        let bits = self.used.load(Ordering::Relaxed);
        [
            CopyMethod::Reflink,
            CopyMethod::CopyFileRange,
            CopyMethod::ReadWrite,
        ]
        .into_iter()
        .filter(|method| bits & (*method as u8) != 0)
        .collect()
    }
}

/// `copy_file_range` until the source's end; an error on the first call
/// means nothing was written.
fn copy_range(src: &File, dst: &File) -> nix::Result<()> {
    loop {
        match nix::fcntl::copy_file_range(src, None, dst, None, 1 << 30) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(Errno::EINTR) => {}
            Err(errno) => return Err(errno),
        }
    }
}

fn read_write(
    mut src: &File,
    mut dst: &File,
    want_hash: bool,
    buffer: &mut Vec<u8>,
) -> io::Result<Option<ContentHash>> {
    buffer.resize(CHUNK, 0);
    let mut hasher = want_hash.then(Sha256::new);
    loop {
        let read = match src.read(buffer) {
            Ok(0) => break,
            Ok(read) => read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        };
        if let Some(hasher) = &mut hasher {
            hasher.update(&buffer[..read]);
        }
        dst.write_all(&buffer[..read])?;
    }
    Ok(hasher.map(|hasher| ContentHash(hasher.finalize().into())))
}

/// The SHA-256 and length of everything in `file`, read from offset 0.
pub(crate) fn hash_file(file: &File, buffer: &mut Vec<u8>) -> io::Result<(ContentHash, u64)> {
    hash_file_up_to(file, u64::MAX, buffer)
}

/// Like [`hash_file`], but stop after `length` bytes, saving the read that
/// would find the end: for a file nobody else writes, whose length is known.
pub(crate) fn hash_file_up_to(
    file: &File,
    length: u64,
    buffer: &mut Vec<u8>,
) -> io::Result<(ContentHash, u64)> {
    buffer.resize(CHUNK, 0);
    let mut hasher = Sha256::new();
    let mut offset = 0u64;
    while offset < length {
        let want = usize::try_from((length - offset).min(CHUNK as u64)).unwrap_or(CHUNK);
        let read = match file.read_at(&mut buffer[..want], offset) {
            Ok(0) => break,
            Ok(read) => read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        };
        hasher.update(&buffer[..read]);
        offset += read as u64;
    }
    Ok((ContentHash(hasher.finalize().into()), offset))
}

/// Read at most `limit` bytes of the regular file `name` in `dir` (for
/// `.gitignore` and friends); `None` when it is absent, a link or not regular.
pub(crate) fn read_small_at(dir: BorrowedFd<'_>, name: &[u8], limit: u64) -> Option<Vec<u8>> {
    let (file, _) = open_regular_at(dir, name).ok()??;
    let mut bytes = Vec::new();
    file.take(limit).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}
