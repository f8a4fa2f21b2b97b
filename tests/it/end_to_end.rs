//! `box serve` and `box run` on the real backends (docker and local), with the
//! real executor inside real units: the Python `mcp` SDK as client over stdio
//! and HTTP, `box run`'s streams and status, session isolation, a unit killed
//! mid-call, and a client hang-up removing its units.

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use boxhost::backend::docker::DockerBackend;
use serde_json::{Value, json};

use crate::support::{
    FrozenCalls, Served, box_bin, containers, http_server, repo_root, serve_command, under_ci,
};

/// The backends this machine runs: local always, docker when its engine answers
/// (under CI a missing engine is a failure, never a skip).
fn backends() -> Vec<&'static str> {
    // Its own runtime on its own thread, so async tests can ask too.
    let connected = std::thread::spawn(|| {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(DockerBackend::connect()).map(drop)
    })
    .join()
    .unwrap();
    match connected {
        Ok(_) => vec!["local", "docker"],
        Err(error) => {
            assert!(!under_ci(), "CI needs a Docker engine: {error}");
            eprintln!("\n*** DOCKER PART NOT RUN: {error} ***\n");
            vec!["local"]
        }
    }
}

fn run_script(python: &Path, script: &str, args: &[&str]) {
    let e2e = repo_root().join("tests/e2e");
    let output = Command::new(python)
        .current_dir(&e2e)
        .arg(e2e.join(script))
        .arg(box_bin())
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{script} {args:?} failed\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// What a bash call inside a hardened unit must show.
const PROBE: &str = r#"{"command": "grep -E '^(NoNewPrivs|CapEff)' /proc/self/status"}"#;
const PROGRESS: &str = r#"{"command": "for i in 1 2 3; do echo $i; sleep 0.3; done"}"#;

fn sdk_over(script: &str) {
    let Some(python) = crate::support::python_with_mcp() else {
        return;
    };
    for backend in backends() {
        let workspace = tempfile::tempdir().unwrap();
        let workspace = workspace.path().to_str().unwrap();
        run_script(
            &python,
            script,
            &[
                "--backend",
                backend,
                "--workspace",
                workspace,
                "--tool",
                "bash",
                "--args",
                PROBE,
                "--expect",
                "NoNewPrivs:\t1",
                "--progress-tool",
                "bash",
                "--progress-args",
                PROGRESS,
                "--max-read-bytes",
                "65536",
            ],
        );
    }
}

#[test]
fn python_sdk_drives_serve_over_stdio_on_every_backend() {
    sdk_over("serve_stdio.py");
}

#[test]
fn python_sdk_drives_serve_over_http_on_every_backend() {
    sdk_over("serve_http.py");
}

/// Issue 11 with an unmodified client: the Python SDK forks, works in the
/// child, merges and discards, over stdio and HTTP, on every backend.
#[test]
fn python_sdk_forks_merges_and_discards_on_every_backend() {
    let Some(python) = crate::support::python_with_mcp() else {
        return;
    };
    for backend in backends() {
        for transport in ["stdio", "http"] {
            let workspace = tempfile::tempdir().unwrap();
            let workspace = workspace.path().to_str().unwrap();
            run_script(
                &python,
                "fork_sdk.py",
                &[
                    "--backend",
                    backend,
                    "--workspace",
                    workspace,
                    "--transport",
                    transport,
                ],
            );
        }
    }
}

/// Issue 26 with an unmodified client: the Python SDK pinned to MCP
/// 2026-07-28 (no initialize) discovers box, opens a session as a handle,
/// lists and calls tools with it, is refused with a wrong secret and closes
/// it; in its default mode it speaks 2026-07-28 and calls without a handle
/// (HTTP: in a unit removed after the call, while a handshake-era client
/// works on the same endpoint), over stdio and HTTP, on every backend.
#[test]
fn python_sdk_speaks_the_stateless_revision_on_every_backend() {
    let Some(python) = crate::support::python_with_mcp() else {
        return;
    };
    for backend in backends() {
        for transport in ["stdio", "http"] {
            let workspace = tempfile::tempdir().unwrap();
            let workspace = workspace.path().to_str().unwrap();
            run_script(
                &python,
                "stateless_sdk.py",
                &[
                    "--backend",
                    backend,
                    "--workspace",
                    workspace,
                    "--transport",
                    transport,
                ],
            );
        }
    }
}

/// Issue 26 with an unmodified client: a session the Python SDK pinned to
/// MCP 2026-07-28 opened as a handle survives `kill -9` of its host; the
/// next host on the same state reattaches it at the first request carrying
/// the handle (its unit's `/tmp` file still there), and the SDK closes it
/// (`tests/e2e/stateless_reattach_sdk.py`), on every backend.
#[test]
fn python_sdk_reattaches_a_handle_after_kill_9_of_its_host_on_every_backend() {
    let Some(python) = crate::support::python_with_mcp() else {
        return;
    };
    for backend in backends() {
        let workspace = tempfile::tempdir().unwrap();
        let state = tempfile::tempdir().unwrap();
        run_script(
            &python,
            "stateless_reattach_sdk.py",
            &[
                "--backend",
                backend,
                "--workspace",
                workspace.path().to_str().unwrap(),
                "--state",
                state.path().join("sessions").to_str().unwrap(),
            ],
        );
    }
}

/// Issue 26 for clients that can only call tools: the Python SDK pinned to
/// MCP 2026-07-28 lists box's session tools, opens a session with
/// `box_session_open`, writes and runs bash with its handle, and closes it
/// with `box_session_close`, over stdio and HTTP, on every backend
/// (`tests/e2e/stateless_tools_sdk.py`).
#[test]
fn python_sdk_opens_a_session_with_tools_on_every_backend() {
    let Some(python) = crate::support::python_with_mcp() else {
        return;
    };
    for backend in backends() {
        for transport in ["stdio", "http"] {
            let workspace = tempfile::tempdir().unwrap();
            let workspace = workspace.path().to_str().unwrap();
            run_script(
                &python,
                "stateless_tools_sdk.py",
                &[
                    "--backend",
                    backend,
                    "--workspace",
                    workspace,
                    "--transport",
                    transport,
                ],
            );
        }
    }
}

/// The Python SDK, unmodified, asks for profile `ci` and a tightening without
/// box's capability (headers, the path, `serve --profile --tighten`); the
/// unit's environment shows the profile (`CI=true`), the envelopes the
/// tightening.
#[test]
fn python_sdk_asks_without_capabilities_on_every_backend() {
    let Some(python) = crate::support::python_with_mcp() else {
        return;
    };
    for backend in backends() {
        let workspace = tempfile::tempdir().unwrap();
        run_script(
            &python,
            "serve_asks.py",
            &[
                "--backend",
                backend,
                "--workspace",
                workspace.path().to_str().unwrap(),
                "--tool",
                "bash",
                "--args",
                r#"{"command": "echo CI=$CI"}"#,
                "--expect",
                "CI=true",
            ],
        );
    }
}

#[test]
fn http_sessions_cannot_see_each_others_files_on_every_backend() {
    let Some(python) = crate::support::python_with_mcp() else {
        return;
    };
    let profiles = tempfile::tempdir().unwrap();
    std::fs::write(
        profiles.path().join("isolated.toml"),
        "description = \"a fresh empty workspace per session\"\nextends = \"default\"\n\n[workspace]\nsource = \"empty\"\n",
    )
    .unwrap();
    for backend in backends() {
        run_script(
            &python,
            "isolation_http.py",
            &[
                "--backend",
                backend,
                "--profiles",
                profiles.path().to_str().unwrap(),
                "--profile",
                "isolated",
            ],
        );
    }
}

#[test]
fn box_run_streams_output_and_passes_the_status_on_every_backend() {
    for backend in backends() {
        let workspace = tempfile::tempdir().unwrap();
        std::fs::write(workspace.path().join("input.txt"), "from the workspace\n").unwrap();
        let output = Command::new(box_bin())
            .args(["run", "--backend", backend, "--workspace"])
            .arg(workspace.path())
            .args([
                "--",
                "sh",
                "-c",
                "cat input.txt; echo to-stderr >&2; grep NoNewPrivs /proc/self/status; exit 7",
            ])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            output.status.code(),
            Some(7),
            "{backend}: {stdout}\n{stderr}"
        );
        assert!(stdout.contains("from the workspace"), "{backend}: {stdout}");
        assert!(stdout.contains("NoNewPrivs:\t1"), "{backend}: {stdout}");
        assert!(stderr.contains("to-stderr"), "{backend}: {stderr}");
        assert!(
            !stdout.contains("to-stderr"),
            "{backend}: stderr leaked into stdout"
        );
    }
}

