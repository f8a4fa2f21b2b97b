//! The host: a session's life, from the box ask at initialize to the removal of
//! its units. `box serve` starts a [`Host`] from plain configuration
//! ([`ServeConfig`]), whose sessions a transport serves; `box run` (the
//! binary's) spawns one session of its own with [`spawn_session`].
//!
//! Owns: the host's settings ([`HostConfig`], immutable) and its live
//! services ([`Services`], one value the host owns and hands to every
//! session), backend selection, the session task (`session`), starting and
//! removing units (`units`), orphan sweeping, metrics and the audit log.
//! Does not own: HTTP and stdio framing (the transports, which it never
//! names: the binary wires them to it), the process around it (its log, its
//! runtime, its signals and its terminal are the binary's), the command line
//! (the binary's clap structs), what a unit is (the plan) or how one starts
//! (the backends).

mod adopt;
mod ask;
pub mod audit;
mod config;
pub use config::{
    HostConfig, PoolAsk, ResolveFn, ServeConfig, default_fork_dir, default_state_dir,
};
pub mod egress;
pub mod fork;
mod hide;
pub mod ledger;
pub mod metrics;
pub mod pool;
mod redact;
pub use redact::ScratchPool;
pub mod request_state;
pub mod router;
mod services;
pub use services::Services;
pub mod session;
pub mod state;
pub mod units;
mod usage;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use box_backend::Backend;
use box_policy::plan::{HostFacts, Plan, PlanError, UserIds};
use box_policy::profile::{Catalog, Profile};

pub use session::{
    AskPart, SessionGone, SessionHandle, TransportAsk, spawn_session, spawn_session_asking,
    spawn_session_reattaching,
};

/// Why no backend could be had.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BackendUnavailable(String);

/// The backend `--backend` names from `registry`: docker, local, or auto
/// (the first that connects, docker before local), said in one log line.
pub async fn select_backend(
    registry: &box_backend::Registry,
    kind: &str,
) -> anyhow::Result<Arc<dyn Backend>> {
    let backend = match kind {
        "auto" => match registry.auto().await {
            Ok((backend, skipped)) => {
                for (kind, why) in skipped {
                    // Said once, loudly; every envelope then names the backend too.
                    tracing::warn!(%why, "{} is not available: units run on the {} backend", kind.as_str(), backend.kind().as_str());
                }
                backend
            }
            Err(why) => anyhow::bail!("--backend auto: no backend is available: {why}"),
        },
        name => registry
            .connect(name)
            .await
            .map_err(|why| anyhow::anyhow!("--backend {name}: {why}"))?,
    };
    tracing::info!(
        backend = backend.kind().as_str(),
        "units run on the {} backend",
        backend.kind().as_str()
    );
    Ok(backend)
}

/// The host facts: the workspace directory (absolute) and the caller's ids.
pub fn host_facts(workspace: Option<&PathBuf>) -> anyhow::Result<HostFacts> {
    let cwd = match workspace {
        Some(dir) => dir
            .canonicalize()
            .with_context(|| format!("--workspace {}", dir.display()))?,
        None => std::env::current_dir().context("reading the current directory")?,
    };
    let workspace_owner = owner_of(&cwd);
    Ok(HostFacts {
        cwd,
        caller: UserIds {
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
        },
        workspace_owner,
    })
}

/// The owner of `dir` (following links, as the bind mount does), if it can
/// be read.
pub fn owner_of(dir: &std::path::Path) -> Option<UserIds> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(dir).ok().map(|metadata| UserIds {
        uid: metadata.uid(),
        gid: metadata.gid(),
    })
}

/// `facts` with the owner of `profile`'s workspace directory read now (a
/// long-lived host's directory may have changed hands since it started):
/// what `user = "host"` means for a root caller.
pub fn facts_for(facts: &HostFacts, profile: &Profile) -> HostFacts {
    HostFacts {
        workspace_owner: profile.workspace_dir(&facts.cwd).and_then(owner_of),
        ..facts.clone()
    }
}

/// [`box_policy::plan::resolve`] against [`facts_for`] the profile: how a
/// host resolves a session's plan (the default [`HostConfig::resolve`]).
pub fn resolve_plan(
    profile: &Profile,
    tighten: &serde_json::Value,
    facts: &HostFacts,
) -> Result<Plan, PlanError> {
    box_policy::plan::resolve(profile, tighten, &facts_for(facts, profile))
}

/// How long the sweep of orphaned units at start may take.
const SWEEP_WAIT: Duration = Duration::from_secs(30);

