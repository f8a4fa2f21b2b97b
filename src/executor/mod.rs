//! The executor: the MCP server that runs inside a unit (`box execute`). The
//! seven tools, facts and stamps, the files resources, the process methods and
//! batches, all confined beneath one workspace root.
//!
//! Ownership inside this module: `server` (rmcp handler, capability, dispatch,
//! exact keys, resources, batch), `workspace` (confinement), the file tools,
//! `facts` and `stamp` (shared types); `bash` and `shell` (running and analysing
//! a bash line), `process` (the process methods), `sandbox` (landlock and
//! no_new_privs for children).

// Interfaces land before their callers; each piece of work removes this as it wires its part.
#![allow(dead_code)]

pub(crate) mod bash;
pub(crate) mod facts;
pub(crate) mod process;
pub(crate) mod stamp;
pub(crate) mod workspace;

use std::path::PathBuf;
use std::sync::Arc;

/// `box execute`: serve the executor over MCP on stdin/stdout.
#[derive(Debug, Clone, clap::Args)]
pub struct ExecuteArgs {
    /// The workspace root every tool acts beneath; must exist.
    #[arg(long, value_name = "DIR")]
    pub root: PathBuf,
    /// What kind of place this is, for the descriptor: local, container or remote.
    #[arg(long, value_name = "K", default_value = "remote")]
    pub kind: String,
    /// What the place is called (image, host, pod), for the descriptor; default the host name.
    #[arg(long = "ref", value_name = "R")]
    pub reference: Option<String>,
    /// The most bytes of a file the tools read (read scans, edit rewrites, bash's analysis); 0 = 2 MiB.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub max_read_bytes: u64,
    /// Credential-looking variables to keep in children's environment, by exact name.
    #[arg(long, value_name = "A,B", value_delimiter = ',')]
    pub pass_env: Vec<String>,
    /// Whether overwriting or editing an existing file needs an earlier read of it.
    #[arg(long, value_name = "MODE", default_value = "read-first")]
    pub write_guard: String,
}

/// Serve MCP on stdin/stdout until the client hangs up.
pub fn serve(args: ExecuteArgs) -> anyhow::Result<std::process::ExitCode> {
    anyhow::bail!(
        "box execute is not built yet (root {})",
        args.root.display()
    )
}

/// Everything a tool call needs from its executor: shared by every call of one
/// executor process.
pub(crate) struct Context {
    /// The confined workspace every path resolves beneath.
    pub workspace: Arc<workspace::Workspace>,
    /// The scrubbed environment every child (bash, processes, git probes) gets.
    pub child_env: Arc<Vec<(std::ffi::OsString, std::ffi::OsString)>>,
    /// This process's stamp key.
    pub stamp: stamp::StampKey,
    /// The most bytes of a file the tools read.
    pub max_read_bytes: u64,
}

/// What a tool call produced, before it becomes an MCP result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ToolOutcome {
    /// The one text block of the result.
    pub text: String,
    /// Whether the result is an error result (`isError: true`).
    pub is_error: bool,
    /// Whether the call failed in the batch sense (an error result, or bash
    /// exiting non-zero, timing out or being killed; stderr alone is not failure).
    pub failed: bool,
}

impl ToolOutcome {
    /// A successful result.
    pub fn ok(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            is_error: false,
            failed: false,
        }
    }

    /// An error result.
    pub fn error(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            is_error: true,
            failed: true,
        }
    }
}

/// Where a running tool sends progress text (bash output since the last report).
/// Lossy on purpose: a full channel drops the update, never the call.
pub(crate) type Progress = Option<tokio::sync::mpsc::Sender<String>>;
