//! The bash tool: run a line in the workspace (own process group, killed as a
//! group on timeout or cancel, the scrubbed environment, git neutralised), and
//! its facts claim.
//!
//! The child gets no stdin and one pipe for both stdout and stderr, so the
//! output is interleaved exactly as written. The pipe is read continuously
//! into bounded buffers (the first 50 KiB kept, the rest counted; a 4 KiB
//! progress tail), so a flood neither blocks the child nor grows memory.
//!
//! Every run gets the git-neutralising environment (box is stricter than the
//! dax reference, which adds it to stamped runs only). A stamped run
//! (`dax_stamp`) re-analyses the line (`shell`), refuses it when the analysis
//! or its stamp changed, and runs the rendered plan instead of the line, with
//! the repository's attribute drivers neutralised too and `GOTOOLCHAIN=local`.
//!
//! Not here: landlock and no_new_privs for children (`sandbox`), and the
//! process methods (`process`).

pub(crate) mod analysis;

use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use serde_json::{Map, Value};
use tokio::io::AsyncReadExt;
use tokio_util::sync::CancellationToken;

use super::facts::Facts;
use super::process::kill_group;
use super::{BashOutput, Context, Progress, ToolOutcome};

/// The timeout when the call names none (or a non-positive one).
const DEFAULT_TIMEOUT_SECS: u64 = 120;
/// The longest timeout a call may ask for (a day); more is taken as this.
const MAX_TIMEOUT_SECS: u64 = 24 * 60 * 60;
/// The output a result keeps; the rest is counted.
const MAX_OUTPUT_BYTES: usize = 50 * 1024;
/// The most output one progress report carries (its tail).
const PROGRESS_BYTES: usize = 4096;
/// At most one progress report per this interval.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(250);
/// How long output is still read after bash exited while a background
/// process it left holds the pipe open (Go's `WaitDelay`): then the call
/// returns and leaves that process running.
const WAIT_DELAY: Duration = Duration::from_secs(1);
/// One read from the output pipe.
const READ_CHUNK: usize = 16 * 1024;

/// The refusal of a stamped line whose analysis or stamp no longer holds.
pub(crate) const CHANGED: &str = "the command changed since it was allowed (a file, where a path leads or the repository's git configuration is different now); ask again";

/// Run the bash tool with already key-checked arguments.
pub(crate) async fn call(
    context: &Arc<Context>,
    arguments: &Map<String, Value>,
    progress: Progress,
    cancel: CancellationToken,
) -> ToolOutcome {
    let command = match arguments.get("command") {
        Some(Value::String(command)) => command.clone(),
        Some(_) => return ToolOutcome::error("command must be a string"),
        None => return ToolOutcome::error("command is required"),
    };
    let timeout = match timeout_from(arguments) {
        Ok(timeout) => timeout,
        Err(message) => return ToolOutcome::error(message),
    };
    let (script, env, stamped) = match arguments.get("dax_stamp") {
        None => (command, scrub_git(), false),
        // The re-analysis reads files and runs git: blocking work.
        Some(Value::String(stamp)) => match blocking({
            let (context, command, stamp) = (Arc::clone(context), command.clone(), stamp.clone());
            move || {
                analysis::verify(&context, &command, &stamp).map(|plan| {
                    let env = box_scrub::git_neutralisation_with_drivers(&plan.drivers);
                    (plan, env)
                })
            }
        })
        .await
        .flatten()
        {
            Some((plan, mut env)) => {
                env.push(("GOTOOLCHAIN".to_owned(), "local".to_owned()));
                // `cd DIR` goes where the analysis looked, not along CDPATH.
                env.push(("CDPATH".to_owned(), String::new()));
                // The plan's commands come from where the analysis assumed,
                // not from a directory the workspace can write.
                if let Some(path) = stamped_path(&context.child_env, context.workspace.root()) {
                    env.push(("PATH".to_owned(), path));
                }
                (plan.rendered, env, true)
            }
            None => return ToolOutcome::error(CHANGED),
        },
        Some(_) => return ToolOutcome::error(CHANGED),
    };
    let run = match run(context, &script, &env, timeout, progress, cancel).await {
        Ok(run) => run,
        Err(message) => return ToolOutcome::error(message),
    };
    let mut text = run.render(timeout, context.bash_output);
    if stamped {
        text = redact_userinfo(&text);
    }
    ToolOutcome {
        failed: !matches!(run.end, End::Exited(0)),
        text,
        is_error: false,
    }
}

