//! The relay between the host's connection and the executor's stdio, in three
//! tasks so that no direction can stall another:
//!
//! - the **downlink** (one per connection) reads the host's lines: MCP lines
//!   go to the stdin queue, control lines to the supervisor (so a renewal is
//!   seen even while the executor is not reading its stdin);
//! - the **stdin writer** (one) writes queued lines to the executor's stdin;
//! - the **uplink** (one, across connections) reads the executor's stdout a
//!   whole line at a time, only while a host is connected (otherwise the
//!   pipe's back-pressure holds the executor's output), and writes each line
//!   with one write. A line whose write fails stays current and is sent whole
//!   on the next connection; the host drops the half it got. The exit report
//!   goes after the executor's last line.
//!
//! MCP lines are never parsed: one read and one write per line, one reused
//! buffer on each side (the downlink copies a line once, into the queue).

use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf, pipe};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use super::Event;
use crate::line::{LineEvent, LineReader};
use crate::protocol::{self, HostMessage, MAX_LINE_BYTES};

/// Bytes of the host's lines queued for the executor's stdin before the
/// downlink stops reading the host (then renewals wait too: an executor that
/// leaves 8 MiB unread for a whole lease loses its unit).
const STDIN_QUEUE_BYTES: usize = 8 << 20;

/// Lines in the stdin queue; the byte budget is the real bound.
const STDIN_QUEUE_LINES: usize = 1024;

enum StdinItem {
    Line(Vec<u8>, OwnedSemaphorePermit),
    Close,
}

/// The queue to the executor's stdin.
#[derive(Clone)]
pub(crate) struct StdinQueue {
    items: mpsc::Sender<StdinItem>,
    budget: Arc<Semaphore>,
}

impl StdinQueue {
    /// Starts the stdin writer over `pipe`.
    pub fn start(pipe: pipe::Sender) -> Self {
        let (items, queue) = mpsc::channel(STDIN_QUEUE_LINES);
        tokio::spawn(write_stdin(pipe, queue));
        Self {
            items,
            budget: Arc::new(Semaphore::new(STDIN_QUEUE_BYTES)),
        }
    }

    async fn send(&self, line: &[u8]) {
        let cost = u32::try_from(line.len().min(STDIN_QUEUE_BYTES)).unwrap_or(u32::MAX);
        let Ok(permit) = self.budget.clone().acquire_many_owned(cost).await else {
            return;
        };
        let _ = self
            .items
            .send(StdinItem::Line(line.to_vec(), permit))
            .await;
    }

    async fn close(&self) {
        let _ = self.items.send(StdinItem::Close).await;
    }
}

async fn write_stdin(pipe: pipe::Sender, mut queue: mpsc::Receiver<StdinItem>) {
    let mut pipe = Some(pipe);
    while let Some(item) = queue.recv().await {
        match item {
            StdinItem::Line(line, _permit) => {
                let Some(writer) = pipe.as_mut() else {
                    continue;
                };
                if let Err(error) = writer.write_all(&line).await {
                    // The executor closed its stdin or ended; what follows is
                    // dropped (the host learns of the end from the report).
                    tracing::warn!(%error, "the executor's stdin is closed; dropping the host's lines");
                    pipe = None;
                }
            }
            StdinItem::Close => pipe = None,
        }
    }
}

/// Reads one connection's lines from the host until it ends.
pub(crate) async fn downlink(
    generation: u64,
    mut reader: LineReader<OwnedReadHalf>,
    stdin: StdinQueue,
    events: mpsc::Sender<Event>,
) {
    loop {
        match reader.next_line().await {
            Ok(LineEvent::Line) => {
                let line = reader.line();
                if protocol::is_control(line) {
                    match protocol::parse_control::<HostMessage>(line) {
                        Ok(HostMessage::CloseStdin {}) => stdin.close().await,
                        Ok(message @ (HostMessage::Lease { .. } | HostMessage::Release {})) => {
                            let _ = events
                                .send(Event::Control {
                                    generation,
                                    message,
                                })
                                .await;
                        }
                        Ok(other) => {
                            let message = crate::protocol::kind_of(&other);
                            tracing::warn!(
                                %message,
                                "ignored an out-of-place control message from the host"
                            )
                        }
                        Err(error) => {
                            tracing::warn!(%error, "ignored an unreadable control line from the host")
                        }
                    }
                } else {
                    stdin.send(line).await;
                }
                reader.consume();
            }
            Ok(LineEvent::TooLong { bytes }) => {
                tracing::warn!(
                    bytes,
                    limit = MAX_LINE_BYTES,
                    "dropped an over-long line from the host"
                );
            }
            Ok(LineEvent::End { partial }) => {
                if partial > 0 {
                    tracing::info!(
                        partial,
                        "the host left mid-line; the partial line was dropped"
                    );
                }
                break;
            }
            Err(error) => {
                tracing::info!(%error, "reading from the host failed");
                break;
            }
        }
    }
    let _ = events.send(Event::HostGone { generation }).await;
}

