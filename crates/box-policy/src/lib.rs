//! box's policy as data, the leaf every other crate reads: profiles as
//! written in TOML (`profile`), and what one session may have once a profile
//! is narrowed by its tightenings and checked against the host (`plan`), and
//! the one `network.allow` grammar (`allow`), which the egress proxy reads too.
//! No engine, no process, no network: the same inputs give the same plan.

pub mod allow;
pub mod envelope;
pub mod executor;
pub mod image;
pub mod plan;
pub mod profile;
