//! The glob and grep tools: a walk beneath one directory of the workspace
//! (ripgrep's `ignore` walker, with dax's walk rules instead of ignore files),
//! glob matching with `globset` and content search with ripgrep's searcher.
//! The pattern is data: nothing is ever spawned.
//!
//! Walk rules: skip `.git node_modules vendor …` below the base (naming one as
//! the base still searches it); links to directories are not followed; links
//! to regular files inside are visited (opened through the confined root);
//! broken or outside links and unreadable directories are skipped.

use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use globset::{GlobBuilder, GlobMatcher};
use grep_regex::RegexMatcherBuilder;
use grep_searcher::{BinaryDetection, SearcherBuilder, sinks};
use ignore::{WalkBuilder, WalkState};
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use super::{integer_arg, path_arg, string_arg};
use crate::Context;
use crate::names;
use crate::workspace::{FileError, Name, Workspace, io_message};

/// Directories the walk does not enter below its base.
const SKIPPED_DIRECTORIES: [&str; 12] = [
    ".git",
    ".hg",
    ".svn",
    "node_modules",
    "vendor",
    ".venv",
    "venv",
    "__pycache__",
    ".cache",
    ".idea",
    ".next",
    ".tox",
];
/// Files grep does not search, by size.
const GREP_MAX_FILE_BYTES: u64 = 2 * 1024 * 1024;
/// How far into a file grep looks for a NUL byte (binary detection).
const BINARY_PROBE_BYTES: usize = 8000;
/// The most of one matched line grep shows.
const GREP_MAX_LINE_BYTES: usize = 500;
/// The longest glob pattern taken (alternation is bounded by it too).
const MAX_PATTERN_BYTES: usize = 4096;

const DEFAULT_GLOB_RESULTS: i64 = 1000;
const DEFAULT_GREP_RESULTS: i64 = 200;

pub(super) fn glob(
    context: &Context,
    arguments: &Map<String, Value>,
    cancel: &CancellationToken,
) -> Result<String, String> {
    let pattern = string_arg(arguments, "pattern", "");
    let max = positive(
        integer_arg(arguments, "max_results", DEFAULT_GLOB_RESULTS),
        DEFAULT_GLOB_RESULTS,
    );
    let matcher = glob_matcher(pattern)?;
    let workspace = &context.workspace;
    let (base_name, base) = search_base(workspace, path_arg(arguments, "."))?;
    if !base.is_dir {
        return Err(format!("{base_name} is not a directory"));
    }
    // The first max + 1 paths in sorted (byte) order (one past max decides
    // the trailer).
    let mut found: std::collections::BTreeSet<Vec<u8>> = std::collections::BTreeSet::new();
    for entry in walker(workspace, &base.resolved).build() {
        if cancel.is_cancelled() {
            return Err("glob was cancelled".to_owned());
        }
        let Ok(entry) = entry else { continue };
        let Some(relative) = relative_to(&entry, workspace.root()) else {
            continue;
        };
        if !is_file_entry(workspace, &entry, relative) {
            continue;
        }
        let within_base = relative.strip_prefix(&base.resolved).unwrap_or(relative);
        if matcher.is_match(within_base) {
            found.insert(relative.as_os_str().as_bytes().to_vec());
            if found.len() > max.saturating_add(1) {
                found.pop_last();
            }
        }
    }
    if found.is_empty() {
        return Ok("(no files match)".to_owned());
    }
    let truncated = found.len() > max;
    let mut out = String::new();
    for path in found.iter().take(max) {
        out.push_str(&names::show_path_bytes(path));
        out.push('\n');
    }
    if truncated {
        out.push_str(&format!(
            "... (stopped at {max} results; narrow the pattern or path)\n"
        ));
    }
    Ok(out)
}

