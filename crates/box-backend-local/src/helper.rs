//! The sandbox helper: `box sandbox --spec-stdin --report-stdout [--parent
//! PID] -- CMD…`, run as the local backend's child. It confines itself, then
//! `execve`s CMD (the executor, or a probe in tests), in this order:
//!
//! 1. switch to the unit's user (only when started as root and asked to);
//! 2. new user (uid and gid mapped to themselves; no user namespaces below
//!    it), mount, ipc, network and pid namespaces, each where the kernel
//!    allows. In the mount namespace (private propagation): an empty tmpfs
//!    over every host directory the unit has no business in, its own paths
//!    bound back ([`hide_host`]); for a unit that is the host's uid 0, the
//!    host's root-only system files covered ([`conceal`]); a devpts of its
//!    own. In the network namespace: only loopback, brought up, and a `/sys`
//!    that shows it;
//! 3. with a pid namespace, fork a minimal init (pid 1: a new session, a
//!    fresh `/proc` with Docker's masked kernel files masked, reaps orphans,
//!    ends the namespace when CMD ends); a host's unit (`init` in the spec)
//!    gets that init without a pid namespace too (the unit's subreaper);
//! 4. in the init (else, for a unit run by hand without a pid namespace, in
//!    the helper itself, which then stays as the unit's supervisor and
//!    subreaper): rlimits, no_new_privs, landlock, capabilities dropped,
//!    box's seccomp filter, all inherited by CMD;
//! 5. report what was applied, read back from the kernel, as one JSON line,
//!    then fork CMD (in a new session, no controlling terminal) and `execve`
//!    it; when CMD is this binary's own `box execute`, the forked child runs
//!    the executor itself instead of executing the same binary again
//!    ([`run_executor_here`]: same confinement, one exec fewer per start).
//!
//! The wire with the backend: the spec arrives first on stdin (`LENGTH\n`
//! then the JSON, read without buffering past it), the report leaves first
//! on stdout (one line). For a host's unit (`init` in the spec) the helper
//! then lets go of both and runs box-init's supervisor
//! (`box_init::supervise`) over the init, whose stdin and stdout are pipes
//! to the helper: the lease, the relay of CMD's stdio to the host's socket
//! in the unit's run directory (reconnecting while no host is there), the
//! unit's end on a lapse. Run by hand, both stay CMD's own, and the helper
//! and the init let go of them once CMD has them, so the caller sees CMD's
//! end of them as soon as CMD ends; the helper then ends the way CMD did
//! (same exit code, or killed by the same signal, which the init passes
//! back through a pipe). No extra fds are passed either way, so the host
//! spawns the helper without `pre_exec`.
//!
//! A control the spec requires that cannot be applied is reported as
//! `refused` (naming it), CMD never runs, and the helper exits 125.
//!
//! The helper runs single-threaded, so forking and then running ordinary Rust
//! in the child is sound.

use std::ffi::{CString, OsString};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use nix::sched::CloneFlags;
use nix::sys::prctl;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use box_confine::{self as sandbox, CapabilitySets, ConfineError, LandlockOutcome, Rlimits};
use box_policy::executor::ExecutorSpec;
use box_policy::plan::Requirement;

/// The helper's exit code when it refuses or fails before CMD runs (as `env`
/// and `docker run` use 125 for their own failures).
pub const REFUSED_EXIT: u8 = 125;

/// `box sandbox` (hidden): confine this process, then run CMD. The binary's
/// clap command fills it.
#[derive(Debug, Clone)]
pub struct SandboxArgs {
    /// The sandbox spec as JSON (for people and tests).
    pub spec: Option<String>,
    /// Read the spec from stdin before anything else: its length in bytes on
    /// one line, then exactly that much JSON (never a byte more: the rest of
    /// stdin is CMD's).
    pub spec_stdin: bool,
    /// Write the report (one JSON line) to stdout, before CMD writes anything
    /// there; default stderr.
    pub report_stdout: bool,
    /// Die with this process (the host): set the parent-death signal, and
    /// exit at once if the parent is already another.
    pub parent: Option<u32>,
    /// The command to confine and run.
    pub command: Vec<OsString>,
}

/// Runs an executor in this process: the binary hands the helper its
/// `box execute`, so this crate never depends on the executor's.
pub type ExecutorEntry = fn(ExecutorSpec) -> anyhow::Result<ExitCode>;

/// The executor entry of this helper process, set once by [`run`]. A global
/// because the helper is single-threaded and forks on the way to the point
/// that uses it; threading it through every step would say nothing more.
static EXECUTOR: std::sync::OnceLock<ExecutorEntry> = std::sync::OnceLock::new();

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

/// The init side, ready before any namespace: the spec, the key, and a
/// handle on the run directory.
struct InitHold {
    spec: SpecInit,
    key: box_init::protocol::UnitKey,
    dir: OwnedFd,
}

