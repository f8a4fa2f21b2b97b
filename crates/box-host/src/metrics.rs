//! The host's metrics behind `/metrics`, and the readiness check behind
//! `/readyz`: sessions, units by state, calls by method, tool and outcome,
//! call latency, unit start latency, and `box_build_info`.
//!
//! The exposition is written by `prometheus-client` (Prometheus text format
//! 0.0.4), which escapes every label value, so nothing a client sends can
//! write a line of its own. Every label value comes from a bounded set: a
//! method from the session's method table (its label: the name of a method
//! it counts, else `other`), an outcome from [`OUTCOMES`], a tool from the
//! tools the session's units listed at start ([`tool_label`]); anything else
//! is `other`, so a client cannot grow the series without bound either.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use serde_json::Value;

/// The `Content-Type` of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Upper bounds of the latency histograms, in seconds.
const BUCKETS: [f64; 12] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0, 300.0,
];

/// The outcomes a call is counted under; any other is counted as `other`.
/// `failed`: a result that is not an error but says the work failed (a
/// `bash` call that exited non-zero, was killed at its timeout or cancelled).
pub const OUTCOMES: [&str; 9] = [
    "ok",
    "error",
    "tool_error",
    "failed",
    "cancelled",
    "timeout",
    "unit_ended",
    "unit_unavailable",
    "session_ended",
];

/// Why a session or a request was refused before it was served
/// (`box_sessions_refused{reason}`); any other is counted as `other`.
/// The transport's: `unauthorized` (401), `origin` (403), `host` (421). The
/// host's, for an `initialize`: `initialize` (malformed), `ask` (a box ask
/// or `Box-*` header that does not read, or two that disagree), `profile`
/// (one that does not load), `widening` (a tightening wider than the
/// profile), `tightening` (one that is invalid), `workspace` (a workspace
/// the profile may not have), `persisted_credentials` (`refuse`),
/// `reattach` (a reattach that cannot be given).
pub const REFUSALS: [&str; 11] = [
    "unauthorized",
    "origin",
    "host",
    "initialize",
    "ask",
    "profile",
    "widening",
    "tightening",
    "workspace",
    "persisted_credentials",
    "reattach",
];

/// How long `/readyz` waits for the backend to answer.
const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// A call's labels, each from a bounded set.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    method: &'static str,
    /// Empty for every method but `tools/call`.
    tool: String,
    outcome: &'static str,
}

/// `mcp.server.operation.duration`'s attributes as labels (MCP's semantic
/// conventions, dots made underscores), each from a bounded set: the
/// method's label, the tool's, and the error's type (empty when the call
/// worked), an outcome of [`OUTCOMES`].
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    mcp_method_name: &'static str,
    gen_ai_tool_name: String,
    error_type: &'static str,
}

/// The buckets MCP's semantic conventions advise for
/// `mcp.server.operation.duration`, in seconds.
const OPERATION_BUCKETS: [f64; 14] = [
    0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

fn operation_histogram() -> Histogram {
    Histogram::new(OPERATION_BUCKETS)
}

/// An egress byte count's label: `up` (from the unit) or `down` (to it).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabels {
    direction: &'static str,
}

/// An egress attempt's labels: the proxy's outcome and, when refused or failed,
/// its reason (both from box-egress's fixed sets).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EgressLabels {
    outcome: &'static str,
    reason: &'static str,
}

/// A fork's label: what it was forked from, `workspace` (a session's
/// workspace unit) or `fork` (another child).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ForkLabels {
    parent: &'static str,
}

/// A refusal's label, from [`REFUSALS`].
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabels {
    reason: &'static str,
}

/// A merge's label: `merged`, `refused` (a conflict, a bad ask) or `failed`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MergeLabels {
    outcome: &'static str,
}

/// A pool claim's outcome: `warm` (a unit claimed and bound), `unfit` (the
/// plan does not fit the pool's key), `empty` (no unit was ready), `failed`
/// (the bind failed; the unit was removed).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClaimLabels {
    outcome: &'static str,
}

/// A pool's label: its profile (one of the pools the operator asked for).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    profile: String,
}

/// A unit count's label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UnitLabels {
    state: &'static str,
}

