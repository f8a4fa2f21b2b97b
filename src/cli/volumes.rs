//! `box volumes ls|rm|prune`: the `[[volume]]` storage of both backends, as
//! box's volume store keeps it (`box_backend::volumes`, under
//! `$XDG_STATE_HOME/box/volumes`). Listing needs no engine; removing a
//! docker volume asks the engine to remove its named volume first (it
//! refuses one a container mounts), a local one takes its lock (a live
//! unit's helper holds it). `--json` output is the stable form.

use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use box_backend::volumes::{ListedVolume, VolumeStore};
use box_backend::{Backend as _, BackendKind};

use crate::cli::units::runtime;

const VOLUMES_EXAMPLES: &str = "Volumes are kept under $XDG_STATE_HOME/box/volumes (else
~/.local/state/box/volumes; /var/lib/box/volumes as root), one directory per
volume; docker's are also the engine's named volumes (box-KEY-...).

Examples:
  box volumes ls
  box volumes ls --filter profile=dev --json
  box volumes rm p-dev-pip-cache
  box volumes prune --dry-run
  box volumes prune --all";

/// `box volumes`: the storage of `[[volume]]` tables that outlives units.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = VOLUMES_EXAMPLES)]
pub struct VolumesArgs {
    /// What to do (default: ls).
    #[command(subcommand)]
    pub command: Option<VolumesCommand>,
}

/// `--filter`'s keys, as its errors name them.
const FILTER_KEYS: &str = "backend, profile, scope, session";

/// One `--filter KEY=VALUE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeFilter {
    /// `backend=docker|local`.
    Backend(String),
    /// `profile=NAME`: the profile it was made for.
    Profile(String),
    /// `scope=session|profile`.
    Scope(String),
    /// `session=ID`: a session-scoped volume's session.
    Session(String),
}

impl VolumeFilter {
    /// `KEY=VALUE`, or why not.
    fn parse(text: &str) -> Result<Self, String> {
        let (key, value) = super::filter_parts(text, "profile=dev", FILTER_KEYS)?;
        match key {
            "backend" => {
                crate::backends::named(value).map(|kind| Self::Backend(kind.as_str().to_owned()))
            }
            "scope" if matches!(value, "session" | "profile") => Ok(Self::Scope(value.to_owned())),
            "scope" => Err(format!("no scope `{value}`; choose session or profile")),
            "profile" => Ok(Self::Profile(value.to_owned())),
            "session" => Ok(Self::Session(value.to_owned())),
            other => Err(format!("unknown key `{other}`; known keys: {FILTER_KEYS}")),
        }
    }

    fn key(&self) -> &'static str {
        match self {
            Self::Backend(_) => "backend",
            Self::Profile(_) => "profile",
            Self::Scope(_) => "scope",
            Self::Session(_) => "session",
        }
    }

    fn matches(&self, volume: &ListedVolume) -> bool {
        let record = &volume.record;
        match self {
            Self::Backend(wanted) => &record.backend == wanted,
            Self::Profile(wanted) => &record.profile == wanted,
            Self::Scope(wanted) => &record.scope == wanted,
            Self::Session(wanted) => record.session.as_ref() == Some(wanted),
        }
    }
}

/// Whether `volume` passes every filter: values of one key are
/// alternatives, different keys must all match (as `box units ls`).
fn passes(filters: &[VolumeFilter], volume: &ListedVolume) -> bool {
    filters.iter().all(|filter| {
        filters
            .iter()
            .filter(|other| other.key() == filter.key())
            .any(|other| other.matches(volume))
    })
}

/// The `box volumes` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum VolumesCommand {
    /// List every volume of both backends: key, name, backend, scope, profile, size, last use.
    #[command(
        after_help = "Filters (--filter KEY=VALUE, repeatable; values of one key are alternatives, different keys must all match):
  backend=docker|local   profile=NAME   scope=session|profile   session=ID

