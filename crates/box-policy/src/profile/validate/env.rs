//! The `[env]` table's readers beyond a type (declared in `fields.rs`):
//! variables set, passed and handed through as secrets, each name a
//! variable's, and no variable both passed and a secret.

use std::collections::BTreeMap;

use super::super::error::Problem;
use super::super::kinds::{Kind, Reads};
use super::super::model::{EnvPolicy, Secret};
use super::super::tree::{Node, Value};
use super::super::value::{check_env_name, looks_like_credential};
use super::Walk;
use crate::profile::fields::SECRET;

impl Walk {
    /// `[env]` (absent: nothing set, passed or handed through), read by its
    /// rows in `fields.rs`, then each secret checked against `pass`.
    pub(super) fn env(&mut self, node: Option<&Node>) -> Option<EnvPolicy> {
        let env = EnvPolicy::read(self, node, "env")?;
        let secrets = node.and_then(|node| node.get("secrets"));
        for secret in &env.secrets {
            if env.pass.contains(&secret.name)
                && let Some(item) = secrets.and_then(|node| secret_node(node, &secret.name))
            {
                self.problem(
                    item,
                    "env.secrets",
                    format!("{:?} is also in env.pass; name it in one list", secret.name),
                );
            }
        }
        Some(env)
    }

    /// `env.secrets`: each entry a name, or `{name = "NAME", as_env = true}`
    /// (the value also reaches the executor's children as a variable).
    pub(super) fn secrets<'n>(&mut self, node: &'n Node) -> Option<Vec<(String, bool, &'n Node)>> {
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
                    let fields = self.table(item, FIELD, &SECRET.names());
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
}

/// The node naming secret `name` in `env.secrets` (a name, or a table's `name`).
fn secret_node<'n>(secrets: &'n Node, name: &str) -> Option<&'n Node> {
    let Value::Array(items) = &secrets.value else {
        return None;
    };
    items
        .iter()
        .map(|item| match &item.value {
            Value::Table(_) => item.get("name").unwrap_or(item),
            _ => item,
        })
        .find(|node| matches!(&node.value, Value::String(text) if text == name))
}

/// `set`: `NAME = "value"`, each name a variable's. A name or value that is
/// not is a problem; the others are still read (the profile is refused).
impl Kind for BTreeMap<String, String> {
    fn read(walk: &mut Walk, node: &Node, field: &str) -> Option<Self> {
        let Value::Table(items) = &node.value else {
            walk.wrong_type(node, field, "a table of NAME = \"value\"");
            // Reported; the rest of `[env]` is still judged (`pass` against `secrets`).
            return Some(BTreeMap::new());
        };
        let mut set = BTreeMap::new();
        for (key, value) in items {
            let entry = format!("{field}.{}", key.name);
            if let Err(message) = check_env_name(&key.name) {
                walk.problems
                    .push(Problem::new(key.at.clone(), &entry, &message));
            }
            if let Some(text) = walk.string(value, &entry) {
                set.insert(key.name.clone(), text);
            }
        }
        Some(set)
    }

    fn word(&self) -> serde_json::Value {
        serde_json::json!(self)
    }

    fn text(&self) -> String {
        let names: Vec<&str> = self.keys().map(String::as_str).collect();
        names.join(", ")
    }
}

/// `pass`: variables' names, none of which looks like a credential (those
/// are handed through under `env.secrets`).
pub(in crate::profile) struct Pass;

impl Reads<Vec<String>> for Pass {
    fn read(walk: &mut Walk, node: &Node, field: &str) -> Option<Vec<String>> {
        let names = |text: &str| check_env_name(text).map(|()| text.to_owned());
        let entries = walk.strings(node, field, names)?;
        let mut pass = Vec::new();
        for (name, item) in entries {
            if looks_like_credential(&name) {
                walk.problem(
                    item,
                    field,
                    format!(
                        "{name:?} looks like a credential; hand it through under env.secrets if you mean to"
                    ),
                );
            }
            pass.push(name);
        }
        Some(pass)
    }
}

/// `secrets`: names, or `{name, as_env}` tables.
impl Kind for Vec<Secret> {
    const LIST: bool = true;

    fn read(walk: &mut Walk, node: &Node, _field: &str) -> Option<Self> {
        let entries = walk.secrets(node)?;
        Some(
            entries
                .into_iter()
                .map(|(name, as_env, _)| Secret { name, as_env })
                .collect(),
        )
    }

    fn word(&self) -> serde_json::Value {
        serde_json::json!(
            self.iter()
                .map(|secret| secret.name.as_str())
                .collect::<Vec<_>>()
        )
    }

    fn text(&self) -> String {
        let names: Vec<&str> = self.iter().map(|secret| secret.name.as_str()).collect();
        names.join(", ")
    }
}

/// `[env]`: its table, then its lists checked against each other.
pub(in crate::profile) struct Environment;

impl Reads<EnvPolicy> for Environment {
    fn read(walk: &mut Walk, node: &Node, _field: &str) -> Option<EnvPolicy> {
        walk.env(Some(node))
    }
}
