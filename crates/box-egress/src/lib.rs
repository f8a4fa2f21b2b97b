//! box's egress allowlist: the `network.allow` grammar, the destination checks, the
//! per-unit HTTP proxy the host runs, and the bridge a unit runs.
//!
//! The design is the same on every backend. A unit's network namespace has only `lo`:
//! no route out and no resolver. The host runs one proxy per unit ([`serve`]) on a
//! Unix socket that is bind-mounted into the unit; inside, box's own process runs
//! [`bridge()`] on a loopback port, and the unit's tools find it through
//! [`proxy_environment`]. Names are resolved on the host only, after the allowlist
//! allowed them. A tool that ignores the proxy variables gets "network unreachable",
//! never a way around.
//!
//! What is decided where:
//! - [`Rule`] and [`AllowList`]: the grammar, matching (which rule allowed a
//!   destination) and narrowing ([`AllowList::is_within`]). Pure; box-policy's
//!   `allow` module, re-exported here, so the profile reads entries the same way.
//! - [`Host`]: the one strict host parser (odd IPv4 spellings are refused, never names).
//! - [`classify`] and [`check_address`]: which addresses are forbidden, after unwrapping
//!   IPv6 forms that carry IPv4. Metadata endpoints and link-local stay refused even
//!   when the operator allows private destinations.
//! - [`serve`]: judges every `CONNECT` and plain-HTTP request, checks TLS server names
//!   against the `CONNECT` host, enforces the unit's [`Limits`], reports an [`Event`]
//!   per attempt.
//! - [`PolicyHandle`]: `box/network.set`, narrowing or restoring a running unit's list
//!   up to the profile's bound.
//!
//! Residual risks the proxy cannot see through an opaque tunnel, documented rather
//! than solved: domain fronting (the HTTP `Host` inside TLS naming another site of the
//! same CDN), HTTP/2 connection coalescing (a client reusing an allowed tunnel for
//! other names the server's certificate covers), and ECH (whose outer server name is
//! the CDN's; it never equals an allowed host, so it is refused).

// Beyond the workspace's lints: no unsafe code at all, every public item documented.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod address;
mod bridge;
mod event;
mod handoff;
mod http;
mod limit;
mod policy;
mod proxy;
mod splice;
mod tls;

pub use address::{AddressRange, METADATA_ADDRESSES, check_address, classify, embedded_ipv4};
pub use bridge::{BRIDGE_PORT, bridge, proxy_environment};
pub use event::{Decision, Event, Failure, Refusal};
pub use policy::{
    Limits, NarrowingError, Options, Policy, PolicyHandle, PrivateDestinations, UnitIdentity,
};
pub use proxy::{EventSink, Unit, serve};
// The grammar is box-policy's, so the profile and the proxy read entries alike.
pub use box_policy::allow::{
    AllowList, DEFAULT_PORTS, Host, HostError, HostName, Rule, RuleError, RuleHost, RulePorts,
};
