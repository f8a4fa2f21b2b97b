//! One session: a task that owns everything about it. Before `initialize` it
//! answers only `ping`, `server/discover` (method not found: a probe never
//! starts units) and `initialize`; at `initialize` it checks the request
//! (-32602 naming the field), agrees a protocol version, reads the box ask,
//! resolves and tightens the profile, starts every unit (all or nothing),
//! initializes their executors and answers with the workspace unit's
//! capability plus the envelopes. Starting is bounded by the profile's
//! `start_timeout`. Then it routes every message through the proxy's
//! [`Router`] until the session ends (the client leaves, the transport ends
//! it, idle, lifetime, host shutdown), when it ends the units' executors
//! (their processes end with them) and removes the units. The session is
//! over only once every unit it asked for is confirmed removed (the host's
//! ledger names those that are not).

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use box_jsonrpc::lines::{Line, MAX_MESSAGE_BYTES, write_line};
use box_jsonrpc::session::Inbound;
pub use box_jsonrpc::session::{AskPart, SessionGone, SessionHandle, TransportAsk};

use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinSet};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::HostConfig;
pub use super::ask::EXECUTOR_KEY;
use super::ask::{
    check_initialize, executor_initialize_params, initialize_result, merge_ask, read_ask,
};
use super::audit::ClientInfo;
use super::redact::{self, SessionRedactor};
use super::router::{Router, UnitMessage, WhenFull};
use super::state;
use super::units::{
    ExecutorLink, FIRST_REQUEST_ID, InitProgress, Removal, StartWiring, Tracked, UNIT_QUEUE,
    describe_end, initialize_executor, remove_until_gone, start_units,
};
use box_backend::{Envelope, SessionLabel, UnitEnd, UnitState};
use box_jsonrpc::{
    self as jsonrpc, Kind, ReplyTo, check_params, classify, code, discover_refusal, error_response,
    error_response_with_data, negotiate_version, params, params_mut, result_response,
};
use box_policy::plan::{MountMode, Plan, PlanError, Role, UnitSpec, WorkspaceSource};

use super::fork::{self, ChildFork};
use box_policy::profile::OnPersisted;

/// The most client requests one session may have in flight at once.
const MAX_IN_FLIGHT: usize = 256;
/// How many client messages may wait for the session task.
const INBOUND_QUEUE: usize = 64;
/// How many unit events may wait for the session task; a unit's reader waits
/// when it is full (back-pressure onto that executor, not loss).
const EVENT_QUEUE: usize = 256;
/// After a unit's output closes, how long to wait for the backend to say why
/// before answering its calls with what is known.
const UNIT_END_GRACE: Duration = Duration::from_secs(2);
/// After the backend says a unit ended, how long its output still gets to be
/// read to its end (what the unit sent before it ended answers calls) before
/// its calls are answered with the end.
const UNIT_END_DRAIN: Duration = Duration::from_secs(2);
/// At session end, how long executors get to end their processes and exit
/// after their input closes, before their units are removed anyway.
const SESSION_END_GRACE: Duration = Duration::from_secs(5);
/// After a call's deadline fires, how long an answer already on its way
/// still wins over it. A host frozen past the deadline (SIGSTOP, a stalled
/// VM) runs the deadline's timer before the answer waiting in the unit's
/// pipes has crossed the tasks between (the engine's stream, a pump, the
/// reader); an answer the unit gave is the truth, a timeout is a guess.
const DEADLINE_SETTLE: Duration = Duration::from_secs(1);
/// When the idle time has run out, how long what the client sent meanwhile
/// still counts: a host frozen past the idle time finds its clients'
/// requests waiting behind the timer (in sockets, in a transport's tasks),
/// and a session is not idle while they wait.
const IDLE_SETTLE: Duration = Duration::from_secs(1);

/// What a `source = "fork"` workspace's parent is called in answers.
const HOST_DIRECTORY: &str = "host directory";

/// Removes a session's workspace fork unless the session started (then the
/// unit holds it and the session's end removes it).
struct ForkGuard {
    config: Arc<HostConfig>,
    child: Option<ChildFork>,
}

impl Drop for ForkGuard {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            let config = self.config.clone();
            tokio::task::spawn_blocking(move || fork::remove_storage(&config, &child));
        }
    }
}

/// The `_meta` key naming the unit a request is for (`fork-1`, `workspace`).
pub const UNIT_META: &str = "box/unit";

/// The unit `_meta["box/unit"]` names: a workspace unit (the session's, or a
/// fork) still in the session.
fn addressed_unit(live: &Live, asked: &Value) -> Result<usize, (i64, String)> {
    let Some(name) = asked.as_str() else {
        return Err((
            code::INVALID_PARAMS,
            format!("_meta.{UNIT_META}: expected a unit name, got {asked}"),
        ));
    };
    let found = live
        .units
        .iter()
        .position(|unit| unit.spec.role == Role::Workspace && unit.spec.name == name);
    match found {
        Some(index) if live.units[index].removed => Err((
            code::INVALID_PARAMS,
            format!("_meta.{UNIT_META}: unit `{name}` was discarded"),
        )),
        Some(index) => Ok(index),
        None => {
            let known: Vec<&str> = live
                .units
                .iter()
                .filter(|unit| unit.spec.role == Role::Workspace && !unit.removed)
                .map(|unit| unit.spec.name.as_str())
                .collect();
            Err((
                code::INVALID_PARAMS,
                format!(
                    "_meta.{UNIT_META}: no unit `{name}` in this session; units: {}",
                    named(&known)
                ),
            ))
        }
    }
}

