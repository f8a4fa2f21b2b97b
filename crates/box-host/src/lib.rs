//! The host: a session's life, from the box ask at initialize to the removal of
//! its units. `box serve` (a started [`Host`], whose sessions a transport
//! serves) and `box run` (one command through a session of its own) start
//! here, from plain configuration ([`ServeConfig`], [`RunConfig`]).
//!
//! Owns: the host's configuration ([`HostConfig`]), backend selection, the
//! session task (`session`), starting and removing units (`units`), orphan
//! sweeping, signals, metrics and the audit log. Does not own: message routing
//! (the proxy), HTTP and stdio framing (the transports, which it never
//! names: the binary wires them to it), the command line (the binary's clap
//! structs), what a unit is (the plan) or how one starts (the backends).

mod ask;
pub mod audit;
pub mod egress;
pub mod fork;
mod hide;
pub mod metrics;
mod redact;
pub use redact::ScratchPool;
pub mod router;
mod run;
pub mod session;
pub mod state;
pub mod units;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use box_backend::Backend;
use box_policy::plan::{HostFacts, Plan, PlanError, UserIds};
use box_policy::profile::{Catalog, Profile};

pub use session::{
    AskPart, SessionGone, SessionHandle, TransportAsk, spawn_session, spawn_session_asking,
};

/// What `box serve` asks of the host, as plain values (the binary turns its
/// flags into this). The transport's own settings are not here: the host
/// never sees the transport.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The profile a session gets when it names none.
    pub profile: String,
    /// More directories of profiles, searched first.
    pub profile_dirs: Vec<PathBuf>,
    /// Where units run: a backend's name, or auto.
    pub backend: String,
    /// The backends `backend` names one of (the binary's).
    pub registry: box_backend::Registry,
    /// The host directory a `cwd` workspace source means; `None`: the current directory.
    pub workspace: Option<PathBuf>,
    /// The socket address served over HTTP (the default instance id is one
    /// per address); `None` on stdio.
    pub listen: Option<String>,
    /// This host's instance id in unit labels, when one is asked for.
    pub instance: Option<String>,
    /// Where the audit log is appended, when asked for.
    pub audit: Option<PathBuf>,
    /// At shutdown, how long calls in flight get to finish before units are removed.
    pub drain: Duration,
    /// How `box/fork` and `box/merge` run git: confined by the binary
    /// (`box confine`). `None`: forks are copies.
    pub fork_git: Option<box_fork::Git>,
    /// Where sessions' identities are kept for reattach (`--state`); `None`
    /// keeps nothing.
    pub state: Option<PathBuf>,
    /// Take over from the live host of the same instance (`--takeover`):
    /// SIGHUP it, wait for it to hand off and exit, then start.
    pub takeover: bool,
}

/// What `box run` asks of the host, as plain values (the binary turns its
/// flags into this).
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// The profile to resolve.
    pub profile: String,
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

/// How a plan is resolved: `plan::resolve`, or a test's own.
pub type ResolveFn = fn(&Profile, &serde_json::Value, &HostFacts) -> Result<Plan, PlanError>;

