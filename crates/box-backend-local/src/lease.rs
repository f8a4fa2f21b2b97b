//! A local unit's run directory and its record, on the host.
//!
//! The unit's helper runs box-init's supervisor (`box_init::supervise`)
//! outside the unit's confinement: it holds the lease on `CLOCK_BOOTTIME`
//! and relays the executor's stdio over the socket the host listens on in
//! the unit's run directory (`box_init::host::bind`), exactly the protocol a
//! docker unit's init speaks, driven by the same host side
//! (`box_backend::lifecycle`: the renewal every third of the lease, a Unix
//! socket write; the relay; a later host's reconnection). When the host stops renewing (it died, hung, was
//! stopped, or let the unit go) the helper ends the unit within the lease;
//! a new host that binds the same directory again while the lease runs gets
//! the unit back ([`Record`] says which unit it is, the key file proves it).
//!
//! The run directory (`RUNTIME/units/<random>`, mode 0711; its parent 0700)
//! holds:
//! - `host.sock`: the host's listening socket;
//! - `key`: the unit key (0600), for a later host's proofs; it never enters
//!   the unit, whose mount namespace hides the directory and whose landlock
//!   rules never grant it (the helper reaches the socket through a directory
//!   handle it opened before any namespace);
//! - `local.json`: the [`Record`], what `list`, `box gc` and a later host's
//!   adopt read (no secret in it).

use std::path::{Path, PathBuf};

use box_backend::UnitInfo;
use box_backend::lifecycle::{self, write_private};
use serde::{Deserialize, Serialize};

use crate::helper::{Applied, SandboxSpec};

/// The record's file name in a run directory.
pub(crate) const RECORD: &str = "local.json";

/// The key's file name in a run directory.
pub(crate) const KEY: &str = "key";

/// What a run directory says of its unit, for `list`, `box gc`, removal and
/// a later host's adopt. Written once, after the unit confined itself.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Record {
    /// The unit's id, as the envelope says: 128 random bits in hex (an
    /// older box's record holds its helper's pid).
    pub id: String,
    /// `box.instance` of the host that started it.
    pub instance: String,
    /// Its session.
    pub session: String,
    /// Its name in the session.
    pub unit: String,
    /// The session's profile.
    pub profile: String,
    /// When it was started (RFC 3339).
    pub created: String,
    /// The unit a fork was made from.
    #[serde(default)]
    pub parent: Option<String>,
    /// The lease in milliseconds.
    pub lease_ms: u64,
    /// The helper's pid and its start time (`/proc/PID/stat`'s 22nd field,
    /// clock ticks since boot): a pid reused by another process is never
    /// taken for the unit's helper.
    pub helper: u32,
    /// The helper's start time.
    pub helper_start: u64,
    /// The unit's private temp directory, removed with it.
    pub temp: PathBuf,
    /// The executor's root when the workspace is the host's or empty.
    pub workspace: Option<PathBuf>,
    /// Whether CMD is box's executor (which writes the secrets).
    pub executor: bool,
    /// The helper's spec without the environment, the secrets and the key
    /// (what the envelope is rebuilt from).
    pub spec: SandboxSpec,
    /// What the helper reported it applied.
    pub applied: Applied,
    /// The profile whose pool started the unit (`box.pool`: a warm unit,
    /// ready or claimed; its session is then the pool's `pool-N`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// The envelope the start reported, for `box units inspect` (absent in
    /// an older box's record).
    #[serde(default)]
    pub envelope: Option<serde_json::Value>,
}

impl Record {
    /// The session whose session-scoped volumes the unit mounts, if it
    /// mounts any.
    pub(crate) fn session_volumes(&self) -> Option<box_backend::SessionLabel> {
        self.spec
            .volumes
            .iter()
            .any(|volume| volume.scope == box_policy::plan::VolumeScope::Session.as_str())
            .then(|| box_backend::SessionLabel {
                instance: self.instance.clone(),
                session: self.session.clone(),
                profile: self.profile.clone(),
            })
    }

    /// The unit as `list` shows it; `state`: `running` while its helper
    /// lives.
    pub(crate) fn info(&self, state: &str) -> UnitInfo {
        UnitInfo {
            id: self.id.clone(),
            instance: self.instance.clone(),
            session: self.session.clone(),
            unit: self.unit.clone(),
            profile: self.profile.clone(),
            created: self.created.clone(),
            state: state.to_owned(),
            parent: self.parent.clone(),
            lease_ms: Some(self.lease_ms),
            // The host's own userland, never an image (the envelope says so).
            image: None,
            pool: self.pool.clone(),
        }
    }

    /// Read `run_dir`'s record.
    pub(crate) fn read(run_dir: &Path) -> Result<Self, String> {
        let path = run_dir.join(RECORD);
        let text = std::fs::read(&path).map_err(|error| format!("{}: {error}", path.display()))?;
        serde_json::from_slice(&text).map_err(|error| format!("{}: {error}", path.display()))
    }

    /// Write it into `run_dir` (0600, replaced atomically).
    pub(crate) fn write(&self, run_dir: &Path) -> Result<(), String> {
        let json = serde_json::to_vec(self).map_err(|error| error.to_string())?;
        write_private(&run_dir.join(RECORD), &json)
    }

    /// Whether the unit's helper is still the process it names.
    pub(crate) fn helper_alive(&self) -> bool {
        start_time(self.helper) == Some(self.helper_start)
    }
}

/// A process's start time (clock ticks since boot), `None` when it is gone.
pub(crate) fn start_time(pid: u32) -> Option<u64> {
    start_time_in(Path::new("/proc"), pid)
}

/// [`start_time`] as `proc_root` shows it.
pub(crate) fn start_time_in(proc_root: &Path, pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    // After the name: state is field 3, start time field 22.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    if fields
        .first()
        .is_some_and(|state| *state == "Z" || *state == "X")
    {
        return None;
    }
    fields.get(19)?.parse().ok()
}

/// A new run directory under `runtime_dir/units` (itself 0700): mode 0711,
/// searchable but not listable, so a helper that switched to the unit's
/// user (a root host) still reaches the socket through its handle; the key
/// and the record in it are 0600, the host's user's.
pub(crate) fn create_run_dir(runtime_dir: &Path) -> Result<PathBuf, String> {
    lifecycle::create_run_dir(runtime_dir, 0o711)
}

/// Every run directory under `runtime_dir/units` that holds a local record.
pub(crate) fn run_dirs(runtime_dir: &Path) -> Vec<(PathBuf, Record)> {
    let Ok(entries) = std::fs::read_dir(lifecycle::units_dir(runtime_dir)) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.join(RECORD).exists())
        .filter_map(|path| Record::read(&path).ok().map(|record| (path, record)))
        .collect()
}
