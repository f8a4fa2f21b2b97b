//! `box run`: the host as its own client. One session through the same
//! pipeline as any other (profile → tightenings → units → executor), the
//! command run in the workspace unit through the executor's process methods,
//! its stdout and stderr streamed as they come, its status passed on, the
//! units removed.
//!
//! With `tty`, the command gets a terminal of its own in its unit (the
//! executor's `tty` extension): its output is that terminal's, stdin typed
//! at this terminal goes to it byte by byte (this terminal raw for the
//! while, restored on every way out), and its size follows this terminal's
//! (`box/process.resize` on SIGWINCH).
//!
//! Interrupted (SIGINT, SIGTERM), as `docker run` passes a signal on to its
//! container, the command's process group gets it; then the session ends at
//! once (its unit removed by force, nothing of it waited for) and box exits
//! 130 (SIGINT) or 143 (SIGTERM) once the removal is confirmed, quietly.
//!
//! Exit codes: the command's status; 125 when box itself failed (like
//! `docker run`), so a failing command and a failing box are told apart.
//!
//! With a host (`--host URL`), the session is one of a running `box serve
//! --listen`'s, over streamable HTTP: its profile, backend and pools are the
//! host's, so a command claims a warm unit when the host keeps a pool for
//! the plan, and starts no engine client, catalog or backend here.
//!
//! It is the binary's, not the host library's: a client of the host (as the
//! transports carry other clients to it) that owns this process's terminal
//! and signals.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use base64::Engine as _;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::host::session::EXECUTOR_KEY;
use crate::host::{
    END_WAIT, HostConfig, Services, SessionHandle, claim_instance, host_facts, report_units_left,
    select_backend, spawn_session,
};
use crate::process::{self, watch_signals};
use box_jsonrpc as jsonrpc;
use box_policy::plan::{Plan, Role};
use box_policy::profile::Catalog;

/// What `box run` is asked, as plain values (`cli/run.rs` turns its flags
/// into this).
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// The profile to resolve; `None`: `default` here, the host's own
    /// default with `host`.
    pub profile: Option<String>,
    /// A running `box serve --listen` to run the command through, instead of
    /// a host in this process.
    pub host: Option<RemoteHost>,
    /// More directories of profiles, searched first.
    pub profile_dirs: Vec<PathBuf>,
    /// Tightenings, as JSON or @FILE.
    pub tighten: Option<String>,
    /// The backends `backend` names one of (the binary's).
    pub registry: box_backend::Registry,
    /// Where units run: docker, local, or auto.
    pub backend: String,
    /// The host directory a `cwd` workspace source means; `None`: the current directory.
    pub workspace: Option<PathBuf>,
    /// Log format on stderr: text or json.
    pub log_format: String,
    /// The log filter the command line asked for (`-v`/`-q`), over
    /// `BOX_LOG` and `RUST_LOG`; `None`: those, else warnings.
    pub log_filter: Option<String>,
    /// Variables for the command, `NAME` (the host's value) or `NAME=VALUE`;
    /// each must be one the resolved plan lets through (`env.pass`, `env.secrets`).
    pub env: Vec<String>,
    /// Forward box's stdin to the command (else the command reads EOF at once).
    pub stdin: bool,
    /// Give the command a terminal (`-t`): box's extension `tty` on
    /// `process.start`; this terminal raw while stdin is forwarded from it.
    pub tty: bool,
    /// The command and its arguments.
    pub command: Vec<String>,
}

/// A running host `box run` is a client of.
#[derive(Debug, Clone)]
pub struct RemoteHost {
    /// Its URL (`http://127.0.0.1:8080`, `/mcp` when no path is given).
    pub url: String,
    /// The bearer token its HTTP clients send, when it asks for one.
    pub token: Option<String>,
    /// Wait for the host to confirm the session's units removed (else it
    /// removes them after box has exited).
    pub wait_removal: bool,
}

/// The profile `box run` resolves when none is named.
const DEFAULT_PROFILE: &str = "default";

