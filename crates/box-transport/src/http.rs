//! Streamable HTTP (MCP 2024-11-05 to 2025-11-25, whichever `initialize`
//! agreed to) with axum: POST, GET and DELETE on one
//! endpoint, `/mcp` (and `/mcp/p/{profile}`, the same endpoint asking for a
//! profile), beside `/metrics`, `/healthz` (alive) and `/readyz` (not
//! draining, and the host says its backend answers). Many sessions, each with
//! its own units; `Mcp-Session-Id` minted at a successful initialize (256
//! random bits, hex).
//!
//! A session may ask for its profile, tightening and read limit through HTTP
//! itself, for clients that cannot send box's experimental capability (the
//! Python SDK, and the frameworks and desktop apps built on it, which are
//! configured by URL and headers): the `/mcp/p/{profile}` path or the
//! `Box-Profile` header, `Box-Tighten` (JSON) and `Box-Max-Read-Bytes`. They
//! are read from the request that carries `initialize` and handed to the
//! session as a [`TransportAsk`], which the host checks and merges with the
//! capability ask. Later requests of the session may repeat them; one that
//! differs from what the session was started with is refused (400), because
//! a running session's ask never changes. GET and DELETE ignore them.
//!
//! Every request passes, in order: the Host check (421: DNS rebinding), the
//! Origin check (403), the bearer token when one is configured (401 with
//! `WWW-Authenticate`; compared in constant time; never read from the URL;
//! not asked of `/healthz` and `/readyz`, which reveal nothing). Each such
//! refusal is reported to the host ([`SessionFactory::refused`]), which logs,
//! audits and counts it.
//! An `Accept` that allows neither answer form gets 406. Bodies are bounded
//! (413, before reading when the length is declared). The version `initialize`
//! agreed to governs the rest: `MCP-Protocol-Version` is required from
//! 2025-06-18 on (400 listing the supported versions when missing or
//! unsupported), and batches are split only on a 2025-03-26 session (-32600
//! otherwise). Unknown or ended sessions get 404. No CORS headers are ever
//! sent. A `server/discover` probe without the stateless revision's `_meta`
//! is answered "method not found" without a session, so nothing starts.
//!
//! MCP 2026-07-28 (stateless) on the same endpoint, chosen per request: a
//! request naming its version in `_meta` and carrying no `Mcp-Session-Id`
//! has its `MCP-Protocol-Version`, `Mcp-Method` and `Mcp-Name` headers
//! checked against its body (400, -32020), then goes to the box session its
//! handle names (`Box-Session: ID:SECRET` or `_meta["box/session"]`; 404
//! when none is live), or to a session opened for it: `box/session.open`
//! and its tool form (`tools/call` of `box_session_open`) keep it (no
//! `Mcp-Session-Id`: the answer is the handle), anything else
//! (`server/discover`, which starts no unit; a tool call, whose unit is
//! removed after it) is served by a session ended after its answer, unless
//! that answer is "input required": the session is kept while its call
//! waits, and the retry (no handle, its `requestState` naming the session)
//! goes to it. Answers are completed in the revision's form (`resultType`,
//! list caching hints).
//!
//! A POSTed request is answered `application/json` when nothing streams before
//! its answer, else `text/event-stream`: the events (progress, a server→client
//! request) and then the answer, without event ids (there is no replay, so
//! clients must not try to resume). A request the client cancelled gets no
//! JSON-RPC answer: its stream ends empty.

// A refusal is an axum `Response`, built once per request; boxing it buys nothing.
#![allow(clippy::result_large_err)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use crate::{AskPart, Refusal, RefusalReason, SessionFactory, TransportAsk};
use box_jsonrpc::era::STATELESS_VERSION;
use box_jsonrpc::session::SessionHandle;
use box_jsonrpc::{
    Kind, MessageError, ReplyStream, allows_batches, classify, code, discover_refusal,
    error_response, refusal, sends_version_header,
};

/// The protocol versions whose `MCP-Protocol-Version` header is accepted.
pub const SUPPORTED_VERSIONS: [&str; 4] = box_jsonrpc::PROTOCOL_VERSIONS;
/// The session header.
const SESSION_HEADER: &str = "mcp-session-id";
/// The version header.
const VERSION_HEADER: &str = "mcp-protocol-version";
/// The ask headers: the profile, the tightening (JSON), the read limit.
const PROFILE_HEADER: &str = "box-profile";
const TIGHTEN_HEADER: &str = "box-tighten";
const MAX_READ_BYTES_HEADER: &str = "box-max-read-bytes";
/// `SESSION:SECRET`: reattach to a session after its host restarted.
const REATTACH_HEADER: &str = "box-reattach";
/// `ID:SECRET`: the box session a stateless (2026-07-28) request is for,
/// as `box/session.open` answered it.
const HANDLE_HEADER: &str = "box-session";
/// 2026-07-28: the method, and the tool, resource or prompt name, mirrored
/// from the body.
const METHOD_HEADER: &str = "mcp-method";
const NAME_HEADER: &str = "mcp-name";
/// How many unrelated server→client messages wait for a session's GET stream.
const GENERAL_QUEUE: usize = 64;
/// How long a DELETE waits for its session's units to be removed, by default.
const DELETE_WAIT: Duration = Duration::from_secs(60);
/// When a DELETE's units are not confirmed removed, when to ask again.
const DELETE_RETRY_AFTER_SECS: u64 = 5;
/// How long shutdown waits for sessions to remove their units.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(60);
/// The most HTTP connections served at once.
const MAX_CONNECTIONS: usize = 1024;
/// How long a client may take to send a request's headers, by default.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client may take to send a request's body, by default.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a write may wait for a client that reads nothing, by default. A
/// write waits only while the client's receive window is full, so a live but
/// quiet stream never trips it.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// What the HTTP transport enforces.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// The bearer token every request must carry; `None` only on loopback.
    pub token: Option<String>,
    /// Host names (or host:port) accepted besides loopback's.
    pub allowed_hosts: Vec<String>,
    /// Origins accepted besides loopback's.
    pub allowed_origins: Vec<String>,
    /// The most sessions at once.
    pub max_sessions: usize,
    /// The largest body.
    pub max_body_bytes: usize,
    /// How long a client may take to send a request's headers (slowloris).
    pub header_read_timeout: Duration,
    /// How long a client may take to send a request's body.
    pub body_read_timeout: Duration,
    /// How long a write to a client that reads nothing may wait before its connection is dropped.
    pub write_timeout: Duration,
    /// How long a DELETE waits for its session's units to be confirmed removed.
    pub delete_wait: Duration,
}

impl HttpOptions {
    /// Loopback-only: no token, no other host or origin, and box's defaults
    /// for the rest (what the binary starts from, and what tests use).
    pub fn loopback() -> Self {
        Self {
            token: None,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            max_sessions: 64,
            max_body_bytes: box_jsonrpc::lines::MAX_MESSAGE_BYTES,
            header_read_timeout: HEADER_READ_TIMEOUT,
            body_read_timeout: BODY_READ_TIMEOUT,
            write_timeout: WRITE_TIMEOUT,
            delete_wait: DELETE_WAIT,
        }
    }
}

/// Whether a `--listen` address is loopback (`localhost:port` counts): off
/// loopback, the binary requires a bearer token.
pub fn is_loopback_listen(listen: &str) -> bool {
    match listen.parse::<SocketAddr>() {
        Ok(address) => address.ip().is_loopback(),
        Err(_) => listen
            .rsplit_once(':')
            .is_some_and(|(host, _)| host.eq_ignore_ascii_case("localhost")),
    }
}

/// Where a session's GET stream takes its messages from (empty while one is open).
type GeneralSlot = Arc<Mutex<Option<mpsc::Receiver<Value>>>>;

struct Entry {
    handle: SessionHandle,
    general: GeneralSlot,
    /// What the transport asked at initialize; later requests must not differ.
    ask: TransportAsk,
    _permit: OwnedSemaphorePermit,
}

struct AppState {
    sessions_factory: Arc<dyn SessionFactory>,
    options: HttpOptions,
    sessions: Mutex<HashMap<String, Entry>>,
    permits: Arc<Semaphore>,
    shutdown: CancellationToken,
}

impl AppState {
    fn lookup(&self, id: &str) -> Option<(SessionHandle, GeneralSlot)> {
        self.lookup_asked(id)
            .map(|(handle, general, _)| (handle, general))
    }

    /// [`AppState::lookup`], with what the session's transport asked.
    fn lookup_asked(&self, id: &str) -> Option<(SessionHandle, GeneralSlot, TransportAsk)> {
        let sessions = self.sessions.lock().ok()?;
        let entry = sessions.get(id)?;
        if entry.handle.has_ended() {
            return None;
        }
        Some((
            entry.handle.clone(),
            entry.general.clone(),
            entry.ask.clone(),
        ))
    }
}

