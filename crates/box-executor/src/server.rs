//! The rmcp server handler: the capability at `initialize`, the tool listing,
//! `tools/call` (checks, stamp, dispatch, progress, cancellation), the files
//! resources, and the custom methods (`execution/facts`, `execution/batch`,
//! `agentworkspace/process.*`).

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, CustomRequest,
    CustomResult, ErrorCode, Implementation, InitializeRequestParams, InitializeResult,
    ListResourceTemplatesResult, ListToolsResult, PaginatedRequestParams,
    ProgressNotificationParam, ProtocolVersion, ReadResourceRequestParams, ReadResourceResponse,
    ReadResourceResult, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Map, Value, json};

use super::process::{METHOD_PREFIX, Processes, RESIZE_METHOD};
use super::tools::{self, EXTENSIONS, TOOLS};
use super::{Context, ToolOutcome, batch, files, stamp, workspace};

/// The executor capability's key (client and server side).
pub(crate) use box_jsonrpc::EXECUTOR_KEY;
/// The facts capability's key.
pub(crate) const FACTS_KEY: &str = "io.github.christopherdavenport.agenttool/facts";
/// The listing `_meta` key for a tool's flags.
pub(crate) const TOOL_META_KEY: &str = "io.github.christopherdavenport.agenttool/tool";

/// The MCP methods rmcp parses itself (their params too).
const STANDARD_METHODS: [&str; 12] = [
    "initialize",
    "ping",
    "tools/call",
    "tools/list",
    "resources/read",
    "resources/list",
    "resources/templates/list",
    "prompts/get",
    "prompts/list",
    "completion/complete",
    "logging/setLevel",
    "server/discover",
];

/// Progress updates buffered between a running bash and the client; a full
/// buffer drops the update (progress is lossy on purpose).
const PROGRESS_BUFFER: usize = 16;

/// What the executor was started with (the command line), fixed for its life.
#[derive(Debug)]
pub(crate) struct Settings {
    /// The descriptor's kind.
    pub kind: String,
    /// The descriptor's ref (omitted when empty).
    pub reference: String,
    /// The most bytes a file tool reads, before the client's ask.
    pub max_read_bytes: u64,
    /// What bash output does with terminal control characters.
    pub bash_output: super::BashOutput,
}

/// One connection's state: the context its calls share and its processes.
pub(crate) struct Session {
    /// What every call needs.
    pub context: Arc<Context>,
    /// The process methods' table.
    pub processes: Processes,
}

/// Shared between the handler and `serve` (which ends the processes on exit).
pub(crate) struct Shared {
    settings: Settings,
    workspace: Arc<workspace::Workspace>,
    child_env: Arc<Vec<(std::ffi::OsString, std::ffi::OsString)>>,
    stamp: stamp::StampKey,
    session: OnceLock<Arc<Session>>,
}

impl Shared {
    /// The state for an executor serving `workspace`.
    pub fn new(
        settings: Settings,
        workspace: workspace::Workspace,
        child_env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
    ) -> Self {
        Self {
            settings,
            workspace: Arc::new(workspace),
            child_env: Arc::new(child_env),
            stamp: stamp::StampKey::random(),
            session: OnceLock::new(),
        }
    }

    /// The connection's session; a request before `initialize` gets the
    /// command line's read limit.
    pub fn session(&self) -> &Arc<Session> {
        self.session
            .get_or_init(|| self.make_session(self.settings.max_read_bytes))
    }

    fn make_session(&self, max_read_bytes: u64) -> Arc<Session> {
        let context = Arc::new(Context {
            workspace: Arc::clone(&self.workspace),
            child_env: Arc::clone(&self.child_env),
            stamp: self.stamp.clone(),
            max_read_bytes,
            bash_output: self.settings.bash_output,
        });
        Arc::new(Session {
            processes: Processes::new(Arc::clone(&context)),
            context,
        })
    }

    /// The capability object under [`EXECUTOR_KEY`].
    fn executor_capability(&self) -> Value {
        let mut descriptor = Map::new();
        descriptor.insert("kind".to_owned(), json!(self.settings.kind));
        if !self.settings.reference.is_empty() {
            descriptor.insert("ref".to_owned(), json!(self.settings.reference));
        }
        descriptor.insert(
            "root".to_owned(),
            json!(self.workspace.root().to_string_lossy()),
        );
        let tools: Vec<Value> = TOOLS
            .iter()
            .map(|tool| {
                let mut entry = json!({"name": tool.name, "extension": tool.extension});
                if tool.read_only {
                    entry["readOnly"] = json!(true);
                }
                entry["facts"] = json!(true);
                entry
            })
            .collect();
        json!({
            "version": 1,
            "descriptor": descriptor,
            "extensions": EXTENSIONS,
            "tools": tools,
            "files": {"uriTemplate": files::URI_TEMPLATE},
            "start": {"maxProcesses": 32, "maxWriteBytes": 1_048_576, "maxReadBytes": 65_536},
            // Not `session()`: describing the executor must not fix the read
            // limit before the client's `initialize` has asked for one.
            "maxReadBytes": self
                .session
                .get()
                .map_or(self.settings.max_read_bytes, |session| session.context.max_read_bytes),
        })
    }
}

