//! `box/fork`, `box/merge` and `box/discard`: a session's child units, each
//! on its own fork of a workspace unit's host directory (box-fork), started
//! like any unit, merged back all or nothing, removed with their storage.
//!
//! Storage: `<fork_dir>/<instance>/<session>/<unit>` (the host's
//! [`HostConfig::fork_dir`]), a directory box owns; it is removed when the
//! child is discarded or the session ends. Merges are serialized per parent
//! across the host by box-fork's lock files in `<fork_dir>/locks`.
//!
//! git runs only through [`HostConfig::fork_git`], the runner the binary
//! confines (`box confine`); without one, forks are copies.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use box_backend::ObjectsPlace;
use box_fork::{Base, Mechanism, Mode};
use box_jsonrpc::{code, params};

use super::HostConfig;

/// A child unit's fork: where it lives and what a merge needs.
#[derive(Debug, Clone)]
pub struct ChildFork {
    /// The unit it was forked from (`workspace`, or another child).
    pub parent: String,
    /// The parent's host directory (what a merge writes).
    pub parent_path: PathBuf,
    /// The child's host directory (its unit's workspace).
    pub path: PathBuf,
    /// The fork's base; a merge moves it forward.
    pub base: Arc<Mutex<Base>>,
    /// The mechanism used.
    pub mode: Mechanism,
    /// What it shares with the parent, in a sentence.
    pub shares: String,
    /// The label the client gave.
    pub label: Option<String>,
    /// The directory holding `path`, removed after it: a warm unit's, whose
    /// pool made it (`<fork_dir>/<instance>/pool-N`); `None`: the session's,
    /// removed when the session ends.
    pub holder: Option<PathBuf>,
}

/// `box/fork`'s parameters, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForkAsk {
    /// The unit forked.
    pub from: String,
    /// The mechanism asked.
    pub mode: Mode,
    /// Worktree mode: bring the parent's uncommitted state.
    pub dirty: bool,
    /// A writable child.
    pub writable: bool,
    /// A label for people.
    pub label: Option<String>,
    /// A further narrowing of the session's plan for the child (the
    /// tightening JSON a session sends at initialize).
    pub tighten: Option<Value>,
}

/// Read `box/fork`'s parameters; the error names the parameter.
pub fn fork_ask(message: &Value) -> Result<ForkAsk, String> {
    let params = params(message);
    let known = [
        "from", "mode", "dirty", "writable", "label", "tighten", "_meta",
    ];
    if let Some(unknown) = params.and_then(|p| p.keys().find(|key| !known.contains(&key.as_str())))
    {
        return Err(format!(
            "box/fork: unknown parameter `{unknown}`; it takes {}",
            known[..6].join(", ")
        ));
    }
    let get = |name: &str| params.and_then(|p| p.get(name)).filter(|v| !v.is_null());
    let from = match get("from") {
        None => "workspace".to_owned(),
        Some(Value::String(from)) => from.clone(),
        Some(other) => return Err(format!("box/fork: from: expected a unit name, got {other}")),
    };
    let mode = match get("mode") {
        None => Mode::Auto,
        Some(Value::String(mode)) => match mode.as_str() {
            "auto" => Mode::Auto,
            "worktree" => Mode::Worktree,
            "copy" => Mode::Copy,
            other => {
                return Err(format!(
                    "box/fork: mode: `{other}` is not one of auto, worktree, copy"
                ));
            }
        },
        Some(other) => {
            return Err(format!(
                "box/fork: mode: expected auto, worktree or copy, got {other}"
            ));
        }
    };
    let flag = |name: &str| match get(name) {
        None => Ok(true),
        Some(Value::Bool(value)) => Ok(*value),
        Some(other) => Err(format!(
            "box/fork: {name}: expected true or false, got {other}"
        )),
    };
    let label = match get("label") {
        None => None,
        Some(Value::String(label)) if label.len() <= 200 => Some(label.clone()),
        Some(Value::String(_)) => {
            return Err("box/fork: label: at most 200 bytes".to_owned());
        }
        Some(other) => return Err(format!("box/fork: label: expected a string, got {other}")),
    };
    let tighten = match get("tighten") {
        None => None,
        Some(Value::Object(object)) if object.is_empty() => None,
        Some(tighten @ Value::Object(_)) => Some(tighten.clone()),
        Some(other) => {
            return Err(format!(
                "box/fork: tighten: expected an object like initialize's box.tighten, got {other}"
            ));
        }
    };
    Ok(ForkAsk {
        tighten,
        from,
        mode,
        dirty: flag("dirty")?,
        writable: flag("writable")?,
        label,
    })
}

