//! `box serve` and `box run`: streamable HTTP against the real axum server on
//! 127.0.0.1:0 with the recording fake backend (raw HTTP/1.1 over tokio TCP,
//! no client library), and the built binary over stdio and `box run` with the
//! fake backend (`--backend fake`, which only box-testkit's `box-testhost` has).
//!
//! The real end-to-end runs (the Python `mcp` SDK against `box serve` on the
//! docker and local backends: tests/e2e/serve_stdio.py, serve_http.py) are
//! wired once the backends and the executor are merged.

use std::io::Write as _;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use box_testkit::fake::FakeBackend;
use box_transport::http::{HttpOptions, serve};
use boxhost::host::{HostConfig, Services};
use boxhost::plan::{HostFacts, Plan, PlanError, UserIds};
use boxhost::profile::{Catalog, Profile};
use boxhost::sessions::HostSessions;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::support::box_bin;

const EXECUTOR_KEY: &str = "io.github.christopherdavenport.dax/executor";

fn facts() -> HostFacts {
    HostFacts {
        cwd: std::env::temp_dir(),
        caller: UserIds {
            uid: 1000,
            gid: 1000,
        },
        workspace_owner: None,
    }
}

fn short_idle(profile: &Profile, tighten: &Value, host: &HostFacts) -> Result<Plan, PlanError> {
    let mut plan = boxhost::plan::resolve(profile, tighten, host)?;
    for unit in &mut plan.units {
        unit.limits.idle = Duration::from_millis(300);
    }
    Ok(plan)
}

/// A running HTTP host over a fake backend.
struct Server {
    address: SocketAddr,
    fake: FakeBackend,
    shutdown: CancellationToken,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// The sessions of a host with `config` whose units `fake` runs.
fn host_sessions(config: HostConfig, fake: &FakeBackend) -> HostSessions {
    HostSessions::new(
        Arc::new(config),
        Arc::new(Services::new(Arc::new(fake.clone()))),
    )
}

async fn start_server(options: HttpOptions, resolve: boxhost::host::ResolveFn) -> Server {
    let fake = FakeBackend::default();
    let mut config = HostConfig::new(Catalog::new(Vec::new()), facts());
    config.resolve = resolve;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    tokio::spawn(serve(
        Arc::new(host_sessions(config, &fake)),
        options,
        listener,
        shutdown.clone(),
    ));
    Server {
        address,
        fake,
        shutdown,
    }
}

#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
}

impl Reply {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|error| {
            panic!(
                "not JSON ({error}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// The `data:` lines of an SSE body, parsed.
    fn events(&self) -> Vec<Value> {
        String::from_utf8_lossy(&self.body)
            .lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .map(|data| serde_json::from_str(data.trim()).unwrap())
            .collect()
    }
}

fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(end) = body.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size = usize::from_str_radix(std::str::from_utf8(&body[..end]).unwrap().trim(), 16)
            .unwrap_or(0);
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&body[end + 2..end + 2 + size]);
        body = &body[end + 2 + size + 2..];
    }
}

fn parse_reply(raw: &[u8]) -> Reply {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP head in {:?}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(key, value)| (key.trim().to_owned(), value.trim().to_owned()))
        .collect();
    let body = &raw[split + 4..];
    let chunked = headers.iter().any(|(key, value)| {
        key.eq_ignore_ascii_case("transfer-encoding") && value.contains("chunked")
    });
    Reply {
        status,
        headers,
        body: if chunked {
            dechunk(body)
        } else {
            body.to_vec()
        },
    }
}

/// One HTTP/1.1 exchange; `headers` are added to Host, Connection and Content-Length.
pub(crate) async fn http(
    address: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Reply {
    let mut stream = TcpStream::connect(address).await.unwrap();
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !headers
        .iter()
        .any(|(key, _)| key.eq_ignore_ascii_case("host"))
    {
        request.push_str(&format!("Host: {address}\r\n"));
    }
    for (key, value) in headers {
        request.push_str(&format!("{key}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut raw))
        .await
        .expect("the server answered in time")
        .unwrap();
    parse_reply(&raw)
}

const JSON_HEADERS: [(&str, &str); 2] = [
    ("Content-Type", "application/json"),
    ("Accept", "application/json, text/event-stream"),
];

pub(crate) async fn post(
    address: SocketAddr,
    session: Option<&str>,
    extra: &[(&str, &str)],
    message: &Value,
) -> Reply {
    let mut headers: Vec<(&str, &str)> = JSON_HEADERS.to_vec();
    if let Some(session) = session {
        headers.push(("Mcp-Session-Id", session));
        headers.push(("MCP-Protocol-Version", "2025-06-18"));
    }
    headers.extend_from_slice(extra);
    http(
        address,
        "POST",
        "/mcp",
        &headers,
        message.to_string().as_bytes(),
    )
    .await
}

fn initialize_message() -> Value {
    json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}})
}

async fn initialize(server: &Server) -> String {
    let reply = post(server.address, None, &[], &initialize_message()).await;
    assert_eq!(
        reply.status,
        200,
        "{:?}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(reply.json()["result"]["serverInfo"]["name"], json!("box"));
    let id = reply
        .header("mcp-session-id")
        .expect("a session id")
        .to_owned();
    assert!(
        id.len() >= 32 && id.bytes().all(|b| (0x21..=0x7e).contains(&b)),
        "{id}"
    );
    id
}

fn call(id: Value, name: &str, arguments: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": arguments}})
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn http_session_answers_json_streams_progress_and_delete_removes_its_units() {
    let server = start_server(HttpOptions::loopback(), boxhost::plan::resolve).await;
    let session = initialize(&server).await;
    assert_eq!(server.fake.live_units().len(), 1);

    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let reply = post(server.address, Some(&session), &[], &initialized).await;
    assert_eq!(reply.status, 202);
    assert!(reply.body.is_empty());

    let reply = post(
        server.address,
        Some(&session),
        &[],
        &call(json!("e"), "echo", json!({"a": 1})),
    )
    .await;
    assert_eq!(reply.status, 200);
    assert!(
        reply
            .header("content-type")
            .unwrap()
            .starts_with("application/json")
    );
    assert_eq!(reply.json()["id"], json!("e"));
    assert_eq!(
        reply.json()["result"]["content"][0]["text"],
        json!("{\"a\":1}")
    );

    let slow = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "slow", "arguments": {"steps": 2, "ms": 40}, "_meta": {"progressToken": 7}}});
    let reply = post(server.address, Some(&session), &[], &slow).await;
    assert_eq!(reply.status, 200);
    assert!(
        reply
            .header("content-type")
            .unwrap()
            .starts_with("text/event-stream")
    );
    let events = reply.events();
    assert_eq!(events.len(), 3, "{events:?}");
    assert_eq!(events[0]["method"], json!("notifications/progress"));
    assert_eq!(events[0]["params"]["progressToken"], json!(7));
    assert_eq!(events[2]["id"], json!(7));
    assert_eq!(
        events[2]["result"]["content"][0]["text"],
        json!("slow done")
    );

    let reply = http(
        server.address,
        "DELETE",
        "/mcp",
        &[("Mcp-Session-Id", &session)],
        b"",
    )
    .await;
    assert_eq!(reply.status, 200);
    assert_eq!(server.fake.live_units(), Vec::<String>::new());
    let reply = post(
        server.address,
        Some(&session),
        &[],
        &call(json!(1), "echo", json!({})),
    )
    .await;
    assert_eq!(reply.status, 404);
}

#[tokio::test]
async fn http_refuses_evil_origins_and_hosts() {
    let server = start_server(HttpOptions::loopback(), boxhost::plan::resolve).await;
    let reply = post(
        server.address,
        None,
        &[("Origin", "https://evil.example")],
        &initialize_message(),
    )
    .await;
    assert_eq!(reply.status, 403);
    assert_eq!(reply.json()["error"]["code"], json!(-32600));
    let reply = post(
        server.address,
        None,
        &[("Host", "evil.example:80")],
        &initialize_message(),
    )
    .await;
    assert_eq!(reply.status, 421);
    let reply = post(
        server.address,
        None,
        &[("Origin", "http://localhost:3000")],
        &initialize_message(),
    )
    .await;
    assert_eq!(reply.status, 200);
    // No permissive CORS: a preflight gets nothing that would let a page in.
    let reply = http(
        server.address,
        "OPTIONS",
        "/mcp",
        &[
            ("Origin", "http://localhost:3000"),
            ("Access-Control-Request-Method", "POST"),
        ],
        b"",
    )
    .await;
    assert!(
        reply.header("access-control-allow-origin").is_none(),
        "{reply:?}"
    );
    assert_eq!(server.fake.record(|record| record.starts.len()), 1);
}

#[tokio::test]
async fn http_requires_the_bearer_token_and_never_reads_it_from_the_url() {
    let token = "0123456789abcdef0123456789abcdef";
    let options = HttpOptions {
        token: Some(token.to_owned()),
        ..HttpOptions::loopback()
    };
    let server = start_server(options, boxhost::plan::resolve).await;
    let message = initialize_message();
    let reply = post(server.address, None, &[], &message).await;
    assert_eq!(reply.status, 401);
    assert!(
        reply
            .header("www-authenticate")
            .unwrap()
            .starts_with("Bearer")
    );
    let reply = post(
        server.address,
        None,
        &[("Authorization", "Bearer wrong-token-wrong-token")],
        &message,
    )
    .await;
    assert_eq!(reply.status, 401);
    assert!(
        reply
            .header("www-authenticate")
            .unwrap()
            .contains("invalid_token")
    );
    let reply = http(
        server.address,
        "POST",
        &format!("/mcp?access_token={token}"),
        &JSON_HEADERS,
        message.to_string().as_bytes(),
    )
    .await;
    assert_eq!(reply.status, 401);
    let reply = http(server.address, "GET", "/metrics", &[], b"").await;
    assert_eq!(reply.status, 401);
    assert_eq!(server.fake.record(|record| record.starts.len()), 0);
    let bearer = format!("Bearer {token}");
    let reply = post(
        server.address,
        None,
        &[("Authorization", &bearer)],
        &message,
    )
    .await;
    assert_eq!(reply.status, 200);
}

#[tokio::test]
async fn http_refuses_batches_big_bodies_unknown_sessions_and_bad_versions() {
    let options = HttpOptions {
        max_body_bytes: 1 << 20,
        ..HttpOptions::loopback()
    };
    let server = start_server(options, boxhost::plan::resolve).await;
    let batch = json!([{"jsonrpc": "2.0", "id": 1, "method": "ping"}]);
    let reply = post(server.address, None, &[], &batch).await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.json()["error"]["code"], json!(-32600));

    // A declared 100 MB body is refused before a byte of it is read.
    let mut stream = TcpStream::connect(server.address).await.unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        server.address,
        100u64 << 20
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut raw))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(parse_reply(&raw).status, 413);

    // A chunked body is cut at the bound.
    let mut stream = TcpStream::connect(server.address).await.unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
        server.address
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let (mut read, mut write) = stream.into_split();
    let writer = tokio::spawn(async move {
        let chunk = vec![b' '; 64 << 10];
        for _ in 0..(100 << 4) {
            let framed = [format!("{:x}\r\n", chunk.len()).as_bytes(), &chunk, b"\r\n"].concat();
            if write.write_all(&framed).await.is_err() {
                return;
            }
        }
    });
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), read.read_to_end(&mut raw))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(parse_reply(&raw).status, 413);
    writer.abort();

    let reply = post(
        server.address,
        Some("f00d"),
        &[],
        &call(json!(1), "echo", json!({})),
    )
    .await;
    assert_eq!(reply.status, 404);
    let reply = post(
        server.address,
        None,
        &[],
        &call(json!(1), "echo", json!({})),
    )
    .await;
    assert_eq!(reply.status, 400);

    let session = initialize(&server).await;
    let mut headers: Vec<(&str, &str)> = JSON_HEADERS.to_vec();
    headers.push(("Mcp-Session-Id", &session));
    headers.push(("MCP-Protocol-Version", "1999-01-01"));
    let body = call(json!(1), "echo", json!({})).to_string();
    let reply = http(server.address, "POST", "/mcp", &headers, body.as_bytes()).await;
    assert_eq!(reply.status, 400);
    let message = reply.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        message.contains("2025-06-18") && message.contains("2025-11-25"),
        "{message}"
    );
    headers.pop();
    let reply = http(server.address, "POST", "/mcp", &headers, body.as_bytes()).await;
    assert_eq!(
        reply.status, 400,
        "a missing version after initialize (E63)"
    );
    assert!(
        reply.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("missing")
    );
    assert_eq!(server.fake.record(|record| record.starts.len()), 1);
}

