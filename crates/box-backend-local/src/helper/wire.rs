//! The helper's wire with the backend: the spec it reads (`LENGTH\n` then
//! the JSON, on stdin) and the report it writes (one JSON line).

use std::fs::File;
use std::io::{Read, Write};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use box_confine::{CapabilitySets, ConfineError, LandlockOutcome, Rlimits};
use box_policy::plan::Requirement;

use super::SandboxArgs;

/// A requirement as the spec spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SpecRequirement {
    /// Not started without it.
    Required,
    /// Applied where possible, reported.
    BestEffort,
    /// Not applied.
    Off,
}

impl From<Requirement> for SpecRequirement {
    fn from(requirement: Requirement) -> Self {
        match requirement {
            Requirement::Required => Self::Required,
            Requirement::BestEffort => Self::BestEffort,
            Requirement::Off => Self::Off,
        }
    }
}

impl From<SpecRequirement> for Requirement {
    fn from(requirement: SpecRequirement) -> Self {
        match requirement {
            SpecRequirement::Required => Self::Required,
            SpecRequirement::BestEffort => Self::BestEffort,
            SpecRequirement::Off => Self::Off,
        }
    }
}

/// The unit's network on the local backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SpecNetwork {
    /// Only loopback: a network namespace of its own, or, where none can be
    /// made, landlock denying every TCP bind and connect (ABI 4).
    None,
    /// The host's network, unfiltered.
    Host,
}

/// A numeric user and group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpecUser {
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

/// Everything the helper applies: built by the local backend from a unit spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxSpec {
    /// The unit's name (for messages).
    pub unit: String,
    /// Written, created and removed beneath (the workspace when writable, the
    /// unit's private temp directory).
    pub write: Vec<PathBuf>,
    /// Read and executed beneath, besides the system directories (a read-only
    /// workspace, the executor binary).
    pub read: Vec<PathBuf>,
    /// CMD's working directory.
    pub cwd: PathBuf,
    /// The network.
    pub network: SpecNetwork,
    /// Run as this user; only a helper started as root can switch.
    pub user: Option<SpecUser>,
    /// The rlimits.
    pub rlimits: Rlimits,
    /// Landlock.
    pub landlock: SpecRequirement,
    /// The least landlock ABI `landlock: required` accepts.
    pub landlock_min_abi: u32,
    /// User, mount, ipc, pid and (with network none) network namespaces.
    /// `off` enters none: network none then rests on landlock's TCP rules.
    pub namespaces: SpecRequirement,
    /// CMD's whole environment (already scrubbed by the backend).
    pub env: Vec<(String, String)>,
    /// box's seccomp filter (`sandbox::seccomp_program`).
    #[serde(default = "best_effort")]
    pub seccomp: SpecRequirement,
    /// Host files and directories only root may read (`/etc/shadow`, private
    /// keys): covered, for a unit that is the host's uid 0, by `/dev/null` or
    /// an empty read-only tmpfs.
    #[serde(default)]
    pub conceal: Vec<PathBuf>,
    /// Namespaces the unit shares with the host (`user`, `mount`, `ipc`,
    /// `net`, `pid`): the operator allowed it, so none of its own is made.
    #[serde(default)]
    pub share: Vec<String>,
    /// Network `egress`: the unit's network is still `none` (a namespace of
    /// its own with only `lo`, required), and the host's egress proxy is
    /// reached through its socket, whose directory is bound back read-only.
    #[serde(default)]
    pub egress: Option<SpecEgress>,
    /// Where the unit's secrets are delivered: a tmpfs of the unit's own,
    /// mounted in its mount namespace (required) over a hidden directory.
    #[serde(default)]
    pub secrets_dir: Option<PathBuf>,
    /// The secrets' carriers (`BOX_SECRET_NAME`, value), put in the
    /// environment of box's own executor only (never of another command, and
    /// never in an `execve`): it writes them to `secrets_dir`.
    #[serde(default)]
    pub secret_values: SecretValues,
    /// The unit's init side (box-init's supervisor, run by the helper outside
    /// the unit's confinement): its lease and the channel to its host.
    /// Absent for a `box sandbox` run by hand (no host to renew it; CMD's
    /// stdio is then the helper's own).
    #[serde(default)]
    pub init: Option<SpecInit>,
    /// A worktree fork's borrowed git objects (the parent repository's
    /// objects directory): kept in sight at its host path, which the child's
    /// alternates name, and bound read-only there. Needs the unit's own mount
    /// namespace (refused without: the host's directory would be writable
    /// wherever landlock is not enforced).
    #[serde(default)]
    pub objects: Option<PathBuf>,
    /// The unit's own `/tmp`: a tmpfs of this size in its mount namespace
    /// (kept paths beneath the host's `/tmp` bound back into it), writable
    /// by every user of the unit (mode 1777), where `TMPDIR` then points.
    /// Without a mount namespace the unit keeps `TMPDIR` as given (its
    /// private directory on the host) and the host's `/tmp` stays
    /// unwritable.
    #[serde(default)]
    pub tmp: Option<SpecTmp>,
    /// The unit's home (`HOME`, a directory of the unit's private temp):
    /// with a mount namespace, a tmpfs of this size mounted over it, so it is
    /// bounded and never on the host's disk; then filled from `skel`, as a
    /// new user's home is.
    #[serde(default)]
    pub home: Option<SpecHome>,
    /// The unit's volumes (`[[volume]]`): each one's directory on the host
    /// mounted at its place in the unit's own mount namespace (without one,
    /// a place beneath the home becomes a link to it), its lock held shared
    /// by the helper for the unit's whole life.
    #[serde(default)]
    pub volumes: Vec<SpecVolume>,
}

