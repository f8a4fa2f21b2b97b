//! The command-line faces of the backends: `box units ls|rm|inspect`,
//! `box gc` and `box image build|pull|ls` (`pull`: `cli/pull.rs`). Thin: each gathers facts through the
//! backends and prints them; `--json` output is the stable form.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;

use std::sync::Arc;

use box_backend::instance::{self, Liveness};
use box_backend::{Backend, BackendKind, UnitDetail, UnitInfo};

/// `box units`: the units box started that are still there, on the docker
/// engine and on the local backend (a local unit outlives its host by its
/// lease), as `box gc` sees them.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = UNITS_EXAMPLES)]
pub struct UnitsArgs {
    /// What to do (default: ls).
    #[command(subcommand)]
    pub command: Option<UnitsCommand>,
    /// Only this backend's units (a name the binary registered: docker,
    /// local). Without it, every registered backend's, and an engine that
    /// does not answer is an error, never an empty list.
    #[arg(long, global = true, value_parser = crate::backends::name_parser(), value_name = "NAME")]
    pub backend: Option<BackendKind>,
}

const UNITS_EXAMPLES: &str = "Examples:
  box units ls
  box units ls --json
  box units ls --backend local
  box units ls --filter session=4d5ff4617dcd94cf37c1ae6626b56a06
  box units inspect 3f2a9c01b7d4
  box units rm 3f2a9c01b7d4";

/// `box units ls --filter`'s keys, as its errors name them.
const FILTER_KEYS: &str = "backend, instance, profile, session";

/// One `--filter KEY=VALUE`: which units `box units ls` shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnitFilter {
    /// `backend=NAME` (`docker`, `local`).
    Backend(BackendKind),
    /// `instance=ID`: the host instance that started the unit.
    Instance(String),
    /// `session=ID`.
    Session(String),
    /// `profile=NAME`: the profile its session resolved.
    Profile(String),
}

impl UnitFilter {
    /// `KEY=VALUE`, or why not (clap puts the flag and the value before it).
    fn parse(text: &str) -> Result<Self, String> {
        let (key, value) = super::filter_parts(text, "session=4d5ff461...", FILTER_KEYS)?;
        match key {
            "backend" => crate::backends::named(value).map(UnitFilter::Backend),
            "instance" => Ok(UnitFilter::Instance(value.to_owned())),
            "session" => Ok(UnitFilter::Session(value.to_owned())),
            "profile" => Ok(UnitFilter::Profile(value.to_owned())),
            other => Err(format!("unknown key `{other}`; known keys: {FILTER_KEYS}")),
        }
    }

    /// Whether `unit`, of `backend`, is what this filter asks for.
    fn matches(&self, backend: BackendKind, unit: &UnitInfo) -> bool {
        match self {
            UnitFilter::Backend(wanted) => *wanted == backend,
            UnitFilter::Instance(wanted) => &unit.instance == wanted,
            UnitFilter::Session(wanted) => &unit.session == wanted,
            UnitFilter::Profile(wanted) => &unit.profile == wanted,
        }
    }

    /// The key this filter is of: values of one key are alternatives.
    fn key(&self) -> &'static str {
        match self {
            UnitFilter::Backend(_) => "backend",
            UnitFilter::Instance(_) => "instance",
            UnitFilter::Session(_) => "session",
            UnitFilter::Profile(_) => "profile",
        }
    }
}

/// Whether `unit` passes every filter, as `docker ps --filter`: values of
/// one key are alternatives, different keys must all match.
fn passes(filters: &[UnitFilter], backend: BackendKind, unit: &UnitInfo) -> bool {
    filters.iter().all(|filter| {
        filters
            .iter()
            .filter(|other| other.key() == filter.key())
            .any(|other| other.matches(backend, unit))
    })
}

/// The backends `box units` must ask, of those registered (in the
/// registry's order): `--backend`'s, narrowed by the filters' `backend=`
/// values (so a filter for local units needs no engine).
fn backends_asked(
    registered: impl Iterator<Item = BackendKind>,
    only: Option<BackendKind>,
    filters: &[UnitFilter],
) -> Vec<BackendKind> {
    let filtered: Vec<BackendKind> = filters
        .iter()
        .filter_map(|filter| match filter {
            UnitFilter::Backend(backend) => Some(*backend),
            _ => None,
        })
        .collect();
    registered
        .filter(|backend| only.is_none_or(|only| only == *backend))
        .filter(|backend| filtered.is_empty() || filtered.contains(backend))
        .collect()
}

/// The `box units` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum UnitsCommand {
    /// List every unit box started that is still there (docker's and local ones): id, backend, instance, session, unit, profile, image, state, age.
    #[command(
        after_help = "Filters (--filter KEY=VALUE, repeatable; values of one key are alternatives, different keys must all match):
  backend=docker|local   instance=ID   session=ID   profile=NAME

Examples:
  box units ls
  box units ls --json
  box units ls --filter profile=ci --filter backend=local
  box units ls --filter session=4d5ff4617dcd94cf37c1ae6626b56a06"
    )]
    Ls {
        /// Print JSON (the stable form).
        #[arg(long)]
        json: bool,
        /// Only units matching KEY=VALUE, KEY one of backend, instance, session, profile (repeatable).
        #[arg(long = "filter", value_name = "KEY=VALUE", value_parser = UnitFilter::parse)]
        filters: Vec<UnitFilter>,
    },
    /// What each running unit uses, refreshed every second until interrupted: CPU time and share, memory now and at peak, tasks, block IO (from its cgroup; a local unit's from its processes).
    #[command(
        after_help = "Examples:\n  box units top\n  box units top --once\n  box units top --once --json --filter backend=docker"
    )]
    Top {
        /// Print one frame and exit.
        #[arg(long)]
        once: bool,
        /// Print JSON (with --once; the stable form).
        #[arg(long, requires = "once")]
        json: bool,
        /// Only units matching KEY=VALUE, as `ls` takes (repeatable).
        #[arg(long = "filter", value_name = "KEY=VALUE", value_parser = UnitFilter::parse)]
        filters: Vec<UnitFilter>,
    },
    /// Remove units by id (or a unique prefix of one, as `ls` shows); refuses a
    /// unit whose host is alive unless --force.
    #[command(
        after_help = "Examples:\n  box units rm 3f2a9c01b7d4\n  box units rm --force 3f2a 8c1d"
    )]
    Rm {
        /// The units' ids, or unique prefixes of them.
        #[arg(value_name = "ID", required = true, add = clap_complete::ArgValueCandidates::new(crate::cli::complete::unit_ids))]
        ids: Vec<String>,
        /// Also remove units whose host is alive (it would lose them mid-session).
        #[arg(long)]
        force: bool,
    },
    /// Show one unit: its labels and state, whether its host is alive, its image,
    /// workspace and limits, and the envelope its backend reported at its start.
    #[command(
        after_help = "Examples:\n  box units inspect 3f2a9c01b7d4\n  box units inspect 3f2a --json"
    )]
    Inspect {
        /// The unit's id, or a unique prefix of it.
        #[arg(value_name = "ID", add = clap_complete::ArgValueCandidates::new(crate::cli::complete::unit_ids))]
        id: String,
        /// Print JSON (the stable form).
        #[arg(long)]
        json: bool,
    },
}

