//! A session's units: started all or nothing, their executors initialized,
//! linked to the session task by one reader and one writer task each, and
//! removed.

use std::pin::Pin;
use std::time::Duration;

use futures::future::join_all;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::backend::{Backend, BackendError, SessionLabel, StartedUnit, UnitEnd};
use crate::plan::UnitSpec;
use crate::proxy::lines::{Line, LineReader, MAX_MESSAGE_BYTES, write_line};
use crate::proxy::{self, Kind, classify};

/// How many messages may wait for a unit's executor to read them; a unit that
/// stops reading fills it, and its next request is refused naming the unit.
pub const UNIT_QUEUE: usize = 256;

/// What a unit's link tasks tell the session task.
#[derive(Debug)]
pub enum UnitEvent {
    /// A message from the unit's executor.
    Message(usize, Value),
    /// The executor's output ended (or broke); why.
    Closed(usize, String),
    /// The unit ended, with the backend's cause.
    Ended(usize, UnitEnd),
    /// The grace after `Closed` passed without `Ended`.
    Grace(usize),
    /// A forwarded request's deadline passed.
    Deadline(usize, u64),
    /// The settle after a deadline passed without the request's answer.
    Overdue(usize, u64),
}

/// An executor's stdio, framed.
pub struct ExecutorLink {
    reader: LineReader<Pin<Box<dyn AsyncRead + Send>>>,
    writer: Pin<Box<dyn AsyncWrite + Send>>,
}

impl ExecutorLink {
    /// Frame a started unit's executor stdio.
    pub fn new(
        stdin: Pin<Box<dyn AsyncWrite + Send>>,
        stdout: Pin<Box<dyn AsyncRead + Send>>,
    ) -> Self {
        Self {
            reader: LineReader::new(stdout, MAX_MESSAGE_BYTES),
            writer: stdin,
        }
    }
}

/// Start every unit of `specs` concurrently; if any fails, remove the ones that
/// started and return the first failure in plan order (it names its unit).
pub async fn start_units(
    backend: &dyn Backend,
    label: &SessionLabel,
    specs: &[UnitSpec],
) -> Result<Vec<StartedUnit>, BackendError> {
    let results = join_all(specs.iter().map(|spec| backend.start(label, spec))).await;
    let mut started = Vec::new();
    let mut failure = None;
    for result in results {
        match result {
            Ok(unit) => started.push(unit),
            Err(error) => {
                if failure.is_none() {
                    failure = Some(error);
                }
            }
        }
    }
    match failure {
        None => Ok(started),
        Some(error) => {
            let ids: Vec<String> = started
                .iter()
                .map(|unit| unit.envelope.id.clone())
                .collect();
            drop(started);
            remove_units(backend, &ids).await;
            Err(error)
        }
    }
}

/// Remove units by backend id, concurrently; failures are logged, every one.
pub async fn remove_units(backend: &dyn Backend, ids: &[String]) {
    let results = join_all(ids.iter().map(|id| backend.remove(id))).await;
    for (id, result) in ids.iter().zip(results) {
        if let Err(error) = result {
            tracing::error!(unit = %id, %error, "removing a unit failed");
        }
    }
}

/// What an executor said when it was started, before anything in its unit
/// could run code: its initialize result and its tool list.
#[derive(Debug, Clone)]
pub struct ExecutorStart {
    /// The `initialize` result.
    pub initialize: Value,
    /// The `tools/list` result, when it answered one. The host answers every
    /// later `tools/list` from it, so a unit whose executor was tampered with
    /// afterwards cannot show the client other tools (security case E67).
    pub tools: Option<Value>,
}

/// The first request id the session's router gives a unit (0 and 1 are the
/// host's own `initialize` and `tools/list`).
pub const FIRST_REQUEST_ID: u64 = 2;

/// Send one request to an executor and read until its answer (a ping from the
/// executor meanwhile is answered, anything else is ignored).
async fn exchange(
    link: &mut ExecutorLink,
    id: u64,
    method: &str,
    params: Value,
) -> Result<Value, String> {
    write_line(&mut link.writer, &proxy::request(json!(id), method, params))
        .await
        .map_err(|error| format!("writing {method} to the executor: {error}"))?;
    loop {
        let line = link
            .reader
            .next()
            .await
            .map_err(|error| format!("reading the executor's answer to {method}: {error}"))?;
        let bytes = match line {
            None => {
                return Err(format!(
                    "the executor closed its output before answering {method}"
                ));
            }
            Some(Line::TooLong(length)) => {
                return Err(format!(
                    "the executor sent a line of {length} bytes; at most {MAX_MESSAGE_BYTES}"
                ));
            }
            Some(Line::Message(bytes)) => bytes,
        };
        let Ok(message) = serde_json::from_slice::<Value>(&bytes) else {
            return Err("the executor wrote something that is not JSON".to_owned());
        };
        match classify(&message) {
            Ok(Kind::Response { id: answered }) if answered == json!(id) => {
                if let Some(error) = message.get("error") {
                    return Err(format!("the executor refused {method}: {error}"));
                }
                let result = message.get("result").cloned().unwrap_or(Value::Null);
                if !result.is_object() {
                    return Err(format!("the executor's {method} result is not an object"));
                }
                return Ok(result);
            }
            Ok(Kind::Request { id, method }) if method == "ping" => {
                write_line(&mut link.writer, &proxy::result_response(id, json!({})))
                    .await
                    .map_err(|error| format!("answering the executor's ping: {error}"))?;
            }
            _ => {}
        }
    }
}

