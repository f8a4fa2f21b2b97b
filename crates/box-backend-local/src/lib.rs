//! The local backend: a unit is a process tree started by the host, confined
//! by the sandbox helper (`box sandbox`, hidden; see `helper`) that then runs
//! `box execute` (in its forked child, without executing box again). Used
//! where no Docker engine answers.
//!
//! What it owns: building the helper's spec from a unit spec (pure), the
//! unit's private temp directory and run directory (created per unit,
//! removed with it), the helper process (spec in on its stdin, report out on
//! its stdout; the executor's protocol then over the run directory's socket,
//! see `lease`), and the envelope, which is built from what the
//! helper *reports it applied*, read back from the kernel, never from what
//! was asked.
//!
//! Process tree of one unit:
//!
//! ```text
//! host ┄┄ box sandbox (the helper: own process group, no parent-death signal;
//!   ┆       outside the unit's confinement; box-init's supervisor: holds the
//!   ┆       lease, relays CMD's stdio to the host's socket in the unit's run
//!   ┆       directory, ends the unit when the lease lapses; a child subreaper)
//!   ┆       └─ init, pid 1 of the unit's pid namespace (reaps; its exit ends the
//!   ┆          namespace; SIGTERM ends it), or without one the unit's subreaper
//!   ┆            └─ box execute (confined: rlimits, no_new_privs, landlock, no
//!   ┆               capabilities, seccomp; the init is confined the same way)
//!   └┄┄ the run directory's socket (`RUNTIME/units/<random>/host.sock`):
//!       box-init's protocol, the unit key's proofs both ways
//! ```
//!
//! A unit outlives its host: when the host dies (or is stopped, or lets the
//! unit go) nobody renews the lease, and the helper kills the init (and with
//! it every process of the unit: the pid namespace, or as subreaper every
//! descendant) within the lease, reports the lapse if a host is connected,
//! and exits. A new host that binds the same run directory again while the
//! lease runs re-adopts the unit ([`Backend::adopt`]): the helper reconnects
//! every 250 ms to 1 s, both sides prove the unit key, and the new host
//! renews above the old epoch. The run directory holds the socket, the key
//! (0600) and a record (`local.json`: the unit's labels, its helper's pid
//! and start time, what the helper applied), from which `list` sees the
//! units of every host process (dead ones included), so `box gc` and the
//! host's sweep can remove them once their lease has surely lapsed. The
//! helper reaches the socket through a handle on the run directory opened
//! before any namespace: the unit's mount namespace hides the directory and
//! its landlock rules never grant it, so nothing in the unit reads the key.
//! The unit's stderr is a pipe to the host that started it: after that host
//! died, what the unit writes there is lost (EPIPE).
//!
//! What a unit sees of the host: the system directories (read-only), its
//! workspace and its private temp directory; every other host directory is
//! an empty tmpfs, which is what keeps host Unix sockets (Docker, SSH agent)
//! out of reach on kernels whose landlock cannot refuse a `connect`.
//!
//! Removal sends the helper SIGTERM, which it forwards to the unit's init;
//! the init ends at once (with a pid namespace, every process in it with it)
//! and the helper kills whatever is left of the unit before it reports and
//! goes; SIGKILL to the helper's group is the backstop (the init carries a
//! parent-death signal from the helper, so the unit still ends, though
//! without a pid namespace processes that left the init's tree can stay).
//!
//! A `box sandbox` run by hand (no `init` in its spec) holds no lease and
//! keeps the old shape: with `--parent` it dies with that process, and
//! without a pid namespace the helper confines itself and stays as CMD's
//! parent and the unit's subreaper.
//!
//! A workspace source `None` starts the executor with its root at an empty
//! directory in the unit's private temp (and, for a workspace unit, `--no-fs`
//! once the executor declares it: no file tools at all). `Empty` is a fresh
//! directory inside the unit's temp directory.
//! The workspace appears at its host path (the local backend has no bind
//! mounts); the envelope's `root` says which.

mod helper;
mod lease;
mod pool;
mod private;

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::io::AsyncBufReadExt;
use tokio::sync::watch;

use helper::{
    Applied, Report, SandboxSpec, SecretValues, SpecEgress, SpecHome, SpecNetwork, SpecRequirement,
    SpecTmp, SpecUser, SpecVolume,
};

/// What a new user's home holds (useradd's skeleton): a local unit's home
/// starts with a copy of it.
const SKEL: &str = "/etc/skel";
pub use helper::{ExecutorEntry, REFUSED_EXIT, SandboxArgs};

use box_backend::environment::{self, UnitEnvironment};
use box_backend::lifecycle;
use box_backend::{
    AdoptUnit, Backend, BackendError, DeliveredSecret, EgressWiring, Envelope, Hardening,
    ObjectsPlace, SessionLabel, StartedUnit, Unenforceable, UnitDetail, UnitEnd, UnitInfo,
    UnitWiring,
};
use box_confine::Rlimits;
use box_policy::envelope::{
    AppliedLimits, AppliedNetwork, BackendKind, EgressLimits, LocalNone, ProcessLimits, UnitState,
};
use box_policy::executor::{BIND_ON_STDIN_VAR, PlaceKind, SECRET_VALUE_PREFIX, SECRETS_DIR};
use box_policy::plan::{
    LocalUserland, MountMode, NetworkMode, Requirement, Role, TmpMode, UnitSpec, VolumePath,
    VolumeScope, WorkspaceSource,
};

/// Run the hidden `box sandbox` subcommand (the helper, in the unit's
/// process); `executor` runs `box execute` in place when CMD is this binary's.
pub fn sandbox(
    args: SandboxArgs,
    executor: helper::ExecutorEntry,
) -> anyhow::Result<std::process::ExitCode> {
    helper::run(args, executor)
}

/// The control a worktree fork's borrowed objects are refused under.
const BORROWED_OBJECTS: &str = "a worktree fork's borrowed git objects";

/// How long a unit may take to confine itself and report.
const CONFINE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long removal lets the helper end the unit after SIGTERM.
const TERM_GRACE: Duration = Duration::from_secs(2);

/// How long removal waits for a killed unit to be reaped.
const REAP_TIMEOUT: Duration = Duration::from_secs(10);

/// Choices the plan does not (yet) carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalOptions {
    /// The `box` binary to run as helper and executor.
    pub box_exe: PathBuf,
    /// User, mount, ipc and pid namespaces: best effort by default (they are
    /// blocked inside many containers); the envelope says which were entered.
    pub namespaces: Requirement,
    /// The least landlock ABI a `landlock = required` unit accepts.
    pub landlock_min_abi: u32,
    /// Where units' private temp directories are made: see [`default_temp_root`].
    pub temp_root: PathBuf,
}

/// `$XDG_RUNTIME_DIR` when set (a per-user tmpfs, size-capped by the login
/// manager, gone at logout), else the system temp directory. Creating and
/// removing a unit's directories is on every start and removal; on a busy
/// ext4 `/tmp` that alone can cost a millisecond.
pub fn default_temp_root() -> PathBuf {
    std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|dir| dir.is_absolute() && dir.is_dir())
        .unwrap_or_else(std::env::temp_dir)
}

/// The local sandboxed-process backend.
pub struct LocalBackend {
    options: LocalOptions,
    /// Where run directories are looked for by `list` (`box gc`, the
    /// sweep): the default runtime directory, and every one a start was
    /// wired with.
    runtime_dirs: Mutex<Vec<PathBuf>>,
    /// The host kernel's landlock ABI, read once at construction.
    landlock_abi: u32,
    units: Mutex<HashMap<String, LocalUnit>>,
    /// The last walk for the host's root-only system files (`private`),
    /// used while every entry it judged is unchanged.
    private_files: Arc<Mutex<Option<CheckedWalk>>>,
    /// Where units' volumes are kept.
    volumes: box_backend::volumes::VolumeStore,
}

/// A started (or re-adopted) unit, as the registry keeps it.
struct LocalUnit {
    info: UnitInfo,
    /// The helper's pid, which is also its process group.
    group: i32,
    temp: PathBuf,
    /// Its run directory (the socket, the key, the record).
    run_dir: PathBuf,
    /// The helper's wait status once reaped (`Some(None)`: reaped, status unknown).
    exited: watch::Receiver<Option<Option<ExitStatus>>>,
    removed: Arc<std::sync::atomic::AtomicBool>,
    /// The session whose session-scoped volumes the unit mounts: they go
    /// with the session's last unit.
    session_volumes: Option<SessionLabel>,
}

impl LocalBackend {
    /// A backend running `box_exe` as helper and executor, with default options.
    pub fn new(box_exe: PathBuf) -> Self {
        Self::with_options(LocalOptions {
            box_exe,
            namespaces: Requirement::BestEffort,
            landlock_min_abi: 1,
            temp_root: default_temp_root(),
        })
    }

    /// A backend with explicit options.
    pub fn with_options(options: LocalOptions) -> Self {
        Self {
            options,
            runtime_dirs: Mutex::new(vec![box_backend::default_runtime_dir()]),
            landlock_abi: box_confine::landlock_abi(),
            units: Mutex::new(HashMap::new()),
            private_files: Arc::new(Mutex::new(None)),
            volumes: box_backend::volumes::VolumeStore::default(),
        }
    }

    /// This backend with its units' volumes kept in `store` (by default
    /// box's state directory's, [`box_backend::volumes::default_dir`]).
    #[must_use]
    pub fn with_volume_store(mut self, store: box_backend::volumes::VolumeStore) -> Self {
        self.volumes = store;
        self
    }