/// The axum router, for tests and for [`serve`].
pub fn router(
    sessions: Arc<dyn SessionFactory>,
    options: HttpOptions,
    shutdown: CancellationToken,
) -> Router {
    let state = Arc::new(AppState {
        sessions_factory: sessions,
        permits: Arc::new(Semaphore::new(options.max_sessions)),
        options,
        sessions: Mutex::new(HashMap::new()),
        shutdown,
    });
    Router::new()
        .route("/mcp", post(post_mcp).get(get_mcp).delete(delete_mcp))
        .route(
            "/mcp/p/{profile}",
            post(post_mcp_profile).get(get_mcp).delete(delete_mcp),
        )
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// Bind `address` (`host:port`; the first of its addresses that binds) for
/// [`serve`], with a listen backlog of [`MAX_CONNECTIONS`]: the standard
/// bind's 128 overflowed when 200 clients connected at once, and each
/// dropped SYN cost its client a one-second retransmit (measured in
/// BENCHMARKS.md, Serve).
pub async fn bind(address: &str) -> anyhow::Result<tokio::net::TcpListener> {
    let mut last = None;
    for candidate in tokio::net::lookup_host(address)
        .await
        .with_context(|| format!("--listen {address}: resolving"))?
    {
        let socket = if candidate.is_ipv4() {
            tokio::net::TcpSocket::new_v4()
        } else {
            tokio::net::TcpSocket::new_v6()
        };
        let bound = socket.and_then(|socket| {
            // As the standard bind: a restarted host rebinds at once.
            socket.set_reuseaddr(true)?;
            socket.bind(candidate)?;
            socket.listen(MAX_CONNECTIONS as u32)
        });
        match bound {
            Ok(listener) => return Ok(listener),
            Err(error) => last = Some((candidate, error)),
        }
    }
    match last {
        Some((candidate, error)) => {
            Err(error).with_context(|| format!("--listen {address}: binding {candidate}"))
        }
        None => anyhow::bail!("--listen {address}: the name resolves to no address"),
    }
}

/// Serve on `listener` until `shutdown`, then end every session and remove its units.
///
/// One task per connection (at most `MAX_CONNECTIONS`, the permit moves into
/// the task), HTTP/1.1 with a header read timeout so a slow client cannot hold
/// a connection open by trickling its headers (security case E65).
pub async fn serve(
    sessions: Arc<dyn SessionFactory>,
    options: HttpOptions,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let header_read_timeout = options.header_read_timeout;
    let write_timeout = options.write_timeout;
    let app = router(sessions.clone(), options, shutdown.clone());
    let connections = tokio_util::task::TaskTracker::new();
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let permit = tokio::select! {
            () = shutdown.cancelled() => break,
            permit = permits.clone().acquire_owned() => permit.context("the connection limit closed")?,
        };
        let (stream, _peer) = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: back off, never exit.
                    tracing::warn!(%error, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let shutdown = shutdown.clone();
        connections.spawn(async move {
            let _permit = permit;
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(header_read_timeout);
            let stream = crate::write_timeout::WriteTimeout::new(stream, write_timeout);
            let connection =
                builder.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            let mut connection = std::pin::pin!(connection);
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(error) = result {
                        tracing::debug!(%error, "an HTTP connection ended with an error");
                    }
                }
                () = shutdown.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(SHUTDOWN_WAIT, connection).await;
                }
            }
        });
    }
    connections.close();
    // Sessions are children of `shutdown`: they are ending (those still starting
    // their units too); wait for their units to go.
    let deadline = tokio::time::Instant::now() + SHUTDOWN_WAIT;
    while sessions.sessions_running() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = tokio::time::timeout_at(deadline, connections.wait()).await;
    Ok(())
}

/// A response with a JSON body.
fn json_response(status: StatusCode, body: Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// An HTTP-level refusal with an id-less JSON-RPC error body.
fn refuse(status: StatusCode, code: i64, message: impl Into<String>) -> Response {
    json_response(
        status,
        json!({"jsonrpc": "2.0", "id": null, "error": {"code": code, "message": message.into()}}),
    )
}

const LOOPBACK_NAMES: [&str; 4] = ["localhost", "127.0.0.1", "::1", "[::1]"];

/// Split `host[:port]` (brackets kept off IPv6).
fn host_part(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if port.chars().all(|c| c.is_ascii_digit()) => host,
        _ => authority,
    }
}

fn host_is_allowed(options: &HttpOptions, authority: &str) -> bool {
    let host = host_part(authority).to_ascii_lowercase();
    if LOOPBACK_NAMES.contains(&host.as_str()) {
        return true;
    }
    if let Ok(ip) = host.parse::<IpAddr>()
        && ip.is_loopback()
    {
        return true;
    }
    options.allowed_hosts.iter().any(|allowed| {
        allowed.eq_ignore_ascii_case(authority) || allowed.eq_ignore_ascii_case(&host)
    })
}

fn origin_is_allowed(options: &HttpOptions, origin: &str) -> bool {
    if options
        .allowed_origins
        .iter()
        .any(|allowed| allowed.eq_ignore_ascii_case(origin))
    {
        return true;
    }
    let Some((scheme, authority)) = origin.split_once("://") else {
        return false;
    };
    (scheme == "http" || scheme == "https")
        && !authority.contains('/')
        && !authority.contains('@')
        && host_is_allowed(
            &HttpOptions {
                allowed_hosts: Vec::new(),
                ..options.clone()
            },
            authority,
        )
}

/// Equal in constant time: both sides are hashed first, so neither the
/// position of the first difference nor the token's length leaks.
fn token_matches(given: &str, expected: &str) -> bool {
    let given = Sha256::digest(given.as_bytes());
    let expected = Sha256::digest(expected.as_bytes());
    given
        .iter()
        .zip(expected.iter())
        .fold(0u8, |acc, (a, b)| acc | (a ^ b))
        == 0
}

/// Whether a request must carry the bearer token (when one is configured).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Auth {
    /// Everything but the probes.
    Required,
    /// `/healthz` and `/readyz`: they reveal nothing, and a probe (a load
    /// balancer's, the kubelet's) carries no token.
    Probe,
}

/// What the bearer token check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bearer {
    /// No token is configured, or the request carries it.
    Valid,
    /// The request carries no token.
    Missing,
    /// The request carries another token.
    Wrong,
}

fn bearer(options: &HttpOptions, headers: &HeaderMap) -> Bearer {
    let Some(expected) = &options.token else {
        return Bearer::Valid;
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| {
            value
                .strip_prefix("Bearer ")
                .or_else(|| value.strip_prefix("bearer "))
        });
    match given {
        None => Bearer::Missing,
        Some(given) if token_matches(given.trim(), expected) => Bearer::Valid,
        Some(_) => Bearer::Wrong,
    }
}

/// A header value as a log may quote it: at most 200 bytes, escaped.
fn quoted(value: &HeaderValue) -> String {
    let text = String::from_utf8_lossy(value.as_bytes());
    let cut: String = text.chars().take(200).collect();
    format!("{cut:?}")
}

/// Host, Origin and (as `auth` says) bearer checks, in that order; a refusal
/// is the answer and what the host is told of it.
fn check_request(
    options: &HttpOptions,
    headers: &HeaderMap,
    auth: Auth,
) -> Result<(), (Response, RefusalReason, String)> {
    let host = headers.get(header::HOST);
    let host_text = host.and_then(|value| value.to_str().ok());
    match host_text {
        Some(host) if host_is_allowed(options, host) => {}
        _ => {
            let detail = match host {
                Some(host) => format!("Host {} is not served here", quoted(host)),
                None => "no Host header".to_owned(),
            };
            return Err((
                refuse(
                    StatusCode::MISDIRECTED_REQUEST,
                    code::INVALID_REQUEST,
                    "the Host header names a host this server does not serve (DNS rebinding guard); see --allow-host",
                ),
                RefusalReason::Host,
                detail,
            ));
        }
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let allowed = origin
            .to_str()
            .is_ok_and(|origin| origin_is_allowed(options, origin));
        if !allowed {
            return Err((
                refuse(
                    StatusCode::FORBIDDEN,
                    code::INVALID_REQUEST,
                    "the Origin is not allowed; see --allow-origin",
                ),
                RefusalReason::Origin,
                format!("Origin {} is not allowed (--allow-origin)", quoted(origin)),
            ));
        }
    }
    if auth == Auth::Probe {
        return Ok(());
    }
    let (challenge, detail) = match bearer(options, headers) {
        Bearer::Valid => return Ok(()),
        Bearer::Missing => (
            "Bearer realm=\"box\"",
            "no bearer token in the Authorization header",
        ),
        Bearer::Wrong => (
            "Bearer realm=\"box\", error=\"invalid_token\"",
            "a wrong bearer token",
        ),
    };
    let mut response = refuse(
        StatusCode::UNAUTHORIZED,
        code::INVALID_REQUEST,
        "a bearer token is required in the Authorization header (never in the URL)",
    );
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static(challenge),
    );
    Err((response, RefusalReason::Unauthorized, detail.to_owned()))
}

impl AppState {
    /// [`check_request`] for a request to `path`; a refusal is reported to
    /// the host before it is answered.
    fn check(&self, headers: &HeaderMap, path: &str, auth: Auth) -> Result<(), Response> {
        check_request(&self.options, headers, auth).map_err(|(response, reason, detail)| {
            self.sessions_factory.refused(&Refusal {
                reason,
                status: response.status().as_u16(),
                path: path.to_owned(),
                detail,
            });
            response
        })
    }
}

fn session_header(headers: &HeaderMap) -> Option<String> {
    headers
        .get(SESSION_HEADER)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned)
}

