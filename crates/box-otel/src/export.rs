//! The exporter: spans queued without waiting, batched, and POSTed as
//! OTLP/HTTP protobuf by one task; its settings from the standard
//! `OTEL_*` variables and `box serve --otlp-endpoint`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Notify, mpsc, oneshot};

use crate::context::SpanContext;
use crate::proto;
use crate::span::{AttrValue, Span, SpanData, SpanKind};

/// Where and how spans are exported.
#[derive(Debug, Clone)]
pub struct ExportConfig {
    pub endpoint: Endpoint,
    /// Extra request headers (`OTEL_EXPORTER_OTLP_HEADERS`): often a
    /// collector's credentials, so never logged.
    pub headers: Vec<(String, String)>,
    pub timeout: Duration,
    /// How long a span may wait to be batched (`OTEL_BSP_SCHEDULE_DELAY`).
    pub delay: Duration,
    pub max_queue: usize,
    pub max_batch: usize,
    /// The resource's attributes (`service.name`, ...).
    pub resource: Vec<(String, AttrValue)>,
}

/// An `http://` URL split for a request by hand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `host:port` as the URL wrote it, for `Host`.
    pub authority: String,
    pub host: String,
    pub port: u16,
    pub path: String,
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "http://{}{}", self.authority, self.path)
    }
}

