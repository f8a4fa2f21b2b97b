//! The egress proxy against real sockets: a proxy on a Unix socket, upstreams on
//! 127.0.0.1, clients written here or real ones (`curl`, `openssl`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

/// TLS ClientHello bytes built by hand.
mod client_hello;
/// Proxy under test, fake upstreams, small clients.
mod support;

/// Through the bridge with `curl`, plain and TLS.
mod bridge;
/// `CONNECT`: allowed and refused targets, addresses, TLS server names.
mod connect;
/// The bridge handing its listener to the proxy, and taking it back.
mod handoff;
/// Limits: connections at once, shared bandwidth.
mod limits;
/// Plain HTTP: origin-form forwarding, keep-alive, `Host` checks.
mod plain;
/// A running unit's list narrowed and restored.
mod policy;
