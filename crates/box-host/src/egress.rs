//! The egress proxies of a session's units: one `box_egress` proxy per unit
//! whose network is `egress`, on a Unix socket in a directory of its own under
//! the host's runtime directory. The backend mounts that directory into the unit
//! (`UnitWiring`), where box's executor bridges it to a loopback port. Every
//! attempt becomes an audit line and a metric; `box/network.set` narrows or
//! restores a running unit's list through its [`PolicyHandle`].

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use box_backend::{EgressWiring, UnitWiring};
use box_egress::{
    AllowList, Event, HostName, Limits, Options, Policy, PolicyHandle, PrivateDestinations,
    UnitIdentity,
};
use box_policy::plan::{NetworkMode, UnitSpec};
use serde_json::{Value, json};

use crate::audit::Audit;
use crate::metrics::Metrics;

/// What an egress proxy runs on and reports to: the host's services'
/// proxies' runtime, metrics and audit log (`Services::proxies`).
#[derive(Clone, Copy)]
pub struct ProxyServices<'a> {
    /// The runtime the proxies run on.
    pub runtime: &'a ProxyRuntime,
    /// Counters for `/metrics`.
    pub metrics: &'a Arc<Metrics>,
    /// The audit log, when asked for.
    pub audit: Option<&'a Arc<Audit>>,
}

/// The proxy of one running unit. Dropping it stops the proxy (ending every
/// connection it carries) and removes its socket directory, unless the session
/// was handed to another host ([`EgressProxy::keep_dir`]).
#[derive(Debug)]
pub struct EgressProxy {
    /// The unit's name in its session.
    pub unit: String,
    /// What the unit's connections through it carried.
    usage: Arc<EgressUsage>,
    dir: PathBuf,
    task: tokio::task::JoinHandle<()>,
    policy: PolicyHandle,
    /// Handed off ([`EgressProxy::keep_dir`]): the directory stays.
    keep: std::sync::atomic::AtomicBool,
}

/// What a unit's egress carried, counted as each connection ends (a
/// connection still open is not in the bytes yet).
#[derive(Debug, Default)]
pub struct EgressUsage {
    /// Bytes the unit sent upstream.
    pub bytes_up: AtomicU64,
    /// Bytes it received.
    pub bytes_down: AtomicU64,
    /// Connections allowed.
    pub connections: AtomicU64,
    /// Connections refused because the unit had its `max_connections` open.
    pub at_connection_limit: AtomicU64,
    /// Nanoseconds its traffic waited for its bandwidth cap, added up as it
    /// happens (the proxy adds to it; not only when a connection ends).
    pub throttled: Arc<AtomicU64>,
}

impl EgressUsage {
    fn count(&self, event: &Event) {
        self.bytes_up.fetch_add(event.bytes_up, Ordering::Relaxed);
        self.bytes_down
            .fetch_add(event.bytes_down, Ordering::Relaxed);
        match &event.decision {
            box_egress::Decision::Allowed { .. } => {
                self.connections.fetch_add(1, Ordering::Relaxed);
            }
            box_egress::Decision::Refused(box_egress::Refusal::TooManyConnections { .. }) => {
                self.at_connection_limit.fetch_add(1, Ordering::Relaxed);
            }
            box_egress::Decision::Refused(_) | box_egress::Decision::Failed { .. } => {}
        }
    }
}

impl Drop for EgressProxy {
    fn drop(&mut self) {
        self.task.abort();
        if self.keep.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        if let Err(error) = std::fs::remove_dir_all(&self.dir)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %self.dir.display(), %error, "removing an egress socket directory");
        }
    }
}

/// The runtime a host's egress proxies run on, started with the first one:
/// threads of their own, so a unit's bulk download never waits behind its
/// session's calls (a stdio host runs its session on one thread) and a busy
/// session never slows the download (BENCHMARKS.md, Egress, through a
/// unit). Owned by the host's [`crate::Services`]; dropped with them, its
/// threads are told to stop without being waited for (a runtime may not be
/// dropped, waiting, from async code).
#[derive(Default)]
pub struct ProxyRuntime(std::sync::OnceLock<Result<tokio::runtime::Runtime, String>>);

