//! The box ask and the box answer at `initialize`: what a client asks under
//! the executor capability key (`maxReadBytes`, `box: {profile, tighten}`),
//! what each unit's executor is initialized with, and the initialize result
//! the client gets (the workspace unit's, plus the envelopes). Pure functions
//! over raw JSON.

use serde_json::{Map, Value, json};

use super::units::ExecutorStart;
use box_backend::Envelope;
use box_jsonrpc::{LATEST_PROTOCOL_VERSION, PROTOCOL_VERSIONS, json_type};
use box_policy::plan::Plan;

pub use box_jsonrpc::EXECUTOR_KEY;

/// What the client asked under the executor key.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Ask {
    /// `maxReadBytes`: the session's read limit, passed on to each executor.
    pub max_read_bytes: Option<u64>,
    /// `box.profile`: the profile to resolve (the host's default when absent).
    pub profile: Option<String>,
    /// `box.tighten`: the tightenings, as sent (`null` for none).
    pub tighten: Value,
}

/// Read the client's ask from initialize's params; the error names the field.
pub(super) fn read_ask(params: Option<&Map<String, Value>>) -> Result<Ask, String> {
    let Some(ask) = params
        .and_then(|params| params.get("capabilities"))
        .and_then(|capabilities| capabilities.get("experimental"))
        .and_then(|experimental| experimental.get(EXECUTOR_KEY))
    else {
        return Ok(Ask::default());
    };
    let field = format!("capabilities.experimental[\"{EXECUTOR_KEY}\"]");
    let Some(ask) = ask.as_object() else {
        return Err(format!("{field}: must be an object"));
    };
    let max_read_bytes = match ask.get("maxReadBytes") {
        None | Some(Value::Null) => None,
        Some(value) => Some(value.as_u64().ok_or_else(|| {
            format!("{field}.maxReadBytes: must be a non-negative integer, got {value}")
        })?),
    };
    let (profile, tighten) = match ask.get("box") {
        None | Some(Value::Null) => (None, Value::Null),
        Some(Value::Object(ask_box)) => {
            let profile = match ask_box.get("profile") {
                None | Some(Value::Null) => None,
                Some(Value::String(name)) => Some(name.clone()),
                Some(other) => {
                    return Err(format!(
                        "{field}.box.profile: must be a string, got {other}"
                    ));
                }
            };
            (
                profile,
                ask_box.get("tighten").cloned().unwrap_or(Value::Null),
            )
        }
        Some(other) => return Err(format!("{field}.box: must be an object, got {other}")),
    };
    Ok(Ask {
        max_read_bytes,
        profile,
        tighten,
    })
}

/// Check an `initialize` request before anything is resolved or started:
/// `params` is an object with `protocolVersion` (a string), `clientInfo`
/// (`name` and `version`, strings) and, when present, `capabilities` (an
/// object; absent means none). The error names the field and is answered with
/// -32602. Returns the version the client asked for.
pub(super) fn check_initialize(message: &Value) -> Result<&str, String> {
    let params = match message.get("params") {
        None | Some(Value::Null) => {
            return Err(
                "params: missing; initialize needs {protocolVersion, capabilities, clientInfo}"
                    .to_owned(),
            );
        }
        Some(Value::Object(params)) => params,
        Some(other) => {
            return Err(format!(
                "params: must be an object, got {}",
                json_type(other)
            ));
        }
    };
    let requested = match params.get("protocolVersion") {
        Some(Value::String(version)) => version.as_str(),
        None => {
            return Err(format!(
                "params.protocolVersion: missing; send the newest version the client speaks (box speaks {})",
                PROTOCOL_VERSIONS.join(", ")
            ));
        }
        Some(other) => {
            return Err(format!(
                "params.protocolVersion: must be a string such as \"{LATEST_PROTOCOL_VERSION}\", got {}",
                json_type(other)
            ));
        }
    };
    match params.get("capabilities") {
        None | Some(Value::Object(_)) => {}
        Some(other) => {
            return Err(format!(
                "params.capabilities: must be an object, got {}",
                json_type(other)
            ));
        }
    }
    let client_info = match params.get("clientInfo") {
        Some(Value::Object(client_info)) => client_info,
        None => {
            return Err(
                "params.clientInfo: missing; send {\"name\": ..., \"version\": ...}".to_owned(),
            );
        }
        Some(other) => {
            return Err(format!(
                "params.clientInfo: must be an object with name and version, got {}",
                json_type(other)
            ));
        }
    };
    for field in ["name", "version"] {
        match client_info.get(field) {
            Some(Value::String(_)) => {}
            None => {
                return Err(format!(
                    "params.clientInfo.{field}: missing; a string is required"
                ));
            }
            Some(other) => {
                return Err(format!(
                    "params.clientInfo.{field}: must be a string, got {}",
                    json_type(other)
                ));
            }
        }
    }
    Ok(requested)
}

