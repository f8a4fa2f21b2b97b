//! A session's redaction: every secret value the host knows is replaced by
//! `[REDACTED:NAME]` in everything a unit sends toward the client (answers,
//! errors, progress and other notifications, a unit's requests) and in the
//! host's own log lines about a unit, raw or encoded (`box-redact` owns the
//! forms).
//!
//! The values: the secrets the plan hands to the session's units (from the
//! host's environment, as the backends read them), every variable of the
//! host's environment the scrubber calls a credential (`box_scrub::credentials`),
//! and the credentials a scan found persisted in the workspace. Values shorter
//! than `box_redact::MIN_SECRET_LEN` bytes are not redacted; each is logged
//! by name when the session starts.
//!
//! `agentworkspace/process.read` carries a process's output as base64 in
//! `data`, a chunk per read: it is decoded, passed through one streaming
//! redactor per process and stream, so a secret split across two reads is
//! still caught, and encoded again. The streaming redactor holds back the
//! few bytes that could begin a secret until the next read (or the end of the
//! stream) decides them.
//!
//! A files-resource answer carries the file's bytes as base64 too: they are
//! decoded and searched (a file holding a value in base64, wrapped or not,
//! is base64 of base64 in the answer, which no form of the value matches),
//! and encoded again only when something was redacted.

use std::borrow::Cow;
use std::collections::HashMap;
use std::ffi::OsString;
use std::path::Path;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use box_backend::PersistedCredential;
use box_redact::persisted::FindingKind;
use box_redact::{Redactor, StreamRedactor, TextStreamRedactor};
use serde_json::Value;

use box_policy::plan::Plan;

/// A process's output stream as the host routes its reads: the unit, the
/// process id the unit knows, the fd (1 or 2).
pub(crate) type StreamKey = (usize, String, u8);

/// One session's redactor and its open streams.
pub(crate) struct SessionRedactor {
    /// `None` when no value is long enough to redact.
    redactor: Option<Arc<Redactor>>,
    streams: HashMap<StreamKey, StreamRedactor>,
    /// Progress messages (bash's output since the last report) per unit and
    /// progress token: consecutive reports are consecutive output.
    progress: HashMap<(usize, String), TextStreamRedactor>,
    /// Lends the memory a files-resource answer is decoded and redacted in.
    scratch: Arc<ScratchPool>,
}

/// The decoded and the redacted bytes of a files-resource answer, kept
/// between answers: a MiB allocated afresh for each is a MiB of page faults
/// each time (most of what redacting one cost through the host).
#[derive(Default)]
struct Scratch {
    decoded: Vec<u8>,
    redacted: Vec<u8>,
}

impl Scratch {
    /// The most one scratch keeps between answers.
    const KEPT: usize = 4 << 20;

    fn bytes(&self) -> usize {
        self.decoded.capacity() + self.redacted.capacity()
    }
}

/// The host's scratch for redacting files-resource answers, lent to one
/// answer at a time and kept between answers (`Services::redact_scratch`).
/// Kept by the host, not by each session, so what stays allocated is bounded
/// by `ScratchPool::KEPT` scratches of at most `Scratch::KEPT` bytes each,
/// however many sessions once read a large file.
#[derive(Default)]
pub struct ScratchPool(std::sync::Mutex<Vec<Scratch>>);

impl ScratchPool {
    /// How many scratches the host keeps: as many answers redacted at once
    /// as the host has cores to redact them on, on a small host.
    const KEPT: usize = 2;

    fn take(&self) -> Scratch {
        self.0
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .pop()
            .unwrap_or_default()
    }

    fn give(&self, scratch: Scratch) {
        if scratch.bytes() > Scratch::KEPT {
            return;
        }
        let mut kept = self.0.lock().unwrap_or_else(|poison| poison.into_inner());
        if kept.len() < Self::KEPT {
            kept.push(scratch);
        }
    }

    /// The bytes kept now.
    #[cfg(test)]
    fn kept(&self) -> usize {
        self.0
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .iter()
            .map(Scratch::bytes)
            .sum()
    }
}

/// Where a secret value came from, for the redactor's name.
pub(crate) struct Secret {
    /// What `[REDACTED:NAME]` says.
    pub name: String,
    /// The value.
    pub value: Vec<u8>,
    /// Handed to a unit or found in the workspace (a short one is warned
    /// about), rather than a credential of the host's environment (a short
    /// one, often `XDG_SESSION_TYPE=tty`, is only noted).
    pub handed: bool,
}

