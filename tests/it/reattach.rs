//! Issue 12: a session survives `kill -9` of its `box serve --listen` host.
//! A new host started with the same `--state` re-adopts the live units, and
//! the client that re-initializes with `box.reattach {session, secret}` gets
//! the same `Mcp-Session-Id`, its unit's `/tmp` and its background process;
//! a wrong secret, a changed profile or a removed container is refused,
//! naming why.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use base64::Engine as _;
use box_jsonrpc::EXECUTOR_KEY;
use boxhost::backend::docker::DockerBackend;
use serde_json::{Value, json};

use crate::serve::post;
use crate::support::{HttpHost, Served, box_bin, containers, under_ci};

/// Whether the Docker engine answers and has box's base image; under CI
/// their absence is a failure.
async fn docker() -> bool {
    let problem = match DockerBackend::connect().await {
        Ok(backend) if backend.has_image("box-base:bookworm").await => return true,
        Ok(_) => "box-base:bookworm is missing (scripts/images.sh)".to_owned(),
        Err(error) => error.to_string(),
    };
    assert!(!under_ci(), "CI needs a Docker engine: {problem}");
    eprintln!("\n*** DOCKER REATTACH TESTS NOT RUN: {problem} ***\n");
    false
}

/// Where every host of one test keeps its state and finds its profiles.
struct Setup {
    /// `docker` or `local`.
    backend: &'static str,
    instance: String,
    /// Where its hosts listen, one after another.
    host: HttpHost,
    state: tempfile::TempDir,
    profiles: tempfile::TempDir,
    workspace: tempfile::TempDir,
    /// The hosts' instance locks, apart from other tests' hosts: a host
    /// starting elsewhere on this machine sweeps a dead instance's units,
    /// which would race these tests' re-adoption (docs/security.md).
    instances: tempfile::TempDir,
}

impl Setup {
    fn new(name: &str) -> Self {
        Self::on("docker", name)
    }

    /// A setup whose hosts run `backend`'s units.
    fn on(backend: &'static str, name: &str) -> Self {
        let profiles = tempfile::tempdir().unwrap();
        write_profile(profiles.path(), 300);
        Self {
            backend,
            instance: format!("e2e-reattach-{backend}-{name}-{}", std::process::id()),
            host: HttpHost::on_a_free_port(),
            state: tempfile::tempdir().unwrap(),
            profiles,
            workspace: tempfile::tempdir().unwrap(),
            instances: tempfile::tempdir().unwrap(),
        }
    }

    fn address(&self) -> SocketAddr {
        self.host.address()
    }

    /// Remove one unit by its backend id, as an operator would while its
    /// host is down.
    async fn remove_unit(&self, id: &str) {
        use boxhost::backend::Backend as _;
        if self.backend == "docker" {
            let docker =
                boxhost::backend::docker::bollard::Docker::connect_with_defaults().unwrap();
            docker
                .remove_container(
                    id,
                    Some(
                        boxhost::backend::docker::bollard::query_parameters::RemoveContainerOptionsBuilder::new()
                            .force(true)
                            .build(),
                    ),
                )
                .await
                .unwrap();
        } else {
            let local = boxhost::backend::local::LocalBackend::new(box_bin());
            local.remove(id).await.unwrap();
        }
    }

    /// Remove whatever units of this setup's instance are left (a refused
    /// session's, left to their leases by the host).
    async fn remove_units(&self) {
        use boxhost::backend::Backend as _;
        if self.backend == "docker" {
            remove_containers(&self.instance).await;
        } else {
            let local = boxhost::backend::local::LocalBackend::new(box_bin());
            // A refused session's units are left to their leases.
            let units = local.list_instance(&self.instance).await.unwrap();
            let report = local.remove_units(units).await;
            assert!(report.failed.is_empty(), "{:?}", report.failed);
        }
    }

    /// A `box serve --listen` host with this setup's state, ready to answer.
    async fn serve(&self) -> Child {
        let child = self.spawn(&[]);
        self.answering(child).await
    }

    /// A `box serve --listen` host with this setup's state and `extra` flags.
    fn spawn(&self, extra: &[&str]) -> Child {
        self.spawn_as(&self.instance, extra)
    }

    /// [`spawn`](Self::spawn) under instance id `instance`.
    fn spawn_as(&self, instance: &str, extra: &[&str]) -> Child {
        let mut command = self.command();
        command
            .args(["--instance", instance])
            .arg("--profiles")
            .arg(self.profiles.path())
            .args(extra);
        self.host.spawn(command)
    }

    /// `box serve` on this setup's backend, state, workspace and instance
    /// locks (no instance id, no profiles: a stdio host's own).
    fn command(&self) -> Command {
        let mut command = Command::new(box_bin());
        command
            .args(["serve", "--backend", self.backend])
            .arg("--state")
            .arg(self.state.path().join("sessions"))
            .arg("--workspace")
            .arg(self.workspace.path())
            .env("RUST_LOG", "info")
            .env("BOX_INSTANCE_DIR", self.instances.path());
        command
    }

