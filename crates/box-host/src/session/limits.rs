//! Limit events: while a session lives, each of its units' usage
//! ([`Backend::stats`](box_backend::Backend::stats), and what its `/tmp`
//! and home hold, [`Backend::used`](box_backend::Backend::used)) is read
//! every second and held to its limits; a unit that nears one (90%) or
//! reaches it gets the session a `notifications/box/unit` (`{unit, limit,
//! state, figure, bound}`), the log a WARN line and the audit a `"kind":
//! "limit"` line, once per unit, limit and state. Memory counts its peak
//! where the backend reads one (a spike between two readings still shows);
//! tasks, `/tmp` and home count now. Besides the gauges: each process the
//! OOM killer kills (`state: "oom-kill"`, naming the process where the
//! kernel's log can be read), each connection refused at the unit's egress
//! `max_connections` (`limit: "egress.connections"`), each stretch of
//! time its egress traffic waits for its bandwidth cap (`limit:
//! "egress.bandwidth"`, with the milliseconds waited so far), and each call
//! past its `call_timeout` ([`Session::tell_call_timeout`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use box_policy::envelope::AppliedLimits;
use serde_json::{Value, json};

use super::Session;
use super::live::Unit;
use crate::audit::Audit;
use crate::egress::{EgressProxy, EgressUsage};

/// How often the units' usage is read.
const EVERY: Duration = Duration::from_secs(1);

/// The share of a limit at which a unit nears it, in percent.
const NEAR: u64 = 90;

/// The gauges held to a bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gauge {
    Memory,
    Pids,
    Tmp,
    Home,
}

impl Gauge {
    fn name(self) -> &'static str {
        match self {
            Gauge::Memory => "memory",
            Gauge::Pids => "pids",
            Gauge::Tmp => "tmp",
            Gauge::Home => "home",
        }
    }
}

/// One limit of one unit under watch.
struct Watched {
    gauge: Gauge,
    bound: u64,
    /// The last state said: 0 none, 1 near, 2 reached.
    said: u8,
}

/// One unit under watch.
struct WatchedUnit {
    unit: String,
    id: String,
    gauges: Vec<Watched>,
    /// Where its `/tmp` and home are, measured when their gauges are watched.
    paths: Vec<PathBuf>,
    /// OOM kills counted at the last reading (the first reading is the
    /// baseline: kills before a reattach are no event).
    oom_kills: Option<u64>,
    /// Its egress, where it has a proxy.
    egress: Option<EgressWatch>,
}

/// A unit's egress under watch.
struct EgressWatch {
    /// The proxy's counters.
    usage: Arc<EgressUsage>,
    /// Its `max_connections`.
    max_connections: u64,
    /// Refusals at that limit already said.
    refused: u64,
    /// Its bandwidth cap (bytes a second, each direction), if it has one.
    bandwidth: Option<u64>,
    /// Nanoseconds its traffic had waited for the cap at the last reading.
    throttled: u64,
    /// Whether it was waiting then: a new stretch of waiting is said once.
    throttling: bool,
}

/// Who hears of a limit: the session (a notification), the log, the audit.
#[derive(Clone)]
pub(super) struct Teller {
    session: String,
    audit: Option<Arc<Audit>>,
    general: tokio::sync::mpsc::Sender<Value>,
}

impl Teller {
    /// Say `params` (`{unit, limit, state, ...}`), with `line` for the log.
    fn tell(&self, params: Value, line: &str) {
        tracing::warn!(
            session = %self.session,
            unit = %params["unit"].as_str().unwrap_or_default(),
            limit = %params["limit"].as_str().unwrap_or_default(),
            "{line}"
        );
        if let Some(audit) = &self.audit {
            audit.limit(&self.session, &params);
        }
        let _ = self.general.try_send(json!({
            "jsonrpc": "2.0",
            "method": "notifications/box/unit",
            "params": params,
        }));
    }
}

impl Session {
    pub(super) fn teller(&self) -> Teller {
        Teller {
            session: self.id.clone(),
            audit: self.services.audit.clone(),
            general: self.general.clone(),
        }
    }

