//! The init: the first process of a unit.
//!
//! In order: non-dumpable (before anything else, so no process of the unit's
//! uid can read its memory or `/proc/1/environ`, which keeps the unit key as
//! it was at exec whatever the init does to its environment afterwards);
//! the key from [`KEY_ENV`]; a child subreaper unless PID 1; signal handlers;
//! the bridges; the executor (stdin and stdout piped, stderr inherited, the
//! key left out of its environment); then the supervisor loop, which holds the
//! lease and the connection to the host and decides when the unit ends:
//!
//! - **lease lapse** (no renewal by the deadline): kill every process of the
//!   unit, report `leaseLapsed` if a host is connected, exit
//!   [`EXIT_LEASE_LAPSED`];
//! - **executor exit**: kill the rest, relay the executor's remaining output,
//!   report, exit with the executor's code (128 + signal if killed); while no
//!   host is connected this waits for one, until the lease lapses;
//! - **SIGTERM/SIGINT** (`docker stop`): forwarded to the executor, which gets
//!   [`TERMINATE_GRACE`] to exit before everything is killed; then as an
//!   executor exit, reported as `terminated`, except that a host that is not
//!   connected gets only another [`TERMINATE_GRACE`] to connect and hear it.
//!
//! While no host is connected the init reconnects every 250 ms, backing off to
//! 1 s, each time authenticating afresh.

mod bridge;
mod relay;
mod unit;

use std::os::fd::OwnedFd;
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::net::UnixStream;
use tokio::net::unix::pipe;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use self::relay::{StdinQueue, Uplink};
use self::unit::Reaper;
use crate::config::InitConfig;
use crate::handshake::{self, Established, HandshakeError};
use crate::lease::{self, Lease, RenewError};
use crate::protocol::{
    self, EndReason, EndReport, HostMessage, InitMessage, InitState, KEY_ENV, UnitKey,
};
use crate::{EXIT_LEASE_LAPSED, EXIT_START_FAILED};

/// Time the executor gets between a forwarded SIGTERM/SIGINT and SIGKILL
/// (Docker's own stop timeout, 10 s by default, is the outer bound).
pub const TERMINATE_GRACE: Duration = Duration::from_secs(5);

/// The longest wait between two looks at the lease. Timers run on the
/// monotonic clock, which stops in suspend; the lease is on `CLOCK_BOOTTIME`,
/// so after a resume the lapse is seen within this.
const LEASE_POLL: Duration = Duration::from_millis(500);

/// Reconnection back-off: first retry, and the cap.
const RECONNECT_FIRST: Duration = Duration::from_millis(250);
const RECONNECT_MAX: Duration = Duration::from_secs(1);

/// How long one connection attempt (connect and handshake) may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the init waits for its exit report to be written after a lapse.
const REPORT_GRACE: Duration = Duration::from_millis(500);

