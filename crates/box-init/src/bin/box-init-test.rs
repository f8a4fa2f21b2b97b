//! `box-init-test ARGS…`: `box_init::run` behind the same command line as
//! `box init`, for this crate's process tests (box itself dispatches to `run`
//! from its hidden `box init` subcommand). Logs go to stderr, filtered by
//! `BOX_INIT_LOG` (default `info`).

use std::process::ExitCode;

fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_env("BOX_INIT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let code = match box_init::InitConfig::parse_args(std::env::args_os().skip(1)) {
        Ok(config) => box_init::run(config),
        Err(error) => {
            eprintln!("{error}");
            box_init::EXIT_START_FAILED
        }
    };
    ExitCode::from(u8::try_from(code).unwrap_or(u8::MAX))
}
