//! A unit's start: its image made ready, its container created with box's
//! init as the entrypoint, its stderr attached, its init's connection
//! accepted, the secrets handed over, the envelope read back; and the
//! engine's wait for its end.

use std::collections::HashMap;
use std::time::SystemTime;

use bollard::Docker;
use bollard::errors::Error as DockerError;
use bollard::query_parameters::{AttachContainerOptions, CreateContainerOptionsBuilder};
use futures::StreamExt;
use futures::future::BoxFuture;
use tokio::io::AsyncWriteExt as _;

use box_backend::lifecycle;
use box_backend::{
    Backend, BackendError, BackendKind, OomEvidence, SessionLabel, StartedUnit, UnitEnd,
    UnitWiring, labels,
};
use box_policy::executor::{BIND_ON_STDIN_VAR, SECRETS_ON_STDIN_VAR};
use box_policy::plan::{NetworkMode, UnitSpec};

use crate::container_body;
use crate::remove::{Takedown, remove_container};
use crate::{DockerBackend, delivered_secrets, engine_message, numeric_user, status_of, unit_env};
use crate::{body, home, io, lease, oom, pool, pull, volumes};

impl DockerBackend {
    pub(crate) async fn start_unit(
        &self,
        session: &SessionLabel,
        spec: &UnitSpec,
        wiring: &UnitWiring,
    ) -> Result<StartedUnit, BackendError> {
        self.start_unit_for(session, spec, wiring, false)
            .await
            .map(|(started, _)| started)
    }

