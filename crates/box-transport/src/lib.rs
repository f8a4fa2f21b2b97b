//! box's transports: how a client's messages reach a session. stdio (one
//! session per process, newline-delimited JSON-RPC with a bounded line) and
//! streamable HTTP (many sessions, `/mcp`, SSE). The only crate that knows
//! HTTP (axum, hyper), as a server and as the client of a running host
//! (`client`: `box run --host`).
//!
//! A transport hands each client request to its session with a reply channel
//! and carries back what the session answers on it: the events related to the
//! request (progress, a server→client request) and then the one answer.
//!
//! Sessions come from a [`SessionFactory`]; this crate never knows the host,
//! profiles, plans, backends or the command line (the binary turns its flags
//! into [`http::HttpOptions`] and wires the host in as the factory).

pub mod client;
pub mod http;
pub mod stdio;
mod write_timeout;

use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub use box_jsonrpc::session::{AskPart, TransportAsk};
use box_jsonrpc::session::{SessionGone, SessionHandle};
use box_jsonrpc::{Kind, ReplyStream, classify, refusal};

/// Everything a transport needs from whoever runs sessions (the host).
pub trait SessionFactory: Send + Sync + 'static {
    /// Start a session named `id`, with what its transport asked (`ask`:
    /// the HTTP path and `Box-*` headers of its `initialize`, stdio's
    /// flags). Messages for the client that belong to no request go to
    /// `general`; the session ends when every handle is dropped, when the
    /// handle ends it, or when `shutdown` is cancelled.
    fn open(
        &self,
        id: String,
        ask: TransportAsk,
        general: mpsc::Sender<Value>,
        shutdown: &CancellationToken,
    ) -> SessionHandle;

    /// [`Self::open`] for the session `id` a restarted host kept
    /// (`--state`), which the handle of the first request sent to it names
    /// (`_meta["box/session"]`, a stateless request): it is reattached for
    /// that request, within it, and then serves it as an open session
    /// ([`SessionHandle::opened`] resolves first); refused, the request is
    /// answered why and the session opens no more.
    fn reattach(
        &self,
        id: String,
        ask: TransportAsk,
        general: mpsc::Sender<Value>,
        shutdown: &CancellationToken,
    ) -> SessionHandle;

    /// How long a session the transport ended may take to have its units
    /// removed before the transport stops waiting (stdio, at its end).
    fn end_wait(&self) -> Duration;

    /// How many sessions are still running, ending ones included (HTTP
    /// waits at shutdown until none is).
    fn sessions_running(&self) -> usize;

    /// The `/metrics` exposition: its content type and its text.
    fn metrics(&self) -> (&'static str, String);

    /// `/readyz`: whether sessions can be served now; why not otherwise.
    fn readiness(&self) -> BoxFuture<'_, Result<(), String>>;

    /// The units of session `id` not yet confirmed removed, for a DELETE
    /// that waited too long.
    fn units_left(&self, id: &str) -> Vec<UnitLeft>;

    /// A request the transport refused before any session saw it (its Host,
    /// its Origin, its bearer token), once per request: the host makes it a
    /// log line, an audit line and a count, so an operator sees it.
    fn refused(&self, refusal: &Refusal);
}

/// A request the transport refused, as it reports it ([`SessionFactory::refused`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Why, from a fixed set.
    pub reason: RefusalReason,
    /// The HTTP status answered.
    pub status: u16,
    /// The request's path.
    pub path: String,
    /// What was wrong, for people: never a token, an Origin quoted with
    /// its control characters escaped and at most 200 bytes of it.
    pub detail: String,
}

/// Why the transport refused a request (a metric's label: a fixed set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalReason {
    /// 401: no bearer token, or a wrong one.
    Unauthorized,
    /// 403: an Origin that is not allowed.
    Origin,
    /// 421: a Host this server does not serve (DNS rebinding).
    Host,
}

impl RefusalReason {
    /// The label: `unauthorized`, `origin`, `host`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unauthorized => "unauthorized",
            Self::Origin => "origin",
            Self::Host => "host",
        }
    }
}

/// A unit whose removal is not confirmed, as a transport reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitLeft {
    /// The unit's name in its session's plan.
    pub unit: String,
    /// The backend's id, when its start got that far.
    pub id: Option<String>,
    /// What is left and how to remove it, in one sentence.
    pub description: String,
}

/// Copy a request's events and then its answer into `out`, in that order.
/// Returns once the answer is sent, or the session dropped the request (a
/// client cancellation: no answer is due); `forward_reply_of` says whether
/// that end was reached (not a reader gone first).
pub async fn forward_reply(stream: ReplyStream, out: mpsc::Sender<Value>) {
    forward_reply_of(stream, out, None).await;
}

