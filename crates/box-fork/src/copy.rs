//! Copy mode: the parent's whole tree, `.git` included, into the child, on a
//! few threads (one directory per job), without running git.
//!
//! Regular files are copied with their permission bits (setuid and setgid
//! dropped) and times, by reflink where the filesystem can, hashed for the
//! base on the way (files the parent's gitignore rules ignore are copied but
//! not hashed: they are never merged). Directories get their modes and times
//! last, deepest first. A symbolic link is recreated as a link when its
//! target stays inside the tree, judged from the text alone: relative, any
//! `..` only at its start and not climbing above the root (a `..` after a
//! name could climb out through another link). Other links, FIFOs, sockets
//! and devices are left out and reported.
//!
//! The copied `.git` is the parent's, configuration and hooks included: the
//! child's own repository, for the child's git inside its unit. Git that the
//! host runs on it needs the same neutralisation as on the parent.

use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::sys::stat::Mode;

use crate::error::{Error, io_error};
use crate::manifest::{self, Base, Entry, Mechanism};
use crate::relpath::{RelPath, is_git_name};
use crate::rules::Rules;
use crate::sys::{self, Copier, CopyMethod, FileType, Stat};
use crate::{Forked, Options, SkipReason, Skipped, walk};

/// One directory to copy.
struct Job {
    /// Relative to the roots; empty for the roots themselves.
    path: Vec<u8>,
    /// Inside a `.git` (copied, not recorded).
    in_git: bool,
    /// Ignored by the parent's rules (copied, not hashed).
    ignored: bool,
    /// The rules of the directory above.
    rules: Rules,
}

#[derive(Default)]
struct State {
    entries: Vec<Entry>,
    skipped: Vec<Skipped>,
    /// Directories to give their final mode and times: path, `lstat`.
    dirs: Vec<(Vec<u8>, Stat)>,
    buffer: Vec<u8>,
}

struct Trees<'a> {
    parent: &'a Path,
    child: &'a Path,
    source: BorrowedFd<'a>,
    target: BorrowedFd<'a>,
    copier: &'a Copier,
    read_only: bool,
}

fn at(root: &Path, path: &[u8]) -> PathBuf {
    if path.is_empty() {
        root.to_path_buf()
    } else {
        root.join(OsStr::from_bytes(path))
    }
}

/// Fork `parent` by copying it into the empty directory `child`.
pub(crate) fn fork(
    parent: &Path,
    identity: (u64, u64),
    child: &Path,
    options: &Options,
) -> Result<Forked, Error> {
    let source = sys::open_root(parent).map_err(|errno| io_error("open", parent, errno))?;
    let target = sys::open_root(child).map_err(|errno| io_error("open", child, errno))?;
    let copier = Copier::default();
    let trees = Trees {
        parent,
        child,
        source: source.as_fd(),
        target: target.as_fd(),
        copier: &copier,
        read_only: !options.writable,
    };
    let root = Job {
        path: Vec::new(),
        in_git: false,
        ignored: false,
        rules: Rules::default(),
    };
    let states = walk::run(
        vec![root],
        walk::threads(),
        State::default,
        |state, job, more| copy_dir(&trees, state, job, more),
    )?;
    let root_stat = sys::fstat(source.as_fd()).map_err(|errno| io_error("stat", parent, errno))?;
    let mut entries = Vec::new();
    let mut skipped = Vec::new();
    let mut dirs = vec![(Vec::new(), root_stat)];
    for state in states {
        entries.extend(state.entries);
        skipped.extend(state.skipped);
        dirs.extend(state.dirs);
    }
    // Deepest first, so a read-only directory is closed after its contents.
    dirs.sort_by_key(|(path, _)| {
        std::cmp::Reverse(
            path.iter().filter(|byte| **byte == b'/').count() + usize::from(!path.is_empty()),
        )
    });
    for (path, stat) in &dirs {
        finish_dir(&trees, path, stat)
            .map_err(|errno| io_error("set mode and times of", at(child, path), errno))?;
    }
    skipped.sort_by(|left, right| left.path.cmp(&right.path));
    let mut base = Base::new(
        Mechanism::Copy,
        parent.to_path_buf(),
        identity,
        child.to_path_buf(),
        options.writable,
        entries,
    );
    base.settled = manifest::settle(&base.entries);
    let shares = match copier.used().as_slice() {
        [CopyMethod::Reflink] => {
            "nothing: a full copy whose data blocks are shared copy-on-write (reflink)"
        }
        methods if methods.contains(&CopyMethod::Reflink) => {
            "nothing: a full copy, partly reflinked (data blocks shared copy-on-write)"
        }
        _ => "nothing: a full copy",
    };
    Ok(Forked {
        mode_used: Mechanism::Copy,
        base,
        advisory: None,
        shares: shares.to_owned(),
        objects: None,
        skipped,
    })
}

