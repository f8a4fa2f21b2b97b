//! Raw JSON-RPC as box's host, transports and executor all speak it.
//!
//! Owns the message vocabulary (classifying a raw `serde_json::Value` as a
//! request, notification or response, building error answers, MCP's protocol
//! versions), the one line framer (`lines`) and this process's stdio for it
//! (`stdio`, non-blocking pipes and sockets), and the channels between a
//! transport and a session (`session`: the handle a transport holds, the
//! reply stream a session answers on). It never round-trips a message through typed structs:
//! everything it does not route on is forwarded byte-for-byte as it came
//! (unknown members, `_meta`, `experimental` capabilities), because typed MCP
//! messages drop fields.
//!
//! It does no I/O of its own beyond the framer it hands a reader or writer,
//! and stdin and stdout opened for it.

pub mod era;
pub mod lines;
pub mod session;
pub mod stdio;

use serde_json::{Map, Value, json};
use tokio::sync::{mpsc, oneshot};

/// The MCP protocol versions box speaks (the initialize handshake era),
/// oldest first: what `initialize` agrees to, what the HTTP transport's
/// `MCP-Protocol-Version` check accepts, and what a `server/discover` refusal
/// lists, in `box serve` and `box execute` alike.
pub const PROTOCOL_VERSIONS: [&str; 4] = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

/// The newest of [`PROTOCOL_VERSIONS`].
pub const LATEST_PROTOCOL_VERSION: &str = PROTOCOL_VERSIONS[PROTOCOL_VERSIONS.len() - 1];

/// The version a session speaks after the client asked for `requested`: that
/// one when box speaks it, else box's newest (MCP's negotiation: answering
/// another version is not an error; the client decides whether to go on).
pub fn negotiate_version(requested: &str) -> &'static str {
    PROTOCOL_VERSIONS
        .iter()
        .find(|version| **version == requested)
        .copied()
        .unwrap_or(LATEST_PROTOCOL_VERSION)
}

/// Whether `version` accepts JSON-RPC batches (arrays): 2025-03-26 added them
/// and 2025-06-18 removed them again.
pub fn allows_batches(version: &str) -> bool {
    version == "2025-03-26"
}

/// Whether a client that negotiated `version` sends `MCP-Protocol-Version` on
/// every HTTP request after initialize (the header exists since 2025-06-18;
/// the dates compare as text).
pub fn sends_version_header(version: &str) -> bool {
    version >= "2025-06-18"
}

/// The capability key of the executor wire (dax's), under which a client
/// asks and the executor and host answer, in `capabilities.experimental`.
pub const EXECUTOR_KEY: &str = "io.github.christopherdavenport.dax/executor";

/// The read limit a client asks for in `initialize`, the value of
/// `maxReadBytes` in its ask under [`EXECUTOR_KEY`]: `None` when absent or
/// null, the limit when a positive integer, else refused with a message that
/// names the field. `box serve` and `box execute` both read it here, so they
/// accept and refuse the same values with the same words.
pub fn asked_max_read_bytes(asked: Option<&Value>) -> Result<Option<u64>, String> {
    match asked {
        None | Some(Value::Null) => Ok(None),
        Some(value) => match value.as_u64() {
            Some(bytes) if bytes > 0 => Ok(Some(bytes)),
            _ => Err(format!(
                "capabilities.experimental[\"{EXECUTOR_KEY}\"].maxReadBytes: must be a positive integer (bytes), got {value}"
            )),
        },
    }
}

/// JSON-RPC's and MCP's error codes box answers with.
pub mod code {
    /// Bad JSON.
    pub const PARSE_ERROR: i64 = -32700;
    /// Not a JSON-RPC request object (a batch array, a missing member, a second initialize).
    pub const INVALID_REQUEST: i64 = -32600;
    /// No such method (including `server/discover` without the stateless revision's `_meta`).
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// Bad params: a refused tightening, an unknown profile, a wrong type.
    pub const INVALID_PARAMS: i64 = -32602;
    /// Something failed on box's side: a unit that ended, a deadline.
    pub const INTERNAL_ERROR: i64 = -32603;
    /// A call ran past its deadline (implementation-defined range, as the SDKs use it).
    pub const REQUEST_TIMEOUT: i64 = -32001;
}

