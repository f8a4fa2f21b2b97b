//! git stages: the read-only subcommands and flags, and the probe of the
//! configuration of every repository a stage can reach (dax-wire.md 5.2).

use std::os::unix::ffi::OsStrExt as _;
use std::path::{Component, Path, PathBuf};

use super::paths::{Base, Reads, inside};
use crate::Context;
use box_scrub::Drivers;

/// git's read-only subcommands.
const GIT_READ_ONLY: &[&str] = &[
    "status",
    "diff",
    "log",
    "show",
    "branch",
    "rev-parse",
    "ls-files",
    "remote",
    "blame",
    "stash",
    "tag",
    "describe",
    "shortlog",
    "config",
];

/// Flag names (before any `=`) git's read-only subcommands may carry.
const GIT_FLAGS: &[&str] = &[
    "--patch",
    "--stat",
    "--numstat",
    "--shortstat",
    "--name-only",
    "--name-status",
    "--oneline",
    "--graph",
    "--decorate",
    "--no-decorate",
    "--all",
    "--abbrev-commit",
    "--pretty",
    "--format",
    "--date",
    "--since",
    "--until",
    "--after",
    "--before",
    "--author",
    "--committer",
    "--grep",
    "--reverse",
    "--max-count",
    "--skip",
    "--merges",
    "--no-merges",
    "--first-parent",
    "--follow",
    "--no-color",
    "--color",
    "--word-diff",
    "--cached",
    "--staged",
    "--short",
    "--branch",
    "--porcelain",
    "--untracked-files",
    "--ignored",
    "--ignore-space-change",
    "--ignore-all-space",
    "--minimal",
    "--diff-filter",
    "--summary",
    "--raw",
    "--no-patch",
    "--unified",
    "--relative",
    "--exit-code",
    "--quiet",
    "--check",
    "--no-renames",
    "--find-renames",
    "--verbose",
    "--remotes",
    "--list",
    "--show-current",
    "--contains",
    "--merged",
    "--no-merged",
    "--sort",
    "--tags",
    "--always",
    "--long",
    "--abbrev",
    "--dirty",
    "--show-toplevel",
    "--abbrev-ref",
    "--verify",
    "--is-inside-work-tree",
    "--show-prefix",
    "--show-cdup",
    "--symbolic-full-name",
    "--get",
    "--line-porcelain",
    "--root",
    "--modified",
    "--others",
    "--exclude-standard",
    "--deleted",
    "--stage",
    "--numbered",
    "--email",
    "--no-pager",
    "--ahead-behind",
    "--show-stash",
    "--topo-order",
    "--date-order",
    "--no-abbrev",
    "--full-history",
    "--simplify-merges",
    "--left-right",
    "--cherry-pick",
    "--boundary",
    "--count",
];

/// Single-letter flags git's read-only subcommands may carry (combined or alone).
const GIT_LETTERS: &[u8] = b"psbzarvlwtiquMnU0123456789";

/// The config keys `git config --get` may read.
fn safe_config_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    let parts: Vec<&str> = key.split('.').collect();
    matches!(
        key.as_str(),
        "user.name" | "user.email" | "core.autocrlf" | "init.defaultbranch" | "pull.rebase"
    ) || (parts.len() >= 3
        && ((parts[0] == "branch" && matches!(parts[parts.len() - 1], "remote" | "merge"))
            || (parts[0] == "remote" && matches!(parts[parts.len() - 1], "url" | "fetch"))))
}

