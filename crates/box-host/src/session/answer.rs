//! What a session's units send, on its way to the client: answers matched
//! to their requests (redacted, rewritten, recorded in the metrics and the
//! audit), requests and notifications a unit relates to a call or sends on
//! its own, a unit's end (every call in flight to it answered once with the
//! cause), and the timers of calls past their deadline.

use std::time::Duration;

use box_backend::{UnitEnd, UnitState};
use box_jsonrpc::{self as jsonrpc, code, error_response_with_data};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::live::{Live, Rewrite, Tag, UnitEvent, send_to_unit};
use super::{Session, tasks};
use crate::router::{Forward, UnitMessage, WhenFull};
use crate::units::describe_end;

/// After a unit's output closes, how long to wait for the backend to say why
/// before answering its calls with what is known.
const UNIT_END_GRACE: Duration = Duration::from_secs(2);
/// After the backend says a unit ended, how long its output still gets to be
/// read to its end (what the unit sent before it ended answers calls) before
/// its calls are answered with the end.
const UNIT_END_DRAIN: Duration = Duration::from_secs(2);
/// After a call's deadline fires, how long an answer already on its way
/// still wins over it. A host frozen past the deadline (SIGSTOP, a stalled
/// VM) runs the deadline's timer before the answer waiting in the unit's
/// pipes has crossed the tasks between (the engine's stream, a pump, the
/// reader); an answer the unit gave is the truth, a timeout is a guess.
const DEADLINE_SETTLE: Duration = Duration::from_secs(1);

impl Session {
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

    /// An executor's spans of calls it answered (`notifications/box/spans`,
    /// a batch sent after the answers): exported when each belongs under a
    /// span of a request the host sent that unit, never passed on to the
    /// client.
    pub(super) fn executor_spans(&self, live: &mut Live, unit: usize, line: &[u8]) {
        let (parents, redactor) = (&mut live.trace.executor_parents, &live.redactor);
        for span in box_otel::read_executor_spans(
            line,
            |id| parents.take(unit, id),
            |text| redactor.text(text).into_owned(),
        ) {
            self.services.tracer.record(span);
        }
    }

    pub(super) fn on_unit(&self, live: &mut Live, event: UnitEvent) {
        match event {
            UnitEvent::Spans(unit, line) => self.executor_spans(live, unit, &line),
            // Not as box's executor writes it, but its method: never the client's.
            UnitEvent::Message(unit, message) if box_otel::is_executor_spans(&message) => {
                let line = serde_json::to_vec(&message).unwrap_or_default();
                self.executor_spans(live, unit, &line);
            }
            UnitEvent::Message(unit, message) => match self
                .late_answer(live, unit, message)
                .map(|message| live.router.from_unit(unit, message))
                .unwrap_or(UnitMessage::Done)
            {
                UnitMessage::Answer {
                    mut forward,
                    mut response,
                } => {
                    let (outcome, details) = outcome_of(forward.tag.tool.as_deref(), &response);
                    self.record_answer(
                        live,
                        unit,
                        &mut forward.tag,
                        outcome,
                        details,
                        Some(&response),
                    );
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
                    deliver(live, unit, forward, response);
                }
                UnitMessage::Related {
                    stream,
                    mut message,
                    when_full,
                    during,
                } => {
                    live.redactor.unit_message(unit, &mut message);
                    // A stateless call answers with it as "input required".
                    let Some(message) = (match during {
                        Some(call) => self.ask_for_input(live, unit, call, message),
                        None => Some(message),
                    }) else {
                        return;
                    };
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
            UnitEvent::InputExpired(unit, call, round) => {
                self.input_expired(live, unit, call, round)
            }
            UnitEvent::Overdue(unit, unit_id) => {
                let Some(mut forward) = live.router.take(unit, unit_id) else {
                    return;
                };
                let timeout = live.units[unit].spec.limits.call_timeout;
                let name = live.units[unit].spec.name.clone();
                self.record(live, unit, &mut forward.tag, "timeout");
                self.tell_call_timeout(&name, &forward.tag.method, timeout);
                // Nothing confirms a cancellation (an executor answers a
                // cancelled request with nothing): the call may have run, in
                // part or in full, so its outcome is said to be unknown.
                let response = error_response_with_data(
                    forward.client_id.clone(),
                    code::REQUEST_TIMEOUT,
                    format!(
                        "unit {name}: {} did not answer within {} (the profile's call_timeout); box asked the unit to cancel it, but whether it ran, in part or in full, is unknown",
                        forward.tag.method,
                        humantime::format_duration(timeout)
                    ),
                    json!({"unit": name, "timeoutMs": timeout.as_millis() as u64, "outcome": "unknown"}),
                );
                deliver(live, unit, forward, response);
            }
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
        self.services.metrics.unit_ended();
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
        for mut forward in live.router.take_all(unit) {
            self.record(live, unit, &mut forward.tag, "unit_ended");
            let response = error_response_with_data(
                forward.client_id.clone(),
                code::INTERNAL_ERROR,
                format!(
                    "unit {name} ended: {cause}; it had not answered this {}, which may have run, in part or in full: its outcome is unknown",
                    forward.tag.method
                ),
                data.clone(),
            );
            deliver(live, unit, forward, response);
        }
    }

    /// Stop a call's timer and record it (metrics, audit).
    pub(super) fn record(&self, live: &Live, unit: usize, tag: &mut Tag, outcome: &str) {
        self.record_answer(live, unit, tag, outcome, AnswerDetails::default(), None);
    }

    /// [`Self::record`] for a call its unit answered: the audit line says
    /// what the answer said beyond its outcome.
    fn record_answer(
        &self,
        live: &Live,
        unit: usize,
        tag: &mut Tag,
        outcome: &str,
        details: AnswerDetails,
        response: Option<&Value>,
    ) {
        if tag.span.is_recording() {
            if let Some(error) = super::live::error_type(outcome, response) {
                tag.span.set_error(&error);
            }
            if let Some(status) = details.exit_status {
                tag.span.set("box.exit_status", status);
            }
            std::mem::take(&mut tag.span).end();
        }
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
            crate::metrics::tool_label(
                tool,
                live.units.get(unit).and_then(|unit| unit.tools.as_ref()),
            )
        });
        self.services
            .metrics
            .call(tag.label, tool, outcome, duration);
        if let (Some(audit), Some(tool)) = (&self.services.audit, &tag.tool) {
            audit.record(&crate::audit::Record {
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
}

/// Answer a forwarded call with `response`; a call whose client is away
/// answering its input (`input.rs`) keeps it for the retry instead, and a
/// task's call (`tasks.rs`) for its task.
fn deliver(live: &mut Live, unit: usize, forward: Forward<Tag>, mut response: Value) {
    // A task's call ends its task; its client reads the end with tasks/get.
    if let Some(call) = forward.tag.unit_id
        && tasks::finish(live, unit, call, &mut response)
    {
        return;
    }
    let waiting = forward
        .tag
        .input
        .as_ref()
        .and_then(|input| input.waiting.as_ref());
    match (waiting, forward.tag.unit_id) {
        (Some(waiting), Some(call)) => {
            live.input_answers
                .insert((unit, call), (waiting.round, response));
        }
        _ => forward.reply.answer(response),
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
