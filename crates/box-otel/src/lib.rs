//! OpenTelemetry for box, all of it in one place: W3C trace context
//! (`context`), spans (`span`), OTLP/HTTP protobuf written by hand
//! (`proto`) and exported by one task (`export`), and the executor's spans
//! carried home beside its answers (`wire`). The executor uses only the
//! context and `wire::Recording` (ids and times); the host holds the
//! [`Tracer`].
//!
//! No OpenTelemetry SDK or protobuf crate: the messages a trace export
//! needs are a few dozen lines of protobuf, and the client is one HTTP/1.1
//! POST over tokio, so tracing adds no package to box's tree.

mod context;
mod export;
mod proto;
mod span;
mod wire;

pub use context::{
    SpanContext, TRACEPARENT, TRACESTATE, hex, new_span_id, new_trace_id, now_unix_nanos,
};
pub use export::{Endpoint, ExportConfig, Tracer};
pub use span::{AttrValue, Span, SpanData, SpanKind};
pub use wire::{
    EXECUTOR_SPANS, EXECUTOR_SPANS_BATCH, EXECUTOR_SPANS_DELAY, EXECUTOR_SPANS_PREFIX,
    EXECUTOR_TRACEPARENT, Ended, ExecutorParents, Kept, Pending, Recording, is_executor_spans,
    is_executor_spans_line, read_executor_spans,
};
