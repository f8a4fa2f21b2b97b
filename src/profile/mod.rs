//! Profiles: what a unit may be and do, as written in TOML. Loading, `extends`,
//! validation with precise errors. Pure: no I/O beyond reading profile files.

use std::path::PathBuf;
use std::process::ExitCode;

/// A profile as written, validated (first cut; the profiles work owns this type).
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// Its name (the file stem).
    pub name: String,
}

/// Why a profile could not be loaded; names the file, line, column and field.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ProfileError(pub String);

/// The profiles a host can resolve: `--profiles` directories first, then
/// `$XDG_CONFIG_HOME/box/profiles`, `/etc/box/profiles`, then the shipped ones.
#[derive(Debug, Clone)]
pub struct Catalog {
    dirs: Vec<PathBuf>,
}

impl Catalog {
    /// Search `dirs` first, then the standard places.
    pub fn new(dirs: Vec<PathBuf>) -> Self {
        Self { dirs }
    }

    /// Load and validate the profile called `name` (resolving `extends`).
    ///
    /// Interface stub: the profiles work replaces this.
    pub fn load(&self, name: &str) -> Result<Profile, ProfileError> {
        let _ = &self.dirs;
        Ok(Profile {
            name: name.to_owned(),
        })
    }
}

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
