//! [`ExecutorSpec`]: the one description of how an executor is started. The
//! backends build a unit's `box execute` command line from it
//! ([`ExecutorSpec::to_args`]), the local backend's helper recognises an
//! executor command line with it ([`ExecutorSpec::from_args`]), and the
//! binary's `box execute` turns its parsed flags into one, so the flag names
//! and their values are written here once.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::plan::Requirement;

/// What kind of place an executor runs in, for the descriptor it reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PlaceKind {
    /// A confined process on the host (the local backend).
    Local,
    /// A container (the docker backend).
    Container,
    /// Anywhere else (`box execute` run by hand, dax's remote places).
    #[default]
    Remote,
}

/// Whether overwriting or editing an existing file needs an earlier read of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WriteGuard {
    /// A file must have been read before it is overwritten or edited.
    #[default]
    ReadFirst,
    /// No such check.
    Off,
}

/// Whether box's own seccomp layer is installed on the executor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SeccompLayer {
    /// Installed before the executor serves.
    #[default]
    On,
    /// Not installed (debugging with strace or gdb).
    Off,
}

/// What bash output does with terminal control characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BashOutput {
    /// C0 controls but tab and newline, DEL and C1 shown as `\xHH`.
    #[default]
    Escape,
    /// As the command wrote it.
    Raw,
}

/// A flag value's name and the variants it may take, written once for the
/// command line, its parser and its error messages.
pub trait FlagValue: Sized + Copy + 'static {
    /// Every variant, in the order the help lists them.
    const ALL: &'static [Self];
    /// The variant's name on the command line.
    fn name(self) -> &'static str;
    /// The variant named `name`.
    fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|v| v.name() == name)
    }
    /// "a, b or c", for error messages.
    fn choices() -> String {
        let names: Vec<&str> = Self::ALL.iter().map(|v| v.name()).collect();
        match names.split_last() {
            Some((last, [])) => (*last).to_owned(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => String::new(),
        }
    }
}

macro_rules! flag_value {
    ($ty:ty, $($variant:path => $name:literal),+) => {
        impl FlagValue for $ty {
            const ALL: &'static [Self] = &[$($variant),+];
            fn name(self) -> &'static str {
                match self { $($variant => $name),+ }
            }
        }
    };
}

flag_value!(PlaceKind, PlaceKind::Local => "local", PlaceKind::Container => "container", PlaceKind::Remote => "remote");
flag_value!(WriteGuard, WriteGuard::ReadFirst => "read-first", WriteGuard::Off => "off");
flag_value!(SeccompLayer, SeccompLayer::On => "on", SeccompLayer::Off => "off");
flag_value!(BashOutput, BashOutput::Escape => "escape", BashOutput::Raw => "raw");
impl FlagValue for Requirement {
    const ALL: &'static [Self] = &[Self::Required, Self::BestEffort, Self::Off];
    fn name(self) -> &'static str {
        self.as_str()
    }
}

/// Where a unit's secrets are delivered, one file per secret (`NAME`, mode
/// 0400) on a tmpfs the backend mounts.
pub const SECRETS_DIR: &str = "/run/secrets";

/// The prefix of the variables that carry a secret's value to the executor
/// (`BOX_SECRET_NAME`) in the environment of the process that starts it
/// only: the executor writes each to [`SECRETS_DIR`] and removes them before
/// anything else runs.
pub const SECRET_VALUE_PREFIX: &str = "BOX_SECRET_";

/// Set (to `1`) in the executor's environment when its secrets' values come
/// as the first line of its stdin instead of [`SECRET_VALUE_PREFIX`]
/// variables: a JSON object of name to value, written by the host before any
/// protocol message. A docker unit's executor is started by the unit's init,
/// whose environment is the container's configuration, which `docker
/// inspect` shows; its stdin is the host's channel.
pub const SECRETS_ON_STDIN_VAR: &str = "BOX_SECRETS_ON_STDIN";

/// The longest secrets line the executor reads from its stdin.
pub const MAX_SECRETS_LINE: usize = 1 << 20;

/// Set (to `1`) in the environment of a pooled unit's executor: it starts
/// with no session's plan and waits, before it confines itself or serves
/// anything, for one [`Bind`] line on its stdin (the host's channel), which
/// the host writes when a session claims the unit. The flags it was started
/// with only say where it runs; the bind line's spec replaces them.
pub const BIND_ON_STDIN_VAR: &str = "BOX_BIND_ON_STDIN";

