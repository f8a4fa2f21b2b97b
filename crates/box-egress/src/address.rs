//! Which addresses a unit may reach once a rule allowed the name, and the one place
//! names become addresses.
//!
//! An address is judged after unwrapping every IPv6 form that carries an IPv4 address
//! (v4-mapped `::ffff:a.b.c.d`, v4-translated `::ffff:0:a.b.c.d`, v4-compatible
//! `::a.b.c.d`, 6to4 `2002:aabb:ccdd::/48`, NAT64 `64:ff9b::/96`), so
//! `[::ffff:169.254.169.254]` is the metadata address it spells.
//!
//! Two tiers, decided here and printed in every refusal:
//! - **never**: unspecified, link-local (all of 169.254/16 and fe80::/10), multicast,
//!   the broadcast address, IPv6 outside global unicast (discard, unassigned space),
//!   Teredo, and the cloud metadata endpoints wherever they live (`fd00:ec2::254` and
//!   `fd20:ce::254` are in the unique-local range, `100.100.100.200` in the shared
//!   range, `168.63.129.16` is public). Like OpenShell, metadata stays refused even
//!   when the operator allows private destinations: no registry lives there, and it is
//!   where a unit would find the host's cloud credentials.
//! - **private destinations**: loopback, RFC 1918, shared (CGNAT), benchmarking and
//!   other special-purpose ranges, the documentation ranges (TEST-NETs, `2001:db8::/32`,
//!   `3fff::/20`), 240/4 (reserved for future use), unique-local, and the host's own
//!   addresses. Refused unless the operator's `allow_dangerous` names
//!   `"private-destinations"`: none of them is the public internet, and each is used
//!   by real networks (carrier-grade NAT, corporate and cloud networks that number
//!   hosts in 240/4 or in a TEST-NET, test networks), where a registry may resolve
//!   to one.
//!
//! A name is resolved once: a pin from `network.hosts` first, else the host's resolver.
//! If any returned address is forbidden the whole name is refused (a rebinding answer
//! that mixes a public and a private address does not get a second chance), and the
//! proxy connects to exactly the addresses judged here, never handing the name on.

use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use serde::Serialize;

use crate::Host;
use crate::policy::{Policy, PrivateDestinations};

/// The cloud metadata endpoints, refused always (those in link-local space are
/// refused as link-local anyway; they are named here so a refusal says what they are).
pub const METADATA_ADDRESSES: [IpAddr; 10] = [
    // AWS, GCP, Azure, OCI, DigitalOcean, OpenStack.
    IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254)),
    // AWS ECS task metadata and credentials.
    IpAddr::V4(Ipv4Addr::new(169, 254, 170, 2)),
    // Alibaba Cloud.
    IpAddr::V4(Ipv4Addr::new(100, 100, 100, 200)),
    // Azure's wire server (a public address that hands out VM configuration).
    IpAddr::V4(Ipv4Addr::new(168, 63, 129, 16)),
    // Oracle Cloud Classic.
    IpAddr::V4(Ipv4Addr::new(192, 0, 0, 192)),
    // Scaleway.
    IpAddr::V4(Ipv4Addr::new(169, 254, 42, 42)),
    // AWS over IPv6 (Nitro).
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254)),
    // AWS EKS Pod Identity Agent over IPv6 (credentials).
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0023)),
    // GCP over IPv6.
    IpAddr::V6(Ipv6Addr::new(0xfd20, 0x00ce, 0, 0, 0, 0, 0, 0x0254)),
    // Scaleway over IPv6.
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0x0042, 0, 0, 0, 0, 0, 0x0042)),
];