pub(super) fn check_git(
    context: &Context,
    base: &Base,
    args: &[&str],
    drivers: &mut Drivers,
) -> Result<Reads, String> {
    let mut args = args;
    while let Some(("--no-pager", rest)) = args.split_first().map(|(first, rest)| (*first, rest)) {
        args = rest;
    }
    let Some((subcommand, rest)) = args.split_first() else {
        return Err("git without a subcommand".to_owned());
    };
    if !GIT_READ_ONLY.contains(subcommand) {
        return Err(format!("git {subcommand} is not read-only"));
    }
    match *subcommand {
        "remote" if !matches!(rest, [] | ["-v"] | ["--verbose"]) => {
            return Err("only `git remote -v`".to_owned());
        }
        "stash" if rest != ["list"] => return Err("only `git stash list`".to_owned()),
        "config" => {
            return match rest {
                ["--get", key] if safe_config_key(key) => Ok(Vec::new()),
                _ => Err("git config only as `--get` of a safe key".to_owned()),
            };
        }
        _ => {}
    }
    let mut reads = Vec::new();
    let mut paths_only = false;
    for arg in rest {
        if arg.contains("%G") {
            return Err("a %G format runs gpg".to_owned());
        }
        if !paths_only && *arg == "--" {
            paths_only = true;
            continue;
        }
        if !paths_only && arg.starts_with('-') && arg.len() > 1 {
            check_git_flag(subcommand, arg)?;
            continue;
        }
        if matches!(*subcommand, "branch" | "tag")
            && !rest.iter().any(|flag| *flag == "--list" || *flag == "-l")
        {
            return Err(format!("git {subcommand} with an argument may create one"));
        }
        if arg.contains(':') {
            return Err(format!("{arg} reaches the whole repository"));
        }
        if Path::new(arg)
            .components()
            .any(|component| component == Component::ParentDir)
        {
            return Err(format!("a .. in {arg}"));
        }
        if arg.starts_with('/') || paths_only || base.absolute.join(arg).symlink_metadata().is_ok()
        {
            inside(context, base, arg)?;
            reads.push(("read", (*arg).to_owned()));
        }
    }
    drivers.merge(&git_probe(context, base)?);
    Ok(reads)
}

fn check_git_flag(subcommand: &str, arg: &str) -> Result<(), String> {
    let name = arg.split('=').next().unwrap_or(arg);
    let forbidden = [
        "--output",
        "--ext-diff",
        "--textconv",
        "--git-dir",
        "--work-tree",
        "--no-index",
        "--exec-path",
        "--contents",
        "--open-files-in-pager",
        "--orderfile",
        "--pathspec-from-file",
        "--ignore-revs-file",
        "--upload-pack",
        "--paginate",
    ];
    if forbidden.iter().any(|flag| name.starts_with(flag)) {
        return Err(format!("git option {name}"));
    }
    if name.starts_with("--") {
        return if GIT_FLAGS.contains(&name) {
            Ok(())
        } else {
            Err(format!("git option {name} is not on the read-only list"))
        };
    }
    let letters = &arg.as_bytes()[1..];
    // branch and tag create, delete, rename and sign with most letters.
    let allowed: &[u8] = match subcommand {
        "branch" => b"arvl",
        "tag" => b"ln0123456789",
        _ => GIT_LETTERS,
    };
    // `-n5`, `-U3`: a letter with its count attached.
    let counted =
        matches!(letters.first(), Some(b'n' | b'U')) && letters[1..].iter().all(u8::is_ascii_digit);
    if counted || letters.iter().all(|letter| allowed.contains(letter)) {
        Ok(())
    } else {
        Err(format!("git option {arg}"))
    }
}

/// Whether a repository configuration key names a program or moves git
/// (dax-wire.md 5.2); the reason when it does.
fn dangerous_git_key(key: &str, value: &str) -> Option<&'static str> {
    let key = key.to_ascii_lowercase();
    let parts: Vec<&str> = key.split('.').collect();
    let (section, last) = (parts[0], parts[parts.len() - 1]);
    let sub = parts.len() >= 3;
    let boolean = matches!(
        value.to_ascii_lowercase().as_str(),
        "" | "true" | "false" | "yes" | "no" | "on" | "off" | "1" | "0"
    );
    let names_program =
        (section == "filter" && sub && matches!(last, "clean" | "smudge" | "process"))
            || (section == "diff" && sub && matches!(last, "command" | "textconv"))
            || key == "diff.external"
            || matches!(
                key.as_str(),
                "core.askpass"
                    | "core.editor"
                    | "core.gitproxy"
                    | "core.attributesfile"
                    | "sequence.editor"
                    | "uploadpack.packobjectshook"
                    | "core.alternaterefscommand"
            )
            || (section == "remote"
                && sub
                && matches!(last, "uploadpack" | "receivepack" | "proxy" | "vcs"))
            || (section == "credential" && last == "helper")
            || (section == "merge" && sub && last == "driver")
            || (section == "pager" && !boolean)
            || (section == "hook" && sub && last == "command");
    if names_program {
        return Some("names a program");
    }
    if section == "protocol" && last == "allow" && value.eq_ignore_ascii_case("always") {
        return Some("allows any transport");
    }
    if key == "core.worktree" {
        return Some("moves the work tree");
    }
    if key == "core.bare" && value.eq_ignore_ascii_case("true") {
        return Some("makes the repository bare");
    }
    if section == "extensions" {
        return Some("is a repository extension");
    }
    if section == "submodule" && last == "update" && value.starts_with('!') {
        return Some("names a program");
    }
    None
}

