//! MCP's stateless revision (2026-07-28) on a box session: `server/discover`
//! answered by the host, a session opened as a handle (`box/session.open`:
//! its id and a secret, carried on later requests as `_meta["box/session"]`
//! or, over HTTP, the `Box-Session` header) or, for a request without one,
//! opened for it (stdio: the process's session; HTTP: a session for that one
//! request, ended after it), and `box/session.close`.
//!
//! The units of a box session speak the handshake era (the host initialized
//! their executors), so what a stateless request carries for the host alone
//! (MCP's per-request `_meta`, the handle) is taken off before a unit sees
//! it, and its transport completes the answer in the revision's form
//! (`box_jsonrpc::era::complete_result`). The handle's secret is kept as its
//! SHA-256 only, and never logged, audited or counted.

use box_jsonrpc::LATEST_PROTOCOL_VERSION;
use box_jsonrpc::era::{
    META_CLIENT_CAPABILITIES, META_CLIENT_INFO, META_SERVER_INFO, SESSION_META, STATELESS_VERSION,
    all_versions, request_version, take_host_meta, unsupported_version,
};
use box_jsonrpc::{code, error_response, params, result_response};
use box_policy::plan::Role;
use serde_json::{Map, Value, json};

use super::methods::Request;
use super::{EXECUTOR_KEY, Live, Session, tasks};
use crate::ask::{merge_ask, read_ask};
use crate::audit::ClientInfo;
use crate::state;

pub(super) use super::methods::{SESSION_CLOSE as CLOSE, SESSION_OPEN as OPEN};

/// The tool form of [`OPEN`], for clients that can only call tools.
pub(super) const TOOL_OPEN: &str = "box_session_open";
/// The tool form of [`CLOSE`].
pub(super) const TOOL_CLOSE: &str = "box_session_close";

/// The tools a stateless `tools/list` lists beside the executor's: the
/// session's open and close, for clients that can only call tools.
fn session_tools() -> [Value; 2] {
    [
        json!({
            "name": TOOL_OPEN,
            "title": "Open a box session",
            "description": format!(
                "Open a box session (its units stay up between calls) and get its handle {{id, secret}}, the profile, the units' envelopes and the executor's capability. Carry the handle on every later request as _meta[\"{SESSION_META}\"] (or, over HTTP, the header Box-Session: ID:SECRET), and end the session with {TOOL_CLOSE}. Same as the method {OPEN}."
            ),
            "inputSchema": {
                "type": "object",
                "properties": {
                    "profile": {"type": "string", "description": "the profile to run under (server/discover lists them); the host's default when left out"},
                    "tighten": {"type": "object", "description": "a narrowing of the profile, as box.tighten"},
                    "maxReadBytes": {"type": "integer", "minimum": 1, "description": "the most bytes one read answers"},
                },
                "additionalProperties": false,
            },
        }),
        json!({
            "name": TOOL_CLOSE,
            "title": "Close a box session",
            "description": format!(
                "End the box session whose handle this call carries (_meta[\"{SESSION_META}\"] or the Box-Session header): its units are removed. Same as the method {CLOSE}."
            ),
            "inputSchema": {"type": "object", "properties": {}, "additionalProperties": false},
        }),
    ]
}

/// Add the session's tools ([`session_tools`]) to a stateless `tools/list`
/// answer.
pub(super) fn with_session_tools(mut listed: Value) -> Value {
    if let Some(tools) = listed.get_mut("tools").and_then(Value::as_array_mut) {
        tools.extend(session_tools());
    }
    listed
}

/// The tool a stateless `tools/call` of the session's own tools names.
pub(super) fn session_tool(method: &str, message: &Value) -> Option<&'static str> {
    if method != "tools/call" {
        return None;
    }
    let name = params(message)?.get("name")?.as_str()?;
    [TOOL_OPEN, TOOL_CLOSE]
        .into_iter()
        .find(|tool| *tool == name)
}

