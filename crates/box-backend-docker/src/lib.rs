//! The docker backend: one hardened container per unit, through bollard.
//!
//! A unit is a container whose first process is box's own init (`box init`,
//! the host's own static `box` bind-mounted read-only at
//! [`body::EXECUTOR_PATH`]), which starts the unit's executor as its child,
//! relays its stdio to the host over a Unix socket in the unit's run
//! directory, and ends the unit when the host stops renewing its lease; the
//! engine then removes it (auto-remove). The host's renewal is the
//! [`box_backend::Renewal`] the start returns. Every hardening setting lives in the pure
//! [`body::container_body`]; the envelope is read back from `inspect`, never
//! copied from the request. A unit's image is pulled per its pull policy
//! (`pull.rs`: credentials from the Docker config file, a pinned digest
//! verified) and the container is created from the verified image's id; a
//! missing image not to be pulled is an error naming what puts it there.
//!
//! How a host uses it: claim an instance (`instance::InstanceLock::acquire(
//! &instance::default_dir(), &instance::new_id())`, held for the host's life),
//! `DockerBackend::connect()`, `box_host::sweep_orphans` once at
//! start, then the host's `start_units` per session and `Backend::remove` of each
//! unit when the session ends; `StartedUnit::ended` tells it why a unit died.
//!
//! What this module does not do: decide anything (the plan did), or know about
//! sessions beyond their labels (the host owns their lives; `sweep_orphans`
//! and `box gc` only act on labels and instance liveness).

/// The engine client's crate, for tests and benchmarks that inspect what the
/// engine holds: no other crate of the workspace depends on bollard.
pub use bollard;

pub mod body;
pub mod doctor;
mod home;
mod io;
mod lease;
mod oom;
mod pool;
pub mod pull;
pub mod runc;
mod stats;
pub mod volumes;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::SystemTime;

use bollard::Docker;
use bollard::errors::Error as DockerError;
use bollard::models::ContainerSummary;
use bollard::query_parameters::{
    AttachContainerOptions, CreateContainerOptionsBuilder, ListContainersOptionsBuilder,
    RemoveContainerOptionsBuilder, StopContainerOptionsBuilder,
};
use futures::StreamExt;
use futures::future::BoxFuture;
use tokio::io::AsyncWriteExt as _;

pub use body::{EngineFacts, container_body};
pub use pull::{PullEvent, PullSink, PullTally, Pulled, Puller, missing_image_remedy};

use box_backend::environment::{Own, STANDARD_PATH, UnitEnvironment, unit_environment};
use box_backend::lifecycle;
use box_backend::{
    AdoptUnit, Backend, BackendError, BackendKind, ObjectsPlace, ObjectsWiring, OomEvidence,
    SessionLabel, StartedUnit, Unenforceable, UnitDetail, UnitEnd, UnitInfo, UnitWiring, labels,
};
use box_policy::executor::{BIND_ON_STDIN_VAR, SECRETS_DIR, SECRETS_ON_STDIN_VAR};
use box_policy::plan::{NetworkMode, Requirement, UnitSpec};

/// The lowest pids limit a gVisor unit is started with (see `check`).
pub const GVISOR_MIN_PIDS: u64 = 128;

/// The docker engine could not be reached or understood.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// Nothing answers on the socket.
    #[error(
        "no Docker engine answers ({cause}); start it, set DOCKER_HOST, or use the local backend"
    )]
    NoEngine {
        /// What the client said.
        cause: String,
    },
}

/// The docker backend.
#[derive(Clone)]
pub struct DockerBackend {
    docker: Docker,
    executor: PathBuf,
    executor_command: Option<Vec<String>>,
    facts: EngineFacts,
    /// Held while a session network is looked up and made: engines before API
    /// 1.44 accept two networks of one name, and a session's units start at once.
    networks: std::sync::Arc<tokio::sync::Mutex<()>>,
    /// Where the progress of a pull before a unit starts goes (`box run`: the
    /// terminal); without one, the log's lines.
    pull_sink: Option<PullSink>,
}

