//! The process methods (`agentworkspace/process.*`): start, write, read,
//! closeStdin, signal, wait, close, with the wire's bounds.
//!
//! A session uses them to run its MCP stdio servers inside the unit. Each
//! process runs in its own process group, with the scrubbed environment plus
//! the entries the start names, at the workspace root or a directory inside
//! it. Its stdout and stderr are read by tasks into buffers of at most 64 KiB
//! unread each: stdout past that waits (back-pressure, like a full pipe),
//! stderr past that is dropped. Ending a process (close, the timeout, the
//! executor stopping) always ends its whole group, then reaps it.
//!
//! A box extension beyond the dax wire: `process.start` with `tty: {rows,
//! cols}` gives the process a new pseudo-terminal as its stdin, stdout,
//! stderr and controlling terminal (its own session, so job control and ^C
//! work as in a terminal); its output is read as fd 1 (fd 2 is at end of file
//! at once), a write goes to the terminal's input, closeStdin types the
//! terminal's end-of-file key (^D) each time the process has read all typed
//! before it (so it is read as one, whatever mode the terminal is in then),
//! and [`RESIZE_METHOD`] changes its size. Only box's own client (`box run -t`)
//! sends it; a dax client never does, and gets pipes as before. The terminal
//! is opened in the unit's own devpts, by the executor, so the process keeps
//! every layer of its confinement.
//!
//! Not here: the per-session table split (one `Processes` per session is the
//! server's choice), landlock for children (`sandbox`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use nix::sys::signal::Signal;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use super::Context;

/// The method prefix the process methods share.
pub(crate) const METHOD_PREFIX: &str = "agentworkspace/process.";
/// A process's start: traced as `process.start` when the host traces it.
pub(crate) const START_METHOD: &str = "agentworkspace/process.start";
/// box's extension: resize a process's terminal (`{id, rows, cols}`).
pub(crate) const RESIZE_METHOD: &str = "box/process.resize";

/// The most processes open at once (`MaxProcesses`).
pub(crate) const MAX_PROCESSES: usize = 32;
/// The most bytes one write may carry (`MaxWriteBytes`).
pub(crate) const MAX_WRITE_BYTES: usize = 1024 * 1024;
/// The most bytes one read returns, and the most unread bytes held per stream.
pub(crate) const MAX_READ_BYTES: usize = 64 * 1024;
/// How long close waits after closing stdin, and again after SIGTERM.
const GRACE: Duration = Duration::from_secs(2);
/// One read from a child's pipe.
const PIPE_CHUNK: usize = 16 * 1024;

/// A process method's failure, sent as a JSON-RPC error with this message.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct ProcessError(pub String);

fn error(message: impl Into<String>) -> ProcessError {
    ProcessError(message.into())
}

/// One executor's processes.
pub(crate) struct Processes {
    context: Arc<Context>,
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    next: u64,
    open: HashMap<String, Arc<Process>>,
    stopping: bool,
}

/// Why the executor ended a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    Timeout,
    Canceled,
}

impl Ended {
    fn as_str(self) -> &'static str {
        match self {
            Ended::Timeout => "timeout",
            Ended::Canceled => "canceled",
        }
    }
}

/// How a process exited.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Exit {
    /// The exit code; `-1` when a signal ended it.
    status: i32,
    /// A wait failure, if waiting failed.
    error: Option<String>,
}

/// Where a process's input goes: its stdin pipe, or its terminal's master.
type Input = Box<dyn tokio::io::AsyncWrite + Send + Unpin>;

/// One running (or exited, not yet closed) process.
struct Process {
    /// The group leader's pid, which is the group id.
    group: u32,
    stdin: tokio::sync::Mutex<Option<Input>>,
    /// The process's terminal, when it was started with one.
    tty: Option<Tty>,
    stdin_closed: CancellationToken,
    stdout: Arc<Stream>,
    stderr: Option<Arc<Stream>>,
    exit: watch::Receiver<Option<Exit>>,
    ended: Mutex<Option<Ended>>,
    /// Cancels the timeout task once the process is closed.
    timer: CancellationToken,
}