#[tokio::test]
async fn http_discover_probe_starts_nothing() {
    let server = start_server(HttpOptions::loopback(), boxhost::plan::resolve).await;
    let probe = json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {}});
    let reply = post(
        server.address,
        None,
        &[
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", "server/discover"),
        ],
        &probe,
    )
    .await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.json()["error"]["code"], json!(-32601));
    assert!(reply.header("mcp-session-id").is_none());
    assert_eq!(server.fake.record(|record| record.starts.len()), 0);
    // A refused tightening also issues no session and starts nothing.
    let refused = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "clientInfo": {"name": "raw", "version": "1"},
        "capabilities": {"experimental": {EXECUTOR_KEY: {"box": {"tighten": {"network": {"mode": "bridge"}}}}}}}});
    let reply = post(server.address, None, &[], &refused).await;
    assert_eq!(reply.json()["error"]["code"], json!(-32602));
    assert!(reply.header("mcp-session-id").is_none());
    assert_eq!(server.fake.record(|record| record.starts.len()), 0);
}

#[tokio::test]
async fn http_sessions_are_isolated_and_idle_ones_are_closed_with_their_units() {
    let server = start_server(HttpOptions::loopback(), short_idle).await;
    let first = initialize(&server).await;
    let second = initialize(&server).await;
    assert_ne!(first, second);
    assert_eq!(server.fake.live_units().len(), 2);
    // The same client id on both sessions, each answered on its own.
    let call_a = call(json!(1), "echo", json!({"who": "first"}));
    let call_b = call(json!(1), "echo", json!({"who": "second"}));
    let a = post(server.address, Some(&first), &[], &call_a);
    let b = post(server.address, Some(&second), &[], &call_b);
    let (a, b) = tokio::join!(a, b);
    assert_eq!(
        a.json()["result"]["content"][0]["text"],
        json!("{\"who\":\"first\"}")
    );
    assert_eq!(
        b.json()["result"]["content"][0]["text"],
        json!("{\"who\":\"second\"}")
    );
    let metrics = http(server.address, "GET", "/metrics", &[], b"").await;
    assert!(String::from_utf8_lossy(&metrics.body).contains("box_sessions_active 2"));
    // Both go idle: closed, units removed, ids dead.
    let fake = server.fake.clone();
    wait_until("idle sessions' units are removed", || {
        fake.live_units().is_empty()
    })
    .await;
    let reply = post(
        server.address,
        Some(&first),
        &[],
        &call(json!(2), "echo", json!({})),
    )
    .await;
    assert_eq!(reply.status, 404);
}

// The built binary.

/// The `box` command line with the fake backend (box-testkit's testhost).
fn box_command() -> Command {
    let mut command = Command::new(crate::support::testhost_bin());
    command.env("RUST_LOG", "warn");
    command
}

/// Writes initialize and an echo call, then ends the input.
fn serve_requests() -> String {
    format!(
        "{}\n{}\n{}\n",
        initialize_message(),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        call(json!("x"), "echo", json!({"k": "v"}))
    )
}

#[test]
fn serve_over_stdio_leaves_its_pipes_in_the_mode_it_found_them() {
    use std::io::BufRead as _;
    // box reads and writes its pipes non-blocking; the open pipe is shared
    // with whoever holds it too (a shell's next command), so box must put the
    // mode back. Here the test holds a copy of both ends box was given.
    // Close-on-exec, so box inherits only the ends it is given.
    let pipe = || nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    let (stdin_read, stdin_write) = pipe();
    let (stdout_read, stdout_write) = pipe();
    let shared_in = stdin_read.try_clone().unwrap();
    let shared_out = stdout_write.try_clone().unwrap();
    let mut command = box_command();
    command
        .args(["serve", "--backend", "fake"])
        .stdin(Stdio::from(stdin_read))
        .stdout(Stdio::from(stdout_write))
        .stderr(Stdio::null());
    let mut child = command.spawn().unwrap();
    drop(command);
    let mut input = std::fs::File::from(stdin_write);
    input.write_all(serve_requests().as_bytes()).unwrap();
    drop(input);
    let mut output = std::io::BufReader::new(std::fs::File::from(stdout_read));
    let mut answers = 0;
    let mut line = String::new();
    while answers < 2 {
        line.clear();
        assert!(output.read_line(&mut line).unwrap() > 0, "box hung up");
        let answer: Value = serde_json::from_str(&line).unwrap();
        assert!(answer.get("result").is_some(), "{answer}");
        answers += 1;
    }
    assert!(child.wait().unwrap().success());
    for (name, fd) in [("stdin", &shared_in), ("stdout", &shared_out)] {
        let flags = nix::fcntl::OFlag::from_bits_truncate(
            nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFL).unwrap(),
        );
        assert!(
            !flags.contains(nix::fcntl::OFlag::O_NONBLOCK),
            "box left its {name} pipe non-blocking"
        );
    }
}

#[test]
fn serve_over_a_unix_socket_as_stdio_answers_and_exits_at_end_of_input() {
    use std::io::Read as _;
    // What libuv-based clients (Node) spawn a server with: one socket pair
    // end as both stdin and stdout.
    let (mut ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let theirs_out = theirs.try_clone().unwrap();
    let mut command = box_command();
    command
        .args(["serve", "--backend", "fake"])
        .stdin(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
        .stdout(Stdio::from(std::os::fd::OwnedFd::from(theirs_out)))
        .stderr(Stdio::null());
    let mut child = command.spawn().unwrap();
    drop(command);
    ours.write_all(serve_requests().as_bytes()).unwrap();
    ours.shutdown(std::net::Shutdown::Write).unwrap();
    let mut text = String::new();
    ours.read_to_string(&mut text).unwrap();
    assert!(child.wait().unwrap().success());
    let lines: Vec<Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines.iter().any(|line| line["id"] == json!("x")
        && line["result"]["content"][0]["text"] == json!("{\"k\":\"v\"}")));
}

#[test]
fn serve_over_stdio_answers_and_exits_at_end_of_input() {
    let mut child = box_command()
        .args(["serve", "--backend", "fake"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{}", initialize_message()).unwrap();
    writeln!(
        stdin,
        "{}",
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
    )
    .unwrap();
    writeln!(stdin, "{}", call(json!("x"), "echo", json!({"k": "v"}))).unwrap();
    drop(stdin);
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    // Answers may come in any order; each request gets one.
    assert_eq!(lines.len(), 2, "{stdout}");
    let by_id = |id: Value| lines.iter().find(|line| line["id"] == id).unwrap();
    assert_eq!(
        by_id(json!(0))["result"]["serverInfo"]["name"],
        json!("box")
    );
    assert_eq!(
        by_id(json!("x"))["result"]["content"][0]["text"],
        json!("{\"k\":\"v\"}")
    );
}

#[test]
fn run_streams_output_and_exits_with_the_commands_status() {
    let output = box_command()
        .args(["run", "--backend", "fake", "--", "exit", "3"])
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(3),
        "stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&output.stdout), "ran: exit 3\n");
    assert!(String::from_utf8_lossy(&output.stderr).contains("stderr of exit"));
    let output = box_command()
        .args(["run", "--backend", "fake", "--", "uname", "-a"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&output.stdout), "ran: uname -a\n");
}

#[test]
fn run_with_a_refused_tightening_fails_as_box_and_names_it() {
    let output = box_command()
        .args([
            "run",
            "--backend",
            "fake",
            "--tighten",
            r#"{"network":{"mode":"bridge"}}"#,
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(125));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("tighten"), "{stderr}");
}

#[test]
fn serve_off_loopback_without_a_token_refuses_to_start() {
    let output = box_command()
        .args(["serve", "--backend", "fake", "--listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--token-file"), "{stderr}");
}

/// Run one of tests/e2e/serve_*.py against the built box with the fake backend.
fn run_e2e_script(script: &str) {
    let Some(python) = crate::support::python_with_mcp() else {
        return;
    };
    let e2e = crate::support::repo_root().join("tests/e2e");
    let output = Command::new(python)
        .current_dir(&e2e)
        .arg(e2e.join(script))
        .arg(crate::support::testhost_bin())
        .args([
            "--backend",
            "fake",
            "--tool",
            "echo",
            "--args",
            r#"{"a":1}"#,
            "--expect",
            r#"{"a":1}"#,
        ])
        .args(["--progress-tool", "slow", "--max-read-bytes", "4096"])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{script} failed\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn python_sdk_over_stdio_with_the_fake_backend() {
    run_e2e_script("serve_stdio.py");
}

#[test]
fn python_sdk_over_http_with_the_fake_backend() {
    run_e2e_script("serve_http.py");
}

#[tokio::test]
async fn http_carries_a_units_request_on_the_calls_stream_and_routes_the_answer_back() {
    let server = start_server(HttpOptions::loopback(), boxhost::plan::resolve).await;
    let session = initialize(&server).await;
    let mut stream = TcpStream::connect(server.address).await.unwrap();
    let body = call(json!(11), "ask", json!({})).to_string();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMcp-Session-Id: {session}\r\nMCP-Protocol-Version: 2025-06-18\r\nContent-Length: {}\r\n\r\n{body}",
        server.address,
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    let mut buffer = [0u8; 4096];
    while !String::from_utf8_lossy(&raw).contains("elicitation/create") {
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buffer))
            .await
            .expect("the elicitation streams in time")
            .unwrap();
        assert_ne!(
            read,
            0,
            "the stream ended early: {}",
            String::from_utf8_lossy(&raw)
        );
        raw.extend_from_slice(&buffer[..read]);
    }
    let text = String::from_utf8_lossy(&raw).into_owned();
    let ask: Value = text
        .lines()
        .find_map(|line| line.strip_prefix("data:"))
        .map(|data| serde_json::from_str(data.trim()).unwrap())
        .unwrap();
    assert_eq!(ask["method"], json!("elicitation/create"));
    let answer =
        json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"action": "accept", "content": {}}});
    let reply = post(server.address, Some(&session), &[], &answer).await;
    assert_eq!(reply.status, 202);
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut raw))
        .await
        .unwrap()
        .unwrap();
    let reply = parse_reply(&raw);
    assert!(
        reply
            .header("content-type")
            .unwrap()
            .starts_with("text/event-stream")
    );
    let events = reply.events();
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[1]["id"], json!(11));
    let text = events[1]["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("accept"), "{text}");
}

#[test]
fn serve_drains_and_exits_zero_at_sigterm() {
    use std::io::{BufRead as _, BufReader};
    let mut child = box_command()
        .env("RUST_LOG", "info")
        .args(["serve", "--backend", "fake", "--drain", "300ms"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{}", initialize_message()).unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert!(line.contains("\"box\""), "{line}");
    writeln!(stdin, "{}", call(json!(1), "hang", json!({}))).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    // The call in flight gets the drain time, then its one answer before box exits.
    line.clear();
    stdout.read_line(&mut line).unwrap();
    let answer: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(answer["id"], json!(1));
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("session ended")
    );
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "box did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(stderr.contains("units removed"), "{stderr}");
    drop(stdin);
}

#[tokio::test]
async fn http_closes_slow_headers_and_times_out_slow_bodies() {
    let options = HttpOptions {
        header_read_timeout: Duration::from_millis(300),
        body_read_timeout: Duration::from_millis(300),
        ..HttpOptions::loopback()
    };
    let server = start_server(options, boxhost::plan::resolve).await;
    // Headers trickled and never finished: the connection is closed.
    let mut stream = TcpStream::connect(server.address).await.unwrap();
    stream
        .write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut raw))
        .await
        .expect("the server closes a connection whose headers never end")
        .unwrap();
    // A body promised and never sent: 408.
    let mut stream = TcpStream::connect(server.address).await.unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: 100\r\nConnection: close\r\n\r\n{{",
        server.address
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut raw))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(parse_reply(&raw).status, 408);
    // Others are served meanwhile and after.
    initialize(&server).await;
}

#[tokio::test]
async fn http_get_opens_one_stream_per_session_which_ends_with_it() {
    let server = start_server(HttpOptions::loopback(), boxhost::plan::resolve).await;
    let session = initialize(&server).await;
    let mut stream = TcpStream::connect(server.address).await.unwrap();
    let head = format!(
        "GET /mcp HTTP/1.1\r\nHost: {}\r\nAccept: text/event-stream\r\nMcp-Session-Id: {session}\r\nConnection: close\r\n\r\n",
        server.address
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    let mut buffer = [0u8; 1024];
    while !raw.windows(4).any(|w| w == b"\r\n\r\n") {
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buffer))
            .await
            .unwrap()
            .unwrap();
        assert_ne!(read, 0);
        raw.extend_from_slice(&buffer[..read]);
    }
    let reply = parse_reply(&raw);
    assert_eq!(reply.status, 200);
    assert!(
        reply
            .header("content-type")
            .unwrap()
            .starts_with("text/event-stream")
    );
    let second = http(
        server.address,
        "GET",
        "/mcp",
        &[("Mcp-Session-Id", &session)],
        b"",
    )
    .await;
    assert_eq!(second.status, 409);
    let reply = http(
        server.address,
        "DELETE",
        "/mcp",
        &[("Mcp-Session-Id", &session)],
        b"",
    )
    .await;
    assert_eq!(reply.status, 200);
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut raw))
        .await
        .expect("the GET stream ends with its session")
        .unwrap();
}

