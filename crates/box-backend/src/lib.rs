//! Backends: turn a unit spec into a running unit with the executor inside it,
//! and report what was actually applied as an envelope. A backend decides
//! nothing: the plan says what, the backend applies it or fails naming the
//! control it could not apply.
//!
//! Nothing here may assume a local Docker socket: a Kubernetes backend must fit
//! the same trait. This crate is what every backend shares: the [`Backend`]
//! trait, the pure [`Backend::check`] that start and `box doctor` both ask,
//! listing and removing units by instance (`box units`, `box gc`, the host's
//! sweep), the environment a unit gets, instance liveness, the host's side
//! of a unit's life over box-init's channel ([`lifecycle`]: run directory,
//! lease renewal, adopt, stdio relay), and the [`Registry`] the binary fills
//! with the backends it was built with.

pub mod environment;
pub mod executor_log;
pub mod instance;
pub mod lifecycle;
pub mod pool;
mod registry;
pub mod stats;
pub mod volumes;

pub use registry::{Connect, Registry};

use std::pin::Pin;

use futures::future::BoxFuture;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncWrite};

use box_policy::plan::UnitSpec;

pub use box_policy::envelope::{
    AppliedLifecycle, AppliedLimits, AppliedNetwork, BackendKind, ContainerLimits, DeliveredSecret,
    Envelope, Hardening, HostOnlyLimits, LocalNone, PersistedCredential, ProcessLimits, UnitState,
};

/// Label and name constants shared by the backends.
pub mod labels {
    /// This host's instance id.
    pub const INSTANCE: &str = "box.instance";
    /// The session a unit belongs to.
    pub const SESSION: &str = "box.session";
    /// The unit's name within its session.
    pub const UNIT: &str = "box.unit";
    /// The profile the session resolved.
    pub const PROFILE: &str = "box.profile";
    /// When the unit was created (RFC 3339).
    pub const CREATED: &str = "box.created";
    /// The unit a fork was made from (only on a `box/fork` child).
    pub const PARENT: &str = "box.parent";
    /// The unit's lease in milliseconds (its length, set at creation: never
    /// a deadline), so `box gc` can tell when a dead host's unit may still
    /// hold a live one.
    pub const LEASE_MS: &str = "box.lease-ms";
    /// The image as the unit's profile named it (the engine is handed the
    /// image's id, which is all it would show).
    pub const IMAGE: &str = "box.image";
}

/// A backend's failure; every variant names the unit.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The image is not there; the message names what puts it there.
    #[error("unit {unit}: image {image} is missing; {remedy}")]
    MissingImage {
        /// The unit.
        unit: String,
        /// The image asked for.
        image: String,
        /// What to do: the command that builds it, for box's own images.
        remedy: String,
    },
    /// A protection the plan requires could not be applied here.
    #[error("unit {unit}: {control} is required but cannot be applied here: {why}")]
    Unenforceable {
        /// The unit.
        unit: String,
        /// The control (landlock, seccomp, user namespace, ...).
        control: String,
        /// Why not.
        why: String,
    },
    /// Anything else, with what was being done.
    #[error("unit {unit}: {doing}: {message}")]
    Other {
        /// The unit.
        unit: String,
        /// What was being done.
        doing: String,
        /// What went wrong.
        message: String,
    },
}

impl BackendError {
    /// What makes [`BackendError::Other`] for `unit`, from what was being
    /// done and what went wrong.
    pub fn other_for(unit: &str) -> impl Fn(&str, String) -> Self + '_ {
        move |doing, message| Self::Other {
            unit: unit.to_owned(),
            doing: doing.to_owned(),
            message,
        }
    }
}

/// Identifies one session for the backends (labels, names).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionLabel {
    /// This host's instance id.
    pub instance: String,
    /// The session id.
    pub session: String,
    /// The profile name.
    pub profile: String,
}

