//! The `[workspace]` table: the workspace unit's image, source, root, mode,
//! user, runtime and how it treats persisted credentials and forks; the
//! image, pull and runtime checks `[[server]]` shares.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::super::fields::WORKSPACE;
use super::super::model::{ForkMode, OnPersisted, Source, UserChoice, Workspace, defaults};
use super::super::tree::{Node, Value};
use super::super::value::check_env_name;
use super::{Fields, Walk, is_clean_absolute, join};
use crate::image::{ImageRef, PullPolicy};
use crate::plan::{LocalUserland, MountMode, UserIds};

impl Walk {
    pub(super) fn workspace(&mut self, node: Option<&Node>) -> Option<Workspace> {
        let fields = match node {
            Some(node) => self.table(node, "workspace", &WORKSPACE.names()),
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
    pub(super) fn image(&mut self, node: &Node, field: &str) -> Option<String> {
        let text = self.string(node, field)?;
        match ImageRef::parse(&text) {
            Ok(_) => Some(text),
            Err(message) => {
                self.problem(node, field, message);
                None
            }
        }
    }

    pub(super) fn pull(&mut self, node: &Node, field: &str) -> Option<PullPolicy> {
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
    pub(super) fn pull_secret(&mut self, node: &Node, field: &str) -> Option<String> {
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
    pub(super) fn local_userland(
        &mut self,
        node: Option<&Node>,
        unit: &str,
    ) -> Option<LocalUserland> {
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
    pub(super) fn runtime(&mut self, node: &Node, field: &str) -> Option<String> {
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

    pub(super) fn unit_root(&mut self, node: &Node) -> Option<PathBuf> {
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

    pub(super) fn source(&mut self, node: &Node) -> Option<Source> {
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

    pub(super) fn user(&mut self, node: &Node) -> Option<UserChoice> {
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
}