/// The `box/session.open` a call of [`TOOL_OPEN`] stands for: its
/// arguments as the method's params, with the call's `_meta`.
pub(super) fn open_of_tool(message: &Value) -> Value {
    let params = params(message);
    let mut opened = params
        .and_then(|params| params.get("arguments"))
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    // The handle, if any, is the method's own business: the tool opens afresh.
    opened.remove("reattach");
    if let Some(meta) = params.and_then(|params| params.get("_meta")) {
        opened.insert("_meta".to_owned(), meta.clone());
    }
    json!({
        "jsonrpc": "2.0",
        "id": message.get("id").cloned().unwrap_or(Value::Null),
        "method": OPEN,
        "params": opened,
    })
}

/// A tool's result: `answer` as structured content and as its JSON text
/// (the text for clients that read only that).
pub(super) fn tool_result(mut answer: Value) -> Value {
    if let Some(answer) = answer.as_object_mut() {
        answer.remove("resultType");
        answer.remove("_meta");
    }
    json!({
        "content": [{"type": "text", "text": answer.to_string()}],
        "structuredContent": answer,
        "isError": false,
    })
}

/// A tool's error result, saying why (a tool-calling client reads it as the
/// tool's answer).
pub(super) fn tool_error(why: &str) -> Value {
    json!({"content": [{"type": "text", "text": why}], "isError": true})
}

impl Session {
    /// `server/discover` of the stateless revision: what this host serves,
    /// the profiles it offers and how to open a session. No unit starts.
    pub(super) fn discover(&self, id: Value) -> Value {
        let profiles: Vec<String> = self
            .config
            .catalog
            .list()
            .into_iter()
            .filter(|listed| !listed.hidden)
            .map(|listed| listed.name)
            .collect();
        result_response(
            id,
            json!({
                "supportedVersions": all_versions(),
                "capabilities": {
                    "tools": {"listChanged": false},
                    "resources": {"listChanged": false},
                    "extensions": {
                        EXECUTOR_KEY: {
                            "version": 1,
                            "box": {
                                "profiles": profiles,
                                "defaultProfile": self.config.default_profile,
                                "session": {
                                    "open": OPEN,
                                    "close": CLOSE,
                                    "params": ["profile", "tighten", "maxReadBytes", "reattach"],
                                    "handle": {"meta": SESSION_META, "header": "Box-Session"},
                                },
                            },
                        },
                        // A tools/call that declares it, in a session opened as a handle.
                        tasks::EXTENSION: {},
                    },
                },
                "instructions": format!(
                    "box runs tool calls in isolated units. Open a session with {OPEN} {{profile?, tighten?, maxReadBytes?}} (profiles: {}), carry its {{id, secret}} as _meta[\"{SESSION_META}\"] (or, over HTTP, the Box-Session header ID:SECRET) on every request, and end it with {CLOSE}. The executor's capability (tools, files, limits) and the units' envelopes come with the open's answer.",
                    profiles.join(", ")
                ),
                "resultType": "complete",
                "ttlMs": 0,
                "cacheScope": "public",
                "_meta": {META_SERVER_INFO: {"name": "box", "version": env!("CARGO_PKG_VERSION")}},
            }),
        )
    }

    /// The answer to a stateless `tools/list` without a handle, when the
    /// host holds it for the plan the request selects (its profile and
    /// tightening, as the transport asked): an empty list for a plan
    /// without a workspace unit, else the list a workspace unit of the same
    /// plan read at start on this host. `None`: a unit must be started.
    pub(super) fn listed_without_unit(&self, message: &Value) -> Option<Value> {
        if params(message).is_some_and(|params| params.contains_key("cursor")) {
            return None;
        }
        let asked = initialize_params(message, false).ok()?;
        let ask = read_ask(Some(&asked))
            .and_then(|ask| merge_ask(ask, &self.transport_ask))
            .ok()?;
        if ask.reattach.is_some() {
            return None;
        }
        // A plan refused here is refused again, and reported, by the open.
        let (_, plan) = self.plan_for(&ask).ok()?;
        if !plan.units.iter().any(|unit| unit.role == Role::Workspace) {
            return Some(json!({"tools": []}));
        }
        self.services.tool_lists.get(&plan, ask.max_read_bytes)
    }