    /// A backend running this very binary (the `box` host).
    pub fn current() -> Result<Self, BackendError> {
        let exe = std::env::current_exe().map_err(|error| BackendError::Other {
            unit: String::new(),
            doing: "finding the box binary".to_owned(),
            message: error.to_string(),
        })?;
        Ok(Self::new(exe))
    }

    /// Start one unit running `command` in place of the executor (tests probe
    /// from inside with this; `start` passes the executor).
    pub async fn start_command(
        &self,
        session: &SessionLabel,
        spec: &UnitSpec,
        command: Vec<OsString>,
    ) -> Result<StartedUnit, BackendError> {
        self.start_command_wired(session, spec, &UnitWiring::default(), command)
            .await
    }

    /// [`start_command`](Self::start_command) with what the host wires in
    /// (the egress proxy's socket, a worktree fork's borrowed git objects).
    pub async fn start_command_wired(
        &self,
        session: &SessionLabel,
        spec: &UnitSpec,
        wiring: &UnitWiring,
        command: Vec<OsString>,
    ) -> Result<StartedUnit, BackendError> {
        self.start_for(session, spec, wiring, command, false)
            .await
            .map(|(started, _)| started)
    }

    /// [`start_command_wired`](Self::start_command_wired), or with `pooled`
    /// a unit for a pool: no session's secrets (their tmpfs mounted where
    /// the plan has secrets, empty), its executor waiting for a bind line
    /// (`BIND_ON_STDIN_VAR`), its record marked with its pool; then also
    /// what a bind needs again.
    async fn start_for(
        &self,
        session: &SessionLabel,
        spec: &UnitSpec,
        wiring: &UnitWiring,
        command: Vec<OsString>,
        pooled: bool,
    ) -> Result<(StartedUnit, Option<pool::PoolDetail>), BackendError> {
        // An egress unit without its proxy would have no way out at all, and a
        // proxy wired into a unit that did not ask for one would be a way out.
        match (spec.network.mode, &wiring.egress) {
            (NetworkMode::Egress, None) => {
                return Err(BackendError::Unenforceable {
                    unit: spec.name.clone(),
                    control: "network egress allow list".to_owned(),
                    why: "no egress proxy was wired into the unit (a host starts one per egress unit)".to_owned(),
                });
            }
            (NetworkMode::None | NetworkMode::Bridge, Some(_)) => {
                return Err(BackendError::Other {
                    unit: spec.name.clone(),
                    doing: "wiring the egress proxy".to_owned(),
                    message: format!(
                        "the unit's network is {}, not egress",
                        spec.network.mode.as_str()
                    ),
                });
            }
            _ => {}
        }
        // The borrowed objects are bound read-only in the unit's own mount
        // namespace; without one they would be the host's, writable where
        // landlock is not enforced.
        if wiring.objects.is_some()
            && let Err(why) = self.objects_place(spec)
        {
            return Err(BackendError::Unenforceable {
                unit: spec.name.clone(),
                control: BORROWED_OBJECTS.to_owned(),
                why,
            });
        }
        if let Err(refusals) = self.check(spec)
            && let Some(first) = refusals.into_iter().next()
        {
            return Err(first.into());
        }
        let mut layout = Layout::name(&self.options.temp_root, session, spec)?;
        layout.volumes = prepare_volumes(&self.volumes, session, spec)?;
        let runtime_dir = wiring
            .runtime_dir
            .clone()
            .unwrap_or_else(box_backend::default_runtime_dir);
        {
            let mut dirs = self
                .runtime_dirs
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if !dirs.contains(&runtime_dir) {
                dirs.push(runtime_dir.clone());
            }
        }
        let run_dir =
            lease::create_run_dir(&runtime_dir).map_err(|message| BackendError::Other {
                unit: spec.name.clone(),
                doing: "making the unit's run directory".to_owned(),
                message,
            })?;
        // From here on, a failure or a dropped future undoes the start.
        let mut guard = StartGuard {
            temp: layout.temp.clone(),
            run_dir: run_dir.clone(),
            group: None,
            finished: false,
        };
        let mut environment = unit_environment(std::env::vars_os(), spec, &layout);
        // A pooled unit has no session yet: no secret's value reaches it
        // before a claim (the bind line carries them), though their tmpfs
        // is mounted where the plan has secrets.
        let pool = pooled.then_some(!spec.env_secrets.is_empty());
        if pooled {
            environment.secrets.clear();
        }
        // Only the secrets the host has are delivered (a missing one is said
        // in the log, like a missing passed variable).
        let narrowed;
        let spec = if environment.secrets.len() == spec.env_secrets.len() {
            spec
        } else {
            let mut delivered = spec.clone();
            delivered
                .env_secrets
                .retain(|name| environment.secrets.iter().any(|(have, _)| have == name));
            delivered
                .env_secrets_as_env
                .retain(|name| delivered.env_secrets.contains(name));
            narrowed = delivered;
            &narrowed
        };
        let executor = command.is_empty();
        let command = if executor {
            executor_command(&self.options.box_exe, spec, &layout, wiring)
        } else {
            command
        };
        let started = self
            .launch(
                session,
                spec,
                &layout,
                (command, executor, pool),
                (environment, wiring),
                &mut guard,
            )
            .await?;
        guard.finished = true;
        Ok(started)
    }