impl InitHold {
    fn open(spec: &SpecInit) -> Result<Self, String> {
        use std::os::unix::fs::OpenOptionsExt;
        let key = box_init::protocol::UnitKey::from_hex(&spec.key)
            .map_err(|error| format!("the unit key: {error}"))?;
        let dir = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(&spec.run_dir)
            .map_err(|error| format!("opening {}: {error}", spec.run_dir.display()))?;
        Ok(Self {
            spec: spec.clone(),
            key,
            dir: OwnedFd::from(dir),
        })
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

fn best_effort() -> SpecRequirement {
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
struct Reporter {
    out: Option<File>,
}

impl Reporter {
    fn send(&mut self, report: &Report) {
        if let (Some(out), Ok(mut line)) = (self.out.as_mut(), serde_json::to_vec(report)) {
            line.push(b'\n');
            // Nothing to do if the backend stopped listening.
            let _ = out.write_all(&line);
        }
    }

    /// Let go of the duplicate, so it cannot hold CMD's stdout open.
    fn close(&mut self) {
        self.out = None;
    }
}

/// Run `box sandbox`: confine, then execute CMD. Returns only when CMD could
/// not be started, or once it has ended (the helper stays as the unit's
/// supervisor outside the pid namespace, or as its subreaper without one).
pub fn run(args: SandboxArgs, executor: ExecutorEntry) -> anyhow::Result<ExitCode> {
    let _ = EXECUTOR.set(executor);
    use std::os::fd::AsFd;
    close_inherited_fds();
    if let Some(parent) = args.parent {
        // The "parent" is the host thread that spawned us, which lives until
        // we have ended. SIGTERM, not SIGKILL: without a pid namespace the
        // helper stays as the unit's supervisor and must get to kill the unit
        // first.
        let _ = prctl::set_pdeathsig(Signal::SIGTERM);
        if nix::unistd::getppid().as_raw() != i32::try_from(parent).unwrap_or(0) {
            anyhow::bail!("the host (pid {parent}) is gone");
        }
    }
    // A close-on-exec duplicate: CMD inherits stdout itself, never this.
    let out = if args.report_stdout {
        std::io::stdout().as_fd().try_clone_to_owned()?
    } else {
        std::io::stderr().as_fd().try_clone_to_owned()?
    };
    let mut reporter = Reporter {
        out: Some(File::from(out)),
    };
    let spec = match read_spec(&args) {
        Ok(spec) => spec,
        Err(message) => {
            reporter.send(&Report::Failed {
                doing: "reading the sandbox spec".to_owned(),
                message: message.clone(),
            });
            anyhow::bail!("reading the sandbox spec: {message}");
        }
    };
    // Before any namespace: the run directory is hidden in the unit's mount
    // namespace, and this handle is the helper's, never the unit's.
    let init = match spec.init.as_ref().map(InitHold::open).transpose() {
        Ok(init) => init,
        Err(message) => {
            let report = failed("opening the unit's run directory", message);
            return Ok(refuse(&spec, &report, &mut reporter));
        }
    };
    let parent = args.parent.and_then(|pid| i32::try_from(pid).ok());
    match sandbox(&spec, &args.command, parent, &mut reporter, init) {
        Ok(code) => Ok(code),
        Err(report) => Ok(refuse(&spec, &report, &mut reporter)),
    }
}

/// Send `report`, say it on stderr (the host's log), and give the exit code
/// of a helper that did not run CMD.
fn refuse(spec: &SandboxSpec, report: &Report, reporter: &mut Reporter) -> ExitCode {
    reporter.send(report);
    match report {
        Report::Refused { control, why } => eprintln!(
            "box sandbox: unit {}: {control} is required but cannot be applied here: {why}",
            spec.unit
        ),
        Report::Failed { doing, message } => {
            eprintln!("box sandbox: unit {}: {doing}: {message}", spec.unit);
        }
        Report::Confined(_) => {}
    }
    ExitCode::from(REFUSED_EXIT)
}

/// The largest spec read from stdin.
const MAX_SPEC_BYTES: usize = 1 << 20;

fn read_spec(args: &SandboxArgs) -> Result<SandboxSpec, String> {
    let text = match (&args.spec, args.spec_stdin) {
        (Some(text), _) => text.clone().into_bytes(),
        (None, true) => read_spec_from_stdin()?,
        (None, false) => return Err("give --spec JSON or --spec-stdin".to_owned()),
    };
    serde_json::from_slice(&text).map_err(|error| error.to_string())
}

/// Read `LENGTH\n` then exactly LENGTH bytes from fd 0, unbuffered: what
/// follows belongs to CMD.
fn read_spec_from_stdin() -> Result<Vec<u8>, String> {
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

/// Mark every fd above stderr close-on-exec: whatever the host inherited
/// without the flag (from a CI runner, a shell) must not reach the unit.
fn close_inherited_fds() {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: close_range (which nix does not wrap) with integer arguments;
    // with CLOSE_RANGE_CLOEXEC it only sets a flag on fds of this process.
    let result = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        )
    };
    if result == 0 {
        return;
    }
    // Kernels before 5.11: one by one.
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<i32> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd > 2)
        .collect();
    for fd in fds {
        // SAFETY: F_SETFD on an fd number of this process; a stale number
        // (the directory's own) fails harmlessly. (nix's fcntl takes a
        // BorrowedFd, which a bare number only becomes unsafely too.)
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
}

/// Let go of CMD's stdin and stdout, so the host sees CMD's end of them
/// (EOF, EPIPE) as soon as CMD is gone, whatever this process still does.
fn release_stdio() {
    // Fds 0 and 1, which this process no longer uses; nothing is opened
    // afterwards that could take their numbers and be mistaken for them.
    let _ = nix::unistd::close(0);
    let _ = nix::unistd::close(1);
}

fn refused(control: &str, why: impl std::fmt::Display) -> Report {
    Report::Refused {
        control: control.to_owned(),
        why: why.to_string(),
    }
}

fn failed(doing: impl Into<String>, message: impl std::fmt::Display) -> Report {
    Report::Failed {
        doing: doing.into(),
        message: message.to_string(),
    }
}

/// Steps 1–3 (the process-wide parts); steps 4 and 5 in [`init`] or [`supervise`].
fn sandbox(
    spec: &SandboxSpec,
    command: &[OsString],
    parent: Option<i32>,
    reporter: &mut Reporter,
    init_side: Option<InitHold>,
) -> Result<ExitCode, Report> {
    use nix::unistd::{Gid, Uid, getegid, geteuid};
    let program = resolve_program(command, &spec.env, &spec.cwd)?;
    // With the host's network, name resolution must keep working where
    // /etc/resolv.conf is a link into /run (systemd-resolved): keep its target
    // readable and in sight.
    let mut with_resolver;
    let spec = match resolver_target(spec.network) {
        Some(target) => {
            with_resolver = spec.clone();
            with_resolver.read.push(target);
            &with_resolver
        }
        None => spec,
    };
    // The volumes' locks, held shared by the helper for the unit's whole
    // life; opened before the user changes (they are box's, 0600), never
    // inherited by the unit (close-on-exec, and dropped in its processes).
    let volume_locks = spec
        .volumes
        .iter()
        .map(|volume| {
            box_backend::volumes::hold_shared(&volume.lock).map_err(|error| {
                failed(
                    format!(
                        "holding volume {}'s lock ({})",
                        volume.name,
                        volume.lock.display()
                    ),
                    error,
                )
            })
        })
        .collect::<Result<Vec<_>, Report>>()?;
    // As root, each volume's directory is taken now, while it can be
    // reached (box's private directories; the unit's user may not pass
    // them): a detached copy of its mount, attached later in the unit's
    // own mount namespace. Otherwise it is taken in that namespace.
    let mut volume_trees: Vec<Option<VolumeSource>> = if geteuid().is_root() {
        spec.volumes
            .iter()
            .map(|volume| clone_tree(&volume.data).ok().map(VolumeSource::Tree))
            .collect()
    } else {
        spec.volumes.iter().map(|_| None).collect()
    };
    // 1. The user. Only root can become someone else.
    if let Some(user) = spec.user
        && (user.uid != geteuid().as_raw() || user.gid != getegid().as_raw())
    {
        if !geteuid().is_root() {
            return Err(refused(
                "user",
                format!(
                    "asked for {}:{}, but the local backend runs units as its caller ({}:{}) unless started as root",
                    user.uid,
                    user.gid,
                    geteuid(),
                    getegid()
                ),
            ));
        }
        let gid = Gid::from_raw(user.gid);
        let uid = Uid::from_raw(user.uid);
        nix::unistd::setgroups(&[gid]).map_err(|errno| refused("user", errno))?;
        nix::unistd::setresgid(gid, gid, gid).map_err(|errno| refused("user", errno))?;
        nix::unistd::setresuid(uid, uid, uid).map_err(|errno| refused("user", errno))?;
        // Changing uid clears "dumpable", which makes /proc/self root's; the
        // uid map below must be writable by us.
        let _ = prctl::set_dumpable(true);
        // The uid change also cleared the parent-death signal: set it again,
        // and make sure the host did not go in between.
        if let Some(parent) = parent {
            let _ = prctl::set_pdeathsig(Signal::SIGTERM);
            if nix::unistd::getppid().as_raw() != parent {
                return Err(failed("switching user", "the host is gone"));
            }
        }
    }
    let host_uid = geteuid().as_raw();
    let host_gid = getegid().as_raw();

    // 2. Namespaces.
    let mut entered = Vec::new();
    let mut failures = Vec::new();
    let mut loopback_up = false;
    let wants_namespaces = spec.namespaces != SpecRequirement::Off;
    let shared = |name: &str| spec.share.iter().any(|entry| entry == name);
    let mut try_enter = |name: &str, flags: CloneFlags, wanted: bool| -> bool {
        if !wanted || shared(name) {
            return false;
        }
        match nix::sched::unshare(flags) {
            Ok(()) => {
                entered.push(name.to_owned());
                true
            }
            Err(errno) => {
                failures.push(format!("{name}: unshare: {errno}"));
                false
            }
        }
    };
    let mut nested_user_namespaces_blocked = false;
    if try_enter("user", CloneFlags::CLONE_NEWUSER, wants_namespaces) {
        map_ids(host_uid, host_gid)
            .map_err(|error| failed("mapping the unit's uid and gid", error))?;
        // The limit is per user namespace: 0 in ours means nothing in the unit
        // can create a user namespace of its own, and with it the capabilities
        // to mount or unshare anything else (C28), as bubblewrap's
        // --disable-userns does.
        nested_user_namespaces_blocked =
            std::fs::write("/proc/sys/user/max_user_namespaces", "0").is_ok();
    }
    let mount_namespace = try_enter("mount", CloneFlags::CLONE_NEWNS, wants_namespaces);
    if mount_namespace {
        // Private propagation: no mount crosses between the unit and the host, either way (C39).
        nix::mount::mount(
            None::<&str>,
            "/",
            None::<&str>,
            nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE,
            None::<&str>,
        )
        .map_err(|errno| failed("making / private in the unit's mount namespace", errno))?;
    }
    let mut hidden = Vec::new();
    let mut unhidden = Vec::new();
    let mut concealed = 0;
    let mut own_ptys = false;
    let mut egress_bound = false;
    let mut objects_bound = false;
    let mut secrets_mounted = false;
    let mut tmp_mounted = false;
    if mount_namespace {
        let mut keep: Vec<PathBuf> = spec.write.iter().chain(&spec.read).cloned().collect();
        keep.push(spec.cwd.clone());
        keep.push(PathBuf::from(std::ffi::OsStr::from_bytes(
            program.as_bytes(),
        )));
        if let Some(egress) = &spec.egress {
            keep.push(egress.socket_dir.clone());
        }
        keep.extend(spec.objects.iter().cloned());
        // In the unit's own mount namespace, before the host's directories
        // are hidden: each volume's directory not taken yet.
        for (tree, volume) in volume_trees.iter_mut().zip(&spec.volumes) {
            if tree.is_none() {
                *tree = Some(VolumeSource::take(&volume.data).map_err(|error| {
                    failed(
                        format!(
                            "taking volume {}'s directory ({})",
                            volume.name,
                            volume.data.display()
                        ),
                        error,
                    )
                })?);
            }
        }
        (hidden, unhidden, tmp_mounted) = hide_host(&keep, spec.tmp)
            .map_err(|error| failed("hiding the host's directories", error))?;
        if let Some(egress) = &spec.egress {
            bind_read_only(&egress.socket_dir)
                .map_err(|error| failed("binding the egress proxy's socket read-only", error))?;
            egress_bound = true;
        }
        if let Some(objects) = &spec.objects {
            bind_read_only(objects).map_err(|error| {
                failed(
                    format!(
                        "binding the parent's git objects ({}) read-only",
                        objects.display()
                    ),
                    error,
                )
            })?;
            objects_bound = true;
        }
        if let Some(dir) = &spec.secrets_dir {
            secrets_mounted = mount_secrets(dir, &hidden)?;
        }
        if host_uid == 0 {
            concealed = conceal(&spec.conceal)
                .map_err(|error| failed("hiding the host's root-only files", error))?;
        }
        own_ptys = mount_own_ptys();
    }
    // The unit's home: bounded in its own mount namespace, then filled as a
    // new user's home is (the helper is the unit's user by now).
    let home = match &spec.home {
        Some(home) => Some(make_home(home, mount_namespace)?),
        None => None,
    };
    // The volumes, once the home they may lie beneath is made.
    let volumes = attach_volumes(spec, volume_trees, mount_namespace, &hidden)?;
    let with_links;
    let spec = if volumes.iter().any(|volume| volume.linked) {
        // A link leads to the volume's directory on the host: landlock
        // lets the unit write there.
        let mut changed = spec.clone();
        for (made, volume) in volumes.iter().zip(&spec.volumes) {
            if made.linked {
                changed.write.push(volume.data.clone());
            }
        }
        with_links = changed;
        &with_links
    } else {
        spec
    };
    // The unit's own /tmp: its tools' temporary files go there (TMPDIR), and
    // landlock lets them write it; the host's /tmp is never written.
    let with_tmp;
    let spec = if tmp_mounted {
        let mut changed = spec.clone();
        changed.env.retain(|(name, _)| name != "TMPDIR");
        changed.env.push(("TMPDIR".to_owned(), "/tmp".to_owned()));
        changed.write.push(PathBuf::from("/tmp"));
        with_tmp = changed;
        &with_tmp
    } else {
        spec
    };
    try_enter("ipc", CloneFlags::CLONE_NEWIPC, wants_namespaces);
    let isolated = spec.network == SpecNetwork::None;
    let mut sys_mounted = false;
    if try_enter(
        "net",
        CloneFlags::CLONE_NEWNET,
        isolated && wants_namespaces,
    ) {
        bring_up_loopback().map_err(|error| failed("bringing up loopback", error))?;
        loopback_up = true;
        // The host's /sys shows the host's interfaces; a sysfs mounted from
        // the new namespace shows only loopback. Refused inside some
        // containers; then /sys stays the host's (read-only under landlock).
        if mount_namespace {
            use nix::mount::MsFlags;
            sys_mounted = nix::mount::mount(
                Some("sysfs"),
                "/sys",
                Some("sysfs"),
                MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                None::<&str>,
            )
            .is_ok();
        }
    }
    let pid_namespace = try_enter("pid", CloneFlags::CLONE_NEWPID, wants_namespaces);
    // An egress unit's only boundary is its network namespace: on the host's
    // network, landlock's port rule would leave every host's port 3128 and
    // all of UDP open, so it is never run without one.
    if spec.egress.is_some() && !entered.iter().any(|name| name == "net") {
        let why = if shared("net") {
            "the unit shares the host's network namespace".to_owned()
        } else {
            format!(
                "no network namespace of its own could be made ({})",
                failures.join("; ")
            )
        };
        return Err(refused("network egress", why));
    }
    if spec.objects.is_some() && !objects_bound {
        return Err(refused(
            crate::BORROWED_OBJECTS,
            format!(
                "no mount namespace of its own, so they could not be bound read-only ({})",
                if shared("mount") {
                    "the unit shares the host's mount namespace".to_owned()
                } else {
                    failures.join("; ")
                }
            ),
        ));
    }
    if spec.secrets_dir.is_some() && !secrets_mounted {
        return Err(refused(
            "env.secrets",
            format!(
                "no mount namespace of its own, so no private tmpfs for the secrets ({})",
                failures.join("; ")
            ),
        ));
    }
    if mount_namespace && !pid_namespace {
        // With a pid namespace the init masks them over its own /proc.
        conceal(&kernel_paths(sys_mounted))
            .map_err(|error| failed("masking kernel files", error))?;
    }
    if spec.namespaces == SpecRequirement::Required
        && let Some(failure) = failures.first()
    {
        return Err(refused("namespaces", failure));
    }
    // Without a network namespace, network none falls back to landlock's TCP rules.
    let deny_tcp = isolated && !shared("net") && !entered.iter().any(|name| name == "net");
    if deny_tcp && (spec.landlock == SpecRequirement::Off || sandbox::landlock_abi() < 4) {
        return Err(refused(
            "network none",
            format!(
                "no network namespace ({}) and no landlock TCP restriction (needs landlock ABI 4, the kernel offers {})",
                failures.join("; "),
                sandbox::landlock_abi()
            ),
        ));
    }
    let mut applied = Applied {
        namespaces: entered,
        namespace_failures: failures,
        host_uid,
        uid: host_uid,
        gid: host_gid,
        proc_mounted: false,
        sys_mounted,
        hidden,
        unhidden,
        concealed,
        own_ptys,
        nested_user_namespaces_blocked,
        loopback_up,
        landlock_tcp_denied: false,
        landlock: LandlockOutcome {
            abi: 0,
            fully_enforced: false,
            enforced: false,
        },
        no_new_privs: false,
        capabilities: CapabilitySets::default(),
        seccomp: false,
        ip_sockets_denied: false,
        landlock_tcp_ports: Vec::new(),
        egress_bound,
        objects_bound,
        secrets_mounted,
        tmp: spec.tmp.filter(|_| tmp_mounted),
        home,
        volumes,
        lease_ms: init_side.as_ref().map(|init| init.spec.ttl_ms),
        rlimits: spec.rlimits,
    };
    // Nothing above can leak a core; nothing below should either.
    let _ = nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_CORE, 0, 0);

    let Some(init_side) = init_side else {
        if !pid_namespace {
            // The helper itself stays as the unit's supervisor, holding the
            // volumes' locks until it ends.
            let _held = volume_locks;
            return supervise(spec, &program, command, &mut applied, deny_tcp, reporter);
        }
        // 3. The pid namespace takes effect for our children: fork its init.
        // The init tells us through this pipe which signal killed CMD, if one
        // did (pid 1 cannot die of a signal it raises itself).
        let (signal_read, signal_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|errno| failed("making the init's status pipe", errno))?;
        // SAFETY: the helper is single-threaded, so the child may run any code.
        return match unsafe { libc::fork() } {
            -1 => Err(failed(
                "forking the unit's init",
                std::io::Error::last_os_error(),
            )),
            0 => {
                drop(signal_read);
                let_go_in_child(volume_locks);
                let code = init(
                    spec,
                    &program,
                    command,
                    &mut applied,
                    deny_tcp,
                    reporter,
                    Some(signal_write),
                );
                std::process::exit(code)
            }
            child => {
                drop(signal_write);
                reporter.close();
                release_stdio();
                let _held = volume_locks;
                Ok(wait_for_init(child, File::from(signal_read)))
            }
        };
    };
    // 3'. A host's unit: the init (pid 1 of the pid namespace, or without
    // one the unit's subreaper) gets CMD's stdio as pipes to this helper,
    // which holds the lease and relays them to the host's socket with
    // box-init's supervisor, so the unit outlives its host by its lease and
    // a later host can re-adopt it.
    let cloexec = nix::fcntl::OFlag::O_CLOEXEC;
    let (stdin_read, stdin_write) =
        nix::unistd::pipe2(cloexec).map_err(|errno| failed("making the unit's stdin", errno))?;
    let (stdout_read, stdout_write) =
        nix::unistd::pipe2(cloexec).map_err(|errno| failed("making the unit's stdout", errno))?;
    // SAFETY: the helper is single-threaded, so the child may run any code.
    match unsafe { libc::fork() } {
        -1 => Err(failed(
            "forking the unit's init",
            std::io::Error::last_os_error(),
        )),
        0 => {
            // The run directory, the key and the volumes' locks are the
            // helper's, never the unit's.
            drop(init_side);
            let_go_in_child(volume_locks);
            use std::os::fd::AsRawFd;
            // SAFETY: dup2 onto fds 0 and 1, which the pipes' ends replace
            // (dup2 leaves the copies without close-on-exec).
            let duplicated = unsafe {
                libc::dup2(stdin_read.as_raw_fd(), 0) == 0
                    && libc::dup2(stdout_write.as_raw_fd(), 1) == 1
            };
            drop((stdin_read, stdin_write, stdout_read, stdout_write));
            if !duplicated {
                let error = std::io::Error::last_os_error();
                refuse(spec, &failed("wiring the unit's stdio", error), reporter);
                std::process::exit(i32::from(REFUSED_EXIT));
            }
            let code = init(
                spec,
                &program,
                command,
                &mut applied,
                deny_tcp,
                reporter,
                None,
            );
            std::process::exit(code)
        }
        child => {
            drop((stdin_read, stdout_write));
            reporter.close();
            release_stdio();
            // Held while the unit lives: the helper ends with it.
            let _held = volume_locks;
            Ok(hold_unit(child, init_side, stdin_write, stdout_read))
        }
    }
}

/// The helper of a host's unit, outside its confinement: box-init's
/// supervisor over the init (`child`), holding the lease and relaying CMD's
/// stdio to the host's socket in the run directory, reached relative to this
/// process's working directory (the run directory's handle), so no path of
/// the host need be visible in the unit's mount namespace. Ends the way
/// box-init does: the init's exit code, or [`box_init::EXIT_LEASE_LAPSED`]
/// once it ended the unit for a lapsed lease.
fn hold_unit(child: libc::pid_t, init: InitHold, stdin: OwnedFd, stdout: OwnedFd) -> ExitCode {
    use std::os::fd::AsRawFd;
    // The key is in this process's memory and the unit's processes may have
    // its uid: nothing of the unit may read it (ptrace, /proc/PID/mem).
    let _ = prctl::set_dumpable(false);
    // SAFETY: fchdir on a directory handle this process holds.
    if unsafe { libc::fchdir(init.dir.as_raw_fd()) } != 0 {
        let error = std::io::Error::last_os_error();
        eprintln!(
            "box sandbox: unit {}: entering its run directory: {error}",
            init.spec.unit
        );
        let _ = nix::sys::signal::kill(Pid::from_raw(child), Signal::SIGKILL);
        wait_pid(child);
        return ExitCode::from(REFUSED_EXIT);
    }
    drop(init.dir);
    // box-init's own log lines (a refused peer, a lapse), as JSON on the
    // unit's stderr, which the host re-emits at their level. Set here,
    // after the init was forked, so nothing of the unit inherits it.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("warn"))
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .json()
        .try_init();
    let config = box_init::InitConfig {
        socket: PathBuf::from(box_init::protocol::SOCKET_NAME),
        unit: init.spec.unit,
        lease: std::time::Duration::from_millis(init.spec.ttl_ms),
        bridges: Vec::new(),
        home: None,
        links: Vec::new(),
        executor_env: Vec::new(),
        // Started already (the forked init), never spawned by box-init.
        executor: vec![OsString::from("box-sandbox-init")],
    };
    let started = box_init::Started {
        pid: child,
        stdin,
        stdout,
    };
    let code = box_init::supervise(config, init.key, started);
    ExitCode::from(u8::try_from(code).unwrap_or(REFUSED_EXIT))
}

/// The helper outside the pid namespace of a unit run by hand: wait for the
/// init and end the way CMD ended: its exit code, or killed by its signal.
fn wait_for_init(child: libc::pid_t, mut signal_pipe: File) -> ExitCode {
    let status = wait_pid(child);
    let mut byte = [0u8; 1];
    let cmd_signal = match signal_pipe.read(&mut byte) {
        Ok(1) => Some(i32::from(byte[0])),
        _ => None,
    };
    let signal = if libc::WIFSIGNALED(status) {
        Some(libc::WTERMSIG(status))
    } else {
        cmd_signal
    };
    if let Some(signal) = signal {
        die_by(signal);
    }
    ExitCode::from(u8::try_from(libc::WEXITSTATUS(status)).unwrap_or(REFUSED_EXIT))
}

/// End this process by `signal`, its default disposition restored first.
/// A raw number, not nix's `Signal`: CMD may have died of a realtime signal,
/// which that type cannot hold.
fn die_by(signal: libc::c_int) {
    // SAFETY: restoring a default disposition (the helper installs no
    // handler that could be running) and signalling ourselves, integer
    // arguments only.
    unsafe {
        libc::signal(signal, libc::SIG_DFL);
        libc::kill(libc::getpid(), signal);
    }
}

/// `waitpid` for `pid` with `flags`: the pid it answered (-1 with errno set
/// on failure) and the raw status. Not nix's `waitpid`: its `WaitStatus`
/// cannot hold a realtime signal (it reaps such a child, then answers
/// EINVAL), and the helper passes on whatever signal CMD died of.
fn waitpid_raw(pid: libc::pid_t, flags: libc::c_int) -> (libc::pid_t, libc::c_int) {
    let mut status = 0;
    // SAFETY: waitpid writes the status into a local.
    let result = unsafe { libc::waitpid(pid, &mut status, flags) };
    (result, status)
}

fn wait_pid(pid: libc::pid_t) -> libc::c_int {
    loop {
        let (result, status) = waitpid_raw(pid, 0);
        if result == pid {
            return status;
        }
        if result == -1 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return status;
        }
    }
}

