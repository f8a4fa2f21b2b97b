//! How a unit ended, from what the engine and the unit's init said.

use box_backend::OomEvidence;

/// What ended, as the backend saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The container stopped, with no report from its init (killed).
    Container,
    /// The executor exited, as the unit's init reported.
    Executor,
    /// The unit's init was asked to stop (SIGTERM or SIGINT: `docker stop`,
    /// or a signal from outside the unit) and ended the unit.
    Terminated,
    /// The unit's lease lapsed (its host did not renew it within
    /// `lease_ms`) and its init ended it.
    LeaseLapsed {
        /// The unit's lease.
        lease_ms: u64,
    },
    /// The container is gone (removed) or the engine could not say.
    Gone,
}

/// A `UnitEnd` naming the cause, from the container's final state: one
/// sentence that says who ended, how (the exit code or the signal, once) and
/// why, as far as the evidence tells.
///
/// `exit_code` is the container's (for `Container`) or the executor's (for
/// `Executor`); `oom` is what the unit's memory cgroup, watched while the
/// unit lived (`oom.rs`), says about the kernel's OOM killer. box's init
/// reports every end it sees (the executor's exit, a stop signal, a lapsed
/// lease); a container that ends without a report was killed: with 137 it
/// was SIGKILLed, from outside (`docker kill`, or `docker stop` past its
/// grace) or, where the cgroup saw it, by the OOM killer choosing the init.
pub fn unit_end(
    unit: &str,
    ending: Ending,
    exit_code: Option<i64>,
    oom: OomEvidence,
    memory_bytes: u64,
) -> UnitEndParts {
    let who = match ending {
        Ending::Executor => format!("the executor of unit {unit}"),
        _ => format!("unit {unit}"),
    };
    let code = |code: i64| format!("exit code {code}");
    let reason = if oom == OomEvidence::Killed {
        match (ending, exit_code) {
            // No report: the init itself was killed, and the unit with it.
            (Ending::Container | Ending::Gone, Some(137) | None) => format!(
                "{who} was killed by the kernel's OOM killer at its memory limit of {memory_bytes} bytes: it chose box's init, the unit's first process, and the unit ended with it{}",
                exit_code.map_or_else(String::new, |c| format!("; {}", code(c)))
            ),
            // Killed itself (SIGKILL), or the engine flagged the container.
            (_, Some(137) | None) => format!(
                "{who} was killed by the kernel's OOM killer at its memory limit of {memory_bytes} bytes{}",
                exit_code.map_or_else(String::new, |c| format!("; {}", code(c)))
            ),
            (_, Some(exit)) => format!(
                "{who} exited with code {exit} after the kernel's OOM killer killed a process in the unit at its memory limit of {memory_bytes} bytes"
            ),
        }
    } else if ending == Ending::Gone {
        format!("{who} is gone (removed, or the engine lost it)")
    } else if ending == Ending::Terminated {
        format!(
            "{who} was stopped: its init got SIGTERM or SIGINT (`docker stop`, or a signal from outside the unit){}",
            exit_code.map_or_else(String::new, |c| format!("; {}", code(c)))
        )
    } else if let Ending::LeaseLapsed { lease_ms } = ending {
        format!(
            "{who} ended because its lease lapsed: its host did not renew it within {} (the host was stopped, hung or too busy){}",
            humantime::format_duration(std::time::Duration::from_millis(lease_ms)),
            exit_code.map_or_else(String::new, |c| format!("; {}", code(c)))
        )
    } else {
        let unknown = oom == OomEvidence::Unknown;
        match (ending, exit_code) {
            (_, Some(0)) => format!("{who} exited normally (code 0)"),
            (Ending::Container, Some(143)) => format!(
                "{who} was stopped: its init got SIGTERM (`docker stop`, or a signal from outside the unit; {})",
                code(143)
            ),
            (Ending::Container, Some(137)) if unknown => format!(
                "{who} was killed with SIGKILL: from outside (`docker kill`, or `docker stop` past its grace) or by the kernel's OOM killer, which box cannot tell here (the unit's memory cgroup was not readable from this host; {})",
                code(137)
            ),
            (Ending::Container, Some(137)) => format!(
                "{who} was killed with SIGKILL from outside (`docker kill`, or `docker stop` past its grace; not the OOM killer; {})",
                code(137)
            ),
            (_, Some(137)) if unknown => format!(
                "{who} was killed with SIGKILL while its unit ran on (by the kernel's OOM killer or from inside the unit, which box cannot tell here: the unit's memory cgroup was not readable from this host; {})",
                code(137)
            ),
            (_, Some(137)) => format!(
                "{who} was killed with SIGKILL while its unit ran on (not the OOM killer; {})",
                code(137)
            ),
            (_, Some(exit)) if exit > 128 && exit <= 128 + 64 => {
                let signal = exit - 128;
                format!(
                    "{who} was killed by signal {signal} ({}; {})",
                    signal_name(signal),
                    code(exit)
                )
            }
            (_, Some(exit)) => format!("{who} exited with code {exit}"),
            (_, None) => format!("{who} ended without an exit code"),
        }
    };
    UnitEndParts {
        exit_code,
        oom_killed: oom.as_flag(),
        reason,
    }
}

/// The fields of a `UnitEnd` (kept separate so this module has no dependency
/// on how the trait's type grows).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitEndParts {
    /// The exit code.
    pub exit_code: Option<i64>,
    /// OOM-killed: `Some(true)`, `Some(false)`, or `None` (cannot tell).
    pub oom_killed: Option<bool>,
    /// The sentence.
    pub reason: String,
}

pub(super) fn signal_name(signal: i64) -> &'static str {
    match signal {
        1 => "SIGHUP",
        2 => "SIGINT",
        6 => "SIGABRT",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        15 => "SIGTERM",
        _ => "a signal",
    }
}
