//! The egress proxy's cost against going direct, measured in the same run.
//!
//! - bulk download over raw TCP: direct from the upstream, against a `CONNECT` tunnel
//!   through the proxy's Unix socket, and through the bridge's port as a unit's tools go
//!   (the bridge hands its listener to the proxy, so the proxy accepts there itself);
//! - bulk HTTPS download with `curl` from `openssl s_server`: direct, against through
//!   the bridge and the proxy (with the server-name check on);
//! - connection setup until the first byte can flow: direct TCP connect, against
//!   `CONNECT` answered 200 (through the socket and through the bridge).
//!
//! `cargo bench -p box-egress --bench egress [-- bulk|https|setup]`; sizes from
//! `BOX_EGRESS_BENCH_MIB` (default 256), rounds from `BOX_EGRESS_BENCH_ROUNDS` (5)
//! and `BOX_EGRESS_BENCH_SETUPS` (2000).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use box_egress::{
    AllowList, Event, HostName, Limits, Options, Policy, PolicyHandle, PrivateDestinations, Unit,
    UnitIdentity, bridge, serve,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixStream};

const NAME: &str = "bulk.test";

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

fn percentile(samples: &[Duration], fraction: f64) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    sorted[((sorted.len() as f64 - 1.0) * fraction).round() as usize]
}

fn median(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

fn best(samples: &[f64]) -> f64 {
    samples.iter().copied().fold(0.0, f64::max)
}

/// CPU seconds from a `/proc/<pid>/stat`: user + system, and the same for its
/// waited-for children.
fn stat_cpu(pid: &str) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let fields: Vec<f64> = stat[stat.rfind(')').unwrap() + 2..]
        .split(' ')
        .map(|field| field.parse().unwrap_or(0.0))
        .collect();
    // utime, stime, cutime, cstime in USER_HZ ticks (100 a second on Linux).
    (
        (fields[11] + fields[12]) / 100.0,
        (fields[13] + fields[14]) / 100.0,
    )
}

/// CPU seconds this process has used. The upstream, the proxy and the client all run
/// in this process, so the difference over a download is the whole work of moving its
/// bytes, whatever else the machine runs.
fn cpu_seconds() -> f64 {
    stat_cpu("self").0
}

/// A server that writes `bytes` to every connection, then closes.
async fn bulk_server(bytes: usize) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let chunk = vec![0u8; 256 * 1024];
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
    port
}

/// A server that accepts and holds each connection until the client closes.
async fn idle_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut sink = [0u8; 64];
                while matches!(stream.read(&mut sink).await, Ok(read) if read > 0) {}
            });
        }
    });
    port
}

/// The proxy for one unit allowing `bulk.test` on `ports`, and its bridge.
struct Egress {
    socket: std::path::PathBuf,
    bridge_port: u16,
    _handle: PolicyHandle,
}

