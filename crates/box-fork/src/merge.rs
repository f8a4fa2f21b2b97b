//! Merge: apply what the child changed since its [`Base`] to the parent, all
//! or nothing, one merge per parent at a time across the host, without git.
//! The rules, the locking, the journal and what a crash leaves are in
//! [`merge()`]'s documentation. The pieces, in order: [`lock_parent`] (and
//! the rollback of an interrupted merge's journal), `scan` (the child's
//! changes: `lstat` shortcut, then hashes), `plan` (the parent's side of each
//! path: refusals, conflicts, what to do), `apply` (journal, stage, commit,
//! or undo).

use std::collections::HashSet;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, Flock, FlockArg};
use nix::sys::stat::Mode;
use nix::unistd::UnlinkatFlags;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Refusal, io_error};
use crate::manifest::{Base, ContentHash, Entry, Kind};
use crate::relpath::{RelPath, is_git_name};
use crate::rules::Rules;
use crate::sys::{self, Copier, FileType, Stat};
use crate::{SkipReason, Skipped, walk};

/// How to merge.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MergeOptions {
    /// Where the parent changed a path the child changed too, the child's
    /// version wins instead of refusing the merge.
    pub theirs: bool,
}

/// What a merge did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Merged {
    /// Files written in the parent (added or modified), relative to it.
    pub merged: Vec<PathBuf>,
    /// Files removed from the parent.
    pub deleted: Vec<PathBuf>,
    /// Changes of the child that are never merged (links, irregular files).
    pub skipped: Vec<Skipped>,
}

/// The lock that serializes merges into one parent; held by [`merge()`] for
/// its whole run, released on drop. Take it to keep merges out meanwhile.
#[derive(Debug)]
pub struct ParentLock {
    _lock: Flock<File>,
    journal: PathBuf,
    parent: PathBuf,
    identity: (u64, u64),
}

/// Take the merge lock of `parent` (blocking until other merges into it are
/// done), rolling back what an interrupted merge left, if anything.
/// `lock_dir` is a host directory outside both trees, the same for every
/// merge on the host (it is made if missing); it holds the lock files and
/// journals.
pub fn lock_parent(parent: &Path, lock_dir: &Path) -> Result<ParentLock, Error> {
    let lock = lock_parent_without_recovery(parent, lock_dir)?;
    roll_back_journal(&lock)?;
    Ok(lock)
}

/// Roll back what a merge into `parent` interrupted by a crash left, if
/// anything; `true` when there was something. [`merge()`] does this itself
/// before it starts; call it at startup to restore parents early.
pub fn recover(parent: &Path, lock_dir: &Path) -> Result<bool, Error> {
    let lock = lock_parent_without_recovery(parent, lock_dir)?;
    let found = lock.journal.symlink_metadata().is_ok();
    roll_back_journal(&lock)?;
    Ok(found)
}

fn lock_parent_without_recovery(parent: &Path, lock_dir: &Path) -> Result<ParentLock, Error> {
    let parent = parent
        .canonicalize()
        .map_err(|error| io_error("resolve", parent, error))?;
    let metadata = std::fs::metadata(&parent).map_err(|error| io_error("stat", &parent, error))?;
    let identity = (metadata.dev(), metadata.ino());
    std::fs::create_dir_all(lock_dir).map_err(|error| io_error("create", lock_dir, error))?;
    let key = format!("box-fork-{}-{}", identity.0, identity.1);
    let lock_path = lock_dir.join(format!("{key}.lock"));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .mode(0o600)
        .open(&lock_path)
        .map_err(|error| io_error("open", &lock_path, error))?;
    let lock = Flock::lock(file, FlockArg::LockExclusive)
        .map_err(|(_, errno)| io_error("lock", &lock_path, errno))?;
    Ok(ParentLock {
        _lock: lock,
        journal: lock_dir.join(format!("{key}.journal")),
        parent,
        identity,
    })
}

/// One change the child made, from the scan.
enum Change {
    /// Write the child's file: its hash, executable bit, permission bits.
    Write {
        path: RelPath,
        hash: ContentHash,
        executable: bool,
        mode: u32,
        stat: Stat,
    },
    Delete(RelPath),
}

impl Change {
    fn path(&self) -> &RelPath {
        match self {
            Self::Write { path, .. } | Self::Delete(path) => path,
        }
    }
}

