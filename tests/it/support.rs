//! Helpers shared by the integration tests.

#![allow(dead_code)]

use std::path::PathBuf;

/// The `box` binary cargo built for these tests.
pub fn box_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_box"))
}

/// `box-testhost` (box-testkit): the `box` command line with the fake
/// backend (`--backend fake`), which the release `box` does not have. Cargo
/// builds it beside `box` when the workspace's tests are built
/// (`cargo nextest run --workspace`).
pub fn testhost_bin() -> PathBuf {
    let path = box_bin().with_file_name("box-testhost");
    assert!(
        path.exists(),
        "{} is missing: build the workspace's tests (`cargo nextest run --workspace`) or `cargo build -p box-testkit`",
        path.display()
    );
    path
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

/// The Python that has the `mcp` SDK, or `None` after saying loudly why not;
/// under CI its absence is a failure, never a skip.
pub fn python_with_mcp() -> Option<PathBuf> {
    let python = python();
    let works = std::process::Command::new(&python)
        .args(["-c", "import mcp"])
        .output()
        .is_ok_and(|output| output.status.success());
    if works {
        return Some(python);
    }
    let message = format!(
        "the Python `mcp` SDK is not installed at {} (run scripts/test.sh, or set BOX_TEST_PYTHON)",
        python.display()
    );
    assert!(!under_ci(), "{message}");
    eprintln!("\n*** PYTHON CLIENT TEST NOT RUN: {message} ***\n");
    None
}

/// Whether a Docker engine answers, after saying loudly why not when it does
/// not; under CI its absence is a failure, never a skip.
pub async fn docker_answers() -> bool {
    match boxhost::backend::docker::DockerBackend::connect().await {
        Ok(_) => true,
        Err(error) => {
            assert!(!under_ci(), "CI needs a Docker engine: {error}");
            eprintln!("\n*** DOCKER PART NOT RUN: {error} ***\n");
            false
        }
    }
}
