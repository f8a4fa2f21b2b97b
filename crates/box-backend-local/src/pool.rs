//! Pooled local units (`box_backend::pool`): a unit started for a pool
//! (the helper's confinement of the pool's plan: namespaces, the hidden
//! host, its own `/tmp` and home, rlimits, landlock, seccomp, with no
//! session's environment and no secret), whose executor waits for the
//! session's plan on its stdin; bound at the claim: its flags, environment,
//! secrets and the session's rlimits in one bind line (the executor lowers
//! its rlimits, writes the secrets, applies its landlock and seccomp layers,
//! then serves), its envelope made for the session's plan.

use std::path::PathBuf;

use futures::future::BoxFuture;

use box_backend::pool::{PooledUnit, Pooling, send_bind};
use box_backend::{BackendError, SessionLabel, StartedUnit, UnitWiring};
use box_confine::Rlimits;
use box_policy::executor::{Bind, BindRlimits};
use box_policy::plan::UnitSpec;

use crate::helper::{Applied, SandboxSpec};
use crate::{
    Layout, LocalBackend, delivered_secrets, envelope, executor_spec, lease, unit_environment,
};

/// What a bind needs again of a pooled unit's start.
pub(crate) struct PoolDetail {
    /// The unit's directories (its home, temp and workspace).
    pub(crate) layout: Layout,
    /// What the helper was asked to apply (without its environment).
    pub(crate) sandbox_spec: SandboxSpec,
    /// What the helper applied, read back from the kernel.
    pub(crate) applied: Applied,
    /// The unit's run directory (its record is written again at the claim).
    pub(crate) run_dir: PathBuf,
    /// Its record as the start wrote it.
    pub(crate) record: lease::Record,
}

impl Pooling for LocalBackend {
    fn start_pooled<'a>(
        &'a self,
        label: &'a SessionLabel,
        spec: &'a UnitSpec,
        wiring: &'a UnitWiring,
    ) -> BoxFuture<'a, Result<PooledUnit, BackendError>> {
        Box::pin(async move {
            let (started, detail) = self
                .start_for(label, spec, wiring, Vec::new(), true)
                .await?;
            let detail = detail.ok_or_else(|| BackendError::Other {
                unit: spec.name.clone(),
                doing: "starting a pooled unit".to_owned(),
                message: "the start kept nothing to bind it with".to_owned(),
            })?;
            Ok(PooledUnit::new(started, detail))
        })
    }

    fn bind<'a>(
        &'a self,
        unit: PooledUnit,
        _session: &'a SessionLabel,
        spec: &'a UnitSpec,
    ) -> BoxFuture<'a, Result<StartedUnit, BackendError>> {
        Box::pin(bind_unit(unit, spec))
    }
}

/// The rlimits of a plan's limits, as the bind line carries them.
fn bind_rlimits(rlimits: &Rlimits) -> BindRlimits {
    BindRlimits {
        nofile: rlimits.nofile,
        nproc: rlimits.nproc,
        data_bytes: rlimits.data_bytes,
        address_space_bytes: rlimits.address_space_bytes,
        fsize_bytes: rlimits.fsize_bytes,
    }
}

async fn bind_unit(unit: PooledUnit, spec: &UnitSpec) -> Result<StartedUnit, BackendError> {
    let name = spec.name.as_str();
    let (mut started, detail) = unit.detail::<PoolDetail>(name, "local")?;
    let PoolDetail {
        layout,
        sandbox_spec,
        mut applied,
        run_dir,
        mut record,
    } = detail;
    // The session's environment and secrets, as a cold start would set them.
    let environment = unit_environment(std::env::vars_os(), spec, &layout);
    let delivered = environment.delivered(spec);
    let spec = delivered.as_ref();
    if !spec.env_secrets.is_empty() && !applied.secrets_mounted {
        return Err(BackendError::Unenforceable {
            unit: name.to_owned(),
            control: format!("env.secrets {}", spec.env_secrets.join(", ")),
            why: "the pooled unit has no secrets tmpfs".to_owned(),
        });
    }
    // What the helper does to a cold unit's environment: TMPDIR is the
    // unit's own /tmp where it got one.
    let mut env = environment.vars.clone();
    if applied.tmp.is_some() {
        env.retain(|(name, _)| name != "TMPDIR");
        env.push(("TMPDIR".to_owned(), "/tmp".to_owned()));
    }
    // The session's rlimits, where they are narrower than the pool's (the
    // memory and pids a session may lower; the rest is the pool's key).
    let rlimits = Rlimits::from_limits(&spec.limits);
    let narrower = rlimits != sandbox_spec.rlimits;
    // The egress socket's directory the helper bound in at the start.
    let started_with = sandbox_spec
        .egress
        .as_ref()
        .map(|egress| box_backend::EgressWiring {
            socket_dir: egress.socket_dir.clone(),
        });
    // A worktree fork's borrowed objects the helper bound in read-only.
    let objects = sandbox_spec
        .objects
        .as_ref()
        .map(|host| box_backend::ObjectsWiring { host: host.clone() });
    let wiring = box_backend::pool::bound_wiring(started_with.as_ref(), objects.as_ref(), spec)?;
    let bind = Bind {
        spec: executor_spec(spec, &layout, &wiring),
        env,
        secrets: environment.secrets.iter().cloned().collect(),
        rlimits: narrower.then(|| bind_rlimits(&rlimits)),
    };
    send_bind(&mut started.io.stdin, name, &bind).await?;
    if narrower {
        // The executor sets them before it serves, or serves nothing.
        applied.rlimits = rlimits;
    }
    let id = started.envelope.id.clone();
    let mut made = envelope(spec, &sandbox_spec, &applied, &environment, &id, &layout);
    if applied.secrets_mounted {
        made.secrets = delivered_secrets(spec);
    }
    made.warm = Some(box_policy::envelope::Warm {
        warm: true,
        warm_why: None,
        pool_session: Some(record.session.clone()),
    });
    // Recorded so (`box units inspect`, a later host's adopt): the unit came
    // from a pool. Off the claim's path: replacing a file by a rename makes
    // ext4 flush it first (auto_da_alloc), which took 100 ms and more on a
    // busy disk; a reader meanwhile sees the record the start wrote.
    record.envelope = serde_json::to_value(&made).ok();
    record.applied = applied;
    let unit = name.to_owned();
    tokio::task::spawn_blocking(move || {
        if let Err(message) = record.write(&run_dir) {
            tracing::debug!(unit, %message, "recording the claimed unit");
        }
    });
    started.envelope = made;
    Ok(started)
}
