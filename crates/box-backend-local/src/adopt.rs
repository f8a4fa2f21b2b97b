//! Re-adopting a unit a dead host started (`Backend::adopt`), and watching
//! the end of a helper this process did not start.

use std::os::fd::OwnedFd;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use box_backend::lifecycle;
use box_backend::{AdoptUnit, BackendError, SessionLabel, StartedUnit};
use box_policy::plan::UnitSpec;

use crate::ended::unit_ended;
use crate::envelope::{delivered_secrets, envelope_from_parts};
use crate::lease;
use crate::spec::Layout;
use crate::{LocalBackend, LocalUnit};

impl LocalBackend {
    /// [`Backend::adopt`]: the run directory's record checked against what
    /// was persisted (the same unit id, session and unit, its helper still
    /// the process recorded), its key read from the run directory, the
    /// socket bound again, the helper's connection accepted with the same
    /// proofs a docker unit's init gives, and the lease renewed above the
    /// previous host's epoch before anything else.
    pub(crate) async fn adopt_unit(
        &self,
        session: &SessionLabel,
        spec: &UnitSpec,
        unit: &AdoptUnit,
    ) -> Result<StartedUnit, BackendError> {
        let name = spec.name.as_str();
        let refused = BackendError::other_for(name);
        let record = lease::Record::read(&unit.run_dir).map_err(|why| {
            refused(
                "re-adopting the unit",
                format!(
                    "unit {} is gone: its run directory's record cannot be read ({why}): removed, or its lease lapsed",
                    unit.id
                ),
            )
        })?;
        // A warm unit keeps its pool's session (`pool-N`): the one the
        // identity its host persisted names.
        let session_want = if record.pool.is_some() {
            unit.identity.rsplit('/').nth(1).unwrap_or_default()
        } else {
            session.session.as_str()
        };
        for (what, have, want) in [
            ("id", record.id.as_str(), unit.id.as_str()),
            ("session", record.session.as_str(), session_want),
            ("unit", record.unit.as_str(), name),
        ] {
            if have != want {
                return Err(refused(
                    "re-adopting the unit",
                    format!(
                        "the run directory {} holds {what} `{have}`, not `{want}`: it is not the unit persisted",
                        unit.run_dir.display()
                    ),
                ));
            }
        }
        if !record.helper_alive() {
            return Err(refused(
                "re-adopting the unit",
                format!(
                    "unit {} is gone: its helper (pid {}) has ended (removed, or its lease lapsed)",
                    unit.id, record.helper
                ),
            ));
        }
        let key = std::fs::read_to_string(unit.run_dir.join(lease::KEY))
            .map_err(|error| refused("reading the unit's key", error.to_string()))
            .and_then(|hex| {
                box_init::protocol::UnitKey::from_hex(hex.trim())
                    .map_err(|error| refused("reading the unit's key", error.to_string()))
            })?;
        let exited = watch_exit(record.helper, record.helper_start);
        let helper_ended = {
            let mut exited = exited.clone();
            async move {
                let _ = exited.wait_for(Option::is_some).await;
                format!(
                    "unit {} ended (its lease lapsed) before its helper reconnected",
                    unit.id
                )
            }
        };
        let (listener, connected, epoch) = lifecycle::reconnect(
            &unit.run_dir,
            (&key, &unit.identity),
            (unit.timeout, spec.lease),
            "helper",
            helper_ended,
        )
        .await
        .map_err(|why| refused(&why.doing, why.message))?;
        let layout = Layout {
            tmp: record.temp.join("tmp"),
            home: record.temp.join("home"),
            temp: record.temp.clone(),
            workspace: record.workspace.clone(),
            volumes: Vec::new(),
        };
        let mut envelope = envelope_from_parts(
            spec,
            &record.spec,
            &record.applied,
            (unit.env_passed.clone(), unit.env_scrubbed.clone()),
            &record.id,
            &layout,
        );
        if record.executor && record.applied.secrets_mounted {
            envelope.secrets = delivered_secrets(spec);
        }
        let removed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let relay = lifecycle::relay(
            connected,
            (spec.lease, epoch),
            unit.run_dir.clone(),
            listener,
            format!("{}/{}", session.session, name),
        );
        let ended = unit_ended(
            relay.ended,
            exited.clone(),
            Arc::clone(&removed),
            Some(record.lease_ms),
        );
        let local = LocalUnit {
            info: record.info("running"),
            group: i32::try_from(record.helper).unwrap_or(i32::MAX),
            temp: record.temp.clone(),
            run_dir: unit.run_dir.clone(),
            exited,
            removed,
            session_volumes: record.session_volumes(),
            inside: None,
        };
        self.registry().insert(record.id.clone(), local);
        Ok(StartedUnit {
            envelope,
            io: relay.io,
            ended,
            renewal: Some(relay.renewal),
        })
    }
}

/// The end of a unit's helper as far as is known now.
pub(crate) fn exited_now(
    exited: &watch::Receiver<Option<Option<ExitStatus>>>,
) -> Option<Option<ExitStatus>> {
    *exited.borrow()
}

/// Watch a helper this process did not start (no wait status: `Some(None)`
/// once it has ended), through a pidfd, else by polling its start time.
pub(crate) fn watch_exit(pid: u32, start: u64) -> watch::Receiver<Option<Option<ExitStatus>>> {
    use std::os::fd::FromRawFd as _;
    let (sender, receiver) = watch::channel(None);
    let raw = i32::try_from(pid).unwrap_or(i32::MAX);
    // SAFETY: pidfd_open with integer arguments; a non-negative result is a
    // new fd this process owns.
    let opened = unsafe { libc::syscall(libc::SYS_pidfd_open, raw, 0) };
    let pidfd = i32::try_from(opened)
        .ok()
        .filter(|fd| *fd >= 0)
        // SAFETY: the fd was just opened and is owned by nobody else.
        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) });
    // Checked after the pidfd, so the pidfd is the recorded process's.
    if lease::start_time(pid) != Some(start) {
        let _ = sender.send(Some(None));
        return receiver;
    }
    tokio::spawn(async move {
        let watched = pidfd.and_then(|fd| {
            // SAFETY: the `OwnedFd` is moved into the `AsyncFd` and stays open,
            // the same fd, for as long as it lives.
            unsafe {
                tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
            }
            .ok()
        });
        match watched {
            Some(fd) => {
                let _ = fd.readable().await;
            }
            None => {
                while lease::start_time(pid) == Some(start) {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        let _ = sender.send(Some(None));
    });
    receiver
}