impl ProxyRuntime {
    /// A handle to the runtime, started now if it was not.
    fn handle(&self) -> Result<tokio::runtime::Handle, String> {
        self.0
            .get_or_init(|| {
                tokio::runtime::Builder::new_multi_thread()
                    .thread_name("box-egress")
                    .enable_all()
                    .build()
                    .map_err(|error| format!("starting the egress proxies' runtime: {error}"))
            })
            .as_ref()
            .map(|runtime| runtime.handle().clone())
            .map_err(Clone::clone)
    }
}

impl Drop for ProxyRuntime {
    fn drop(&mut self) {
        if let Some(Ok(runtime)) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// An egress socket directory of the host's own (under its runtime
/// directory, mode 0755: the unit's user, any uid, must reach the socket
/// through the mount; it is mounted into one unit only and holds nothing
/// else), removed when dropped unless a proxy took it
/// ([`EgressProxy::serve_prepared`]).
#[derive(Debug)]
pub struct EgressDir(Option<PathBuf>);

impl EgressDir {
    /// A new, empty directory under `runtime_dir`'s `egress`.
    pub fn make(runtime_dir: &Path) -> Result<Self, String> {
        Self::make_named(runtime_dir, format!("{:032x}", rand::random::<u128>()))
    }

    /// [`Self::make`] for a pooled unit of host `instance`: its name says
    /// the instance (`pool.<instance>.<random>`), so that `box gc` finds
    /// the empty ones a killed host's ready units leave
    /// ([`remove_dead_pools_dirs`]). An instance id that is not one path
    /// component of box's characters, or one so long that the socket's path
    /// would not fit a socket address, gets a plain [`Self::make`] name.
    pub fn make_pooled(runtime_dir: &Path, instance: &str) -> Result<Self, String> {
        let name = format!("{POOLED}{instance}.{:016x}", rand::random::<u64>());
        let socket = runtime_dir
            .join("egress")
            .join(&name)
            .join(EgressWiring::SOCKET);
        let fits = socket.as_os_str().len() < SOCKET_PATH_MOST
            && !instance.starts_with('.')
            && instance
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if fits && !instance.is_empty() {
            Self::make_named(runtime_dir, name)
        } else {
            Self::make(runtime_dir)
        }
    }

    fn make_named(runtime_dir: &Path, name: String) -> Result<Self, String> {
        let parent = runtime_dir.join("egress");
        create_private_dir(&parent)?;
        let dir = parent.join(name);
        std::fs::create_dir(&dir)
            .map_err(|error| format!("creating {}: {error}", dir.display()))?;
        let made = Self(Some(dir));
        std::fs::set_permissions(made.path(), std::fs::Permissions::from_mode(0o755)).map_err(
            |error| {
                format!(
                    "starting the egress proxy: {}: {error}",
                    made.path().display()
                )
            },
        )?;
        Ok(made)
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        self.0.as_deref().unwrap_or(Path::new(""))
    }

    /// What the backend mounts into a unit.
    pub fn wiring(&self) -> EgressWiring {
        EgressWiring {
            socket_dir: self.path().to_owned(),
        }
    }

    /// Left in place: its proxy removes it.
    fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for EgressDir {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take()
            && let Err(error) = std::fs::remove_dir_all(&dir)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %dir.display(), %error, "removing an egress socket directory");
        }
    }
}

/// How a pooled unit's egress directory's name begins.
const POOLED: &str = "pool.";

/// A socket's path is at most this long (`sun_path`, with its NUL).
const SOCKET_PATH_MOST: usize = 108;

