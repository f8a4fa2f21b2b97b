//! Which variable names are credentials or dangerous, by name alone.
//!
//! Names are compared upper-cased. The order of the checks matters: the
//! execution-hijacking variables first (no pass list keeps them), then the
//! deliberate false positives, then the explicit lists (security.md 4.2, 4.3),
//! then the credential-file path variables of the dax reference (which only
//! escape the generic patterns after them), then the generic patterns.

/// Why a name is removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NameVerdict {
    /// Not a credential by name.
    Keep,
    /// A credential or a variable that redirects a tool; a pass list may keep it.
    Remove,
    /// Hijacks execution of every child (LD_PRELOAD, BASH_ENV...); no pass list keeps it.
    Hijack,
}

/// Variables that make a dynamic loader, bash or an interpreter run code the
/// child did not ask for. Removed even when a pass list names them, because a
/// pass list is for handing a credential to a tool, not for code injection.
const HIJACK: &[&str] = &[
    "LD_*",
    "BASH_ENV",
    "ENV",
    "PROMPT_COMMAND",
    "BASH_FUNC_*",
    "SHELLOPTS",
    "BASHOPTS",
    "PS4",
    "GCONV_PATH",
    "MALLOC_CONF",
    "GLIBC_TUNABLES",
];

/// Names the generic patterns would catch that carry no secret and that tools
/// rely on. `GIT_AUTHOR_*`/`GIT_COMMITTER_*` identify a person, they configure
/// nothing git runs.
const FALSE_POSITIVES: &[&str] = &[
    "PWD",
    "OLDPWD",
    "INIT_CWD",
    "KEYBOARD*",
    "TOKENIZERS_PARALLELISM",
    "GPG_TTY",
    "SSH_TTY",
    "GIT_AUTHOR_NAME",
    "GIT_AUTHOR_EMAIL",
    "GIT_AUTHOR_DATE",
    "GIT_COMMITTER_NAME",
    "GIT_COMMITTER_EMAIL",
    "GIT_COMMITTER_DATE",
];

/// The explicit lists: credentials by name (security.md 4.2 and the dax
/// reference's names, this one) and variables that grant power or redirect a
/// tool without being secret (security.md 4.3, [`EXPLICIT_POWER`]).
const EXPLICIT: &[&str] = &[
    // The dax reference's names.
    "PASSWORD",
    "TOKEN",
    "API_KEY",
    "SECRET_KEY",
    "SECRET",
    "KEY",
    "AUTH",
    "DATABASE_URL",
    "SSH_AUTH_SOCK",
    "PGPASSWORD",
    "MYSQL_PWD",
    "DAX_API_KEY",
    // AI providers.
    "OPENAI_ORG_ID",
    "CLAUDE_CODE_OAUTH_TOKEN",
    // Source hosting and CI (URLs that carry a job token).
    "ACTIONS_ID_TOKEN_REQUEST_URL",
    "ACTIONS_CACHE_URL",
    "ACTIONS_RESULTS_URL",
    "ACTIONS_RUNTIME_URL",
    "CI_REPOSITORY_URL",
    "CI_JOB_JWT*",
    // Cloud.
    "AWS_ACCESS_KEY_ID",
    "AWS_PROFILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "AWS_CONTAINER_*",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "AZURE_CLIENT_CERTIFICATE_PATH",
    "AZURE_FEDERATED_TOKEN_FILE",
    // Infrastructure.
    "TF_TOKEN_*",
    "TF_VAR_*",
    "KUBECONFIG",
    "DOCKER_AUTH_CONFIG",
    "DOCKER_CONFIG",
    "REGISTRY_AUTH*",
    "NPM_CONFIG__AUTH*",
    "CARGO_REGISTRIES_*_TOKEN",
    "SLACK_*",
    "STRIPE_*",
    "REDISCLI_AUTH",
];

/// Variables removed because they grant power or redirect a tool, not because
/// their value is a secret (the host does not redact their values).
const EXPLICIT_POWER: &[&str] = &[
    // Sockets and agents.
    "SSH_AGENT_PID",
    "GPG_AGENT_INFO",
    "GNUPGHOME",
    "DBUS_SESSION_BUS_ADDRESS",
    "XDG_RUNTIME_DIR",
    // The box host's own variables.
    "BOX_*",
    // security.md 4.3: power or redirection without a secret.
    "DOCKER_HOST",
    "DOCKER_CONTEXT",
    "DOCKER_TLS_VERIFY",
    "DOCKER_CERT_PATH",
    "CONTAINER_HOST",
    "KUBERNETES_SERVICE_HOST",
    "KUBERNETES_SERVICE_PORT",
    "KUBERNETES_SERVICE_PORT_*",
    "KUBERNETES_PORT*",
    "PYTHONPATH",
    "PYTHONSTARTUP",
    "PYTHONHOME",
    "NODE_OPTIONS",
    "NODE_PATH",
    "PERL5OPT",
    "PERL5LIB",
    "PERLLIB",
    "RUBYOPT",
    "RUBYLIB",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "JDK_JAVA_OPTIONS",
    "GIT_*",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "FTP_PROXY",
    "NO_PROXY",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
];

