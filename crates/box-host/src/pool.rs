//! Warm units: pools of units started with no session (`box serve --pool
//! PROFILE=N`), claimed by sessions whose plan fits, with the session's plan
//! bound late (the backend's [`Pooling::bind`]: limits through the engine,
//! the executor's confinement, environment and secrets before it serves
//! anything).
//!
//! A pool holds units of its profile's workspace unit as resolved with no
//! tightening (network `none` or `egress`: a profile whose workspace's
//! network is `bridge` is refused at start). A pooled unit of an egress
//! profile starts with its egress socket's directory mounted, empty; the
//! claim serves the session's proxy there (its policy the session's plan's),
//! and the bind line starts the executor's bridge. What a running unit
//! cannot change is its key: [`fits`] says why a plan does not fit, and that
//! unit then starts cold, its envelope saying `warm: false` and why. A
//! claimed unit serves one session and is removed with it, never returned;
//! each claim wakes the pool's refill, which starts one unit at a time.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use box_backend::pool::{PooledUnit, Pooling};
use box_backend::{Backend, BackendError, SessionLabel, StartedUnit, UnitWiring};
use box_policy::envelope::Warm;
use box_policy::plan::{NetworkMode, Role, UnitSpec};
use tokio_util::sync::CancellationToken;

use crate::egress::{EgressDir, EgressProxy, ProxyServices};
use crate::ledger::{Ledger, Tracked};
use crate::metrics::Metrics;
use crate::{HostConfig, PoolAsk};
pub use fork::{ForkClaim, Taken, claim_taken, remove_dead_pools_fork_dirs, take_fork};
use fork::{ForkDir, PoolFork};

mod fork;

/// What the pools use of the host's services (lent by them; this module
/// sits below `Services`, which holds the [`Pools`]).
#[derive(Clone, Copy)]
pub struct PoolServices<'a> {
    /// The pools.
    pub pools: &'a Pools,
    /// Where units run.
    pub backend: &'a dyn Backend,
    /// Every unit asked for and not yet confirmed removed.
    pub ledger: &'a Ledger,
    /// `/metrics`.
    pub metrics: &'a Metrics,
    /// What a claimed egress unit's proxy runs on and reports to.
    pub proxies: ProxyServices<'a>,
}

/// How long a pool waits after a failed start before it tries again.
const REFILL_BACKOFF: Duration = Duration::from_secs(5);

/// A host's pools (none unless asked for); set once at the host's start.
#[derive(Default)]
pub struct Pools {
    pools: OnceLock<Vec<Arc<Pool>>>,
    /// Ends the refills and removes the ready units.
    stop: CancellationToken,
    /// The refill tasks, awaited at the end.
    tasks: tokio_util::task::TaskTracker,
    /// Numbers the pooled units' session labels.
    next: AtomicU64,
}

/// One profile's pool.
pub struct Pool {
    profile: String,
    size: usize,
    /// The profile's workspace unit, untightened: what every unit starts as
    /// (a fork profile's on its own directory in place of the host's).
    spec: UnitSpec,
    /// A `source = "fork"` profile's: what each unit's fork is made from.
    fork: Option<PoolFork>,
    ready: Mutex<VecDeque<Ready>>,
    starting: AtomicUsize,
    refill: tokio::sync::Notify,
    /// Why its last start failed, until one succeeds.
    failing: Mutex<Option<String>>,
}

/// A ready unit and its place in the ledger.
struct Ready {
    unit: PooledUnit,
    key: u64,
    /// Cancelled when a session claims it: its pool stops watching its end.
    claimed: CancellationToken,
    /// Its egress socket's directory (an egress profile's pool), mounted
    /// into it and empty until a claim serves the session's proxy there;
    /// removed with the unit when no session claims it.
    egress: Option<EgressDir>,
    /// Its workspace's directory (a fork profile's pool), mounted into it and
    /// empty until a claim makes the session's fork there; removed with the
    /// unit when no session claims it.
    fork: Option<ForkDir>,
    /// The borrowed git objects it mounts read-only (a fork profile's pool
    /// whose forks are worktrees): those the claim's fork must borrow.
    objects: Option<std::path::PathBuf>,
}

/// A ready unit's end as its pool watches it: `Some(key)` when the unit
/// ended before a claim (killed, its helper or container gone), `None`
/// once claimed.
type Watch = futures::future::BoxFuture<'static, Option<u64>>;

