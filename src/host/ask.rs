//! The box ask and the box answer at `initialize`: what a client asks under
//! the executor capability key (`maxReadBytes`, `box: {profile, tighten}`),
//! what each unit's executor is initialized with, and the initialize result
//! the client gets (the workspace unit's, plus the envelopes). Pure functions
//! over raw JSON.

use serde_json::{Map, Value, json};

use super::units::ExecutorStart;
use crate::backend::Envelope;
use crate::plan::Plan;
use crate::proxy::{code, error_response};

/// The capability key of the executor wire, where the client asks and the host answers.
pub const EXECUTOR_KEY: &str = "io.github.christopherdavenport.dax/executor";

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

/// The params a unit's executor is initialized with: the client's own, its
/// executor ask reduced to `maxReadBytes` (the box ask is the host's business).
pub(super) fn executor_initialize_params(client: Option<&Map<String, Value>>, ask: &Ask) -> Value {
    let mut params = client.cloned().unwrap_or_default();
    params
        .entry("protocolVersion")
        .or_insert_with(|| json!("2025-06-18"));
    params
        .entry("clientInfo")
        .or_insert_with(|| json!({"name": "box", "version": crate::VERSION}));
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

/// The answer to a `server/discover` probe: method not found, so a dual-era
/// client falls back to initialize; nothing is started.
pub fn discover_refusal(id: Value) -> Value {
    error_response(
        id,
        code::METHOD_NOT_FOUND,
        "server/discover: box speaks the initialize handshake (MCP 2025-06-18 and 2025-11-25); send initialize",
    )
}

/// The client's initialize result: the workspace unit's executor's, with box's
/// serverInfo and the envelopes under the executor capability's `box`.
pub(super) fn initialize_result(
    plan: &Plan,
    envelopes: &[&Envelope],
    workspace: Option<usize>,
    initialized: &[ExecutorStart],
    requested: Option<&str>,
) -> Value {
    let mut result = match workspace {
        Some(index) => initialized[index].initialize.clone(),
        // No workspace unit: the first unit's negotiated version, else the
        // client's when box speaks it, else the version every SDK knows.
        None => json!({
            "protocolVersion": initialized
                .first()
                .and_then(|first| first.initialize.get("protocolVersion").cloned())
                .or_else(|| requested
                    .filter(|version| crate::proxy::PROTOCOL_VERSIONS.contains(version))
                    .map(|version| json!(version)))
                .unwrap_or_else(|| json!("2025-06-18")),
            "capabilities": {"experimental": {EXECUTOR_KEY: {"version": 1}}},
        }),
    };
    let envelopes: Vec<Value> = envelopes
        .iter()
        .map(|envelope| serde_json::to_value(envelope).unwrap_or(Value::Null))
        .collect();
    if let Some(object) = result.as_object_mut() {
        object.insert(
            "serverInfo".to_owned(),
            json!({"name": "box", "version": crate::VERSION}),
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
        let sent = executor_initialize_params(params.as_object(), &ask);
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