/// Whether a request must carry `MCP-Protocol-Version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    /// POSTs on a session that negotiated 2025-06-18 or later: every SDK
    /// sends it there, and security case E63 asks for 400 when it is missing.
    Required,
    /// POSTs on an older session (the header did not exist yet; the
    /// negotiated version governs), and GET: some clients (TypeScript) send
    /// only `Accept` there; a missing header means 2025-03-26, which box serves.
    Optional,
}

/// 400 listing the supported versions for an unsupported (or, where required,
/// missing) `MCP-Protocol-Version`.
fn check_version(headers: &HeaderMap, need: Version) -> Result<(), Response> {
    let version = match headers.get(VERSION_HEADER) {
        Some(value) => value.to_str().unwrap_or(""),
        None if need == Version::Optional => return Ok(()),
        None => "",
    };
    if SUPPORTED_VERSIONS.contains(&version) {
        return Ok(());
    }
    Err(json_response(
        StatusCode::BAD_REQUEST,
        json!({"jsonrpc": "2.0", "id": null, "error": {
            "code": code::INVALID_REQUEST,
            "message": if version.is_empty() {
                format!("MCP-Protocol-Version is missing; send the negotiated one of: {}", SUPPORTED_VERSIONS.join(", "))
            } else {
                format!("unsupported MCP-Protocol-Version {version:?}; supported: {}", SUPPORTED_VERSIONS.join(", "))
            },
            "data": {"supported": SUPPORTED_VERSIONS, "requested": version},
        }}),
    ))
}

fn mint_session_id() -> String {
    let mut bytes = [0u8; 32];
    rand::fill(&mut bytes);
    hex::encode(bytes)
}

async fn read_body(
    options: &HttpOptions,
    headers: &HeaderMap,
    body: Body,
) -> Result<Value, Response> {
    let too_large = || {
        refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            code::INVALID_REQUEST,
            format!("the body is larger than {} bytes", options.max_body_bytes),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > options.max_body_bytes as u64) {
        return Err(too_large());
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("");
    if !content_type
        .split(';')
        .next()
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"))
    {
        return Err(refuse(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            code::INVALID_REQUEST,
            "Content-Type must be application/json",
        ));
    }
    let bytes = match tokio::time::timeout(
        options.body_read_timeout,
        axum::body::to_bytes(body, options.max_body_bytes),
    )
    .await
    {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(_)) => return Err(too_large()),
        Err(_) => {
            return Err(refuse(
                StatusCode::REQUEST_TIMEOUT,
                code::INVALID_REQUEST,
                format!(
                    "the body did not arrive within {}",
                    humantime::format_duration(options.body_read_timeout)
                ),
            ));
        }
    };
    serde_json::from_slice(&bytes).map_err(|error| {
        refuse(
            StatusCode::BAD_REQUEST,
            code::PARSE_ERROR,
            format!("the body is not JSON: {error}"),
        )
    })
}

/// One `Box-*` header's value: absent, or given once as UTF-8 text.
fn ask_header(headers: &HeaderMap, name: &str, shown: &str) -> Result<Option<AskPart>, String> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    let source = format!("the {shown} header");
    if values.next().is_some() {
        return Err(format!("{source} is given more than once; send it once"));
    }
    let text =
        std::str::from_utf8(value.as_bytes()).map_err(|_| format!("{source} is not UTF-8 text"))?;
    Ok(Some(AskPart::new(text, source)))
}

/// What a request asks through HTTP: the path's profile (`/mcp/p/{profile}`)
/// or `Box-Profile` (the same when both are given), `Box-Tighten`,
/// `Box-Max-Read-Bytes`. Their meaning is the host's to check; here only
/// their form (each header once, UTF-8, the path and header agreeing).
fn transport_ask(path_profile: Option<&str>, headers: &HeaderMap) -> Result<TransportAsk, String> {
    let header_profile = ask_header(headers, PROFILE_HEADER, "Box-Profile")?;
    let profile = match (path_profile, header_profile) {
        (Some(path), Some(header)) if header.text != path => {
            return Err(format!(
                "box.profile: the path /mcp/p/{path} asks for `{path}` but {} asks for `{}`; ask in one place, or the same in both",
                header.source, header.text
            ));
        }
        (Some(path), _) => Some(AskPart::new(path, format!("the path /mcp/p/{path}"))),
        (None, header) => header,
    };
    Ok(TransportAsk {
        profile,
        tighten: ask_header(headers, TIGHTEN_HEADER, "Box-Tighten")?,
        max_read_bytes: ask_header(headers, MAX_READ_BYTES_HEADER, "Box-Max-Read-Bytes")?,
        reattach: ask_header(headers, REATTACH_HEADER, "Box-Reattach")?,
    })
}

/// A later request's ask against the session's: each part it gives must be
/// the one the session was started with (the ask is read at initialize only).
fn same_ask(session: &TransportAsk, later: &TransportAsk) -> Result<(), String> {
    let parts = [
        ("the profile", &session.profile, &later.profile),
        ("Box-Tighten", &session.tighten, &later.tighten),
        (
            "Box-Max-Read-Bytes",
            &session.max_read_bytes,
            &later.max_read_bytes,
        ),
    ];
    for (name, started, asked) in parts {
        if let Some(asked) = asked
            && started.as_ref().map(|part| &part.text) != Some(&asked.text)
        {
            return Err(format!(
                "{name}: {} differs from what this session was initialized with; a session's ask is read at initialize only and never changes: send the same, or initialize a new session",
                asked.source
            ));
        }
    }
    Ok(())
}

async fn post_mcp(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    post_message(state, None, headers, body).await
}

/// POST on `/mcp/p/{profile}`: `/mcp`, asking for `profile`.
async fn post_mcp_profile(
    State(state): State<Arc<AppState>>,
    Path(profile): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    post_message(state, Some(profile), headers, body).await
}

async fn post_message(
    state: Arc<AppState>,
    path_profile: Option<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let path = match &path_profile {
        Some(profile) => format!("/mcp/p/{profile}"),
        None => "/mcp".to_owned(),
    };
    if let Err(response) = state.check(&headers, &path, Auth::Required) {
        return response;
    }
    let accepts = Accepts::from_headers(&headers);
    if !accepts.json && !accepts.sse {
        return refuse(
            StatusCode::NOT_ACCEPTABLE,
            code::INVALID_REQUEST,
            "Accept must allow application/json or text/event-stream (clients send both)",
        );
    }
    let message = match read_body(&state.options, &headers, body).await {
        Ok(message) => message,
        Err(response) => return response,
    };
    // A batch is refused or split once the session's version is known.
    let kind = match classify(&message) {
        Ok(kind) => Some(kind),
        Err(MessageError::Batch) => None,
        Err(error) => return json_response(StatusCode::BAD_REQUEST, refusal(&message, &error)),
    };
    let ask = transport_ask(path_profile.as_deref(), &headers);
    // MCP 2026-07-28: no session header, the version in each request's `_meta`.
    if session_header(&headers).is_none()
        && let Some(Kind::Request { id, method }) = &kind
        && (box_jsonrpc::era::request_version(&message).is_some()
            || headers.contains_key(HANDLE_HEADER))
    {
        let (id, method) = (id.clone(), method.clone());
        return stateless(&state, id, method, message, ask, &headers, accepts).await;
    }
    let Some(session_id) = session_header(&headers) else {
        return match kind {
            Some(Kind::Request { id, method }) if method == "initialize" => match ask {
                Ok(ask) => match crate::reattach_id(&message).or_else(|| {
                    // The header form, `SESSION:SECRET`.
                    let part = ask.reattach.as_ref()?;
                    let (id, _) = part.text.split_once(':')?;
                    let id = id.trim();
                    crate::plausible_session_id(id).then(|| id.to_owned())
                }) {
                    Some(session_id) if state.lookup(&session_id).is_some() => json_response(
                        StatusCode::OK,
                        error_response(
                            id,
                            code::INVALID_PARAMS,
                            format!(
                                "box.reattach.session: session `{session_id}` is live on this host; send its requests with its Mcp-Session-Id instead of reattaching"
                            ),
                        ),
                    ),
                    reattach => initialize(&state, id, message, ask, reattach).await,
                },
                // Answered as the host answers a bad capability ask.
                Err(why) => json_response(
                    StatusCode::OK,
                    error_response(id, code::INVALID_PARAMS, why),
                ),
            },
            // A dual-era client's probe: a clean "method not found", nothing started.
            Some(Kind::Request { id, method }) if method == "server/discover" => {
                json_response(StatusCode::OK, discover_refusal(id))
            }
            None => json_response(
                StatusCode::BAD_REQUEST,
                refusal(&message, &MessageError::Batch),
            ),
            Some(_) => refuse(
                StatusCode::BAD_REQUEST,
                code::INVALID_REQUEST,
                "Mcp-Session-Id is missing: send initialize first",
            ),
        };
    };
    let Some((session, _, session_ask)) = state.lookup_asked(&session_id) else {
        return refuse(
            StatusCode::NOT_FOUND,
            code::INVALID_REQUEST,
            "no such session (it ended, or never was); initialize again",
        );
    };
    if let Err(why) = ask.and_then(|ask| same_ask(&session_ask, &ask)) {
        return refuse(StatusCode::BAD_REQUEST, code::INVALID_REQUEST, why);
    }
    // The version initialize agreed to governs: its clients send the header
    // from 2025-06-18 on, and only 2025-03-26 has batches.
    let version = session
        .protocol_version()
        .unwrap_or(box_jsonrpc::LATEST_PROTOCOL_VERSION);
    let need = if sends_version_header(version) {
        Version::Required
    } else {
        Version::Optional
    };
    if let Err(response) = check_version(&headers, need) {
        return response;
    }
    let Some(kind) = kind else {
        return match message {
            Value::Array(messages) if allows_batches(version) => {
                batch(&session, messages, accepts).await
            }
            message => json_response(
                StatusCode::BAD_REQUEST,
                refusal(&message, &MessageError::Batch),
            ),
        };
    };
    match kind {
        Kind::Request { .. } => match session.request(message).await {
            Ok(stream) => answer(stream, accepts).await,
            Err(_) => session_gone(),
        },
        Kind::Notification { .. } | Kind::Response { .. } => match session.notify(message).await {
            Ok(()) => StatusCode::ACCEPTED.into_response(),
            Err(_) => session_gone(),
        },
    }
}

