//! A real agent job in the shipped `dev` profile (issue 23, item 7): a
//! profile of the test's own `extends = "dev"` and adds the registries of
//! `tests/fixtures/registries.py` through egress; the tests run as root and
//! the workspace is uid 1000's, so the unit runs as 1000 (the root caller's
//! rule). One `box run` session installs with pip (a venv and `--user`),
//! builds with cargo against the sparse registry, tests with go against the
//! module proxy, installs and tests with npm, builds a C program into `/tmp`
//! and runs it, clones over git's smart HTTP, sets `git config --global` and
//! commits; a `box serve` session (an agent's, over stdio) forks the
//! workspace (`box/fork`), changes the C program and runs it in the child,
//! merges it back (`box/merge`) and commits; then a second `box run` session
//! of the same profile builds and installs again from scratch (a fresh venv,
//! a fresh cargo target directory, a fresh copy of the Go module and of the
//! npm project) and the registries' access log shows it downloaded nothing:
//! the profile's cache volumes were warm. Every file of the workspace, the
//! merged one included, is still uid 1000's.
//!
//! The profile's name is the run's own, so its profile-scoped volumes start
//! cold; they live under a temporary `XDG_STATE_HOME` (box's volume store)
//! and their docker named volumes are removed at the end. The local variant
//! runs the host's own toolchains and says which the host lacks.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::json;

use crate::registries::dev_image_present;
use crate::support::registries::{CARGO_REGISTRY, Registries, Registry};
use crate::support::{Served, box_bin, docker_here, local_here, serve_command};

/// The owner the workspace is given, as a non-root user's checkout is.
const OWNER: u32 = 1000;

/// Where the test's CA lands in the workspace (ignored by the job's git).
const CA_IN_WORKSPACE: &str = "registries-ca.pem";

/// Whether this test runs as root (the rule it relies on is a root
/// caller's: a unit runs as the workspace's owner); said loudly when not.
fn root_caller() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    eprintln!(
        "\n*** REAL JOB NOT RUN: the job runs as a root caller's unit, and these tests run as uid {} ***\n",
        nix::unistd::geteuid()
    );
    false
}

/// A name no earlier run used, so the profile's volumes start cold.
fn unique_profile(backend: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("realjob-{backend}-{}-{nanos:08x}", std::process::id())
}

/// Removes the docker named volumes of a profile on the way out (a failed
/// assertion included); the store's directories go with the test's
/// `XDG_STATE_HOME`.
struct DockerVolumes {
    profile: String,
}

