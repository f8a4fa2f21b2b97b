//! Any OCI image (issue 13.2): images pulled from a real registry (Debian's
//! docker-registry on a free loopback port, `scripts/registry.sh`), pinned by
//! digest and verified before a unit starts, refused when the pin is wrong or
//! the pull policy forbids fetching, and box's fixture images without glibc
//! (FROM scratch plus static busybox; musl) running the executor.
//!
//! Each test pushes an image of its own (a unique layer on box-test-musl) and
//! removes it locally, so the pull really fetches; its registry and image go
//! when the test ends, also on panic.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use boxhost::backend::docker::DockerBackend;
use boxhost::backend::{Backend, SessionLabel};
use boxhost::plan::{PullPolicy, Requirement, Security, UnitSpec, WorkspaceSource};

use crate::support::{box_bin, repo_root, under_ci};

/// The fixture the test images are built on (small, musl, busybox).
const BASE: &str = "box-test-musl:latest";

/// The engine with the fixture images, or `None` after saying loudly why not
/// (a failure under CI).
async fn engine() -> Option<DockerBackend> {
    match DockerBackend::connect().await {
        Ok(backend) => {
            for image in [BASE, "box-test-scratch:latest"] {
                assert!(
                    backend.has_image(image).await,
                    "image {image} is missing: build it with scripts/test-images.sh"
                );
            }
            Some(backend.with_executor_binary(box_bin()))
        }
        Err(error) => {
            assert!(!under_ci(), "CI needs a Docker engine: {error}");
            eprintln!("\n*** DOCKER TEST NOT RUN: {error} ***\n");
            None
        }
    }
}

fn suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{:x}", nanos ^ std::process::id().rotate_left(16))
}

fn docker(args: &[&str]) -> Output {
    let output = Command::new("docker").args(args).output().unwrap();
    assert!(
        output.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// A registry of this test's own (`scripts/registry.sh`), stopped on drop.
struct Registry {
    address: String,
}

impl Registry {
    fn start() -> Self {
        let output = Command::new("bash")
            .arg(repo_root().join("scripts/registry.sh"))
            .arg("start")
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "scripts/registry.sh start: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let address = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        assert!(address.starts_with("localhost:"), "{address}");
        Self { address }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(repo_root().join("scripts/registry.sh"))
            .args(["stop", &self.address])
            .output();
    }
}

/// An image of this test's own in `registry`: a unique layer on [`BASE`],
/// pushed, then removed from the engine (its unique layer with it). The layer
/// holds 1 MiB of random bytes: the engine reports a layer's download in
/// bytes only when it is big enough to be read in more than one piece (a
/// layer of a few bytes can go from "Pulling fs layer" straight to
/// "Download complete", and then a pull has no byte count to report).
struct Pushed {
    /// `ADDRESS/box-pull-test-SUFFIX`.
    repository: String,
    /// The tag pushed.
    tag: String,
    /// The registry's digest of it.
    digest: String,
}

impl Pushed {
    fn new(registry: &Registry) -> Self {
        let suffix = suffix();
        let repository = format!("{}/box-pull-test-{suffix}", registry.address);
        let tag = "v1".to_owned();
        let tagged = format!("{repository}:{tag}");
        let context = tempfile::tempdir().unwrap();
        let mut unique = vec![0u8; 1 << 20];
        unique.fill_with(rand::random::<u8>);
        unique.extend_from_slice(format!("\n{suffix}\n").as_bytes());
        std::fs::write(context.path().join("unique"), unique).unwrap();
        std::fs::write(
            context.path().join("Dockerfile"),
            format!("FROM {BASE}\nCOPY unique /etc/box-pull-test\n"),
        )
        .unwrap();
        let built = Command::new("docker")
            .args(["build", "--quiet", "--tag", &tagged])
            .arg(context.path())
            .env("DOCKER_BUILDKIT", "0")
            .output()
            .unwrap();
        assert!(
            built.status.success(),
            "docker build: {}",
            String::from_utf8_lossy(&built.stderr)
        );
        let pushed = docker(&["push", &tagged]);
        let text = String::from_utf8_lossy(&pushed.stdout);
        let digest = text
            .split_whitespace()
            .find(|word| word.starts_with("sha256:") && word.len() == 71)
            .unwrap_or_else(|| panic!("no digest in docker push's output: {text}"))
            .to_owned();
        docker(&["rmi", &tagged]);
        let this = Self {
            repository,
            tag,
            digest,
        };
        assert!(
            !has_image(&this.pinned()),
            "{} is still on the engine after docker rmi",
            this.pinned()
        );
        this
    }

    fn pinned(&self) -> String {
        format!("{}@{}", self.repository, self.digest)
    }
}

impl Drop for Pushed {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["rmi", "-f", &self.pinned()])
            .output();
        let _ = Command::new("docker")
            .args(["rmi", "-f", &format!("{}:{}", self.repository, self.tag)])
            .output();
    }
}