/// `box gc`.
#[derive(Debug, Clone, clap::Args)]
#[command(
    after_help = "A dead host's running unit is left while the lease its host renewed may still be live (its own init ends it); a later gc removes whatever outlives that.\n\nExamples:\n  box gc\n  box gc --instance box-12345\n  box gc --all-instances"
)]
pub struct GcArgs {
    /// Also remove units of instances not known on this machine (another
    /// boot, or no lock file): assumes every host using this engine runs here.
    #[arg(long)]
    pub all_instances: bool,
    /// Remove the units of this instance if its host is not alive.
    #[arg(long, value_name = "ID", env = "BOX_INSTANCE")]
    pub instance: Option<String>,
}

/// `box image`: box's unit images.
#[derive(Debug, Clone, clap::Args)]
#[command(
    after_help = "Examples:\n  box image build\n  box image pull python:3.12-slim\n  box image ls"
)]
pub struct ImageArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: ImageCommand,
}

/// The `box image` subcommands. (box's own images are built from a Debian
/// mirror; any other image is pulled from its registry.)
#[derive(Debug, Clone, clap::Subcommand)]
pub enum ImageCommand {
    /// Build box's images, skipping those that exist: `base` (default) builds the unit
    /// images offline from a Debian mirror (box-rootfs:SUITE, then box-base:SUITE on it;
    /// needs root); `dev` builds box-dev:SUITE, the toolchain image (Python, Node, Rust,
    /// Go, C) on box-base:SUITE from the same mirror; `fetch` builds box-fetch:latest,
    /// the `fetch` example profile's server.
    #[command(after_help = "Examples:
  box image build
  box image build --force
  box image build dev
  box image build fetch
  box image build --mirror http://ftp.de.debian.org/debian --suite bookworm
  BOX_IMAGE_MIRROR=http://mirror.internal/debian box image build")]
    Build(BuildArgs),
    /// Pull an image from its registry (progress on stderr; a pinned digest verified).
    Pull(crate::cli::pull::PullArgs),
    /// List the images box and its profiles use, and whether the engine has each.
    #[command(
        after_help = "Examples:\n  box image ls\n  box image ls --json\n  box image ls --profiles ./profiles"
    )]
    Ls {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// More directories of profiles, searched first (repeatable): their images are listed too.
        #[arg(long = "profiles", value_name = "DIR")]
        profile_dirs: Vec<PathBuf>,
    },
}

/// `box image build`: the flags of the embedded build script, passed on.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct BuildArgs {
    /// Which images: `base` (box-rootfs and box-base), `dev` (box-dev, the toolchain image, on box-base) or `fetch` (box-fetch:latest, on box-base).
    #[arg(value_enum, default_value_t = BuildTarget::Base)]
    pub target: BuildTarget,
    /// Rebuild the images even if they exist.
    #[arg(long)]
    pub force: bool,
    /// The Debian mirror [env BOX_IMAGE_MIRROR]; default: this Debian host's own, else deb.debian.org.
    #[arg(long, value_name = "URL")]
    pub mirror: Option<String>,
    /// The Debian suite, also the images' tag [env BOX_IMAGE_SUITE]; default: bookworm.
    #[arg(long, value_name = "NAME")]
    pub suite: Option<String>,
    /// The keyring the mirror's Release file is checked against [env BOX_IMAGE_KEYRING].
    #[arg(long, value_name = "FILE")]
    pub keyring: Option<PathBuf>,
    /// Do not check the mirror's signature [env BOX_IMAGE_NO_CHECK_GPG=1]; only for a mirror trusted by other means.
    #[arg(long)]
    pub no_check_gpg: bool,
}

/// What `box image build` builds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum BuildTarget {
    /// box-rootfs:SUITE and box-base:SUITE, the unit images.
    #[default]
    Base,
    /// box-dev:SUITE, the toolchain image: box-base plus Python (venv, pip), Node (npm),
    /// Rust (cargo), Go, a C toolchain and make, from the base image's Debian mirror.
    Dev,
    /// box-fetch:latest, the `fetch` example profile's server (mcp-server-fetch on box-base).
    Fetch,
}

impl BuildArgs {
    /// The fetch build script's arguments, or why a flag does not apply to it.
    fn fetch_script_args(&self) -> anyhow::Result<Vec<std::ffi::OsString>> {
        if self.mirror.is_some() || self.keyring.is_some() || self.no_check_gpg {
            anyhow::bail!(
                "--mirror, --keyring and --no-check-gpg are for `box image build base`; `fetch` installs python3 from its base image's own apt sources"
            );
        }
        let mut args: Vec<std::ffi::OsString> = Vec::new();
        if self.force {
            args.push("--force".into());
        }
        if let Some(suite) = &self.suite {
            args.extend(["--base".into(), format!("box-base:{suite}").into()]);
        }
        Ok(args)
    }

    /// The dev build script's arguments, or why a flag does not apply to it.
    fn dev_script_args(&self) -> anyhow::Result<Vec<std::ffi::OsString>> {
        if self.mirror.is_some() || self.keyring.is_some() || self.no_check_gpg {
            anyhow::bail!(
                "--mirror, --keyring and --no-check-gpg are for `box image build base`; `dev` installs its packages from its base image's own apt sources (the mirror box-base was built from)"
            );
        }
        let mut args: Vec<std::ffi::OsString> = Vec::new();
        if self.force {
            args.push("--force".into());
        }
        if let Some(suite) = &self.suite {
            args.extend(["--suite".into(), suite.into()]);
        }
        Ok(args)
    }

    /// The build script's arguments.
    fn script_args(&self) -> Vec<std::ffi::OsString> {
        let mut args: Vec<std::ffi::OsString> = Vec::new();
        if self.force {
            args.push("--force".into());
        }
        if let Some(mirror) = &self.mirror {
            args.extend(["--mirror".into(), mirror.into()]);
        }
        if let Some(suite) = &self.suite {
            args.extend(["--suite".into(), suite.into()]);
        }
        if let Some(keyring) = &self.keyring {
            args.extend(["--keyring".into(), keyring.into()]);
        }
        if self.no_check_gpg {
            args.push("--no-check-gpg".into());
        }
        args
    }
}

pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// A unit as `box units` shows it: `UnitInfo` and the backend it runs on.
pub(super) fn shown(
    backends: &[Arc<dyn Backend>],
    (of, unit): &Listed,
) -> anyhow::Result<serde_json::Value> {
    let mut shown = serde_json::to_value(unit)?;
    shown["backend"] = serde_json::json!(backends[*of].kind().as_str());
    Ok(shown)
}

/// Every unit of the backends `box units` was asked for, each of which must
/// answer: a list that left out an engine's units would be a false one.
pub(super) async fn units_of(
    only: Option<BackendKind>,
    filters: &[UnitFilter],
) -> anyhow::Result<(Vec<Arc<dyn Backend>>, Vec<Listed>)> {
    let names: Vec<&str> = backends_asked(crate::backends::registry().kinds(), only, filters)
        .into_iter()
        .map(BackendKind::as_str)
        .collect();
    let (backends, failed) = connect(&names).await;
    if !failed.is_empty() {
        let hint = if names.len() > 1 {
            "; `box units --backend local` looks at the local backend's units alone"
        } else {
            ""
        };
        anyhow::bail!("{}{hint}", failed.join("; "));
    }
    let (backends, mut units) = list(backends).await?;
    units.retain(|(of, unit)| passes(filters, backends[*of].kind(), unit));
    // A session's units together, as a session's host sees them.
    units.sort_by(|(_, a), (_, b)| {
        (&a.instance, &a.session, &a.created, &a.unit).cmp(&(
            &b.instance,
            &b.session,
            &b.created,
            &b.unit,
        ))
    });
    Ok((backends, units))
}

