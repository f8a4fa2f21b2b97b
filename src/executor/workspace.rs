//! The confined workspace: every path a tool names resolves beneath the root,
//! and a link never leads out (cap-std's `Dir`, openat2 RESOLVE_BENEATH).
//!
//! Interface stub: the executor's file-tools work fills this in; the signatures
//! are what `bash`, `shell` and `process` code against.

use std::path::{Path, PathBuf};

use super::facts::FactCall;

/// Why a path cannot be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PathError {
    /// Absolute outside the root, or climbing out of it.
    #[error("path is outside the workspace: {0}")]
    Outside(String),
    /// NUL bytes, over-long, or otherwise not a name.
    #[error("invalid path: {0}")]
    Invalid(String),
    /// The file system said no.
    #[error("{path}: {source}")]
    Io {
        /// The path as the caller wrote it.
        path: String,
        /// What the file system said.
        source: std::io::Error,
    },
}

/// The workspace root, opened once.
#[derive(Debug)]
pub(crate) struct Workspace {
    root: PathBuf,
}

impl Workspace {
    /// Open the root (it must exist and be a directory).
    pub fn open(root: &Path) -> std::io::Result<Self> {
        Ok(Self {
            root: std::path::absolute(root)?,
        })
    }

    /// The root, absolute, as processes in the unit see it.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The facts calls for `raw` (a path as the model wrote it, relative to
    /// `base`, a root-relative directory, or absolute) claimed as `tool`: the
    /// root-relative cleaned name; a second call when links lead to another name
    /// inside; the sentinel form when it is outside or leads out; a
    /// `dax:links-unknown` call when where links lead cannot be read.
    pub fn path_facts(&self, base: &str, raw: &str, tool: &str) -> Vec<FactCall> {
        let _ = (base, raw, tool);
        Vec::new()
    }

    /// The absolute path of a directory inside the workspace named by `raw`
    /// (relative to the root, or absolute inside it), checked through the root.
    pub fn directory(&self, raw: &str) -> Result<PathBuf, PathError> {
        Err(PathError::Invalid(raw.to_owned()))
    }
}
