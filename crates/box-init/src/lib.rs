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
//! - `init` (private): the init itself, behind [`run`].
//!
//! This crate knows nothing of MCP beyond "one JSON message per line", of
//! Docker, or of profiles; the backends and the host wire it in.

pub mod config;
pub mod handshake;
pub mod host;
mod init;
pub mod lease;
pub mod line;
pub mod protocol;

pub use config::{Bridge, InitConfig};
pub use init::run;

/// The init's exit code when the lease lapsed.
pub const EXIT_LEASE_LAPSED: i32 = 75;

/// The init's exit code when it could not start (no key, bad configuration,
/// the executor or a bridge could not be started).
pub const EXIT_START_FAILED: i32 = 71;