pub(super) fn grep(
    context: &Context,
    arguments: &Map<String, Value>,
    cancel: &CancellationToken,
) -> Result<String, String> {
    let pattern = string_arg(arguments, "pattern", "");
    let ignore_case = arguments
        .get("ignore_case")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let max = positive(
        integer_arg(arguments, "max_results", DEFAULT_GREP_RESULTS),
        DEFAULT_GREP_RESULTS,
    );
    let matcher = RegexMatcherBuilder::new()
        .case_insensitive(ignore_case)
        .line_terminator(Some(b'\n'))
        .build(pattern)
        .map_err(|e| format!("invalid pattern: {e}"))?;
    let include = match arguments.get("include").and_then(Value::as_str) {
        Some(include) if !include.is_empty() => {
            Some((glob_matcher(include)?, include.contains('/')))
        }
        _ => None,
    };
    let workspace = &context.workspace;
    let (_, base) = search_base(workspace, path_arg(arguments, "."))?;
    let search = |relative: &Path| -> Vec<String> {
        if let Some((include, with_slash)) = &include {
            let path = relative;
            let subject = if *with_slash {
                path.strip_prefix(&base.resolved).unwrap_or(path)
            } else {
                Path::new(path.file_name().unwrap_or_default())
            };
            if !include.is_match(subject) {
                return Vec::new();
            }
        }
        search_file(workspace, relative, &matcher, max)
    };

    let mut files: Vec<(Vec<u8>, Vec<String>)> = Vec::new();
    if base.is_dir {
        let collected = Mutex::new(Found::default());
        walker(workspace, &base.resolved).build_parallel().run(|| {
            Box::new(|entry| {
                if cancel.is_cancelled() {
                    return WalkState::Quit;
                }
                let Ok(entry) = entry else {
                    return WalkState::Continue;
                };
                let Some(relative) = relative_to(&entry, workspace.root()) else {
                    return WalkState::Continue;
                };
                if !is_file_entry(workspace, &entry, relative) {
                    return WalkState::Continue;
                }
                let lines = search(relative);
                if !lines.is_empty()
                    && let Ok(mut collected) = collected.lock()
                {
                    collected.add(relative.as_os_str().as_bytes().to_vec(), lines, max);
                }
                WalkState::Continue
            })
        });
        if cancel.is_cancelled() {
            return Err("grep was cancelled".to_owned());
        }
        files = collected
            .into_inner()
            .unwrap_or_default()
            .files
            .into_iter()
            .collect();
    } else {
        let lines = search(&base.resolved);
        if !lines.is_empty() {
            files.push((base.resolved.as_os_str().as_bytes().to_vec(), lines));
        }
    }
    files.sort_by(|left, right| left.0.cmp(&right.0));

    let mut out = String::new();
    let mut count = 0;
    'files: for (path, lines) in &files {
        let path = names::show_path_bytes(path);
        for line in lines {
            if count == max {
                out.push_str(&format!(
                    "... (stopped at {max} matches; narrow the pattern or path)\n"
                ));
                break 'files;
            }
            out.push_str(&path);
            out.push(':');
            out.push_str(line);
            out.push('\n');
            count += 1;
        }
    }
    if count == 0 {
        return Ok("(no matches)".to_owned());
    }
    Ok(out)
}

/// Matches gathered from a parallel walk, kept bounded: only the files that
/// sort first and hold the first `max` + 1 lines (the one past `max` decides
/// the trailer), whatever order the walk finds them in.
#[derive(Default)]
struct Found {
    files: std::collections::BTreeMap<Vec<u8>, Vec<String>>,
    total: usize,
}

impl Found {
    fn add(&mut self, path: Vec<u8>, lines: Vec<String>, max: usize) {
        self.total += lines.len();
        self.files.insert(path, lines);
        while let Some(last) = self.files.last_key_value() {
            let without_last = self.total - last.1.len();
            if without_last <= max {
                break;
            }
            self.total = without_last;
            self.files.pop_last();
        }
    }
}

