//! The envelope: what a backend actually applied to one unit, reported to the
//! session under the executor capability key. Typed here so every backend
//! writes the same shape; serialised to the JSON sessions have always read
//! (camelCase keys in this order; values a backend could not read back are
//! `null`, never guessed).

use serde::Serialize;

use crate::plan::Role;

/// What was actually applied to a unit, never what was merely asked.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Envelope {
    /// The unit's name in its session.
    pub name: String,
    /// Workspace or server.
    pub role: Role,
    /// The backend that runs it.
    pub backend: BackendKind,
    /// The backend's id for it (a container id; a local unit's random id).
    pub id: String,
    /// The image asked for (empty on the local backend, which runs no image:
    /// see `userland`).
    pub image: String,
    /// The image's id (digest) as the engine resolved it.
    pub image_id: String,
    /// The registry's content digest of the image the unit runs
    /// (`sha256:...`): for a pinned image, the digest verified before the
    /// start; for a pulled tag, the one the engine recorded. Absent for an
    /// image no registry knows (built locally) and where there is no engine.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_digest: Option<String>,
    /// The engine's OCI runtime the unit runs under (`runc`, `runsc` for gVisor);
    /// absent where there is no engine.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    /// `host` where the unit runs on the host's own userland (its programs,
    /// libraries and `/etc`) in place of an image: a local unit, which its
    /// profile's `local_userland = "host"` allowed. Absent where the unit runs
    /// its image.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub userland: Option<String>,
    /// The workspace root inside the unit.
    pub root: String,
    /// "uid:gid" processes run as.
    pub user: String,
    /// The network as applied.
    pub network: AppliedNetwork,
    /// Limits in plain numbers, as applied.
    pub limits: AppliedLimits,
    /// The hardening achieved.
    pub hardening: Hardening,
    /// Variable names passed into the unit.
    pub env_passed: Vec<String>,
    /// Variable names scrubbed on the way.
    pub env_scrubbed: Vec<String>,
    /// Whether git is neutralised for children.
    pub git_neutralised: bool,
    /// The secrets delivered as files (names and paths, never values).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<DeliveredSecret>,
    /// Credentials found persisted in the workspace at session start (the
    /// workspace unit's only; never values).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub persisted_credentials: Vec<PersistedCredential>,
    /// The unit a `box/fork` child was forked from (the host sets it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// The unit's lease, where box's init holds one in the unit: how long
    /// the unit outlives its host's last renewal. Absent where nothing in
    /// the unit enforces a lease.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<AppliedLifecycle>,
    /// Where the unit is in its life.
    pub state: UnitState,
    /// The volumes mounted in the unit (storage that outlives it).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<AppliedVolume>,
    /// The unit's home, writable and bounded (`limits.homeBytes`), where the
    /// backend made one of the unit's own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub home: Option<AppliedHome>,
    /// Set when the unit's processes run as uid 0 of the host (no
    /// user-namespace remapping): what that means and what avoids it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub root_user: Option<RootUser>,
    /// Whether the unit came ready from a host's pool (its plan bound to it
    /// at the claim) or started cold, and why cold. Absent where the host
    /// keeps no pool.
    #[serde(skip_serializing_if = "Option::is_none", flatten)]
    pub warm: Option<Warm>,
}

/// How a unit of a host with pools started: `warm: true` (claimed from a
/// pool, the session's plan bound to it before it served anything), or
/// `warm: false` with `warmWhy`, why no pooled unit could serve the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Warm {
    /// Claimed from a pool.
    pub warm: bool,
    /// Why the unit started cold (absent when warm).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warm_why: Option<String>,
    /// A warm unit's session label as its pool started it (`pool-N`), which
    /// it keeps (engines cannot relabel): the host persists the unit's
    /// identity with it, so the session can be reattached. Not shown.
    #[serde(skip)]
    pub pool_session: Option<String>,
}

/// A volume as mounted in a unit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AppliedVolume {
    /// Its name in the profile.
    pub name: String,
    /// Where the unit's tools see it.
    pub path: String,
    /// `session` (this session's units only, removed when it ends) or
    /// `profile`.
    pub scope: String,
    /// For `profile` scope: the profile every session of which on this host
    /// shares it. What one session writes there, the next reads: a channel
    /// between those sessions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared_with: Option<String>,
    /// The backend's name for it (docker: the named volume; local: its
    /// directory on the host).
    pub id: String,
}

/// The unit's own home, as made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AppliedHome {
    /// Where it is in the unit (`HOME`; the XDG base directories are beneath it).
    pub path: String,
    /// What it was filled with when the unit started: `image` (what the
    /// image put at that path), or a directory of the host's (`/etc/skel`,
    /// on the local backend); absent when it started empty.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seeded_from: Option<String>,
}

/// What an envelope says of a unit whose processes run as the host's uid 0.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RootUser {
    /// What it means.
    pub warning: String,
    /// What avoids it.
    pub remedies: Vec<String>,
}

