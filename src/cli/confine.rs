//! `box confine` (hidden): run one command under box's own confinement, the
//! way the host runs git for `box/fork` and `box/merge` (box-fork's `Confine`):
//! optionally as another user (`--uid`/`--gid`: a root host runs git as the
//! owner of a user's repository), no_new_privs, every capability dropped, landlock (required: the system
//! directories and `--read` readable, `--write` and the devices writable,
//! nothing else; TCP denied where the kernel can), box's seccomp filter with
//! IP sockets refused, then `execve` of CMD with the environment it was
//! given (the caller's, already cleared and git-neutralised). Runs before any
//! thread starts, so the confinement covers the whole process.

use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;

use anyhow::Context as _;
use box_policy::plan::Requirement;

/// `box confine`: confine this process, then run CMD.
#[derive(Debug, Clone, clap::Args)]
pub struct ConfineArgs {
    /// Readable (and executable) beneath this path, besides the system directories.
    #[arg(long, value_name = "PATH")]
    pub read: Vec<PathBuf>,
    /// Readable and writable beneath this path.
    #[arg(long, value_name = "PATH")]
    pub write: Vec<PathBuf>,
    /// Run as this uid (with `--gid`; supplementary groups cleared).
    #[arg(long, value_name = "UID", requires = "gid")]
    pub uid: Option<u32>,
    /// Run as this gid (with `--uid`).
    #[arg(long, value_name = "GID", requires = "uid")]
    pub gid: Option<u32>,
    #[command(flatten)]
    pub run: super::ConfinedCommand,
}

/// Confine, then `execve` CMD; returns only on failure.
pub fn confine(args: ConfineArgs) -> anyhow::Result<std::process::ExitCode> {
    let Some((program, rest)) = args.run.command.split_first() else {
        anyhow::bail!("box confine: no command given");
    };
    box_confine::set_no_new_privs().context("box confine: no_new_privs")?;
    // Groups, then gid, then uid (setuid gives up the right to change the
    // others); leaving root also empties the capability sets, and the drop
    // below checks they are empty.
    if let (Some(uid), Some(gid)) = (args.uid, args.gid) {
        // The bounding set while this process may still empty it: after
        // setuid, git keeps no capability and can gain none.
        box_confine::drop_bounding_set();
        nix::unistd::setgroups(&[]).context("box confine: clearing supplementary groups")?;
        nix::unistd::setgid(nix::unistd::Gid::from_raw(gid))
            .with_context(|| format!("box confine: setgid {gid}"))?;
        nix::unistd::setuid(nix::unistd::Uid::from_raw(uid))
            .with_context(|| format!("box confine: setuid {uid}"))?;
    }
    let sets = box_confine::drop_capabilities().context("box confine: dropping capabilities")?;
    if args.uid.is_some() && sets.bounding != 0 {
        anyhow::bail!(
            "box confine: the capability bounding set is not empty ({:#x}) after switching user",
            sets.bounding
        );
    }
    let mut rules = box_confine::landlock_rules(&args.read, &args.write);
    // Network none for git: TCP by landlock where the kernel has ABI 4,
    // every IP socket by seccomp below.
    rules.deny_tcp = box_confine::landlock_abi() >= 4;
    box_confine::apply_landlock(&rules, Requirement::Required, 1)
        .context("box confine: landlock is required to run git on a workspace")?;
    box_confine::apply_seccomp(box_confine::SeccompOptions { deny_ip: true })
        .context("box confine: box's seccomp filter")?;
    let error = std::process::Command::new(program).args(rest).exec();
    Err(anyhow::anyhow!(
        "box confine: running {}: {error}",
        PathBuf::from(program).display()
    ))
}

/// box-fork's [`box_fork::Confine`] through this binary's `box confine`.
#[derive(Debug, Clone)]
pub struct SelfConfine {
    /// This binary.
    pub exe: PathBuf,
}

impl box_fork::Confine for SelfConfine {
    fn command(
        &self,
        program: &std::path::Path,
        access: &box_fork::GitAccess,
    ) -> std::io::Result<std::process::Command> {
        let mut command = std::process::Command::new(&self.exe);
        command.arg("confine");
        for path in &access.read {
            command.arg("--read").arg(path);
        }
        for path in &access.write {
            command.arg("--write").arg(path);
        }
        if let Some((uid, gid)) = access.owner {
            command
                .arg("--uid")
                .arg(uid.to_string())
                .arg("--gid")
                .arg(gid.to_string());
        }
        command.arg("--").arg(program);
        Ok(command)
    }
}

/// The git runner of `box serve`: git from the system's directories, with a
/// cleared environment plus box's git neutralisation, each command under
/// `box confine`. `None` when the kernel has no landlock, no git is found or
/// this binary's path cannot be read (forks then use copy mode only).
pub fn fork_git() -> Option<box_fork::Git> {
    // `box confine` requires landlock: without it git would fail at every
    // fork, so forks are copies from the start (worktree refused, naming why).
    if box_confine::landlock_abi() == 0 {
        tracing::warn!(
            "the kernel has no landlock: box cannot confine git, so box/fork makes copies only"
        );
        return None;
    }
    let exe = std::env::current_exe().ok()?;
    let program = ["/usr/bin/git", "/bin/git", "/usr/local/bin/git"]
        .into_iter()
        .map(PathBuf::from)
        .find(|path| path.is_file())?;
    let mut env: Vec<(String, String)> = vec![
        ("PATH".to_owned(), "/usr/bin:/bin".to_owned()),
        ("HOME".to_owned(), "/nonexistent".to_owned()),
        ("LC_ALL".to_owned(), "C".to_owned()),
        // Neither the host's system nor a user's global configuration reaches
        // a fork's git: it reads the workspace and box's settings only.
        ("GIT_CONFIG_NOSYSTEM".to_owned(), "1".to_owned()),
        ("GIT_CONFIG_GLOBAL".to_owned(), "/dev/null".to_owned()),
    ];
    env.extend(box_scrub::git_neutralisation());
    Some(
        box_fork::Git::new(env)
            .with_program(program)
            .with_confinement(std::sync::Arc::new(SelfConfine { exe })),
    )
}
