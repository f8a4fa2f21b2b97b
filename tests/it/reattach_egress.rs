//! Issue 12 for egress units: a session whose unit's network is `egress`
//! survives `kill -9` of its `box serve --listen` host. The new host serves
//! the unit's proxy again in the socket directory the unit has mounted (kept
//! in the state file), so after the reattach an allowed fetch through the
//! unit answers and a refused one is refused and audited; a directory that is
//! gone refuses the reattach, naming it, and nothing fresh is made.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use box_jsonrpc::EXECUTOR_KEY;
use boxhost::backend::docker::DockerBackend;
use serde_json::{Value, json};

use crate::serve::post;
use crate::support::{HttpHost, box_bin, http_server, under_ci};

/// Whether the Docker engine answers and has the test tools image (curl);
/// under CI their absence is a failure.
async fn docker() -> bool {
    let problem = match DockerBackend::connect().await {
        Ok(backend) if backend.has_image("box-test-tools:latest").await => return true,
        Ok(_) => "box-test-tools:latest is missing (scripts/test-images.sh)".to_owned(),
        Err(error) => error.to_string(),
    };
    assert!(!under_ci(), "CI needs a Docker engine: {problem}");
    eprintln!("\n*** DOCKER EGRESS REATTACH TESTS NOT RUN: {problem} ***\n");
    false
}

/// Every host of one test: its state, profiles, audit log and address.
struct Setup {
    backend: &'static str,
    instance: String,
    host: HttpHost,
    /// The test HTTP server's port (`allowed.test` and `denied.test` are
    /// pinned to it).
    web: u16,
    state: tempfile::TempDir,
    profiles: tempfile::TempDir,
    workspace: tempfile::TempDir,
    /// The hosts' instance locks, apart from other tests' hosts (whose sweep
    /// would race this test's re-adoption).
    instances: tempfile::TempDir,
}

impl Setup {
    fn on(backend: &'static str, name: &str) -> Self {
        let web = http_server("hello-reattached-egress");
        let profiles = tempfile::tempdir().unwrap();
        std::fs::write(
            profiles.path().join("egress-re.toml"),
            format!(
                r#"description = "egress to one pinned name, reattached"
extends = "default"

[workspace]
image = "box-test-tools:latest"
local_userland = "host"

[network]
mode = "egress"
allow = ["allowed.test:{web}"]
hosts = {{ "allowed.test" = "127.0.0.1", "denied.test" = "127.0.0.1" }}

[operator]
allow_dangerous = ["private-destinations"]
"#
            ),
        )
        .unwrap();
        Self {
            backend,
            instance: format!("e2e-reegress-{backend}-{name}-{}", std::process::id()),
            host: HttpHost::on_a_free_port(),
            web,
            state: tempfile::tempdir().unwrap(),
            profiles,
            workspace: tempfile::tempdir().unwrap(),
            instances: tempfile::tempdir().unwrap(),
        }
    }

    fn address(&self) -> SocketAddr {
        self.host.address()
    }

    fn audit(&self) -> PathBuf {
        self.profiles.path().join("audit.jsonl")
    }

    /// A `box serve --listen` host with this setup's state, once it answers.
    async fn serve(&self) -> Child {
        let mut command = Command::new(box_bin());
        command
            .args(["serve", "--backend", self.backend, "--instance"])
            .arg(&self.instance)
            .arg("--profiles")
            .arg(self.profiles.path())
            .arg("--state")
            .arg(self.state.path().join("sessions"))
            .arg("--workspace")
            .arg(self.workspace.path())
            .arg("--audit")
            .arg(self.audit())
            .env("RUST_LOG", "info")
            .env("BOX_INSTANCE_DIR", self.instances.path());
        self.host.serve(command).await
    }

    async fn initialize(&self, ask: Value) -> (Option<String>, Value) {
        self.host
            .initialize(json!({"experimental": {EXECUTOR_KEY: {"box": ask}}}), &[])
            .await
    }