/// One output stream's unread bytes.
#[derive(Default)]
struct Stream {
    state: Mutex<StreamState>,
    /// Readers wait on this for data or end of file.
    readable: Notify,
    /// The stdout pump waits on this for room.
    writable: Notify,
}

#[derive(Default)]
struct StreamState {
    unread: Vec<u8>,
    eof: bool,
    /// Nobody will read again (the process was closed): the pump stops.
    abandoned: bool,
}

/// What a stream does when its buffer is full.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Full {
    /// Stop reading the pipe until a read makes room (stdout).
    Wait,
    /// Keep reading and drop what does not fit (stderr).
    Drop,
}

impl Stream {
    fn lock(&self) -> std::sync::MutexGuard<'_, StreamState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Copy a pipe into the buffer until end of file.
    async fn pump(self: Arc<Self>, mut pipe: impl AsyncRead + Unpin, full: Full) {
        let mut chunk = vec![0_u8; PIPE_CHUNK];
        loop {
            let room = loop {
                let room_ready = self.writable.notified();
                tokio::pin!(room_ready);
                room_ready.as_mut().enable();
                let (abandoned, room) = {
                    let state = self.lock();
                    (
                        state.abandoned,
                        MAX_READ_BYTES.saturating_sub(state.unread.len()),
                    )
                };
                if abandoned {
                    return;
                }
                if room > 0 || full == Full::Drop {
                    break room;
                }
                room_ready.await;
            };
            let want = match full {
                Full::Wait => room.min(PIPE_CHUNK),
                Full::Drop => PIPE_CHUNK,
            };
            match pipe.read(&mut chunk[..want]).await {
                Ok(0) | Err(_) => break,
                Ok(count) => {
                    let mut state = self.lock();
                    let room = MAX_READ_BYTES.saturating_sub(state.unread.len());
                    let keep = count.min(room);
                    state.unread.extend_from_slice(&chunk[..keep]);
                    drop(state);
                    self.readable.notify_waiters();
                }
            }
        }
        self.lock().eof = true;
        self.readable.notify_waiters();
    }

    /// Wait for data or end of file; take at most `max` bytes.
    async fn read(&self, max: usize) -> (Vec<u8>, bool) {
        loop {
            let ready = self.readable.notified();
            tokio::pin!(ready);
            ready.as_mut().enable();
            {
                let mut state = self.lock();
                if !state.unread.is_empty() || state.eof {
                    let take = state.unread.len().min(max);
                    let data: Vec<u8> = state.unread.drain(..take).collect();
                    let eof = state.eof && state.unread.is_empty();
                    drop(state);
                    self.writable.notify_waiters();
                    return (data, eof);
                }
            }
            ready.await;
        }
    }

    /// Stop the pump and free the buffer: nobody will read again.
    fn abandon(&self) {
        let mut state = self.lock();
        state.abandoned = true;
        state.unread = Vec::new();
        drop(state);
        self.writable.notify_waiters();
    }