/// Merge the child's changes since `base` into `parent`, all or nothing.
///
/// What is merged: every regular file of the child (never inside a `.git`)
/// that differs from `base` in contents or executable bit, added, modified
/// or deleted; binary-safe, names need not be UTF-8. Untracked files the
/// child's gitignore rules ignore are skipped (tracked: in git's index at
/// fork time, worktree mode only); links and irregular files are reported in
/// [`Merged::skipped`], never merged. A child with no change merges nothing.
///
/// What is refused, with every path named and the parent untouched:
/// [`Error::Conflict`] when the parent changed a path the child changed
/// (unless it already holds the child's version, or `theirs` is set);
/// [`Error::Refused`] (whatever `theirs` says) for a path that runs through
/// a symbolic link or a file in the parent, or that is a directory, link or
/// irregular file there. Paths with `..`, absolute paths and `.git`
/// components cannot occur: a base that holds one does not deserialise.
///
/// Serialization: `lock_dir` is a host directory outside both trees, the
/// same for every merge on the host; an exclusive `flock` on
/// `<lock_dir>/box-fork-<dev>-<ino>.lock`
/// (the parent directory's identity) for the whole merge, so merges into one
/// parent run one at a time across the host and merges into different
/// parents run at once. The call blocks while another merge holds it.
///
/// How it applies: the plan is journaled (fsync'd) in `lock_dir`; each new
/// content is staged as `.box-merge-<token>-<n>` beside its destination and
/// checked against the hash the scan saw; then path by path the parent's file
/// is kept as a hard link `<temp>.orig` (re-hashed: a parent write since the
/// check is a conflict) and the staged file renamed over it, or the file is
/// renamed away for a deletion. A failure undoes every step in reverse and
/// reports [`Error::Apply`] (or [`Error::RestoreFailed`] if undoing failed
/// too, leaving the journal). Removing the journal is the commit point.
///
/// Crash safety (`kill -9` of the host mid-merge): until the journal is
/// removed the parent may be partly merged, with `.box-merge-*` files beside
/// the paths involved; the next merge into that parent, or [`recover`],
/// rolls it back to exactly its pre-image (each file renamed back, so with
/// its inode) before doing anything else. After the journal is removed the
/// merge stands, with at worst some `.box-merge-*.orig` backups left. Only
/// the journal is fsync'd: after a power loss, the filesystem's ordering
/// decides what survives.
///
/// Not covered: the parent unit's own processes writing the same path
/// between the check and the rename (only the backup's re-hash narrows that
/// window); pause the parent unit to close it.
///
/// On success `base` describes the merged state, so a later merge of the
/// same child carries only newer changes.
pub fn merge(
    child: &Path,
    parent: &Path,
    base: &mut Base,
    options: &MergeOptions,
    lock_dir: &Path,
) -> Result<Merged, Error> {
    base.check_format()?;
    let child_path = child
        .canonicalize()
        .map_err(|error| io_error("resolve", child, error))?;
    if child_path != base.child {
        return Err(Error::WrongChild {
            child: child.to_path_buf(),
            expected: base.child.clone(),
        });
    }
    let lock = lock_parent(parent, lock_dir)?;
    if lock.identity != base.parent_identity {
        return Err(Error::ParentReplaced(lock.parent.clone()));
    }
    let child_fd =
        sys::open_root(&child_path).map_err(|errno| io_error("open", &child_path, errno))?;
    let (changes, skipped) = scan(&child_path, child_fd.as_fd(), base)?;
    if changes.is_empty() {
        return Ok(Merged {
            skipped,
            ..Merged::default()
        });
    }
    let parent_fd =
        sys::open_root(&lock.parent).map_err(|errno| io_error("open", &lock.parent, errno))?;
    let plan = plan(parent_fd.as_fd(), &lock.parent, &changes, base, options)?;
    if !plan.operations.is_empty() {
        apply(&lock, parent_fd.as_fd(), child_fd.as_fd(), &plan)?;
    }
    // The base now describes the merged state.
    let mut merged = Vec::new();
    let mut deleted = Vec::new();
    let mut removed = HashSet::new();
    let mut replaced: Vec<Entry> = Vec::new();
    for change in &changes {
        match change {
            Change::Write {
                path, hash, stat, ..
            } => {
                let tracked = base.entry(path).is_some_and(|entry| entry.tracked);
                let mut entry = Entry::new(path.clone(), stat, Some(*hash), None);
                entry.tracked = tracked;
                removed.insert(path.clone());
                replaced.push(entry);
            }
            Change::Delete(path) => {
                removed.insert(path.clone());
            }
        }
    }
    for operation in &plan.operations {
        match operation.kind {
            OperationKind::Write => merged.push(operation.path.to_path_buf()),
            OperationKind::Delete => deleted.push(operation.path.to_path_buf()),
        }
    }
    base.entries.retain(|entry| !removed.contains(&entry.path));
    base.entries.extend(replaced);
    base.entries
        .sort_by(|left, right| left.path.cmp(&right.path));
    Ok(Merged {
        merged,
        deleted,
        skipped,
    })
}

// ---------------------------------------------------------------- scan ----

struct ScanJob {
    dir: Option<RelPath>,
    rules: Rules,
    /// Below an ignored directory (entered because the base tracks files
    /// there): everything in it is ignored, as in git.
    ignored: bool,
}

#[derive(Default)]
struct ScanState {
    /// Files whose `lstat` changed, and whether the rules ignore them.
    candidates: Vec<(RelPath, bool)>,
    /// Indices of base entries found in the child.
    present: Vec<usize>,
    /// Ignored directories not entered.
    pruned: Vec<RelPath>,
    skipped: Vec<Skipped>,
}

fn index_of(base: &Base, path: &RelPath) -> Option<usize> {
    base.entries
        .binary_search_by(|entry| entry.path.cmp(path))
        .ok()
}

/// The base entries at or below `dir`, as an index range.
fn range_below(base: &Base, dir: &RelPath) -> std::ops::Range<usize> {
    let mut prefix = dir.as_bytes().to_vec();
    prefix.push(b'/');
    let start = base
        .entries
        .partition_point(|entry| entry.path.as_bytes() < prefix.as_slice());
    let end = start
        + base.entries[start..].partition_point(|entry| entry.path.as_bytes().starts_with(&prefix));
    start..end
}