/// The rmcp handler.
#[derive(Clone)]
pub(crate) struct Executor {
    shared: Arc<Shared>,
}

impl Executor {
    /// A handler over `shared`.
    pub fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    fn context(&self) -> Arc<Context> {
        Arc::clone(&self.shared.session().context)
    }
}

/// The versions served: `initialize` agrees to the handshake era's
/// (`box_jsonrpc::PROTOCOL_VERSIONS`, as the host's: a test holds them
/// equal), and a request of the stateless revision (2026-07-28) naming its
/// version in `_meta` is served without one, as rmcp serves it.
fn supported_versions() -> &'static [ProtocolVersion] {
    ProtocolVersion::known_up_to(&ProtocolVersion::V_2026_07_28)
}

/// The read limit a client asks for under the executor key, if any; one
/// that is not a positive integer is refused as `box serve` refuses it
/// (`box_jsonrpc::asked_max_read_bytes`), never taken for no ask.
fn asked_max_read_bytes(request: &InitializeRequestParams) -> Result<Option<u64>, McpError> {
    let asked = request
        .capabilities
        .experimental
        .as_ref()
        .and_then(|experimental| experimental.get(EXECUTOR_KEY))
        .and_then(|ask| ask.get("maxReadBytes"));
    box_jsonrpc::asked_max_read_bytes(asked)
        .map_err(|why| McpError::new(ErrorCode::INVALID_PARAMS, why, None))
}

impl ServerHandler for Executor {
    fn get_info(&self) -> ServerConfig {
        let capabilities = json!({
            "tools": {"listChanged": false},
            "resources": {"listChanged": false},
            "experimental": {
                FACTS_KEY: {},
                EXECUTOR_KEY: self.shared.executor_capability(),
            },
        });
        let capabilities: ServerCapabilities =
            serde_json::from_value(capabilities).unwrap_or_default();
        InitializeResult::new(capabilities)
            .with_server_info(Implementation::new("box", env!("CARGO_PKG_VERSION")))
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(supported_versions())
    }

