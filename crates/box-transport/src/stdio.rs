//! stdio: one session per process (in the stateless revision, 2026-07-28,
//! the one a `box/session.open` or the first request without a handle
//! opens; `box/session.close` ends it and the process). Newline-delimited JSON-RPC on stdin and
//! stdout (stdout carries nothing else; logs go to stderr), every line
//! bounded. The session ends at stdin's end of file, or when the host shuts
//! down; its units are removed before this returns.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::{SessionFactory, TransportAsk};
use box_jsonrpc::lines::{Line, LineReader, MAX_MESSAGE_BYTES, write_line};
use box_jsonrpc::session::SessionHandle;
use box_jsonrpc::{Kind, MessageError, classify, code, error_response, refusal};

/// How many messages may wait for stdout.
const OUT_QUEUE: usize = 256;
/// How long answers still queued for stdout get to be written at the end.
const FLUSH_GRACE: Duration = Duration::from_secs(2);
/// After stdin's end of file, how long requests in flight get to be answered
/// before the session ends (`box serve < requests.jsonl` gets its answers;
/// a call that hangs does not keep the units alive).
const EOF_GRACE: Duration = Duration::from_secs(2);

/// Serve one session on this process's stdin and stdout; `ask` is what the
/// command line asked for it (`box serve --tighten`).
pub async fn serve(
    sessions: Arc<dyn SessionFactory>,
    ask: TransportAsk,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    // Non-blocking on the runtime where they are pipes or sockets; the mode
    // belongs to the open pipe, which whoever comes after us in a shell
    // pipeline may share, so `_modes` puts it back as found.
    let (input, output, _modes) = box_jsonrpc::stdio::stdio();
    serve_on(sessions, ask, input, output, shutdown).await
}

/// Write a batch's events as they come, then its answers as one array line
/// (none when every member was a notification, or its requests cancelled).
async fn answer_batch(mut batch: crate::Batch, out: mpsc::Sender<Value>) {
    while batch.pending > 0 {
        let Some(message) = batch.replies.recv().await else {
            break;
        };
        if crate::is_answer(&message) {
            batch.answers.push(message);
            batch.pending -= 1;
        } else if out.send(message).await.is_err() {
            return;
        }
    }
    if !batch.answers.is_empty() {
        let _ = out.send(Value::Array(batch.answers)).await;
    }
}

/// Serve one session, which asked for `ask`, on `input` and `output`.
pub async fn serve_on(
    sessions: Arc<dyn SessionFactory>,
    ask: TransportAsk,
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
    // Opened at the first message: an initialize that reattaches (after a
    // restart of `box serve --state`) names the session's id.
    let mut opened: Option<SessionHandle> = None;
    let mut reader = LineReader::new(input, MAX_MESSAGE_BYTES);
    let in_flight = tokio_util::task::TaskTracker::new();
    let mut at_eof = false;
    loop {
        let line = tokio::select! {
            () = async {
                match &opened {
                    Some(session) => session.ended().await,
                    None => std::future::pending().await,
                }
            } => break,
            // The session is ending too (a child of `shutdown`); stop reading.
            () = shutdown.cancelled() => break,
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
        let session = opened.get_or_insert_with(|| {
            let id = crate::reattach_id(&message).unwrap_or_else(|| {
                let mut session_id = [0u8; 16];
                rand::fill(&mut session_id);
                hex::encode(session_id)
            });
            sessions.open(id, ask.clone(), out_tx.clone(), &shutdown)
        });
        match classify(&message) {
            Ok(Kind::Request { method, .. }) => {
                let stateless = box_jsonrpc::era::is_stateless(&message).then_some(method);
                let Ok(stream) = session.request(message).await else {
                    break;
                };
                let out = out_tx.clone();
                in_flight.spawn(async move {
                    crate::forward_reply_of(stream, out, stateless.as_deref()).await;
                });
            }
            Ok(Kind::Notification { .. } | Kind::Response { .. }) => {
                if session.notify(message).await.is_err() {
                    break;
                }
            }
            // 2025-03-26 has batches: each member routed, the answers in one array.
            Err(MessageError::Batch)
                if session
                    .protocol_version()
                    .is_some_and(box_jsonrpc::allows_batches) =>
            {
                let Value::Array(messages) = message else {
                    continue;
                };
                if messages.is_empty() {
                    let empty = error_response(
                        Value::Null,
                        code::INVALID_REQUEST,
                        "an empty batch: send at least one message",
                    );
                    let _ = out_tx.send(empty).await;
                    continue;
                }
                let Ok(batch) = crate::route_batch(session, messages).await else {
                    break;
                };
                in_flight.spawn(answer_batch(batch, out_tx.clone()));
            }
            Err(error) => {
                let _ = out_tx.send(refusal(&message, &error)).await;
            }
        }
    }
    in_flight.close();
    if at_eof {
        let _ = tokio::time::timeout(EOF_GRACE, in_flight.wait()).await;
    }
    if let Some(session) = opened {
        session.end();
        // Bounded: an engine that stalls must not keep the host for ever; what is
        // left then is named as the host exits.
        let wait = sessions.end_wait();
        if tokio::time::timeout(wait, session.ended()).await.is_err() {
            tracing::error!(
                "the session's units are not confirmed removed after {}; exiting",
                humantime::format_duration(wait)
            );
        }
    }
    drop(out_tx);
    let _ = tokio::time::timeout(FLUSH_GRACE, writer).await;
    Ok(())
}
