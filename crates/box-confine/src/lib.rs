//! Process-level confinement shared by the local backend and the executor:
//! landlock (read the system, write only the workspace and temp), no_new_privs,
//! rlimits, capabilities dropped, and the local backend's seccomp layer (box's
//! filter from [`seccomp`], the one table of refused syscalls, plus an
//! IP filter for network none without a namespace). Linux-only (the crate
//! builds for x86_64-unknown-linux-gnu only; the raw syscall numbers below are
//! Linux's).
//!
//! Each control is one function that applies it to the calling thread (and so
//! to everything it later `execve`s), and reports what the kernel actually
//! did, read back where the kernel lets us (`/proc/self/status`,
//! `PR_GET_NO_NEW_PRIVS`, landlock's own status), so the envelope is observed,
//! not assumed. What to apply is plain data built by pure functions
//! ([`landlock_rules`], [`Rlimits::from_limits`]) so it is testable without a
//! kernel.
//!
//! Landlock restricts the calling *thread*: confine before any thread is
//! started (the helper is single-threaded; the executor must call
//! [`confine_executor`] before it builds its runtime, and it refuses under
//! `Required` when it sees more than one thread).

pub mod seccomp;

use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, PathBeneath, PathFd,
    Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope,
};
use serde::{Deserialize, Serialize};

use box_policy::plan::{Limits, Requirement};

/// What confinement was achieved on this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Confinement {
    /// The landlock ABI the kernel offers (0 = none).
    pub landlock_abi: u32,
    /// Whether landlock is enforced on this process (and so its children).
    pub landlock_enforced: bool,
    /// Whether no_new_privs is set.
    pub no_new_privileges: bool,
}

/// Why a control could not be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfineError {
    /// A control that is required cannot be applied on this kernel or here.
    #[error("{control} is required but cannot be applied here: {why}")]
    Unenforceable {
        /// The control (landlock, no_new_privs, rlimit nofile, ...).
        control: String,
        /// Why not.
        why: String,
    },
    /// A control failed while being applied.
    #[error("{doing}: {message}")]
    Failed {
        /// What was being done.
        doing: String,
        /// What went wrong.
        message: String,
    },
}

impl ConfineError {
    fn failed(doing: impl Into<String>, error: impl std::fmt::Display) -> Self {
        Self::Failed {
            doing: doing.into(),
            message: error.to_string(),
        }
    }
}

/// The directories every unit may read and execute: the system, never a home
/// directory. `/proc` is needed for `/proc/self` (the runtime, `ps`, shells);
/// other processes' `/proc/<pid>` entries stay out of reach because landlock
/// denies ptrace-class access (environ, mem, fds) to processes outside the
/// sandbox, and the local backend mounts a fresh `/proc` in its own pid
/// namespace where it can. `/sys` is read-only and mostly world-readable; it
/// is kept for tools that read `/sys/class/net` or CPU topology.
pub const SYSTEM_READ_PATHS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/proc", "/sys",
];

/// The device files a unit may read and write. Everything else under `/dev`
/// (disks, `/dev/kmsg`, `/dev/mem`, `/dev/fuse`) is denied even when file
/// permissions would allow it (C38).
pub const DEVICE_PATHS: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
];

/// The paths a landlock ruleset grants; everything else is denied.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LandlockRules {
    /// Read and execute beneath these.
    pub read: Vec<PathBuf>,
    /// Read, write, create and remove beneath these.
    pub write: Vec<PathBuf>,
    /// Deny every TCP bind and connect (ABI 4; a hard requirement when set):
    /// network none for a unit that could not get a network namespace.
    #[serde(default)]
    pub deny_tcp: bool,
    /// TCP bind and connect only to these ports (ABI 4, best effort), unless
    /// `deny_tcp`: an egress unit's bridge port. Empty: TCP not restricted.
    #[serde(default)]
    pub tcp_ports: Vec<u16>,
    /// Pathname Unix sockets beneath these may be connected to, where the
    /// kernel's landlock mediates that (ABI 9): an egress unit's proxy socket.
    #[serde(default)]
    pub unix_connect: Vec<PathBuf>,
}

/// The ruleset for a unit: the system and `extra_read` readable, the devices
/// and `write` writable. Pure.
pub fn landlock_rules(extra_read: &[PathBuf], write: &[PathBuf]) -> LandlockRules {
    let mut read: Vec<PathBuf> = SYSTEM_READ_PATHS.iter().map(PathBuf::from).collect();
    read.extend(extra_read.iter().cloned());
    let mut writable: Vec<PathBuf> = DEVICE_PATHS.iter().map(PathBuf::from).collect();
    writable.extend(write.iter().cloned());
    LandlockRules {
        read,
        write: writable,
        deny_tcp: false,
        tcp_ports: Vec::new(),
        unix_connect: Vec::new(),
    }
}

