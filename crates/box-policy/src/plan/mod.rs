//! Plans: a profile narrowed by a session's tightenings and resolved into the
//! fully defaulted description of every unit of a session. Pure functions.
//!
//! A `Plan` is only built by [`resolve`]: the tightening is parsed
//! ([`Tightening::parse`]), applied narrow-only to the profile ([`tighten()`]),
//! and the result resolved against the host's facts. Nothing here reads a
//! clock, the environment, a file or a socket.

mod json;
pub(crate) mod tighten;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

pub use tighten::{Tightening, parse_tightening_text, tighten};

pub use crate::image::PullPolicy;
use crate::profile::{NetworkPolicy, Profile, Source, UserChoice};

/// Everything one session's units are: the resolved, validated, fully defaulted plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The profile it was resolved from.
    pub profile: String,
    /// The workspace unit (absent for a no-filesystem profile's session) and the server units.
    pub units: Vec<UnitSpec>,
    /// What a credential persisted in the workspace at session start does.
    pub on_persisted_credentials: crate::profile::OnPersisted,
    /// `source = "fork"`: the workspace unit's host directory is forked for
    /// the session this way, and the unit starts on the fork.
    pub workspace_fork: Option<crate::profile::ForkMode>,
}

/// A unit's role in its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Where the tools act on the workspace.
    Workspace,
    /// Runs one MCP server offered to the session.
    Server,
}

/// Declaration order is narrowing order: `None` is the narrowest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum NetworkMode {
    /// Only loopback.
    None,
    /// Only the allow list.
    Egress,
    /// The engine's bridge network.
    Bridge,
}

/// Declaration order is narrowing order: `ReadOnly` is the narrower.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum MountMode {
    /// Read-only.
    ReadOnly,
    /// Read-write.
    ReadWrite,
}

/// Whether programs may run from the unit's `/tmp` (`[security] tmp`).
/// Declaration order is narrowing order: `NoExec` is the narrower.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TmpMode {
    /// Mounted `noexec`: nothing written there runs (the strict choice).
    NoExec,
    /// Programs written there run (`nosuid`, `nodev` still): compilers and
    /// test harnesses build into `/tmp`, and the workspace is executable anyway.
    #[default]
    Exec,
}

impl TmpMode {
    /// Its name in profiles and JSON: `exec`, `noexec`.
    pub fn as_str(self) -> &'static str {
        match self {
            TmpMode::NoExec => "noexec",
            TmpMode::Exec => "exec",
        }
    }
}

/// How long a volume lives and who shares it (`[[volume]] scope`).
/// Declaration order is narrowing order: `Session` is the narrower.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum VolumeScope {
    /// The units of one session share it; it is removed when the session ends.
    #[default]
    Session,
    /// Every session of the profile on this host shares it, and it outlives
    /// them all (until removed): a channel between them.
    Profile,
}

impl VolumeScope {
    /// Its name in profiles and JSON: `session`, `profile`.
    pub fn as_str(self) -> &'static str {
        match self {
            VolumeScope::Session => "session",
            VolumeScope::Profile => "profile",
        }
    }
}

/// Where a volume appears in its unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumePath {
    /// Beneath the unit's home (`~/REL`, REL relative and clean): the tools'
    /// default places (`~/.cache/pip`, `~/.cargo/registry`).
    Home(PathBuf),
    /// An absolute path outside the home.
    Absolute(PathBuf),
}

impl std::fmt::Display for VolumePath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VolumePath::Home(relative) => write!(f, "~/{}", relative.display()),
            VolumePath::Absolute(path) => write!(f, "{}", path.display()),
        }
    }
}

// A volume: storage that outlives a unit (`[[volume]]`), declared with the
// profile's tables in `profile/fields.rs`.
pub use crate::profile::fields::Volume;

/// Whether a protection must be applied, may be skipped (and reported), or is off.
/// Declaration order is narrowing order: `Required` is the strictest.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Requirement {
    /// The unit does not start without it.
    Required,
    /// Applied where the machine can; the envelope says whether it was.
    BestEffort,
    /// Not applied.
    Off,
}

