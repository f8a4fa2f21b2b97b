//! The tools: dax's seven (`dax-coding`) and box's namespace operations
//! (`box-namespace`: copy, move, remove). Their table (names, extensions,
//! schemas, descriptions, flags, in run order), the checks every call passes
//! (exact keys, types, the stamp), dispatch, and the file tools' facts
//! claim. bash itself lives in `bash`.

mod edit;
mod ls;
mod namespace;
mod read;
mod search;

use std::sync::Arc;

use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::facts::{FactCall, Facts};
use super::{Context, Progress, ToolOutcome, bash, schema};

/// The stamp argument every tool takes.
pub(crate) const STAMP_KEY: &str = "dax_stamp";

/// dax's extension: the seven coding tools, as dax's executor serves them.
pub(crate) const EXTENSION: &str = "dax-coding";

/// box's own extension beside it: the namespace operations of seed 003.
pub(crate) const NAMESPACE_EXTENSION: &str = "box-namespace";

/// The extensions that own the tools, in load order (the capability's
/// `extensions`).
pub(crate) const EXTENSIONS: [&str; 2] = [EXTENSION, NAMESPACE_EXTENSION];

/// The message a stamped file-tool call gets when its path now leads elsewhere.
pub(crate) const STAMP_MISMATCH: &str = "what this call touches changed since it was allowed (a path leads somewhere else now); ask again";

/// A JSON type a parameter takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A JSON string.
    String,
    /// A JSON number without a fraction.
    Integer,
    /// `true` or `false`.
    Boolean,
}

/// One parameter of a tool's schema, in field order.
#[derive(Debug)]
pub(crate) struct Param {
    /// The argument's key.
    pub name: &'static str,
    /// Its JSON type.
    pub kind: Kind,
    /// Whether the schema lists it in `required`.
    pub required: bool,
    /// Its schema description.
    pub description: &'static str,
}

/// One tool as the executor serves it.
#[derive(Debug)]
pub(crate) struct Spec {
    /// The tool's name.
    pub name: &'static str,
    /// The extension that owns it.
    pub extension: &'static str,
    /// The arguments that name paths, in the order its facts claim them.
    pub paths: &'static [&'static str],
    /// Its parameters, in schema order (the stamp last).
    pub params: &'static [Param],
    /// Read-only in the capability's sense (dax's ReadOnly list; bash too).
    pub read_only: bool,
    /// Runs alone: a batch containing it is serial (bash).
    pub sequential: bool,
    /// Runs concurrently with its neighbours in a batch (pure reads; not bash).
    pub parallel_safe: bool,
    /// Quick enough that a batch runs several on one thread rather than
    /// paying a thread hand-off each (read, ls; not the tree walks).
    pub cheap: bool,
    /// Where a facts claim's default path is when `path` is absent or empty.
    pub default_path: Option<&'static str>,
}

const fn param(name: &'static str, kind: Kind, required: bool, description: &'static str) -> Param {
    Param {
        name,
        kind,
        required,
        description,
    }
}

const STAMP: Param = param(STAMP_KEY, Kind::String, false, "Set by dax; leave it out");
const PATH_DESCRIPTION: &str = "File path, relative to the workspace or absolute inside it";

const SOURCE_DESCRIPTION: &str =
    "The path to take, relative to the workspace or absolute inside it";
const DESTINATION_DESCRIPTION: &str =
    "The new path, relative to the workspace or absolute inside it; nothing may be there yet";