/// `text` with every character but ASCII letters, digits, `-` and `_` made
/// `_`: safe in a directory's name and in an engine's volume and network
/// names (a session's instance, id and profile are anyone's to write).
pub fn safe_name(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The executor's stdio inside a running unit: MCP flows over it.
pub struct ExecutorIo {
    /// The executor's stdin.
    pub stdin: Pin<Box<dyn AsyncWrite + Send>>,
    /// The executor's stdout (the protocol; stderr goes to the host's log).
    pub stdout: Pin<Box<dyn AsyncRead + Send>>,
}

/// What the host wires into a unit beyond its spec: resources the host owns and
/// the unit reaches through a bind mount, and where the start's progress goes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnitWiring {
    /// The unit's egress proxy (its spec's network is `egress`).
    pub egress: Option<EgressWiring>,
    /// Where the host keeps its runtime files: a backend whose units hold a
    /// lease makes each unit's run directory (the socket its init connects
    /// to) under it; `None`: [`default_runtime_dir`].
    pub runtime_dir: Option<std::path::PathBuf>,
    /// Files of the workspace the unit sees replaced, read-only, by a host
    /// file (`on_persisted_credentials = "hide"`: a copy with the credentials
    /// masked). Only for a workspace unit.
    pub masks: Vec<FileMask>,
    /// A forked workspace's borrowed git objects (a `worktree` fork).
    pub objects: Option<ObjectsWiring>,
    /// Who hears how a slow step of the start goes (an image pull): the
    /// host's MCP progress for a client that sent a progress token.
    pub progress: Option<StartProgress>,
    /// The unit this one was forked from (`box/fork`), for its labels.
    pub parent: Option<String>,
    /// Who hears when each step of the start began and ended (the host's
    /// traces: `unit.pull`, `unit.create`, `unit.boot` on docker; `unit.spawn`,
    /// `unit.confine`, `unit.connect` on the local backend).
    pub phases: Option<StartPhases>,
}

impl UnitWiring {
    /// Report that step `name` of the start, begun at `started`, ended now.
    pub fn phase(&self, name: &'static str, started: std::time::SystemTime, ok: bool) {
        if let Some(phases) = &self.phases {
            (phases.0)(name, started, std::time::SystemTime::now(), ok);
        }
    }
}

/// Where a unit's start reports its steps: the step's name, when it began
/// and ended, and whether it worked.
#[derive(Clone)]
#[allow(clippy::type_complexity)]
pub struct StartPhases(
    pub  std::sync::Arc<
        dyn Fn(&'static str, std::time::SystemTime, std::time::SystemTime, bool) + Send + Sync,
    >,
);

impl std::fmt::Debug for StartPhases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StartPhases")
    }
}

/// The same listener.
impl PartialEq for StartPhases {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for StartPhases {}

/// What a backend can do beyond starting a unit from its spec: what the host
/// may wire into a unit, and what it may ask of one later. The host asks
/// ([`Backend::capabilities`]) instead of assuming: it refuses a session
/// before starting anything for it that the backend cannot take (no egress
/// proxy started for a unit that could not reach it), and a backend's
/// `start_wired` refuses the same way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// Shows host files read-only in a unit over workspace files
    /// ([`UnitWiring::masks`], `on_persisted_credentials = "hide"`).
    pub host_files: bool,
    /// Wires the host's egress proxy socket into a unit
    /// ([`UnitWiring::egress`], network mode `egress`).
    pub egress_socket: bool,
    /// Shows a `worktree` fork's borrowed git objects in a unit
    /// ([`UnitWiring::objects`]; where, and for which specs:
    /// [`Backend::objects_place`]).
    pub worktree_objects: bool,
    /// Re-adopts a live unit another host process started ([`Backend::adopt`]:
    /// a session reattached after a restart).
    pub adopt: bool,
    /// Mounts a spec's `[[volume]]`s.
    pub volumes: bool,
}

/// What a unit's start asks to have wired in, as [`Capabilities`] names it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Wants {
    /// The egress proxy's socket.
    pub egress_socket: bool,
    /// Host files over workspace files.
    pub host_files: bool,
    /// A worktree fork's borrowed objects.
    pub worktree_objects: bool,
}

impl UnitWiring {
    /// What this wiring asks of a backend.
    pub fn wants(&self) -> Wants {
        Wants {
            egress_socket: self.egress.is_some(),
            host_files: !self.masks.is_empty(),
            worktree_objects: self.objects.is_some(),
        }
    }
}