async fn start_egress(directory: &Path, ports: &[u16], tls_ports: &[u16]) -> Egress {
    let socket = directory.join("egress.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let allow = AllowList::parse(ports.iter().map(|port| format!("{NAME}:{port}"))).unwrap();
    let policy = Policy {
        allow: allow.clone(),
        hosts: [(HostName::parse(NAME).unwrap(), "127.0.0.1".parse().unwrap())].into(),
        private_destinations: PrivateDestinations::Allowed,
        host_addresses: BTreeSet::new(),
    };
    let handle = PolicyHandle::new(policy, allow).unwrap();
    let unit = Unit {
        identity: UnitIdentity {
            session: "bench".to_owned(),
            unit: "work".to_owned(),
        },
        policy: handle.subscribe(),
        limits: Limits::default(),
        options: Options {
            tls_ports: tls_ports.iter().copied().collect(),
            ..Options::default()
        },
        throttled: Default::default(),
    };
    // What a host would do with each event: build its audit line.
    let sink = Arc::new(|event: Event| {
        std::hint::black_box(serde_json::to_string(&event).unwrap());
    });
    tokio::spawn(serve(listener, unit, sink));
    let bridge_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let bridge_port = bridge_listener.local_addr().unwrap().port();
    tokio::spawn(bridge(bridge_listener, socket.clone()));
    Egress {
        socket,
        bridge_port,
        _handle: handle,
    }
}

/// Send `CONNECT` and read the 200 answer.
async fn open_tunnel<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, port: u16) {
    let request = format!("CONNECT {NAME}:{port} HTTP/1.1\r\nHost: {NAME}:{port}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8];
        assert_eq!(stream.read(&mut byte).await.unwrap(), 1);
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
}

async fn drain<S: AsyncRead + Unpin>(stream: &mut S, buffer: &mut [u8]) -> usize {
    let mut total = 0;
    loop {
        let read = stream.read(buffer).await.unwrap();
        if read == 0 {
            return total;
        }
        total += read;
    }
}

#[derive(Clone, Copy, Debug)]
enum Path3 {
    Direct,
    Socket,
    Bridge,
}

async fn download(path: Path3, egress: &Egress, port: u16, buffer: &mut [u8]) -> (usize, Duration) {
    let start = Instant::now();
    let bytes = match path {
        Path3::Direct => {
            let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
            drain(&mut stream, buffer).await
        }
        Path3::Socket => {
            let mut stream = UnixStream::connect(&egress.socket).await.unwrap();
            open_tunnel(&mut stream, port).await;
            drain(&mut stream, buffer).await
        }
        Path3::Bridge => {
            let mut stream = TcpStream::connect(("127.0.0.1", egress.bridge_port))
                .await
                .unwrap();
            stream.set_nodelay(true).unwrap();
            open_tunnel(&mut stream, port).await;
            drain(&mut stream, buffer).await
        }
    };
    (bytes, start.elapsed())
}

async fn bulk(egress: &Egress, port: u16, bytes: usize, rounds: usize) {
    let mut buffer = vec![0u8; 256 * 1024];
    let mut speeds: [Vec<f64>; 3] = Default::default();
    let mut cpu: [f64; 3] = [0.0; 3];
    let paths = [Path3::Direct, Path3::Socket, Path3::Bridge];
    // One warm-up round, then interleaved rounds.
    for round in 0..=rounds {
        for (index, path) in paths.iter().enumerate() {
            let before = cpu_seconds();
            let (got, elapsed) = download(*path, egress, port, &mut buffer).await;
            let used = cpu_seconds() - before;
            assert_eq!(got, bytes, "{path:?}");
            if round > 0 {
                speeds[index].push(bytes as f64 / (1 << 20) as f64 / elapsed.as_secs_f64());
                cpu[index] += used;
            }
        }
    }
    let gibibytes = (bytes * rounds) as f64 / (1u64 << 30) as f64;
    let (direct, direct_best, direct_cpu) =
        (median(&speeds[0]), best(&speeds[0]), cpu[0] / gibibytes);
    println!(
        "bulk TCP download, {} MiB, {rounds} interleaved rounds after one warm-up",
        bytes >> 20
    );
    println!(
        "| path | MiB/s median (best) | direct, same run | ratio median (best) (goal >= 0.8) | CPU s per GiB | direct | ratio |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (index, label) in [
        "CONNECT through the proxy socket",
        "CONNECT through the bridge's port (its listener handed to the proxy)",
    ]
    .iter()
    .enumerate()
    {
        let (speed, speed_best, used) = (
            median(&speeds[index + 1]),
            best(&speeds[index + 1]),
            cpu[index + 1] / gibibytes,
        );
        println!(
            "| {label} | {speed:.0} ({speed_best:.0}) | {direct:.0} ({direct_best:.0}) | {:.2} ({:.2}) | {used:.2} | {direct_cpu:.2} | {:.2} |",
            speed / direct,
            speed_best / direct_best,
            used / direct_cpu
        );
    }
}

fn curl_speed(args: &[String]) -> f64 {
    let output = Command::new("curl")
        .args([
            "-sS",
            "-k",
            "-o",
            "/dev/null",
            "-w",
            "%{speed_download} %{size_download}",
        ])
        .args(args)
        .env_clear()
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).unwrap();
    let speed: f64 = text.split(' ').next().unwrap().parse().unwrap();
    speed / (1 << 20) as f64
}

