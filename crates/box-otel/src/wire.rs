//! The executor's spans, carried home over the wire it already has: a unit
//! usually has no network to a collector, so the host sends a forwarded
//! request's context as `_meta["box/traceparent"]`, the executor records
//! its spans with ids and times alone (no SDK: [`Recording`]) and sends
//! them home in batches ([`Pending`]): one `notifications/box/spans` line
//! for many calls, a moment after the first of them, never on a call's own
//! path (a line per call measured +100 µs a call in a debug build,
//! BENCHMARKS.md "Tracing"). The host never passes the line on to a
//! client: it exports the spans ([`read_executor_spans`]), each checked to
//! hang under a span the host sent that unit ([`ExecutorParents`]).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;

use crate::context::{SpanContext, decode_hex, hex, new_span_id, now_unix_nanos};
use crate::span::{AttrValue, SpanData, SpanKind};

/// The `_meta` key of a forwarded request's context, for the executor.
pub const EXECUTOR_TRACEPARENT: &str = "box/traceparent";
/// The method of the executor's notification carrying its ended spans
/// (`{spans}`), for the host alone.
pub const EXECUTOR_SPANS: &str = "notifications/box/spans";

/// How long the executor keeps its first ended span before sending the
/// batch home: far below the host's export delay (`OTEL_BSP_SCHEDULE_DELAY`,
/// 5 s by default), long enough that a busy session sends one line for
/// many calls.
pub const EXECUTOR_SPANS_DELAY: Duration = Duration::from_millis(200);
/// A batch this full goes home at once.
pub const EXECUTOR_SPANS_BATCH: usize = 64;

/// At most this many spans are taken from one notification.
const MAX_SPANS: usize = 4 * EXECUTOR_SPANS_BATCH;
/// At most this many attributes per span; text cut at this many bytes.
const MAX_ATTRIBUTES: usize = 16;
const MAX_TEXT: usize = 256;
/// How many of a session's forwarded spans wait for their executor's
/// spans; the oldest is forgotten first.
const MAX_PARENTS: usize = 1024;

/// A span the executor records: its ids, its name, its start. Cheap to
/// keep: nothing is made into JSON until its batch goes home.
#[derive(Debug, Clone)]
pub struct Recording {
    context: SpanContext,
    parent: [u8; 8],
    name: String,
    start: u64,
    attributes: Vec<(&'static str, Value)>,
    error: Option<String>,
}

/// A span the executor ended, waiting for its batch.
#[derive(Debug, Clone)]
pub struct Ended {
    span: Recording,
    end: u64,
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
            attributes: Vec::new(),
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

    pub fn set(&mut self, key: &'static str, value: impl Into<Value>) {
        let value = value.into();
        match self.attributes.iter_mut().find(|(name, _)| *name == key) {
            Some((_, old)) => *old = value,
            None => self.attributes.push((key, value)),
        }
    }

    pub fn set_error(&mut self, error_type: &str) {
        self.error = Some(error_type.to_owned());
    }

    /// End the span now.
    pub fn end(self) -> Ended {
        Ended {
            span: self,
            end: now_unix_nanos(),
        }
    }
}

impl Ended {
    /// The span's JSON, written straight into `out`: a batch of them is
    /// written on the executor's one thread, between calls.
    fn write_json(&self, out: &mut Vec<u8>) {
        use std::io::Write as _;
        let span = &self.span;
        let _ = write!(
            out,
            r#"{{"traceId":"{}","spanId":"{}","parentSpanId":"{}","start":{},"end":{},"name":"#,
            hex(&span.context.trace_id),
            hex(&span.context.span_id),
            hex(&span.parent),
            span.start,
            self.end,
        );
        let _ = serde_json::to_writer(&mut *out, &span.name);
        out.extend_from_slice(br#","attributes":{"#);
        for (index, (key, value)) in span.attributes.iter().enumerate() {
            if index > 0 {
                out.push(b',');
            }
            let _ = serde_json::to_writer(&mut *out, key);
            out.push(b':');
            let _ = serde_json::to_writer(&mut *out, value);
        }
        out.push(b'}');
        if let Some(error) = &span.error {
            out.extend_from_slice(br#","error":"#);
            let _ = serde_json::to_writer(&mut *out, error);
        }
        out.push(b'}');
    }
}

/// The executor's ended spans waiting to go home together.
#[derive(Debug, Default)]
pub struct Pending {
    spans: Mutex<Vec<Ended>>,
}

/// What keeping a span asks of the executor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    /// The first of a batch: send the batch in [`EXECUTOR_SPANS_DELAY`].
    First,
    /// The batch is full: send it now.
    Full,
    /// Nothing: a send is already due.
    Waiting,
}

impl Pending {
    /// Keep `span` for the next batch.
    pub fn keep(&self, span: Ended) -> Kept {
        let Ok(mut spans) = self.spans.lock() else {
            return Kept::Waiting;
        };
        spans.push(span);
        match spans.len() {
            EXECUTOR_SPANS_BATCH.. => Kept::Full,
            1 => Kept::First,
            _ => Kept::Waiting,
        }
    }

