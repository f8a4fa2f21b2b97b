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

mod adopt;
pub mod body;
pub mod doctor;
mod home;
mod io;
mod lease;
mod oom;
mod pool;
pub mod pull;
mod remove;
pub mod runc;
mod start;
mod stats;
pub mod volumes;

use std::collections::HashMap;
use std::path::PathBuf;

use bollard::Docker;
use bollard::errors::Error as DockerError;
use bollard::models::ContainerSummary;
use bollard::query_parameters::ListContainersOptionsBuilder;
use futures::future::BoxFuture;

pub use body::{EngineFacts, container_body};
pub use pull::{PullEvent, PullSink, PullTally, Pulled, Puller, missing_image_remedy};

use box_backend::environment::{Own, STANDARD_PATH, UnitEnvironment, unit_environment};
use box_backend::{
    AdoptUnit, Backend, BackendError, BackendKind, ObjectsPlace, ObjectsWiring, SessionLabel,
    StartedUnit, Unenforceable, UnitDetail, UnitInfo, UnitWiring, labels,
};
use box_policy::executor::SECRETS_DIR;
use box_policy::plan::{NetworkMode, Requirement, UnitSpec};

use remove::{Takedown, remove_container};

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