/// The secrets of a session: what `plan` hands its units from `host_env`,
/// and the credentials in `host_env` the scrubber would remove. In that
/// order, so a value both handed and scrubbed is named after the secret.
pub(crate) fn session_secrets(plan: &Plan, host_env: &[(OsString, OsString)]) -> Vec<Secret> {
    let mut secrets = Vec::new();
    for unit in &plan.units {
        // A pull secret goes to the engine only, yet a unit's output could
        // still carry it (a tool that reads it elsewhere): redacted the same.
        for name in unit.env_secrets.iter().chain(&unit.pull_secret) {
            if secrets.iter().any(|secret: &Secret| &secret.name == name) {
                continue;
            }
            if let Some((_, value)) = host_env
                .iter()
                .find(|(have, _)| have.as_os_str() == name.as_str())
            {
                secrets.push(Secret {
                    name: name.clone(),
                    value: value.as_encoded_bytes().to_vec(),
                    handed: true,
                });
            }
        }
    }
    for (name, value) in box_scrub::credentials(host_env.iter().cloned()) {
        secrets.push(Secret {
            name,
            value: value.into_encoded_bytes(),
            handed: false,
        });
    }
    secrets
}

/// Credentials persisted in the workspace at session start, as the
/// envelope reports them, and their values for the redactor.
#[derive(Default)]
pub(crate) struct Persisted {
    /// For the workspace unit's envelope.
    pub reported: Vec<PersistedCredential>,
    /// For the redactor, named `file:line`.
    pub secrets: Vec<Secret>,
    /// Each file holding a finding (relative to the workspace) with the values
    /// as found in it, for `on_persisted_credentials = "hide"`.
    pub files: Vec<(std::path::PathBuf, Vec<Vec<u8>>)>,
}

/// Scan the host directory `workspace` (a workspace unit's source) for
/// credentials left in it. Files only; never runs git. What the scan could
/// not read is logged, not fatal.
pub(crate) fn scan_persisted(session: &str, workspace: &Path) -> Persisted {
    let scan = match box_redact::persisted::scan_workspace(workspace) {
        Ok(scan) => scan,
        Err(error) => {
            tracing::warn!(session, %error, "persisted credentials not scanned");
            return Persisted::default();
        }
    };
    for unread in &scan.unread {
        tracing::info!(session, "persisted credentials scan: {unread}");
    }
    let mut persisted = Persisted::default();
    for finding in scan.findings {
        let file = finding.file.display().to_string();
        let name = format!("{file}:{}", finding.line);
        match persisted
            .files
            .iter_mut()
            .find(|(path, _)| *path == finding.file)
        {
            Some((_, values)) => values.extend(finding.secrets.iter().cloned()),
            None => persisted
                .files
                .push((finding.file.clone(), finding.secrets.clone())),
        }
        persisted.reported.push(PersistedCredential {
            file,
            line: finding.line,
            key: finding.key,
            kind: match finding.kind {
                FindingKind::ExtraHeader => "extraheader",
                FindingKind::UrlCredentials => "url-credentials",
                FindingKind::InlineHelper => "inline-helper",
                FindingKind::CredentialStore => "credential-store",
                FindingKind::Netrc => "netrc",
            }
            .to_owned(),
            hidden: false,
        });
        for value in finding.secrets {
            persisted.secrets.push(Secret {
                name: name.clone(),
                value,
                handed: true,
            });
        }
    }
    persisted
}

impl SessionRedactor {
    /// A redactor over `secrets`; the values it cannot redact (too short,
    /// too long) are logged by name.
    pub(crate) fn new(
        session: &str,
        secrets: Vec<Secret>,
        scratch: Arc<ScratchPool>,
    ) -> Result<Self, String> {
        let handed: Vec<String> = secrets
            .iter()
            .filter(|secret| secret.handed)
            .map(|secret| secret.name.clone())
            .collect();
        let redactor = Redactor::new(
            secrets
                .into_iter()
                .map(|secret| (secret.name, secret.value)),
        )
        .map_err(|error| error.to_string())?;
        for skipped in redactor.skipped() {
            if handed.contains(&skipped.name) {
                tracing::warn!(session, "{skipped}");
            } else {
                tracing::info!(session, "host credential: {skipped}");
            }
        }
        Ok(Self {
            redactor: (!redactor.is_empty()).then(|| Arc::new(redactor)),
            streams: HashMap::new(),
            progress: HashMap::new(),
            scratch,
        })
    }

