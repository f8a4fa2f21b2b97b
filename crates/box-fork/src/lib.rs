//! Fork a workspace into an isolated child and merge the child's changes
//! back: the core of box's `box/fork`, `box/merge` and `box/discard`
//! (issue 11). No unit, session or wire here: directories in, directories
//! and a [`Base`] out; the host and the backends put units around them.
//!
//! - [`fork()`] makes the child: in [`Mechanism::Worktree`] a repository of its
//!   own holding HEAD (plus, with `dirty`, the parent's uncommitted work)
//!   that borrows the parent's git objects read-only; in
//!   [`Mechanism::Copy`] a full copy of the tree, `.git` included. Either
//!   way the child shares no refs, index, config or hooks with the parent.
//!   The [`Base`] it returns records the child's tree at fork time.
//! - [`merge()`] applies what the child changed since its base to the parent:
//!   all or nothing, refused when the parent changed the same paths (unless
//!   `theirs`), serialized per parent across the host by a lock file.
//! - [`discard`] removes the child and the parent-side pin.
//!
//! The trees on both sides are attacker-shaped (the units may still be
//! running): every path is opened below its root without following a
//! symbolic link; git runs only through the caller's [`Git`] runner, never
//! in copy mode or for a merge; nothing here runs a hook, filter or driver
//! from either repository.

// Beyond the workspace's lints: every public item documented.
#![warn(missing_docs)]
#![cfg(target_os = "linux")]

mod copy;
mod error;
mod git;
mod manifest;
mod merge;
mod relpath;
mod rules;
mod sys;
mod walk;
mod worktree;

use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

pub use error::{Error, GitError, GitFailure, Refusal};
pub use git::{Confine, DEFAULT_TIMEOUT, Git, GitAccess};
pub use manifest::{Base, Mechanism};
pub use merge::{MergeOptions, Merged, ParentLock, lock_parent, merge, recover};

use error::io_error;

/// Which mechanism [`fork`] uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Worktree when the parent is a git repository with a commit (its
    /// `.git` a real directory), else copy.
    #[default]
    Auto,
    /// Worktree, or an error saying why it cannot be.
    Worktree,
    /// A full copy.
    Copy,
}

/// How to fork.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// The mechanism.
    pub mode: Mode,
    /// Worktree mode: bring the parent's uncommitted state into the child
    /// (tracked changes, staged or not, deletions, untracked files that are
    /// not ignored). Copy mode carries everything anyway.
    pub dirty: bool,
    /// `false`: remove write permission from the whole child (explorers);
    /// the backend should also mount it read-only.
    pub writable: bool,
    /// Worktree mode: where the unit will see the parent's objects directory
    /// (the child's `objects/info/alternates` names it). `None`: the parent's
    /// host path, for units that see host paths (an unconfined local unit).
    /// See [`Forked::objects`] for the mount this asks of the backend.
    pub objects_in_unit: Option<PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            mode: Mode::Auto,
            dirty: true,
            writable: true,
            objects_in_unit: None,
        }
    }
}

/// The read-only mount a worktree child needs for its git to find the
/// parent's objects. Git the host runs on the child (outside the unit) finds
/// them by passing `GIT_ALTERNATE_OBJECT_DIRECTORIES=<host>` when `unit` is
/// not a host path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectsMount {
    /// The parent's objects directory on the host (canonical).
    pub host: PathBuf,
    /// Where the unit must see it, read-only: what the child's alternates
    /// file names.
    pub unit: PathBuf,
}

/// Why a path of the parent is not in the child.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SkipReason {
    /// A symbolic link whose target is absolute or climbs out of the tree
    /// (or climbs after descending, which a link on the way could redirect).
    LinkOutside {
        /// The link's target.
        target: PathBuf,
    },
    /// A symbolic link in the dirty overlay (worktree mode brings regular
    /// files only; the child keeps HEAD's version of the path).
    Link,
    /// A FIFO, socket or device.
    Irregular,
    /// A submodule or an embedded repository in the dirty overlay.
    Repository,
    /// It disappeared or changed type while being copied.
    Vanished,
}