    /// The answer to `box/session.open`, from the session's initialize-form
    /// answer: the handle (`id`, `secret`: the reattach secret when the
    /// session's identity is kept, so one secret serves both), the profile,
    /// the units' envelopes and the workspace executor's capability. The
    /// session keeps the secret's digest to check each later request.
    pub(super) fn handle_answer(&self, live: &mut Live, initialized: &Value) -> Value {
        let executor = initialized
            .pointer("/capabilities/experimental")
            .and_then(|experimental| experimental.get(EXECUTOR_KEY))
            .cloned()
            .unwrap_or_else(|| json!({"version": 1}));
        let mut executor = executor.as_object().cloned().unwrap_or_default();
        let answer = executor.remove("box").unwrap_or_else(|| json!({}));
        let kept = answer
            .pointer("/session/secret")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let secret = match kept {
            Some(secret) => secret,
            None => state::new_secret().0,
        };
        live.handle = Some(state::secret_digest(&secret));
        json!({
            "id": self.id,
            "secret": secret,
            "profile": answer.get("profile").cloned().unwrap_or(Value::Null),
            "units": answer.get("units").cloned().unwrap_or_else(|| json!([])),
            "fork": answer.get("fork").cloned(),
            "executor": Value::Object(executor),
            "tools": initialized.pointer("/capabilities/tools").cloned(),
            "resultType": "complete",
            "_meta": {META_SERVER_INFO: {"name": "box", "version": env!("CARGO_PKG_VERSION")}},
        })
    }

    /// Check the handle a request carries against this session, and take
    /// off what the host alone reads before a unit sees it. A request
    /// without a handle passes (stdio's one session; HTTP routes by handle
    /// before a session sees a request).
    pub(super) fn check_handle(&self, live: &Live, message: &mut Value) -> Result<(), String> {
        let Some(handle) = take_host_meta(message) else {
            return Ok(());
        };
        let (id, secret) = read_handle(&handle)?;
        if id != self.id {
            return Err(format!(
                "_meta[\"{SESSION_META}\"].id: `{id}` is not this session; send each request with the handle box/session.open answered"
            ));
        }
        match &live.handle {
            Some(digest) if state::secret_matches(secret, digest) => Ok(()),
            Some(_) => Err(format!(
                "_meta[\"{SESSION_META}\"].secret: not the secret of session `{id}`"
            )),
            None => Err(format!(
                "_meta[\"{SESSION_META}\"]: session `{id}` was not opened with {OPEN}, so it has no handle; send its requests without one"
            )),
        }
    }
}

/// A handle's `{id, secret}`; the error names the field.
fn read_handle(handle: &Value) -> Result<(&str, &str), String> {
    let field = |name: &str| {
        handle
            .get(name)
            .and_then(Value::as_str)
            .filter(|text| !text.is_empty())
            .ok_or_else(|| {
                format!(
                    "_meta[\"{SESSION_META}\"].{name}: must be a non-empty string (from the {OPEN} answer), got {}",
                    handle.get(name).map_or_else(|| "nothing".to_owned(), Value::to_string)
                )
            })
    };
    Ok((field("id")?, field("secret")?))
}