/// Pid 1 of the unit: mount its own `/proc`, confine itself (so the unit's
/// init is as confined as CMD, which inherits all of it through fork and
/// exec), report, fork CMD, reap every orphan until CMD ends, report how it
/// ended. When this process exits the kernel kills everything left in the
/// namespace, so nothing outlives the unit. SIGTERM (the helper forwarding a
/// removal) ends it at once.
///
/// Without a pid namespace (a host's unit only: a unit run by hand has the
/// helper as its supervisor, [`supervise`]) it is the unit's subreaper
/// instead, CMD cannot signal it or the helper (landlock's scope), and what
/// is left when it ends is re-parented to the helper, whose box-init
/// supervisor kills it.
///
/// Confining before the fork also means the report does not wait for CMD's
/// process to be scheduled: one process handoff fewer on the start path.
fn init(
    spec: &SandboxSpec,
    program: &CString,
    command: &[OsString],
    applied: &mut Applied,
    deny_tcp: bool,
    reporter: &mut Reporter,
    signal_pipe: Option<OwnedFd>,
) -> i32 {
    // The helper is single-threaded, so "parent thread" is the helper itself.
    let _ = prctl::set_pdeathsig(Signal::SIGKILL);
    new_session();
    let pid_namespace = applied.namespaces.iter().any(|name| name == "pid");
    if !pid_namespace && let Err(errno) = prctl::set_child_subreaper(true) {
        let report = failed("becoming the unit's subreaper", std::io::Error::from(errno));
        refuse(spec, &report, reporter);
        return i32::from(REFUSED_EXIT);
    }
    if pid_namespace && applied.namespaces.iter().any(|name| name == "mount") {
        use nix::mount::MsFlags;
        // A fresh /proc shows only the unit's processes. Refused inside some
        // containers (masked /proc paths); then the host's /proc stays, and
        // landlock still denies ptrace-class reads of processes outside.
        applied.proc_mounted = nix::mount::mount(
            Some("proc"),
            "/proc",
            Some("proc"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            None::<&str>,
        )
        .is_ok();
        if let Err(error) = conceal(&kernel_paths(applied.sys_mounted)) {
            refuse(spec, &failed("masking kernel files", error), reporter);
            return i32::from(REFUSED_EXIT);
        }
    }
    if let Err(error) = confine(spec, program, applied, deny_tcp) {
        refuse(spec, &error.into(), reporter);
        return i32::from(REFUSED_EXIT);
    }
    reporter.send(&Report::Confined(Box::new(applied.clone())));
    // SAFETY: the init is single-threaded, so the child may run any code.
    let child = unsafe { libc::fork() };
    if child == -1 {
        let error = std::io::Error::last_os_error();
        refuse(spec, &failed("forking the unit's command", error), reporter);
        return i32::from(REFUSED_EXIT);
    }
    if child == 0 {
        if !pid_namespace {
            // Nothing in the unit may signal its init or helper away.
            sandbox::scope_away_from_parent();
            let _ = prctl::set_pdeathsig(Signal::SIGKILL);
        }
        run_executor_here(program, command, &spec.env, &spec.secret_values);
        let error = exec(program, command, &spec.env);
        let report = failed(format!("executing {}", program.to_string_lossy()), error);
        refuse(spec, &report, reporter);
        // The shell's convention for a command that could not be executed.
        std::process::exit(127);
    }
    // After the fork, so CMD starts with the default disposition (the
    // executor runs in the forked child without an exec that would reset it).
    // SAFETY: installing a handler that only calls _exit, which is
    // async-signal-safe.
    unsafe {
        libc::signal(
            libc::SIGTERM,
            end_on_term as *const () as libc::sighandler_t,
        )
    };
    let mut signal_pipe = signal_pipe.map(File::from);
    reporter.close();
    release_stdio();
    let status = loop {
        let (pid, status) = waitpid_raw(-1, 0);
        if pid == child {
            break status;
        }
        if pid == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD) {
            break 0;
        }
    };
    if libc::WIFSIGNALED(status) {
        let signal = libc::WTERMSIG(status);
        if let Some(pipe) = signal_pipe.as_mut() {
            let _ = pipe.write_all(&[u8::try_from(signal).unwrap_or(0)]);
        }
        128 + signal
    } else {
        libc::WEXITSTATUS(status)
    }
}

