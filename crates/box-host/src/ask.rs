//! The box ask and the box answer at `initialize`: what a client asks under
//! the executor capability key (`maxReadBytes`, `box: {profile, tighten}`),
//! what each unit's executor is initialized with, and the initialize result
//! the client gets (the workspace unit's, plus the envelopes). Pure functions
//! over raw JSON.
//!
//! A session may also ask through its transport ([`TransportAsk`]: the HTTP
//! path and `Box-*` headers, `box serve --tighten` on stdio), for the clients
//! that cannot send an experimental capability. [`merge_ask`] joins the two:
//! each field from either, the same where both give it (else -32602 naming
//! the field and both places), then the same checks as a capability ask.

use serde_json::{Map, Value, json};

use super::units::ExecutorStart;
use box_backend::Envelope;
use box_jsonrpc::session::{AskPart, MAX_ASK_BYTES, TransportAsk};
use box_jsonrpc::{LATEST_PROTOCOL_VERSION, PROTOCOL_VERSIONS, json_type};
use box_policy::plan::{Plan, PlanError, parse_tightening_text};

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
    /// `box.reattach`: the session to reattach to after its host restarted.
    pub reattach: Option<Reattach>,
}

/// `box.reattach: {session, secret}`: what the initialize answer's
/// `box.session` gave the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Reattach {
    /// The session id.
    pub session: String,
    /// The reattach secret.
    pub secret: String,
}

/// Read `box.reattach` from the box ask; the error names the field.
fn read_reattach(field: &str, value: Option<&Value>) -> Result<Option<Reattach>, String> {
    let object = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(object)) => object,
        Some(other) => {
            return Err(format!(
                "{field}.box.reattach: must be an object {{session, secret}}, got {other}"
            ));
        }
    };
    let text = |name: &str| match object.get(name) {
        Some(Value::String(text)) if !text.is_empty() => Ok(text.clone()),
        other => Err(format!(
            "{field}.box.reattach.{name}: must be a non-empty string (from the initialize answer's box.session), got {}",
            other.map_or_else(|| "nothing".to_owned(), Value::to_string)
        )),
    };
    Ok(Some(Reattach {
        session: text("session")?,
        secret: text("secret")?,
    }))
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
    let max_read_bytes = box_jsonrpc::asked_max_read_bytes(ask.get("maxReadBytes"))?;
    let (profile, tighten, reattach) = match ask.get("box") {
        None | Some(Value::Null) => (None, Value::Null, None),
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
                read_reattach(&field, ask_box.get("reattach"))?,
            )
        }
        Some(other) => return Err(format!("{field}.box: must be an object, got {other}")),
    };
    Ok(Ask {
        max_read_bytes,
        profile,
        tighten,
        reattach,
    })
}

/// The client's capability ask joined with what its transport asked: a field
/// given in one place is taken from there; given in both, the two must be
/// equal (JSON equality for `tighten`) or the session is refused, naming the
/// field and both places. A transport's tightening is parsed strictly (a
/// duplicate key is refused, as `box profile resolve --tighten` does), and
/// every transport part is bounded by [`MAX_ASK_BYTES`]. What comes out is
/// checked as a capability ask is (the profile loaded, the tightening parsed
/// and applied), so both ways of asking get the same answers and errors.
pub(super) fn merge_ask(capability: Ask, transport: &TransportAsk) -> Result<Ask, String> {
    let mut ask = capability;
    if let Some(part) = &transport.profile {
        let name = bounded("box.profile", part)?;
        if name.is_empty() {
            return Err(format!(
                "box.profile: {} names no profile; give a profile name such as `ci`",
                part.source
            ));
        }
        match &ask.profile {
            Some(asked) if asked != name => {
                return Err(disagreement(
                    "box.profile",
                    part,
                    &format!("`{name}`"),
                    &format!("`{asked}`"),
                ));
            }
            _ => ask.profile = Some(name.to_owned()),
        }
    }
    if let Some(part) = &transport.tighten {
        let text = bounded("box.tighten", part)?;
        let tighten = parse_tightening_text(text).map_err(|error| {
            let why = match error {
                PlanError::Invalid(why) => why,
                other => other.to_string(),
            };
            format!("box.tighten: {}: {why}", part.source)
        })?;
        if !ask.tighten.is_null() && !tighten.is_null() && ask.tighten != tighten {
            return Err(disagreement(
                "box.tighten",
                part,
                &tighten.to_string(),
                &ask.tighten.to_string(),
            ));
        }
        if !tighten.is_null() {
            ask.tighten = tighten;
        }
    }
    if let Some(part) = &transport.max_read_bytes {
        let text = bounded("maxReadBytes", part)?;
        let bytes = text
            .parse::<u64>()
            .ok()
            .filter(|bytes| *bytes > 0 && text.bytes().all(|byte| byte.is_ascii_digit()))
            .ok_or_else(|| {
                format!(
                    "maxReadBytes: {}: must be a positive integer (bytes), got {text:?}",
                    part.source
                )
            })?;
        match ask.max_read_bytes {
            Some(asked) if asked != bytes => {
                return Err(disagreement(
                    "maxReadBytes",
                    part,
                    &bytes.to_string(),
                    &asked.to_string(),
                ));
            }
            _ => ask.max_read_bytes = Some(bytes),
        }
    }
    if let Some(part) = &transport.reattach {
        let text = bounded("box.reattach", part)?;
        let Some((session, secret)) = text
            .split_once(':')
            .filter(|(session, secret)| !session.is_empty() && !secret.is_empty())
        else {
            return Err(format!(
                "box.reattach: {}: must be SESSION:SECRET (the initialize answer's box.session id and secret)",
                part.source
            ));
        };
        let asked = Reattach {
            session: session.trim().to_owned(),
            secret: secret.trim().to_owned(),
        };
        match &ask.reattach {
            Some(capability) if capability != &asked => {
                return Err(format!(
                    "box.reattach: {} and the capability's box.reattach name different sessions or secrets; ask in one place, or the same in both",
                    part.source
                ));
            }
            _ => ask.reattach = Some(asked),
        }
    }
    Ok(ask)
}

