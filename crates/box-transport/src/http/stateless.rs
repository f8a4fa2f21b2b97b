//! MCP 2026-07-28 (stateless): the mirrored `Mcp-Method`/`Mcp-Name` headers,
//! handles, the sessions `box/session.open` keeps (and the reattach to them),
//! one-shot sessions and the input-required retry.

use super::*;

/// A JSON-RPC error answered with an HTTP status.
pub(super) fn refuse_with(
    status: StatusCode,
    id: Value,
    code: i64,
    message: impl Into<String>,
) -> Response {
    json_response(status, error_response(id, code, message))
}

/// `Mcp-Name`'s value as sent: plain, or `=?base64?…?=` for a name that is
/// not plain printable ASCII; `None` when the base64 form is malformed.
pub(super) fn header_name(value: &str) -> Option<String> {
    use base64::Engine as _;
    match value
        .strip_prefix("=?base64?")
        .and_then(|rest| rest.strip_suffix("?="))
    {
        Some(encoded) => base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok()),
        None => Some(value.to_owned()),
    }
}

/// 2026-07-28's header mirroring: `MCP-Protocol-Version` (when sent) as
/// `_meta` names it, `Mcp-Method` as the body's method, and for
/// `tools/call`, `prompts/get` and `resources/read` `Mcp-Name` as the name
/// or URI in the body (the tasks extension's methods: the task's id). A header missing, malformed or disagreeing is -32020.
pub(super) fn check_mirrored(
    headers: &HeaderMap,
    method: &str,
    message: &Value,
) -> Result<(), String> {
    let text = |name: &str, shown: &str| -> Result<Option<String>, String> {
        match headers.get(name) {
            None => Ok(None),
            Some(value) => value
                .to_str()
                .map(|text| Some(text.to_owned()))
                .map_err(|_| format!("the {shown} header is not ASCII text")),
        }
    };
    let version = box_jsonrpc::era::request_version(message).unwrap_or("");
    if let Some(header) = text(VERSION_HEADER, "MCP-Protocol-Version")?
        && header != version
    {
        return Err(format!(
            "the MCP-Protocol-Version header says {header:?} but _meta[\"{}\"] says {version:?}; send the same in both",
            box_jsonrpc::era::META_PROTOCOL_VERSION
        ));
    }
    match text(METHOD_HEADER, "Mcp-Method")? {
        None => {
            return Err(format!(
                "the Mcp-Method header is missing; send `Mcp-Method: {method}` (MCP 2026-07-28 mirrors the method in a header)"
            ));
        }
        Some(header) if header != method => {
            return Err(format!(
                "the Mcp-Method header says {header:?} but the body's method is {method:?}; send the same in both"
            ));
        }
        Some(_) => {}
    }
    let key = match method {
        "tools/call" | "prompts/get" => "name",
        "resources/read" => "uri",
        // The tasks extension routes on the task's id.
        "tasks/get" | "tasks/update" | "tasks/cancel" => "taskId",
        _ => return Ok(()),
    };
    let body = box_jsonrpc::params(message)
        .and_then(|params| params.get(key))
        .and_then(Value::as_str)
        .unwrap_or("");
    match text(NAME_HEADER, "Mcp-Name")? {
        None => Err(format!(
            "the Mcp-Name header is missing; {method} mirrors params.{key} ({body:?}) in it"
        )),
        Some(header) => match header_name(&header) {
            None => Err(format!(
                "the Mcp-Name header {header:?} is not valid =?base64?…?= text"
            )),
            Some(name) if name != body => Err(format!(
                "the Mcp-Name header says {name:?} but params.{key} is {body:?}; send the same in both"
            )),
            Some(_) => Ok(()),
        },
    }
}