fn finish_dir(trees: &Trees<'_>, path: &[u8], stat: &Stat) -> nix::Result<()> {
    let fd = sys::open_dir_beneath(trees.target, (!path.is_empty()).then_some(path))?;
    let mut mode = stat.mode & 0o777;
    if trees.read_only {
        mode &= !0o222;
    }
    sys::set_mode_and_times(fd.as_fd(), mode, Some(stat))
}

fn copy_dir(
    trees: &Trees<'_>,
    state: &mut State,
    job: Job,
    more: &mut Vec<Job>,
) -> Result<(), Error> {
    let relative = (!job.path.is_empty()).then_some(job.path.as_slice());
    let source = sys::open_dir_beneath(trees.source, relative)
        .map_err(|errno| io_error("open", at(trees.parent, &job.path), errno))?;
    let target = sys::open_dir_beneath(trees.target, relative)
        .map_err(|errno| io_error("open", at(trees.child, &job.path), errno))?;
    let (names, source) = sys::read_dir(source)
        .map_err(|errno| io_error("read", at(trees.parent, &job.path), errno))?;
    let rel = if job.path.is_empty() || job.in_git {
        None
    } else {
        RelPath::new(job.path.clone()).ok()
    };
    let rules = if job.in_git || job.ignored {
        job.rules
    } else if job.path.is_empty() {
        Rules::at_root(source.as_fd())
    } else {
        job.rules.descend(rel.as_ref(), source.as_fd())
    };
    let depth = if job.path.is_empty() {
        0
    } else {
        job.path.iter().filter(|byte| **byte == b'/').count() + 1
    };
    for name in names {
        let mut path = job.path.clone();
        if !path.is_empty() {
            path.push(b'/');
        }
        path.extend_from_slice(&name.name);
        let in_git = job.in_git || is_git_name(&name.name);
        // The manifest's name for it: none inside `.git`.
        let entry_path = if in_git {
            None
        } else {
            RelPath::new(path.clone()).ok()
        };
        let stat = match sys::lstat_at(source.as_fd(), &name.name) {
            Ok(stat) => stat,
            Err(nix::errno::Errno::ENOENT) => {
                state.skipped.push(skip(&path, SkipReason::Vanished));
                continue;
            }
            Err(errno) => return Err(io_error("stat", at(trees.parent, &path), errno)),
        };
        match stat.file_type {
            FileType::Dir => {
                nix::sys::stat::mkdirat(
                    target.as_fd(),
                    name.name.as_slice(),
                    Mode::from_bits_truncate(0o700),
                )
                .map_err(|errno| io_error("create", at(trees.child, &path), errno))?;
                let ignored = job.ignored
                    || (!in_git
                        && entry_path
                            .as_ref()
                            .is_some_and(|entry| rules.is_ignored(entry, true)));
                state.dirs.push((path.clone(), stat));
                more.push(Job {
                    path,
                    in_git,
                    ignored,
                    rules: rules.clone(),
                });
            }
            FileType::File => {
                let Some((file, stat)) = sys::open_checked_at(source.as_fd(), &name.name)
                    .map_err(|errno| io_error("open", at(trees.parent, &path), errno))?
                else {
                    state.skipped.push(skip(&path, SkipReason::Vanished));
                    continue;
                };
                let out = sys::create_at(target.as_fd(), &name.name)
                    .map_err(|errno| io_error("create", at(trees.child, &path), errno))?;
                let hashed = entry_path
                    .as_ref()
                    .filter(|entry| !job.ignored && !rules.is_ignored(entry, false));
                let hash = trees
                    .copier
                    .copy(&file, &out, hashed.is_some(), &mut state.buffer)
                    .map_err(|error| io_error("copy", at(trees.parent, &path), error))?;
                let mut mode = stat.mode & 0o777;
                if trees.read_only {
                    mode &= !0o222;
                }
                sys::set_mode_and_times(out.as_fd(), mode, Some(&stat))
                    .map_err(|errno| io_error("set mode of", at(trees.child, &path), errno))?;
                if let Some(entry_path) = entry_path {
                    let written = sys::fstat(out.as_fd())
                        .map_err(|errno| io_error("stat", at(trees.child, &path), errno))?;
                    state
                        .entries
                        .push(Entry::new(entry_path, &written, hash, None));
                }
            }
            FileType::Symlink => {
                let target_text = nix::fcntl::readlinkat(source.as_fd(), name.name.as_slice())
                    .map_err(|errno| io_error("read link", at(trees.parent, &path), errno))?
                    .into_encoded_bytes();
                if !stays_inside(depth, &target_text) {
                    state.skipped.push(skip(
                        &path,
                        SkipReason::LinkOutside {
                            target: PathBuf::from(OsStr::from_bytes(&target_text)),
                        },
                    ));
                    continue;
                }
                nix::unistd::symlinkat(
                    target_text.as_slice(),
                    target.as_fd(),
                    name.name.as_slice(),
                )
                .map_err(|errno| io_error("create link", at(trees.child, &path), errno))?;
                if let Some(entry_path) = entry_path {
                    let written = sys::lstat_at(target.as_fd(), &name.name)
                        .map_err(|errno| io_error("stat", at(trees.child, &path), errno))?;
                    state
                        .entries
                        .push(Entry::new(entry_path, &written, None, Some(target_text)));
                }
            }
            FileType::Other => state.skipped.push(skip(&path, SkipReason::Irregular)),
        }
    }
    Ok(())
}