/// What landlock achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LandlockOutcome {
    /// The ABI the kernel offers (0 = none).
    pub abi: u32,
    /// Every handled right is enforced (`FullyEnforced`).
    pub fully_enforced: bool,
    /// At least the file-system write restriction is enforced.
    pub enforced: bool,
}

/// The landlock ABI the running kernel offers (0 when it has none).
pub fn landlock_abi() -> u32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: landlock_create_ruleset with a null attribute, size 0 and the
    // VERSION flag only returns the ABI number (or -1); it touches no memory.
    let version = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    u32::try_from(version).unwrap_or(0)
}

/// The crate's ABI for the kernel's number, capped at the newest the crate knows.
fn abi_for(kernel_abi: u32) -> ABI {
    ABI::from(i32::try_from(kernel_abi).unwrap_or(i32::MAX))
}

/// Apply `rules` to the calling thread.
///
/// The rights handled are every right of the kernel's ABI (capped at the
/// newest the crate knows), so a kernel that has them all enforces them
/// fully. `Required`: the kernel must offer at least `min_abi`, the ABI-1
/// file-system rights (the write restriction) are a hard requirement, and
/// anything short of fully enforced is an error naming landlock.
/// `BestEffort`: apply what the kernel has and report it. `Off`: nothing.
pub fn apply_landlock(
    rules: &LandlockRules,
    requirement: Requirement,
    min_abi: u32,
) -> Result<LandlockOutcome, ConfineError> {
    let kernel_abi = landlock_abi();
    let not_applied = LandlockOutcome {
        abi: kernel_abi,
        fully_enforced: false,
        enforced: false,
    };
    match requirement {
        Requirement::Off => return Ok(not_applied),
        Requirement::Required if kernel_abi < min_abi.max(1) => {
            return Err(ConfineError::Unenforceable {
                control: format!("landlock (ABI {})", min_abi.max(1)),
                why: if kernel_abi == 0 {
                    "the kernel has no landlock (not built in, or not in the lsm= boot list)"
                        .to_owned()
                } else {
                    format!("the kernel offers landlock ABI {kernel_abi}")
                },
            });
        }
        Requirement::Required | Requirement::BestEffort => {}
    }
    if kernel_abi == 0 {
        return Ok(not_applied);
    }
    let abi = abi_for(kernel_abi);
    let core_level = match requirement {
        Requirement::Required => CompatLevel::HardRequirement,
        Requirement::BestEffort | Requirement::Off => CompatLevel::BestEffort,
    };
    let build = || -> Result<RulesetStatus, landlock::RulesetError> {
        let ruleset = Ruleset::default()
            .set_compatibility(core_level)
            .handle_access(AccessFs::from_all(ABI::V1))?
            .set_compatibility(CompatLevel::BestEffort)
            .handle_access(AccessFs::from_all(abi))?
            .scope(Scope::from_all(abi))?;
        let ruleset = if rules.deny_tcp {
            // Handled with no rule allowing any port: every bind and connect is denied.
            ruleset
                .set_compatibility(CompatLevel::HardRequirement)
                .handle_access(AccessNet::from_all(ABI::V4))?
        } else if !rules.tcp_ports.is_empty() && !AccessNet::from_all(abi).is_empty() {
            // Best effort: where this limits TCP, a network namespace of the
            // unit's own is the boundary already.
            ruleset
                .set_compatibility(CompatLevel::BestEffort)
                .handle_access(AccessNet::from_all(abi))?
        } else {
            ruleset
        };
        let mut created = ruleset.create()?;
        if !rules.deny_tcp && !AccessNet::from_all(abi).is_empty() {
            for port in &rules.tcp_ports {
                created = created.add_rule(NetPort::new(*port, AccessNet::from_all(abi)))?;
            }
        }
        let resolve_unix = AccessFs::from_all(abi) & AccessFs::ResolveUnix;
        if !resolve_unix.is_empty() {
            for path in &rules.unix_connect {
                let Ok(fd) = PathFd::new(path) else { continue };
                created = created.add_rule(PathBeneath::new(fd, resolve_unix))?;
            }
        }
        let read = AccessFs::from_read(abi);
        let all = AccessFs::from_all(abi);
        for (paths, access) in [(&rules.read, read), (&rules.write, all)] {
            for path in paths {
                // A path this machine lacks (`/lib32`) cannot be reached
                // either; skipping it loses nothing.
                let Ok(fd) = PathFd::new(path) else { continue };
                let access = if path.is_dir() {
                    access
                } else {
                    access & AccessFs::from_file(abi)
                };
                created = created.add_rule(PathBeneath::new(fd, access))?;
            }
        }
        Ok(created.restrict_self()?.ruleset)
    };
    match build() {
        Ok(status)
            if requirement == Requirement::Required && status != RulesetStatus::FullyEnforced =>
        {
            Err(ConfineError::Unenforceable {
                control: "landlock".to_owned(),
                why: format!(
                    "{} on this kernel (landlock ABI {kernel_abi})",
                    match status {
                        RulesetStatus::PartiallyEnforced => "only partly enforced",
                        RulesetStatus::NotEnforced => "not enforced",
                        RulesetStatus::FullyEnforced => "enforced",
                    }
                ),
            })
        }
        Ok(status) => Ok(LandlockOutcome {
            abi: kernel_abi,
            fully_enforced: status == RulesetStatus::FullyEnforced,
            enforced: status != RulesetStatus::NotEnforced,
        }),
        Err(error) => match requirement {
            Requirement::Required => Err(ConfineError::Unenforceable {
                control: "landlock".to_owned(),
                why: error.to_string(),
            }),
            Requirement::BestEffort | Requirement::Off => Ok(not_applied),
        },
    }
}

