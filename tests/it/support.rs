//! Helpers shared by the integration tests.

#![allow(dead_code)]

use std::path::PathBuf;

mod http_host;
pub mod registries;
mod repository;
mod served;

pub use http_host::HttpHost;
pub use repository::{commit_all, git};
pub use served::{Served, serve_command};

/// The `box` binary cargo built for these tests.
pub fn box_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_box"))
}

/// `box-testhost` (its own crate): the `box` command line with the fake
/// backend (`--backend fake`), which the release `box` does not have. Cargo
/// builds it beside `box` when the workspace's tests are built
/// (`cargo nextest run --workspace`).
pub fn testhost_bin() -> PathBuf {
    let path = box_bin().with_file_name("box-testhost");
    assert!(
        path.exists(),
        "{} is missing: build the workspace's tests (`cargo nextest run --workspace`) or `cargo build -p box-testhost`",
        path.display()
    );
    path
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Whether this run is CI, where a missing engine or client is a failure, not a skip.
pub fn under_ci() -> bool {
    std::env::var_os("CI").is_some_and(|value| !value.is_empty() && value != "false")
}

/// The Python interpreter that has the `mcp` SDK (scripts/test.sh sets it up).
pub fn python() -> PathBuf {
    match std::env::var_os("BOX_TEST_PYTHON") {
        Some(path) => PathBuf::from(path),
        None => repo_root().join(".venv/bin/python"),
    }
}

/// The Python that has the `mcp` SDK, or `None` after saying loudly why not;
/// under CI its absence is a failure, never a skip.
pub fn python_with_mcp() -> Option<PathBuf> {
    let python = python();
    let works = std::process::Command::new(&python)
        .args(["-c", "import mcp"])
        .output()
        .is_ok_and(|output| output.status.success());
    if works {
        return Some(python);
    }
    let message = format!(
        "the Python `mcp` SDK is not installed at {} (run scripts/test.sh, or set BOX_TEST_PYTHON)",
        python.display()
    );
    assert!(!under_ci(), "{message}");
    eprintln!("\n*** PYTHON CLIENT TEST NOT RUN: {message} ***\n");
    None
}

/// The Python of [`python_with_mcp`] when it also has the official OTLP
/// definitions (`opentelemetry-proto`, which scripts/test.sh installs);
/// under CI their absence is a failure, never a skip.
pub fn python_with_otlp() -> Option<PathBuf> {
    let python = python_with_mcp()?;
    let works = std::process::Command::new(&python)
        .args([
            "-c",
            "from opentelemetry.proto.collector.trace.v1 import trace_service_pb2",
        ])
        .output()
        .is_ok_and(|output| output.status.success());
    if works {
        return Some(python);
    }
    let message = format!(
        "the Python `opentelemetry-proto` package is not installed at {} (run scripts/test.sh, or set BOX_TEST_PYTHON)",
        python.display()
    );
    assert!(!under_ci(), "{message}");
    eprintln!("\n*** OTLP RECEIVER TEST NOT RUN: {message} ***\n");
    None
}

/// Whether a Docker engine answers, after saying loudly why not when it does
/// not; under CI its absence is a failure, never a skip.
pub async fn docker_answers() -> bool {
    match boxhost::backend::docker::DockerBackend::connect().await {
        Ok(_) => true,
        Err(error) => {
            assert!(!under_ci(), "CI needs a Docker engine: {error}");
            eprintln!("\n*** DOCKER PART NOT RUN: {error} ***\n");
            false
        }
    }
}

/// `docker_answers` for a test that is not async.
pub fn docker_here() -> bool {
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(docker_answers())
}

/// Whether the local backend can run here (landlock), after saying loudly
/// why not when it cannot; under CI its absence is a failure, never a skip.
pub fn local_here() -> bool {
    if box_confine::landlock_abi() > 0 {
        return true;
    }
    assert!(!under_ci(), "landlock is missing under CI");
    eprintln!("\n*** LOCAL PART NOT RUN: this kernel has no landlock ***\n");
    false
}

/// `box/merge {"unit": "workspace"}` of `session` on the HTTP host at
/// `address`: it answers that it merged exactly the paths of `merged` (in
/// any order), and each `(path, text)` of it now holds its text in
/// `workspace`, the host directory the session's fork was made from.
pub async fn merges_workspace_back(
    address: std::net::SocketAddr,
    session: &str,
    workspace: &std::path::Path,
    merged: &[(&str, &str)],
) {
    let message = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "box/merge", "params": {"unit": "workspace"}});
    let answer = crate::serve::post(address, Some(session), &[], &message)
        .await
        .json();
    let mut paths: Vec<String> = answer["result"]["merged"]
        .as_array()
        .unwrap_or_else(|| panic!("{answer}"))
        .iter()
        .map(|path| path.as_str().unwrap().to_owned())
        .collect();
    paths.sort();
    let mut expected: Vec<&str> = merged.iter().map(|(path, _)| *path).collect();
    expected.sort_unstable();
    assert_eq!(paths, expected, "{answer}");
    for (path, text) in merged {
        assert_eq!(
            std::fs::read_to_string(workspace.join(path)).unwrap(),
            *text,
            "{path}"
        );
    }
}