    /// [`Self::start_unit`], or with `pooled` a unit for a pool: its
    /// executor waits for a bind line instead of serving, no secret is
    /// delivered, and it is labelled `box.pool`. Also returns what a later
    /// bind needs again.
    pub(crate) async fn start_unit_for(
        &self,
        session: &SessionLabel,
        spec: &UnitSpec,
        wiring: &UnitWiring,
        pooled: bool,
    ) -> Result<(StartedUnit, pool::PoolDetail), BackendError> {
        let unit = spec.name.as_str();
        let other = |doing: &str, e: DockerError| BackendError::Other {
            unit: unit.to_owned(),
            doing: doing.to_owned(),
            message: engine_message(&e),
        };
        // Refuse what this backend cannot enforce before anything is created.
        if let Err(refusals) = self.check(spec)
            && let Some(first) = refusals.into_iter().next()
        {
            return Err(first.into());
        }
        // An egress unit without its proxy would have no way out at all, and a proxy
        // wired into a unit that did not ask for one would be a way out.
        match (spec.network.mode, &wiring.egress) {
            (NetworkMode::Egress, None) => {
                return Err(BackendError::Unenforceable {
                    unit: unit.to_owned(),
                    control: "network egress allow list".to_owned(),
                    why: "no egress proxy was wired into the unit (a host starts one per egress unit)".to_owned(),
                });
            }
            (NetworkMode::None | NetworkMode::Bridge, Some(_)) => {
                return Err(BackendError::Other {
                    unit: unit.to_owned(),
                    doing: "wiring the egress proxy".to_owned(),
                    message: format!(
                        "the unit's network is {}, not egress",
                        spec.network.mode.as_str()
                    ),
                });
            }
            _ => {}
        }
        body::check_root(&spec.root).map_err(|why| BackendError::Other {
            unit: unit.to_owned(),
            doing: "checking the workspace root".to_owned(),
            message: why,
        })?;
        let sink = pull::start_sink(self.pull_sink.as_ref(), wiring.progress.as_ref());
        let pulling = std::time::SystemTime::now();
        let ready = self
            .puller()
            .ready_image(
                &spec.image,
                spec.pull,
                sink.as_ref(),
                spec.pull_secret.as_deref(),
            )
            .await;
        wiring.phase("pull", pulling, ready.is_ok());
        let ready = match ready {
            Ok(ready) => ready,
            Err(pull::NotReady::Missing { remedy }) => {
                return Err(BackendError::MissingImage {
                    unit: unit.to_owned(),
                    image: spec.image.clone(),
                    remedy,
                });
            }
            Err(pull::NotReady::Pull(error)) => {
                return Err(BackendError::Other {
                    unit: unit.to_owned(),
                    doing: "putting its image on the engine".to_owned(),
                    message: error.to_string(),
                });
            }
        };
        let image_digest = ready.digest;
        let image = ready.inspect;
        let image_env = image
            .config
            .as_ref()
            .and_then(|config| config.env.clone())
            .unwrap_or_default();
        let image_user = image.config.and_then(|c| c.user).unwrap_or_default();
        // The unit's home: a tmpfs of its own where the image's HOME is,
        // owned by the unit's user (where its ids are known).
        let home = body::UnitHome {
            path: body::home_path(&image_env, &spec.root),
            owner: spec.user.or_else(|| numeric_user(&image_user)),
            bytes: spec.limits.home_bytes,
        };
        // The unit's volumes: box's directory for each, the engine's named
        // volume over it, and where the unit mounts it.
        let store = box_backend::volumes::VolumeStore::default();
        let mut unit_volumes = Vec::new();
        for volume in &spec.volumes {
            let prepared = store
                .prepare(BackendKind::Docker, volume, session, home.owner)
                .map_err(|message| BackendError::Other {
                    unit: unit.to_owned(),
                    doing: format!("preparing volume {}", volume.name),
                    message,
                })?;
            let engine_name = volumes::ensure(&self.docker, &prepared, volume, session)
                .await
                .map_err(|e| other(&format!("creating volume {}", volume.name), e))?;
            unit_volumes.push(body::UnitVolume::place(volume, engine_name, &home.path));
        }
        let volume_targets: Vec<String> = unit_volumes
            .iter()
            .map(|volume| volume.target.clone())
            .collect();

        let environment = unit_env(spec, std::env::vars_os(), &image_env);
        if !environment.missing.is_empty() {
            let missing = &environment.missing;
            let missing = missing.join(", ");
            tracing::info!(unit, %missing, "variables to pass are not set on the host");
        }
        let delivered = environment.delivered(spec);
        let env_passed = environment.passed();
        let env_scrubbed = environment.scrubbed;
        let env = environment.vars;
        // Only the secrets the host has are delivered (a missing one is said
        // above, like a missing passed variable); their values go to the
        // executor's exec alone, never into the container's configuration.
        let secrets = environment.secrets;
        let spec = delivered.as_ref();
        let created = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
        // The unit's first process is box's init: it connects to a socket the
        // host listens on in a run directory of the unit's own, proves it
        // holds the unit's key, relays the executor's stdio, and ends the unit
        // when its lease is not renewed.
        let runtime_dir = wiring
            .runtime_dir
            .clone()
            .unwrap_or_else(box_backend::default_runtime_dir);
        let run_dir =
            lease::RunDir::create(&runtime_dir).map_err(|message| BackendError::Other {
                unit: unit.to_owned(),
                doing: "making the unit's run directory".to_owned(),
                message,
            })?;
        let listener = box_init::host::bind(run_dir.path()).map_err(|e| BackendError::Other {
            unit: unit.to_owned(),
            doing: "listening for the unit's init".to_owned(),
            message: e.to_string(),
        })?;
        let key = box_init::protocol::UnitKey::generate();
        let identity = format!("{}/{}/{}", session.instance, session.session, spec.name);
        let stand_in = self.executor_command.is_some();
        let executor = self
            .executor_command
            .clone()
            .unwrap_or_else(|| body::executor_argv(spec, wiring, &home.path, &volume_targets));
        // The secrets' values reach the executor over the channel (its first
        // stdin line), never the container's configuration.
        let secrets_on_stdin = !stand_in && !pooled && !secrets.is_empty();
        let init_config = box_init::InitConfig {
            socket: std::path::Path::new(box_init::protocol::UNIT_RUN_DIR)
                .join(box_init::protocol::SOCKET_NAME),
            unit: identity.clone(),
            lease: spec.lease,
            bridges: Vec::new(),
            home: Some(home.path.clone().into()),
            links: unit_volumes
                .iter()
                .filter_map(|volume| {
                    let relative = volume.link.clone()?;
                    Some((relative, volume.target.clone().into()))
                })
                .collect(),
            executor_env: if pooled {
                vec![(BIND_ON_STDIN_VAR.into(), "1".into())]
            } else if secrets_on_stdin {
                vec![(SECRETS_ON_STDIN_VAR.into(), "1".into())]
            } else {
                Vec::new()
            },
            executor: executor.into_iter().map(Into::into).collect(),
        };
        let init = body::UnitInit {
            run_dir: run_dir.path().to_owned(),
            args: init_config
                .to_args()
                .into_iter()
                .map(|arg| arg.to_string_lossy().into_owned())
                .collect(),
            key: key.to_hex(),
            home,
            volumes: unit_volumes,
        };
        let mut body = container_body(session, spec, &self.executor, &created, &env, &init);
        if pooled {
            body.labels.get_or_insert_with(Default::default).insert(
                box_backend::pool::POOL_LABEL.to_owned(),
                session.profile.clone(),
            );
        }
        // A fork says which unit it came from, for `box units ls`.
        if let Some(parent) = &wiring.parent {
            body.labels
                .get_or_insert_with(Default::default)
                .insert(labels::PARENT.to_owned(), parent.clone());
        }
        // The content verified above, by id: a tag moved meanwhile changes nothing.
        if let Some(id) = &image.id {
            body.image = Some(id.clone());
        }
        if let Some(egress) = &wiring.egress {
            body::mount_egress_socket(&mut body, &egress.socket_dir);
        }
        if !wiring.masks.is_empty() {
            body::mount_masks(&mut body, &spec.root, &wiring.masks).map_err(|message| {
                BackendError::Other {
                    unit: spec.name.clone(),
                    doing: "masking persisted credentials".to_owned(),
                    message,
                }
            })?;
        }
        if let Some(objects) = &wiring.objects {
            body::mount_objects(&mut body, &objects.host);
        }
        // What the profile's operator explicitly allowed (the plan carries these
        // only when the operator switch was on).
        if let Some(host_config) = body.host_config.as_mut() {
            body::operator_allowances(
                host_config,
                spec.security.privileged,
                &spec.security.host_namespaces,
                &spec.security.devices,
            )
            .map_err(|message| BackendError::Other {
                unit: spec.name.clone(),
                doing: "applying the operator's allowances".to_owned(),
                message,
            })?;
        }
        if spec.network.mode == NetworkMode::Bridge {
            self.ensure_session_network(session)
                .await
                .map_err(|e| other("creating the session's bridge network", e))?;
        }
        let name = body::container_name(session, spec);
        let options = CreateContainerOptionsBuilder::new().name(&name).build();
        let creating = std::time::SystemTime::now();
        let created = self.docker.create_container(Some(options), body).await;
        wiring.phase("create", creating, created.is_ok());
        let id = created.map_err(|e| other("creating the container", e))?.id;

        // From here on, a failure removes what was created.
        let seeded = home::seed(
            &self.docker,
            &id,
            (image.id.as_deref().unwrap_or(&spec.image), &init.home.path),
            &runtime_dir,
            run_dir.path(),
            init.home.bytes,
        )
        .await;
        let seeded = match seeded {
            Ok(seeded) => seeded,
            Err(message) => {
                if let Err(cleanup) = remove_container(&self.docker, &id, Takedown::Stop).await {
                    tracing::warn!(unit, id, error = %cleanup, "removing a unit whose start failed");
                }
                return Err(BackendError::Other {
                    unit: unit.to_owned(),
                    doing: "filling the unit's home with the image's".to_owned(),
                    message,
                });
            }
        };
        let detail = pool::PoolDetail {
            image_env: image_env.clone(),
            image_user: image_user.clone(),
            image_digest: image_digest.clone(),
            home: init.home.path.clone(),
            volume_targets: volume_targets.clone(),
            run_dir: run_dir.path().to_owned(),
            egress: wiring.egress.clone(),
            objects: wiring.objects.clone(),
            limits: (spec.limits.memory_bytes, spec.limits.cpus, spec.limits.pids),
            inspect: None,
            pool_session: session.session.clone(),
        };
        let channel = lease::Pending {
            run_dir,
            listener,
            key,
            identity,
            secrets: secrets_on_stdin.then_some(secrets),
        };
        let booting = std::time::SystemTime::now();
        let attached = self
            .attach(
                session,
                spec,
                &id,
                (&image_user, image_digest),
                (env_passed, env_scrubbed),
                channel,
            )
            .await;
        // The container started and its init connected, proved and was
        // handed the unit's secrets.
        wiring.phase("boot", booting, attached.is_ok());
        match attached {
            Ok(mut started) => {
                if let Some(home) = started.envelope.home.as_mut() {
                    home.seeded_from = (seeded == home::Seeded::Image).then(|| "image".to_owned());
                }
                if !init.volumes.is_empty() {
                    // What the engine mounted, read back.
                    let inspect = self
                        .docker
                        .inspect_container(&id, None)
                        .await
                        .unwrap_or_default();
                    started.envelope.volumes =
                        body::applied_volumes(&init.volumes, &inspect, &session.profile);
                }
                let mut detail = detail;
                if pooled {
                    // Read now, so a claim that changes no limit need not ask the engine.
                    detail.inspect = self.docker.inspect_container(&id, None).await.ok();
                }
                Ok((started, detail))
            }
            Err(error) => {
                if let Err(cleanup) = remove_container(&self.docker, &id, Takedown::Stop).await {
                    tracing::warn!(unit, id, error = %cleanup, "removing a unit whose start failed");
                }
                Err(error)
            }
        }
    }

