//! `box run`: its flags, turned into a [`RunConfig`] (`run.rs` runs it).

use std::path::PathBuf;
use std::process::ExitCode;

use crate::cli::LogFormat;
use crate::run::RunConfig;

/// `box run`: one command in a fresh session's workspace unit.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = RUN_AFTER_HELP)]
pub struct RunArgs {
    /// The profile to resolve [default: default; with --host, the host's own default].
    #[arg(long, value_name = "NAME", add = clap_complete::ArgValueCandidates::new(crate::cli::complete::profile_names))]
    pub profile: Option<String>,
    /// Run the command through a running `box serve --listen` at this URL
    /// (`http://127.0.0.1:8080`, or a bare port on loopback) instead of a host in
    /// this process: its profiles, backend and warm pools serve it, so a command
    /// claims a pooled unit when the host keeps one for its plan.
    #[arg(long, value_name = "URL", env = "BOX_HOST", conflicts_with_all = ["profile_dirs", "workspace", "backend"])]
    pub host: Option<String>,
    /// With --host: a file holding the bearer token the host asks of its
    /// clients (its --token-file).
    #[arg(long, value_name = "FILE", env = "BOX_TOKEN_FILE", requires = "host")]
    pub token_file: Option<PathBuf>,
    /// With --host: wait until the host confirms the session's units removed
    /// (exit 125 if it does not), as box run without --host always does; by
    /// default the host removes them after the command's status is passed on.
    #[arg(long, requires = "host")]
    pub wait_removal: bool,
    /// More directories of profiles, searched first (repeatable).
    #[arg(long = "profiles", value_name = "DIR")]
    pub profile_dirs: Vec<PathBuf>,
    /// Tightenings, as JSON or @FILE.
    #[arg(long, value_name = "JSON")]
    pub tighten: Option<String>,
    /// Where units run.
    #[arg(long, value_name = "BACKEND", default_value = "auto", value_parser = crate::cli::backend_parser())]
    pub backend: String,
    /// The host directory a `cwd` workspace source means; default the current directory.
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// Log format on stderr.
    #[arg(long, value_name = "FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// -v/-q: how much box logs (the command's own output is never touched).
    #[command(flatten)]
    pub verbosity: crate::cli::Verbosity,
    /// Set a variable for the command: NAME passes this shell's value, NAME=VALUE sets
    /// one; only variables the profile lets through (its env.pass and env.secrets), repeatable.
    #[arg(short = 'e', long = "env", value_name = "NAME[=VALUE]")]
    pub env: Vec<String>,
    /// Forward stdin even when it is a terminal (a pipe or a file is always forwarded).
    #[arg(short = 'i', long)]
    pub interactive: bool,
    /// Give the command a terminal of its own (a pseudo-terminal in its unit); with -i
    /// from a terminal, keys go to it raw (^C included) and its size follows this one's.
    #[arg(short = 't', long)]
    pub tty: bool,
    /// The command and its arguments: the first argument that is not one of box run's
    /// options starts it, and all after it are the command's (`--` before it is allowed).
    #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// `box run`'s examples and exit codes, in its `--help`.
pub const RUN_AFTER_HELP: &str = "Examples:
  box run uname -a
  echo hi | box run cat
  box run -e LANG=C.UTF-8 -- sh -c 'locale; ls -la'
  box run --profile offline --tighten '{\"limits\": {\"memory\": \"512MiB\"}}' sh -c 'id; ls'
  box run -it bash
  box serve --listen 8080 --pool default=4 &   box run --host 8080 make test

Terminal (-t), as `docker run`: -it gives an interactive terminal; -it when stdin is
not a terminal is refused (\"the input device is not a TTY\", exit 125); -t alone
works with any stdin and stdout (the command still has a terminal; its output then
carries the terminal's \\r\\n, and stderr is joined to stdout).

Exit codes:
  N    the command's own status
  125  box itself failed (the command did not start, or its units were not removed)
  130  interrupted by SIGINT (^C), 143 by SIGTERM: the signal is passed on to
       the command, then its units are removed at once
  255  the command was killed by a signal";

impl RunArgs {
    /// Into a [`RunConfig`], reading --token-file.
    fn config(self) -> anyhow::Result<RunConfig> {
        use anyhow::Context as _;
        use std::io::IsTerminal as _;
        // As `docker run -i`: a terminal's input is forwarded only when asked.
        let stdin = self.interactive || !std::io::stdin().is_terminal();
        let host = match self.host.clone() {
            Some(url) => {
                let token = match &self.token_file {
                    Some(path) => Some(
                        std::fs::read_to_string(path)
                            .with_context(|| format!("--token-file {}", path.display()))?
                            .trim()
                            .to_owned(),
                    ),
                    None => None,
                };
                Some(crate::run::RemoteHost {
                    url,
                    token,
                    wait_removal: self.wait_removal,
                })
            }
            None => None,
        };
        let args = self;
        Ok(RunConfig {
            profile: args.profile,
            host,
            profile_dirs: args.profile_dirs,
            tighten: args.tighten,
            backend: args.backend,
            registry: crate::backends::registry(),
            workspace: args.workspace,
            log_format: args.log_format.as_str().to_owned(),
            log_filter: args.verbosity.filter("warn"),
            env: args.env,
            stdin,
            tty: args.tty,
            command: args.command,
        })
    }
}

/// Run one command through a session of its own; the exit code is the command's.
pub fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    use std::io::IsTerminal as _;
    // As `docker run -it`: an interactive terminal needs one to type at.
    if args.tty && args.interactive && !std::io::stdin().is_terminal() {
        eprintln!(
            "box run: -it: the input device is not a TTY (stdin is a pipe or a file); drop -t to forward it as a stream"
        );
        return Ok(ExitCode::from(125));
    }
    if let Err(error) = crate::cli::check_profile_dirs(&args.profile_dirs) {
        eprintln!("box run: {error}");
        return Ok(ExitCode::from(125));
    }
    // A unit's image pulled before it starts shows its progress here, as
    // `docker run` does.
    let progress = crate::cli::pull::Progress::new(crate::cli::pull::Style::for_stderr());
    crate::backends::show_pull_progress(progress.sink());
    let config = match args.config() {
        Ok(config) => config,
        Err(error) => {
            eprintln!("box run: {error:#}");
            return Ok(ExitCode::from(125));
        }
    };
    let result = crate::run::run(config);
    progress.finish();
    result
}
