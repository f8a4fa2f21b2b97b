//! The ls tool: one directory's entries, sorted by name; directories end in
//! `/`, files show their size, links say where they lead (beneath the root).

use serde_json::{Map, Value};

use super::path_arg;
use crate::Context;
use crate::names;
use crate::workspace::io_message;

/// The most entries one listing shows.
const MAX_ENTRIES: usize = 10_000;

pub(super) fn run(context: &Context, arguments: &Map<String, Value>) -> Result<String, String> {
    let workspace = &context.workspace;
    let name = workspace
        .name(path_arg(arguments, "."))
        .map_err(|e| e.to_string())?;
    let metadata = workspace
        .metadata(&name)
        .map_err(|e| io_message(&name, &e))?;
    if !metadata.is_dir() {
        return Err(format!("{name} is not a directory"));
    }
    let dir = workspace
        .open_dir(&name)
        .map_err(|e| io_message(&name, &e))?;
    let entries = dir.entries().map_err(|e| io_message(&name, &e))?;
    // Only the first MAX_ENTRIES names in sorted (byte) order are kept,
    // however large the directory.
    let mut found = std::collections::BTreeSet::new();
    let mut total = 0usize;
    for entry in entries.filter_map(Result::ok) {
        total += 1;
        found.insert(entry.file_name());
        if found.len() > MAX_ENTRIES {
            found.pop_last();
        }
    }
    if found.is_empty() {
        return Ok("(empty)".to_owned());
    }
    let mut out = String::new();
    for file_name in found.iter().take(MAX_ENTRIES) {
        use std::os::unix::ffi::OsStrExt as _;
        let shown = names::show(file_name.as_bytes());
        // An entry removed during the listing is skipped.
        let Ok(own) = dir.symlink_metadata(file_name) else {
            continue;
        };
        if own.is_symlink() {
            // Followed from the root, not from this directory: a link may climb
            // out of the directory and still stay inside the workspace.
            let relative = if name.is_root() {
                std::path::PathBuf::from(file_name)
            } else {
                name.as_path().join(file_name)
            };
            match workspace.dir().metadata(relative) {
                Ok(target) if target.is_dir() => out.push_str(&format!("{shown}@/\n")),
                Ok(target) => out.push_str(&format!("{shown}@  {}\n", target.len())),
                Err(_) => out.push_str(&format!(
                    "{shown}@ (link outside the workspace or broken)\n"
                )),
            }
        } else if own.is_dir() {
            out.push_str(&format!("{shown}/\n"));
        } else {
            out.push_str(&format!("{shown}  {}\n", own.len()));
        }
    }
    if total > MAX_ENTRIES {
        out.push_str(&format!("... ({} more entries)\n", total - MAX_ENTRIES));
    }
    Ok(out)
}