/// A JSON-RPC error answered with an HTTP status.
fn refuse_with(status: StatusCode, id: Value, code: i64, message: impl Into<String>) -> Response {
    json_response(status, error_response(id, code, message))
}

/// `Mcp-Name`'s value as sent: plain, or `=?base64?…?=` for a name that is
/// not plain printable ASCII; `None` when the base64 form is malformed.
fn header_name(value: &str) -> Option<String> {
    use base64::Engine as _;
    match value
        .strip_prefix("=?base64?")
        .and_then(|rest| rest.strip_suffix("?="))
    {
        Some(encoded) => base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok()),
        None => Some(value.to_owned()),
    }
}

/// 2026-07-28's header mirroring: `MCP-Protocol-Version` (when sent) as
/// `_meta` names it, `Mcp-Method` as the body's method, and for
/// `tools/call`, `prompts/get` and `resources/read` `Mcp-Name` as the name
/// or URI in the body (the tasks extension's methods: the task's id). A header missing, malformed or disagreeing is -32020.
fn check_mirrored(headers: &HeaderMap, method: &str, message: &Value) -> Result<(), String> {
    let text = |name: &str, shown: &str| -> Result<Option<String>, String> {
        match headers.get(name) {
            None => Ok(None),
            Some(value) => value
                .to_str()
                .map(|text| Some(text.to_owned()))
                .map_err(|_| format!("the {shown} header is not ASCII text")),
        }
    };
    let version = box_jsonrpc::era::request_version(message).unwrap_or("");
    if let Some(header) = text(VERSION_HEADER, "MCP-Protocol-Version")?
        && header != version
    {
        return Err(format!(
            "the MCP-Protocol-Version header says {header:?} but _meta[\"{}\"] says {version:?}; send the same in both",
            box_jsonrpc::era::META_PROTOCOL_VERSION
        ));
    }
    match text(METHOD_HEADER, "Mcp-Method")? {
        None => {
            return Err(format!(
                "the Mcp-Method header is missing; send `Mcp-Method: {method}` (MCP 2026-07-28 mirrors the method in a header)"
            ));
        }
        Some(header) if header != method => {
            return Err(format!(
                "the Mcp-Method header says {header:?} but the body's method is {method:?}; send the same in both"
            ));
        }
        Some(_) => {}
    }
    let key = match method {
        "tools/call" | "prompts/get" => "name",
        "resources/read" => "uri",
        // The tasks extension routes on the task's id.
        "tasks/get" | "tasks/update" | "tasks/cancel" => "taskId",
        _ => return Ok(()),
    };
    let body = box_jsonrpc::params(message)
        .and_then(|params| params.get(key))
        .and_then(Value::as_str)
        .unwrap_or("");
    match text(NAME_HEADER, "Mcp-Name")? {
        None => Err(format!(
            "the Mcp-Name header is missing; {method} mirrors params.{key} ({body:?}) in it"
        )),
        Some(header) => match header_name(&header) {
            None => Err(format!(
                "the Mcp-Name header {header:?} is not valid =?base64?…?= text"
            )),
            Some(name) if name != body => Err(format!(
                "the Mcp-Name header says {name:?} but params.{key} is {body:?}; send the same in both"
            )),
            Some(_) => Ok(()),
        },
    }
}

/// The handle a stateless request carries: the `Box-Session` header
/// (`ID:SECRET`), put in the body's `_meta["box/session"]` for the host to
/// check, or `_meta["box/session"]` itself. The session's id, if any.
fn take_handle(headers: &HeaderMap, message: &mut Value) -> Result<Option<String>, String> {
    let meta_key = box_jsonrpc::era::SESSION_META;
    let in_body = box_jsonrpc::params(message)
        .and_then(|params| params.get("_meta"))
        .and_then(|meta| meta.get(meta_key))
        .cloned();
    let header = match ask_header(headers, HANDLE_HEADER, "Box-Session")? {
        None => None,
        Some(part) => {
            let Some((id, secret)) = part.text.split_once(':') else {
                return Err(
                    "the Box-Session header must be ID:SECRET, as box/session.open answered them"
                        .to_owned(),
                );
            };
            Some(json!({"id": id.trim(), "secret": secret.trim()}))
        }
    };
    let handle = match (header, in_body) {
        (Some(header), Some(body)) if header != body => {
            return Err(format!(
                "the Box-Session header and _meta[\"{meta_key}\"] name different sessions; send one"
            ));
        }
        (Some(header), _) => {
            if let Some(params) = box_jsonrpc::params_mut(message) {
                let meta = params.entry("_meta").or_insert_with(|| json!({}));
                if let Some(meta) = meta.as_object_mut() {
                    meta.insert(meta_key.to_owned(), header.clone());
                }
            }
            header
        }
        (None, Some(body)) => body,
        (None, None) => return Ok(None),
    };
    match handle.get("id").and_then(Value::as_str) {
        Some(id) if crate::plausible_session_id(id) => Ok(Some(id.to_owned())),
        _ => Err(format!(
            "_meta[\"{meta_key}\"].id: not a session id box mints; send the id box/session.open answered"
        )),
    }
}

/// A request of MCP 2026-07-28 (stateless): its headers checked against its
/// body, then to the box session its handle names, or, without one, to a
/// session opened for it: `box/session.open` keeps it (the answer names
/// its handle), anything else is served by a session ended after its
/// answer (`server/discover` starts no unit; a tool call runs in a unit
/// removed after it).
async fn stateless(
    state: &Arc<AppState>,
    id: Value,
    method: String,
    mut message: Value,
    ask: Result<TransportAsk, String>,
    headers: &HeaderMap,
    accepts: Accepts,
) -> Response {
    if let Some(version) = box_jsonrpc::era::request_version(&message)
        && version != box_jsonrpc::era::STATELESS_VERSION
    {
        return json_response(
            StatusCode::BAD_REQUEST,
            box_jsonrpc::era::unsupported_version(id, version),
        );
    }
    if let Err(why) = check_mirrored(headers, &method, &message) {
        return refuse_with(
            StatusCode::BAD_REQUEST,
            id,
            box_jsonrpc::era::HEADER_MISMATCH,
            why,
        );
    }
    let ask = match ask {
        Ok(ask) => ask,
        Err(why) => return refuse_with(StatusCode::OK, id, code::INVALID_PARAMS, why),
    };
    let handle = match take_handle(headers, &mut message) {
        Ok(handle) => handle,
        Err(why) => return refuse_with(StatusCode::BAD_REQUEST, id, code::INVALID_PARAMS, why),
    };
    if let Some(session_id) = handle {
        let found = match state.lookup_asked(&session_id) {
            Some(found) => Some(found),
            // Not live here: a session a restarted host kept (`--state`)
            // and re-adopted is reattached with the handle's secret.
            None => reattach(state, &session_id, &message, &ask).await,
        };
        let Some((session, _, session_ask)) = found else {
            return refuse_with(
                StatusCode::NOT_FOUND,
                id,
                code::INVALID_PARAMS,
                format!(
                    "box/session: no session `{session_id}` on this host (it ended, or never was, or cannot be reattached); open one with box/session.open"
                ),
            );
        };
        if let Err(why) = same_ask(&session_ask, &ask) {
            return refuse_with(StatusCode::BAD_REQUEST, id, code::INVALID_REQUEST, why);
        }
        let cancel = crate::CancelOnClose {
            session: session.clone(),
            id: id.clone(),
            armed: true,
        };
        return match session.request(message).await {
            Ok(stream) => answer_of(stream, accepts, Some((&method, cancel))).await,
            Err(_) => session_gone(),
        };
    }
    // The retry of a call without a handle that answered "input required":
    // to the session kept for it, which its request state names (the
    // session checks the state's seal).
    if let Some(kept) = retried_session(&message)
        && let Some((session, _, _)) = state.lookup_asked(&kept)
    {
        let Ok(stream) = session.request(message).await else {
            return session_gone();
        };
        let one_shot = OneShot {
            state: state.clone(),
            session_id: kept,
            handle: session,
            ask,
            permit: None,
        };
        return answer_stateless(stream, accepts, method, one_shot).await;
    }
    // A discover starts no unit: it takes no place among the sessions.
    let permit = if method == "server/discover" {
        None
    } else {
        match state.permits.clone().try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) => {
                return refuse_with(
                    StatusCode::SERVICE_UNAVAILABLE,
                    id,
                    code::INTERNAL_ERROR,
                    format!(
                        "this host serves at most {} sessions at once; try again later",
                        state.options.max_sessions
                    ),
                );
            }
        }
    };
    // `box/session.open`, or its tool form: the session is kept.
    let opens = method == "box/session.open"
        || (method == "tools/call"
            && box_jsonrpc::params(&message)
                .and_then(|params| params.get("name"))
                .and_then(Value::as_str)
                == Some("box_session_open"));
    let session_id = mint_session_id();
    let (general_tx, _) = mpsc::channel(1);
    let handle =
        state
            .sessions_factory
            .open(session_id.clone(), ask.clone(), general_tx, &state.shutdown);
    let Ok(stream) = handle.request(message).await else {
        end_after(handle, permit);
        return session_gone();
    };
    if !opens {
        let one_shot = OneShot {
            state: state.clone(),
            session_id,
            handle,
            ask,
            permit,
        };
        return answer_stateless(stream, accepts, method, one_shot).await;
    }
    let Ok(mut response) = stream.response.await else {
        end_after(handle, permit);
        return refuse_with(
            StatusCode::OK,
            id,
            code::INTERNAL_ERROR,
            "the session ended while starting",
        );
    };
    let Some(permit) = permit else {
        handle.end();
        return json_response(StatusCode::OK, response);
    };
    let refused = response.get("result").is_none()
        || response.pointer("/result/isError") == Some(&Value::Bool(true));
    if refused {
        // Refused (a tightening, a profile) or failed (a unit that did not start).
        end_holding(handle, permit);
        return json_response(StatusCode::OK, response);
    }
    box_jsonrpc::era::complete_result(&method, &mut response);
    keep(state, session_id, &handle, ask, permit);
    json_response(StatusCode::OK, response)
}