/// A `box serve` over stdio on `backend`, with `extra` flags, initialized.
fn serve(backend: &str, instance: &str, workspace: &Path, extra: &[&str]) -> Served {
    let mut command = serve_command(backend, instance, workspace);
    command.args(extra);
    Served::start(command)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_unit_killed_mid_call_answers_with_its_cause_and_nothing_is_left() {
    if !backends().contains(&"docker") {
        return;
    }
    let instance = format!("e2e-kill-{}", std::process::id());
    let workspace = tempfile::tempdir().unwrap();
    let mut served = serve("docker", &instance, workspace.path(), &[]);
    let units = containers(&instance, None).await;
    assert_eq!(units.len(), 1, "one workspace unit: {units:?}");
    served.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "bash", "arguments": {"command": "sleep 60"}}}));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let docker = boxhost::backend::docker::bollard::Docker::connect_with_defaults().unwrap();
    docker
        .kill_container(
            &units[0],
            None::<boxhost::backend::docker::bollard::query_parameters::KillContainerOptions>,
        )
        .await
        .unwrap();
    let answer = tokio::task::block_in_place(|| served.answer(1, Duration::from_secs(20)));
    let message = answer["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        message.contains("workspace"),
        "the error names the unit: {answer}"
    );
    // Issue 22, item 6: a kill from outside is not an OOM kill.
    assert!(message.contains("from outside"), "{answer}");
    assert_eq!(
        answer["error"]["data"]["oomKilled"],
        json!(false),
        "{answer}"
    );
    served.send(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "ls", "arguments": {}}}));
    let later = tokio::task::block_in_place(|| served.answer(2, Duration::from_secs(20)));
    assert!(
        later.get("error").is_some(),
        "a later call after the unit ended: {later}"
    );
    let status = tokio::task::block_in_place(|| served.hang_up());
    assert!(
        status.success(),
        "box serve exits 0 when its client hangs up: {status}"
    );
    assert_eq!(
        containers(&instance, None).await,
        Vec::<String>::new(),
        "no unit outlives its session"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_hang_up_removes_the_units() {
    for backend in backends() {
        let instance = format!("e2e-hangup-{backend}-{}", std::process::id());
        let workspace = tempfile::tempdir().unwrap();
        let mut served = serve(backend, &instance, workspace.path(), &[]);
        served.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "bash", "arguments": {"command": "echo alive"}}}));
        let answer = tokio::task::block_in_place(|| served.answer(1, Duration::from_secs(30)));
        assert!(answer.to_string().contains("alive"), "{backend}: {answer}");
        if backend == "docker" {
            assert_eq!(containers(&instance, None).await.len(), 1);
        }
        let status = tokio::task::block_in_place(|| served.hang_up());
        assert!(
            status.success(),
            "{backend}: box serve exits 0 at hang-up: {status}"
        );
        if backend == "docker" {
            assert_eq!(containers(&instance, None).await, Vec::<String>::new());
        }
        // Local units are processes of the host's own: none may survive it.
        let root = workspace.path().to_string_lossy().into_owned();
        let survivors: Vec<String> = std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|entry| {
                let cmdline = std::fs::read(entry.ok()?.path().join("cmdline")).ok()?;
                let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
                cmdline.contains(&root).then_some(cmdline)
            })
            .collect();
        assert!(
            survivors.is_empty(),
            "{backend}: processes outlived the session: {survivors:?}"
        );
    }
}

/// Issue 22, item 6, as reported: when the kernel's OOM killer picks the
/// unit's init (box's first process; here its `oom_score_adj` is raised to
/// 1000 from the host, as the report's was), the call in flight is told the
/// OOM killer ended the unit (`oomKilled: true`), not "killed with SIGKILL
/// from outside". The engine removes the unit at once (auto-remove), so the
/// host must have read the unit's memory cgroup while it lived.
#[tokio::test(flavor = "multi_thread")]
async fn an_init_killed_by_the_oom_killer_is_reported_as_an_oom_kill() {
    if !backends().contains(&"docker") {
        return;
    }
    let profiles = tempfile::tempdir().unwrap();
    std::fs::write(
        profiles.path().join("small.toml"),
        "extends = \"default\"\n\n[workspace]\nsource = \"empty\"\n\n[limits]\nmemory = \"64MiB\"\n",
    )
    .unwrap();
    let instance = format!("e2e-oom-init-{}", std::process::id());
    let workspace = tempfile::tempdir().unwrap();
    let mut served = serve(
        "docker",
        &instance,
        workspace.path(),
        &[
            "--profiles",
            profiles.path().to_str().unwrap(),
            "--profile",
            "small",
        ],
    );
    let units = containers(&instance, None).await;
    assert_eq!(units.len(), 1, "one workspace unit: {units:?}");
    let docker = boxhost::backend::docker::bollard::Docker::connect_with_defaults().unwrap();
    let pid = docker
        .inspect_container(&units[0], None)
        .await
        .unwrap()
        .state
        .and_then(|state| state.pid)
        .unwrap();
    std::fs::write(format!("/proc/{pid}/oom_score_adj"), "1000").unwrap();
    served.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "bash", "arguments": {"command": "head -c 1G /dev/zero | tail"}}}));
    let answer = tokio::task::block_in_place(|| served.answer(1, Duration::from_secs(60)));
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("OOM killer"), "{answer}");
    assert!(!message.contains("from outside"), "{answer}");
    assert!(message.contains(&(64u64 << 20).to_string()), "{answer}");
    assert_eq!(
        answer["error"]["data"]["oomKilled"],
        json!(true),
        "{answer}"
    );
    let status = tokio::task::block_in_place(|| served.hang_up());
    assert!(status.success(), "{status}");
    assert_eq!(containers(&instance, None).await, Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_unit_is_listed_started_and_driven_with_namespaced_ids() {
    let profiles = tempfile::tempdir().unwrap();
    // `cat` stands in for an MCP server: the round trip through the server
    // unit's process methods is what is under test, not MCP inside it.
    std::fs::write(
        profiles.path().join("with-echo.toml"),
        "description = \"the default workspace plus an echo server\"\nextends = \"default\"\n\n[[server]]\nname = \"echo\"\nimage = \"box-base:bookworm\"\ncommand = [\"cat\"]\ndescription = \"echoes what it is sent\"\nlocal_userland = \"host\"\n",
    )
    .unwrap();
    for backend in backends() {
        let instance = format!("e2e-server-{backend}-{}", std::process::id());
        let workspace = tempfile::tempdir().unwrap();
        let mut served = serve(
            backend,
            &instance,
            workspace.path(),
            &[
                "--profiles",
                profiles.path().to_str().unwrap(),
                "--profile",
                "with-echo",
            ],
        );
        if backend == "docker" {
            assert_eq!(
                containers(&instance, None).await.len(),
                2,
                "workspace and server units"
            );
        }
        served.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "agentworkspace/servers.list", "params": {}}));
        let listed = tokio::task::block_in_place(|| served.answer(1, Duration::from_secs(30)));
        assert_eq!(
            listed["result"]["servers"][0]["name"],
            json!("echo"),
            "{backend}: {listed}"
        );
        served.send(
            &json!({"jsonrpc": "2.0", "id": 2, "method": "agentworkspace/servers.start",
            "params": {"name": "echo"}}),
        );
        let started = tokio::task::block_in_place(|| served.answer(2, Duration::from_secs(30)));
        let id = started["result"]["id"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(
            id.contains(':'),
            "{backend}: a server process id is namespaced by its unit: {started}"
        );
        // A process of the workspace unit gets a plain id of its own: the two never collide.
        served.send(
            &json!({"jsonrpc": "2.0", "id": 3, "method": "agentworkspace/process.start",
            "params": {"args": ["cat"]}}),
        );
        let local = tokio::task::block_in_place(|| served.answer(3, Duration::from_secs(30)));
        assert_ne!(local["result"]["id"], json!(id), "{backend}: {local}");
        served.send(
            &json!({"jsonrpc": "2.0", "id": 4, "method": "agentworkspace/process.write",
            "params": {"id": id, "data": "aGVsbG8gc2VydmVyCg=="}}),
        );
        let wrote = tokio::task::block_in_place(|| served.answer(4, Duration::from_secs(30)));
        assert!(wrote.get("result").is_some(), "{backend}: {wrote}");
        served.send(
            &json!({"jsonrpc": "2.0", "id": 5, "method": "agentworkspace/process.read",
            "params": {"id": id, "fd": 1}}),
        );
        let read = tokio::task::block_in_place(|| served.answer(5, Duration::from_secs(30)));
        assert_eq!(
            read["result"]["data"],
            json!("aGVsbG8gc2VydmVyCg=="),
            "{backend}: {read}"
        );
        let status = tokio::task::block_in_place(|| served.hang_up());
        assert!(status.success(), "{backend}: {status}");
        if backend == "docker" {
            assert_eq!(containers(&instance, None).await, Vec::<String>::new());
        }
    }
}