/// Events from the init's tasks to the supervisor.
#[derive(Debug)]
pub(crate) enum Event {
    /// A connection attempt finished.
    Connected {
        generation: u64,
        result: Result<Established, ConnectError>,
    },
    /// A lease renewal or release from the host.
    Control {
        generation: u64,
        message: HostMessage,
    },
    /// That connection is gone (read end or failed write).
    HostGone { generation: u64 },
    /// The executor's stdout ended and every whole line on it was relayed.
    OutputEnded,
    /// The exit report was written (or could not be).
    ReportWritten,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectError {
    #[error("cannot connect: {0}")]
    Connect(std::io::Error),
    #[error("{0}")]
    Handshake(#[from] HandshakeError),
    #[error("no handshake within {HANDSHAKE_TIMEOUT:?}")]
    Timeout,
}

/// Runs the init with `config`; returns its exit code. Call it first thing in
/// the process, before any thread starts: it makes the process non-dumpable
/// and reads the unit key from [`KEY_ENV`] (the key is in the exec-time
/// environment until then, readable by the same uid through `/proc`).
pub fn run(config: InitConfig) -> i32 {
    if let Err(error) = nix::sys::prctl::set_dumpable(false) {
        tracing::error!(%error, "box init: cannot make the init non-dumpable");
        return EXIT_START_FAILED;
    }
    let key = match std::env::var(KEY_ENV) {
        Ok(text) => match UnitKey::from_hex(&text) {
            Ok(key) => key,
            Err(error) => {
                tracing::error!("box init: {KEY_ENV}: {error}");
                return EXIT_START_FAILED;
            }
        },
        Err(_) => {
            tracing::error!(
                "box init: {KEY_ENV} is not set; the host hands the unit key to the init there"
            );
            return EXIT_START_FAILED;
        }
    };
    // The unit's home, filled with the image's before anything of the unit
    // runs: a home the image's tools cannot find their configuration in
    // would fail later and less clearly, so a seed that does not unpack
    // fails the start.
    if let Some(home) = &config.home {
        let seed = config.socket.with_file_name(protocol::HOME_SEED);
        match crate::home::seed(&seed, home) {
            Ok(entries) => {
                tracing::debug!(entries, home = %home.display(), "box init: the image's home unpacked")
            }
            Err(error) => {
                tracing::error!("box init: the unit's home: {error}");
                return EXIT_START_FAILED;
            }
        }
        for (relative, target) in &config.links {
            if let Err(error) = crate::home::link(home, relative, target) {
                tracing::error!("box init: a volume in the unit's home: {error}");
                return EXIT_START_FAILED;
            }
        }
    }
    let pid1 = std::process::id() == 1;
    run_supervisor(config, key, pid1, None)
}

/// Become the unit's reaper (a subreaper unless pid 1) and run the
/// supervisor on a runtime of its own until the unit ends; its exit code.
fn run_supervisor(config: InitConfig, key: UnitKey, pid1: bool, started: Option<Started>) -> i32 {
    if !pid1 && let Err(error) = nix::sys::prctl::set_child_subreaper(true) {
        tracing::error!(%error, "box init: cannot become a child subreaper");
        return EXIT_START_FAILED;
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::error!(%error, "box init: cannot start the runtime");
            return EXIT_START_FAILED;
        }
    };
    let code = runtime.block_on(async move {
        match Supervisor::start(config, key, pid1, started) {
            Ok(supervisor) => supervisor.run().await,
            Err(error) => {
                tracing::error!("box init: {error}");
                EXIT_START_FAILED
            }
        }
    });
    runtime.shutdown_timeout(Duration::from_millis(100));
    code
}

/// A unit's first process started by someone else (the local backend's
/// sandbox helper forks it, confined, before it calls [`supervise`]): its
/// pid, and the host-side ends of its stdin and stdout.
#[derive(Debug)]
pub struct Started {
    /// The process's pid; it is a child of the caller.
    pub pid: i32,
    /// Its stdin (the caller's write end of the pipe).
    pub stdin: OwnedFd,
    /// Its stdout (the caller's read end of the pipe).
    pub stdout: OwnedFd,
}

/// Runs the init's supervisor over `started` instead of spawning the
/// executor: the lease, the relay to the host's socket (`config.socket`,
/// which may be relative to the working directory), reaping and the signal
/// duties, exactly as [`run`] does; `config.executor` is not used. The caller
/// holds `key` (never in an environment) and has made itself non-dumpable;
/// this process becomes a child subreaper. Call it before any thread starts.
/// Returns the exit code.
pub fn supervise(config: InitConfig, key: UnitKey, started: Started) -> i32 {
    run_supervisor(config, key, false, Some(started))
}

struct Signals {
    child: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

/// What a handshake reports, kept current by the supervisor and read when the
/// proof is sent.
#[derive(Debug, Clone)]
struct Status {
    lease: Lease,
    executor_exit: Option<crate::protocol::ExitReport>,
}

enum Connection {
    Idle {
        retry_at: Instant,
    },
    Connecting,
    Connected {
        generation: u64,
        downlink: JoinHandle<()>,
    },
}

struct Supervisor {
    config: InitConfig,
    key: UnitKey,
    pid1: bool,
    lease: Lease,
    status: watch::Sender<Status>,
    reaper: Reaper,
    executor: Pid,
    signals: Signals,
    stdin: StdinQueue,
    uplink: mpsc::UnboundedSender<Uplink>,
    events: mpsc::Sender<Event>,
    inbox: mpsc::Receiver<Event>,
    connection: Connection,
    generation: u64,
    backoff: Duration,
    /// Whether a signal asked the unit to stop.
    terminating: bool,
    /// After a stop signal: when to kill the executor if it has not exited,
    /// or, once it has, when to stop waiting for a host to hear the report.
    stop_at: Option<Instant>,
    killed: u32,
    /// Whether the rest of the unit was killed after the executor exited.
    others_killed: bool,
    output_ended: bool,
    report_sent: bool,
}

impl Supervisor {
    /// Everything up to the loop: handlers, bridges, the executor, the tasks.
    fn start(
        config: InitConfig,
        key: UnitKey,
        pid1: bool,
        started: Option<Started>,
    ) -> Result<Self, String> {
        let lease = Lease::new(lease::boottime_now(), config.lease);
        // Handlers first, so no SIGCHLD or SIGTERM after the spawn is missed.
        let install = |kind: SignalKind, name: &str| {
            signal(kind).map_err(|error| format!("cannot handle {name}: {error}"))
        };
        let signals = Signals {
            child: install(SignalKind::child(), "SIGCHLD")?,
            terminate: install(SignalKind::terminate(), "SIGTERM")?,
            interrupt: install(SignalKind::interrupt(), "SIGINT")?,
        };
        bridge::start(&config.bridges).map_err(|error| error.to_string())?;
        let (executor, stdin, stdout) = match started {
            None => spawn_executor(&config)?,
            Some(Started { pid, stdin, stdout }) => {
                let stdin = pipe::Sender::from_owned_fd(stdin)
                    .map_err(|error| format!("the unit's stdin: {error}"))?;
                let stdout = pipe::Receiver::from_owned_fd(stdout)
                    .map_err(|error| format!("the unit's stdout: {error}"))?;
                (Pid::from_raw(pid), stdin, stdout)
            }
        };
        tracing::info!(
            unit = config.unit,
            pid = executor.as_raw(),
            pid1,
            "the executor started"
        );
        let (events, inbox) = mpsc::channel(64);
        // Unbounded: the supervisor must never wait on the uplink (which may
        // be stuck writing to a slow host); what queues is a few structural
        // commands and one answer per renewal.
        let (uplink, commands) = mpsc::unbounded_channel();
        tokio::spawn(relay::uplink(stdout, commands, events.clone()));
        let status = watch::Sender::new(Status {
            lease: lease.clone(),
            executor_exit: None,
        });
        Ok(Self {
            status,
            reaper: Reaper::new(pid1, executor),
            stdin: StdinQueue::start(stdin),
            config,
            key,
            pid1,
            lease,
            executor,
            signals,
            uplink,
            events,
            inbox,
            connection: Connection::Idle {
                retry_at: Instant::now(),
            },
            generation: 0,
            backoff: RECONNECT_FIRST,
            terminating: false,
            stop_at: None,
            killed: 0,
            others_killed: false,
            output_ended: false,
            report_sent: false,
        })
    }