/// Everything a session needs from its host; shared by every session.
pub struct HostConfig {
    /// Where units run.
    pub backend: Arc<dyn Backend>,
    /// The profiles.
    pub catalog: Catalog,
    /// The profile of a session that names none.
    pub default_profile: String,
    /// What `cwd` and `user = "host"` mean here.
    pub facts: HostFacts,
    /// This host's instance id (unit labels).
    pub instance: String,
    /// Profile + tightenings → plan.
    pub resolve: ResolveFn,
    /// How long an executor gets to answer initialize.
    pub executor_init_timeout: Duration,
    /// Counters for `/metrics`.
    pub metrics: metrics::Metrics,
    /// The audit log, when asked for.
    pub audit: Option<audit::Audit>,
    /// At shutdown, how long calls in flight get to finish before their units are removed.
    pub drain: Duration,
    /// Every unit asked for and not yet confirmed removed.
    pub ledger: units::Ledger,
    /// The host's environment, read at each session's start: the values of
    /// the secrets its units are handed (as the backends read them) and of the
    /// credentials the scrubber keeps from units, all redacted from what the
    /// session receives. Tests give their own.
    pub environment: fn() -> Vec<(std::ffi::OsString, std::ffi::OsString)>,
    /// Where the host keeps its sockets (egress proxies), each in a directory of
    /// its own that the unit it serves gets mounted.
    pub runtime_dir: std::path::PathBuf,
    /// How `box/fork` runs git (worktree mode): a runner the binary confines.
    /// `None`: forks are copies.
    pub fork_git: Option<box_fork::Git>,
    /// Where forked workspaces live, per instance and session (see `fork`).
    pub fork_dir: std::path::PathBuf,
    /// Where sessions' identities are persisted (`box serve --state`);
    /// `None`: nothing is kept, no session can be reattached.
    pub state: Option<state::Store>,
    /// Sessions of a dead host whose units this host re-adopted at start,
    /// waiting for their clients to reattach.
    pub reattachable: state::Reattachable,
    /// The dead hosts' instances this host holds for the units it re-adopted.
    pub held_instances: state::HeldInstances,
    /// SIGHUP: the host hands its kept sessions to the next process instead
    /// of ending them.
    pub handoff: std::sync::atomic::AtomicBool,
    /// Sessions handed off (their calls drained, their units left).
    pub parked: std::sync::atomic::AtomicUsize,
    /// Sessions end at once from now on: their executors get no grace once
    /// their input is closed, and every unit is removed with
    /// [`Backend::remove_now`] (`box run` interrupted: the user asked it to
    /// stop, and waits for nothing of the unit).
    pub end_at_once: std::sync::atomic::AtomicBool,
    /// The memory files-resource answers holding secrets are redacted in,
    /// shared by the sessions.
    pub redact_scratch: Arc<redact::ScratchPool>,
}

impl HostConfig {
    /// A configuration with box's defaults around `backend`.
    pub fn new(backend: Arc<dyn Backend>, catalog: Catalog, facts: HostFacts) -> Self {
        Self {
            backend,
            catalog,
            default_profile: "default".to_owned(),
            facts,
            instance: format!("box-{}", std::process::id()),
            resolve: resolve_plan,
            executor_init_timeout: Duration::from_secs(60),
            metrics: metrics::Metrics::default(),
            audit: None,
            drain: Duration::from_secs(10),
            ledger: units::Ledger::default(),
            environment: || std::env::vars_os().collect(),
            runtime_dir: egress::default_runtime_dir(),
            fork_git: None,
            fork_dir: default_fork_dir(),
            state: None,
            reattachable: state::Reattachable::default(),
            held_instances: state::HeldInstances::default(),
            handoff: std::sync::atomic::AtomicBool::new(false),
            parked: std::sync::atomic::AtomicUsize::new(0),
            end_at_once: std::sync::atomic::AtomicBool::new(false),
            redact_scratch: Arc::default(),
        }
    }

    /// How this host removes units now ([`Self::end_at_once`]).
    pub fn removal(&self) -> units::Removal {
        if self.end_at_once.load(std::sync::atomic::Ordering::SeqCst) {
            units::Removal::AtOnce
        } else {
            units::Removal::Graceful
        }
    }
}

/// Where `box serve` keeps sessions' identities by default:
/// `$XDG_STATE_HOME/box/sessions`, else `~/.local/state/box/sessions`
/// (`/var/lib/box/sessions` for root).
pub fn default_state_dir() -> PathBuf {
    default_fork_dir().with_file_name("sessions")
}

