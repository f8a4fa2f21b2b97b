//! The process methods (`agentworkspace/process.*`): start, write, read,
//! closeStdin, signal, wait, close, with the wire's bounds.
//!
//! Interface stub: the process work fills this in.

use std::sync::Arc;

use serde_json::Value;

use super::Context;

/// The method prefix the process methods share.
pub(crate) const METHOD_PREFIX: &str = "agentworkspace/process.";

/// A process method's failure, sent as a JSON-RPC error with this message.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct ProcessError(pub String);

/// One executor's processes.
pub(crate) struct Processes {
    context: Arc<Context>,
}

impl Processes {
    /// An empty table.
    pub fn new(context: Arc<Context>) -> Self {
        Self { context }
    }

    /// Answer `agentworkspace/process.<op>` with `params`.
    pub async fn handle(&self, op: &str, params: Value) -> Result<Value, ProcessError> {
        let _ = (&self.context, params);
        Err(ProcessError(format!("process.{op} is not built yet")))
    }

    /// End every process (stdin closed, grace, TERM, KILL) and refuse new starts.
    pub async fn shutdown(&self) {}
}

/// Send `signal` to the process group led by `leader` (a child started with
/// `process_group(0)`). A group already gone is not an error.
pub(crate) fn kill_group(leader: u32, signal: nix::sys::signal::Signal) {
    if let Ok(leader) = i32::try_from(leader) {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(leader), signal);
    }
}
