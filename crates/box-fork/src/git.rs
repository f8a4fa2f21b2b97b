//! The one way this crate runs git: [`Git`], configured by the caller.
//!
//! Every command gets an explicit `--git-dir` (and `--work-tree` where it
//! needs one), runs from `/` with a cleared environment plus the caller's
//! variables (box passes its git neutralisation: `GIT_CONFIG_NOSYSTEM`,
//! `GIT_CONFIG_GLOBAL=/dev/null`, the `GIT_CONFIG_COUNT` overrides), and
//! the flags this crate always needs: `-c core.hooksPath=/dev/null` and
//! `-c core.fsmonitor=false` on every command, and overrides for every
//! filter, diff and merge driver the parent's configuration defines before
//! `git status` reads its working tree. The caller's variables that would
//! move the repository (`GIT_DIR`, `GIT_INDEX_FILE`, ...) are dropped.
//!
//! Which commands run, and on what (for the confinement the caller installs
//! through [`Confine`]):
//!
//! | command | reads | writes |
//! |---|---|---|
//! | `rev-parse`, `symbolic-ref -q HEAD`, `config --get-regexp` | parent `.git` | nothing |
//! | `status --porcelain=v2 -z` (dirty overlay) | parent `.git` and working tree | nothing (`GIT_OPTIONAL_LOCKS=0`) |
//! | `update-ref refs/box/forks/<id>` (pin, and its removal at discard) | parent `.git` | parent `.git` (refs) |
//! | `init`, `update-ref`, `read-tree -u` on the child | parent objects | the child |
//!
//! Copy mode and merge run no git at all. When this process is root and the
//! repository is a user's, every command runs as that user
//! ([`GitAccess::owner`]) and the child's directory is made theirs first.

use std::ffi::{OsStr, OsString};
use std::io::{self, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use crate::error::{GitError, GitFailure};

/// What one git command needs to reach: given to [`Confine`] so the caller
/// can allow exactly that (landlock: read these, write those).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GitAccess {
    /// Paths the command reads (directories: recursively).
    pub read: Vec<PathBuf>,
    /// Paths the command writes (directories: recursively); also read.
    pub write: Vec<PathBuf>,
    /// Run as this uid and gid, supplementary groups cleared: set when a root
    /// host runs git on a repository a user owns, so git can write that
    /// user's `.git` without root's override and what it makes is theirs.
    pub owner: Option<(u32, u32)>,
}

/// The caller's confinement for the git commands this crate runs.
///
/// `command` returns the [`Command`] that will run git: `Command::new(program)`
/// with a `pre_exec` hook installed (which must be async-signal-safe: build
/// the landlock ruleset or seccomp filter before, only apply it in the hook),
/// or a wrapper such as `box sandbox --read .. --write .. -- git`. The crate
/// then appends git's arguments, clears the environment and sets its own.
pub trait Confine: Send + Sync {
    /// The command that runs `program` confined to `access`.
    fn command(&self, program: &Path, access: &GitAccess) -> io::Result<Command>;
}

/// The runner every git command of this crate goes through.
#[derive(Clone)]
pub struct Git {
    program: PathBuf,
    env: Vec<(OsString, OsString)>,
    confine: Option<Arc<dyn Confine>>,
    timeout: Duration,
    owner: Option<(u32, u32)>,
}

impl std::fmt::Debug for Git {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Git")
            .field("program", &self.program)
            .field("variables", &self.env.len())
            .field("confined", &self.confine.is_some())
            .field("timeout", &self.timeout)
            .field("owner", &self.owner)
            .finish()
    }
}

