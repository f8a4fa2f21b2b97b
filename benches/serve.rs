//! Serve benchmarks, with the recording fake backend (in-process fake
//! executors), so they measure the host and the proxy, not a unit:
//!
//! 1. Per-call round trip through a session (proxy: id remapping, routing,
//!    the unit's writer and reader tasks) against the same calls sent straight
//!    to a fake executor's stdio, in the same run. A placeholder for the figure
//!    with real units.
//! 2. N concurrent streamable-HTTP sessions (50, 200): each initializes, makes
//!    calls and deletes itself; per-call latency p50/p99 against a trivial
//!    request (`GET /metrics`) over the same raw HTTP client in the same run,
//!    the process's RSS growth at peak, and units left behind (must be 0).
//!
//! `cargo bench --bench serve` (BOX_BENCH_CALLS, BOX_BENCH_SESSIONS override the sizes).

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/mod.rs"]
mod common;

use common::{env_number, micros, percentile};

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use box_jsonrpc::lines::{Line, LineReader, write_line};
use box_testkit::fake::FakeBackend;
use box_transport::http::{HttpOptions, serve};
use boxhost::backend::{Backend as _, SessionLabel};
use boxhost::host::{HostConfig, Services, spawn_session};
use boxhost::plan::{HostFacts, UserIds};
use boxhost::profile::Catalog;
use boxhost::sessions::HostSessions;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

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

fn config() -> Arc<HostConfig> {
    Arc::new(HostConfig::new(Catalog::new(Vec::new()), facts()))
}

fn services(fake: &FakeBackend) -> Arc<Services> {
    Arc::new(Services::new(Arc::new(fake.clone())))
}

fn call(id: u64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": "echo", "arguments": {"n": id}}})
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|line| line.starts_with("VmRSS:"))
                .and_then(|line| line.split_whitespace().nth(1))
                .and_then(|kib| kib.parse().ok())
        })
        .unwrap_or(0)
}

/// Sequential echo calls straight to a fake executor's stdio.
async fn direct_round_trips(calls: usize) -> Vec<Duration> {
    let fake = FakeBackend::default();
    let label = SessionLabel {
        instance: "bench".to_owned(),
        session: "direct".to_owned(),
        profile: "default".to_owned(),
    };
    let plan = boxhost::plan::resolve(
        &Catalog::new(Vec::new()).load("default").unwrap(),
        &Value::Null,
        &facts(),
    )
    .unwrap();
    let unit = fake.start(&label, &plan.units[0]).await.unwrap();
    let mut stdin = unit.io.stdin;
    let mut reader = LineReader::new(unit.io.stdout, 16 << 20);
    let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}});
    write_line(&mut stdin, &initialize).await.unwrap();
    reader.next().await.unwrap();
    let mut timings = Vec::with_capacity(calls);
    for id in 1..=calls as u64 {
        let started = Instant::now();
        write_line(&mut stdin, &call(id)).await.unwrap();
        let Some(Line::Message(_)) = reader.next().await.unwrap() else {
            panic!("the fake executor hung up")
        };
        timings.push(started.elapsed());
    }
    fake.remove(&unit.envelope.id).await.unwrap();
    timings
}

/// The same calls through a session (the proxy).
async fn proxied_round_trips(calls: usize) -> Vec<Duration> {
    let fake = FakeBackend::default();
    let shutdown = CancellationToken::new();
    let (general, _general_rx) = mpsc::channel(16);
    let session = spawn_session(
        config(),
        services(&fake),
        "bench".to_owned(),
        general,
        &shutdown,
    );
    let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}});
    session
        .request(initialize)
        .await
        .unwrap()
        .response
        .await
        .unwrap();
    let mut timings = Vec::with_capacity(calls);
    for id in 1..=calls as u64 {
        let started = Instant::now();
        let answer = session
            .request(call(id))
            .await
            .unwrap()
            .response
            .await
            .unwrap();
        assert!(answer.get("result").is_some());
        timings.push(started.elapsed());
    }
    session.end();
    session.ended().await;
    assert!(fake.live_units().is_empty());
    timings
}

/// One raw HTTP/1.1 exchange; the status and the body.
async fn http(
    address: SocketAddr,
    method: &str,
    session: Option<&str>,
    body: &str,
) -> (u16, Option<String>, String) {
    let mut stream = TcpStream::connect(address).await.unwrap();
    let mut request = format!(
        "{method} /{} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\n",
        if method == "GET" { "metrics" } else { "mcp" },
        body.len()
    );
    if let Some(session) = session {
        request.push_str(&format!(
            "Mcp-Session-Id: {session}\r\nMCP-Protocol-Version: 2025-06-18\r\n"
        ));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let session = head
        .lines()
        .find_map(|line| {
            line.to_ascii_lowercase()
                .strip_prefix("mcp-session-id:")
                .map(str::to_owned)
        })
        .map(|value| value.trim().to_owned());
    (status, session, body.to_owned())
}

struct SessionFigures {
    calls: Vec<Duration>,
}

async fn one_http_session(
    address: SocketAddr,
    calls: usize,
    peak: Arc<tokio::sync::Barrier>,
) -> SessionFigures {
    let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}});
    let (status, session, _) = http(address, "POST", None, &initialize.to_string()).await;
    assert_eq!(status, 200);
    let session = session.expect("a session id");
    let mut timings = Vec::with_capacity(calls);
    for id in 1..=calls as u64 {
        let started = Instant::now();
        let (status, _, _) = http(address, "POST", Some(&session), &call(id).to_string()).await;
        assert_eq!(status, 200);
        timings.push(started.elapsed());
    }
    // Everyone holds their session open here, so the RSS read after the barrier is the peak.
    peak.wait().await;
    peak.wait().await;
    let (status, _, _) = http(address, "DELETE", Some(&session), "").await;
    assert_eq!(status, 200);
    SessionFigures { calls: timings }
}

