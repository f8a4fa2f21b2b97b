//! Warm units of a `source = "fork"` profile. A cold fork unit starts on
//! the session's fork, made first (`<fork_dir>/<instance>/<session>/workspace`),
//! with a worktree fork's borrowed objects mounted read-only. A pooled one
//! starts with the same shape before any session: an empty directory of its
//! own (`<fork_dir>/<instance>/pool-N/workspace`) mounted at its workspace,
//! and the host directory's objects, read-only, where a worktree fork
//! borrows them. A session's start takes a ready unit ([`take_fork`]) before
//! its fork is made, makes the fork into that directory (the same fork code
//! as a cold start, `box_fork::fork_into`), then its units' start binds it
//! ([`claim_taken`]). A fork whose shape the unit lacks (a copy where the
//! unit mounts objects, or another objects directory) starts cold on the
//! fork made, saying why.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use box_backend::{SessionLabel, UnitWiring};
use box_policy::plan::UnitSpec;

use super::{Claim, Pool, PoolServices, Ready, bind};
use crate::HostConfig;
use crate::fork::{self, Effective};
use crate::ledger::Tracked;

/// What a `source = "fork"` profile's pool forks.
pub(super) struct PoolFork {
    /// The host directory every session of the profile forks.
    parent: PathBuf,
    /// How this host forks it.
    effective: Effective,
}

impl PoolFork {
    /// The fork of `spec`'s host directory in `mode`, as this host makes it,
    /// or why the profile's sessions cannot fork here.
    pub(super) fn new(
        config: &HostConfig,
        backend: &dyn box_backend::Backend,
        spec: &UnitSpec,
        mode: box_policy::profile::ForkMode,
    ) -> Result<Self, String> {
        let box_policy::plan::WorkspaceSource::Host(parent) = &spec.source else {
            return Err(
                "workspace.source = \"fork\": the workspace unit has no host directory".to_owned(),
            );
        };
        let effective = fork::effective_mode(config, backend, spec, fork::asked_mode(mode))
            .map_err(|why| format!("workspace.fork_mode: {why}"))?;
        Ok(Self {
            parent: parent.clone(),
            effective,
        })
    }

    /// The objects a unit started now mounts read-only: the host
    /// directory's, where this host forks it as a worktree and its files
    /// allow one; none where its forks are copies.
    pub(super) fn objects(&self) -> Option<PathBuf> {
        if self.effective.mode == box_fork::Mode::Copy || self.effective.objects.is_none() {
            return None;
        }
        box_fork::borrowed_objects(&self.parent).ok()
    }
}

/// A pooled fork unit's workspace directory: empty, made with its holder
/// (`<fork_dir>/<instance>/pool-N`) before the unit starts; removed with it
/// when dropped, unless a claim took it for the session's fork.
pub(super) struct ForkDir {
    dir: PathBuf,
    holder: PathBuf,
    kept: bool,
}

impl ForkDir {
    /// A new, empty directory for the pooled unit of session `pool_session`.
    pub(super) fn make(config: &HostConfig, pool_session: &str) -> Result<Self, String> {
        use std::os::unix::fs::DirBuilderExt as _;
        let holder = fork::session_dir(config, pool_session);
        fork::make_fork_dir(config, &holder)?;
        let dir = holder.join("workspace");
        let made = Self {
            dir,
            holder,
            kept: false,
        };
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&made.dir)
            .map_err(|error| format!("creating {}: {error}", made.dir.display()))?;
        Ok(made)
    }

    /// Where it is.
    pub(super) fn path(&self) -> &Path {
        &self.dir
    }

    /// Left in place for the session's fork: the directory and its holder.
    fn keep(mut self) -> (PathBuf, PathBuf) {
        self.kept = true;
        (self.dir.clone(), self.holder.clone())
    }
}

impl Drop for ForkDir {
    fn drop(&mut self) {
        if self.kept {
            return;
        }
        if let Err(error) = std::fs::remove_dir_all(&self.dir)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %self.dir.display(), %error, "removing a pooled unit's fork directory");
        }
        fork::remove_holder(&self.holder);
    }
}

/// What a `source = "fork"` session's workspace unit got of the pools,
/// asked before its fork is made.
#[derive(Clone)]
pub enum ForkClaim {
    /// A ready unit, taken: the fork is made into its directory, then the
    /// units' start binds it.
    Taken(Arc<Taken>),
    /// None: why (the envelope's `warmWhy`).
    Cold(String),
}

/// A ready unit taken for a session's fork, until its units' start binds it.
pub struct Taken {
    ready: Mutex<Option<Ready>>,
    /// The directory it mounts at its workspace: where the fork is made.
    pub dir: PathBuf,
    /// The directory holding `dir`, removed after it.
    pub holder: PathBuf,
    /// The objects it mounts read-only (none: it has a copy's shape).
    objects: Option<PathBuf>,
}

