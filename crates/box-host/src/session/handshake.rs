//! Before a session is open: the handshake. No unit exists yet, so only
//! `ping` and `server/discover` are answered (a probe never starts units);
//! anything else is refused until a way in opens the session. The ways in,
//! each ending in a [`Live`] session and the answer its client gets:
//!
//! - `initialize` without `box.reattach`: a fresh session
//!   ([`Session::start`], `start.rs`), its workspace on a fork of its own
//!   when the profile says `source = "fork"` (`forks.rs`);
//! - `initialize` with `box.reattach`: a session a dead host served, whose
//!   units this host re-adopted ([`Session::reattach`], `reattach.rs`);
//! - of the stateless revision (2026-07-28, `stateless.rs`):
//!   `box/session.open` (or a `tools/call` of its tool form,
//!   `box_session_open`), a fresh session answered with its handle, and a
//!   request without a handle, which opens the session as the `initialize`
//!   its `_meta` stands for and is then routed (a retry of a call that
//!   answered "input required" is refused instead: no call waits in a
//!   session not open yet); one with a handle (over stdio, or, whatever its
//!   method, the first request of a session HTTP started to reattach it,
//!   `spawn_session_reattaching`) reattaches the session the handle names.
//!   Either way the open is within the request's own span.
//!
//! What every way in shares is read once in [`Session::open`]: the request
//! checked (-32602 naming the field), the protocol version agreed, the box
//! ask read and merged with the transport's. A refused way in is a WARN
//! line, an audit line and a count ([`crate::report_refusal`]).

use box_jsonrpc::era::is_stateless;
use box_jsonrpc::session::Inbound;
use box_jsonrpc::{
    Kind, LATEST_PROTOCOL_VERSION, ReplyTo, check_params, classify, code, error_response,
    error_response_with_data, negotiate_version, params, result_response,
};
use serde_json::Value;
use tokio::sync::mpsc;

use super::live::Live;
use super::methods::{self, Opening};
use super::{EXECUTOR_KEY, Session, drain, input, stateless, tasks};
use crate::ask::{check_initialize, merge_ask, read_ask};
use crate::audit::ClientInfo;

/// Why a session could not start: the JSON-RPC error it answers initialize with.
pub(super) struct StartError {
    pub(super) code: i64,
    pub(super) message: String,
    pub(super) data: Option<Value>,
    /// What refused it (a label of `box_sessions_refused`, from
    /// `metrics::REFUSALS`); `None` when it failed instead (its units did
    /// not start).
    pub(super) refusal: Option<&'static str>,
}

impl StartError {
    /// Refused for `reason` (from `metrics::REFUSALS`).
    pub(super) fn refused(reason: &'static str, message: String) -> Self {
        Self {
            code: code::INVALID_PARAMS,
            message,
            data: None,
            refusal: Some(reason),
        }
    }

    pub(super) fn internal(message: String) -> Self {
        Self {
            code: code::INTERNAL_ERROR,
            message,
            data: None,
            refusal: None,
        }
    }

    pub(super) fn into_response(self, id: Value) -> Value {
        match self.data {
            Some(data) => error_response_with_data(id, self.code, self.message, data),
            None => error_response(id, self.code, self.message),
        }
    }
}

/// The stateless request a session was opened for, where its answer goes,
/// and its span (the session's opening under it), served next.
pub(super) type First = (Value, ReplyTo, box_otel::Span);

/// How [`Session::open_for`] ended.
enum Opened {
    /// Open, with the request it was opened for.
    Open(Box<Live>, First),
    /// Opened as the host shut down: ended at once.
    Ended,
    /// Refused: the request was answered why.
    Refused,
}