/// Add a landlock layer that only scopes signals and abstract unix sockets
/// (ABI 6): the calling thread can no longer signal, or connect to abstract
/// sockets of, processes in the domain it was in, its supervisor included.
/// Returns whether the kernel enforced it.
pub fn scope_away_from_parent() -> bool {
    let abi = abi_for(landlock_abi());
    let scoped = || -> Result<RulesetStatus, landlock::RulesetError> {
        Ok(Ruleset::default()
            .set_compatibility(CompatLevel::BestEffort)
            .scope(Scope::from_all(abi))?
            .create()?
            .restrict_self()?
            .ruleset)
    };
    matches!(scoped(), Ok(RulesetStatus::FullyEnforced))
}

/// Set no_new_privs on the calling thread: nothing it executes gains
/// privileges (setuid bits and file capabilities are ignored).
pub fn set_no_new_privs() -> Result<(), ConfineError> {
    nix::sys::prctl::set_no_new_privs().map_err(|errno| ConfineError::Unenforceable {
        control: "no_new_privs".to_owned(),
        why: std::io::Error::from(errno).to_string(),
    })
}

/// Whether no_new_privs is set on the calling thread, as the kernel says.
pub fn no_new_privs() -> bool {
    nix::sys::prctl::get_no_new_privs().unwrap_or(false)
}

/// Resource limits applied with `setrlimit` (soft = hard, so the unit cannot
/// raise them back).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rlimits {
    /// Most open files per process (`RLIMIT_NOFILE`).
    pub nofile: u64,
    /// Most processes of the unit's user (`RLIMIT_NPROC`); counted within the
    /// unit's user namespace when it has one. The kernel does not apply it to
    /// uid 0 of the host.
    pub nproc: u64,
    /// Heap and private writable mappings (`RLIMIT_DATA`): the memory limit.
    pub data_bytes: u64,
    /// Address space (`RLIMIT_AS`): a backstop at twice the memory limit, so
    /// runtimes that reserve address space (thread stacks, JITs) still start.
    pub address_space_bytes: u64,
    /// The largest file the unit may write (`RLIMIT_FSIZE`); writes past it
    /// fail with `EFBIG` (`SIGXFSZ` is ignored in the unit).
    pub fsize_bytes: u64,
    /// Core dumps (`RLIMIT_CORE`): always 0, a core could leak secrets.
    pub core_bytes: u64,
}

impl Rlimits {
    /// The rlimits for a unit's limits. The local backend has no tmpfs, so the
    /// tmp budget becomes the per-file cap. Pure.
    pub fn from_limits(limits: &Limits) -> Self {
        Self {
            nofile: limits.nofile,
            nproc: limits.pids,
            data_bytes: limits.memory_bytes,
            address_space_bytes: limits.memory_bytes.saturating_mul(2),
            fsize_bytes: limits.tmp_bytes,
            core_bytes: 0,
        }
    }
}

/// Apply `limits` to the calling process (soft and hard).
pub fn apply_rlimits(limits: &Rlimits) -> Result<(), ConfineError> {
    use nix::sys::resource::{Resource, setrlimit};
    for (name, resource, value) in [
        ("nofile", Resource::RLIMIT_NOFILE, limits.nofile),
        ("nproc", Resource::RLIMIT_NPROC, limits.nproc),
        ("data", Resource::RLIMIT_DATA, limits.data_bytes),
        ("as", Resource::RLIMIT_AS, limits.address_space_bytes),
        ("fsize", Resource::RLIMIT_FSIZE, limits.fsize_bytes),
        ("core", Resource::RLIMIT_CORE, limits.core_bytes),
    ] {
        setrlimit(resource, value, value).map_err(|errno| ConfineError::Unenforceable {
            control: format!("rlimit {name}"),
            why: format!("setrlimit to {value}: {errno}"),
        })?;
    }
    Ok(())
}

