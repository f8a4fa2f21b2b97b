//! A session's units: started all or nothing within the profile's start
//! deadline, their executors initialized, linked to the session task by one
//! reader and one writer task each, and removed until the removal is
//! confirmed. The host's [`Ledger`](crate::ledger::Ledger) holds every unit
//! from the ask to start it until it is confirmed gone: what the host names
//! as left when it exits.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::task::TaskTracker;

use crate::ledger::{Removal, Tracked};
use crate::{HostConfig, Services};
use box_backend::{
    Backend, BackendError, ObjectsWiring, SessionLabel, StartedUnit, UnitEnd, UnitWiring,
};
use box_jsonrpc::lines::{Line, LineReader, MAX_MESSAGE_BYTES, write_line};
use box_jsonrpc::{self as jsonrpc, Kind, classify};
use box_policy::plan::{NetworkMode, UnitSpec};

use super::egress::EgressProxy;

/// How many messages may wait for a unit's executor to read them; a unit that
/// stops reading fills it, and its next request is refused naming the unit.
pub const UNIT_QUEUE: usize = 256;

/// An executor's stdio, framed.
pub struct ExecutorLink {
    pub(crate) reader: LineReader<Pin<Box<dyn AsyncRead + Send>>>,
    pub(crate) writer: Pin<Box<dyn AsyncWrite + Send>>,
}

impl ExecutorLink {
    /// Frame a started unit's executor stdio.
    pub fn new(
        stdin: Pin<Box<dyn AsyncWrite + Send>>,
        stdout: Pin<Box<dyn AsyncRead + Send>>,
    ) -> Self {
        Self {
            reader: LineReader::new(stdout, MAX_MESSAGE_BYTES),
            writer: stdin,
        }
    }
}

/// How long one removal of a unit may take before it counts as failed and is
/// tried again (an engine that stalls never answers).
pub const REMOVE_ATTEMPT: Duration = Duration::from_secs(30);
/// The first wait before a failed removal is tried again; doubled each time,
/// up to [`REMOVE_BACKOFF_MAX`].
const REMOVE_BACKOFF: Duration = Duration::from_secs(1);
/// See [`REMOVE_BACKOFF`].
const REMOVE_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Why a session's units did not all start.
#[derive(Debug, thiserror::Error)]
pub enum StartFailure {
    /// A backend refused or failed one (the first in plan order).
    #[error("{0}")]
    Backend(#[from] BackendError),
    /// The deadline passed with these units' starts still going on.
    #[error(
        "{} did not start within {} (the profile's start_timeout): the engine may be stalled; the start goes on, and whatever it makes is removed",
        .units.iter().map(|unit| format!("unit {unit}")).collect::<Vec<_>>().join(", "),
        humantime::format_duration(*.timeout)
    )]
    TimedOut {
        /// The units still starting.
        units: Vec<String>,
        /// The deadline.
        timeout: Duration,
    },
}

/// A session's start reported to its client as MCP progress
/// (`notifications/progress` on the initialize request, for a client that sent
/// `_meta.progressToken`): each unit's bytes summed, sent only when the sum
/// grows (MCP wants the progress to increase), dropped when the client lags.
pub struct InitProgress {
    token: Value,
    events: tokio::sync::mpsc::Sender<Value>,
    state: std::sync::Mutex<ProgressState>,
}

#[derive(Default)]
struct ProgressState {
    units: std::collections::BTreeMap<String, (u64, Option<u64>)>,
    sent: u64,
}

impl InitProgress {
    /// Progress for `token`, sent on `events` (the initialize request's).
    pub fn new(token: Value, events: tokio::sync::mpsc::Sender<Value>) -> Arc<Self> {
        Arc::new(Self {
            token,
            events,
            state: std::sync::Mutex::default(),
        })
    }

    fn for_unit(self: &Arc<Self>, unit: &str) -> box_backend::StartProgress {
        let (this, unit) = (Arc::clone(self), unit.to_owned());
        box_backend::StartProgress(Arc::new(move |report| this.report(&unit, report)))
    }

