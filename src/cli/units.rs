//! The command-line faces of the backends: `box units ls|rm|inspect`,
//! `box gc` and `box image build|pull|ls` (`pull`: `cli/pull.rs`). Thin: each gathers facts through the
//! backends and prints them; `--json` output is the stable form.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;

use std::sync::Arc;

use box_backend::instance::{self, Liveness};
use box_backend::{Backend, UnitInfo};

/// `box units`: the units box started that are still there, on the docker
/// engine and on the local backend (a local unit outlives its host by its
/// lease), as `box gc` sees them.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = UNITS_EXAMPLES)]
pub struct UnitsArgs {
    /// What to do (default: ls).
    #[command(subcommand)]
    pub command: Option<UnitsCommand>,
    /// Only this backend's units. Without it, docker's and local ones, and
    /// an engine that does not answer is an error, never an empty list.
    #[arg(long, global = true, value_enum, value_name = "NAME")]
    pub backend: Option<UnitsBackend>,
}

/// The backends `box units` can look at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum UnitsBackend {
    /// The docker engine's units.
    Docker,
    /// The local backend's units (a killed host's, until their lease ends).
    Local,
}

const UNITS_EXAMPLES: &str = "Examples:
  box units ls
  box units ls --json
  box units ls --backend local
  box units inspect 3f2a9c01b7d4
  box units rm 3f2a9c01b7d4";

/// The `box units` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum UnitsCommand {
    /// List every unit box started that is still there (docker's and local ones): id, backend, instance, session, unit, profile, state.
    #[command(after_help = "Examples:\n  box units ls\n  box units ls --json")]
    Ls {
        /// Print JSON (the stable form).
        #[arg(long)]
        json: bool,
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
    /// Show one unit as JSON: its labels, state, and whether its host is alive.
    #[command(after_help = "Examples:\n  box units inspect 3f2a9c01b7d4")]
    Inspect {
        /// The unit's id, or a unique prefix of it.
        #[arg(value_name = "ID", add = clap_complete::ArgValueCandidates::new(crate::cli::complete::unit_ids))]
        id: String,
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
fn shown(backends: &[Arc<dyn Backend>], (of, unit): &Listed) -> anyhow::Result<serde_json::Value> {
    let mut shown = serde_json::to_value(unit)?;
    shown["backend"] = serde_json::json!(backends[*of].kind().as_str());
    Ok(shown)
}

/// Every unit of the backends `box units` was asked for, each of which must
/// answer: a list that left out an engine's units would be a false one.
async fn units_of(
    only: Option<UnitsBackend>,
) -> anyhow::Result<(Vec<Arc<dyn Backend>>, Vec<Listed>)> {
    let names: &[&str] = match only {
        Some(UnitsBackend::Docker) => &["docker"],
        Some(UnitsBackend::Local) => &["local"],
        None => &["docker", "local"],
    };
    let (backends, failed) = connect(names).await;
    if !failed.is_empty() {
        let hint = if only.is_none() {
            "; `box units --backend local` looks at the local backend's units alone"
        } else {
            ""
        };
        anyhow::bail!("{}{hint}", failed.join("; "));
    }
    list(backends).await
}

/// Run `box units`.
pub fn units(args: UnitsArgs) -> anyhow::Result<ExitCode> {
    let only = args.backend;
    match args.command.unwrap_or(UnitsCommand::Ls { json: false }) {
        UnitsCommand::Ls { json } => {
            let (backends, units) = runtime()?.block_on(units_of(only))?;
            if json {
                let shown = units
                    .iter()
                    .map(|listed| shown(&backends, listed))
                    .collect::<anyhow::Result<Vec<_>>>()?;
                outln!("{}", serde_json::to_string_pretty(&shown)?);
            } else {
                print_units(&backends, &units);
            }
            Ok(ExitCode::SUCCESS)
        }
        UnitsCommand::Inspect { id } => {
            let (backends, units) = runtime()?.block_on(units_of(only))?;
            let listed = find_unit(&units, &id)?;
            let alive = instance::liveness(&instance::default_dir(), &listed.1.instance);
            let mut shown = shown(&backends, listed)?;
            shown["host"] = serde_json::json!(match alive {
                Liveness::Alive => "alive",
                Liveness::Dead => "dead",
                Liveness::Unknown => "unknown",
            });
            outln!("{}", serde_json::to_string_pretty(&shown)?);
            Ok(ExitCode::SUCCESS)
        }
        UnitsCommand::Rm { ids, force } => remove(&ids, force, only),
    }
}

/// A unit listed by one of the backends: the backend's index, and the unit.
type Listed = (usize, UnitInfo);

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
fn remove(ids: &[String], force: bool, only: Option<UnitsBackend>) -> anyhow::Result<ExitCode> {
    let dir = instance::default_dir();
    let (removed, failed) = runtime()?.block_on(async {
        let (backends, units) = units_of(only).await?;
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

fn print_units(backends: &[Arc<dyn Backend>], units: &[Listed]) {
    outln!(
        "{:<12}  {:<7}  {:<24}  {:<20}  {:<12}  {:<10}  {:<8}  CREATED",
        "ID",
        "BACKEND",
        "INSTANCE",
        "SESSION",
        "UNIT",
        "PROFILE",
        "STATE"
    );
    for (of, unit) in units {
        // A fork shows the unit it was made from: `fork-1<workspace`.
        let name = match &unit.parent {
            Some(parent) => format!("{}<{parent}", unit.unit),
            None => unit.unit.clone(),
        };
        outln!(
            "{:<12}  {:<7}  {:<24}  {:<20}  {:<12}  {:<10}  {:<8}  {}",
            unit.id.get(..12).unwrap_or(&unit.id),
            backends[*of].kind().as_str(),
            unit.instance,
            unit.session,
            name,
            unit.profile,
            unit.state,
            unit.created
        );
    }
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

/// The backends whose units can outlive the process that started them:
/// docker when its engine answers, and local (a local unit outlives its host
/// by its lease; its run directory's record says so). At least one:
/// `box gc` skips one that does not answer, saying so.
async fn lasting_backends() -> anyhow::Result<Vec<Arc<dyn Backend>>> {
    let (backends, why) = connect(&["docker", "local"]).await;
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
                }
            } else if named {
                eprintln!(
                    "box gc: instance {id} is alive; its host removes its own sessions' units"
                );
            }
        }
        let (removed, failed) = remove_listed(&backends, doomed).await;
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