/// A session's plan handed to a pooled unit's executor at the claim (late
/// binding): everything the executor applies itself, which a cold start
/// takes from its command line, environment and secrets line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bind {
    /// The executor's flags for this session (landlock, seccomp, the pass
    /// list, the write guard, the secrets to write...).
    pub spec: ExecutorSpec,
    /// The executor's environment for this session, in place of the one it
    /// was started with (the unit's variables as a cold start sets them).
    pub env: Vec<(String, String)>,
    /// The secrets' values, by name (never written anywhere but the
    /// executor's tmpfs).
    pub secrets: std::collections::BTreeMap<String, String>,
    /// Process limits the executor sets on itself (soft and hard) before it
    /// confines itself, so everything it starts inherits them: where a
    /// backend's limits are rlimits (local), a session's narrower memory or
    /// pids reach a pooled unit this way. `None`: those it was started with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rlimits: Option<BindRlimits>,
}

/// The rlimits a [`Bind`] sets (`box_confine::Rlimits` without the core
/// size, which is always 0 in a unit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BindRlimits {
    /// `RLIMIT_NOFILE`.
    pub nofile: u64,
    /// `RLIMIT_NPROC`.
    pub nproc: u64,
    /// `RLIMIT_DATA`.
    pub data_bytes: u64,
    /// `RLIMIT_AS`.
    pub address_space_bytes: u64,
    /// `RLIMIT_FSIZE`.
    pub fsize_bytes: u64,
}

/// A secret the executor writes to `SECRETS_DIR/NAME` before it serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretFile {
    /// The secret's name: the file's and the variable's.
    pub name: String,
    /// Also given as the variable `NAME` to the processes the executor starts.
    pub as_env: bool,
}

/// How one executor is started: every `box execute` flag, typed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecutorSpec {
    /// The workspace root every tool acts beneath.
    pub root: PathBuf,
    /// The kind of place, for the descriptor.
    pub kind: PlaceKind,
    /// What the place is called (image, host); `None`: the host name.
    pub reference: Option<String>,
    /// The most bytes of a file the tools read; 0: the executor's default.
    pub max_read_bytes: u64,
    /// Credential-looking variables kept in children's environment.
    pub pass_env: Vec<String>,
    /// Whether editing needs an earlier read.
    pub write_guard: WriteGuard,
    /// Whether the executor confines itself with landlock.
    pub landlock: Requirement,
    /// Whether box's seccomp layer is installed.
    pub seccomp: SeccompLayer,
    /// What bash output does with terminal control characters.
    pub bash_output: BashOutput,
    /// The secrets to write under [`SECRETS_DIR`] (`--secrets A,B:env`);
    /// their values come in `BOX_SECRET_NAME` variables.
    pub secrets: Vec<SecretFile>,
    /// The host's egress proxy socket, bind-mounted into the unit: the executor
    /// bridges it to a loopback port and points its children's proxy variables
    /// there. `None`: no egress.
    pub egress_socket: Option<PathBuf>,
    /// Directories the executor and its children may read (never write)
    /// besides the root and the system's: a `worktree` fork's borrowed git
    /// objects, which the child's alternates name (`--read DIR`, repeated).
    pub read: Vec<PathBuf>,
    /// Directories the executor and its children may write besides the root
    /// and `TMPDIR`: the unit's home, its own `/tmp`, its volumes (`--write
    /// DIR`, repeated). The backend's own confinement still bounds them.
    pub write: Vec<PathBuf>,
}

/// A command line that is not an executor's, or has a bad flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// The first argument is not `execute`.
    #[error("not an executor command line (expected `execute`)")]
    NotExecute,
    /// A flag box execute does not have.
    #[error("{0}: no such flag of box execute")]
    UnknownFlag(String),
    /// A flag without its value.
    #[error("{0} needs a value")]
    MissingValue(String),
    /// A value the flag does not take.
    #[error("{flag} {value}: choose {choices}")]
    BadValue {
        /// The flag.
        flag: String,
        /// What was given.
        value: String,
        /// What it takes.
        choices: String,
    },
    /// No `--root`.
    #[error("--root is required")]
    NoRoot,
}