/// What the local backend, which runs a unit on the host's own userland and
/// can give it no image, does with a unit (`local_userland`). Declaration
/// order is narrowing order: `Refuse` is the narrower.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum LocalUserland {
    /// The local backend refuses the unit, naming its image.
    #[default]
    Refuse,
    /// The local backend runs the unit on the host's own userland (its
    /// programs, libraries and `/etc`) in place of its image.
    Host,
}

impl LocalUserland {
    /// Its name in profiles, tightenings and JSON: `refuse`, `host`.
    pub fn as_str(self) -> &'static str {
        match self {
            LocalUserland::Refuse => "refuse",
            LocalUserland::Host => "host",
        }
    }
}

/// Where a unit's workspace comes from on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkspaceSource {
    /// A host directory, bind-mounted (absolute, resolved).
    Host(PathBuf),
    /// A fresh empty directory for the session.
    Empty,
    /// No file system at all (no file tools, no shell, no processes).
    None,
}

/// The user a unit's processes run as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UserIds {
    /// Numeric user id.
    pub uid: u32,
    /// Numeric group id.
    pub gid: u32,
}

// A unit's limits, declared with the profile's in `profile/fields.rs`.
pub use crate::profile::fields::Limits;

/// The unit's network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Network {
    /// How much network.
    pub mode: NetworkMode,
    /// `host[:port]` entries for `Egress`.
    pub allow: Vec<String>,
    /// `Egress`: names pinned to addresses for the host's proxy.
    pub hosts: BTreeMap<String, std::net::IpAddr>,
    /// `Egress`: whether private destinations may be reached (the operator named
    /// `private-destinations`).
    pub private_destinations: bool,
    /// `Egress`: connections open at once through the proxy (0 otherwise).
    pub max_connections: u64,
    /// `Egress`: bytes per second through the proxy, each direction; `None`: no cap.
    pub bytes_per_second: Option<u64>,
    /// The unit's network as its profile's rows say it (`[network]` or a
    /// server's `network`, as the session narrowed it): the fields above are
    /// those the resolution completes; every other field of `[network]`
    /// reaches the unit here as written, and its plan under its key.
    pub written: NetworkPolicy,
}

/// An egress unit's connection limit when its profile sets none.
pub const DEFAULT_EGRESS_CONNECTIONS: u64 = 256;

impl Network {
    /// No network at all.
    pub fn none() -> Self {
        Self {
            mode: NetworkMode::None,
            allow: Vec::new(),
            hosts: BTreeMap::new(),
            private_destinations: false,
            max_connections: 0,
            bytes_per_second: None,
            written: NetworkPolicy::defaults(),
        }
    }
}

// The hardening a unit must get, declared with the profile's `[security]`
// in `profile/fields.rs`.
pub use crate::profile::fields::Security;

/// Everything one unit is: what a backend consumes.
#[derive(Debug, Clone, PartialEq)]
pub struct UnitSpec {
    /// The unit's name within its session (`workspace`, or the server's name).
    pub name: String,
    /// Workspace or server.
    pub role: Role,
    /// The image (docker) it runs: a tag, or pinned `NAME@sha256:...` (the
    /// backend verifies a pinned image is that content before the unit starts).
    pub image: String,
    /// When the image is pulled from its registry (docker).
    pub pull: PullPolicy,
    /// The host variable holding `user:password` for the image's registry:
    /// read by the backend when it pulls, given to the engine only.
    pub pull_secret: Option<String>,
    /// The engine's OCI runtime (`runsc` for gVisor); `None`: the engine's default.
    pub runtime: Option<String>,
    /// Whether the local backend may run the unit on the host's userland in
    /// place of `image` (else it refuses the unit).
    pub local_userland: LocalUserland,
    /// Where the workspace comes from on the host.
    pub source: WorkspaceSource,
    /// Where the workspace appears inside the unit.
    pub root: PathBuf,
    /// Read-only or read-write workspace.
    pub mode: MountMode,
    /// The user processes run as; `None` keeps the image's (or the caller's, on local).
    pub user: Option<UserIds>,
    /// The network.
    pub network: Network,
    /// The limits.
    pub limits: Limits,
    /// Variables set in the unit.
    pub env_set: BTreeMap<String, String>,
    /// Host variables handed through by name (never a credential).
    pub env_pass: Vec<String>,
    /// Host variables that are credentials, handed through because the profile
    /// names them: delivered as files under `/run/secrets`, never as the
    /// unit's environment.
    pub env_secrets: Vec<String>,
    /// The secrets (a subset of `env_secrets`) also given as variables to the
    /// processes the executor starts (`as_env = true`).
    pub env_secrets_as_env: Vec<String>,
    /// The hardening.
    pub security: Security,
    /// A server unit's MCP server command (started through the process methods).
    pub command: Vec<String>,
    /// One line about what the unit is for.
    pub description: String,
    /// How long the unit outlives its host's last lease renewal (the
    /// profile's `lifecycle.lease`): box's init in the unit ends it then.
    pub lease: Duration,
    /// The volumes mounted in the unit (the workspace unit's; none for servers).
    pub volumes: Vec<Volume>,
    /// The unit's table as its profile's rows say it (the workspace unit's
    /// `[workspace]` as the session narrowed it, a server unit's
    /// `[[server]]`; `None` for a unit made without a profile): the fields
    /// above are those the resolution completes or both kinds of unit have;
    /// every other field of the table reaches the unit here as written, and
    /// its plan under its key.
    pub written: Option<Written>,
}

