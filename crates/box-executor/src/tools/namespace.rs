//! The namespace tools of box's own extension (`box-namespace`): copy, move
//! and remove, with seed 003's narrow rules. Removal is not recursive (a
//! directory must be empty); copy takes regular files only (a link, a
//! directory, a FIFO, a socket or a device is refused); copy and move never
//! replace what is at the destination (a file, a directory, even a dangling
//! link). Each works on the names themselves: the last component of a path
//! is never followed (a link is moved or removed, never what it leads to),
//! the directories above it are opened beneath the root, so nothing outside
//! the workspace is reached.
//!
//! Version-aware as write is: removing a regular file needs it read in this
//! session and unchanged since (the write guard's ledger), since removing
//! loses its content as overwriting does. Copy and move lose nothing: a
//! copy is recorded as seen (the executor wrote it), a moved file keeps its
//! ledger entry (keyed by the file, not its name). All run under the
//! workspace's write lock, like write and edit.

use std::ffi::OsString;
use std::io::Write as _;
use std::path::Path;

use cap_fs_ext::{FollowSymlinks, OpenOptionsFollowExt as _};
use cap_std::fs::{Dir, Metadata, OpenOptions, OpenOptionsExt as _, Permissions, PermissionsExt};
use serde_json::{Map, Value};

use super::{path_arg, string_arg};
use crate::Context;
use crate::workspace::{Name, Workspace, io_message};

pub(super) fn copy(context: &Context, arguments: &Map<String, Value>) -> Result<String, String> {
    let workspace = &context.workspace;
    let source = name(workspace, string_arg(arguments, "source", ""))?;
    let destination = name(workspace, string_arg(arguments, "destination", ""))?;
    let _lock = workspace.lock_writes();
    let (source_dir, source_file) = parent_and_file(workspace, &source)?;
    let metadata = source_dir
        .symlink_metadata(&source_file)
        .map_err(|e| io_message(&source, &e))?;
    regular_only(&source, &metadata)?;
    // Opened without following a link and without blocking, then checked
    // again: what was looked at above may have been swapped since.
    let mut options = OpenOptions::new();
    options
        .read(true)
        .follow(FollowSymlinks::No)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY);
    let mut file = source_dir
        .open_with(&source_file, &options)
        .map_err(|e| io_message(&source, &e))?;
    let opened = file.metadata().map_err(|e| io_message(&source, &e))?;
    regular_only(&source, &opened)?;
    let (destination_dir, destination_file) = parent_and_file(workspace, &destination)?;
    refuse_existing(&destination_dir, &destination_file, &destination, "copy")?;
    let mode = opened.permissions().mode() & 0o777;
    let temp_name = temp_name();
    let mut temp_options = OpenOptions::new();
    temp_options.write(true).create_new(true).mode(mode);
    let copied = (|| {
        let mut temp = destination_dir.open_with(&temp_name, &temp_options)?;
        let bytes = std::io::copy(&mut file, &mut temp)?;
        temp.flush()?;
        // The umask narrowed the mode at creation; set it exactly.
        temp.set_permissions(Permissions::from_mode(mode))?;
        drop(temp);
        // A link to the finished file: it appears whole, and only if the
        // name is still free (no replacing what appeared meanwhile).
        destination_dir.hard_link(&temp_name, &destination_dir, &destination_file)?;
        Ok::<u64, std::io::Error>(bytes)
    })();
    let _ = destination_dir.remove_file(&temp_name);
    let bytes = copied.map_err(|error| match error.kind() {
        std::io::ErrorKind::AlreadyExists => already_exists(&destination, "copy"),
        _ => io_message(&destination, &error),
    })?;
    if let Ok(version) = workspace.version(&destination, context.max_read_bytes) {
        workspace.record(version);
    }
    Ok(format!("copied {source} to {destination} ({bytes} bytes)"))
}