/// Where forked workspaces live: `$XDG_STATE_HOME/box/forks`, else
/// `~/.local/state/box/forks`, else the runtime directory's `forks` (a disk,
/// not a tmpfs, when it can: a fork is as large as its workspace).
pub fn default_fork_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_STATE_HOME").filter(|dir| !dir.is_empty()) {
        return PathBuf::from(dir).join("box").join("forks");
    }
    match std::env::var_os("HOME").filter(|home| !home.is_empty()) {
        Some(home) if !nix::unistd::getuid().is_root() => PathBuf::from(home)
            .join(".local")
            .join("state")
            .join("box")
            .join("forks"),
        _ if nix::unistd::getuid().is_root() => PathBuf::from("/var/lib/box/forks"),
        _ => egress::default_runtime_dir().join("forks"),
    }
}

/// Why no backend could be had.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BackendUnavailable(String);

/// The backend `--backend` names from `registry`: docker, local, or auto
/// (the first that connects, docker before local), said in one log line.
pub async fn select_backend(
    registry: &box_backend::Registry,
    kind: &str,
) -> anyhow::Result<Arc<dyn Backend>> {
    let backend = match kind {
        "auto" => match registry.auto().await {
            Ok((backend, skipped)) => {
                for (kind, why) in skipped {
                    // Said once, loudly; every envelope then names the backend too.
                    tracing::warn!(%why, "{} is not available: units run on the {} backend", kind.as_str(), backend.kind().as_str());
                }
                backend
            }
            Err(why) => anyhow::bail!("--backend auto: no backend is available: {why}"),
        },
        name => registry
            .connect(name)
            .await
            .map_err(|why| anyhow::anyhow!("--backend {name}: {why}"))?,
    };
    tracing::info!(
        backend = backend.kind().as_str(),
        "units run on the {} backend",
        backend.kind().as_str()
    );
    Ok(backend)
}

/// The host facts: the workspace directory (absolute) and the caller's ids.
pub fn host_facts(workspace: Option<&PathBuf>) -> anyhow::Result<HostFacts> {
    let cwd = match workspace {
        Some(dir) => dir
            .canonicalize()
            .with_context(|| format!("--workspace {}", dir.display()))?,
        None => std::env::current_dir().context("reading the current directory")?,
    };
    let workspace_owner = owner_of(&cwd);
    Ok(HostFacts {
        cwd,
        caller: UserIds {
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
        },
        workspace_owner,
    })
}

/// The owner of `dir` (following links, as the bind mount does), if it can
/// be read.
pub fn owner_of(dir: &std::path::Path) -> Option<UserIds> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(dir).ok().map(|metadata| UserIds {
        uid: metadata.uid(),
        gid: metadata.gid(),
    })
}

/// `facts` with the owner of `profile`'s workspace directory read now (a
/// long-lived host's directory may have changed hands since it started):
/// what `user = "host"` means for a root caller.
pub fn facts_for(facts: &HostFacts, profile: &Profile) -> HostFacts {
    HostFacts {
        workspace_owner: profile.workspace_dir(&facts.cwd).and_then(owner_of),
        ..facts.clone()
    }
}

/// [`box_policy::plan::resolve`] against [`facts_for`] the profile: how a
/// host resolves a session's plan (the default [`HostConfig::resolve`]).
pub fn resolve_plan(
    profile: &Profile,
    tighten: &serde_json::Value,
    facts: &HostFacts,
) -> Result<Plan, PlanError> {
    box_policy::plan::resolve(profile, tighten, &facts_for(facts, profile))
}

/// How long the sweep of orphaned units at start may take.
const SWEEP_WAIT: Duration = Duration::from_secs(30);

