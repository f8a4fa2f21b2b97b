//! The methods box knows by name, in one table ([`METHODS`]): for each,
//! what answers it before the session is open and once it is, whether a
//! call forwarded to a unit is bounded by the profile's `call_timeout`, and
//! whether `box_calls` counts it under its own name. A method the table
//! does not name goes to the session's workspace unit, with a deadline,
//! counted as `other`.
//!
//! Adding a host-answered method is one entry here and one [`Handler`]: a
//! function of the session, its live state and the request, which answers
//! it (at once with [`Request::answer`], or from a task that holds the
//! reply) or hands it on to a unit (`Session::forward`).

use box_jsonrpc::{ReplyTo, code, discover_refusal, error_response, params, result_response};
use box_policy::plan::Role;
use serde_json::{Value, json};

use super::live::{Live, Rewrite};
use super::{Session, named};
use crate::fork;

/// One method of the table.
pub(super) struct Method {
    /// Its name on the wire.
    pub(super) name: &'static str,
    /// Before the session is open, when no unit exists yet.
    pub(super) opening: Opening,
    /// Once the session is open.
    pub(super) open: Open,
    /// A call of it forwarded to a unit is bounded by the profile's
    /// `call_timeout`. The process methods that wait on the process (`read`,
    /// `write`, `wait`) are long polls by design, bounded by the process.
    pub(super) deadline: bool,
    /// `box_calls` counts it under its own name (a bounded set of labels);
    /// any other method is counted as `other`.
    pub(super) counted: bool,
}

/// What answers a method before the session is open.
pub(super) enum Opening {
    /// Nothing: it needs the session's units ("send initialize first").
    Refused,
    /// The host, at once: the response to a request of this id.
    Answer(fn(Value) -> Value),
    /// It is a way in: the handshake opens the session with it.
    WayIn,
}