/// box's own failure, as `docker run` reports it.
const BOX_FAILED: u8 = 125;
/// The most bytes one process read asks for (the executor's bound).
const READ_CHUNK: u64 = 64 << 10;
/// The most bytes of stdin sent in one process write (the executor takes up to 1 MiB).
const WRITE_CHUNK: usize = 64 << 10;
/// Interrupted: how long passing the signal on to the command may take
/// before its unit is removed anyway (an executor that does not answer).
const SIGNAL_WAIT: Duration = Duration::from_millis(200);
/// SIGTERM's exit code, as a shell reports a command it ended (128 + 15).
const TERMINATED: u8 = 143;
/// SIGINT's (128 + 2).
const INTERRUPTED: u8 = 130;

/// A client of the command's session.
struct Client {
    via: Via,
    next_id: std::sync::atomic::AtomicU64,
}

/// Where the command's session is.
enum Via {
    /// A session of a host in this process.
    Here(SessionHandle),
    /// A session of `box serve --listen` elsewhere.
    Host(box_transport::client::HostClient),
}

impl Client {
    fn new(via: Via) -> Self {
        Self {
            via,
            next_id: std::sync::atomic::AtomicU64::new(0),
        }
    }

    async fn call(&self, method: &str, params: Value) -> Result<Value, String> {
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let request = jsonrpc::request(json!(id), method, params);
        let response = match &self.via {
            Via::Here(session) => {
                let stream = session
                    .request(request)
                    .await
                    .map_err(|gone| gone.to_string())?;
                stream
                    .response
                    .await
                    .map_err(|_| format!("{method}: the session dropped the request"))?
            }
            Via::Host(host) => host
                .request(request)
                .await
                .map_err(|error| format!("{method}: {error}"))?,
        };
        if let Some(error) = response.get("error") {
            let message = error
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("an error without a message");
            return Err(format!("{method}: {message}"));
        }
        Ok(response.get("result").cloned().unwrap_or(Value::Null))
    }
}

/// Parse `--tighten`: JSON, or `@FILE` holding JSON.
fn parse_tighten(tighten: Option<&str>) -> anyhow::Result<Value> {
    let Some(text) = tighten else {
        return Ok(Value::Null);
    };
    let (text, source) = match text.strip_prefix('@') {
        Some(path) => (
            std::fs::read_to_string(path).with_context(|| format!("--tighten @{path}: reading"))?,
            format!("--tighten @{path}"),
        ),
        None => (text.to_owned(), "--tighten".to_owned()),
    };
    serde_json::from_str(&text).with_context(|| format!("{source}: not JSON"))
}

/// Run one command through a session of its own; the exit code is the command's.
pub fn run(args: RunConfig) -> anyhow::Result<ExitCode> {
    // The command's own output is what a `box run` user reads: box speaks up
    // only for warnings and errors unless RUST_LOG asks for more.
    process::init_logging(&args.log_format, args.log_filter.as_deref(), "warn")?;
    let runtime = process::runtime()?;
    let result = runtime.block_on(run_session(args));
    runtime.shutdown_timeout(Duration::from_millis(200));
    result
}

async fn run_session(args: RunConfig) -> anyhow::Result<ExitCode> {
    match run_inner(args).await {
        Ok(code) => Ok(code),
        Err(error) => {
            eprintln!("box run: {error:#}");
            Ok(ExitCode::from(BOX_FAILED))
        }
    }
}

/// The variables a session's workspace unit lets a command set: its profile,
/// the names it lets through, and the names it sets itself.
struct EnvAllowed {
    /// Where the list comes from (`profile ci`, `the host's profile ci`).
    whose: String,
    /// `env.pass` and `env.secrets`.
    through: Vec<String>,
    /// `env.set`: the profile's own, which a command may not change.
    fixed: Vec<String>,
}