    async fn run(mut self) -> i32 {
        // A child that ended before the handler was polled is reaped here.
        self.reaper.reap();
        self.publish();
        loop {
            if self.reaper.executor_exit.is_some() && !self.report_sent {
                if !self.others_killed {
                    self.others_killed = true;
                    self.killed += self.reaper.kill_all().await;
                    self.publish();
                }
                if self.output_ended {
                    self.send_report(self.end_reason());
                }
            }
            let now = lease::boottime_now();
            if self.lease.has_lapsed(now) {
                return self.lapse().await;
            }
            let lease_check = self.lease.remaining(now).min(LEASE_POLL);
            let retry_at = match self.connection {
                Connection::Idle { retry_at } => Some(retry_at),
                _ => None,
            };
            tokio::select! {
                () = tokio::time::sleep(lease_check) => {}
                Some(()) = self.signals.child.recv() => {
                    self.reaper.reap();
                    self.publish();
                }
                Some(()) = self.signals.terminate.recv() => self.terminate(Signal::SIGTERM),
                Some(()) = self.signals.interrupt.recv() => self.terminate(Signal::SIGINT),
                () = sleep_until_some(self.stop_at) => {
                    if self.reaper.executor_exit.is_none() {
                        tracing::warn!("the executor did not exit within {TERMINATE_GRACE:?} of the signal; killing the unit");
                        self.killed += self.reaper.kill_all().await;
                        self.reaper.reap();
                        self.publish();
                        // The same again for a host to hear the report.
                        self.stop_at = Some(Instant::now() + TERMINATE_GRACE);
                    } else if matches!(self.connection, Connection::Connected { .. }) {
                        // A host is there: the report follows the output.
                        self.stop_at = None;
                    } else {
                        tracing::info!("no host connected to hear the report; ending");
                        return self.exit_code();
                    }
                }
                () = sleep_until_some(retry_at) => self.connect(),
                Some(event) = self.inbox.recv() => {
                    if let Some(code) = self.handle(event) {
                        return code;
                    }
                }
            }
        }
    }

