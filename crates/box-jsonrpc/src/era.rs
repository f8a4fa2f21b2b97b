//! MCP's stateless revision (2026-07-28) beside the handshake era: how a
//! request says it is of that revision (`_meta`), the answers every
//! transport gives it alike, and what a result of it must carry.
//!
//! A request of 2026-07-28 names its protocol version and its client's
//! capabilities in `params._meta` instead of an `initialize`; a request
//! without them is of the handshake era and is served as before.

use serde_json::{Value, json};

use crate::{PROTOCOL_VERSIONS, error_response_with_data, params};

/// The stateless revision box serves.
pub const STATELESS_VERSION: &str = "2026-07-28";

/// `_meta` key: the protocol version of one request (2026-07-28).
pub const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
/// `_meta` key: the client's capabilities, per request.
pub const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
/// `_meta` key: the client's name and version, per request.
pub const META_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
/// `_meta` key of a result: the server's name and version.
pub const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
/// The prefix MCP reserves for its own `_meta` keys.
pub const META_MCP_PREFIX: &str = "io.modelcontextprotocol/";

/// `_meta` key: the box session a stateless request is for, `{id, secret}`
/// as `box/session.open` answered it.
pub const SESSION_META: &str = "box/session";

/// 2026-07-28: an HTTP header disagrees with the body (`Mcp-Method`, `Mcp-Name`).
pub const HEADER_MISMATCH: i64 = -32020;
/// 2026-07-28: a protocol version the server does not serve (`data.supported`).
pub const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;

/// Every version box serves, oldest first: the handshake era's, then the
/// stateless revision.
pub fn all_versions() -> Vec<&'static str> {
    let mut versions = PROTOCOL_VERSIONS.to_vec();
    versions.push(STATELESS_VERSION);
    versions
}

/// The protocol version a request names in its `_meta` (a request of the
/// stateless revision, or one that asks for a version box may not serve);
/// `None` for a request of the handshake era.
pub fn request_version(message: &Value) -> Option<&str> {
    params(message)?
        .get("_meta")?
        .get(META_PROTOCOL_VERSION)?
        .as_str()
}

/// Whether `message` is a request of the stateless revision box serves.
pub fn is_stateless(message: &Value) -> bool {
    request_version(message) == Some(STATELESS_VERSION)
}

/// The -32022 answer to a request naming `requested`, listing what box serves.
pub fn unsupported_version(id: Value, requested: &str) -> Value {
    let supported = all_versions();
    error_response_with_data(
        id,
        UNSUPPORTED_PROTOCOL_VERSION,
        format!(
            "_meta[\"{META_PROTOCOL_VERSION}\"]: box does not serve MCP {requested:?}; it serves {} (without _meta, through initialize: {})",
            STATELESS_VERSION,
            PROTOCOL_VERSIONS.join(", ")
        ),
        json!({"supported": supported, "requested": requested}),
    )
}

/// Whether `method` answers with a list a client may cache (2026-07-28
/// requires `ttlMs` and `cacheScope` on them).
fn is_cacheable(method: &str) -> bool {
    matches!(
        method,
        "tools/list"
            | "resources/list"
            | "resources/templates/list"
            | "prompts/list"
            | "resources/read"
            | "server/discover"
    )
}

/// Give the answer to a stateless request to `method` what the revision
/// requires of a result and the handshake era's answer lacks: `resultType`
/// (`complete`), and on a cacheable list `ttlMs` (0: a box session's lists
/// are its own) and `cacheScope` (`private`). What the answer already says
/// is kept; an error is left alone.
pub fn complete_result(method: &str, response: &mut Value) {
    let Some(result) = response.get_mut("result").and_then(Value::as_object_mut) else {
        return;
    };
    result
        .entry("resultType")
        .or_insert_with(|| json!("complete"));
    if is_cacheable(method) {
        result.entry("ttlMs").or_insert_with(|| json!(0));
        result
            .entry("cacheScope")
            .or_insert_with(|| json!("private"));
    }
}

/// Remove what a stateless request carries for the host alone from its
/// `_meta` before it goes on to a unit, whose executor the host initialized
/// in the handshake era: MCP's per-request keys and the box session handle
/// (its secret must never reach a unit). The handle's value, if any.
pub fn take_host_meta(message: &mut Value) -> Option<Value> {
    let meta = message
        .get_mut("params")?
        .as_object_mut()?
        .get_mut("_meta")?
        .as_object_mut()?;
    meta.retain(|key, _| !key.starts_with(META_MCP_PREFIX));
    let handle = meta.remove(SESSION_META);
    if meta.is_empty()
        && let Some(params) = message.get_mut("params").and_then(Value::as_object_mut)
    {
        params.remove("_meta");
    }
    handle
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn a_request_names_its_era_in_meta() {
        let modern = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list",
            "params": {"_meta": {META_PROTOCOL_VERSION: "2026-07-28"}}});
        let legacy = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
        assert!(is_stateless(&modern));
        assert!(!is_stateless(&legacy));
        assert_eq!(request_version(&legacy), None);
    }

    #[test]
    fn a_stateless_answer_gets_what_the_revision_requires() {
        let mut listed = json!({"jsonrpc": "2.0", "id": 1, "result": {"tools": []}});
        complete_result("tools/list", &mut listed);
        assert_eq!(
            listed["result"],
            json!({"tools": [], "resultType": "complete", "ttlMs": 0, "cacheScope": "private"})
        );
        let mut called = json!({"jsonrpc": "2.0", "id": 1, "result": {"content": []}});
        complete_result("tools/call", &mut called);
        assert_eq!(
            called["result"],
            json!({"content": [], "resultType": "complete"})
        );
        let mut error = json!({"jsonrpc": "2.0", "id": 1, "error": {"code": 1, "message": "m"}});
        let before = error.clone();
        complete_result("tools/list", &mut error);
        assert_eq!(error, before);
    }

    #[test]
    fn host_meta_is_taken_before_a_unit_sees_the_request() {
        let mut message = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "bash",
        "_meta": {
            META_PROTOCOL_VERSION: "2026-07-28",
            META_CLIENT_CAPABILITIES: {},
            SESSION_META: {"id": "s", "secret": "x"},
            "progressToken": 1,
        }}});
        let handle = take_host_meta(&mut message);
        assert_eq!(handle, Some(json!({"id": "s", "secret": "x"})));
        assert_eq!(message["params"]["_meta"], json!({"progressToken": 1}));
        let mut bare = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {
            "_meta": {META_PROTOCOL_VERSION: "2026-07-28"}}});
        take_host_meta(&mut bare);
        assert_eq!(bare["params"], json!({}));
    }
}
