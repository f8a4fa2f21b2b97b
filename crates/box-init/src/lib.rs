//! box's first process in every unit, and the host's end of the channel to it.
//!
//! The init ([`run`]) is what a docker unit runs as PID 1 and what the local
//! backend runs as its pid namespace's init. It holds the unit's **lease**: a
//! deadline its host renews; when the deadline passes (the host died, hung or
//! lost the unit) the init kills every process of the unit and exits, so no
//! unit outlives its host by more than the lease, with no box process left
//! anywhere to clean up. It also **relays** the executor's stdio to the host
//! over a Unix socket the host listens on, so that a new host process can
//! re-adopt a live unit ([`host::UnitListener::accept`] again, with the unit's
//! key), and it does a PID 1's duties (reaping, forwarding SIGTERM/SIGINT).
//!
//! Modules:
//! - [`protocol`]: the wire (control vocabulary, proofs, the unit key);
//! - [`line`](mod@line): whole-line framing with one reused buffer;
//! - [`lease`]: the lease on `CLOCK_BOOTTIME`, fenced by epoch;
//! - [`handshake`]: both sides of a connection's mutual authentication;
//! - [`config`]: the init's command line;
//! - [`host`]: what the host calls: bind, accept, lease handle, MCP stdio;
//! - [`home`]: a docker unit's home filled with the image's before the executor starts;
//! - `init` (private): the init itself, behind [`run`].
//!
//! This crate knows nothing of MCP beyond "one JSON message per line", of
//! Docker, or of profiles; the backends and the host wire it in.
//!
//! # Guarantees and limits
//!
//! - A unit outlives the last renewal by at most its TTL plus half a second
//!   (the init looks at the lease at least every 500 ms), plus the engine's
//!   removal time. The lease is on `CLOCK_BOOTTIME`: a suspended, stopped
//!   (SIGSTOP) or hung host is a lapsed lease, like a dead one.
//! - Lines are relayed whole in both directions. Host → executor: a line the
//!   host had not finished when its connection dropped is discarded, never
//!   given to the executor. Executor → host: a line whose write failed is sent
//!   whole on the next connection. A [`release`](host::Lease::release) loses
//!   nothing (the init confirms after its last line). An *unplanned* drop
//!   loses the executor lines already written into the dead connection that
//!   its host never read: they answer calls of a host that is gone; durable
//!   output (processes) is read again through the executor.
//! - While no host is connected the executor's stdout is not read: the pipe
//!   holds its output (the executor blocks once the pipe is full).
//! - Killing "every process of the unit" is exact as PID 1 of a pid namespace;
//!   otherwise it covers the init's descendants, see `init::unit`.
//!
//! # For the backends and the host
//!
//! - Mount the run *directory* read-only at [`protocol::UNIT_RUN_DIR`], never
//!   the socket file: a file bind mount pins the inode, so a new host's socket
//!   would not be seen. The unit's uid must be able to search the directory.
//! - Docker: the init is the entrypoint (`/box init --socket
//!   /.box/run/host.sock --unit ID --lease-ms N -- /box execute ...`, built with
//!   [`InitConfig::to_args`]); no `Init: true` (this is the init), no restart
//!   policy, `AutoRemove` on. The key travels in [`protocol::KEY_ENV`], so it
//!   is in the container's config: `docker inspect` shows it to whoever may
//!   use the engine anyway, and every `docker exec` into the unit inherits it,
//!   so nothing may be `docker exec`ed into a unit started this way.
//! - A seccomp filter on the init must allow `socket(AF_UNIX)`: it reconnects
//!   (and bridges) for its whole life. Filters for tools belong on the
//!   executor.
//! - The host renews every [`host::Lease::renew_interval`] with
//!   [`host::Lease::renew`]; accepting never renews. A process taking over a
//!   unit from a live one binds the path first (the old listener is then
//!   unreachable), has the old one [`release`](host::Lease::release), accepts,
//!   and renews with an epoch above [`protocol::InitState::epoch`] using
//!   [`renew_confirmed`](host::Lease::renew_confirmed); the old epoch is then
//!   fenced off.

// Beyond the workspace's lints: every public item documented.
#![warn(missing_docs)]

pub mod config;
pub mod handshake;
pub mod home;
pub mod host;
mod init;
pub mod lease;
pub mod line;
pub mod protocol;

pub use config::{Bridge, InitConfig};
pub use init::{Started, run, supervise};

/// The init's exit code when the lease lapsed.
pub const EXIT_LEASE_LAPSED: i32 = 75;

/// The init's exit code when it could not start (no key, bad configuration,
/// the executor or a bridge could not be started).
pub const EXIT_START_FAILED: i32 = 71;
