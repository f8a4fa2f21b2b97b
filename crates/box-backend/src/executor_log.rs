//! The executor's log lines, re-emitted into the host's log as events at
//! their own level: a unit's stderr is the executor's `tracing` output (one
//! JSON object a line, as both backends ask for with `BOX_LOG_FORMAT=json`
//! or `serve_json_logs`; or text, `TIMESTAMP LEVEL target: message fields`).
//! A JSON line's fields become fields of the host's event, each with its
//! JSON type (`rules=40`, `exit_code=2`), beside the host's own `unit` and
//! `session` (an executor field of the same name is `executor.NAME`); a line
//! that is neither (a panic, the local helper's refusal) is logged whole at
//! INFO. Both backends log their units' stderr through [`emit`].
//!
//! tracing's fields are named at compile time, so each distinct set of
//! names gets a callsite made at run time (its names leaked: a unit's lines
//! come from the few call sites of box's executor and init). A unit writes
//! its stderr as it likes, so the number of such callsites is bounded
//! ([`MAX_CALLSITES`], names cut to [`MAX_NAME`] and [`MAX_FIELDS`]); past
//! the bound, a line's fields are kept as one `executor_fields` (JSON).

use tracing::Level;

/// One executor log line, understood.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutorLine {
    /// The level the executor logged it at (INFO when the line has none).
    pub level: Level,
    /// The executor's module that logged it, when the line says.
    pub target: Option<String>,
    /// The message (for a text line, with its `key=value` fields after it).
    pub message: String,
    /// A JSON line's fields besides the message.
    pub fields: serde_json::Map<String, serde_json::Value>,
}

/// Understand one line of a unit's stderr (without its newline).
pub fn parse(line: &str) -> ExecutorLine {
    let line = line.trim_end();
    if line.starts_with('{')
        && let Ok(serde_json::Value::Object(mut object)) = serde_json::from_str(line)
    {
        let level = object
            .get("level")
            .and_then(serde_json::Value::as_str)
            .and_then(level_of)
            .unwrap_or(Level::INFO);
        let target = object
            .get("target")
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned);
        let mut fields = match object.remove("fields") {
            Some(serde_json::Value::Object(fields)) => fields,
            _ => serde_json::Map::new(),
        };
        let message = match fields.remove("message") {
            Some(serde_json::Value::String(message)) => message,
            Some(other) => other.to_string(),
            None => String::new(),
        };
        return ExecutorLine {
            level,
            target,
            message,
            fields,
        };
    }
    // tracing-subscriber's text format: `2026-01-02T03:04:05.678901Z  INFO target: message`.
    let mut words = line.splitn(2, char::is_whitespace);
    let stamp = words.next().unwrap_or_default();
    let rest = words.next().unwrap_or_default().trim_start();
    let (level_word, rest) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    let level = level_of(level_word).filter(|_| looks_like_a_timestamp(stamp));
    let Some(level) = level else {
        return ExecutorLine {
            level: Level::INFO,
            target: None,
            message: line.to_owned(),
            fields: serde_json::Map::new(),
        };
    };
    let rest = rest.trim_start();
    let (target, message) = match rest.split_once(": ") {
        Some((target, message)) if !target.is_empty() && !target.contains(' ') => {
            (Some(target.to_owned()), message.to_owned())
        }
        _ => (None, rest.to_owned()),
    };
    ExecutorLine {
        level,
        target,
        message,
        fields: serde_json::Map::new(),
    }
}

fn level_of(word: &str) -> Option<Level> {
    match word.to_ascii_uppercase().as_str() {
        "TRACE" => Some(Level::TRACE),
        "DEBUG" => Some(Level::DEBUG),
        "INFO" => Some(Level::INFO),
        "WARN" => Some(Level::WARN),
        "ERROR" => Some(Level::ERROR),
        _ => None,
    }
}

fn looks_like_a_timestamp(word: &str) -> bool {
    word.len() >= 10 && word.as_bytes()[..4].iter().all(u8::is_ascii_digit) && word.contains('T')
}

