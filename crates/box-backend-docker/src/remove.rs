//! Taking a unit's container down and removing it, with its session's
//! network and volumes after its last unit.

use bollard::Docker;
use bollard::errors::Error as DockerError;
use bollard::query_parameters::{RemoveContainerOptionsBuilder, StopContainerOptionsBuilder};

use box_backend::BackendKind;

use crate::{body, volumes};
use crate::{engine_message, status_of};

/// How a container is taken down before it is removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Takedown {
    /// `docker stop` with a short grace ([`body::STOP_TIMEOUT_SECS`]): the
    /// init is told (SIGTERM) and passes it on to the executor.
    Stop,
    /// None: the forced removal kills it.
    Kill,
}

/// Take down (`takedown`) and remove; a missing container is success (CRI
/// rule), and so is a removal already in progress.
pub(crate) async fn remove_container(
    docker: &Docker,
    id: &str,
    takedown: Takedown,
) -> Result<(), DockerError> {
    // A bridge unit's session network, and its session's volumes, go with
    // the session's last unit.
    let (session_network, session_volumes) = match docker.inspect_container(id, None).await {
        Ok(inspect) => {
            let host = inspect.host_config.unwrap_or_default();
            let volumes: Vec<String> = host
                .mounts
                .iter()
                .flatten()
                .filter(|mount| mount.typ == Some(bollard::models::MountType::VOLUME))
                .filter_map(|mount| mount.source.clone())
                .filter(|name| name.starts_with("box-s-"))
                .collect();
            let network = host
                .network_mode
                .filter(|mode| mode.starts_with(body::SESSION_NETWORK_PREFIX));
            (network, volumes)
        }
        Err(_) => (None, Vec::new()),
    };
    remove_container_only(docker, id, takedown).await?;
    for name in session_volumes {
        remove_session_volume(docker, &name).await;
    }
    if let Some(network) = session_network {
        match docker.remove_network(&network).await {
            Ok(()) => {}
            // Another unit of the session still uses it (its removal removes it),
            // or it is already gone.
            Err(e) if matches!(status_of(&e), Some(403 | 404 | 409)) => {}
            Err(e) => tracing::debug!(network, error = %e, "removing a session network"),
        }
    }
    Ok(())
}

/// Remove a session volume the removed unit mounted, unless another unit of
/// the session still does (the engine refuses; that unit's removal comes
/// back here), then its directory.
pub(crate) async fn remove_session_volume(docker: &Docker, name: &str) {
    match volumes::remove_engine_volume(docker, name).await {
        Ok(true) => {
            let store = box_backend::volumes::VolumeStore::default();
            let listed = store.list().into_iter().find(|listed| {
                listed.record.backend == BackendKind::Docker.as_str()
                    && volumes::listed_engine_name(listed) == name
            });
            if let Some(listed) = listed
                && let Err(error) = box_backend::volumes::remove(&listed)
            {
                tracing::debug!(volume = name, %error, "removing a session volume's directory");
            }
        }
        Ok(false) => {}
        Err(error) => tracing::debug!(volume = name, %error, "removing a session volume"),
    }
}

pub(crate) async fn remove_container_only(
    docker: &Docker,
    id: &str,
    takedown: Takedown,
) -> Result<(), DockerError> {
    if takedown == Takedown::Stop {
        let stop = StopContainerOptionsBuilder::new()
            .t(i32::try_from(body::STOP_TIMEOUT_SECS).unwrap_or(2))
            .build();
        match docker.stop_container(id, Some(stop)).await {
            // 304: already stopped; 404: already gone; 409: being removed.
            Ok(()) => {}
            Err(e) if matches!(status_of(&e), Some(304 | 404 | 409)) => {}
            Err(e) => {
                tracing::debug!(id, error = %e, "stopping before removal; removing by force");
            }
        }
    }
    let remove = RemoveContainerOptionsBuilder::new()
        .force(true)
        .v(true)
        .build();
    match docker.remove_container(id, Some(remove)).await {
        Ok(()) => Ok(()),
        Err(e) if matches!(status_of(&e), Some(404)) => Ok(()),
        // The engine is removing it already (a unit is auto-removed once it
        // ends): confirmed once it is gone.
        Err(e) if status_of(&e) == Some(409) && engine_message(&e).contains("in progress") => {
            wait_until_gone(docker, id).await
        }
        Err(e) => Err(e),
    }
}

/// How long a removal in progress is given to finish.
pub(crate) const REMOVAL_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Wait until the engine no longer knows `id` (a removal in progress).
pub(crate) async fn wait_until_gone(docker: &Docker, id: &str) -> Result<(), DockerError> {
    let deadline = tokio::time::Instant::now() + REMOVAL_WAIT;
    loop {
        match docker.inspect_container(id, None).await {
            Err(e) if status_of(&e) == Some(404) => return Ok(()),
            Err(e) => return Err(e),
            Ok(_) if tokio::time::Instant::now() >= deadline => {
                return Err(DockerError::DockerResponseServerError {
                    status_code: 409,
                    message: format!(
                        "the engine was still removing the container after {}",
                        humantime::format_duration(REMOVAL_WAIT)
                    ),
                });
            }
            Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
        }
    }
}
