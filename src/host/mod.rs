//! The host: a session's life, from the box ask at initialize to the removal of
//! its units.

use std::path::PathBuf;
use std::process::ExitCode;

/// `box serve`: the host, over stdio or streamable HTTP.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// The profile a session gets when it names none.
    #[arg(long, value_name = "NAME", default_value = "default")]
    pub profile: String,
    /// More directories of profiles, searched first (repeatable).
    #[arg(long = "profiles", value_name = "DIR")]
    pub profile_dirs: Vec<PathBuf>,
    /// Where units run: docker, local, or auto (docker when the engine answers).
    #[arg(long, value_name = "BACKEND", default_value = "auto")]
    pub backend: String,
    /// The host directory a `cwd` workspace source means; default the current directory.
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// Serve streamable HTTP at this address instead of stdio.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// A file holding the bearer token HTTP clients must send.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
}

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
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// Run the host until its transport ends.
pub fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let _ = args;
    anyhow::bail!("box serve is not built yet")
}

/// Run one command through a session of its own; the exit code is the command's.
pub fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let _ = args;
    anyhow::bail!("box run is not built yet")
}
