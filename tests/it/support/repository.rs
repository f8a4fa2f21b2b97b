//! Git run on the host apart from any configuration of the machine's, and a
//! directory made a repository with one commit; the integration tests and
//! the benchmarks (by `#[path]`) share it.

use std::path::Path;
use std::process::Command;

/// `dir`, as it is, made a git repository on `main` with everything in it
/// committed once; git's global and system configuration ignored.
pub fn commit_all(dir: &Path) {
    git(dir, &["init", "-q", "-b", "main"]);
    git(dir, &["add", "-A"]);
    git(
        dir,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.com",
            "commit",
            "-qm",
            "base",
        ],
    );
}

/// `git ARGS` in `dir`, git's global and system configuration ignored: its
/// trimmed stdout; a failure fails the caller, naming git's stderr.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let output = Command::new("git")
        .current_dir(dir)
        .args(args)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}
