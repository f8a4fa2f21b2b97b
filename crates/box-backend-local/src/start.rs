//! A unit's start: its directories named and made, the helper spawned with
//! its spec on stdin, its report read, its connection accepted, its record
//! written; undone whole when it fails or is dropped (`StartGuard`).

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::io::AsyncBufReadExt;
use tokio::sync::watch;

use crate::helper::Report;

use box_backend::environment::UnitEnvironment;
use box_backend::lifecycle;
use box_backend::{Backend, BackendError, SessionLabel, StartedUnit, UnitWiring};
use box_policy::executor::{BIND_ON_STDIN_VAR, SECRETS_DIR};
use box_policy::plan::{NetworkMode, UnitSpec};

use crate::ended::unit_ended;
use crate::envelope::{delivered_secrets, envelope};
use crate::spec::{Layout, executor_command, sandbox_spec, unit_environment};
use crate::volumes::prepare_volumes;
use crate::{
    BORROWED_OBJECTS, CONFINE_TIMEOUT, LocalBackend, LocalUnit, REAP_TIMEOUT, kill_group,
    remove_dir,
};
use crate::{helper, lease, pool, private};

impl LocalBackend {
    /// [`start_command_wired`](Self::start_command_wired), or with `pooled`
    /// a unit for a pool: no session's secrets (their tmpfs mounted where
    /// the plan has secrets, empty), its executor waiting for a bind line
    /// (`BIND_ON_STDIN_VAR`), its record marked with its pool; then also
    /// what a bind needs again.
    pub(crate) async fn start_for(
        &self,
        session: &SessionLabel,
        spec: &UnitSpec,
        wiring: &UnitWiring,
        command: Vec<OsString>,
        pooled: bool,
    ) -> Result<(StartedUnit, Option<pool::PoolDetail>), BackendError> {
        // An egress unit without its proxy would have no way out at all, and a
        // proxy wired into a unit that did not ask for one would be a way out.
        match (spec.network.mode, &wiring.egress) {
            (NetworkMode::Egress, None) => {
                return Err(BackendError::Unenforceable {
                    unit: spec.name.clone(),
                    control: "network egress allow list".to_owned(),
                    why: "no egress proxy was wired into the unit (a host starts one per egress unit)".to_owned(),
                });
            }
            (NetworkMode::None | NetworkMode::Bridge, Some(_)) => {
                return Err(BackendError::Other {
                    unit: spec.name.clone(),
                    doing: "wiring the egress proxy".to_owned(),
                    message: format!(
                        "the unit's network is {}, not egress",
                        spec.network.mode.as_str()
                    ),
                });
            }
            _ => {}
        }
        // The borrowed objects are bound read-only in the unit's own mount
        // namespace; without one they would be the host's, writable where
        // landlock is not enforced.
        if wiring.objects.is_some()
            && let Err(why) = self.objects_place(spec)
        {
            return Err(BackendError::Unenforceable {
                unit: spec.name.clone(),
                control: BORROWED_OBJECTS.to_owned(),
                why,
            });
        }
        if let Err(refusals) = self.check(spec)
            && let Some(first) = refusals.into_iter().next()
        {
            return Err(first.into());
        }
        let mut layout = Layout::name(&self.options.temp_root, session, spec)?;
        layout.volumes = prepare_volumes(&self.volumes, session, spec)?;
        let runtime_dir = wiring
            .runtime_dir
            .clone()
            .unwrap_or_else(box_backend::default_runtime_dir);
        {
            let mut dirs = self
                .runtime_dirs
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if !dirs.contains(&runtime_dir) {
                dirs.push(runtime_dir.clone());
            }
        }
        let run_dir =
            lease::create_run_dir(&runtime_dir).map_err(|message| BackendError::Other {
                unit: spec.name.clone(),
                doing: "making the unit's run directory".to_owned(),
                message,
            })?;
        // From here on, a failure or a dropped future undoes the start.
        let mut guard = StartGuard {
            temp: layout.temp.clone(),
            run_dir: run_dir.clone(),
            group: None,
            finished: false,
        };
        let mut environment = unit_environment(std::env::vars_os(), spec, &layout);
        // A pooled unit has no session yet: no secret's value reaches it
        // before a claim (the bind line carries them), though their tmpfs
        // is mounted where the plan has secrets.
        let pool = pooled.then_some(!spec.env_secrets.is_empty());
        if pooled {
            environment.secrets.clear();
        }
        // Only the secrets the host has are delivered (a missing one is said
        // in the log, like a missing passed variable).
        let delivered = environment.delivered(spec);
        let spec = delivered.as_ref();
        let executor = command.is_empty();
        let command = if executor {
            executor_command(&self.options.box_exe, spec, &layout, wiring)
        } else {
            command
        };
        let started = self
            .launch(
                session,
                spec,
                &layout,
                (command, executor, pool),
                (environment, wiring),
                &mut guard,
            )
            .await?;
        guard.finished = true;
        Ok(started)
    }