    /// A call to `unit` ran past its `call_timeout` (`bound`): said as the
    /// unit's `call_timeout` limit reached.
    pub(super) fn tell_call_timeout(&self, unit: &str, method: &str, bound: Duration) {
        let millis = u64::try_from(bound.as_millis()).unwrap_or(u64::MAX);
        self.teller().tell(
            json!({
                "unit": unit,
                "limit": "call_timeout",
                "state": "reached",
                "figure": millis,
                "bound": millis,
                "method": method,
            }),
            &format!(
                "unit {unit}: {method} reached its call_timeout ({})",
                humantime::format_duration(bound)
            ),
        );
    }

    /// Watch the limits of `units` (with the egress proxies among `egress`)
    /// until the session ends (or none of them can be read any more: they
    /// are gone).
    pub(super) fn watch_limits(&self, units: &[Unit], egress: &[EgressProxy]) {
        let mut watched: Vec<WatchedUnit> =
            units.iter().map(|unit| watched(unit, egress)).collect();
        watched.retain(|unit| !unit.gauges.is_empty() || unit.egress.is_some());
        if watched.is_empty() {
            return;
        }
        let backend = Arc::clone(&self.services.backend);
        let teller = self.teller();
        let cancel = self.cancel.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(EVERY) => {}
                }
                let mut read_any = false;
                for unit in &mut watched {
                    let Ok(stats) = backend.stats(&unit.id).await else {
                        continue;
                    };
                    read_any = true;
                    let used = if unit.paths.is_empty() {
                        Vec::new()
                    } else {
                        backend.used(&unit.id, &unit.paths).await
                    };
                    if teller.general.is_closed() {
                        return;
                    }
                    unit.hold(&stats, &used, &teller);
                }
                if !read_any {
                    return;
                }
            }
        });
    }
}

/// What of `unit` is watched: memory and tasks always; `/tmp` and home
/// where they are tmpfs of the unit's own (their applied sizes the
/// bounds); its egress connections where it has a proxy.
fn watched(unit: &Unit, egress: &[EgressProxy]) -> WatchedUnit {
    let (tmp, home) = match &unit.envelope.limits {
        AppliedLimits::Container(limits) => (limits.tmp_bytes, limits.home_bytes),
        AppliedLimits::Process(limits) => (limits.tmp_bytes, limits.home_bytes),
        AppliedLimits::HostOnly(_) => (None, None),
    };
    let home_path = unit
        .envelope
        .home
        .as_ref()
        .map(|home| PathBuf::from(&home.path));
    let mut gauges = vec![
        Watched {
            gauge: Gauge::Memory,
            bound: unit.spec.limits.memory_bytes,
            said: 0,
        },
        Watched {
            gauge: Gauge::Pids,
            bound: unit.spec.limits.pids,
            said: 0,
        },
    ];
    let mut paths = Vec::new();
    if let Some(bound) = tmp {
        gauges.push(Watched {
            gauge: Gauge::Tmp,
            bound,
            said: 0,
        });
        paths.push(PathBuf::from("/tmp"));
    }
    if let (Some(bound), Some(path)) = (home, home_path) {
        gauges.push(Watched {
            gauge: Gauge::Home,
            bound,
            said: 0,
        });
        paths.push(path);
    }
    let egress = egress
        .iter()
        .find(|proxy| proxy.unit == unit.spec.name)
        .map(|proxy| {
            let usage = proxy.usage();
            EgressWatch {
                refused: usage.at_connection_limit.load(Ordering::Relaxed),
                throttled: usage.throttled.load(Ordering::Relaxed),
                usage,
                max_connections: unit.spec.network.max_connections,
                bandwidth: unit.spec.network.bytes_per_second,
                throttling: false,
            }
        });
    WatchedUnit {
        unit: unit.spec.name.clone(),
        id: unit.envelope.id.clone(),
        gauges,
        paths,
        oom_kills: None,
        egress,
    }
}