impl EnvAllowed {
    /// What `plan`'s workspace unit lets through.
    fn of_plan(plan: &Plan) -> Self {
        let workspace = plan.units.iter().find(|unit| unit.role == Role::Workspace);
        Self {
            whose: format!("profile {}", plan.profile),
            through: workspace
                .map(|unit| {
                    unit.env_pass
                        .iter()
                        .chain(&unit.env_secrets)
                        .cloned()
                        .collect()
                })
                .unwrap_or_default(),
            fixed: workspace
                .map(|unit| unit.env_set.keys().cloned().collect())
                .unwrap_or_default(),
        }
    }

    /// What a running host reported passing into the session's workspace
    /// unit (its envelope's `envPassed` and the secrets it gives as
    /// variables): a variable the profile passes but the host's
    /// environment lacks is not among them.
    fn of_envelope(units: &Value) -> Self {
        let workspace = units
            .as_array()
            .into_iter()
            .flatten()
            .find(|unit| unit["role"] == "workspace");
        let names = |list: &Value, only: &dyn Fn(&Value) -> bool| -> Vec<String> {
            list.as_array()
                .into_iter()
                .flatten()
                .filter(|entry| only(entry))
                .filter_map(|entry| entry.as_str().or_else(|| entry["name"].as_str()))
                .map(str::to_owned)
                .collect()
        };
        let mut through = Vec::new();
        if let Some(unit) = workspace {
            through = names(&unit["envPassed"], &|_| true);
            through.extend(names(&unit["secrets"], &|secret| {
                secret["asEnv"] == Value::Bool(true)
            }));
        }
        Self {
            whose: "the host's profile".to_owned(),
            through,
            fixed: Vec::new(),
        }
    }
}

/// The `NAME=value` entries `-e` asks for, each checked against what the
/// session's workspace unit lets through: a variable it does not pass is
/// refused by name, before the command starts.
fn command_env(requested: &[String], allowed: &EnvAllowed) -> anyhow::Result<Vec<String>> {
    let mut entries = Vec::new();
    for request in requested {
        let (name, value) = match request.split_once('=') {
            Some((name, value)) => (name, Some(value.to_owned())),
            None => (request.as_str(), None),
        };
        box_policy::profile::check_env_name(name)
            .map_err(|why| anyhow::anyhow!("-e {request}: {why}"))?;
        if !allowed.through.iter().any(|allowed| allowed == name) {
            let fixed = allowed.fixed.iter().any(|fixed| fixed == name);
            anyhow::bail!(
                "-e {name}: {} {}; the variables it lets through (env.pass, env.secrets) are: {}",
                allowed.whose,
                if fixed {
                    "sets this variable itself (env.set), so a command may not change it"
                } else {
                    "does not let this variable through"
                },
                if allowed.through.is_empty() {
                    "none".to_owned()
                } else {
                    allowed.through.join(", ")
                }
            );
        }
        // `-e NAME` as docker reads it: this shell's value, or nothing when unset.
        let value = match value {
            Some(value) => value,
            None => match std::env::var(name) {
                Ok(value) => value,
                Err(_) => continue,
            },
        };
        entries.push(format!("{name}={value}"));
    }
    Ok(entries)
}