impl RootUser {
    /// The warning and its remedies, in the same words everywhere (the
    /// envelope, `box run`, `box doctor`).
    pub fn new() -> Self {
        Self {
            warning: "the unit's processes run as uid 0, the host's root: its capabilities are dropped and no_new_privs is set, but what it writes is root's, and an escape through the kernel or the engine would be root on the host".to_owned(),
            remedies: vec![
                "a non-root user: write [workspace] user = \"1000:1000\" in the profile, or give the workspace a non-root owner (with user = \"host\", a root caller's unit runs as the owner of its workspace)".to_owned(),
                "the engine's user-namespace remapping (dockerd --userns-remap=default), which makes the unit's uid 0 an unprivileged uid of the host".to_owned(),
                "rootless Docker (dockerd-rootless-setuptool.sh install), or box run by a non-root user".to_owned(),
            ],
        }
    }

    /// One line for a terminal: the warning, then the remedies.
    pub fn line(&self) -> String {
        format!("{}; remedies: {}", self.warning, self.remedies.join("; "))
    }
}

impl Default for RootUser {
    fn default() -> Self {
        Self::new()
    }
}

/// The lease a unit's init enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AppliedLifecycle {
    /// The lease in milliseconds: the unit ends this long after its host's
    /// last renewal.
    pub lease_ms: u64,
}

/// A secret delivered to a unit as a file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeliveredSecret {
    /// The secret's name (the host variable's).
    pub name: String,
    /// The file inside the unit (`/run/secrets/NAME`, mode 0400).
    pub path: String,
    /// Also a variable of the processes the executor starts.
    pub as_env: bool,
}

/// A credential persisted in the workspace when the session started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PersistedCredential {
    /// The file, relative to the workspace.
    pub file: String,
    /// The line (1-based).
    pub line: usize,
    /// The key or entry (credentials in it masked).
    pub key: String,
    /// What kind (`extraheader`, `url-credentials`, `inline-helper`,
    /// `credential-store`, `netrc`).
    pub kind: String,
    /// Whether the unit sees the file with the value masked
    /// (`on_persisted_credentials = "hide"`); omitted when not.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub hidden: bool,
}

/// Which backend a unit runs on: a name (`docker`, `local`, ...), in
/// envelopes, labels and `--backend`. Open, so a new backend names itself in
/// its own crate (`BackendKind::new("k8s")`, as box-testkit's fake does) and
/// nothing here changes; the two backends box ships are named here once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackendKind(&'static str);

#[allow(non_upper_case_globals)]
impl BackendKind {
    /// A container engine, through its API.
    pub const Docker: BackendKind = BackendKind("docker");
    /// Confined processes on this host.
    pub const Local: BackendKind = BackendKind("local");

    /// The backend named `name` (a short lowercase word: it is a
    /// `--backend` value and a label's value).
    pub const fn new(name: &'static str) -> Self {
        BackendKind(name)
    }

    /// Its name in envelopes, labels and `--backend`.
    pub fn as_str(self) -> &'static str {
        self.0
    }
}

impl Serialize for BackendKind {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.0)
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A unit's state: the engine's word while it runs, `ended` once the host saw
/// it end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum UnitState {
    /// Created, not started.
    Created,
    /// Running.
    Running,
    /// Paused (frozen by the engine).
    Paused,
    /// Being restarted by the engine.
    Restarting,
    /// Being removed.
    Removing,
    /// Exited, not removed.
    Exited,
    /// The engine could not stop or remove it.
    Dead,
    /// The host saw it end.
    Ended,
    /// The backend did not say.
    Unknown,
}

impl UnitState {
    /// The state the engine names `word`; `Unknown` for any other word.
    pub fn from_engine(word: &str) -> Self {
        match word {
            "created" => Self::Created,
            "running" => Self::Running,
            "paused" => Self::Paused,
            "restarting" => Self::Restarting,
            "removing" => Self::Removing,
            "exited" => Self::Exited,
            "dead" => Self::Dead,
            "ended" => Self::Ended,
            _ => Self::Unknown,
        }
    }
}

/// The network as applied: the mode and the allow list, and on the local
/// backend how `none` was achieved (a namespace, or landlock and seccomp).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AppliedNetwork {
    /// `none`, `bridge`, `host`, `egress`, or the engine's network name.
    pub mode: String,
    /// The destinations allowed (egress).
    pub allow: Vec<String>,
    /// A bridge unit's engine network, its session's own: only the units of the
    /// session are attached to it (the engine isolates bridge networks from each
    /// other), so units of other sessions cannot reach this one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_network: Option<String>,
    /// The egress proxy's limits, when the mode is `egress`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress_limits: Option<EgressLimits>,
    /// Where the unit's tools find the egress proxy (`HTTP_PROXY` and the rest
    /// point there), when the mode is `egress`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy: Option<String>,
    /// How `none` was enforced without a container (local backend only).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub local_none: Option<LocalNone>,
}