/// A unit's table as its profile's rows say it ([`UnitSpec::written`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Written {
    /// The workspace unit's `[workspace]`.
    Workspace(crate::profile::Workspace),
    /// A server unit's `[[server]]`.
    Server(crate::profile::Server),
}

/// Facts about the host a plan is resolved against (passed in, so `resolve` stays pure).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFacts {
    /// What a `cwd` workspace source means: the host's working directory (absolute).
    pub cwd: PathBuf,
    /// The caller's ids, for `user = "host"`.
    pub caller: UserIds,
    /// The owner (uid and gid) of the host directory the workspace comes
    /// from (`cwd`, or the profile's host path), when known: a root caller's
    /// `user = "host"` unit runs as it, so files keep their owner and
    /// nothing runs as uid 0 by surprise. `None` (no host directory, or not
    /// read): the caller's ids.
    pub workspace_owner: Option<UserIds>,
}

/// Why a plan could not be made; every variant names what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// A tightening asked for more than the profile allows.
    #[error("tighten.{field}: asked for {asked}, but profile `{profile}` allows at most {bound}")]
    Widening {
        /// The profile.
        profile: String,
        /// The field path.
        field: String,
        /// What was asked.
        asked: String,
        /// The profile's bound.
        bound: String,
    },
    /// The tightening document itself is malformed (unknown field, wrong type, ...).
    #[error("tighten: {0}")]
    Invalid(String),
    /// A `cwd` workspace resolved to a dangerous host path the profile's
    /// operator did not allow (the same rules as a path written out).
    #[error(
        "workspace.source = \"cwd\" resolved to {path}, which {what}: refused as dangerous; start box in a project directory or an empty one instead (`box run`, `box serve` and `box profile resolve` also take --workspace DIR); to give sessions {path} anyway, write a profile of your own that extends this one and allows it (extends = \"{profile}\" and [operator] allow_dangerous = [\"{danger}\"] in ~/.config/box/profiles/NAME.toml, then --profile NAME)"
    )]
    DangerousWorkspace {
        /// The profile.
        profile: String,
        /// The resolved workspace.
        path: String,
        /// What makes it dangerous.
        what: String,
        /// The name of the operator switch.
        danger: String,
    },
}

impl NetworkMode {
    /// Its name in profiles, tightenings and JSON: `none`, `egress`, `bridge`.
    pub fn as_str(self) -> &'static str {
        match self {
            NetworkMode::None => "none",
            NetworkMode::Egress => "egress",
            NetworkMode::Bridge => "bridge",
        }
    }
}

impl MountMode {
    /// Its name in profiles, tightenings and JSON: `ro`, `rw`.
    pub fn as_str(self) -> &'static str {
        match self {
            MountMode::ReadOnly => "ro",
            MountMode::ReadWrite => "rw",
        }
    }
}

impl Requirement {
    /// Its name in profiles and JSON: `required`, `best-effort`, `off`.
    pub fn as_str(self) -> &'static str {
        match self {
            Requirement::Required => "required",
            Requirement::BestEffort => "best-effort",
            Requirement::Off => "off",
        }
    }
}