/// The calling process's rlimits as the kernel reports them (soft values).
pub fn read_rlimits() -> Rlimits {
    use nix::sys::resource::{Resource, getrlimit};
    let soft = |resource| getrlimit(resource).map_or(u64::MAX, |(soft, _)| soft);
    Rlimits {
        nofile: soft(Resource::RLIMIT_NOFILE),
        nproc: soft(Resource::RLIMIT_NPROC),
        data_bytes: soft(Resource::RLIMIT_DATA),
        address_space_bytes: soft(Resource::RLIMIT_AS),
        fsize_bytes: soft(Resource::RLIMIT_FSIZE),
        core_bytes: soft(Resource::RLIMIT_CORE),
    }
}

/// The capability sets of the calling thread, as bit masks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CapabilitySets {
    /// `CapEff`.
    pub effective: u64,
    /// `CapPrm`.
    pub permitted: u64,
    /// `CapInh`.
    pub inheritable: u64,
    /// `CapBnd`.
    pub bounding: u64,
    /// `CapAmb`.
    pub ambient: u64,
}

/// Read the capability sets from a `/proc/<pid>/status` text. Pure.
pub fn parse_capabilities(status: &str) -> Option<CapabilitySets> {
    let field = |name: &str| {
        status.lines().find_map(|line| {
            let value = line.strip_prefix(name)?.strip_prefix(':')?;
            u64::from_str_radix(value.trim(), 16).ok()
        })
    };
    Some(CapabilitySets {
        effective: field("CapEff")?,
        permitted: field("CapPrm")?,
        inheritable: field("CapInh")?,
        bounding: field("CapBnd")?,
        ambient: field("CapAmb")?,
    })
}

/// The calling thread's capability sets, as the kernel reports them.
pub fn capability_sets() -> Result<CapabilitySets, ConfineError> {
    let status = std::fs::read_to_string("/proc/thread-self/status")
        .or_else(|_| std::fs::read_to_string("/proc/self/status"))
        .map_err(|error| ConfineError::failed("reading /proc/self/status", error))?;
    parse_capabilities(&status).ok_or_else(|| {
        ConfineError::failed(
            "reading /proc/self/status",
            "no CapEff/CapPrm/CapInh/CapBnd/CapAmb lines",
        )
    })
}

/// The names of the capabilities in `mask` (capability(7), `CAP_CHOWN`), by
/// number; a bit `caps` has no name for is `CAP_<bit>`. Pure.
pub fn capability_names(mask: u64) -> Vec<String> {
    let known = caps::all();
    (0..64u32)
        .filter(|bit| mask & (1u64 << bit) != 0)
        .map(|bit| {
            known
                .iter()
                .find(|capability| u32::from(capability.index()) == bit)
                .map_or_else(|| format!("CAP_{bit}"), ToString::to_string)
        })
        .collect()
}

/// Drop every capability of the calling thread: the bounding set (so an
/// `execve` as uid 0 cannot regain them), the ambient set, then effective,
/// permitted and inheritable. Returns the sets read back afterwards; an
/// error when anything effective or permitted survives.
///
/// The bounding set can only be dropped with `CAP_SETPCAP` (as root, or in a
/// user namespace of our own); without it the sets are already empty and
/// no_new_privs keeps an `execve` from filling them.
///
/// The sets are read back from `/proc` ([`capability_sets`]), not through
/// `caps::read`: the kernel's masks carry every bit, including capabilities
/// newer than `caps` names, so anything left is seen.
pub fn drop_capabilities() -> Result<CapabilitySets, ConfineError> {
    use caps::CapSet;
    drop_bounding_set();
    // Failure (a kernel without ambient capabilities) is read back below.
    let _ = caps::clear(None, CapSet::Ambient);
    for set in [CapSet::Effective, CapSet::Permitted, CapSet::Inheritable] {
        caps::clear(None, set).map_err(|error| ConfineError::Unenforceable {
            control: "capabilities dropped".to_owned(),
            why: error.to_string(),
        })?;
    }
    let sets = capability_sets()?;
    if sets.effective != 0 || sets.permitted != 0 || sets.ambient != 0 {
        return Err(ConfineError::Unenforceable {
            control: "capabilities dropped".to_owned(),
            why: format!(
                "still held after dropping: {}",
                capability_names(sets.effective | sets.permitted | sets.ambient).join(", ")
            ),
        });
    }
    Ok(sets)
}

/// Empty the capability bounding set, as far as this process may (it needs
/// `CAP_SETPCAP`: a root process about to become another user does this
/// first, since the switch gives that right up). Failure (EPERM without
/// `CAP_SETPCAP`, EINVAL for a capability this kernel lacks) is for the
/// caller to read back (`capability_sets`).
pub fn drop_bounding_set() {
    for capability in caps::all() {
        let _ = caps::drop(None, caps::CapSet::Bounding, capability);
    }
}