/// Remove every unit labelled with this host's instance (at start none of them
/// can belong to a live session) and those of dead hosts, once their lease
/// has surely lapsed: until then their own init ends them (or a host with
/// their state takes them back). `own_last_alive` is when the host that held
/// this instance id before was last alive, if one did. Live and unknown
/// instances' units are never touched, nor those whose backend ids are in
/// `keep` (a persisted session's: re-adopted, or left to their lease).
pub async fn sweep_orphans(
    config: &HostConfig,
    services: &Services,
    own_last_alive: Option<std::time::SystemTime>,
    keep: &std::collections::HashSet<String>,
) {
    let units = match services.backend.list().await {
        Ok(units) => units,
        Err(error) => {
            tracing::warn!(%error, "listing units to sweep orphans failed");
            return;
        }
    };
    // Ours (a predecessor that held this id crashed) and those of hosts whose
    // instance lock is left with nobody holding it (they died): none of these
    // can belong to a live session. Live and unknown instances are left alone.
    use box_backend::instance::{Liveness, default_dir, heartbeat, lease_may_be_live, liveness};
    let dir = default_dir();
    let now = std::time::SystemTime::now();
    let mut dead = std::collections::BTreeSet::new();
    let mut waiting = std::collections::BTreeSet::new();
    let mut orphans = Vec::new();
    for unit in units {
        if keep.contains(&unit.id) {
            continue;
        }
        let last_alive = if unit.instance == config.instance {
            own_last_alive
        } else if liveness(&dir, &unit.instance) == Liveness::Dead {
            dead.insert(unit.instance.clone());
            heartbeat(&dir, &unit.instance)
        } else {
            continue;
        };
        let live_lease = last_alive
            .and_then(|last_alive| lease_may_be_live(&unit.state, unit.lease_ms, last_alive, now));
        if let Some(by) = live_lease {
            tracing::info!(unit = %unit.id, instance = %unit.instance, by = %humantime::format_rfc3339_seconds(by), "left a dead host's unit to its lease, which may still be live");
            waiting.insert(unit.instance);
        } else {
            orphans.push(unit.id);
        }
    }
    if !orphans.is_empty() {
        tracing::info!(count = orphans.len(), instance = %config.instance, "removing orphaned units of this instance and of dead hosts");
        units::remove_units(
            services.backend.as_ref(),
            &orphans,
            ledger::Removal::Graceful,
        )
        .await;
    }
    // A lock file that says when a waiting unit's host was last alive stays.
    for instance in dead.difference(&waiting) {
        box_backend::instance::forget(&dir, instance);
    }
}

/// A session or a request refused before it was served: a WARN log line, an
/// audit line (with `--audit`) and a count in `box_sessions_refused{reason}`,
/// so an operator sees every refusal a client got.
pub fn report_refusal(services: &Services, refusal: &audit::Refusal<'_>) {
    services.metrics.refused(refusal.reason);
    if let Some(audit) = &services.audit {
        audit.refusal(refusal);
    }
    let client = refusal
        .client
        .map(|client| format!("{} {}", client.name, client.version));
    let detail = one_line(refusal.detail);
    match refusal.http {
        Some((status, path)) => tracing::warn!(
            reason = refusal.reason,
            status,
            path = %one_line(path),
            "refused a request: {detail}"
        ),
        None => tracing::warn!(
            reason = refusal.reason,
            session = refusal.session,
            profile = refusal.profile,
            client = client.as_deref().map(one_line),
            "refused initialize: {detail}"
        ),
    }
}

/// `text` on one line: control characters (a client's newline) escaped, so
/// a log line cannot be split or forged by what it quotes.
pub fn one_line(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let escaped: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            escaped
        })
        .collect()
}

/// How long a host that is ending waits, after its calls' drain, for its
/// sessions' units to be confirmed removed before it exits naming those left.
pub const END_WAIT: Duration = Duration::from_secs(30);

/// Remove, once, every unit the ledger knows the id of; those confirmed gone
/// leave it.
pub async fn remove_known_units(services: &Services) {
    let known: Vec<ledger::Tracked> = services.ledger.tracked();
    let ids: Vec<String> = known.iter().map(|unit| unit.id.clone()).collect();
    let failed = units::remove_units(services.backend.as_ref(), &ids, services.removal()).await;
    for unit in known {
        if !failed.iter().any(|(id, _)| *id == unit.id) {
            services.ledger.gone(unit.key);
        }
    }
}

