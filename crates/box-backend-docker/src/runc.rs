//! The engine's runc against the CVE floors in security.md: a host on an old
//! runc is warned at connect and in `box doctor`.

/// A runc version against the CVE floors in security.md: ≥ 1.1.12
/// (CVE-2024-21626, leaked fd / working directory escape) and the 2025 fixes
/// (CVE-2025-31133, -52565, -52881: 1.2.8, 1.3.3, 1.4.0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuncFloor {
    /// At or above every floor.
    Ok,
    /// Below a floor; the sentence names which.
    Below(String),
    /// The version could not be parsed.
    Unknown,
}

/// Compare a runc version string (`1.1.5+ds1`, `v1.2.8`, `1.4.0-rc.3`) with the floors.
pub fn runc_floor(version: &str) -> RuncFloor {
    let numeric: String = version
        .trim_start_matches('v')
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let parts: Vec<u64> = numeric
        .split('.')
        .filter(|p| !p.is_empty())
        .filter_map(|p| p.parse().ok())
        .collect();
    let [major, minor, patch, ..] = parts.as_slice() else {
        return RuncFloor::Unknown;
    };
    // 1.4.0 carries the 2025 fixes from its third release candidate on.
    let rc: Option<u64> = version
        .split_once("-rc.")
        .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok());
    let v = (*major, *minor, *patch);
    let cve_2025 = "CVE-2025-31133/52565/52881 are fixed in 1.2.8, 1.3.3 and 1.4.0";
    if v < (1, 1, 12) {
        return RuncFloor::Below(format!("below 1.1.12 (CVE-2024-21626), and {cve_2025}"));
    }
    let ok = match (major, minor) {
        (0, _) => false,
        (1, 0..=1) => false,
        (1, 2) => *patch >= 8,
        (1, 3) => *patch >= 3,
        (1, 4) => *patch > 0 || rc.is_none_or(|n| n >= 3),
        _ => true,
    };
    if ok {
        RuncFloor::Ok
    } else {
        RuncFloor::Below(format!("below the 2025 floors: {cve_2025}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runc_versions_against_the_floors() {
        for (version, ok) in [
            ("1.1.5+ds1", false),
            ("1.1.12", false),
            ("1.2.7", false),
            ("1.2.8", true),
            ("v1.3.3", true),
            ("1.3.2", false),
            ("1.4.0-rc.2", false),
            ("1.4.0-rc.3", true),
            ("1.4.0", true),
            ("1.5.1", true),
        ] {
            assert_eq!(runc_floor(version) == RuncFloor::Ok, ok, "{version}");
        }
        assert_eq!(runc_floor("weird"), RuncFloor::Unknown);
        assert!(
            matches!(runc_floor("1.1.5"), RuncFloor::Below(why) if why.contains("CVE-2024-21626"))
        );
    }
}