impl std::fmt::Debug for DockerBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerBackend")
            .field("executor", &self.executor)
            .field("facts", &self.facts)
            .finish_non_exhaustive()
    }
}

impl DockerBackend {
    /// Connect to the local engine (DOCKER_HOST or the default socket),
    /// negotiate the API version and gather the engine's facts.
    pub async fn connect() -> Result<Self, ConnectError> {
        let no_engine = |e: DockerError| ConnectError::NoEngine {
            cause: e.to_string(),
        };
        let docker = Docker::connect_with_defaults()
            .map_err(no_engine)?
            .negotiate_version()
            .await
            .map_err(no_engine)?;
        let info = docker.info().await.map_err(no_engine)?;
        let version = docker.version().await.map_err(no_engine)?;
        let security = info.security_options.unwrap_or_default();
        let facts = EngineFacts {
            version: version.version.unwrap_or_default(),
            api_version: docker.client_version().to_string(),
            seccomp: security.iter().any(|o| o.contains("name=seccomp")),
            runtimes: info
                .runtimes
                .clone()
                .unwrap_or_default()
                .into_iter()
                .map(|(name, runtime)| (name, runtime.path.unwrap_or_default()))
                .collect(),
            userns_remap: security.iter().any(|o| o.contains("name=userns")),
            cgroup_version: match info.cgroup_version {
                Some(bollard::models::SystemInfoCgroupVersionEnum::_2) => "2",
                Some(bollard::models::SystemInfoCgroupVersionEnum::_1) => "1",
                Some(bollard::models::SystemInfoCgroupVersionEnum::EMPTY) | None => "",
            }
            .to_owned(),
            landlock_abi: crate::landlock_abi(),
        };
        // C35: the runtime's CVE floors; reported here and by `box doctor`,
        // not refused, since distribution builds carry backported fixes.
        if let Some(runc) = version
            .components
            .iter()
            .flatten()
            .find(|c| c.name.eq_ignore_ascii_case("runc"))
            && let crate::runc::RuncFloor::Below(why) = crate::runc::runc_floor(&runc.version)
        {
            if first_runc_warning(&runc.version) {
                tracing::warn!(
                    runc = runc.version,
                    "runc {why}; see `box doctor` (said once per boot)"
                );
            } else {
                tracing::debug!(runc = runc.version, "runc {why}; see `box doctor`");
            }
        }
        // The executor is this very binary: static, so it runs in any image.
        let executor = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/proc/self/exe"));
        Ok(Self {
            docker,
            executor,
            executor_command: None,
            facts,
            networks: Default::default(),
            pull_sink: None,
        })
    }

    /// Use `path` (a static `box`) as the executor mounted into units, instead
    /// of the running binary (tests and benches run from another binary).
    #[must_use]
    pub fn with_executor_binary(mut self, path: impl Into<PathBuf>) -> Self {
        self.executor = path.into();
        self
    }

    /// Run `argv` as the unit's executor process instead of `box execute`.
    /// For tests and benchmarks that need a long-lived stand-in process.
    #[must_use]
    pub fn with_executor_command(mut self, argv: Vec<String>) -> Self {
        self.executor_command = Some(argv);
        self
    }

    /// Report the progress of the pulls a unit's start makes to `sink`.
    #[must_use]
    pub fn with_pull_progress(mut self, sink: PullSink) -> Self {
        self.pull_sink = Some(sink);
        self
    }

    /// Whether the engine has `image` (`box doctor`).
    pub async fn has_image(&self, image: &str) -> bool {
        self.docker.inspect_image(image).await.is_ok()
    }

    /// The engine client, for this crate's tests and tools.
    pub fn client(&self) -> &Docker {
        &self.docker
    }

    /// What the engine and kernel offer.
    pub fn facts(&self) -> &EngineFacts {
        &self.facts
    }

