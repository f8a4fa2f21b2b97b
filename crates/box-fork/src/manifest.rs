//! The fork's base: what the child's tree held when it was made, so a merge
//! can tell what the child changed and what the parent changed since,
//! without git.
//!
//! One [`Entry`] per regular file and symbolic link below the child's root
//! (nothing inside a `.git`): kind, permission bits, size, SHA-256 of the
//! contents, link target, whether git tracked it, and the child's `lstat`
//! identity (inode, mtime, ctime). A merge trusts an unchanged `lstat` and
//! hashes the rest: a change always moves ctime, and the fork waits until the
//! filesystem clock has passed the newest ctime it recorded
//! ([`settle`]), so a write after the fork cannot share a recorded ctime.

use std::collections::HashSet;
use std::fmt;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{Error, io_error};
use crate::relpath::{self, RelPath, is_git_name};
use crate::sys::{self, FileType, Stat};
use crate::walk;

/// A SHA-256 of a file's contents.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ContentHash(pub [u8; 32]);

impl fmt::Debug for ContentHash {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.0 {
            write!(formatter, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl Serialize for ContentHash {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&format_args!("{self:?}"))
    }
}

impl<'de> Deserialize<'de> for ContentHash {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        let bad =
            || serde::de::Error::custom(format!("content hash {text:?} is not 64 hex digits"));
        if text.len() != 64 {
            return Err(bad());
        }
        let mut hash = [0u8; 32];
        for (index, byte) in hash.iter_mut().enumerate() {
            *byte = u8::from_str_radix(text.get(2 * index..2 * index + 2).ok_or_else(bad)?, 16)
                .map_err(|_| bad())?;
        }
        Ok(Self(hash))
    }
}

/// How the child was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mechanism {
    /// HEAD checked out into a repository of the child's own that borrows
    /// the parent's objects.
    Worktree,
    /// A full copy of the parent's tree.
    Copy,
}

/// What an entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Kind {
    File,
    Symlink,
}

/// One file or link of the child at fork time.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Entry {
    pub path: RelPath,
    pub kind: Kind,
    pub mode: u32,
    pub size: u64,
    /// The contents' hash; `None` for links and for files not hashed at fork
    /// (ignored, untracked files of a copy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<ContentHash>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "serialize_target",
        deserialize_with = "deserialize_target"
    )]
    pub target: Option<Vec<u8>>,
    /// In git's index at fork time (worktree mode): merged even if ignored.
    #[serde(default)]
    pub tracked: bool,
    pub ino: u64,
    pub mtime: i64,
    pub ctime: i64,
}

fn serialize_target<S: Serializer>(
    target: &Option<Vec<u8>>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match target {
        Some(bytes) => relpath::serialize_bytes(bytes, serializer),
        None => serializer.serialize_none(),
    }
}

fn deserialize_target<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Vec<u8>>, D::Error> {
    relpath::deserialize_bytes(deserializer).map(Some)
}

impl Entry {
    /// An entry for the file or link `path` with `stat`.
    pub fn new(
        path: RelPath,
        stat: &Stat,
        hash: Option<ContentHash>,
        target: Option<Vec<u8>>,
    ) -> Self {
        Self {
            path,
            kind: if stat.file_type == FileType::Symlink {
                Kind::Symlink
            } else {
                Kind::File
            },
            mode: stat.mode,
            size: stat.size,
            hash,
            target,
            tracked: false,
            ino: stat.ino,
            mtime: sys::nanos(stat.mtime),
            ctime: sys::nanos(stat.ctime),
        }
    }

    /// Whether `stat` shows the file untouched since this entry was taken,
    /// given the base's settle time.
    pub fn is_stat_clean(&self, stat: &Stat, settled: i64) -> bool {
        self.ctime < settled
            && self.kind == Kind::File
            && stat.file_type == FileType::File
            && stat.ino == self.ino
            && stat.size == self.size
            && sys::nanos(stat.mtime) == self.mtime
            && sys::nanos(stat.ctime) == self.ctime
            && stat.is_executable() == self.is_executable()
    }

    pub fn is_executable(&self) -> bool {
        self.mode & 0o111 != 0
    }
}

/// The pin that keeps the fork's base commit reachable in the parent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Pin {
    /// The parent's git directory.
    pub git_dir: PathBuf,
    /// `refs/box/forks/<id>`.
    pub reference: String,
    /// The commit it names.
    pub commit: String,
}

/// The base version this crate writes and reads.
const FORMAT: u32 = 1;

/// What a merge needs to know about a fork: made by [`fork`](crate::fork()),
/// kept by the caller (it serialises with serde, e.g. to JSON), handed to
/// [`merge`](crate::merge()) and [`discard`](crate::discard).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Base {
    format: u32,
    pub(crate) mechanism: Mechanism,
    pub(crate) parent: PathBuf,
    /// The parent directory's device and inode, to notice a replaced parent.
    pub(crate) parent_identity: (u64, u64),
    pub(crate) child: PathBuf,
    pub(crate) writable: bool,
    /// Coarse-clock nanoseconds when the fork ended: every recorded ctime
    /// before this is trustworthy for the `lstat` shortcut.
    pub(crate) settled: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) pin: Option<Pin>,
    /// Sorted by path.
    pub(crate) entries: Vec<Entry>,
}

