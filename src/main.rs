//! The `box` command line: parse, dispatch into the library, report.

use std::process::ExitCode;

use boxhost::cli::units as backend_cli;
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
    /// Serve sessions: each gets its own hardened units, reached over MCP (stdio, or HTTP with --listen).
    Serve(boxhost::host::ServeArgs),
    /// Run one command in a fresh sandboxed unit, stream its output, exit with its status.
    Run(boxhost::host::RunArgs),
    /// Serve the executor over MCP on stdin/stdout (inside a unit, or standalone for dax).
    Execute(boxhost::cli::execute::ExecuteArgs),
    /// List, show, check and resolve profiles.
    Profile(boxhost::cli::profile::ProfileArgs),
    /// List units.
    Units(backend_cli::UnitsArgs),
    /// Remove units whose session is gone.
    Gc(backend_cli::GcArgs),
    /// Build the unit images, offline.
    Image(backend_cli::ImageArgs),
    /// Say which protections this machine can give, and which profiles can run here.
    Doctor(boxhost::cli::doctor::DoctorArgs),
    /// The local backend's sandbox helper: confine this process, then run CMD.
    #[command(hide = true)]
    Sandbox(boxhost::cli::sandbox::SandboxArgs),
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Serve(args) => boxhost::host::serve(args),
        Command::Run(args) => boxhost::host::run(args),
        Command::Execute(args) => boxhost::cli::execute::execute(args),
        Command::Profile(args) => boxhost::cli::profile::cli(args),
        Command::Units(args) => backend_cli::units(args),
        Command::Gc(args) => backend_cli::gc(args),
        Command::Image(args) => backend_cli::image(args),
        Command::Doctor(args) => boxhost::cli::doctor::doctor(args),
        Command::Sandbox(args) => boxhost::cli::sandbox::sandbox(args),
    };
    report(result)
}

/// Print the error chain on stderr and pick the exit code.
fn report(result: anyhow::Result<ExitCode>) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("box: {error:#}");
            ExitCode::FAILURE
        }
    }
}
