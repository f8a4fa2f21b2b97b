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

use crate::proxy::ReplyStream;

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
