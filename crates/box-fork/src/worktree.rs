//! Worktree mode: the child is a git repository of its own whose HEAD is the
//! parent's HEAD commit, checked out, plus (with `dirty`) the parent's
//! uncommitted state copied over it.
//!
//! Why not `git worktree add` (seed 002): a linked worktree shares refs,
//! config and hooks with the parent, so a child's commit, or a hook it
//! plants, lands in the parent. Why not `git clone --shared`: it runs
//! `upload-pack` on the parent and copies its refs and remote URL. Instead:
//! `git init --template=` (no hooks, fresh config) in the child, its
//! `objects/info/alternates` naming the parent's objects directory (read-only;
//! the backend mounts it where [`Options::objects_in_unit`] says), one branch
//! (the parent's current one, or a detached HEAD) at the base commit, and
//! `git read-tree --reset -u HEAD` to check it out (`read-tree` runs no
//! `post-checkout` hook, and the hooks path is `/dev/null` anyway). The base
//! commit is pinned in the parent as `refs/box/forks/<id>` so a `gc` there
//! cannot prune what the child borrows; [`discard`](crate::discard) removes
//! the pin.
//!
//! The dirty overlay reads `git status --porcelain=v2 -z` of the parent (the
//! parent's filter drivers overridden to `cat`, no optional locks) and copies
//! each changed or untracked regular file from the parent's working tree
//! into the child, and deletes what the parent deleted: the child's working
//! tree then holds the parent's staged and unstaged changes (its index holds
//! HEAD, so the child's `git status` shows them as unstaged). Links,
//! submodules and irregular files are left out and reported. If anything
//! fails the child is reset to a clean HEAD and the fork carries an advisory.
//!
//! What the child does not get: the parent's other branches and tags (one
//! branch, at the base), its remotes, stash, config and hooks; submodule
//! contents (a gitlink checks out as an empty directory). HEAD's own links
//! are checked out as git writes them, wherever they point: they resolve in
//! the unit's view of the filesystem, and nothing here follows them. A
//! parent whose `.git` is a file (a linked worktree, a submodule), whose
//! objects borrow another repository's, or that has no commit yet cannot be
//! forked this way (`Auto` copies it instead).

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::sys::stat::Mode;
use nix::unistd::UnlinkatFlags;
use sha2::{Digest, Sha256};

use crate::error::{Error, GitFailure, io_error};
use crate::git::{Git, GitAccess, Invocation};
use crate::manifest::{self, Base, Mechanism, Pin};
use crate::relpath::{RelPath, is_git_name};
use crate::sys::{self, Copier, FileType};
use crate::{Forked, ObjectsMount, Options, SkipReason, Skipped};

/// What [`inspect`] learnt about a parent that worktree mode can serve.
pub(crate) struct Repository {
    git_dir: PathBuf,
    objects: PathBuf,
    object_format: String,
    commit: String,
    /// The current branch (`refs/heads/` stripped), `None` when detached.
    branch: Option<String>,
}

fn not_worktree(parent: &Path, reason: impl Into<String>) -> Error {
    Error::NotWorktree {
        parent: parent.to_path_buf(),
        reason: reason.into(),
    }
}

/// `parent`'s `.git` and objects directories where worktree mode's checks
/// of the files pass (the commit's needs git: [`inspect`]).
fn layout(parent: &Path) -> Result<(PathBuf, PathBuf), Error> {
    let git_dir = parent.join(".git");
    match git_dir.symlink_metadata() {
        Ok(metadata) if metadata.is_dir() => {}
        Ok(metadata) if metadata.is_file() => {
            return Err(not_worktree(
                parent,
                "its .git is a file (a linked worktree or a submodule)",
            ));
        }
        Ok(_) => return Err(not_worktree(parent, "its .git is not a directory")),
        Err(_) => {
            return Err(not_worktree(
                parent,
                "it is not a git repository (no .git directory)",
            ));
        }
    }
    if git_dir.join("commondir").symlink_metadata().is_ok() {
        return Err(not_worktree(
            parent,
            "its .git borrows another repository's (commondir)",
        ));
    }
    let objects = git_dir.join("objects");
    match objects.symlink_metadata() {
        Ok(metadata) if metadata.is_dir() => {}
        _ => return Err(not_worktree(parent, "its .git/objects is not a directory")),
    }
    if std::fs::read(objects.join("info/alternates"))
        .is_ok_and(|bytes| !bytes.trim_ascii().is_empty())
    {
        return Err(not_worktree(
            parent,
            "its objects borrow from another repository (objects/info/alternates), which a unit would not see",
        ));
    }
    Ok((git_dir, objects))
}