/// Unit names in an error: `` `a`, `b` ``, or `none`.
fn named(names: &[&str]) -> String {
    if names.is_empty() {
        return "none".to_owned();
    }
    names
        .iter()
        .map(|name| format!("`{name}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `box/network.set {unit?, allow?}`: narrow a running egress unit's allow list,
/// or restore it up to the profile's bound; without `allow`, only say what is in
/// force. `unit` may be left out when one unit of the session has egress.
fn network_set(live: &Live, message: &Value) -> Result<Value, (i64, String)> {
    let invalid = |why: String| (code::INVALID_PARAMS, format!("box/network.set: {why}"));
    let params = params(message);
    let asked = match params.and_then(|p| p.get("unit")) {
        None => None,
        Some(Value::String(unit)) => Some(unit.as_str()),
        Some(other) => return Err(invalid(format!("unit: expected a unit name, got {other}"))),
    };
    if let Some(unknown) = params.and_then(|p| {
        p.keys()
            .find(|key| !["unit", "allow", "_meta"].contains(&key.as_str()))
    }) {
        return Err(invalid(format!(
            "unknown parameter `{unknown}`; it takes unit and allow"
        )));
    }
    let egress: Vec<&str> = live
        .egress
        .iter()
        .map(|proxy| proxy.unit.as_str())
        .collect();
    let proxy = match asked {
        Some(unit) => live
            .egress
            .iter()
            .find(|proxy| proxy.unit == unit)
            .ok_or_else(|| {
                invalid(format!(
                    "unit `{unit}` has no egress network; units with egress: {}",
                    named(&egress)
                ))
            })?,
        None => match live.egress.as_slice() {
            [only] => only,
            [] => {
                return Err(invalid(
                    "no unit of this session has an egress network".to_owned(),
                ));
            }
            _ => {
                return Err(invalid(format!(
                    "several units have egress; name one with `unit`: {}",
                    named(&egress)
                )));
            }
        },
    };
    match params.and_then(|p| p.get("allow")) {
        None => Ok(proxy.describe()),
        Some(allow) => proxy.set_network(allow).map_err(invalid),
    }
}

/// Start a session task. Messages for the client that belong to no request go
/// to `general`. The session ends when every handle is dropped, when `end` is
/// called, or when `parent` is cancelled.
pub fn spawn_session(
    config: Arc<HostConfig>,
    id: String,
    general: mpsc::Sender<Value>,
    parent: &CancellationToken,
) -> SessionHandle {
    spawn_session_asking(config, id, general, parent, TransportAsk::default())
}

/// [`spawn_session`] for a session whose transport carried an ask (the HTTP
/// path and headers, `box serve --tighten`): at `initialize` it is merged
/// with the client's capability ask ([`merge_ask`]).
pub fn spawn_session_asking(
    config: Arc<HostConfig>,
    id: String,
    general: mpsc::Sender<Value>,
    parent: &CancellationToken,
    transport_ask: TransportAsk,
) -> SessionHandle {
    let (inbound_tx, inbound_rx) = mpsc::channel(INBOUND_QUEUE);
    let cancel = parent.child_token();
    let host = parent.clone();
    let done = CancellationToken::new();
    let version = Arc::new(OnceLock::new());
    let handle = SessionHandle::new(
        id.clone(),
        inbound_tx,
        cancel.clone(),
        done.clone(),
        version.clone(),
    );
    config.metrics.task_started();
    tokio::spawn(async move {
        let metrics_config = config.clone();
        let session = Session {
            config,
            id,
            general,
            cancel,
            host,
            background: TaskTracker::new(),
            version,
            transport_ask,
        };
        session.run(inbound_rx).await;
        metrics_config.metrics.task_ended();
        done.cancel();
    });
    handle
}

struct Session {
    config: Arc<HostConfig>,
    id: String,
    general: mpsc::Sender<Value>,
    cancel: CancellationToken,
    /// The host's shutdown: when it (not the session alone) ends the session,
    /// calls in flight get `HostConfig::drain` to finish.
    host: CancellationToken,
    /// Removals of units whose start failed or finished late: the session is
    /// not over until they are done.
    background: TaskTracker,
    /// The negotiated protocol version, set once at a successful initialize.
    version: Arc<OnceLock<&'static str>>,
    /// What the transport asked, merged with the capability ask at initialize.
    transport_ask: TransportAsk,
}

/// Why a session could not start: the JSON-RPC error it answers initialize with.
struct StartError {
    code: i64,
    message: String,
    data: Option<Value>,
    /// What refused it (a label of `box_sessions_refused`, from
    /// `metrics::REFUSALS`); `None` when it failed instead (its units did
    /// not start).
    refusal: Option<&'static str>,
}

impl StartError {
    /// Refused for `reason` (from `metrics::REFUSALS`).
    fn refused(reason: &'static str, message: String) -> Self {
        Self {
            code: code::INVALID_PARAMS,
            message,
            data: None,
            refusal: Some(reason),
        }
    }

    fn internal(message: String) -> Self {
        Self {
            code: code::INTERNAL_ERROR,
            message,
            data: None,
            refusal: None,
        }
    }

    fn into_response(self, id: Value) -> Value {
        match self.data {
            Some(data) => error_response_with_data(id, self.code, self.message, data),
            None => error_response(id, self.code, self.message),
        }
    }
}

/// What the proxy keeps with a forwarded request.
#[derive(Debug)]
struct Tag {
    method: String,
    tool: Option<String>,
    arguments_digest: Option<String>,
    started: Instant,
    /// The deadline's timer, then the settle's once it has fired.
    deadline: Option<AbortHandle>,
    /// The deadline fired; the answer may still come within the settle.
    overdue: bool,
    rewrite: Rewrite,
    /// A process method whose answer carries output (`read`, `close`): the
    /// process id as the unit knows it, and the fd read.
    process: Option<(String, u8)>,
    /// Its id at the unit, once forwarded (the call journal's key).
    unit_id: Option<u64>,
}

/// How an answer is changed on its way back.
#[derive(Debug, Clone, PartialEq)]
enum Rewrite {
    None,
    /// A server unit's process id is namespaced `<unit>:<id>`.
    ProcessId {
        unit: String,
    },
}

struct Unit {
    /// Its key in the host's ledger.
    key: u64,
    spec: UnitSpec,
    envelope: Envelope,
    writer: Option<mpsc::Sender<Value>>,
    /// Why it ended, once it has.
    ended: Option<String>,
    /// Its output closed (waiting for the backend's cause).
    closed: bool,
    /// Why its output closed.
    close_reason: Option<String>,
    /// The backend's word that it ended, held until its output is read to
    /// its end ([`UNIT_END_DRAIN`] at most).
    draining: Option<UnitEnd>,
    /// Its tool list, read before anything ran in it.
    tools: Option<Value>,
    /// The renewal of its lease, held while the session wants the unit.
    _renewal: Option<box_backend::Renewal>,
    /// A child made by `box/fork`: its fork.
    fork: Option<ChildFork>,
    /// Discarded (`box/discard`): its removal is under way or done.
    removed: bool,
}

/// A child unit started by `box/fork`, handed to the session task to join
/// the session (or, if the session is ending, to be removed).
pub struct ForkStarted {
    id: Value,
    reply: ReplyTo,
    key: u64,
    spec: UnitSpec,
    envelope: Envelope,
    link: ExecutorLink,
    ended: futures::future::BoxFuture<'static, UnitEnd>,
    renewal: Option<box_backend::Renewal>,
    tools: Option<Value>,
    egress: Vec<super::egress::EgressProxy>,
    child: ChildFork,
    advisory: Option<String>,
    skipped: usize,
}

impl std::fmt::Debug for ForkStarted {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ForkStarted")
            .field("unit", &self.spec.name)
            .field("id", &self.envelope.id)
            .finish_non_exhaustive()
    }
}

/// A session after initialize: its units and its routing.
struct Live {
    plan: Plan,
    /// The client, as its `initialize` named itself (for the audit).
    client: Option<ClientInfo>,
    units: Vec<Unit>,
    workspace: Option<usize>,
    router: Router<Tag>,
    events_tx: mpsc::Sender<UnitEvent>,
    events_rx: mpsc::Receiver<UnitEvent>,
    tasks: JoinSet<()>,
    last_activity: Instant,
    started: Instant,
    /// Every secret value the session's units were handed or the host
    /// scrubbed, replaced in everything a unit sends toward the client.
    redactor: SessionRedactor,
    /// The egress proxies of the units whose network is egress; they live as
    /// long as the session's units.
    egress: Vec<super::egress::EgressProxy>,
    /// The workspace unit's masked copies (`on_persisted_credentials = "hide"`).
    masks: Option<crate::hide::Masks>,
    /// How each executor is initialized (a fork's too).
    executor_params: Value,
    /// The session's units' labels.
    label: SessionLabel,
    /// The number of the next `box/fork` child.
    next_fork: u32,
    /// The session's profile and its tightening, which a fork's `tighten`
    /// narrows further.
    profile: box_policy::profile::Profile,
    tighten: Value,
    /// The journal of calls in flight, when the session's identity is kept.
    journal: Option<state::Journal>,
    /// After a reattach: the calls the dead host sent and never saw
    /// answered, by unit and id at the unit.
    late: std::collections::HashMap<(usize, u64), Value>,
}

enum Route {
    Unit(usize, Value, Rewrite),
    Answer(Value),
}

impl Session {
    /// Serve the session, then wait until every unit it asked for is
    /// confirmed gone, however it ended.
    async fn run(self, inbound: mpsc::Receiver<Inbound>) {
        self.serve_session(inbound).await;
        self.background.close();
        self.background.wait().await;
        // The children's storage is gone by now; their directory goes too.
        let dir = fork::session_dir(&self.config, &self.id);
        let _ = std::fs::remove_dir(&dir);
        if let Some(instance) = dir.parent() {
            let _ = std::fs::remove_dir(instance);
        }
    }

    async fn serve_session(&self, mut inbound: mpsc::Receiver<Inbound>) {
        let cancel = self.cancel.clone();
        let mut live = loop {
            let message = tokio::select! {
                () = cancel.cancelled() => {
                    drain(&mut inbound, "the session was ended");
                    return;
                }
                message = inbound.recv() => message,
            };
            match message {
                None => return,
                Some(Inbound::Other(_)) => {}
                Some(Inbound::Request(message, reply)) => {
                    let Ok(Kind::Request { id, method }) = classify(&message) else {
                        reply.answer(error_response(
                            Value::Null,
                            code::INVALID_REQUEST,
                            "not a JSON-RPC request",
                        ));
                        continue;
                    };
                    if let Err(why) = check_params(&message) {
                        reply.answer(error_response(id, code::INVALID_PARAMS, why));
                        continue;
                    }
                    match method.as_str() {
                        "initialize" => match self.start(&message, &reply.events).await {
                            Ok((mut live, result)) => {
                                live.client = ClientInfo::of_initialize(&message);
                                reply.answer(result_response(id, result));
                                if self.cancel.is_cancelled() {
                                    // Shutdown came during the start: end at once.
                                    let mut live = live;
                                    self.finish(&mut live, "the host is shutting down").await;
                                    return;
                                }
                                break live;
                            }
                            Err(error) => {
                                self.report_start_failure(&message, &error);
                                reply.answer(error.into_response(id));
                            }
                        },
                        "ping" => reply.answer(result_response(id, json!({}))),
                        "server/discover" => reply.answer(discover_refusal(id)),
                        _ => reply.answer(error_response(
                            id,
                            code::INVALID_REQUEST,
                            format!(
                                "{method}: the session is not initialized; send initialize first"
                            ),
                        )),
                    }
                }
            }
        };
        let why = self.serve(&mut live, &mut inbound).await;
        if self.host.is_cancelled()
            && live.journal.is_some()
            && self
                .config
                .handoff
                .load(std::sync::atomic::Ordering::SeqCst)
        {
            // SIGHUP: its calls drained, the session is left to the next
            // host (its units, its state file); this process exits holding
            // them, so nothing closes an executor's input.
            tracing::info!(session = %self.id, "session handed off: its units are left for the next host to re-adopt");
            // Their egress directories too: the units have them mounted and
            // the next host serves their proxies there.
            for proxy in &live.egress {
                proxy.keep_dir();
            }
            drain(
                &mut inbound,
                "the host is handing its sessions to a new process; reattach",
            );
            self.config
                .parked
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::future::pending::<()>().await;
        }
        tracing::info!(session = %self.id, why = %why, "session ending");
        drain(&mut inbound, &why);
        self.finish(&mut live, &why).await;
    }

    /// A refused `initialize` is a WARN line, an audit line and a count
    /// ([`crate::report_refusal`]); one whose units failed is a WARN line.
    fn report_start_failure(&self, message: &Value, error: &StartError) {
        let client = ClientInfo::of_initialize(message);
        let profile = read_ask(params(message))
            .and_then(|ask| merge_ask(ask, &self.transport_ask))
            .ok()
            .map(|ask| {
                ask.profile
                    .unwrap_or_else(|| self.config.default_profile.clone())
            });
        match error.refusal {
            Some(reason) => crate::report_refusal(
                &self.config,
                &crate::audit::Refusal {
                    reason,
                    detail: &error.message,
                    session: Some(&self.id),
                    profile: profile.as_deref(),
                    client: client.as_ref(),
                    http: None,
                },
            ),
            None => tracing::warn!(
                session = %self.id,
                profile = profile.as_deref(),
                "a session could not start: {}",
                crate::one_line(&error.message)
            ),
        }
    }

    /// Resolve, start and initialize; the initialize result for the client.
    async fn start(
        &self,
        message: &Value,
        events: &mpsc::Sender<Value>,
    ) -> Result<(Live, Value), StartError> {
        // Checked before anything is resolved or started: a malformed
        // initialize must not start units that then fail on it.
        let version = negotiate_version(
            check_initialize(message).map_err(|why| StartError::refused("initialize", why))?,
        );
        let client_params = params(message);
        let ask = read_ask(client_params)
            .and_then(|ask| merge_ask(ask, &self.transport_ask))
            .map_err(|why| StartError::refused("ask", why))?;
        if let Some(reattach) = ask.reattach.clone() {
            // Its units may still be being re-adopted.
            self.config.reattachable.settled(&reattach.session).await;
            return self.reattach(client_params, &ask, reattach, version).await;
        }
        let profile_name = ask
            .profile
            .clone()
            .unwrap_or_else(|| self.config.default_profile.clone());
        let profile = self.config.catalog.load(&profile_name).map_err(|error| {
            StartError::refused(
                "profile",
                format!("box.profile: profile `{profile_name}`: {error}"),
            )
        })?;
        let mut plan =
            (self.config.resolve)(&profile, &ask.tighten, &self.config.facts).map_err(|error| {
                let (data, reason) = match &error {
                    PlanError::Widening { field, .. } => {
                        (json!({"field": format!("tighten.{field}")}), "widening")
                    }
                    PlanError::Invalid(_) => (json!({"field": "tighten"}), "tightening"),
                    PlanError::DangerousWorkspace { .. } => {
                        (json!({"field": "workspace.source"}), "workspace")
                    }
                };
                StartError {
                    code: code::INVALID_PARAMS,
                    message: error.to_string(),
                    data: Some(data),
                    refusal: Some(reason),
                }
            })?;
        // Before any unit starts: nothing in the workspace runs yet, so
        // nothing rewrites what the scan reads.
        let persisted = match plan
            .units
            .iter()
            .find(|unit| unit.role == Role::Workspace)
            .map(|unit| &unit.source)
        {
            Some(WorkspaceSource::Host(path)) => {
                let (session, path) = (self.id.clone(), path.clone());
                tokio::task::spawn_blocking(move || redact::scan_persisted(&session, &path))
                    .await
                    .unwrap_or_default()
            }
            _ => redact::Persisted::default(),
        };
        if plan.on_persisted_credentials == OnPersisted::Refuse
            && let Some(first) = persisted.reported.first()
        {
            let found: Vec<String> = persisted
                .reported
                .iter()
                .map(|found| {
                    format!(
                        "{}:{} {} ({})",
                        found.file, found.line, found.key, found.kind
                    )
                })
                .collect();
            return Err(StartError {
                code: code::INVALID_PARAMS,
                message: format!(
                    "the workspace holds {} persisted credential(s), first {}:{} {}, and profile `{}` has on_persisted_credentials = \"refuse\"; remove them from the workspace (or set \"report\"): {}",
                    found.len(),
                    first.file,
                    first.line,
                    first.key,
                    plan.profile,
                    found.join("; ")
                ),
                data: Some(json!({
                    "field": "workspace.on_persisted_credentials",
                    "persistedCredentials": persisted.reported,
                })),
                refusal: Some("persisted_credentials"),
            });
        }
        // `hide`: the workspace unit sees each such file masked, read-only.
        let masks = match (&plan.on_persisted_credentials, persisted.files.is_empty()) {
            (OnPersisted::Hide, false) => {
                let workspace = plan
                    .units
                    .iter()
                    .find_map(|unit| match (&unit.role, &unit.source) {
                        (Role::Workspace, WorkspaceSource::Host(path)) => Some(path.clone()),
                        _ => None,
                    })
                    .unwrap_or_default();
                let (runtime_dir, files) =
                    (self.config.runtime_dir.clone(), persisted.files.clone());
                let made = tokio::task::spawn_blocking(move || {
                    crate::hide::Masks::make(&runtime_dir, &workspace, &files)
                })
                .await
                .map_err(|why| StartError::internal(format!("masking persisted credentials: {why}")))?
                .map_err(|why| StartError {
                    code: code::INVALID_PARAMS,
                    message: format!(
                        "profile `{}` has on_persisted_credentials = \"hide\" and the workspace's credentials could not be masked: {why}; remove them from the workspace (or set \"report\")",
                        plan.profile
                    ),
                    data: Some(json!({"field": "workspace.on_persisted_credentials"})),
                    refusal: Some("persisted_credentials"),
                })?;
                Some(made)
            }
            _ => None,
        };
        // Built before any unit starts: a unit's first word is already redacted.
        let mut secrets = redact::session_secrets(&plan, &(self.config.environment)());
        secrets.extend(persisted.secrets);
        let redactor = SessionRedactor::new(&self.id, secrets, self.config.redact_scratch.clone())
            .map_err(|why| {
                StartError::internal(format!("building the session's redactor: {why}"))
            })?;
        let label = SessionLabel {
            instance: self.config.instance.clone(),
            session: self.id.clone(),
            profile: plan.profile.clone(),
        };
        let start_clock = Instant::now();
        // The session's (every unit has the same): engine start and executor initialize.
        let start_timeout = plan
            .units
            .iter()
            .map(|unit| unit.limits.start_timeout)
            .max()
            .unwrap_or(Duration::from_secs(60));
        let start_deadline = tokio::time::Instant::now() + start_timeout;
        // A client that sent a progress token hears how a slow start (an
        // image pull) goes, as MCP progress on its initialize.
        let progress = client_params
            .and_then(|params| params.get("_meta"))
            .and_then(|meta| meta.get("progressToken"))
            .filter(|token| token.is_string() || token.is_number())
            .map(|token| InitProgress::new(token.clone(), events.clone()));
        // `source = "fork"`: the workspace unit starts on the session's own
        // fork of the host directory; the guard removes it if the start fails.
        let mut workspace_fork = ForkGuard {
            config: self.config.clone(),
            child: None,
        };
        let mut objects = None;
        if let Some(mode) = plan.workspace_fork {
            let (child, wiring) = self.fork_workspace(&mut plan, mode).await?;
            workspace_fork.child = Some(child);
            objects = wiring;
        }
        // On a worktree fork (`source = "fork"`), `.git` is box's new repository,
        // not the parent's: only the working files' masks apply.
        let workspace_masks: Vec<box_backend::FileMask> = masks
            .as_ref()
            .map(|masks| {
                masks
                    .wiring()
                    .iter()
                    .filter(|mask| objects.is_none() || !mask.target.starts_with(".git"))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        let (started, egress) = start_units(
            &self.config,
            &label,
            &plan.units,
            start_timeout,
            &self.background,
            StartWiring {
                workspace_masks: &workspace_masks,
                objects: objects.as_ref(),
                progress: progress.as_ref(),
                parent: None,
            },
        )
        .await
        .map_err(|error| StartError::internal(format!("starting the session's units: {error}")))?;

        let executor_params = executor_initialize_params(client_params, &ask, version);
        // What is left of the start deadline bounds the executors' initialize too.
        let timeout = self
            .config
            .executor_init_timeout
            .min(start_deadline.saturating_duration_since(tokio::time::Instant::now()));
        let mut links = Vec::new();
        let mut ends = Vec::new();
        let mut renewals = Vec::new();
        let mut envelopes = Vec::new();
        let mut tracked = Vec::new();
        for (key, unit) in started {
            tracked.push(Tracked {
                key,
                id: unit.envelope.id.clone(),
            });
            let mut envelope = unit.envelope;
            if envelope.role == Role::Workspace {
                envelope.persisted_credentials = persisted.reported.clone();
                // The backend mounted every mask or refused to start the unit.
                if masks.is_some() {
                    for found in &mut envelope.persisted_credentials {
                        found.hidden = true;
                    }
                }
            }
            // Enforced by the host, so it is applied: said in plain numbers.
            let millis = u64::try_from(start_timeout.as_millis()).unwrap_or(u64::MAX);
            envelope.limits.set_start_timeout_ms(millis);
            envelopes.push(envelope);
            links.push(ExecutorLink::new(unit.io.stdin, unit.io.stdout));
            ends.push(unit.ended);
            renewals.push(unit.renewal);
        }
        let results = futures::future::join_all(
            links
                .iter_mut()
                .map(|link| initialize_executor(link, executor_params.clone(), timeout)),
        )
        .await;
        let mut initialized = Vec::new();
        for (spec, result) in plan.units.iter().zip(results) {
            match result {
                Ok(result) => initialized.push(result),
                Err(why) => {
                    drop(links);
                    drop(ends);
                    drop(renewals);
                    let config = self.config.clone();
                    self.background
                        .spawn(async move { remove_until_gone(&config, tracked).await });
                    return Err(StartError::internal(format!(
                        "starting the session's units: unit {}: {why}",
                        spec.name
                    )));
                }
            }
        }
        let ids: Vec<String> = tracked.iter().map(|unit| unit.id.clone()).collect();

        // Counted once the session is up: a failed start leaves no session behind.
        self.config
            .metrics
            .unit_start(start_clock.elapsed(), ids.len());
        let (events_tx, events_rx) = mpsc::channel(EVENT_QUEUE);
        let mut tasks = JoinSet::new();
        let mut units = Vec::new();
        for (index, ((((link, ended), (spec, envelope)), tracked), renewal)) in links
            .into_iter()
            .zip(ends)
            .zip(plan.units.iter().cloned().zip(envelopes))
            .zip(tracked)
            .zip(renewals)
            .enumerate()
        {
            let writer = link_unit(index, link, ended, &events_tx, &mut tasks);
            units.push(Unit {
                key: tracked.key,
                spec,
                envelope,
                writer: Some(writer),
                ended: None,
                closed: false,
                close_reason: None,
                draining: None,
                tools: initialized[index].tools.clone(),
                _renewal: renewal,
                fork: None,
                removed: false,
            });
        }
        if let Some(child) = workspace_fork.child.take()
            && let Some(unit) = units
                .iter_mut()
                .find(|unit| unit.spec.role == Role::Workspace)
        {
            unit.fork = Some(child);
        }
        let workspace = units
            .iter()
            .position(|unit| unit.spec.role == Role::Workspace);
        let envelopes: Vec<&Envelope> = units.iter().map(|unit| &unit.envelope).collect();
        let mut result = initialize_result(&plan, &envelopes, workspace, &initialized, version);
        // A workspace on its own fork (`source = "fork"`) says so as `box/fork`
        // answers: where from, how, and what it shares with the directory.
        if let Some(fork) = workspace.and_then(|index| units[index].fork.as_ref()) {
            set_box_field(
                &mut result,
                "fork",
                json!({
                    "from": fork.parent,
                    "mode": fork::mode_name(fork.mode),
                    "shares": fork.shares,
                }),
            );
        }
        redactor.message(&mut result);
        let kept = self.persist(
            &plan,
            &ask,
            version,
            &units,
            &initialized,
            &egress,
            &mut result,
        );
        let journal = kept
            .then(|| self.config.state.as_ref()?.journal(&self.id))
            .flatten();
        let _ = self.version.set(version);
        tracing::info!(
            session = %self.id,
            profile = %plan.profile,
            units = units.len(),
            backend = %self.config.backend.kind(),
            "session started"
        );
        let count = units.len();
        Ok((
            Live {
                plan,
                units,
                workspace,
                router: Router::new(count, FIRST_REQUEST_ID),
                events_tx,
                events_rx,
                tasks,
                last_activity: Instant::now(),
                started: Instant::now(),
                redactor,
                egress,
                executor_params,
                label,
                next_fork: 1,
                profile,
                tighten: ask.tighten.clone(),
                masks,
                journal,
                late: Default::default(),
                client: None,
            },
            result,
        ))
    }

    /// Keep the session's identity in the state directory (`--state`) and
    /// give the client its reattach secret in `result` (`box.session`). A
    /// session whose identity cannot be kept runs on without one (logged).
    #[expect(
        clippy::too_many_arguments,
        reason = "each is one part of what a session keeps; bundling them would only rename them"
    )]
    fn persist(
        &self,
        plan: &Plan,
        ask: &super::ask::Ask,
        version: &str,
        units: &[Unit],
        initialized: &[super::units::ExecutorStart],
        egress: &[super::egress::EgressProxy],
        result: &mut Value,
    ) -> bool {
        let Some(store) = &self.config.state else {
            return false;
        };
        let (secret, secret_sha256) = state::new_secret();
        let kind = self.config.backend.kind();
        let record = state::SessionRecord {
            version: state::VERSION,
            session: self.id.clone(),
            instance: self.config.instance.clone(),
            secret_sha256,
            profile: plan.profile.clone(),
            tighten: ask.tighten.clone(),
            plan_digest: state::plan_digest(plan),
            protocol_version: version.to_owned(),
            started_unix_ms: state::unix_ms(),
            initialize: result.clone(),
            units: units
                .iter()
                .zip(initialized)
                .map(|(unit, initialized)| state::UnitRecord {
                    name: unit.spec.name.clone(),
                    backend: kind.as_str().to_owned(),
                    id: unit.envelope.id.clone(),
                    identity: format!("{}/{}/{}", self.config.instance, self.id, unit.spec.name),
                    image_id: unit.envelope.image_id.clone(),
                    image_digest: unit.envelope.image_digest.clone(),
                    run_dir: self.config.runtime_dir.join("units"),
                    envelope: serde_json::to_value(&unit.envelope).unwrap_or(Value::Null),
                    tools: initialized.tools.clone(),
                    // The directory its unit has mounted: a later host serves
                    // the proxy there again.
                    egress_dir: egress
                        .iter()
                        .find(|proxy| proxy.unit == unit.spec.name)
                        .map(|proxy| proxy.dir().to_owned()),
                })
                .collect(),
        };
        // Each unit's run directory, as its backend reported it.
        let mut record = record;
        for (unit, persisted) in units.iter().zip(record.units.iter_mut()) {
            match unit._renewal.as_ref().and_then(|renewal| renewal.run_dir()) {
                Some(dir) => persisted.run_dir = dir.to_owned(),
                None => {
                    tracing::debug!(session = %self.id, unit = %unit.spec.name, "a unit without a run directory cannot be reattached; keeping no identity");
                    return false;
                }
            }
        }
        match store.write(&record) {
            Ok(()) => {
                set_box_field(result, "session", json!({"id": self.id, "secret": secret}));
                true
            }
            Err(why) => {
                tracing::warn!(session = %self.id, %why, "the session's identity is not kept; it cannot be reattached after a restart");
                false
            }
        }
    }

    /// Reattach to a session a dead host served, whose units this host
    /// re-adopted at start: the secret proven, the client's ask the same as
    /// persisted, every unit live. Refused loudly otherwise, naming what
    /// differs; the units are never replaced by fresh ones.
    async fn reattach(
        &self,
        client_params: Option<&serde_json::Map<String, Value>>,
        ask: &super::ask::Ask,
        reattach: super::ask::Reattach,
        version: &'static str,
    ) -> Result<(Live, Value), StartError> {
        let refuse = |message: String| StartError {
            code: code::INVALID_PARAMS,
            message,
            data: Some(json!({"field": "box.reattach"})),
            refusal: Some("reattach"),
        };
        if reattach.session != self.id {
            return Err(refuse(format!(
                "box.reattach.session: `{}` is not this session (`{}`); reattach with an initialize that carries no Mcp-Session-Id (HTTP) or is the first message of a new `box serve --state` (stdio)",
                reattach.session, self.id
            )));
        }
        let Some(adopted) = self.config.reattachable.take(&self.id) else {
            return Err(refuse(format!(
                "box.reattach: no session `{}` waits to be reattached on this host (it ended, was never kept, its host is alive, or its units were lost); initialize a new session",
                self.id
            )));
        };
        if !state::secret_matches(&reattach.secret, &adopted.record.secret_sha256) {
            // An attacker guessing must not end the session for its owner.
            self.config.reattachable.insert(adopted);
            return Err(refuse(format!(
                "box.reattach.secret: not the secret of session `{}`",
                self.id
            )));
        }
        let forget = || {
            if let Some(store) = &self.config.state {
                store.remove(&self.id);
            }
        };
        // The client's ask must be the session's: what differs is named, and
        // the session keeps waiting for an ask that matches.
        let record = &adopted.record;
        let differs = match (&ask.profile, &ask.tighten) {
            (Some(profile), _) if profile != &record.profile => Some(format!(
                "box.profile: the session runs profile `{}`, the reattach asks for `{profile}`",
                record.profile
            )),
            (_, tighten) if !tighten.is_null() && tighten != &record.tighten => Some(format!(
                "box.tighten: the session runs with tightening {}, the reattach asks for {tighten}",
                record.tighten
            )),
            _ if version != record.protocol_version => Some(format!(
                "protocolVersion: the session's executors speak {}, the reattach agreed {version}; ask for {}",
                record.protocol_version, record.protocol_version
            )),
            _ => None,
        };
        if let Some(differs) = differs {
            self.config.reattachable.insert(adopted);
            return Err(refuse(differs));
        }
        let state::Adopted {
            record,
            units: reattached,
        } = adopted;
        let state::Reattached {
            plan,
            profile,
            units: started,
            egress,
        } = match reattached {
            Ok(reattached) => reattached,
            Err(why) => {
                forget();
                return Err(refuse(format!(
                    "session `{}` cannot be reattached: {why}; its units are left to their leases",
                    self.id
                )));
            }
        };
        for spec in &plan.units {
            if let WorkspaceSource::Host(path) = &spec.source
                && !path.is_dir()
            {
                forget();
                state::leave_to_lease(started);
                return Err(refuse(format!(
                    "unit {}: its workspace {} is gone; the session cannot be reattached and its units are left to their leases",
                    spec.name,
                    path.display()
                )));
            }
        }
        let mut secrets = redact::session_secrets(&plan, &(self.config.environment)());
        // The credentials persisted in the workspace, read again: they are
        // redacted from what the units send as they were before the restart.
        if let Some(path) = plan
            .units
            .iter()
            .find_map(|unit| match (&unit.role, &unit.source) {
                (Role::Workspace, WorkspaceSource::Host(path)) => Some(path.clone()),
                _ => None,
            })
        {
            let session = self.id.clone();
            let persisted =
                tokio::task::spawn_blocking(move || redact::scan_persisted(&session, &path))
                    .await
                    .unwrap_or_default();
            secrets.extend(persisted.secrets);
        }
        let redactor = SessionRedactor::new(&self.id, secrets, self.config.redact_scratch.clone())
            .map_err(|why| {
                StartError::internal(format!("building the session's redactor: {why}"))
            })?;
        let label = SessionLabel {
            instance: self.config.instance.clone(),
            session: self.id.clone(),
            profile: plan.profile.clone(),
        };
        let (events_tx, events_rx) = mpsc::channel(EVENT_QUEUE);
        let mut tasks = JoinSet::new();
        let mut units = Vec::new();
        for (index, ((unit, spec), persisted)) in started
            .into_iter()
            .zip(plan.units.iter().cloned())
            .zip(&record.units)
            .enumerate()
        {
            let key = self.config.ledger.starting(&self.id, &spec.name);
            self.config.ledger.started(key, &unit.envelope.id);
            let link = ExecutorLink::new(unit.io.stdin, unit.io.stdout);
            let writer = link_unit(index, link, unit.ended, &events_tx, &mut tasks);
            units.push(Unit {
                key,
                spec,
                envelope: unit.envelope,
                writer: Some(writer),
                ended: None,
                closed: false,
                close_reason: None,
                draining: None,
                tools: persisted.tools.clone(),
                _renewal: unit.renewal,
                fork: None,
                removed: false,
            });
        }
        let workspace = units
            .iter()
            .position(|unit| unit.spec.role == Role::Workspace);
        let mut result = record.initialize.clone();
        let envelopes: Vec<Value> = units
            .iter()
            .map(|unit| {
                let mut envelope = serde_json::to_value(&unit.envelope).unwrap_or(Value::Null);
                envelope["reattached"] = json!(true);
                if unit.spec.network.mode == box_policy::plan::NetworkMode::Egress
                    && let Some(network) = envelope.get_mut("network")
                {
                    // A `box/network.set` narrowing is not persisted: the new
                    // proxy enforces the profile's list, and says so.
                    network["restored"] = json!(
                        "the egress proxy was served again by this host with the profile's allow list: a narrowing made with box/network.set before the restart is not kept; narrow it again"
                    );
                }
                envelope
            })
            .collect();
        set_box_field(&mut result, "units", json!(envelopes));
        set_box_field(&mut result, "reattached", json!(true));
        // The calls in flight when the host died: their outcome is unknown
        // (they may have run, in part or in full); said by the client's id.
        let store = self.config.state.as_ref();
        let unsettled = store.map_or_else(Vec::new, |store| {
            store.unsettled_calls(&self.id, &record.units)
        });
        let unknown: Vec<Value> = unsettled.iter().map(|(_, _, call)| call.clone()).collect();
        // Their answers, should the units still give them, reach the client
        // as `notifications/box/lateAnswer` (this host's ids start far above).
        let late: std::collections::HashMap<(usize, u64), Value> = unsettled
            .into_iter()
            .map(|(unit, unit_id, call)| ((unit, unit_id), call))
            .collect();
        if !unknown.is_empty() {
            tracing::info!(session = %self.id, calls = unknown.len(), "calls in flight at the restart have an unknown outcome");
        }
        set_box_field(&mut result, "unknownOutcome", json!(unknown));
        let journal = store.and_then(|store| store.journal(&self.id));
        set_box_field(
            &mut result,
            "session",
            json!({"id": self.id, "secret": reattach.secret}),
        );
        redactor.message(&mut result);
        // This host serves the session now: a later restart finds it here.
        if let Some(store) = &self.config.state {
            let mut kept = record.clone();
            kept.instance = self.config.instance.clone();
            if let Err(why) = store.write(&kept) {
                tracing::warn!(session = %self.id, %why, "updating the session's identity");
            }
        }
        let _ = self.version.set(version);
        tracing::info!(session = %self.id, profile = %plan.profile, units = units.len(), "session reattached");
        let executor_params = executor_initialize_params(client_params, ask, version);
        let count = units.len();
        // Ids the dead host used may still be answered by the units: this
        // host's start far above them (seconds since the epoch, shifted), so
        // a late answer never matches a request of this host's.
        // Its lifetime counts from its first start, not from the restart.
        let age = Duration::from_millis(state::unix_ms().saturating_sub(record.started_unix_ms));
        let started = Instant::now().checked_sub(age).unwrap_or_else(Instant::now);
        let first_id = FIRST_REQUEST_ID
            + (std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |since| since.as_secs())
                << 20);
        Ok((
            Live {
                plan,
                units,
                workspace,
                router: Router::new(count, first_id),
                events_tx,
                events_rx,
                tasks,
                last_activity: Instant::now(),
                started,
                redactor,
                egress,
                executor_params,
                label,
                next_fork: 1,
                profile,
                tighten: record.tighten.clone(),
                masks: None,
                journal,
                late,
                client: None,
            },
            result,
        ))
    }

    /// Fork the workspace unit's host directory for this session
    /// (`source = "fork"`) and point the plan's workspace unit at the fork.
    async fn fork_workspace(
        &self,
        plan: &mut Plan,
        mode: box_policy::profile::ForkMode,
    ) -> Result<(ChildFork, Option<box_backend::ObjectsWiring>), StartError> {
        let Some(spec) = plan
            .units
            .iter_mut()
            .find(|unit| unit.role == Role::Workspace)
        else {
            return Err(StartError::internal(
                "workspace.source = \"fork\": the plan has no workspace unit".to_owned(),
            ));
        };
        let WorkspaceSource::Host(parent_path) = spec.source.clone() else {
            return Err(StartError::internal(
                "workspace.source = \"fork\": the workspace unit has no host directory".to_owned(),
            ));
        };
        let asked = match mode {
            box_policy::profile::ForkMode::Auto => box_fork::Mode::Auto,
            box_policy::profile::ForkMode::Worktree => box_fork::Mode::Worktree,
            box_policy::profile::ForkMode::Copy => box_fork::Mode::Copy,
        };
        let mode = fork::effective_mode(&self.config, spec, asked).map_err(|why| {
            StartError::refused("workspace", format!("workspace.fork_mode: {why}"))
        })?;
        let ask = fork::ForkAsk {
            from: "workspace".to_owned(),
            mode: asked,
            dirty: true,
            writable: spec.mode == MountMode::ReadWrite,
            label: None,
            tighten: None,
        };
        let session_dir = fork::session_dir(&self.config, &self.id);
        let child_path = session_dir.join("workspace");
        let made = {
            let (config, parent_path, child_path) =
                (self.config.clone(), parent_path.clone(), child_path.clone());
            tokio::task::spawn_blocking(move || {
                fork::make_private_dir(&session_dir)
                    .and_then(|()| fork::make_fork(&config, &parent_path, &child_path, &ask, &mode))
            })
            .await
            .unwrap_or_else(|join| Err(format!("the fork failed: {join}")))
        };
        let forked = made.map_err(|why| {
            StartError::internal(format!(
                "workspace.source = \"fork\": forking {}: {why}",
                parent_path.display()
            ))
        })?;
        if let Some(advisory) = &forked.advisory {
            tracing::warn!(session = %self.id, %advisory, "the session's workspace fork is degraded");
        }
        spec.source = WorkspaceSource::Host(child_path.clone());
        let objects = forked
            .objects
            .as_ref()
            .map(|objects| box_backend::ObjectsWiring {
                host: objects.host.clone(),
            });
        Ok((
            ChildFork {
                parent: HOST_DIRECTORY.to_owned(),
                parent_path,
                path: child_path,
                base: Arc::new(std::sync::Mutex::new(forked.base.clone())),
                mode: forked.mode_used,
                shares: forked.shares.clone(),
                label: None,
            },
            objects,
        ))
    }

    /// Route messages until the session ends; why it ended.
    async fn serve(&self, live: &mut Live, inbound: &mut mpsc::Receiver<Inbound>) -> String {
        let limits = live
            .workspace
            .or(if live.units.is_empty() { None } else { Some(0) })
            .map(|index| live.units[index].spec.limits.clone());
        let idle = limits.as_ref().map(|limits| limits.idle);
        let lifetime_end = limits
            .as_ref()
            .map(|limits| tokio::time::Instant::from_std(live.started + limits.lifetime));
        // Once the idle time has run out: until when what the client sent
        // meanwhile still counts (IDLE_SETTLE).
        let mut idle_settle: Option<tokio::time::Instant> = None;
        loop {
            let idle_end = match idle {
                Some(idle) if live.router.in_flight() == 0 => {
                    Some(idle_settle.unwrap_or_else(|| {
                        tokio::time::Instant::from_std(live.last_activity + idle)
                    }))
                }
                _ => None,
            };
            tokio::select! {
                () = self.cancel.cancelled() => {
                    if self.host.is_cancelled() {
                        self.drain_calls(live, inbound).await;
                        return "the host is shutting down".to_owned();
                    }
                    return "the session was ended".to_owned();
                }
                message = inbound.recv() => {
                    let Some(message) = message else {
                        return "the client left".to_owned();
                    };
                    live.last_activity = Instant::now();
                    idle_settle = None;
                    self.on_client(live, message);
                }
                Some(event) = live.events_rx.recv() => {
                    let busy = live.router.in_flight() > 0;
                    self.on_unit(live, event);
                    if busy && live.router.in_flight() == 0 {
                        // Idle counts from the last answer too: a long call is not idleness.
                        live.last_activity = Instant::now();
                        idle_settle = None;
                    }
                }
                () = sleep_until(idle_end) => {
                    // Read what is waiting before judging the session idle.
                    if let Ok(message) = inbound.try_recv() {
                        live.last_activity = Instant::now();
                        idle_settle = None;
                        self.on_client(live, message);
                        continue;
                    }
                    if idle_settle.is_none() {
                        idle_settle = Some(tokio::time::Instant::now() + IDLE_SETTLE);
                        continue;
                    }
                    return format!("idle for {}", humantime::format_duration(idle.unwrap_or_default()));
                }
                () = sleep_until(lifetime_end) => return "its lifetime ended".to_owned(),
            }
        }
    }

    /// Let the calls in flight finish, up to the host's drain time; new
    /// requests are refused meanwhile.
    async fn drain_calls(&self, live: &mut Live, inbound: &mut mpsc::Receiver<Inbound>) {
        let deadline = tokio::time::Instant::now() + self.config.drain;
        while live.router.in_flight() > 0 {
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => return,
                Some(event) = live.events_rx.recv() => self.on_unit(live, event),
                message = inbound.recv() => match message {
                    Some(Inbound::Request(message, reply)) => {
                        let id = message.get("id").cloned().unwrap_or(Value::Null);
                        reply.answer(error_response(id, code::INTERNAL_ERROR, "the host is shutting down"));
                    }
                    Some(Inbound::Other(message)) => self.client_other(live, message),
                    None => return,
                },
            }
        }
    }

    fn on_client(&self, live: &mut Live, message: Inbound) {
        match message {
            Inbound::Request(message, reply) => self.client_request(live, message, reply),
            Inbound::Other(message) => self.client_other(live, message),
        }
    }

    /// One client request through the proxy's phases: *answer locally*
    /// (malformed, `server/discover`, limits, and what [`Self::choose_unit`]
    /// answers itself: `ping`, lists box owns), *choose the unit*
    /// ([`Self::choose_unit`]), *rewrite the request* (the router's fresh id
    /// and progress token, [`Router::forward`]), then, when the unit answers,
    /// *rewrite the answer* ([`Router::from_unit`], [`rewrite_answer`]) and
    /// *record* it ([`Self::record`]: metrics, audit).
    fn client_request(&self, live: &mut Live, message: Value, reply: ReplyTo) {
        let (id, method) = match classify(&message) {
            Ok(Kind::Request { id, method }) => (id, method),
            Ok(_) | Err(_) => {
                reply.answer(error_response(
                    Value::Null,
                    code::INVALID_REQUEST,
                    "not a JSON-RPC request",
                ));
                return;
            }
        };
        if let Err(why) = check_params(&message) {
            reply.answer(error_response(id, code::INVALID_PARAMS, why));
            return;
        }
        if method == "server/discover" {
            reply.answer(discover_refusal(id));
            return;
        }
        if live.router.in_flight() >= MAX_IN_FLIGHT {
            reply.answer(error_response(
                id,
                code::INTERNAL_ERROR,
                format!("{MAX_IN_FLIGHT} requests are already in flight in this session; wait for some answers"),
            ));
            return;
        }
        if live.router.is_in_flight(&id) {
            reply.answer(error_response(
                id.clone(),
                code::INVALID_REQUEST,
                format!(
                    "request id {id} is already in flight in this session; ids must not be reused"
                ),
            ));
            return;
        }
        match method.as_str() {
            "box/fork" => return self.fork(live, id, &message, reply),
            "box/merge" => return self.merge(live, id, &message, reply),
            "box/discard" => return self.discard(live, id, &message, reply),
            _ => {}
        }
        let (unit, upstream, rewrite) = match self.choose_unit(live, &method, message) {
            Ok(Route::Answer(mut result)) => {
                // What the host answers itself may quote a unit (the tool list
                // it read at start, a fork's end).
                live.redactor.message(&mut result);
                reply.answer(result_response(id, result));
                return;
            }
            Ok(Route::Unit(unit, upstream, rewrite)) => (unit, upstream, rewrite),
            Err((code, text)) => {
                reply.answer(error_response(id, code, text));
                return;
            }
        };
        let pending = live.units[unit]
            .draining
            .as_ref()
            .map(|end| live.redactor.text(&describe_end(end)).into_owned());
        if let Some(why) = live.units[unit].ended.as_ref().or(pending.as_ref()) {
            let text = format!("unit {} ended: {why}", live.units[unit].spec.name);
            self.config
                .metrics
                .call(&method, None, "unit_ended", Duration::ZERO);
            reply.answer(error_response(id, code::INTERNAL_ERROR, text));
            return;
        }
        let tool = (method == "tools/call")
            .then(|| {
                params(&upstream)
                    .and_then(|p| p.get("name"))
                    .and_then(Value::as_str)
            })
            .flatten()
            .map(str::to_owned);
        // Only an audit log reads the digest; a SHA-256 of the arguments'
        // JSON is not free on every call.
        let audited = self.config.audit.is_some();
        let arguments_digest = tool.as_ref().filter(|_| audited).map(|_| {
            super::audit::digest(
                params(&upstream)
                    .and_then(|p| p.get("arguments"))
                    .unwrap_or(&Value::Null),
            )
        });
        let process = match method.as_str() {
            "agentworkspace/process.read" | "agentworkspace/process.close" => params(&upstream)
                .and_then(|p| {
                    let id = p.get("id").and_then(Value::as_str)?.to_owned();
                    let fd = p.get("fd").and_then(Value::as_u64).unwrap_or(1);
                    Some((id, u8::try_from(fd).unwrap_or(u8::MAX)))
                }),
            _ => None,
        };
        let tag = Tag {
            method: method.clone(),
            tool,
            arguments_digest,
            started: Instant::now(),
            deadline: None,
            overdue: false,
            rewrite,
            process,
            unit_id: None,
        };
        let client_id = upstream.get("id").cloned().unwrap_or(Value::Null);
        let (unit_id, upstream) = live.router.forward(unit, upstream, reply, tag);
        if let Some(tag) = live.router.tag_mut(unit, unit_id) {
            tag.unit_id = Some(unit_id);
        }
        if let Some(journal) = &live.journal {
            journal.sent(unit, unit_id, &client_id, &method);
        }
        if let Err(why) = send_to_unit(&live.units[unit], upstream) {
            if let Some(forward) = live.router.take(unit, unit_id) {
                self.record(live, unit, &forward.tag, "unit_unavailable");
                forward
                    .reply
                    .answer(error_response(forward.client_id, code::INTERNAL_ERROR, why));
            }
            return;
        }
        if has_deadline(&method) {
            let timeout = live.units[unit].spec.limits.call_timeout;
            let events = live.events_tx.clone();
            let handle = tokio::spawn(async move {
                tokio::time::sleep(timeout).await;
                let _ = events.send(UnitEvent::Deadline(unit, unit_id)).await;
            });
            if let Some(tag) = live.router.tag_mut(unit, unit_id) {
                tag.deadline = Some(handle.abort_handle());
            }
        }
    }

    /// Which unit a request goes to, or the answer box gives itself.
    fn choose_unit(
        &self,
        live: &Live,
        method: &str,
        mut message: Value,
    ) -> Result<Route, (i64, String)> {
        match method {
            "ping" => return Ok(Route::Answer(json!({}))),
            "initialize" => {
                return Err((
                    code::INVALID_REQUEST,
                    "initialize: the session is already initialized".to_owned(),
                ));
            }
            "agentworkspace/servers.list" => {
                let mut servers: Vec<Value> = live
                    .units
                    .iter()
                    .filter(|unit| unit.spec.role == Role::Server)
                    .map(|unit| {
                        json!({
                            "name": unit.spec.name,
                            "unit": unit.envelope.name,
                            "description": unit.spec.description,
                        })
                    })
                    .collect();
                // Forks are listed with their parent; requests reach them
                // with `_meta["box/unit"]`, not `servers.start`.
                servers.extend(
                    live.units
                        .iter()
                        .enumerate()
                        .filter(|(index, unit)| !unit.removed && live.workspace != Some(*index))
                        .filter_map(|(_, unit)| unit.fork.as_ref().map(|fork| (unit, fork)))
                        .map(|(unit, fork)| {
                            json!({
                                "name": unit.spec.name,
                                "unit": unit.envelope.name,
                                "description": unit.spec.description,
                                "fork": {
                                    "parent": fork.parent,
                                    "mode": fork::mode_name(fork.mode),
                                    "label": fork.label,
                                    "ended": unit.ended,
                                },
                            })
                        }),
                );
                return Ok(Route::Answer(json!({"servers": servers})));
            }
            "agentworkspace/servers.start" => {
                let name = params(&message)
                    .and_then(|p| p.get("name"))
                    .and_then(Value::as_str)
                    .ok_or((
                        code::INVALID_PARAMS,
                        "agentworkspace/servers.start: `name` (a string) is required".to_owned(),
                    ))?
                    .to_owned();
                let stderr = params(&message)
                    .and_then(|p| p.get("stderr"))
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                let Some(index) = live
                    .units
                    .iter()
                    .position(|unit| unit.spec.role == Role::Server && unit.spec.name == name)
                else {
                    let known: Vec<&str> = live
                        .units
                        .iter()
                        .filter(|unit| unit.spec.role == Role::Server)
                        .map(|unit| unit.spec.name.as_str())
                        .collect();
                    return Err((
                        code::INVALID_PARAMS,
                        format!(
                            "agentworkspace/servers.start: no server `{name}` in profile `{}`; servers: {}",
                            live.plan.profile,
                            named(&known)
                        ),
                    ));
                };
                let command = live.units[index].spec.command.clone();
                if let Some(object) = message.as_object_mut() {
                    object.insert("method".to_owned(), json!("agentworkspace/process.start"));
                    object.insert(
                        "params".to_owned(),
                        json!({"args": command, "stderr": stderr}),
                    );
                }
                return Ok(Route::Unit(
                    index,
                    message,
                    Rewrite::ProcessId { unit: name },
                ));
            }
            "box/network.set" => return network_set(live, &message).map(Route::Answer),
            _ => {}
        }
        if let Some(asked) = params(&message)
            .and_then(|p| p.get("_meta"))
            .and_then(|meta| meta.get(UNIT_META))
        {
            let index = addressed_unit(live, asked)?;
            let paged = params(&message).is_some_and(|p| p.contains_key("cursor"));
            if method == "tools/list"
                && !paged
                && let Some(tools) = &live.units[index].tools
            {
                return Ok(Route::Answer(tools.clone()));
            }
            return Ok(Route::Unit(index, message, Rewrite::None));
        }
        // `box/process.resize` (box's terminal extension) names a process as
        // the others do, so it goes where they go.
        if (method.starts_with("agentworkspace/process.") || method == "box/process.resize")
            && method != "agentworkspace/process.start"
        {
            let target = params(&message)
                .and_then(|p| p.get("id"))
                .and_then(Value::as_str)
                .and_then(|id| id.split_once(':'))
                .and_then(|(unit, process)| {
                    live.units
                        .iter()
                        .position(|candidate| {
                            candidate.spec.role == Role::Server && candidate.spec.name == unit
                        })
                        .map(|index| (index, process.to_owned()))
                });
            if let Some((index, process)) = target {
                if let Some(params) = params_mut(&mut message) {
                    params.insert("id".to_owned(), json!(process));
                }
                return Ok(Route::Unit(index, message, Rewrite::None));
            }
        }
        match live.workspace {
            Some(index) => {
                // The tool list read at start is the session's for its whole life
                // (security case E67): a tampered executor cannot change it.
                let paged = params(&message).is_some_and(|p| p.contains_key("cursor"));
                if method == "tools/list"
                    && !paged
                    && let Some(tools) = &live.units[index].tools
                {
                    return Ok(Route::Answer(tools.clone()));
                }
                Ok(Route::Unit(index, message, Rewrite::None))
            }
            None => match method {
                "tools/list" => Ok(Route::Answer(json!({"tools": []}))),
                "resources/list" => Ok(Route::Answer(json!({"resources": []}))),
                "resources/templates/list" => Ok(Route::Answer(json!({"resourceTemplates": []}))),
                "prompts/list" => Ok(Route::Answer(json!({"prompts": []}))),
                _ => Err((
                    code::METHOD_NOT_FOUND,
                    format!(
                        "{method}: profile `{}` has no workspace unit (no file system), so nothing answers it",
                        live.plan.profile
                    ),
                )),
            },
        }
    }

    fn client_other(&self, live: &mut Live, message: Value) {
        match classify(&message) {
            Ok(Kind::Response { .. }) => {
                if let Some((unit, answer)) = live.router.client_response(message)
                    && let Err(why) = send_to_unit(&live.units[unit], answer)
                {
                    tracing::warn!(session = %self.id, %why, "an answer to a unit's request was lost");
                }
            }
            Ok(Kind::Notification { method }) => match method.as_str() {
                "notifications/initialized" => {}
                "notifications/cancelled" => {
                    if let Some((unit, cancel, forward)) = live.router.client_cancel(message) {
                        self.record(live, unit, &forward.tag, "cancelled");
                        // The client expects no answer: dropping the reply ends its stream.
                        drop(forward);
                        let _ = send_to_unit(&live.units[unit], cancel);
                    }
                }
                // Every executor may care that the client's roots changed.
                "notifications/roots/list_changed" => {
                    for unit in &live.units {
                        if unit.ended.is_none() {
                            let _ = send_to_unit(unit, message.clone());
                        }
                    }
                }
                // Anything else is the workspace unit's, like the requests: one
                // unit's traffic never reaches another.
                _ => {
                    if let Some(index) = live.workspace {
                        let _ = send_to_unit(&live.units[index], message);
                    }
                }
            },
            Ok(Kind::Request { .. }) | Err(_) => {}
        }
    }

    /// A unit's answer to a call the dead host sent before a reattach: sent to
    /// the client as `notifications/box/lateAnswer {call, response}` (the
    /// response under the client's id, redacted); `None` then, else the
    /// message to route.
    fn late_answer(&self, live: &mut Live, unit: usize, mut message: Value) -> Option<Value> {
        if live.late.is_empty() || message.get("method").is_some() {
            return Some(message);
        }
        let Some(call) = message
            .get("id")
            .and_then(Value::as_u64)
            .and_then(|id| live.late.remove(&(unit, id)))
        else {
            return Some(message);
        };
        live.redactor.unit_message(unit, &mut message);
        message["id"] = call["id"].clone();
        let note = jsonrpc::notification(
            "notifications/box/lateAnswer",
            json!({"call": call, "response": message}),
        );
        let _ = self.general.try_send(note);
        None
    }

    fn on_unit(&self, live: &mut Live, event: UnitEvent) {
        match event {
            UnitEvent::Message(unit, message) => match self
                .late_answer(live, unit, message)
                .map(|message| live.router.from_unit(unit, message))
                .unwrap_or(UnitMessage::Done)
            {
                UnitMessage::Answer {
                    forward,
                    mut response,
                } => {
                    let (outcome, details) = outcome_of(forward.tag.tool.as_deref(), &response);
                    self.record_answer(live, unit, &forward.tag, outcome, details);
                    match (forward.tag.method.as_str(), &forward.tag.process) {
                        ("agentworkspace/process.read", Some((id, fd))) => live
                            .redactor
                            .process_read((unit, id.clone(), *fd), &mut response),
                        ("agentworkspace/process.close", Some((id, _))) => {
                            live.redactor.process_close(unit, id, &mut response)
                        }
                        ("resources/read", _) => live.redactor.resource_read(&mut response),
                        _ => live.redactor.message(&mut response),
                    }
                    if live.router.in_flight() == 0 {
                        live.redactor.calls_done();
                    }
                    rewrite_answer(&forward.tag.rewrite, &mut response);
                    forward.reply.answer(response);
                }
                UnitMessage::Related {
                    stream,
                    mut message,
                    when_full,
                } => {
                    live.redactor.unit_message(unit, &mut message);
                    if let Err(
                        mpsc::error::TrySendError::Full(message)
                        | mpsc::error::TrySendError::Closed(message),
                    ) = stream.try_send(message)
                        && when_full == WhenFull::General
                    {
                        let _ = self.general.try_send(message);
                    }
                }
                UnitMessage::General(mut message) => {
                    live.redactor.unit_message(unit, &mut message);
                    let method = message.get("method").and_then(Value::as_str).unwrap_or("");
                    if method.ends_with("/list_changed") {
                        // Executors promise fixed lists; a change is an anomaly, never news for the client.
                        tracing::warn!(session = %self.id, unit = %live.units[unit].spec.name, %method, "anomaly: a unit announced a changed list; ignored");
                        return;
                    }
                    let _ = self.general.try_send(message);
                }
                UnitMessage::Done => {}
                UnitMessage::Refuse(answer) => {
                    let _ = send_to_unit(&live.units[unit], answer);
                }
                UnitMessage::Invalid(why) => {
                    let why = live.redactor.text(&why);
                    tracing::warn!(session = %self.id, unit = %live.units[unit].spec.name, %why, "a unit sent an invalid message");
                }
            },
            UnitEvent::Closed(unit, why) => {
                let Some(state) = live.units.get_mut(unit) else {
                    return;
                };
                if state.ended.is_some() || state.closed {
                    return;
                }
                state.closed = true;
                if let Some(end) = state.draining.take() {
                    // Everything the unit sent before it ended has been routed.
                    return self.unit_died(live, unit, describe_end(&end), Some(&end));
                }
                let why = live.redactor.text(&why).into_owned();
                tracing::warn!(session = %self.id, unit = %state.spec.name, %why, "a unit's executor output ended");
                let events = live.events_tx.clone();
                live.tasks.spawn(async move {
                    tokio::time::sleep(UNIT_END_GRACE).await;
                    let _ = events.send(UnitEvent::Grace(unit)).await;
                });
                // Kept in case the backend never says more.
                state.close_reason = Some(why);
            }
            UnitEvent::Ended(unit, end) => {
                let Some(state) = live.units.get_mut(unit) else {
                    return;
                };
                if state.closed || state.ended.is_some() {
                    return self.unit_died(live, unit, describe_end(&end), Some(&end));
                }
                // The end can overtake the unit's last messages (an answer
                // written before a lease lapsed waits in the unit's stream
                // while a frozen host resumes): its output is read to its end
                // first, so a call that finished is answered with its result.
                state.draining = Some(end);
                let events = live.events_tx.clone();
                live.tasks.spawn(async move {
                    tokio::time::sleep(UNIT_END_DRAIN).await;
                    let _ = events.send(UnitEvent::Drained(unit)).await;
                });
            }
            UnitEvent::Drained(unit) => {
                if let Some(end) = live
                    .units
                    .get_mut(unit)
                    .and_then(|state| state.draining.take())
                {
                    self.unit_died(live, unit, describe_end(&end), Some(&end));
                }
            }
            UnitEvent::Grace(unit) => {
                let cause = live
                    .units
                    .get_mut(unit)
                    .and_then(|state| state.close_reason.take())
                    .unwrap_or_else(|| "its executor closed its output".to_owned());
                self.unit_died(live, unit, cause, None)
            }
            UnitEvent::Deadline(unit, unit_id) => {
                // Ask the unit to stop the call now, but let an answer already
                // on its way win for DEADLINE_SETTLE.
                let Some(tag) = live.router.tag_mut(unit, unit_id) else {
                    return;
                };
                if tag.overdue {
                    return;
                }
                tag.overdue = true;
                let events = live.events_tx.clone();
                let settle = tokio::spawn(async move {
                    tokio::time::sleep(DEADLINE_SETTLE).await;
                    let _ = events.send(UnitEvent::Overdue(unit, unit_id)).await;
                });
                tag.deadline = Some(settle.abort_handle());
                let cancel = jsonrpc::notification(
                    "notifications/cancelled",
                    json!({"requestId": unit_id, "reason": "the call ran past its deadline"}),
                );
                let _ = send_to_unit(&live.units[unit], cancel);
            }
            UnitEvent::Forked(started) => self.join_fork(live, *started),
            UnitEvent::Overdue(unit, unit_id) => {
                let Some(forward) = live.router.take(unit, unit_id) else {
                    return;
                };
                let timeout = live.units[unit].spec.limits.call_timeout;
                let name = live.units[unit].spec.name.clone();
                self.record(live, unit, &forward.tag, "timeout");
                // Nothing confirms a cancellation (an executor answers a
                // cancelled request with nothing): the call may have run, in
                // part or in full, so its outcome is said to be unknown.
                forward.reply.answer(error_response_with_data(
                    forward.client_id,
                    code::REQUEST_TIMEOUT,
                    format!(
                        "unit {name}: {} did not answer within {} (the profile's call_timeout); box asked the unit to cancel it, but whether it ran, in part or in full, is unknown",
                        forward.tag.method,
                        humantime::format_duration(timeout)
                    ),
                    json!({"unit": name, "timeoutMs": timeout.as_millis() as u64, "outcome": "unknown"}),
                ));
            }
        }
    }

    /// `box/fork`: check the ask here, then fork, start and initialize the
    /// child in a task of its own (the session goes on meanwhile); the child
    /// joins the session in [`Self::join_fork`], which answers.
    fn fork(&self, live: &mut Live, id: Value, message: &Value, reply: ReplyTo) {
        let refuse = |reply: ReplyTo, id: Value, why: String| {
            reply.answer(error_response(id, code::INVALID_PARAMS, why));
        };
        let ask = match fork::fork_ask(message) {
            Ok(ask) => ask,
            Err(why) => return refuse(reply, id, why),
        };
        let Some(parent_index) = live.units.iter().position(|unit| {
            unit.spec.role == Role::Workspace && unit.spec.name == ask.from && !unit.removed
        }) else {
            let known: Vec<&str> = live
                .units
                .iter()
                .filter(|unit| unit.spec.role == Role::Workspace && !unit.removed)
                .map(|unit| unit.spec.name.as_str())
                .collect();
            let why = if known.is_empty() {
                format!(
                    "box/fork: profile `{}` has no workspace unit (no file system): there is nothing to fork",
                    live.plan.profile
                )
            } else {
                format!(
                    "box/fork: from: no workspace unit `{}` in this session; units: {}",
                    ask.from,
                    named(&known)
                )
            };
            return refuse(reply, id, why);
        };
        let parent = &live.units[parent_index];
        if let Some(why) = &parent.ended {
            return refuse(
                reply,
                id,
                format!("box/fork: unit {} ended: {why}", parent.spec.name),
            );
        }
        let parent_path = match &parent.spec.source {
            WorkspaceSource::Host(path) => path.clone(),
            WorkspaceSource::Empty => {
                return refuse(
                    reply,
                    id,
                    format!(
                        "box/fork: unit {}'s workspace is an empty directory of the engine's (workspace.source = \"empty\"), not a host directory box can fork",
                        parent.spec.name
                    ),
                );
            }
            WorkspaceSource::None => {
                return refuse(
                    reply,
                    id,
                    format!(
                        "box/fork: unit {} has no file system (workspace.source = \"none\")",
                        parent.spec.name
                    ),
                );
            }
        };
        if ask.writable && parent.spec.mode == MountMode::ReadOnly {
            return refuse(
                reply,
                id,
                format!(
                    "box/fork: writable: unit {}'s workspace is read-only (profile `{}`), so a child cannot be writable; fork with writable: false",
                    parent.spec.name, live.plan.profile
                ),
            );
        }
        // The child's spec is the parent's, or narrower: what the backend
        // can wire into the parent's kind of unit it can into the child's.
        let mode = match fork::effective_mode(&self.config, &parent.spec, ask.mode) {
            Ok(mode) => mode,
            Err(why) => return refuse(reply, id, why),
        };
        let name = format!("fork-{}", live.next_fork);
        live.next_fork += 1;
        let session_dir = fork::session_dir(&self.config, &self.id);
        let child_path = session_dir.join(&name);
        let mut spec = match &ask.tighten {
            None => parent.spec.clone(),
            Some(_) if parent.fork.is_some() && live.workspace != Some(parent_index) => {
                return refuse(
                    reply,
                    id,
                    format!(
                        "box/fork: tighten: a fork of a fork has its parent's plan; fork the workspace unit to narrow (from: \"{}\")",
                        live.units
                            .get(live.workspace.unwrap_or(0))
                            .map_or("workspace", |unit| unit.spec.name.as_str())
                    ),
                );
            }
            Some(tighten) => match self.narrowed_workspace(live, tighten) {
                Ok(spec) => spec,
                Err(why) => return refuse(reply, id, why),
            },
        };
        spec.name = name.clone();
        spec.source = WorkspaceSource::Host(child_path.clone());
        if !ask.writable {
            spec.mode = MountMode::ReadOnly;
        }
        spec.description = match &ask.label {
            Some(label) => format!("fork of {}: {label}", ask.from),
            None => format!("fork of {}", ask.from),
        };
        let config = self.config.clone();
        let label = live.label.clone();
        let background = self.background.clone();
        let events = live.events_tx.clone();
        let executor_params = live.executor_params.clone();
        // A child of a workspace whose credentials are hidden sees them hidden
        // too: its copy holds the same files at the same paths.
        let masks = live
            .masks
            .as_ref()
            .map(|masks| masks.wiring().to_vec())
            .unwrap_or_default();
        let session = self.id.clone();
        self.background.spawn(async move {
            let clock = Instant::now();
            let made = {
                let (config, parent_path, child_path, ask) = (
                    config.clone(),
                    parent_path.clone(),
                    child_path.clone(),
                    ask.clone(),
                );
                tokio::task::spawn_blocking(move || {
                    fork::make_private_dir(&session_dir)
                        .and_then(|()| fork::make_fork(&config, &parent_path, &child_path, &ask, &mode))
                })
                .await
                .unwrap_or_else(|join| Err(format!("box/fork: the fork failed: {join}")))
            };
            let forked = match made {
                Ok(forked) => forked,
                Err(why) => {
                    return reply.answer(error_response(id, code::INTERNAL_ERROR, why));
                }
            };
            let child = ChildFork {
                parent: ask.from.clone(),
                parent_path,
                path: child_path,
                base: Arc::new(std::sync::Mutex::new(forked.base.clone())),
                mode: forked.mode_used,
                shares: forked.shares.clone(),
                label: ask.label.clone(),
            };
            let drop_storage = |child: ChildFork| {
                let config = config.clone();
                tokio::task::spawn_blocking(move || fork::remove_storage(&config, &child))
            };
            let objects = forked
                .objects
                .as_ref()
                .map(|objects| box_backend::ObjectsWiring {
                    host: objects.host.clone(),
                });
            // A worktree child's `.git` is a repository of box's making, not a
            // copy of the parent's: the parent's masked `.git` files do not
            // belong over it (its working files still get theirs).
            let masks: Vec<box_backend::FileMask> = if forked.mode_used == box_fork::Mechanism::Worktree {
                masks
                    .into_iter()
                    .filter(|mask| !mask.target.starts_with(".git"))
                    .collect()
            } else {
                masks
            };
            let timeout = spec.limits.start_timeout;
            let started = start_units(
                &config,
                &label,
                std::slice::from_ref(&spec),
                timeout,
                &background,
                StartWiring {
                    workspace_masks: &masks,
                    objects: objects.as_ref(),
                    parent: Some(&ask.from),
                    ..StartWiring::default()
                },
            )
            .await;
            let (key, unit, egress) = match started {
                Ok((mut started, egress)) if started.len() == 1 => match started.pop() {
                    Some((key, unit)) => (key, unit, egress),
                    None => return,
                },
                Ok(_) => return,
                Err(error) => {
                    let _ = drop_storage(child).await;
                    return reply.answer(error_response(
                        id,
                        code::INTERNAL_ERROR,
                        format!("box/fork: starting unit {name}: {error}"),
                    ));
                }
            };
            let mut link = ExecutorLink::new(unit.io.stdin, unit.io.stdout);
            let remaining = timeout.saturating_sub(clock.elapsed());
            let initialized = initialize_executor(
                &mut link,
                executor_params,
                config.executor_init_timeout.min(remaining),
            )
            .await;
            let tracked = Tracked {
                key,
                id: unit.envelope.id.clone(),
            };
            let tools = match initialized {
                Ok(start) => start.tools,
                Err(why) => {
                    drop(link);
                    remove_until_gone(&config, vec![tracked]).await;
                    let _ = drop_storage(child).await;
                    return reply.answer(error_response(
                        id,
                        code::INTERNAL_ERROR,
                        format!("box/fork: starting unit {name}: {why}"),
                    ));
                }
            };
            let mut envelope = unit.envelope;
            envelope.parent = Some(ask.from.clone());
            let millis = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
            envelope.limits.set_start_timeout_ms(millis);
            tracing::info!(%session, unit = %name, from = %ask.from, mode = fork::mode_name(forked.mode_used), took_ms = clock.elapsed().as_millis() as u64, "forked a workspace unit");
            // A fork of the workspace unit, or of another child.
            let parent_kind = if ask.from == "workspace" {
                "workspace"
            } else {
                "fork"
            };
            config.metrics.fork_started(clock.elapsed(), parent_kind);
            let started = ForkStarted {
                id,
                reply,
                key,
                spec,
                envelope,
                link,
                ended: unit.ended,
                renewal: unit.renewal,
                tools,
                egress,
                child,
                advisory: forked.advisory.clone(),
                skipped: forked.skipped.len(),
            };
            if let Err(sent) = events.send(UnitEvent::Forked(Box::new(started))).await
                && let UnitEvent::Forked(started) = sent.0
            {
                // The session ended meanwhile: the child goes with it.
                let started = *started;
                started.reply.answer(error_response(
                    started.id,
                    code::INTERNAL_ERROR,
                    "box/fork: the session ended before the child joined it",
                ));
                drop(started.link);
                remove_until_gone(&config, vec![tracked]).await;
                let _ = drop_storage(started.child).await;
            }
        });
    }

    /// The workspace unit's spec under the session's tightening and then
    /// `tighten`: narrower than the session's, never wider (a wider ask is
    /// refused naming the field).
    fn narrowed_workspace(&self, live: &Live, tighten: &Value) -> Result<UnitSpec, String> {
        let session = box_policy::plan::Tightening::parse(&live.tighten)
            .and_then(|tightening| box_policy::plan::tighten(&live.profile, &tightening))
            .map_err(|error| format!("box/fork: the session's tightening: {error}"))?;
        let plan = (self.config.resolve)(&session, tighten, &self.config.facts)
            .map_err(|error| format!("box/fork: {error}"))?;
        plan.units
            .into_iter()
            .find(|unit| unit.role == Role::Workspace)
            .ok_or_else(|| "box/fork: tighten left no workspace unit".to_owned())
    }

    /// A started child joins the session: routed, linked, answered.
    fn join_fork(&self, live: &mut Live, started: ForkStarted) {
        let index = live.router.add_unit(FIRST_REQUEST_ID);
        if index != live.units.len() {
            // The router and the units grow together; never expected.
            tracing::error!(session = %self.id, "the router's units and the session's disagree");
        }
        let writer = link_unit(
            index,
            started.link,
            started.ended,
            &live.events_tx,
            &mut live.tasks,
        );
        let name = started.spec.name.clone();
        let mut result = json!({
            "unit": name,
            "from": started.child.parent,
            "mode": fork::mode_name(started.child.mode),
            "shares": started.child.shares,
            "envelope": serde_json::to_value(&started.envelope).unwrap_or(Value::Null),
        });
        if let Some(advisory) = &started.advisory {
            result["advisory"] = json!(advisory);
        }
        if started.skipped > 0 {
            result["skipped"] = json!(started.skipped);
        }
        live.redactor.message(&mut result);
        live.units.push(Unit {
            key: started.key,
            spec: started.spec,
            envelope: started.envelope,
            writer: Some(writer),
            ended: None,
            closed: false,
            close_reason: None,
            draining: None,
            tools: started.tools,
            _renewal: started.renewal,
            fork: Some(started.child),
            removed: false,
        });
        live.egress.extend(started.egress);
        started.reply.answer(result_response(started.id, result));
    }

    /// `box/merge {unit, theirs?}`: the child's changes into its parent, all
    /// or nothing, off the session task (merges into one parent wait for
    /// each other host-wide).
    fn merge(&self, live: &mut Live, id: Value, message: &Value, reply: ReplyTo) {
        let asked = fork::unit_param("box/merge", message, &["unit", "theirs"])
            .and_then(|unit| fork::theirs(message).map(|theirs| (unit, theirs)));
        let (unit, theirs) = match asked {
            Ok(asked) => asked,
            Err(why) => return reply.answer(error_response(id, code::INVALID_PARAMS, why)),
        };
        let child = match self.child_of(live, "box/merge", &unit) {
            Ok(index) => live.units[index].fork.clone(),
            Err(why) => return reply.answer(error_response(id, code::INVALID_PARAMS, why)),
        };
        let Some(child) = child else { return };
        let config = self.config.clone();
        // The merge runs off the session task, with its own handle.
        let counted = self.config.clone();
        self.background.spawn(async move {
            let merged =
                tokio::task::spawn_blocking(move || fork::merge(&config, &unit, &child, theirs))
                    .await
                    .unwrap_or_else(|join| {
                        Err((
                            code::INTERNAL_ERROR,
                            format!("box/merge: the merge failed: {join}"),
                            Value::Null,
                        ))
                    });
            match merged {
                Ok(result) => {
                    counted.metrics.merge("merged");
                    reply.answer(result_response(id, result));
                }
                Err((code, message, data)) => {
                    counted.metrics.merge(if code == code::INTERNAL_ERROR {
                        "failed"
                    } else {
                        "refused"
                    });
                    reply.answer(error_response_with_data(id, code, message, data));
                }
            }
        });
    }

    /// `box/discard {unit}`: the child leaves the session at once (its calls
    /// in flight are answered), then its unit and storage are removed; the
    /// answer comes once both are gone.
    fn discard(&self, live: &mut Live, id: Value, message: &Value, reply: ReplyTo) {
        let unit = match fork::unit_param("box/discard", message, &["unit"]) {
            Ok(unit) => unit,
            Err(why) => return reply.answer(error_response(id, code::INVALID_PARAMS, why)),
        };
        let index = match self.child_of(live, "box/discard", &unit) {
            Ok(index) => index,
            Err(why) => return reply.answer(error_response(id, code::INVALID_PARAMS, why)),
        };
        if live.workspace == Some(index) {
            return reply.answer(error_response(
                id,
                code::INVALID_PARAMS,
                "box/discard: the session's workspace unit stays while the session lasts; end the session to remove it and its fork".to_owned(),
            ));
        }
        let children: Vec<&str> = live
            .units
            .iter()
            .filter(|other| {
                !other.removed && other.fork.as_ref().is_some_and(|fork| fork.parent == unit)
            })
            .map(|other| other.spec.name.as_str())
            .collect();
        if !children.is_empty() {
            return reply.answer(error_response(
                id,
                code::INVALID_PARAMS,
                format!(
                    "box/discard: unit {unit} has forks of its own, {}; discard them first",
                    named(&children)
                ),
            ));
        }
        for forward in live.router.remove_unit(index) {
            self.record(live, index, &forward.tag, "unit_ended");
            forward.reply.answer(error_response(
                forward.client_id,
                code::INTERNAL_ERROR,
                format!("unit {unit} was discarded"),
            ));
        }
        let state = &mut live.units[index];
        self.config
            .metrics
            .fork_discarded(state.envelope.state == UnitState::Ended);
        state.removed = true;
        // Not wanted any more: its lease is no longer renewed.
        state._renewal = None;
        state
            .ended
            .get_or_insert_with(|| "it was discarded".to_owned());
        state.writer = None;
        state.envelope.state = UnitState::Ended;
        let tracked = Tracked {
            key: state.key,
            id: state.envelope.id.clone(),
        };
        let child = state.fork.clone();
        live.egress.retain(|proxy| proxy.unit != unit);
        let config = self.config.clone();
        self.background.spawn(async move {
            remove_until_gone(&config, vec![tracked]).await;
            if let Some(child) = child {
                let config = config.clone();
                let _ = tokio::task::spawn_blocking(move || fork::remove_storage(&config, &child))
                    .await;
            }
            reply.answer(result_response(
                id,
                json!({"unit": unit, "discarded": true}),
            ));
        });
    }

    /// The index of the fork named `unit`, or why there is none.
    fn child_of(&self, live: &Live, method: &str, unit: &str) -> Result<usize, String> {
        let forks: Vec<&str> = live
            .units
            .iter()
            .filter(|candidate| candidate.fork.is_some() && !candidate.removed)
            .map(|candidate| candidate.spec.name.as_str())
            .collect();
        match live
            .units
            .iter()
            .position(|candidate| candidate.spec.name == unit)
        {
            Some(index) if live.units[index].removed => {
                Err(format!("{method}: unit {unit} was discarded"))
            }
            Some(index) if live.units[index].fork.is_some() => Ok(index),
            Some(index) if live.workspace == Some(index) => Err(format!(
                "{method}: the workspace unit is not a fork (profile `{}` has workspace.source other than \"fork\"); forks: {}",
                live.plan.profile,
                named(&forks)
            )),
            Some(_) => Err(format!(
                "{method}: unit {unit} is not a fork of this session; forks: {}",
                named(&forks)
            )),
            None => Err(format!(
                "{method}: no unit {unit} in this session; forks: {}",
                named(&forks)
            )),
        }
    }

    /// A unit is gone: every request in flight to it is answered once with the
    /// cause; later requests get "unit ended".
    fn unit_died(&self, live: &mut Live, unit: usize, cause: String, end: Option<&UnitEnd>) {
        let Some(state) = live.units.get_mut(unit) else {
            return;
        };
        if state.ended.is_some() {
            return;
        }
        let cause = live.redactor.text(&cause).into_owned();
        tracing::warn!(session = %self.id, unit = %state.spec.name, %cause, "a unit ended");
        self.config.metrics.unit_ended();
        state.ended = Some(cause.clone());
        state.writer = None;
        state.envelope.state = UnitState::Ended;
        let name = state.spec.name.clone();
        // Everything the unit sent before its end has been routed: a call
        // still in flight got no answer, but it may have run, in part or in
        // full, before the unit ended; never said not to have run.
        let data = json!({
            "unit": name,
            "exitCode": end.and_then(|end| end.exit_code),
            // true, false, or null where the backend cannot tell (or no end came).
            "oomKilled": end.and_then(|end| end.oom_killed),
            "outcome": "unknown",
        });
        for forward in live.router.take_all(unit) {
            self.record(live, unit, &forward.tag, "unit_ended");
            forward.reply.answer(error_response_with_data(
                forward.client_id,
                code::INTERNAL_ERROR,
                format!(
                    "unit {name} ended: {cause}; it had not answered this {}, which may have run, in part or in full: its outcome is unknown",
                    forward.tag.method
                ),
                data.clone(),
            ));
        }
    }

    /// Stop a call's timer and record it (metrics, audit).
    fn record(&self, live: &Live, unit: usize, tag: &Tag, outcome: &str) {
        self.record_answer(live, unit, tag, outcome, AnswerDetails::default());
    }

    /// [`Self::record`] for a call its unit answered: the audit line says
    /// what the answer said beyond its outcome.
    fn record_answer(
        &self,
        live: &Live,
        unit: usize,
        tag: &Tag,
        outcome: &str,
        details: AnswerDetails,
    ) {
        if let Some(deadline) = &tag.deadline {
            deadline.abort();
        }
        if let (Some(journal), Some(unit_id)) = (&live.journal, tag.unit_id) {
            journal.done(unit, unit_id);
        }
        let duration = tag.started.elapsed();
        // Counted under a tool the unit listed at start, or `other`: a
        // client's made-up names never become series.
        let tool = tag.tool.as_deref().map(|tool| {
            super::metrics::tool_label(
                tool,
                live.units.get(unit).and_then(|unit| unit.tools.as_ref()),
            )
        });
        self.config
            .metrics
            .call(&tag.method, tool, outcome, duration);
        if let (Some(audit), Some(tool)) = (&self.config.audit, &tag.tool) {
            audit.record(&super::audit::Record {
                session: &self.id,
                profile: &live.plan.profile,
                client: live.client.as_ref(),
                unit: &live.units[unit].spec.name,
                parent: live.units[unit]
                    .fork
                    .as_ref()
                    .map(|fork| fork.parent.as_str()),
                tool,
                arguments_sha256: tag.arguments_digest.as_deref().unwrap_or(""),
                duration,
                outcome,
                exit_status: details.exit_status,
                is_error: details.is_error,
            });
        }
    }

    /// End the session: answer what is in flight, close every executor's input
    /// (their processes end), wait a little for them, then remove every unit.
    async fn finish(&self, live: &mut Live, why: &str) {
        // Ending normally: nothing is left to reattach to.
        if let Some(store) = &self.config.state {
            store.remove(&self.id);
        }
        for unit in 0..live.units.len() {
            for forward in live.router.take_all(unit) {
                self.record(live, unit, &forward.tag, "session_ended");
                forward.reply.answer(error_response(
                    forward.client_id,
                    code::INTERNAL_ERROR,
                    format!("the session ended: {why}"),
                ));
            }
        }
        for unit in &mut live.units {
            unit.writer = None;
            // Its calls are answered: nothing more to read before its end.
            if let Some(end) = unit.draining.take() {
                unit.ended = Some(describe_end(&end));
            }
        }
        // Ending at once, nothing of the units is waited for: they are removed now.
        let grace = match self.config.removal() {
            Removal::Graceful => SESSION_END_GRACE,
            Removal::AtOnce => Duration::ZERO,
        };
        let deadline = tokio::time::Instant::now() + grace;
        let mut joining = Vec::new();
        while live.units.iter().any(|unit| unit.ended.is_none()) {
            let event = tokio::select! {
                () = tokio::time::sleep_until(deadline) => break,
                event = live.events_rx.recv() => event,
            };
            match event {
                Some(UnitEvent::Ended(unit, end)) => {
                    if let Some(state) = live.units.get_mut(unit) {
                        state.ended = Some(describe_end(&end));
                    }
                }
                Some(UnitEvent::Grace(unit)) => {
                    if let Some(state) = live.units.get_mut(unit) {
                        state
                            .ended
                            .get_or_insert_with(|| "its executor closed its output".to_owned());
                    }
                }
                Some(UnitEvent::Closed(unit, _)) => {
                    // The session is ending anyway: the output closing is enough.
                    if let Some(state) = live.units.get_mut(unit) {
                        state
                            .ended
                            .get_or_insert_with(|| "its executor exited".to_owned());
                    }
                }
                Some(UnitEvent::Forked(started)) => joining.push(started),
                Some(_) => {}
                None => break,
            }
        }
        // Units that died during the session were counted then; the rest end here.
        let died = live
            .units
            .iter()
            .filter(|unit| !unit.removed && unit.envelope.state == UnitState::Ended)
            .count();
        let mut tracked: Vec<Tracked> = live
            .units
            .iter()
            .filter(|unit| !unit.removed)
            .map(|unit| Tracked {
                key: unit.key,
                id: unit.envelope.id.clone(),
            })
            .collect();
        // Forks still joining go with the session; later ones remove themselves.
        let mut children: Vec<ChildFork> = live
            .units
            .iter()
            .rev()
            .filter(|unit| !unit.removed)
            .filter_map(|unit| unit.fork.clone())
            .collect();
        live.events_rx.close();
        while let Ok(event) = live.events_rx.try_recv() {
            if let UnitEvent::Forked(started) = event {
                joining.push(started);
            }
        }
        for started in joining {
            {
                let started = *started;
                started.reply.answer(error_response(
                    started.id,
                    code::INTERNAL_ERROR,
                    format!("box/fork: the session ended: {why}"),
                ));
                tracked.push(Tracked {
                    key: started.key,
                    id: started.envelope.id.clone(),
                });
                children.insert(0, started.child);
            }
        }
        let count = tracked.len();
        live.tasks.abort_all();
        // The session is over only once its units are confirmed gone: until
        // then it keeps its place, and the host names them if it exits first.
        remove_until_gone(&self.config, tracked).await;
        if !children.is_empty() {
            // Children of children first (the newest first).
            let config = self.config.clone();
            let _ = tokio::task::spawn_blocking(move || {
                for child in &children {
                    fork::remove_storage(&config, child);
                }
            })
            .await;
        }
        self.config.metrics.session_ended(count, died);
        tracing::info!(session = %self.id, units = count, "session ended, units removed");
    }
}

