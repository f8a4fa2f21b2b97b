//! Finding and loading profiles: the search order, the shipped profiles built
//! into the binary, `extends` chains (cycles refused) merged field by field.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::error::{Position, Problem, ProfileError};
use super::model::Profile;
use super::tree::{self, Node, Value};
use super::validate::validate;

/// The profiles shipped with box, built into the binary (name, TOML).
pub const SHIPPED: &[(&str, &str)] = &[
    ("default", include_str!("../../../../profiles/default.toml")),
    ("ci", include_str!("../../../../profiles/ci.toml")),
    ("offline", include_str!("../../../../profiles/offline.toml")),
    ("no-fs", include_str!("../../../../profiles/no-fs.toml")),
    ("fetch", include_str!("../../../../profiles/fetch.toml")),
    ("dev", include_str!("../../../../profiles/dev.toml")),
];

/// Longest `extends` chain; deeper is a mistake, not a design.
const MAX_EXTENDS: usize = 16;

/// The profiles a host can resolve: `--profiles` directories first, then
/// `$XDG_CONFIG_HOME/box/profiles`, `/etc/box/profiles`, then the shipped ones.
/// The first file called `NAME.toml` wins.
#[derive(Debug, Clone)]
pub struct Catalog {
    dirs: Vec<PathBuf>,
}

/// One profile a catalog can see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// Its name.
    pub name: String,
    /// Where it is (a path, or `shipped:NAME.toml`).
    pub origin: String,
    /// A file of the same name earlier in the search order hides this one.
    pub hidden: bool,
}