/// Variables the caller may not pass: this crate says where the repository
/// is, and a trace variable would write wherever it names.
fn is_dropped(name: &OsStr) -> bool {
    let name = name.as_encoded_bytes();
    const DROPPED: &[&[u8]] = &[
        b"GIT_DIR",
        b"GIT_WORK_TREE",
        b"GIT_INDEX_FILE",
        b"GIT_OBJECT_DIRECTORY",
        b"GIT_ALTERNATE_OBJECT_DIRECTORIES",
        b"GIT_COMMON_DIR",
        b"GIT_NAMESPACE",
        b"GIT_PREFIX",
        b"GIT_QUARANTINE_PATH",
        b"GIT_SHALLOW_FILE",
        b"GIT_GRAFT_FILE",
        b"GIT_REPLACE_REF_BASE",
        b"GIT_TEMPLATE_DIR",
        b"GIT_IMPLICIT_WORK_TREE",
        b"GIT_INTERNAL_SUPER_PREFIX",
    ];
    DROPPED.contains(&name) || name.starts_with(b"GIT_TRACE")
}

/// How long a git command may run unless the caller says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// At most this much of a failed command's stderr is kept.
const STDERR_KEPT: usize = 2048;

impl Git {
    /// A runner that starts `git` (looked up on the `PATH` in `env`) with
    /// exactly the variables `env`, unconfined, killed after 120 s.
    pub fn new<I, K, V>(env: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<OsString>,
        V: Into<OsString>,
    {
        Self {
            program: PathBuf::from("git"),
            env: env
                .into_iter()
                .map(|(name, value)| (name.into(), value.into()))
                .filter(|(name, _)| !is_dropped(name))
                .collect(),
            confine: None,
            timeout: DEFAULT_TIMEOUT,
            owner: None,
        }
    }

    /// Run this git binary instead of `git` from the `PATH`.
    pub fn with_program(mut self, program: impl Into<PathBuf>) -> Self {
        self.program = program.into();
        self
    }

    /// Confine every command through `confine`.
    pub fn with_confinement(mut self, confine: Arc<dyn Confine>) -> Self {
        self.confine = Some(confine);
        self
    }

    /// Kill a command that runs longer than `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// This runner for commands on `path`'s repository: when this process is
    /// root and `path` is owned by another user, git runs as that user (root
    /// runs git without the capabilities that would let it write their files).
    pub(crate) fn for_owner_of(&self, path: &Path) -> Self {
        let mut git = self.clone();
        git.owner = owner_of(path);
        git
    }

    /// The uid and gid git runs as, when not this process's.
    pub(crate) fn owner(&self) -> Option<(u32, u32)> {
        self.owner
    }

    /// Run one command; its stdout when it exits 0.
    pub(crate) fn run(&self, invocation: &Invocation<'_>) -> Result<Vec<u8>, GitError> {
        let failed = |failure| GitError {
            command: invocation.describe(),
            repository: invocation.git_dir.to_path_buf(),
            failure,
        };
        let access = GitAccess {
            owner: self.owner,
            ..invocation.access.clone()
        };
        let mut command = match &self.confine {
            Some(confine) => confine
                .command(&self.program, &access)
                .map_err(|error| failed(GitFailure::Spawn(error)))?,
            None => {
                let mut command = Command::new(&self.program);
                // std clears the supplementary groups when root sets a uid.
                if let Some((uid, gid)) = self.owner {
                    command.uid(uid).gid(gid);
                }
                command
            }
        };
        command
            .args(invocation.arguments())
            .env_clear()
            .envs(self.env.iter().map(|(name, value)| (name, value)))
            .env("GIT_TERMINAL_PROMPT", "0")
            .envs(invocation.env.iter().map(|(name, value)| (name, value)))
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut child = command
            .spawn()
            .map_err(|error| failed(GitFailure::Spawn(error)))?;
        let pid = child.id();
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        // Both pipes are drained on threads so a full one cannot stall git.
        let out_reader = std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut stdout) = stdout {
                let _ = stdout.read_to_end(&mut bytes);
            }
            bytes
        });
        let err_reader = std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut stderr) = stderr {
                let _ = stderr.read_to_end(&mut bytes);
            }
            bytes
        });
        let (sender, receiver) = mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let _ = sender.send(child.wait());
        });
        let status = match receiver.recv_timeout(self.timeout) {
            Ok(status) => status,
            Err(_) => {
                if let Ok(pid) = i32::try_from(pid) {
                    let _ = nix::sys::signal::killpg(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                let _ = waiter.join();
                let _ = out_reader.join();
                let _ = err_reader.join();
                return Err(failed(GitFailure::Timeout(self.timeout)));
            }
        };
        let _ = waiter.join();
        let stdout = out_reader.join().unwrap_or_default();
        let stderr = err_reader.join().unwrap_or_default();
        let status = status.map_err(|error| failed(GitFailure::Spawn(error)))?;
        if status.success() {
            return Ok(stdout);
        }
        let stderr = String::from_utf8_lossy(&stderr);
        let stderr = stderr.trim();
        let start = stderr.len().saturating_sub(STDERR_KEPT);
        let start = (start..stderr.len())
            .find(|index| stderr.is_char_boundary(*index))
            .unwrap_or(0);
        Err(failed(GitFailure::Exit {
            code: status.code(),
            stderr: stderr[start..].to_owned(),
        }))
    }
}