Examples:
  box volumes ls
  box volumes ls --json
  box volumes ls --filter profile=dev --filter backend=local"
    )]
    Ls {
        /// Print JSON (the stable form): an array of objects.
        #[arg(long)]
        json: bool,
        /// Only volumes matching KEY=VALUE, KEY one of backend, profile, scope, session (repeatable).
        #[arg(long = "filter", value_name = "KEY=VALUE", value_parser = VolumeFilter::parse)]
        filters: Vec<VolumeFilter>,
    },
    /// Remove volumes by key (as `ls` shows it), on every backend that has one
    /// of that key unless --backend; refuses a volume a unit uses, naming it.
    #[command(after_help = "Examples:
  box volumes rm p-dev-pip-cache
  box volumes rm p-dev-pip-cache p-dev-npm-cache --backend local")]
    Rm {
        /// The volumes' keys.
        #[arg(value_name = "KEY", required = true, add = clap_complete::ArgValueCandidates::new(crate::cli::complete::volume_keys))]
        keys: Vec<String>,
        /// Only this backend's volume of each key.
        #[arg(long, value_name = "NAME", value_parser = crate::backends::name_parser())]
        backend: Option<BackendKind>,
    },
    /// Remove the volumes no unit uses: session-scoped ones whose session is
    /// gone, and with --all (or --unused-for) profile-scoped ones too.
    #[command(after_help = "Examples:
  box volumes prune
  box volumes prune --dry-run
  box volumes prune --all --filter profile=dev
  box volumes prune --unused-for 30d --json")]
    Prune {
        /// Also profile-scoped volumes (every session's caches of a profile).
        #[arg(long, conflicts_with = "unused_for")]
        all: bool,
        /// Also profile-scoped volumes no unit started with for this long (`30d`, `12h`).
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        unused_for: Option<Duration>,
        /// Say what would be removed; remove nothing.
        #[arg(long)]
        dry_run: bool,
        /// Print JSON: the volumes removed (or, with --dry-run, that would be).
        #[arg(long)]
        json: bool,
        /// Only volumes matching KEY=VALUE, as `ls --filter` (repeatable).
        #[arg(long = "filter", value_name = "KEY=VALUE", value_parser = VolumeFilter::parse)]
        filters: Vec<VolumeFilter>,
    },
}

/// Run `box volumes`.
pub fn volumes(args: VolumesArgs) -> anyhow::Result<ExitCode> {
    let store = VolumeStore::default();
    match args.command.unwrap_or(VolumesCommand::Ls {
        json: false,
        filters: Vec::new(),
    }) {
        VolumesCommand::Ls { json, filters } => {
            let listed: Vec<ListedVolume> = store
                .list()
                .into_iter()
                .filter(|volume| passes(&filters, volume))
                .collect();
            if json {
                let shown: Vec<serde_json::Value> = listed.iter().map(shown).collect();
                outln!("{}", serde_json::to_string_pretty(&shown)?);
            } else {
                out!("{}", table(&listed, SystemTime::now()));
            }
            Ok(ExitCode::SUCCESS)
        }
        VolumesCommand::Rm { keys, backend } => {
            remove(&store, &keys, backend.map(BackendKind::as_str))
        }
        VolumesCommand::Prune {
            all,
            unused_for,
            dry_run,
            json,
            filters,
        } => prune(&store, &filters, Prune { all, unused_for }, dry_run, json),
    }
}

/// A volume as `ls --json` shows it (the stable field names).
fn shown(volume: &ListedVolume) -> serde_json::Value {
    let record = &volume.record;
    let mut shown = serde_json::json!({
        "key": volume.key,
        "name": record.name,
        "backend": record.backend,
        "scope": record.scope,
        "profile": record.profile,
        "bytes": volume.bytes,
        "created": rfc3339(record.created),
        "lastUsed": rfc3339(record.last_used),
        "path": volume.dir.join("data").display().to_string(),
    });
    if let Some(instance) = &record.instance {
        shown["instance"] = serde_json::json!(instance);
    }
    if let Some(session) = &record.session {
        shown["session"] = serde_json::json!(session);
    }
    shown
}

fn rfc3339(secs: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(secs)).to_string()
}

/// `bytes` for people: `0 B`, `512 B`, `1.5 KiB`, `12.0 MiB`, `2.1 GiB`.
fn size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// How long ago `secs` (since the epoch) was, at `now`: `42s`, `5m`, `3h`, `2d`.
fn ago(secs: u64, now: SystemTime) -> String {
    let then = UNIX_EPOCH + Duration::from_secs(secs);
    let elapsed = now.duration_since(then).unwrap_or_default().as_secs();
    match elapsed {
        0..60 => format!("{elapsed}s ago"),
        60..3600 => format!("{}m ago", elapsed / 60),
        3600..172_800 => format!("{}h ago", elapsed / 3600),
        _ => format!("{}d ago", elapsed / 86_400),
    }
}

/// `box volumes ls`' columns.
const COLUMNS: [&str; 7] = [
    "KEY",
    "NAME",
    "BACKEND",
    "SCOPE",
    "PROFILE",
    "SIZE",
    "LAST USED",
];

/// `volumes` as a table, each column as wide as its widest cell.
fn table(volumes: &[ListedVolume], now: SystemTime) -> String {
    let rows: Vec<[String; COLUMNS.len()]> = std::iter::once(COLUMNS.map(str::to_owned))
        .chain(volumes.iter().map(|volume| {
            let record = &volume.record;
            [
                volume.key.clone(),
                record.name.clone(),
                record.backend.clone(),
                record.scope.clone(),
                record.profile.clone(),
                size(volume.bytes),
                ago(record.last_used, now),
            ]
        }))
        .map(|row| {
            // Names come from files anyone with box's user can write:
            // nothing in one may move the cursor.
            row.map(|cell| super::out::escape_controls(&cell))
        })
        .collect();
    super::out::columns(&rows)
}