fn has_image(image: &str) -> bool {
    Command::new("docker")
        .args(["image", "inspect", image])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// A profile directory with profile `p` of `workspace_table` (the lines of its
/// `[workspace]`), landlock best-effort like the other docker tests.
fn profiles(workspace_table: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("p.toml"),
        format!("[workspace]\n{workspace_table}\n[security]\nlandlock = \"best-effort\"\n"),
    )
    .unwrap();
    dir
}

/// `box run --backend docker --profile p` with `profiles`, in `workspace`.
fn box_run(profiles: &Path, workspace: &Path, command: &[&str]) -> Output {
    Command::new(box_bin())
        .args(["run", "--backend", "docker", "--profile", "p", "--profiles"])
        .arg(profiles)
        .arg("--workspace")
        .arg(workspace)
        .arg("--")
        .args(command)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn label(tag: &str) -> SessionLabel {
    SessionLabel {
        instance: format!("pulltest-{tag}-{}-{}", std::process::id(), suffix()),
        session: "s1".to_owned(),
        profile: "test".to_owned(),
    }
}

fn unit(image: &str, pull: PullPolicy, workspace: &Path) -> UnitSpec {
    UnitSpec {
        pull,
        security: Security {
            landlock: Requirement::BestEffort,
            ..Security::strict()
        },
        ..UnitSpec::workspace(image, WorkspaceSource::Host(workspace.to_path_buf()))
    }
}

async fn start_error(backend: &DockerBackend, spec: &UnitSpec) -> String {
    let label = label("refused");
    match backend.start(&label, spec).await {
        Ok(started) => {
            backend.remove(&started.envelope.id).await.unwrap();
            panic!("{} started but must be refused", spec.image);
        }
        Err(error) => {
            let left = backend.list_instance(&label.instance).await.unwrap();
            assert!(left.is_empty(), "a refused start left units: {left:#?}");
            error.to_string()
        }
    }
}

/// Done-when: a profile naming `localhost:PORT/img@sha256:...` pulls it (with
/// progress on `box run`'s stderr), verifies it and runs it; the envelope
/// reports the digest the unit runs.
#[tokio::test]
async fn docker_a_pinned_image_is_pulled_verified_and_run() {
    let Some(backend) = engine().await else {
        return;
    };
    let registry = Registry::start();
    let pushed = Pushed::new(&registry);
    let ws = tempfile::tempdir().unwrap();
    let profiles = profiles(&format!("image = \"{}\"", pushed.pinned()));

    let output = box_run(profiles.path(), ws.path(), &["cat", "/etc/box-pull-test"]);
    let stderr = text(&output.stderr);
    eprintln!("box run's stderr:\n{stderr}");
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(
        text(&output.stdout).trim().len() >= 4,
        "the unit ran the pushed image (its unique file): {:?}",
        text(&output.stdout)
    );
    assert!(
        stderr.contains("Pull complete") && stderr.contains(&pushed.repository),
        "box run shows the pull's progress on stderr: {stderr}"
    );
    assert!(
        has_image(&pushed.pinned()),
        "the pinned image is on the engine"
    );

    // Present now: a start under "missing" does not pull, and its envelope
    // names the digest the unit runs.
    let spec = unit(&pushed.pinned(), PullPolicy::Missing, ws.path());
    let label = label("pinned");
    let started = backend.start(&label, &spec).await.unwrap();
    let envelope = started.envelope.clone();
    backend.remove(&envelope.id).await.unwrap();
    assert_eq!(envelope.image, pushed.pinned());
    assert_eq!(
        envelope.image_digest.as_deref(),
        Some(pushed.digest.as_str())
    );
    let json = serde_json::to_value(&envelope).unwrap();
    assert_eq!(json["imageDigest"], serde_json::json!(pushed.digest));

    // "always" pulls again (nothing to download), and the tag@digest form
    // checks the tag against the pin.
    let tag_pinned = format!("{}:{}@{}", pushed.repository, pushed.tag, pushed.digest);
    let spec = unit(&tag_pinned, PullPolicy::Always, ws.path());
    let started = backend.start(&label, &spec).await.unwrap();
    backend.remove(&started.envelope.id).await.unwrap();
    assert_eq!(
        started.envelope.image_digest.as_deref(),
        Some(pushed.digest.as_str())
    );
    let left = backend.list_instance(&label.instance).await.unwrap();
    assert!(left.is_empty(), "units leaked: {left:#?}");
}

/// Done-when: a wrong digest is refused. Pinned alone, the registry has no such
/// manifest (the registry and its message named); pinned with its tag, both
/// digests are named. Nothing starts either way.
#[tokio::test]
async fn docker_a_wrong_digest_is_refused() {
    let Some(backend) = engine().await else {
        return;
    };
    let registry = Registry::start();
    let pushed = Pushed::new(&registry);
    let ws = tempfile::tempdir().unwrap();
    let wrong = format!("sha256:{}", "0".repeat(64));

    let digest_only = format!("{}@{wrong}", pushed.repository);
    let error = start_error(
        &backend,
        &unit(&digest_only, PullPolicy::Missing, ws.path()),
    )
    .await;
    eprintln!("a wrong digest alone: {error}");
    assert!(
        error.contains(&format!("registry {}", registry.address)) && error.contains(&wrong),
        "names the registry and the digest: {error}"
    );
    assert!(
        error.to_ascii_lowercase().contains("manifest unknown")
            || error.to_ascii_lowercase().contains("not found"),
        "carries the registry's message: {error}"
    );

    let tag_pinned = format!("{}:{}@{wrong}", pushed.repository, pushed.tag);
    let error = start_error(&backend, &unit(&tag_pinned, PullPolicy::Missing, ws.path())).await;
    eprintln!("a wrong digest with the tag: {error}");
    assert!(
        error.contains(&wrong) && error.contains(&pushed.digest),
        "a moved tag names both digests: {error}"
    );
    assert!(!has_image(&format!("{}@{wrong}", pushed.repository)));
}

/// Done-when: `pull = "never"` with a missing image is refused with the remedy
/// (`box image pull` or `docker pull`), and fetches nothing; an unreachable
/// registry names the registry and the engine's message.
#[tokio::test]
async fn docker_pull_never_and_an_unreachable_registry_say_what_to_do() {
    let Some(backend) = engine().await else {
        return;
    };
    let registry = Registry::start();
    let pushed = Pushed::new(&registry);
    let ws = tempfile::tempdir().unwrap();
    let profiles = profiles(&format!(
        "image = \"{}\"\npull = \"never\"",
        pushed.pinned()
    ));
    let output = box_run(profiles.path(), ws.path(), &["true"]);
    let stderr = text(&output.stderr);
    eprintln!("box run's stderr:\n{stderr}");
    assert_eq!(output.status.code(), Some(125), "{stderr}");
    for says in [
        "pull policy is \"never\"".to_owned(),
        format!("box image pull {}", pushed.pinned()),
        format!("docker pull {}", pushed.pinned()),
    ] {
        assert!(stderr.contains(&says), "says {says:?}: {stderr}");
    }
    assert!(!has_image(&pushed.pinned()), "nothing was pulled");

    // Port 1 on loopback: nothing listens there.
    let error = start_error(
        &backend,
        &unit(
            "localhost:1/box-pull-test:none",
            PullPolicy::Missing,
            ws.path(),
        ),
    )
    .await;
    assert!(
        error.contains("registry localhost:1") && error.contains("connection refused"),
        "names the registry and the engine's message: {error}"
    );
}

/// `box image pull`: progress as JSON lines, then the result with the
/// registry's digest; the image is on the engine after it.
#[tokio::test]
async fn docker_box_image_pull_fetches_and_reports_the_digest() {
    if engine().await.is_none() {
        return;
    }
    let registry = Registry::start();
    let pushed = Pushed::new(&registry);
    let tagged = format!("{}:{}", pushed.repository, pushed.tag);
    let output = Command::new(box_bin())
        .args(["image", "pull", "--json", &tagged])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let stdout = text(&output.stdout);
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert!(
        lines
            .iter()
            .any(|line| line["status"] == "Downloading" && line["total"].as_u64() > Some(0)),
        "per-layer bytes: {stdout}"
    );
    let result = lines.last().unwrap();
    assert_eq!(result["digest"], serde_json::json!(pushed.digest));
    assert_eq!(result["downloaded"], serde_json::json!(true));
    assert!(has_image(&pushed.pinned()));

    // Plain lines when stderr is not a terminal; the result on stdout.
    let again = Command::new(box_bin())
        .args(["image", "pull", &pushed.pinned()])
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(0), "{}", text(&again.stderr));
    assert!(text(&again.stdout).contains(&pushed.digest));
    assert!(
        !text(&again.stderr).contains('\r'),
        "no redrawn line off a terminal"
    );
}

