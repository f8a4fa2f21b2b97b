//! A unit's run directory and the renewal of its lease, on the host.
//!
//! Each unit gets a directory of its own under the host's runtime directory,
//! holding only the socket its init connects to (`box_init::host::bind`); the
//! directory is mounted read-only into that unit alone. The host renews the
//! unit's lease over that connection every third of the lease: a Unix
//! socket write, never an engine call. When the host stops renewing (it
//! died, hung, was stopped, or let the unit go), the init ends the unit
//! within the lease and the engine removes it (auto-remove).

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use box_backend::Renewal;
use box_init::host::{Lease, UnitListener};
use box_init::protocol::UnitKey;

/// The lease epoch of a host that started the unit (a later host taking
/// over would renew above it).
pub(crate) const EPOCH: u64 = 1;

/// A unit's run directory on the host, removed when dropped.
#[derive(Debug)]
pub(crate) struct RunDir(PathBuf);

impl RunDir {
    /// A new directory under `runtime_dir/units` (itself private to the
    /// host's user: the unit reaches its own directory through its mount,
    /// never through the parents), searchable by any uid: the unit's user
    /// must reach the socket, and the directory holds nothing else.
    pub(crate) fn create(runtime_dir: &Path) -> Result<Self, String> {
        let parent = runtime_dir.join("units");
        std::fs::create_dir_all(&parent)
            .map_err(|error| format!("creating {}: {error}", parent.display()))?;
        std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(0o700))
            .map_err(|error| format!("{}: {error}", parent.display()))?;
        let dir = parent.join(format!("{:032x}", rand::random::<u128>()));
        std::fs::create_dir(&dir)
            .map_err(|error| format!("creating {}: {error}", dir.display()))?;
        let made = Self(dir);
        std::fs::set_permissions(&made.0, std::fs::Permissions::from_mode(0o755))
            .map_err(|error| format!("{}: {error}", made.0.display()))?;
        Ok(made)
    }

    /// The run directory of a unit another host process started, taken
    /// over (removed when dropped, like one this host made).
    pub(crate) fn adopt(path: &Path) -> Self {
        Self(path.to_owned())
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }

    /// Keep `envelope` beside the directory for `box units inspect` (0600,
    /// replaced whole). Beside it, not in it: the directory is mounted into
    /// the unit, and holds only the socket. A failure costs only that view,
    /// so it is logged, never the start's.
    pub(crate) fn record_envelope(&self, envelope: &box_backend::Envelope) {
        let path = envelope_path(&self.0);
        let written = serde_json::to_vec(envelope)
            .map_err(std::io::Error::other)
            .and_then(|json| write_private(&path, &json));
        if let Err(error) = written {
            tracing::warn!(path = %path.display(), %error, "could not record the unit's envelope for `box units inspect`");
        }
    }
}

/// Where the envelope of the unit whose run directory is `run_dir` is kept.
pub(crate) fn envelope_path(run_dir: &Path) -> PathBuf {
    run_dir.with_extension("envelope.json")
}

/// The envelope recorded beside `run_dir`, if any.
pub(crate) fn recorded_envelope(run_dir: &Path) -> Option<serde_json::Value> {
    let text = std::fs::read(envelope_path(run_dir)).ok()?;
    serde_json::from_slice(&text).ok()
}

/// Write `bytes` to `path`, readable by the host's user only, atomically.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let staged = path.with_extension("new");
    // A link planted at the staged name is refused, never followed.
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(&staged)?;
    file.write_all(bytes)?;
    std::fs::rename(&staged, path)
}

impl Drop for RunDir {
    fn drop(&mut self) {
        for removed in [
            std::fs::remove_dir_all(&self.0),
            std::fs::remove_file(envelope_path(&self.0)),
        ] {
            if let Err(error) = removed
                && error.kind() != std::io::ErrorKind::NotFound
            {
                tracing::debug!(dir = %self.0.display(), %error, "removing a unit's run directory");
            }
        }
    }
}

/// What a unit's start holds until its init has connected.
pub(crate) struct Pending {
    pub(crate) run_dir: RunDir,
    pub(crate) listener: UnitListener,
    pub(crate) key: UnitKey,
    /// The unit's identity in the init's proofs.
    pub(crate) identity: String,
    /// The secrets' values, for the executor's first stdin line.
    pub(crate) secrets: Option<Vec<(String, String)>>,
}

/// Renew `lease` (of `ttl`) at `epoch` every third of it until the channel
/// ends or the returned [`Renewal`] is dropped; the run directory and the
/// listener live as long as the renewals.
pub(crate) fn renew(
    lease: Lease,
    (ttl, epoch): (Duration, u64),
    run_dir: RunDir,
    listener: UnitListener,
    unit: String,
) -> Renewal {
    let path = run_dir.path().to_owned();
    let task = tokio::spawn(async move {
        let _held = (run_dir, listener);
        let interval = Lease::renew_interval(ttl);
        loop {
            tokio::time::sleep(interval).await;
            if let Err(error) = lease.renew(ttl, epoch).await {
                tracing::debug!(unit, %error, "stopped renewing the unit's lease");
                break;
            }
        }
    });
    Renewal::with_run_dir(task.abort_handle(), path)
}