#[tokio::test]
async fn http_caps_sessions_and_frees_a_place_when_one_ends() {
    let options = HttpOptions {
        max_sessions: 1,
        ..HttpOptions::loopback()
    };
    let server = start_server(options, boxhost::plan::resolve).await;
    let first = initialize(&server).await;
    let reply = post(server.address, None, &[], &initialize_message()).await;
    assert_eq!(reply.status, 503);
    assert!(
        reply.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("at most 1")
    );
    assert_eq!(server.fake.live_units().len(), 1);
    let reply = http(
        server.address,
        "DELETE",
        "/mcp",
        &[("Mcp-Session-Id", &first)],
        b"",
    )
    .await;
    assert_eq!(reply.status, 200);
    let fake = server.fake.clone();
    wait_until("the place is free", || fake.live_units().is_empty()).await;
    initialize(&server).await;
}

#[test]
fn serve_logs_json_lines_on_stderr_when_asked() {
    let mut child = box_command()
        .env("RUST_LOG", "info")
        .args(["serve", "--backend", "fake", "--log-format", "json"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{}", initialize_message()).unwrap();
    drop(stdin);
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<Value> = stderr
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|_| panic!("not JSON: {line}")))
        .collect();
    assert!(
        lines
            .iter()
            .any(|line| line["fields"]["message"] == json!("session started")),
        "{stderr}"
    );
}

#[test]
fn run_reads_tightenings_from_a_file_and_refuses_bad_json() {
    let directory = tempfile::tempdir().unwrap();
    let file = directory.path().join("tighten.json");
    std::fs::write(&file, r#"{"network":{"mode":"bridge"}}"#).unwrap();
    let output = box_command()
        .args(["run", "--backend", "fake", "--tighten"])
        .arg(format!("@{}", file.display()))
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&output.stderr).contains("tighten"));
    let output = box_command()
        .args([
            "run",
            "--backend",
            "fake",
            "--tighten",
            "{nope",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(125));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--tighten: not JSON"), "{stderr}");
}

#[tokio::test]
async fn http_shutdown_waits_for_sessions_still_starting_their_units() {
    let fake = FakeBackend::new(box_testkit::fake::FakeOptions {
        start_delay: Duration::from_millis(400),
        ..Default::default()
    });
    let config = HostConfig::new(Catalog::new(Vec::new()), facts());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let served = tokio::spawn(serve(
        Arc::new(host_sessions(config, &fake)),
        HttpOptions::loopback(),
        listener,
        shutdown.clone(),
    ));
    let initializing =
        tokio::spawn(async move { post(address, None, &[], &initialize_message()).await });
    // Shut down once the session is starting its unit (a fixed sleep lost the
    // race on a loaded machine: the request was not yet accepted).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while fake.record(|record| record.starts.len()) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the session never started its unit"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(20), served)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(fake.record(|record| record.starts.len()), 1);
    assert_eq!(
        fake.live_units(),
        Vec::<String>::new(),
        "a unit outlived the host"
    );
    let _ = initializing.await;
}

#[test]
fn a_second_signal_exits_at_once() {
    use std::io::{BufRead as _, BufReader};
    let mut child = box_command()
        .args(["serve", "--backend", "fake", "--drain", "60s"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{}", initialize_message()).unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    writeln!(stdin, "{}", call(json!(1), "hang", json!({}))).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    // Issue 8, item 2: a signal soon after the first is the same request
    // (`timeout` and CI cancellation signal box and its process group both).
    std::thread::sleep(Duration::from_millis(30));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    std::thread::sleep(Duration::from_millis(1200));
    // Still draining (the hanging call has 60 s); a later signal ends it now.
    assert!(
        child.try_wait().unwrap().is_none(),
        "a repeated signal within a second exited at once"
    );
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "box ignored the second signal"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(143));
    drop(stdin);
}

#[test]
fn serve_refuses_a_short_token() {
    let directory = tempfile::tempdir().unwrap();
    let file = directory.path().join("token");
    std::fs::write(&file, "short\n").unwrap();
    let output = box_command()
        .args([
            "serve",
            "--backend",
            "fake",
            "--listen",
            "127.0.0.1:0",
            "--token-file",
        ])
        .arg(&file)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("at least 16"), "{stderr}");
}