/// The handle a stateless request carries: the `Box-Session` header
/// (`ID:SECRET`), put in the body's `_meta["box/session"]` for the host to
/// check, or `_meta["box/session"]` itself. The session's id, if any.
pub(super) fn take_handle(
    headers: &HeaderMap,
    message: &mut Value,
) -> Result<Option<String>, String> {
    let meta_key = box_jsonrpc::era::SESSION_META;
    let in_body = box_jsonrpc::params(message)
        .and_then(|params| params.get("_meta"))
        .and_then(|meta| meta.get(meta_key))
        .cloned();
    let header = match ask_header(headers, HANDLE_HEADER, "Box-Session")? {
        None => None,
        Some(part) => {
            let Some((id, secret)) = part.text.split_once(':') else {
                return Err(
                    "the Box-Session header must be ID:SECRET, as box/session.open answered them"
                        .to_owned(),
                );
            };
            Some(json!({"id": id.trim(), "secret": secret.trim()}))
        }
    };
    let handle = match (header, in_body) {
        (Some(header), Some(body)) if header != body => {
            return Err(format!(
                "the Box-Session header and _meta[\"{meta_key}\"] name different sessions; send one"
            ));
        }
        (Some(header), _) => {
            if let Some(params) = box_jsonrpc::params_mut(message) {
                let meta = params.entry("_meta").or_insert_with(|| json!({}));
                if let Some(meta) = meta.as_object_mut() {
                    meta.insert(meta_key.to_owned(), header.clone());
                }
            }
            header
        }
        (None, Some(body)) => body,
        (None, None) => return Ok(None),
    };
    match handle.get("id").and_then(Value::as_str) {
        Some(id) if crate::plausible_session_id(id) => Ok(Some(id.to_owned())),
        _ => Err(format!(
            "_meta[\"{meta_key}\"].id: not a session id box mints; send the id box/session.open answered"
        )),
    }
}

/// A request of MCP 2026-07-28 (stateless): its headers checked against its
/// body, then to the box session its handle names, or, without one, to a
/// session opened for it: `box/session.open` keeps it (the answer names
/// its handle), anything else is served by a session ended after its
/// answer (`server/discover` starts no unit; a tool call runs in a unit
/// removed after it).
pub(super) async fn stateless(
    state: &Arc<AppState>,
    id: Value,
    method: String,
    mut message: Value,
    ask: Result<TransportAsk, String>,
    headers: &HeaderMap,
    accepts: Accepts,
) -> Response {
    if let Some(version) = box_jsonrpc::era::request_version(&message)
        && version != box_jsonrpc::era::STATELESS_VERSION
    {
        return json_response(
            StatusCode::BAD_REQUEST,
            box_jsonrpc::era::unsupported_version(id, version),
        );
    }
    if let Err(why) = check_mirrored(headers, &method, &message) {
        return refuse_with(
            StatusCode::BAD_REQUEST,
            id,
            box_jsonrpc::era::HEADER_MISMATCH,
            why,
        );
    }
    let ask = match ask {
        Ok(ask) => ask,
        Err(why) => return refuse_with(StatusCode::OK, id, code::INVALID_PARAMS, why),
    };
    let handle = match take_handle(headers, &mut message) {
        Ok(handle) => handle,
        Err(why) => return refuse_with(StatusCode::BAD_REQUEST, id, code::INVALID_PARAMS, why),
    };
    if let Some(session_id) = handle {
        let found = match state.lookup_asked(&session_id) {
            Some((session, _, session_ask)) => {
                if let Err(why) = same_ask(&session_ask, &ask) {
                    return refuse_with(StatusCode::BAD_REQUEST, id, code::INVALID_REQUEST, why);
                }
                match session.request(message).await {
                    Ok(stream) => Some((session, stream)),
                    Err(_) => return session_gone(),
                }
            }
            // Not live here: a session a restarted host kept (`--state`)
            // and re-adopted is reattached for this request, with its
            // handle's secret.
            None => reattach(state, &session_id, message, &ask).await,
        };
        let Some((session, stream)) = found else {
            return refuse_with(
                StatusCode::NOT_FOUND,
                id,
                code::INVALID_PARAMS,
                format!(
                    "box/session: no session `{session_id}` on this host (it ended, or never was, or cannot be reattached); open one with box/session.open"
                ),
            );
        };
        let cancel = crate::CancelOnClose {
            session,
            id: id.clone(),
            armed: true,
        };
        return answer_of(stream, accepts, Some((&method, cancel))).await;
    }
    // The retry of a call without a handle that answered "input required":
    // to the session kept for it, which its request state names (the
    // session checks the state's seal).
    if let Some(kept) = retried_session(&message)
        && let Some((session, _, _)) = state.lookup_asked(&kept)
    {
        let Ok(stream) = session.request(message).await else {
            return session_gone();
        };
        let one_shot = OneShot {
            state: state.clone(),
            session_id: kept,
            handle: session,
            ask,
            permit: None,
        };
        return answer_stateless(stream, accepts, method, one_shot).await;
    }
    // A discover starts no unit: it takes no place among the sessions.
    let permit = if method == "server/discover" {
        None
    } else {
        match state.permits.clone().try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) => {
                return refuse_with(
                    StatusCode::SERVICE_UNAVAILABLE,
                    id,
                    code::INTERNAL_ERROR,
                    format!(
                        "this host serves at most {} sessions at once; try again later",
                        state.options.max_sessions
                    ),
                );
            }
        }
    };
    // `box/session.open`, or its tool form: the session is kept.
    let opens = method == "box/session.open"
        || (method == "tools/call"
            && box_jsonrpc::params(&message)
                .and_then(|params| params.get("name"))
                .and_then(Value::as_str)
                == Some("box_session_open"));
    let session_id = mint_session_id();
    let (general_tx, _) = mpsc::channel(1);
    let handle =
        state
            .sessions_factory
            .open(session_id.clone(), ask.clone(), general_tx, &state.shutdown);
    let Ok(stream) = handle.request(message).await else {
        end_after(handle, permit);
        return session_gone();
    };
    if !opens {
        let one_shot = OneShot {
            state: state.clone(),
            session_id,
            handle,
            ask,
            permit,
        };
        return answer_stateless(stream, accepts, method, one_shot).await;
    }
    let Ok(mut response) = stream.response.await else {
        end_after(handle, permit);
        return refuse_with(
            StatusCode::OK,
            id,
            code::INTERNAL_ERROR,
            "the session ended while starting",
        );
    };
    let Some(permit) = permit else {
        handle.end();
        return json_response(StatusCode::OK, response);
    };
    let refused = response.get("result").is_none()
        || response.pointer("/result/isError") == Some(&Value::Bool(true));
    if refused {
        // Refused (a tightening, a profile) or failed (a unit that did not start).
        end_holding(handle, permit);
        return json_response(StatusCode::OK, response);
    }
    box_jsonrpc::era::complete_result(&method, &mut response);
    keep(state, session_id, &handle, ask, permit);
    json_response(StatusCode::OK, response)
}