    async fn bash(&self, session: &str, id: u64, command: &str) -> String {
        let answer = post(
            self.address(),
            Some(session),
            &[],
            &json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": "bash", "arguments": {"command": command}}}),
        )
        .await
        .json();
        answer["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_else(|| panic!("bash {command}: {answer}"))
            .to_owned()
    }

    /// A fetch of `name` through the unit's proxy: the HTTP status and body.
    async fn fetch(&self, session: &str, id: u64, name: &str) -> String {
        self.bash(
            session,
            id,
            &format!(
                "curl -sS -m 10 -w ' status=%{{http_code}}' http://{name}:{}/; echo \" exit=$?\"",
                self.web
            ),
        )
        .await
    }

    /// A new session: its id, secret and the unit's egress socket directory
    /// as the state file keeps it.
    async fn start_session(&self) -> (String, String, PathBuf) {
        let (session, answer) = self.initialize(json!({"profile": "egress-re"})).await;
        let session = session.unwrap_or_else(|| panic!("{answer}"));
        let secret = box_answer(&answer)["session"]["secret"]
            .as_str()
            .unwrap_or_else(|| panic!("{answer}"))
            .to_owned();
        let record: Value = serde_json::from_str(
            &std::fs::read_to_string(
                self.state
                    .path()
                    .join("sessions")
                    .join(format!("{session}.json")),
            )
            .unwrap(),
        )
        .unwrap();
        let dir = PathBuf::from(
            record["units"][0]["egressDir"]
                .as_str()
                .unwrap_or_else(|| panic!("no egressDir kept: {record}")),
        );
        assert!(dir.is_dir(), "{}", dir.display());
        (session, secret, dir)
    }

    /// Remove this setup's units that are left (a refused session's, left to
    /// their leases by the host).
    async fn remove_units(&self) {
        use boxhost::backend::Backend as _;
        if self.backend == "docker" {
            let docker = DockerBackend::connect().await.unwrap();
            let units = docker.list_instance(&self.instance).await.unwrap();
            let report = docker.remove_units(units).await;
            assert!(report.failed.is_empty(), "{:?}", report.failed);
        } else {
            let local = boxhost::backend::local::LocalBackend::new(box_bin());
            let units = local.list_instance(&self.instance).await.unwrap();
            let report = local.remove_units(units).await;
            assert!(report.failed.is_empty(), "{:?}", report.failed);
        }
    }
}

fn box_answer(answer: &Value) -> &Value {
    &answer["result"]["capabilities"]["experimental"][EXECUTOR_KEY]["box"]
}

fn kill9(child: &mut Child) {
    child.kill().unwrap();
    child.wait().unwrap();
}

fn stop(child: &mut Child) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    child.wait().unwrap();
}

/// The audit log's egress lines.
fn egress_lines(audit: &Path) -> Vec<Value> {
    std::fs::read_to_string(audit)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .filter(|line: &Value| line["kind"] == json!("egress"))
        .collect()
}

