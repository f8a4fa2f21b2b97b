//! The audit log (`--audit FILE`): one JSON line per tool call with the time,
//! session, profile, the client's name and version, unit, tool, a sha256 of
//! the arguments, the duration and the outcome (with a `bash` call's exit
//! status and the result's `isError`); one per refused session or request
//! (`"kind": "refusal"`); one per egress attempt (`"kind": "egress"`). Never
//! argument values or outputs.

use std::io::Write as _;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// A client as its `initialize` named itself (`clientInfo`), each part at
/// most [`ClientInfo::MAX`] characters: what a log or audit line says of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientInfo {
    /// `clientInfo.name`.
    pub name: String,
    /// `clientInfo.version`.
    pub version: String,
}

impl ClientInfo {
    /// The most characters of a name or version kept.
    pub const MAX: usize = 128;

    /// The `clientInfo` of an `initialize` request, if it has one.
    pub fn of_initialize(message: &Value) -> Option<Self> {
        let info = message.pointer("/params/clientInfo")?;
        let part = |key: &str| {
            info.get(key)
                .and_then(Value::as_str)
                .unwrap_or("")
                .chars()
                .take(Self::MAX)
                .collect::<String>()
        };
        Some(Self {
            name: part("name"),
            version: part("version"),
        })
    }

    fn to_json(&self) -> Value {
        json!({"name": self.name, "version": self.version})
    }
}

/// One tool call, as recorded.
#[derive(Debug)]
pub struct Record<'a> {
    /// The session id.
    pub session: &'a str,
    /// The session's profile.
    pub profile: &'a str,
    /// The client, as its `initialize` named itself.
    pub client: Option<&'a ClientInfo>,
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
    /// ok, error, tool_error, failed, timeout, cancelled, unit_ended, ...
    pub outcome: &'a str,
    /// A `bash` call's exit status, when it exited.
    pub exit_status: Option<i64>,
    /// The result's `isError`, when the call was answered with a result.
    pub is_error: Option<bool>,
}

/// A session or a request refused before it was served.
#[derive(Debug)]
pub struct Refusal<'a> {
    /// Why, from `metrics::REFUSALS`.
    pub reason: &'a str,
    /// What was wrong, for people.
    pub detail: &'a str,
    /// The session, when one was named.
    pub session: Option<&'a str>,
    /// The profile asked for, when the request got that far.
    pub profile: Option<&'a str>,
    /// The client, as its `initialize` named itself.
    pub client: Option<&'a ClientInfo>,
    /// The HTTP status and path, for a refusal of the HTTP transport.
    pub http: Option<(u16, &'a str)>,
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
            "profile": record.profile,
            "unit": record.unit,
            "tool": record.tool,
            "argumentsSha256": record.arguments_sha256,
            "durationMs": record.duration.as_millis() as u64,
            "outcome": record.outcome,
        });
        if let Some(client) = record.client {
            line["client"] = client.to_json();
        }
        if let Some(status) = record.exit_status {
            line["exitStatus"] = json!(status);
        }
        if let Some(is_error) = record.is_error {
            line["isError"] = json!(is_error);
        }
        // Only a fork's lines carry it; the others are as they were.
        if let Some(parent) = record.parent {
            line["parent"] = json!(parent);
        }
        self.append(&line);
    }

    /// Append one refusal (`"kind": "refusal"`).
    pub fn refusal(&self, refusal: &Refusal<'_>) {
        let mut line = json!({
            "time": now(),
            "kind": "refusal",
            "reason": refusal.reason,
            "detail": refusal.detail,
        });
        if let Some(session) = refusal.session {
            line["session"] = json!(session);
        }
        if let Some(profile) = refusal.profile {
            line["profile"] = json!(profile);
        }
        if let Some(client) = refusal.client {
            line["client"] = client.to_json();
        }
        if let Some((status, path)) = refusal.http {
            line["status"] = json!(status);
            line["path"] = json!(path);
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

    /// Append one limit event (`"kind": "limit"`): a unit of `session` near
    /// or at one of its limits, with the figure and the bound (`event`:
    /// `{unit, limit, state, figure, bound}`).
    pub fn limit(&self, session: &str, event: &Value) {
        let mut line = json!({"time": now(), "kind": "limit", "session": session});
        if let (Some(line), Some(fields)) = (line.as_object_mut(), event.as_object()) {
            line.extend(fields.clone());
        }
        self.append(&line);
    }

    /// A unit asked of a pool (`box serve --pool`): `claimed` (the unit's
    /// id given) or started cold, and why.
    pub fn pool_claim(&self, claim: &PoolClaim<'_>) {
        let mut line = json!({
            "time": now(),
            "kind": "pool",
            "session": claim.session,
            "profile": claim.profile,
            "unit": claim.unit,
            "warm": claim.claimed.is_some(),
        });
        if let Some(object) = line.as_object_mut() {
            match (claim.claimed, claim.why) {
                (Some(id), _) => {
                    object.insert("id".to_owned(), json!(id));
                }
                (None, Some(why)) => {
                    object.insert("why".to_owned(), json!(why));
                }
                (None, None) => {}
            }
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

/// One claim of a pooled unit, for [`Audit::pool_claim`].
pub struct PoolClaim<'a> {
    /// The session.
    pub session: &'a str,
    /// Its profile.
    pub profile: &'a str,
    /// The unit's name in the session.
    pub unit: &'a str,
    /// The claimed unit's backend id; `None`: it started cold.
    pub claimed: Option<&'a str>,
    /// Why it started cold.
    pub why: Option<&'a str>,
}

/// The sha256 (hex) of a value's compact JSON.
pub fn digest(value: &Value) -> String {
    hex::encode(Sha256::digest(value.to_string().as_bytes()))
}
