//! A proxy under test, fake upstreams on 127.0.0.1, and small clients.

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use box_egress::{
    AllowList, Event, HostName, Limits, Options, Policy, PolicyHandle, PrivateDestinations, Unit,
    UnitIdentity, serve,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// The name every test pins to 127.0.0.1.
pub const ALLOWED: &str = "allowed.test";

/// How long a test waits for anything before it fails.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// What a proxy is started with.
pub struct Setup {
    pub allow: Vec<String>,
    pub bound: Option<Vec<String>>,
    pub pins: Vec<(&'static str, &'static str)>,
    pub private: PrivateDestinations,
    pub limits: Limits,
    pub tls_ports: BTreeSet<u16>,
    pub head_timeout: Option<Duration>,
    pub connect_timeout: Option<Duration>,
}

impl Setup {
    /// `allow`, with `allowed.test` pinned to 127.0.0.1 and private destinations allowed
    /// (every upstream here is on loopback).
    pub fn new(allow: &[&str]) -> Self {
        Self {
            allow: allow.iter().map(|entry| (*entry).to_owned()).collect(),
            bound: None,
            pins: vec![(ALLOWED, "127.0.0.1")],
            private: PrivateDestinations::Allowed,
            limits: Limits::default(),
            tls_ports: BTreeSet::new(),
            head_timeout: None,
            connect_timeout: None,
        }
    }

    pub fn head_timeout(mut self, limit: Duration) -> Self {
        self.head_timeout = Some(limit);
        self
    }

    pub fn connect_timeout(mut self, limit: Duration) -> Self {
        self.connect_timeout = Some(limit);
        self
    }

    pub fn tls_port(mut self, port: u16) -> Self {
        self.tls_ports.insert(port);
        self
    }

    pub fn private(mut self, private: PrivateDestinations) -> Self {
        self.private = private;
        self
    }

    pub fn pin(mut self, name: &'static str, address: &'static str) -> Self {
        self.pins.push((name, address));
        self
    }

    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    pub fn bound(mut self, bound: &[&str]) -> Self {
        self.bound = Some(bound.iter().map(|entry| (*entry).to_owned()).collect());
        self
    }

    pub fn start(self) -> Proxy {
        let directory = tempfile::tempdir().unwrap();
        let socket = directory.path().join("egress.sock");
        let mut proxy = self.start_at(socket);
        proxy._directory = Some(directory);
        proxy
    }

    /// A proxy on a socket at `socket`, whose directory the caller keeps (a
    /// second proxy on the socket of one that ended, as a new host serves it).
    pub fn start_at(self, socket: PathBuf) -> Proxy {
        let _ = std::fs::remove_file(&socket);
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let allow = AllowList::parse(&self.allow).unwrap();
        let bound = match &self.bound {
            Some(bound) => AllowList::parse(bound).unwrap(),
            None => allow.clone(),
        };
        let policy = Policy {
            allow,
            hosts: self
                .pins
                .iter()
                .map(|(name, address)| {
                    (
                        HostName::parse(name).unwrap(),
                        address.parse::<IpAddr>().unwrap(),
                    )
                })
                .collect(),
            private_destinations: self.private,
            host_addresses: BTreeSet::new(),
        };
        let handle = PolicyHandle::new(policy, bound).unwrap();
        let unit = Unit {
            identity: UnitIdentity {
                session: "session-1".to_owned(),
                unit: "work".to_owned(),
            },
            policy: handle.subscribe(),
            limits: self.limits,
            options: Options {
                tls_ports: self.tls_ports,
                client_hello_timeout: Duration::from_secs(2),
                head_timeout: self.head_timeout.unwrap_or(Options::default().head_timeout),
                connect_timeout: self
                    .connect_timeout
                    .unwrap_or(Options::default().connect_timeout),
            },
            throttled: Arc::default(),
        };
        let throttled = Arc::clone(&unit.throttled);
        let (sender, events) = mpsc::unbounded_channel();
        let sink = Arc::new(move |event: Event| {
            let _ = sender.send(event);
        });
        let task = tokio::spawn(async move { serve(listener, unit, sink).await });
        Proxy {
            _directory: None,
            socket,
            handle,
            events,
            task,
            throttled,
        }
    }
}

/// A running proxy.
pub struct Proxy {
    _directory: Option<tempfile::TempDir>,
    pub socket: PathBuf,
    pub handle: PolicyHandle,
    events: mpsc::UnboundedReceiver<Event>,
    task: JoinHandle<std::io::Result<()>>,
    /// Nanoseconds the unit's traffic waited for its bandwidth cap.
    pub throttled: Arc<std::sync::atomic::AtomicU64>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Proxy {
    pub async fn connect(&self) -> UnixStream {
        UnixStream::connect(&self.socket).await.unwrap()
    }

    /// The next event, or a failure after [`PATIENCE`].
    pub async fn event(&mut self) -> Event {
        tokio::time::timeout(PATIENCE, self.events.recv())
            .await
            .expect("no event in time")
            .expect("the proxy ended")
    }

    /// Whether no event is waiting (after a short grace).
    pub async fn no_more_events(&mut self) -> bool {
        tokio::time::timeout(Duration::from_millis(200), self.events.recv())
            .await
            .is_err()
    }
}

/// The decision of an event as `outcome reason-or-rule`, for short assertions.
pub fn decision(event: &Event) -> String {
    let value = serde_json::to_value(&event.decision).unwrap();
    let outcome = value["outcome"].as_str().unwrap().to_owned();
    match value.get("reason") {
        Some(reason) => format!("{outcome} {}", reason.as_str().unwrap()),
        None => format!("{outcome} {}", value["rule"].as_str().unwrap()),
    }
}

/// Send `CONNECT authority` and read the answer's status line; for anything but 200,
/// also the body (the proxy closes after it).
pub async fn connect(stream: &mut UnixStream, authority: &str) -> (u16, String) {
    let request = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let head = read_head(stream).await;
    let status = status_of(&head);
    if status == 200 {
        return (status, String::new());
    }
    let mut body = String::new();
    tokio::time::timeout(PATIENCE, stream.read_to_string(&mut body))
        .await
        .unwrap()
        .unwrap();
    (status, body)
}

/// Read up to the end of a response head, byte by byte so nothing after it is taken.
pub async fn read_head<S: AsyncReadExt + Unpin>(stream: &mut S) -> String {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8];
        let read = tokio::time::timeout(PATIENCE, stream.read(&mut byte))
            .await
            .expect("no response head in time")
            .unwrap();
        assert_eq!(read, 1, "closed after {:?}", String::from_utf8_lossy(&head));
        head.push(byte[0]);
    }
    String::from_utf8(head).unwrap()
}

