//! `[[server]]` tables (declared in `fields.rs`): server units, each with its
//! own image, command, network and limits. The readers here are a server's
//! that depend on what is around it: its name (unique, not `workspace`) and
//! its limits (over the profile's).

use super::super::fields::Scope;
use super::super::kinds::{After, Kind, Reads};
use super::super::model::{LimitsPolicy, NetworkPolicy, Server, defaults};
use super::super::tree::Node;
use super::Walk;

/// What a `[[server]]` is read within: the names of the servers before it
/// and the profile's limits, which its own `limits` are over.
pub(in crate::profile) struct ServerContext {
    names: Vec<String>,
    limits: LimitsPolicy,
}

impl Walk {
    /// `[[server]]` tables: server units, their limits over the profile's.
    pub(super) fn servers(
        &mut self,
        node: Option<&Node>,
        limits: &Option<LimitsPolicy>,
    ) -> Vec<Server> {
        let Some(node) = node else {
            return Vec::new();
        };
        let limits = limits.clone().unwrap_or_else(defaults::limits);
        self.each(node, "server", |walk, item, label, servers: &[Server]| {
            let context = ServerContext {
                names: servers.iter().map(|server| server.name.clone()).collect(),
                limits: limits.clone(),
            };
            Server::read_in(walk, item, label, &context)
        })
    }
}

/// A server's `name`: unique, not `workspace`.
pub(in crate::profile) struct ServerName;

impl Reads<String, ServerContext> for ServerName {
    fn read_in(
        walk: &mut Walk,
        node: &Node,
        field: &str,
        context: &ServerContext,
    ) -> Option<String> {
        let name = walk.string(node, field)?;
        let valid = !name.is_empty()
            && name.len() <= 40
            && name.starts_with(|c: char| c.is_ascii_lowercase())
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if !valid {
            walk.problem(
                node,
                field,
                format!("{name:?} is not a server name; write lower-case letters, digits and -, starting with a letter, like \"fetch\""),
            );
            return None;
        }
        if name == "workspace" {
            walk.problem(
                node,
                field,
                "\"workspace\" is the workspace unit's name; choose another".to_owned(),
            );
            return None;
        }
        if context.names.contains(&name) {
            walk.problem(
                node,
                field,
                format!("a server named {name:?} is declared twice"),
            );
            return None;
        }
        Some(name)
    }
}

/// A server's `command`: a program and its arguments.
pub(in crate::profile) struct Command;

impl<C> Reads<Vec<String>, C> for Command {
    fn read(walk: &mut Walk, node: &Node, field: &str) -> Option<Vec<String>> {
        let words = walk.strings(node, field, |text| Ok(text.to_owned()))?;
        if words.first().is_none_or(|(program, _)| program.is_empty()) {
            walk.problem(node, field, "the command is empty; write the program and its arguments, like [\"mcp-server\", \"--stdio\"]".to_owned());
            return None;
        }
        Some(words.into_iter().map(|(word, _)| word).collect())
    }
}

/// A server's `limits`: each unit's limits, over the profile's.
pub(in crate::profile) struct UnitLimits;

impl Reads<LimitsPolicy, ServerContext> for UnitLimits {
    fn read_in(
        walk: &mut Walk,
        node: &Node,
        field: &str,
        context: &ServerContext,
    ) -> Option<LimitsPolicy> {
        walk.limits(Some(node), field, Scope::Unit, &context.limits)
    }

    fn absent(context: &ServerContext) -> Option<LimitsPolicy> {
        Some(context.limits.clone())
    }
}

/// A unit's limits (a server's `limits`, over the strict ones).
impl Kind for LimitsPolicy {
    fn read(walk: &mut Walk, node: &Node, field: &str) -> Option<Self> {
        walk.limits(Some(node), field, Scope::Unit, &defaults::limits())
    }

    fn text(&self) -> String {
        self.show_text()
    }

    fn word(&self) -> serde_json::Value {
        self.show_json()
    }

    fn plan(&self) -> serde_json::Value {
        LimitsPolicy::plan(self).to_json()
    }
}

/// A unit's network (`[network]`, a server's `network`): its table, then
/// each field checked against the mode.
pub(in crate::profile) struct Network;

impl<C> Reads<NetworkPolicy, C> for Network {
    fn read(walk: &mut Walk, node: &Node, field: &str) -> Option<NetworkPolicy> {
        walk.network(Some(node), field)
    }
}

/// `[[server]]` tables, after the profile's limits (theirs are over them).
pub(in crate::profile) struct Servers;

impl Reads<Vec<Server>> for Servers {}

impl After<Vec<Server>, (&Option<LimitsPolicy>,)> for Servers {
    fn read_after(
        walk: &mut Walk,
        node: Option<&Node>,
        _field: &str,
        (limits,): (&Option<LimitsPolicy>,),
    ) -> Option<Vec<Server>> {
        Some(walk.servers(node, limits))
    }
}

/// Server units (alone: over the strict limits).
impl Kind for Vec<Server> {
    const LIST: bool = true;

    fn read(walk: &mut Walk, node: &Node, _field: &str) -> Option<Self> {
        Some(walk.servers(Some(node), &None))
    }

    fn text(&self) -> String {
        let names: Vec<&str> = self.iter().map(|server| server.name.as_str()).collect();
        names.join(", ")
    }

    fn word(&self) -> serde_json::Value {
        serde_json::Value::Array(self.iter().map(Server::plan_json).collect())
    }
}

/// `[limits]`: the session's and the workspace unit's, over the strict ones.
pub(in crate::profile) struct SessionLimits;

impl Reads<LimitsPolicy> for SessionLimits {
    fn read(walk: &mut Walk, node: &Node, field: &str) -> Option<LimitsPolicy> {
        walk.limits(Some(node), field, Scope::Session, &defaults::limits())
    }
}
