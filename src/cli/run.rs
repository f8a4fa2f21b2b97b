//! `box run`: its flags, turned into the host's [`RunConfig`].

use std::path::PathBuf;
use std::process::ExitCode;

use crate::host::{self, RunConfig};

/// `box run`: one command in a fresh session's workspace unit.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// The profile to resolve.
    #[arg(long, value_name = "NAME", default_value = "default")]
    pub profile: String,
    /// More directories of profiles, searched first (repeatable).
    #[arg(long = "profiles", value_name = "DIR")]
    pub profile_dirs: Vec<PathBuf>,
    /// Tightenings, as JSON or @FILE.
    #[arg(long, value_name = "JSON")]
    pub tighten: Option<String>,
    /// Where units run: docker, local, or auto.
    #[arg(long, value_name = "BACKEND", default_value = "auto")]
    pub backend: String,
    /// The host directory a `cwd` workspace source means; default the current directory.
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// Log format on stderr: text or json.
    #[arg(long, value_name = "FORMAT", default_value = "text")]
    pub log_format: String,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

impl From<RunArgs> for RunConfig {
    fn from(args: RunArgs) -> Self {
        Self {
            profile: args.profile,
            profile_dirs: args.profile_dirs,
            tighten: args.tighten,
            backend: args.backend,
            registry: crate::backends::registry(),
            workspace: args.workspace,
            log_format: args.log_format,
            command: args.command,
        }
    }
}

/// Run one command through a session of its own; the exit code is the command's.
pub fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    host::run(args.into())
}