impl HostFacts {
    /// Fixed facts for tests and golden output: `/home/user/project`, 1000:1000.
    pub fn fixed() -> Self {
        Self {
            cwd: PathBuf::from("/home/user/project"),
            caller: UserIds {
                uid: 1000,
                gid: 1000,
            },
            workspace_owner: None,
        }
    }

    /// The user a `user = "host"` unit runs as: the caller, except that a
    /// root caller's unit runs as the owner of its workspace when that owner
    /// is not root (a CI job's container running box as root over a
    /// checkout it does not own). uid 0 only when the caller is root and the
    /// workspace is root's (or there is none).
    pub fn host_user(&self) -> UserIds {
        match self.workspace_owner {
            Some(owner) if self.caller.uid == 0 && owner.uid != 0 => owner,
            _ => self.caller,
        }
    }
}

impl Plan {
    /// The workspace unit, absent for a no-filesystem profile (no file tools,
    /// no shell, no process start: only server units).
    pub fn workspace(&self) -> Option<&UnitSpec> {
        self.units.iter().find(|unit| unit.role == Role::Workspace)
    }

    /// The server units, in the profile's order.
    pub fn servers(&self) -> impl Iterator<Item = &UnitSpec> {
        self.units.iter().filter(|unit| unit.role == Role::Server)
    }

    /// The unit called `name`.
    pub fn unit(&self, name: &str) -> Option<&UnitSpec> {
        self.units.iter().find(|unit| unit.name == name)
    }

    /// Whether no unit of `self` is wider than its namesake in `bound` in any
    /// field (and every unit of `self` has one). `resolve` guarantees this for
    /// a tightened plan against the untightened plan of the same profile.
    pub fn is_within(&self, bound: &Plan) -> bool {
        self.profile == bound.profile
            && self.units.iter().all(|unit| {
                bound
                    .unit(&unit.name)
                    .is_some_and(|outer| unit.is_within(outer))
            })
    }
}

impl Security {
    /// The default hardening, strict but for `/tmp`: nothing added back,
    /// read-only root, landlock required, git neutralised, writes guarded,
    /// nothing of the host shared; `/tmp` executable (`nosuid`, `nodev`), the
    /// default, since `noexec` there protects nothing while the workspace is
    /// executable. Each field's default is its row's in `profile/fields.rs`.
    pub fn strict() -> Self {
        Self::defaults()
    }
}

impl UnitSpec {
    /// How this unit's executor is started, rooted at `root` (where the
    /// backend put the workspace) in a place of `kind`: the plan's landlock
    /// requirement travels with it (so `required` fails closed inside too),
    /// the names the plan hands through and sets (and the secrets given as
    /// variables, which the profile named explicitly) are exempt from the executor's own
    /// scrubbing, the secrets are named (their values travel apart, in the
    /// environment of the process that starts the executor), and the write
    /// guard follows the profile.
    pub fn executor_spec(
        &self,
        root: impl Into<PathBuf>,
        kind: crate::executor::PlaceKind,
    ) -> crate::executor::ExecutorSpec {
        use crate::executor::{ExecutorSpec, WriteGuard};
        ExecutorSpec {
            kind,
            landlock: self.security.landlock,
            // What the profile sets is the operator's word, like what it
            // passes: the executor keeps those names in its children's
            // environment even where the scrubber would remove them from an
            // inherited one (`SSL_CERT_FILE`, `GIT_SSL_CAINFO`), as the
            // envelope's `envPassed` says. Hijackers (`LD_PRELOAD`) go anyway.
            pass_env: self
                .env_pass
                .iter()
                .chain(&self.env_secrets_as_env)
                .chain(self.env_set.keys())
                .cloned()
                .collect(),
            secrets: self
                .env_secrets
                .iter()
                .map(|name| crate::executor::SecretFile {
                    name: name.clone(),
                    as_env: self.env_secrets_as_env.contains(name),
                })
                .collect(),
            write_guard: if self.security.write_guard {
                WriteGuard::ReadFirst
            } else {
                WriteGuard::Off
            },
            ..ExecutorSpec::new(root)
        }
    }

