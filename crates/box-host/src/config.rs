//! What a host is asked to be: `box serve`'s plain configuration
//! ([`ServeConfig`], which the binary fills in from its flags) and the
//! settings every session of a host shares ([`HostConfig`]). Nothing here changes once a host runs; what does is
//! its [`crate::Services`].

use std::path::PathBuf;
use std::time::Duration;

use box_policy::plan::{HostFacts, Plan, PlanError};
use box_policy::profile::{Catalog, Profile};

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
    /// Pools of warm units to keep (`--pool PROFILE=N`).
    pub pools: Vec<PoolAsk>,
    /// Where traces are exported (OTLP/HTTP), when they are: the binary reads
    /// `--otlp-endpoint` and the standard `OTEL_*` variables.
    pub tracing: Option<box_otel::ExportConfig>,
}

/// How a plan is resolved: `plan::resolve`, or a test's own.
pub type ResolveFn = fn(&Profile, &serde_json::Value, &HostFacts) -> Result<Plan, PlanError>;

/// A host's settings: what its sessions share and never change (its live
/// services are [`crate::Services`]).
pub struct HostConfig {
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
    /// At shutdown, how long calls in flight get to finish before their units are removed.
    pub drain: Duration,
    /// The host's environment, read at each session's start: the values of
    /// the secrets its units are handed (as the backends read them) and of the
    /// credentials the scrubber keeps from units, all redacted from what the
    /// session receives. Tests give their own.
    pub environment: fn() -> Vec<(std::ffi::OsString, std::ffi::OsString)>,
    /// Where the host keeps its sockets (egress proxies), each in a directory of
    /// its own that the unit it serves gets mounted.
    pub runtime_dir: PathBuf,
    /// How `box/fork` runs git (worktree mode): a runner the binary confines.
    /// `None`: forks are copies.
    pub fork_git: Option<box_fork::Git>,
    /// Where forked workspaces live, per instance and session (see `fork`).
    pub fork_dir: PathBuf,
}

impl HostConfig {
    /// Settings with box's defaults around `catalog` and `facts`.
    pub fn new(catalog: Catalog, facts: HostFacts) -> Self {
        Self {
            catalog,
            default_profile: "default".to_owned(),
            facts,
            instance: format!("box-{}", std::process::id()),
            resolve: crate::resolve_plan,
            executor_init_timeout: Duration::from_secs(60),
            drain: Duration::from_secs(10),
            environment: || std::env::vars_os().collect(),
            runtime_dir: box_backend::default_runtime_dir(),
            fork_git: None,
            fork_dir: default_fork_dir(),
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
        _ => box_backend::default_runtime_dir().join("forks"),
    }
}

/// One pool asked for: `PROFILE=N`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolAsk {
    /// The profile whose workspace unit the pool keeps.
    pub profile: String,
    /// How many units it keeps ready.
    pub size: usize,
    /// Asked by the profile's own `[pool]` table, not by `--pool`.
    pub from_table: bool,
}

impl PoolAsk {
    /// Where the ask was written, as an error names it: `--pool NAME`, or
    /// `profile NAME's [pool]`.
    pub fn named(&self) -> String {
        if self.from_table {
            format!("profile {}'s [pool]", self.profile)
        } else {
            format!("--pool {}", self.profile)
        }
    }

    /// `PROFILE=N` (`--pool`); N = 0 keeps no pool for a profile whose
    /// `[pool]` asks for one.
    pub fn parse(text: &str) -> Result<Self, String> {
        let Some((profile, size)) = text.split_once('=') else {
            return Err(format!(
                "--pool {text}: write PROFILE=N, the profile and how many units to keep ready (default=4)"
            ));
        };
        let size: usize = size.parse().map_err(|_| {
            format!("--pool {text}: {size:?} is not a count; write PROFILE=N (default=4)")
        })?;
        if profile.is_empty() {
            return Err(format!(
                "--pool {text}: name a profile, and how many units to keep ready (default=4)"
            ));
        }
        Ok(Self {
            profile: profile.to_owned(),
            size,
            from_table: false,
        })
    }
}
