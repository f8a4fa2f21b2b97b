//! Warm units (`box serve --pool PROFILE=N`) on Docker and on the local
//! backend: a claimed unit is confined exactly as a cold one of the same
//! plan, no state crosses the sessions of one pool, a plan the pool cannot
//! serve starts cold and says why, the pool refills after a claim and after
//! a ready unit is killed, and leaves nothing when its host ends.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use box_jsonrpc::EXECUTOR_KEY;
use serde_json::{Value, json};

use crate::serve::{http, post};
use crate::support::{
    HttpHost, box_bin, commit_all, containers, docker_answers, merges_workspace_back,
};

/// The pool's profile: the default one, with two variables a session may drop.
const PROFILE: &str = "description = \"pool tests\"\nextends = \"default\"\n\n[env]\nset = { POOL_A = \"a\", POOL_B = \"b\" }\n\n[limits]\nmemory = \"1GiB\"\n";

/// A pool whose units get a secret at the claim, and a short lease.
const SECRET_PROFILE: &str = "description = \"pool tests, a secret\"\nextends = \"default\"\n\n[env]\nsecrets = [\"POOL_E2E_SECRET\"]\n\n[lifecycle]\nlease = \"2s\"\n";
const SECRET_VALUE: &str = "pool-e2e-secret-5c1f0a77";

/// What a unit's confinement looks like from inside (everything a session's
/// plan decides that a process can read about itself).
const PROBE: &str = "grep -E '^(Seccomp|Seccomp_filters|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs):' /proc/self/status; \
echo landlock:; (echo x > /dev/shm/probe) 2>&1; (echo x > /workspace/.probe && rm /workspace/.probe && echo workspace-writable) 2>&1; \
echo limits:; cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/memory/memory.memsw.limit_in_bytes /sys/fs/cgroup/pids/pids.max /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.cfs_period_us 2>/dev/null; \
cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/memory.swap.max /sys/fs/cgroup/pids.max /sys/fs/cgroup/cpu.max 2>/dev/null; \
echo ulimit: $(ulimit -n) $(ulimit -u); id; echo env:; env | sed 's/^HOSTNAME=.*/HOSTNAME=/' | sort";

/// The tightening both hosts' sessions ask for: narrower limits, one variable dropped.
fn tightening() -> Value {
    json!({"limits": {"memory": "512MiB", "pids": 300, "cpus": 1}, "env": {"drop": ["POOL_B"]}})
}

struct Host {
    host: HttpHost,
    instance: String,
    child: Child,
}

impl Host {
    async fn start(name: &str, profiles: &Path, workspace: &Path, pool: Option<&str>) -> Self {
        Self::start_with(name, profiles, workspace, pool, &[], &[]).await
    }

    /// [`Self::start`] with `env` set for the host.
    async fn start_with(
        name: &str,
        profiles: &Path,
        workspace: &Path,
        pool: Option<&str>,
        env: &[(&str, &str)],
        args: &[&str],
    ) -> Self {
        Self::start_on("docker", name, profiles, workspace, pool, env, args).await
    }

    /// [`Self::start_with`] on `backend`.
    async fn start_on(
        backend: &str,
        name: &str,
        profiles: &Path,
        workspace: &Path,
        pool: Option<&str>,
        env: &[(&str, &str)],
        args: &[&str],
    ) -> Self {
        let instance = format!("e2e-pool-{name}-{}", std::process::id());
        let host = HttpHost::on_a_free_port();
        let mut command = Command::new(box_bin());
        command
            .args(["serve", "--backend", backend, "--state", "none"])
            .args(["--instance", &instance, "--profile", "pooled"])
            .arg("--profiles")
            .arg(profiles)
            .arg("--workspace")
            .arg(workspace)
            .env("RUST_LOG", "warn")
            .envs(env.iter().copied())
            .args(args);
        if let Some(pool) = pool {
            command.args(["--pool", pool]);
        }
        let child = host.serve(command).await;
        Self {
            host,
            instance,
            child,
        }
    }

    fn address(&self) -> SocketAddr {
        self.host.address()
    }

    async fn metrics(&self) -> String {
        let reply = http(self.address(), "GET", "/metrics", &[], b"").await;
        String::from_utf8_lossy(&reply.body).into_owned()
    }

