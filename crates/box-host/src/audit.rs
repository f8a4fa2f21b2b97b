//! The audit log (`--audit FILE`): one JSON line per tool call with the time,
//! session, unit, tool, a sha256 of the arguments, the duration and the
//! outcome. Never argument values or outputs.

use std::io::Write as _;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// One tool call, as recorded.
#[derive(Debug)]
pub struct Record<'a> {
    /// The session id.
    pub session: &'a str,
    /// The unit's name.
    pub unit: &'a str,
    /// What the unit was forked from (a `box/fork` child's parent unit, or
    /// the host directory of a `source = "fork"` workspace); `None` otherwise.
    pub parent: Option<&'a str>,
    /// The tool's name.
    pub tool: &'a str,
    /// The sha256 (hex) of the arguments' compact JSON.
    pub arguments_sha256: &'a str,
    /// How long the call took.
    pub duration: Duration,
    /// ok, error, tool_error, timeout, cancelled, unit_ended, ...
    pub outcome: &'a str,
}

/// An append-only audit file.
#[derive(Debug)]
pub struct Audit {
    file: Mutex<std::fs::File>,
}

impl Audit {
    /// Open `path` for appending (created 0600 when missing).
    pub fn open(path: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)?;
        Ok(Self {
            file: Mutex::new(file),
        })
    }

    /// Append one record; a failure is logged, never the call's.
    pub fn record(&self, record: &Record<'_>) {
        let mut line = json!({
            "time": now(),
            "session": record.session,
            "unit": record.unit,
            "tool": record.tool,
            "argumentsSha256": record.arguments_sha256,
            "durationMs": record.duration.as_millis() as u64,
            "outcome": record.outcome,
        });
        // Only a fork's lines carry it; the others are as they were.
        if let Some(parent) = record.parent {
            line["parent"] = json!(parent);
        }
        self.append(&line);
    }

    /// Append one egress attempt (`"kind": "egress"`): session, unit, method, host,
    /// port, server name, upstream address, the decision (allowed by which rule, or
    /// refused or failed and why), bytes each way, duration.
    pub fn egress(&self, event: &box_egress::Event) {
        let mut line = json!({"time": now(), "kind": "egress"});
        if let (Some(line), Ok(Value::Object(fields))) =
            (line.as_object_mut(), serde_json::to_value(event))
        {
            line.extend(fields);
        }
        self.append(&line);
    }

    fn append(&self, line: &Value) {
        let mut bytes = line.to_string().into_bytes();
        bytes.push(b'\n');
        let written = match self.file.lock() {
            Ok(mut file) => file.write_all(&bytes),
            Err(_) => Ok(()),
        };
        if let Err(error) = written {
            tracing::error!(%error, "writing the audit log failed");
        }
    }
}

fn now() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

/// The sha256 (hex) of a value's compact JSON.
pub fn digest(value: &Value) -> String {
    hex::encode(Sha256::digest(value.to_string().as_bytes()))
}
