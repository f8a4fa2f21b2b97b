//! `execution/batch`: one model response's calls in one request, run under the
//! barrier model (seed 001). A maximal run of pure reads (read, glob, grep, ls)
//! runs concurrently; every other call runs alone, in order; a failed mutating
//! call (write, edit, bash) cancels the rest, each skipped call told why.
//! Results come back in call order.

use std::sync::Arc;

use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::tools::{self, spec};
use super::{Context, ToolOutcome};

/// The most calls one batch takes.
pub(crate) const MAX_CALLS: usize = 256;
/// Below this many cheap calls per thread, a thread hand-off costs more than
/// running them one after another.
const CHEAP_CALLS_PER_THREAD: usize = 3;

/// The cores this process may use, asked once (the answer reads cgroup files).
fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, std::num::NonZero::get))
}

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
            for (at, outcome) in read_run(context, &calls[index..end], index, &cancel).await {
                results[at] = Some(outcome);
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

/// Run a run of pure reads concurrently: the cheap ones one after another on
/// one blocking thread (a thread hand-off costs more than such a call), each
/// tree walk on a thread of its own. Returns (call index, outcome) pairs.
async fn read_run(
    context: &Arc<Context>,
    calls: &[Call],
    first: usize,
    cancel: &CancellationToken,
) -> Vec<(usize, ToolOutcome)> {
    let mut cheap = Vec::new();
    let mut tasks = Vec::new();
    for (offset, call) in calls.iter().enumerate() {
        let Some(tool) = spec(&call.name) else {
            continue;
        };
        let job = (first + offset, tool, call.arguments.clone());
        if tool.cheap {
            cheap.push(job);
        } else {
            tasks.push(vec![job]);
        }
    }
    // The cheap calls split over the cores: one thread each for a few calls.
    let groups = cores()
        .min(cheap.len().div_ceil(CHEAP_CALLS_PER_THREAD))
        .max(1);
    let per_group = cheap.len().div_ceil(groups).max(1);
    let mut cheap = cheap.into_iter().peekable();
    while cheap.peek().is_some() {
        tasks.push(cheap.by_ref().take(per_group).collect());
    }
    let run_jobs = |jobs: Vec<Job>, context: &Context, cancel: &CancellationToken| {
        jobs.into_iter()
            .map(|(at, tool, arguments)| {
                let outcome = match arguments {
                    Ok(arguments) => tools::call_file_tool(context, tool, &arguments, cancel),
                    Err(message) => ToolOutcome::error(message),
                };
                (at, outcome)
            })
            .collect::<Vec<_>>()
    };
    // The last group (the cheap calls, when there are any) runs in place on
    // this worker while the others run on the blocking pool: one hand-off less.
    let in_place = tasks.pop().unwrap_or_default();
    let others = tasks.into_iter().map(|jobs| {
        let context = Arc::clone(context);
        let cancel = cancel.child_token();
        tokio::task::spawn_blocking(move || run_jobs(jobs, &context, &cancel))
    });
    let others = futures::future::join_all(others);
    let mine = if tokio::runtime::Handle::current().runtime_flavor()
        == tokio::runtime::RuntimeFlavor::MultiThread
    {
        tokio::task::block_in_place(|| run_jobs(in_place, context, cancel))
    } else {
        run_jobs(in_place, context, cancel)
    };
    let mut outcomes: Vec<(usize, ToolOutcome)> = others
        .await
        .into_iter()
        .flat_map(|run| run.unwrap_or_default())
        .collect();
    outcomes.extend(mine);
    outcomes
}

/// One call of a read run: its index in the batch, its tool, its arguments.
type Job = (
    usize,
    &'static tools::Spec,
    Result<Map<String, Value>, String>,
);

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

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;
    use serde_json::json;

    use super::*;
    use crate::tools::testing::context;

    fn run_batch(context: &Arc<Context>, calls: Value) -> Vec<(String, bool)> {
        let calls = parse_calls(Some(&json!({ "calls": calls }))).unwrap();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime
            .block_on(run(context, calls, CancellationToken::new()))
            .into_iter()
            .map(|result| {
                (
                    result["content"][0]["text"].as_str().unwrap().to_owned(),
                    result["isError"] == json!(true),
                )
            })
            .collect()
    }

    #[test]
    fn results_come_back_in_call_order_and_writes_are_barriers() {
        let dir = tempfile::tempdir().unwrap();
        let context = context(dir.path());
        let results = run_batch(
            &context,
            json!([
                {"name": "ls"},
                {"name": "write", "arguments": {"path": "a", "content": "1"}},
                {"name": "read", "arguments": {"path": "a"}},
                {"name": "glob", "arguments": {"pattern": "*"}},
                {"name": "nope"},
                {"name": "write", "arguments": {"path": "b", "content": "2"}},
                {"name": "grep", "arguments": {"pattern": "2"}}
            ]),
        );
        let expected = [
            ("(empty)", false),
            ("wrote 1 bytes to a", false),
            ("     1\t1\n", false),
            ("a\n", false),
            ("unknown tool \"nope\"", true),
            ("wrote 1 bytes to b", false),
            ("b:1:2\n", false),
        ];
        let expected: Vec<(String, bool)> = expected
            .iter()
            .map(|(t, e)| ((*t).to_owned(), *e))
            .collect();
        assert_eq!(results, expected);
    }

    #[test]
    fn a_failed_write_cancels_the_rest_and_a_failed_read_does_not() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let context = context(dir.path());
        let results = run_batch(
            &context,
            json!([
                {"name": "read", "arguments": {"path": "missing"}},
                {"name": "write", "arguments": {"path": "sub", "content": "x"}},
                {"name": "read", "arguments": {"path": "missing"}},
                {"name": "write", "arguments": {"path": "c", "content": "x"}}
            ]),
        );
        let skipped = "skipped: write failed earlier in this batch, so this call was cancelled";
        assert!(results[0].1);
        assert_eq!(results[1], ("sub is a directory".to_owned(), true));
        assert_eq!(results[2], (skipped.to_owned(), true));
        assert_eq!(results[3], (skipped.to_owned(), true));
        assert!(!dir.path().join("c").exists());
    }

    #[test]
    fn malformed_calls_are_refused_whole_or_per_call() {
        assert!(parse_calls(Some(&json!({"calls": {}}))).is_err());
        assert!(parse_calls(Some(&json!({"calls": [{"arguments": {}}]}))).is_err());
        let too_many: Vec<Value> = (0..=MAX_CALLS).map(|_| json!({"name": "ls"})).collect();
        assert!(parse_calls(Some(&json!({ "calls": too_many }))).is_err());
        let calls =
            parse_calls(Some(&json!({"calls": [{"name": "ls", "arguments": [1]}]}))).unwrap();
        assert!(calls[0].arguments.is_err());
    }
}
