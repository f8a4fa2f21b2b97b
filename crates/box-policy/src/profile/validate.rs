//! From a merged, located tree to a [`Profile`]: unknown fields, wrong types
//! and impossible values are problems naming the file, line, column and field,
//! what was given and what would be accepted. Every problem is collected, so
//! `box profile check` can print them all. Dangerous asks are refused here
//! unless `[operator] allow_dangerous` names them.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use super::error::Problem;
use super::model::{
    Danger, EnvPolicy, ForkMode, LifecyclePolicy, LimitsPolicy, NetworkPolicy, OnPersisted,
    Profile, SecurityPolicy, Server, Source, UserChoice, Workspace, defaults,
};
use super::tree::{Node, Value};
use super::value::{
    ByteSize, CpuQuota, KNOWN_CAPABILITIES, NAMESPACES, REVIEWED_CAPABILITIES, check_env_name,
    looks_like_credential, parse_count, parse_duration,
};
use crate::allow::{HostName, Rule};
use crate::image::{ImageRef, PullPolicy};
use crate::plan::{
    LocalUserland, MountMode, NetworkMode, Requirement, TmpMode, UserIds, Volume, VolumePath,
    VolumeScope,
};
use danger::Asked;
pub(crate) use danger::host_path_dangers;

mod danger;

pub(crate) const TOP: &[&str] = &[
    "description",
    "extends",
    "workspace",
    "network",
    "limits",
    "env",
    "security",
    "lifecycle",
    "server",
    "volume",
    "operator",
];
pub(crate) const WORKSPACE: &[&str] = &[
    "image",
    "images",
    "pull",
    "pull_secret",
    "root",
    "source",
    "mode",
    "user",
    "runtime",
    "local_userland",
    "on_persisted_credentials",
    "fork_mode",
];
pub(crate) const NETWORK: &[&str] = &["mode", "allow", "hosts", "max_connections", "bandwidth"];
pub(crate) const LIMITS: &[&str] = &[
    "memory",
    "cpus",
    "pids",
    "tmp",
    "home",
    "nofile",
    "call_timeout",
    "idle",
    "lifetime",
    "start_timeout",
];
pub(crate) const SERVER_LIMITS: &[&str] = &[
    "memory",
    "cpus",
    "pids",
    "tmp",
    "home",
    "nofile",
    "call_timeout",
];
pub(crate) const ENV: &[&str] = &["set", "pass", "secrets"];
/// The fields of a table entry of `env.secrets`.
pub(crate) const SECRET: &[&str] = &["name", "as_env"];
pub(crate) const SECURITY: &[&str] = &[
    "capabilities",
    "read_only_root",
    "landlock",
    "git",
    "write_guard",
    "tmp",
    "privileged",
    "host_namespaces",
    "devices",
];
pub(crate) const SERVER: &[&str] = &[
    "name",
    "image",
    "pull",
    "pull_secret",
    "runtime",
    "local_userland",
    "command",
    "description",
    "network",
    "limits",
];
pub(crate) const OPERATOR: &[&str] = &["allow_dangerous"];
pub(crate) const VOLUME: &[&str] = &["name", "path", "scope"];
pub(crate) const LIFECYCLE: &[&str] = &["lease"];

/// Validate the merged tree of profile `name` (loaded from `origin`, extending `extends`).
pub(crate) fn validate(
    name: &str,
    origin: &str,
    extends: Vec<String>,
    root: &Node,
) -> Result<Profile, Vec<Problem>> {
    let mut walk = Walk::default();
    let top = walk.table(root, "", TOP);
    let description = top
        .get("description")
        .and_then(|node| walk.string(node, "description"))
        .unwrap_or_default();
    if let Some(node) = top.get("extends") {
        walk.string(node, "extends");
    }
    let workspace = walk.workspace(top.get("workspace"));
    let network = walk.network(top.get("network"), "network");
    let limits = walk.limits(top.get("limits"), "limits", LIMITS, &defaults::limits());
    let env = walk.env(top.get("env"));
    let security = walk.security(top.get("security"));
    let lifecycle = walk.lifecycle(top.get("lifecycle"));
    let servers = walk.servers(top.get("server"), &limits);
    let volumes = walk.volumes(top.get("volume"), workspace.as_ref());
    let allowed = walk.allowed_dangers(top.get("operator"));
    let mut may_ask: Vec<Danger> = match workspace.as_ref().map(|workspace| &workspace.source) {
        Some(Source::Cwd | Source::Fork) => danger::CWD_DANGERS.to_vec(),
        Some(Source::Host(_) | Source::Empty | Source::None) | None => Vec::new(),
    };
    // Private destinations are a property of what the egress proxy may reach, so any
    // egress unit may ask for them.
    let any_egress = network
        .iter()
        .chain(servers.iter().map(|server| &server.network))
        .any(|network| network.mode == NetworkMode::Egress);
    if any_egress {
        may_ask.push(Danger::PrivateDestinations);
    }
    let dangerous = walk.judge_dangers(allowed, &may_ask);
    let (
        Some(workspace),
        Some(network),
        Some(limits),
        Some(env),
        Some(security),
        Some(lifecycle),
        true,
    ) = (
        workspace,
        network,
        limits,
        env,
        security,
        lifecycle,
        walk.problems.is_empty(),
    )
    else {
        let mut problems = walk.problems;
        problems.sort_by(|a, b| {
            (a.at.file.as_ref(), a.at.line, a.at.column).cmp(&(
                b.at.file.as_ref(),
                b.at.line,
                b.at.column,
            ))
        });
        return Err(problems);
    };
    Ok(Profile {
        name: name.to_owned(),
        description,
        origin: origin.to_owned(),
        extends,
        workspace,
        network,
        limits,
        env,
        security,
        lifecycle,
        servers,
        volumes,
        dangerous,
    })
}