/// Every tool, in the order it runs in process (the capability's order).
pub(crate) static TOOLS: [Spec; 10] = [
    Spec {
        name: "read",
        extension: EXTENSION,
        paths: &["path"],
        params: &[
            param("path", Kind::String, true, PATH_DESCRIPTION),
            param(
                "offset",
                Kind::Integer,
                false,
                "1-based line to start at (default 1)",
            ),
            param(
                "limit",
                Kind::Integer,
                false,
                "Maximum lines to return (default 2000)",
            ),
            STAMP,
        ],
        read_only: true,
        sequential: false,
        parallel_safe: true,
        cheap: true,
        default_path: Some(""),
    },
    Spec {
        name: "write",
        extension: EXTENSION,
        paths: &["path"],
        params: &[
            param("path", Kind::String, true, PATH_DESCRIPTION),
            param(
                "content",
                Kind::String,
                true,
                "The complete new content of the file",
            ),
            STAMP,
        ],
        read_only: false,
        sequential: false,
        parallel_safe: false,
        cheap: false,
        default_path: Some(""),
    },
    Spec {
        name: "edit",
        extension: EXTENSION,
        paths: &["path"],
        params: &[
            param("path", Kind::String, true, PATH_DESCRIPTION),
            param(
                "old_string",
                Kind::String,
                true,
                "The exact text to replace; it must appear exactly once",
            ),
            param(
                "new_string",
                Kind::String,
                true,
                "The text to put in its place",
            ),
            STAMP,
        ],
        read_only: false,
        sequential: false,
        parallel_safe: false,
        cheap: false,
        default_path: Some(""),
    },
    Spec {
        name: "glob",
        extension: EXTENSION,
        paths: &["path"],
        params: &[
            param(
                "pattern",
                Kind::String,
                true,
                "Glob pattern: ** matches any number of directories, * and ? match within one segment, {a,b} is alternation",
            ),
            param(
                "path",
                Kind::String,
                false,
                "Directory to search (default the workspace root); the pattern is relative to it",
            ),
            param(
                "max_results",
                Kind::Integer,
                false,
                "Maximum paths to return (default 1000)",
            ),
            STAMP,
        ],
        read_only: true,
        sequential: false,
        parallel_safe: true,
        cheap: false,
        default_path: Some("."),
    },
    Spec {
        name: "grep",
        extension: EXTENSION,
        paths: &["path"],
        params: &[
            param(
                "pattern",
                Kind::String,
                true,
                "Regular expression (RE2 syntax)",
            ),
            param(
                "path",
                Kind::String,
                false,
                "File or directory to search (default the workspace root)",
            ),
            param(
                "include",
                Kind::String,
                false,
                "Only search files matching this glob, e.g. *.go or src/**/*.{ts,tsx}; without a / it matches the base name",
            ),
            param(
                "ignore_case",
                Kind::Boolean,
                false,
                "Match case-insensitively",
            ),
            param(
                "max_results",
                Kind::Integer,
                false,
                "Maximum matching lines to return (default 200)",
            ),
            STAMP,
        ],
        read_only: true,
        sequential: false,
        parallel_safe: true,
        cheap: false,
        default_path: Some("."),
    },
    Spec {
        name: "ls",
        extension: EXTENSION,
        paths: &["path"],
        params: &[
            param(
                "path",
                Kind::String,
                false,
                "Directory to list (default the workspace root)",
            ),
            STAMP,
        ],
        read_only: true,
        sequential: false,
        parallel_safe: true,
        cheap: true,
        default_path: Some("."),
    },
    Spec {
        name: "bash",
        extension: EXTENSION,
        paths: &[],
        params: &[
            param(
                "command",
                Kind::String,
                true,
                "The bash command line to run",
            ),
            param(
                "timeout_seconds",
                Kind::Integer,
                false,
                "Seconds before the command is killed (default 120)",
            ),
            STAMP,
        ],
        read_only: true,
        sequential: true,
        parallel_safe: false,
        cheap: false,
        default_path: None,
    },
    Spec {
        name: "copy",
        extension: NAMESPACE_EXTENSION,
        paths: &["source", "destination"],
        params: &[
            param("source", Kind::String, true, SOURCE_DESCRIPTION),
            param("destination", Kind::String, true, DESTINATION_DESCRIPTION),
            STAMP,
        ],
        read_only: false,
        sequential: false,
        parallel_safe: false,
        cheap: false,
        default_path: None,
    },
    Spec {
        name: "move",
        extension: NAMESPACE_EXTENSION,
        paths: &["source", "destination"],
        params: &[
            param("source", Kind::String, true, SOURCE_DESCRIPTION),
            param("destination", Kind::String, true, DESTINATION_DESCRIPTION),
            STAMP,
        ],
        read_only: false,
        sequential: false,
        parallel_safe: false,
        cheap: false,
        default_path: None,
    },
    Spec {
        name: "remove",
        extension: NAMESPACE_EXTENSION,
        paths: &["path"],
        params: &[
            param(
                "path",
                Kind::String,
                true,
                "The file, link or empty directory to remove, relative to the workspace or absolute inside it",
            ),
            STAMP,
        ],
        read_only: false,
        sequential: false,
        parallel_safe: false,
        cheap: false,
        default_path: Some(""),
    },
];

