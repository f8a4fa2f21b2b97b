//! The executor's spans, carried home over the wire it already has: a unit
//! usually has no network to a collector, so the host sends a forwarded
//! request's context as `_meta["box/traceparent"]`, the executor records
//! its spans with ids and times alone (no SDK: [`Recording`]) and sends
//! them as a `notifications/box/spans` line just before its answer, which
//! the host never passes on to the client: it exports them
//! ([`read_executor_spans`]), checked to belong where the host put them.

use serde_json::{Map, Value, json};

use crate::context::{SpanContext, decode_hex, hex, new_span_id, now_unix_nanos};
use crate::span::{AttrValue, SpanData, SpanKind};

/// The `_meta` key of a forwarded request's context, for the executor.
pub const EXECUTOR_TRACEPARENT: &str = "box/traceparent";
/// The method of the executor's notification carrying a request's spans
/// (`{requestId, spans}`), for the host alone.
pub const EXECUTOR_SPANS: &str = "notifications/box/spans";

/// At most this many spans are taken from one answer.
const MAX_SPANS: usize = 32;
/// At most this many attributes per span; text cut at this many bytes.
const MAX_ATTRIBUTES: usize = 16;
const MAX_TEXT: usize = 256;

/// A span the executor records: its ids, its name, its start; finished
/// into the JSON the host reads back.
#[derive(Debug, Clone)]
pub struct Recording {
    context: SpanContext,
    parent: [u8; 8],
    name: String,
    start: u64,
    attributes: Map<String, Value>,
    error: Option<String>,
}

impl Recording {
    /// A span whose parent is `parent` (the host's, from the request).
    pub fn start(parent: &SpanContext, name: String) -> Self {
        Self {
            context: SpanContext {
                span_id: new_span_id(),
                ..parent.clone()
            },
            parent: parent.span_id,
            name,
            start: now_unix_nanos(),
            attributes: Map::new(),
            error: None,
        }
    }

    /// The parent the host named: a request's `_meta["box/traceparent"]`.
    pub fn parent_in(traceparent: Option<&Value>) -> Option<SpanContext> {
        SpanContext::parse(traceparent?.as_str()?, None)
    }

    /// A child of this span.
    pub fn child(&self, name: String) -> Self {
        Self::start(&self.context, name)
    }

    pub fn set(&mut self, key: &str, value: impl Into<Value>) {
        self.attributes.insert(key.to_owned(), value.into());
    }

    pub fn set_error(&mut self, error_type: &str) {
        self.error = Some(error_type.to_owned());
    }

    /// The finished span, as the host reads it.
    pub fn finish(self) -> Value {
        let mut span = json!({
            "traceId": hex(&self.context.trace_id),
            "spanId": hex(&self.context.span_id),
            "parentSpanId": hex(&self.parent),
            "name": self.name,
            "start": self.start,
            "end": now_unix_nanos(),
            "attributes": self.attributes,
        });
        if let Some(error) = self.error {
            span["error"] = json!(error);
        }
        span
    }
}

/// The executor's notification of `spans`, the spans of its request
/// `request_id`.
pub fn executor_spans_notification(request_id: Value, spans: Vec<Value>) -> Value {
    json!({
        "jsonrpc": "2.0",
        "method": EXECUTOR_SPANS,
        "params": {"requestId": request_id, "spans": spans},
    })
}

/// Whether `message` (from an executor) is its spans' notification: the
/// host takes it whether it traces or not, so it never reaches a client.
pub fn is_executor_spans(message: &Value) -> bool {
    message.get("method").and_then(Value::as_str) == Some(EXECUTOR_SPANS)
}

/// The request id (at the unit) a spans notification is for.
pub fn executor_spans_request(message: &Value) -> Option<u64> {
    message.pointer("/params/requestId")?.as_u64()
}