impl Capabilities {
    /// Nothing beyond a unit from its spec: what a backend that keeps the
    /// trait's defaults can do.
    pub const NONE: Capabilities = Capabilities {
        host_files: false,
        egress_socket: false,
        worktree_objects: false,
        adopt: false,
        volumes: false,
    };

    /// Everything: a backend that binds host paths into its units and
    /// whose units run box's init (docker).
    pub const ALL: Capabilities = Capabilities {
        host_files: true,
        egress_socket: true,
        worktree_objects: true,
        adopt: true,
        volumes: true,
    };

    /// The first of `wants` the `kind` backend cannot wire into `unit`, as
    /// the refusal a start gives (the same sentence from the host before
    /// anything starts, and from the backend's `start_wired`).
    pub fn refuse(self, kind: BackendKind, unit: &str, wants: Wants) -> Result<(), Unenforceable> {
        let refusal = |control: &str, why: String| Unenforceable {
            unit: unit.to_owned(),
            control: control.to_owned(),
            why,
        };
        if wants.egress_socket && !self.egress_socket {
            return Err(refusal(
                "network egress allow list",
                format!(
                    "the {kind} backend cannot wire the host's egress proxy into a unit yet; use network mode none, or the docker backend"
                ),
            ));
        }
        if wants.host_files && !self.host_files {
            return Err(refusal(
                "on_persisted_credentials = \"hide\"",
                format!(
                    "the {kind} backend cannot mask a workspace file inside a unit; use \"report\" or \"refuse\", or the docker backend"
                ),
            ));
        }
        if wants.worktree_objects && !self.worktree_objects {
            return Err(refusal(
                "a worktree fork's borrowed git objects",
                format!(
                    "the {kind} backend cannot mount the parent's git objects into a unit; fork with mode copy"
                ),
            ));
        }
        Ok(())
    }
}

/// One workspace file the unit sees replaced by a host file, read-only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileMask {
    /// The host file the unit sees instead (owned by the host, readable by all).
    pub source: std::path::PathBuf,
    /// The masked file, relative to the unit's workspace root (no `..`, no
    /// absolute path: checked by whoever builds it).
    pub target: std::path::PathBuf,
}

/// Where a host keeps its sockets (egress proxies, units' run directories):
/// `$XDG_RUNTIME_DIR/box`, `/run/box` for root, else a directory of the
/// user's own under the temporary directory.
pub fn default_runtime_dir() -> std::path::PathBuf {
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR").filter(|dir| !dir.is_empty()) {
        return std::path::PathBuf::from(dir).join("box");
    }
    let uid = nix::unistd::getuid();
    if uid.is_root() {
        std::path::PathBuf::from("/run/box")
    } else {
        std::env::temp_dir().join(format!("box-{uid}"))
    }
}

/// A `worktree` fork's child repository borrows its parent's git objects:
/// the parent's objects directory, seen read-only in the unit where the
/// backend says ([`Backend::objects_place`]), which the child's
/// `.git/objects/info/alternates` names. The child's own objects, refs,
/// index and config are its own; these are only readable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectsWiring {
    /// The parent repository's objects directory on the host.
    pub host: std::path::PathBuf,
}

impl ObjectsWiring {
    /// Where a backend that mounts them at a fixed place (docker) shows them.
    pub const DIR_IN_UNIT: &str = "/.box/objects";
}

/// Where a unit sees a `worktree` fork's borrowed git objects: what the
/// child's alternates must name, decided by the backend before the fork is
/// made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObjectsPlace {
    /// At their host path (a unit that sees the host's directories where they
    /// are: the local backend binds them back read-only there).
    HostPath,
    /// At this path in the unit, whatever the host path (a bind mount's
    /// target: docker's [`ObjectsWiring::DIR_IN_UNIT`]).
    At(std::path::PathBuf),
}

/// One report of a start's progress: what is happening, and bytes done of
/// bytes in all (when known), cumulative for the unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgressReport {
    /// What is happening, for a person (`pulling IMAGE: 2/3 layers`).
    pub message: String,
    /// Bytes done so far.
    pub done: u64,
    /// Bytes in all, when known.
    pub total: Option<u64>,
}

/// Where a unit's start reports its progress.
#[derive(Clone)]
pub struct StartProgress(pub std::sync::Arc<dyn Fn(ProgressReport) + Send + Sync>);

