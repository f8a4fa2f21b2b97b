//! Git neutralisation: environment variables that stop a repository's own
//! configuration from making git run a program (hooks, fsmonitor, pagers,
//! editors, credential helpers, signing programs, filter and diff drivers) or
//! use a transport that runs one.
//!
//! `GIT_CONFIG_COUNT`/`GIT_CONFIG_KEY_n`/`GIT_CONFIG_VALUE_n` are "command"
//! scope: they beat the repository's `.git/config` and anything it includes.
//! The user's system and global configuration are trusted and left alone
//! (`GIT_CONFIG_NOSYSTEM`/`GIT_CONFIG_GLOBAL` are not set), as in the dax
//! reference.
//!
//! What config cannot do, and what covers it instead:
//! - `diff.external` is run even when empty (`error: cannot run :`), and any
//!   value turns the external diff on, so it cannot be overridden for every
//!   repository: the stamped plan adds `--no-ext-diff --no-textconv` to
//!   `git diff|log|show`, and where a repository's configuration sets it (any
//!   scope), [`git_neutralisation_with_drivers`] replaces it with a program
//!   that says why and fails, so a diff that would run it fails loudly.
//!   `diff.<driver>.command`, which [`driver_overrides`] empties, fails the
//!   same way instead of running the driver.
//! - Filter, diff and merge drivers are named by attributes and defined by
//!   config with names of the repository's choosing, so they cannot be listed
//!   in advance: [`configured_drivers`] asks git which are defined and
//!   [`driver_overrides`] neutralises them.
//! - Transports: `protocol.allow=never` with `https`, `http`, `ssh` and `git`
//!   kept usable, `ext` never and `file` back to git's own default (`user`:
//!   allowed when the agent types it, refused for submodules). A repository
//!   can still allow a remote helper by its own name (`protocol.<name>.allow`);
//!   that helper must be installed, which is the agent's own code anyway.
//! - `core.sshCommand=ssh` keeps ssh remotes usable with the real ssh
//!   (the dax reference's choice) rather than a failing program.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Hook events (githooks(5)): each gets `hook.<event>.enabled=false`, for the
/// config-based hooks of newer git; `core.hooksPath=/dev/null` covers the
/// hooks directory.
const HOOK_EVENTS: &[&str] = &[
    "applypatch-msg",
    "pre-applypatch",
    "post-applypatch",
    "pre-commit",
    "pre-merge-commit",
    "prepare-commit-msg",
    "commit-msg",
    "post-commit",
    "pre-rebase",
    "post-checkout",
    "post-merge",
    "pre-push",
    "pre-receive",
    "update",
    "proc-receive",
    "post-receive",
    "post-update",
    "reference-transaction",
    "push-to-checkout",
    "pre-auto-gc",
    "post-rewrite",
    "sendemail-validate",
    "fsmonitor-watchman",
    "post-index-change",
    "p4-changelist",
    "p4-prepare-changelist",
    "p4-post-changelist",
    "p4-pre-submit",
];

/// The configuration overrides, in order. The first eight are the dax
/// reference's, so a dax client sees the same keys first.
const CONFIG: &[(&str, &str)] = &[
    ("core.fsmonitor", "false"),
    ("core.pager", "cat"),
    ("core.sshCommand", "ssh"),
    ("core.hooksPath", "/dev/null"),
    ("gpg.program", "/bin/false"),
    ("gpg.openpgp.program", "/bin/false"),
    ("gpg.x509.program", "/bin/false"),
    ("gpg.ssh.program", "/bin/false"),
    ("core.editor", "true"),
    ("sequence.editor", "true"),
    // Empty: git asks no program (and, with GIT_TERMINAL_PROMPT=0, no terminal).
    ("core.askPass", ""),
    // Empty resets the helper list, including `credential.<url>.helper` read before it.
    ("credential.helper", ""),
    ("core.alternateRefsCommand", ""),
    ("commit.gpgSign", "false"),
    ("tag.gpgSign", "false"),
    ("log.showSignature", "false"),
    ("protocol.allow", "never"),
    ("protocol.https.allow", "always"),
    ("protocol.http.allow", "always"),
    ("protocol.ssh.allow", "always"),
    ("protocol.git.allow", "always"),
    ("protocol.file.allow", "user"),
    ("protocol.ext.allow", "never"),
    ("submodule.recurse", "false"),
    ("fetch.recurseSubmodules", "false"),
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
    ("safe.bareRepository", "explicit"),
    ("http.sslVerify", "true"),
];