    async fn launch(
        &self,
        session: &SessionLabel,
        spec: &UnitSpec,
        layout: &Layout,
        // CMD, whether it is box's executor (which delivers the secrets),
        // and for a pooled unit whether it gets the secrets' tmpfs.
        (command, executor, pool): (Vec<OsString>, bool, Option<bool>),
        // With what the host wires into it (egress, borrowed objects, the
        // unit it was forked from, for `box units ls`).
        (environment, wiring): (UnitEnvironment, &UnitWiring),
        // Also holds the unit's run directory.
        guard: &mut StartGuard,
    ) -> Result<(StartedUnit, Option<pool::PoolDetail>), BackendError> {
        let run_dir = guard.run_dir.clone();
        let run_dir = run_dir.as_path();
        let unit = spec.name.clone();
        let other = |doing: &str, message: String| BackendError::Other {
            unit: unit.clone(),
            doing: doing.to_owned(),
            message,
        };
        if !environment.missing.is_empty() {
            let missing = &environment.missing;
            let missing = missing.join(", ");
            tracing::info!(unit, %missing, "variables to pass are not set on the host");
        }
        let mut sandbox_spec = sandbox_spec(spec, layout, &environment, &self.options, wiring)?;
        if let Some(secrets) = pool {
            sandbox_spec.secrets_dir = secrets.then(|| PathBuf::from(SECRETS_DIR));
            sandbox_spec
                .env
                .push((BIND_ON_STDIN_VAR.to_owned(), "1".to_owned()));
        }
        // The unit's init side: the helper holds the lease and relays the
        // executor's stdio to this socket with box-init's protocol, proving
        // the unit's key, and ends the unit when the renewals stop.
        let listener = box_init::host::bind(run_dir)
            .map_err(|error| other("listening for the unit's helper", error.to_string()))?;
        let key = box_init::protocol::UnitKey::generate();
        lifecycle::write_private(&run_dir.join(lease::KEY), key.to_hex().as_bytes())
            .map_err(|message| other("keeping the unit's key", message))?;
        let identity = format!("{}/{}/{}", session.instance, session.session, unit);
        sandbox_spec.init = Some(helper::SpecInit {
            run_dir: run_dir.to_owned(),
            unit: identity.clone(),
            key: key.to_hex(),
            ttl_ms: u64::try_from(spec.lease.as_millis()).unwrap_or(u64::MAX),
        });
        // A unit that is the host's uid 0 gets the host's root-only files
        // covered. Finding them (a check of the last walk, or a walk) runs
        // while the helper is being executed.
        let private = nix::unistd::geteuid().is_root().then(|| {
            let state = Arc::clone(&self.private_files);
            tokio::task::spawn_blocking(move || private_files(&state))
        });

        // The helper reads its spec from stdin and reports on stdout; then
        // the executor's protocol goes over the run directory's socket. No
        // extra fds, so no `pre_exec`, so the spawn stays a cheap
        // vfork-style `posix_spawn` whatever the host's size. No `--parent`:
        // the unit outlives this host by its lease, so a later one can
        // re-adopt it.
        let mut helper = std::process::Command::new(&self.options.box_exe);
        helper
            .arg("sandbox")
            .arg("--spec-stdin")
            .arg("--report-stdout")
            .arg("--")
            .args(&command)
            .env_clear()
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let (spawned_tx, spawned_rx) = tokio::sync::oneshot::channel();
        let (exited_tx, exited_rx) = watch::channel(None);
        // The thread that spawns the helper waits for it (while this host
        // lives), so its exit status is known.
        std::thread::Builder::new()
            .name(format!("box-local-{unit}"))
            // It only spawns and waits: a small stack keeps a host with many
            // units lean.
            .stack_size(256 * 1024)
            .spawn(move || {
                let mut child = match helper.spawn() {
                    Ok(child) => child,
                    Err(error) => {
                        let _ = spawned_tx.send(Err(error));
                        return;
                    }
                };
                let stdin = child.stdin.take();
                let id = child.id();
                if spawned_tx
                    .send(Ok((stdin, child.stdout.take(), child.stderr.take(), id)))
                    .is_err()
                {
                    // The start was dropped before it learnt of the helper:
                    // nobody else can end this unit.
                    kill_group(i32::try_from(id).unwrap_or(i32::MAX));
                }
                let status = loop {
                    match child.wait() {
                        Ok(status) => break Some(status),
                        Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(_) => break None,
                    }
                };
                let _ = exited_tx.send(Some(status));
            })
            .map_err(|error| other("starting the unit's thread", error.to_string()))?;
        let (stdin, stdout, stderr, pid) = spawned_rx
            .await
            .map_err(|_| other("spawning the sandbox helper", "thread ended".to_owned()))?
            .map_err(|error| {
                other(
                    "spawning the sandbox helper",
                    format!("{}: {error}", self.options.box_exe.display()),
                )
            })?;
        let group = i32::try_from(pid).unwrap_or(i32::MAX);
        guard.group = Some(group);
        let undo = |error: BackendError| {
            let mut exited = exited_rx.clone();
            async move {
                kill_group(group);
                let _ = tokio::time::timeout(REAP_TIMEOUT, exited.wait_for(Option::is_some)).await;
                error
            }
        };
        let (Some(stdin), Some(stdout), Some(stderr)) = (stdin, stdout, stderr) else {
            return Err(undo(other("spawning the sandbox helper", "no stdio".to_owned())).await);
        };
        // The unit's stderr (the helper's refusals, the executor's logs) goes
        // to the host's log under the unit's name, never raw to the host's
        // terminal: its bytes are the unit's to choose.
        match tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(stderr)) {
            Ok(stderr) => {
                tokio::spawn(log_stderr(stderr, session.session.clone(), unit.clone()));
            }
            Err(error) => {
                return Err(
                    undo(other("attaching the executor's stderr", error.to_string())).await,
                );
            }
        }
        let attached = tokio::net::unix::pipe::Sender::from_owned_fd(OwnedFd::from(stdin))
            .and_then(|stdin| {
                let stdout =
                    tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(stdout))?;
                Ok((stdin, stdout))
            });
        let (mut stdin, stdout) = match attached {
            Ok(attached) => attached,
            Err(error) => {
                return Err(undo(other("attaching the helper's stdio", error.to_string())).await);
            }
        };
        // The directories are made while the helper is being executed (the
        // slowest part of a start, on another core), and the spec, which
        // names them, is sent once they exist.
        if let Err(error) = layout.make(spec) {
            return Err(undo(error).await);
        }
        if let Some(private) = private {
            match private.await {
                Ok(walk) => sandbox_spec.conceal = walk.found().to_vec(),
                Err(error) => {
                    let error = other("finding the host's root-only files", error.to_string());
                    return Err(undo(error).await);
                }
            }
        }
        let spec_json = match serde_json::to_vec(&sandbox_spec) {
            Ok(json) => json,
            Err(error) => {
                return Err(undo(other("encoding the sandbox spec", error.to_string())).await);
            }
        };
        let mut message = format!("{}\n", spec_json.len()).into_bytes();
        message.extend_from_slice(&spec_json);
        if let Err(error) = tokio::io::AsyncWriteExt::write_all(&mut stdin, &message).await {
            return Err(undo(other("sending the sandbox spec", error.to_string())).await);
        }
        drop(stdin);
        // The one line on stdout is the helper's report.
        let mut stdout = tokio::io::BufReader::new(stdout);
        let mut line = String::new();
        let first = tokio::time::timeout(CONFINE_TIMEOUT, stdout.read_line(&mut line)).await;
        drop(stdout);
        let applied = match first {
            Ok(Ok(0)) => Err(other(
                "confining the unit",
                "the helper exited without reporting (see the host's stderr)".to_owned(),
            )),
            Ok(Ok(_)) => match serde_json::from_str::<Report>(&line) {
                Ok(Report::Confined(applied)) => Ok(*applied),
                Ok(Report::Refused { control, why }) => Err(BackendError::Unenforceable {
                    unit: unit.clone(),
                    control,
                    why,
                }),
                Ok(Report::Failed { doing, message }) => Err(BackendError::Other {
                    unit: unit.clone(),
                    doing,
                    message,
                }),
                Err(error) => Err(other(
                    "reading the helper's report",
                    format!("{error}: {}", line.trim_end()),
                )),
            },
            Ok(Err(error)) => Err(other("reading the helper's report", error.to_string())),
            Err(_) => Err(other(
                "confining the unit",
                format!("no report within {}s", CONFINE_TIMEOUT.as_secs()),
            )),
        };
        let applied = match applied {
            Ok(applied) => applied,
            Err(error) => return Err(undo(error).await),
        };
        // The helper connects right after its report; a helper that ends
        // first ends the wait.
        let accepted = {
            let mut exited = exited_rx.clone();
            let helper_ended = async move {
                let _ = exited.wait_for(Option::is_some).await;
            };
            lifecycle::accept(&listener, (&key, &identity), CONFINE_TIMEOUT, helper_ended).await
        };
        let connected = match accepted {
            Ok(connected) => connected,
            Err(unconnected) => {
                let message = match unconnected {
                    lifecycle::Unconnected::Ended => {
                        "the helper ended before it connected (see the host's log)".to_owned()
                    }
                    lifecycle::Unconnected::Failed(message) => message,
                };
                return Err(undo(other("connecting to the unit's helper", message)).await);
            }
        };
        let lease_ms = applied.lease_ms;
        // Random, as a container's id is: unique, and never a pid another
        // process may come to hold. Not the run directory's name, which the
        // session that reads the envelope has no business knowing.
        let id = format!("{:032x}", rand::random::<u128>());
        let mut envelope = envelope(spec, &sandbox_spec, &applied, &environment, &id, layout);
        // Only box's executor writes the secrets (a stand-in command gets the
        // tmpfs, empty).
        if executor && applied.secrets_mounted {
            envelope.secrets = delivered_secrets(spec);
        }
        let created = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
        let record = lease::Record {
            id: id.clone(),
            instance: session.instance.clone(),
            session: session.session.clone(),
            unit: unit.clone(),
            profile: session.profile.clone(),
            created,
            parent: wiring.parent.clone(),
            lease_ms: lease_ms.unwrap_or_default(),
            helper: pid,
            helper_start: lease::start_time(pid).unwrap_or_default(),
            temp: layout.temp.clone(),
            workspace: layout.workspace.clone(),
            executor,
            spec: sandbox_spec.kept(),
            applied: applied.clone(),
            pool: pool.map(|_| session.profile.clone()),
            envelope: serde_json::to_value(&envelope).ok(),
        };
        if let Err(message) = record.write(run_dir) {
            return Err(undo(other("recording the unit", message)).await);
        }
        let removed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // The listener lives as long as the renewals; the run directory
        // stays (removal, or `box gc` once the unit ended, removes it).
        let relay = lifecycle::relay(
            connected,
            (spec.lease, lifecycle::START_EPOCH),
            run_dir.to_owned(),
            listener,
            format!("{}/{}", session.session, unit),
        );
        let ended = unit_ended(
            relay.ended,
            exited_rx.clone(),
            Arc::clone(&removed),
            lease_ms,
        );
        let local = LocalUnit {
            info: record.info("running"),
            group,
            temp: layout.temp.clone(),
            run_dir: run_dir.to_owned(),
            exited: exited_rx,
            removed,
            session_volumes: record.session_volumes(),
        };
        self.registry().insert(id, local);
        let detail = pool.map(|_| pool::PoolDetail {
            layout: layout.clone(),
            sandbox_spec: sandbox_spec.kept(),
            applied,
            run_dir: run_dir.to_owned(),
            record,
        });
        Ok((
            StartedUnit {
                envelope,
                io: relay.io,
                ended,
                renewal: Some(relay.renewal),
            },
            detail,
        ))
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, HashMap<String, LocalUnit>> {
        // A panic while holding the lock cannot leave the map half-updated
        // (single inserts and removes), so a poisoned lock is still usable.
        self.units
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn remove_unit(&self, id: &str) -> Result<(), BackendError> {
        let record = self.registry().remove(id);
        let record = match record {
            Some(record) => record,
            // A unit of another host process (dead, or this one's before a
            // restart), found by its run directory: `box gc`, the sweep.
            None => match self.recorded(id) {
                Some((run_dir, found)) => LocalUnit {
                    info: found.info("running"),
                    group: i32::try_from(found.helper).unwrap_or(i32::MAX),
                    temp: found.temp.clone(),
                    run_dir,
                    exited: watch_exit(found.helper, found.helper_start),
                    removed: Arc::new(std::sync::atomic::AtomicBool::new(true)),
                    session_volumes: found.session_volumes(),
                },
                None => return Ok(()),
            },
        };
        record
            .removed
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let mut exited = record.exited.clone();
        let alive = || exited_now(&record.exited).is_none();
        // SIGTERM to the helper first: it forwards it to the unit's init,
        // which ends (with a pid namespace, every process in it with it),
        // and kills what is left before it reports and goes. SIGKILL to the
        // helper's group is the backstop. ESRCH (gone) is fine; a helper
        // already seen ended is not signalled (its pid may be another's).
        if alive() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(record.group),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let terminated = tokio::time::timeout(TERM_GRACE, exited.wait_for(Option::is_some))
            .await
            .is_ok();
        if !terminated {
            kill_group(record.group);
        }
        let reaped = terminated
            || tokio::time::timeout(REAP_TIMEOUT, exited.wait_for(Option::is_some))
                .await
                .is_ok();
        let removed = remove_dir(&record.temp);
        let _ = remove_dir(&record.run_dir);
        if reaped && let Some(session) = &record.session_volumes {
            remove_session_volumes(&self.volumes, session);
        }
        if !reaped {
            return Err(BackendError::Other {
                unit: record.info.unit,
                doing: "removing the unit".to_owned(),
                message: format!(
                    "process group {} was sent SIGKILL but not reaped within {}s",
                    record.group,
                    REAP_TIMEOUT.as_secs()
                ),
            });
        }
        removed.map_err(|error| BackendError::Other {
            unit: record.info.unit,
            doing: format!("removing {}", record.temp.display()),
            message: error.to_string(),
        })
    }

    /// The live units that mount `listed` (their records name its
    /// directory, their helpers live).
    pub fn volume_users(&self, listed: &box_backend::volumes::ListedVolume) -> Vec<UnitInfo> {
        let data = listed.dir.join("data");
        self.recorded_all()
            .into_iter()
            .filter(|(_, record)| {
                record.helper_alive()
                    && record.spec.volumes.iter().any(|volume| volume.data == data)
            })
            .map(|(_, record)| record.info("running"))
            .collect()
    }

    /// Remove `listed`, unless a live unit holds its lock: then an error
    /// naming the units that use it.
    pub fn remove_volume(&self, listed: &box_backend::volumes::ListedVolume) -> Result<(), String> {
        if box_backend::volumes::in_use_locally(listed) {
            let users: Vec<String> = self
                .volume_users(listed)
                .iter()
                .map(|unit| format!("unit {} of session {}", unit.unit, unit.session))
                .collect();
            let users = if users.is_empty() {
                "a running unit".to_owned()
            } else {
                users.join(", ")
            };
            return Err(format!(
                "volume {} ({}) is in use by {users}; end its session first (`box units ls` shows it)",
                listed.record.name, listed.key
            ));
        }
        box_backend::volumes::remove(listed)
    }

    /// Every run directory with a local record, in the runtime directories
    /// this backend knows.
    fn recorded_all(&self) -> Vec<(PathBuf, lease::Record)> {
        let dirs = self
            .runtime_dirs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        dirs.iter().flat_map(|dir| lease::run_dirs(dir)).collect()
    }

    /// The run directory and record of unit `id`: the one whose helper lives,
    /// if any (an older box's id is a pid, which an ended unit's leftover
    /// record may share with a live one).
    fn recorded(&self, id: &str) -> Option<(PathBuf, lease::Record)> {
        let mut found: Vec<_> = self
            .recorded_all()
            .into_iter()
            .filter(|(_, record)| record.id == id)
            .collect();
        found.sort_by_key(|(_, record)| !record.helper_alive());
        found.into_iter().next()
    }

    /// [`Backend::adopt`]: the run directory's record checked against what
    /// was persisted (the same unit id, session and unit, its helper still
    /// the process recorded), its key read from the run directory, the
    /// socket bound again, the helper's connection accepted with the same
    /// proofs a docker unit's init gives, and the lease renewed above the
    /// previous host's epoch before anything else.
    async fn adopt_unit(
        &self,
        session: &SessionLabel,
        spec: &UnitSpec,
        unit: &AdoptUnit,
    ) -> Result<StartedUnit, BackendError> {
        let name = spec.name.as_str();
        let refused = |doing: &str, message: String| BackendError::Other {
            unit: name.to_owned(),
            doing: doing.to_owned(),
            message,
        };
        let record = lease::Record::read(&unit.run_dir).map_err(|why| {
            refused(
                "re-adopting the unit",
                format!(
                    "unit {} is gone: its run directory's record cannot be read ({why}): removed, or its lease lapsed",
                    unit.id
                ),
            )
        })?;
        // A warm unit keeps its pool's session (`pool-N`): the one the
        // identity its host persisted names.
        let session_want = if record.pool.is_some() {
            unit.identity.rsplit('/').nth(1).unwrap_or_default()
        } else {
            session.session.as_str()
        };
        for (what, have, want) in [
            ("id", record.id.as_str(), unit.id.as_str()),
            ("session", record.session.as_str(), session_want),
            ("unit", record.unit.as_str(), name),
        ] {
            if have != want {
                return Err(refused(
                    "re-adopting the unit",
                    format!(
                        "the run directory {} holds {what} `{have}`, not `{want}`: it is not the unit persisted",
                        unit.run_dir.display()
                    ),
                ));
            }
        }
        if !record.helper_alive() {
            return Err(refused(
                "re-adopting the unit",
                format!(
                    "unit {} is gone: its helper (pid {}) has ended (removed, or its lease lapsed)",
                    unit.id, record.helper
                ),
            ));
        }
        let key = std::fs::read_to_string(unit.run_dir.join(lease::KEY))
            .map_err(|error| refused("reading the unit's key", error.to_string()))
            .and_then(|hex| {
                box_init::protocol::UnitKey::from_hex(hex.trim())
                    .map_err(|error| refused("reading the unit's key", error.to_string()))
            })?;
        let exited = watch_exit(record.helper, record.helper_start);
        let helper_ended = {
            let mut exited = exited.clone();
            async move {
                let _ = exited.wait_for(Option::is_some).await;
                format!(
                    "unit {} ended (its lease lapsed) before its helper reconnected",
                    unit.id
                )
            }
        };
        let (listener, connected, epoch) = lifecycle::reconnect(
            &unit.run_dir,
            (&key, &unit.identity),
            (unit.timeout, spec.lease),
            "helper",
            helper_ended,
        )
        .await
        .map_err(|why| refused(&why.doing, why.message))?;
        let layout = Layout {
            tmp: record.temp.join("tmp"),
            home: record.temp.join("home"),
            temp: record.temp.clone(),
            workspace: record.workspace.clone(),
            volumes: Vec::new(),
        };
        let mut envelope = envelope_from_parts(
            spec,
            &record.spec,
            &record.applied,
            (unit.env_passed.clone(), unit.env_scrubbed.clone()),
            &record.id,
            &layout,
        );
        if record.executor && record.applied.secrets_mounted {
            envelope.secrets = delivered_secrets(spec);
        }
        let removed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let relay = lifecycle::relay(
            connected,
            (spec.lease, epoch),
            unit.run_dir.clone(),
            listener,
            format!("{}/{}", session.session, name),
        );
        let ended = unit_ended(
            relay.ended,
            exited.clone(),
            Arc::clone(&removed),
            Some(record.lease_ms),
        );
        let local = LocalUnit {
            info: record.info("running"),
            group: i32::try_from(record.helper).unwrap_or(i32::MAX),
            temp: record.temp.clone(),
            run_dir: unit.run_dir.clone(),
            exited,
            removed,
            session_volumes: record.session_volumes(),
        };
        self.registry().insert(record.id.clone(), local);
        Ok(StartedUnit {
            envelope,
            io: relay.io,
            ended,
            renewal: Some(relay.renewal),
        })
    }
}

