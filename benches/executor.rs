//! Benchmarks for the executor area: see BENCHMARKS.md for what each figure means and
//! how to reproduce it (`cargo bench --bench executor`).
//!
//! Each figure is measured against a baseline in the same run and printed as a ratio:
//! - `read` over stdio (a `tools/call` round trip) against `cat` echoing the same bytes
//!   through a pipe, p50 and p99; with `BOX_BENCH_BASELINE=/path/to/an/older/box[:...]`,
//!   those binaries' executors are measured in the same loop too (before and after a change);
//! - the grep tool on a large tree against `rg` over the same tree;
//! - one `execution/batch` of 8 reads against 8 sequential `tools/call` reads.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/mod.rs"]
mod common;

use common::{micros, percentile};

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

use serde_json::{Value, json};

fn box_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_box"))
}

/// A line-oriented child: `box execute`, or `cat` for the baseline.
struct Peer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
}

impl Peer {
    fn spawn(command: &mut Command) -> Self {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Self {
            child,
            stdin,
            stdout,
            next_id: 1,
        }
    }

    fn executor(root: &Path) -> Self {
        Self::executor_of(&box_bin(), root)
    }

    fn executor_of(binary: &Path, root: &Path) -> Self {
        let mut peer = Self::spawn(
            Command::new(binary)
                .args(["execute", "--landlock", "off", "--root"])
                .arg(root),
        );
        peer.request(
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}),
        );
        peer.line(
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
                .to_string()
                .as_bytes(),
        );
        peer
    }

    fn line(&mut self, line: &[u8]) {
        self.stdin.write_all(line).unwrap();
        self.stdin.write_all(b"\n").unwrap();
        self.stdin.flush().unwrap();
    }

    fn read_line(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.line(
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
                .to_string()
                .as_bytes(),
        );
        loop {
            let response: Value = serde_json::from_str(&self.read_line()).unwrap();
            if response["id"] == json!(id) {
                assert!(response.get("error").is_none(), "{response}");
                return response["result"].clone();
            }
        }
    }

    fn call(&mut self, tool: &str, arguments: Value) -> String {
        let result = self.request("tools/call", json!({"name": tool, "arguments": arguments}));
        assert_eq!(result["isError"], json!(false), "{result}");
        result["content"][0]["text"].as_str().unwrap().to_owned()
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn read_round_trip(iterations: usize) {
    let dir = tempfile::tempdir().unwrap();
    let content: String = (1..=20)
        .map(|n| format!("line {n} of a small file\n"))
        .collect();
    std::fs::write(dir.path().join("small.txt"), &content).unwrap();
    let mut executors: Vec<(&str, Peer)> = vec![("box", Peer::executor(dir.path()))];
    let baselines = std::env::var("BOX_BENCH_BASELINE").unwrap_or_default();
    for baseline in baselines.split(':').filter(|path| !path.is_empty()) {
        executors.push((baseline, Peer::executor_of(Path::new(baseline), dir.path())));
    }
    let request = json!({"jsonrpc": "2.0", "id": 0, "method": "tools/call",
                         "params": {"name": "read", "arguments": {"path": "small.txt"}}})
    .to_string();
    let mut cat = Peer::spawn(&mut Command::new("cat"));

    for _ in 0..iterations / 10 {
        for (_, executor) in &mut executors {
            executor.call("read", json!({"path": "small.txt"}));
        }
        cat.line(request.as_bytes());
        cat.read_line();
    }
    let switches_before: Vec<u64> = executors
        .iter()
        .map(|(_, executor)| context_switches(executor.child.id()))
        .collect();
    let mut samples = vec![Vec::with_capacity(iterations); executors.len()];
    let mut cat_samples = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        for ((_, executor), samples) in executors.iter_mut().zip(&mut samples) {
            let started = Instant::now();
            executor.call("read", json!({"path": "small.txt"}));
            samples.push(started.elapsed());
        }
        let started = Instant::now();
        cat.line(request.as_bytes());
        cat.read_line();
        cat_samples.push(started.elapsed());
    }
    for ((name, executor), before) in executors.iter().zip(switches_before) {
        let switches = context_switches(executor.child.id()) - before;
        println!(
            "read over stdio: {name} executor context switches per call {:.2} (all its threads, voluntary and not)",
            switches as f64 / iterations as f64
        );
    }
    for (label, fraction) in [("p50", 0.5), ("p99", 0.99)] {
        let base = percentile(&cat_samples, fraction);
        for ((name, _), samples) in executors.iter().zip(&samples) {
            let ours = percentile(samples, fraction);
            println!(
                "read over stdio {label}: {name} {:.0} µs, cat pipe echo {:.0} µs, ratio {:.1} (goal <= 3)",
                micros(ours),
                micros(base),
                micros(ours) / micros(base)
            );
        }
    }
}