/// The bash tool's facts claim (conservative: never less than the line can touch).
///
/// Blocking: it reads files and runs git (the repository probe, at most 10 s
/// each); call it from `spawn_blocking`.
pub(crate) fn facts(context: &Context, arguments: &Map<String, Value>) -> Result<Facts, String> {
    let command = match arguments.get("command") {
        Some(Value::String(command)) => command.as_str(),
        Some(_) => return Err("command must be a string".to_owned()),
        None => "",
    };
    analysis::facts(context, command, arguments)
}

/// Run blocking work (file reads, git probes, each up to 10 s) on the
/// blocking pool, so the runtime's thread keeps serving; `None` if it panicked.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    tokio::task::spawn_blocking(work).await.ok()
}

/// The neutralising variables every run gets.
fn scrub_git() -> Vec<(String, String)> {
    box_scrub::git_neutralisation()
}

/// The child's `PATH` without the entries a workspace write could plant a
/// `git` or `cat` in: empty (the current directory), relative, or inside the
/// root. `None` when the child has no `PATH`.
fn stamped_path(env: &[(std::ffi::OsString, std::ffi::OsString)], root: &Path) -> Option<String> {
    let (_, value) = env.iter().find(|(name, _)| name == "PATH")?;
    let kept: Vec<&str> = value
        .to_str()?
        .split(':')
        .filter(|entry| {
            let entry = Path::new(entry);
            entry.is_absolute() && !entry.starts_with(root)
        })
        .collect();
    Some(kept.join(":"))
}

/// `timeout_seconds`, default 120; zero or negative means the default.
fn timeout_from(arguments: &Map<String, Value>) -> Result<Duration, String> {
    let seconds = match arguments.get("timeout_seconds") {
        None | Some(Value::Null) => DEFAULT_TIMEOUT_SECS,
        Some(Value::Number(number)) => match (number.as_i64(), number.as_u64(), number.as_f64()) {
            (Some(seconds), _, _) if seconds <= 0 => DEFAULT_TIMEOUT_SECS,
            (_, Some(seconds), _) => seconds.min(MAX_TIMEOUT_SECS),
            // A whole number written as a float (`5.0`, `1e12`): bounded first, so the cast is exact.
            (_, _, Some(seconds)) if seconds.fract() == 0.0 => {
                if seconds <= 0.0 {
                    DEFAULT_TIMEOUT_SECS
                } else {
                    seconds.min(MAX_TIMEOUT_SECS as f64) as u64
                }
            }
            _ => return Err(format!("timeout_seconds must be an integer, not {number}")),
        },
        Some(other) => return Err(format!("timeout_seconds must be an integer, not {other}")),
    };
    Ok(Duration::from_secs(seconds))
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// bash exited with this status (`-1` when a signal ended it).
    Exited(i32),
    /// The timeout fired and the group was killed.
    TimedOut,
    /// The call was cancelled and the group was killed.
    Canceled,
}

/// What a run produced.
#[derive(Debug)]
struct Run {
    output: Output,
    end: End,
    /// Processes the kernel's OOM killer killed in this unit's memory cgroup
    /// while the run lasted (its counter moved), where the cgroup is readable.
    oom_kills: u64,
}

impl Run {
    /// The result text: the kept output (terminal controls escaped unless
    /// raw), the truncation note, a newline if needed, then how it ended.
    fn render(&self, timeout: Duration, mode: BashOutput) -> String {
        let mut text = shown(&self.output.kept, mode);
        if self.output.omitted > 0 {
            text.push_str(&format!(
                "\n... [truncated, {} bytes omitted]",
                self.output.omitted
            ));
        }
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        // bash only says "Killed": the cgroup's counter says why.
        if self.oom_kills > 0 {
            text.push_str(&format!(
                "[out of memory: the kernel's OOM killer killed {} process{} in this unit while the command ran]\n",
                self.oom_kills,
                if self.oom_kills == 1 { "" } else { "es" }
            ));
        }
        match self.end {
            End::Exited(code) => text.push_str(&format!("[exit {code}]")),
            End::TimedOut => text.push_str(&format!("[killed after {}]", go_duration(timeout))),
            End::Canceled => text.push_str("[canceled]"),
        }
        text
    }
}

/// The output of a run, bounded: the head kept, the rest counted, and the
/// progress tail since the last report.
#[derive(Debug, Default)]
struct Output {
    kept: Vec<u8>,
    omitted: u64,
    pending: Vec<u8>,
}