/// Why an address may not be reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AddressRange {
    /// A cloud metadata endpoint (never).
    Metadata,
    /// 0.0.0.0/8, `::` (never).
    Unspecified,
    /// 169.254/16, fe80::/10 (never).
    LinkLocal,
    /// 224/4, ff00::/8 (never).
    Multicast,
    /// 255.255.255.255 (never).
    Broadcast,
    /// Teredo, 2001::/32: the far end is an IPv4 address the relay hides (never).
    Tunnel,
    /// IPv6 outside global unicast 2000::/3 (100::/64 discard-only, unassigned
    /// space) (never).
    Unroutable,
    /// 127/8, `::1` (private destinations).
    Loopback,
    /// 10/8, 172.16/12, 192.168/16 (private destinations).
    Private,
    /// 100.64/10, carrier-grade NAT (private destinations).
    Shared,
    /// 192.0.0/24, 198.18/15 benchmarking, 64:ff9b:1::/48 local NAT64, 2001:2::/48
    /// benchmarking (private destinations).
    SpecialPurpose,
    /// The documentation ranges 192.0.2/24, 198.51.100/24, 203.0.113/24 (TEST-NET-1,
    /// 2 and 3), 2001:db8::/32 and 3fff::/20 (private destinations).
    Documentation,
    /// 240/4 but the broadcast address, reserved for future use (private
    /// destinations).
    Reserved,
    /// fc00::/7 and the deprecated site-local fec0::/10 (private destinations).
    UniqueLocal,
    /// One of the host's own addresses (private destinations).
    HostAddress,
}

impl AddressRange {
    /// Whether the operator's `"private-destinations"` danger lifts this refusal.
    pub fn is_private_destination(self) -> bool {
        match self {
            Self::Metadata
            | Self::Unspecified
            | Self::LinkLocal
            | Self::Multicast
            | Self::Broadcast
            | Self::Tunnel
            | Self::Unroutable => false,
            Self::Loopback
            | Self::Private
            | Self::Shared
            | Self::SpecialPurpose
            | Self::Documentation
            | Self::Reserved
            | Self::UniqueLocal
            | Self::HostAddress => true,
        }
    }

    /// A short name for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Metadata => "metadata",
            Self::Unspecified => "unspecified",
            Self::LinkLocal => "link-local",
            Self::Multicast => "multicast",
            Self::Broadcast => "broadcast",
            Self::Tunnel => "tunnel",
            Self::Unroutable => "unroutable",
            Self::Loopback => "loopback",
            Self::Private => "private",
            Self::Shared => "shared",
            Self::SpecialPurpose => "special-purpose",
            Self::Documentation => "documentation",
            Self::Reserved => "reserved",
            Self::UniqueLocal => "unique-local",
            Self::HostAddress => "host-address",
        }
    }
}

impl fmt::Display for AddressRange {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self {
            Self::Metadata => "a cloud metadata address, refused always",
            Self::Unspecified => "an unspecified address, refused always",
            Self::LinkLocal => "a link-local address, refused always",
            Self::Multicast => "a multicast address, refused always",
            Self::Broadcast => "the broadcast address, refused always",
            Self::Tunnel => "a Teredo tunnel address, refused always",
            Self::Unroutable => "an address outside IPv6 global unicast, refused always",
            Self::Loopback => "a loopback address",
            Self::Private => "a private address",
            Self::Shared => "a shared (carrier-grade NAT) address",
            Self::SpecialPurpose => "a special-purpose address",
            Self::Documentation => "a documentation (TEST-NET) address",
            Self::Reserved => "a reserved (240/4) address",
            Self::UniqueLocal => "a unique-local address",
            Self::HostAddress => "one of the host's own addresses",
        };
        formatter.write_str(what)?;
        if self.is_private_destination() {
            formatter.write_str(
                "; an operator who means it writes [operator] allow_dangerous = [\"private-destinations\"]",
            )?;
        }
        Ok(())
    }
}