impl std::fmt::Display for SkipReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SkipReason::LinkOutside { target } => write!(
                f,
                "a symbolic link out of the tree (to {})",
                target.display()
            ),
            SkipReason::Link => f.write_str(
                "a symbolic link in the uncommitted changes (the child has HEAD's version)",
            ),
            SkipReason::Irregular => f.write_str("not a regular file (a FIFO, socket or device)"),
            SkipReason::Repository => {
                f.write_str("a submodule or embedded repository in the uncommitted changes")
            }
            SkipReason::Vanished => f.write_str("it vanished or changed type while being copied"),
        }
    }
}

/// A path of the parent left out of the child.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// Relative to the parent.
    pub path: PathBuf,
    /// Why.
    pub reason: SkipReason,
}

/// A fork made.
#[derive(Clone, Debug)]
pub struct Forked {
    /// The mechanism used (what `Auto` chose).
    pub mode_used: Mechanism,
    /// What [`merge()`] needs later; keep it with the child.
    pub base: Base,
    /// Set when the child is degraded, e.g. "the child sees committed HEAD
    /// only: ..." when the dirty overlay could not be applied.
    pub advisory: Option<String>,
    /// What the child shares with the parent, in a sentence for the envelope.
    pub shares: String,
    /// Worktree mode: the mount the backend must add.
    pub objects: Option<ObjectsMount>,
    /// Paths of the parent left out, and why.
    pub skipped: Vec<Skipped>,
}

/// Fork `parent` into `child`, a new directory (its parent must exist, and it
/// must lie outside `parent`). On error nothing is left behind: the child
/// directory and the pin are removed.
pub fn fork(git: &Git, parent: &Path, child: &Path, options: &Options) -> Result<Forked, Error> {
    fork_at(git, parent, child, options, false)
}

/// [`fork()`] into `child`, an empty directory that already exists (one a
/// running unit already mounts: a warm unit's workspace, filled at its
/// claim). It is made the caller's, mode 0700, as [`fork()`] makes a new
/// one; on error it is removed as [`fork()`] removes its child.
pub fn fork_into(
    git: &Git,
    parent: &Path,
    child: &Path,
    options: &Options,
) -> Result<Forked, Error> {
    fork_at(git, parent, child, options, true)
}

fn fork_at(
    git: &Git,
    parent: &Path,
    child: &Path,
    options: &Options,
    existing: bool,
) -> Result<Forked, Error> {
    let parent = parent
        .canonicalize()
        .map_err(|error| io_error("resolve", parent, error))?;
    let parent_stat =
        std::fs::metadata(&parent).map_err(|error| io_error("stat", &parent, error))?;
    // A root host forking a user's repository runs git as that user.
    let git = &git.for_owner_of(&parent);
    if !parent_stat.is_dir() {
        return Err(io_error(
            "fork",
            &parent,
            std::io::Error::other("not a directory"),
        ));
    }
    if existing {
        empty_dir(child)?;
    } else if child.symlink_metadata().is_ok() {
        return Err(Error::ChildExists(child.to_path_buf()));
    }
    let (Some(holder), Some(name)) = (child.parent(), child.file_name()) else {
        return Err(io_error(
            "create",
            child,
            std::io::Error::other("not a path a directory can be made at"),
        ));
    };
    let holder = if holder.as_os_str().is_empty() {
        Path::new(".")
    } else {
        holder
    };
    let child = holder
        .canonicalize()
        .map_err(|error| io_error("resolve", holder, error))?
        .join(name);
    if child.starts_with(&parent) {
        return Err(Error::ChildInsideParent { child, parent });
    }
    let repository = match options.mode {
        Mode::Copy => None,
        Mode::Worktree => Some(worktree::inspect(git, &parent)?),
        Mode::Auto => match worktree::inspect(git, &parent) {
            Ok(repository) => Some(repository),
            Err(Error::NotWorktree { .. }) => None,
            Err(error) => return Err(error),
        },
    };
    if existing {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&child, std::fs::Permissions::from_mode(0o700))
            .map_err(|error| io_error("chmod", &child, error))?;
    } else {
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&child)
            .map_err(|error| match error.kind() {
                std::io::ErrorKind::AlreadyExists => Error::ChildExists(child.clone()),
                _ => io_error("create", &child, error),
            })?;
    }
    // git, run as the repository's owner, checks the child out: the
    // directory is theirs from the start.
    if let Some((uid, gid)) = git.owner()
        && repository.is_some()
        && let Err(error) = std::os::unix::fs::lchown(&child, Some(uid), Some(gid))
    {
        let _ = remove_tree(&child, false);
        return Err(io_error("chown", &child, error));
    }
    let identity = (parent_stat.dev(), parent_stat.ino());
    let made = match &repository {
        None => copy::fork(&parent, identity, &child, options),
        Some(repository) => worktree::fork(git, &parent, identity, repository, &child, options),
    };
    // Undo: the child's storage (worktree mode removed its pin itself).
    made.inspect_err(|_| {
        let _ = remove_tree(&child, !options.writable);
    })
}