/// The plain variables added beside the configuration.
const PLAIN: &[(&str, &str)] = &[
    ("GIT_TERMINAL_PROMPT", "0"),
    ("GIT_PAGER", "cat"),
    ("PAGER", "cat"),
    ("GIT_OPTIONAL_LOCKS", "0"),
    ("GIT_NO_LAZY_FETCH", "1"),
    ("GIT_EDITOR", "true"),
    ("GIT_SEQUENCE_EDITOR", "true"),
];

/// The variables that neutralise git's dangerous configuration for a child:
/// `GIT_CONFIG_COUNT`/`KEY_n`/`VALUE_n` and the prompt, pager and lock settings.
pub fn git_neutralisation() -> Vec<(String, String)> {
    git_neutralisation_with_drivers(&Drivers::default())
}

/// What git configuration defines that git would run and a fixed override
/// cannot reach: filter, diff and merge drivers (named by the repository), and
/// whether `diff.external` is set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Drivers {
    /// Driver names (`filter.<name>.clean` → `<name>`), sorted, once each.
    pub names: Vec<String>,
    /// Whether `diff.external` is set.
    pub diff_external: bool,
}

impl Drivers {
    /// Record a configuration key if it defines a driver or `diff.external`.
    /// Section and key match in any case; the driver's name (the subsection)
    /// keeps its case, as git matches it (`[filter "LFS"]` is not `filter.lfs`).
    pub fn add_key(&mut self, key: &str) {
        let key = key.trim();
        if key.eq_ignore_ascii_case("diff.external") {
            self.diff_external = true;
            return;
        }
        let Some((section, rest)) = key.split_once('.') else {
            return;
        };
        let Some((_, last)) = rest.rsplit_once('.') else {
            return;
        };
        let section = section.to_ascii_lowercase();
        let last = last.to_ascii_lowercase();
        let defines = match section.as_str() {
            "filter" => matches!(last.as_str(), "clean" | "smudge" | "process"),
            "diff" => matches!(last.as_str(), "textconv" | "command"),
            "merge" => last == "driver",
            _ => false,
        };
        if defines && let Some(name) = driver_name(key) {
            self.names.push(name);
            self.names.sort();
            self.names.dedup();
        }
    }

    /// What the keys in `git config --name-only -z --get-regexp` output
    /// (one per NUL) define.
    pub fn from_config_keys(output: &[u8]) -> Self {
        let mut drivers = Drivers::default();
        for key in output.split(|byte| *byte == 0) {
            drivers.add_key(&String::from_utf8_lossy(key));
        }
        drivers
    }

    /// Everything `other` defines, added.
    pub fn merge(&mut self, other: &Drivers) {
        self.names.extend(other.names.iter().cloned());
        self.names.sort();
        self.names.dedup();
        self.diff_external |= other.diff_external;
    }
}

/// What a stamped run's `diff.external` becomes where a repository sets it:
/// git runs it with the shell and the diff's arguments, so it says why on
/// stderr and fails (git then stops the diff: "external diff died").
pub const DIFF_EXTERNAL_REFUSED: &str =
    "echo 'box: diff.external is not run here; use git diff --no-ext-diff' >&2; false";

/// [`git_neutralisation`] plus [`driver_overrides`] for `drivers`, and
/// `diff.external` replaced where it is set.
pub fn git_neutralisation_with_drivers(drivers: &Drivers) -> Vec<(String, String)> {
    let mut config: Vec<(String, String)> = CONFIG
        .iter()
        .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
        .collect();
    config.extend(
        HOOK_EVENTS
            .iter()
            .map(|event| (format!("hook.{event}.enabled"), "false".to_owned())),
    );
    config.extend(driver_overrides(&drivers.names));
    if drivers.diff_external {
        config.push(("diff.external".to_owned(), DIFF_EXTERNAL_REFUSED.to_owned()));
    }
    let mut vars = Vec::with_capacity(2 * config.len() + 1 + PLAIN.len());
    vars.push(("GIT_CONFIG_COUNT".to_owned(), config.len().to_string()));
    for (index, (key, value)) in config.into_iter().enumerate() {
        vars.push((format!("GIT_CONFIG_KEY_{index}"), key));
        vars.push((format!("GIT_CONFIG_VALUE_{index}"), value));
    }
    vars.extend(
        PLAIN
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned())),
    );
    vars
}

