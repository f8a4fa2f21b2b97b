//! The egress proxy of one unit: it serves the unit's Unix socket, judges every
//! `CONNECT` and every plain-HTTP request by one policy function, connects to exactly
//! the addresses it judged, and reports one event per attempt.
//!
//! The unit is identified by the socket a connection arrived on, never by anything
//! the client says; the socket is the untrusted edge (any process in the unit can
//! speak to it, bypassing the bridge), so all policy lives here.
//!
//! - `CONNECT host:port` is authorised once, for its authority. The tunnel's first
//!   bytes are then inspected: on a TLS port (`Options::tls_ports`) they must be a
//!   ClientHello naming the `CONNECT` host (a name target) or no host (an address
//!   target); on other ports a ClientHello, if the client starts with one, is held to
//!   the same rule and anything else passes. A refusal inside the tunnel closes it,
//!   after a TLS `unrecognized_name` alert when the server name was wrong or missing.
//! - An absolute-form request (`GET http://host/path`) is judged per request, on every
//!   request of a keep-alive connection, and forwarded in origin-form with a rebuilt
//!   request line and headers; a `Host` header naming another authority is refused.
//!   A refused request closes the connection after its answer.
//! - Refusals before a tunnel opens answer an HTTP status with a one-line body naming
//!   the reason; upstream failures answer 502.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use std::os::fd::OwnedFd;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, timeout};

use box_policy::allow::parse_authority;

use crate::Rule;
use crate::address::{ResolveError, resolve};
use crate::event::{Decision, Event, Failure, Refusal};
use crate::handoff;
use crate::http::{
    self, Body, HeadError, Inbound, RequestHead, TargetError, absolute_target, has_token,
    keeps_alive, request_body, response_body, send,
};
use crate::limit::TokenBucket;
use crate::policy::{Limits, Options, Policy, UnitIdentity};
use crate::splice::{self, Spliceable};
use crate::tls::{Hello, HelloError, HelloParser, MAX_CLIENT_HELLO, starts_like_tls};
use crate::{Host, HostName};

/// Where the proxy sends its events. Called once per attempt, from the connection's
/// task, so it must not block: write a log line, bump a counter, or `try_send`.
pub type EventSink = Arc<dyn Fn(Event) + Send + Sync>;

/// Everything the proxy needs to serve one unit.
pub struct Unit {
    /// Whose connections these are.
    pub identity: UnitIdentity,
    /// The unit's live policy ([`crate::PolicyHandle::subscribe`]).
    pub policy: watch::Receiver<Arc<Policy>>,
    /// Connection and bandwidth limits.
    pub limits: Limits,
    /// Ports, timeouts.
    pub options: Options,
    /// Where the proxy adds up how long the unit's traffic waited for its
    /// bandwidth cap, in nanoseconds (both directions; read live by the host's
    /// limit events).
    pub throttled: Arc<AtomicU64>,
}

/// A TLS alert, fatal, `unrecognized_name` (RFC 6066 §3).
const ALERT_UNRECOGNIZED_NAME: [u8; 7] = [21, 3, 3, 0, 2, 2, 112];

/// How many listeners one unit may have handed over at once: its bridge hands
/// one, and a second covers a bridge that offers again before this side saw
/// the first handoff end.
const MAX_LISTENERS: usize = 2;

/// The most a connection's first read takes (a request head's start, or a
/// handoff's preface).
const FIRST_READ: usize = 4096;

struct Shared {
    identity: UnitIdentity,
    policy: watch::Receiver<Arc<Policy>>,
    options: Options,
    connections: Arc<Semaphore>,
    listeners: Arc<Semaphore>,
    max_connections: usize,
    up: Option<TokenBucket>,
    down: Option<TokenBucket>,
    events: EventSink,
}