/// A volume of the unit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SpecVolume {
    /// Its name in the profile (for messages and the envelope).
    pub name: String,
    /// `session` or `profile` (for the envelope).
    pub scope: String,
    /// For `profile` scope: the profile whose sessions share it (for the
    /// envelope).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_with: Option<String>,
    /// Its content's directory on the host (the store's `data`).
    pub data: PathBuf,
    /// The file held locked shared while the unit lives, so `box volumes rm`
    /// (which takes it exclusive) never pulls it from under the unit.
    pub lock: PathBuf,
    /// Where the unit sees it.
    pub target: PathBuf,
}

/// A volume as the helper made it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AppliedVolumeReport {
    /// Its name.
    pub name: String,
    /// A link to its directory on the host (no mount namespace of the
    /// unit's own), not a mount.
    pub linked: bool,
}

/// The unit's home.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SpecHome {
    /// Where it is (seen at the same path in the unit).
    pub path: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
    /// What a new home holds (`/etc/skel`), copied in; absent: nothing.
    pub skel: Option<PathBuf>,
}

/// The unit's home as made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AppliedHomeReport {
    /// The tmpfs's size, where one was mounted (a mount namespace of the
    /// unit's own); `None`: a directory on the host's disk.
    pub bytes: Option<u64>,
    /// The directory it was filled from, if any was copied.
    pub seeded_from: Option<PathBuf>,
}

/// The unit's own `/tmp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SpecTmp {
    /// Its size in bytes.
    pub bytes: u64,
    /// Whether programs written there may run (`nosuid` and `nodev` always).
    pub exec: bool,
}

impl SandboxSpec {
    /// This spec without what must not rest in a file: the unit's
    /// environment, the secrets' values and the unit key (what a run
    /// directory's record keeps to rebuild the envelope).
    pub(crate) fn kept(&self) -> Self {
        let mut kept = self.clone();
        kept.env.clear();
        kept.secret_values = SecretValues::default();
        kept.init = None;
        kept
    }
}