/// Issue 13: `echo hi | box run -- cat` prints `hi`, `box run true` needs no
/// `--`, and `-e` sets a variable the profile lets through, on every backend.
#[test]
fn box_run_forwards_stdin_and_takes_variables_on_every_backend() {
    use std::io::Write as _;
    for backend in backends() {
        let workspace = tempfile::tempdir().unwrap();
        let mut child = Command::new(box_bin())
            .args(["run", "--backend", backend, "--workspace"])
            .arg(workspace.path())
            .args(["--", "cat"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // More than one write's worth, so stdin is forwarded in pieces.
        let big = "0123456789abcdef".repeat(16 << 10);
        let mut stdin = child.stdin.take().unwrap();
        let input = format!("hi\n{big}\n");
        let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
        let output = child.wait_with_output().unwrap();
        writer.join().unwrap().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{backend}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert_eq!(stdout, format!("hi\n{big}\n"), "{backend}");

        let output = Command::new(box_bin())
            .args(["run", "--backend", backend, "--workspace"])
            .arg(workspace.path())
            .args([
                "-e",
                "LANG=C.UTF-8",
                "sh",
                "-c",
                "echo \"lang=$LANG\"; exit 4",
            ])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert_eq!(
            output.status.code(),
            Some(4),
            "{backend}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&output.stdout), "lang=C.UTF-8\n");

        // A command that never reads its input ends; box does not wait on stdin.
        let mut child = Command::new(box_bin())
            .args(["run", "--backend", backend, "--workspace"])
            .arg(workspace.path())
            .arg("true")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let open_stdin = child.stdin.take();
        let output = child.wait_with_output().unwrap();
        drop(open_stdin);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{backend}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// `printf INPUT | timeout 60 box run -t ARGS` on `backend`: its exit code
/// (124 when it hung until `timeout` ended it) and its output.
fn box_run_t_piped(backend: &str, workspace: &Path, input: &str, args: &[&str]) -> (i32, String) {
    let mut child = Command::new("timeout")
        .arg("60")
        .arg(box_bin())
        .args(["run", "--backend", backend, "--workspace"])
        .arg(workspace)
        .arg("-t")
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).unwrap();
    drop(stdin);
    let output = child.wait_with_output().unwrap();
    let text = format!(
        "{}\nstderr: {}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code().unwrap_or(-1), text)
}

/// Issue 22, item 9: `echo 'echo hi' | box run -t bash` runs the line and
/// ends (the end of box's stdin reaches the command's terminal as ^D on an
/// empty line, read as bash's line editor reads it), and a last line without
/// its newline still ends `cat` (^D typed twice: the first only hands over
/// the partial line). Several rounds: whether the ^D was typed before bash
/// took the terminal out of line mode was a race.
#[test]
fn box_run_t_with_piped_stdin_ends_on_every_backend() {
    for backend in backends() {
        let workspace = tempfile::tempdir().unwrap();
        for round in 0..3 {
            let (status, output) =
                box_run_t_piped(backend, workspace.path(), "echo hi\n", &["bash"]);
            assert_eq!(status, 0, "{backend}, bash, round {round}: {output}");
            assert!(
                // A line of its own (bash may put escape sequences before it).
                output.split(['\r', '\n']).any(|part| part == "hi"),
                "{backend}, bash, round {round}: {output}"
            );
            let (status, output) = box_run_t_piped(backend, workspace.path(), "echo hi", &["cat"]);
            assert_eq!(status, 0, "{backend}, cat, round {round}: {output}");
            assert!(
                output.contains("echo hi"),
                "{backend}, cat, round {round}: {output}"
            );
        }
    }
}

/// Issue 22, item 10: SIGINT (Ctrl-C) or SIGTERM to `box run sleep` once the
/// command runs: box exits 130 or 143 (as `docker run` does), and by then its
/// unit is gone (docker: no container of the run's own profile; local: no
/// sandbox helper of the run's workspace; on both, not the command), and its
/// stderr has no WARN or ERROR line (nothing of the executor's internals).
#[test]
fn an_interrupted_box_run_exits_quietly_with_its_unit_removed_on_every_backend() {
    use nix::sys::signal::{Signal, kill};
    for backend in backends() {
        for (signal, code) in [(Signal::SIGINT, 130), (Signal::SIGTERM, 143)] {
            let what = format!("{backend}, {signal}");
            // A profile of its own: its docker units carry its name.
            let name = format!("intr-{}-{}", std::process::id(), signal as i32);
            let profiles = lease_profiles(&name, "30s");
            let workspace = tempfile::tempdir().unwrap();
            // Another user's workspace: a root caller's unit then runs as
            // that user, so the only WARN a root caller could see (uid 0) is
            // not in the way of "no noise".
            if nix::unistd::geteuid().is_root() {
                std::os::unix::fs::chown(workspace.path(), Some(1000), Some(1000)).unwrap();
            }
            let marker = format!("96{}{}", std::process::id(), signal as i32);
            let mut child = Command::new(box_bin())
                .args([
                    "run",
                    "--backend",
                    backend,
                    "--profile",
                    &name,
                    "--profiles",
                ])
                .arg(profiles.path())
                .arg("--workspace")
                .arg(workspace.path())
                .args(["--", "sleep", &marker])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            assert!(
                until_marker(&marker, Duration::from_secs(60)),
                "{what}: the command never started"
            );
            let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
            kill(pid, signal).unwrap();
            // Bounded, so a box that never exits fails the test instead of hanging it.
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            let status = loop {
                if let Some(status) = child.try_wait().unwrap() {
                    break status;
                }
                if std::time::Instant::now() > deadline {
                    let _ = child.kill();
                    panic!("{what}: box run did not exit within 60 s of the signal");
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            let mut left: Vec<String> = sleeps_with(&marker)
                .into_iter()
                .map(|pid| format!("the command, process {pid}"))
                .collect();
            if backend == "docker" {
                left.extend(containers_labelled(&format!("box.profile={name}")));
            } else {
                let root = format!("--root {} ", workspace.path().display());
                for entry in std::fs::read_dir("/proc").unwrap().flatten() {
                    let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                        continue;
                    };
                    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
                    if cmdline.contains(" sandbox ") && cmdline.contains(&root) {
                        left.push(format!("helper {}: {cmdline}", entry.file_name().display()));
                    }
                }
            }
            let mut stderr = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
            if backend == "docker" && !left.is_empty() {
                let _ = Command::new("docker")
                    .args(["rm", "-f"])
                    .args(containers_labelled(&format!("box.profile={name}")))
                    .output();
            }
            assert_eq!(status.code(), Some(code), "{what}: {stderr}");
            assert_eq!(left, Vec::<String>::new(), "{what}: left at exit; {stderr}");
            assert!(
                !stderr.contains("WARN") && !stderr.contains("ERROR"),
                "{what}: noise on stderr: {stderr}"
            );
        }
    }
}

/// An HTTPS server on the host's loopback (`openssl s_server -www`, a self-signed
/// certificate for `name` made in `dir`): its port and the process, killed on drop.
fn https_server(dir: &Path, name: &str) -> (u16, KillOnDrop) {
    let (key, cert) = (dir.join("tls.key"), dir.join("tls.crt"));
    let made = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .arg("-subj")
        .arg(format!("/CN={name}"))
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
    let child = Command::new("openssl")
        .args(["s_server", "-www", "-quiet", "-accept"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("-cert")
        .arg(&cert)
        .arg("-key")
        .arg(&key)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Ready once it accepts.
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    (port, KillOnDrop(child))
}

/// A child process killed when dropped.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Run `command` with the bash tool; the text of its answer.
fn bash(served: &mut Served, id: i64, command: &str) -> String {
    served.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "bash", "arguments": {"command": command}}}));
    let answer = served.answer(id, Duration::from_secs(60));
    answer["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("bash {command}: {answer}"))
        .to_owned()
}

/// An image with no bash (FROM scratch plus a static busybox): box's
/// executor still serves it (it needs nothing from the image), the file tools
/// work, and the bash tool says that the image has no bash instead of a bare
/// "No such file or directory".
#[test]
fn a_unit_without_bash_says_so_and_its_other_tools_work() {
    if !backends().contains(&"docker") {
        return;
    }
    let profiles = tempfile::tempdir().unwrap();
    std::fs::write(
        profiles.path().join("p.toml"),
        "[workspace]\nimage = \"box-test-scratch:latest\"\n[security]\nlandlock = \"best-effort\"\n",
    )
    .unwrap();
    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(workspace.path().join("hello.txt"), "hi from the host\n").unwrap();
    let instance = format!("e2e-nobash-{}", std::process::id());
    let profiles_arg = profiles.path().to_str().unwrap();
    let mut served = serve(
        "docker",
        &instance,
        workspace.path(),
        &["--profiles", profiles_arg, "--profile", "p"],
    );
    let said = bash(&mut served, 1, "echo hi");
    assert!(said.contains("this unit's image has no bash"), "{said}");
    served.send(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "read", "arguments": {"path": "hello.txt"}}}));
    let read = served.answer(2, Duration::from_secs(60));
    assert!(
        read["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|text| text.contains("hi from the host")),
        "{read}"
    );
    assert!(served.hang_up().success());
}

/// Issue 10's egress allowlist, from the attacker's side: a unit whose profile
/// allows one name reaches it through curl and Python's urllib (through the
/// proxy the host wired in), and reaches nothing else: a name not allowed, a raw
/// IP, the metadata address, a direct connection that ignores the proxy, a DNS
/// query, a TLS server name that differs from the CONNECT host. Every attempt
/// the proxy saw is one audit line; `box/network.set` narrows and restores.
#[tokio::test(flavor = "multi_thread")]
async fn an_egress_unit_reaches_only_what_its_profile_allows() {
    for backend in backends() {
        egress_reaches_only_what_the_profile_allows(backend).await;
    }
}

/// The programs the egress checks run inside a unit. A local unit runs the
/// host's own (its `PATH` is the standard one): a missing one fails the test
/// loudly, it never skips.
fn require_host_programs(programs: &[&str]) {
    for program in programs {
        let found = ["/usr/local/bin", "/usr/bin", "/bin"]
            .iter()
            .any(|dir| Path::new(dir).join(program).is_file());
        assert!(
            found,
            "the local backend's egress test runs {program} inside the unit, and this host has none in /usr/local/bin, /usr/bin or /bin: install it"
        );
    }
}

async fn egress_reaches_only_what_the_profile_allows(backend: &str) {
    if backend == "local" {
        require_host_programs(&["curl", "python3", "head"]);
    }
    let port = http_server("hello-egress");
    let profiles = tempfile::tempdir().unwrap();
    let (tls_port, _tls_server) = https_server(profiles.path(), "allowed.test");
    std::fs::write(
        profiles.path().join("egress-test.toml"),
        format!(
            r#"description = "egress to one pinned name"
extends = "default"

[workspace]
image = "box-test-tools:latest"
local_userland = "host"

[network]
mode = "egress"
allow = ["allowed.test:{port}", "allowed.test:{tls_port}", "meta.test"]
hosts = {{ "allowed.test" = "127.0.0.1", "denied.test" = "127.0.0.1", "meta.test" = "169.254.169.254" }}
max_connections = 64
bandwidth = "50MiB"

[operator]
allow_dangerous = ["private-destinations"]
"#
        ),
    )
    .unwrap();
    let audit = profiles.path().join("audit.jsonl");
    let instance = format!("e2e-egress-{backend}-{}", std::process::id());
    let workspace = tempfile::tempdir().unwrap();
    let mut served = tokio::task::block_in_place(|| {
        serve(
            backend,
            &instance,
            workspace.path(),
            &[
                "--profiles",
                profiles.path().to_str().unwrap(),
                "--profile",
                "egress-test",
                "--audit",
                audit.to_str().unwrap(),
            ],
        )
    });
    let envelope = &served.initialized["result"]["capabilities"]["experimental"]["io.github.christopherdavenport.dax/executor"]
        ["box"]["units"][0];
    assert_eq!(envelope["network"]["mode"], json!("egress"), "{envelope}");
    assert_eq!(
        envelope["network"]["allow"],
        json!([
            format!("allowed.test:{port}"),
            format!("allowed.test:{tls_port}"),
            "meta.test"
        ])
    );
    assert_eq!(envelope["network"]["proxy"], json!("http://127.0.0.1:3128"));
    assert_eq!(
        envelope["network"]["egressLimits"],
        json!({"maxConnections": 64, "bytesPerSecond": 50 << 20})
    );
    if backend == "local" {
        // The boundary is the unit's own network namespace (only lo); IP
        // sockets are allowed in it, landlock limits TCP to the bridge's port.
        assert_eq!(envelope["network"]["namespace"], json!(true), "{envelope}");
        assert_eq!(envelope["network"]["loopbackUp"], json!(true), "{envelope}");
        assert_eq!(
            envelope["network"]["ipSocketsDenied"],
            json!(false),
            "{envelope}"
        );
        if box_confine::landlock_abi() >= 4 {
            assert_eq!(
                envelope["network"]["landlockTcpPorts"],
                json!([3128]),
                "{envelope}"
            );
        }
    }

    let allowed = format!("http://allowed.test:{port}/");
    let checks = tokio::task::block_in_place(|| {
        let mut out = Vec::new();
        let mut id = 10;
        let mut run = |command: String| {
            id += 1;
            bash(&mut served, id, &command)
        };
        out.push(("curl", run(format!("curl -sS -m 10 {allowed}"))));
        // HTTPS: CONNECT, then TLS naming the CONNECT host (self-signed, so -k).
        out.push((
            "https",
            run(format!(
                "curl -sSk -m 10 https://allowed.test:{tls_port}/ | head -c 2000"
            )),
        ));
        out.push((
            "https urllib",
            run(format!(
                "python3 -c 'import ssl, urllib.request; print(urllib.request.urlopen(\"https://allowed.test:{tls_port}/\", timeout=10, context=ssl._create_unverified_context()).status)'"
            )),
        ));
        out.push((
            "urllib",
            run(format!(
                "python3 -c 'import urllib.request; print(urllib.request.urlopen(\"{allowed}\", timeout=10).read().decode())'"
            )),
        ));
        out.push((
            "denied name",
            run(format!("curl -sS -m 10 -o /dev/null -w '%{{http_code}}' http://denied.test:{port}/; echo \" exit=$?\"")),
        ));
        out.push((
            "raw ip",
            run(format!("curl -sS -m 10 --noproxy '' -x http://127.0.0.1:3128 -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{port}/; echo \" exit=$?\"")),
        ));
        out.push((
            "metadata",
            run("curl -sS -m 10 --noproxy '' -x http://127.0.0.1:3128 -o /dev/null -w '%{http_code}' http://169.254.169.254/latest/meta-data/; echo \" exit=$?\"".to_owned()),
        ));
        // Allowed by name, pinned to the metadata address: refused by address even
        // though the operator allowed private destinations.
        out.push((
            "metadata by name",
            run("curl -sS -m 10 -o /dev/null -w '%{http_code}' http://meta.test/latest/meta-data/; echo \" exit=$?\"".to_owned()),
        ));
        out.push((
            "direct",
            run(format!("curl -sS -m 10 --noproxy '*' http://allowed.test:{port}/ 2>&1; curl -sS -m 10 --noproxy '*' http://10.0.0.1/ 2>&1; echo \" exit=$?\"")),
        ));
        out.push((
            "dns",
            run("python3 -c 'import socket; socket.getaddrinfo(\"allowed.test\", 80)' 2>&1 | tail -1".to_owned()),
        ));
        // A CONNECT to the allowed name whose TLS ClientHello names another.
        out.push((
            "sni",
            run(format!(
                "python3 - <<'EOF'\nimport socket, ssl\ns = socket.create_connection(('127.0.0.1', 3128), timeout=10)\ns.sendall(b'CONNECT allowed.test:{port} HTTP/1.1\\r\\nHost: allowed.test:{port}\\r\\n\\r\\n')\nprint(s.recv(1024).split(b'\\r\\n')[0].decode())\nctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE\ntry:\n    ctx.wrap_socket(s, server_hostname='denied.test').do_handshake()\n    print('handshake done')\nexcept Exception as e:\n    print('tls refused:', type(e).__name__)\nEOF"
            )),
        ));
        out
    });
    let checks = checks
        .into_iter()
        .map(|(check, text)| (check, format!("{backend}: {text}")))
        .collect::<Vec<_>>();
    let get = |name: &str| {
        checks
            .iter()
            .find(|(check, _)| *check == name)
            .map(|(_, text)| text.clone())
            .unwrap()
    };
    assert!(get("curl").contains("hello-egress"), "curl: {checks:?}");
    assert!(get("https").contains("s_server"), "https: {checks:?}");
    assert!(
        get("https urllib").contains("200"),
        "https urllib: {checks:?}"
    );
    assert!(get("urllib").contains("hello-egress"), "urllib: {checks:?}");
    assert!(get("denied name").contains("403"), "{checks:?}");
    assert!(get("raw ip").contains("403"), "{checks:?}");
    assert!(get("metadata").contains("403"), "{checks:?}");
    assert!(get("metadata by name").contains("403"), "{checks:?}");
    assert!(!get("direct").contains("hello-egress"), "{checks:?}");
    assert!(
        get("direct").contains("resolve") && get("direct").contains("exit=7"),
        "a direct connection finds no resolver and no route: {checks:?}"
    );
    assert!(get("dns").contains("gaierror"), "{checks:?}");
    assert!(get("sni").contains("200"), "{checks:?}");
    assert!(
        get("sni").contains("tls refused") && !get("sni").contains("handshake done"),
        "{checks:?}"
    );

    // Narrowed to nothing, then restored; never widened past the profile.
    let set = |served: &mut Served, id: i64, params: Value| {
        served.send(
            &json!({"jsonrpc": "2.0", "id": id, "method": "box/network.set", "params": params}),
        );
        served.answer(id, Duration::from_secs(30))
    };
    let (narrowed, after_narrowing, widened, restored, after_restoring) =
        tokio::task::block_in_place(|| {
            let narrowed = set(&mut served, 50, json!({"allow": []}));
            let after = bash(
                &mut served,
                51,
                &format!("curl -sS -m 10 -o /dev/null -w '%{{http_code}}' {allowed}"),
            );
            let widened = set(
                &mut served,
                52,
                json!({"allow": ["allowed.test", "other.test"]}),
            );
            let restored = set(
                &mut served,
                53,
                json!({"allow": [format!("allowed.test:{port}")]}),
            );

            let again = bash(&mut served, 54, &format!("curl -sS -m 10 {allowed}"));
            (narrowed, after, widened, restored, again)
        });
    assert_eq!(narrowed["result"]["allow"], json!([]), "{narrowed}");
    assert!(after_narrowing.contains("403"), "{after_narrowing}");
    assert_eq!(widened["error"]["code"], json!(-32602), "{widened}");
    assert!(
        widened["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("bound"),
        "{widened}"
    );
    assert_eq!(
        restored["result"]["allow"],
        json!([format!("allowed.test:{port}")]),
        "{restored}"
    );
    assert!(
        after_restoring.contains("hello-egress"),
        "{after_restoring}"
    );

    // Issue 27: what the unit's egress carried, counted per connection.
    let stats = tokio::task::block_in_place(|| {
        served
            .send(&json!({"jsonrpc": "2.0", "id": 60, "method": "box/units.stats", "params": {}}));
        served.answer(60, Duration::from_secs(30))
    });
    let unit = &stats["result"]["units"][0];
    assert!(
        unit["egressConnections"].as_u64().unwrap_or(0) >= 5,
        "{backend}: {stats}"
    );
    // Six answers of hello-egress and two TLS pages at least came down.
    assert!(
        unit["egressBytesDown"].as_u64().unwrap_or(0) >= 6 * "hello-egress".len() as u64,
        "{backend}: {stats}"
    );
    assert!(
        unit["egressBytesUp"].as_u64().unwrap_or(0) > 0,
        "{backend}: {stats}"
    );

    let status = tokio::task::block_in_place(|| served.hang_up());
    assert!(status.success(), "{status}");
    let lines: Vec<Value> = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .filter(|line: &Value| line["kind"] == json!("egress"))
        .collect();
    let seen = |host: &str, outcome: &str| {
        lines.iter().any(|line| {
            line["host"] == json!(host) && line["decision"]["outcome"] == json!(outcome)
        })
    };
    assert!(seen("allowed.test", "allowed"), "{lines:?}");
    assert!(seen("denied.test", "refused"), "{lines:?}");
    assert!(seen("127.0.0.1", "refused"), "{lines:?}");
    assert!(seen("169.254.169.254", "refused"), "{lines:?}");
    let refused_for = |reason: &str| {
        lines
            .iter()
            .any(|line| line["decision"]["reason"] == json!(reason))
    };
    assert!(refused_for("sni-mismatch"), "{lines:?}");
    assert!(refused_for("forbidden-address"), "{lines:?}");
    assert!(refused_for("not-allowed"), "{lines:?}");
    assert!(
        lines
            .iter()
            .all(|line| line["session"].is_string() && line["unit"] == json!("workspace")),
        "{lines:?}"
    );
    if backend == "docker" {
        assert_eq!(containers(&instance, None).await, Vec::<String>::new());
    }
}

/// Read a process's stdout (long polls) until `done` holds for what was read.
fn read_process_until(
    served: &mut Served,
    id: &str,
    first_request: i64,
    within: Duration,
    done: impl Fn(&str) -> bool,
) -> String {
    use base64::Engine as _;
    let deadline = std::time::Instant::now() + within;
    let mut text = String::new();
    let mut request = first_request;
    while !done(&text) {
        assert!(
            std::time::Instant::now() < deadline,
            "{id}: not done within {within:?}; read so far: {text}"
        );
        request += 1;
        served.send(
            &json!({"jsonrpc": "2.0", "id": request, "method": "agentworkspace/process.read",
            "params": {"id": id, "fd": 1}}),
        );
        let read = served.answer(request, within);
        assert!(read.get("result").is_some(), "{id}: {read}");
        if let Some(data) = read["result"]["data"].as_str() {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(data)
                .unwrap();
            text.push_str(&String::from_utf8_lossy(&bytes));
        }
        assert!(
            read["result"]["eof"] != json!(true) || done(&text),
            "{id}: the server ended; it wrote: {text}"
        );
    }
    text
}

/// Issue 10: the shipped `fetch` example runs end to end. Its image
/// (`box image build fetch`) runs the reference MCP fetch server in a server
/// unit; the client starts it with `servers.start` and speaks MCP to it through
/// the process methods; the server fetches an allowed page through the unit's
/// egress proxy and is refused one the list does not name, both audited.
#[tokio::test(flavor = "multi_thread")]
async fn the_fetch_example_serves_an_allowed_page_and_is_refused_another() {
    use base64::Engine as _;
    if !backends().contains(&"docker") {
        return;
    }
    let port = http_server("<html><body><p>hello from the allowed page</p></body></html>");
    let profiles = tempfile::tempdir().unwrap();
    // The shipped profile, with its server's network pointed at a test server:
    // a `[[server]]` of the same name replaces the parent's, so the image and
    // command are the shipped ones, repeated.
    std::fs::write(
        profiles.path().join("fetch-test.toml"),
        format!(
            r#"description = "the fetch example against a pinned test name"
extends = "fetch"

[[server]]
name = "fetch"
image = "box-fetch:latest"
command = ["/opt/fetch/bin/mcp-server-fetch"]
network = {{ mode = "egress", allow = ["allowed.test:{port}"], hosts = {{ "allowed.test" = "127.0.0.1", "denied.test" = "127.0.0.1" }} }}

[operator]
allow_dangerous = ["private-destinations"]
"#
        ),
    )
    .unwrap();
    let shipped = Command::new(box_bin())
        .args(["profile", "show", "fetch", "--json"])
        .output()
        .unwrap();
    let shipped: Value = serde_json::from_slice(&shipped.stdout).unwrap();
    assert_eq!(
        shipped["servers"][0]["command"],
        json!(["/opt/fetch/bin/mcp-server-fetch"]),
        "the test repeats the shipped command: {shipped}"
    );
    let audit = profiles.path().join("audit.jsonl");
    let instance = format!("e2e-fetch-{}", std::process::id());
    let workspace = tempfile::tempdir().unwrap();
    let mut served = tokio::task::block_in_place(|| {
        serve(
            "docker",
            &instance,
            workspace.path(),
            &[
                "--profiles",
                profiles.path().to_str().unwrap(),
                "--profile",
                "fetch-test",
                "--audit",
                audit.to_str().unwrap(),
            ],
        )
    });
    let text = tokio::task::block_in_place(|| {
        served.send(
            &json!({"jsonrpc": "2.0", "id": 1, "method": "agentworkspace/servers.start",
            "params": {"name": "fetch"}}),
        );
        let started = served.answer(1, Duration::from_secs(30));
        let id = started["result"]["id"]
            .as_str()
            .unwrap_or_else(|| panic!("servers.start: {started}"))
            .to_owned();
        let lines = [
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "fetch-e2e", "version": "1"}}}),
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
                "name": "fetch", "arguments": {"url": format!("http://allowed.test:{port}/")}}}),
            json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
                "name": "fetch", "arguments": {"url": format!("http://denied.test:{port}/")}}}),
        ];
        let mut data = String::new();
        for line in lines {
            data.push_str(&line.to_string());
            data.push('\n');
        }
        served.send(
            &json!({"jsonrpc": "2.0", "id": 2, "method": "agentworkspace/process.write",
            "params": {"id": id, "data": base64::engine::general_purpose::STANDARD.encode(data)}}),
        );
        let wrote = served.answer(2, Duration::from_secs(30));
        assert!(wrote.get("result").is_some(), "{wrote}");
        // The server answers the two fetches in whichever order they finish.
        read_process_until(&mut served, &id, 100, Duration::from_secs(120), |text| {
            let answered = |id: i64| {
                text.lines().any(|line| {
                    serde_json::from_str::<Value>(line)
                        .is_ok_and(|message| message["id"] == json!(id))
                })
            };
            answered(2) && answered(3)
        })
    });
    let answers: Vec<Value> = text
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    let answer = |id: i64| {
        answers
            .iter()
            .find(|message| message["id"] == json!(id))
            .unwrap_or_else(|| panic!("no answer {id} from the fetch server: {text}"))
    };
    let allowed = answer(2);
    assert_ne!(allowed["result"]["isError"], json!(true), "{allowed}");
    assert!(
        allowed.to_string().contains("hello from the allowed page"),
        "{allowed}"
    );
    let denied = answer(3);
    assert!(
        denied["result"]["isError"] == json!(true) || denied.get("error").is_some(),
        "a name the list does not allow is an error: {denied}"
    );
    assert!(
        !denied.to_string().contains("hello from the allowed page"),
        "{denied}"
    );
    let status = tokio::task::block_in_place(|| served.hang_up());
    assert!(status.success(), "{status}");
    let audit = std::fs::read_to_string(&audit).unwrap();
    let egress: Vec<Value> = audit
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["kind"] == json!("egress"))
        .collect();
    assert!(
        egress
            .iter()
            .any(|line| line["host"] == json!("allowed.test")
                && line["decision"]["outcome"] == json!("allowed")
                && line["unit"] == json!("fetch")),
        "{audit}"
    );
    assert!(
        egress
            .iter()
            .any(|line| line["host"] == json!("denied.test")
                && line["decision"]["outcome"] == json!("refused")),
        "{audit}"
    );
    assert_eq!(containers(&instance, None).await, Vec::<String>::new());
}