impl std::fmt::Debug for StartProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StartProgress")
    }
}

/// The same listener.
impl PartialEq for StartProgress {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for StartProgress {}

/// The host's egress proxy for one unit: a directory on the host holding its
/// listening socket ([`EgressWiring::SOCKET`]), mounted read-only at
/// [`EgressWiring::DIR_IN_UNIT`]. The directory, not the socket, is mounted so the
/// unit sees exactly one entry and nothing else of the host's runtime directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressWiring {
    /// The host directory holding the socket.
    pub socket_dir: std::path::PathBuf,
}

impl EgressWiring {
    /// Where the directory appears inside the unit.
    pub const DIR_IN_UNIT: &str = "/.box/egress";
    /// The socket's file name in the directory.
    pub const SOCKET: &str = "proxy.sock";
    /// The loopback port the executor's bridge listens on inside the unit
    /// (`box_egress::BRIDGE_PORT`; a test in box-host holds them equal).
    pub const BRIDGE_PORT: u16 = 3128;
    /// Where a unit's tools find the proxy (what `HTTP_PROXY` and the rest say).
    pub const PROXY_URL: &str = "http://127.0.0.1:3128";

    /// The socket's path inside the unit (what the executor is told).
    pub fn socket_in_unit() -> std::path::PathBuf {
        std::path::Path::new(Self::DIR_IN_UNIT).join(Self::SOCKET)
    }
}

/// How a unit ended, as far as the backend can tell.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UnitEnd {
    /// The exit code, when there is one.
    pub exit_code: Option<i64>,
    /// Whether the kernel's OOM killer ended it, as the evidence shows:
    /// `Some(true)`, `Some(false)`, or `None` where the backend cannot tell
    /// (a SIGKILL whose unit's memory cgroup it could not read). Sessions
    /// get it as `oomKilled`: `true`, `false` or `null`.
    pub oom_killed: Option<bool>,
    /// The whole sentence for the session: who ended, how (the exit code or
    /// the signal) and why (an OOM kill, a stop from outside), each said
    /// once; the host passes it on as it is.
    pub reason: String,
}

/// What a backend's evidence (a unit's memory cgroup, how it ended) says
/// about the kernel's OOM killer and a unit's end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OomEvidence {
    /// The OOM killer ended it (or killed a process in it just before).
    Killed,
    /// The evidence rules the OOM killer out.
    NotKilled,
    /// Nothing here can tell (the unit's memory cgroup could not be read).
    Unknown,
}

impl OomEvidence {
    /// As [`UnitEnd::oom_killed`]: `Some(true)`, `Some(false)`, `None`.
    pub fn as_flag(self) -> Option<bool> {
        match self {
            OomEvidence::Killed => Some(true),
            OomEvidence::NotKilled => Some(false),
            OomEvidence::Unknown => None,
        }
    }
}

/// A started unit.
pub struct StartedUnit {
    /// What was applied.
    pub envelope: Envelope,
    /// The executor's stdio.
    pub io: ExecutorIo,
    /// Resolves once the unit (or its executor) has ended, with the cause.
    pub ended: BoxFuture<'static, UnitEnd>,
    /// The renewal of the unit's lease, where its backend gives it one: the
    /// host holds it for as long as it wants the unit. Dropping it stops the
    /// renewals, and the unit ends by itself within its lease (or sooner,
    /// when it is removed).
    pub renewal: Option<Renewal>,
}

/// What a host persisted of a started unit, for a later host process to
/// re-adopt it ([`Backend::adopt`]) while its lease is live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdoptUnit {
    /// The backend's id (the container id).
    pub id: String,
    /// The unit's identity in its init's proofs (`instance/session/unit` of
    /// the host that started it).
    pub identity: String,
    /// The unit's run directory on the host (its init reconnects to the
    /// socket in it).
    pub run_dir: std::path::PathBuf,
    /// The image id the unit's container was created from (the envelope's
    /// `image_id`); a container that now runs another is refused.
    pub image_id: Option<String>,
    /// The image's registry digest, as the start's envelope reported it.
    pub image_digest: Option<String>,
    /// The environment's names the envelope reported at start.
    pub env_passed: Vec<String>,
    /// The environment's names scrubbed at start.
    pub env_scrubbed: Vec<String>,
    /// How long to wait for the init to reconnect.
    pub timeout: std::time::Duration,
}