/// The host's metrics: atomics behind `prometheus-client` handles (a call's
/// series is found under a short read lock, never held across an await).
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    sessions_started: Counter,
    sessions_active: Gauge,
    units_running: Gauge,
    units_ended: Gauge,
    units_removed: Counter,
    calls: Family<CallLabels, Counter>,
    call_duration: Histogram,
    operation_duration: Family<OperationLabels, Histogram, fn() -> Histogram>,
    unit_start_duration: Histogram,
    egress: Family<EgressLabels, Counter>,
    egress_bytes: Family<DirectionLabels, Counter>,
    forks: Family<ForkLabels, Counter>,
    merges: Family<MergeLabels, Counter>,
    refused: Family<RefusalLabels, Counter>,
    pool_ready: Family<PoolLabels, Gauge>,
    pool_size: Family<PoolLabels, Gauge>,
    pool_claims: Family<ClaimLabels, Counter>,
    pool_claim_duration: Histogram,
    /// Session tasks running, started or not (what shutdown waits for).
    tasks: AtomicUsize,
    /// What running units use, per backend and profile.
    usage: UsageGauges,
}

const RUNNING: UnitLabels = UnitLabels { state: "running" };
const ENDED: UnitLabels = UnitLabels { state: "ended" };

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let sessions_active = Gauge::default();
        registry.register(
            "box_sessions_active",
            "Sessions whose units are started and not yet removed",
            sessions_active.clone(),
        );
        let sessions_started = Counter::default();
        registry.register(
            "box_sessions_started",
            "Sessions whose units all started",
            sessions_started.clone(),
        );
        let units = Family::<UnitLabels, Gauge>::default();
        registry.register(
            "box_units",
            "Units of live sessions, running or ended on their own",
            units.clone(),
        );
        // Both states show from the start, at zero; the handles share the
        // family's values.
        let units_running = units.get_or_create(&RUNNING).clone();
        let units_ended = units.get_or_create(&ENDED).clone();
        let units_removed = Counter::default();
        registry.register(
            "box_units_removed",
            "Units removed at the end of their session",
            units_removed.clone(),
        );
        let calls = Family::<CallLabels, Counter>::default();
        registry.register(
            "box_calls",
            "Requests forwarded to units, by method, tool (tools/call only) and outcome",
            calls.clone(),
        );
        let call_duration = Histogram::new(BUCKETS);
        registry.register(
            "box_call_duration_seconds",
            "How long forwarded requests took to be answered",
            call_duration.clone(),
        );
        let operation_duration =
            Family::<OperationLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                operation_histogram,
            );
        registry.register_with_unit(
            "mcp_server_operation_duration",
            "MCP requests forwarded to units, by method, tool and error type (MCP's semantic conventions)",
            prometheus_client::registry::Unit::Seconds,
            operation_duration.clone(),
        );
        let unit_start_duration = Histogram::new(BUCKETS);
        registry.register(
            "box_unit_start_duration_seconds",
            "How long a session's units took to start and initialize",
            unit_start_duration.clone(),
        );
        let egress = Family::<EgressLabels, Counter>::default();
        registry.register(
            "box_egress_connections",
            "Egress attempts through units' proxies, by outcome and refusal or failure reason",
            egress.clone(),
        );
        let egress_bytes = Family::<DirectionLabels, Counter>::default();
        registry.register(
            "box_egress_bytes",
            "Bytes units' egress carried, by direction (up: from the unit, down: to it), counted as each connection ends",
            egress_bytes.clone(),
        );
        let forks = Family::<ForkLabels, Counter>::default();
        registry.register(
            "box_forks",
            "Child units started by box/fork, by what they were forked from (workspace, or fork: another child)",
            forks.clone(),
        );
        let merges = Family::<MergeLabels, Counter>::default();
        registry.register(
            "box_merges",
            "box/merge requests, by outcome (merged, refused: a conflict or a bad ask, failed)",
            merges.clone(),
        );
        let refused = Family::<RefusalLabels, Counter>::default();
        registry.register(
            "box_sessions_refused",
            "Sessions and requests refused before they were served, by reason (unauthorized, origin, host: the HTTP checks; initialize, ask, profile, widening, tightening, workspace, persisted_credentials, reattach: a refused initialize)",
            refused.clone(),
        );
        let usage = UsageGauges::register(&mut registry);
        let pool_ready = Family::<PoolLabels, Gauge>::default();
        registry.register(
            "box_pool_ready",
            "Pooled units ready for a session, by profile (box serve --pool)",
            pool_ready.clone(),
        );
        let pool_size = Family::<PoolLabels, Gauge>::default();
        registry.register(
            "box_pool_size",
            "Pooled units each pool keeps when full, by profile (its [pool] size or --pool)",
            pool_size.clone(),
        );
        let pool_claims = Family::<ClaimLabels, Counter>::default();
        registry.register(
            "box_pool_claims",
            "Units asked of a pool, by outcome (warm: claimed and bound; unfit: the plan does not fit the pool; empty: none was ready; failed: the bind failed)",
            pool_claims.clone(),
        );
        let pool_claim_duration = Histogram::new(BUCKETS);
        registry.register(
            "box_pool_claim_duration_seconds",
            "How long claiming a pooled unit and binding the session's plan to it took",
            pool_claim_duration.clone(),
        );
        registry.register(
            "box_build",
            "This box's version",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        Self {
            registry,
            sessions_started,
            sessions_active,
            units_running,
            units_ended,
            units_removed,
            calls,
            call_duration,
            operation_duration,
            unit_start_duration,
            egress,
            egress_bytes,
            forks,
            merges,
            refused,
            pool_ready,
            pool_size,
            pool_claims,
            pool_claim_duration,
            tasks: AtomicUsize::new(0),
            usage,
        }
    }
}

