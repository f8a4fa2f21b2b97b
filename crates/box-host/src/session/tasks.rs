//! MCP 2026-07-28's tasks extension (`io.modelcontextprotocol/tasks`) on a
//! box session opened as a handle. A stateless `tools/call` whose request
//! declares the extension in its per-request client capabilities is
//! answered at once with a task (`resultType: "task"`, its id and status)
//! while the call runs on in its unit; the client polls `tasks/get`
//! (working, input required, then completed with the call's result or
//! failed with its JSON-RPC error, redacted as every unit answer is),
//! answers what the unit asks of it with `tasks/update`, and ends it with
//! `tasks/cancel` (the unit is told `notifications/cancelled`).
//!
//! A task is the session's: its id (128 random bits) is known to no other
//! session, and it ends with the session (it does not survive a reattach).
//! The call keeps the profile's `call_timeout`: a task is a way to wait for
//! a long call, not a way around its bound. A session keeps at most
//! [`MAX_TASKS`]; an ended task whose result was read, or a cancelled one,
//! makes room for a new one.

use std::time::SystemTime;

use box_jsonrpc::era::{META_CLIENT_CAPABILITIES, complete_result};
use box_jsonrpc::{code, error_response, params, result_response};
use serde_json::{Map, Value, json};

use super::Session;
use super::live::{Live, McpTask, TaskState, send_to_unit};
use super::methods::Request;
use crate::state;

/// The extension's id, in a request's client capabilities and in
/// `server/discover`'s.
pub(super) const EXTENSION: &str = "io.modelcontextprotocol/tasks";
/// The most tasks one session keeps.
pub(super) const MAX_TASKS: usize = 64;
/// How often a client is asked to poll.
const POLL_INTERVAL_MS: u64 = 1000;

impl McpTask {
    fn ended(&self) -> bool {
        !matches!(self.state, TaskState::Working)
    }

    /// Whether it may make room for another: cancelled (the client need
    /// not poll it again), or ended and read.
    fn spent(&self) -> bool {
        matches!(self.state, TaskState::Cancelled) || (self.ended() && self.read)
    }

    /// It as the extension's `Task` (with `result`, `error` or
    /// `inputRequests` as its status has them).
    fn describe(&self) -> Value {
        let status = match &self.state {
            TaskState::Working if self.asks.is_empty() => "working",
            TaskState::Working => "input_required",
            TaskState::Completed(_) => "completed",
            TaskState::Failed(_) => "failed",
            TaskState::Cancelled => "cancelled",
        };
        let mut task = json!({
            "taskId": self.id,
            "status": status,
            "createdAt": humantime::format_rfc3339_millis(self.created).to_string(),
            "lastUpdatedAt": humantime::format_rfc3339_millis(self.updated).to_string(),
            // Kept until the session ends (or it makes room for another).
            "ttlMs": null,
            "pollIntervalMs": POLL_INTERVAL_MS,
        });
        match &self.state {
            TaskState::Working if !self.asks.is_empty() => {
                task["inputRequests"] = Value::Object(self.asks.clone());
            }
            TaskState::Completed(result) => task["result"] = result.clone(),
            TaskState::Failed(error) => {
                task["statusMessage"] = error.get("message").cloned().unwrap_or(Value::Null);
                task["error"] = error.clone();
            }
            TaskState::Cancelled => task["statusMessage"] = json!("cancelled with tasks/cancel"),
            TaskState::Working => {}
        }
        task
    }
}

/// Whether a stateless request declares the extension in its per-request
/// client capabilities (read before the host takes MCP's `_meta` off).
pub(super) fn opted_in(message: &Value) -> bool {
    params(message)
        .and_then(|params| params.get("_meta"))
        .and_then(|meta| meta.get(META_CLIENT_CAPABILITIES))
        .and_then(|capabilities| capabilities.get("extensions"))
        .is_some_and(|extensions| extensions.get(EXTENSION).is_some())
}

/// Whether `method` is one of the extension's.
pub(super) fn is_task_method(method: &str) -> bool {
    matches!(method, "tasks/get" | "tasks/update" | "tasks/cancel")
}