/// The instance whose pool made the egress directory named `name`, if a
/// pool made it ([`EgressDir::make_pooled`]).
pub fn pooled_instance(name: &str) -> Option<String> {
    let (instance, random) = name.strip_prefix(POOLED)?.rsplit_once('.')?;
    (random.len() == 16 && random.bytes().all(|b| b.is_ascii_hexdigit()) && !instance.is_empty())
        .then(|| instance.to_owned())
}

/// Remove the egress directories under `runtime_dir` that a pool of an
/// instance `gone` names made and that are empty: what a killed host's
/// ready pooled units leave once it is dead (a claimed unit's holds its
/// proxy's socket, for the next host's reattach, and is kept). The
/// directories removed.
pub fn remove_dead_pools_dirs(runtime_dir: &Path, gone: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(runtime_dir.join("egress")) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(instance) = name.to_str().and_then(pooled_instance) else {
            continue;
        };
        // Only an empty directory is removed (`remove_dir` refuses others).
        if gone(&instance) && std::fs::remove_dir(entry.path()).is_ok() {
            removed.push(entry.path());
        }
    }
    removed.sort();
    removed
}

/// Where the host keeps its sockets (`box_backend::default_runtime_dir`).
pub fn default_runtime_dir() -> PathBuf {
    box_backend::default_runtime_dir()
}

impl EgressProxy {
    /// Start the proxy of `spec` (a unit whose network is egress) for `session`,
    /// in a new directory under `runtime_dir`: its socket bound and served
    /// before the unit starts, so the unit's first connection finds it.
    pub fn start(
        runtime_dir: &Path,
        services: ProxyServices<'_>,
        session: &str,
        spec: &UnitSpec,
    ) -> Result<Self, String> {
        Self::serve_prepared(services, session, spec, EgressDir::make(runtime_dir)?)
    }

    /// Serve the proxy of `spec` for `session` in `dir`, made empty for it
    /// (a pooled unit's, mounted when the unit started; the claim serves the
    /// session's proxy there). The proxy owns the directory from now on; if
    /// it cannot be served, the directory is removed.
    pub fn serve_prepared(
        services: ProxyServices<'_>,
        session: &str,
        spec: &UnitSpec,
        dir: EgressDir,
    ) -> Result<Self, String> {
        let proxy = Self::serve_in(services, session, spec, dir.path().to_owned())?;
        dir.keep();
        Ok(proxy)
    }

    /// Serve the proxy of `spec` again in `dir`, the socket directory a dead
    /// (or handed-off) host started it in and the unit still has mounted: a
    /// fresh socket at the same path, so the unit's bridge, which connects
    /// per connection, reaches this host from now on. The directory must be
    /// the host's own (a directory, not a link, owned by this user, mode
    /// 0755 as [`EgressProxy::start`] made it); it is never created here, as
    /// a fresh one would not be the one the unit sees.
    pub fn adopt(
        services: ProxyServices<'_>,
        session: &str,
        spec: &UnitSpec,
        dir: &Path,
    ) -> Result<Self, String> {
        use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
        let refuse = |why: String| {
            Err(format!(
                "unit {}: its egress socket directory {} {why}",
                spec.name,
                dir.display()
            ))
        };
        let meta = match std::fs::symlink_metadata(dir) {
            Ok(meta) => meta,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return refuse(
                    "is gone (the unit's proxy cannot be served where the unit looks for it)"
                        .to_owned(),
                );
            }
            Err(error) => return refuse(format!("cannot be read: {error}")),
        };
        if !meta.file_type().is_dir() {
            return refuse("is not a directory".to_owned());
        }
        let uid = nix::unistd::geteuid().as_raw();
        if meta.uid() != uid {
            return refuse(format!(
                "is owned by uid {}, not by this host's uid {uid}",
                meta.uid()
            ));
        }
        if meta.mode() & 0o7777 != 0o755 {
            return refuse(format!(
                "has mode {:04o}, not the 0755 the host makes it with",
                meta.mode() & 0o7777
            ));
        }
        // The dead host's socket: nothing listens on it any more.
        let socket = dir.join(EgressWiring::SOCKET);
        match std::fs::symlink_metadata(&socket) {
            Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(&socket)
                .map_err(|error| format!("removing the stale {}: {error}", socket.display()))?,
            Ok(_) => {
                return refuse(format!(
                    "holds {} that is not a socket",
                    EgressWiring::SOCKET
                ));
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return refuse(format!("cannot be read: {error}")),
        }
        Self::serve_in(services, session, spec, dir.to_owned())
    }