fn skip(path: &[u8], reason: SkipReason) -> Skipped {
    Skipped {
        path: PathBuf::from(OsStr::from_bytes(path)),
        reason,
    }
}

/// Whether a link `depth` directories below the root with target `target`
/// resolves inside the tree whatever the other links in it point at: the
/// target is relative, its `..` components all come first, and they do not
/// climb above the root. (After a name, `..` follows that name's link if it
/// is one, which the text cannot tell.)
pub(crate) fn stays_inside(depth: usize, target: &[u8]) -> bool {
    if target.is_empty() || target[0] == b'/' {
        return false;
    }
    let mut climbed = 0usize;
    let mut named = false;
    for component in target.split(|byte| *byte == b'/') {
        match component {
            b"" | b"." => {}
            b".." => {
                if named {
                    return false;
                }
                climbed += 1;
                if climbed > depth {
                    return false;
                }
            }
            _ => named = true,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::stays_inside;

    #[test]
    fn links_are_judged_by_their_text() {
        for (depth, target, inside) in [
            (0, "a", true),
            (0, "./a/b", true),
            (1, "../a", true),
            (1, "../../a", false),
            (0, "../outside", false),
            (0, "/etc/passwd", false),
            (2, "../../x/y", true),
            (0, "a/../b", false),
            (0, "a/..", false),
            (0, "", false),
            (0, ".", true),
        ] {
            assert_eq!(
                stays_inside(depth, target.as_bytes()),
                inside,
                "{depth} {target:?}"
            );
        }
    }
}