/// What a claim gave.
pub enum Claim {
    /// A warm unit, bound to the session's plan, and its egress proxy,
    /// serving the session's policy (a unit whose network is egress).
    Warm(Box<StartedUnit>, Option<EgressProxy>),
    /// No pooled unit serves this unit: why (the envelope's `warmWhy`),
    /// and a unit whose bind failed, for the caller to remove.
    Cold(String, Option<Tracked>),
    /// The host keeps no pool.
    NoPools,
}

impl Pools {
    /// Whether any pool is kept.
    pub fn any(&self) -> bool {
        self.pools.get().is_some_and(|pools| !pools.is_empty())
    }

    /// Each pool's profile and ready units (for `/metrics`).
    pub fn ready(&self) -> Vec<(String, usize)> {
        self.pools
            .get()
            .map(|pools| {
                pools
                    .iter()
                    .map(|pool| (pool.profile.clone(), pool.ready_len()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// End the refills; every ready unit, for the caller to remove.
    pub async fn end(&self) -> Vec<Tracked> {
        self.stop.cancel();
        self.tasks.close();
        self.tasks.wait().await;
        let Some(pools) = self.pools.get() else {
            return Vec::new();
        };
        let mut left = Vec::new();
        for pool in pools {
            let drained: Vec<Ready> = pool.lock().drain(..).collect();
            for ready in drained {
                left.push(Tracked {
                    key: ready.key,
                    id: ready.unit.id().to_owned(),
                });
            }
        }
        left
    }

    /// Run `refill` (a pool's, given its services) until the pools end.
    pub fn spawn(&self, refill: impl std::future::Future<Output = ()> + Send + 'static) {
        self.tasks.spawn(refill);
    }
}

impl Pool {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Ready>> {
        self.ready
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn ready_len(&self) -> usize {
        self.lock().len()
    }
}

/// The pools a host keeps: on a host that listens, each profile's `[pool]`
/// (every profile its catalog finds), then `flags` (`--pool`), which
/// override a profile's (`PROFILE=0`: none). A stdio host serves one
/// session, so it keeps only what `flags` ask.
pub fn asked(config: &HostConfig, flags: &[PoolAsk], listening: bool) -> Vec<PoolAsk> {
    let mut asked = Vec::new();
    if listening {
        for listed in config.catalog.list() {
            if listed.hidden || flags.iter().any(|flag| flag.profile == listed.name) {
                continue;
            }
            // A profile that does not load keeps no pool; its sessions are
            // refused with the same error.
            match config.catalog.load(&listed.name) {
                Ok(profile) if profile.pool.size > 0 => asked.push(PoolAsk {
                    profile: listed.name,
                    size: profile.pool.size,
                    from_table: true,
                }),
                Ok(_) => {}
                Err(error) => {
                    tracing::debug!(profile = listed.name, %error, "not pooled: the profile does not load");
                }
            }
        }
    }
    asked.extend(flags.iter().filter(|flag| flag.size > 0).cloned());
    asked
}

/// The pools `asked` on `backend`: each profile resolved with no
/// tightening; kept in `pools`, whose refills the caller spawns (each of
/// [`Pools::each`] through [`refill`]).
pub fn start(
    config: &HostConfig,
    pools: &Pools,
    backend: &dyn Backend,
    asked: &[PoolAsk],
) -> anyhow::Result<()> {
    if asked.is_empty() {
        return Ok(());
    }
    let mut made: Vec<Arc<Pool>> = Vec::new();
    for ask in asked {
        match made_pool(config, backend, ask, &made) {
            Ok(pool) => made.push(pool),
            // A profile's own table keeps no pool it cannot: the host serves
            // that profile's sessions cold, and every other profile, and
            // says why; a --pool the operator wrote stops it.
            Err(error) if ask.from_table => {
                tracing::warn!(profile = %ask.profile, "{error:#}; its sessions start cold");
            }
            Err(error) => return Err(error),
        }
    }
    pools
        .pools
        .set(made)
        .map_err(|_| anyhow::anyhow!("--pool: the host's pools are already started"))
}

/// The pool `ask` asks for, or why this host cannot keep it.
fn made_pool(
    config: &HostConfig,
    backend: &dyn Backend,
    ask: &PoolAsk,
    made: &[Arc<Pool>],
) -> anyhow::Result<Arc<Pool>> {
    if backend.pooling().is_none() {
        anyhow::bail!(
            "{}: the {} backend keeps no pooled units; pools need one that does (docker, local)",
            ask.named(),
            backend.kind().as_str()
        );
    }
    let profile = config
        .catalog
        .load(&ask.profile)
        .map_err(|error| anyhow::anyhow!("{}: {error}", ask.named()))?;
    let plan = (config.resolve)(&profile, &serde_json::Value::Null, &config.facts)
        .map_err(|error| anyhow::anyhow!("{}: {error}", ask.named()))?;
    let Some(spec) = plan.units.iter().find(|unit| unit.role == Role::Workspace) else {
        anyhow::bail!(
            "{}: the profile has no workspace unit to keep ready",
            ask.named()
        );
    };
    if spec.network.mode == NetworkMode::Bridge {
        anyhow::bail!(
            "{}: the profile's workspace network is bridge; pooled units start with network none or egress (a bridge unit joins its session's own network, made when the session starts)",
            ask.named()
        );
    }
    if spec.network.mode == NetworkMode::Egress {
        let wants = box_backend::Wants {
            egress_socket: true,
            ..box_backend::Wants::default()
        };
        backend
            .capabilities()
            .refuse(backend.kind(), &spec.name, wants)
            .map_err(|refusal| anyhow::anyhow!("{}: {refusal}", ask.named()))?;
    }
    if made.iter().any(|pool| pool.profile == ask.profile) {
        anyhow::bail!("{}: the profile is named twice", ask.named());
    }
    let fork = match plan.workspace_fork {
        Some(mode) => Some(
            PoolFork::new(config, backend, spec, mode)
                .map_err(|why| anyhow::anyhow!("{}: {why}", ask.named()))?,
        ),
        None => None,
    };
    Ok(Arc::new(Pool {
        profile: ask.profile.clone(),
        size: ask.size,
        spec: spec.clone(),
        fork,
        ready: Mutex::default(),
        starting: AtomicUsize::new(0),
        refill: tokio::sync::Notify::new(),
        failing: Mutex::default(),
    }))
}

impl Pools {
    /// Each pool, for its refill.
    pub fn each(&self) -> Vec<Arc<Pool>> {
        self.pools.get().cloned().unwrap_or_default()
    }

    /// Why pools cannot refill (their last start failed), for `/readyz`:
    /// `Err` names each such pool.
    pub fn readiness(&self) -> Result<(), String> {
        let failing: Vec<String> = self
            .each()
            .iter()
            .filter_map(|pool| {
                let why = pool
                    .failing
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .clone()?;
                Some(format!(
                    "the pool of profile {} cannot refill ({why}); its sessions start cold",
                    pool.profile
                ))
            })
            .collect();
        if failing.is_empty() {
            Ok(())
        } else {
            Err(failing.join("; "))
        }
    }
}

/// Keep `pool` full, one start at a time, until the pools end.
pub async fn refill(config: &HostConfig, services: PoolServices<'_>, pool: Arc<Pool>) {
    let stop = services.pools.stop.clone();
    let Some(pooling) = services.backend.pooling() else {
        return;
    };
    // The ready units' ends: one that ends unclaimed leaves the pool, which
    // starts another.
    let mut watched = futures::stream::FuturesUnordered::<Watch>::new();
    // What the pool keeps when full, beside what it holds (`box doctor --host`).
    services.metrics.pool_size(&pool.profile, pool.size);
    services.metrics.pool_ready(&pool.profile, pool.ready_len());
    loop {
        while pool.ready_len() + pool.starting.load(Ordering::SeqCst) < pool.size {
            if stop.is_cancelled() {
                return;
            }
            pool.starting.fetch_add(1, Ordering::SeqCst);
            // Finished even when the pools end meanwhile: a start dropped
            // half-way leaves a unit its ledger entry cannot name, while a
            // finished one joins the ready units, which the end removes.
            let started = start_one(config, services, pooling, &pool).await;
            pool.starting.fetch_sub(1, Ordering::SeqCst);
            *pool
                .failing
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()) =
                started.as_ref().err().map(ToString::to_string);
            match started {
                Ok(mut ready) => {
                    tracing::debug!(
                        profile = pool.profile,
                        id = ready.unit.id(),
                        "pooled unit ready"
                    );
                    watched.push(watch_end(&mut ready));
                    let ready = {
                        let mut units = pool.lock();
                        units.push_back(ready);
                        units.len()
                    };
                    services.metrics.pool_ready(&pool.profile, ready);
                }
                Err(error) => {
                    tracing::warn!(
                        profile = pool.profile,
                        %error,
                        "the pool cannot start a unit; sessions start cold meanwhile, trying again in {}",
                        humantime::format_duration(REFILL_BACKOFF)
                    );
                    tokio::select! {
                        () = tokio::time::sleep(REFILL_BACKOFF) => {}
                        () = stop.cancelled() => return,
                    }
                }
            }
        }
        tokio::select! {
            () = pool.refill.notified() => {}
            Some(ended) = futures::StreamExt::next(&mut watched), if !watched.is_empty() => {
                // `None`: a claimed unit, its end the session's to watch.
                let gone = ended.and_then(|key| {
                    let mut units = pool.lock();
                    let at = units.iter().position(|ready| ready.key == key);
                    at.and_then(|at| units.remove(at))
                });
                if let Some(gone) = gone {
                    let id = gone.unit.id().to_owned();
                    tracing::warn!(profile = pool.profile, id, "a pooled unit ended before a session claimed it; starting another");
                    services.metrics.pool_ready(&pool.profile, pool.ready_len());
                    // Its leftovers (a run directory, a stopped container).
                    if let Err(error) = services.backend.remove(&id).await {
                        tracing::warn!(id, %error, "removing an ended pooled unit");
                    }
                    services.ledger.gone(gone.key);
                }
            }
            () = stop.cancelled() => return,
        }
    }
}

/// Watch `ready`'s end while it waits in its pool: its `ended` is shared
/// between the pool's watch (until a claim cancels it) and the session
/// that claims it.
fn watch_end(ready: &mut Ready) -> Watch {
    use futures::FutureExt as _;
    let ended = std::mem::replace(
        &mut ready.unit.started.ended,
        Box::pin(futures::future::pending()),
    )
    .shared();
    ready.unit.started.ended = ended.clone().boxed();
    let (key, claimed) = (ready.key, ready.claimed.clone());
    async move {
        tokio::select! {
            _ = ended => Some(key),
            () = claimed.cancelled() => None,
        }
    }
    .boxed()
}

async fn start_one(
    config: &HostConfig,
    services: PoolServices<'_>,
    pooling: &dyn Pooling,
    pool: &Pool,
) -> Result<Ready, BackendError> {
    let number = services.pools.next.fetch_add(1, Ordering::Relaxed);
    let label = SessionLabel {
        instance: config.instance.clone(),
        session: format!("pool-{number}"),
        profile: pool.profile.clone(),
    };
    // An egress unit's socket directory, mounted at its start as a cold
    // one's is: the unit's shape is the same, its proxy served at the claim.
    let egress = if pool.spec.network.mode == NetworkMode::Egress {
        let dir =
            EgressDir::make_pooled(&config.runtime_dir, &config.instance).map_err(|message| {
                BackendError::Other {
                    unit: pool.spec.name.clone(),
                    doing: "making its egress socket directory".to_owned(),
                    message,
                }
            })?;
        Some(dir)
    } else {
        None
    };
    // A fork profile's unit mounts an empty directory of its own at its
    // workspace, and the objects a worktree fork borrows, as a cold fork
    // unit mounts its fork and them: its claim makes the fork there.
    let (spec, fork, objects) = match &pool.fork {
        Some(fork) => {
            let dir =
                ForkDir::make(config, &label.session).map_err(|message| BackendError::Other {
                    unit: pool.spec.name.clone(),
                    doing: "making its fork's directory".to_owned(),
                    message,
                })?;
            let mut spec = pool.spec.clone();
            spec.source = box_policy::plan::WorkspaceSource::Host(dir.path().to_owned());
            (std::borrow::Cow::Owned(spec), Some(dir), fork.objects())
        }
        None => (std::borrow::Cow::Borrowed(&pool.spec), None, None),
    };
    let key = services.ledger.starting(&label.session, &pool.spec.name);
    let wiring = UnitWiring {
        runtime_dir: Some(config.runtime_dir.clone()),
        egress: egress.as_ref().map(EgressDir::wiring),
        objects: objects
            .clone()
            .map(|host| box_backend::ObjectsWiring { host }),
        ..UnitWiring::default()
    };
    match pooling.start_pooled(&label, &spec, &wiring).await {
        Ok(unit) => {
            services.ledger.started(key, unit.id());
            Ok(Ready {
                unit,
                key,
                claimed: CancellationToken::new(),
                egress,
                fork,
                objects,
            })
        }
        Err(error) => {
            services.ledger.gone(key);
            Err(error)
        }
    }
}

/// Claim a ready unit for `spec` of the session `label`, and bind it; the
/// ledger's entry moves to the session (`key`, which the caller took). A
/// unit whose network is egress gets its proxy here, in the pooled unit's
/// directory (`wiring` has none: a cold start's proxy is started after a
/// claim that gives no unit).
pub async fn claim(
    services: PoolServices<'_>,
    label: &SessionLabel,
    spec: &UnitSpec,
    wiring: &UnitWiring,
    key: u64,
) -> Claim {
    let Some(pools) = services.pools.pools.get().filter(|pools| !pools.is_empty()) else {
        return Claim::NoPools;
    };
    let Some(pooling) = services.backend.pooling() else {
        return Claim::NoPools;
    };
    if spec.role != Role::Workspace {
        return Claim::Cold("pools keep workspace units only".to_owned(), None);
    }
    if !wiring.masks.is_empty() || wiring.objects.is_some() || wiring.parent.is_some() {
        services.metrics.pool_claim("unfit");
        return Claim::Cold(
            "the unit is wired to the host's resources at its start (masked files, a fork's objects)"
                .to_owned(),
            None,
        );
    }
    if pools
        .iter()
        .any(|pool| pool.fork.is_some() && pool.profile == label.profile)
    {
        // Its units are taken before a session's fork is made (`take_fork`).
        return Claim::Cold(
            "the pool of a source = \"fork\" profile keeps units for its sessions' forks"
                .to_owned(),
            None,
        );
    }
    let asked = std::time::Instant::now();
    let ready = match take(services, pools, label, spec) {
        Ok(ready) => ready,
        Err(why) => return Claim::Cold(why, None),
    };
    bind(services, pooling, ready, label, spec, key, asked).await
}

/// Take a ready unit of `label`'s profile's pool for `spec`, else why not
/// (the envelope's `warmWhy`); the pool's refill is woken.
fn take(
    services: PoolServices<'_>,
    pools: &[Arc<Pool>],
    label: &SessionLabel,
    spec: &UnitSpec,
) -> Result<Ready, String> {
    let Some(pool) = pools.iter().find(|pool| pool.profile == label.profile) else {
        return Err(format!("no pool of profile {}", label.profile));
    };
    if let Err(why) = fits(&pool.spec, spec) {
        services.metrics.pool_claim("unfit");
        return Err(why);
    }
    let (taken, ready) = {
        let mut ready = pool.lock();
        (ready.pop_front(), ready.len())
    };
    services.metrics.pool_ready(&pool.profile, ready);
    pool.refill.notify_one();
    let Some(ready) = taken else {
        services.metrics.pool_claim("empty");
        return Err(format!(
            "the pool of profile {} has no ready unit (it refills in the background)",
            pool.profile
        ));
    };
    ready.claimed.cancel();
    Ok(ready)
}

/// Bind `ready`, taken for `spec` of the session `label` (asked at
/// `asked`): its egress proxy served, then the backend's bind; the
/// ledger's entry moves to the session's (`key`).
async fn bind(
    services: PoolServices<'_>,
    pooling: &dyn Pooling,
    ready: Ready,
    label: &SessionLabel,
    spec: &UnitSpec,
    key: u64,
    asked: std::time::Instant,
) -> Claim {
    let Ready {
        unit,
        key: pooled,
        egress,
        ..
    } = ready;
    let id = unit.id().to_owned();
    // The session's proxy, with its policy, where the unit's bridge will
    // connect: served before the executor is bound, so its first
    // connection finds it.
    let proxy = match (spec.network.mode, egress) {
        (NetworkMode::Egress, Some(dir)) => {
            match EgressProxy::serve_prepared(services.proxies, &label.session, spec, dir) {
                Ok(proxy) => Some(proxy),
                Err(error) => {
                    services.metrics.pool_claim("failed");
                    tracing::warn!(id, %error, "serving a pooled unit's egress proxy failed; removing it, starting cold");
                    return Claim::Cold(
                        format!("serving the pooled unit's egress proxy failed: {error}"),
                        Some(Tracked { key: pooled, id }),
                    );
                }
            }
        }
        // The backend's bind refuses a unit whose egress directory does not
        // match the session's network (the pool key keeps them equal).
        (_, _) => None,
    };
    match pooling.bind(unit, label, spec).await {
        Ok(mut started) => {
            // The ledger's entry moves to the session.
            services.ledger.gone(pooled);
            services.ledger.started(key, &id);
            services.metrics.pool_claim("warm");
            services.metrics.pool_claimed(asked.elapsed());
            tracing::info!(
                session = label.session,
                unit = spec.name,
                id,
                "claimed a pooled unit"
            );
            // The backend's (with the pool's session label), else said here.
            started.envelope.warm.get_or_insert(Warm {
                warm: true,
                warm_why: None,
                pool_session: None,
            });
            Claim::Warm(Box::new(started), proxy)
        }
        Err(error) => {
            services.metrics.pool_claim("failed");
            tracing::warn!(id, %error, "binding a pooled unit failed; removing it, starting cold");
            let tracked = Tracked { key: pooled, id };
            Claim::Cold(
                format!("binding a pooled unit failed: {error}"),
                Some(tracked),
            )
        }
    }
}

/// A unit started cold on a host with pools: its envelope says why.
pub fn cold(mut unit: StartedUnit, why: String) -> StartedUnit {
    unit.envelope.warm = Some(Warm {
        warm: false,
        warm_why: Some(why),
        pool_session: None,
    });
    unit
}

/// Whether a unit started as `pool` can serve `session` once its late
/// parts are bound, else why not (in the words of the plan's fields).
pub fn fits(pool: &UnitSpec, session: &UnitSpec) -> Result<(), String> {
    let mut bound = session.clone();
    // What a claim binds: the limits the engine changes on a running unit
    // (never wider than the pool's), the host's own deadlines, what the
    // executor applies itself, and the environment it hands on.
    for (name, asked, pooled) in [
        (
            "memory",
            session.limits.memory_bytes,
            pool.limits.memory_bytes,
        ),
        ("pids", session.limits.pids, pool.limits.pids),
    ] {
        if asked > pooled {
            return Err(format!(
                "limits.{name} {asked} is wider than the pool's {pooled}"
            ));
        }
    }
    if session.limits.cpus > pool.limits.cpus {
        return Err(format!(
            "limits.cpus {} is wider than the pool's {}",
            session.limits.cpus, pool.limits.cpus
        ));
    }
    bound.limits.memory_bytes = pool.limits.memory_bytes;
    bound.limits.cpus = pool.limits.cpus;
    bound.limits.pids = pool.limits.pids;
    bound.limits.call_timeout = pool.limits.call_timeout;
    bound.limits.idle = pool.limits.idle;
    bound.limits.lifetime = pool.limits.lifetime;
    bound.limits.start_timeout = pool.limits.start_timeout;
    bound.security.landlock = pool.security.landlock;
    bound.security.write_guard = pool.security.write_guard;
    bound.security.neutralise_git = pool.security.neutralise_git;
    bound.env_set = pool.env_set.clone();
    bound.env_pass = pool.env_pass.clone();
    // The secrets' tmpfs is a mount: there or not is the unit's shape.
    if session.env_secrets.is_empty() != pool.env_secrets.is_empty() {
        return Err(
            "env.secrets: the secrets' tmpfs is mounted only where a plan has secrets".to_owned(),
        );
    }
    bound.env_secrets = pool.env_secrets.clone();
    bound.env_secrets_as_env = pool.env_secrets_as_env.clone();
    bound.description = pool.description.clone();
    // An egress unit's policy is its proxy's, served at the claim: the
    // session's may only narrow the pool's.
    if session.network.mode == NetworkMode::Egress && pool.network.mode == NetworkMode::Egress {
        egress_within(&session.network, &pool.network)?;
        bound.network = pool.network.clone();
    }
    if bound == *pool {
        return Ok(());
    }
    let differs = [
        ("name", bound.name != pool.name),
        (
            "workspace.image",
            bound.image != pool.image || bound.pull != pool.pull,
        ),
        ("workspace.runtime", bound.runtime != pool.runtime),
        ("workspace.user", bound.user != pool.user),
        ("network", bound.network != pool.network),
        ("workspace.source", bound.source != pool.source),
        ("workspace.root", bound.root != pool.root),
        ("workspace.mode", bound.mode != pool.mode),
        ("volumes", bound.volumes != pool.volumes),
        (
            "limits (tmp, home or nofile: fixed when a unit starts)",
            bound.limits != pool.limits,
        ),
        ("security", bound.security != pool.security),
    ];
    let fields: Vec<&str> = differs
        .iter()
        .filter(|(_, differs)| *differs)
        .map(|(name, _)| *name)
        .collect();
    Err(if fields.is_empty() {
        "the plan differs from the pool's in what is fixed when a unit starts".to_owned()
    } else {
        format!(
            "{} differ from the pool's, and are fixed when a unit starts",
            fields.join(", ")
        )
    })
}

/// Whether an egress session's network (`session`) is nowhere wider than
/// its pool's, whose proxy policy a claim replaces with it, else the field
/// that is.
fn egress_within(
    session: &box_policy::plan::Network,
    pool: &box_policy::plan::Network,
) -> Result<(), String> {
    if !session.is_within(pool) {
        return Err(format!(
            "network.allow [{}] is wider than the pool's [{}]",
            session.allow.join(", "),
            pool.allow.join(", ")
        ));
    }
    if let Some((name, address)) = session
        .hosts
        .iter()
        .find(|(name, address)| pool.hosts.get(*name) != Some(address))
    {
        return Err(format!(
            "network.hosts pins {name} to {address}, which the pool's do not"
        ));
    }
    if session.private_destinations && !pool.private_destinations {
        return Err("network: private destinations are allowed, and not in the pool's".to_owned());
    }
    if session.max_connections > pool.max_connections {
        return Err(format!(
            "network.max_connections {} is wider than the pool's {}",
            session.max_connections, pool.max_connections
        ));
    }
    let wider = match (session.bytes_per_second, pool.bytes_per_second) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(asked), Some(pooled)) => asked > pooled,
    };
    if wider {
        let show =
            |rate: Option<u64>| rate.map_or("no cap".to_owned(), |rate| format!("{rate} bytes/s"));
        return Err(format!(
            "network.bandwidth {} is wider than the pool's {}",
            show(session.bytes_per_second),
            show(pool.bytes_per_second)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default profile's workspace unit, its network egress to two names.
    fn egress_unit() -> UnitSpec {
        let catalog = box_policy::profile::Catalog::only(Vec::new());
        let profile = catalog.load("default").unwrap();
        let plan =
            box_policy::plan::resolve(&profile, &serde_json::Value::Null, &crate::tests::facts())
                .unwrap();
        let mut spec = plan.units[0].clone();
        spec.network.mode = NetworkMode::Egress;
        spec.network.allow = vec!["a.test:8080".to_owned(), "b.test".to_owned()];
        spec.network
            .hosts
            .insert("a.test".to_owned(), [127, 0, 0, 1].into());
        spec.network.private_destinations = true;
        spec.network.max_connections = 256;
        spec
    }

    /// An egress session fits its profile's pool with any narrower policy
    /// (the claim serves its proxy with it); a wider one, or another network
    /// mode, does not, and the field is named.
    #[test]
    fn an_egress_sessions_policy_is_late_bound_and_only_narrows() {
        let pool = egress_unit();
        assert_eq!(fits(&pool, &pool), Ok(()));
        let mut narrower = pool.clone();
        narrower.network.allow = vec!["a.test:8080".to_owned()];
        narrower.network.hosts.clear();
        narrower.network.max_connections = 4;
        narrower.network.bytes_per_second = Some(1 << 20);
        assert_eq!(fits(&pool, &narrower), Ok(()));

        let refused = |change: &dyn Fn(&mut UnitSpec), field: &str| {
            let mut session = pool.clone();
            change(&mut session);
            let why = fits(&pool, &session).unwrap_err();
            assert!(why.contains(field), "{field}: {why}");
        };
        refused(
            &|spec| spec.network.allow.push("c.test".to_owned()),
            "network.allow",
        );
        refused(
            &|spec| {
                spec.network
                    .hosts
                    .insert("a.test".to_owned(), [10, 0, 0, 1].into());
            },
            "network.hosts",
        );
        refused(
            &|spec| spec.network.max_connections = 257,
            "network.max_connections",
        );
        refused(&|spec| spec.network.mode = NetworkMode::None, "network");
        let mut capped = pool.clone();
        capped.network.bytes_per_second = Some(1 << 20);
        let why = fits(&capped, &pool).unwrap_err();
        assert!(why.contains("network.bandwidth no cap"), "{why}");
        let mut private = pool.clone();
        private.network.private_destinations = false;
        let why = fits(&private, &pool).unwrap_err();
        assert!(why.contains("private destinations"), "{why}");
    }
}
