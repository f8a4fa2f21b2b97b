//! The handshake era (2024-11-05 to 2025-11-25): POST (`initialize`, the
//! messages of a session, batches), GET (the general stream) and DELETE.

use super::*;

pub(super) async fn post_mcp(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    post_message(state, None, headers, body).await
}

/// POST on `/mcp/p/{profile}`: `/mcp`, asking for `profile`.
pub(super) async fn post_mcp_profile(
    State(state): State<Arc<AppState>>,
    Path(profile): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    post_message(state, Some(profile), headers, body).await
}

pub(super) async fn post_message(
    state: Arc<AppState>,
    path_profile: Option<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let path = match &path_profile {
        Some(profile) => format!("/mcp/p/{profile}"),
        None => "/mcp".to_owned(),
    };
    if let Err(response) = state.check(&headers, &path, Auth::Required) {
        return response;
    }
    let accepts = Accepts::from_headers(&headers);
    if !accepts.json && !accepts.sse {
        return refuse(
            StatusCode::NOT_ACCEPTABLE,
            code::INVALID_REQUEST,
            "Accept must allow application/json or text/event-stream (clients send both)",
        );
    }
    let message = match read_body(&state.options, &headers, body).await {
        Ok(message) => message,
        Err(response) => return response,
    };
    // A batch is refused or split once the session's version is known.
    let kind = match classify(&message) {
        Ok(kind) => Some(kind),
        Err(MessageError::Batch) => None,
        Err(error) => return json_response(StatusCode::BAD_REQUEST, refusal(&message, &error)),
    };
    let ask = transport_ask(path_profile.as_deref(), &headers);
    // MCP 2026-07-28: no session header, the version in each request's `_meta`.
    if session_header(&headers).is_none()
        && let Some(Kind::Request { id, method }) = &kind
        && (box_jsonrpc::era::request_version(&message).is_some()
            || headers.contains_key(HANDLE_HEADER))
    {
        let (id, method) = (id.clone(), method.clone());
        return stateless(&state, id, method, message, ask, &headers, accepts).await;
    }
    let Some(session_id) = session_header(&headers) else {
        return match kind {
            Some(Kind::Request { id, method }) if method == "initialize" => match ask {
                Ok(ask) => match crate::reattach_id(&message).or_else(|| {
                    // The header form, `SESSION:SECRET`.
                    let part = ask.reattach.as_ref()?;
                    let (id, _) = part.text.split_once(':')?;
                    let id = id.trim();
                    crate::plausible_session_id(id).then(|| id.to_owned())
                }) {
                    Some(session_id) if state.lookup(&session_id).is_some() => json_response(
                        StatusCode::OK,
                        error_response(
                            id,
                            code::INVALID_PARAMS,
                            format!(
                                "box.reattach.session: session `{session_id}` is live on this host; send its requests with its Mcp-Session-Id instead of reattaching"
                            ),
                        ),
                    ),
                    reattach => initialize(&state, id, message, ask, reattach).await,
                },
                // Answered as the host answers a bad capability ask.
                Err(why) => json_response(
                    StatusCode::OK,
                    error_response(id, code::INVALID_PARAMS, why),
                ),
            },
            // A dual-era client's probe: a clean "method not found", nothing started.
            Some(Kind::Request { id, method }) if method == "server/discover" => {
                json_response(StatusCode::OK, discover_refusal(id))
            }
            None => json_response(
                StatusCode::BAD_REQUEST,
                refusal(&message, &MessageError::Batch),
            ),
            Some(_) => refuse(
                StatusCode::BAD_REQUEST,
                code::INVALID_REQUEST,
                "Mcp-Session-Id is missing: send initialize first",
            ),
        };
    };
    let Some((session, _, session_ask)) = state.lookup_asked(&session_id) else {
        return refuse(
            StatusCode::NOT_FOUND,
            code::INVALID_REQUEST,
            "no such session (it ended, or never was); initialize again",
        );
    };
    if let Err(why) = ask.and_then(|ask| same_ask(&session_ask, &ask)) {
        return refuse(StatusCode::BAD_REQUEST, code::INVALID_REQUEST, why);
    }
    // The version initialize agreed to governs: its clients send the header
    // from 2025-06-18 on, and only 2025-03-26 has batches.
    let version = session
        .protocol_version()
        .unwrap_or(box_jsonrpc::LATEST_PROTOCOL_VERSION);
    let need = if sends_version_header(version) {
        Version::Required
    } else {
        Version::Optional
    };
    if let Err(response) = check_version(&headers, need) {
        return response;
    }
    let Some(kind) = kind else {
        return match message {
            Value::Array(messages) if allows_batches(version) => {
                batch(&session, messages, accepts).await
            }
            message => json_response(
                StatusCode::BAD_REQUEST,
                refusal(&message, &MessageError::Batch),
            ),
        };
    };
    match kind {
        Kind::Request { .. } => match session.request(message).await {
            Ok(stream) => answer(stream, accepts).await,
            Err(_) => session_gone(),
        },
        Kind::Notification { .. } | Kind::Response { .. } => match session.notify(message).await {
            Ok(()) => StatusCode::ACCEPTED.into_response(),
            Err(_) => session_gone(),
        },
    }
}