/// The entries of a table node, by name (unknown ones already reported).
struct Fields<'a> {
    entries: BTreeMap<&'a str, &'a Node>,
}

impl<'a> Fields<'a> {
    fn get(&self, name: &str) -> Option<&'a Node> {
        self.entries.get(name).copied()
    }
}

#[derive(Default)]
struct Walk {
    problems: Vec<Problem>,
    dangers: Vec<Asked>,
}

fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_owned()
    } else {
        format!("{parent}.{name}")
    }
}

fn one_of(choices: &[&str]) -> String {
    let quoted: Vec<String> = choices
        .iter()
        .map(|choice| format!("\"{choice}\""))
        .collect();
    match quoted.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

impl Walk {
    fn problem(&mut self, node: &Node, field: &str, message: String) {
        self.problems
            .push(Problem::new(node.at.clone(), field, &message));
    }

    fn wrong_type(&mut self, node: &Node, field: &str, expected: &str) {
        self.problem(
            node,
            field,
            format!(
                "expected {expected}, got {} ({})",
                node.value.shown(),
                node.value.kind()
            ),
        );
    }

    /// A table's entries; reports a non-table and every unknown key.
    fn table<'a>(&mut self, node: &'a Node, field: &str, accepted: &[&str]) -> Fields<'a> {
        let mut entries = BTreeMap::new();
        let Value::Table(items) = &node.value else {
            self.wrong_type(node, field, "a table");
            return Fields { entries };
        };
        for (key, value) in items {
            if accepted.contains(&key.name.as_str()) {
                entries.insert(key.name.as_str(), value);
            } else {
                self.problems.push(Problem::new(
                    key.at.clone(),
                    &join(field, &key.name),
                    &format!("unknown field; accepted here: {}", accepted.join(", ")),
                ));
            }
        }
        Fields { entries }
    }

    fn string(&mut self, node: &Node, field: &str) -> Option<String> {
        match &node.value {
            Value::String(text) => Some(text.clone()),
            _ => {
                self.wrong_type(node, field, "a string");
                None
            }
        }
    }

    fn boolean(&mut self, node: &Node, field: &str) -> Option<bool> {
        match node.value {
            Value::Boolean(flag) => Some(flag),
            _ => {
                self.wrong_type(node, field, "true or false");
                None
            }
        }
    }

    fn choice<T: Copy>(&mut self, node: &Node, field: &str, choices: &[(&str, T)]) -> Option<T> {
        let names: Vec<&str> = choices.iter().map(|(name, _)| *name).collect();
        let Value::String(text) = &node.value else {
            self.wrong_type(node, field, &one_of(&names));
            return None;
        };
        match choices.iter().find(|(name, _)| name == text) {
            Some((_, value)) => Some(*value),
            None => {
                self.problem(
                    node,
                    field,
                    format!("{text:?} is not accepted; write {}", one_of(&names)),
                );
                None
            }
        }
    }

    /// An array of strings, each checked by `check`; duplicates are problems.
    fn strings<'n>(
        &mut self,
        node: &'n Node,
        field: &str,
        check: impl Fn(&str) -> Result<String, String>,
    ) -> Option<Vec<(String, &'n Node)>> {
        let Value::Array(items) = &node.value else {
            self.wrong_type(node, field, "an array of strings");
            return None;
        };
        let mut out: Vec<(String, &'n Node)> = Vec::new();
        for item in items {
            let Value::String(text) = &item.value else {
                self.wrong_type(item, field, "a string");
                continue;
            };
            match check(text) {
                Ok(value) if out.iter().any(|(seen, _)| *seen == value) => {
                    self.problem(item, field, format!("{text:?} is listed twice"));
                }
                Ok(value) => out.push((value, item)),
                Err(message) => self.problem(item, field, message),
            }
        }
        // Invalid items are already problems, so the profile is refused; the
        // valid ones still get their own checks (credentials, dangers).
        Some(out)
    }

    fn workspace(&mut self, node: Option<&Node>) -> Option<Workspace> {
        let fields = match node {
            Some(node) => self.table(node, "workspace", WORKSPACE),
            None => Fields {
                entries: BTreeMap::new(),
            },
        };
        let image = match fields.get("image") {
            Some(node) => self.image(node, "workspace.image"),
            None => Some(defaults::IMAGE.to_owned()),
        };
        let images = match fields.get("images") {
            Some(node) => self
                .strings(node, "workspace.images", |text| {
                    ImageRef::parse(text).map(|_| text.to_owned())
                })
                .map(|images| images.into_iter().map(|(image, _)| image).collect()),
            None => Some(Vec::new()),
        };
        let pull = match fields.get("pull") {
            Some(node) => self.pull(node, "workspace.pull"),
            None => Some(PullPolicy::default()),
        };
        let pull_secret = match fields.get("pull_secret") {
            Some(node) => self.pull_secret(node, "workspace.pull_secret").map(Some),
            None => Some(None),
        };
        let root = match fields.get("root") {
            Some(node) => self.unit_root(node),
            None => Some(PathBuf::from(defaults::ROOT)),
        };
        let source = match fields.get("source") {
            Some(node) => self.source(node),
            None => Some(Source::Cwd),
        };
        let mode = match fields.get("mode") {
            Some(node) => self.choice(
                node,
                "workspace.mode",
                &[("rw", MountMode::ReadWrite), ("ro", MountMode::ReadOnly)],
            ),
            None => Some(MountMode::ReadWrite),
        };
        let user = match fields.get("user") {
            Some(node) => self.user(node),
            None => Some(UserChoice::Host),
        };
        let runtime = match fields.get("runtime") {
            Some(node) => self.runtime(node, "workspace.runtime").map(Some),
            None => Some(None),
        };
        let local_userland = self.local_userland(fields.get("local_userland"), "workspace");
        let on_persisted_credentials = match fields.get("on_persisted_credentials") {
            Some(node) => self.choice(
                node,
                "workspace.on_persisted_credentials",
                &[
                    ("report", OnPersisted::Report),
                    ("refuse", OnPersisted::Refuse),
                    ("hide", OnPersisted::Hide),
                ],
            ),
            None => Some(OnPersisted::Report),
        };
        let fork_mode = match fields.get("fork_mode") {
            Some(node) => self.choice(
                node,
                "workspace.fork_mode",
                &[
                    ("auto", ForkMode::Auto),
                    ("worktree", ForkMode::Worktree),
                    ("copy", ForkMode::Copy),
                ],
            ),
            None => Some(ForkMode::Auto),
        };
        Some(Workspace {
            image: image?,
            images: images?,
            pull: pull?,
            pull_secret: pull_secret?,
            root: root?,
            source: source?,
            mode: mode?,
            user: user?,
            runtime: runtime?,
            local_userland: local_userland?,
            on_persisted_credentials: on_persisted_credentials?,
            fork_mode: fork_mode?,
        })
    }

    /// An image reference (`ImageRef`): a malformed tag or digest is refused here.
    fn image(&mut self, node: &Node, field: &str) -> Option<String> {
        let text = self.string(node, field)?;
        match ImageRef::parse(&text) {
            Ok(_) => Some(text),
            Err(message) => {
                self.problem(node, field, message);
                None
            }
        }
    }

    fn pull(&mut self, node: &Node, field: &str) -> Option<PullPolicy> {
        self.choice(
            node,
            field,
            &[
                ("never", PullPolicy::Never),
                ("missing", PullPolicy::Missing),
                ("always", PullPolicy::Always),
            ],
        )
    }

    /// `pull_secret`: the name of a host variable holding the registry's
    /// `user:password`. Only the name is policy; the value is read when a
    /// pull needs it, handed to the engine alone and redacted everywhere.
    fn pull_secret(&mut self, node: &Node, field: &str) -> Option<String> {
        let Value::String(text) = &node.value else {
            self.wrong_type(
                node,
                field,
                "the name of a host variable holding user:password, like \"REGISTRY_AUTH\"",
            );
            return None;
        };
        match check_env_name(text) {
            Ok(()) => Some(text.clone()),
            Err(message) => {
                self.problem(node, field, message);
                None
            }
        }
    }

    /// `local_userland` of the unit at `unit` (`workspace`, `server[NAME]`).
    fn local_userland(&mut self, node: Option<&Node>, unit: &str) -> Option<LocalUserland> {
        match node {
            Some(node) => self.choice(
                node,
                &join(unit, "local_userland"),
                &[
                    ("refuse", LocalUserland::Refuse),
                    ("host", LocalUserland::Host),
                ],
            ),
            None => Some(LocalUserland::default()),
        }
    }

    /// An OCI runtime's name as the engine knows it (`runsc`, `runc`, `kata`).
    fn runtime(&mut self, node: &Node, field: &str) -> Option<String> {
        let Value::String(text) = &node.value else {
            self.wrong_type(node, field, "a runtime name like \"runsc\"");
            return None;
        };
        let valid = text.len() <= 64
            && text.starts_with(|c: char| c.is_ascii_alphanumeric())
            && text
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
        if !valid {
            self.problem(
                node,
                field,
                format!(
                    "{text:?} is not a runtime name; write the name the engine lists (`docker info`), like \"runsc\""
                ),
            );
            return None;
        }
        Some(text.clone())
    }

    fn unit_root(&mut self, node: &Node) -> Option<PathBuf> {
        let text = self.string(node, "workspace.root")?;
        let path = PathBuf::from(&text);
        if !is_clean_absolute(&path) || path == Path::new("/") {
            self.problem(
                node,
                "workspace.root",
                format!(
                    "{text:?} is not usable; write an absolute path inside the unit other than /, with no . or .. parts, like \"/workspace\""
                ),
            );
            return None;
        }
        Some(path)
    }

    fn source(&mut self, node: &Node) -> Option<Source> {
        let accepted = "\"cwd\", \"fork\", \"empty\", \"none\" or an absolute host path";
        let Value::String(text) = &node.value else {
            self.wrong_type(node, "workspace.source", accepted);
            return None;
        };
        match text.as_str() {
            "cwd" => return Some(Source::Cwd),
            "fork" => return Some(Source::Fork),
            "empty" => return Some(Source::Empty),
            "none" => return Some(Source::None),
            _ => {}
        }
        let path = PathBuf::from(text);
        if !is_clean_absolute(&path) {
            self.problem(
                node,
                "workspace.source",
                format!("{text:?} is not accepted; write {accepted} (with no . or .. parts)"),
            );
            return None;
        }
        self.judge_host_path(node, "workspace.source", &path);
        Some(Source::Host(path))
    }

    fn user(&mut self, node: &Node) -> Option<UserChoice> {
        let accepted = "\"host\" (the caller's ids), \"image\" (the image's user) or \"UID:GID\" like \"1000:1000\"";
        let Value::String(text) = &node.value else {
            self.wrong_type(node, "workspace.user", accepted);
            return None;
        };
        match text.as_str() {
            "host" => return Some(UserChoice::Host),
            "image" => return Some(UserChoice::Image),
            _ => {}
        }
        let ids = text.split_once(':').and_then(|(uid, gid)| {
            let all_digits = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
            (all_digits(uid) && all_digits(gid))
                .then(|| Some((uid.parse::<u32>().ok()?, gid.parse::<u32>().ok()?)))
                .flatten()
        });
        match ids {
            Some((uid, gid)) => Some(UserChoice::Ids(UserIds { uid, gid })),
            None => {
                self.problem(
                    node,
                    "workspace.user",
                    format!("{text:?} is not accepted; write {accepted}"),
                );
                None
            }
        }
    }

    fn network(&mut self, node: Option<&Node>, field: &str) -> Option<NetworkPolicy> {
        let Some(node) = node else {
            return Some(NetworkPolicy {
                mode: NetworkMode::None,
                allow: Vec::new(),
                hosts: BTreeMap::new(),
                max_connections: None,
                bandwidth: None,
            });
        };
        let fields = self.table(node, field, NETWORK);
        let mode = match fields.get("mode") {
            Some(node) => self.choice(
                node,
                &join(field, "mode"),
                &[
                    ("none", NetworkMode::None),
                    ("egress", NetworkMode::Egress),
                    ("bridge", NetworkMode::Bridge),
                ],
            ),
            None => Some(NetworkMode::None),
        };
        let allow_field = join(field, "allow");
        let before = self.problems.len();
        let allow = match fields.get("allow") {
            Some(node) => self
                .strings(node, &allow_field, |text| {
                    Rule::parse(text)
                        .map(|entry| entry.to_string())
                        .map_err(|error| error.to_string())
                })
                .map(|entries| {
                    entries
                        .into_iter()
                        .filter_map(|(text, _)| Rule::parse(&text).ok())
                        .collect::<Vec<_>>()
                }),
            None => Some(Vec::new()),
        };
        let hosts = match fields.get("hosts") {
            Some(node) => self.pinned_hosts(node, &join(field, "hosts")),
            None => Some(BTreeMap::new()),
        };
        let max_connections = match fields.get("max_connections") {
            Some(node) => self.count(node, &join(field, "max_connections")).map(Some),
            None => Some(None),
        };
        let bandwidth = match fields.get("bandwidth") {
            Some(node) => self.size(node, &join(field, "bandwidth")).map(Some),
            None => Some(None),
        };
        let (mode, allow, hosts, max_connections, bandwidth) =
            (mode?, allow?, hosts?, max_connections?, bandwidth?);
        if self.problems.len() > before {
            // Invalid entries are already reported; the list's shape is not yet known.
            return None;
        }
        match mode {
            NetworkMode::Egress if allow.is_empty() => {
                self.problem(
                    fields.get("mode").unwrap_or(node),
                    &join(field, "mode"),
                    "\"egress\" needs a non-empty allow list of host[:port] entries; for no network write \"none\"".to_owned(),
                );
                return None;
            }
            NetworkMode::None | NetworkMode::Bridge if !allow.is_empty() => {
                let mode_name = if mode == NetworkMode::None {
                    "none"
                } else {
                    "bridge"
                };
                self.problem(
                    fields.get("allow").unwrap_or(node),
                    &allow_field,
                    format!(
                        "an allow list only applies to mode \"egress\", but the mode is \"{mode_name}\"; write allow = [] or mode = \"egress\""
                    ),
                );
                return None;
            }
            NetworkMode::None | NetworkMode::Egress | NetworkMode::Bridge => {}
        }
        for (name, given) in [
            ("hosts", !hosts.is_empty()),
            ("max_connections", max_connections.is_some()),
            ("bandwidth", bandwidth.is_some()),
        ] {
            if mode != NetworkMode::Egress && given {
                self.problem(
                    fields.get(name).unwrap_or(node),
                    &join(field, name),
                    format!(
                        "only applies to mode \"egress\" (the unit's egress proxy enforces it), but the mode is \"{}\"; remove {name} or write mode = \"egress\"",
                        mode.as_str()
                    ),
                );
                return None;
            }
        }
        Some(NetworkPolicy {
            mode,
            allow,
            hosts,
            max_connections,
            bandwidth,
        })
    }

    /// `hosts = { "name" = "address" }`: each name a host name, each value an IP address.
    fn pinned_hosts(&mut self, node: &Node, field: &str) -> Option<BTreeMap<String, IpAddr>> {
        let Value::Table(entries) = &node.value else {
            self.problem(
                node,
                field,
                format!(
                    "{} is not a table; write hosts = {{ \"registry.internal\" = \"10.0.0.5\" }}",
                    node.value.shown()
                ),
            );
            return None;
        };
        let mut hosts = BTreeMap::new();
        let mut ok = true;
        for (key, value) in entries {
            let name = &key.name;
            let entry_field = format!("{field}.{name}");
            // A name alone: no port, wildcard or address.
            let pinned = match HostName::parse(name) {
                Ok(pinned) => pinned.to_string(),
                Err(_) => {
                    self.problem(value, &entry_field, format!("{name:?} is not a host name; pin names like \"registry.internal\" (no port, wildcard or address)"));
                    ok = false;
                    continue;
                }
            };
            let address = match &value.value {
                Value::String(text) => text.parse::<IpAddr>().ok(),
                _ => None,
            };
            match address {
                Some(address) => {
                    hosts.insert(pinned, address);
                }
                None => {
                    self.problem(
                        value,
                        &entry_field,
                        format!(
                            "{} is not an IP address; write \"10.0.0.5\" or \"fd00::5\"",
                            value.value.shown()
                        ),
                    );
                    ok = false;
                }
            }
        }
        ok.then_some(hosts)
    }

    fn limits(
        &mut self,
        node: Option<&Node>,
        field: &str,
        accepted: &[&str],
        base: &LimitsPolicy,
    ) -> Option<LimitsPolicy> {
        let Some(node) = node else {
            return Some(base.clone());
        };
        let fields = self.table(node, field, accepted);
        let mut limits = base.clone();
        let mut ok = true;
        for (name, node) in &fields.entries {
            let path = join(field, name);
            let done = match *name {
                "memory" => self.size(node, &path).map(|size| limits.memory = size),
                "tmp" => self.size(node, &path).map(|size| limits.tmp = size),
                "home" => self.size(node, &path).map(|size| limits.home = size),
                "cpus" => self.cpus(node, &path).map(|cpus| limits.cpus = cpus),
                "pids" => self.count(node, &path).map(|count| limits.pids = count),
                "nofile" => self.count(node, &path).map(|count| limits.nofile = count),
                "call_timeout" => self
                    .duration(node, &path)
                    .map(|duration| limits.call_timeout = duration),
                "idle" => self
                    .duration(node, &path)
                    .map(|duration| limits.idle = duration),
                "lifetime" => self
                    .duration(node, &path)
                    .map(|duration| limits.lifetime = duration),
                "start_timeout" => self
                    .duration(node, &path)
                    .map(|duration| limits.start_timeout = duration),
                _ => None,
            };
            ok &= done.is_some();
        }
        ok.then_some(limits)
    }

    fn lifecycle(&mut self, node: Option<&Node>) -> Option<LifecyclePolicy> {
        let mut lifecycle = defaults::lifecycle();
        let Some(node) = node else {
            return Some(lifecycle);
        };
        let fields = self.table(node, "lifecycle", LIFECYCLE);
        let mut ok = true;
        if let Some(node) = fields.get("lease") {
            match self.duration(node, "lifecycle.lease") {
                Some(lease) if (defaults::MIN_LEASE..=defaults::MAX_LEASE).contains(&lease) => {
                    lifecycle.lease = lease;
                }
                Some(lease) => {
                    self.problem(
                        node,
                        "lifecycle.lease",
                        format!(
                            "\"{}\" is out of bounds; a lease is from {} to {} (a unit ends that long after its host stops renewing it)",
                            humantime::format_duration(lease),
                            humantime::format_duration(defaults::MIN_LEASE),
                            humantime::format_duration(defaults::MAX_LEASE)
                        ),
                    );
                    ok = false;
                }
                None => ok = false,
            }
        }
        ok.then_some(lifecycle)
    }

    fn size(&mut self, node: &Node, field: &str) -> Option<ByteSize> {
        let Value::String(text) = &node.value else {
            self.wrong_type(node, field, "a size like \"2GiB\"");
            return None;
        };
        ByteSize::parse(text)
            .map_err(|message| self.problem(node, field, message))
            .ok()
    }

    fn cpus(&mut self, node: &Node, field: &str) -> Option<CpuQuota> {
        let cores = match &node.value {
            Value::Float(number) => *number,
            Value::Integer(text) => text.parse::<f64>().unwrap_or(f64::NAN),
            _ => {
                self.wrong_type(node, field, "a number of cores like 2 or 0.5");
                return None;
            }
        };
        CpuQuota::from_cores(cores)
            .map_err(|message| self.problem(node, field, message))
            .ok()
    }

    fn count(&mut self, node: &Node, field: &str) -> Option<u64> {
        let Value::Integer(text) = &node.value else {
            self.wrong_type(node, field, "a whole number like 512");
            return None;
        };
        parse_count(text)
            .map_err(|message| self.problem(node, field, message))
            .ok()
    }

    fn duration(&mut self, node: &Node, field: &str) -> Option<Duration> {
        let Value::String(text) = &node.value else {
            self.wrong_type(node, field, "a duration like \"10m\"");
            return None;
        };
        parse_duration(text)
            .map_err(|message| self.problem(node, field, message))
            .ok()
    }

    fn env(&mut self, node: Option<&Node>) -> Option<EnvPolicy> {
        let Some(node) = node else {
            return Some(EnvPolicy::default());
        };
        let fields = self.table(node, "env", ENV);
        let mut ok = true;
        let mut set = BTreeMap::new();
        if let Some(node) = fields.get("set") {
            match &node.value {
                Value::Table(items) => {
                    for (key, value) in items {
                        let field = format!("env.set.{}", key.name);
                        if let Err(message) = check_env_name(&key.name) {
                            self.problems
                                .push(Problem::new(key.at.clone(), &field, &message));
                            ok = false;
                        }
                        match self.string(value, &field) {
                            Some(text) => {
                                set.insert(key.name.clone(), text);
                            }
                            None => ok = false,
                        }
                    }
                }
                _ => {
                    self.wrong_type(node, "env.set", "a table of NAME = \"value\"");
                    ok = false;
                }
            }
        }
        let names = |text: &str| check_env_name(text).map(|()| text.to_owned());
        let mut pass = Vec::new();
        if let Some(node) = fields.get("pass") {
            match self.strings(node, "env.pass", names) {
                Some(entries) => {
                    for (name, item) in entries {
                        if looks_like_credential(&name) {
                            self.problem(
                                item,
                                "env.pass",
                                format!(
                                    "{name:?} looks like a credential; hand it through under env.secrets if you mean to"
                                ),
                            );
                            ok = false;
                        }
                        pass.push(name);
                    }
                }
                None => ok = false,
            }
        }
        let mut secrets = Vec::new();
        let mut secrets_as_env = Vec::new();
        if let Some(node) = fields.get("secrets") {
            match self.secrets(node) {
                Some(entries) => {
                    for (name, as_env, item) in entries {
                        if pass.contains(&name) {
                            self.problem(
                                item,
                                "env.secrets",
                                format!("{name:?} is also in env.pass; name it in one list"),
                            );
                            ok = false;
                        }
                        if as_env {
                            secrets_as_env.push(name.clone());
                        }
                        secrets.push(name);
                    }
                }
                None => ok = false,
            }
        }
        ok.then_some(EnvPolicy {
            set,
            pass,
            secrets,
            secrets_as_env,
        })
    }

    /// `env.secrets`: each entry a name, or `{name = "NAME", as_env = true}`
    /// (the value also reaches the executor's children as a variable).
    fn secrets<'n>(&mut self, node: &'n Node) -> Option<Vec<(String, bool, &'n Node)>> {
        const FIELD: &str = "env.secrets";
        let Value::Array(items) = &node.value else {
            self.wrong_type(node, FIELD, "an array of names or {name, as_env} tables");
            return None;
        };
        let mut out: Vec<(String, bool, &'n Node)> = Vec::new();
        for item in items {
            let (name_node, as_env) = match &item.value {
                Value::String(_) => (item, false),
                Value::Table(_) => {
                    let fields = self.table(item, FIELD, SECRET);
                    let as_env = match fields.get("as_env") {
                        Some(flag) => self.boolean(flag, "env.secrets.as_env").unwrap_or(false),
                        None => false,
                    };
                    match fields.get("name") {
                        Some(name) => (name, as_env),
                        None => {
                            self.problem(
                                item,
                                FIELD,
                                "a table entry needs `name`, like {name = \"GITHUB_TOKEN\", as_env = true}".to_owned(),
                            );
                            continue;
                        }
                    }
                }
                _ => {
                    self.wrong_type(item, FIELD, "a name or a {name, as_env} table");
                    continue;
                }
            };
            let Value::String(text) = &name_node.value else {
                self.wrong_type(name_node, "env.secrets.name", "a string");
                continue;
            };
            match check_env_name(text) {
                Ok(()) if out.iter().any(|(seen, _, _)| seen == text) => {
                    self.problem(name_node, FIELD, format!("{text:?} is listed twice"));
                }
                Ok(()) => out.push((text.clone(), as_env, name_node)),
                Err(message) => self.problem(name_node, FIELD, message),
            }
        }
        Some(out)
    }

    fn security(&mut self, node: Option<&Node>) -> Option<SecurityPolicy> {
        let mut security = SecurityPolicy {
            capabilities: Vec::new(),
            read_only_root: true,
            landlock: Requirement::Required,
            neutralise_git: true,
            write_guard: true,
            tmp: TmpMode::Exec,
            privileged: false,
            host_namespaces: Vec::new(),
            devices: Vec::new(),
        };
        let Some(node) = node else {
            return Some(security);
        };
        let fields = self.table(node, "security", SECURITY);
        let mut ok = true;
        for (name, node) in &fields.entries {
            let field = format!("security.{name}");
            let done = match *name {
                "capabilities" => self.capabilities(node).map(|caps| security.capabilities = caps),
                "read_only_root" => self
                    .boolean(node, &field)
                    .map(|flag| security.read_only_root = flag),
                "landlock" => self
                    .choice(
                        node,
                        &field,
                        &[
                            ("required", Requirement::Required),
                            ("best-effort", Requirement::BestEffort),
                            ("off", Requirement::Off),
                        ],
                    )
                    .map(|requirement| security.landlock = requirement),
                "git" => self
                    .choice(node, &field, &[("neutralise", true), ("off", false)])
                    .map(|flag| security.neutralise_git = flag),
                "write_guard" => self
                    .choice(node, &field, &[("read-first", true), ("off", false)])
                    .map(|flag| security.write_guard = flag),
                "tmp" => self
                    .choice(
                        node,
                        &field,
                        &[("exec", TmpMode::Exec), ("noexec", TmpMode::NoExec)],
                    )
                    .map(|mode| security.tmp = mode),
                "privileged" => self.boolean(node, &field).map(|flag| {
                    if flag {
                        self.dangers.push(Asked {
                            danger: Danger::Privileged,
                            at: node.at.clone(),
                            field: field.clone(),
                            what: "a privileged unit has every capability and every device".to_owned(),
                        });
                    }
                    security.privileged = flag;
                }),
                "host_namespaces" => self
                    .strings(node, &field, |text| {
                        if NAMESPACES.contains(&text) {
                            Ok(text.to_owned())
                        } else {
                            Err(format!("{text:?} is not a namespace; write {}", one_of(&NAMESPACES)))
                        }
                    })
                    .map(|entries| {
                        if !entries.is_empty() {
                            let names: Vec<&str> = entries.iter().map(|(name, _)| name.as_str()).collect();
                            self.dangers.push(Asked {
                                danger: Danger::HostNamespaces,
                                at: node.at.clone(),
                                field: field.clone(),
                                what: format!("sharing the host's {} namespace(s)", names.join(", ")),
                            });
                        }
                        security.host_namespaces = entries.into_iter().map(|(name, _)| name).collect();
                    }),
                "devices" => self
                    .strings(node, &field, |text| {
                        let path = Path::new(text);
                        if is_clean_absolute(path) && path.starts_with("/dev") && path != Path::new("/dev") {
                            Ok(text.to_owned())
                        } else {
                            Err(format!("{text:?} is not a device; write a path under /dev like \"/dev/fuse\""))
                        }
                    })
                    .map(|entries| {
                        if !entries.is_empty() {
                            self.dangers.push(Asked {
                                danger: Danger::Devices,
                                at: node.at.clone(),
                                field: field.clone(),
                                what: "host devices are reachable from the unit".to_owned(),
                            });
                        }
                        security.devices = entries.into_iter().map(|(name, _)| PathBuf::from(name)).collect();
                    }),
                _ => None,
            };
            ok &= done.is_some();
        }
        ok.then_some(security)
    }

    fn capabilities(&mut self, node: &Node) -> Option<Vec<String>> {
        let entries = self.strings(node, "security.capabilities", |text| {
            let name = text.strip_prefix("CAP_").unwrap_or(text);
            if KNOWN_CAPABILITIES.contains(&name) {
                Ok(name.to_owned())
            } else {
                Err(format!(
                    "{text:?} is not a capability; write an upper-case name like \"NET_BIND_SERVICE\" (reviewed: {})",
                    REVIEWED_CAPABILITIES.join(", ")
                ))
            }
        })?;
        for (name, item) in &entries {
            if !REVIEWED_CAPABILITIES.contains(&name.as_str()) {
                self.dangers.push(Asked {
                    danger: Danger::Capabilities,
                    at: item.at.clone(),
                    field: "security.capabilities".to_owned(),
                    what: format!(
                        "{name} is not on the reviewed list ({})",
                        REVIEWED_CAPABILITIES.join(", ")
                    ),
                });
            }
        }
        Some(entries.into_iter().map(|(name, _)| name).collect())
    }

    fn servers(&mut self, node: Option<&Node>, limits: &Option<LimitsPolicy>) -> Vec<Server> {
        let Some(node) = node else {
            return Vec::new();
        };
        let Value::Array(items) = &node.value else {
            self.wrong_type(node, "server", "an array of tables, written [[server]]");
            return Vec::new();
        };
        let base = limits.clone().unwrap_or_else(defaults::limits);
        let mut servers: Vec<Server> = Vec::new();
        for (index, item) in items.iter().enumerate() {
            let label = match item.get("name").map(|name| &name.value) {
                Some(Value::String(name)) => format!("server[{name}]"),
                _ => format!("server[{index}]"),
            };
            let fields = self.table(item, &label, SERVER);
            let name = match fields.get("name") {
                Some(node) => self.server_name(node, &label, &servers),
                None => {
                    self.problem(
                        item,
                        &label,
                        "a server needs a name, like name = \"fetch\"".to_owned(),
                    );
                    None
                }
            };
            let image = match fields.get("image") {
                Some(node) => self.image(node, &join(&label, "image")),
                None => {
                    self.problem(
                        item,
                        &label,
                        "a server needs an image, like image = \"box-fetch:latest\"".to_owned(),
                    );
                    None
                }
            };
            let command = match fields.get("command") {
                Some(node) => {
                    let field = join(&label, "command");
                    self.strings(node, &field, |text| Ok(text.to_owned()))
                        .and_then(|words| {
                            if words.is_empty() || words[0].0.is_empty() {
                                self.problem(node, &field, "the command is empty; write the program and its arguments, like [\"mcp-server\", \"--stdio\"]".to_owned());
                                None
                            } else {
                                Some(words.into_iter().map(|(word, _)| word).collect::<Vec<_>>())
                            }
                        })
                }
                None => {
                    self.problem(
                        item,
                        &label,
                        "a server needs a command, like command = [\"mcp-server\", \"--stdio\"]"
                            .to_owned(),
                    );
                    None
                }
            };
            let description = match fields.get("description") {
                Some(node) => self.string(node, &join(&label, "description")),
                None => Some(String::new()),
            };
            let network = self.network(fields.get("network"), &join(&label, "network"));
            let runtime = match fields.get("runtime") {
                Some(node) => self.runtime(node, &join(&label, "runtime")).map(Some),
                None => Some(None),
            };
            let local_userland = self.local_userland(fields.get("local_userland"), &label);
            let pull = match fields.get("pull") {
                Some(node) => self.pull(node, &join(&label, "pull")),
                None => Some(PullPolicy::default()),
            };
            let pull_secret = match fields.get("pull_secret") {
                Some(node) => self
                    .pull_secret(node, &join(&label, "pull_secret"))
                    .map(Some),
                None => Some(None),
            };
            let limits = self.limits(
                fields.get("limits"),
                &join(&label, "limits"),
                SERVER_LIMITS,
                &base,
            );
            if let (
                Some(name),
                Some(image),
                Some(command),
                Some(description),
                Some(network),
                Some(limits),
                Some(runtime),
                Some(pull),
                Some(pull_secret),
                Some(local_userland),
            ) = (
                name,
                image,
                command,
                description,
                network,
                limits,
                runtime,
                pull,
                pull_secret,
                local_userland,
            ) {
                servers.push(Server {
                    name,
                    image,
                    pull,
                    pull_secret,
                    command,
                    description,
                    network,
                    runtime,
                    local_userland,
                    limits,
                });
            }
        }
        servers
    }

    /// `[[volume]]` tables: the workspace unit's volumes.
    fn volumes(&mut self, node: Option<&Node>, workspace: Option<&Workspace>) -> Vec<Volume> {
        let Some(node) = node else {
            return Vec::new();
        };
        let Value::Array(items) = &node.value else {
            self.wrong_type(node, "volume", "an array of tables, written [[volume]]");
            return Vec::new();
        };
        if workspace.is_some_and(|workspace| workspace.source == Source::None) {
            self.problem(
                node,
                "volume",
                "volumes are the workspace unit's, and source = \"none\" has none; remove the [[volume]] tables or give the profile a workspace".to_owned(),
            );
            return Vec::new();
        }
        let mut volumes: Vec<Volume> = Vec::new();
        for (index, item) in items.iter().enumerate() {
            let label = match item.get("name").map(|name| &name.value) {
                Some(Value::String(name)) => format!("volume[{name}]"),
                _ => format!("volume[{index}]"),
            };
            let fields = self.table(item, &label, VOLUME);
            let name = match fields.get("name") {
                Some(node) => self.volume_name(node, &label, &volumes),
                None => {
                    self.problem(
                        item,
                        &label,
                        "a volume needs a name, like name = \"pip-cache\"".to_owned(),
                    );
                    None
                }
            };
            let path = match fields.get("path") {
                Some(node) => self.volume_path(node, &label, workspace, &volumes),
                None => {
                    self.problem(
                        item,
                        &label,
                        "a volume needs a path in the unit, like path = \"~/.cache/pip\""
                            .to_owned(),
                    );
                    None
                }
            };
            let scope = match fields.get("scope") {
                Some(node) => self.choice(
                    node,
                    &join(&label, "scope"),
                    &[
                        ("session", VolumeScope::Session),
                        ("profile", VolumeScope::Profile),
                    ],
                ),
                None => Some(VolumeScope::Session),
            };
            if let (Some(name), Some(path), Some(scope)) = (name, path, scope) {
                volumes.push(Volume { name, path, scope });
            }
        }
        volumes
    }

    fn volume_name(&mut self, node: &Node, label: &str, volumes: &[Volume]) -> Option<String> {
        let field = join(label, "name");
        let name = self.string(node, &field)?;
        let valid = name.len() <= 40
            && name.starts_with(|c: char| c.is_ascii_lowercase())
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if !valid {
            self.problem(
                node,
                &field,
                format!("{name:?} is not a volume name; write lower-case letters, digits and -, starting with a letter, at most 40, like \"pip-cache\""),
            );
            return None;
        }
        if volumes.iter().any(|volume| volume.name == name) {
            self.problem(
                node,
                &field,
                format!("a volume named {name:?} is declared twice"),
            );
            return None;
        }
        Some(name)
    }

    /// A volume's place in the unit: `~/REL` beneath the unit's home, or an
    /// absolute path where a mount of the unit's own makes sense (not the
    /// kernel's or box's own places, not `/tmp`, the secrets or the
    /// workspace, not inside or around another volume).
    fn volume_path(
        &mut self,
        node: &Node,
        label: &str,
        workspace: Option<&Workspace>,
        volumes: &[Volume],
    ) -> Option<VolumePath> {
        let field = join(label, "path");
        let text = self.string(node, &field)?;
        let accepted = "write \"~/\" and a path beneath the unit's home (\"~/.cache/pip\"), or an absolute path (\"/var/cache/box/pip\")";
        let path = match text.strip_prefix("~/") {
            Some(relative) => {
                let relative = PathBuf::from(relative);
                let clean = relative.components().count() > 0
                    && relative
                        .components()
                        .all(|part| matches!(part, Component::Normal(_)));
                if !clean {
                    self.problem(node, &field, format!("{text:?} is not a path beneath the home; {accepted}, with no . or .. parts"));
                    return None;
                }
                VolumePath::Home(relative)
            }
            None => {
                let path = PathBuf::from(&text);
                if !is_clean_absolute(&path) || path == Path::new("/") {
                    self.problem(
                        node,
                        &field,
                        format!("{text:?} is not accepted; {accepted}, with no . or .. parts"),
                    );
                    return None;
                }
                let reserved = [
                    ("/proc", "the kernel's /proc"),
                    ("/sys", "the kernel's /sys"),
                    ("/dev", "the kernel's /dev"),
                    ("/.box", "box's own /.box (its executor, its init's socket)"),
                    ("/tmp", "the unit's own /tmp (limits.tmp)"),
                    (
                        crate::executor::SECRETS_DIR,
                        "/run/secrets, where the unit's secrets are delivered",
                    ),
                ];
                for (place, what) in reserved {
                    if path.starts_with(place) || Path::new(place).starts_with(&path) {
                        self.problem(
                            node,
                            &field,
                            format!(
                                "{text:?} is, or is inside or around, {what}; {accepted} elsewhere"
                            ),
                        );
                        return None;
                    }
                }
                if let Some(root) = workspace.map(|workspace| &workspace.root)
                    && (path.starts_with(root) || root.starts_with(&path))
                {
                    self.problem(
                        node,
                        &field,
                        format!("{text:?} overlaps the workspace at {}; a volume goes beside it, never in or around it", root.display()),
                    );
                    return None;
                }
                VolumePath::Absolute(path)
            }
        };
        let overlap = volumes.iter().find(|other| match (&other.path, &path) {
            (VolumePath::Home(a), VolumePath::Home(b))
            | (VolumePath::Absolute(a), VolumePath::Absolute(b)) => {
                a.starts_with(b) || b.starts_with(a)
            }
            (VolumePath::Home(_), VolumePath::Absolute(_))
            | (VolumePath::Absolute(_), VolumePath::Home(_)) => false,
        });
        if let Some(other) = overlap {
            self.problem(
                node,
                &field,
                format!(
                    "{text:?} overlaps volume {:?} at {}; give each volume a place of its own",
                    other.name, other.path
                ),
            );
            return None;
        }
        Some(path)
    }

    fn server_name(&mut self, node: &Node, label: &str, servers: &[Server]) -> Option<String> {
        let field = join(label, "name");
        let name = self.string(node, &field)?;
        let valid = !name.is_empty()
            && name.len() <= 40
            && name.starts_with(|c: char| c.is_ascii_lowercase())
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if !valid {
            self.problem(
                node,
                &field,
                format!("{name:?} is not a server name; write lower-case letters, digits and -, starting with a letter, like \"fetch\""),
            );
            return None;
        }
        if name == "workspace" {
            self.problem(
                node,
                &field,
                "\"workspace\" is the workspace unit's name; choose another".to_owned(),
            );
            return None;
        }
        if servers.iter().any(|server| server.name == name) {
            self.problem(
                node,
                &field,
                format!("a server named {name:?} is declared twice"),
            );
            return None;
        }
        Some(name)
    }
}

/// Absolute, with no `.` or `..` parts (compared component-wise, never as a string prefix).
fn is_clean_absolute(path: &Path) -> bool {
    path.is_absolute()
        && path
            .components()
            .all(|component| matches!(component, Component::RootDir | Component::Normal(_)))
        && !path.to_string_lossy().contains("/./")
        && !path.to_string_lossy().ends_with("/.")
}