async fn https(directory: &Path, bytes: usize, rounds: usize) {
    let file = directory.join("bulk.bin");
    std::fs::write(&file, vec![0u8; bytes]).unwrap();
    let (key, cert) = (directory.join("key.pem"), directory.join("cert.pem"));
    let status = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
        ])
        .arg(format!("/CN={NAME}"))
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let mut server = Command::new("openssl")
        .args(["s_server", "-quiet", "-WWW", "-accept"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("-cert")
        .arg(&cert)
        .arg("-key")
        .arg(&key)
        .current_dir(directory)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    for _ in 0..100 {
        if TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let sub = directory.join("https");
    std::fs::create_dir(&sub).unwrap();
    let egress = start_egress(&sub, &[port], &[port]).await;
    let url = format!("https://{NAME}:{port}/bulk.bin");
    let direct_args = vec![
        "--resolve".to_owned(),
        format!("{NAME}:{port}:127.0.0.1"),
        url.clone(),
    ];
    let proxy_args = vec![
        "-x".to_owned(),
        format!("http://127.0.0.1:{}", egress.bridge_port),
        url,
    ];
    let mut direct = Vec::new();
    let mut proxied = Vec::new();
    let (mut direct_cpu, mut proxied_cpu) = (0.0, 0.0);
    let server_pid = server.id().to_string();
    // Everything a download costs: curl (a waited child), openssl s_server (by pid),
    // and this process (the proxy and the bridge).
    let total_cpu = || {
        let (own, children) = stat_cpu("self");
        own + children + stat_cpu(&server_pid).0
    };
    for round in 0..=rounds {
        for (args, speeds, cpu) in [
            (&direct_args, &mut direct, &mut direct_cpu),
            (&proxy_args, &mut proxied, &mut proxied_cpu),
        ] {
            let before = total_cpu();
            let args = args.clone();
            let speed = tokio::task::spawn_blocking(move || curl_speed(&args))
                .await
                .unwrap();
            let used = total_cpu() - before;
            if round > 0 {
                speeds.push(speed);
                *cpu += used;
            }
        }
    }
    let _ = server.kill();
    let _ = server.wait();
    let gibibytes = (bytes * rounds) as f64 / (1u64 << 30) as f64;
    let (direct_cpu, proxied_cpu) = (direct_cpu / gibibytes, proxied_cpu / gibibytes);
    let (direct_best, proxied_best) = (best(&direct), best(&proxied));
    let (direct, proxied) = (median(&direct), median(&proxied));
    println!();
    println!(
        "bulk HTTPS download with curl from openssl s_server, {} MiB, {rounds} interleaved rounds after one warm-up",
        bytes >> 20
    );
    println!(
        "| path | MiB/s median (best) | direct, same run | ratio median (best) (goal >= 0.8) | CPU s per GiB (curl, s_server, proxy) | direct | ratio |"
    );
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| through the bridge's port, its listener handed to the proxy (server name checked) | {proxied:.0} ({proxied_best:.0}) | {direct:.0} ({direct_best:.0}) | {:.2} ({:.2}) | {proxied_cpu:.2} | {direct_cpu:.2} | {:.2} |",
        proxied / direct,
        proxied_best / direct_best,
        proxied_cpu / direct_cpu
    );
}

async fn setup(egress: &Egress, port: u16, rounds: usize) {
    let mut samples: [Vec<Duration>; 3] = Default::default();
    for round in 0..rounds + 100 {
        // Direct: until the TCP connection is established.
        let start = Instant::now();
        let direct = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let direct_time = start.elapsed();
        drop(direct);
        // Through the socket: until the 200 is read (the proxy has connected upstream).
        let start = Instant::now();
        let mut stream = UnixStream::connect(&egress.socket).await.unwrap();
        open_tunnel(&mut stream, port).await;
        let socket_time = start.elapsed();
        drop(stream);
        // Through the bridge, as a unit's tool.
        let start = Instant::now();
        let mut stream = TcpStream::connect(("127.0.0.1", egress.bridge_port))
            .await
            .unwrap();
        stream.set_nodelay(true).unwrap();
        open_tunnel(&mut stream, port).await;
        let bridge_time = start.elapsed();
        drop(stream);
        if round >= 100 {
            samples[0].push(direct_time);
            samples[1].push(socket_time);
            samples[2].push(bridge_time);
        }
    }
    let micros = |duration: Duration| duration.as_secs_f64() * 1e6;
    let (direct50, direct99) = (percentile(&samples[0], 0.5), percentile(&samples[0], 0.99));
    println!();
    println!("connection setup, {rounds} interleaved rounds after 100 warm-up");
    println!(
        "| path | p50 | p99 | direct TCP connect p50 / p99, same run | added at p50 (goal <= 1 ms) | added at p99 |"
    );
    println!("|---|---|---|---|---|---|");
    for (index, label) in [
        "CONNECT through the proxy socket until 200",
        "CONNECT through the bridge's port until 200",
    ]
    .iter()
    .enumerate()
    {
        let (p50, p99) = (
            percentile(&samples[index + 1], 0.5),
            percentile(&samples[index + 1], 0.99),
        );
        println!(
            "| {label} | {:.0} µs | {:.0} µs | {:.0} / {:.0} µs | {:.0} µs | {:.0} µs |",
            micros(p50),
            micros(p99),
            micros(direct50),
            micros(direct99),
            micros(p50) - micros(direct50),
            micros(p99) - micros(direct99)
        );
    }
}

fn main() {
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with('-'))
        .collect();
    let wants = |name: &str| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()));
    let bytes = env_number("BOX_EGRESS_BENCH_MIB", 256) << 20;
    let rounds = env_number("BOX_EGRESS_BENCH_ROUNDS", 5);
    let setups = env_number("BOX_EGRESS_BENCH_SETUPS", 2000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let directory = tempfile::tempdir().unwrap();
        let bulk_port = bulk_server(bytes).await;
        let idle_port = idle_server().await;
        let egress = start_egress(directory.path(), &[bulk_port, idle_port], &[]).await;
        if wants("bulk") {
            bulk(&egress, bulk_port, bytes, rounds).await;
        }
        if wants("https") {
            https(directory.path(), bytes, rounds).await;
        }
        if wants("setup") {
            setup(&egress, idle_port, setups).await;
        }
    });
}
