//! The local backend: a unit is a child process of the host, confined by the
//! sandbox helper (`box sandbox`, hidden; see `helper`) that then `execve`s
//! `box execute`. Used where no Docker engine answers.
//!
//! What it owns: building the helper's spec from a unit spec (pure), the
//! unit's private temp directory (created per unit, removed with it), the
//! helper process and its report pipe, and the envelope, which is built from
//! what the helper *reports it applied*, never from what was asked.
//!
//! Process tree of one unit:
//!
//! ```text
//! host ── box sandbox (own process group; dies with the host: PR_SET_PDEATHSIG)
//!           └─ init, pid 1 of the unit's pid namespace (reaps; its exit ends the namespace)
//!                └─ box execute (confined: rlimits, no_new_privs, landlock, no capabilities)
//! ```
//!
//! Without a pid namespace the helper `execve`s the executor itself.
//!
//! `list` reads an in-memory registry: local units are children of this host
//! and die with it (parent-death signal on the helper, namespace teardown), so
//! there is nothing of another instance's to find and nothing to sweep after
//! a crash. Removal kills the unit's process group with SIGKILL; with a pid
//! namespace that ends every process of the unit, without one, a process the
//! executor moved to another process group survives (document, not hidden:
//! the envelope lists the namespaces entered).
//!
//! A workspace source `None` starts the executor with `--no-fs` (and its root
//! at the unit's private temp directory): the executor then serves no file
//! tools. `Empty` is a fresh directory inside the unit's temp directory.
//! The workspace appears at its host path (the local backend has no bind
//! mounts); the envelope's `root` says which.

mod helper;

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::io::AsyncBufReadExt;
use tokio::sync::watch;

pub use helper::{
    Applied, REFUSED_EXIT, Report, SandboxArgs, SandboxSpec, SpecNetwork, SpecRequirement, SpecUser,
};

use super::sandbox::Rlimits;
use super::{
    Backend, BackendError, Envelope, ExecutorIo, Hardening, SessionLabel, StartedUnit, UnitEnd,
    UnitInfo,
};
use crate::plan::{MountMode, NetworkMode, Requirement, UnitSpec, WorkspaceSource};

/// Run the hidden `box sandbox` subcommand (the helper, in the unit's process).
pub fn sandbox(args: SandboxArgs) -> anyhow::Result<std::process::ExitCode> {
    helper::run(args)
}

/// How long a unit may take to confine itself and report.
const CONFINE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long removal waits for a killed unit to be reaped.
const REAP_TIMEOUT: Duration = Duration::from_secs(10);

/// The fds the helper finds its spec and report pipe on.
const SPEC_FD: i32 = 3;
const REPORT_FD: i32 = 4;

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
}

/// The local sandboxed-process backend.
pub struct LocalBackend {
    options: LocalOptions,
    units: Mutex<HashMap<String, LocalUnit>>,
}

/// A started unit, as the registry keeps it.
struct LocalUnit {
    info: UnitInfo,
    /// The helper's pid, which is also its process group.
    group: i32,
    temp: PathBuf,
    exited: watch::Receiver<Option<ExitStatus>>,
    removed: Arc<std::sync::atomic::AtomicBool>,
}

impl LocalBackend {
    /// A backend running `box_exe` as helper and executor, with default options.
    pub fn new(box_exe: PathBuf) -> Self {
        Self::with_options(LocalOptions {
            box_exe,
            namespaces: Requirement::BestEffort,
            landlock_min_abi: 1,
        })
    }

    /// A backend with explicit options.
    pub fn with_options(options: LocalOptions) -> Self {
        Self {
            options,
            units: Mutex::new(HashMap::new()),
        }
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
        let layout = Layout::create(session, spec)?;
        let command = if command.is_empty() {
            executor_command(&self.options.box_exe, spec, &layout)
        } else {
            command
        };
        match self.launch(session, spec, &layout, command).await {
            Ok(started) => Ok(started),
            Err(error) => {
                layout.remove();
                Err(error)
            }
        }
    }

    async fn launch(
        &self,
        session: &SessionLabel,
        spec: &UnitSpec,
        layout: &Layout,
        command: Vec<OsString>,
    ) -> Result<StartedUnit, BackendError> {
        let unit = spec.name.clone();
        let other = |doing: &str, message: String| BackendError::Other {
            unit: unit.clone(),
            doing: doing.to_owned(),
            message,
        };
        let environment = unit_environment(std::env::vars_os(), spec, layout);
        let sandbox_spec = sandbox_spec(spec, layout, &environment, &self.options)?;
        let spec_json = serde_json::to_vec(&sandbox_spec)
            .map_err(|error| other("encoding the sandbox spec", error.to_string()))?;
        let pipe = || nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC);
        let (spec_read, spec_write) =
            pipe().map_err(|errno| other("making the spec pipe", errno.to_string()))?;
        let (report_read, report_write) =
            pipe().map_err(|errno| other("making the report pipe", errno.to_string()))?;