/// The unit's init on SIGTERM: end now (with a pid namespace the kernel then
/// ends every process in it; without one the helper kills what is left).
extern "C" fn end_on_term(_: libc::c_int) {
    // SAFETY: _exit is async-signal-safe.
    unsafe { libc::_exit(128 + libc::SIGTERM) }
}

/// Steps 4 and 5 without a pid namespace. The helper confines itself,
/// reports, forks CMD and stays as the unit's supervisor: a child subreaper,
/// so every process of the unit that loses its parent becomes its child
/// whatever process group or session it moved to. When CMD ends, or the
/// helper gets SIGTERM (removal, or the host's death), it kills every such
/// child until none is left, then ends the way CMD did. Only a SIGKILL to
/// the helper itself skips that (CMD still dies with it: parent-death
/// signal), which is why removal sends SIGTERM first.
fn supervise(
    spec: &SandboxSpec,
    program: &CString,
    command: &[OsString],
    applied: &mut Applied,
    deny_tcp: bool,
    reporter: &mut Reporter,
) -> Result<ExitCode, Report> {
    use nix::sys::signal::{SigSet, Signal};
    confine(spec, program, applied, deny_tcp)?;
    prctl::set_child_subreaper(true)
        .map_err(|errno| failed("becoming the unit's subreaper", std::io::Error::from(errno)))?;
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGCHLD);
    signals.add(Signal::SIGTERM);
    signals
        .thread_block()
        .map_err(|errno| failed("blocking signals", errno))?;
    reporter.send(&Report::Confined(Box::new(applied.clone())));
    // SAFETY: the helper is single-threaded, so the child may run any code.
    let child = unsafe { libc::fork() };
    if child == -1 {
        return Err(failed(
            "forking the unit's command",
            std::io::Error::last_os_error(),
        ));
    }
    if child == 0 {
        // The command starts with no signal blocked, and dies with the helper.
        let _ = signals.thread_unblock();
        // One landlock layer more, so nothing in the unit can signal (kill)
        // its supervisor and so escape removal. Kernels before landlock ABI 6
        // cannot; there the unit could.
        sandbox::scope_away_from_parent();
        let _ = prctl::set_pdeathsig(Signal::SIGKILL);
        new_session();
        run_executor_here(program, command, &spec.env, &spec.secret_values);
        let error = exec(program, command, &spec.env);
        eprintln!(
            "box sandbox: unit {}: executing {}: {error}",
            spec.unit,
            program.to_string_lossy()
        );
        std::process::exit(127);
    }
    reporter.close();
    release_stdio();
    let mut ended = None;
    loop {
        // Reap whatever has ended; note CMD's status.
        loop {
            let (pid, status) = waitpid_raw(-1, libc::WNOHANG);
            if pid <= 0 {
                break;
            }
            if pid == child {
                ended = Some(status);
            }
        }
        if ended.is_some() {
            break;
        }
        if let Ok(Signal::SIGTERM) = signals.wait() {
            break;
        }
    }
    kill_children();
    let _ = signals.thread_unblock();
    let Some(status) = ended else {
        // Removed: end as the signal asked.
        die_by(libc::SIGTERM);
        return Ok(ExitCode::from(REFUSED_EXIT));
    };
    if libc::WIFSIGNALED(status) {
        die_by(libc::WTERMSIG(status));
    }
    Ok(ExitCode::from(
        u8::try_from(libc::WEXITSTATUS(status)).unwrap_or(REFUSED_EXIT),
    ))
}