    /// A workspace unit of `image` over `source` with the shipped `default`
    /// profile's values: root `/workspace` read-write, the image's user, no
    /// network, its limits, strict hardening (landlock required). The base a
    /// test, benchmark or tool adjusts with struct update syntax, so a field
    /// added to the plan is written out in one place.
    pub fn workspace(image: &str, source: WorkspaceSource) -> Self {
        Self {
            name: "workspace".to_owned(),
            role: Role::Workspace,
            image: image.to_owned(),
            pull: PullPolicy::Missing,
            pull_secret: None,
            runtime: None,
            local_userland: LocalUserland::Host,
            source,
            root: PathBuf::from("/workspace"),
            mode: MountMode::ReadWrite,
            user: None,
            network: Network::none(),
            limits: crate::profile::LimitsPolicy::defaults().plan(),
            env_set: BTreeMap::new(),
            env_pass: Vec::new(),
            env_secrets: Vec::new(),
            env_secrets_as_env: Vec::new(),
            security: Security::strict(),
            command: Vec::new(),
            description: String::new(),
            lease: Duration::from_secs(30),
            volumes: Vec::new(),
            written: None,
        }
    }

    /// Whether `self` is nowhere wider than `bound`.
    pub fn is_within(&self, bound: &UnitSpec) -> bool {
        let subset =
            |inner: &[String], outer: &[String]| inner.iter().all(|item| outer.contains(item));
        self.role == bound.role
            && self.image == bound.image
            && self.local_userland <= bound.local_userland
            && self.source == bound.source
            && self.root == bound.root
            && self.mode <= bound.mode
            && self.user == bound.user
            && self.network.is_within(&bound.network)
            && self.limits.is_within(&bound.limits)
            && self
                .env_set
                .iter()
                .all(|(name, value)| bound.env_set.get(name) == Some(value))
            && subset(&self.env_pass, &bound.env_pass)
            && subset(&self.env_secrets, &bound.env_secrets)
            && subset(&self.env_secrets_as_env, &bound.env_secrets_as_env)
            && self.security == bound.security
            && self.command == bound.command
            && self.lease == bound.lease
            && self
                .volumes
                .iter()
                .all(|volume| bound.volumes.contains(volume))
    }
}

impl Network {
    /// Whether `self` reaches nothing `bound` does not.
    pub fn is_within(&self, bound: &Network) -> bool {
        match (self.mode, bound.mode) {
            (NetworkMode::None, _) => true,
            (NetworkMode::Egress, NetworkMode::Bridge) => true,
            // An entry that does not parse is within nothing, and bounds nothing.
            (NetworkMode::Egress, NetworkMode::Egress) => {
                let bounds = crate::allow::AllowList::new(
                    bound
                        .allow
                        .iter()
                        .filter_map(|outer| crate::allow::Rule::parse(outer).ok()),
                );
                self.allow.iter().all(|entry| {
                    crate::allow::Rule::parse(entry).is_ok_and(|entry| entry.is_within(&bounds))
                })
            }
            (NetworkMode::Bridge, NetworkMode::Bridge) => true,
            (NetworkMode::Egress | NetworkMode::Bridge, NetworkMode::None)
            | (NetworkMode::Bridge, NetworkMode::Egress) => false,
        }
    }
}

/// Resolve `profile` narrowed by `tighten` (the JSON a session sends under
/// `box.tighten`; `null` for none) into a plan.
///
/// Pure: the host's facts come in as `host`. A tightening that would widen
/// anything is refused with the field, the value asked and the profile's
/// bound; nothing is clamped.
pub fn resolve(
    profile: &Profile,
    tighten: &serde_json::Value,
    host: &HostFacts,
) -> Result<Plan, PlanError> {
    let tightening = Tightening::parse(tighten)?;
    let narrowed = tighten::tighten(profile, &tightening)?;
    plan_of(&narrowed, host)
}