/// The processes on this machine whose command line is `sleep MARKER`.
fn sleeps_with(marker: &str) -> Vec<u32> {
    let wanted = format!("sleep {marker}");
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            (cmdline.trim_end() == wanted).then_some(pid)
        })
        .collect()
}

/// Issue 12, item 4: a local unit holds a lease as a docker unit does. The
/// envelope reports it; a live host keeps its unit past several leases; a
/// host stopped (SIGSTOP) past the lease loses it (the sandbox helper ends
/// every process of the unit, a background process included), and once
/// continued the host answers the next call with the unit's end naming the
/// lapsed lease, never a hang. Calls in flight at the freeze whose commands
/// finished before the lapse are answered with their results, the others
/// as unknown outcome (issue 22, item 5).
#[test]
fn local_a_host_stopped_past_the_lease_loses_its_unit_and_says_so() {
    use nix::sys::signal::{Signal, kill};
    let profiles = tempfile::tempdir().unwrap();
    std::fs::write(
        profiles.path().join("short.toml"),
        "extends = \"default\"\n\n[lifecycle]\nlease = \"2s\"\n",
    )
    .unwrap();
    let instance = format!("e2e-lease-{}", std::process::id());
    let workspace = tempfile::tempdir().unwrap();
    let mut served = serve(
        "local",
        &instance,
        workspace.path(),
        &[
            "--profiles",
            profiles.path().to_str().unwrap(),
            "--profile",
            "short",
        ],
    );
    let units = served.initialized["result"]["capabilities"]["experimental"]
        ["io.github.christopherdavenport.dax/executor"]["box"]["units"]
        .clone();
    assert_eq!(
        units[0]["lifecycle"],
        json!({"leaseMs": 2000}),
        "the envelope reports the lease: {units}"
    );
    // A marker process in the unit, detached from the call.
    let marker = format!("97{}", std::process::id());
    served.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "bash", "arguments": {
            "command": format!("setsid sleep {marker} >/dev/null 2>&1 < /dev/null &")}}}));
    let answer = served.answer(1, Duration::from_secs(30));
    assert!(answer.get("result").is_some(), "{answer}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while sleeps_with(&marker).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the marker never started"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Past two leases: a live host renews, its unit stays.
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(sleeps_with(&marker).len(), 1, "a renewed unit lives on");
    served.send(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "bash", "arguments": {"command": "echo still"}}}));
    let answer = served.answer(2, Duration::from_secs(30));
    assert!(answer.to_string().contains("still"), "{answer}");

    // Issue 22, item 5: calls in flight when the host freezes; those that
    // finish before the lease lapses are answered with their results.
    let calls = FrozenCalls {
        first: 10,
        count: 5,
    };
    calls.send(|message| served.send(message));
    calls.wait_started(workspace.path());

    let pid = nix::unistd::Pid::from_raw(served.child.id() as i32);
    kill(pid, Signal::SIGSTOP).unwrap();
    let stopped = std::time::Instant::now();
    let gone = loop {
        if sleeps_with(&marker).is_empty() {
            break Some(stopped.elapsed());
        }
        if stopped.elapsed() > Duration::from_secs(2 + 2) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    kill(pid, Signal::SIGCONT).unwrap();
    let took = gone.unwrap_or_else(|| {
        panic!("the unit's processes were still there 4 s into a 2 s lease of a stopped host")
    });
    eprintln!("the stopped host's local unit was gone {took:?} after the stop");
    calls.check(workspace.path(), |wanted| {
        served
            .wait_for(Duration::from_secs(30), wanted)
            .expect("the calls in flight at the freeze are answered")
    });
    served.send(&json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "bash", "arguments": {"command": "echo hi"}}}));
    let answer = served.answer(3, Duration::from_secs(30));
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("unit workspace"), "{answer}");
    assert!(message.contains("lease lapsed"), "{answer}");
    assert!(served.hang_up().success());
}

