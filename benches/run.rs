//! `box run` interrupted (issue 22, item 10): this build's `box run --backend
//! B -- sleep MARKER` is spawned, the command is waited for until it runs (a
//! `sleep MARKER` in the process table, the unit's own included), then SIGINT
//! goes to box, as Ctrl-C sends it, and the figure is the time from the
//! signal until box has exited and its unit is gone (no container of the
//! run's own profile; no sandbox helper of its workspace; not the command).
//! box exits only once the removal is confirmed, so "gone" is checked right
//! after the exit and waited for only when something is left (counted).
//!
//! Baselines, in the same rounds (interleaved): on docker, `docker run --rm
//! --init box-base:bookworm sleep MARKER` interrupted the same way (its init
//! passes the signal on; the CLI exits once the container is removed); on
//! local, a bare `sleep MARKER` child (the floor: a process's death).
//!
//! `cargo bench --bench run` (release; `--profile dev` measures the debug
//! build). `BOX_BENCH_ROUNDS` (20) rounds per backend, `BOX_BENCH_BACKENDS`
//! (`local,docker`). Everything started here is removed on the way out.

// A benchmark stops on the first failure, loudly.
#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "common/mod.rs"]
mod common;

use common::{env_number, ms, percentile};

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const IMAGE: &str = "box-base:bookworm";
const BOX: &str = env!("CARGO_BIN_EXE_box");
/// How long a command gets to start (a docker unit under load takes seconds).
const START_WITHIN: Duration = Duration::from_secs(60);
/// How long an interrupted run gets to exit before the round fails.
const EXIT_WITHIN: Duration = Duration::from_secs(60);

fn label() -> String {
    format!("bench-run-{}", std::process::id())
}

/// Removes every container this run started, on the way out (panics included).
struct DockerSweep;

