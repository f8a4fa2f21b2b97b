//! The `network.allow` grammar, the one reading of it in box: what one entry allows,
//! whether a list allows a destination (and by which rule), and whether one list is
//! within another. The profile, a session's tightening, the plan's narrowing and the
//! host's egress proxy (`box-egress`, which re-exports it) all read entries here.
//!
//! An entry is one of
//!
//! | written              | allows                                                        |
//! |----------------------|---------------------------------------------------------------|
//! | `example.com`        | that name, ports 80 and 443                                   |
//! | `example.com:8443`   | that name, that port only                                     |
//! | `*.example.com`      | every name one or more labels below it, never `example.com` itself; ports 80 and 443 |
//! | `*.example.com:22`   | the same names, that port only                                |
//! | `192.0.2.7`, `[2001:db8::7]:8080` | that address written literally, never a name that resolves to it |
//!
//! Names are case-folded, lose one trailing dot and must be A-labels. A wildcard is only
//! a whole first label and needs two labels after it (`*`, `*.com`, `a*.example.com`,
//! `a.*.example.com` are refused). A bare host means ports 80 and 443, not every port
//! (a bare `github.com` must not open SSH), and a name whose last label is a number
//! (`127.1`, `a.123`, `0x7f000001`) is refused, because resolvers read those as IPv4
//! addresses.
//!
//! An empty list allows nothing. Whether a destination's *address* may be reached is a
//! separate check (box-egress's `check_address`), made after a rule matched.

mod host;

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

pub use host::{Host, HostError, HostName, parse_authority, split_authority};

/// The ports a bare host (no `:port`) allows.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];

/// One allow entry.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct Rule {
    host: RuleHost,
    ports: RulePorts,
}

/// What a rule matches on the host side.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RuleHost {
    /// Exactly this name.
    Name(HostName),
    /// Every name one or more labels below this base (`*.base`), never the base.
    Below(HostName),
    /// This address, written literally by the client.
    Ip(IpAddr),
}

/// What a rule matches on the port side.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RulePorts {
    /// The default ports, 80 and 443 (a bare host).
    Default,
    /// This port only.
    One(u16),
}

impl RulePorts {
    fn allows(self, port: u16) -> bool {
        match self {
            Self::Default => DEFAULT_PORTS.contains(&port),
            Self::One(one) => one == port,
        }
    }

    fn each(&self) -> &[u16] {
        match self {
            Self::Default => &DEFAULT_PORTS,
            Self::One(port) => std::slice::from_ref(port),
        }
    }
}

impl Rule {
    /// Parse one entry; the error names the entry and what would be accepted.
    pub fn parse(text: &str) -> Result<Self, RuleError> {
        let problem = |problem: String| RuleError {
            entry: text.to_owned(),
            problem,
        };
        let host_problem = |error: HostError| {
            if error.text() == text {
                problem(error.problem().to_owned())
            } else {
                problem(format!(
                    "has a host {:?} that {}",
                    error.text(),
                    error.problem()
                ))
            }
        };
        if text.contains("://") {
            return Err(problem("has a scheme; write only the host".to_owned()));
        }
        if text.contains(['/', '@', '?', '#']) || text.chars().any(char::is_whitespace) {
            return Err(problem(
                "is not host[:port]; no path, user, query or spaces".to_owned(),
            ));
        }
        if text.starts_with("*.[") {
            return Err(problem(
                "puts a wildcard on an IP address; name the address itself".to_owned(),
            ));
        }
        let (host_text, port) = split_authority(text).map_err(host_problem)?;
        let ports = port.map_or(RulePorts::Default, RulePorts::One);
        let host = match host_text.strip_prefix("*.") {
            Some(base) => {
                if base.contains('*') {
                    return Err(problem(
                        "has more than one wildcard; a wildcard is only a whole first label, like *.example.com".to_owned(),
                    ));
                }
                let base = match Host::parse(base).map_err(host_problem)? {
                    Host::Name(name) => name,
                    Host::Ip(_) => {
                        return Err(problem(
                            "puts a wildcard on an IP address; name the address itself".to_owned(),
                        ));
                    }
                };
                if base.label_count() < 2 {
                    return Err(problem(format!(
                        "would allow every name under the top-level domain {base:?}; a wildcard needs two labels after it, like *.example.com"
                    )));
                }
                RuleHost::Below(base)
            }
            None if host_text == "*" => {
                return Err(problem(
                    "would allow every host; list the hosts (an empty list allows nothing)"
                        .to_owned(),
                ));
            }
            None if host_text.contains('*') => {
                return Err(problem(
                    "has a wildcard that is not a whole first label; write *.example.com"
                        .to_owned(),
                ));
            }
            None => match Host::parse(host_text).map_err(host_problem)? {
                Host::Name(name) => RuleHost::Name(name),
                Host::Ip(address) => RuleHost::Ip(address),
            },
        };
        Ok(Self { host, ports })
    }