/// Reattach the session `session_id` a restarted host re-adopted for
/// `message`, the request carrying its handle: the session is started to
/// reattach (`SessionFactory::reattach`), `message` its first request, and
/// the host reattaches it within that request (the request's span is the
/// reattach's parent) with the handle's secret before serving it. Once the
/// session says it opened, it is kept as one `box/session.open` opened, and
/// the request's answer is to come on the stream. Refused (a wrong secret,
/// nothing to reattach), its answer is dropped and the session ended: `None`.
pub(super) async fn reattach(
    state: &Arc<AppState>,
    session_id: &str,
    message: Value,
    ask: &TransportAsk,
) -> Option<(SessionHandle, ReplyStream)> {
    // A handle without a secret reattaches nothing.
    box_jsonrpc::params(&message)?
        .get("_meta")?
        .get(box_jsonrpc::era::SESSION_META)?
        .get("secret")?;
    let permit = state.permits.clone().try_acquire_owned().ok()?;
    let (general_tx, _) = mpsc::channel(1);
    let handle = state.sessions_factory.reattach(
        session_id.to_owned(),
        ask.clone(),
        general_tx,
        &state.shutdown,
    );
    let Ok(mut stream) = handle.request(message).await else {
        end_holding(handle, permit);
        return None;
    };
    // Opened, the session says so before it serves the request; refused,
    // the request is answered (or dropped) and the session never opens.
    let opened = tokio::select! {
        biased;
        () = handle.opened() => true,
        _ = &mut stream.response => false,
    };
    if !opened {
        end_holding(handle, permit);
        return None;
    }
    keep(state, session_id.to_owned(), &handle, ask.clone(), permit);
    Some((handle, stream))
}

/// Keep `handle` as the live session `session_id` until it ends.
pub(super) fn keep(
    state: &Arc<AppState>,
    session_id: String,
    handle: &SessionHandle,
    ask: TransportAsk,
    permit: OwnedSemaphorePermit,
) {
    if let Ok(mut sessions) = state.sessions.lock() {
        sessions.insert(
            session_id.clone(),
            Entry {
                handle: handle.clone(),
                general: Arc::new(Mutex::new(None)),
                ask,
                _permit: permit,
            },
        );
    }
    let watcher_state = state.clone();
    let watched = handle.clone();
    tokio::spawn(async move {
        watched.ended().await;
        if let Ok(mut sessions) = watcher_state.sessions.lock() {
            sessions.remove(&session_id);
        }
    });
}

/// End a session served for one stateless request, holding its place under
/// `--max-sessions` (when it took one) until its units are removed.
pub(super) fn end_after(handle: SessionHandle, permit: Option<OwnedSemaphorePermit>) {
    match permit {
        Some(permit) => end_holding(handle, permit),
        None => handle.end(),
    }
}