/// The end of a unit's helper as far as is known now.
fn exited_now(exited: &watch::Receiver<Option<Option<ExitStatus>>>) -> Option<Option<ExitStatus>> {
    *exited.borrow()
}

/// Watch a helper this process did not start (no wait status: `Some(None)`
/// once it has ended), through a pidfd, else by polling its start time.
fn watch_exit(pid: u32, start: u64) -> watch::Receiver<Option<Option<ExitStatus>>> {
    use std::os::fd::FromRawFd as _;
    let (sender, receiver) = watch::channel(None);
    let raw = i32::try_from(pid).unwrap_or(i32::MAX);
    // SAFETY: pidfd_open with integer arguments; a non-negative result is a
    // new fd this process owns.
    let opened = unsafe { libc::syscall(libc::SYS_pidfd_open, raw, 0) };
    let pidfd = i32::try_from(opened)
        .ok()
        .filter(|fd| *fd >= 0)
        // SAFETY: the fd was just opened and is owned by nobody else.
        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) });
    // Checked after the pidfd, so the pidfd is the recorded process's.
    if lease::start_time(pid) != Some(start) {
        let _ = sender.send(Some(None));
        return receiver;
    }
    tokio::spawn(async move {
        let watched = pidfd.and_then(|fd| {
            // SAFETY: the `OwnedFd` is moved into the `AsyncFd` and stays open,
            // the same fd, for as long as it lives.
            unsafe {
                tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
            }
            .ok()
        });
        match watched {
            Some(fd) => {
                let _ = fd.readable().await;
            }
            None => {
                while lease::start_time(pid) == Some(start) {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        let _ = sender.send(Some(None));
    });
    receiver
}

impl Backend for LocalBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Local
    }

    /// The egress socket's directory and borrowed objects are bound back
    /// at their host paths in the unit's mount namespace (`objects_place`
    /// says for which specs); the helper's supervisor reconnects to a later
    /// host; volumes are mounted by the helper. No host file over a
    /// workspace file.
    fn capabilities(&self) -> box_backend::Capabilities {
        box_backend::Capabilities {
            host_files: false,
            ..box_backend::Capabilities::ALL
        }
    }

    fn check(&self, spec: &UnitSpec) -> Result<(), Vec<Unenforceable>> {
        let mut refusals = check_spec(spec, Some(self.landlock_abi))
            .err()
            .unwrap_or_default();
        if self.options.namespaces == Requirement::Off {
            let refuse = |control: &str, why: &str| Unenforceable {
                unit: spec.name.clone(),
                control: control.to_owned(),
                why: why.to_owned(),
            };
            if spec.network.mode == NetworkMode::Egress {
                refusals.push(refuse(
                    "network egress allow list",
                    "an egress unit needs a network namespace of its own (only lo), and this backend is set to make none",
                ));
            }
            if !spec.env_secrets.is_empty() {
                refusals.push(refuse(
                    "env.secrets",
                    "secrets need a mount namespace of its own (a private tmpfs at /run/secrets), and this backend is set to make none",
                ));
            }
            for volume in &spec.volumes {
                if matches!(volume.path, VolumePath::Absolute(_)) {
                    refusals.push(refuse(
                        &format!("volume {:?}", volume.name),
                        "a volume away from the home needs a mount namespace of its own to be mounted, and this backend is set to make none; give it a ~/ path",
                    ));
                }
            }
        }
        if refusals.is_empty() {
            Ok(())
        } else {
            Err(refusals)
        }
    }

    /// A worktree fork's borrowed objects are seen at their host path: the
    /// helper keeps that directory in the unit's view (every other host
    /// directory is an empty tmpfs there) and binds it back read-only. That
    /// needs the unit's own mount namespace.
    fn objects_place(&self, spec: &UnitSpec) -> Result<ObjectsPlace, String> {
        let why = if self.options.namespaces == Requirement::Off {
            "this backend is set to make no namespaces"
        } else if spec
            .security
            .host_namespaces
            .iter()
            .any(|namespace| namespace == "mount")
        {
            "the unit shares the host's mount namespace (security.host_namespaces)"
        } else {
            return Ok(ObjectsPlace::HostPath);
        };
        Err(format!(
            "the local backend binds the parent's git objects read-only into a unit's own mount namespace, and {why}"
        ))
    }

    fn start<'a>(
        &'a self,
        session: &'a SessionLabel,
        spec: &'a UnitSpec,
    ) -> BoxFuture<'a, Result<StartedUnit, BackendError>> {
        self.start_command(session, spec, Vec::new()).boxed()
    }

    fn start_wired<'a>(
        &'a self,
        session: &'a SessionLabel,
        spec: &'a UnitSpec,
        wiring: &'a UnitWiring,
    ) -> BoxFuture<'a, Result<StartedUnit, BackendError>> {
        // What this backend cannot wire is refused, never silently left out.
        if let Err(refusal) = self
            .capabilities()
            .refuse(self.kind(), &spec.name, wiring.wants())
        {
            return futures::future::ready(Err(refusal.into())).boxed();
        }
        self.start_command_wired(session, spec, wiring, Vec::new())
            .boxed()
    }

    fn remove<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), BackendError>> {
        self.remove_unit(id).boxed()
    }

    /// A pooled unit is confined by its helper as a cold one of the pool's
    /// plan; its executor takes the session's at the claim (`pool`).
    fn pooling(&self) -> Option<&dyn box_backend::pool::Pooling> {
        Some(self)
    }

    fn adopt<'a>(
        &'a self,
        session: &'a SessionLabel,
        spec: &'a UnitSpec,
        unit: &'a AdoptUnit,
    ) -> BoxFuture<'a, Result<StartedUnit, BackendError>> {
        self.adopt_unit(session, spec, unit).boxed()
    }

    /// The unit's record: its workspace, its helper while it lives, the
    /// envelope its start reported.
    fn inspect<'a>(
        &'a self,
        unit: &'a UnitInfo,
    ) -> BoxFuture<'a, Result<UnitDetail, BackendError>> {
        let mut detail = UnitDetail::listed(unit.clone());
        if let Some((_, record)) = self.recorded(&unit.id) {
            detail.pid = record.helper_alive().then_some(record.helper);
            detail.workspace = record.workspace.clone();
            detail.envelope = record.envelope;
        }
        futures::future::ready(Ok(detail)).boxed()
    }

    /// A local unit has no cgroup of its own: its usage is summed over its
    /// helper's process tree in `/proc` (its memory's peak is unknown).
    fn stats<'a>(
        &'a self,
        id: &'a str,
    ) -> BoxFuture<'a, Result<box_backend::stats::UnitStats, BackendError>> {
        let stats = match self.recorded(id) {
            Some((_, record)) if record.helper_alive() => {
                box_backend::stats::process_tree(Path::new("/proc"), record.helper)
            }
            _ => None,
        };
        futures::future::ready(stats.ok_or_else(|| BackendError::Other {
            unit: id.to_owned(),
            doing: "reading its resource usage".to_owned(),
            message: "no such running local unit (see `box units ls --backend local`)".to_owned(),
        }))
        .boxed()
    }

    /// Measured through the first of the helper's descendants in the
    /// unit's own mount namespace (the helper stays in the host's).
    fn used<'a>(&'a self, id: &'a str, paths: &'a [PathBuf]) -> BoxFuture<'a, Vec<Option<u64>>> {
        let proc_root = Path::new("/proc");
        let inside = match self.recorded(id) {
            Some((_, record)) if record.helper_alive() => {
                box_backend::stats::in_own_mount_namespace(proc_root, record.helper)
            }
            _ => None,
        };
        let used = paths
            .iter()
            .map(|path| inside.and_then(|pid| box_backend::stats::used_in(proc_root, pid, path)))
            .collect();
        futures::future::ready(used).boxed()
    }

    /// This process's units, and every unit with a run directory of another
    /// host process (dead or alive: the host's sweep and `box gc` judge
    /// which may go), `running` while its helper lives.
    fn list(&self) -> BoxFuture<'_, Result<Vec<UnitInfo>, BackendError>> {
        let (mut units, ours): (Vec<UnitInfo>, Vec<PathBuf>) = self
            .registry()
            .values()
            .map(|record| {
                let mut info = record.info.clone();
                if record.exited.borrow().is_some() {
                    "ended".clone_into(&mut info.state);
                }
                (info, record.run_dir.clone())
            })
            .unzip();
        for (run_dir, record) in self.recorded_all() {
            if !ours.contains(&run_dir) {
                let state = if record.helper_alive() {
                    "running"
                } else {
                    "ended"
                };
                units.push(record.info(state));
            }
        }
        futures::future::ready(Ok(units)).boxed()
    }
}