pub fn status_of(head: &str) -> u16 {
    head.split(' ').nth(1).unwrap().parse().unwrap()
}

/// A response: status, head, and a body read by its Content-Length.
pub async fn read_response<S: AsyncReadExt + Unpin>(stream: &mut S) -> (u16, String, String) {
    let head = read_head(stream).await;
    let length: usize = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().unwrap())
        })
        .unwrap_or(0);
    let mut body = vec![0; length];
    tokio::time::timeout(PATIENCE, stream.read_exact(&mut body))
        .await
        .unwrap()
        .unwrap();
    (status_of(&head), head, String::from_utf8(body).unwrap())
}

/// Read until the peer closes.
pub async fn read_to_end<S: AsyncReadExt + Unpin>(stream: &mut S) -> Vec<u8> {
    let mut out = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut out))
        .await
        .expect("the stream did not end in time")
        .unwrap();
    out
}

/// A plain HTTP/1.1 server on 127.0.0.1: answers every request (keep-alive) with
/// `hello {path}`, and records each request's line, Host header and body.
pub struct HttpUpstream {
    pub port: u16,
    pub requests: Arc<Mutex<Vec<Recorded>>>,
    task: JoinHandle<()>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    pub line: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(header, _)| header.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}

impl Drop for HttpUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl HttpUpstream {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let recorded = requests.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(serve_http(stream, recorded.clone()));
            }
        });
        Self {
            port,
            requests,
            task,
        }
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }
}