/// Reattach the session `session_id` a restarted host re-adopted, with the
/// secret of the handle `message` carries (`box/session.open {reattach}`);
/// the session, kept as one `box/session.open` opened, when the host
/// agreed. Refused (a wrong secret, nothing to reattach): `None`.
async fn reattach(
    state: &Arc<AppState>,
    session_id: &str,
    message: &Value,
    ask: &TransportAsk,
) -> Option<(SessionHandle, GeneralSlot, TransportAsk)> {
    let meta = box_jsonrpc::params(message)?.get("_meta")?;
    let secret = meta.get(box_jsonrpc::era::SESSION_META)?.get("secret")?;
    let mut open_meta = meta.clone();
    if let Some(open_meta) = open_meta.as_object_mut() {
        open_meta.remove(box_jsonrpc::era::SESSION_META);
    }
    let open = json!({"jsonrpc": "2.0", "id": box_jsonrpc::era::REATTACH_OPEN_ID, "method": "box/session.open",
        "params": {"reattach": {"session": session_id, "secret": secret}, "_meta": open_meta}});
    let permit = state.permits.clone().try_acquire_owned().ok()?;
    let (general_tx, _) = mpsc::channel(1);
    let handle = state.sessions_factory.open(
        session_id.to_owned(),
        ask.clone(),
        general_tx,
        &state.shutdown,
    );
    let answered = match handle.request(open).await {
        Ok(stream) => stream.response.await.ok(),
        Err(_) => None,
    };
    if answered.is_none_or(|response| response.get("result").is_none()) {
        end_holding(handle, permit);
        return None;
    }
    keep(state, session_id.to_owned(), &handle, ask.clone(), permit);
    Some((handle, Arc::new(Mutex::new(None)), ask.clone()))
}

/// Keep `handle` as the live session `session_id` until it ends.
fn keep(
    state: &Arc<AppState>,
    session_id: String,
    handle: &SessionHandle,
    ask: TransportAsk,
    permit: OwnedSemaphorePermit,
) {
    if let Ok(mut sessions) = state.sessions.lock() {
        sessions.insert(
            session_id.clone(),
            Entry {
                handle: handle.clone(),
                general: Arc::new(Mutex::new(None)),
                ask,
                _permit: permit,
            },
        );
    }
    let watcher_state = state.clone();
    let watched = handle.clone();
    tokio::spawn(async move {
        watched.ended().await;
        if let Ok(mut sessions) = watcher_state.sessions.lock() {
            sessions.remove(&session_id);
        }
    });
}

/// End a session served for one stateless request, holding its place under
/// `--max-sessions` (when it took one) until its units are removed.
fn end_after(handle: SessionHandle, permit: Option<OwnedSemaphorePermit>) {
    match permit {
        Some(permit) => end_holding(handle, permit),
        None => handle.end(),
    }
}

/// The session served for one stateless request without a handle.
struct OneShot {
    state: Arc<AppState>,
    session_id: String,
    handle: SessionHandle,
    ask: TransportAsk,
    /// Its place under `--max-sessions`; `None` once the session is kept
    /// (the kept entry holds it).
    permit: Option<OwnedSemaphorePermit>,
}

/// The session a request's `requestState` names (`box1.SESSION.…`, as the
/// host seals it): the retry of a call answered "input required".
fn retried_session(message: &Value) -> Option<String> {
    let text = box_jsonrpc::params(message)?
        .get("requestState")?
        .as_str()?;
    let mut parts = text.split('.');
    let session = (parts.next() == Some("box1")).then(|| parts.next())??;
    crate::plausible_session_id(session).then(|| session.to_owned())
}

/// Answer a stateless request ([`answer`]'s forms), its answer completed in
/// the revision's form; `one_shot`: the session served for it alone, ended
/// once the answer is out, unless the answer is "input required": then the
/// session is kept (its call waits in it) until a retry's answer is not.
async fn answer_stateless(
    stream: ReplyStream,
    accepts: Accepts,
    method: String,
    one_shot: OneShot,
) -> Response {
    let (out_tx, mut out_rx) = mpsc::channel(box_jsonrpc::REPLY_EVENTS);
    tokio::spawn(async move {
        let watch = out_tx.clone();
        // A client that closes the stream cancels the request (2026-07-28):
        // its session ends, and with it the call in its unit.
        let asks = tokio::select! {
            (_, asks) = crate::forward_reply_seen(stream, out_tx, Some(&method)) => asks,
            () = watch.closed() => false,
        };
        drop(watch);
        let OneShot {
            state,
            session_id,
            handle,
            ask,
            permit,
        } = one_shot;
        match (asks, permit) {
            (true, Some(permit)) => keep(&state, session_id, &handle, ask, permit),
            (true, None) => {}
            (false, permit) => end_after(handle, permit),
        }
    });
    let first = loop {
        match out_rx.recv().await {
            None => return unanswered(accepts),
            Some(message) if crate::is_answer(&message) => break Err(message),
            Some(event) if accepts.sse => break Ok(event),
            // A client that takes no streams cannot be sent what would stream.
            Some(_) => {}
        }
    };
    let first = match first {
        Err(response) if accepts.json => return json_response(StatusCode::OK, response),
        Err(response) | Ok(response) => response,
    };
    let (sse_tx, sse_rx) = mpsc::channel(box_jsonrpc::REPLY_EVENTS);
    let _ = sse_tx.send(first).await;
    tokio::spawn(async move {
        while let Some(message) = out_rx.recv().await {
            if sse_tx.send(message).await.is_err() {
                return;
            }
        }
    });
    sse(sse_rx)
}

/// 404 for a session that ended while its request was on the way.
fn session_gone() -> Response {
    refuse(
        StatusCode::NOT_FOUND,
        code::INVALID_REQUEST,
        "the session has ended",
    )
}

/// A batch on a session whose version has them (2025-03-26): each message
/// routed as if POSTed alone, the answers (none for notifications and
/// responses) in one array, or as SSE once something streams before them.
async fn batch(session: &SessionHandle, messages: Vec<Value>, accepts: Accepts) -> Response {
    if messages.is_empty() {
        return refuse(
            StatusCode::BAD_REQUEST,
            code::INVALID_REQUEST,
            "an empty batch: send at least one message",
        );
    }
    let Ok(crate::Batch {
        mut answers,
        replies: mut out_rx,
        mut pending,
    }) = crate::route_batch(session, messages).await
    else {
        return session_gone();
    };
    if answers.is_empty() && pending == 0 {
        return StatusCode::ACCEPTED.into_response();
    }
    while pending > 0 {
        let Some(message) = out_rx.recv().await else {
            // The rest were cancelled: they get no answer.
            break;
        };
        if crate::is_answer(&message) {
            answers.push(message);
            pending -= 1;
            continue;
        }
        // Something streams before the answers: the rest goes as SSE.
        if !accepts.sse {
            continue;
        }
        let (sse_tx, sse_rx) = mpsc::channel(box_jsonrpc::REPLY_EVENTS);
        tokio::spawn(async move {
            for message in answers.into_iter().chain([message]) {
                if sse_tx.send(message).await.is_err() {
                    return;
                }
            }
            while let Some(message) = out_rx.recv().await {
                if sse_tx.send(message).await.is_err() {
                    return;
                }
            }
        });
        return sse(sse_rx);
    }
    if answers.is_empty() {
        return unanswered(accepts);
    }
    if !accepts.json {
        let (sse_tx, sse_rx) = mpsc::channel(1);
        let _ = sse_tx.try_send(Value::Array(answers));
        return sse(sse_rx);
    }
    json_response(StatusCode::OK, Value::Array(answers))
}

