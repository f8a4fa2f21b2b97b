//! The `[security]` table's readers beyond a type (declared in `fields.rs`):
//! the fields that can ask for a danger, and the names and paths they accept.

use std::path::{Path, PathBuf};

use super::super::kinds::Reads;
use super::super::model::Danger;
use super::super::tree::Node;
use super::super::value::{KNOWN_CAPABILITIES, NAMESPACES, REVIEWED_CAPABILITIES};
use super::danger::Asked;
use super::{Walk, is_clean_absolute, one_of};

/// `capabilities`: known names (a `CAP_` prefix dropped); each beyond the
/// reviewed list is a danger.
pub(in crate::profile) struct Capabilities;

impl Reads<Vec<String>> for Capabilities {
    fn read(walk: &mut Walk, node: &Node, field: &str) -> Option<Vec<String>> {
        let entries = walk.strings(node, field, |text| {
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
                walk.dangers.push(Asked {
                    danger: Danger::Capabilities,
                    at: item.at.clone(),
                    field: field.to_owned(),
                    what: format!(
                        "{name} is not on the reviewed list ({})",
                        REVIEWED_CAPABILITIES.join(", ")
                    ),
                });
            }
        }
        Some(entries.into_iter().map(|(name, _)| name).collect())
    }
}

/// `privileged`: `true` is a danger.
pub(in crate::profile) struct Privileged;

impl Reads<bool> for Privileged {
    fn read(walk: &mut Walk, node: &Node, field: &str) -> Option<bool> {
        let flag = walk.boolean(node, field)?;
        if flag {
            walk.dangers.push(Asked {
                danger: Danger::Privileged,
                at: node.at.clone(),
                field: field.to_owned(),
                what: "a privileged unit has every capability and every device".to_owned(),
            });
        }
        Some(flag)
    }
}

/// `host_namespaces`: namespace names; any is a danger.
pub(in crate::profile) struct HostNamespaces;

impl Reads<Vec<String>> for HostNamespaces {
    fn read(walk: &mut Walk, node: &Node, field: &str) -> Option<Vec<String>> {
        let entries = walk.strings(node, field, |text| {
            if NAMESPACES.contains(&text) {
                Ok(text.to_owned())
            } else {
                Err(format!(
                    "{text:?} is not a namespace; write {}",
                    one_of(&NAMESPACES)
                ))
            }
        })?;
        if !entries.is_empty() {
            let names: Vec<&str> = entries.iter().map(|(name, _)| name.as_str()).collect();
            walk.dangers.push(Asked {
                danger: Danger::HostNamespaces,
                at: node.at.clone(),
                field: field.to_owned(),
                what: format!("sharing the host's {} namespace(s)", names.join(", ")),
            });
        }
        Some(entries.into_iter().map(|(name, _)| name).collect())
    }
}

/// `devices`: paths under `/dev`; any is a danger.
pub(in crate::profile) struct Devices;

impl Reads<Vec<PathBuf>> for Devices {
    fn read(walk: &mut Walk, node: &Node, field: &str) -> Option<Vec<PathBuf>> {
        let entries = walk.strings(node, field, |text| {
            let path = Path::new(text);
            if is_clean_absolute(path) && path.starts_with("/dev") && path != Path::new("/dev") {
                Ok(text.to_owned())
            } else {
                Err(format!(
                    "{text:?} is not a device; write a path under /dev like \"/dev/fuse\""
                ))
            }
        })?;
        if !entries.is_empty() {
            walk.dangers.push(Asked {
                danger: Danger::Devices,
                at: node.at.clone(),
                field: field.to_owned(),
                what: "host devices are reachable from the unit".to_owned(),
            });
        }
        Some(
            entries
                .into_iter()
                .map(|(name, _)| PathBuf::from(name))
                .collect(),
        )
    }
}
