//! Serve benchmarks with REAL units (issue 5): `box serve` is run as its own
//! process (this build's `box`), on the docker backend (`box-base:bookworm`)
//! or the local backend, and every figure is a ratio against a baseline
//! measured in the same run:
//!
//! - `start`: session start (initialize → first tool result) through
//!   `box serve` vs raw bollard create + start + exec of the executor on the
//!   same image, the exec'd executor answering initialize and the same `read`;
//!   and on the local backend, from an idle `box serve` and from its spawn,
//!   vs spawning an unsandboxed `box execute` + initialize + the same first
//!   call (`BOX_BENCH_BEFORE=PATH` adds another `box` binary's figures, in
//!   the same rounds).
//! - `call`: per-call round trip (`tools/call read` of a 20-line file) through
//!   `box serve` over stdio vs the same executor reached directly with
//!   `docker exec -i UNIT /.box/box execute …` (dax's recipe) in the same
//!   unit; over HTTP, `box serve --listen` vs `mcp-proxy` (PyPI, its own venv
//!   at `.venv-mcp-proxy`, skipped loudly when absent) in front of the same
//!   `docker exec` command.
//! - `http`: N concurrent streamable-HTTP sessions against
//!   `box serve --listen 127.0.0.1:PORT` (docker and local): box serve's
//!   VmRSS/VmHWM, call p50/p99 (every session at once) against the same reads
//!   at the same concurrency straight to each session's unit (`docker exec -i`
//!   into it; a `box execute` child per session on local), and the units left
//!   after every session's DELETE (must be 0).
//! - `batch`: one `execution/batch` of 8 reads vs 8 sequential `tools/call`
//!   reads, through `box serve` and through `docker exec -i`.
//! - `egress`: a bulk HTTPS download (`curl -k` of a file from `openssl
//!   s_server -WWW` on the host's loopback) from inside a local unit, then a
//!   docker unit, whose network is `egress` (through the executor's bridge
//!   and the host's proxy, the name pinned with `network.hosts`), against the
//!   same `curl` on the host going direct, alternating round by round.
//! - `runtime`: session start (initialize → first tool result, from an idle
//!   `box serve`) of a gVisor unit (`runtime = "runsc"`) against the same
//!   profile under the engine's default runtime (runc), alternating round by
//!   round; both with `landlock = "best-effort"` (gVisor has none).
//!
//! - `warm`: session start (initialize → first read result, over HTTP) on
//!   `box serve --listen --pool default=N` (a pooled unit claimed, the
//!   session's plan bound to it) against the same profile on a host with no
//!   pool (a cold start), alternating round by round in the same run; then
//!   BOX_BENCH_WARM_CONCURRENT (default 20) sessions at once on a pool of that
//!   many, against as many cold starts at once; the pool's refill rate (units
//!   a second, from empty) and what an idle pooled unit costs the engine
//!   (its cgroup's memory; local: its processes' VmRSS) and the host (box
//!   serve's VmRSS per unit). Docker, then local (`BOX_BENCH_WARM_BACKENDS`,
//!   default `docker,local`).
//!
//! - `warmfork` (asked by name): `warm`'s figure for a `source = "fork"`
//!   profile on a git repository of `BOX_BENCH_FORK_FILES` files (default
//!   200; `BOX_BENCH_FORK_MODE`, default `auto`): a pooled unit claimed and the session's fork made into its
//!   directory, against a cold start (the fork made, then the unit started);
//!   docker and local (`BOX_BENCH_WARM_BACKENDS`).
//!
//! - `runhost`: a one-shot `box run … true`, from its spawn to its exit:
//!   `box run --host URL` against a `box serve --listen --pool default=2`
//!   (the command claims a pooled unit), against the same run through a
//!   listening host with no pool (a cold start there), and against `box run
//!   --backend B` with a host of its own (everything cold, in this process),
//!   rounds interleaved; docker and local (`BOX_BENCH_WARM_BACKENDS`).
//!
//! - `before-call`: with `BOX_BENCH_BEFORE=PATH`, per-call round trips
//!   through this build's `box serve` and the other binary's, local and
//!   docker, interleaved in blocks (a restructuring's cost per call).
//!
//! - `tracing`: per-call round trips (`tools/call read`, each with a W3C
//!   `traceparent` in `_meta`) through this build's `box serve` with tracing
//!   off and with tracing on (exporting OTLP/HTTP to a receiver in this
//!   process), and with `BOX_BENCH_BEFORE=PATH` through that binary too,
//!   local and docker, interleaved in blocks (issue 27: off <= 1.01x of
//!   before, on <= 1.10x of off); `BOX_BENCH_TRACING_HOSTS` hosts of each.
//!
//! `cargo bench --profile dev --bench serve_units [-- start|call|http|batch]`;
//! BOX_BENCH_HTTP (default `docker:50,local:50,local:200`) picks the
//! concurrency runs. Everything started here (containers labelled
//! `box.bench=<label>` or `box.instance=bench-…`, processes) is removed on the
//! way out, failures included.

// A benchmark stops on the first failure, loudly.
#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "common/mod.rs"]
mod common;

/// The git repository setup the integration tests use.
#[path = "../tests/it/support/repository.rs"]
mod repository;

use common::{env_number, median, micros, ms, percentile};

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use boxhost::backend::docker::bollard::Docker;
use boxhost::backend::docker::bollard::exec::{
    CreateExecOptions, StartExecOptions, StartExecResults,
};
use boxhost::backend::docker::bollard::models::{
    ContainerCreateBody, HostConfig, Mount, MountType,
};
use boxhost::backend::docker::bollard::query_parameters::RemoveContainerOptionsBuilder;
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const IMAGE: &str = "box-base:bookworm";
const BOX: &str = env!("CARGO_BIN_EXE_box");

fn label() -> String {
    format!("bench-{}", std::process::id())
}

/// Removes every container this run labelled, on the way out (panics included).
struct DockerSweep;

impl Drop for DockerSweep {
    fn drop(&mut self) {
        for filter in [
            format!("label=box.bench={}", label()),
            format!("label=box.instance={}", label()),
        ] {
            sweep_filter(&filter);
        }
        // Instances named per figure: `bench-PID-…`.
        let out = Command::new("docker")
            .args(["ps", "-aq", "--filter", "label=box.instance"])
            .args(["--format", "{{.ID}} {{.Label \"box.instance\"}}"])
            .output();
        if let Ok(out) = out {
            let prefix = format!("{}-", label());
            let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|line| line.split_once(' '))
                .filter(|(_, instance)| instance.starts_with(&prefix))
                .map(|(id, _)| id.to_owned())
                .collect();
            if !ids.is_empty() {
                let _ = Command::new("docker")
                    .args(["rm", "-f"])
                    .args(&ids)
                    .stdout(Stdio::null())
                    .status();
            }
        }
    }
}

fn sweep_filter(filter: &str) {
    let ids = containers(filter);
    if !ids.is_empty() {
        let _ = Command::new("docker")
            .args(["rm", "-f"])
            .args(&ids)
            .stdout(Stdio::null())
            .status();
    }
}

fn containers(filter: &str) -> Vec<String> {
    Command::new("docker")
        .args(["ps", "-aq", "--filter", filter])
        .output()
        .map(|out| {
            String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// A workspace with a 20-line `small.txt` and eight 20-line `f0..f7.txt`.
fn workspace() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("box-bench-ws")
        .tempdir()
        .unwrap();
    let text = |n: &str| -> String { (1..=20).map(|l| format!("{n} line {l}\n")).collect() };
    std::fs::write(dir.path().join("small.txt"), text("small")).unwrap();
    for n in 0..8 {
        std::fs::write(dir.path().join(format!("f{n}.txt")), text(&format!("f{n}"))).unwrap();
    }
    dir
}

fn initialize_message(id: u64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "bench", "version": "0"}}})
}

fn initialized() -> Value {
    json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
}

fn read_call(id: u64, path: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": "read", "arguments": {"path": path}}})
}

fn batch_call(id: u64) -> Value {
    let calls: Vec<Value> = (0..8)
        .map(|n| json!({"name": "read", "arguments": {"path": format!("f{n}.txt")}}))
        .collect();
    json!({"jsonrpc": "2.0", "id": id, "method": "execution/batch", "params": {"calls": calls}})
}

/// A child speaking MCP as JSON lines on its stdio; closing stdin ends it
/// (box serve then removes its units), and drop waits for that, then kills.
struct Peer {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    next: u64,
}

impl Peer {
    fn spawn(command: &mut Command) -> Peer {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {command:?}: {e}"));
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Peer {
            child,
            stdin,
            stdout,
            next: 1,
        }
    }

    fn send(&mut self, message: &Value) {
        let mut line = serde_json::to_vec(message).unwrap();
        line.push(b'\n');
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(&line).unwrap();
        stdin.flush().unwrap();
    }

    /// Sends `message` (a request) and reads until its answer.
    fn ask(&mut self, mut message: Value) -> Value {
        let id = self.next;
        self.next += 1;
        message["id"] = json!(id);
        self.send(&message);
        let mut line = String::new();
        loop {
            line.clear();
            let read = self.stdout.read_line(&mut line).unwrap();
            assert!(read > 0, "the peer hung up while answering {message}");
            let answer: Value = serde_json::from_str(&line).unwrap();
            if answer.get("id") == Some(&json!(id)) {
                assert!(
                    answer.get("result").is_some(),
                    "{message} was refused: {answer}"
                );
                return answer;
            }
        }
    }