/// SIGKILL every child of this process and reap it, until none is left: as a
/// subreaper, every orphaned process of the unit is among them, and each
/// round's kills orphan the next generation to us.
fn kill_children() {
    let me = std::process::id();
    loop {
        let children = children_of(me);
        if children.is_empty() {
            break;
        }
        for child in &children {
            let _ = nix::sys::signal::kill(Pid::from_raw(*child), Signal::SIGKILL);
        }
        for child in &children {
            let _ = nix::sys::wait::waitpid(Pid::from_raw(*child), None);
        }
    }
}

/// The pids whose parent is `parent` (single-threaded): from
/// `/proc/<pid>/task/<pid>/children` where the kernel has it, else by reading
/// every `/proc/<pid>/stat`.
fn children_of(parent: u32) -> Vec<libc::pid_t> {
    if let Ok(children) = std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children"))
    {
        return children
            .split_whitespace()
            .filter_map(|pid| pid.parse().ok())
            .collect();
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<libc::pid_t>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| parent_pid(&stat))
                == Some(parent)
        })
        .collect()
}

/// The parent pid in a `/proc/<pid>/stat` line: the fourth field, counted
/// after the command name's closing parenthesis (the name may hold spaces).
fn parent_pid(stat: &str) -> Option<u32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

fn confine(
    spec: &SandboxSpec,
    program: &CString,
    applied: &mut Applied,
    deny_tcp: bool,
) -> Result<(), ConfineError> {
    std::env::set_current_dir(&spec.cwd).map_err(|error| ConfineError::Failed {
        doing: format!("entering {}", spec.cwd.display()),
        message: error.to_string(),
    })?;
    sandbox::apply_rlimits(&spec.rlimits)?;
    // A write past RLIMIT_FSIZE then fails with EFBIG instead of killing the
    // writer, so a tool sees an error it can report (D46).
    // SAFETY: setting a signal disposition to SIG_IGN (nix's `signal` is
    // unsafe too); inherited across execve.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    sandbox::set_no_new_privs()?;
    let mut read = spec.read.clone();
    read.push(PathBuf::from(std::ffi::OsStr::from_bytes(
        program.as_bytes(),
    )));
    let mut write = spec.write.clone();
    if applied.secrets_mounted
        && let Some(dir) = &spec.secrets_dir
    {
        // The executor writes the secrets there before its own landlock
        // layer, which leaves them read-only for everything it starts.
        write.push(dir.clone());
    }
    let mut rules = sandbox::landlock_rules(&read, &write);
    rules.deny_tcp = deny_tcp;
    if let Some(egress) = &spec.egress {
        rules.tcp_ports = vec![egress.port];
        rules.unix_connect = vec![egress.socket_dir.clone()];
    }
    if !applied.own_ptys {
        // The host's /dev/pts holds the host's terminals, where a unit could
        // write, or push keystrokes with TIOCSTI.
        rules
            .write
            .retain(|path| path != Path::new("/dev/pts") && path != Path::new("/dev/ptmx"));
    }
    applied.landlock =
        sandbox::apply_landlock(&rules, spec.landlock.into(), spec.landlock_min_abi)?;
    applied.landlock_tcp_denied = deny_tcp && applied.landlock.enforced;
    if applied.landlock.enforced && applied.landlock.abi >= 4 && !deny_tcp {
        applied.landlock_tcp_ports = rules.tcp_ports.clone();
    }
    if deny_tcp && !applied.landlock_tcp_denied {
        return Err(ConfineError::Unenforceable {
            control: "network none".to_owned(),
            why: "no network namespace, and landlock's TCP restriction was not enforced".to_owned(),
        });
    }
    applied.capabilities = sandbox::drop_capabilities()?;
    // Last: the filter refuses mount, unshare and ptrace, which nothing after
    // this point needs.
    // Network none without a namespace of its own: no IP sockets at all,
    // since landlock refuses TCP only.
    let seccomp = sandbox::SeccompOptions { deny_ip: deny_tcp };
    applied.seccomp = match spec.seccomp {
        SpecRequirement::Off => false,
        SpecRequirement::BestEffort => sandbox::apply_seccomp(seccomp).is_ok(),
        SpecRequirement::Required => {
            sandbox::apply_seccomp(seccomp)?;
            true
        }
    };
    applied.ip_sockets_denied = deny_tcp && applied.seccomp;
    applied.no_new_privs = sandbox::no_new_privs();
    if !applied.no_new_privs {
        return Err(ConfineError::Unenforceable {
            control: "no_new_privs".to_owned(),
            why: "the kernel reports it unset after setting it".to_owned(),
        });
    }
    applied.rlimits = sandbox::read_rlimits();
    applied.uid = nix::unistd::getuid().as_raw();
    applied.gid = nix::unistd::getgid().as_raw();
    Ok(())
}