    /// `child`, once the address answers.
    async fn answering(&self, child: Child) -> Child {
        self.host.answering(child).await
    }

    async fn initialize(&self, ask: Value) -> (Option<String>, Value) {
        self.initialize_with(ask, &[]).await
    }

    async fn initialize_with(
        &self,
        ask: Value,
        headers: &[(&str, &str)],
    ) -> (Option<String>, Value) {
        self.host
            .initialize(
                json!({"experimental": {EXECUTOR_KEY: {"box": ask}}}),
                headers,
            )
            .await
    }

    async fn call(&self, session: &str, id: u64, method: &str, params: Value) -> Value {
        post(
            self.address(),
            Some(session),
            &[],
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        )
        .await
        .json()
    }

    async fn bash(&self, session: &str, id: u64, command: &str) -> String {
        let answer = self
            .call(
                session,
                id,
                "tools/call",
                json!({"name": "bash", "arguments": {"command": command}}),
            )
            .await;
        answer["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_else(|| panic!("bash {command}: {answer}"))
            .to_owned()
    }
}

/// A profile whose plan depends on `pids`.
fn write_profile(dir: &Path, pids: u32) {
    std::fs::write(
        dir.join("re.toml"),
        format!(
            "description = \"reattach tests\"\nextends = \"default\"\n\n[limits]\npids = {pids}\n"
        ),
    )
    .unwrap();
}

fn kill9(child: &mut Child) {
    child.kill().unwrap();
    child.wait().unwrap();
}

fn stop(child: &mut Child) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    child.wait().unwrap();
}

/// The session's `box.session` from an initialize answer.
fn box_answer(answer: &Value) -> &Value {
    &answer["result"]["capabilities"]["experimental"][EXECUTOR_KEY]["box"]
}

async fn remove_containers(instance: &str) {
    let docker = boxhost::backend::docker::bollard::Docker::connect_with_defaults().unwrap();
    for id in containers(instance, None).await {
        let _ = docker
            .remove_container(
                &id,
                Some(boxhost::backend::docker::bollard::query_parameters::RemoveContainerOptionsBuilder::new().force(true).build()),
            )
            .await;
    }
}

fn decode(read: &Value) -> String {
    let data = read["result"]["data"].as_str().unwrap_or_default();
    String::from_utf8_lossy(
        &base64::engine::general_purpose::STANDARD
            .decode(data)
            .unwrap(),
    )
    .into_owned()
}

/// The whole path: kill -9, restart with the same state, a wrong secret
/// refused (and the session still reattachable), then the right one: same
/// session id, `reattached: true`, the `/tmp` file there, the background
/// process's output since the restart readable and `process.wait` answering.
#[tokio::test(flavor = "multi_thread")]
async fn a_session_survives_kill_9_of_its_host_and_reattaches() {
    if !docker().await {
        return;
    }
    survives_kill_9_and_reattaches(Setup::new("path")).await;
}

/// The same path on the local backend: the unit's helper outlives its host,
/// and the new host re-adopts it through its run directory.
#[tokio::test(flavor = "multi_thread")]
async fn local_a_session_survives_kill_9_of_its_host_and_reattaches() {
    survives_kill_9_and_reattaches(Setup::on("local", "path")).await;
}