/// Overrides for filter, diff and merge drivers named `drivers` (as found in
/// attributes or config): filters become `cat` and not required, with no
/// long-running process; diff drivers lose their textconv and command; merge
/// drivers fail closed.
pub fn driver_overrides(drivers: &[String]) -> Vec<(String, String)> {
    let mut config = Vec::new();
    for driver in drivers {
        for (key, value) in [
            ("filter", "process", ""),
            ("filter", "clean", "cat"),
            ("filter", "smudge", "cat"),
            ("filter", "required", "false"),
            ("diff", "textconv", ""),
            ("diff", "command", ""),
            ("merge", "driver", "false"),
        ]
        .map(|(section, key, value)| (format!("{section}.{driver}.{key}"), value.to_owned()))
        {
            config.push((key, value));
        }
    }
    config
}

/// How long a git query may take: an `include.path` naming a FIFO would
/// otherwise block it forever.
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);

/// The filter, diff and merge drivers, and `diff.external`, that git's
/// configuration defines for the repository at `dir` (every scope, includes
/// followed), queried with git itself under [`git_neutralisation`] and `env`.
/// Not a repository, no git, or a query that fails: none (nothing is defined
/// that git would run). A query that does not finish in 10 s is an error,
/// because then the configuration cannot be known.
pub fn configured_drivers(dir: &Path, env: &[(OsString, OsString)]) -> Result<Drivers, String> {
    let Some(bytes) = git_query(
        dir,
        env,
        &[
            "config",
            "--name-only",
            "-z",
            "--get-regexp",
            r"^(filter|diff|merge)\..+\.(clean|smudge|process|textconv|command|driver)$|^diff\.external$",
        ],
    )?
    else {
        return Ok(Drivers::default());
    };
    Ok(Drivers::from_config_keys(&bytes))
}

/// The user-level git configuration file that git, run with `env`, would read
/// (`GIT_CONFIG_GLOBAL`; else `$XDG_CONFIG_HOME/git/config`, or
/// `$HOME/.config/git/config`, and `$HOME/.gitconfig`) and that exists but
/// cannot be opened by this process: git takes such a file as a fatal error
/// ("unknown error occurred while reading the configuration files"), so every
/// git command fails. `None` when each is readable or absent.
pub fn unreadable_global_config(env: &[(OsString, OsString)]) -> Option<PathBuf> {
    let var = |name: &str| {
        env.iter()
            .find(|(key, value)| key == name && !value.is_empty())
            .map(|(_, value)| PathBuf::from(value))
    };
    let candidates = match var("GIT_CONFIG_GLOBAL") {
        Some(global) => vec![global],
        None => {
            let home = var("HOME");
            let xdg = var("XDG_CONFIG_HOME")
                .or_else(|| home.as_ref().map(|home| home.join(".config")))
                .map(|config| config.join("git/config"));
            xdg.into_iter()
                .chain(home.map(|home| home.join(".gitconfig")))
                .collect()
        }
    };
    candidates.into_iter().find(|path| {
        std::fs::File::open(path)
            .is_err_and(|error| error.kind() == std::io::ErrorKind::PermissionDenied)
    })
}

/// Run `git args` in `dir` with `env` plus [`git_neutralisation`], no stdin,
/// stderr discarded, killed after 10 s. `Ok(Some(stdout))` when git exited 0,
/// `Ok(None)` when it could not start or exited non-zero (for `git config`:
/// nothing matched, or not a repository), `Err` on the timeout.
pub fn git_query(
    dir: &Path,
    env: &[(OsString, OsString)],
    args: &[&str],
) -> Result<Option<Vec<u8>>, String> {
    let mut command = Command::new("git");
    command
        .args(args)
        .current_dir(dir)
        .env_clear()
        .envs(env.iter().map(|(name, value)| (name, value)))
        .envs(git_neutralisation())
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let Ok(mut child) = command.spawn() else {
        return Ok(None);
    };
    let deadline = Instant::now() + QUERY_TIMEOUT;
    let stdout = child.stdout.take();
    // Read on a thread so a full pipe cannot stall the deadline loop.
    let reader = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut stdout) = stdout {
            let _ = std::io::Read::read_to_end(&mut stdout, &mut bytes);
        }
        bytes
    });
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "git {} in {} did not answer within {}s",
                    args.first().unwrap_or(&""),
                    dir.display(),
                    QUERY_TIMEOUT.as_secs()
                ));
            }
        }
    };
    let bytes = reader.join().unwrap_or_default();
    Ok(status.success().then_some(bytes))
}

/// `filter.a.b.clean` → `a.b`: the subsection between the section and the key.
fn driver_name(key: &str) -> Option<String> {
    let key = key.trim();
    let (_, rest) = key.split_once('.')?;
    let (name, _) = rest.rsplit_once('.')?;
    (!name.is_empty()).then(|| name.to_owned())
}

#[cfg(test)]
mod tests;
