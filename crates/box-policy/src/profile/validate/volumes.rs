//! `[[volume]]` tables: the workspace unit's volumes and where they may go.

use std::path::{Component, Path, PathBuf};

use super::super::fields::VOLUME;
use super::super::kinds::Kind;
use super::super::model::{Source, Workspace};
use super::super::tree::{Node, Value};
use super::{Walk, is_clean_absolute, join};
use crate::plan::{Volume, VolumePath, VolumeScope};

impl Walk {
    /// `[[volume]]` tables: the workspace unit's volumes.
    pub(super) fn volumes(
        &mut self,
        node: Option<&Node>,
        workspace: Option<&Workspace>,
    ) -> Vec<Volume> {
        let Some(node) = node else {
            return Vec::new();
        };
        let Value::Array(items) = &node.value else {
            self.wrong_type(node, "volume", "an array of tables, written [[volume]]");
            return Vec::new();
        };
        if workspace.is_some_and(|workspace| workspace.source == Source::None) {
            self.problem(
                node,
                "volume",
                "volumes are the workspace unit's, and source = \"none\" has none; remove the [[volume]] tables or give the profile a workspace".to_owned(),
            );
            return Vec::new();
        }
        let mut volumes: Vec<Volume> = Vec::new();
        for (index, item) in items.iter().enumerate() {
            let label = match item.get("name").map(|name| &name.value) {
                Some(Value::String(name)) => format!("volume[{name}]"),
                _ => format!("volume[{index}]"),
            };
            let fields = self.table(item, &label, &VOLUME.names());
            let name = match fields.get("name") {
                Some(node) => self.volume_name(node, &label, &volumes),
                None => {
                    self.problem(
                        item,
                        &label,
                        "a volume needs a name, like name = \"pip-cache\"".to_owned(),
                    );
                    None
                }
            };
            let path = match fields.get("path") {
                Some(node) => self.volume_path(node, &label, workspace, &volumes),
                None => {
                    self.problem(
                        item,
                        &label,
                        "a volume needs a path in the unit, like path = \"~/.cache/pip\""
                            .to_owned(),
                    );
                    None
                }
            };
            let scope = match fields.get("scope") {
                Some(node) => VolumeScope::read(self, node, &join(&label, "scope")),
                None => Some(VolumeScope::Session),
            };
            if let (Some(name), Some(path), Some(scope)) = (name, path, scope) {
                volumes.push(Volume { name, path, scope });
            }
        }
        volumes
    }

    pub(super) fn volume_name(
        &mut self,
        node: &Node,
        label: &str,
        volumes: &[Volume],
    ) -> Option<String> {
        let field = join(label, "name");
        let name = self.string(node, &field)?;
        let valid = name.len() <= 40
            && name.starts_with(|c: char| c.is_ascii_lowercase())
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if !valid {
            self.problem(
                node,
                &field,
                format!("{name:?} is not a volume name; write lower-case letters, digits and -, starting with a letter, at most 40, like \"pip-cache\""),
            );
            return None;
        }
        if volumes.iter().any(|volume| volume.name == name) {
            self.problem(
                node,
                &field,
                format!("a volume named {name:?} is declared twice"),
            );
            return None;
        }
        Some(name)
    }

    /// A volume's place in the unit: `~/REL` beneath the unit's home, or an
    /// absolute path where a mount of the unit's own makes sense (not the
    /// kernel's or box's own places, not `/tmp`, the secrets or the
    /// workspace, not inside or around another volume).
    pub(super) fn volume_path(
        &mut self,
        node: &Node,
        label: &str,
        workspace: Option<&Workspace>,
        volumes: &[Volume],
    ) -> Option<VolumePath> {
        let field = join(label, "path");
        let text = self.string(node, &field)?;
        let accepted = "write \"~/\" and a path beneath the unit's home (\"~/.cache/pip\"), or an absolute path (\"/var/cache/box/pip\")";
        let path = match text.strip_prefix("~/") {
            Some(relative) => {
                let relative = PathBuf::from(relative);
                let clean = relative.components().count() > 0
                    && relative
                        .components()
                        .all(|part| matches!(part, Component::Normal(_)));
                if !clean {
                    self.problem(node, &field, format!("{text:?} is not a path beneath the home; {accepted}, with no . or .. parts"));
                    return None;
                }
                VolumePath::Home(relative)
            }
            None => {
                let path = PathBuf::from(&text);
                if !is_clean_absolute(&path) || path == Path::new("/") {
                    self.problem(
                        node,
                        &field,
                        format!("{text:?} is not accepted; {accepted}, with no . or .. parts"),
                    );
                    return None;
                }
                let reserved = [
                    ("/proc", "the kernel's /proc"),
                    ("/sys", "the kernel's /sys"),
                    ("/dev", "the kernel's /dev"),
                    ("/.box", "box's own /.box (its executor, its init's socket)"),
                    ("/tmp", "the unit's own /tmp (limits.tmp)"),
                    (
                        crate::executor::SECRETS_DIR,
                        "/run/secrets, where the unit's secrets are delivered",
                    ),
                ];
                for (place, what) in reserved {
                    if path.starts_with(place) || Path::new(place).starts_with(&path) {
                        self.problem(
                            node,
                            &field,
                            format!(
                                "{text:?} is, or is inside or around, {what}; {accepted} elsewhere"
                            ),
                        );
                        return None;
                    }
                }
                if let Some(root) = workspace.map(|workspace| &workspace.root)
                    && (path.starts_with(root) || root.starts_with(&path))
                {
                    self.problem(
                        node,
                        &field,
                        format!("{text:?} overlaps the workspace at {}; a volume goes beside it, never in or around it", root.display()),
                    );
                    return None;
                }
                VolumePath::Absolute(path)
            }
        };
        let overlap = volumes.iter().find(|other| match (&other.path, &path) {
            (VolumePath::Home(a), VolumePath::Home(b))
            | (VolumePath::Absolute(a), VolumePath::Absolute(b)) => {
                a.starts_with(b) || b.starts_with(a)
            }
            (VolumePath::Home(_), VolumePath::Absolute(_))
            | (VolumePath::Absolute(_), VolumePath::Home(_)) => false,
        });
        if let Some(other) = overlap {
            self.problem(
                node,
                &field,
                format!(
                    "{text:?} overlaps volume {:?} at {}; give each volume a place of its own",
                    other.name, other.path
                ),
            );
            return None;
        }
        Some(path)
    }
}