impl ExecutorSpec {
    /// An executor rooted at `root` with every other flag at its default.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            kind: PlaceKind::default(),
            reference: None,
            max_read_bytes: 0,
            pass_env: Vec::new(),
            write_guard: WriteGuard::default(),
            landlock: Requirement::BestEffort,
            seccomp: SeccompLayer::default(),
            bash_output: BashOutput::default(),
            secrets: Vec::new(),
            egress_socket: None,
            read: Vec::new(),
            write: Vec::new(),
        }
    }

    /// The arguments after the program: `execute --root … [flags]`, with
    /// flags at their default left out so command lines stay short.
    pub fn to_args(&self) -> Vec<String> {
        let mut args = vec![
            "execute".to_owned(),
            "--root".to_owned(),
            self.root.to_string_lossy().into_owned(),
        ];
        let default = Self::new(&self.root);
        let mut flag = |name: &str, value: String| {
            args.push(name.to_owned());
            args.push(value);
        };
        if self.kind != default.kind {
            flag("--kind", self.kind.name().to_owned());
        }
        if let Some(reference) = &self.reference {
            flag("--ref", reference.clone());
        }
        if self.max_read_bytes != default.max_read_bytes {
            flag("--max-read-bytes", self.max_read_bytes.to_string());
        }
        if self.landlock != default.landlock {
            flag("--landlock", self.landlock.name().to_owned());
        }
        if !self.pass_env.is_empty() {
            flag("--pass-env", self.pass_env.join(","));
        }
        if self.write_guard != default.write_guard {
            flag("--write-guard", self.write_guard.name().to_owned());
        }
        if self.seccomp != default.seccomp {
            flag("--seccomp", self.seccomp.name().to_owned());
        }
        if self.bash_output != default.bash_output {
            flag("--bash-output", self.bash_output.name().to_owned());
        }
        if !self.secrets.is_empty() {
            let names: Vec<String> = self
                .secrets
                .iter()
                .map(|secret| {
                    if secret.as_env {
                        format!("{}:env", secret.name)
                    } else {
                        secret.name.clone()
                    }
                })
                .collect();
            flag("--secrets", names.join(","));
        }
        if let Some(socket) = &self.egress_socket {
            flag("--egress-socket", socket.to_string_lossy().into_owned());
        }
        // One flag per directory: a path may hold any character but NUL.
        for dir in &self.read {
            flag("--read", dir.to_string_lossy().into_owned());
        }
        for dir in &self.write {
            flag("--write", dir.to_string_lossy().into_owned());
        }
        args
    }

    /// The spec of a command line [`to_args`](Self::to_args) wrote (`execute`
    /// first, `--flag value` or `--flag=value` pairs after).
    pub fn from_args<S: AsRef<str>>(args: &[S]) -> Result<Self, SpecError> {
        let mut args = args.iter().map(AsRef::as_ref);
        if args.next() != Some("execute") {
            return Err(SpecError::NotExecute);
        }
        let mut root = None;
        let mut spec = Self::new("");
        while let Some(arg) = args.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((flag, value)) if flag.starts_with("--") => (flag, Some(value)),
                _ => (arg, None),
            };
            let value = match inline.or_else(|| args.next()) {
                Some(value) => value,
                None => return Err(SpecError::MissingValue(flag.to_owned())),
            };
            match flag {
                "--root" => root = Some(PathBuf::from(value)),
                "--kind" => spec.kind = choice(flag, value)?,
                "--ref" => spec.reference = Some(value.to_owned()),
                "--max-read-bytes" => {
                    spec.max_read_bytes = value.parse().map_err(|_| SpecError::BadValue {
                        flag: flag.to_owned(),
                        value: value.to_owned(),
                        choices: "a number of bytes".to_owned(),
                    })?
                }
                "--pass-env" => spec.pass_env.extend(
                    value
                        .split(',')
                        .filter(|n| !n.is_empty())
                        .map(str::to_owned),
                ),
                "--write-guard" => spec.write_guard = choice(flag, value)?,
                "--landlock" => spec.landlock = choice(flag, value)?,
                "--seccomp" => spec.seccomp = choice(flag, value)?,
                "--bash-output" => spec.bash_output = choice(flag, value)?,
                "--secrets" => spec.secrets.extend(parse_secrets(value)?),
                "--egress-socket" => spec.egress_socket = Some(PathBuf::from(value)),
                "--read" => spec.read.push(PathBuf::from(value)),
                "--write" => spec.write.push(PathBuf::from(value)),
                other => return Err(SpecError::UnknownFlag(other.to_owned())),
            }
        }
        spec.root = root.ok_or(SpecError::NoRoot)?;
        Ok(spec)
    }
}