impl Catalog {
    /// Search `dirs` first, then the standard places, then the shipped profiles.
    pub fn new(dirs: Vec<PathBuf>) -> Self {
        let mut all = dirs;
        let config = std::env::var_os("XDG_CONFIG_HOME")
            .filter(|value| !value.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".config")));
        if let Some(config) = config {
            all.push(config.join("box/profiles"));
        }
        all.push(PathBuf::from("/etc/box/profiles"));
        Self { dirs: all }
    }

    /// Search only `dirs`, then the shipped profiles (no standard places): for tests.
    pub fn only(dirs: Vec<PathBuf>) -> Self {
        Self { dirs }
    }

    /// The directories searched before the shipped profiles, in order.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// Load and validate the profile called `name` (resolving `extends`).
    pub fn load(&self, name: &str) -> Result<Profile, ProfileError> {
        check_name(name).map_err(|message| ProfileError::plain(&message))?;
        let Some((origin, text)) = self.find(name)? else {
            return Err(ProfileError::plain(&format!(
                "no profile named {name:?}; known: {}",
                self.known_names().join(", ")
            )));
        };
        self.load_text(name, &origin, &text)
    }

    /// Load and validate the profile in file `path` (named by its stem).
    pub fn load_file(&self, path: &Path) -> Result<Profile, ProfileError> {
        let origin = path.display().to_string();
        let name = path
            .file_stem()
            .map(|stem| stem.to_string_lossy().into_owned())
            .unwrap_or_default();
        let text = std::fs::read_to_string(path).map_err(|error| {
            ProfileError::one(Problem::new(
                Position::file(&Arc::from(origin.as_str())),
                "",
                &format!("cannot read it: {error}"),
            ))
        })?;
        if let Err(message) = check_name(&name) {
            return Err(ProfileError::one(Problem::new(
                Position::file(&Arc::from(origin.as_str())),
                "",
                &message,
            )));
        }
        self.load_text(&name, &origin, &text)
    }

    /// Every profile this catalog can see, in search order.
    pub fn list(&self) -> Vec<Listed> {
        let mut listed: Vec<Listed> = Vec::new();
        let mut push = |name: String, origin: String| {
            let hidden = listed.iter().any(|seen| seen.name == name);
            listed.push(Listed {
                name,
                origin,
                hidden,
            });
        };
        for dir in &self.dirs {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            let mut files: Vec<PathBuf> = entries
                .filter_map(|entry| entry.ok().map(|entry| entry.path()))
                .filter(|path| path.extension().is_some_and(|ext| ext == "toml"))
                .collect();
            files.sort();
            for file in files {
                if let Some(stem) = file.file_stem() {
                    push(
                        stem.to_string_lossy().into_owned(),
                        file.display().to_string(),
                    );
                }
            }
        }
        for (name, _) in SHIPPED {
            push((*name).to_owned(), shipped_origin(name));
        }
        listed
    }

    fn known_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .list()
            .into_iter()
            .filter(|listed| !listed.hidden)
            .map(|listed| listed.name)
            .collect();
        names.sort();
        names
    }

    /// The file that defines `name`, and its text.
    fn find(&self, name: &str) -> Result<Option<(String, String)>, ProfileError> {
        self.find_after(name, None)
    }

    /// The first definition of `name` in search order, or, with `after`, the
    /// first one after that file (so `default.toml` in a user directory can
    /// extend the shipped `default`).
    fn find_after(
        &self,
        name: &str,
        after: Option<&str>,
    ) -> Result<Option<(String, String)>, ProfileError> {
        let mut candidates: Vec<String> = self
            .dirs
            .iter()
            .map(|dir| dir.join(format!("{name}.toml")))
            .filter(|path| path.exists())
            .map(|path| path.display().to_string())
            .collect();
        if SHIPPED.iter().any(|(shipped, _)| *shipped == name) {
            candidates.push(shipped_origin(name));
        }
        let chosen = match after {
            None => candidates.into_iter().next(),
            Some(after) => match candidates.iter().position(|origin| origin == after) {
                Some(index) => candidates.into_iter().nth(index + 1),
                None => candidates.into_iter().find(|origin| origin != after),
            },
        };
        let Some(origin) = chosen else {
            return Ok(None);
        };
        if let Some((_, text)) = SHIPPED
            .iter()
            .find(|(shipped, _)| shipped_origin(shipped) == origin)
        {
            return Ok(Some((origin, (*text).to_owned())));
        }
        match std::fs::read_to_string(&origin) {
            Ok(text) => Ok(Some((origin, text))),
            Err(error) => Err(ProfileError::one(Problem::new(
                Position::file(&Arc::from(origin.as_str())),
                "",
                &format!("cannot read it: {error}"),
            ))),
        }
    }

    fn load_text(&self, name: &str, origin: &str, text: &str) -> Result<Profile, ProfileError> {
        let mut chain = vec![(name.to_owned(), origin.to_owned())];
        let (tree, extends) = self.merged(origin, text, &mut chain)?;
        validate(name, origin, extends, &tree).map_err(|problems| ProfileError { problems })
    }

    /// The tree of one file merged over its `extends` chain, and that chain's names.
    fn merged(
        &self,
        origin: &str,
        text: &str,
        chain: &mut Vec<(String, String)>,
    ) -> Result<(Node, Vec<String>), ProfileError> {
        let file: Arc<str> = Arc::from(origin);
        let tree = tree::parse(&file, text).map_err(ProfileError::one)?;
        let Some(extends) = tree.get("extends") else {
            return Ok((tree, Vec::new()));
        };
        let Value::String(parent) = &extends.value else {
            return Err(ProfileError::one(Problem::new(
                extends.at.clone(),
                "extends",
                &format!(
                    "expected the name of a profile (a string), got {} ({})",
                    extends.value.shown(),
                    extends.value.kind()
                ),
            )));
        };
        let at_extends = |message: String| {
            ProfileError::one(Problem::new(extends.at.clone(), "extends", &message))
        };
        check_name(parent).map_err(at_extends)?;
        if chain.len() > MAX_EXTENDS {
            return Err(at_extends(format!(
                "extends chain is longer than {MAX_EXTENDS}"
            )));
        }
        let own_name = chain.last().is_some_and(|(name, _)| name == parent);
        let found = if own_name {
            self.find_after(parent, Some(origin))?
        } else {
            self.find(parent)?
        };
        let Some((parent_origin, parent_text)) = found else {
            let message = if own_name {
                format!(
                    "no other profile named {parent:?} after this file in the search order to extend"
                )
            } else {
                format!(
                    "no profile named {parent:?} to extend; known: {}",
                    self.known_names().join(", ")
                )
            };
            return Err(at_extends(message));
        };
        let cycle = chain.iter().any(|(_, seen)| *seen == parent_origin);
        chain.push((parent.clone(), parent_origin.clone()));
        if cycle {
            let names: Vec<&str> = chain.iter().map(|(name, _)| name.as_str()).collect();
            return Err(at_extends(format!("makes a cycle: {}", names.join(" → "))));
        }
        let (parent_tree, mut names) = self.merged(&parent_origin, &parent_text, chain)?;
        names.insert(0, parent.clone());
        Ok((merge(parent_tree, tree, true), names))
    }
}

