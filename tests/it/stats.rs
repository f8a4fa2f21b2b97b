//! A unit's resource usage (issue 27): `box/units.stats` through `box serve`
//! and `box units ls --json` agree with what the unit's cgroup (docker) or
//! its processes (local) say, for a unit running a known load.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{Served, box_bin, docker_here, local_here, serve_command};

/// The toolchain image: it has python3 (box-base has none).
const DEV_IMAGE: &str = "box-dev:bookworm";

const MIB: u64 = 1024 * 1024;

/// The load: about a second of CPU, then 64 MiB written and held.
const LOAD: &str = "import time\n\
t = time.process_time()\n\
while time.process_time() - t < 1.0: pass\n\
held = b'x' * (64 << 20)\n\
print('ready', flush=True)\n\
time.sleep(300)\n";

/// `box serve` on `backend` with a profile on the dev image.
fn serve(backend: &str, instance: &str, workspace: &Path, profiles: &Path) -> Served {
    std::fs::write(
        profiles.join("p.toml"),
        format!("extends = \"default\"\n[workspace]\nimage = \"{DEV_IMAGE}\"\nlocal_userland = \"host\"\n"),
    )
    .unwrap();
    let mut command = serve_command(backend, instance, workspace);
    command
        .arg("--profiles")
        .arg(profiles)
        .args(["--profile", "p"]);
    Served::start(command)
}

/// The workspace unit's entry in `box/units.stats`.
fn stats(served: &mut Served) -> Value {
    let result = served.ok("box/units.stats", json!({}));
    let units = result["units"].as_array().cloned().unwrap_or_default();
    assert_eq!(units.len(), 1, "{result}");
    units[0].clone()
}

fn figure(entry: &Value, name: &str) -> u64 {
    entry[name]
        .as_u64()
        .unwrap_or_else(|| panic!("{name} in {entry}"))
}

/// The figures of a cgroup read by the test itself: (cpu usec, memory bytes).
fn cgroup_figures(id: &str) -> (u64, u64) {
    let read = |path: String| -> u64 {
        std::fs::read_to_string(&path)
            .unwrap_or_else(|error| panic!("{path}: {error}"))
            .trim()
            .parse()
            .unwrap()
    };
    let root = "/sys/fs/cgroup";
    if Path::new(root).join("cgroup.controllers").exists() {
        let dir = [
            format!("{root}/system.slice/docker-{id}.scope"),
            format!("{root}/docker/{id}"),
        ]
        .into_iter()
        .find(|dir| Path::new(dir).is_dir())
        .unwrap_or_else(|| panic!("no cgroup of {id}"));
        let cpu = std::fs::read_to_string(format!("{dir}/cpu.stat")).unwrap();
        let usec = cpu
            .lines()
            .find_map(|line| line.strip_prefix("usage_usec "))
            .unwrap()
            .parse()
            .unwrap();
        (usec, read(format!("{dir}/memory.current")))
    } else {
        (
            read(format!("{root}/cpuacct/docker/{id}/cpuacct.usage")) / 1000,
            read(format!("{root}/memory/docker/{id}/memory.usage_in_bytes")),
        )
    }
}