impl Taken {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Ready>> {
        self.ready
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The unit, if nothing bound it (the session's start failed first),
    /// for the caller to remove.
    pub fn left(&self) -> Option<Tracked> {
        let ready = self.lock().take()?;
        Some(Tracked {
            key: ready.key,
            id: ready.unit.id().to_owned(),
        })
    }
}

/// Take a ready unit of `label`'s profile's pool for the workspace `spec`
/// of a `source = "fork"` session, before its fork is made (`masked`: the
/// session's credentials are masked, `hide`); `None` where the host keeps
/// no pool.
pub fn take_fork(
    services: PoolServices<'_>,
    label: &SessionLabel,
    spec: &UnitSpec,
    masked: bool,
) -> Option<ForkClaim> {
    let pools = services
        .pools
        .pools
        .get()
        .filter(|pools| !pools.is_empty())?;
    services.backend.pooling()?;
    let pool: Option<&Arc<Pool>> = pools.iter().find(|pool| pool.profile == label.profile);
    let why = match pool {
        None => format!("no pool of profile {}", label.profile),
        Some(pool) if pool.fork.is_none() => format!(
            "the pool of profile {} was started for no fork (its units mount no fork's directory)",
            pool.profile
        ),
        Some(_) if masked => {
            services.metrics.pool_claim("unfit");
            "the workspace's persisted credentials are hidden (on_persisted_credentials = \"hide\"): their masks are mounted over the fork's files when a unit starts".to_owned()
        }
        Some(_) => match super::take(services, pools, label, spec) {
            Ok(mut ready) => {
                let Some((dir, holder)) = ready.fork.take().map(ForkDir::keep) else {
                    return Some(ForkClaim::Cold(
                        "the pooled unit has no fork directory".to_owned(),
                    ));
                };
                let objects = ready.objects.clone();
                return Some(ForkClaim::Taken(Arc::new(Taken {
                    ready: Mutex::new(Some(ready)),
                    dir,
                    holder,
                    objects,
                })));
            }
            Err(why) => why,
        },
    };
    Some(ForkClaim::Cold(why))
}

/// Bind `taken`'s unit, whose directory now holds the session's fork
/// (`spec` names it, `wiring` has its borrowed objects), or start cold:
/// the unit is returned for removal when its shape is not the fork's.
pub async fn claim_taken(
    services: PoolServices<'_>,
    label: &SessionLabel,
    spec: &UnitSpec,
    wiring: &UnitWiring,
    key: u64,
    taken: &Taken,
) -> Claim {
    // The claim's latency is the bind's, as for any claim (the fork made
    // meanwhile is the session's, which a cold start makes too).
    let asked = std::time::Instant::now();
    let Some(ready) = taken.lock().take() else {
        return Claim::Cold(
            "the pooled unit taken for the fork was bound already".to_owned(),
            None,
        );
    };
    let unbound = |ready: &Ready| {
        Some(Tracked {
            key: ready.key,
            id: ready.unit.id().to_owned(),
        })
    };
    let Some(pooling) = services.backend.pooling() else {
        return Claim::Cold(
            "the backend keeps no pooled units".to_owned(),
            unbound(&ready),
        );
    };
    let borrowed = wiring
        .objects
        .as_ref()
        .map(|objects| objects.host.as_path());
    let why = if !wiring.masks.is_empty() || wiring.parent.is_some() {
        Some("the unit is wired to the host's resources at its start (masked files)".to_owned())
    } else {
        match (borrowed, taken.objects.as_deref()) {
            (None, None) => None,
            (Some(borrowed), Some(mounted)) if borrowed == mounted => None,
            (Some(borrowed), None) => Some(format!(
                "the fork is a worktree borrowing {}, and the pooled unit was started with no objects mounted (the host directory was no worktree then)",
                borrowed.display()
            )),
            (None, Some(mounted)) => Some(format!(
                "the fork is a copy (the host directory cannot be a worktree now), and the pooled unit was started with {} mounted for a worktree's objects",
                mounted.display()
            )),
            (Some(borrowed), Some(mounted)) => Some(format!(
                "the fork borrows the objects {}, and the pooled unit mounts {}",
                borrowed.display(),
                mounted.display()
            )),
        }
    };
    if let Some(why) = why {
        services.metrics.pool_claim("unfit");
        let unbound = unbound(&ready);
        return Claim::Cold(why, unbound);
    }
    bind(services, pooling, ready, label, spec, key, asked).await
}

/// Remove what a killed host's ready pooled units of `source = "fork"`
/// profiles left under `fork_dir` (their empty `pool-N/workspace`
/// directories), for each instance `gone` names (its host dead, none of its
/// units waiting on a lease); a directory holding a session's fork is kept.
/// The directories removed.
pub fn remove_dead_pools_fork_dirs(fork_dir: &Path, gone: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Ok(instances) = std::fs::read_dir(fork_dir) else {
        return removed;
    };
    for instance in instances.flatten() {
        let name = instance.file_name();
        let Some(id) = name.to_str().filter(|id| *id != "locks") else {
            continue;
        };
        if !gone(id) {
            continue;
        }
        let Ok(holders) = std::fs::read_dir(instance.path()) else {
            continue;
        };
        for holder in holders.flatten() {
            let pooled = holder
                .file_name()
                .to_str()
                .is_some_and(|name| name.starts_with("pool-"));
            // Only empty directories are removed (`remove_dir` refuses others).
            if pooled
                && std::fs::remove_dir(holder.path().join("workspace")).is_ok()
                && std::fs::remove_dir(holder.path()).is_ok()
            {
                removed.push(holder.path());
            }
        }
        let _ = std::fs::remove_dir(instance.path());
    }
    removed.sort();
    removed
}