pub(super) fn move_(context: &Context, arguments: &Map<String, Value>) -> Result<String, String> {
    let workspace = &context.workspace;
    let source = name(workspace, string_arg(arguments, "source", ""))?;
    let destination = name(workspace, string_arg(arguments, "destination", ""))?;
    if destination == source {
        return Err(already_exists(&destination, "move"));
    }
    if destination.as_path().starts_with(source.as_path()) {
        return Err(format!("cannot move {source} into itself ({destination})"));
    }
    let _lock = workspace.lock_writes();
    let (source_dir, source_file) = parent_and_file(workspace, &source)?;
    source_dir
        .symlink_metadata(&source_file)
        .map_err(|e| io_message(&source, &e))?;
    let (destination_dir, destination_file) = parent_and_file(workspace, &destination)?;
    refuse_existing(&destination_dir, &destination_file, &destination, "move")?;
    // One rename that fails if the destination appeared meanwhile, on the
    // last components alone, between directories opened beneath the root.
    nix::fcntl::renameat2(
        &source_dir,
        Path::new(&source_file),
        &destination_dir,
        Path::new(&destination_file),
        nix::fcntl::RenameFlags::RENAME_NOREPLACE,
    )
    .map_err(|errno| match errno {
        nix::errno::Errno::EEXIST | nix::errno::Errno::ENOTEMPTY => {
            already_exists(&destination, "move")
        }
        nix::errno::Errno::EXDEV => format!(
            "{source} and {destination} are on different file systems: copy it, then remove it"
        ),
        nix::errno::Errno::EINVAL => format!(
            "cannot move {source} to {destination} (into itself, or the file system cannot rename without replacing)"
        ),
        errno => io_message(&source, &std::io::Error::from(errno)),
    })?;
    Ok(format!("moved {source} to {destination}"))
}

pub(super) fn remove(context: &Context, arguments: &Map<String, Value>) -> Result<String, String> {
    let workspace = &context.workspace;
    let path = name(workspace, path_arg(arguments, ""))?;
    let _lock = workspace.lock_writes();
    let (dir, file) = parent_and_file(workspace, &path)?;
    let metadata = dir
        .symlink_metadata(&file)
        .map_err(|e| io_message(&path, &e))?;
    if metadata.is_dir() {
        return match dir.remove_dir(&file) {
            Ok(()) => Ok(format!("removed the empty directory {path}")),
            Err(error) if error.kind() == std::io::ErrorKind::DirectoryNotEmpty => Err(format!(
                "{path} is a directory that is not empty; remove is not recursive: remove what is in it first"
            )),
            Err(error) => Err(io_message(&path, &error)),
        };
    }
    if metadata.is_file() {
        // Its content goes with it: only when read and unchanged since.
        workspace.check_unchanged(&path, context.max_read_bytes)?;
    }
    // A link is removed itself, never what it leads to.
    dir.remove_file(&file).map_err(|e| io_message(&path, &e))?;
    Ok(format!("removed {path}"))
}

/// The cleaned name of a path argument; the root itself is refused (the
/// namespace tools change entries of directories, and the root is none).
fn name(workspace: &Workspace, raw: &str) -> Result<Name, String> {
    let name = workspace.name(raw).map_err(|e| e.to_string())?;
    if name.is_root() {
        return Err(format!(
            "{name} is the workspace root; name a file or directory inside it"
        ));
    }
    Ok(name)
}

/// The directory holding `name` (opened beneath the root, links in it
/// followed only while they stay inside) and `name`'s last component.
fn parent_and_file(workspace: &Workspace, name: &Name) -> Result<(Dir, OsString), String> {
    let path = name.as_path();
    let file = path
        .file_name()
        .ok_or_else(|| format!("{name} names no file"))?
        .to_owned();
    let dir = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => {
            let shown = crate::names::show_path(parent);
            workspace
                .dir()
                .open_dir(parent)
                .map_err(|e| io_message(&shown, &e))?
        }
        _ => workspace
            .dir()
            .try_clone()
            .map_err(|e| io_message(name, &e))?,
    };
    Ok((dir, file))
}

/// Refuse anything but a regular file as a copy's source.
fn regular_only(name: &Name, metadata: &Metadata) -> Result<(), String> {
    if metadata.is_symlink() {
        Err(format!(
            "{name} is a symbolic link; copy takes regular files only"
        ))
    } else if metadata.is_dir() {
        Err(format!(
            "{name} is a directory; copy takes regular files only (it is not recursive)"
        ))
    } else if !metadata.is_file() {
        Err(format!(
            "{name} is not a regular file (a FIFO, socket or device); copy takes regular files only"
        ))
    } else {
        Ok(())
    }
}

/// Refuse a destination that exists (a dangling link too).
fn refuse_existing(dir: &Dir, file: &OsString, name: &Name, tool: &str) -> Result<(), String> {
    match dir.symlink_metadata(file) {
        Ok(_) => Err(already_exists(name, tool)),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(io_message(name, &error)),
    }
}

fn already_exists(name: &Name, tool: &str) -> String {
    format!(
        "{name} already exists; {tool} does not replace anything: remove it first, or choose another name"
    )
}

/// A temp name for a copy being written beside its destination (not made
/// from the destination's name, which may already be as long as a name can
/// be).
fn temp_name() -> String {
    format!(".box-copy-{:016x}.tmp", rand::random::<u64>())
}

#[cfg(test)]
mod tests;