/// A batch on a session whose version has them (2025-03-26): each message
/// routed as if POSTed alone, the answers (none for notifications and
/// responses) in one array, or as SSE once something streams before them.
pub(super) async fn batch(
    session: &SessionHandle,
    messages: Vec<Value>,
    accepts: Accepts,
) -> Response {
    if messages.is_empty() {
        return refuse(
            StatusCode::BAD_REQUEST,
            code::INVALID_REQUEST,
            "an empty batch: send at least one message",
        );
    }
    let Ok(crate::Batch {
        mut answers,
        replies: mut out_rx,
        mut pending,
    }) = crate::route_batch(session, messages).await
    else {
        return session_gone();
    };
    if answers.is_empty() && pending == 0 {
        return StatusCode::ACCEPTED.into_response();
    }
    while pending > 0 {
        let Some(message) = out_rx.recv().await else {
            // The rest were cancelled: they get no answer.
            break;
        };
        if crate::is_answer(&message) {
            answers.push(message);
            pending -= 1;
            continue;
        }
        // Something streams before the answers: the rest goes as SSE.
        if !accepts.sse {
            continue;
        }
        let (sse_tx, sse_rx) = mpsc::channel(box_jsonrpc::REPLY_EVENTS);
        tokio::spawn(async move {
            for message in answers.into_iter().chain([message]) {
                if sse_tx.send(message).await.is_err() {
                    return;
                }
            }
            while let Some(message) = out_rx.recv().await {
                if sse_tx.send(message).await.is_err() {
                    return;
                }
            }
        });
        return sse(sse_rx);
    }
    if answers.is_empty() {
        return unanswered(accepts);
    }
    if !accepts.json {
        let (sse_tx, sse_rx) = mpsc::channel(1);
        let _ = sse_tx.try_send(Value::Array(answers));
        return sse(sse_rx);
    }
    json_response(StatusCode::OK, Value::Array(answers))
}

pub(super) async fn initialize(
    state: &Arc<AppState>,
    id: Value,
    message: Value,
    ask: TransportAsk,
    reattach: Option<String>,
) -> Response {
    let Ok(permit) = state.permits.clone().try_acquire_owned() else {
        return json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            error_response(
                id,
                code::INTERNAL_ERROR,
                format!(
                    "this host serves at most {} sessions at once; try again later",
                    state.options.max_sessions
                ),
            ),
        );
    };
    let session_id = reattach.unwrap_or_else(mint_session_id);
    let (general_tx, general_rx) = mpsc::channel(GENERAL_QUEUE);
    let handle =
        state
            .sessions_factory
            .open(session_id.clone(), ask.clone(), general_tx, &state.shutdown);
    let response = match handle.request(message).await {
        Ok(stream) => stream.response.await.ok(),
        Err(_) => None,
    };
    let Some(response) = response else {
        end_holding(handle, permit);
        return json_response(
            StatusCode::OK,
            error_response(id, code::INTERNAL_ERROR, "the session ended while starting"),
        );
    };
    if response.get("result").is_none() {
        // A refused tightening, a unit that failed or did not start in time.
        end_holding(handle, permit);
        return json_response(StatusCode::OK, response);
    }
    if let Ok(mut sessions) = state.sessions.lock() {
        sessions.insert(
            session_id.clone(),
            Entry {
                handle: handle.clone(),
                general: Arc::new(Mutex::new(Some(general_rx))),
                ask,
                _permit: permit,
            },
        );
    }
    // The entry goes when the session ends, however it ends (DELETE, idle, lifetime).
    let watcher_state = state.clone();
    let watcher_id = session_id.clone();
    let watched = handle.clone();
    tokio::spawn(async move {
        watched.ended().await;
        if let Ok(mut sessions) = watcher_state.sessions.lock() {
            sessions.remove(&watcher_id);
        }
    });
    let mut response = json_response(StatusCode::OK, response);
    if let Ok(value) = HeaderValue::from_str(&session_id) {
        response.headers_mut().insert(SESSION_HEADER, value);
    }
    response
}

/// End a session that never became the client's, keeping its place under
/// `--max-sessions` until it has ended: a unit whose start went on past the
/// deadline, or whose removal is not confirmed, still counts.
pub(super) fn end_holding(handle: SessionHandle, permit: OwnedSemaphorePermit) {
    handle.end();
    tokio::spawn(async move {
        handle.ended().await;
        drop(permit);
    });
}