    /// Take everything unread without waiting.
    fn take(&self) -> Vec<u8> {
        let data = std::mem::take(&mut self.lock().unread);
        self.writable.notify_waiters();
        data
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StartParams {
    args: Vec<String>,
    #[serde(default)]
    dir: String,
    #[serde(default)]
    env: Vec<String>,
    #[serde(default)]
    timeout_ms: i64,
    #[serde(default)]
    stderr: bool,
    /// box's extension: a terminal of this size instead of pipes.
    #[serde(default)]
    tty: Option<TtySize>,
}

/// A terminal's size, in characters.
#[derive(Deserialize, Clone, Copy)]
struct TtySize {
    rows: u16,
    cols: u16,
}

#[derive(Deserialize)]
struct ResizeParams {
    id: String,
    rows: u16,
    cols: u16,
}

#[derive(Deserialize)]
struct IdParams {
    id: String,
}

#[derive(Deserialize)]
struct WriteParams {
    id: String,
    #[serde(default)]
    data: String,
}

#[derive(Deserialize)]
struct ReadParams {
    id: String,
    fd: i64,
    #[serde(default)]
    max: i64,
}

#[derive(Deserialize)]
struct SignalParams {
    id: String,
    signal: String,
}

fn parse<T: for<'de> Deserialize<'de>>(op: &str, params: Value) -> Result<T, ProcessError> {
    let params = if params.is_null() { json!({}) } else { params };
    serde_json::from_value(params)
        .map_err(|problem| error(format!("process.{op}: invalid params: {problem}")))
}

impl Processes {
    /// An empty table.
    pub fn new(context: Arc<Context>) -> Self {
        Self {
            context,
            table: Mutex::new(Table::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Answer `agentworkspace/process.<op>` with `params`.
    pub async fn handle(&self, op: &str, params: Value) -> Result<Value, ProcessError> {
        match op {
            "start" => self.start(parse(op, params)?),
            "write" => self.write(parse(op, params)?).await,
            "read" => self.read(parse(op, params)?).await,
            "closeStdin" => {
                let params: IdParams = parse(op, params)?;
                let process = self.get(&params.id)?;
                process.close_stdin().await;
                Ok(json!({}))
            }
            "signal" => self.signal(parse(op, params)?),
            "wait" => {
                let params: IdParams = parse(op, params)?;
                let process = self.get(&params.id)?;
                Ok(process.wait().await)
            }
            "close" => {
                let params: IdParams = parse(op, params)?;
                let process = self
                    .lock()
                    .open
                    .remove(&params.id)
                    .ok_or_else(|| error("no such process in this session"))?;
                Ok(process.close(None).await)
            }
            other => Err(error(format!(
                "unknown process method {METHOD_PREFIX}{other}; use start, write, read, closeStdin, signal, wait or close"
            ))),
        }
    }

    /// Answer [`RESIZE_METHOD`]: set the size of a process's terminal (its
    /// foreground group gets SIGWINCH from the kernel).
    pub fn resize(&self, params: Value) -> Result<Value, ProcessError> {
        let params: ResizeParams = parse("resize", params)?;
        let process = self.get(&params.id)?;
        let Some(Tty { master, .. }) = &process.tty else {
            return Err(error(
                "the process has no terminal; start it with tty: {rows, cols} to resize it",
            ));
        };
        set_size(master, params.rows, params.cols)
            .map_err(|problem| error(format!("resize the terminal: {problem}")))?;
        Ok(json!({}))
    }

    /// End every process (stdin closed, grace, TERM, KILL) and refuse new starts.
    pub async fn shutdown(&self) {
        let processes: Vec<Arc<Process>> = {
            let mut table = self.lock();
            table.stopping = true;
            table.open.drain().map(|(_, process)| process).collect()
        };
        futures::future::join_all(
            processes
                .iter()
                .map(|process| process.close(Some(Ended::Canceled))),
        )
        .await;
    }

    fn get(&self, id: &str) -> Result<Arc<Process>, ProcessError> {
        self.lock()
            .open
            .get(id)
            .cloned()
            .ok_or_else(|| error("no such process in this session"))
    }

    fn start(&self, params: StartParams) -> Result<Value, ProcessError> {
        if self.lock().stopping {
            return Err(error("the executor is stopping"));
        }
        let Some(program) = params.args.first().filter(|program| !program.is_empty()) else {
            return Err(error("no command"));
        };
        if params.timeout_ms < 0 {
            return Err(error("a negative timeout"));
        }
        let mut env = Vec::with_capacity(params.env.len());
        for entry in &params.env {
            let Some((name, value)) = entry.split_once('=').filter(|(name, _)| !name.is_empty())
            else {
                return Err(error(format!("env entry {entry:?} is not NAME=value")));
            };
            env.push((name.to_owned(), value.to_owned()));
        }
        let dir = self.directory(&params.dir)?;
        // Hold the table across the count check and the insert so two starts
        // cannot both take the 32nd place.
        let mut table = self.lock();
        if table.stopping {
            return Err(error("the executor is stopping"));
        }
        if table.open.len() >= MAX_PROCESSES {
            return Err(error(format!(
                "{MAX_PROCESSES} processes are open in this session, the most there may be; close one first"
            )));
        }
        let mut command = tokio::process::Command::new(program);
        command
            .args(&params.args[1..])
            .current_dir(&dir)
            .env_clear()
            .envs(
                self.context
                    .child_env
                    .iter()
                    .map(|(name, value)| (name, value)),
            )
            // Every child the executor starts runs git neutralised (an MCP
            // server that shells out to git included); the caller's own
            // entries come last, so a process asked for explicitly can still
            // set what it needs.
            .envs(box_scrub::git_neutralisation())
            .envs(env)
            .kill_on_drop(true);
        let tty = match params.tty {
            Some(size) => Some(
                Terminal::open(size)
                    .map_err(|problem| error(format!("start {program}: a terminal: {problem}")))?,
            ),
            None => None,
        };
        match &tty {
            Some(terminal) => terminal
                .attach(&mut command)
                .map_err(|problem| error(format!("start {program}: a terminal: {problem}")))?,
            None => {
                command
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(if params.stderr {
                        Stdio::piped()
                    } else {
                        Stdio::null()
                    })
                    .process_group(0);
            }
        }
        let spawned = command.spawn();
        // The command holds the terminal's other side: dropped now, so the
        // master reads end of file once the process and its children let go.
        drop(command);
        let mut child = spawned.map_err(|problem| error(format!("start {program}: {problem}")))?;
        let Some(group) = child.id() else {
            return Err(error(format!(
                "start {program}: it exited before it could be tracked"
            )));
        };
        let stdout = Arc::new(Stream::default());
        let (stdin, stderr, master): (Option<Input>, _, _) = match tty {
            Some(terminal) => {
                let (reader, writer) = terminal
                    .streams()
                    .map_err(|problem| error(format!("start {program}: a terminal: {problem}")))?;
                tokio::spawn(Arc::clone(&stdout).pump(reader, Full::Wait));
                // Standard error is the same terminal: fd 2 has nothing of its own.
                let stderr = params.stderr.then(|| {
                    let stream = Stream::default();
                    stream.lock().eof = true;
                    Arc::new(stream)
                });
                let tty = Tty {
                    master: terminal.master,
                    slave: terminal.slave_path,
                };
                (Some(Box::new(writer)), stderr, Some(tty))
            }
            None => {
                if let Some(pipe) = child.stdout.take() {
                    tokio::spawn(Arc::clone(&stdout).pump(pipe, Full::Wait));
                }
                let stderr = child.stderr.take().map(|pipe| {
                    let stream = Arc::new(Stream::default());
                    tokio::spawn(Arc::clone(&stream).pump(pipe, Full::Drop));
                    stream
                });
                let stdin = child.stdin.take().map(|pipe| Box::new(pipe) as Input);
                (stdin, stderr, None)
            }
        };
        let (exit_sender, exit) = watch::channel(None);
        tokio::spawn(async move {
            let exit = match child.wait().await {
                Ok(status) => Exit {
                    status: status.code().unwrap_or(-1),
                    error: None,
                },
                Err(problem) => Exit {
                    status: -1,
                    error: Some(problem.to_string()),
                },
            };
            let _ = exit_sender.send(Some(exit));
        });
        let process = Arc::new(Process {
            group,
            stdin: tokio::sync::Mutex::new(stdin),
            tty: master,
            stdin_closed: CancellationToken::new(),
            stdout,
            stderr,
            exit,
            ended: Mutex::new(None),
            timer: CancellationToken::new(),
        });
        if params.timeout_ms > 0 {
            let timed = Arc::clone(&process);
            let timeout = Duration::from_millis(params.timeout_ms.unsigned_abs());
            tokio::spawn(async move {
                tokio::select! {
                    () = tokio::time::sleep(timeout) => timed.end_group(Ended::Timeout),
                    () = timed.timer.cancelled() => {}
                }
            });
        }
        table.next += 1;
        let id = format!("p{}", table.next);
        table.open.insert(id.clone(), process);
        Ok(json!({ "id": id }))
    }

    /// The start directory: `""` is the root; anything else is checked
    /// through the workspace (a link out is refused as outside).
    fn directory(&self, raw: &str) -> Result<PathBuf, ProcessError> {
        if raw.is_empty() || raw == "." {
            return Ok(self.context.workspace.root().to_path_buf());
        }
        self.context
            .workspace
            .directory(raw)
            .map_err(|problem| error(format!("dir: {problem}")))
    }

    async fn write(&self, params: WriteParams) -> Result<Value, ProcessError> {
        let process = self.get(&params.id)?;
        // Base64 is 4 bytes per 3: refuse an oversized write before decoding it.
        if params.data.len() / 4 * 3 > MAX_WRITE_BYTES + 3 {
            return Err(error(format!(
                "a write of {} bytes; at most {MAX_WRITE_BYTES}",
                params.data.len() / 4 * 3
            )));
        }
        let data = BASE64
            .decode(params.data.as_bytes())
            .map_err(|problem| error(format!("data: not base64: {problem}")))?;
        if data.len() > MAX_WRITE_BYTES {
            return Err(error(format!(
                "a write of {} bytes; at most {MAX_WRITE_BYTES}",
                data.len()
            )));
        }
        process.write(&data).await?;
        Ok(json!({}))
    }

    async fn read(&self, params: ReadParams) -> Result<Value, ProcessError> {
        let process = self.get(&params.id)?;
        let stream = match params.fd {
            1 => Arc::clone(&process.stdout),
            2 => process
                .stderr
                .clone()
                .ok_or_else(|| error("fd 2: the process was started without stderr: true"))?,
            other => {
                return Err(error(format!(
                    "fd {other}: only 1 (stdout) or 2 (stderr) can be read"
                )));
            }
        };
        let max = match usize::try_from(params.max) {
            Ok(max) if max > 0 && max <= MAX_READ_BYTES => max,
            _ => MAX_READ_BYTES,
        };
        let (data, eof) = stream.read(max).await;
        let mut result = Map::new();
        if !data.is_empty() {
            result.insert("data".to_owned(), Value::String(BASE64.encode(&data)));
        }
        if eof {
            result.insert("eof".to_owned(), Value::Bool(true));
        }
        Ok(Value::Object(result))
    }

    fn signal(&self, params: SignalParams) -> Result<Value, ProcessError> {
        let process = self.get(&params.id)?;
        let signal = match params.signal.as_str() {
            "INT" => Signal::SIGINT,
            "TERM" => Signal::SIGTERM,
            "KILL" => Signal::SIGKILL,
            other => {
                return Err(error(format!(
                    "unknown signal {other:?}; use INT, TERM or KILL"
                )));
            }
        };
        if process.exit.borrow().is_some() {
            return Ok(json!({ "done": true }));
        }
        kill_group(process.group, signal);
        Ok(json!({}))
    }
}

impl Process {
    async fn write(&self, data: &[u8]) -> Result<(), ProcessError> {
        // One write at a time per process; closeStdin cancels a blocked one.
        let mut stdin = tokio::select! {
            stdin = self.stdin.lock() => stdin,
            () = self.stdin_closed.cancelled() => return Err(error("stdin is closed")),
        };
        let Some(pipe) = stdin.as_mut() else {
            return Err(error("stdin is closed"));
        };
        tokio::select! {
            written = pipe.write_all(data) => written
                .map_err(|problem| error(format!("write to the process: {problem}"))),
            () = self.stdin_closed.cancelled() => Err(error("stdin is closed")),
        }
    }

    async fn close_stdin(&self) {
        self.stdin_closed.cancel();
        let input = self.stdin.lock().await.take();
        // A terminal has no end of its input to close (closing the master
        // would hang it up): end of file is typed, as a user would, by a
        // task of its own that waits for the moments it is read as one.
        if let (Some(tty), Some(input)) = (&self.tty, input) {
            tokio::spawn(type_end_of_input(
                tty.slave.clone(),
                input,
                self.exit.clone(),
            ));
        }
    }

    fn exited(&self) -> Option<Exit> {
        self.exit.borrow().clone()
    }

    async fn wait_exit(&self) -> Exit {
        let mut exit = self.exit.clone();
        match exit.wait_for(Option::is_some).await {
            Ok(value) => value.clone().unwrap_or(Exit {
                status: -1,
                error: None,
            }),
            Err(_) => Exit {
                status: -1,
                error: Some("the process's watcher is gone".to_owned()),
            },
        }
    }

    /// Wait for exit up to `limit`.
    async fn exit_within(&self, limit: Duration) -> bool {
        tokio::time::timeout(limit, self.wait_exit()).await.is_ok()
    }

    /// The timeout (or the executor) ends the whole group now.
    fn end_group(&self, why: Ended) {
        if self.exited().is_none() {
            let mut ended = self
                .ended
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            ended.get_or_insert(why);
        }
        kill_group(self.group, Signal::SIGKILL);
    }

    fn outcome(&self, exit: Exit) -> Map<String, Value> {
        let mut result = Map::new();
        result.insert("status".to_owned(), json!(exit.status));
        let ended = *self
            .ended
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(ended) = ended {
            result.insert("ended".to_owned(), json!(ended.as_str()));
        } else if let Some(problem) = exit.error {
            result.insert("error".to_owned(), json!(problem));
        }
        result
    }

    async fn wait(&self) -> Value {
        let exit = self.wait_exit().await;
        Value::Object(self.outcome(exit))
    }

    /// End the process: stdin closed, a grace period, SIGTERM to the group,
    /// another, SIGKILL; then anything left in the group is killed too. The
    /// result says how it ended, with the stderr no read took.
    async fn close(&self, why: Option<Ended>) -> Value {
        self.timer.cancel();
        if let Some(why) = why
            && self.exited().is_none()
        {
            let mut ended = self
                .ended
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            ended.get_or_insert(why);
        }
        self.stdin_closed.cancel();
        // A blocked write sees the cancel and lets go of stdin at once.
        if let Ok(mut stdin) =
            tokio::time::timeout(Duration::from_millis(100), self.stdin.lock()).await
        {
            stdin.take();
        }
        if !self.exit_within(GRACE).await {
            kill_group(self.group, Signal::SIGTERM);
            if !self.exit_within(GRACE).await {
                kill_group(self.group, Signal::SIGKILL);
            }
        }
        let exit = self.wait_exit().await;
        // Leave nothing behind: the leader's children share its group.
        kill_group(self.group, Signal::SIGKILL);
        let mut result = self.outcome(exit);
        if let Some(stderr) = &self.stderr {
            let unread = stderr.take();
            if !unread.is_empty() {
                result.insert("stderr".to_owned(), json!(BASE64.encode(unread)));
            }
            stderr.abandon();
        }
        self.stdout.abandon();
        Value::Object(result)
    }
}

impl Drop for Processes {
    /// A table dropped without `shutdown` (a session gone abruptly) still
    /// leaves nothing running.
    fn drop(&mut self) {
        let table = self
            .table
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for process in table.open.values() {
            if process.exited().is_none() {
                kill_group(process.group, Signal::SIGKILL);
            }
            process.timer.cancel();
            process.stdout.abandon();
            if let Some(stderr) = &process.stderr {
                stderr.abandon();
            }
        }
    }
}

/// ^D: end of file, typed at a terminal whose settings name no other key.
const EOF_KEY: u8 = 0x04;
/// How soon the end-of-input typist looks at the terminal again after it
/// typed, and the longest it waits between looks while input is unread.
const TYPIST_FIRST_LOOK: Duration = Duration::from_millis(5);
const TYPIST_LONGEST_WAIT: Duration = Duration::from_millis(200);
/// The most end-of-file keys typed at a terminal out of line mode, where a
/// program reads them as keys (a line editor ends on one; a full-screen
/// program may ignore them, and is not typed at for ever).
const RAW_EOF_KEYS: u32 = 4;

/// A process's terminal: its master, and the path of its other side (opened
/// again only to look at the terminal: holding it open would keep the master
/// from reading end of file once the process lets go).
struct Tty {
    master: std::os::fd::OwnedFd,
    slave: PathBuf,
}

/// What the terminal's side the process reads looks like now.
#[derive(Debug, PartialEq, Eq)]
enum TerminalInput {
    /// Typed input the process has not read yet.
    Unread,
    /// Nothing the process could read now (in line mode, a partial line may
    /// wait for its end); `line_mode` when the terminal edits lines
    /// (`ICANON`), with `eof` its end-of-file key.
    Read { line_mode: bool, eof: u8 },
}

/// Look at the terminal whose process side is `slave`.
fn look_at_terminal(slave: &std::path::Path) -> std::io::Result<TerminalInput> {
    use nix::fcntl::OFlag;
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use nix::sys::termios::{LocalFlags, SpecialCharacterIndices, tcgetattr};
    use std::os::fd::AsFd as _;
    let flags = OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK;
    let side = nix::fcntl::open(slave, flags, nix::sys::stat::Mode::empty())?;
    let mut fds = [PollFd::new(side.as_fd(), PollFlags::POLLIN)];
    // In line mode, readable means a whole line (or a typed end of file) waits.
    let waiting = poll(&mut fds, PollTimeout::ZERO)?;
    if waiting > 0
        && fds[0]
            .revents()
            .is_some_and(|events| events.contains(PollFlags::POLLIN))
    {
        return Ok(TerminalInput::Unread);
    }
    let settings = tcgetattr(&side)?;
    let eof = settings.control_chars[SpecialCharacterIndices::VEOF as usize];
    Ok(TerminalInput::Read {
        line_mode: settings.local_flags.contains(LocalFlags::ICANON),
        // 0 is `_POSIX_VDISABLE`: no key is end of file; ^D is what a user tries.
        eof: if eof == 0 { EOF_KEY } else { eof },
    })
}

/// After closeStdin on a terminal: type its end-of-file key each time the
/// process has read all typed before, until the process exits.
///
/// Only then, because of how a terminal reads it. In line mode the key ends
/// a read: at the start of a line the read returns nothing (end of file),
/// after a partial line it hands the line over, and the next one is end of
/// file. But a program that reads its terminal out of line mode (bash's and
/// python's line editors do, while a line is typed, and go back to line mode
/// while a command runs) reads an end of file typed in line mode and still
/// unread when it switched as a NUL byte, not as the key: typed the moment
/// stdin ended, the key was lost whenever the program had not yet taken the
/// terminal (`echo 'echo hi' | box run -t bash` never ended). Typed each
/// time all before it was read, every read after the end of input sees an
/// end of file, as on a pipe: a NUL read by a line editor is followed by
/// the key it ends on. Out of line mode at most [`RAW_EOF_KEYS`] are typed.
async fn type_end_of_input(
    slave: PathBuf,
    mut input: Input,
    mut exit: watch::Receiver<Option<Exit>>,
) {
    let mut pause = TYPIST_FIRST_LOOK;
    let mut raw_keys = 0;
    loop {
        match look_at_terminal(&slave) {
            // The terminal is gone (every process let go of it).
            Err(_) => return,
            Ok(TerminalInput::Unread) => pause = (pause * 2).min(TYPIST_LONGEST_WAIT),
            Ok(TerminalInput::Read { line_mode, eof }) => {
                if !line_mode {
                    if raw_keys == RAW_EOF_KEYS {
                        return;
                    }
                    raw_keys += 1;
                }
                match tokio::time::timeout(TYPIST_LONGEST_WAIT, input.write_all(&[eof])).await {
                    Ok(Ok(())) => pause = TYPIST_FIRST_LOOK,
                    Ok(Err(_)) => return,
                    // Nothing was read, so the key is not needed yet.
                    Err(_) => pause = TYPIST_LONGEST_WAIT,
                }
            }
        }
        tokio::select! {
            _ = exit.wait_for(Option::is_some) => return,
            () = tokio::time::sleep(pause) => {}
        }
    }
}

/// A new pseudo-terminal in the unit's devpts, both ends close-on-exec so no
/// other child inherits them.
struct Terminal {
    master: std::os::fd::OwnedFd,
    slave: std::os::fd::OwnedFd,
    slave_path: PathBuf,
}

impl Terminal {
    fn open(size: TtySize) -> std::io::Result<Self> {
        use nix::fcntl::OFlag;
        let flags = OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC;
        let master = nix::pty::posix_openpt(flags)?;
        nix::pty::grantpt(&master)?;
        nix::pty::unlockpt(&master)?;
        let name = nix::pty::ptsname_r(&master)?;
        let slave = nix::fcntl::open(name.as_str(), flags, nix::sys::stat::Mode::empty())?;
        let master = std::os::fd::OwnedFd::from(master);
        set_size(&master, size.rows, size.cols)?;
        Ok(Self {
            master,
            slave,
            slave_path: PathBuf::from(name),
        })
    }

    /// Make the terminal `command`'s stdin, stdout, stderr and controlling
    /// terminal, in a session of its own (so its group is its pid, as with
    /// `process_group(0)`, and ending the group ends it).
    fn attach(&self, command: &mut tokio::process::Command) -> std::io::Result<()> {
        command
            .stdin(Stdio::from(self.slave.try_clone()?))
            .stdout(Stdio::from(self.slave.try_clone()?))
            .stderr(Stdio::from(self.slave.try_clone()?));
        // SAFETY: the closure runs in the forked child before exec and calls
        // only async-signal-safe functions (setsid, ioctl), allocating nothing.
        unsafe {
            command.pre_exec(|| {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // fd 0 is the terminal by now: std sets up stdio before this runs.
                if libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Ok(())
    }

    /// The master's output and input as async streams (each its own dup;
    /// `self.slave` is dropped here, the child holds its own copies).
    fn streams(
        &self,
    ) -> std::io::Result<(
        tokio::net::unix::pipe::Receiver,
        tokio::net::unix::pipe::Sender,
    )> {
        // A pty master is not a FIFO, but reads and writes on it and polls it
        // the same way, which is all the unchecked constructors need.
        let reader =
            tokio::net::unix::pipe::Receiver::from_owned_fd_unchecked(self.master.try_clone()?)?;
        let writer =
            tokio::net::unix::pipe::Sender::from_owned_fd_unchecked(self.master.try_clone()?)?;
        Ok((reader, writer))
    }
}

/// Set the size of the terminal whose master is `master`.
fn set_size(master: &std::os::fd::OwnedFd, rows: u16, cols: u16) -> std::io::Result<()> {
    use std::os::fd::AsRawFd as _;
    let size = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one `winsize` through the pointer, which is
    // valid for the call; the fd is open for as long as `master` is borrowed.
    let result = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &size) };
    if result < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Send `signal` to the process group led by `leader` (a child started with
/// `process_group(0)`). A group already gone is not an error.
pub(crate) fn kill_group(leader: u32, signal: nix::sys::signal::Signal) {
    if let Ok(leader) = i32::try_from(leader)
        && leader > 1
    {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(leader), signal);
    }
}

#[cfg(test)]
mod tests;