/// `box/merge`'s and `box/discard`'s `unit`, and merge's `theirs`.
pub fn unit_param(method: &str, message: &Value, allowed: &[&str]) -> Result<String, String> {
    let params = params(message);
    if let Some(unknown) = params.and_then(|p| {
        p.keys()
            .find(|key| key.as_str() != "_meta" && !allowed.contains(&key.as_str()))
    }) {
        return Err(format!(
            "{method}: unknown parameter `{unknown}`; it takes {}",
            allowed.join(", ")
        ));
    }
    match params.and_then(|p| p.get("unit")) {
        Some(Value::String(unit)) => Ok(unit.clone()),
        None => Err(format!(
            "{method}: `unit` (the child's name, as box/fork answered) is required"
        )),
        Some(other) => Err(format!("{method}: unit: expected a unit name, got {other}")),
    }
}

/// Whether `box/merge` asked `theirs`.
pub fn theirs(message: &Value) -> Result<bool, String> {
    match params(message).and_then(|p| p.get("theirs")) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(theirs)) => Ok(*theirs),
        Some(other) => Err(format!(
            "box/merge: theirs: expected true or false, got {other}"
        )),
    }
}

/// The directory holding `session`'s children.
pub fn session_dir(config: &HostConfig, session: &str) -> PathBuf {
    config
        .fork_dir
        .join(safe_name(&config.instance))
        .join(safe_name(session))
}

/// Where merges into one parent are serialized across the host.
pub fn lock_dir(config: &HostConfig) -> PathBuf {
    config.fork_dir.join("locks")
}

/// A name made safe as one path component.
fn safe_name(name: &str) -> String {
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .take(100)
        .collect();
    if safe.is_empty() || safe.chars().all(|c| c == '.') {
        "_".to_owned()
    } else {
        safe
    }
}

/// Make `dir` (a session's forks) and its missing parents: only their owner
/// lists or changes them, anyone may pass through (0711), since a local unit
/// running as the workspace's owner (a root host's unit of a user's
/// checkout) reaches its fork at its host path. box's state directory above
/// `fork_dir`, which another of box's stores may have made owner-only, is
/// made passable too. A fork is as readable as the workspace it copies.
pub fn make_fork_dir(config: &HostConfig, dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o711)
        .create(dir)
        .map_err(|error| format!("creating {}: {error}", dir.display()))?;
    if let Some(state) = config.fork_dir.parent()
        && let Ok(meta) = std::fs::metadata(state)
        && meta.uid() == nix::unistd::geteuid().as_raw()
        && meta.mode() & 0o011 != 0o011
    {
        let mode = (meta.mode() & 0o7777) | 0o011;
        std::fs::set_permissions(state, std::fs::Permissions::from_mode(mode))
            .map_err(|error| format!("letting units pass through {}: {error}", state.display()))?;
    }
    Ok(())
}

/// The git runner for forks: the host's confined one, or one that refuses
/// (copy mode and merges run no git; a copy's discard needs none).
pub fn git(config: &HostConfig) -> box_fork::Git {
    match &config.fork_git {
        Some(git) => git.clone(),
        None => {
            box_fork::Git::new(Vec::<(String, String)>::new()).with_confinement(Arc::new(NoGit))
        }
    }
}

/// A runner that never runs git.
struct NoGit;

impl box_fork::Confine for NoGit {
    fn command(
        &self,
        _program: &Path,
        _access: &box_fork::GitAccess,
    ) -> std::io::Result<std::process::Command> {
        Err(std::io::Error::other(
            "this host has no confined git runner; fork in copy mode",
        ))
    }
}

/// How to fork on this host: the mechanism, and for worktree where a unit of
/// the backend sees the parent's objects (what the child's alternates name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effective {
    /// The mechanism asked of box-fork (`Auto` only where worktree is possible).
    pub mode: Mode,
    /// Where the unit sees the borrowed objects; `None` when the fork cannot
    /// be a worktree.
    pub objects: Option<ObjectsPlace>,
}

/// The mode to fork `spec`'s workspace with on this host: worktree needs the
/// confined git runner and a backend that shows the parent's objects
/// read-only in a unit of `spec` (the backend says where:
/// [`Backend::objects_place`](box_backend::Backend::objects_place)).
pub fn effective_mode(
    config: &HostConfig,
    backend: &dyn box_backend::Backend,
    spec: &box_policy::plan::UnitSpec,
    asked: Mode,
) -> Result<Effective, String> {
    let place = match &config.fork_git {
        None => Err("a confined git runner (none is configured)".to_owned()),
        Some(_) => backend.objects_place(spec).map_err(|why| {
            format!("a backend that shows the parent's git objects read-only in the unit ({why})")
        }),
    };
    match (asked, place) {
        (Mode::Worktree, Err(needs)) => Err(format!(
            "box/fork: mode: worktree needs {needs} on this host; fork with mode copy"
        )),
        (Mode::Auto | Mode::Copy, Err(_)) => Ok(Effective {
            mode: Mode::Copy,
            objects: None,
        }),
        (mode, Ok(place)) => Ok(Effective {
            mode,
            objects: Some(place),
        }),
    }
}

