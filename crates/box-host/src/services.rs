//! The host's live services: what its sessions share that changes while it
//! runs (the backend, the ledger of units, metrics, the audit log, the
//! state store, the sessions waiting to be reattached and the dead hosts'
//! instances held for them, the redaction scratch, the egress proxies'
//! runtime, and the flags of how the host is ending). One value, owned by
//! the host ([`crate::Host`], or `box run`'s own) and handed to every
//! session beside its settings ([`crate::HostConfig`]); nothing of it is
//! process-wide, so two hosts in one process (tests) share nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use box_backend::Backend;

use crate::{audit, egress, ledger, metrics, pool, redact, state};

/// What a host's sessions share and change.
pub struct Services {
    /// Where units run.
    pub backend: Arc<dyn Backend>,
    /// Counters for `/metrics` (shared with the egress proxies' reports).
    pub metrics: Arc<metrics::Metrics>,
    /// The audit log, when asked for (shared with the egress proxies' reports).
    pub audit: Option<Arc<audit::Audit>>,
    /// Every unit asked for and not yet confirmed removed.
    pub ledger: ledger::Ledger,
    /// Where sessions' identities are persisted (`box serve --state`);
    /// `None`: nothing is kept, no session can be reattached.
    pub state: Option<state::Store>,
    /// Sessions of a dead host whose units this host re-adopted at start,
    /// waiting for their clients to reattach.
    pub reattachable: state::Reattachable,
    /// The dead hosts' instances this host holds for the units it re-adopted.
    pub held_instances: state::HeldInstances,
    /// The memory files-resource answers holding secrets are redacted in,
    /// shared by the sessions.
    pub redact_scratch: Arc<redact::ScratchPool>,
    /// The runtime the egress proxies run on.
    pub egress_runtime: egress::ProxyRuntime,
    /// SIGHUP: the host hands its kept sessions to the next process instead
    /// of ending them.
    pub handoff: AtomicBool,
    /// Sessions handed off (their calls drained, their units left).
    pub parked: AtomicUsize,
    /// Sessions end at once from now on: their executors get no grace once
    /// their input is closed, and every unit is removed with
    /// [`Backend::remove_now`] (`box run` interrupted: the user asked it to
    /// stop, and waits for nothing of the unit).
    pub end_at_once: AtomicBool,
    /// The pools of warm units (`box serve --pool`); none by default.
    pub pools: pool::Pools,
}

impl Services {
    /// A host's services around `backend`, with nothing kept, audited or
    /// re-adopted yet.
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        Self {
            backend,
            metrics: Arc::default(),
            audit: None,
            ledger: ledger::Ledger::default(),
            state: None,
            reattachable: state::Reattachable::default(),
            held_instances: state::HeldInstances::default(),
            redact_scratch: Arc::default(),
            egress_runtime: egress::ProxyRuntime::default(),
            handoff: AtomicBool::new(false),
            parked: AtomicUsize::new(0),
            end_at_once: AtomicBool::new(false),
            pools: pool::Pools::default(),
        }
    }

    /// What the egress proxies run on and report to.
    pub fn proxies(&self) -> egress::ProxyServices<'_> {
        egress::ProxyServices {
            runtime: &self.egress_runtime,
            metrics: &self.metrics,
            audit: self.audit.as_ref(),
        }
    }

    /// What the pools use of these services.
    pub fn pool_services(&self) -> pool::PoolServices<'_> {
        pool::PoolServices {
            pools: &self.pools,
            backend: self.backend.as_ref(),
            ledger: &self.ledger,
            metrics: &self.metrics,
        }
    }

    /// How this host removes units now ([`Self::end_at_once`]).
    pub fn removal(&self) -> ledger::Removal {
        if self.end_at_once.load(Ordering::SeqCst) {
            ledger::Removal::AtOnce
        } else {
            ledger::Removal::Graceful
        }
    }
}