/// The three kinds of JSON-RPC message, told apart by their members.
#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    /// `method` and `id`: answered exactly once.
    Request {
        /// The id, a string or an integer, exactly as sent.
        id: Value,
        /// The method.
        method: String,
    },
    /// `method` and no `id`: never answered.
    Notification {
        /// The method.
        method: String,
    },
    /// `result` or `error`, with the id of the request it answers.
    Response {
        /// The id (may be `null` for an error about an unreadable request).
        id: Value,
    },
}

/// Why a value is not a JSON-RPC message box accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    /// A JSON array: batches were removed in MCP 2025-06-18.
    #[error("JSON-RPC batches (arrays) are not accepted; send one message per line or POST")]
    Batch,
    /// Not an object, or no `jsonrpc: "2.0"`, or neither method nor result/error.
    #[error("not a JSON-RPC 2.0 message: {0}")]
    Invalid(String),
    /// A method with an `id` that is neither a string nor an integer (`null`
    /// included): a malformed request, not a notification.
    #[error("not a JSON-RPC 2.0 message: a request id must be a string or an integer, never null")]
    InvalidId,
}

/// The answer to a message [`classify`] refused: -32600, with the message's
/// id when it has a usable one, else `null`. `box serve` and `box execute`
/// answer a refused line with it alike.
pub fn refusal(message: &Value, error: &MessageError) -> Value {
    let id = match (error, message.get("id")) {
        (MessageError::Invalid(_), Some(id)) if is_valid_id(id) => id.clone(),
        _ => Value::Null,
    };
    error_response(id, code::INVALID_REQUEST, error.to_string())
}

/// Classify `message`; the error says what is wrong with it.
pub fn classify(message: &Value) -> Result<Kind, MessageError> {
    let object = match message {
        Value::Object(object) => object,
        Value::Array(_) => return Err(MessageError::Batch),
        _ => return Err(MessageError::Invalid("not a JSON object".to_owned())),
    };
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(MessageError::Invalid(
            "`jsonrpc` must be \"2.0\"".to_owned(),
        ));
    }
    let id = object.get("id");
    if let Some(method) = object.get("method") {
        let Some(method) = method.as_str() else {
            return Err(MessageError::Invalid(
                "`method` must be a string".to_owned(),
            ));
        };
        return match id {
            None => Ok(Kind::Notification {
                method: method.to_owned(),
            }),
            Some(id) if is_valid_id(id) => Ok(Kind::Request {
                id: id.clone(),
                method: method.to_owned(),
            }),
            Some(_) => Err(MessageError::InvalidId),
        };
    }
    if object.contains_key("result") || object.contains_key("error") {
        return Ok(Kind::Response {
            id: id.cloned().unwrap_or(Value::Null),
        });
    }
    Err(MessageError::Invalid(
        "neither `method` nor `result`/`error`".to_owned(),
    ))
}

/// Whether `id` is a JSON-RPC request id: a string or an integer.
pub fn is_valid_id(id: &Value) -> bool {
    match id {
        Value::String(_) => true,
        Value::Number(number) => number.is_i64() || number.is_u64(),
        _ => false,
    }
}

/// A key that tells `1` from `"1"`: the id's compact JSON text.
pub fn id_key(id: &Value) -> String {
    id.to_string()
}

/// An error response to the request `id`.
pub fn error_response(id: Value, code: i64, message: impl Into<String>) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message.into()}})
}

/// An error response carrying `data`.
pub fn error_response_with_data(
    id: Value,
    code: i64,
    message: impl Into<String>,
    data: Value,
) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message.into(), "data": data}})
}

/// The refusal of a `server/discover` that names no version in its `_meta`
/// (of neither era: the stateless revision's carries one, `era`), word for
/// word the same from `box serve` and `box execute`: "method not found", listing under `data.supported` the versions `initialize` agrees
/// to, so a dual-era client falls back to `initialize`. Nothing is started.
pub fn discover_refusal(id: Value) -> Value {
    error_response_with_data(
        id,
        code::METHOD_NOT_FOUND,
        discover_refusal_message(),
        discover_refusal_data(),
    )
}

/// The message of [`discover_refusal`].
pub fn discover_refusal_message() -> String {
    format!(
        "server/discover: box speaks the initialize handshake (MCP {}); send initialize",
        PROTOCOL_VERSIONS.join(", ")
    )
}

/// The `data` of [`discover_refusal`].
pub fn discover_refusal_data() -> Value {
    json!({"supported": PROTOCOL_VERSIONS})
}

