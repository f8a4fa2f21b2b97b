//! `box serve` over stdio, driven by the JSON-RPC lines a test writes: one
//! driver for every area (end to end, forks, reattach).

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};

use super::box_bin;

/// How long a request waits for its answer by default: a unit's start on
/// Docker under a loaded machine can take a while.
const ANSWER_WITHIN: Duration = Duration::from_secs(120);

/// How long a host is given to exit after its client hangs up (it removes
/// its units first).
const EXIT_WITHIN: Duration = Duration::from_secs(90);

/// `box serve --backend BACKEND --instance INSTANCE --workspace WORKSPACE`,
/// logging warnings only; add flags and variables, then [`Served::start`].
pub fn serve_command(backend: &str, instance: &str, workspace: &Path) -> Command {
    let mut command = Command::new(box_bin());
    command
        .args(["serve", "--backend", backend, "--instance", instance])
        .arg("--workspace")
        .arg(workspace)
        .env("RUST_LOG", "warn");
    command
}

/// A `box serve` over stdio: its stdout's JSON lines are read on a thread,
/// so a test waits for one answer at a time with a deadline.
pub struct Served {
    /// The host's process.
    pub child: Child,
    lines: mpsc::Receiver<Value>,
    /// The id [`call`](Self::call) uses next (0 is initialize's).
    next: i64,
    /// The answer to initialize.
    pub initialized: Value,
}

impl Served {
    /// `command` (a `box serve` over stdio) started and initialized with no
    /// capabilities; a refused initialize fails the test.
    pub fn start(command: Command) -> Self {
        let mut served = Self::spawn(command);
        let answer = served.initialize(json!({}));
        assert!(answer.get("result").is_some(), "initialize: {answer}");
        served
    }

    /// `command` started with piped stdio, not yet initialized.
    pub fn spawn(mut command: Command) -> Self {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Ok(value) = serde_json::from_str(&line)
                    && send.send(value).is_err()
                {
                    break;
                }
            }
        });
        Self {
            child,
            lines,
            next: 1,
            initialized: Value::Null,
        }
    }

    /// `initialize` (id 0) asking `capabilities`, then
    /// `notifications/initialized`; its answer, also kept in `initialized`.
    pub fn initialize(&mut self, capabilities: Value) -> Value {
        let answer = self.request(
            0,
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": capabilities,
                "clientInfo": {"name": "box-tests", "version": "1"}}),
        );
        self.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        self.initialized = answer.clone();
        answer
    }

    /// Write one message.
    pub fn send(&mut self, message: &Value) {
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{message}").unwrap();
        stdin.flush().unwrap();
    }

    /// The answer to request `id`, skipping other messages; a panic when
    /// none comes `within`.
    pub fn answer(&self, id: i64, within: Duration) -> Value {
        self.wait_for(within, |message| message["id"] == json!(id))
            .unwrap_or_else(|| panic!("no answer to request {id} within {within:?}"))
    }

    /// The first message for which `wanted` holds, skipping others; `None`
    /// when none comes `within`.
    pub fn wait_for(&self, within: Duration, wanted: impl Fn(&Value) -> bool) -> Option<Value> {
        let deadline = std::time::Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let message = self.lines.recv_timeout(left).ok()?;
            if wanted(&message) {
                return Some(message);
            }
        }
    }

    /// Request `id`; its whole answer.
    pub fn request(&mut self, id: i64, method: &str, params: Value) -> Value {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        self.wait_for(ANSWER_WITHIN, |message| message["id"] == json!(id))
            .unwrap_or_else(|| panic!("no answer to {method} within {ANSWER_WITHIN:?}"))
    }

    /// One request under the next id; its whole answer.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        self.request(id, method, params)
    }

    /// Send requests without waiting; then every answer, in the order asked.
    pub fn call_all(&mut self, calls: &[(&str, Value)]) -> Vec<Value> {
        let first = self.next;
        let stdin = self.child.stdin.as_mut().unwrap();
        for (method, params) in calls {
            let id = self.next;
            self.next += 1;
            writeln!(
                stdin,
                "{}",
                json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
            )
            .unwrap();
        }
        stdin.flush().unwrap();
        let mut answers: Vec<Option<Value>> = vec![None; calls.len()];
        let deadline = std::time::Instant::now() + ANSWER_WITHIN;
        while answers.iter().any(Option::is_none) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let message = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no answers to {calls:?} within {ANSWER_WITHIN:?}"));
            if let Some(index) = message["id"]
                .as_i64()
                .and_then(|id| usize::try_from(id - first).ok())
                .filter(|index| *index < calls.len())
            {
                answers[index] = Some(message);
            }
        }
        answers.into_iter().flatten().collect()
    }

    /// A result, or a panic naming the error.
    pub fn ok(&mut self, method: &str, params: Value) -> Value {
        let answer = self.call(method, params.clone());
        answer
            .get("result")
            .cloned()
            .unwrap_or_else(|| panic!("{method} {params}: {answer}"))
    }

    /// The bash tool in `unit` (`None`: the workspace unit); its output.
    pub fn bash(&mut self, unit: Option<&str>, command: &str) -> String {
        let mut params = json!({"name": "bash", "arguments": {"command": command}});
        if let Some(unit) = unit {
            params["_meta"] = json!({"box/unit": unit});
        }
        let result = self.ok("tools/call", params);
        result["content"][0]["text"]
            .as_str()
            .unwrap_or_else(|| panic!("bash {command}: {result}"))
            .to_owned()
    }

    /// Hang up (stdin EOF) and wait for the host to exit.
    pub fn hang_up(mut self) -> std::process::ExitStatus {
        drop(self.child.stdin.take());
        let deadline = std::time::Instant::now() + EXIT_WITHIN;
        while std::time::Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        panic!("box serve did not exit within {EXIT_WITHIN:?} of its client hanging up");
    }
}