/// The tool called `name`.
pub(crate) fn spec(name: &str) -> Option<&'static Spec> {
    TOOLS.iter().find(|tool| tool.name == name)
}

/// What the tools that print names say about the quoted form (`names`).
const QUOTED_NAMES: &str = "A name with control characters, a backslash, a double quote or bytes that are not UTF-8 is shown quoted, like \"a\\nb.txt\"; a path argument takes that form back.";

/// The description of `tool` for an executor that reads at most `max_read_bytes`.
pub(crate) fn description(tool: &Spec, max_read_bytes: u64) -> String {
    match tool.name {
        "read" => format!(
            "Read a file. Returns numbered lines. Use offset and limit for large files; only the first {} KiB of a file can be read, so use grep to find a line in a larger one.",
            max_read_bytes / 1024
        ),
        "write" => "Create or overwrite a file with the given content. Parent directories are created.".to_owned(),
        "edit" => "Replace old_string with new_string in a file. old_string must appear exactly once; include enough surrounding lines to make it unique.".to_owned(),
        "glob" => format!("Find files by glob pattern, e.g. **/*.go. Paths are relative to the search directory and sorted. Skips .git, node_modules, vendor and similar directories. {QUOTED_NAMES}"),
        "grep" => format!("Search file contents for a regular expression. Returns path:line:text, sorted by path. Skips binary files, .git, node_modules, vendor and similar directories. {QUOTED_NAMES}"),
        "ls" => format!("List the entries of one directory, sorted: directories end in /, files show their size in bytes. {QUOTED_NAMES}"),
        "copy" => format!("Copy a regular file to a new path. The source must be a regular file (not a directory, link or device); the destination must not exist and its directory must. {QUOTED_NAMES}"),
        "move" => format!("Move (rename) a file, directory or link to a new path. The destination must not exist and its directory must; a link is moved itself, never what it leads to. {QUOTED_NAMES}"),
        "remove" => format!("Remove a file, a link (itself, never what it leads to) or an empty directory; not recursive. A file must have been read first and be unchanged since. {QUOTED_NAMES}"),
        _ => "Run a bash command in the working directory and return its combined output and exit code.".to_owned(),
    }
}

/// The JSON schema of `tool`'s arguments, as agenttool generates it.
pub(crate) fn input_schema(tool: &Spec) -> Map<String, Value> {
    let mut properties = Map::new();
    for param in tool.params {
        let kind = match param.kind {
            Kind::String => "string",
            Kind::Integer => "integer",
            Kind::Boolean => "boolean",
        };
        properties.insert(
            param.name.to_owned(),
            json!({"type": kind, "description": param.description}),
        );
    }
    let required: Vec<&str> = tool
        .params
        .iter()
        .filter(|param| param.required)
        .map(|param| param.name)
        .collect();
    let mut schema = Map::new();
    schema.insert("type".to_owned(), json!("object"));
    schema.insert("properties".to_owned(), Value::Object(properties));
    schema.insert("required".to_owned(), json!(required));
    schema
}

/// The listing `_meta` flags of `tool` (agenttool's tool mark).
pub(crate) fn listing_flags(tool: &Spec) -> Value {
    if tool.sequential {
        json!({"facts": true, "replay": true, "sequential": true})
    } else {
        json!({"facts": true, "replay": true})
    }
}