    fn end_reason(&self) -> EndReason {
        if self.terminating {
            EndReason::Terminated
        } else {
            EndReason::ExecutorExited
        }
    }

    fn exit_code(&self) -> i32 {
        self.reaper
            .executor_exit
            .map_or(EXIT_START_FAILED, |exit| exit.as_exit_code())
    }

    fn send_report(&mut self, reason: EndReason) {
        let exit_code = match reason {
            EndReason::LeaseLapsed => EXIT_LEASE_LAPSED,
            _ => self.exit_code(),
        };
        let report = InitMessage::Ended(EndReport {
            reason,
            executor: self.reaper.executor_exit,
            killed: self.killed,
            exit_code,
        });
        self.command(Uplink::Report(protocol::encode_control(&report)));
        self.report_sent = true;
    }

    /// The lease lapsed: kill everything, report if a host is there to hear
    /// it, exit.
    async fn lapse(mut self) -> i32 {
        tracing::warn!(unit = self.config.unit, "the lease lapsed; ending the unit");
        self.killed += self.reaper.kill_all().await;
        if !self.report_sent {
            self.send_report(EndReason::LeaseLapsed);
        }
        if matches!(self.connection, Connection::Connected { .. }) {
            let deadline = Instant::now() + REPORT_GRACE;
            while let Ok(Some(event)) = tokio::time::timeout_at(deadline, self.inbox.recv()).await {
                if matches!(event, Event::ReportWritten) {
                    break;
                }
            }
        }
        EXIT_LEASE_LAPSED
    }

    fn terminate(&mut self, signal: Signal) {
        if self.terminating {
            // Asked twice: stop waiting.
            self.stop_at = Some(Instant::now());
            return;
        }
        tracing::info!(%signal, "asked to stop; forwarding to the executor");
        self.terminating = true;
        self.stop_at = Some(Instant::now() + TERMINATE_GRACE);
        if self.reaper.executor_exit.is_none()
            && let Err(error) = kill(self.executor, signal)
        {
            tracing::warn!(%error, "cannot forward the signal to the executor");
        }
    }

    /// Starts a connection attempt; its result arrives as an event.
    fn connect(&mut self) {
        self.generation += 1;
        let generation = self.generation;
        self.connection = Connection::Connecting;
        let status = self.status.subscribe();
        let pid1 = self.pid1;
        let executor_pid = self.executor.as_raw();
        let state = move || {
            let status = status.borrow();
            let remaining = status.lease.remaining(lease::boottime_now());
            InitState {
                epoch: status.lease.epoch(),
                lease_remaining_ms: u64::try_from(remaining.as_millis()).unwrap_or(u64::MAX),
                executor_pid,
                executor_exit: status.executor_exit,
                pid1,
            }
        };
        let socket = self.config.socket.clone();
        let key = self.key.clone();
        let unit = self.config.unit.clone();
        let events = self.events.clone();
        tokio::spawn(async move {
            let attempt = async {
                let stream = UnixStream::connect(&socket)
                    .await
                    .map_err(ConnectError::Connect)?;
                Ok(handshake::init_side(stream, &key, &unit, state).await?)
            };
            let result = tokio::time::timeout(HANDSHAKE_TIMEOUT, attempt)
                .await
                .unwrap_or(Err(ConnectError::Timeout));
            let _ = events.send(Event::Connected { generation, result }).await;
        });
    }