/// A directory holding one profile, `NAME.toml`: `default` with a lease of
/// `lease`.
fn lease_profiles(name: &str, lease: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(format!("{name}.toml")),
        format!("extends = \"default\"\n\n[lifecycle]\nlease = \"{lease}\"\n"),
    )
    .unwrap();
    dir
}

/// Wait until `present` is empty, for at most `wait`: how long it took, or
/// what was still there.
fn until_empty<T>(wait: Duration, present: impl Fn() -> Vec<T>) -> Result<Duration, Vec<T>> {
    let start = std::time::Instant::now();
    loop {
        let left = present();
        if left.is_empty() {
            return Ok(start.elapsed());
        }
        if start.elapsed() > wait {
            return Err(left);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Wait until a `sleep MARKER` runs, for at most `wait`.
fn until_marker(marker: &str, wait: Duration) -> bool {
    let start = std::time::Instant::now();
    while sleeps_with(marker).is_empty() {
        if start.elapsed() > wait {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

/// The containers, running or not, labelled `label` (the docker CLI: no box
/// process involved).
fn containers_labelled(label: &str) -> Vec<String> {
    let output = Command::new("docker")
        .args(["ps", "-aq", "--no-trunc", "--filter"])
        .arg(format!("label={label}"))
        .output()
        .unwrap();
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Issue 12: `kill -9` of `box serve` leaves nothing of its local unit
/// within the lease plus 5 s (the sandbox helper ends it when no renewal
/// comes, then itself): the process table is polled for a marker started in
/// the unit, detached from its call, and for the helper. `box gc` right
/// after the kill leaves the unit (its lease may be live), and once it has
/// ended removes its run directory.
#[test]
fn local_a_killed_hosts_unit_leaves_no_process() {
    use nix::sys::signal::{Signal, kill};
    let profiles = lease_profiles("short", "3s");
    let instance = format!("e2e-kill9-{}", std::process::id());
    let workspace = tempfile::tempdir().unwrap();
    let mut served = serve(
        "local",
        &instance,
        workspace.path(),
        &[
            "--profiles",
            profiles.path().to_str().unwrap(),
            "--profile",
            "short",
        ],
    );
    let marker = format!("96{}", std::process::id());
    served.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "bash", "arguments": {
            "command": format!("setsid sleep {marker} >/dev/null 2>&1 < /dev/null &")}}}));
    let answer = served.answer(1, Duration::from_secs(30));
    assert!(answer.get("result").is_some(), "{answer}");
    assert!(
        until_marker(&marker, Duration::from_secs(10)),
        "the marker never started"
    );
    let id = served.initialized["result"]["capabilities"]["experimental"]
        ["io.github.christopherdavenport.dax/executor"]["box"]["units"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    kill(
        nix::unistd::Pid::from_raw(served.child.id() as i32),
        Signal::SIGKILL,
    )
    .unwrap();
    served.child.wait().unwrap();
    // `box units` lists the dead host's local unit, and says its host is dead.
    let listed = std::process::Command::new(box_bin())
        .args(["units", "ls", "--json"])
        .output()
        .unwrap();
    assert!(listed.status.success(), "{listed:?}");
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let ours = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|unit| unit["instance"] == json!(instance))
        .unwrap_or_else(|| panic!("box units ls does not list the local unit: {listed}"));
    assert_eq!(ours["id"], json!(id), "{ours}");
    assert_eq!(ours["backend"], "local", "{ours}");
    let inspected = std::process::Command::new(box_bin())
        .args(["units", "inspect", "--json", &id])
        .output()
        .unwrap();
    assert!(inspected.status.success(), "{inspected:?}");
    let inspected: Value = serde_json::from_slice(&inspected.stdout).unwrap();
    assert_eq!(
        (&inspected["backend"], &inspected["host"]),
        (&json!("local"), &json!("dead")),
        "{inspected}"
    );
    // The unit's helper, which outlives its host by the lease.
    let helper = inspected["pid"]
        .as_u64()
        .unwrap_or_else(|| panic!("no helper pid: {inspected}"));
    let gc = || {
        std::process::Command::new(box_bin())
            .args(["gc", "--instance", &instance])
            .output()
            .unwrap()
    };
    // Right after the kill the unit's lease may be live: gc sees the unit
    // (from its run directory) and leaves it to its helper.
    let out = gc();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("left {}", &id[..12])), "{stderr}");
    assert!(
        String::from_utf8_lossy(&out.stdout).is_empty(),
        "gc removed a unit whose lease may be live: {out:?}"
    );
    match until_empty(Duration::from_secs(3 + 5), || {
        let mut left: Vec<String> = sleeps_with(&marker)
            .into_iter()
            .map(|pid| format!("process {pid}"))
            .collect();
        // No box process is left either: the helper ends with the unit.
        if Path::new(&format!("/proc/{helper}")).exists() {
            left.push(format!("helper {helper}"));
        }
        left
    }) {
        Ok(took) => eprintln!("the killed host's local unit was gone {took:?} after the kill"),
        Err(left) => panic!("processes of the unit left 8 s after its host was killed: {left:?}"),
    }
    // Its helper gone, the unit is listed as ended: gc removes what it left
    // (its run directory; unless another host's start-up sweep, which
    // judges the same way, got there first), and nothing of the instance is
    // listed any more.
    let out = gc();
    assert!(out.status.success(), "{out:?}");
    let backend = boxhost::backend::local::LocalBackend::new(box_bin());
    let listed = tokio::runtime::Runtime::new().unwrap().block_on(async {
        use boxhost::backend::Backend as _;
        backend.list_instance(&instance).await.unwrap()
    });
    assert!(listed.is_empty(), "{listed:?}");
}

/// How a test ends a host the way CI runners and scripts do.
#[derive(Debug, Clone, Copy)]
enum Interrupt {
    /// `timeout -s SIGNAL N box ...`: the signal to box, then to timeout's
    /// process group.
    Timeout(&'static str),
    /// SIGKILL to the host's process group at once (a cancelled CI job).
    GroupKill,
}

/// Issue 12: `box run` and `box serve`, ended by `timeout` (SIGTERM or
/// SIGKILL) or by a SIGKILL of their process group, leave no unit and no
/// process of it once the lease (3 s) has passed: a SIGTERM lets the host
/// remove its units itself, a SIGKILL leaves them to their lease (docker:
/// box's init; local: the sandbox helper, which runs the same supervisor).
fn interrupted_hosts_leave_nothing_after_the_lease(backend: &str) {
    use std::os::unix::process::CommandExt as _;
    // Long enough for a unit to start under load: a docker unit's engine
    // calls take longer than a local one's fork.
    let start_within = if backend == "docker" { 10 } else { 4 };
    let workspace = tempfile::tempdir().unwrap();
    let mut case = 0;
    for host in ["run", "serve"] {
        for interrupt in [
            Interrupt::Timeout("TERM"),
            Interrupt::Timeout("KILL"),
            Interrupt::GroupKill,
        ] {
            case += 1;
            let what = format!("{backend}, box {host}, {interrupt:?}");
            // A profile of its own: its docker units carry its name.
            let name = format!("int-{}-{case}", std::process::id());
            let profiles = lease_profiles(&name, "3s");
            let marker = format!("95{}{case}", std::process::id());
            let mut command = match interrupt {
                Interrupt::Timeout(signal) => {
                    let mut timeout = Command::new("timeout");
                    timeout
                        .args(["-s", signal, &start_within.to_string()])
                        .arg(box_bin());
                    timeout
                }
                Interrupt::GroupKill => {
                    let mut direct = Command::new(box_bin());
                    direct.process_group(0);
                    direct
                }
            };
            command
                .args([host, "--backend", backend, "--profile", &name, "--profiles"])
                .arg(profiles.path())
                .arg("--workspace")
                .arg(workspace.path())
                .env("RUST_LOG", "error")
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            if host == "run" {
                command.args(["--", "sleep", &marker]);
            } else {
                command.args(["--instance", &format!("e2e-{name}")]);
            }
            let mut child = command.spawn().unwrap();
            let mut stdin = child.stdin.take().unwrap();
            if host == "serve" {
                for message in [
                    json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                        "protocolVersion": "2025-06-18", "capabilities": {},
                        "clientInfo": {"name": "end_to_end", "version": "1"}}}),
                    json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
                    json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                        "params": {"name": "bash", "arguments": {
                            "command": format!("sleep {marker}")}}}),
                ] {
                    writeln!(stdin, "{message}").unwrap();
                }
                stdin.flush().unwrap();
            }
            assert!(
                until_marker(&marker, Duration::from_secs(start_within - 1)),
                "{what}: the unit's command never started"
            );
            if let Interrupt::GroupKill = interrupt {
                let group = nix::unistd::Pid::from_raw(-(child.id() as i32));
                nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL).unwrap();
            }
            let status = child.wait().unwrap();
            drop(stdin);
            let label = format!("box.profile={name}");
            let left = until_empty(Duration::from_secs(3 + 5), || {
                let mut left: Vec<String> = sleeps_with(&marker)
                    .into_iter()
                    .map(|pid| format!("process {pid}"))
                    .collect();
                if backend == "docker" {
                    left.extend(containers_labelled(&label));
                }
                left
            });
            match left {
                Ok(took) => eprintln!("{what}: {status}, nothing left {took:?} after its end"),
                Err(left) => {
                    if backend == "docker" {
                        let _ = Command::new("docker")
                            .args(["rm", "-f"])
                            .args(containers_labelled(&label))
                            .output();
                    }
                    panic!("{what}: {status}, left 8 s after its end: {left:?}");
                }
            }
        }
    }
}