async fn run_inner(mut args: RunConfig) -> anyhow::Result<ExitCode> {
    if let Some(remote) = args.host.take() {
        return run_remote(args, remote).await;
    }
    let profile_name = args
        .profile
        .get_or_insert_with(|| DEFAULT_PROFILE.to_owned())
        .clone();
    let tighten = parse_tighten(args.tighten.as_deref())?;
    let facts = host_facts(args.workspace.as_ref())?;
    let catalog = Catalog::new(args.profile_dirs.clone());
    // The plan the session will resolve, resolved first: a wrong profile,
    // tightening or `-e` is said before any backend is asked (and warns).
    let profile = catalog
        .load(&profile_name)
        .map_err(|error| anyhow::anyhow!("--profile {profile_name}: {error}"))?;
    let plan = crate::host::resolve_plan(&profile, &tighten, &facts)
        .map_err(|error| anyhow::anyhow!("{error}"))?;
    args.env = command_env(&args.env, &EnvAllowed::of_plan(&plan))?;
    let backend = select_backend(&args.registry, &args.backend).await?;
    let mut config = HostConfig::new(catalog, facts);
    let services = Arc::new(Services::new(backend));
    config.default_profile = profile_name;
    let instance = claim_instance(None, None)?;
    config.instance = instance.id().to_owned();
    let config = Arc::new(config);
    // A signal does not end the session by itself: box run passes it on to
    // the command first, then ends the session (`host` is never cancelled).
    let host = CancellationToken::new();
    let interrupt = CancellationToken::new();
    let signal_code = watch_signals(interrupt.clone(), config.clone(), services.clone())?;
    let (general_tx, mut general_rx) = mpsc::channel(16);
    // Nothing general matters to a one-shot run; drain it so nothing waits.
    tokio::spawn(async move { while general_rx.recv().await.is_some() {} });
    let mut session_id = [0u8; 16];
    rand::fill(&mut session_id);
    let session = spawn_session(
        config.clone(),
        services.clone(),
        hex::encode(session_id),
        general_tx,
        &host,
    );
    let client = Client::new(Via::Here(session.clone()));
    let (outcome, interrupted) =
        run_until_interrupted(&client, &args, tighten, &interrupt, &signal_code, || {
            // The user asked it to stop: nothing of the unit is waited for.
            services
                .end_at_once
                .store(true, std::sync::atomic::Ordering::SeqCst);
        })
        .await;
    session.end();
    // Bounded: an engine that stalls must not keep box for ever.
    let _ = tokio::time::timeout(END_WAIT, session.ended()).await;
    // Names each unit left, and how to remove it.
    let left = report_units_left(&config, &services);
    exit_code(interrupted, outcome, left)
}

/// The exit code of a run: the signal's when interrupted, box's failure
/// when its units were not removed, else the command's.
fn exit_code(
    interrupted: Option<u8>,
    outcome: Option<Result<ExitCode, String>>,
    left: bool,
) -> anyhow::Result<ExitCode> {
    match (interrupted, outcome) {
        (Some(code), _) => Ok(ExitCode::from(code)),
        // The command ran, but box did not clean up after it: box failed.
        (None, Some(_)) if left => Ok(ExitCode::from(BOX_FAILED)),
        (None, Some(Ok(status))) => Ok(status),
        (None, Some(Err(error))) => Err(anyhow::anyhow!(error)),
        (None, None) => Err(anyhow::anyhow!("the command was stopped")),
    }
}

/// Run the command until it ends or `interrupt` is cancelled (its calls
/// then dropped); interrupted, `stopping` runs, then the signal (its code
/// from `signal_code`) is passed on to the command. The command's outcome,
/// or the signal's exit code.
async fn run_until_interrupted(
    client: &Client,
    args: &RunConfig,
    tighten: Value,
    interrupt: &CancellationToken,
    signal_code: &std::sync::OnceLock<u8>,
    stopping: impl FnOnce(),
) -> (Option<Result<ExitCode, String>>, Option<u8>) {
    let started = std::sync::OnceLock::new();
    let outcome = tokio::select! {
        outcome = run_command(client, args, tighten, &started) => Some(outcome),
        () = interrupt.cancelled() => None,
    };
    let interrupted = outcome
        .is_none()
        .then(|| signal_code.get().copied().unwrap_or(INTERRUPTED));
    if let Some(code) = interrupted {
        stopping();
        pass_signal(client, started.get(), code).await;
    }
    (outcome, interrupted)
}

/// Pass the interrupting signal on to the command (`process`), bounded: an
/// executor that does not answer does not keep box.
async fn pass_signal(client: &Client, process: Option<&String>, code: u8) {
    let Some(id) = process else {
        return;
    };
    let signal = if code == TERMINATED { "TERM" } else { "INT" };
    let passed = tokio::time::timeout(
        SIGNAL_WAIT,
        client.call(
            "agentworkspace/process.signal",
            json!({"id": id, "signal": signal}),
        ),
    )
    .await;
    match passed {
        Ok(Ok(_)) => {}
        Ok(Err(error)) => {
            tracing::debug!(%error, "the signal was not passed on to the command");
        }
        Err(_) => tracing::debug!(
            "the signal was not passed on to the command: no answer within {}",
            humantime::format_duration(SIGNAL_WAIT)
        ),
    }
}