/// What the local backend's seccomp layer refuses beyond box's filter
/// (`backend::seccomp`, the one table of refused syscalls).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SeccompOptions {
    /// Refuse IP sockets (`AF_INET`, `AF_INET6`) altogether: network none
    /// for a unit that shares the host's network namespace, where landlock
    /// covers TCP only and UDP would still leave.
    pub deny_ip: bool,
}

/// `AUDIT_ARCH_X86_64`: the IP filter answers only native calls (box's filter,
/// installed first, already kills every other architecture).
const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;

fn statement(code: u32, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u32, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

/// The IP filter (classic BPF over `seccomp_data`): `socket` with
/// `AF_INET` or `AF_INET6` → `EPERM`, everything else allowed. Pure.
pub fn ip_filter() -> Vec<libc::sock_filter> {
    use libc::{BPF_ABS, BPF_JEQ, BPF_JMP, BPF_K, BPF_LD, BPF_RET, BPF_W};
    const NR: u32 = 0; // offsetof(struct seccomp_data, nr)
    const ARCH: u32 = 4; // offsetof(struct seccomp_data, arch)
    const ARG0: u32 = 16; // offsetof(struct seccomp_data, args[0]), low half on little-endian
    let load = |offset| statement(BPF_LD | BPF_W | BPF_ABS, offset);
    let ret = |value| statement(BPF_RET | BPF_K, value);
    let allow = ret(libc::SECCOMP_RET_ALLOW);
    vec![
        // Jumps count the instructions skipped: 7 is the allow, 8 the refusal.
        load(ARCH),
        jump(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 0, 5),
        load(NR),
        jump(BPF_JMP | BPF_JEQ | BPF_K, libc::SYS_socket as u32, 0, 3),
        load(ARG0),
        jump(BPF_JMP | BPF_JEQ | BPF_K, libc::AF_INET as u32, 2, 0),
        jump(BPF_JMP | BPF_JEQ | BPF_K, libc::AF_INET6 as u32, 1, 0),
        allow,
        ret(libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
    ]
}

fn install_filter(program: &[libc::sock_filter], what: &str) -> Result<(), ConfineError> {
    let filter = libc::sock_fprog {
        len: u16::try_from(program.len()).unwrap_or(u16::MAX),
        filter: program.as_ptr().cast_mut(),
    };
    // SAFETY: PR_SET_SECCOMP reads the program through `filter`, which points
    // into `program`, alive for the call; the kernel copies it.
    let result = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &filter as *const libc::sock_fprog,
            0,
            0,
        )
    };
    if result == 0 {
        Ok(())
    } else {
        Err(ConfineError::Unenforceable {
            control: format!("seccomp ({what})"),
            why: std::io::Error::last_os_error().to_string(),
        })
    }
}

/// Install box's seccomp filter (`backend::seccomp::box_filter`, the same
/// table the executor installs on itself) on the calling thread, and with
/// `deny_ip` the IP filter after it; children and `execve` inherit both.
/// Needs no_new_privs (or `CAP_SYS_ADMIN`) first. The process stays dumpable
/// (the executor makes itself non-dumpable when it installs its own copy).
pub fn apply_seccomp(options: SeccompOptions) -> Result<(), ConfineError> {
    let program = seccomp::box_filter().map_err(|error| ConfineError::Failed {
        doing: "building box's seccomp filter".to_owned(),
        message: error,
    })?;
    let program: Vec<libc::sock_filter> = program
        .iter()
        .map(|instruction| libc::sock_filter {
            code: instruction.code,
            jt: instruction.jt,
            jf: instruction.jf,
            k: instruction.k,
        })
        .collect();
    install_filter(&program, "box's filter")?;
    if options.deny_ip {
        install_filter(&ip_filter(), "no IP sockets")?;
    }
    Ok(())
}

/// The seccomp mode of the calling thread (`Seccomp:` in `/proc/self/status`:
/// 0 none, 1 strict, 2 filter).
pub fn seccomp_mode() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/thread-self/status").ok()?;
    status.lines().find_map(|line| {
        line.strip_prefix("Seccomp:")
            .and_then(|value| value.trim().parse().ok())
    })
}

/// How many threads the calling process has (`Threads:` in `/proc/self/status`).
pub fn thread_count() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|line| {
        line.strip_prefix("Threads:")
            .and_then(|value| value.trim().parse().ok())
    })
}

