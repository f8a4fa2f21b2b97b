//! The routing loop of an open session: what its client sends goes to the
//! unit it is for (chosen here), or is answered by the host; what its units
//! send comes back through [`Session::on_unit`] (`answer.rs`). The loop
//! also keeps the session's idle time and lifetime.

use std::time::{Duration, Instant};

use box_jsonrpc::session::Inbound;
use box_jsonrpc::{
    Kind, ReplyTo, check_params, classify, code, discover_refusal, error_response, params,
    params_mut, result_response,
};
use box_policy::plan::Role;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::live::{Live, Rewrite, Tag, UnitEvent, send_to_unit};
use super::{Session, UNIT_META, named, sleep_until};
use crate::fork;
use crate::units::describe_end;

/// The most client requests one session may have in flight at once.
const MAX_IN_FLIGHT: usize = 256;
/// When the idle time has run out, how long what the client sent meanwhile
/// still counts: a host frozen past the idle time finds its clients'
/// requests waiting behind the timer (in sockets, in a transport's tasks),
/// and a session is not idle while they wait.
const IDLE_SETTLE: Duration = Duration::from_secs(1);

pub(super) enum Route {
    Unit(usize, Value, Rewrite),
    Answer(Value),
}

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

impl Session {
    /// Route messages until the session ends; why it ended.
    pub(super) async fn route(
        &self,
        live: &mut Live,
        inbound: &mut mpsc::Receiver<Inbound>,
    ) -> String {
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
    /// and progress token, [`Router::forward`](crate::router::Router::forward)), then, when the unit answers,
    /// *rewrite the answer* ([`Router::from_unit`](crate::router::Router::from_unit), `rewrite_answer`) and
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
            crate::audit::digest(
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
}

/// Whether a forwarded request gets the profile's per-call deadline. The
/// process methods that wait on the process (read, write, wait) are long polls
/// by design and are bounded by the process, not by a call deadline.
fn has_deadline(method: &str) -> bool {
    !matches!(
        method,
        "agentworkspace/process.read"
            | "agentworkspace/process.write"
            | "agentworkspace/process.wait"
    )
}
