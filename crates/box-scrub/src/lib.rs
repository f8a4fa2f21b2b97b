//! Environment scrubbing and git neutralisation: one place, used by the host
//! (a unit's environment), the executor (every child it starts) and any git the
//! host itself runs.
//!
//! A variable is removed when its name is a credential or a dangerous variable
//! (`names`: the dax reference's rules plus security.md 4.2 and 4.3, with the
//! deliberate false positives kept), or when its value carries a credential
//! (`values`: a URL with a password, the high-precision token shapes). A pass
//! list keeps a variable by exact-case name, except the variables that hijack
//! execution of every child (`LD_*`, `BASH_ENV`, `ENV`, `PROMPT_COMMAND`,
//! `BASH_FUNC_*`, `SHELLOPTS`, `BASHOPTS`, `PS4`, `GCONV_PATH`, `MALLOC_CONF`,
//! `GLIBC_TUNABLES`): no pass list keeps those. Names removed are reported,
//! values never.
//!
//! `git` owns the neutralising environment (`GIT_CONFIG_*` overrides) and
//! its canary tests.

mod git;
mod names;
mod values;

use std::ffi::OsString;

pub use git::{
    Drivers, configured_drivers, driver_overrides, git_neutralisation,
    git_neutralisation_with_drivers, git_query, unreadable_global_config,
};

/// An environment after scrubbing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scrubbed {
    /// The variables that stay, in their original order.
    pub kept: Vec<(OsString, OsString)>,
    /// The names of the variables removed (never their values).
    pub removed: Vec<String>,
}

/// A pass list that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ScrubError {
    /// An item holds `=`, a space or a tab.
    #[error("--pass-env: {0:?} is not a variable name")]
    NotAName(String),
}

/// Remove credentials and dangerous variables from `vars`; names in `pass`
/// (exact case) are kept even when they look like credentials, unless they
/// hijack execution (`LD_PRELOAD` and the like, see the module docs).
pub fn scrub_environment<I>(vars: I, pass: &[String]) -> Scrubbed
where
    I: IntoIterator<Item = (OsString, OsString)>,
{
    let mut scrubbed = Scrubbed::default();
    for (name, value) in vars {
        let name_text = name.to_string_lossy();
        let verdict = names::classify(&name_text);
        let passed = pass.iter().any(|item| *item == *name_text);
        let remove = match verdict {
            names::NameVerdict::Hijack => true,
            _ if passed => false,
            names::NameVerdict::Remove => true,
            names::NameVerdict::Keep => values::is_secret(&value.to_string_lossy()),
        };
        if remove {
            scrubbed.removed.push(name_text.into_owned());
        } else {
            scrubbed.kept.push((name, value));
        }
    }
    scrubbed
}

/// The variables of `vars` that hold a credential, by name or by value
/// (the ones [`scrub_environment`] removes for that reason, not those removed
/// for the power they grant or the tool they redirect): the host redacts
/// their values from everything a session receives. With their values, so
/// never log the result.
pub fn credentials<I>(vars: I) -> Vec<(String, OsString)>
where
    I: IntoIterator<Item = (OsString, OsString)>,
{
    vars.into_iter()
        .filter(|(name, value)| {
            let name = name.to_string_lossy();
            names::is_credential(&name)
                || (names::classify(&name) == names::NameVerdict::Keep
                    && values::is_secret(&value.to_string_lossy()))
        })
        .map(|(name, value)| (name.to_string_lossy().into_owned(), value))
        .collect()
}

