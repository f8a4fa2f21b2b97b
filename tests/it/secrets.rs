//! Secrets end to end through `box serve` on both backends: delivered as files
//! (`/run/secrets/NAME`), never in `docker inspect` (docker) nor in a unit
//! process's command line or environment (local), and redacted from what
//! the client receives, raw and encoded, in tool results and in process
//! output read in chunks; a credential persisted in the workspace is reported
//! in the envelope (and redacted) or refuses the session, as the profile says.

use std::io::{BufRead as _, Write as _};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use boxhost::backend::docker::DockerBackend;
use serde_json::{Value, json};

use crate::support::{box_bin, under_ci};

const FILE: &str = "BOX_E2E_DEPLOY_KEY";
const FILE_VALUE: &str = "e2e-file-secret-7d41c9a2";
const ENV: &str = "BOX_E2E_API_TOKEN";
const ENV_VALUE: &str = "e2e-env-secret-0b8e5f13";

/// Whether a Docker engine with the base image is here; a failure under CI.
fn engine_ready() -> bool {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    match runtime.block_on(DockerBackend::connect()) {
        Ok(backend) => {
            assert!(
                runtime
                    .block_on(backend.client().inspect_image("box-base:bookworm"))
                    .is_ok(),
                "image box-base:bookworm is missing: build it with scripts/images.sh"
            );
            true
        }
        Err(error) => {
            assert!(!under_ci(), "CI needs a Docker engine: {error}");
            eprintln!("\n*** DOCKER TEST NOT RUN: {error} ***\n");
            false
        }
    }
}

/// A profile directory with `sec.toml`: the default profile plus `extra`.
fn profiles(extra: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("sec.toml"),
        format!("extends = \"default\"\n\n{extra}\n"),
    )
    .unwrap();
    dir
}

struct Served {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
    instance: String,
    backend: &'static str,
}

impl Served {
    fn start(tag: &str, workspace: &Path, profiles: &Path) -> Self {
        Self::start_on("docker", tag, workspace, profiles)
    }

    fn start_on(backend: &'static str, tag: &str, workspace: &Path, profiles: &Path) -> Self {
        let instance = format!("secrets-{tag}-{}", std::process::id());
        let mut child = Command::new(box_bin())
            .args(["serve", "--backend", backend, "--profile", "sec"])
            .args(["--instance", &instance])
            .arg("--profiles")
            .arg(profiles)
            .arg("--workspace")
            .arg(workspace)
            .env(FILE, FILE_VALUE)
            .env(ENV, ENV_VALUE)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            stdin,
            lines,
            instance,
            backend,
        }
    }

    fn initialize(&mut self) -> Value {
        self.send(&json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "secrets-test", "version": "1"}}}));
        let answer = self.answer(0);
        if answer.get("result").is_some() {
            self.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        }
        answer
    }

    fn send(&mut self, message: &Value) {
        writeln!(self.stdin, "{message}").unwrap();
        self.stdin.flush().unwrap();
    }

    fn answer(&mut self, id: i64) -> Value {
        self.answer_after(id).1
    }

    /// The answer to request `id`, and every message the host sent before it.
    fn answer_after(&mut self, id: i64) -> (Vec<Value>, Value) {
        let deadline = Instant::now() + Duration::from_secs(90);
        let mut before = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no answer to request {id}"));
            let message: Value = serde_json::from_str(&line).unwrap();
            if message["id"] == json!(id) && message.get("method").is_none() {
                return (before, message);
            }
            before.push(message);
        }
    }

    fn call(&mut self, id: i64, method: &str, params: Value) -> Value {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        self.answer(id)
    }

    fn bash(&mut self, id: i64, command: &str) -> String {
        let answer = self.call(
            id,
            "tools/call",
            json!({"name": "bash", "arguments": {"command": command}}),
        );
        answer["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_else(|| panic!("bash {command}: {answer}"))
            .to_owned()
    }

    fn containers(&self) -> Vec<String> {
        let output = Command::new("docker")
            .args(["ps", "-aq", "--filter"])
            .arg(format!("label=box.instance={}", self.instance))
            .output()
            .unwrap();
        String::from_utf8_lossy(&output.stdout)
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    }

    fn hang_up(mut self) {
        drop(self.stdin);
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "box serve did not exit");
            std::thread::sleep(Duration::from_millis(50));
        }
        if self.backend != "docker" {
            return;
        }
        let left = Command::new("docker")
            .args(["ps", "-aq", "--filter"])
            .arg(format!("label=box.instance={}", self.instance))
            .output()
            .unwrap();
        assert!(left.stdout.is_empty(), "units left behind");
    }
}

