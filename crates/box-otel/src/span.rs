//! Spans: what one records (`Span`, ended when dropped) and what is
//! exported (`SpanData`).

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use crate::context::{SpanContext, now_unix_nanos};
use crate::export::Shared;

/// What a span is to its trace (OTLP's `SpanKind`, the ones box uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    /// Work inside box (a unit's start, the executor's run of a tool).
    Internal,
    /// A request box answers for its client.
    Server,
    /// A request box sends on (to a unit's executor).
    Client,
}

/// An attribute's value.
#[derive(Debug, Clone, PartialEq)]
pub enum AttrValue {
    Str(String),
    Int(i64),
    Bool(bool),
    Double(f64),
}

impl From<String> for AttrValue {
    fn from(text: String) -> Self {
        Self::Str(text)
    }
}
impl From<&str> for AttrValue {
    fn from(text: &str) -> Self {
        Self::Str(text.to_owned())
    }
}
impl From<i64> for AttrValue {
    fn from(number: i64) -> Self {
        Self::Int(number)
    }
}
impl From<u64> for AttrValue {
    fn from(number: u64) -> Self {
        Self::Int(i64::try_from(number).unwrap_or(i64::MAX))
    }
}
impl From<bool> for AttrValue {
    fn from(flag: bool) -> Self {
        Self::Bool(flag)
    }
}

/// A finished span, as exported.
#[derive(Debug, Clone, PartialEq)]
pub struct SpanData {
    /// Its trace, its own id, the trace's flags and state.
    pub context: SpanContext,
    pub parent_span_id: Option<[u8; 8]>,
    pub name: String,
    pub kind: SpanKind,
    /// Nanoseconds since the Unix epoch.
    pub start: u64,
    pub end: u64,
    pub attributes: Vec<(String, AttrValue)>,
    /// The status's message when the span failed (its `error.type`).
    pub error: Option<String>,
}

/// A span being recorded: ended (and queued for export) when dropped or
/// [`Span::end`]ed. A span of a tracer that is off records nothing and
/// costs one `None`.
#[derive(Default)]
pub struct Span {
    open: Option<Box<Open>>,
}

struct Open {
    shared: Arc<Shared>,
    data: SpanData,
    started: Instant,
}

impl fmt::Debug for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.open {
            Some(open) => write!(f, "Span({})", open.data.name),
            None => f.write_str("Span(off)"),
        }
    }
}

impl Span {
    /// A span that records nothing.
    pub fn none() -> Self {
        Self { open: None }
    }

    pub(crate) fn open(
        shared: Arc<Shared>,
        kind: SpanKind,
        parent: Option<&SpanContext>,
        name: String,
    ) -> Self {
        let (context, parent_span_id) = match parent {
            Some(parent) => (parent.child(), Some(parent.span_id)),
            None => (SpanContext::root(), None),
        };
        Self {
            open: Some(Box::new(Open {
                shared,
                data: SpanData {
                    context,
                    parent_span_id,
                    name,
                    kind,
                    start: now_unix_nanos(),
                    end: 0,
                    attributes: Vec::new(),
                    error: None,
                },
                started: Instant::now(),
            })),
        }
    }

    /// Whether this span records (its tracer is on).
    pub fn is_recording(&self) -> bool {
        self.open.is_some()
    }

    /// Its context, for its children and the `traceparent` sent on.
    pub fn context(&self) -> Option<&SpanContext> {
        self.open.as_ref().map(|open| &open.data.context)
    }

    /// Set an attribute (a later value of the same key replaces it).
    pub fn set(&mut self, key: &str, value: impl Into<AttrValue>) {
        if let Some(open) = &mut self.open {
            let value = value.into();
            match open
                .data
                .attributes
                .iter_mut()
                .find(|(name, _)| name == key)
            {
                Some((_, old)) => *old = value,
                None => open.data.attributes.push((key.to_owned(), value)),
            }
        }
    }

    /// Set an attribute computed only when the span records.
    pub fn set_with<V: Into<AttrValue>>(&mut self, key: &str, value: impl FnOnce() -> V) {
        if self.open.is_some() {
            self.set(key, value());
        }
    }

    /// Rename the span (a request's target known only later).
    pub fn rename(&mut self, name: impl FnOnce() -> String) {
        if let Some(open) = &mut self.open {
            open.data.name = name();
        }
    }

    /// Mark the span failed: `error.type` (the conventions' attribute) and
    /// the status's message say `error_type`.
    pub fn set_error(&mut self, error_type: &str) {
        if self.open.is_some() {
            self.set("error.type", error_type);
            if let Some(open) = &mut self.open {
                open.data.error = Some(error_type.to_owned());
            }
        }
    }

    /// Drop the span unrecorded (what it measured turned out not to happen).
    pub fn discard(mut self) {
        self.open = None;
    }

    /// End the span now.
    pub fn end(self) {
        drop(self);
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        if let Some(open) = self.open.take() {
            let Open {
                shared,
                mut data,
                started,
            } = *open;
            let elapsed = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
            data.end = data.start.saturating_add(elapsed);
            shared.send(data);
        }
    }
}