/// The params a unit's executor is initialized with: the client's own (checked
/// by [`check_initialize`]) at the session's negotiated `version`, its executor
/// ask reduced to `maxReadBytes` (the box ask is the host's business).
pub(super) fn executor_initialize_params(
    client: Option<&Map<String, Value>>,
    ask: &Ask,
    version: &str,
) -> Value {
    let mut params = client.cloned().unwrap_or_default();
    params.insert("protocolVersion".to_owned(), json!(version));
    let capabilities = params.entry("capabilities").or_insert_with(|| json!({}));
    if let Some(capabilities) = capabilities.as_object_mut() {
        let experimental = capabilities
            .entry("experimental")
            .or_insert_with(|| json!({}));
        if let Some(experimental) = experimental.as_object_mut() {
            experimental.remove(EXECUTOR_KEY);
            if let Some(bytes) = ask.max_read_bytes {
                experimental.insert(EXECUTOR_KEY.to_owned(), json!({"maxReadBytes": bytes}));
            }
        }
    }
    Value::Object(params)
}

/// The client's initialize result: the workspace unit's executor's, at the
/// session's negotiated `version`, with box's serverInfo and the envelopes
/// under the executor capability's `box`.
pub(super) fn initialize_result(
    plan: &Plan,
    envelopes: &[&Envelope],
    workspace: Option<usize>,
    initialized: &[ExecutorStart],
    version: &str,
) -> Value {
    let mut result = match workspace {
        Some(index) => initialized[index].initialize.clone(),
        None => json!({"capabilities": {"experimental": {EXECUTOR_KEY: {"version": 1}}}}),
    };
    let envelopes: Vec<Value> = envelopes
        .iter()
        .map(|envelope| serde_json::to_value(envelope).unwrap_or(Value::Null))
        .collect();
    if let Some(object) = result.as_object_mut() {
        // The session's version, which its transport then holds the client
        // to; every executor was initialized at it.
        object.insert("protocolVersion".to_owned(), json!(version));
        object.insert(
            "serverInfo".to_owned(),
            json!({"name": "box", "version": env!("CARGO_PKG_VERSION")}),
        );
        let capabilities = object.entry("capabilities").or_insert_with(|| json!({}));
        if let Some(capabilities) = capabilities.as_object_mut() {
            let experimental = capabilities
                .entry("experimental")
                .or_insert_with(|| json!({}));
            if let Some(experimental) = experimental.as_object_mut() {
                let executor = experimental
                    .entry(EXECUTOR_KEY)
                    .or_insert_with(|| json!({"version": 1}));
                if let Some(executor) = executor.as_object_mut() {
                    executor.insert(
                        "box".to_owned(),
                        json!({"profile": plan.profile, "units": envelopes}),
                    );
                }
            }
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn the_ask_is_read_and_its_errors_name_the_field() {
        let params = json!({"capabilities": {"experimental": {EXECUTOR_KEY: {
            "maxReadBytes": 5, "box": {"profile": "ci", "tighten": {"network": {"mode": "none"}}}
        }}}});
        assert_eq!(
            read_ask(params.as_object()),
            Ok(Ask {
                max_read_bytes: Some(5),
                profile: Some("ci".to_owned()),
                tighten: json!({"network": {"mode": "none"}}),
            })
        );
        assert_eq!(read_ask(json!({}).as_object()), Ok(Ask::default()));
        let bad =
            json!({"capabilities": {"experimental": {EXECUTOR_KEY: {"box": {"profile": 3}}}}});
        let error = read_ask(bad.as_object()).unwrap_err();
        assert!(error.contains(".box.profile"), "{error}");
        let bad = json!({"capabilities": {"experimental": {EXECUTOR_KEY: {"maxReadBytes": -1}}}});
        assert!(
            read_ask(bad.as_object())
                .unwrap_err()
                .contains("maxReadBytes")
        );
    }

    #[test]
    fn executors_get_the_clients_params_without_the_box_ask() {
        let params = json!({
            "protocolVersion": "2025-11-25",
            "capabilities": {"elicitation": {}, "experimental": {EXECUTOR_KEY: {"maxReadBytes": 9, "box": {"profile": "ci"}}, "x/y": {}}},
            "clientInfo": {"name": "c", "version": "1"}
        });
        let ask = read_ask(params.as_object()).unwrap();
        let sent = executor_initialize_params(params.as_object(), &ask, "2025-11-25");
        assert_eq!(
            sent,
            json!({
                "protocolVersion": "2025-11-25",
                "capabilities": {"elicitation": {}, "experimental": {"x/y": {}, EXECUTOR_KEY: {"maxReadBytes": 9}}},
                "clientInfo": {"name": "c", "version": "1"}
            })
        );
    }
}