/// The objects directory (canonical) a worktree fork of `parent` would
/// borrow, which its unit must see read-only, where `parent`'s files pass
/// worktree mode's checks; [`Error::NotWorktree`] says why not. Whether it
/// has a commit, which git tells, is not asked.
pub(crate) fn borrowed_objects(parent: &Path) -> Result<PathBuf, Error> {
    let parent = parent
        .canonicalize()
        .map_err(|error| io_error("resolve", parent, error))?;
    let (_, objects) = layout(&parent)?;
    objects
        .canonicalize()
        .map_err(|error| io_error("resolve", &objects, error))
}

/// Whether worktree mode can fork `parent`, and the facts it needs.
/// [`Error::NotWorktree`] says why not.
pub(crate) fn inspect(git: &Git, parent: &Path) -> Result<Repository, Error> {
    let (git_dir, objects) = layout(parent)?;
    let read = GitAccess {
        read: vec![git_dir.clone()],
        write: Vec::new(),
        ..GitAccess::default()
    };
    let output = match git.run(&Invocation::new(
        &git_dir,
        &[
            "rev-parse",
            "--show-object-format",
            "--verify",
            "-q",
            "HEAD^{commit}",
        ],
        read.clone(),
    )) {
        Ok(output) => output,
        Err(error) => match error.failure {
            GitFailure::Exit { stderr, .. } if stderr.is_empty() => {
                return Err(not_worktree(parent, "it has no commit yet"));
            }
            GitFailure::Exit { stderr, .. } => {
                return Err(not_worktree(
                    parent,
                    format!("git cannot read it: {stderr}"),
                ));
            }
            _ => return Err(error.into()),
        },
    };
    let text = String::from_utf8_lossy(&output);
    let mut lines = text.lines();
    let (Some(object_format), Some(commit)) = (lines.next(), lines.next()) else {
        return Err(not_worktree(
            parent,
            format!("git rev-parse answered {text:?}"),
        ));
    };
    if !commit.bytes().all(|byte| byte.is_ascii_hexdigit())
        || !object_format
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric())
    {
        return Err(not_worktree(
            parent,
            format!("git rev-parse answered {text:?}"),
        ));
    }
    let branch = match git.run(&Invocation::new(
        &git_dir,
        &["symbolic-ref", "-q", "HEAD"],
        read,
    )) {
        Ok(output) => String::from_utf8(output)
            .ok()
            .and_then(|name| {
                name.trim_end()
                    .strip_prefix("refs/heads/")
                    .map(str::to_owned)
            })
            .filter(|name| !name.is_empty() && !name.starts_with('-')),
        // Exit 1: HEAD is detached.
        Err(error) if matches!(error.failure, GitFailure::Exit { code: Some(1), .. }) => None,
        Err(error) => return Err(error.into()),
    };
    Ok(Repository {
        git_dir: git_dir
            .canonicalize()
            .map_err(|error| io_error("resolve", &git_dir, error))?,
        objects: objects
            .canonicalize()
            .map_err(|error| io_error("resolve", &objects, error))?,
        object_format: object_format.to_owned(),
        commit: commit.to_owned(),
        branch,
    })
}

/// A name for the fork's pin: unique per child path and moment.
fn fork_id(child: &Path) -> String {
    let mut hasher = Sha256::new();
    hasher.update(child.as_os_str().as_bytes());
    hasher.update(std::process::id().to_le_bytes());
    if let Ok(now) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        hasher.update(now.as_nanos().to_le_bytes());
    }
    hasher.finalize()[..8]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// Fork `parent` (inspected as `repository`) into the empty directory
