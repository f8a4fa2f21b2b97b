//! Dangerous asks: what makes a profile dangerous (an engine socket or a
//! system directory as the workspace, privileged, host namespaces,
//! capabilities beyond the reviewed list, devices), and the operator switch
//! that must name each one. A danger asked but not allowed, and an allowance
//! not used, are both problems.
//!
//! A `cwd` source is judged by the same rules ([`host_path_dangers`]) where
//! it resolves, in `plan::resolve`; so with a `cwd` source the workspace
//! allowances (`host-root`, `docker-socket`) are never unused.

use std::path::Path;

use super::super::error::{Position, Problem};
use super::super::fields::OperatorPolicy;
use super::super::kinds::{After, Kind, Reads};
use super::super::model::{Danger, NetworkPolicy, Server, Source, Workspace};
use super::super::tree::Node;
use super::{Walk, one_of};
use crate::plan::NetworkMode;

/// Paths that are the host's root or a system directory, refused as a workspace
/// (with everything beneath the ones marked `true`).
const SYSTEM_PATHS: &[(&str, bool)] = &[
    ("/", false),
    ("/bin", false),
    ("/boot", true),
    ("/dev", true),
    ("/etc", true),
    ("/home", false),
    ("/lib", false),
    ("/lib64", false),
    ("/proc", true),
    ("/run", true),
    ("/sbin", false),
    ("/sys", true),
    ("/usr", false),
    ("/var", false),
    ("/var/run", true),
    ("/var/lib/docker", true),
    ("/var/lib/containerd", true),
];

/// Container engine sockets: a workspace that is one, or holds one, is root on the host.
const ENGINE_SOCKETS: &[&str] = &[
    "/var/run/docker.sock",
    "/run/docker.sock",
    "/run/containerd/containerd.sock",
    "/run/podman/podman.sock",
    "/var/run/crio/crio.sock",
];

/// The dangers of `path` (absolute, canonical) as a host workspace, each with
/// what makes it one, phrased to follow the path ("/etc is ...").
pub(crate) fn host_path_dangers(path: &Path) -> Vec<(Danger, &'static str)> {
    let is_socket = path
        .file_name()
        .is_some_and(|name| name.to_string_lossy().ends_with(".sock"))
        || ENGINE_SOCKETS
            .iter()
            .any(|socket| Path::new(socket).starts_with(path) && path != Path::new("/"));
    if is_socket {
        // A socket path is also under a system directory; one error says it better.
        return vec![(
            Danger::DockerSocket,
            "is or holds a container engine's socket (root on the host)",
        )];
    }
    let is_system = SYSTEM_PATHS.iter().any(|(system, beneath)| {
        path == Path::new(system) || (*beneath && path.starts_with(system))
    });
    if is_system {
        return vec![(Danger::HostRoot, "is the host's root or a system directory")];
    }
    // `/home/NAME` and root's `/root` themselves: every key, token and shell
    // history of that user (what is beneath them is a user's project).
    let is_home = path.parent() == Some(Path::new("/home")) || path == Path::new("/root");
    if is_home {
        return vec![(
            Danger::HostRoot,
            "is a home directory (its keys, credentials and shell history with it)",
        )];
    }
    Vec::new()
}

/// Dangers an allowance may cover however the profile reads: those of a
/// `cwd` source, which are judged where it resolves.
pub(crate) const CWD_DANGERS: [Danger; 2] = [Danger::DockerSocket, Danger::HostRoot];

/// A danger `[operator] allow_dangerous` allows, with where it was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Allowance {
    pub(crate) danger: Danger,
    pub(crate) at: Position,
}

/// `allow_dangerous`: names of dangers box knows.
impl Kind for Vec<Allowance> {
    const LIST: bool = true;

    fn read(walk: &mut Walk, node: &Node, field: &str) -> Option<Self> {
        let names: Vec<&str> = Danger::ALL.iter().map(|danger| danger.name()).collect();
        let entries = walk.strings(node, field, |text| match Danger::from_name(text) {
            Some(danger) => Ok(danger.name().to_owned()),
            None => Err(format!(
                "{text:?} is not a danger box knows; write {}",
                one_of(&names)
            )),
        })?;
        Some(
            entries
                .into_iter()
                .filter_map(|(name, item)| {
                    Danger::from_name(&name).map(|danger| Allowance {
                        danger,
                        at: item.at.clone(),
                    })
                })
                .collect(),
        )
    }