impl Base {
    pub(crate) fn new(
        mechanism: Mechanism,
        parent: PathBuf,
        parent_identity: (u64, u64),
        child: PathBuf,
        writable: bool,
        mut entries: Vec<Entry>,
    ) -> Self {
        entries.sort_by(|left, right| left.path.cmp(&right.path));
        Self {
            format: FORMAT,
            mechanism,
            parent,
            parent_identity,
            child,
            writable,
            settled: i64::MIN,
            pin: None,
            entries,
        }
    }

    /// Refuse a base this version did not write.
    pub(crate) fn check_format(&self) -> Result<(), Error> {
        if self.format != FORMAT {
            return Err(Error::Base(format!(
                "format {} is not {FORMAT}, the only one this version reads",
                self.format
            )));
        }
        Ok(())
    }

    /// How the child was made.
    pub fn mechanism(&self) -> Mechanism {
        self.mechanism
    }

    /// The parent's canonical path.
    pub fn parent(&self) -> &Path {
        &self.parent
    }

    /// The child's canonical path.
    pub fn child(&self) -> &Path {
        &self.child
    }

    /// The ref that pins the fork's base commit in the parent, if any.
    pub fn pinned_ref(&self) -> Option<&str> {
        self.pin.as_ref().map(|pin| pin.reference.as_str())
    }

    /// The commit the child's HEAD started at (worktree mode).
    pub fn commit(&self) -> Option<&str> {
        self.pin.as_ref().map(|pin| pin.commit.as_str())
    }

    /// How many files and links the base records.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the base records no file.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub(crate) fn entry(&self, path: &RelPath) -> Option<&Entry> {
        self.entries
            .binary_search_by(|entry| entry.path.cmp(path))
            .ok()
            .map(|index| &self.entries[index])
    }
}

