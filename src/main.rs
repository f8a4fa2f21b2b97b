//! The `box` command line: parse, dispatch into the library, report.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// box: hardened, isolated units for AI agents' tool execution, behind one MCP host.
#[derive(Debug, Parser)]
#[command(name = "box", version = boxhost::VERSION, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the executor over MCP on stdin/stdout (inside a unit, or standalone for dax).
    Execute(boxhost::executor::ExecuteArgs),
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Execute(args) => boxhost::executor::serve(args),
    };
    report(result)
}

/// Print the error chain on stderr and pick the exit code.
fn report(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("box: {error:#}");
            ExitCode::FAILURE
        }
    }
}