/// `child`. On error the pin is removed again (the caller removes `child`).
pub(crate) fn fork(
    git: &Git,
    parent: &Path,
    identity: (u64, u64),
    repository: &Repository,
    child: &Path,
    options: &Options,
) -> Result<Forked, Error> {
    let pin = Pin {
        git_dir: repository.git_dir.clone(),
        reference: format!("refs/box/forks/{}", fork_id(child)),
        commit: repository.commit.clone(),
    };
    git.run(&Invocation::new(
        &repository.git_dir,
        &["update-ref", "--no-deref", &pin.reference, &pin.commit],
        GitAccess {
            read: vec![repository.git_dir.clone()],
            write: vec![repository.git_dir.clone()],
            ..GitAccess::default()
        },
    ))?;
    build(git, parent, identity, repository, child, options, &pin).inspect_err(|_| {
        let _ = unpin(git, &pin);
    })
}

/// Remove the pin (a pin already gone is fine).
pub(crate) fn unpin(git: &Git, pin: &Pin) -> Result<(), Error> {
    if !pin.reference.starts_with("refs/box/forks/") {
        return Err(Error::Base(format!("{} is not a fork pin", pin.reference)));
    }
    if pin.git_dir.symlink_metadata().is_err() {
        return Ok(());
    }
    git.run(&Invocation::new(
        &pin.git_dir,
        &["update-ref", "--no-deref", "-d", &pin.reference],
        GitAccess {
            read: vec![pin.git_dir.clone()],
            write: vec![pin.git_dir.clone()],
            ..GitAccess::default()
        },
    ))?;
    Ok(())
}

fn build(
    git: &Git,
    parent: &Path,
    identity: (u64, u64),
    repository: &Repository,
    child: &Path,
    options: &Options,
    pin: &Pin,
) -> Result<Forked, Error> {
    let objects_in_unit = options
        .objects_in_unit
        .clone()
        .unwrap_or_else(|| repository.objects.clone());
    if !objects_in_unit.is_absolute() || objects_in_unit.as_os_str().as_bytes().contains(&b'\n') {
        return Err(io_error(
            "name in the child's alternates",
            &objects_in_unit,
            std::io::Error::other("the objects path in the unit must be absolute and on one line"),
        ));
    }
    let child_git = child.join(".git");
    let on_child = || GitAccess {
        read: vec![repository.objects.clone()],
        write: vec![child.to_path_buf()],
        ..GitAccess::default()
    };
    let mut init = Invocation::new(&child_git, &["init", "-q", "--template="], on_child());
    init.work_tree = Some(child);
    init.args
        .push(format!("--object-format={}", repository.object_format).into());
    init.args.push(
        format!(
            "--initial-branch={}",
            repository.branch.as_deref().unwrap_or("main")
        )
        .into(),
    );
    git.run(&init)?;
    let alternates = || {
        vec![(
            "GIT_ALTERNATE_OBJECT_DIRECTORIES",
            OsString::from(&repository.objects),
        )]
    };
    let mut head = match &repository.branch {
        Some(branch) => Invocation::new(
            &child_git,
            &["update-ref", &format!("refs/heads/{branch}"), &pin.commit],
            on_child(),
        ),
        None => Invocation::new(
            &child_git,
            &["update-ref", "--no-deref", "HEAD", &pin.commit],
            on_child(),
        ),
    };
    head.env = alternates();
    git.run(&head)?;
    let checkout = || {
        let mut checkout = Invocation::new(
            &child_git,
            &["read-tree", "--reset", "-u", "HEAD"],
            on_child(),
        );
        checkout.work_tree = Some(child);
        checkout.env = alternates();
        checkout
    };
    // The parent's status is read while the child is checked out: two git
    // processes on two trees that do not meet.
    let (checked_out, status) = std::thread::scope(|scope| {
        let status = options
            .dirty
            .then(|| scope.spawn(|| parent_changes(git, parent, repository)));
        let checked_out = git.run(&checkout());
        let status = status.map(|handle| {
            handle
                .join()
                .unwrap_or_else(|_| Err("reading the parent's status panicked".to_owned()))
        });
        (checked_out, status)
    });
    checked_out?;

    let mut skipped = Vec::new();
    let mut untracked = HashSet::new();
    let mut advisory = None;
    let overlaid = match status {
        None => Ok(()),
        // Nothing was applied: the checkout is a clean HEAD.
        Some(Err(reason)) => Err((reason, false)),
        Some(Ok(status)) => overlay(&status, parent, child, &mut skipped, &mut untracked)
            .map_err(|reason| (reason, true)),
    };
    if let Err((reason, applied)) = overlaid {
        skipped.clear();
        untracked.clear();
        if applied {
            // Back to a clean HEAD: what was half applied goes.
            reset(child).map_err(|errno| io_error("reset", child, errno))?;
            git.run(&checkout())?;
        }
        advisory = Some(format!(
            "the child sees committed HEAD only: the parent's uncommitted changes could not be brought over ({reason})"
        ));
    }

    let mut entries = manifest::record(child, !options.writable)?;
    manifest::mark_tracked(&mut entries, &untracked);

    let info = child_git.join("objects/info");
    std::fs::create_dir_all(&info).map_err(|error| io_error("create", &info, error))?;
    let mut line = objects_in_unit.as_os_str().as_bytes().to_vec();
    line.push(b'\n');
    std::fs::write(info.join("alternates"), line)
        .map_err(|error| io_error("write", info.join("alternates"), error))?;
    if !options.writable {
        let fd = sys::open_root(&child_git).map_err(|errno| io_error("open", &child_git, errno))?;
        manifest::make_tree_read_only(fd.as_fd())
            .map_err(|errno| io_error("chmod", &child_git, errno))?;
    }
    let child_fd = sys::open_root(child).map_err(|errno| io_error("open", child, errno))?;
    let root_stat = std::fs::metadata(parent).map_err(|error| io_error("stat", parent, error))?;
    let mut mode = std::os::unix::fs::PermissionsExt::mode(&root_stat.permissions()) & 0o777;
    if !options.writable {
        mode &= !0o222;
    }
    nix::sys::stat::fchmod(&child_fd, Mode::from_bits_truncate(mode))
        .map_err(|errno| io_error("chmod", child, errno))?;

    let mut base = Base::new(
        Mechanism::Worktree,
        parent.to_path_buf(),
        identity,
        child.to_path_buf(),
        options.writable,
        entries,
    );
    base.settled = manifest::settle(&base.entries);
    base.pin = Some(pin.clone());
    skipped.sort_by(|left: &Skipped, right| left.path.cmp(&right.path));
    Ok(Forked {
        mode_used: Mechanism::Worktree,
        shares: format!(
            "the parent repository's git objects, read-only, through the child's objects/info/alternates ({}); the base commit is pinned in the parent as {}; the child's refs, index, config and hooks are its own and it writes its own objects",
            if objects_in_unit == repository.objects {
                format!(
                    "{}, at the same path in the unit",
                    repository.objects.display()
                )
            } else {
                format!(
                    "{} on the host, {} in the unit",
                    repository.objects.display(),
                    objects_in_unit.display()
                )
            },
            pin.reference
        ),
        objects: Some(ObjectsMount {
            host: repository.objects.clone(),
            unit: objects_in_unit,
        }),
        base,
        advisory,
        skipped,
    })
}