    /// The notification for `unit`'s `report`, if the sum grew.
    fn notification(&self, unit: &str, report: box_backend::ProgressReport) -> Option<Value> {
        let mut state = self.state.lock().ok()?;
        state
            .units
            .insert(unit.to_owned(), (report.done, report.total));
        let done: u64 = state.units.values().map(|(done, _)| done).sum();
        if done <= state.sent {
            return None;
        }
        state.sent = done;
        let total: Option<u64> = state.units.values().map(|(_, total)| *total).sum();
        let mut params = json!({
            "progressToken": self.token,
            "progress": done,
            "message": format!("unit {unit}: {}", report.message),
        });
        if let Some(total) = total.filter(|total| *total >= done) {
            params["total"] = json!(total);
        }
        Some(json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": params}))
    }

    fn report(&self, unit: &str, report: box_backend::ProgressReport) {
        if let Some(notification) = self.notification(unit, report) {
            let _ = self.events.try_send(notification);
        }
    }
}

/// What [`start_units`] wires into the units beyond their egress proxies.
#[derive(Default, Clone, Copy)]
pub struct StartWiring<'a> {
    /// Masked copies over the workspace unit's files (`hide`).
    pub workspace_masks: &'a [box_backend::FileMask],
    /// A worktree fork's borrowed git objects, for the workspace unit.
    pub objects: Option<&'a ObjectsWiring>,
    /// Where a client that sent a progress token hears the start's progress.
    pub progress: Option<&'a Arc<InitProgress>>,
    /// The unit a `box/fork` child was forked from.
    pub parent: Option<&'a str>,
    /// The span the units' start spans are children of.
    pub trace: Option<&'a box_otel::SpanContext>,
    /// What the pools gave a `source = "fork"` workspace unit before its
    /// fork was made: a unit taken, whose directory holds the fork, or why
    /// it starts cold.
    pub fork_claim: Option<&'a crate::pool::ForkClaim>,
}

