//! The one strict host parser: every host box judges (an allow rule or a pinned name in
//! a profile, and in the egress proxy a `CONNECT` authority, an absolute URL, a `Host`
//! header, a TLS server name) goes through [`Host::parse`], so no two places can
//! disagree about what a text names.
//!
//! Strictness is the point. A name is ASCII letters, digits and hyphens in dot-separated
//! labels (IDNA A-labels, never Unicode); an IPv4 address is four decimal numbers
//! without leading zeros; an IPv6 address is bracketed, without a zone. Anything whose
//! last label is a number but is not such an address (`127.1`, `2130706433`,
//! `0x7f000001`, `0`, `0177.0.0.1`) is refused: resolvers and URL parsers read those as
//! addresses in odd spellings, and the allowlist must never treat them as names.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::Serialize;

/// A DNS name: lower case, A-labels only, without a trailing dot, never an IP address.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct HostName(String);

impl HostName {
    /// Parse a name; an IP address or an odd IPv4 spelling is refused.
    pub fn parse(text: &str) -> Result<Self, HostError> {
        match Host::parse(text)? {
            Host::Name(name) => Ok(name),
            Host::Ip(_) => Err(HostError::new(text, "is an IP address, not a name")),
        }
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `self` is a proper subdomain of `base` (one or more labels before it;
    /// never `base` itself).
    pub fn is_under(&self, base: &HostName) -> bool {
        self.0
            .strip_suffix(base.as_str())
            .is_some_and(|head| head.len() > 1 && head.ends_with('.'))
    }

    /// How many labels the name has.
    pub(crate) fn label_count(&self) -> usize {
        self.0.split('.').count()
    }
}

impl fmt::Display for HostName {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&self.0)
    }
}

/// A host as the proxy judges it: a name, or an IP address written literally.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Host {
    /// A DNS name; it reaches an address only through the host's resolver or a pin.
    Name(HostName),
    /// An IP address literal; it matches only rules that name the same address.
    Ip(IpAddr),
}

impl Host {
    /// Parse a host as written in a URL authority: a name (case-folded, one trailing
    /// dot dropped), a dotted-quad IPv4 address, or a bracketed IPv6 address.
    pub fn parse(text: &str) -> Result<Self, HostError> {
        if text.is_empty() {
            return Err(HostError::new(text, "is empty"));
        }
        if !text.is_ascii() {
            return Err(HostError::new(
                text,
                "is not ASCII; write an internationalised name as its A-label (xn--…), as `idn2` prints it",
            ));
        }
        if let Some(inner) = text.strip_prefix('[') {
            let Some(inner) = inner.strip_suffix(']') else {
                return Err(HostError::new(text, "opens a bracket it does not close"));
            };
            if inner.contains('%') {
                return Err(HostError::new(
                    text,
                    "carries an IPv6 zone id; write the address without %zone",
                ));
            }
            return match inner.parse::<Ipv6Addr>() {
                Ok(address) => Ok(Self::Ip(IpAddr::V6(address))),
                Err(_) => Err(HostError::new(text, "is not an IPv6 address")),
            };
        }
        if text.contains(':') {
            return Err(HostError::new(
                text,
                "is not a host; an IPv6 address is written in brackets, like [2001:db8::1]",
            ));
        }
        let lower = text.to_ascii_lowercase();
        let name = match lower.strip_suffix('.') {
            Some("") => return Err(HostError::new(text, "is empty")),
            Some(stripped) => stripped,
            None => lower.as_str(),
        };
        let last_label = name.rsplit('.').next().unwrap_or(name);
        if is_numeric_label(last_label) {
            // Rust's parser takes exactly four decimal octets and refuses leading zeros,
            // which is the one IPv4 spelling accepted here.
            return match name.parse::<Ipv4Addr>() {
                Ok(address) => Ok(Self::Ip(IpAddr::V4(address))),
                Err(_) => Err(HostError::new(
                    text,
                    "reads as an IPv4 address in an unusual spelling; write four decimal numbers, like 192.0.2.1",
                )),
            };
        }
        check_name(text, name)?;
        Ok(Self::Name(HostName(name.to_owned())))
    }

    /// The name, when the host is one.
    pub fn name(&self) -> Option<&HostName> {
        match self {
            Self::Name(name) => Some(name),
            Self::Ip(_) => None,
        }
    }
}

impl fmt::Display for Host {
    /// As written in an authority: IPv6 in brackets.
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Name(name) => name.fmt(formatter),
            Self::Ip(IpAddr::V4(address)) => address.fmt(formatter),
            Self::Ip(IpAddr::V6(address)) => write!(formatter, "[{address}]"),
        }
    }
}

/// A host text that is not a host box accepts.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} {problem}")]
pub struct HostError {
    text: String,
    problem: &'static str,
}

impl HostError {
    /// The text that is not a host.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// What is wrong with it, as a verb phrase ("is empty").
    pub fn problem(&self) -> &str {
        self.problem
    }

    fn new(text: &str, problem: &'static str) -> Self {
        Self {
            text: text.to_owned(),
            problem,
        }
    }
}

/// Split `host[:port]` (IPv6 in brackets) and parse both halves; `default_port` is
/// used when the port is absent, and a missing port with no default is an error.
pub fn parse_authority(text: &str, default_port: Option<u16>) -> Result<(Host, u16), HostError> {
    let (host, port) = split_authority(text)?;
    let port = match (port, default_port) {
        (Some(port), _) | (None, Some(port)) => port,
        (None, None) => {
            return Err(HostError::new(
                text,
                "has no port; write host:port, like example.com:443",
            ));
        }
    };
    Ok((Host::parse(host)?, port))
}