impl Endpoint {
    /// Parse `url`; `signal_path`: append `/v1/traces` (a base endpoint, as
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` is) rather than use its path as it is.
    pub fn parse(url: &str, signal_path: bool) -> Result<Self, String> {
        let url = url.trim();
        let rest = match url.split_once("://") {
            Some(("http", rest)) => rest,
            Some(("https", _)) => {
                return Err(format!(
                    "{url}: box exports OTLP over plain http:// only (no TLS client in box); export to a collector on this host or its network and let it forward over TLS"
                ));
            }
            _ => return Err(format!("{url}: not an http:// URL")),
        };
        let (authority, path) = match rest.find('/') {
            Some(at) => (&rest[..at], &rest[at..]),
            None => (rest, ""),
        };
        if authority.is_empty() || authority.contains('@') {
            return Err(format!("{url}: no host, or user information, in the URL"));
        }
        let (host, port) = match authority.rsplit_once(':') {
            Some((host, port)) if !port.contains(']') => (
                host,
                port.parse::<u16>()
                    .map_err(|_| format!("{url}: the port `{port}` is not a number"))?,
            ),
            _ => (authority, 80),
        };
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let path = if signal_path {
            format!("{}/v1/traces", path.trim_end_matches('/'))
        } else if path.is_empty() {
            "/".to_owned()
        } else {
            path.to_owned()
        };
        Ok(Self {
            authority: authority.to_owned(),
            host,
            port,
            path,
        })
    }
}

impl ExportConfig {
    /// The settings from `flag` (`--otlp-endpoint`, a base endpoint like
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`, or a full one when it has a path) and
    /// the OTel SDK's variables read through `var`; `Ok(None)`: tracing is
    /// off (no endpoint anywhere, `OTEL_SDK_DISABLED=true`, or
    /// `OTEL_TRACES_EXPORTER` other than `otlp` with no flag).
    pub fn from_env(
        flag: Option<&str>,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, String> {
        let var = |name: &str| var(name).filter(|value| !value.trim().is_empty());
        if flag.is_none() {
            if var("OTEL_SDK_DISABLED")
                .is_some_and(|value| value.trim().eq_ignore_ascii_case("true"))
            {
                return Ok(None);
            }
            if var("OTEL_TRACES_EXPORTER").is_some_and(|value| value.trim() != "otlp") {
                return Ok(None);
            }
        }
        let endpoint = match (
            flag,
            var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
            var("OTEL_EXPORTER_OTLP_ENDPOINT"),
        ) {
            (Some(flag), _, _) => {
                let bare = flag
                    .split_once("://")
                    .map(|(_, rest)| rest.find('/').is_none_or(|at| rest[at..] == *"/"))
                    .unwrap_or(true);
                Endpoint::parse(flag, bare).map_err(|why| format!("--otlp-endpoint {why}"))?
            }
            (None, Some(traces), _) => Endpoint::parse(&traces, false)
                .map_err(|why| format!("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT={why}"))?,
            (None, None, Some(base)) => Endpoint::parse(&base, true)
                .map_err(|why| format!("OTEL_EXPORTER_OTLP_ENDPOINT={why}"))?,
            (None, None, None) => return Ok(None),
        };
        for name in [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            if let Some(protocol) = var(name) {
                if protocol.trim() != "http/protobuf" {
                    return Err(format!(
                        "{name}={protocol}: box exports traces as http/protobuf only"
                    ));
                }
                break;
            }
        }
        let headers_text = var("OTEL_EXPORTER_OTLP_TRACES_HEADERS")
            .or_else(|| var("OTEL_EXPORTER_OTLP_HEADERS"))
            .unwrap_or_default();
        let mut headers = Vec::new();
        for pair in headers_text
            .split(',')
            .filter(|pair| !pair.trim().is_empty())
        {
            let (name, value) = pair.split_once('=').ok_or_else(|| {
                "OTEL_EXPORTER_OTLP_HEADERS: an entry without `=` (expected name=value,...)"
                    .to_owned()
            })?;
            let (name, value) = (percent_decode(name.trim()), percent_decode(value.trim()));
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b))
                || value.bytes().any(|b| b == b'\r' || b == b'\n')
            {
                return Err(format!(
                    "OTEL_EXPORTER_OTLP_HEADERS: `{name}` is not a header name, or its value holds a line break"
                ));
            }
            headers.push((name, value));
        }
        let millis = |names: &[&str], default: u64| -> Result<Duration, String> {
            for name in names {
                if let Some(value) = var(name) {
                    return value
                        .trim()
                        .parse::<u64>()
                        .map(Duration::from_millis)
                        .map_err(|_| format!("{name}={value}: not a number of milliseconds"));
                }
            }
            Ok(Duration::from_millis(default))
        };
        let count = |name: &str, default: usize| -> Result<usize, String> {
            var(name).map_or(Ok(default), |value| {
                value
                    .trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|count| *count > 0)
                    .ok_or_else(|| format!("{name}={value}: not a positive count"))
            })
        };
        let mut resource = vec![(
            "service.name".to_owned(),
            AttrValue::Str(var("OTEL_SERVICE_NAME").unwrap_or_else(|| "box".to_owned())),
        )];
        resource.push((
            "service.version".to_owned(),
            AttrValue::Str(env!("CARGO_PKG_VERSION").to_owned()),
        ));
        for pair in var("OTEL_RESOURCE_ATTRIBUTES")
            .unwrap_or_default()
            .split(',')
        {
            if let Some((name, value)) = pair.split_once('=') {
                let name = percent_decode(name.trim());
                if !name.is_empty()
                    && (name != "service.name" || var("OTEL_SERVICE_NAME").is_none())
                {
                    resource.retain(|(kept, _)| *kept != name);
                    resource.push((name, AttrValue::Str(percent_decode(value.trim()))));
                }
            }
        }
        Ok(Some(Self {
            endpoint,
            headers,
            timeout: millis(
                &[
                    "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
                    "OTEL_EXPORTER_OTLP_TIMEOUT",
                ],
                10_000,
            )?,
            delay: millis(&["OTEL_BSP_SCHEDULE_DELAY"], 5_000)?,
            max_queue: count("OTEL_BSP_MAX_QUEUE_SIZE", 2048)?,
            max_batch: count("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)?,
            resource,
        }))
    }
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%'
            && let Some(byte) = text
                .get(index + 1..index + 3)
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
        {
            out.push(byte);
            index += 3;
            continue;
        }
        out.push(bytes[index]);
        index += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What every span of a tracer that is on shares: the buffer the exporter
/// takes its batches from.
pub(crate) struct Shared {
    /// Finished spans waiting for the next export. A span's end is a push
    /// under this lock, no task woken (a call pays no wake-up of the
    /// exporter), but when a batch fills up.
    buffer: Mutex<Vec<SpanData>>,
    /// A full batch waits for no tick.
    full: Notify,
    /// Flushes asked for (the host's end), each answered once exported.
    flushes: mpsc::UnboundedSender<oneshot::Sender<()>>,
    max_queue: usize,
    max_batch: usize,
    dropped: AtomicU64,
}

