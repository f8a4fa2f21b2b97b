//! `box profile list | show NAME | check [FILE...] | resolve NAME`: the policy
//! made visible. Human output by default, `--json` for scripts; `check` prints
//! every problem and exits non-zero when there is one.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use serde_json::{Value, json};

use crate::plan::{self, HostFacts, LocalUserland, PullPolicy, UserIds};
use crate::profile::{
    Catalog, Danger, LimitsPolicy, NetworkPolicy, Problem, Profile, ProfileError, Show, Shown,
    Source, show_duration,
};

/// `box profile`: list, show, check and resolve profiles.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = "Examples:
  box profile list
  box profile show ci
  box profile check ./profiles/mine.toml
  box profile resolve ci --tighten '{\"limits\": {\"memory\": \"1GiB\"}}'
  box profile --profiles ./profiles resolve mine --workspace ~/src/project --json")]
pub struct ProfileArgs {
    /// Search this directory for NAME.toml before the standard places (repeatable).
    #[arg(long = "profiles", value_name = "DIR", global = true)]
    pub profiles: Vec<PathBuf>,
    /// What to do.
    #[command(subcommand)]
    pub command: ProfileCommand,
}

/// The `box profile` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum ProfileCommand {
    /// List every profile box can find, in search order.
    #[command(after_help = "Examples:
  box profile list
  box profile list --json
  box profile --profiles ./profiles list")]
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show a profile as resolved through `extends`, dangerous asks first.
    #[command(after_help = "Examples:
  box profile show default
  box profile show ci --json
  box profile --profiles ./profiles show mine")]
    Show {
        /// The profile's name.
        #[arg(add = clap_complete::ArgValueCandidates::new(crate::cli::complete::profile_names))]
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Check profile files (or every profile box can find); exit 1 on any problem.
    #[command(after_help = "Examples:
  box profile check
  box profile check ./profiles/mine.toml --json
  box profile --profiles ./profiles check")]
    Check {
        /// The files to check (default: every profile box can find).
        files: Vec<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Resolve a profile, narrowed by a tightening, into the plan a session would get.
    #[command(after_help = "Examples:
  box profile resolve default
  box profile resolve ci --workspace ~/src/project --json
  box profile resolve default --tighten '{\"network\": {\"allow\": []}}'
  box profile resolve default --tighten @tighten.json --caller 1000:1000")]
    Resolve {
        /// The profile's name.
        #[arg(add = clap_complete::ArgValueCandidates::new(crate::cli::complete::profile_names))]
        name: String,
        /// The tightening, as JSON or @FILE.
        #[arg(long, value_name = "JSON|@FILE")]
        tighten: Option<String>,
        /// The host directory a `cwd` workspace source means; default the current
        /// directory (as `box serve` and `box run` take it).
        // `--cwd` was its name before; kept, unlisted, for scripts.
        #[arg(long, value_name = "DIR", alias = "cwd")]
        workspace: Option<PathBuf>,
        /// Resolve `user = "host"` as these ids (default: the caller's).
        #[arg(long, value_name = "UID:GID")]
        caller: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Run a `box profile` subcommand.
pub fn cli(args: ProfileArgs) -> anyhow::Result<ExitCode> {
    let catalog = super::catalog(&args.profiles)?;
    let text = match args.command {
        ProfileCommand::List { json } => list(&catalog, json),
        ProfileCommand::Show { name, json } => {
            let profile = catalog.load(&name)?;
            if json {
                pretty(&profile_json(&profile))
            } else {
                show(&profile)
            }
        }
        ProfileCommand::Check { files, json } => {
            let (text, ok) = check(&catalog, &files, json);
            super::out::write_bytes(text.as_bytes());
            return Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            });
        }
        ProfileCommand::Resolve {
            name,
            tighten,
            workspace,
            caller,
            json,
        } => {
            let profile = catalog.load(&name)?;
            let tighten = match tighten {
                None => Value::Null,
                Some(text) => read_tightening(&text)?,
            };
            let host = host_facts(workspace, caller.as_deref())?;
            // As a host resolves it: a root caller's `user = "host"` unit
            // runs as the owner of its workspace.
            let plan = crate::host::resolve_plan(&profile, &tighten, &host)?;
            if json {
                pretty(&plan.to_json())
            } else {
                show_plan(&plan)
            }
        }
    };
    super::out::write_bytes(text.as_bytes());
    Ok(ExitCode::SUCCESS)
}

fn pretty(value: &Value) -> String {
    let mut text = serde_json::to_string_pretty(value).unwrap_or_default();
    text.push('\n');
    text
}

/// The most bytes read from a `--tighten @FILE`; a tightening is small.
const MAX_TIGHTENING_BYTES: u64 = 1 << 20;

fn read_tightening(text: &str) -> anyhow::Result<Value> {
    let (source, body) = match text.strip_prefix('@') {
        Some(path) => {
            let file = std::fs::File::open(path)
                .with_context(|| format!("--tighten: cannot read {path}"))?;
            let mut body = String::new();
            std::io::Read::read_to_string(
                &mut std::io::Read::take(file, MAX_TIGHTENING_BYTES),
                &mut body,
            )
            .with_context(|| format!("--tighten: cannot read {path}"))?;
            (path.to_owned(), body)
        }
        None => ("--tighten".to_owned(), text.to_owned()),
    };
    plan::parse_tightening_text(&body).map_err(|error| anyhow::anyhow!("{error} (in {source})"))
}

fn host_facts(cwd: Option<PathBuf>, caller: Option<&str>) -> anyhow::Result<HostFacts> {
    let cwd = match cwd {
        Some(cwd) if cwd.is_absolute() => cwd,
        Some(cwd) => std::env::current_dir()
            .context("cannot read the working directory")?
            .join(cwd),
        None => std::env::current_dir().context("cannot read the working directory")?,
    };
    // Judged as the host would (it canonicalises); a directory that does not
    // exist here is shown as written.
    let cwd = std::fs::canonicalize(&cwd).unwrap_or(cwd);
    let caller = match caller {
        None => UserIds {
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
        },
        Some(text) => {
            let parsed = text.split_once(':').and_then(|(uid, gid)| {
                Some(UserIds {
                    uid: uid.parse().ok()?,
                    gid: gid.parse().ok()?,
                })
            });
            parsed.with_context(|| format!("--caller: {text:?} is not UID:GID, like 1000:1000"))?
        }
    };
    Ok(HostFacts {
        cwd,
        caller,
        workspace_owner: None,
    })
}

fn list(catalog: &Catalog, json: bool) -> String {
    let listed = catalog.list();
    let described: Vec<(crate::profile::Listed, Result<Profile, ProfileError>)> = listed
        .into_iter()
        .map(|entry| {
            let profile = if entry.hidden {
                Err(ProfileError::plain("hidden"))
            } else if entry.origin.starts_with("shipped:") {
                catalog.load(&entry.name)
            } else {
                catalog.load_file(std::path::Path::new(&entry.origin))
            };
            (entry, profile)
        })
        .collect();
    if json {
        let items: Vec<Value> = described
            .iter()
            .map(|(entry, profile)| {
                json!({
                    "name": entry.name,
                    "origin": entry.origin,
                    "hidden": entry.hidden,
                    "description": profile.as_ref().ok().map(|profile| profile.description.clone()),
                    "ok": entry.hidden || profile.is_ok(),
                })
            })
            .collect();
        return pretty(&json!({ "profiles": items }));
    }
    let width = described
        .iter()
        .map(|(entry, _)| entry.name.len())
        .max()
        .unwrap_or(0);
    let mut text = String::new();
    for (entry, profile) in &described {
        let about = if entry.hidden {
            "(hidden by an earlier file of the same name)".to_owned()
        } else {
            match profile {
                Ok(profile) => profile.description.clone(),
                Err(error) => format!(
                    "INVALID: {} problem(s); run `box profile check`",
                    error.problems.len()
                ),
            }
        };
        text.push_str(&format!(
            "{:width$}  {about}  [{}]\n",
            entry.name, entry.origin
        ));
    }
    text
}

fn check(catalog: &Catalog, files: &[PathBuf], json: bool) -> (String, bool) {
    let results: Vec<(String, Result<Profile, ProfileError>)> = if files.is_empty() {
        catalog
            .list()
            .into_iter()
            .filter(|entry| !entry.hidden)
            .map(|entry| {
                let result = if entry.origin.starts_with("shipped:") {
                    catalog.load(&entry.name)
                } else {
                    catalog.load_file(std::path::Path::new(&entry.origin))
                };
                (entry.origin, result)
            })
            .collect()
    } else {
        files
            .iter()
            .map(|file| (file.display().to_string(), catalog.load_file(file)))
            .collect()
    };
    let ok = results.iter().all(|(_, result)| result.is_ok());
    if json {
        let items: Vec<Value> = results
            .iter()
            .map(|(origin, result)| {
                let problems: &[Problem] = match result {
                    Ok(_) => &[],
                    Err(error) => &error.problems,
                };
                json!({
                    "file": origin,
                    "name": result.as_ref().ok().map(|profile| profile.name.clone()),
                    "ok": result.is_ok(),
                    "problems": problems.iter().map(problem_json).collect::<Vec<_>>(),
                })
            })
            .collect();
        return (pretty(&json!({"ok": ok, "profiles": items})), ok);
    }
    let mut text = String::new();
    let mut count = 0;
    for (origin, result) in &results {
        match result {
            Ok(profile) => {
                let loud = if profile.dangerous.is_empty() {
                    String::new()
                } else {
                    format!(
                        " (DANGEROUS, allowed by [operator]: {})",
                        danger_names(&profile.dangerous)
                    )
                };
                text.push_str(&format!("ok     {origin}{loud}\n"));
            }
            Err(error) => {
                for problem in &error.problems {
                    count += 1;
                    text.push_str(&format!("error  {problem}\n"));
                }
            }
        }
    }
    if !ok {
        text.push_str(&format!("{count} problem(s) found\n"));
    }
    (text, ok)
}

fn problem_json(problem: &Problem) -> Value {
    json!({
        "file": problem.at.file.as_ref(),
        "line": problem.at.line,
        "column": problem.at.column,
        "field": problem.field,
        "message": problem.message,
    })
}

fn danger_names(dangers: &[Danger]) -> String {
    dangers
        .iter()
        .map(|danger| danger.name())
        .collect::<Vec<_>>()
        .join(", ")
}

fn network_text(network: &NetworkPolicy) -> String {
    let allow: Vec<String> = network.allow.iter().map(ToString::to_string).collect();
    mode_to(network.mode, &allow)
}

/// `egress to a, b`: a network's mode and what it may reach.
fn mode_to(mode: plan::NetworkMode, allow: &[String]) -> String {
    let mode = mode.as_str();
    if allow.is_empty() {
        mode.to_owned()
    } else {
        format!("{mode} to {}", allow.join(", "))
    }
}

/// A table's fields on its line, as `fields.rs` declares them: `name value,
/// name [a, b]`; the dangerous ones are left to lines of their own.
fn fields_text(shown: &[Shown]) -> String {
    let pairs: Vec<String> = shown
        .iter()
        .filter(|field| field.show == Show::Line)
        .map(Shown::pair)
        .collect();
    pairs.join(", ")
}

/// A table's dangerous fields the profile sets.
fn dangers_set(shown: &[Shown]) -> impl Iterator<Item = &Shown> {
    shown
        .iter()
        .filter(|field| field.show == Show::Danger && !field.default)
}

/// A table's fields as `--json` writes them, in the profile's words.
fn fields_json(shown: &[Shown]) -> Value {
    Value::Object(
        shown
            .iter()
            .map(|field| (field.name.to_owned(), field.json.clone()))
            .collect(),
    )
}

fn limits_json(limits: &LimitsPolicy) -> Value {
    limits.show_json()
}

/// A network as `--json` writes it: its mode and allow list, and the
/// egress proxy's fields the profile sets.
fn network_json(network: &NetworkPolicy) -> Value {
    fields_json(&set(network.shown()))
}

/// A table's fields but those shown only when set (`Show::IfSet`) and not.
fn set(shown: Vec<Shown>) -> Vec<Shown> {
    shown
        .into_iter()
        .filter(|field| field.show != Show::IfSet || !field.default)
        .collect()
}

/// The field `name` of a table as `box profile show` writes it.
fn text_of(shown: &[Shown], name: &str) -> String {
    shown
        .iter()
        .find(|field| field.name == name)
        .map(|field| field.text.clone())
        .unwrap_or_default()
}

/// A profile as JSON, in the profile's own words (snake_case, as the TOML).
fn profile_json(profile: &Profile) -> Value {
    let mut shown = json!({
        "name": profile.name,
        "description": profile.description,
        "origin": profile.origin,
        "extends": profile.extends,
        "dangerous": profile.dangerous.iter().map(|danger| danger.name()).collect::<Vec<_>>(),
        "workspace": fields_json(&set(profile.workspace.shown())),
        "network": network_json(&profile.network),
        "limits": limits_json(&profile.limits),
        "env": {
            "set": profile.env.set,
            "pass": profile.env.pass,
            "secrets": profile.env.secret_names(),
            "secrets_as_env": profile.env.secrets_as_env(),
        },
        "security": fields_json(&profile.security.shown()),
        "lifecycle": fields_json(&profile.lifecycle.shown()),
        "pool": fields_json(&profile.pool.shown()),
        "servers": profile.servers.iter().map(|server| json!({
            "name": server.name,
            "image": server.image,
            "command": server.command,
            "description": server.description,
            "network": network_json(&server.network),
            "limits": limits_json(&server.limits),
        })).collect::<Vec<_>>(),
    });
    // Only profiles with volumes show them; others' JSON is unchanged.
    if !profile.volumes.is_empty() {
        shown["volumes"] = json!(
            profile
                .volumes
                .iter()
                .map(|volume| fields_json(&set(volume.shown())))
                .collect::<Vec<_>>()
        );
    }
    for (index, server) in profile.servers.iter().enumerate() {
        if let Some(runtime) = &server.runtime {
            shown["servers"][index]["runtime"] = json!(runtime);
        }
        if server.pull != PullPolicy::default() {
            shown["servers"][index]["pull"] = json!(server.pull.as_str());
        }
        if server.local_userland != LocalUserland::default() {
            shown["servers"][index]["local_userland"] = json!(server.local_userland.as_str());
        }
        // Every other field, as its row gives it (left out at its default
        // where it is shown only when set).
        if let Value::Object(written) = &mut shown["servers"][index] {
            for field in set(server.shown()) {
                if !SERVER_SHOWN.contains(&field.name) {
                    written.insert(field.name.to_owned(), field.json);
                }
            }
        }
    }
    shown
}

/// The fields of `[[server]]` a server's `--json` writes itself (above);
/// `pull_secret` is left out, as it always was.
const SERVER_SHOWN: [&str; 10] = [
    "name",
    "image",
    "command",
    "description",
    "network",
    "limits",
    "runtime",
    "pull",
    "local_userland",
    "pull_secret",
];

/// A volume in words, saying what its scope shares.
fn volume_text(volume: &crate::plan::Volume) -> String {
    use crate::plan::VolumeScope;
    format!(
        "{} at {} ({})",
        volume.name,
        volume.path,
        match volume.scope {
            VolumeScope::Session =>
                "scope session: this session's units only, removed when it ends",
            VolumeScope::Profile =>
                "scope profile: shared by every session of this profile on this host, a channel between them",
        }
    )
}

fn limits_text(limits: &LimitsPolicy) -> String {
    limits.show_text()
}

fn show(profile: &Profile) -> String {
    let mut text = String::new();
    let mut line = |line: String| {
        text.push_str(&line);
        text.push('\n');
    };
    if !profile.dangerous.is_empty() {
        line(format!(
            "!!! DANGEROUS: this profile asks for {} (allowed by [operator] allow_dangerous) !!!",
            danger_names(&profile.dangerous)
        ));
    }
    line(format!("profile      {}", profile.name));
    line(format!("description  {}", profile.description));
    line(format!("from         {}", profile.origin));
    if !profile.extends.is_empty() {
        line(format!("extends      {}", profile.extends.join(" → ")));
    }
    let workspace = &profile.workspace;
    if workspace.source == Source::None {
        line("workspace    none (no file tools, no shell, no processes)".to_owned());
    } else {
        let shown = workspace.shown();
        line(format!(
            "workspace    {} {} at {} (image {}, user {})",
            text_of(&shown, "source"),
            text_of(&shown, "mode"),
            text_of(&shown, "root"),
            text_of(&shown, "image"),
            text_of(&shown, "user")
        ));
        if !workspace.images.is_empty() {
            line(format!(
                "images       {} (a session chooses with tighten workspace.image)",
                workspace.images.join(", ")
            ));
        }
        if workspace.pull != PullPolicy::default() {
            line(format!("pull         {}", workspace.pull.as_str()));
        }
        if workspace.local_userland == LocalUserland::Host {
            line("local        runs on the host's own userland in place of the image (local_userland = \"host\")".to_owned());
        }
        line(format!("network      {}", network_text(&profile.network)));
        line(format!("limits       {}", limits_text(&profile.limits)));
        let set: Vec<String> = profile.env.set.keys().cloned().collect();
        line(format!(
            "env          set [{}], pass [{}], secrets [{}]",
            set.join(", "),
            profile.env.pass.join(", "),
            profile.env.secret_names().join(", ")
        ));
    }
    let security = profile.security.shown();
    line(format!("security     {}", fields_text(&security)));
    line(format!(
        "lifecycle    {}",
        fields_text(&profile.lifecycle.shown())
    ));
    let pool = profile.pool.shown();
    if pool.iter().any(|field| !field.default) {
        line(format!(
            "pool         {} (a listening box serve keeps this many units ready)",
            fields_text(&pool)
        ));
    }
    for volume in &profile.volumes {
        line(format!("volume       {}", volume_text(volume)));
    }
    for field in dangers_set(&security) {
        line(format!("DANGEROUS    {}: {}", field.name, field.text));
    }
    for server in &profile.servers {
        line(format!(
            "server       {}: {} ({})",
            server.name,
            server.command.join(" "),
            server.image
        ));
        if !server.description.is_empty() {
            line(format!("               {}", server.description));
        }
        line(format!(
            "               network {}",
            network_text(&server.network)
        ));
        line(format!(
            "               limits {}",
            limits_text(&server.limits)
        ));
        if server.local_userland == LocalUserland::Host {
            line("               local: the host's own userland in place of the image".to_owned());
        }
    }
    text
}

fn show_plan(plan: &plan::Plan) -> String {
    use crate::plan::{Role, WorkspaceSource};
    use crate::profile::{ByteSize, CpuQuota};

    let mut text = format!("plan of profile {}\n", plan.profile);
    if plan.workspace().is_none() {
        text.push_str("no workspace unit: no file tools, no shell, no processes\n");
    }
    for unit in &plan.units {
        let role = match unit.role {
            Role::Workspace => "workspace unit",
            Role::Server => "server unit",
        };
        let source = match &unit.source {
            WorkspaceSource::Host(path) => format!(
                "{} at {} {}",
                path.display(),
                unit.root.display(),
                unit.mode.as_str()
            ),
            WorkspaceSource::Empty => {
                format!("empty at {} {}", unit.root.display(), unit.mode.as_str())
            }
            WorkspaceSource::None => "none".to_owned(),
        };
        let user = unit.user.map_or_else(
            || "the image's".to_owned(),
            |ids| format!("{}:{}", ids.uid, ids.gid),
        );
        let network = mode_to(unit.network.mode, &unit.network.allow);
        let limits = &unit.limits;
        let cpus = CpuQuota::from_cores(limits.cpus)
            .map_or_else(|_| limits.cpus.to_string(), |cpus| cpus.to_string());
        let security = unit.security.shown();
        let dangerous: String = dangers_set(&security)
            .map(|field| format!(", DANGEROUS {}", field.pair()))
            .collect();
        let set: Vec<&str> = unit.env_set.keys().map(String::as_str).collect();
        let mut lines = vec![
            format!("{}  ({role})", unit.name),
            format!("  image     {} (pull {})", unit.image, unit.pull.as_str()),
        ];
        if !unit.command.is_empty() {
            lines.push(format!("  command   {}", unit.command.join(" ")));
        }
        lines.extend([
            format!("  source    {source}"),
            format!("  user      {user}"),
            format!("  network   {network}"),
            format!(
                "  limits    memory {}, cpus {cpus}, pids {}, tmp {}, home {}, nofile {}, call_timeout {}, idle {}, lifetime {}, start_timeout {}",
                ByteSize(limits.memory_bytes),
                limits.pids,
                ByteSize(limits.tmp_bytes),
                ByteSize(limits.home_bytes),
                limits.nofile,
                show_duration(limits.call_timeout),
                show_duration(limits.idle),
                show_duration(limits.lifetime),
                show_duration(limits.start_timeout)
            ),
            format!(
                "  env       set [{}], pass [{}], secrets [{}]",
                set.join(", "),
                unit.env_pass.join(", "),
                unit.env_secrets.join(", ")
            ),
            format!("  security  {}{dangerous}", fields_text(&security)),
            format!("  lifecycle lease {}", show_duration(unit.lease)),
        ]);
        for volume in &unit.volumes {
            lines.push(format!("  volume    {}", volume_text(volume)));
        }
        for line in lines {
            text.push_str(&line);
            text.push('\n');
        }
    }
    text
}