async fn survives_kill_9_and_reattaches(setup: Setup) {
    let mut host = setup.serve().await;
    let (session, answer) = setup.initialize(json!({"profile": "re"})).await;
    let session = session.unwrap_or_else(|| panic!("{answer}"));
    let identity = box_answer(&answer)["session"].clone();
    assert_eq!(identity["id"], json!(session), "{answer}");
    let secret = identity["secret"].as_str().unwrap().to_owned();
    assert!(secret.len() >= 32, "{secret}");
    // The state file holds the secret's digest, never the secret.
    let file = setup
        .state
        .path()
        .join("sessions")
        .join(format!("{session}.json"));
    let kept = std::fs::read_to_string(&file).unwrap();
    assert!(!kept.contains(&secret), "{kept}");
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );

    setup
        .bash(&session, 1, "echo kept > ${TMPDIR:-/tmp}/survivor.txt")
        .await;
    let started = setup
        .call(
            &session,
            2,
            "agentworkspace/process.start",
            json!({"args": ["sh", "-c", "i=0; while [ $i -lt 40 ]; do echo line$i; i=$((i+1)); sleep 0.2; done"]}),
        )
        .await;
    let process = started["result"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{started}"))
        .to_owned();
    tokio::time::sleep(Duration::from_millis(500)).await;
    // What was printed before the restart is read now, so what is read after
    // it was printed since.
    let before = setup
        .call(
            &session,
            3,
            "agentworkspace/process.read",
            json!({"id": process, "fd": 1}),
        )
        .await;
    assert!(decode(&before).contains("line0"), "{before}");
    // A call in flight when the host dies: reported after the reattach as
    // of unknown outcome, by the client's id.
    let (address, waiting_session, waiting_process) =
        (setup.address(), session.clone(), process.clone());
    // A raw request whose connection dies with the host (no reply is read).
    let body = json!({"jsonrpc": "2.0", "id": "in-flight", "method": "agentworkspace/process.wait",
        "params": {"id": waiting_process}})
    .to_string();
    let mut in_flight = tokio::net::TcpStream::connect(address).await.unwrap();
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMcp-Session-Id: {waiting_session}\r\nMCP-Protocol-Version: 2025-06-18\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    tokio::io::AsyncWriteExt::write_all(&mut in_flight, request.as_bytes())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;

    kill9(&mut host);
    drop(in_flight);
    let mut host = setup.serve().await;

    let (none, refused) = setup
        .initialize(json!({"reattach": {"session": session, "secret": "0".repeat(32)}}))
        .await;
    assert_eq!(none, None, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("box.reattach.secret"), "{refused}");

    let (again, answer) = setup
        .initialize(json!({"reattach": {"session": session, "secret": secret}}))
        .await;
    assert_eq!(again.as_deref(), Some(session.as_str()), "{answer}");
    let units = box_answer(&answer)["units"].as_array().unwrap().clone();
    assert!(!units.is_empty(), "{answer}");
    assert!(
        units.iter().all(|unit| unit["reattached"] == json!(true)),
        "{answer}"
    );
    assert_eq!(box_answer(&answer)["reattached"], json!(true), "{answer}");
    assert_eq!(
        box_answer(&answer)["unknownOutcome"],
        json!([{"id": "in-flight", "unit": "workspace", "method": "agentworkspace/process.wait"}]),
        "{answer}"
    );

    let tmp = setup
        .bash(&session, 10, "cat ${TMPDIR:-/tmp}/survivor.txt")
        .await;
    assert!(tmp.contains("kept"), "{tmp}");
    let after = setup
        .call(
            &session,
            11,
            "agentworkspace/process.read",
            json!({"id": process, "fd": 1}),
        )
        .await;
    let text = decode(&after);
    assert!(
        text.contains("line") && !text.contains("line0\n"),
        "output since the restart: {after}"
    );
    let waited = setup
        .call(
            &session,
            12,
            "agentworkspace/process.wait",
            json!({"id": process}),
        )
        .await;
    assert!(waited.get("result").is_some(), "{waited}");

    // A normal end removes the units and the state file.
    let reply = crate::serve::http(
        setup.address(),
        "DELETE",
        "/mcp",
        &[("Mcp-Session-Id", &session)],
        b"",
    )
    .await;
    assert_eq!(reply.status, 200);
    assert!(!file.exists());
    stop(&mut host);
    setup.remove_units().await;
}

/// After a restart, a session whose profile changed and one whose container
/// was removed are each refused naming why; neither gets fresh units.
#[tokio::test(flavor = "multi_thread")]
async fn a_changed_profile_or_a_removed_container_refuses_reattach() {
    if !docker().await {
        return;
    }
    changed_or_removed_refuses_reattach(Setup::new("refused")).await;
}

/// The same refusals on the local backend, the unit removed through the
/// backend (`box units rm` does the same) while its host is down.
#[tokio::test(flavor = "multi_thread")]
async fn local_a_changed_profile_or_a_removed_unit_refuses_reattach() {
    changed_or_removed_refuses_reattach(Setup::on("local", "refused")).await;
}