/// Log one line of unit `unit`'s stderr (session `session`, when the backend
/// knows it) in the host's log, at the executor's level, its fields as the
/// event's fields.
pub fn emit(unit: &str, session: Option<&str>, line: &str) {
    let line = parse(line);
    let host_fields = [
        ("unit", Some(unit)),
        ("session", session),
        ("executor_target", line.target.as_deref()),
    ];
    let mut names: Vec<String> = vec!["message".to_owned()];
    names.extend(host_fields.iter().map(|(name, _)| (*name).to_owned()));
    let mut values: Vec<&serde_json::Value> = Vec::new();
    for (key, value) in &line.fields {
        if names.len() - 1 - host_fields.len() >= MAX_FIELDS {
            break;
        }
        let name = field_name(key);
        // A name the host uses itself (box-init's `unit`), or one seen
        // twice once cut, is the executor's: `executor.NAME`.
        let name = if names.contains(&name) {
            field_name(&format!("executor.{key}"))
        } else {
            name
        };
        if names.contains(&name) {
            continue;
        }
        names.push(name);
        values.push(value);
    }
    let Some(metadata) = callsite(line.level, &names).and_then(|made| made.metadata.get()) else {
        emit_packed(unit, session, &line);
        return;
    };
    let enabled = tracing::dispatcher::get_default(|dispatch| dispatch.enabled(metadata));
    if !enabled {
        return;
    }
    let fields = metadata.fields();
    let message = format_args!("{}", line.message);
    let mut all: Vec<Option<&dyn tracing::Value>> = vec![Some(&message)];
    all.extend(
        host_fields
            .iter()
            .map(|(_, value)| value.as_ref().map(|value| value as &dyn tracing::Value)),
    );
    let recorded: Vec<Recorded<'_>> = values.iter().map(|value| recorded(value)).collect();
    all.extend(recorded.iter().map(Recorded::as_value));
    let value_set = fields.value_set_all(&all);
    tracing::Event::dispatch(metadata, &value_set);
}

/// The most callsites made for executor lines' sets of field names.
pub const MAX_CALLSITES: usize = 256;
/// The most executor fields one event carries; the rest are dropped.
pub const MAX_FIELDS: usize = 32;
/// The longest field name kept.
pub const MAX_NAME: usize = 64;

/// A JSON key as a field name: letters, digits, `_` and `.`, at most
/// [`MAX_NAME`] characters; anything else becomes `_`.
fn field_name(key: &str) -> String {
    let name: String = key
        .chars()
        .take(MAX_NAME)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.is_empty() {
        "_".to_owned()
    } else {
        name
    }
}

/// A JSON value as a field's value, in its own type; a list or an object
/// as its JSON text; `null` records nothing.
enum Recorded<'a> {
    Str(&'a str),
    Signed(i64),
    Unsigned(u64),
    Float(f64),
    Bool(bool),
    Json(String),
    Nothing,
}

fn recorded(value: &serde_json::Value) -> Recorded<'_> {
    match value {
        serde_json::Value::String(text) => Recorded::Str(text),
        serde_json::Value::Bool(value) => Recorded::Bool(*value),
        serde_json::Value::Number(number) => {
            if let Some(value) = number.as_u64() {
                Recorded::Unsigned(value)
            } else if let Some(value) = number.as_i64() {
                Recorded::Signed(value)
            } else {
                number
                    .as_f64()
                    .map_or_else(|| Recorded::Json(number.to_string()), Recorded::Float)
            }
        }
        serde_json::Value::Null => Recorded::Nothing,
        other => Recorded::Json(other.to_string()),
    }
}

impl Recorded<'_> {
    fn as_value(&self) -> Option<&dyn tracing::Value> {
        match self {
            Recorded::Str(text) => Some(text),
            Recorded::Signed(value) => Some(value),
            Recorded::Unsigned(value) => Some(value),
            Recorded::Float(value) => Some(value),
            Recorded::Bool(value) => Some(value),
            Recorded::Json(text) => Some(text),
            Recorded::Nothing => None,
        }
    }
}

