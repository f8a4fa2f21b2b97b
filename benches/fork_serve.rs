//! `box/fork` end to end (issue 11): the latency a client sees from sending
//! `box/fork` to `box serve` (stdio, docker backend, or the one
//! BOX_FORK_SERVE_BACKEND names) to its answer (the fork made, the child's
//! unit started, its executor initialized and joined
//! to the session), in copy and in worktree mode, on a generated git
//! repository; then `box/discard` (container and storage removed). Baseline,
//! same run, alternating: a whole session start (`box serve` spawned,
//! `initialize` answered: one unit started and initialized), and
//! `cp -a --reflink=auto` of the same tree onto the forks' file system.
//!
//! `cargo bench --profile dev --bench fork_serve`; BOX_FORK_SERVE_FILES
//! (default 2000) files, BOX_FORK_SERVE_ROUNDS (default 5) rounds.
//! Containers are labelled `box.instance=bench-fork-…` and removed with the
//! sessions.

// A benchmark stops on the first failure, loudly.
#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "common/mod.rs"]
mod common;

use common::{env_number, fastest, median, ms};

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const BOX: &str = env!("CARGO_BIN_EXE_box");

struct Served {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<Value>,
    next: i64,
}

impl Served {
    /// Spawn `box serve` and initialize; the time to the answer.
    fn start(backend: &str, instance: &str, workspace: &Path, state: &Path) -> (Self, Duration) {
        let clock = Instant::now();
        let mut child = Command::new(BOX)
            .args(["serve", "--backend", backend, "--instance", instance])
            .arg("--workspace")
            .arg(workspace)
            .env("RUST_LOG", "warn")
            .env("XDG_STATE_HOME", state)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Ok(value) = serde_json::from_str(&line)
                    && send.send(value).is_err()
                {
                    break;
                }
            }
        });
        let mut served = Self {
            child,
            stdin,
            lines,
            next: 1,
        };
        let answer = served.call(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "bench", "version": "1"}}),
        );
        let took = clock.elapsed();
        assert!(answer.get("result").is_some(), "initialize: {answer}");
        writeln!(
            served.stdin,
            "{}",
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
        )
        .unwrap();
        (served, took)
    }

    fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        writeln!(
            self.stdin,
            "{}",
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
        )
        .unwrap();
        self.stdin.flush().unwrap();
        loop {
            let message = self
                .lines
                .recv_timeout(Duration::from_secs(300))
                .expect("an answer within 300 s");
            if message["id"] == json!(id) {
                return message;
            }
        }
    }

    fn end(self) {
        let Self {
            mut child, stdin, ..
        } = self;
        drop(stdin);
        child.wait().unwrap();
    }
}

fn git(dir: &Path, args: &[&str]) {
    let status = Command::new("git")
        .current_dir(dir)
        .args(args)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "git {args:?}");
}

/// A committed repository of `files` text files in 100-file directories,
/// with one uncommitted change.
fn repository(dir: &Path, files: usize) {
    git(dir, &["init", "-q", "-b", "main"]);
    for index in 0..files {
        let sub = dir.join(format!("d{:03}", index / 100));
        std::fs::create_dir_all(&sub).unwrap();
        let body = format!("file {index}\n").repeat(1 + index % 50);
        std::fs::write(sub.join(format!("f{index:05}.txt")), body).unwrap();
    }
    git(dir, &["add", "-A"]);
    git(
        dir,
        &[
            "-c",
            "user.name=b",
            "-c",
            "user.email=b@b",
            "commit",
            "-qm",
            "base",
        ],
    );
    git(dir, &["gc", "-q"]);
    std::fs::write(dir.join("d000/f00000.txt"), "dirty\n").unwrap();
}

fn main() {
    let files = env_number("BOX_FORK_SERVE_FILES", 2000);
    let rounds = env_number("BOX_FORK_SERVE_ROUNDS", 5);
    let backend = std::env::var("BOX_FORK_SERVE_BACKEND").unwrap_or_else(|_| "docker".to_owned());
    let workspace = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    repository(workspace.path(), files);
    let instance = format!("bench-fork-{}", std::process::id());
    let (mut served, _) = Served::start(&backend, &instance, workspace.path(), state.path());
    let mut session_starts = Vec::new();
    let mut forks: [(&str, Vec<Duration>); 2] = [("copy", Vec::new()), ("worktree", Vec::new())];
    let mut discards = Vec::new();
    let mut copies = Vec::new();
    for round in 0..rounds {
        // The file system's own cost: `cp -a --reflink=auto` of the same tree
        // onto the file system the forks live on.
        let target = state.path().join(format!("cp-{round}"));
        let clock = Instant::now();
        let status = Command::new("cp")
            .args(["-a", "--reflink=auto"])
            .arg(workspace.path())
            .arg(&target)
            .status()
            .unwrap();
        copies.push(clock.elapsed());
        assert!(status.success());
        std::fs::remove_dir_all(&target).unwrap();
        let (other, took) = Served::start(
            &backend,
            &format!("{instance}-baseline"),
            workspace.path(),
            state.path(),
        );
        session_starts.push(took);
        other.end();
        for (mode, samples) in &mut forks {
            let clock = Instant::now();
            let forked = served.call("box/fork", json!({"mode": mode}));
            samples.push(clock.elapsed());
            let unit = forked["result"]["unit"]
                .as_str()
                .unwrap_or_else(|| panic!("box/fork {mode}: {forked}"))
                .to_owned();
            assert_eq!(forked["result"]["mode"], json!(mode), "{forked}");
            let clock = Instant::now();
            let discarded = served.call("box/discard", json!({"unit": unit}));
            discards.push(clock.elapsed());
            assert!(discarded.get("result").is_some(), "{discarded}");
        }
    }
    served.end();
    let base = median(&session_starts);
    println!(
        "box/fork end to end, {backend}, {files} files, {rounds} rounds: median (fastest), ratio to a session start"
    );
    println!(
        "session start (spawn + initialize): {:.0} ms ({:.0})",
        ms(base),
        ms(fastest(&session_starts))
    );
    println!(
        "cp -a --reflink=auto of the tree, same file system: {:.0} ms ({:.0})",
        ms(median(&copies)),
        ms(fastest(&copies))
    );
    for (mode, samples) in &forks {
        println!(
            "box/fork {mode}: {:.0} ms ({:.0}), ratio {:.2}",
            ms(median(samples)),
            ms(fastest(samples)),
            median(samples).as_secs_f64() / base.as_secs_f64()
        );
    }
    println!(
        "box/discard: {:.0} ms ({:.0})",
        ms(median(&discards)),
        ms(fastest(&discards))
    );
}