#[test]
fn local_interrupted_hosts_leave_nothing_after_the_lease() {
    interrupted_hosts_leave_nothing_after_the_lease("local");
}

#[test]
fn docker_interrupted_hosts_leave_nothing_after_the_lease() {
    if !backends().contains(&"docker") {
        return;
    }
    interrupted_hosts_leave_nothing_after_the_lease("docker");
}

/// A tool call through `box serve`: `Ok(text)`, or `Err(text)` for an
/// error result; a protocol error fails the test.
fn tool(served: &mut Served, name: &str, arguments: Value) -> Result<String, String> {
    let answer = served.call("tools/call", json!({"name": name, "arguments": arguments}));
    let result = &answer["result"];
    let text = result["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{name} {arguments}: {answer}"))
        .to_owned();
    if result["isError"] == json!(true) {
        Err(text)
    } else {
        Ok(text)
    }
}

/// Issue 23, item 8: seed 003's namespace operations, served by the unit's
/// executor under box's own extension, keep their narrow rules on every
/// backend: an existing destination, a directory to remove, a link or a
/// FIFO to copy, a file changed since it was read, a path out of the
/// workspace; hostile names are taken and shown quoted. A `no-fs` session
/// offers none of them.
#[tokio::test(flavor = "multi_thread")]
async fn copy_move_and_remove_keep_their_rules_on_every_backend() {
    for backend in backends() {
        let instance = format!("e2e-namespace-{backend}-{}", std::process::id());
        let workspace = tempfile::tempdir().unwrap();
        let root = workspace.path();
        std::fs::write(root.join("a.txt"), "alpha\n").unwrap();
        std::fs::create_dir_all(root.join("full/inner")).unwrap();
        std::fs::write(root.join("full/inner/keep"), "keep\n").unwrap();
        std::fs::create_dir(root.join("empty")).unwrap();
        std::fs::write(root.join("line\nbreak"), "n\n").unwrap();
        std::fs::write(root.join("-rf"), "dash\n").unwrap();
        std::fs::write(root.join("résumé ✓"), "u\n").unwrap();
        std::os::unix::fs::symlink("a.txt", root.join("link")).unwrap();
        let mut served = tokio::task::block_in_place(|| serve(backend, &instance, root, &[]));
        let result = tokio::task::block_in_place(|| {
            let executor = served.initialized["result"]["capabilities"]["experimental"]
                ["io.github.christopherdavenport.dax/executor"]
                .clone();
            assert_eq!(
                executor["extensions"],
                json!(["dax-coding", "box-namespace"]),
                "{backend}: {executor}"
            );
            for name in ["copy", "move", "remove"] {
                let listed = executor["tools"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|tool| tool["name"] == json!(name))
                    .unwrap_or_else(|| panic!("{backend}: {name} not in {executor}"));
                assert_eq!(
                    listed,
                    &json!({"name": name, "extension": "box-namespace", "facts": true}),
                    "{backend}: not read-only"
                );
            }
            let listed = served.call("tools/list", json!({}));
            let names: Vec<&str> = listed["result"]["tools"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|tool| tool["name"].as_str())
                .collect();
            for name in ["copy", "move", "remove"] {
                assert!(names.contains(&name), "{backend}: {names:?}");
            }

            // Copy: a new file; never over an existing one, never a link, a
            // directory or a FIFO.
            assert_eq!(
                tool(
                    &mut served,
                    "copy",
                    json!({"source": "a.txt", "destination": "b.txt"})
                ),
                Ok("copied a.txt to b.txt (6 bytes)".to_owned())
            );
            assert_eq!(
                std::fs::read_to_string(root.join("b.txt")).unwrap(),
                "alpha\n"
            );
            let refused = tool(
                &mut served,
                "copy",
                json!({"source": "a.txt", "destination": "b.txt"}),
            )
            .unwrap_err();
            assert!(
                refused.starts_with("b.txt already exists"),
                "{backend}: {refused}"
            );
            tool(&mut served, "bash", json!({"command": "mkfifo pipe"})).unwrap();
            for (source, says) in [
                (
                    "link",
                    "link is a symbolic link; copy takes regular files only",
                ),
                (
                    "full",
                    "full is a directory; copy takes regular files only (it is not recursive)",
                ),
                (
                    "pipe",
                    "pipe is not a regular file (a FIFO, socket or device); copy takes regular files only",
                ),
            ] {
                assert_eq!(
                    tool(
                        &mut served,
                        "copy",
                        json!({"source": source, "destination": "new"})
                    ),
                    Err(says.to_owned()),
                    "{backend}"
                );
            }
            assert!(!root.join("new").exists(), "{backend}");

            // Move: never over an existing one.
            assert_eq!(
                tool(
                    &mut served,
                    "move",
                    json!({"source": "b.txt", "destination": "empty/c.txt"})
                ),
                Ok("moved b.txt to empty/c.txt".to_owned())
            );
            let refused = tool(
                &mut served,
                "move",
                json!({"source": "a.txt", "destination": "empty/c.txt"}),
            )
            .unwrap_err();
            assert!(
                refused.contains("move does not replace"),
                "{backend}: {refused}"
            );
            assert_eq!(
                std::fs::read_to_string(root.join("a.txt")).unwrap(),
                "alpha\n"
            );

            // Remove: not recursive; a file only once read, and not once
            // changed since.
            let refused = tool(&mut served, "remove", json!({"path": "full"})).unwrap_err();
            assert!(
                refused.contains("remove is not recursive"),
                "{backend}: {refused}"
            );
            assert!(root.join("full/inner/keep").exists(), "{backend}");
            let refused = tool(&mut served, "remove", json!({"path": "a.txt"})).unwrap_err();
            assert!(
                refused.contains("has not been read"),
                "{backend}: {refused}"
            );
            tool(&mut served, "read", json!({"path": "a.txt"})).unwrap();
            tool(
                &mut served,
                "bash",
                json!({"command": "echo changed >> a.txt"}),
            )
            .unwrap();
            let refused = tool(&mut served, "remove", json!({"path": "a.txt"})).unwrap_err();
            assert!(
                refused.contains("changed since it was last read"),
                "{backend}: {refused}"
            );
            assert!(root.join("a.txt").exists(), "{backend}");
            tool(&mut served, "read", json!({"path": "a.txt"})).unwrap();
            assert_eq!(
                tool(&mut served, "remove", json!({"path": "a.txt"})),
                Ok("removed a.txt".to_owned())
            );
            assert!(!root.join("a.txt").exists(), "{backend}");

            // Out of the workspace: refused, whichever way.
            for (name, arguments) in [
                (
                    "copy",
                    json!({"source": "/etc/passwd", "destination": "stolen"}),
                ),
                (
                    "copy",
                    json!({"source": "empty/c.txt", "destination": "../planted"}),
                ),
                (
                    "move",
                    json!({"source": "empty/c.txt", "destination": "/tmp/planted"}),
                ),
                ("remove", json!({"path": "../x"})),
            ] {
                let refused = tool(&mut served, name, arguments.clone()).unwrap_err();
                assert!(
                    refused.contains("outside the workspace"),
                    "{backend}: {arguments}: {refused}"
                );
            }
            assert!(!root.join("stolen").exists(), "{backend}");

            // Hostile names: a newline, a leading dash, unicode.
            assert_eq!(
                tool(
                    &mut served,
                    "copy",
                    json!({"source": "\"line\\nbreak\"", "destination": "\"copy\\nof\""})
                ),
                Ok("copied \"line\\nbreak\" to \"copy\\nof\" (2 bytes)".to_owned())
            );
            assert_eq!(
                std::fs::read_to_string(root.join("copy\nof")).unwrap(),
                "n\n"
            );
            assert_eq!(
                tool(
                    &mut served,
                    "move",
                    json!({"source": "-rf", "destination": "--help"})
                ),
                Ok("moved -rf to --help".to_owned())
            );
            assert_eq!(
                tool(
                    &mut served,
                    "move",
                    json!({"source": "résumé ✓", "destination": "ünïcødé"})
                ),
                Ok("moved résumé ✓ to ünïcødé".to_owned())
            );
            assert!(
                root.join("--help").exists() && root.join("ünïcødé").exists(),
                "{backend}"
            );
            served.hang_up()
        });
        assert!(result.success(), "{backend}: box serve exits 0: {result}");
    }

    // No file system, no namespace tools.
    let workspace = tempfile::tempdir().unwrap();
    let instance = format!("e2e-namespace-nofs-{}", std::process::id());
    let status = tokio::task::block_in_place(|| {
        let mut served = serve(
            "local",
            &instance,
            workspace.path(),
            &["--profile", "no-fs"],
        );
        let shown = served.initialized.to_string();
        for name in ["\"copy\"", "\"move\"", "\"remove\""] {
            assert!(!shown.contains(name), "no-fs offers {name}: {shown}");
        }
        let listed = served.call("tools/list", json!({}));
        assert_eq!(listed["result"]["tools"], json!([]), "{listed}");
        let refused = served.call(
            "tools/call",
            json!({"name": "copy", "arguments": {"source": "a", "destination": "b"}}),
        );
        assert!(refused.get("error").is_some(), "{refused}");
        served.hang_up()
    });
    assert!(status.success(), "{status}");
}

