//! `box init` (hidden): box's first process in a unit (`box_init::run`):
//! it holds the unit's lease, relays its executor's stdio to the host and
//! reaps. Its command line is `box_init::InitConfig`'s, which the backends
//! write with `InitConfig::to_args`; clap only hands the arguments over.

use std::ffi::OsString;
use std::process::ExitCode;

/// `box init`'s arguments, parsed by `box_init::InitConfig::parse_args`.
#[derive(Debug, Clone, clap::Args)]
pub struct InitArgs {
    /// `--socket PATH --unit ID --lease-ms N [--bridge ..] [--env ..] -- EXECUTOR [ARG]...`
    #[arg(
        value_name = "ARGS",
        num_args = 0..,
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub args: Vec<OsString>,
}

/// Run the init; its exit code is the unit's.
pub fn init(args: InitArgs) -> anyhow::Result<ExitCode> {
    // Logs to stderr (the unit's, which the host re-emits): JSON lines when
    // the unit says so, as the executor's.
    let filter = tracing_subscriber::EnvFilter::try_from_env("BOX_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,box_init=info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false);
    let _ = if std::env::var("BOX_LOG_FORMAT").is_ok_and(|format| format == "json") {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
    let config = box_init::InitConfig::parse_args(args.args)?;
    let code = box_init::run(config);
    Ok(ExitCode::from(u8::try_from(code).unwrap_or(u8::MAX)))
}