    /// The line (no newline) of the notification of every span kept,
    /// `None` when there is none.
    pub fn take(&self) -> Option<Vec<u8>> {
        let spans = std::mem::take(&mut *self.spans.lock().ok()?);
        if spans.is_empty() {
            return None;
        }
        let mut line = Vec::with_capacity(64 + spans.len() * 400);
        line.extend_from_slice(br#"{"jsonrpc":"2.0","method":""#);
        line.extend_from_slice(EXECUTOR_SPANS.as_bytes());
        line.extend_from_slice(br#"","params":{"spans":["#);
        for (index, span) in spans.iter().enumerate() {
            if index > 0 {
                line.push(b',');
            }
            span.write_json(&mut line);
        }
        line.extend_from_slice(b"]}}");
        Some(line)
    }
}

/// Whether `message` (from an executor) is its spans' notification: the
/// host takes it whether it traces or not, so it never reaches a client.
pub fn is_executor_spans(message: &Value) -> bool {
    message.get("method").and_then(Value::as_str) == Some(EXECUTOR_SPANS)
}

/// The host's spans of requests it sent on to a session's executors (with
/// `_meta["box/traceparent"]`), by span id, until each executor's spans
/// under them come home: only a span under one of them is exported, so a
/// unit cannot put spans into another trace. Bounded: the oldest is
/// forgotten first.
#[derive(Debug, Default)]
pub struct ExecutorParents {
    by_id: HashMap<[u8; 8], (usize, SpanContext)>,
    order: VecDeque<[u8; 8]>,
}

impl ExecutorParents {
    /// `context` was sent to executor `owner`.
    pub fn insert(&mut self, owner: usize, context: SpanContext) {
        while self.order.len() >= MAX_PARENTS {
            if let Some(oldest) = self.order.pop_front() {
                self.by_id.remove(&oldest);
            }
        }
        self.order.push_back(context.span_id);
        self.by_id.insert(context.span_id, (owner, context));
    }

    /// The context of span `id` if it was sent to executor `owner`; it is
    /// forgotten then.
    pub fn take(&mut self, owner: usize, id: &[u8; 8]) -> Option<SpanContext> {
        if self
            .by_id
            .get(id)
            .is_none_or(|(sent_to, _)| *sent_to != owner)
        {
            return None;
        }
        self.order.retain(|kept| kept != id);
        self.by_id.remove(id).map(|(_, context)| context)
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }
}

/// The spans of an executor's notification that belong under the host's
/// spans: each parented by a span `parent_of` knows (the host's span of a
/// request it sent that executor, taken once) or by another span of the
/// same notification, in the same trace. Text passes `redact`; counts and
/// lengths are bounded, so a unit cannot flood the export.
pub fn read_executor_spans(
    message: &Value,
    mut parent_of: impl FnMut(&[u8; 8]) -> Option<SpanContext>,
    redact: impl Fn(&str) -> String,
) -> Vec<SpanData> {
    let Some(Value::Array(spans)) = message.pointer("/params/spans") else {
        return Vec::new();
    };
    let mut left = Vec::new();
    for span in spans.iter().take(MAX_SPANS) {
        let id = |key: &str| span.get(key).and_then(Value::as_str).and_then(decode_hex);
        let (Some(trace), Some(own), Some(parent_id)) =
            (id("traceId"), id("spanId"), id("parentSpanId"))
        else {
            continue;
        };
        let (Ok(trace), Ok(own), Ok(parent_id)) = (
            <[u8; 16]>::try_from(trace),
            <[u8; 8]>::try_from(own),
            <[u8; 8]>::try_from(parent_id),
        ) else {
            continue;
        };
        if own != [0; 8] {
            left.push((trace, own, parent_id, span));
        }
    }
    // A child usually ends (and comes) before its parent: taken in rounds.
    let mut accepted: HashMap<[u8; 8], SpanContext> = HashMap::new();
    let mut hosts: HashMap<[u8; 8], Option<SpanContext>> = HashMap::new();
    let mut taken = Vec::new();
    let mut progress = true;
    while progress && !left.is_empty() {
        progress = false;
        left.retain(|(trace, own, parent_id, span)| {
            let parent = match accepted.get(parent_id) {
                Some(parent) => Some(parent.clone()),
                None => hosts
                    .entry(*parent_id)
                    .or_insert_with(|| parent_of(parent_id))
                    .clone(),
            };
            let Some(parent) = parent else {
                return true;
            };
            if parent.trace_id == *trace && !accepted.contains_key(own) {
                let context = SpanContext {
                    span_id: *own,
                    ..parent
                };
                accepted.insert(*own, context.clone());
                taken.push((context, *parent_id, *span));
                progress = true;
            }
            false
        });
    }
    taken
        .into_iter()
        .map(|(context, parent_id, span)| {
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
                context,
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
    use serde_json::{Map, json};

    #[test]
    fn the_executors_spans_come_home_under_the_hosts_span() {
        let host = SpanContext::root();
        let other_call = SpanContext::root();
        let mut parents = ExecutorParents::default();
        parents.insert(0, host.clone());
        parents.insert(0, other_call.clone());
        let mut meta = Map::new();
        meta.insert(EXECUTOR_TRACEPARENT.to_owned(), json!(host.traceparent()));
        let parent = Recording::parent_in(meta.get(EXECUTOR_TRACEPARENT)).unwrap();
        let mut tool = Recording::start(&parent, "execute_tool bash".to_owned());
        tool.set("gen_ai.tool.name", "bash");
        tool.set("note", "token hunter2");
        tool.set("free text key", "dropped");
        let pending = Pending::default();
        // The child ends first, so it comes before its parent.
        assert_eq!(
            pending.keep(tool.child("process".to_owned()).end()),
            Kept::First
        );
        let stranger = Recording::start(&SpanContext::root(), "elsewhere".to_owned());
        assert_eq!(pending.keep(stranger.end()), Kept::Waiting);
        assert_eq!(pending.keep(tool.end()), Kept::Waiting);
        let second = Recording::start(&other_call, "execute_tool read".to_owned());
        assert_eq!(pending.keep(second.end()), Kept::Waiting);
        let line = pending.take().unwrap();
        assert!(pending.take().is_none(), "a batch goes home once");
        let message: Value = serde_json::from_slice(&line).unwrap();
        assert!(is_executor_spans(&message));
        // Another unit's executor cannot claim the host's spans.
        assert!(read_executor_spans(&message, |id| parents.take(1, id), str::to_owned).is_empty());
        let spans = read_executor_spans(
            &message,
            |id| parents.take(0, id),
            |text| text.replace("hunter2", "[REDACTED]"),
        );
        assert_eq!(spans.len(), 3, "the span of another trace is dropped");
        let by_name = |name: &str| spans.iter().find(|span| span.name == name).unwrap();
        let (tool, process) = (by_name("execute_tool bash"), by_name("process"));
        assert_eq!(tool.parent_span_id, Some(host.span_id));
        assert_eq!(tool.context.trace_id, host.trace_id);
        assert_eq!(process.parent_span_id, Some(tool.context.span_id));
        assert_eq!(
            by_name("execute_tool read").parent_span_id,
            Some(other_call.span_id)
        );
        assert!(tool.attributes.contains(&(
            "note".to_owned(),
            AttrValue::Str("token [REDACTED]".to_owned())
        )));
        assert!(!tool.attributes.iter().any(|(key, _)| key.contains(' ')));
        assert!(parents.is_empty(), "each host span is taken once");
        assert!(
            read_executor_spans(&message, |id| parents.take(0, id), str::to_owned).is_empty(),
            "a batch sent again is not exported twice"
        );
    }

    #[test]
    fn a_full_batch_goes_at_once_and_parents_are_bounded() {
        let pending = Pending::default();
        let parent = SpanContext::root();
        for count in 1..EXECUTOR_SPANS_BATCH {
            let kept = pending.keep(Recording::start(&parent, "x".to_owned()).end());
            assert_eq!(kept == Kept::First, count == 1);
        }
        assert_eq!(
            pending.keep(Recording::start(&parent, "x".to_owned()).end()),
            Kept::Full
        );
        let mut parents = ExecutorParents::default();
        let first = SpanContext::root();
        parents.insert(0, first.clone());
        for _ in 0..MAX_PARENTS {
            parents.insert(0, SpanContext::root());
        }
        assert_eq!(parents.len(), MAX_PARENTS);
        assert!(
            parents.take(0, &first.span_id).is_none(),
            "the oldest is forgotten"
        );
    }
}
