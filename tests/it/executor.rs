//! `box execute` over stdio: hand-written JSON-RPC lines, and the Python `mcp`
//! SDK end to end (tests/e2e/executor_client.py).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::support;

/// A `box execute` child and a line-oriented JSON-RPC client for it.
struct Executor {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
}

impl Executor {
    fn start(root: &Path, extra: &[&str]) -> Self {
        Self::start_with(
            Command::new(support::box_bin())
                .arg("execute")
                .arg("--root")
                .arg(root)
                .args(["--landlock", "off"])
                .args(extra),
        )
    }

    fn start_with(command: &mut Command) -> Self {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn box execute");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Self {
            child,
            stdin,
            stdout,
            next_id: 1,
        }
    }

    /// Start and initialize with `capabilities`.
    fn ready(root: &Path, extra: &[&str], capabilities: Value) -> (Self, Value) {
        let mut executor = Self::start(root, extra);
        let result = executor
            .request(
                "initialize",
                json!({"protocolVersion": "2025-11-25", "capabilities": capabilities,
                       "clientInfo": {"name": "it", "version": "1"}}),
            )
            .expect("initialize");
        executor.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        (executor, result)
    }

    fn send(&mut self, message: &Value) {
        self.send_line(message.to_string().as_bytes());
    }

    fn send_line(&mut self, line: &[u8]) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(line).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    }

    /// The next message that is not a notification.
    fn response(&mut self) -> Value {
        loop {
            let mut line = String::new();
            let read = self.stdout.read_line(&mut line).unwrap();
            assert!(read > 0, "the executor closed stdout");
            let message: Value = serde_json::from_str(&line).unwrap();
            if message.get("id").is_some() {
                return message;
            }
        }
    }

    /// Send a request and wait for its response: the result, or the error object.
    fn request(&mut self, method: &str, params: Value) -> Result<Value, Value> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let response = self.response();
        assert_eq!(response["id"], json!(id), "{response}");
        match response.get("error") {
            Some(error) => Err(error.clone()),
            None => Ok(response["result"].clone()),
        }
    }

    /// Call a tool: `Ok(text)` or `Err(text)` for an error result.
    fn call(&mut self, tool: &str, arguments: Value) -> Result<String, String> {
        let result = self
            .request("tools/call", json!({"name": tool, "arguments": arguments}))
            .unwrap_or_else(|error| panic!("tools/call {tool}: {error}"));
        let text = result["content"][0]["text"].as_str().unwrap().to_owned();
        if result["isError"] == json!(true) {
            Err(text)
        } else {
            Ok(text)
        }
    }

    /// Close stdin and wait for the exit status.
    fn finish(mut self) -> std::process::ExitStatus {
        drop(self.stdin.take());
        wait_with_deadline(&mut self.child, Duration::from_secs(10))
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_with_deadline(child: &mut Child, deadline: Duration) -> std::process::ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(started.elapsed() < deadline, "the executor did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "one\ntwo\nthree\n").unwrap();
    std::fs::create_dir(dir.path().join("src")).unwrap();
    std::fs::write(
        dir.path().join("src/main.rs"),
        "fn main() {\n    println!(\"hi\");\n}\n",
    )
    .unwrap();
    dir
}

#[test]
fn initialize_advertises_the_executor_capability() {
    let dir = workspace();
    let (executor, result) = Executor::ready(
        dir.path(),
        &["--kind", "container", "--ref", "app-box"],
        json!({}),
    );
    assert_eq!(
        result["serverInfo"],
        json!({"name": "box", "version": env!("CARGO_PKG_VERSION")})
    );
    let capabilities = &result["capabilities"];
    assert_eq!(
        capabilities["experimental"]["io.github.christopherdavenport.agenttool/facts"],
        json!({})
    );
    let executor_capability =
        &capabilities["experimental"]["io.github.christopherdavenport.dax/executor"];
    let root = std::fs::canonicalize(dir.path()).unwrap();
    assert_eq!(
        *executor_capability,
        json!({
            "version": 1,
            "descriptor": {"kind": "container", "ref": "app-box", "root": root.to_str().unwrap()},
            "extensions": ["dax-coding", "box-namespace"],
            "tools": [
                {"name": "read", "extension": "dax-coding", "readOnly": true, "facts": true},
                {"name": "write", "extension": "dax-coding", "facts": true},
                {"name": "edit", "extension": "dax-coding", "facts": true},
                {"name": "glob", "extension": "dax-coding", "readOnly": true, "facts": true},
                {"name": "grep", "extension": "dax-coding", "readOnly": true, "facts": true},
                {"name": "ls", "extension": "dax-coding", "readOnly": true, "facts": true},
                {"name": "bash", "extension": "dax-coding", "readOnly": true, "facts": true},
                {"name": "copy", "extension": "box-namespace", "facts": true},
                {"name": "move", "extension": "box-namespace", "facts": true},
                {"name": "remove", "extension": "box-namespace", "facts": true}
            ],
            "files": {"uriTemplate": "agentworkspace:///{op}{?path}"},
            "start": {"maxProcesses": 32, "maxWriteBytes": 1048576, "maxReadBytes": 65536},
            "maxReadBytes": 2097152
        })
    );
    assert_eq!(capabilities["tools"], json!({"listChanged": false}));
    assert_eq!(capabilities["resources"], json!({"listChanged": false}));
    assert!(executor.finish().success());
}

#[test]
fn the_client_may_lower_the_read_limit_but_not_raise_it() {
    let dir = workspace();
    let key = "io.github.christopherdavenport.dax/executor";
    let ask = |asked: u64, flag: &str| {
        let (_executor, result) = Executor::ready(
            dir.path(),
            &["--max-read-bytes", flag],
            json!({"experimental": {key: {"maxReadBytes": asked}}}),
        );
        result["capabilities"]["experimental"][key]["maxReadBytes"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(ask(4096, "0"), 4096);
    assert_eq!(ask(1 << 30, "0"), 2 * 1024 * 1024);
    assert_eq!(ask(1 << 20, "8192"), 8192);
    let (mut executor, _) = Executor::ready(
        dir.path(),
        &[],
        json!({"experimental": {key: {"maxReadBytes": 4}}}),
    );
    let out = executor.call("read", json!({"path": "notes.txt"})).unwrap();
    assert!(
        out.contains("stopped after the first 4 of 14 bytes"),
        "{out}"
    );
}

/// Issue 22, item 7: a read limit that is not a positive integer is refused
/// by `box execute` as `box serve` refuses it, with the same message naming
/// the field; a good one is applied.
#[test]
fn a_bad_read_limit_is_refused_as_box_serve_refuses_it() {
    let dir = workspace();
    let key = "io.github.christopherdavenport.dax/executor";
    let initialize = |asked: &Value| {
        json!({"protocolVersion": "2025-11-25",
               "capabilities": {"experimental": {key: {"maxReadBytes": asked}}},
               "clientInfo": {"name": "it", "version": "1"}})
    };
    for asked in [
        json!(-5),
        json!("x"),
        json!(0),
        json!(1.5),
        json!(true),
        json!({}),
    ] {
        let mut executor = Executor::start(dir.path(), &[]);
        let refused = executor
            .request("initialize", initialize(&asked))
            .expect_err("box execute refuses the read limit");
        let message = refused["message"].as_str().unwrap_or_default();
        assert_eq!(
            message,
            format!(
                "capabilities.experimental[\"{key}\"].maxReadBytes: must be a positive integer (bytes), got {asked}"
            ),
            "{refused}"
        );
        assert_eq!(refused["code"], json!(-32602), "{refused}");
        assert!(executor.finish().success());

        // The same initialize through `box serve` (the fake backend).
        let line = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": initialize(&asked)});
        let mut serve = Command::new(support::testhost_bin())
            .args(["serve", "--backend", "fake"])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut stdin = serve.stdin.take().unwrap();
        writeln!(stdin, "{line}").unwrap();
        drop(stdin);
        let mut answer = String::new();
        BufReader::new(serve.stdout.take().unwrap())
            .read_line(&mut answer)
            .unwrap();
        let answer: Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(answer["error"]["message"], json!(message), "{answer}");
        assert_eq!(answer["error"]["code"], refused["code"], "{answer}");
        wait_with_deadline(&mut serve, Duration::from_secs(30));
    }
    let (_executor, result) = Executor::ready(
        dir.path(),
        &[],
        json!({"experimental": {key: {"maxReadBytes": 4096}}}),
    );
    assert_eq!(
        result["capabilities"]["experimental"][key]["maxReadBytes"],
        json!(4096)
    );
}

#[test]
fn tools_list_carries_the_reference_schemas_and_flags() {
    let dir = workspace();
    let (mut executor, _) = Executor::ready(dir.path(), &[], json!({}));
    let listed = executor.request("tools/list", json!({})).unwrap();
    let tools = listed["tools"].as_array().unwrap();
    let names: Vec<&str> = tools
        .iter()
        .map(|tool| tool["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "read", "write", "edit", "glob", "grep", "ls", "bash", "copy", "move", "remove"
        ]
    );
    for tool in tools {
        assert_eq!(
            tool["inputSchema"]["properties"]["dax_stamp"],
            json!({"type": "string", "description": "Set by dax; leave it out"}),
            "{tool}"
        );
        let flags = &tool["_meta"]["io.github.christopherdavenport.agenttool/tool"];
        let expected = if tool["name"] == "bash" {
            json!({"facts": true, "replay": true, "sequential": true})
        } else {
            json!({"facts": true, "replay": true})
        };
        assert_eq!(*flags, expected);
    }
    assert_eq!(
        tools[1]["inputSchema"]["required"],
        json!(["path", "content"])
    );
}

#[test]
fn file_tools_work_over_stdio() {
    let dir = workspace();
    let (mut executor, _) = Executor::ready(dir.path(), &[], json!({}));
    assert_eq!(
        executor.call(
            "read",
            json!({"path": "notes.txt", "offset": 2, "limit": 1})
        ),
        Ok("     2\ttwo\n... (1 more lines; use offset=3)\n".to_owned())
    );
    assert_eq!(
        executor.call(
            "edit",
            json!({"path": "notes.txt", "old_string": "two", "new_string": "2"})
        ),
        Ok("edited notes.txt".to_owned())
    );
    assert_eq!(
        executor.call("write", json!({"path": "out/new.txt", "content": "fresh"})),
        Ok("wrote 5 bytes to out/new.txt".to_owned())
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes.txt")).unwrap(),
        "one\n2\nthree\n"
    );
    assert_eq!(
        executor.call("ls", json!({})),
        Ok("notes.txt  12\nout/\nsrc/\n".to_owned())
    );
    assert_eq!(
        executor.call("glob", json!({"pattern": "**/*.{rs,txt}"})),
        Ok("notes.txt\nout/new.txt\nsrc/main.rs\n".to_owned())
    );
    assert_eq!(
        executor.call("grep", json!({"pattern": "println"})),
        Ok("src/main.rs:2:    println!(\"hi\");\n".to_owned())
    );
}

#[test]
fn facts_answer_in_order_and_stamps_bind_the_path() {
    let dir = workspace();
    let (mut executor, _) = Executor::ready(dir.path(), &[], json!({}));
    let answer = executor
        .request(
            "execution/facts",
            json!({"calls": [
                {"name": "read", "arguments": {"path": "notes.txt"}},
                {"name": "nope", "arguments": {}},
                {"name": "ls"},
                {"name": "read", "arguments": {"path": "x", "PATH": "y"}},
                {"name": "bash", "arguments": {"command": "ls"}}
            ]}),
        )
        .unwrap();
    let results = answer["results"].as_array().unwrap();
    assert_eq!(results.len(), 5);
    assert_eq!(
        results[0]["facts"]["calls"],
        json!([{"tool": "", "args": {"path": "notes.txt"}, "text": "notes.txt"}])
    );
    assert_eq!(
        results[1],
        json!({"error": "unknown tool \"nope\"", "replay": "unknown"})
    );
    assert_eq!(
        results[2]["facts"]["calls"],
        json!([{"tool": "", "args": {"path": "."}, "text": "."}])
    );
    assert!(
        results[3]["error"]
            .as_str()
            .unwrap()
            .contains("in another case")
    );
    for result in results {
        assert_eq!(result["replay"], json!("unknown"));
        assert!(
            result.get("facts").is_some() != result.get("error").is_some(),
            "{result}"
        );
    }
    let rewrite = results[0]["facts"]["rewrite"].clone();
    assert_eq!(
        executor.call("read", rewrite.clone()),
        Ok("     1\tone\n     2\ttwo\n     3\tthree\n".to_owned())
    );
    // The path now leads somewhere else: the stamp is refused, nothing is read.
    std::fs::write(dir.path().join("secret"), "s3cret\n").unwrap();
    std::fs::remove_file(dir.path().join("notes.txt")).unwrap();
    symlink("secret", dir.path().join("notes.txt")).unwrap();
    assert_eq!(
        executor.call("read", rewrite),
        Err("what this call touches changed since it was allowed (a path leads somewhere else now); ask again".to_owned())
    );
}

#[test]
fn a_failed_edit_cancels_the_rest_of_a_batch() {
    let dir = workspace();
    let (mut executor, _) = Executor::ready(dir.path(), &[], json!({}));
    let answer = executor
        .request(
            "execution/batch",
            json!({"calls": [
                {"name": "read", "arguments": {"path": "notes.txt"}},
                {"name": "grep", "arguments": {"pattern": "one"}},
                {"name": "edit", "arguments": {"path": "notes.txt", "old_string": "absent", "new_string": "x"}},
                {"name": "write", "arguments": {"path": "after.txt", "content": "must not exist"}},
                {"name": "ls", "arguments": {}}
            ]}),
        )
        .unwrap();
    let results = answer["results"].as_array().unwrap();
    let texts: Vec<(&str, bool)> = results
        .iter()
        .map(|result| {
            (
                result["content"][0]["text"].as_str().unwrap(),
                result["isError"] == json!(true),
            )
        })
        .collect();
    let skipped = "skipped: edit failed earlier in this batch, so this call was cancelled";
    assert_eq!(
        texts,
        [
            ("     1\tone\n     2\ttwo\n     3\tthree\n", false),
            ("notes.txt:1:one\n", false),
            ("old_string not found in file", true),
            (skipped, true),
            (skipped, true),
        ]
    );
    assert!(!dir.path().join("after.txt").exists());
    // A failed read cancels nothing; a successful write lets the batch go on.
    let answer = executor
        .request(
            "execution/batch",
            json!({"calls": [
                {"name": "read", "arguments": {"path": "missing"}},
                {"name": "write", "arguments": {"path": "w.txt", "content": "w"}},
                {"name": "read", "arguments": {"path": "w.txt"}}
            ]}),
        )
        .unwrap();
    let results = answer["results"].as_array().unwrap();
    assert_eq!(results[0]["isError"], json!(true));
    assert_eq!(
        results[1]["content"][0]["text"],
        json!("wrote 1 bytes to w.txt")
    );
    assert_eq!(results[2]["content"][0]["text"], json!("     1\tw\n"));
}

#[test]
fn a_failing_bash_cancels_the_rest_of_a_batch() {
    let dir = workspace();
    let (mut executor, _) = Executor::ready(dir.path(), &[], json!({}));
    let answer = executor
        .request(
            "execution/batch",
            json!({"calls": [
                {"name": "read", "arguments": {"path": "notes.txt"}},
                {"name": "bash", "arguments": {"command": "exit 3"}},
                {"name": "write", "arguments": {"path": "after.txt", "content": "x"}}
            ]}),
        )
        .unwrap();
    let results = answer["results"].as_array().unwrap();
    assert_eq!(results[0]["isError"], json!(false));
    assert_eq!(
        results[2]["content"][0]["text"],
        json!("skipped: bash failed earlier in this batch, so this call was cancelled")
    );
    assert!(!dir.path().join("after.txt").exists());
}

#[test]
fn bash_progress_reaches_the_client_before_the_result() {
    let dir = workspace();
    let (mut executor, _) = Executor::ready(dir.path(), &[], json!({}));
    executor.send(
        &json!({"jsonrpc": "2.0", "id": 77, "method": "tools/call", "params": {
        "name": "bash",
        "arguments": {"command": "for i in 1 2 3; do echo $i; sleep 0.3; done"},
        "_meta": {"progressToken": "p77"}}}),
    );
    let mut progress = Vec::new();
    let result = loop {
        let mut line = String::new();
        assert!(executor.stdout.read_line(&mut line).unwrap() > 0);
        let message: Value = serde_json::from_str(&line).unwrap();
        if message["method"] == json!("notifications/progress") {
            assert_eq!(
                message["params"]["progressToken"],
                json!("p77"),
                "{message}"
            );
            progress.push(message["params"]["progress"].as_f64().unwrap());
        } else if message["id"] == json!(77) {
            break message["result"].clone();
        }
    };
    assert!(
        progress.windows(2).all(|pair| pair[0] < pair[1]),
        "{progress:?}"
    );
    let text = result["content"][0]["text"].as_str().unwrap();
    assert_ne!(result["isError"], json!(true), "{text}");
    assert_eq!(text, "1\n2\n3\n[exit 0]");
    assert!(!progress.is_empty(), "no progress before the result");
}

#[test]
fn files_resources_are_served() {
    let dir = workspace();
    let (mut executor, _) = Executor::ready(dir.path(), &[], json!({}));
    let templates = executor
        .request("resources/templates/list", json!({}))
        .unwrap();
    assert_eq!(
        templates["resourceTemplates"][0]["uriTemplate"],
        json!("agentworkspace:///{op}{?path}")
    );
    assert_eq!(
        templates["resourceTemplates"][0]["name"],
        json!("workspace-files")
    );
    let uri = "agentworkspace:///read?path=src%2Fmain.rs";
    let read = executor
        .request("resources/read", json!({"uri": uri}))
        .unwrap();
    let content = &read["contents"][0];
    assert_eq!(content["uri"], json!(uri));
    assert_eq!(content["mimeType"], json!("application/json"));
    let document: Value = serde_json::from_str(content["text"].as_str().unwrap()).unwrap();
    assert!(document["data"].is_string());
    let outside = executor
        .request(
            "resources/read",
            json!({"uri": "agentworkspace:///stat?path=..%2F.."}),
        )
        .unwrap();
    let document: Value =
        serde_json::from_str(outside["contents"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(document["error"]["kind"], json!("outside"));
}

/// Security B11–B25: hostile paths never reach outside; canaries stay as planted.
#[test]
fn hostile_paths_leave_the_canaries_untouched() {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("canary"), "canary").unwrap();
    let dir = workspace();
    let root = dir.path();
    symlink(outside.path(), root.join("out")).unwrap();
    symlink(outside.path().join("canary"), root.join("canary-link")).unwrap();
    symlink("/", root.join("slash")).unwrap();
    nix::unistd::mkfifo(
        &root.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let evil_sibling = format!("{}-evil/x", root.display());
    let (mut executor, _) = Executor::ready(root, &["--write-guard", "off"], json!({}));
    let outside_canary = format!("{}/canary", outside.path().display());
    let paths = [
        "../../etc/shadow",
        "/etc/shadow",
        "/proc/1/environ",
        "/proc/self/root/etc/passwd",
        "/proc/self/cwd/x",
        "/proc/self/fd/0",
        evil_sibling.as_str(),
        outside_canary.as_str(),
        "out/canary",
        "out/new-file",
        "canary-link",
        "slash/etc/passwd",
    ];
    for path in paths {
        for (tool, arguments) in [
            ("read", json!({"path": path})),
            ("write", json!({"path": path, "content": "pwned"})),
            (
                "edit",
                json!({"path": path, "old_string": "canary", "new_string": "pwned"}),
            ),
            ("ls", json!({"path": path})),
            ("grep", json!({"pattern": "canary", "path": path})),
            ("glob", json!({"pattern": "*", "path": path})),
        ] {
            let refused = executor.call(tool, arguments).unwrap_err();
            assert!(
                refused.contains("outside the workspace") || refused.contains("no such file"),
                "{tool} {path}: {refused}"
            );
        }
    }
    let started = Instant::now();
    assert_eq!(
        executor.call("read", json!({"path": "fifo"})),
        Err("fifo: not a regular file".to_owned())
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    for invalid in ["a\u{0}b", &"x/".repeat(3000), &"y".repeat(300)] {
        let refused = executor.call("read", json!({"path": invalid})).unwrap_err();
        assert!(refused.starts_with("invalid path"), "{refused}");
    }
    assert_eq!(
        std::fs::read_to_string(outside.path().join("canary")).unwrap(),
        "canary"
    );
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 1);
    assert!(!Path::new(&format!("{}-evil", root.display())).exists());
}

/// Security B25, E56, E59, E60: bad input gets an answer and the executor keeps serving.
#[test]
fn bad_input_is_answered_and_the_executor_keeps_serving() {
    let dir = workspace();
    let (mut executor, _) = Executor::ready(dir.path(), &[], json!({}));
    let error = executor
        .request("tools/call", json!({"name": "nope", "arguments": {}}))
        .unwrap_err();
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("unknown tool \"nope\""),
        "{error}"
    );
    assert_eq!(
        executor.call("read", json!({"path": 7})),
        Err("argument \"path\" must be a string, not a number".to_owned())
    );
    assert_eq!(
        executor.call("read", json!({"path": "notes.txt", "Path": ".env"})),
        Err("argument \"Path\" is \"path\" in another case; write it once, as \"path\"".to_owned())
    );
    assert!(
        executor
            .call("read", json!({"path": "notes.txt", "extra": 1}))
            .unwrap_err()
            .starts_with("unknown argument \"extra\"")
    );
    assert_eq!(
        executor.call("write", json!({"path": "x"})),
        Err("argument \"content\" is required".to_owned())
    );
    // The process methods are routed (whatever the process work answers), not unknown.
    match executor.request("agentworkspace/process.start", json!({"args": ["true"]})) {
        Ok(started) => assert!(started["id"].is_string(), "{started}"),
        Err(error) => assert_ne!(error["code"], json!(-32601), "{error}"),
    }
    let error = executor.request("no/such/method", json!({})).unwrap_err();
    assert_eq!(error["code"], json!(-32601));
    let error = executor
        .request("execution/batch", json!({"calls": "nope"}))
        .unwrap_err();
    assert_eq!(error["code"], json!(-32602));

    // Deeply nested JSON, a JSON-RPC batch array, invalid UTF-8 and a line
    // over the limit: each gets an error answer (or is dropped), never a crash.
    let nested = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":900,\"method\":\"tools/call\",\"params\":{{\"name\":\"read\",\"arguments\":{{\"path\":{}1{}}}}}}}",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    executor.send_line(nested.as_bytes());
    let answer = executor.response();
    assert_eq!(answer["id"], json!(900), "{answer}");
    assert!(answer.get("error").is_some(), "{answer}");
    executor.send_line(br#"{"jsonrpc":"2.0","id":899,"method":"tools/call","params":{"name":5}}"#);
    let answer = executor.response();
    assert_eq!(answer["id"], json!(899), "{answer}");
    assert_eq!(answer["error"]["code"], json!(-32602), "{answer}");
    executor.send_line(br#"[{"jsonrpc":"2.0","id":901,"method":"tools/list"}]"#);
    let answer = executor.response();
    assert_eq!(answer["error"]["code"], json!(-32600), "{answer}");
    executor.send_line(b"{\"jsonrpc\":\"2.0\",\"id\":902,\"method\":\"tools/call\",\"params\":{\"name\":\"read\",\"arguments\":{\"path\":\"\xff\"}}}");
    let answer = executor.response();
    assert!(answer.get("error").is_some(), "{answer}");
    let huge = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":903,\"method\":\"tools/call\",\"params\":{{\"name\":\"write\",\"arguments\":{{\"path\":\"huge\",\"content\":\"{}\"}}}}}}",
        "x".repeat(20 * 1024 * 1024)
    );
    executor.send_line(huge.as_bytes());
    let answer = executor.response();
    assert!(answer.get("error").is_some(), "{answer}");
    assert!(!dir.path().join("huge").exists());

    assert_eq!(
        executor
            .call("read", json!({"path": "notes.txt", "limit": 1}))
            .unwrap(),
        "     1\tone\n... (2 more lines; use offset=2)\n"
    );
    assert!(executor.finish().success());
}

/// Issue 8, item 6: standalone, confined by landlock, with an ordinary HOME
/// whose `.gitconfig` the sandbox denies, every git failed ("unknown error
/// occurred while reading the configuration files").
#[test]
fn git_works_under_the_executors_confinement_with_an_ordinary_home() {
    if box_confine::landlock_abi() == 0 {
        eprintln!("LANDLOCK MISSING: the executor's confinement cannot be tested here");
        assert!(!support::under_ci(), "landlock is missing under CI");
        return;
    }
    let dir = workspace();
    let git = |args: &[&str]| {
        let status = Command::new("git")
            .args(args)
            .current_dir(dir.path())
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "git {args:?}");
    };
    git(&["init", "-q"]);
    git(&["add", "-A"]);
    // Outside the workspace and the temp directory, so landlock denies it
    // (as it denies /root to a standalone `box execute` run as root).
    let home = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    std::fs::write(home.path().join(".gitconfig"), "[user]\n\tname = denied\n").unwrap();
    // The executor's temp directory is writable (and readable) under its
    // confinement; a checkout under /tmp would put HOME beneath it, so the
    // executor gets a temp directory of its own beside HOME.
    let temp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut executor = Executor::start_with(
        Command::new(support::box_bin())
            .arg("execute")
            .arg("--root")
            .arg(dir.path())
            .args(["--landlock", "best-effort"])
            .env("HOME", home.path())
            .env("TMPDIR", temp.path()),
    );
    executor
        .request(
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "it", "version": "1"}}),
        )
        .unwrap();
    executor.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    let confined = executor
        .call(
            "bash",
            json!({"command": "cat \"$HOME/.gitconfig\" >/dev/null 2>&1 || echo denied"}),
        )
        .unwrap();
    assert_eq!(confined, "denied\n[exit 0]", "the fixture is not live");
    let status = executor
        .call("bash", json!({"command": "git status --short"}))
        .unwrap();
    assert_eq!(status, "A  notes.txt\nA  src/main.rs\n[exit 0]");
    // A stamped run (facts, then the rewrite) runs git too.
    let facts = executor
        .request(
            "execution/facts",
            json!({"calls": [{"name": "bash", "arguments": {"command": "git status --short"}}]}),
        )
        .unwrap();
    let rewrite = facts["results"][0]["facts"]["rewrite"].clone();
    assert!(rewrite["dax_stamp"].is_string(), "{facts}");
    assert_eq!(
        executor.call("bash", rewrite).unwrap(),
        "A  notes.txt\nA  src/main.rs\n[exit 0]"
    );
    assert!(executor.finish().success());
}

/// Issue 8, item 7: two `bash` calls with one id in flight both ran and only
/// one was answered.
#[test]
fn a_duplicate_in_flight_id_is_refused_and_the_first_still_answered() {
    let dir = workspace();
    let (mut executor, _) = Executor::ready(dir.path(), &[], json!({}));
    let bash = |id: Value, command: &str| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
               "params": {"name": "bash", "arguments": {"command": command}}})
    };
    for id in [json!("dup"), json!(77)] {
        executor.send(&bash(id.clone(), "sleep 0.5; echo first"));
        executor.send(&bash(id.clone(), "touch second"));
        let refusal = executor.response();
        assert_eq!(
            refusal,
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32600, "message":
                format!("request id {id} is already in flight in this session; ids must not be reused")}})
        );
        let answer = executor.response();
        assert_eq!(answer["id"], id, "{answer}");
        assert_eq!(
            answer["result"]["content"][0]["text"],
            json!("first\n[exit 0]"),
            "{answer}"
        );
        assert!(!dir.path().join("second").exists());
        // Nothing else is owed for the id, and it may be used again once answered.
        executor.send(&bash(id.clone(), "echo again"));
        let again = executor.response();
        assert_eq!(again["id"], id, "{again}");
        assert_eq!(
            again["result"]["content"][0]["text"],
            json!("again\n[exit 0]")
        );
    }
    // Ids 1 and "1" are different ids.
    executor.send(&bash(json!(5), "sleep 0.3; echo number"));
    executor.send(&bash(json!("5"), "echo string"));
    let mut texts: Vec<String> = (0..2)
        .map(|_| executor.response()["result"]["content"][0]["text"].to_string())
        .collect();
    texts.sort();
    assert_eq!(texts, ["\"number\\n[exit 0]\"", "\"string\\n[exit 0]\""]);
    // A cancelled request is answered by nobody; its id is free again.
    executor.send(&bash(json!(9), "sleep 30"));
    executor.send(
        &json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                          "params": {"requestId": 9, "reason": "test"}}),
    );
    std::thread::sleep(Duration::from_millis(300));
    executor.send(&bash(json!(9), "echo reused"));
    let reused = executor.response();
    assert_eq!(
        reused["result"]["content"][0]["text"],
        json!("reused\n[exit 0]"),
        "{reused}"
    );
    assert!(executor.finish().success());
}