/// Issue 27: an unmodified client's `traceparent` in `_meta` parents box's
/// spans, exported over OTLP/HTTP to a receiver decoding them with the
/// official definitions: the request span by MCP's conventions, the unit's
/// start spans, the executor's span for the command, and no byte of the
/// profile's secret the command echoes (`tests/e2e/tracing_sdk.py`).
#[test]
fn traces_of_a_tool_call_reach_an_otlp_receiver_on_every_backend() {
    let Some(python) = crate::support::python_with_otlp() else {
        return;
    };
    for backend in backends() {
        let workspace = tempfile::tempdir().unwrap();
        run_script(
            &python,
            "tracing_sdk.py",
            &[
                "--backend",
                backend,
                "--workspace",
                workspace.path().to_str().unwrap(),
            ],
        );
    }
}

/// Issue 27: the unit's life beyond its start reaches the receiver in the
/// client's traces, under the request spans: `unit.claim workspace` of a
/// warm pool unit (`box.pool.warm`) for `box/session.open`, `unit.fork` and
/// `unit.merge` for `box/fork` and `box/merge`, the executor's
/// `process.start` for `agentworkspace/process.start`, and `session.reattach` for
/// the first call with the handle after `kill -9` of a `--state` host, under
/// that call's span even when the call is then refused (never the next
/// call's); no
/// byte of the profile's secret (`tests/e2e/tracing_units_sdk.py`), on
/// every backend.
#[test]
fn traces_of_a_claim_a_fork_a_merge_and_a_reattach_reach_an_otlp_receiver_on_every_backend() {
    let Some(python) = crate::support::python_with_otlp() else {
        return;
    };
    for backend in backends() {
        let workspace = tempfile::tempdir().unwrap();
        let state = tempfile::tempdir().unwrap();
        run_script(
            &python,
            "tracing_units_sdk.py",
            &[
                "--backend",
                backend,
                "--workspace",
                workspace.path().to_str().unwrap(),
                "--state",
                state.path().join("sessions").to_str().unwrap(),
            ],
        );
    }
}
