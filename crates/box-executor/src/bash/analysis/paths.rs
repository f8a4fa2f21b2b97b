//! Where a stage runs, and the paths its words name: inside the workspace,
//! no `..`, links resolved.

use std::path::{Component, Path, PathBuf};

use crate::Context;

/// Where a stage runs: root-relative (`""` = the root) and absolute.
#[derive(Debug, Clone)]
pub(super) struct Base {
    pub(super) relative: String,
    pub(super) absolute: PathBuf,
}

/// The files a stage reads (`read`) or lists (`ls`), as written.
pub(super) type Reads = Vec<(&'static str, String)>;

/// A path with links resolved where it exists, as written otherwise: what a
/// stamp signs so that a link changing after the stamp breaks it.
pub(super) fn resolved(path: &Path) -> PathBuf {
    path.canonicalize().unwrap_or_else(|_| path.to_path_buf())
}

/// Clean `.` and repeated separators without touching the file system.
pub(super) fn lexical(path: &Path) -> PathBuf {
    path.components()
        .filter(|component| !matches!(component, Component::CurDir))
        .collect()
}

/// A path argument inside the workspace: no `..`, not absolute elsewhere,
/// and (where it exists) not leading out through a link. The absolute path.
pub(super) fn inside(context: &Context, base: &Base, raw: &str) -> Result<PathBuf, String> {
    let path = Path::new(raw);
    if path
        .components()
        .any(|component| component == Component::ParentDir)
    {
        return Err(format!("a .. in {raw}"));
    }
    let root = context.workspace.root();
    let joined = lexical(&base.absolute.join(path));
    if !joined.starts_with(root) {
        return Err(format!("{raw} is outside the workspace"));
    }
    if joined.symlink_metadata().is_ok() {
        let real_root = resolved(root);
        let real = joined
            .canonicalize()
            .map_err(|error| format!("where {raw} leads cannot be read: {error}"))?;
        if !real.starts_with(&real_root) {
            return Err(format!("{raw} leads out of the workspace"));
        }
        return Ok(real);
    }
    Ok(joined)
}