async fn http_sessions(sessions: usize, calls: usize) {
    let fake = FakeBackend::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let options = HttpOptions {
        max_sessions: sessions + 8,
        ..HttpOptions::loopback()
    };
    tokio::spawn(serve(
        Arc::new(HostSessions::new(config(), services(&fake))),
        options,
        listener,
        shutdown.clone(),
    ));
    // Baseline: a trivial request over the same client, at the same concurrency.
    let baseline_tasks: Vec<_> = (0..sessions)
        .map(|_| {
            tokio::spawn(async move {
                let mut timings = Vec::new();
                for _ in 0..calls {
                    let started = Instant::now();
                    let (status, _, _) = http(address, "GET", None, "").await;
                    assert_eq!(status, 200);
                    timings.push(started.elapsed());
                }
                timings
            })
        })
        .collect();
    let mut baseline = Vec::new();
    for task in baseline_tasks {
        baseline.extend(task.await.unwrap());
    }
    baseline.sort();
    let before = rss_kib();
    let peak = Arc::new(tokio::sync::Barrier::new(sessions + 1));
    let started = Instant::now();
    let tasks: Vec<_> = (0..sessions)
        .map(|_| tokio::spawn(one_http_session(address, calls, peak.clone())))
        .collect();
    peak.wait().await;
    let at_peak = rss_kib();
    let live_at_peak = fake.live_units().len();
    peak.wait().await;
    let mut timings = Vec::new();
    for task in tasks {
        timings.extend(task.await.unwrap().calls);
    }
    let wall = started.elapsed();
    timings.sort();
    let leaked = fake.live_units().len();
    shutdown.cancel();
    let p50 = percentile(&timings, 0.5);
    let p99 = percentile(&timings, 0.99);
    let base50 = percentile(&baseline, 0.5);
    let base99 = percentile(&baseline, 0.99);
    println!(
        "http sessions={sessions:>3} calls/session={calls} live units at peak={live_at_peak} wall={:.2}s \
         call p50={:.0}us p99={:.0}us | baseline GET /metrics, same concurrency, p50={:.0}us p99={:.0}us | ratio p50={:.2} p99={:.2} \
         | RSS +{} KiB at peak ({:.1} KiB/session) | units leaked={leaked}",
        wall.as_secs_f64(),
        micros(p50),
        micros(p99),
        micros(base50),
        micros(base99),
        micros(p50) / micros(base50).max(1.0),
        micros(p99) / micros(base99).max(1.0),
        at_peak.saturating_sub(before),
        at_peak.saturating_sub(before) as f64 / sessions as f64,
    );
    assert_eq!(leaked, 0, "units leaked");
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let calls = env_number("BOX_BENCH_CALLS", 2000);
    runtime.block_on(async {
        // Interleaved rounds, so drift on a shared machine hits both paths alike.
        direct_round_trips(100).await;
        proxied_round_trips(100).await;
        let mut direct = Vec::new();
        let mut proxied = Vec::new();
        for _ in 0..5 {
            direct.extend(direct_round_trips(calls / 5).await);
            proxied.extend(proxied_round_trips(calls / 5).await);
        }
        direct.sort();
        proxied.sort();
        let (d50, d99) = (percentile(&direct, 0.5), percentile(&direct, 0.99));
        let (p50, p99) = (percentile(&proxied, 0.5), percentile(&proxied, 0.99));
        println!(
            "round trip, {calls} sequential echo calls: proxy p50={:.1}us p99={:.1}us | direct to the fake executor p50={:.1}us p99={:.1}us | ratio p50={:.2} p99={:.2} | added p50={:.1}us",
            micros(p50),
            micros(p99),
            micros(d50),
            micros(d99),
            micros(p50) / micros(d50).max(0.001),
            micros(p99) / micros(d99).max(0.001),
            micros(p50) - micros(d50),
        );
        let sessions = std::env::var("BOX_BENCH_SESSIONS").unwrap_or_else(|_| "50,200".to_owned());
        for count in sessions.split(',').filter_map(|n| n.trim().parse().ok()) {
            http_sessions(count, 10).await;
        }
    });
}