/// Say on stderr which units are not confirmed removed, each with how to
/// remove it; whether any is.
pub fn report_units_left(config: &HostConfig, services: &Services) -> bool {
    let left = services.ledger.left();
    if left.is_empty() {
        return false;
    }
    let kind = services.backend.kind();
    let mut text = format!(
        "box: {} unit{} of this host (instance {}) could not be confirmed removed before it exited:",
        left.len(),
        if left.len() == 1 { "" } else { "s" },
        config.instance
    );
    for unit in &left {
        text.push_str("\n  ");
        text.push_str(&unit.describe(kind.as_str(), &config.instance));
    }
    tracing::error!(units = left.len(), "units left at exit");
    eprintln!("{text}");
    true
}

/// Claim this host's instance id for its whole life (a lock the kernel
/// releases however the process dies), so `box gc` and the next host can tell
/// a live host's units from orphans. The default is one id per listen address
/// on HTTP (only one process can hold it, so units labelled with it at start
/// are a crashed predecessor's), or a fresh one per process on stdio (two CI
/// jobs on one runner never sweep each other).
pub fn claim_instance(
    requested: Option<&str>,
    listen: Option<&str>,
) -> anyhow::Result<box_backend::instance::InstanceLock> {
    use box_backend::instance;
    let id = instance_id(requested, listen);
    instance::InstanceLock::acquire(&instance::default_dir(), &id)
        .with_context(|| format!("claiming instance `{id}`"))
}

/// The instance id a host claims: the one asked for, one per listen address
/// on HTTP, a fresh one otherwise.
fn instance_id(requested: Option<&str>, listen: Option<&str>) -> String {
    use box_backend::instance;
    match (requested, listen) {
        (Some(id), _) => id.to_owned(),
        // An ephemeral port names no lasting host: two such hosts are two
        // instances, not one claimed twice.
        (None, Some(address)) if address.ends_with(":0") => instance::new_id(),
        (None, Some(address)) => {
            let address: String = address
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '.' {
                        c
                    } else {
                        '-'
                    }
                })
                .collect();
            format!("http-{address}")
        }
        (None, None) => instance::new_id(),
    }
}

/// How long `--takeover` waits for the host it signalled to hand off and exit.
const TAKEOVER_WAIT: Duration = Duration::from_secs(60);