/// `box run --host`: the command in a session of a running `box serve
/// --listen`, which resolves the profile, starts (or claims) the units and
/// removes them when the session is deleted.
async fn run_remote(args: RunConfig, remote: RemoteHost) -> anyhow::Result<ExitCode> {
    let tighten = parse_tighten(args.tighten.as_deref())?;
    let url = box_transport::client::HostUrl::parse(&remote.url)
        .map_err(|error| anyhow::anyhow!("--host {error}"))?;
    let client = Client::new(Via::Host(box_transport::client::HostClient::new(
        url,
        remote.token,
    )));
    let interrupt = CancellationToken::new();
    let signal_code = watch_client_signals(interrupt.clone())?;
    let (outcome, interrupted) =
        run_until_interrupted(&client, &args, tighten, &interrupt, &signal_code, || {}).await;
    // The host removes the session's units; box waits for that only when
    // asked (`--wait-removal`), the DELETE then answered once they are gone.
    let Via::Host(host) = &client.via else {
        unreachable!("run_remote's client is a host's")
    };
    let left = match tokio::time::timeout(END_WAIT + SIGNAL_WAIT, host.end(remote.wait_removal))
        .await
    {
        Ok(Ok(())) => false,
        Ok(Err(error)) => {
            eprintln!("box run: ending the session: {error}");
            true
        }
        Err(_) => {
            eprintln!(
                "box run: ending the session: the host did not confirm its units removed within {}",
                humantime::format_duration(END_WAIT)
            );
            true
        }
    };
    exit_code(interrupted, outcome, left)
}

/// As the host's signal handling, for a client: the first SIGINT or SIGTERM
/// cancels `interrupt` (its exit code kept); one more a window later exits at
/// once, leaving the session to the host's idle timeout.
fn watch_client_signals(
    interrupt: CancellationToken,
) -> anyhow::Result<Arc<std::sync::OnceLock<u8>>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let first = Arc::new(std::sync::OnceLock::new());
    let first_set = first.clone();
    tokio::spawn(async move {
        let mut at: Option<tokio::time::Instant> = None;
        loop {
            let code: u8 = tokio::select! {
                _ = term.recv() => TERMINATED,
                _ = int.recv() => INTERRUPTED,
            };
            match at {
                None => {
                    at = Some(tokio::time::Instant::now());
                    let _ = first_set.set(code);
                    interrupt.cancel();
                }
                Some(at) if at.elapsed() < SIGNAL_WAIT => {}
                Some(_) => {
                    eprintln!(
                        "box run: second signal: exiting now; the host removes the session's units when it idles out"
                    );
                    std::process::exit(code.into());
                }
            }
        }
    });
    Ok(first)
}