/// Done-when: a FROM-scratch image with only a static busybox, and a musl
/// image without glibc, run the executor (`box run` through it).
#[test]
fn docker_scratch_and_musl_images_run_the_executor() {
    let engine_answers = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(engine())
        .is_some();
    if !engine_answers {
        return;
    }
    let ws = tempfile::tempdir().unwrap();
    for (image, command, want) in [
        (
            "box-test-scratch:latest",
            &["busybox", "echo", "from scratch"][..],
            "from scratch",
        ),
        (
            "box-test-musl:latest",
            &["musl-hello"][..],
            "hello from musl",
        ),
    ] {
        let profiles = profiles(&format!("image = \"{image}\""));
        let output = box_run(profiles.path(), ws.path(), command);
        let stdout = text(&output.stdout);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{image}: {stdout}{}",
            text(&output.stderr)
        );
        assert!(stdout.contains(want), "{image}: {stdout}");
    }
}

/// MCP progress during `initialize`: a client that sends a progress token
/// with its initialize hears the pull as `notifications/progress` before the
/// answer (box serve over stdio); the answer's envelope names the digest.
#[test]
fn docker_initialize_reports_a_pull_as_mcp_progress() {
    use std::io::{BufRead as _, BufReader, Write as _};
    let engine_answers = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(engine())
        .is_some();
    if !engine_answers {
        return;
    }
    let registry = Registry::start();
    let pushed = Pushed::new(&registry);
    let ws = tempfile::tempdir().unwrap();
    let profiles = profiles(&format!("image = \"{}\"", pushed.pinned()));
    let mut serve = Command::new(box_bin())
        .args([
            "serve",
            "--backend",
            "docker",
            "--profile",
            "p",
            "--profiles",
        ])
        .arg(profiles.path())
        .arg("--workspace")
        .arg(ws.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut stdin = serve.stdin.take().unwrap();
    let initialize = serde_json::json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "pull-test", "version": "1"},
            "_meta": {"progressToken": "pull-1"}
        }
    });
    writeln!(stdin, "{initialize}").unwrap();
    stdin.flush().unwrap();
    let mut lines = BufReader::new(serve.stdout.take().unwrap()).lines();
    let mut progress = Vec::new();
    let answer = loop {
        let line = lines.next().expect("box serve answers initialize").unwrap();
        let message: serde_json::Value = serde_json::from_str(&line).unwrap();
        if message.get("id").is_some() {
            break message;
        }
        progress.push(message);
    };
    drop(stdin);
    let _ = serve.wait();
    assert!(answer.get("result").is_some(), "{answer}");
    assert!(!progress.is_empty(), "no progress before the answer");
    let mut last = 0;
    for event in &progress {
        assert_eq!(event["method"], "notifications/progress", "{event}");
        assert_eq!(event["params"]["progressToken"], "pull-1", "{event}");
        let now = event["params"]["progress"].as_u64().unwrap();
        assert!(now > last, "progress increases: {progress:?}");
        last = now;
        assert!(
            event["params"]["message"]
                .as_str()
                .unwrap()
                .contains("unit workspace: pulling"),
            "{event}"
        );
    }
    let units = answer.to_string();
    assert!(
        units.contains(&format!("\"imageDigest\":\"{}\"", pushed.digest)),
        "the envelope names the digest: {units}"
    );
}