/// The session served for one stateless request without a handle.
pub(super) struct OneShot {
    pub(super) state: Arc<AppState>,
    pub(super) session_id: String,
    pub(super) handle: SessionHandle,
    pub(super) ask: TransportAsk,
    /// Its place under `--max-sessions`; `None` once the session is kept
    /// (the kept entry holds it).
    pub(super) permit: Option<OwnedSemaphorePermit>,
}

/// The session a request's `requestState` names (`box1.SESSION.…`, as the
/// host seals it): the retry of a call answered "input required".
pub(super) fn retried_session(message: &Value) -> Option<String> {
    let text = box_jsonrpc::params(message)?
        .get("requestState")?
        .as_str()?;
    let mut parts = text.split('.');
    let session = (parts.next() == Some("box1")).then(|| parts.next())??;
    crate::plausible_session_id(session).then(|| session.to_owned())
}

/// Answer a stateless request ([`answer`]'s forms), its answer completed in
/// the revision's form; `one_shot`: the session served for it alone, ended
/// once the answer is out, unless the answer is "input required": then the
/// session is kept (its call waits in it) until a retry's answer is not.
pub(super) async fn answer_stateless(
    stream: ReplyStream,
    accepts: Accepts,
    method: String,
    one_shot: OneShot,
) -> Response {
    let (out_tx, mut out_rx) = mpsc::channel(box_jsonrpc::REPLY_EVENTS);
    tokio::spawn(async move {
        let watch = out_tx.clone();
        // A client that closes the stream cancels the request (2026-07-28):
        // its session ends, and with it the call in its unit.
        let asks = tokio::select! {
            (_, asks) = crate::forward_reply_seen(stream, out_tx, Some(&method)) => asks,
            () = watch.closed() => false,
        };
        drop(watch);
        let OneShot {
            state,
            session_id,
            handle,
            ask,
            permit,
        } = one_shot;
        match (asks, permit) {
            (true, Some(permit)) => keep(&state, session_id, &handle, ask, permit),
            (true, None) => {}
            (false, permit) => end_after(handle, permit),
        }
    });
    let first = loop {
        match out_rx.recv().await {
            None => return unanswered(accepts),
            Some(message) if crate::is_answer(&message) => break Err(message),
            Some(event) if accepts.sse => break Ok(event),
            // A client that takes no streams cannot be sent what would stream.
            Some(_) => {}
        }
    };
    let first = match first {
        Err(response) if accepts.json => return json_response(StatusCode::OK, response),
        Err(response) | Ok(response) => response,
    };
    let (sse_tx, sse_rx) = mpsc::channel(box_jsonrpc::REPLY_EVENTS);
    let _ = sse_tx.send(first).await;
    tokio::spawn(async move {
        while let Some(message) = out_rx.recv().await {
            if sse_tx.send(message).await.is_err() {
                return;
            }
        }
    });
    sse(sse_rx)
}