/// Answer the requests still queued when a session ends: each gets its one answer.
fn drain(inbound: &mut mpsc::Receiver<Inbound>, why: &str) {
    inbound.close();
    while let Ok(message) = inbound.try_recv() {
        if let Inbound::Request(message, reply) = message {
            let id = message.get("id").cloned().unwrap_or(Value::Null);
            reply.answer(error_response(
                id,
                code::INTERNAL_ERROR,
                format!("the session ended: {why}"),
            ));
        }
    }
}

/// Sleep until `when`, or for ever.
async fn sleep_until(when: Option<tokio::time::Instant>) {
    match when {
        Some(when) => tokio::time::sleep_until(when).await,
        None => std::future::pending().await,
    }
}

/// Rewrite a unit's answer for the client (its request id and progress
/// token are the router's to put back): a process id gets its unit's name,
/// so ids stay unique across units.
fn rewrite_answer(rewrite: &Rewrite, response: &mut Value) {
    if let Rewrite::ProcessId { unit: name } = rewrite
        && let Some(id) = response.pointer_mut("/result/id")
        && let Some(text) = id.as_str()
    {
        *id = json!(format!("{name}:{text}"));
    }
}

/// Whether a forwarded request gets the profile's per-call deadline. The
/// process methods that wait on the process (read, write, wait) are long polls
/// by design and are bounded by the process, not by a call deadline.
/// Sets `field` in the initialize result's box answer
/// (`capabilities.experimental[EXECUTOR_KEY].box`).
fn set_box_field(result: &mut Value, field: &str, value: Value) {
    if let Some(answer) = result
        .pointer_mut("/capabilities/experimental")
        .and_then(|experimental| experimental.get_mut(EXECUTOR_KEY))
        .and_then(|executor| executor.get_mut("box"))
        .and_then(Value::as_object_mut)
    {
        answer.insert(field.to_owned(), value);
    }
}