/// Every entry beneath `dir` with its size and modification time.
pub fn snapshot(dir: &std::path::Path) -> Vec<(PathBuf, u64, std::time::SystemTime)> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next).unwrap().flatten() {
            let metadata = entry.metadata().unwrap();
            if metadata.is_dir() {
                pending.push(entry.path());
            }
            found.push((entry.path(), metadata.len(), metadata.modified().unwrap()));
        }
    }
    found.sort();
    found
}

/// The containers labelled with `instance` (and, if given, unit `unit`).
pub async fn containers(instance: &str, unit: Option<&str>) -> Vec<String> {
    let docker = boxhost::backend::docker::bollard::Docker::connect_with_defaults().unwrap();
    let mut labels = vec![format!("box.instance={instance}")];
    if let Some(unit) = unit {
        labels.push(format!("box.unit={unit}"));
    }
    let filters = std::collections::HashMap::from([("label".to_owned(), labels)]);
    let options =
        boxhost::backend::docker::bollard::query_parameters::ListContainersOptionsBuilder::new()
            .all(true)
            .filters(&filters)
            .build();
    docker
        .list_containers(Some(options))
        .await
        .unwrap()
        .into_iter()
        .filter_map(|container| container.id)
        .collect()
}

/// What `box ARGS` printed on a terminal and how it exited: run under a
/// pseudo-terminal of `rows`×`cols` that the test holds (Python's `pty`),
/// typing `keys` once the output shows `ready` (after resizing the terminal
/// to `resize`, when given), then reading until box exits. Also says whether
/// the terminal was back in cooked mode (echo, line editing) after box exited.
pub struct PtyRun {
    pub output: String,
    pub status: i32,
    pub cooked_after: bool,
}

pub fn box_in_a_pty(
    args: &[&str],
    size: (u16, u16),
    ready: &str,
    resize: Option<(u16, u16)>,
    keys: &str,
) -> PtyRun {
    let driver = r#"
import fcntl, json, os, pty, struct, sys, termios, time
box, args, rows, cols, ready, resize, keys = json.loads(sys.argv[1])
pid, fd = pty.fork()
if pid == 0:
    fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    os.execv(box, [box] + args)
out, typed = b"", False
deadline = time.time() + 120
while time.time() < deadline:
    try:
        data = os.read(fd, 4096)
    except OSError:
        break
    if not data:
        break
    out += data
    if not typed and ready.encode() in out:
        typed = True
        if resize:
            fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", resize[0], resize[1], 0, 0))
            time.sleep(1)
        os.write(fd, keys.encode())
_, status = os.waitpid(pid, 0)
lflag = termios.tcgetattr(fd)[3]
cooked = bool(lflag & termios.ECHO) and bool(lflag & termios.ICANON)
print(json.dumps({"output": out.decode(errors="replace"), "status": os.waitstatus_to_exitcode(status), "cooked": cooked}))
"#;
    let input = serde_json::json!([
        box_bin(),
        args,
        size.0,
        size.1,
        ready,
        resize.map(|(rows, cols)| vec![rows, cols]),
        keys
    ]);
    let output = std::process::Command::new("python3")
        .arg("-c")
        .arg(driver)
        .arg(input.to_string())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "the pty driver failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let result: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    PtyRun {
        output: result["output"].as_str().unwrap().to_owned(),
        status: i32::try_from(result["status"].as_i64().unwrap()).unwrap(),
        cooked_after: result["cooked"].as_bool().unwrap(),
    }
}

