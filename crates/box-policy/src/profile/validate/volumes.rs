//! `[[volume]]` tables (declared in `fields.rs`): the workspace unit's
//! volumes and where they may go. The readers here are a volume's that
//! depend on what is around it: its name (unique) and its place (not over
//! the workspace or another volume).

use std::path::{Component, Path, PathBuf};

use super::super::kinds::{After, Kind, Reads};
use super::super::model::{Source, Workspace};
use super::super::tree::{Node, Value};
use super::{Walk, is_clean_absolute};
use crate::plan::{Volume, VolumePath};

/// What a `[[volume]]` is read within: where the workspace appears (when
/// it was read) and the volumes before it.
pub(in crate::profile) struct VolumeContext {
    root: Option<PathBuf>,
    volumes: Vec<Volume>,
}

/// What to write for a volume's place.
const ACCEPTED: &str = "write \"~/\" and a path beneath the unit's home (\"~/.cache/pip\"), or an absolute path (\"/var/cache/box/pip\")";

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
        if matches!(node.value, Value::Array(_))
            && workspace.is_some_and(|workspace| workspace.source == Source::None)
        {
            self.problem(
                node,
                "volume",
                "volumes are the workspace unit's, and source = \"none\" has none; remove the [[volume]] tables or give the profile a workspace".to_owned(),
            );
            return Vec::new();
        }
        let root = workspace.map(|workspace| workspace.root.clone());
        self.each(node, "volume", |walk, item, label, volumes: &[Volume]| {
            let context = VolumeContext {
                root: root.clone(),
                volumes: volumes.to_vec(),
            };
            Volume::read_in(walk, item, label, &context)
        })
    }
}

/// A volume's `name`: unique.
pub(in crate::profile) struct VolumeName;

impl Reads<String, VolumeContext> for VolumeName {
    fn read_in(
        walk: &mut Walk,
        node: &Node,
        field: &str,
        context: &VolumeContext,
    ) -> Option<String> {
        let name = walk.string(node, field)?;
        let valid = name.len() <= 40
            && name.starts_with(|c: char| c.is_ascii_lowercase())
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if !valid {
            walk.problem(
                node,
                field,
                format!("{name:?} is not a volume name; write lower-case letters, digits and -, starting with a letter, at most 40, like \"pip-cache\""),
            );
            return None;
        }
        if context.volumes.iter().any(|volume| volume.name == name) {
            walk.problem(
                node,
                field,
                format!("a volume named {name:?} is declared twice"),
            );
            return None;
        }
        Some(name)
    }
}

/// A volume's `path`, as [`VolumePath`] reads it, and not in or around the
/// workspace or another volume.
pub(in crate::profile) struct VolumeAt;

impl Reads<VolumePath, VolumeContext> for VolumeAt {
    fn read_in(
        walk: &mut Walk,
        node: &Node,
        field: &str,
        context: &VolumeContext,
    ) -> Option<VolumePath> {
        let path = VolumePath::read(walk, node, field)?;
        let text = match &node.value {
            Value::String(text) => text.clone(),
            _ => path.to_string(),
        };
        if let (VolumePath::Absolute(path), Some(root)) = (&path, &context.root)
            && (path.starts_with(root) || root.starts_with(path))
        {
            walk.problem(
                node,
                field,
                format!("{text:?} overlaps the workspace at {}; a volume goes beside it, never in or around it", root.display()),
            );
            return None;
        }
        let overlap = context
            .volumes
            .iter()
            .find(|other| match (&other.path, &path) {
                (VolumePath::Home(a), VolumePath::Home(b))
                | (VolumePath::Absolute(a), VolumePath::Absolute(b)) => {
                    a.starts_with(b) || b.starts_with(a)
                }
                (VolumePath::Home(_), VolumePath::Absolute(_))
                | (VolumePath::Absolute(_), VolumePath::Home(_)) => false,
            });
        if let Some(other) = overlap {
            walk.problem(
                node,
                field,
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

/// A volume's place in the unit: `~/REL` beneath the unit's home, or an
/// absolute path where a mount of the unit's own makes sense (not the
/// kernel's or box's own places, not `/tmp` or the secrets).
impl Kind for VolumePath {
    fn read(walk: &mut Walk, node: &Node, field: &str) -> Option<Self> {
        let text = walk.string(node, field)?;
        match text.strip_prefix("~/") {
            Some(relative) => {
                let relative = PathBuf::from(relative);
                let clean = relative.components().count() > 0
                    && relative
                        .components()
                        .all(|part| matches!(part, Component::Normal(_)));
                if !clean {
                    walk.problem(node, field, format!("{text:?} is not a path beneath the home; {ACCEPTED}, with no . or .. parts"));
                    return None;
                }
                Some(VolumePath::Home(relative))
            }
            None => {
                let path = PathBuf::from(&text);
                if !is_clean_absolute(&path) || path == Path::new("/") {
                    walk.problem(
                        node,
                        field,
                        format!("{text:?} is not accepted; {ACCEPTED}, with no . or .. parts"),
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
                        walk.problem(
                            node,
                            field,
                            format!(
                                "{text:?} is, or is inside or around, {what}; {ACCEPTED} elsewhere"
                            ),
                        );
                        return None;
                    }
                }
                Some(VolumePath::Absolute(path))
            }
        }
    }

    fn text(&self) -> String {
        self.to_string()
    }
}

/// `[[volume]]` tables, after the workspace (beside its root).
pub(in crate::profile) struct Volumes;

impl Reads<Vec<Volume>> for Volumes {}

impl After<Vec<Volume>, (&Option<Workspace>,)> for Volumes {
    fn read_after(
        walk: &mut Walk,
        node: Option<&Node>,
        _field: &str,
        (workspace,): (&Option<Workspace>,),
    ) -> Option<Vec<Volume>> {
        Some(walk.volumes(node, workspace.as_ref()))
    }
}

/// The workspace unit's volumes (alone: with no workspace to stay beside).
impl Kind for Vec<Volume> {
    const LIST: bool = true;

    fn read(walk: &mut Walk, node: &Node, _field: &str) -> Option<Self> {
        Some(walk.volumes(Some(node), None))
    }

    fn text(&self) -> String {
        let names: Vec<&str> = self.iter().map(|volume| volume.name.as_str()).collect();
        names.join(", ")
    }

    fn word(&self) -> serde_json::Value {
        serde_json::Value::Array(self.iter().map(Volume::plan_json).collect())
    }
}