    /// `text` redacted (a log line's field).
    pub(crate) fn text<'t>(&self, text: &'t str) -> std::borrow::Cow<'t, str> {
        match &self.redactor {
            Some(redactor) => redactor.redact(text),
            None => std::borrow::Cow::Borrowed(text),
        }
    }

    /// Every string of `message` redacted in place.
    pub(crate) fn message(&self, message: &mut Value) {
        if let Some(redactor) = &self.redactor {
            redactor.redact_json(message);
        }
    }

    /// A message a unit sends on its own (a notification, a request): a
    /// progress notification's `message` goes through its token's stream, so
    /// a value split across two reports is caught (what a report holds back
    /// comes with the next; the call's result holds the whole output anyway).
    pub(crate) fn unit_message(&mut self, unit: usize, message: &mut Value) {
        let Some(redactor) = self.redactor.clone() else {
            return;
        };
        if message.get("method").and_then(Value::as_str) == Some("notifications/progress")
            && let Some(params) = message.get_mut("params").and_then(Value::as_object_mut)
            && let Some(token) = params.get("progressToken").map(Value::to_string)
            && let Some(Value::String(text)) = params.get_mut("message")
        {
            let stream = self
                .progress
                .entry((unit, token))
                .or_insert_with(|| redactor.text_stream());
            *text = stream.push(text);
        }
        self.message(message);
    }

    /// No call is in flight: no progress report continues another.
    pub(crate) fn calls_done(&mut self) {
        self.progress.clear();
    }

    /// An answer to `resources/read`: the files resource answers with a JSON
    /// document whose `data` is the file's bytes in base64. Those bytes are
    /// decoded and searched: a search of the answer's text would see a file
    /// holding a value in base64 (`base64 secret > file`, wrapped or not)
    /// only as base64 of base64, which no form matches. When a value is
    /// found, the bytes are redacted and encoded again (so the client still
    /// decodes them) instead of the marker landing inside the base64. The
    /// rest of the answer is redacted like any other.
    pub(crate) fn resource_read(&mut self, response: &mut Value) {
        let Some(redactor) = self.redactor.clone() else {
            return;
        };
        let mut texts = Vec::new();
        if let Some(contents) = response
            .pointer_mut("/result/contents")
            .and_then(Value::as_array_mut)
        {
            for (index, content) in contents.iter_mut().enumerate() {
                let Some(object) = content.as_object_mut() else {
                    continue;
                };
                let Some(Value::String(text)) = object.remove("text") else {
                    continue;
                };
                let mut scratch = self.scratch.take();
                let redacted = redact_document(&redactor, &text, &mut scratch);
                self.scratch.give(scratch);
                let text = match redacted {
                    // The usual answer holds no secret: kept as it came.
                    Some(None) => text,
                    Some(Some(rebuilt)) => rebuilt,
                    None => redactor.redact(&text).into_owned(),
                };
                texts.push((index, text));
            }
        }
        self.message(response);
        if let Some(contents) = response
            .pointer_mut("/result/contents")
            .and_then(Value::as_array_mut)
        {
            for (index, text) in texts {
                if let Some(object) = contents.get_mut(index).and_then(Value::as_object_mut) {
                    object.insert("text".to_owned(), Value::String(text));
                }
            }
        }
    }

    /// An answer to `process.read` on `key`: its `data` through the stream's
    /// redactor (the end of the stream flushes what was held back), then the
    /// rest of the answer like any message.
    pub(crate) fn process_read(&mut self, key: StreamKey, response: &mut Value) {
        let Some(redactor) = self.redactor.clone() else {
            return;
        };
        let eof = response
            .pointer("/result/eof")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let Some(bytes) = take_base64(response, "data") else {
            // Not an answer with data in the form the wire gives it: redacted
            // as text, like everything else; the stream goes on.
            self.message(response);
            return;
        };
        let stream = self
            .streams
            .entry(key.clone())
            .or_insert_with(|| redactor.stream());
        let mut out = stream.push(&bytes);
        if eof {
            out.extend(stream.finish());
            self.streams.remove(&key);
        }
        self.message(response);
        put_base64(response, "data", &out);
    }

    /// An answer to `process.close` of `(unit, id)`: the unread stderr it
    /// carries (base64) is the end of that stream; both streams are done.
    pub(crate) fn process_close(&mut self, unit: usize, id: &str, response: &mut Value) {
        let Some(redactor) = self.redactor.clone() else {
            return;
        };
        self.streams.remove(&(unit, id.to_owned(), 1));
        let held = self.streams.remove(&(unit, id.to_owned(), 2));
        let stderr = take_base64(response, "stderr");
        self.message(response);
        if let Some(bytes) = stderr {
            let mut stream = held.unwrap_or_else(|| redactor.stream());
            let mut out = stream.push(&bytes);
            out.extend(stream.finish());
            put_base64(response, "stderr", &out);
        }
    }
}

