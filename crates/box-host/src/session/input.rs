//! MCP 2026-07-28's "input required" (MRTR) on a box session. The revision
//! has no requests from server to client: a unit's request of the client
//! (elicitation, sampling, roots) during a stateless `tools/call`,
//! `resources/read` or `prompts/get` answers that call with
//! `{resultType: "input_required", inputRequests, requestState}` while the
//! call goes on waiting in its unit; the client's retry (a new id, the same
//! call, `inputResponses` and the `requestState`) hands the unit its answers
//! and takes the call's place, so the retry's answer is the call's result,
//! or another round of input. A handshake-era call's unit requests are
//! relayed to its client as before.
//!
//! The `requestState` is the client's to hold and may come back changed: it
//! is sealed with the host's key ([`crate::request_state`]) and binds this
//! session, the call, the round and its keys for [`INPUT_TTL`]; once that
//! has run out the state is refused and the call cancelled in its unit.

use box_jsonrpc::{code, error_response, params, result_response};
use serde_json::{Map, Value, json};

use super::live::{Live, UnitEvent, Waiting, send_to_unit};
use super::methods::Request;
use super::{Session, tasks};
use crate::request_state::{self, INPUT_TTL, RequestState};

/// Whether a call of `method` may answer "input required" (the revision
/// allows it on these only).
pub(super) fn may_ask(method: &str) -> bool {
    matches!(method, "tools/call" | "resources/read" | "prompts/get")
}

/// Whether a unit's request of the client is one the revision carries as an
/// input request.
fn is_input_request(method: &str) -> bool {
    matches!(
        method,
        "elicitation/create" | "sampling/createMessage" | "roots/list"
    )
}

/// A call's name as its retry must repeat it: a tool's or prompt's name, a
/// resource's URI.
pub(super) fn call_name(message: &Value) -> String {
    params(message)
        .and_then(|params| params.get("name").or_else(|| params.get("uri")))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned()
}

/// Whether a stateless request is the retry of a call answered "input
/// required" (it carries `requestState` or `inputResponses`).
pub(super) fn is_retry(method: &str, message: &Value) -> bool {
    may_ask(method)
        && params(message).is_some_and(|params| {
            params.contains_key("requestState") || params.contains_key("inputResponses")
        })
}

/// The refusal of a retry that reaches a session not open yet: no call of
/// it can be waiting (over HTTP, a call without a handle ran in a session
/// of its own, ended with its answer).
pub(super) fn no_call_waiting(message: &Value) -> Value {
    error_response(
        message.get("id").cloned().unwrap_or(Value::Null),
        code::INVALID_PARAMS,
        "requestState: no box session is open here to continue it (a call without a handle runs in a session of its own, which ended with its answer); send a call that may need input with the handle box/session.open answered",
    )
}

impl Session {
    /// A unit's request of the client during the call `call` (its id at the
    /// unit): a stateless call's client gets it as "input required" (at
    /// once, or in the next round when the call already waits for its
    /// retry). Any other comes back, to be relayed as before.
    pub(super) fn ask_for_input(
        &self,
        live: &mut Live,
        unit: usize,
        call: u64,
        message: Value,
    ) -> Option<Value> {
        let asked = message.get("method").and_then(Value::as_str).unwrap_or("");
        if !is_input_request(asked) {
            return Some(message);
        }
        // A task's: the client reads it with tasks/get.
        if tasks::ask(live, unit, call, &message) {
            return None;
        }
        let Some(input) = live
            .router
            .tag_mut(unit, call)
            .and_then(|tag| tag.input.as_mut())
        else {
            return Some(message);
        };
        if let Some(waiting) = input.waiting.as_mut() {
            waiting.queued.push(message);
            return None;
        }
        let (client_id, reply) = live.router.park(unit, call)?;
        let answer = self.input_required(live, unit, call, client_id, vec![message]);
        reply.answer(answer);
        None
    }

