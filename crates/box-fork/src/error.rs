//! What can go wrong, with what the user needs to act on it: the path, the
//! git command and its stderr, the paths in conflict.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

/// An error from [`fork`](crate::fork()), [`merge`](crate::merge()),
/// [`discard`](crate::discard) or [`recover`](crate::recover).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A filesystem operation failed.
    #[error("{operation} {}: {source}", path.display())]
    Io {
        /// What was being done (`"create"`, `"read"`, ...).
        operation: &'static str,
        /// On which path.
        path: PathBuf,
        /// The system's error.
        #[source]
        source: io::Error,
    },
    /// The child directory must be new.
    #[error("the child directory {} already exists; fork into a new path", .0.display())]
    ChildExists(PathBuf),
    /// A child inside its parent would copy itself.
    #[error("the child directory {} lies inside the parent {}; fork to a path outside the parent's tree", child.display(), parent.display())]
    ChildInsideParent {
        /// The child asked for.
        child: PathBuf,
        /// Its parent.
        parent: PathBuf,
    },
    /// Worktree mode was asked for a parent it cannot serve.
    #[error("{} cannot be forked in worktree mode: {reason}; fork it in copy mode", parent.display())]
    NotWorktree {
        /// The parent.
        parent: PathBuf,
        /// Why (not a repository, no commit yet, a linked worktree, ...).
        reason: String,
    },
    /// A git command failed.
    #[error(transparent)]
    Git(#[from] GitError),
    /// The parent changed paths the child changed too.
    #[error(
        "merge refused, nothing changed: the parent changed {} since the fork: {}; merge with `theirs` to let the child's version win",
        paths_phrase(paths),
        PathList(paths)
    )]
    Conflict {
        /// The paths, relative to the parent.
        paths: Vec<PathBuf>,
    },
    /// Changes that are never applied, whatever `theirs` says.
    #[error("merge refused, nothing changed: {}", RefusalList(refusals))]
    Refused {
        /// Each refused path and why.
        refusals: Vec<Refusal>,
    },
    /// The parent directory is not the one the child was forked from.
    #[error("{} is not the directory this child was forked from (it was moved or replaced); nothing merged", .0.display())]
    ParentReplaced(PathBuf),
    /// The child changed a file while it was being merged.
    #[error("the child changed {} while it was being merged; nothing merged, merge again", .0.display())]
    ChildChanged(PathBuf),
    /// Applying failed midway and the parent was restored.
    #[error("merge into {} failed at {}, and the parent was restored: {source}", parent.display(), path.display())]
    Apply {
        /// The parent.
        parent: PathBuf,
        /// The path being applied.
        path: PathBuf,
        /// The system's error.
        #[source]
        source: io::Error,
    },
    /// Applying failed midway and restoring the parent failed too.
    #[error(
        "merge into {} failed at {} ({source}) and restoring it failed ({restore}); the journal {} restores it on the next merge or `recover`",
        parent.display(),
        path.display(),
        journal.display()
    )]
    RestoreFailed {
        /// The parent.
        parent: PathBuf,
        /// The path being applied.
        path: PathBuf,
        /// Why applying failed.
        #[source]
        source: io::Error,
        /// Why restoring failed.
        restore: String,
        /// The journal left for the next merge.
        journal: PathBuf,
    },
    /// `discard` was given a directory the base does not describe.
    #[error("{} is not the child this base describes ({}); nothing removed", child.display(), expected.display())]
    WrongChild {
        /// The directory given.
        child: PathBuf,
        /// The base's child.
        expected: PathBuf,
    },
    /// A base that this version cannot use.
    #[error("unusable fork base: {0}")]
    Base(String),
}

fn paths_phrase(paths: &[PathBuf]) -> String {
    match paths.len() {
        1 => "1 path".to_owned(),
        count => format!("{count} paths"),
    }
}

/// At most this many paths are spelled out in a message.
const SHOWN: usize = 20;

struct PathList<'a>(&'a [PathBuf]);

impl fmt::Display for PathList<'_> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, path) in self.0.iter().take(SHOWN).enumerate() {
            if index > 0 {
                formatter.write_str(", ")?;
            }
            write!(formatter, "{}", path.display())?;
        }
        if self.0.len() > SHOWN {
            write!(formatter, " and {} more", self.0.len() - SHOWN)?;
        }
        Ok(())
    }
}

/// A path a merge never applies, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The path, relative to the parent.
    pub path: PathBuf,
    /// Why.
    pub reason: String,
}

struct RefusalList<'a>(&'a [Refusal]);

impl fmt::Display for RefusalList<'_> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, refusal) in self.0.iter().take(SHOWN).enumerate() {
            if index > 0 {
                formatter.write_str("; ")?;
            }
            write!(formatter, "{}: {}", refusal.path.display(), refusal.reason)?;
        }
        if self.0.len() > SHOWN {
            write!(formatter, "; and {} more", self.0.len() - SHOWN)?;
        }
        Ok(())
    }
}

/// A git command that could not start, timed out or failed.
#[derive(Debug, thiserror::Error)]
#[error("git {command} (in {}): {failure}", repository.display())]
pub struct GitError {
    /// The subcommand and its arguments, as run.
    pub command: String,
    /// The git directory it ran on.
    pub repository: PathBuf,
    /// What happened.
    pub failure: GitFailure,
}

/// How a git command failed.
#[derive(Debug)]
pub enum GitFailure {
    /// It could not be started (no git, or the confinement hook failed).
    Spawn(io::Error),
    /// It did not finish in time and was killed.
    Timeout(Duration),
    /// It exited unsuccessfully.
    Exit {
        /// The exit code, `None` when killed by a signal.
        code: Option<i32>,
        /// The end of its stderr.
        stderr: String,
    },
}

impl fmt::Display for GitFailure {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Spawn(error) => write!(formatter, "could not start: {error}"),
            Self::Timeout(limit) => write!(
                formatter,
                "did not finish within {}s and was killed",
                limit.as_secs()
            ),
            Self::Exit {
                code: Some(code),
                stderr,
            } => write!(formatter, "exited with {code}: {stderr}"),
            Self::Exit { code: None, stderr } => {
                write!(formatter, "was killed by a signal: {stderr}")
            }
        }
    }
}

/// An [`Error::Io`] on `path`.
pub(crate) fn io_error(
    operation: &'static str,
    path: impl Into<PathBuf>,
    source: impl Into<io::Error>,
) -> Error {
    Error::Io {
        operation,
        path: path.into(),
        source: source.into(),
    }
}
