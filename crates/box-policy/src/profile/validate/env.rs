//! The `[env]` table: variables set, passed and handed through as secrets.

use std::collections::BTreeMap;

use super::super::error::Problem;
use super::super::fields::{ENV, SECRET};
use super::super::model::EnvPolicy;
use super::super::tree::{Node, Value};
use super::super::value::{check_env_name, looks_like_credential};
use super::Walk;

impl Walk {
    pub(super) fn env(&mut self, node: Option<&Node>) -> Option<EnvPolicy> {
        let Some(node) = node else {
            return Some(EnvPolicy::default());
        };
        let fields = self.table(node, "env", &ENV.names());
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