/// Start the command and stream it until it ends; its process id is put in
/// `process` as soon as it has one (an interrupt passes its signal on to it).
async fn run_command(
    client: &Client,
    args: &RunConfig,
    tighten: Value,
    process: &std::sync::OnceLock<String>,
) -> Result<ExitCode, String> {
    let mut ask = json!({"tighten": tighten});
    if let Some(profile) = &args.profile {
        ask["profile"] = json!(profile);
    }
    let initialized = client
        .call(
            "initialize",
            json!({
                "protocolVersion": "2025-06-18",
                "capabilities": {"experimental": {EXECUTOR_KEY: {"box": ask}}},
                "clientInfo": {"name": "box run", "version": env!("CARGO_PKG_VERSION")},
            }),
        )
        .await?;
    let applied = &initialized["capabilities"]["experimental"][EXECUTOR_KEY]["box"];
    let units = &applied["units"];
    let env = match &client.via {
        Via::Here(_) => args.env.clone(),
        // The host resolved the plan: its envelope says what passes.
        Via::Host(host) => {
            let _ = host
                .notify(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
                .await;
            let mut allowed = EnvAllowed::of_envelope(units);
            if let Some(profile) = applied["profile"].as_str() {
                allowed.whose = format!("the host's profile {profile}");
            }
            command_env(&args.env, &allowed).map_err(|error| format!("{error:#}"))?
        }
    };
    // No uid 0 by surprise: said once, before the command's own output.
    if units
        .as_array()
        .into_iter()
        .flatten()
        .any(|unit| unit.get("rootUser").is_some())
    {
        // A log event, so `--log-format json` keeps stderr one JSON object a line.
        tracing::warn!("{}", box_policy::envelope::RootUser::new().line());
    }
    let mut start = json!({"args": args.command, "env": env, "stderr": !args.tty});
    if args.tty {
        let (rows, cols) = terminal::size().unwrap_or(terminal::DEFAULT_SIZE);
        start["tty"] = json!({"rows": rows, "cols": cols});
    }
    let started = client.call("agentworkspace/process.start", start).await?;
    let id = started
        .get("id")
        .and_then(Value::as_str)
        .ok_or("agentworkspace/process.start: the answer has no process id")?
        .to_owned();
    let _ = process.set(id.clone());
    // Keys typed here go to the command's terminal as they are (^C included),
    // until this guard is dropped: on return, on error, and when a signal
    // ends the run (the caller drops this future).
    let _raw = if args.tty && args.stdin {
        terminal::Raw::enter().map_err(|error| format!("-t: {error}"))?
    } else {
        None
    };
    let output = async {
        if args.tty {
            // The terminal joins stderr to stdout, as a terminal does.
            return pump(client, &id, 1, tokio::io::stdout()).await;
        }
        let (stdout, stderr) = tokio::join!(
            pump(client, &id, 1, tokio::io::stdout()),
            pump(client, &id, 2, tokio::io::stderr())
        );
        stdout.and(stderr)
    };
    let resizing = async {
        if args.tty {
            follow_size(client, &id).await;
        }
    };
    tokio::pin!(output, resizing);
    let mut resized = false;
    if args.stdin {
        // Output ends when the command does; stdin is not waited for past
        // that (a command that never reads it must not hang on it).
        let feeding = feed(client, &id, tokio::io::stdin());
        tokio::pin!(feeding);
        let mut fed = false;
        loop {
            tokio::select! {
                output = &mut output => break output?,
                () = &mut feeding, if !fed => fed = true,
                () = &mut resizing, if !resized => resized = true,
            }
        }
    } else {
        client
            .call("agentworkspace/process.closeStdin", json!({"id": id}))
            .await?;
        loop {
            tokio::select! {
                output = &mut output => break output?,
                () = &mut resizing, if !resized => resized = true,
            }
        }
    }
    let waited = client
        .call("agentworkspace/process.wait", json!({"id": id}))
        .await?;
    let _ = client
        .call("agentworkspace/process.close", json!({"id": id}))
        .await;
    let status = waited.get("status").and_then(Value::as_i64).unwrap_or(-1);
    if let Some(ended) = waited.get("ended").and_then(Value::as_str) {
        eprintln!("box run: the command ended: {ended}");
    }
    match u8::try_from(status) {
        Ok(code) => Ok(ExitCode::from(code)),
        Err(_) => {
            eprintln!("box run: the command was killed by a signal (status {status})");
            Ok(ExitCode::from(255))
        }
    }
}

/// Send this terminal's size to the command's terminal each time it changes
/// (SIGWINCH), for as long as the command runs.
async fn follow_size(client: &Client, id: &str) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut changes) = signal(SignalKind::window_change()) else {
        tracing::debug!("no SIGWINCH handler: the command's terminal keeps its first size");
        return;
    };
    while changes.recv().await.is_some() {
        let Some((rows, cols)) = terminal::size() else {
            continue;
        };
        if let Err(error) = client
            .call(
                "box/process.resize",
                json!({"id": id, "rows": rows, "cols": cols}),
            )
            .await
        {
            tracing::debug!(%error, "the command's terminal was not resized");
            return;
        }
    }
}