impl WatchedUnit {
    /// Hold one reading to the unit's limits, telling what is new.
    fn hold(
        &mut self,
        stats: &box_backend::stats::UnitStats,
        used: &[Option<u64>],
        teller: &Teller,
    ) {
        let mut paths = used.iter();
        for watch in &mut self.gauges {
            let figure = match watch.gauge {
                Gauge::Memory => stats.memory_peak_bytes.max(stats.memory_bytes),
                Gauge::Pids => stats.pids,
                Gauge::Tmp | Gauge::Home => paths.next().copied().flatten(),
            };
            let Some(figure) = figure else { continue };
            let state = level(figure, watch.bound);
            if state <= watch.said {
                continue;
            }
            watch.said = state;
            let name = watch.gauge.name();
            teller.tell(
                json!({
                    "unit": self.unit,
                    "limit": name,
                    "state": if state == 2 { "reached" } else { "near" },
                    "figure": figure,
                    "bound": watch.bound,
                }),
                &format!(
                    "unit {} {} its {name} limit ({figure} of {})",
                    self.unit,
                    if state == 2 { "reached" } else { "nears" },
                    watch.bound,
                ),
            );
        }
        if let Some(kills) = stats.oom_kills {
            let before = self.oom_kills.replace(kills);
            if before.is_some_and(|before| kills > before) {
                let memory = self.unit_memory_bound();
                let victim = stats.oom_killed.as_ref();
                let named = victim.map_or_else(
                    || "a process (the kernel's log cannot be read here to name it)".to_owned(),
                    |victim| format!("{} (pid {})", victim.process, victim.pid),
                );
                teller.tell(
                    json!({
                        "unit": self.unit,
                        "limit": "memory",
                        "state": "oom-kill",
                        "figure": kills,
                        "bound": memory,
                        "process": victim.map(|victim| victim.process.clone()),
                        "pid": victim.map(|victim| victim.pid),
                    }),
                    &format!(
                        "unit {}: the OOM killer killed {named} at its memory limit",
                        self.unit
                    ),
                );
            }
        }
        if let Some(egress) = &mut self.egress {
            let refused = egress.usage.at_connection_limit.load(Ordering::Relaxed);
            let bound = egress.max_connections;
            if refused > egress.refused {
                egress.refused = refused;
                teller.tell(
                    json!({
                        "unit": self.unit,
                        "limit": "egress.connections",
                        "state": "reached",
                        "figure": bound,
                        "bound": bound,
                        "refused": refused,
                    }),
                    &format!(
                        "unit {} reached its egress max_connections ({bound}): {refused} connection(s) refused",
                        self.unit
                    ),
                );
            }
            let throttled = egress.usage.throttled.load(Ordering::Relaxed);
            let waiting = throttled > egress.throttled;
            egress.throttled = throttled;
            if let (true, false, Some(bandwidth)) = (waiting, egress.throttling, egress.bandwidth) {
                let waited_ms = throttled / 1_000_000;
                teller.tell(
                    json!({
                        "unit": self.unit,
                        "limit": "egress.bandwidth",
                        "state": "reached",
                        "figure": bandwidth,
                        "bound": bandwidth,
                        "waitedMs": waited_ms,
                    }),
                    &format!(
                        "unit {} reached its egress bandwidth ({bandwidth} bytes a second): its traffic waits for the cap ({waited_ms} ms so far)",
                        self.unit
                    ),
                );
            }
            egress.throttling = waiting;
        }
    }

    fn unit_memory_bound(&self) -> u64 {
        self.gauges
            .iter()
            .find(|watch| watch.gauge == Gauge::Memory)
            .map_or(0, |watch| watch.bound)
    }
}

/// 2 when `figure` is at `bound` or above, 1 from [`NEAR`] percent of it,
/// else 0.
fn level(figure: u64, bound: u64) -> u8 {
    if bound == 0 {
        return 0;
    }
    if figure >= bound {
        2
    } else if u128::from(figure) * 100 >= u128::from(bound) * u128::from(NEAR) {
        1
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unit_nears_a_limit_at_ninety_percent_and_reaches_it_at_the_bound() {
        assert_eq!(level(89, 100), 0);
        assert_eq!(level(90, 100), 1);
        assert_eq!(level(99, 100), 1);
        assert_eq!(level(100, 100), 2);
        assert_eq!(level(130, 100), 2);
        assert_eq!(level(5, 0), 0);
        assert_eq!(level(u64::MAX - 1, u64::MAX), 1);
    }
}