/// A callsite made at run time for one level and set of field names.
struct Dynamic {
    metadata: std::sync::OnceLock<tracing::Metadata<'static>>,
}

impl tracing::callsite::Callsite for Dynamic {
    fn set_interest(&self, _interest: tracing::subscriber::Interest) {
        // Asked afresh on every line (`enabled`): nothing cached here.
    }

    #[expect(
        clippy::expect_used,
        reason = "set before the callsite is registered or used (`callsite`)"
    )]
    fn metadata(&self) -> &tracing::Metadata<'_> {
        self.metadata
            .get()
            .expect("a dynamic callsite's metadata is set before it is registered")
    }
}

type CallsiteKey = (Level, Vec<String>);

/// The callsite for `level` and `names` (made and registered the first
/// time), or `None` once [`MAX_CALLSITES`] have been made.
fn callsite(level: Level, names: &[String]) -> Option<&'static Dynamic> {
    static MADE: std::sync::Mutex<
        Option<std::collections::HashMap<CallsiteKey, &'static Dynamic>>,
    > = std::sync::Mutex::new(None);
    let mut made = MADE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let made = made.get_or_insert_with(std::collections::HashMap::new);
    let key = (level, names.to_vec());
    if let Some(callsite) = made.get(&key) {
        return Some(callsite);
    }
    if made.len() >= MAX_CALLSITES {
        return None;
    }
    let leaked: Vec<&'static str> = names
        .iter()
        .map(|name| &*Box::leak(name.clone().into_boxed_str()))
        .collect();
    let leaked: &'static [&'static str] = Box::leak(leaked.into_boxed_slice());
    let callsite: &'static Dynamic = Box::leak(Box::new(Dynamic {
        metadata: std::sync::OnceLock::new(),
    }));
    let metadata = tracing::Metadata::new(
        "executor line",
        "box_executor",
        level,
        Some(file!()),
        Some(line!()),
        Some(module_path!()),
        tracing::field::FieldSet::new(leaked, tracing::callsite::Identifier(callsite)),
        tracing::metadata::Kind::EVENT,
    );
    let _ = callsite.metadata.set(metadata);
    tracing::callsite::register(callsite);
    made.insert(key, callsite);
    Some(callsite)
}