fn shipped_origin(name: &str) -> String {
    format!("shipped:{name}.toml")
}

/// Profile names are file stems and may come from a session: no paths.
fn check_name(name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a profile name; use letters, digits, -, _ and ., starting with a letter or digit"
        ))
    }
}

/// `child` over `parent`: tables merge key by key, `[[server]]` and
/// `[[volume]]` entries merge by name (a child's replaces the parent's of the
/// same name), every
/// other value is replaced whole; `[workspace] local_userland` goes with the
/// `image` beside it.
fn merge(parent: Node, child: Node, top: bool) -> Node {
    let (Value::Table(mut entries), Value::Table(child_entries)) =
        (parent.value, child.value.clone())
    else {
        return child;
    };
    for (key, value) in child_entries {
        match entries.iter().position(|(seen, _)| seen.name == key.name) {
            Some(index) => {
                let (_, old) = entries.remove(index);
                let merged = if top && (key.name == "server" || key.name == "volume") {
                    merge_servers(old, value)
                } else if top && key.name == "workspace" {
                    merge(without_inherited_userland(old, &value), value, false)
                } else if matches!(old.value, Value::Table(_))
                    && matches!(value.value, Value::Table(_))
                {
                    merge(old, value, false)
                } else {
                    value
                };
                entries.insert(index, (key, merged));
            }
            None => entries.push((key, value)),
        }
    }
    Node {
        value: Value::Table(entries),
        at: child.at,
    }
}

/// The parent's `[workspace]` less its `local_userland` when the child sets
/// `image` without one: leave to run on the host's userland was given for the
/// parent's image, and a pinned image of the child's must not run on the host
/// silently.
fn without_inherited_userland(parent: Node, child: &Node) -> Node {
    let sets_image = child.get("image").is_some() && child.get("local_userland").is_none();
    match parent.value {
        Value::Table(entries) if sets_image => Node {
            value: Value::Table(
                entries
                    .into_iter()
                    .filter(|(key, _)| key.name != "local_userland")
                    .collect(),
            ),
            at: parent.at,
        },
        value => Node {
            value,
            at: parent.at,
        },
    }
}

fn merge_servers(parent: Node, child: Node) -> Node {
    let (Value::Array(mut servers), Value::Array(child_servers)) =
        (parent.value, child.value.clone())
    else {
        return child;
    };
    let name_of = |node: &Node| match node.get("name").map(|name| &name.value) {
        Some(Value::String(name)) => Some(name.clone()),
        _ => None,
    };
    for server in child_servers {
        let name = name_of(&server);
        match servers
            .iter()
            .position(|seen| name.is_some() && name_of(seen) == name)
        {
            Some(index) => servers[index] = server,
            None => servers.push(server),
        }
    }
    Node {
        value: Value::Array(servers),
        at: child.at,
    }
}