/// Fork `parent` into `child` (blocking; run it off the runtime): a new
/// directory, or with `existing` the empty one a warm unit already mounts.
pub fn make_fork(
    config: &HostConfig,
    parent: &Path,
    child: &Path,
    ask: &ForkAsk,
    effective: &Effective,
    existing: bool,
) -> Result<box_fork::Forked, String> {
    let options = box_fork::Options {
        mode: effective.mode,
        dirty: ask.dirty,
        writable: ask.writable,
        // box-fork's `None` is the parent's host path.
        objects_in_unit: match &effective.objects {
            Some(ObjectsPlace::At(path)) => Some(path.clone()),
            Some(ObjectsPlace::HostPath) | None => None,
        },
    };
    let fork = if existing {
        box_fork::fork_into
    } else {
        box_fork::fork
    };
    let forked = fork(&git(config), parent, child, &options)
        .map_err(|error| format!("box/fork: forking {}: {error}", ask.from))?;
    hand_to_owner(parent, child)
        .map_err(|error| format!("box/fork: handing {} to its owner: {error}", ask.from))?;
    Ok(forked)
}

/// A root host's fork is root's, but a root caller's unit runs as the owner
/// of the directory it forks (`user = "host"`): the fork gets that owner, so
/// the unit can write its own copy and files keep their owner. Links are
/// changed themselves, never followed.
fn hand_to_owner(parent: &Path, child: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt as _;
    if !nix::unistd::geteuid().is_root() {
        return Ok(());
    }
    let owner = std::fs::metadata(parent)?;
    if owner.uid() == 0 {
        return Ok(());
    }
    let (uid, gid) = (Some(owner.uid()), Some(owner.gid()));
    let mut pending = vec![child.to_path_buf()];
    while let Some(path) = pending.pop() {
        std::os::unix::fs::lchown(&path, uid, gid)?;
        if std::fs::symlink_metadata(&path)?.is_dir() {
            for entry in std::fs::read_dir(&path)? {
                pending.push(entry?.path());
            }
        }
    }
    Ok(())
}

/// Remove a child's storage (blocking); logged when it fails.
pub fn remove_storage(config: &HostConfig, child: &ChildFork) {
    let base = match child.base.lock() {
        Ok(base) => base.clone(),
        Err(poisoned) => poisoned.into_inner().clone(),
    };
    if let Err(error) = box_fork::discard(&git(config), &child.path, &base) {
        tracing::error!(path = %child.path.display(), %error, "removing a fork's storage failed");
    }
    if let Some(holder) = &child.holder {
        remove_holder(holder);
    }
}

/// Remove a session's (or a pooled unit's) holder directory under
/// `<fork_dir>/<instance>` and then the instance's directory, each only if
/// empty: the last of an instance's holders to go takes the instance's
/// directory with it, whichever order sessions and pooled units end in.
pub fn remove_holder(holder: &Path) {
    let _ = std::fs::remove_dir(holder);
    if let Some(instance) = holder.parent() {
        let _ = std::fs::remove_dir(instance);
    }
}

/// The mechanism a profile's `fork_mode` asks of box-fork.
pub fn asked_mode(mode: box_policy::profile::ForkMode) -> Mode {
    match mode {
        box_policy::profile::ForkMode::Auto => Mode::Auto,
        box_policy::profile::ForkMode::Worktree => Mode::Worktree,
        box_policy::profile::ForkMode::Copy => Mode::Copy,
    }
}

/// Merge a child into its parent (blocking): the answer's result, or the
/// error's code, message and data (the paths in conflict).
pub fn merge(
    config: &HostConfig,
    unit: &str,
    child: &ChildFork,
    theirs: bool,
) -> Result<Value, (i64, String, Value)> {
    let mut base = match child.base.lock() {
        Ok(base) => base,
        Err(poisoned) => poisoned.into_inner(),
    };
    let options = box_fork::MergeOptions { theirs };
    let relative = |paths: &[PathBuf]| -> Vec<String> {
        paths
            .iter()
            .map(|path| path.to_string_lossy().into_owned())
            .collect()
    };
    match box_fork::merge(
        &child.path,
        &child.parent_path,
        &mut base,
        &options,
        &lock_dir(config),
    ) {
        Ok(merged) => {
            let skipped: Vec<Value> = merged
                .skipped
                .iter()
                .map(|skip| json!({"path": skip.path.to_string_lossy(), "reason": skip.reason.to_string()}))
                .collect();
            let mut result = json!({
                "unit": unit,
                "into": child.parent,
                "merged": relative(&merged.merged),
                "deleted": relative(&merged.deleted),
            });
            if !skipped.is_empty() {
                result["skipped"] = json!(skipped);
            }
            Ok(result)
        }
        Err(error) => {
            let message = format!("box/merge {unit} into {}: {error}", child.parent);
            let data = match &error {
                box_fork::Error::Conflict { paths } => {
                    json!({"unit": unit, "conflicts": relative(paths)})
                }
                box_fork::Error::Refused { refusals } => json!({
                    "unit": unit,
                    "refused": refusals
                        .iter()
                        .map(|refusal| json!({"path": refusal.path.to_string_lossy(), "reason": refusal.reason}))
                        .collect::<Vec<_>>(),
                }),
                _ => json!({"unit": unit}),
            };
            let code = match &error {
                box_fork::Error::Conflict { .. } | box_fork::Error::Refused { .. } => {
                    code::INVALID_PARAMS
                }
                _ => code::INTERNAL_ERROR,
            };
            Err((code, message, data))
        }
    }
}

