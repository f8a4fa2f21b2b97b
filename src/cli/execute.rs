//! `box execute`: the executor's flags, parsed by clap into an
//! [`ExecutorSpec`], the same description the backends write command lines
//! from.

use std::path::PathBuf;

use box_policy::executor::{
    BashOutput, ExecutorSpec, FlagValue, PlaceKind, SeccompLayer, WriteGuard, choice,
};
use box_policy::plan::Requirement;

/// A closed choice's names, for clap: checked at parse, listed in help and completions.
fn names<T: FlagValue>() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(T::ALL.iter().map(|value| value.name()))
}

/// `box execute`: serve the executor over MCP on stdin/stdout.
#[derive(Debug, Clone, clap::Args)]
#[command(
    after_help = "box serve and box run start it inside each unit with the plan's flags; run
by hand it serves one MCP client on stdin/stdout with no unit around it (only
its own landlock and seccomp layers).

Examples:
  box execute --root ~/src/project --kind local
  box execute --root /workspace --kind container --ref box-base:bookworm --landlock required
  box execute --root . --kind local --write-guard off --max-read-bytes 1048576"
)]
pub struct ExecuteArgs {
    /// The workspace root every tool acts beneath; must exist.
    #[arg(long, value_name = "DIR")]
    pub root: PathBuf,
    /// What kind of place this is, for the descriptor: local, container or remote.
    #[arg(long, value_name = "K", default_value = "remote", value_parser = names::<PlaceKind>())]
    pub kind: String,
    /// What the place is called (image, host, pod), for the descriptor; default the host name.
    #[arg(long = "ref", value_name = "R")]
    pub reference: Option<String>,
    /// The most bytes of a file the tools read (read scans, edit rewrites, bash's analysis); 0 = 2 MiB.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub max_read_bytes: u64,
    /// Credential-looking variables to keep in children's environment, by exact name.
    #[arg(long, value_name = "A,B", value_delimiter = ',')]
    pub pass_env: Vec<String>,
    /// Whether overwriting or editing an existing file needs an earlier read of it.
    #[arg(long, value_name = "MODE", default_value = "read-first", value_parser = names::<WriteGuard>())]
    pub write_guard: String,
    /// Confine this process with landlock (writes only beneath the root and temp): required, best-effort or off.
    #[arg(long, value_name = "MODE", default_value = "best-effort", value_parser = names::<Requirement>())]
    pub landlock: String,
    /// box's own seccomp layer on this process and every child (io_uring, AF_ALG/VSOCK, keyrings,
    /// bpf, ptrace, mounts, namespaces, TIOCSTI...): on, or off (for debugging with strace/gdb).
    #[arg(long, value_name = "MODE", default_value = "on", value_parser = names::<SeccompLayer>())]
    pub seccomp: String,
    /// Terminal control characters in bash output (ANSI colour, OSC titles, cursor movement):
    /// escape shows them as \xHH so none reaches a client's terminal live; raw passes them through.
    #[arg(long, value_name = "MODE", default_value = "escape", value_parser = names::<BashOutput>())]
    pub bash_output: String,
    /// Secrets to write to /run/secrets/NAME (mode 0400) before serving, their values taken from
    /// BOX_SECRET_NAME (never passed on to a child); NAME:env also gives NAME to the
    /// processes the executor starts.
    #[arg(long, value_name = "A,B:env", default_value = "")]
    pub secrets: String,
    /// The host's egress proxy socket, bind-mounted into the unit (box sets this): served
    /// on 127.0.0.1:3128, where children's HTTP_PROXY/HTTPS_PROXY/ALL_PROXY point.
    #[arg(long, value_name = "PATH")]
    pub egress_socket: Option<PathBuf>,
    /// A directory this process and its children may also read, never write (box sets this: a
    /// worktree fork's borrowed git objects); repeat for more.
    #[arg(long, value_name = "DIR")]
    pub read: Vec<PathBuf>,
    /// A directory this process and its children may also write, besides --root and TMPDIR (box
    /// sets this: the unit's home, its own /tmp, its volumes); repeat for more.
    #[arg(long, value_name = "DIR")]
    pub write: Vec<PathBuf>,
}

impl ExecuteArgs {
    /// The typed spec, or an error naming the flag, its value and the choices.
    pub fn into_spec(self) -> anyhow::Result<ExecutorSpec> {
        Ok(ExecutorSpec {
            kind: choice("--kind", &self.kind)?,
            write_guard: choice("--write-guard", &self.write_guard)?,
            landlock: choice("--landlock", &self.landlock)?,
            seccomp: choice("--seccomp", &self.seccomp)?,
            bash_output: choice("--bash-output", &self.bash_output)?,
            reference: self.reference,
            max_read_bytes: self.max_read_bytes,
            pass_env: self.pass_env,
            secrets: box_policy::executor::parse_secrets(&self.secrets)?,
            root: self.root,
            egress_socket: self.egress_socket,
            read: self.read,
            write: self.write,
        })
    }
}

/// `box execute`.
pub fn execute(args: ExecuteArgs) -> anyhow::Result<std::process::ExitCode> {
    box_executor::serve(args.into_spec()?)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Execute {
        #[command(subcommand)]
        command: Sub,
    }

    #[derive(clap::Subcommand)]
    enum Sub {
        Execute(ExecuteArgs),
    }

    /// What a backend writes with `to_args`, `box execute` reads back as the
    /// same spec: the one contract between them.
    #[test]
    fn clap_reads_what_the_spec_writes() {
        let full = ExecutorSpec {
            root: PathBuf::from("/workspace dir"),
            kind: PlaceKind::Container,
            reference: Some("box-base:latest".to_owned()),
            max_read_bytes: 4096,
            pass_env: vec!["API_TOKEN".to_owned(), "GH_TOKEN".to_owned()],
            write_guard: WriteGuard::Off,
            landlock: Requirement::Required,
            seccomp: SeccompLayer::Off,
            bash_output: BashOutput::Raw,
            secrets: vec![
                box_policy::executor::SecretFile {
                    name: "DEPLOY_KEY".to_owned(),
                    as_env: false,
                },
                box_policy::executor::SecretFile {
                    name: "GH_TOKEN".to_owned(),
                    as_env: true,
                },
            ],
            egress_socket: Some(PathBuf::from("/.box/egress/proxy.sock")),
            read: vec![
                PathBuf::from("/.box/objects"),
                PathBuf::from("/srv/repo, with a comma/.git/objects"),
            ],
            write: vec![PathBuf::from("/home/box"), PathBuf::from("/tmp")],
        };
        for spec in [full, ExecutorSpec::new("/w")] {
            let argv = std::iter::once("box".to_owned()).chain(spec.to_args());
            let Sub::Execute(args) = Execute::try_parse_from(argv).unwrap().command;
            assert_eq!(args.into_spec().unwrap(), spec);
        }
    }
}