/// Serve `listener`, the unit's socket, until the returned future is dropped; dropping
/// it ends every connection it accepted. Returns only when accepting fails for a reason
/// other than a momentary shortage (file descriptors, memory), which is retried.
pub async fn serve(listener: UnixListener, unit: Unit, events: EventSink) -> io::Result<()> {
    let shared = Arc::new(Shared {
        identity: unit.identity,
        policy: unit.policy,
        options: unit.options,
        connections: Arc::new(Semaphore::new(unit.limits.max_connections.get())),
        listeners: Arc::new(Semaphore::new(MAX_LISTENERS)),
        max_connections: unit.limits.max_connections.get(),
        up: unit
            .limits
            .bytes_per_second
            .map(|rate| TokenBucket::new(rate, unit.throttled.clone())),
        down: unit
            .limits
            .bytes_per_second
            .map(|rate| TokenBucket::new(rate, unit.throttled.clone())),
        events,
    });
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    splice::widen_send_buffer(&stream);
                    connections.spawn(unix_connection(stream, shared.clone()));
                }
                Err(error) if is_momentary(&error) => {
                    tracing::warn!(session = %shared.identity.session, unit = %shared.identity.unit, %error, "egress proxy cannot accept; retrying");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(error) => return Err(error),
            },
            Some(ended) = connections.join_next() => {
                if let Err(error) = ended {
                    tracing::error!(session = %shared.identity.session, unit = %shared.identity.unit, %error, "egress connection task failed");
                }
            }
        }
    }
}

/// Whether an accept error is a momentary shortage worth retrying.
pub(crate) fn is_momentary(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::OutOfMemory
    ) // ENFILE, EMFILE, ENOBUFS on Linux.
        || matches!(error.raw_os_error(), Some(23 | 24 | 105))
}

/// What one attempt has gathered so far, reported once as an [`Event`].
struct Attempt {
    method: String,
    host: String,
    port: u16,
    sni: Option<String>,
    address: Option<SocketAddr>,
    bytes_up: u64,
    bytes_down: u64,
    started: Instant,
    error: Option<String>,
}

impl Attempt {
    fn new(method: &str, started: Instant) -> Self {
        Self {
            method: method.to_owned(),
            host: String::new(),
            port: 0,
            sni: None,
            address: None,
            bytes_up: 0,
            bytes_down: 0,
            started,
            error: None,
        }
    }
}

impl Shared {
    fn report(&self, attempt: Attempt, decision: Decision) {
        tracing::debug!(
            session = %self.identity.session,
            unit = %self.identity.unit,
            host = %attempt.host,
            port = attempt.port,
            outcome = decision.outcome(),
            "egress attempt"
        );
        (self.events)(Event {
            session: self.identity.session.clone(),
            unit: self.identity.unit.clone(),
            method: attempt.method,
            host: attempt.host,
            port: attempt.port,
            sni: attempt.sni,
            address: attempt.address,
            decision,
            bytes_up: attempt.bytes_up,
            bytes_down: attempt.bytes_down,
            duration: attempt.started.elapsed(),
            error: attempt.error,
        });
    }

    fn policy(&self) -> Arc<Policy> {
        self.policy.borrow().clone()
    }
}

/// The reading half of a client connection: the unit's Unix socket, or a TCP
/// connection accepted on a listener the unit handed over.
trait ClientReader: AsyncRead + Unpin + Send + 'static {}
impl<T: AsyncRead + Unpin + Send + 'static> ClientReader for T {}

/// The writing half of a client connection.
trait ClientWriter: AsyncWrite + Spliceable + Unpin + Send + 'static {}
impl<T: AsyncWrite + Spliceable + Unpin + Send + 'static> ClientWriter for T {}

/// The client side of a connection.
struct Client<R, W> {
    inbound: Inbound<R>,
    writer: W,
}

/// An open upstream connection for plain HTTP, reused by the next request to the same
/// authority.
struct Upstream {
    host: Host,
    port: u16,
    address: SocketAddr,
    inbound: Inbound<tokio::net::tcp::OwnedReadHalf>,
    writer: tokio::net::tcp::OwnedWriteHalf,
}

enum Next {
    KeepAlive,
    Close,
}