/// The refusal of a task method that reaches a session not open yet: no
/// task can be there (a task lives in the session whose handle made it).
pub(super) fn no_session(message: &Value) -> Value {
    let method = message.get("method").and_then(Value::as_str).unwrap_or("");
    error_response(
        message.get("id").cloned().unwrap_or(Value::Null),
        code::INVALID_PARAMS,
        format!(
            "{method}: no box session is open here, so it has no tasks; send it with the handle of the session whose tools/call made the task"
        ),
    )
}

/// Make room for one more task: drop the oldest spent one when the session
/// keeps [`MAX_TASKS`]. The error says why none can be dropped.
pub(super) fn make_room(live: &mut Live) -> Result<(), String> {
    if live.mcp_tasks.len() < MAX_TASKS {
        return Ok(());
    }
    let Some(index) = live.mcp_tasks.iter().position(McpTask::spent) else {
        return Err(format!(
            "tools/call: this session keeps at most {MAX_TASKS} tasks, and none has ended and been read or was cancelled; read an ended task with tasks/get or cancel one with tasks/cancel first"
        ));
    };
    live.mcp_tasks.remove(index);
    Ok(())
}

/// A unit's answer to call `call`, when that call is a task's: the task
/// ends with it (`true`), else `false` (it goes to its client).
pub(super) fn finish(live: &mut Live, unit: usize, call: u64, response: &mut Value) -> bool {
    let Some(task) = live
        .mcp_tasks
        .iter_mut()
        .find(|task| task.unit == unit && task.call == call && !task.ended())
    else {
        return false;
    };
    for key in std::mem::take(&mut task.asks).keys() {
        live.router.forget_server_request(&json!(key));
    }
    task.state = match response.get("error") {
        Some(error) => TaskState::Failed(error.clone()),
        None => {
            complete_result("tools/call", response);
            TaskState::Completed(response.get("result").cloned().unwrap_or_else(|| json!({})))
        }
    };
    task.updated = SystemTime::now();
    true
}

/// A unit's request of the client during call `call`, when that call is a
/// task's: kept as the task's input request (`true`), for the client to
/// read with `tasks/get` and answer with `tasks/update`.
pub(super) fn ask(live: &mut Live, unit: usize, call: u64, message: &Value) -> bool {
    let Some(task) = live
        .mcp_tasks
        .iter_mut()
        .find(|task| task.unit == unit && task.call == call && !task.ended())
    else {
        return false;
    };
    let Some(Value::String(key)) = message.get("id") else {
        return false;
    };
    task.asks.insert(
        key.clone(),
        json!({
            "method": message.get("method").cloned().unwrap_or(Value::Null),
            "params": message.get("params").cloned().unwrap_or_else(|| json!({})),
        }),
    );
    task.updated = SystemTime::now();
    true
}

/// The `taskId` a task method names; the error names the field.
fn task_id<'a>(method: &str, message: &'a Value) -> Result<&'a str, (i64, String)> {
    params(message)
        .and_then(|params| params.get("taskId"))
        .and_then(Value::as_str)
        .ok_or_else(|| {
            (
                code::INVALID_PARAMS,
                format!("{method}: `taskId` (a string, from the tools/call that made the task) is required"),
            )
        })
}

/// The index of the task `message` names in this session.
fn find(live: &Live, method: &str, message: &Value) -> Result<usize, (i64, String)> {
    let id = task_id(method, message)?;
    live.mcp_tasks
        .iter()
        .position(|task| task.id == id)
        .ok_or_else(|| {
            (
                code::INVALID_PARAMS,
                format!(
                    "{method}: no task `{id}` in this session (a task is known only to the session that made it, while that session lasts and it is kept)"
                ),
            )
        })
}

