//! How a unit ended, as the session is told: the helper's report, else its
//! wait status.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::watch;

use box_backend::UnitEnd;

use crate::REAP_TIMEOUT;

/// How a unit ended, from its channel: the helper's report (box-init's
/// `EndReport`) when it sent one, else the helper's wait status (a unit this
/// host started) or its end seen through `exited`.
pub(crate) fn unit_ended(
    channel: box_init::host::Ended,
    mut exited: watch::Receiver<Option<Option<ExitStatus>>>,
    removed: Arc<std::sync::atomic::AtomicBool>,
    lease_ms: Option<u64>,
) -> BoxFuture<'static, UnitEnd> {
    use box_init::protocol::EndReason;
    async move {
        let end = channel.wait().await;
        let removed_now = || removed.load(std::sync::atomic::Ordering::SeqCst);
        match end {
            box_init::host::UnitEnd::Reported(report) => {
                let status = report.executor.map(|exit| match exit {
                    box_init::protocol::ExitReport::Signal(signal) => ExitStatus::from_raw(signal),
                    // The unit's init ends with 128 + the signal that killed CMD.
                    box_init::protocol::ExitReport::Code(code) if code > 128 && code < 128 + 65 => {
                        ExitStatus::from_raw(code - 128)
                    }
                    box_init::protocol::ExitReport::Code(code) => {
                        ExitStatus::from_raw((code & 0xff) << 8)
                    }
                });
                let lapsed =
                    (report.reason == EndReason::LeaseLapsed).then(|| lease_ms.unwrap_or_default());
                let removed = removed_now() || report.reason == EndReason::Terminated;
                unit_end(status, removed, lapsed)
            }
            box_init::host::UnitEnd::Released => UnitEnd {
                exit_code: None,
                oom_killed: Some(false),
                reason: "the unit was released to another host".to_owned(),
            },
            box_init::host::UnitEnd::Disconnected => {
                // The helper died without a report (killed): its status, when
                // it comes.
                let status = tokio::time::timeout(REAP_TIMEOUT, exited.wait_for(Option::is_some))
                    .await
                    .ok()
                    .and_then(|status| status.ok().and_then(|status| status.flatten()));
                unit_end(status, removed_now(), None)
            }
        }
    }
    .boxed()
}

/// How a unit ended, from the helper's wait status (the helper ends the way
/// the executor did: same exit code, or killed by the same signal).
/// `lapsed`: the helper said it ended the unit because its lease (of that
/// many milliseconds) lapsed.
///
/// A local unit has no memory cgroup of its own (its memory is bounded per
/// process by rlimits, which fail an allocation rather than kill): its
/// processes are in the host's cgroup, whose OOM kills box cannot tell from
/// the host's own or another process's. So a SIGKILL nobody here sent is
/// "cannot tell" (`oom_killed: None`); any other end rules the OOM killer
/// out (it kills with SIGKILL only).
pub(crate) fn unit_end(status: Option<ExitStatus>, removed: bool, lapsed: Option<u64>) -> UnitEnd {
    let (code, signal) = match status {
        Some(status) => (status.code(), status.signal()),
        None => (None, None),
    };
    let sigkill = signal == Some(nix::sys::signal::Signal::SIGKILL as i32);
    let cause = match (code, signal) {
        (_, Some(signal)) if sigkill && !removed && lapsed.is_none() => format!(
            "the executor was killed by {}: from outside or by the kernel's OOM killer, which box cannot tell for a local unit (it has no memory cgroup of its own)",
            signal_name(signal)
        ),
        (_, Some(signal)) => format!("the executor was killed by {}", signal_name(signal)),
        (Some(code), None) => format!("the executor exited with code {code}"),
        (None, None) => "the executor ended for an unknown reason".to_owned(),
    };
    let told = removed || lapsed.is_some() || (status.is_some() && !sigkill);
    UnitEnd {
        exit_code: match (code, signal) {
            (_, Some(_)) => Some(-1),
            (code, None) => code.map(i64::from),
        },
        oom_killed: told.then_some(false),
        reason: if let Some(lease_ms) = lapsed {
            format!(
                "the unit ended because its lease lapsed: its host did not renew it within {} (the host was stopped, hung or too busy)",
                humantime::format_duration(Duration::from_millis(lease_ms))
            )
        } else if removed {
            format!("the unit was removed ({cause})")
        } else {
            cause
        },
    }
}

pub(crate) fn signal_name(signal: i32) -> String {
    match nix::sys::signal::Signal::try_from(signal) {
        Ok(named) => format!("{} ({signal})", named.as_str()),
        Err(_) => format!("signal {signal}"),
    }
}
