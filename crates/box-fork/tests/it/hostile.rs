use std::fs;
use std::path::{Path, PathBuf};

use box_fork::{MergeOptions, Mode, Options, discard, fork, merge};

use crate::support::{Scratch, chmod, git, git_command, neutral_git, repository, write};

/// The canaries that fired so far (`fired-<vector>` files).
fn fired(canaries: &Path) -> Vec<String> {
    let mut fired: Vec<String> = fs::read_dir(canaries)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("fired-"))
        .collect();
    fired.sort();
    fired
}

/// A repository whose configuration, hooks and attributes run
/// `canaries/canary.sh <vector>` at every chance git gives them.
fn hostile_parent(scratch: &Scratch) -> (PathBuf, PathBuf) {
    let canaries = scratch.path("canaries");
    let canary = canaries.join("canary.sh");
    write(
        &canaries,
        "canary.sh",
        format!(
            "#!/bin/sh\ntouch \"{}/fired-$1\"\ncat\n",
            canaries.display()
        ),
    );
    chmod(&canaries, "canary.sh", 0o755);
    let run = |vector: &str| format!("{} {vector}", canary.display());
    write(
        &canaries,
        "included.config",
        format!("[core]\n\tfsmonitor = {}\n", run("included-fsmonitor")),
    );
    for (dir, prefix) in [(canaries.join("hooks"), "hookspath")] {
        for hook in [
            "post-checkout",
            "pre-commit",
            "reference-transaction",
            "post-index-change",
            "pre-auto-gc",
        ] {
            write(
                &dir,
                hook,
                format!("#!/bin/sh\n{}\n", run(&format!("{prefix}-{hook}"))),
            );
            chmod(&dir, hook, 0o755);
        }
    }

    let parent = scratch.path("parent");
    repository(&parent);
    write(
        &parent,
        ".gitattributes",
        "* filter=evil diff=evil merge=evil\n",
    );
    git(&parent, &["add", ".gitattributes"]);
    git(
        &parent,
        &["commit", "-q", "-m", "attributes naming a driver"],
    );
    for hook in [
        "post-checkout",
        "pre-commit",
        "reference-transaction",
        "post-index-change",
        "pre-auto-gc",
    ] {
        write(
            &parent,
            Path::new(".git/hooks").join(hook),
            format!("#!/bin/sh\n{}\n", run(&format!("hook-{hook}"))),
        );
        chmod(&parent, Path::new(".git/hooks").join(hook), 0o755);
    }
    write(&parent, ".git/info/attributes", "* filter=evil diff=evil\n");
    let mut config = fs::read_to_string(parent.join(".git/config")).unwrap();
    config.push_str(&format!(
        "[core]\n\tfsmonitor = {fsmonitor}\n\thooksPath = {hooks}\n\tpager = {pager}\n\teditor = {editor}\n\tsshCommand = {ssh}\n\tworktree = /\n\
[filter \"evil\"]\n\tclean = {clean}\n\tsmudge = {smudge}\n\tprocess = {process}\n\trequired = true\n\
[diff \"evil\"]\n\ttextconv = {textconv}\n\tcommand = {command}\n\
[diff]\n\texternal = {external}\n\
[merge \"evil\"]\n\tdriver = {driver}\n\
[credential]\n\thelper = !{credential}\n\
[uploadpack]\n\tpackObjectsHook = {pack}\n\
[hook \"evil\"]\n\tcommand = {confighook}\n\tevent = post-checkout\n\tevent = reference-transaction\n\
[include]\n\tpath = {include}\n",
        fsmonitor = run("fsmonitor"),
        hooks = canaries.join("hooks").display(),
        pager = run("pager"),
        editor = run("editor"),
        ssh = run("ssh"),
        clean = run("clean"),
        smudge = run("smudge"),
        process = run("process"),
        textconv = run("textconv"),
        command = run("diff-command"),
        external = run("external-diff"),
        driver = run("merge-driver"),
        credential = run("credential"),
        pack = run("pack-objects-hook"),
        confighook = run("config-hook"),
        include = canaries.join("included.config").display(),
    ));
    fs::write(parent.join(".git/config"), config).unwrap();
    // An embedded bare repository with its own configuration.
    write(&parent, "vendor/bare.git/HEAD", "ref: refs/heads/main\n");
    write(
        &parent,
        "vendor/bare.git/config",
        format!(
            "[core]\n\tbare = true\n\tfsmonitor = {}\n",
            run("bare-fsmonitor")
        ),
    );
    fs::create_dir_all(parent.join("vendor/bare.git/objects")).unwrap();
    fs::create_dir_all(parent.join("vendor/bare.git/refs/heads")).unwrap();
    // Uncommitted work: git must hash it (the clean filter's chance).
    write(&parent, "README.md", "modified, stat-dirty\n");
    write(&parent, "src/lib.rs", "modified too\n");
    write(&parent, "untracked.txt", "untracked\n");
    (parent, canaries)
}