/// Issue 8, item 13: five HTTP sessions calling every 0.2 s, the host
/// stopped (SIGSTOP) for twice the idle time: at SIGCONT their queued
/// requests are read and answered, and no session is reaped as idle.
#[tokio::test(flavor = "multi_thread")]
async fn busy_http_sessions_survive_a_frozen_host() {
    use std::io::BufRead as _;
    use std::sync::atomic::{AtomicBool, Ordering};
    let profiles = tempfile::tempdir().unwrap();
    std::fs::write(
        profiles.path().join("idle.toml"),
        "extends = \"default\"\n\n[limits]\nidle = \"2s\"\n",
    )
    .unwrap();
    let mut child = box_command()
        .env("RUST_LOG", "info")
        .args(["serve", "--backend", "fake", "--listen", "127.0.0.1:0"])
        .arg("--profiles")
        .arg(profiles.path())
        .args(["--profile", "idle"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let (address_tx, address_rx) = std::sync::mpsc::channel();
    let log = Arc::new(std::sync::Mutex::new(String::new()));
    let log_writer = log.clone();
    std::thread::spawn(move || {
        for line in stderr.lines() {
            let Ok(line) = line else { break };
            if let Some(address) = line.split("address=").nth(1) {
                let _ = address_tx.send(address.trim().to_owned());
            }
            log_writer.lock().unwrap().push_str(&(line + "\n"));
        }
    });
    let address: SocketAddr = address_rx
        .recv_timeout(Duration::from_secs(20))
        .unwrap()
        .parse()
        .unwrap();
    let mut sessions = Vec::new();
    for _ in 0..5 {
        let reply = post(address, None, &[], &initialize_message()).await;
        assert_eq!(reply.status, 200);
        sessions.push(reply.header("mcp-session-id").unwrap().to_owned());
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut callers = Vec::new();
    for session in sessions.clone() {
        let stop = stop.clone();
        callers.push(tokio::spawn(async move {
            let mut failures = Vec::new();
            let mut id = 1;
            while !stop.load(Ordering::Relaxed) {
                let reply = post(
                    address,
                    Some(&session),
                    &[],
                    &call(json!(id), "echo", json!({"n": id})),
                )
                .await;
                if reply.status != 200 || reply.json().get("result").is_none() {
                    failures.push(format!(
                        "call {id}: {} {}",
                        reply.status,
                        String::from_utf8_lossy(&reply.body)
                    ));
                }
                id += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            failures
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut failures = Vec::new();
    for caller in callers {
        failures.extend(caller.await.unwrap());
    }
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let _ = tokio::task::spawn_blocking(move || child.wait()).await;
    assert!(
        failures.is_empty(),
        "busy sessions failed after the freeze: {failures:#?}\n{}",
        log.lock().unwrap()
    );
}

fn short_start(profile: &Profile, tighten: &Value, host: &HostFacts) -> Result<Plan, PlanError> {
    let mut plan = boxhost::plan::resolve(profile, tighten, host)?;
    for unit in &mut plan.units {
        unit.limits.start_timeout = Duration::from_millis(300);
    }
    Ok(plan)
}

/// POST initialize until a session starts, within 10 s; its id.
async fn initialize_eventually(address: SocketAddr) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let reply = post(address, None, &[], &initialize_message()).await;
        if reply.status == 200 && reply.json().get("result").is_some() {
            return reply.header("mcp-session-id").unwrap().to_owned();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no session could start: {} {}",
            reply.status,
            String::from_utf8_lossy(&reply.body)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Issue 8, item 14: DELETE says "deleted" only when the session's units are
/// gone; while their removal is not confirmed it answers an error naming
/// them, and the session keeps its place under --max-sessions.
#[tokio::test]
async fn http_delete_is_an_error_while_removal_is_unconfirmed_and_the_slot_stays_taken() {
    let options = HttpOptions {
        max_sessions: 1,
        delete_wait: Duration::from_millis(500),
        ..HttpOptions::loopback()
    };
    let server = start_server(options, boxhost::plan::resolve).await;
    let id = initialize(&server).await;
    let unit = server.fake.live_units()[0].clone();
    server.fake.fail_removals(true);
    let session = [("Mcp-Session-Id", id.as_str())];
    let reply = http(server.address, "DELETE", "/mcp", &session, b"").await;
    assert_eq!(
        reply.status,
        503,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let message = reply.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(message.contains("unit workspace"), "{message}");
    assert!(message.contains(&unit), "{message}");
    let refused = post(server.address, None, &[], &initialize_message()).await;
    assert_eq!(
        refused.status, 503,
        "a second session took the place of one whose unit is still there"
    );
    server.fake.fail_removals(false);
    let fake = server.fake.clone();
    wait_until("the unit is removed", || fake.live_units().is_empty()).await;
    initialize_eventually(server.address).await;
}

/// Issue 8, item 14: an initialize against a stalled engine is answered at
/// the start deadline, and the session keeps its place until the unit that
/// starts late is removed.
#[tokio::test]
async fn http_initialize_past_the_start_deadline_keeps_the_slot_until_the_late_unit_is_removed() {
    let options = HttpOptions {
        max_sessions: 1,
        ..HttpOptions::loopback()
    };
    let server = start_server(options, short_start).await;
    server.fake.stall_starts(true);
    let reply = post(server.address, None, &[], &initialize_message()).await;
    let message = reply.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(message.contains("start_timeout"), "{message}");
    let refused = post(server.address, None, &[], &initialize_message()).await;
    assert_eq!(
        refused.status,
        503,
        "{}",
        String::from_utf8_lossy(&refused.body)
    );
    server.fake.stall_starts(false);
    let fake = server.fake.clone();
    wait_until("the late unit is removed", || {
        fake.record(|record| record.removed.len()) == 1
    })
    .await;
    initialize_eventually(server.address).await;
}

/// Processes whose command line contains `marker`.
fn processes_with(marker: &str) -> Vec<String> {
    processes_where(|text| text.contains(marker))
}

/// Processes whose command line (arguments joined by spaces) passes `test`.
fn processes_where(test: impl Fn(&str) -> bool) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if test(&text) {
                found.push(format!("{}: {text}", entry.file_name().to_string_lossy()));
            }
        }
    }
    found
}

/// `box run` of `sleep MARKER` on `backend` in a workspace of its own, in a
/// process group of its own.
pub(crate) fn run_sleep(backend: &str, workspace: &std::path::Path, marker: &str) -> Command {
    let mut command = Command::new(crate::support::box_bin());
    command
        .args(["run", "--backend", backend, "--workspace"])
        .arg(workspace)
        .args(["--", "sleep", marker])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    command
}

/// Issue 8, item 2, on the local backend: `timeout 4 box run -- sleep`, and
/// SIGTERM to box's process group (twice, as `timeout` sends it), leave no
/// process of the unit behind.
#[test]
fn an_interrupted_local_run_leaves_no_unit() {
    use std::os::unix::process::CommandExt as _;
    let workspace = tempfile::tempdir().unwrap();
    for attempt in 0..3 {
        let marker = format!("30.{}{attempt}", std::process::id());
        let mut command = Command::new("timeout");
        command
            .arg("4")
            .arg(crate::support::box_bin())
            .args(["run", "--backend", "local", "--workspace"])
            .arg(workspace.path())
            .args(["--", "sleep", &marker])
            .env("RUST_LOG", "warn");
        let output = command.output().unwrap();
        assert_eq!(output.status.code(), Some(124), "timeout: {output:?}");
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(
            processes_with(&marker),
            Vec::<String>::new(),
            "timeout {attempt}: {}",
            String::from_utf8_lossy(&output.stderr)
        );

        let marker = format!("31.{}{attempt}", std::process::id());
        let mut child = run_sleep("local", workspace.path(), &marker)
            .process_group(0)
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        // The command itself, not box (whose arguments name it too).
        let command = format!("sleep {marker}");
        while processes_where(|text| text.starts_with(&command)).is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "the command never started"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let group = nix::unistd::Pid::from_raw(-(child.id() as i32));
        nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGTERM).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGTERM);
        let status = child.wait().unwrap();
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        // SIGTERM: 143, as `docker run` exits (issue 22, item 10).
        assert_eq!(status.code(), Some(143), "group kill {attempt}: {stderr}");
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(
            processes_with(&marker),
            Vec::<String>::new(),
            "group kill {attempt}: {stderr}"
        );
    }
}

/// The lines both `box execute` and `box serve` get in
/// `execute_and_serve_answer_null_ids_and_discover_probes_alike`.
fn protocol_edge_lines() -> Vec<Value> {
    let discover =
        |id: &str| json!({"jsonrpc": "2.0", "id": id, "method": "server/discover", "params": {}});
    vec![
        json!({"jsonrpc": "2.0", "id": null, "method": "ping"}),
        discover("d1"),
        // As the 2026-07-28 probe of a dual-era client (mcp 2.x) sends it.
        json!({"jsonrpc": "2.0", "id": "d2", "method": "server/discover", "params": {"_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}}}}),
        initialize_message(),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        discover("d3"),
        json!({"jsonrpc": "2.0", "id": null, "method": "tools/list", "params": {}}),
        json!({"jsonrpc": "2.0", "id": "p1", "method": "tools/list", "params": "x"}),
        json!({"jsonrpc": "2.0", "id": "p2", "method": "tools/list", "params": [1, 2]}),
    ]
}

/// Write `lines` to `command`'s stdin, close it, and read the answers.
fn answers(mut command: Command, lines: &[Value]) -> Vec<Value> {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    for line in lines {
        writeln!(stdin, "{line}").unwrap();
    }
    // The executor ends at end of input: give it time to answer first.
    std::thread::sleep(Duration::from_millis(500));
    drop(stdin);
    let output = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

#[test]
fn execute_and_serve_answer_null_ids_and_discover_probes_alike() {
    let root = tempfile::tempdir().unwrap();
    let mut execute = Command::new(box_bin());
    execute
        .arg("execute")
        .arg("--root")
        .arg(root.path())
        .args(["--landlock", "off"]);
    let mut serve = box_command();
    serve.args(["serve", "--backend", "fake"]);
    let lines = protocol_edge_lines();
    let executed = answers(execute, &lines);
    let served = answers(serve, &lines);
    let by_id = |answers: &[Value], id: Value| -> Vec<Value> {
        answers
            .iter()
            .filter(|answer| answer["id"] == id)
            .cloned()
            .collect()
    };
    // The stateless revision's discover: answered in its form by both, the
    // executor's capability under box's key in its extensions.
    for answers in [&executed, &served] {
        let discovered = by_id(answers, json!("d2"));
        assert_eq!(discovered.len(), 1, "{answers:?}");
        let result = &discovered[0]["result"];
        assert_eq!(
            result["supportedVersions"],
            json!(box_jsonrpc::era::all_versions())
        );
        assert_eq!(result["resultType"], json!("complete"));
        assert!(
            result["capabilities"]["extensions"][EXECUTOR_KEY].is_object(),
            "{result}"
        );
    }
    // A probe without the revision's `_meta` is of neither era: refused alike.
    for id in [json!("d1"), json!("d3")] {
        let executed = by_id(&executed, id.clone());
        assert_eq!(executed, by_id(&served, id.clone()), "answers to {id}");
        assert_eq!(executed.len(), 1, "{id}: {executed:?}");
        assert_eq!(executed[0]["error"]["code"], json!(-32601));
        // The versions listed are those initialize and the HTTP header check accept.
        assert_eq!(
            executed[0]["error"]["data"]["supported"],
            json!(box_jsonrpc::PROTOCOL_VERSIONS)
        );
    }
    let null_ids = by_id(&executed, Value::Null);
    assert_eq!(null_ids, by_id(&served, Value::Null));
    assert_eq!(null_ids.len(), 2, "{executed:?}");
    assert_eq!(null_ids[0]["error"]["code"], json!(-32600));
    for id in [json!("p1"), json!("p2")] {
        let executed = by_id(&executed, id.clone());
        let served = by_id(&served, id.clone());
        assert_eq!(executed.len(), 1, "{id}: {executed:?}");
        assert_eq!(executed[0]["error"]["code"], json!(-32602), "{executed:?}");
        assert_eq!(served[0]["error"]["code"], json!(-32602), "{served:?}");
    }
}

/// Initialize at `version`; the session id.
async fn initialize_at(server: &Server, version: &str) -> String {
    let mut message = initialize_message();
    message["params"]["protocolVersion"] = json!(version);
    let reply = post(server.address, None, &[], &message).await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(reply.json()["result"]["protocolVersion"], json!(version));
    reply.header("mcp-session-id").unwrap().to_owned()
}

/// POST `body` on `session` without `MCP-Protocol-Version`, as clients of the
/// versions before 2025-06-18 do.
async fn post_unversioned(server: &Server, session: &str, body: &Value) -> Reply {
    let mut headers: Vec<(&str, &str)> = JSON_HEADERS.to_vec();
    headers.push(("Mcp-Session-Id", session));
    let body = body.to_string();
    http(server.address, "POST", "/mcp", &headers, body.as_bytes()).await
}

#[tokio::test]
async fn http_the_negotiated_version_governs_the_header_and_batches() {
    let server = start_server(HttpOptions::loopback(), boxhost::plan::resolve).await;
    let notification = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    for version in ["2025-03-26", "2024-11-05"] {
        let session = initialize_at(&server, version).await;
        let reply = post_unversioned(&server, &session, &notification).await;
        assert_eq!(reply.status, 202, "{version}");
        let reply =
            post_unversioned(&server, &session, &call(json!(1), "echo", json!({"v": 1}))).await;
        assert_eq!(
            reply.status,
            200,
            "{version}: {:?}",
            String::from_utf8_lossy(&reply.body)
        );
        assert_eq!(
            reply.json()["result"]["content"][0]["text"],
            json!("{\"v\":1}")
        );
        // A supported header is still accepted; an unsupported one never.
        let reply = post(
            server.address,
            Some(&session),
            &[],
            &call(json!(2), "echo", json!({})),
        )
        .await;
        assert_eq!(reply.status, 200, "{version}");
    }

    // 2025-03-26 allows batches: each message routed, the answers in an array.
    let session = initialize_at(&server, "2025-03-26").await;
    let batch = json!([
        call(json!("a"), "echo", json!({"n": "a"})),
        {"jsonrpc": "2.0", "method": "notifications/roots/list_changed"},
        {"jsonrpc": "2.0", "id": "b", "method": "ping"},
    ]);
    let reply = post_unversioned(&server, &session, &batch).await;
    assert_eq!(
        reply.status,
        200,
        "{:?}",
        String::from_utf8_lossy(&reply.body)
    );
    let answers = reply.json();
    let answers = answers.as_array().expect("an array of answers");
    assert_eq!(answers.len(), 2, "{answers:?}");
    let by_id = |id: &str| {
        answers
            .iter()
            .find(|answer| answer["id"] == json!(id))
            .unwrap()
    };
    assert_eq!(
        by_id("a")["result"]["content"][0]["text"],
        json!("{\"n\":\"a\"}")
    );
    assert_eq!(by_id("b")["result"], json!({}));
    // What streams before the answers turns the batch's answer into SSE.
    let batch = json!([
        {"jsonrpc": "2.0", "id": "s", "method": "tools/call", "params": {
            "name": "slow", "arguments": {"steps": 2, "ms": 40}, "_meta": {"progressToken": "t"}}},
        {"jsonrpc": "2.0", "id": "q", "method": "ping"},
    ]);
    let reply = post_unversioned(&server, &session, &batch).await;
    assert_eq!(reply.status, 200);
    assert!(
        reply
            .header("content-type")
            .unwrap()
            .starts_with("text/event-stream")
    );
    let events = reply.events();
    let progress = events
        .iter()
        .filter(|event| event["method"] == json!("notifications/progress"));
    assert!(progress.count() >= 1, "{events:?}");
    for id in ["s", "q"] {
        assert_eq!(
            events
                .iter()
                .filter(|event| event["id"] == json!(id))
                .count(),
            1,
            "{id}: {events:?}"
        );
    }
    // Only notifications: nothing to answer.
    let reply = post_unversioned(&server, &session, &json!([notification])).await;
    assert_eq!(reply.status, 202);
    assert!(reply.body.is_empty());
    // An empty batch, or a bad member, is refused as JSON-RPC says.
    let reply = post_unversioned(&server, &session, &json!([])).await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.json()["error"]["code"], json!(-32600));
    let reply = post_unversioned(
        &server,
        &session,
        &json!([{"jsonrpc": "2.0", "id": "c", "method": "ping"}, 5]),
    )
    .await;
    assert_eq!(reply.status, 200);
    let answers = reply.json();
    let answers = answers.as_array().unwrap();
    assert_eq!(answers.len(), 2, "{answers:?}");
    assert!(
        answers
            .iter()
            .any(|answer| answer["id"] == json!("c") && answer["result"] == json!({})),
        "{answers:?}"
    );
    assert!(
        answers
            .iter()
            .any(|answer| answer["id"].is_null() && answer["error"]["code"] == json!(-32600)),
        "{answers:?}"
    );

    // Later versions: no batches, and the header is required (E63).
    for version in ["2025-06-18", "2025-11-25", "2024-11-05"] {
        let session = initialize_at(&server, version).await;
        let mut headers: Vec<(&str, &str)> = JSON_HEADERS.to_vec();
        headers.push(("Mcp-Session-Id", &session));
        headers.push(("MCP-Protocol-Version", version));
        let body = json!([{"jsonrpc": "2.0", "id": 1, "method": "ping"}]).to_string();
        let reply = http(server.address, "POST", "/mcp", &headers, body.as_bytes()).await;
        assert_eq!(reply.status, 400, "{version}");
        assert_eq!(reply.json()["error"]["code"], json!(-32600));
    }
    let session = initialize_at(&server, "2025-11-25").await;
    let reply = post_unversioned(&server, &session, &call(json!(1), "echo", json!({}))).await;
    assert_eq!(reply.status, 400);
}

#[tokio::test]
async fn http_refuses_an_accept_it_cannot_answer() {
    let server = start_server(HttpOptions::loopback(), boxhost::plan::resolve).await;
    let body = initialize_message().to_string();
    for accept in [
        "text/html",
        "application/json;q=0, text/event-stream;q=0",
        "image/*",
    ] {
        let headers = [("Content-Type", "application/json"), ("Accept", accept)];
        let reply = http(server.address, "POST", "/mcp", &headers, body.as_bytes()).await;
        assert_eq!(reply.status, 406, "{accept}");
        assert_eq!(reply.json()["error"]["code"], json!(-32600));
    }
    assert_eq!(server.fake.record(|record| record.starts.len()), 0);
    for accept in [
        "application/json",
        "text/event-stream",
        "*/*",
        "application/*",
    ] {
        let headers = [("Content-Type", "application/json"), ("Accept", accept)];
        let reply = http(server.address, "POST", "/mcp", &headers, body.as_bytes()).await;
        assert_eq!(reply.status, 200, "{accept}");
    }
    let session = initialize(&server).await;
    let reply = http(
        server.address,
        "GET",
        "/mcp",
        &[("Mcp-Session-Id", &session), ("Accept", "application/json")],
        b"",
    )
    .await;
    assert_eq!(reply.status, 406);
}

#[tokio::test]
async fn http_a_cancelled_request_gets_no_answer() {
    let server = start_server(HttpOptions::loopback(), boxhost::plan::resolve).await;
    let session = initialize(&server).await;
    for (id, accept) in [
        ("c1", "application/json, text/event-stream"),
        ("c2", "application/json"),
    ] {
        let address = server.address;
        let owned = session.clone();
        let hanging = tokio::spawn(async move {
            let headers = [
                ("Content-Type", "application/json"),
                ("Accept", accept),
                ("Mcp-Session-Id", &owned),
                ("MCP-Protocol-Version", "2025-06-18"),
            ];
            let body = call(json!(id), "hang", json!({})).to_string();
            http(address, "POST", "/mcp", &headers, body.as_bytes()).await
        });
        let fake = server.fake.clone();
        let calls = fake.record(|record| record.cancelled.len());
        tokio::time::sleep(Duration::from_millis(200)).await;
        let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": id, "reason": "the user pressed stop"}});
        let reply = post(server.address, Some(&session), &[], &cancel).await;
        assert_eq!(reply.status, 202);
        wait_until("the unit sees the cancel", || {
            fake.record(|record| record.cancelled.len()) > calls
        })
        .await;
        let reply = tokio::time::timeout(Duration::from_secs(10), hanging)
            .await
            .expect("the cancelled request's POST ends")
            .unwrap();
        // MCP: the receiver of a cancel sends no response.
        assert!(
            !String::from_utf8_lossy(&reply.body).contains("jsonrpc"),
            "{accept}: {reply:?} {}",
            String::from_utf8_lossy(&reply.body)
        );
        if accept.contains("text/event-stream") {
            assert_eq!(reply.status, 200);
            assert!(
                reply
                    .header("content-type")
                    .unwrap()
                    .starts_with("text/event-stream")
            );
            assert_eq!(reply.events(), Vec::<Value>::new());
        } else {
            assert_eq!(reply.status, 202);
            assert!(reply.body.is_empty());
        }
    }
}

/// Whether `line` is a well-formed line of the Prometheus text format
/// (0.0.4): a `# HELP`/`# TYPE` comment, or `name{label="value",...} number`
/// with label values escaped.
fn is_exposition_line(line: &str) -> bool {
    if let Some(comment) = line.strip_prefix("# ") {
        return comment.starts_with("HELP ") || comment.starts_with("TYPE ");
    }
    let is_name = |name: &str| {
        !name.is_empty()
            && name.chars().enumerate().all(|(index, c)| {
                c.is_ascii_alphabetic() || c == '_' || c == ':' || (index > 0 && c.is_ascii_digit())
            })
    };
    let name_end = line.find(['{', ' ']).unwrap_or(line.len());
    if !is_name(&line[..name_end]) {
        return false;
    }
    let mut rest = &line[name_end..];
    if let Some(labels) = rest.strip_prefix('{') {
        let mut labels = labels;
        loop {
            if let Some(after) = labels.strip_prefix('}') {
                rest = after;
                break;
            }
            let Some((key, value)) = labels.split_once("=\"") else {
                return false;
            };
            if !is_name(key.trim_start_matches(',')) {
                return false;
            }
            let mut chars = value.char_indices();
            let mut end = None;
            while let Some((index, c)) = chars.next() {
                match c {
                    '\\' => match chars.next() {
                        Some((_, '\\' | '"' | 'n')) => {}
                        _ => return false,
                    },
                    '"' => {
                        end = Some(index);
                        break;
                    }
                    '\n' => return false,
                    _ => {}
                }
            }
            let Some(end) = end else { return false };
            labels = &value[end + 1..];
        }
    }
    let Some(number) = rest.strip_prefix(' ') else {
        return false;
    };
    number.parse::<f64>().is_ok() || ["+Inf", "-Inf", "NaN"].contains(&number)
}

#[tokio::test]
async fn http_metrics_cannot_be_forged_and_their_series_stay_bounded() {
    let server = start_server(HttpOptions::loopback(), boxhost::plan::resolve).await;
    let session = initialize(&server).await;
    let forged = "x\"} 9\nbox_evil 1\n#";
    let reply = post(
        server.address,
        Some(&session),
        &[],
        &call(json!(1), forged, json!({})),
    )
    .await;
    assert_eq!(reply.status, 200);
    for n in 0..20 {
        let name = format!("made-up-{n}");
        post(
            server.address,
            Some(&session),
            &[],
            &call(json!(n + 10), &name, json!({})),
        )
        .await;
    }
    post(
        server.address,
        Some(&session),
        &[],
        &call(json!("e"), "echo", json!({})),
    )
    .await;
    let reply = http(server.address, "GET", "/metrics", &[], b"").await;
    assert_eq!(reply.status, 200);
    let text = String::from_utf8(reply.body.clone()).unwrap();
    let forged_lines: Vec<&str> = text
        .lines()
        .filter(|line| line.starts_with("box_evil"))
        .collect();
    assert_eq!(forged_lines, Vec::<&str>::new(), "a forged series:\n{text}");
    for line in text.lines() {
        assert!(
            is_exposition_line(line),
            "not a valid exposition line: {line:?}\n{text}"
        );
        assert!(!line.contains("made-up"), "an unbounded series: {line:?}");
    }
    assert!(
        text.contains(r#"box_calls_total{method="tools/call",tool="echo",outcome="ok"} 1"#),
        "{text}"
    );
    assert!(text.contains(r#"tool="other""#), "{text}");
    assert!(text.contains("# HELP box_calls_total "), "{text}");
    assert!(
        text.contains(&format!(
            "box_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        )),
        "{text}"
    );
    // Every metric says what it is.
    for line in text.lines().filter_map(|line| line.strip_prefix("# TYPE ")) {
        let name = line.split(' ').next().unwrap();
        assert!(
            text.contains(&format!("# HELP {name} ")),
            "{name} has no HELP"
        );
    }
}

#[tokio::test]
async fn http_health_and_readiness_say_alive_and_whether_the_backend_answers() {
    let server = start_server(HttpOptions::loopback(), boxhost::plan::resolve).await;
    let reply = http(server.address, "GET", "/healthz", &[], b"").await;
    assert_eq!(reply.status, 200);
    let reply = http(server.address, "GET", "/readyz", &[], b"").await;
    assert_eq!(
        reply.status,
        200,
        "{:?}",
        String::from_utf8_lossy(&reply.body)
    );
    server.fake.set_unreachable(true);
    let reply = http(server.address, "GET", "/readyz", &[], b"").await;
    assert_eq!(reply.status, 503);
    assert!(
        String::from_utf8_lossy(&reply.body).contains("backend"),
        "{reply:?}"
    );
    let reply = http(server.address, "GET", "/healthz", &[], b"").await;
    assert_eq!(reply.status, 200);
    server.fake.set_unreachable(false);
    let reply = http(server.address, "GET", "/readyz", &[], b"").await;
    assert_eq!(reply.status, 200);
    // Behind the same checks as /mcp: a foreign Host gets nothing.
    let reply = http(
        server.address,
        "GET",
        "/readyz",
        &[("Host", "evil.example")],
        b"",
    )
    .await;
    assert_eq!(reply.status, 421);
}

/// The release `box` has no fake backend: only box-testkit's testhost does,
/// and no environment variable brings it back.
#[test]
fn the_box_binary_has_no_fake_backend() {
    let output = Command::new(box_bin())
        .args(["serve", "--backend", "fake"])
        .env("BOX_ALLOW_FAKE_BACKEND", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    // Refused by the parser, which lists the binary's own backends.
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("invalid value 'fake' for '--backend <BACKEND>'")
            && stderr.contains("[possible values: auto, docker, local]"),
        "{stderr}"
    );
}

// The stdio transport and the host together, in process (moved from the
// host's unit tests when the host became a crate that never names a
// transport).

const STDIO_WAIT: Duration = Duration::from_secs(10);

fn stdio_host_sessions(fake: &FakeBackend) -> HostSessions {
    let mut config = HostConfig::new(Catalog::new(Vec::new()), facts());
    config.instance = "test-instance".to_owned();
    host_sessions(config, fake)
}

fn stdio_initialize_params(ask: Value) -> Value {
    json!({
        "protocolVersion": "2025-06-18",
        "capabilities": {"elicitation": {}, "experimental": {EXECUTOR_KEY: ask}},
        "clientInfo": {"name": "test", "version": "1"}
    })
}

#[tokio::test]
async fn stdio_frames_lines_and_ends_the_session_at_end_of_file() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let fake = FakeBackend::default();
    let (mut client_in, server_in) = tokio::io::duplex(1 << 20);
    let (server_out, client_out) = tokio::io::duplex(1 << 20);
    let served = tokio::spawn(box_transport::stdio::serve_on(
        Arc::new(stdio_host_sessions(&fake)),
        box_transport::TransportAsk::default(),
        server_in,
        server_out,
        CancellationToken::new(),
    ));
    let mut lines = BufReader::new(client_out).lines();
    let mut next = async || -> Value {
        let line = tokio::time::timeout(STDIO_WAIT, lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        serde_json::from_str(&line).unwrap()
    };
    client_in
        .write_all(
            format!(
                "{}\n",
                box_jsonrpc::request(json!(0), "initialize", stdio_initialize_params(json!({})))
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    assert_eq!(next().await["result"]["serverInfo"]["name"], json!("box"));
    client_in.write_all(b"{not json\n").await.unwrap();
    assert_eq!(
        next().await["error"]["code"],
        json!(box_jsonrpc::code::PARSE_ERROR)
    );
    client_in
        .write_all(b"[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}]\n")
        .await
        .unwrap();
    assert_eq!(
        next().await["error"]["code"],
        json!(box_jsonrpc::code::INVALID_REQUEST)
    );
    client_in
        .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":\"e\",\"method\":\"tools/call\",\"params\":{\"name\":\"echo\",\"arguments\":{}}}\r\n")
        .await
        .unwrap();
    let echo = next().await;
    assert_eq!(echo["id"], json!("e"));
    assert_eq!(fake.live_units().len(), 1);
    drop(client_in);
    tokio::time::timeout(STDIO_WAIT, served)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(fake.live_units(), Vec::<String>::new());
}

#[tokio::test]
async fn stdio_refuses_an_over_long_line_and_reads_on() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let fake = FakeBackend::default();
    let (mut client_in, server_in) = tokio::io::duplex(1 << 20);
    let (server_out, client_out) = tokio::io::duplex(1 << 20);
    let served = tokio::spawn(box_transport::stdio::serve_on(
        Arc::new(stdio_host_sessions(&fake)),
        box_transport::TransportAsk::default(),
        server_in,
        server_out,
        CancellationToken::new(),
    ));
    let writer = tokio::spawn(async move {
        let huge = vec![b'x'; box_jsonrpc::lines::MAX_MESSAGE_BYTES + 10];
        client_in.write_all(&huge).await.unwrap();
        client_in
            .write_all(b"\n{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n")
            .await
            .unwrap();
        client_in
    });
    let mut lines = BufReader::new(client_out).lines();
    let first: Value = serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap();
    assert_eq!(
        first["error"]["code"],
        json!(box_jsonrpc::code::INVALID_REQUEST)
    );
    assert!(
        first["error"]["message"]
            .as_str()
            .unwrap()
            .contains("at most")
    );
    let second: Value = serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap();
    assert_eq!(second["id"], json!(1));
    drop(writer.await.unwrap());
    tokio::time::timeout(STDIO_WAIT, served)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn stdio_splits_batches_only_on_a_2025_03_26_session() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let fake = FakeBackend::default();
    let (mut client_in, server_in) = tokio::io::duplex(1 << 20);
    let (server_out, client_out) = tokio::io::duplex(1 << 20);
    let served = tokio::spawn(box_transport::stdio::serve_on(
        Arc::new(stdio_host_sessions(&fake)),
        box_transport::TransportAsk::default(),
        server_in,
        server_out,
        CancellationToken::new(),
    ));
    let mut lines = BufReader::new(client_out).lines();
    let mut next = async || -> Value {
        let line = tokio::time::timeout(STDIO_WAIT, lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        serde_json::from_str(&line).unwrap()
    };
    let mut params = stdio_initialize_params(json!({}));
    params["protocolVersion"] = json!("2025-03-26");
    let initialize = box_jsonrpc::request(json!(0), "initialize", params);
    client_in
        .write_all(format!("{initialize}\n").as_bytes())
        .await
        .unwrap();
    assert_eq!(
        next().await["result"]["protocolVersion"],
        json!("2025-03-26")
    );
    let batch = json!([
        {"jsonrpc": "2.0", "id": "a", "method": "tools/call", "params": {"name": "echo", "arguments": {"n": 1}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": "b", "method": "ping"},
    ]);
    client_in
        .write_all(format!("{batch}\n").as_bytes())
        .await
        .unwrap();
    let answers = next().await;
    let answers = answers.as_array().expect("one array of answers");
    assert_eq!(answers.len(), 2, "{answers:?}");
    assert!(answers.iter().any(|answer| answer["id"] == json!("a")));
    assert!(answers.iter().any(|answer| answer["id"] == json!("b")));
    client_in.write_all(b"[]\n").await.unwrap();
    assert_eq!(
        next().await["error"]["code"],
        json!(box_jsonrpc::code::INVALID_REQUEST)
    );
    drop(client_in);
    tokio::time::timeout(STDIO_WAIT, served)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

// Asking without capabilities: the path, the Box-* headers, `serve --tighten`.

/// The ask every form below makes: profile `ci`, a tightening the fake's
/// envelope shows (the host's start deadline), a read limit.
const ASK_TIGHTEN: &str = r#"{"limits": {"start_timeout": "45s"}}"#;

/// A header's name and value.
type Header<'a> = (&'a str, &'a str);

/// A refused ask: what it is, where and how it is sent, what the error says.
struct Refused<'a> {
    what: &'a str,
    path: &'a str,
    headers: Vec<Header<'a>>,
    message: Value,
    expected: Vec<&'a str>,
}

/// POST `message` to `path` (no session) with `extra` headers.
async fn post_to(
    address: SocketAddr,
    path: &str,
    extra: &[(&str, &str)],
    message: &Value,
) -> Reply {
    let mut headers: Vec<(&str, &str)> = JSON_HEADERS.to_vec();
    headers.extend_from_slice(extra);
    http(
        address,
        "POST",
        path,
        &headers,
        message.to_string().as_bytes(),
    )
    .await
}

fn initialize_asking(ask: Value) -> Value {
    let mut message = initialize_message();
    message["params"]["capabilities"] = json!({"experimental": {EXECUTOR_KEY: ask}});
    message
}

/// An initialize answer with what differs between any two sessions (the
/// units' backend ids) blanked, so answers can be compared whole.
fn without_unit_ids(mut answer: Value) -> Value {
    if let Some(units) =
        answer["result"]["capabilities"]["experimental"][EXECUTOR_KEY]["box"]["units"]
            .as_array_mut()
    {
        for unit in units {
            unit["id"] = json!("");
        }
    }
    answer
}

#[tokio::test]
async fn http_asks_by_path_and_headers_get_the_capability_asks_answer() {
    let server = start_server(HttpOptions::loopback(), boxhost::plan::resolve).await;
    let capability = json!({"maxReadBytes": 4096, "box": {
        "profile": "ci", "tighten": serde_json::from_str::<Value>(ASK_TIGHTEN).unwrap()}});
    let by_capability = post_to(
        server.address,
        "/mcp",
        &[],
        &initialize_asking(capability.clone()),
    )
    .await;
    assert_eq!(by_capability.status, 200);
    let expected = without_unit_ids(by_capability.json());
    let executor = &expected["result"]["capabilities"]["experimental"][EXECUTOR_KEY];
    assert_eq!(executor["box"]["profile"], json!("ci"), "{expected}");
    assert_eq!(executor["maxReadBytes"], json!(4096), "{expected}");
    assert_eq!(
        executor["box"]["units"][0]["limits"]["startTimeoutMs"],
        json!(45_000),
        "{expected}"
    );
    let headers = [
        ("Box-Profile", "ci"),
        ("Box-Tighten", ASK_TIGHTEN),
        ("Box-Max-Read-Bytes", "4096"),
    ];
    let cases: [(&str, &str, &[Header], Value); 4] = [
        ("headers", "/mcp", &headers, initialize_message()),
        ("the path", "/mcp/p/ci", &headers[1..], initialize_message()),
        (
            "the path and Box-Profile",
            "/mcp/p/ci",
            &headers,
            initialize_message(),
        ),
        (
            "headers and the same capability",
            "/mcp",
            &headers,
            initialize_asking(capability),
        ),
    ];
    for (what, path, headers, message) in cases {
        let reply = post_to(server.address, path, headers, &message).await;
        assert_eq!(reply.status, 200, "{what}");
        assert!(reply.header("mcp-session-id").is_some(), "{what}");
        assert_eq!(without_unit_ids(reply.json()), expected, "{what}");
    }
    // What each session's executor was initialized with: the read limit.
    server.fake.record(|record| {
        assert_eq!(record.initialize_params.len(), 5);
        for params in &record.initialize_params {
            assert_eq!(
                params["capabilities"]["experimental"][EXECUTOR_KEY],
                json!({"maxReadBytes": 4096})
            );
        }
    });
}

#[tokio::test]
async fn http_ask_errors_name_the_field_and_where_it_was_asked_and_start_nothing() {
    let server = start_server(HttpOptions::loopback(), boxhost::plan::resolve).await;
    let oversize = format!(r#"{{"env": {{"drop": ["{}"]}}}}"#, "A".repeat(9000));
    let cases = vec![
        Refused {
            what: "the header against the capability",
            path: "/mcp",
            headers: vec![("Box-Profile", "ci")],
            message: initialize_asking(json!({"box": {"profile": "default"}})),
            expected: vec![
                "box.profile: the Box-Profile header asks for `ci` but capabilities.experimental",
                ".box.profile asks for `default`",
            ],
        },
        Refused {
            what: "the path against the capability's tightening",
            path: "/mcp/p/ci",
            headers: vec![("Box-Tighten", r#"{"servers": []}"#)],
            message: initialize_asking(json!({"box": {"tighten": {"limits": {"pids": 5}}}})),
            expected: vec![
                "box.tighten: the Box-Tighten header asks for",
                ".box.tighten asks for",
            ],
        },
        Refused {
            what: "the path against Box-Profile",
            path: "/mcp/p/ci",
            headers: vec![("Box-Profile", "default")],
            message: initialize_message(),
            expected: vec![
                "box.profile: the path /mcp/p/ci asks for `ci` but the Box-Profile header asks for `default`",
            ],
        },
        Refused {
            what: "JSON that is not",
            path: "/mcp",
            headers: vec![("Box-Tighten", "{oops")],
            message: initialize_message(),
            expected: vec!["box.tighten: the Box-Tighten header: not valid JSON"],
        },
        Refused {
            what: "a duplicate key",
            path: "/mcp",
            headers: vec![("Box-Tighten", r#"{"servers": [], "servers": []}"#)],
            message: initialize_message(),
            expected: vec!["duplicate key `servers`"],
        },
        Refused {
            what: "an oversize tightening",
            path: "/mcp",
            headers: vec![("Box-Tighten", &oversize)],
            message: initialize_message(),
            expected: vec![
                "the Box-Tighten header holds",
                "over the limit of 8192 bytes",
            ],
        },
        Refused {
            what: "a read limit that is not a positive integer",
            path: "/mcp",
            headers: vec![("Box-Max-Read-Bytes", "0")],
            message: initialize_message(),
            expected: vec![
                "maxReadBytes: the Box-Max-Read-Bytes header: must be a positive integer",
            ],
        },
        Refused {
            what: "a header given twice",
            path: "/mcp",
            headers: vec![("Box-Profile", "ci"), ("Box-Profile", "ci")],
            message: initialize_message(),
            expected: vec!["the Box-Profile header is given more than once"],
        },
        Refused {
            what: "a profile that does not exist",
            path: "/mcp/p/nope",
            headers: vec![],
            message: initialize_message(),
            expected: vec!["box.profile: profile `nope`"],
        },
    ];
    for Refused {
        what,
        path,
        headers,
        message,
        expected,
    } in cases
    {
        let reply = post_to(server.address, path, &headers, &message).await;
        assert_eq!(reply.status, 200, "{what}");
        assert!(reply.header("mcp-session-id").is_none(), "{what}");
        let answer = reply.json();
        assert_eq!(answer["error"]["code"], json!(-32602), "{what}: {answer}");
        let text = answer["error"]["message"].as_str().unwrap();
        for expected in expected {
            assert!(text.contains(expected), "{what}: {text}");
        }
    }
    // A widening is refused as a capability's is: the same error, word for word.
    let widening = r#"{"network": {"mode": "bridge"}}"#;
    let by_header = post_to(
        server.address,
        "/mcp/p/ci",
        &[("Box-Tighten", widening)],
        &initialize_message(),
    )
    .await
    .json();
    let by_capability = post_to(
        server.address,
        "/mcp",
        &[],
        &initialize_asking(json!({"box": {"profile": "ci",
            "tighten": serde_json::from_str::<Value>(widening).unwrap()}})),
    )
    .await
    .json();
    assert_eq!(by_header, by_capability);
    assert_eq!(
        by_header["error"]["data"]["field"],
        json!("tighten.network.mode")
    );
    server
        .fake
        .record(|record| assert!(record.starts.is_empty(), "{:?}", record.starts));
}

#[tokio::test]
async fn http_a_sessions_ask_never_changes_after_initialize() {
    let server = start_server(HttpOptions::loopback(), boxhost::plan::resolve).await;
    let reply = post_to(
        server.address,
        "/mcp/p/ci",
        &[("Box-Tighten", ASK_TIGHTEN)],
        &initialize_message(),
    )
    .await;
    let session = reply.header("mcp-session-id").unwrap().to_owned();
    let address = server.address;
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
    let on = |path: &'static str, extra: Vec<(&'static str, &'static str)>| {
        let session = session.clone();
        let list = list.clone();
        async move {
            let mut headers = vec![
                ("Mcp-Session-Id", session.as_str()),
                ("MCP-Protocol-Version", "2025-06-18"),
            ];
            headers.extend(extra);
            post_to(address, path, &headers, &list).await
        }
    };
    // The same ask again (what SDKs do: headers on every request), or none.
    assert_eq!(
        on("/mcp/p/ci", vec![("Box-Tighten", ASK_TIGHTEN)])
            .await
            .status,
        200
    );
    assert_eq!(on("/mcp", vec![("Box-Profile", "ci")]).await.status, 200);
    assert_eq!(on("/mcp", vec![]).await.status, 200);
    // A different one is refused, and the session goes on as it was.
    for (path, extra, expected) in [
        (
            "/mcp/p/default",
            vec![],
            "the profile: the path /mcp/p/default differs",
        ),
        (
            "/mcp",
            vec![("Box-Profile", "default")],
            "the profile: the Box-Profile header differs",
        ),
        (
            "/mcp/p/ci",
            vec![("Box-Tighten", r#"{"servers": []}"#)],
            "Box-Tighten: the Box-Tighten header differs",
        ),
        (
            "/mcp",
            vec![("Box-Max-Read-Bytes", "5")],
            "Box-Max-Read-Bytes: the Box-Max-Read-Bytes header differs",
        ),
    ] {
        let reply = on(path, extra).await;
        assert_eq!(reply.status, 400, "{path}");
        let text = reply.json()["error"]["message"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(text.starts_with(expected), "{text}");
        assert!(text.contains("initialize a new session"), "{text}");
    }
    assert_eq!(on("/mcp/p/ci", vec![]).await.status, 200);
    // GET and DELETE are served on the profile path too.
    let reply = http(
        server.address,
        "DELETE",
        "/mcp/p/ci",
        &[("Mcp-Session-Id", session.as_str())],
        b"",
    )
    .await;
    assert!(
        reply.status == 200 || reply.status == 204,
        "{}",
        reply.status
    );
    wait_until("the session's units are removed", || {
        server.fake.live_units().is_empty()
    })
    .await;
}

#[tokio::test]
async fn http_the_profile_path_passes_the_same_checks_as_mcp() {
    let token = "0123456789abcdef0123456789abcdef";
    let options = HttpOptions {
        token: Some(token.to_owned()),
        ..HttpOptions::loopback()
    };
    let server = start_server(options, boxhost::plan::resolve).await;
    let bearer = format!("Bearer {token}");
    let message = initialize_message();
    for (what, headers, status) in [
        ("no token", vec![], 401),
        (
            "a rebinding Host",
            vec![
                ("Authorization", bearer.as_str()),
                ("Host", "evil.example:80"),
            ],
            421,
        ),
        (
            "a foreign Origin",
            vec![
                ("Authorization", bearer.as_str()),
                ("Origin", "https://evil.example"),
            ],
            403,
        ),
    ] {
        let reply = post_to(server.address, "/mcp/p/ci", &headers, &message).await;
        assert_eq!(reply.status, status, "{what}");
    }
    let get = http(server.address, "GET", "/mcp/p/ci", &[], b"").await;
    assert_eq!(get.status, 401);
    server
        .fake
        .record(|record| assert!(record.starts.is_empty(), "{:?}", record.starts));
    let reply = post_to(
        server.address,
        "/mcp/p/ci",
        &[("Authorization", bearer.as_str())],
        &message,
    )
    .await;
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.json()["result"]["capabilities"]["experimental"][EXECUTOR_KEY]["box"]["profile"],
        json!("ci")
    );
}

#[test]
fn serve_over_stdio_asks_with_its_flags_as_a_capability_would() {
    let answer = |args: &[&str], message: Value| {
        let output = box_command()
            .args(["serve", "--backend", "fake"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                writeln!(child.stdin.take().unwrap(), "{message}")?;
                child.wait_with_output()
            })
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let stdout = String::from_utf8_lossy(&output.stdout);
        without_unit_ids(serde_json::from_str(stdout.lines().next().unwrap()).unwrap())
    };
    let expected = answer(
        &[],
        initialize_asking(json!({"box": {"profile": "ci",
            "tighten": serde_json::from_str::<Value>(ASK_TIGHTEN).unwrap()}})),
    );
    assert_eq!(
        expected["result"]["capabilities"]["experimental"][EXECUTOR_KEY]["box"]["units"][0]["limits"]
            ["startTimeoutMs"],
        json!(45_000),
        "{expected}"
    );
    let flags = ["--profile", "ci", "--tighten", ASK_TIGHTEN];
    assert_eq!(answer(&flags, initialize_message()), expected);
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), ASK_TIGHTEN).unwrap();
    let at_file = format!("@{}", file.path().display());
    assert_eq!(
        answer(
            &["--profile", "ci", "--tighten", &at_file],
            initialize_message()
        ),
        expected
    );
    // A capability that disagrees with the flag is refused, naming both.
    let refused = answer(
        &flags,
        initialize_asking(json!({"box": {"tighten": {"servers": []}}})),
    );
    let text = refused["error"]["message"].as_str().unwrap();
    assert!(
        text.starts_with("box.tighten: box serve --tighten asks for"),
        "{text}"
    );
}

#[test]
fn serve_refuses_a_bad_tighten_and_tighten_with_listen_at_start() {
    for (args, expected) in [
        (
            vec!["--tighten", "{oops"],
            "box serve --tighten: not valid JSON",
        ),
        (
            vec!["--tighten", "{}", "--listen", "127.0.0.1:0"],
            "with --listen each HTTP session asks for its own",
        ),
        (
            vec!["--tighten", "@/nonexistent/t.json"],
            "--tighten @/nonexistent/t.json: reading",
        ),
    ] {
        let output = box_command()
            .args(["serve", "--backend", "fake"])
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(!output.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

#[test]
fn python_sdk_asks_through_headers_the_path_and_serve_flags() {
    let Some(python) = crate::support::python_with_mcp() else {
        return;
    };
    let e2e = crate::support::repo_root().join("tests/e2e");
    let output = Command::new(python)
        .current_dir(&e2e)
        .arg(e2e.join("serve_asks.py"))
        .arg(crate::support::testhost_bin())
        .args(["--backend", "fake"])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "serve_asks.py failed\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Issue 22, items 14 and 15, through `box serve --listen` itself: a 401, a
/// 403 and a refused `initialize` are each a WARN line on stderr, an audit
/// line and a count in `box_sessions_refused{reason}`; `/healthz` and
/// `/readyz` answer a probe without the bearer token.
#[tokio::test(flavor = "multi_thread")]
async fn http_refusals_are_logged_audited_and_counted_and_probes_need_no_token() {
    use std::io::BufRead as _;
    let directory = tempfile::tempdir().unwrap();
    let token = "0123456789abcdef0123456789abcdef";
    let token_file = directory.path().join("token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let audit = directory.path().join("audit.jsonl");
    let mut child = box_command()
        .env("RUST_LOG", "info")
        .args(["serve", "--backend", "fake", "--listen", "127.0.0.1:0"])
        .arg("--token-file")
        .arg(&token_file)
        .arg("--audit")
        .arg(&audit)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let (address_tx, address_rx) = std::sync::mpsc::channel();
    let log = Arc::new(std::sync::Mutex::new(String::new()));
    let log_writer = log.clone();
    std::thread::spawn(move || {
        for line in stderr.lines() {
            let Ok(line) = line else { break };
            // The listen line names the address, whatever its wording.
            if let Some(at) = line.find("127.0.0.1:") {
                let port: String = line[at + 10..]
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                if port != "0" && !port.is_empty() {
                    let _ = address_tx.send(format!("127.0.0.1:{port}"));
                }
            }
            log_writer.lock().unwrap().push_str(&(line + "\n"));
        }
    });
    let address: SocketAddr = address_rx
        .recv_timeout(Duration::from_secs(20))
        .unwrap()
        .parse()
        .unwrap();
    let bearer = format!("Bearer {token}");

    for probe in ["/healthz", "/readyz"] {
        let reply = http(address, "GET", probe, &[], b"").await;
        assert_eq!(reply.status, 200, "{probe} without the token: {reply:?}");
    }
    let message = initialize_message();
    assert_eq!(post(address, None, &[], &message).await.status, 401);
    let wrong = post(
        address,
        None,
        &[("Authorization", "Bearer wrong-token-wrong-token")],
        &message,
    )
    .await;
    assert_eq!(wrong.status, 401);
    let evil = post(
        address,
        None,
        &[
            ("Authorization", &bearer),
            ("Origin", "https://evil.example"),
        ],
        &message,
    )
    .await;
    assert_eq!(evil.status, 403);
    let mut widening = message.clone();
    widening["params"]["capabilities"] = json!({"experimental": {EXECUTOR_KEY: {"box": {"tighten": {"network": {"mode": "bridge"}}}}}});
    let refused = post(address, None, &[("Authorization", &bearer)], &widening).await;
    assert!(refused.json().get("error").is_some(), "{refused:?}");

    let metrics = http(
        address,
        "GET",
        "/metrics",
        &[("Authorization", &bearer)],
        b"",
    )
    .await;
    let metrics = String::from_utf8_lossy(&metrics.body).into_owned();
    for (reason, count) in [("unauthorized", 2), ("origin", 1), ("widening", 1)] {
        let series = format!("box_sessions_refused_total{{reason=\"{reason}\"}} {count}");
        assert!(metrics.contains(&series), "{series}: {metrics}");
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(child.wait().unwrap().success());

    let lines: Vec<Value> = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .filter(|line: &Value| line["kind"] == json!("refusal"))
        .collect();
    let seen: Vec<(&str, Option<u64>)> = lines
        .iter()
        .map(|line| (line["reason"].as_str().unwrap(), line["status"].as_u64()))
        .collect();
    assert_eq!(
        seen,
        [
            ("unauthorized", Some(401)),
            ("unauthorized", Some(401)),
            ("origin", Some(403)),
            ("widening", None),
        ],
        "{lines:?}"
    );
    assert_eq!(lines[3]["client"], json!({"name": "raw", "version": "1"}));
    assert_eq!(lines[3]["profile"], json!("default"));
    let text = std::fs::read_to_string(&audit).unwrap();
    assert!(!text.contains(token), "the audit log holds the token");
    let log = log.lock().unwrap().clone();
    let warned: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("WARN") && line.contains("refused"))
        .collect();
    assert_eq!(warned.len(), 4, "{log}");
    assert!(warned[1].contains("a wrong bearer token"), "{log}");
    assert!(warned[2].contains("evil.example"), "{log}");
    assert!(!log.contains(token), "the log holds the token");
}

/// `_meta` of a request of MCP 2026-07-28, with `extra` keys.
pub(crate) fn stateless_meta(extra: Value) -> Value {
    let mut meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
    });
    if let (Some(meta), Value::Object(extra)) = (meta.as_object_mut(), extra) {
        meta.extend(extra);
    }
    meta
}

/// POST a stateless request: `MCP-Protocol-Version` and `Mcp-Method` as the
/// revision mirrors them, then `extra`.
async fn post_stateless(server: &Server, message: &Value, extra: &[(&str, &str)]) -> Reply {
    let method = message["method"].as_str().unwrap().to_owned();
    let mut headers = vec![
        ("MCP-Protocol-Version", "2026-07-28"),
        ("Mcp-Method", method.as_str()),
    ];
    headers.extend_from_slice(extra);
    post(server.address, None, &headers, message).await
}

/// Issue 26 over HTTP, the raw wire: a handle opened, carried as a header or
/// in `_meta`, checked (a wrong secret, an unknown session), headers that
/// disagree with the body refused (-32020), a call without a handle run in
/// a unit removed after it, and the close removing the session's units.
#[tokio::test]
async fn http_serves_the_stateless_revision_with_handles() {
    let server = start_server(HttpOptions::loopback(), boxhost::plan::resolve).await;
    let discover = json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover",
        "params": {"_meta": stateless_meta(json!({}))}});
    let reply = post_stateless(&server, &discover, &[]).await;
    assert_eq!(reply.status, 200);
    let result = &reply.json()["result"];
    assert!(
        result["supportedVersions"]
            .as_array()
            .unwrap()
            .contains(&json!("2026-07-28")),
        "{result}"
    );
    assert_eq!(
        result["capabilities"]["extensions"][EXECUTOR_KEY]["box"]["session"]["open"],
        json!("box/session.open")
    );
    assert_eq!(server.fake.record(|record| record.starts.len()), 0);
    // A 2025-06-18 client on the same endpoint, at the same time.
    let legacy = initialize(&server).await;

    let open = json!({"jsonrpc": "2.0", "id": 2, "method": "box/session.open",
        "params": {"profile": "default", "_meta": stateless_meta(json!({}))}});
    let reply = post_stateless(&server, &open, &[]).await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert!(reply.header("mcp-session-id").is_none());
    let opened = reply.json()["result"].clone();
    let (id, secret) = (
        opened["id"].as_str().unwrap().to_owned(),
        opened["secret"].as_str().unwrap().to_owned(),
    );
    assert_eq!(opened["resultType"], json!("complete"));
    assert_eq!(opened["units"][0]["name"], json!("workspace"));
    assert_eq!(server.fake.live_units().len(), 2);

    // The handle as a header, then in `_meta`; the answer in the revision's form.
    let echo = |id: i64, meta: Value| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
            "name": "echo", "arguments": {"n": id}, "_meta": stateless_meta(meta)}})
    };
    let handle = format!("{id}:{secret}");
    let by_header = post_stateless(
        &server,
        &echo(3, json!({})),
        &[("Mcp-Name", "echo"), ("Box-Session", &handle)],
    )
    .await;
    assert_eq!(
        by_header.json()["result"]["content"][0]["text"],
        json!("{\"n\":3}")
    );
    assert_eq!(by_header.json()["result"]["resultType"], json!("complete"));
    // The same request id in the 2025-06-18 session: each answered in its own.
    let theirs = post(
        server.address,
        Some(&legacy),
        &[],
        &call(json!(3), "echo", json!({"era": "2025"})),
    )
    .await;
    assert_eq!(
        theirs.json()["result"]["content"][0]["text"],
        json!("{\"era\":\"2025\"}")
    );
    assert!(theirs.json()["result"].get("resultType").is_none());
    let in_meta = echo(4, json!({"box/session": {"id": id, "secret": secret}}));
    let by_meta = post_stateless(&server, &in_meta, &[("Mcp-Name", "=?base64?ZWNobw==?=")]).await;
    assert_eq!(
        by_meta.json()["result"]["content"][0]["text"],
        json!("{\"n\":4}")
    );

    // A wrong secret, an unknown session: refused, the session untouched.
    let wrong = echo(
        5,
        json!({"box/session": {"id": id, "secret": "0".repeat(32)}}),
    );
    let refused = post_stateless(&server, &wrong, &[("Mcp-Name", "echo")]).await;
    assert_eq!(refused.json()["error"]["code"], json!(-32602));
    assert!(!String::from_utf8_lossy(&refused.body).contains(&secret));
    let unknown = echo(
        6,
        json!({"box/session": {"id": "nosuch", "secret": secret}}),
    );
    let reply = post_stateless(&server, &unknown, &[("Mcp-Name", "echo")]).await;
    assert_eq!(reply.status, 404);

    // Headers that disagree with the body, or are missing: -32020.
    let mismatched = post_stateless(
        &server,
        &in_meta,
        &[("Mcp-Name", "other"), ("Box-Session", &handle)],
    )
    .await;
    assert_eq!(mismatched.status, 400);
    assert_eq!(mismatched.json()["error"]["code"], json!(-32020));
    let missing = post(server.address, None, &[("Box-Session", &handle)], &in_meta).await;
    assert_eq!(missing.json()["error"]["code"], json!(-32020));
    let unserved = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2099-01-01"}}});
    let reply = post(
        server.address,
        None,
        &[("Mcp-Method", "tools/list")],
        &unserved,
    )
    .await;
    assert_eq!(reply.json()["error"]["code"], json!(-32022));

    // Without a handle: a unit for the call, removed after it.
    let one_shot = post_stateless(&server, &echo(8, json!({})), &[("Mcp-Name", "echo")]).await;
    assert_eq!(
        one_shot.json()["result"]["content"][0]["text"],
        json!("{\"n\":8}")
    );
    assert_eq!(server.fake.record(|record| record.starts.len()), 3);
    let fake = server.fake.clone();
    wait_until("the one-shot call's unit is removed", || {
        fake.live_units().len() == 2
    })
    .await;

    // The close ends the session: its units are removed, its handle dead.
    let close = json!({"jsonrpc": "2.0", "id": 9, "method": "box/session.close", "params": {
        "_meta": stateless_meta(json!({"box/session": {"id": id, "secret": secret}}))}});
    let reply = post_stateless(&server, &close, &[]).await;
    assert_eq!(reply.json()["result"]["resultType"], json!("complete"));
    wait_until("the closed session's units are removed", || {
        fake.live_units().len() == 1
    })
    .await;
    let reply = post_stateless(
        &server,
        &echo(10, json!({})),
        &[("Mcp-Name", "echo"), ("Box-Session", &handle)],
    )
    .await;
    assert_eq!(reply.status, 404);
}

/// Issue 26: a stateless `tools/list` without a handle answers from the
/// profile it selects. The host keeps the list a workspace unit read at
/// start, so only the first listing of a plan starts a unit (a session
/// opened for it and ended); a plan without a workspace unit lists no tools
/// but box's session tools and starts none.
#[tokio::test]
async fn http_stateless_tools_list_without_a_handle_starts_no_unit_once_listed() {
    let server = start_server(HttpOptions::loopback(), boxhost::plan::resolve).await;
    let list = |id: i64| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/list",
            "params": {"_meta": stateless_meta(json!({}))}})
    };
    let first = post_stateless(&server, &list(1), &[]).await;
    let tools = first.json()["result"]["tools"].clone();
    assert!(
        tools.as_array().is_some_and(|tools| !tools.is_empty()),
        "{}",
        String::from_utf8_lossy(&first.body)
    );
    assert_eq!(server.fake.record(|record| record.starts.len()), 1);
    let fake = server.fake.clone();
    wait_until("the listing's unit is removed", || {
        fake.live_units().is_empty()
    })
    .await;

    let again = post_stateless(&server, &list(2), &[]).await;
    assert_eq!(again.json()["result"]["tools"], tools);
    assert_eq!(again.json()["result"]["resultType"], json!("complete"));
    assert_eq!(server.fake.record(|record| record.starts.len()), 1);

    // No executor's tools: only box's own, which open and close a session.
    let no_fs = post_stateless(&server, &list(3), &[("Box-Profile", "no-fs")]).await;
    let names: Vec<Value> = no_fs.json()["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| tool["name"].clone())
        .collect();
    assert_eq!(
        names,
        [json!("box_session_open"), json!("box_session_close")],
        "{}",
        String::from_utf8_lossy(&no_fs.body)
    );
    assert_eq!(server.fake.record(|record| record.starts.len()), 1);
    assert!(server.fake.live_units().is_empty());
}

/// Issue 26: the stateless revision has no GET stream and no session
/// DELETE, so a GET or DELETE of it (its `MCP-Protocol-Version`) is 405
/// naming POST, and ends nothing; the handshake era's GET and DELETE are
/// as before.
#[tokio::test]
async fn http_get_and_delete_of_the_stateless_revision_are_405() {
    let server = start_server(HttpOptions::loopback(), boxhost::plan::resolve).await;
    let legacy = initialize(&server).await;
    let live = server.fake.live_units().len();
    for method in ["GET", "DELETE"] {
        for headers in [
            vec![("MCP-Protocol-Version", "2026-07-28")],
            vec![
                ("MCP-Protocol-Version", "2026-07-28"),
                ("Mcp-Session-Id", legacy.as_str()),
            ],
        ] {
            let reply = http(server.address, method, "/mcp", &headers, b"").await;
            assert_eq!(
                reply.status,
                405,
                "{method}: {}",
                String::from_utf8_lossy(&reply.body)
            );
            assert_eq!(reply.header("allow"), Some("POST"));
            assert!(
                reply.json()["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("box/session.close")
            );
        }
    }
    assert_eq!(server.fake.live_units().len(), live);

    // The handshake era: no session id is 400, the session's DELETE ends it.
    let reply = http(server.address, "GET", "/mcp", &[], b"").await;
    assert_eq!(reply.status, 400);
    let reply = http(
        server.address,
        "DELETE",
        "/mcp",
        &[("Mcp-Session-Id", &legacy)],
        b"",
    )
    .await;
    assert_eq!(reply.status, 200);
    assert!(server.fake.live_units().is_empty());
}

/// Issue 26 over stdio: a stateless client opens the process's session as
/// a handle and calls with it, a wrong secret is refused, and the secret
/// appears nowhere but in the open's answer: not in the log (at debug), not
/// in the audit log.
#[test]
fn stdio_serves_the_stateless_revision_and_never_logs_the_secret() {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let open = json!({"jsonrpc": "2.0", "id": 1, "method": "box/session.open",
        "params": {"_meta": stateless_meta(json!({}))}});
    let mut serve = box_command();
    serve
        .args(["serve", "--backend", "fake", "--audit"])
        .arg(&audit)
        .env("RUST_LOG", "debug")
        .stderr(Stdio::piped());
    let mut child = serve
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{open}").unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    let opened: Value = serde_json::from_str(&line).unwrap();
    let (id, secret) = (
        opened["result"]["id"].as_str().unwrap().to_owned(),
        opened["result"]["secret"].as_str().unwrap().to_owned(),
    );
    let handle = json!({"box/session": {"id": id, "secret": secret}});
    let lines = [
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "echo", "arguments": {"n": 2}, "_meta": stateless_meta(handle.clone())}}),
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
            "name": "echo", "arguments": {"n": 3},
            "_meta": stateless_meta(json!({"box/session": {"id": id, "secret": "f".repeat(32)}}))}}),
        json!({"jsonrpc": "2.0", "id": 4, "method": "box/session.close", "params": {
            "_meta": stateless_meta(handle)}}),
    ];
    // The close once the calls are answered: it ends what is in flight.
    let mut answered = Vec::new();
    for batch in [&lines[..2], &lines[2..]] {
        for message in batch {
            writeln!(stdin, "{message}").unwrap();
        }
        for _ in batch {
            line.clear();
            std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
            answered.push(serde_json::from_str::<Value>(&line).unwrap());
        }
    }
    drop(stdin);
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "the close ends box serve with 0");
    let by_id = |id: i64| {
        answered
            .iter()
            .find(|answer| answer["id"] == json!(id))
            .unwrap()
    };
    assert_eq!(
        by_id(2)["result"]["content"][0]["text"],
        json!("{\"n\":2}"),
        "{answered:?}"
    );
    assert_eq!(by_id(2)["result"]["resultType"], json!("complete"));
    assert_eq!(by_id(3)["error"]["code"], json!(-32602));
    assert_eq!(by_id(4)["result"]["resultType"], json!("complete"));
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(log.contains("session started"), "a debug log: {log}");
    assert!(!log.contains(&secret), "the secret is in the log: {log}");
    let audited = std::fs::read_to_string(&audit).unwrap();
    assert!(
        audited.contains("\"echo\""),
        "an audit line per call: {audited}"
    );
    assert!(!audited.contains(&secret), "the secret is in the audit log");
}

/// MCP 2026-07-28: closing a request's stream is its cancel. A handle's
/// call whose client drops the connection is cancelled in its unit; in the
/// handshake era a dropped stream cancels nothing
/// (`http_a_cancelled_request_gets_no_answer` sends the cancel instead).
#[tokio::test]
async fn http_a_stateless_call_whose_stream_closes_is_cancelled() {
    let server = start_server(HttpOptions::loopback(), boxhost::plan::resolve).await;
    let open = json!({"jsonrpc": "2.0", "id": 1, "method": "box/session.open",
        "params": {"_meta": stateless_meta(json!({}))}});
    let opened = post_stateless(&server, &open, &[]).await.json();
    let handle = format!(
        "{}:{}",
        opened["result"]["id"].as_str().unwrap(),
        opened["result"]["secret"].as_str().unwrap()
    );
    for (id, accept) in [
        ("h1", "application/json"),
        ("h2", "application/json, text/event-stream"),
    ] {
        let fake = server.fake.clone();
        let before = fake.record(|record| record.cancelled.len());
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
            "name": "hang", "arguments": {}, "_meta": stateless_meta(json!({}))}})
        .to_string();
        let mut stream = TcpStream::connect(server.address).await.unwrap();
        let head = format!(
            "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nAccept: {accept}\r\nMCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: hang\r\nBox-Session: {handle}\r\nContent-Length: {}\r\n\r\n{body}",
            server.address,
            body.len()
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop(stream);
        wait_until("the unit sees the closed stream's cancel", || {
            fake.record(|record| record.cancelled.len()) > before
        })
        .await;
    }
    // Without a handle: the call's own session ends, and its unit goes.
    for accept in ["application/json", "application/json, text/event-stream"] {
        let body = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {
            "name": "hang", "arguments": {}, "_meta": stateless_meta(json!({}))}})
        .to_string();
        let mut stream = TcpStream::connect(server.address).await.unwrap();
        let head = format!(
            "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nAccept: {accept}\r\nMCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: hang\r\nContent-Length: {}\r\n\r\n{body}",
            server.address,
            body.len()
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        let fake = server.fake.clone();
        wait_until("the one-shot call's unit starts", || {
            fake.live_units().len() == 2
        })
        .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        drop(stream);
        wait_until(
            "the one-shot unit is removed when its stream closes",
            || fake.live_units().len() == 1,
        )
        .await;
    }
}

/// Issue 26 with an unmodified client: the Python SDK pinned to MCP
/// 2026-07-28 opens a session with box's tool (`box_session_open`), calls a
/// tool with its handle, answers the fake `ask` tool's elicitation through
/// the revision's "input required" retries, and closes the session with
/// `box_session_close`, over stdio and HTTP (`tests/e2e/stateless_tools_sdk.py`).
#[test]
fn python_sdk_opens_a_session_with_tools_and_answers_input_required() {
    let Some(python) = crate::support::python_with_mcp() else {
        return;
    };
    let e2e = crate::support::repo_root().join("tests/e2e");
    for transport in ["stdio", "http"] {
        let workspace = tempfile::tempdir().unwrap();
        let output = Command::new(&python)
            .current_dir(&e2e)
            .arg(e2e.join("stateless_tools_sdk.py"))
            .arg(crate::support::testhost_bin())
            .args(["--backend", "fake", "--transport", transport, "--workspace"])
            .arg(workspace.path())
            .env("RUST_LOG", "warn")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{transport}: stateless_tools_sdk.py failed\nstdout: {stdout}\nstderr: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(stdout.contains("from the sdk"), "{transport}: {stdout}");
    }
}

/// The tool form of the open and close over stdio: the handle's secret is
/// in the tool's answer only, never in the log (at debug), the audit or the
/// metrics.
#[test]
fn stdio_the_session_tools_never_log_the_secret() {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let open = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "box_session_open", "arguments": {}, "_meta": stateless_meta(json!({}))}});
    let mut child = box_command()
        .args(["serve", "--backend", "fake", "--audit"])
        .arg(&audit)
        .env("RUST_LOG", "debug")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut read = || {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
        serde_json::from_str::<Value>(&line).unwrap()
    };
    writeln!(stdin, "{open}").unwrap();
    let opened = read();
    let answer = &opened["result"]["structuredContent"];
    let secret = answer["secret"].as_str().unwrap().to_owned();
    assert!(
        opened["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains(&secret),
        "{opened}"
    );
    assert_eq!(opened["result"]["resultType"], json!("complete"));
    let handle = json!({"box/session": {"id": answer["id"], "secret": secret}});
    let echo = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "echo", "arguments": {"n": 2}, "_meta": stateless_meta(handle.clone())}});
    writeln!(stdin, "{echo}").unwrap();
    assert_eq!(read()["result"]["content"][0]["text"], json!("{\"n\":2}"));
    let close = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "box_session_close", "arguments": {}, "_meta": stateless_meta(handle)}});
    writeln!(stdin, "{close}").unwrap();
    let closed = read();
    assert_eq!(closed["result"]["isError"], json!(false), "{closed}");
    drop(stdin);
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "the close ends box serve with 0");
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(log.contains("session started"), "a debug log: {log}");
    assert!(!log.contains(&secret), "the secret is in the log: {log}");
    let audited = std::fs::read_to_string(&audit).unwrap();
    assert!(
        audited.contains("\"echo\""),
        "an audit line per call: {audited}"
    );
    assert!(!audited.contains(&secret), "the secret is in the audit log");
}

