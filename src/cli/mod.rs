//! The commands' clap structs and their conversion into plain configuration,
//! and the wiring of the parts each command needs (`serve`: the host and a
//! transport). Library modules never see clap.

// First: its macros (`outln!`, `out!`) are then in scope in every command.
#[macro_use]
mod out;

pub mod complete;
pub mod confine;
pub mod doctor;
pub mod execute;
pub mod init;
pub mod profile;
pub mod pull;
pub mod run;
pub mod sandbox;
pub mod serve;
mod top;
pub mod units;
pub mod volumes;

use std::process::ExitCode;

use clap::builder::{PossibleValue, PossibleValuesParser};
use clap::{ColorChoice, CommandFactory as _, FromArgMatches as _, Parser, Subcommand};

use units as backend_cli;

/// The exit codes of every command, in `box --help`.
const EXIT_CODES: &str = "Exit codes:
  0    success
  1    box failed (the error is on stderr), or a check found problems
       (box profile check, box doctor --strict)
  2    the command line is wrong (the usage error is on stderr)
  box run exits with the command's own status, or:
  125  box itself failed (the command did not start, or its units were not removed)
  130  interrupted by SIGINT, 143 by SIGTERM (the units are removed)
  255  the command was killed by a signal";

/// How box logs, in `box --help` and `box serve --help`.
pub(crate) const LOGGING: &str =
    "Logging (box serve, box run): on stderr, never stdout; --log-format json
for one JSON object a line. box serve logs at info, box run warnings only;
-v (debug) and -vv (trace) show more of box's own lines, -q (warnings and
errors), -qq (errors) and -qqq (nothing) less. Without -v or -q, BOX_LOG
picks what is logged, in tracing's filter syntax (BOX_LOG=debug,
BOX_LOG=info,box_host=debug); when BOX_LOG is unset, RUST_LOG is read.
Units' executors log into the same stream as box_executor events, their
fields as fields (BOX_LOG=info,box_executor=warn quiets them).";

/// What `box confine` and `box sandbox` run once they have confined their
/// process: everything after `--`.
#[derive(Debug, Clone, clap::Args)]
pub struct ConfinedCommand {
    /// The command to confine and run.
    #[arg(
        value_name = "CMD",
        required = true,
        last = true,
        allow_hyphen_values = true
    )]
    pub command: Vec<std::ffi::OsString>,
}

/// A `--filter KEY=VALUE` (`box units ls`, `box volumes ls`) split at its
/// first `=`, or why not: `example` shows one, `keys` names them all.
fn filter_parts<'a>(
    text: &'a str,
    example: &str,
    keys: &str,
) -> Result<(&'a str, &'a str), String> {
    let Some((key, value)) = text.split_once('=') else {
        return Err(format!("write KEY=VALUE, like {example}; keys: {keys}"));
    };
    if value.is_empty() {
        return Err(format!("`{key}=` has no value; write {key}=VALUE"));
    }
    Ok((key, value))
}

/// box: hardened, isolated units for AI agents' tool execution, behind one MCP host.
#[derive(Debug, Parser)]
#[command(
    name = "box",
    version = crate::VERSION,
    propagate_version = true,
    after_help = format!("{LOGGING}\n\n{EXIT_CODES}")
)]
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
    /// List, inspect and remove units.
    Units(backend_cli::UnitsArgs),
    /// Remove units whose session is gone.
    Gc(backend_cli::GcArgs),
    /// List, remove and prune volumes: the [[volume]] storage (caches) that outlives units.
    Volumes(crate::cli::volumes::VolumesArgs),
    /// Build the unit images offline, pull any image from its registry, and list them.
    Image(backend_cli::ImageArgs),
    /// Say which protections this machine can give, and which profiles can run here.
    Doctor(crate::cli::doctor::DoctorArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    #[command(
        after_help = "The script asks box itself at each TAB, so profile names (--profile,
box profile show NAME), unit ids (box units inspect ID) and volume keys
(box volumes rm KEY) are completed as they are now. Load it when the shell
starts, so it always matches the box installed (a saved file must be saved
again after upgrading box).

Examples:
  echo 'source <(box completions bash)' >> ~/.bashrc
  echo 'source <(box completions zsh)' >> ~/.zshrc
  echo 'box completions fish | source' > ~/.config/fish/completions/box.fish
  box completions bash > /etc/bash_completion.d/box"
    )]
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// The local backend's sandbox helper: confine this process, then run CMD.
    #[command(hide = true)]
    Sandbox(crate::cli::sandbox::SandboxArgs),
    /// box's first process in a unit: its lease, its executor's relay, reaping.
    #[command(hide = true, disable_help_flag = true)]
    Init(crate::cli::init::InitArgs),
    /// Run CMD under box's confinement (landlock, seccomp, no privileges): how the host runs git.
    #[command(hide = true)]
    Confine(crate::cli::confine::ConfineArgs),
}

/// Whether colour is off: `NO_COLOR` set and not empty (no-color.org).
pub fn no_color() -> bool {
    std::env::var_os("NO_COLOR").is_some_and(|value| !value.is_empty())
}

