use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use box_fork::{Error, Mechanism, Mode, Options, SkipReason, discard, fork};

use crate::support::{
    Node, Scratch, bytes_path, chmod, git, git_command, neutral_git, repository, snapshot,
    worktree_snapshot, write,
};

fn options(mode: Mode) -> Options {
    Options {
        mode,
        ..Options::default()
    }
}

fn mode_of(path: &Path) -> u32 {
    path.symlink_metadata().unwrap().permissions().mode() & 0o777
}

#[test]
fn copy_mode_copies_the_whole_tree_and_leaves_escaping_links_out() {
    let scratch = Scratch::new();
    let parent = scratch.path("parent");
    let outside = scratch.path("outside");
    write(&outside, "secret", "host secret\n");
    write(&parent, "a.txt", "alpha\n");
    write(&parent, "dir/sub/b.bin", [0u8, 1, 2, 255, 0, 10]);
    write(&parent, "run.sh", "#!/bin/sh\n");
    chmod(&parent, "run.sh", 0o750);
    write(
        &parent,
        bytes_path(b"caf\xe9 \n.txt"),
        "not utf-8, newline\n",
    );
    std::os::unix::fs::symlink("sub/b.bin", parent.join("dir/inside-link")).unwrap();
    std::os::unix::fs::symlink("../a.txt", parent.join("dir/up-link")).unwrap();
    std::os::unix::fs::symlink(outside.join("secret"), parent.join("absolute-link")).unwrap();
    std::os::unix::fs::symlink("../outside/secret", parent.join("escaping-link")).unwrap();
    std::os::unix::fs::symlink("dir/../../outside", parent.join("sneaky-link")).unwrap();
    nix::unistd::mkfifo(
        &parent.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();

    let child = scratch.path("child");
    let forked = fork(&neutral_git(), &parent, &child, &Options::default()).unwrap();
    assert_eq!(
        forked.mode_used,
        Mechanism::Copy,
        "not a repository: auto copies"
    );
    assert!(forked.shares.starts_with("nothing"), "{}", forked.shares);
    assert!(forked.objects.is_none());

    let mut expected = snapshot(&parent);
    for left_out in ["absolute-link", "escaping-link", "sneaky-link", "fifo"] {
        expected.remove(Path::new(left_out));
    }
    assert_eq!(snapshot(&child), expected);
    assert_eq!(mode_of(&child.join("run.sh")), 0o750);
    let reasons: Vec<(String, SkipReason)> = forked
        .skipped
        .iter()
        .map(|skipped| (skipped.path.display().to_string(), skipped.reason.clone()))
        .collect();
    assert_eq!(
        reasons,
        [
            (
                "absolute-link".to_owned(),
                SkipReason::LinkOutside {
                    target: outside.join("secret")
                }
            ),
            (
                "escaping-link".to_owned(),
                SkipReason::LinkOutside {
                    target: "../outside/secret".into()
                }
            ),
            ("fifo".to_owned(), SkipReason::Irregular),
            (
                "sneaky-link".to_owned(),
                SkipReason::LinkOutside {
                    target: "dir/../../outside".into()
                }
            ),
        ]
    );
    discard(&neutral_git(), &child, &forked.base).unwrap();
    assert!(!child.exists());
}

#[test]
fn copy_mode_of_a_repository_is_a_repository_of_its_own() {
    let scratch = Scratch::new();
    let parent = scratch.path("parent");
    repository(&parent);
    let child = scratch.path("child");
    let forked = fork(&neutral_git(), &parent, &child, &options(Mode::Copy)).unwrap();
    assert_eq!(forked.mode_used, Mechanism::Copy);
    assert_eq!(
        snapshot(&child),
        snapshot(&parent),
        ".git included, byte for byte"
    );
    write(&child, "README.md", "changed in the child\n");
    git(&child, &["commit", "-q", "-am", "child work"]);
    assert_eq!(git(&parent, &["log", "--format=%s"]), "fixture\n");
    assert_eq!(
        fs::read_to_string(parent.join("README.md")).unwrap(),
        "# fixture\n"
    );
    write(&parent, "src/lib.rs", "changed in the parent\n");
    assert_eq!(
        fs::read_to_string(child.join("src/lib.rs")).unwrap(),
        "pub fn one() -> u32 { 1 }\n"
    );
}

#[test]
fn worktree_mode_isolates_files_and_refs_both_ways() {
    let scratch = Scratch::new();
    let parent = scratch.path("parent");
    repository(&parent);
    let head = git(&parent, &["rev-parse", "HEAD"]);
    let child = scratch.path("child");
    let forked = fork(&neutral_git(), &parent, &child, &Options::default()).unwrap();
    assert_eq!(forked.mode_used, Mechanism::Worktree);
    assert!(forked.advisory.is_none(), "{:?}", forked.advisory);
    assert!(forked.shares.contains("objects"), "{}", forked.shares);
    assert_eq!(worktree_snapshot(&child), worktree_snapshot(&parent));
    assert_eq!(git(&child, &["rev-parse", "HEAD"]), head);
    assert_eq!(git(&child, &["symbolic-ref", "HEAD"]), "refs/heads/main\n");
    assert_eq!(
        git(&child, &["status", "--porcelain"]),
        "",
        "the child's checkout is clean"
    );
    assert!(
        !child.join(".git/hooks").exists(),
        "no hooks copied into the child"
    );

    // The fork base is pinned in the parent until discard.
    let pin = forked.base.pinned_ref().unwrap().to_owned();
    assert!(pin.starts_with("refs/box/forks/"), "{pin}");
    assert_eq!(git(&parent, &["rev-parse", &pin]), head);
    let parent_refs = |parent: &Path| {
        git(
            parent,
            &["for-each-ref", "--format=%(refname) %(objectname)"],
        )
        .lines()
        .filter(|line| !line.starts_with("refs/box/"))
        .map(str::to_owned)
        .collect::<Vec<_>>()
    };
    let refs_before = parent_refs(&parent);

    // A child's commit lands in the child only.
    write(&child, "src/lib.rs", "pub fn one() -> u32 { 2 }\n");
    write(&child, "child-only.txt", "child\n");
    git(&child, &["add", "-A"]);
    git(&child, &["commit", "-q", "-m", "child commit"]);
    git(&child, &["branch", "child-branch"]);
    assert_eq!(parent_refs(&parent), refs_before);
    assert_eq!(git(&parent, &["log", "--format=%s", "main"]), "fixture\n");
    assert!(!parent.join("child-only.txt").exists());
    assert_eq!(
        fs::read_to_string(parent.join("src/lib.rs")).unwrap(),
        "pub fn one() -> u32 { 1 }\n"
    );
    let child_commit = git(&child, &["rev-parse", "HEAD"]);
    assert!(
        git_command(&parent)
            .args(["cat-file", "-e", child_commit.trim()])
            .status()
            .unwrap()
            .code()
            != Some(0)
    );

    // And a parent's change stays out of the child.
    write(&parent, "parent-only.txt", "parent\n");
    write(&parent, "README.md", "parent edit\n");
    assert!(!child.join("parent-only.txt").exists());
    assert_eq!(
        fs::read_to_string(child.join("README.md")).unwrap(),
        "# fixture\n"
    );

    discard(&neutral_git(), &child, &forked.base).unwrap();
    assert!(!child.exists());
    assert!(
        git_command(&parent)
            .args(["rev-parse", "-q", "--verify", &pin])
            .status()
            .unwrap()
            .code()
            != Some(0)
    );
    discard(&neutral_git(), &child, &forked.base).unwrap();
}

#[test]
fn the_dirty_overlay_brings_every_kind_of_uncommitted_change() {
    let scratch = Scratch::new();
    let parent = scratch.path("parent");
    repository(&parent);
    write(&parent, "README.md", "# staged\n");
    git(&parent, &["add", "README.md"]);
    write(&parent, "README.md", "# staged then edited\n");
    write(&parent, "src/lib.rs", "pub fn one() -> u32 { 11 }\n");
    write(
        &parent,
        "image.bin",
        (0u8..=255).rev().cycle().take(5000).collect::<Vec<_>>(),
    );
    chmod(&parent, "tool.sh", 0o644);
    fs::remove_file(parent.join("gone-soon.txt")).unwrap();
    write(&parent, "staged-new.txt", "added to the index\n");
    git(&parent, &["add", "staged-new.txt"]);
    write(&parent, "untracked/new.txt", "untracked\n");
    write(&parent, "line\nbreak.txt", "a newline in the name\n");
    write(&parent, bytes_path(b"latin\xe9.txt"), "not utf-8\n");
    write(&parent, "target/debug/out", "ignored build output\n");
    write(&parent, "debug.log", "ignored log\n");
    std::os::unix::fs::symlink("README.md", parent.join("untracked-link")).unwrap();

    let child = scratch.path("child");
    let forked = fork(&neutral_git(), &parent, &child, &Options::default()).unwrap();
    assert_eq!(forked.mode_used, Mechanism::Worktree);
    assert!(forked.advisory.is_none(), "{:?}", forked.advisory);
    let mut expected = worktree_snapshot(&parent);
    for ignored in [
        "target",
        "target/debug",
        "target/debug/out",
        "debug.log",
        "untracked-link",
    ] {
        expected.remove(Path::new(ignored));
    }
    assert_eq!(worktree_snapshot(&child), expected);
    assert_eq!(mode_of(&child.join("tool.sh")), 0o644, "mode-only change");
    let skipped: Vec<(String, SkipReason)> = forked
        .skipped
        .iter()
        .map(|skipped| (skipped.path.display().to_string(), skipped.reason.clone()))
        .collect();
    assert_eq!(skipped, [("untracked-link".to_owned(), SkipReason::Link)]);
    // The child's git sees the parent's work as its own uncommitted changes.
    let status = git(&child, &["status", "--porcelain", "--untracked-files=all"]);
    for line in [
        " M README.md",
        " M src/lib.rs",
        " M image.bin",
        " M tool.sh",
        " D gone-soon.txt",
        "?? staged-new.txt",
        "?? untracked/new.txt",
    ] {
        assert!(
            status.lines().any(|seen| seen == line),
            "{line:?} missing from:\n{status}"
        );
    }
}

#[test]
fn an_overlay_that_fails_leaves_a_clean_head_and_says_so() {
    let scratch = Scratch::new();
    let parent = scratch.path("parent");
    repository(&parent);
    write(&parent, "README.md", "uncommitted\n");
    write(&parent, "untracked.txt", "untracked\n");
    // A corrupt index: HEAD still resolves, `git status` cannot run.
    fs::write(parent.join(".git/index"), b"DIRC garbage").unwrap();

    let child = scratch.path("child");
    let forked = fork(&neutral_git(), &parent, &child, &Options::default()).unwrap();
    assert_eq!(forked.mode_used, Mechanism::Worktree);
    let advisory = forked.advisory.expect("a degraded fork says so");
    assert!(
        advisory.starts_with("the child sees committed HEAD only:"),
        "{advisory}"
    );
    assert_eq!(
        fs::read_to_string(child.join("README.md")).unwrap(),
        "# fixture\n"
    );
    assert!(!child.join("untracked.txt").exists());
    assert_eq!(git(&child, &["status", "--porcelain"]), "");
}

#[test]
fn a_clean_fork_without_dirty_ignores_uncommitted_work() {
    let scratch = Scratch::new();
    let parent = scratch.path("parent");
    repository(&parent);
    write(&parent, "README.md", "uncommitted\n");
    let child = scratch.path("child");
    let forked = fork(
        &neutral_git(),
        &parent,
        &child,
        &Options {
            dirty: false,
            ..Options::default()
        },
    )
    .unwrap();
    assert!(forked.advisory.is_none());
    assert_eq!(
        fs::read_to_string(child.join("README.md")).unwrap(),
        "# fixture\n"
    );
}

#[test]
fn the_alternates_file_names_the_objects_where_the_unit_sees_them() {
    let scratch = Scratch::new();
    let parent = scratch.path("parent");
    repository(&parent);
    let child = scratch.path("child");
    let forked = fork(
        &neutral_git(),
        &parent,
        &child,
        &Options {
            objects_in_unit: Some("/box/parent-objects".into()),
            ..Options::default()
        },
    )
    .unwrap();
    let mount = forked.objects.unwrap();
    assert_eq!(
        mount.host,
        parent.join(".git/objects").canonicalize().unwrap()
    );
    assert_eq!(mount.unit, Path::new("/box/parent-objects"));
    assert_eq!(
        fs::read_to_string(child.join(".git/objects/info/alternates")).unwrap(),
        "/box/parent-objects\n"
    );
    assert!(
        forked.shares.contains("/box/parent-objects"),
        "{}",
        forked.shares
    );
    // Host-side git on the child names the objects itself.
    let output = git_command(&child)
        .env("GIT_ALTERNATE_OBJECT_DIRECTORIES", &mount.host)
        .args(["log", "--format=%s"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&output.stdout), "fixture\n");
}

#[test]
fn a_detached_parent_gives_a_detached_child() {
    let scratch = Scratch::new();
    let parent = scratch.path("parent");
    repository(&parent);
    git(&parent, &["checkout", "-q", "--detach"]);
    let child = scratch.path("child");
    fork(&neutral_git(), &parent, &child, &Options::default()).unwrap();
    assert!(
        git_command(&child)
            .args(["symbolic-ref", "-q", "HEAD"])
            .status()
            .unwrap()
            .code()
            == Some(1)
    );
    assert_eq!(
        git(&child, &["rev-parse", "HEAD"]),
        git(&parent, &["rev-parse", "HEAD"])
    );
}

#[test]
fn a_read_only_fork_has_no_write_bits_and_is_still_discarded() {
    for mode in [Mode::Copy, Mode::Worktree] {
        let scratch = Scratch::new();
        let parent = scratch.path("parent");
        repository(&parent);
        let child = scratch.path("child");
        let forked = fork(
            &neutral_git(),
            &parent,
            &child,
            &Options {
                mode,
                writable: false,
                ..Options::default()
            },
        )
        .unwrap();
        for (path, node) in snapshot(&child) {
            let mode = match node {
                Node::File { mode, .. } | Node::Dir { mode } => mode,
                _ => continue,
            };
            assert_eq!(
                mode & 0o222,
                0,
                "{mode:?}: {} is writable ({mode:o})",
                path.display()
            );
        }
        assert_eq!(mode_of(&child) & 0o222, 0);
        assert_eq!(mode_of(&child.join("tool.sh")), 0o555);
        discard(&neutral_git(), &child, &forked.base).unwrap();
        assert!(!child.exists());
    }
}

#[test]
fn worktree_mode_is_refused_with_the_reason_and_auto_falls_back_to_copy() {
    let scratch = Scratch::new();
    let plain = scratch.path("plain");
    write(&plain, "file", "x");
    let error = fork(
        &neutral_git(),
        &plain,
        &scratch.path("a"),
        &options(Mode::Worktree),
    )
    .unwrap_err();
    assert!(matches!(error, Error::NotWorktree { .. }), "{error}");
    assert!(
        error.to_string().contains("not a git repository"),
        "{error}"
    );
    assert!(!scratch.path("a").exists(), "nothing left behind");

    let empty = scratch.path("empty");
    fs::create_dir_all(&empty).unwrap();
    git(&empty, &["init", "-q"]);
    let error = fork(
        &neutral_git(),
        &empty,
        &scratch.path("b"),
        &options(Mode::Worktree),
    )
    .unwrap_err();
    assert!(error.to_string().contains("no commit yet"), "{error}");
    let forked = fork(
        &neutral_git(),
        &empty,
        &scratch.path("c"),
        &Options::default(),
    )
    .unwrap();
    assert_eq!(forked.mode_used, Mechanism::Copy);
}

#[test]
fn a_child_must_be_new_and_outside_the_parent() {
    let scratch = Scratch::new();
    let parent = scratch.path("parent");
    repository(&parent);
    let error = fork(
        &neutral_git(),
        &parent,
        &parent.join("inside"),
        &Options::default(),
    )
    .unwrap_err();
    assert!(matches!(error, Error::ChildInsideParent { .. }), "{error}");
    fs::create_dir_all(scratch.path("taken")).unwrap();
    let error = fork(
        &neutral_git(),
        &parent,
        &scratch.path("taken"),
        &Options::default(),
    )
    .unwrap_err();
    assert!(matches!(error, Error::ChildExists(_)), "{error}");
}

/// Records what each git command was allowed, and runs it unconfined.
struct Recorder(std::sync::Mutex<Vec<(Vec<std::path::PathBuf>, Vec<std::path::PathBuf>)>>);

impl box_fork::Confine for Recorder {
    fn command(
        &self,
        program: &Path,
        access: &box_fork::GitAccess,
    ) -> std::io::Result<std::process::Command> {
        self.0
            .lock()
            .unwrap()
            .push((access.read.clone(), access.write.clone()));
        Ok(std::process::Command::new(program))
    }
}

#[test]
fn every_git_command_goes_through_the_confinement_hook_with_what_it_needs() {
    let scratch = Scratch::new();
    let parent = scratch.path("parent");
    repository(&parent);
    write(&parent, "README.md", "dirty\n");
    let recorder = std::sync::Arc::new(Recorder(std::sync::Mutex::new(Vec::new())));
    let runner = neutral_git().with_confinement(recorder.clone());
    let child = scratch.path("child");
    let forked = fork(&runner, &parent, &child, &Options::default()).unwrap();
    discard(&runner, &child, &forked.base).unwrap();
    let parent = parent.canonicalize().unwrap();
    let git_dir = parent.join(".git");
    let child = scratch.dir.path().canonicalize().unwrap().join("child");
    let accesses = recorder.0.lock().unwrap().clone();
    // Every command writes at most the child or the parent's git directory
    // (the pin), and reads nothing outside the two trees.
    for (read, write) in &accesses {
        for path in write {
            assert!(
                path == &child || path == &git_dir,
                "writes {}",
                path.display()
            );
        }
        for path in read {
            assert!(
                path.starts_with(&parent) || path.starts_with(&child),
                "reads {}",
                path.display()
            );
        }
    }
    let writes_parent = accesses
        .iter()
        .filter(|(_, write)| write.contains(&git_dir))
        .count();
    assert_eq!(writes_parent, 2, "the pin and its removal: {accesses:?}");
    assert!(
        accesses
            .iter()
            .any(|(read, write)| read == &vec![parent.clone()] && write.is_empty()),
        "git status reads the parent and writes nothing: {accesses:?}"
    );
}

/// A confinement that cannot be set up.
struct Broken;

impl box_fork::Confine for Broken {
    fn command(&self, _: &Path, _: &box_fork::GitAccess) -> std::io::Result<std::process::Command> {
        Err(std::io::Error::other("landlock unavailable"))
    }
}

#[test]
fn a_confinement_that_fails_fails_the_fork_and_leaves_nothing() {
    let scratch = Scratch::new();
    let parent = scratch.path("parent");
    repository(&parent);
    let child = scratch.path("child");
    let runner = neutral_git().with_confinement(std::sync::Arc::new(Broken));
    let error = fork(&runner, &parent, &child, &options(Mode::Worktree)).unwrap_err();
    assert!(
        error.to_string().contains("landlock unavailable"),
        "{error}"
    );
    assert!(!child.exists());
}

#[test]
fn a_git_that_hangs_is_killed_and_the_fork_undone() {
    let scratch = Scratch::new();
    let parent = scratch.path("parent");
    repository(&parent);
    // A git that answers the inspection, then hangs on checkout.
    let fake = scratch.path("git");
    write(
        scratch.dir.path(),
        "git",
        "#!/bin/sh\ncase \"$*\" in *read-tree*) exec sleep 30;; esac\nexec git \"$@\"\n",
    );
    chmod(scratch.dir.path(), "git", 0o755);
    let runner = neutral_git()
        .with_program(&fake)
        .with_timeout(std::time::Duration::from_millis(500));
    let child = scratch.path("child");
    let started = std::time::Instant::now();
    let error = fork(&runner, &parent, &child, &options(Mode::Worktree)).unwrap_err();
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(
        matches!(&error, Error::Git(git) if matches!(git.failure, box_fork::GitFailure::Timeout(_))),
        "{error}"
    );
    assert!(!child.exists(), "the child is removed");
    let pins = git(&parent, &["for-each-ref", "refs/box/"]);
    assert_eq!(pins, "", "the pin is removed");
}

/// Records the user each git command runs as, and runs it as that user.
struct OwnerRecorder(std::sync::Mutex<Vec<Option<(u32, u32)>>>);

impl box_fork::Confine for OwnerRecorder {
    fn command(
        &self,
        program: &Path,
        access: &box_fork::GitAccess,
    ) -> std::io::Result<std::process::Command> {
        use std::os::unix::process::CommandExt as _;
        self.0.lock().unwrap().push(access.owner);
        let mut command = std::process::Command::new(program);
        if let Some((uid, gid)) = access.owner {
            command.uid(uid).gid(gid);
        }
        Ok(command)
    }
}

/// A root host forking a user's repository (issue 23) runs every git
/// command as that user: the pin in their `.git` and the child's checkout
/// are theirs, and the discard removes the pin as them.
#[test]
fn a_root_fork_of_a_users_repository_runs_git_as_its_owner() {
    use std::os::unix::fs::MetadataExt as _;
    if !nix::unistd::geteuid().is_root() {
        eprintln!("\n*** NOT RUN: the rule is a root host's, and this test runs as non-root ***\n");
        return;
    }
    const OWNER: u32 = 1000;
    let scratch = Scratch::new();
    // The user's git passes through the scratch directory to the parent.
    fs::set_permissions(scratch.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let parent = scratch.path("parent");
    repository(&parent);
    let status = std::process::Command::new("chown")
        .args(["-R", &format!("{OWNER}:{OWNER}")])
        .arg(&parent)
        .status()
        .unwrap();
    assert!(status.success());
    let recorder = std::sync::Arc::new(OwnerRecorder(std::sync::Mutex::new(Vec::new())));
    let runner = neutral_git().with_confinement(recorder.clone());
    let child = scratch.path("child");
    let forked = fork(&runner, &parent, &child, &options(Mode::Worktree)).unwrap();
    assert_eq!(forked.mode_used, Mechanism::Worktree);
    let pins = parent.join(".git/refs/box/forks");
    let pin = fs::read_dir(&pins).unwrap().next().unwrap().unwrap().path();
    for path in [
        &pins,
        &pin,
        &child,
        &child.join(".git"),
        &child.join("README.md"),
    ] {
        let meta = fs::symlink_metadata(path).unwrap();
        assert_eq!(
            (meta.uid(), meta.gid()),
            (OWNER, OWNER),
            "{}",
            path.display()
        );
    }
    discard(&runner, &child, &forked.base).unwrap();
    assert!(!pin.exists(), "the pin is left");
    let owners = recorder.0.lock().unwrap().clone();
    assert!(owners.len() >= 5, "{owners:?}");
    assert!(
        owners.iter().all(|owner| *owner == Some((OWNER, OWNER))),
        "{owners:?}"
    );
}

/// A warm unit's workspace is an empty directory it already mounts: a fork
/// into it equals a fork into a new directory, in both mechanisms, and the
/// directory keeps its identity (what the mount holds); one that is not
/// empty is refused, left as it was.
#[test]
fn a_fork_into_an_existing_empty_directory_equals_a_new_ones() {
    use std::os::unix::fs::MetadataExt as _;
    for mode in [Mode::Copy, Mode::Worktree] {
        let scratch = Scratch::new();
        let parent = scratch.path("parent");
        repository(&parent);
        let new = scratch.path("new");
        let made = fork(&neutral_git(), &parent, &new, &options(mode)).unwrap();
        let existing = scratch.path("existing");
        fs::create_dir(&existing).unwrap();
        fs::set_permissions(&existing, fs::Permissions::from_mode(0o755)).unwrap();
        let inode = existing.metadata().unwrap().ino();
        let into = box_fork::fork_into(&neutral_git(), &parent, &existing, &options(mode)).unwrap();
        assert_eq!(into.mode_used, made.mode_used);
        assert_eq!(existing.metadata().unwrap().ino(), inode);
        assert_eq!(mode_of(&existing), mode_of(&new));
        assert_eq!(
            worktree_snapshot(&existing),
            worktree_snapshot(&new),
            "{mode:?}"
        );
        assert_eq!(into.base.child(), existing.canonicalize().unwrap());
        discard(&neutral_git(), &existing, &into.base).unwrap();
        assert!(!existing.exists());

        let full = scratch.path("full");
        write(&full, "kept.txt", "kept\n");
        let refused = box_fork::fork_into(&neutral_git(), &parent, &full, &options(mode));
        assert!(matches!(refused, Err(Error::ChildExists(_))), "{refused:?}");
        assert_eq!(fs::read_to_string(full.join("kept.txt")).unwrap(), "kept\n");
    }
}