    /// The host side of the rule.
    pub fn host(&self) -> &RuleHost {
        &self.host
    }

    /// The port side of the rule.
    pub fn ports(&self) -> RulePorts {
        self.ports
    }

    /// Whether this rule lets a client reach `host` on `port`. IP literals match only
    /// rules naming the same address; names match only name rules (no reverse lookup).
    pub fn allows(&self, host: &Host, port: u16) -> bool {
        self.ports.allows(port)
            && match (&self.host, host) {
                (RuleHost::Name(rule), Host::Name(name)) => rule == name,
                (RuleHost::Below(base), Host::Name(name)) => name.is_under(base),
                (RuleHost::Ip(rule), Host::Ip(address)) => rule == address,
                (RuleHost::Name(_) | RuleHost::Below(_), Host::Ip(_))
                | (RuleHost::Ip(_), Host::Name(_)) => false,
            }
    }

    /// Whether every destination this rule allows, `bound` allows too.
    pub fn is_within(&self, bound: &AllowList) -> bool {
        // Port by port, so a bare host is within a list that allows it on 80 and on 443
        // through two rules.
        self.ports.each().iter().all(|&port| {
            bound
                .rules
                .iter()
                .any(|rule| rule.ports.allows(port) && host_within(&self.host, &rule.host))
        })
    }
}

/// Whether every host `narrow` matches, `wide` matches too.
fn host_within(narrow: &RuleHost, wide: &RuleHost) -> bool {
    match (narrow, wide) {
        (RuleHost::Name(name), RuleHost::Name(bound)) => name == bound,
        (RuleHost::Name(name), RuleHost::Below(base)) => name.is_under(base),
        (RuleHost::Below(base), RuleHost::Below(bound)) => base == bound || base.is_under(bound),
        (RuleHost::Ip(address), RuleHost::Ip(bound)) => address == bound,
        (RuleHost::Below(_), RuleHost::Name(_))
        | (RuleHost::Name(_) | RuleHost::Below(_), RuleHost::Ip(_))
        | (RuleHost::Ip(_), RuleHost::Name(_) | RuleHost::Below(_)) => false,
    }
}

impl fmt::Display for Rule {
    /// The canonical spelling: lower case, no trailing dot, IPv6 in brackets.
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            RuleHost::Name(name) => write!(formatter, "{name}")?,
            RuleHost::Below(base) => write!(formatter, "*.{base}")?,
            RuleHost::Ip(IpAddr::V4(address)) => write!(formatter, "{address}")?,
            RuleHost::Ip(IpAddr::V6(address)) => write!(formatter, "[{address}]")?,
        }
        match self.ports {
            RulePorts::Default => Ok(()),
            RulePorts::One(port) => write!(formatter, ":{port}"),
        }
    }
}

impl FromStr for Rule {
    type Err = RuleError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

impl TryFrom<String> for Rule {
    type Error = RuleError;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        Self::parse(&text)
    }
}

impl From<Rule> for String {
    fn from(rule: Rule) -> Self {
        rule.to_string()
    }
}

/// An allow entry that is not one; names the entry and what is accepted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "allow entry {entry:?} {problem}; write host, *.suffix or host:port, like \"example.com\" (ports 80 and 443), \"*.example.com\" or \"example.com:8443\""
)]
pub struct RuleError {
    entry: String,
    problem: String,
}

/// A set of rules: `network.allow` as applied. Kept sorted by spelling and without duplicates, so
/// equal lists compare, print and serialise the same.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "Vec<Rule>", into = "Vec<Rule>")]
pub struct AllowList {
    rules: Vec<Rule>,
}

impl AllowList {
    /// A list of these rules (sorted, duplicates dropped).
    pub fn new(rules: impl IntoIterator<Item = Rule>) -> Self {
        let mut rules: Vec<Rule> = rules.into_iter().collect();
        // By spelling, which is canonical and one-to-one, so the order reads well.
        rules.sort_by_cached_key(Rule::to_string);
        rules.dedup();
        Self { rules }
    }