    /// Create `session`'s bridge network unless it exists (its units start
    /// concurrently, so another may have just made it).
    pub(crate) async fn ensure_session_network(
        &self,
        session: &SessionLabel,
    ) -> Result<(), DockerError> {
        let name = body::session_network(session);
        let _one_at_a_time = self.networks.lock().await;
        match self.docker.inspect_network(&name, None).await {
            Ok(_) => return Ok(()),
            Err(e) if status_of(&e) == Some(404) => {}
            Err(e) => return Err(e),
        }
        let request = bollard::models::NetworkCreateRequest {
            name: name.clone(),
            driver: Some("bridge".to_owned()),
            labels: Some(HashMap::from([
                (labels::INSTANCE.to_owned(), session.instance.clone()),
                (labels::SESSION.to_owned(), session.session.clone()),
            ])),
            ..Default::default()
        };
        match self.docker.create_network(request).await {
            Ok(_) => Ok(()),
            Err(e) if status_of(&e) == Some(409) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Container `id` attached and its output pumped ([`io::pump`]): its
    /// stderr (box-init's and the executor's log lines) logged as the unit
    /// `log_name` (`SESSION/UNIT`) from now on.
    pub(crate) async fn pump_output(
        &self,
        id: &str,
        log_name: String,
    ) -> Result<(tokio::io::DuplexStream, tokio::sync::oneshot::Receiver<()>), DockerError> {
        let attached = self
            .docker
            .attach_container(
                id,
                Some(AttachContainerOptions {
                    stream: true,
                    stdout: true,
                    stderr: true,
                    ..Default::default()
                }),
            )
            .await?;
        Ok(io::pump(attached.output, log_name))
    }

    pub(crate) async fn attach(
        &self,
        session: &SessionLabel,
        spec: &UnitSpec,
        id: &str,
        (image_user, image_digest): (&str, Option<String>),
        // What the envelope reports of the environment.
        (env_passed, env_scrubbed): (Vec<String>, Vec<String>),
        channel: lease::Pending,
    ) -> Result<StartedUnit, BackendError> {
        let unit = spec.name.as_str();
        let other = |doing: &str, e: DockerError| BackendError::Other {
            unit: unit.to_owned(),
            doing: doing.to_owned(),
            message: engine_message(&e),
        };
        let name = format!("{}/{}", session.session, unit);
        // The unit's stderr, from before its first process runs.
        let (_stdout, mut output_done) = self
            .pump_output(id, name.clone())
            .await
            .map_err(|e| other("attaching to the unit's stderr", e))?;
        self.docker
            .start_container(id, None)
            .await
            .map_err(|e| other("starting the container", e))?;
        let waiter = waiter(self.docker.clone(), id.to_owned());

        let output_ended = async {
            let _ = (&mut output_done).await;
        };
        let accepted = lifecycle::accept(
            &channel.listener,
            (&channel.key, &channel.identity),
            spec.limits.start_timeout,
            output_ended,
        )
        .await;
        let mut connected = accepted.map_err(|unconnected| match unconnected {
            lifecycle::Unconnected::Ended => BackendError::Other {
                unit: unit.to_owned(),
                doing: "starting the unit's init".to_owned(),
                message: "the unit ended before its init connected to the host (its log lines above say why)".to_owned(),
            },
            lifecycle::Unconnected::Failed(message) => BackendError::Other {
                unit: unit.to_owned(),
                doing: "connecting to the unit's init".to_owned(),
                message,
            },
        })?;
        if let Some(secrets) = &channel.secrets {
            let values: std::collections::BTreeMap<&str, &str> = secrets
                .iter()
                .map(|(name, value)| (name.as_str(), value.as_str()))
                .collect();
            let mut line = serde_json::to_vec(&values).unwrap_or_default();
            line.push(b'\n');
            connected
                .writer
                .write_all(&line)
                .await
                .map_err(|e| BackendError::Other {
                    unit: unit.to_owned(),
                    doing: "handing the unit's secrets to its executor".to_owned(),
                    message: e.to_string(),
                })?;
        }

        let inspect = self
            .docker
            .inspect_container(id, None)
            .await
            .map_err(|e| other("inspecting the container", e))?;
        Ok(self.started(Connected {
            spec,
            id,
            log_name: name,
            inspect: &inspect,
            image_user,
            image_digest,
            env: (env_passed, env_scrubbed),
            channel: connected,
            epoch: lifecycle::START_EPOCH,
            run_dir: channel.run_dir,
            listener: channel.listener,
            waiter,
        }))
    }

    /// A unit whose init has connected, started or re-adopted, made a
    /// [`StartedUnit`] the one way: its envelope read back from `inspect` and
    /// completed with the executor's confinement and secrets (a stand-in
    /// command gets only what the engine applied), its lease renewed from
    /// `epoch` on, and the future of its end.
    pub(crate) fn started(&self, unit: Connected<'_>) -> StartedUnit {
        let Connected {
            spec,
            id,
            log_name,
            inspect,
            image_user,
            image_digest,
            env: (env_passed, env_scrubbed),
            channel,
            epoch,
            run_dir,
            listener,
            waiter,
        } = unit;
        let mut envelope = body::envelope_from_inspect(
            spec,
            inspect,
            image_user,
            &self.facts,
            env_passed,
            env_scrubbed,
        );
        envelope.image_digest = image_digest;
        if self.executor_command.is_none() {
            body::add_executor_confinement(&mut envelope, spec);
            envelope.secrets = delivered_secrets(spec);
        }
        run_dir.record_envelope(&envelope);
        // The run directory and the listener live as long as the renewals.
        let relay = lifecycle::relay(
            channel,
            (spec.lease, epoch),
            run_dir.path().to_owned(),
            (run_dir, listener),
            log_name,
        );
        // Watched from here on: the engine removes the unit's cgroup with it.
        let init_pid = inspect.state.as_ref().and_then(|state| state.pid);
        let ended = ended(
            spec.name.clone(),
            spec.limits.memory_bytes,
            spec.lease,
            relay.ended,
            waiter,
            oom::OomWatch::start(id, init_pid),
        );
        StartedUnit {
            envelope,
            io: relay.io,
            ended,
            renewal: Some(relay.renewal),
        }
    }
}

/// What [`DockerBackend::started`] finishes a unit from: a start and a
/// re-adoption differ only in these (the lease's epoch, where the run
/// directory and listener came from, the container's id and names).
pub(crate) struct Connected<'a> {
    pub(crate) spec: &'a UnitSpec,
    /// The container's id.
    pub(crate) id: &'a str,
    /// The unit in log lines: `session/unit`.
    pub(crate) log_name: String,
    pub(crate) inspect: &'a bollard::models::ContainerInspectResponse,
    pub(crate) image_user: &'a str,
    pub(crate) image_digest: Option<String>,
    /// What the envelope reports of the environment: the variables passed
    /// and those scrubbed.
    pub(crate) env: (Vec<String>, Vec<String>),
    /// The init's authenticated connection.
    pub(crate) channel: box_init::host::UnitChannel,
    /// The lease's epoch to renew at: above any earlier host's.
    pub(crate) epoch: u64,
    pub(crate) run_dir: lease::RunDir,
    pub(crate) listener: box_init::host::UnitListener,
    pub(crate) waiter: tokio::sync::oneshot::Receiver<Exited>,
}

/// How long to wait before watching a unit again after the engine's wait
/// failed without the unit having ended.
pub(crate) const WAIT_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// How the container ended, as the engine said: its exit code, or gone.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Exited {
    Code(Option<i64>),
    Gone,
}

