//! `/metrics`, `/healthz` and `/readyz`.

use super::*;

pub(super) async fn metrics(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(response) = state.check(&headers, "/metrics", Auth::Required) {
        return response;
    }
    let (content_type, text) = state.sessions_factory.metrics();
    (StatusCode::OK, [(header::CONTENT_TYPE, content_type)], text).into_response()
}

/// A plain-text probe answer.
pub(super) fn probe(status: StatusCode, text: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        text,
    )
        .into_response()
}

/// Liveness: the process answers. Behind the Host and Origin checks of
/// `/mcp`, not the bearer token: it reveals nothing, and a probe carries none.
pub(super) async fn healthz(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(response) = state.check(&headers, "/healthz", Auth::Probe) {
        return response;
    }
    probe(StatusCode::OK, "ok\n".to_owned())
}

/// Readiness: not draining, and the host says its backend answers (503
/// otherwise). Behind the Host and Origin checks of `/mcp`, not the bearer
/// token; why the backend does not answer is said only to a request that
/// carries the token (it may name the engine's socket and the like).
pub(super) async fn readyz(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(response) = state.check(&headers, "/readyz", Auth::Probe) {
        return response;
    }
    if state.shutdown.is_cancelled() {
        return probe(
            StatusCode::SERVICE_UNAVAILABLE,
            "draining: the host is shutting down\n".to_owned(),
        );
    }
    match state.sessions_factory.readiness().await {
        Ok(()) => probe(StatusCode::OK, "ready\n".to_owned()),
        Err(why) if bearer(&state.options, &headers) == Bearer::Valid => {
            probe(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n"))
        }
        Err(_) => probe(
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready (the reason is given with the bearer token)\n".to_owned(),
        ),
    }
}
