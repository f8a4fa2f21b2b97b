//! Gitignore semantics without running git: the `ignore` crate's matcher
//! (ripgrep's) for each `.gitignore`, chained from the root to a directory,
//! the deepest file first, then `.git/info/exclude`. The files are read
//! through descriptors, never by path, never through a link, and at most
//! [`RULES_LIMIT`] bytes each: they belong to the tree being read.
//!
//! What git also reads and this does not: `core.excludesFile` (the user's
//! global rules: a child's untracked file ignored only there is merged).

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;

use ignore::Match;
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use crate::relpath::RelPath;
use crate::sys;

/// The most bytes read from one `.gitignore` or exclude file.
pub(crate) const RULES_LIMIT: u64 = 1 << 20;

struct Node {
    /// The directory the rules are relative to (`None`: the root).
    dir: Option<RelPath>,
    matcher: Gitignore,
    parent: Option<Arc<Node>>,
}

/// The ignore rules in force in one directory.
#[derive(Clone, Default)]
pub(crate) struct Rules {
    chain: Option<Arc<Node>>,
}

fn matcher(bytes: &[u8]) -> Option<Gitignore> {
    let mut builder = GitignoreBuilder::new(".");
    let mut any = false;
    for line in bytes.split(|byte| *byte == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        // A line the matcher cannot parse is skipped, as git skips it.
        if builder
            .add_line(None, &String::from_utf8_lossy(line))
            .is_ok()
        {
            any = true;
        }
    }
    let matcher = builder.build().ok()?;
    (any && !matcher.is_empty()).then_some(matcher)
}

impl Rules {
    /// The rules at the root of the tree whose root directory is `root`:
    /// `.git/info/exclude`, then the root `.gitignore`.
    pub fn at_root(root: BorrowedFd<'_>) -> Self {
        let mut rules = Self::default();
        // `.git` is refused as a RelPath component, so it is opened by name.
        let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let exclude = nix::fcntl::openat(root, ".git", flags, Mode::empty())
            .and_then(|git| nix::fcntl::openat(&git, "info", flags, Mode::empty()))
            .ok()
            .and_then(|info| sys::read_small_at(info.as_fd(), b"exclude", RULES_LIMIT));
        if let Some(matcher) = exclude.as_deref().and_then(matcher) {
            rules.chain = Some(Arc::new(Node {
                dir: None,
                matcher,
                parent: None,
            }));
        }
        rules.descend(None, root)
    }

    /// The rules inside the directory `dir` (open as `fd`), given the rules of
    /// its parent: its `.gitignore` added, if it has one.
    pub fn descend(&self, dir: Option<&RelPath>, fd: BorrowedFd<'_>) -> Self {
        match sys::read_small_at(fd, b".gitignore", RULES_LIMIT)
            .as_deref()
            .and_then(matcher)
        {
            None => self.clone(),
            Some(matcher) => Self {
                chain: Some(Arc::new(Node {
                    dir: dir.cloned(),
                    matcher,
                    parent: self.chain.clone(),
                })),
            },
        }
    }

    /// Whether `path` itself is ignored (its ancestors are the caller's
    /// business: a walk does not enter an ignored directory).
    pub fn is_ignored(&self, path: &RelPath, is_dir: bool) -> bool {
        let mut node = self.chain.as_deref();
        while let Some(current) = node {
            let relative = match &current.dir {
                None => path.as_path(),
                Some(dir) => match path.as_path().strip_prefix(dir.as_path()) {
                    Ok(relative) => relative,
                    Err(_) => {
                        node = current.parent.as_deref();
                        continue;
                    }
                },
            };
            match current.matcher.matched(relative, is_dir) {
                Match::Ignore(_) => return true,
                Match::Whitelist(_) => return false,
                Match::None => {}
            }
            node = current.parent.as_deref();
        }
        false
    }

    /// Whether `path` or any directory above it is ignored, loading the
    /// `.gitignore` of each existing ancestor below `root` (for a path the
    /// walk did not reach, such as one deleted with its directory).
    pub fn is_ignored_from_root(root: BorrowedFd<'_>, path: &RelPath, is_dir: bool) -> bool {
        let mut rules = Self::at_root(root);
        for ancestor in path.ancestors() {
            if rules.is_ignored(&ancestor, true) {
                return true;
            }
            match sys::open_dir_beneath(root, Some(ancestor.as_bytes())) {
                Ok(fd) => rules = rules.descend(Some(&ancestor), fd.as_fd()),
                // A directory that is gone keeps its parent's rules.
                Err(_) => break,
            }
        }
        rules.is_ignored(path, is_dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(text: &str) -> RelPath {
        RelPath::new(text.as_bytes().to_vec()).unwrap()
    }

    #[test]
    fn deeper_rules_win_and_negations_reinclude() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join(".gitignore"), "*.log\n/build\nsecret*\n").unwrap();
        std::fs::create_dir_all(root.path().join("sub")).unwrap();
        std::fs::write(root.path().join("sub/.gitignore"), "!keep.log\nlocal\n").unwrap();
        std::fs::create_dir_all(root.path().join(".git/info")).unwrap();
        std::fs::write(root.path().join(".git/info/exclude"), "excluded\n").unwrap();
        let fd = sys::open_root(root.path()).unwrap();
        let rules = Rules::at_root(fd.as_fd());
        assert!(rules.is_ignored(&path("a.log"), false));
        assert!(rules.is_ignored(&path("build"), true));
        assert!(
            !rules.is_ignored(&path("sub/build"), true),
            "anchored to the root"
        );
        assert!(rules.is_ignored(&path("excluded"), false));
        assert!(!rules.is_ignored(&path("a.txt"), false));
        let sub_fd = sys::open_dir_beneath(fd.as_fd(), Some(b"sub")).unwrap();
        let sub = rules.descend(Some(&path("sub")), sub_fd.as_fd());
        assert!(!sub.is_ignored(&path("sub/keep.log"), false));
        assert!(sub.is_ignored(&path("sub/other.log"), false));
        assert!(sub.is_ignored(&path("sub/local"), false));
        assert!(!rules.is_ignored(&path("local"), false));
        assert!(Rules::is_ignored_from_root(
            fd.as_fd(),
            &path("build/x/y.c"),
            false
        ));
        assert!(Rules::is_ignored_from_root(
            fd.as_fd(),
            &path("gone/secret.txt"),
            false
        ));
        assert!(!Rules::is_ignored_from_root(
            fd.as_fd(),
            &path("sub/keep.log"),
            false
        ));
    }

    #[test]
    fn a_linked_gitignore_is_not_read() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("rules"), "*\n").unwrap();
        std::os::unix::fs::symlink(outside.path().join("rules"), root.path().join(".gitignore"))
            .unwrap();
        let fd = sys::open_root(root.path()).unwrap();
        assert!(!Rules::at_root(fd.as_fd()).is_ignored(&path("a"), false));
    }
}
