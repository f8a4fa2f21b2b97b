//! Integration tests of box-fork with real git in temporary directories: one
//! binary, one module per area.

#![allow(clippy::unwrap_used, clippy::expect_used)]

/// Fork in each mode: isolation both ways, refs, the dirty overlay and its degraded advisory, links, read-only children.
mod fork;
/// A repository whose config, hooks and attributes try to run programs: canaries that must stay unfired.
mod hostile;
/// Merge back: changes of every kind, conflicts, `theirs`, refusals, concurrency.
mod merge;
/// Fixtures, the neutralising runner, snapshots.
mod support;