    /// Parse every entry; the first bad one is the error.
    pub fn parse<S: AsRef<str>>(entries: impl IntoIterator<Item = S>) -> Result<Self, RuleError> {
        let rules = entries
            .into_iter()
            .map(|entry| Rule::parse(entry.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self::new(rules))
    }

    /// The rules, in canonical order.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Whether the list allows nothing.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The first rule (in canonical order) that allows `host` on `port`.
    pub fn find(&self, host: &Host, port: u16) -> Option<&Rule> {
        self.rules.iter().find(|rule| rule.allows(host, port))
    }

    /// Whether every destination `self` allows, `bound` allows too.
    pub fn is_within(&self, bound: &AllowList) -> bool {
        self.first_outside(bound).is_none()
    }

    /// The first rule of `self` that allows something `bound` does not.
    pub fn first_outside(&self, bound: &AllowList) -> Option<&Rule> {
        self.rules.iter().find(|rule| !rule.is_within(bound))
    }
}

impl From<AllowList> for Vec<Rule> {
    fn from(list: AllowList) -> Self {
        list.rules
    }
}

impl From<Vec<Rule>> for AllowList {
    fn from(rules: Vec<Rule>) -> Self {
        Self::new(rules)
    }
}

impl fmt::Display for AllowList {
    /// `[a, b]`, or `[]` for a list that allows nothing.
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("[")?;
        for (index, rule) in self.rules.iter().enumerate() {
            if index > 0 {
                formatter.write_str(", ")?;
            }
            write!(formatter, "{rule}")?;
        }
        formatter.write_str("]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn rule(text: &str) -> Rule {
        Rule::parse(text).unwrap()
    }

    fn list(entries: &[&str]) -> AllowList {
        AllowList::parse(entries).unwrap()
    }

    fn host(text: &str) -> Host {
        Host::parse(text).unwrap()
    }

    #[test]
    fn entries_parse_to_their_canonical_spelling() {
        for (written, canonical) in [
            ("example.com", "example.com"),
            ("Example.COM.", "example.com"),
            ("example.com:8443", "example.com:8443"),
            ("*.Example.com", "*.example.com"),
            ("*.example.com:22", "*.example.com:22"),
            ("*.co.uk", "*.co.uk"),
            ("192.0.2.7", "192.0.2.7"),
            ("10.0.0.1:80", "10.0.0.1:80"),
            ("[::1]:8080", "[::1]:8080"),
            ("[2001:DB8::7]", "[2001:db8::7]"),
            ("xn--bcher-kva.example", "xn--bcher-kva.example"),
        ] {
            assert_eq!(rule(written).to_string(), canonical, "{written}");
        }
    }

    #[test]
    fn bad_entries_name_the_entry_and_what_is_accepted() {
        for (entry, fragment) in [
            ("*", "every host"),
            ("*:443", "every host"),
            ("*.com", "top-level domain"),
            ("*.com.", "top-level domain"),
            ("a*.example.com", "whole first label"),
            ("a.*.example.com", "whole first label"),
            ("*.*.example.com", "more than one wildcard"),
            ("**.example.com", "whole first label"),
            ("*.10.0.0.1", "wildcard on an IP address"),
            ("*.[::1]", "wildcard on an IP address"),
            (
                "bad_host:80",
                "has a host \"bad_host\" that is not a host name",
            ),
            ("https://example.com", "scheme"),
            ("example.com/path", "no path"),
            ("user@example.com", "no path, user"),
            ("a b", "spaces"),
            ("", "is empty"),
            ("example.com:0", "1 to 65535"),
            ("example.com:http", "1 to 65535"),
            ("host:1:2", "1 to 65535"),
            ("[::1", "does not close"),
            ("bücher.example", "A-label"),
            ("127.1", "unusual spelling"),
            ("2130706433", "unusual spelling"),
            ("0x7f000001:80", "unusual spelling"),
            ("0", "unusual spelling"),
        ] {
            let error = Rule::parse(entry).unwrap_err().to_string();
            assert!(
                error.starts_with(&format!("allow entry {entry:?} ")),
                "{entry}: {error}"
            );
            assert!(error.contains(fragment), "{entry}: {error}");
            assert!(
                error.contains("write host, *.suffix or host:port"),
                "{error}"
            );
        }
    }

    #[test]
    fn matching_names_the_rule() {
        let allow = list(&[
            "example.com",
            "*.example.org",
            "api.test:8443",
            "192.0.2.7:22",
        ]);
        let check = |target: &str, port, expected: Option<&str>| {
            let found = allow.find(&host(target), port).map(Rule::to_string);
            assert_eq!(found.as_deref(), expected, "{target}:{port}");
        };
        check("example.com", 443, Some("example.com"));
        check("EXAMPLE.com.", 80, Some("example.com"));
        check("example.com", 22, None);
        check("example.com", 8443, None);
        check("www.example.com", 443, None);
        check("a.example.org", 443, Some("*.example.org"));
        check("a.b.example.org", 80, Some("*.example.org"));
        check("example.org", 443, None);
        check("badexample.org", 443, None);
        check("api.test", 8443, Some("api.test:8443"));
        check("api.test", 443, None);
        check("192.0.2.7", 22, Some("192.0.2.7:22"));
        check("192.0.2.7", 443, None);
        check("[::ffff:192.0.2.7]", 22, None);
        assert_eq!(AllowList::default().find(&host("example.com"), 443), None);
    }