/// The params of the `initialize` a stateless request stands for: what the
/// request's `_meta` says per request (the client's capabilities, its
/// name), at the handshake era's newest version (the one its units'
/// executors are initialized at), with its progress token. For
/// `box/session.open {profile?, tighten?, maxReadBytes?}` (`explicit`) the
/// box ask is its params (an unknown one refused), else the capability ask
/// the client's per-request capabilities carry, so either is read and
/// checked as a capability ask at initialize is.
pub(super) fn initialize_params(
    message: &Value,
    explicit: bool,
) -> Result<Map<String, Value>, String> {
    let asked = params(message).cloned().unwrap_or_default();
    let meta = asked
        .get("_meta")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let mut capabilities = match meta.get(META_CLIENT_CAPABILITIES) {
        Some(Value::Object(capabilities)) => capabilities.clone(),
        _ => Map::new(),
    };
    if explicit {
        if let Some(unknown) = asked.keys().find(|key| {
            !["profile", "tighten", "maxReadBytes", "reattach", "_meta"].contains(&key.as_str())
        }) {
            return Err(format!(
                "{OPEN}: unknown parameter `{unknown}`; it takes profile, tighten, maxReadBytes and reattach"
            ));
        }
        let mut executor = Map::new();
        if let Some(bytes) = asked.get("maxReadBytes") {
            executor.insert("maxReadBytes".to_owned(), bytes.clone());
        }
        let mut ask_box = Map::new();
        for key in ["profile", "tighten", "reattach"] {
            if let Some(value) = asked.get(key) {
                ask_box.insert(key.to_owned(), value.clone());
            }
        }
        executor.insert("box".to_owned(), Value::Object(ask_box));
        let experimental = capabilities
            .entry("experimental")
            .or_insert_with(|| json!({}));
        if let Some(experimental) = experimental.as_object_mut() {
            experimental.insert(EXECUTOR_KEY.to_owned(), Value::Object(executor));
        }
    }
    let mut converted = Map::new();
    converted.insert("protocolVersion".to_owned(), json!(LATEST_PROTOCOL_VERSION));
    converted.insert("capabilities".to_owned(), Value::Object(capabilities));
    converted.insert(
        "clientInfo".to_owned(),
        meta.get(META_CLIENT_INFO)
            .filter(|info| info.is_object())
            .cloned()
            .unwrap_or_else(|| json!({"name": "stateless client", "version": "0"})),
    );
    if let Some(token) = meta.get("progressToken") {
        converted.insert("_meta".to_owned(), json!({"progressToken": token}));
    }
    Ok(converted)
}

/// The `initialize` a stateless request opens its session with when the
/// session is not open yet ([`initialize_params`]; the transport's ask
/// merged in as for any): without a handle a fresh session; with one, a
/// reattach to the session the handle names (its host restarted, and this
/// one kept its identity with `--state`), its secret the reattach secret.
pub(super) fn implicit_open(message: &Value) -> Value {
    let mut params = initialize_params(message, false).unwrap_or_default();
    let handle = box_jsonrpc::params(message)
        .and_then(|params| params.get("_meta"))
        .and_then(|meta| meta.get(SESSION_META));
    if let Some(handle) = handle {
        let reattach = json!({
            "session": handle.get("id").cloned().unwrap_or(Value::Null),
            "secret": handle.get("secret").cloned().unwrap_or(Value::Null),
        });
        let experimental = params
            .entry("capabilities")
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .map(|capabilities| {
                capabilities
                    .entry("experimental")
                    .or_insert_with(|| json!({}))
            });
        if let Some(experimental) = experimental.and_then(Value::as_object_mut) {
            experimental.insert(
                EXECUTOR_KEY.to_owned(),
                json!({"box": {"reattach": reattach}}),
            );
        }
    }
    json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params})
}

/// Whether a request carries a handle (`_meta["box/session"]`).
pub(super) fn carries_handle(message: &Value) -> bool {
    params(message)
        .and_then(|params| params.get("_meta"))
        .is_some_and(|meta| meta.get(SESSION_META).is_some())
}

/// The client a stateless request names in its `_meta`.
pub(super) fn client_of(message: &Value) -> Option<ClientInfo> {
    let info = params(message)?.get("_meta")?.get(META_CLIENT_INFO)?;
    ClientInfo::of_initialize(&json!({"params": {"clientInfo": info}}))
}

