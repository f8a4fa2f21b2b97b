//! Helpers shared by the integration tests.

#![allow(dead_code)]

use std::path::PathBuf;

/// The `box` binary cargo built for these tests.
pub fn box_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_box"))
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Whether this run is CI, where a missing engine or client is a failure, not a skip.
pub fn under_ci() -> bool {
    std::env::var_os("CI").is_some_and(|value| !value.is_empty() && value != "false")
}

/// The Python interpreter that has the `mcp` SDK (scripts/test.sh sets it up).
pub fn python() -> PathBuf {
    match std::env::var_os("BOX_TEST_PYTHON") {
        Some(path) => PathBuf::from(path),
        None => repo_root().join(".venv/bin/python"),
    }
}