/// What the engine shows of the container and of every exec in it
/// (`docker inspect`, and the exec inspection the CLI has no command for), as text.
fn inspected(container: &str) -> String {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let backend = DockerBackend::connect().await.unwrap();
        let docker = backend.client();
        let inspect = docker.inspect_container(container, None).await.unwrap();
        let mut text = serde_json::to_string(&inspect).unwrap();
        // The executor is the unit's init's child, not an exec: the
        // container's configuration (the init's command line and
        // environment) is what could show a value; any exec is checked too.
        let execs = inspect.exec_ids.clone().unwrap_or_default();
        for exec in execs {
            let exec = docker.inspect_exec(&exec).await.unwrap();
            text.push_str(&serde_json::to_string(&exec).unwrap());
        }
        text
    })
}

#[test]
fn secrets_are_files_out_of_docker_inspect_and_redacted_for_the_client() {
    if !engine_ready() {
        return;
    }
    secrets_are_files_and_redacted("docker");
}

#[test]
fn secrets_are_files_out_of_the_units_command_lines_and_redacted_on_local() {
    if box_confine::landlock_abi() == 0 {
        assert!(!under_ci(), "landlock is missing under CI");
        eprintln!("\n*** LOCAL SECRETS TEST NOT RUN: this kernel has no landlock ***\n");
        return;
    }
    secrets_are_files_and_redacted("local");
}