/// Make `spec`'s volumes ready in box's volume store for `session`: each
/// one's directory, its content's handed to the unit's user.
fn prepare_volumes(
    store: &box_backend::volumes::VolumeStore,
    session: &SessionLabel,
    spec: &UnitSpec,
) -> Result<Vec<LocalVolume>, BackendError> {
    // The unit runs as its spec's user, else as box's own.
    let owner = spec.user.or_else(|| {
        Some(box_policy::plan::UserIds {
            uid: nix::unistd::geteuid().as_raw(),
            gid: nix::unistd::getegid().as_raw(),
        })
    });
    spec.volumes
        .iter()
        .map(|volume| {
            let prepared = store
                .prepare(BackendKind::Local, volume, session, owner)
                .map_err(|message| BackendError::Other {
                    unit: spec.name.clone(),
                    doing: format!("preparing volume {}", volume.name),
                    message,
                })?;
            Ok(LocalVolume {
                volume: volume.clone(),
                prepared,
                profile: session.profile.clone(),
            })
        })
        .collect()
}

/// Remove `session`'s session-scoped volumes that no unit holds any more
/// (another unit of the session still holding one keeps it: its removal
/// comes back here), as the docker backend does with the session's last
/// unit.
fn remove_session_volumes(store: &box_backend::volumes::VolumeStore, session: &SessionLabel) {
    for listed in store.of_session(BackendKind::Local, session) {
        if let Err(error) = box_backend::volumes::remove(&listed) {
            tracing::debug!(volume = listed.key, %error, "removing a session volume");
        }
    }
}

/// The longest stderr line logged whole; longer ones are cut.
const STDERR_LINE_MAX: usize = 4096;

/// Log the unit's stderr line by line, control characters escaped, until it
/// closes.
async fn log_stderr(stderr: tokio::net::unix::pipe::Receiver, session: String, unit: String) {
    use tokio::io::AsyncReadExt;
    let mut reader = tokio::io::BufReader::new(stderr);
    let mut line = Vec::new();
    loop {
        line.clear();
        let read = (&mut reader)
            .take(STDERR_LINE_MAX as u64)
            .read_until(b'\n', &mut line)
            .await;
        match read {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                let text = printable(&String::from_utf8_lossy(&line));
                box_backend::executor_log::emit(&unit, Some(&session), text.trim_end());
            }
        }
    }
}

/// `text` with control characters (terminal escapes included) escaped.
fn printable(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let keep = !c.is_control() || c == '\t' || c == '\n';
            let shown: Vec<char> = if keep {
                vec![c]
            } else {
                c.escape_default().collect()
            };
            shown
        })
        .collect()
}

/// Undoes a start that did not finish, whether it failed or its future was
/// dropped (a session hanging up mid-start): kills the helper's process group
/// and removes the unit's temp directory.
struct StartGuard {
    temp: PathBuf,
    run_dir: PathBuf,
    group: Option<i32>,
    finished: bool,
}

impl Drop for StartGuard {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        if let Some(group) = self.group {
            kill_group(group);
        }
        for dir in [&self.temp, &self.run_dir] {
            if let Err(error) = remove_dir(dir) {
                tracing::warn!(path = %dir.display(), %error, "removing a unit's directory");
            }
        }
    }
}

/// A walk for the host's root-only files, and when it was last found current.
type CheckedWalk = (std::time::Instant, Arc<private::Walk>);

/// How long a check of the last walk stands for the starts that follow (a
/// burst of sessions checks once, not once each).
const PRIVATE_FILES_CHECKED_FOR: Duration = Duration::from_secs(1);