impl Metrics {
    /// An egress exchange carried `up` bytes from its unit and `down` to it.
    pub fn egress_bytes(&self, up: u64, down: u64) {
        for (direction, bytes) in [("up", up), ("down", down)] {
            if bytes > 0 {
                self.egress_bytes
                    .get_or_create(&DirectionLabels { direction })
                    .inc_by(bytes);
            }
        }
    }

    /// One egress attempt ended with `outcome` (`allowed`, `refused`, `failed`)
    /// for `reason` (empty when allowed).
    pub fn egress(&self, outcome: &'static str, reason: &'static str) {
        self.egress
            .get_or_create(&EgressLabels { outcome, reason })
            .inc();
    }

    /// A session's units started (all of them), taking `latency`.
    pub fn unit_start(&self, latency: Duration, units: usize) {
        self.sessions_started.inc();
        self.sessions_active.inc();
        self.units_running.inc_by(count(units));
        self.unit_start_duration.observe(latency.as_secs_f64());
    }

    /// A dead host's session was reattached here with its `units` running:
    /// active again on this host (its end is counted as any session's).
    pub fn session_reattached(&self, units: usize) {
        self.sessions_active.inc();
        self.units_running.inc_by(count(units));
    }

    /// A fork joined its session (a running unit of it, not a session),
    /// forked from `parent` (`workspace` or `fork`), taking `latency`.
    pub fn fork_started(&self, latency: Duration, parent: &'static str) {
        self.units_running.inc();
        self.unit_start_duration.observe(latency.as_secs_f64());
        self.forks.get_or_create(&ForkLabels { parent }).inc();
    }

    /// A fork was discarded (`box/discard`); `ended`: it had ended on its
    /// own before (and was counted so then).
    pub fn fork_discarded(&self, ended: bool) {
        if ended {
            self.units_ended.dec();
        } else {
            self.units_running.dec();
        }
        self.units_removed.inc();
    }

    /// A session or a request was refused for `reason` (counted by name when
    /// [`REFUSALS`] has it, else as `other`).
    pub fn refused(&self, reason: &str) {
        let reason = bounded(&REFUSALS, reason);
        self.refused.get_or_create(&RefusalLabels { reason }).inc();
    }

    /// The pool of `profile` holds `ready` units.
    pub fn pool_ready(&self, profile: &str, ready: usize) {
        self.pool_ready
            .get_or_create(&PoolLabels {
                profile: profile.to_owned(),
            })
            .set(i64::try_from(ready).unwrap_or(i64::MAX));
    }

    /// The pool of `profile` keeps `size` units when full.
    pub fn pool_size(&self, profile: &str, size: usize) {
        self.pool_size
            .get_or_create(&PoolLabels {
                profile: profile.to_owned(),
            })
            .set(i64::try_from(size).unwrap_or(i64::MAX));
    }

    /// A unit was asked of a pool, with `outcome` (`warm`, `unfit`, `empty`, `failed`).
    pub fn pool_claim(&self, outcome: &'static str) {
        self.pool_claims
            .get_or_create(&ClaimLabels { outcome })
            .inc();
    }