/// What the egress proxy enforces per unit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EgressLimits {
    /// Connections open at once; one more is answered 429.
    pub max_connections: u64,
    /// Bytes per second, each direction, shared by the unit's connections; `null`: no cap.
    pub bytes_per_second: Option<u64>,
}

/// How the local backend cut a unit off the network (`none`, and `egress`,
/// whose only way out is the proxy's socket).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LocalNone {
    /// A network namespace of its own.
    pub namespace: bool,
    /// Its loopback is up.
    pub loopback_up: bool,
    /// Landlock refuses TCP bind and connect.
    pub landlock_tcp_denied: bool,
    /// Seccomp refuses IP sockets.
    pub ip_sockets_denied: bool,
    /// Landlock allows TCP bind and connect to these ports only (an egress
    /// unit's bridge port); absent when TCP is not limited to ports.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub landlock_tcp_ports: Vec<u16>,
}

/// Limits as applied, in the terms of the backend that applied them.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum AppliedLimits {
    /// A container's cgroup limits.
    Container(ContainerLimits),
    /// A confined process's rlimits.
    Process(ProcessLimits),
    /// Nothing the backend applied; only what the host enforces.
    HostOnly(HostOnlyLimits),
}

impl AppliedLimits {
    /// Record the start deadline the host enforced.
    pub fn set_start_timeout_ms(&mut self, millis: u64) {
        match self {
            AppliedLimits::Container(limits) => limits.start_timeout_ms = Some(millis),
            AppliedLimits::Process(limits) => limits.start_timeout_ms = Some(millis),
            AppliedLimits::HostOnly(limits) => limits.start_timeout_ms = Some(millis),
        }
    }
}

/// The limits of a unit whose backend applies none (the test double).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HostOnlyLimits {
    /// The start deadline the host enforced.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_timeout_ms: Option<u64>,
}

/// A container's limits as the engine reports them.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerLimits {
    /// Memory.
    pub memory_bytes: Option<i64>,
    /// Memory plus swap.
    pub memory_swap_bytes: Option<i64>,
    /// CPUs.
    pub cpus: Option<f64>,
    /// Processes and threads.
    pub pids: Option<i64>,
    /// /tmp's size.
    pub tmp_bytes: Option<u64>,
    /// /tmp's inodes.
    pub tmp_inodes: Option<u64>,
    /// The home's size (a tmpfs), where the unit has one of its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub home_bytes: Option<u64>,
    /// Open files.
    pub nofile: Option<i64>,
    /// The start deadline the host enforced.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_timeout_ms: Option<u64>,
}

/// A confined process's rlimits as read back, and what they cannot bound.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessLimits {
    /// RLIMIT_DATA.
    pub memory_bytes: u64,
    /// RLIMIT_AS.
    pub address_space_bytes: u64,
    /// RLIMIT_NPROC.
    pub pids: u64,
    /// RLIMIT_NOFILE.
    pub nofile: u64,
    /// RLIMIT_FSIZE.
    pub file_size_bytes: u64,
    /// RLIMIT_CORE.
    pub core_bytes: u64,
    /// The size of the unit's own `/tmp` (a tmpfs in its mount namespace);
    /// absent where it has none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tmp_bytes: Option<u64>,
    /// The size of the unit's home (a tmpfs in its mount namespace); absent
    /// where it is a directory on the host's disk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub home_bytes: Option<u64>,
    /// What the plan asked that a process cannot be held to, in words.
    pub not_applied: Vec<String>,
    /// The start deadline the host enforced.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_timeout_ms: Option<u64>,
}

/// The hardening actually achieved.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Hardening {
    /// Effective capabilities (names), after dropping.
    pub capabilities: Vec<String>,
    /// no_new_privs set.
    pub no_new_privileges: bool,
    /// Read-only root file system.
    pub read_only_root: bool,
    /// Seccomp layers: the engine's ("default", "custom") joined by "+" with box's own
    /// ("box", which the executor installs on itself and its children); "box" alone where
    /// the engine applies none; "none" where no layer is applied.
    pub seccomp: String,
    /// The landlock ABI the kernel offers (0 = none).
    pub landlock_abi: u32,
    /// Whether landlock is enforced on the executor and its children.
    pub landlock_enforced: bool,
    /// Namespaces the unit has of its own (user, mount, pid, net, ...).
    pub namespaces: Vec<String>,
    /// Whether the unit's user is in a user namespace (remapped).
    pub user_namespace: bool,
    /// Whether programs written to the unit's own `/tmp` may run (`exec`) or
    /// not (`noexec`), as mounted; absent where the unit has no `/tmp` of its
    /// own (a local unit without a mount namespace).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tmp: Option<crate::plan::TmpMode>,
}