/// The host's root-only entries (`private`): the last walk while every entry
/// it judged is unchanged (checked at most once a second), else the cache
/// another process stored, checked the same way, else a fresh walk. One at a
/// time: concurrent starts wait for one check or walk rather than each
/// making its own.
fn private_files(state: &Mutex<Option<CheckedWalk>>) -> Arc<private::Walk> {
    let mut last = state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((checked, walk)) = last.as_mut() {
        if checked.elapsed() < PRIVATE_FILES_CHECKED_FOR {
            return Arc::clone(walk);
        }
        if walk.is_current() {
            *checked = std::time::Instant::now();
            return Arc::clone(walk);
        }
    }
    let roots: Vec<PathBuf> = private::ROOTS.iter().map(PathBuf::from).collect();
    let walk = Arc::new(private::root_only_entries(
        &roots,
        private::cache_path().as_deref(),
    ));
    *last = Some((std::time::Instant::now(), Arc::clone(&walk)));
    walk
}

fn kill_group(group: i32) {
    if group > 1 {
        // A process group we created; ESRCH (gone) is fine.
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(group),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

fn remove_dir(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(path) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        result => result,
    }
}

/// The unit's private directories on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    /// The private temp directory, removed with the unit; also `TMPDIR`, so
    /// the executor's own confinement (writes beneath its root and `TMPDIR`)
    /// keeps `HOME` writable.
    pub temp: PathBuf,
    /// The executor's root when the unit has no workspace (empty).
    pub tmp: PathBuf,
    /// `HOME` inside it.
    pub home: PathBuf,
    /// The workspace, if the unit has one.
    pub workspace: Option<PathBuf>,
    /// Its volumes, made ready in box's volume store (by the start; none
    /// in a planned layout).
    pub volumes: Vec<LocalVolume>,
}

/// A volume of a local unit: the profile's, and its directory in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LocalVolume {
    /// The profile's volume.
    pub volume: box_policy::plan::Volume,
    /// Its directory and lock in the store.
    pub prepared: box_backend::volumes::PreparedVolume,
    /// The profile of the session it was made for.
    pub profile: String,
}

impl LocalVolume {
    /// Where the unit sees it: beneath the unit's home for `~/REL`.
    fn target(&self, home: &Path) -> PathBuf {
        match &self.volume.path {
            VolumePath::Home(relative) => home.join(relative),
            VolumePath::Absolute(path) => path.clone(),
        }
    }
}

impl Layout {
    /// The layout beneath `temp` for `source` (no I/O). Pure.
    pub(crate) fn plan(temp: PathBuf, source: &WorkspaceSource) -> Self {
        let workspace = match source {
            WorkspaceSource::Host(path) => Some(path.clone()),
            WorkspaceSource::Empty => Some(temp.join("workspace")),
            WorkspaceSource::None => None,
        };
        Self {
            tmp: temp.join("tmp"),
            home: temp.join("home"),
            temp,
            workspace,
            volumes: Vec::new(),
        }
    }

    /// Name the unit's directories (and resolve its host workspace); nothing
    /// is created yet.
    fn name(
        temp_root: &Path,
        session: &SessionLabel,
        spec: &UnitSpec,
    ) -> Result<Self, BackendError> {
        let failed = |doing: String, error: std::io::Error| BackendError::Other {
            unit: spec.name.clone(),
            doing,
            message: error.to_string(),
        };
        let tag: String = format!("{}-{}", session.session, spec.name)
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .take(48)
            .collect();
        let temp = temp_root.join(format!("box-local-{tag}-{:016x}", rand::random::<u64>()));
        let mut layout = Self::plan(temp, &spec.source);
        if let WorkspaceSource::Host(path) = &spec.source {
            let canonical = std::fs::canonicalize(path)
                .map_err(|error| failed(format!("opening workspace {}", path.display()), error))?;
            layout.workspace = Some(canonical);
        }
        Ok(layout)
    }

    /// Create the unit's directories (the caller removes them on failure).
    fn make(&self, spec: &UnitSpec) -> Result<(), BackendError> {
        let failed = |doing: String, error: std::io::Error| BackendError::Other {
            unit: spec.name.clone(),
            doing,
            message: error.to_string(),
        };
        let layout = self;
        use std::os::unix::fs::DirBuilderExt;
        let mut builder = std::fs::DirBuilder::new();
        builder.mode(0o700);
        builder
            .create(&layout.temp)
            .map_err(|error| failed(format!("creating {}", layout.temp.display()), error))?;
        let mut made = vec![layout.temp.clone(), layout.tmp.clone(), layout.home.clone()];
        if spec.source == WorkspaceSource::Empty
            && let Some(workspace) = &layout.workspace
        {
            made.push(workspace.clone());
        }
        for dir in &made[1..] {
            builder
                .create(dir)
                .map_err(|error| failed(format!("creating {}", dir.display()), error))?;
        }
        // A root host running the unit as another user hands it its own directories.
        if let Some(user) = spec.user
            && nix::unistd::geteuid().is_root()
            && user.uid != 0
        {
            for dir in &made {
                let owner = Some(nix::unistd::Uid::from_raw(user.uid));
                let group = Some(nix::unistd::Gid::from_raw(user.gid));
                nix::unistd::chown(dir, owner, group).map_err(|errno| {
                    failed(
                        format!("handing {} to the unit's user", dir.display()),
                        errno.into(),
                    )
                })?;
            }
        }
        Ok(())
    }
}

/// The unit's environment (`backend::environment`, as on every backend):
/// box's own `HOME` and `TMPDIR` are inside the unit's private temp (the
/// host's home is not readable there), its `PATH` the standard one.
/// Pure given `host_vars`.
pub(crate) fn unit_environment<I>(host_vars: I, spec: &UnitSpec, layout: &Layout) -> UnitEnvironment
where
    I: IntoIterator<Item = (OsString, OsString)>,
{
    let own = environment::Own {
        home: layout.home.display().to_string(),
        path: environment::STANDARD_PATH.to_owned(),
        tmpdir: layout.temp.display().to_string(),
    };
    environment::unit_environment(spec, host_vars, &own)
}

/// What the local backend cannot apply to `spec`, every one named: an
/// image (a unit runs on the host's own userland, which only the unit's
/// `local_userland = "host"` accepts in place of its image), an engine's
/// runtime, a privileged unit, a host namespace it does not know, an egress unit or
/// secrets with the host's network or mount namespace shared, capabilities
/// granted back, and landlock required where the kernel has none (judged
/// only when `landlock_abi` is given; the helper judges it again where it
/// confines). Pure; [`Backend::check`] and `sandbox_spec` both ask.
pub fn check_spec(spec: &UnitSpec, landlock_abi: Option<u32>) -> Result<(), Vec<Unenforceable>> {
    let mut refusals = Vec::new();
    let mut refuse = |control: String, why: &str| {
        refusals.push(Unenforceable {
            unit: spec.name.clone(),
            control,
            why: why.to_owned(),
        })
    };
    // Where the profile writes the unit's fields.
    let (field, table) = match spec.role {
        Role::Workspace => ("workspace".to_owned(), "[workspace]".to_owned()),
        Role::Server => (
            format!("server[{}]", spec.name),
            format!("its [[server]] table (name = {:?})", spec.name),
        ),
    };
    if spec.local_userland == LocalUserland::Refuse {
        refuse(
            format!("{field}.image {}", spec.image),
            &format!(
                "the local backend runs a unit on this host's own userland and cannot give it an image; use the docker backend (--backend docker), or, to run it on the host's userland instead, write local_userland = \"host\" under {table} in the profile"
            ),
        );
    }
    if let Some(runtime) = &spec.runtime {
        refuse(
            format!("{field}.runtime {runtime}"),
            "the local backend has no OCI runtime (a unit is a sandboxed process tree on this host's kernel); use the docker backend (--backend docker), or remove runtime from the profile",
        );
    }
    if spec.security.privileged {
        refuse(
            "privileged".to_owned(),
            "the local backend cannot run a privileged unit; use the docker backend",
        );
    }
    for namespace in &spec.security.host_namespaces {
        if !matches!(
            namespace.as_str(),
            "user" | "mount" | "ipc" | "pid" | "net" | "network" | "uts" | "cgroup"
        ) {
            refuse(
                format!("host namespace {namespace}"),
                "not one of user, mount, ipc, net, pid, uts, cgroup",
            );
        }
    }
    let shares = |name: &str| {
        spec.security
            .host_namespaces
            .iter()
            .any(|namespace| namespace == name)
    };
    if spec.network.mode == NetworkMode::Egress && (shares("net") || shares("network")) {
        refuse(
            "network egress allow list".to_owned(),
            "an egress unit's boundary is a network namespace of its own (only lo); it cannot share the host's",
        );
    }
    // Only a mount namespace of the unit's own can mount a volume away from
    // its home (beneath the home, a link stands in for the mount).
    if shares("mount") {
        for volume in &spec.volumes {
            if let VolumePath::Absolute(path) = &volume.path {
                refuse(
                    format!("volume {:?}", volume.name),
                    &format!(
                        "the unit shares the host's mount namespace, so nothing can be mounted at {}; give it a ~/ path, or do not share the mount namespace",
                        path.display()
                    ),
                );
            }
        }
    }
    if !spec.env_secrets.is_empty() && shares("mount") {
        refuse(
            format!("env.secrets {}", spec.env_secrets.join(", ")),
            "secrets are delivered on a tmpfs in the unit's own mount namespace; it cannot share the host's",
        );
    }
    if !spec.security.capabilities.is_empty() {
        refuse(
            format!("capabilities {}", spec.security.capabilities.join(", ")),
            "the local backend drops every capability and grants none back; use the docker backend",
        );
    }
    if spec.security.landlock == Requirement::Required && landlock_abi == Some(0) {
        refuse(
            "landlock".to_owned(),
            "the host kernel offers no landlock ABI",
        );
    }
    if refusals.is_empty() {
        Ok(())
    } else {
        Err(refusals)
    }
}