impl Session {
    /// Answer what comes before the session is open until a way in opens
    /// it; `None` when the session ended first (its client left, it was
    /// ended, the host shut down during its start).
    /// With the session, the stateless request it was opened for, with its
    /// span (routed next, as any request of an open session).
    pub(super) async fn handshake(
        &self,
        inbound: &mut mpsc::Receiver<Inbound>,
    ) -> Option<(Live, Option<First>)> {
        let cancel = self.cancel.clone();
        let mut reattaching = self.reattaching;
        loop {
            let message = tokio::select! {
                () = cancel.cancelled() => {
                    drain(inbound, "the session was ended");
                    return None;
                }
                message = inbound.recv() => message,
            };
            match message {
                None => return None,
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
                    // The first request of a session a restarted host kept,
                    // carrying its handle: the session is reattached for it,
                    // whatever it asks, then serves it as an open session.
                    if std::mem::take(&mut reattaching)
                        && is_stateless(&message)
                        && stateless::carries_handle(&message)
                    {
                        match self.open_for(message, reply, id, &method, true).await {
                            Opened::Open(live, first) => return Some((*live, Some(first))),
                            Opened::Ended => return None,
                            Opened::Refused => continue,
                        }
                    }
                    if let Err(why) = check_params(&message) {
                        reply.answer(error_response(id, code::INVALID_PARAMS, why));
                        continue;
                    }
                    if let Some(refused) = stateless::unserved_version(&message) {
                        reply.answer(refused);
                        continue;
                    }
                    let modern = is_stateless(&message);
                    if modern && method == "server/discover" {
                        reply.answer(self.discover(id));
                        continue;
                    }
                    // The tool list of the profile it selects, when the
                    // host holds it: no unit starts for a listing.
                    if modern
                        && method == "tools/list"
                        && !stateless::carries_handle(&message)
                        && let Some(listed) = self.listed_without_unit(&message)
                    {
                        reply.answer(result_response(id, stateless::with_session_tools(listed)));
                        continue;
                    }
                    // No call waits in a session not open yet.
                    if modern && input::is_retry(&method, &message) {
                        reply.answer(input::no_call_waiting(&message));
                        continue;
                    }
                    // No task is kept in a session not open yet.
                    if modern && tasks::is_task_method(&method) {
                        reply.answer(tasks::no_session(&message));
                        continue;
                    }
                    // The tool form of box/session.open and .close.
                    let tool = if modern {
                        stateless::session_tool(&method, &message)
                    } else {
                        None
                    };
                    if tool == Some(stateless::TOOL_CLOSE) {
                        let why = format!(
                            "{}: no box session is open here to close; send it with the handle {} answered (_meta[\"{}\"], or the Box-Session header)",
                            stateless::TOOL_CLOSE,
                            stateless::TOOL_OPEN,
                            box_jsonrpc::era::SESSION_META
                        );
                        reply.answer(result_response(id, stateless::tool_error(&why)));
                        continue;
                    }
                    let (message, opening_kind) = match tool {
                        Some(_) => (stateless::open_of_tool(&message), &Opening::WayIn),
                        None => {
                            let opening = &methods::find(&method).opening;
                            (message, opening)
                        }
                    };
                    match opening_kind {
                        Opening::WayIn => {
                            // The request that opens the session is traced
                            // whole: its units' start is part of it.
                            let mut span = if self.services.tracer.is_on() {
                                self.opening_span(&message, &method, modern)
                            } else {
                                box_otel::Span::none()
                            };
                            let parent = span.context().cloned();
                            match self.open(&message, &reply.events, parent.as_ref()).await {
                                Ok((mut live, mut result)) => {
                                    self.opened.cancel();
                                    live.trace.stateless = modern;
                                    live.trace.parent = parent;
                                    if let Some(version) = self.version.get().filter(|_| !modern) {
                                        span.set("mcp.protocol.version", *version);
                                    }
                                    span.set_with("jsonrpc.request.id", || {
                                        live.redactor.text(&request_id_text(&message)).into_owned()
                                    });
                                    live.client = if modern {
                                        stateless::client_of(&message)
                                    } else {
                                        ClientInfo::of_initialize(&message)
                                    };
                                    if method == stateless::OPEN || tool.is_some() {
                                        result = self.handle_answer(&mut live, &result);
                                    }
                                    if tool.is_some() {
                                        result = stateless::tool_result(result);
                                    }
                                    reply.answer(result_response(id, result));
                                    if self.cancel.is_cancelled() {
                                        // Shutdown came during the start: end at once.
                                        self.finish(&mut live, "the host is shutting down").await;
                                        return None;
                                    }
                                    return Some((live, None));
                                }
                                Err(error) if tool.is_some() => {
                                    self.report_start_failure(&message, &error);
                                    span.set_error(&error.code.to_string());
                                    let why = error.message.replacen(
                                        stateless::OPEN,
                                        stateless::TOOL_OPEN,
                                        1,
                                    );
                                    reply.answer(result_response(id, stateless::tool_error(&why)));
                                }
                                Err(error) => {
                                    self.report_start_failure(&message, &error);
                                    span.set_error(&error.code.to_string());
                                    reply.answer(error.into_response(id));
                                }
                            }
                        }
                        // A stateless request (over stdio, one with a handle
                        // reattaches): the session opens for it, with what
                        // its transport asked.
                        Opening::Refused if modern => {
                            match self.open_for(message, reply, id, &method, false).await {
                                Opened::Open(live, first) => return Some((*live, Some(first))),
                                Opened::Ended => return None,
                                Opened::Refused => {}
                            }
                        }
                        Opening::Answer(answer) => reply.answer(answer(id)),
                        Opening::Refused => reply.answer(error_response(
                            id,
                            code::INVALID_REQUEST,
                            format!(
                                "{method}: the session is not initialized; send initialize first"
                            ),
                        )),
                    }
                }
            }
        }
    }

    /// Open the session for the stateless request `message` (`method`), as
    /// the `initialize` it stands for ([`stateless::implicit_open`]: with a
    /// handle, a reattach to the session the handle names), within the
    /// request's own span: its units' start, or `session.reattach`, is
    /// under it, and it ends with the request's answer. Opened, the request
    /// is served next ([`Opened::Open`]); refused, it is answered why.
    /// `reattaching` (`Session::reattaching`): at a shutdown during the
    /// reattach the request is left unanswered, as one the session never
    /// read, for its transport to answer.
    async fn open_for(
        &self,
        message: Value,
        reply: ReplyTo,
        id: Value,
        method: &str,
        reattaching: bool,
    ) -> Opened {
        let mut span = if self.services.tracer.is_on() {
            self.opening_span(&message, method, true)
        } else {
            box_otel::Span::none()
        };
        let parent = span.context().cloned();
        let opening = stateless::implicit_open(&message);
        match self.open(&opening, &reply.events, parent.as_ref()).await {
            Ok((mut live, result)) => {
                self.opened.cancel();
                live.trace.stateless = true;
                live.trace.parent = parent;
                live.client = stateless::client_of(&message);
                if stateless::carries_handle(&message) {
                    // Reattached: the handle's secret is the session's.
                    self.handle_answer(&mut live, &result);
                } else {
                    // Kept for a later open to name its handle (stdio).
                    live.opened = Some(result);
                }
                if self.cancel.is_cancelled() {
                    if reattaching {
                        drop(reply);
                    } else {
                        reply.answer(error_response(
                            id,
                            code::INTERNAL_ERROR,
                            "the host is shutting down",
                        ));
                    }
                    self.finish(&mut live, "the host is shutting down").await;
                    return Opened::Ended;
                }
                Opened::Open(Box::new(live), (message, reply, span))
            }
            Err(error) => {
                self.report_start_failure(&message, &error);
                span.set_error(&error.code.to_string());
                reply.answer(error.into_response(id));
                Opened::Refused
            }
        }
    }

    /// Open the session with `message` (an `initialize`): what every way in
    /// shares is read here, then the way its box ask names is taken.
    async fn open(
        &self,
        message: &Value,
        events: &mpsc::Sender<Value>,
        trace: Option<&box_otel::SpanContext>,
    ) -> Result<(Live, Value), StartError> {
        // A stateless open: its units' executors speak the handshake era's newest.
        let opening = (message.get("method").and_then(Value::as_str) == Some(stateless::OPEN))
            .then(|| stateless::initialize_params(message, true))
            .transpose()
            .map_err(|why| StartError::refused("ask", why))?;
        let version = match &opening {
            Some(_) => LATEST_PROTOCOL_VERSION,
            // Checked before anything is resolved or started: a malformed
            // initialize must not start units that then fail on it.
            None => negotiate_version(
                check_initialize(message).map_err(|why| StartError::refused("initialize", why))?,
            ),
        };
        let client_params = opening.as_ref().or_else(|| params(message));
        let ask = read_ask(client_params)
            .and_then(|ask| merge_ask(ask, &self.transport_ask))
            .map_err(|why| StartError::refused("ask", why))?;
        match ask.reattach.clone() {
            Some(reattach) => {
                // Its units may still be being re-adopted.
                self.services.reattachable.settled(&reattach.session).await;
                let mut span =
                    self.services
                        .tracer
                        .span(box_otel::SpanKind::Internal, trace, || {
                            "session.reattach".to_owned()
                        });
                let reattached = self.reattach(client_params, &ask, reattach, version).await;
                if let Err(error) = &reattached {
                    span.set_error(&error.code.to_string());
                }
                reattached
            }
            None => {
                self.start(client_params, &ask, version, events, trace)
                    .await
            }
        }
    }

    /// The span of a request that opens the session (`initialize`,
    /// `box/session.open`, a stateless request without a handle): a child of
    /// the client's `traceparent`, with the conventions' attributes.
    fn opening_span(&self, message: &Value, method: &str, stateless: bool) -> box_otel::Span {
        let target = super::live::span_target(method, message);
        let mut span = self.services.tracer.span(
            box_otel::SpanKind::Server,
            box_otel::SpanContext::from_request(message).as_ref(),
            || super::live::span_name(method, target.as_deref()),
        );
        span.set("mcp.method.name", method);
        if let Some(tool) = target.filter(|_| method == "tools/call") {
            span.set("gen_ai.tool.name", tool);
            span.set("gen_ai.operation.name", "execute_tool");
        }
        if stateless {
            span.set("mcp.protocol.version", box_jsonrpc::era::STATELESS_VERSION);
        } else {
            span.set("mcp.session.id", self.id.as_str());
        }
        span.set("jsonrpc.request.id", request_id_text(message));
        span
    }

    /// A refused `initialize` is a WARN line, an audit line and a count
    /// ([`crate::report_refusal`]); one whose units failed is a WARN line.
    fn report_start_failure(&self, message: &Value, error: &StartError) {
        let opening = message.get("method").and_then(Value::as_str) == Some(stateless::OPEN);
        // A stateless request names its client in `_meta`.
        let client = if opening || is_stateless(message) {
            stateless::client_of(message)
        } else {
            ClientInfo::of_initialize(message)
        };
        let converted = opening
            .then(|| stateless::initialize_params(message, true).ok())
            .flatten();
        let profile = read_ask(converted.as_ref().or_else(|| params(message)))
            .and_then(|ask| merge_ask(ask, &self.transport_ask))
            .ok()
            .map(|ask| {
                ask.profile
                    .unwrap_or_else(|| self.config.default_profile.clone())
            });
        match error.refusal {
            Some(reason) => crate::report_refusal(
                &self.services,
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
}

/// Whether a forwarded request gets the profile's per-call deadline. The
/// process methods that wait on the process (read, write, wait) are long polls
/// by design and are bounded by the process, not by a call deadline.
/// Sets `field` in the initialize result's box answer
/// (`capabilities.experimental[EXECUTOR_KEY].box`).
pub(super) fn set_box_field(result: &mut Value, field: &str, value: Value) {
    if let Some(answer) = result
        .pointer_mut("/capabilities/experimental")
        .and_then(|experimental| experimental.get_mut(EXECUTOR_KEY))
        .and_then(|executor| executor.get_mut("box"))
        .and_then(Value::as_object_mut)
    {
        answer.insert(field.to_owned(), value);
    }
}

/// A request's id as text for `jsonrpc.request.id` (a string as it is).
pub(super) fn request_id_text(message: &Value) -> String {
    match message.get("id") {
        Some(Value::String(id)) => id.clone(),
        Some(id) => id.to_string(),
        None => String::new(),
    }
}
