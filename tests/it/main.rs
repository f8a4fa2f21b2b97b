//! Integration tests: one binary, one module per area.

#![allow(clippy::unwrap_used, clippy::expect_used)]

/// The command line: help, choices, exit codes, completions, NO_COLOR, `box run`'s forms.
mod cli;
/// Units on a real Docker engine: hardening probed from inside, faults, gc.
mod docker;
/// `box serve` and `box run` on the real backends with the real executor: Python SDK clients, isolation, faults.
mod end_to_end;
/// `box execute` driven over stdio, by hand-written JSON-RPC and by the Python `mcp` SDK.
mod executor;
/// `box/fork`, `box/merge` and `box/discard` through `box serve` on Docker.
mod fork;
/// Livable units: an executable /tmp, a writable home, who a unit runs as, volumes; docker and local.
mod livable;
/// Units on the local sandboxed-process backend: hardening probed from inside.
mod local;
/// What box logs: the executor's events as fields, no Rust `Debug` text, the listen URL, -v/-q in help.
mod logs;
/// Warm units (`box serve --pool`) on Docker: the same confinement as a cold unit, nothing shared, cold starts that say why, refill.
mod pool;
/// `box profile` on the command line: exit codes, messages, `--json` golden output.
mod profile;
/// Any OCI image: pulled from a real local registry, pinned and verified, refused with the remedy; images without glibc.
mod pull;
/// The README's examples, run as written.
mod readme;
/// A real agent job in the `dev` profile (pip, cargo, go, npm, cc, git, fork and merge), and a second session's warm caches.
mod real_job;
/// Sessions surviving `kill -9` of their `box serve --listen` host: state, reattach, refusals.
mod reattach;
/// Sessions with an egress unit surviving `kill -9` of their host: the proxy served again in the unit's socket directory.
mod reattach_egress;
/// The package registry fixtures (PyPI, cargo, Go, npm, git over HTTPS) against real clients, and those clients through a unit's egress proxy.
mod registries;
/// Secrets through `box serve` on Docker: files, never in `docker inspect`, redacted for the client.
mod secrets;
/// `box serve` and `box run` end to end, over stdio and HTTP, on both backends.
mod serve;
/// A unit's resource usage: `box/units.stats` and `box units ls` against the cgroup's own files, docker and local.
mod stats;
/// Helpers shared by every area: the built `box`, temp workspaces, the Python client,
/// `box serve` driven over stdio (`Served`) and over HTTP (`HttpHost`).
mod support;
/// The repository itself: ARCHITECTURE.md names every module.
mod tidy;
/// `box units` over units a real `box serve` started, on both backends: the table, filters, inspect.
mod units;
/// `box volumes ls|rm|prune` over the volumes `box run` leaves, on both backends.
mod volumes;