/// One change of the parent's working tree to bring into the child.
enum Change {
    Delete(RelPath),
    Copy(RelPath),
}

/// Parse `git status --porcelain=v2 -z --no-renames` into changes, adding
/// what is left out to `skipped` and the untracked paths to `untracked`.
fn parse_status(
    output: &[u8],
    skipped: &mut Vec<Skipped>,
    untracked: &mut HashSet<RelPath>,
) -> Result<Vec<Change>, String> {
    let mut changes = Vec::new();
    let path_of = |bytes: &[u8]| {
        RelPath::new(bytes.to_vec()).map_err(|bad| {
            format!(
                "git status named {:?}, {bad}",
                String::from_utf8_lossy(bytes)
            )
        })
    };
    for record in output
        .split(|byte| *byte == 0)
        .filter(|record| !record.is_empty())
    {
        let fields = |count: usize| {
            record
                .splitn(count, |byte| *byte == b' ')
                .collect::<Vec<_>>()
        };
        match record[0] {
            b'1' | b'u' => {
                // 1 XY sub mH mI mW hH hI path / u XY sub m1 m2 m3 mW h1 h2 h3 path
                let (count, worktree_mode) = if record[0] == b'1' { (9, 5) } else { (11, 6) };
                let fields = fields(count);
                if fields.len() != count {
                    return Err(format!(
                        "unexpected git status record {:?}",
                        String::from_utf8_lossy(record)
                    ));
                }
                let path = path_of(fields[count - 1])?;
                if fields[2].first() == Some(&b'S') {
                    skipped.push(skipped_entry(&path, SkipReason::Repository));
                    continue;
                }
                match fields[worktree_mode] {
                    b"000000" => changes.push(Change::Delete(path)),
                    b"100644" | b"100755" => changes.push(Change::Copy(path)),
                    b"120000" => skipped.push(skipped_entry(&path, SkipReason::Link)),
                    b"160000" => skipped.push(skipped_entry(&path, SkipReason::Repository)),
                    _ => skipped.push(skipped_entry(&path, SkipReason::Irregular)),
                }
            }
            b'?' => {
                let name = record.get(2..).unwrap_or_default();
                // `dir/`: an embedded repository git does not descend into.
                if let Some(dir) = name.strip_suffix(b"/") {
                    skipped.push(Skipped {
                        path: PathBuf::from(OsStr::from_bytes(dir)),
                        reason: SkipReason::Repository,
                    });
                    continue;
                }
                let path = path_of(name)?;
                untracked.insert(path.clone());
                changes.push(Change::Copy(path));
            }
            b'#' | b'!' => {}
            _ => {
                return Err(format!(
                    "unexpected git status record {:?}",
                    String::from_utf8_lossy(record)
                ));
            }
        }
    }
    Ok(changes)
}

