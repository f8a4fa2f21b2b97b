//! Pooled units: started with no session, then bound to the session that
//! claims one (late binding). A backend that can pool says so through
//! [`crate::Backend::pooling`]; the host keeps the pools and decides which
//! plan fits which pooled unit.
//!
//! A pooled unit is a unit like any other (box's init, its lease, the same
//! hardening), whose executor waits for the session's plan on its stdin
//! (`BIND_ON_STDIN_VAR`) before it confines itself or serves anything. What a
//! running unit cannot change (image, runtime, user, network mode, mounts)
//! is fixed when it starts; the rest reaches it at the claim.
//!
//! A pooled unit of an egress profile starts with its egress socket's
//! directory mounted, empty: the host serves the session's proxy there at
//! the claim, and the bind line's flags start the executor's bridge
//! ([`bound_wiring`]).

use futures::future::BoxFuture;

use crate::{
    BackendError, EgressWiring, ObjectsWiring, SessionLabel, StartedUnit, UnitSpec, UnitWiring,
};
use box_policy::plan::NetworkMode;

/// The label a pooled unit carries from its start: the profile whose pool
/// started it (`box units ls` marks it). Engines cannot relabel a running
/// unit, so a claimed unit keeps it, and its pool's session label.
pub const POOL_LABEL: &str = "box.pool";

/// A started pooled unit, waiting for a session.
pub struct PooledUnit {
    /// The unit as started for the pool: its envelope is the pool's spec's,
    /// its executor reads the bind line first.
    pub started: StartedUnit,
    /// What its backend needs again at the claim (opaque to the host).
    pub detail: Box<dyn std::any::Any + Send + Sync>,
}

impl PooledUnit {
    /// `started` for a pool, with what its backend keeps for the claim
    /// (read back there with [`detail`](Self::detail)).
    pub fn new(started: StartedUnit, detail: impl std::any::Any + Send + Sync) -> Self {
        Self {
            started,
            detail: Box::new(detail),
        }
    }

    /// The backend's id for the unit (a container id).
    pub fn id(&self) -> &str {
        &self.started.envelope.id
    }

    /// The unit as started, and what its backend kept for the claim as
    /// that backend's `T`: an error naming `unit` when it is another's
    /// (`backend`, as a user names it: `docker`, `local`).
    pub fn detail<T: std::any::Any>(
        self,
        unit: &str,
        backend: &str,
    ) -> Result<(StartedUnit, T), BackendError> {
        let detail = downcast_detail(self.detail, unit, backend)?;
        Ok((self.started, detail))
    }
}

/// Hand a pooled unit's executor the session's plan: `bind` as one JSON
/// line on its stdin (which it reads first, `BIND_ON_STDIN_VAR`), flushed;
/// an error names `unit`.
pub async fn send_bind<W>(
    stdin: &mut W,
    unit: &str,
    bind: &box_policy::executor::Bind,
) -> Result<(), BackendError>
where
    W: tokio::io::AsyncWrite + Unpin + ?Sized,
{
    use tokio::io::AsyncWriteExt as _;
    let failed = |message: String| BackendError::Other {
        unit: unit.to_owned(),
        doing: "handing the session's plan to the executor".to_owned(),
        message,
    };
    let mut line = serde_json::to_vec(bind).map_err(|e| failed(e.to_string()))?;
    line.push(b'\n');
    stdin
        .write_all(&line)
        .await
        .map_err(|e| failed(e.to_string()))?;
    stdin.flush().await.map_err(|e| failed(e.to_string()))
}

/// `detail` as `T`, else the error [`PooledUnit::detail`] gives.
fn downcast_detail<T: std::any::Any>(
    detail: Box<dyn std::any::Any + Send + Sync>,
    unit: &str,
    backend: &str,
) -> Result<T, BackendError> {
    detail
        .downcast::<T>()
        .map(|detail| *detail)
        .map_err(|_| BackendError::Other {
            unit: unit.to_owned(),
            doing: "binding a pooled unit".to_owned(),
            message: format!("not a {backend} pooled unit"),
        })
}