/// Run the tool `name` with `arguments`; `None` when there is no such tool.
pub(crate) async fn call(
    context: &Arc<Context>,
    name: &str,
    arguments: Map<String, Value>,
    progress: Progress,
    cancel: CancellationToken,
) -> Option<ToolOutcome> {
    let tool = spec(name)?;
    if tool.name == "bash" {
        if let Err(message) = schema::check(tool.name, tool.params, &arguments) {
            return Some(ToolOutcome::error(message));
        }
        return Some(bash::call(context, &arguments, progress, cancel).await);
    }
    if tool.cheap {
        // A read or ls is a handful of syscalls, bounded by the read limit and
        // a listing's first 10 000 entries: running it in place costs less
        // than a hand-off to the blocking pool and back (on the executor's
        // one-thread runtime, that hand-off was most of a small read's cost).
        let run = || call_file_tool(context, tool, &arguments, &cancel);
        return Some(match tokio::runtime::Handle::current().runtime_flavor() {
            tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(run),
            _ => run(),
        });
    }
    let context = Arc::clone(context);
    let run =
        tokio::task::spawn_blocking(move || call_file_tool(&context, tool, &arguments, &cancel));
    Some(match run.await {
        Ok(outcome) => outcome,
        Err(error) => ToolOutcome::error(format!("{name} stopped unexpectedly: {error}")),
    })
}

/// One file-tool call on this (blocking) thread: the argument checks, the
/// stamp's verification when the call carries one, then the tool.
pub(crate) fn call_file_tool(
    context: &Context,
    tool: &Spec,
    arguments: &Map<String, Value>,
    cancel: &CancellationToken,
) -> ToolOutcome {
    if let Err(message) = schema::check(tool.name, tool.params, arguments) {
        return ToolOutcome::error(message);
    }
    // An empty stamp is no stamp (Go's zero value): no check, as unstamped.
    if let Some(Value::String(stamp)) = arguments.get(STAMP_KEY)
        && !stamp.is_empty()
        && !verify_stamp(context, tool, arguments, stamp)
    {
        return ToolOutcome::error(STAMP_MISMATCH);
    }
    run_file_tool(context, tool.name, arguments, cancel)
}

/// Run one file tool on this thread (a blocking one).
fn run_file_tool(
    context: &Context,
    name: &str,
    arguments: &Map<String, Value>,
    cancel: &CancellationToken,
) -> ToolOutcome {
    let outcome = match name {
        "read" => read::run(context, arguments),
        "write" => edit::write(context, arguments),
        "edit" => edit::edit(context, arguments),
        "glob" => search::glob(context, arguments, cancel),
        "grep" => search::grep(context, arguments, cancel),
        "ls" => ls::run(context, arguments),
        "copy" => namespace::copy(context, arguments),
        "move" => namespace::move_(context, arguments),
        "remove" => namespace::remove(context, arguments),
        _ => Err(format!("unknown tool \"{name}\"")),
    };
    match outcome {
        Ok(text) => ToolOutcome::ok(text),
        Err(text) => ToolOutcome::error(text),
    }
}

/// The facts claim of one call to `name`. `None` for an unknown tool.
pub(crate) fn facts(
    context: &Context,
    name: &str,
    arguments: &Map<String, Value>,
) -> Option<Result<Facts, String>> {
    let tool = spec(name)?;
    if let Err(message) = schema::exact_keys(tool.params, arguments) {
        return Some(Err(message));
    }
    if tool.name == "bash" {
        return Some(bash::facts(context, arguments));
    }
    Some(file_facts(context, tool, arguments))
}

/// A file tool's claim: what its path names and where links lead, and the
/// stamped arguments.
fn file_facts(
    context: &Context,
    tool: &Spec,
    arguments: &Map<String, Value>,
) -> Result<Facts, String> {
    schema::check(tool.name, tool.params, arguments)?;
    let calls = file_calls(context, tool, arguments);
    let mut rewrite: std::collections::BTreeMap<String, Value> = arguments
        .iter()
        .filter(|(key, _)| key.as_str() != STAMP_KEY)
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect();
    rewrite.insert(
        STAMP_KEY.to_owned(),
        Value::String(context.stamp.sign(&stamp_message(tool.name, &calls))),
    );
    Ok(Facts {
        calls: Some(calls),
        rewrite: Some(rewrite.into_iter().collect()),
    })
}

