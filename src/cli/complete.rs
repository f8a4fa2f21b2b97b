//! Shell completion: clap_complete's dynamic engine. The script `box
//! completions SHELL` prints calls box back at each TAB (`BOX_COMPLETE=SHELL
//! box -- WORDS...`), so what is completed is always this binary's command
//! line, and the values only box knows are listed as they are now: profile
//! names (`--profile`, `box profile show NAME`) and unit ids (`box units
//! inspect ID`).

use std::ffi::OsString;
use std::time::Duration;

use clap_complete::CompletionCandidate;
use clap_complete::env::{EnvCompleter, Shells};

use crate::profile::Catalog;

/// The variable that turns a run of box into a completion request. Not
/// clap_complete's default `COMPLETE`, which a user may have set for
/// something else: box would then print completions instead of running.
pub const VAR: &str = "BOX_COMPLETE";

/// Answer a completion request and exit, when `BOX_COMPLETE` asks for one;
/// otherwise return at once. Called first in `main`, before anything writes
/// to stdout.
pub fn from_env(command: fn() -> clap::Command) {
    clap_complete::CompleteEnv::with_factory(command)
        .var(VAR)
        .bin("box")
        .complete();
}

/// The registration script for `shell`: it completes `box` by asking the
/// binary that printed it (as `argv[0]` names it: `box` from `PATH`, else
/// its absolute path).
pub fn registration(shell: clap_complete::Shell) -> anyhow::Result<Vec<u8>> {
    let name = shell.to_string();
    let builtins = Shells::builtins();
    let completer: &dyn EnvCompleter = builtins
        .completer(&name)
        .ok_or_else(|| anyhow::anyhow!("completions for {name} are not supported"))?;
    let mut script = Vec::new();
    completer.write_registration(VAR, "box", "box", &completer_path(), &mut script)?;
    Ok(script)
}

/// How the script calls box back: as this run was called, made absolute
/// when it was a relative path (`./target/release/box`).
fn completer_path() -> String {
    let argv0 = std::env::args_os()
        .next()
        .unwrap_or_else(|| OsString::from("box"));
    let mut path = std::path::PathBuf::from(argv0);
    if path.components().count() > 1
        && path.is_relative()
        && let Ok(cwd) = std::env::current_dir()
    {
        path = cwd.join(path);
    }
    path.to_string_lossy().into_owned()
}

/// The profiles box finds in its standard places (`--profiles` directories
/// on the same command line are not known to a completer), each with its
/// description.
pub fn profile_names() -> Vec<CompletionCandidate> {
    let catalog = Catalog::new(Vec::new());
    catalog
        .list()
        .into_iter()
        .filter(|listed| !listed.hidden)
        .map(|listed| {
            let help = catalog
                .load(&listed.name)
                .ok()
                .map(|profile| profile.description.into());
            CompletionCandidate::new(listed.name).help(help)
        })
        .collect()
}

/// How long a TAB waits for the backends to list their units.
const LIST_TIMEOUT: Duration = Duration::from_secs(2);

/// The volumes `box volumes ls` shows, by key (for `box volumes rm KEY`),
/// each with its backend, name, scope and profile; read from box's volume
/// store, no engine asked.
pub fn volume_keys() -> Vec<CompletionCandidate> {
    let mut candidates: Vec<CompletionCandidate> = Vec::new();
    for volume in box_backend::volumes::VolumeStore::default().list() {
        if candidates
            .iter()
            .any(|seen| seen.get_value() == volume.key.as_str())
        {
            continue;
        }
        let record = &volume.record;
        let help = format!(
            "{} {} {} (profile {})",
            record.backend, record.name, record.scope, record.profile
        );
        candidates.push(CompletionCandidate::new(volume.key.clone()).help(Some(help.into())));
    }
    candidates
}

/// The units `box units ls` shows, by the id it shows (docker's first 12
/// hex digits), each with its session, unit and profile. A backend that does
/// not answer in time adds nothing; a completer cannot report errors.
pub fn unit_ids() -> Vec<CompletionCandidate> {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return Vec::new();
    };
    runtime.block_on(async {
        let registry = crate::backends::registry();
        let mut candidates = Vec::new();
        let names: Vec<&str> = registry.kinds().map(|kind| kind.as_str()).collect();
        for name in names {
            let listed = tokio::time::timeout(LIST_TIMEOUT, async {
                let backend = registry.connect(name).await.ok()?;
                backend.list().await.ok()
            })
            .await;
            for unit in listed.ok().flatten().unwrap_or_default() {
                let id = unit.id.get(..12).unwrap_or(&unit.id).to_owned();
                let help = format!(
                    "{name} {} {} (session {}, profile {})",
                    unit.unit, unit.state, unit.session, unit.profile
                );
                candidates.push(CompletionCandidate::new(id).help(Some(help.into())));
            }
        }
        candidates
    })
}