/// Issue 8, item 5: file names reached tool output raw (ESC/BEL sequences, a
/// newline making one entry two, error text echoing a path), and a name that
/// is not UTF-8 came out lossy and could not be named back.
#[test]
fn hostile_names_are_shown_escaped_and_named_back() {
    use std::os::unix::ffi::OsStrExt;
    let dir = workspace();
    let root = dir.path();
    std::fs::write(
        root.join(std::ffi::OsStr::from_bytes(b"bad-\xff.txt")),
        b"ok\n\xfe\xff line\n",
    )
    .unwrap();
    std::fs::write(root.join("\x1b]0;title\x07"), "osc line\n").unwrap();
    std::fs::write(root.join("two\nlines"), "nl line\n").unwrap();
    std::fs::write(root.join("back\\slash"), "bs line\n").unwrap();
    std::fs::create_dir(root.join("\x1b[31mred")).unwrap();
    std::fs::write(root.join("\x1b[31mred/f.txt"), "red line\n").unwrap();
    let (mut executor, _) = Executor::ready(root, &[], json!({}));
    let one_line_each = |text: &str| {
        assert!(
            !text
                .chars()
                .any(|c| c.is_control() && c != '\n' && c != '\t'),
            "{text:?}"
        );
    };

    let listing = executor.call("ls", json!({})).unwrap();
    one_line_each(&listing);
    assert_eq!(
        listing,
        concat!(
            "\"\\x1b[31mred\"/\n",
            "\"\\x1b]0;title\\x07\"  9\n",
            "\"back\\\\slash\"  8\n",
            "\"bad-\\xff.txt\"  11\n",
            "notes.txt  14\n",
            "src/\n",
            "\"two\\nlines\"  8\n",
        )
    );
    let globbed = executor.call("glob", json!({"pattern": "**/*"})).unwrap();
    one_line_each(&globbed);
    assert_eq!(
        globbed,
        concat!(
            "\"\\x1b[31mred\"/f.txt\n",
            "\"\\x1b]0;title\\x07\"\n",
            "\"back\\\\slash\"\n",
            "\"bad-\\xff.txt\"\n",
            "notes.txt\n",
            "src/main.rs\n",
            "\"two\\nlines\"\n",
        )
    );
    let matches = executor.call("grep", json!({"pattern": " line"})).unwrap();
    one_line_each(&matches);
    assert_eq!(
        matches,
        concat!(
            "\"\\x1b[31mred\"/f.txt:1:red line\n",
            "\"\\x1b]0;title\\x07\":1:osc line\n",
            "\"back\\\\slash\":1:bs line\n",
            "\"bad-\\xff.txt\":2:\u{fffd}\u{fffd} line\n",
            "\"two\\nlines\":1:nl line\n",
        )
    );

    // Every printed name is taken back by every path-taking tool.
    assert_eq!(
        executor.call("read", json!({"path": "\"bad-\\xff.txt\""})),
        Ok("     1\tok\n     2\t\u{fffd}\u{fffd} line\n".to_owned())
    );
    assert_eq!(
        executor.call("read", json!({"path": "\"two\\nlines\""})),
        Ok("     1\tnl line\n".to_owned())
    );
    assert_eq!(
        executor.call(
            "edit",
            json!({"path": "\"two\\nlines\"", "old_string": "nl", "new_string": "new"})
        ),
        Ok("edited \"two\\nlines\"".to_owned())
    );
    assert_eq!(
        std::fs::read_to_string(root.join("two\nlines")).unwrap(),
        "new line\n"
    );
    assert_eq!(
        executor.call("read", json!({"path": "\"\\x1b[31mred\"/f.txt"})),
        Ok("     1\tred line\n".to_owned())
    );
    assert_eq!(
        executor.call("ls", json!({"path": "\"\\x1b[31mred\""})),
        Ok("f.txt  9\n".to_owned())
    );
    assert_eq!(
        executor.call(
            "grep",
            json!({"pattern": "line", "path": "\"two\\nlines\""})
        ),
        Ok("\"two\\nlines\":1:new line\n".to_owned())
    );
    assert_eq!(
        executor.call("write", json!({"path": "\"new\\tname\"", "content": "abc"})),
        Ok("wrote 3 bytes to \"new\\tname\"".to_owned())
    );
    assert_eq!(
        std::fs::read_to_string(root.join("new\tname")).unwrap(),
        "abc"
    );
    // A path as `git status` quotes it (octal) is taken too.
    assert_eq!(
        executor.call("read", json!({"path": "\"bad-\\377.txt\""})),
        Ok("     1\tok\n     2\t\u{fffd}\u{fffd} line\n".to_owned())
    );

    // Paths echoed in errors are escaped too.
    assert_eq!(
        executor.call("read", json!({"path": "gone\u{1b}[2J"})),
        Err("\"gone\\x1b[2J\": no such file or directory".to_owned())
    );
    assert_eq!(
        executor.call("read", json!({"path": "../\u{1b}]0;x\u{7}"})),
        Err("path is outside the workspace: ../\"\\x1b]0;x\\x07\"".to_owned())
    );
    assert_eq!(
        executor.call("ls", json!({"path": "\"two\\nlines\""})),
        Err("\"two\\nlines\" is not a directory".to_owned())
    );
    let error = executor
        .call("read", json!({"path": "\"open"}))
        .unwrap_err();
    assert!(error.contains("quoted name"), "{error}");

    // Facts: the name decoded (lossy only where it is not UTF-8, so path
    // rules still match it), the question escaped; the stamp holds.
    let facts = executor
        .request(
            "execution/facts",
            json!({"calls": [{"name": "read", "arguments": {"path": "\"bad-\\xff.txt\""}},
                             {"name": "read", "arguments": {"path": "\"\\x2eenv\""}}]}),
        )
        .unwrap();
    let first = &facts["results"][0]["facts"];
    assert_eq!(
        first["calls"],
        json!([{"tool": "", "args": {"path": "bad-\u{fffd}.txt"}, "text": "\"bad-\\xff.txt\""}])
    );
    assert_eq!(
        facts["results"][1]["facts"]["calls"][0]["args"],
        json!({"path": ".env"})
    );
    assert!(executor.call("read", first["rewrite"].clone()).is_ok());

    // The files resource: listed names escaped, and taken back.
    let read = |executor: &mut Executor, uri: &str| -> Value {
        let answer = executor
            .request("resources/read", json!({"uri": uri}))
            .unwrap();
        serde_json::from_str(answer["contents"][0]["text"].as_str().unwrap()).unwrap()
    };
    let listed = read(&mut executor, "agentworkspace:///readdir?path=.");
    let names: Vec<&str> = listed["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| entry["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"\"bad-\\xff.txt\""), "{names:?}");
    assert!(names.contains(&"notes.txt"), "{names:?}");
    let data = read(
        &mut executor,
        "agentworkspace:///read?path=%22bad-%5Cxff.txt%22",
    );
    assert!(data["data"].is_string(), "{data}");
    let missing = read(&mut executor, "agentworkspace:///stat?path=gone%1B%5B2J");
    let message = missing["error"]["message"].as_str().unwrap();
    assert!(
        !message.contains('\u{1b}') && message.contains("\"gone\\x1b[2J\""),
        "{message}"
    );
}

