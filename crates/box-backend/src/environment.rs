//! A unit's environment, computed the same way for every backend: what the
//! plan lets through (the host variables `[env] pass` names, the
//! git neutralisation, `[env] set`) on top of the few variables box itself
//! sets in every unit ([`OWN_NAMES`]: `HOME`, `PATH`, `TMPDIR`, and the XDG
//! base directories inside `HOME`), whose values the backend gives ([`Own`]). Nothing else of the host's environment is
//! looked at, so a unit never sees the host's internal URLs, paths or box's
//! own settings, and the envelope's `envPassed` is the same list for the same
//! profile on every backend.
//!
//! Later entries win: box's own, then the passed host variables, then the
//! git neutralisation, then the profile's `set` values; so a profile may
//! override box's own by naming them. Passed variables still go through the
//! scrubber, which refuses the ones that hijack execution (`LD_PRELOAD`,
//! `BASH_ENV`, ...) whatever the profile says; those, and names that are not
//! UTF-8, are reported as scrubbed.

use std::collections::BTreeMap;
use std::ffi::OsString;

use box_policy::plan::UnitSpec;

/// The variables box sets in every unit, whatever the profile (sorted).
pub const OWN_NAMES: [&str; 6] = [
    "HOME",
    "PATH",
    "TMPDIR",
    "XDG_CACHE_HOME",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
];

/// The XDG base directories box sets, each inside the unit's writable home:
/// the variable and its place beneath `HOME` (their defaults in the XDG
/// base directory specification, written out so a tool that reads the
/// variable and one that assumes the default agree).
pub const XDG_DIRS: [(&str, &str); 3] = [
    ("XDG_CACHE_HOME", ".cache"),
    ("XDG_CONFIG_HOME", ".config"),
    ("XDG_DATA_HOME", ".local/share"),
];

/// The `PATH` of a unit whose image names none, and of every local unit:
/// the system directories, as Docker's own default.
pub const STANDARD_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The values of box's own variables in a unit, as its backend lays it out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Own {
    /// `HOME`: a writable directory of the unit's.
    pub home: String,
    /// `PATH`.
    pub path: String,
    /// `TMPDIR`: where the unit's temporary files go.
    pub tmpdir: String,
}

/// A unit's environment and what its envelope reports of it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UnitEnvironment {
    /// Every variable the unit gets, sorted by name.
    pub vars: Vec<(String, String)>,
    /// Variables the plan names that the scrubber refused (sorted names).
    pub scrubbed: Vec<String>,
    /// Variables the plan passes that the host does not have (in plan order).
    pub missing: Vec<String>,
    /// The secrets the plan names that the host has, `(name, value)` in plan
    /// order: never part of `vars`, the backend delivers them as files.
    pub secrets: Vec<(String, String)>,
}

impl UnitEnvironment {
    /// The names the unit gets, sorted: the envelope's `envPassed`.
    pub fn passed(&self) -> Vec<String> {
        self.vars.iter().map(|(name, _)| name.clone()).collect()
    }

    /// `spec` with only the secrets this environment holds: a secret the
    /// host does not have is left out of `env_secrets` and
    /// `env_secrets_as_env` (it is not delivered, as a missing passed
    /// variable is not set). Pure.
    pub fn delivered<'a>(&self, spec: &'a UnitSpec) -> std::borrow::Cow<'a, UnitSpec> {
        if self.secrets.len() == spec.env_secrets.len() {
            return std::borrow::Cow::Borrowed(spec);
        }
        let mut delivered = spec.clone();
        delivered
            .env_secrets
            .retain(|name| self.secrets.iter().any(|(have, _)| have == name));
        delivered
            .env_secrets_as_env
            .retain(|name| delivered.env_secrets.contains(name));
        std::borrow::Cow::Owned(delivered)
    }
}