/// What the child changed since `base`.
fn scan(
    child: &Path,
    child_fd: BorrowedFd<'_>,
    base: &Base,
) -> Result<(Vec<Change>, Vec<Skipped>), Error> {
    let states = walk::run(
        vec![ScanJob {
            dir: None,
            rules: Rules::default(),
            ignored: false,
        }],
        walk::threads(),
        ScanState::default,
        |state, job, more| scan_dir(child, child_fd, base, state, job, more),
    )?;
    let mut present = vec![false; base.entries.len()];
    let mut candidates = Vec::new();
    let mut pruned = Vec::new();
    let mut skipped = Vec::new();
    for state in states {
        for index in state.present {
            present[index] = true;
        }
        candidates.extend(state.candidates);
        pruned.extend(state.pruned);
        skipped.extend(state.skipped);
    }
    let mut changes = Vec::new();
    let mut buffer = Vec::new();
    for (path, ignored) in candidates {
        let entry = base.entry(&path);
        if ignored && !entry.is_some_and(|entry| entry.tracked) {
            continue;
        }
        let at = || child.join(path.as_path());
        let Some((file, stat)) = sys::open_regular_beneath(child_fd, path.as_bytes())
            .map_err(|errno| io_error("open", at(), errno))?
        else {
            continue;
        };
        let (hash, _) =
            sys::hash_file(&file, &mut buffer).map_err(|error| io_error("read", at(), error))?;
        if let Some(entry) = entry
            && entry.kind == Kind::File
            && entry.hash == Some(hash)
            && entry.is_executable() == stat.is_executable()
        {
            continue;
        }
        changes.push(Change::Write {
            path,
            hash,
            executable: stat.is_executable(),
            mode: stat.mode,
            stat,
        });
    }
    let mut pruned_ranges: Vec<std::ops::Range<usize>> =
        pruned.iter().map(|dir| range_below(base, dir)).collect();
    pruned_ranges.sort_by_key(|range| range.start);
    for (index, entry) in base.entries.iter().enumerate() {
        if present[index] || entry.kind != Kind::File {
            continue;
        }
        if pruned_ranges.iter().any(|range| range.contains(&index)) {
            continue;
        }
        if !entry.tracked && Rules::is_ignored_from_root(child_fd, &entry.path, false) {
            continue;
        }
        changes.push(Change::Delete(entry.path.clone()));
    }
    changes.sort_by(|left, right| left.path().cmp(right.path()));
    skipped.sort_by(|left, right| left.path.cmp(&right.path));
    Ok((changes, skipped))
}

