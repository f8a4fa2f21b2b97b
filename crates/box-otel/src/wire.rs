//! The executor's spans, carried home over the wire it already has: a unit
//! usually has no network to a collector, so the host sends a forwarded
//! request's context as `_meta["box/traceparent"]`, the executor records
//! its spans with ids and times alone (no SDK: [`Recording`]) and returns
//! them in its result's `_meta["box/spans"]`, and the host takes them off
//! before the client sees the result and exports them
//! ([`take_executor_spans`]), checked to belong where the host put them.

use serde_json::{Map, Value, json};

use crate::context::{SpanContext, decode_hex, hex, new_span_id, now_unix_nanos};
use crate::span::{AttrValue, SpanData, SpanKind};

/// The `_meta` key of a forwarded request's context, for the executor.
pub const EXECUTOR_TRACEPARENT: &str = "box/traceparent";
/// The result `_meta` key of the executor's spans, for the host.
pub const EXECUTOR_SPANS: &str = "box/spans";

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

/// Take the executor's spans off a result (`result._meta["box/spans"]`,
/// the `_meta` removed when nothing else is left in it) and read those that
/// belong under `parent`: the same trace, parented by `parent` or by
/// another span of the same answer. Text attributes pass `redact`;
/// counts and lengths are bounded, so a unit cannot flood the export.
pub fn take_executor_spans(
    result: &mut Value,
    parent: Option<&SpanContext>,
    redact: impl Fn(&str) -> String,
) -> Vec<SpanData> {
    let Some(meta) = result.get_mut("_meta").and_then(Value::as_object_mut) else {
        return Vec::new();
    };
    let Some(spans) = meta.remove(EXECUTOR_SPANS) else {
        return Vec::new();
    };
    if meta.is_empty()
        && let Some(result) = result.as_object_mut()
    {
        result.remove("_meta");
    }
    let (Some(parent), Value::Array(spans)) = (parent, spans) else {
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
                            Some((text(key), value))
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
        let process = tool.child("process".to_owned()).finish();
        let stranger = Recording::start(&SpanContext::root(), "elsewhere".to_owned()).finish();
        let tool = tool.finish();
        let mut result =
            json!({"content": [], "_meta": {EXECUTOR_SPANS: [tool, process, stranger]}});
        let spans = take_executor_spans(&mut result, Some(&host), |text| {
            text.replace("hunter2", "[REDACTED]")
        });
        assert_eq!(result, json!({"content": []}));
        assert_eq!(spans.len(), 2, "the span of another trace is dropped");
        assert_eq!(spans[0].name, "execute_tool bash");
        assert_eq!(spans[0].parent_span_id, Some(host.span_id));
        assert_eq!(spans[0].context.trace_id, host.trace_id);
        assert_eq!(spans[1].parent_span_id, Some(spans[0].context.span_id));
        assert!(spans[0].attributes.contains(&(
            "note".to_owned(),
            AttrValue::Str("token [REDACTED]".to_owned())
        )));
    }

    #[test]
    fn spans_are_taken_off_even_when_the_host_is_not_tracing() {
        let mut result = json!({"_meta": {EXECUTOR_SPANS: [], "other": 1}});
        assert!(take_executor_spans(&mut result, None, str::to_owned).is_empty());
        assert_eq!(result, json!({"_meta": {"other": 1}}));
    }
}
