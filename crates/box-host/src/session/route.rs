//! The routing loop of an open session: what its client sends goes to the
//! unit it is for (chosen here), or is answered by the host; what its units
//! send comes back through [`Session::on_unit`] (`answer.rs`). The loop
//! also keeps the session's idle time and lifetime.

use std::time::{Duration, Instant};

use box_jsonrpc::era::is_stateless;
use box_jsonrpc::session::Inbound;
use box_jsonrpc::{
    Kind, ReplyTo, check_params, classify, code, error_response, params, params_mut,
};
use box_policy::plan::Role;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::live::{Input, Live, Rewrite, Tag, UnitEvent, send_to_unit};
use super::methods::{self, Open, Request};
use super::{Session, UNIT_META, input, named, sleep_until, stateless, tasks};
use crate::units::describe_end;

/// The most client requests one session may have in flight at once.
const MAX_IN_FLIGHT: usize = 256;
/// When the idle time has run out, how long what the client sent meanwhile
/// still counts: a host frozen past the idle time finds its clients'
/// requests waiting behind the timer (in sockets, in a transport's tasks),
/// and a session is not idle while they wait.
const IDLE_SETTLE: Duration = Duration::from_secs(1);

/// Where [`unit_for`] sends a request.
enum Route {
    /// To this unit, as rewritten.
    Unit(usize),
    /// Nowhere: the host answers with this result.
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
    /// (malformed, a probe, limits, and what the method table has the host
    /// answer: `ping`, `box/fork`, ...), *choose the unit* for the rest
    /// ([`Self::choose_unit`]), then [`Self::forward`] it.
    pub(super) fn client_request(&self, live: &mut Live, message: Value, reply: ReplyTo) {
        self.opened_request(live, message, reply, box_otel::Span::none());
    }

    /// [`Self::client_request`] for the request the session was opened
    /// for, `span` its own (its session's opening under it): continued by
    /// its forward or the host's answer, else ended with its answer,
    /// whatever answers it (a refusal too). None for any other request.
    pub(super) fn opened_request(
        &self,
        live: &mut Live,
        mut message: Value,
        reply: ReplyTo,
        span: box_otel::Span,
    ) {
        let (id, method) = match classify(&message) {
            Ok(Kind::Request { id, method }) => (id, method),
            Ok(_) | Err(_) => {
                let refused =
                    error_response(Value::Null, code::INVALID_REQUEST, "not a JSON-RPC request");
                return answer_here(reply, span, refused);
            }
        };
        if let Err(why) = check_params(&message) {
            return answer_here(reply, span, error_response(id, code::INVALID_PARAMS, why));
        }
        if let Some(refused) = stateless::unserved_version(&message) {
            return answer_here(reply, span, refused);
        }
        if method == "server/discover" && is_stateless(&message) {
            return answer_here(reply, span, self.discover(id));
        }
        let modern = is_stateless(&message);
        // Read before the host takes MCP's `_meta` off the request.
        let opted_in = modern && tasks::opted_in(&message);
        // What a stateless request carries for the host alone goes no further.
        if let Err(why) = self.check_handle(live, &mut message) {
            return answer_here(reply, span, stateless::refuse(&message, why));
        }
        let entry = methods::find(&method);
        if let Open::Probe(answer) = entry.open {
            return answer_here(reply, span, answer(id));
        }
        if live.router.in_flight() >= MAX_IN_FLIGHT {
            let refused = error_response(
                id,
                code::INTERNAL_ERROR,
                format!(
                    "{MAX_IN_FLIGHT} requests are already in flight in this session; wait for some answers"
                ),
            );
            return answer_here(reply, span, refused);
        }
        if live.router.is_in_flight(&id) {
            let refused = error_response(
                id.clone(),
                code::INVALID_REQUEST,
                format!(
                    "request id {id} is already in flight in this session; ids must not be reused"
                ),
            );
            return answer_here(reply, span, refused);
        }
        let task = opted_in && method == "tools/call" && live.handle.is_some();
        if task && let Err(why) = tasks::make_room(live) {
            return answer_here(reply, span, error_response(id, code::INTERNAL_ERROR, why));
        }
        let request = Request {
            id,
            method,
            message,
            reply,
            entry,
            modern,
            task,
            span,
        };
        if modern {
            if let Some(tool) = stateless::session_tool(&request.method, &request.message) {
                return self.session_tool_call(live, request, tool);
            }
            // The retry of a call that answered "input required" (`input.rs`).
            if input::is_retry(&request.method, &request.message) {
                return self.retry(live, request);
            }
        }
        match entry.open {
            Open::Host(handler) => {
                let mut request = request;
                let parent = self.host_request_parent(&request.message);
                request.span = self.host_request_span(live, &mut request, parent.as_ref());
                handler(self, live, request)
            }
            Open::Unit { empty } => self.choose_unit(live, request, empty),
            Open::Probe(answer) => request.reply.answer(answer(request.id)),
        }
    }