impl Output {
    fn push(&mut self, bytes: &[u8]) {
        let room = MAX_OUTPUT_BYTES.saturating_sub(self.kept.len());
        let (head, rest) = bytes.split_at(room.min(bytes.len()));
        self.kept.extend_from_slice(head);
        self.omitted += rest.len() as u64;
        let tail = &bytes[bytes.len().saturating_sub(PROGRESS_BYTES)..];
        self.pending.extend_from_slice(tail);
        if self.pending.len() > PROGRESS_BYTES {
            let excess = self.pending.len() - PROGRESS_BYTES;
            self.pending.drain(..excess);
        }
    }

    fn report(&mut self, progress: &Progress, mode: BashOutput) {
        if self.pending.is_empty() {
            return;
        }
        if let Some(sender) = progress {
            // Lossy on purpose: a full channel drops the update, never the call.
            let _ = sender.try_send(shown(&self.pending, mode));
        }
        self.pending.clear();
    }
}

/// Output bytes as text for the client: UTF-8 (lossy), with terminal control
/// characters made visible unless the executor was asked for raw output.
fn shown(bytes: &[u8], mode: BashOutput) -> String {
    let text = String::from_utf8_lossy(bytes);
    match mode {
        BashOutput::Raw => text.into_owned(),
        BashOutput::Escape => super::names::escape_controls(&text).into_owned(),
    }
}

/// The bash binary: the usual places first, so a child environment without
/// `PATH` still finds it.
fn bash_path() -> &'static str {
    static BASH: LazyLock<&'static str> = LazyLock::new(|| {
        ["/bin/bash", "/usr/bin/bash", "/usr/local/bin/bash"]
            .into_iter()
            .find(|path| Path::new(path).exists())
            .unwrap_or("bash")
    });
    &BASH
}

/// What the client is told when bash did not start. box needs nothing from a
/// unit's image, but this tool needs the image's bash: a missing one is said
/// as such, with what still works.
fn start_failed(bash: &str, root: &Path, error: &std::io::Error) -> String {
    if error.kind() == std::io::ErrorKind::NotFound && !Path::new(bash).exists() {
        return "bash: this unit's image has no bash (looked for /bin/bash, /usr/bin/bash, /usr/local/bin/bash and on PATH): the bash tool needs one; use an image with bash, or the tools that need nothing from the image (read, write, edit, glob, grep, ls, copy, move, remove)".to_owned();
    }
    format!("bash: cannot start {bash} in {}: {error}", root.display())
}

/// Run `bash -c script` at the workspace root with the child environment plus
/// `extra`, until it exits, the timeout fires or `cancel` does.
async fn run(
    context: &Context,
    script: &str,
    extra: &[(String, String)],
    timeout: Duration,
    progress: Progress,
    cancel: CancellationToken,
) -> Result<Run, String> {
    let (reader, writer) =
        std::io::pipe().map_err(|error| format!("bash: cannot make a pipe: {error}"))?;
    let writer_err = writer
        .try_clone()
        .map_err(|error| format!("bash: cannot make a pipe: {error}"))?;
    let mut command = tokio::process::Command::new(bash_path());
    command
        .arg("-c")
        .arg(script)
        .current_dir(context.workspace.root())
        .env_clear()
        .envs(context.child_env.iter().map(|(name, value)| (name, value)))
        .envs(extra.iter().map(|(name, value)| (name, value)))
        .stdin(Stdio::null())
        .stdout(Stdio::from(writer))
        .stderr(Stdio::from(writer_err))
        .process_group(0)
        .kill_on_drop(true);
    let oom_before = oom_kills();
    let spawned = command.spawn();
    // The command holds the parent's copies of the pipe's write end: drop it,
    // or the pipe never reaches end of file.
    drop(command);
    let mut child =
        spawned.map_err(|error| start_failed(bash_path(), context.workspace.root(), &error))?;
    let group = child.id();
    // If this future is dropped mid-run (the caller gave up without the
    // token), the group dies with it.
    let mut guard = GroupGuard(group);
    let mut reader = tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(reader))
        .map_err(|error| format!("bash: cannot read its output: {error}"))?;

    let mut output = Output::default();
    let mut chunk = vec![0_u8; READ_CHUNK];
    let mut ticker = tokio::time::interval(PROGRESS_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let drain = tokio::time::sleep(Duration::MAX);
    tokio::pin!(drain);
    let mut eof = false;
    let mut exited: Option<i32> = None;
    let end = loop {
        if eof && let Some(code) = exited {
            break End::Exited(code);
        }
        tokio::select! {
            read = reader.read(&mut chunk), if !eof => match read {
                Ok(0) | Err(_) => eof = true,
                Ok(count) => output.push(&chunk[..count]),
            },
            status = child.wait(), if exited.is_none() => {
                exited = Some(status.ok().and_then(|status| status.code()).unwrap_or(-1));
                drain.as_mut().reset(tokio::time::Instant::now() + WAIT_DELAY);
            }
            _ = ticker.tick() => output.report(&progress, context.bash_output),
            () = &mut drain, if exited.is_some() => {
                // A background process holds the pipe: stop reading, leave it running.
                break End::Exited(exited.unwrap_or(-1));
            }
            () = &mut deadline => {
                end_group(&mut child, group).await;
                break match exited {
                    Some(code) => End::Exited(code),
                    None => End::TimedOut,
                };
            }
            () = cancel.cancelled() => {
                end_group(&mut child, group).await;
                break End::Canceled;
            }
        }
    };
    // What the killed group wrote before it died is still in the pipe.
    if matches!(end, End::TimedOut | End::Canceled) {
        drain_ready(&mut reader, &mut output, &mut chunk).await;
    }
    // A finished run leaves what it put in the background running.
    guard.0 = None;
    let oom_kills = match (oom_before, oom_kills()) {
        (Some(before), Some(after)) => after.saturating_sub(before),
        _ => 0,
    };
    Ok(Run {
        output,
        end,
        oom_kills,
    })
}