/// Start every unit of `specs` concurrently, each in a task of its own, the
/// ledger told of each, within `timeout`. If any fails or the deadline
/// passes, the units that did start are removed in `background`, as are
/// those whose start finishes later, and the failure names the units.
/// `wire`: what the host wires in beyond each unit's egress proxy.
pub async fn start_units(
    config: &HostConfig,
    services: &Arc<Services>,
    label: &SessionLabel,
    specs: &[UnitSpec],
    timeout: Duration,
    background: &TaskTracker,
    wire: StartWiring<'_>,
) -> Result<(Vec<(u64, StartedUnit)>, Vec<EgressProxy>), StartFailure> {
    let StartWiring {
        workspace_masks,
        objects,
        progress,
        parent,
        trace,
        fork_claim,
    } = wire;
    // Asked before anything starts: what a backend cannot take wired in
    // refuses the start here, with no proxy started for it.
    let (capabilities, kind) = (services.backend.capabilities(), services.backend.kind());
    for spec in specs {
        let workspace = spec.role == box_policy::plan::Role::Workspace;
        let wants = box_backend::Wants {
            egress_socket: spec.network.mode == NetworkMode::Egress,
            host_files: workspace && !workspace_masks.is_empty(),
            worktree_objects: workspace && objects.is_some(),
        };
        capabilities
            .refuse(kind, &spec.name, wants)
            .map_err(|refusal| StartFailure::Backend(refusal.into()))?;
    }
    let deadline = tokio::time::Instant::now() + timeout;
    let mut starts = Vec::new();
    for spec in specs {
        let key = services.ledger.starting(&label.session, &spec.name);
        // The egress proxy is the unit's start's: a claimed unit's is served in
        // the pooled unit's directory, a cold one's in a new one.
        let mut wiring = UnitWiring {
            runtime_dir: Some(config.runtime_dir.clone()),
            ..UnitWiring::default()
        };
        if spec.role == box_policy::plan::Role::Workspace {
            // Only a workspace unit has a fork's files, or masks over them.
            wiring.objects = objects.cloned();
            wiring.masks = workspace_masks.to_vec();
        }
        wiring.progress = progress.map(|progress| progress.for_unit(&spec.name));
        wiring.parent = parent.map(str::to_owned);
        let mut span = services
            .tracer
            .span(box_otel::SpanKind::Internal, trace, || {
                format!("unit.start {}", spec.name)
            });
        span.set("box.unit.name", spec.name.as_str());
        span.set_with("box.backend", || services.backend.kind().to_string());
        if let Some(parent) = span.context().cloned() {
            let tracer = services.tracer.clone();
            wiring.phases = Some(box_backend::StartPhases(Arc::new(
                move |name, started, ended, ok| {
                    tracer.record(box_otel::SpanData {
                        context: parent.child(),
                        parent_span_id: Some(parent.span_id),
                        name: format!("unit.{name}"),
                        kind: box_otel::SpanKind::Internal,
                        start: unix_nanos(started),
                        end: unix_nanos(ended),
                        attributes: Vec::new(),
                        error: (!ok).then(|| format!("{name}_failed")),
                    });
                },
            )));
        }
        let fork_claim = fork_claim
            .filter(|_| spec.role == box_policy::plan::Role::Workspace)
            .cloned();
        let (services, label, spec) = (services.clone(), label.clone(), spec.clone());
        let task = tokio::spawn(async move {
            // A warm unit from a pool when one fits (its plan bound late), else cold.
            let mut claiming =
                services
                    .tracer
                    .span(box_otel::SpanKind::Internal, span.context(), || {
                        format!("unit.claim {}", spec.name)
                    });
            let pools = services.pool_services();
            let claim = match &fork_claim {
                None => crate::pool::claim(pools, &label, &spec, &wiring, key).await,
                Some(crate::pool::ForkClaim::Taken(taken)) => {
                    crate::pool::claim_taken(pools, &label, &spec, &wiring, key, taken).await
                }
                Some(crate::pool::ForkClaim::Cold(why)) => {
                    crate::pool::Claim::Cold(why.clone(), None)
                }
            };
            match &claim {
                // No pool was asked: nothing was claimed.
                crate::pool::Claim::NoPools => claiming.discard(),
                crate::pool::Claim::Warm(..) => {
                    claiming.set("box.pool.warm", true);
                    claiming.end();
                }
                crate::pool::Claim::Cold(..) => {
                    claiming.set("box.pool.warm", false);
                    claiming.end();
                }
            }
            let why = match claim {
                crate::pool::Claim::Warm(unit, proxy) => {
                    audit_claim(&services, &label, &spec, Some(&unit.envelope.id), None);
                    span.set("box.pool.warm", true);
                    span.set_with("box.unit.id", || unit.envelope.id.clone());
                    return Ok((*unit, proxy));
                }
                crate::pool::Claim::NoPools => None,
                crate::pool::Claim::Cold(why, unbound) => {
                    audit_claim(&services, &label, &spec, None, Some(&why));
                    if let Some(unbound) = unbound {
                        remove_until_gone(&services, vec![unbound]).await;
                    }
                    Some(why)
                }
            };
            // A cold egress unit's proxy listens before its unit starts;
            // dropped (stopped, its directory removed) if the start fails.
            let proxy = if spec.network.mode == NetworkMode::Egress {
                let runtime_dir = wiring.runtime_dir.clone().unwrap_or_default();
                match EgressProxy::start(&runtime_dir, services.proxies(), &label.session, &spec) {
                    Ok(proxy) => {
                        wiring.egress = proxy.wiring().egress;
                        Some(proxy)
                    }
                    Err(message) => {
                        span.set_error("start_failed");
                        services.ledger.gone(key);
                        return Err(BackendError::Other {
                            unit: spec.name.clone(),
                            doing: "starting its egress proxy".to_owned(),
                            message,
                        });
                    }
                }
            } else {
                None
            };
            let result = services
                .backend
                .start_wired(&label, &spec, &wiring)
                .await
                .map(|unit| match why {
                    Some(why) => crate::pool::cold(unit, why),
                    None => unit,
                });
            match &result {
                Ok(unit) => {
                    span.set_with("box.unit.id", || unit.envelope.id.clone());
                    services.ledger.started(key, &unit.envelope.id);
                }
                // A failed start undoes itself (the backend's contract).
                Err(_) => {
                    span.set_error("start_failed");
                    services.ledger.gone(key);
                }
            }
            result.map(|unit| (unit, proxy))
        });
        starts.push((key, task));
    }
    let mut started = Vec::new();
    // Dropped (stopped, their directories removed) if the session does not start.
    let mut proxies = Vec::new();
    let mut failure = None;
    let mut late = Vec::new();
    for ((key, mut task), spec) in starts.into_iter().zip(specs) {
        match tokio::time::timeout_at(deadline, &mut task).await {
            Ok(Ok(Ok((unit, proxy)))) => {
                started.push((key, unit));
                proxies.extend(proxy);
            }
            Ok(Ok(Err(error))) => {
                failure.get_or_insert(StartFailure::Backend(error));
            }
            Ok(Err(join)) => {
                services.ledger.gone(key);
                failure.get_or_insert(StartFailure::Backend(BackendError::Other {
                    unit: spec.name.clone(),
                    doing: "starting the unit".to_owned(),
                    message: format!("the start failed: {join}"),
                }));
            }
            Err(_) => late.push((spec.name.clone(), key, task)),
        }
    }
    if failure.is_none() && late.is_empty() {
        return Ok((started, proxies));
    }
    remove_in_background(services, started, background);
    let names: Vec<String> = late.iter().map(|(name, _, _)| name.clone()).collect();
    for (_, key, task) in late {
        let services = services.clone();
        background.spawn(async move {
            match task.await {
                Ok(Ok((unit, proxy))) => {
                    let tracked = Tracked {
                        key,
                        id: unit.envelope.id.clone(),
                    };
                    drop((unit, proxy));
                    remove_until_gone(&services, vec![tracked]).await;
                }
                Ok(Err(_)) => {}
                Err(_) => services.ledger.gone(key),
            }
        });
    }
    Err(failure.unwrap_or(StartFailure::TimedOut {
        units: names,
        timeout,
    }))
}

