//! The quantities and names a profile (and a tightening) is written in, parsed
//! and validated at the edge: sizes (`"2GiB"`), CPU quotas, durations
//! (`"10m"`), capability and variable names (allow entries: `crate::allow`).
//! Each parser's error says what was given and what would be accepted; the
//! caller adds the field.

use std::fmt;
use std::time::Duration;

/// A size in bytes, written `"512MiB"`, `"2GiB"`. Never zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

const SIZE_UNITS: [(&str, u64); 5] = [
    ("TiB", 1 << 40),
    ("GiB", 1 << 30),
    ("MiB", 1 << 20),
    ("KiB", 1 << 10),
    ("B", 1),
];

impl ByteSize {
    /// Parse `"2GiB"`: a whole number, optionally one space, a binary unit.
    pub fn parse(text: &str) -> Result<Self, String> {
        let accepted = "write a whole number and a unit (B, KiB, MiB, GiB or TiB), like \"2GiB\"";
        let digits_end = text
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len());
        let (digits, unit) = text.split_at(digits_end);
        let unit = unit.strip_prefix(' ').unwrap_or(unit);
        let Some((_, scale)) = SIZE_UNITS.iter().find(|(name, _)| *name == unit) else {
            return Err(format!("{text:?} is not a size; {accepted}"));
        };
        let Ok(number) = digits.parse::<u64>() else {
            return Err(format!("{text:?} is not a size; {accepted}"));
        };
        if number == 0 {
            return Err(format!("{text:?} is zero; a size must be more than zero"));
        }
        number
            .checked_mul(*scale)
            .map(Self)
            .ok_or_else(|| format!("{text:?} is too large; at most 16383TiB"))
    }
}

impl fmt::Display for ByteSize {
    /// The largest unit that shows the size exactly: `2GiB`, `1536MiB`.
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (name, scale) in SIZE_UNITS {
            if self.0.is_multiple_of(scale) {
                return write!(formatter, "{}{name}", self.0 / scale);
            }
        }
        write!(formatter, "{}B", self.0)
    }
}

/// CPUs as thousandths of a core (`2.0` is 2000), so the order is exact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CpuQuota(pub u64);

/// The most CPUs a profile can name; more is a typo, not a machine.
pub const MAX_CPUS: u64 = 1024;

impl CpuQuota {
    /// From a number of cores: more than zero, at most 1024, in steps of 0.001.
    pub fn from_cores(cores: f64) -> Result<Self, String> {
        if !cores.is_finite() || cores <= 0.0 {
            return Err(format!(
                "{cores} is not a CPU quota; write a number of cores more than zero, like 2 or 0.5"
            ));
        }
        if cores > MAX_CPUS as f64 {
            return Err(format!("{cores} CPUs is more than {MAX_CPUS}"));
        }
        let millis = (cores * 1000.0).round();
        if (millis - cores * 1000.0).abs() > 1e-6 || millis < 1.0 {
            return Err(format!(
                "{cores} is finer than a thousandth of a core; round it to 3 decimals"
            ));
        }
        // In range by the checks above: 1 ..= 1_024_000.
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "checked range"
        )]
        Ok(Self(millis as u64))
    }

    /// The quota as a number of cores.
    pub fn cores(self) -> f64 {
        self.0 as f64 / 1000.0
    }
}

impl fmt::Display for CpuQuota {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}", self.cores())
    }
}

/// Parse a duration like `"10m"`, `"1h 30m"`: more than zero.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(text).map_err(|_| {
        format!("{text:?} is not a duration; write a number and a unit (s, m, h, d), like \"10m\" or \"1h 30m\"")
    })?;
    if duration.is_zero() {
        return Err(format!(
            "{text:?} is zero; a duration must be more than zero"
        ));
    }
    Ok(duration)
}

/// A duration as written back: `10m`, `1h 30m`.
pub fn show_duration(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

/// A positive whole number (pids, open files).
pub fn parse_count(text: &str) -> Result<u64, String> {
    match text.parse::<i128>() {
        Ok(number) if number <= 0 => Err(format!(
            "{text} is not more than zero; write a whole number from 1"
        )),
        Ok(number) => u64::try_from(number).map_err(|_| format!("{text} is too large")),
        Err(_) => Err(format!("{text:?} is not a whole number")),
    }
}

/// Whether `name` is a valid environment variable name.
pub fn check_env_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let valid = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a variable name; use letters, digits and _, not starting with a digit"
        ))
    }
}