/// A connection on the unit's socket: a client's, or the bridge handing over
/// its listener ([`handoff`]), told apart by the first read.
async fn unix_connection(stream: UnixStream, shared: Arc<Shared>) {
    // Counted from accept, so idle connections count against the limit too.
    let permit = shared.connections.clone().try_acquire_owned().ok();
    let first_head = Instant::now() + shared.options.head_timeout;
    let mut first = vec![0; FIRST_READ];
    let read = timeout(
        shared.options.head_timeout,
        handoff::first_read(&stream, &mut first),
    )
    .await;
    // Silent until the head timeout, or gone: nothing was attempted.
    let Ok(Ok((read, fd))) = read else { return };
    first.truncate(read);
    if first == handoff::PREFACE {
        drop(permit);
        return take_listener(stream, fd, shared).await;
    }
    // A descriptor sent along with anything else is closed here, unused.
    drop(fd);
    let (reader, writer) = stream.into_split();
    let client = Client {
        inbound: Inbound::with_buffered(reader, first),
        writer,
    };
    connection(client, permit, shared, Some(first_head)).await;
}

/// Accept on the listener a unit's bridge handed over, for as long as the
/// bridge keeps the handoff's connection open; every connection is served as
/// one on the unit's socket would be.
async fn take_listener(stream: UnixStream, fd: Option<OwnedFd>, shared: Arc<Shared>) {
    let (mut control, mut answer_to) = stream.into_split();
    let taken = match (fd, shared.listeners.clone().try_acquire_owned()) {
        (None, _) => Err("no listener came with the handoff".to_owned()),
        (_, Err(_)) => Err(format!(
            "the unit has handed over {MAX_LISTENERS} listeners already"
        )),
        (Some(fd), Ok(slot)) => handoff::listener(fd).map(|listener| (listener, slot)),
    };
    let (listener, slot) = match taken {
        Ok(taken) => taken,
        Err(reason) => {
            tracing::warn!(session = %shared.identity.session, unit = %shared.identity.unit, %reason, "egress listener handoff declined");
            let answer = [handoff::DECLINED, reason.as_bytes(), b"\n"].concat();
            let _ = answer_to.write_all(&answer).await;
            return;
        }
    };
    if answer_to.write_all(handoff::ACCEPTED).await.is_err() {
        return;
    }
    tracing::debug!(session = %shared.identity.session, unit = %shared.identity.unit, "egress proxy accepts on the unit's listener");
    let mut connections = JoinSet::new();
    let mut byte = [0; 1];
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let permit = shared.connections.clone().try_acquire_owned().ok();
                    let _ = stream.set_nodelay(true);
                    let (reader, writer) = stream.into_split();
                    let client = Client { inbound: Inbound::new(reader), writer };
                    connections.spawn(connection(client, permit, shared.clone(), None));
                }
                Err(error) if is_momentary(&error) => {
                    tracing::warn!(session = %shared.identity.session, unit = %shared.identity.unit, %error, "egress proxy cannot accept on the unit's listener; retrying");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(error) => {
                    tracing::warn!(session = %shared.identity.session, unit = %shared.identity.unit, %error, "egress proxy stops accepting on the unit's listener");
                    break;
                }
            },
            // The bridge sends nothing more: any byte, or the end, ends the handoff.
            _ = control.read(&mut byte) => break,
            Some(ended) = connections.join_next() => {
                if let Err(error) = ended {
                    tracing::error!(session = %shared.identity.session, unit = %shared.identity.unit, %error, "egress connection task failed");
                }
            }
        }
    }
    // The bridge accepts from here on (its copy of the listener stays open);
    // the connections this side accepted run to their end.
    drop((listener, slot, control, answer_to));
    while connections.join_next().await.is_some() {}
}