/// The session a GET or DELETE names, after the request checks: 405 for a
/// request of the stateless revision (its `MCP-Protocol-Version`: it has no
/// GET stream and no session DELETE), 400 when `Mcp-Session-Id` is missing,
/// 404 when it names no live session.
pub(super) fn named_session(
    state: &AppState,
    headers: &HeaderMap,
    method: &str,
) -> Result<(String, SessionHandle, GeneralSlot), Response> {
    state.check(headers, "/mcp", Auth::Required)?;
    if headers
        .get(VERSION_HEADER)
        .is_some_and(|version| version.as_bytes() == STATELESS_VERSION.as_bytes())
    {
        let mut response = refuse(
            StatusCode::METHOD_NOT_ALLOWED,
            code::INVALID_REQUEST,
            format!(
                "{method}: MCP {STATELESS_VERSION} has no GET stream and no session DELETE; POST each request (close a box session with box/session.close)"
            ),
        );
        response
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("POST"));
        return Err(response);
    }
    let Some(session_id) = session_header(headers) else {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            code::INVALID_REQUEST,
            "Mcp-Session-Id is missing",
        ));
    };
    let Some((session, slot)) = state.lookup(&session_id) else {
        return Err(refuse(
            StatusCode::NOT_FOUND,
            code::INVALID_REQUEST,
            "no such session",
        ));
    };
    Ok((session_id, session, slot))
}

pub(super) async fn get_mcp(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let (_, _, slot) = match named_session(&state, &headers, "GET") {
        Ok(named) => named,
        Err(response) => return response,
    };
    if let Err(response) = check_version(&headers, Version::Optional) {
        return response;
    }
    if !Accepts::from_headers(&headers).sse {
        return refuse(
            StatusCode::NOT_ACCEPTABLE,
            code::INVALID_REQUEST,
            "Accept must allow text/event-stream: a GET opens a stream",
        );
    }
    let receiver = slot.lock().ok().and_then(|mut slot| slot.take());
    let Some(receiver) = receiver else {
        return refuse(
            StatusCode::CONFLICT,
            code::INVALID_REQUEST,
            "this session already has a GET stream open",
        );
    };
    let general = GeneralStream {
        receiver: Some(receiver),
        slot,
    };
    let events = futures::stream::unfold(general, |mut general| async move {
        let message = general.receiver.as_mut()?.recv().await?;
        let event = Event::default().event("message").data(message.to_string());
        Some((Ok::<_, Infallible>(event), general))
    });
    sse_response(
        Sse::new(events)
            .keep_alive(KeepAlive::default())
            .into_response(),
    )
}

pub(super) async fn delete_mcp(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let (session_id, session, _) = match named_session(&state, &headers, "DELETE") {
        Ok(named) => named,
        Err(response) => return response,
    };
    session.end();
    // `Prefer: respond-async` (RFC 7240): the client does not wait for the
    // removal (`box run --host`); the session keeps its place under
    // --max-sessions until its units are gone, as after a timed-out wait.
    if prefers_async(&headers) {
        return StatusCode::ACCEPTED.into_response();
    }
    // Answer once the units are gone, so "deleted" means deleted.
    if tokio::time::timeout(state.options.delete_wait, session.ended())
        .await
        .is_ok()
    {
        if let Ok(mut sessions) = state.sessions.lock() {
            sessions.remove(&session_id);
        }
        return StatusCode::OK.into_response();
    }
    // Not confirmed: the session keeps its entry (and its place under
    // --max-sessions) until its units are gone; a later DELETE asks again.
    let units_left = state.sessions_factory.units_left(&session_id);
    let left: Vec<String> = units_left
        .iter()
        .map(|unit| unit.description.clone())
        .collect();
    let mut response = json_response(
        StatusCode::SERVICE_UNAVAILABLE,
        json!({"jsonrpc": "2.0", "id": null, "error": {
            "code": code::INTERNAL_ERROR,
            "message": format!(
                "the session is ended, but the removal of its units is not confirmed after {}: {}; box keeps trying, and the session counts against --max-sessions until they are gone (then its id answers 404)",
                humantime::format_duration(state.options.delete_wait),
                if left.is_empty() { "its units are being removed".to_owned() } else { left.join("; ") }
            ),
            "data": {"unitsLeft": units_left.iter().map(|unit| json!({"unit": unit.unit, "id": unit.id})).collect::<Vec<_>>()},
        }}),
    );
    response.headers_mut().insert(
        header::RETRY_AFTER,
        HeaderValue::from(DELETE_RETRY_AFTER_SECS),
    );
    response
}

/// Whether a request's `Prefer` header asks for `respond-async`.
pub(super) fn prefers_async(headers: &HeaderMap) -> bool {
    headers
        .get_all("prefer")
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|preference| {
            preference
                .split(';')
                .next()
                .is_some_and(|name| name.trim().eq_ignore_ascii_case("respond-async"))
        })
}