/// The context switches of every thread of process `pid` so far (Linux `/proc`).
fn context_switches(pid: u32) -> u64 {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let status =
            std::fs::read_to_string(task.unwrap().path().join("status")).unwrap_or_default();
        total += status
            .lines()
            .filter(|line| line.contains("ctxt_switches:"))
            .filter_map(|line| line.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum::<u64>();
    }
    total
}

fn grep_large_tree(tree: &Path, pattern: &str, runs: usize) {
    let mut executor = Peer::executor(tree);
    let grep = |executor: &mut Peer| {
        executor.call(
            "grep",
            json!({"pattern": pattern, "max_results": 10_000_000}),
        )
    };
    let rg = || {
        let output = Command::new("rg")
            .args([
                "--no-ignore",
                "--hidden",
                "--no-heading",
                "-n",
                "--",
                pattern,
            ])
            .arg(tree)
            .output()
            .expect("rg (apt-get install -y ripgrep)");
        output.stdout.len()
    };
    // Warm the page cache for both.
    let matches = grep(&mut executor).lines().count();
    rg();
    let mut ours = Vec::new();
    let mut base = Vec::new();
    for _ in 0..runs {
        let started = Instant::now();
        grep(&mut executor);
        ours.push(started.elapsed());
        let started = Instant::now();
        rg();
        base.push(started.elapsed());
    }
    let ours = percentile(&ours, 0.5);
    let base = percentile(&base, 0.5);
    println!(
        "grep {pattern:?} over {} ({matches} matching lines), median of {runs}: box {:.1} ms, rg {:.1} ms, ratio {:.2} (goal <= 1.5)",
        tree.display(),
        ours.as_secs_f64() * 1e3,
        base.as_secs_f64() * 1e3,
        ours.as_secs_f64() / base.as_secs_f64()
    );
}

fn batch_of_reads(lines: usize, iterations: usize) {
    let dir = tempfile::tempdir().unwrap();
    for n in 0..8 {
        let content: String = (1..=200)
            .map(|line| format!("file {n} line {line}\n"))
            .collect();
        std::fs::write(dir.path().join(format!("f{n}.txt")), content).unwrap();
    }
    let mut executor = Peer::executor(dir.path());
    let calls: Vec<Value> = (0..8)
        .map(|n| json!({"name": "read", "arguments": {"path": format!("f{n}.txt")}}))
        .collect();
    let mut batch = Vec::with_capacity(iterations);
    let mut sequential = Vec::with_capacity(iterations);
    for round in 0..iterations + iterations / 10 {
        let started = Instant::now();
        let answer = executor.request("execution/batch", json!({"calls": calls}));
        assert_eq!(answer["results"].as_array().unwrap().len(), 8);
        let batch_time = started.elapsed();
        let started = Instant::now();
        for n in 0..8 {
            executor.call("read", json!({"path": format!("f{n}.txt")}));
        }
        let sequential_time = started.elapsed();
        if round >= iterations / 10 {
            batch.push(batch_time);
            sequential.push(sequential_time);
        }
    }
    let ours = percentile(&batch, 0.5);
    let base = percentile(&sequential, 0.5);
    println!(
        "8 reads of {lines}-line files: one execution/batch {:.0} µs, 8 sequential tools/call {:.0} µs, ratio {:.2} (goal <= 0.4)",
        micros(ours),
        micros(base),
        micros(ours) / micros(base)
    );
}

fn main() {
    let filter: Option<String> = std::env::args().skip(1).find(|arg| !arg.starts_with('-'));
    let wanted = |name: &str| filter.as_deref().is_none_or(|filter| name.contains(filter));
    if wanted("read") {
        read_round_trip(2000);
    }
    if wanted("grep") {
        let tree = std::env::var_os("BOX_BENCH_TREE")
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cargo/registry/src"))
            })
            .unwrap();
        grep_large_tree(&tree, "fn spawn_blocking", 10);
        grep_large_tree(&tree, "unsafe impl", 10);
    }
    if wanted("batch") {
        batch_of_reads(20, 300);
        batch_of_reads(200, 300);
    }
}