    /// Answer a parked call's client (`client_id`) with a round of input:
    /// `asks`, the unit's requests, under their keys (the ids the client
    /// would answer them by), and the sealed state its retry brings back.
    fn input_required(
        &self,
        live: &mut Live,
        unit: usize,
        call: u64,
        client_id: Value,
        asks: Vec<Value>,
    ) -> Value {
        live.input_rounds += 1;
        let round = live.input_rounds;
        let mut requests = Map::new();
        let mut keys = Vec::new();
        for ask in asks {
            let Some(Value::String(key)) = ask.get("id") else {
                continue;
            };
            requests.insert(
                key.clone(),
                json!({
                    "method": ask.get("method").cloned().unwrap_or(Value::Null),
                    "params": ask.get("params").cloned().unwrap_or_else(|| json!({})),
                }),
            );
            keys.push(key.clone());
        }
        let events = live.events_tx.clone();
        let expiry = tokio::spawn(async move {
            tokio::time::sleep(INPUT_TTL).await;
            let _ = events
                .send(UnitEvent::InputExpired(unit, call, round))
                .await;
        });
        let Some(tag) = live.router.tag_mut(unit, call) else {
            expiry.abort();
            return error_response(client_id, code::INTERNAL_ERROR, "the call ended");
        };
        let state = RequestState {
            session: self.id.clone(),
            unit,
            call,
            round,
            keys: keys.clone(),
            method: tag.method.clone(),
            name: tag
                .input
                .as_ref()
                .map(|input| input.name.clone())
                .unwrap_or_default(),
            expires: request_state::now() + INPUT_TTL.as_secs(),
        };
        if let Some(input) = tag.input.as_mut() {
            input.waiting = Some(Waiting {
                round,
                keys,
                queued: Vec::new(),
                expiry: expiry.abort_handle(),
            });
        }
        result_response(
            client_id,
            json!({
                "resultType": "input_required",
                "inputRequests": requests,
                "requestState": request_state::seal(&self.services.state_key, &state),
            }),
        )
    }

    /// The retry of a call answered "input required": its state checked,
    /// the unit handed the client's answers, and the retry put in the
    /// call's place (or answered at once, with what answered the call
    /// meanwhile or with the next round of input).
    pub(super) fn retry(&self, live: &mut Live, request: Request) {
        let state = match self.check_retry(live, &request) {
            Ok(state) => state,
            Err(why) => return request.answer(live, Err((code::INVALID_PARAMS, why))),
        };
        let key = (state.unit, state.call);
        if live
            .input_answers
            .get(&key)
            .is_some_and(|(round, _)| *round == state.round)
            && let Some((_, mut response)) = live.input_answers.remove(&key)
        {
            // Answered while the client was away: the retry gets it, and
            // the unit no longer waits for the round's answers.
            for key in &state.keys {
                live.router.forget_server_request(&json!(key));
            }
            response["id"] = request.id;
            request.reply.answer(response);
            return;
        }
        let responses = params(&request.message)
            .and_then(|params| params.get("inputResponses"))
            .cloned()
            .unwrap_or_else(|| json!({}));
        for key in &state.keys {
            let answer = json!({"jsonrpc": "2.0", "id": key, "result": responses[key]});
            if let Some((to, answer)) = live.router.client_response(answer)
                && let Err(why) = send_to_unit(&live.units[to], answer)
            {
                tracing::warn!(session = %self.id, %why, "an answer to a unit's request for input was lost");
            }
        }
        let Some(waiting) = live
            .router
            .tag_mut(state.unit, state.call)
            .and_then(|tag| tag.input.as_mut())
            .and_then(|input| input.waiting.take())
        else {
            return;
        };
        waiting.expiry.abort();
        let Request {
            id, message, reply, ..
        } = request;
        let token = params(&message)
            .and_then(|params| params.get("_meta"))
            .and_then(|meta| meta.get("progressToken"))
            .cloned();
        if let Err(reply) = live
            .router
            .resume(state.unit, state.call, id.clone(), reply, token)
        {
            reply.answer(error_response(id, code::INTERNAL_ERROR, "the call ended"));
            return;
        }
        if !waiting.queued.is_empty()
            && let Some((client_id, reply)) = live.router.park(state.unit, state.call)
        {
            let answer =
                self.input_required(live, state.unit, state.call, client_id, waiting.queued);
            reply.answer(answer);
        }
    }