    /// Wait until the pool of `profile` holds `ready` units.
    async fn ready(&self, profile: &str, ready: usize) {
        let line = format!("box_pool_ready{{profile=\"{profile}\"}} {ready}");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let metrics = self.metrics().await;
            if metrics.lines().any(|l| l == line) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the pool never held {ready}: {metrics}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A session asking `ask`: its id and its workspace unit's envelope.
    async fn session(&self, ask: Value) -> (String, Value) {
        let (session, answer) = self
            .host
            .initialize(json!({"experimental": {EXECUTOR_KEY: {"box": ask}}}), &[])
            .await;
        let envelope =
            answer["result"]["capabilities"]["experimental"][EXECUTOR_KEY]["box"]["units"][0]
                .clone();
        assert!(envelope.is_object(), "{answer}");
        (session.unwrap(), envelope)
    }

    async fn bash(&self, session: &str, command: &str) -> String {
        let message = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": "bash", "arguments": {"command": command}}});
        let answer = post(self.address(), Some(session), &[], &message)
            .await
            .json();
        answer["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_else(|| panic!("bash {command}: {answer}"))
            .to_owned()
    }

    async fn end_session(&self, session: &str) {
        let headers = [("Mcp-Session-Id", session)];
        let reply = http(self.address(), "DELETE", "/mcp", &headers, b"").await;
        assert_eq!(reply.status, 200);
    }

    /// SIGTERM, and the host's exit status.
    fn stop(mut self) -> std::process::ExitStatus {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        self.child.wait().unwrap()
    }
}

impl Drop for Host {
    /// A failed test's host is killed (its units end within their lease).
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn setup() -> (tempfile::TempDir, tempfile::TempDir) {
    let profiles = tempfile::tempdir().unwrap();
    std::fs::write(profiles.path().join("pooled.toml"), PROFILE).unwrap();
    std::fs::write(profiles.path().join("pooledsec.toml"), SECRET_PROFILE).unwrap();
    std::fs::write(
        profiles.path().join("gone.toml"),
        "description = \"pool tests, an image that is not there\"\nextends = \"default\"\n\n[workspace]\nimage = \"box-e2e-pool-missing:none\"\npull = \"never\"\n",
    )
    .unwrap();
    (profiles, tempfile::tempdir().unwrap())
}

/// What of an envelope a plan decides (not the unit's id, nor how it started).
fn applied(envelope: &Value) -> Value {
    let mut envelope = envelope.clone();
    let object = envelope.as_object_mut().unwrap();
    for key in ["id", "warm", "warmWhy", "home"] {
        object.remove(key);
    }
    envelope
}

#[tokio::test]
async fn a_warm_units_confinement_equals_a_cold_ones_for_the_same_plan() {
    if !docker_answers().await {
        return;
    }
    let (profiles, workspace) = setup();
    let warm = Host::start("warm", profiles.path(), workspace.path(), Some("pooled=1")).await;
    let cold = Host::start("cold", profiles.path(), workspace.path(), None).await;
    warm.ready("pooled", 1).await;
    let (warm_session, warm_envelope) = warm.session(json!({"tighten": tightening()})).await;
    let (cold_session, cold_envelope) = cold.session(json!({"tighten": tightening()})).await;
    assert_eq!(warm_envelope["warm"], json!(true), "{warm_envelope}");
    assert!(cold_envelope.get("warm").is_none(), "{cold_envelope}");
    assert_eq!(applied(&warm_envelope), applied(&cold_envelope));
    assert_eq!(warm_envelope["limits"]["memoryBytes"], json!(512u64 << 20));
    let warm_probe = warm.bash(&warm_session, PROBE).await;
    let cold_probe = cold.bash(&cold_session, PROBE).await;
    assert_eq!(warm_probe, cold_probe);
    // The probe saw what it was meant to: box's seccomp layer, landlock
    // refusing a write the mounts allow, the session's limits, its variables.
    for seen in [
        "Seccomp:\t2",
        "NoNewPrivs:\t1",
        "CapEff:\t0000000000000000",
        "Permission denied",
        "workspace-writable",
        &(512u64 << 20).to_string(),
        "POOL_A=a",
    ] {
        assert!(warm_probe.contains(seen), "{seen} not in {warm_probe}");
    }
    assert!(!warm_probe.contains("POOL_B"), "{warm_probe}");
    for host in [warm, cold] {
        let instance = host.instance.clone();
        assert!(host.stop().success());
        assert_eq!(containers(&instance, None).await, Vec::<String>::new());
    }
}

#[tokio::test]
async fn a_pools_sessions_share_nothing_and_a_plan_it_cannot_serve_starts_cold() {
    if !docker_answers().await {
        return;
    }
    let (profiles, workspace) = setup();
    let audit = profiles.path().join("audit.jsonl");
    let host = Host::start_with(
        "share",
        profiles.path(),
        workspace.path(),
        Some("pooled=1"),
        &[],
        &["--audit", audit.to_str().unwrap()],
    )
    .await;
    host.ready("pooled", 1).await;
    let (first, first_envelope) = host
        .session(json!({"tighten": {"env": {"drop": ["POOL_B"]}}}))
        .await;
    assert_eq!(first_envelope["warm"], json!(true), "{first_envelope}");
    let seen = host
        .bash(
            &first,
            "echo secret-of-one > /tmp/one; echo one > ~/one; env | grep ^POOL_; hostname",
        )
        .await;
    assert!(
        seen.contains("POOL_A=a") && !seen.contains("POOL_B"),
        "{seen}"
    );
    // The pool refills after the claim.
    host.ready("pooled", 1).await;
    let metrics = host.metrics().await;
    assert!(
        metrics.contains("box_pool_claims_total{outcome=\"warm\"} 1"),
        "{metrics}"
    );
    let (second, second_envelope) = host
        .session(json!({"tighten": {"env": {"drop": ["POOL_A"]}}}))
        .await;
    assert_eq!(second_envelope["warm"], json!(true), "{second_envelope}");
    assert_ne!(first_envelope["id"], second_envelope["id"]);
    let seen_after = host
        .bash(
            &second,
            "cat /tmp/one ~/one 2>&1; env | grep ^POOL_; hostname",
        )
        .await;
    assert!(seen_after.contains("POOL_B=b"), "{seen_after}");
    assert!(!seen_after.contains("POOL_A"), "{seen_after}");
    assert!(!seen_after.contains("secret-of-one"), "{seen_after}");
    assert_eq!(
        seen_after.matches("No such file").count(),
        2,
        "{seen_after}"
    );
    // `box units ls` marks pooled units, claimed or ready; `inspect` says which.
    let listed = Command::new(box_bin())
        .args(["units", "ls", "--backend", "docker", "--filter"])
        .arg(format!("instance={}", host.instance))
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&listed.stdout);
    assert_eq!(table.matches("workspace (pooled)").count(), 3, "{table}");
    let claimed = second_envelope["id"].as_str().unwrap();
    let inspected = Command::new(box_bin())
        .args(["units", "inspect", &claimed[..12]])
        .output()
        .unwrap();
    let inspected = String::from_utf8_lossy(&inspected.stdout);
    assert!(inspected.contains("claimed by a session"), "{inspected}");
    // A claimed unit serves one session, and goes with it.
    host.end_session(&first).await;
    let first_id = first_envelope["id"].as_str().unwrap().to_owned();
    assert!(!containers(&host.instance, None).await.contains(&first_id));
    // A plan the pool cannot serve starts cold and says why.
    let (_, read_only) = host
        .session(json!({"tighten": {"workspace": {"mode": "ro"}}}))
        .await;
    assert_eq!(read_only["warm"], json!(false), "{read_only}");
    let why = read_only["warmWhy"].as_str().unwrap();
    assert!(why.contains("workspace.mode"), "{why}");
    let (_, other) = host.session(json!({"profile": "default"})).await;
    assert_eq!(other["warm"], json!(false), "{other}");
    assert!(
        other["warmWhy"]
            .as_str()
            .unwrap()
            .contains("no pool of profile default"),
        "{other}"
    );
    let metrics = host.metrics().await;
    assert!(
        metrics.contains("box_pool_claims_total{outcome=\"unfit\"} 1"),
        "{metrics}"
    );
    // Each claim is an audit line: warm with the unit's id, or cold and why.
    let lines: Vec<Value> = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .filter(|line: &Value| line["kind"] == "pool")
        .collect();
    assert_eq!(lines.len(), 4, "{lines:?}");
    assert_eq!(lines[0]["warm"], json!(true));
    assert_eq!(lines[0]["id"], first_envelope["id"]);
    assert_eq!(lines[2]["warm"], json!(false));
    assert!(lines[2]["why"].as_str().unwrap().contains("workspace.mode"));
    // The host's end removes its pool's ready units with its sessions'.
    let instance = host.instance.clone();
    assert!(host.stop().success());
    assert_eq!(containers(&instance, None).await, Vec::<String>::new());
}

/// The container's configured environment, as `docker inspect` shows it.
async fn inspected_env(id: &str) -> Vec<String> {
    let docker = boxhost::backend::docker::bollard::Docker::connect_with_defaults().unwrap();
    let inspect = docker.inspect_container(id, None).await.unwrap();
    inspect
        .config
        .and_then(|config| config.env)
        .unwrap_or_default()
}

#[tokio::test]
async fn a_warm_unit_gets_its_secret_at_the_claim_and_pooled_units_end_with_a_killed_host() {
    if !docker_answers().await {
        return;
    }
    let (profiles, workspace) = setup();
    let host = Host::start_with(
        "secret",
        profiles.path(),
        workspace.path(),
        Some("pooledsec=1"),
        &[("POOL_E2E_SECRET", SECRET_VALUE)],
        &[],
    )
    .await;
    host.ready("pooledsec", 1).await;
    let (session, envelope) = host.session(json!({"profile": "pooledsec"})).await;
    assert_eq!(envelope["warm"], json!(true), "{envelope}");
    assert_eq!(
        envelope["secrets"][0]["name"],
        json!("POOL_E2E_SECRET"),
        "{envelope}"
    );
    let seen = host
        .bash(
            &session,
            &format!("test \"$(cat /run/secrets/POOL_E2E_SECRET)\" = {SECRET_VALUE} && echo delivered; env | grep -c POOL_E2E_SECRET"),
        )
        .await;
    assert!(seen.contains("delivered"), "{seen}");
    // Never in the container's configuration: not the claimed unit's, nor
    // the one the pool started since.
    host.ready("pooledsec", 1).await;
    for id in containers(&host.instance, None).await {
        let env = inspected_env(&id).await;
        assert!(!env.iter().any(|var| var.contains(SECRET_VALUE)), "{env:?}");
    }
    // kill -9: the pooled unit and the session's end within their lease.
    let mut host = host;
    host.child.kill().unwrap();
    host.child.wait().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !containers(&host.instance, None).await.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "units of a killed host outlived their 2 s lease"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn a_pool_that_cannot_refill_says_so_in_readyz() {
    if !docker_answers().await {
        return;
    }
    let (profiles, workspace) = setup();
    let host = Host::start("gone", profiles.path(), workspace.path(), Some("gone=1")).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let reply = http(host.address(), "GET", "/readyz", &[], b"").await;
        let body = String::from_utf8_lossy(&reply.body).into_owned();
        if reply.status == 503 {
            // The reason, to a probe with no token on a host that needs none.
            assert!(
                body.contains("the pool of profile gone cannot refill"),
                "{body}"
            );
            // And `box doctor --host` says so; --strict fails on it.
            let doctor = Command::new(box_bin())
                .args(["doctor", "--strict", "--host"])
                .arg(format!("http://{}", host.address()))
                .output()
                .unwrap();
            assert_eq!(doctor.status.code(), Some(1), "{doctor:?}");
            let said = String::from_utf8_lossy(&doctor.stdout);
            assert!(
                said.contains("NOT READY")
                    && said.contains("the pool of profile gone cannot refill"),
                "{said}"
            );
            assert!(said.contains("pool          gone: 0 of 1 ready"), "{said}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "/readyz stayed {}: {body}",
            reply.status
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let instance = host.instance.clone();
    assert!(host.stop().success());
    assert_eq!(containers(&instance, None).await, Vec::<String>::new());
}

#[tokio::test]
async fn a_session_on_a_warm_unit_survives_kill_9_of_its_host_and_reattaches() {
    if !docker_answers().await {
        return;
    }
    survives_kill_9_and_reattaches("docker").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn local_a_session_on_a_warm_unit_survives_kill_9_of_its_host_and_reattaches() {
    survives_kill_9_and_reattaches("local").await;
}

async fn survives_kill_9_and_reattaches(backend: &str) {
    let (profiles, workspace) = setup();
    let (state, instances) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let instance = format!("e2e-pool-reattach-{backend}-{}", std::process::id());
    let command = || {
        let mut command = Command::new(box_bin());
        command
            .args(["serve", "--backend", backend, "--instance", &instance])
            .args(["--profile", "pooled", "--pool", "pooled=1"])
            .arg("--state")
            .arg(state.path().join("sessions"))
            .arg("--profiles")
            .arg(profiles.path())
            .arg("--workspace")
            .arg(workspace.path())
            .env("RUST_LOG", "warn")
            .env("BOX_INSTANCE_DIR", instances.path());
        command
    };
    let http_host = HttpHost::on_a_free_port();
    let child = http_host.serve(command()).await;
    let mut host = Host {
        host: http_host,
        instance: instance.clone(),
        child,
    };
    host.ready("pooled", 1).await;
    let (session, answer) = host.host.initialize(json!({}), &[]).await;
    let session = session.unwrap();
    let answered = &answer["result"]["capabilities"]["experimental"][EXECUTOR_KEY]["box"];
    assert_eq!(answered["units"][0]["warm"], json!(true), "{answer}");
    let secret = answered["session"]["secret"].as_str().unwrap().to_owned();
    host.bash(&session, "echo kept > /tmp/survivor").await;
    host.child.kill().unwrap();
    host.child.wait().unwrap();
    host.child = host.host.serve(command()).await;
    let ask = json!({"experimental": {EXECUTOR_KEY: {"box": {"reattach": {"session": session, "secret": secret}}}}});
    let (again, answer) = host.host.initialize(ask, &[]).await;
    assert_eq!(again.as_deref(), Some(session.as_str()), "{answer}");
    let answered = &answer["result"]["capabilities"]["experimental"][EXECUTOR_KEY]["box"];
    assert_eq!(answered["reattached"], json!(true), "{answer}");
    let seen = host.bash(&session, "cat /tmp/survivor").await;
    assert!(seen.contains("kept"), "{seen}");
    assert!(host.stop().success());
    if backend == "docker" {
        assert_eq!(containers(&instance, None).await, Vec::<String>::new());
    } else {
        // The killed host's ready unit ends with its lease; the session's
        // was re-adopted and removed by the host's stop.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(45);
        while !running_local_units(&instance).is_empty() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{:?}",
                running_local_units(&instance)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // Its ended record is `box gc`'s, as a user's would be: left behind,
        // every run of this test showed in `box units ls`.
        let gc = Command::new(box_bin())
            .args(["gc", "--instance", &instance])
            .env("BOX_INSTANCE_DIR", instances.path())
            .output()
            .unwrap();
        assert!(
            gc.status.success(),
            "{}",
            String::from_utf8_lossy(&gc.stderr)
        );
    }
}

/// What a local unit's confinement looks like from inside: the process's
/// own status, landlock refusing a write the unit's mounts would allow, the
/// rlimits the session's limits became, its user, its variables (the unit's
/// private directories' names, which differ per unit, blanked).
const LOCAL_PROBE: &str = "grep -E '^(Seccomp|Seccomp_filters|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs):' /proc/self/status; \
echo landlock:; (echo x > /dev/shm/probe) 2>&1; (echo x > .probe && rm .probe && echo workspace-writable) 2>&1; \
echo ulimit: data $(ulimit -d) as $(ulimit -v) nproc $(ulimit -u) nofile $(ulimit -n) fsize $(ulimit -f); id; \
echo namespaces:; ls -l /proc/self/ns | sed 's/.*-> //; s/\\[.*//' | sort; ip -o link 2>/dev/null | cut -d: -f2; \
echo env:; env | sed 's/box-local-[^/]*/UNIT/g' | sort";

/// Every process of the local unit `id` (its helper and what it started).
fn local_unit_processes(id: &str) -> Vec<u32> {
    let shown = Command::new(box_bin())
        .args(["units", "inspect", "--json", "--backend", "local", id])
        .output()
        .unwrap();
    assert!(shown.status.success(), "{shown:?}");
    let shown: Value = serde_json::from_slice(&shown.stdout).unwrap();
    let helper = shown["pid"].as_u64().unwrap_or_else(|| panic!("{shown}")) as u32;
    let mut tree = vec![helper];
    let mut at = 0;
    while at < tree.len() {
        let parent = tree[at];
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let ppid = stat
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|ppid| ppid.parse::<u32>().ok());
            if ppid == Some(parent) && !tree.contains(&pid) {
                tree.push(pid);
            }
        }
        at += 1;
    }
    tree
}

/// The local units of `instance` whose helper still runs: (id, session).
fn running_local_units(instance: &str) -> Vec<(String, String)> {
    let listed = Command::new(box_bin())
        .args(["units", "ls", "--json", "--backend", "local", "--filter"])
        .arg(format!("instance={instance}"))
        .output()
        .unwrap();
    assert!(listed.status.success(), "{listed:?}");
    let listed: Vec<Value> = serde_json::from_slice(&listed.stdout).unwrap();
    listed
        .iter()
        .filter(|unit| unit["state"] == "running")
        .map(|unit| {
            (
                unit["id"].as_str().unwrap().to_owned(),
                unit["session"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// The ready (unclaimed) pooled units of `instance`, by their session.
fn ready_local_units(instance: &str, claimed: &[&Value]) -> Vec<String> {
    running_local_units(instance)
        .into_iter()
        .filter(|(id, _)| !claimed.iter().any(|envelope| envelope["id"] == *id))
        .map(|(id, _)| id)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn local_a_warm_units_confinement_equals_a_cold_ones_for_the_same_plan() {
    let (profiles, workspace) = setup();
    let start = |name, pool| {
        Host::start_on(
            "local",
            name,
            profiles.path(),
            workspace.path(),
            pool,
            &[],
            &[],
        )
    };
    let warm = start("lwarm", Some("pooled=1")).await;
    let cold = start("lcold", None).await;
    warm.ready("pooled", 1).await;
    let (warm_session, warm_envelope) = warm.session(json!({"tighten": tightening()})).await;
    let (cold_session, cold_envelope) = cold.session(json!({"tighten": tightening()})).await;
    assert_eq!(warm_envelope["warm"], json!(true), "{warm_envelope}");
    assert!(cold_envelope.get("warm").is_none(), "{cold_envelope}");
    assert_eq!(applied(&warm_envelope), applied(&cold_envelope));
    assert_eq!(warm_envelope["limits"]["memoryBytes"], json!(512u64 << 20));
    assert_eq!(warm_envelope["limits"]["pids"], json!(300));
    let warm_probe = warm.bash(&warm_session, LOCAL_PROBE).await;
    let cold_probe = cold.bash(&cold_session, LOCAL_PROBE).await;
    assert_eq!(warm_probe, cold_probe);
    // The probe saw what it was meant to: box's seccomp layers, landlock
    // refusing a write, the session's narrower rlimits, its variables.
    for seen in [
        "Seccomp:\t2",
        "NoNewPrivs:\t1",
        "CapEff:\t0000000000000000",
        "Permission denied",
        "workspace-writable",
        &format!("data {}", 512 << 10),
        "nproc 300",
        "POOL_A=a",
    ] {
        assert!(warm_probe.contains(seen), "{seen} not in {warm_probe}");
    }
    assert!(!warm_probe.contains("POOL_B"), "{warm_probe}");
    for host in [warm, cold] {
        let instance = host.instance.clone();
        assert!(host.stop().success());
        assert_eq!(running_local_units(&instance), Vec::new());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn local_a_pools_sessions_share_nothing_and_a_plan_it_cannot_serve_starts_cold() {
    let (profiles, workspace) = setup();
    let host = Host::start_on(
        "local",
        "lshare",
        profiles.path(),
        workspace.path(),
        Some("pooled=1"),
        &[],
        &[],
    )
    .await;
    host.ready("pooled", 1).await;
    let (first, first_envelope) = host
        .session(json!({"tighten": {"env": {"drop": ["POOL_B"]}}}))
        .await;
    assert_eq!(first_envelope["warm"], json!(true), "{first_envelope}");
    // A file in its /tmp and its home, a process left running, a variable.
    let seen = host
        .bash(
            &first,
            "echo secret-of-one > /tmp/one; echo one > ~/one; (setsid sleep 777 > /dev/null 2>&1 &); env | grep ^POOL_",
        )
        .await;
    assert!(
        seen.contains("POOL_A=a") && !seen.contains("POOL_B"),
        "{seen}"
    );
    // The pool refills after the claim.
    host.ready("pooled", 1).await;
    let (second, second_envelope) = host
        .session(json!({"tighten": {"env": {"drop": ["POOL_A"]}}}))
        .await;
    assert_eq!(second_envelope["warm"], json!(true), "{second_envelope}");
    assert_ne!(first_envelope["id"], second_envelope["id"]);
    let seen_after = host
        .bash(
            &second,
            "cat /tmp/one ~/one 2>&1; ls /tmp; env | grep ^POOL_; ps -eo args | grep -c '^sleep 777'",
        )
        .await;
    assert!(seen_after.contains("POOL_B=b"), "{seen_after}");
    assert!(!seen_after.contains("POOL_A"), "{seen_after}");
    assert!(!seen_after.contains("secret-of-one"), "{seen_after}");
    assert_eq!(
        seen_after.matches("No such file").count(),
        2,
        "{seen_after}"
    );
    assert!(
        seen_after.contains("\n0\n"),
        "a process of the first session: {seen_after}"
    );
    // `box units ls` marks pooled units, claimed or ready.
    let listed = Command::new(box_bin())
        .args(["units", "ls", "--backend", "local", "--filter"])
        .arg(format!("instance={}", host.instance))
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&listed.stdout);
    assert_eq!(table.matches("workspace (pooled)").count(), 3, "{table}");
    let claimed = second_envelope["id"].as_str().unwrap();
    let inspected = Command::new(box_bin())
        .args(["units", "inspect", "--backend", "local", &claimed[..12]])
        .output()
        .unwrap();
    let inspected = String::from_utf8_lossy(&inspected.stdout);
    assert!(inspected.contains("claimed by a session"), "{inspected}");
    // A claimed unit serves one session, and goes with it (its processes too).
    host.end_session(&first).await;
    let first_id = first_envelope["id"].as_str().unwrap().to_owned();
    assert!(
        !running_local_units(&host.instance)
            .iter()
            .any(|(id, _)| *id == first_id)
    );
    // A plan the pool cannot serve starts cold and says why.
    let (_, read_only) = host
        .session(json!({"tighten": {"workspace": {"mode": "ro"}}}))
        .await;
    assert_eq!(read_only["warm"], json!(false), "{read_only}");
    let why = read_only["warmWhy"].as_str().unwrap();
    assert!(why.contains("workspace.mode"), "{why}");
    let (_, other) = host.session(json!({"profile": "default"})).await;
    assert_eq!(other["warm"], json!(false), "{other}");
    assert!(
        other["warmWhy"]
            .as_str()
            .unwrap()
            .contains("no pool of profile default"),
        "{other}"
    );
    let instance = host.instance.clone();
    assert!(host.stop().success());
    assert_eq!(running_local_units(&instance), Vec::new());
}

#[tokio::test(flavor = "multi_thread")]
async fn local_a_warm_unit_gets_its_secret_at_the_claim_and_pooled_units_end_with_a_killed_host() {
    let (profiles, workspace) = setup();
    let host = Host::start_on(
        "local",
        "lsecret",
        profiles.path(),
        workspace.path(),
        Some("pooledsec=1"),
        &[("POOL_E2E_SECRET", SECRET_VALUE)],
        &[],
    )
    .await;
    host.ready("pooledsec", 1).await;
    // Before a claim, no process of the pooled unit holds the secret.
    let ready = ready_local_units(&host.instance, &[]);
    assert_eq!(ready.len(), 1, "{ready:?}");
    let environ = |id: &str| -> Vec<String> {
        local_unit_processes(id)
            .iter()
            .map(|pid| {
                String::from_utf8_lossy(
                    &std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default(),
                )
                .into_owned()
            })
            .collect()
    };
    let before = environ(&ready[0]);
    assert!(before.len() >= 3, "helper, init, executor: {before:?}");
    assert!(!before.iter().any(|env| env.contains(SECRET_VALUE)));
    let (session, envelope) = host.session(json!({"profile": "pooledsec"})).await;
    assert_eq!(envelope["warm"], json!(true), "{envelope}");
    assert_eq!(envelope["id"].as_str(), Some(ready[0].as_str()));
    assert_eq!(
        envelope["secrets"][0]["name"],
        json!("POOL_E2E_SECRET"),
        "{envelope}"
    );
    let seen = host
        .bash(
            &session,
            &format!(
                "test \"$(cat /run/secrets/POOL_E2E_SECRET)\" = {SECRET_VALUE} && echo delivered"
            ),
        )
        .await;
    assert!(seen.contains("delivered"), "{seen}");
    // The unit the pool started since has no secret either.
    host.ready("pooledsec", 1).await;
    let next = ready_local_units(&host.instance, &[&envelope]);
    assert_eq!(next.len(), 1, "{next:?}");
    assert!(
        !environ(&next[0])
            .iter()
            .any(|env| env.contains(SECRET_VALUE))
    );
    // kill -9: the pooled unit and the session's end within their 2 s lease.
    let mut host = host;
    host.child.kill().unwrap();
    host.child.wait().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2 + 10);
    while !running_local_units(&host.instance).is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "units of a killed host outlived their 2 s lease"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A pool's unit killed while it waits is replaced; the docker one too.
async fn a_pool_refills_after_its_ready_unit_is_killed(backend: &str) {
    let (profiles, workspace) = setup();
    let host = Host::start_on(
        backend,
        &format!("{backend}-killed"),
        profiles.path(),
        workspace.path(),
        Some("pooled=1"),
        &[],
        &[],
    )
    .await;
    host.ready("pooled", 1).await;
    let killed = if backend == "local" {
        let ready = ready_local_units(&host.instance, &[]);
        assert_eq!(ready.len(), 1, "{ready:?}");
        let helper = local_unit_processes(&ready[0])[0];
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(helper as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        ready[0].clone()
    } else {
        let ready = containers(&host.instance, None).await;
        assert_eq!(ready.len(), 1, "{ready:?}");
        let docker = boxhost::backend::docker::bollard::Docker::connect_with_defaults().unwrap();
        docker
            .kill_container(
                &ready[0],
                None::<boxhost::backend::docker::bollard::query_parameters::KillContainerOptions>,
            )
            .await
            .unwrap();
        ready[0].clone()
    };
    // Another unit is started in its place, and a session claims it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let metrics = host.metrics().await;
        let running = if backend == "local" {
            ready_local_units(&host.instance, &[])
        } else {
            containers(&host.instance, None).await
        };
        if metrics.contains("box_pool_ready{profile=\"pooled\"} 1")
            && running.len() == 1
            && !running
                .iter()
                .any(|id| id.starts_with(&killed) || killed.starts_with(id.as_str()))
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the pool never replaced its killed unit: {running:?} {metrics}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (session, envelope) = host.session(json!({})).await;
    assert_eq!(envelope["warm"], json!(true), "{envelope}");
    assert_ne!(envelope["id"].as_str(), Some(killed.as_str()));
    let seen = host.bash(&session, "echo served").await;
    assert!(seen.contains("served"), "{seen}");
    assert!(host.stop().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn local_a_pool_refills_after_its_ready_unit_is_killed() {
    a_pool_refills_after_its_ready_unit_is_killed("local").await;
}

#[tokio::test]
async fn a_pool_refills_after_its_ready_container_is_killed() {
    if !docker_answers().await {
        return;
    }
    a_pool_refills_after_its_ready_unit_is_killed("docker").await;
}

/// A profile's `[pool] size` keeps warm units on a listening host without
/// `--pool`; `--pool PROFILE=0` keeps none for it.
#[tokio::test(flavor = "multi_thread")]
async fn a_profiles_pool_table_keeps_warm_units_and_pool_0_overrides_it() {
    let (profiles, workspace) = setup();
    std::fs::write(
        profiles.path().join("pooled.toml"),
        format!("{PROFILE}\n[pool]\nsize = 1\n"),
    )
    .unwrap();
    let host = Host::start_on(
        "local",
        "ltable",
        profiles.path(),
        workspace.path(),
        None,
        &[],
        &[],
    )
    .await;
    host.ready("pooled", 1).await;
    let (_, envelope) = host.session(json!({})).await;
    assert_eq!(envelope["warm"], json!(true), "{envelope}");
    assert!(host.stop().success());
    let host = Host::start_on(
        "local",
        "ltable0",
        profiles.path(),
        workspace.path(),
        Some("pooled=0"),
        &[],
        &[],
    )
    .await;
    let metrics = host.metrics().await;
    assert!(!metrics.contains("box_pool_ready{"), "{metrics}");
    let (_, envelope) = host.session(json!({})).await;
    assert!(envelope.get("warm").is_none(), "{envelope}");
    assert!(host.stop().success());
}

/// A profile's `[pool]` the host cannot keep (its workspace network is
/// bridge, which joins a network made at its session's start) does not stop a host that serves every other profile: it keeps
/// no pool for it, says why in a WARN line naming the profile's table (not
/// a `--pool` flag nobody wrote), and its sessions start cold.
#[tokio::test]
async fn a_pool_table_the_host_cannot_keep_is_skipped_and_named() {
    let (profiles, workspace) = setup();
    std::fs::write(
        profiles.path().join("pooled.toml"),
        format!("{PROFILE}\n[network]\nmode = \"bridge\"\n\n[pool]\nsize = 1\n"),
    )
    .unwrap();
    let log = tempfile::NamedTempFile::new().unwrap();
    let host = HttpHost::on_a_free_port();
    let mut command = Command::new(box_bin());
    command
        .args([
            "serve",
            "--backend",
            "local",
            "--state",
            "none",
            "--profile",
            "pooled",
        ])
        .arg("--profiles")
        .arg(profiles.path())
        .arg("--workspace")
        .arg(workspace.path())
        .env("RUST_LOG", "warn")
        .stderr(log.reopen().unwrap());
    let child = host.serve(command).await;
    let host = Host {
        host,
        instance: String::new(),
        child,
    };
    let metrics = host.metrics().await;
    assert!(!metrics.contains("box_pool_ready{"), "{metrics}");
    let (_, envelope) = host.session(json!({})).await;
    assert!(envelope.get("warm").is_none(), "{envelope}");
    assert!(host.stop().success());
    let stderr = std::fs::read_to_string(log.path()).unwrap();
    assert!(
        stderr.lines().any(|line| line.contains("WARN")
            && line.contains("profile pooled's [pool]: the profile's workspace network is bridge")
            && line.contains("its sessions start cold")),
        "{stderr}"
    );
    assert!(!stderr.contains("--pool pooled"), "{stderr}");
}

/// `box run --host` against a pooled `box serve --listen`: the command runs
/// in a warm unit of the host's pool (its output, stdin and status passed
/// through as with a host of its own), the unit is gone when `box run`
/// exits, the pool refills, `-e` is judged by the host's profile, and `box
/// doctor --host` tells the pool's state.
async fn box_run_through_a_pooled_host(backend: &str) {
    let (profiles, workspace) = setup();
    let host = Host::start_on(
        backend,
        &format!("run-{backend}"),
        profiles.path(),
        workspace.path(),
        Some("pooled=1"),
        &[],
        &[],
    )
    .await;
    host.ready("pooled", 1).await;
    let url = format!("http://{}", host.address());
    let run = |args: &[&str], stdin: &[u8]| {
        use std::io::Write as _;
        let mut child = Command::new(box_bin())
            .args(["run", "--host", &url])
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin).unwrap();
        child.wait_with_output().unwrap()
    };
    let ran = run(
        &[
            "--wait-removal",
            "sh",
            "-c",
            "cat; echo out; echo err >&2; echo $POOL_A; exit 3",
        ],
        b"from stdin\n",
    );
    let stderr = String::from_utf8_lossy(&ran.stderr);
    assert_eq!(ran.status.code(), Some(3), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&ran.stdout),
        "from stdin\nout\na\n",
        "{stderr}"
    );
    // After the root-user warning when the unit runs as root (as here).
    assert!(stderr.ends_with("\nerr\n") || stderr == "err\n", "{stderr}");
    let metrics = host.metrics().await;
    assert!(
        metrics.contains("box_pool_claims_total{outcome=\"warm\"} 1"),
        "box run did not claim the warm unit: {metrics}"
    );
    // --wait-removal: its session was deleted and its unit removed before
    // it exited; the pool refills.
    assert!(
        metrics.contains("box_sessions_active 0"),
        "box run's session outlived it: {metrics}"
    );
    host.ready("pooled", 1).await;
    let units = async || {
        if backend == "docker" {
            containers(&host.instance, None).await.len()
        } else {
            running_local_units(&host.instance).len()
        }
    };
    assert_eq!(units().await, 1);
    // Without it, box exits once the host has the session's end; the host
    // removes the unit after.
    let ran = run(&["true"], b"");
    assert!(ran.status.success(), "{ran:?}");
    host.ready("pooled", 1).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while units().await != 1 || !host.metrics().await.contains("box_sessions_active 0") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the host did not remove box run's unit"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A variable the host's profile does not let through is refused by name.
    let refused = run(&["-e", "NOT_PASSED=1", "true"], b"");
    assert_eq!(refused.status.code(), Some(125));
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.contains(
            "-e NOT_PASSED: the host's profile pooled does not let this variable through"
        ),
        "{said}"
    );
    // `box doctor --host`: ready, and the pool full (again: the refused
    // run's session claimed a unit before the host's envelope was read).
    host.ready("pooled", 1).await;
    let doctor = Command::new(box_bin())
        .args(["doctor", "--json", "--host", &url])
        .output()
        .unwrap();
    assert!(doctor.status.success(), "{doctor:?}");
    let report: Value = serde_json::from_slice(&doctor.stdout).unwrap();
    assert_eq!(report["host"]["ready"], json!(true), "{}", report["host"]);
    let pools = report["host"]["pools"].as_array().unwrap();
    assert!(
        pools.contains(&json!({"profile": "pooled", "ready": 1, "size": 1})),
        "{}",
        report["host"]
    );
    assert!(host.stop().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn local_box_run_through_a_pooled_host_claims_a_warm_unit() {
    box_run_through_a_pooled_host("local").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn box_run_through_a_pooled_host_claims_a_warm_container() {
    if !docker_answers().await {
        return;
    }
    box_run_through_a_pooled_host("docker").await;
}

/// `box run --host` and `box doctor --host` with a host that asks for a
/// bearer token, and with no host there: each failure names what to do.
#[tokio::test(flavor = "multi_thread")]
async fn box_run_through_a_host_sends_its_token_and_names_a_host_not_there() {
    let (profiles, workspace) = setup();
    let token = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(token.path(), "s3cret-token-for-tests\n").unwrap();
    let token_path = token.path().to_str().unwrap();
    let host = Host::start_on(
        "local",
        "run-token",
        profiles.path(),
        workspace.path(),
        None,
        &[],
        &["--token-file", token_path],
    )
    .await;
    let url = format!("http://{}", host.address());
    let without = Command::new(box_bin())
        .args(["run", "--host", &url, "true"])
        .output()
        .unwrap();
    assert_eq!(without.status.code(), Some(125), "{without:?}");
    let said = String::from_utf8_lossy(&without.stderr);
    assert!(said.contains("HTTP 401"), "{said}");
    let with = Command::new(box_bin())
        .args(["run", "--host", &url, "--token-file", token_path])
        .args(["sh", "-c", "echo $POOL_A"])
        .output()
        .unwrap();
    assert!(with.status.success(), "{with:?}");
    assert_eq!(String::from_utf8_lossy(&with.stdout), "a\n");
    // The token's value is never said.
    assert!(!said.contains("s3cret"), "{said}");
    // Interrupted (^C), as without --host: the signal goes on to the
    // command, the session is deleted, and box exits 130.
    let marker = format!("4242{}", std::process::id());
    let mut child = Command::new(box_bin())
        .args(["run", "--host", &url, "--token-file", token_path])
        .args(["sleep", &marker])
        .stdin(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let sleeping = || {
        std::fs::read_dir("/proc").unwrap().flatten().any(|entry| {
            std::fs::read(entry.path().join("cmdline"))
                .is_ok_and(|line| line == format!("sleep\0{marker}\0").as_bytes())
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !sleeping() {
        assert!(
            std::time::Instant::now() < deadline,
            "the command never ran"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(130));
    // The host removes the unit after box exits: the command is gone soon.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while sleeping() {
        assert!(
            std::time::Instant::now() < deadline,
            "the command outlived its interrupted box run"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let doctor = Command::new(box_bin())
        .args(["doctor", "--host", &url])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&doctor.stdout);
    assert!(said.contains(": ready"), "{said}");
    assert!(said.contains("bearer token"), "{said}");
    assert!(host.stop().success());
    // The backend is the host's: an explicit --backend is refused, not ignored.
    let both = Command::new(box_bin())
        .args(["run", "--host", &url, "--backend", "local", "true"])
        .output()
        .unwrap();
    assert_eq!(both.status.code(), Some(2), "{both:?}");
    let said = String::from_utf8_lossy(&both.stderr);
    assert!(said.contains("cannot be used with"), "{said}");
    // Nothing listens there now.
    let gone = Command::new(box_bin())
        .args(["run", "--host", &url, "true"])
        .output()
        .unwrap();
    assert_eq!(gone.status.code(), Some(125));
    let said = String::from_utf8_lossy(&gone.stderr);
    assert!(
        said.contains("is `box serve --listen` running there?"),
        "{said}"
    );
    let doctor = Command::new(box_bin())
        .args(["doctor", "--strict", "--host", &url])
        .output()
        .unwrap();
    assert_eq!(doctor.status.code(), Some(1), "{doctor:?}");
    let said = String::from_utf8_lossy(&doctor.stderr);
    assert!(
        said.contains("is `box serve --listen` running there?"),
        "{said}"
    );
}

/// A pooled egress profile's unit: the pool's allow list names two pinned
/// names of a server on 127.0.0.1; `denied.test` is pinned but not allowed.
fn egress_profile(web: u16) -> String {
    format!(
        r#"description = "pool tests, egress"
extends = "default"

[workspace]
image = "box-test-tools:latest"
local_userland = "host"

[network]
mode = "egress"
allow = ["allowed.test:{web}", "other.test:{web}"]
hosts = {{ "allowed.test" = "127.0.0.1", "other.test" = "127.0.0.1", "denied.test" = "127.0.0.1" }}

[operator]
allow_dangerous = ["private-destinations"]
"#
    )
}

/// A fetch of `name` through a session's unit: curl's status and body.
async fn fetch(host: &Host, session: &str, name: &str, web: u16) -> String {
    host.bash(
        session,
        &format!(
            "curl -sS -m 10 -w ' status=%{{http_code}}' http://{name}:{web}/; echo \" exit=$?\""
        ),
    )
    .await
}

/// Issue 25: a profile whose workspace network is egress keeps a pool. A
/// session claims a warm unit whose envelope equals a cold one's of the same
/// plan; it reaches an allowed host through the proxy the claim served and
/// is refused one the list does not name; a session whose plan narrows the
/// list gets the narrower list; and the next session claimed from the pool
/// has a proxy of its own (the first one's `box/network.set` narrowing does
/// not reach it, its audit lines name it).
async fn a_pooled_egress_profile_serves_each_claim_its_own_proxy(backend: &str) {
    const BODY: &str = "hello-through-a-warm-proxy";
    let web = crate::support::http_server(BODY);
    let (profiles, workspace) = setup();
    std::fs::write(profiles.path().join("pooled.toml"), egress_profile(web)).unwrap();
    let audit = profiles.path().join("audit.jsonl");
    let name = format!("{backend}-egress");
    let host = Host::start_on(
        backend,
        &name,
        profiles.path(),
        workspace.path(),
        Some("pooled=1"),
        &[],
        &["--audit", audit.to_str().unwrap()],
    )
    .await;
    let cold_name = format!("{backend}-egress-cold");
    let cold = Host::start_on(
        backend,
        &cold_name,
        profiles.path(),
        workspace.path(),
        None,
        &[],
        &[],
    )
    .await;
    host.ready("pooled", 1).await;

    let (first, first_envelope) = host.session(json!({})).await;
    assert_eq!(first_envelope["warm"], json!(true), "{first_envelope}");
    assert_eq!(
        first_envelope["network"]["mode"], "egress",
        "{first_envelope}"
    );
    let allowed = fetch(&host, &first, "allowed.test", web).await;
    assert!(
        allowed.contains(BODY) && allowed.contains("status=200"),
        "{backend}: {allowed}"
    );
    let denied = fetch(&host, &first, "denied.test", web).await;
    assert!(
        denied.contains("status=403") && !denied.contains(BODY),
        "{backend}: {denied}"
    );
    // This session's proxy only: narrowed to the other name.
    let narrowed = post(
        host.address(),
        Some(&first),
        &[],
        &json!({"jsonrpc": "2.0", "id": 8, "method": "box/network.set",
            "params": {"allow": [format!("other.test:{web}")]}}),
    )
    .await
    .json();
    assert_eq!(
        narrowed["result"]["allow"],
        json!([format!("other.test:{web}")]),
        "{narrowed}"
    );
    let after = fetch(&host, &first, "allowed.test", web).await;
    assert!(after.contains("status=403"), "{after}");
    host.end_session(&first).await;

    // The next claim, of a plan that narrows the list: the pool's other
    // unit, its own proxy with the session's list.
    host.ready("pooled", 1).await;
    let tighten = json!({"network": {"allow": [format!("allowed.test:{web}")]}});
    let (second, second_envelope) = host.session(json!({"tighten": tighten})).await;
    assert_eq!(second_envelope["warm"], json!(true), "{second_envelope}");
    assert_ne!(first_envelope["id"], second_envelope["id"]);
    assert_eq!(
        second_envelope["network"]["allow"],
        json!([format!("allowed.test:{web}")]),
        "{second_envelope}"
    );
    let allowed = fetch(&host, &second, "allowed.test", web).await;
    assert!(
        allowed.contains(BODY) && allowed.contains("status=200"),
        "the first session's narrowing reached the second's proxy: {allowed}"
    );
    let other = fetch(&host, &second, "other.test", web).await;
    assert!(
        other.contains("status=403") && !other.contains(BODY),
        "the session's narrower list does not hold: {other}"
    );

    // A cold unit of the same plan has the same envelope.
    let (_, cold_envelope) = cold.session(json!({"tighten": tighten})).await;
    assert!(cold_envelope.get("warm").is_none(), "{cold_envelope}");
    assert_eq!(applied(&second_envelope), applied(&cold_envelope));

    // Each proxy reported as its own session.
    let lines: Vec<Value> = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .filter(|line: &Value| line["kind"] == "egress")
        .collect();
    let seen = |session: &str, name: &str, outcome: &str| {
        lines
            .iter()
            .filter(|line| {
                line["session"] == json!(session)
                    && line["host"] == json!(name)
                    && line["decision"]["outcome"] == json!(outcome)
            })
            .count()
    };
    assert_eq!(seen(&first, "allowed.test", "allowed"), 1, "{lines:?}");
    assert_eq!(seen(&first, "allowed.test", "refused"), 1, "{lines:?}");
    assert_eq!(seen(&first, "denied.test", "refused"), 1, "{lines:?}");
    assert_eq!(seen(&second, "allowed.test", "allowed"), 1, "{lines:?}");
    assert_eq!(seen(&second, "other.test", "refused"), 1, "{lines:?}");
    assert_eq!(lines.len(), 5, "{lines:?}");

    for host in [host, cold] {
        let instance = host.instance.clone();
        assert!(host.stop().success());
        if backend == "docker" {
            assert_eq!(containers(&instance, None).await, Vec::<String>::new());
        } else {
            assert_eq!(running_local_units(&instance), Vec::new());
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pooled_egress_profile_serves_each_claimed_container_its_own_proxy() {
    if !docker_answers().await {
        return;
    }
    a_pooled_egress_profile_serves_each_claim_its_own_proxy("docker").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn local_a_pooled_egress_profile_serves_each_claimed_unit_its_own_proxy() {
    a_pooled_egress_profile_serves_each_claim_its_own_proxy("local").await;
}

/// The egress socket directories under a host's runtime directory.
fn egress_dirs(runtime: &Path) -> std::collections::BTreeSet<std::path::PathBuf> {
    std::fs::read_dir(runtime.join("box/egress"))
        .map(|entries| entries.map(|entry| entry.unwrap().path()).collect())
        .unwrap_or_default()
}

/// A session on a warm egress unit: its proxy is served in the directory
/// the pooled unit started with (kept in the session's state), so it
/// survives `kill -9` of its host like a cold one (the new host serves the
/// proxy again there); the host's stop removes its session's directory and
/// its ready unit's; `box gc` removes the empty one the killed host's ready
/// unit left, once that unit is gone.
async fn a_warm_egress_session_survives_kill_9_and_fetches_again(backend: &str) {
    const BODY: &str = "hello-warm-and-reattached";
    let web = crate::support::http_server(BODY);
    let (profiles, workspace) = setup();
    std::fs::write(profiles.path().join("pooled.toml"), egress_profile(web)).unwrap();
    let (state, instances) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let runtime = tempfile::tempdir().unwrap();
    let instance = format!("e2e-pool-reegress-{backend}-{}", std::process::id());
    let command = || {
        let mut command = Command::new(box_bin());
        command
            .args(["serve", "--backend", backend, "--instance", &instance])
            .args(["--profile", "pooled", "--pool", "pooled=1"])
            .arg("--state")
            .arg(state.path().join("sessions"))
            .arg("--profiles")
            .arg(profiles.path())
            .arg("--workspace")
            .arg(workspace.path())
            .env("RUST_LOG", "warn")
            .env("XDG_RUNTIME_DIR", runtime.path())
            .env("BOX_INSTANCE_DIR", instances.path());
        command
    };
    let http_host = HttpHost::on_a_free_port();
    let child = http_host.serve(command()).await;
    let mut host = Host {
        host: http_host,
        instance: instance.clone(),
        child,
    };
    host.ready("pooled", 1).await;
    // The ready unit's directory: made for it, mounted, no proxy yet.
    let pooled = egress_dirs(runtime.path());
    assert_eq!(pooled.len(), 1, "{pooled:?}");
    let pooled = pooled.into_iter().next().unwrap();
    assert_eq!(std::fs::read_dir(&pooled).unwrap().count(), 0);

    let (session, answer) = host.host.initialize(json!({}), &[]).await;
    let session = session.unwrap();
    let answered = &answer["result"]["capabilities"]["experimental"][EXECUTOR_KEY]["box"];
    assert_eq!(answered["units"][0]["warm"], json!(true), "{answer}");
    let secret = answered["session"]["secret"].as_str().unwrap().to_owned();
    let record: Value = serde_json::from_str(
        &std::fs::read_to_string(state.path().join(format!("sessions/{session}.json"))).unwrap(),
    )
    .unwrap();
    assert_eq!(
        record["units"][0]["egressDir"],
        json!(pooled.to_str().unwrap()),
        "the session's proxy is served where the pooled unit looks: {record}"
    );
    let before = fetch(&host, &session, "allowed.test", web).await;
    assert!(before.contains(BODY), "{backend}: {before}");
    host.ready("pooled", 1).await;
    let first_host = egress_dirs(runtime.path());
    assert_eq!(first_host.len(), 2, "{first_host:?}");

    host.child.kill().unwrap();
    host.child.wait().unwrap();
    assert!(
        pooled.is_dir(),
        "a dead host leaves its session's directory"
    );
    host.child = host.host.serve(command()).await;
    let ask = json!({"experimental": {EXECUTOR_KEY: {"box": {"reattach": {"session": session, "secret": secret}}}}});
    let (again, answer) = host.host.initialize(ask, &[]).await;
    assert_eq!(again.as_deref(), Some(session.as_str()), "{answer}");
    let after = fetch(&host, &session, "allowed.test", web).await;
    assert!(
        after.contains(BODY) && after.contains("status=200"),
        "{backend}: {after}"
    );
    let denied = fetch(&host, &session, "denied.test", web).await;
    assert!(denied.contains("status=403"), "{backend}: {denied}");
    host.ready("pooled", 1).await;
    let second_host: Vec<_> = egress_dirs(runtime.path())
        .difference(&first_host)
        .cloned()
        .collect();
    assert_eq!(second_host.len(), 1, "{second_host:?}");

    assert!(host.stop().success());
    assert!(!pooled.exists(), "the session's directory goes with it");
    assert!(
        !second_host[0].exists(),
        "the ready unit's directory goes with the host's pool"
    );
    // The killed host's ready unit ends with its lease (a container removes
    // itself; a local unit's record is `box gc`'s).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    if backend == "docker" {
        loop {
            let left = containers(&instance, None).await;
            if left.is_empty() {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "{left:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    } else {
        loop {
            let listed = Command::new(box_bin())
                .args(["units", "ls", "--json", "--backend", "local", "--filter"])
                .arg(format!("instance={instance}"))
                .env("XDG_RUNTIME_DIR", runtime.path())
                .output()
                .unwrap();
            let listed: Vec<Value> = serde_json::from_slice(&listed.stdout).unwrap();
            if !listed.iter().any(|unit| unit["state"] == "running") {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "{listed:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // The killed host's ready unit left its directory, empty; `box gc`
    // removes it once the unit is gone.
    let left: Vec<_> = first_host.iter().filter(|dir| **dir != pooled).collect();
    assert_eq!(left.len(), 1, "{first_host:?}");
    assert!(left[0].is_dir(), "{}", left[0].display());
    let gc = Command::new(box_bin())
        .args(["gc", "--instance", &instance])
        .env("XDG_RUNTIME_DIR", runtime.path())
        .env("BOX_INSTANCE_DIR", instances.path())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&gc.stderr);
    assert!(gc.status.success(), "{said}");
    assert!(!left[0].exists(), "{said}");
    assert!(said.contains("pooled unit's egress directory"), "{said}");
    assert_eq!(egress_dirs(runtime.path()), Default::default());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_warm_egress_container_survives_kill_9_of_its_host_and_fetches_again() {
    if !docker_answers().await {
        return;
    }
    a_warm_egress_session_survives_kill_9_and_fetches_again("docker").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn local_a_warm_egress_unit_survives_kill_9_of_its_host_and_fetches_again() {
    a_warm_egress_session_survives_kill_9_and_fetches_again("local").await;
}

/// A `source = "fork"` profile, its workspace forked as box chooses (a
/// worktree of a repository with a commit, where the host can).
const FORK_PROFILE: &str = "description = \"pool tests, each session on its own fork\"\nextends = \"default\"\n\n[workspace]\nsource = \"fork\"\n";

/// A host directory that is a git repository with one commit.
fn fork_project() -> tempfile::TempDir {
    let project = tempfile::tempdir().unwrap();
    std::fs::write(project.path().join("shared.txt"), "host\n").unwrap();
    commit_all(project.path());
    project
}

/// The directories under a state directory's forks (`box/forks/INSTANCE/SESSION`),
/// and an instance's own directory when it is left empty.
fn fork_dirs(state: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for instance in std::fs::read_dir(state.join("box/forks"))
        .into_iter()
        .flatten()
    {
        let instance = instance.unwrap();
        if instance.file_name() == "locks" {
            continue;
        }
        let before = found.len();
        for session in std::fs::read_dir(instance.path()).into_iter().flatten() {
            found.push(session.unwrap().path());
        }
        if found.len() == before {
            found.push(instance.path());
        }
    }
    found.sort();
    found
}

/// A session of `host`: its id and what box says of it at initialize.
async fn initialize(host: &Host) -> (String, Value) {
    let (session, answer) = host.host.initialize(json!({}), &[]).await;
    let said = answer["result"]["capabilities"]["experimental"][EXECUTOR_KEY]["box"].clone();
    assert!(said["units"][0].is_object(), "{answer}");
    (session.unwrap(), said)
}

/// An envelope with its fork's directory (which names its session, or its
/// pool's `pool-N`) said as `FORK`.
fn with_fork_said(envelope: &Value, state: &Path) -> Value {
    let forks = state.join("box/forks").canonicalize().unwrap();
    let mut text = applied(envelope).to_string();
    let prefix = forks.to_str().unwrap().to_owned() + "/";
    while let Some(at) = text.find(&prefix) {
        let rest = &text[at + prefix.len()..];
        // INSTANCE/SESSION/workspace
        let end = rest
            .match_indices('/')
            .nth(1)
            .map_or(rest.len(), |(slash, _)| slash);
        text.replace_range(at..at + prefix.len() + end, "FORK");
    }
    serde_json::from_str(&text).unwrap()
}

/// Issue 25: a `source = "fork"` profile keeps a pool. Its unit starts with
/// an empty directory of its own at its workspace (and the repository's
/// objects, read-only, where its forks are worktrees); a session claims it
/// warm, its fork made into that directory: it sees the host directory's
/// files, its writes reach the directory only through `box/merge`, which
/// brings them back; the next session claimed from the pool sees none of
/// them; the envelope and the fork's description equal a cold fork unit's;
/// nothing of the pool's directories is left when the host ends.
async fn a_pooled_fork_profile_forks_into_each_claimed_unit(backend: &str) {
    let (profiles, _) = setup();
    std::fs::write(profiles.path().join("pooled.toml"), FORK_PROFILE).unwrap();
    let project = fork_project();
    let state = tempfile::tempdir().unwrap();
    let env = [("XDG_STATE_HOME", state.path().to_str().unwrap())];
    let name = format!("{backend}-fork");
    let host = Host::start_on(
        backend,
        &name,
        profiles.path(),
        project.path(),
        Some("pooled=1"),
        &env,
        &[],
    )
    .await;
    let cold_name = format!("{backend}-fork-cold");
    let cold = Host::start_on(
        backend,
        &cold_name,
        profiles.path(),
        project.path(),
        None,
        &env,
        &[],
    )
    .await;
    host.ready("pooled", 1).await;
    // The ready unit's directory: its pool's, empty.
    let pooled = fork_dirs(state.path());
    assert_eq!(pooled.len(), 1, "{pooled:?}");
    assert!(
        pooled[0]
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("pool-"),
        "{pooled:?}"
    );
    assert_eq!(
        std::fs::read_dir(pooled[0].join("workspace"))
            .unwrap()
            .count(),
        0
    );

    let (first, first_said) = initialize(&host).await;
    let first_envelope = &first_said["units"][0];
    assert_eq!(first_envelope["warm"], json!(true), "{first_said}");
    let seen = host
        .bash(
            &first,
            "cat shared.txt; echo from-first > first.txt; echo first > shared.txt; ls",
        )
        .await;
    assert!(
        seen.starts_with("host\n") && seen.contains("first.txt"),
        "{backend}: {seen}"
    );
    assert!(!project.path().join("first.txt").exists());
    assert_eq!(
        std::fs::read_to_string(project.path().join("shared.txt")).unwrap(),
        "host\n"
    );

    // The next claim: the pool's next unit, on a fork of its own.
    host.ready("pooled", 1).await;
    let (second, second_said) = initialize(&host).await;
    assert_eq!(
        second_said["units"][0]["warm"],
        json!(true),
        "{second_said}"
    );
    assert_ne!(first_envelope["id"], second_said["units"][0]["id"]);
    let seen = host.bash(&second, "cat shared.txt; ls -a").await;
    assert!(
        seen.starts_with("host\n") && !seen.contains("first.txt"),
        "the second session sees the first's files: {seen}"
    );

    // Merged back as from a cold fork unit.
    merges_workspace_back(
        host.address(),
        &first,
        project.path(),
        &[("first.txt", "from-first\n"), ("shared.txt", "first\n")],
    )
    .await;
    let still = host.bash(&second, "cat shared.txt; ls").await;
    assert!(
        still.starts_with("host\n") && !still.contains("first.txt"),
        "{still}"
    );

    // A cold fork unit of the same plan: the same envelope, the same fork.
    let (cold_session, cold_said) = initialize(&cold).await;
    assert!(cold_said["units"][0].get("warm").is_none(), "{cold_said}");
    // The same but for the pin each fork holds in the repository.
    let pinless = |said: &Value| {
        let text = said["fork"].to_string();
        let Some(at) = text.find("refs/box/forks/") else {
            return text;
        };
        let pin = &text[at..];
        let end = pin.find(';').unwrap_or(pin.len());
        text.replace(&pin[..end], "refs/box/forks/PIN")
    };
    assert_eq!(pinless(&second_said), pinless(&cold_said));
    assert_eq!(
        with_fork_said(&second_said["units"][0], state.path()),
        with_fork_said(&cold_said["units"][0], state.path())
    );
    let probe = "git log --format=%s -1 2>&1; cat .git/objects/info/alternates; id -u";
    let warm_probe = host.bash(&second, probe).await;
    // Its history read through the objects it borrows.
    assert!(warm_probe.starts_with("base\n"), "{backend}: {warm_probe}");
    assert_eq!(warm_probe, cold.bash(&cold_session, probe).await);

    for session in [&first, &second] {
        host.end_session(session).await;
    }
    for host in [host, cold] {
        let instance = host.instance.clone();
        assert!(host.stop().success());
        if backend == "docker" {
            assert_eq!(containers(&instance, None).await, Vec::<String>::new());
        } else {
            assert_eq!(running_local_units(&instance), Vec::new());
        }
    }
    assert_eq!(fork_dirs(state.path()), Vec::<std::path::PathBuf>::new());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pooled_fork_profile_forks_into_each_claimed_container() {
    if !docker_answers().await {
        return;
    }
    a_pooled_fork_profile_forks_into_each_claimed_unit("docker").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn local_a_pooled_fork_profile_forks_into_each_claimed_unit() {
    a_pooled_fork_profile_forks_into_each_claimed_unit("local").await;
}

/// A `source = "fork"` session whose credentials `hide` masks starts cold
/// and says why (the masks, one file each that the session's scan finds,
/// are mounts a unit gets when it starts), leaving the pool's ready unit
/// for the next session; the cold unit sees the file masked.
#[tokio::test(flavor = "multi_thread")]
async fn a_hidden_credential_keeps_a_fork_session_cold_and_says_why() {
    // The local backend masks no file (a `hide` session there is refused).
    if !docker_answers().await {
        return;
    }
    const PASSWORD: &str = "pool-fork-netrc-5e1d";
    let (profiles, _) = setup();
    std::fs::write(
        profiles.path().join("pooled.toml"),
        format!("{FORK_PROFILE}on_persisted_credentials = \"hide\"\n"),
    )
    .unwrap();
    let project = fork_project();
    std::fs::write(
        project.path().join(".netrc"),
        format!("machine example.com login u password {PASSWORD}\n"),
    )
    .unwrap();
    let state = tempfile::tempdir().unwrap();
    let env = [("XDG_STATE_HOME", state.path().to_str().unwrap())];
    let host = Host::start_on(
        "docker",
        "fork-hide",
        profiles.path(),
        project.path(),
        Some("pooled=1"),
        &env,
        &[],
    )
    .await;
    host.ready("pooled", 1).await;
    let (session, said) = initialize(&host).await;
    let envelope = &said["units"][0];
    assert_eq!(envelope["warm"], json!(false), "{said}");
    assert!(
        envelope["warmWhy"]
            .as_str()
            .is_some_and(|why| why.contains("on_persisted_credentials = \"hide\"")),
        "{envelope}"
    );
    assert_eq!(said["fork"]["mode"], "worktree", "{said}");
    let seen = host.bash(&session, "cat .netrc").await;
    assert!(!seen.contains(PASSWORD), "{seen}");
    // Untaken: still ready.
    host.ready("pooled", 1).await;
    host.end_session(&session).await;
    let instance = host.instance.clone();
    assert!(host.stop().success());
    assert_eq!(containers(&instance, None).await, Vec::<String>::new());
    assert_eq!(fork_dirs(state.path()), Vec::<std::path::PathBuf>::new());
}

/// A killed host's ready pooled unit of a `source = "fork"` profile leaves
/// its empty directory under the forks; once the unit has ended with its
/// lease, `box gc` removes it.
#[tokio::test(flavor = "multi_thread")]
async fn local_box_gc_removes_a_killed_hosts_pooled_fork_directory() {
    let (profiles, _) = setup();
    std::fs::write(
        profiles.path().join("pooled.toml"),
        format!("{FORK_PROFILE}\n[lifecycle]\nlease = \"2s\"\n"),
    )
    .unwrap();
    let project = fork_project();
    let (state, instances, runtime) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let env = [
        ("XDG_STATE_HOME", state.path().to_str().unwrap()),
        ("XDG_RUNTIME_DIR", runtime.path().to_str().unwrap()),
        ("BOX_INSTANCE_DIR", instances.path().to_str().unwrap()),
    ];
    let mut host = Host::start_on(
        "local",
        "fork-gc",
        profiles.path(),
        project.path(),
        Some("pooled=1"),
        &env,
        &[],
    )
    .await;
    host.ready("pooled", 1).await;
    let pooled = fork_dirs(state.path());
    assert_eq!(pooled.len(), 1, "{pooled:?}");
    host.child.kill().unwrap();
    host.child.wait().unwrap();
    assert!(pooled[0].join("workspace").is_dir());
    let gc = || {
        let mut command = Command::new(box_bin());
        command.args(["gc", "--instance", &host.instance]).envs(env);
        let out = command.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // Its unit ends with its lease; until then gc leaves the directory.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let said = gc();
        if !pooled[0].exists() {
            assert!(said.contains("pooled unit's fork directory"), "{said}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{said}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(fork_dirs(state.path()), Vec::<std::path::PathBuf>::new());
}