/// The helper's spec for a unit. Pure. Fails naming the first thing the
/// local backend cannot apply ([`check_spec`]).
pub(crate) fn sandbox_spec(
    spec: &UnitSpec,
    layout: &Layout,
    environment: &UnitEnvironment,
    options: &LocalOptions,
    wiring: &UnitWiring,
) -> Result<SandboxSpec, BackendError> {
    if let Err(refusals) = check_spec(spec, None)
        && let Some(first) = refusals.into_iter().next()
    {
        return Err(first.into());
    }
    // Host namespaces the operator allowed: the unit simply does not get its
    // own. The local backend never makes uts or cgroup namespaces.
    let mut share = Vec::new();
    for namespace in &spec.security.host_namespaces {
        match namespace.as_str() {
            "user" | "mount" | "ipc" | "pid" => share.push(namespace.clone()),
            "net" | "network" => share.push("net".to_owned()),
            _ => {}
        }
    }
    let network = match spec.network.mode {
        NetworkMode::None if share.iter().any(|name| name == "net") => SpecNetwork::Host,
        // Egress is network none plus the proxy's socket (a shared network
        // namespace was refused above).
        NetworkMode::None | NetworkMode::Egress => SpecNetwork::None,
        NetworkMode::Bridge => SpecNetwork::Host,
    };
    let mut write = Vec::new();
    let mut read = vec![options.box_exe.clone()];
    if let Some(workspace) = &layout.workspace {
        match spec.mode {
            MountMode::ReadWrite => write.push(workspace.clone()),
            MountMode::ReadOnly => read.push(workspace.clone()),
        }
    }
    write.push(layout.temp.clone());
    // Host devices the operator allowed, beside the minimal set.
    write.extend(spec.security.devices.iter().cloned());
    // A volume elsewhere than beneath the home (which is writable already).
    let volumes: Vec<SpecVolume> = layout
        .volumes
        .iter()
        .map(|local| SpecVolume {
            name: local.volume.name.clone(),
            scope: local.volume.scope.as_str().to_owned(),
            shared_with: (local.volume.scope == VolumeScope::Profile)
                .then(|| local.profile.clone()),
            data: local.prepared.data.clone(),
            lock: local.prepared.lock.clone(),
            target: local.target(&layout.home),
        })
        .collect();
    write.extend(
        volumes
            .iter()
            .filter(|volume| !volume.target.starts_with(&layout.home))
            .map(|volume| volume.target.clone()),
    );
    // A worktree fork's borrowed objects: readable, never writable (the
    // helper binds them back read-only too).
    let objects = wiring.objects.as_ref().map(|objects| objects.host.clone());
    read.extend(objects.iter().cloned());
    Ok(SandboxSpec {
        unit: spec.name.clone(),
        write,
        read,
        cwd: layout
            .workspace
            .clone()
            .unwrap_or_else(|| layout.tmp.clone()),
        network,
        user: spec.user.map(|user| SpecUser {
            uid: user.uid,
            gid: user.gid,
        }),
        rlimits: Rlimits::from_limits(&spec.limits),
        landlock: spec.security.landlock.into(),
        landlock_min_abi: options.landlock_min_abi,
        namespaces: options.namespaces.into(),
        env: environment.vars.clone(),
        seccomp: SpecRequirement::BestEffort,
        conceal: Vec::new(),
        share,
        egress: wiring
            .egress
            .as_ref()
            .filter(|_| spec.network.mode == NetworkMode::Egress)
            .map(|wiring| SpecEgress {
                socket_dir: wiring.socket_dir.clone(),
                port: EgressWiring::BRIDGE_PORT,
            }),
        secrets_dir: (!environment.secrets.is_empty()).then(|| PathBuf::from(SECRETS_DIR)),
        secret_values: SecretValues(
            environment
                .secrets
                .iter()
                .map(|(name, value)| (format!("{SECRET_VALUE_PREFIX}{name}"), value.clone()))
                .collect(),
        ),
        // Set by the start, which listens for the helper.
        init: None,
        objects,
        tmp: Some(SpecTmp {
            bytes: spec.limits.tmp_bytes,
            exec: spec.security.tmp == TmpMode::Exec,
        }),
        // What a new user's home holds on the host whose userland the unit
        // runs on; never the caller's own home.
        home: Some(SpecHome {
            path: layout.home.clone(),
            bytes: spec.limits.home_bytes,
            skel: Some(PathBuf::from(SKEL)),
        }),
        volumes,
    })
}

/// The executor's command line for a unit. Pure. Without a workspace the
/// executor's root is an empty directory in the unit's private temp, so its
/// file tools reach nothing of the host. The executor confines itself too (a
/// second landlock layer, writes only beneath its root and TMPDIR).
pub(crate) fn executor_command(
    box_exe: &Path,
    spec: &UnitSpec,
    layout: &Layout,
    wiring: &UnitWiring,
) -> Vec<OsString> {
    let executor = executor_spec(spec, layout, wiring);
    std::iter::once(box_exe.into())
        .chain(executor.to_args().into_iter().map(OsString::from))
        .collect()
}

/// The executor's flags for a unit ([`executor_command`]'s, and a pooled
/// unit's bind line's). Pure.
pub(crate) fn executor_spec(
    spec: &UnitSpec,
    layout: &Layout,
    wiring: &UnitWiring,
) -> box_policy::executor::ExecutorSpec {
    let root = layout.workspace.as_ref().unwrap_or(&layout.tmp);
    let mut executor = spec.executor_spec(root, PlaceKind::Local);
    // The socket's directory, and a worktree fork's borrowed objects, are
    // seen inside the unit at their host paths.
    executor.egress_socket = wiring
        .egress
        .as_ref()
        .map(|egress| egress.socket_dir.join(EgressWiring::SOCKET));
    executor.read = wiring
        .objects
        .iter()
        .map(|objects| objects.host.clone())
        .collect();
    // The unit's home and its own /tmp (where TMPDIR points when the helper
    // could mount one; without it the helper's landlock layer keeps the
    // host's /tmp unwritable whatever this layer allows).
    executor.write = vec![layout.home.clone(), PathBuf::from("/tmp")];
    // Volumes: where the unit sees one outside its home, and its directory
    // on the host, which a unit without a mount namespace reaches through a
    // link (elsewhere that path is hidden, and a rule for a missing path is
    // skipped; the helper's layer grants it only to a link).
    for local in &layout.volumes {
        let target = local.target(&layout.home);
        if !target.starts_with(&layout.home) {
            executor.write.push(target);
        }
        executor.write.push(local.prepared.data.clone());
    }
    executor
}

/// The envelope: what the helper reported it applied. Pure.
pub(crate) fn envelope(
    spec: &UnitSpec,
    sandbox_spec: &SandboxSpec,
    applied: &Applied,
    environment: &UnitEnvironment,
    id: &str,
    layout: &Layout,
) -> Envelope {
    let names = (environment.passed(), environment.scrubbed.clone());
    envelope_from_parts(spec, sandbox_spec, applied, names, id, layout)
}