/// Run `box units`.
pub fn units(args: UnitsArgs) -> anyhow::Result<ExitCode> {
    let only = args.backend;
    let command = args.command.unwrap_or(UnitsCommand::Ls {
        json: false,
        filters: Vec::new(),
    });
    match command {
        UnitsCommand::Ls { json, filters } => {
            let (backends, units, usage) = runtime()?.block_on(async {
                let (backends, units) = units_of(only, &filters).await?;
                let usage = super::top::usage(&backends, &units).await;
                anyhow::Ok((backends, units, usage))
            })?;
            if json {
                let shown = units
                    .iter()
                    .zip(&usage)
                    .map(|(listed, usage)| {
                        let mut shown = shown(&backends, listed)?;
                        super::top::add_usage(&mut shown, usage.as_ref());
                        Ok(shown)
                    })
                    .collect::<anyhow::Result<Vec<_>>>()?;
                outln!("{}", serde_json::to_string_pretty(&shown)?);
            } else {
                let now = std::time::SystemTime::now();
                let rows: Vec<Row> = units
                    .iter()
                    .zip(&usage)
                    .map(|((of, unit), usage)| {
                        let mut row = row(backends[*of].kind(), unit, now);
                        if let Some(usage) = usage {
                            row[9] = super::top::cpu_time(usage.cpu_usec);
                            row[10] = super::top::bytes(usage.memory_bytes);
                        }
                        row
                    })
                    .collect();
                out!("{}", table(&rows));
            }
            Ok(ExitCode::SUCCESS)
        }
        UnitsCommand::Inspect { id, json } => {
            let (backends, detail) = runtime()?.block_on(async {
                let (backends, units) = units_of(only, &[]).await?;
                let (of, unit) = find_unit(&units, &id)?;
                let detail = backends[*of].inspect(unit).await?;
                anyhow::Ok((backends[*of].kind(), detail))
            })?;
            let alive = instance::liveness(&instance::default_dir(), &detail.info.instance);
            let host = match alive {
                Liveness::Alive => "alive",
                Liveness::Dead => "dead",
                Liveness::Unknown => "unknown",
            };
            if json {
                let mut shown = serde_json::to_value(&detail)?;
                shown["backend"] = serde_json::json!(backends.as_str());
                shown["host"] = serde_json::json!(host);
                outln!("{}", serde_json::to_string_pretty(&shown)?);
            } else {
                out!(
                    "{}",
                    inspected(backends, host, &detail, std::time::SystemTime::now())
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        UnitsCommand::Rm { ids, force } => remove(&ids, force, only),
        UnitsCommand::Top {
            once,
            json,
            filters,
        } => super::top::top(only, &filters, once, json),
    }
}

/// A unit listed by one of the backends: the backend's index, and the unit.
pub(super) type Listed = (usize, UnitInfo);

/// Every unit `backends` list, each with its backend's index.
async fn list(
    backends: Vec<Arc<dyn Backend>>,
) -> anyhow::Result<(Vec<Arc<dyn Backend>>, Vec<Listed>)> {
    let mut units = Vec::new();
    for (index, backend) in backends.iter().enumerate() {
        units.extend(backend.list().await?.into_iter().map(|unit| (index, unit)));
    }
    Ok((backends, units))
}

/// Remove `doomed`, each by the backend that listed it.
async fn remove_listed(
    backends: &[Arc<dyn Backend>],
    doomed: Vec<Listed>,
) -> (Vec<UnitInfo>, Vec<(UnitInfo, String)>) {
    let (mut removed, mut failed) = (Vec::new(), Vec::new());
    for (index, backend) in backends.iter().enumerate() {
        let theirs: Vec<UnitInfo> = doomed
            .iter()
            .filter(|(of, _)| *of == index)
            .map(|(_, unit)| unit.clone())
            .collect();
        if theirs.is_empty() {
            continue;
        }
        let report = backend.remove_units(theirs).await;
        removed.extend(report.removed);
        failed.extend(report.failed);
    }
    (removed, failed)
}

/// The one unit whose id is `id` or starts with it.
fn find_unit<'a>(units: &'a [Listed], id: &str) -> anyhow::Result<&'a Listed> {
    if id.is_empty() {
        anyhow::bail!("an empty unit id; give one as `box units ls` shows it");
    }
    if let Some(listed) = units.iter().find(|(_, unit)| unit.id == id) {
        return Ok(listed);
    }
    let matching: Vec<&Listed> = units
        .iter()
        .filter(|(_, unit)| unit.id.starts_with(id))
        .collect();
    match matching.as_slice() {
        [listed] => Ok(listed),
        [] => anyhow::bail!("no box unit has an id starting {id:?}; see `box units ls`"),
        several => anyhow::bail!(
            "{id:?} is the start of {} units' ids ({}); give more of the id",
            several.len(),
            several
                .iter()
                .map(|(_, unit)| unit.id.get(..12).unwrap_or(&unit.id))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// `box units rm`: every id resolved before anything is removed.
fn remove(ids: &[String], force: bool, only: Option<BackendKind>) -> anyhow::Result<ExitCode> {
    let dir = instance::default_dir();
    let (removed, failed) = runtime()?.block_on(async {
        let (backends, units) = units_of(only, &[]).await?;
        let mut doomed: Vec<Listed> = Vec::new();
        for id in ids {
            let listed = find_unit(&units, id)?;
            let unit = &listed.1;
            if !force && instance::liveness(&dir, &unit.instance) == Liveness::Alive {
                anyhow::bail!(
                    "unit {} ({}) belongs to instance {}, whose host is alive and removes it when its session ends; --force removes it now",
                    unit.id.get(..12).unwrap_or(&unit.id),
                    unit.unit,
                    unit.instance
                );
            }
            if !doomed.iter().any(|(_, seen)| seen.id == unit.id) {
                doomed.push(listed.clone());
            }
        }
        anyhow::Ok(remove_listed(&backends, doomed).await)
    })?;
    for unit in &removed {
        outln!("{}", unit.id.get(..12).unwrap_or(&unit.id));
    }
    for (unit, why) in &failed {
        eprintln!(
            "box units rm: could not remove {} ({}): {why}",
            unit.id, unit.unit
        );
    }
    Ok(if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// One line of `box units ls`, its cells in [`COLUMNS`]' order.
type Row = [String; COLUMNS.len()];

/// `box units ls`' columns.
const COLUMNS: [&str; 11] = [
    "ID", "BACKEND", "INSTANCE", "SESSION", "UNIT", "PROFILE", "IMAGE", "STATE", "AGE", "CPU",
    "MEM",
];

/// How much of an id `box units` shows (as `docker ps`); `inspect`, `rm`
/// and every filter take any unique prefix.
const SHORT_ID: usize = 12;

fn short_id(id: &str) -> &str {
    id.get(..SHORT_ID).unwrap_or(id)
}

/// `unit`'s cells, its age reckoned at `now`.
fn row(backend: BackendKind, unit: &UnitInfo, now: std::time::SystemTime) -> Row {
    // A fork shows the unit it was made from: `fork-1<workspace`; a
    // pooled unit (`box serve --pool`) says so: `workspace (pooled)`.
    let name = match &unit.parent {
        Some(parent) => format!("{}<{parent}", unit.unit),
        None => unit.unit.clone(),
    };
    let name = match &unit.pool {
        Some(_) => format!("{name} (pooled)"),
        None => name,
    };
    [
        short_id(&unit.id).to_owned(),
        backend.as_str().to_owned(),
        unit.instance.clone(),
        unit.session.clone(),
        name,
        unit.profile.clone(),
        unit.image.clone().unwrap_or_default(),
        unit.state.clone(),
        age(&unit.created, now).unwrap_or_default(),
        String::new(),
        String::new(),
    ]
}

/// `rows` under [`COLUMNS`], each column as wide as its widest cell (so no
/// long session id shifts the columns after it), an empty cell shown `-`.
fn table(rows: &[Row]) -> String {
    let cell = |text: &str| -> String {
        if text.is_empty() {
            return "-".to_owned();
        }
        // Labels are anyone's to write on a container: nothing in one may
        // move the cursor or break the line.
        super::out::escape_controls(text)
    };
    let lines: Vec<Vec<String>> = std::iter::once(COLUMNS.map(str::to_owned))
        .chain(rows.iter().cloned())
        .map(|row| row.iter().map(|text| cell(text)).collect())
        .collect();
    super::out::columns(&lines)
}

/// How long ago `created` (RFC 3339) was, at `now`, in its largest whole
/// unit: `42s`, `5m`, `3h`, `2d`; `None` when it is not a time.
fn age(created: &str, now: std::time::SystemTime) -> Option<String> {
    let created = humantime::parse_rfc3339_weak(created).ok()?;
    let secs = now.duration_since(created).unwrap_or_default().as_secs();
    Some(match secs {
        0..60 => format!("{secs}s"),
        60..3600 => format!("{}m", secs / 60),
        3600..172_800 => format!("{}h", secs / 3600),
        _ => format!("{}d", secs / 86_400),
    })
}

/// `box units inspect` for people: the unit, then its image, workspace and
/// limits, then the whole envelope as JSON.
fn inspected(
    backend: BackendKind,
    host: &str,
    detail: &UnitDetail,
    now: std::time::SystemTime,
) -> String {
    let unit = &detail.info;
    let envelope = detail.envelope.as_ref();
    let none = || "-".to_owned();
    let mut lines: Vec<(&str, String)> = vec![
        ("id", unit.id.clone()),
        ("backend", backend.as_str().to_owned()),
        (
            "unit",
            match &unit.parent {
                Some(parent) => format!("{} (a fork of {parent})", unit.unit),
                None => unit.unit.clone(),
            },
        ),
        ("session", unit.session.clone()),
        ("instance", format!("{} (host {host})", unit.instance)),
        ("profile", unit.profile.clone()),
        ("state", unit.state.clone()),
        (
            "created",
            match age(&unit.created, now) {
                Some(age) => format!("{} ({age} ago)", unit.created),
                None => unit.created.clone(),
            },
        ),
    ];
    let image = match (&unit.image, envelope.and_then(|e| e["userland"].as_str())) {
        (_, Some(userland)) => format!("none: the {userland}'s own userland"),
        (Some(image), None) => image.clone(),
        (None, None) => none(),
    };
    lines.push(("image", image));
    let root = envelope.and_then(|e| e["root"].as_str());
    let workspace = match (&detail.workspace, root) {
        (Some(host), Some(root)) if host.as_os_str() != root => {
            format!("{} (at {root} in the unit)", host.display())
        }
        (Some(host), _) => host.display().to_string(),
        (None, Some(root)) => format!("{root} in the unit (none of the host's)"),
        (None, None) => none(),
    };
    lines.push(("workspace", workspace));
    if let Some(pool) = &detail.info.pool {
        // A claimed unit's recorded envelope says `warm: true`; labels stay the pool's.
        let claimed = envelope.is_some_and(|e| e["warm"] == serde_json::json!(true));
        let state = if claimed {
            "claimed by a session (its session label stays the pool's)"
        } else {
            "ready, no session yet"
        };
        lines.push(("pool", format!("{pool}: {state}")));
    }
    if let Some(pid) = detail.pid {
        lines.push(("pid", pid.to_string()));
    }
    match envelope {
        Some(envelope) => {
            lines.push(("limits", limits(&envelope["limits"])));
            if let Some(mode) = envelope["network"]["mode"].as_str() {
                lines.push(("network", mode.to_owned()));
            }
        }
        None => lines.push(("limits", none())),
    }
    let width = lines.iter().map(|(key, _)| key.len()).max().unwrap_or(0) + 2;
    let mut out = String::new();
    for (key, value) in &lines {
        out.push_str(&format!("{:<width$}{value}\n", format!("{key}:")));
    }
    match envelope {
        Some(envelope) => {
            out.push_str("envelope (as reported at its start):\n");
            outline(envelope, 1, &mut out);
        }
        None => out.push_str("envelope: not recorded (an older box started this unit)\n"),
    }
    out
}

/// `value` (an object) as indented `key: value` lines, a list of plain
/// values on one line, for people; `--json` has the JSON.
fn outline(value: &serde_json::Value, depth: usize, out: &mut String) {
    let Some(object) = value.as_object() else {
        return;
    };
    let indent = "  ".repeat(depth);
    for (key, value) in object {
        match value {
            serde_json::Value::Object(_) => {
                out.push_str(&format!("{indent}{key}:\n"));
                outline(value, depth + 1, out);
            }
            serde_json::Value::Array(items) if items.iter().any(|item| item.is_object()) => {
                out.push_str(&format!("{indent}{key}:\n"));
                for item in items {
                    out.push_str(&format!("{indent}  -\n"));
                    outline(item, depth + 2, out);
                }
            }
            serde_json::Value::Array(items) => {
                let items: Vec<String> = items.iter().map(plain).collect();
                let shown = if items.is_empty() {
                    "-".to_owned()
                } else {
                    items.join(", ")
                };
                out.push_str(&format!("{indent}{key}: {shown}\n"));
            }
            _ => out.push_str(&format!("{indent}{key}: {}\n", plain(value))),
        }
    }
}

/// A JSON scalar as people read it: a string without its quotes.
fn plain(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(text) if text.is_empty() => "-".to_owned(),
        serde_json::Value::String(text) => text.escape_default().to_string(),
        other => other.to_string(),
    }
}

/// A camelCase key in words: `memorySwap` is `memory swap`.
fn words(key: &str) -> String {
    let mut out = String::new();
    for c in key.chars() {
        if c.is_ascii_uppercase() {
            out.push(' ');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// An envelope's `limits` in words: sizes in binary units, times as
/// durations, what was not applied after the rest.
fn limits(limits: &serde_json::Value) -> String {
    let Some(limits) = limits.as_object() else {
        return "-".to_owned();
    };
    let mut shown = Vec::new();
    let mut not_applied = Vec::new();
    for (key, value) in limits {
        if let Some(list) = value.as_array() {
            not_applied.extend(list.iter().filter_map(|item| item.as_str()));
            continue;
        }
        let text = if let (Some(name), Some(bytes)) = (key.strip_suffix("Bytes"), value.as_u64()) {
            // ByteSize shows the largest exact unit, which for 0 is any.
            let size = if bytes == 0 {
                "0B".to_owned()
            } else {
                crate::profile::ByteSize(bytes).to_string()
            };
            format!("{} {size}", words(name))
        } else if let (Some(name), Some(millis)) = (key.strip_suffix("Ms"), value.as_u64()) {
            format!(
                "{} {}",
                words(name),
                humantime::format_duration(std::time::Duration::from_millis(millis))
            )
        } else if value.is_null() {
            continue;
        } else {
            format!("{} {value}", words(key))
        };
        shown.push(text);
    }
    let mut text = if shown.is_empty() {
        "-".to_owned()
    } else {
        shown.join(", ")
    };
    if !not_applied.is_empty() {
        text.push_str(&format!("; not applied: {}", not_applied.join("; ")));
    }
    text
}

/// Which instances' units `box gc` removes, given each instance's liveness.
///
/// The rule: a live host (its instance lock held) owns its units and removes
/// its sessions' units itself, so they are never collected. A dead host's
/// (lock file left, nobody holding it) units are all orphans, collected once
/// their lease has surely lapsed (`instance::lease_may_be_live`). An instance
/// with no lock file here is collected only when named with `--instance`
/// or with `--all-instances`.
pub fn collectable(liveness: Liveness, named: bool, all_instances: bool) -> bool {
    match liveness {
        Liveness::Alive => false,
        Liveness::Dead => true,
        Liveness::Unknown => named || all_instances,
    }
}

/// The registered backends, whose units can outlive the process that
/// started them (docker's; local ones outlive their host by their lease,
/// as their run directory's record says). At least one must answer:
/// `box gc` skips one that does not, saying so.
async fn lasting_backends() -> anyhow::Result<Vec<Arc<dyn Backend>>> {
    let names: Vec<&str> = crate::backends::registry()
        .kinds()
        .map(BackendKind::as_str)
        .collect();
    let (backends, why) = connect(&names).await;
    if backends.is_empty() {
        anyhow::bail!("no backend answers: {}", why.join("; "));
    }
    for reason in &why {
        eprintln!("box gc: skipping {reason}");
    }
    Ok(backends)
}

/// The backends named that answer, and why each other one did not.
async fn connect(names: &[&str]) -> (Vec<Arc<dyn Backend>>, Vec<String>) {
    let registry = crate::backends::registry();
    let (mut backends, mut why) = (Vec::new(), Vec::new());
    for name in names {
        match registry.connect(name).await {
            Ok(backend) => backends.push(backend),
            Err(error) => why.push(format!("{name}: {error}")),
        }
    }
    (backends, why)
}

/// Run `box gc`: over docker's units and the local backend's alike.
pub fn gc(args: GcArgs) -> anyhow::Result<ExitCode> {
    let dir = instance::default_dir();
    let (removed, failed) = runtime()?.block_on(async {
        let (backends, units) = list(lasting_backends().await?).await?;
        let mut by_instance: BTreeMap<String, Vec<Listed>> = BTreeMap::new();
        for unit in units {
            by_instance
                .entry(unit.1.instance.clone())
                .or_default()
                .push(unit);
        }
        let mut doomed = Vec::new();
        let mut forget = Vec::new();
        let mut waiting_on = std::collections::BTreeSet::new();
        // A named dead instance with no unit left (they ended with their
        // lease) leaves only its lock file.
        if let Some(id) = &args.instance
            && !by_instance.contains_key(id)
            && instance::liveness(&dir, id) == Liveness::Dead
        {
            forget.push(id.clone());
        }
        let now = std::time::SystemTime::now();
        for (id, units) in by_instance {
            let named = args.instance.as_deref() == Some(id.as_str());
            if args.instance.is_some() && !named && !args.all_instances {
                continue;
            }
            let live = instance::liveness(&dir, &id);
            if collectable(live, named, args.all_instances) {
                // A dead host's unit may still hold a lease it renewed
                // before it died: its own init ends it; gc only catches
                // what outlives that.
                let last_alive = match live {
                    Liveness::Dead => instance::heartbeat(&dir, &id),
                    _ => None,
                };
                let (waiting, gone): (Vec<_>, Vec<_>) = units.into_iter().partition(|(_, unit)| {
                    last_alive.is_some_and(|last_alive| {
                        instance::lease_may_be_live(&unit.state, unit.lease_ms, last_alive, now)
                            .is_some()
                    })
                });
                for (_, unit) in &waiting {
                    let by = last_alive.and_then(|last_alive| {
                        instance::lease_may_be_live(&unit.state, unit.lease_ms, last_alive, now)
                    });
                    eprintln!(
                        "box gc: left {} (instance {id}, unit {}): its host died, but the lease it renewed may still be live; its init ends it by {} at the latest, and a later `box gc` removes whatever is left",
                        unit.id.get(..12).unwrap_or(&unit.id),
                        unit.unit,
                        by.map(|by| humantime::format_rfc3339_seconds(by).to_string())
                            .unwrap_or_default(),
                    );
                }
                doomed.extend(gone);
                // Its lock file says when it was last alive: kept while a
                // unit waits on it.
                if waiting.is_empty() {
                    forget.push(id);
                } else {
                    waiting_on.insert(id);
                }
            } else if named {
                eprintln!(
                    "box gc: instance {id} is alive; its host removes its own sessions' units"
                );
            }
        }
        let (removed, failed) = remove_listed(&backends, doomed).await;
        // The empty egress directories of a dead host's ready pooled units
        // (its instance collectable, none of its units waiting on a lease).
        // And the empty workspace directories of its ready pooled units of
        // `source = "fork"` profiles.
        let gone = |id: &str| {
            let named = args.instance.as_deref() == Some(id);
            if args.instance.is_some() && !named && !args.all_instances {
                return false;
            }
            collectable(instance::liveness(&dir, id), named, args.all_instances)
                && !waiting_on.contains(id)
        };
        let runtime_dir = box_backend::default_runtime_dir();
        for swept in box_host::egress::remove_dead_pools_dirs(&runtime_dir, gone) {
            eprintln!(
                "box gc: removed {} (a dead host's pooled unit's egress directory)",
                swept.display()
            );
        }
        let fork_dir = box_host::default_fork_dir();
        for swept in box_host::pool::remove_dead_pools_fork_dirs(&fork_dir, gone) {
            eprintln!(
                "box gc: removed {} (a dead host's pooled unit's fork directory)",
                swept.display()
            );
        }
        for id in forget {
            instance::forget(&dir, &id);
        }
        anyhow::Ok((removed, failed))
    })?;
    for unit in &removed {
        outln!(
            "removed {} (instance {}, session {}, unit {})",
            unit.id.get(..12).unwrap_or(&unit.id),
            unit.instance,
            unit.session,
            unit.unit
        );
    }
    for (unit, why) in &failed {
        eprintln!(
            "box gc: could not remove {} ({}): {why}",
            unit.id, unit.unit
        );
    }
    eprintln!(
        "box gc: removed {} units, {} failed",
        removed.len(),
        failed.len()
    );
    Ok(if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The build script and base Dockerfile, embedded so an installed `box` can
/// build the images without the source tree.
const BUILD_SCRIPT: &str = include_str!("../../images/build.sh");
const BASE_DOCKERFILE: &str = include_str!("../../images/base/Dockerfile");
const FETCH_SCRIPT: &str = include_str!("../../images/fetch/build.sh");
const FETCH_DOCKERFILE: &str = include_str!("../../images/fetch/Dockerfile");
const DEV_SCRIPT: &str = include_str!("../../images/dev/build.sh");
const DEV_DOCKERFILE: &str = include_str!("../../images/dev/Dockerfile");

/// Run `box image`.
pub fn image(args: ImageArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        ImageCommand::Build(build) => image_build(&build),
        ImageCommand::Pull(pull) => crate::cli::pull::pull(&pull),
        ImageCommand::Ls { json, profile_dirs } => image_ls(json, &profile_dirs),
    }
}

fn image_build(args: &BuildArgs) -> anyhow::Result<ExitCode> {
    let dir = std::env::temp_dir().join(format!("box-image-build-{}", std::process::id()));
    let (script, script_args) = match args.target {
        BuildTarget::Base => ("build.sh", args.script_args()),
        BuildTarget::Dev => ("dev/build.sh", args.dev_script_args()?),
        BuildTarget::Fetch => ("fetch/build.sh", args.fetch_script_args()?),
    };
    write_build_tree(&dir)?;
    let status = std::process::Command::new("bash")
        .arg(dir.join(script))
        .args(script_args)
        .status();
    let _ = std::fs::remove_dir_all(&dir);
    let status = status.context("running the image build script with bash")?;
    Ok(if status.success() {
        ExitCode::SUCCESS
    } else {
        eprintln!("box image build: the build script failed ({status})");
        ExitCode::FAILURE
    })
}

/// The images `box image build` makes: the tag is the suite's.
const BUILT_IMAGES: [&str; 4] = [
    "box-rootfs:bookworm",
    "box-base:bookworm",
    "box-dev:bookworm",
    "box-fetch:latest",
];

/// Every image box builds or a profile names, with the profiles naming it.
fn images_used(catalog: &crate::profile::Catalog) -> BTreeMap<String, Vec<String>> {
    let mut images: BTreeMap<String, Vec<String>> = BUILT_IMAGES
        .iter()
        .map(|image| ((*image).to_owned(), Vec::new()))
        .collect();
    for listed in catalog.list().into_iter().filter(|listed| !listed.hidden) {
        // A profile that does not load names no image; `box profile check` says why.
        let Ok(profile) = catalog.load(&listed.name) else {
            continue;
        };
        let named = std::iter::once(&profile.workspace.image)
            .chain(&profile.workspace.images)
            .chain(profile.servers.iter().map(|server| &server.image));
        for image in named {
            let users = images.entry(image.clone()).or_default();
            if !users.contains(&listed.name) {
                users.push(listed.name.clone());
            }
        }
    }
    images
}

fn image_ls(json: bool, profile_dirs: &[PathBuf]) -> anyhow::Result<ExitCode> {
    let images = images_used(&crate::cli::catalog(profile_dirs)?);
    let present: Vec<bool> = runtime()?.block_on(async {
        let backend = box_backend_docker::DockerBackend::connect()
            .await
            .map_err(|why| anyhow::anyhow!("docker: {why}"))?;
        let mut present = Vec::new();
        for image in images.keys() {
            present.push(backend.has_image(image).await);
        }
        anyhow::Ok(present)
    })?;
    if json {
        let listed: Vec<serde_json::Value> = images
            .iter()
            .zip(&present)
            .map(|((image, profiles), present)| {
                serde_json::json!({"image": image, "present": present, "profiles": profiles})
            })
            .collect();
        outln!("{}", serde_json::to_string_pretty(&listed)?);
    } else {
        outln!("{:<32}  {:<8}  PROFILES", "IMAGE", "PRESENT");
        for ((image, profiles), present) in images.iter().zip(&present) {
            outln!(
                "{image:<32}  {:<8}  {}",
                if *present { "yes" } else { "no" },
                if profiles.is_empty() {
                    "-".to_owned()
                } else {
                    profiles.join(",")
                }
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn write_build_tree(dir: &Path) -> anyhow::Result<()> {
    let write = || -> std::io::Result<()> {
        std::fs::create_dir_all(dir.join("base"))?;
        std::fs::create_dir_all(dir.join("fetch"))?;
        std::fs::create_dir_all(dir.join("dev"))?;
        std::fs::write(dir.join("build.sh"), BUILD_SCRIPT)?;
        std::fs::write(dir.join("dev/build.sh"), DEV_SCRIPT)?;
        std::fs::write(dir.join("dev/Dockerfile"), DEV_DOCKERFILE)?;
        std::fs::write(dir.join("base/Dockerfile"), BASE_DOCKERFILE)?;
        std::fs::write(dir.join("fetch/build.sh"), FETCH_SCRIPT)?;
        std::fs::write(dir.join("fetch/Dockerfile"), FETCH_DOCKERFILE)
    };
    write().with_context(|| format!("writing the build context into {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(id: &str, session: &str, profile: &str) -> UnitInfo {
        UnitInfo {
            id: id.to_owned(),
            instance: "box-1".to_owned(),
            session: session.to_owned(),
            unit: "workspace".to_owned(),
            profile: profile.to_owned(),
            created: "2026-01-01T00:00:00Z".to_owned(),
            state: "running".to_owned(),
            parent: None,
            lease_ms: Some(30_000),
            image: Some("box-base:bookworm".to_owned()),
            pool: None,
        }
    }

    /// Each line cut where each header starts: the cells, trimmed.
    fn by_column(table: &str) -> Vec<Vec<String>> {
        let header = table.lines().next().unwrap();
        // Each header searched after the one before it (IMAGE holds AGE).
        let mut starts: Vec<usize> = Vec::new();
        for name in COLUMNS {
            let from = starts.last().map_or(0, |start| start + 1);
            starts.push(from + header[from..].find(name).unwrap());
        }
        table
            .lines()
            .map(|line| {
                starts
                    .iter()
                    .enumerate()
                    .map(|(index, start)| {
                        let end = starts.get(index + 1).copied().unwrap_or(line.len());
                        line.get(*start..end.min(line.len()))
                            .unwrap_or_default()
                            .trim()
                            .to_owned()
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn columns_are_as_wide_as_their_widest_cell_so_a_long_session_shifts_nothing() {
        let now = humantime::parse_rfc3339("2026-01-01T00:05:00Z").unwrap();
        let long = "f".repeat(64);
        let mut forked = unit(&"b".repeat(64), "s1", "ci");
        forked.unit = "fork-1".to_owned();
        forked.parent = Some("workspace".to_owned());
        forked.image = None;
        forked.created = String::new();
        let rows = [
            row(
                BackendKind::Docker,
                &unit(&"a".repeat(64), &long, "default"),
                now,
            ),
            row(BackendKind::Local, &forked, now),
        ];
        // A running unit's usage where its backend answers.
        let mut rows = rows;
        rows[0][9] = crate::cli::top::cpu_time(Some(1_020_000));
        rows[0][10] = crate::cli::top::bytes(Some(64 << 20));
        let table = table(&rows);
        let read = by_column(&table);
        assert_eq!(read[0], COLUMNS.map(str::to_owned).to_vec(), "{table}");
        assert_eq!(
            read[1],
            [
                &"a".repeat(12),
                "docker",
                "box-1",
                &long,
                "workspace",
                "default",
                "box-base:bookworm",
                "running",
                "5m",
                "1.02s",
                "64.0MiB"
            ]
            .map(str::to_owned)
            .to_vec(),
            "{table}"
        );
        assert_eq!(
            read[2],
            [
                &"b".repeat(12),
                "local",
                "box-1",
                "s1",
                "fork-1<workspace",
                "ci",
                "-",
                "running",
                "-",
                "-",
                "-"
            ]
            .map(str::to_owned)
            .to_vec(),
            "{table}"
        );
        // Three spaces between columns, none at the ends of lines.
        assert!(table.lines().all(|line| !line.ends_with(' ')), "{table}");
        assert!(table.contains(&format!("{long}   workspace")), "{table}");
    }

    #[test]
    fn a_label_cannot_break_a_line_of_the_table() {
        let now = std::time::SystemTime::now();
        let table = table(&[row(
            BackendKind::Docker,
            &unit("abc", "s\n\u{1b}[2J", "p"),
            now,
        )]);
        assert_eq!(table.lines().count(), 2, "{table}");
        assert!(table.contains("s\\n\\u{1b}[2J"), "{table}");
    }

    #[test]
    fn ages_are_in_their_largest_whole_unit() {
        let now = humantime::parse_rfc3339("2026-01-10T00:00:00Z").unwrap();
        for (created, want) in [
            ("2026-01-09T23:59:18Z", Some("42s")),
            ("2026-01-09T23:55:00Z", Some("5m")),
            ("2026-01-09T21:00:00Z", Some("3h")),
            ("2026-01-08T00:00:00Z", Some("2d")),
            ("2026-01-11T00:00:00Z", Some("0s")),
            ("", None),
            ("yesterday", None),
        ] {
            assert_eq!(age(created, now).as_deref(), want, "{created}");
        }
    }

    #[test]
    fn filters_of_one_key_are_alternatives_and_keys_must_all_match() {
        let filters = |given: &[&str]| -> Vec<UnitFilter> {
            given
                .iter()
                .map(|text| UnitFilter::parse(text).unwrap())
                .collect()
        };
        let ci = unit("a1", "s1", "ci");
        for (given, backend, want) in [
            (&[][..], BackendKind::Docker, true),
            (&["profile=ci"][..], BackendKind::Docker, true),
            (&["profile=default"], BackendKind::Docker, false),
            (
                &["profile=default", "profile=ci"],
                BackendKind::Docker,
                true,
            ),
            (&["profile=ci", "session=s2"], BackendKind::Docker, false),
            (
                &["profile=ci", "session=s1", "instance=box-1"],
                BackendKind::Docker,
                true,
            ),
            (&["backend=local"], BackendKind::Docker, false),
            (
                &["backend=local", "backend=docker"],
                BackendKind::Docker,
                true,
            ),
            (&["backend=local", "session=s1"], BackendKind::Local, true),
            // Whole values, never prefixes: a session id is exact.
            (&["session=s"], BackendKind::Docker, false),
        ] {
            assert_eq!(
                passes(&filters(given), backend, &ci),
                want,
                "{given:?} {backend:?}"
            );
        }
    }

    #[test]
    fn an_unknown_filter_key_is_refused_naming_the_known_ones() {
        for (text, want) in [
            (
                "colour=red",
                "unknown key `colour`; known keys: backend, instance, profile, session",
            ),
            ("session", "write KEY=VALUE"),
            ("session=", "`session=` has no value"),
            ("backend=kube", "no backend `kube`; choose docker or local"),
        ] {
            let refused = UnitFilter::parse(text).unwrap_err();
            assert!(refused.contains(want), "{text}: {refused}");
        }
        assert_eq!(
            UnitFilter::parse("session=a=b").unwrap(),
            UnitFilter::Session("a=b".to_owned())
        );
    }

    #[test]
    fn a_backend_filter_narrows_the_backends_asked() {
        let backend = |name: &str| UnitFilter::parse(&format!("backend={name}")).unwrap();
        let docker = BackendKind::Docker;
        let local = BackendKind::Local;
        let asked = |only, filters: &[UnitFilter]| {
            backends_asked([docker, local].into_iter(), only, filters)
        };
        assert_eq!(asked(None, &[]), [docker, local]);
        assert_eq!(asked(None, &[backend("local")]), [local]);
        assert_eq!(asked(Some(docker), &[]), [docker]);
        assert_eq!(asked(Some(docker), &[backend("local")]), []);
        assert_eq!(
            asked(None, &[backend("local"), backend("docker")]),
            [docker, local]
        );
        // Whatever the binary registered is asked, in the registry's order.
        let fake = BackendKind::new("fake");
        assert_eq!(
            backends_asked([docker, local, fake].into_iter(), None, &[]),
            [docker, local, fake]
        );
    }

    #[test]
    fn a_unit_is_found_by_its_id_or_a_unique_prefix_and_an_ambiguous_one_is_refused() {
        let units: Vec<Listed> = ["3f2a9c01", "3f2b7d44", "8c1d0000"]
            .into_iter()
            .map(|id| (0, unit(id, "s", "p")))
            .collect();
        assert_eq!(find_unit(&units, "3f2a").unwrap().1.id, "3f2a9c01");
        assert_eq!(find_unit(&units, "8").unwrap().1.id, "8c1d0000");
        assert_eq!(find_unit(&units, "3f2b7d44").unwrap().1.id, "3f2b7d44");
        let ambiguous = find_unit(&units, "3f2").unwrap_err().to_string();
        assert!(
            ambiguous
                .contains("is the start of 2 units' ids (3f2a9c01, 3f2b7d44); give more of the id"),
            "{ambiguous}"
        );
        let missing = find_unit(&units, "ff").unwrap_err().to_string();
        assert!(
            missing.contains("no box unit has an id starting"),
            "{missing}"
        );
        assert!(find_unit(&units, "").is_err());
    }

    #[test]
    fn inspect_shows_image_workspace_limits_and_the_envelope_in_words() {
        let now = humantime::parse_rfc3339("2026-01-01T00:00:42Z").unwrap();
        let detail = UnitDetail {
            info: unit(&"a".repeat(64), "s1", "ci"),
            workspace: Some("/home/me/project".into()),
            pid: Some(4242),
            envelope: Some(serde_json::json!({
                "id": "a".repeat(64),
                "root": "/workspace",
                "network": {"mode": "none", "allow": []},
                "limits": {"memoryBytes": 2_147_483_648_u64, "cpus": 2.0, "pids": 512,
                    "tmpInodes": 65536, "coreBytes": 0, "startTimeoutMs": 30000,
                    "notApplied": ["cpus: no cgroup"]},
                "envPassed": ["HOME", "PATH"],
            })),
        };
        let shown = inspected(BackendKind::Docker, "alive", &detail, now);
        for line in [
            "instance:  box-1 (host alive)",
            "created:   2026-01-01T00:00:00Z (42s ago)",
            "image:     box-base:bookworm",
            "workspace: /home/me/project (at /workspace in the unit)",
            "pid:       4242",
            "limits:    memory 2GiB, cpus 2.0, pids 512, tmp inodes 65536, core 0B, start timeout 30s; not applied: cpus: no cgroup",
            "network:   none",
            "envelope (as reported at its start):",
            "  network:\n    mode: none\n    allow: -",
            "  envPassed: HOME, PATH",
        ] {
            assert!(shown.contains(line), "no {line:?} in\n{shown}");
        }
        let older = UnitDetail::listed(unit("b1", "s1", "ci"));
        let shown = inspected(BackendKind::Docker, "dead", &older, now);
        assert!(shown.contains("limits:    -"), "{shown}");
        assert!(shown.contains("envelope: not recorded"), "{shown}");
    }

    #[test]
    fn gc_never_collects_a_live_instance() {
        for (liveness, named, all, want) in [
            (Liveness::Alive, true, true, false),
            (Liveness::Dead, false, false, true),
            (Liveness::Unknown, false, false, false),
            (Liveness::Unknown, true, false, true),
            (Liveness::Unknown, false, true, true),
        ] {
            assert_eq!(
                collectable(liveness, named, all),
                want,
                "{liveness:?} named={named} all={all}"
            );
        }
    }

    #[test]
    fn the_embedded_build_tree_is_complete() {
        let dir = tempfile::tempdir().unwrap();
        write_build_tree(dir.path()).unwrap();
        let script = std::fs::read_to_string(dir.path().join("build.sh")).unwrap();
        assert!(script.contains("debootstrap --variant=minbase"));
        assert!(dir.path().join("base/Dockerfile").is_file());
        assert!(dir.path().join("fetch/Dockerfile").is_file());
        let fetch = std::fs::read_to_string(dir.path().join("fetch/build.sh")).unwrap();
        assert!(fetch.contains("mcp-server-fetch"));
        let dev = std::fs::read_to_string(dir.path().join("dev/Dockerfile")).unwrap();
        assert!(dev.contains("golang-go"), "{dev}");
        assert!(dir.path().join("dev/build.sh").is_file());
    }

    #[test]
    fn the_dev_build_takes_force_and_suite_and_refuses_mirror_flags() {
        let args = BuildArgs {
            target: BuildTarget::Dev,
            force: true,
            suite: Some("trixie".to_owned()),
            ..BuildArgs::default()
        };
        assert_eq!(
            args.dev_script_args().unwrap(),
            ["--force", "--suite", "trixie"].map(std::ffi::OsString::from)
        );
        let mirror = BuildArgs {
            target: BuildTarget::Dev,
            mirror: Some("http://mirror.internal/debian".to_owned()),
            ..BuildArgs::default()
        };
        let refused = mirror.dev_script_args().unwrap_err().to_string();
        assert!(refused.contains("box image build base"), "{refused}");
    }
}