/// `box serve --takeover`: the live host of this instance (the same listen
/// address, or `--instance`) is sent SIGHUP, and the instance is claimed
/// once it has handed its sessions off and exited; with no live host, it is
/// claimed at once.
async fn take_over(serve: &ServeConfig) -> anyhow::Result<box_backend::instance::InstanceLock> {
    use box_backend::instance;
    if serve.listen.is_none() || serve.state.is_none() {
        anyhow::bail!(
            "--takeover needs --listen and a state directory (--state): the sessions are handed over through it"
        );
    }
    let mut signalled = None;
    let deadline = tokio::time::Instant::now() + TAKEOVER_WAIT;
    loop {
        match claim_instance(serve.instance.as_deref(), serve.listen.as_deref()) {
            Ok(lock) => {
                if let Some(pid) = signalled {
                    tracing::info!(pid, "took over from the previous host");
                }
                return Ok(lock);
            }
            Err(error) => {
                if signalled.is_none() {
                    let id = instance_id(serve.instance.as_deref(), serve.listen.as_deref());
                    let Some(pid) = instance::holder_pid(&instance::default_dir(), &id) else {
                        return Err(error
                            .context("--takeover: no pid of the live host in its instance lock"));
                    };
                    tracing::info!(pid, instance = %id, "--takeover: asking the live host to hand its sessions off (SIGHUP)");
                    nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGHUP,
                    )
                    .with_context(|| format!("--takeover: signalling the live host, pid {pid}"))?;
                    signalled = Some(pid);
                }
                if tokio::time::Instant::now() >= deadline {
                    return Err(error.context(format!(
                        "--takeover: the live host did not hand off and exit within {}",
                        humantime::format_duration(TAKEOVER_WAIT)
                    )));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// A host ready to serve sessions: what they share, the token that ends
/// them all, and this host's claim on its instance id.
pub struct Host {
    /// What every session shares and never changes.
    pub config: Arc<HostConfig>,
    /// What every session shares and changes.
    pub services: Arc<Services>,
    /// Cancelled when the host is to end (the binary's signal handlers
    /// cancel it); sessions are its children.
    pub shutdown: CancellationToken,
    /// Held until the host exits: while it is, this instance is alive.
    _instance: box_backend::instance::InstanceLock,
}

/// Start the host for `box serve`: its backend, its instance id, its audit
/// log, its state store (the sessions it keeps re-adopted) and the sweep of
/// orphaned units. A transport then serves sessions until it ends (or
/// [`Host::shutdown`] is cancelled), and [`Host::finish`] says what is left.
pub async fn start(serve: ServeConfig) -> anyhow::Result<Host> {
    let backend = select_backend(&serve.registry, &serve.backend).await?;
    let facts = host_facts(serve.workspace.as_ref())?;
    let mut config = HostConfig::new(Catalog::new(serve.profile_dirs.clone()), facts);
    let mut services = Services::new(backend);
    config.default_profile = serve.profile.clone();
    config.drain = serve.drain;
    config.fork_git = serve.fork_git.clone();
    let instance = if serve.takeover {
        take_over(&serve).await?
    } else {
        claim_instance(serve.instance.as_deref(), serve.listen.as_deref())?
    };
    config.instance = instance.id().to_owned();
    if let Some(path) = &serve.audit {
        let audit =
            audit::Audit::open(path).with_context(|| format!("--audit {}", path.display()))?;
        services.audit = Some(Arc::new(audit));
    }
    if let Some(dir) = &serve.state {
        services.state = Some(state::Store::open(dir).map_err(|why| anyhow::anyhow!(why))?);
    }
    if let Some(mut tracing) = serve.tracing.clone() {
        tracing.resource.push((
            "service.instance.id".to_owned(),
            box_otel::AttrValue::Str(config.instance.clone()),
        ));
        tracing::info!(endpoint = %tracing.endpoint, "exporting traces over OTLP/HTTP");
        services.tracer = box_otel::Tracer::export(tracing);
    }
    let (config, services) = (Arc::new(config), Arc::new(services));
    let pools = pool::asked(&config, &serve.pools, serve.listen.is_some());
    pool::start(&config, &services.pools, services.backend.as_ref(), &pools)?;
    for each in services.pools.each() {
        let (config, held) = (config.clone(), services.clone());
        services.pools.spawn(async move {
            pool::refill(&config, held.pool_services(), each).await;
        });
    }
    // Before the sweep, which leaves every persisted unit alone.
    let persisted = adopt::adopt_all(&config, &services);
    // Bounded: an engine that stalls must not keep the host from serving.
    if tokio::time::timeout(
        SWEEP_WAIT,
        sweep_orphans(
            &config,
            &services,
            instance.previous_heartbeat(),
            &persisted,
        ),
    )
    .await
    .is_err()
    {
        tracing::warn!(
            "sweeping orphaned units took longer than {}; serving without it (`box gc` removes them later)",
            humantime::format_duration(SWEEP_WAIT)
        );
    }
    let shutdown = CancellationToken::new();
    if serve.listen.is_some() {
        usage::spawn(config.clone(), services.clone(), shutdown.clone());
    }
    Ok(Host {
        config,
        services,
        shutdown,
        _instance: instance,
    })
}

impl Host {
    /// Once the transport has ended: the pools' refills stopped and their
    /// ready units removed (before [`Self::finish`] names what is left).
    pub async fn end_pools(&self) {
        let left = self.services.pools.end().await;
        if !left.is_empty() {
            units::remove_until_gone(&self.services, left).await;
        }
    }

    /// After the transport has ended: failure when units are not confirmed
    /// removed (each named on stderr with how to remove it). The instance id
    /// is released here.
    /// Export the spans still queued and wait for the export (bounded by its
    /// timeout): the host's last calls and removals are in its last batch.
    pub async fn flush_traces(&self) {
        self.services.tracer.flush().await;
    }

    pub fn finish(self) -> ExitCode {
        if report_units_left(&self.config, &self.services) {
            return ExitCode::FAILURE;
        }
        ExitCode::SUCCESS
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod instance_tests {
    /// Two hosts on ephemeral ports (`127.0.0.1:0`) are two instances; two
    /// on the same fixed address are one claimed twice.
    #[test]
    fn hosts_on_ephemeral_ports_are_distinct_instances() {
        let first = super::claim_instance(None, Some("127.0.0.1:0")).unwrap();
        let second = super::claim_instance(None, Some("127.0.0.1:0")).unwrap();
        assert_ne!(first.id(), second.id());
        let port = format!("127.0.0.1:{}", 40000 + std::process::id() % 20000);
        let held = super::claim_instance(None, Some(&port)).unwrap();
        assert!(super::claim_instance(None, Some(&port)).is_err());
        drop(held);
    }
}
