//! The write and edit tools: under the workspace's one write lock, check the
//! file was read and has not changed since (version-aware writes), then
//! replace it atomically (a temp file in the same directory, renamed over).

use std::io::{Read as _, Write as _};
use std::path::Path;

use cap_std::fs::{Dir, OpenOptions, OpenOptionsExt, Permissions, PermissionsExt};
use serde_json::{Map, Value};

use super::{path_arg, string_arg};
use crate::Context;
use crate::workspace::{FileError, Name, PathError, Workspace, io_message, is_escape};

/// Mode bits of a file the tools create.
const NEW_FILE_MODE: u32 = 0o644;

pub(super) fn write(context: &Context, arguments: &Map<String, Value>) -> Result<String, String> {
    let raw = path_arg(arguments, "");
    let content = string_arg(arguments, "content", "");
    let workspace = &context.workspace;
    let name = workspace.name(raw).map_err(|e| e.to_string())?;
    let _lock = workspace.lock_writes();
    let target = target_of(workspace, &name)?;
    if target.existing {
        workspace.check_unchanged(&name, context.max_read_bytes)?;
    }
    replace(
        workspace,
        target.name.as_path(),
        content.as_bytes(),
        target.mode,
    )
    .map_err(|e| io_message(&name, &e))?;
    record_written(workspace, &name, context.max_read_bytes);
    Ok(format!("wrote {} bytes to {name}", content.len()))
}

pub(super) fn edit(context: &Context, arguments: &Map<String, Value>) -> Result<String, String> {
    let raw = path_arg(arguments, "");
    let old = string_arg(arguments, "old_string", "");
    let new = string_arg(arguments, "new_string", "");
    if old.is_empty() {
        return Err("old_string must not be empty".to_owned());
    }
    let workspace = &context.workspace;
    let name = workspace.name(raw).map_err(|e| e.to_string())?;
    let _lock = workspace.lock_writes();
    let (file, metadata) = workspace
        .open_regular(&name)
        .map_err(|e| e.message(&name))?;
    let cap = context.max_read_bytes;
    if metadata.len() > cap {
        return Err(format!(
            "{name} is {} bytes, over the {cap}-byte limit for this tool",
            metadata.len()
        ));
    }
    workspace.check_unchanged(&name, cap)?;
    let mut data = Vec::new();
    file.take(cap + 1)
        .read_to_end(&mut data)
        .map_err(|e| io_message(&name, &e))?;
    let Ok(text) = String::from_utf8(data) else {
        return Err(format!("{name} is not UTF-8 text; edit replaces text only"));
    };
    let count = text.matches(old).count();
    match count {
        0 => return Err("old_string not found in file".to_owned()),
        1 => {}
        count => {
            return Err(format!(
                "old_string matches {count} times; add context to make it unique"
            ));
        }
    }
    let edited = text.replacen(old, new, 1);
    let target = target_of(workspace, &name)?;
    replace(
        workspace,
        target.name.as_path(),
        edited.as_bytes(),
        target.mode,
    )
    .map_err(|e| io_message(&name, &e))?;
    record_written(workspace, &name, cap);
    Ok(format!("edited {name}"))
}

/// Where a write to `name` lands.
struct Target {
    /// The name with links followed (beneath the root).
    name: Name,
    /// Whether a file is there now.
    existing: bool,
    /// The mode the new file gets: the old file's, or 0644.
    mode: u32,
}

/// Resolve `name` for writing: links followed, never out; an existing target
/// must be a regular file.
fn target_of(workspace: &Workspace, name: &Name) -> Result<Target, String> {
    if name.is_root() {
        return Err(format!("{name} is a directory"));
    }
    let resolved = workspace.resolve_links(name.as_path()).map_err(|e| {
        if is_escape(&e) {
            PathError::Outside(name.to_string()).to_string()
        } else {
            io_message(name, &e)
        }
    })?;
    match workspace.symlink_metadata(&resolved) {
        Ok(metadata) => {
            if metadata.is_dir() {
                return Err(format!("{name} is a directory"));
            }
            if !metadata.is_file() {
                return Err(FileError::NotRegular.message(name));
            }
            Ok(Target {
                name: resolved,
                existing: true,
                mode: metadata.permissions().mode() & 0o7777,
            })
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(Target {
            name: resolved,
            existing: false,
            mode: NEW_FILE_MODE,
        }),
        Err(error) => Err(io_message(name, &error)),
    }
}

/// Replace the file `name` (links already resolved) with `content`: parents
/// created, a temp file written in the same directory, then renamed over.
fn replace(workspace: &Workspace, path: &Path, content: &[u8], mode: u32) -> std::io::Result<()> {
    let file_name = path
        .file_name()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "no file name"))?;
    let parent_dir: Dir = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => {
            workspace.dir().create_dir_all(parent)?;
            workspace.dir().open_dir(parent)?
        }
        _ => workspace.dir().try_clone()?,
    };
    let temp_name = format!(
        ".{}.box-{:016x}.tmp",
        file_name.to_string_lossy(),
        rand::random::<u64>()
    );
    let mut options = OpenOptions::new();
    options.write(true).create_new(true).mode(mode);
    let result = (|| {
        let mut file = parent_dir.open_with(&temp_name, &options)?;
        file.write_all(content)?;
        // The umask narrowed the mode at creation; set it exactly.
        file.set_permissions(Permissions::from_mode(mode))?;
        drop(file);
        parent_dir.rename(&temp_name, &parent_dir, file_name)
    })();
    if result.is_err() {
        let _ = parent_dir.remove_file(&temp_name);
    }
    result
}

/// Record what this executor just wrote, so its next write or edit of the
/// same file needs no fresh read.
fn record_written(workspace: &Workspace, name: &Name, max_bytes: u64) {
    if let Ok(version) = workspace.version(name, max_bytes) {
        workspace.record(version);
    }
}

#[cfg(test)]
mod tests;