async fn changed_or_removed_refuses_reattach(setup: Setup) {
    let mut host = setup.serve().await;
    let (changed, changed_answer) = setup.initialize(json!({"profile": "re"})).await;
    let changed = changed.unwrap_or_else(|| panic!("{changed_answer}"));
    let changed_secret = box_answer(&changed_answer)["session"]["secret"].clone();
    let (removed, removed_answer) = setup.initialize(json!({})).await;
    let removed = removed.unwrap_or_else(|| panic!("{removed_answer}"));
    let removed_secret = box_answer(&removed_answer)["session"]["secret"].clone();
    let removed_id = box_answer(&removed_answer)["units"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // A session on a host directory of its own, removed while the host is down.
    let elsewhere = tempfile::tempdir().unwrap();
    let gone_path = elsewhere.path().join("work");
    std::fs::create_dir(&gone_path).unwrap();
    std::fs::write(
        setup.profiles.path().join("gone.toml"),
        format!(
            "description = \"a workspace that goes\"\nextends = \"default\"\n\n[workspace]\nsource = \"{}\"\n",
            gone_path.display()
        ),
    )
    .unwrap();
    let (gone, gone_answer) = setup.initialize(json!({"profile": "gone"})).await;
    let gone = gone.unwrap_or_else(|| panic!("{gone_answer}"));
    let gone_secret = box_answer(&gone_answer)["session"]["secret"].clone();

    kill9(&mut host);
    write_profile(setup.profiles.path(), 301);
    std::fs::remove_dir_all(&gone_path).unwrap();
    setup.remove_unit(&removed_id).await;
    let mut host = setup.serve().await;

    let (none, refused) = setup
        .initialize(json!({"reattach": {"session": changed, "secret": changed_secret}}))
        .await;
    assert_eq!(none, None, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("profile `re`") && message.contains("plan digest"),
        "{refused}"
    );

    // The header form of the ask.
    let header = format!("{removed}:{}", removed_secret.as_str().unwrap());
    let (none, refused) = setup
        .initialize_with(json!({}), &[("Box-Reattach", &header)])
        .await;
    assert_eq!(none, None, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&removed_id) && message.contains("gone"),
        "{refused}"
    );

    let (none, refused) = setup
        .initialize(json!({"reattach": {"session": gone, "secret": gone_secret}}))
        .await;
    assert_eq!(none, None, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&gone_path.display().to_string()),
        "the refusal names the missing workspace: {refused}"
    );
    stop(&mut host);
    setup.remove_units().await;
}