/// The local backend runs curl from the host inside the unit.
fn require_curl() {
    assert!(
        ["/usr/local/bin/curl", "/usr/bin/curl", "/bin/curl"]
            .iter()
            .any(|path| Path::new(path).exists()),
        "the local backend's egress test runs curl inside the unit, and this host has none: install it"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_egress_session_survives_kill_9_of_its_host_and_fetches_again() {
    if !docker().await {
        return;
    }
    egress_survives_kill_9(Setup::on("docker", "path")).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn local_an_egress_session_survives_kill_9_of_its_host_and_fetches_again() {
    require_curl();
    egress_survives_kill_9(Setup::on("local", "path")).await;
}

async fn egress_survives_kill_9(setup: Setup) {
    let mut host = setup.serve().await;
    let (session, secret, dir) = setup.start_session().await;
    let before = setup.fetch(&session, 1, "allowed.test").await;
    assert!(before.contains("hello-reattached-egress"), "{before}");

    kill9(&mut host);
    // The dead host left the directory its unit has mounted.
    assert!(dir.is_dir(), "{}", dir.display());
    let mut host = setup.serve().await;
    let (again, answer) = setup
        .initialize(json!({"reattach": {"session": session, "secret": secret}}))
        .await;
    assert_eq!(again.as_deref(), Some(session.as_str()), "{answer}");
    let unit = &box_answer(&answer)["units"][0];
    assert_eq!(unit["reattached"], json!(true), "{answer}");
    assert_eq!(unit["network"]["mode"], json!("egress"), "{unit}");
    assert_eq!(
        unit["network"]["allow"],
        json!([format!("allowed.test:{}", setup.web)]),
        "{unit}"
    );
    assert!(
        unit["network"]["restored"]
            .as_str()
            .is_some_and(|text| text.contains("box/network.set")),
        "the envelope says a narrowing is not kept: {unit}"
    );

    let allowed = setup.fetch(&session, 10, "allowed.test").await;
    assert!(
        allowed.contains("hello-reattached-egress") && allowed.contains("status=200"),
        "{}: {allowed}",
        setup.backend
    );
    let denied = setup.fetch(&session, 11, "denied.test").await;
    assert!(
        denied.contains("status=403") && !denied.contains("hello-reattached-egress"),
        "{}: {denied}",
        setup.backend
    );
    // `box/network.set` reaches the new proxy.
    let narrowed = post(
        setup.address(),
        Some(&session),
        &[],
        &json!({"jsonrpc": "2.0", "id": 12, "method": "box/network.set", "params": {"allow": []}}),
    )
    .await
    .json();
    assert_eq!(narrowed["result"]["allow"], json!([]), "{narrowed}");
    let after = setup.fetch(&session, 13, "allowed.test").await;
    assert!(after.contains("status=403"), "{after}");

    let lines = egress_lines(&setup.audit());
    let seen = |host: &str, outcome: &str| {
        lines.iter().any(|line| {
            line["host"] == json!(host)
                && line["decision"]["outcome"] == json!(outcome)
                && line["session"] == json!(session)
        })
    };
    assert!(seen("allowed.test", "allowed"), "{lines:?}");
    assert!(seen("denied.test", "refused"), "{lines:?}");
    assert_eq!(
        lines
            .iter()
            .filter(|line| line["host"] == json!("allowed.test")
                && line["decision"]["outcome"] == json!("allowed"))
            .count(),
        2,
        "one allowed fetch before the restart, one after: {lines:?}"
    );

    // The session ends with its host: its units and its directory go.
    stop(&mut host);
    assert!(!dir.exists(), "{}", dir.display());
    setup.remove_units().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_egress_session_whose_socket_directory_is_gone_is_refused() {
    if !docker().await {
        return;
    }
    gone_directory_refuses(Setup::on("docker", "gone")).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn local_an_egress_session_whose_socket_directory_is_gone_is_refused() {
    require_curl();
    gone_directory_refuses(Setup::on("local", "gone")).await;
}

async fn gone_directory_refuses(setup: Setup) {
    let mut host = setup.serve().await;
    let (session, secret, dir) = setup.start_session().await;
    kill9(&mut host);
    std::fs::remove_dir_all(&dir).unwrap();
    let mut host = setup.serve().await;
    let (none, refused) = setup
        .initialize(json!({"reattach": {"session": session, "secret": secret}}))
        .await;
    assert_eq!(none, None, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("egress socket directory")
            && message.contains(&dir.display().to_string())
            && message.contains("gone"),
        "{refused}"
    );
    // Never a fresh one the unit cannot see.
    assert!(!dir.exists(), "{}", dir.display());
    stop(&mut host);
    setup.remove_units().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sighup_hands_an_egress_session_to_the_next_process() {
    if !docker().await {
        return;
    }
    sighup_hands_egress(Setup::on("docker", "hup")).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn local_sighup_hands_an_egress_session_to_the_next_process() {
    require_curl();
    sighup_hands_egress(Setup::on("local", "hup")).await;
}

/// SIGHUP: the old process exits leaving the unit's socket directory (the
/// unit has it mounted), and the next one fetches through it.
async fn sighup_hands_egress(setup: Setup) {
    let mut host = setup.serve().await;
    let (session, secret, dir) = setup.start_session().await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(host.id()).unwrap()),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    assert!(host.wait().unwrap().success());
    assert!(
        dir.is_dir(),
        "the handed-off session keeps its egress directory: {}",
        dir.display()
    );

    let mut host = setup.serve().await;
    let (again, answer) = setup
        .initialize(json!({"reattach": {"session": session, "secret": secret}}))
        .await;
    assert_eq!(again.as_deref(), Some(session.as_str()), "{answer}");
    let allowed = setup.fetch(&session, 10, "allowed.test").await;
    assert!(
        allowed.contains("hello-reattached-egress") && allowed.contains("status=200"),
        "{}: {allowed}",
        setup.backend
    );
    let denied = setup.fetch(&session, 11, "denied.test").await;
    assert!(denied.contains("status=403"), "{}: {denied}", setup.backend);
    stop(&mut host);
    setup.remove_units().await;
}
