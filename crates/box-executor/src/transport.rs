//! The executor's stdio framing: one JSON-RPC message per line, as rmcp's own
//! transport frames it, except that bad input is answered instead of dropped.
//! A line that is not JSON, nests too deep, is not UTF-8, is a JSON-RPC batch
//! or another shape no request has, or is longer than the limit, gets an error
//! response (with the line's `id` when one can be found without parsing it),
//! so the client's request ends; the executor keeps serving.
//!
//! Lines are read with box-jsonrpc's framer (`lines::LineReader`), on the
//! process's stdio as `box serve` opens it (`box_jsonrpc::stdio`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use rmcp::RoleServer;
use rmcp::model::{
    ClientNotification, ClientRequest, GetMeta as _, JsonRpcMessage, RequestId, ServerResult,
};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::Mutex;

use box_jsonrpc as jsonrpc;
use box_jsonrpc::lines::{Line, LineReader};

/// The longest line taken (rmcp's own default); longer lines are answered
/// with an error and discarded as they stream in, never buffered whole.
pub(crate) const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;
/// How much of an over-long line is kept to find its `id`.
const ID_SCAN_BYTES: usize = 4096;

const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const INVALID_PARAMS: i64 = -32602;

pub(crate) use box_jsonrpc::stdio::stdio;

/// Newline-delimited JSON-RPC over a reader and a writer.
pub(crate) struct LineTransport<R, W> {
    /// Cancel-safe: a line read in part when rmcp drops a receive is kept.
    reader: LineReader<R>,
    writer: Arc<Mutex<W>>,
    /// The ids of the client's requests not yet answered. rmcp keys its own
    /// bookkeeping by id, so a second request with an id in flight would run
    /// and take the first one's place: it is refused here instead, as
    /// `box serve` refuses it.
    in_flight: Arc<std::sync::Mutex<HashSet<RequestId>>>,
    /// The spans of requests the host traces (it sent
    /// `_meta["box/traceparent"]`), by id, until answered.
    traced: Arc<std::sync::Mutex<HashMap<RequestId, box_otel::Recording>>>,
    /// Answered requests' spans, sent home together in a
    /// `notifications/box/spans` line a moment later (or when the batch
    /// fills, or at the end): nothing more is written with an answer.
    spans: Arc<box_otel::Pending>,
}

