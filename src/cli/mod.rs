//! The commands' clap structs and their conversion into plain configuration,
//! and the wiring of the parts each command needs (`serve`: the host and a
//! transport). Library modules never see clap.

pub mod doctor;
pub mod execute;
pub mod profile;
pub mod run;
pub mod sandbox;
pub mod serve;
pub mod units;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use units as backend_cli;

/// box: hardened, isolated units for AI agents' tool execution, behind one MCP host.
#[derive(Debug, Parser)]
#[command(name = "box", version = crate::VERSION, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve sessions: each gets its own hardened units, reached over MCP (stdio, or HTTP with --listen).
    Serve(crate::cli::serve::ServeArgs),
    /// Run one command in a fresh sandboxed unit, stream its output, exit with its status.
    Run(crate::cli::run::RunArgs),
    /// Serve the executor over MCP on stdin/stdout (inside a unit, or standalone for dax).
    Execute(crate::cli::execute::ExecuteArgs),
    /// List, show, check and resolve profiles.
    Profile(crate::cli::profile::ProfileArgs),
    /// List units.
    Units(backend_cli::UnitsArgs),
    /// Remove units whose session is gone.
    Gc(backend_cli::GcArgs),
    /// Build the unit images, offline.
    Image(backend_cli::ImageArgs),
    /// Say which protections this machine can give, and which profiles can run here.
    Doctor(crate::cli::doctor::DoctorArgs),
    /// The local backend's sandbox helper: confine this process, then run CMD.
    #[command(hide = true)]
    Sandbox(crate::cli::sandbox::SandboxArgs),
}

/// Parse the command line and run the command (the `box` binary's `main`,
/// and box-testkit's `box-testhost`'s after it installs its registry).
pub fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Serve(args) => crate::cli::serve::serve(args),
        Command::Run(args) => crate::cli::run::run(args),
        Command::Execute(args) => crate::cli::execute::execute(args),
        Command::Profile(args) => crate::cli::profile::cli(args),
        Command::Units(args) => backend_cli::units(args),
        Command::Gc(args) => backend_cli::gc(args),
        Command::Image(args) => backend_cli::image(args),
        Command::Doctor(args) => crate::cli::doctor::doctor(args),
        Command::Sandbox(args) => crate::cli::sandbox::sandbox(args),
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