/// A result response to the request `id`.
pub fn result_response(id: Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// A request.
pub fn request(id: Value, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

/// A notification.
pub fn notification(method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "method": method, "params": params})
}

/// What kind of JSON value `value` is, for errors ("got a string").
pub fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Check that a request's `params`, when present, is an object (MCP's params
/// are always named; `null` counts as absent). The error names the field and
/// is answered with [`code::INVALID_PARAMS`].
pub fn check_params(message: &Value) -> Result<(), String> {
    match message.get("params") {
        None | Some(Value::Null) | Some(Value::Object(_)) => Ok(()),
        Some(other) => Err(format!(
            "params: must be an object, got {}",
            json_type(other)
        )),
    }
}

/// The `params` object of a message, when it has one.
pub fn params(message: &Value) -> Option<&Map<String, Value>> {
    message.get("params").and_then(Value::as_object)
}

/// The `params` object of a message, created when missing.
pub fn params_mut(message: &mut Value) -> Option<&mut Map<String, Value>> {
    let object = message.as_object_mut()?;
    let params = object
        .entry("params")
        .or_insert_with(|| Value::Object(Map::new()));
    params.as_object_mut()
}

/// Where the answer to one client request goes, and what streams before it.
///
/// `events` carries the messages related to the request that precede its
/// answer (progress, a server→client request made during it); it is bounded
/// and lossy (a full queue drops the event, never the call). `response` takes
/// the one answer.
#[derive(Debug)]
pub struct ReplyTo {
    /// Messages before the answer.
    pub events: mpsc::Sender<Value>,
    /// The answer, exactly once.
    pub response: oneshot::Sender<Value>,
}

/// The transport's end of a [`ReplyTo`].
#[derive(Debug)]
pub struct ReplyStream {
    /// Messages before the answer.
    pub events: mpsc::Receiver<Value>,
    /// The answer; an error when the session dropped the request unanswered
    /// (the client cancelled it, or the session is gone).
    pub response: oneshot::Receiver<Value>,
}

/// How many related messages may wait for a slow client before new ones are dropped.
pub const REPLY_EVENTS: usize = 64;

/// A reply channel pair.
pub fn reply_channel() -> (ReplyTo, ReplyStream) {
    let (events_tx, events_rx) = mpsc::channel(REPLY_EVENTS);
    let (response_tx, response_rx) = oneshot::channel();
    (
        ReplyTo {
            events: events_tx,
            response: response_tx,
        },
        ReplyStream {
            events: events_rx,
            response: response_rx,
        },
    )
}

impl ReplyTo {
    /// Send the answer; a client that went away is not an error.
    pub fn answer(self, response: Value) {
        let _ = self.response.send(response);
    }

    /// Send a related message before the answer; dropped when the client lags.
    pub fn event(&self, message: Value) -> bool {
        self.events.try_send(message).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn classify_tells_kinds_apart() {
        let cases = [
            (
                json!({"jsonrpc":"2.0","id":0,"method":"initialize"}),
                Ok(Kind::Request {
                    id: json!(0),
                    method: "initialize".into(),
                }),
            ),
            (
                json!({"jsonrpc":"2.0","id":"a","method":"x"}),
                Ok(Kind::Request {
                    id: json!("a"),
                    method: "x".into(),
                }),
            ),
            (
                json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
                Ok(Kind::Notification {
                    method: "notifications/initialized".into(),
                }),
            ),
            (
                json!({"jsonrpc":"2.0","id":3,"result":{}}),
                Ok(Kind::Response { id: json!(3) }),
            ),
            (
                json!({"jsonrpc":"2.0","error":{"code":1,"message":"m"}}),
                Ok(Kind::Response { id: Value::Null }),
            ),
            (
                json!([{"jsonrpc":"2.0","id":1,"method":"x"}]),
                Err(MessageError::Batch),
            ),
        ];
        for (message, expected) in cases {
            assert_eq!(classify(&message), expected, "{message}");
        }
        assert!(classify(&json!({"jsonrpc":"2.0","id":null,"method":"x"})).is_err());
        assert!(classify(&json!({"jsonrpc":"2.0","id":1.5,"method":"x"})).is_err());
        assert!(classify(&json!({"id":1,"method":"x"})).is_err());
        assert!(classify(&json!("x")).is_err());
    }

    #[test]
    fn id_keys_keep_the_type() {
        assert_ne!(id_key(&json!(1)), id_key(&json!("1")));
    }
}