/// Whether a variable name looks like it carries a credential: such names may
/// only be handed through under `env.secrets`, never `env.pass`.
pub fn looks_like_credential(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    [
        "TOKEN",
        "SECRET",
        "PASSWORD",
        "PASSWD",
        "API_KEY",
        "APIKEY",
        "PRIVATE_KEY",
        "ACCESS_KEY",
        "CREDENTIAL",
    ]
    .iter()
    .any(|word| upper.contains(word))
        || upper.ends_with("_KEY")
        || upper.ends_with("_PWD")
}

/// Capabilities a profile may add back without an operator switch: the
/// reviewed list (file ownership and permission fix-ups, signals to its own
/// processes, low ports). Anything else needs `allow_dangerous = ["capabilities"]`.
pub const REVIEWED_CAPABILITIES: [&str; 8] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "NET_BIND_SERVICE",
    "SETGID",
    "SETUID",
];

/// Every Linux capability name (without `CAP_`).
pub const KNOWN_CAPABILITIES: [&str; 41] = [
    "AUDIT_CONTROL",
    "AUDIT_READ",
    "AUDIT_WRITE",
    "BLOCK_SUSPEND",
    "BPF",
    "CHECKPOINT_RESTORE",
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "IPC_LOCK",
    "IPC_OWNER",
    "KILL",
    "LEASE",
    "LINUX_IMMUTABLE",
    "MAC_ADMIN",
    "MAC_OVERRIDE",
    "MKNOD",
    "NET_ADMIN",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_RAW",
    "PERFMON",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_CHROOT",
    "SYS_MODULE",
    "SYS_NICE",
    "SYS_PACCT",
    "SYS_PTRACE",
    "SYS_RAWIO",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "SYSLOG",
    "WAKE_ALARM",
];

/// Host namespaces a profile can ask to share (each one is dangerous).
pub const NAMESPACES: [&str; 6] = ["cgroup", "ipc", "net", "pid", "user", "uts"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_show_the_same_way() {
        for (text, bytes, shown) in [
            ("2GiB", 2 << 30, "2GiB"),
            ("512MiB", 512 << 20, "512MiB"),
            ("1536 MiB", 1536 << 20, "1536MiB"),
            ("4096B", 4096, "4KiB"),
            ("1TiB", 1 << 40, "1TiB"),
        ] {
            let size = ByteSize::parse(text).unwrap();
            assert_eq!(size.0, bytes, "{text}");
            assert_eq!(size.to_string(), shown, "{text}");
        }
    }

    #[test]
    fn bad_sizes_say_what_would_be_accepted() {
        for (text, message) in [
            (
                "2 gigs",
                "\"2 gigs\" is not a size; write a whole number and a unit (B, KiB, MiB, GiB or TiB), like \"2GiB\"",
            ),
            ("0GiB", "\"0GiB\" is zero; a size must be more than zero"),
            (
                "-1GiB",
                "\"-1GiB\" is not a size; write a whole number and a unit (B, KiB, MiB, GiB or TiB), like \"2GiB\"",
            ),
            (
                "2GB",
                "\"2GB\" is not a size; write a whole number and a unit (B, KiB, MiB, GiB or TiB), like \"2GiB\"",
            ),
            (
                "",
                "\"\" is not a size; write a whole number and a unit (B, KiB, MiB, GiB or TiB), like \"2GiB\"",
            ),
            (
                "99999999TiB",
                "\"99999999TiB\" is too large; at most 16383TiB",
            ),
        ] {
            assert_eq!(ByteSize::parse(text).unwrap_err(), message, "{text}");
        }
    }

    #[test]
    fn cpu_quotas() {
        assert_eq!(CpuQuota::from_cores(2.0).unwrap().0, 2000);
        assert_eq!(CpuQuota::from_cores(0.5).unwrap().0, 500);
        assert!(CpuQuota::from_cores(0.0).is_err());
        assert!(CpuQuota::from_cores(-1.0).is_err());
        assert!(CpuQuota::from_cores(f64::NAN).is_err());
        assert!(CpuQuota::from_cores(0.0001).is_err());
        assert!(CpuQuota::from_cores(2000.0).is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert_eq!(show_duration(Duration::from_secs(5400)), "1h 30m");
        assert!(parse_duration("0s").unwrap_err().contains("zero"));
        assert!(
            parse_duration("ten minutes")
                .unwrap_err()
                .contains("not a duration")
        );
    }

    #[test]
    fn credential_names() {
        for name in [
            "GITHUB_TOKEN",
            "AWS_SECRET_ACCESS_KEY",
            "MYSQL_PWD",
            "SSH_KEY",
            "OPENAI_API_KEY",
        ] {
            assert!(looks_like_credential(name), "{name}");
        }
        for name in ["LANG", "TERM", "PWD", "KEYBOARD", "HOME"] {
            assert!(!looks_like_credential(name), "{name}");
        }
    }
}