    /// A warm claim (its bind included) took `latency`.
    pub fn pool_claimed(&self, latency: Duration) {
        self.pool_claim_duration.observe(latency.as_secs_f64());
    }

    /// A `box/merge` ended with `outcome` (`merged`, `refused`, `failed`).
    pub fn merge(&self, outcome: &'static str) {
        self.merges.get_or_create(&MergeLabels { outcome }).inc();
    }

    /// A unit of a live session ended on its own (died, was killed).
    pub fn unit_ended(&self) {
        self.units_running.dec();
        self.units_ended.inc();
    }

    /// A started session ended and its `units` were removed, `ended` of which had ended before.
    pub fn session_ended(&self, units: usize, ended: usize) {
        self.sessions_active.dec();
        self.units_running.dec_by(count(units - ended.min(units)));
        self.units_ended.dec_by(count(ended));
        self.units_removed.inc_by(units as u64);
    }

    /// A call finished. `method` is its method's label from the session's
    /// method table (a bounded set); `tool` is a `tools/call`'s
    /// [`tool_label`]; the outcome is counted by name when [`OUTCOMES`] has
    /// it, else as `other`.
    pub fn call(
        &self,
        method: &'static str,
        tool: Option<&str>,
        outcome: &str,
        duration: Duration,
    ) {
        let labels = CallLabels {
            method,
            tool: tool.unwrap_or("").to_owned(),
            outcome: bounded(&OUTCOMES, outcome),
        };
        let error_type = match labels.outcome {
            "ok" | "failed" => "",
            other => other,
        };
        self.operation_duration
            .get_or_create(&OperationLabels {
                mcp_method_name: method,
                gen_ai_tool_name: labels.tool.clone(),
                error_type,
            })
            .observe(duration.as_secs_f64());
        self.calls.get_or_create(&labels).inc();
        self.call_duration.observe(duration.as_secs_f64());
    }

    /// A session task began.
    pub fn task_started(&self) {
        self.tasks.fetch_add(1, Ordering::SeqCst);
    }

    /// A session task ended (its units, if any, removed).
    pub fn task_ended(&self) {
        self.tasks.fetch_sub(1, Ordering::SeqCst);
    }

    /// Session tasks running, including those still starting their units.
    pub fn session_tasks(&self) -> usize {
        self.tasks.load(Ordering::SeqCst)
    }

    /// Sessions currently started.
    pub fn sessions_active(&self) -> i64 {
        self.sessions_active.get()
    }

    /// What the running units use now, summed per backend and profile (the
    /// host's usage sampler's reading): each series set, and a pair no
    /// longer running removed.
    pub fn set_usage(&self, sums: &[(UsageKey, box_backend::stats::UnitStats)]) {
        self.usage.set(sums);
    }

    /// The exposition, in the Prometheus text format ([`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Err(error) =
            prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)
        {
            tracing::warn!(%error, "encoding the metrics failed");
        }
        out
    }
}

/// A count as a gauge's step.
fn count(units: usize) -> i64 {
    i64::try_from(units).unwrap_or(i64::MAX)
}

/// `value` as one of `known` (borrowed from the set, so never the client's
/// text), else `other`.
fn bounded(known: &[&'static str], value: &str) -> &'static str {
    known
        .iter()
        .find(|candidate| **candidate == value)
        .copied()
        .unwrap_or("other")
}

/// The tool label of a `tools/call` of `tool`: its name when the unit listed
/// it at start (`listed`, a `tools/list` result), else `other`.
pub fn tool_label<'a>(tool: &'a str, listed: Option<&Value>) -> &'a str {
    let is_listed = listed
        .and_then(|listed| listed.get("tools"))
        .and_then(Value::as_array)
        .is_some_and(|tools| {
            tools
                .iter()
                .any(|entry| entry.get("name").and_then(Value::as_str) == Some(tool))
        });
    if is_listed { tool } else { "other" }
}

