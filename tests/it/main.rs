//! Integration tests: one binary, one module per area.

#![allow(clippy::unwrap_used, clippy::expect_used)]

/// Helpers shared by every area: the built `box`, temp workspaces, the Python client.
mod support;
/// The repository itself: ARCHITECTURE.md names every module.
mod tidy;