/// How the helper reaches its host: box-init's protocol over the socket in
/// the unit's run directory, which a later host binds again to re-adopt it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SpecInit {
    /// The unit's run directory on the host (the host listens on
    /// `host.sock` in it). Opened before any namespace and reached through
    /// that handle only: the unit never sees it.
    pub run_dir: PathBuf,
    /// The unit's identity in the proofs (`instance/session/unit`).
    pub unit: String,
    /// The unit key, hex (it travels on the helper's private stdin only).
    pub key: String,
    /// The first lease in milliseconds: the unit ends this long after the
    /// last renewal.
    pub ttl_ms: u64,
}

impl std::fmt::Debug for SpecInit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpecInit")
            .field("run_dir", &self.run_dir)
            .field("unit", &self.unit)
            .field("ttl_ms", &self.ttl_ms)
            .finish_non_exhaustive()
    }
}

/// How an egress unit reaches the host's proxy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SpecEgress {
    /// The host directory holding the proxy's socket (seen at the same path).
    pub socket_dir: PathBuf,
    /// The loopback port the executor bridges to it: the only TCP port
    /// landlock lets the unit bind or connect to.
    pub port: u16,
}

/// Secret values, which `Debug` never shows.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SecretValues(pub Vec<(String, String)>);

impl std::fmt::Debug for SecretValues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(name, _)| name))
            .finish()
    }
}

pub(super) fn best_effort() -> SpecRequirement {
    SpecRequirement::BestEffort
}

/// What the helper applied, read back from the kernel where it can be.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Applied {
    /// Namespaces entered (`user`, `mount`, `ipc`, `net`, `pid`).
    pub namespaces: Vec<String>,
    /// Why a namespace was not entered, per namespace.
    pub namespace_failures: Vec<String>,
    /// The host uid CMD runs as (0 means RLIMIT_NPROC does not bind).
    pub host_uid: u32,
    /// The uid CMD sees.
    pub uid: u32,
    /// The gid CMD sees.
    pub gid: u32,
    /// Whether `/proc` is the unit's own (pid namespace and mount namespace).
    pub proc_mounted: bool,
    /// Whether `/sys` is the unit's own (showing its network namespace).
    pub sys_mounted: bool,
    /// Top-level host directories replaced by an empty tmpfs in the unit
    /// (the unit's own paths beneath them bound back in).
    pub hidden: Vec<String>,
    /// Top-level host directories that refused the tmpfs, with why.
    pub unhidden: Vec<String>,
    /// Root-only host files and directories covered (only for a unit that is
    /// the host's uid 0, which file permissions would let read them).
    pub concealed: usize,
    /// The unit has a pseudo-terminal file system of its own; without one it
    /// gets no pseudo-terminals at all (the host's would be its terminals).
    pub own_ptys: bool,
    /// Whether the unit can create no user namespace of its own.
    pub nested_user_namespaces_blocked: bool,
    /// Loopback was brought up in the unit's network namespace.
    pub loopback_up: bool,
    /// Landlock denies every TCP bind and connect (network none without a namespace).
    pub landlock_tcp_denied: bool,
    /// Landlock.
    pub landlock: LandlockOutcome,
    /// no_new_privs as the kernel reports it.
    pub no_new_privs: bool,
    /// The capability sets after dropping.
    pub capabilities: CapabilitySets,
    /// box's seccomp filter is installed.
    pub seccomp: bool,
    /// The filter refuses every IP socket (network none without a namespace).
    pub ip_sockets_denied: bool,
    /// Landlock limits TCP bind and connect to these ports (an egress unit's
    /// bridge); empty when TCP is not limited that way.
    #[serde(default)]
    pub landlock_tcp_ports: Vec<u16>,
    /// The egress proxy's socket directory is bound into the unit read-only.
    #[serde(default)]
    pub egress_bound: bool,
    /// A worktree fork's borrowed git objects are bound into the unit
    /// read-only (`objects`).
    #[serde(default)]
    pub objects_bound: bool,
    /// The secrets tmpfs is mounted (`secrets_dir`).
    #[serde(default)]
    pub secrets_mounted: bool,
    /// The unit's own `/tmp` is mounted (`tmp`): its size in bytes and
    /// whether it is executable.
    #[serde(default)]
    pub tmp: Option<SpecTmp>,
    /// The unit's home (`home`), as made.
    #[serde(default)]
    pub home: Option<AppliedHomeReport>,
    /// The unit's volumes, as made (each of `volumes`, or the unit did not start).
    #[serde(default)]
    pub volumes: Vec<AppliedVolumeReport>,
    /// The lease the helper holds on the unit, in milliseconds.
    #[serde(default)]
    pub lease_ms: Option<u64>,
    /// The rlimits as read back (soft values).
    pub rlimits: Rlimits,
}

