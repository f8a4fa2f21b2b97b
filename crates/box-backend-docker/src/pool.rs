//! Pooled docker units (`box_backend::pool`): a unit started for a pool
//! (`DockerBackend::start_unit_for` with `pooled`), and bound at the claim
//! to a session's plan: its limits through the engine's update, its
//! executor's flags, environment and secrets in one bind line on its stdin
//! (the executor applies landlock and seccomp after reading it, before it
//! serves anything), its envelope read back for the session's plan.

use std::path::PathBuf;

use futures::future::BoxFuture;

use box_backend::pool::{PooledUnit, Pooling, send_bind};
use box_backend::{BackendError, SessionLabel, StartedUnit, UnitWiring};
use box_policy::executor::Bind;
use box_policy::plan::UnitSpec;

use crate::{DockerBackend, body, delivered_secrets, engine_message, lease, unit_env};

/// What a bind needs again of a pooled unit's start.
pub(crate) struct PoolDetail {
    /// The image's environment (the unit's variables start from it).
    pub(crate) image_env: Vec<String>,
    /// The image's user, for the envelope.
    pub(crate) image_user: String,
    /// The image's registry digest, for the envelope.
    pub(crate) image_digest: Option<String>,
    /// The unit's home inside it.
    pub(crate) home: String,
    /// Where the unit's volumes are mounted.
    pub(crate) volume_targets: Vec<String>,
    /// The unit's run directory on the host (its envelope is kept beside it).
    pub(crate) run_dir: PathBuf,
    /// The session label its pool started it under (`pool-N`).
    pub(crate) pool_session: String,
    /// Its egress socket's directory, mounted at its start (an egress
    /// profile's pool): the session's proxy is served there at the claim.
    pub(crate) egress: Option<box_backend::EgressWiring>,
    /// A worktree fork's borrowed objects, mounted read-only at its start
    /// (a `source = "fork"` profile's pool): the fork its claim makes names them.
    pub(crate) objects: Option<box_backend::ObjectsWiring>,
    /// The limits it started with: memory, CPUs, pids.
    pub(crate) limits: (u64, f64, u64),
    /// The engine's view of it once started (its envelope's source while
    /// nothing about it changes).
    pub(crate) inspect: Option<bollard::models::ContainerInspectResponse>,
}

impl Pooling for DockerBackend {
    fn start_pooled<'a>(
        &'a self,
        label: &'a SessionLabel,
        spec: &'a UnitSpec,
        wiring: &'a UnitWiring,
    ) -> BoxFuture<'a, Result<PooledUnit, BackendError>> {
        Box::pin(async move {
            let (started, detail) = self.start_unit_for(label, spec, wiring, true).await?;
            Ok(PooledUnit::new(started, detail))
        })
    }

    fn bind<'a>(
        &'a self,
        unit: PooledUnit,
        _session: &'a SessionLabel,
        spec: &'a UnitSpec,
    ) -> BoxFuture<'a, Result<StartedUnit, BackendError>> {
        Box::pin(self.bind_unit(unit, spec))
    }
}

impl DockerBackend {
    async fn bind_unit(
        &self,
        unit: PooledUnit,
        spec: &UnitSpec,
    ) -> Result<StartedUnit, BackendError> {
        let name = spec.name.as_str();
        let failed = BackendError::other_for(name);
        let (mut started, detail) = unit.detail::<PoolDetail>(name, "docker")?;
        let id = started.envelope.id.clone();
        let wiring =
            box_backend::pool::bound_wiring(detail.egress.as_ref(), detail.objects.as_ref(), spec)?;
        // The session's environment and secrets, as a cold start would set them.
        let environment = unit_env(spec, std::env::vars_os(), &detail.image_env);
        let env_passed = environment.passed();
        let delivered = environment.delivered(spec);
        let spec = delivered.as_ref();
        // The engine gives a cold unit's first process HOSTNAME (the
        // container's, from the unit's name); its executor hands it on, and
        // so does a bound one.
        let mut env = environment.vars;
        env.retain(|(name, _)| name != "HOSTNAME");
        env.push(("HOSTNAME".to_owned(), body::truncate_hostname(&spec.name)));
        let bind = Bind {
            spec: body::unit_executor_spec(spec, &wiring, &detail.home, &detail.volume_targets),
            env,
            secrets: environment.secrets.into_iter().collect(),
            // The engine sets a docker unit's limits (its cgroup).
            rlimits: None,
        };
        // First, so the executor confines itself while the engine sets the
        // limits: nothing runs in the unit before the host has the unit back
        // from this bind and initializes its executor.
        send_bind(&mut started.io.stdin, name, &bind).await?;
        // The limits the engine can change on a running unit: the session's
        // (never wider than its profile's, which the pool started with);
        // the engine is asked only when they differ.
        let unchanged =
            detail.limits == (spec.limits.memory_bytes, spec.limits.cpus, spec.limits.pids);
        if !unchanged {
            let memory = body::clamp_i64(spec.limits.memory_bytes);
            let update = bollard::models::ContainerUpdateBody {
                memory: Some(memory),
                memory_swap: Some(memory),
                nano_cpus: Some(body::nano_cpus(spec.limits.cpus)),
                pids_limit: Some(body::clamp_i64(spec.limits.pids)),
                ..Default::default()
            };
            self.docker
                .update_container(&id, update)
                .await
                .map_err(|e| failed("setting the session's limits", engine_message(&e)))?;
        }
        let inspect = match (unchanged, &detail.inspect) {
            (true, Some(inspect)) => inspect.clone(),
            _ => self
                .docker
                .inspect_container(&id, None)
                .await
                .map_err(|e| failed("inspecting the container", engine_message(&e)))?,
        };
        let mut envelope = body::envelope_from_inspect(
            spec,
            &inspect,
            &detail.image_user,
            &self.facts,
            env_passed,
            environment.scrubbed,
        );
        envelope.image_digest = detail.image_digest.clone();
        if self.executor_command.is_none() {
            body::add_executor_confinement(&mut envelope, spec);
            envelope.secrets = delivered_secrets(spec);
        }
        if let (Some(home), Some(was)) = (envelope.home.as_mut(), started.envelope.home.as_ref()) {
            home.seeded_from = was.seeded_from.clone();
        }
        envelope.volumes = std::mem::take(&mut started.envelope.volumes);
        // Recorded so (`box units inspect`): the unit came from a pool.
        envelope.warm = Some(box_policy::envelope::Warm {
            warm: true,
            warm_why: None,
            pool_session: Some(detail.pool_session.clone()),
        });
        // Off the claim's path: replacing a file by a rename makes ext4
        // flush it first (auto_da_alloc), 100 ms and more on a busy disk.
        let (run_dir, recorded) = (detail.run_dir.clone(), envelope.clone());
        tokio::task::spawn_blocking(move || lease::RunDir::record(&run_dir, &recorded));
        started.envelope = envelope;
        Ok(started)
    }
}
