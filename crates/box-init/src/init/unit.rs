//! The unit's processes as the init sees them: reaping, and killing them all.
//!
//! As PID 1 of a pid namespace (docker, the local backend with a pid
//! namespace) "all" is exact: `kill(-1, SIGKILL)` reaches every process in the
//! namespace (including ones entered by `docker exec` and nested namespaces)
//! except the init itself.
//!
//! Not PID 1 (the local backend without a pid namespace, or a test), the init
//! is a child subreaper, so every descendant that loses its parent is
//! re-parented to it rather than escaping; "all" is then every process whose
//! parent chain leads to the init, found in `/proc` and killed round after
//! round until none is left (a process forking during a round is caught in
//! the next). Not covered there: processes started outside that tree (another
//! login of the same user, a daemon's activation such as a D-Bus or systemd
//! user service spawned on the unit's behalf) and processes the init may not
//! signal (another uid after a set-uid exec, which no_new_privs prevents in the
//! local backend).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid, waitpid};
use nix::unistd::Pid;

use crate::protocol::ExitReport;

/// How long the init waits for killed processes to be reaped before it goes
/// on regardless (a process in uninterruptible sleep dies when it wakes).
const REAP_AFTER_KILL: Duration = Duration::from_secs(2);

/// Kill rounds before giving up on a tree that keeps changing.
const KILL_ROUNDS: usize = 100;

/// The init's children, reaped as they end.
#[derive(Debug)]
pub(crate) struct Reaper {
    pid1: bool,
    executor: Pid,
    /// How the executor ended, once it has been reaped.
    pub executor_exit: Option<ExitReport>,
}

impl Reaper {
    pub fn new(pid1: bool, executor: Pid) -> Self {
        Self {
            pid1,
            executor,
            executor_exit: None,
        }
    }

    /// Reaps every child that has ended; returns how many.
    pub fn reap(&mut self) -> u32 {
        let mut reaped = 0;
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => {
                    reaped += 1;
                    self.note(pid, ExitReport::Code(code));
                }
                Ok(WaitStatus::Signaled(pid, signal, _)) => {
                    reaped += 1;
                    self.note(pid, ExitReport::Signal(signal as i32));
                }
                Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return reaped,
                Ok(_) | Err(Errno::EINTR) => continue,
                Err(error) => {
                    tracing::warn!(%error, "waitpid failed");
                    return reaped;
                }
            }
        }
    }

    fn note(&mut self, pid: Pid, exit: ExitReport) {
        if pid == self.executor {
            match exit {
                ExitReport::Code(exit_code) => tracing::info!(exit_code, "the executor ended"),
                ExitReport::Signal(signal) => {
                    let signal = crate::protocol::signal_name(signal);
                    tracing::info!(%signal, "the executor ended")
                }
            }
            self.executor_exit = Some(exit);
        }
    }

    /// Whether the init has children left (ended ones included until reaped).
    fn has_children(&self) -> bool {
        // WNOWAIT: look without reaping, so `reap` still sees the executor.
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        !matches!(waitid(Id::All, flags), Err(Errno::ECHILD))
    }

    /// Kills every process of the unit but the init, then reaps them; returns
    /// how many were killed (as PID 1: how many were reaped after the kill).
    pub async fn kill_all(&mut self) -> u32 {
        let killed = if self.pid1 {
            match kill(Pid::from_raw(-1), Signal::SIGKILL) {
                Ok(()) | Err(Errno::ESRCH) => {}
                Err(error) => tracing::warn!(%error, "kill(-1, SIGKILL) failed"),
            }
            self.reap_until_gone().await
        } else {
            // The executor by its pid first: `/proc` need not show it (the
            // local helper's supervisor sees the unit's own `/proc`, where
            // the init it started has no parent), and its end takes a pid
            // namespace with it.
            let mut killed = HashSet::new();
            if self.executor_exit.is_none() && kill(self.executor, Signal::SIGKILL).is_ok() {
                killed.insert(self.executor);
            }
            let killed = self.kill_descendants(killed).await;
            self.reap_until_gone().await;
            killed
        };
        tracing::info!(killed, "killed the unit's processes");
        killed
    }

    /// Kills every descendant, round after round; returns how many were
    /// killed, counting those in `killed` already.
    async fn kill_descendants(&mut self, mut killed: HashSet<Pid>) -> u32 {
        for _ in 0..KILL_ROUNDS {
            let alive = descendants_of(Pid::this());
            if alive.is_empty() {
                break;
            }
            for pid in alive {
                match kill(pid, Signal::SIGKILL) {
                    Ok(()) => {
                        killed.insert(pid);
                    }
                    Err(Errno::ESRCH) => {}
                    Err(error) => {
                        tracing::warn!(pid = pid.as_raw(), %error, "cannot kill a process of the unit")
                    }
                }
            }
            self.reap();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        u32::try_from(killed.len()).unwrap_or(u32::MAX)
    }

    async fn reap_until_gone(&mut self) -> u32 {
        let deadline = tokio::time::Instant::now() + REAP_AFTER_KILL;
        let mut reaped = self.reap();
        while self.has_children() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
            reaped += self.reap();
        }
        reaped
    }
}

/// The live (not zombie) processes whose parent chain leads to `root`.
pub(crate) fn descendants_of(root: Pid) -> Vec<Pid> {
    let table = process_table();
    let mut children: HashMap<Pid, Vec<Pid>> = HashMap::new();
    for (&pid, entry) in &table {
        children.entry(entry.parent).or_default().push(pid);
    }
    let mut found = Vec::new();
    let mut queue = vec![root];
    while let Some(parent) = queue.pop() {
        for &child in children.get(&parent).map(Vec::as_slice).unwrap_or_default() {
            if child != root {
                queue.push(child);
                if table.get(&child).is_some_and(|entry| !entry.zombie) {
                    found.push(child);
                }
            }
        }
    }
    found
}

struct Entry {
    parent: Pid,
    zombie: bool,
}

/// Every process in `/proc`, with its parent and whether it is a zombie.
fn process_table() -> HashMap<Pid, Entry> {
    let mut table = HashMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return table;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<i32>().ok())
        else {
            continue;
        };
        // Gone since the listing, or unreadable: nothing to do with it.
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        if let Some((state, parent)) = parse_stat(&stat) {
            table.insert(
                Pid::from_raw(pid),
                Entry {
                    parent: Pid::from_raw(parent),
                    zombie: state == 'Z' || state == 'X',
                },
            );
        }
    }
    table
}

/// State and parent pid from `/proc/PID/stat` (`pid (comm) S ppid ...`; the
/// command may itself hold spaces and parentheses, so split after the last
/// `)`).
fn parse_stat(stat: &str) -> Option<(char, i32)> {
    let after = &stat[stat.rfind(')')? + 1..];
    let mut fields = after.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let parent = fields.next()?.parse().ok()?;
    Some((state, parent))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_awkward_command_names_parse() {
        assert_eq!(parse_stat("42 (cat) S 7 42 42 0 -1"), Some(('S', 7)));
        assert_eq!(parse_stat("42 (a) (b) Z 1 0"), Some(('Z', 1)));
        assert_eq!(parse_stat("42 (x y) R 9"), Some(('R', 9)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn a_child_is_a_descendant_and_the_root_is_not() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let found = descendants_of(Pid::this());
        assert!(
            found.contains(&Pid::from_raw(child.id() as i32)),
            "{found:?}"
        );
        assert!(!found.contains(&Pid::this()));
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