    /// Bind the socket in `dir` (which exists) and serve the proxy there.
    fn serve_in(
        services: ProxyServices<'_>,
        session: &str,
        spec: &UnitSpec,
        dir: PathBuf,
    ) -> Result<Self, String> {
        let policy = policy_of(spec)?;
        let bound = policy.allow.clone();
        let handle = PolicyHandle::new(policy, bound).map_err(|error| error.to_string())?;
        let started = (|| {
            let socket = dir.join(EgressWiring::SOCKET);
            let listener = std::os::unix::net::UnixListener::bind(&socket)
                .map_err(|error| format!("binding {}: {error}", socket.display()))?;
            std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666))
                .map_err(|error| format!("{}: {error}", socket.display()))?;
            listener
                .set_nonblocking(true)
                .map_err(|error| format!("{}: {error}", socket.display()))?;
            Ok::<_, String>((listener, socket))
        })();
        let listener = match started {
            Ok(listener) => listener,
            // The caller decides about the directory: an adopted one stays.
            Err(error) => return Err(format!("starting the egress proxy: {error}")),
        };
        let mut unit = box_egress::Unit {
            identity: UnitIdentity {
                session: session.to_owned(),
                unit: spec.name.clone(),
            },
            policy: handle.subscribe(),
            limits: limits_of(spec),
            options: Options::default(),
            throttled: Arc::default(),
        };
        // What reports hold: the metrics and the audit log, not the services
        // that own the runtime the proxy runs on.
        let (metrics, audit) = (services.metrics.clone(), services.audit.cloned());
        let usage = Arc::new(EgressUsage::default());
        unit.throttled = Arc::clone(&usage.throttled);
        let counted = Arc::clone(&usage);
        let events: box_egress::EventSink = Arc::new(move |event: Event| {
            counted.count(&event);
            report(&metrics, audit.as_deref(), &event);
        });
        let name = spec.name.clone();
        let (listener, socket) = listener;
        let task = services.runtime.handle()?.spawn(async move {
            // Registered with the proxies' runtime, whose reactor polls it.
            let listener = match tokio::net::UnixListener::from_std(listener) {
                Ok(listener) => listener,
                Err(error) => {
                    tracing::error!(unit = %name, socket = %socket.display(), %error, "the egress proxy cannot listen");
                    return;
                }
            };
            if let Err(error) = box_egress::serve(listener, unit, events).await {
                tracing::error!(unit = %name, %error, "the egress proxy stopped");
            }
        });
        Ok(Self {
            unit: spec.name.clone(),
            usage,
            dir,
            task,
            policy: handle,
            keep: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// What the unit's connections through the proxy carried so far.
    pub fn usage(&self) -> Arc<EgressUsage> {
        Arc::clone(&self.usage)
    }

    /// The socket directory (persisted with the session, for a later host to
    /// serve the proxy in again).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The session is handed to another host: dropping this proxy must leave
    /// its directory, which the unit has mounted and the next host serves in.
    pub fn keep_dir(&self) {
        self.keep.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// What the backend mounts into the unit.
    pub fn wiring(&self) -> UnitWiring {
        UnitWiring {
            egress: Some(EgressWiring {
                socket_dir: self.dir.clone(),
            }),
            ..UnitWiring::default()
        }
    }

    /// `box/network.set`: make `allow` the unit's list (within the profile's
    /// bound); the answer names the effective list and the bound.
    pub fn set_network(&self, allow: &Value) -> Result<Value, String> {
        let Some(entries) = allow.as_array() else {
            return Err(format!(
                "allow: expected an array of host[:port] entries, got {allow}"
            ));
        };
        let mut texts = Vec::new();
        for entry in entries {
            match entry.as_str() {
                Some(text) => texts.push(text),
                None => return Err(format!("allow: {entry} is not a string")),
            }
        }
        let list = AllowList::parse(&texts).map_err(|error| format!("allow: {error}"))?;
        let applied = self
            .policy
            .set_allow(list)
            .map_err(|error| error.to_string())?;
        Ok(self.describe_with(&applied))
    }

    /// The list in force and the bound, as JSON.
    pub fn describe(&self) -> Value {
        self.describe_with(&self.policy.allow())
    }

    fn describe_with(&self, allow: &AllowList) -> Value {
        let show = |list: &AllowList| -> Vec<String> {
            list.rules().iter().map(ToString::to_string).collect()
        };
        json!({
            "unit": self.unit,
            "allow": show(allow),
            "bound": show(self.policy.bound()),
        })
    }
}

/// The proxy's policy for `spec`: its allow list, pinned names, whether private
/// destinations are allowed, and the host's own addresses (refused unless they are).
fn policy_of(spec: &UnitSpec) -> Result<Policy, String> {
    if spec.network.mode != NetworkMode::Egress {
        return Err(format!(
            "unit {}: network mode is {}, not egress",
            spec.name,
            spec.network.mode.as_str()
        ));
    }
    let allow = AllowList::parse(&spec.network.allow)
        .map_err(|error| format!("unit {}: network.allow: {error}", spec.name))?;
    let mut hosts = BTreeMap::new();
    for (name, address) in &spec.network.hosts {
        let host = HostName::parse(name)
            .map_err(|error| format!("unit {}: network.hosts: {error}", spec.name))?;
        hosts.insert(host, *address);
    }
    Ok(Policy {
        allow,
        hosts,
        private_destinations: if spec.network.private_destinations {
            PrivateDestinations::Allowed
        } else {
            PrivateDestinations::Refused
        },
        host_addresses: host_addresses(),
    })
}

/// The plan's connection and bandwidth limits, as the proxy takes them.
fn limits_of(spec: &UnitSpec) -> Limits {
    let defaults = Limits::default();
    Limits {
        max_connections: usize::try_from(spec.network.max_connections)
            .ok()
            .and_then(std::num::NonZeroUsize::new)
            .unwrap_or(defaults.max_connections),
        bytes_per_second: spec
            .network
            .bytes_per_second
            .and_then(std::num::NonZeroU64::new),
    }
}

/// The addresses of the host's interfaces.
fn host_addresses() -> BTreeSet<IpAddr> {
    let Ok(interfaces) = nix::ifaddrs::getifaddrs() else {
        return BTreeSet::new();
    };
    interfaces
        .filter_map(|interface| interface.address)
        .filter_map(|address| {
            if let Some(v4) = address.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                address.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            }
        })
        .collect()
}

/// One attempt: an audit line, a metric, and a log line: WARN for a
/// refusal (naming the host and why, so whoever runs the unit sees why its
/// client got a 403), debug otherwise.
fn report(metrics: &Metrics, audit: Option<&Audit>, event: &Event) {
    let reason = match &event.decision {
        box_egress::Decision::Allowed { .. } => "",
        box_egress::Decision::Refused(refusal) => refusal.reason(),
        box_egress::Decision::Failed { failure, .. } => failure.reason(),
    };
    metrics.egress(event.decision.outcome(), reason);
    metrics.egress_bytes(event.bytes_up, event.bytes_down);
    if let Some(audit) = audit {
        audit.egress(event);
    }
    if let box_egress::Decision::Refused(refusal) = &event.decision {
        let host = crate::one_line(&event.host);
        let target = match (host.is_empty(), event.port) {
            (true, _) => "a request the proxy could not read".to_owned(),
            (false, 0) => host.clone(),
            (false, port) => format!("{host}:{port}"),
        };
        tracing::warn!(
            session = %event.session,
            unit = %event.unit,
            host = %host,
            port = event.port,
            reason,
            "egress to {target} refused: {}",
            crate::one_line(&refusal.to_string())
        );
        return;
    }
    tracing::debug!(
        session = %event.session,
        unit = %event.unit,
        host = %event.host,
        port = event.port,
        outcome = event.decision.outcome(),
        reason,
        "egress"
    );
}

pub(crate) fn create_private_dir(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|error| format!("creating {}: {error}", dir.display()))?;
    // Other users on the host have no business listing the units' sockets.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))
        .map_err(|error| format!("{}: {error}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Services;

    /// A pooled unit's directory names its host's instance; the empty ones
    /// of a gone instance are removed, never another's, a cold unit's or
    /// one holding a socket.
    #[test]
    fn a_dead_hosts_empty_pooled_directories_are_found_and_removed() {
        let runtime = tempfile::tempdir().unwrap();
        let dead = EgressDir::make_pooled(runtime.path(), "http-127.0.0.1-8080").unwrap();
        let dead_path = dead.path().to_owned();
        let name = dead_path.file_name().unwrap().to_str().unwrap();
        assert_eq!(
            pooled_instance(name).as_deref(),
            Some("http-127.0.0.1-8080")
        );
        let claimed = EgressDir::make_pooled(runtime.path(), "http-127.0.0.1-8080").unwrap();
        std::fs::write(claimed.path().join(EgressWiring::SOCKET), "").unwrap();
        let alive = EgressDir::make_pooled(runtime.path(), "other").unwrap();
        let cold = EgressDir::make(runtime.path()).unwrap();
        assert_eq!(
            pooled_instance(cold.path().file_name().unwrap().to_str().unwrap()),
            None
        );
        let removed =
            remove_dead_pools_dirs(runtime.path(), |instance| instance == "http-127.0.0.1-8080");
        assert_eq!(removed, vec![dead_path.clone()]);
        assert!(!dead_path.exists());
        for kept in [&claimed, &alive, &cold] {
            assert!(kept.path().is_dir(), "{}", kept.path().display());
        }
    }

    /// The backends point the unit at the port the executor's bridge listens on.
    #[test]
    fn the_backends_know_the_bridges_port() {
        assert_eq!(EgressWiring::BRIDGE_PORT, box_egress::BRIDGE_PORT);
        assert_eq!(
            EgressWiring::PROXY_URL,
            format!("http://127.0.0.1:{}", box_egress::BRIDGE_PORT)
        );
    }

    /// Issue 22, item 14: a refused attempt is a WARN line naming the
    /// session, the unit, the host and port and why (so a `box run` user sees
    /// why `curl` got a 403), besides its audit line and count; an allowed
    /// one logs nothing at WARN.
    #[test]
    fn a_refused_attempt_is_a_warn_line_naming_the_host_and_why() {
        let (logs, _guard) = crate::tests::Logs::capture();
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("audit.jsonl");
        let mut services = Services::new(Arc::new(box_testkit::fake::FakeBackend::default()));
        services.audit = Some(Arc::new(crate::audit::Audit::open(&path).unwrap()));
        let event = |host: &str, decision: box_egress::Decision| Event {
            session: "s-egress".to_owned(),
            unit: "workspace".to_owned(),
            method: "CONNECT".to_owned(),
            host: host.to_owned(),
            port: 443,
            sni: None,
            address: None,
            decision,
            bytes_up: 120,
            bytes_down: 4096,
            duration: std::time::Duration::ZERO,
            error: None,
        };
        report(
            &services.metrics,
            services.audit.as_deref(),
            &event(
                "denied.example.org",
                box_egress::Decision::Refused(box_egress::Refusal::NotAllowed),
            ),
        );
        report(
            &services.metrics,
            services.audit.as_deref(),
            &event(
                "example.com",
                box_egress::Decision::Allowed {
                    rule: box_egress::Rule::parse("example.com").unwrap(),
                },
            ),
        );
        let logs = logs.text();
        let warned: Vec<&str> = logs.lines().filter(|line| line.contains("WARN")).collect();
        assert_eq!(warned.len(), 1, "{logs}");
        let line = warned[0];
        for says in [
            "egress to denied.example.org:443 refused",
            "s-egress",
            "workspace",
            box_egress::Refusal::NotAllowed.reason(),
        ] {
            assert!(line.contains(says), "{says}: {line}");
        }
        assert!(!logs.contains("example.com:443 refused"), "{logs}");
        let audit = std::fs::read_to_string(&path).unwrap();
        assert_eq!(audit.lines().count(), 2, "{audit}");
        assert!(audit.contains("\"refused\""), "{audit}");
        let metrics = services.metrics.render();
        assert!(
            metrics.contains(&format!(
                "box_egress_connections_total{{outcome=\"refused\",reason=\"{}\"}} 1",
                box_egress::Refusal::NotAllowed.reason()
            )),
            "{metrics}"
        );
        // The bytes of both exchanges, by direction.
        assert!(
            metrics.contains("box_egress_bytes_total{direction=\"up\"} 240"),
            "{metrics}"
        );
        assert!(
            metrics.contains("box_egress_bytes_total{direction=\"down\"} 8192"),
            "{metrics}"
        );
    }

    /// Reattach's half of the proxy: a handed-off proxy leaves its directory; a
    /// new one is served there (the stale socket replaced) and removes it when
    /// it ends; a directory that is gone, a link, or not 0755 is refused by
    /// path, and never created.
    #[tokio::test]
    async fn a_proxy_is_served_again_only_in_the_hosts_own_directory() {
        use std::os::unix::fs::MetadataExt as _;
        let runtime = tempfile::tempdir().unwrap();
        let mut config = crate::HostConfig::new(
            box_policy::profile::Catalog::only(Vec::new()),
            crate::tests::facts(),
        );
        config.runtime_dir = runtime.path().to_owned();
        let services = Services::new(Arc::new(box_testkit::fake::FakeBackend::default()));
        let profile = config.catalog.load("default").unwrap();
        let plan = box_policy::plan::resolve(&profile, &Value::Null, &config.facts).unwrap();
        let mut spec = plan.units[0].clone();
        spec.network.mode = NetworkMode::Egress;
        spec.network.allow = vec!["example.test".to_owned()];

        let first =
            EgressProxy::start(&config.runtime_dir, services.proxies(), "s", &spec).unwrap();
        let dir = first.dir().to_owned();
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o7777, 0o755);
        first.keep_dir();
        drop(first);
        assert!(dir.join(EgressWiring::SOCKET).exists(), "handed off: kept");

        let again = EgressProxy::adopt(services.proxies(), "s", &spec, &dir).unwrap();
        std::os::unix::net::UnixStream::connect(dir.join(EgressWiring::SOCKET))
            .expect("the new proxy listens where the unit connects");
        drop(again);
        assert!(!dir.exists(), "a session that ends removes its directory");

        let error = EgressProxy::adopt(services.proxies(), "s", &spec, &dir).unwrap_err();
        assert!(
            error.contains(&dir.display().to_string()) && error.contains("gone"),
            "{error}"
        );
        assert!(!dir.exists(), "never created afresh");

        let open = runtime.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let error = EgressProxy::adopt(services.proxies(), "s", &spec, &open).unwrap_err();
        assert!(error.contains("mode 0777"), "{error}");

        let link = runtime.path().join("link");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink(&open, &link).unwrap();
        let error = EgressProxy::adopt(services.proxies(), "s", &spec, &link).unwrap_err();
        assert!(error.contains("not a directory"), "{error}");
    }
}