/// A stateless (2026-07-28) request whose client may close its stream: in
/// that revision closing the stream is the cancel, so a guard still armed
/// when dropped tells the session `notifications/cancelled` for the request
/// (in the handshake era a dropped stream cancels nothing).
pub(crate) struct CancelOnClose {
    pub(crate) session: box_jsonrpc::session::SessionHandle,
    pub(crate) id: Value,
    pub(crate) armed: bool,
}

impl Drop for CancelOnClose {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let cancel = box_jsonrpc::notification(
            "notifications/cancelled",
            serde_json::json!({"requestId": self.id, "reason": "the client closed the request's stream"}),
        );
        let session = self.session.clone();
        tokio::spawn(async move {
            let _ = session.notify(cancel).await;
        });
    }
}

/// [`forward_reply`], with the answer to a stateless request (`stateless`:
/// its method) in the revision's form
/// ([`box_jsonrpc::era::complete_result`]).
pub(crate) async fn forward_reply_of(
    stream: ReplyStream,
    out: mpsc::Sender<Value>,
    stateless: Option<&str>,
) -> bool {
    forward_reply_seen(stream, out, stateless).await.0
}

/// [`forward_reply_of`], and whether the answer was a stateless "input
/// required" (`resultType: "input_required"`): the call waits in its
/// session for the client's retry.
pub(crate) async fn forward_reply_seen(
    mut stream: ReplyStream,
    out: mpsc::Sender<Value>,
    stateless: Option<&str>,
) -> (bool, bool) {
    loop {
        tokio::select! {
            biased;
            Some(event) = stream.events.recv() => {
                if out.send(event).await.is_err() {
                    return (false, false);
                }
            }
            response = &mut stream.response => {
                // Events queued before the answer go first; none may follow it.
                while let Ok(event) = stream.events.try_recv() {
                    if out.send(event).await.is_err() {
                        return (false, false);
                    }
                }
                let Ok(mut response) = response else {
                    // Dropped by the session: no answer is due.
                    return (true, false);
                };
                if let Some(method) = stateless {
                    box_jsonrpc::era::complete_result(method, &mut response);
                }
                let asks = response.pointer("/result/resultType")
                    == Some(&Value::String("input_required".to_owned()));
                return (out.send(response).await.is_ok(), asks);
            }
        }
    }
}

/// The session a client asks to reattach to after its host restarted
/// (`box.reattach.session` in the executor capability's ask, or a stateless
/// request's handle): the session keeps its id. Only an id box could have minted is taken;
/// the host checks the secret and answers whether it is the client's.
pub(crate) fn reattach_id(message: &Value) -> Option<String> {
    // A stateless request's handle names its session: the first request a
    // new `box serve --state` reads after a restart reattaches to it.
    if box_jsonrpc::era::is_stateless(message) {
        let id = message
            .pointer("/params/_meta")?
            .get(box_jsonrpc::era::SESSION_META)?
            .get("id")?
            .as_str()?;
        return plausible_session_id(id).then(|| id.to_owned());
    }
    if message.get("method").and_then(Value::as_str) != Some("initialize") {
        return None;
    }
    let id = message
        .pointer("/params/capabilities/experimental")?
        .get(box_jsonrpc::EXECUTOR_KEY)?
        .pointer("/box/reattach/session")?
        .as_str()?;
    plausible_session_id(id).then(|| id.to_owned())
}

/// Whether `id` could be a session id box minted (letters, digits, `-`, `_`).
pub(crate) fn plausible_session_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_')
}

/// A JSON-RPC batch handed to its session (2025-03-26 sessions only).
pub(crate) struct Batch {
    /// Answers already known: the refusals of members that are not messages.
    pub answers: Vec<Value>,
    /// The requests' events and answers, merged, as they come.
    pub replies: mpsc::Receiver<Value>,
    /// How many answers `replies` still owes (a cancelled request's never comes).
    pub pending: usize,
}

/// Hand each member of a batch to `session` as if it came alone: requests
/// (their replies merged into [`Batch::replies`]), notifications and
/// responses; a member that is not a message is refused in
/// [`Batch::answers`].
pub(crate) async fn route_batch(
    session: &SessionHandle,
    messages: Vec<Value>,
) -> Result<Batch, SessionGone> {
    let (replies_tx, replies) = mpsc::channel(box_jsonrpc::REPLY_EVENTS);
    let mut answers = Vec::new();
    let mut pending = 0;
    for message in messages {
        match classify(&message) {
            Ok(Kind::Request { .. }) => {
                let stream = session.request(message).await?;
                tokio::spawn(forward_reply(stream, replies_tx.clone()));
                pending += 1;
            }
            Ok(Kind::Notification { .. } | Kind::Response { .. }) => {
                session.notify(message).await?;
            }
            Err(error) => answers.push(refusal(&message, &error)),
        }
    }
    Ok(Batch {
        answers,
        replies,
        pending,
    })
}

/// Whether a message on a reply stream is an answer (not an event: events
/// are requests and notifications, which have a method).
pub(crate) fn is_answer(message: &Value) -> bool {
    message.get("method").is_none()
}
