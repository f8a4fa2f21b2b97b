//! A real job (issue 23, "Done when"): the same job on the host and in a
//! docker unit of a profile that `extends = "dev"`, cold and with warm
//! caches, in one run, rounds interleaved.
//!
//! The job, in a fresh checkout each round: a Python package's tests
//! (`python3 -m venv --system-site-packages venv`, `pip install
//! boxdemo-greet`, `python -m pytest`), then a small Rust crate with two
//! registry dependencies (`boxdemo-greet`, `boxdemo-util`) built and tested
//! (`cargo build`, `cargo test`). Its packages come from the registry
//! fixtures of `tests/fixtures/registries.py` on loopback, over HTTPS with
//! the fixture's CA: the host reaches them as `localhost`, the unit through
//! its egress proxy by their names (`[network] hosts`).
//!
//! - host, cold: a fresh `CARGO_HOME` and `PIP_CACHE_DIR` each round; warm:
//!   one pair kept, primed by one unmeasured run.
//! - unit, cold: `box run --profile P` with a fresh profile name each round,
//!   so the profile-scoped cache volumes of `dev` are new; warm: one profile,
//!   primed by one unmeasured run. The figure is `box run`'s whole wall time
//!   (the unit's start and removal included); the job prints a timestamp
//!   after each phase, so the report splits it (`start+stop` is what is left).
//! - docker, warm: `docker run --rm` of the same image without box (the
//!   host's network, the caches bind-mounted, primed): the image's toolchain
//!   against the host's, apart from what box adds.
//!
//! `cargo bench --bench real_job` (release; `--profile dev` measures the
//! debug build's `box`). `BOX_BENCH_ROUNDS` (5). Needs docker, the image
//! `box-dev:bookworm`, and on the host cargo and a Python with pytest
//! (`BOX_BENCH_PYTHON`, default `/usr/bin/python3`: Debian's `python3-pytest`).
//! As root, each workspace is given to uid 1000, so the unit runs as that
//! user (a root caller's rule). Everything made here is removed on the way
//! out: the profiles' volumes (docker named volumes and box's state, kept
//! under a temporary `XDG_STATE_HOME`).

// A benchmark stops on the first failure, loudly.
#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "common/mod.rs"]
mod common;

/// The registry fixtures the integration tests use.
#[allow(dead_code)]
#[path = "../tests/it/support/registries.rs"]
mod registries;

use common::{env_number, median};
use registries::{CARGO_REGISTRY, Registries, trust_env};

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const BOX: &str = env!("CARGO_BIN_EXE_box");
const DEV_IMAGE: &str = "box-dev:bookworm";
/// Where the unit finds the fixture's CA (copied into each workspace).
const CA_IN_WORKSPACE: &str = "registries-ca.pem";

/// The repository, for the fixture's script (`registries::Registries::start`).
fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn label() -> String {
    format!("bench-realjob-{}", std::process::id())
}

/// The job, run in the checkout with `bash`; `T <phase> <ns>` after each
/// phase. `BENCH_PYTHON`: the Python whose site packages hold pytest.
const JOB: &str = r#"set -eu
t() { echo "T $1 $(date +%s%N)"; }
t start
"${BENCH_PYTHON:-python3}" -m venv --system-site-packages venv
venv/bin/pip install -q boxdemo-greet
t pip
venv/bin/python -m pytest -q -p no:cacheprovider py >/dev/null
t pytest
cd rs
cargo build -q
t cargo-build
cargo test -q >/dev/null 2>&1
t cargo-test
"#;

/// The phases the job reports, in order.
const PHASES: [&str; 4] = ["pip", "pytest", "cargo-build", "cargo-test"];