/// What answers a method once the session is open.
pub(super) enum Open {
    /// The host, at once and ahead of the session's limits (a probe): the
    /// response to a request of this id.
    Probe(fn(Value) -> Value),
    /// The host, with this handler.
    Host(Handler),
    /// A unit: the one `_meta["box/unit"]` names, a server unit for its
    /// namespaced process ids, else the workspace unit. In a session
    /// without a workspace unit, a list answers empty (`empty`: its key in
    /// the result) and anything else is -32601.
    Unit { empty: Option<&'static str> },
}

/// A host-answered method's handler: it answers the request (at once, or
/// from a task that holds the reply) or forwards it to a unit.
pub(super) type Handler = fn(&Session, &mut Live, Request);

/// The method that opens a box session as a handle (the stateless revision).
pub(super) const SESSION_OPEN: &str = "box/session.open";
/// The method that ends one.
pub(super) const SESSION_CLOSE: &str = "box/session.close";

/// A client request once the session is open, as a handler gets it.
pub(super) struct Request {
    pub(super) id: Value,
    pub(super) method: String,
    pub(super) message: Value,
    pub(super) reply: ReplyTo,
    /// Its entry in the table ([`UNKNOWN`] when the table does not name it).
    pub(super) entry: &'static Method,
    /// Of the stateless revision (2026-07-28): its `_meta` named it, before
    /// the host took what it carried for the host alone.
    pub(super) modern: bool,
    /// A stateless `tools/call` in a session opened as a handle whose
    /// request declared the tasks extension: answered with a task
    /// (`tasks.rs`) once forwarded.
    pub(super) task: bool,
    /// Its span when the host answers it (`Session::host_request_span`),
    /// or when the session was opened for it (`Session::opened_request`),
    /// ended with the answer; a forwarded request's span is made when it is
    /// forwarded, continuing this one if there is one.
    pub(super) span: box_otel::Span,
}

impl Request {
    /// Answer with `answer`: a result (redacted first: what the host answers
    /// may quote a unit, such as the tool list it read at start or a fork's
    /// end) or an error.
    pub(super) fn answer(mut self, live: &Live, answer: Result<Value, (i64, String)>) {
        let response = match answer {
            Ok(mut result) => {
                live.redactor.message(&mut result);
                result_response(self.id, result)
            }
            Err((code, text)) => {
                self.span.set_error(&code.to_string());
                error_response(self.id, code, text)
            }
        };
        self.reply.answer(response);
    }
}

/// Every method box knows by name.
pub(super) const METHODS: &[Method] = &[
    // The handshake's.
    Method {
        opening: Opening::WayIn,
        counted: true,
        ..host("initialize", initialize_again)
    },
    Method {
        opening: Opening::Answer(pong),
        counted: true,
        ..host("ping", ping)
    },
    Method {
        name: "server/discover",
        opening: Opening::Answer(discover_refusal),
        open: Open::Probe(discover_refusal),
        deadline: true,
        counted: false,
    },
    // MCP's, forwarded.
    list("tools/list", "tools"),
    unit("tools/call"),
    list("resources/list", "resources"),
    unit("resources/read"),
    list("resources/templates/list", "resourceTemplates"),
    unit("resources/subscribe"),
    unit("resources/unsubscribe"),
    list("prompts/list", "prompts"),
    unit("prompts/get"),
    unit("completion/complete"),
    unit("logging/setLevel"),
    // The executor's (dax's wire), forwarded.
    unit("execution/facts"),
    unit("execution/batch"),
    unit("agentworkspace/process.start"),
    long_poll("agentworkspace/process.write"),
    long_poll("agentworkspace/process.read"),
    unit("agentworkspace/process.closeStdin"),
    unit("agentworkspace/process.signal"),
    long_poll("agentworkspace/process.wait"),
    unit("agentworkspace/process.close"),
    // box's terminal extension: routed as the process methods are.
    Method {
        counted: false,
        ..unit("box/process.resize")
    },
    // Answered by the host from the session's units.
    Method {
        counted: true,
        ..host("agentworkspace/servers.list", servers_list)
    },
    Method {
        counted: true,
        ..host("agentworkspace/servers.start", servers_start)
    },
    // The stateless revision's box session as a handle (`stateless.rs`).
    Method {
        opening: Opening::WayIn,
        ..host(SESSION_OPEN, Session::session_open_again)
    },
    host(SESSION_CLOSE, Session::session_close),
    host("box/network.set", network_set),
    host("box/fork", Session::fork),
    host("box/merge", Session::merge),
    host("box/discard", Session::discard),
    host("box/units.stats", Session::units_stats),
    // MCP's tasks extension (`tasks.rs`).
    host("tasks/get", Session::task_get),
    host("tasks/update", Session::task_update),
    host("tasks/cancel", Session::task_cancel),
];

/// A method the table does not name: the workspace unit's, with a deadline,
/// counted as `other`.
pub(super) const UNKNOWN: Method = Method {
    counted: false,
    ..unit("")
};

/// `name`'s entry in the table, or [`UNKNOWN`].
pub(super) fn find(name: &str) -> &'static Method {
    METHODS
        .iter()
        .find(|method| method.name == name)
        .unwrap_or(&UNKNOWN)
}

impl Method {
    /// Its label in `box_calls`: its name, or `other`.
    pub(super) fn label(&self) -> &'static str {
        if self.counted { self.name } else { "other" }
    }
}

/// A method a unit answers.
const fn unit(name: &'static str) -> Method {
    Method {
        name,
        opening: Opening::Refused,
        open: Open::Unit { empty: None },
        deadline: true,
        counted: true,
    }
}

/// A list a unit answers, empty in a session without a workspace unit.
const fn list(name: &'static str, key: &'static str) -> Method {
    Method {
        open: Open::Unit { empty: Some(key) },
        ..unit(name)
    }
}

/// A process method that waits on the process: no call deadline.
const fn long_poll(name: &'static str) -> Method {
    Method {
        deadline: false,
        ..unit(name)
    }
}

/// A method the host answers once the session is open, with `handler`.
const fn host(name: &'static str, handler: Handler) -> Method {
    Method {
        name,
        opening: Opening::Refused,
        open: Open::Host(handler),
        deadline: true,
        counted: false,
    }
}

/// `ping` before the session is open.
fn pong(id: Value) -> Value {
    result_response(id, json!({}))
}

/// `ping`.
fn ping(_: &Session, live: &mut Live, request: Request) {
    request.answer(live, Ok(json!({})))
}