    fn word(&self) -> serde_json::Value {
        serde_json::json!(
            self.iter()
                .map(|allowance| allowance.danger.name())
                .collect::<Vec<_>>()
        )
    }

    fn text(&self) -> String {
        let names: Vec<&str> = self
            .iter()
            .map(|allowance| allowance.danger.name())
            .collect();
        names.join(", ")
    }
}

/// A danger found, with where it was asked.
pub(super) struct Asked {
    pub(super) danger: Danger,
    pub(super) at: Position,
    pub(super) field: String,
    pub(super) what: String,
}

impl Walk {
    /// Record the dangers of binding host `path`.
    pub(super) fn judge_host_path(&mut self, node: &Node, field: &str, path: &Path) {
        for (danger, what) in host_path_dangers(path) {
            self.dangers.push(Asked {
                danger,
                at: node.at.clone(),
                field: field.to_owned(),
                what: format!("{} {what}", path.display()),
            });
        }
    }

    /// Judge what was asked against what the operator allowed; `may_ask`
    /// are dangers only known once host facts are (a `cwd` source's), whose
    /// allowances count as used.
    pub(super) fn judge_dangers(
        &mut self,
        allowed: Vec<Allowance>,
        may_ask: &[Danger],
    ) -> Vec<Danger> {
        let asked = std::mem::take(&mut self.dangers);
        for ask in &asked {
            if !allowed
                .iter()
                .any(|allowance| allowance.danger == ask.danger)
            {
                self.problems.push(Problem::new(
                    ask.at.clone(),
                    &ask.field,
                    &format!(
                        "refused as dangerous: {}; an operator who means it writes [operator] allow_dangerous = [\"{}\"]",
                        ask.what,
                        ask.danger.name()
                    ),
                ));
            }
        }
        let mut used = Vec::new();
        for Allowance { danger, at } in allowed {
            if asked.iter().any(|ask| ask.danger == danger) || may_ask.contains(&danger) {
                used.push(danger);
            } else {
                self.problems.push(Problem::new(
                    at,
                    "operator.allow_dangerous",
                    &format!(
                        "allows \"{}\" but the profile does not ask for it; remove it",
                        danger.name()
                    ),
                ));
            }
        }
        used.sort();
        used
    }
}

/// `[operator]`, after the tables whose dangerous asks it allows: what they
/// asked, each allowed by name (an ask not allowed, and an allowance not
/// used, is a problem).
pub(in crate::profile) struct Operator;

impl Reads<Vec<Danger>> for Operator {}

/// What `[operator]` is judged after: the workspace, its network, the servers.
type Asking<'a> = (
    &'a Option<Workspace>,
    &'a Option<NetworkPolicy>,
    &'a Option<Vec<Server>>,
);

impl After<Vec<Danger>, Asking<'_>> for Operator {
    fn read_after(
        walk: &mut Walk,
        node: Option<&Node>,
        field: &str,
        (workspace, network, servers): Asking<'_>,
    ) -> Option<Vec<Danger>> {
        let allowed = OperatorPolicy::read(walk, node, field)
            .map(|operator| operator.allow_dangerous)
            .unwrap_or_default();
        let mut may_ask: Vec<Danger> = match workspace.as_ref().map(|workspace| &workspace.source) {
            Some(Source::Cwd | Source::Fork) => CWD_DANGERS.to_vec(),
            Some(Source::Host(_) | Source::Empty | Source::None) | None => Vec::new(),
        };
        // Private destinations are a property of what the egress proxy may reach, so any
        // egress unit may ask for them.
        let any_egress = network
            .iter()
            .chain(servers.iter().flatten().map(|server| &server.network))
            .any(|network| network.mode == NetworkMode::Egress);
        if any_egress {
            may_ask.push(Danger::PrivateDestinations);
        }
        Some(walk.judge_dangers(allowed, &may_ask))
    }
}

/// The dangers a profile asks (alone: judged as if no table may ask one).
impl Kind for Vec<Danger> {
    const LIST: bool = true;

    fn read(walk: &mut Walk, node: &Node, field: &str) -> Option<Self> {
        let allowed = OperatorPolicy::read(walk, Some(node), field)?.allow_dangerous;
        Some(walk.judge_dangers(allowed, &[]))
    }

    fn text(&self) -> String {
        let names: Vec<&str> = self.iter().map(|danger| danger.name()).collect();
        names.join(", ")
    }

    fn word(&self) -> serde_json::Value {
        serde_json::json!(self.iter().map(|danger| danger.name()).collect::<Vec<_>>())
    }
}