/// The plan of an already narrowed profile.
fn plan_of(profile: &Profile, host: &HostFacts) -> Result<Plan, PlanError> {
    let security = profile.security.clone();
    let user = match profile.workspace.user {
        UserChoice::Ids(ids) => Some(ids),
        UserChoice::Host => Some(host.host_user()),
        UserChoice::Image => None,
    };
    let root = profile.workspace.root.clone();
    let mut units = Vec::new();
    let source = match &profile.workspace.source {
        Source::Cwd | Source::Fork => {
            judge_cwd(profile, &host.cwd)?;
            Some(WorkspaceSource::Host(host.cwd.clone()))
        }
        Source::Host(path) => Some(WorkspaceSource::Host(path.clone())),
        Source::Empty => Some(WorkspaceSource::Empty),
        Source::None => None,
    };
    if let Some(source) = source {
        units.push(UnitSpec {
            name: "workspace".to_owned(),
            role: Role::Workspace,
            image: profile.workspace.image.clone(),
            pull: profile.workspace.pull,
            pull_secret: profile.workspace.pull_secret.clone(),
            runtime: profile.workspace.runtime.clone(),
            local_userland: profile.workspace.local_userland,
            source,
            root: root.clone(),
            mode: profile.workspace.mode,
            user,
            network: network_of(&profile.network, &profile.dangerous),
            limits: profile.limits.plan(),
            env_set: profile.env.set.clone(),
            env_pass: profile.env.pass.clone(),
            env_secrets: profile.env.secret_names(),
            env_secrets_as_env: profile.env.secrets_as_env(),
            security: security.clone(),
            command: Vec::new(),
            description: profile.description.clone(),
            lease: profile.lifecycle.lease,
            volumes: profile.volumes.clone(),
            written: Some(Written::Workspace(profile.workspace.clone())),
        });
    }
    for server in &profile.servers {
        units.push(UnitSpec {
            name: server.name.clone(),
            role: Role::Server,
            image: server.image.clone(),
            pull: server.pull,
            pull_secret: server.pull_secret.clone(),
            runtime: server.runtime.clone(),
            local_userland: server.local_userland,
            source: WorkspaceSource::None,
            root: root.clone(),
            mode: MountMode::ReadOnly,
            user,
            network: network_of(&server.network, &profile.dangerous),
            limits: server.limits.plan(),
            env_set: BTreeMap::new(),
            env_pass: Vec::new(),
            env_secrets: Vec::new(),
            env_secrets_as_env: Vec::new(),
            security: security.clone(),
            command: server.command.clone(),
            description: server.description.clone(),
            lease: profile.lifecycle.lease,
            volumes: Vec::new(),
            written: Some(Written::Server(server.clone())),
        });
    }
    Ok(Plan {
        profile: profile.name.clone(),
        units,
        on_persisted_credentials: profile.workspace.on_persisted_credentials,
        workspace_fork: (profile.workspace.source == Source::Fork)
            .then_some(profile.workspace.fork_mode),
    })
}

/// Refuse a `cwd` that resolved to a dangerous host path, by the rules a
/// path written in the profile meets at load, unless the operator allowed it.
/// The host canonicalises `cwd`; `.` and `..` are also folded here, so a
/// caller that did not cannot walk past the rules.
fn judge_cwd(profile: &Profile, cwd: &std::path::Path) -> Result<(), PlanError> {
    use std::path::Component;
    let mut folded = PathBuf::from("/");
    for component in cwd.components() {
        match component {
            Component::Normal(name) => folded.push(name),
            Component::ParentDir => {
                folded.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    for (danger, what) in crate::profile::host_path_dangers(&folded) {
        if !profile.dangerous.contains(&danger) {
            return Err(PlanError::DangerousWorkspace {
                profile: profile.name.clone(),
                path: folded.display().to_string(),
                what: what.to_owned(),
                danger: danger.name().to_owned(),
            });
        }
    }
    Ok(())
}

fn network_of(network: &NetworkPolicy, dangerous: &[crate::profile::Danger]) -> Network {
    let egress = network.mode == NetworkMode::Egress;
    Network {
        mode: network.mode,
        allow: network.allow.iter().map(ToString::to_string).collect(),
        hosts: network.hosts.clone(),
        private_destinations: egress
            && dangerous.contains(&crate::profile::Danger::PrivateDestinations),
        max_connections: if egress {
            network
                .max_connections
                .unwrap_or(DEFAULT_EGRESS_CONNECTIONS)
        } else {
            0
        },
        bytes_per_second: network.bandwidth.filter(|_| egress).map(|size| size.0),
        written: network.clone(),
    }
}

#[cfg(test)]
mod tests;