impl<R, W> LineTransport<R, W>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    /// Frame messages over `reader` and `writer`.
    pub fn new(reader: R, writer: W) -> Self {
        Self {
            reader: LineReader::new(reader, MAX_LINE_BYTES).keeping_head(ID_SCAN_BYTES),
            writer: Arc::new(Mutex::new(writer)),
            in_flight: Arc::default(),
            traced: Arc::default(),
            spans: Arc::default(),
        }
    }

    /// Send the kept spans home after `delay`, from a task of their own.
    fn send_spans(&self, delay: Option<std::time::Duration>) {
        let (writer, spans) = (Arc::clone(&self.writer), Arc::clone(&self.spans));
        tokio::spawn(async move {
            if let Some(delay) = delay {
                tokio::time::sleep(delay).await;
            }
            if let Err(error) = Self::write_spans(&writer, &spans).await {
                tracing::debug!("sending spans: {error}");
            }
        });
    }

    async fn write_spans(writer: &Mutex<W>, spans: &box_otel::Pending) -> std::io::Result<()> {
        match spans.take() {
            Some(line) => Self::write(writer, line).await,
            None => Ok(()),
        }
    }

    /// Start the span of a request the host traces: `execute_tool {name}`
    /// for a tool call (the conventions' name), `process.start` for a
    /// process's start, else its method. Nothing
    /// from the arguments is recorded.
    fn trace(&self, message: &RxJsonRpcMessage<RoleServer>) {
        let JsonRpcMessage::Request(request) = message else {
            return;
        };
        let meta = request.request.get_meta();
        let Some(parent) = box_otel::Recording::parent_in(meta.get(box_otel::EXECUTOR_TRACEPARENT))
        else {
            return;
        };
        let mut span = match &request.request {
            ClientRequest::CallToolRequest(call) => {
                let mut span = box_otel::Recording::start(
                    &parent,
                    format!("execute_tool {}", call.params.name),
                );
                span.set("gen_ai.operation.name", "execute_tool");
                span.set("gen_ai.tool.name", call.params.name.to_string());
                span
            }
            // A process's start by its operation's name: what it runs is
            // not recorded.
            other if other.method() == crate::process::START_METHOD => {
                box_otel::Recording::start(&parent, "process.start".to_owned())
            }
            other => box_otel::Recording::start(&parent, other.method().to_owned()),
        };
        span.set("mcp.method.name", request.request.method());
        if let Ok(mut traced) = self.traced.lock() {
            traced.insert(request.id.clone(), span);
        }
    }

    /// Track a message from the client: a request's id is in flight until
    /// answered (`Err` with the refusal when it already is); a cancellation
    /// frees its id, because rmcp then drops the answer.
    fn track(&self, message: &RxJsonRpcMessage<RoleServer>) -> Result<(), Value> {
        let Ok(mut in_flight) = self.in_flight.lock() else {
            return Ok(());
        };
        match message {
            JsonRpcMessage::Request(request) => {
                if !in_flight.insert(request.id.clone()) {
                    let id = request.id.clone().into_json_value();
                    return Err(json!({
                        "jsonrpc": "2.0",
                        "id": id,
                        "error": {
                            "code": INVALID_REQUEST,
                            "message": format!("request id {id} is already in flight in this session; ids must not be reused"),
                        },
                    }));
                }
            }
            JsonRpcMessage::Notification(notification) => {
                if let ClientNotification::CancelledNotification(cancelled) =
                    &notification.notification
                    && let Some(id) = &cancelled.params.request_id
                {
                    in_flight.remove(id);
                    if let Ok(mut traced) = self.traced.lock() {
                        traced.remove(id);
                    }
                }
            }
            JsonRpcMessage::Response(_) | JsonRpcMessage::Error(_) => {}
        }
        Ok(())
    }

    /// The message on the completed line, or the error answer it earns.
    fn parse_line(
        &self,
        line: Line,
    ) -> Result<Option<RxJsonRpcMessage<RoleServer>>, Option<Value>> {
        let line = match line {
            Line::Message(line) => line,
            Line::TooLong(size) => {
                let head = self.reader.too_long_head();
                let head = head.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(head);
                return Err(answer(
                    head,
                    INVALID_REQUEST,
                    format!(
                        "a message of {size} bytes or more; at most {MAX_LINE_BYTES} on one line"
                    ),
                ));
            }
        };
        let text = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(&line);
        if text.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        if std::str::from_utf8(text).is_err() {
            return Err(answer(
                text,
                PARSE_ERROR,
                "parse error: the message is not UTF-8".to_owned(),
            ));
        }
        match serde_json::from_slice::<RxJsonRpcMessage<RoleServer>>(text) {
            Ok(message) => Ok(Some(message)),
            Err(error) => {
                let (code, what) = match error.classify() {
                    serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                        (PARSE_ERROR, "parse error")
                    }
                    serde_json::error::Category::Data | serde_json::error::Category::Io => {
                        if let Some(refused) = refused_id(text) {
                            return Err(Some(refused));
                        }
                        if is_request_shaped(text) {
                            (INVALID_PARAMS, "invalid params")
                        } else {
                            (INVALID_REQUEST, "invalid request")
                        }
                    }
                };
                if text.first() == Some(&b'[') {
                    return Err(answer(
                        text,
                        INVALID_REQUEST,
                        "invalid request: JSON-RPC batches are not accepted; send one message per line".to_owned(),
                    ));
                }
                Err(answer(text, code, format!("{what}: {error}")))
            }
        }
    }

    /// Answer a line the transport itself refuses. Written from its own task:
    /// rmcp may drop the receiving future mid-await, which must never cut a
    /// line in half.
    fn answer_line(&self, answer: Value) {
        let writer = Arc::clone(&self.writer);
        tokio::spawn(async move {
            if let Err(error) = Self::write(&writer, answer.to_string().into_bytes()).await {
                tracing::warn!("answering a bad line: {error}");
            }
        });
    }

    async fn write(writer: &Mutex<W>, mut bytes: Vec<u8>) -> std::io::Result<()> {
        bytes.push(b'\n');
        let mut writer = writer.lock().await;
        writer.write_all(&bytes).await?;
        writer.flush().await
    }
}

/// The answer to well-formed JSON with a method and an id that is neither a
/// string nor an integer (`"id": null`): a malformed request, not a
/// notification, answered as `box serve` answers it.
fn refused_id(text: &[u8]) -> Option<Value> {
    let message = serde_json::from_slice::<Value>(text).ok()?;
    match jsonrpc::classify(&message) {
        Err(error @ jsonrpc::MessageError::InvalidId) => Some(jsonrpc::refusal(&message, &error)),
        _ => None,
    }
}

/// Whether well-formed JSON that no message type took is still a request
/// (`jsonrpc` 2.0, an id, a method name), so its params must be what failed.
fn is_request_shaped(text: &[u8]) -> bool {
    let Ok(Value::Object(message)) = serde_json::from_slice::<Value>(text) else {
        return false;
    };
    message.get("jsonrpc") == Some(&json!("2.0"))
        && message.get("method").is_some_and(Value::is_string)
        && message
            .get("id")
            .is_some_and(|id| id.is_string() || id.is_number())
}