// The handlers are the session's own (as the forks' are), so the method
// table names `Session` and never this module: no import loop.
impl Session {
    /// `box/session.close`: answered, then the session ends (its units removed).
    pub(super) fn session_close(&self, live: &mut Live, request: Request) {
        request.answer(live, Ok(json!({})));
        self.cancel.cancel();
    }

    /// A call of the session's own tools once the session is open:
    /// [`TOOL_CLOSE`] ends it as [`CLOSE`] does, [`TOOL_OPEN`] answers as
    /// [`OPEN`] does then ([`Self::session_open_again`]).
    pub(super) fn session_tool_call(&self, live: &mut Live, request: Request, tool: &str) {
        if tool == TOOL_CLOSE {
            let closed = json!({"closed": self.id});
            request.answer(live, Ok(tool_result(closed)));
            self.cancel.cancel();
            return;
        }
        let asked = params(&request.message)
            .and_then(|params| params.get("arguments"))
            .cloned()
            .unwrap_or_else(|| json!({}));
        let answer = match self.open_again(live, &asked) {
            Ok(answer) => tool_result(answer),
            Err(why) => tool_error(&why.replacen(OPEN, TOOL_OPEN, 1)),
        };
        request.answer(live, Ok(answer))
    }

    /// `box/session.open` once the session is open: the handle of a session
    /// a request without one opened (stdio's one session, opened by the
    /// client's first request), else refused.
    pub(super) fn session_open_again(&self, live: &mut Live, request: Request) {
        let asked = params(&request.message)
            .map(|params| Value::Object(params.clone()))
            .unwrap_or_else(|| json!({}));
        let answer = self
            .open_again(live, &asked)
            .map_err(|why| (code::INVALID_REQUEST, why));
        request.answer(live, answer)
    }

    /// [`Self::session_open_again`]'s answer: the open session's handle
    /// when it has none yet and `asked` (the open's params) asks for
    /// nothing it was not opened with.
    fn open_again(&self, live: &mut Live, asked: &Value) -> Result<Value, String> {
        let refused = || {
            format!(
                "{OPEN}: session `{}` is already open (this request carried its handle, or came over stdio, whose one session it is); open another without a handle over HTTP, or start another box serve",
                self.id
            )
        };
        if live.handle.is_some() {
            return Err(refused());
        }
        if let Some(unknown) = asked.as_object().and_then(|asked| {
            asked.keys().find(|key| {
                !["profile", "tighten", "maxReadBytes", "reattach", "_meta"].contains(&key.as_str())
            })
        }) {
            return Err(format!(
                "{OPEN}: unknown parameter `{unknown}`; it takes profile, tighten, maxReadBytes and reattach"
            ));
        }
        let Some(opened) = live.opened.clone() else {
            return Err(refused());
        };
        if let Some(profile) = asked.get("profile")
            && profile.as_str() != Some(live.plan.profile.as_str())
        {
            return Err(format!(
                "{OPEN}: session `{}` is already open with profile `{}` (this process's one session, opened by its first request), not {profile}",
                self.id, live.plan.profile
            ));
        }
        if let Some(other) = ["tighten", "maxReadBytes", "reattach"]
            .into_iter()
            .find(|key| asked.get(key).is_some())
        {
            return Err(format!(
                "{OPEN}: session `{}` is already open (this process's one session, opened by its first request), so `{other}` cannot change it; ask for it with the first request, or start another box serve",
                self.id
            ));
        }
        Ok(self.handle_answer(live, &opened))
    }
}

/// The -32022 answer to a request naming in `_meta` a version box does not
/// serve; `None` for one of the handshake era or the stateless revision.
pub(super) fn unserved_version(message: &Value) -> Option<Value> {
    let version = request_version(message)?;
    (version != STATELESS_VERSION)
        .then(|| unsupported_version(message.get("id").cloned().unwrap_or(Value::Null), version))
}

/// An error answer to a stateless request the session refused.
pub(super) fn refuse(message: &Value, why: String) -> Value {
    let id = message.get("id").cloned().unwrap_or(Value::Null);
    error_response(id, code::INVALID_PARAMS, why)
}
