//! Re-adopting a live unit a dead host started (`Backend::adopt`).

use box_backend::lifecycle;
use box_backend::{AdoptUnit, BackendError, SessionLabel, StartedUnit, labels};
use box_policy::plan::UnitSpec;

use crate::lease;
use crate::start::{Connected, waiter};
use crate::{DockerBackend, engine_message, status_of};

impl DockerBackend {
    /// [`Backend::adopt`]: the container is checked against what was
    /// persisted (running, box's labels for this session and unit, the same
    /// image), its key read back from the engine (the container's
    /// configuration holds it in `KEY_ENV`; the state file never does), the
    /// same run-directory socket bound again, the init's connection accepted
    /// and the lease renewed above the dead host's epoch before anything else.
    pub(crate) async fn adopt_unit(
        &self,
        session: &SessionLabel,
        spec: &UnitSpec,
        unit: &AdoptUnit,
    ) -> Result<StartedUnit, BackendError> {
        let name = spec.name.as_str();
        let refused = BackendError::other_for(name);
        let inspect = match self.docker.inspect_container(&unit.id, None).await {
            Ok(inspect) => inspect,
            Err(e) if status_of(&e) == Some(404) => {
                return Err(refused(
                    "re-adopting the unit",
                    format!(
                        "its container {} is gone (removed, or its lease lapsed)",
                        unit.id
                    ),
                ));
            }
            Err(e) => {
                return Err(refused(
                    "inspecting the unit's container",
                    engine_message(&e),
                ));
            }
        };
        if inspect.state.as_ref().and_then(|state| state.running) != Some(true) {
            return Err(refused(
                "re-adopting the unit",
                format!(
                    "its container {} is not running (its lease lapsed, or it was stopped)",
                    unit.id
                ),
            ));
        }
        let config = inspect.config.clone().unwrap_or_default();
        let labels = config.labels.clone().unwrap_or_default();
        // A warm unit (`box.pool`) keeps its pool's session label (an engine
        // cannot relabel a running container): the one the identity its host
        // persisted names.
        let session_label = if labels.contains_key(box_backend::pool::POOL_LABEL) {
            unit.identity.rsplit('/').nth(1).unwrap_or_default()
        } else {
            session.session.as_str()
        };
        for (label, want) in [(labels::SESSION, session_label), (labels::UNIT, name)] {
            let have = labels.get(label).map(String::as_str).unwrap_or("");
            if have != want {
                return Err(refused(
                    "re-adopting the unit",
                    format!(
                        "container {} has label {label}=`{have}`, not `{want}`: it is not the unit persisted",
                        unit.id
                    ),
                ));
            }
        }
        let image_id = inspect.image.clone().unwrap_or_default();
        if let Some(want) = &unit.image_id
            && &image_id != want
        {
            return Err(refused(
                "re-adopting the unit",
                format!(
                    "container {} runs image {image_id}, not {want} as persisted",
                    unit.id
                ),
            ));
        }
        let prefix = format!("{}=", box_init::protocol::KEY_ENV);
        let key = config
            .env
            .as_ref()
            .and_then(|env| env.iter().find_map(|entry| entry.strip_prefix(&prefix)))
            .ok_or_else(|| {
                refused(
                    "re-adopting the unit",
                    format!(
                        "container {} holds no {} in its configuration",
                        unit.id,
                        box_init::protocol::KEY_ENV
                    ),
                )
            })
            .and_then(|hex| {
                box_init::protocol::UnitKey::from_hex(hex)
                    .map_err(|e| refused("reading the unit's key", e.to_string()))
            })?;
        let run_dir = lease::RunDir::adopt(&unit.run_dir);
        let log_name = format!("{}/{}", session.session, name);
        // Its stderr again, when the engine lets it be attached.
        let _ = self.pump_output(&unit.id, log_name.clone()).await;
        let waiter = waiter(self.docker.clone(), unit.id.clone());
        let (listener, connected, epoch) = lifecycle::reconnect(
            run_dir.path(),
            (&key, &unit.identity),
            (unit.timeout, spec.lease),
            "init",
            std::future::pending(),
        )
        .await
        .map_err(|why| refused(&why.doing, why.message))?;
        let image_user = match self.docker.inspect_image(&image_id).await {
            Ok(image) => image.config.and_then(|c| c.user).unwrap_or_default(),
            Err(_) => String::new(),
        };
        Ok(self.started(Connected {
            spec,
            id: &unit.id,
            log_name,
            inspect: &inspect,
            image_user: &image_user,
            image_digest: unit.image_digest.clone(),
            env: (unit.env_passed.clone(), unit.env_scrubbed.clone()),
            channel: connected,
            epoch,
            run_dir,
            listener,
            waiter,
        }))
    }
}
