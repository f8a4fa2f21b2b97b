//! A docker unit's volumes: box's own directory for each
//! (`box_backend::volumes`), made the engine's named volume (`box-…`, the
//! local driver bound to that directory) carrying box's labels, so the
//! engine shows it (`docker volume ls`) and refuses to remove one a
//! container uses. Removed with its session (scope `session`) once no unit
//! of the session mounts it, or by `box volumes rm|prune`.

use std::collections::HashMap;

use bollard::Docker;
use bollard::errors::Error as DockerError;
use sha2::Digest as _;

use box_backend::SessionLabel;
use box_backend::volumes::{ListedVolume, PreparedVolume};
use box_policy::plan::{Volume, VolumeScope};

/// Labels of box's named volumes.
pub mod labels {
    /// The volume's name in its profile.
    pub const VOLUME: &str = "box.volume";
    /// Its key in box's volumes directory.
    pub const KEY: &str = "box.volume-key";
    /// `session` or `profile`.
    pub const SCOPE: &str = "box.volume-scope";
}

/// The engine's name for a prepared volume: its key, and a digest of its
/// directory (two hosts with different state directories never share one).
pub fn engine_name(prepared: &PreparedVolume) -> String {
    let digest = sha2::Sha256::digest(prepared.data.to_string_lossy().as_bytes());
    format!("box-{}-{}", prepared.key, &hex::encode(digest)[..8])
}

/// The engine's name of a listed volume.
pub fn listed_engine_name(listed: &ListedVolume) -> String {
    engine_name(&PreparedVolume {
        key: listed.key.clone(),
        data: listed.dir.join("data"),
        lock: listed.dir.join("lock"),
    })
}

/// Make the engine's named volume for `prepared` (the same name again is the
/// same volume: the engine answers with the one it has).
pub async fn ensure(
    docker: &Docker,
    prepared: &PreparedVolume,
    volume: &Volume,
    session: &SessionLabel,
) -> Result<String, DockerError> {
    let name = engine_name(prepared);
    let mut volume_labels = HashMap::from([
        (labels::VOLUME.to_owned(), volume.name.clone()),
        (labels::KEY.to_owned(), prepared.key.clone()),
        (labels::SCOPE.to_owned(), volume.scope.as_str().to_owned()),
        (
            box_backend::labels::PROFILE.to_owned(),
            session.profile.clone(),
        ),
    ]);
    if volume.scope == VolumeScope::Session {
        volume_labels.insert(
            box_backend::labels::INSTANCE.to_owned(),
            session.instance.clone(),
        );
        volume_labels.insert(
            box_backend::labels::SESSION.to_owned(),
            session.session.clone(),
        );
    }
    let request = bollard::models::VolumeCreateRequest {
        name: Some(name.clone()),
        driver: Some("local".to_owned()),
        driver_opts: Some(HashMap::from([
            ("type".to_owned(), "none".to_owned()),
            ("o".to_owned(), "bind".to_owned()),
            (
                "device".to_owned(),
                prepared.data.to_string_lossy().into_owned(),
            ),
        ])),
        labels: Some(volume_labels),
        ..Default::default()
    };
    docker.create_volume(request).await?;
    Ok(name)
}

/// Remove the engine's named volume `name`: `Ok(false)` when a container
/// uses it (the engine refuses), `Ok(true)` when it is gone (or was).
pub async fn remove_engine_volume(docker: &Docker, name: &str) -> Result<bool, DockerError> {
    match docker
        .remove_volume(name, None::<bollard::query_parameters::RemoveVolumeOptions>)
        .await
    {
        Ok(()) => Ok(true),
        Err(error) if crate::status_of(&error) == Some(404) => Ok(true),
        Err(error) if crate::status_of(&error) == Some(409) => Ok(false),
        Err(error) => Err(error),
    }
}

/// Who uses a volume, for the message that refuses its removal.
pub(crate) fn users_text(users: &[box_backend::UnitInfo]) -> String {
    if users.is_empty() {
        return "a running unit".to_owned();
    }
    users
        .iter()
        .map(|unit| format!("unit {} of session {}", unit.unit, unit.session))
        .collect::<Vec<_>>()
        .join(", ")
}

impl crate::DockerBackend {
    /// The units (containers, running or not) that mount `listed`'s named
    /// volume: the engine refuses to remove it while one exists.
    pub async fn volume_users(
        &self,
        listed: &ListedVolume,
    ) -> Result<Vec<box_backend::UnitInfo>, String> {
        let filters = HashMap::from([("volume".to_owned(), vec![listed_engine_name(listed)])]);
        let options = bollard::query_parameters::ListContainersOptionsBuilder::new()
            .all(true)
            .filters(&filters)
            .build();
        let containers = self
            .docker
            .list_containers(Some(options))
            .await
            .map_err(|error| crate::engine_message(&error))?;
        Ok(containers.into_iter().map(crate::unit_info).collect())
    }

    /// Remove `listed`: the engine's named volume (refused, naming who uses
    /// it, while a container mounts it), then box's directory for it.
    pub async fn remove_volume(&self, listed: &ListedVolume) -> Result<(), String> {
        let name = listed_engine_name(listed);
        let removed = remove_engine_volume(&self.docker, &name)
            .await
            .map_err(|error| {
                format!(
                    "removing the engine's volume {name}: {}",
                    crate::engine_message(&error)
                )
            })?;
        if !removed {
            let users = self.volume_users(listed).await.unwrap_or_default();
            return Err(format!(
                "volume {} ({}) is in use by {}; end its session first (`box units ls` shows it)",
                listed.record.name,
                listed.key,
                users_text(&users)
            ));
        }
        box_backend::volumes::remove(listed)
    }
}
