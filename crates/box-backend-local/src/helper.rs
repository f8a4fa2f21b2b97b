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
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use nix::sched::CloneFlags;
use nix::sys::prctl;
use nix::sys::signal::Signal;

use box_confine::{self as sandbox, CapabilitySets, ConfineError, LandlockOutcome};
use box_policy::executor::ExecutorSpec;

mod mounts;
mod process;
mod wire;

use mounts::{
    VolumeSource, attach_volumes, bind_read_only, clone_tree, conceal, hide_host, kernel_paths,
    let_go_in_child, make_home, mount_own_ptys, mount_secrets, resolver_target,
};
use process::{InitHold, hold_unit, init, supervise, wait_for_init};
pub(crate) use wire::{
    Applied, Report, SandboxSpec, SecretValues, SpecEgress, SpecHome, SpecInit, SpecNetwork,
    SpecRequirement, SpecTmp, SpecUser, SpecVolume,
};
use wire::{Reporter, read_spec};

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

// The lib's tests build reports by hand.
#[cfg(test)]
pub(crate) use wire::{AppliedHomeReport, AppliedVolumeReport};

#[cfg(test)]
mod tests {
    use std::ffi::OsString;
    use std::path::PathBuf;

    use super::resolve_program;

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
}