// The handlers are the session's own, so the method table names `Session`
// and never this module.
impl Session {
    /// Make call `call`, just forwarded to `unit`, a task: its client is
    /// answered at once with it, and the call runs on.
    pub(super) fn start_task(&self, live: &mut Live, unit: usize, call: u64) {
        let Some((client_id, reply)) = live.router.park(unit, call) else {
            return;
        };
        let now = SystemTime::now();
        let task = McpTask {
            id: format!("task-{}", state::new_secret().0),
            unit,
            call,
            state: TaskState::Working,
            created: now,
            updated: now,
            asks: Map::new(),
            read: false,
        };
        let mut created = task.describe();
        created["resultType"] = json!("task");
        live.mcp_tasks.push(task);
        reply.answer(result_response(client_id, created));
    }

    /// `tasks/get {taskId}`: the task as it stands.
    pub(super) fn task_get(&self, live: &mut Live, request: Request) {
        let answer = find(live, &request.method, &request.message).map(|index| {
            let task = &mut live.mcp_tasks[index];
            if task.ended() {
                task.read = true;
            }
            task.describe()
        });
        request.answer(live, answer)
    }

    /// `tasks/update {taskId, inputResponses}`: each answer to a request
    /// the task's unit still waits for goes to it; the others are ignored,
    /// as the extension says.
    pub(super) fn task_update(&self, live: &mut Live, request: Request) {
        let index = match find(live, &request.method, &request.message) {
            Ok(index) => index,
            Err(error) => return request.answer(live, Err(error)),
        };
        let responses = match params(&request.message).and_then(|p| p.get("inputResponses")) {
            Some(Value::Object(responses)) => responses.clone(),
            other => {
                let got = other.map_or_else(|| "nothing".to_owned(), Value::to_string);
                return request.answer(
                    live,
                    Err((
                        code::INVALID_PARAMS,
                        format!("tasks/update: `inputResponses` must be an object of answers by key, got {got}"),
                    )),
                );
            }
        };
        let task = &mut live.mcp_tasks[index];
        let mut answers = Vec::new();
        for (key, response) in responses {
            if task.asks.remove(&key).is_some() {
                answers.push(json!({"jsonrpc": "2.0", "id": key, "result": response}));
            }
        }
        if !answers.is_empty() {
            task.updated = SystemTime::now();
        }
        for answer in answers {
            if let Some((to, answer)) = live.router.client_response(answer)
                && let Err(why) = send_to_unit(&live.units[to], answer)
            {
                tracing::warn!(session = %self.id, %why, "an answer to a task's request for input was lost");
            }
        }
        request.answer(live, Ok(json!({})))
    }

    /// `tasks/cancel {taskId}`: a working task's call is cancelled in its
    /// unit and the task is cancelled; an ended one stays as it ended.
    pub(super) fn task_cancel(&self, live: &mut Live, request: Request) {
        let index = match find(live, &request.method, &request.message) {
            Ok(index) => index,
            Err(error) => return request.answer(live, Err(error)),
        };
        let task = &mut live.mcp_tasks[index];
        if !task.ended() {
            let (unit, call) = (task.unit, task.call);
            task.state = TaskState::Cancelled;
            task.updated = SystemTime::now();
            let asks = std::mem::take(&mut task.asks);
            for key in asks.keys() {
                live.router.forget_server_request(&json!(key));
            }
            if let Some(mut forward) = live.router.take(unit, call) {
                self.record(live, unit, &mut forward.tag, "cancelled");
                let cancel = box_jsonrpc::notification(
                    "notifications/cancelled",
                    json!({"requestId": call, "reason": "its task was cancelled with tasks/cancel"}),
                );
                let _ = send_to_unit(&live.units[unit], cancel);
            }
        }
        request.answer(live, Ok(json!({})))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_opt_in_is_the_extension_in_the_requests_capabilities() {
        let with = |capabilities: Value| {
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "x", "_meta": {META_CLIENT_CAPABILITIES: capabilities}}})
        };
        assert!(opted_in(&with(json!({"extensions": {EXTENSION: {}}}))));
        assert!(!opted_in(&with(json!({"extensions": {}}))));
        assert!(!opted_in(&with(json!({"tasks": {}}))));
        assert!(!opted_in(&json!({"method": "tools/call", "params": {}})));
    }
}