/// `initialize` once the session is open: refused.
fn initialize_again(_: &Session, live: &mut Live, request: Request) {
    request.answer(
        live,
        Err((
            code::INVALID_REQUEST,
            "initialize: the session is already initialized".to_owned(),
        )),
    )
}

/// `agentworkspace/servers.list`: the profile's server units, then the
/// session's forks (listed with their parent; requests reach them with
/// `_meta["box/unit"]`, not `servers.start`).
fn servers_list(_: &Session, live: &mut Live, request: Request) {
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
    request.answer(live, Ok(json!({"servers": servers})))
}

/// `agentworkspace/servers.start {name, stderr?}`: the server unit's command
/// started as a process in it (`process.start`), its process id namespaced
/// `<unit>:<id>` in the answer.
fn servers_start(session: &Session, live: &mut Live, mut request: Request) {
    let asked = params(&request.message)
        .and_then(|p| p.get("name"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let Some(name) = asked else {
        return request.answer(
            live,
            Err((
                code::INVALID_PARAMS,
                "agentworkspace/servers.start: `name` (a string) is required".to_owned(),
            )),
        );
    };
    let stderr = params(&request.message)
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
        let why = format!(
            "agentworkspace/servers.start: no server `{name}` in profile `{}`; servers: {}",
            live.plan.profile,
            named(&known)
        );
        return request.answer(live, Err((code::INVALID_PARAMS, why)));
    };
    let command = live.units[index].spec.command.clone();
    if let Some(object) = request.message.as_object_mut() {
        object.insert("method".to_owned(), json!("agentworkspace/process.start"));
        object.insert(
            "params".to_owned(),
            json!({"args": command, "stderr": stderr}),
        );
    }
    session.forward(live, request, index, Rewrite::ProcessId { unit: name });
}

/// `box/network.set {unit?, allow?}`: narrow a running egress unit's allow list,
/// or restore it up to the profile's bound; without `allow`, only say what is in
/// force. `unit` may be left out when one unit of the session has egress.
fn network_set(_: &Session, live: &mut Live, request: Request) {
    let answer = network_answer(live, &request.message);
    request.answer(live, answer)
}

/// [`network_set`]'s answer.
fn network_answer(live: &Live, message: &Value) -> Result<Value, (i64, String)> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_method_is_in_the_table_once() {
        let mut names: Vec<&str> = METHODS.iter().map(|method| method.name).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(before, names.len(), "a method named twice");
    }

    /// `box_calls`'s method labels are a bounded set: MCP's and the
    /// executor's methods by name, anything else (a client's made-up name,
    /// box's own methods) as `other`.
    #[test]
    fn call_labels_come_from_a_bounded_set() {
        assert_eq!(find("tools/call").label(), "tools/call");
        assert_eq!(find("x\"} 1\nevil 1").label(), "other");
        let counted: Vec<&str> = METHODS
            .iter()
            .filter(|method| method.counted)
            .map(|method| method.name)
            .collect();
        assert_eq!(
            counted,
            [
                "initialize",
                "ping",
                "tools/list",
                "tools/call",
                "resources/list",
                "resources/read",
                "resources/templates/list",
                "resources/subscribe",
                "resources/unsubscribe",
                "prompts/list",
                "prompts/get",
                "completion/complete",
                "logging/setLevel",
                "execution/facts",
                "execution/batch",
                "agentworkspace/process.start",
                "agentworkspace/process.write",
                "agentworkspace/process.read",
                "agentworkspace/process.closeStdin",
                "agentworkspace/process.signal",
                "agentworkspace/process.wait",
                "agentworkspace/process.close",
                "agentworkspace/servers.list",
                "agentworkspace/servers.start",
            ]
        );
    }

    #[test]
    fn only_the_process_long_polls_go_without_a_deadline() {
        let without: Vec<&str> = METHODS
            .iter()
            .filter(|method| !method.deadline)
            .map(|method| method.name)
            .collect();
        assert_eq!(
            without,
            [
                "agentworkspace/process.write",
                "agentworkspace/process.read",
                "agentworkspace/process.wait",
            ]
        );
        assert!(find("a/method/box/does/not/know").deadline);
    }
}
