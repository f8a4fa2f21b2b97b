//! stdio: one session per process. Newline-delimited JSON-RPC on stdin and
//! stdout (stdout carries nothing else; logs go to stderr), every line
//! bounded. The session ends at stdin's end of file, or when the host shuts
//! down; its units are removed before this returns.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::host::{HostConfig, spawn_session};
use crate::proxy::lines::{Line, LineReader, MAX_MESSAGE_BYTES, write_line};
use crate::proxy::{Kind, MessageError, classify, code, error_response};

/// How many messages may wait for stdout.
const OUT_QUEUE: usize = 256;
/// How long answers still queued for stdout get to be written at the end.
const FLUSH_GRACE: Duration = Duration::from_secs(2);
/// After stdin's end of file, how long requests in flight get to be answered
/// before the session ends (`box serve < requests.jsonl` gets its answers;
/// a call that hangs does not keep the units alive).
const EOF_GRACE: Duration = Duration::from_secs(2);

/// Serve one session on this process's stdin and stdout.
pub async fn serve(config: Arc<HostConfig>, shutdown: CancellationToken) -> anyhow::Result<()> {
    serve_on(config, tokio::io::stdin(), tokio::io::stdout(), shutdown).await
}

/// Serve one session on `input` and `output`.
pub async fn serve_on(
    config: Arc<HostConfig>,
    input: impl AsyncRead + Unpin,
    mut output: impl AsyncWrite + Unpin + Send + 'static,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let (out_tx, mut out_rx) = mpsc::channel::<Value>(OUT_QUEUE);
    let writer = tokio::spawn(async move {
        while let Some(message) = out_rx.recv().await {
            if let Err(error) = write_line(&mut output, &message).await {
                tracing::warn!(%error, "writing to stdout failed; the client is gone");
                break;
            }
        }
    });
    let mut session_id = [0u8; 16];
    rand::fill(&mut session_id);
    let session = spawn_session(config, hex::encode(session_id), out_tx.clone(), &shutdown);
    let mut reader = LineReader::new(input, MAX_MESSAGE_BYTES);
    let in_flight = tokio_util::task::TaskTracker::new();
    let mut at_eof = false;
    loop {
        let line = tokio::select! {
            () = session.ended() => break,
            line = reader.next() => line,
        };
        let bytes = match line {
            Ok(Some(Line::Message(bytes))) => bytes,
            Ok(Some(Line::TooLong(length))) => {
                let _ = out_tx
                    .send(error_response(
                        Value::Null,
                        code::INVALID_REQUEST,
                        format!("a message of {length} bytes; at most {MAX_MESSAGE_BYTES}"),
                    ))
                    .await;
                continue;
            }
            Ok(None) => {
                at_eof = true;
                break;
            }
            Err(error) => {
                tracing::warn!(%error, "reading stdin failed");
                break;
            }
        };
        let message: Value = match serde_json::from_slice(&bytes) {
            Ok(message) => message,
            Err(error) => {
                let _ = out_tx
                    .send(error_response(
                        Value::Null,
                        code::PARSE_ERROR,
                        format!("not JSON: {error}"),
                    ))
                    .await;
                continue;
            }
        };
        match classify(&message) {
            Ok(Kind::Request { .. }) => {
                let Ok(stream) = session.request(message).await else {
                    break;
                };
                in_flight.spawn(super::forward_reply(stream, out_tx.clone()));
            }
            Ok(Kind::Notification { .. } | Kind::Response { .. }) => {
                if session.notify(message).await.is_err() {
                    break;
                }
            }
            Err(error) => {
                let id = match (&error, message.get("id")) {
                    (MessageError::Invalid(_), Some(id)) if crate::proxy::is_valid_id(id) => {
                        id.clone()
                    }
                    _ => Value::Null,
                };
                let _ = out_tx
                    .send(error_response(id, code::INVALID_REQUEST, error.to_string()))
                    .await;
            }
        }
    }
    in_flight.close();
    if at_eof {
        let _ = tokio::time::timeout(EOF_GRACE, in_flight.wait()).await;
    }
    session.end();
    session.ended().await;
    drop(out_tx);
    let _ = tokio::time::timeout(FLUSH_GRACE, writer).await;
    Ok(())
}