/// Leave the host's session, and with it the host's controlling terminal:
/// nothing in the unit can then open `/dev/tty` to push keystrokes into the
/// terminal `box` was started from (`TIOCSTI`, C41; bubblewrap's
/// CVE-2017-5226). Never called by the helper itself, a process group leader
/// whose group removal signals.
fn new_session() {
    // It fails only for a group leader.
    let _ = nix::unistd::setsid();
}

/// Where `/etc/resolv.conf` really is, when a unit on the host's network
/// needs it and it lies outside the system directories.
fn resolver_target(network: SpecNetwork) -> Option<PathBuf> {
    match network {
        SpecNetwork::None => None,
        SpecNetwork::Host => std::fs::canonicalize("/etc/resolv.conf")
            .ok()
            .filter(|target| !target.starts_with("/etc")),
    }
}

/// Top-level directories a unit sees as they are: the system it reads (see
/// `sandbox::SYSTEM_READ_PATHS`), and the kernel's own file systems.
const SHOWN_TOP_LEVEL: &[&str] = &[
    "usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt", "proc", "sys", "dev",
];

/// In the unit's mount namespace, put an empty tmpfs over every other
/// top-level directory of the host (`/home`, `/root`, `/run`, `/tmp`, `/var`,
/// `/work`, ...), then bind the unit's own paths (`keep`: workspace, temp
/// directory, executables) back at the same place. Landlock already denies
/// reading and writing there, but before landlock ABI 9 it cannot stop a
/// `connect` to a Unix socket by path: the Docker socket, an SSH agent, D-Bus
/// (C37, F69, G80). What is not there cannot be reached. A kept path that is
/// itself a top-level directory stays in sight whole. Returns the hidden
/// directories, those that could not be hidden with why, and whether the
/// host's `/tmp` became the unit's own (`tmp`: a writable, sized tmpfs in
/// place of the empty one).
fn hide_host(
    keep: &[PathBuf],
    tmp: Option<SpecTmp>,
) -> std::io::Result<(Vec<String>, Vec<String>, bool)> {
    use nix::mount::MsFlags;
    use std::os::unix::fs::OpenOptionsExt;
    let mut keep: Vec<PathBuf> = keep
        .iter()
        .filter_map(|path| std::fs::canonicalize(path).ok())
        .collect();
    if keep.iter().any(|path| path.parent().is_none()) {
        // The unit keeps `/` itself (an operator allowed the host's root as
        // the workspace): there is nothing to hide, and the envelope says so.
        return Ok((
            Vec::new(),
            vec!["/: the unit's workspace is the host's root".to_owned()],
            false,
        ));
    }
    keep.sort();
    keep.dedup();
    // A path beneath another kept path comes back with it.
    let keep: Vec<PathBuf> = keep
        .iter()
        .filter(|path| {
            !keep
                .iter()
                .any(|other| other != *path && path.starts_with(other))
        })
        .cloned()
        .collect();
    let mut hidden = Vec::new();
    for entry in std::fs::read_dir("/")? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        // Symbolic links (`/bin -> usr/bin`) lead to shown or hidden places alike.
        if !entry.file_type()?.is_dir() || SHOWN_TOP_LEVEL.contains(&name) {
            continue;
        }
        let top = PathBuf::from("/").join(name);
        // A top-level directory the unit keeps whole (the workspace is
        // `/tmp`, say) stays in sight: a tmpfs over it would hide the very
        // path that must come back, with nothing above it to bind it under.
        if keep.contains(&top) {
            continue;
        }
        hidden.push(top);
    }
    // Handles on what comes back, taken before it is hidden.
    let mut restore = Vec::new();
    for path in &keep {
        if hidden.iter().any(|top| path.starts_with(top)) {
            let handle = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
                .open(path)?;
            restore.push((path.clone(), handle, path.is_dir()));
        }
    }
    // A directory that refuses the tmpfs (an automount, say) stays in sight,
    // and the envelope says so.
    let mut unhidden = Vec::new();
    let mut tmp_mounted = false;
    hidden.retain(|top| {
        // The host's /tmp becomes the unit's own: sized, writable by every
        // user of the unit (sticky), executable unless the profile says not.
        let own_tmp = tmp.filter(|_| top == Path::new("/tmp"));
        let (flags, options) = match own_tmp {
            Some(tmp) => (
                if tmp.exec {
                    MsFlags::MS_NOSUID | MsFlags::MS_NODEV
                } else {
                    MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC
                },
                format!(
                    "mode=1777,size={},nr_inodes={}",
                    tmp.bytes,
                    (tmp.bytes / 4096).max(1024)
                ),
            ),
            None => (
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                "mode=0755,size=1m".to_owned(),
            ),
        };
        let mounted = nix::mount::mount(
            Some("tmpfs"),
            top,
            Some("tmpfs"),
            flags,
            Some(options.as_str()),
        );
        match mounted {
            Ok(()) => {
                tmp_mounted |= own_tmp.is_some();
                true
            }
            Err(errno) => {
                unhidden.push(format!("{}: {errno}", top.display()));
                false
            }
        }
    });
    restore.retain(|(path, _, _)| hidden.iter().any(|top| path.starts_with(top)));
    for (path, handle, is_dir) in &restore {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        if *is_dir {
            std::fs::create_dir(path)?;
        } else {
            File::create(path)?;
        }
        use std::os::fd::AsRawFd;
        let source = format!("/proc/self/fd/{}", handle.as_raw_fd());
        nix::mount::mount(
            Some(source.as_str()),
            path,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )?;
    }
    let hidden = hidden
        .iter()
        .map(|path| path.display().to_string())
        .collect();
    Ok((hidden, unhidden, tmp_mounted))
}

/// Bind `path` onto itself (whether or not [`hide_host`] already bound it
/// back: it stays in sight where no tmpfs covers it), then make that mount
/// read-only.
fn bind_read_only(path: &Path) -> std::io::Result<()> {
    use nix::mount::MsFlags;
    nix::mount::mount(
        Some(path),
        path,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )?;
    nix::mount::mount(
        None::<&str>,
        path,
        None::<&str>,
        MsFlags::MS_BIND
            | MsFlags::MS_REMOUNT
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV
            | MsFlags::MS_NOEXEC,
        None::<&str>,
    )?;
    Ok(())
}

/// Close the volumes' locks in a forked child of the helper without
/// unlocking them (a lock's drop would unlock it for the helper too: the
/// two share it), so nothing of the unit holds them.
fn let_go_in_child(locks: Vec<nix::fcntl::Flock<File>>) {
    use std::os::fd::AsRawFd as _;
    for lock in locks {
        let fd = lock.as_raw_fd();
        std::mem::forget(lock);
        let _ = nix::unistd::close(fd);
    }
}

/// A volume's directory, taken while it can be reached.
enum VolumeSource {
    /// A detached copy of its mount ([`clone_tree`]), from any mount
    /// namespace.
    Tree(OwnedFd),
    /// A handle on it in the unit's mount namespace, bound from
    /// `/proc/self/fd` (kernels or sandboxes without `open_tree`).
    Handle(OwnedFd),
}

impl VolumeSource {
    /// `path`, in the unit's own mount namespace.
    fn take(path: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::OpenOptionsExt as _;
        match clone_tree(path) {
            Ok(tree) => Ok(Self::Tree(tree)),
            Err(_) => {
                let handle = std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
                    .open(path)?;
                Ok(Self::Handle(OwnedFd::from(handle)))
            }
        }
    }