/// A local unit whose lease lapsed while its host was dead (its helper ended
/// it, and nothing of it runs) is not re-adopted: the reattach is refused,
/// never answered by fresh units.
#[tokio::test(flavor = "multi_thread")]
async fn local_a_unit_whose_lease_lapsed_is_not_reattached() {
    let setup = Setup::on("local", "lapsed");
    std::fs::write(
        setup.profiles.path().join("short.toml"),
        "description = \"a short lease\"\nextends = \"default\"\n\n[lifecycle]\nlease = \"1s\"\n",
    )
    .unwrap();
    let mut host = setup.serve().await;
    let (session, answer) = setup.initialize(json!({"profile": "short"})).await;
    let session = session.unwrap_or_else(|| panic!("{answer}"));
    let secret = box_answer(&answer)["session"]["secret"].clone();
    let id = box_answer(&answer)["units"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // The unit's sandbox helper, as `box units inspect` names it.
    let shown = Command::new(box_bin())
        .args(["units", "inspect", "--json", "--backend", "local", &id])
        .output()
        .unwrap();
    assert!(shown.status.success(), "{shown:?}");
    let shown: Value = serde_json::from_slice(&shown.stdout).unwrap();
    let helper = shown["pid"].as_u64().unwrap_or_else(|| panic!("{shown}"));
    kill9(&mut host);
    // The lease (1 s) lapses: the helper ends the unit and itself.
    let deadline = std::time::Instant::now() + Duration::from_secs(1 + 5);
    while Path::new(&format!("/proc/{helper}")).exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the unit's helper outlived its lease by 5 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut host = setup.serve().await;
    let (none, refused) = setup
        .initialize(json!({"reattach": {"session": session, "secret": secret}}))
        .await;
    assert_eq!(none, None, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(&session), "{refused}");
    stop(&mut host);
    setup.remove_units().await;
}

/// BENCHMARKS.md, "Reattach": 50 sessions on docker, `kill -9` of their
/// host, a new host with the same state: the time from spawning it until
/// all 50 have reattached (and until each has answered a `bash` call),
/// against the time the same 50 sessions took to start, in the same run.
/// Run: `CI=true cargo nextest run --workspace -E 'test(/reattach_of_50/)' --run-ignored only --no-capture`.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a benchmark: 50 docker units"]
async fn bench_reattach_of_50_sessions() {
    if !docker().await {
        return;
    }
    reattach_of_50_sessions(Setup::new("bench")).await;
}

/// The same on the local backend.
/// Run: `CI=true cargo nextest run --test it -E 'test(/local_reattach_of_50/)' --run-ignored only --no-capture`.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a benchmark: 50 local units"]
async fn bench_local_reattach_of_50_sessions() {
    reattach_of_50_sessions(Setup::on("local", "bench")).await;
}

async fn reattach_of_50_sessions(setup: Setup) {
    const SESSIONS: usize = 50;
    let setup = std::sync::Arc::new(setup);
    let mut host = setup.serve().await;
    let clock = std::time::Instant::now();
    let started = futures::future::join_all((0..SESSIONS).map(|_| {
        let setup = setup.clone();
        async move { setup.initialize(json!({})).await }
    }))
    .await;
    let start_all = clock.elapsed();
    let sessions: Vec<(String, Value)> = started
        .into_iter()
        .map(|(session, answer)| {
            let secret = box_answer(&answer)["session"]["secret"].clone();
            (session.unwrap_or_else(|| panic!("{answer}")), secret)
        })
        .collect();
    kill9(&mut host);

    let clock = std::time::Instant::now();
    let mut host = setup.serve().await;
    let listening = clock.elapsed();
    let reattached = futures::future::join_all(sessions.iter().map(|(session, secret)| {
        let setup = setup.clone();
        async move {
            let (again, answer) = setup
                .initialize(json!({"reattach": {"session": session, "secret": secret}}))
                .await;
            assert_eq!(again.as_deref(), Some(session.as_str()), "{answer}");
        }
    }))
    .await;
    let reattach_all = clock.elapsed();
    assert_eq!(reattached.len(), SESSIONS);
    futures::future::join_all(sessions.iter().map(|(session, _)| {
        let setup = setup.clone();
        async move {
            let out = setup.bash(session, 1, "echo up").await;
            assert!(out.contains("up"), "{out}");
        }
    }))
    .await;
    let answering = clock.elapsed();
    println!(
        "BENCH {} reattach of {SESSIONS} sessions: listening after {listening:?}, all reattached after {reattach_all:?}, all answered a bash call after {answering:?}; baseline: the same {SESSIONS} sessions started fresh in {start_all:?}; ratio reattach/start {:.3}",
        setup.backend,
        reattach_all.as_secs_f64() / start_all.as_secs_f64()
    );
    stop(&mut host);
    setup.remove_units().await;
}

/// `box serve` over stdio with this setup's `--state`, not yet initialized
/// (the test asks for its session in initialize).
fn serve_stdio(setup: &Setup) -> Served {
    Served::spawn(setup.command())
}

/// `initialize` asking `ask` under box's capability key.
fn initialize_stdio(served: &mut Served, ask: Value) -> Value {
    served.initialize(json!({"experimental": {EXECUTOR_KEY: {"box": ask}}}))
}

/// Over stdio: a new `box serve --state DIR` process given the reattach ask
/// in its initialize serves the session whose host was killed.
#[tokio::test(flavor = "multi_thread")]
async fn a_stdio_session_reattaches_in_a_new_serve_process() {
    if !docker().await {
        return;
    }
    stdio_session_reattaches(Setup::new("stdio")).await;
}

/// The same over stdio on the local backend.
#[tokio::test(flavor = "multi_thread")]
async fn local_a_stdio_session_reattaches_in_a_new_serve_process() {
    stdio_session_reattaches(Setup::on("local", "stdio")).await;
}

/// The profile of the stdio reattach tests: a secret the late answer prints
/// (issue 22, item 1: a late answer is redacted like any other).
const LATE_SECRET: (&str, &str) = ("BOX_E2E_LATE_SECRET", "late-secret-value-5e1f0a9c");

/// `box serve` over stdio on profile `late` (the default plus
/// [`LATE_SECRET`]), the secret in its environment.
fn serve_stdio_late(setup: &Setup) -> Served {
    std::fs::write(
        setup.profiles.path().join("late.toml"),
        format!(
            "extends = \"default\"\n\n[env]\nsecrets = [\"{}\"]\n",
            LATE_SECRET.0
        ),
    )
    .unwrap();
    let mut command = setup.command();
    command
        .arg("--profiles")
        .arg(setup.profiles.path())
        .args(["--profile", "late"])
        .env(LATE_SECRET.0, LATE_SECRET.1);
    Served::spawn(command)
}

async fn stdio_session_reattaches(setup: Setup) {
    let mut first = serve_stdio_late(&setup);
    let answer = tokio::task::block_in_place(|| initialize_stdio(&mut first, json!({})));
    let identity = box_answer(&answer)["session"].clone();
    let session = identity["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{answer}"))
        .to_owned();
    let wrote = tokio::task::block_in_place(|| {
        first.request(
            1,
            "tools/call",
            json!({"name": "bash", "arguments": {"command": "echo stdio-kept > ${TMPDIR:-/tmp}/kept.txt"}}),
        )
    });
    assert!(wrote.get("result").is_some(), "{wrote}");
    // A call in flight when the host dies: reported as unknown outcome, and
    // its answer, when the unit gives it, reaches the client late.
    first.send(&json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
    "params": {"name": "bash", "arguments": {"command": format!(
        "touch ${{TMPDIR:-/tmp}}/started; sleep 3; echo late-answer; cat /run/secrets/{}",
        LATE_SECRET.0
    )}}}));
    // Killed only once the call runs in the unit.
    let mut probe = 6;
    loop {
        let seen = tokio::task::block_in_place(|| {
            first.request(
                probe,
                "tools/call",
                json!({"name": "bash", "arguments": {"command": "test -e ${TMPDIR:-/tmp}/started && echo running"}}),
            )
        });
        if seen.to_string().contains("running") {
            break;
        }
        assert!(probe < 200, "the call never started: {seen}");
        probe += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    kill9(&mut first.child);

    let mut second = serve_stdio_late(&setup);
    let answer = tokio::task::block_in_place(|| {
        initialize_stdio(
            &mut second,
            json!({"reattach": {"session": session, "secret": identity["secret"]}}),
        )
    });
    assert_eq!(box_answer(&answer)["reattached"], json!(true), "{answer}");
    assert_eq!(
        box_answer(&answer)["session"]["id"],
        json!(session),
        "{answer}"
    );
    assert_eq!(
        box_answer(&answer)["unknownOutcome"],
        json!([{"id": 5, "unit": "workspace", "method": "tools/call"}]),
        "{answer}"
    );
    let late = tokio::task::block_in_place(|| {
        second
            .wait_for(Duration::from_secs(90), |message| {
                message["method"] == json!("notifications/box/lateAnswer")
            })
            .expect("the late answer came")
    });
    assert_eq!(late["params"]["call"]["id"], json!(5), "{late}");
    assert!(
        late["params"]["response"]["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|text| text.contains("late-answer")
                && text.contains(&format!("[REDACTED:{}]", LATE_SECRET.0))),
        "{late}"
    );
    assert!(!late.to_string().contains(LATE_SECRET.1), "{late}");
    let read = tokio::task::block_in_place(|| {
        second.request(
            2,
            "tools/call",
            json!({"name": "bash", "arguments": {"command": "cat ${TMPDIR:-/tmp}/kept.txt"}}),
        )
    });
    assert!(
        read["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|text| text.contains("stdio-kept")),
        "{read}"
    );
    // End of input ends the session normally: its units and its state go.
    drop(second.child.stdin.take());
    assert!(second.child.wait().unwrap().success());
    assert!(
        !setup
            .state
            .path()
            .join("sessions")
            .join(format!("{session}.json"))
            .exists()
    );
}

/// Issue 22, item 3, from the attacker's side: while the host is down,
/// links are planted in its state directory at a kept session's call
/// journal and at the record of a session that does not exist, both
/// pointing at a canary file of the host's user. The restarted host
/// reattaches the session, serves a call and ends it: the canary is never
/// written (the old host truncated it through the journal's link), and each
/// link is refused with a WARN naming its path.
#[tokio::test(flavor = "multi_thread")]
async fn links_planted_in_the_state_directory_are_refused_at_a_restart() {
    if !docker().await {
        return;
    }
    planted_links_are_refused(Setup::new("planted")).await;
}

/// The same on the local backend.
#[tokio::test(flavor = "multi_thread")]
async fn local_links_planted_in_the_state_directory_are_refused_at_a_restart() {
    planted_links_are_refused(Setup::on("local", "planted")).await;
}

async fn planted_links_are_refused(setup: Setup) {
    let mut first = serve_stdio(&setup);
    let answer = tokio::task::block_in_place(|| initialize_stdio(&mut first, json!({})));
    let identity = box_answer(&answer)["session"].clone();
    let session = identity["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{answer}"))
        .to_owned();
    let ran = tokio::task::block_in_place(|| {
        first.request(
            1,
            "tools/call",
            json!({"name": "bash", "arguments": {"command": "echo before"}}),
        )
    });
    assert!(ran.get("result").is_some(), "{ran}");
    kill9(&mut first.child);

    let sessions = setup.state.path().join("sessions");
    let journal = sessions.join(format!("{session}.calls"));
    assert!(journal.is_file(), "the session kept no journal");
    let canary = setup.state.path().join("canary");
    std::fs::write(&canary, "canary: the host must never write this\n").unwrap();
    std::fs::remove_file(&journal).unwrap();
    std::os::unix::fs::symlink(&canary, &journal).unwrap();
    let stray = sessions.join("0123456789abcdef0123456789abcdef.json");
    std::os::unix::fs::symlink(&canary, &stray).unwrap();

    let log = tempfile::NamedTempFile::new().unwrap();
    let mut command = setup.command();
    command.stderr(log.reopen().unwrap());
    let mut second = Served::spawn(command);
    let answer = tokio::task::block_in_place(|| {
        initialize_stdio(
            &mut second,
            json!({"reattach": {"session": session, "secret": identity["secret"]}}),
        )
    });
    assert_eq!(box_answer(&answer)["reattached"], json!(true), "{answer}");
    let ran = tokio::task::block_in_place(|| {
        second.request(
            2,
            "tools/call",
            json!({"name": "bash", "arguments": {"command": "echo after"}}),
        )
    });
    assert!(ran.get("result").is_some(), "{ran}");
    drop(second.child.stdin.take());
    assert!(second.child.wait().unwrap().success());

    assert_eq!(
        std::fs::read_to_string(&canary).unwrap(),
        "canary: the host must never write this\n",
        "the host wrote through a planted link"
    );
    let log = std::fs::read_to_string(log.path()).unwrap();
    for link in [&journal, &stray] {
        let line = log
            .lines()
            .find(|line| line.contains(&link.display().to_string()))
            .unwrap_or_else(|| panic!("{} not reported: {log}", link.display()));
        assert!(line.contains("WARN"), "{line}");
        assert!(line.contains("symbolic link"), "{line}");
    }
    // The stray link is left for whoever looks (only box's own files go).
    assert!(std::fs::symlink_metadata(&stray).unwrap().is_symlink());
}