async fn initialize(
    state: &Arc<AppState>,
    id: Value,
    message: Value,
    ask: TransportAsk,
    reattach: Option<String>,
) -> Response {
    let Ok(permit) = state.permits.clone().try_acquire_owned() else {
        return json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            error_response(
                id,
                code::INTERNAL_ERROR,
                format!(
                    "this host serves at most {} sessions at once; try again later",
                    state.options.max_sessions
                ),
            ),
        );
    };
    let session_id = reattach.unwrap_or_else(mint_session_id);
    let (general_tx, general_rx) = mpsc::channel(GENERAL_QUEUE);
    let handle =
        state
            .sessions_factory
            .open(session_id.clone(), ask.clone(), general_tx, &state.shutdown);
    let response = match handle.request(message).await {
        Ok(stream) => stream.response.await.ok(),
        Err(_) => None,
    };
    let Some(response) = response else {
        end_holding(handle, permit);
        return json_response(
            StatusCode::OK,
            error_response(id, code::INTERNAL_ERROR, "the session ended while starting"),
        );
    };
    if response.get("result").is_none() {
        // A refused tightening, a unit that failed or did not start in time.
        end_holding(handle, permit);
        return json_response(StatusCode::OK, response);
    }
    if let Ok(mut sessions) = state.sessions.lock() {
        sessions.insert(
            session_id.clone(),
            Entry {
                handle: handle.clone(),
                general: Arc::new(Mutex::new(Some(general_rx))),
                ask,
                _permit: permit,
            },
        );
    }
    // The entry goes when the session ends, however it ends (DELETE, idle, lifetime).
    let watcher_state = state.clone();
    let watcher_id = session_id.clone();
    let watched = handle.clone();
    tokio::spawn(async move {
        watched.ended().await;
        if let Ok(mut sessions) = watcher_state.sessions.lock() {
            sessions.remove(&watcher_id);
        }
    });
    let mut response = json_response(StatusCode::OK, response);
    if let Ok(value) = HeaderValue::from_str(&session_id) {
        response.headers_mut().insert(SESSION_HEADER, value);
    }
    response
}

/// End a session that never became the client's, keeping its place under
/// `--max-sessions` until it has ended: a unit whose start went on past the
/// deadline, or whose removal is not confirmed, still counts.
fn end_holding(handle: SessionHandle, permit: OwnedSemaphorePermit) {
    handle.end();
    tokio::spawn(async move {
        handle.ended().await;
        drop(permit);
    });
}

/// Answer a request: JSON when nothing streams before the answer, else SSE
/// (as far as the client's `Accept` allows: a JSON-only client gets the
/// answer alone, an SSE-only client always a stream). A request the client
/// cancelled gets no JSON-RPC answer at all ([`unanswered`]).
async fn answer(stream: ReplyStream, accepts: Accepts) -> Response {
    answer_of(stream, accepts, None).await
}

/// [`answer`], with the answer to a stateless request (`stateless`: its
/// method) in the revision's form, and the request cancelled in its
/// session when the client closes the stream before the answer.
async fn answer_of(
    mut stream: ReplyStream,
    accepts: Accepts,
    stateless: Option<(&str, crate::CancelOnClose)>,
) -> Response {
    let (method, mut cancel) = match stateless {
        Some((method, cancel)) => (Some(method), Some(cancel)),
        None => (None, None),
    };
    let first = loop {
        let first = tokio::select! {
            biased;
            Some(event) = stream.events.recv() => Ok(event),
            response = &mut stream.response => Err(response),
        };
        match first {
            // A client that takes no streams cannot be sent what would stream.
            Ok(_) if !accepts.sse => continue,
            first => break first,
        }
    };
    let first = match first {
        Err(Ok(mut response)) => {
            if let Some(cancel) = cancel.as_mut() {
                cancel.armed = false;
            }
            if let Some(method) = method {
                box_jsonrpc::era::complete_result(method, &mut response);
            }
            if accepts.json {
                return json_response(StatusCode::OK, response);
            }
            response
        }
        // Dropped unanswered: the client cancelled it (MCP: no response is sent).
        Err(Err(_)) => {
            if let Some(cancel) = cancel.as_mut() {
                cancel.armed = false;
            }
            return unanswered(accepts);
        }
        Ok(event) => event,
    };
    let (out_tx, out_rx) = mpsc::channel(box_jsonrpc::REPLY_EVENTS);
    let _ = out_tx.send(first).await;
    let method = method.map(str::to_owned);
    tokio::spawn(async move {
        let answered = crate::forward_reply_of(stream, out_tx, method.as_deref()).await;
        if let Some(mut cancel) = cancel {
            cancel.armed = !answered;
        }
    });
    sse(out_rx)
}

/// The end of a POST whose request the client cancelled: MCP says the
/// receiver sends no response, so no JSON-RPC body. An SSE stream that ends
/// without a message when the client takes streams (the form a request's
/// answer may always have), else 202 with an empty body.
fn unanswered(accepts: Accepts) -> Response {
    if accepts.sse {
        let (_, nothing) = mpsc::channel(1);
        sse(nothing)
    } else {
        StatusCode::ACCEPTED.into_response()
    }
}

/// Which of the two answer forms a request's `Accept` allows (no header allows
/// both; `q=0` refuses a type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Accepts {
    json: bool,
    sse: bool,
}

impl Accepts {
    fn from_headers(headers: &HeaderMap) -> Self {
        let mut values = headers.get_all(header::ACCEPT).iter().peekable();
        if values.peek().is_none() {
            return Self {
                json: true,
                sse: true,
            };
        }
        let mut accepts = Self {
            json: false,
            sse: false,
        };
        let ranges = values
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','));
        for range in ranges {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            let refused = parts.any(|parameter| {
                parameter.split_once('=').is_some_and(|(name, value)| {
                    name.trim().eq_ignore_ascii_case("q")
                        && value.trim().parse::<f32>().is_ok_and(|q| q <= 0.0)
                })
            });
            if refused {
                continue;
            }
            match media.as_str() {
                "*/*" => {
                    accepts.json = true;
                    accepts.sse = true;
                }
                "application/json" | "application/*" => accepts.json = true,
                "text/event-stream" | "text/*" => accepts.sse = true,
                _ => {}
            }
        }
        accepts
    }
}

/// An SSE response of `messages`, one `message` event each, ending when they do.
fn sse(messages: mpsc::Receiver<Value>) -> Response {
    let events = futures::stream::unfold(messages, |mut messages| async move {
        let message = messages.recv().await?;
        let event = Event::default().event("message").data(message.to_string());
        Some((Ok::<_, Infallible>(event), messages))
    });
    sse_response(
        Sse::new(events)
            .keep_alive(KeepAlive::default())
            .into_response(),
    )
}

/// An SSE response that proxies must not buffer (events are meant to arrive as they happen).
fn sse_response(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

/// The GET stream's receiver, put back when the stream goes so the client may open another.
struct GeneralStream {
    receiver: Option<mpsc::Receiver<Value>>,
    slot: GeneralSlot,
}

impl Drop for GeneralStream {
    fn drop(&mut self) {
        if let (Some(receiver), Ok(mut slot)) = (self.receiver.take(), self.slot.lock()) {
            *slot = Some(receiver);
        }
    }
}

/// The session a GET or DELETE names, after the request checks: 405 for a
/// request of the stateless revision (its `MCP-Protocol-Version`: it has no
/// GET stream and no session DELETE), 400 when `Mcp-Session-Id` is missing,
/// 404 when it names no live session.
fn named_session(
    state: &AppState,
    headers: &HeaderMap,
    method: &str,
) -> Result<(String, SessionHandle, GeneralSlot), Response> {
    state.check(headers, "/mcp", Auth::Required)?;
    if headers
        .get(VERSION_HEADER)
        .is_some_and(|version| version.as_bytes() == STATELESS_VERSION.as_bytes())
    {
        let mut response = refuse(
            StatusCode::METHOD_NOT_ALLOWED,
            code::INVALID_REQUEST,
            format!(
                "{method}: MCP {STATELESS_VERSION} has no GET stream and no session DELETE; POST each request (close a box session with box/session.close)"
            ),
        );
        response
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("POST"));
        return Err(response);
    }
    let Some(session_id) = session_header(headers) else {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            code::INVALID_REQUEST,
            "Mcp-Session-Id is missing",
        ));
    };
    let Some((session, slot)) = state.lookup(&session_id) else {
        return Err(refuse(
            StatusCode::NOT_FOUND,
            code::INVALID_REQUEST,
            "no such session",
        ));
    };
    Ok((session_id, session, slot))
}

