//! A local unit's volumes: made ready in box's volume store, found by the
//! units that mount them, removed with their session's last unit.

use std::path::{Path, PathBuf};

use box_backend::{BackendError, SessionLabel, UnitInfo};
use box_policy::envelope::BackendKind;
use box_policy::plan::{UnitSpec, VolumePath};

use crate::LocalBackend;

impl LocalBackend {
    /// The live units that mount `listed` (their records name its
    /// directory, their helpers live).
    pub fn volume_users(&self, listed: &box_backend::volumes::ListedVolume) -> Vec<UnitInfo> {
        let data = listed.dir.join("data");
        self.recorded_all()
            .into_iter()
            .filter(|(_, record)| {
                record.helper_alive()
                    && record.spec.volumes.iter().any(|volume| volume.data == data)
            })
            .map(|(_, record)| record.info("running"))
            .collect()
    }

    /// Remove `listed`, unless a live unit holds its lock: then an error
    /// naming the units that use it.
    pub fn remove_volume(&self, listed: &box_backend::volumes::ListedVolume) -> Result<(), String> {
        if box_backend::volumes::in_use_locally(listed) {
            let users: Vec<String> = self
                .volume_users(listed)
                .iter()
                .map(|unit| format!("unit {} of session {}", unit.unit, unit.session))
                .collect();
            let users = if users.is_empty() {
                "a running unit".to_owned()
            } else {
                users.join(", ")
            };
            return Err(format!(
                "volume {} ({}) is in use by {users}; end its session first (`box units ls` shows it)",
                listed.record.name, listed.key
            ));
        }
        box_backend::volumes::remove(listed)
    }
}

/// Make `spec`'s volumes ready in box's volume store for `session`: each
/// one's directory, its content's handed to the unit's user.
pub(crate) fn prepare_volumes(
    store: &box_backend::volumes::VolumeStore,
    session: &SessionLabel,
    spec: &UnitSpec,
) -> Result<Vec<LocalVolume>, BackendError> {
    // The unit runs as its spec's user, else as box's own.
    let owner = spec.user.or_else(|| {
        Some(box_policy::plan::UserIds {
            uid: nix::unistd::geteuid().as_raw(),
            gid: nix::unistd::getegid().as_raw(),
        })
    });
    spec.volumes
        .iter()
        .map(|volume| {
            let prepared = store
                .prepare(BackendKind::Local, volume, session, owner)
                .map_err(|message| BackendError::Other {
                    unit: spec.name.clone(),
                    doing: format!("preparing volume {}", volume.name),
                    message,
                })?;
            Ok(LocalVolume {
                volume: volume.clone(),
                prepared,
                profile: session.profile.clone(),
            })
        })
        .collect()
}

/// Remove `session`'s session-scoped volumes that no unit holds any more
/// (another unit of the session still holding one keeps it: its removal
/// comes back here), as the docker backend does with the session's last
/// unit.
pub(crate) fn remove_session_volumes(
    store: &box_backend::volumes::VolumeStore,
    session: &SessionLabel,
) {
    for listed in store.of_session(BackendKind::Local, session) {
        if let Err(error) = box_backend::volumes::remove(&listed) {
            tracing::debug!(volume = listed.key, %error, "removing a session volume");
        }
    }
}

/// A volume of a local unit: the profile's, and its directory in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LocalVolume {
    /// The profile's volume.
    pub volume: box_policy::plan::Volume,
    /// Its directory and lock in the store.
    pub prepared: box_backend::volumes::PreparedVolume,
    /// The profile of the session it was made for.
    pub profile: String,
}

impl LocalVolume {
    /// Where the unit sees it: beneath the unit's home for `~/REL`.
    pub(crate) fn target(&self, home: &Path) -> PathBuf {
        match &self.volume.path {
            VolumePath::Home(relative) => home.join(relative),
            VolumePath::Absolute(path) => path.clone(),
        }
    }
}
