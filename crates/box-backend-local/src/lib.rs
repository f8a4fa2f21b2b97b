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

mod adopt;
mod ended;
mod envelope;
mod helper;
mod lease;
mod pool;
mod private;
mod spec;
mod start;
mod usage;
mod volumes;

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::watch;

pub use helper::{ExecutorEntry, REFUSED_EXIT, SandboxArgs};

use box_backend::{
    AdoptUnit, Backend, BackendError, ObjectsPlace, SessionLabel, StartedUnit, Unenforceable,
    UnitDetail, UnitInfo, UnitWiring,
};
use box_policy::envelope::BackendKind;
use box_policy::plan::{NetworkMode, Requirement, UnitSpec, VolumePath};

use adopt::{exited_now, watch_exit};
use envelope::{delivered_secrets, envelope};
use spec::{Layout, check_spec, executor_spec, unit_environment};
use start::CheckedWalk;
use volumes::remove_session_volumes;

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
    /// Its first process in a mount namespace of its own, with that
    /// process's start time, once `used` has found it (`usage`).
    inside: Option<(u32, u64)>,
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
                    inside: None,
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
        futures::future::ready(self.usage(id).ok_or_else(|| BackendError::Other {
            unit: id.to_owned(),
            doing: "reading its resource usage".to_owned(),
            message: "no such running local unit (see `box units ls --backend local`)".to_owned(),
        }))
        .boxed()
    }

    /// Measured through the first of the helper's descendants in the
    /// unit's own mount namespace (the helper stays in the host's).
    fn used<'a>(&'a self, id: &'a str, paths: &'a [PathBuf]) -> BoxFuture<'a, Vec<Option<u64>>> {
        futures::future::ready(self.used_at(id, paths)).boxed()
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

#[cfg(test)]
mod tests;