/// A fresh checkout of the job's sources in a new directory.
fn checkout(registries: &Registries) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let write = |path: &str, text: &str| {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write(
        "py/greeting.py",
        "from boxdemo_greet import greet\n\n\ndef welcome(name):\n    return greet(name)\n",
    );
    write(
        "py/test_greeting.py",
        "from greeting import welcome\n\n\ndef test_welcome():\n    assert welcome(\"box\") == \"HELLO BOX!\"\n",
    );
    write(
        "rs/Cargo.toml",
        &format!(
            "[package]\nname = \"job\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\nboxdemo-greet = {{ version = \"1\", registry = \"{CARGO_REGISTRY}\" }}\nboxdemo-util = {{ version = \"1\", registry = \"{CARGO_REGISTRY}\" }}\n"
        ),
    );
    write(
        "rs/src/lib.rs",
        "pub fn welcome(name: &str) -> String {\n    boxdemo_greet::greet(name)\n}\n\npub fn loud(text: &str) -> String {\n    boxdemo_util::shout(text)\n}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn welcomes() {\n        assert_eq!(super::welcome(\"box\"), \"HELLO BOX!\");\n        assert_eq!(super::loud(\"hi\"), \"HI!\");\n    }\n}\n",
    );
    std::fs::copy(registries.ca(), root.join(CA_IN_WORKSPACE)).unwrap();
    if nix::unistd::geteuid().is_root() {
        chown_tree(root, 1000);
    }
    dir
}

/// Give `dir` and everything beneath it to `uid` (and the group of that id).
fn chown_tree(dir: &Path, uid: u32) {
    std::os::unix::fs::chown(dir, Some(uid), Some(uid)).unwrap();
    if dir.is_dir() {
        for entry in std::fs::read_dir(dir).unwrap() {
            chown_tree(&entry.unwrap().path(), uid);
        }
    }
}

/// One run of the job: the whole wall time and each phase's.
struct Round {
    total: Duration,
    phases: Vec<Duration>,
}

impl Round {
    /// What the phases leave of the total: for a unit its start and removal.
    fn rest(&self) -> Duration {
        self.total
            .saturating_sub(self.phases.iter().sum::<Duration>())
    }
}

/// The job's output read into a round, or a panic showing it.
fn round_of(what: &str, output: &Output, total: Duration) -> Round {
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{what}: the job failed ({:?}):\n{stdout}\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stderr)
    );
    let marks: Vec<(String, u128)> = stdout
        .lines()
        .filter_map(|line| {
            let mut words = line.strip_prefix("T ")?.split(' ');
            Some((words.next()?.to_owned(), words.next()?.parse().ok()?))
        })
        .collect();
    let names: Vec<&str> = marks
        .iter()
        .skip(1)
        .map(|(name, _)| name.as_str())
        .collect();
    assert_eq!(names, PHASES, "{what}: {stdout}");
    let phases = marks
        .windows(2)
        .map(|pair| {
            Duration::from_nanos(u64::try_from(pair[1].1.saturating_sub(pair[0].1)).unwrap())
        })
        .collect();
    Round { total, phases }
}

/// The job on the host with `cargo_home` and `pip_cache`.
fn host_round(registries: &Registries, python: &str, cargo_home: &Path, pip_cache: &Path) -> Round {
    let workspace = checkout(registries);
    let ca = registries.ca().to_string_lossy().into_owned();
    let started = Instant::now();
    let output = Command::new("bash")
        .args(["-c", JOB])
        .current_dir(workspace.path())
        .envs(registries.local_client_env())
        .envs(trust_env(&ca))
        .env("CARGO_HOME", cargo_home)
        .env("PIP_CACHE_DIR", pip_cache)
        .env("BENCH_PYTHON", python)
        .output()
        .unwrap();
    round_of("host", &output, started.elapsed())
}

/// `box run` of `command` in `profile` over `workspace`.
fn box_run(bench: &Bench, profile: &str, workspace: &Path, command: &str) -> (Output, Duration) {
    let started = Instant::now();
    let output = Command::new(BOX)
        .args(["run", "--backend", "docker", "--profiles"])
        .arg(bench.profiles.path())
        .args(["--profile", profile, "--workspace"])
        .arg(workspace)
        .args(["--", "bash", "-c", command])
        .env("XDG_STATE_HOME", bench.state.path())
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    (output, started.elapsed())
}

