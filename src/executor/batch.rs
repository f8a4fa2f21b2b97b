//! `execution/batch`: one model response's calls in one request, run under the
//! barrier model (seed 001). A maximal run of pure reads (read, glob, grep, ls)
//! runs concurrently; every other call runs alone, in order; a failed mutating
//! call (write, edit, bash) cancels the rest, each skipped call told why.
//! Results come back in call order.

use std::sync::Arc;

use futures::future::join_all;
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::tools::{self, spec};
use super::{Context, ToolOutcome};

/// The most calls one batch takes.
pub(crate) const MAX_CALLS: usize = 256;

/// One call of a batch (or of a facts request).
#[derive(Debug, Clone)]
pub(crate) struct Call {
    /// The tool's name.
    pub name: String,
    /// Its arguments (`{}` when the request left them out).
    pub arguments: Result<Map<String, Value>, String>,
}

/// The calls of a batch or facts request's params: `{"calls": [{"name", "arguments"?}]}`.
pub(crate) fn parse_calls(params: Option<&Value>) -> Result<Vec<Call>, String> {
    let calls = params
        .and_then(|params| params.get("calls"))
        .and_then(Value::as_array)
        .ok_or("params.calls must be an array of {\"name\", \"arguments\"} objects")?;
    if calls.len() > MAX_CALLS {
        return Err(format!(
            "{} calls; at most {MAX_CALLS} in one request",
            calls.len()
        ));
    }
    calls
        .iter()
        .enumerate()
        .map(|(index, call)| {
            let name = call
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("params.calls[{index}].name must be a string"))?;
            let arguments = match call.get("arguments") {
                None | Some(Value::Null) => Ok(Map::new()),
                Some(Value::Object(arguments)) => Ok(arguments.clone()),
                Some(_) => Err(format!("params.calls[{index}].arguments must be an object")),
            };
            Ok(Call {
                name: name.to_owned(),
                arguments,
            })
        })
        .collect()
}

/// Run `calls` under the barrier model; one result per call, in call order.
pub(crate) async fn run(
    context: &Arc<Context>,
    calls: Vec<Call>,
    cancel: CancellationToken,
) -> Vec<Value> {
    let mut results: Vec<Option<ToolOutcome>> = vec![None; calls.len()];
    let mut failed: Option<String> = None;
    let mut index = 0;
    while index < calls.len() {
        if let Some(tool) = &failed {
            results[index] = Some(ToolOutcome::error(format!(
                "skipped: {tool} failed earlier in this batch, so this call was cancelled"
            )));
            index += 1;
            continue;
        }
        let end = (index..calls.len())
            .find(|&at| !is_pure_read(&calls[at].name))
            .unwrap_or(calls.len());
        if end > index {
            let run = calls[index..end]
                .iter()
                .map(|call| one(context, call, cancel.child_token()));
            for (offset, outcome) in join_all(run).await.into_iter().enumerate() {
                results[index + offset] = Some(outcome);
            }
            index = end;
            continue;
        }
        let call = &calls[index];
        let outcome = one(context, call, cancel.child_token()).await;
        if outcome.failed && is_mutating(&call.name) {
            failed = Some(call.name.clone());
        }
        results[index] = Some(outcome);
        index += 1;
    }
    results
        .into_iter()
        .map(|outcome| result_json(&outcome.unwrap_or_else(|| ToolOutcome::error("not run"))))
        .collect()
}

async fn one(context: &Arc<Context>, call: &Call, cancel: CancellationToken) -> ToolOutcome {
    let arguments = match &call.arguments {
        Ok(arguments) => arguments.clone(),
        Err(message) => return ToolOutcome::error(message.clone()),
    };
    tools::call(context, &call.name, arguments, None, cancel)
        .await
        .unwrap_or_else(|| {
            ToolOutcome::error(format!("unknown tool {}", Value::String(call.name.clone())))
        })
}

/// Whether calls to `name` may run beside their neighbours.
fn is_pure_read(name: &str) -> bool {
    spec(name).is_some_and(|tool| tool.parallel_safe)
}

/// Whether a failure of `name` cancels the rest of the batch.
fn is_mutating(name: &str) -> bool {
    spec(name).is_some_and(|tool| !tool.parallel_safe)
}

/// A `CallToolResult` as JSON: one text block, `isError`.
pub(crate) fn result_json(outcome: &ToolOutcome) -> Value {
    json!({
        "content": [{"type": "text", "text": outcome.text}],
        "isError": outcome.is_error,
    })
}