/// The IPv4 address an IPv6 address carries, if it is one of the forms that do.
pub fn embedded_ipv4(address: Ipv6Addr) -> Option<Ipv4Addr> {
    let segments = address.segments();
    let octets = address.octets();
    let last_four = Ipv4Addr::new(octets[12], octets[13], octets[14], octets[15]);
    match segments {
        // v4-mapped ::ffff:a.b.c.d
        [0, 0, 0, 0, 0, 0xffff, _, _] => Some(last_four),
        // v4-translated ::ffff:0:a.b.c.d (SIIT)
        [0, 0, 0, 0, 0xffff, 0, _, _] => Some(last_four),
        // v4-compatible ::a.b.c.d (deprecated); `::` and `::1` are themselves.
        [0, 0, 0, 0, 0, 0, high, low] if high != 0 || low > 1 => Some(last_four),
        // NAT64 well-known prefix 64:ff9b::/96
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(last_four),
        // 6to4 2002:aabb:ccdd::/48
        [0x2002, high, low, ..] => Some(Ipv4Addr::from((u32::from(high) << 16) | u32::from(low))),
        _ => None,
    }
}

/// The range that makes `address` forbidden, ignoring the host's own addresses, or
/// `None` for a public address.
pub fn classify(address: IpAddr) -> Option<AddressRange> {
    if METADATA_ADDRESSES.contains(&address) {
        return Some(AddressRange::Metadata);
    }
    match address {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => match embedded_ipv4(v6) {
            Some(v4) => classify(IpAddr::V4(v4)),
            None => classify_v6(v6),
        },
    }
}

fn classify_v4(address: Ipv4Addr) -> Option<AddressRange> {
    let [a, b, c, _] = address.octets();
    let range = match (a, b, c) {
        (0, ..) => AddressRange::Unspecified,
        (10, ..) => AddressRange::Private,
        (100, 64..=127, _) => AddressRange::Shared,
        (127, ..) => AddressRange::Loopback,
        (169, 254, _) => AddressRange::LinkLocal,
        (172, 16..=31, _) => AddressRange::Private,
        (192, 0, 0) => AddressRange::SpecialPurpose,
        (192, 168, _) => AddressRange::Private,
        (198, 18..=19, _) => AddressRange::SpecialPurpose,
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => AddressRange::Documentation,
        (224..=239, ..) => AddressRange::Multicast,
        _ if address == Ipv4Addr::BROADCAST => AddressRange::Broadcast,
        (240..=255, ..) => AddressRange::Reserved,
        _ => return None,
    };
    Some(range)
}

fn classify_v6(address: Ipv6Addr) -> Option<AddressRange> {
    let segments = address.segments();
    let range = match segments {
        [0, 0, 0, 0, 0, 0, 0, 0] => AddressRange::Unspecified,
        [0, 0, 0, 0, 0, 0, 0, 1] => AddressRange::Loopback,
        [0x64, 0xff9b, 1, ..] => AddressRange::SpecialPurpose,
        [0x2001, 2, 0, ..] => AddressRange::SpecialPurpose,
        // Teredo: the far end is reached through a relay to an IPv4 address it hides.
        [0x2001, 0, ..] => AddressRange::Tunnel,
        [0x2001, 0x0db8, ..] => AddressRange::Documentation,
        [first, ..] if first & 0xfff0 == 0x3ff0 => AddressRange::Documentation,
        [first, ..] if first & 0xfe00 == 0xfc00 => AddressRange::UniqueLocal,
        [first, ..] if first & 0xffc0 == 0xfe80 => AddressRange::LinkLocal,
        [first, ..] if first & 0xffc0 == 0xfec0 => AddressRange::UniqueLocal,
        [first, ..] if first & 0xff00 == 0xff00 => AddressRange::Multicast,
        // Everything else outside global unicast: 100::/64 discard, unassigned space.
        [first, ..] if first & 0xe000 != 0x2000 => AddressRange::Unroutable,
        _ => return None,
    };
    Some(range)
}