/// Watch the container from its start (a task, so the engine's wait is
/// registered before anything can end it: an auto-removed container is
/// gone, with its exit code, soon after it ends).
pub(crate) fn waiter(docker: Docker, id: String) -> tokio::sync::oneshot::Receiver<Exited> {
    let (mut tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let exited = loop {
            let mut wait = docker.wait_container(&id, None);
            let result = tokio::select! {
                result = wait.next() => result,
                () = tx.closed() => return,
            };
            match result {
                Some(Err(e)) if status_of(&e) == Some(404) => break Exited::Gone,
                Some(Ok(response)) => break Exited::Code(Some(response.status_code)),
                // bollard makes a non-zero exit an error.
                Some(Err(DockerError::DockerContainerWaitError { code, .. })) => {
                    break Exited::Code(Some(code));
                }
                // The wait itself failed (a timeout, a dropped connection, an
                // engine restart): only the container's state says whether it ended.
                None | Some(Err(_)) => match docker.inspect_container(&id, None).await {
                    Ok(inspect) if inspect.state.as_ref().and_then(|s| s.running) != Some(true) => {
                        break Exited::Code(inspect.state.and_then(|state| state.exit_code));
                    }
                    Err(e) if status_of(&e) == Some(404) => break Exited::Gone,
                    Ok(_) | Err(_) => tokio::time::sleep(WAIT_RETRY).await,
                },
            }
        };
        let _ = tx.send(exited);
    });
    rx
}