/// `child` is a directory (not a link to one), owned by this process's
/// user and empty, else the error says which it is not.
fn empty_dir(child: &Path) -> Result<(), Error> {
    let not = |why: &str| io_error("fork into", child, std::io::Error::other(why.to_owned()));
    let metadata = child
        .symlink_metadata()
        .map_err(|error| io_error("stat", child, error))?;
    if !metadata.is_dir() {
        return Err(not("not a directory"));
    }
    if metadata.uid() != nix::unistd::geteuid().as_raw() {
        return Err(not("not this user's directory"));
    }
    let mut entries = std::fs::read_dir(child).map_err(|error| io_error("list", child, error))?;
    if entries.next().is_some() {
        return Err(Error::ChildExists(child.to_path_buf()));
    }
    Ok(())
}

/// The parent's objects directory a worktree fork of `parent` borrows (see
/// [`ObjectsMount::host`]), where its files allow worktree mode: what a
/// unit started before its fork is made must see read-only to have a
/// worktree fork's shape. Whether `parent` has a commit is not asked (that
/// needs git); [`Error::NotWorktree`] says why not.
pub fn borrowed_objects(parent: &Path) -> Result<PathBuf, Error> {
    worktree::borrowed_objects(parent)
}

/// Remove the child's storage and the pin its base holds in the parent.
/// Refuses a directory other than the base's child. Removing a child that is
/// already gone is not an error.
pub fn discard(git: &Git, child: &Path, base: &Base) -> Result<(), Error> {
    base.check_format()?;
    match child.canonicalize() {
        Ok(canonical) if canonical != base.child => {
            return Err(Error::WrongChild {
                child: child.to_path_buf(),
                expected: base.child.clone(),
            });
        }
        Ok(canonical) => remove_tree(&canonical, !base.writable)?,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(io_error("resolve", child, error)),
    }
    if let Some(pin) = &base.pin {
        worktree::unpin(&git.for_owner_of(&pin.git_dir), pin)?;
    }
    Ok(())
}

/// Remove a tree (links are never followed); one made read-only gets write
/// permission back on its directories first.
fn remove_tree(path: &Path, read_only: bool) -> Result<(), Error> {
    if read_only {
        match sys::open_root(path) {
            Ok(fd) => manifest::make_dirs_writable(fd.as_fd())
                .map_err(|errno| io_error("chmod", path, errno))?,
            Err(nix::errno::Errno::ENOENT) => return Ok(()),
            Err(errno) => return Err(io_error("open", path, errno)),
        }
    }
    match std::fs::remove_dir_all(path) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
            Err(io_error("remove", path, error))
        }
        _ => Ok(()),
    }
}