/// The backends that remove volumes, connected once each when first needed.
#[derive(Default)]
struct Removers {
    docker: Option<Result<box_backend_docker::DockerBackend, String>>,
    local: Option<Result<box_backend_local::LocalBackend, String>>,
}

impl Removers {
    async fn docker(&mut self) -> Result<&box_backend_docker::DockerBackend, String> {
        if self.docker.is_none() {
            let connected = box_backend_docker::DockerBackend::connect()
                .await
                .map_err(|error| {
                    format!("the docker engine does not answer, and removing a docker volume needs it to remove its named volume: {error}")
                });
            self.docker = Some(connected);
        }
        match self.docker.as_ref() {
            Some(Ok(docker)) => Ok(docker),
            Some(Err(why)) => Err(why.clone()),
            None => Err("the docker engine was not asked".to_owned()),
        }
    }

    fn local(&mut self) -> Result<&box_backend_local::LocalBackend, String> {
        let local = self.local.get_or_insert_with(|| {
            box_backend_local::LocalBackend::current().map_err(|error| error.to_string())
        });
        local.as_ref().map_err(Clone::clone)
    }

    /// Remove `volume` by its backend: refused, naming who uses it, while
    /// a unit does.
    async fn remove(&mut self, volume: &ListedVolume) -> Result<(), String> {
        if volume.record.backend == BackendKind::Docker.as_str() {
            self.docker().await?.remove_volume(volume).await
        } else {
            self.local()?.remove_volume(volume)
        }
    }

    /// The units that use `volume` now (empty: none, or its backend cannot say).
    async fn users(&mut self, volume: &ListedVolume) -> Vec<box_backend::UnitInfo> {
        if volume.record.backend == BackendKind::Docker.as_str() {
            match self.docker().await {
                Ok(docker) => docker.volume_users(volume).await.unwrap_or_default(),
                Err(_) => Vec::new(),
            }
        } else if box_backend::volumes::in_use_locally(volume) {
            match self.local() {
                Ok(local) => local.volume_users(volume),
                Err(_) => Vec::new(),
            }
        } else {
            Vec::new()
        }
    }

    /// The sessions that have units on `backend` now (instance, session),
    /// or why they cannot be known.
    async fn sessions(&mut self, backend: &str) -> Result<Vec<(String, String)>, String> {
        let units = if backend == BackendKind::Docker.as_str() {
            self.docker()
                .await?
                .list()
                .await
                .map_err(|error| error.to_string())?
        } else {
            self.local()?
                .list()
                .await
                .map_err(|error| error.to_string())?
        };
        Ok(units
            .into_iter()
            .map(|unit| (unit.instance, unit.session))
            .collect())
    }
}

