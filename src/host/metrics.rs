//! The host's counters, rendered as Prometheus text at `/metrics`: sessions,
//! units by state, calls by method/tool and outcome, call latency, unit start
//! latency. Plain data behind one mutex: nothing awaits under it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

/// Upper bounds of the latency histograms, in seconds.
const BUCKETS: [f64; 12] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0, 300.0,
];

#[derive(Debug, Default, Clone)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, duration: Duration) {
        let seconds = duration.as_secs_f64();
        for (bound, count) in BUCKETS.iter().zip(self.counts.iter_mut()) {
            if seconds <= *bound {
                *count += 1;
            }
        }
        self.count += 1;
        self.sum += seconds;
    }

    fn render(&self, out: &mut String, name: &str) {
        for (bound, count) in BUCKETS.iter().zip(self.counts.iter()) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {count}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

#[derive(Debug, Default)]
struct State {
    sessions_started: u64,
    sessions_active: i64,
    units_running: i64,
    units_ended: i64,
    units_removed: u64,
    calls: BTreeMap<(String, String), u64>,
    call_latency: Histogram,
    unit_start_latency: Histogram,
}

/// The host's metrics.
#[derive(Debug, Default)]
pub struct Metrics {
    state: Mutex<State>,
    /// Session tasks running, started or not (what shutdown waits for).
    tasks: std::sync::atomic::AtomicUsize,
}

impl Metrics {
    fn with(&self, change: impl FnOnce(&mut State)) {
        if let Ok(mut state) = self.state.lock() {
            change(&mut state);
        }
    }

    /// A session's units started (all of them), taking `latency`.
    pub fn unit_start(&self, latency: Duration, units: usize) {
        self.with(|state| {
            state.sessions_started += 1;
            state.sessions_active += 1;
            state.units_running += units as i64;
            state.unit_start_latency.observe(latency);
        });
    }

    /// A unit of a live session ended on its own (died, was killed).
    pub fn unit_ended(&self) {
        self.with(|state| {
            state.units_running -= 1;
            state.units_ended += 1;
        });
    }

    /// A started session ended and its `units` were removed, `ended` of which had ended before.
    pub fn session_ended(&self, units: usize, ended: usize) {
        self.with(|state| {
            state.sessions_active -= 1;
            state.units_running -= (units - ended.min(units)) as i64;
            state.units_ended -= ended as i64;
            state.units_removed += units as u64;
        });
    }

    /// A call finished.
    pub fn call(&self, method: &str, tool: Option<&str>, outcome: &str, duration: Duration) {
        let what = match tool {
            Some(tool) => format!("tools/call:{tool}"),
            None => method.to_owned(),
        };
        self.with(|state| {
            *state.calls.entry((what, outcome.to_owned())).or_default() += 1;
            state.call_latency.observe(duration);
        });
    }

    /// A session task began.
    pub fn task_started(&self) {
        self.tasks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// A session task ended (its units, if any, removed).
    pub fn task_ended(&self) {
        self.tasks.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// Session tasks running, including those still starting their units.
    pub fn session_tasks(&self) -> usize {
        self.tasks.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Sessions currently started.
    pub fn sessions_active(&self) -> i64 {
        self.state
            .lock()
            .map(|state| state.sessions_active)
            .unwrap_or(0)
    }

    /// Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let Ok(state) = self.state.lock() else {
            return out;
        };
        let _ = writeln!(out, "# TYPE box_sessions_active gauge");
        let _ = writeln!(out, "box_sessions_active {}", state.sessions_active);
        let _ = writeln!(out, "# TYPE box_sessions_started_total counter");
        let _ = writeln!(out, "box_sessions_started_total {}", state.sessions_started);
        let _ = writeln!(out, "# TYPE box_units gauge");
        let _ = writeln!(
            out,
            "box_units{{state=\"running\"}} {}",
            state.units_running
        );
        let _ = writeln!(out, "box_units{{state=\"ended\"}} {}", state.units_ended);
        let _ = writeln!(out, "# TYPE box_units_removed_total counter");
        let _ = writeln!(out, "box_units_removed_total {}", state.units_removed);
        let _ = writeln!(out, "# TYPE box_calls_total counter");
        for ((what, outcome), count) in &state.calls {
            let what = what.replace('\\', "\\\\").replace('"', "\\\"");
            let _ = writeln!(
                out,
                "box_calls_total{{method=\"{what}\",outcome=\"{outcome}\"}} {count}"
            );
        }
        let _ = writeln!(out, "# TYPE box_call_duration_seconds histogram");
        state
            .call_latency
            .render(&mut out, "box_call_duration_seconds");
        let _ = writeln!(out, "# TYPE box_unit_start_duration_seconds histogram");
        state
            .unit_start_latency
            .render(&mut out, "box_unit_start_duration_seconds");
        out
    }
}