    fn initialize(&mut self) {
        self.ask(initialize_message(0));
        self.send(&initialized());
    }

    fn read(&mut self, path: &str) {
        let answer = self.ask(read_call(0, path));
        assert_ne!(
            answer.pointer("/result/isError"),
            Some(&json!(true)),
            "read {path}: {answer}"
        );
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(20);
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

fn box_serve(backend: &str, workspace: &Path, instance: &str) -> Command {
    box_serve_of(Path::new(BOX), backend, workspace, instance)
}

/// `box serve` of the binary `box_exe` (this build's, or another given to
/// compare with: `BOX_BENCH_BEFORE`).
fn box_serve_of(box_exe: &Path, backend: &str, workspace: &Path, instance: &str) -> Command {
    let mut command = Command::new(box_exe);
    command
        .args(["serve", "--backend", backend, "--instance", instance])
        .arg("--workspace")
        .arg(workspace)
        .env("RUST_LOG", "warn");
    command
}

/// The recipe dax documents: one long-lived `docker exec -i` into a unit, MCP
/// over its stdio, with the same argv and user the backend uses.
fn docker_exec_argv(container: &str) -> Vec<String> {
    [
        "docker",
        "exec",
        "-i",
        "-u",
        "0:0",
        "-w",
        "/workspace",
        container,
        "/.box/box",
        "execute",
        "--root",
        "/workspace",
        "--kind",
        "container",
        "--ref",
        IMAGE,
        "--landlock",
        "required",
    ]
    .map(str::to_owned)
    .to_vec()
}

fn the_unit_of(instance: &str) -> String {
    let ids = containers(&format!("label=box.instance={instance}"));
    assert_eq!(ids.len(), 1, "one unit for instance {instance}: {ids:?}");
    ids[0].clone()
}

// ---------------------------------------------------------------- start

/// Raw bollard: create + start a container of the image with the executor
/// bind-mounted, exec it, initialize, and the same first `read`.
async fn raw_docker_start(docker: &Docker, workspace: &Path) -> Duration {
    let started = Instant::now();
    let mount = |source: &Path, target: &str, read_only: bool| Mount {
        target: Some(target.to_owned()),
        source: Some(source.to_string_lossy().into_owned()),
        typ: Some(MountType::BIND),
        read_only: Some(read_only),
        ..Default::default()
    };
    let id = docker
        .create_container(
            None,
            ContainerCreateBody {
                image: Some(IMAGE.to_owned()),
                cmd: Some(vec!["sleep".to_owned(), "infinity".to_owned()]),
                entrypoint: Some(Vec::new()),
                labels: Some([("box.bench".to_owned(), label())].into()),
                host_config: Some(HostConfig {
                    init: Some(true),
                    network_mode: Some("none".to_owned()),
                    mounts: Some(vec![
                        mount(Path::new(BOX), "/.box/box", true),
                        mount(workspace, "/workspace", false),
                    ]),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
        .await
        .expect("raw create")
        .id;
    docker.start_container(&id, None).await.expect("raw start");
    let argv: Vec<String> = docker_exec_argv("x")[8..].to_vec();
    let exec = docker
        .create_exec(
            &id,
            CreateExecOptions {
                attach_stdin: Some(true),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                tty: Some(false),
                cmd: Some(argv),
                working_dir: Some("/workspace".to_owned()),
                ..Default::default()
            },
        )
        .await
        .expect("raw create exec");
    let StartExecResults::Attached {
        mut output,
        mut input,
    } = docker
        .start_exec(&exec.id, Some(StartExecOptions::default()))
        .await
        .expect("raw start exec")
    else {
        panic!("the engine detached the exec")
    };
    let mut pending = Vec::new();
    let mut lines = Vec::new();
    for message in [
        initialize_message(1),
        initialized(),
        read_call(2, "small.txt"),
    ] {
        let wants = message.get("id").cloned();
        let mut line = serde_json::to_vec(&message).unwrap();
        line.push(b'\n');
        input.write_all(&line).await.unwrap();
        input.flush().await.unwrap();
        let Some(wants) = wants else { continue };
        'answer: loop {
            while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                let answer: Value = serde_json::from_slice(&line).unwrap();
                if answer.get("id") == Some(&wants) {
                    assert!(answer.get("result").is_some(), "raw: {answer}");
                    lines.push(answer);
                    break 'answer;
                }
            }
            match output.next().await {
                Some(Ok(boxhost::backend::docker::bollard::container::LogOutput::StdOut {
                    message,
                })) => pending.extend_from_slice(&message),
                Some(Ok(_)) => {}
                other => panic!("raw executor ended: {other:?}"),
            }
        }
    }
    let elapsed = started.elapsed();
    drop(input);
    let _ = docker
        .remove_container(
            &id,
            Some(RemoveContainerOptionsBuilder::new().force(true).build()),
        )
        .await;
    elapsed
}

/// `box serve` already running and idle; initialize → first tool result.
fn box_start(backend: &str, workspace: &Path, instance: &str) -> Duration {
    let elapsed = box_start_of(Path::new(BOX), backend, workspace, instance);
    if backend == "docker" {
        let left = containers(&format!("label=box.instance={instance}"));
        assert!(left.is_empty(), "units left by {instance}: {left:?}");
    }
    elapsed
}

/// A stdio session as a client starts one: `box serve` spawned, then at once
/// initialize → first tool result, timed from the spawn (the process's own
/// start and its cold per-process caches included).
fn box_start_from_spawn(
    box_exe: &Path,
    backend: &str,
    workspace: &Path,
    instance: &str,
) -> Duration {
    let started = Instant::now();
    let mut peer = Peer::spawn(&mut box_serve_of(box_exe, backend, workspace, instance));
    peer.initialize();
    peer.read("small.txt");
    let elapsed = started.elapsed();
    drop(peer);
    elapsed
}

/// `box serve` of `box_exe` already running and idle; initialize → first tool result.
fn box_start_of(box_exe: &Path, backend: &str, workspace: &Path, instance: &str) -> Duration {
    let mut peer = Peer::spawn(&mut box_serve_of(box_exe, backend, workspace, instance));
    // Let the process finish its own start (engine ping, sweep) first: the
    // figure is the session's start, from the client's initialize.
    std::thread::sleep(Duration::from_millis(400));
    let started = Instant::now();
    peer.initialize();
    peer.read("small.txt");
    let elapsed = started.elapsed();
    drop(peer);
    elapsed
}

fn unsandboxed_start(workspace: &Path) -> Duration {
    let started = Instant::now();
    let mut peer = Peer::spawn(
        Command::new(BOX)
            .args(["execute", "--landlock", "off", "--seccomp", "off", "--root"])
            .arg(workspace),
    );
    peer.initialize();
    peer.read("small.txt");
    started.elapsed()
}

fn start_figures(runtime: &tokio::runtime::Runtime, workspace: &Path, docker: Option<&Docker>) {
    const ROUNDS: usize = 7;
    if let Some(docker) = docker {
        let before = std::env::var_os("BOX_BENCH_BEFORE").map(PathBuf::from);
        let (mut ours, mut raw, mut theirs) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..=ROUNDS {
            let instance = format!("{}-start-{round}", label());
            let a = box_start("docker", workspace, &instance);
            let b = runtime.block_on(raw_docker_start(docker, workspace));
            let c = before.as_ref().map(|before| {
                box_start_of(before, "docker", workspace, &format!("{instance}-before"))
            });
            // Round 0 warms the engine's caches for both.
            if round > 0 {
                ours.push(a);
                raw.push(b);
                theirs.extend(c);
            }
        }
        if !theirs.is_empty() {
            println!(
                "start, docker: this build median {:.0} ms (min {:.0}) | BOX_BENCH_BEFORE median {:.0} ms (min {:.0}) | ratio {:.2}, {ROUNDS} rounds interleaved",
                ms(median(&ours)),
                ms(percentile(&ours, 0.0)),
                ms(median(&theirs)),
                ms(percentile(&theirs, 0.0)),
                ms(median(&ours)) / ms(median(&theirs)),
            );
        }
        println!(
            "start, docker: box serve initialize → first read result median {:.0} ms (min {:.0}) | raw bollard create+start+exec of the executor, initialize, same read: median {:.0} ms (min {:.0}) | ratio {:.2} (goal <= 1.3), {ROUNDS} rounds",
            ms(median(&ours)),
            ms(percentile(&ours, 0.0)),
            ms(median(&raw)),
            ms(percentile(&raw, 0.0)),
            ms(median(&ours)) / ms(median(&raw)),
        );
    }
    local_start_figures(workspace);
}

/// Bulk HTTPS through a unit's egress proxy against the same download direct,
/// on `backend` (`docker` or `local`).
fn egress_figures(backend: &str) {
    let rounds = env_number("BOX_BENCH_ROUNDS", 5);
    let mib = env_number("BOX_BENCH_EGRESS_MIB", 128);
    let served = tempfile::tempdir().unwrap();
    let file = served.path().join("bulk.bin");
    {
        let mut out = std::fs::File::create(&file).unwrap();
        let block = vec![0x5a_u8; 1 << 20];
        for _ in 0..mib {
            out.write_all(&block).unwrap();
        }
    }
    let (key, cert) = (served.path().join("k.pem"), served.path().join("c.pem"));
    let made = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=bulk.test",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .unwrap();
    assert!(made.status.success(), "openssl req: {made:?}");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut server = Command::new("openssl")
        .args(["s_server", "-WWW", "-quiet", "-accept"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("-cert")
        .arg(&cert)
        .arg("-key")
        .arg(&key)
        .current_dir(served.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let profiles = tempfile::tempdir().unwrap();
    std::fs::write(
        profiles.path().join("bench-egress.toml"),
        format!(
            "description = \"egress bench\"\nextends = \"default\"\n[workspace]\nimage = \"box-test-tools:latest\"\nlocal_userland = \"host\"\n[network]\nmode = \"egress\"\nallow = [\"bulk.test:{port}\"]\nhosts = {{ \"bulk.test\" = \"127.0.0.1\" }}\n[operator]\nallow_dangerous = [\"private-destinations\"]\n"
        ),
    )
    .unwrap();
    let workspace = tempfile::tempdir().unwrap();
    let instance = format!("{}-egress-{backend}", label());
    let mut command = box_serve(backend, workspace.path(), &instance);
    command
        .arg("--profiles")
        .arg(profiles.path())
        .args(["--profile", "bench-egress"]);
    let mut peer = Peer::spawn(&mut command);
    peer.initialize();
    let url = format!("https://bulk.test:{port}/bulk.bin");
    let curl = format!("curl -sk -o /dev/null -w '%{{time_total}}' {url}");
    let through = |peer: &mut Peer| -> f64 {
        let answer = peer.ask(json!({"jsonrpc": "2.0", "method": "tools/call",
            "params": {"name": "bash", "arguments": {"command": curl.clone()}}}));
        let text = answer["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .to_owned();
        text.split_whitespace()
            .next()
            .unwrap()
            .parse::<f64>()
            .unwrap_or_else(|_| panic!("curl in the unit: {text}"))
    };
    let direct = || -> f64 {
        let output = Command::new("curl")
            .args(["-sk", "-o", "/dev/null", "-w", "%{time_total}", "--resolve"])
            .arg(format!("bulk.test:{port}:127.0.0.1"))
            .arg(&url)
            .output()
            .unwrap();
        String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse::<f64>()
            .unwrap()
    };
    let (mut proxied, mut straight) = (Vec::new(), Vec::new());
    for round in 0..=rounds {
        let a = through(&mut peer);
        let b = direct();
        // Round 0 warms the page cache and the TLS code paths.
        if round > 0 {
            proxied.push(Duration::from_secs_f64(a));
            straight.push(Duration::from_secs_f64(b));
        }
    }
    drop(peer);
    let _ = server.kill();
    let _ = server.wait();
    let rate = |d: Duration| mib as f64 / d.as_secs_f64();
    println!(
        "egress, {backend}: {mib} MiB over HTTPS from inside an egress unit (its proxy port handed to the host proxy) median {:.0} MiB/s | curl on the host direct median {:.0} MiB/s | ratio {:.2} (goal >= 0.8), {rounds} rounds",
        rate(median(&proxied)),
        rate(median(&straight)),
        rate(median(&proxied)) / rate(median(&straight)),
    );
}

/// Session start of a runsc unit against a runc unit of the same profile.
fn runtime_figures(workspace: &Path) {
    let rounds = env_number("BOX_BENCH_ROUNDS", 7);
    let profiles = tempfile::tempdir().unwrap();
    for (name, runtime) in [("bench-runc", ""), ("bench-runsc", "runtime = \"runsc\"\n")] {
        std::fs::write(
            profiles.path().join(format!("{name}.toml")),
            format!(
                "description = \"runtime bench\"\nextends = \"default\"\n[workspace]\nimage = \"{IMAGE}\"\n{runtime}[security]\nlandlock = \"best-effort\"\n"
            ),
        )
        .unwrap();
    }
    let start = |profile: &str, round: usize| {
        let instance = format!("{}-runtime-{profile}-{round}", label());
        let mut command = box_serve("docker", workspace, &instance);
        command
            .arg("--profiles")
            .arg(profiles.path())
            .args(["--profile", profile]);
        let mut peer = Peer::spawn(&mut command);
        std::thread::sleep(Duration::from_millis(400));
        let started = Instant::now();
        peer.initialize();
        peer.read("small.txt");
        let elapsed = started.elapsed();
        drop(peer);
        elapsed
    };
    let (mut runc, mut runsc) = (Vec::new(), Vec::new());
    for round in 0..=rounds {
        let a = start("bench-runc", round);
        let b = start("bench-runsc", round);
        // Round 0 warms the engine's caches for both.
        if round > 0 {
            runc.push(a);
            runsc.push(b);
        }
    }
    println!(
        "runtime, docker: session start (initialize → first read result) of a runsc (gVisor) unit median {:.0} ms (min {:.0}) | the same profile under runc median {:.0} ms (min {:.0}) | ratio {:.2} (no goal), {rounds} rounds",
        ms(median(&runsc)),
        ms(percentile(&runsc, 0.0)),
        ms(median(&runc)),
        ms(percentile(&runc, 0.0)),
        ms(median(&runsc)) / ms(median(&runc)),
    );
}

/// The local session start, from an idle `box serve` and from its spawn,
/// against an unsandboxed `box execute` from its spawn, interleaved round by
/// round; with `BOX_BENCH_BEFORE=PATH`, the same figures of another `box`
/// binary (an earlier build) in the same rounds.
fn local_start_figures(workspace: &Path) {
    const ROUNDS: usize = 21;
    let before = std::env::var_os("BOX_BENCH_BEFORE").map(PathBuf::from);
    let mut binaries = vec![("this build", PathBuf::from(BOX))];
    if let Some(before) = before {
        binaries.push(("BOX_BENCH_BEFORE", before));
    }
    let mut idle = vec![Vec::new(); binaries.len()];
    let mut spawned = vec![Vec::new(); binaries.len()];
    let mut spawned_cpu = vec![Vec::new(); binaries.len()];
    let (mut raw, mut raw_cpu) = (Vec::new(), Vec::new());
    for round in 0..=ROUNDS {
        let (b, b_cpu) = with_cpu(|| unsandboxed_start(workspace));
        let mut a = Vec::new();
        for (index, (_, box_exe)) in binaries.iter().enumerate() {
            let instance = format!("{}-lstart-{round}-{index}", label());
            let from_idle = box_start_of(box_exe, "local", workspace, &instance);
            let (from_spawn, cpu) = with_cpu(|| {
                box_start_from_spawn(box_exe, "local", workspace, &format!("{instance}-s"))
            });
            a.push((index, from_idle, from_spawn, cpu));
        }
        // Round 0 warms the page cache (and box's own caches on disk) for all.
        if round > 0 {
            raw.push(b);
            raw_cpu.push(b_cpu);
            for (index, from_idle, from_spawn, cpu) in a {
                idle[index].push(from_idle);
                spawned[index].push(from_spawn);
                spawned_cpu[index].push(cpu);
            }
        }
    }
    let base = median(&raw);
    let base_cpu = median(&raw_cpu);
    println!(
        "start, local: baseline spawn unsandboxed `box execute` + initialize + same read: median {:.1} ms (min {:.1}), CPU {:.1} ms, {ROUNDS} rounds",
        ms(base),
        ms(percentile(&raw, 0.0)),
        ms(base_cpu),
    );
    for (index, (name, box_exe)) in binaries.iter().enumerate() {
        println!(
            "start, local, {name} ({}): box serve idle, initialize → first read result median {:.1} ms (min {:.1}), ratio {:.2} | box serve spawned → first read result median {:.1} ms (min {:.1}), ratio {:.2} (goal <= 2); CPU of the whole process tree {:.1} ms, ratio {:.2}",
            box_exe.display(),
            ms(median(&idle[index])),
            ms(percentile(&idle[index], 0.0)),
            ms(median(&idle[index])) / ms(base),
            ms(median(&spawned[index])),
            ms(percentile(&spawned[index], 0.0)),
            ms(median(&spawned[index])) / ms(base),
            ms(median(&spawned_cpu[index])),
            ms(median(&spawned_cpu[index])) / ms(base_cpu),
        );
    }
}

/// What `run` took, and the CPU time (user and system) of the children it
/// started and reaped meanwhile: on a loaded machine a handoff between
/// processes waits for a core, which the CPU time does not count.
fn with_cpu(run: impl FnOnce() -> Duration) -> (Duration, Duration) {
    let cpu = || {
        nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
            .map(|usage| {
                let time = |value: nix::sys::time::TimeVal| {
                    Duration::new(
                        u64::try_from(value.tv_sec()).unwrap_or(0),
                        u32::try_from(value.tv_usec()).unwrap_or(0) * 1000,
                    )
                };
                time(usage.user_time()) + time(usage.system_time())
            })
            .unwrap_or_default()
    };
    let before = cpu();
    let elapsed = run();
    (elapsed, cpu().saturating_sub(before))
}

// ---------------------------------------------------------------- call, batch

/// `box serve` over stdio on the docker backend, and a second executor in
/// the same unit reached with `docker exec -i`.
struct Pair {
    serve: Peer,
    direct: Peer,
    container: String,
}

fn docker_pair(workspace: &Path, instance: &str) -> Pair {
    let mut serve = Peer::spawn(&mut box_serve("docker", workspace, instance));
    serve.initialize();
    let container = the_unit_of(instance);
    let argv = docker_exec_argv(&container);
    let mut direct = Peer::spawn(Command::new(&argv[0]).args(&argv[1..]));
    direct.initialize();
    Pair {
        serve,
        direct,
        container,
    }
}

fn call_figures(runtime: &tokio::runtime::Runtime, workspace: &Path) {
    let calls = env_number("BOX_BENCH_CALLS", 1000);
    let instance = format!("{}-call", label());
    let mut pair = docker_pair(workspace, &instance);
    for _ in 0..50 {
        pair.serve.read("small.txt");
        pair.direct.read("small.txt");
    }
    let (mut ours, mut direct) = (Vec::new(), Vec::new());
    // Interleaved blocks, so drift on the shared machine hits both alike.
    for _ in 0..calls / 50 {
        for _ in 0..50 {
            let started = Instant::now();
            pair.serve.read("small.txt");
            ours.push(started.elapsed());
        }
        for _ in 0..50 {
            let started = Instant::now();
            pair.direct.read("small.txt");
            direct.push(started.elapsed());
        }
    }
    let (o50, o99) = (percentile(&ours, 0.5), percentile(&ours, 0.99));
    let (d50, d99) = (percentile(&direct, 0.5), percentile(&direct, 0.99));
    println!(
        "call, stdio, docker: {calls} tools/call read of a 20-line file through box serve p50={:.0}us p99={:.0}us | `docker exec -i UNIT box execute` direct p50={:.0}us p99={:.0}us | ratio p50={:.2} p99={:.2} (goal <= 1.15) | added p50={:.0}us",
        micros(o50),
        micros(o99),
        micros(d50),
        micros(d99),
        micros(o50) / micros(d50),
        micros(o99) / micros(d99),
        micros(o50) - micros(d50),
    );
    http_call_figures(runtime, workspace, &pair.container);
    drop(pair);
    let left = containers(&format!("label=box.instance={instance}"));
    assert!(left.is_empty(), "units left by {instance}: {left:?}");
}

/// Per-call through this build's `box serve` against `BOX_BENCH_BEFORE`'s,
/// on `backend`: one session each, interleaved blocks of the same read, so a
/// restructuring's cost per call shows as a ratio of the same run.
fn before_call_figures(backend: &str, workspace: &Path, before: &Path) {
    let calls = env_number("BOX_BENCH_CALLS", 1000);
    let mut peers: Vec<(&str, Peer)> =
        [("this build", Path::new(BOX)), ("BOX_BENCH_BEFORE", before)]
            .into_iter()
            .enumerate()
            .map(|(index, (name, exe))| {
                let instance = format!("{}-bcall-{backend}-{index}", label());
                let mut peer = Peer::spawn(&mut box_serve_of(exe, backend, workspace, &instance));
                peer.initialize();
                (name, peer)
            })
            .collect();
    for (_, peer) in &mut peers {
        for _ in 0..50 {
            peer.read("small.txt");
        }
    }
    let mut times = vec![Vec::new(); peers.len()];
    for _ in 0..calls / 50 {
        for (index, (_, peer)) in peers.iter_mut().enumerate() {
            for _ in 0..50 {
                let started = Instant::now();
                peer.read("small.txt");
                times[index].push(started.elapsed());
            }
        }
    }
    let (now, then) = (&times[0], &times[1]);
    println!(
        "call, stdio, {backend}: {calls} tools/call read of a 20-line file, this build p50={:.0}us p99={:.0}us | BOX_BENCH_BEFORE p50={:.0}us p99={:.0}us | ratio p50={:.2} p99={:.2}",
        micros(percentile(now, 0.5)),
        micros(percentile(now, 0.99)),
        micros(percentile(then, 0.5)),
        micros(percentile(then, 0.99)),
        micros(percentile(now, 0.5)) / micros(percentile(then, 0.5)),
        micros(percentile(now, 0.99)) / micros(percentile(then, 0.99)),
    );
}

/// An OTLP/HTTP receiver for the tracing figures: answers every POST 200
/// and counts the requests and their bodies' bytes.
struct OtlpSink {
    address: SocketAddr,
    bodies: Arc<std::sync::atomic::AtomicU64>,
    bytes: Arc<std::sync::atomic::AtomicU64>,
}

impl OtlpSink {
    fn start() -> OtlpSink {
        use std::io::Read;
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let (bodies, bytes) = (Arc::default(), Arc::default());
        let (counted, sized): (
            Arc<std::sync::atomic::AtomicU64>,
            Arc<std::sync::atomic::AtomicU64>,
        ) = (Arc::clone(&bodies), Arc::clone(&bytes));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut seen = Vec::new();
                let mut chunk = [0u8; 16384];
                let body_at = loop {
                    let Ok(read) = stream.read(&mut chunk) else {
                        break None;
                    };
                    if read == 0 {
                        break None;
                    }
                    seen.extend_from_slice(&chunk[..read]);
                    if let Some(at) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                        break Some(at + 4);
                    }
                };
                let Some(body_at) = body_at else { continue };
                let head = String::from_utf8_lossy(&seen[..body_at]).to_ascii_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|line| line.strip_prefix("content-length:"))
                    .and_then(|value| value.trim().parse().ok())
                    .unwrap_or(0);
                while seen.len() < body_at + length {
                    match stream.read(&mut chunk) {
                        Ok(0) | Err(_) => break,
                        Ok(read) => seen.extend_from_slice(&chunk[..read]),
                    }
                }
                counted.fetch_add(1, Ordering::SeqCst);
                sized.fetch_add(length as u64, Ordering::SeqCst);
                let _ = stream.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                );
            }
        });
        OtlpSink {
            address,
            bodies,
            bytes,
        }
    }
}

/// Per-call with tracing off and on (and `BOX_BENCH_BEFORE`'s, when given),
/// on `backend`: `BOX_BENCH_TRACING_HOSTS` (default 1) sessions of each, each
/// on its own host, interleaved blocks of the same traced read, the hosts'
/// order turned by one every round. A kind's figures pool all its hosts'
/// calls: two identical hosts differ by up to ±12% at p50 on a shared
/// machine (where their tasks happen to run), which more hosts average out.
fn tracing_call_figures(backend: &str, workspace: &Path) {
    use std::sync::atomic::Ordering;
    let calls = env_number("BOX_BENCH_CALLS", 1000);
    let per_kind = env_number("BOX_BENCH_TRACING_HOSTS", 1).max(1);
    let sink = OtlpSink::start();
    let before = std::env::var_os("BOX_BENCH_BEFORE").map(PathBuf::from);
    let mut kinds: Vec<(&str, PathBuf, bool)> = vec![
        ("off", PathBuf::from(BOX), false),
        ("on", PathBuf::from(BOX), true),
    ];
    if let Some(before) = before {
        kinds.push(("before", before, false));
    }
    let mut peers: Vec<(usize, Peer)> = (0..per_kind)
        .flat_map(|copy| (0..kinds.len()).map(move |kind| (copy, kind)))
        .map(|(copy, kind)| {
            let (_, exe, traced) = &kinds[kind];
            let instance = format!("{}-tcall-{backend}-{kind}-{copy}", label());
            let mut command = box_serve_of(exe, backend, workspace, &instance);
            for variable in [
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "OTEL_SDK_DISABLED",
                "OTEL_TRACES_EXPORTER",
            ] {
                command.env_remove(variable);
            }
            if *traced {
                command.env(
                    "OTEL_EXPORTER_OTLP_ENDPOINT",
                    format!("http://{}", sink.address),
                );
            }
            let mut peer = Peer::spawn(&mut command);
            peer.initialize();
            (kind, peer)
        })
        .collect();
    let traced_read = |n: usize| {
        let mut call = read_call(0, "small.txt");
        call["params"]["_meta"] = json!({
            "traceparent": format!("00-{:032x}-{:016x}-01", 0xb0c5_u128 << 64 | n as u128, n as u64 + 1),
        });
        call
    };
    for (_, peer) in &mut peers {
        for n in 0..50 {
            peer.ask(traced_read(n));
        }
    }
    let mut times = vec![Vec::new(); peers.len()];
    for block in 0..calls / 50 {
        // Each host follows each other one in turn.
        let count = peers.len();
        for turn in 0..count {
            let index = (block + turn) % count;
            let peer = &mut peers[index].1;
            for n in 0..50 {
                let call = traced_read(block * 50 + n);
                let started = Instant::now();
                peer.ask(call);
                times[index].push(started.elapsed());
            }
        }
    }
    let pooled: Vec<Vec<Duration>> = (0..kinds.len())
        .map(|kind| {
            peers
                .iter()
                .zip(&times)
                .filter(|((of, _), _)| *of == kind)
                .flat_map(|(_, times)| times.iter().copied())
                .collect()
        })
        .collect();
    let p = |kind: usize, q: f64| micros(percentile(&pooled[kind], q));
    let mut line = format!(
        "call, stdio, {backend}, tracing: {calls} traced tools/call read of a 20-line file on each of {per_kind} host(s) a kind"
    );
    for (kind, (name, _, _)) in kinds.iter().enumerate() {
        let hosts: Vec<String> = peers
            .iter()
            .zip(&times)
            .filter(|((of, _), _)| *of == kind)
            .map(|(_, times)| format!("{:.0}", micros(percentile(times, 0.5))))
            .collect();
        line.push_str(&format!(
            " | {name} p50={:.0}us p99={:.0}us (hosts' p50 {})",
            p(kind, 0.5),
            p(kind, 0.99),
            hosts.join("/")
        ));
    }
    line.push_str(&format!(
        " | on/off p50={:.3} p99={:.3} (goal <= 1.10)",
        p(1, 0.5) / p(0, 0.5),
        p(1, 0.99) / p(0, 0.99)
    ));
    if kinds.len() > 2 {
        line.push_str(&format!(
            " | off/before p50={:.3} p99={:.3} (goal <= 1.01)",
            p(0, 0.5) / p(2, 0.5),
            p(0, 0.99) / p(2, 0.99)
        ));
    }
    // The last batch is exported when its host ends.
    drop(peers);
    line.push_str(&format!(
        " | exported {} requests, {} bytes",
        sink.bodies.load(Ordering::SeqCst),
        sink.bytes.load(Ordering::SeqCst)
    ));
    println!("{line}");
}

fn mcp_proxy() -> Option<PathBuf> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv-mcp-proxy/bin/mcp-proxy");
    path.exists().then_some(path)
}

/// Per-call over HTTP: box serve --listen (docker) vs mcp-proxy in front of
/// `docker exec -i` into the same unit as the stdio figure.
fn http_call_figures(runtime: &tokio::runtime::Runtime, workspace: &Path, container: &str) {
    const CALLS: usize = 300;
    let Some(proxy) = mcp_proxy() else {
        eprintln!(
            "call, http: SKIPPED the mcp-proxy comparison: no .venv-mcp-proxy (python3 -m venv .venv-mcp-proxy && .venv-mcp-proxy/bin/pip install mcp-proxy==0.13.0)"
        );
        return;
    };
    let instance = format!("{}-hcall", label());
    let ours_address = free_address();
    let _serve = Server::spawn(
        box_serve("docker", workspace, &instance)
            .arg("--listen")
            .arg(ours_address.to_string()),
    );
    let proxy_address = free_address();
    let argv = docker_exec_argv(container);
    let _proxy = Server::spawn(
        Command::new(proxy)
            .args(["--host", "127.0.0.1", "--port"])
            .arg(proxy_address.port().to_string())
            .args(["--log-level", "WARNING", "--"])
            .args(&argv),
    );
    runtime.block_on(async {
        wait_listening(ours_address).await;
        wait_listening(proxy_address).await;
        let ours_session = http_initialize(ours_address).await;
        let proxy_session = http_initialize(proxy_address).await;
        for _ in 0..20 {
            http_read(ours_address, &ours_session, 1).await;
            http_read(proxy_address, &proxy_session, 1).await;
        }
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for round in 0..CALLS / 25 {
            for n in 0..25 {
                let id = (round * 25 + n) as u64 + 10;
                let started = Instant::now();
                http_read(ours_address, &ours_session, id).await;
                ours.push(started.elapsed());
                let started = Instant::now();
                http_read(proxy_address, &proxy_session, id).await;
                theirs.push(started.elapsed());
            }
        }
        let (o50, o99) = (percentile(&ours, 0.5), percentile(&ours, 0.99));
        let (t50, t99) = (percentile(&theirs, 0.5), percentile(&theirs, 0.99));
        println!(
            "call, http, docker: {CALLS} tools/call read through box serve --listen p50={:.0}us p99={:.0}us | mcp-proxy 0.13.0 (Python) in front of `docker exec -i UNIT box execute` p50={:.0}us p99={:.0}us | ratio p50={:.2} p99={:.2}",
            micros(o50),
            micros(o99),
            micros(t50),
            micros(t99),
            micros(o50) / micros(t50),
            micros(o99) / micros(t99),
        );
        http_delete(ours_address, &ours_session).await;
    });
}

fn batch_figures(workspace: &Path) {
    const ROUNDS: usize = 200;
    let instance = format!("{}-batch", label());
    let mut pair = docker_pair(workspace, &instance);
    let run = |peer: &mut Peer| -> (Duration, Duration) {
        let (mut batch, mut sequential) = (Vec::new(), Vec::new());
        for round in 0..ROUNDS + ROUNDS / 10 {
            let started = Instant::now();
            let answer = peer.ask(batch_call(0));
            let b = started.elapsed();
            assert_eq!(
                answer
                    .pointer("/result/results")
                    .and_then(Value::as_array)
                    .map(Vec::len),
                Some(8),
                "{answer}"
            );
            let started = Instant::now();
            for n in 0..8 {
                peer.read(&format!("f{n}.txt"));
            }
            let s = started.elapsed();
            if round >= ROUNDS / 10 {
                batch.push(b);
                sequential.push(s);
            }
        }
        (median(&batch), median(&sequential))
    };
    let (sb, ss) = run(&mut pair.serve);
    let (db, ds) = run(&mut pair.direct);
    println!(
        "batch, docker, through box serve (stdio): one execution/batch of 8 reads median {:.0}us | 8 sequential tools/call reads {:.0}us | ratio {:.2} (goal <= 0.4)",
        micros(sb),
        micros(ss),
        micros(sb) / micros(ss),
    );
    println!(
        "batch, docker, through `docker exec -i` direct: one execution/batch of 8 reads median {:.0}us | 8 sequential tools/call reads {:.0}us | ratio {:.2} (goal <= 0.4)",
        micros(db),
        micros(ds),
        micros(db) / micros(ds),
    );
    drop(pair);
}

// ---------------------------------------------------------------- http

/// A server process killed (SIGTERM, then SIGKILL) on drop.
struct Server {
    child: Child,
}

impl Server {
    fn spawn(command: &mut Command) -> Server {
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {command:?}: {e}"));
        Server { child }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid, which it still is (not reaped).
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
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

fn free_address() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

async fn wait_listening(address: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(address).await.is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {address}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One raw HTTP/1.1 exchange (a connection each); the status, session id, body.
async fn http(
    address: SocketAddr,
    method: &str,
    path: &str,
    session: Option<&str>,
    body: &str,
) -> (u16, Option<String>, String) {
    let mut stream = TcpStream::connect(address).await.unwrap();
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\n",
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
    let session = head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("mcp-session-id")
            .then(|| value.trim().to_owned())
    });
    (status, session, body.to_owned())
}

async fn http_initialize(address: SocketAddr) -> String {
    let (status, session, body) = http(
        address,
        "POST",
        "/mcp",
        None,
        &initialize_message(0).to_string(),
    )
    .await;
    assert_eq!(status, 200, "initialize at {address}: {body}");
    let session = session.expect("a session id");
    let (status, _, body) = http(
        address,
        "POST",
        "/mcp",
        Some(&session),
        &initialized().to_string(),
    )
    .await;
    assert!(
        status == 202 || status == 200,
        "initialized at {address}: {status} {body}"
    );
    session
}

async fn http_read(address: SocketAddr, session: &str, id: u64) {
    let (status, _, body) = http(
        address,
        "POST",
        "/mcp",
        Some(session),
        &read_call(id, "small.txt").to_string(),
    )
    .await;
    assert_eq!(status, 200, "read at {address}: {body}");
    assert!(
        body.contains("\"result\"") && !body.contains("\"isError\":true"),
        "read at {address}: {body}"
    );
}

async fn http_delete(address: SocketAddr, session: &str) {
    let (status, _, body) = http(address, "DELETE", "/mcp", Some(session), "").await;
    assert!(status == 200 || status == 204, "DELETE: {status} {body}");
}

/// VmRSS and VmHWM of `pid`, KiB.
fn memory_of(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|line| line.starts_with(name))
            .and_then(|line| line.split_whitespace().nth(1))
            .and_then(|kib| kib.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// The direct children of `pid` (a local unit is one `box sandbox` child).
fn children_of(pid: u32) -> usize {
    std::fs::read_dir("/proc")
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|entry| std::fs::read_to_string(entry.path().join("stat")).ok())
                .filter(|stat| {
                    // ppid is the 2nd field after the parenthesised comm.
                    stat.rsplit_once(')')
                        .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                        .and_then(|ppid| ppid.parse::<u32>().ok())
                        == Some(pid)
                })
                .count()
        })
        .unwrap_or(0)
}

