//! OTLP's protobuf, written by hand for the few messages a trace export
//! needs (`ExportTraceServiceRequest` down to `AnyValue`), so box needs no
//! protobuf crate: field numbers from opentelemetry-proto's
//! `trace/v1/trace.proto`, `common/v1/common.proto`,
//! `resource/v1/resource.proto` and `collector/trace/v1/trace_service.proto`.
//! The tests decode what this writes with the official definitions
//! (`opentelemetry-proto`, Python).

use crate::span::{AttrValue, SpanData, SpanKind};

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const FIXED32: u8 = 5;

fn key(out: &mut Vec<u8>, field: u32, wire: u8) {
    varint(out, u64::from(field << 3 | u32::from(wire)));
}

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn bytes(out: &mut Vec<u8>, field: u32, value: &[u8]) {
    key(out, field, LEN);
    varint(out, value.len() as u64);
    out.extend_from_slice(value);
}

fn string(out: &mut Vec<u8>, field: u32, value: &str) {
    if !value.is_empty() {
        bytes(out, field, value.as_bytes());
    }
}

/// A nested message, written in place after a one-byte length that is
/// widened (the message moved up) only when it turns out 128 bytes or
/// more: no buffer per message (an attribute is two), and a span's bytes
/// are moved once rather than copied at every level (encoding was 1.7 µs a
/// span with a `Vec` per message, on every traced call's CPU).
fn message(out: &mut Vec<u8>, field: u32, write: impl FnOnce(&mut Vec<u8>)) {
    key(out, field, LEN);
    let at = out.len();
    out.push(0);
    write(out);
    let length = out.len() - at - 1;
    if length < 0x80 {
        out[at] = length as u8;
    } else {
        let mut prefix = Vec::with_capacity(10);
        varint(&mut prefix, length as u64);
        out[at] = prefix[0];
        out.splice(at + 1..at + 1, prefix[1..].iter().copied());
    }
}

/// `KeyValue { string key = 1; AnyValue value = 2; }`
fn key_value(out: &mut Vec<u8>, field: u32, name: &str, value: &AttrValue) {
    message(out, field, |kv| {
        string(kv, 1, name);
        // AnyValue: string 1, bool 2, int64 3, double 4.
        message(kv, 2, |any| match value {
            AttrValue::Str(text) => bytes(any, 1, text.as_bytes()),
            AttrValue::Bool(flag) => {
                key(any, 2, VARINT);
                varint(any, u64::from(*flag));
            }
            AttrValue::Int(number) => {
                key(any, 3, VARINT);
                varint(any, *number as u64);
            }
            AttrValue::Double(number) => {
                key(any, 4, FIXED64);
                any.extend_from_slice(&number.to_le_bytes());
            }
        });
    });
}

/// `Span`: trace_id 1, span_id 2, trace_state 3, parent_span_id 4, name 5,
/// kind 6, start 7 (fixed64), end 8 (fixed64), attributes 9, status 15,
/// flags 16 (fixed32).
fn span(out: &mut Vec<u8>, data: &SpanData) {
    message(out, 2, |span| {
        bytes(span, 1, &data.context.trace_id);
        bytes(span, 2, &data.context.span_id);
        string(span, 3, &data.context.trace_state);
        if let Some(parent) = &data.parent_span_id {
            bytes(span, 4, parent);
        }
        string(span, 5, &data.name);
        key(span, 6, VARINT);
        varint(
            span,
            match data.kind {
                SpanKind::Internal => 1,
                SpanKind::Server => 2,
                SpanKind::Client => 3,
            },
        );
        key(span, 7, FIXED64);
        span.extend_from_slice(&data.start.to_le_bytes());
        key(span, 8, FIXED64);
        span.extend_from_slice(&data.end.max(data.start).to_le_bytes());
        for (name, value) in &data.attributes {
            key_value(span, 9, name, value);
        }
        // Status { string message = 2; StatusCode code = 3; }: ERROR is 2.
        if let Some(error) = &data.error {
            message(span, 15, |status| {
                string(status, 2, error);
                key(status, 3, VARINT);
                varint(status, 2);
            });
        }
        // W3C flags in the low byte; bit 8 says whether the parent is remote
        // is known (bit 9), which box leaves unsaid.
        key(span, 16, FIXED32);
        span.extend_from_slice(&u32::from(data.context.flags).to_le_bytes());
    });
}

/// An `ExportTraceServiceRequest` of `spans` from one resource (`resource`:
/// its attributes, `service.name` among them) and one scope (`box`).
pub fn export_request(resource: &[(String, AttrValue)], spans: &[SpanData]) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 * spans.len() + 128);
    // ExportTraceServiceRequest { repeated ResourceSpans resource_spans = 1; }
    message(&mut out, 1, |resource_spans| {
        // ResourceSpans { Resource resource = 1; repeated ScopeSpans scope_spans = 2; }
        message(resource_spans, 1, |res| {
            for (name, value) in resource {
                key_value(res, 1, name, value);
            }
        });
        message(resource_spans, 2, |scope_spans| {
            // ScopeSpans { InstrumentationScope scope = 1; repeated Span spans = 2; }
            message(scope_spans, 1, |scope| {
                string(scope, 1, "box");
                string(scope, 2, env!("CARGO_PKG_VERSION"));
            });
            for data in spans {
                span(scope_spans, data);
            }
        });
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SpanContext;
    use pretty_assertions::assert_eq;

    #[test]
    fn varints_are_little_endian_groups_of_seven() {
        let mut out = Vec::new();
        varint(&mut out, 300);
        assert_eq!(out, [0xac, 0x02]);
        let mut out = Vec::new();
        varint(&mut out, (-1i64) as u64);
        assert_eq!(out.len(), 10);
    }

    #[test]
    fn a_nested_message_has_its_shortest_length_however_long() {
        for length in [0, 1, 127, 128, 300, 20_000] {
            let mut written = vec![7];
            message(&mut written, 1, |inner| {
                inner.extend(std::iter::repeat_n(9, length))
            });
            let mut expected = vec![7];
            bytes(&mut expected, 1, &vec![9; length]);
            assert_eq!(written, expected, "{length}");
        }
    }

    #[test]
    fn a_span_is_written_with_its_ids_and_name() {
        let context = SpanContext::parse(
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            None,
        )
        .unwrap();
        let data = SpanData {
            context,
            parent_span_id: None,
            name: "tools/call bash".to_owned(),
            kind: SpanKind::Server,
            start: 1,
            end: 2,
            attributes: vec![("a".to_owned(), AttrValue::Int(1))],
            error: None,
        };
        let out = export_request(&[], &[data]);
        let needle = b"tools/call bash";
        assert!(out.windows(needle.len()).any(|window| window == needle));
        let trace = [0x0a, 0xf7, 0x65, 0x19];
        assert!(out.windows(4).any(|window| window == trace));
    }
}
