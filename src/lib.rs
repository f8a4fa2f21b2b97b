//! box: a box host for AI agents' tool execution.
//!
//! A session (an agent harness, or any MCP client) connects to `box serve`; box
//! resolves a named profile, narrowed by the session's tightenings, into
//! hardened units, starts its own executor (`box execute`) inside each, proxies
//! MCP between the session and the units, and reports what it applied. The
//! work is the workspace's crates, data flowing one way:
//!
//! `box_policy` (profile → plan) → `box_host` (sessions, through a
//! `box_backend::Backend`: docker or local) → `box_executor` in each unit,
//! with `box_transport` (stdio, HTTP) in front and `box_scrub`/`box_redact`
//! beside them. This crate is the binary around them: `cli` (the only place
//! clap is), `backends` (the registry of backends), `sessions` (the host
//! adapted to the transports' `SessionFactory`), `run` (`box run`) and
//! `process` (logging, the runtime, signals). ARCHITECTURE.md is the map.

pub mod backends;
pub mod cli;
mod process;
mod run;
pub mod sessions;

// The crates of the workspace, under the module names the rest of the binary
// and its tests have always used.
pub use box_host as host;
pub use box_policy::{plan, profile};

/// The backends: what they share, and each one.
pub mod backend {
    pub use box_backend::*;
    pub use box_backend_docker as docker;
    pub use box_backend_local as local;
}

/// The version box reports in `serverInfo` and `--version`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