    async fn start_unit(
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
    async fn start_unit_for(
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
        let env_passed = environment.passed();
        let env_scrubbed = environment.scrubbed;
        let env = environment.vars;
        // Only the secrets the host has are delivered (a missing one is said
        // above, like a missing passed variable); their values go to the
        // executor's exec alone, never into the container's configuration.
        let secrets = environment.secrets;
        let delivered;
        let spec = if secrets.len() == spec.env_secrets.len() {
            spec
        } else {
            let mut narrowed = spec.clone();
            narrowed
                .env_secrets
                .retain(|name| secrets.iter().any(|(have, _)| have == name));
            narrowed
                .env_secrets_as_env
                .retain(|name| narrowed.env_secrets.contains(name));
            delivered = narrowed;
            &delivered
        };
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
    async fn ensure_session_network(&self, session: &SessionLabel) -> Result<(), DockerError> {
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

    async fn attach(
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
        // The unit's stderr (its init's and its executor's log lines), from
        // before its first process runs.
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
            .await
            .map_err(|e| other("attaching to the unit's stderr", e))?;
        let (_stdout, mut output_done) = io::pump(attached.output, name.clone());
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
    fn started(&self, unit: Connected<'_>) -> StartedUnit {
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
struct Connected<'a> {
    spec: &'a UnitSpec,
    /// The container's id.
    id: &'a str,
    /// The unit in log lines: `session/unit`.
    log_name: String,
    inspect: &'a bollard::models::ContainerInspectResponse,
    image_user: &'a str,
    image_digest: Option<String>,
    /// What the envelope reports of the environment: the variables passed
    /// and those scrubbed.
    env: (Vec<String>, Vec<String>),
    /// The init's authenticated connection.
    channel: box_init::host::UnitChannel,
    /// The lease's epoch to renew at: above any earlier host's.
    epoch: u64,
    run_dir: lease::RunDir,
    listener: box_init::host::UnitListener,
    waiter: tokio::sync::oneshot::Receiver<Exited>,
}

impl DockerBackend {
    /// [`Backend::adopt`]: the container is checked against what was
    /// persisted (running, box's labels for this session and unit, the same
    /// image), its key read back from the engine (the container's
    /// configuration holds it in `KEY_ENV`; the state file never does), the
    /// same run-directory socket bound again, the init's connection accepted
    /// and the lease renewed above the dead host's epoch before anything else.
    async fn adopt_unit(
        &self,
        session: &SessionLabel,
        spec: &UnitSpec,
        unit: &AdoptUnit,
    ) -> Result<StartedUnit, BackendError> {
        let name = spec.name.as_str();
        let refused = |doing: &str, message: String| BackendError::Other {
            unit: name.to_owned(),
            doing: doing.to_owned(),
            message,
        };
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
        // Its stderr again (the init's and the executor's log lines).
        if let Ok(attached) = self
            .docker
            .attach_container(
                &unit.id,
                Some(AttachContainerOptions {
                    stream: true,
                    stdout: true,
                    stderr: true,
                    ..Default::default()
                }),
            )
            .await
        {
            let _ = io::pump(attached.output, log_name.clone());
        }
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

impl Backend for DockerBackend {
    fn pooling(&self) -> Option<&dyn box_backend::pool::Pooling> {
        Some(self)
    }

    fn kind(&self) -> BackendKind {
        BackendKind::Docker
    }

    /// Everything the host wires in is bind-mounted into the container (host
    /// files, the egress socket's directory, borrowed objects); a unit's init
    /// reconnects to a later host; volumes are the engine's.
    fn capabilities(&self) -> box_backend::Capabilities {
        box_backend::Capabilities::ALL
    }

    /// An image a start pulls is no problem yet; one it will not pull (box's
    /// own, or `pull = "never"`) must be on the engine.
    fn ready<'a>(&'a self, spec: &'a UnitSpec) -> BoxFuture<'a, Result<(), Vec<String>>> {
        Box::pin(async move {
            let pulled = spec.pull != box_policy::image::PullPolicy::Never
                && !pull::is_box_image(&spec.image);
            if pulled || self.has_image(&spec.image).await {
                return Ok(());
            }
            Err(vec![format!(
                "unit {}: image {} missing; {}",
                spec.name,
                spec.image,
                missing_image_remedy(&spec.image, spec.pull)
            )])
        })
    }

    /// A worktree fork's borrowed objects: bind-mounted read-only at one
    /// place in every container (`body::mount_objects`).
    fn objects_place(&self, _spec: &UnitSpec) -> Result<ObjectsPlace, String> {
        Ok(ObjectsPlace::At(ObjectsWiring::DIR_IN_UNIT.into()))
    }

    /// Landlock required where the host kernel has none. An egress allow list is
    /// enforced by the host's proxy, wired in at start (`start_wired`).
    fn check(&self, spec: &UnitSpec) -> Result<(), Vec<Unenforceable>> {
        let mut refusals = Vec::new();
        let mut refuse = |control: &str, why: &str| {
            refusals.push(Unenforceable {
                unit: spec.name.clone(),
                control: control.to_owned(),
                why: why.to_owned(),
            })
        };
        if let Some(runtime) = &spec.runtime {
            if !self.facts.runtimes.contains_key(runtime) {
                let listed: Vec<&str> = self.facts.runtimes.keys().map(String::as_str).collect();
                let listed = listed.join(", ");
                refuse(
                    "runtime",
                    &format!(
                        "runtime `{runtime}` is not registered with the engine (it lists {listed}); register it in /etc/docker/daemon.json and reload dockerd (gVisor: scripts/runsc.sh, docs/gvisor.md)"
                    ),
                );
            } else if self.facts.is_gvisor(runtime) {
                if spec.security.landlock == Requirement::Required {
                    refuse(
                        "landlock",
                        "gVisor (runtime runsc) has no landlock; a runsc unit needs [security] landlock = \"best-effort\" or \"off\" (gVisor's own kernel is the boundary then)",
                    );
                }
                // The host's pids cgroup counts gVisor's own threads and stub
                // processes (about 60 idle): a lower limit ends the sandbox when
                // gVisor needs one more (docs/gvisor.md).
                if spec.limits.pids < GVISOR_MIN_PIDS {
                    refuse(
                        "pids limit",
                        &format!(
                            "a gVisor (runsc) unit's pids limit also counts gVisor's own host threads (about 60 idle); {} would end the unit early, write at least {GVISOR_MIN_PIDS}",
                            spec.limits.pids
                        ),
                    );
                }
                if spec.network.mode == NetworkMode::Bridge {
                    refuse(
                        "network bridge",
                        "a gVisor (runsc) unit has no network of its own on this engine (runsc --network=none); use network none",
                    );
                }
                // Seen, not understood: a download through the bridge stalls for
                // good after 0.4-2 MB under this engine's runsc (the same relay
                // written with Python's asyncio in the same sandbox does not).
                // A unit that hangs its tools is worse than one refused.
                if spec.network.mode == NetworkMode::Egress {
                    refuse(
                        "network egress",
                        "a download through the egress proxy stalls under gVisor (runsc) on this engine, after 0.4-2 MB (docs/gvisor.md); use network none, or the engine's default runtime",
                    );
                }
            }
        }
        if spec.security.landlock == Requirement::Required
            && self.facts.landlock_abi == 0
            && !spec
                .runtime
                .as_ref()
                .is_some_and(|r| self.facts.is_gvisor(r))
        {
            refuse("landlock", "the host kernel offers no landlock ABI");
        }
        if refusals.is_empty() {
            Ok(())
        } else {
            Err(refusals)
        }
    }

    fn start<'a>(
        &'a self,
        session: &'a SessionLabel,
        spec: &'a UnitSpec,
    ) -> BoxFuture<'a, Result<StartedUnit, BackendError>> {
        Box::pin(async move { self.start_unit(session, spec, &UnitWiring::default()).await })
    }

    fn start_wired<'a>(
        &'a self,
        session: &'a SessionLabel,
        spec: &'a UnitSpec,
        wiring: &'a UnitWiring,
    ) -> BoxFuture<'a, Result<StartedUnit, BackendError>> {
        Box::pin(self.start_unit(session, spec, wiring))
    }

    fn adopt<'a>(
        &'a self,
        session: &'a SessionLabel,
        spec: &'a UnitSpec,
        unit: &'a AdoptUnit,
    ) -> BoxFuture<'a, Result<StartedUnit, BackendError>> {
        Box::pin(self.adopt_unit(session, spec, unit))
    }

    fn remove<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            remove_container(&self.docker, id, Takedown::Stop)
                .await
                .map_err(|e| BackendError::Other {
                    unit: id.to_owned(),
                    doing: "removing the container".to_owned(),
                    message: engine_message(&e),
                })
        })
    }

    /// Removed by force (`docker rm -f`): the engine kills the unit's init,
    /// PID 1 of its pid namespace, and every process of the unit goes with
    /// it; no `docker stop` grace first.
    fn remove_now<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            remove_container(&self.docker, id, Takedown::Kill)
                .await
                .map_err(|e| BackendError::Other {
                    unit: id.to_owned(),
                    doing: "removing the container by force".to_owned(),
                    message: engine_message(&e),
                })
        })
    }

    fn stats<'a>(
        &'a self,
        id: &'a str,
    ) -> BoxFuture<'a, Result<box_backend::stats::UnitStats, BackendError>> {
        Box::pin(self.unit_stats(id))
    }

    fn used<'a>(&'a self, id: &'a str, paths: &'a [PathBuf]) -> BoxFuture<'a, Vec<Option<u64>>> {
        Box::pin(futures::future::ready(stats::used(id, paths)))
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<UnitInfo>, BackendError>> {
        Box::pin(async move {
            list_filtered(&self.docker, labels::INSTANCE)
                .await
                .map_err(|e| BackendError::Other {
                    unit: "*".to_owned(),
                    doing: "listing units".to_owned(),
                    message: engine_message(&e),
                })
        })
    }

    /// The container as the engine shows it now, and the envelope recorded
    /// beside its run directory (the run directory's mount says which).
    fn inspect<'a>(
        &'a self,
        unit: &'a UnitInfo,
    ) -> BoxFuture<'a, Result<UnitDetail, BackendError>> {
        Box::pin(async move {
            let mut detail = UnitDetail::listed(unit.clone());
            let inspected = match self.docker.inspect_container(&unit.id, None).await {
                Ok(inspected) => inspected,
                // Gone since it was listed (auto-removed): the listing is all.
                Err(e) if status_of(&e) == Some(404) => return Ok(detail),
                Err(e) => {
                    return Err(BackendError::Other {
                        unit: unit.unit.clone(),
                        doing: "inspecting the container".to_owned(),
                        message: engine_message(&e),
                    });
                }
            };
            let mounts = inspected
                .host_config
                .and_then(|host| host.mounts)
                .unwrap_or_default();
            let source_of = |target: &str| {
                mounts
                    .iter()
                    .find(|mount| mount.target.as_deref() == Some(target))
                    .and_then(|mount| mount.source.as_deref())
                    .map(std::path::PathBuf::from)
            };
            detail.envelope = source_of(box_init::protocol::UNIT_RUN_DIR)
                .and_then(|dir| lease::recorded_envelope(&dir));
            let root = detail
                .envelope
                .as_ref()
                .and_then(|envelope| envelope["root"].as_str());
            detail.workspace = root.and_then(source_of);
            detail.pid = inspected
                .state
                .and_then(|state| state.pid)
                .and_then(|pid| u32::try_from(pid).ok())
                .filter(|pid| *pid > 0);
            Ok(detail)
        })
    }

    /// Filtered by the engine on the instance label.
    fn list_instance<'a>(
        &'a self,
        instance: &'a str,
    ) -> BoxFuture<'a, Result<Vec<UnitInfo>, BackendError>> {
        Box::pin(async move {
            let filter = format!("{}={instance}", labels::INSTANCE);
            list_filtered(&self.docker, &filter)
                .await
                .map_err(|e| BackendError::Other {
                    unit: "*".to_owned(),
                    doing: format!("listing the units of instance {instance}"),
                    message: engine_message(&e),
                })
        })
    }
}