/// `--backend`'s choices: auto, then the backends this binary was built with
/// (box-testhost adds its fake), so help and completions list them.
pub(crate) fn backend_parser() -> PossibleValuesParser {
    let mut values =
        vec![PossibleValue::new("auto").help("docker when its engine answers, else local")];
    values.extend(
        crate::backends::registry()
            .kinds()
            .map(|kind| PossibleValue::new(kind.as_str())),
    );
    PossibleValuesParser::new(values)
}

/// The catalog of profiles a command resolves: `--profiles DIR`s first, then
/// the standard places. A `--profiles` that is not a directory is refused
/// (every command that takes it alike), not skipped.
pub(crate) fn catalog(dirs: &[std::path::PathBuf]) -> anyhow::Result<crate::profile::Catalog> {
    check_profile_dirs(dirs)?;
    Ok(crate::profile::Catalog::new(dirs.to_vec()))
}

/// Refuse a `--profiles DIR` that is not a directory: a typo would
/// otherwise be skipped silently and a shipped profile of the same name used.
pub(crate) fn check_profile_dirs(dirs: &[std::path::PathBuf]) -> anyhow::Result<()> {
    for dir in dirs {
        if !dir.is_dir() {
            anyhow::bail!("--profiles {}: not a directory", dir.display());
        }
    }
    Ok(())
}

/// `-v`/`-q` of the commands that log (`box serve`, `box run`).
#[derive(Debug, Clone, Copy, Default, clap::Args)]
pub struct Verbosity {
    /// Log more on stderr: -v debug, -vv trace (box's own lines; other crates' warnings only); over BOX_LOG and RUST_LOG.
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count, conflicts_with = "quiet")]
    pub verbose: u8,
    /// Log less on stderr: -q warnings and errors, -qq errors only, -qqq nothing; over BOX_LOG and RUST_LOG.
    #[arg(short = 'q', long = "quiet", action = clap::ArgAction::Count)]
    pub quiet: u8,
}

/// Log levels from the quietest; `Verbosity` moves along them.
const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

impl Verbosity {
    /// The log filter -v/-q ask for, moved from the command's `default`
    /// level; `None` when neither was given (BOX_LOG, RUST_LOG, then the
    /// default decide). Above warnings only box's own lines are raised: its
    /// dependencies' debug output is theirs to ask for through BOX_LOG.
    pub fn filter(self, default: &str) -> Option<String> {
        if self.verbose == 0 && self.quiet == 0 {
            return None;
        }
        let at = LEVELS
            .iter()
            .position(|level| *level == default)
            .unwrap_or(3);
        let at = (at + usize::from(self.verbose))
            .saturating_sub(usize::from(self.quiet))
            .min(LEVELS.len() - 1);
        let level = LEVELS[at];
        Some(if at > 2 {
            format!("warn,box={level}")
        } else {
            level.to_owned()
        })
    }
}

/// A closed choice of log format for `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object a line.
    Json,
}

impl LogFormat {
    /// Its name, as the host's logging takes it.
    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

/// Parse the command line and run the command (the `box` binary's `main`,
/// and `box-testhost`'s after it installs its registry).
pub fn main() -> ExitCode {
    // NO_COLOR is judged here; clap's `auto` then asks whether it is a terminal.
    let color = if no_color() {
        ColorChoice::Never
    } else {
        ColorChoice::Auto
    };
    // A TAB in a shell that loaded `box completions SHELL` ends here.
    complete::from_env(completed);
    let matches = Cli::command().color(color).get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(error) => error.format(&mut Cli::command()).exit(),
    };
    let result = match cli.command {
        Command::Serve(args) => crate::cli::serve::serve(args),
        Command::Run(args) => crate::cli::run::run(args),
        Command::Execute(args) => crate::cli::execute::execute(args),
        Command::Profile(args) => crate::cli::profile::cli(args),
        Command::Units(args) => backend_cli::units(args),
        Command::Gc(args) => backend_cli::gc(args),
        Command::Volumes(args) => crate::cli::volumes::volumes(args),
        Command::Image(args) => backend_cli::image(args),
        Command::Doctor(args) => crate::cli::doctor::doctor(args),
        Command::Completions { shell } => complete::registration(shell).map(|script| {
            out::write_bytes(&script);
            ExitCode::SUCCESS
        }),
        Command::Sandbox(args) => crate::cli::sandbox::sandbox(args),
        Command::Init(args) => crate::cli::init::init(args),
        Command::Confine(args) => crate::cli::confine::confine(args),
    };
    report(result)
}

/// The command line as completions offer it: without the hidden subcommands
/// (box's own helpers inside units), which clap_complete would list.
fn completed() -> clap::Command {
    let full = Cli::command();
    // clap cannot remove a subcommand: rebuild the list from the visible ones.
    let mut visible = clap::Command::new("box").version(env!("CARGO_PKG_VERSION"));
    for argument in full.get_arguments() {
        visible = visible.arg(argument.clone());
    }
    for subcommand in full
        .get_subcommands()
        .filter(|command| !command.is_hide_set())
    {
        visible = visible.subcommand(subcommand.clone());
    }
    visible
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