    async fn discover(
        &self,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::DiscoverResult, McpError> {
        // The stateless revision's discover (a probe without its `_meta` is
        // refused by the transport, as `box serve` refuses it): the
        // executor's capability goes under its key in the revision's
        // extensions, as it goes under `experimental` at initialize.
        let info = serde_json::to_value(self.get_info()).unwrap_or_default();
        let mut capabilities = info.get("capabilities").cloned().unwrap_or_default();
        capabilities["extensions"] = json!({EXECUTOR_KEY: self.shared.executor_capability()});
        let result = json!({
            "resultType": "complete",
            "supportedVersions": supported_versions(),
            "capabilities": capabilities,
            "ttlMs": 0,
            "cacheScope": "private",
            "_meta": {box_jsonrpc::era::META_SERVER_INFO: info.get("serverInfo")},
        });
        serde_json::from_value(result).map_err(|error| {
            McpError::new(
                ErrorCode::INTERNAL_ERROR,
                format!("server/discover: building the answer: {error}"),
                None,
            )
        })
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        let cap = self.shared.settings.max_read_bytes;
        let effective = asked_max_read_bytes(&request)?.map_or(cap, |asked| asked.min(cap));
        context.peer.set_peer_info(request.clone());
        if self
            .shared
            .session
            .set(self.shared.make_session(effective))
            .is_err()
        {
            tracing::warn!("initialize after the session started; keeping its read limit");
        }
        tracing::info!(
            client = %request.client_info.name,
            max_read_bytes = self.shared.session().context.max_read_bytes,
            "client connected"
        );
        self.negotiate_initialize(&request)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let max_read_bytes = self.shared.session().context.max_read_bytes;
        let listed: Vec<Value> = TOOLS
            .iter()
            .map(|tool| {
                json!({
                    "name": tool.name,
                    "description": tools::description(tool, max_read_bytes),
                    "inputSchema": tools::input_schema(tool),
                    "_meta": {TOOL_META_KEY: tools::listing_flags(tool)},
                })
            })
            .collect();
        let listed: Vec<Tool> = serde_json::from_value(Value::Array(listed))
            .map_err(|e| McpError::internal_error(format!("tool listing: {e}"), None))?;
        Ok(ListToolsResult::with_all_items(listed))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let arguments = request.arguments.unwrap_or_default();
        let (progress, forwarder) = match context.meta.get_progress_token() {
            Some(token) if request.name == "bash" => {
                let (sender, mut receiver) = tokio::sync::mpsc::channel::<String>(PROGRESS_BUFFER);
                let peer = context.peer.clone();
                let forwarder = tokio::spawn(async move {
                    let mut count = 0.0;
                    while let Some(message) = receiver.recv().await {
                        count += 1.0;
                        let update = ProgressNotificationParam::new(token.clone(), count)
                            .with_message(message);
                        if peer.notify_progress(update).await.is_err() {
                            break;
                        }
                    }
                });
                (Some(sender), Some(forwarder))
            }
            _ => (None, None),
        };
        let outcome = tools::call(
            &self.context(),
            &request.name,
            arguments,
            progress,
            context.ct.clone(),
        )
        .await;
        if let Some(forwarder) = forwarder {
            // Progress precedes the result; the sender is gone, so this ends.
            let _ = forwarder.await;
        }
        let Some(outcome) = outcome else {
            return Err(McpError::invalid_params(
                format!("unknown tool {}", Value::String(request.name.into_owned())),
                None,
            ));
        };
        Ok(CallToolResponse::Complete(call_result(outcome)))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        let template = serde_json::from_value(files::template())
            .map_err(|e| McpError::internal_error(format!("resource template: {e}"), None))?;
        Ok(ListResourceTemplatesResult::with_all_items(vec![template]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let context = self.context();
        let uri = request.uri;
        let text = {
            let uri = uri.clone();
            tokio::task::spawn_blocking(move || files::read(&context.workspace, &uri))
                .await
                .map_err(|e| McpError::internal_error(format!("files: {e}"), None))?
        };
        let result: ReadResourceResult = serde_json::from_value(json!({
            "contents": [{"uri": uri, "mimeType": "application/json", "text": text}],
        }))
        .map_err(|e| McpError::internal_error(format!("files: {e}"), None))?;
        Ok(ReadResourceResponse::Complete(
            result.with_cache_scope(rmcp::model::CacheScope::Private),
        ))
    }

    async fn on_custom_request(
        &self,
        request: CustomRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, McpError> {
        let CustomRequest { method, params, .. } = request;
        if let Some(op) = method.strip_prefix(METHOD_PREFIX) {
            let session = Arc::clone(self.shared.session());
            return session
                .processes
                .handle(op, params.unwrap_or(Value::Object(Map::new())))
                .await
                .map(CustomResult::new)
                .map_err(|error| McpError::new(ErrorCode::INTERNAL_ERROR, error.0, None));
        }
        if method == RESIZE_METHOD {
            return self
                .shared
                .session()
                .processes
                .resize(params.unwrap_or(Value::Object(Map::new())))
                .map(CustomResult::new)
                .map_err(|error| McpError::new(ErrorCode::INTERNAL_ERROR, error.0, None));
        }
        match method.as_str() {
            "execution/facts" => {
                let calls = batch::parse_calls(params.as_ref())
                    .map_err(|e| McpError::invalid_params(e, None))?;
                let context = self.context();
                let results = tokio::task::spawn_blocking(move || facts_results(&context, &calls))
                    .await
                    .map_err(|e| McpError::internal_error(format!("facts: {e}"), None))?;
                Ok(CustomResult::new(json!({"results": results})))
            }
            "execution/batch" => {
                let calls = batch::parse_calls(params.as_ref())
                    .map_err(|e| McpError::invalid_params(e, None))?;
                let results = batch::run(&self.context(), calls, context.ct.clone()).await;
                Ok(CustomResult::new(json!({"results": results})))
            }
            // rmcp hands a standard method whose params did not parse to the
            // custom handler: that is a params error, not an unknown method.
            standard if STANDARD_METHODS.contains(&standard) => Err(McpError::invalid_params(
                format!(
                    "{method}: the params do not fit the method (wrong field types or missing fields)"
                ),
                None,
            )),
            _ => Err(McpError::new(ErrorCode::METHOD_NOT_FOUND, method, None)),
        }
    }
}

/// One facts answer per call, in the order asked.
fn facts_results(context: &Context, calls: &[batch::Call]) -> Vec<Value> {
    calls
        .iter()
        .map(|call| {
            let answer = match &call.arguments {
                Err(message) => Err(message.clone()),
                Ok(arguments) => match tools::facts(context, &call.name, arguments) {
                    None => Err(format!("unknown tool {}", Value::String(call.name.clone()))),
                    Some(result) => result,
                },
            };
            match answer {
                Ok(facts) => json!({"facts": facts, "replay": "unknown"}),
                Err(error) => json!({"error": error, "replay": "unknown"}),
            }
        })
        .collect()
}

fn call_result(outcome: ToolOutcome) -> CallToolResult {
    let content = vec![ContentBlock::text(outcome.text)];
    if outcome.is_error {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_executor_serves_the_versions_the_host_does() {
        let versions: Vec<&str> = super::supported_versions()
            .iter()
            .map(|version| version.as_str())
            .collect();
        assert_eq!(versions, box_jsonrpc::era::all_versions());
    }
}