/// The future that resolves when the unit ends, with the cause: the init's
/// report when it made one (the executor exited, the unit was stopped, the
/// lease lapsed), else the container's end as the engine saw it (killed),
/// and whether the OOM killer did it as the unit's memory cgroup, watched
/// while it lived, tells.
pub(crate) fn ended(
    unit: String,
    memory_bytes: u64,
    lease: std::time::Duration,
    channel: box_init::host::Ended,
    waiter: tokio::sync::oneshot::Receiver<Exited>,
    oom: oom::OomWatch,
) -> BoxFuture<'static, UnitEnd> {
    use box_init::protocol::EndReason;
    Box::pin(async move {
        let end = channel.wait().await;
        // Read at once: the unit's cgroup goes with its init.
        let known = std::time::Instant::now();
        oom.refresh();
        let (ending, code) = match end {
            box_init::host::UnitEnd::Reported(report) => match report.reason {
                EndReason::ExecutorExited => (
                    body::Ending::Executor,
                    report.executor.map(|exit| i64::from(exit.as_exit_code())),
                ),
                EndReason::Terminated => {
                    (body::Ending::Terminated, Some(i64::from(report.exit_code)))
                }
                EndReason::LeaseLapsed => (
                    body::Ending::LeaseLapsed {
                        lease_ms: u64::try_from(lease.as_millis()).unwrap_or(u64::MAX),
                    },
                    Some(i64::from(report.exit_code)),
                ),
            },
            box_init::host::UnitEnd::Released | box_init::host::UnitEnd::Disconnected => {
                match waiter.await.unwrap_or(Exited::Gone) {
                    Exited::Code(code) => (body::Ending::Container, code),
                    Exited::Gone => (body::Ending::Gone, None),
                }
            }
        };
        // A clean exit, a stop and a lapse are explained without the OOM
        // killer; anything else is what the cgroup says.
        let evidence = match (ending, code) {
            (_, Some(0)) | (body::Ending::Terminated | body::Ending::LeaseLapsed { .. }, _) => {
                OomEvidence::NotKilled
            }
            _ => oom.evidence(known),
        };
        let parts = body::unit_end(&unit, ending, code, evidence, memory_bytes);
        UnitEnd {
            exit_code: parts.exit_code,
            oom_killed: parts.oom_killed,
            reason: parts.reason,
        }
    })
}