    pub(crate) async fn launch(
        &self,
        session: &SessionLabel,
        spec: &UnitSpec,
        layout: &Layout,
        // CMD, whether it is box's executor (which delivers the secrets),
        // and for a pooled unit whether it gets the secrets' tmpfs.
        (command, executor, pool): (Vec<OsString>, bool, Option<bool>),
        // With what the host wires into it (egress, borrowed objects, the
        // unit it was forked from, for `box units ls`).
        (environment, wiring): (UnitEnvironment, &UnitWiring),
        // Also holds the unit's run directory.
        guard: &mut StartGuard,
    ) -> Result<(StartedUnit, Option<pool::PoolDetail>), BackendError> {
        let run_dir = guard.run_dir.clone();
        let run_dir = run_dir.as_path();
        let unit = spec.name.clone();
        let other = BackendError::other_for(&unit);
        if !environment.missing.is_empty() {
            let missing = &environment.missing;
            let missing = missing.join(", ");
            tracing::info!(unit, %missing, "variables to pass are not set on the host");
        }
        let mut sandbox_spec = sandbox_spec(spec, layout, &environment, &self.options, wiring)?;
        if let Some(secrets) = pool {
            sandbox_spec.secrets_dir = secrets.then(|| PathBuf::from(SECRETS_DIR));
            sandbox_spec
                .env
                .push((BIND_ON_STDIN_VAR.to_owned(), "1".to_owned()));
        }
        // The unit's init side: the helper holds the lease and relays the
        // executor's stdio to this socket with box-init's protocol, proving
        // the unit's key, and ends the unit when the renewals stop.
        let listener = box_init::host::bind(run_dir)
            .map_err(|error| other("listening for the unit's helper", error.to_string()))?;
        let key = box_init::protocol::UnitKey::generate();
        lifecycle::write_private(&run_dir.join(lease::KEY), key.to_hex().as_bytes())
            .map_err(|message| other("keeping the unit's key", message))?;
        let identity = format!("{}/{}/{}", session.instance, session.session, unit);
        sandbox_spec.init = Some(helper::SpecInit {
            run_dir: run_dir.to_owned(),
            unit: identity.clone(),
            key: key.to_hex(),
            ttl_ms: u64::try_from(spec.lease.as_millis()).unwrap_or(u64::MAX),
        });
        // A unit that is the host's uid 0 gets the host's root-only files
        // covered. Finding them (a check of the last walk, or a walk) runs
        // while the helper is being executed.
        let private = nix::unistd::geteuid().is_root().then(|| {
            let state = Arc::clone(&self.private_files);
            tokio::task::spawn_blocking(move || private_files(&state))
        });

        // The helper reads its spec from stdin and reports on stdout; then
        // the executor's protocol goes over the run directory's socket. No
        // extra fds, so no `pre_exec`, so the spawn stays a cheap
        // vfork-style `posix_spawn` whatever the host's size. No `--parent`:
        // the unit outlives this host by its lease, so a later one can
        // re-adopt it.
        let mut helper = std::process::Command::new(&self.options.box_exe);
        helper
            .arg("sandbox")
            .arg("--spec-stdin")
            .arg("--report-stdout")
            .arg("--")
            .args(&command)
            .env_clear()
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        // The start's steps as the host sees them, for its traces: the
        // helper spawned, the unit confined (the helper's namespaces, mounts
        // and confinement, until its report), its connection back.
        let spawning = SystemTime::now();
        let (spawned_tx, spawned_rx) = tokio::sync::oneshot::channel();
        let (exited_tx, exited_rx) = watch::channel(None);
        // The thread that spawns the helper waits for it (while this host
        // lives), so its exit status is known.
        std::thread::Builder::new()
            .name(format!("box-local-{unit}"))
            // It only spawns and waits: a small stack keeps a host with many
            // units lean.
            .stack_size(256 * 1024)
            .spawn(move || {
                let mut child = match helper.spawn() {
                    Ok(child) => child,
                    Err(error) => {
                        let _ = spawned_tx.send(Err(error));
                        return;
                    }
                };
                let stdin = child.stdin.take();
                let id = child.id();
                if spawned_tx
                    .send(Ok((stdin, child.stdout.take(), child.stderr.take(), id)))
                    .is_err()
                {
                    // The start was dropped before it learnt of the helper:
                    // nobody else can end this unit.
                    kill_group(i32::try_from(id).unwrap_or(i32::MAX));
                }
                let status = loop {
                    match child.wait() {
                        Ok(status) => break Some(status),
                        Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(_) => break None,
                    }
                };
                let _ = exited_tx.send(Some(status));
            })
            .map_err(|error| other("starting the unit's thread", error.to_string()))?;
        let spawned = spawned_rx
            .await
            .map_err(|_| other("spawning the sandbox helper", "thread ended".to_owned()))
            .and_then(|spawned| {
                spawned.map_err(|error| {
                    other(
                        "spawning the sandbox helper",
                        format!("{}: {error}", self.options.box_exe.display()),
                    )
                })
            });
        wiring.phase("spawn", spawning, spawned.is_ok());
        let (stdin, stdout, stderr, pid) = spawned?;
        let group = i32::try_from(pid).unwrap_or(i32::MAX);
        guard.group = Some(group);
        let undo = |error: BackendError| {
            let mut exited = exited_rx.clone();
            async move {
                kill_group(group);
                let _ = tokio::time::timeout(REAP_TIMEOUT, exited.wait_for(Option::is_some)).await;
                error
            }
        };
        let (Some(stdin), Some(stdout), Some(stderr)) = (stdin, stdout, stderr) else {
            return Err(undo(other("spawning the sandbox helper", "no stdio".to_owned())).await);
        };
        // The unit's stderr (the helper's refusals, the executor's logs) goes
        // to the host's log under the unit's name, never raw to the host's
        // terminal: its bytes are the unit's to choose.
        match tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(stderr)) {
            Ok(stderr) => {
                tokio::spawn(log_stderr(stderr, session.session.clone(), unit.clone()));
            }
            Err(error) => {
                return Err(
                    undo(other("attaching the executor's stderr", error.to_string())).await,
                );
            }
        }
        let attached = tokio::net::unix::pipe::Sender::from_owned_fd(OwnedFd::from(stdin))
            .and_then(|stdin| {
                let stdout =
                    tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(stdout))?;
                Ok((stdin, stdout))
            });
        let (mut stdin, stdout) = match attached {
            Ok(attached) => attached,
            Err(error) => {
                return Err(undo(other("attaching the helper's stdio", error.to_string())).await);
            }
        };
        // The directories are made while the helper is being executed (the
        // slowest part of a start, on another core), and the spec, which
        // names them, is sent once they exist.
        if let Err(error) = layout.make(spec) {
            return Err(undo(error).await);
        }
        if let Some(private) = private {
            match private.await {
                Ok(walk) => sandbox_spec.conceal = walk.found().to_vec(),
                Err(error) => {
                    let error = other("finding the host's root-only files", error.to_string());
                    return Err(undo(error).await);
                }
            }
        }
        let spec_json = match serde_json::to_vec(&sandbox_spec) {
            Ok(json) => json,
            Err(error) => {
                return Err(undo(other("encoding the sandbox spec", error.to_string())).await);
            }
        };
        let confining = SystemTime::now();
        let mut message = format!("{}\n", spec_json.len()).into_bytes();
        message.extend_from_slice(&spec_json);
        if let Err(error) = tokio::io::AsyncWriteExt::write_all(&mut stdin, &message).await {
            return Err(undo(other("sending the sandbox spec", error.to_string())).await);
        }
        drop(stdin);
        // The one line on stdout is the helper's report.
        let mut stdout = tokio::io::BufReader::new(stdout);
        let mut line = String::new();
        let first = tokio::time::timeout(CONFINE_TIMEOUT, stdout.read_line(&mut line)).await;
        drop(stdout);
        let applied = match first {
            Ok(Ok(0)) => Err(other(
                "confining the unit",
                "the helper exited without reporting (see the host's stderr)".to_owned(),
            )),
            Ok(Ok(_)) => match serde_json::from_str::<Report>(&line) {
                Ok(Report::Confined(applied)) => Ok(*applied),
                Ok(Report::Refused { control, why }) => Err(BackendError::Unenforceable {
                    unit: unit.clone(),
                    control,
                    why,
                }),
                Ok(Report::Failed { doing, message }) => Err(BackendError::Other {
                    unit: unit.clone(),
                    doing,
                    message,
                }),
                Err(error) => Err(other(
                    "reading the helper's report",
                    format!("{error}: {}", line.trim_end()),
                )),
            },
            Ok(Err(error)) => Err(other("reading the helper's report", error.to_string())),
            Err(_) => Err(other(
                "confining the unit",
                format!("no report within {}s", CONFINE_TIMEOUT.as_secs()),
            )),
        };
        wiring.phase("confine", confining, applied.is_ok());
        let applied = match applied {
            Ok(applied) => applied,
            Err(error) => return Err(undo(error).await),
        };
        // The helper connects right after its report; a helper that ends
        // first ends the wait.
        let connecting = SystemTime::now();
        let accepted = {
            let mut exited = exited_rx.clone();
            let helper_ended = async move {
                let _ = exited.wait_for(Option::is_some).await;
            };
            lifecycle::accept(&listener, (&key, &identity), CONFINE_TIMEOUT, helper_ended).await
        };
        wiring.phase("connect", connecting, accepted.is_ok());
        let connected = match accepted {
            Ok(connected) => connected,
            Err(unconnected) => {
                let message = match unconnected {
                    lifecycle::Unconnected::Ended => {
                        "the helper ended before it connected (see the host's log)".to_owned()
                    }
                    lifecycle::Unconnected::Failed(message) => message,
                };
                return Err(undo(other("connecting to the unit's helper", message)).await);
            }
        };
        let lease_ms = applied.lease_ms;
        // Random, as a container's id is: unique, and never a pid another
        // process may come to hold. Not the run directory's name, which the
        // session that reads the envelope has no business knowing.
        let id = format!("{:032x}", rand::random::<u128>());
        let mut envelope = envelope(spec, &sandbox_spec, &applied, &environment, &id, layout);
        // Only box's executor writes the secrets (a stand-in command gets the
        // tmpfs, empty).
        if executor && applied.secrets_mounted {
            envelope.secrets = delivered_secrets(spec);
        }
        let created = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
        let record = lease::Record {
            id: id.clone(),
            instance: session.instance.clone(),
            session: session.session.clone(),
            unit: unit.clone(),
            profile: session.profile.clone(),
            created,
            parent: wiring.parent.clone(),
            lease_ms: lease_ms.unwrap_or_default(),
            helper: pid,
            helper_start: lease::start_time(pid).unwrap_or_default(),
            temp: layout.temp.clone(),
            workspace: layout.workspace.clone(),
            executor,
            spec: sandbox_spec.kept(),
            applied: applied.clone(),
            pool: pool.map(|_| session.profile.clone()),
            envelope: serde_json::to_value(&envelope).ok(),
        };
        if let Err(message) = record.write(run_dir) {
            return Err(undo(other("recording the unit", message)).await);
        }
        let removed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // The listener lives as long as the renewals; the run directory
        // stays (removal, or `box gc` once the unit ended, removes it).
        let relay = lifecycle::relay(
            connected,
            (spec.lease, lifecycle::START_EPOCH),
            run_dir.to_owned(),
            listener,
            format!("{}/{}", session.session, unit),
        );
        let ended = unit_ended(
            relay.ended,
            exited_rx.clone(),
            Arc::clone(&removed),
            lease_ms,
        );
        let local = LocalUnit {
            info: record.info("running"),
            group,
            temp: layout.temp.clone(),
            run_dir: run_dir.to_owned(),
            exited: exited_rx,
            removed,
            session_volumes: record.session_volumes(),
            inside: None,
        };
        self.registry().insert(id, local);
        let detail = pool.map(|_| pool::PoolDetail {
            layout: layout.clone(),
            sandbox_spec: sandbox_spec.kept(),
            applied,
            run_dir: run_dir.to_owned(),
            record,
        });
        Ok((
            StartedUnit {
                envelope,
                io: relay.io,
                ended,
                renewal: Some(relay.renewal),
            },
            detail,
        ))
    }
}