/// The `line:text` of each match in the file `relative`, at most `max`;
/// nothing for a file grep skips (not regular, too large, binary, unreadable).
fn search_file(
    workspace: &Workspace,
    relative: &Path,
    matcher: &grep_regex::RegexMatcher,
    max: usize,
) -> Vec<String> {
    let Ok((file, metadata)) = workspace.open_regular(relative) else {
        return Vec::new();
    };
    if metadata.len() > GREP_MAX_FILE_BYTES {
        return Vec::new();
    }
    let mut data = Vec::with_capacity(usize::try_from(metadata.len()).unwrap_or(0));
    if std::io::Read::read_to_end(
        &mut std::io::Read::take(file, GREP_MAX_FILE_BYTES),
        &mut data,
    )
    .is_err()
    {
        return Vec::new();
    }
    if data[..data.len().min(BINARY_PROBE_BYTES)].contains(&0) {
        return Vec::new();
    }
    let mut lines = Vec::new();
    let mut searcher = SearcherBuilder::new()
        .line_number(true)
        .binary_detection(BinaryDetection::none())
        .build();
    let sink = sinks::Bytes(|number, line| {
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let text = if line.len() > GREP_MAX_LINE_BYTES {
            format!(
                "{}...",
                String::from_utf8_lossy(&line[..GREP_MAX_LINE_BYTES])
            )
        } else {
            String::from_utf8_lossy(line).into_owned()
        };
        lines.push(format!("{number}:{text}"));
        Ok(lines.len() < max)
    });
    if searcher.search_slice(matcher, &data, sink).is_err() {
        return Vec::new();
    }
    lines
}

/// The search base: its name as shown, where it resolves (links followed
/// beneath the root) and whether it is a directory.
struct Base {
    /// Root-relative, empty for the root.
    resolved: PathBuf,
    is_dir: bool,
}

fn search_base(workspace: &Workspace, raw: &str) -> Result<(Name, Base), String> {
    let name = workspace.name(raw).map_err(|e| e.to_string())?;
    let metadata = workspace
        .metadata(&name)
        .map_err(|e| io_message(&name, &e))?;
    let resolved = workspace
        .resolve_links(name.as_path())
        .map_err(|e| io_message(&name, &e))?;
    if !metadata.is_dir() && !metadata.is_file() {
        return Err(FileError::NotRegular.message(&name));
    }
    let resolved = if resolved.is_root() {
        PathBuf::new()
    } else {
        resolved.as_path().to_path_buf()
    };
    Ok((
        name,
        Base {
            resolved,
            is_dir: metadata.is_dir(),
        },
    ))
}

/// A walker over `base` (root-relative, `""` for the root) with dax's rules.
fn walker(workspace: &Workspace, base: &Path) -> WalkBuilder {
    let start: PathBuf = workspace.root().join(base);
    let mut builder = WalkBuilder::new(start);
    builder
        .standard_filters(false)
        .follow_links(false)
        .sort_by_file_name(|left, right| left.cmp(right))
        .filter_entry(|entry| {
            let is_dir = entry.file_type().is_some_and(|kind| kind.is_dir());
            !(entry.depth() > 0
                && is_dir
                && entry
                    .file_name()
                    .to_str()
                    .is_some_and(|name| SKIPPED_DIRECTORIES.contains(&name)))
        });
    builder
}

/// The root-relative name of a walked entry (bytes kept: a name need not be UTF-8).
fn relative_to<'a>(entry: &'a ignore::DirEntry, root: &Path) -> Option<&'a Path> {
    entry.path().strip_prefix(root).ok()
}

/// Whether a walked entry is a file the tools visit: a regular file, or a link
/// that leads (beneath the root) to one.
fn is_file_entry(workspace: &Workspace, entry: &ignore::DirEntry, relative: &Path) -> bool {
    let Some(kind) = entry.file_type() else {
        return false;
    };
    if kind.is_file() {
        return true;
    }
    kind.is_symlink()
        && workspace
            .metadata(relative)
            .is_ok_and(|metadata| metadata.is_file())
}

/// A glob matcher: `**` any directories, `*` and `?` within a segment, `{a,b}`.
fn glob_matcher(pattern: &str) -> Result<GlobMatcher, String> {
    if pattern.len() > MAX_PATTERN_BYTES {
        return Err(format!(
            "pattern is {} bytes; at most {MAX_PATTERN_BYTES}",
            pattern.len()
        ));
    }
    let glob = GlobBuilder::new(pattern)
        .literal_separator(true)
        .build()
        .map_err(|e| format!("invalid pattern: {e}"))?;
    Ok(glob.compile_matcher())
}

fn positive(value: i64, default: i64) -> usize {
    usize::try_from(if value <= 0 { default } else { value }).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests;