/// An audit line for a unit asked of a pool: claimed (`id`) or cold (`why`).
fn audit_claim(
    services: &Services,
    label: &SessionLabel,
    spec: &UnitSpec,
    claimed: Option<&str>,
    why: Option<&str>,
) {
    if let Some(audit) = &services.audit {
        audit.pool_claim(&crate::audit::PoolClaim {
            session: &label.session,
            profile: &label.profile,
            unit: &spec.name,
            claimed,
            why,
        });
    }
}

/// Remove `units` (their executors' stdio dropped first) in `background`,
/// until confirmed.
pub fn remove_in_background(
    services: &Arc<Services>,
    units: Vec<(u64, StartedUnit)>,
    background: &TaskTracker,
) {
    if units.is_empty() {
        return;
    }
    let tracked: Vec<Tracked> = units
        .into_iter()
        .map(|(key, unit)| Tracked {
            key,
            id: unit.envelope.id,
        })
        .collect();
    let services = services.clone();
    background.spawn(async move { remove_until_gone(&services, tracked).await });
}

/// Remove units by backend id, concurrently, each attempt bounded by
/// [`REMOVE_ATTEMPT`]; every failure is logged and returned with its id.
pub async fn remove_units(
    backend: &dyn Backend,
    ids: &[String],
    removal: Removal,
) -> Vec<(String, String)> {
    let results = join_all(ids.iter().map(|id| async move {
        let removed = match removal {
            Removal::Graceful => backend.remove(id),
            Removal::AtOnce => backend.remove_now(id),
        };
        match tokio::time::timeout(REMOVE_ATTEMPT, removed).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err(format!(
                "the engine did not answer within {}",
                humantime::format_duration(REMOVE_ATTEMPT)
            )),
        }
    }))
    .await;
    let mut failed = Vec::new();
    for (id, result) in ids.iter().zip(results) {
        if let Err(error) = result {
            tracing::error!(unit = %id, %error, "removing a unit failed");
            failed.push((id.clone(), error));
        }
    }
    failed
}

