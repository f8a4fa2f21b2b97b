//! Argument checks every tool call and every facts claim passes first: the
//! exact-keys rule (a key that is a field's name in another case is refused,
//! so a claim and a run can never read different keys), unknown keys, and the
//! types the schema declares.

use serde_json::{Map, Value};

use super::tools::{Kind, Param};

/// Check `arguments` against the parameters of `tool`: exact keys, no unknown
/// keys, declared types, required fields present. The error names the field.
pub(crate) fn check(
    tool: &str,
    params: &[Param],
    arguments: &Map<String, Value>,
) -> Result<(), String> {
    exact_keys(params, arguments)?;
    for (key, value) in arguments {
        let Some(param) = params.iter().find(|param| param.name == key) else {
            let names: Vec<&str> = params.iter().map(|param| param.name).collect();
            return Err(format!(
                "unknown argument {}; {tool} takes {}",
                quote(key),
                names.join(", ")
            ));
        };
        if !param.kind.admits(value) {
            return Err(format!(
                "argument {} must be {}, not {}",
                quote(key),
                param.kind.described(),
                described(value)
            ));
        }
    }
    if let Some(missing) = params
        .iter()
        .find(|param| param.required && !arguments.contains_key(param.name))
    {
        return Err(format!("argument {} is required", quote(missing.name)));
    }
    Ok(())
}

/// The exact-keys rule alone: a key equal to a field case-insensitively (Go's
/// `strings.EqualFold`, so a long s or a Kelvin sign count) but not exactly.
pub(crate) fn exact_keys(params: &[Param], arguments: &Map<String, Value>) -> Result<(), String> {
    for key in arguments.keys() {
        if params.iter().any(|param| param.name == key) {
            continue;
        }
        if let Some(param) = params.iter().find(|param| equal_fold(param.name, key)) {
            return Err(format!(
                "argument {} is {} in another case; write it once, as {}",
                quote(key),
                quote(param.name),
                quote(param.name)
            ));
        }
    }
    Ok(())
}

/// Go's `strings.EqualFold`, close enough: compare the simple case folds.
fn equal_fold(left: &str, right: &str) -> bool {
    let fold = |text: &str| -> Vec<char> {
        text.chars()
            .flat_map(char::to_uppercase)
            .flat_map(char::to_lowercase)
            .collect()
    };
    fold(left) == fold(right)
}

impl Kind {
    fn admits(self, value: &Value) -> bool {
        match self {
            Kind::String => value.is_string(),
            Kind::Boolean => value.is_boolean(),
            Kind::Integer => integer(value).is_some(),
        }
    }

    fn described(self) -> &'static str {
        match self {
            Kind::String => "a string",
            Kind::Boolean => "a boolean",
            Kind::Integer => "an integer",
        }
    }
}

/// The integer `value` holds (a JSON number with no fraction), clamped to i64.
pub(crate) fn integer(value: &Value) -> Option<i64> {
    if let Some(number) = value.as_i64() {
        return Some(number);
    }
    if value.as_u64().is_some() {
        return Some(i64::MAX);
    }
    let float = value.as_f64()?;
    if float.fract() != 0.0 || !float.is_finite() {
        return None;
    }
    // `as` saturates at the bounds, which is what a limit wants.
    Some(float as i64)
}

fn described(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A key quoted as Go's `%q` would (JSON string escaping is close enough).
fn quote(key: &str) -> String {
    Value::String(key.to_owned()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::spec;
    use serde_json::json;

    fn check_read(arguments: Value) -> Result<(), String> {
        let Value::Object(map) = arguments else {
            panic!("arguments must be an object")
        };
        let tool = spec("read").unwrap();
        check("read", tool.params, &map)
    }

    #[test]
    fn case_variant_keys_are_refused_with_the_reference_message() {
        assert_eq!(
            check_read(json!({"path": "a", "Path": ".env"})),
            Err(
                r#"argument "Path" is "path" in another case; write it once, as "path""#.to_owned()
            )
        );
        assert!(
            check_read(json!({"PATH": "a"}))
                .unwrap_err()
                .contains("in another case")
        );
        assert!(
            check_read(json!({"path": "a", "dax_ſtamp": "x"}))
                .unwrap_err()
                .contains(r#"as "dax_stamp""#)
        );
    }

    #[test]
    fn wrong_types_and_missing_fields_name_the_field() {
        assert_eq!(
            check_read(json!({"path": "a", "offset": "3"})),
            Err(r#"argument "offset" must be an integer, not a string"#.to_owned())
        );
        assert_eq!(
            check_read(json!({"offset": 3})),
            Err(r#"argument "path" is required"#.to_owned())
        );
        assert!(check_read(json!({"path": "a", "offset": 3.0, "limit": 2})).is_ok());
        assert!(check_read(json!({"path": "a", "offset": 3.5})).is_err());
    }

    #[test]
    fn unknown_keys_are_refused() {
        assert_eq!(
            check_read(json!({"path": "a", "mode": "x"})),
            Err(r#"unknown argument "mode"; read takes path, offset, limit, dax_stamp"#.to_owned())
        );
    }
}