/// A transport part's text, refused over [`MAX_ASK_BYTES`].
fn bounded<'a>(field: &str, part: &'a AskPart) -> Result<&'a str, String> {
    if part.text.len() > MAX_ASK_BYTES {
        return Err(format!(
            "{field}: {} holds {} bytes, over the limit of {MAX_ASK_BYTES} bytes; send a smaller ask",
            part.source,
            part.text.len()
        ));
    }
    Ok(part.text.as_str())
}

/// The error for a field the transport and the capability both give, differently.
fn disagreement(field: &str, part: &AskPart, transport: &str, capability: &str) -> String {
    let place = format!("capabilities.experimental[\"{EXECUTOR_KEY}\"].{field}");
    format!(
        "{field}: {} asks for {transport} but {place} asks for {capability}; ask in one place, or the same in both",
        part.source
    )
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
                reattach: None,
            })
        );
        assert_eq!(read_ask(json!({}).as_object()), Ok(Ask::default()));
        let reattach = json!({"capabilities": {"experimental": {EXECUTOR_KEY: {
            "box": {"reattach": {"session": "s1", "secret": "k"}}
        }}}});
        assert_eq!(
            read_ask(reattach.as_object()).unwrap().reattach,
            Some(Reattach {
                session: "s1".to_owned(),
                secret: "k".to_owned()
            })
        );
        let bad = json!({"capabilities": {"experimental": {EXECUTOR_KEY: {
            "box": {"reattach": {"session": "s1"}}
        }}}});
        let error = read_ask(bad.as_object()).unwrap_err();
        assert!(error.contains(".box.reattach.secret"), "{error}");
        let bad =
            json!({"capabilities": {"experimental": {EXECUTOR_KEY: {"box": {"profile": 3}}}}});
        let error = read_ask(bad.as_object()).unwrap_err();
        assert!(error.contains(".box.profile"), "{error}");
        for asked in [json!(-1), json!(0), json!("4096"), json!(1.5)] {
            let bad =
                json!({"capabilities": {"experimental": {EXECUTOR_KEY: {"maxReadBytes": asked}}}});
            assert_eq!(
                read_ask(bad.as_object()).unwrap_err(),
                format!(
                    "capabilities.experimental[\"{EXECUTOR_KEY}\"].maxReadBytes: must be a positive integer (bytes), got {asked}"
                )
            );
        }
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

    fn capability(profile: Option<&str>, tighten: Value, max_read_bytes: Option<u64>) -> Ask {
        Ask {
            max_read_bytes,
            profile: profile.map(str::to_owned),
            tighten,
            reattach: None,
        }
    }

    fn transport(
        profile: Option<&str>,
        tighten: Option<&str>,
        bytes: Option<&str>,
    ) -> TransportAsk {
        TransportAsk {
            profile: profile.map(|text| AskPart::new(text, "the path /mcp/p/x")),
            tighten: tighten.map(|text| AskPart::new(text, "the Box-Tighten header")),
            max_read_bytes: bytes.map(|text| AskPart::new(text, "the Box-Max-Read-Bytes header")),
            reattach: None,
        }
    }

    #[test]
    fn a_transport_ask_alone_is_the_ask() {
        let asked = merge_ask(
            Ask::default(),
            &transport(
                Some("ci"),
                Some(r#"{"limits": {"memory": "1GiB"}}"#),
                Some("4096"),
            ),
        );
        assert_eq!(
            asked,
            Ok(capability(
                Some("ci"),
                json!({"limits": {"memory": "1GiB"}}),
                Some(4096)
            ))
        );
        // Each part alone.
        assert_eq!(
            merge_ask(Ask::default(), &transport(Some("ci"), None, None)),
            Ok(capability(Some("ci"), Value::Null, None))
        );
        assert_eq!(
            merge_ask(
                Ask::default(),
                &transport(None, Some(r#"{"servers": []}"#), None)
            ),
            Ok(capability(None, json!({"servers": []}), None))
        );
        assert_eq!(
            merge_ask(Ask::default(), &transport(None, None, Some("7"))),
            Ok(capability(None, Value::Null, Some(7)))
        );
    }

    #[test]
    fn a_capability_ask_alone_is_unchanged() {
        let asked = capability(Some("ci"), json!({"servers": []}), Some(9));
        assert_eq!(
            merge_ask(
                capability(Some("ci"), json!({"servers": []}), Some(9)),
                &TransportAsk::default()
            ),
            Ok(asked)
        );
    }

    #[test]
    fn a_reattach_header_is_the_capabilitys_reattach() {
        let header = TransportAsk {
            reattach: Some(AskPart::new("s1:k", "the Box-Reattach header")),
            ..TransportAsk::default()
        };
        let asked = merge_ask(Ask::default(), &header).unwrap();
        assert_eq!(
            asked.reattach,
            Some(Reattach {
                session: "s1".to_owned(),
                secret: "k".to_owned()
            })
        );
        let bad = TransportAsk {
            reattach: Some(AskPart::new("s1", "the Box-Reattach header")),
            ..TransportAsk::default()
        };
        let error = merge_ask(Ask::default(), &bad).unwrap_err();
        assert!(error.contains("SESSION:SECRET"), "{error}");
        let other = Ask {
            reattach: Some(Reattach {
                session: "s2".to_owned(),
                secret: "k".to_owned(),
            }),
            ..Ask::default()
        };
        assert!(merge_ask(other, &header).is_err());
    }

    #[test]
    fn both_may_ask_the_same() {
        let asked = merge_ask(
            capability(
                Some("ci"),
                json!({"limits": {"pids": 9, "memory": "1GiB"}}),
                Some(5),
            ),
            // Key order and spacing differ: JSON equality, not text.
            &transport(
                Some("ci"),
                Some(r#"{"limits":{"memory":"1GiB","pids":9}}"#),
                Some("5"),
            ),
        );
        assert_eq!(
            asked,
            Ok(capability(
                Some("ci"),
                json!({"limits": {"memory": "1GiB", "pids": 9}}),
                Some(5)
            ))
        );
    }

    #[test]
    fn a_disagreement_names_the_field_and_both_places() {
        let error = merge_ask(
            capability(Some("default"), Value::Null, None),
            &transport(Some("ci"), None, None),
        )
        .unwrap_err();
        assert!(
            error.starts_with("box.profile: the path /mcp/p/x asks for `ci`"),
            "{error}"
        );
        assert!(error.contains(".box.profile asks for `default`"), "{error}");
        let error = merge_ask(
            capability(None, json!({"servers": []}), None),
            &transport(None, Some(r#"{"servers": ["db"]}"#), None),
        )
        .unwrap_err();
        assert!(
            error.starts_with("box.tighten: the Box-Tighten header asks for"),
            "{error}"
        );
        assert!(
            error.contains(&format!(
                "capabilities.experimental[\"{EXECUTOR_KEY}\"].box.tighten"
            )),
            "{error}"
        );
        let error = merge_ask(
            capability(None, Value::Null, Some(1)),
            &transport(None, None, Some("2")),
        )
        .unwrap_err();
        assert!(
            error.starts_with("maxReadBytes: the Box-Max-Read-Bytes header asks for 2"),
            "{error}"
        );
    }

    #[test]
    fn a_bad_transport_ask_is_refused_naming_where_it_came_from() {
        for (text, expected) in [
            ("{not json", "not valid JSON"),
            (
                r#"{"servers": [], "servers": []}"#,
                "duplicate key `servers`",
            ),
        ] {
            let error = merge_ask(Ask::default(), &transport(None, Some(text), None)).unwrap_err();
            assert!(
                error.starts_with("box.tighten: the Box-Tighten header: "),
                "{error}"
            );
            assert!(error.contains(expected), "{error}");
        }
        for bytes in ["0", "-1", "+5", "5k", "", "99999999999999999999999"] {
            let error = merge_ask(Ask::default(), &transport(None, None, Some(bytes))).unwrap_err();
            assert!(
                error.starts_with(
                    "maxReadBytes: the Box-Max-Read-Bytes header: must be a positive integer"
                ),
                "{error}"
            );
        }
        let error = merge_ask(Ask::default(), &transport(Some(""), None, None)).unwrap_err();
        assert!(error.contains("names no profile"), "{error}");
    }

    #[test]
    fn an_oversize_transport_ask_is_refused_naming_the_limit() {
        let text = format!(
            r#"{{"env": {{"drop": ["{}"]}}}}"#,
            "A".repeat(MAX_ASK_BYTES)
        );
        let error = merge_ask(Ask::default(), &transport(None, Some(&text), None)).unwrap_err();
        assert!(
            error.starts_with("box.tighten: the Box-Tighten header holds"),
            "{error}"
        );
        assert!(error.contains("limit of 8192 bytes"), "{error}");
        // At the limit is accepted (a string of exactly MAX_ASK_BYTES).
        let at = format!(r#"{{"servers": ["{}"]}}"#, "a".repeat(MAX_ASK_BYTES - 17));
        assert_eq!(at.len(), MAX_ASK_BYTES);
        assert!(merge_ask(Ask::default(), &transport(None, Some(&at), None)).is_ok());
    }
}
