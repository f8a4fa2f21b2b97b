//! The command-line faces of the backends: `box units ls`, `box gc`,
//! `box image build` and `box doctor`. Thin: each gathers facts through the
//! backends and prints them; `--json` output is the stable form.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context as _;

use std::sync::Arc;

use box_backend::instance::{self, Liveness};
use box_backend::{Backend, UnitInfo};

/// The backend whose units outlive the process that started them, and so
/// the one `box units` and `box gc` look at: docker (a local unit ends with
/// its host).
async fn lasting_backend() -> anyhow::Result<Arc<dyn Backend>> {
    crate::backends::registry()
        .connect("docker")
        .await
        .map_err(|why| anyhow::anyhow!("docker: {why}"))
}

/// `box units`.
#[derive(Debug, Clone, clap::Args)]
pub struct UnitsArgs {
    /// What to do (ls [--json]).
    #[arg(
        value_name = "ARGS",
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub rest: Vec<String>,
}

/// `box gc`.
#[derive(Debug, Clone, clap::Args)]
pub struct GcArgs {
    /// Also remove units of instances not known on this machine (another
    /// boot, or no lock file): assumes every host using this engine runs here.
    #[arg(long)]
    pub all_instances: bool,
    /// Remove the units of this instance if its host is not alive.
    #[arg(long, value_name = "ID", env = "BOX_INSTANCE")]
    pub instance: Option<String>,
}

/// `box image`.
#[derive(Debug, Clone, clap::Args)]
pub struct ImageArgs {
    /// What to do (build [--force]).
    #[arg(
        value_name = "ARGS",
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub rest: Vec<String>,
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// Run `box units`.
pub fn units(args: UnitsArgs) -> anyhow::Result<ExitCode> {
    let mut rest = args.rest.iter().map(String::as_str);
    let json = match (rest.next(), rest.next(), rest.next()) {
        (Some("ls") | None, None, None) => false,
        (Some("ls"), Some("--json"), None) => true,
        _ => anyhow::bail!(
            "box units: unknown arguments {:?}; usage: box units ls [--json]",
            args.rest
        ),
    };
    let units = runtime()?.block_on(async {
        let backend = lasting_backend().await?;
        anyhow::Ok(backend.list().await?)
    })?;
    if json {
        println!("{}", serde_json::to_string_pretty(&units)?);
    } else {
        print_units(&units);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_units(units: &[UnitInfo]) {
    println!(
        "{:<12}  {:<24}  {:<20}  {:<12}  {:<10}  {:<8}  CREATED",
        "ID", "INSTANCE", "SESSION", "UNIT", "PROFILE", "STATE"
    );
    for unit in units {
        println!(
            "{:<12}  {:<24}  {:<20}  {:<12}  {:<10}  {:<8}  {}",
            unit.id.get(..12).unwrap_or(&unit.id),
            unit.instance,
            unit.session,
            unit.unit,
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
/// (lock file left, nobody holding it) units are all orphans. An instance
/// with no lock file here is collected only when named with `--instance`
/// or with `--all-instances`.
pub fn collectable(liveness: Liveness, named: bool, all_instances: bool) -> bool {
    match liveness {
        Liveness::Alive => false,
        Liveness::Dead => true,
        Liveness::Unknown => named || all_instances,
    }
}

/// Run `box gc`.
pub fn gc(args: GcArgs) -> anyhow::Result<ExitCode> {
    let dir = instance::default_dir();
    let (removed, failed) = runtime()?.block_on(async {
        let backend = lasting_backend().await?;
        let units = backend.list().await?;
        let mut by_instance: BTreeMap<String, Vec<UnitInfo>> = BTreeMap::new();
        for unit in units {
            by_instance
                .entry(unit.instance.clone())
                .or_default()
                .push(unit);
        }
        let mut doomed = Vec::new();
        let mut forget = Vec::new();
        for (id, units) in by_instance {
            let named = args.instance.as_deref() == Some(id.as_str());
            if args.instance.is_some() && !named && !args.all_instances {
                continue;
            }
            let live = instance::liveness(&dir, &id);
            if collectable(live, named, args.all_instances) {
                doomed.extend(units);
                forget.push(id);
            } else if named {
                eprintln!(
                    "box gc: instance {id} is alive; its host removes its own sessions' units"
                );
            }
        }
        let report = backend.remove_units(doomed).await;
        for id in forget {
            instance::forget(&dir, &id);
        }
        anyhow::Ok((report.removed, report.failed))
    })?;
    for unit in &removed {
        println!(
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

/// Run `box image`.
pub fn image(args: ImageArgs) -> anyhow::Result<ExitCode> {
    let rest: Vec<&str> = args.rest.iter().map(String::as_str).collect();
    let force = match rest.as_slice() {
        ["build"] => false,
        ["build", "--force"] => true,
        _ => anyhow::bail!(
            "box image: unknown arguments {:?}; usage: box image build [--force]",
            args.rest
        ),
    };
    let dir = std::env::temp_dir().join(format!("box-image-build-{}", std::process::id()));
    write_build_tree(&dir)?;
    let mut command = std::process::Command::new("bash");
    command.arg(dir.join("build.sh"));
    if force {
        command.arg("--force");
    }
    let status = command.status();
    let _ = std::fs::remove_dir_all(&dir);
    let status = status.context("running the image build script with bash")?;
    Ok(if status.success() {
        ExitCode::SUCCESS
    } else {
        eprintln!("box image build: the build script failed ({status})");
        ExitCode::FAILURE
    })
}

fn write_build_tree(dir: &Path) -> anyhow::Result<()> {
    let write = || -> std::io::Result<()> {
        std::fs::create_dir_all(dir.join("base"))?;
        std::fs::write(dir.join("build.sh"), BUILD_SCRIPT)?;
        std::fs::write(dir.join("base/Dockerfile"), BASE_DOCKERFILE)
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
    }
}