/// The environment of the unit `spec`, from the host's variables `host` and
/// box's own values `own`. Pure.
pub fn unit_environment<I>(spec: &UnitSpec, host: I, own: &Own) -> UnitEnvironment
where
    I: IntoIterator<Item = (OsString, OsString)>,
{
    // Secrets the profile names are looked up like passed variables, but
    // come back apart (`secrets`): they are delivered as files, never as the
    // unit's environment.
    let asked: Vec<String> = spec
        .env_pass
        .iter()
        .chain(&spec.env_secrets)
        .cloned()
        .collect();
    let named: Vec<(OsString, OsString)> = host
        .into_iter()
        .filter(|(name, _)| {
            asked
                .iter()
                .any(|wanted| name.as_os_str() == wanted.as_str())
        })
        .collect();
    let missing = asked
        .iter()
        .filter(|wanted| {
            !named
                .iter()
                .any(|(name, _)| name.as_os_str() == wanted.as_str())
        })
        .cloned()
        .collect();
    let scrubbed = box_scrub::scrub_environment(named, &asked);
    let mut removed = scrubbed.removed;
    let mut vars = BTreeMap::new();
    vars.insert("HOME".to_owned(), own.home.clone());
    vars.insert("PATH".to_owned(), own.path.clone());
    vars.insert("TMPDIR".to_owned(), own.tmpdir.clone());
    for (name, beneath) in XDG_DIRS {
        vars.insert(
            name.to_owned(),
            format!("{}/{beneath}", own.home.trim_end_matches('/')),
        );
    }
    let mut secrets = Vec::new();
    for (name, value) in scrubbed.kept {
        match (name.into_string(), value.into_string()) {
            (Ok(name), Ok(value)) if spec.env_secrets.contains(&name) => {
                secrets.push((name, value));
            }
            (Ok(name), Ok(value)) => {
                vars.insert(name, value);
            }
            (Ok(name), Err(_)) => removed.push(name),
            (Err(name), _) => removed.push(name.to_string_lossy().into_owned()),
        }
    }
    if spec.security.neutralise_git {
        vars.extend(box_scrub::git_neutralisation());
    }
    vars.extend(
        spec.env_set
            .iter()
            .map(|(name, value)| (name.clone(), value.clone())),
    );
    removed.sort();
    removed.dedup();
    UnitEnvironment {
        vars: vars.into_iter().collect(),
        scrubbed: removed,
        missing,
        secrets: spec
            .env_secrets
            .iter()
            .filter_map(|wanted| secrets.iter().find(|(name, _)| name == wanted).cloned())
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use pretty_assertions::assert_eq;

    use super::*;
    use box_policy::plan::WorkspaceSource;

    fn own() -> Own {
        Own {
            home: "/unit/home".to_owned(),
            path: STANDARD_PATH.to_owned(),
            tmpdir: "/unit/tmp".to_owned(),
        }
    }

    fn spec() -> UnitSpec {
        let mut spec = UnitSpec::workspace("image", WorkspaceSource::Host(PathBuf::from("/w")));
        spec.security.neutralise_git = false;
        spec
    }

    fn host(vars: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        vars.iter()
            .map(|(name, value)| (OsString::from(name), OsString::from(value)))
            .collect()
    }

    #[test]
    fn a_unit_gets_only_what_the_plan_names_and_boxs_own() {
        let mut spec = spec();
        spec.env_pass = vec!["LANG".to_owned(), "TERM".to_owned(), "ABSENT".to_owned()];
        spec.env_secrets = vec!["GITHUB_TOKEN".to_owned()];
        spec.env_set = [("CI".to_owned(), "true".to_owned())].into();
        let environment = unit_environment(
            &spec,
            host(&[
                ("LANG", "C.UTF-8"),
                ("TERM", "xterm"),
                ("GITHUB_TOKEN", "t"),
                ("PATH", "/host/bin"),
                ("HOME", "/root"),
                ("PIP_INDEX_URL", "http://internal/simple"),
                ("OLDPWD", "/work"),
                ("RUST_LOG", "debug"),
            ]),
            &own(),
        );
        let want: Vec<(String, String)> = [
            ("CI", "true"),
            ("HOME", "/unit/home"),
            ("LANG", "C.UTF-8"),
            ("PATH", STANDARD_PATH),
            ("TERM", "xterm"),
            ("TMPDIR", "/unit/tmp"),
            ("XDG_CACHE_HOME", "/unit/home/.cache"),
            ("XDG_CONFIG_HOME", "/unit/home/.config"),
            ("XDG_DATA_HOME", "/unit/home/.local/share"),
        ]
        .iter()
        .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
        .collect();
        assert_eq!(environment.vars, want);
        assert_eq!(environment.missing, vec!["ABSENT".to_owned()]);
        assert!(environment.scrubbed.is_empty());
        // A secret is never part of the unit's environment: it comes apart,
        // for the backend to deliver as a file.
        assert_eq!(
            environment.secrets,
            vec![("GITHUB_TOKEN".to_owned(), "t".to_owned())]
        );
    }

    #[test]
    fn the_profile_overrides_boxs_own_and_git_is_neutralised_under_set() {
        let mut spec = spec();
        spec.security.neutralise_git = true;
        spec.env_pass = vec!["PATH".to_owned()];
        spec.env_set = [
            ("HOME".to_owned(), "/set/home".to_owned()),
            ("GIT_PAGER".to_owned(), "less".to_owned()),
        ]
        .into();
        let environment = unit_environment(&spec, host(&[("PATH", "/host/bin")]), &own());
        let get = |name: &str| {
            environment
                .vars
                .iter()
                .find(|(key, _)| key == name)
                .map(|(_, value)| value.as_str())
        };
        assert_eq!(get("PATH"), Some("/host/bin"));
        assert_eq!(get("HOME"), Some("/set/home"));
        assert_eq!(get("TMPDIR"), Some("/unit/tmp"));
        assert_eq!(get("GIT_PAGER"), Some("less"));
        assert!(get("GIT_CONFIG_COUNT").is_some());
        let names = environment.passed();
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(names, sorted, "one entry per name, sorted");
    }

    #[test]
    fn a_passed_hijacker_is_scrubbed_and_reported() {
        let mut spec = spec();
        spec.env_pass = vec!["LD_PRELOAD".to_owned()];
        let environment = unit_environment(&spec, host(&[("LD_PRELOAD", "/evil.so")]), &own());
        assert_eq!(environment.scrubbed, vec!["LD_PRELOAD".to_owned()]);
        assert_eq!(environment.passed(), OWN_NAMES.map(str::to_owned).to_vec());
    }

    /// Only the secrets the host has are delivered: a missing one leaves
    /// the unit's spec, in both its lists; with every one there the spec is
    /// the plan's own.
    #[test]
    fn a_secret_the_host_lacks_is_not_delivered() {
        let mut spec = spec();
        spec.env_secrets = vec!["HAVE".to_owned(), "LACK".to_owned()];
        spec.env_secrets_as_env = vec!["HAVE".to_owned(), "LACK".to_owned()];
        let environment = unit_environment(&spec, host(&[("HAVE", "1")]), &own());
        let delivered = environment.delivered(&spec);
        assert_eq!(delivered.env_secrets, vec!["HAVE".to_owned()]);
        assert_eq!(delivered.env_secrets_as_env, vec!["HAVE".to_owned()]);
        let environment = unit_environment(&spec, host(&[("HAVE", "1"), ("LACK", "2")]), &own());
        assert!(matches!(
            environment.delivered(&spec),
            std::borrow::Cow::Borrowed(_)
        ));
    }
}
