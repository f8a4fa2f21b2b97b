//! Which values are credentials whatever their variable is called: a URL
//! carrying a password, and the high-precision token shapes of security.md 4.4
//! (gitleaks' prefixes). Entropy-only rules are left out on purpose: they
//! would remove ordinary hashes and ids from children's environments.

use std::sync::LazyLock;

use regex::RegexSet;

/// The shapes. A prefix must start a word, so `xghp_...` inside a longer
/// identifier does not count.
const PATTERNS: &[&str] = &[
    // The dax reference's URL-with-password rule.
    r"://[^/@\s:]*:[^/@\s]+@",
    r"(?:^|[^A-Za-z0-9_])ghp_[A-Za-z0-9]{36}",
    r"(?:^|[^A-Za-z0-9_])github_pat_[A-Za-z0-9_]{22,}",
    r"(?:^|[^A-Za-z0-9_])gh[ousr]_[A-Za-z0-9]{36}",
    r"(?:^|[^A-Za-z0-9_])glpat-[A-Za-z0-9_\-]{20,}",
    r"(?:^|[^A-Za-z0-9])(?:AKIA|ASIA|ABIA|ACCA)[A-Z2-7]{16}(?:$|[^A-Za-z0-9])",
    r"(?:^|[^A-Za-z0-9_])AIza[A-Za-z0-9_\-]{35}",
    r"(?:^|[^A-Za-z0-9_])sk-ant-[A-Za-z0-9_\-]{20,}",
    r"(?:^|[^A-Za-z0-9_])sk-(?:proj|svcacct|admin)-[A-Za-z0-9_\-]{20,}",
    r"(?:^|[^A-Za-z0-9_])xox[bpeoar]-[A-Za-z0-9\-]{10,}",
    r"(?:^|[^A-Za-z0-9_])xapp-[A-Za-z0-9\-]{10,}",
    r"(?:^|[^A-Za-z0-9_])[sr]k_(?:live|test)_[A-Za-z0-9]{10,}",
    r"(?:^|[^A-Za-z0-9_])npm_[A-Za-z0-9]{36}",
    r"pypi-AgEIcHlwaS5vcmc",
    r"(?:^|[^A-Za-z0-9_])hf_[A-Za-z]{34}",
    r"(?:^|[^A-Za-z0-9_])SG\.[A-Za-z0-9_\-]{22}\.[A-Za-z0-9_\-]{43}",
    r"(?:^|[^A-Za-z0-9_])(?:dop_v1_|hvs\.|glsa_|shpat_|lin_api_|PMAK-|sntryu_|dp\.pt\.)[A-Za-z0-9_\-]{16,}",
    r"-----BEGIN[A-Z ]*PRIVATE KEY-----",
    r"(?:^|[^A-Za-z0-9_])eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]+",
];

static SHAPES: LazyLock<Option<RegexSet>> = LazyLock::new(|| RegexSet::new(PATTERNS).ok());

/// Whether `value` looks like it carries a credential.
pub(crate) fn is_secret(value: &str) -> bool {
    match SHAPES.as_ref() {
        Some(shapes) => shapes.is_match(value),
        // The patterns are constants proven by the tests; if they ever failed
        // to compile, treating every value as secret fails closed.
        None => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_shapes_are_found() {
        let secrets = [
            "https://user:hunter2@example.com/repo.git",
            "postgres://app:pw@db:5432/x",
            "ghp_0123456789abcdefghijABCDEFGHIJ012345",
            "token ghp_0123456789abcdefghijABCDEFGHIJ012345 end",
            "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
            "glpat-abcdefghij0123456789",
            "AKIAIOSFODNN7EXAMPLE",
            "sk-ant-api03-abcdefghijklmnopqrstuvwxyz012345",
            "xoxb-1234567890-abcdefghij",
            "-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n-----END OPENSSH PRIVATE KEY-----",
            "-----BEGIN PRIVATE KEY-----",
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N",
        ];
        for value in secrets {
            assert!(is_secret(value), "{value}");
        }
    }

    #[test]
    fn ordinary_values_pass() {
        let ordinary = [
            "/usr/local/bin:/usr/bin",
            "ssh://git@github.com/o/r.git",
            "https://github.com/o/r",
            "en_US.UTF-8",
            "0123456789abcdef0123456789abcdef01234567",
            "xterm-256color",
            "deadbeef-ghp_short",
        ];
        for value in ordinary {
            assert!(!is_secret(value), "{value}");
        }
    }
}
