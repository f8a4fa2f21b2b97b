//! What an open session holds: its units ([`Unit`]), the proxy's record of
//! each forwarded request ([`Tag`]), and the events its units' link tasks
//! send the session task ([`UnitEvent`], [`link_unit`]).

use std::time::{Instant, SystemTime};

use box_backend::{Envelope, SessionLabel, UnitEnd};
use box_jsonrpc::ReplyTo;
use box_jsonrpc::lines::{Line, MAX_MESSAGE_BYTES, write_line};
use box_policy::plan::{Plan, UnitSpec};
use serde_json::{Map, Value};
use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinSet};

use crate::audit::ClientInfo;
use crate::egress::EgressProxy;
use crate::fork::ChildFork;
use crate::hide::Masks;
use crate::redact::SessionRedactor;
use crate::router::Router;
use crate::state;
use crate::units::{ExecutorLink, UNIT_QUEUE};

/// A child unit started by `box/fork`, handed to the session task to join
/// the session (or, if the session is ending, to be removed).
pub(super) struct ForkStarted {
    pub(super) id: Value,
    pub(super) reply: ReplyTo,
    pub(super) key: u64,
    pub(super) spec: UnitSpec,
    pub(super) envelope: Envelope,
    pub(super) link: ExecutorLink,
    pub(super) ended: futures::future::BoxFuture<'static, UnitEnd>,
    pub(super) renewal: Option<box_backend::Renewal>,
    pub(super) tools: Option<Value>,
    pub(super) egress: Vec<EgressProxy>,
    pub(super) child: ChildFork,
    pub(super) advisory: Option<String>,
    pub(super) skipped: usize,
    /// The fork's span, then its request's: they end once it is answered.
    pub(super) spans: Vec<box_otel::Span>,
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

/// How many unit events may wait for the session task; a unit's reader waits
/// when it is full (back-pressure onto that executor, not loss).
pub(super) const EVENT_QUEUE: usize = 256;

/// A session after initialize: its units and its routing.
pub(super) struct Live {
    pub(super) plan: Plan,
    /// The client, as its `initialize` named itself (for the audit).
    pub(super) client: Option<ClientInfo>,
    /// The SHA-256 of the handle's secret, for a session opened with
    /// `box/session.open` (`stateless.rs`); `None` otherwise.
    pub(super) handle: Option<String>,
    pub(super) units: Vec<Unit>,
    pub(super) workspace: Option<usize>,
    pub(super) router: Router<Tag>,
    pub(super) events_tx: mpsc::Sender<UnitEvent>,
    pub(super) events_rx: mpsc::Receiver<UnitEvent>,
    pub(super) tasks: JoinSet<()>,
    pub(super) last_activity: Instant,
    pub(super) started: Instant,
    /// Every secret value the session's units were handed or the host
    /// scrubbed, replaced in everything a unit sends toward the client.
    pub(super) redactor: SessionRedactor,
    /// The egress proxies of the units whose network is egress; they live as
    /// long as the session's units.
    pub(super) egress: Vec<EgressProxy>,
    /// The workspace unit's masked copies (`on_persisted_credentials = "hide"`).
    pub(super) masks: Option<Masks>,
    /// How each executor is initialized (a fork's too).
    pub(super) executor_params: Value,
    /// The session's units' labels.
    pub(super) label: SessionLabel,
    /// The number of the next `box/fork` child.
    pub(super) next_fork: u32,
    /// The session's profile and its tightening, which a fork's `tighten`
    /// narrows further.
    pub(super) profile: box_policy::profile::Profile,
    pub(super) tighten: Value,
    /// The journal of calls in flight, when the session's identity is kept.
    pub(super) journal: Option<state::Journal>,
    /// After a reattach: the calls the dead host sent and never saw
    /// answered, by unit and id at the unit.
    pub(super) late: std::collections::HashMap<(usize, u64), Value>,
    /// A session a stateless request without a handle opened (stdio's one
    /// session): its initialize-form answer, from which a later
    /// `box/session.open` (or its tool) names the session's handle.
    pub(super) opened: Option<Value>,
    /// The last round of input a call of this session was answered with.
    pub(super) input_rounds: u64,
    /// What answered a call while its client was away answering its input
    /// (by unit and id at the unit): the round it waited in and the answer,
    /// for its retry.
    pub(super) input_answers: std::collections::HashMap<(usize, u64), (u64, Value)>,
    /// What the session's spans need beyond the request (its era, the
    /// request that opened it).
    pub(super) trace: SessionTrace,
    /// The tasks of MCP's tasks extension this session keeps (`tasks.rs`),
    /// oldest first.
    pub(super) mcp_tasks: Vec<McpTask>,
}

/// A session's part in its traces.
#[derive(Debug, Default)]
pub(super) struct SessionTrace {
    /// Opened by the stateless revision: its spans name no `mcp.session.id`.
    pub(super) stateless: bool,
    /// The context of the request that opened the session: the parent of
    /// what the session does later on its own (its units' removal).
    pub(super) parent: Option<box_otel::SpanContext>,
    /// The spans of requests sent on to the units' executors, until the
    /// executors' spans under them come home (in batches, after the
    /// answers).
    pub(super) executor_parents: box_otel::ExecutorParents,
}

/// One task of MCP's tasks extension (`tasks.rs`): a call in flight in a
/// unit, then its outcome.
pub(super) struct McpTask {
    pub(super) id: String,
    pub(super) unit: usize,
    /// The call's id at its unit.
    pub(super) call: u64,
    pub(super) state: TaskState,
    pub(super) created: SystemTime,
    pub(super) updated: SystemTime,
    /// What the unit asks of the client and the client has not answered,
    /// by key (the id the answer goes back under).
    pub(super) asks: Map<String, Value>,
    /// Its end was read with `tasks/get`.
    pub(super) read: bool,
}

/// Where a task stands.
pub(super) enum TaskState {
    Working,
    /// The call's result, in the revision's form.
    Completed(Value),
    /// The call's JSON-RPC error.
    Failed(Value),
    Cancelled,
}

pub(super) struct Unit {
    /// Its key in the host's ledger.
    pub(super) key: u64,
    pub(super) spec: UnitSpec,
    pub(super) envelope: Envelope,
    pub(super) writer: Option<mpsc::Sender<Value>>,
    /// Why it ended, once it has.
    pub(super) ended: Option<String>,
    /// Its output closed (waiting for the backend's cause).
    pub(super) closed: bool,
    /// Why its output closed.
    pub(super) close_reason: Option<String>,
    /// The backend's word that it ended, held until its output is read to
    /// its end (`UNIT_END_DRAIN` at most).
    pub(super) draining: Option<UnitEnd>,
    /// Its tool list, read before anything ran in it.
    pub(super) tools: Option<Value>,
    /// The renewal of its lease, held while the session wants the unit.
    pub(super) _renewal: Option<box_backend::Renewal>,
    /// A child made by `box/fork`: its fork.
    pub(super) fork: Option<ChildFork>,
    /// Discarded (`box/discard`): its removal is under way or done.
    pub(super) removed: bool,
}

/// What the proxy keeps with a forwarded request.
#[derive(Debug)]
pub(super) struct Tag {
    pub(super) method: String,
    /// Its method's label in `box_calls`.
    pub(super) label: &'static str,
    pub(super) tool: Option<String>,
    pub(super) arguments_digest: Option<String>,
    pub(super) started: Instant,
    /// The deadline's timer, then the settle's once it has fired.
    pub(super) deadline: Option<AbortHandle>,
    /// The deadline fired; the answer may still come within the settle.
    pub(super) overdue: bool,
    pub(super) rewrite: Rewrite,
    /// A process method whose answer carries output (`read`, `close`): the
    /// process id as the unit knows it, and the fd read.
    pub(super) process: Option<(String, u8)>,
    /// Its id at the unit, once forwarded (the call journal's key).
    pub(super) unit_id: Option<u64>,
    /// Its span (`{mcp.method.name} {target}`), ended when it is recorded.
    pub(super) span: box_otel::Span,
    /// A stateless call that may answer "input required" (`input.rs`).
    pub(super) input: Option<Input>,
}

/// A stateless call's input rounds (MCP 2026-07-28's MRTR, `input.rs`).
#[derive(Debug)]
pub(super) struct Input {
    /// Its name (a tool's, a prompt's) or URI (a resource's): a retry must
    /// name the same.
    pub(super) name: String,
    /// Answered "input required": waiting for the client's retry.
    pub(super) waiting: Option<Waiting>,
}

/// A call whose client was answered "input required", waiting for its retry.
#[derive(Debug)]
pub(super) struct Waiting {
    /// The round its request state answers.
    pub(super) round: u64,
    /// The keys of the round's requests (the ids the client answers them
    /// by), forgotten if the round is never answered.
    pub(super) keys: Vec<String>,
    /// What the unit asked of the client since: the next round's requests.
    pub(super) queued: Vec<Value>,
    /// The state's time to live.
    pub(super) expiry: AbortHandle,
}

/// A request span's name by MCP's conventions: `{mcp.method.name}
/// {target}`, the target the tool or prompt a call names, else the method
/// alone. `target` is the client's text, already redacted.
pub(super) fn span_name(method: &str, target: Option<&str>) -> String {
    match target {
        Some(target) => format!("{method} {target}"),
        None => method.to_owned(),
    }
}

/// The tool or prompt name a request's `params.name` gives, for
/// `tools/call` and `prompts/get`.
pub(super) fn span_target(method: &str, message: &Value) -> Option<String> {
    matches!(method, "tools/call" | "prompts/get")
        .then(|| message.pointer("/params/name").and_then(Value::as_str))
        .flatten()
        .map(str::to_owned)
}

/// The `error.type` of an outcome a call was recorded with (`None`: it
/// worked, a command that exited non-zero among them); a JSON-RPC error
/// says its code, as the conventions ask.
pub(super) fn error_type(outcome: &str, response: Option<&Value>) -> Option<String> {
    match outcome {
        "ok" | "failed" => None,
        "error" => Some(
            response
                .and_then(|response| response.pointer("/error/code"))
                .map_or_else(|| "error".to_owned(), ToString::to_string),
        ),
        other => Some(other.to_owned()),
    }
}

/// How an answer is changed on its way back.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Rewrite {
    None,
    /// A server unit's process id is namespaced `<unit>:<id>`.
    ProcessId {
        unit: String,
    },
}

/// What a unit's link tasks tell the session task.
#[derive(Debug)]
pub(super) enum UnitEvent {
    /// A message from the unit's executor.
    Message(usize, Value),
    /// The executor's spans line, as read (never made a `Value`).
    Spans(usize, Vec<u8>),
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
    /// A call's round of input (unit, id at the unit, round) outlived its
    /// request state.
    InputExpired(usize, u64, u64),
    /// A `box/fork` child started and initialized, to join the session.
    Forked(Box<ForkStarted>),
}

/// Start the reader, writer and watcher tasks of unit `index`; returns the
/// sender of its writer. Events go to `events`; the tasks live in `tasks`.
pub(super) fn link_unit(
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
                Ok(Some(Line::Message(bytes))) if box_otel::is_executor_spans_line(&bytes) => {
                    if reader_events
                        .send(UnitEvent::Spans(index, bytes))
                        .await
                        .is_err()
                    {
                        return;
                    }
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

/// Send a message to a unit's executor without waiting; the error names the unit.
pub(super) fn send_to_unit(unit: &Unit, message: Value) -> Result<(), String> {
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