async fn list_filtered(docker: &Docker, label_filter: &str) -> Result<Vec<UnitInfo>, DockerError> {
    let filters = HashMap::from([("label".to_owned(), vec![label_filter.to_owned()])]);
    let options = ListContainersOptionsBuilder::new()
        .all(true)
        .filters(&filters)
        .build();
    let containers = docker.list_containers(Some(options)).await?;
    let mut units: Vec<UnitInfo> = containers.into_iter().map(unit_info).collect();
    units.sort_by(|a, b| {
        (&a.instance, &a.session, &a.unit).cmp(&(&b.instance, &b.session, &b.unit))
    });
    Ok(units)
}

fn unit_info(container: ContainerSummary) -> UnitInfo {
    let labels = container.labels.unwrap_or_default();
    let label = |key: &str| labels.get(key).cloned().unwrap_or_default();
    UnitInfo {
        id: container.id.unwrap_or_default(),
        instance: label(labels::INSTANCE),
        session: label(labels::SESSION),
        unit: label(labels::UNIT),
        profile: label(labels::PROFILE),
        created: label(labels::CREATED),
        parent: labels.get(labels::PARENT).cloned(),
        state: container
            .state
            .map_or_else(|| "unknown".to_owned(), |s| s.to_string()),
        lease_ms: body::listed_lease_ms(
            labels.get(labels::LEASE_MS).map(String::as_str),
            container.command.as_deref(),
        ),
        // A unit an older box started has no such label: the engine's name
        // for the image it was created from (its id) is all there is.
        image: labels.get(labels::IMAGE).cloned().or(container.image),
        pool: labels.get(box_backend::pool::POOL_LABEL).cloned(),
    }
}