fn scan_dir(
    child: &Path,
    child_fd: BorrowedFd<'_>,
    base: &Base,
    state: &mut ScanState,
    job: ScanJob,
    more: &mut Vec<ScanJob>,
) -> Result<(), Error> {
    let at = |rel: Option<&RelPath>| match rel {
        Some(rel) => child.join(rel.as_path()),
        None => child.to_path_buf(),
    };
    let fd = sys::open_dir_beneath(child_fd, job.dir.as_ref().map(RelPath::as_bytes))
        .map_err(|errno| io_error("open", at(job.dir.as_ref()), errno))?;
    let (names, fd) =
        sys::read_dir(fd).map_err(|errno| io_error("read", at(job.dir.as_ref()), errno))?;
    let rules = match &job.dir {
        None => Rules::at_root(fd.as_fd()),
        Some(dir) => job.rules.descend(Some(dir), fd.as_fd()),
    };
    for name in names {
        if is_git_name(&name.name) {
            continue;
        }
        let Ok(path) = RelPath::join(job.dir.as_ref(), &name.name) else {
            continue;
        };
        let stat = match sys::lstat_at(fd.as_fd(), &name.name) {
            Ok(stat) => stat,
            Err(Errno::ENOENT) => continue,
            Err(errno) => return Err(io_error("stat", at(Some(&path)), errno)),
        };
        let index = index_of(base, &path);
        let entry = index.map(|index| &base.entries[index]);
        match stat.file_type {
            FileType::Dir => {
                let ignored = job.ignored || rules.is_ignored(&path, true);
                if ignored
                    && !base.entries[range_below(base, &path)]
                        .iter()
                        .any(|entry| entry.tracked)
                {
                    state.pruned.push(path);
                } else {
                    more.push(ScanJob {
                        dir: Some(path),
                        rules: rules.clone(),
                        ignored,
                    });
                }
            }
            FileType::File => {
                if let Some(index) = index {
                    state.present.push(index);
                }
                if !entry.is_some_and(|entry| entry.is_stat_clean(&stat, base.settled)) {
                    let ignored = job.ignored || rules.is_ignored(&path, false);
                    state.candidates.push((path, ignored));
                }
            }
            FileType::Symlink | FileType::Other => {
                // A link or FIFO where the base had a file: the file is not
                // deleted in the parent either; the change is reported.
                if let Some(index) = index {
                    state.present.push(index);
                }
                let unchanged = entry.is_some_and(|entry| {
                    entry.kind == Kind::Symlink
                        && stat.file_type == FileType::Symlink
                        && nix::fcntl::readlinkat(fd.as_fd(), name.name.as_slice())
                            .is_ok_and(|target| Some(target.as_bytes()) == entry.target.as_deref())
                });
                if !unchanged && !job.ignored && !rules.is_ignored(&path, false) {
                    state.skipped.push(Skipped {
                        path: path.to_path_buf(),
                        reason: if stat.file_type == FileType::Symlink {
                            SkipReason::Link
                        } else {
                            SkipReason::Irregular
                        },
                    });
                }
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- plan ----

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum OperationKind {
    Write,
    Delete,
}

/// One step of a merge, as journaled.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Operation {
    kind: OperationKind,
    path: RelPath,
    /// Staged contents, beside the destination (writes).
    temp: String,
    /// Where the parent's file is kept until the commit.
    backup: String,
    /// Whether the parent had a file there.
    existed: bool,
    /// The parent's file as checked (writes over a file, deletions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    parent_hash: Option<ContentHash>,
    /// The contents written (writes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hash: Option<ContentHash>,
    /// Permission bits of the written file.
    mode: u32,
}

#[derive(Debug, Serialize, Deserialize)]
struct Plan {
    parent: PathBuf,
    /// Directories the staging makes, shallowest first.
    directories: Vec<RelPath>,
    operations: Vec<Operation>,
}

/// The parent's side of a path.
enum ParentState {
    Absent {
        directory_missing: bool,
    },
    File {
        hash: ContentHash,
        executable: bool,
        mode: u32,
    },
}

fn parent_state(
    parent: BorrowedFd<'_>,
    path: &RelPath,
    buffer: &mut Vec<u8>,
) -> Result<ParentState, String> {
    let (dir, name) = match sys::open_parent_beneath(parent, path.as_bytes()) {
        Ok(found) => found,
        Err(Errno::ENOENT) => {
            return Ok(ParentState::Absent {
                directory_missing: true,
            });
        }
        Err(errno) if sys::is_link_refusal(errno) => {
            return Err("it lies behind a symbolic link or a file in the parent".to_owned());
        }
        Err(errno) => return Err(format!("cannot open its directory in the parent: {errno}")),
    };
    let stat = match sys::lstat_at(dir.as_fd(), name) {
        Ok(stat) => stat,
        Err(Errno::ENOENT) => {
            return Ok(ParentState::Absent {
                directory_missing: false,
            });
        }
        Err(errno) => return Err(format!("cannot stat it in the parent: {errno}")),
    };
    match stat.file_type {
        FileType::File => {}
        FileType::Dir => return Err("it is a directory in the parent".to_owned()),
        FileType::Symlink => return Err("it is a symbolic link in the parent".to_owned()),
        FileType::Other => return Err("it is not a regular file in the parent".to_owned()),
    }
    let Some((file, stat)) = sys::open_regular_at(dir.as_fd(), name)
        .map_err(|errno| format!("cannot open it in the parent: {errno}"))?
    else {
        return Err("it is not a regular file in the parent".to_owned());
    };
    let (hash, _) = sys::hash_file(&file, buffer)
        .map_err(|error| format!("cannot read it in the parent: {error}"))?;
    Ok(ParentState::File {
        hash,
        executable: stat.is_executable(),
        mode: stat.mode,
    })
}

/// A token for this merge's temporary names.
fn token() -> String {
    let mut hasher = Sha256::new();
    hasher.update(std::process::id().to_le_bytes());
    if let Ok(now) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        hasher.update(now.as_nanos().to_le_bytes());
    }
    hasher.update(format!("{:?}", std::thread::current().id()).as_bytes());
    hasher.finalize()[..6]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

fn plan(
    parent: BorrowedFd<'_>,
    parent_path: &Path,
    changes: &[Change],
    base: &Base,
    options: &MergeOptions,
) -> Result<Plan, Error> {
    let token = token();
    let mut refusals = Vec::new();
    let mut conflicts = Vec::new();
    let mut operations = Vec::new();
    let mut directories: Vec<RelPath> = Vec::new();
    let mut buffer = Vec::new();
    for change in changes {
        let path = change.path();
        let state = match parent_state(parent, path, &mut buffer) {
            Ok(state) => state,
            Err(reason) => {
                refusals.push(Refusal {
                    path: path.to_path_buf(),
                    reason,
                });
                continue;
            }
        };
        let entry = base.entry(path);
        let parent_unchanged = match (entry, &state) {
            (None, ParentState::Absent { .. }) => true,
            (
                Some(entry),
                ParentState::File {
                    hash, executable, ..
                },
            ) => {
                entry.kind == Kind::File
                    && entry.hash == Some(*hash)
                    && entry.is_executable() == *executable
            }
            _ => false,
        };
        let already = match (change, &state) {
            (
                Change::Write {
                    hash, executable, ..
                },
                ParentState::File {
                    hash: now,
                    executable: now_executable,
                    ..
                },
            ) => hash == now && executable == now_executable,
            (Change::Delete(_), ParentState::Absent { .. }) => true,
            _ => false,
        };
        if already {
            continue;
        }
        if !parent_unchanged && !options.theirs {
            conflicts.push(path.to_path_buf());
            continue;
        }
        let index = operations.len();
        let (existed, parent_hash, parent_mode) = match &state {
            ParentState::File { hash, mode, .. } => (true, Some(*hash), Some(*mode)),
            ParentState::Absent { directory_missing } => {
                if *directory_missing {
                    for ancestor in path.ancestors() {
                        if !directories.contains(&ancestor) && !dir_exists(parent, &ancestor) {
                            directories.push(ancestor);
                        }
                    }
                }
                (false, None, None)
            }
        };
        let operation = match change {
            Change::Write {
                hash,
                executable,
                mode,
                ..
            } => Operation {
                kind: OperationKind::Write,
                path: path.clone(),
                temp: format!(".box-merge-{token}-{index}"),
                backup: format!(".box-merge-{token}-{index}.orig"),
                existed,
                parent_hash,
                hash: Some(*hash),
                mode: match parent_mode {
                    // The parent's bits, with the child's executable bit.
                    Some(mode) if *executable => (mode | ((mode & 0o444) >> 2)) & 0o777,
                    Some(mode) => mode & 0o666,
                    None => (mode & 0o777) | 0o600,
                },
            },
            Change::Delete(_) => Operation {
                kind: OperationKind::Delete,
                path: path.clone(),
                temp: format!(".box-merge-{token}-{index}"),
                backup: format!(".box-merge-{token}-{index}.orig"),
                existed,
                parent_hash,
                hash: None,
                mode: 0,
            },
        };
        operations.push(operation);
    }
    if !refusals.is_empty() {
        return Err(Error::Refused { refusals });
    }
    if !conflicts.is_empty() {
        return Err(Error::Conflict { paths: conflicts });
    }
    directories.sort_by_key(RelPath::depth);
    Ok(Plan {
        parent: parent_path.to_path_buf(),
        directories,
        operations,
    })
}

fn dir_exists(parent: BorrowedFd<'_>, path: &RelPath) -> bool {
    sys::open_dir_beneath(parent, Some(path.as_bytes())).is_ok()
}

// --------------------------------------------------------------- apply ----

fn write_journal(path: &Path, plan: &Plan) -> Result<(), Error> {
    let bytes = serde_json::to_vec(plan)
        .map_err(|error| io_error("write", path, std::io::Error::other(error)))?;
    let mut file = std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .mode(0o600)
        .open(path)
        .map_err(|error| io_error("create", path, error))?;
    file.write_all(&bytes)
        .map_err(|error| io_error("write", path, error))?;
    file.sync_all()
        .map_err(|error| io_error("sync", path, error))?;
    if let Some(dir) = path.parent()
        && let Ok(dir) = File::open(dir)
    {
        let _ = dir.sync_all();
    }
    Ok(())
}

fn open_dir_of(parent: BorrowedFd<'_>, path: &RelPath) -> nix::Result<(OwnedFd, Vec<u8>)> {
    sys::open_parent_beneath(parent, path.as_bytes()).map(|(dir, name)| (dir, name.to_vec()))
}

fn exists_at(dir: BorrowedFd<'_>, name: &str) -> bool {
    sys::lstat_at(dir, name.as_bytes()).is_ok()
}

/// Stage, then commit every operation; on failure undo them all.
fn apply(
    lock: &ParentLock,
    parent: BorrowedFd<'_>,
    child: BorrowedFd<'_>,
    plan: &Plan,
) -> Result<(), Error> {
    write_journal(&lock.journal, plan)?;
    let mut done = 0;
    let mut result = stage(parent, child, plan);
    if result.is_ok() {
        for operation in &plan.operations {
            #[cfg(test)]
            match faults::at(done) {
                Some(faults::Fault::Crash) => {
                    return Err(Error::Base("simulated crash".to_owned()));
                }
                Some(faults::Fault::Fail) => {
                    result = Err(io_failure(
                        &operation.path,
                        std::io::Error::other("injected failure"),
                    ));
                    break;
                }
                None => {}
            }
            if let Err(failure) = commit(parent, operation) {
                result = Err(failure);
                break;
            }
            done += 1;
        }
    }
    let Err(failure) = result else {
        // The commit point: from here on the merge stands.
        std::fs::remove_file(&lock.journal)
            .map_err(|error| io_error("remove", &lock.journal, error))?;
        finish(parent, plan);
        return Ok(());
    };
    match (undo(parent, plan, done), failure) {
        (Ok(()), failure) => {
            let _ = std::fs::remove_file(&lock.journal);
            Err(match failure {
                Failure::Io { path, source } => Error::Apply {
                    parent: lock.parent.clone(),
                    path: path.to_path_buf(),
                    source,
                },
                Failure::Changed(error) => error,
            })
        }
        (Err(restore), failure) => {
            let (path, source) = match failure {
                Failure::Io { path, source } => (path.to_path_buf(), source),
                Failure::Changed(error) => {
                    (PathBuf::new(), std::io::Error::other(error.to_string()))
                }
            };
            Err(Error::RestoreFailed {
                parent: lock.parent.clone(),
                path,
                source,
                restore,
                journal: lock.journal.clone(),
            })
        }
    }
}

/// Faults injected by the tests: a crash (return without undoing or
/// removing the journal, as `kill -9` would) or a failure before committing
/// operation `n`.
#[cfg(test)]
pub(crate) mod faults {
    use std::cell::Cell;

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Fault {
        Crash,
        Fail,
    }

    thread_local! {
        static FAULT: Cell<Option<(usize, Fault)>> = const { Cell::new(None) };
    }

    /// Inject `fault` before operation `index` of the next merge on this thread.
    pub fn inject(index: usize, fault: Fault) {
        FAULT.with(|cell| cell.set(Some((index, fault))));
    }

    pub fn at(index: usize) -> Option<Fault> {
        FAULT.with(|cell| match cell.get() {
            Some((at, fault)) if at == index => {
                cell.set(None);
                Some(fault)
            }
            _ => None,
        })
    }
}

/// Why staging or committing stopped.
enum Failure {
    Io {
        path: RelPath,
        source: std::io::Error,
    },
    /// The child or the parent changed under the merge.
    Changed(Error),
}

fn io_failure(path: &RelPath, source: impl Into<std::io::Error>) -> Failure {
    Failure::Io {
        path: path.clone(),
        source: source.into(),
    }
}

fn stage(parent: BorrowedFd<'_>, child: BorrowedFd<'_>, plan: &Plan) -> Result<(), Failure> {
    for directory in &plan.directories {
        let (dir, name) =
            open_dir_of(parent, directory).map_err(|errno| io_failure(directory, errno))?;
        nix::sys::stat::mkdirat(&dir, name.as_slice(), Mode::from_bits_truncate(0o755))
            .map_err(|errno| io_failure(directory, errno))?;
        sys::own_like_dir(dir.as_fd(), name.as_slice())
            .map_err(|errno| io_failure(directory, errno))?;
    }
    let copier = Copier::default();
    let mut buffer = Vec::new();
    for operation in &plan.operations {
        if operation.kind != OperationKind::Write {
            continue;
        }
        let path = &operation.path;
        let Some((source, _)) = sys::open_regular_beneath(child, path.as_bytes())
            .map_err(|errno| io_failure(path, errno))?
        else {
            return Err(Failure::Changed(Error::ChildChanged(path.to_path_buf())));
        };
        let (dir, _) = open_dir_of(parent, path).map_err(|errno| io_failure(path, errno))?;
        let out = sys::create_at(dir.as_fd(), operation.temp.as_bytes())
            .map_err(|errno| io_failure(path, errno))?;
        let hash = copier
            .copy(&source, &out, true, &mut buffer)
            .map_err(|error| io_failure(path, error))?;
        if hash != operation.hash {
            return Err(Failure::Changed(Error::ChildChanged(path.to_path_buf())));
        }
        sys::own_like_dir(dir.as_fd(), operation.temp.as_bytes())
            .map_err(|errno| io_failure(path, errno))?;
        sys::set_mode_and_times(out.as_fd(), operation.mode, None)
            .map_err(|errno| io_failure(path, errno))?;
    }
    Ok(())
}

fn commit(parent: BorrowedFd<'_>, operation: &Operation) -> Result<(), Failure> {
    let path = &operation.path;
    let (dir, name) = open_dir_of(parent, path).map_err(|errno| io_failure(path, errno))?;
    if operation.existed {
        // Keep the parent's file under the backup name, then check it is
        // still what the plan saw (a parent write since is a conflict).
        let linked = nix::unistd::linkat(
            &dir,
            name.as_slice(),
            &dir,
            operation.backup.as_bytes(),
            AtFlags::empty(),
        );
        match linked {
            Ok(()) => {}
            Err(Errno::EPERM | Errno::EMLINK | Errno::EOPNOTSUPP)
                if operation.kind == OperationKind::Write =>
            {
                nix::fcntl::renameat(&dir, name.as_slice(), &dir, operation.backup.as_bytes())
                    .map_err(|errno| io_failure(path, errno))?;
            }
            Err(_) if operation.kind == OperationKind::Delete => {
                nix::fcntl::renameat(&dir, name.as_slice(), &dir, operation.backup.as_bytes())
                    .map_err(|errno| io_failure(path, errno))?;
            }
            Err(errno) => return Err(io_failure(path, errno)),
        }
        let mut buffer = Vec::new();
        let kept = sys::open_regular_at(dir.as_fd(), operation.backup.as_bytes())
            .ok()
            .flatten()
            .and_then(|(file, _)| sys::hash_file(&file, &mut buffer).ok())
            .map(|(hash, _)| hash);
        if kept != operation.parent_hash {
            return Err(Failure::Changed(Error::Conflict {
                paths: vec![path.to_path_buf()],
            }));
        }
    }
    match operation.kind {
        OperationKind::Write => {
            nix::fcntl::renameat(&dir, operation.temp.as_bytes(), &dir, name.as_slice())
                .map_err(|errno| io_failure(path, errno))?;
        }
        OperationKind::Delete => {
            // The link made the backup; the name goes now.
            match nix::unistd::unlinkat(&dir, name.as_slice(), UnlinkatFlags::NoRemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => {}
                Err(errno) => return Err(io_failure(path, errno)),
            }
        }
    }
    Ok(())
}

/// After the commit point: remove backups, and directories a deletion left
/// empty (as `git apply` does). Failures leave litter, not damage.
fn finish(parent: BorrowedFd<'_>, plan: &Plan) {
    for operation in &plan.operations {
        if let Ok((dir, _)) = open_dir_of(parent, &operation.path) {
            let _ = nix::unistd::unlinkat(
                &dir,
                operation.backup.as_bytes(),
                UnlinkatFlags::NoRemoveDir,
            );
        }
        if operation.kind == OperationKind::Delete {
            for ancestor in operation
                .path
                .ancestors()
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
            {
                let Ok((dir, name)) = open_dir_of(parent, &ancestor) else {
                    break;
                };
                if nix::unistd::unlinkat(&dir, name.as_slice(), UnlinkatFlags::RemoveDir).is_err() {
                    break;
                }
            }
        }
    }
}

/// Undo the first `committed` operations (and any staging), in reverse.
/// `committed = operations.len()` with unknown progress (after a crash):
/// each step checks what is on disk.
fn undo(parent: BorrowedFd<'_>, plan: &Plan, committed: usize) -> Result<(), String> {
    let mut failures = Vec::new();
    let mut buffer = Vec::new();
    for (index, operation) in plan.operations.iter().enumerate().rev() {
        let path = &operation.path;
        let Ok((dir, name)) = open_dir_of(parent, path) else {
            continue;
        };
        let dir = dir.as_fd();
        // The operation may have run (in part) when it is within `committed`
        // or was the one that failed.
        if index <= committed {
            if exists_at(dir, &operation.backup) {
                if let Err(errno) =
                    nix::fcntl::renameat(dir, operation.backup.as_bytes(), dir, name.as_slice())
                {
                    failures.push(format!("{path}: {errno}"));
                }
                // Renaming a link onto the same file does nothing: drop it.
                if exists_at(dir, &operation.backup) {
                    let _ = nix::unistd::unlinkat(
                        dir,
                        operation.backup.as_bytes(),
                        UnlinkatFlags::NoRemoveDir,
                    );
                }
            } else if operation.kind == OperationKind::Write && !operation.existed {
                let ours = sys::open_regular_at(dir, &name)
                    .ok()
                    .flatten()
                    .and_then(|(file, _)| sys::hash_file(&file, &mut buffer).ok())
                    .is_some_and(|(hash, _)| Some(hash) == operation.hash);
                if ours
                    && let Err(errno) =
                        nix::unistd::unlinkat(dir, name.as_slice(), UnlinkatFlags::NoRemoveDir)
                {
                    failures.push(format!("{path}: {errno}"));
                }
            }
        }
        if exists_at(dir, &operation.temp) {
            let _ =
                nix::unistd::unlinkat(dir, operation.temp.as_bytes(), UnlinkatFlags::NoRemoveDir);
        }
    }
    for directory in plan.directories.iter().rev() {
        if let Ok((dir, name)) = open_dir_of(parent, directory) {
            let _ = nix::unistd::unlinkat(&dir, name.as_slice(), UnlinkatFlags::RemoveDir);
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("; "))
    }
}

/// Roll back the journal of an interrupted merge, if there is one.
fn roll_back_journal(lock: &ParentLock) -> Result<(), Error> {
    let bytes = match std::fs::read(&lock.journal) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(io_error("read", &lock.journal, error)),
    };
    let plan: Plan = serde_json::from_slice(&bytes).map_err(|error| {
        io_error(
            "read",
            &lock.journal,
            std::io::Error::other(format!(
                "not a merge journal ({error}); inspect the parent, then remove it"
            )),
        )
    })?;
    for operation in &plan.operations {
        for name in [&operation.temp, &operation.backup] {
            if !name.starts_with(".box-merge-") || name.contains('/') {
                return Err(io_error(
                    "read",
                    &lock.journal,
                    std::io::Error::other(format!("journal names {name:?}")),
                ));
            }
        }
    }
    if plan.parent != lock.parent {
        return Err(io_error(
            "read",
            &lock.journal,
            std::io::Error::other(format!(
                "the journal is for {}, not {}",
                plan.parent.display(),
                lock.parent.display()
            )),
        ));
    }
    let parent =
        sys::open_root(&lock.parent).map_err(|errno| io_error("open", &lock.parent, errno))?;
    undo(parent.as_fd(), &plan, plan.operations.len()).map_err(|restore| {
        io_error(
            "roll back",
            &lock.parent,
            std::io::Error::other(format!(
                "the interrupted merge in {} could not be undone: {restore}",
                lock.journal.display()
            )),
        )
    })?;
    std::fs::remove_file(&lock.journal).map_err(|error| io_error("remove", &lock.journal, error))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    use super::faults::{Fault, inject};
    use super::*;
    use crate::{Mode, Options};

    /// Every file below `root` with its mode and bytes, directories with their
    /// mode (inode numbers aside, what a byte-for-byte restore must match).
    fn snapshot(root: &Path) -> BTreeMap<PathBuf, (u32, Option<Vec<u8>>)> {
        let mut nodes = BTreeMap::new();
        let mut pending = vec![root.to_path_buf()];
        while let Some(dir) = pending.pop() {
            for entry in fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                let metadata = path.symlink_metadata().unwrap();
                let mode = metadata.permissions().mode();
                let relative = path.strip_prefix(root).unwrap().to_path_buf();
                if metadata.is_dir() {
                    pending.push(path.clone());
                    nodes.insert(relative, (mode, None));
                } else {
                    nodes.insert(relative, (mode, Some(fs::read(&path).unwrap())));
                }
            }
        }
        nodes
    }

    struct Fixture {
        _scratch: tempfile::TempDir,
        parent: PathBuf,
        child: PathBuf,
        locks: PathBuf,
        base: Base,
    }

    /// A copy-mode fork whose child changed a.txt and b.txt, deleted c.txt
    /// and added new/x.txt: operations 0 to 3 in path order.
    fn fixture() -> Fixture {
        let scratch = tempfile::tempdir().unwrap();
        let parent = scratch.path().join("parent");
        for (path, text) in [
            ("a.txt", "a\n"),
            ("b.txt", "b\n"),
            ("c.txt", "c\n"),
            ("d/e.txt", "e\n"),
        ] {
            fs::create_dir_all(parent.join(path).parent().unwrap()).unwrap();
            fs::write(parent.join(path), text).unwrap();
        }
        let child = scratch.path().join("child");
        let git = crate::Git::new([("PATH", "/usr/bin:/bin")]);
        let options = Options {
            mode: Mode::Copy,
            ..Options::default()
        };
        let forked = crate::fork(&git, &parent, &child, &options).unwrap();
        fs::write(child.join("a.txt"), "a from the child\n").unwrap();
        fs::write(child.join("b.txt"), "b from the child\n").unwrap();
        fs::remove_file(child.join("c.txt")).unwrap();
        fs::create_dir_all(child.join("new")).unwrap();
        fs::write(child.join("new/x.txt"), "x\n").unwrap();
        Fixture {
            locks: scratch.path().join("locks"),
            _scratch: scratch,
            parent,
            child,
            base: forked.base,
        }
    }

    #[test]
    fn a_failure_midway_restores_the_parent_exactly() {
        let mut fixture = fixture();
        let before = snapshot(&fixture.parent);
        inject(3, Fault::Fail);
        let error = merge(
            &fixture.child,
            &fixture.parent,
            &mut fixture.base,
            &MergeOptions::default(),
            &fixture.locks,
        )
        .unwrap_err();
        assert!(
            matches!(&error, Error::Apply { path, .. } if path == Path::new("new/x.txt")),
            "{error}"
        );
        assert_eq!(snapshot(&fixture.parent), before);
        assert!(
            !fixture
                .locks
                .join(format!(
                    "box-fork-{}-{}.journal",
                    fixture.base.parent_identity.0, fixture.base.parent_identity.1
                ))
                .exists()
        );
        // The child is intact and merges once the fault is gone.
        let merged = merge(
            &fixture.child,
            &fixture.parent,
            &mut fixture.base,
            &MergeOptions::default(),
            &fixture.locks,
        )
        .unwrap();
        assert_eq!(merged.merged.len() + merged.deleted.len(), 4);
    }

    #[test]
    fn a_crash_midway_is_rolled_back_by_recover() {
        let mut fixture = fixture();
        let before = snapshot(&fixture.parent);
        inject(2, Fault::Crash);
        merge(
            &fixture.child,
            &fixture.parent,
            &mut fixture.base,
            &MergeOptions::default(),
            &fixture.locks,
        )
        .unwrap_err();
        // What a kill -9 leaves: a.txt and b.txt merged, c.txt not yet
        // removed; a backup link of c.txt already made, as if killed inside
        // the third operation.
        assert_eq!(
            fs::read_to_string(fixture.parent.join("a.txt")).unwrap(),
            "a from the child\n"
        );
        let journal: Plan = serde_json::from_slice(
            &fs::read(fixture.locks.join(format!(
                "box-fork-{}-{}.journal",
                fixture.base.parent_identity.0, fixture.base.parent_identity.1
            )))
            .unwrap(),
        )
        .unwrap();
        let third = &journal.operations[2];
        assert_eq!(third.kind, OperationKind::Delete);
        fs::hard_link(
            fixture.parent.join("c.txt"),
            fixture.parent.join(&third.backup),
        )
        .unwrap();
        assert_ne!(snapshot(&fixture.parent), before);

        assert!(recover(&fixture.parent, &fixture.locks).unwrap());
        assert_eq!(snapshot(&fixture.parent), before);
        assert!(
            !recover(&fixture.parent, &fixture.locks).unwrap(),
            "nothing left to recover"
        );
    }

    #[test]
    fn the_next_merge_rolls_back_an_interrupted_one_first() {
        let mut fixture = fixture();
        let before = snapshot(&fixture.parent);
        inject(3, Fault::Crash);
        merge(
            &fixture.child,
            &fixture.parent,
            &mut fixture.base,
            &MergeOptions::default(),
            &fixture.locks,
        )
        .unwrap_err();
        assert_ne!(snapshot(&fixture.parent), before);
        // Without the rollback, the parent's a.txt would now differ from the
        // base and the merge would refuse it as a conflict.
        let merged = merge(
            &fixture.child,
            &fixture.parent,
            &mut fixture.base,
            &MergeOptions::default(),
            &fixture.locks,
        )
        .unwrap();
        assert_eq!(merged.merged.len() + merged.deleted.len(), 4);
        assert_eq!(
            fs::read_to_string(fixture.parent.join("new/x.txt")).unwrap(),
            "x\n"
        );
        assert!(!fixture.parent.join("c.txt").exists());
        let leftovers: Vec<_> = snapshot(&fixture.parent)
            .into_keys()
            .filter(|path| path.to_string_lossy().contains(".box-merge-"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    #[test]
    fn a_parent_write_after_the_check_is_a_conflict_and_changes_nothing() {
        let mut fixture = fixture();
        let changes = {
            let child_fd = sys::open_root(&fixture.child).unwrap();
            scan(&fixture.child, child_fd.as_fd(), &fixture.base)
                .unwrap()
                .0
        };
        let parent_fd = sys::open_root(&fixture.parent).unwrap();
        let plan = plan(
            parent_fd.as_fd(),
            &fixture.parent,
            &changes,
            &fixture.base,
            &MergeOptions::default(),
        )
        .unwrap();
        // The parent writes b.txt in place between the check and the commit.
        fs::write(fixture.parent.join("b.txt"), "b from the parent, late\n").unwrap();
        let before = snapshot(&fixture.parent);
        let lock = lock_parent(&fixture.parent, &fixture.locks).unwrap();
        let child_fd = sys::open_root(&fixture.child).unwrap();
        let error = apply(&lock, parent_fd.as_fd(), child_fd.as_fd(), &plan).unwrap_err();
        assert!(
            matches!(&error, Error::Conflict { paths } if paths == &[PathBuf::from("b.txt")]),
            "{error}"
        );
        assert_eq!(snapshot(&fixture.parent), before);
        drop(lock);
        let _ = &mut fixture.base;
    }
}