fn skipped_entry(path: &RelPath, reason: SkipReason) -> Skipped {
    Skipped {
        path: path.to_path_buf(),
        reason,
    }
}

/// The parent's uncommitted changes, from `git status` with the parent's
/// drivers neutralised; the error says why they could not be read.
fn parent_changes(git: &Git, parent: &Path, repository: &Repository) -> Result<Vec<u8>, String> {
    let read_parent = GitAccess {
        read: vec![parent.to_path_buf()],
        write: Vec::new(),
        ..GitAccess::default()
    };
    let drivers = match git.run(&Invocation::new(
        &repository.git_dir,
        &[
            "config",
            "--name-only",
            "-z",
            "--get-regexp",
            r"^(filter|diff|merge)\..+\.(clean|smudge|process|textconv|command|driver)$",
        ],
        read_parent.clone(),
    )) {
        Ok(output) => box_scrub::Drivers::from_config_keys(&output).names,
        // Exit 1: no such key.
        Err(error) if matches!(error.failure, GitFailure::Exit { code: Some(1), .. }) => Vec::new(),
        Err(error) => return Err(error.to_string()),
    };
    let mut status = Invocation::new(
        &repository.git_dir,
        &[
            "status",
            "--porcelain=v2",
            "-z",
            "--untracked-files=all",
            "--no-renames",
            "--ignore-submodules=all",
        ],
        read_parent,
    );
    status.work_tree = Some(parent);
    // box's own overrides for these drivers, the same the executor's git gets.
    status.config = box_scrub::driver_overrides(&drivers);
    status.env = vec![("GIT_OPTIONAL_LOCKS", OsString::from("0"))];
    git.run(&status).map_err(|error| error.to_string())
}

/// Bring the parent's uncommitted state (its `git status` output) into the
/// checked-out child; the error says why it could not.
fn overlay(
    status: &[u8],
    parent: &Path,
    child: &Path,
    skipped: &mut Vec<Skipped>,
    untracked: &mut HashSet<RelPath>,
) -> Result<(), String> {
    let changes = parse_status(status, skipped, untracked)?;
    if changes.is_empty() {
        return Ok(());
    }
    let parent_fd =
        sys::open_root(parent).map_err(|errno| format!("open {}: {errno}", parent.display()))?;
    let child_fd =
        sys::open_root(child).map_err(|errno| format!("open {}: {errno}", child.display()))?;
    // Deletions first: a path deleted may be where a directory now goes.
    for change in &changes {
        if let Change::Delete(path) = change {
            delete(child_fd.as_fd(), path)
                .map_err(|errno| format!("delete {path} in the child: {errno}"))?;
        }
    }
    let copier = Copier::default();
    let mut buffer = Vec::new();
    for change in &changes {
        if let Change::Copy(path) = change {
            #[cfg(test)]
            if tests::FAIL_OVERLAY.with(|fail| fail.replace(false)) {
                return Err(format!("injected failure before copying {path}"));
            }
            match copy_in(
                parent_fd.as_fd(),
                child_fd.as_fd(),
                path,
                &copier,
                &mut buffer,
            )
            .map_err(|error| format!("copy {path} into the child: {error}"))?
            {
                None => {}
                Some(reason) => {
                    untracked.remove(path);
                    skipped.push(skipped_entry(path, reason));
                }
            }
        }
    }
    Ok(())
}