/// MCP's tasks extension over HTTP, the raw wire: a call declaring it in a
/// handle's session answers at once with a task; `tasks/get` (its id in
/// `Mcp-Name`, as the extension routes) polls it to the call's result in
/// the revision's form; `tasks/cancel` cancels a call in its unit; a task
/// method without a handle starts nothing.
#[tokio::test]
async fn http_serves_tasks_for_calls_that_declare_the_extension() {
    let server = start_server(HttpOptions::loopback(), boxhost::plan::resolve).await;
    let open = json!({"jsonrpc": "2.0", "id": 1, "method": "box/session.open",
        "params": {"_meta": stateless_meta(json!({}))}});
    let opened = post_stateless(&server, &open, &[]).await.json()["result"].clone();
    let handle = format!(
        "{}:{}",
        opened["id"].as_str().unwrap(),
        opened["secret"].as_str().unwrap()
    );
    let tasks_meta = || {
        stateless_meta(json!({"io.modelcontextprotocol/clientCapabilities":
            {"extensions": {"io.modelcontextprotocol/tasks": {}}}}))
    };
    let call = |id: i64, name: &str, arguments: Value| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
            "name": name, "arguments": arguments, "_meta": tasks_meta()}})
    };
    let created = post_stateless(
        &server,
        &call(2, "slow", json!({"ms": 300, "steps": 1})),
        &[("Mcp-Name", "slow"), ("Box-Session", &handle)],
    )
    .await
    .json();
    let task = &created["result"];
    assert_eq!(task["resultType"], json!("task"), "{created}");
    assert_eq!(task["status"], json!("working"), "{created}");
    let task_id = task["taskId"].as_str().unwrap().to_owned();
    let task_method = |id: i64, method: &str| {
        json!({"jsonrpc": "2.0", "id": id, "method": method, "params": {
            "taskId": task_id, "_meta": stateless_meta(json!({}))}})
    };
    // The extension routes on the task id: without it in Mcp-Name, -32020.
    let unrouted = post_stateless(
        &server,
        &task_method(3, "tasks/get"),
        &[("Box-Session", &handle)],
    )
    .await
    .json();
    assert_eq!(unrouted["error"]["code"], json!(-32020), "{unrouted}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let done = loop {
        let got = post_stateless(
            &server,
            &task_method(4, "tasks/get"),
            &[("Mcp-Name", &task_id), ("Box-Session", &handle)],
        )
        .await
        .json();
        assert_eq!(got["result"]["resultType"], json!("complete"), "{got}");
        if got["result"]["status"] == json!("completed") {
            break got;
        }
        assert_eq!(got["result"]["status"], json!("working"), "{got}");
        assert!(std::time::Instant::now() < deadline, "{got}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        done["result"]["result"]["content"][0]["text"],
        json!("slow done"),
        "{done}"
    );

    let hanging = post_stateless(
        &server,
        &call(5, "hang", json!({})),
        &[("Mcp-Name", "hang"), ("Box-Session", &handle)],
    )
    .await
    .json();
    let hang_id = hanging["result"]["taskId"].as_str().unwrap().to_owned();
    let cancel = json!({"jsonrpc": "2.0", "id": 6, "method": "tasks/cancel", "params": {
        "taskId": hang_id, "_meta": stateless_meta(json!({}))}});
    let cancelled = post_stateless(
        &server,
        &cancel,
        &[("Mcp-Name", &hang_id), ("Box-Session", &handle)],
    )
    .await
    .json();
    assert_eq!(
        cancelled["result"],
        json!({"resultType": "complete"}),
        "{cancelled}"
    );
    wait_until("the unit is told to cancel the call", || {
        server.fake.record(|record| record.cancelled.len()) == 1
    })
    .await;

    // Without a handle: refused, and no unit starts for it.
    let starts = server.fake.record(|record| record.starts.len());
    let lost = post_stateless(
        &server,
        &task_method(7, "tasks/get"),
        &[("Mcp-Name", &task_id)],
    )
    .await
    .json();
    assert_eq!(lost["error"]["code"], json!(-32602), "{lost}");
    assert_eq!(server.fake.record(|record| record.starts.len()), starts);
}