/// This process's terminal: its size, and raw mode.
mod terminal {
    use nix::sys::termios::{self, SetArg, Termios};

    /// The size a terminal gets when box has none to copy (stdio redirected).
    pub(super) const DEFAULT_SIZE: (u16, u16) = (24, 80);

    /// The size (rows, cols) of the first of stdout, stdin, stderr that is a terminal.
    pub(super) fn size() -> Option<(u16, u16)> {
        [libc::STDOUT_FILENO, libc::STDIN_FILENO, libc::STDERR_FILENO]
            .into_iter()
            .find_map(|fd| {
                let mut size = libc::winsize {
                    ws_row: 0,
                    ws_col: 0,
                    ws_xpixel: 0,
                    ws_ypixel: 0,
                };
                // SAFETY: TIOCGWINSZ writes one `winsize` through the pointer,
                // which is valid and exclusive for the call; a standard fd
                // that is not a terminal only makes the call fail.
                let result = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut size) };
                (result == 0 && size.ws_row > 0 && size.ws_col > 0)
                    .then_some((size.ws_row, size.ws_col))
            })
    }

    /// Stdin in raw mode (no echo, no line editing, no signals from keys:
    /// every byte goes to the command's terminal, which does all that);
    /// the settings before are put back when this is dropped.
    pub(super) struct Raw {
        before: Termios,
    }

    impl Raw {
        /// Raw mode, or `None` when stdin is not a terminal.
        pub(super) fn enter() -> Result<Option<Self>, String> {
            use std::io::IsTerminal as _;
            if !std::io::stdin().is_terminal() {
                return Ok(None);
            }
            let before = termios::tcgetattr(std::io::stdin())
                .map_err(|error| format!("reading the terminal's settings: {error}"))?;
            let mut raw = before.clone();
            termios::cfmakeraw(&mut raw);
            termios::tcsetattr(std::io::stdin(), SetArg::TCSANOW, &raw)
                .map_err(|error| format!("making the terminal raw: {error}"))?;
            tracing::debug!("the terminal is raw");
            Ok(Some(Self { before }))
        }
    }

    impl Drop for Raw {
        fn drop(&mut self) {
            if let Err(error) = termios::tcsetattr(std::io::stdin(), SetArg::TCSANOW, &self.before)
            {
                eprintln!(
                    "box run: the terminal's settings could not be restored ({error}); run `stty sane`"
                );
            }
        }
    }
}

/// Copy `input` to the process's stdin as it comes, then close it; stops
/// quietly when the process no longer takes input.
async fn feed(client: &Client, id: &str, mut input: impl AsyncRead + Unpin) {
    let mut buffer = vec![0u8; WRITE_CHUNK];
    loop {
        let read = match input.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        let data = base64::engine::general_purpose::STANDARD.encode(&buffer[..read]);
        if let Err(error) = client
            .call(
                "agentworkspace/process.write",
                json!({"id": id, "data": data}),
            )
            .await
        {
            tracing::debug!(%error, "the command takes no more input");
            break;
        }
    }
    let _ = client
        .call("agentworkspace/process.closeStdin", json!({"id": id}))
        .await;
}

/// Copy the process's `fd` to `out` as it comes, until end of file.
async fn pump(
    client: &Client,
    id: &str,
    fd: u8,
    mut out: impl AsyncWrite + Unpin,
) -> Result<(), String> {
    // Once `out` is closed (`box run … | head`), output is read and dropped so
    // the command is never blocked on a full pipe.
    let mut open = true;
    loop {
        let read = client
            .call(
                "agentworkspace/process.read",
                json!({"id": id, "fd": fd, "max": READ_CHUNK}),
            )
            .await?;
        if let Some(data) = read.get("data").and_then(Value::as_str) {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(data)
                .map_err(|error| format!("agentworkspace/process.read: bad base64: {error}"))?;
            if open && (out.write_all(&bytes).await.is_err() || out.flush().await.is_err()) {
                open = false;
            }
        }
        if read.get("eof").and_then(Value::as_bool) == Some(true) {
            return Ok(());
        }
    }
}
