//! What the proxy reports: one [`Event`] per attempt (a `CONNECT`, or one plain-HTTP
//! request), with the decision and, for an allowed one, the bytes and time it took.
//! The caller turns events into audit lines and metrics; [`Decision::outcome`] is the
//! metric label.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

use crate::address::AddressRange;
use crate::{HostError, Rule};

/// One connection attempt, reported when it ends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// The session the unit belongs to.
    pub session: String,
    /// The unit.
    pub unit: String,
    /// `CONNECT`, or the plain-HTTP method.
    pub method: String,
    /// The host asked for, as parsed (or as written, when it did not parse; empty when
    /// no request head arrived).
    pub host: String,
    /// The port asked for (0 when none could be read).
    pub port: u16,
    /// The TLS server name the client sent in a tunnel, if any.
    pub sni: Option<String>,
    /// The upstream address connected to.
    pub address: Option<SocketAddr>,
    /// Allowed by which rule, refused and why, or failed upstream.
    pub decision: Decision,
    /// Bytes forwarded from the unit to upstream.
    pub bytes_up: u64,
    /// Bytes forwarded from upstream to the unit.
    pub bytes_down: u64,
    /// From the first byte of the request to the end of the exchange.
    #[serde(rename = "durationMs", serialize_with = "milliseconds")]
    pub duration: Duration,
    /// Why an allowed exchange ended early (an I/O error), if it did.
    pub error: Option<String>,
}

fn milliseconds<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_f64(duration.as_secs_f64() * 1e3)
}

/// What became of an attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// A rule allowed it and the proxy connected.
    Allowed {
        /// The rule that matched.
        rule: Rule,
    },
    /// The proxy refused it.
    Refused(Refusal),
    /// A rule allowed it but upstream could not be reached (answered 502).
    Failed {
        /// The rule that matched.
        rule: Rule,
        /// What went wrong.
        failure: Failure,
    },
}

impl Decision {
    /// `allowed`, `refused` or `failed`: the metric label.
    pub fn outcome(&self) -> &'static str {
        match self {
            Self::Allowed { .. } => "allowed",
            Self::Refused(_) => "refused",
            Self::Failed { .. } => "failed",
        }
    }
}

impl Serialize for Decision {
    /// `{"outcome": "allowed", "rule": "example.com"}`,
    /// `{"outcome": "refused", "reason": "sni-mismatch", "detail": "..."}`,
    /// `{"outcome": "failed", "rule": "...", "reason": "connect-failed", "detail": "..."}`.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("outcome", self.outcome())?;
        match self {
            Self::Allowed { rule } => map.serialize_entry("rule", rule)?,
            Self::Refused(refusal) => {
                map.serialize_entry("reason", refusal.reason())?;
                map.serialize_entry("detail", &refusal.to_string())?;
            }
            Self::Failed { rule, failure } => {
                map.serialize_entry("rule", rule)?;
                map.serialize_entry("reason", failure.reason())?;
                map.serialize_entry("detail", &failure.to_string())?;
            }
        }
        map.end()
    }
}

/// Why the proxy refused an attempt. Before a tunnel is open the client gets an HTTP
/// answer with [`Refusal::status`] and a one-line body; the TLS refusals happen inside
/// an open tunnel, where the client gets a TLS alert (or the connection closes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The request head is not HTTP/1.x the proxy accepts (400).
    BadRequest(String),
    /// The request head is longer than the bound (431).
    HeadTooLarge {
        /// The bound in bytes.
        limit: usize,
    },
    /// No whole request head arrived in time (408).
    HeadTimeout,
    /// The host is not one box accepts, e.g. an odd IPv4 spelling (403).
    BadHost(HostError),
    /// No rule allows the host and port (403).
    NotAllowed,
    /// An absolute-form request whose `Host` header names another authority (403).
    HostMismatch {
        /// What the `Host` header said.
        header: String,
    },
    /// The destination's address is forbidden (403).
    ForbiddenAddress {
        /// The address.
        address: IpAddr,
        /// The range that forbids it.
        range: AddressRange,
    },
    /// The unit has as many connections open as its limit (429).
    TooManyConnections {
        /// The limit.
        limit: usize,
    },
    /// A TLS port's tunnel did not start with a TLS handshake.
    NotTls,
    /// The ClientHello named no server on a TLS port.
    SniMissing,
    /// The ClientHello named another server than the `CONNECT` host.
    SniMismatch {
        /// The server name sent.
        sni: String,
    },
    /// The ClientHello could not be read.
    ClientHelloInvalid(String),
    /// No whole ClientHello arrived in time.
    ClientHelloTimeout,
}