/// Split `host[:port]` into the host text and the port, if any.
pub fn split_authority(text: &str) -> Result<(&str, Option<u16>), HostError> {
    let (host, port) = if text.starts_with('[') {
        match text.find(']') {
            Some(end) => {
                let (host, rest) = text.split_at(end + 1);
                match rest {
                    "" => (host, None),
                    _ => match rest.strip_prefix(':') {
                        Some(port) => (host, Some(port)),
                        None => return Err(HostError::new(text, "has text after the bracket")),
                    },
                }
            }
            None => return Err(HostError::new(text, "opens a bracket it does not close")),
        }
    } else {
        match text.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        }
    };
    let port = match port {
        None => None,
        Some(port) => Some(parse_port(text, port)?),
    };
    Ok((host, port))
}

fn parse_port(text: &str, port: &str) -> Result<u16, HostError> {
    let digits = !port.is_empty() && port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit());
    match port.parse::<u16>() {
        Ok(number) if digits && number > 0 => Ok(number),
        _ => Err(HostError::new(
            text,
            "has a port that is not a number from 1 to 65535",
        )),
    }
}

/// Whether a label is a number as some IPv4 parser reads it: decimal, octal with a
/// leading zero, or hexadecimal with `0x`.
fn is_numeric_label(label: &str) -> bool {
    let hex = label
        .strip_prefix("0x")
        .is_some_and(|digits| digits.bytes().all(|b| b.is_ascii_hexdigit()));
    hex || (!label.is_empty() && label.bytes().all(|b| b.is_ascii_digit()))
}

fn check_name(text: &str, name: &str) -> Result<(), HostError> {
    if name.len() > 253 {
        return Err(HostError::new(text, "is longer than 253 characters"));
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err(HostError::new(
                text,
                "has an empty label (two dots in a row)",
            ));
        }
        if label.len() > 63 {
            return Err(HostError::new(
                text,
                "has a label longer than 63 characters",
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(HostError::new(
                text,
                "has a label that starts or ends with a hyphen",
            ));
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return Err(HostError::new(
                text,
                "is not a host name; a name is letters, digits and hyphens between dots (no scheme, path, port or wildcard here)",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn check(text: &str, expected: Result<&str, &str>) {
        let got = Host::parse(text).map(|host| host.to_string());
        match expected {
            Ok(host) => assert_eq!(got, Ok(host.to_owned()), "{text:?}"),
            Err(fragment) => {
                let error = got.expect_err(text).to_string();
                assert!(error.contains(fragment), "{text:?}: {error}");
            }
        }
    }

    #[test]
    fn names_are_case_folded_and_lose_one_trailing_dot() {
        check("Example.COM", Ok("example.com"));
        check("example.com.", Ok("example.com"));
        check("localhost.", Ok("localhost"));
        check("xn--bcher-kva.example", Ok("xn--bcher-kva.example"));
        check("127.0.0.1.nip.io", Ok("127.0.0.1.nip.io"));
        check("a-b.c0", Ok("a-b.c0"));
        check("example.com..", Err("empty label"));
        check(".", Err("is empty"));
        check("", Err("is empty"));
    }

    #[test]
    fn addresses_are_strict() {
        check("192.0.2.1", Ok("192.0.2.1"));
        check("192.0.2.1.", Ok("192.0.2.1"));
        check("[::1]", Ok("[::1]"));
        check("[::FFFF:169.254.169.254]", Ok("[::ffff:169.254.169.254]"));
        check("[2001:DB8::1]", Ok("[2001:db8::1]"));
    }

    #[test]
    fn odd_ipv4_spellings_are_refused() {
        for odd in [
            "127.1",
            "2130706433",
            "0x7f000001",
            "0X7F000001",
            "0",
            "0177.0.0.1",
            "127.0.0.01",
            "127.0.0.1.2",
            "1.2.3.256",
            "127.0x0.0.1",
            "0x7f.1",
            "example.0x",
            "example.123",
        ] {
            check(odd, Err("unusual spelling"));
        }
    }

    #[test]
    fn what_is_not_a_host_is_refused() {
        check("bücher.example", Err("A-label"));
        check("[fe80::1%eth0]", Err("zone id"));
        check("[fe80::1%25eth0]", Err("zone id"));
        check("[::1", Err("does not close"));
        check("[example.com]", Err("not an IPv6"));
        check("::1", Err("brackets"));
        check("exa_mple.com", Err("letters, digits and hyphens"));
        check("*.example.com", Err("letters, digits and hyphens"));
        check("user@example.com", Err("letters, digits and hyphens"));
        check("-a.example.com", Err("hyphen"));
        check(&format!("{}.com", "a".repeat(64)), Err("63"));
        check(&format!("{}com", "a.".repeat(127)), Err("253"));
    }

    #[test]
    fn authorities_split_host_and_port() {
        let parse = |text| parse_authority(text, None).map(|(h, p)| format!("{h} {p}"));
        assert_eq!(parse("Example.com:443"), Ok("example.com 443".to_owned()));
        assert_eq!(parse("[::1]:8080"), Ok("[::1] 8080".to_owned()));
        for bad in [
            "example.com",
            "example.com:",
            "example.com:0",
            "example.com:65536",
            "example.com:+80",
            "example.com:80:80",
            "[::1]8080",
            "[::1]",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_authority("example.com", Some(80)).map(|(_, p)| p),
            Ok(80)
        );
    }

    #[test]
    fn subdomains_are_under_their_base_never_the_apex() {
        let name = |text| HostName::parse(text).unwrap();
        assert!(name("a.example.com").is_under(&name("example.com")));
        assert!(name("a.b.example.com").is_under(&name("example.com")));
        assert!(!name("example.com").is_under(&name("example.com")));
        assert!(!name("badexample.com").is_under(&name("example.com")));
        assert!(HostName::parse("10.0.0.1").is_err());
    }
}