    /// Handles one event; returns the exit code when the unit is done.
    fn handle(&mut self, event: Event) -> Option<i32> {
        match event {
            Event::Connected { generation, result } if generation == self.generation => {
                match result {
                    Ok(Established { reader, writer }) => {
                        tracing::info!(generation, "connected to the host");
                        self.backoff = RECONNECT_FIRST;
                        let downlink = tokio::spawn(relay::downlink(
                            generation,
                            reader,
                            self.stdin.clone(),
                            self.events.clone(),
                        ));
                        self.command(Uplink::Attach { generation, writer });
                        self.connection = Connection::Connected {
                            generation,
                            downlink,
                        };
                    }
                    Err(error) => {
                        match &error {
                            ConnectError::Handshake(HandshakeError::BadProof(_)) => {
                                tracing::warn!(%error, "the peer on the host socket is not the host; not relaying to it");
                            }
                            _ => tracing::debug!(%error, "connecting to the host failed"),
                        }
                        self.idle();
                    }
                }
            }
            Event::Connected { .. } => {}
            Event::Control {
                generation,
                message,
            } if self.is_current(generation) => match message {
                HostMessage::Lease { ttl_ms, epoch } => {
                    let now = lease::boottime_now();
                    match self.lease.renew(now, Duration::from_millis(ttl_ms), epoch) {
                        Ok(remaining) => {
                            self.publish();
                            let answer = InitMessage::Renewed {
                                epoch,
                                remaining_ms: u64::try_from(remaining.as_millis())
                                    .unwrap_or(u64::MAX),
                            };
                            self.command(Uplink::Control(protocol::encode_control(&answer)));
                        }
                        Err(RenewError::Stale { epoch, current }) => {
                            tracing::warn!(
                                epoch,
                                current,
                                "refused a renewal from a fenced-off host"
                            );
                            let answer = InitMessage::Rejected { epoch, current };
                            self.command(Uplink::Control(protocol::encode_control(&answer)));
                        }
                        // The loop acts on the lapse next.
                        Err(RenewError::Lapsed) => {}
                    }
                }
                HostMessage::Release {} => {
                    tracing::info!(
                        generation,
                        "the host released the unit; waiting for the next host"
                    );
                    self.command(Uplink::Release { generation });
                    self.drop_connection();
                }
                _ => {}
            },
            Event::Control { .. } => {}
            Event::HostGone { generation } if self.is_current(generation) => {
                tracing::info!(generation, "the host connection ended; reconnecting");
                self.command(Uplink::Detach { generation });
                self.drop_connection();
            }
            Event::HostGone { .. } => {}
            Event::OutputEnded => self.output_ended = true,
            Event::ReportWritten => return Some(self.exit_code()),
        }
        None
    }

    /// Makes the lease and the executor's exit visible to handshakes.
    fn publish(&self) {
        self.status.send_replace(Status {
            lease: self.lease.clone(),
            executor_exit: self.reaper.executor_exit,
        });
    }

    fn is_current(&self, generation: u64) -> bool {
        matches!(self.connection, Connection::Connected { generation: current, .. } if current == generation)
    }

    fn drop_connection(&mut self) {
        if let Connection::Connected { downlink, .. } = &self.connection {
            downlink.abort();
        }
        self.idle();
    }

    fn idle(&mut self) {
        self.connection = Connection::Idle {
            retry_at: Instant::now() + self.backoff,
        };
        self.backoff = (self.backoff * 2).min(RECONNECT_MAX);
    }

    fn command(&self, command: Uplink) {
        // Fails only once the uplink has stopped (after the report).
        let _ = self.uplink.send(command);
    }
}

async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Starts the executor: its own process group, stdin and stdout piped, stderr
/// inherited, the unit key removed from its environment.
fn spawn_executor(config: &InitConfig) -> Result<(Pid, pipe::Sender, pipe::Receiver), String> {
    let (program, arguments) = config
        .executor
        .split_first()
        .ok_or_else(|| "no executor command".to_owned())?;
    let mut command = Command::new(program);
    command
        .args(arguments)
        .env_remove(KEY_ENV)
        .envs(
            config
                .executor_env
                .iter()
                .map(|(name, value)| (name, value)),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut child = command.spawn().map_err(|error| {
        format!(
            "cannot start the executor {}: {error}",
            program.to_string_lossy()
        )
    })?;
    let pid = Pid::from_raw(
        i32::try_from(child.id()).map_err(|_| "executor pid out of range".to_owned())?,
    );
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err("the executor's stdio was not piped".to_owned());
    };
    let stdin = pipe::Sender::from_owned_fd(OwnedFd::from(stdin))
        .map_err(|error| format!("the executor's stdin: {error}"))?;
    let stdout = pipe::Receiver::from_owned_fd(OwnedFd::from(stdout))
        .map_err(|error| format!("the executor's stdout: {error}"))?;
    // The child is reaped by `Reaper` (waitpid(-1)), never through `child`.
    drop(child);
    Ok((pid, stdin, stdout))
}
