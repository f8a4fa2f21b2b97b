//! All-or-nothing start of a session's units, for any backend: every unit
//! starts, or none is left behind and the error names the unit that failed.

use futures::future::join_all;

use crate::backend::{Backend, BackendError, SessionLabel, StartedUnit};
use crate::plan::UnitSpec;

/// Start every unit of `specs` concurrently. If any fails, the units that did
/// start are removed (cleanup failures are logged, not returned) and the first
/// failure in `specs` order is returned; it names its unit.
pub async fn start_all(
    backend: &dyn Backend,
    session: &SessionLabel,
    specs: &[UnitSpec],
) -> Result<Vec<StartedUnit>, BackendError> {
    let results = join_all(specs.iter().map(|spec| backend.start(session, spec))).await;
    if results.iter().all(Result::is_ok) {
        return Ok(results.into_iter().filter_map(Result::ok).collect());
    }
    let mut first_error = None;
    let mut started = Vec::new();
    for result in results {
        match result {
            Ok(unit) => started.push(unit),
            Err(error) => {
                if first_error.is_none() {
                    first_error = Some(error);
                }
            }
        }
    }
    let removals = join_all(started.iter().map(|unit| async move {
        (
            unit.envelope.name.clone(),
            backend.remove(&unit.envelope.id).await,
        )
    }))
    .await;
    for (unit, removal) in removals {
        if let Err(error) = removal {
            tracing::warn!(session = session.session, unit, %error, "removing a unit of a failed start");
        }
    }
    match first_error {
        Some(error) => Err(error),
        // Unreachable by the check above; kept total rather than panicking.
        None => Ok(started),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use futures::future::BoxFuture;
    use pretty_assertions::assert_eq;

    use super::*;
    use crate::backend::{Envelope, ExecutorIo, Hardening, UnitEnd, UnitInfo};

    /// Records starts and removals; fails the start of units named `fail*`.
    #[derive(Default)]
    struct Recording {
        removed: Mutex<Vec<String>>,
    }

    fn envelope(name: &str) -> Envelope {
        Envelope {
            name: name.to_owned(),
            role: "server".to_owned(),
            backend: "fake".to_owned(),
            id: format!("id-{name}"),
            image: String::new(),
            image_id: String::new(),
            root: String::new(),
            user: String::new(),
            network: serde_json::Value::Null,
            limits: serde_json::Value::Null,
            hardening: Hardening {
                capabilities: vec![],
                no_new_privileges: true,
                read_only_root: true,
                seccomp: "default".to_owned(),
                landlock_abi: 0,
                landlock_enforced: false,
                namespaces: vec![],
                user_namespace: false,
            },
            env_passed: vec![],
            env_scrubbed: vec![],
            git_neutralised: true,
            state: "running".to_owned(),
        }
    }

    impl Backend for Recording {
        fn kind(&self) -> &'static str {
            "fake"
        }
        fn start<'a>(
            &'a self,
            _session: &'a SessionLabel,
            spec: &'a UnitSpec,
        ) -> BoxFuture<'a, Result<StartedUnit, BackendError>> {
            Box::pin(async move {
                if spec.name.starts_with("fail") {
                    return Err(BackendError::Other {
                        unit: spec.name.clone(),
                        doing: "starting".to_owned(),
                        message: "on cue".to_owned(),
                    });
                }
                Ok(StartedUnit {
                    envelope: envelope(&spec.name),
                    io: ExecutorIo {
                        stdin: Box::pin(tokio::io::sink()),
                        stdout: Box::pin(tokio::io::empty()),
                    },
                    ended: Box::pin(futures::future::pending::<UnitEnd>()),
                })
            })
        }
        fn remove<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), BackendError>> {
            Box::pin(async move {
                self.removed.lock().unwrap().push(id.to_owned());
                Ok(())
            })
        }
        fn list(&self) -> BoxFuture<'_, Result<Vec<UnitInfo>, BackendError>> {
            Box::pin(async { Ok(vec![]) })
        }
    }

    fn specs(names: &[&str]) -> Vec<UnitSpec> {
        let base = crate::backend::docker::body::tests::spec();
        names
            .iter()
            .map(|name| UnitSpec {
                name: (*name).to_owned(),
                ..base.clone()
            })
            .collect()
    }

    fn session() -> SessionLabel {
        SessionLabel {
            instance: "i".to_owned(),
            session: "s".to_owned(),
            profile: "p".to_owned(),
        }
    }

    #[tokio::test]
    async fn all_start_or_none_is_left() {
        let backend = Recording::default();
        let units = start_all(&backend, &session(), &specs(&["a", "b"]))
            .await
            .unwrap();
        assert_eq!(units.len(), 2);
        assert!(backend.removed.lock().unwrap().is_empty());

        let error = start_all(&backend, &session(), &specs(&["a", "fail2", "c", "fail4"]))
            .await
            .err()
            .unwrap();
        assert_eq!(error.to_string(), "unit fail2: starting: on cue");
        let mut removed = backend.removed.lock().unwrap().clone();
        removed.sort();
        assert_eq!(removed, vec!["id-a".to_owned(), "id-c".to_owned()]);
    }
}
