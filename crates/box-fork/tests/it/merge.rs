use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use box_fork::{
    Error, Forked, MergeOptions, Merged, Mode, Options, SkipReason, fork, lock_parent, merge,
};

use crate::support::{Scratch, bytes_path, chmod, git, neutral_git, repository, snapshot, write};

fn fork_in(scratch: &Scratch, parent: &Path, name: &str, mode: Mode) -> (PathBuf, Forked) {
    let child = scratch.path(name);
    let forked = fork(
        &neutral_git(),
        parent,
        &child,
        &Options {
            mode,
            ..Options::default()
        },
    )
    .unwrap();
    (child, forked)
}

fn paths(paths: &[PathBuf]) -> Vec<String> {
    paths
        .iter()
        .map(|path| path.display().to_string())
        .collect()
}

#[test]
fn merge_applies_modified_added_deleted_binary_and_mode_changes() {
    for mode in [Mode::Worktree, Mode::Copy] {
        let scratch = Scratch::new();
        let parent = scratch.path("parent");
        repository(&parent);
        let (child, mut forked) = fork_in(&scratch, &parent, "child", mode);
        let binary: Vec<u8> = (0..20_000u32)
            .map(|index| (index * 7 % 256) as u8)
            .collect();
        write(&child, "README.md", "# changed by the child\n");
        write(&child, "image.bin", &binary);
        write(&child, "new/dir/added.txt", "added\n");
        write(&child, "line\nbreak.txt", "newline in the name\n");
        write(&child, bytes_path(b"caf\xe9"), "latin-1 name\n");
        fs::remove_file(child.join("gone-soon.txt")).unwrap();
        fs::remove_file(child.join("src/deep/nested.txt")).unwrap();
        chmod(&child, "src/lib.rs", 0o755);
        // Touched but unchanged: not a change.
        write(&child, "tool.sh", "#!/bin/sh\necho tool\n");
        // Ignored and untracked: stays in the child.
        write(&child, "target/out.o", "build output\n");
        write(&child, "trace.log", "log\n");
        std::os::unix::fs::symlink("README.md", child.join("a-link")).unwrap();

        let lock_dir = scratch.path("locks");
        // The host keeps the base as JSON between fork and merge.
        let json = serde_json::to_string(&forked.base).unwrap();
        forked.base = serde_json::from_str(&json).unwrap();
        let merged = merge(
            &child,
            &parent,
            &mut forked.base,
            &MergeOptions::default(),
            &lock_dir,
        )
        .unwrap();
        let mut expected_merged = vec![
            "README.md",
            "caf\u{fffd}",
            "image.bin",
            "line\nbreak.txt",
            "new/dir/added.txt",
            "src/lib.rs",
        ];
        expected_merged.sort();
        let mut got: Vec<String> = merged
            .merged
            .iter()
            .map(|path| path.to_string_lossy().into_owned())
            .collect();
        got.sort();
        assert_eq!(got, expected_merged, "{mode:?}");
        assert_eq!(
            paths(&merged.deleted),
            ["gone-soon.txt", "src/deep/nested.txt"],
            "{mode:?}"
        );
        assert_eq!(
            merged
                .skipped
                .iter()
                .map(|skipped| (skipped.path.clone(), skipped.reason.clone()))
                .collect::<Vec<_>>(),
            [(PathBuf::from("a-link"), SkipReason::Link)]
        );
        assert_eq!(
            fs::read_to_string(parent.join("README.md")).unwrap(),
            "# changed by the child\n"
        );
        assert_eq!(fs::read(parent.join("image.bin")).unwrap(), binary);
        assert_eq!(
            fs::read_to_string(parent.join("new/dir/added.txt")).unwrap(),
            "added\n"
        );
        assert!(parent.join("line\nbreak.txt").exists());
        assert!(parent.join(bytes_path(b"caf\xe9")).exists());
        assert!(!parent.join("gone-soon.txt").exists());
        assert!(
            !parent.join("src/deep").exists(),
            "a directory emptied by deletions goes, as with git apply"
        );
        assert_eq!(
            fs::metadata(parent.join("src/lib.rs"))
                .unwrap()
                .permissions()
                .mode()
                & 0o111,
            0o111
        );
        assert!(!parent.join("target").exists() && !parent.join("trace.log").exists());
        assert!(!parent.join("a-link").exists());
        let leftovers: Vec<_> = snapshot(&parent)
            .into_keys()
            .filter(|path| path.to_string_lossy().contains(".box-merge-"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        assert!(fs::read_dir(&lock_dir).unwrap().all(|entry| {
            !entry
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".journal")
        }));

        // The base now describes the merged state: merging again is a no-op.
        let again = merge(
            &child,
            &parent,
            &mut forked.base,
            &MergeOptions::default(),
            &lock_dir,
        )
        .unwrap();
        assert_eq!(
            (again.merged.len(), again.deleted.len()),
            (0, 0),
            "{again:?}"
        );
        // And a later change merges alone.
        write(&child, "README.md", "# second round\n");
        let later = merge(
            &child,
            &parent,
            &mut forked.base,
            &MergeOptions::default(),
            &lock_dir,
        )
        .unwrap();
        assert_eq!(paths(&later.merged), ["README.md"]);
    }
}

#[test]
fn a_clean_child_merges_nothing_and_leaves_the_parent_alone() {
    let scratch = Scratch::new();
    let parent = scratch.path("parent");
    repository(&parent);
    let (child, mut forked) = fork_in(&scratch, &parent, "child", Mode::Auto);
    let before = snapshot(&parent);
    let merged = merge(
        &child,
        &parent,
        &mut forked.base,
        &MergeOptions::default(),
        &scratch.path("locks"),
    )
    .unwrap();
    assert_eq!(merged, Merged::default());
    assert_eq!(snapshot(&parent), before);
}

#[test]
fn a_conflicting_merge_changes_nothing_and_names_the_paths() {
    let scratch = Scratch::new();
    let parent = scratch.path("parent");
    repository(&parent);
    let (child, mut forked) = fork_in(&scratch, &parent, "child", Mode::Auto);
    write(&child, "README.md", "child's readme\n");
    write(&child, "src/lib.rs", "child's lib\n");
    write(&child, "both-added.txt", "child's\n");
    write(&child, "fine.txt", "no conflict here\n");
    fs::remove_file(child.join("gone-soon.txt")).unwrap();
    write(&parent, "README.md", "parent's readme\n");
    write(&parent, "both-added.txt", "parent's\n");
    write(
        &parent,
        "gone-soon.txt",
        "the parent edited what the child deleted\n",
    );
    // The same change on both sides is no conflict.
    write(&parent, "src/lib.rs", "child's lib\n");
    let before = snapshot(&parent);
    let error = merge(
        &child,
        &parent,
        &mut forked.base,
        &MergeOptions::default(),
        &scratch.path("locks"),
    )
    .unwrap_err();
    let Error::Conflict { paths: conflicts } = &error else {
        panic!("not a conflict: {error}");
    };
    assert_eq!(
        paths(conflicts),
        ["README.md", "both-added.txt", "gone-soon.txt"]
    );
    let message = error.to_string();
    assert!(
        message.contains("README.md") && message.contains("theirs"),
        "{message}"
    );
    assert_eq!(snapshot(&parent), before, "byte for byte");
    assert_eq!(
        fs::read_to_string(child.join("README.md")).unwrap(),
        "child's readme\n",
        "the child is intact"
    );
}

#[test]
fn theirs_lets_the_child_win() {
    let scratch = Scratch::new();
    let parent = scratch.path("parent");
    repository(&parent);
    let (child, mut forked) = fork_in(&scratch, &parent, "child", Mode::Auto);
    write(&child, "README.md", "child's readme\n");
    fs::remove_file(child.join("gone-soon.txt")).unwrap();
    write(&parent, "README.md", "parent's readme\n");
    write(&parent, "gone-soon.txt", "edited by the parent\n");
    let merged = merge(
        &child,
        &parent,
        &mut forked.base,
        &MergeOptions { theirs: true },
        &scratch.path("locks"),
    )
    .unwrap();
    assert_eq!(paths(&merged.merged), ["README.md"]);
    assert_eq!(paths(&merged.deleted), ["gone-soon.txt"]);
    assert_eq!(
        fs::read_to_string(parent.join("README.md")).unwrap(),
        "child's readme\n"
    );
    assert!(!parent.join("gone-soon.txt").exists());
}

#[test]
fn a_change_behind_a_link_in_the_parent_is_refused_even_with_theirs() {
    let scratch = Scratch::new();
    let parent = scratch.path("parent");
    repository(&parent);
    let outside = scratch.path("outside");
    write(&outside, "nested.txt", "outside the parent\n");
    let (child, mut forked) = fork_in(&scratch, &parent, "child", Mode::Auto);
    write(&child, "src/deep/nested.txt", "written through the link?\n");
    write(&child, "README.md", "fine on its own\n");
    // The parent swaps a directory for a link out of its tree.
    fs::remove_dir_all(parent.join("src/deep")).unwrap();
    std::os::unix::fs::symlink(&outside, parent.join("src/deep")).unwrap();
    let before = snapshot(&parent);
    for theirs in [false, true] {
        let error = merge(
            &child,
            &parent,
            &mut forked.base,
            &MergeOptions { theirs },
            &scratch.path("locks"),
        )
        .unwrap_err();
        let Error::Refused { refusals } = &error else {
            panic!("not refused: {error}");
        };
        assert_eq!(refusals.len(), 1, "{error}");
        assert_eq!(refusals[0].path, Path::new("src/deep/nested.txt"));
        assert!(refusals[0].reason.contains("symbolic link"), "{error}");
    }
    assert_eq!(snapshot(&parent), before);
    assert_eq!(
        fs::read_to_string(outside.join("nested.txt")).unwrap(),
        "outside the parent\n"
    );
}

#[test]
fn a_file_replaced_by_a_link_in_the_parent_is_refused() {
    let scratch = Scratch::new();
    let parent = scratch.path("parent");
    repository(&parent);
    let outside = scratch.path("outside.txt");
    fs::write(&outside, "outside\n").unwrap();
    let (child, mut forked) = fork_in(&scratch, &parent, "child", Mode::Auto);
    write(&child, "README.md", "child\n");
    fs::remove_file(parent.join("README.md")).unwrap();
    std::os::unix::fs::symlink(&outside, parent.join("README.md")).unwrap();
    let error = merge(
        &child,
        &parent,
        &mut forked.base,
        &MergeOptions { theirs: true },
        &scratch.path("locks"),
    )
    .unwrap_err();
    assert!(matches!(error, Error::Refused { .. }), "{error}");
    assert_eq!(fs::read_to_string(&outside).unwrap(), "outside\n");
}

#[test]
fn tracked_files_merge_even_when_ignored_and_untracked_ignored_ones_do_not() {
    let scratch = Scratch::new();
    let parent = scratch.path("parent");
    repository(&parent);
    write(
        &parent,
        "target/tracked.txt",
        "tracked despite the ignore rule\n",
    );
    git(&parent, &["add", "-f", "target/tracked.txt"]);
    git(
        &parent,
        &["commit", "-q", "-m", "tracked in an ignored dir"],
    );
    let (child, mut forked) = fork_in(&scratch, &parent, "child", Mode::Worktree);
    write(&child, "target/tracked.txt", "changed\n");
    write(&child, "target/untracked.txt", "build output\n");
    // The child's own rules decide: a new rule ignores a new file.
    write(&child, ".gitignore", "/target\n*.log\n/scratch.txt\n");
    write(&child, "scratch.txt", "ignored by the child's new rule\n");
    let merged = merge(
        &child,
        &parent,
        &mut forked.base,
        &MergeOptions::default(),
        &scratch.path("locks"),
    )
    .unwrap();
    assert_eq!(paths(&merged.merged), [".gitignore", "target/tracked.txt"]);
    assert!(!parent.join("target/untracked.txt").exists());
    assert!(!parent.join("scratch.txt").exists());
}

#[test]
fn concurrent_merges_into_one_parent_are_serialized_and_both_land() {
    let scratch = Scratch::new();
    let parent = scratch.path("parent");
    repository(&parent);
    let (first, mut first_fork) = fork_in(&scratch, &parent, "first", Mode::Worktree);
    let (second, mut second_fork) = fork_in(&scratch, &parent, "second", Mode::Copy);
    for index in 0..50 {
        write(
            &first,
            format!("first/{index}.txt"),
            format!("first {index}\n"),
        );
        write(
            &second,
            format!("second/{index}.txt"),
            format!("second {index}\n"),
        );
    }
    write(&first, "README.md", "first's readme\n");
    write(&second, "src/lib.rs", "second's lib\n");
    let lock_dir = scratch.path("locks");

    // While the lock is held, neither merge can start.
    let held = lock_parent(&parent, &lock_dir).unwrap();
    let (done, finished) = mpsc::channel();
    std::thread::scope(|scope| {
        for (child, base) in [
            (&first, &mut first_fork.base),
            (&second, &mut second_fork.base),
        ] {
            let done = done.clone();
            let (parent, lock_dir) = (&parent, &lock_dir);
            scope.spawn(move || {
                let merged =
                    merge(child, parent, base, &MergeOptions::default(), lock_dir).unwrap();
                done.send(merged.merged.len()).unwrap();
            });
        }
        assert!(
            finished.recv_timeout(Duration::from_millis(300)).is_err(),
            "a merge ran while the lock was held"
        );
        drop(held);
        let mut counts = [finished.recv().unwrap(), finished.recv().unwrap()];
        counts.sort_unstable();
        assert_eq!(counts, [51, 51]);
    });
    assert_eq!(
        fs::read_to_string(parent.join("README.md")).unwrap(),
        "first's readme\n"
    );
    assert_eq!(
        fs::read_to_string(parent.join("src/lib.rs")).unwrap(),
        "second's lib\n"
    );
    for index in 0..50 {
        assert_eq!(
            fs::read_to_string(parent.join(format!("first/{index}.txt"))).unwrap(),
            format!("first {index}\n")
        );
        assert_eq!(
            fs::read_to_string(parent.join(format!("second/{index}.txt"))).unwrap(),
            format!("second {index}\n")
        );
    }
}

#[test]
fn merges_into_different_parents_do_not_wait_for_each_other() {
    let scratch = Scratch::new();
    let one = scratch.path("one");
    let two = scratch.path("two");
    repository(&one);
    repository(&two);
    let (child, mut forked) = fork_in(&scratch, &two, "child", Mode::Auto);
    write(
        &child,
        "README.md",
        "merged while another parent is locked\n",
    );
    let lock_dir = scratch.path("locks");
    let _held = lock_parent(&one, &lock_dir).unwrap();
    let merged = merge(
        &child,
        &two,
        &mut forked.base,
        &MergeOptions::default(),
        &lock_dir,
    )
    .unwrap();
    assert_eq!(paths(&merged.merged), ["README.md"]);
}

#[test]
fn a_merge_refuses_a_different_child_or_a_replaced_parent() {
    let scratch = Scratch::new();
    let parent = scratch.path("parent");
    repository(&parent);
    let (child, mut forked) = fork_in(&scratch, &parent, "child", Mode::Auto);
    let (other, _) = fork_in(&scratch, &parent, "other", Mode::Auto);
    let error = merge(
        &other,
        &parent,
        &mut forked.base,
        &MergeOptions::default(),
        &scratch.path("locks"),
    )
    .unwrap_err();
    assert!(matches!(error, Error::WrongChild { .. }), "{error}");
    fs::rename(&parent, scratch.path("moved")).unwrap();
    repository(&parent);
    write(&child, "README.md", "x\n");
    let error = merge(
        &child,
        &parent,
        &mut forked.base,
        &MergeOptions::default(),
        &scratch.path("locks"),
    )
    .unwrap_err();
    assert!(matches!(error, Error::ParentReplaced(_)), "{error}");
}

/// A root host merging into another user's checkout (a root caller's unit
/// runs as the workspace's owner) leaves files and directories of that
/// user, not root's: what the merge writes takes the owner of the directory
/// it lands in.
#[test]
fn a_root_merge_into_a_users_checkout_leaves_that_users_files() {
    use std::os::unix::fs::MetadataExt as _;
    if !nix::unistd::geteuid().is_root() {
        eprintln!("\n*** NOT RUN: the rule is a root host's, and this test runs as non-root ***\n");
        return;
    }
    let scratch = Scratch::new();
    let parent = scratch.path("parent");
    write(&parent, "kept.txt", "kept\n");
    write(&parent, "src/lib.rs", "pub fn one() -> u32 { 1 }\n");
    for path in [
        parent.clone(),
        parent.join("kept.txt"),
        parent.join("src"),
        parent.join("src/lib.rs"),
    ] {
        std::os::unix::fs::chown(&path, Some(1000), Some(1000)).unwrap();
    }
    let (child, mut forked) = fork_in(&scratch, &parent, "child", Mode::Copy);
    write(&child, "src/lib.rs", "pub fn one() -> u32 { 2 }\n");
    write(&child, "new/dir/added.txt", "added\n");
    let merged = merge(
        &child,
        &parent,
        &mut forked.base,
        &MergeOptions::default(),
        &scratch.path("locks"),
    )
    .unwrap();
    assert_eq!(paths(&merged.merged), ["new/dir/added.txt", "src/lib.rs"]);
    for path in ["src/lib.rs", "new", "new/dir", "new/dir/added.txt"] {
        let meta = fs::symlink_metadata(parent.join(path)).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (1000, 1000), "{path}");
    }
}
