//! What the init's relay costs per line: `/bin/cat` as the executor, lines
//! sent and echoed back (a) over direct pipes to cat, (b) through the host's
//! channel, the init and its pipes to cat. Two shapes: ping-pong (one line in
//! flight: the latency a call pays) and streaming (all lines in flight: the
//! throughput). Runs alternate and the median is reported. Wall time depends
//! on how busy the machine is (every line crosses two more processes through
//! the init), so the CPU time the init spends per line is reported too, from
//! its `/proc/PID/stat` (clock ticks, so give it enough lines).
//!
//! ```text
//! cargo build -p box-init --bins --examples --release
//! target/x86_64-unknown-linux-gnu/release/examples/relay_cost [LINES] [RUNS]
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Stdio;
use std::time::{Duration, Instant};

use box_init::InitConfig;
use box_init::host;
use box_init::protocol::{KEY_ENV, UnitKey};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::process::Command;

const UNIT: &str = "bench/unit";

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let lines: usize = args.next().map_or(10_000, |n| n.parse().unwrap());
    let runs: usize = args.next().map_or(5, |n| n.parse().unwrap());
    let mut direct_ping = Vec::new();
    let mut relay_ping = Vec::new();
    let mut direct_stream = Vec::new();
    let mut relay_stream = Vec::new();
    let mut init_ping = Vec::new();
    let mut init_stream = Vec::new();
    let mut cat_ping = Vec::new();
    let mut cat_stream = Vec::new();
    for _ in 0..runs {
        let (wall, cpu) = direct(lines, Shape::PingPong).await;
        direct_ping.push(wall);
        cat_ping.push(cpu);
        let (wall, cpu) = relay(lines, Shape::PingPong).await;
        relay_ping.push(wall);
        init_ping.push(cpu);
        let (wall, cpu) = direct(lines, Shape::Stream).await;
        direct_stream.push(wall);
        cat_stream.push(cpu);
        let (wall, cpu) = relay(lines, Shape::Stream).await;
        relay_stream.push(wall);
        init_stream.push(cpu);
    }
    let report = |name: &str, direct: &mut Vec<Duration>, relay: &mut Vec<Duration>| {
        let direct = median(direct) / lines as u32;
        let relay = median(relay) / lines as u32;
        println!(
            "{name}: direct pipe {direct:?}/line, through the init {relay:?}/line, added {:?}/line, ratio {:.2}",
            relay.saturating_sub(direct),
            relay.as_secs_f64() / direct.as_secs_f64()
        );
    };
    println!("{lines} lines of ~30 bytes, median of {runs} runs");
    report("ping-pong", &mut direct_ping, &mut relay_ping);
    report("streaming", &mut direct_stream, &mut relay_stream);
    println!(
        "CPU time of the init per line (user + system): ping-pong {:?}, streaming {:?}",
        median(&mut init_ping) / lines as u32,
        median(&mut init_stream) / lines as u32
    );
    println!(
        "CPU time of cat per line, for scale: ping-pong {:?}, streaming {:?}",
        median(&mut cat_ping) / lines as u32,
        median(&mut cat_stream) / lines as u32
    );
}

#[derive(Clone, Copy)]
enum Shape {
    PingPong,
    Stream,
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn line(number: usize) -> String {
    format!("{{\"jsonrpc\":\"2.0\",\"id\":{number}}}\n")
}

async fn exchange<W, R>(mut writer: W, mut reader: R, lines: usize, shape: Shape) -> Duration
where
    W: AsyncWrite + Unpin + Send + 'static,
    R: AsyncBufRead + Unpin,
{
    let mut echoed = String::new();
    let started = Instant::now();
    match shape {
        Shape::PingPong => {
            for number in 0..lines {
                writer.write_all(line(number).as_bytes()).await.unwrap();
                echoed.clear();
                reader.read_line(&mut echoed).await.unwrap();
                assert_eq!(echoed, line(number));
            }
        }
        Shape::Stream => {
            let feeding = tokio::spawn(async move {
                for number in 0..lines {
                    writer.write_all(line(number).as_bytes()).await.unwrap();
                }
                writer
            });
            for number in 0..lines {
                echoed.clear();
                reader.read_line(&mut echoed).await.unwrap();
                assert_eq!(echoed, line(number));
            }
            feeding.await.unwrap();
        }
    }
    started.elapsed()
}

/// Wall time of the exchange, and the CPU time cat used during it (the cost
/// of the smallest process that reads and writes each line).
async fn direct(lines: usize, shape: Shape) -> (Duration, Duration) {
    let mut cat = Command::new("/bin/cat")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdin = cat.stdin.take().unwrap();
    let stdout = BufReader::new(cat.stdout.take().unwrap());
    let pid = cat.id().unwrap();
    let before = cpu_time(pid);
    let wall = exchange(stdin, stdout, lines, shape).await;
    (wall, cpu_time(pid) - before)
}

/// Wall time of the exchange, and the CPU time the init used during it.
async fn relay(lines: usize, shape: Shape) -> (Duration, Duration) {
    let dir = tempfile::tempdir().unwrap();
    let listener = host::bind(dir.path()).unwrap();
    let key = UnitKey::generate();
    let config = InitConfig {
        socket: listener.path().to_owned(),
        unit: UNIT.into(),
        lease: Duration::from_secs(60),
        bridges: Vec::new(),
        home: None,
        links: Vec::new(),
        executor_env: Vec::new(),
        executor: vec!["/bin/cat".into()],
    };
    let init = std::env::current_exe()
        .unwrap()
        .parent()
        .and_then(|examples| examples.parent())
        .unwrap()
        .join("box-init-test");
    let process = Command::new(&init)
        .args(config.to_args())
        .env(KEY_ENV, key.to_hex())
        .env("BOX_INIT_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|error| {
            panic!(
                "{}: {error} (build it: cargo build -p box-init --bins)",
                init.display()
            )
        });
    let channel = listener
        .accept(&key, UNIT, Duration::from_secs(10))
        .await
        .unwrap();
    channel
        .lease
        .renew(Duration::from_secs(60), 1)
        .await
        .unwrap();
    let pid = process.id().unwrap();
    let before = cpu_time(pid);
    // The reader is already buffered (it yields whole lines).
    let wall = exchange(channel.writer, channel.reader, lines, shape).await;
    (wall, cpu_time(pid) - before)
}

/// User + system time of `pid`, from `/proc/PID/stat` (fields 14 and 15, in
/// clock ticks of 1/100 s on Linux).
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    // After the command: state is field 3, so utime (14) is index 11.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}
