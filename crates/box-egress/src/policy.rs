//! One unit's egress policy as plain data, its limits, and the handle through which a
//! running unit's allowlist is narrowed or restored (`box/network.set`).
//!
//! A change is published through a `tokio::sync::watch`: every request judged after
//! [`PolicyHandle::set_allow`] returns uses the new list; a `CONNECT` tunnel already
//! open stays open (it was authorised once, for its authority), and a keep-alive
//! connection's next request is judged under the new list.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::num::{NonZeroU64, NonZeroUsize};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;

use crate::{AllowList, HostName, Rule};

/// Whether private destinations (loopback, RFC 1918, unique-local, the host's own
/// addresses...) may be reached: the operator's `allow_dangerous = ["private-destinations"]`.
/// Metadata, link-local and the other "never" ranges stay refused either way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PrivateDestinations {
    /// The default.
    #[default]
    Refused,
    /// The operator named the danger.
    Allowed,
}

/// What one unit may reach.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// `network.allow` as applied; empty allows nothing.
    pub allow: AllowList,
    /// `network.hosts`: names pinned to an address (like `--add-host`), consulted
    /// before the resolver. A pinned address is judged like any other.
    pub hosts: BTreeMap<HostName, IpAddr>,
    /// Whether private destinations are allowed.
    pub private_destinations: PrivateDestinations,
    /// The host's own addresses (its interfaces, as the caller found them).
    pub host_addresses: BTreeSet<IpAddr>,
}

/// Per-unit limits, enforced in the proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    /// Connections open at once (tunnels and plain-HTTP connections alike); one more is
    /// answered 429.
    pub max_connections: NonZeroUsize,
    /// Bytes per second, shared by all of the unit's connections, for each direction
    /// separately (a download at the cap does not starve its own upload of acks and
    /// requests). `None` is no cap.
    pub bytes_per_second: Option<NonZeroU64>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: NonZeroUsize::MIN.saturating_add(255),
            bytes_per_second: None,
        }
    }
}

/// Timeouts and protocol knobs; the defaults suit a unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// Ports where the first bytes of a tunnel must be a TLS ClientHello whose server
    /// name is the `CONNECT` host. On other ports a ClientHello is checked the same way
    /// when one comes, and other protocols pass.
    pub tls_ports: BTreeSet<u16>,
    /// How long a client may take to send a request head (and how long an idle
    /// keep-alive connection is kept).
    pub head_timeout: Duration,
    /// How long a client may take to send its whole ClientHello.
    pub client_hello_timeout: Duration,
    /// How long resolving and connecting upstream may take.
    pub connect_timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            tls_ports: BTreeSet::from([443, 8443]),
            head_timeout: Duration::from_secs(30),
            client_hello_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// Who the connections of a proxy belong to; copied into every event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct UnitIdentity {
    /// The session id.
    pub session: String,
    /// The unit's name within the session.
    pub unit: String,
}

/// The live policy of one running unit and the bound it may be restored up to.
#[derive(Debug)]
pub struct PolicyHandle {
    bound: AllowList,
    sender: watch::Sender<Arc<Policy>>,
}

impl PolicyHandle {
    /// Start with `policy`; `bound` is the profile's list, which the unit's list may
    /// later be restored up to but never exceed.
    pub fn new(policy: Policy, bound: AllowList) -> Result<Self, NarrowingError> {
        check_within(&policy.allow, &bound)?;
        let (sender, _) = watch::channel(Arc::new(policy));
        Ok(Self { bound, sender })
    }

    /// A receiver for the proxy ([`crate::Unit::policy`]).
    pub fn subscribe(&self) -> watch::Receiver<Arc<Policy>> {
        self.sender.subscribe()
    }

    /// The list in force.
    pub fn allow(&self) -> AllowList {
        self.sender.borrow().allow.clone()
    }

    /// The profile's bound.
    pub fn bound(&self) -> &AllowList {
        &self.bound
    }

    /// `box/network.set`: make `allow` the unit's list, provided it is within the
    /// bound; answers the new effective list. Connections opened from now on, and the
    /// next request of a keep-alive connection, are judged by it.
    pub fn set_allow(&self, allow: AllowList) -> Result<AllowList, NarrowingError> {
        check_within(&allow, &self.bound)?;
        self.sender.send_modify(|policy| {
            let mut next = Policy::clone(policy);
            next.allow = allow.clone();
            *policy = Arc::new(next);
        });
        Ok(allow)
    }
}

fn check_within(allow: &AllowList, bound: &AllowList) -> Result<(), NarrowingError> {
    match allow.first_outside(bound) {
        None => Ok(()),
        Some(rule) => Err(NarrowingError {
            rule: rule.clone(),
            bound: bound.clone(),
        }),
    }
}

/// A list that would widen the unit's egress past the profile's bound.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "network.allow: {rule} allows more than the profile's bound {bound}; a running unit's list may only be narrowed, or restored up to that bound"
)]
pub struct NarrowingError {
    /// The first rule outside the bound.
    pub rule: Rule,
    /// The bound.
    pub bound: AllowList,
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn list(entries: &[&str]) -> AllowList {
        AllowList::parse(entries).unwrap()
    }

    #[test]
    fn a_running_list_narrows_and_restores_within_its_bound() {
        let bound = list(&["a.test", "*.b.test"]);
        let policy = Policy {
            allow: list(&["a.test"]),
            ..Policy::default()
        };
        let handle = PolicyHandle::new(policy, bound.clone()).unwrap();
        let receiver = handle.subscribe();
        assert_eq!(handle.set_allow(list(&[])), Ok(list(&[])));
        assert_eq!(receiver.borrow().allow, list(&[]));
        assert_eq!(handle.set_allow(bound.clone()), Ok(bound.clone()));
        assert_eq!(receiver.borrow().allow, bound);
        let error = handle.set_allow(list(&["a.test", "c.test"])).unwrap_err();
        assert_eq!(
            error.to_string(),
            "network.allow: c.test allows more than the profile's bound [*.b.test, a.test]; a running unit's list may only be narrowed, or restored up to that bound"
        );
        assert_eq!(handle.allow(), bound);
        assert!(
            PolicyHandle::new(
                Policy {
                    allow: list(&["c.test"]),
                    ..Policy::default()
                },
                bound
            )
            .is_err()
        );
    }
}
