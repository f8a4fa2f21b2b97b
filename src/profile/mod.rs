//! Profiles: what a unit may be and do, as written in TOML. Loading, `extends`,
//! validation with precise errors. Pure: no I/O beyond reading profile files.

use std::process::ExitCode;

/// `box profile`: list, show, check and resolve profiles.
#[derive(Debug, Clone, clap::Args)]
pub struct ProfileArgs {
    /// What to do (list, show NAME, check [FILE...], resolve NAME).
    #[arg(
        value_name = "ARGS",
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub rest: Vec<String>,
}

/// Run a `box profile` subcommand.
pub fn cli(args: ProfileArgs) -> anyhow::Result<ExitCode> {
    let _ = args;
    anyhow::bail!("box profile is not built yet")
}
