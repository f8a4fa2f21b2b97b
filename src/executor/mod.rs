//! The executor: the MCP server that runs inside a unit (`box execute`). The
//! seven tools, facts and stamps, the files resources, the process methods and
//! batches, all confined beneath one workspace root.

use std::path::PathBuf;

/// `box execute`: serve the executor over stdin/stdout.
#[derive(Debug, Clone, clap::Args)]
pub struct ExecuteArgs {
    /// The workspace root every tool acts beneath; must exist.
    #[arg(long, value_name = "DIR")]
    pub root: PathBuf,
}

/// Serve MCP on stdin/stdout until the client hangs up.
pub fn serve(args: ExecuteArgs) -> anyhow::Result<()> {
    anyhow::bail!(
        "box execute is not built yet (root {})",
        args.root.display()
    )
}