/// What a file tool's call names: each of its path arguments, in order
/// (copy and move claim their source, then their destination).
fn file_calls(context: &Context, tool: &Spec, arguments: &Map<String, Value>) -> Vec<FactCall> {
    tool.paths
        .iter()
        .flat_map(|key| {
            let raw = match arguments.get(*key).and_then(Value::as_str) {
                Some(path) if !path.is_empty() => path,
                _ if *key == "path" => tool.default_path.unwrap_or(""),
                _ => "",
            };
            context.workspace.path_facts(raw, "")
        })
        .collect()
}

/// Whether `stamp` is this executor's stamp of the call's facts as they are now.
fn verify_stamp(
    context: &Context,
    tool: &Spec,
    arguments: &Map<String, Value>,
    stamp: &str,
) -> bool {
    let calls = file_calls(context, tool, arguments);
    context
        .stamp
        .verify(&stamp_message(tool.name, &calls), stamp)
}

/// What a file tool's stamp signs: `"facts\0" + tool`, then per call
/// `"\0" + call.tool + "\0" + call.args JSON` (the question text excluded).
pub(crate) fn stamp_message(tool: &str, calls: &[FactCall]) -> Vec<u8> {
    let mut message = b"facts\0".to_vec();
    message.extend_from_slice(tool.as_bytes());
    for call in calls {
        message.push(0);
        message.extend_from_slice(call.tool.as_bytes());
        message.push(0);
        let args = serde_json::to_vec(&call.args).unwrap_or_default();
        message.extend_from_slice(&args);
    }
    message
}

/// The string argument `key`, or `default`.
pub(crate) fn string_arg<'a>(
    arguments: &'a Map<String, Value>,
    key: &str,
    default: &'a str,
) -> &'a str {
    arguments
        .get(key)
        .and_then(Value::as_str)
        .unwrap_or(default)
}

/// The path argument, or `default` when absent or empty.
pub(crate) fn path_arg<'a>(arguments: &'a Map<String, Value>, default: &'a str) -> &'a str {
    match arguments.get("path").and_then(Value::as_str) {
        Some(path) if !path.is_empty() => path,
        _ => default,
    }
}

/// The integer argument `key`, or `default`.
pub(crate) fn integer_arg(arguments: &Map<String, Value>, key: &str, default: i64) -> i64 {
    arguments
        .get(key)
        .and_then(schema::integer)
        .unwrap_or(default)
}

/// Helpers for the tools' unit tests: a context over a temp directory.
#[cfg(test)]
pub(crate) mod testing {
    use std::sync::Arc;

    use serde_json::{Map, Value};

    use crate::workspace::Workspace;
    use crate::{Context, stamp::StampKey};

    /// A context over `root` with the default read limit.
    pub fn context(root: &std::path::Path) -> Arc<Context> {
        context_with(root, true, 2 * 1024 * 1024)
    }

    /// A context over `root` with the write guard `on` and `max_read_bytes`.
    pub fn context_with(root: &std::path::Path, on: bool, max_read_bytes: u64) -> Arc<Context> {
        Arc::new(Context {
            workspace: Arc::new(Workspace::open(root).unwrap().with_write_guard(on)),
            child_env: Arc::new(Vec::new()),
            stamp: StampKey::random(),
            max_read_bytes,
            bash_output: crate::BashOutput::Escape,
        })
    }

    /// Run `tool` with `arguments` (a JSON object) to completion.
    pub fn call(context: &Arc<Context>, tool: &str, arguments: Value) -> Result<String, String> {
        let Value::Object(arguments) = arguments else {
            panic!("arguments must be an object")
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let outcome = runtime
            .block_on(super::call(
                context,
                tool,
                arguments,
                None,
                tokio_util::sync::CancellationToken::new(),
            ))
            .expect("a known tool");
        if outcome.is_error {
            Err(outcome.text)
        } else {
            Ok(outcome.text)
        }
    }

    /// `arguments` as a map.
    pub fn map(arguments: Value) -> Map<String, Value> {
        match arguments {
            Value::Object(map) => map,
            _ => panic!("arguments must be an object"),
        }
    }
}

#[cfg(test)]
mod tests;