/// Issue 8, item 5: bash output reached the client with live terminal control
/// sequences; by default they are made visible, `--bash-output raw` keeps them.
#[test]
fn bash_output_shows_terminal_controls_unless_raw() {
    let dir = workspace();
    let command = json!({"command": "printf '\\033[31mred\\033[0m \\033]0;t\\007 a\\\\b\\r\\n'"});
    let (mut executor, _) = Executor::ready(dir.path(), &[], json!({}));
    assert_eq!(
        executor.call("bash", command.clone()),
        Ok("\\x1b[31mred\\x1b[0m \\x1b]0;t\\x07 a\\b\r\n[exit 0]".to_owned())
    );
    let (mut raw, _) = Executor::ready(dir.path(), &["--bash-output", "raw"], json!({}));
    assert_eq!(
        raw.call("bash", command),
        Ok("\u{1b}[31mred\u{1b}[0m \u{1b}]0;t\u{7} a\\b\r\n[exit 0]".to_owned())
    );
}

#[test]
fn sigterm_ends_the_executor_with_status_zero() {
    let dir = workspace();
    let (executor, _) = Executor::ready(dir.path(), &[], json!({}));
    let pid = nix::unistd::Pid::from_raw(i32::try_from(executor.child.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let mut executor = executor;
    let status = wait_with_deadline(&mut executor.child, Duration::from_secs(10));
    assert_eq!(status.code(), Some(0));
}

#[test]
fn a_missing_root_is_a_clear_error() {
    let output = Command::new(support::box_bin())
        .args([
            "execute",
            "--root",
            "/nonexistent/box-root",
            "--landlock",
            "off",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--root /nonexistent/box-root"), "{stderr}");
}

#[test]
fn the_python_mcp_client_drives_the_executor() {
    let Some(python) = support::python_with_mcp() else {
        return;
    };
    let dir = workspace();
    let script = support::repo_root().join("tests/e2e/executor_client.py");
    let output = Command::new(&python)
        .arg(script)
        .arg(support::box_bin())
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