/// The longest stderr line logged whole; longer ones are cut.
pub(crate) const STDERR_LINE_MAX: usize = 4096;

/// Log the unit's stderr line by line, control characters escaped, until it
/// closes.
pub(crate) async fn log_stderr(
    stderr: tokio::net::unix::pipe::Receiver,
    session: String,
    unit: String,
) {
    use tokio::io::AsyncReadExt;
    let mut reader = tokio::io::BufReader::new(stderr);
    let mut line = Vec::new();
    loop {
        line.clear();
        let read = (&mut reader)
            .take(STDERR_LINE_MAX as u64)
            .read_until(b'\n', &mut line)
            .await;
        match read {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                let text = printable(&String::from_utf8_lossy(&line));
                box_backend::executor_log::emit(&unit, Some(&session), text.trim_end());
            }
        }
    }
}

/// `text` with control characters (terminal escapes included) escaped.
pub(crate) fn printable(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let keep = !c.is_control() || c == '\t' || c == '\n';
            let shown: Vec<char> = if keep {
                vec![c]
            } else {
                c.escape_default().collect()
            };
            shown
        })
        .collect()
}

/// Undoes a start that did not finish, whether it failed or its future was
/// dropped (a session hanging up mid-start): kills the helper's process group
/// and removes the unit's temp directory.
pub(crate) struct StartGuard {
    temp: PathBuf,
    run_dir: PathBuf,
    group: Option<i32>,
    finished: bool,
}