/// Judge one address under `policy`: `Err` names the range that forbids it.
pub fn check_address(address: IpAddr, policy: &Policy) -> Result<(), AddressRange> {
    let range = classify(address).or_else(|| {
        is_host_address(address, &policy.host_addresses).then_some(AddressRange::HostAddress)
    });
    match (range, policy.private_destinations) {
        (None, _) => Ok(()),
        (Some(range), PrivateDestinations::Allowed) if range.is_private_destination() => Ok(()),
        (Some(range), PrivateDestinations::Allowed | PrivateDestinations::Refused) => Err(range),
    }
}

fn is_host_address(address: IpAddr, host_addresses: &BTreeSet<IpAddr>) -> bool {
    let unwrapped = match address {
        IpAddr::V6(v6) => embedded_ipv4(v6).map_or(address, IpAddr::V4),
        IpAddr::V4(_) => address,
    };
    host_addresses.contains(&address) || host_addresses.contains(&unwrapped)
}

/// Why a destination could not be turned into addresses to connect to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ResolveError {
    /// An address the name resolved to (or the literal) is forbidden.
    Forbidden {
        address: IpAddr,
        range: AddressRange,
    },
    /// The resolver failed or returned nothing.
    Failed(String),
}

/// The addresses to connect to for `host` on `port`, every one judged: a literal as
/// is, a pinned name its pin, else what the host's resolver returns. Refused as a whole
/// when any address is forbidden.
pub(crate) async fn resolve(
    host: &Host,
    port: u16,
    policy: &Policy,
) -> Result<Vec<SocketAddr>, ResolveError> {
    let addresses: Vec<SocketAddr> = match host {
        Host::Ip(address) => vec![SocketAddr::new(*address, port)],
        Host::Name(name) => match policy.hosts.get(name) {
            Some(address) => vec![SocketAddr::new(*address, port)],
            None => {
                let found = tokio::net::lookup_host((name.as_str(), port))
                    .await
                    .map_err(|error| {
                        ResolveError::Failed(format!("cannot resolve {name}: {error}"))
                    })?;
                let mut addresses: Vec<SocketAddr> = Vec::new();
                for address in found {
                    if !addresses.contains(&address) {
                        addresses.push(address);
                    }
                }
                addresses
            }
        },
    };
    if addresses.is_empty() {
        return Err(ResolveError::Failed(format!(
            "{host} resolved to no address"
        )));
    }
    for address in &addresses {
        check_address(address.ip(), policy).map_err(|range| ResolveError::Forbidden {
            address: address.ip(),
            range,
        })?;
    }
    Ok(addresses)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn class(text: &str) -> Option<AddressRange> {
        classify(text.parse().unwrap())
    }

    #[test]
    fn the_reference_table_is_refused_in_every_spelling() {
        use AddressRange::*;
        for (address, expected) in [
            ("0.0.0.0", Unspecified),
            ("0.1.2.3", Unspecified),
            ("10.0.0.1", Private),
            ("100.64.0.1", Shared),
            ("100.127.255.255", Shared),
            ("127.0.0.1", Loopback),
            ("127.255.255.254", Loopback),
            ("169.254.0.1", LinkLocal),
            ("172.16.0.1", Private),
            ("172.31.255.255", Private),
            ("192.0.0.8", SpecialPurpose),
            ("192.168.1.1", Private),
            ("198.18.0.1", SpecialPurpose),
            ("198.19.255.255", SpecialPurpose),
            ("192.0.2.1", Documentation),
            ("198.51.100.1", Documentation),
            ("203.0.113.1", Documentation),
            ("224.0.0.1", Multicast),
            ("239.255.255.250", Multicast),
            ("240.0.0.1", Reserved),
            ("255.255.255.254", Reserved),
            ("255.255.255.255", Broadcast),
            ("::", Unspecified),
            ("::1", Loopback),
            ("fc00::1", UniqueLocal),
            ("fd12:3456::1", UniqueLocal),
            ("fec0::1", UniqueLocal),
            ("fe80::1", LinkLocal),
            ("febf::1", LinkLocal),
            ("ff02::1", Multicast),
            ("100::1", Unroutable),
            ("2001:db8::1", Documentation),
            ("3fff::1", Documentation),
            ("3fff:fff:ffff::1", Documentation),
            ("2001:0:4136:e378:8000:63bf:3fff:fdd2", Tunnel),
            ("64:ff9b:1::a", SpecialPurpose),
            ("2001:2::1", SpecialPurpose),
            ("4000::1", Unroutable),
            // Metadata, wherever it lives.
            ("169.254.169.254", Metadata),
            ("169.254.170.2", Metadata),
            ("100.100.100.200", Metadata),
            ("168.63.129.16", Metadata),
            ("192.0.0.192", Metadata),
            ("169.254.42.42", Metadata),
            ("fd00:ec2::254", Metadata),
            ("fd00:ec2::23", Metadata),
            ("fd20:ce::254", Metadata),
            ("fd00:42::42", Metadata),
            // The same addresses dressed as IPv6.
            ("::ffff:169.254.169.254", Metadata),
            ("::ffff:a9fe:a9fe", Metadata),
            ("::a9fe:a9fe", Metadata),
            ("::169.254.169.254", Metadata),
            ("::ffff:0:169.254.169.254", Metadata),
            ("2002:a9fe:a9fe::1", Metadata),
            ("64:ff9b::a9fe:a9fe", Metadata),
            ("64:ff9b::169.254.169.254", Metadata),
            ("::ffff:127.0.0.1", Loopback),
            ("::127.0.0.1", Loopback),
            ("2002:7f00:1::", Loopback),
            ("64:ff9b::7f00:1", Loopback),
            ("::ffff:10.1.2.3", Private),
            ("2002:c0a8:101::1", Private),
            ("::ffff:0.0.0.0", Unspecified),
            ("::ffff:224.0.0.1", Multicast),
            ("::ffff:192.0.2.1", Documentation),
            ("2002:cb00:7101::1", Documentation),
            ("::ffff:100.100.100.200", Metadata),
            ("64:ff9b::6464:64c8", Metadata),
        ] {
            assert_eq!(class(address), Some(expected), "{address}");
        }
    }

    #[test]
    fn public_addresses_pass_in_every_spelling() {
        for address in [
            "93.184.216.34",
            "1.1.1.1",
            "100.63.255.255",
            "100.128.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.0.1.1",
            "198.17.255.255",
            "198.20.0.0",
            "223.255.255.255",
            "2606:4700::1111",
            "2a00:1450:4001::1",
            "::ffff:93.184.216.34",
            "2002:5db8:d822::1",
            "64:ff9b::5db8:d822",
            // Just outside the documentation ranges.
            "192.0.3.1",
            "198.51.101.1",
            "203.0.114.1",
            "2001:db9::1",
            "3fef:ffff::1",
        ] {
            assert_eq!(class(address), None, "{address}");
        }
    }

    #[test]
    fn private_destinations_lift_private_ranges_never_metadata() {
        let refused = Policy::default();
        let allowed = Policy {
            private_destinations: PrivateDestinations::Allowed,
            ..Policy::default()
        };
        for (address, with_danger) in [
            ("127.0.0.1", Ok(())),
            ("10.0.0.1", Ok(())),
            ("fd12::1", Ok(())),
            ("::ffff:127.0.0.1", Ok(())),
            // Shared, benchmarking, documentation and reserved ranges, where real
            // networks put registries: lifted by the same consent.
            ("100.64.0.1", Ok(())),
            ("100.100.100.199", Ok(())),
            ("198.18.0.1", Ok(())),
            ("192.0.2.10", Ok(())),
            ("198.51.100.10", Ok(())),
            ("203.0.113.10", Ok(())),
            ("240.1.2.3", Ok(())),
            ("2001:db8::10", Ok(())),
            ("3fff::10", Ok(())),
            ("2001:2::10", Ok(())),
            ("::ffff:203.0.113.10", Ok(())),
            ("fd00:ec2::253", Ok(())),
            // Metadata stays refused, also inside the ranges the consent opens.
            ("169.254.169.254", Err(AddressRange::Metadata)),
            ("fd00:ec2::254", Err(AddressRange::Metadata)),
            ("fd00:ec2::23", Err(AddressRange::Metadata)),
            ("fd20:ce::254", Err(AddressRange::Metadata)),
            ("fd00:42::42", Err(AddressRange::Metadata)),
            ("100.100.100.200", Err(AddressRange::Metadata)),
            ("::ffff:100.100.100.200", Err(AddressRange::Metadata)),
            ("64:ff9b::6464:64c8", Err(AddressRange::Metadata)),
            ("2002:6464:64c8::1", Err(AddressRange::Metadata)),
            ("255.255.255.255", Err(AddressRange::Broadcast)),
            ("2001::1", Err(AddressRange::Tunnel)),
            ("100::1", Err(AddressRange::Unroutable)),
            ("::ffff:169.254.169.254", Err(AddressRange::Metadata)),
            ("169.254.1.1", Err(AddressRange::LinkLocal)),
            ("0.0.0.0", Err(AddressRange::Unspecified)),
            ("224.0.0.1", Err(AddressRange::Multicast)),
        ] {
            let address: IpAddr = address.parse().unwrap();
            assert_eq!(check_address(address, &allowed), with_danger, "{address}");
            assert!(check_address(address, &refused).is_err(), "{address}");
        }
        assert_eq!(
            check_address("93.184.216.34".parse().unwrap(), &refused),
            Ok(())
        );
    }

    #[test]
    fn the_host_own_addresses_are_private_destinations() {
        let own: IpAddr = "203.0.114.9".parse().unwrap();
        let mut policy = Policy {
            host_addresses: BTreeSet::from([own]),
            ..Policy::default()
        };
        assert_eq!(check_address(own, &policy), Err(AddressRange::HostAddress));
        assert_eq!(
            check_address("::ffff:203.0.114.9".parse().unwrap(), &policy),
            Err(AddressRange::HostAddress)
        );
        policy.private_destinations = PrivateDestinations::Allowed;
        assert_eq!(check_address(own, &policy), Ok(()));
    }

    #[test]
    fn refusals_say_what_lifts_them() {
        assert!(
            AddressRange::Private
                .to_string()
                .contains("allow_dangerous = [\"private-destinations\"]")
        );
        assert!(
            AddressRange::Metadata
                .to_string()
                .contains("refused always")
        );
        assert!(
            !AddressRange::Metadata
                .to_string()
                .contains("allow_dangerous")
        );
    }

    #[tokio::test]
    async fn pins_come_first_and_every_address_is_judged() {
        let name = crate::HostName::parse("registry.test").unwrap();
        let mut policy = Policy::default();
        policy
            .hosts
            .insert(name.clone(), "10.1.2.3".parse().unwrap());
        let host = Host::Name(name);
        assert_eq!(
            resolve(&host, 443, &policy).await,
            Err(ResolveError::Forbidden {
                address: "10.1.2.3".parse().unwrap(),
                range: AddressRange::Private
            })
        );
        policy.private_destinations = PrivateDestinations::Allowed;
        assert_eq!(
            resolve(&host, 443, &policy).await,
            Ok(vec!["10.1.2.3:443".parse().unwrap()])
        );
        // The system resolver's answer for localhost is judged like any other.
        let localhost = Host::parse("localhost.").unwrap();
        let refused = resolve(&localhost, 80, &Policy::default()).await;
        assert!(
            matches!(
                refused,
                Err(ResolveError::Forbidden {
                    range: AddressRange::Loopback,
                    ..
                })
            ),
            "{refused:?}"
        );
    }
}
