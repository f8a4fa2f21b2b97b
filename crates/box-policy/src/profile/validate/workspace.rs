//! The `[workspace]` table's readers beyond a type (declared in `fields.rs`):
//! its image, images, pull secret, root, source, user and runtime; the
//! image, pull secret and runtime checks `[[server]]` shares.

use std::path::{Path, PathBuf};

use super::super::kinds::{Kind, Reads};
use super::super::model::{Source, UserChoice};
use super::super::tree::{Node, Value};
use super::super::value::check_env_name;
use super::{Walk, is_clean_absolute};
use crate::image::ImageRef;
use crate::plan::UserIds;

/// `image`: an image reference.
pub(in crate::profile) struct Image;

impl<C> Reads<String, C> for Image {
    fn read(walk: &mut Walk, node: &Node, field: &str) -> Option<String> {
        walk.image(node, field)
    }
}

/// `images`: image references.
pub(in crate::profile) struct Images;

impl Reads<Vec<String>> for Images {
    fn read(walk: &mut Walk, node: &Node, field: &str) -> Option<Vec<String>> {
        let images = walk.strings(node, field, |text| {
            ImageRef::parse(text).map(|_| text.to_owned())
        })?;
        Some(images.into_iter().map(|(image, _)| image).collect())
    }
}

/// `pull_secret`: a host variable's name (the workspace's, a server's).
pub(in crate::profile) struct PullSecret;

impl<C> Reads<Option<String>, C> for PullSecret {
    fn read(walk: &mut Walk, node: &Node, field: &str) -> Option<Option<String>> {
        walk.pull_secret(node, field).map(Some)
    }
}

/// `runtime`: an OCI runtime's name.
pub(in crate::profile) struct Runtime;

impl<C> Reads<Option<String>, C> for Runtime {
    fn read(walk: &mut Walk, node: &Node, field: &str) -> Option<Option<String>> {
        walk.runtime(node, field).map(Some)
    }
}

/// `root`: an absolute path in the unit other than `/`.
pub(in crate::profile) struct Root;

impl Reads<PathBuf> for Root {
    fn read(walk: &mut Walk, node: &Node, _field: &str) -> Option<PathBuf> {
        walk.unit_root(node)
    }
}

impl Kind for Source {
    fn read(walk: &mut Walk, node: &Node, _field: &str) -> Option<Self> {
        walk.source(node)
    }

    fn text(&self) -> String {
        match self {
            Source::Cwd => "cwd".to_owned(),
            Source::Fork => "fork".to_owned(),
            Source::Host(path) => path.display().to_string(),
            Source::Empty => "empty".to_owned(),
            Source::None => "none".to_owned(),
        }
    }
}

impl Kind for UserChoice {
    fn read(walk: &mut Walk, node: &Node, _field: &str) -> Option<Self> {
        walk.user(node)
    }

    fn text(&self) -> String {
        match self {
            UserChoice::Ids(ids) => format!("{}:{}", ids.uid, ids.gid),
            UserChoice::Host => "host".to_owned(),
            UserChoice::Image => "image".to_owned(),
        }
    }
}

impl Walk {
    /// An image reference (`ImageRef`): a malformed tag or digest is refused here.
    pub(in crate::profile) fn image(&mut self, node: &Node, field: &str) -> Option<String> {
        let text = self.string(node, field)?;
        match ImageRef::parse(&text) {
            Ok(_) => Some(text),
            Err(message) => {
                self.problem(node, field, message);
                None
            }
        }
    }

    /// `pull_secret`: the name of a host variable holding the registry's
    /// `user:password`. Only the name is policy; the value is read when a
    /// pull needs it, handed to the engine alone and redacted everywhere.
    pub(in crate::profile) fn pull_secret(&mut self, node: &Node, field: &str) -> Option<String> {
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

    /// An OCI runtime's name as the engine knows it (`runsc`, `runc`, `kata`).
    pub(in crate::profile) fn runtime(&mut self, node: &Node, field: &str) -> Option<String> {
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

    pub(in crate::profile) fn unit_root(&mut self, node: &Node) -> Option<PathBuf> {
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

    pub(in crate::profile) fn source(&mut self, node: &Node) -> Option<Source> {
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

    pub(in crate::profile) fn user(&mut self, node: &Node) -> Option<UserChoice> {
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