/// The one line the helper reports before CMD runs (or instead of running it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "camelCase")]
pub enum Report {
    /// Confined; CMD is being executed.
    Confined(Box<Applied>),
    /// A required control could not be applied; CMD did not run.
    Refused {
        /// The control.
        control: String,
        /// Why.
        why: String,
    },
    /// Something failed; CMD did not run (or could not be executed).
    Failed {
        /// What was being done.
        doing: String,
        /// What went wrong.
        message: String,
    },
}

impl From<ConfineError> for Report {
    fn from(error: ConfineError) -> Self {
        match error {
            ConfineError::Unenforceable { control, why } => Self::Refused { control, why },
            ConfineError::Failed { doing, message } => Self::Failed { doing, message },
        }
    }
}

/// Where the report goes (a close-on-exec duplicate of stdout or stderr).
pub(super) struct Reporter {
    pub(super) out: Option<File>,
}

impl Reporter {
    pub(super) fn send(&mut self, report: &Report) {
        if let (Some(out), Ok(mut line)) = (self.out.as_mut(), serde_json::to_vec(report)) {
            line.push(b'\n');
            // Nothing to do if the backend stopped listening.
            let _ = out.write_all(&line);
        }
    }

    /// Let go of the duplicate, so it cannot hold CMD's stdout open.
    pub(super) fn close(&mut self) {
        self.out = None;
    }
}

/// The largest spec read from stdin.
pub(super) const MAX_SPEC_BYTES: usize = 1 << 20;

pub(super) fn read_spec(args: &SandboxArgs) -> Result<SandboxSpec, String> {
    let text = match (&args.spec, args.spec_stdin) {
        (Some(text), _) => text.clone().into_bytes(),
        (None, true) => read_spec_from_stdin()?,
        (None, false) => return Err("give --spec JSON or --spec-stdin".to_owned()),
    };
    serde_json::from_slice(&text).map_err(|error| error.to_string())
}

/// Read `LENGTH\n` then exactly LENGTH bytes from fd 0, unbuffered: what
/// follows belongs to CMD.
pub(super) fn read_spec_from_stdin() -> Result<Vec<u8>, String> {
    use std::os::fd::AsFd;
    // A duplicate of fd 0 (same open pipe, same position), read without a
    // buffer; dropping it leaves fd 0 open for CMD.
    let mut stdin = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .map(File::from)
        .map_err(|error| format!("stdin: {error}"))?;
    let mut header = Vec::new();
    loop {
        let mut byte = [0u8; 1];
        stdin
            .read_exact(&mut byte)
            .map_err(|error| format!("stdin: {error}"))?;
        if byte[0] == b'\n' {
            break;
        }
        header.push(byte[0]);
        if header.len() > 20 {
            return Err("stdin: the length line is too long".to_owned());
        }
    }
    let length: usize = std::str::from_utf8(&header)
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .filter(|length| *length <= MAX_SPEC_BYTES)
        .ok_or_else(|| {
            format!(
                "stdin: bad spec length {:?}",
                String::from_utf8_lossy(&header)
            )
        })?;
    let mut text = vec![0u8; length];
    stdin
        .read_exact(&mut text)
        .map_err(|error| format!("stdin: {error}"))?;
    Ok(text)
}
