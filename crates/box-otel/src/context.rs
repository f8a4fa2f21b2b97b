//! W3C trace context (`traceparent`, `tracestate`) and the ids box makes.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;

/// The `_meta` key of a request's W3C `traceparent`.
pub const TRACEPARENT: &str = "traceparent";
/// The `_meta` key of a request's W3C `tracestate`.
pub const TRACESTATE: &str = "tracestate";
/// The longest `tracestate` kept (W3C: 32 members of at most 256 bytes;
/// box keeps what a header would carry and drops a longer one whole).
const MAX_TRACESTATE: usize = 512;

/// A span's place in a trace: what a child needs of its parent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpanContext {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    /// W3C trace flags (bit 0: sampled).
    pub flags: u8,
    /// The `tracestate` passed on unchanged; empty when none came.
    pub trace_state: String,
}

impl SpanContext {
    /// Read `traceparent` (version `00`, or a later one read as `00` as W3C
    /// asks) and `tracestate`; `None` for anything malformed or all-zero ids.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<Self> {
        // On every traced call's path (the executor's too): no allocation.
        let mut parts = traceparent.trim().split('-');
        let (version, trace, span, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let extra = parts.next().is_some();
        if version.len() != 2 || version == "ff" || (version == "00" && extra) {
            return None;
        }
        let lower_hex = |text: &str| {
            text.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        if !lower_hex(version) || !lower_hex(trace) || !lower_hex(span) || !lower_hex(flags) {
            return None;
        }
        let mut trace_id = [0u8; 16];
        let mut span_id = [0u8; 8];
        let mut flag = [0u8; 1];
        if !decode_into(trace, &mut trace_id)
            || !decode_into(span, &mut span_id)
            || !decode_into(flags, &mut flag)
        {
            return None;
        }
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        let trace_state = tracestate
            .map(str::trim)
            .filter(|state| state.len() <= MAX_TRACESTATE && state.is_ascii())
            .unwrap_or("")
            .to_owned();
        Some(Self {
            trace_id,
            span_id,
            flags: flag[0],
            trace_state,
        })
    }

    /// The context a request's `_meta` carries (`traceparent`, `tracestate`).
    pub fn from_meta(meta: &Value) -> Option<Self> {
        let parent = meta.get(TRACEPARENT)?.as_str()?;
        Self::parse(parent, meta.get(TRACESTATE).and_then(Value::as_str))
    }

    /// The context in a JSON-RPC request's `params._meta`.
    pub fn from_request(message: &Value) -> Option<Self> {
        Self::from_meta(message.get("params")?.get("_meta")?)
    }

    /// This context as a `traceparent` value.
    pub fn traceparent(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            hex(&self.trace_id),
            hex(&self.span_id),
            self.flags
        )
    }

    /// A fresh root: a new trace, sampled.
    pub fn root() -> Self {
        Self {
            trace_id: new_trace_id(),
            span_id: new_span_id(),
            flags: 1,
            trace_state: String::new(),
        }
    }

    /// A child of this context: the same trace, a new span id.
    pub fn child(&self) -> Self {
        Self {
            trace_id: self.trace_id,
            span_id: new_span_id(),
            flags: self.flags,
            trace_state: self.trace_state.clone(),
        }
    }
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        text.push(char::from(DIGITS[usize::from(byte >> 4)]));
        text.push(char::from(DIGITS[usize::from(byte & 15)]));
    }
    text
}

/// Decode hex `text` into exactly `out`; false if it is not that long or
/// not hex.
pub(crate) fn decode_into(text: &str, out: &mut [u8]) -> bool {
    if text.len() != out.len() * 2 {
        return false;
    }
    let digit = |b: u8| char::from(b).to_digit(16);
    for (byte, pair) in out.iter_mut().zip(text.as_bytes().chunks(2)) {
        let (Some(high), Some(low)) = (digit(pair[0]), digit(pair[1])) else {
            return false;
        };
        *byte = u8::try_from(high << 4 | low).unwrap_or(0);
    }
    true
}

/// 64 random bits, never zero: SipHash keyed afresh by the standard
/// library's per-process random keys, over a counter and the clock, so no
/// random-number crate is needed and two calls never repeat.
fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    loop {
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        hasher.write_u128(now_unix_nanos().into());
        let value = hasher.finish();
        if value != 0 {
            return value;
        }
    }
}

/// A new span id.
pub fn new_span_id() -> [u8; 8] {
    random_u64().to_be_bytes()
}

/// A new trace id.
pub fn new_trace_id() -> [u8; 16] {
    let mut id = [0; 16];
    id[..8].copy_from_slice(&random_u64().to_be_bytes());
    id[8..].copy_from_slice(&random_u64().to_be_bytes());
    id
}

/// Now, in nanoseconds since the Unix epoch (OTLP's time).
pub fn now_unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|since| u64::try_from(since.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn a_traceparent_round_trips_and_malformed_ones_are_refused() {
        let text = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let context = SpanContext::parse(text, Some("congo=t61rcWkgMzE")).unwrap();
        assert_eq!(context.traceparent(), text);
        assert_eq!(context.trace_state, "congo=t61rcWkgMzE");
        assert_eq!(context.flags, 1);
        for bad in [
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
            "00-0af7651916cd43dd-b7ad6b7169203331-01",
            "garbage",
        ] {
            assert_eq!(SpanContext::parse(bad, None), None, "{bad}");
        }
        // A later version is read as 00, its extra fields ignored.
        assert!(
            SpanContext::parse(
                "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x",
                None
            )
            .is_some()
        );
    }

    #[test]
    fn a_child_keeps_the_trace_and_gets_a_new_span() {
        let root = SpanContext::root();
        let child = root.child();
        assert_eq!(child.trace_id, root.trace_id);
        assert_ne!(child.span_id, root.span_id);
        assert_ne!(new_span_id(), new_span_id());
    }
}