/// Serve `client`'s requests. The first head must be whole by `first_head`
/// (counted from accept, where a first read already took some of the time);
/// each later one gets the head timeout from when it is awaited.
async fn connection<R: ClientReader, W: ClientWriter>(
    mut client: Client<R, W>,
    permit: Option<OwnedSemaphorePermit>,
    shared: Arc<Shared>,
    mut first_head: Option<Instant>,
) {
    let mut upstream: Option<Upstream> = None;
    loop {
        let started = Instant::now();
        let limit = first_head.take().map_or(shared.options.head_timeout, |by| {
            by.saturating_duration_since(started)
        });
        let head = match timeout(limit, client.inbound.read_request()).await {
            Err(_) if client.inbound.buffered().is_empty() => return,
            Err(_) => {
                let attempt = Attempt::new("", started);
                return refuse(&mut client, &shared, attempt, Refusal::HeadTimeout).await;
            }
            Ok(Ok(None)) => return,
            Ok(Ok(Some(head))) => head,
            Ok(Err(error)) => {
                let attempt = Attempt::new("", started);
                let refusal = match error {
                    HeadError::TooLarge(limit) => Refusal::HeadTooLarge { limit },
                    HeadError::Malformed(detail) => Refusal::BadRequest(detail),
                    HeadError::Truncated | HeadError::Io(_) => return,
                };
                return refuse(&mut client, &shared, attempt, refusal).await;
            }
        };
        let attempt = Attempt::new(&head.method, started);
        if head.method == "CONNECT" {
            return connect(&mut client, head, &shared, attempt, permit.is_some()).await;
        }
        match plain(
            &mut client,
            &head,
            &shared,
            &mut upstream,
            attempt,
            permit.is_some(),
        )
        .await
        {
            Next::KeepAlive => {}
            Next::Close => return,
        }
    }
}

/// Answer a refusal (the connection closes after it) and report it.
async fn refuse<R: ClientReader, W: ClientWriter>(
    client: &mut Client<R, W>,
    shared: &Shared,
    attempt: Attempt,
    refusal: Refusal,
) {
    let (code, phrase) = refusal.status();
    let target = match (attempt.host.as_str(), attempt.port) {
        ("", _) => String::new(),
        (host, 0) => format!(" {host}"),
        (host, port) => format!(" {host}:{port}"),
    };
    let body = format!(
        "box egress refused{target}: {}: {refusal}\n",
        refusal.reason()
    );
    answer(&mut client.writer, code, phrase, &body).await;
    shared.report(attempt, Decision::Refused(refusal));
}

/// Answer 502 for an allowed attempt that could not reach upstream, and report it.
async fn fail<R: ClientReader, W: ClientWriter>(
    client: &mut Client<R, W>,
    shared: &Shared,
    attempt: Attempt,
    rule: Rule,
    failure: Failure,
) {
    let body = format!(
        "box egress could not reach {}:{}: {}: {failure}\n",
        attempt.host,
        attempt.port,
        failure.reason()
    );
    answer(&mut client.writer, 502, "Bad Gateway", &body).await;
    shared.report(attempt, Decision::Failed { rule, failure });
}

