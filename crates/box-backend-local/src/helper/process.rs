//! The unit's processes under the helper: its init (pid 1, or the
//! subreaper), the helper's hold on a host's unit, waiting and killing.

use std::ffi::{CString, OsString};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::ExitCode;

use nix::sys::prctl;
use nix::sys::signal::Signal;
use nix::unistd::Pid;

use box_confine as sandbox;

use super::mounts::{conceal, kernel_paths};
use super::wire::{Applied, Report, Reporter, SandboxSpec, SpecInit};
use super::{
    REFUSED_EXIT, confine, exec, failed, new_session, refuse, release_stdio, run_executor_here,
};

/// The init side, ready before any namespace: the spec, the key, and a
/// handle on the run directory.
pub(super) struct InitHold {
    pub(super) spec: SpecInit,
    pub(super) key: box_init::protocol::UnitKey,
    pub(super) dir: OwnedFd,
}

impl InitHold {
    pub(super) fn open(spec: &SpecInit) -> Result<Self, String> {
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

/// The helper of a host's unit, outside its confinement: box-init's
/// supervisor over the init (`child`), holding the lease and relaying CMD's
/// stdio to the host's socket in the run directory, reached relative to this
/// process's working directory (the run directory's handle), so no path of
/// the host need be visible in the unit's mount namespace. Ends the way
/// box-init does: the init's exit code, or [`box_init::EXIT_LEASE_LAPSED`]
/// once it ended the unit for a lapsed lease.
pub(super) fn hold_unit(
    child: libc::pid_t,
    init: InitHold,
    stdin: OwnedFd,
    stdout: OwnedFd,
) -> ExitCode {
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
pub(super) fn wait_for_init(child: libc::pid_t, mut signal_pipe: File) -> ExitCode {
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
pub(super) fn die_by(signal: libc::c_int) {
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
pub(super) fn waitpid_raw(pid: libc::pid_t, flags: libc::c_int) -> (libc::pid_t, libc::c_int) {
    let mut status = 0;
    // SAFETY: waitpid writes the status into a local.
    let result = unsafe { libc::waitpid(pid, &mut status, flags) };
    (result, status)
}

pub(super) fn wait_pid(pid: libc::pid_t) -> libc::c_int {
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
pub(super) fn init(
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
pub(super) fn supervise(
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
pub(super) fn kill_children() {
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
pub(super) fn children_of(parent: u32) -> Vec<libc::pid_t> {
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
pub(super) fn parent_pid(stat: &str) -> Option<u32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::parent_pid;

    #[test]
    fn the_parent_pid_is_read_past_the_command_name() {
        assert_eq!(parent_pid("42 (sh) S 7 42 42 0"), Some(7));
        assert_eq!(parent_pid("42 (a b) c) R 9 1 1"), Some(9));
        assert_eq!(parent_pid("garbage"), None);
    }
}