/// SIGHUP hands the kept sessions to the next process: a call in flight is
/// answered by the old process, which then exits 0 leaving the units; a new
/// `box serve` with the same state serves the same session id.
#[tokio::test(flavor = "multi_thread")]
async fn sighup_hands_sessions_to_the_next_process() {
    if !docker().await {
        return;
    }
    sighup_hands_sessions(Setup::new("hup")).await;
}

/// The same handover on the local backend.
#[tokio::test(flavor = "multi_thread")]
async fn local_sighup_hands_sessions_to_the_next_process() {
    sighup_hands_sessions(Setup::on("local", "hup")).await;
}

async fn sighup_hands_sessions(setup: Setup) {
    let mut host = setup.serve().await;
    let (session, answer) = setup.initialize(json!({})).await;
    let session = session.unwrap_or_else(|| panic!("{answer}"));
    let secret = box_answer(&answer)["session"]["secret"].clone();
    setup
        .bash(&session, 1, "echo handed > ${TMPDIR:-/tmp}/handed.txt")
        .await;
    let (address, calling) = (setup.address(), session.clone());
    let in_flight = tokio::spawn(async move {
        post(
            address,
            Some(&calling),
            &[],
            &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": "bash", "arguments": {"command": "sleep 1; echo finished"}}}),
        )
        .await
        .json()
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(host.id() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    let answered = in_flight.await.unwrap();
    assert!(
        answered["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|text| text.contains("finished")),
        "the old process answers its call in flight: {answered}"
    );
    assert!(host.wait().unwrap().success());

    let mut host = setup.serve().await;
    let (again, answer) = setup
        .initialize(json!({"reattach": {"session": session, "secret": secret}}))
        .await;
    assert_eq!(again.as_deref(), Some(session.as_str()), "{answer}");
    assert_eq!(box_answer(&answer)["unknownOutcome"], json!([]), "{answer}");
    let kept = setup
        .bash(&session, 3, "cat ${TMPDIR:-/tmp}/handed.txt")
        .await;
    assert!(kept.contains("handed"), "{kept}");
    stop(&mut host);
    setup.remove_units().await;
}

/// `box serve --takeover` on the same address: the live host is sent SIGHUP,
/// hands off and exits; the new one serves the same session.
#[tokio::test(flavor = "multi_thread")]
async fn takeover_replaces_the_live_host_without_losing_its_session() {
    if !docker().await {
        return;
    }
    takeover_replaces_the_live_host(Setup::new("takeover")).await;
}

/// The same takeover on the local backend.
#[tokio::test(flavor = "multi_thread")]
async fn local_takeover_replaces_the_live_host_without_losing_its_session() {
    takeover_replaces_the_live_host(Setup::on("local", "takeover")).await;
}

async fn takeover_replaces_the_live_host(setup: Setup) {
    let mut old = setup.serve().await;
    let (session, answer) = setup.initialize(json!({})).await;
    let session = session.unwrap_or_else(|| panic!("{answer}"));
    let secret = box_answer(&answer)["session"]["secret"].clone();
    setup
        .bash(&session, 1, "echo over > ${TMPDIR:-/tmp}/over.txt")
        .await;

    let new = setup.spawn(&["--takeover"]);
    assert!(
        old.wait().unwrap().success(),
        "the old host hands off and exits 0"
    );
    let mut new = setup.answering(new).await;
    let (again, answer) = setup
        .initialize(json!({"reattach": {"session": session, "secret": secret}}))
        .await;
    assert_eq!(again.as_deref(), Some(session.as_str()), "{answer}");
    let kept = setup
        .bash(&session, 2, "cat ${TMPDIR:-/tmp}/over.txt")
        .await;
    assert!(kept.contains("over"), "{kept}");
    stop(&mut new);
    setup.remove_units().await;
}

/// A successor under another instance id re-adopts a dead host's session
/// and, while it renews the units (which keep the dead instance's label),
/// holds that instance: every sweep and `box gc` sees it alive, so the units
/// are never taken for a dead host's leftovers once the old host's lease
/// bound has passed. When the successor ends the session, the hold goes.
#[tokio::test(flavor = "multi_thread")]
async fn adopting_a_dead_hosts_session_holds_its_instance() {
    use boxhost::backend::instance::{Liveness, liveness};
    if !docker().await {
        return;
    }
    let setup = Setup::new("held");
    let mut host = setup.serve().await;
    let (session, answer) = setup.initialize(json!({"profile": "re"})).await;
    let session = session.unwrap_or_else(|| panic!("{answer}"));
    let secret = box_answer(&answer)["session"]["secret"]
        .as_str()
        .unwrap()
        .to_owned();
    setup.bash(&session, 1, "echo kept > /tmp/held.txt").await;
    kill9(&mut host);
    let dead = setup.instance.clone();
    assert_eq!(liveness(setup.instances.path(), &dead), Liveness::Dead);

    let successor = format!("{dead}-next");
    let spawned = setup.spawn_as(&successor, &[]);
    let mut host = setup.answering(spawned).await;
    let (again, answer) = setup
        .initialize(json!({"reattach": {"session": session, "secret": secret}}))
        .await;
    assert_eq!(again.as_deref(), Some(session.as_str()), "{answer}");
    assert_eq!(
        liveness(setup.instances.path(), &dead),
        Liveness::Alive,
        "the successor holds the dead host's instance while it renews its units"
    );
    // `box gc` of that instance, as a CI runner's cleanup would run it:
    // refused or a no-op, never the live session's unit.
    let gc = Command::new(box_bin())
        .args(["gc", "--instance", &dead])
        .env("BOX_INSTANCE_DIR", setup.instances.path())
        .output()
        .unwrap();
    let tmp = setup.bash(&session, 2, "cat /tmp/held.txt").await;
    assert!(
        tmp.contains("kept"),
        "{tmp}; gc said: {}",
        String::from_utf8_lossy(&gc.stderr)
    );

    let reply = crate::serve::http(
        setup.address(),
        "DELETE",
        "/mcp",
        &[("Mcp-Session-Id", &session)],
        b"",
    )
    .await;
    assert_eq!(reply.status, 200);
    assert_ne!(
        liveness(setup.instances.path(), &dead),
        Liveness::Alive,
        "the hold ends with the last re-adopted unit"
    );
    stop(&mut host);
    remove_containers(&dead).await;
}

/// Issue 26: a session opened as a handle (MCP 2026-07-28) survives `kill
/// -9` of its host: the next host with the same `--state` reattaches it at
/// the first request carrying the handle (the open's secret is the reattach
/// secret), with its unit's `/tmp` file; a wrong secret is refused first and
/// leaves it reattachable.
#[tokio::test(flavor = "multi_thread")]
async fn local_a_handle_survives_kill_9_of_its_host() {
    handle_survives_kill_9(Setup::on("local", "handle")).await;
}

/// The same with docker units.
#[tokio::test(flavor = "multi_thread")]
async fn a_handle_survives_kill_9_of_its_host() {
    if !docker().await {
        return;
    }
    handle_survives_kill_9(Setup::new("handle")).await;
}

async fn handle_survives_kill_9(setup: Setup) {
    let mut host = setup.serve().await;
    let stateless = |id: u64, method: &str, params: Value, handle: Option<&Value>| {
        let mut extra = json!({});
        if let Some(handle) = handle {
            extra["box/session"] = handle.clone();
        }
        let mut params = params;
        params["_meta"] = crate::serve::stateless_meta(extra);
        json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
    };
    let send = |message: Value| {
        let address = setup.address();
        async move {
            let method = message["method"].as_str().unwrap().to_owned();
            let name = message["params"]["name"].as_str().unwrap_or("").to_owned();
            let mut headers = vec![
                ("MCP-Protocol-Version", "2026-07-28"),
                ("Mcp-Method", method.as_str()),
            ];
            if !name.is_empty() {
                headers.push(("Mcp-Name", name.as_str()));
            }
            post(address, None, &headers, &message).await.json()
        }
    };
    let opened = send(stateless(
        1,
        "box/session.open",
        json!({"profile": "re"}),
        None,
    ))
    .await;
    let handle = json!({"id": opened["result"]["id"], "secret": opened["result"]["secret"]});
    assert!(handle["secret"].is_string(), "{opened}");
    let bash = |id: u64, command: &str, handle: &Value| {
        stateless(
            id,
            "tools/call",
            json!({"name": "bash", "arguments": {"command": command}}),
            Some(handle),
        )
    };
    let wrote = send(bash(2, "echo kept > ${TMPDIR:-/tmp}/handle.txt", &handle)).await;
    assert_eq!(wrote["result"]["isError"], json!(false), "{wrote}");

    kill9(&mut host);
    let mut host = setup.serve().await;
    let wrong = json!({"id": handle["id"], "secret": "0".repeat(32)});
    let refused = send(bash(3, "echo no", &wrong)).await;
    assert!(refused["error"].is_object(), "{refused}");
    let read = send(bash(4, "cat ${TMPDIR:-/tmp}/handle.txt", &handle)).await;
    let text = read["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(text.contains("kept"), "{read}");
    let closed = send(stateless(5, "box/session.close", json!({}), Some(&handle))).await;
    assert_eq!(
        closed["result"]["resultType"],
        json!("complete"),
        "{closed}"
    );
    stop(&mut host);
    setup.remove_units().await;
}