#[test]
fn a_hostile_repository_runs_nothing_during_fork_merge_and_discard() {
    let scratch = Scratch::new();
    let (parent, canaries) = hostile_parent(&scratch);
    let git_runner = neutral_git();
    let lock_dir = scratch.path("locks");

    let worktree_child = scratch.path("worktree-child");
    let mut worktree = fork(&git_runner, &parent, &worktree_child, &Options::default()).unwrap();
    assert!(worktree.advisory.is_none(), "{:?}", worktree.advisory);
    assert_eq!(fired(&canaries), Vec::<String>::new(), "worktree fork");
    assert_eq!(
        fs::read_to_string(worktree_child.join("README.md")).unwrap(),
        "modified, stat-dirty\n"
    );
    assert!(
        worktree_child.join("vendor/bare.git/config").exists(),
        "the bare repository comes as files"
    );
    let child_config = fs::read_to_string(worktree_child.join(".git/config")).unwrap();
    assert!(
        !child_config.contains("canary"),
        "the child's config is its own:\n{child_config}"
    );

    let copy_child = scratch.path("copy-child");
    let mut copy = fork(
        &git_runner,
        &parent,
        &copy_child,
        &Options {
            mode: Mode::Copy,
            ..Options::default()
        },
    )
    .unwrap();
    assert_eq!(fired(&canaries), Vec::<String>::new(), "copy fork");

    write(&worktree_child, "README.md", "merged back\n");
    write(&worktree_child, "new.txt", "new\n");
    merge(
        &worktree_child,
        &parent,
        &mut worktree.base,
        &MergeOptions::default(),
        &lock_dir,
    )
    .unwrap();
    write(&copy_child, "src/lib.rs", "merged back from the copy\n");
    merge(
        &copy_child,
        &parent,
        &mut copy.base,
        &MergeOptions::default(),
        &lock_dir,
    )
    .unwrap();
    assert_eq!(fired(&canaries), Vec::<String>::new(), "merge");

    discard(&git_runner, &worktree_child, &worktree.base).unwrap();
    discard(&git_runner, &copy_child, &copy.base).unwrap();
    assert_eq!(fired(&canaries), Vec::<String>::new(), "discard");

    // The canaries are live: plain git on the same repository fires them.
    let output = git_command(&parent)
        .arg("--git-dir")
        .arg(parent.join(".git"))
        .arg("--work-tree")
        .arg(&parent)
        .args(["status", "--porcelain"])
        .output()
        .unwrap();
    let fired = fired(&canaries);
    assert!(
        fired.iter().any(|name| name.contains("fsmonitor"))
            && fired
                .iter()
                .any(|name| name == "fired-process" || name == "fired-clean"),
        "plain git status fired {fired:?} ({})",
        String::from_utf8_lossy(&output.stderr)
    );
}
