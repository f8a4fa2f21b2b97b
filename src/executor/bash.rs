//! The bash tool: run a line in the workspace (own process group, killed as a
//! group on timeout or cancel, the scrubbed environment, git neutralised), and
//! its facts claim.
//!
//! Interface stub: the bash work fills this in.

use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use super::facts::Facts;
use super::{Context, Progress, ToolOutcome};

/// Run the bash tool with already key-checked arguments.
pub(crate) async fn call(
    context: &Context,
    arguments: &Map<String, Value>,
    progress: Progress,
    cancel: CancellationToken,
) -> ToolOutcome {
    let _ = (context, arguments, progress, cancel);
    ToolOutcome::error("bash is not built yet")
}

/// The bash tool's facts claim (conservative: never less than the line can touch).
pub(crate) fn facts(context: &Context, arguments: &Map<String, Value>) -> Result<Facts, String> {
    let _ = (context, arguments);
    Err("bash facts are not built yet".to_owned())
}