/// How a container is taken down before it is removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Takedown {
    /// `docker stop` with a short grace ([`body::STOP_TIMEOUT_SECS`]): the
    /// init is told (SIGTERM) and passes it on to the executor.
    Stop,
    /// None: the forced removal kills it.
    Kill,
}

/// Take down (`takedown`) and remove; a missing container is success (CRI
/// rule), and so is a removal already in progress.
async fn remove_container(
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
async fn remove_session_volume(docker: &Docker, name: &str) {
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

async fn remove_container_only(
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
const REMOVAL_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Wait until the engine no longer knows `id` (a removal in progress).
async fn wait_until_gone(docker: &Docker, id: &str) -> Result<(), DockerError> {
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

/// How long to wait before watching a unit again after the engine's wait
/// failed without the unit having ended.
const WAIT_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// How the container ended, as the engine said: its exit code, or gone.
#[derive(Debug, Clone, Copy)]
enum Exited {
    Code(Option<i64>),
    Gone,
}

/// Watch the container from its start (a task, so the engine's wait is
/// registered before anything can end it: an auto-removed container is
/// gone, with its exit code, soon after it ends).
fn waiter(docker: Docker, id: String) -> tokio::sync::oneshot::Receiver<Exited> {
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
fn ended(
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

/// The envelope's `secrets`: each one the executor was told to write.
pub fn delivered_secrets(spec: &UnitSpec) -> Vec<box_backend::DeliveredSecret> {
    spec.env_secrets
        .iter()
        .map(|name| box_backend::DeliveredSecret {
            name: name.clone(),
            path: format!("{SECRETS_DIR}/{name}"),
            as_env: spec.env_secrets_as_env.contains(name),
        })
        .collect()
}

/// The unit's environment (`backend::environment`, as on every backend):
/// box's own `PATH` is what the image's `ENV` says (the standard one where
/// it says nothing), `HOME` the unit's home ([`body::home_path`]: a tmpfs
/// holding what the image put there), `TMPDIR` the unit's `/tmp`.
pub fn unit_env<I>(spec: &UnitSpec, host: I, image_env: &[String]) -> UnitEnvironment
where
    I: IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
{
    let image = |name: &str| {
        image_env
            .iter()
            .find_map(|entry| entry.strip_prefix(name)?.strip_prefix('='))
            .map(str::to_owned)
    };
    let own = Own {
        home: body::home_path(image_env, &spec.root),
        path: image("PATH").unwrap_or_else(|| STANDARD_PATH.to_owned()),
        tmpdir: "/tmp".to_owned(),
    };
    unit_environment(spec, host, &own)
}

/// The ids of an image's user written as numbers (`1000:1000`; a bare uid
/// has the image's passwd's gid, which only the image knows: `None`).
fn numeric_user(user: &str) -> Option<box_policy::plan::UserIds> {
    let (uid, gid) = user.split_once(':')?;
    Some(box_policy::plan::UserIds {
        uid: uid.parse().ok()?,
        gid: gid.parse().ok()?,
    })
}

/// The HTTP status of an engine error, if it was one.
pub fn status_of(error: &DockerError) -> Option<u16> {
    match error {
        DockerError::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

fn engine_message(error: &DockerError) -> String {
    match error {
        DockerError::DockerResponseServerError { message, .. } => message.trim().to_owned(),
        other => other.to_string(),
    }
}

/// The landlock ABI the running kernel offers (0 = none).
pub fn landlock_abi() -> u32 {
    box_confine::landlock_abi()
}

/// Whether this is the first time since boot that runc `version` is warned
/// about: a marker beside the instance locks (under /run, so a reboot, or
/// an upgrade's new version, warns again). Every `box run` repeating it
/// buried the command's own output; `box doctor` always says it.
fn first_runc_warning(version: &str) -> bool {
    let name: String = version
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let marker = box_backend::instance::default_dir().with_file_name(format!("runc-warned-{name}"));
    if let Some(dir) = marker.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&marker)
    {
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => false,
        // Created, or not knowable: warn.
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use pretty_assertions::assert_eq;

    use super::*;

    #[test]
    fn unit_env_is_the_plan_not_the_host() {
        let mut spec = body::tests::spec();
        spec.env_set = [("LANG".to_owned(), "C.UTF-8".to_owned())].into();
        spec.env_pass = vec!["TOKEN".to_owned(), "ABSENT".to_owned()];
        spec.security.neutralise_git = false;
        let host = [
            (OsString::from("TOKEN"), OsString::from("t")),
            (OsString::from("SECRET"), OsString::from("s")),
            (OsString::from("PATH"), OsString::from("/host/bin")),
        ];
        let image = ["PATH=/image/bin".to_owned(), "LANG=en".to_owned()];
        let environment = unit_env(&spec, host, &image);
        let want: Vec<(String, String)> = [
            ("HOME", "/home/box"),
            ("LANG", "C.UTF-8"),
            ("PATH", "/image/bin"),
            ("TMPDIR", "/tmp"),
            ("TOKEN", "t"),
            ("XDG_CACHE_HOME", "/home/box/.cache"),
            ("XDG_CONFIG_HOME", "/home/box/.config"),
            ("XDG_DATA_HOME", "/home/box/.local/share"),
        ]
        .iter()
        .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
        .collect();
        assert_eq!(environment.vars, want);
        assert_eq!(environment.missing, vec!["ABSENT".to_owned()]);
        assert!(environment.scrubbed.is_empty());
    }
}