impl Refusal {
    /// A stable short name: the audit's reason and a metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::BadRequest(_) => "bad-request",
            Self::HeadTooLarge { .. } => "head-too-large",
            Self::HeadTimeout => "head-timeout",
            Self::BadHost(_) => "bad-host",
            Self::NotAllowed => "not-allowed",
            Self::HostMismatch { .. } => "host-mismatch",
            Self::ForbiddenAddress { .. } => "forbidden-address",
            Self::TooManyConnections { .. } => "too-many-connections",
            Self::NotTls => "not-tls",
            Self::SniMissing => "sni-missing",
            Self::SniMismatch { .. } => "sni-mismatch",
            Self::ClientHelloInvalid(_) => "client-hello-invalid",
            Self::ClientHelloTimeout => "client-hello-timeout",
        }
    }

    /// The HTTP status a client gets when the refusal comes before a tunnel is open.
    pub fn status(&self) -> (u16, &'static str) {
        match self {
            Self::BadRequest(_) => (400, "Bad Request"),
            Self::HeadTooLarge { .. } => (431, "Request Header Fields Too Large"),
            Self::HeadTimeout => (408, "Request Timeout"),
            Self::TooManyConnections { .. } => (429, "Too Many Requests"),
            Self::BadHost(_)
            | Self::NotAllowed
            | Self::HostMismatch { .. }
            | Self::ForbiddenAddress { .. }
            | Self::NotTls
            | Self::SniMissing
            | Self::SniMismatch { .. }
            | Self::ClientHelloInvalid(_)
            | Self::ClientHelloTimeout => (403, "Forbidden"),
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadRequest(detail) => write!(formatter, "{detail}"),
            Self::HeadTooLarge { limit } => {
                write!(formatter, "the request head is longer than {limit} bytes")
            }
            Self::HeadTimeout => formatter.write_str("no whole request head arrived in time"),
            Self::BadHost(error) => write!(formatter, "{error}"),
            Self::NotAllowed => formatter.write_str(
                "no rule of network.allow allows this host and port (a bare host allows ports 80 and 443; an IP address is allowed only by a rule naming it)",
            ),
            Self::HostMismatch { header } => write!(
                formatter,
                "the Host header {header:?} names another authority than the request URL"
            ),
            Self::ForbiddenAddress { address, range } => {
                write!(formatter, "resolves to {address}, {range}")
            }
            Self::TooManyConnections { limit } => write!(
                formatter,
                "the unit already has {limit} connections open, its limit"
            ),
            Self::NotTls => formatter.write_str(
                "the tunnel to a TLS port did not start with a TLS ClientHello",
            ),
            Self::SniMissing => {
                formatter.write_str("the TLS ClientHello names no server (SNI)")
            }
            Self::SniMismatch { sni } => write!(
                formatter,
                "the TLS ClientHello names {sni:?}, not the CONNECT host"
            ),
            Self::ClientHelloInvalid(detail) => {
                write!(formatter, "the TLS ClientHello cannot be read: {detail}")
            }
            Self::ClientHelloTimeout => {
                formatter.write_str("no whole TLS ClientHello arrived in time")
            }
        }
    }
}

/// Why an allowed attempt could not reach upstream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The name did not resolve.
    Resolve(String),
    /// No address accepted a connection.
    Connect(String),
    /// Upstream answered something that is not an HTTP/1.x response.
    BadResponse(String),
}

impl Failure {
    /// A stable short name.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Resolve(_) => "resolve-failed",
            Self::Connect(_) => "connect-failed",
            Self::BadResponse(_) => "bad-response",
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Resolve(detail) | Self::Connect(detail) | Self::BadResponse(detail) => {
                formatter.write_str(detail)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn events_serialise_as_one_audit_line() {
        let event = Event {
            session: "s1".to_owned(),
            unit: "work".to_owned(),
            method: "CONNECT".to_owned(),
            host: "example.org".to_owned(),
            port: 443,
            sni: Some("cdn.test".to_owned()),
            address: Some("93.184.216.34:443".parse().unwrap()),
            decision: Decision::Refused(Refusal::SniMismatch {
                sni: "cdn.test".to_owned(),
            }),
            bytes_up: 0,
            bytes_down: 0,
            duration: Duration::from_micros(1500),
            error: None,
        };
        assert_eq!(
            serde_json::to_string(&event).unwrap(),
            r#"{"session":"s1","unit":"work","method":"CONNECT","host":"example.org","port":443,"sni":"cdn.test","address":"93.184.216.34:443","decision":{"outcome":"refused","reason":"sni-mismatch","detail":"the TLS ClientHello names \"cdn.test\", not the CONNECT host"},"bytesUp":0,"bytesDown":0,"durationMs":1.5,"error":null}"#
        );
        let allowed = Decision::Allowed {
            rule: Rule::parse("*.example.org").unwrap(),
        };
        assert_eq!(
            serde_json::to_string(&allowed).unwrap(),
            r#"{"outcome":"allowed","rule":"*.example.org"}"#
        );
    }
}
