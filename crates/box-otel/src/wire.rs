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

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;

use crate::context::{SpanContext, decode_into, hex, new_span_id, now_unix_nanos};
use crate::span::{AttrValue, SpanData, SpanKind};

/// The `_meta` key of a forwarded request's context, for the executor.
pub const EXECUTOR_TRACEPARENT: &str = "box/traceparent";
/// The method of the executor's notification carrying its ended spans
/// (`{spans}`), for the host alone.
pub const EXECUTOR_SPANS: &str = "notifications/box/spans";
/// How the executor's spans line begins, as [`Pending`] writes it: the host
/// tells it from an answer by these bytes, before any JSON is parsed.
pub const EXECUTOR_SPANS_PREFIX: &[u8] =
    br#"{"jsonrpc":"2.0","method":"notifications/box/spans","params":{"spans":["#;

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
            r#"{{"spanId":"{}","parentSpanId":"{}","start":{},"end":{},"name":"#,
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
        line.extend_from_slice(EXECUTOR_SPANS_PREFIX);
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
        while self.by_id.len() >= MAX_PARENTS {
            match self.order.pop_front() {
                Some(oldest) => {
                    self.by_id.remove(&oldest);
                }
                None => break,
            }
        }
        // Taken ones are dropped from the order lazily (a take is on every
        // traced call's way home): here, once they are as many as the kept.
        if self.order.len() >= 2 * MAX_PARENTS {
            let by_id = &self.by_id;
            self.order.retain(|kept| by_id.contains_key(kept));
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
        self.by_id.remove(id).map(|(_, context)| context)
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }
}

/// Whether `line` (from an executor, one JSON line) is its spans'
/// notification as box's executor writes it ([`EXECUTOR_SPANS_PREFIX`]):
/// read with [`read_executor_spans`] without making it a `Value` first.
pub fn is_executor_spans_line(line: &[u8]) -> bool {
    line.starts_with(EXECUTOR_SPANS_PREFIX)
}

/// One span of the executor's line, borrowed from it. No trace id: a span's
/// is its parent's, which the host keeps ([`ExecutorParents`]).
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireSpan<'a> {
    #[serde(borrow, default)]
    span_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    parent_span_id: Option<Cow<'a, str>>,
    #[serde(default)]
    start: u64,
    #[serde(default)]
    end: u64,
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    attributes: WireAttributes<'a>,
    #[serde(borrow, default)]
    error: Option<Cow<'a, str>>,
}

/// A span's attributes in the order sent; values other than a string, a
/// bool or a number are dropped.
#[derive(Default)]
struct WireAttributes<'a>(Vec<(Cow<'a, str>, Option<AttrValue>)>);

impl<'de: 'a, 'a> serde::Deserialize<'de> for WireAttributes<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = WireAttributes<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object of attributes")
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(
                self,
                mut map: M,
            ) -> Result<Self::Value, M::Error> {
                let mut kept = Vec::new();
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    let WireValue(value) = map.next_value()?;
                    if kept.len() < MAX_ATTRIBUTES {
                        kept.push((key, value));
                    }
                }
                Ok(WireAttributes(kept))
            }
        }
        deserializer.deserialize_map(Visit(std::marker::PhantomData))
    }
}

/// An attribute's value as sent.
struct WireValue(Option<AttrValue>);

impl<'de> serde::Deserialize<'de> for WireValue {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = WireValue;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an attribute's value")
            }
            fn visit_bool<E>(self, flag: bool) -> Result<WireValue, E> {
                Ok(WireValue(Some(AttrValue::Bool(flag))))
            }
            fn visit_i64<E>(self, number: i64) -> Result<WireValue, E> {
                Ok(WireValue(Some(AttrValue::Int(number))))
            }
            fn visit_u64<E>(self, number: u64) -> Result<WireValue, E> {
                Ok(WireValue(Some(match i64::try_from(number) {
                    Ok(int) => AttrValue::Int(int),
                    #[allow(clippy::cast_precision_loss)]
                    Err(_) => AttrValue::Double(number as f64),
                })))
            }
            fn visit_f64<E>(self, number: f64) -> Result<WireValue, E> {
                Ok(WireValue(Some(AttrValue::Double(number))))
            }
            fn visit_str<E>(self, text: &str) -> Result<WireValue, E> {
                Ok(WireValue(Some(AttrValue::Str(text.to_owned()))))
            }
            fn visit_unit<E>(self) -> Result<WireValue, E> {
                Ok(WireValue(None))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<WireValue, A::Error> {
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(WireValue(None))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<WireValue, A::Error> {
                while map
                    .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(WireValue(None))
            }
        }
        deserializer.deserialize_any(Visit)
    }
}