/// The owner of `path` when this process is root and `path` is not root's.
pub(crate) fn owner_of(path: &Path) -> Option<(u32, u32)> {
    use std::os::unix::fs::MetadataExt as _;
    if !nix::unistd::geteuid().is_root() {
        return None;
    }
    let meta = std::fs::metadata(path).ok()?;
    (meta.uid() != 0).then(|| (meta.uid(), meta.gid()))
}

/// One git command: where, what, with which extra settings.
pub(crate) struct Invocation<'a> {
    pub git_dir: &'a Path,
    pub work_tree: Option<&'a Path>,
    /// Extra `-c key=value`, after the crate's own.
    pub config: Vec<(String, String)>,
    /// Extra variables, after the caller's.
    pub env: Vec<(&'static str, OsString)>,
    pub args: Vec<OsString>,
    pub access: GitAccess,
}

impl<'a> Invocation<'a> {
    /// `git --git-dir=<git_dir> <args>`.
    pub fn new(git_dir: &'a Path, args: &[&str], access: GitAccess) -> Self {
        Self {
            git_dir,
            work_tree: None,
            config: Vec::new(),
            env: Vec::new(),
            args: args.iter().map(OsString::from).collect(),
            access,
        }
    }

    fn arguments(&self) -> Vec<OsString> {
        let mut arguments = Vec::with_capacity(8 + 2 * self.config.len() + self.args.len());
        let mut git_dir = OsString::from("--git-dir=");
        git_dir.push(self.git_dir);
        arguments.push(git_dir);
        if let Some(work_tree) = self.work_tree {
            let mut flag = OsString::from("--work-tree=");
            flag.push(work_tree);
            arguments.push(flag);
        }
        arguments.push("--no-pager".into());
        for (key, value) in [("core.hooksPath", "/dev/null"), ("core.fsmonitor", "false")]
            .into_iter()
            .map(|(key, value)| (key.to_owned(), value.to_owned()))
            .chain(self.config.iter().cloned())
        {
            arguments.push("-c".into());
            arguments.push(format!("{key}={value}").into());
        }
        arguments.extend(self.args.iter().cloned());
        arguments
    }

    fn describe(&self) -> String {
        self.args
            .iter()
            .map(|arg| arg.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn location_and_trace_variables_are_dropped() {
        let git = Git::new([
            ("GIT_DIR", "/elsewhere"),
            ("GIT_INDEX_FILE", "/tmp/index"),
            ("GIT_TRACE2_EVENT", "/tmp/trace"),
            ("GIT_CONFIG_COUNT", "1"),
            ("PATH", "/usr/bin"),
        ]);
        let names: Vec<_> = git
            .env
            .iter()
            .map(|(name, _)| name.to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["GIT_CONFIG_COUNT", "PATH"]);
    }

    #[test]
    fn hooks_and_fsmonitor_are_always_off() {
        let invocation =
            Invocation::new(Path::new("/repo/.git"), &["status"], GitAccess::default());
        let arguments: Vec<String> = invocation
            .arguments()
            .iter()
            .map(|arg| arg.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            arguments,
            [
                "--git-dir=/repo/.git",
                "--no-pager",
                "-c",
                "core.hooksPath=/dev/null",
                "-c",
                "core.fsmonitor=false",
                "status"
            ]
        );
    }
}