/// `box volumes rm`: every key found before anything is removed.
fn remove(store: &VolumeStore, keys: &[String], backend: Option<&str>) -> anyhow::Result<ExitCode> {
    let listed = store.list();
    let mut doomed: Vec<&ListedVolume> = Vec::new();
    for key in keys {
        let found: Vec<&ListedVolume> = listed
            .iter()
            .filter(|volume| &volume.key == key)
            .filter(|volume| backend.is_none_or(|backend| volume.record.backend == backend))
            .collect();
        if found.is_empty() {
            let on = backend.map(|b| format!(" on {b}")).unwrap_or_default();
            anyhow::bail!("no volume has the key {key:?}{on}; see `box volumes ls`");
        }
        for volume in found {
            if !doomed.iter().any(|seen| seen.dir == volume.dir) {
                doomed.push(volume);
            }
        }
    }
    let failed = crate::cli::units::runtime()?.block_on(async {
        let mut removers = Removers::default();
        let mut failed = 0;
        for volume in doomed {
            match removers.remove(volume).await {
                Ok(()) => outln!("{} ({})", volume.key, volume.record.backend),
                Err(why) => {
                    eprintln!("box volumes rm: {why}");
                    failed += 1;
                }
            }
        }
        failed
    });
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Which profile-scoped volumes `prune` also removes.
#[derive(Debug, Clone, Copy)]
struct Prune {
    all: bool,
    unused_for: Option<Duration>,
}

impl Prune {
    /// Whether a profile-scoped volume last used at `last_used` goes.
    fn takes_profile_volume(self, last_used: u64, now: SystemTime) -> bool {
        if self.all {
            return true;
        }
        let Some(unused_for) = self.unused_for else {
            return false;
        };
        let used = UNIX_EPOCH + Duration::from_secs(last_used);
        now.duration_since(used).unwrap_or_default() >= unused_for
    }
}

/// `box volumes prune`.
fn prune(
    store: &VolumeStore,
    filters: &[VolumeFilter],
    which: Prune,
    dry_run: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let now = SystemTime::now();
    let candidates: Vec<ListedVolume> = store
        .list()
        .into_iter()
        .filter(|volume| passes(filters, volume))
        .filter(|volume| {
            volume.record.scope != "profile"
                || which.takes_profile_volume(volume.record.last_used, now)
        })
        .collect();
    let (pruned, problems) = runtime()?.block_on(async {
        let mut removers = Removers::default();
        let mut sessions: std::collections::BTreeMap<
            String,
            Result<Vec<(String, String)>, String>,
        > = std::collections::BTreeMap::new();
        let (mut pruned, mut problems) = (Vec::new(), Vec::new());
        for volume in candidates {
            let record = &volume.record;
            if record.scope == "session" {
                // Only once its session has no unit left on its backend.
                if !sessions.contains_key(&record.backend) {
                    let live = removers.sessions(&record.backend).await;
                    sessions.insert(record.backend.clone(), live);
                }
                let live = match sessions.get(&record.backend) {
                    Some(Ok(live)) => live,
                    Some(Err(why)) => {
                        problems.push(format!("{} ({}): {why}", volume.key, record.backend));
                        continue;
                    }
                    None => continue,
                };
                let ours = (
                    record.instance.clone().unwrap_or_default(),
                    record.session.clone().unwrap_or_default(),
                );
                if live.contains(&ours) {
                    continue;
                }
            }
            if dry_run {
                // What a removal would refuse is kept out of the list.
                let in_use = !removers.users(&volume).await.is_empty()
                    || (record.backend == BackendKind::Local.as_str()
                        && box_backend::volumes::in_use_locally(&volume));
                if !in_use {
                    pruned.push(volume);
                }
                continue;
            }
            match removers.remove(&volume).await {
                Ok(()) => pruned.push(volume),
                // In use: not unused, so not pruned; said, not an error.
                Err(why) if why.contains("is in use by") => {
                    eprintln!("box volumes prune: kept {}: {why}", volume.key);
                }
                Err(why) => problems.push(why),
            }
        }
        (pruned, problems)
    });
    if json {
        let shown: Vec<serde_json::Value> = pruned.iter().map(shown).collect();
        outln!("{}", serde_json::to_string_pretty(&shown)?);
    } else {
        let verb = if dry_run { "would remove" } else { "removed" };
        for volume in &pruned {
            outln!(
                "{verb} {} ({}, {})",
                volume.key,
                volume.record.backend,
                size(volume.bytes)
            );
        }
        let total: u64 = pruned.iter().map(|volume| volume.bytes).sum();
        outln!(
            "{} {} volume{}, {}",
            if dry_run { "Would free" } else { "Freed" },
            pruned.len(),
            if pruned.len() == 1 { "" } else { "s" },
            size(total)
        );
    }
    for problem in &problems {
        eprintln!("box volumes prune: {problem}");
    }
    Ok(if problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_ages_are_for_people() {
        assert_eq!(size(0), "0 B");
        assert_eq!(size(1023), "1023 B");
        assert_eq!(size(1536), "1.5 KiB");
        assert_eq!(size(12 << 20), "12.0 MiB");
        let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert_eq!(ago(1_000_000 - 42, now), "42s ago");
        assert_eq!(ago(1_000_000 - 7200, now), "2h ago");
        assert_eq!(ago(1_000_000 - 3 * 86_400, now), "3d ago");
    }

    #[test]
    fn filters_name_their_keys_and_values() {
        assert_eq!(
            VolumeFilter::parse("profile=dev"),
            Ok(VolumeFilter::Profile("dev".to_owned()))
        );
        assert!(
            VolumeFilter::parse("scope=forever")
                .unwrap_err()
                .contains("session or profile")
        );
        assert!(
            VolumeFilter::parse("colour=red")
                .unwrap_err()
                .contains("known keys: backend, profile, scope, session")
        );
    }

    #[test]
    fn profile_volumes_go_with_all_or_when_unused_long_enough() {
        let now = UNIX_EPOCH + Duration::from_secs(10 * 86_400);
        let week_ago = 3 * 86_400;
        let neither = Prune {
            all: false,
            unused_for: None,
        };
        assert!(!neither.takes_profile_volume(week_ago, now));
        let all = Prune {
            all: true,
            unused_for: None,
        };
        assert!(all.takes_profile_volume(week_ago, now));
        let month = Prune {
            all: false,
            unused_for: Some(Duration::from_secs(30 * 86_400)),
        };
        assert!(!month.takes_profile_volume(week_ago, now));
        let day = Prune {
            all: false,
            unused_for: Some(Duration::from_secs(86_400)),
        };
        assert!(day.takes_profile_volume(week_ago, now));
    }
}