/// Whether the host can take new sessions: its backend answers (a listing of
/// its units within a bound). The HTTP transport asks this for `/readyz`; it
/// knows nothing of backends itself.
pub async fn readiness(backend: &dyn box_backend::Backend) -> Result<(), String> {
    let kind = backend.kind();
    match tokio::time::timeout(READY_TIMEOUT, backend.list()).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(error)) => Err(format!("the {kind} backend does not answer: {error}")),
        Err(_) => Err(format!(
            "the {kind} backend did not answer within {}",
            humantime::format_duration(READY_TIMEOUT)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn labels_come_from_bounded_sets() {
        assert_eq!(bounded(&OUTCOMES, "timeout"), "timeout");
        let listed = json!({"tools": [{"name": "echo"}, {"name": "read"}]});
        assert_eq!(tool_label("read", Some(&listed)), "read");
        assert_eq!(tool_label("nope", Some(&listed)), "other");
        assert_eq!(tool_label("read", None), "other");
    }

    #[test]
    fn an_escaped_label_value_stays_inside_its_line() {
        let metrics = Metrics::default();
        metrics.call(
            "tools/call",
            Some("a\"} 9\nbox_evil 1"),
            "ok",
            Duration::ZERO,
        );
        let text = metrics.render();
        assert!(
            !text.lines().any(|line| line.starts_with("box_evil")),
            "{text}"
        );
        assert!(text.contains("# HELP box_calls_total "), "{text}");
    }
}

/// A usage series' labels: the backend and the profile, both bounded (the
/// host's backend, the catalog's profiles); never a unit or session id.
#[derive(Debug, Clone, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct UsageKey {
    /// The backend's name.
    pub backend: String,
    /// The profile the units' sessions resolved.
    pub profile: String,
}

/// The usage gauges, sums over the running units of one backend and profile.
#[derive(Debug)]
struct UsageGauges {
    cpu: Family<UsageKey, Gauge<f64, std::sync::atomic::AtomicU64>>,
    memory: Family<UsageKey, Gauge>,
    pids: Family<UsageKey, Gauge>,
    read: Family<UsageKey, Gauge>,
    written: Family<UsageKey, Gauge>,
    /// The pairs set at the last reading.
    seen: std::sync::Mutex<Vec<UsageKey>>,
}

impl UsageGauges {
    fn register(registry: &mut Registry) -> Self {
        let gauges = Self {
            cpu: Family::default(),
            memory: Family::default(),
            pids: Family::default(),
            read: Family::default(),
            written: Family::default(),
            seen: std::sync::Mutex::new(Vec::new()),
        };
        registry.register(
            "box_units_cpu_seconds",
            "CPU time the running units used so far, summed per backend and profile (from each unit's cgroup; a local unit's processes)",
            gauges.cpu.clone(),
        );
        registry.register(
            "box_units_memory_bytes",
            "Memory the running units are charged for now, summed per backend and profile",
            gauges.memory.clone(),
        );
        registry.register(
            "box_units_pids",
            "Tasks (processes and threads) of the running units now, summed per backend and profile",
            gauges.pids.clone(),
        );
        registry.register(
            "box_units_io_read_bytes",
            "Bytes the running units read from block devices, summed per backend and profile",
            gauges.read.clone(),
        );
        registry.register(
            "box_units_io_write_bytes",
            "Bytes the running units wrote to block devices, summed per backend and profile",
            gauges.written.clone(),
        );
        gauges
    }

    fn set(&self, sums: &[(UsageKey, box_backend::stats::UnitStats)]) {
        let gauge = |value: Option<u64>| i64::try_from(value.unwrap_or(0)).unwrap_or(i64::MAX);
        for (key, stats) in sums {
            self.cpu
                .get_or_create(key)
                .set(stats.cpu_usec.unwrap_or(0) as f64 / 1e6);
            self.memory
                .get_or_create(key)
                .set(gauge(stats.memory_bytes));
            self.pids.get_or_create(key).set(gauge(stats.pids));
            self.read.get_or_create(key).set(gauge(stats.io_read_bytes));
            self.written
                .get_or_create(key)
                .set(gauge(stats.io_write_bytes));
        }
        let mut seen = match self.seen.lock() {
            Ok(seen) => seen,
            Err(poisoned) => poisoned.into_inner(),
        };
        for gone in seen
            .iter()
            .filter(|key| !sums.iter().any(|(set, _)| set == *key))
        {
            self.cpu.remove(gone);
            self.memory.remove(gone);
            self.pids.remove(gone);
            self.read.remove(gone);
            self.written.remove(gone);
        }
        *seen = sums.iter().map(|(key, _)| key.clone()).collect();
    }
}