fn has_deadline(method: &str) -> bool {
    !matches!(
        method,
        "agentworkspace/process.read"
            | "agentworkspace/process.write"
            | "agentworkspace/process.wait"
    )
}

/// Send a message to a unit's executor without waiting; the error names the unit.
fn send_to_unit(unit: &Unit, message: Value) -> Result<(), String> {
    if let Some(why) = &unit.ended {
        return Err(format!("unit {} ended: {why}", unit.spec.name));
    }
    let Some(writer) = &unit.writer else {
        return Err(format!("unit {} ended", unit.spec.name));
    };
    writer.try_send(message).map_err(|error| match error {
        mpsc::error::TrySendError::Full(_) => format!(
            "unit {} is not reading its input ({} messages are waiting); try again later",
            unit.spec.name, UNIT_QUEUE
        ),
        mpsc::error::TrySendError::Closed(_) => format!("unit {} ended", unit.spec.name),
    })
}

/// The outcome word of an answer, for metrics and the audit log.
/// What the audit says of an answered call beyond its outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct AnswerDetails {
    /// A `bash` call's exit status, when it exited.
    exit_status: Option<i64>,
    /// The result's `isError`, when the call was answered with a result.
    is_error: Option<bool>,
}

/// How a call of `tool` that `response` answers ended: `error` (a JSON-RPC
/// error), `tool_error` (`isError: true`), `failed` (a `bash` result whose
/// command exited non-zero, was killed at its timeout or was cancelled: the
/// executor says so only in the text's last line, `[exit N]`, `[killed
/// after ...]`, `[canceled]`), else `ok`; and what the audit adds.
fn outcome_of(tool: Option<&str>, response: &Value) -> (&'static str, AnswerDetails) {
    if response.get("error").is_some() {
        return ("error", AnswerDetails::default());
    }
    let is_error = response
        .pointer("/result/isError")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let mut details = AnswerDetails {
        exit_status: None,
        is_error: Some(is_error),
    };
    if is_error {
        return ("tool_error", details);
    }
    if tool != Some("bash") {
        return ("ok", details);
    }
    let last_line = response
        .pointer("/result/content")
        .and_then(Value::as_array)
        .and_then(|content| {
            content
                .iter()
                .rev()
                .find_map(|block| block.get("text").and_then(Value::as_str))
        })
        .and_then(|text| text.rsplit('\n').next())
        .unwrap_or("");
    if let Some(status) = last_line
        .strip_prefix("[exit ")
        .and_then(|rest| rest.strip_suffix(']'))
        .and_then(|status| status.parse::<i64>().ok())
    {
        details.exit_status = Some(status);
        return (if status == 0 { "ok" } else { "failed" }, details);
    }
    if last_line.starts_with("[killed after ") || last_line == "[canceled]" {
        return ("failed", details);
    }
    ("ok", details)
}