/// The job in a docker unit of `profile`.
fn unit_round(bench: &Bench, profile: &str) -> Round {
    let workspace = checkout(&bench.registries);
    let (output, total) = box_run(bench, profile, workspace.path(), JOB);
    round_of(profile, &output, total)
}

/// The job in `docker run` of the same image, without box: the host's
/// network, the fixture's names as `localhost`, the caches bind-mounted from
/// `caches` (the image's toolchain, so the gap to the host that is not box's).
fn docker_round(bench: &Bench, caches: &Path) -> Round {
    let workspace = checkout(&bench.registries);
    let mut command = Command::new("docker");
    command.args(["run", "--rm", "--network", "host", "--label"]);
    command.arg(format!("box.bench={}", label()));
    if nix::unistd::geteuid().is_root() {
        command.args(["--user", "1000:1000"]);
    }
    command
        .arg("--volume")
        .arg(format!("{}:/workspace", workspace.path().display()));
    for (dir, path) in [("pip", ".cache/pip"), ("cargo", ".cargo/registry")] {
        command
            .arg("--volume")
            .arg(format!("{}:/home/box/{path}", caches.join(dir).display()));
    }
    let env = bench
        .registries
        .local_client_env()
        .into_iter()
        .chain(trust_env(&format!("/workspace/{CA_IN_WORKSPACE}")));
    for (name, value) in env {
        command.arg("--env").arg(format!("{name}={value}"));
    }
    command.args(["--workdir", "/workspace", DEV_IMAGE, "bash", "-c", JOB]);
    let started = Instant::now();
    let output = command.output().unwrap();
    round_of("docker run", &output, started.elapsed())
}

/// The registries, the profiles' directory, box's state for the run.
struct Bench {
    registries: Registries,
    profiles: tempfile::TempDir,
    state: tempfile::TempDir,
}

impl Bench {
    /// Write the profile `name`: dev with the registries through egress.
    fn profile(&self, name: &str) -> String {
        std::fs::write(
            self.profiles.path().join(format!("{name}.toml")),
            format!(
                "extends = \"dev\"\n\n[network]\n{}\n[env]\n{}\n[operator]\nallow_dangerous = [\"private-destinations\"]\n",
                self.registries.network_toml(),
                self.registries
                    .env_set_toml(&format!("/workspace/{CA_IN_WORKSPACE}"), &[]),
            ),
        )
        .unwrap();
        name.to_owned()
    }
}

/// Removes the docker named volumes of this run's profiles on the way out
/// (their directories go with the run's `XDG_STATE_HOME`).
struct VolumeSweep;

impl VolumeSweep {
    fn remove(&self, profile: Option<&str>) {
        let output = Command::new("docker")
            .args(["volume", "ls", "--filter", "label=box.volume", "--format"])
            .arg("{{.Name}} {{.Label \"box.profile\"}}")
            .output()
            .expect("docker volume ls");
        let names: Vec<String> = String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| {
                let (name, owner) = line.split_once(' ')?;
                let ours = match profile {
                    Some(profile) => owner == profile,
                    None => owner.starts_with(&label()),
                };
                ours.then(|| name.to_owned())
            })
            .collect();
        if !names.is_empty() {
            let _ = Command::new("docker")
                .args(["volume", "rm", "-f"])
                .args(&names)
                .output();
        }
    }
}

impl Drop for VolumeSweep {
    fn drop(&mut self) {
        self.remove(None);
    }
}

fn secs(duration: Duration) -> f64 {
    duration.as_secs_f64()
}

/// One line of the report: the median total and each phase's median.
fn report(name: &str, rounds: &[Round]) -> Duration {
    let totals: Vec<Duration> = rounds.iter().map(|round| round.total).collect();
    let total = median(&totals);
    let mut line = format!("  {name:<12} total {:>6.2} s  (", secs(total));
    for (index, phase) in PHASES.iter().enumerate() {
        let each: Vec<Duration> = rounds.iter().map(|round| round.phases[index]).collect();
        line.push_str(&format!("{phase} {:.2}, ", secs(median(&each))));
    }
    let rest: Vec<Duration> = rounds.iter().map(Round::rest).collect();
    line.push_str(&format!("start+stop {:.2})", secs(median(&rest))));
    println!("{line}");
    total
}