fn usage_matches_the_units_own_figures(backend: &str) {
    let workspace = tempfile::tempdir().unwrap();
    let profiles = tempfile::tempdir().unwrap();
    let instance = format!("stats-{backend}-{}", std::process::id());
    let mut served = serve(backend, &instance, workspace.path(), profiles.path());
    let idle = stats(&mut served);
    let started = served.ok(
        "agentworkspace/process.start",
        json!({"args": ["python3", "-c", LOAD]}),
    );
    assert!(started.get("id").is_some(), "{started}");

    // The load ran its second and holds its memory.
    let deadline = Instant::now() + Duration::from_secs(90);
    let loaded = loop {
        let entry = stats(&mut served);
        if entry["memoryBytes"].as_u64().unwrap_or(0) >= 64 * MIB
            && entry["cpuUsec"].as_u64().unwrap_or(0) >= 1_000_000
        {
            break entry;
        }
        assert!(
            Instant::now() < deadline,
            "{backend}: no load seen: {entry} (idle: {idle})"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let id = loaded["id"].as_str().unwrap().to_owned();
    assert!(figure(&loaded, "pids") >= 2, "{backend}: {loaded}");
    assert!(
        loaded["ioReadBytes"].is_u64() && loaded["ioWriteBytes"].is_u64(),
        "{backend}: {loaded}"
    );
    // Settled: the load sleeps now, so the figures hold still.
    std::thread::sleep(Duration::from_millis(500));
    let answered = stats(&mut served);
    let listed = box_units(&["ls", "--json"], backend, &id);
    let top = box_units(&["top", "--once", "--json"], backend, &id);
    let cpu = figure(&answered, "cpuUsec");
    let memory = figure(&answered, "memoryBytes");
    assert!(
        (1_000_000..3_000_000).contains(&cpu),
        "{backend}: a second's burn and an idle executor: {answered}"
    );
    for (what, other) in [("units ls", &listed), ("units top", &top)] {
        let (c, m) = (figure(other, "cpuUsec"), figure(other, "memoryBytes"));
        assert!(
            c.abs_diff(cpu) < 200_000,
            "{backend}: {what} {other} vs {answered}"
        );
        assert!(
            m.abs_diff(memory) < 16 * MIB,
            "{backend}: {what} {other} vs {answered}"
        );
    }
    if backend == "docker" {
        let (c, m) = cgroup_figures(&id);
        assert!(c.abs_diff(cpu) < 200_000, "cgroup cpu {c} vs {answered}");
        assert!(
            m.abs_diff(memory) < 16 * MIB,
            "cgroup memory {m} vs {answered}"
        );
        let peak = figure(&answered, "memoryPeakBytes");
        assert!(peak >= memory, "{answered}");
    } else {
        // No cgroup of its own: the sum of its processes' resident sets,
        // the load's 64 MiB among them; the peak is unknown.
        assert!(memory < 64 * MIB + 256 * MIB, "{answered}");
        assert!(answered["memoryPeakBytes"].is_null(), "{answered}");
    }
    assert!(served.hang_up().success());
}

/// `box units ARGS --backend BACKEND`'s entry for unit `id` (JSON).
fn box_units(args: &[&str], backend: &str, id: &str) -> Value {
    let out = std::process::Command::new(box_bin())
        .arg("units")
        .args(args)
        .args(["--backend", backend])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    listed
        .as_array()
        .and_then(|units| units.iter().find(|unit| unit["id"] == json!(id)))
        .cloned()
        .unwrap_or_else(|| panic!("{id} not in {listed}"))
}

#[test]
fn docker_usage_matches_the_cgroups_own_files() {
    if docker_here() {
        usage_matches_the_units_own_figures("docker");
    }
}

#[test]
fn local_usage_matches_its_processes() {
    if local_here() {
        usage_matches_the_units_own_figures("local");
    }
}

/// The value of the series `name{backend="BACKEND",profile="p"}` in a
/// `/metrics` text.
fn series(metrics: &str, name: &str, backend: &str) -> Option<f64> {
    let prefix = format!("{name}{{backend=\"{backend}\",profile=\"p\"}} ");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|value| value.trim().parse().ok())
}

/// The gauges of `box serve --listen` (sums per backend and profile, read
/// every 5 s) agree with `box/units.stats` for a session of one loaded unit.
async fn gauges_match_units_stats(backend: &str) {
    use crate::serve::{http, post};
    let workspace = tempfile::tempdir().unwrap();
    let profiles = tempfile::tempdir().unwrap();
    std::fs::write(
        profiles.path().join("p.toml"),
        format!("extends = \"default\"\n[workspace]\nimage = \"{DEV_IMAGE}\"\nlocal_userland = \"host\"\n"),
    )
    .unwrap();
    let instance = format!("stats-gauges-{backend}-{}", std::process::id());
    let host = crate::support::HttpHost::on_a_free_port();
    let mut command = serve_command(backend, &instance, workspace.path());
    command
        .arg("--profiles")
        .arg(profiles.path())
        .args(["--profile", "p"]);
    let mut child = host.serve(command).await;
    let address = host.address();
    let (session, answer) = host.initialize(json!({}), &[]).await;
    let session = session.unwrap_or_else(|| panic!("no session id: {answer}"));
    let call = |id: i64, method: &'static str, params: Value| {
        let session = session.clone();
        async move {
            let reply = post(
                address,
                Some(&session),
                &[],
                &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
            )
            .await;
            reply.json()
        }
    };
    let started = call(
        1,
        "agentworkspace/process.start",
        json!({"args": ["python3", "-c", LOAD]}),
    )
    .await;
    assert!(started["result"]["id"].is_string(), "{started}");
    let deadline = Instant::now() + Duration::from_secs(90);
    let loaded = loop {
        let answer = call(2, "box/units.stats", json!({})).await;
        let entry = answer["result"]["units"][0].clone();
        if entry["memoryBytes"].as_u64().unwrap_or(0) >= 64 * MIB
            && entry["cpuUsec"].as_u64().unwrap_or(0) >= 1_000_000
        {
            break entry;
        }
        assert!(
            Instant::now() < deadline,
            "{backend}: no load seen: {answer}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // The sampler reads every 5 s: wait for a reading taken under the load.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (memory, cpu, metrics) = loop {
        let reply = http(address, "GET", "/metrics", &[], b"").await;
        let metrics = String::from_utf8_lossy(&reply.body).into_owned();
        let memory = series(&metrics, "box_units_memory_bytes", backend).unwrap_or(0.0);
        let cpu = series(&metrics, "box_units_cpu_seconds", backend).unwrap_or(0.0);
        if memory >= (64 * MIB) as f64 && cpu >= 1.0 {
            break (memory, cpu, metrics);
        }
        assert!(
            Instant::now() < deadline,
            "{backend}: no loaded gauges: {metrics}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let now = call(3, "box/units.stats", json!({})).await["result"]["units"][0].clone();
    let stats_memory = figure(&now, "memoryBytes") as f64;
    let stats_cpu = figure(&now, "cpuUsec") as f64 / 1e6;
    assert!(
        (memory - stats_memory).abs() < (16 * MIB) as f64,
        "{backend}: {memory} vs {now} (loaded: {loaded})"
    );
    assert!((cpu - stats_cpu).abs() < 0.3, "{backend}: {cpu} vs {now}");
    assert!(
        series(&metrics, "box_units_pids", backend).unwrap_or(0.0) >= 2.0,
        "{metrics}"
    );
    // No series names a unit or a session.
    assert!(!metrics.contains(&session), "{metrics}");
    let reply = http(
        address,
        "DELETE",
        "/mcp",
        &[("Mcp-Session-Id", &session)],
        b"",
    )
    .await;
    assert_eq!(reply.status, 200);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(child.wait().unwrap().success());
}

#[tokio::test]
async fn docker_gauges_match_units_stats() {
    if crate::support::docker_answers().await {
        gauges_match_units_stats("docker").await;
    }
}

#[tokio::test]
async fn local_gauges_match_units_stats() {
    if local_here() {
        gauges_match_units_stats("local").await;
    }
}

/// `box serve` for a limit test: on `backend` with the profile `p`
/// (`profile`, its TOML), an audit log and its stderr kept, and the params of
/// every `notifications/box/unit` the session gets, in order.
struct LimitEvents {
    served: Served,
    seen: Mutex<Vec<Value>>,
    audit: PathBuf,
    log: PathBuf,
    _dirs: [tempfile::TempDir; 2],
}

impl LimitEvents {
    fn start(backend: &str, instance: &str, workspace: &Path, profile: &str) -> Self {
        let profiles = tempfile::tempdir().unwrap();
        let state = tempfile::tempdir().unwrap();
        std::fs::write(profiles.path().join("p.toml"), profile).unwrap();
        let audit = state.path().join("audit.jsonl");
        let log = state.path().join("stderr.log");
        let mut command = serve_command(backend, instance, workspace);
        command
            .arg("--profiles")
            .arg(profiles.path())
            .args(["--profile", "p", "--audit"])
            .arg(&audit)
            .stderr(std::fs::File::create(&log).unwrap());
        Self {
            served: Served::start(command),
            seen: Mutex::new(Vec::new()),
            audit,
            log,
            _dirs: [profiles, state],
        }
    }

    /// Keep `message` if it is a limit event.
    fn keep(&self, message: &Value) {
        if message["method"] == "notifications/box/unit" {
            self.seen.lock().unwrap().push(message["params"].clone());
        }
    }

    /// `command` run by the bash tool as request `id`: its answer within
    /// `within`, the events before it kept.
    fn bash(&mut self, id: i64, command: &str, within: Duration) -> Value {
        self.served
            .send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "bash", "arguments": {"command": command}}}));
        self.served
            .wait_for(within, |message| {
                self.keep(message);
                message["id"] == json!(id)
            })
            .unwrap_or_else(|| panic!("no answer to {command:?} within {within:?}"))
    }

    /// Keep the events that come within `within`.
    fn settle(&self, within: Duration) {
        let _ = self.served.wait_for(within, |message| {
            self.keep(message);
            false
        });
    }

    /// Whether an event `wanted` holds has come, waiting up to `within` for
    /// it (keeping the events meanwhile).
    fn wait_event(&self, within: Duration, wanted: impl Fn(&Value) -> bool) -> bool {
        let deadline = Instant::now() + within;
        while !self.seen.lock().unwrap().iter().any(&wanted) {
            if Instant::now() >= deadline {
                return false;
            }
            self.settle(Duration::from_millis(500));
        }
        true
    }

    /// The events kept so far.
    fn events(&self) -> Vec<Value> {
        self.seen.lock().unwrap().clone()
    }

    /// Hang up: how `box serve` ended, then its audit log and its stderr.
    fn hang_up(self) -> (std::process::ExitStatus, String, String) {
        let status = self.served.hang_up();
        let audit = std::fs::read_to_string(&self.audit).unwrap();
        let log = std::fs::read_to_string(&self.log).unwrap();
        (status, audit, log)
    }
}