impl Shared {
    /// Queue a finished span; a full queue drops it (counted, said once per
    /// export) rather than slow a request down.
    pub(crate) fn send(&self, data: SpanData) {
        let Ok(mut buffer) = self.buffer.lock() else {
            return;
        };
        if buffer.len() >= self.max_queue {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        buffer.push(data);
        if buffer.len() == self.max_batch {
            self.full.notify_one();
        }
    }

    fn take(&self) -> Vec<SpanData> {
        self.buffer
            .lock()
            .map(|mut buffer| std::mem::take(&mut *buffer))
            .unwrap_or_default()
    }
}

/// The host's tracer: off (the default, nothing recorded, each span one
/// `None`) or exporting to an OTLP endpoint. Cheap to clone.
#[derive(Clone, Default)]
pub struct Tracer {
    shared: Option<Arc<Shared>>,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.shared.is_some() {
            "Tracer(on)"
        } else {
            "Tracer(off)"
        })
    }
}

impl Tracer {
    /// A tracer that records nothing.
    pub fn off() -> Self {
        Self::default()
    }

    /// A tracer exporting as `config` says, its exporter on a thread of its
    /// own (ended once every clone of the tracer is gone): encoding a batch
    /// and sending it never holds up the thread that serves requests (a
    /// stdio host serves on one thread, where an export of 512 spans
    /// measured as a stall of milliseconds in the calls behind it).
    pub fn export(config: ExportConfig) -> Self {
        let (flushes, flush_requests) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            buffer: Mutex::new(Vec::with_capacity(config.max_batch.min(config.max_queue))),
            full: Notify::new(),
            flushes,
            max_queue: config.max_queue,
            max_batch: config.max_batch,
            dropped: AtomicU64::new(0),
        });
        let exporter = run(flush_requests, config, Arc::downgrade(&shared));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
        match runtime {
            Ok(runtime) => {
                let spawned = std::thread::Builder::new()
                    .name("box-otel-export".to_owned())
                    .spawn(move || runtime.block_on(exporter));
                if let Err(why) = spawned {
                    tracing::warn!(
                        "starting the trace exporter's thread: {why}; spans are not exported"
                    );
                }
            }
            Err(why) => {
                tracing::warn!(
                    "starting the trace exporter's runtime: {why}; exporting on the host's"
                );
                tokio::spawn(exporter);
            }
        }
        Self {
            shared: Some(shared),
        }
    }

    pub fn is_on(&self) -> bool {
        self.shared.is_some()
    }

    /// Start a span of `kind`, a child of `parent` (else a new trace's root);
    /// `name` is only made when the tracer is on.
    pub fn span(
        &self,
        kind: SpanKind,
        parent: Option<&SpanContext>,
        name: impl FnOnce() -> String,
    ) -> Span {
        match &self.shared {
            Some(shared) => Span::open(shared.clone(), kind, parent, name()),
            None => Span::none(),
        }
    }

    /// Export a span recorded elsewhere (the executor's), ids and times as
    /// they came.
    pub fn record(&self, data: SpanData) {
        if let Some(shared) = &self.shared {
            shared.send(data);
        }
    }

    /// Export what is queued now and wait for it (at most the export's
    /// timeout): the host's end, so its last spans are not lost.
    pub async fn flush(&self) {
        if let Some(shared) = &self.shared {
            let (done, flushed) = oneshot::channel();
            if shared.flushes.send(done).is_ok() {
                let _ = flushed.await;
            }
        }
    }
}

/// The exporter: a batch every `delay`, when one fills up, or on a flush;
/// it ends when the tracer is gone.
async fn run(
    mut flushes: mpsc::UnboundedReceiver<oneshot::Sender<()>>,
    config: ExportConfig,
    shared: Weak<Shared>,
) {
    let mut exporter = Exporter {
        config,
        warned: None,
    };
    loop {
        let full = async {
            match shared.upgrade() {
                Some(shared) => shared.full.notified().await,
                None => std::future::pending().await,
            }
        };
        let flush = tokio::select! {
            () = tokio::time::sleep(exporter.config.delay) => None,
            () = full => None,
            asked = flushes.recv() => asked,
        };
        let Some(live) = shared.upgrade() else {
            return;
        };
        let batch = live.take();
        let dropped = live.dropped.swap(0, Ordering::Relaxed);
        drop(live);
        for chunk in batch.chunks(exporter.config.max_batch) {
            exporter.export(chunk).await;
        }
        if dropped > 0 {
            tracing::warn!(dropped, "spans were dropped: the export queue was full");
        }
        if let Some(done) = flush {
            let _ = done.send(());
        }
    }
}

struct Exporter {
    config: ExportConfig,
    /// When a failure was last logged: at most one WARN a minute.
    warned: Option<Instant>,
}