fn delete(child: BorrowedFd<'_>, path: &RelPath) -> nix::Result<()> {
    let (dir, name) = match sys::open_parent_beneath(child, path.as_bytes()) {
        Ok(found) => found,
        Err(Errno::ENOENT) => return Ok(()),
        Err(errno) => return Err(errno),
    };
    match nix::unistd::unlinkat(&dir, name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(errno) => Err(errno),
    }
}

/// Make the directories above `path` in `root`, refusing links.
pub(crate) fn make_parents(
    root: BorrowedFd<'_>,
    path: &RelPath,
    created: &mut Vec<RelPath>,
) -> nix::Result<()> {
    for ancestor in path.ancestors() {
        match sys::open_dir_beneath(root, Some(ancestor.as_bytes())) {
            Ok(_) => {}
            Err(Errno::ENOENT) => {
                let (dir, name) = sys::open_parent_beneath(root, ancestor.as_bytes())?;
                nix::sys::stat::mkdirat(&dir, name, Mode::from_bits_truncate(0o755))?;
                created.push(ancestor);
            }
            Err(errno) => return Err(errno),
        }
    }
    Ok(())
}

/// Copy the parent's `path` over the child's; `Some(reason)` when it is not
/// a regular file in the parent (left out).
fn copy_in(
    parent: BorrowedFd<'_>,
    child: BorrowedFd<'_>,
    path: &RelPath,
    copier: &Copier,
    buffer: &mut Vec<u8>,
) -> std::io::Result<Option<SkipReason>> {
    let (source_dir, name) = sys::open_parent_beneath(parent, path.as_bytes())?;
    let Some((source, stat)) = (match sys::open_regular_at(source_dir.as_fd(), name) {
        Ok(found) => found,
        Err(Errno::ENOENT) => return Ok(Some(SkipReason::Vanished)),
        Err(errno) => return Err(errno.into()),
    }) else {
        let reason = match sys::lstat_at(source_dir.as_fd(), name).map(|stat| stat.file_type) {
            Ok(FileType::Symlink) => SkipReason::Link,
            Ok(FileType::Dir) => SkipReason::Repository,
            Ok(_) => SkipReason::Irregular,
            Err(_) => SkipReason::Vanished,
        };
        return Ok(Some(reason));
    };
    make_parents(child, path, &mut Vec::new())?;
    let (dir, name) = sys::open_parent_beneath(child, path.as_bytes())?;
    match sys::lstat_at(dir.as_fd(), name) {
        Ok(existing) if existing.file_type == FileType::Dir => {
            nix::unistd::unlinkat(&dir, name, UnlinkatFlags::RemoveDir)?;
        }
        Ok(_) => nix::unistd::unlinkat(&dir, name, UnlinkatFlags::NoRemoveDir)?,
        Err(Errno::ENOENT) => {}
        Err(errno) => return Err(errno.into()),
    }
    let out = sys::create_at(dir.as_fd(), name)?;
    copier.copy(&source, &out, false, buffer)?;
    sys::set_mode_and_times(out.as_fd(), stat.mode & 0o777, Some(&stat))?;
    Ok(None)
}

