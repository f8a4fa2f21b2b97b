//! Redaction of every string in a `serde_json::Value`, in place.

use serde_json::{Map, Value};

use crate::{MIN_SECRET_LEN, Redactor};

/// Redact `value` in place; returns how many regions were replaced.
pub(crate) fn redact_value(redactor: &Redactor, value: &mut Value) -> usize {
    match value {
        Value::Null | Value::Bool(_) => 0,
        Value::Number(number) => {
            // Digits can be a secret (a long PIN); a number shorter than any
            // form cannot, and skipping it keeps numeric arrays cheap.
            let text = number.to_string();
            if text.len() < MIN_SECRET_LEN {
                return 0;
            }
            match redactor.redact_counted(&text) {
                Some((redacted, count)) => {
                    *value = Value::String(redacted);
                    count
                }
                None => 0,
            }
        }
        Value::String(text) => match redactor.redact_counted(text) {
            Some((redacted, count)) => {
                *text = redacted;
                count
            }
            None => 0,
        },
        Value::Array(items) => items
            .iter_mut()
            .map(|item| redact_value(redactor, item))
            .sum(),
        Value::Object(map) => {
            let mut count: usize = map
                .values_mut()
                .map(|item| redact_value(redactor, item))
                .sum();
            if map.keys().any(|key| redactor.redact_counted(key).is_some()) {
                count += redact_keys(redactor, map);
            }
            count
        }
    }
}

/// Rebuild `map` with its keys redacted, keeping the order. Two keys that
/// redact to the same text both stay: the later gets `#2`, `#3`... appended.
fn redact_keys(redactor: &Redactor, map: &mut Map<String, Value>) -> usize {
    let mut count = 0;
    let mut rebuilt = Map::new();
    for (key, item) in std::mem::take(map) {
        let key = match redactor.redact_counted(&key) {
            Some((redacted, regions)) => {
                count += regions;
                redacted
            }
            None => key,
        };
        let mut unique = key.clone();
        let mut suffix = 2;
        while rebuilt.contains_key(&unique) {
            unique = format!("{key}#{suffix}");
            suffix += 1;
        }
        rebuilt.insert(unique, item);
    }
    *map = rebuilt;
    count
}
