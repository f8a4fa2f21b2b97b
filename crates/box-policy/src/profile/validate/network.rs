//! The `[network]` table (and a server's `network`): the mode, the allow
//! list, pinned hosts and the egress proxy's limits, each checked against the mode.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::super::kinds::Kind;
use super::super::model::NetworkPolicy;
use super::super::tree::{Node, Value};
use super::{Walk, join};
use crate::allow::{HostName, Rule};
use crate::plan::NetworkMode;

impl Walk {
    /// The network at `field` (absent: none), read by its rows in `fields.rs`,
    /// then each field checked against the mode.
    pub(super) fn network(&mut self, node: Option<&Node>, field: &str) -> Option<NetworkPolicy> {
        let network = NetworkPolicy::read(self, node, field)?;
        let Some(node) = node else {
            return Some(network);
        };
        let at = |name: &str| node.get(name).unwrap_or(node);
        let mode = network.mode;
        match mode {
            NetworkMode::Egress if network.allow.is_empty() => {
                self.problem(
                    at("mode"),
                    &join(field, "mode"),
                    "\"egress\" needs a non-empty allow list of host[:port] entries; for no network write \"none\"".to_owned(),
                );
                return None;
            }
            NetworkMode::None | NetworkMode::Bridge if !network.allow.is_empty() => {
                self.problem(
                    at("allow"),
                    &join(field, "allow"),
                    format!(
                        "an allow list only applies to mode \"egress\", but the mode is \"{}\"; write allow = [] or mode = \"egress\"",
                        mode.as_str()
                    ),
                );
                return None;
            }
            NetworkMode::None | NetworkMode::Egress | NetworkMode::Bridge => {}
        }
        for (name, given) in [
            ("hosts", !network.hosts.is_empty()),
            ("max_connections", network.max_connections.is_some()),
            ("bandwidth", network.bandwidth.is_some()),
        ] {
            if mode != NetworkMode::Egress && given {
                self.problem(
                    at(name),
                    &join(field, name),
                    format!(
                        "only applies to mode \"egress\" (the unit's egress proxy enforces it), but the mode is \"{}\"; remove {name} or write mode = \"egress\"",
                        mode.as_str()
                    ),
                );
                return None;
            }
        }
        Some(network)
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
}

/// `allow`: `host[:port]` entries, each a [`Rule`].
impl Kind for Vec<Rule> {
    const LIST: bool = true;

    fn read(walk: &mut Walk, node: &Node, field: &str) -> Option<Self> {
        let before = walk.problems.len();
        let entries = walk.strings(node, field, |text| {
            Rule::parse(text)
                .map(|entry| entry.to_string())
                .map_err(|error| error.to_string())
        })?;
        if walk.problems.len() > before {
            // Invalid entries are already reported; the list's shape is not yet known.
            return None;
        }
        Some(
            entries
                .into_iter()
                .filter_map(|(text, _)| Rule::parse(&text).ok())
                .collect(),
        )
    }

    fn word(&self) -> serde_json::Value {
        serde_json::json!(self.iter().map(ToString::to_string).collect::<Vec<_>>())
    }

    fn text(&self) -> String {
        let shown: Vec<String> = self.iter().map(ToString::to_string).collect();
        shown.join(", ")
    }
}

/// `hosts`: names pinned to addresses.
impl Kind for BTreeMap<String, IpAddr> {
    fn read(walk: &mut Walk, node: &Node, field: &str) -> Option<Self> {
        walk.pinned_hosts(node, field)
    }

    fn word(&self) -> serde_json::Value {
        serde_json::json!(self)
    }

    fn text(&self) -> String {
        let shown: Vec<String> = self
            .iter()
            .map(|(name, address)| format!("{name} = {address}"))
            .collect();
        shown.join(", ")
    }
}
