//! box: a box host for AI agents' tool execution.
//!
//! A session (an agent harness, or any MCP client) connects to `box serve`; box
//! resolves a named profile, narrowed by the session's tightenings, into
//! hardened units, starts its own executor (`box execute`) inside each, proxies
//! MCP between the session and the units, and reports what it applied. The
//! modules follow the pipeline, data flowing one way:
//!
//! `profile` → `plan` → `backend` → `executor` → `host`/`proxy` → `transport`,
//! with `scrub` beside them. ARCHITECTURE.md is the map.
//!
//! The transports are the `box_transport` crate, which never sees the host:
//! `sessions` adapts the host to it, and `cli` (the only place clap is) wires
//! the two for `box serve`.

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
