//! The facts claim's wire types (`execution/facts`): what a call would touch,
//! answered without running it.

use serde::Serialize;
use serde_json::{Map, Value};

/// The prefix no rule names, so a policy asks: what the analysis cannot bound.
pub(crate) const SENTINEL: &str = "$(...) ";

/// The tool name of a call whose links cannot be read.
pub(crate) const LINKS_UNKNOWN: &str = "dax:links-unknown";

/// One thing a call would touch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct FactCall {
    /// The tool it amounts to; `""` is the claiming tool itself. Always serialised.
    pub tool: String,
    /// Its arguments; omitted when empty.
    #[serde(skip_serializing_if = "Map::is_empty")]
    pub args: Map<String, Value>,
    /// What a permission question shows; omitted when empty.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub text: String,
}

/// A tool's facts claim for one call.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Facts {
    /// `None` (serialised `null`) = the call itself; `Some([])` = amounts to
    /// nothing the tool can state; otherwise what it touches. Always serialised.
    pub calls: Option<Vec<FactCall>>,
    /// The arguments the call runs with if allowed (the stamped arguments).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rewrite: Option<Map<String, Value>>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn null_and_empty_calls_stay_distinct_on_the_wire() {
        let itself = Facts {
            calls: None,
            rewrite: None,
        };
        let nothing = Facts {
            calls: Some(Vec::new()),
            rewrite: None,
        };
        assert_eq!(
            serde_json::to_value(itself).unwrap(),
            json!({"calls": null})
        );
        assert_eq!(serde_json::to_value(nothing).unwrap(), json!({"calls": []}));
        let call = FactCall {
            tool: String::new(),
            args: Map::new(),
            text: String::new(),
        };
        assert_eq!(serde_json::to_value(call).unwrap(), json!({"tool": ""}));
    }
}
