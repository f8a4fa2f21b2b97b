//! Plans: a profile narrowed by a session's tightenings and resolved into the
//! fully defaulted description of every unit of a session. Pure functions.
//!
//! First cut of the types the backends and the host consume; the profiles work
//! owns this module and extends it (keeping these fields' meaning).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// Everything one session's units are: the resolved, validated, fully defaulted plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The profile it was resolved from.
    pub profile: String,
    /// The workspace unit (absent for a no-filesystem profile's session) and the server units.
    pub units: Vec<UnitSpec>,
}

/// A unit's role in its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
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

/// Whether a protection must be applied, may be skipped (and reported), or is off.
/// Declaration order is narrowing order: `Required` is the strictest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Requirement {
    /// The unit does not start without it.
    Required,
    /// Applied where the machine can; the envelope says whether it was.
    BestEffort,
    /// Not applied.
    Off,
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

/// Resource limits, in plain numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Memory in bytes (swap off).
    pub memory_bytes: u64,
    /// CPUs, as a fraction of cores.
    pub cpus: f64,
    /// Most processes/threads.
    pub pids: u64,
    /// Size of the tmpfs at /tmp, in bytes.
    pub tmp_bytes: u64,
    /// Most open files per process.
    pub nofile: u64,
    /// Deadline of one call.
    pub call_timeout: Duration,
    /// No request for this long ends the session.
    pub idle: Duration,
    /// The session ends after this long whatever happens.
    pub lifetime: Duration,
}

/// The unit's network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Network {
    /// How much network.
    pub mode: NetworkMode,
    /// `host[:port]` entries for `Egress`.
    pub allow: Vec<String>,
}

/// The hardening a unit must get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Security {
    /// Capabilities added back after dropping all (a short reviewed list).
    pub capabilities: Vec<String>,
    /// Read-only root file system.
    pub read_only_root: bool,
    /// Landlock for the executor and its children.
    pub landlock: Requirement,
    /// Whether git configuration is neutralised for children.
    pub neutralise_git: bool,
    /// Whether overwriting an existing file needs an earlier read of it.
    pub write_guard: bool,
}

/// Everything one unit is: what a backend consumes.
#[derive(Debug, Clone, PartialEq)]
pub struct UnitSpec {
    /// The unit's name within its session (`workspace`, or the server's name).
    pub name: String,
    /// Workspace or server.
    pub role: Role,
    /// The image (docker) it runs.
    pub image: String,
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
    /// Host variables handed through by name.
    pub env_pass: Vec<String>,
    /// The hardening.
    pub security: Security,
    /// A server unit's MCP server command (started through the process methods).
    pub command: Vec<String>,
    /// One line about what the unit is for.
    pub description: String,
}

/// Facts about the host a plan is resolved against (passed in, so `resolve` stays pure).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFacts {
    /// What a `cwd` workspace source means: the host's working directory (absolute).
    pub cwd: PathBuf,
    /// The caller's ids, for `user = "host"`.
    pub caller: UserIds,
}

/// Why a plan could not be made; every variant names what to change.
#[derive(Debug, thiserror::Error)]
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
}

/// Resolve `profile` narrowed by `tighten` (the JSON a session sends under
/// `box.tighten`; `null` for none) into a plan.
///
/// Interface stub: the profiles work replaces this with the real resolution.
pub fn resolve(
    profile: &crate::profile::Profile,
    tighten: &serde_json::Value,
    host: &HostFacts,
) -> Result<Plan, PlanError> {
    if !tighten.is_null() {
        return Err(PlanError::Invalid(
            "tightenings are not built yet".to_owned(),
        ));
    }
    Ok(Plan {
        profile: profile.name.clone(),
        units: vec![UnitSpec {
            name: "workspace".to_owned(),
            role: Role::Workspace,
            image: "box-base:bookworm".to_owned(),
            source: WorkspaceSource::Host(host.cwd.clone()),
            root: PathBuf::from("/workspace"),
            mode: MountMode::ReadWrite,
            user: Some(host.caller),
            network: Network {
                mode: NetworkMode::None,
                allow: Vec::new(),
            },
            limits: Limits {
                memory_bytes: 2 << 30,
                cpus: 2.0,
                pids: 512,
                tmp_bytes: 256 << 20,
                nofile: 4096,
                call_timeout: Duration::from_secs(600),
                idle: Duration::from_secs(1800),
                lifetime: Duration::from_secs(8 * 3600),
            },
            env_set: BTreeMap::new(),
            env_pass: Vec::new(),
            security: Security {
                capabilities: Vec::new(),
                read_only_root: true,
                landlock: Requirement::BestEffort,
                neutralise_git: true,
                write_guard: true,
            },
            command: Vec::new(),
            description: String::new(),
        }],
    })
}