    /// Mount it at `target`, in this process's mount namespace.
    fn attach(&self, target: &Path) -> std::io::Result<()> {
        match self {
            Self::Tree(tree) => attach_tree(tree, target),
            Self::Handle(handle) => {
                use std::os::fd::AsRawFd as _;
                let source = format!("/proc/self/fd/{}", handle.as_raw_fd());
                nix::mount::mount(
                    Some(source.as_str()),
                    target,
                    None::<&str>,
                    nix::mount::MsFlags::MS_BIND | nix::mount::MsFlags::MS_REC,
                    None::<&str>,
                )?;
                Ok(())
            }
        }
    }
}

/// A detached copy of the mount at `path` (`open_tree` with
/// `OPEN_TREE_CLONE`), attached elsewhere later with [`attach_tree`]: taken
/// where `path` can be reached, attached where the unit sees it.
fn clone_tree(path: &Path) -> std::io::Result<OwnedFd> {
    use std::os::fd::FromRawFd as _;
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    let path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: open_tree (which nix does not wrap) with a NUL-terminated path
    // that outlives the call; it returns a new fd or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            path.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_RECURSIVE as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(|_| std::io::Error::from(std::io::ErrorKind::Other))?;
    // SAFETY: a new fd this process owns and nothing else holds.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Attach the detached mount `tree` at `target` (`move_mount`), in this
/// process's mount namespace.
fn attach_tree(tree: &OwnedFd, target: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd as _;
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 4;
    let target = CString::new(target.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let empty = c"";
    // SAFETY: move_mount (which nix does not wrap) with a held fd and
    // NUL-terminated paths that outlive the call.
    let result = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if result != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Put each of the unit's volumes at its place. In the unit's own mount
/// namespace its directory is mounted there; the mount point is made as the
/// unit's user (the home keeps its owner) beneath the unit's home or a host
/// directory the namespace replaced, and never on the host's own file
/// system (an existing directory elsewhere is mounted over; anything else
/// is refused, naming the volume). Without a mount namespace, a place
/// beneath the unit's home becomes a link to the volume's directory on the
/// host (which the unit's user must reach), and any other place is refused.
fn attach_volumes(
    spec: &SandboxSpec,
    trees: Vec<Option<VolumeSource>>,
    mount_namespace: bool,
    hidden: &[String],
) -> Result<Vec<AppliedVolumeReport>, Report> {
    let home = spec.home.as_ref().map(|home| home.path.as_path());
    let beneath_home =
        |target: &Path| home.is_some_and(|home| target.starts_with(home) && target != home);
    let mut made = Vec::new();
    for (volume, tree) in spec.volumes.iter().zip(trees) {
        let control = format!("volume {:?}", volume.name);
        let target = &volume.target;
        if mount_namespace {
            let Some(tree) = tree else {
                return Err(failed(
                    format!("taking volume {}'s directory", volume.name),
                    "no copy of its mount was made",
                ));
            };
            let inside_hidden = hidden
                .iter()
                .any(|top| target.starts_with(top) && target != Path::new(top));
            if !target.is_dir() {
                if !beneath_home(target) && !inside_hidden {
                    return Err(refused(
                        &control,
                        format!(
                            "{} does not exist, and its mount point would be made on the host's file system (only beneath the unit's home or a host directory the unit's mount namespace replaced: {})",
                            target.display(),
                            hidden.join(", ")
                        ),
                    ));
                }
                std::fs::create_dir_all(target).map_err(|error| {
                    failed(
                        format!(
                            "creating volume {}'s place {}",
                            volume.name,
                            target.display()
                        ),
                        error,
                    )
                })?;
            }
            tree.attach(target).map_err(|error| {
                failed(
                    format!("mounting volume {} at {}", volume.name, target.display()),
                    error,
                )
            })?;
            made.push(AppliedVolumeReport {
                name: volume.name.clone(),
                linked: false,
            });
            continue;
        }
        if !beneath_home(target) {
            return Err(refused(
                &control,
                format!(
                    "the unit has no mount namespace of its own, so nothing can be mounted at {}; a volume beneath the home (~/...) is linked instead",
                    target.display()
                ),
            ));
        }
        let reachable = nix::unistd::access(
            &volume.data,
            nix::unistd::AccessFlags::R_OK
                | nix::unistd::AccessFlags::W_OK
                | nix::unistd::AccessFlags::X_OK,
        );
        if let Err(errno) = reachable {
            return Err(refused(
                &control,
                format!(
                    "the unit has no mount namespace of its own, and its user cannot reach the volume's directory {} to link it ({errno})",
                    volume.data.display()
                ),
            ));
        }
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|error| failed(format!("creating {}", parent.display()), error))?;
        }
        std::os::unix::fs::symlink(&volume.data, target).map_err(|error| {
            failed(
                format!("linking volume {} at {}", volume.name, target.display()),
                error,
            )
        })?;
        made.push(AppliedVolumeReport {
            name: volume.name.clone(),
            linked: true,
        });
    }
    Ok(made)
}

/// Make the unit's home: a tmpfs of `home.bytes` over its directory where
/// the unit has a mount namespace of its own (private, executable: tools
/// install programs there), then `home.skel` copied in.
fn make_home(home: &SpecHome, mount_namespace: bool) -> Result<AppliedHomeReport, Report> {
    use nix::mount::MsFlags;
    let mut bytes = None;
    if mount_namespace {
        nix::mount::mount(
            Some("tmpfs"),
            &home.path,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(
                format!(
                    "mode=0700,size={},nr_inodes={}",
                    home.bytes,
                    (home.bytes / 4096).max(1024)
                )
                .as_str(),
            ),
        )
        .map_err(|errno| {
            failed(
                format!("mounting the unit's home at {}", home.path.display()),
                errno,
            )
        })?;
        bytes = Some(home.bytes);
    }
    let mut seeded_from = None;
    if let Some(skel) = home.skel.as_ref().filter(|skel| skel.is_dir()) {
        copy_tree(skel, &home.path, 0).map_err(|error| {
            failed(
                format!("filling the unit's home from {}", skel.display()),
                error,
            )
        })?;
        seeded_from = Some(skel.clone());
    }
    Ok(AppliedHomeReport { bytes, seeded_from })
}

/// Copy the directories, regular files (with their modes) and symbolic links
/// beneath `from` into `to`; anything else is left out, and so is what lies
/// deeper than a skeleton ever does.
fn copy_tree(from: &Path, to: &Path, depth: usize) -> std::io::Result<()> {
    if depth > 16 {
        return Ok(());
    }
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let target = to.join(entry.file_name());
        if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(entry.path())?, &target)?;
        } else if kind.is_dir() {
            std::fs::create_dir(&target)?;
            copy_tree(&entry.path(), &target, depth + 1)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// The most bytes of the secrets tmpfs (as on the docker backend).
const SECRETS_TMPFS_BYTES: u64 = 1 << 20;

/// Mount a tmpfs of the unit's own at `dir` (mode 0700, owned by the unit's
/// user, which this process is by now), where box's executor writes each
/// secret as a 0400 file. Only inside a top-level directory that
/// [`hide_host`] replaced with the unit's own tmpfs: creating the mount point
/// must never touch the host's file system. Returns whether it mounted.
fn mount_secrets(dir: &Path, hidden: &[String]) -> Result<bool, Report> {
    use nix::mount::MsFlags;
    let inside_hidden = hidden
        .iter()
        .any(|top| dir.starts_with(top) && dir != Path::new(top));
    if !inside_hidden {
        return Err(refused(
            "env.secrets",
            format!(
                "{} is not inside a directory the unit's mount namespace replaced (hidden: {}), so its mount point would be made on the host",
                dir.display(),
                hidden.join(", ")
            ),
        ));
    }
    std::fs::create_dir_all(dir)
        .map_err(|error| failed(format!("creating {}", dir.display()), error))?;
    nix::mount::mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some(format!("mode=0700,size={SECRETS_TMPFS_BYTES},nr_inodes=1024").as_str()),
    )
    .map_err(|errno| failed(format!("mounting a tmpfs at {}", dir.display()), errno))?;
    Ok(true)
}