impl DockerVolumes {
    fn list(&self) -> Vec<String> {
        let output = Command::new("docker")
            .args(["volume", "ls", "-q", "--filter", "label=box.volume"])
            .arg("--filter")
            .arg(format!("label=box.profile={}", self.profile))
            .output()
            .unwrap();
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for DockerVolumes {
    /// Retried for a while: after a failed assertion the session's host may
    /// still be removing a unit that mounts them, and the engine refuses to
    /// remove a volume in use.
    fn drop(&mut self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
        loop {
            let names = self.list();
            if names.is_empty() {
                return;
            }
            let _ = Command::new("docker")
                .args(["volume", "rm", "-f"])
                .args(&names)
                .output();
            if std::time::Instant::now() > deadline {
                eprintln!("*** volumes of {} left: {names:?} ***", self.profile);
                return;
            }
            std::thread::sleep(std::time::Duration::from_secs(1));
        }
    }
}

/// What one run of the job needs: the registries, a workspace owned by
/// [`OWNER`], the profile in a directory of its own, box's state directory.
struct Job {
    registries: Registries,
    workspace: tempfile::TempDir,
    profiles: tempfile::TempDir,
    state: tempfile::TempDir,
    profile: String,
    backend: &'static str,
}

impl Job {
    fn new(backend: &'static str) -> Self {
        let registries = Registries::start();
        let workspace = tempfile::tempdir().unwrap();
        let ca = workspace.path().join(CA_IN_WORKSPACE);
        std::fs::copy(registries.ca(), &ca).unwrap();
        for path in [workspace.path(), ca.as_path()] {
            std::os::unix::fs::chown(path, Some(OWNER), Some(OWNER)).unwrap();
        }
        // A docker unit sees its workspace at /workspace, a local one at
        // its host path.
        let ca_in_unit = match backend {
            "docker" => format!("/workspace/{CA_IN_WORKSPACE}"),
            _ => ca.display().to_string(),
        };
        let profile = unique_profile(backend);
        let profiles = tempfile::tempdir().unwrap();
        std::fs::write(
            profiles.path().join(format!("{profile}.toml")),
            format!(
                r#"description = "a real job: dev with the test registries through egress"
extends = "dev"

[network]
{network}
[env]
{set}
[operator]
allow_dangerous = ["private-destinations"]
"#,
                network = registries.network_toml(),
                set = registries.env_set_toml(&ca_in_unit, &[]),
            ),
        )
        .unwrap();
        // box's state directory (volumes, forks) as a host's is: others may
        // enter it, so a local unit of uid 1000 reaches its fork inside.
        let state = tempfile::tempdir().unwrap();
        std::fs::set_permissions(state.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        Self {
            registries,
            workspace,
            profiles,
            state,
            profile,
            backend,
        }
    }

    fn root(&self) -> &Path {
        self.workspace.path()
    }

    /// `box run` of `script` (bash) in a fresh session of the profile.
    fn run(&self, script: &str) -> Output {
        Command::new(box_bin())
            .args(["run", "--backend", self.backend, "--profiles"])
            .arg(self.profiles.path())
            .args(["--profile", &self.profile, "--workspace"])
            .arg(self.root())
            .args(["--", "bash", "-c", script])
            .env("XDG_STATE_HOME", self.state.path())
            .env("RUST_LOG", "warn")
            .output()
            .unwrap()
    }

    /// A `box serve` session of the profile over stdio, initialized.
    fn serve(&self) -> Served {
        let instance = format!("{}-serve", self.profile);
        let mut command = serve_command(self.backend, &instance, self.root());
        command
            .arg("--profiles")
            .arg(self.profiles.path())
            .args(["--profile", &self.profile])
            .env("XDG_STATE_HOME", self.state.path());
        Served::start(command)
    }

    /// How many downloads each registry has served so far.
    fn downloads(&self) -> Vec<(Registry, usize)> {
        let downloads = self.registries.downloads();
        Registry::ALL
            .into_iter()
            .map(|registry| {
                let count = downloads
                    .iter()
                    .filter(|request| request.registry == registry.key())
                    .count();
                (registry, count)
            })
            .collect()
    }
}

/// stdout, then stderr, for an assertion's message.
fn said(output: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Each of `lines` is a line of `output`'s stdout.
fn assert_lines(output: &Output, lines: &[&str]) {
    let stdout = String::from_utf8_lossy(&output.stdout);
    for line in lines {
        assert!(
            stdout.lines().any(|seen| seen == *line),
            "{line:?} missing:\n{}",
            said(output)
        );
    }
}

/// Every path beneath `dir` (itself included) not owned by `uid`.
fn not_owned_by(dir: &Path, uid: u32) -> Vec<PathBuf> {
    let mut wrong = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let meta = std::fs::symlink_metadata(&path).unwrap();
        if meta.uid() != uid || meta.gid() != uid {
            wrong.push(path.clone());
        }
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path).unwrap() {
                stack.push(entry.unwrap().path());
            }
        }
    }
    wrong
}

/// The first session: the whole job, cold. `@GIT_URL@` is the git fixture's
/// repository. Debian marks its Python externally managed (PEP 668), so
/// `pip install --user` needs `PIP_BREAK_SYSTEM_PACKAGES`, as on any Debian.
const FIRST_SESSION: &str = r#"set -eu
have() { command -v "$1" >/dev/null || { echo "missing: $1"; return 1; }; }
echo "id: $(id -u):$(id -g)"
git config --global user.name "Real Job"
git config --global user.email job@example.com
git init -q -b main .
printf 'venv/\ntarget/\nnode_modules/\nregistries-ca.pem\n' > .gitignore

python3 -m venv venv
venv/bin/pip install -q boxdemo-greet
echo "pip venv: $(venv/bin/python -c 'import boxdemo_greet; print(boxdemo_greet.greet("venv"))')"
PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --user boxdemo-greet
echo "pip user: $(cd / && python3 -c 'import os, boxdemo_greet; print(boxdemo_greet.__file__.startswith(os.path.expanduser("~/.local/")), boxdemo_greet.greet("user"))')"

mkdir -p rs/src
printf '[package]\nname = "job"\nversion = "0.1.0"\nedition = "2021"\n\n[dependencies]\nboxdemo-greet = { version = "1", registry = "@REGISTRY@" }\n' > rs/Cargo.toml
echo 'fn main() { println!("{}", boxdemo_greet::greet("cargo")); }' > rs/src/main.rs
if have cargo; then (cd rs && cargo build -q && echo "cargo: $(target/debug/job)"); fi

mkdir -p gomod
printf 'module example.org/job\n\ngo 1.19\n\nrequire example.com/boxdemo/greet v1.0.0\n' > gomod/go.mod
printf 'package job\n' > gomod/job.go
printf 'package job\n\nimport (\n\t"testing"\n\n\t"example.com/boxdemo/greet"\n)\n\nfunc TestGreet(t *testing.T) {\n\tif got := greet.Hello("go"); got != "HELLO GO!" {\n\t\tt.Fatalf("got %%q", got)\n\t}\n}\n' > gomod/job_test.go
if have go; then (cd gomod && go mod tidy && go test ./... >/dev/null && echo "go test: ok"); fi

mkdir -p js
echo '{"name": "job", "version": "1.0.0", "private": true, "scripts": {"test": "node test.js"}}' > js/package.json
echo 'require("assert").strictEqual(require("boxdemo-greet").greet("npm"), "HELLO NPM!"); console.log("npm test: ok");' > js/test.js
(cd js && npm install -q boxdemo-greet >/dev/null && npm test --silent)

printf '#include <stdio.h>\nint main(void) { puts("c: ran from /tmp"); return 0; }\n' > hello.c
cc -o /tmp/hello hello.c && /tmp/hello

git clone -q @GIT_URL@ /tmp/boxdemo && echo "git clone: $(sh /tmp/boxdemo/greet.sh git)"

git add -A && git commit -q -m "a real job" && echo "commit: $(git log -1 --format='%an <%ae> %s')"
"#;

/// The second session: everything built or installed again from scratch,
/// beside what the first made, with the profile's caches.
const SECOND_SESSION: &str = r#"set -eu
have() { command -v "$1" >/dev/null; }
python3 -m venv /tmp/venv
/tmp/venv/bin/pip install -q boxdemo-greet
echo "pip warm: $(/tmp/venv/bin/python -c 'import boxdemo_greet; print(boxdemo_greet.greet("venv"))')"
if have cargo; then (cd rs && cargo build -q --target-dir /tmp/target && echo "cargo warm: $(/tmp/target/debug/job)"); fi
if have go; then cp -r gomod /tmp/gomod && (cd /tmp/gomod && go test -count=1 ./... >/dev/null && echo "go warm: ok"); fi
mkdir /tmp/js && cp js/package.json js/package-lock.json js/test.js /tmp/js/
(cd /tmp/js && npm ci -q >/dev/null && npm test --silent)
"#;

/// The tools whose steps the job's sessions skipped (`missing: TOOL`): on
/// docker none (the dev image has them all); on the local backend, which
/// runs the host's own, those the host lacks, said loudly.
fn missing_tools(backend: &str, output: &Output) -> Vec<String> {
    let missing: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.strip_prefix("missing: "))
        .map(str::to_owned)
        .collect();
    assert!(
        backend != "docker" || missing.is_empty(),
        "the dev image lacks {missing:?}:\n{}",
        said(output)
    );
    if !missing.is_empty() {
        eprintln!(
            "\n*** {backend} REAL JOB: {missing:?} not on this host's PATH: those steps NOT RUN ***\n"
        );
    }
    missing
}