/// Empty the child's working tree (not `.git`) and forget its index, so a
/// new `read-tree -u` writes HEAD afresh.
fn reset(child: &Path) -> nix::Result<()> {
    let fd = sys::open_root(child)?;
    let (names, fd) = sys::read_dir(fd)?;
    for name in names {
        if is_git_name(&name.name) {
            continue;
        }
        let path = child.join(OsStr::from_bytes(&name.name));
        match sys::lstat_at(fd.as_fd(), &name.name)?.file_type {
            FileType::Dir => std::fs::remove_dir_all(&path)
                .map_err(|error| Errno::from_raw(error.raw_os_error().unwrap_or(libc::EIO)))?,
            _ => nix::unistd::unlinkat(&fd, name.name.as_slice(), UnlinkatFlags::NoRemoveDir)?,
        }
    }
    match std::fs::remove_file(child.join(".git/index")) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(Errno::from_raw(error.raw_os_error().unwrap_or(libc::EIO))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    thread_local! {
        /// Fail the next overlay before its first copy (after its deletions).
        pub(super) static FAIL_OVERLAY: Cell<bool> = const { Cell::new(false) };
    }

    fn git(dir: &Path, args: &[&str]) {
        let status = std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@example.invalid",
                "-c",
                "init.defaultBranch=main",
            ])
            .args(args)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .status()
            .unwrap();
        assert!(status.success(), "git {args:?}");
    }

    #[test]
    fn an_overlay_failing_halfway_is_undone_to_a_clean_head() {
        let scratch = tempfile::tempdir().unwrap();
        let parent = scratch.path().join("parent");
        std::fs::create_dir_all(&parent).unwrap();
        git(&parent, &["init", "-q"]);
        for name in ["a.txt", "b.txt", "gone.txt"] {
            std::fs::write(parent.join(name), format!("{name} committed\n")).unwrap();
        }
        git(&parent, &["add", "-A"]);
        git(&parent, &["commit", "-q", "-m", "base"]);
        std::fs::write(parent.join("a.txt"), "a.txt uncommitted\n").unwrap();
        std::fs::remove_file(parent.join("gone.txt")).unwrap();
        std::fs::write(parent.join("new.txt"), "untracked\n").unwrap();
        let child = scratch.path().join("child");
        FAIL_OVERLAY.with(|fail| fail.set(true));
        let runner = Git::new([
            ("PATH", "/usr/bin:/bin"),
            ("GIT_CONFIG_NOSYSTEM", "1"),
            ("GIT_CONFIG_GLOBAL", "/dev/null"),
        ]);
        let forked = crate::fork(&runner, &parent, &child, &Options::default()).unwrap();
        let advisory = forked.advisory.unwrap();
        assert!(advisory.contains("injected failure"), "{advisory}");
        // The deletion had been applied; the reset brought the file back.
        assert_eq!(
            std::fs::read_to_string(child.join("gone.txt")).unwrap(),
            "gone.txt committed\n"
        );
        assert_eq!(
            std::fs::read_to_string(child.join("a.txt")).unwrap(),
            "a.txt committed\n"
        );
        assert!(!child.join("new.txt").exists());
        assert!(forked.base.entries.iter().all(|entry| entry.tracked));
    }

    #[test]
    fn status_records_become_changes() {
        let output = b"1 .M N... 100644 100644 100644 a a file with space\0\
1 .D N... 100644 100644 000000 a a gone\0\
1 .T N... 100644 100644 120000 a a now-link\0\
1 .M S.M. 160000 160000 160000 a a sub\0\
u UU N... 100644 100644 100644 100644 a b c conflicted\0\
? new\nline\0\
? nested/\0";
        let mut skipped = Vec::new();
        let mut untracked = HashSet::new();
        let changes = parse_status(output, &mut skipped, &mut untracked).unwrap();
        let described: Vec<String> = changes
            .iter()
            .map(|change| match change {
                Change::Delete(path) => format!("delete {path}"),
                Change::Copy(path) => format!("copy {path}"),
            })
            .collect();
        assert_eq!(
            described,
            [
                "copy file with space",
                "delete gone",
                "copy conflicted",
                "copy new\nline"
            ]
        );
        let reasons: Vec<(String, SkipReason)> = skipped
            .into_iter()
            .map(|skipped| (skipped.path.display().to_string(), skipped.reason))
            .collect();
        assert_eq!(
            reasons,
            [
                ("now-link".to_owned(), SkipReason::Link),
                ("sub".to_owned(), SkipReason::Repository),
                ("nested".to_owned(), SkipReason::Repository)
            ]
        );
        assert!(untracked.contains(&RelPath::new(b"new\nline".to_vec()).unwrap()));
    }

    #[test]
    fn a_status_path_into_git_is_refused() {
        let mut skipped = Vec::new();
        let error = parse_status(
            b"? .git/hooks/post-checkout\0",
            &mut skipped,
            &mut HashSet::new(),
        )
        .err()
        .unwrap();
        assert!(error.contains(".git"), "{error}");
    }
}
