//! `[[server]]` tables: server units, each with its own image, command,
//! network and limits.

use super::super::fields::{SERVER, Scope};
use super::super::kinds::Kind;
use super::super::model::{LimitsPolicy, Server, defaults};
use super::super::tree::{Node, Value};
use super::{Walk, join};
use crate::image::PullPolicy;
use crate::plan::LocalUserland;

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
            let fields = self.table(item, &label, &SERVER.names());
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
            let local_userland = match fields.get("local_userland") {
                Some(node) => LocalUserland::read(self, node, &join(&label, "local_userland")),
                None => Some(LocalUserland::default()),
            };
            let pull = match fields.get("pull") {
                Some(node) => PullPolicy::read(self, node, &join(&label, "pull")),
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
                Scope::Unit,
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

    /// A server's name: unique, not `workspace`.
    pub(super) fn server_name(
        &mut self,
        node: &Node,
        label: &str,
        servers: &[Server],
    ) -> Option<String> {
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