async fn get_mcp(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let (_, _, slot) = match named_session(&state, &headers, "GET") {
        Ok(named) => named,
        Err(response) => return response,
    };
    if let Err(response) = check_version(&headers, Version::Optional) {
        return response;
    }
    if !Accepts::from_headers(&headers).sse {
        return refuse(
            StatusCode::NOT_ACCEPTABLE,
            code::INVALID_REQUEST,
            "Accept must allow text/event-stream: a GET opens a stream",
        );
    }
    let receiver = slot.lock().ok().and_then(|mut slot| slot.take());
    let Some(receiver) = receiver else {
        return refuse(
            StatusCode::CONFLICT,
            code::INVALID_REQUEST,
            "this session already has a GET stream open",
        );
    };
    let general = GeneralStream {
        receiver: Some(receiver),
        slot,
    };
    let events = futures::stream::unfold(general, |mut general| async move {
        let message = general.receiver.as_mut()?.recv().await?;
        let event = Event::default().event("message").data(message.to_string());
        Some((Ok::<_, Infallible>(event), general))
    });
    sse_response(
        Sse::new(events)
            .keep_alive(KeepAlive::default())
            .into_response(),
    )
}

async fn delete_mcp(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let (session_id, session, _) = match named_session(&state, &headers, "DELETE") {
        Ok(named) => named,
        Err(response) => return response,
    };
    session.end();
    // `Prefer: respond-async` (RFC 7240): the client does not wait for the
    // removal (`box run --host`); the session keeps its place under
    // --max-sessions until its units are gone, as after a timed-out wait.
    if prefers_async(&headers) {
        return StatusCode::ACCEPTED.into_response();
    }
    // Answer once the units are gone, so "deleted" means deleted.
    if tokio::time::timeout(state.options.delete_wait, session.ended())
        .await
        .is_ok()
    {
        if let Ok(mut sessions) = state.sessions.lock() {
            sessions.remove(&session_id);
        }
        return StatusCode::OK.into_response();
    }
    // Not confirmed: the session keeps its entry (and its place under
    // --max-sessions) until its units are gone; a later DELETE asks again.
    let units_left = state.sessions_factory.units_left(&session_id);
    let left: Vec<String> = units_left
        .iter()
        .map(|unit| unit.description.clone())
        .collect();
    let mut response = json_response(
        StatusCode::SERVICE_UNAVAILABLE,
        json!({"jsonrpc": "2.0", "id": null, "error": {
            "code": code::INTERNAL_ERROR,
            "message": format!(
                "the session is ended, but the removal of its units is not confirmed after {}: {}; box keeps trying, and the session counts against --max-sessions until they are gone (then its id answers 404)",
                humantime::format_duration(state.options.delete_wait),
                if left.is_empty() { "its units are being removed".to_owned() } else { left.join("; ") }
            ),
            "data": {"unitsLeft": units_left.iter().map(|unit| json!({"unit": unit.unit, "id": unit.id})).collect::<Vec<_>>()},
        }}),
    );
    response.headers_mut().insert(
        header::RETRY_AFTER,
        HeaderValue::from(DELETE_RETRY_AFTER_SECS),
    );
    response
}

/// Whether a request's `Prefer` header asks for `respond-async`.
fn prefers_async(headers: &HeaderMap) -> bool {
    headers
        .get_all("prefer")
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|preference| {
            preference
                .split(';')
                .next()
                .is_some_and(|name| name.trim().eq_ignore_ascii_case("respond-async"))
        })
}

async fn metrics(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(response) = state.check(&headers, "/metrics", Auth::Required) {
        return response;
    }
    let (content_type, text) = state.sessions_factory.metrics();
    (StatusCode::OK, [(header::CONTENT_TYPE, content_type)], text).into_response()
}

/// A plain-text probe answer.
fn probe(status: StatusCode, text: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        text,
    )
        .into_response()
}

/// Liveness: the process answers. Behind the Host and Origin checks of
/// `/mcp`, not the bearer token: it reveals nothing, and a probe carries none.
async fn healthz(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(response) = state.check(&headers, "/healthz", Auth::Probe) {
        return response;
    }
    probe(StatusCode::OK, "ok\n".to_owned())
}

