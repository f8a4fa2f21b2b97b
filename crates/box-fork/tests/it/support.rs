//! Helpers: the neutralising git runner (box's own set, from
//! `box_scrub`), a plain git for building fixtures, and tree snapshots.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use box_fork::Git;

/// `HOME` and `XDG_CONFIG_HOME` for every git the tests run: a directory
/// that does not exist holds no configuration, and leaves nothing behind.
fn empty_home() -> &'static Path {
    Path::new("/nonexistent/box-fork-home")
}

/// The environment box gives git (`box confine`'s): no system or global
/// config, box's git neutralisation (`box_scrub`), prompts and pagers off.
pub fn neutral_env() -> Vec<(String, String)> {
    let home = empty_home().display().to_string();
    let mut env = vec![
        ("PATH".to_owned(), "/usr/local/bin:/usr/bin:/bin".to_owned()),
        ("HOME".to_owned(), home.clone()),
        ("XDG_CONFIG_HOME".to_owned(), home),
        ("GIT_CONFIG_NOSYSTEM".to_owned(), "1".to_owned()),
        ("GIT_CONFIG_GLOBAL".to_owned(), "/dev/null".to_owned()),
    ];
    env.extend(box_scrub::git_neutralisation());
    env
}

/// The runner the tests give the crate.
pub fn neutral_git() -> Git {
    Git::new(neutral_env())
}

/// Plain git for building fixtures (no system or global config, a fixed
/// identity); panics with the output when it fails.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let output = git_command(dir).args(args).output().unwrap();
    assert!(
        output.status.success(),
        "git {args:?} in {}: {}\n{}",
        dir.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The fixture git as a command, to run with other arguments.
pub fn git_command(dir: &Path) -> Command {
    let mut command = Command::new("git");
    command
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "user.name=Box Test",
            "-c",
            "user.email=box@example.invalid",
            "-c",
            "init.defaultBranch=main",
        ])
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", empty_home())
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null");
    command
}

/// Write `contents` at `dir/path`, making directories.
pub fn write(dir: &Path, path: impl AsRef<Path>, contents: impl AsRef<[u8]>) {
    let path = dir.join(path);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, contents).unwrap();
}

/// Set the permission bits of `dir/path`.
pub fn chmod(dir: &Path, path: impl AsRef<Path>, mode: u32) {
    fs::set_permissions(dir.join(path), fs::Permissions::from_mode(mode)).unwrap();
}

/// A repository at `dir` with a few committed files, on branch `main`.
pub fn repository(dir: &Path) {
    fs::create_dir_all(dir).unwrap();
    git(dir, &["init", "-q"]);
    write(dir, "README.md", "# fixture\n");
    write(dir, "src/lib.rs", "pub fn one() -> u32 { 1 }\n");
    write(dir, "src/deep/nested.txt", "nested\n");
    write(dir, "tool.sh", "#!/bin/sh\necho tool\n");
    chmod(dir, "tool.sh", 0o755);
    write(
        dir,
        "image.bin",
        (0u8..=255).cycle().take(4096).collect::<Vec<_>>(),
    );
    write(dir, "gone-soon.txt", "to be deleted\n");
    write(dir, ".gitignore", "/target\n*.log\n");
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "fixture"]);
}

/// One entry of a snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    File { mode: u32, bytes: Vec<u8> },
    Dir { mode: u32 },
    Link(PathBuf),
    Other,
}

/// Everything below `root` (`.git` included), by relative path.
pub fn snapshot(root: &Path) -> BTreeMap<PathBuf, Node> {
    let mut nodes = BTreeMap::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(relative) = pending.pop() {
        for entry in fs::read_dir(root.join(&relative)).unwrap() {
            let entry = entry.unwrap();
            let path = relative.join(entry.file_name());
            let metadata = entry.path().symlink_metadata().unwrap();
            let mode = metadata.permissions().mode() & 0o7777;
            let node = if metadata.is_symlink() {
                Node::Link(fs::read_link(entry.path()).unwrap())
            } else if metadata.is_dir() {
                pending.push(path.clone());
                Node::Dir { mode }
            } else if metadata.is_file() {
                Node::File {
                    mode,
                    bytes: fs::read(entry.path()).unwrap(),
                }
            } else {
                Node::Other
            };
            nodes.insert(path, node);
        }
    }
    nodes
}

/// `snapshot` without anything under `.git`.
pub fn worktree_snapshot(root: &Path) -> BTreeMap<PathBuf, Node> {
    snapshot(root)
        .into_iter()
        .filter(|(path, _)| !path.starts_with(".git"))
        .collect()
}

/// A path from bytes (for names that are not UTF-8).
pub fn bytes_path(bytes: &[u8]) -> PathBuf {
    PathBuf::from(OsStr::from_bytes(bytes))
}

/// A temporary directory for one test: parent, children and locks inside.
pub struct Scratch {
    pub dir: tempfile::TempDir,
}

impl Scratch {
    pub fn new() -> Self {
        Self {
            dir: tempfile::Builder::new()
                .prefix("box-fork-test")
                .tempdir()
                .unwrap(),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}