    /// The state a retry brings back, checked: sealed by this host, not
    /// expired, minted in this session for this call, whose round still
    /// waits (or was answered meanwhile), with an answer for each of the
    /// round's requests and nothing else. The error says which, for the
    /// client.
    fn check_retry(&self, live: &Live, request: &Request) -> Result<RequestState, String> {
        let asked = params(&request.message);
        let text = match asked.and_then(|params| params.get("requestState")) {
            Some(Value::String(text)) => text,
            Some(other) => {
                return Err(format!(
                    "requestState: must be the string an \"input required\" answer gave, got {other}"
                ));
            }
            None => {
                return Err(
                    "requestState: missing; a retry with inputResponses brings back the requestState of the answer that asked for them".to_owned(),
                );
            }
        };
        let state = request_state::open(&self.services.state_key, text, request_state::now())
            .map_err(|why| format!("requestState: refused: {why}"))?;
        if state.session != self.id {
            return Err(format!(
                "requestState: refused: it continues a call of another box session, not of session `{}`",
                self.id
            ));
        }
        let name = call_name(&request.message);
        if state.method != request.method || state.name != name {
            return Err(format!(
                "requestState: refused: it continues {} `{}`, not {} `{name}`; a retry repeats the call that asked for input",
                state.method, state.name, request.method
            ));
        }
        if live
            .input_answers
            .get(&(state.unit, state.call))
            .is_some_and(|(round, _)| *round == state.round)
        {
            return Ok(state);
        }
        let waiting = live
            .router
            .tag(state.unit, state.call)
            .and_then(|tag| tag.input.as_ref())
            .and_then(|input| input.waiting.as_ref())
            .filter(|waiting| waiting.round == state.round);
        if waiting.is_none() {
            return Err(
                "requestState: the call it continues no longer waits for this input (it was retried already, answered, cancelled, or ran past its deadline)".to_owned(),
            );
        }
        let responses = match asked.and_then(|params| params.get("inputResponses")) {
            None => Map::new(),
            Some(Value::Object(responses)) => responses.clone(),
            Some(other) => {
                return Err(format!(
                    "inputResponses: must be an object of answers by key, got {other}"
                ));
            }
        };
        if let Some(missing) = state.keys.iter().find(|key| !responses.contains_key(*key)) {
            return Err(format!(
                "inputResponses: no answer to `{missing}`; this round asks for {}",
                state.keys.join(", ")
            ));
        }
        if let Some(unknown) = responses.keys().find(|key| !state.keys.contains(key)) {
            return Err(format!(
                "inputResponses: `{unknown}` is not a request of this round, which asks for {}",
                state.keys.join(", ")
            ));
        }
        if let Some(gone) = state
            .keys
            .iter()
            .find(|key| !live.router.server_request_waits(&json!(key)))
        {
            return Err(format!(
                "inputResponses: the unit no longer waits for `{gone}`"
            ));
        }
        Ok(state)
    }

    /// A round of input outlived its state: the answer kept for it is
    /// dropped, and a call still waiting for it is cancelled in its unit.
    pub(super) fn input_expired(&self, live: &mut Live, unit: usize, call: u64, round: u64) {
        if live
            .input_answers
            .get(&(unit, call))
            .is_some_and(|(kept, _)| *kept == round)
        {
            live.input_answers.remove(&(unit, call));
        }
        let waits = live
            .router
            .tag(unit, call)
            .and_then(|tag| tag.input.as_ref())
            .and_then(|input| input.waiting.as_ref())
            .is_some_and(|waiting| waiting.round == round);
        if !waits {
            return;
        }
        let Some(mut forward) = live.router.take(unit, call) else {
            return;
        };
        if let Some(waiting) = forward
            .tag
            .input
            .as_ref()
            .and_then(|input| input.waiting.as_ref())
        {
            for key in &waiting.keys {
                live.router.forget_server_request(&json!(key));
            }
        }
        self.record(live, unit, &mut forward.tag, "cancelled");
        let cancel = box_jsonrpc::notification(
            "notifications/cancelled",
            json!({"requestId": call, "reason": "its client did not answer the request for input in time"}),
        );
        let _ = send_to_unit(&live.units[unit], cancel);
    }
}