/// Remove every unit labelled with this host's instance (at start none of them
/// can belong to a live session) and those of dead hosts, once their lease
/// has surely lapsed: until then their own init ends them (or a host with
/// their state takes them back). `own_last_alive` is when the host that held
/// this instance id before was last alive, if one did. Live and unknown
/// instances' units are never touched, nor those whose backend ids are in
/// `keep` (a persisted session's: re-adopted, or left to their lease).
pub async fn sweep_orphans(
    config: &HostConfig,
    own_last_alive: Option<std::time::SystemTime>,
    keep: &std::collections::HashSet<String>,
) {
    let units = match config.backend.list().await {
        Ok(units) => units,
        Err(error) => {
            tracing::warn!(%error, "listing units to sweep orphans failed");
            return;
        }
    };
    // Ours (a predecessor that held this id crashed) and those of hosts whose
    // instance lock is left with nobody holding it (they died): none of these
    // can belong to a live session. Live and unknown instances are left alone.
    use box_backend::instance::{Liveness, default_dir, heartbeat, lease_may_be_live, liveness};
    let dir = default_dir();
    let now = std::time::SystemTime::now();
    let mut dead = std::collections::BTreeSet::new();
    let mut waiting = std::collections::BTreeSet::new();
    let mut orphans = Vec::new();
    for unit in units {
        if keep.contains(&unit.id) {
            continue;
        }
        let last_alive = if unit.instance == config.instance {
            own_last_alive
        } else if liveness(&dir, &unit.instance) == Liveness::Dead {
            dead.insert(unit.instance.clone());
            heartbeat(&dir, &unit.instance)
        } else {
            continue;
        };
        let live_lease = last_alive
            .and_then(|last_alive| lease_may_be_live(&unit.state, unit.lease_ms, last_alive, now));
        if let Some(by) = live_lease {
            tracing::info!(unit = %unit.id, instance = %unit.instance, by = %humantime::format_rfc3339_seconds(by), "left a dead host's unit to its lease, which may still be live");
            waiting.insert(unit.instance);
        } else {
            orphans.push(unit.id);
        }
    }
    if !orphans.is_empty() {
        tracing::info!(count = orphans.len(), instance = %config.instance, "removing orphaned units of this instance and of dead hosts");
        units::remove_units(config.backend.as_ref(), &orphans, units::Removal::Graceful).await;
    }
    // A lock file that says when a waiting unit's host was last alive stays.
    for instance in dead.difference(&waiting) {
        box_backend::instance::forget(&dir, instance);
    }
}

/// A session or a request refused before it was served: a WARN log line, an
/// audit line (with `--audit`) and a count in `box_sessions_refused{reason}`,
/// so an operator sees every refusal a client got.
pub fn report_refusal(config: &HostConfig, refusal: &audit::Refusal<'_>) {
    config.metrics.refused(refusal.reason);
    if let Some(audit) = &config.audit {
        audit.refusal(refusal);
    }
    let client = refusal
        .client
        .map(|client| format!("{} {}", client.name, client.version));
    let detail = one_line(refusal.detail);
    match refusal.http {
        Some((status, path)) => tracing::warn!(
            reason = refusal.reason,
            status,
            path = %one_line(path),
            "refused a request: {detail}"
        ),
        None => tracing::warn!(
            reason = refusal.reason,
            session = refusal.session,
            profile = refusal.profile,
            client = client.as_deref().map(one_line),
            "refused initialize: {detail}"
        ),
    }
}

/// `text` on one line: control characters (a client's newline) escaped, so
/// a log line cannot be split or forged by what it quotes.
pub fn one_line(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let escaped: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            escaped
        })
        .collect()
}

/// Start logging on stderr (stdout may be the protocol).
pub fn init_logging(format: &str, default_level: &str) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colour only on a terminal, and never when NO_COLOR is set (no-color.org).
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty()),
        )
        .with_writer(std::io::stderr);
    let result = match format {
        "text" => builder.try_init(),
        "json" => builder.json().try_init(),
        other => anyhow::bail!("--log-format {other}: choose text or json"),
    };
    // A second init (tests) keeps the first subscriber.
    let _ = result;
    Ok(())
}

/// Signals that come within this long of the first are the same request:
/// `timeout` and CI job cancellation signal both box and its process group,
/// so one request often arrives as two signals.
const SIGNAL_WINDOW: Duration = Duration::from_secs(1);
/// When a later signal says "exit now", how long box still spends removing
/// the units it knows before it exits naming those left.
const EXIT_NOW_REMOVAL: Duration = Duration::from_secs(5);
/// How long a host that is ending waits, after its calls' drain, for its
/// sessions' units to be confirmed removed before it exits naming those left.
pub const END_WAIT: Duration = Duration::from_secs(30);