/// `--secrets A,B:env`: names, each optionally `:env`.
pub fn parse_secrets(value: &str) -> Result<Vec<SecretFile>, SpecError> {
    let mut secrets = Vec::new();
    for item in value.split(',').filter(|item| !item.is_empty()) {
        let (name, as_env) = match item.split_once(':') {
            None => (item, false),
            Some((name, "env")) => (name, true),
            Some(_) => {
                return Err(SpecError::BadValue {
                    flag: "--secrets".to_owned(),
                    value: item.to_owned(),
                    choices: "NAME or NAME:env, comma-separated".to_owned(),
                });
            }
        };
        let valid = !name.is_empty()
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !name.starts_with(|c: char| c.is_ascii_digit());
        if !valid {
            return Err(SpecError::BadValue {
                flag: "--secrets".to_owned(),
                value: item.to_owned(),
                choices: "a variable name (letters, digits, _), optionally :env".to_owned(),
            });
        }
        secrets.push(SecretFile {
            name: name.to_owned(),
            as_env,
        });
    }
    Ok(secrets)
}

/// `value` as one of `T`'s names, or an error naming the flag and the choices.
pub fn choice<T: FlagValue>(flag: &str, value: &str) -> Result<T, SpecError> {
    T::from_name(value).ok_or_else(|| SpecError::BadValue {
        flag: flag.to_owned(),
        value: value.to_owned(),
        choices: T::choices(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> ExecutorSpec {
        ExecutorSpec {
            root: PathBuf::from("/workspace dir"),
            kind: PlaceKind::Container,
            reference: Some("box-base:latest".to_owned()),
            max_read_bytes: 4096,
            pass_env: vec!["API_TOKEN".to_owned(), "GH_TOKEN".to_owned()],
            write_guard: WriteGuard::Off,
            landlock: Requirement::Required,
            seccomp: SeccompLayer::Off,
            bash_output: BashOutput::Raw,
            secrets: vec![
                SecretFile {
                    name: "DEPLOY_KEY".to_owned(),
                    as_env: false,
                },
                SecretFile {
                    name: "GH_TOKEN".to_owned(),
                    as_env: true,
                },
            ],
            egress_socket: Some(PathBuf::from("/.box/egress/proxy.sock")),
            read: vec![
                PathBuf::from("/.box/objects"),
                PathBuf::from("/srv/repo, with a comma/.git/objects"),
            ],
            write: vec![PathBuf::from("/home/box"), PathBuf::from("/tmp")],
        }
    }

    #[test]
    fn every_field_survives_the_command_line() {
        for spec in [full(), ExecutorSpec::new("/w")] {
            assert_eq!(ExecutorSpec::from_args(&spec.to_args()), Ok(spec));
        }
    }

    #[test]
    fn defaults_are_left_out() {
        assert_eq!(
            ExecutorSpec::new("/w").to_args(),
            ["execute", "--root", "/w"]
        );
    }

    #[test]
    fn bad_command_lines_name_the_flag() {
        assert_eq!(
            ExecutorSpec::from_args(&["execute", "--root", "/w", "--landlock", "maybe"]),
            Err(SpecError::BadValue {
                flag: "--landlock".into(),
                value: "maybe".into(),
                choices: "required, best-effort or off".into()
            })
        );
        assert_eq!(
            ExecutorSpec::from_args(&["execute"]),
            Err(SpecError::NoRoot)
        );
        assert_eq!(
            ExecutorSpec::from_args(&["run"]),
            Err(SpecError::NotExecute)
        );
        assert_eq!(
            ExecutorSpec::from_args(&["execute", "--no-fs"]),
            Err(SpecError::MissingValue("--no-fs".into()))
        );
        assert_eq!(
            ExecutorSpec::from_args(&["execute", "--no-fs", "x"]),
            Err(SpecError::UnknownFlag("--no-fs".into()))
        );
    }
}
