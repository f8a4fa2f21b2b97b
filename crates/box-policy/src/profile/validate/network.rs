//! The `[network]` table (and a server's `network`): the mode, the allow
//! list, pinned hosts and the egress proxy's limits, each checked against the mode.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::super::fields::NETWORK;
use super::super::kinds::Kind;
use super::super::model::NetworkPolicy;
use super::super::tree::{Node, Value};
use super::{Walk, join};
use crate::allow::{HostName, Rule};
use crate::plan::NetworkMode;

impl Walk {
    pub(super) fn network(&mut self, node: Option<&Node>, field: &str) -> Option<NetworkPolicy> {
        let Some(node) = node else {
            return Some(NetworkPolicy {
                mode: NetworkMode::None,
                allow: Vec::new(),
                hosts: BTreeMap::new(),
                max_connections: None,
                bandwidth: None,
            });
        };
        let fields = self.table(node, field, &NETWORK.names());
        let mode = match fields.get("mode") {
            Some(node) => NetworkMode::read(self, node, &join(field, "mode")),
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
    pub(super) fn pinned_hosts(
        &mut self,
        node: &Node,
        field: &str,
    ) -> Option<BTreeMap<String, IpAddr>> {
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