/// The job of the module's doc on `backend`.
fn a_real_job(backend: &'static str) {
    let job = Job::new(backend);
    let volumes = DockerVolumes {
        profile: job.profile.clone(),
    };
    let script = FIRST_SESSION
        .replace("@GIT_URL@", &job.registries.git_url("boxdemo.git"))
        .replace("@REGISTRY@", CARGO_REGISTRY);
    let first = job.run(&script);
    assert_eq!(first.status.code(), Some(0), "{}", said(&first));
    let missing = missing_tools(backend, &first);
    let ran = |tool: &str| !missing.iter().any(|name| name == tool);
    let expected: Vec<&str> = [
        ("", "id: 1000:1000"),
        ("", "pip venv: HELLO VENV!"),
        ("", "pip user: True HELLO USER!"),
        ("cargo", "cargo: HELLO CARGO!"),
        ("go", "go test: ok"),
        ("", "npm test: ok"),
        ("", "c: ran from /tmp"),
        ("", "git clone: HELLO GIT!"),
        ("", "commit: Real Job <job@example.com> a real job"),
    ]
    .into_iter()
    .filter(|(tool, _)| ran(tool))
    .map(|(_, line)| line)
    .collect();
    assert_lines(&first, &expected);
    let cold = job.downloads();
    for (registry, count) in &cold {
        let tool = match registry {
            Registry::Crates => "cargo",
            Registry::Goproxy => "go",
            _ => "",
        };
        assert!(
            *count > 0 || !ran(tool),
            "nothing downloaded from {registry:?}: {cold:?}"
        );
    }
    let wrong = not_owned_by(job.root(), OWNER);
    assert!(wrong.is_empty(), "not {OWNER}'s: {wrong:?}");
    if backend == "docker" {
        assert!(!volumes.list().is_empty(), "no volumes of {}", job.profile);
    }

    // An agent's session: fork, change and test in the child, merge back,
    // commit in the parent.
    let mut served = job.serve();
    // Worktree mode on the repository the owner's unit made: the root host
    // runs git as the repository's owner, so the pin lands in their `.git`.
    let forked = served.ok("box/fork", json!({"mode": "worktree"}));
    assert_eq!(forked["mode"], "worktree", "{forked}");
    let child = forked["unit"].as_str().unwrap().to_owned();
    let out = served.bash(
        Some(&child),
        "sed -i 's/ran from/forked into/' hello.c && cc -o /tmp/hello hello.c && /tmp/hello",
    );
    assert!(out.contains("c: forked into /tmp"), "{out}");
    let merged = served.ok("box/merge", json!({"unit": child}));
    assert_eq!(merged["merged"], json!(["hello.c"]), "{merged}");
    let out = served.bash(
        None,
        "git config --global user.name 'Real Job' && git config --global user.email job@example.com && git commit -qam 'from the fork' && git log --format=%s",
    );
    assert_eq!(
        out.lines().take(3).collect::<Vec<_>>(),
        ["from the fork", "a real job", "[exit 0]"],
        "{out}"
    );
    assert!(served.hang_up().success());
    let hello = std::fs::read_to_string(job.root().join("hello.c")).unwrap();
    assert!(hello.contains("forked into"), "{hello}");
    let wrong = not_owned_by(job.root(), OWNER);
    assert!(wrong.is_empty(), "not {OWNER}'s after the merge: {wrong:?}");

    // A second session of the profile: warm caches, nothing downloaded.
    let before = job.downloads();
    let second = job.run(SECOND_SESSION);
    assert_eq!(second.status.code(), Some(0), "{}", said(&second));
    let expected: Vec<&str> = [
        ("", "pip warm: HELLO VENV!"),
        ("cargo", "cargo warm: HELLO CARGO!"),
        ("go", "go warm: ok"),
        ("", "npm test: ok"),
    ]
    .into_iter()
    .filter(|(tool, _)| ran(tool))
    .map(|(_, line)| line)
    .collect();
    assert_lines(&second, &expected);
    let after = job.downloads();
    let fetched: Vec<(Registry, usize)> = before
        .iter()
        .zip(&after)
        .map(|((registry, then), (_, now))| (*registry, now - then))
        .collect();
    eprintln!("{backend} downloads: cold {cold:?}, warm {fetched:?}");
    for (registry, count) in &fetched {
        assert_eq!(
            *count,
            0,
            "the second session downloaded from {registry:?} again: {:?}",
            job.registries
                .requests_to(*registry)
                .into_iter()
                .map(|request| request.path)
                .collect::<Vec<_>>()
        );
    }
    drop(volumes);
}

#[test]
fn docker_a_real_job_runs_and_a_second_session_finds_the_caches_warm() {
    if root_caller() && docker_here() && dev_image_present() {
        a_real_job("docker");
    }
}

/// The same job on the local backend, on the host's own toolchains
/// (`local_userland = "host"`); steps of a tool the host lacks are said
/// loudly and left out.
#[test]
fn local_a_real_job_runs_and_a_second_session_finds_the_caches_warm() {
    if root_caller() && local_here() {
        a_real_job("local");
    }
}