/// [`emit`] past [`MAX_CALLSITES`]: the executor's fields as one JSON text.
fn emit_packed(unit: &str, session: Option<&str>, line: &ExecutorLine) {
    let target = line.target.as_deref();
    let fields = (!line.fields.is_empty())
        .then(|| serde_json::Value::Object(line.fields.clone()).to_string());
    let fields = fields.as_deref();
    let message = line.message.as_str();
    // tracing's levels are static per call site: one site per level.
    macro_rules! at {
        ($level:expr) => {
            tracing::event!(
                target: "box_executor",
                $level,
                unit,
                session,
                executor_target = target,
                executor_fields = fields,
                "{message}"
            )
        };
    }
    match line.level {
        Level::ERROR => at!(Level::ERROR),
        Level::WARN => at!(Level::WARN),
        Level::INFO => at!(Level::INFO),
        Level::DEBUG => at!(Level::DEBUG),
        _ => at!(Level::TRACE),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_line_keeps_its_level_and_target() {
        let line = parse(
            "2026-12-01T21:00:00.123456Z  WARN box_executor: --seccomp off: box's own seccomp layer is not applied",
        );
        assert_eq!(line.level, Level::WARN);
        assert_eq!(line.target.as_deref(), Some("box_executor"));
        assert_eq!(
            line.message,
            "--seccomp off: box's own seccomp layer is not applied"
        );
        let line = parse("2026-12-01T21:00:00Z DEBUG box_executor::process: started id=p1");
        assert_eq!(line.level, Level::DEBUG);
        assert_eq!(line.message, "started id=p1");
    }

    #[test]
    fn a_json_line_keeps_its_fields() {
        let line = parse(
            r#"{"timestamp":"2026-12-01T21:00:00Z","level":"ERROR","fields":{"message":"no session","rules":3},"target":"box_executor"}"#,
        );
        assert_eq!(line.level, Level::ERROR);
        assert_eq!(line.message, "no session");
        assert_eq!(
            serde_json::Value::Object(line.fields),
            serde_json::json!({"rules": 3})
        );
    }

    /// What a subscriber writes, for a test to read.
    #[derive(Clone, Default)]
    struct Written(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Written {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// `lines` emitted through a host subscriber logging as `json` or text.
    fn host_log(json: bool, lines: &[&str]) -> String {
        let written = Written::default();
        let writer = written.clone();
        let builder = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
            .with_ansi(false)
            .with_writer(move || writer.clone());
        let emit_all = || {
            for line in lines {
                emit("workspace", Some("s1"), line);
            }
        };
        if json {
            tracing::subscriber::with_default(builder.json().finish(), emit_all);
        } else {
            tracing::subscriber::with_default(builder.finish(), emit_all);
        }
        String::from_utf8(written.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn an_executor_lines_fields_are_the_host_events_fields_in_their_own_types() {
        let line = r#"{"timestamp":"2026-12-01T21:00:00Z","level":"WARN","fields":{"message":"the executor ended","exit_code":2,"signal":null,"rules":40,"ok":true,"ratio":0.5,"names":["A","B"],"unit":"inst/s1/workspace","bad key!":"x"},"target":"box_init::init::unit"}"#;
        let logged = host_log(true, &[line]);
        let event: serde_json::Value = serde_json::from_str(logged.trim()).unwrap();
        assert_eq!(event["level"], "WARN", "{logged}");
        assert_eq!(event["target"], "box_executor", "{logged}");
        assert_eq!(
            event["fields"],
            serde_json::json!({
                "message": "the executor ended",
                "unit": "workspace",
                "session": "s1",
                "executor_target": "box_init::init::unit",
                "exit_code": 2,
                "rules": 40,
                "ok": true,
                "ratio": 0.5,
                "names": "[\"A\",\"B\"]",
                "executor.unit": "inst/s1/workspace",
                "bad_key_": "x",
            }),
            "{logged}"
        );
        // The same in the text form: fields, never one packed string.
        let logged = host_log(false, &[line]);
        for field in [
            "exit_code=2",
            "rules=40",
            "ok=true",
            "executor.unit=\"inst/s1/workspace\"",
        ] {
            assert!(logged.contains(field), "no {field} in {logged}");
        }
        assert!(!logged.contains("executor_fields"), "{logged}");
        assert!(
            logged.contains("WARN box_executor: the executor ended"),
            "{logged}"
        );
    }

    #[test]
    fn a_line_below_the_hosts_level_is_not_logged() {
        let line =
            r#"{"level":"DEBUG","fields":{"message":"quiet","n":1},"target":"box_executor"}"#;
        assert_eq!(host_log(true, &[line]), "");
    }

    #[test]
    fn field_names_are_kept_to_a_safe_alphabet_and_length() {
        assert_eq!(field_name("exit_code"), "exit_code");
        assert_eq!(field_name("a b=c\n"), "a_b_c_");
        assert_eq!(field_name(""), "_");
        assert_eq!(field_name(&"x".repeat(100)).len(), MAX_NAME);
    }

    #[test]
    fn anything_else_is_logged_whole_at_info() {
        for text in [
            "thread 'main' panicked at src/lib.rs:1:1:",
            "box sandbox: landlock: not available",
            "INFO without a timestamp: kept whole",
            "",
        ] {
            let line = parse(text);
            assert_eq!(line.level, Level::INFO, "{text}");
            assert_eq!(line.message, text);
            assert_eq!(line.target, None);
        }
    }
}