        let mut helper = std::process::Command::new(&self.options.box_exe);
        helper
            .arg("sandbox")
            .arg("--spec-fd")
            .arg(SPEC_FD.to_string())
            .arg("--report-fd")
            .arg(REPORT_FD.to_string())
            .arg("--")
            .args(&command)
            .env_clear()
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .process_group(0);
        let spec_fd = spec_read.as_raw_fd();
        let report_fd = report_write.as_raw_fd();
        // SAFETY: only async-signal-safe calls (dup2, fcntl, prctl) on fds that
        // stay open in the parent until after spawn.
        unsafe {
            helper.pre_exec(move || {
                move_fd(spec_fd, SPEC_FD)?;
                move_fd(report_fd, REPORT_FD)?;
                // The unit dies with the host. The parent "thread" is the
                // spawning thread below, which lives until the unit has ended.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let (spawned_tx, spawned_rx) = tokio::sync::oneshot::channel();
        let (exited_tx, exited_rx) = watch::channel(None);
        let thread_name = format!("box-local-{unit}");
        std::thread::Builder::new()
            .name(thread_name)
            .spawn(move || {
                let spawned = helper.spawn();
                drop(spec_read);
                drop(report_write);
                let mut child = match spawned {
                    Ok(child) => child,
                    Err(error) => {
                        let _ = spawned_tx.send(Err(error));
                        return;
                    }
                };
                let io = (child.stdin.take(), child.stdout.take(), child.id());
                let _ = spawned_tx.send(Ok(io));
                // The helper reads the spec to its end; a failed write shows
                // up as its report.
                let mut spec_file = std::fs::File::from(spec_write);
                let _ = std::io::Write::write_all(&mut spec_file, &spec_json);
                drop(spec_file);
                let status = loop {
                    match child.wait() {
                        Ok(status) => break status,
                        Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(_) => break ExitStatus::from_raw(0),
                    }
                };
                let _ = exited_tx.send(Some(status));
            })
            .map_err(|error| other("starting the unit's thread", error.to_string()))?;
        let (stdin, stdout, pid) = spawned_rx
            .await
            .map_err(|_| other("spawning the sandbox helper", "thread ended".to_owned()))?
            .map_err(|error| {
                other(
                    "spawning the sandbox helper",
                    format!("{}: {error}", self.options.box_exe.display()),
                )
            })?;
        let group = i32::try_from(pid).unwrap_or(i32::MAX);
        let kill = || kill_group(group);
        let (Some(stdin), Some(stdout)) = (stdin, stdout) else {
            kill();
            return Err(other("spawning the sandbox helper", "no stdio".to_owned()));
        };
        let io_error =
            |error: std::io::Error| other("attaching the executor's stdio", error.to_string());
        let attached = (|| {
            Ok::<_, BackendError>((
                tokio::net::unix::pipe::Sender::from_owned_fd(OwnedFd::from(stdin))
                    .map_err(io_error)?,
                tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(stdout))
                    .map_err(io_error)?,
                tokio::net::unix::pipe::Receiver::from_owned_fd(report_read).map_err(io_error)?,
            ))
        })();
        let (stdin, stdout, report) = match attached {
            Ok(attached) => attached,
            Err(error) => {
                kill();
                return Err(error);
            }
        };
        let mut reports = tokio::io::BufReader::new(report).lines();
        let first = tokio::time::timeout(CONFINE_TIMEOUT, reports.next_line()).await;
        let applied = match first {
            Ok(Ok(Some(line))) => match serde_json::from_str::<Report>(&line) {
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
                Ok(Report::Ended { .. }) => Err(other(
                    "confining the unit",
                    "the helper reported an end before confinement".to_owned(),
                )),
                Err(error) => Err(other(
                    "reading the helper's report",
                    format!("{error}: {line}"),
                )),
            },
            Ok(Ok(None)) => Err(other(
                "confining the unit",
                "the helper exited without reporting (see the host's stderr)".to_owned(),
            )),
            Ok(Err(error)) => Err(other("reading the helper's report", error.to_string())),
            Err(_) => Err(other(
                "confining the unit",
                format!("no report within {}s", CONFINE_TIMEOUT.as_secs()),
            )),
        };
        let applied = match applied {
            Ok(applied) => applied,
            Err(error) => {
                kill();
                let mut exited = exited_rx.clone();
                let _ = tokio::time::timeout(REAP_TIMEOUT, exited.wait_for(Option::is_some)).await;
                return Err(error);
            }
        };
        // The rest of the report pipe: at most the init's `ended` line.
        let last_report = tokio::spawn(async move {
            let mut ended = None;
            while let Ok(Some(line)) = reports.next_line().await {
                if let Ok(Report::Ended { code, signal }) = serde_json::from_str(&line) {
                    ended = Some((code, signal));
                }
            }
            ended
        });
        let removed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ended = {
            let mut exited = exited_rx.clone();
            let removed = Arc::clone(&removed);
            async move {
                let reported = last_report.await.ok().flatten();
                let status = match exited.wait_for(Option::is_some).await {
                    Ok(status) => *status,
                    Err(_) => None,
                };
                unit_end(
                    reported,
                    status,
                    removed.load(std::sync::atomic::Ordering::SeqCst),
                )
            }
            .boxed()
        };
        let id = pid.to_string();
        let envelope = envelope(spec, &sandbox_spec, &applied, &environment, &id, layout);
        let info = UnitInfo {
            id: id.clone(),
            instance: session.instance.clone(),
            session: session.session.clone(),
            unit: unit.clone(),
            profile: session.profile.clone(),
            created: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
            state: "running".to_owned(),
        };
        let record = LocalUnit {
            info,
            group,
            temp: layout.temp.clone(),
            exited: exited_rx,
            removed,
        };
        self.registry().insert(id, record);
        Ok(StartedUnit {
            envelope,
            io: ExecutorIo {
                stdin: Box::pin(stdin),
                stdout: Box::pin(stdout),
            },
            ended,
        })
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, HashMap<String, LocalUnit>> {
        // A panic while holding the lock cannot leave the map half-updated
        // (single inserts and removes), so a poisoned lock is still usable.
        self.units
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn remove_unit(&self, id: &str) -> Result<(), BackendError> {
        let Some(record) = self.registry().remove(id) else {
            return Ok(());
        };
        record
            .removed
            .store(true, std::sync::atomic::Ordering::SeqCst);
        kill_group(record.group);
        let mut exited = record.exited.clone();
        let reaped = tokio::time::timeout(REAP_TIMEOUT, exited.wait_for(Option::is_some))
            .await
            .is_ok();
        let removed = remove_dir(&record.temp);
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
}

impl Backend for LocalBackend {
    fn kind(&self) -> &'static str {
        "local"
    }

    fn start<'a>(
        &'a self,
        session: &'a SessionLabel,
        spec: &'a UnitSpec,
    ) -> BoxFuture<'a, Result<StartedUnit, BackendError>> {
        self.start_command(session, spec, Vec::new()).boxed()
    }

    fn remove<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), BackendError>> {
        self.remove_unit(id).boxed()
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<UnitInfo>, BackendError>> {
        let units = self
            .registry()
            .values()
            .map(|record| {
                let mut info = record.info.clone();
                if record.exited.borrow().is_some() {
                    "ended".clone_into(&mut info.state);
                }
                info
            })
            .collect();
        futures::future::ready(Ok(units)).boxed()
    }
}

/// `dup2` that also works when the fd is already in place (clears close-on-exec).
fn move_fd(from: i32, to: i32) -> std::io::Result<()> {
    // SAFETY: dup2 and fcntl on fds owned by this (pre-exec) process.
    let result = unsafe {
        if from == to {
            libc::fcntl(to, libc::F_SETFD, 0)
        } else {
            libc::dup2(from, to)
        }
    };
    if result < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn kill_group(group: i32) {
    if group > 1 {
        // SAFETY: signalling a process group we created; ESRCH (gone) is fine.
        unsafe { libc::kill(-group, libc::SIGKILL) };
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
pub struct Layout {
    /// The private temp directory, removed with the unit.
    pub temp: PathBuf,
    /// `TMPDIR` inside it.
    pub tmp: PathBuf,
    /// `HOME` inside it.
    pub home: PathBuf,
    /// The workspace, if the unit has one.
    pub workspace: Option<PathBuf>,
}

impl Layout {
    /// The layout beneath `temp` for `source` (no I/O). Pure.
    pub fn plan(temp: PathBuf, source: &WorkspaceSource) -> Self {
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
        }
    }

    fn create(session: &SessionLabel, spec: &UnitSpec) -> Result<Self, BackendError> {
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
        let temp =
            std::env::temp_dir().join(format!("box-local-{tag}-{:016x}", rand::random::<u64>()));
        let mut layout = Self::plan(temp, &spec.source);
        if let WorkspaceSource::Host(path) = &spec.source {
            let canonical = std::fs::canonicalize(path)
                .map_err(|error| failed(format!("opening workspace {}", path.display()), error))?;
            layout.workspace = Some(canonical);
        }
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
            if let Err(error) = builder.create(dir) {
                layout.remove();
                return Err(failed(format!("creating {}", dir.display()), error));
            }
        }
        // A root host running the unit as another user hands it its own directories.
        if let Some(user) = spec.user
            && nix::unistd::geteuid().is_root()
            && user.uid != 0
        {
            for dir in &made {
                let owner = Some(nix::unistd::Uid::from_raw(user.uid));
                let group = Some(nix::unistd::Gid::from_raw(user.gid));
                if let Err(errno) = nix::unistd::chown(dir, owner, group) {
                    layout.remove();
                    return Err(failed(
                        format!("handing {} to the unit's user", dir.display()),
                        errno.into(),
                    ));
                }
            }
        }
        Ok(layout)
    }

    fn remove(&self) {
        if let Err(error) = remove_dir(&self.temp) {
            tracing::warn!(path = %self.temp.display(), %error, "removing a unit's temp directory");
        }
    }
}

/// The unit's environment, and the names passed and scrubbed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UnitEnvironment {
    /// Every variable the unit gets.
    pub vars: Vec<(String, String)>,
    /// Scrubbed names (including variables that are not UTF-8).
    pub scrubbed: Vec<String>,
}

/// The unit's environment: the host's, scrubbed (with `env_pass` kept), then
/// the profile's `env_set`, git neutralisation, and the unit's own `TMPDIR`
/// and `HOME` (inside its private temp, since the host's home is not
/// readable there). Pure given `host_vars`.
pub fn unit_environment<I>(host_vars: I, spec: &UnitSpec, layout: &Layout) -> UnitEnvironment
where
    I: IntoIterator<Item = (OsString, OsString)>,
{
    let scrubbed = crate::scrub::scrub_environment(host_vars, &spec.env_pass);
    let mut removed = scrubbed.removed;
    let mut vars: Vec<(String, String)> = Vec::new();
    let set = |vars: &mut Vec<(String, String)>, name: String, value: String| {
        vars.retain(|(existing, _)| *existing != name);
        vars.push((name, value));
    };
    for (name, value) in scrubbed.kept {
        match (name.into_string(), value.into_string()) {
            (Ok(name), Ok(value)) => set(&mut vars, name, value),
            (Ok(name), Err(_)) => removed.push(name),
            (Err(name), _) => removed.push(name.to_string_lossy().into_owned()),
        }
    }
    set(
        &mut vars,
        "TMPDIR".to_owned(),
        layout.tmp.display().to_string(),
    );
    set(
        &mut vars,
        "HOME".to_owned(),
        layout.home.display().to_string(),
    );
    if spec.security.neutralise_git {
        for (name, value) in crate::scrub::git_neutralisation() {
            set(&mut vars, name, value);
        }
    }
    for (name, value) in &spec.env_set {
        set(&mut vars, name.clone(), value.clone());
    }
    UnitEnvironment {
        vars,
        scrubbed: removed,
    }
}

/// The helper's spec for a unit. Pure. Fails naming the control the local
/// backend cannot apply (an egress allow list).
pub fn sandbox_spec(
    spec: &UnitSpec,
    layout: &Layout,
    environment: &UnitEnvironment,
    options: &LocalOptions,
) -> Result<SandboxSpec, BackendError> {
    let network = match spec.network.mode {
        NetworkMode::None => SpecNetwork::None,
        NetworkMode::Egress => {
            return Err(BackendError::Unenforceable {
                unit: spec.name.clone(),
                control: "network egress allow list".to_owned(),
                why: "the local backend cannot filter egress; use the docker backend, or network none"
                    .to_owned(),
            });
        }
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
    })
}

