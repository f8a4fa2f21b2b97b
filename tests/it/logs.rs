//! What box writes in its log, for people and for log collectors: the
//! executor's events as fields of the host's (never one JSON string, never
//! Rust `Debug` text), the URL a `--listen` host serves, and the help that
//! says how to ask for more or less (issue 22, item 15).

use std::io::{BufRead as _, Read as _};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{Served, box_bin, docker_answers, serve_command};

/// Rust `Debug` text that must never reach a log line or an error.
const DEBUG_TEXT: [&str; 5] = ["Some(", "None", "Code(", "ErrorData", "executor_fields"];

/// Each JSON object of a `--log-format json` stderr; a line that is not
/// one fails the test (box's log is all JSON then).
fn json_lines(stderr: &str) -> Vec<Value> {
    stderr
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|_| panic!("not a JSON log line: {line}"))
        })
        .collect()
}

fn assert_no_debug_text(stderr: &str) {
    for debug in DEBUG_TEXT {
        assert!(!stderr.contains(debug), "{debug} in the log:\n{stderr}");
    }
}

/// The one event whose message is `message`.
fn event<'a>(events: &'a [Value], message: &str, stderr: &str) -> &'a Value {
    events
        .iter()
        .find(|event| event["fields"]["message"] == message)
        .unwrap_or_else(|| panic!("no {message:?} in the log:\n{stderr}"))
}

fn box_run_logs_executor_events_as_fields(backend: &str) {
    let workspace = tempfile::tempdir().unwrap();
    let out = Command::new(box_bin())
        .current_dir(workspace.path())
        .args(["run", "-v", "--log-format", "json", "--backend", backend])
        .args(["--", "sh", "-c", "exit 2"])
        .env_remove("BOX_LOG")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let events = json_lines(&stderr);
    assert_no_debug_text(&stderr);
    // The executor's own fields, each in its JSON type, beside the host's.
    let seccomp = event(
        &events,
        "box seccomp filter installed; executor not dumpable",
        &stderr,
    );
    assert_eq!(seccomp["target"], "box_executor", "{seccomp}");
    assert_eq!(seccomp["fields"]["unit"], "workspace", "{seccomp}");
    assert!(seccomp["fields"]["session"].is_string(), "{seccomp}");
    assert!(seccomp["fields"]["rules"].is_u64(), "{seccomp}");
    assert!(seccomp["fields"]["filters"].is_u64(), "{seccomp}");
    let confined = event(&events, "executor confined", &stderr);
    assert_eq!(
        confined["fields"]["landlock_enforced"],
        json!(true),
        "{confined}"
    );
    if backend == "docker" {
        // box's init in the unit: its exit status as a number.
        let ended = event(&events, "the executor ended", &stderr);
        assert_eq!(ended["fields"]["exit_code"], json!(0), "{ended}");
        assert_eq!(
            ended["fields"]["executor_target"], "box_init::init::unit",
            "{ended}"
        );
    }
}

#[test]
fn local_executor_events_are_fields_of_the_hosts_json_log() {
    box_run_logs_executor_events_as_fields("local");
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_executor_events_are_fields_of_the_hosts_json_log() {
    if !docker_answers().await {
        return;
    }
    box_run_logs_executor_events_as_fields("docker");
}

/// A call the executor answers with an error is logged with its code and
/// message, not rmcp's `ErrorData { .. }`; BOX_LOG wins over RUST_LOG.
#[test]
fn an_error_answer_is_logged_in_words() {
    let workspace = tempfile::tempdir().unwrap();
    let instance = format!("logs-error-{}", std::process::id());
    let mut command = serve_command("local", &instance, workspace.path());
    command
        .args(["--log-format", "json"])
        .env("BOX_LOG", "info")
        .env("RUST_LOG", "error")
        .stderr(Stdio::piped());
    let mut served = Served::start(command);
    let mut stderr_pipe = served.child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr_pipe.read_to_string(&mut text);
        text
    });
    let answer = served.request(
        7,
        "tools/call",
        json!({"name": "nonesuch", "arguments": {}}),
    );
    assert_eq!(answer["error"]["code"], -32602, "{answer}");
    served.hang_up();
    let stderr = reader.join().unwrap();
    let events = json_lines(&stderr);
    assert_no_debug_text(&stderr);
    let answered = event(&events, "answered a request with an error", &stderr);
    assert_eq!(answered["level"], "INFO", "{answered}");
    assert_eq!(answered["fields"]["code"], -32602, "{answered}");
    assert_eq!(
        answered["fields"]["error"], answer["error"]["message"],
        "{answered}"
    );
}

/// The listen line says the URL a client is given.
#[test]
fn a_listening_host_logs_its_url() {
    let mut child = Command::new(box_bin())
        .args(["serve", "--backend", "local", "--listen", "127.0.0.1:0"])
        .args(["--instance", &format!("logs-listen-{}", std::process::id())])
        .env_remove("BOX_LOG")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let (line_tx, line_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stderr.lines() {
            let Ok(line) = line else { break };
            if line.contains("/mcp") {
                let _ = line_tx.send(line);
            }
        }
    });
    let line = line_rx.recv_timeout(Duration::from_secs(20));
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = child.wait();
    let line = line.expect("no line naming /mcp within 20 s");
    let url = line
        .split_whitespace()
        .find(|word| word.starts_with("http://"))
        .unwrap_or_else(|| panic!("no URL in {line}"));
    let port = url
        .strip_prefix("http://127.0.0.1:")
        .and_then(|rest| rest.strip_suffix("/mcp"))
        .unwrap_or_else(|| panic!("{url} is not http://127.0.0.1:PORT/mcp"));
    assert!(port.parse::<u16>().is_ok_and(|port| port > 0), "{line}");
}

/// `box --help` and `box serve --help` say how logging is asked for.
#[test]
fn help_explains_verbosity_and_the_log_variables() {
    for args in [&["--help"][..], &["serve", "--help"], &["run", "--help"]] {
        let out = Command::new(box_bin()).args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}");
        let help = String::from_utf8_lossy(&out.stdout);
        let wanted: &[&str] = if args[0] == "run" {
            &["--verbose", "--quiet"]
        } else {
            &["-v (debug)", "-q (warnings", "BOX_LOG", "RUST_LOG"]
        };
        for word in wanted {
            assert!(help.contains(word), "box {args:?}: no {word}:\n{help}");
        }
    }
}