/// What a backend that keeps pooled units does.
pub trait Pooling: Send + Sync {
    /// Start a unit of `spec` for a pool, under `label` (a session id of the
    /// pool's own): like a start, except that its executor waits for a bind
    /// line, and its labels say it is pooled (`box.pool`).
    fn start_pooled<'a>(
        &'a self,
        label: &'a SessionLabel,
        spec: &'a UnitSpec,
        wiring: &'a UnitWiring,
    ) -> BoxFuture<'a, Result<PooledUnit, BackendError>>;

    /// Bind `unit` (started from a spec that fits `spec`, which the host
    /// judged) to `session`'s plan `spec`: its limits set through the
    /// engine, the executor handed its flags, environment and secrets, the
    /// envelope read back for `spec`. On an error the caller removes the unit
    /// (by the id it read before).
    fn bind<'a>(
        &'a self,
        unit: PooledUnit,
        session: &'a SessionLabel,
        spec: &'a UnitSpec,
    ) -> BoxFuture<'a, Result<StartedUnit, BackendError>>;
}

/// What a pooled unit started with `egress` (its egress socket's directory,
/// mounted at its start, or none) and `objects` (a worktree fork's borrowed
/// objects, mounted read-only at its start for the fork its claim makes)
/// has wired in for the session's `spec`: the wiring its bind line's
/// executor flags are written from, so an egress session's executor bridges
/// the socket, and a worktree fork's reads its objects, as a cold one's
/// does. A session
/// whose network is egress on a unit with no directory would have no way
/// out; one whose network is not egress on a unit with one would have a way
/// out it did not ask for: both are refused (the host's pool key keeps the
/// network mode equal).
pub fn bound_wiring(
    egress: Option<&EgressWiring>,
    objects: Option<&ObjectsWiring>,
    spec: &UnitSpec,
) -> Result<UnitWiring, BackendError> {
    let bound = match (spec.network.mode, egress) {
        (NetworkMode::Egress, Some(egress)) => UnitWiring {
            egress: Some(egress.clone()),
            ..UnitWiring::default()
        },
        (NetworkMode::Egress, None) => {
            return Err(BackendError::Unenforceable {
                unit: spec.name.clone(),
                control: "network egress allow list".to_owned(),
                why: "the pooled unit was started without an egress socket directory".to_owned(),
            });
        }
        (NetworkMode::None | NetworkMode::Bridge, Some(_)) => {
            return Err(BackendError::Other {
                unit: spec.name.clone(),
                doing: "binding a pooled unit".to_owned(),
                message: format!(
                    "the pooled unit has an egress socket directory, and the session's network is {}",
                    spec.network.mode.as_str()
                ),
            });
        }
        (NetworkMode::None | NetworkMode::Bridge, None) => UnitWiring::default(),
    };
    Ok(UnitWiring {
        objects: objects.cloned(),
        ..bound
    })
}

#[cfg(test)]
mod tests {
    use super::{downcast_detail, send_bind};
    use crate::BackendError;
    use box_policy::executor::{Bind, PlaceKind};
    use box_policy::plan::{UnitSpec, WorkspaceSource};

    /// The plan reaches the executor as one line it reads back whole.
    #[tokio::test]
    async fn the_bind_line_is_one_json_line() {
        let spec = UnitSpec::workspace("image", WorkspaceSource::Empty);
        let bind = Bind {
            spec: spec.executor_spec(std::path::Path::new("/w"), PlaceKind::Local),
            env: vec![("LANG".to_owned(), "C.UTF-8".to_owned())],
            secrets: [("TOKEN".to_owned(), "t".to_owned())].into(),
            rlimits: None,
        };
        let mut stdin: Vec<u8> = Vec::new();
        send_bind(&mut stdin, "workspace", &bind).await.unwrap();
        let text = String::from_utf8(stdin).unwrap();
        assert_eq!(text.matches('\n').count(), 1);
        assert!(text.ends_with('\n'));
        let read: Bind = serde_json::from_str(text.trim_end()).unwrap();
        assert_eq!(read, bind);
    }

    /// A backend gets back what it kept; another backend's is refused,
    /// naming the unit and the backend.
    #[test]
    fn a_pooled_units_detail_is_its_backends_alone() {
        let kept: Box<dyn std::any::Any + Send + Sync> = Box::new(7u32);
        assert_eq!(
            downcast_detail::<u32>(kept, "workspace", "local").unwrap(),
            7
        );
        let other: Box<dyn std::any::Any + Send + Sync> = Box::new("a docker unit's");
        match downcast_detail::<u32>(other, "workspace", "local") {
            Err(BackendError::Other {
                unit,
                doing,
                message,
            }) => {
                assert_eq!(unit, "workspace");
                assert_eq!(doing, "binding a pooled unit");
                assert_eq!(message, "not a local pooled unit");
            }
            other => panic!("{other:?}"),
        }
    }
}