/// Remove `units` and tell the ledger of each removal confirmed; what fails
/// is tried again, backing off, until every one is gone (the host's exit is
/// what ends an engine that never answers: it then names them).
pub async fn remove_until_gone(services: &Services, mut units: Vec<Tracked>) {
    let mut backoff = REMOVE_BACKOFF;
    loop {
        let ids: Vec<String> = units.iter().map(|unit| unit.id.clone()).collect();
        let failed = remove_units(services.backend.as_ref(), &ids, services.removal()).await;
        units.retain(|unit| {
            let still = failed.iter().any(|(id, _)| *id == unit.id);
            if !still {
                services.ledger.gone(unit.key);
            }
            still
        });
        if units.is_empty() {
            return;
        }
        tracing::warn!(
            units = %units.iter().map(|unit| unit.id.as_str()).collect::<Vec<_>>().join(", "),
            "units are not removed yet; trying again in {}",
            humantime::format_duration(backoff)
        );
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(REMOVE_BACKOFF_MAX);
    }
}

/// What an executor said when it was started, before anything in its unit
/// could run code: its initialize result and its tool list.
#[derive(Debug, Clone)]
pub struct ExecutorStart {
    /// The `initialize` result.
    pub initialize: Value,
    /// The `tools/list` result, when it answered one. The host answers every
    /// later `tools/list` from it, so a unit whose executor was tampered with
    /// afterwards cannot show the client other tools (security case E67).
    pub tools: Option<Value>,
}

/// The first request id the session's router gives a unit (0 and 1 are the
/// host's own `initialize` and `tools/list`).
pub const FIRST_REQUEST_ID: u64 = 2;

/// Send one request to an executor and read until its answer (a ping from the
/// executor meanwhile is answered, anything else is ignored).
async fn exchange(
    link: &mut ExecutorLink,
    id: u64,
    method: &str,
    params: Value,
) -> Result<Value, String> {
    write_line(
        &mut link.writer,
        &jsonrpc::request(json!(id), method, params),
    )
    .await
    .map_err(|error| format!("writing {method} to the executor: {error}"))?;
    loop {
        let line = link
            .reader
            .next()
            .await
            .map_err(|error| format!("reading the executor's answer to {method}: {error}"))?;
        let bytes = match line {
            None => {
                return Err(format!(
                    "the executor closed its output before answering {method}"
                ));
            }
            Some(Line::TooLong(length)) => {
                return Err(format!(
                    "the executor sent a line of {length} bytes; at most {MAX_MESSAGE_BYTES}"
                ));
            }
            Some(Line::Message(bytes)) => bytes,
        };
        let Ok(message) = serde_json::from_slice::<Value>(&bytes) else {
            return Err("the executor wrote something that is not JSON".to_owned());
        };
        match classify(&message) {
            Ok(Kind::Response { id: answered }) if answered == json!(id) => {
                if let Some(error) = message.get("error") {
                    return Err(format!("the executor refused {method}: {error}"));
                }
                let result = message.get("result").cloned().unwrap_or(Value::Null);
                if !result.is_object() {
                    return Err(format!("the executor's {method} result is not an object"));
                }
                return Ok(result);
            }
            Ok(Kind::Request { id, method }) if method == "ping" => {
                write_line(&mut link.writer, &jsonrpc::result_response(id, json!({})))
                    .await
                    .map_err(|error| format!("answering the executor's ping: {error}"))?;
            }
            _ => {}
        }
    }
}