fn main() {
    let rounds = env_number("BOX_BENCH_ROUNDS", 5);
    let python = std::env::var("BOX_BENCH_PYTHON").unwrap_or_else(|_| "/usr/bin/python3".into());
    let pytest = Command::new(&python)
        .args(["-c", "import pytest"])
        .status()
        .expect("the host's Python");
    assert!(
        pytest.success(),
        "{python} has no pytest: install python3-pytest, or set BOX_BENCH_PYTHON"
    );
    let image = Command::new("docker")
        .args(["image", "inspect", DEV_IMAGE])
        .output()
        .expect("docker");
    assert!(
        image.status.success(),
        "{DEV_IMAGE} is missing: box image build dev"
    );
    let sweep = VolumeSweep;
    let bench = Bench {
        registries: Registries::start(),
        profiles: tempfile::tempdir().unwrap(),
        state: tempfile::tempdir().unwrap(),
    };

    // Warm: one profile and one pair of host caches, primed.
    let warm = bench.profile(&format!("{}-warm", label()));
    let host_caches = tempfile::tempdir().unwrap();
    let (cargo_home, pip_cache) = (
        host_caches.path().join("cargo"),
        host_caches.path().join("pip"),
    );
    host_round(&bench.registries, &python, &cargo_home, &pip_cache);
    unit_round(&bench, &warm);
    let docker_caches = tempfile::tempdir().unwrap();
    for dir in ["pip", "cargo"] {
        std::fs::create_dir(docker_caches.path().join(dir)).unwrap();
    }
    if nix::unistd::geteuid().is_root() {
        chown_tree(docker_caches.path(), 1000);
    }
    docker_round(&bench, docker_caches.path());

    println!(
        "A real job (pip + pytest, cargo build + test), {rounds} rounds interleaved; medians in seconds"
    );
    let (mut host_cold, mut host_warm, mut unit_cold, mut unit_warm) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut docker_warm, mut starts) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let fresh = tempfile::tempdir().unwrap();
        host_cold.push(host_round(
            &bench.registries,
            &python,
            &fresh.path().join("cargo"),
            &fresh.path().join("pip"),
        ));
        host_warm.push(host_round(
            &bench.registries,
            &python,
            &cargo_home,
            &pip_cache,
        ));
        let cold = bench.profile(&format!("{}-cold-{round}", label()));
        unit_cold.push(unit_round(&bench, &cold));
        sweep.remove(Some(&cold));
        let warm_downloads = bench.registries.downloads().len();
        unit_warm.push(unit_round(&bench, &warm));
        assert_eq!(
            bench.registries.downloads().len(),
            warm_downloads,
            "the warm unit downloaded"
        );
        docker_warm.push(docker_round(&bench, docker_caches.path()));
        let empty = tempfile::tempdir().unwrap();
        if nix::unistd::geteuid().is_root() {
            chown_tree(empty.path(), 1000);
        }
        let (output, took) = box_run(&bench, &warm, empty.path(), "true");
        assert!(output.status.success(), "{output:?}");
        starts.push(took);
    }
    let host_cold = report("host, cold", &host_cold);
    let host_warm = report("host, warm", &host_warm);
    let unit_cold = report("unit, cold", &unit_cold);
    let unit_warm = report("unit, warm", &unit_warm);
    let docker_warm = report("docker, warm", &docker_warm);
    println!(
        "  box run -- true (the warm profile): {:.2} s",
        secs(median(&starts))
    );
    println!(
        "  unit/host: cold {:.2}x, warm {:.2}x (goal, warm: <= 1.1x); warm unit/docker run of the same image: {:.2}x",
        secs(unit_cold) / secs(host_cold),
        secs(unit_warm) / secs(host_warm),
        secs(unit_warm) / secs(docker_warm)
    );
    drop(bench);
    drop(sweep);
}