/// The shared refusal of a `server/discover` request of the handshake era
/// (no version in its `_meta`; `proxy::discover_refusal`).
fn discover_probe(message: &RxJsonRpcMessage<RoleServer>) -> Option<Value> {
    let JsonRpcMessage::Request(request) = message else {
        return None;
    };
    // The stateless revision's discover (its version in `_meta`) is rmcp's.
    if !matches!(request.request, ClientRequest::DiscoverRequest(_))
        || request.request.get_meta().protocol_version().is_some()
    {
        return None;
    }
    let id = serde_json::to_value(&request.id).unwrap_or(Value::Null);
    Some(jsonrpc::discover_refusal(id))
}

/// The error answer for a bad line: with its `id` if one is found; none for a
/// notification (it has a method and no id), which gets no answer.
fn answer(line: &[u8], code: i64, message: String) -> Option<Value> {
    let (id, has_method) = scan_top_level(line);
    if id.is_none() && has_method {
        tracing::debug!("dropping a bad notification: {message}");
        return None;
    }
    Some(json!({
        "jsonrpc": "2.0",
        "id": id.unwrap_or(Value::Null),
        "error": {"code": code, "message": message},
    }))
}

/// The top-level `id` (a string or number) of a JSON object's text, and
/// whether it has a top-level `method`, found by scanning, not parsing: the
/// text may be too deep or too broken to parse.
fn scan_top_level(text: &[u8]) -> (Option<Value>, bool) {
    let mut depth = 0usize;
    let mut index = 0;
    let mut id = None;
    let mut has_method = false;
    while index < text.len() {
        match text[index] {
            b'"' => {
                let end = string_end(text, index);
                if depth == 1 {
                    let key = &text[index..end];
                    let mut after = end;
                    while after < text.len() && text[after].is_ascii_whitespace() {
                        after += 1;
                    }
                    if text.get(after) == Some(&b':') {
                        if key == b"\"method\"" {
                            has_method = true;
                        } else if key == b"\"id\"" {
                            id = scalar_at(text, after + 1);
                        }
                    }
                }
                index = end;
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
        index += 1;
    }
    (id, has_method)
}

/// The index just past the string starting at `start` (a quote).
fn string_end(text: &[u8], start: usize) -> usize {
    let mut index = start + 1;
    while index < text.len() {
        match text[index] {
            b'\\' => index += 2,
            b'"' => return index + 1,
            _ => index += 1,
        }
    }
    text.len()
}

/// A JSON string or number value starting at or after `start`.
fn scalar_at(text: &[u8], start: usize) -> Option<Value> {
    let mut index = start;
    while index < text.len() && text[index].is_ascii_whitespace() {
        index += 1;
    }
    let end = match text.get(index)? {
        b'"' => string_end(text, index),
        b'-' | b'0'..=b'9' => {
            let mut end = index;
            while end < text.len()
                && matches!(text[end], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
            {
                end += 1;
            }
            end
        }
        _ => return None,
    };
    serde_json::from_slice(&text[index..end])
        .ok()
        .filter(|value: &Value| value.is_string() || value.is_number())
}

impl<R, W> rmcp::transport::Transport<RoleServer> for LineTransport<R, W>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let answered = match &item {
            JsonRpcMessage::Response(response) => Some(&response.id),
            JsonRpcMessage::Error(error) => {
                // The client's to act on, logged for the operator in words
                // (rmcp's own line prints the error's `Debug` form).
                let id = error.id.as_ref().map(ToString::to_string);
                tracing::info!(
                    id,
                    code = error.error.code.0,
                    error = %error.error.message,
                    "answered a request with an error"
                );
                error.id.as_ref()
            }
            JsonRpcMessage::Request(_) | JsonRpcMessage::Notification(_) => None,
        };
        if let Some(id) = answered
            && let Ok(mut in_flight) = self.in_flight.lock()
        {
            in_flight.remove(id);
        }
        let span = answered.and_then(|id| self.traced.lock().ok()?.remove(id));
        if let Some(mut span) = span {
            match &item {
                JsonRpcMessage::Response(response) => {
                    if let ServerResult::CallToolResult(result) = &response.result
                        && result.is_error == Some(true)
                    {
                        span.set_error("tool_error");
                    }
                }
                _ => span.set_error("jsonrpc_error"),
            }
            match self.spans.keep(span.end()) {
                box_otel::Kept::First => self.send_spans(Some(box_otel::EXECUTOR_SPANS_DELAY)),
                box_otel::Kept::Full => self.send_spans(None),
                box_otel::Kept::Waiting => {}
            }
        }
        let writer = Arc::clone(&self.writer);
        async move {
            let mut bytes = Vec::with_capacity(4096);
            serde_json::to_writer(&mut bytes, &item).map_err(std::io::Error::other)?;
            Self::write(&writer, bytes).await
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            let line = match self.reader.next().await {
                Ok(Some(line)) => line,
                Ok(None) => return None,
                Err(error) => {
                    tracing::warn!("reading stdin: {error}");
                    return None;
                }
            };
            let parsed = self.parse_line(line).and_then(|message| match message {
                Some(message) => match discover_probe(&message) {
                    // Answered here, as `box serve` answers it: rmcp would
                    // first demand 2026-07-28 `_meta` fields of the probe.
                    Some(refused) => Err(Some(refused)),
                    None => self
                        .track(&message)
                        .map(|()| {
                            self.trace(&message);
                            Some(message)
                        })
                        .map_err(Some),
                },
                None => Ok(None),
            });
            match parsed {
                Ok(Some(message)) => return Some(message),
                Ok(None) => {}
                Err(None) => {}
                Err(Some(answer)) => self.answer_line(answer),
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        // The last spans go home before the executor ends.
        Self::write_spans(&self.writer, &self.spans).await?;
        self.writer.lock().await.flush().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line past the limit is answered with its id and its whole length,
    /// without being kept, and the next line is served.
    #[tokio::test]
    async fn an_over_long_line_is_answered_with_its_id_and_length() {
        use rmcp::transport::Transport;
        use tokio::io::AsyncReadExt;
        let (client, server) = tokio::io::duplex(1 << 20);
        let (server_read, server_write) = tokio::io::split(server);
        let (mut client_read, mut client_write) = tokio::io::split(client);
        let mut transport = LineTransport::new(server_read, server_write);
        let mut long = br#"{"jsonrpc":"2.0","id":41,"method":"ping","params":{"pad":""#.to_vec();
        long.resize(MAX_LINE_BYTES + 10, b'x');
        long.extend_from_slice(b"\"}}\r\n");
        let length = long.len() - 1;
        let client = tokio::spawn(async move {
            client_write.write_all(&long).await.unwrap();
            client_write
                .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":42,\"method\":\"ping\"}\n")
                .await
                .unwrap();
            client_write
        });
        let Some(JsonRpcMessage::Request(request)) = transport.receive().await else {
            panic!("the line after the long one is not served");
        };
        assert_eq!(request.id.into_json_value(), json!(42));
        let mut answer = Vec::new();
        while !answer.ends_with(b"\n") {
            let mut byte = [0u8; 1];
            client_read.read_exact(&mut byte).await.unwrap();
            answer.push(byte[0]);
        }
        let answer: Value = serde_json::from_slice(&answer).unwrap();
        assert_eq!(answer["id"], json!(41));
        assert_eq!(answer["error"]["code"], json!(INVALID_REQUEST));
        assert_eq!(
            answer["error"]["message"],
            json!(format!(
                "a message of {length} bytes or more; at most {MAX_LINE_BYTES} on one line"
            ))
        );
        drop(client.await.unwrap());
    }

    #[test]
    fn ids_are_found_without_parsing() {
        assert_eq!(
            scan_top_level(br#"{"jsonrpc":"2.0","id":7,"method":"x","params":[[[["#),
            (Some(json!(7)), true)
        );
        assert_eq!(
            scan_top_level(br#"{"params":{"id":1},"id":"a\"b"}"#),
            (Some(json!("a\"b")), false)
        );
        assert_eq!(
            scan_top_level(br#"{"method":"notifications/x","params":"#),
            (None, true)
        );
        assert_eq!(scan_top_level(b"garbage"), (None, false));
    }

    #[test]
    fn wrong_param_types_are_invalid_params() {
        assert!(is_request_shaped(
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":5}}"#
        ));
        assert!(!is_request_shaped(
            br#"{"jsonrpc":"2.0","id":1,"params":{}}"#
        ));
        assert!(!is_request_shaped(
            br#"[{"jsonrpc":"2.0","id":1,"method":"x"}]"#
        ));
    }

    #[test]
    fn a_null_id_is_a_malformed_request_not_a_notification() {
        let answer = refused_id(br#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#).unwrap();
        assert_eq!(answer["id"], Value::Null);
        assert_eq!(answer["error"]["code"], json!(INVALID_REQUEST));
        assert_eq!(refused_id(br#"{"jsonrpc":"2.0","method":"x"}"#), None);
    }

    #[test]
    fn bad_notifications_get_no_answer() {
        assert_eq!(
            answer(br#"{"method":"x","params":["#, PARSE_ERROR, "e".to_owned()),
            None
        );
        assert_eq!(
            answer(
                br#"{"id":3,"method":"x","params":["#,
                PARSE_ERROR,
                "e".to_owned()
            ),
            Some(
                json!({"jsonrpc": "2.0", "id": 3, "error": {"code": PARSE_ERROR, "message": "e"}})
            )
        );
    }
}