/// A files-resource document as the executor writes it: its `data` (base64)
/// borrowed from the text, the rest as parsed.
#[derive(serde::Deserialize)]
struct Document<'t> {
    #[serde(borrow)]
    data: Cow<'t, str>,
    #[serde(flatten)]
    rest: serde_json::Map<String, Value>,
}

/// `text`, a JSON document with a base64 `data`, with the secrets in the
/// decoded bytes (and in its other members) redacted and the bytes encoded
/// again: `Some(None)` when there was nothing to redact, `None` when it is
/// not such a document. Every MiB-sized step reuses memory the session
/// already has, since fresh pages are most of what a MiB costs: the data is
/// decoded into and redacted into `scratch`, and encoded straight after the
/// rest of the document (base64 needs no JSON escaping), never serialized
/// again.
fn redact_document(
    redactor: &Redactor,
    text: &str,
    scratch: &mut Scratch,
) -> Option<Option<String>> {
    // What the executor writes, `{"data":"..."}`, needs no parse: the data
    // decodes as base64 only if it holds no quote or escape.
    if let Some(data) = text
        .strip_prefix("{\"data\":\"")
        .and_then(|rest| rest.strip_suffix("\"}"))
    {
        scratch.decoded.clear();
        if base64_simd::STANDARD
            .decode_append(data.as_bytes(), &mut scratch.decoded)
            .is_ok()
        {
            if !redactor.redact_bytes_into(&scratch.decoded, &mut scratch.redacted) {
                return Some(None);
            }
            let mut out = String::with_capacity(scratch.redacted.len() * 4 / 3 + 16);
            out.push_str("{\"data\":\"");
            base64_simd::STANDARD.encode_append(&scratch.redacted, &mut out);
            out.push_str("\"}");
            return Some(Some(out));
        }
    }
    let Document { data, rest } = serde_json::from_str::<Document<'_>>(text).ok()?;
    scratch.decoded.clear();
    base64_simd::STANDARD
        .decode_append(data.as_bytes(), &mut scratch.decoded)
        .ok()?;
    // Whatever else the document holds as any text; not the data again.
    let mut rest = Value::Object(rest);
    let in_rest = redactor.redact_json(&mut rest);
    let in_data = redactor.redact_bytes_into(&scratch.decoded, &mut scratch.redacted);
    if in_rest == 0 && !in_data {
        return Some(None);
    }
    let rest = rest.to_string();
    let head = rest.strip_suffix('}')?;
    let redacted: &[u8] = if in_data {
        &scratch.redacted
    } else {
        &scratch.decoded
    };
    let mut out = String::with_capacity(head.len() + redacted.len() * 4 / 3 + 16);
    out.push_str(head);
    if head != "{" {
        out.push(',');
    }
    out.push_str("\"data\":\"");
    base64_simd::STANDARD.encode_append(redacted, &mut out);
    out.push_str("\"}");
    Some(Some(out))
}

/// The bytes of the base64 string `result.field`, taken out of `response`
/// (`Some(empty)` when the result has no such field); `None`, leaving it in
/// place, when the answer has no result object or the field is not base64.
fn take_base64(response: &mut Value, field: &str) -> Option<Vec<u8>> {
    let result = response.get_mut("result")?.as_object_mut()?;
    let Some(Value::String(encoded)) = result.get(field) else {
        return result.get(field).is_none().then(Vec::new);
    };
    let bytes = BASE64.decode(encoded.as_bytes()).ok()?;
    result.remove(field);
    Some(bytes)
}