    #[test]
    fn ip_literals_match_only_ip_rules_and_names_only_name_rules() {
        let allow = list(&["example.com", "*.example.com"]);
        assert_eq!(allow.find(&host("93.184.216.34"), 443), None);
        let allow = list(&["93.184.216.34"]);
        assert_eq!(allow.find(&host("example.com"), 443), None);
    }

    #[test]
    fn narrowing_is_set_inclusion() {
        let within = |narrow: &[&str], wide: &[&str]| list(narrow).is_within(&list(wide));
        assert!(within(&[], &[]));
        assert!(within(&[], &["example.com"]));
        assert!(!within(&["example.com"], &[]));
        assert!(within(&["example.com:443"], &["example.com"]));
        assert!(within(&["example.com:80"], &["example.com"]));
        assert!(!within(&["example.com:22"], &["example.com"]));
        assert!(!within(&["example.com"], &["example.com:443"]));
        assert!(within(
            &["example.com"],
            &["example.com:443", "example.com:80"]
        ));
        assert!(within(&["a.example.com"], &["*.example.com"]));
        assert!(!within(&["example.com"], &["*.example.com"]));
        assert!(within(&["*.a.example.com"], &["*.example.com"]));
        assert!(within(&["*.example.com:443"], &["*.example.com"]));
        assert!(!within(&["*.example.com"], &["a.example.com"]));
        assert!(!within(&["*.example.com"], &["*.a.example.com"]));
        assert!(within(&["192.0.2.7:80"], &["192.0.2.7"]));
        assert!(!within(&["192.0.2.7"], &["example.com"]));
        assert!(!within(&["example.com"], &["192.0.2.7"]));
        assert!(within(
            &["example.com", "b.example.org"],
            &["*.example.org", "example.com"]
        ));
        assert_eq!(
            list(&["a.test", "b.test"]).first_outside(&list(&["a.test"])),
            Some(&rule("b.test"))
        );
    }

    #[test]
    fn lists_are_sorted_deduplicated_and_serialise_as_strings() {
        let allow = list(&["b.test", "A.test", "a.test", "*.c.test:22"]);
        assert_eq!(allow.to_string(), "[*.c.test:22, a.test, b.test]");
        let json = serde_json::to_string(&allow).unwrap();
        assert_eq!(json, r#"["*.c.test:22","a.test","b.test"]"#);
        let back: AllowList = serde_json::from_str(r#"["b.test","*.c.test:22","a.test"]"#).unwrap();
        assert_eq!(back, allow);
        let error = serde_json::from_str::<AllowList>(r#"["*"]"#).unwrap_err();
        assert!(error.to_string().contains("every host"), "{error}");
    }

    /// The entries a profile's `network.allow` was tested with when the profile
    /// read them with a grammar of its own, read the same way here.
    #[test]
    fn the_profiles_entries_parse_and_narrow() {
        for entry in [
            "Example.com:443",
            "[::1]:8080",
            "10.0.0.1",
            "example.com",
            "a-b.example.com:1",
        ] {
            assert!(Rule::parse(entry).is_ok(), "{entry}");
        }
        let entry = rule("Example.com:443");
        assert_eq!(entry.to_string(), "example.com:443");
        assert_eq!(rule("[::1]:8080").to_string(), "[::1]:8080");
        assert_eq!(rule("10.0.0.1").ports(), RulePorts::Default);
        for bad in [
            "https://example.com",
            "example.com:0",
            "example.com:http",
            "*.com",
            "a*.example.com",
            "a.*.example.com",
            "127.1",
            "a.123",
            "",
            "a b",
            "example.com/path",
            "[::1",
            "host:1:2",
        ] {
            assert!(Rule::parse(bad).is_err(), "{bad}");
        }
        // A bare host is ports 80 and 443, not every port.
        let within = |narrow: &str, wide: &str| rule(narrow).is_within(&list(&[wide]));
        assert!(within("example.com:443", "example.com"));
        assert!(!within("example.com", "example.com:443"));
        assert!(!within("example.com:22", "example.com"));
        assert!(!within("example.com:443", "example.org:443"));
        // Wildcards: every name below the base, never the base itself.
        assert_eq!(rule("*.Example.com.").to_string(), "*.example.com");
        assert!(within("api.example.com", "*.example.com"));
        assert!(within("*.api.example.com", "*.example.com"));
        assert!(!within("example.com", "*.example.com"));
        assert!(!within("*.example.com", "example.com"));
        assert!(!within("badexample.com", "*.example.com"));
    }
}
