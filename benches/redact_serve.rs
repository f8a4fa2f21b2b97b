//! The cost of the host's redaction on a 1 MiB answer, through `box serve
//! --backend docker` (this build's `box`, real units): two hosts side by
//! side, one whose environment holds 10 credentials (names the scrubber
//! calls credentials, token-like values of about 40 bytes: every session's
//! redactor registers them) and one whose environment holds none (its
//! redactor is empty and redaction is skipped), each serving one session
//! whose unit reads the same file through the files resource
//! (`resources/read`, the largest single answer a unit gives: a 768 KiB file
//! is 1 MiB of base64 in the answer). The calls are timed interleaved, in
//! blocks, so drift on the shared machine hits both alike.
//!
//! Two files: `plain` holds no secret (the usual call: the search finds
//! nothing, the answer passes unchanged), `leaky` holds three of the values
//! (the data is decoded, redacted, encoded again and the answer rebuilt).
//!
//! `cargo bench --bench redact_serve` (BOX_BENCH_CALLS, default 200 per host
//! and file). Containers are labelled `box.instance=bench-redact-…` and
//! removed on the way out.

// A benchmark stops on the first failure, loudly.
#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "common/mod.rs"]
mod common;

use common::{env_number, micros, percentile};

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const BOX: &str = env!("CARGO_BIN_EXE_box");
const FILE_BYTES: usize = 768 * 1024;

/// Ten token-like values under names the scrubber calls credentials.
fn credentials() -> Vec<(String, String)> {
    (0..10)
        .map(|index| {
            (
                format!("BENCH_SERVICE_{index}_TOKEN"),
                format!("tok_{index}_9f8e7d6c5b4a39281706f5e4d3c2b1a0{index:02}x"),
            )
        })
        .collect()
}

struct Peer {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    next: u64,
}

impl Peer {
    fn spawn(workspace: &Path, instance: &str, secrets: &[(String, String)]) -> Peer {
        let mut command = Command::new(BOX);
        command
            .args(["serve", "--backend", "docker", "--instance", instance])
            .arg("--workspace")
            .arg(workspace)
            // Only what box needs: no credential of the bench's own
            // environment reaches either host's redactor.
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", std::env::var_os("HOME").unwrap_or_default())
            .env("RUST_LOG", "warn")
            .envs(secrets.iter().map(|(name, value)| (name, value)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = command.spawn().expect("spawning box serve");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut peer = Peer {
            child,
            stdin,
            stdout,
            next: 1,
        };
        peer.ask(json!({"jsonrpc": "2.0", "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "bench", "version": "1"}}}));
        peer.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        peer
    }

    fn send(&mut self, message: &Value) {
        let mut line = serde_json::to_vec(message).unwrap();
        line.push(b'\n');
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(&line).unwrap();
        stdin.flush().unwrap();
    }

    fn ask(&mut self, mut message: Value) -> String {
        let id = self.next;
        self.next += 1;
        message["id"] = json!(id);
        self.send(&message);
        let mut line = String::new();
        loop {
            line.clear();
            let read = self.stdout.read_line(&mut line).unwrap();
            assert!(read > 0, "box serve hung up");
            if line.contains(&format!("\"id\":{id},")) || line.contains(&format!("\"id\":{id}}}")) {
                assert!(line.contains("\"result\""), "refused: {line}");
                return line;
            }
        }
    }

    fn read(&mut self, path: &str) -> String {
        self.ask(json!({"jsonrpc": "2.0", "method": "resources/read",
            "params": {"uri": format!("agentworkspace:///read?path={path}")}}))
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Text like a source tree, `bytes` long, with `secrets` spread in it.
fn text(bytes: usize, secrets: &[&str]) -> Vec<u8> {
    let line = "    let value = compute(&input, options.limit).map_err(|e| Error::new(e))?;\n";
    let mut out = Vec::with_capacity(bytes);
    let mut index = 0;
    while out.len() < bytes {
        if !secrets.is_empty() && index % 3000 == 1500 {
            let secret = secrets[(index / 3000) % secrets.len()];
            out.extend_from_slice(format!("token = \"{secret}\"\n").as_bytes());
        }
        out.extend_from_slice(line.as_bytes());
        index += 1;
    }
    out.truncate(bytes);
    out
}

/// How many `[REDACTED:` markers the file's bytes in a `resources/read`
/// answer hold.
fn markers(answer: &str) -> usize {
    use base64::Engine as _;
    let answer: Value = serde_json::from_str(answer).unwrap();
    let text = answer["result"]["contents"][0]["text"].as_str().unwrap();
    let document: Value = serde_json::from_str(text).unwrap();
    let data = base64::engine::general_purpose::STANDARD
        .decode(document["data"].as_str().unwrap())
        .unwrap();
    String::from_utf8_lossy(&data).matches("[REDACTED:").count()
}

fn main() {
    let calls = env_number("BOX_BENCH_CALLS", 200);
    let workspace = tempfile::tempdir().unwrap();
    let secrets = credentials();
    let values: Vec<&str> = secrets.iter().take(3).map(|(_, v)| v.as_str()).collect();
    std::fs::write(workspace.path().join("plain.txt"), text(FILE_BYTES, &[])).unwrap();
    std::fs::write(
        workspace.path().join("leaky.txt"),
        text(FILE_BYTES, &values),
    )
    .unwrap();
    let label = format!("bench-redact-{}", std::process::id());
    let mut with = Peer::spawn(workspace.path(), &format!("{label}-on"), &secrets);
    let mut without = Peer::spawn(workspace.path(), &format!("{label}-off"), &[]);
    for file in ["plain.txt", "leaky.txt"] {
        let answer = with.read(file);
        let redacted = markers(&answer);
        assert_eq!(markers(&without.read(file)), 0);
        if file == "leaky.txt" {
            assert!(redacted > 0, "the leaky file's values are redacted");
        }
        assert!(
            answer.len() > 1 << 20,
            "a 1 MiB answer: {} bytes",
            answer.len()
        );
        for _ in 0..5 {
            with.read(file);
            without.read(file);
        }
        let (mut on, mut off) = (Vec::new(), Vec::new());
        for _ in 0..calls.div_ceil(10) {
            for _ in 0..10 {
                let started = Instant::now();
                with.read(file);
                on.push(started.elapsed());
            }
            for _ in 0..10 {
                let started = Instant::now();
                without.read(file);
                off.push(started.elapsed());
            }
        }
        let (on50, off50) = (percentile(&on, 0.5), percentile(&off, 0.5));
        let (on10, off10) = (percentile(&on, 0.1), percentile(&off, 0.1));
        println!(
            "redact, docker, resources/read of a {} KiB file ({} bytes of answer, {redacted} markers), {} calls each: 10 credentials registered p50={:.0}us p10={:.0}us | none p50={:.0}us p10={:.0}us | redaction's share of the call p50={:.1}% p10={:.1}% (goal <= 10%)",
            FILE_BYTES / 1024,
            answer.len(),
            on.len(),
            micros(on50),
            micros(on10),
            micros(off50),
            micros(off10),
            (micros(on50) - micros(off50)) / micros(on50) * 100.0,
            (micros(on10) - micros(off10)) / micros(on10) * 100.0,
        );
    }
    drop(with);
    drop(without);
    for suffix in ["on", "off"] {
        let output = Command::new("docker")
            .args(["ps", "-aq", "--filter"])
            .arg(format!("label=box.instance={label}-{suffix}"))
            .output()
            .unwrap();
        assert!(output.stdout.is_empty(), "units left by {label}-{suffix}");
    }
}