/// Put `bytes` back as `result.field` (base64), unless there are none.
fn put_base64(response: &mut Value, field: &str, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    if let Some(result) = response.get_mut("result").and_then(Value::as_object_mut) {
        result.insert(field.to_owned(), Value::String(BASE64.encode(bytes)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const TOKEN: &str = "tok-3f9a8b7c6d5e4f3a2b1c";

    fn redactor() -> SessionRedactor {
        SessionRedactor::new(
            "s",
            vec![Secret {
                name: "API_TOKEN".to_owned(),
                value: TOKEN.as_bytes().to_vec(),
                handed: true,
            }],
            Arc::default(),
        )
        .unwrap()
    }

    fn read_answer(data: &[u8], eof: bool) -> Value {
        let mut result = serde_json::Map::new();
        if !data.is_empty() {
            result.insert("data".to_owned(), json!(BASE64.encode(data)));
        }
        if eof {
            result.insert("eof".to_owned(), json!(true));
        }
        json!({"jsonrpc": "2.0", "id": 1, "result": result})
    }

    fn data_of(response: &Value) -> Vec<u8> {
        response["result"]["data"]
            .as_str()
            .map(|data| BASE64.decode(data).unwrap())
            .unwrap_or_default()
    }

    #[test]
    fn a_tool_result_is_redacted_raw_and_encoded() {
        let redactor = redactor();
        let encoded = BASE64.encode(TOKEN);
        let mut answer = json!({"jsonrpc": "2.0", "id": 1, "result": {"content": [
            {"type": "text", "text": format!("{TOKEN}\n{encoded}\n")}
        ]}});
        redactor.message(&mut answer);
        assert_eq!(
            answer["result"]["content"][0]["text"],
            "[REDACTED:API_TOKEN]\n[REDACTED:API_TOKEN]\n"
        );
    }

    #[test]
    fn a_secret_split_across_two_process_reads_is_redacted() {
        let mut redactor = redactor();
        let output = format!("before {TOKEN} after\n");
        let (first, second) = output.as_bytes().split_at(15);
        let mut one = read_answer(first, false);
        let mut two = read_answer(second, true);
        redactor.process_read((0, "p1".to_owned(), 1), &mut one);
        redactor.process_read((0, "p1".to_owned(), 1), &mut two);
        let mut seen = data_of(&one);
        seen.extend(data_of(&two));
        assert_eq!(
            String::from_utf8(seen).unwrap(),
            "before [REDACTED:API_TOKEN] after\n"
        );
        assert!(
            redactor.streams.is_empty(),
            "the end of the stream frees it"
        );
    }

    #[test]
    fn streams_of_different_processes_are_apart() {
        let mut redactor = redactor();
        let (head, tail) = TOKEN.as_bytes().split_at(10);
        let mut one = read_answer(head, false);
        let mut other = read_answer(tail, true);
        redactor.process_read((0, "p1".to_owned(), 1), &mut one);
        redactor.process_read((0, "p2".to_owned(), 1), &mut other);
        // Neither stream holds the secret: nothing to redact, nothing lost.
        assert_eq!(data_of(&other), tail);
        let mut end = read_answer(b"", true);
        redactor.process_read((0, "p1".to_owned(), 1), &mut end);
        let mut first = data_of(&one);
        first.extend(data_of(&end));
        assert_eq!(first, head);
    }

    #[test]
    fn a_secret_split_across_two_progress_reports_is_redacted() {
        let mut redactor = redactor();
        let (head, tail) = TOKEN.split_at(9);
        let report = |text: &str| {
            json!({"jsonrpc": "2.0", "method": "notifications/progress",
                "params": {"progressToken": 7, "progress": 1, "message": text}})
        };
        let mut one = report(&format!("out: {head}"));
        let mut two = report(&format!("{tail} more\n"));
        redactor.unit_message(0, &mut one);
        redactor.unit_message(0, &mut two);
        let seen = format!(
            "{}{}",
            one["params"]["message"].as_str().unwrap(),
            two["params"]["message"].as_str().unwrap()
        );
        assert_eq!(seen, "out: [REDACTED:API_TOKEN] more\n");
        redactor.calls_done();
        assert!(redactor.progress.is_empty());
    }

    #[test]
    fn a_file_resource_read_keeps_its_base64_decodable() {
        let mut redactor = redactor();
        let document = json!({"data": BASE64.encode(format!("key={TOKEN}\n"))}).to_string();
        let mut answer = json!({"jsonrpc": "2.0", "id": 1, "result": {"contents": [
            {"uri": "agentworkspace:///read?path=k", "mimeType": "application/json", "text": document}
        ]}});
        redactor.resource_read(&mut answer);
        let text = answer["result"]["contents"][0]["text"].as_str().unwrap();
        let document: Value = serde_json::from_str(text).unwrap();
        let bytes = BASE64.decode(document["data"].as_str().unwrap()).unwrap();
        assert_eq!(bytes, b"key=[REDACTED:API_TOKEN]\n");

        // With other members (one holding the value too): all redacted, the
        // document still one JSON object with every member.
        let document = json!({
            "path": format!("dir/{TOKEN}.txt"),
            "size": 7,
            "data": BASE64.encode(format!("{TOKEN}{TOKEN}")),
        })
        .to_string();
        let mut answer = json!({"jsonrpc": "2.0", "id": 1, "result": {"contents": [
            {"uri": "agentworkspace:///read?path=k", "mimeType": "application/json", "text": document}
        ]}});
        redactor.resource_read(&mut answer);
        let text = answer["result"]["contents"][0]["text"].as_str().unwrap();
        let document: Value = serde_json::from_str(text).unwrap();
        assert_eq!(document["path"], "dir/[REDACTED:API_TOKEN].txt");
        assert_eq!(document["size"], 7);
        let bytes = BASE64.decode(document["data"].as_str().unwrap()).unwrap();
        assert_eq!(bytes, b"[REDACTED:API_TOKEN][REDACTED:API_TOKEN]");
    }

    #[test]
    fn a_file_holding_the_value_in_base64_wrapped_or_not_is_redacted_in_a_resource_read() {
        // Issue 22, item 2: what `base64 secret > file` wrote (wrapped at 76,
        // after a prefix that puts the value across a line break at each
        // alignment), read back through the files resource: the bytes of
        // the answer are base64 of base64, so a search of the answer's text
        // alone cannot see the value.
        let runs: Vec<String> = (0..3u8)
            .map(|alignment| {
                let encoded = BASE64.encode(format!("{}{TOKEN}", "p".repeat(alignment.into())));
                let skip = (8 * usize::from(alignment)).div_ceil(6);
                encoded[skip..skip + 24].to_owned()
            })
            .collect();
        for prefix_len in [0, 1, 2, 40, 41, 42, 50, 51, 52] {
            for wrap in [None, Some(76), Some(64)] {
                let encoded = BASE64.encode(format!("{}{TOKEN}\n", "p".repeat(prefix_len)));
                let file = match wrap {
                    None => format!("{encoded}\n"),
                    Some(width) => encoded
                        .as_bytes()
                        .chunks(width)
                        .map(|line| format!("{}\n", std::str::from_utf8(line).unwrap()))
                        .collect(),
                };
                let mut redactor = redactor();
                let document = json!({"data": BASE64.encode(&file)}).to_string();
                let mut answer = json!({"jsonrpc": "2.0", "id": 1, "result": {"contents": [
                    {"uri": "agentworkspace:///read?path=k", "mimeType": "application/json", "text": document}
                ]}});
                redactor.resource_read(&mut answer);
                let text = answer["result"]["contents"][0]["text"].as_str().unwrap();
                let document: Value = serde_json::from_str(text).unwrap();
                let bytes = BASE64.decode(document["data"].as_str().unwrap()).unwrap();
                let shown = String::from_utf8(bytes).unwrap().replace('\n', "");
                for run in &runs {
                    assert!(
                        !shown.contains(run.as_str()),
                        "prefix {prefix_len}, wrap {wrap:?}: {shown}"
                    );
                }
                assert!(shown.contains("[REDACTED:API_TOKEN]"), "{shown}");
            }
        }
    }

    /// A files-resource answer of `size` bytes holding the secret.
    fn large_read(size: usize) -> Value {
        let mut data = vec![b'x'; size];
        data[size / 2..size / 2 + TOKEN.len()].copy_from_slice(TOKEN.as_bytes());
        let document = json!({"data": BASE64.encode(&data)}).to_string();
        json!({"jsonrpc": "2.0", "id": 1, "result": {"contents": [
            {"uri": "agentworkspace:///read?path=k", "mimeType": "application/json", "text": document}
        ]}})
    }

    #[test]
    fn large_answers_are_redacted_in_the_hosts_bounded_scratch() {
        let pool = Arc::new(ScratchPool::default());
        let secret = || {
            vec![Secret {
                name: "API_TOKEN".to_owned(),
                value: TOKEN.as_bytes().to_vec(),
                handed: true,
            }]
        };
        let mut sessions: Vec<SessionRedactor> = (0..5)
            .map(|n| SessionRedactor::new(&format!("s{n}"), secret(), pool.clone()).unwrap())
            .collect();
        // Five sessions, one after another, each reading a MiB holding the secret:
        // redacted every time, and one scratch serves them all.
        for session in &mut sessions {
            let mut answer = large_read(1 << 20);
            session.resource_read(&mut answer);
            let text = answer["result"]["contents"][0]["text"].as_str().unwrap();
            let document: Value = serde_json::from_str(text).unwrap();
            let bytes = BASE64.decode(document["data"].as_str().unwrap()).unwrap();
            assert!(
                bytes.windows(20).any(|w| w == b"[REDACTED:API_TOKEN]"),
                "not redacted"
            );
            assert!(!bytes.windows(TOKEN.len()).any(|w| w == TOKEN.as_bytes()));
        }
        assert_eq!(
            pool.0.lock().unwrap().len(),
            1,
            "one scratch serves them all"
        );
        let one = pool.kept();
        assert!((1 << 20..=Scratch::KEPT).contains(&one), "{one} bytes kept");
        // Never more than KEPT scratches, however many are lent at once.
        let lent: Vec<Scratch> = (0..4).map(|_| pool.take()).collect();
        for mut scratch in lent {
            scratch.decoded.reserve(1 << 20);
            pool.give(scratch);
        }
        assert_eq!(pool.0.lock().unwrap().len(), ScratchPool::KEPT);
        // An answer larger than a kept scratch is redacted, and its memory let go.
        let mut answer = large_read(3 << 20);
        let before = pool.kept();
        sessions[0].resource_read(&mut answer);
        assert!(pool.kept() <= before, "a scratch over the bound was kept");
    }

    #[test]
    fn unread_stderr_at_close_is_redacted() {
        let mut redactor = redactor();
        let mut answer = json!({"jsonrpc": "2.0", "id": 1, "result": {
            "status": 0,
            "stderr": BASE64.encode(format!("oops {TOKEN}"))
        }});
        redactor.process_close(0, "p1", &mut answer);
        let stderr = BASE64
            .decode(answer["result"]["stderr"].as_str().unwrap())
            .unwrap();
        assert_eq!(stderr, b"oops [REDACTED:API_TOKEN]");
    }

    #[test]
    fn session_secrets_take_handed_values_then_scrubbed_credentials() {
        use box_policy::plan::{UnitSpec, WorkspaceSource};
        let mut unit = UnitSpec::workspace("image", WorkspaceSource::Empty);
        unit.env_secrets = vec!["DEPLOY".to_owned()];
        let plan = Plan {
            profile: "p".to_owned(),
            units: vec![unit],
            on_persisted_credentials: Default::default(),
            workspace_fork: None,
        };
        let env: Vec<(OsString, OsString)> = [
            ("DEPLOY", "deploy-value-123456"),
            ("GITHUB_TOKEN", "ghp_abcdefghijklmnopqrstuvwxyz0123456789"),
            ("LANG", "C.UTF-8"),
        ]
        .iter()
        .map(|(name, value)| (OsString::from(name), OsString::from(value)))
        .collect();
        let names: Vec<String> = session_secrets(&plan, &env)
            .into_iter()
            .map(|secret| secret.name)
            .collect();
        assert_eq!(names, ["DEPLOY", "GITHUB_TOKEN"]);
    }

    #[test]
    fn a_units_pull_secret_is_redacted_though_the_unit_never_gets_it() {
        use box_policy::plan::{UnitSpec, WorkspaceSource};
        let mut unit = UnitSpec::workspace("image", WorkspaceSource::Empty);
        unit.pull_secret = Some("MIRROR".to_owned());
        let mut server = unit.clone();
        server.name = "tools".to_owned();
        let plan = Plan {
            profile: "p".to_owned(),
            units: vec![unit, server],
            on_persisted_credentials: Default::default(),
            workspace_fork: None,
        };
        let env = vec![(
            OsString::from("MIRROR"),
            OsString::from("ci:mirror-password-42"),
        )];
        let secrets = session_secrets(&plan, &env);
        let names: Vec<&str> = secrets.iter().map(|secret| secret.name.as_str()).collect();
        assert_eq!(names, ["MIRROR"], "named once though two units name it");
        assert_eq!(secrets[0].value, b"ci:mirror-password-42");
    }
}