/// Hex text of exactly `N` bytes.
fn id_of<const N: usize>(text: &str) -> Option<[u8; N]> {
    let mut id = [0u8; N];
    decode_into(text, &mut id).then_some(id)
}

/// The spans of an executor's notification line (one JSON line, as read)
/// that belong under the host's spans: each parented by a span `parent_of`
/// knows (the host's span of a request it sent that executor, taken once)
/// or by another span of the same notification, in its parent's trace. Text
/// passes `redact`; counts and lengths are bounded, so a unit cannot flood
/// the export. Read straight from the line's bytes, no `Value` made: a batch
/// of 64 spans is read on the host's serving thread.
pub fn read_executor_spans(
    line: &[u8],
    mut parent_of: impl FnMut(&[u8; 8]) -> Option<SpanContext>,
    redact: impl Fn(&str) -> String,
) -> Vec<SpanData> {
    // A line box's executor did not write drops whole.
    let Ok(line) = serde_json::from_slice::<WireLine<'_>>(line) else {
        return Vec::new();
    };
    let mut left = Vec::new();
    for span in line.params.spans.into_iter().take(MAX_SPANS) {
        let (Some(own), Some(parent_id)) = (
            span.span_id.as_deref().and_then(id_of::<8>),
            span.parent_span_id.as_deref().and_then(id_of::<8>),
        ) else {
            continue;
        };
        if own != [0; 8] {
            left.push((own, parent_id, span));
        }
    }
    // A child usually ends (and comes) before its parent: taken in rounds.
    let mut accepted: HashMap<[u8; 8], SpanContext> = HashMap::new();
    let mut hosts: HashMap<[u8; 8], Option<SpanContext>> = HashMap::new();
    let mut taken = Vec::new();
    let mut progress = true;
    while progress && !left.is_empty() {
        progress = false;
        let mut waiting = Vec::new();
        for (own, parent_id, span) in left {
            let parent = match accepted.get(&parent_id) {
                Some(parent) => Some(parent.clone()),
                None => hosts
                    .entry(parent_id)
                    .or_insert_with(|| parent_of(&parent_id))
                    .clone(),
            };
            let Some(parent) = parent else {
                waiting.push((own, parent_id, span));
                continue;
            };
            if let std::collections::hash_map::Entry::Vacant(slot) = accepted.entry(own) {
                let context = SpanContext {
                    span_id: own,
                    ..parent
                };
                slot.insert(context.clone());
                taken.push((context, parent_id, span));
                progress = true;
            }
        }
        left = waiting;
    }
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
    taken
        .into_iter()
        .map(|(context, parent_id, span)| {
            let attributes = span
                .attributes
                .0
                .into_iter()
                // A key is a plain name or nothing: never free text.
                .filter(|(key, _)| {
                    key.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
                })
                .filter_map(|(key, value)| {
                    let value = match value? {
                        AttrValue::Str(value) => AttrValue::Str(text(&value)),
                        other => other,
                    };
                    Some((key.chars().take(64).collect(), value))
                })
                .collect();
            SpanData {
                context,
                parent_span_id: Some(parent_id),
                name: text(span.name.as_deref().unwrap_or("executor")),
                kind: SpanKind::Internal,
                start: span.start,
                end: span.end,
                attributes,
                error: span.error.as_deref().map(text),
            }
        })
        .collect()
}

/// The executor's line, as far as the host reads it.
#[derive(serde::Deserialize)]
struct WireLine<'a> {
    #[serde(borrow)]
    params: WireParams<'a>,
}

#[derive(serde::Deserialize)]
struct WireParams<'a> {
    #[serde(borrow)]
    spans: Vec<WireSpan<'a>>,
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
        // A span's trace is its parent's: the line does not carry it.
        assert!(
            message["params"]["spans"][0].get("traceId").is_none(),
            "{message}"
        );
        assert!(is_executor_spans_line(&line));
        // Another unit's executor cannot claim the host's spans.
        assert!(read_executor_spans(&line, |id| parents.take(1, id), str::to_owned).is_empty());
        let spans = read_executor_spans(
            &line,
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
            read_executor_spans(&line, |id| parents.take(0, id), str::to_owned).is_empty(),
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
        // Taking is cheap and what was taken does not pile up.
        for _ in 0..10 * MAX_PARENTS {
            let context = SpanContext::root();
            parents.insert(1, context.clone());
            assert_eq!(parents.take(1, &context.span_id), Some(context));
        }
        assert!(
            parents.order.len() <= 2 * MAX_PARENTS,
            "{}",
            parents.order.len()
        );
        assert_eq!(parents.len(), MAX_PARENTS - 1);
    }
}