/// The mechanism's name on the wire.
pub fn mode_name(mode: Mechanism) -> &'static str {
    match mode {
        Mechanism::Worktree => "worktree",
        Mechanism::Copy => "copy",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Worktree is possible where the host has a confined git runner and the
    /// backend says where a unit sees the borrowed objects; the backend's
    /// place is what the child's alternates name; otherwise auto is copy and
    /// worktree is refused with the backend's reason.
    #[test]
    fn the_backend_says_where_borrowed_objects_appear() {
        use box_testkit::fake::{FakeBackend, FakeOptions};
        let spec = box_policy::plan::UnitSpec::workspace(
            "box-base:bookworm",
            box_policy::plan::WorkspaceSource::Host(PathBuf::from("/src/project")),
        );
        let host = |place: Option<ObjectsPlace>, git: bool| {
            let fake = FakeBackend::new(FakeOptions {
                objects_place: place,
                ..FakeOptions::default()
            });
            let mut config = HostConfig::new(
                box_policy::profile::Catalog::new(Vec::new()),
                crate::tests::facts(),
            );
            if git {
                config.fork_git = Some(box_fork::Git::new(Vec::<(String, String)>::new()));
            }
            (config, fake)
        };
        let at = ObjectsPlace::At(PathBuf::from("/.box/objects"));
        for place in [ObjectsPlace::HostPath, at.clone()] {
            let (config, fake) = host(Some(place.clone()), true);
            for asked in [Mode::Auto, Mode::Worktree] {
                assert_eq!(
                    effective_mode(&config, &fake, &spec, asked),
                    Ok(Effective {
                        mode: asked,
                        objects: Some(place.clone()),
                    })
                );
            }
        }
        let copy = Ok(Effective {
            mode: Mode::Copy,
            objects: None,
        });
        let (cannot, fake) = host(None, true);
        assert_eq!(effective_mode(&cannot, &fake, &spec, Mode::Auto), copy);
        let refused = effective_mode(&cannot, &fake, &spec, Mode::Worktree).unwrap_err();
        assert!(
            refused.contains("read-only in the unit (the fake backend was given no place"),
            "{refused}"
        );
        let (no_git, fake) = host(Some(at), false);
        assert_eq!(effective_mode(&no_git, &fake, &spec, Mode::Auto), copy);
        let refused = effective_mode(&no_git, &fake, &spec, Mode::Worktree).unwrap_err();
        assert!(refused.contains("confined git runner"), "{refused}");
    }

    #[test]
    fn fork_params_are_checked_and_named() {
        let ask = |params: Value| {
            fork_ask(&json!({"jsonrpc": "2.0", "id": 1, "method": "box/fork", "params": params}))
        };
        assert_eq!(
            ask(json!({})).unwrap(),
            ForkAsk {
                from: "workspace".to_owned(),
                mode: Mode::Auto,
                dirty: true,
                writable: true,
                label: None,
                tighten: None,
            }
        );
        let asked = ask(json!({"from": "fork-1", "mode": "copy", "dirty": false, "writable": false, "label": "explorer"})).unwrap();
        assert_eq!(asked.mode, Mode::Copy);
        assert!(!asked.dirty && !asked.writable);
        assert!(
            ask(json!({"mode": "overlay"}))
                .unwrap_err()
                .contains("mode: `overlay`")
        );
        assert!(ask(json!({"dirty": "yes"})).unwrap_err().contains("dirty"));
        assert!(ask(json!({"size": 1})).unwrap_err().contains("`size`"));
    }

    #[test]
    fn storage_names_stay_one_component() {
        assert_eq!(safe_name("../x/y"), ".._x_y");
        assert_eq!(safe_name(".."), "_");
        assert_eq!(safe_name("http-127.0.0.1-8080"), "http-127.0.0.1-8080");
    }
}