fn units_of(backend: &str, instance: &str, serve: u32) -> usize {
    match backend {
        "docker" => containers(&format!("label=box.instance={instance}")).len(),
        _ => children_of(serve),
    }
}

/// An executor reached directly, for the concurrency baseline: `docker exec -i`
/// into a session's own unit, or a `box execute` child (local).
struct AsyncPeer {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl AsyncPeer {
    async fn spawn(argv: &[String]) -> AsyncPeer {
        let mut child = tokio::process::Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {argv:?}: {e}"));
        let stdin = child.stdin.take().unwrap();
        let lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(
            child.stdout.take().unwrap(),
        ));
        let mut peer = AsyncPeer {
            child,
            stdin,
            lines,
        };
        peer.ask(initialize_message(0)).await;
        peer.send(&initialized()).await;
        peer
    }

    async fn send(&mut self, message: &Value) {
        let mut line = serde_json::to_vec(message).unwrap();
        line.push(b'\n');
        self.stdin.write_all(&line).await.unwrap();
        self.stdin.flush().await.unwrap();
    }

    async fn ask(&mut self, message: Value) -> Value {
        let id = message["id"].clone();
        self.send(&message).await;
        loop {
            let line = self
                .lines
                .next_line()
                .await
                .unwrap()
                .expect("the peer hung up");
            let answer: Value = serde_json::from_str(&line).unwrap();
            if answer.get("id") == Some(&id) {
                assert!(answer.get("result").is_some(), "{message}: {answer}");
                return answer;
            }
        }
    }

