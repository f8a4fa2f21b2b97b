//! The `[security]` table: the hardening of every unit, and the dangers it can ask for.

use std::path::{Path, PathBuf};

use super::super::fields::SECURITY;
use super::super::model::{Danger, SecurityPolicy};
use super::super::tree::Node;
use super::super::value::{KNOWN_CAPABILITIES, NAMESPACES, REVIEWED_CAPABILITIES};
use super::danger::Asked;
use super::{Walk, is_clean_absolute, one_of};
use crate::plan::{Requirement, TmpMode};

impl Walk {
    pub(super) fn security(&mut self, node: Option<&Node>) -> Option<SecurityPolicy> {
        let mut security = SecurityPolicy::strict();
        let Some(node) = node else {
            return Some(security);
        };
        let fields = self.table(node, "security", &SECURITY.names());
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

    pub(super) fn capabilities(&mut self, node: &Node) -> Option<Vec<String>> {
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
}
