//! `box sandbox` (hidden): the local backend's helper, run in the unit's
//! process. Its flags are clap's here; the helper takes them as plain data.

/// `box sandbox`: confine this process, then run CMD.
#[derive(Debug, Clone, clap::Args)]
pub struct SandboxArgs {
    /// The sandbox spec as JSON (for people and tests).
    #[arg(long, value_name = "JSON", conflicts_with = "spec_stdin")]
    pub spec: Option<String>,
    /// Read the spec from stdin before anything else: its length in bytes on
    /// one line, then exactly that much JSON (never a byte more: the rest of
    /// stdin is CMD's).
    #[arg(long)]
    pub spec_stdin: bool,
    /// Write the report (one JSON line) to stdout, before CMD writes anything
    /// there; default stderr.
    #[arg(long)]
    pub report_stdout: bool,
    /// Die with this process (the host): set the parent-death signal, and
    /// exit at once if the parent is already another.
    #[arg(long, value_name = "PID")]
    pub parent: Option<u32>,
    #[command(flatten)]
    pub run: super::ConfinedCommand,
}

/// Run the helper; when CMD is this binary's `box execute`, the executor runs
/// in the helper's process (one exec fewer per unit start).
pub fn sandbox(args: SandboxArgs) -> anyhow::Result<std::process::ExitCode> {
    let args = box_backend_local::SandboxArgs {
        spec: args.spec,
        spec_stdin: args.spec_stdin,
        report_stdout: args.report_stdout,
        parent: args.parent,
        command: args.run.command,
    };
    // The unit's stderr is read by its host, which re-emits JSON lines with their fields.
    box_backend_local::sandbox(args, box_executor::serve_json_logs)
}
