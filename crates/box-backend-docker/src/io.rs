//! The executor's output, re-buffered: bollard yields the exec's multiplexed
//! stream as `LogOutput` frames; stdout bytes go to an `AsyncRead` the host
//! reads the protocol from, stderr lines go to the log under the unit's name.

use std::pin::Pin;

use bollard::container::LogOutput;
use bollard::errors::Error as DockerError;
use futures::{Stream, StreamExt};
use tokio::io::{AsyncWriteExt, DuplexStream};
use tokio::sync::oneshot;

/// Bytes of executor stdout buffered before the pump waits for the host to
/// read: enough for several protocol messages, small enough that a flooding
/// executor is held back by the host, not by the host's memory.
const STDOUT_BUFFER: usize = 256 * 1024;

/// The longest stderr line logged whole; longer ones are cut.
const STDERR_LINE_MAX: usize = 4096;

/// Start pumping `output`; returns the stdout reader and a signal that fires
/// when the exec's output has ended (the executor exited or was killed).
pub(super) fn pump(
    output: Pin<Box<dyn Stream<Item = Result<LogOutput, DockerError>> + Send>>,
    unit: String,
) -> (DuplexStream, oneshot::Receiver<()>) {
    let (reader, writer) = tokio::io::duplex(STDOUT_BUFFER);
    let (done_tx, done_rx) = oneshot::channel();
    tokio::spawn(run(output, writer, unit, done_tx));
    (reader, done_rx)
}

async fn run(
    mut output: Pin<Box<dyn Stream<Item = Result<LogOutput, DockerError>> + Send>>,
    writer: DuplexStream,
    unit: String,
    done: oneshot::Sender<()>,
) {
    let mut writer = Some(writer);
    let mut stderr = Vec::new();
    while let Some(frame) = output.next().await {
        match frame {
            Ok(LogOutput::StdOut { message } | LogOutput::Console { message }) => {
                if let Some(w) = writer.as_mut()
                    && w.write_all(&message).await.is_err()
                {
                    // The host stopped reading; keep draining for stderr and the end.
                    writer = None;
                }
            }
            Ok(LogOutput::StdErr { message }) => {
                stderr.extend_from_slice(&message);
                log_lines(&unit, &mut stderr, false);
            }
            Ok(LogOutput::StdIn { .. }) => {}
            Err(error) => {
                tracing::warn!(unit, %error, "reading the executor's output");
                break;
            }
        }
    }
    log_lines(&unit, &mut stderr, true);
    drop(writer);
    let _ = done.send(());
}

/// Log every complete line in `buffer` (all of it when `flush`), keeping the rest.
fn log_lines(unit: &str, buffer: &mut Vec<u8>, flush: bool) {
    while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
        let line: Vec<u8> = buffer.drain(..=end).collect();
        log_line(unit, &line[..line.len() - 1]);
    }
    if buffer.len() > STDERR_LINE_MAX || (flush && !buffer.is_empty()) {
        let line: Vec<u8> = std::mem::take(buffer);
        log_line(unit, &line);
    }
}

/// Log one line of the unit named `session/unit` (a session id has no `/`),
/// with the session and the unit as fields of their own, as the local
/// backend logs them.
fn log_line(name: &str, line: &[u8]) {
    let cut = &line[..line.len().min(STDERR_LINE_MAX)];
    let text = String::from_utf8_lossy(cut);
    let (session, unit) = match name.split_once('/') {
        Some((session, unit)) => (Some(session), unit),
        None => (None, name),
    };
    box_backend::executor_log::emit(unit, session, &text);
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;

    #[tokio::test]
    async fn stdout_frames_become_one_byte_stream() {
        let frames = vec![
            Ok(LogOutput::StdOut {
                message: (&b"{\"a\":"[..]).into(),
            }),
            Ok(LogOutput::StdErr {
                message: (&b"log line\n"[..]).into(),
            }),
            Ok(LogOutput::StdOut {
                message: (&b"1}\n"[..]).into(),
            }),
        ];
        let (mut reader, done) = pump(Box::pin(futures::stream::iter(frames)), "u".to_owned());
        let mut text = String::new();
        reader.read_to_string(&mut text).await.unwrap();
        assert_eq!(text, "{\"a\":1}\n");
        done.await.unwrap();
    }
}