async fn answer<W: AsyncWrite + Unpin>(writer: &mut W, code: u16, phrase: &str, body: &str) {
    let response = format!(
        "HTTP/1.1 {code} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    // The client may already have gone; its attempt is reported either way.
    let _ = writer.write_all(response.as_bytes()).await;
    let _ = writer.shutdown().await;
}

/// Why no upstream connection was opened.
enum Opening {
    Refused(Refusal),
    Failed(Failure),
}

/// Resolve `host` (judging every address) and connect to the first address that
/// answers, never handing the name to anyone else.
async fn open(
    host: &Host,
    port: u16,
    policy: &Policy,
    options: &Options,
) -> Result<TcpStream, Opening> {
    let addresses = match timeout(options.connect_timeout, resolve(host, port, policy)).await {
        Err(_) => {
            return Err(Opening::Failed(Failure::Resolve(format!(
                "resolving {host} took longer than {:?}",
                options.connect_timeout
            ))));
        }
        Ok(Err(ResolveError::Forbidden { address, range })) => {
            return Err(Opening::Refused(Refusal::ForbiddenAddress {
                address,
                range,
            }));
        }
        Ok(Err(ResolveError::Failed(detail))) => {
            return Err(Opening::Failed(Failure::Resolve(detail)));
        }
        Ok(Ok(addresses)) => addresses,
    };
    let mut last = String::new();
    for address in addresses {
        match timeout(options.connect_timeout, TcpStream::connect(address)).await {
            Ok(Ok(stream)) => {
                // Small writes (a ClientHello, a request head) must not wait for Nagle.
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Ok(Err(error)) => last = format!("cannot connect to {address}: {error}"),
            Err(_) => {
                last = format!(
                    "connecting to {address} took longer than {:?}",
                    options.connect_timeout
                );
            }
        }
    }
    Err(Opening::Failed(Failure::Connect(last)))
}

async fn connect<R: ClientReader, W: ClientWriter>(
    client: &mut Client<R, W>,
    head: RequestHead,
    shared: &Shared,
    mut attempt: Attempt,
    permitted: bool,
) {
    let (host, port) = match parse_authority(&head.target, None) {
        Ok(target) => target,
        Err(error) => {
            attempt.host = head.target.clone();
            return refuse(client, shared, attempt, Refusal::BadHost(error)).await;
        }
    };
    attempt.host = host.to_string();
    attempt.port = port;
    if !permitted {
        let limit = shared.max_connections;
        return refuse(
            client,
            shared,
            attempt,
            Refusal::TooManyConnections { limit },
        )
        .await;
    }
    let policy = shared.policy();
    let Some(rule) = policy.allow.find(&host, port).cloned() else {
        return refuse(client, shared, attempt, Refusal::NotAllowed).await;
    };
    let upstream = match open(&host, port, &policy, &shared.options).await {
        Ok(upstream) => upstream,
        Err(Opening::Refused(refusal)) => return refuse(client, shared, attempt, refusal).await,
        Err(Opening::Failed(failure)) => return fail(client, shared, attempt, rule, failure).await,
    };
    attempt.address = upstream.peer_addr().ok();
    if let Err(error) = client
        .writer
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await
    {
        attempt.error = Some(format!("the client went away: {error}"));
        return shared.report(attempt, Decision::Allowed { rule });
    }
    let check = FirstFlight {
        expected: host.name().cloned(),
        tls_required: shared.options.tls_ports.contains(&port),
    };
    match tunnel(client, upstream, &check, shared, &mut attempt).await {
        Ok(()) => shared.report(attempt, Decision::Allowed { rule }),
        Err(TunnelEnd::Io(error)) => {
            attempt.error = Some(error);
            shared.report(attempt, Decision::Allowed { rule });
        }
        Err(TunnelEnd::Refused(refusal)) => {
            if let Refusal::SniMismatch { sni } = &refusal {
                attempt.sni = Some(sni.clone());
            }
            if matches!(refusal, Refusal::SniMismatch { .. } | Refusal::SniMissing) {
                let _ = client.writer.write_all(&ALERT_UNRECOGNIZED_NAME).await;
            }
            let _ = client.writer.shutdown().await;
            shared.report(attempt, Decision::Refused(refusal));
        }
    }
}

/// What a tunnel's first bytes must be.
struct FirstFlight {
    /// The `CONNECT` host, when it is a name; a server name must equal it, and an
    /// address target must send none.
    expected: Option<HostName>,
    /// Whether the port is a TLS port, where a ClientHello with a server name is required.
    tls_required: bool,
}

enum TunnelEnd {
    Refused(Refusal),
    Io(String),
}

async fn tunnel<R: ClientReader, W: ClientWriter>(
    client: &mut Client<R, W>,
    upstream: TcpStream,
    check: &FirstFlight,
    shared: &Shared,
    attempt: &mut Attempt,
) -> Result<(), TunnelEnd> {
    let (mut upstream_reader, mut upstream_writer) = upstream.into_split();
    let Client { inbound, writer } = client;
    let mut sni: Option<String> = None;
    let mut up = 0;
    let mut down = 0;
    let hello_timeout = shared.options.client_hello_timeout;
    let upload = async {
        sni = first_flight(inbound, check, hello_timeout).await?;
        inbound
            .forward_to_end(&mut upstream_writer, shared.up.as_ref(), &mut up)
            .await
            .map_err(|error| TunnelEnd::Io(format!("unit to upstream: {error}")))
    };
    let download = async {
        splice::relay(
            &mut upstream_reader,
            writer,
            shared.down.as_ref(),
            &mut down,
        )
        .await
        .map_err(|error| TunnelEnd::Io(format!("upstream to unit: {error}")))
    };
    let result = tokio::try_join!(upload, download).map(|_| ());
    attempt.sni = sni;
    attempt.bytes_up = up;
    attempt.bytes_down = down;
    result
}

/// Inspect the tunnel's first bytes (left in the buffer to forward); the server name
/// a ClientHello carried, if one came.
async fn first_flight<R: ClientReader>(
    inbound: &mut Inbound<R>,
    check: &FirstFlight,
    hello_timeout: Duration,
) -> Result<Option<String>, TunnelEnd> {
    let io_error = |error: io::Error| TunnelEnd::Io(format!("unit to upstream: {error}"));
    if !check.tls_required {
        // Two bytes tell a TLS record from anything else; a protocol where the server
        // speaks first just waits here while the download side runs.
        loop {
            let buffered = inbound.buffered();
            if buffered.len() >= 2 || (!buffered.is_empty() && !starts_like_tls(buffered)) {
                break;
            }
            if inbound.fill(MAX_CLIENT_HELLO).await.map_err(io_error)? == 0 {
                return Ok(None);
            }
        }
        if !starts_like_tls(inbound.buffered()) {
            return Ok(None);
        }
    }
    let server_name = match timeout(hello_timeout, read_hello(inbound)).await {
        Err(_) => return Err(TunnelEnd::Refused(Refusal::ClientHelloTimeout)),
        Ok(result) => result?,
    };
    let expected = check.expected.as_ref().map(HostName::as_str);
    match (server_name, expected) {
        (Some(name), Some(expected)) if name == expected => Ok(Some(name)),
        (Some(name), _) => Err(TunnelEnd::Refused(Refusal::SniMismatch { sni: name })),
        (None, Some(_)) if check.tls_required => Err(TunnelEnd::Refused(Refusal::SniMissing)),
        (None, _) => Ok(None),
    }
}

async fn read_hello<R: ClientReader>(
    inbound: &mut Inbound<R>,
) -> Result<Option<String>, TunnelEnd> {
    let mut parser = HelloParser::default();
    loop {
        match parser.advance(inbound.buffered()) {
            Ok(Hello::Complete { server_name }) => return Ok(server_name),
            Ok(Hello::Incomplete) => {}
            Err(HelloError::NotTls) => return Err(TunnelEnd::Refused(Refusal::NotTls)),
            Err(HelloError::Invalid(detail)) => {
                return Err(TunnelEnd::Refused(Refusal::ClientHelloInvalid(detail)));
            }
        }
        let read = inbound
            .fill(MAX_CLIENT_HELLO)
            .await
            .map_err(|error| TunnelEnd::Io(format!("unit to upstream: {error}")))?;
        if read == 0 {
            return Err(TunnelEnd::Refused(if inbound.buffered().is_empty() {
                Refusal::NotTls
            } else {
                Refusal::ClientHelloInvalid(
                    "the client closed before its ClientHello ended".to_owned(),
                )
            }));
        }
    }
}

async fn plain<R: ClientReader, W: ClientWriter>(
    client: &mut Client<R, W>,
    head: &RequestHead,
    shared: &Shared,
    upstream: &mut Option<Upstream>,
    mut attempt: Attempt,
    permitted: bool,
) -> Next {
    let target = match absolute_target(&head.target) {
        Ok(target) => target,
        Err(TargetError::Form(detail)) => {
            refuse(client, shared, attempt, Refusal::BadRequest(detail)).await;
            return Next::Close;
        }
        Err(TargetError::Host(authority, error)) => {
            attempt.host = authority;
            refuse(client, shared, attempt, Refusal::BadHost(error)).await;
            return Next::Close;
        }
    };
    attempt.host = target.host.to_string();
    attempt.port = target.port;
    if let Some(refusal) = check_request(head, &target.host, target.port, permitted, shared) {
        refuse(client, shared, attempt, refusal).await;
        return Next::Close;
    }
    let body = match request_body(head) {
        Ok(body) => body,
        Err(detail) => {
            refuse(client, shared, attempt, Refusal::BadRequest(detail)).await;
            return Next::Close;
        }
    };
    let policy = shared.policy();
    let Some(rule) = policy.allow.find(&target.host, target.port).cloned() else {
        refuse(client, shared, attempt, Refusal::NotAllowed).await;
        return Next::Close;
    };
    let reusable = upstream
        .as_ref()
        .is_some_and(|open| open.host == target.host && open.port == target.port);
    if !reusable {
        *upstream = None;
        match open(&target.host, target.port, &policy, &shared.options).await {
            Ok(stream) => {
                let address = match stream.peer_addr() {
                    Ok(address) => address,
                    Err(error) => {
                        let failure =
                            Failure::Connect(format!("the upstream connection failed: {error}"));
                        fail(client, shared, attempt, rule, failure).await;
                        return Next::Close;
                    }
                };
                let (reader, writer) = stream.into_split();
                *upstream = Some(Upstream {
                    host: target.host.clone(),
                    port: target.port,
                    address,
                    inbound: Inbound::new(reader),
                    writer,
                });
            }
            Err(Opening::Refused(refusal)) => {
                refuse(client, shared, attempt, refusal).await;
                return Next::Close;
            }
            Err(Opening::Failed(failure)) => {
                fail(client, shared, attempt, rule, failure).await;
                return Next::Close;
            }
        }
    }
    let Some(open) = upstream.as_mut() else {
        return Next::Close;
    };
    attempt.address = Some(open.address);
    let continues = body != Body::None && has_token(&head.headers, "expect", "100-continue");
    let request = rebuild_request(head, &target.path, &target.authority);
    let outcome = exchange(
        client,
        head,
        open,
        &request,
        body,
        continues,
        shared,
        &mut attempt,
    )
    .await;
    let next = match outcome {
        Ok(Exchange::KeepAlive) if keeps_alive(head.minor_version, &head.headers) => {
            Next::KeepAlive
        }
        Ok(Exchange::KeepAlive | Exchange::Close) => {
            *upstream = None;
            Next::Close
        }
        Err(ExchangeError::BeforeResponse(failure)) => {
            *upstream = None;
            fail(client, shared, attempt, rule, failure).await;
            return Next::Close;
        }
        Err(ExchangeError::During(error)) => {
            *upstream = None;
            attempt.error = Some(error);
            Next::Close
        }
    };
    shared.report(attempt, Decision::Allowed { rule });
    next
}

/// The checks on a plain request before its host is judged: the connection limit and
/// a `Host` header that agrees with the URL.
fn check_request(
    head: &RequestHead,
    host: &Host,
    port: u16,
    permitted: bool,
    shared: &Shared,
) -> Option<Refusal> {
    if !permitted {
        return Some(Refusal::TooManyConnections {
            limit: shared.max_connections,
        });
    }
    let mut headers = http::values(&head.headers, "host");
    let first = headers.next();
    if headers.next().is_some() {
        return Some(Refusal::BadRequest(
            "the request carries two Host headers".to_owned(),
        ));
    }
    let header = first.map(String::from_utf8_lossy)?;
    match parse_authority(&header, Some(80)) {
        Ok((header_host, header_port)) if header_host == *host && header_port == port => None,
        Ok(_) | Err(_) => Some(Refusal::HostMismatch {
            header: header.into_owned(),
        }),
    }
}

/// The request line and headers sent upstream: origin-form, the client's headers
/// without the ones meant for the proxy, and a `Host` header if it had none.
fn rebuild_request(head: &RequestHead, path: &str, authority: &str) -> Vec<u8> {
    let mut out = format!("{} {path} HTTP/1.{}\r\n", head.method, head.minor_version).into_bytes();
    let mut has_host = false;
    for (name, value) in &head.headers {
        let lower = name.to_ascii_lowercase();
        match lower.as_str() {
            // Meant for this hop only; Expect: 100-continue is answered by the proxy.
            "proxy-connection" | "proxy-authorization" | "keep-alive" => continue,
            "expect" if value.eq_ignore_ascii_case(b"100-continue") => continue,
            "host" => has_host = true,
            _ => {}
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    if !has_host {
        out.extend_from_slice(format!("Host: {authority}\r\n").as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out
}

enum Exchange {
    KeepAlive,
    Close,
}

enum ExchangeError {
    /// Nothing was answered to the client yet: answer 502.
    BeforeResponse(Failure),
    /// Part of the response went out: close.
    During(String),
}

/// Forward one request and its response.
#[allow(clippy::too_many_arguments)]
async fn exchange<R: ClientReader, W: ClientWriter>(
    client: &mut Client<R, W>,
    head: &RequestHead,
    upstream: &mut Upstream,
    request: &[u8],
    body: Body,
    continues: bool,
    shared: &Shared,
    attempt: &mut Attempt,
) -> Result<Exchange, ExchangeError> {
    let up_bucket = shared.up.as_ref();
    let down_bucket = shared.down.as_ref();
    let broken = |error: io::Error| {
        ExchangeError::BeforeResponse(Failure::Connect(format!(
            "the upstream connection broke: {error}"
        )))
    };
    send(
        &mut upstream.writer,
        request,
        up_bucket,
        &mut attempt.bytes_up,
    )
    .await
    .map_err(broken)?;
    if continues {
        client
            .writer
            .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
            .await
            .map_err(|error| ExchangeError::During(format!("the client went away: {error}")))?;
    }
    client
        .inbound
        .forward_body(body, &mut upstream.writer, up_bucket, &mut attempt.bytes_up)
        .await
        .map_err(|error| ExchangeError::During(format!("request body: {error}")))?;
    let mut answered = false;
    loop {
        let response = match upstream.inbound.read_response().await {
            Ok(response) => response,
            Err(error) => {
                let detail = match error {
                    HeadError::TooLarge(limit) => {
                        format!("the response head is longer than {limit} bytes")
                    }
                    HeadError::Malformed(detail) => detail,
                    HeadError::Truncated => "upstream closed without a whole response".to_owned(),
                    HeadError::Io(error) => format!("reading the response: {error}"),
                };
                return Err(if answered {
                    ExchangeError::During(detail)
                } else {
                    ExchangeError::BeforeResponse(Failure::BadResponse(detail))
                });
            }
        };
        answered = true;
        send(
            &mut client.writer,
            &response.raw,
            down_bucket,
            &mut attempt.bytes_down,
        )
        .await
        .map_err(|error| ExchangeError::During(format!("the client went away: {error}")))?;
        if response.code == 101 {
            // An upgrade (WebSocket) turns the connection into a tunnel to this
            // authority, which the request was judged for.
            let (up, down) = tokio::join!(
                client.inbound.forward_to_end(
                    &mut upstream.writer,
                    up_bucket,
                    &mut attempt.bytes_up
                ),
                upstream.inbound.forward_to_end(
                    &mut client.writer,
                    down_bucket,
                    &mut attempt.bytes_down
                ),
            );
            up.and(down)
                .map_err(|error| ExchangeError::During(error.to_string()))?;
            return Ok(Exchange::Close);
        }
        if (100..200).contains(&response.code) {
            continue;
        }
        let framing = response_body(&head.method, &response)
            .map_err(|detail| ExchangeError::During(format!("response framing: {detail}")))?;
        upstream
            .inbound
            .forward_body(
                framing,
                &mut client.writer,
                down_bucket,
                &mut attempt.bytes_down,
            )
            .await
            .map_err(|error| ExchangeError::During(format!("response body: {error}")))?;
        let open =
            framing != Body::UntilClose && keeps_alive(response.minor_version, &response.headers);
        return Ok(if open {
            Exchange::KeepAlive
        } else {
            Exchange::Close
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn requests_are_rebuilt_in_origin_form_without_proxy_headers() {
        let head = RequestHead {
            method: "POST".to_owned(),
            target: "http://example.com/x".to_owned(),
            minor_version: 1,
            headers: vec![
                ("Proxy-Authorization".to_owned(), b"Basic eA==".to_vec()),
                ("Proxy-Connection".to_owned(), b"keep-alive".to_vec()),
                ("Expect".to_owned(), b"100-continue".to_vec()),
                ("Content-Length".to_owned(), b"3".to_vec()),
            ],
        };
        assert_eq!(
            String::from_utf8(rebuild_request(&head, "/x", "example.com")).unwrap(),
            "POST /x HTTP/1.1\r\nContent-Length: 3\r\nHost: example.com\r\n\r\n"
        );
    }
}