/// Parse a pass list as `--pass-env` gives it: whitespace trimmed, empty items
/// skipped, an item holding `=`, a space or a tab refused.
pub fn parse_pass_env(items: &[String]) -> Result<Vec<String>, ScrubError> {
    let mut names = Vec::new();
    for item in items {
        let trimmed = item.trim();
        if trimmed.is_empty() {
            continue;
        }
        if trimmed.contains(['=', ' ', '\t']) {
            return Err(ScrubError::NotAName(trimmed.to_owned()));
        }
        names.push(trimmed.to_owned());
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrub(vars: &[(&str, &str)], pass: &[&str]) -> Scrubbed {
        let pass: Vec<String> = pass.iter().map(|name| (*name).to_owned()).collect();
        scrub_environment(
            vars.iter()
                .map(|(name, value)| (OsString::from(name), OsString::from(value))),
            &pass,
        )
    }

    fn removed(name: &str) -> bool {
        scrub(&[(name, "x")], &[]).removed == [name]
    }

    #[test]
    fn credentials_are_told_from_powerful_variables() {
        let vars = [
            ("GITHUB_TOKEN", "ghp_abcdefghijklmnopqrstuvwxyz0123456789"),
            ("AWS_ACCESS_KEY_ID", "AKIAABCDEFGHIJKLMNOP"),
            ("CLONE", "https://user:hunter2hunter2@example.com/x.git"),
            ("XDG_RUNTIME_DIR", "/run/user/1000"),
            ("DBUS_SESSION_BUS_ADDRESS", "unix:path=/run/user/1000/bus"),
            ("GIT_SSH", "/usr/bin/ssh"),
            ("LD_PRELOAD", "/evil.so"),
            ("KUBECONFIG", "/home/u/.kube/config"),
            ("LANG", "C.UTF-8"),
        ];
        let found: Vec<String> = credentials(
            vars.iter()
                .map(|(name, value)| (OsString::from(name), OsString::from(value))),
        )
        .into_iter()
        .map(|(name, _)| name)
        .collect();
        assert_eq!(found, ["GITHUB_TOKEN", "AWS_ACCESS_KEY_ID", "CLONE"]);
    }

    #[test]
    fn credential_names_are_removed() {
        let names = [
            // The dax reference: names, suffixes, PASSWORD/SECRET anywhere.
            "PASSWORD",
            "TOKEN",
            "API_KEY",
            "SECRET",
            "KEY",
            "AUTH",
            "DATABASE_URL",
            "SSH_AUTH_SOCK",
            "PGPASSWORD",
            "MYSQL_PWD",
            "OPENAI_API_KEY",
            "ANTHROPIC_API_KEY",
            "GEMINI_API_KEY",
            "GOOGLE_API_KEY",
            "OPENROUTER_API_KEY",
            "DAX_API_KEY",
            "AWS_SESSION_TOKEN",
            "NPM_TOKEN",
            "GITHUB_TOKEN",
            "GH_TOKEN",
            "MY_KEY_ID",
            "X_PAT",
            "DB_PWD",
            "CI_JWT",
            "SOME_CREDENTIALS",
            "X_AUTH",
            "MY_SECRET",
            "MYPASSWORDFILE",
            "TOPSECRETTHING",
            "github_token",
            // security.md 4.2.
            "SMTP_PASSWD",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_ACCESS_KEY_ID",
            "AWS_PROFILE",
            "ANTHROPIC_AUTH_TOKEN",
            "CLAUDE_CODE_OAUTH_TOKEN",
            "OPENAI_ORG_ID",
            "AZURE_OPENAI_API_KEY",
            "HF_TOKEN",
            "HUGGING_FACE_HUB_TOKEN",
            "GH_ENTERPRISE_TOKEN",
            "ACTIONS_RUNTIME_TOKEN",
            "ACTIONS_ID_TOKEN_REQUEST_URL",
            "ACTIONS_CACHE_URL",
            "CI_JOB_TOKEN",
            "CI_JOB_JWT_V2",
            "CI_REGISTRY_PASSWORD",
            "CI_REPOSITORY_URL",
            "GITLAB_TOKEN",
            "BUILDKITE_AGENT_ACCESS_TOKEN",
            "CIRCLE_TOKEN",
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
            "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
            "GOOGLE_APPLICATION_CREDENTIALS",
            "CLOUDSDK_AUTH_ACCESS_TOKEN",
            "AZURE_CLIENT_SECRET",
            "AZURE_CLIENT_CERTIFICATE_PATH",
            "ARM_ACCESS_KEY",
            "DIGITALOCEAN_TOKEN",
            "VAULT_TOKEN",
            "TF_TOKEN_app_terraform_io",
            "TF_VAR_db",
            "KUBECONFIG",
            "DOCKER_AUTH_CONFIG",
            "DOCKER_CONFIG",
            "REGISTRY_AUTH_FILE",
            "NODE_AUTH_TOKEN",
            "NPM_CONFIG__AUTH",
            "TWINE_PASSWORD",
            "CARGO_REGISTRY_TOKEN",
            "CARGO_REGISTRIES_MINE_TOKEN",
            "GEM_HOST_API_KEY",
            "SENTRY_AUTH_TOKEN",
            "SLACK_BOT_TOKEN",
            "STRIPE_KEY",
            "REDISCLI_AUTH",
            "SSH_AGENT_PID",
            "GPG_AGENT_INFO",
            "GNUPGHOME",
            "DBUS_SESSION_BUS_ADDRESS",
            "XDG_RUNTIME_DIR",
            "BOX_TOKEN",
            "SESSION_COOKIE",
            "APP_PRIVATE_KEY",
            "SIGNING_KEY",
            "SENTRY_DSN",
            "TLS_PEM",
            "HTTP_AUTHORIZATION",
            "MY_APIKEY",
            "DEPLOY_KEYS",
            "AWS_CREDS",
            // security.md 4.3.
            "DOCKER_HOST",
            "DOCKER_CONTEXT",
            "DOCKER_TLS_VERIFY",
            "DOCKER_CERT_PATH",
            "CONTAINER_HOST",
            "KUBERNETES_SERVICE_HOST",
            "KUBERNETES_SERVICE_PORT",
            "LD_PRELOAD",
            "LD_LIBRARY_PATH",
            "LD_AUDIT",
            "BASH_ENV",
            "ENV",
            "PROMPT_COMMAND",
            "PYTHONPATH",
            "PYTHONSTARTUP",
            "NODE_OPTIONS",
            "PERL5OPT",
            "RUBYOPT",
            "JAVA_TOOL_OPTIONS",
            "_JAVA_OPTIONS",
            "GIT_DIR",
            "GIT_CONFIG_COUNT",
            "GIT_SSH_COMMAND",
            "GIT_ASKPASS",
            "GIT_EXEC_PATH",
            "HTTP_PROXY",
            "https_proxy",
            "ALL_PROXY",
            "NO_PROXY",
            "SSL_CERT_FILE",
            "SSL_CERT_DIR",
            "REQUESTS_CA_BUNDLE",
            "NODE_EXTRA_CA_CERTS",
            "BASH_FUNC_git%%",
            "SHELLOPTS",
        ];
        let kept: Vec<&str> = names
            .iter()
            .copied()
            .filter(|name| !removed(name))
            .collect();
        assert!(kept.is_empty(), "kept: {kept:?}");
    }

    #[test]
    fn false_positives_and_ordinary_names_stay() {
        let names = [
            "PWD",
            "OLDPWD",
            "INIT_CWD",
            "KEYBOARD_LAYOUT",
            "TOKENIZERS_PARALLELISM",
            "GPG_TTY",
            "SSH_TTY",
            "GIT_AUTHOR_NAME",
            "GIT_AUTHOR_EMAIL",
            "GIT_COMMITTER_NAME",
            "CARGO_PKG_AUTHORS",
            "PATH",
            "HOME",
            "USER",
            "LANG",
            "TERM",
            "SHELL",
            "HOSTNAME",
            "GOPATH",
            "RUSTUP_HOME",
            "NETRC",
            "PGPASSFILE",
            "PGSERVICEFILE",
            "SSH_ASKPASS",
            "CLOUDSDK_CONFIG",
            "MONKEY",
            "EDITOR",
        ];
        let gone: Vec<&str> = names.iter().copied().filter(|name| removed(name)).collect();
        assert!(gone.is_empty(), "removed: {gone:?}");
    }

    #[test]
    fn secret_values_are_removed_whatever_the_name() {
        let scrubbed = scrub(
            &[
                (
                    "REPO",
                    "https://ci:glpat-abcdefghij0123456789@gitlab.example/x.git",
                ),
                ("NOTE", "ghp_0123456789abcdefghijABCDEFGHIJ012345"),
                ("CERTIFICATE", "-----BEGIN RSA PRIVATE KEY-----\nMII"),
                ("HOME", "/home/u"),
            ],
            &[],
        );
        assert_eq!(scrubbed.removed, ["REPO", "NOTE", "CERTIFICATE"]);
        assert_eq!(scrubbed.kept, [("HOME".into(), "/home/u".into())]);
    }

    #[test]
    fn pass_keeps_by_exact_case_but_never_a_hijack() {
        let vars = [
            ("GITHUB_TOKEN", "ghp_0123456789abcdefghijABCDEFGHIJ012345"),
            ("NPM_TOKEN", "x"),
            ("LD_PRELOAD", "/tmp/evil.so"),
            ("BASH_ENV", "/tmp/rc"),
            ("HTTPS_PROXY", "http://proxy:3128"),
        ];
        let scrubbed = scrub(
            &vars,
            &[
                "GITHUB_TOKEN",
                "npm_token",
                "LD_PRELOAD",
                "BASH_ENV",
                "HTTPS_PROXY",
            ],
        );
        assert_eq!(scrubbed.removed, ["NPM_TOKEN", "LD_PRELOAD", "BASH_ENV"]);
        let kept: Vec<_> = scrubbed.kept.iter().map(|(name, _)| name.clone()).collect();
        assert_eq!(kept, ["GITHUB_TOKEN", "HTTPS_PROXY"]);
    }

    #[test]
    fn removed_names_never_carry_values() {
        let scrubbed = scrub(&[("API_TOKEN", "canary-value-123")], &[]);
        assert!(!format!("{scrubbed:?}").contains("canary-value-123"));
    }

    #[test]
    fn pass_env_items_are_names() {
        let items: Vec<String> = [" A ", "", "B"].iter().map(|s| (*s).to_owned()).collect();
        assert_eq!(
            parse_pass_env(&items),
            Ok(vec!["A".to_owned(), "B".to_owned()])
        );
        assert_eq!(
            parse_pass_env(&["x y".to_owned()]),
            Err(ScrubError::NotAName("x y".to_owned()))
        );
        assert_eq!(
            ScrubError::NotAName("x y".into()).to_string(),
            "--pass-env: \"x y\" is not a variable name"
        );
    }
}