/// Initialize an executor (`initialize`, `notifications/initialized`) and
/// read its tool list, within `timeout`.
pub async fn initialize_executor(
    link: &mut ExecutorLink,
    params: Value,
    timeout: Duration,
) -> Result<ExecutorStart, String> {
    let start = async {
        let initialize = exchange(link, 0, "initialize", params).await?;
        write_line(
            &mut link.writer,
            &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        )
        .await
        .map_err(|error| format!("writing notifications/initialized: {error}"))?;
        let offers_tools = initialize
            .pointer("/capabilities/tools")
            .is_some_and(Value::is_object);
        let tools = if offers_tools {
            Some(exchange(link, 1, "tools/list", json!({})).await?)
        } else {
            None
        };
        Ok(ExecutorStart { initialize, tools })
    };
    match tokio::time::timeout(timeout, start).await {
        Ok(result) => result,
        Err(_) => Err(format!(
            "the executor did not answer initialize and tools/list within {}",
            humantime::format_duration(timeout)
        )),
    }
}

/// Start the reader, writer and watcher tasks of unit `index`; returns the
/// sender of its writer. Events go to `events`; the tasks live in `tasks`.
pub fn link_unit(
    index: usize,
    link: ExecutorLink,
    ended: futures::future::BoxFuture<'static, UnitEnd>,
    events: &mpsc::Sender<UnitEvent>,
    tasks: &mut JoinSet<()>,
) -> mpsc::Sender<Value> {
    let ExecutorLink {
        mut reader,
        mut writer,
    } = link;
    let (writer_tx, mut writer_rx) = mpsc::channel::<Value>(UNIT_QUEUE);
    tasks.spawn(async move {
        while let Some(message) = writer_rx.recv().await {
            if let Err(error) = write_line(&mut writer, &message).await {
                tracing::warn!(unit = index, %error, "writing to a unit's executor failed");
                break;
            }
        }
        // Dropping the writer closes the executor's stdin: it ends its processes and exits.
        drop(writer);
    });
    let reader_events = events.clone();
    tasks.spawn(async move {
        let why = loop {
            match reader.next().await {
                Ok(None) => break "its executor closed its output".to_owned(),
                Err(error) => break format!("reading its executor's output failed: {error}"),
                Ok(Some(Line::TooLong(length))) => {
                    break format!(
                        "its executor sent a message of {length} bytes; at most {MAX_MESSAGE_BYTES}"
                    );
                }
                Ok(Some(Line::Message(bytes))) => match serde_json::from_slice::<Value>(&bytes) {
                    Ok(message) => {
                        if reader_events
                            .send(UnitEvent::Message(index, message))
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                    Err(_) => break "its executor wrote something that is not JSON".to_owned(),
                },
            }
        };
        let _ = reader_events.send(UnitEvent::Closed(index, why)).await;
    });
    let ended_events = events.clone();
    tasks.spawn(async move {
        let end = ended.await;
        let _ = ended_events.send(UnitEvent::Ended(index, end)).await;
    });
    writer_tx
}

/// A sentence for a unit's end. The backend's reason already says who
/// ended, how (exit code or signal) and why (an OOM kill): each once.
pub fn describe_end(end: &UnitEnd) -> String {
    end.reason.clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 8, item 15: each backend's sentence already carries the exit
    /// code, the signal and the OOM kill; the host says them once.
    #[test]
    fn a_units_end_is_described_once() {
        let docker = crate::backend::docker::body::unit_end(
            "ws",
            crate::backend::docker::body::Ending::Container,
            Some(137),
            false,
            1024,
        );
        let end = UnitEnd {
            exit_code: docker.exit_code,
            oom_killed: docker.oom_killed,
            reason: docker.reason.clone(),
        };
        assert_eq!(describe_end(&end), docker.reason);
        let oom = crate::backend::docker::body::unit_end(
            "ws",
            crate::backend::docker::body::Ending::Container,
            Some(137),
            true,
            1024,
        );
        let end = UnitEnd {
            exit_code: oom.exit_code,
            oom_killed: oom.oom_killed,
            reason: oom.reason.clone(),
        };
        let text = describe_end(&end);
        assert_eq!(text.matches("137").count(), 1, "{text}");
        assert_eq!(text.matches("OOM").count(), 1, "{text}");
        assert!(!text.contains("out-of-memory"), "{text}");
    }
}