/// The repository-config probe: `.git` must be a plain directory, and the
/// configuration of the repository and of every repository git can enter from
/// it must name no program. What they define that the overrides must reach
/// (drivers, `diff.external`, in any scope) is the answer.
fn git_probe(context: &Context, base: &Base) -> Result<Drivers, String> {
    let mut git_dir = None;
    let mut dir = Some(base.absolute.as_path());
    while let Some(current) = dir {
        let dot_git = current.join(".git");
        if let Ok(metadata) = dot_git.symlink_metadata() {
            if metadata.file_type().is_symlink() {
                return Err(format!(".git in {} is a symbolic link", current.display()));
            }
            if !metadata.is_dir() {
                return Err(format!(
                    ".git in {} is a file that points git at another directory",
                    current.display()
                ));
            }
            git_dir = Some(dot_git);
            break;
        }
        dir = current.parent();
    }
    let mut drivers = Drivers::default();
    if !probe_config(context, &base.absolute, "", &mut drivers)? {
        return match git_dir {
            Some(git_dir) => Err(format!(
                "the configuration of the repository at {} cannot be read",
                git_dir.display()
            )),
            None => Ok(drivers),
        };
    }
    if let Some(git_dir) = git_dir {
        probe_submodules(context, &git_dir)?;
        let mut entered = 0;
        probe_entered(context, &base.absolute, &mut drivers, &mut entered)?;
    }
    Ok(drivers)
}

/// Check the configuration git reads in `dir`: its own scopes (local,
/// worktree, includes) must name no program; every scope's drivers and
/// `diff.external` are added to `drivers` (the command scope is the
/// neutralisation's own). `false` when git answers nothing there (no
/// repository). `what` names the repository in a refusal.
fn probe_config(
    context: &Context,
    dir: &Path,
    what: &str,
    drivers: &mut Drivers,
) -> Result<bool, String> {
    let output = box_scrub::git_query(
        dir,
        &context.child_env,
        &["config", "--list", "-z", "--show-scope", "--show-origin"],
    )?;
    let Some(output) = output else {
        return Ok(false);
    };
    // Entries: scope NUL origin NUL key NEWLINE value NUL.
    let text = String::from_utf8_lossy(&output);
    let mut fields = text.split('\0');
    while let (Some(scope), Some(origin), Some(entry)) =
        (fields.next(), fields.next(), fields.next())
    {
        let (key, value) = entry.split_once('\n').unwrap_or((entry, ""));
        if scope == "command" {
            continue;
        }
        drivers.add_key(key);
        if matches!(scope, "system" | "global") {
            continue;
        }
        if let Some(why) = dangerous_git_key(key, value) {
            return Err(format!("{key} {why} (set in {origin}{what})"));
        }
    }
    Ok(true)
}

/// The most repositories git may enter from one stage before the stage asks
/// instead.
const MAX_ENTERED_REPOSITORIES: usize = 200;

