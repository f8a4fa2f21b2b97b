//! The host as the transports' session factory: the one place where
//! `host` and `box_transport` meet, so neither names the other (the host
//! never sees HTTP or stdio, the transports never see a backend or a ledger).

use std::sync::Arc;
use std::time::Duration;

use box_jsonrpc::session::SessionHandle;
use box_transport::{Refusal, SessionFactory, TransportAsk, UnitLeft};
use futures::future::BoxFuture;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::host::{self, HostConfig, Services};

/// The host's sessions, as a transport opens and watches them.
#[derive(Clone)]
pub struct HostSessions {
    config: Arc<HostConfig>,
    services: Arc<Services>,
}

impl HostSessions {
    /// Sessions sharing a host's settings and services.
    pub fn new(config: Arc<HostConfig>, services: Arc<Services>) -> Self {
        Self { config, services }
    }
}

impl SessionFactory for HostSessions {
    fn open(
        &self,
        id: String,
        ask: TransportAsk,
        general: mpsc::Sender<Value>,
        shutdown: &CancellationToken,
    ) -> SessionHandle {
        host::spawn_session_asking(
            self.config.clone(),
            self.services.clone(),
            id,
            general,
            shutdown,
            ask,
        )
    }

    fn reattach(
        &self,
        id: String,
        ask: TransportAsk,
        general: mpsc::Sender<Value>,
        shutdown: &CancellationToken,
    ) -> SessionHandle {
        host::spawn_session_reattaching(
            self.config.clone(),
            self.services.clone(),
            id,
            general,
            shutdown,
            ask,
        )
    }

    /// The drain a session's calls get, then the wait for its units' removal.
    fn end_wait(&self) -> Duration {
        self.config.drain + host::END_WAIT
    }

    fn sessions_running(&self) -> usize {
        self.services.metrics.session_tasks()
    }

    fn metrics(&self) -> (&'static str, String) {
        (host::metrics::CONTENT_TYPE, self.services.metrics.render())
    }

    /// Ready when the backend answers and every pool (`--pool`) can refill.
    fn readiness(&self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            host::metrics::readiness(self.services.backend.as_ref()).await?;
            self.services.pools.readiness()
        })
    }

    /// A refusal of the HTTP checks: a WARN line, an audit line and a count.
    fn refused(&self, refusal: &Refusal) {
        host::report_refusal(
            &self.services,
            &host::audit::Refusal {
                reason: refusal.reason.as_str(),
                detail: &refusal.detail,
                session: None,
                profile: None,
                client: None,
                http: Some((refusal.status, &refusal.path)),
            },
        );
    }

    fn units_left(&self, id: &str) -> Vec<UnitLeft> {
        let kind = self.services.backend.kind();
        self.services
            .ledger
            .left_of(id)
            .into_iter()
            .map(|unit| UnitLeft {
                description: unit.describe(kind.as_str(), &self.config.instance),
                unit: unit.unit,
                id: unit.id,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The readiness `/readyz` reports is the host's: a backend that answers
    /// (the fake's) is ready.
    #[tokio::test]
    async fn a_backend_that_answers_is_ready() {
        let facts = crate::plan::HostFacts {
            cwd: std::env::temp_dir(),
            caller: crate::plan::UserIds {
                uid: 1000,
                gid: 1000,
            },
            workspace_owner: None,
        };
        let backend = Arc::new(box_testkit::fake::FakeBackend::default());
        let config = HostConfig::new(crate::profile::Catalog::new(Vec::new()), facts);
        let sessions = HostSessions::new(Arc::new(config), Arc::new(Services::new(backend)));
        assert_eq!(sessions.readiness().await, Ok(()));
        assert_eq!(sessions.sessions_running(), 0);
        assert!(sessions.units_left("nobody").is_empty());
    }
}