/// Cover each of `paths`: a directory with an empty read-only tmpfs, anything
/// else with `/dev/null`. Returns how many were covered.
fn conceal(paths: &[PathBuf]) -> std::io::Result<usize> {
    use nix::mount::MsFlags;
    let mut covered = 0;
    for path in paths {
        let Ok(metadata) = std::fs::symlink_metadata(path) else {
            continue;
        };
        if metadata.file_type().is_symlink() {
            continue;
        }
        if metadata.is_dir() {
            nix::mount::mount(
                Some("tmpfs"),
                path,
                Some("tmpfs"),
                MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                Some("mode=0000,size=4k"),
            )?;
        } else {
            nix::mount::mount(
                Some("/dev/null"),
                path,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )?;
        }
        covered += 1;
    }
    Ok(covered)
}

/// The kernel files Docker masks in every container (its `MaskedPaths`),
/// those this machine has: kernel memory, keys, timers and firmware tables
/// that a unit has no business reading (C33). Under a `/sys` of the unit's
/// own (`fresh_sys`) nothing is mounted on `/sys/kernel/debug`, so it needs
/// no mask (one mount fewer).
fn kernel_paths(fresh_sys: bool) -> Vec<PathBuf> {
    [
        "/proc/acpi",
        "/proc/kcore",
        "/proc/keys",
        "/proc/latency_stats",
        "/proc/timer_list",
        "/proc/timer_stats",
        "/proc/sched_debug",
        "/proc/scsi",
        "/sys/firmware",
        "/sys/kernel/debug",
    ]
    .into_iter()
    .filter(|path| !(fresh_sys && *path == "/sys/kernel/debug"))
    .map(PathBuf::from)
    .filter(|path| path.symlink_metadata().is_ok())
    .collect()
}

/// Give the unit a devpts instance of its own, so `/dev/pts` shows only its
/// own pseudo-terminals and never the host's terminals. Returns whether it
/// could.
fn mount_own_ptys() -> bool {
    use nix::mount::MsFlags;
    let devpts = nix::mount::mount(
        Some("devpts"),
        "/dev/pts",
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620"),
    );
    devpts.is_ok()
        && nix::mount::mount(
            Some("/dev/pts/ptmx"),
            "/dev/ptmx",
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .is_ok()
}

/// Map our uid and gid to themselves in the new user namespace, so files keep
/// their owners; `setgroups` must be denied before an unprivileged gid map.
fn map_ids(uid: u32, gid: u32) -> std::io::Result<()> {
    std::fs::write("/proc/self/setgroups", "deny")?;
    std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1\n"))?;
    std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1\n"))
}

fn bring_up_loopback() -> std::io::Result<()> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socket};
    use std::os::fd::AsRawFd;
    let socket = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    // SAFETY: ifreq is plain old data; all zeroes is a valid value.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (slot, byte) in request.ifr_name.iter_mut().zip(b"lo\0") {
        *slot = *byte as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads the name and writes the flags of `request`.
    if unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFFLAGS, &mut request) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
    unsafe {
        request.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    }
    // SAFETY: SIOCSIFFLAGS reads the name and flags of `request`.
    if unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCSIFFLAGS, &request) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// CMD's program as an absolute path (searched in the unit's `PATH` when it
/// has no slash, relative to the unit's working directory when it is
/// relative), so landlock can grant executing exactly it.
fn resolve_program(
    command: &[OsString],
    env: &[(String, String)],
    cwd: &Path,
) -> Result<CString, Report> {
    let Some(first) = command.first() else {
        return Err(failed("reading the command", "no command given"));
    };
    let first = Path::new(first);
    let path = if first.as_os_str().as_bytes().contains(&b'/') {
        first.to_path_buf()
    } else {
        let search = env
            .iter()
            .find(|(name, _)| name == "PATH")
            .map_or("/usr/local/bin:/usr/bin:/bin", |(_, value)| value.as_str());
        search
            .split(':')
            .map(|dir| cwd.join(dir).join(first))
            .find(|candidate| candidate.is_file())
            .ok_or_else(|| {
                failed(
                    format!("finding {}", first.display()),
                    format!("not found in PATH {search}"),
                )
            })?
    };
    // Relative to the unit's working directory, as CMD would see it.
    let path = cwd.join(path);
    let path = std::fs::canonicalize(&path)
        .map_err(|error| failed(format!("finding {}", path.display()), error))?;
    CString::new(path.as_os_str().as_bytes())
        .map_err(|error| failed(format!("finding {}", path.display()), error))
}

/// When CMD is this very binary's executor (`box execute …`), run it in this
/// forked child rather than executing the same binary a second time: the
/// confinement is the process's and is inherited either way, and a second
/// exec of box (relocating and faulting in a large static binary, starting
/// its runtime again) was a sizable part of a unit's start. What the exec
/// would have done is done by hand: every fd but stdio closed (all others
/// are close-on-exec), the environment replaced by CMD's. Returns only when
/// CMD is something else; otherwise the process ends with the executor.
fn run_executor_here(
    program: &CString,
    command: &[OsString],
    env: &[(String, String)],
    secrets: &SecretValues,
) {
    use std::os::unix::fs::MetadataExt;
    if command.get(1).map(OsString::as_os_str) != Some(std::ffi::OsStr::new("execute")) {
        return;
    }
    let program = Path::new(std::ffi::OsStr::from_bytes(program.as_bytes()));
    let same_file = match (
        std::fs::metadata(program),
        std::fs::metadata("/proc/self/exe"),
    ) {
        (Ok(cmd), Ok(this)) => cmd.dev() == this.dev() && cmd.ino() == this.ino(),
        _ => false,
    };
    if !same_file {
        return;
    }
    // SAFETY: close_range (which nix does not wrap) with integer arguments closes fds of this process
    // only; nothing here uses one above stderr again (the report duplicate
    // and the init's status pipe are the parent's to use).
    let closed = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            0,
        )
    };
    if closed != 0 {
        // Kernels before 5.9: the exec closes them.
        return;
    }
    for (name, _) in std::env::vars_os() {
        // SAFETY: this forked child is single-threaded (the helper never
        // starts a thread), so nothing reads the environment meanwhile.
        unsafe { std::env::remove_var(name) };
    }
    // The secrets' carriers join here, never an `execve`'s environment:
    // this process's initial environment block (what /proc/PID/environ
    // shows) stays the helper's, which is empty.
    for (name, value) in env.iter().chain(&secrets.0) {
        // SAFETY: as above, single-threaded.
        unsafe { std::env::set_var(name, value) };
    }
    let args: Vec<String> = command[1..]
        .iter()
        .map(|arg| arg.to_string_lossy().into_owned())
        .collect();
    let Some(executor) = EXECUTOR.get() else {
        return;
    };
    let code = match ExecutorSpec::from_args(&args) {
        Ok(spec) => match executor(spec) {
            Ok(code) if code == ExitCode::SUCCESS => 0,
            Ok(_) => 1,
            Err(error) => {
                eprintln!("box: {error:#}");
                1
            }
        },
        Err(error) => {
            eprintln!("box execute: {error}");
            2
        }
    };
    std::process::exit(code);
}

fn exec(program: &CString, command: &[OsString], env: &[(String, String)]) -> std::io::Error {
    let to_c = |bytes: &[u8]| CString::new(bytes).unwrap_or_default();
    let argv: Vec<CString> = command.iter().map(|arg| to_c(arg.as_bytes())).collect();
    let envp: Vec<CString> = env
        .iter()
        .map(|(name, value)| to_c(format!("{name}={value}").as_bytes()))
        .collect();
    let Err(errno) = nix::unistd::execve(program, &argv, &envp);
    std::io::Error::from(errno)
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;
    use std::path::PathBuf;

    use super::{parent_pid, resolve_program};

    #[test]
    fn programs_resolve_in_path_and_relative_to_the_unit() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tool"), "").unwrap();
        let env = vec![("PATH".to_owned(), "/nonexistent:/bin".to_owned())];
        let resolve = |program: &str| {
            resolve_program(&[OsString::from(program)], &env, dir.path())
                .ok()
                .map(|path| PathBuf::from(path.to_string_lossy().into_owned()))
        };
        assert_eq!(resolve("sh"), std::fs::canonicalize("/bin/sh").ok());
        assert_eq!(
            resolve("./tool"),
            std::fs::canonicalize(dir.path().join("tool")).ok()
        );
        assert_eq!(resolve("no-such-program-here"), None);
    }

    #[test]
    fn the_parent_pid_is_read_past_the_command_name() {
        assert_eq!(parent_pid("42 (sh) S 7 42 42 0"), Some(7));
        assert_eq!(parent_pid("42 (a b) c) R 9 1 1"), Some(9));
        assert_eq!(parent_pid("garbage"), None);
    }
}