/// box's own images are in no registry: `box image pull` says how they are
/// made instead of asking Docker Hub for them (no engine needed).
#[test]
fn box_image_pull_of_boxs_own_image_names_the_build() {
    let output = Command::new(box_bin())
        .args(["image", "pull", "box-base:bookworm"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("one of box's own images") && stderr.contains("box image build"),
        "{stderr}"
    );
}

/// A registry that wants a password, run here directly (`scripts/registry.sh`
/// runs open ones): Debian's docker-registry with an htpasswd file (bcrypt).
struct AuthRegistry {
    address: String,
    child: std::process::Child,
    _dir: tempfile::TempDir,
}

impl AuthRegistry {
    fn start(user: &str, password: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        // bcrypt, the only hash the registry's htpasswd reads.
        let hashed = Command::new("python3")
            .args([
                "-W",
                "ignore",
                "-c",
                "import crypt, sys; print(crypt.crypt(sys.argv[1], crypt.mksalt(crypt.METHOD_BLOWFISH)))",
                password,
            ])
            .output()
            .unwrap();
        assert!(hashed.status.success(), "{}", text(&hashed.stderr));
        std::fs::write(
            dir.path().join("htpasswd"),
            format!("{user}:{}", text(&hashed.stdout).trim()),
        )
        .unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let storage = dir.path().join("storage");
        std::fs::write(
            dir.path().join("config.yml"),
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n  secret: {}\nauth:\n  htpasswd:\n    realm: box-test\n    path: {}\n",
                storage.display(),
                suffix(),
                dir.path().join("htpasswd").display()
            ),
        )
        .unwrap();
        let child = Command::new("/usr/bin/docker-registry")
            .arg("serve")
            .arg(dir.path().join("config.yml"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("Debian's docker-registry (scripts/registry.sh install)");
        let address = format!("localhost:{port}");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "the registry on {address} did not listen"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Self {
            address,
            child,
            _dir: dir,
        }
    }
    /// `docker login` to this registry in a Docker config of the test's own
    /// (the host's is never touched), then push box-base there: the config
    /// directory, the pushed `NAME:TAG`, and what removes it.
    fn login_and_push(&self, password: &str) -> (tempfile::TempDir, String, Pushed) {
        let config = tempfile::tempdir().unwrap();
        let docker_with = |args: &[&str], stdin: Option<&str>| {
            use std::io::Write as _;
            let mut child = Command::new("docker")
                .arg("--config")
                .arg(config.path())
                .args(args)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let mut input = child.stdin.take().unwrap();
            if let Some(stdin) = stdin {
                input.write_all(stdin.as_bytes()).unwrap();
            }
            drop(input);
            let output = child.wait_with_output().unwrap();
            assert!(
                output.status.success(),
                "docker {args:?}: {}",
                text(&output.stderr)
            );
            output
        };
        docker_with(
            &["login", "-u", "boxtest", "--password-stdin", &self.address],
            Some(password),
        );
        let saved = std::fs::read_to_string(config.path().join("config.json")).unwrap();
        assert!(
            saved.contains("\"auth\""),
            "docker login stored a base64 auth: {saved}"
        );
        let tagged = format!("{}/box-pull-auth-{}:v1", self.address, suffix());
        docker(&["tag", BASE, &tagged]);
        docker_with(&["push", &tagged], None);
        docker(&["rmi", &tagged]);
        let cleanup = Pushed {
            repository: tagged.rsplit_once(':').unwrap().0.to_owned(),
            tag: "v1".to_owned(),
            digest: format!("sha256:{}", "0".repeat(64)),
        };
        (config, tagged, cleanup)
    }
}

impl Drop for AuthRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Credentials from the Docker config file: `box image pull` of an image in a
/// registry that wants a password uses what `docker login` stored there
/// (`DOCKER_CONFIG`), never prints it, and without it is refused naming the
/// registry and what to do.
#[test]
fn docker_registry_credentials_come_from_the_docker_config_file() {
    let engine_answers = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(engine())
        .is_some();
    if !engine_answers {
        return;
    }
    let password = format!("canary-{}", suffix());
    let registry = AuthRegistry::start("boxtest", &password);
    let (config, tagged, _cleanup) = registry.login_and_push(&password);

    // No credentials: refused, the registry named, with what to do.
    let empty = tempfile::tempdir().unwrap();
    let refused = Command::new(box_bin())
        .args(["image", "pull", &tagged])
        .env("DOCKER_CONFIG", empty.path())
        .output()
        .unwrap();
    let said = text(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{said}");
    assert!(
        said.contains(&format!("registry {}", registry.address)) && said.contains("docker login"),
        "{said}"
    );

    // With the config file's credentials: pulled; the password is never shown.
    let pulled = Command::new(box_bin())
        .args(["image", "pull", &tagged])
        .env("DOCKER_CONFIG", config.path())
        .env("RUST_LOG", "debug")
        .output()
        .unwrap();
    let (out, err) = (text(&pulled.stdout), text(&pulled.stderr));
    assert_eq!(pulled.status.code(), Some(0), "{err}");
    assert!(has_image(&tagged), "{out}");
    assert!(
        !out.contains(&password) && !err.contains(&password),
        "the password leaked: {out}{err}"
    );
}

/// A unit's `pull_secret`: the image comes from a registry that wants a
/// password, with the `user:password` in the variable the profile names (no
/// Docker config credentials at all); the unit never sees the variable, and
/// box never prints the value. Unset, the start is refused naming the
/// variable; `box image pull --pull-secret` does the same by hand.
#[test]
fn docker_a_units_pull_secret_pulls_from_a_registry_that_wants_a_password() {
    let engine_answers = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(engine())
        .is_some();
    if !engine_answers {
        return;
    }
    let password = format!("canary-{}", suffix());
    let registry = AuthRegistry::start("boxtest", &password);
    let (_config, tagged, _cleanup) = registry.login_and_push(&password);
    let empty = tempfile::tempdir().unwrap();
    let profiles = profiles(&format!(
        "image = \"{tagged}\"\npull_secret = \"BOX_TEST_PULL_AUTH\""
    ));
    let workspace = tempfile::tempdir().unwrap();
    let run = |secret: Option<&str>| {
        let mut command = Command::new(box_bin());
        command
            .args(["run", "--backend", "docker", "--profile", "p", "--profiles"])
            .arg(profiles.path())
            .arg("--workspace")
            .arg(workspace.path())
            .args(["--", "sh", "-c", "echo ran; env"])
            .env("DOCKER_CONFIG", empty.path())
            .env("BOX_LOG", "debug")
            .env_remove("BOX_TEST_PULL_AUTH")
            .stdin(Stdio::null());
        if let Some(secret) = secret {
            command.env("BOX_TEST_PULL_AUTH", secret);
        }
        command.output().unwrap()
    };

    // Unset: refused naming the variable, before anything reaches the registry.
    let refused = run(None);
    let said = text(&refused.stderr);
    assert_ne!(refused.status.code(), Some(0), "{said}");
    assert!(
        said.contains("pull_secret BOX_TEST_PULL_AUTH: is not set"),
        "{said}"
    );
    assert!(!has_image(&tagged));
    // Not user:password: refused the same way, the value not shown.
    let malformed = run(Some(&password));
    let said = text(&malformed.stderr);
    assert!(said.contains("does not hold user:password"), "{said}");
    assert!(!said.contains(&password), "the value leaked: {said}");

    // Set: pulled with it, run; the unit has no such variable; never printed.
    let value = format!("boxtest:{password}");
    let ran = run(Some(&value));
    let (out, err) = (text(&ran.stdout), text(&ran.stderr));
    assert_eq!(ran.status.code(), Some(0), "{out}{err}");
    assert!(out.starts_with("ran\n"), "{out}");
    assert!(has_image(&tagged), "{err}");
    assert!(
        !out.contains("BOX_TEST_PULL_AUTH"),
        "the unit got the variable: {out}"
    );
    assert!(
        !out.contains(&password) && !err.contains(&password),
        "the password leaked: {out}{err}"
    );

    // By hand: box image pull --pull-secret.
    docker(&["rmi", &tagged]);
    let pulled = Command::new(box_bin())
        .args([
            "image",
            "pull",
            "--pull-secret",
            "BOX_TEST_PULL_AUTH",
            &tagged,
        ])
        .env("DOCKER_CONFIG", empty.path())
        .env("BOX_TEST_PULL_AUTH", &value)
        .output()
        .unwrap();
    let err = text(&pulled.stderr);
    assert_eq!(pulled.status.code(), Some(0), "{err}");
    assert!(has_image(&tagged));
    assert!(!err.contains(&password), "the password leaked: {err}");
}

/// On a terminal, `box image pull` redraws one line (layers and bytes) in
/// place; with NO_COLOR it writes plain lines instead (`script` gives it a
/// terminal).
#[test]
fn docker_box_image_pull_draws_one_line_on_a_terminal() {
    let engine_answers = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(engine())
        .is_some();
    if !engine_answers {
        return;
    }
    let registry = Registry::start();
    let pushed = Pushed::new(&registry);
    let on_terminal = |no_color: bool| {
        docker(&["rmi", "-f", &pushed.pinned()]);
        let command = format!("{} image pull {}", box_bin().display(), pushed.pinned());
        let mut script = Command::new("script");
        script.args(["-qefc", &command, "/dev/null"]);
        if no_color {
            script.env("NO_COLOR", "1");
        } else {
            script.env_remove("NO_COLOR");
        }
        let output = script.stdin(Stdio::null()).output().unwrap();
        let shown = text(&output.stdout);
        assert_eq!(output.status.code(), Some(0), "{shown}");
        shown
    };
    let line = on_terminal(false);
    assert!(
        line.contains("\r\x1b[2Kpulling") && line.contains("layers"),
        "one redrawn line: {line:?}"
    );
    assert!(!line.contains("  layer "), "no plain lines: {line:?}");
    let plain = on_terminal(true);
    assert!(!plain.contains('\x1b'), "NO_COLOR: no escapes: {plain:?}");
    assert!(plain.contains("  layer "), "plain lines: {plain:?}");
}