/// What a unit's link tasks tell the session task.
#[derive(Debug)]
pub(crate) enum UnitEvent {
    /// A message from the unit's executor.
    Message(usize, Value),
    /// The executor's output ended (or broke); why.
    Closed(usize, String),
    /// The unit ended, with the backend's cause.
    Ended(usize, UnitEnd),
    /// The grace after `Closed` passed without `Ended`.
    Grace(usize),
    /// The drain after `Ended` passed without `Closed`.
    Drained(usize),
    /// A forwarded request's deadline passed.
    Deadline(usize, u64),
    /// The settle after a deadline passed without the request's answer.
    Overdue(usize, u64),
    /// A `box/fork` child started and initialized, to join the session.
    Forked(Box<ForkStarted>),
}

/// Start the reader, writer and watcher tasks of unit `index`; returns the
/// sender of its writer. Events go to `events`; the tasks live in `tasks`.
fn link_unit(
    index: usize,
    link: ExecutorLink,
    ended: futures::future::BoxFuture<'static, UnitEnd>,
    events: &mpsc::Sender<UnitEvent>,
    tasks: &mut JoinSet<()>,
) -> mpsc::Sender<Value> {
    let ExecutorLink {
        mut reader,
        mut writer,
    } = link;
    let (writer_tx, mut writer_rx) = mpsc::channel::<Value>(UNIT_QUEUE);
    tasks.spawn(async move {
        while let Some(message) = writer_rx.recv().await {
            if let Err(error) = write_line(&mut writer, &message).await {
                tracing::warn!(unit = index, %error, "writing to a unit's executor failed");
                break;
            }
        }
        // Dropping the writer closes the executor's stdin: it ends its processes and exits.
        drop(writer);
    });
    let reader_events = events.clone();
    tasks.spawn(async move {
        let why = loop {
            match reader.next().await {
                Ok(None) => break "its executor closed its output".to_owned(),
                Err(error) => break format!("reading its executor's output failed: {error}"),
                Ok(Some(Line::TooLong(length))) => {
                    break format!(
                        "its executor sent a message of {length} bytes; at most {MAX_MESSAGE_BYTES}"
                    );
                }
                Ok(Some(Line::Message(bytes))) => match serde_json::from_slice::<Value>(&bytes) {
                    Ok(message) => {
                        if reader_events
                            .send(UnitEvent::Message(index, message))
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                    Err(_) => break "its executor wrote something that is not JSON".to_owned(),
                },
            }
        };
        let _ = reader_events.send(UnitEvent::Closed(index, why)).await;
    });
    let ended_events = events.clone();
    tasks.spawn(async move {
        let end = ended.await;
        let _ = ended_events.send(UnitEvent::Ended(index, end)).await;
    });
    writer_tx
}