    async fn end(mut self) {
        drop(self.stdin);
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
        let _ = self.child.kill().await;
    }
}

async fn concurrent_sessions(backend: &str, sessions: usize, workspace: &Path) {
    const CALLS: usize = 10;
    let instance = format!("{}-http-{backend}-{sessions}", label());
    let address = free_address();
    let server = Server::spawn(
        box_serve(backend, workspace, &instance)
            .arg("--listen")
            .arg(address.to_string())
            .args(["--max-sessions", &(sessions + 8).to_string()]),
    );
    let pid = server.pid();
    wait_listening(address).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (idle_rss, _) = memory_of(pid);
    // More rounds on the same host (BOX_BENCH_ROUNDS) tell memory the
    // allocator keeps from memory that grows with every round.
    let rounds = env_number("BOX_BENCH_ROUNDS", 1);
    for round in 1..=rounds {
        let step = Arc::new(tokio::sync::Barrier::new(sessions + 1));
        let started = Instant::now();
        let tasks: Vec<_> = (0..sessions)
            .map(|_| {
                let step = step.clone();
                let backend = backend.to_owned();
                let workspace = workspace.to_path_buf();
                tokio::spawn(async move {
                    let begun = Instant::now();
                    let session = http_initialize(address).await;
                    let start = begun.elapsed();
                    // 1: every session is open (the peak: the host's RSS, units live).
                    step.wait().await;
                    let argv = if backend == "docker" {
                        let unit = tokio::task::spawn_blocking({
                            let session = session.clone();
                            move || containers(&format!("label=box.session={session}"))
                        })
                        .await
                        .unwrap();
                        assert_eq!(unit.len(), 1, "one unit for session {session}");
                        docker_exec_argv(&unit[0])
                    } else {
                        let mut argv =
                            vec![BOX.to_owned(), "execute".to_owned(), "--root".to_owned()];
                        argv.push(workspace.to_string_lossy().into_owned());
                        argv
                    };
                    let mut direct = AsyncPeer::spawn(&argv).await;
                    // 2: every direct executor is up; calls through box serve, all at once.
                    step.wait().await;
                    let mut ours = Vec::with_capacity(CALLS);
                    for id in 1..=CALLS as u64 {
                        let started = Instant::now();
                        http_read(address, &session, id).await;
                        ours.push(started.elapsed());
                    }
                    // 3: the same calls straight to the executors, all at once.
                    step.wait().await;
                    let mut theirs = Vec::with_capacity(CALLS);
                    for id in 1..=CALLS as u64 {
                        let started = Instant::now();
                        direct.ask(read_call(id, "small.txt")).await;
                        theirs.push(started.elapsed());
                    }
                    direct.end().await;
                    http_delete(address, &session).await;
                    (start, ours, theirs)
                })
            })
            .collect();
        step.wait().await;
        let (peak_rss, _) = memory_of(pid);
        let live_at_peak = units_of(backend, &instance, pid);
        step.wait().await;
        step.wait().await;
        let (mut starts, mut ours, mut theirs) = (Vec::new(), Vec::new(), Vec::new());
        for task in tasks {
            let (start, calls, direct) = task.await.unwrap();
            starts.push(start);
            ours.extend(calls);
            theirs.extend(direct);
        }
        let wall = started.elapsed();
        // A DELETE answers once the session is ended; removal may trail it.
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut leaked = units_of(backend, &instance, pid);
        while leaked > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
            leaked = units_of(backend, &instance, pid);
        }
        let (end_rss, hwm) = memory_of(pid);
        let (o50, o99) = (percentile(&ours, 0.5), percentile(&ours, 0.99));
        let (t50, t99) = (percentile(&theirs, 0.5), percentile(&theirs, 0.99));
        let direct = if backend == "docker" {
            "`docker exec -i` into each session's unit"
        } else {
            "a `box execute` child per session"
        };
        println!(
            "http, {backend}, round {round}/{rounds}, {sessions} concurrent sessions x {CALLS} reads: wall {:.1}s, units live at peak {live_at_peak}, session start (initialize) p50 {:.0} ms p99 {:.0} ms | call p50={:.2}ms p99={:.2}ms | baseline, the same reads at the same concurrency straight to {direct}: p50={:.2}ms p99={:.2}ms | ratio p50={:.2} p99={:.2} | box serve VmRSS idle {} KiB, all sessions open {} KiB (+{:.0} KiB/session), after {} KiB, VmHWM {} KiB | units leaked {leaked}",
            wall.as_secs_f64(),
            ms(percentile(&starts, 0.5)),
            ms(percentile(&starts, 0.99)),
            ms(o50),
            ms(o99),
            ms(t50),
            ms(t99),
            micros(o50) / micros(t50),
            micros(o99) / micros(t99),
            idle_rss,
            peak_rss,
            peak_rss.saturating_sub(idle_rss) as f64 / sessions as f64,
            end_rss,
            hwm,
        );
        assert_eq!(live_at_peak, sessions, "one unit per session at the peak");
        assert_eq!(leaked, 0, "units leaked");
    }
    drop(server);
}