/// What the supervisor tells the uplink.
#[derive(Debug)]
pub(crate) enum Uplink {
    /// A new authenticated connection: relay to it.
    Attach {
        generation: u64,
        writer: OwnedWriteHalf,
    },
    /// That connection is gone: stop writing to it.
    Detach { generation: u64 },
    /// A control answer (dropped while no host is connected).
    Control(Vec<u8>),
    /// Write `released` as the last line on that connection, then let it go.
    Release { generation: u64 },
    /// The exit report: written as soon as a host is connected, after which
    /// the uplink stops.
    Report(Vec<u8>),
}

/// Relays the executor's stdout to whichever host is connected.
pub(crate) async fn uplink(
    stdout: pipe::Receiver,
    mut commands: mpsc::UnboundedReceiver<Uplink>,
    events: mpsc::Sender<Event>,
) {
    let mut output = LineReader::new(stdout, MAX_LINE_BYTES);
    let mut output_open = true;
    let mut connection: Option<(u64, OwnedWriteHalf)> = None;
    let mut report: Option<Vec<u8>> = None;
    loop {
        // The report is the unit's last word: it follows every whole line the
        // executor wrote. A lapse reports right after killing the executor,
        // whose last lines (answers to calls that finished) may still be in
        // the pipe; a host that read the report first would take them for
        // lost. The killed executor's pipe ends at once, and the init waits
        // for the report only so long.
        if !output_open && let (Some(line), Some((_, writer))) = (&report, &mut connection) {
            if let Err(error) = writer.write_all(line).await {
                tracing::info!(%error, "could not deliver the exit report");
            }
            let _ = events.send(Event::ReportWritten).await;
            return;
        }
        tokio::select! {
            biased;
            command = commands.recv() => match command {
                None => return,
                Some(Uplink::Attach { generation, writer }) => connection = Some((generation, writer)),
                Some(Uplink::Detach { generation }) => {
                    if connection.as_ref().is_some_and(|(current, _)| *current == generation) {
                        connection = None;
                    }
                }
                Some(Uplink::Control(line)) => {
                    if let Some((generation, writer)) = &mut connection
                        && writer.write_all(&line).await.is_err()
                    {
                        let _ = events.send(Event::HostGone { generation: *generation }).await;
                        connection = None;
                    }
                }
                Some(Uplink::Release { generation }) => {
                    if let Some((current, mut writer)) = connection.take() {
                        if current == generation {
                            let released = protocol::encode_control(&protocol::InitMessage::Released {});
                            if let Err(error) = writer.write_all(&released).await {
                                tracing::info!(%error, "could not confirm the release");
                            }
                        } else {
                            connection = Some((current, writer));
                        }
                    }
                }
                Some(Uplink::Report(line)) => report = Some(line),
            },
            event = output.next_line(), if output_open && connection.is_some() => match event {
                Ok(LineEvent::Line) => {
                    let line = output.line();
                    if protocol::is_control(line) {
                        // Only the init speaks control; an executor line that
                        // looks like one is not MCP and must not be taken for
                        // the init's word by the host.
                        tracing::warn!(bytes = line.len(), "dropped an executor line starting with `!`");
                        output.consume();
                    } else if let Some((generation, writer)) = &mut connection {
                        match writer.write_all(line).await {
                            Ok(()) => output.consume(),
                            Err(error) => {
                                tracing::info!(%error, "the host connection broke mid-line; the line is kept for the next host");
                                let _ = events.send(Event::HostGone { generation: *generation }).await;
                                connection = None;
                            }
                        }
                    }
                }
                Ok(LineEvent::TooLong { bytes }) => {
                    tracing::warn!(bytes, limit = MAX_LINE_BYTES, "dropped an over-long line from the executor");
                }
                Ok(LineEvent::End { partial }) => {
                    if partial > 0 {
                        tracing::warn!(partial, "the executor's last output had no newline; dropped");
                    }
                    output_open = false;
                    let _ = events.send(Event::OutputEnded).await;
                }
                Err(error) => {
                    tracing::warn!(%error, "reading the executor's stdout failed");
                    output_open = false;
                    let _ = events.send(Event::OutputEnded).await;
                }
            },
        }
    }
}