fn secrets_are_files_and_redacted(backend: &'static str) {
    let profiles = profiles(&format!(
        "[env]\nsecrets = [\"{FILE}\", {{name = \"{ENV}\", as_env = true}}]\n"
    ));
    let ws = tempfile::tempdir().unwrap();
    let mut served = Served::start_on(backend, "files", ws.path(), profiles.path());
    let init = served.initialize();
    let result = &init["result"];
    assert!(result.is_object(), "{init}");
    let text = init.to_string();
    assert!(!text.contains(FILE_VALUE) && !text.contains(ENV_VALUE));
    let envelope =
        &result["capabilities"]["experimental"][box_jsonrpc::EXECUTOR_KEY]["box"]["units"][0];
    assert_eq!(
        envelope["secrets"],
        json!([
            {"name": FILE, "path": format!("/run/secrets/{FILE}"), "asEnv": false},
            {"name": ENV, "path": format!("/run/secrets/{ENV}"), "asEnv": true},
        ]),
        "{init}"
    );

    // The file is there, 0400 and the unit's user's; its value comes back
    // redacted, raw and in base64.
    let out = served.bash(
        1,
        &format!(
            "stat -c '%a %u' /run/secrets/{FILE}; id -u; cat /run/secrets/{FILE}; echo; \
             printf %s \"$(cat /run/secrets/{FILE})\" | base64; \
             echo \"env=${{{ENV}:-unset}}\"; echo \"file-env=${{{FILE}:-unset}}\"; \
             echo \"carriers=$(env | grep -c '^BOX_SECRET_')\"; \
             echo overwrite > /run/secrets/{FILE} && echo overwritten || echo read-only"
        ),
    );
    let mut lines = out.lines();
    let (mode, uid) = lines.next().unwrap().split_once(' ').unwrap();
    assert_eq!(mode, "400", "{out}");
    assert_eq!(Some(uid), lines.next(), "owned by the unit's user: {out}");
    assert!(!out.contains(FILE_VALUE), "{out}");
    assert!(!out.contains(&BASE64.encode(FILE_VALUE)), "{out}");
    assert_eq!(
        out.matches(&format!("[REDACTED:{FILE}]")).count(),
        2,
        "raw and base64: {out}"
    );
    // The as_env secret is a variable of the tools' processes, redacted too;
    // the file-only one is not a variable at all.
    assert!(out.contains(&format!("env=[REDACTED:{ENV}]")), "{out}");
    assert!(out.contains("file-env=unset"), "{out}");
    // The carriers that brought the values to the executor reach no tool,
    // and the tools cannot change what was delivered.
    assert!(out.contains("carriers=0"), "{out}");
    assert!(out.contains("read-only"), "{out}");

    // Issue 22, item 1: a bash call's progress carries its output as it
    // comes; the value in it is redacted, raw and in base64, as in the result.
    served.send(&json!({"jsonrpc": "2.0", "id": 100, "method": "tools/call", "params": {
        "name": "bash",
        "arguments": {"command": format!(
            "cat /run/secrets/{FILE}; echo; printf %s \"$(cat /run/secrets/{FILE})\" | base64; sleep 1.5"
        )},
        "_meta": {"progressToken": "secret-progress"},
    }}));
    let (before, answer) = served.answer_after(100);
    let progress: Vec<&Value> = before
        .iter()
        .filter(|message| message["method"] == json!("notifications/progress"))
        .collect();
    assert!(
        !progress.is_empty(),
        "no progress before the answer: {before:?}"
    );
    let shown: String = progress
        .iter()
        .map(|message| {
            assert_eq!(message["params"]["progressToken"], json!("secret-progress"));
            message["params"]["message"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        })
        .collect();
    for message in before.iter().chain([&answer]) {
        let text = message.to_string();
        assert!(
            !text.contains(FILE_VALUE) && !text.contains(&BASE64.encode(FILE_VALUE)),
            "the client got the value: {text}"
        );
    }
    assert_eq!(
        shown.matches(&format!("[REDACTED:{FILE}]")).count(),
        2,
        "raw and base64 in the progress: {shown:?}"
    );

    // Process output read in small chunks: the value split across reads is
    // still redacted.
    let started = served.call(
        2,
        "agentworkspace/process.start",
        json!({"args": ["sh", "-c", format!("printf 'key: %s done\\n' \"$(cat /run/secrets/{FILE})\"")]}),
    );
    let id = started["result"]["id"].as_str().unwrap().to_owned();
    let mut output = Vec::new();
    for request in 3..200 {
        let read = served.call(
            request,
            "agentworkspace/process.read",
            json!({"id": id, "fd": 1, "max": 7}),
        );
        if let Some(data) = read["result"]["data"].as_str() {
            output.extend(BASE64.decode(data).unwrap());
        }
        if read["result"]["eof"] == json!(true) {
            break;
        }
    }
    assert_eq!(
        String::from_utf8_lossy(&output),
        format!("key: [REDACTED:{FILE}] done\n")
    );

    wrapped_base64_never_reaches_the_client(&mut served);

    if backend == "docker" {
        // Nothing docker shows holds either value.
        let containers = served.containers();
        assert_eq!(containers.len(), 1, "{containers:?}");
        let shown = inspected(&containers[0]);
        for value in [FILE_VALUE, ENV_VALUE] {
            assert!(!shown.contains(value), "docker inspect shows a secret");
        }
    } else {
        // The unit's processes (the helper, as `box units inspect` names it;
        // the init and the executor are its descendants): neither value on a
        // command line or in an environment block, which is what /proc shows
        // other processes of the same user (and root).
        let helper = local_helper(envelope["id"].as_str().unwrap());
        let unit = descendants(helper);
        assert!(unit.len() >= 2, "helper and executor at least: {unit:?}");
        for pid in unit {
            for what in ["cmdline", "environ"] {
                let shown = std::fs::read(format!("/proc/{pid}/{what}")).unwrap_or_default();
                let shown = String::from_utf8_lossy(&shown);
                for value in [FILE_VALUE, ENV_VALUE] {
                    assert!(
                        !shown.contains(value),
                        "/proc/{pid}/{what} of the unit shows a secret"
                    );
                }
                assert!(
                    !shown.contains("BOX_SECRET_"),
                    "/proc/{pid}/{what}: {shown}"
                );
            }
        }
    }
    served.hang_up();
}

/// The sandbox helper of local unit `id`, as `box units inspect` shows it.
fn local_helper(id: &str) -> u32 {
    let out = Command::new(box_bin())
        .args(["units", "inspect", "--json", "--backend", "local", id])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let pid = shown["pid"].as_u64().unwrap_or_else(|| panic!("{shown}"));
    u32::try_from(pid).unwrap()
}

/// The stable run of the file secret's base64 at each of the three
/// alignments: what must not reach the client, line breaks taken out.
fn file_value_runs() -> Vec<String> {
    (0..3)
        .map(|alignment| {
            let encoded = BASE64.encode(format!("{}{FILE_VALUE}", "x".repeat(alignment)));
            let skip = (8 * alignment).div_ceil(6);
            encoded[skip..skip + 8 * FILE_VALUE.len() / 6 - 2].to_owned()
        })
        .collect()
}

/// Issue 22, item 2: `base64` wraps at 76 columns (PEM and `base64 -w 64`
/// at 64), so the value's encoding is cut by a line break once what comes
/// before it takes the encoding near a line's end; at each alignment, with
/// `\n` and `\r\n`, in a tool result, in process output read a few bytes at
/// a time, and in a file read through the files resource, no piece of the
/// wrapped encoding that decodes to the value reaches the client.
fn wrapped_base64_never_reaches_the_client(served: &mut Served) {
    let runs = file_value_runs();
    let shows_value = |text: &str| {
        let joined = text.replace(['\n', '\r'], "");
        runs.iter().any(|run| joined.contains(run.as_str()))
    };
    // Prefixes of 47 to 49 bytes put the value across the first break at
    // 76 columns, 40 to 42 across the first at 64: each at all three
    // alignments.
    let command = format!(
        "for n in 47 48 49; do {{ head -c $n /dev/zero | tr '\\0' x; cat /run/secrets/{FILE}; }} | base64; done; \
         for n in 40 41 42; do {{ head -c $n /dev/zero | tr '\\0' x; cat /run/secrets/{FILE}; }} | base64 -w 64; done; \
         {{ head -c 48 /dev/zero | tr '\\0' x; cat /run/secrets/{FILE}; }} | base64 | sed 's/$/\r/'"
    );
    // The unredacted output really is cut: the check below would catch it.
    let out = served.bash(
        300,
        &format!("{{ {command}; }} | tr 'A-Za-z' 'N-ZA-Mn-za-m'"),
    );
    assert!(
        !out.contains("[REDACTED:"),
        "the rotated output holds no form: {out}"
    );
    let out = served.bash(301, &command);
    assert!(!shows_value(&out), "the client got the value: {out}");
    assert_eq!(
        out.matches(&format!("[REDACTED:{FILE}]")).count(),
        7,
        "one marker per encoding: {out}"
    );

    // The same output read through process.read, 7 bytes at a time.
    let started = served.call(
        302,
        "agentworkspace/process.start",
        json!({"args": ["sh", "-c", command]}),
    );
    let id = started["result"]["id"].as_str().unwrap().to_owned();
    let mut output = Vec::new();
    for request in 303..2000 {
        let read = served.call(
            request,
            "agentworkspace/process.read",
            json!({"id": id, "fd": 1, "max": 7}),
        );
        if let Some(data) = read["result"]["data"].as_str() {
            output.extend(BASE64.decode(data).unwrap());
        }
        if read["result"]["eof"] == json!(true) {
            break;
        }
    }
    let output = String::from_utf8(output).unwrap();
    assert!(!shows_value(&output), "the client got the value: {output}");
    assert_eq!(
        Some(output.as_str()),
        out.strip_suffix("[exit 0]"),
        "read in chunks as in one result"
    );

    // A file the unit wrote, read through the files resource.
    served.bash(
        2001,
        &format!(
            "{{ head -c 48 /dev/zero | tr '\\0' x; cat /run/secrets/{FILE}; }} | base64 > wrapped.txt"
        ),
    );
    let read = served.call(
        2002,
        "resources/read",
        json!({"uri": "agentworkspace:///read?path=wrapped.txt"}),
    );
    let text = read["result"]["contents"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{read}"));
    let document: Value = serde_json::from_str(text).unwrap();
    let bytes = BASE64
        .decode(
            document["data"]
                .as_str()
                .unwrap_or_else(|| panic!("{read}")),
        )
        .unwrap();
    let file = String::from_utf8(bytes).unwrap();
    assert!(!shows_value(&file), "the client got the value: {file}");
    assert!(file.contains(&format!("[REDACTED:{FILE}]")), "{file}");
}

/// `pid` and every process below it.
fn descendants(pid: u32) -> Vec<u32> {
    let mut found = vec![pid];
    let mut at = 0;
    while at < found.len() {
        let parent = found[at];
        let children = std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children"))
            .unwrap_or_default();
        found.extend(
            children
                .split_whitespace()
                .filter_map(|child| child.parse::<u32>().ok()),
        );
        at += 1;
    }
    found
}

/// A workspace whose `.git/config` persists an extraheader token.
fn persisted_workspace(token: &str) -> tempfile::TempDir {
    let ws = tempfile::tempdir().unwrap();
    std::fs::create_dir(ws.path().join(".git")).unwrap();
    std::fs::write(
        ws.path().join(".git/config"),
        format!(
            "[core]\n\tbare = false\n\
             [http \"https://github.com/\"]\n\textraheader = AUTHORIZATION: basic {token}\n"
        ),
    )
    .unwrap();
    ws
}

#[test]
fn a_persisted_extraheader_is_reported_and_redacted_or_refuses_the_session() {
    if !engine_ready() {
        return;
    }
    const TOKEN: &str = "eC1hY2Nlc3MtdG9rZW46Z2hzX2UyZWNhbmFyeQ==";
    let ws = persisted_workspace(TOKEN);

    let report = profiles("");
    let mut served = Served::start("report", ws.path(), report.path());
    let init = served.initialize();
    let text = init.to_string();
    assert!(init.get("result").is_some(), "{init}");
    assert!(!text.contains(TOKEN), "{init}");
    assert!(text.contains("persistedCredentials"), "{init}");
    assert!(text.contains(".git/config"), "{init}");
    assert!(text.contains("extraheader"), "{init}");
    let out = served.bash(1, "cat .git/config");
    assert!(!out.contains(TOKEN), "{out}");
    assert!(out.contains("[REDACTED:.git/config:"), "{out}");
    served.hang_up();

    let refuse = profiles("[workspace]\non_persisted_credentials = \"refuse\"\n");
    let mut served = Served::start("refuse", ws.path(), refuse.path());
    let init = served.initialize();
    let message = init["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(".git/config:4"), "{init}");
    assert!(message.contains("extraheader"), "{init}");
    assert!(message.contains("on_persisted_credentials"), "{init}");
    assert!(!init.to_string().contains(TOKEN), "{init}");
    assert_eq!(
        init["error"]["data"]["field"],
        "workspace.on_persisted_credentials"
    );
    assert!(
        served.containers().is_empty(),
        "a refused session starts no unit"
    );
    served.hang_up();
}

/// `on_persisted_credentials = "hide"`: the unit sees `.git/config` with the
/// value masked, read-only, while the host's file keeps it. Checked from the
/// unit's side with what redaction does not catch (a fragment of the value,
/// its count), so what is asserted is what the unit could read.
#[test]
fn a_hidden_persisted_credential_is_not_in_the_units_view_of_the_file() {
    if !engine_ready() {
        return;
    }
    const TOKEN: &str = "eC1oaWRkZW4tdG9rZW46Z2hzX2hpZGVjYW5hcnk=";
    let ws = persisted_workspace(TOKEN);
    let hide = profiles("[workspace]\non_persisted_credentials = \"hide\"\n");
    let mut served = Served::start("hide", ws.path(), hide.path());
    let init = served.initialize();
    assert!(init.get("result").is_some(), "{init}");
    let found = &init["result"]["capabilities"]["experimental"]["io.github.christopherdavenport.dax/executor"]
        ["box"]["units"][0]["persistedCredentials"];
    assert_eq!(found[0]["file"], ".git/config", "{init}");
    assert_eq!(found[0]["hidden"], true, "{init}");
    // A fragment of the token is no secret value to the redactor: only the
    // mask keeps it from the unit.
    let out = served.bash(
        1,
        "grep -c 'aGlkZWNhbmFyeQ' .git/config; grep -o 'Z2hzX2hpZGVjYW5hcnk' .git/config; grep extraheader .git/config",
    );
    assert!(out.starts_with("0\n"), "the unit sees the token: {out}");
    assert!(!out.contains("Z2hzX2hpZGVjYW5hcnk"), "{out}");
    assert!(out.contains("HIDDEN-BY-BOX"), "{out}");
    let out = served.bash(2, "echo '[x]' >> .git/config && echo wrote || echo refused");
    assert!(
        out.contains("refused"),
        "the masked file is read-only: {out}"
    );
    // git in the unit still reads the config.
    let out = served.bash(3, "git config --file .git/config --get core.bare");
    assert!(out.contains("false"), "{out}");
    served.hang_up();
    let host = std::fs::read_to_string(ws.path().join(".git/config")).unwrap();
    assert!(host.contains(TOKEN), "the host's file is unchanged: {host}");
}