/// [`envelope`] from the environment's names (passed, scrubbed), as a run
/// directory's record and the persisted state keep them. Pure.
pub(crate) fn envelope_from_parts(
    spec: &UnitSpec,
    sandbox_spec: &SandboxSpec,
    applied: &Applied,
    (env_passed, env_scrubbed): (Vec<String>, Vec<String>),
    id: &str,
    layout: &Layout,
) -> Envelope {
    let has = |name: &str| applied.namespaces.iter().any(|entered| entered == name);
    // The helper refuses an egress unit it cannot give a network namespace.
    let egress = sandbox_spec.egress.is_some() && has("net");
    let network = match sandbox_spec.network {
        SpecNetwork::None => AppliedNetwork {
            mode: if egress { "egress" } else { "none" }.to_owned(),
            allow: if egress {
                spec.network.allow.clone()
            } else {
                Vec::new()
            },
            proxy: egress.then(|| EgressWiring::PROXY_URL.to_owned()),
            egress_limits: egress.then_some(EgressLimits {
                max_connections: spec.network.max_connections,
                bytes_per_second: spec.network.bytes_per_second,
            }),
            session_network: None,
            local_none: Some(LocalNone {
                namespace: has("net"),
                loopback_up: applied.loopback_up,
                landlock_tcp_denied: applied.landlock_tcp_denied,
                ip_sockets_denied: applied.ip_sockets_denied,
                landlock_tcp_ports: applied.landlock_tcp_ports.clone(),
            }),
        },
        SpecNetwork::Host => AppliedNetwork {
            mode: "host".to_owned(),
            allow: Vec::new(),
            proxy: None,
            egress_limits: None,
            session_network: None,
            local_none: None,
        },
    };
    let nproc_binds = applied.host_uid != 0;
    let mut not_applied = vec![
        "cpus: the local backend has no cgroup".to_owned(),
        "memory: per process (RLIMIT_DATA, RLIMIT_AS), not for the unit as a whole".to_owned(),
    ];
    let home_bytes = applied.home.as_ref().and_then(|home| home.bytes);
    if home_bytes.is_none() {
        not_applied.push(
            "home: no mount namespace of its own, so HOME is a private directory on the host's disk, bounded per file (RLIMIT_FSIZE), not a quota"
                .to_owned(),
        );
    }
    if applied.tmp.is_none() {
        not_applied.push(
            "tmp: the unit got no /tmp of its own (without a mount namespace of its own, or with the host's /tmp inside its workspace); TMPDIR is a private directory on the host's disk, bounded per file (RLIMIT_FSIZE), not a quota"
                .to_owned(),
        );
    }
    for made in applied.volumes.iter().filter(|made| made.linked) {
        if let Some(volume) = sandbox_spec.volumes.iter().find(|v| v.name == made.name) {
            not_applied.push(format!(
                "volume {}: no mount namespace of its own, so {} is a link to its directory on the host ({})",
                volume.name,
                volume.target.display(),
                volume.data.display()
            ));
        }
    }
    for directory in &applied.unhidden {
        not_applied.push(format!(
            "host directory not hidden ({directory}): Unix sockets beneath it stay reachable where file permissions allow"
        ));
    }
    if !has("mount") {
        not_applied.push(
            "host directories: no mount namespace, so Unix sockets outside the unit (Docker, SSH agent) stay reachable where file permissions allow"
                .to_owned(),
        );
    }
    if applied.host_uid == 0 && applied.concealed == 0 && !sandbox_spec.conceal.is_empty() {
        not_applied.push(
            "root-only host files: the unit is the host's uid 0 and no mount namespace hides /etc/shadow and the like"
                .to_owned(),
        );
    }
    if !nproc_binds {
        not_applied.push("pids: RLIMIT_NPROC does not bind the host's uid 0".to_owned());
    }
    let limits = AppliedLimits::Process(ProcessLimits {
        memory_bytes: applied.rlimits.data_bytes,
        address_space_bytes: applied.rlimits.address_space_bytes,
        pids: applied.rlimits.nproc,
        nofile: applied.rlimits.nofile,
        file_size_bytes: applied.rlimits.fsize_bytes,
        core_bytes: applied.rlimits.core_bytes,
        tmp_bytes: applied.tmp.map(|tmp| tmp.bytes),
        home_bytes,
        not_applied,
        start_timeout_ms: None,
    });
    Envelope {
        name: spec.name.clone(),
        role: spec.role,
        backend: BackendKind::Local,
        id: id.to_owned(),
        image: String::new(),
        image_id: String::new(),
        image_digest: None,
        runtime: None,
        // The local backend starts only units that may run here (check_spec).
        userland: Some("host".to_owned()),
        root: layout
            .workspace
            .as_ref()
            .map(|path| path.display().to_string())
            .unwrap_or_default(),
        user: format!("{}:{}", applied.uid, applied.gid),
        network,
        limits,
        hardening: Hardening {
            capabilities: box_confine::capability_names(applied.capabilities.effective),
            no_new_privileges: applied.no_new_privs,
            // Landlock grants writes only to the workspace and the unit's temp.
            read_only_root: applied.landlock.enforced,
            seccomp: if applied.seccomp { "box" } else { "none" }.to_owned(),
            landlock_abi: applied.landlock.abi,
            landlock_enforced: applied.landlock.enforced,
            namespaces: applied.namespaces.clone(),
            user_namespace: has("user"),
            tmp: applied.tmp.map(|tmp| {
                if tmp.exec {
                    TmpMode::Exec
                } else {
                    TmpMode::NoExec
                }
            }),
        },
        env_passed,
        env_scrubbed,
        git_neutralised: spec.security.neutralise_git
            && !box_scrub::git_neutralisation().is_empty(),
        secrets: Vec::new(),
        persisted_credentials: Vec::new(),
        parent: None,
        lifecycle: applied
            .lease_ms
            .map(|lease_ms| box_backend::AppliedLifecycle { lease_ms }),
        state: UnitState::Running,
        volumes: applied_volumes(sandbox_spec, applied),
        home: applied
            .home
            .as_ref()
            .map(|home| box_policy::envelope::AppliedHome {
                path: layout.home.display().to_string(),
                seeded_from: home
                    .seeded_from
                    .as_ref()
                    .map(|skel| skel.display().to_string()),
            }),
        // The unit's user namespace maps its ids to themselves: uid 0 in it
        // is the host's root.
        root_user: (applied.host_uid == 0).then(box_policy::envelope::RootUser::new),
        warm: None,
    }
}

/// The envelope's volumes: each one the helper reported it made.
fn applied_volumes(
    sandbox_spec: &SandboxSpec,
    applied: &Applied,
) -> Vec<box_policy::envelope::AppliedVolume> {
    sandbox_spec
        .volumes
        .iter()
        .filter(|volume| applied.volumes.iter().any(|made| made.name == volume.name))
        .map(|volume| box_policy::envelope::AppliedVolume {
            name: volume.name.clone(),
            path: volume.target.display().to_string(),
            scope: volume.scope.clone(),
            shared_with: volume.shared_with.clone(),
            id: volume.data.display().to_string(),
        })
        .collect()
}

/// The envelope's `secrets`: each one the executor was told to write.
fn delivered_secrets(spec: &UnitSpec) -> Vec<DeliveredSecret> {
    spec.env_secrets
        .iter()
        .map(|name| DeliveredSecret {
            name: name.clone(),
            path: format!("{SECRETS_DIR}/{name}"),
            as_env: spec.env_secrets_as_env.contains(name),
        })
        .collect()
}

/// How a unit ended, from its channel: the helper's report (box-init's
/// `EndReport`) when it sent one, else the helper's wait status (a unit this
/// host started) or its end seen through `exited`.
fn unit_ended(
    channel: box_init::host::Ended,
    mut exited: watch::Receiver<Option<Option<ExitStatus>>>,
    removed: Arc<std::sync::atomic::AtomicBool>,
    lease_ms: Option<u64>,
) -> BoxFuture<'static, UnitEnd> {
    use box_init::protocol::EndReason;
    async move {
        let end = channel.wait().await;
        let removed_now = || removed.load(std::sync::atomic::Ordering::SeqCst);
        match end {
            box_init::host::UnitEnd::Reported(report) => {
                let status = report.executor.map(|exit| match exit {
                    box_init::protocol::ExitReport::Signal(signal) => ExitStatus::from_raw(signal),
                    // The unit's init ends with 128 + the signal that killed CMD.
                    box_init::protocol::ExitReport::Code(code) if code > 128 && code < 128 + 65 => {
                        ExitStatus::from_raw(code - 128)
                    }
                    box_init::protocol::ExitReport::Code(code) => {
                        ExitStatus::from_raw((code & 0xff) << 8)
                    }
                });
                let lapsed =
                    (report.reason == EndReason::LeaseLapsed).then(|| lease_ms.unwrap_or_default());
                let removed = removed_now() || report.reason == EndReason::Terminated;
                unit_end(status, removed, lapsed)
            }
            box_init::host::UnitEnd::Released => UnitEnd {
                exit_code: None,
                oom_killed: Some(false),
                reason: "the unit was released to another host".to_owned(),
            },
            box_init::host::UnitEnd::Disconnected => {
                // The helper died without a report (killed): its status, when
                // it comes.
                let status = tokio::time::timeout(REAP_TIMEOUT, exited.wait_for(Option::is_some))
                    .await
                    .ok()
                    .and_then(|status| status.ok().and_then(|status| status.flatten()));
                unit_end(status, removed_now(), None)
            }
        }
    }
    .boxed()
}

/// How a unit ended, from the helper's wait status (the helper ends the way
/// the executor did: same exit code, or killed by the same signal).
/// `lapsed`: the helper said it ended the unit because its lease (of that
/// many milliseconds) lapsed.
///
/// A local unit has no memory cgroup of its own (its memory is bounded per
/// process by rlimits, which fail an allocation rather than kill): its
/// processes are in the host's cgroup, whose OOM kills box cannot tell from
/// the host's own or another process's. So a SIGKILL nobody here sent is
/// "cannot tell" (`oom_killed: None`); any other end rules the OOM killer
/// out (it kills with SIGKILL only).
fn unit_end(status: Option<ExitStatus>, removed: bool, lapsed: Option<u64>) -> UnitEnd {
    let (code, signal) = match status {
        Some(status) => (status.code(), status.signal()),
        None => (None, None),
    };
    let sigkill = signal == Some(nix::sys::signal::Signal::SIGKILL as i32);
    let cause = match (code, signal) {
        (_, Some(signal)) if sigkill && !removed && lapsed.is_none() => format!(
            "the executor was killed by {}: from outside or by the kernel's OOM killer, which box cannot tell for a local unit (it has no memory cgroup of its own)",
            signal_name(signal)
        ),
        (_, Some(signal)) => format!("the executor was killed by {}", signal_name(signal)),
        (Some(code), None) => format!("the executor exited with code {code}"),
        (None, None) => "the executor ended for an unknown reason".to_owned(),
    };
    let told = removed || lapsed.is_some() || (status.is_some() && !sigkill);
    UnitEnd {
        exit_code: match (code, signal) {
            (_, Some(_)) => Some(-1),
            (code, None) => code.map(i64::from),
        },
        oom_killed: told.then_some(false),
        reason: if let Some(lease_ms) = lapsed {
            format!(
                "the unit ended because its lease lapsed: its host did not renew it within {} (the host was stopped, hung or too busy)",
                humantime::format_duration(Duration::from_millis(lease_ms))
            )
        } else if removed {
            format!("the unit was removed ({cause})")
        } else {
            cause
        },
    }
}

fn signal_name(signal: i32) -> String {
    match nix::sys::signal::Signal::try_from(signal) {
        Ok(named) => format!("{} ({signal})", named.as_str()),
        Err(_) => format!("signal {signal}"),
    }
}

#[cfg(test)]
mod tests;
