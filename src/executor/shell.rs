//! The bash line analysis (placeholder while it is built).

use serde_json::{Map, Value};

use super::super::Context;
use super::super::facts::Facts;

/// A line's auto-allowable plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The plan rendered as a bash line (every word single-quoted).
    pub rendered: String,
}

/// The plan of `command` if it is still auto-allowable and `stamp` is its stamp.
pub(crate) fn verify(context: &Context, command: &str, stamp: &str) -> Option<Plan> {
    let _ = (context, command, stamp);
    None
}

/// The facts claim of a bash line.
pub(crate) fn facts(
    context: &Context,
    command: &str,
    arguments: &Map<String, Value>,
) -> Result<Facts, String> {
    let _ = (context, command, arguments);
    Err("bash facts are not built yet".to_owned())
}