/// The host's renewal of one unit's lease, running until dropped.
#[derive(Debug)]
pub struct Renewal(
    tokio::task::AbortHandle,
    Option<std::path::PathBuf>,
    Option<std::sync::Arc<instance::InstanceLock>>,
);

impl Renewal {
    /// Renewals by `task`, stopped when this is dropped.
    pub fn new(task: tokio::task::AbortHandle) -> Self {
        Self(task, None, None)
    }

    /// Renewals by `task` over the socket in `run_dir` (what a later host
    /// binds again to re-adopt the unit: [`AdoptUnit::run_dir`]).
    pub fn with_run_dir(task: tokio::task::AbortHandle, run_dir: std::path::PathBuf) -> Self {
        Self(task, Some(run_dir), None)
    }

    /// These renewals also keep `instance` held (a dead host's, whose unit
    /// this host re-adopted) for as long as they run.
    pub fn holding(mut self, instance: std::sync::Arc<instance::InstanceLock>) -> Self {
        self.2 = Some(instance);
        self
    }

    /// The unit's run directory, where its backend has one.
    pub fn run_dir(&self) -> Option<&std::path::Path> {
        self.1.as_deref()
    }

    /// Whether renewals have stopped (the unit's channel ended, or another
    /// host took it over).
    pub fn is_finished(&self) -> bool {
        self.0.is_finished()
    }
}

impl Drop for Renewal {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A control the plan asks for that a backend cannot apply here: the answer
/// of [`Backend::check`], the same sentence for `box doctor` and for a
/// refused start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unenforceable {
    /// The unit.
    pub unit: String,
    /// The control (landlock, network egress allow list, capabilities ...).
    pub control: String,
    /// Why not, and what to do instead.
    pub why: String,
}

impl From<Unenforceable> for BackendError {
    fn from(refusal: Unenforceable) -> Self {
        BackendError::Unenforceable {
            unit: refusal.unit,
            control: refusal.control,
            why: refusal.why,
        }
    }
}

impl std::fmt::Display for Unenforceable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unit {}: {}: {}", self.unit, self.control, self.why)
    }
}

/// What removing a set of units did.
#[derive(Debug, Default)]
pub struct SweepReport {
    /// Units removed.
    pub removed: Vec<UnitInfo>,
    /// Units that could not be removed, with why.
    pub failed: Vec<(UnitInfo, String)>,
}

/// A unit as listed by the backend (from its labels).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UnitInfo {
    /// The backend's id.
    pub id: String,
    /// `box.instance`.
    pub instance: String,
    /// `box.session`.
    pub session: String,
    /// `box.unit`.
    pub unit: String,
    /// `box.profile`.
    pub profile: String,
    /// `box.created`.
    pub created: String,
    /// The backend's state word.
    pub state: String,
    /// `box.parent`: the unit a `box/fork` child was forked from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// `box.lease-ms`: the lease the unit holds, when something in it
    /// enforces one (docker units).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_ms: Option<u64>,
    /// `box.image`: the image the unit runs, as its profile named it; absent
    /// where the unit runs no image (a local unit runs the host's userland).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// `box.pool`: the profile whose pool started the unit (a warm unit,
    /// claimed or still ready; its session is then the pool's `pool-N`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
}

/// One unit in detail, as `box units inspect` shows it: what
/// [`Backend::list`] says of it, and what its backend recorded when it
/// started the unit.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UnitDetail {
    /// The unit as listed.
    #[serde(flatten)]
    pub info: UnitInfo,
    /// The host directory the unit's workspace is; absent when it is none of
    /// the host's (an empty workspace, or none).
    pub workspace: Option<std::path::PathBuf>,
    /// The unit's first process as the host sees it (a docker unit's init,
    /// a local unit's sandbox helper), while it runs.
    pub pid: Option<u32>,
    /// The envelope its backend reported when it started (or re-adopted)
    /// the unit; absent when none was recorded (a unit an older box started).
    pub envelope: Option<serde_json::Value>,
}