/// Cancel `shutdown` at the first SIGTERM or SIGINT; signals within
/// [`SIGNAL_WINDOW`] of it are the same request. A later one exits now, after
/// at most [`EXIT_NOW_REMOVAL`] spent removing the units the ledger knows,
/// naming each unit left and how to remove it. Returns where the first
/// signal's exit code (143 for SIGTERM, 130 for SIGINT) is set before
/// `shutdown` is cancelled.
fn watch_signals(
    shutdown: CancellationToken,
    config: Arc<HostConfig>,
) -> anyhow::Result<Arc<std::sync::OnceLock<u8>>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut hangup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    let first_code = Arc::new(std::sync::OnceLock::new());
    let first_code_set = first_code.clone();
    tokio::spawn(async move {
        let mut first: Option<tokio::time::Instant> = None;
        loop {
            let code: u8 = tokio::select! {
                _ = term.recv() => 143,
                _ = interrupt.recv() => 130,
                _ = hangup.recv(), if first.is_none() && config.state.is_some() => {
                    first = Some(tokio::time::Instant::now());
                    tracing::info!("SIGHUP: handing the kept sessions to the next `box serve --state` process: their calls drain, then this process exits leaving their units");
                    config.handoff.store(true, std::sync::atomic::Ordering::SeqCst);
                    shutdown.cancel();
                    tokio::spawn(exit_when_handed_off(config.clone()));
                    continue;
                }
            };
            match first {
                None => {
                    first = Some(tokio::time::Instant::now());
                    let _ = first_code_set.set(code);
                    tracing::info!(
                        "signal received: ending sessions and removing their units (a signal {} or more later exits at once)",
                        humantime::format_duration(SIGNAL_WINDOW)
                    );
                    shutdown.cancel();
                }
                Some(at) if at.elapsed() < SIGNAL_WINDOW => {
                    tracing::debug!("a repeated signal within the window: the same request");
                }
                Some(_) => {
                    tracing::warn!(
                        "second signal: exiting now, after removing what can be removed within {}",
                        humantime::format_duration(EXIT_NOW_REMOVAL)
                    );
                    let _ =
                        tokio::time::timeout(EXIT_NOW_REMOVAL, remove_known_units(&config)).await;
                    report_units_left(&config);
                    std::process::exit(code.into());
                }
            }
        }
    });
    Ok(first_code)
}