/// Wait (at most 50 ms) until the coarse clock, which stamps file times, has
/// passed the newest ctime in `entries`; returns the clock then. A file
/// written after that gets a strictly newer ctime than any recorded one.
pub(crate) fn settle(entries: &[Entry]) -> i64 {
    let newest = entries
        .iter()
        .map(|entry| entry.ctime)
        .max()
        .unwrap_or(i64::MIN);
    let mut now = sys::coarse_now();
    for _ in 0..50 {
        if now > newest {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
        now = sys::coarse_now();
    }
    now
}

/// Record every file and link below `root` (not inside `.git`), hashing the
/// files; with `read_only`, remove write permission from each file and
/// directory first (so the recorded ctime is the final one).
pub(crate) fn record(root: &Path, read_only: bool) -> Result<Vec<Entry>, Error> {
    let root_fd = sys::open_root(root).map_err(|errno| io_error("open", root, errno))?;
    let states = walk::run(
        vec![None::<RelPath>],
        walk::threads(),
        || (Vec::<Entry>::new(), Vec::<u8>::new()),
        |(entries, buffer), dir: Option<RelPath>, more| {
            record_dir(
                root,
                root_fd.as_fd(),
                dir.as_ref(),
                read_only,
                entries,
                buffer,
                more,
            )
        },
    )?;
    Ok(states
        .into_iter()
        .flat_map(|(entries, _)| entries)
        .collect())
}

fn record_dir(
    root: &Path,
    root_fd: BorrowedFd<'_>,
    dir: Option<&RelPath>,
    read_only: bool,
    entries: &mut Vec<Entry>,
    buffer: &mut Vec<u8>,
    more: &mut Vec<Option<RelPath>>,
) -> Result<(), Error> {
    let at = |rel: Option<&RelPath>| match rel {
        Some(rel) => root.join(rel.as_path()),
        None => root.to_path_buf(),
    };
    let fd = sys::open_dir_beneath(root_fd, dir.map(RelPath::as_bytes))
        .map_err(|errno| io_error("open", at(dir), errno))?;
    let (names, fd) = sys::read_dir(fd).map_err(|errno| io_error("read", at(dir), errno))?;
    for name in names {
        if is_git_name(&name.name) {
            continue;
        }
        let path = RelPath::join(dir, &name.name).map_err(|bad| {
            io_error(
                "read",
                at(dir),
                std::io::Error::other(format!(
                    "entry {:?} is {bad}",
                    String::from_utf8_lossy(&name.name)
                )),
            )
        })?;
        let stat = sys::lstat_at(fd.as_fd(), &name.name)
            .map_err(|errno| io_error("stat", at(Some(&path)), errno))?;
        match stat.file_type {
            FileType::Dir => {
                if read_only {
                    make_read_only_dir(fd.as_fd(), &name.name, &stat)
                        .map_err(|errno| io_error("chmod", at(Some(&path)), errno))?;
                }
                more.push(Some(path));
            }
            FileType::File => {
                // The child is the fork's own until it returns: nothing swaps
                // this file, so the walk's `lstat` stands (a link still fails
                // the open).
                let file = nix::fcntl::openat(
                    fd.as_fd(),
                    name.name.as_slice(),
                    nix::fcntl::OFlag::O_RDONLY
                        | nix::fcntl::OFlag::O_NOFOLLOW
                        | nix::fcntl::OFlag::O_NONBLOCK
                        | nix::fcntl::OFlag::O_CLOEXEC,
                    nix::sys::stat::Mode::empty(),
                )
                .map(std::fs::File::from)
                .map_err(|errno| io_error("open", at(Some(&path)), errno))?;
                let mut stat = stat;
                if read_only && stat.mode & 0o222 != 0 {
                    nix::sys::stat::fchmod(
                        &file,
                        nix::sys::stat::Mode::from_bits_truncate(stat.mode & !0o222),
                    )
                    .map_err(|errno| io_error("chmod", at(Some(&path)), errno))?;
                    stat = sys::fstat(file.as_fd())
                        .map_err(|errno| io_error("stat", at(Some(&path)), errno))?;
                }
                let (hash, _) = sys::hash_file_up_to(&file, stat.size, buffer)
                    .map_err(|error| io_error("read", at(Some(&path)), error))?;
                entries.push(Entry::new(path, &stat, Some(hash), None));
            }
            FileType::Symlink => {
                let target = nix::fcntl::readlinkat(fd.as_fd(), name.name.as_slice())
                    .map_err(|errno| io_error("read link", at(Some(&path)), errno))?;
                entries.push(Entry::new(
                    path,
                    &stat,
                    None,
                    Some(target.into_encoded_bytes()),
                ));
            }
            FileType::Other => {}
        }
    }
    Ok(())
}

/// Remove write permission from the directory `name` in `dir`.
pub(crate) fn make_read_only_dir(dir: BorrowedFd<'_>, name: &[u8], stat: &Stat) -> nix::Result<()> {
    if stat.mode & 0o222 == 0 {
        return Ok(());
    }
    let fd = nix::fcntl::openat(
        dir,
        name,
        nix::fcntl::OFlag::O_RDONLY
            | nix::fcntl::OFlag::O_DIRECTORY
            | nix::fcntl::OFlag::O_NOFOLLOW
            | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    nix::sys::stat::fchmod(
        &fd,
        nix::sys::stat::Mode::from_bits_truncate(stat.mode & !0o222),
    )
}

/// Mark the entries whose path is not in `untracked` as tracked.
pub(crate) fn mark_tracked(entries: &mut [Entry], untracked: &HashSet<RelPath>) {
    for entry in entries {
        entry.tracked = !untracked.contains(&entry.path);
    }
}

fn open_subdir(dir: BorrowedFd<'_>, name: &[u8]) -> nix::Result<std::os::fd::OwnedFd> {
    nix::fcntl::openat(
        dir,
        name,
        nix::fcntl::OFlag::O_RDONLY
            | nix::fcntl::OFlag::O_DIRECTORY
            | nix::fcntl::OFlag::O_NOFOLLOW
            | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
}

/// Remove write permission from everything below the directory `dir` and
/// from `dir` itself (one descriptor per level: for `.git` and the root).
pub(crate) fn make_tree_read_only(dir: BorrowedFd<'_>) -> nix::Result<()> {
    let (names, fd) = sys::read_dir(nix::unistd::dup(dir)?)?;
    for name in names {
        let stat = sys::lstat_at(fd.as_fd(), &name.name)?;
        match stat.file_type {
            FileType::Dir => make_tree_read_only(open_subdir(fd.as_fd(), &name.name)?.as_fd())?,
            FileType::File if stat.mode & 0o222 != 0 => {
                if let Some((file, stat)) = sys::open_regular_at(fd.as_fd(), &name.name)? {
                    nix::sys::stat::fchmod(
                        &file,
                        nix::sys::stat::Mode::from_bits_truncate(stat.mode & !0o222),
                    )?;
                }
            }
            _ => {}
        }
    }
    let stat = sys::fstat(dir)?;
    nix::sys::stat::fchmod(
        dir,
        nix::sys::stat::Mode::from_bits_truncate(stat.mode & !0o222),
    )
}

/// Give the owner write permission on `dir` and every directory below it,
/// so a read-only tree can be removed.
pub(crate) fn make_dirs_writable(dir: BorrowedFd<'_>) -> nix::Result<()> {
    let stat = sys::fstat(dir)?;
    if stat.mode & 0o200 == 0 {
        nix::sys::stat::fchmod(
            dir,
            nix::sys::stat::Mode::from_bits_truncate(stat.mode | 0o700),
        )?;
    }
    let (names, fd) = sys::read_dir(nix::unistd::dup(dir)?)?;
    for name in names {
        let is_dir = match name.file_type {
            Some(kind) => kind == FileType::Dir,
            None => sys::lstat_at(fd.as_fd(), &name.name)?.file_type == FileType::Dir,
        };
        if is_dir {
            make_dirs_writable(open_subdir(fd.as_fd(), &name.name)?.as_fd())?;
        }
    }
    Ok(())
}