impl UnitDetail {
    /// `info` with nothing more known of it.
    pub fn listed(info: UnitInfo) -> Self {
        Self {
            info,
            workspace: None,
            pid: None,
            envelope: None,
        }
    }
}

/// The seam between the host and where units run.
///
/// Contract: `start` is create+start+executor attach of one unit, and undoes
/// itself on failure (nothing left behind). `remove` stops and removes, and is
/// idempotent: removing a missing unit is `Ok`. `list` sees only units carrying
/// box's labels.
pub trait Backend: Send + Sync {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;

    /// Whether this backend can apply everything `spec` asks, judged from
    /// facts gathered when it was connected (pure: no engine call). `start`
    /// refuses with the first of these before creating anything; `box
    /// doctor` lists them all.
    fn check(&self, spec: &UnitSpec) -> Result<(), Vec<Unenforceable>>;

    /// Create and start one unit of `session` from `spec`, with the executor attached.
    fn start<'a>(
        &'a self,
        session: &'a SessionLabel,
        spec: &'a UnitSpec,
    ) -> BoxFuture<'a, Result<StartedUnit, BackendError>>;

    /// [`start`](Self::start), with what the host wires in. A backend that cannot
    /// wire something refuses (never starts the unit without it).
    fn start_wired<'a>(
        &'a self,
        session: &'a SessionLabel,
        spec: &'a UnitSpec,
        wiring: &'a UnitWiring,
    ) -> BoxFuture<'a, Result<StartedUnit, BackendError>> {
        // This default knows only `start`: whatever is wired in is refused,
        // never left out.
        if let Err(refusal) = Capabilities::NONE.refuse(self.kind(), &spec.name, wiring.wants()) {
            return Box::pin(futures::future::ready(Err(refusal.into())));
        }
        self.start(session, spec)
    }

    /// What a start of `spec` would find missing on the engine that
    /// [`check`](Self::check) cannot see without asking it (docker: an image
    /// it will not pull and does not have), each with what to do: `box
    /// doctor` asks. The default finds nothing missing.
    fn ready<'a>(&'a self, spec: &'a UnitSpec) -> BoxFuture<'a, Result<(), Vec<String>>> {
        let _ = spec;
        Box::pin(futures::future::ready(Ok(())))
    }

    /// What this backend can do beyond [`start`](Self::start): the host
    /// asks before it wires anything in or re-adopts a unit. The default,
    /// [`Capabilities::NONE`], fits the trait's defaults.
    fn capabilities(&self) -> Capabilities {
        Capabilities::NONE
    }

    /// How this backend keeps pooled units (started with no session, bound
    /// to one at a claim: [`pool`]), if it can; `None` by default, and the
    /// host then starts every unit cold.
    fn pooling(&self) -> Option<&dyn pool::Pooling> {
        None
    }

    /// Where a unit of `spec` would see a `worktree` fork's borrowed git
    /// objects ([`UnitWiring::objects`]), or why this backend cannot show
    /// them read-only in such a unit (the host then forks by copy, or
    /// refuses a fork that asked for worktree, with this reason). Pure.
    fn objects_place(&self, spec: &UnitSpec) -> Result<ObjectsPlace, String> {
        let _ = spec;
        Err(format!(
            "the {} backend cannot mount the parent's git objects into a unit",
            self.kind().as_str()
        ))
    }

    /// Re-adopt a live unit another (dead) host process started from `spec`:
    /// reconnect to its executor without initializing it again, renew its
    /// lease above the previous host's epoch, and report its envelope (with
    /// `reattached` set). Never starts anything: a unit that is gone, whose
    /// lease lapsed or that is not the one persisted is an error naming why.
    fn adopt<'a>(
        &'a self,
        session: &'a SessionLabel,
        spec: &'a UnitSpec,
        unit: &'a AdoptUnit,
    ) -> BoxFuture<'a, Result<StartedUnit, BackendError>> {
        let _ = (session, unit);
        Box::pin(async move {
            Err(BackendError::Unenforceable {
                unit: spec.name.clone(),
                control: "reattach".to_owned(),
                why: format!(
                    "the {} backend cannot re-adopt a unit another host process started",
                    self.kind().as_str()
                ),
            })
        })
    }

    /// Stop and remove the unit with backend id `id`; `Ok` if it is already gone.
    fn remove<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), BackendError>>;

    /// Remove the unit with backend id `id` at once, its processes given no
    /// grace to end (a user interrupted `box run`: nothing of the unit is
    /// waited for); `Ok` if it is already gone. The default is
    /// [`Backend::remove`], for a backend whose removal gives no grace.
    fn remove_now<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), BackendError>> {
        self.remove(id)
    }

    /// Every unit carrying box's labels (all instances).
    fn list(&self) -> BoxFuture<'_, Result<Vec<UnitInfo>, BackendError>>;

    /// `unit` (as [`list`](Self::list) gave it) in detail: its workspace, its
    /// first process, the envelope recorded at its start. The default knows
    /// only what the listing said.
    fn inspect<'a>(
        &'a self,
        unit: &'a UnitInfo,
    ) -> BoxFuture<'a, Result<UnitDetail, BackendError>> {
        Box::pin(futures::future::ready(Ok(UnitDetail::listed(unit.clone()))))
    }

    /// What unit `id` uses now (CPU time, memory, tasks, block IO), read
    /// from its cgroup or, without one, its processes; a figure it cannot
    /// read is unknown. The default: this backend reports none.
    fn stats<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<stats::UnitStats, BackendError>> {
        Box::pin(futures::future::ready(Err(BackendError::Unenforceable {
            unit: id.to_owned(),
            control: "resource usage".to_owned(),
            why: format!(
                "the {} backend does not report a unit's usage",
                self.kind().as_str()
            ),
        })))
    }

    /// Bytes in use on the filesystems at `paths` inside unit `id` (its
    /// `/tmp`, its home), a figure per path, `None` where it cannot be read.
    /// The default: every figure unknown.
    fn used<'a>(
        &'a self,
        id: &'a str,
        paths: &'a [std::path::PathBuf],
    ) -> BoxFuture<'a, Vec<Option<u64>>> {
        let _ = id;
        Box::pin(futures::future::ready(vec![None; paths.len()]))
    }

    /// The units of one host instance.
    fn list_instance<'a>(
        &'a self,
        instance: &'a str,
    ) -> BoxFuture<'a, Result<Vec<UnitInfo>, BackendError>> {
        Box::pin(async move {
            let mut units = self.list().await?;
            units.retain(|unit| unit.instance == instance);
            Ok(units)
        })
    }

    /// Remove `units` concurrently, reporting each failure: `box gc`, the
    /// host's sweep of its instance's orphans.
    fn remove_units(&self, units: Vec<UnitInfo>) -> BoxFuture<'_, SweepReport> {
        Box::pin(async move {
            let results = futures::future::join_all(units.into_iter().map(|unit| async move {
                let result = self.remove(&unit.id).await;
                (unit, result)
            }))
            .await;
            let mut report = SweepReport::default();
            for (unit, result) in results {
                match result {
                    Ok(()) => report.removed.push(unit),
                    Err(error) => report.failed.push((unit, error.to_string())),
                }
            }
            report
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_backend_cannot_wire_in_is_refused_naming_the_control() {
        let wants = |egress_socket, host_files, worktree_objects| Wants {
            egress_socket,
            host_files,
            worktree_objects,
        };
        let none = Capabilities::NONE;
        let refused = |wants| none.refuse(BackendKind::Local, "u", wants).unwrap_err();
        let egress = refused(wants(true, true, true));
        assert_eq!(egress.control, "network egress allow list");
        assert!(
            egress.why.starts_with("the local backend cannot"),
            "{egress}"
        );
        assert_eq!(
            refused(wants(false, true, true)).control,
            "on_persisted_credentials = \"hide\""
        );
        assert_eq!(
            refused(wants(false, false, true)).control,
            "a worktree fork's borrowed git objects"
        );
        assert_eq!(
            none.refuse(BackendKind::Local, "u", Wants::default()),
            Ok(())
        );
        assert_eq!(
            Capabilities::ALL.refuse(BackendKind::Docker, "u", wants(true, true, true)),
            Ok(())
        );
        let wiring = UnitWiring {
            masks: vec![FileMask {
                source: "/h".into(),
                target: "f".into(),
            }],
            ..UnitWiring::default()
        };
        assert_eq!(wiring.wants(), wants(false, true, false));
    }
}