    /// Forward a request to unit `unit`: *rewrite the request* (the router's
    /// fresh id and progress token, [`Router::forward`](crate::router::Router::forward)),
    /// send it, start its deadline; when the unit answers, *rewrite the
    /// answer* ([`Router::from_unit`](crate::router::Router::from_unit),
    /// `rewrite_answer`) and *record* it ([`Self::record`]: metrics, audit).
    pub(super) fn forward(&self, live: &mut Live, request: Request, unit: usize, rewrite: Rewrite) {
        let Request {
            id,
            method,
            message: upstream,
            reply,
            entry,
            modern,
            task,
            mut span,
        } = request;

        let pending = live.units[unit]
            .draining
            .as_ref()
            .map(|end| live.redactor.text(&describe_end(end)).into_owned());
        if let Some(why) = live.units[unit].ended.as_ref().or(pending.as_ref()) {
            let text = format!("unit {} ended: {why}", live.units[unit].spec.name);
            self.services
                .metrics
                .call(entry.label(), None, "unit_ended", Duration::ZERO);
            span.set_error(&code::INTERNAL_ERROR.to_string());
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
        let audited = self.services.audit.is_some();
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
        let mut upstream = upstream;
        let span = self.request_span(live, &method, tool.as_deref(), unit, &mut upstream, span);
        let tag = Tag {
            span,
            method: method.clone(),
            label: entry.label(),
            tool,
            arguments_digest,
            started: Instant::now(),
            deadline: None,
            overdue: false,
            rewrite,
            process,
            unit_id: None,
            input: (modern && input::may_ask(&method)).then(|| Input {
                name: input::call_name(&upstream),
                waiting: None,
            }),
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
            if let Some(mut forward) = live.router.take(unit, unit_id) {
                self.record(live, unit, &mut forward.tag, "unit_unavailable");
                forward
                    .reply
                    .answer(error_response(forward.client_id, code::INTERNAL_ERROR, why));
            }
            return;
        }
        if entry.deadline {
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
        if task {
            self.start_task(live, unit, unit_id);
        }
    }

    /// The span of a request forwarded to `unit` (`host`, when it has one:
    /// the one its session was opened for, a host-answered method's), with
    /// the conventions' attributes, the client's text redacted; its context
    /// goes on to the executor in `_meta["box/traceparent"]`, the parent of
    /// the executor's spans.
    fn request_span(
        &self,
        live: &mut Live,
        method: &str,
        tool: Option<&str>,
        unit: usize,
        upstream: &mut Value,
        host: box_otel::Span,
    ) -> box_otel::Span {
        let tracer = &self.services.tracer;
        if !tracer.is_on() {
            return box_otel::Span::none();
        }
        let target = super::live::span_target(method, upstream)
            .map(|target| live.redactor.text(&target).into_owned());
        // A host-answered method's span (`servers.start`) goes on here, as
        // does the one of the request the session was opened for.
        let mut span = if host.is_recording() {
            host
        } else {
            tracer.span(
                box_otel::SpanKind::Server,
                box_otel::SpanContext::from_request(upstream).as_ref(),
                || super::live::span_name(method, target.as_deref()),
            )
        };
        span.rename(|| super::live::span_name(method, target.as_deref()));
        span.set("mcp.method.name", method);
        if let Some(tool) = tool {
            span.set("gen_ai.tool.name", live.redactor.text(tool).into_owned());
            span.set("gen_ai.operation.name", "execute_tool");
        }
        if live.trace.stateless {
            span.set("mcp.protocol.version", box_jsonrpc::era::STATELESS_VERSION);
        } else {
            span.set("mcp.session.id", self.id.as_str());
            if let Some(version) = self.version.get() {
                span.set("mcp.protocol.version", *version);
            }
        }
        let id = super::handshake::request_id_text(upstream);
        span.set("jsonrpc.request.id", live.redactor.text(&id).into_owned());
        span.set("box.unit.name", live.units[unit].spec.name.as_str());
        if let Some(context) = span.context()
            && let Some(params) = params_mut(upstream)
        {
            live.trace.executor_parents.insert(unit, context.clone());
            let meta = params
                .entry("_meta")
                .or_insert_with(|| Value::Object(serde_json::Map::new()));
            if let Some(meta) = meta.as_object_mut() {
                meta.insert(
                    box_otel::EXECUTOR_TRACEPARENT.to_owned(),
                    Value::String(context.traceparent()),
                );
            }
        }
        span
    }

    /// The context a host-answered request's span continues: the client's
    /// `traceparent`, read only when tracing.
    fn host_request_parent(&self, message: &Value) -> Option<box_otel::SpanContext> {
        if self.services.tracer.is_on() {
            box_otel::SpanContext::from_request(message)
        } else {
            None
        }
    }

    /// The span of a request the host answers itself (`ping`, a kept
    /// `tools/list`, `box/*`), by the conventions as a forwarded one's, the
    /// client's text redacted; the request's own when it has one (the
    /// session was opened for it) continues.
    pub(super) fn host_request_span(
        &self,
        live: &mut Live,
        request: &mut Request,
        parent: Option<&box_otel::SpanContext>,
    ) -> box_otel::Span {
        let tracer = &self.services.tracer;
        if !tracer.is_on() {
            return box_otel::Span::none();
        }
        let method = live.redactor.text(&request.method).into_owned();
        let opened = std::mem::take(&mut request.span);
        let mut span = if opened.is_recording() {
            opened
        } else {
            tracer.span(box_otel::SpanKind::Server, parent, || method.clone())
        };
        span.rename(|| method.clone());
        span.set("mcp.method.name", method);
        if live.trace.stateless {
            span.set("mcp.protocol.version", box_jsonrpc::era::STATELESS_VERSION);
        } else {
            span.set("mcp.session.id", self.id.as_str());
            if let Some(version) = self.version.get() {
                span.set("mcp.protocol.version", *version);
            }
        }
        let id = match &request.id {
            Value::String(id) => id.clone(),
            id => id.to_string(),
        };
        span.set("jsonrpc.request.id", live.redactor.text(&id).into_owned());
        span
    }

    /// Route a request a unit answers: to the unit it is for, or answered by
    /// the host where the host holds the answer (the tool list read at
    /// start, an empty list in a session without a workspace unit).
    /// The client's `traceparent` is read once: by the forward's span, or
    /// here for the host's answer.
    fn choose_unit(&self, live: &mut Live, mut request: Request, empty: Option<&'static str>) {
        match unit_for(live, &request.method, &mut request.message, empty) {
            Ok(Route::Unit(unit)) => self.forward(live, request, unit, Rewrite::None),
            // Answered here: its span is the host's.
            Ok(Route::Answer(result)) if self.services.tracer.is_on() => {
                let parent = self.host_request_parent(&request.message);
                request.span = self.host_request_span(live, &mut request, parent.as_ref());
                self.answer_listed(live, request, result);
            }
            Ok(Route::Answer(result)) => self.answer_listed(live, request, result),
            Err(error) => request.answer(live, Err(error)),
        }
    }

    /// Answer a list the host holds.
    fn answer_listed(&self, live: &mut Live, request: Request, result: Value) {
        // A stateless client's list has the session's own tools too.
        let result = if request.modern && request.method == "tools/list" {
            stateless::with_session_tools(result)
        } else {
            result
        };
        request.answer(live, Ok(result))
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
                    if let Some((unit, cancel, mut forward)) = live.router.client_cancel(message) {
                        self.record(live, unit, &mut forward.tag, "cancelled");
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

/// Answer a request where it stands, before it is routed: `span` (the
/// request's own when its session was opened for it) ends with the answer,
/// with its error's code.
fn answer_here(reply: ReplyTo, mut span: box_otel::Span, answer: Value) {
    if let Some(code) = answer.pointer("/error/code") {
        span.set_error(&code.to_string());
    }
    reply.answer(answer);
}

/// Which unit a request for a unit goes to (`message` rewritten for it), or
/// the answer the host holds.
fn unit_for(
    live: &Live,
    method: &str,
    message: &mut Value,
    empty: Option<&'static str>,
) -> Result<Route, (i64, String)> {
    if let Some(asked) = params(message)
        .and_then(|p| p.get("_meta"))
        .and_then(|meta| meta.get(UNIT_META))
    {
        let index = addressed_unit(live, asked)?;
        let paged = params(message).is_some_and(|p| p.contains_key("cursor"));
        if method == "tools/list"
            && !paged
            && let Some(tools) = &live.units[index].tools
        {
            return Ok(Route::Answer(tools.clone()));
        }
        return Ok(Route::Unit(index));
    }
    // `box/process.resize` (box's terminal extension) names a process as
    // the others do, so it goes where they go.
    if (method.starts_with("agentworkspace/process.") || method == "box/process.resize")
        && method != "agentworkspace/process.start"
    {
        let target = params(message)
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
            if let Some(params) = params_mut(message) {
                params.insert("id".to_owned(), json!(process));
            }
            return Ok(Route::Unit(index));
        }
    }
    match live.workspace {
        Some(index) => {
            // The tool list read at start is the session's for its whole life
            // (security case E67): a tampered executor cannot change it.
            let paged = params(message).is_some_and(|p| p.contains_key("cursor"));
            if method == "tools/list"
                && !paged
                && let Some(tools) = &live.units[index].tools
            {
                return Ok(Route::Answer(tools.clone()));
            }
            Ok(Route::Unit(index))
        }
        None => match empty {
            Some(key) => {
                let mut answer = serde_json::Map::new();
                answer.insert(key.to_owned(), json!([]));
                Ok(Route::Answer(Value::Object(answer)))
            }
            None => Err((
                code::METHOD_NOT_FOUND,
                format!(
                    "{method}: profile `{}` has no workspace unit (no file system), so nothing answers it",
                    live.plan.profile
                ),
            )),
        },
    }
}
