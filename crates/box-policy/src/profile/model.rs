//! The profile as validated: plain data, fully defaulted, with no host facts
//! resolved yet (`cwd` and `host` stay symbolic until `plan::resolve`).

use std::path::PathBuf;

pub use super::fields::{
    EnvPolicy, LifecyclePolicy, LimitsPolicy, NetworkPolicy, PoolPolicy, Server, Workspace,
};
use crate::plan::UserIds;

/// A profile: everything a session's units may be and do. A session can only narrow it.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// Its name (the file stem).
    pub name: String,
    /// One line about what it is for.
    pub description: String,
    /// The file it was loaded from (`shipped:NAME.toml` for one built into box).
    pub origin: String,
    /// The profiles it extends, nearest first.
    pub extends: Vec<String>,
    /// The workspace unit.
    pub workspace: Workspace,
    /// The workspace unit's network.
    pub network: NetworkPolicy,
    /// The workspace unit's limits (servers default to them).
    pub limits: LimitsPolicy,
    /// The workspace unit's environment.
    pub env: EnvPolicy,
    /// The hardening of every unit.
    pub security: SecurityPolicy,
    /// How every unit's life is bounded beyond its session (the lease).
    pub lifecycle: LifecyclePolicy,
    /// The warm units a `box serve --listen` host keeps for it (`[pool]`).
    pub pool: PoolPolicy,
    /// Server units, in the order written.
    pub servers: Vec<Server>,
    /// The workspace unit's volumes, in the order written.
    pub volumes: Vec<crate::plan::Volume>,
    /// Dangerous asks this profile makes, each allowed by name under `[operator]`.
    pub dangerous: Vec<Danger>,
}

impl Profile {
    /// The host directory a session's workspace comes from, where `cwd` is
    /// the host's working directory: `cwd` itself (`cwd`, `fork`), the
    /// profile's host path, or none (`empty`, `none`). Pure: the host reads
    /// its owner ([`crate::plan::HostFacts::workspace_owner`]).
    pub fn workspace_dir<'a>(&'a self, cwd: &'a std::path::Path) -> Option<&'a std::path::Path> {
        match &self.workspace.source {
            Source::Cwd | Source::Fork => Some(cwd),
            Source::Host(path) => Some(path),
            Source::Empty | Source::None => None,
        }
    }
}

/// How a `source = "fork"` workspace is forked for each session
/// (`[workspace] fork_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ForkMode {
    /// Worktree when the directory is a git repository with a commit, else copy.
    #[default]
    Auto,
    /// A repository of the session's own holding HEAD and the uncommitted
    /// work, borrowing the directory's git objects read-only.
    Worktree,
    /// A full copy, `.git` included.
    Copy,
}

impl ForkMode {
    /// The profile's word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            ForkMode::Auto => "auto",
            ForkMode::Worktree => "worktree",
            ForkMode::Copy => "copy",
        }
    }
}

/// What a credential found persisted in the workspace at session start does
/// to the session (`[workspace] on_persisted_credentials`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnPersisted {
    /// The session starts; the workspace unit's envelope lists each finding
    /// (file, line, key, kind; never the value) and the values are redacted.
    #[default]
    Report,
    /// The session does not start; `initialize` fails naming file and key.
    Refuse,
    /// The session starts; inside the workspace unit each file holding a
    /// finding is replaced (read-only) by a copy with the values masked; the
    /// host's file is untouched. Reported as `report` is, each finding marked
    /// hidden, and the values redacted.
    Hide,
}

impl OnPersisted {
    /// The profile's word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            OnPersisted::Report => "report",
            OnPersisted::Refuse => "refuse",
            OnPersisted::Hide => "hide",
        }
    }
}

/// Where the workspace comes from, before host facts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The host's working directory when the session starts.
    Cwd,
    /// A fixed absolute host path.
    Host(PathBuf),
    /// A fresh empty directory per session.
    Empty,
    /// The host's working directory, forked for each session (its own
    /// copy or worktree); `box/merge {unit: "workspace"}` merges it back.
    Fork,
    /// No file system: no workspace unit, no file tools, no shell, no processes.
    None,
}

/// Who a unit's processes run as, before host facts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UserChoice {
    /// Fixed ids.
    Ids(UserIds),
    /// The caller's uid:gid.
    Host,
    /// Whatever the image says.
    Image,
}

impl EnvPolicy {
    /// The secrets' names, in the order written.
    pub fn secret_names(&self) -> Vec<String> {
        self.secrets
            .iter()
            .map(|secret| secret.name.clone())
            .collect()
    }

    /// The secrets also given as variables to the processes the executor
    /// starts (`as_env = true`), in the order written.
    pub fn secrets_as_env(&self) -> Vec<String> {
        self.secrets
            .iter()
            .filter(|secret| secret.as_env)
            .map(|secret| secret.name.clone())
            .collect()
    }
}

/// A host variable handed through as a credential (`env.secrets`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Secret {
    /// The variable's name.
    pub name: String,
    /// Whether its value is also a variable of the processes the executor
    /// starts (`as_env = true`).
    pub as_env: bool,
}

/// The hardening as written: the plan's [`Security`](crate::plan::Security),
/// which every unit gets as the profile says (one struct, so a hardening
/// field is declared once).
pub use crate::plan::Security as SecurityPolicy;

/// A dangerous ask a profile may make only when `[operator] allow_dangerous` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Danger {
    /// A container engine's socket in the workspace (root on the host).
    DockerSocket,
    /// The host's root or a system directory as the workspace.
    HostRoot,
    /// A privileged unit.
    Privileged,
    /// Host namespaces shared.
    HostNamespaces,
    /// Capabilities beyond the reviewed list.
    Capabilities,
    /// Host devices.
    Devices,
    /// Egress to loopback, private, shared, benchmarking, documentation, reserved and
    /// unique-local addresses and the host's own (never link-local or metadata).
    PrivateDestinations,
}

impl Danger {
    /// Every danger, in order.
    pub const ALL: [Danger; 7] = [
        Danger::DockerSocket,
        Danger::HostRoot,
        Danger::Privileged,
        Danger::HostNamespaces,
        Danger::Capabilities,
        Danger::Devices,
        Danger::PrivateDestinations,
    ];

    /// Its name in `allow_dangerous`.
    pub fn name(self) -> &'static str {
        match self {
            Danger::DockerSocket => "docker-socket",
            Danger::HostRoot => "host-root",
            Danger::Privileged => "privileged",
            Danger::HostNamespaces => "host-namespaces",
            Danger::Capabilities => "capabilities",
            Danger::Devices => "devices",
            Danger::PrivateDestinations => "private-destinations",
        }
    }

    /// The danger called `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|danger| danger.name() == name)
    }
}

/// Every field's default: the strict ones.
pub(crate) mod defaults {
    use std::time::Duration;

    use super::LimitsPolicy;

    pub(crate) const IMAGE: &str = "box-base:bookworm";
    pub(crate) const ROOT: &str = "/workspace";

    /// A unit's lease when the profile names none.
    pub(crate) const LEASE: Duration = Duration::from_secs(30);
    /// The shortest lease: the host renews every third of it, so a shorter
    /// one would end units on a busy host's ordinary scheduling delays.
    pub(crate) const MIN_LEASE: Duration = Duration::from_secs(1);
    /// The longest lease: a unit must not outlive a dead host by hours.
    pub(crate) const MAX_LEASE: Duration = Duration::from_secs(3600);

    pub(crate) fn limits() -> LimitsPolicy {
        LimitsPolicy::defaults()
    }
}