/// 404 for a session that ended while its request was on the way.
pub(super) fn session_gone() -> Response {
    refuse(
        StatusCode::NOT_FOUND,
        code::INVALID_REQUEST,
        "the session has ended",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use box_jsonrpc::session::Inbound;

    /// A factory whose sessions reattach (or refuse) the first request they
    /// get, and say what that request was.
    struct Reattaching {
        /// Whether the reattach succeeds.
        agrees: bool,
        /// The first request each session got.
        seen: mpsc::UnboundedSender<Value>,
        /// Cancelled by each session when it ends.
        ended: CancellationToken,
    }

    impl SessionFactory for Reattaching {
        fn open(
            &self,
            _id: String,
            _ask: TransportAsk,
            _general: mpsc::Sender<Value>,
            _shutdown: &CancellationToken,
        ) -> SessionHandle {
            unreachable!("a request with a handle opens no fresh session")
        }
        fn reattach(
            &self,
            id: String,
            _ask: TransportAsk,
            _general: mpsc::Sender<Value>,
            _shutdown: &CancellationToken,
        ) -> SessionHandle {
            let (inbound_tx, mut inbound) = mpsc::channel(8);
            let (cancel, done, opened) = (
                CancellationToken::new(),
                CancellationToken::new(),
                CancellationToken::new(),
            );
            let handle = SessionHandle::new(
                id,
                inbound_tx,
                cancel.clone(),
                done.clone(),
                opened.clone(),
                Arc::default(),
            );
            let (agrees, seen, ended) = (self.agrees, self.seen.clone(), self.ended.clone());
            tokio::spawn(async move {
                let mut first = true;
                loop {
                    let message = tokio::select! {
                        () = cancel.cancelled() => break,
                        message = inbound.recv() => message,
                    };
                    let Some(Inbound::Request(message, reply)) = message else {
                        break;
                    };
                    let id = message["id"].clone();
                    if std::mem::take(&mut first) {
                        let _ = seen.send(message);
                        if !agrees {
                            reply.answer(error_response(
                                id,
                                code::INVALID_PARAMS,
                                "box.reattach.secret: not the secret",
                            ));
                            continue;
                        }
                        opened.cancel();
                    }
                    reply.answer(json!({"jsonrpc": "2.0", "id": id, "result": {"ran": true}}));
                }
                ended.cancel();
                done.cancel();
            });
            handle
        }
        fn end_wait(&self) -> Duration {
            Duration::ZERO
        }
        fn sessions_running(&self) -> usize {
            0
        }
        fn metrics(&self) -> (&'static str, String) {
            ("text/plain", String::new())
        }
        fn readiness(&self) -> futures::future::BoxFuture<'_, Result<(), String>> {
            Box::pin(async { Ok(()) })
        }
        fn units_left(&self, _id: &str) -> Vec<crate::UnitLeft> {
            Vec::new()
        }
        fn refused(&self, _refusal: &Refusal) {}
    }

    async fn call_with_handle(state: &Arc<AppState>, id: u64) -> (StatusCode, Value) {
        let handle = json!({"id": "kept-session", "secret": "s3cret"});
        let message = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "bash", "arguments": {}, "_meta": {
                box_jsonrpc::era::META_PROTOCOL_VERSION: box_jsonrpc::era::STATELESS_VERSION,
                box_jsonrpc::era::SESSION_META: handle}}});
        let mut headers = HeaderMap::new();
        headers.insert(METHOD_HEADER, HeaderValue::from_static("tools/call"));
        headers.insert(NAME_HEADER, HeaderValue::from_static("bash"));
        let accepts = Accepts {
            json: true,
            sse: false,
        };
        let response = stateless(
            state,
            json!(id),
            "tools/call".to_owned(),
            message,
            Ok(TransportAsk::default()),
            &headers,
            accepts,
        )
        .await;
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, serde_json::from_slice(&body).unwrap())
    }

    fn state_of(
        agrees: bool,
    ) -> (
        Arc<AppState>,
        mpsc::UnboundedReceiver<Value>,
        CancellationToken,
    ) {
        let (seen, seen_rx) = mpsc::unbounded_channel();
        let ended = CancellationToken::new();
        let factory = Reattaching {
            agrees,
            seen,
            ended: ended.clone(),
        };
        let options = HttpOptions::loopback();
        let state = Arc::new(AppState {
            sessions_factory: Arc::new(factory),
            permits: Arc::new(Semaphore::new(options.max_sessions)),
            options,
            sessions: Mutex::new(HashMap::new()),
            shutdown: CancellationToken::new(),
        });
        (state, seen_rx, ended)
    }

    /// A request carrying the handle of a session not live here is itself
    /// the first request of the session started to reattach it (no open is
    /// made up for it); once the session says it opened, it is kept under
    /// its id and the request's answer is the client's.
    #[tokio::test]
    async fn the_request_with_the_handle_is_the_reattaching_sessions_first() {
        let (state, mut seen, _ended) = state_of(true);
        let (status, answer) = call_with_handle(&state, 7).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_eq!(answer["result"]["ran"], json!(true), "{answer}");
        let first = seen.try_recv().unwrap();
        assert_eq!(first["method"], json!("tools/call"), "{first}");
        assert_eq!(first["id"], json!(7), "{first}");
        assert!(state.lookup("kept-session").is_some(), "kept under its id");
        let (status, answer) = call_with_handle(&state, 8).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert!(
            seen.try_recv().is_err(),
            "the next request goes to the kept session"
        );
    }

    /// Refused (a wrong secret, nothing to reattach): the session's answer
    /// is dropped for today's 404, and the session ended, never kept.
    #[tokio::test]
    async fn a_refused_reattach_is_404_and_its_session_ends() {
        let (state, mut seen, ended) = state_of(false);
        let (status, answer) = call_with_handle(&state, 7).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("no session `kept-session` on this host"),
            "{answer}"
        );
        assert_eq!(seen.try_recv().unwrap()["method"], json!("tools/call"));
        tokio::time::timeout(Duration::from_secs(5), ended.cancelled())
            .await
            .expect("the refused session ends");
        assert!(state.lookup("kept-session").is_none());
    }
}