/// A plain HTTP server on the host's loopback answering every request with
/// `body`; its port.
pub fn http_server(body: &'static str) -> u16 {
    use std::io::{Read as _, Write as _};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match stream.read(&mut byte) {
                        Ok(1) => head.push(byte[0]),
                        _ => return,
                    }
                }
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    port
}

/// Issue 22, item 5: calls in flight while a test freezes its host past the
/// unit's lease. [`FrozenCalls::send`] sends one bash call that never ends,
/// then `count` that end half a second after they start (each leaving
/// `.done-N` in the workspace as its last act); [`FrozenCalls::wait_started`]
/// returns once the unit runs them all, the moment to freeze the host.
pub struct FrozenCalls {
    /// The id of the call that never ends; the others follow it.
    pub first: i64,
    /// How many calls end.
    pub count: i64,
}

impl FrozenCalls {
    /// The calls, as `send` sends them.
    pub fn send(&self, mut send: impl FnMut(&serde_json::Value)) {
        let call = |id: i64, command: String| {
            serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": "bash", "arguments": {"command": command}}})
        };
        send(&call(
            self.first,
            format!(": > .started-{0}; sleep 60; echo never", self.first),
        ));
        for id in self.ids() {
            send(&call(
                id,
                format!(": > .started-{id}; sleep 0.5; echo finished-{id}; : > .done-{id}"),
            ));
        }
    }

    fn ids(&self) -> std::ops::RangeInclusive<i64> {
        self.first + 1..=self.first + self.count
    }

    /// Wait until every call runs in the unit (its `.started-N` is in `workspace`).
    pub fn wait_started(&self, workspace: &std::path::Path) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        for id in self.first..=self.first + self.count {
            while !workspace.join(format!(".started-{id}")).exists() {
                assert!(
                    std::time::Instant::now() < deadline,
                    "call {id} never started in the unit"
                );
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
    }

    /// Once the host resumed: every call whose command finished (its
    /// `.done-N` is in `workspace`) is answered with its result, any other
    /// with its outcome unknown, never as not run; at least one finished.
    /// `next` gives the next message for which its argument holds (the
    /// answers come in any order).
    pub fn check(
        &self,
        workspace: &std::path::Path,
        mut next: impl FnMut(&dyn Fn(&serde_json::Value) -> bool) -> serde_json::Value,
    ) {
        let ids: Vec<i64> = (self.first..=self.first + self.count).collect();
        let mut answers = std::collections::BTreeMap::new();
        while answers.len() < ids.len() {
            let message = next(&|message| {
                message.get("method").is_none()
                    && message["id"].as_i64().is_some_and(|id| ids.contains(&id))
            });
            answers.insert(message["id"].as_i64().unwrap_or_default(), message);
        }
        let mut answer = |id: i64| answers.remove(&id).unwrap_or_default();
        let unknown = |id: i64, answer: &serde_json::Value| {
            assert_eq!(
                answer["error"]["data"]["outcome"],
                serde_json::json!("unknown"),
                "call {id}: {answer}"
            );
            let message = answer["error"]["message"].as_str().unwrap_or_default();
            assert!(
                message.contains("outcome is unknown"),
                "call {id}: {answer}"
            );
        };
        let mut finished = 0;
        for id in self.ids() {
            let answer = answer(id);
            if workspace.join(format!(".done-{id}")).exists() {
                let text = answer["result"]["content"][0]["text"]
                    .as_str()
                    .unwrap_or_default();
                assert!(
                    text.contains(&format!("finished-{id}")),
                    "call {id} finished in the unit, yet was answered: {answer}"
                );
                finished += 1;
            } else {
                unknown(id, &answer);
            }
        }
        unknown(self.first, &answer(self.first));
        assert!(finished > 0, "no call finished before the lease lapsed");
        eprintln!(
            "{finished} of {} calls finished before the lease lapsed",
            self.count
        );
    }
}