/// The OOM kill counter of this process's memory cgroup: `oom_kill` in
/// `memory.events` (cgroup v2) or `memory.oom_control` (v1), at the cgroup's
/// own path, else at the mount's root (what a container with its own cgroup
/// namespace, or docker's v1 mounts, show as its own). `None` when unreadable.
fn oom_kills() -> Option<u64> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mut candidates = Vec::new();
    for line in cgroups.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if controllers.is_empty() {
            candidates.push(format!("/sys/fs/cgroup{path}/memory.events"));
            candidates.push("/sys/fs/cgroup/memory.events".to_owned());
        } else if controllers.split(',').any(|name| name == "memory") {
            candidates.push(format!("/sys/fs/cgroup/memory{path}/memory.oom_control"));
            candidates.push("/sys/fs/cgroup/memory/memory.oom_control".to_owned());
        }
    }
    candidates.iter().find_map(|path| {
        std::fs::read_to_string(path).ok().and_then(|text| {
            text.lines()
                .find_map(|line| line.strip_prefix("oom_kill "))
                .and_then(|count| count.trim().parse().ok())
        })
    })
}

/// Kills a process group when dropped while armed.
struct GroupGuard(Option<u32>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(group) = self.0 {
            kill_group(group, nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// Kill the whole group, then reap bash so nothing is left a zombie.
async fn end_group(child: &mut tokio::process::Child, group: Option<u32>) {
    if let Some(group) = group {
        kill_group(group, nix::sys::signal::Signal::SIGKILL);
    }
    let _ = child.kill().await;
}

/// Read what is already in the pipe, without waiting for writers that may
/// have escaped the group.
async fn drain_ready(
    reader: &mut tokio::net::unix::pipe::Receiver,
    output: &mut Output,
    chunk: &mut [u8],
) {
    let window = tokio::time::sleep(Duration::from_millis(100));
    tokio::pin!(window);
    loop {
        tokio::select! {
            read = reader.read(chunk) => match read {
                Ok(0) | Err(_) => return,
                Ok(count) => output.push(&chunk[..count]),
            },
            () = &mut window => return,
        }
    }
}

/// A whole number of seconds in Go's `time.Duration` format: `2m0s`, `1h0m0s`, `5s`.
fn go_duration(duration: Duration) -> String {
    let seconds = duration.as_secs();
    let (hours, minutes, seconds) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
    if hours > 0 {
        format!("{hours}h{minutes}m{seconds}s")
    } else if minutes > 0 {
        format!("{minutes}m{seconds}s")
    } else {
        format!("{seconds}s")
    }
}

/// `scheme://user:pass@` → `scheme://***@` (the dax reference's regex).
fn redact_userinfo(text: &str) -> String {
    static USERINFO: LazyLock<Option<regex::Regex>> =
        LazyLock::new(|| regex::Regex::new(r"(://)[^/@\s]+@").ok());
    match USERINFO.as_ref() {
        Some(userinfo) => userinfo.replace_all(text, "${1}***@").into_owned(),
        None => text.to_owned(),
    }
}

#[cfg(test)]
pub(crate) mod tests;
