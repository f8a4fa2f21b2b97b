//! The executor's log lines, re-emitted into the host's log as events at
//! their own level: a unit's stderr is the executor's `tracing` output (one
//! JSON object a line, as both backends ask for with `BOX_LOG_FORMAT=json`
//! or `serve_json_logs`; or text, `TIMESTAMP LEVEL target: message fields`),
//! its fields kept as `executor_fields` (JSON); a line that is neither
//! (a panic, the local helper's refusal) is logged whole at INFO. Both backends log their units' stderr through [`emit`].

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
    /// A JSON line's fields besides the message, as JSON.
    pub fields: Option<String>,
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
            fields: (!fields.is_empty()).then(|| serde_json::Value::Object(fields).to_string()),
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
            fields: None,
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
        fields: None,
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
/// knows it) in the host's log, at the executor's level.
pub fn emit(unit: &str, session: Option<&str>, line: &str) {
    let line = parse(line);
    // An absent Option records no field at all.
    let target = line.target.as_deref();
    let fields = line.fields.as_deref();
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
                "executor: {message}"
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
        assert_eq!(line.fields.as_deref(), Some(r#"{"rules":3}"#));
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