/// Readiness: not draining, and the host says its backend answers (503
/// otherwise). Behind the Host and Origin checks of `/mcp`, not the bearer
/// token; why the backend does not answer is said only to a request that
/// carries the token (it may name the engine's socket and the like).
async fn readyz(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(response) = state.check(&headers, "/readyz", Auth::Probe) {
        return response;
    }
    if state.shutdown.is_cancelled() {
        return probe(
            StatusCode::SERVICE_UNAVAILABLE,
            "draining: the host is shutting down\n".to_owned(),
        );
    }
    match state.sessions_factory.readiness().await {
        Ok(()) => probe(StatusCode::OK, "ready\n".to_owned()),
        Err(why) if bearer(&state.options, &headers) == Bearer::Valid => {
            probe(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n"))
        }
        Err(_) => probe(
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready (the reason is given with the bearer token)\n".to_owned(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A factory whose backend always answers; it never opens a session, and
    /// keeps the refusals it is told of.
    #[derive(Default)]
    struct Ready {
        refusals: Mutex<Vec<Refusal>>,
        /// Why the backend does not answer, when it does not.
        not_ready: Option<String>,
    }

    impl SessionFactory for Ready {
        fn open(
            &self,
            _id: String,
            _ask: crate::TransportAsk,
            _general: mpsc::Sender<Value>,
            _shutdown: &CancellationToken,
        ) -> SessionHandle {
            unreachable!("the readiness probes open no session")
        }
        fn end_wait(&self) -> Duration {
            Duration::ZERO
        }
        fn sessions_running(&self) -> usize {
            0
        }
        fn metrics(&self) -> (&'static str, String) {
            ("text/plain", String::new())
        }
        fn readiness(&self) -> futures::future::BoxFuture<'_, Result<(), String>> {
            let ready = match &self.not_ready {
                Some(why) => Err(why.clone()),
                None => Ok(()),
            };
            Box::pin(async move { ready })
        }
        fn units_left(&self, _id: &str) -> Vec<crate::UnitLeft> {
            Vec::new()
        }
        fn refused(&self, refusal: &Refusal) {
            self.refusals.lock().unwrap().push(refusal.clone());
        }
    }

    #[test]
    fn hosts_and_origins() {
        let options = HttpOptions::loopback();
        for host in [
            "localhost",
            "localhost:8080",
            "127.0.0.1:1",
            "[::1]:9",
            "127.0.0.2",
        ] {
            assert!(host_is_allowed(&options, host), "{host}");
        }
        for host in ["evil.example", "evil.example:80", "localhost.evil.example"] {
            assert!(!host_is_allowed(&options, host), "{host}");
        }
        for origin in ["http://localhost:3000", "https://127.0.0.1"] {
            assert!(origin_is_allowed(&options, origin), "{origin}");
        }
        for origin in [
            "https://evil.example",
            "null",
            "http://localhost@evil.example",
            "file://",
        ] {
            assert!(!origin_is_allowed(&options, origin), "{origin}");
        }
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(token_matches("secret-token-123456", "secret-token-123456"));
        assert!(!token_matches("secret-token-12345", "secret-token-123456"));
        assert!(!token_matches("", "secret-token-123456"));
    }

    #[tokio::test]
    async fn two_hundred_clients_connecting_at_once_are_all_queued() {
        // Nothing accepts: every connection waits in the listen queue. With
        // the standard backlog (128) the later SYNs are dropped and those
        // clients wait a second for the retransmit.
        let listener = bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let clients: Vec<_> = (0..200)
            .map(|n| {
                std::net::TcpStream::connect_timeout(&address, Duration::from_millis(500))
                    .unwrap_or_else(|error| panic!("client {n} was not queued: {error}"))
            })
            .collect();
        assert_eq!(clients.len(), 200);
    }

    #[tokio::test]
    async fn a_name_that_resolves_to_nothing_is_refused_with_the_flag() {
        let error = bind("nonexistent.invalid:80").await.unwrap_err();
        assert!(
            format!("{error:#}").contains("--listen nonexistent.invalid:80"),
            "{error:#}"
        );
    }

    fn state_of(factory: Arc<Ready>, options: HttpOptions) -> Arc<AppState> {
        Arc::new(AppState {
            sessions_factory: factory,
            permits: Arc::new(Semaphore::new(options.max_sessions)),
            options,
            sessions: Mutex::new(HashMap::new()),
            shutdown: CancellationToken::new(),
        })
    }

    /// Issue 22, item 14: a 421, a 403 and a 401 are each reported to the
    /// host once, with the reason, the status, the path and what was wrong
    /// (never the token); a request that passes reports nothing.
    #[tokio::test]
    async fn every_refusal_is_reported_to_the_host() {
        let factory = Arc::new(Ready::default());
        let options = HttpOptions {
            token: Some("the-token-0123456789".to_owned()),
            ..HttpOptions::loopback()
        };
        let state = state_of(factory.clone(), options);
        let headers = |pairs: &[(header::HeaderName, &str)]| {
            let mut headers = HeaderMap::new();
            for (name, value) in pairs {
                headers.insert(name.clone(), HeaderValue::from_str(value).unwrap());
            }
            headers
        };
        let cases = [
            (
                headers(&[(header::HOST, "evil.example")]),
                StatusCode::MISDIRECTED_REQUEST,
            ),
            (
                headers(&[
                    (header::HOST, "127.0.0.1"),
                    (header::ORIGIN, "https://evil.example"),
                ]),
                StatusCode::FORBIDDEN,
            ),
            (
                headers(&[(header::HOST, "127.0.0.1")]),
                StatusCode::UNAUTHORIZED,
            ),
            (
                headers(&[
                    (header::HOST, "127.0.0.1"),
                    (header::AUTHORIZATION, "Bearer a-wrong-token-9876543210"),
                ]),
                StatusCode::UNAUTHORIZED,
            ),
        ];
        for (headers, status) in cases {
            let response = metrics(State(state.clone()), headers).await;
            assert_eq!(response.status(), status);
        }
        let passing = headers(&[
            (header::HOST, "127.0.0.1"),
            (header::AUTHORIZATION, "Bearer the-token-0123456789"),
        ]);
        assert_eq!(
            metrics(State(state.clone()), passing).await.status(),
            StatusCode::OK
        );
        let seen = factory.refusals.lock().unwrap().clone();
        let summary: Vec<(&str, u16, &str)> = seen
            .iter()
            .map(|refusal| {
                (
                    refusal.reason.as_str(),
                    refusal.status,
                    refusal.path.as_str(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("host", 421, "/metrics"),
                ("origin", 403, "/metrics"),
                ("unauthorized", 401, "/metrics"),
                ("unauthorized", 401, "/metrics"),
            ]
        );
        assert!(seen[0].detail.contains("\"evil.example\""), "{seen:?}");
        assert!(seen[1].detail.contains("https://evil.example"), "{seen:?}");
        assert_eq!(
            seen[2].detail,
            "no bearer token in the Authorization header"
        );
        assert_eq!(seen[3].detail, "a wrong bearer token");
        for refusal in &seen {
            assert!(!refusal.detail.contains("token-"), "{refusal:?}");
        }
    }

    /// Issue 22, item 15: on a host with a bearer token, `/healthz` and
    /// `/readyz` answer a probe without it (the Host and Origin checks
    /// stay); why the host is not ready is told only with the token.
    #[tokio::test]
    async fn probes_answer_without_the_bearer_token() {
        let options = HttpOptions {
            token: Some("the-token-0123456789".to_owned()),
            ..HttpOptions::loopback()
        };
        let mut host = HeaderMap::new();
        host.insert(header::HOST, HeaderValue::from_static("127.0.0.1"));
        let factory = Arc::new(Ready::default());
        let state = state_of(factory.clone(), options.clone());
        let alive = healthz(State(state.clone()), host.clone()).await;
        assert_eq!(alive.status(), StatusCode::OK);
        let ready = readyz(State(state.clone()), host.clone()).await;
        assert_eq!(ready.status(), StatusCode::OK);
        assert!(factory.refusals.lock().unwrap().is_empty());
        // The Host check stays.
        let mut evil = HeaderMap::new();
        evil.insert(header::HOST, HeaderValue::from_static("evil.example"));
        let refused = healthz(State(state), evil).await;
        assert_eq!(refused.status(), StatusCode::MISDIRECTED_REQUEST);

        let body = |response: Response| async move {
            let bytes = axum::body::to_bytes(response.into_body(), 1 << 16)
                .await
                .unwrap();
            String::from_utf8(bytes.to_vec()).unwrap()
        };
        let why = "the docker backend does not answer: /run/docker.sock";
        let state = state_of(
            Arc::new(Ready {
                not_ready: Some(why.to_owned()),
                ..Ready::default()
            }),
            options,
        );
        let anonymous = readyz(State(state.clone()), host.clone()).await;
        assert_eq!(anonymous.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(!body(anonymous).await.contains("docker.sock"));
        let mut authorized = host;
        authorized.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer the-token-0123456789"),
        );
        let told = readyz(State(state), authorized).await;
        assert_eq!(told.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(body(told).await.contains("docker.sock"));
    }

    #[tokio::test]
    async fn readiness_is_refused_while_draining() {
        let options = HttpOptions::loopback();
        let state = Arc::new(AppState {
            sessions_factory: Arc::new(Ready::default()),
            permits: Arc::new(Semaphore::new(options.max_sessions)),
            options,
            sessions: Mutex::new(HashMap::new()),
            shutdown: CancellationToken::new(),
        });
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("127.0.0.1"));
        let ready = readyz(State(state.clone()), headers.clone()).await;
        assert_eq!(ready.status(), StatusCode::OK);
        state.shutdown.cancel();
        let draining = readyz(State(state.clone()), headers.clone()).await;
        assert_eq!(draining.status(), StatusCode::SERVICE_UNAVAILABLE);
        // Alive all the same.
        let alive = healthz(State(state), headers).await;
        assert_eq!(alive.status(), StatusCode::OK);
    }

    #[test]
    fn accept_headers_allow_what_they_name() {
        let accepts = |value: Option<&str>| {
            let mut headers = HeaderMap::new();
            if let Some(value) = value {
                headers.insert(header::ACCEPT, HeaderValue::from_str(value).unwrap());
            }
            let accepts = Accepts::from_headers(&headers);
            (accepts.json, accepts.sse)
        };
        assert_eq!(accepts(None), (true, true));
        assert_eq!(
            accepts(Some("application/json, text/event-stream")),
            (true, true)
        );
        assert_eq!(accepts(Some("*/*")), (true, true));
        assert_eq!(accepts(Some("Application/JSON")), (true, false));
        assert_eq!(accepts(Some("text/*;q=0.5")), (false, true));
        assert_eq!(
            accepts(Some("application/json;q=0, text/html")),
            (false, false)
        );
        assert_eq!(accepts(Some("text/html")), (false, false));
    }

    #[test]
    fn loopback_listen_addresses() {
        assert!(is_loopback_listen("127.0.0.1:8080"));
        assert!(is_loopback_listen("[::1]:8080"));
        assert!(is_loopback_listen("localhost:8080"));
        assert!(!is_loopback_listen("0.0.0.0:8080"));
        assert!(!is_loopback_listen("192.168.1.2:8080"));
    }

    fn headers(pairs: &[(&'static str, &[u8])]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_bytes(value).unwrap());
        }
        map
    }

    #[test]
    fn the_ask_is_read_from_the_path_and_headers_naming_each_source() {
        let ask = transport_ask(
            Some("ci"),
            &headers(&[
                ("box-profile", b"ci"),
                ("box-tighten", br#"{"servers": []}"#),
                ("box-max-read-bytes", b"4096"),
            ]),
        )
        .unwrap();
        assert_eq!(
            ask,
            TransportAsk {
                profile: Some(AskPart::new("ci", "the path /mcp/p/ci")),
                tighten: Some(AskPart::new(r#"{"servers": []}"#, "the Box-Tighten header")),
                max_read_bytes: Some(AskPart::new("4096", "the Box-Max-Read-Bytes header")),
                reattach: None,
            }
        );
        assert!(transport_ask(None, &HeaderMap::new()).unwrap().is_empty());
        let ask = transport_ask(None, &headers(&[("box-profile", b"ci")])).unwrap();
        assert_eq!(
            ask.profile,
            Some(AskPart::new("ci", "the Box-Profile header"))
        );
        // UTF-8 in a header is text (a tightening may name anything).
        let ask = transport_ask(None, &headers(&[("box-tighten", "\"é\"".as_bytes())])).unwrap();
        assert_eq!(ask.tighten.unwrap().text, "\"é\"");
    }

    #[test]
    fn a_malformed_ask_is_refused_naming_the_header() {
        for (path, pairs, expected) in [
            (
                Some("ci"),
                vec![("box-profile", &b"default"[..])],
                "box.profile: the path /mcp/p/ci asks for `ci` but the Box-Profile header asks for `default`",
            ),
            (
                None,
                vec![("box-tighten", &b"{}"[..]), ("box-tighten", &b"{}"[..])],
                "the Box-Tighten header is given more than once",
            ),
            (
                None,
                vec![("box-max-read-bytes", &b"\xff"[..])],
                "the Box-Max-Read-Bytes header is not UTF-8 text",
            ),
        ] {
            let error = transport_ask(path, &headers(&pairs)).unwrap_err();
            assert!(error.starts_with(expected), "{error}");
        }
    }

    #[test]
    fn a_later_request_may_repeat_the_ask_or_leave_it_out_but_not_change_it() {
        let started = TransportAsk {
            profile: Some(AskPart::new("ci", "the path /mcp/p/ci")),
            tighten: Some(AskPart::new("{}", "the Box-Tighten header")),
            max_read_bytes: None,
            reattach: None,
        };
        assert_eq!(same_ask(&started, &started), Ok(()));
        assert_eq!(same_ask(&started, &TransportAsk::default()), Ok(()));
        // The same profile from another place is the same ask.
        let by_header = TransportAsk {
            profile: Some(AskPart::new("ci", "the Box-Profile header")),
            ..TransportAsk::default()
        };
        assert_eq!(same_ask(&started, &by_header), Ok(()));
        let changed = TransportAsk {
            max_read_bytes: Some(AskPart::new("5", "the Box-Max-Read-Bytes header")),
            ..TransportAsk::default()
        };
        let error = same_ask(&started, &changed).unwrap_err();
        assert!(
            error.starts_with("Box-Max-Read-Bytes: the Box-Max-Read-Bytes header differs"),
            "{error}"
        );
    }
}