/// The spans of an executor's notification that belong under `parent`
/// (the host's span of the request): the same trace, parented by `parent`
/// or by another span of the same notification. Text passes `redact`;
/// counts and lengths are bounded, so a unit cannot flood the export.
pub fn read_executor_spans(
    message: &Value,
    parent: Option<&SpanContext>,
    redact: impl Fn(&str) -> String,
) -> Vec<SpanData> {
    let (Some(parent), Some(Value::Array(spans))) = (parent, message.pointer("/params/spans"))
    else {
        return Vec::new();
    };
    let mut known = vec![parent.span_id];
    let mut taken = Vec::new();
    for span in spans.iter().take(MAX_SPANS) {
        let id = |key: &str| span.get(key).and_then(Value::as_str).and_then(decode_hex);
        let (Some(trace), Some(own), Some(parent_id)) =
            (id("traceId"), id("spanId"), id("parentSpanId"))
        else {
            continue;
        };
        let (Ok(own), Ok(parent_id)) = (<[u8; 8]>::try_from(own), <[u8; 8]>::try_from(parent_id))
        else {
            continue;
        };
        if trace != parent.trace_id || own == [0; 8] || known.contains(&own) {
            continue;
        }
        known.push(own);
        taken.push((own, parent_id, span));
    }
    taken
        .into_iter()
        .filter(|(_, parent_id, _)| known.contains(parent_id))
        .map(|(own, parent_id, span)| {
            let number = |key: &str| span.get(key).and_then(Value::as_u64).unwrap_or(0);
            let text = |value: &str| {
                let mut text = redact(value);
                if text.len() > MAX_TEXT {
                    let mut cut = MAX_TEXT;
                    while !text.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    text.truncate(cut);
                }
                text
            };
            let attributes = span
                .get("attributes")
                .and_then(Value::as_object)
                .map(|attributes| {
                    attributes
                        .iter()
                        .take(MAX_ATTRIBUTES)
                        .filter_map(|(key, value)| {
                            let value = match value {
                                Value::String(value) => AttrValue::Str(text(value)),
                                Value::Bool(flag) => AttrValue::Bool(*flag),
                                Value::Number(number) => match number.as_i64() {
                                    Some(int) => AttrValue::Int(int),
                                    None => AttrValue::Double(number.as_f64()?),
                                },
                                _ => return None,
                            };
                            // A key is a plain name or nothing: never free text.
                            key.bytes()
                                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
                                .then(|| (key.chars().take(64).collect(), value))
                        })
                        .collect()
                })
                .unwrap_or_default();
            SpanData {
                context: SpanContext {
                    span_id: own,
                    ..parent.clone()
                },
                parent_span_id: Some(parent_id),
                name: text(
                    span.get("name")
                        .and_then(Value::as_str)
                        .unwrap_or("executor"),
                ),
                kind: SpanKind::Internal,
                start: number("start"),
                end: number("end"),
                attributes,
                error: span.get("error").and_then(Value::as_str).map(text),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn the_executors_spans_come_home_under_the_hosts_span() {
        let host = SpanContext::root();
        let mut meta = Map::new();
        meta.insert(EXECUTOR_TRACEPARENT.to_owned(), json!(host.traceparent()));
        let parent = Recording::parent_in(meta.get(EXECUTOR_TRACEPARENT)).unwrap();
        let mut tool = Recording::start(&parent, "execute_tool bash".to_owned());
        tool.set("gen_ai.tool.name", "bash");
        tool.set("note", "token hunter2");
        tool.set("free text key", "dropped");
        let process = tool.child("process".to_owned()).finish();
        let stranger = Recording::start(&SpanContext::root(), "elsewhere".to_owned()).finish();
        let tool = tool.finish();
        let message = executor_spans_notification(json!(7), vec![tool, process, stranger]);
        assert!(is_executor_spans(&message));
        assert_eq!(executor_spans_request(&message), Some(7));
        let spans = read_executor_spans(&message, Some(&host), |text| {
            text.replace("hunter2", "[REDACTED]")
        });
        assert_eq!(spans.len(), 2, "the span of another trace is dropped");
        assert_eq!(spans[0].name, "execute_tool bash");
        assert_eq!(spans[0].parent_span_id, Some(host.span_id));
        assert_eq!(spans[0].context.trace_id, host.trace_id);
        assert_eq!(spans[1].parent_span_id, Some(spans[0].context.span_id));
        assert!(spans[0].attributes.contains(&(
            "note".to_owned(),
            AttrValue::Str("token [REDACTED]".to_owned())
        )));
        assert!(!spans[0].attributes.iter().any(|(key, _)| key.contains(' ')));
        assert!(read_executor_spans(&message, None, str::to_owned).is_empty());
    }
}