impl Exporter {
    async fn export(&mut self, spans: &[SpanData]) {
        if spans.is_empty() {
            return;
        }
        let body = proto::export_request(&self.config.resource, spans);
        let sent = tokio::time::timeout(self.config.timeout, post(&self.config, &body)).await;
        let failure = match sent {
            Ok(Ok(())) => None,
            Ok(Err(why)) => Some(why),
            Err(_) => Some(format!(
                "no answer within {} ms",
                self.config.timeout.as_millis()
            )),
        };
        if let Some(why) = failure
            && self
                .warned
                .is_none_or(|at| at.elapsed() > Duration::from_secs(60))
        {
            self.warned = Some(Instant::now());
            tracing::warn!(
                endpoint = %self.config.endpoint,
                spans = spans.len(),
                "exporting traces failed: {why}"
            );
        }
    }
}

/// One POST of `body`, the connection closed after the answer.
async fn post(config: &ExportConfig, body: &[u8]) -> Result<(), String> {
    let endpoint = &config.endpoint;
    let mut stream = TcpStream::connect((endpoint.host.as_str(), endpoint.port))
        .await
        .map_err(|why| format!("connecting: {why}"))?;
    let mut head = format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/x-protobuf\r\nContent-Length: {}\r\nConnection: close\r\nUser-Agent: box/{}\r\n",
        endpoint.path,
        endpoint.authority,
        body.len(),
        env!("CARGO_PKG_VERSION"),
    );
    for (name, value) in &config.headers {
        head.push_str(name);
        head.push_str(": ");
        head.push_str(value);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    let mut request = head.into_bytes();
    request.extend_from_slice(body);
    stream
        .write_all(&request)
        .await
        .map_err(|why| format!("sending: {why}"))?;
    let mut answer = Vec::new();
    let mut chunk = [0u8; 4096];
    while !answer.windows(2).any(|pair| pair == b"\r\n") && answer.len() < 16 * 1024 {
        let read = stream
            .read(&mut chunk)
            .await
            .map_err(|why| format!("reading the answer: {why}"))?;
        if read == 0 {
            break;
        }
        answer.extend_from_slice(&chunk[..read]);
    }
    let status_line = answer
        .split(|byte| *byte == b'\r')
        .next()
        .map(String::from_utf8_lossy)
        .unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse::<u16>().ok());
    match status {
        Some(200..=299) => Ok(()),
        Some(code) => Err(format!("the collector answered {code}")),
        None => Err(format!("not an HTTP answer: {:.60}", status_line)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect();
        move |name| {
            pairs
                .iter()
                .find(|(key, _)| key == name)
                .map(|(_, value)| value.clone())
        }
    }

    #[test]
    fn tracing_is_off_without_an_endpoint_or_when_disabled() {
        assert!(ExportConfig::from_env(None, vars(&[])).unwrap().is_none());
        let disabled = vars(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            ("OTEL_SDK_DISABLED", "true"),
        ]);
        assert!(ExportConfig::from_env(None, disabled).unwrap().is_none());
        let none = vars(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            ("OTEL_TRACES_EXPORTER", "none"),
        ]);
        assert!(ExportConfig::from_env(None, none).unwrap().is_none());
    }

    #[test]
    fn endpoints_follow_the_sdk_rules() {
        let base = ExportConfig::from_env(
            None,
            vars(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(base.endpoint.path, "/v1/traces");
        assert_eq!(
            (base.endpoint.host.as_str(), base.endpoint.port),
            ("collector", 4318)
        );
        let traces = ExportConfig::from_env(
            None,
            vars(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://ignored:1"),
                (
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                    "http://[::1]:9000/custom",
                ),
                (
                    "OTEL_EXPORTER_OTLP_HEADERS",
                    "authorization=Bearer%20x,x-tenant=a",
                ),
            ]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(traces.endpoint.path, "/custom");
        assert_eq!(traces.endpoint.host, "::1");
        assert_eq!(
            traces.headers[0],
            ("authorization".to_owned(), "Bearer x".to_owned())
        );
        let flag = ExportConfig::from_env(Some("http://127.0.0.1:4318"), vars(&[]))
            .unwrap()
            .unwrap();
        assert_eq!(flag.endpoint.path, "/v1/traces");
        let error = ExportConfig::from_env(Some("https://collector"), vars(&[])).unwrap_err();
        assert!(error.contains("plain http://"), "{error}");
        let grpc = ExportConfig::from_env(
            None,
            vars(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ]),
        )
        .unwrap_err();
        assert!(grpc.contains("http/protobuf"), "{grpc}");
    }
}