/// The executor's command line for a unit. Pure.
pub fn executor_command(box_exe: &Path, spec: &UnitSpec, layout: &Layout) -> Vec<OsString> {
    let mut command: Vec<OsString> = vec![box_exe.into(), "execute".into()];
    match &layout.workspace {
        Some(workspace) => {
            command.push("--root".into());
            command.push(workspace.into());
        }
        None => {
            // No workspace: the executor serves no file tools (`--no-fs`); its
            // root is the unit's private temp so nothing else is reachable.
            command.push("--root".into());
            command.push(layout.tmp.clone().into());
            command.push("--no-fs".into());
        }
    }
    command.push("--kind".into());
    command.push("local".into());
    if !spec.env_pass.is_empty() {
        command.push("--pass-env".into());
        command.push(spec.env_pass.join(",").into());
    }
    if !spec.security.write_guard {
        command.push("--write-guard".into());
        command.push("off".into());
    }
    command
}

/// The envelope: what the helper reported it applied. Pure.
pub fn envelope(
    spec: &UnitSpec,
    sandbox_spec: &SandboxSpec,
    applied: &Applied,
    environment: &UnitEnvironment,
    id: &str,
    layout: &Layout,
) -> Envelope {
    let has = |name: &str| applied.namespaces.iter().any(|entered| entered == name);
    let network = match sandbox_spec.network {
        SpecNetwork::None => serde_json::json!({
            "mode": "none",
            "allow": [],
            "namespace": has("net"),
            "loopbackUp": applied.loopback_up,
            "landlockTcpDenied": applied.landlock_tcp_denied,
        }),
        SpecNetwork::Host => serde_json::json!({"mode": "host", "allow": []}),
    };
    let nproc_binds = applied.host_uid != 0;
    let mut not_applied = vec!["cpus: the local backend has no cgroup".to_owned()];
    if !nproc_binds {
        not_applied.push("pids: RLIMIT_NPROC does not bind the host's uid 0".to_owned());
    }
    let limits = serde_json::json!({
        "memoryBytes": applied.rlimits.data_bytes,
        "addressSpaceBytes": applied.rlimits.address_space_bytes,
        "pids": applied.rlimits.nproc,
        "nofile": applied.rlimits.nofile,
        "fileSizeBytes": applied.rlimits.fsize_bytes,
        "coreBytes": applied.rlimits.core_bytes,
        "notApplied": not_applied,
    });
    let role = match spec.role {
        crate::plan::Role::Workspace => "workspace",
        crate::plan::Role::Server => "server",
    };
    let mut env_passed: Vec<String> = environment
        .vars
        .iter()
        .map(|(name, _)| name.clone())
        .collect();
    env_passed.sort();
    let mut env_scrubbed = environment.scrubbed.clone();
    env_scrubbed.sort();
    Envelope {
        name: spec.name.clone(),
        role: role.to_owned(),
        backend: "local".to_owned(),
        id: id.to_owned(),
        image: String::new(),
        image_id: String::new(),
        root: layout
            .workspace
            .as_ref()
            .map(|path| path.display().to_string())
            .unwrap_or_default(),
        user: format!("{}:{}", applied.uid, applied.gid),
        network,
        limits,
        hardening: Hardening {
            capabilities: super::sandbox::capability_names(applied.capabilities.effective),
            no_new_privileges: applied.no_new_privs,
            // Landlock grants writes only to the workspace and the unit's temp.
            read_only_root: applied.landlock.enforced,
            seccomp: "none".to_owned(),
            landlock_abi: applied.landlock.abi,
            landlock_enforced: applied.landlock.enforced,
            namespaces: applied.namespaces.clone(),
            user_namespace: has("user"),
        },
        env_passed,
        env_scrubbed,
        git_neutralised: spec.security.neutralise_git
            && !crate::scrub::git_neutralisation().is_empty(),
        state: "running".to_owned(),
    }
}

/// How a unit ended: the init's report when there is one (it saw the
/// executor's own status), else the helper's wait status.
fn unit_end(
    reported: Option<(Option<i32>, Option<i32>)>,
    status: Option<ExitStatus>,
    removed: bool,
) -> UnitEnd {
    let (code, signal) = match (reported, status) {
        (Some((code, signal)), _) => (code, signal),
        (None, Some(status)) => (status.code(), status.signal()),
        (None, None) => (None, None),
    };
    let cause = match (code, signal) {
        (_, Some(signal)) => format!("the executor was killed by {}", signal_name(signal)),
        (Some(code), None) => format!("the executor exited with code {code}"),
        (None, None) => "the executor ended for an unknown reason".to_owned(),
    };
    UnitEnd {
        exit_code: match (code, signal) {
            (_, Some(_)) => Some(-1),
            (code, None) => code.map(i64::from),
        },
        oom_killed: false,
        reason: if removed {
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