/// After a SIGHUP: exit once every session is handed off (parked) or ended,
/// bounded by the drain and the end wait.
async fn exit_when_handed_off(config: Arc<HostConfig>) {
    let deadline = tokio::time::Instant::now() + config.drain + END_WAIT;
    loop {
        let parked = config.parked.load(std::sync::atomic::Ordering::SeqCst);
        if parked >= config.metrics.session_tasks() || tokio::time::Instant::now() >= deadline {
            tracing::info!(sessions = parked, "handed off; exiting");
            std::process::exit(0);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Remove, once, every unit the ledger knows the id of; those confirmed gone
/// leave it.
async fn remove_known_units(config: &HostConfig) {
    let known: Vec<units::Tracked> = config.ledger.tracked();
    let ids: Vec<String> = known.iter().map(|unit| unit.id.clone()).collect();
    let failed = units::remove_units(config.backend.as_ref(), &ids, config.removal()).await;
    for unit in known {
        if !failed.iter().any(|(id, _)| *id == unit.id) {
            config.ledger.gone(unit.key);
        }
    }
}

/// Say on stderr which units are not confirmed removed, each with how to
/// remove it; whether any is.
pub(crate) fn report_units_left(config: &HostConfig) -> bool {
    let left = config.ledger.left();
    if left.is_empty() {
        return false;
    }
    let kind = config.backend.kind();
    let mut text = format!(
        "box: {} unit{} of this host (instance {}) could not be confirmed removed before it exited:",
        left.len(),
        if left.len() == 1 { "" } else { "s" },
        config.instance
    );
    for unit in &left {
        text.push_str("\n  ");
        text.push_str(&unit.describe(kind.as_str(), &config.instance));
    }
    tracing::error!(units = left.len(), "units left at exit");
    eprintln!("{text}");
    true
}

/// The multi-threaded runtime (HTTP, `box run`).
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// One thread for one session (stdio): every hop of a call (client line,
/// session, unit writer, the engine's stream, the answer) is a task switch on
/// this thread, not a wake of another worker through a futex, which is most
/// of a proxied call's added latency on the multi-threaded runtime (measured
/// in BENCHMARKS.md, Serve).
pub fn single_session_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// Claim this host's instance id for its whole life (a lock the kernel
/// releases however the process dies), so `box gc` and the next host can tell
/// a live host's units from orphans. The default is one id per listen address
/// on HTTP (only one process can hold it, so units labelled with it at start
/// are a crashed predecessor's), or a fresh one per process on stdio (two CI
/// jobs on one runner never sweep each other).
pub(crate) fn claim_instance(
    requested: Option<&str>,
    listen: Option<&str>,
) -> anyhow::Result<box_backend::instance::InstanceLock> {
    use box_backend::instance;
    let id = instance_id(requested, listen);
    instance::InstanceLock::acquire(&instance::default_dir(), &id)
        .with_context(|| format!("claiming instance `{id}`"))
}

/// The instance id a host claims: the one asked for, one per listen address
/// on HTTP, a fresh one otherwise.
fn instance_id(requested: Option<&str>, listen: Option<&str>) -> String {
    use box_backend::instance;
    match (requested, listen) {
        (Some(id), _) => id.to_owned(),
        // An ephemeral port names no lasting host: two such hosts are two
        // instances, not one claimed twice.
        (None, Some(address)) if address.ends_with(":0") => instance::new_id(),
        (None, Some(address)) => {
            let address: String = address
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '.' {
                        c
                    } else {
                        '-'
                    }
                })
                .collect();
            format!("http-{address}")
        }
        (None, None) => instance::new_id(),
    }
}

/// How long `--takeover` waits for the host it signalled to hand off and exit.
const TAKEOVER_WAIT: Duration = Duration::from_secs(60);

/// `box serve --takeover`: the live host of this instance (the same listen
/// address, or `--instance`) is sent SIGHUP, and the instance is claimed
/// once it has handed its sessions off and exited; with no live host, it is
/// claimed at once.
async fn take_over(serve: &ServeConfig) -> anyhow::Result<box_backend::instance::InstanceLock> {
    use box_backend::instance;
    if serve.listen.is_none() || serve.state.is_none() {
        anyhow::bail!(
            "--takeover needs --listen and a state directory (--state): the sessions are handed over through it"
        );
    }
    let mut signalled = None;
    let deadline = tokio::time::Instant::now() + TAKEOVER_WAIT;
    loop {
        match claim_instance(serve.instance.as_deref(), serve.listen.as_deref()) {
            Ok(lock) => {
                if let Some(pid) = signalled {
                    tracing::info!(pid, "took over from the previous host");
                }
                return Ok(lock);
            }
            Err(error) => {
                if signalled.is_none() {
                    let id = instance_id(serve.instance.as_deref(), serve.listen.as_deref());
                    let Some(pid) = instance::holder_pid(&instance::default_dir(), &id) else {
                        return Err(error
                            .context("--takeover: no pid of the live host in its instance lock"));
                    };
                    tracing::info!(pid, instance = %id, "--takeover: asking the live host to hand its sessions off (SIGHUP)");
                    nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGHUP,
                    )
                    .with_context(|| format!("--takeover: signalling the live host, pid {pid}"))?;
                    signalled = Some(pid);
                }
                if tokio::time::Instant::now() >= deadline {
                    return Err(error.context(format!(
                        "--takeover: the live host did not hand off and exit within {}",
                        humantime::format_duration(TAKEOVER_WAIT)
                    )));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// A host ready to serve sessions: what they share, the token that ends
/// them all (a signal cancels it), and this host's claim on its instance id.
pub struct Host {
    /// What every session shares.
    pub config: Arc<HostConfig>,
    /// Cancelled at the first SIGTERM or SIGINT; sessions are its children.
    pub shutdown: CancellationToken,
    /// Held until the host exits: while it is, this instance is alive.
    _instance: box_backend::instance::InstanceLock,
}

/// Start the host for `box serve`: its backend, its instance id, its audit
/// log, the sweep of orphaned units and the signal handlers. A transport then
/// serves sessions until it ends, and [`Host::finish`] says what is left.
pub async fn start(serve: ServeConfig) -> anyhow::Result<Host> {
    let backend = select_backend(&serve.registry, &serve.backend).await?;
    let facts = host_facts(serve.workspace.as_ref())?;
    let mut config = HostConfig::new(backend, Catalog::new(serve.profile_dirs.clone()), facts);
    config.default_profile = serve.profile.clone();
    config.drain = serve.drain;
    config.fork_git = serve.fork_git.clone();
    let instance = if serve.takeover {
        take_over(&serve).await?
    } else {
        claim_instance(serve.instance.as_deref(), serve.listen.as_deref())?
    };
    config.instance = instance.id().to_owned();
    if let Some(path) = &serve.audit {
        config.audit =
            Some(audit::Audit::open(path).with_context(|| format!("--audit {}", path.display()))?);
    }
    if let Some(dir) = &serve.state {
        config.state = Some(state::Store::open(dir).map_err(|why| anyhow::anyhow!(why))?);
    }
    let config = Arc::new(config);
    // Before the sweep, which leaves every persisted unit alone.
    let persisted = state::adopt_all(&config);
    // Bounded: an engine that stalls must not keep the host from serving.
    if tokio::time::timeout(
        SWEEP_WAIT,
        sweep_orphans(&config, instance.previous_heartbeat(), &persisted),
    )
    .await
    .is_err()
    {
        tracing::warn!(
            "sweeping orphaned units took longer than {}; serving without it (`box gc` removes them later)",
            humantime::format_duration(SWEEP_WAIT)
        );
    }
    let shutdown = CancellationToken::new();
    watch_signals(shutdown.clone(), config.clone())?;
    Ok(Host {
        config,
        shutdown,
        _instance: instance,
    })
}

impl Host {
    /// After the transport has ended: failure when units are not confirmed
    /// removed (each named on stderr with how to remove it). The instance id
    /// is released here.
    pub fn finish(self) -> ExitCode {
        if report_units_left(&self.config) {
            return ExitCode::FAILURE;
        }
        ExitCode::SUCCESS
    }
}

/// Run one command through a session of its own; the exit code is the command's.
pub fn run(args: RunConfig) -> anyhow::Result<ExitCode> {
    // The command's own output is what a `box run` user reads: box speaks up
    // only for warnings and errors unless RUST_LOG asks for more.
    init_logging(&args.log_format, "warn")?;
    let runtime = runtime()?;
    let result = runtime.block_on(run::run(args));
    runtime.shutdown_timeout(Duration::from_millis(200));
    result
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod instance_tests {
    /// Two hosts on ephemeral ports (`127.0.0.1:0`) are two instances; two
    /// on the same fixed address are one claimed twice.
    #[test]
    fn hosts_on_ephemeral_ports_are_distinct_instances() {
        let first = super::claim_instance(None, Some("127.0.0.1:0")).unwrap();
        let second = super::claim_instance(None, Some("127.0.0.1:0")).unwrap();
        assert_ne!(first.id(), second.id());
        let port = format!("127.0.0.1:{}", 40000 + std::process::id() % 20000);
        let held = super::claim_instance(None, Some(&port)).unwrap();
        assert!(super::claim_instance(None, Some(&port)).is_err());
        drop(held);
    }
}