/// The dax reference's credential-file path variables: a path to a file is not
/// the secret, so the generic patterns below do not remove them. The explicit
/// lists above win (security.md names `KUBECONFIG`, `DOCKER_CONFIG`,
/// `GOOGLE_APPLICATION_CREDENTIALS`, the AWS files and `XDG_RUNTIME_DIR` as
/// things a unit must not inherit); a pass list keeps any of them.
const CREDENTIAL_FILES: &[&str] = &[
    "GOOGLE_APPLICATION_CREDENTIALS",
    "KUBECONFIG",
    "DOCKER_CONFIG",
    "NETRC",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "CLOUDSDK_CONFIG",
    "SSH_ASKPASS",
    "GIT_ASKPASS",
    "XDG_RUNTIME_DIR",
    "PGPASSFILE",
    "PGSERVICEFILE",
];

/// Generic patterns (security.md 4.2 and the dax reference's suffixes).
const GENERIC: &[&str] = &[
    "*TOKEN*",
    "*SECRET*",
    "*PASSWORD*",
    "*PASSWD*",
    "*PWD",
    "*_KEY",
    "*_KEYS",
    "*_KEY_ID",
    "*API_KEY*",
    "*APIKEY*",
    "*PRIVATE_KEY*",
    "*ACCESS_KEY*",
    "*CREDENTIAL*",
    "*CREDS*",
    "*SESSION*",
    "*COOKIE*",
    "*SIGNING*",
    "*_PAT",
    "*_JWT",
    "*_PEM",
    "*_DSN",
    "*DATABASE_URL*",
];

/// Classify a variable name.
pub(crate) fn classify(name: &str) -> NameVerdict {
    let upper = name.to_ascii_uppercase();
    let any = |patterns: &[&str]| patterns.iter().any(|p| glob_match(p, &upper));
    if any(HIJACK) {
        NameVerdict::Hijack
    } else if any(FALSE_POSITIVES) {
        NameVerdict::Keep
    } else if any(EXPLICIT) || any(EXPLICIT_POWER) {
        NameVerdict::Remove
    } else if any(CREDENTIAL_FILES) {
        NameVerdict::Keep
    } else if any(GENERIC) || has_auth(&upper) {
        NameVerdict::Remove
    } else {
        NameVerdict::Keep
    }
}

/// Whether `name` names a credential (not merely a powerful or redirecting
/// variable): its value is a secret to redact wherever it appears.
pub(crate) fn is_credential(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    let any = |patterns: &[&str]| patterns.iter().any(|p| glob_match(p, &upper));
    // A path to a credential file is not the secret; a variable removed for
    // the power it grants is not one either, whatever generic pattern it
    // also matches (`DBUS_SESSION_BUS_ADDRESS`).
    if any(HIJACK) || any(FALSE_POSITIVES) || any(CREDENTIAL_FILES) || any(EXPLICIT_POWER) {
        false
    } else {
        any(EXPLICIT) || any(GENERIC) || has_auth(&upper)
    }
}

/// `*AUTH*` without the `AUTHOR` false positive: `AUTHOR` (and `AUTHORS`) is
/// a person, but `AUTHORIZATION` and `AUTHORITY` are credentials or trust.
fn has_auth(upper: &str) -> bool {
    upper.match_indices("AUTH").any(|(at, _)| {
        let rest = &upper[at + 4..];
        !rest.starts_with("OR") || rest.starts_with("ORI")
    })
}

/// A glob over an upper-case name: `*` matches any run of characters, every
/// other character itself.
pub(crate) fn glob_match(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let Some(first) = parts.next() else {
        return name.is_empty();
    };
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_as_written() {
        assert!(glob_match("*TOKEN*", "GH_TOKEN"));
        assert!(glob_match("*TOKEN*", "TOKEN"));
        assert!(glob_match(
            "CARGO_REGISTRIES_*_TOKEN",
            "CARGO_REGISTRIES_MY_TOKEN"
        ));
        assert!(!glob_match(
            "CARGO_REGISTRIES_*_TOKEN",
            "CARGO_REGISTRIES_TOKEN"
        ));
        assert!(glob_match("PWD", "PWD"));
        assert!(!glob_match("PWD", "OLDPWD"));
        assert!(glob_match("*PWD", "OLDPWD"));
        assert!(!glob_match("*_KEY", "KEY"));
        assert!(glob_match("LD_*", "LD_PRELOAD"));
    }

    #[test]
    fn author_is_not_auth() {
        for name in ["GIT_AUTHOR_NAME", "CARGO_PKG_AUTHORS", "AUTHOR"] {
            assert_eq!(classify(name), NameVerdict::Keep, "{name}");
        }
        for name in [
            "AUTH",
            "OAUTH_CLIENT",
            "HTTP_AUTHORIZATION",
            "MY_AUTH_HEADER",
            "CERT_AUTHORITY",
            "AUTHENTICATION",
        ] {
            assert_eq!(classify(name), NameVerdict::Remove, "{name}");
        }
    }
}