impl Drop for DockerSweep {
    fn drop(&mut self) {
        for filter in [
            format!("label=box.bench={}", label()),
            format!("label=box.profile={}", label()),
        ] {
            let ids = containers(&filter);
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

/// Container ids (running or not) passing a `docker ps` filter.
fn containers(filter: &str) -> Vec<String> {
    let output = Command::new("docker")
        .args(["ps", "-aq", "--no-trunc", "--filter", filter])
        .output()
        .expect("docker ps");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Processes whose command line (arguments joined by spaces) passes `test`.
fn processes_where(test: impl Fn(&str) -> bool) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if test(&text) {
                found.push(format!("{}: {text}", entry.file_name().display()));
            }
        }
    }
    found
}

fn sleeping(marker: &str) -> bool {
    let wanted = format!("sleep {marker}");
    !processes_where(|text| text.trim_end() == wanted).is_empty()
}

/// What is left of a round: the command, and the backend's unit.
fn left(backend: &str, workspace: &Path, marker: &str) -> Vec<String> {
    let wanted = format!("sleep {marker}");
    let mut left = processes_where(|text| text.trim_end() == wanted);
    if backend == "docker" {
        left.extend(containers(&format!("label=box.profile={}", label())));
        left.extend(containers(&format!("label=box.bench={}", label())));
    } else {
        let root = format!("--root {} ", workspace.display());
        left.extend(processes_where(|text| {
            text.contains(" sandbox ") && text.contains(&root)
        }));
    }
    left
}

/// One interrupted run: spawn, wait for the command, SIGINT, then the time
/// until the spawned process has exited and nothing of the round is left.
struct Round {
    /// Spawn → the command runs.
    start: Duration,
    /// SIGINT → exited and gone.
    interrupt: Duration,
    /// Whether anything was left at the exit (then waited for).
    left_at_exit: bool,
}

fn interrupt_round(
    mut child: Child,
    spawned: Instant,
    backend: &str,
    workspace: &Path,
    marker: &str,
    want_code: Option<i32>,
) -> Round {
    while !sleeping(marker) {
        assert!(
            spawned.elapsed() < START_WITHIN,
            "{backend}: the command never started"
        );
        if let Some(status) = child.try_wait().unwrap() {
            panic!("{backend}: exited before the command started: {status}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let start = spawned.elapsed();
    let signalled = Instant::now();
    kill(
        Pid::from_raw(i32::try_from(child.id()).unwrap()),
        Signal::SIGINT,
    )
    .unwrap();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            signalled.elapsed() < EXIT_WITHIN,
            "{backend}: no exit within {EXIT_WITHIN:?} of SIGINT"
        );
        std::thread::sleep(Duration::from_millis(1));
    };
    let exited = signalled.elapsed();
    if let Some(code) = want_code {
        assert_eq!(status.code(), Some(code), "{backend}: exit status");
    }
    let mut left_at_exit = false;
    let mut interrupt = exited;
    while !left(backend, workspace, marker).is_empty() {
        left_at_exit = true;
        assert!(
            signalled.elapsed() < EXIT_WITHIN,
            "{backend}: left {:?}",
            left(backend, workspace, marker)
        );
        std::thread::sleep(Duration::from_millis(10));
        interrupt = signalled.elapsed();
    }
    Round {
        start,
        interrupt,
        left_at_exit,
    }
}

fn box_round(backend: &str, profiles: &Path, workspace: &Path, marker: &str) -> Round {
    let spawned = Instant::now();
    let child = Command::new(BOX)
        .args([
            "run",
            "--backend",
            backend,
            "--profile",
            &label(),
            "--profiles",
        ])
        .arg(profiles)
        .arg("--workspace")
        .arg(workspace)
        .args(["--", "sleep", marker])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawning box run");
    interrupt_round(child, spawned, backend, workspace, marker, Some(130))
}

fn baseline_round(backend: &str, workspace: &Path, marker: &str) -> Round {
    let spawned = Instant::now();
    let child = if backend == "docker" {
        Command::new("docker")
            .args(["run", "--rm", "--init", "--label"])
            .arg(format!("box.bench={}", label()))
            .args([IMAGE, "sleep", marker])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawning docker run")
    } else {
        Command::new("sleep")
            .arg(marker)
            .stdin(Stdio::null())
            .spawn()
            .expect("spawning sleep")
    };
    let code = if backend == "docker" { Some(130) } else { None };
    interrupt_round(child, spawned, backend, workspace, marker, code)
}

fn report(name: &str, rounds: &[Round]) -> (Duration, Duration) {
    let interrupts: Vec<Duration> = rounds.iter().map(|round| round.interrupt).collect();
    let starts: Vec<Duration> = rounds.iter().map(|round| round.start).collect();
    let (p50, p99) = (percentile(&interrupts, 0.5), percentile(&interrupts, 0.99));
    println!(
        "  {name:<44} SIGINT → exited and gone: p50 {:>7.1} ms, p99 {:>7.1} ms, max {:>7.1} ms; \
         left at exit {}/{}; spawn → command runs: p50 {:.0} ms",
        ms(p50),
        ms(p99),
        ms(percentile(&interrupts, 1.0)),
        rounds.iter().filter(|round| round.left_at_exit).count(),
        rounds.len(),
        ms(percentile(&starts, 0.5)),
    );
    (p50, p99)
}

fn main() {
    let rounds = env_number("BOX_BENCH_ROUNDS", 20);
    let backends =
        std::env::var("BOX_BENCH_BACKENDS").unwrap_or_else(|_| "local,docker".to_owned());
    let _sweep = DockerSweep;
    let profiles = tempfile::tempdir().unwrap();
    std::fs::write(
        profiles.path().join(format!("{}.toml", label())),
        "extends = \"default\"\n",
    )
    .unwrap();
    println!(
        "box run, interrupted by SIGINT once its command runs ({rounds} rounds per backend, interleaved with the baseline)"
    );
    for backend in backends.split(',').map(str::trim) {
        let workspace = tempfile::tempdir().unwrap();
        let mut boxed = Vec::new();
        let mut baseline = Vec::new();
        for round in 0..rounds {
            let marker = format!("97{}.{round}", std::process::id());
            boxed.push(box_round(
                backend,
                profiles.path(),
                workspace.path(),
                &marker,
            ));
            let marker = format!("98{}.{round}", std::process::id());
            baseline.push(baseline_round(backend, workspace.path(), &marker));
        }
        println!("{backend}:");
        let (box_p50, box_p99) = report("box run -- sleep", &boxed);
        let baseline_name = if backend == "docker" {
            "docker run --rm --init IMAGE sleep"
        } else {
            "sleep (a bare child)"
        };
        let (base_p50, base_p99) = report(baseline_name, &baseline);
        println!(
            "  ratio: p50 {:.2}, p99 {:.2}",
            box_p50.as_secs_f64() / base_p50.as_secs_f64(),
            box_p99.as_secs_f64() / base_p99.as_secs_f64()
        );
    }
}
