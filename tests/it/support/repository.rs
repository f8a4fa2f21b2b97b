//! A directory made a git repository with one commit, apart from any git
//! configuration of the machine's; the integration tests and the benchmarks
//! (by `#[path]`) share it.

use std::path::Path;
use std::process::Command;

/// `dir`, as it is, made a git repository on `main` with everything in it
/// committed once; git's global and system configuration ignored.
pub fn commit_all(dir: &Path) {
    for args in [
        &["init", "-q", "-b", "main"][..],
        &["add", "-A"],
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.com",
            "commit",
            "-qm",
            "base",
        ],
    ] {
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
    }
}