// ---------------------------------------------------------------- main

/// Counts the HTTP requests that pass through it to the engine's socket.
struct CountingEngine {
    path: PathBuf,
    requests: Arc<std::sync::atomic::AtomicU64>,
    _dir: tempfile::TempDir,
}

impl CountingEngine {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("docker.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let requests = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counter = requests.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { break };
                let Ok(engine) = std::os::unix::net::UnixStream::connect("/var/run/docker.sock")
                else {
                    continue;
                };
                let (mut from_client, mut to_engine) =
                    (client.try_clone().unwrap(), engine.try_clone().unwrap());
                let counter = counter.clone();
                std::thread::spawn(move || {
                    use std::io::Read as _;
                    let mut buffer = vec![0_u8; 64 << 10];
                    while let Ok(count) = from_client.read(&mut buffer) {
                        if count == 0 {
                            break;
                        }
                        // A request line ends in " HTTP/1.1": count those.
                        let seen = buffer[..count]
                            .windows(11)
                            .filter(|w| w == b" HTTP/1.1\r\n")
                            .count();
                        counter.fetch_add(seen as u64, std::sync::atomic::Ordering::SeqCst);
                        if to_engine.write_all(&buffer[..count]).is_err() {
                            break;
                        }
                    }
                    let _ = to_engine.shutdown(std::net::Shutdown::Write);
                });
                let (mut from_engine, mut to_client) = (engine, client);
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from_engine, &mut to_client);
                    let _ = to_client.shutdown(std::net::Shutdown::Write);
                });
            }
        });
        Self {
            path,
            requests,
            _dir: dir,
        }
    }

    fn docker_host(&self) -> String {
        format!("unix://{}", self.path.display())
    }

    fn requests(&self) -> u64 {
        self.requests.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// The CPU time (user + system) of process `pid` so far.
fn cpu_of(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    // utime and stime are fields 14 and 15 (1-based), 11 and 12 after the comm.
    let ticks: u64 = fields
        .get(11..13)
        .map(|both| both.iter().filter_map(|t| t.parse::<u64>().ok()).sum())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

/// The processes whose parent is `pid`.
fn child_pids(pid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|entry| {
                    let child = entry.file_name().to_str()?.parse::<u32>().ok()?;
                    let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
                    let ppid = stat
                        .rsplit_once(')')
                        .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                        .and_then(|ppid| ppid.parse::<u32>().ok())?;
                    (ppid == pid).then_some(child)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The processes that hold the units' leases: each docker unit's init (its
/// container's first process), each local unit's sandbox helper (a child of
/// `box serve`).
fn lease_holders(backend: &str, instance: &str, serve: u32) -> Vec<u32> {
    if backend != "docker" {
        return child_pids(serve);
    }
    let ids = containers(&format!("label=box.instance={instance}"));
    if ids.is_empty() {
        return Vec::new();
    }
    let output = Command::new("docker")
        .args(["inspect", "-f", "{{.State.Pid}}"])
        .args(&ids)
        .output()
        .unwrap();
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|pid| pid.trim().parse().ok())
        .collect()
}

/// An idle `box serve --listen` (`BOX_BENCH_LEASE_BACKENDS`, default
/// `docker,local`) with N sessions (`BOX_BENCH_LEASE_UNITS`, default 200;
/// one unit each) whose lease is `BOX_BENCH_LEASE` (default 3s, renewed
/// every second): over an idle window (`BOX_BENCH_LEASE_WINDOW_S`, default
/// 60), before the sessions (the idle host) and with them (the renewals),
/// `box serve`'s CPU, the lease holders' CPU (docker: the units' inits;
/// local: the sandbox helpers) and, for docker, the engine calls, counted by
/// a proxy in front of the engine's socket. With `BOX_BENCH_BEFORE`, the
/// same figures are taken first for that binary (`box_exe`, named `build`).
async fn lease_figures(backend: &str, workspace: &Path, (box_exe, build): (&Path, &str)) {
    let units = env_number("BOX_BENCH_LEASE_UNITS", 200);
    let window = Duration::from_secs(env_number("BOX_BENCH_LEASE_WINDOW_S", 60) as u64);
    let lease = std::env::var("BOX_BENCH_LEASE").unwrap_or_else(|_| "3s".to_owned());
    let profiles = tempfile::tempdir().unwrap();
    std::fs::write(
        profiles.path().join("lease.toml"),
        format!("extends = \"default\"\n\n[lifecycle]\nlease = \"{lease}\"\n"),
    )
    .unwrap();
    let engine = CountingEngine::start();
    let instance = format!("{}-lease-{backend}", label());
    let address = free_address();
    let server = Server::spawn(
        box_serve_of(box_exe, backend, workspace, &instance)
            .arg("--listen")
            .arg(address.to_string())
            .args(["--max-sessions", &(units + 8).to_string()])
            .arg("--profiles")
            .arg(profiles.path())
            .args(["--profile", "lease"])
            .env("DOCKER_HOST", engine.docker_host()),
    );
    let pid = server.pid();
    wait_listening(address).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let measure = |what: &str| {
        let holders = lease_holders(backend, &instance, pid);
        let held = |holders: &[u32]| holders.iter().map(|pid| cpu_of(*pid)).sum::<Duration>();
        let (cpu, calls, held_cpu) = (cpu_of(pid), engine.requests(), held(&holders));
        std::thread::sleep(window);
        let (cpu, calls, held_cpu) = (
            cpu_of(pid) - cpu,
            engine.requests() - calls,
            held(&holders).saturating_sub(held_cpu),
        );
        let per_minute = 60.0 / window.as_secs_f64();
        println!(
            "lease, {backend}, {build}, {what}: box serve CPU {:.3} s/min, lease holders' CPU {:.3} s/min ({} of them), engine calls {:.1}/min ({:.0} s window)",
            cpu.as_secs_f64() * per_minute,
            held_cpu.as_secs_f64() * per_minute,
            holders.len(),
            calls as f64 * per_minute,
            window.as_secs_f64(),
        );
    };
    tokio::task::block_in_place(|| measure("idle host, no units"));
    let mut sessions = Vec::new();
    let started = Instant::now();
    for _ in 0..units {
        sessions.push(http_initialize(address).await);
    }
    println!(
        "lease, {backend}, {build}: {units} sessions started one after another in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(
        units_of(backend, &instance, pid),
        units,
        "every session's unit runs"
    );
    // Let the starts' own engine traffic settle.
    tokio::time::sleep(Duration::from_secs(2)).await;
    tokio::task::block_in_place(|| {
        measure(&format!(
            "{units} idle units, lease {lease} (renewed every third of it)"
        ))
    });
    assert_eq!(
        units_of(backend, &instance, pid),
        units,
        "renewed units outlive the window"
    );
    for session in &sessions {
        http_delete(address, session).await;
    }
    drop(server);
}

fn main() {
    let wanted: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let wants = |figure: &str| wanted.is_empty() || wanted.iter().any(|w| w == figure);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let _sweep = DockerSweep;
    let docker = runtime.block_on(async {
        let docker = Docker::connect_with_local_defaults().ok()?;
        docker.inspect_image(IMAGE).await.ok()?;
        Some(docker)
    });
    if docker.is_none() {
        eprintln!(
            "serve_units: NO DOCKER ENGINE or no {IMAGE} (scripts/images.sh): the docker figures are SKIPPED"
        );
    }
    let workspace = workspace();
    if wants("start") {
        start_figures(&runtime, workspace.path(), docker.as_ref());
    }
    if docker.is_some() && wants("call") {
        call_figures(&runtime, workspace.path());
    }
    // `-- before-call`: only with BOX_BENCH_BEFORE (a restructuring's cost).
    if let Some(before) = std::env::var_os("BOX_BENCH_BEFORE").map(PathBuf::from)
        && wanted.iter().any(|w| w == "before-call")
    {
        before_call_figures("local", workspace.path(), &before);
        if docker.is_some() {
            before_call_figures("docker", workspace.path(), &before);
        }
    }
    if wants("tracing") {
        tracing_call_figures("local", workspace.path());
        if docker.is_some() {
            tracing_call_figures("docker", workspace.path());
        }
    }
    if docker.is_some() && wants("batch") {
        batch_figures(workspace.path());
    }
    if wants("egress") {
        egress_figures("local");
        if docker.is_some() {
            egress_figures("docker");
        }
    }
    if wanted.iter().any(|w| w == "lease") {
        let backends =
            std::env::var("BOX_BENCH_LEASE_BACKENDS").unwrap_or_else(|_| "docker,local".to_owned());
        for backend in backends.split(',') {
            if backend == "docker" && docker.is_none() {
                continue;
            }
            if let Some(before) = std::env::var_os("BOX_BENCH_BEFORE").map(PathBuf::from) {
                runtime.block_on(lease_figures(
                    backend,
                    workspace.path(),
                    (&before, "before"),
                ));
            }
            runtime.block_on(lease_figures(
                backend,
                workspace.path(),
                (Path::new(BOX), "this build"),
            ));
        }
    }
    if wants("warm") {
        let backends =
            std::env::var("BOX_BENCH_WARM_BACKENDS").unwrap_or_else(|_| "docker,local".to_owned());
        for backend in backends.split(',') {
            if backend == "docker" && docker.is_none() {
                continue;
            }
            runtime.block_on(warm_figures(backend, workspace.path()));
        }
    }
    if wanted.iter().any(|w| w == "warmfork") {
        let backends =
            std::env::var("BOX_BENCH_WARM_BACKENDS").unwrap_or_else(|_| "docker,local".to_owned());
        for backend in backends.split(',') {
            if backend == "docker" && docker.is_none() {
                continue;
            }
            runtime.block_on(warm_fork_figures(backend));
        }
    }
    if wanted.iter().any(|w| w == "runhost") {
        let backends =
            std::env::var("BOX_BENCH_WARM_BACKENDS").unwrap_or_else(|_| "docker,local".to_owned());
        for backend in backends.split(',') {
            if backend == "docker" && docker.is_none() {
                continue;
            }
            runtime.block_on(run_host_figures(backend, workspace.path()));
        }
    }
    if docker.is_some() && wants("runtime") {
        runtime_figures(workspace.path());
    }
    if wants("http") {
        let plan = std::env::var("BOX_BENCH_HTTP")
            .unwrap_or_else(|_| "docker:50,local:50,local:200".to_owned());
        for run in plan.split(',') {
            let Some((backend, count)) = run.trim().split_once(':') else {
                continue;
            };
            if backend == "docker" && docker.is_none() {
                continue;
            }
            let count: usize = count.parse().expect("BOX_BENCH_HTTP: backend:count,…");
            runtime.block_on(concurrent_sessions(backend, count, workspace.path()));
        }
    }
}

/// `box serve --listen` on `backend`, with `--pool default=N` when `pool` is given.
async fn warm_host(
    backend: &str,
    workspace: &Path,
    name: &str,
    pool: Option<usize>,
) -> (Server, SocketAddr) {
    let address = free_address();
    let instance = format!("{}-warm-{backend}-{name}", label());
    let mut command = box_serve(backend, workspace, &instance);
    command.args(["--state", "none", "--listen", &address.to_string()]);
    if let Some(size) = pool {
        command.args(["--pool", &format!("default={size}")]);
    }
    let server = Server::spawn(&mut command);
    wait_listening(address).await;
    (server, address)
}

/// The pool's ready units, from `/metrics`.
async fn pool_ready(address: SocketAddr, profile: &str) -> usize {
    let (_, _, body) = http(address, "GET", "/metrics", None, "").await;
    let line = format!("box_pool_ready{{profile=\"{profile}\"}} ");
    body.lines()
        .find_map(|text| text.strip_prefix(&line))
        .and_then(|count| count.trim().parse().ok())
        .unwrap_or(0)
}

/// Wait until the pool of `profile` holds `ready` units; how long that took.
async fn pool_filled(address: SocketAddr, profile: &str, ready: usize) -> Duration {
    let started = Instant::now();
    while pool_ready(address, profile).await < ready {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "the pool at {address} never held {ready}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    started.elapsed()
}

/// initialize → first read result over HTTP, then the session deleted.
async fn http_session_start(address: SocketAddr) -> Duration {
    let started = Instant::now();
    let session = http_initialize(address).await;
    http_read(address, &session, 1).await;
    let elapsed = started.elapsed();
    http_delete(address, &session).await;
    elapsed
}

/// Each of `sessions` started at once; their start times.
async fn concurrent_starts(address: SocketAddr, sessions: usize) -> Vec<Duration> {
    let starts = (0..sessions).map(|_| tokio::spawn(http_session_start(address)));
    futures::future::join_all(starts)
        .await
        .into_iter()
        .map(|start| start.unwrap())
        .collect()
}

/// Session starts ([`http_session_start`]) on `warm`, a host whose pool of
/// the profile named holds 2 units, and on `cold`, alternating for `rounds`
/// rounds: the warm starts and the cold ones. A claim's refill must not run
/// during the next cold figure, nor the warm one find the pool empty: each
/// waits for a full pool. Round 0 warms the engine's and the page cache for
/// both and is not counted.
async fn interleaved_starts(
    (warm, profile): (SocketAddr, &str),
    cold: SocketAddr,
    rounds: usize,
) -> (Vec<Duration>, Vec<Duration>) {
    let (mut warm_starts, mut cold_starts) = (Vec::new(), Vec::new());
    for round in 0..=rounds {
        pool_filled(warm, profile, 2).await;
        let w = http_session_start(warm).await;
        pool_filled(warm, profile, 2).await;
        let c = http_session_start(cold).await;
        if round > 0 {
            warm_starts.push(w);
            cold_starts.push(c);
        }
    }
    (warm_starts, cold_starts)
}

/// Warm starts against cold ones, as the `warm` and `warmfork` lines say
/// them: each one's median and p99, then their ratios, each followed by its
/// entry of `goals`.
fn warm_against_cold(warm: &[Duration], cold: &[Duration], goals: [&str; 2]) -> String {
    let ratio = |p: f64| ms(percentile(warm, p)) / ms(percentile(cold, p));
    format!(
        "claiming a pooled unit median {:.1} ms, p99 {:.1} ms | a cold start of the same plan median {:.1} ms, p99 {:.1} ms | ratio median {:.2}{}, p99 {:.2}{}",
        ms(median(warm)),
        ms(percentile(warm, 0.99)),
        ms(median(cold)),
        ms(percentile(cold, 0.99)),
        ratio(0.5),
        goals[0],
        ratio(0.99),
        goals[1],
    )
}

/// VmRSS in KiB of `pid` and every process below it (a local unit: its
/// helper, init and executor).
fn tree_rss(pid: u32) -> u64 {
    memory_of(pid).0 + child_pids(pid).into_iter().map(tree_rss).sum::<u64>()
}

/// `box run ARGS true` spawned and waited for: how long it took; a failure
/// stops the bench.
fn box_run_once(args: &[String]) -> Duration {
    let started = Instant::now();
    let status = Command::new(BOX)
        .arg("run")
        .args(args)
        .arg("true")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .status()
        .expect("spawning box run");
    let elapsed = started.elapsed();
    assert!(status.success(), "box run {args:?} true: {status}");
    elapsed
}

async fn run_host_figures(backend: &str, workspace: &Path) {
    let rounds = env_number("BOX_BENCH_ROUNDS", 21);
    let (_warm_server, warm) = warm_host(backend, workspace, "runwarm", Some(2)).await;
    let (_cold_server, cold) = warm_host(backend, workspace, "runcold", None).await;
    let host = |address: SocketAddr| vec!["--host".to_owned(), format!("http://{address}")];
    let own = vec![
        "--backend".to_owned(),
        backend.to_owned(),
        "--workspace".to_owned(),
        workspace.display().to_string(),
    ];
    let (mut warm_runs, mut cold_runs, mut own_runs) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..=rounds {
        // Each figure with the pool full and no refill running beside it.
        pool_filled(warm, "default", 2).await;
        let w = box_run_once(&host(warm));
        pool_filled(warm, "default", 2).await;
        let c = box_run_once(&host(cold));
        let o = box_run_once(&own);
        // Round 0 warms the page cache and the engine's for all three.
        if round > 0 {
            warm_runs.push(w);
            cold_runs.push(c);
            own_runs.push(o);
        }
    }
    let figure = |runs: &[Duration]| {
        format!(
            "median {:.1} ms, p99 {:.1} ms",
            ms(median(runs)),
            ms(percentile(runs, 0.99))
        )
    };
    println!(
        "runhost, {backend}: `box run … true`, spawn → exit ({rounds} rounds): --host, a pooled unit: {} | --host, no pool (cold on the host): {} | a host of its own (--backend {backend}): {} | ratio warm/own median {:.2}, warm/host-cold median {:.2}",
        figure(&warm_runs),
        figure(&cold_runs),
        figure(&own_runs),
        ms(median(&warm_runs)) / ms(median(&own_runs)),
        ms(median(&warm_runs)) / ms(median(&cold_runs)),
    );
}

/// `warmfork`: session start (initialize → first read result, HTTP) of a
/// `source = "fork"` profile on a git repository of
/// `BOX_BENCH_FORK_FILES` files (default 200, committed): a pooled unit
/// claimed and the fork made into its directory, against a cold start
/// (the fork made, then the unit started), alternating round by round.
async fn warm_fork_figures(backend: &str) {
    let rounds = env_number("BOX_BENCH_ROUNDS", 21);
    let files = env_number("BOX_BENCH_FORK_FILES", 200);
    let project = tempfile::tempdir().unwrap();
    for n in 0..files {
        let dir = project.path().join(format!("d{}", n / 100));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join(format!("f{n}.txt")),
            format!("file {n}\n").repeat(20),
        )
        .unwrap();
    }
    std::fs::write(project.path().join("small.txt"), "small\n").unwrap();
    repository::commit_all(project.path());
    let mode = std::env::var("BOX_BENCH_FORK_MODE").unwrap_or_else(|_| "auto".to_owned());
    let profiles = tempfile::tempdir().unwrap();
    std::fs::write(
        profiles.path().join("forked.toml"),
        format!("description = \"bench: each session on its own fork\"\nextends = \"default\"\n\n[workspace]\nsource = \"fork\"\nfork_mode = \"{mode}\"\n"),
    )
    .unwrap();
    let state = tempfile::tempdir().unwrap();
    let host = |name: &str, pool: bool| {
        let address = free_address();
        let instance = format!("{}-warmfork-{backend}-{name}", label());
        let mut command = box_serve(backend, project.path(), &instance);
        command
            .args(["--state", "none", "--listen", &address.to_string()])
            .args(["--profile", "forked", "--profiles"])
            .arg(profiles.path())
            .env("XDG_STATE_HOME", state.path());
        if pool {
            command.args(["--pool", "forked=2"]);
        }
        (Server::spawn(&mut command), address)
    };
    let (_warm_server, warm) = host("pooled", true);
    let (_cold_server, cold) = host("cold", false);
    wait_listening(warm).await;
    wait_listening(cold).await;
    let (warm_starts, cold_starts) = interleaved_starts((warm, "forked"), cold, rounds).await;
    println!(
        "warmfork, {backend}: session start of a source = \"fork\" profile (fork_mode {mode}, {files} files, a git repository; initialize → first read result, HTTP) {}, {rounds} rounds",
        warm_against_cold(&warm_starts, &cold_starts, ["", ""]),
    );
}

async fn warm_figures(backend: &str, workspace: &Path) {
    let rounds = env_number("BOX_BENCH_ROUNDS", 21);
    let concurrent = env_number("BOX_BENCH_WARM_CONCURRENT", 20);
    let (warm_server, warm) = warm_host(backend, workspace, "pooled", Some(2)).await;
    let (_cold_server, cold) = warm_host(backend, workspace, "cold", None).await;
    let (warm_starts, cold_starts) = interleaved_starts((warm, "default"), cold, rounds).await;
    println!(
        "warm, {backend}: session start (initialize → first read result, HTTP) {}, {rounds} rounds",
        warm_against_cold(
            &warm_starts,
            &cold_starts,
            [" (goal ≤ 0.10)", " (goal ≤ 0.20)"]
        ),
    );
    // What an idle pooled unit costs: the engine's (the unit's cgroup
    // memory; local: the VmRSS of its helper, init and executor, shared
    // pages of the binary counted in each) and the host's (box serve's
    // memory per pooled unit).
    let pooled = if backend == "docker" {
        containers("label=box.pool=default")
    } else {
        Vec::new()
    };
    let mut usage: Vec<u64> = pooled
        .iter()
        .filter_map(|id| {
            let out = Command::new("docker")
                .args(["stats", "--no-stream", "--format", "{{.MemUsage}}", id])
                .output()
                .ok()?;
            let text = String::from_utf8_lossy(&out.stdout);
            let used = text.split('/').next()?.trim().to_owned();
            parse_docker_size(&used)
        })
        .collect();
    if backend != "docker" {
        usage = child_pids(warm_server.pid())
            .into_iter()
            .map(|helper| tree_rss(helper) * 1024)
            .collect();
    }
    let (rss_with, _) = memory_of(warm_server.pid());
    drop(warm_server);
    // Refill from empty, and `concurrent` claims at once on a pool that size.
    let (pool_server, pool) = warm_host(backend, workspace, "concurrent", Some(concurrent)).await;
    let (rss_empty, _) = memory_of(pool_server.pid());
    let filled = pool_filled(pool, "default", concurrent).await;
    let (rss_full, _) = memory_of(pool_server.pid());
    let together = concurrent_starts(pool, concurrent).await;
    drop(pool_server);
    let cold_together = concurrent_starts(cold, concurrent).await;
    println!(
        "warm, {backend}: {concurrent} sessions at once, each claiming a pooled unit: median {:.1} ms, p99 {:.1} ms | {concurrent} cold starts at once median {:.1} ms, p99 {:.1} ms | ratio median {:.2} (goal ≤ 0.15)",
        ms(median(&together)),
        ms(percentile(&together, 0.99)),
        ms(median(&cold_together)),
        ms(percentile(&cold_together, 0.99)),
        ms(median(&together)) / ms(median(&cold_together)),
    );
    println!(
        "warm, {backend}: refill from empty {concurrent} units in {:.2} s ({:.1} units/s, one start at a time) | an idle pooled unit: unit memory median {:.1} MiB (docker stats, or local VmRSS of its processes; {} units) | box serve VmRSS {} KiB with a pool of {concurrent} ready vs {} KiB empty ({:.0} KiB a unit; {} KiB with a pool of 2)",
        filled.as_secs_f64(),
        concurrent as f64 / filled.as_secs_f64(),
        median_u64(&usage) as f64 / (1024.0 * 1024.0),
        usage.len(),
        rss_full,
        rss_empty,
        (rss_full.saturating_sub(rss_empty)) as f64 / concurrent as f64,
        rss_with,
    );
}

/// `12.3MiB` (docker stats) in bytes.
fn parse_docker_size(text: &str) -> Option<u64> {
    let split = text.find(|c: char| c.is_ascii_alphabetic())?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number.trim().parse().ok()?;
    let scale = match unit {
        "B" => 1.0,
        "KiB" | "kB" => 1024.0,
        "MiB" | "MB" => 1024.0 * 1024.0,
        "GiB" | "GB" => 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    Some((number * scale) as u64)
}

fn median_u64(values: &[u64]) -> u64 {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    sorted.get(sorted.len() / 2).copied().unwrap_or(0)
}