impl Drop for StartGuard {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        if let Some(group) = self.group {
            kill_group(group);
        }
        for dir in [&self.temp, &self.run_dir] {
            if let Err(error) = remove_dir(dir) {
                tracing::warn!(path = %dir.display(), %error, "removing a unit's directory");
            }
        }
    }
}

/// A walk for the host's root-only files, and when it was last found current.
pub(crate) type CheckedWalk = (std::time::Instant, Arc<private::Walk>);

/// How long a check of the last walk stands for the starts that follow (a
/// burst of sessions checks once, not once each).
pub(crate) const PRIVATE_FILES_CHECKED_FOR: Duration = Duration::from_secs(1);

/// The host's root-only entries (`private`): the last walk while every entry
/// it judged is unchanged (checked at most once a second), else the cache
/// another process stored, checked the same way, else a fresh walk. One at a
/// time: concurrent starts wait for one check or walk rather than each
/// making its own.
pub(crate) fn private_files(state: &Mutex<Option<CheckedWalk>>) -> Arc<private::Walk> {
    let mut last = state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((checked, walk)) = last.as_mut() {
        if checked.elapsed() < PRIVATE_FILES_CHECKED_FOR {
            return Arc::clone(walk);
        }
        if walk.is_current() {
            *checked = std::time::Instant::now();
            return Arc::clone(walk);
        }
    }
    let roots: Vec<PathBuf> = private::ROOTS.iter().map(PathBuf::from).collect();
    let walk = Arc::new(private::root_only_entries(
        &roots,
        private::cache_path().as_deref(),
    ));
    *last = Some((std::time::Instant::now(), Arc::clone(&walk)));
    walk
}