/// Initialize an executor (`initialize`, `notifications/initialized`) and
/// read its tool list, within `timeout`.
pub async fn initialize_executor(
    link: &mut ExecutorLink,
    params: Value,
    timeout: Duration,
) -> Result<ExecutorStart, String> {
    let start = async {
        let initialize = exchange(link, 0, "initialize", params).await?;
        write_line(
            &mut link.writer,
            &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        )
        .await
        .map_err(|error| format!("writing notifications/initialized: {error}"))?;
        let offers_tools = initialize
            .pointer("/capabilities/tools")
            .is_some_and(Value::is_object);
        let tools = if offers_tools {
            Some(exchange(link, 1, "tools/list", json!({})).await?)
        } else {
            None
        };
        Ok(ExecutorStart { initialize, tools })
    };
    match tokio::time::timeout(timeout, start).await {
        Ok(result) => result,
        Err(_) => Err(format!(
            "the executor did not answer initialize and tools/list within {}",
            humantime::format_duration(timeout)
        )),
    }
}

/// A sentence for a unit's end. The backend's reason already says who
/// ended, how (exit code or signal) and why (an OOM kill): each once.
pub fn describe_end(end: &UnitEnd) -> String {
    end.reason.clone()
}

/// `at` in nanoseconds since the Unix epoch (OTLP's time).
fn unix_nanos(at: std::time::SystemTime) -> u64 {
    at.duration_since(std::time::UNIX_EPOCH)
        .map(|since| u64::try_from(since.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 8, item 15: each backend's sentence already carries the exit
    /// code, the signal and the OOM kill; the host says them once.
    #[test]
    fn a_units_end_is_described_once() {
        let docker = box_backend_docker::body::unit_end(
            "ws",
            box_backend_docker::body::Ending::Container,
            Some(137),
            box_backend::OomEvidence::NotKilled,
            1024,
        );
        let end = UnitEnd {
            exit_code: docker.exit_code,
            oom_killed: docker.oom_killed,
            reason: docker.reason.clone(),
        };
        assert_eq!(describe_end(&end), docker.reason);
        let oom = box_backend_docker::body::unit_end(
            "ws",
            box_backend_docker::body::Ending::Container,
            Some(137),
            box_backend::OomEvidence::Killed,
            1024,
        );
        let end = UnitEnd {
            exit_code: oom.exit_code,
            oom_killed: oom.oom_killed,
            reason: oom.reason.clone(),
        };
        let text = describe_end(&end);
        assert_eq!(text.matches("137").count(), 1, "{text}");
        assert_eq!(text.matches("OOM").count(), 1, "{text}");
        assert!(!text.contains("out-of-memory"), "{text}");
    }

    /// Each unit's bytes summed; only growth is sent (MCP progress increases),
    /// with a total once every reporting unit knows its own.
    #[test]
    fn init_progress_sums_the_units_and_only_grows() {
        let (events, _rx) = tokio::sync::mpsc::channel(8);
        let progress = InitProgress::new(json!("tok"), events);
        let report = |done, total: Option<u64>| box_backend::ProgressReport {
            message: "pulling img: 0/1 layers".to_owned(),
            done,
            total,
        };
        let first = progress
            .notification("workspace", report(10, Some(100)))
            .unwrap();
        assert_eq!(first["method"], json!("notifications/progress"));
        assert_eq!(first["params"]["progressToken"], json!("tok"));
        assert_eq!(first["params"]["progress"], json!(10));
        assert_eq!(first["params"]["total"], json!(100));
        assert_eq!(
            first["params"]["message"],
            json!("unit workspace: pulling img: 0/1 layers")
        );
        let both = progress.notification("browser", report(5, None)).unwrap();
        assert_eq!(both["params"]["progress"], json!(15));
        assert!(both["params"].get("total").is_none(), "{both}");
        assert!(progress.notification("browser", report(5, None)).is_none());
        let done = progress
            .notification("browser", report(50, Some(50)))
            .unwrap();
        assert_eq!(done["params"]["progress"], json!(60));
        assert_eq!(done["params"]["total"], json!(150));
    }
}