/// Confine the executor process itself before it serves: writes only beneath
/// `root` and the temp directory (`TMPDIR`, else `/tmp`), reads the system and
/// `root`, no_new_privs. With `Required`, failing to enforce landlock is an
/// error naming the control; with `BestEffort` the result says what was
/// achieved.
///
/// Call it before any thread is started (before the Tokio runtime): landlock
/// binds the calling thread only, so with other threads already running the
/// confinement would not cover the children they spawn; `Required` then
/// refuses, `BestEffort` reports landlock as not enforced.
pub fn confine_executor(root: &Path, landlock: Requirement) -> Result<Confinement, String> {
    confine_executor_with(root, landlock, &[], &[], &[])
}

/// [`confine_executor`], with `extra_read` readable too (the unit's
/// `/run/secrets`), `extra_write` writable too (the unit's home, its own
/// `/tmp`, its volumes), and the pathname Unix sockets beneath
/// `unix_connect` connectable where landlock mediates that (the egress
/// proxy's directory).
pub fn confine_executor_with(
    root: &Path,
    landlock: Requirement,
    extra_read: &[PathBuf],
    extra_write: &[PathBuf],
    unix_connect: &[PathBuf],
) -> Result<Confinement, String> {
    let threads = thread_count().unwrap_or(1);
    if threads > 1 && landlock == Requirement::Required {
        return Err(format!(
            "landlock is required but the executor already runs {threads} threads; \
             confine_executor must run before the runtime starts"
        ));
    }
    set_no_new_privs().map_err(|error| error.to_string())?;
    let temp = std::env::temp_dir();
    let mut extra_read: Vec<PathBuf> = std::iter::once(root.to_path_buf())
        .chain(extra_read.iter().cloned())
        .collect();
    // The executor may re-execute itself (process tools); keep its own binary reachable.
    if let Ok(exe) = std::env::current_exe() {
        extra_read.push(exe);
    }
    let write: Vec<PathBuf> = [root.to_path_buf(), temp]
        .into_iter()
        .chain(extra_write.iter().cloned())
        .collect();
    let mut rules = landlock_rules(&extra_read, &write);
    rules.unix_connect = unix_connect.to_vec();
    let outcome = apply_landlock(&rules, landlock, 1).map_err(|error| error.to_string())?;
    Ok(Confinement {
        landlock_abi: outcome.abi,
        landlock_enforced: outcome.enforced && threads <= 1,
        no_new_privileges: no_new_privs(),
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use pretty_assertions::assert_eq;

    use super::*;

    #[test]
    fn rules_read_the_system_and_write_only_what_is_given() {
        let rules = landlock_rules(
            &[PathBuf::from("/opt/box")],
            &[PathBuf::from("/work/ws"), PathBuf::from("/tmp/unit")],
        );
        assert!(rules.read.contains(&PathBuf::from("/usr")));
        assert!(rules.read.contains(&PathBuf::from("/proc")));
        assert!(rules.read.contains(&PathBuf::from("/opt/box")));
        assert!(!rules.read.iter().any(|path| path.starts_with("/home")));
        assert!(!rules.read.iter().any(|path| path.starts_with("/root")));
        assert!(!rules.read.contains(&PathBuf::from("/dev")));
        assert!(!rules.read.contains(&PathBuf::from("/tmp")));
        let non_device: Vec<_> = rules
            .write
            .iter()
            .filter(|path| !path.starts_with("/dev"))
            .collect();
        assert_eq!(
            non_device,
            vec![&PathBuf::from("/work/ws"), &PathBuf::from("/tmp/unit")]
        );
        assert!(rules.write.contains(&PathBuf::from("/dev/null")));
        assert!(!rules.write.contains(&PathBuf::from("/dev")));
    }

    #[test]
    fn rlimits_follow_the_limits() {
        let limits = Limits {
            memory_bytes: 1 << 30,
            cpus: 1.0,
            pids: 64,
            tmp_bytes: 8 << 20,
            home_bytes: 64 << 20,
            nofile: 256,
            call_timeout: Duration::from_secs(1),
            idle: Duration::from_secs(1),
            lifetime: Duration::from_secs(1),
            // The rest (the start deadline) as a shipped profile has them.
            ..Limits::default()
        };
        assert_eq!(
            Rlimits::from_limits(&limits),
            Rlimits {
                nofile: 256,
                nproc: 64,
                data_bytes: 1 << 30,
                address_space_bytes: 2 << 30,
                fsize_bytes: 8 << 20,
                core_bytes: 0,
            }
        );
    }

    #[test]
    fn capabilities_parse_from_status() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapPrm:\t0000000000000001\n\
                      CapEff:\t0000000000200000\nCapBnd:\t000001ffffffffff\nCapAmb:\t0000000000000000\n";
        assert_eq!(
            parse_capabilities(status),
            Some(CapabilitySets {
                effective: 1 << 21,
                permitted: 1,
                inheritable: 0,
                bounding: 0x1ff_ffff_ffff,
                ambient: 0,
            })
        );
        assert_eq!(parse_capabilities("Name:\tx\n"), None);
    }

    #[test]
    fn capability_names_are_the_kernel_names() {
        assert_eq!(
            capability_names((1 << 21) | 1),
            vec!["CAP_CHOWN", "CAP_SYS_ADMIN"]
        );
        assert_eq!(
            capability_names((1 << 40) | (1 << 10)),
            vec!["CAP_NET_BIND_SERVICE", "CAP_CHECKPOINT_RESTORE"]
        );
        assert_eq!(capability_names(1 << 41), vec!["CAP_41"]);
        assert_eq!(capability_names(1 << 60), vec!["CAP_60"]);
        assert!(capability_names(0).is_empty());
    }

    #[test]
    fn landlock_required_above_the_kernel_abi_names_the_control() {
        let error = apply_landlock(&LandlockRules::default(), Requirement::Required, 1000)
            .expect_err("no kernel offers landlock ABI 1000");
        assert!(
            matches!(&error, ConfineError::Unenforceable { control, .. } if control == "landlock (ABI 1000)"),
            "{error}"
        );
    }

    /// Run `body` in a forked child (a fresh single-threaded process, so
    /// confining it leaves the test process alone) and return its exit code.
    fn in_child(body: impl FnOnce() -> i32) -> i32 {
        use nix::sys::wait::{WaitStatus, waitpid};
        use nix::unistd::ForkResult;
        // SAFETY: glibc's fork keeps malloc usable in the child; the child
        // only runs `body` and then `_exit`s, never returning into the harness.
        match unsafe { nix::unistd::fork() }.expect("fork") {
            ForkResult::Child => {
                let code = body();
                // SAFETY: ending the child without running the parent's atexit handlers.
                unsafe { libc::_exit(code) }
            }
            ForkResult::Parent { child } => match waitpid(child, None) {
                Ok(WaitStatus::Exited(_, code)) => code,
                status => panic!("child status {status:?}"),
            },
        }
    }

    #[test]
    fn confine_executor_writes_only_beneath_its_root_and_temp() {
        if landlock_abi() == 0 {
            eprintln!("LANDLOCK MISSING: confine_executor cannot be tested here");
            assert!(
                std::env::var_os("CI").is_none(),
                "landlock is missing under CI"
            );
            return;
        }
        // The child's temp directory (which confine_executor leaves writable)
        // is one of three siblings, so "outside" is outside it wherever the
        // checkout lives (a clone under /tmp included).
        // The checkout's `target` (absent when CARGO_TARGET_DIR points elsewhere).
        let parent = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target");
        std::fs::create_dir_all(&parent).unwrap();
        let base = tempfile::tempdir_in(&parent).unwrap();
        let root = tempfile::tempdir_in(base.path()).unwrap();
        let outside = tempfile::tempdir_in(base.path()).unwrap();
        let temp = tempfile::tempdir_in(base.path()).unwrap();
        let (root_path, outside_path) = (root.path().to_path_buf(), outside.path().to_path_buf());
        let temp_path = temp.path().to_path_buf();
        let temp_file = temp.path().join("box-confine-probe");
        let temp_probe = temp_file.clone();
        let code = in_child(move || {
            // SAFETY: a forked child of one thread; nothing else reads the
            // environment while it is changed.
            unsafe { std::env::set_var("TMPDIR", &temp_path) };
            let Ok(confinement) = confine_executor(&root_path, Requirement::Required) else {
                return 10;
            };
            if !confinement.landlock_enforced || !confinement.no_new_privileges {
                return 11;
            }
            if confinement.landlock_abi != landlock_abi() {
                return 12;
            }
            if std::fs::write(root_path.join("inside"), "x").is_err() {
                return 13;
            }
            if std::fs::write(&temp_probe, "x").is_err() {
                return 14;
            }
            if std::fs::write(outside_path.join("outside"), "x").is_ok() {
                return 15;
            }
            if std::fs::read_dir(&outside_path).is_ok() {
                return 16;
            }
            0
        });
        assert_eq!(code, 0, "see the child's return codes above");
        assert!(root.path().join("inside").exists());
        assert!(!outside.path().join("outside").exists());
        assert!(temp_file.exists());
        std::fs::remove_file(temp_file).unwrap();
    }

    #[test]
    fn confine_executor_refuses_required_landlock_with_threads_running() {
        let root = tempfile::tempdir().unwrap();
        let root_path = root.path().to_path_buf();
        let code = in_child(move || {
            let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
            let thread = std::thread::spawn(move || {
                let _ = stop_rx.recv();
            });
            let result = confine_executor(&root_path, Requirement::Required);
            drop(stop_tx);
            let _ = thread.join();
            match result {
                Err(message) if message.contains("threads") => 0,
                Err(_) => 20,
                Ok(_) => 21,
            }
        });
        assert_eq!(code, 0);
    }

    /// Run the classic-BPF subset `ip_filter` uses over one call.
    fn run_filter(program: &[libc::sock_filter], arch: u32, nr: u32, arg0: u32) -> u32 {
        let mut accumulator = 0u32;
        let mut pc = 0usize;
        loop {
            let instruction = program[pc];
            let code = u32::from(instruction.code);
            pc += 1;
            match code {
                0x20 => {
                    accumulator = match instruction.k {
                        0 => nr,
                        4 => arch,
                        16 => arg0,
                        other => panic!("load from offset {other}"),
                    }
                }
                0x15 => {
                    let taken = accumulator == instruction.k;
                    pc += usize::from(if taken {
                        instruction.jt
                    } else {
                        instruction.jf
                    });
                }
                0x06 => return instruction.k,
                other => panic!("unexpected instruction {other:#x}"),
            }
        }
    }

    #[test]
    fn the_ip_filter_refuses_ip_sockets_only() {
        let program = ip_filter();
        let allow = libc::SECCOMP_RET_ALLOW;
        let eperm = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
        let socket = libc::SYS_socket as u32;
        let x86_64 = AUDIT_ARCH_X86_64;
        assert_eq!(
            run_filter(&program, x86_64, socket, libc::AF_INET as u32),
            eperm
        );
        assert_eq!(
            run_filter(&program, x86_64, socket, libc::AF_INET6 as u32),
            eperm
        );
        assert_eq!(
            run_filter(&program, x86_64, socket, libc::AF_UNIX as u32),
            allow
        );
        assert_eq!(
            run_filter(&program, x86_64, socket, libc::AF_NETLINK as u32),
            allow
        );
        assert_eq!(
            run_filter(&program, x86_64, libc::SYS_read as u32, 2),
            allow
        );
        assert_eq!(run_filter(&program, 0x4000_0003, socket, 2), allow);
        for (index, instruction) in program.iter().enumerate() {
            let furthest = index + 1 + usize::from(instruction.jt.max(instruction.jf));
            assert!(
                furthest <= program.len(),
                "jump at {index} leaves the program"
            );
        }
    }

    #[test]
    fn seccomp_refuses_what_it_lists_in_a_child() {
        use nix::errno::Errno;
        use nix::sched::CloneFlags;
        use nix::sys::socket::{AddressFamily, SockFlag, SockType, socket};
        let code = in_child(|| {
            if set_no_new_privs().is_err()
                || apply_seccomp(SeccompOptions { deny_ip: true }).is_err()
            {
                return 30;
            }
            if seccomp_mode() != Some(2) {
                return 31;
            }
            let errno = || std::io::Error::last_os_error().raw_os_error();
            // SAFETY: keyctl(KEYCTL_GET_KEYRING_ID, ...) with integer arguments.
            let keyctl = unsafe { libc::syscall(libc::SYS_keyctl, 0, -3, 0) };
            if keyctl != -1 || errno() != Some(libc::EPERM) {
                return 32;
            }
            let probe = |family, kind| socket(family, kind, SockFlag::empty(), None);
            if probe(AddressFamily::Alg, SockType::SeqPacket).err() != Some(Errno::EPERM) {
                return 33;
            }
            if nix::sched::unshare(CloneFlags::CLONE_NEWUSER) != Err(Errno::EPERM) {
                return 34;
            }
            if probe(AddressFamily::Inet, SockType::Datagram).err() != Some(Errno::EPERM) {
                return 35;
            }
            // Ordinary work still works (the socket is closed when dropped).
            if probe(AddressFamily::Unix, SockType::Stream).is_err() {
                return 37;
            }
            if std::fs::read_to_string("/proc/self/status").is_err() {
                return 36;
            }
            0
        });
        assert_eq!(code, 0, "see the child's return codes above");
    }

    #[test]
    fn dropping_capabilities_leaves_none_and_reads_them_back() {
        let code = in_child(|| {
            let Ok(before) = capability_sets() else {
                return 40;
            };
            let Ok(after) = drop_capabilities() else {
                return 41;
            };
            if after.effective != 0
                || after.permitted != 0
                || after.inheritable != 0
                || after.ambient != 0
            {
                return 42;
            }
            // With CAP_SETPCAP the bounding set goes too; without it, it stays.
            let setpcap = before.effective & (1 << 8) != 0;
            if setpcap && after.bounding != 0 {
                return 43;
            }
            if !setpcap && after.bounding != before.bounding {
                return 44;
            }
            if capability_sets() != Ok(after) {
                return 45;
            }
            0
        });
        assert_eq!(code, 0, "see the child's return codes above");
    }

    #[test]
    fn landlock_off_applies_nothing() {
        let outcome = apply_landlock(&LandlockRules::default(), Requirement::Off, 1).unwrap();
        assert!(!outcome.enforced);
        assert_eq!(outcome.abi, landlock_abi());
    }
}