/// The tasks load: threads started until the pids limit refuses one, held
/// 4 s; then the memory load: 16 MiB more each step until the OOM killer
/// ends it.
const LIMITS_LOAD: &str = r#"import threading, time
stop = threading.Event()
n = 0
try:
    while n < 500:
        threading.Thread(target=stop.wait).start()
        n += 1
except RuntimeError:
    pass
print('threads', n, flush=True)
time.sleep(4)
stop.set()
time.sleep(1)
held = []
while True:
    held.append(b'x' * (16 << 20))
    time.sleep(0.05)
"#;

/// Issue 27, limit events: a docker unit driven into its pids limit and
/// its memory limit gets the session `notifications/box/unit` for each,
/// the log a WARN line and the audit a `limit` line.
#[test]
fn docker_a_unit_at_its_limits_is_told_logged_and_audited() {
    if !docker_here() {
        return;
    }
    use std::os::unix::fs::PermissionsExt as _;
    let workspace = tempfile::tempdir().unwrap();
    std::fs::set_permissions(workspace.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::write(workspace.path().join("load.py"), LIMITS_LOAD).unwrap();
    let instance = format!("stats-limits-{}", std::process::id());
    let mut limited = LimitEvents::start(
        "docker",
        &instance,
        workspace.path(),
        &format!(
            "extends = \"default\"\n[workspace]\nimage = \"{DEV_IMAGE}\"\n[limits]\nmemory = \"256MiB\"\npids = 64\n"
        ),
    );
    let answer = limited.bash(
        50,
        "python3 /workspace/load.py; echo exit=$?",
        Duration::from_secs(120),
    );
    // The last readings' events may come just after the answer.
    limited.settle(Duration::from_secs(3));
    let seen = limited.events();
    let output = answer["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        output.contains("exit=137"),
        "the OOM killer ended the load: {answer}"
    );
    let reached = |limit: &str| {
        seen.iter()
            .find(|event| event["limit"] == limit && event["state"] == "reached")
            .cloned()
            .unwrap_or_else(|| panic!("no {limit} reached in {seen:?} ({output})"))
    };
    let pids = reached("pids");
    assert_eq!(pids["unit"], "workspace");
    assert_eq!(pids["bound"], json!(64));
    assert!(figure(&pids, "figure") >= 64, "{pids}");
    let memory = reached("memory");
    assert_eq!(memory["bound"], json!(256 * MIB));
    // The OOM killer's victim, named from the kernel's log (this host's
    // tests run as root, who may read it).
    let killed = seen
        .iter()
        .find(|event| event["limit"] == "memory" && event["state"] == "oom-kill")
        .unwrap_or_else(|| panic!("no oom-kill in {seen:?} ({output})"));
    assert_eq!(killed["process"], "python3", "{killed}");
    assert!(figure(killed, "pid") > 0, "{killed}");
    assert!(figure(killed, "figure") >= 1, "{killed}");
    let (status, audit, log) = limited.hang_up();
    assert!(status.success());
    for limit in ["pids", "memory"] {
        assert!(
            audit.lines().any(|line| {
                let line: Value = serde_json::from_str(line).unwrap();
                line["kind"] == "limit" && line["limit"] == limit && line["state"] == "reached"
            }),
            "{limit} in {audit}"
        );
    }
    assert!(
        log.lines()
            .any(|line| line.contains("WARN") && line.contains("reached its pids limit")),
        "{log}"
    );
    assert!(
        log.lines().any(
            |line| line.contains("WARN") && line.contains("the OOM killer killed python3 (pid")
        ),
        "{log}"
    );
}

/// Issue 27, limit events: a unit whose `/tmp` and home fill up, and whose
/// call runs past its `call_timeout`, gets the session a notification for
/// each (with the log's WARN and the audit's line), and `box/units.stats`
/// says what its `/tmp` and home hold.
fn a_unit_at_its_tmp_home_and_call_timeout_limits_is_told(backend: &str) {
    let workspace = tempfile::tempdir().unwrap();
    let instance = format!("stats-fill-{backend}-{}", std::process::id());
    let mut limited = LimitEvents::start(
        backend,
        &instance,
        workspace.path(),
        &format!(
            "extends = \"default\"\n[workspace]\nimage = \"{DEV_IMAGE}\"\nlocal_userland = \"host\"\n\
             [limits]\ntmp = \"16MiB\"\nhome = \"16MiB\"\ncall_timeout = \"3s\"\n"
        ),
    );
    // 15 MiB into each: past 90% of 16 MiB. Then more than fits in /tmp.
    for (id, command) in [
        (10, "head -c 15M /dev/zero > /tmp/fill && echo tmp-done"),
        (
            11,
            "head -c 15M /dev/zero > \"$HOME/fill\" && echo home-done",
        ),
    ] {
        let answer = limited.bash(id, command, Duration::from_secs(60));
        assert!(
            answer["result"]["content"][0]["text"]
                .as_str()
                .is_some_and(|text| text.contains("-done")),
            "{backend}: {answer}"
        );
    }
    let unit = stats(&mut limited.served);
    assert!(figure(&unit, "tmpBytes") >= 15 * MIB, "{backend}: {unit}");
    assert!(figure(&unit, "homeBytes") >= 15 * MIB, "{backend}: {unit}");
    let near = |limit: &str| {
        assert!(
            limited.wait_event(Duration::from_secs(10), |event| {
                event["limit"] == limit && event["state"] != "oom-kill"
            }),
            "{backend}: no {limit} near in {:?}",
            limited.events()
        );
    };
    near("tmp");
    near("home");
    // Past its call_timeout: the call's answer is the timeout error, the
    // session told of the limit.
    let answer = limited.bash(20, "sleep 30", Duration::from_secs(60));
    assert!(
        answer["error"]["message"]
            .as_str()
            .is_some_and(|text| text.contains("call_timeout")),
        "{backend}: {answer}"
    );
    limited.settle(Duration::from_secs(1));
    let seen = limited.events();
    let timeout = seen
        .iter()
        .find(|event| event["limit"] == "call_timeout")
        .unwrap_or_else(|| panic!("{backend}: no call_timeout event in {seen:?}"));
    assert_eq!(timeout["state"], "reached", "{timeout}");
    assert_eq!(timeout["bound"], json!(3000), "{timeout}");
    assert_eq!(timeout["method"], "tools/call", "{timeout}");
    for event in seen
        .iter()
        .filter(|event| event["limit"] == "tmp" || event["limit"] == "home")
    {
        assert_eq!(event["bound"], json!(16 * MIB), "{event}");
        assert!(figure(event, "figure") >= 15 * MIB, "{event}");
    }
    let (status, audit, log) = limited.hang_up();
    assert!(status.success());
    for limit in ["tmp", "home", "call_timeout"] {
        assert!(
            audit.lines().any(|line| {
                let line: Value = serde_json::from_str(line).unwrap();
                line["kind"] == "limit" && line["limit"] == limit
            }),
            "{backend}: {limit} in {audit}"
        );
    }
    for says in [
        "nears its tmp limit",
        "nears its home limit",
        "reached its call_timeout",
    ] {
        assert!(
            log.lines()
                .any(|line| line.contains("WARN") && line.contains(says)),
            "{backend}: {says} in {log}"
        );
    }
}

#[test]
fn docker_a_unit_at_its_tmp_home_and_call_timeout_limits_is_told() {
    if docker_here() {
        a_unit_at_its_tmp_home_and_call_timeout_limits_is_told("docker");
    }
}

#[test]
fn local_a_unit_at_its_tmp_home_and_call_timeout_limits_is_told() {
    if local_here() {
        a_unit_at_its_tmp_home_and_call_timeout_limits_is_told("local");
    }
}

/// Issue 27, limit events: egress traffic held to the unit's bandwidth cap
/// gets the session a notification (`egress.bandwidth`, with the time
/// waited), the log's WARN and the audit's line; `box/units.stats` counts
/// the wait and /metrics the bytes.
#[test]
fn local_a_unit_at_its_egress_bandwidth_is_told() {
    if !local_here() {
        return;
    }
    // 96 KiB through a 16 KiB/s cap: a second's burst, then about five waiting.
    let body: &'static str = Box::leak("b".repeat(96 * 1024).into_boxed_str());
    let port = crate::support::http_server(body);
    let workspace = tempfile::tempdir().unwrap();
    let instance = format!("stats-bandwidth-{}", std::process::id());
    let mut limited = LimitEvents::start(
        "local",
        &instance,
        workspace.path(),
        &format!(
            "extends = \"default\"\n[workspace]\nimage = \"{DEV_IMAGE}\"\nlocal_userland = \"host\"\n\
             [network]\nmode = \"egress\"\nallow = [\"slow.test:{port}\"]\nhosts = {{ \"slow.test\" = \"127.0.0.1\" }}\nbandwidth = \"16KiB\"\n\
             [operator]\nallow_dangerous = [\"private-destinations\"]\n"
        ),
    );
    let script = format!(
        "python3 -c \"import urllib.request; print(len(urllib.request.urlopen('http://slow.test:{port}/', timeout=60).read()))\""
    );
    let answer = limited.bash(10, &script, Duration::from_secs(60));
    let output = answer["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(output.contains(&(96 * 1024).to_string()), "{answer}");
    let seen = limited.events();
    let told: Vec<&Value> = seen
        .iter()
        .filter(|event| event["limit"] == "egress.bandwidth")
        .collect();
    // Once for the one stretch of waiting, while the download ran.
    assert_eq!(told.len(), 1, "{seen:?}");
    let event = told[0];
    assert_eq!(event["state"], "reached", "{event}");
    assert_eq!(event["bound"], json!(16 * 1024), "{event}");
    assert!(event["waitedMs"].as_u64().unwrap() > 0, "{event}");
    // box/units.stats: the whole wait, about the five seconds past the burst.
    limited
        .served
        .send(&json!({"jsonrpc": "2.0", "id": 11, "method": "box/units.stats", "params": {}}));
    let stats = limited
        .served
        .wait_for(Duration::from_secs(30), |message| {
            message["id"] == json!(11)
        })
        .expect("the stats");
    let waited = stats["result"]["units"][0]["egressThrottledMs"]
        .as_u64()
        .unwrap_or_else(|| panic!("{stats}"));
    assert!((3000..12000).contains(&waited), "{stats}");
    assert!(
        stats["result"]["units"][0]["egressBytesDown"]
            .as_u64()
            .unwrap()
            > 96 * 1024,
        "{stats}"
    );
    let (status, audit, log) = limited.hang_up();
    assert!(status.success());
    assert!(
        audit.lines().any(|line| {
            let line: Value = serde_json::from_str(line).unwrap();
            line["kind"] == "limit" && line["limit"] == "egress.bandwidth"
        }),
        "{audit}"
    );
    assert!(log.contains("reached its egress bandwidth"), "{log}");
}

/// Issue 27, limit events: a connection refused because the unit has its
/// egress `max_connections` open gets the session a notification (with the
/// log's WARN and the audit's line).
#[test]
fn local_a_unit_at_its_egress_connection_limit_is_told() {
    if !local_here() {
        return;
    }
    let port = crate::support::http_server("hello-limit");
    let workspace = tempfile::tempdir().unwrap();
    let instance = format!("stats-egress-{}", std::process::id());
    let mut limited = LimitEvents::start(
        "local",
        &instance,
        workspace.path(),
        &format!(
            "extends = \"default\"\n[workspace]\nimage = \"{DEV_IMAGE}\"\nlocal_userland = \"host\"\n\
             [network]\nmode = \"egress\"\nallow = [\"limit.test:{port}\"]\nhosts = {{ \"limit.test\" = \"127.0.0.1\" }}\nmax_connections = 1\n\
             [operator]\nallow_dangerous = [\"private-destinations\"]\n"
        ),
    );
    // One connection held open through the proxy, then a second one.
    let script = format!(
        "python3 - <<'EOF'\nimport socket, urllib.request\n\
         held = socket.create_connection(('127.0.0.1', 3128), timeout=10)\n\
         held.sendall(b'CONNECT limit.test:{port} HTTP/1.1\\r\\nHost: limit.test:{port}\\r\\n\\r\\n')\n\
         print(held.recv(1024).split(b'\\r\\n')[0].decode())\n\
         try:\n    urllib.request.urlopen('http://limit.test:{port}/', timeout=10)\nexcept Exception as e:\n    print('second:', e)\n\
         held.close()\nEOF"
    );
    let answer = limited.bash(10, &script, Duration::from_secs(60));
    let output = answer["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(output.contains("200"), "the first connection: {output}");
    assert!(output.contains("429"), "the second is refused: {output}");
    assert!(
        limited.wait_event(Duration::from_secs(5), |event| {
            event["limit"] == "egress.connections"
        }),
        "no egress.connections event in {:?}",
        limited.events()
    );
    let seen = limited.events();
    let event = seen
        .iter()
        .find(|event| event["limit"] == "egress.connections")
        .unwrap();
    assert_eq!(event["state"], "reached", "{event}");
    assert_eq!(event["bound"], json!(1), "{event}");
    assert_eq!(event["refused"], json!(1), "{event}");
    let (status, audit, log) = limited.hang_up();
    assert!(status.success());
    assert!(
        audit.lines().any(|line| {
            let line: Value = serde_json::from_str(line).unwrap();
            line["kind"] == "limit" && line["limit"] == "egress.connections"
        }),
        "{audit}"
    );
    assert!(
        log.lines()
            .any(|line| line.contains("WARN")
                && line.contains("reached its egress max_connections (1)")),
        "{log}"
    );
}
