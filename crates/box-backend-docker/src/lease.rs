//! A docker unit's run directory on the host.
//!
//! Each unit gets a directory of its own under the host's runtime directory
//! (`box_backend::lifecycle::create_run_dir`), holding only the socket its
//! init connects to (`box_init::host::bind`); the directory is mounted
//! read-only into that unit alone. The host renews the unit's lease over that
//! connection (`box_backend::lifecycle::relay`): a Unix socket write, never an
//! engine call. When the host stops renewing (it died, hung, was stopped, or
//! let the unit go), the init ends the unit within the lease and the engine
//! removes it (auto-remove).

use std::path::{Path, PathBuf};

use box_backend::lifecycle;
use box_init::host::UnitListener;
use box_init::protocol::UnitKey;

/// A unit's run directory on the host, removed when dropped.
#[derive(Debug)]
pub(crate) struct RunDir(PathBuf);

impl RunDir {
    /// A new directory under `runtime_dir/units`, searchable by any uid: the
    /// unit's user must reach the socket, and the directory holds nothing
    /// else.
    pub(crate) fn create(runtime_dir: &Path) -> Result<Self, String> {
        lifecycle::create_run_dir(runtime_dir, 0o755).map(Self)
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
        Self::record(&self.0, envelope);
    }

    /// [`Self::record_envelope`] for the run directory at `run_dir` (a
    /// pooled unit's, owned by its relay, recorded again at the claim).
    pub(crate) fn record(run_dir: &Path, envelope: &box_backend::Envelope) {
        let path = envelope_path(run_dir);
        let written = serde_json::to_vec(envelope)
            .map_err(|error| error.to_string())
            .and_then(|json| lifecycle::write_private(&path, &json));
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
