//! From a merged, located tree to a [`Profile`]: unknown fields, wrong types
//! and impossible values are problems naming the file, line, column and field,
//! what was given and what would be accepted. Every problem is collected, so
//! `box profile check` can print them all. Dangerous asks are refused here
//! unless `[operator] allow_dangerous` names them.

use std::collections::BTreeMap;
use std::path::{Component, Path};

use super::error::Problem;
use super::fields::TopLevel;
use super::kinds::one_of;
use super::model::Profile;
use super::tree::{Node, Value};
use danger::Asked;
pub(super) use danger::Operator;
pub(crate) use danger::{Allowance, host_path_dangers};
pub(super) use env::{Environment, Pass};
pub(super) use limits::{Lease, PoolSize};
pub(super) use security::{Capabilities, Devices, HostNamespaces, Privileged};
pub(super) use servers::{
    Command, Network, ServerContext, ServerName, Servers, SessionLimits, UnitLimits,
};
pub(super) use volumes::{VolumeAt, VolumeContext, VolumeName, Volumes};
pub(super) use workspace::{Image, Images, PullSecret, Root, Runtime};

mod danger;
mod env;
mod limits;
mod network;
mod security;
mod servers;
mod volumes;
mod workspace;

/// Validate the merged tree of profile `name` (loaded from `origin`, extending `extends`).
pub(crate) fn validate(
    name: &str,
    origin: &str,
    extends: Vec<String>,
    root: &Node,
) -> Result<Profile, Vec<Problem>> {
    let mut walk = Walk::default();
    let top = TopLevel::read_in(&mut walk, root, "", &());
    let (Some(top), true) = (top, walk.problems.is_empty()) else {
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
        description: top.description,
        origin: origin.to_owned(),
        extends,
        workspace: top.workspace,
        network: top.network,
        limits: top.limits,
        env: top.env,
        security: top.security,
        lifecycle: top.lifecycle,
        pool: top.pool,
        servers: top.servers,
        volumes: top.volumes,
        dangerous: top.dangerous,
    })
}

/// The entries of a table node, by name (unknown ones already reported).
pub(super) struct Fields<'a> {
    entries: BTreeMap<&'a str, &'a Node>,
}

impl<'a> Fields<'a> {
    pub(super) fn get(&self, name: &str) -> Option<&'a Node> {
        self.entries.get(name).copied()
    }
}

/// A profile's tree being read: the problems and the dangers found so far.
#[derive(Default)]
pub(super) struct Walk {
    problems: Vec<Problem>,
    dangers: Vec<Asked>,
}

pub(super) fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_owned()
    } else {
        format!("{parent}.{name}")
    }
}

impl Walk {
    pub(super) fn problem(&mut self, node: &Node, field: &str, message: String) {
        self.problems
            .push(Problem::new(node.at.clone(), field, &message));
    }

    pub(super) fn wrong_type(&mut self, node: &Node, field: &str, expected: &str) {
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
    pub(super) fn table<'a>(
        &mut self,
        node: &'a Node,
        field: &str,
        accepted: &[&str],
    ) -> Fields<'a> {
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

    /// An array of tables (`[[server]]`, `[[volume]]` at `path`), each
    /// labelled by its name (`server[fetch]`; else its index) and read by
    /// `read` after those before it; one that is not read is left out.
    pub(super) fn each<T>(
        &mut self,
        node: &Node,
        path: &str,
        read: impl Fn(&mut Walk, &Node, &str, &[T]) -> Option<T>,
    ) -> Vec<T> {
        let Value::Array(items) = &node.value else {
            self.wrong_type(
                node,
                path,
                &format!("an array of tables, written [[{path}]]"),
            );
            return Vec::new();
        };
        let mut read_so_far = Vec::new();
        for (index, item) in items.iter().enumerate() {
            let label = match item.get("name").map(|name| &name.value) {
                Some(Value::String(name)) => format!("{path}[{name}]"),
                _ => format!("{path}[{index}]"),
            };
            if let Some(value) = read(self, item, &label, &read_so_far) {
                read_so_far.push(value);
            }
        }
        read_so_far
    }

    pub(super) fn string(&mut self, node: &Node, field: &str) -> Option<String> {
        match &node.value {
            Value::String(text) => Some(text.clone()),
            _ => {
                self.wrong_type(node, field, "a string");
                None
            }
        }
    }

    pub(super) fn boolean(&mut self, node: &Node, field: &str) -> Option<bool> {
        match node.value {
            Value::Boolean(flag) => Some(flag),
            _ => {
                self.wrong_type(node, field, "true or false");
                None
            }
        }
    }

    pub(super) fn choice<T: Copy>(
        &mut self,
        node: &Node,
        field: &str,
        choices: &[(&str, T)],
    ) -> Option<T> {
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
    pub(super) fn strings<'n>(
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