/// Every populated submodule or embedded repository the index of the
/// repository holding `dir` names (a gitlink whose directory has a `.git`),
/// recursively: `git status` and `git diff` run git inside each with its own
/// configuration (a clean filter there runs on a changed file). Each is
/// probed as the repository itself is.
fn probe_entered(
    context: &Context,
    dir: &Path,
    drivers: &mut Drivers,
    entered: &mut usize,
) -> Result<(), String> {
    let Some(top) =
        box_scrub::git_query(dir, &context.child_env, &["rev-parse", "--show-toplevel"])?
    else {
        return Err(format!(
            "where the repository holding {} begins cannot be read",
            dir.display()
        ));
    };
    let top = PathBuf::from(
        String::from_utf8_lossy(&top)
            .trim_end_matches('\n')
            .to_owned(),
    );
    let Some(index) = box_scrub::git_query(&top, &context.child_env, &["ls-files", "-s", "-z"])?
    else {
        return Err(format!(
            "the index of the repository at {} cannot be read",
            top.display()
        ));
    };
    // Entries: MODE SP OBJECT SP STAGE TAB PATH NUL.
    for entry in index.split(|byte| *byte == 0) {
        let Some(path) = entry.strip_prefix(b"160000 ") else {
            continue;
        };
        let Some(tab) = path.iter().position(|byte| *byte == b'\t') else {
            continue;
        };
        let path = std::ffi::OsStr::from_bytes(&path[tab + 1..]);
        let repository = top.join(path);
        if repository.join(".git").symlink_metadata().is_err() {
            continue;
        }
        *entered += 1;
        if *entered > MAX_ENTERED_REPOSITORIES {
            return Err(format!(
                "more than {MAX_ENTERED_REPOSITORIES} submodules or embedded repositories under {}",
                top.display()
            ));
        }
        let what = format!(
            ", in {}, which git enters from {}",
            repository.display(),
            top.display()
        );
        if !probe_config(context, &repository, &what, drivers)? {
            return Err(format!(
                "the configuration of {}, which git enters from {}, cannot be read",
                repository.display(),
                top.display()
            ));
        }
        probe_entered(context, &repository, drivers, entered)?;
    }
    Ok(())
}

/// The most submodule configurations the probe reads before it asks instead.
const MAX_SUBMODULE_CONFIGS: usize = 200;

/// Every `config` under `<gitdir>/modules`, checked strictly: git runs inside
/// a submodule with that configuration, and the driver overrides only name
/// the superproject's drivers. `core.bare`/`core.worktree` are allowed there
/// because git writes them for submodules.
fn probe_submodules(context: &Context, git_dir: &Path) -> Result<(), String> {
    let mut pending = vec![git_dir.join("modules")];
    let mut configs = Vec::new();
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(file_type) = entry.file_type() else {
                continue;
            };
            if file_type.is_dir() {
                pending.push(entry.path());
            } else if entry.file_name() == "config" {
                configs.push(entry.path());
                if configs.len() > MAX_SUBMODULE_CONFIGS {
                    return Err(format!(
                        "more than {MAX_SUBMODULE_CONFIGS} submodule configurations under {}",
                        git_dir.display()
                    ));
                }
            }
        }
    }
    for config in configs {
        let file = config.to_string_lossy();
        let output = box_scrub::git_query(
            git_dir,
            &context.child_env,
            &["config", "--file", &file, "--list", "-z"],
        )?
        .ok_or_else(|| format!("{file} cannot be read"))?;
        let text = String::from_utf8_lossy(&output);
        for entry in text.split('\0').filter(|entry| !entry.is_empty()) {
            let (key, value) = entry.split_once('\n').unwrap_or((entry, ""));
            let lower = key.to_ascii_lowercase();
            if matches!(lower.as_str(), "core.bare" | "core.worktree") {
                continue;
            }
            let why = dangerous_git_key(key, value).or_else(|| strict_git_key(&lower, value));
            if let Some(why) = why {
                return Err(format!("{key} {why} (set in {file})"));
            }
        }
    }
    Ok(())
}

/// The keys strict mode adds: those the neutralisation covers, for
/// configuration it may not reach.
fn strict_git_key(key: &str, value: &str) -> Option<&'static str> {
    let boolean = matches!(
        value.to_ascii_lowercase().as_str(),
        "" | "true" | "false" | "yes" | "no" | "on" | "off" | "1" | "0"
    );
    let program = (key == "core.fsmonitor" && !boolean)
        || key == "gpg.program"
        || (key.starts_with("gpg.") && key.ends_with(".program") && !boolean)
        || matches!(key, "core.hookspath" | "core.sshcommand" | "core.pager");
    program.then_some("names a program")
}

#[cfg(test)]
mod tests;
