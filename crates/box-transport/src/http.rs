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

mod answer;
mod checks;
mod handshake;
mod probes;
mod stateless;

use answer::*;
use checks::*;
use handshake::*;
use probes::*;
use stateless::*;

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
        fn reattach(
            &self,
            _id: String,
            _ask: crate::TransportAsk,
            _general: mpsc::Sender<Value>,
            _shutdown: &CancellationToken,
        ) -> SessionHandle {
            unreachable!("the readiness probes reattach no session")
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
    fn loopback_listen_addresses() {
        assert!(is_loopback_listen("127.0.0.1:8080"));
        assert!(is_loopback_listen("[::1]:8080"));
        assert!(is_loopback_listen("localhost:8080"));
        assert!(!is_loopback_listen("0.0.0.0:8080"));
        assert!(!is_loopback_listen("192.168.1.2:8080"));
    }
}
