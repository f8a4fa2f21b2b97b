//! Transports: how a client's messages reach a session. stdio (one session
//! per process, newline-delimited JSON-RPC with a bounded line) and streamable
//! HTTP (many sessions, `/mcp`, SSE). The only module that knows HTTP.
//!
//! A transport hands each client request to its session with a reply channel
//! and carries back what the session answers on it: the events related to the
//! request (progress, a server→client request) and then the one answer.

pub mod http;
pub mod stdio;
mod write_timeout;

use serde_json::Value;
use tokio::sync::mpsc;

use crate::host::{SessionGone, SessionHandle};
use box_jsonrpc::{Kind, ReplyStream, classify, refusal};

/// Copy a request's events and then its answer into `out`, in that order.
/// Returns once the answer is sent, or the session dropped the request (a
/// client cancellation: no answer is due).
pub async fn forward_reply(mut stream: ReplyStream, out: mpsc::Sender<Value>) {
    loop {
        tokio::select! {
            biased;
            Some(event) = stream.events.recv() => {
                if out.send(event).await.is_err() {
                    return;
                }
            }
            response = &mut stream.response => {
                // Events queued before the answer go first; none may follow it.
                while let Ok(event) = stream.events.try_recv() {
                    if out.send(event).await.is_err() {
                        return;
                    }
                }
                if let Ok(response) = response {
                    let _ = out.send(response).await;
                }
                return;
            }
        }
    }
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