async fn serve_http(mut stream: TcpStream, recorded: Arc<Mutex<Vec<Recorded>>>) {
    let mut buffer = Vec::new();
    loop {
        let (length, request) = loop {
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut request = httparse::Request::new(&mut headers);
            if let Ok(httparse::Status::Complete(length)) = request.parse(&buffer) {
                let headers: Vec<(String, String)> = request
                    .headers
                    .iter()
                    .map(|h| {
                        (
                            h.name.to_owned(),
                            String::from_utf8_lossy(h.value).into_owned(),
                        )
                    })
                    .collect();
                let line = format!(
                    "{} {} HTTP/1.{}",
                    request.method.unwrap(),
                    request.path.unwrap(),
                    request.version.unwrap()
                );
                break (length, (line, headers));
            }
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(read) => buffer.extend_from_slice(&chunk[..read]),
            }
        };
        buffer.drain(..length);
        let (line, headers) = request;
        let body_length: usize = headers
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
            .map_or(0, |(_, value)| value.parse().unwrap());
        while buffer.len() < body_length {
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(read) => buffer.extend_from_slice(&chunk[..read]),
            }
        }
        let body: Vec<u8> = buffer.drain(..body_length).collect();
        let path = line.split(' ').nth(1).unwrap().to_owned();
        recorded.lock().unwrap().push(Recorded {
            line,
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        });
        let answer = format!("hello {path}");
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{answer}",
            answer.len()
        );
        if stream.write_all(response.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// A "TLS" server on 127.0.0.1 that reads one whole ClientHello (however it is cut
/// into records and reads), records it, answers `served` and closes. It can also
/// speak first, like SSH, for ports where the client is not expected to start.
pub struct TlsUpstream {
    pub port: u16,
    pub hellos: Arc<Mutex<Vec<Vec<u8>>>>,
    task: JoinHandle<()>,
}

impl Drop for TlsUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TlsUpstream {
    pub async fn start() -> Self {
        Self::start_with_banner(None).await
    }

    /// A server that first writes `banner`, then reads one line and echoes it back.
    pub async fn start_with_banner(banner: Option<&'static str>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let hellos = Arc::new(Mutex::new(Vec::new()));
        let recorded = hellos.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                let recorded = recorded.clone();
                tokio::spawn(async move {
                    if let Some(banner) = banner {
                        let _ = stream.write_all(banner.as_bytes()).await;
                    }
                    let Some(bytes) = read_client_hello(&mut stream).await else {
                        return;
                    };
                    recorded.lock().unwrap().push(bytes.clone());
                    if banner.is_some() {
                        let _ = stream.write_all(&bytes).await;
                    } else {
                        let _ = stream.write_all(b"served").await;
                    }
                    let _ = stream.shutdown().await;
                });
            }
        });
        Self { port, hellos, task }
    }

    pub fn hellos(&self) -> Vec<Vec<u8>> {
        self.hellos.lock().unwrap().clone()
    }
}

/// Read TLS records until the handshake message in them is complete; or, for a
/// client that does not speak TLS, one line.
async fn read_client_hello(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut bytes = Vec::new();
    let mut handshake = Vec::new();
    let mut offset = 0;
    loop {
        if bytes.first().is_some_and(|&b| b != 22) && bytes.ends_with(b"\n") {
            return Some(bytes);
        }
        if handshake.len() >= 4 {
            let length = (usize::from(handshake[1]) << 16)
                | (usize::from(handshake[2]) << 8)
                | usize::from(handshake[3]);
            if handshake.len() >= 4 + length {
                return Some(bytes);
            }
        }
        if bytes.len() >= offset + 5 {
            let length = usize::from(u16::from_be_bytes([bytes[offset + 3], bytes[offset + 4]]));
            if bytes.len() >= offset + 5 + length {
                handshake.extend_from_slice(&bytes[offset + 5..offset + 5 + length]);
                offset += 5 + length;
                continue;
            }
        }
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(read) => bytes.extend_from_slice(&chunk[..read]),
        }
    }
}

/// A server that writes `bytes` zero bytes to every connection, then closes.
pub async fn bulk_upstream(bytes: usize) -> (u16, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let chunk = vec![0u8; 64 * 1024];
                let mut left = bytes;
                while left > 0 {
                    let take = left.min(chunk.len());
                    if stream.write_all(&chunk[..take]).await.is_err() {
                        return;
                    }
                    left -= take;
                }
                let _ = stream.shutdown().await;
            });
        }
    });
    (port, task)
}

/// A port on 127.0.0.1 where nothing listens (bound, then released).
pub async fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().port()
}

/// The path of a tool the test needs. Without it the test says so loudly and, under
/// `CI`, fails; elsewhere it returns `None` and the caller skips.
pub fn tool(name: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|directory| directory.join(name))
            .find(|candidate| candidate.is_file())
    });
    if found.is_none() {
        eprintln!(
            "!!! `{name}` is not installed: this test cannot run here (install it: apt-get install -y {name}) !!!"
        );
        assert!(
            std::env::var_os("CI").is_none(),
            "`{name}` is required under CI"
        );
    }
    found
}

/// `SocketAddr` of the loopback port `port`.
pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Read one line (up to and including `\n`), byte by byte.
pub async fn read_head_line<S: AsyncReadExt + Unpin>(stream: &mut S) -> String {
    let mut line = Vec::new();
    while !line.ends_with(b"\n") {
        let mut byte = [0u8];
        let read = tokio::time::timeout(PATIENCE, stream.read(&mut byte))
            .await
            .expect("no line in time")
            .unwrap();
        assert_eq!(read, 1, "closed after {:?}", String::from_utf8_lossy(&line));
        line.push(byte[0]);
    }
    String::from_utf8(line).unwrap()
}
